"""Collectors on CPU: config validation, sweeps, the gloo path end to end (2 processes), resume, failures.

The GPU paths are in tests/test_collect_gpu.py (marker ``gpu``).
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from overlapviz.cli import main
from overlapviz.collectors import manifest as mf
from overlapviz.collectors import sweep as sw
from overlapviz.collectors.config import PRESETS, CollectConfig, cb_ar, gloo_smoke, preset, run_id
from overlapviz.analysis.statistics import bootstrap_median
from overlapviz.collectors.workload import resolve_backend
from overlapviz.schema import RUNS, read_frame

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

needs_gloo = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs gloo")


# --- configuration ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "changes, field",
    [
        ({"workload": "cb-allgather"}, "workload"),
        ({"setup": "overlapped"}, "setup"),
        ({"compute_impl": "vendor", "smem_pad_bytes": 4096}, "smem_pad_bytes"),
        ({"sm_carveout": 8}, "sm_carveout"),  # tiled GEMM: no carve-out
        ({"tile_m": 32}, "tile_m"),
        ({"dtype": "bfloat16"}, "dtype"),  # tiled is fp32 only
        ({"setup": "sequential", "comm_priority": -1}, "comm_priority"),
        ({"setup": "baseline", "comm_priority": -2}, "comm_priority"),
        ({"setup": "optimized", "comm_priority": 0}, "comm_priority"),
        ({"iterations": 2}, "iterations"),
        ({"message_bytes": 1000}, "message_bytes"),
        ({"backend": "stand-in", "nproc": 2}, "nproc"),
        ({"standin_threads": 700}, "standin_threads"),
        ({"standin_smem_bytes": 1024}, "standin_smem_bytes"),
    ],
)
def test_bad_combinations_are_rejected_naming_the_field(changes, field):
    with pytest.raises(ValueError, match=rf"^{field}: "):
        cb_ar().replace(**changes)


def test_presets_are_valid_and_distinct():
    ids = {name: run_id(fn()) for name, fn in PRESETS.items()}
    assert len(set(ids.values())) == len(ids)
    assert preset("cb-ar-small") == PRESETS["cb_ar_small"]()
    assert cb_ar().message_bytes == 896 << 20  # the paper's message
    with pytest.raises(ValueError, match="preset 'nope' does not exist"):
        preset("nope")


def test_run_id_is_a_function_of_the_whole_config():
    a = gloo_smoke()
    assert run_id(a) == run_id(gloo_smoke())
    assert run_id(a) != run_id(a.replace(seed=1))  # a field not in the readable part still counts
    assert run_id(a).startswith("cb-ar_baseline_vendor-float32_p0_gloo_")
    assert "phigh" in run_id(cb_ar().replace(setup="optimized"))


def test_from_dict_rejects_unknown_keys_and_wrong_types():
    with pytest.raises(ValueError, match="f.json: unknown key 'smem_pad'"):
        CollectConfig.from_dict({"smem_pad": 1}, where="f.json")
    with pytest.raises(ValueError, match="f.json: iterations must be int"):
        CollectConfig.from_dict({"iterations": "many"}, where="f.json")
    cfg = CollectConfig.from_dict({"comm_priority": "none", "check": "false", "standin_link_gbps": "12.5"})
    assert (cfg.comm_priority, cfg.check, cfg.standin_link_gbps) == (None, False, 12.5)


def test_warmup_is_the_first_third():
    assert [cb_ar().replace(iterations=n).warmup_iterations for n in (3, 30, 31)] == [1, 10, 10]


@pytest.mark.parametrize(
    "backend, world, cuda, expect",
    [("auto", 1, True, "stand-in"), ("auto", 8, True, "nccl"), ("auto", 2, False, "gloo"), ("nccl", 4, True, "nccl")],
)
def test_backend_resolution(backend, world, cuda, expect):
    cfg = cb_ar().replace(backend=backend)
    assert resolve_backend(cfg, world, cuda, False) == expect


def test_backend_resolution_refuses_what_cannot_run():
    with pytest.raises(RuntimeError, match="needs 2\\+ ranks"):
        resolve_backend(cb_ar().replace(backend="gloo"), 1, False, False)
    with pytest.raises(RuntimeError, match="needs a CUDA or ROCm GPU"):
        resolve_backend(cb_ar().replace(backend="nccl"), 2, False, False)
    assert resolve_backend(cb_ar(), 2, True, True) == "rccl"


# --- sweep files ------------------------------------------------------------------------

SWEEP = """
name = "t"
preset = "gloo_smoke"
[base]
iterations = 6
[[grid]]
setup = ["sequential", "baseline"]
message_bytes = [65536, 131072]
[[grid]]
setup = "sequential"
message_bytes = 65536      # a duplicate of the first grid: run once
"""


def test_sweep_is_the_union_of_grid_products_without_duplicates():
    sweep = sw.parse_sweep(SWEEP, where="s.toml")
    assert sweep.name == "t"
    assert [(c.setup, c.message_bytes) for c in sweep.configs] == [
        ("sequential", 65536), ("sequential", 131072), ("baseline", 65536), ("baseline", 131072)]
    assert all(c.backend == "gloo" and c.iterations == 6 for c in sweep.configs)
    over = sw.parse_sweep(SWEEP, where="s.toml", overrides={"iterations": "9"})
    assert {c.iterations for c in over.configs} == {9}


@pytest.mark.parametrize(
    "text, message",
    [
        ("preset = 'gloo_smoke'\nsetups = 1", "s.toml: unknown key 'setups'"),
        ("preset = 'gloo_smoke'\n[[grid]]\nsetup = ['sequential', 'fast']", r"s.toml grid 1 \(setup='fast'\): setup: must be one of"),
        ("preset = 'gloo_smoke'\n[[grid]]\ncompute_impl = 'vendor'\nsmem_pad_bytes = [0, 1024]",
         r"grid 1 \(compute_impl='vendor', smem_pad_bytes=1024\): smem_pad_bytes: shaping needs"),
        ("preset = 'gloo_smoke'\n[base]\nwarmup = 3", r"s.toml \[base\]: unknown key 'warmup'"),
        ("preset = 'gloo_smoke'\n[[grid]]\nsetup = []", "s.toml grid 1: setup has no values"),
        ("preset = [", "s.toml: not valid TOML"),
    ],
)
def test_bad_sweeps_name_the_file_grid_and_field(text, message):
    with pytest.raises(ValueError, match=message):
        sw.parse_sweep(text, where="s.toml")


def test_shipped_sweep_file_parses():
    path = Path(sw.__file__).with_name("sweep_h200_standin.toml")
    sweep = sw.load_sweep(path)
    assert len(sweep.configs) == 16
    assert all(c.backend == "stand-in" for c in sweep.configs)


def test_launch_command_uses_torchrun_for_several_processes(tmp_path):
    one = sw.launch_command(gloo_smoke().replace(nproc=1, backend="auto"), tmp_path)
    two = sw.launch_command(gloo_smoke(), tmp_path)
    custom = sw.launch_command(gloo_smoke(), tmp_path, launcher="srun torchrun --nnodes 2 --nproc-per-node 4")
    assert one[1:3] == ["-m", "overlapviz.collectors.run"]
    assert two[1:5] == ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    assert custom[:6] == ["srun", "torchrun", "--nnodes", "2", "--nproc-per-node", "4"]
    assert custom[6:8] == ["-m", "overlapviz.collectors.run"]
    assert json.loads(custom[custom.index("--config-json") + 1]) == gloo_smoke().to_dict()


def test_collect_cli_refuses_bad_input_in_one_line(tmp_path):
    runner = CliRunner()
    r = runner.invoke(main, ["collect", "--preset", "gloo_smoke", "-o", str(tmp_path), "--setup", "fast"])
    assert r.exit_code != 0 and "options: setup: must be one of" in r.output and "Traceback" not in r.output
    r = runner.invoke(main, ["collect", "--preset", "gloo_smoke", "--sweep", "x.toml", "-o", str(tmp_path)])
    assert r.exit_code != 0 and "exactly one of" in r.output
    r = runner.invoke(main, ["collect", "--sweep", str(tmp_path / "missing.toml"), "-o", str(tmp_path)])
    assert r.exit_code != 0
    r = runner.invoke(main, ["collect", "--preset", "gloo_smoke", "-o", str(tmp_path), "--list"])
    assert r.exit_code == 0, r.output
    assert r.output.strip() == f"{run_id(gloo_smoke())}\ttodo"


# --- the gloo path end to end (two processes) ---------------------------------------------


@pytest.fixture(scope="module")
def gloo_sweep(tmp_path_factory):
    """One ok gloo run (2 processes), one that fails (tiled GEMM on CPU) and one that times out."""
    out = tmp_path_factory.mktemp("sweep")
    text = """
