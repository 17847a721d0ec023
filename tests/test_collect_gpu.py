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
    from overlapviz.collectors.workload import _standin_expected

    data = torch.randn(4 * 4099, device="cuda")
    peer = torch.randn_like(data)
    want = _standin_expected(data, peer, ranks, collective)
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
    cmd = [sys.executable, "-m", "overlapviz.collectors.run", "--preset", "cb_ar_standin", "--run-dir", str(run_dir),
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
