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
from overlapviz.dataset.schema import RUNS, read_frame
from overlapviz.testing import process_alive

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
        ({"setup": "sequential", "green_ctx_sms": 64}, "green_ctx_sms"),  # nothing runs beside the GEMM
        ({"setup": "optimized", "green_ctx_sms": 0}, "green_ctx_sms"),
        ({"cuda_max_connections": 0}, "cuda_max_connections"),
        ({"cuda_max_connections": 33}, "cuda_max_connections"),
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
    assert set(sw.shipped_sweeps()) >= {"cpu_tour", "h200_paper_grid", "h200_standin"}
    assert sw.load_sweep("h200_standin").configs == sweep.configs  # by name, from anywhere
    with pytest.raises(ValueError, match="no shipped sweep of that name .shipped: cpu_tour"):
        sw.load_sweep("nope")


def test_paper_grid_is_the_papers_grid_with_one_reference_per_workload():
    from overlapviz.analysis.speedup import WORKLOAD_KEY

    configs = sw.load_sweep("h200_paper_grid").configs
    assert all(c.backend == "stand-in" and c.single_process for c in configs)
    tiled = [c for c in configs if c.compute_impl == "tiled"]
    grid = {(c.workload, c.setup, (c.tile_m, c.tile_n, c.tile_k), c.smem_pad_bytes) for c in tiled
            if c.green_ctx_sms is None and c.cuda_max_connections is None and c.smem_carveout_percent is None}
    assert len(grid) == 4 * 3 * 3 * 2  # workloads x setups x shaping levels x tiles
    vendor = [c for c in configs if c.compute_impl == "vendor"]
    assert {c.dtype for c in vendor} == {"bfloat16"} and {c.setup for c in vendor} == {"sequential", "baseline", "optimized"}
    controls = {("sm_carveout", c.workload) for c in vendor if c.sm_carveout} | {
        ("green", c.workload, c.compute_impl) for c in configs if c.green_ctx_sms} | {
        ("connections", c.workload, c.compute_impl, c.launch_order) for c in configs if c.cuda_max_connections}
    assert len(controls) == 4 + 8 + 16
    # the analysis pools every run with equal WORKLOAD_KEY, setup, pad 0 and priority 0 as the reference:
    # the controls stay on the optimized setup, so each workload keeps exactly one of each
    key = lambda c: tuple(getattr(c, k, None) for k in WORKLOAD_KEY if hasattr(c, k))  # noqa: E731
    for setup in ("sequential", "baseline"):
        refs = [key(c) for c in configs if c.setup == setup and c.smem_pad_bytes == 0 and c.requested_priority == 0]
        assert len(refs) == len(set(refs)) == 4 * 3, setup


def test_cpu_tour_runs_on_a_cpu():
    configs = sw.load_sweep("cpu_tour").configs
    assert len(configs) == 6 and all(c.backend == "gloo" and c.nproc == 2 and c.compute_impl == "vendor" for c in configs)


