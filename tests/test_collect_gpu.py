"""GPU collector tests: the extension's kernels, the stand-in's footprint, and one run end to end.

Run on a GPU machine: ``python -m pytest tests/test_collect_gpu.py -m gpu -q``. Skipped
cleanly where torch sees no GPU (CI).
"""

from __future__ import annotations

import gzip
import json
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA or ROCm GPU"),
]


@pytest.fixture(scope="module")
def ext():
    from overlapviz.collectors import extension

    return extension.load()


@pytest.mark.parametrize("tile", [(64, 64, 32), (64, 64, 64), (128, 128, 32)])
@pytest.mark.parametrize("shape", [(1000, 1100, 900), (256, 320, 8)])
def test_tiled_gemm_matches_matmul(ext, tile, shape):
    m, n, k = shape
    gen = torch.Generator(device="cuda").manual_seed(m + n + k)
    a = torch.randn(m, k, device="cuda", generator=gen)
    b = torch.randn(k, n, device="cuda", generator=gen)
    c = torch.full((m, n), float("nan"), device="cuda")  # poisoned: every element must be written
    ext.tiled_gemm(a, b, c, *tile, 8192)
    ref = a.double() @ b.double()
    assert float(torch.linalg.norm(c.double() - ref) / torch.linalg.norm(ref)) < 1e-5
    assert torch.allclose(c, torch.matmul(a, b), rtol=1e-3, atol=1e-3)