name = "cpu"
preset = "gloo_smoke"
[[grid]]
setup = "baseline"
[[grid]]
setup = "sequential"
compute_impl = "tiled"      # needs a GPU: fails inside the run
[[grid]]
setup = "sequential"
timeout_s = 0.5             # killed before torch has even started
"""
    (out / "cpu.toml").write_text(text)
    runner = CliRunner()
    result = runner.invoke(main, ["collect", "--sweep", str(out / "cpu.toml"), "-o", str(out), "--no-progress"])
    return out, result, sw.load_sweep(out / "cpu.toml")


@needs_gloo
@pytest.mark.slow
def test_gloo_run_writes_the_run_directory_contract(gloo_sweep):
    out, result, sweep = gloo_sweep
    assert result.exit_code == 0, result.output
    assert "3 runs, 1 ok, 2 failed" in result.output
    rd = out / "runs" / run_id(sweep.configs[0])
    assert sorted(p.name for p in rd.iterdir()) == [
        "collect.log", "manifest.json", "timings_rank0.json", "timings_rank1.json", "trace_rank0.json.gz", "trace_rank1.json.gz"]
    m = json.loads((rd / "manifest.json").read_text())
    assert m["format"] == "overlapviz-run/1"
    assert set(m) >= {"run", "config", "environment", "devices", "kind_rules"}
    assert set(m["run"]) <= set(RUNS.names)
    run = m["run"]
    assert (run["status"], run["error"], run["backend"], run["world_size"], run["stand_in"]) == ("ok", None, "gloo", 2, False)
    assert (run["setup"], run["collective"], run["iterations"], run["warmup_iterations"]) == ("baseline", "all_reduce", 6, 2)
    assert run["torch_version"] == torch.__version__ and run["start_time"] and run["host"]
    assert run["comm_priority_effective"] is None  # no streams on CPU, and the manifest says why
    assert m["effective"]["priority_applied"] is False and "gloo" in m["effective"]["priority_note"]
    assert m["config"] == sweep.configs[0].to_dict()
    assert m["devices"] == []
    assert all(k.startswith(mf.ENV_PREFIXES) for k in m["environment"]["variables"])
    assert [r["rank"] for r in m["measurement"]["ranks"]] == [0, 1]
    for rank in (0, 1):
        timings = json.loads((rd / f"timings_rank{rank}.json").read_text())
        assert timings["rank"] == rank
        assert [(i["iteration"], i["measured"]) for i in timings["iterations"]] == [(i, i >= 2) for i in range(6)]
        assert all(i["time_ms"] > 0 for i in timings["iterations"])
        # one CI definition: the manifest's interval is overlapviz.analysis.statistics' bootstrap
        mine = next(r for r in m["measurement"]["ranks"] if r["rank"] == rank)
        measured = [i["time_ms"] for i in timings["iterations"] if i["measured"]]
        assert (mine["median_ms"], mine["ci_low_ms"], mine["ci_high_ms"]) == bootstrap_median(measured)
        trace = json.load(gzip.open(rd / f"trace_rank{rank}.json.gz"))
        assert trace["distributedInfo"]["rank"] == rank
        names = [e.get("name") for e in trace["traceEvents"]]
        assert names.count("gloo:all_reduce") == 2 and "aten::mm" in names
        assert [n for n in names if str(n).startswith("ovz_iter#")] == ["ovz_iter#0", "ovz_iter#1"]


@needs_gloo
@pytest.mark.slow
def test_failures_are_recorded_with_their_error_and_no_traces(gloo_sweep):
    out, result, sweep = gloo_sweep
    failed_tiled = out / "runs" / run_id(sweep.configs[1])
    failed_timeout = out / "runs" / run_id(sweep.configs[2])
    for rd, error in ((failed_tiled, "RuntimeError: compute_impl tiled needs a CUDA or ROCm GPU"),
                      (failed_timeout, "timeout: no result after 0.5 s")):
        m = json.loads((rd / "manifest.json").read_text())
        assert m["run"]["status"] == "failed"
        assert m["run"]["error"].startswith(error), m["run"]["error"]
        assert not list(rd.glob("trace_rank*"))
        assert m["config"] == next(c for c in sweep.configs if run_id(c) == rd.name).to_dict()
    assert f"failed {failed_tiled.name}: RuntimeError" in result.output


@needs_gloo
@pytest.mark.slow
def test_collect_ingests_every_finished_run(gloo_sweep):
    out, result, sweep = gloo_sweep
    runs = read_frame(out / "dataset", "runs").set_index("run_id")
    assert sorted(runs.index) == sorted(run_id(c) for c in sweep.configs)
    ok = run_id(sweep.configs[0])
    assert runs.loc[ok, "status"] == "ok" and runs.loc[ok, "source"] == "collected"
    assert runs.loc[run_id(sweep.configs[2]), "error"].startswith("timeout")
    its = read_frame(out / "dataset", "iterations")
    assert len(its[its.run_id == ok]) == 12 and its[its.run_id == ok]["measured"].sum() == 8
    kernels = read_frame(out / "dataset", "kernels", run_ids=[ok])
    assert set(kernels["kind"]) >= {"comm", "compute"}
    steps = read_frame(out / "dataset", "steps")
    assert set(steps[steps.run_id == ok]["source"]) == {"iteration"}


@needs_gloo
@pytest.mark.slow
def test_resume_skips_finished_runs_and_reruns_interrupted_ones(gloo_sweep, tmp_path):
    out, _, sweep = gloo_sweep
    resumed = tmp_path / "resumed"
    resumed.mkdir()
    shutil.copytree(out / "runs", resumed / "runs")
    ok_dir = resumed / "runs" / run_id(sweep.configs[0])
    before = (ok_dir / "manifest.json").stat().st_mtime_ns
    # an interrupted attempt: a directory with files but no finished manifest
    interrupted = resumed / "runs" / run_id(sweep.configs[2])
    (interrupted / "manifest.json").unlink()
    (interrupted / "trace_rank0.json.gz").write_bytes(b"partial")
    outcomes = sw.run_sweep(sweep, resumed, progress=False)
    assert [o.status for o in outcomes] == ["skipped-ok", "skipped-failed", "failed"]
    assert (ok_dir / "manifest.json").stat().st_mtime_ns == before
    assert not (interrupted / "trace_rank0.json.gz").exists()  # the partial attempt was cleared
    assert mf.run_status(interrupted) == "failed"


@needs_gloo
@pytest.mark.slow
def test_run_sh_runs_one_configuration_through_torchrun(tmp_path):
    import subprocess
    import sys

    script = Path(sw.__file__).with_name("run.sh")
    env = dict(os.environ, NGPU="2", CONFIG="gloo_smoke", OUT=str(tmp_path),
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    done = subprocess.run(["bash", str(script), "--setup", "sequential", "--iterations", "3", "--trace-iterations", "1"],
                          env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    (rd,) = (tmp_path / "runs").iterdir()
    m = json.loads((rd / "manifest.json").read_text())
    assert (m["run"]["status"], m["run"]["setup"], m["run"]["world_size"]) == ("ok", "sequential", 2)
    assert m["config"]["nproc"] == 2  # from torchrun's LOCAL_WORLD_SIZE
    assert rd.name == m["run"]["run_id"]
    assert sorted(p.name for p in rd.glob("trace_rank*")) == ["trace_rank0.json.gz", "trace_rank1.json.gz"]


# --- pieces that run anywhere -------------------------------------------------------------


def test_standin_reference_is_a_ring_all_reduce_seen_from_rank_0():
    from overlapviz.collectors.workload import _standin_expected

    data = torch.arange(24, dtype=torch.float32)  # 6 float4 vectors -> chunks of 2 vectors for n = 3
    peer = torch.full((24,), 100.0)
    out = _standin_expected(data, peer, 3, "all_reduce")
    assert torch.equal(out[:8], peer[:8])  # chunk 0: all-gather only
    assert torch.equal(out[8:16], data[8:16] + 100)  # chunk 1: reduce-scatter only
    assert torch.equal(out[16:], peer[16:])  # chunk 2: reduced, then overwritten by the all-gather
    a2a = _standin_expected(data, peer, 3, "all_to_all")
    assert torch.equal(a2a[:8], data[:8]) and torch.equal(a2a[8:], peer[8:])
    assert torch.equal(data, torch.arange(24, dtype=torch.float32))  # the argument is left alone


def test_standin_moves_what_the_collective_receives_per_rank():
    from overlapviz.collectors.workload import Workload

    class Fake:  # only the fields standin_bytes reads
        pass

    w = Fake()
    for workload, n, expect in (("cb-ar", 8, 2 * 7 * (64 << 20) // 8), ("cb-a2a", 4, 3 * (64 << 20) // 4)):
        w.config = cb_ar().replace(workload=workload, standin_ranks=n, message_bytes=64 << 20)
        assert Workload.standin_bytes(w) == expect


def test_collect_accepts_a_json_config_and_per_knob_options(tmp_path):
    cfg = tmp_path / "mine.json"
    cfg.write_text(json.dumps({"workload": "mb-a2a", "compute_impl": "vendor", "backend": "gloo", "nproc": 2}))
    r = CliRunner().invoke(main, ["collect", "--config", str(cfg), "-o", str(tmp_path / "o"), "--list",
                                  "--iterations", "12", "--comm-priority", "none"])
    assert r.exit_code == 0, r.output
    expect = CollectConfig(workload="mb-a2a", compute_impl="vendor", backend="gloo", nproc=2, iterations=12)
    assert r.output.split("\t")[0] == run_id(expect)
    cfg.write_text(json.dumps({"workload": "mb-a2a", "tile": 3}))
    r = CliRunner().invoke(main, ["collect", "--config", str(cfg), "-o", str(tmp_path / "o"), "--list"])
    assert r.exit_code != 0 and f"{cfg}: unknown key 'tile'" in r.output


def test_profiler_writes_no_trace_when_the_traced_pass_fails(tmp_path):
    from overlapviz.collectors.profiler import Profiler, iteration

    with pytest.raises(RuntimeError, match="boom"):
        with Profiler(tmp_path, 3, cuda=False):
            with iteration(0):
                raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []
    with Profiler(tmp_path, 3, cuda=False):
        with iteration(0):
            torch.mm(torch.ones(4, 4), torch.ones(4, 4))
    (trace,) = tmp_path.iterdir()
    assert trace.name == "trace_rank3.json.gz"
    names = {e.get("name") for e in json.load(gzip.open(trace))["traceEvents"]}
    assert {"ovz_iter#0", "aten::mm"} <= names