def test_launch_command_uses_torchrun_for_several_processes(tmp_path):
    import sys

    one = sw.launch_command(gloo_smoke().replace(nproc=1, backend="auto"), tmp_path)
    two = sw.launch_command(gloo_smoke(), tmp_path)
    custom = sw.launch_command(gloo_smoke(), tmp_path, launcher="srun torchrun --nnodes 2 --nproc-per-node 4")
    # -P: the current directory is not put on sys.path (a clone's overlapviz/ would shadow the installed package)
    assert one[:4] == [sys.executable, "-P", "-m", "overlapviz.collectors.run"]
    assert two[:6] == [sys.executable, "-P", "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
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
    # --no-check: the tiled run must get as far as the run itself, to show how a failing run is recorded
    result = runner.invoke(main, ["collect", "--sweep", str(out / "cpu.toml"), "-o", str(out), "--no-progress", "--no-check"])
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
    outcomes = sw.run_sweep(sweep, resumed, progress=False, check=False)
    assert [o.status for o in outcomes] == ["skipped-ok", "skipped-failed", "failed"]
    assert (ok_dir / "manifest.json").stat().st_mtime_ns == before
    assert not (interrupted / "trace_rank0.json.gz").exists()  # the partial attempt was cleared
    assert mf.run_status(interrupted) == "failed"


@needs_gloo
@pytest.mark.slow
def test_retry_failed_runs_the_failed_configurations_again(gloo_sweep, tmp_path):
    out, _, sweep = gloo_sweep
    (tmp_path / "runs").mkdir()
    failed = out / "runs" / run_id(sweep.configs[1])
    shutil.copytree(failed, tmp_path / "runs" / failed.name)
    before = json.loads((failed / "manifest.json").read_text())["run"]["start_time"]
    one = sw.Sweep("t", (sweep.configs[1],), None)
    assert [o.status for o in sw.run_sweep(one, tmp_path, progress=False, check=False)] == ["skipped-failed"]
    (again,) = sw.run_sweep(one, tmp_path, progress=False, check=False, retry_failed=True)
    assert again.status == "failed" and "tiled needs a CUDA or ROCm GPU" in again.error  # rerun, and failed again
    assert json.loads((again.run_dir / "manifest.json").read_text())["run"]["start_time"] >= before
    r = CliRunner().invoke(main, ["collect", "--sweep", str(out / "cpu.toml"), "-o", str(out), "--no-progress",
                                  "--no-ingest", "--list"])
    assert r.exit_code == 0 and r.output.count("\tfailed") == 2, r.output


@needs_gloo
@pytest.mark.slow
def test_report_lists_failures_and_never_a_table_of_nulls(gloo_sweep, tmp_path):
    from overlapviz.collectors import report
    from overlapviz.ingest import ingest

    out, _, sweep = gloo_sweep
    text = report.render(out / "dataset")
    assert "| cb-ar | torch.matmul fp32 |" in text and "<NA>" not in text and "nan" not in text
    assert "2 failed:" in text and "timeout: no result after 0.5 s" in text
    only_failed = [out / "runs" / run_id(c) for c in sweep.configs[1:]]
    ds = ingest([str(d) for d in only_failed], tmp_path / "ds", progress=False)
    with pytest.raises(ValueError, match="every configuration failed") as exc:
        report.render(ds)
    assert "RuntimeError: compute_impl tiled needs a CUDA or ROCm GPU" in str(exc.value)
    assert "<NA>" not in str(exc.value)


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


# --- kill -9 of a sweep ----------------------------------------------------------------------

KILLED_SWEEP = """
name = "killed"
preset = "gloo_smoke"
[[grid]]
setup = ["sequential", "baseline", "optimized"]
"""


def _processes_of(run_id_: str, under: Path) -> dict[int, str]:
    """pid -> command line of the live processes started for run ``run_id_`` of the sweep under ``under``."""
    found = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if run_id_ in cmd and str(under) in cmd and process_alive(int(d.name)):
            found[int(d.name)] = cmd
    return found


def _files(d: Path) -> dict[str, tuple[str, int]]:
    import hashlib

    return {p.name: (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns) for p in sorted(d.iterdir())}


@needs_gloo
@pytest.mark.slow
@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="finds the ranks through /proc")
def test_sigkill_of_a_sweep_mid_run_leaves_no_rank_nothing_half_written_and_resumes(tmp_path):
    """kill -9 of ``overlapviz collect``'s process group while its second configuration runs
    (its ranks are in their own sessions: the kill does not reach them directly)."""
    import signal
    import subprocess
    import sys
    import time

    from overlapviz.ingest import ingest

    script = Path(sys.executable).with_name("overlapviz")
    cli = [str(script)] if script.exists() else [sys.executable, "-c", "from overlapviz.cli import main; main()"]
    sweep_file = tmp_path / "killed.toml"
    sweep_file.write_text(KILLED_SWEEP)
    out = tmp_path / "out"
    rids = [run_id(c) for c in sw.load_sweep(sweep_file).configs]
    collect = [*cli, "collect", "--sweep", str(sweep_file), "-o", str(out), "--no-progress"]
    proc = subprocess.Popen([*collect, "--no-ingest"], start_new_session=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    try:
        # the trigger: the first run finished (its directory appears), the second's torchrun and
        # its 2 ranks run (a child forked but not yet exec'd still shows torchrun's command line)
        deadline = time.monotonic() + 120
        while True:
            ranks = _processes_of(rids[1], out)
            launchers = sum("torch.distributed.run" in c for c in ranks.values())
            if mf.run_status(out / "runs" / rids[0]) == "ok" and launchers == 1 and len(ranks) == 3:
                break
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read().decode()[-3000:]
            time.sleep(0.02)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        deadline = time.monotonic() + 30
        while any(process_alive(p) for p in ranks) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not {p: c[:80] for p, c in ranks.items() if process_alive(p)}, "ranks outlived the killed sweep"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        for p in _processes_of("", out):
            os.kill(p, signal.SIGKILL)

    # nothing half-written is a run: the finished one complete, the others absent (the
    # interrupted attempt is hidden, and never finished: its ranks did not go on)
    visible = sorted(p.name for p in (out / "runs").iterdir() if not p.name.startswith("."))
    assert visible == [rids[0]]
    assert sorted(_files(out / "runs" / rids[0])) == [
        "collect.log", "manifest.json", "timings_rank0.json", "timings_rank1.json", "trace_rank0.json.gz", "trace_rank1.json.gz"]
    assert not list((out / "runs").glob(f"*{rids[1]}*/manifest.json")), "the killed run was finished by orphans"
    assert (out / sw.SWEEP_COPY).read_text() == KILLED_SWEEP
    listed = CliRunner().invoke(main, collect[len(cli):] + ["--list"])
    assert listed.exit_code == 0 and listed.output.split() == [rids[0], "ok", rids[1], "todo", rids[2], "todo"], listed.output
    ds = ingest([str(out)], tmp_path / "ds", progress=False)  # a user ingesting the sweep now gets the one run
    assert sorted(read_frame(ds, "runs")["run_id"]) == [rids[0]]
    first = _files(out / "runs" / rids[0])

    # resumed (with --retry-failed: finished runs stay finished all the same): exactly the two missing runs
    again = subprocess.run([*collect, "--retry-failed", "--report"], capture_output=True, text=True, timeout=240)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "killed: 3 runs, 3 ok, 0 failed, 1 finished before" in again.stdout
    assert _files(out / "runs" / rids[0]) == first  # byte for byte, not even rewritten
    assert sorted(p.name for p in (out / "runs").iterdir()) == sorted(rids)  # the hidden attempt removed
    assert not list(out.glob(".batch-*"))
    runs = read_frame(out / sw.DATASET_DIR, "runs")
    assert sorted(runs["run_id"]) == sorted(rids) and set(runs["status"]) == {"ok"}
    assert "| baseline |" in again.stdout  # the report


_RANK = """
import os, sys, time
from overlapviz.collectors.launch import stay_with_parent
stay_with_parent()
print(os.getpid(), flush=True)
time.sleep(120)
"""
_LAUNCHER = """
import subprocess, sys
rank = subprocess.Popen([sys.executable, "-c", sys.argv[1]], start_new_session=True)  # like torchrun's workers
rank.wait()
"""


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_rank_dies_with_its_launcher_and_never_starts_for_a_dead_sweep(tmp_path):
    import signal
    import subprocess
    import sys
    import time

    from overlapviz.collectors.launch import SWEEP_PID_ENV

    # the launcher (torchrun's part) killed with SIGKILL: it cannot stop its rank, the rank goes anyway
    launcher = subprocess.Popen([sys.executable, "-c", _LAUNCHER, _RANK], stdout=subprocess.PIPE, start_new_session=True)
    try:
        rank = int(launcher.stdout.readline())
        assert process_alive(rank)
        os.kill(launcher.pid, signal.SIGKILL)
        launcher.wait()
        deadline = time.monotonic() + 10  # it would sleep 120 s
        while process_alive(rank) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not process_alive(rank), "the rank outlived its launcher"
    finally:
        if launcher.poll() is None:
            launcher.kill()
    # a rank whose sweep died before it could tie itself to anything: it ends at once
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    late = subprocess.run([sys.executable, "-c", _RANK], env=dict(os.environ, **{SWEEP_PID_ENV: str(dead.pid)}),
                          capture_output=True, text=True, timeout=60)
    assert (late.returncode, late.stdout) == (-signal.SIGKILL, "")


def test_a_partial_attempt_is_published_whole_and_leftovers_of_dead_sweeps_go(tmp_path):
    runs = tmp_path / "runs"
    rd = runs / "r1"
    rd.mkdir(parents=True)
    (rd / "manifest.json").write_text("old")
    work = sw.partial_dir(rd)
    assert work.parent == runs and work.name == f".r1.partial-{os.getpid()}"
    work.mkdir()
    (work / "manifest.json").write_text("new")
    sw.publish(work, rd)  # a retried run replaces the older attempt
    assert (rd / "manifest.json").read_text() == "new" and sorted(p.name for p in runs.iterdir()) == ["r1"]
    dead = 2**22 + 12345  # above the default pid_max: no such process
    for name in (f".r2.partial-{dead}", f".r1.old-{dead}"):
        (runs / name).mkdir()
        (runs / name / "trace_rank0.json.gz").write_bytes(b"x")
    (tmp_path / f".batch-{dead}.json").write_text("[]")
    (runs / f".r3.partial-{os.getpid()}").mkdir()  # a live sweep's (this process): kept
    removed = sw.remove_leftovers(tmp_path)
    assert sorted(p.name for p in removed) == sorted([f".r2.partial-{dead}", f".r1.old-{dead}", f".batch-{dead}.json"])
    assert sorted(p.name for p in runs.iterdir()) == [f".r3.partial-{os.getpid()}", "r1"]
    assert sw.finished_run_dirs(tmp_path) == []  # r1's manifest is not a real one, and hidden dirs are never runs


# --- pieces that run anywhere -------------------------------------------------------------


def test_standin_reference_is_a_ring_all_reduce_seen_from_rank_0():
    from overlapviz.collectors.workload import standin_expected

    data = torch.arange(24, dtype=torch.float32)  # 6 float4 vectors -> chunks of 2 vectors for n = 3
    peer = torch.full((24,), 100.0)
    out = standin_expected(data, peer, 3, "all_reduce")
    assert torch.equal(out[:8], peer[:8])  # chunk 0: all-gather only
    assert torch.equal(out[8:16], data[8:16] + 100)  # chunk 1: reduce-scatter only
    assert torch.equal(out[16:], peer[16:])  # chunk 2: reduced, then overwritten by the all-gather
    a2a = standin_expected(data, peer, 3, "all_to_all")
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


# --- validation up front ---------------------------------------------------------------------

CPU_MACHINE = {"torch": "2.13.0+cpu", "cuda": None, "hip": None, "gloo": True, "nccl": False, "gpus": [],
               "compiler": {"ok": False, "why": "no nvcc"}, "green_ctx": {"ok": False, "why": "no GPU"},
               "sm_carveout_setter": True, "host_mem_available_bytes": 8 << 30}
H200 = {"index": 0, "name": "NVIDIA H200", "sms": 132, "total_bytes": 150 << 30, "free_bytes": 140 << 30,
        "smem_per_block_optin": 232448}
GPU_MACHINE = dict(CPU_MACHINE, torch="2.11.0+cu130", cuda="13.0", nccl=True, gpus=[H200],
                   compiler={"ok": True, "why": None}, green_ctx={"ok": True, "why": None})


def test_preflight_lists_every_problem_of_a_gpu_sweep_on_a_cpu_at_once():
    from overlapviz.collectors import preflight

    configs = sw.load_sweep("h200_paper_grid").configs
    problems = preflight.check_configs(configs, CPU_MACHINE)
    text = preflight.format_problems(problems, len(configs))
    assert text.startswith(f"{len(configs)} of {len(configs)} configurations cannot run on this machine; nothing was run")
    msgs = [p.message for p in problems]
    assert any(m.startswith("compute_impl tiled (our CUDA GEMM) needs a CUDA or ROCm GPU") and "cpu_tour" in m for m in msgs)
    assert any(m.startswith("backend stand-in needs a CUDA or ROCm GPU") for m in msgs)
    for knob in ("green_ctx_sms", "cuda_max_connections", "smem_carveout_percent", "sm_carveout"):
        assert any(m.startswith(f"{knob}: ") for m in msgs), knob
    # one line per problem, naming how many configurations it stops
    assert sum(len(p.run_ids) for p in problems if p.message.startswith("compute_impl tiled")) == 88
    assert preflight.check_configs(sw.load_sweep("cpu_tour").configs, CPU_MACHINE) == []


def test_preflight_checks_ranks_gpus_limits_and_memory_on_a_gpu_machine():
    from overlapviz.collectors import preflight
    from overlapviz.collectors.config import cb_ar, cb_ar_standin

    def problems(cfg, machine=GPU_MACHINE):
        return preflight.problems_for(cfg, machine)

    assert problems(cb_ar_standin()) == []
    (p,) = problems(cb_ar().replace(nproc=8))  # NCCL, 8 ranks, one GPU
    assert p.startswith("nproc = 8 needs 8 GPUs") and "stand-in" in p
    (p,) = problems(cb_ar_standin().replace(smem_pad_bytes=232448))
    assert p.startswith("smem_pad_bytes: 232448 bytes of padding") and "opt-in limit of 232448" in p
    (p,) = problems(cb_ar_standin().replace(compute_impl="vendor", gemm_m=1 << 18, gemm_n=1 << 18, gemm_k=8))
    assert p.startswith("memory: about") and "GPU 0 (NVIDIA H200) has 140.0 GiB free" in p
    no_gc = dict(GPU_MACHINE, green_ctx={"ok": False, "why": "torch 2.8 has no torch.cuda.green_contexts"})
    assert problems(cb_ar_standin().replace(setup="optimized", green_ctx_sms=112), no_gc) == [
        "green_ctx_sms: torch 2.8 has no torch.cuda.green_contexts"]
    (p,) = problems(cb_ar_standin().replace(setup="optimized", green_ctx_sms=140))
    assert p == "green_ctx_sms: 140 SMs asked for, the NVIDIA H200 has 132"
    (p,) = problems(cb_ar_standin(), dict(GPU_MACHINE, compiler={"ok": False, "why": "no nvcc (CUDA_HOME/ROCM_HOME or PATH)"}))
    assert "built on first use and need no nvcc" in p
    assert preflight.check_configs([cb_ar_standin()], {"probe_error": "the machine probe failed: boom"})[0].message == (
        "the machine probe failed: boom")


def test_collect_refuses_a_sweep_this_machine_cannot_run_before_running_anything(tmp_path):
    r = CliRunner().invoke(main, ["collect", "--sweep", "h200_paper_grid", "-o", str(tmp_path / "o"), "--no-progress"])
    assert r.exit_code != 0
    assert "116 of 116 configurations cannot run on this machine; nothing was run" in r.output, r.output
    assert "--no-check" in r.output and "Traceback" not in r.output
    assert not (tmp_path / "o" / "runs").exists()
    # a launcher runs the ranks elsewhere: the local machine is not asked
    from overlapviz.collectors import preflight

    assert preflight.require_runnable(sw.load_sweep("h200_paper_grid").configs, launcher="srun torchrun") is None


# --- batch processes ---------------------------------------------------------------------------

FAKE_WORKER = """
import json, os, sys, time
from pathlib import Path
from overlapviz.collectors import manifest as mf
from overlapviz.collectors.config import CollectConfig
args = sys.argv[1:]
items = json.loads(Path(args[args.index("--batch") + 1]).read_text())
status = os.fdopen(int(args[args.index("--status-fd") + 1]), "w", buffering=1)
for i, item in enumerate(items):
    cfg = CollectConfig.from_dict(item["config"])
    status.write(f"start {i}\\n")
    rd = Path(item["run_dir"])
    (rd / mf.LOG).write_text(f"pid {os.getpid()}\\n")
    if cfg.seed == 1:
        time.sleep(60)                      # hangs: killed at its timeout
    if cfg.seed == 2:
        os._exit(1)                         # dies without a word
    mf.write_manifest(rd, mf.manifest(cfg, mf.run_record(cfg, run_id=item["run_id"], status="ok")))
    status.write(f"end {i} ok\\n")
"""


def test_batch_keeps_each_runs_timeout_and_survives_crashes(tmp_path):
    import sys

    worker = tmp_path / "worker.py"
    worker.write_text(FAKE_WORKER)
    configs = [gloo_smoke().replace(nproc=1, seed=s, timeout_s=2.0) for s in (0, 1, 3, 2, 4)]
    items = [(c, tmp_path / "runs" / run_id(c)) for c in configs]
    seen = []
    outcomes = sw.run_batch(items, tmp_path, worker=[sys.executable, "-P", str(worker)], on_done=seen.append)
    assert [o.status for o in outcomes] == ["ok", "failed", "ok", "failed", "ok"]
    assert [o.run_id for o in outcomes] == [run_id(c) for c in configs] == [o.run_id for o in seen]
    assert outcomes[1].error == "timeout: no result after 2 s"
    assert outcomes[3].error.startswith("the batch process died (exit code 1) during this run")
    pids = [(rd / mf.LOG).read_text().split()[1] for _, rd in items]
    assert pids[0] == pids[1] != pids[2] == pids[3] != pids[4]  # a new process after the hang and after the crash
    for o in outcomes[1::2]:
        assert mf.run_status(o.run_dir) == "failed" and not list(o.run_dir.glob("trace_rank*"))
    assert not list(tmp_path.glob(".batch-*.json"))


def test_first_error_names_the_ranks_exception_not_torchruns_summary(tmp_path):
    (tmp_path / mf.LOG).write_text(
        "Traceback (most recent call last):\n  File x\n"
        "ModuleNotFoundError: No module named 'overlapviz.collectors'\n"
        "E1203 torch/distributed/elastic/multiprocessing/api.py failed (exitcode: 1)\n"
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n")
    assert sw._first_error(tmp_path) == "ModuleNotFoundError: No module named 'overlapviz.collectors'"
    (tmp_path / mf.LOG).write_text("/venv/bin/python: Error while finding module specification for 'overlapviz.collectors.run' "
                                   "(ModuleNotFoundError: No module named 'overlapviz.collectors')\n")
    assert sw._first_error(tmp_path).startswith("Error while finding module specification")


# --- the recorded paper grid ------------------------------------------------------------------

GRID = Path(__file__).resolve().parents[1] / "sample_traces" / "h200_paper_grid"


def test_the_recorded_grid_is_the_shipped_sweep_and_says_stand_in():
    ids = {run_id(c) for c in sw.load_sweep("h200_paper_grid").configs}
    assert ids == {d.name for d in (GRID / "runs").iterdir()}
    for d in (GRID / "runs").iterdir():
        m = mf.read_manifest(d)
        assert m["run"]["status"] == "ok" and m["run"]["stand_in"] is True and m["run"]["backend"] == "stand-in"
        assert "_standin_" in d.name and m["devices"][0]["name"] == "NVIDIA H200"
        controls = m["effective"]["controls"]
        cfg = m["config"]
        assert controls["green_ctx_sms"]["requested"] == cfg["green_ctx_sms"]
        assert controls["cuda_max_connections"]["requested"] == cfg["cuda_max_connections"]
        if cfg["green_ctx_sms"]:
            assert controls["green_ctx_sms"]["applied"] and controls["green_ctx_sms"]["effective"] == cfg["green_ctx_sms"]
        if cfg["cuda_max_connections"]:
            assert controls["cuda_max_connections"]["effective"] == cfg["cuda_max_connections"]


@pytest.fixture(scope="module")
def grid_dataset(tmp_path_factory):
    from overlapviz.ingest import ingest

    return ingest([str(GRID)], tmp_path_factory.mktemp("grid") / "ds", progress=False)


def test_report_knows_workload_gemm_tile_dtype_and_controls(grid_dataset):
    from overlapviz.collectors import report

    table = report.sweep_table(grid_dataset)
    assert len(table) == 116 and table["time_ratio"].notna().all() and table["speedup"].notna().all()
    assert list(dict.fromkeys(table["workload"])) == ["cb-ar", "mb-ar", "cb-a2a", "mb-a2a"]
    assert set(table["gemm"]) == {"tiled 64x64x32 fp32", "tiled 64x64x64 fp32", "torch.matmul bf16"}
    assert {"green ctx 112 SMs", "max connections 1", "max connections 1 + comm launched first",
            "cuBLAS SM carve-out 16", "smem carve-out 100 %", "-"} == set(table["controls"])
    # one reference each: no pooled iterations
    assert not table["sequential_run_id"].str.contains(",").any() and not table["baseline_run_id"].str.contains(",").any()
    text = report.render(grid_dataset)
    assert text.startswith("Communication: the single-GPU stand-in kernel") and "failed" not in text
    best = report.best_table(table)
    assert len(best) == 12 and (best["best_time_ratio"] < 1).all()


def test_a_batch_process_that_cannot_start_fails_its_first_run_and_the_sweep_moves_on(tmp_path):
    import sys

    worker = tmp_path / "broken.py"
    worker.write_text("raise ImportError('no module named overlapviz.collectors')\n")
    configs = [gloo_smoke().replace(nproc=1, seed=s, timeout_s=30.0) for s in (0, 1)]
    items = [(c, tmp_path / "runs" / run_id(c)) for c in configs]
    outcomes = sw.run_batch(items, tmp_path, worker=[sys.executable, "-P", str(worker)])
    assert [o.status for o in outcomes] == ["failed", "failed"]
    assert outcomes[0].error == "ImportError: no module named overlapviz.collectors"