def test_padding_lowers_resident_blocks(ext):
    name = "ovz_gemm_tiled_64x64x32"
    unpadded = ext.blocks_per_sm(name, 256, ext.gemm_smem_bytes(64, 64, 32, 0))
    optin = torch.cuda.get_device_properties(0).shared_memory_per_block_optin
    # a pad filling more than half of the opt-in limit leaves room for one block only
    padded = ext.blocks_per_sm(name, 256, ext.gemm_smem_bytes(64, 64, 32, optin // 2 + 1024))
    assert unpadded > padded == 1


def test_pad_beyond_the_device_limit_is_refused_naming_the_field():
    from overlapviz.collectors.config import cb_ar_standin
    from overlapviz.collectors.workload import Dist, Workload

    optin = torch.cuda.get_device_properties(0).shared_memory_per_block_optin
    config = cb_ar_standin().replace(gemm_m=64, gemm_n=64, gemm_k=64, message_bytes=4096, smem_pad_bytes=optin)
    where = Dist(0, 1, 0, "stand-in", torch.device("cuda", 0), False)
    with pytest.raises(ValueError, match="smem_pad_bytes"):
        Workload(config, where)


@pytest.mark.parametrize("collective", ["all_reduce", "all_to_all"])
@pytest.mark.parametrize("ranks", [2, 5, 8])
def test_standin_matches_ring_reference(ext, collective, ranks):
    from overlapviz.collectors.workload import standin_expected

    data = torch.randn(4 * 4099, device="cuda")
    peer = torch.randn_like(data)
    want = standin_expected(data, peer, ranks, collective)
    ext.standin(collective, data, peer, ranks, 7, 512, 23552, 0.0)
    assert torch.equal(data, want)


def test_standin_footprint_is_nccl_like(ext):
    for name in ("ovz_comm_allreduce_standin", "ovz_comm_alltoall_standin"):
        attrs = ext.kernel_attributes(name)
        assert 80 <= attrs["regs_per_thread"] <= 96, attrs
        assert attrs["local_mem_bytes_per_thread"] == 0, attrs  # no spills
        assert attrs["max_threads_per_block"] >= 640


def test_standin_pacing_holds_the_link_rate(ext):
    data = torch.randn(16 << 20, device="cuda")  # 64 MiB
    peer = torch.randn_like(data)
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ext.standin("all_reduce", data, peer, 8, 16, 512, 23552, 100.0)
    s.record()
    ext.standin("all_reduce", data, peer, 8, 16, 512, 23552, 100.0)  # 100 GB/s
    e.record()
    e.synchronize()
    expected_ms = 2 * 7 / 8 * (64 << 20) / 100e9 * 1e3
    assert expected_ms * 0.95 <= s.elapsed_time(e) <= expected_ms * 1.5


def test_standin_run_end_to_end(tmp_path):
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-P", "-m", "overlapviz.collectors.run", "--preset", "cb_ar_standin", "--run-dir", str(run_dir),
           "--setup", "optimized", "--smem-pad-bytes", "114688", "--gemm-m", "1024", "--gemm-n", "1024",
           "--gemm-k", "1024", "--message-bytes", str(8 << 20), "--iterations", "9", "--trace-iterations", "2"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    manifest = json.loads((run_dir / "manifest.json").read_text())
    run = manifest["run"]
    assert run["status"] == "ok" and run["stand_in"] is True and run["backend"] == "stand-in"
    low, high = torch.cuda.Stream.priority_range()
    assert run["comm_priority_effective"] == high
    assert manifest["devices"][0]["max_blocks_per_sm"] > 0
    assert manifest["effective"]["kernels"]["gemm"]["blocks_per_sm"] == 1
    timings = json.loads((run_dir / "timings_rank0.json").read_text())
    assert [it["measured"] for it in timings["iterations"]] == [False] * 3 + [True] * 6
    trace = json.load(gzip.open(run_dir / "trace_rank0.json.gz"))
    kernels = [e for e in trace["traceEvents"] if e.get("cat") == "kernel"]
    comm = [e for e in kernels if e["name"].startswith("ovz_comm_allreduce_standin")]
    gemm = [e for e in kernels if e["name"].startswith("ovz_gemm_tiled_64x64x32")]
    iters = [e for e in trace["traceEvents"] if e.get("cat") == "user_annotation" and e["name"].startswith("ovz_iter#")]
    assert len(comm) == 2 and len(gemm) == 2 and len(iters) == 2
    assert comm[0]["args"]["registers per thread"] == 96
    assert comm[0]["args"]["block"] == [512, 1, 1]
    assert gemm[0]["args"]["shared memory"] >= 114688


def test_probe_reaches_every_sm_on_an_ordinary_stream(ext):
    ids = ext.probe_sms(4 * torch.cuda.get_device_properties(0).multi_processor_count, 20_000)
    torch.cuda.synchronize()
    assert int(torch.unique(ids).numel()) == torch.cuda.get_device_properties(0).multi_processor_count
    assert int(ids.min()) >= 0


def _small(**changes):
    from overlapviz.collectors.config import cb_ar_standin

    small = dict(gemm_m=1024, gemm_n=1024, gemm_k=1024, message_bytes=8 << 20, iterations=6, trace_iterations=2)
    return cb_ar_standin().replace(**(small | changes))


@pytest.mark.parametrize("impl", ["tiled", "vendor"])
def test_green_context_confines_the_gemm_and_records_the_sms_granted(impl):
    from overlapviz.collectors.run import measure
    from overlapviz.collectors.workload import Dist, Workload

    gc = pytest.importorskip("torch.cuda.green_contexts")
    if getattr(gc, "SUPPORTED", True) is False:
        pytest.skip("torch built without green contexts")
    changes = {"compute_impl": "vendor", "dtype": "bfloat16"} if impl == "vendor" else {}
    config = _small(setup="optimized", green_ctx_sms=64, **changes)
    w = Workload(config, Dist(0, 1, 0, "stand-in", torch.device("cuda", 0), False))
    try:
        rec = w.effective["controls"]["green_ctx_sms"]
        assert rec["requested"] == 64 and rec["applied"] is True
        assert 64 <= rec["effective"] < torch.cuda.get_device_properties(0).multi_processor_count, rec
        w.check()
        assert all(t > 0 for t in measure(w, 3))
        ref = w.a.double() @ w.b.double()
        assert float(torch.linalg.norm(w.c.double() - ref) / torch.linalg.norm(ref)) < 2e-2  # the green GEMM wrote C
    finally:
        w.close()


def _sweep_of(configs, out, **kw):
    from overlapviz.collectors import sweep as sw

    return sw.run_sweep(sw.Sweep("t", tuple(configs), None), out, progress=False, **kw)


def test_batch_runs_configurations_in_one_process_and_isolates_failures(tmp_path):
    from overlapviz.collectors import manifest as mf

    optin = torch.cuda.get_device_properties(0).shared_memory_per_block_optin
    configs = [_small(setup="baseline"), _small(setup="optimized", smem_pad_bytes=optin),  # fails: beyond the opt-in limit
               _small(setup="optimized", smem_carveout_percent=100, smem_pad_bytes=114688), _small(setup="optimized")]
    outcomes = _sweep_of(configs, tmp_path, check=False)
    assert [o.status for o in outcomes] == ["ok", "failed", "ok", "ok"], [o.error for o in outcomes]
    assert "smem_pad_bytes" in outcomes[1].error
    pids = {open(o.run_dir / mf.LOG).readline().split("pid ")[1].split(",")[0] for o in outcomes}
    assert len(pids) == 1  # one batch process
    # the carve-out preference of run 3 must not leak into run 4 (same process, same kernels)
    m3, m4 = (mf.read_manifest(o.run_dir)["effective"] for o in outcomes[2:])
    assert m3["smem_carveout_applied"] is True and m4["smem_carveout_applied"] is False


def test_max_connections_runs_in_its_own_process_and_is_recorded(tmp_path):
    from overlapviz.collectors import manifest as mf

    outcomes = _sweep_of([_small(setup="optimized"), _small(setup="optimized", cuda_max_connections=1)], tmp_path)
    assert [o.status for o in outcomes] == ["ok", "ok"], [o.error for o in outcomes]
    plain, one = (mf.read_manifest(o.run_dir)["effective"]["controls"]["cuda_max_connections"] for o in outcomes)
    assert one["requested"] == 1 and one["effective"] == 1 and one["applied"] is True
    assert plain["requested"] is None
    assert mf.read_manifest(outcomes[1].run_dir)["environment"]["variables"]["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"


def test_preflight_passes_a_runnable_sweep_and_refuses_too_much_memory():
    from overlapviz.collectors import preflight

    machine = preflight.probe_machine()
    assert machine["gpus"] and machine["compiler"]["ok"], machine
    assert preflight.check_configs([_small()], machine) == []
    huge = _small(compute_impl="vendor", gemm_m=1 << 19, gemm_n=1 << 19, gemm_k=8)
    (problem,) = preflight.check_configs([huge], machine)
    assert problem.message.startswith("memory: about")
