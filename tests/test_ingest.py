"""Ingest of PyTorch-profiler (Kineto) Chrome traces: real traces checked against independent
computations with plain ``json`` (exact ns via ``Decimal``), plus synthetic edge cases."""

from __future__ import annotations

import gzip
import json
import shutil
from decimal import Decimal
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from overlapviz.dataset import schema
from overlapviz.cli import main
from overlapviz.domain.collectives import collective_names
from overlapviz.ingest import ingest
from overlapviz.domain.rules import Rule, default_rules
from overlapviz.testing import (
    cpu_op_event,
    kernel_event,
    kineto_trace,
    memcpy_event,
    runtime_event,
    step_event,
    write_trace,
)

DATA = Path(__file__).parent / "data"
TRACE_FILTER = DATA / "hta_trace_filter_2rank"
NCCL = DATA / "hta_nccl_parser_config" / "nccl_data.json.gz"
ROCM = DATA / "torch_rocm"
GLOO = DATA / "gloo_cpu"
GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


def raw_events(path: Path) -> list[dict]:
    """Events parsed independently: plain json, numbers as Decimal (no float rounding)."""
    with gzip.open(path, "rt") as fh:
        return json.load(fh, parse_float=Decimal)["traceEvents"]


def exact_ns(us) -> int:
    return int(Decimal(str(us)) * 1000)


def kernels_of(ds: Path, **eq) -> pd.DataFrame:
    k = schema.read_frame(ds, "kernels")
    for col, val in eq.items():
        k = k[k[col] == val]
    return k


@pytest.fixture(scope="module")
def real(tmp_path_factory) -> Path:
    """One dataset of every real trace: four runs."""
    out = tmp_path_factory.mktemp("real") / "ds"
    ingest([TRACE_FILTER, NCCL, ROCM / "resnet_act_checkpoint.json.gz", GLOO], out, progress=False)
    return out


# --- real traces ---------------------------------------------------------------------


def test_trace_filter_two_ranks_from_distributed_info(real):
    ranks = schema.read_frame(real, "ranks").query("run_id == 'hta_trace_filter_2rank'")
    assert sorted(ranks["rank"]) == [0, 1]
    assert set(ranks["world_size"]) == {128}
    for path in sorted(TRACE_FILTER.glob("*.json.gz")):
        ev = raw_events(path)
        rank = int(path.name.split("-")[1].split(".")[0])
        k = kernels_of(real, run_id="hta_trace_filter_2rank", rank=rank)
        assert len(k) == sum(e.get("cat") in GPU_CATS for e in ev)
        assert (k["kind"] == "comm").sum() == sum(e.get("cat") == "kernel" and "nccl" in e["name"].lower() for e in ev) == 10
        assert set(k.loc[k.kind == "comm", "collective"]) == {"send_recv"}
        assert (k["kind"] == "memory").sum() == sum(e.get("cat") in ("gpu_memcpy", "gpu_memset") for e in ev)
    runs = schema.read_frame(real, "runs").set_index("run_id")
    assert runs.loc["hta_trace_filter_2rank", "n_ranks"] == 2
    assert runs.loc["hta_trace_filter_2rank", "source"] == "imported"


def test_times_are_exact_ns_and_launch_joined_by_correlation(real):
    ev = raw_events(NCCL)
    runtime = {e["args"]["correlation"]: e for e in ev if e.get("cat") == "cuda_runtime"}
    expected = sorted(
        (exact_ns(e["ts"]), exact_ns(e["ts"]) + exact_ns(e["dur"]), e["args"]["correlation"],
         exact_ns(runtime[e["args"]["correlation"]]["ts"]) if e["args"]["correlation"] in runtime else None)
        for e in ev if e.get("cat") in GPU_CATS
    )
    k = kernels_of(real, run_id="nccl_data").sort_values(["start_ns", "end_ns", "correlation"])
    got = [(int(a), int(b), int(c), None if pd.isna(d) else int(d))
           for a, b, c, d in zip(k.start_ns, k.end_ns, k.correlation, k.launch_ns)]
    assert got == expected
    assert k["launch_ns"].notna().all()


def test_nccl_parser_config_steps_devices_collectives(real):
    steps = schema.read_frame(real, "steps").query("run_id == 'nccl_data'")
    assert list(steps["step"]) == [4, 5, 6]
    assert set(steps["source"]) == {"profiler_step"}
    ev = raw_events(NCCL)
    ranges = sorted((int(e["name"].split("#")[1]), exact_ns(e["ts"]), exact_ns(e["ts"]) + exact_ns(e["dur"]))
                    for e in ev if str(e.get("name", "")).startswith("ProfilerStep#"))
    assert [tuple(r) for r in steps[["step", "start_ns", "end_ns"]].itertuples(index=False)] == ranges
    k = kernels_of(real, run_id="nccl_data")
    comm = k[k.kind == "comm"]
    assert len(comm) == 21
    assert comm["collective"].value_counts().to_dict() == {"all_reduce": 15, "broadcast": 6}
    # step = the step whose host range holds the launch call (checked with a plain loop)
    for row in k.sample(300, random_state=0).itertuples():
        inside = [s for s, a, b in ranges if a <= row.launch_ns < b]
        assert (row.step if not pd.isna(row.step) else None) == (inside[-1] if inside else None)
    dev = schema.read_frame(real, "devices").query("run_id == 'nccl_data'")
    assert len(dev) == 8 and set(dev["arch"]) == {"sm_80"} and set(dev["vendor"]) == {"nvidia"}
    d0 = dev.set_index("device").loc[0]
    assert (d0.num_sms, d0.shared_mem_per_sm, d0.shared_mem_per_block_optin, d0.regs_per_sm) == (108, 167936, 166912, 65536)
    ranks = schema.read_frame(real, "ranks").query("run_id == 'nccl_data'")
    assert list(ranks["base_time_ns"]) == [1711964646000000000]
    assert json.loads(ranks["distributed_info"].iloc[0])["nccl_version"] == "2.17.1"
    runs = schema.read_frame(real, "runs").set_index("run_id")
    assert runs.loc["nccl_data", "nccl_version"] == "2.17.1"
    assert runs.loc["nccl_data", "device_name"] == "NVIDIA A100-PG509-200"


def test_rocm_resnet_amd_devices_grid_from_launch_call(real):
    path = ROCM / "resnet_act_checkpoint.json.gz"
    ev = raw_events(path)
    k = kernels_of(real, run_id="resnet_act_checkpoint")
    assert len(k) == sum(e.get("cat") in GPU_CATS for e in ev)
    comm = k[k.kind == "comm"]
    assert len(comm) == 17 and set(comm["stream"]) == {4}
    dev = schema.read_frame(real, "devices").query("run_id == 'resnet_act_checkpoint'")
    assert len(dev) == 8 and set(dev["vendor"]) == {"amd"} and set(dev["arch"]) == {"gfx942"}
    assert set(dev["warp_size"]) == {64}
    runtime = {e["args"]["correlation"]: e for e in ev if e.get("cat") == "cuda_runtime"}
    by_corr = k.set_index("correlation")
    checked = 0
    for e in ev:
        if e.get("cat") != "kernel" or e["args"]["correlation"] not in runtime:
            continue
        r = runtime[e["args"]["correlation"]]
        grid = e["args"].get("grid") or r["args"]["grid"]
        block = e["args"].get("block") or r["args"]["block"]
        if r["name"] == "hipExtModuleLaunchKernel":  # grid recorded in work-items
            grid = [-(-g // b) for g, b in zip(grid, block)]
        row = by_corr.loc[e["args"]["correlation"]]
        assert [row.grid_x, row.grid_y, row.grid_z, row.block_x] == [*grid, block[0]]
        assert row.launch_ns == exact_ns(r["ts"])
        checked += 1
    assert checked > 2000


def test_rocm_traces_without_distributed_info_rank_by_file_order(tmp_path):
    out = ingest([ROCM / "gpu_only_trace.json.gz", ROCM / "gaunernst_bert-small-uncased__1016001.json.gz"],
                 tmp_path / "ds", run_id="rocm", progress=False)
    ranks = schema.read_frame(out, "ranks").sort_values("rank")
    # neither file names a rank (the trailing number of the bert trace is a job id, not a
    # rank), so ranks follow the files' order by name: gaunernst... then gpu_only...
    assert list(ranks["rank"]) == [0, 1]
    assert [Path(p).name.split("_")[0] for p in ranks["source_path"]] == ["gaunernst", "gpu"]
    k = kernels_of(out)
    assert (k.kind == "compute").sum() == 60 + 562
    runs = schema.read_frame(out, "runs")
    assert runs["hip_version"].iloc[0] == "6.4.43483"


def test_gloo_cpu_host_activities_stand_in(real):
    k = kernels_of(real, run_id="gloo_cpu")
    assert k["is_host"].all() and k["device"].isna().all()
    for rank in (0, 1):
        ev = [e for e in raw_events(GLOO / f"rank{rank}.json.gz") if e.get("ph") == "X"]
        kr = k[k["rank"] == rank]
        gloo = [e for e in ev if e["name"].startswith("gloo:")]
        comm = kr[kr.kind == "comm"]
        assert sorted(comm["start_ns"]) == sorted(exact_ns(e["ts"]) for e in gloo)
        assert set(comm["collective"]) == {"all_reduce"}
        assert set(comm["stream"]) == {e["tid"] for e in gloo}
        # top-level cpu_ops on the main thread, found with a plain quadratic check
        main_tid = next(e["tid"] for e in ev if e["name"].startswith("ProfilerStep#"))
        ops = [e for e in ev if e.get("cat") == "cpu_op" and e["tid"] == main_tid]
        top = [o for o in ops if not any(p is not o and p["ts"] <= o["ts"] and o["ts"] + o["dur"] <= p["ts"] + p["dur"] and (p["ts"], -p["dur"]) < (o["ts"], -o["dur"]) for p in ops)]
        host_ops = kr[kr.category == "cpu_op"]
        assert sorted(host_ops["name"]) == sorted(o["name"] for o in top)
        assert set(host_ops.loc[host_ops.kind == "compute", "name"]) == {"aten::mm", "aten::div"}
        assert set(host_ops.loc[host_ops.kind == "other", "name"]) == {"c10d::allreduce_"}
        assert kr["step"].notna().all()
    runs = schema.read_frame(real, "runs").set_index("run_id")
    assert runs.loc["gloo_cpu", "backend"] == "gloo"


def test_compact_pretty_json_and_gzip_give_the_same_dataset(tmp_path):
    doc = json.loads(gzip.decompress(NCCL.read_bytes()))
    variants = {
        "compact.json": json.dumps(doc, separators=(",", ":")).encode(),
        "pretty.json": json.dumps(doc, indent=4).encode(),
        "pretty.json.gz": gzip.compress(json.dumps(doc, indent=1).encode()),
        "weird_name.trace": gzip.compress(json.dumps(doc).encode()),  # format by content, not name
    }
    tables = []
    for name, data in variants.items():
        (tmp_path / name).write_bytes(data)
        out = ingest([tmp_path / name], tmp_path / f"ds_{name}", run_id="x", progress=False)
        tables.append(schema.read_kernels(out).to_pandas())
    for t in tables[1:]:
        pd.testing.assert_frame_equal(t, tables[0])


# --- synthetic cases -----------------------------------------------------------------


def _one(tmp_path, *events, name="rank0.json", **kw) -> pd.DataFrame:
    path = write_trace(kineto_trace(*events, **kw), tmp_path / name)
    out = ingest([path], tmp_path / "ds", progress=False)
    return schema.read_frame(out, "kernels").sort_values("start_ns").reset_index(drop=True)


def test_nested_steps_innermost_wins_and_iterations_preferred(tmp_path):
    k = _one(
        tmp_path,
        step_event(1, 0, 10_000_000),
        step_event(7, 0, 10_000_000, name="ovz_iter#7"),
        step_event(8, 2_000_000, 3_000_000, name="ovz_iter#8"),  # nested inside #7
        runtime_event(1, 1_000_000), kernel_event("a", 1_100_000, 1_000, correlation=1),
        runtime_event(2, 2_500_000), kernel_event("b", 2_600_000, 1_000, correlation=2),
        runtime_event(3, 12_000_000), kernel_event("c", 12_100_000, 1_000, correlation=3),
        kernel_event("d", 13_000_000, 1_000, correlation=99),  # no launch call
    )
    assert k["step"].fillna(-1).tolist() == [7, 8, -1, -1]
    steps = schema.read_frame(tmp_path / "ds", "steps")
    assert set(steps["source"]) == {"iteration"} and sorted(steps["step"]) == [7, 8]
    assert k["launch_ns"].isna().tolist() == [False, False, False, True]


def test_launch_prefers_main_process_and_legacy_categories(tmp_path):
    k = _one(
        tmp_path,
        step_event(0, 0, 10_000_000),
        runtime_event(5, 3_000_000, pid=999, tid=999),  # same id from another process
        runtime_event(5, 2_000_000, cat="Runtime"),
        kernel_event("k", 4_000_000, 2_500, correlation=5, cat="Kernel"),
        memcpy_event(5_000_000, 1_000, correlation=6),
        {"ph": "X", "cat": "Memset", "name": "Memset (Device)", "pid": 0, "tid": 7, "ts": 6000.0, "dur": 1.0,
         "args": {"device": 0, "stream": 7, "correlation": 7, "bytes": 8}},
    )
    assert k["category"].tolist() == ["kernel", "gpu_memcpy", "gpu_memset"]
    assert k["kind"].tolist() == ["compute", "memory", "memory"]
    assert k.loc[0, "launch_ns"] == 2_000_000
    assert (k.loc[0, "start_ns"], k.loc[0, "end_ns"]) == (4_000_000, 4_002_500)
    assert k.loc[1, "bytes"] == 4096


def test_epoch_integer_microseconds_and_ns_fractions(tmp_path):
    big = 1_682_725_898_082_228  # epoch µs as older Kineto wrote them (ints)
    ev = [
        {"ph": "X", "cat": "kernel", "name": "old", "pid": 0, "tid": 7, "ts": big, "dur": 10,
         "args": {"device": 0, "stream": 7, "correlation": 1}},
        {"ph": "X", "cat": "kernel", "name": "new", "pid": 0, "tid": 7, "ts": 8_000_000_000_000.001, "dur": 0.001,
         "args": {"device": 0, "stream": 7, "correlation": 2}},
        {"ph": "X", "cat": "kernel", "name": "mid", "pid": 0, "tid": 7, "ts": 4_458_676_983_543.183, "dur": 41.407,
         "args": {"device": 0, "stream": 7, "correlation": 3}},
    ]
    k = _one(tmp_path, ev).set_index("name")
    assert (k.loc["old", "start_ns"], k.loc["old", "end_ns"]) == (big * 1000, big * 1000 + 10_000)
    assert (k.loc["new", "start_ns"], k.loc["new", "end_ns"]) == (8_000_000_000_000_001, 8_000_000_000_000_002)
    assert (k.loc["mid", "start_ns"], k.loc["mid", "end_ns"]) == (4_458_676_983_543_183, 4_458_676_983_584_590)


def test_rank_from_file_name_and_loose_files_form_one_run(tmp_path):
    for name, r in (("trace_rank3.json.gz", 3), ("w-rank-5.json", 5), ("worker_7.json", 7)):
        write_trace(kineto_trace(kernel_event("k", 1_000, 1_000, correlation=1), rank=None), tmp_path / "job" / name)
    files = sorted((tmp_path / "job").iterdir())
    out = ingest(files, tmp_path / "ds", progress=False)
    ranks = schema.read_frame(out, "ranks")
    # worker_7: a bare number is not taken for a rank (it is as often a job id or a pid),
    # so that file gets its position among the files sorted by name (2)
    assert sorted(ranks["rank"]) == [2, 3, 5] and set(ranks["run_id"]) == {"job"}
    out2 = ingest([tmp_path / "job"], tmp_path / "ds2", run_id="renamed", progress=False)
    assert set(schema.read_frame(out2, "runs")["run_id"]) == {"renamed"}


def _collected_run(d: Path, run_id: str, *, status="ok", ranks=2, kind_rules=None) -> None:
    d.mkdir(parents=True)
    manifest = {
        "format": "overlapviz-run/1",
        "run": {"run_id": run_id, "workload": "cb-ar", "setup": "baseline", "gemm_m": 4096, "tile_m": 64,
                "smem_pad_bytes": 16384, "comm_priority": -1, "world_size": ranks, "backend": "nccl",
                "status": status, "error": None if status == "ok" else "CUDA out of memory", "iterations": 3,
                "warmup_iterations": 1},
        "config": {"workload": "cb-ar"}, "environment": {"NCCL_DEBUG": "WARN"},
        "devices": [{"device": 0, "name": "NVIDIA H100", "num_sms": 132}], "kind_rules": kind_rules,
    }
    (d / "manifest.json").write_text(json.dumps(manifest))
    if status != "ok":
        return
    for r in range(ranks):
        ev = [step_event(0, 0, 1_000_000, name="ovz_iter#0"), step_event(9, 0, 5_000_000),
              runtime_event(1, 100_000), kernel_event("ovz_gemm_tiled", 200_000, 50_000, correlation=1),
              runtime_event(2, 150_000), kernel_event("ncclDevKernel_AllReduce_Sum_f32", 210_000, 30_000, correlation=2, stream=9),
              runtime_event(3, 2_000_000), kernel_event("ovz_gemm_tiled", 2_100_000, 50_000, correlation=3)]
        write_trace(kineto_trace(ev, rank=r, world_size=ranks, device_properties=[]), d / f"trace_rank{r}.json.gz")
        (d / f"timings_rank{r}.json").write_text(json.dumps(
            {"rank": r, "iterations": [{"iteration": i, "time_ms": 1.5 + i, "measured": i > 0} for i in range(3)]}))


def test_sweep_of_collected_runs_with_a_failed_one(tmp_path):
    sweep = tmp_path / "sweep"
    _collected_run(sweep / "runs" / "a", "cb-ar-baseline")
    _collected_run(sweep / "runs" / "b", "cb-ar-optimized", status="failed")
    out = ingest([sweep], tmp_path / "ds", progress=False)
    runs = schema.read_frame(out, "runs").set_index("run_id")
    assert runs.loc["cb-ar-baseline", "source"] == "collected"
    assert runs.loc["cb-ar-baseline", "smem_pad_bytes"] == 16384 and runs.loc["cb-ar-baseline", "n_ranks"] == 2
    assert json.loads(runs.loc["cb-ar-baseline", "config_json"])["environment"] == {"NCCL_DEBUG": "WARN"}
    assert runs.loc["cb-ar-optimized", "status"] == "failed"
    assert runs.loc["cb-ar-optimized", "error"] == "CUDA out of memory"
    k = schema.read_frame(out, "kernels")
    assert set(k["run_id"]) == {"cb-ar-baseline"}
    # ovz_iter ranges win over ProfilerStep; the third kernel was launched outside every iteration
    assert k.sort_values(["rank", "start_ns"])["step"].fillna(-1).tolist() == [0, 0, -1] * 2
    assert k.loc[k.kind == "comm", "collective"].unique().tolist() == ["all_reduce"]
    it = schema.read_frame(out, "iterations")
    assert len(it) == 6 and it["measured"].sum() == 4
    dev = schema.read_frame(out, "devices")
    assert set(dev["name"]) == {"NVIDIA H100"} and len(dev) == 2  # from the manifest: the traces have none


def test_rules_from_cli_are_applied_and_stored(tmp_path):
    path = write_trace(kineto_trace(
        runtime_event(1, 0), kernel_event("my_allreduce_kernel", 10_000, 5_000, correlation=1),
        runtime_event(2, 1_000), kernel_event("elementwise_add", 20_000, 5_000, correlation=2),
        runtime_event(3, 2_000), kernel_event("weird_copy", 30_000, 5_000, correlation=3),
    ), tmp_path / "t.json")
    rules_file = tmp_path / "rules.json"
    rules_file.write_text(default_rules().with_overrides([Rule("other", "^elementwise", ("kernel",))]).to_json())
    r = CliRunner().invoke(main, ["ingest", str(path), "-o", str(tmp_path / "ds"), "--comm-pattern", "allreduce",
                                  "--rule", "memory=copy@kernel", "--rules-file", str(rules_file), "--quiet"])
    assert r.exit_code == 0, r.output
    k = schema.read_frame(tmp_path / "ds", "kernels").set_index("name")
    assert k["kind"].to_dict() == {"my_allreduce_kernel": "comm", "elementwise_add": "other", "weird_copy": "memory"}
    assert k.loc["my_allreduce_kernel", "collective"] == "all_reduce"
    stored = json.loads((tmp_path / "ds" / "dataset.json").read_text())["kind_rules"]["rules"]
    assert stored[0] == {"kind": "memory", "pattern": "copy", "categories": ["kernel"]}
    assert json.loads(schema.read_frame(tmp_path / "ds", "runs")["kind_rules"].iloc[0])["rules"] == stored
    assert r.output == ""


def test_cli_summary_line(tmp_path):
    r = CliRunner().invoke(main, ["ingest", str(TRACE_FILTER), "-o", str(tmp_path / "ds"), "--workers", "2"])
    assert r.exit_code == 0, r.output
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and "1 run" in lines[0] and "2 ranks" in lines[0] and str(tmp_path / "ds") in lines[0]
    # every row of the kernels table, memory copies included: not called "kernels" (analyze's n_kernels counts fewer)
    n = len(schema.read_frame(tmp_path / "ds", "kernels"))
    assert f"{n:,} GPU activities (kernels, copies, memsets)" in lines[0]


def test_collective_names():
    import pyarrow as pa

    names = ["ncclKernel_AllReduce_RING_LL_Sum_float", "ncclDevKernel_ReduceScatter_Sum", "allgather_into_tensor_coalesced",
             "gloo:all_to_all", "ncclKernel_SendRecv_RING", "ncclDevKernel_Generic(x)", "ncclKernel_Broadcast_RING", "_allgather_base",
             None]
    assert collective_names(pa.array(names)).to_pylist() == [
        "all_reduce", "reduce_scatter", "all_gather", "all_to_all", "send_recv", None, "broadcast", "all_gather", None]


def test_generated_trace_ingests_exactly(tmp_path):
    from overlapviz.testing import generate_trace

    docs = [generate_trace(3_000, rank=r, world_size=2, seed=3, comm_every=7, n_steps=5) for r in range(2)]
    for r, d in enumerate(docs):
        write_trace(d, tmp_path / "gen" / f"rank{r}.json.gz")
    out = ingest([tmp_path / "gen"], tmp_path / "ds", workers=2, progress=False)
    k = schema.read_frame(out, "kernels")
    assert len(k) == 6_000 and (k.kind == "comm").sum() == 2 * (3_000 // 7)
    assert k["launch_ns"].notna().all() and k["step"].notna().all()
    assert (k["launch_ns"] < k["start_ns"]).all()
    assert k.groupby("rank")["step"].nunique().tolist() == [5, 5]


def test_progress_bar_only_when_asked(tmp_path, capsys):
    ingest([TRACE_FILTER], tmp_path / "a", progress=False)
    assert capsys.readouterr().err == ""
    ingest([TRACE_FILTER], tmp_path / "b", progress=True)
    assert "ingest" in capsys.readouterr().err
    ingest([TRACE_FILTER], tmp_path / "c")  # not a terminal under pytest: no bar
    assert capsys.readouterr().err == ""


def test_us_to_ns_is_exact_for_every_kineto_timestamp():
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from overlapviz.ingest.chrome_events import decode_events, ns_column  # what the Python reader reads with

    def us_to_ns(values):
        return ns_column(values, Path("t.json"), "GPU activity", "ts").to_pylist()

    @settings(max_examples=300, deadline=None)
    @given(st.lists(st.integers(min_value=0, max_value=(1 << 43) * 1000 - 1), min_size=1, max_size=50))
    def check(ns):
        # Kineto prints µs with three decimals; the decoder keeps each float literal's text
        text = [f"{n // 1000}.{n % 1000:03d}" for n in ns]
        events, _ = decode_events(("[" + ",".join(f'{{"ts": {t}}}' for t in text) + "]").encode(), Path("t.json"))
        assert us_to_ns([e.ts for e in events]) == ns

    check()
    epoch_us = [1_682_725_898_082_228, (1 << 53) - 1, 9_223_372_036_854_775]  # integer µs (older traces), to int64 ns
    assert us_to_ns(epoch_us) == [u * 1000 for u in epoch_us]
    assert us_to_ns(["1694128201436255.123", None]) == [1_694_128_201_436_255_123, None]  # a double: ...255.125


def test_collected_run_keeps_its_recorded_rules_unless_overridden(tmp_path):
    recorded = default_rules().with_overrides([Rule("comm", "ovz_gemm", ("kernel",))])
    _collected_run(tmp_path / "run", "r", kind_rules=recorded.to_dict())
    out = ingest([tmp_path / "run"], tmp_path / "ds", progress=False)
    k = schema.read_frame(out, "kernels")
    assert set(k["kind"]) == {"comm"}
    assert json.loads((out / "dataset.json").read_text())["kind_rules"] == recorded.to_dict()
    assert json.loads(schema.read_frame(out, "runs")["kind_rules"].iloc[0]) == recorded.to_dict()
    out2 = ingest([tmp_path / "run"], tmp_path / "ds2", rules=default_rules(), progress=False)
    assert (schema.read_frame(out2, "kernels")["kind"] == "compute").sum() == 4


def test_directory_scan_skips_documentation(tmp_path):
    write_trace(kineto_trace(kernel_event("k", 1_000, 1_000, correlation=1)), tmp_path / "job" / "rank0.json")
    (tmp_path / "job" / "NOTES.md").write_text('{"traceEvents": [], "schemaVersion": 1}')
    out = ingest([tmp_path / "job"], tmp_path / "ds", progress=False)
    assert json.loads(schema.read_frame(out, "runs")["source_paths"].iloc[0]) == [str(tmp_path / "job" / "rank0.json")]


def test_cpu_only_labels_are_not_activities(tmp_path):
    ev = [
        step_event(0, 0, 10_000_000, cat="cpu_op"),  # older torch: the step range is a cpu_op
        cpu_op_event("## forward ##", 100_000, 5_000_000, cat="user_annotation"),
        cpu_op_event("aten::mm", 200_000, 1_000_000),
        cpu_op_event("aten::addmm", 300_000, 100_000),  # inside aten::mm: not top-level
        cpu_op_event("aten::mm", 1_200_000, 1_000_000),
        cpu_op_event("gloo:all_reduce", 150_000, 3_000_000, cat="user_annotation", tid=77),
        cpu_op_event("aten::mm", 150_000, 100_000, tid=78),  # not the main thread
    ]
    k = _one(tmp_path, ev, device_properties=[], backend="gloo")
    assert k[["name", "kind", "stream"]].values.tolist() == [
        ["gloo:all_reduce", "comm", 77], ["aten::mm", "compute", 4242], ["aten::mm", "compute", 4242]]
    assert k["step"].tolist() == [0, 0, 0] and k["is_host"].all()


def test_device_and_stream_fall_back_to_pid_tid_and_numbers_as_strings(tmp_path):
    ev = [
        {"ph": "X", "cat": "kernel", "name": "a", "pid": 3, "tid": 11, "ts": 10.0, "dur": 2.0, "args": {"correlation": 1}},
        {"ph": "X", "cat": "kernel", "name": "b", "pid": 3, "tid": "stream 12", "ts": "20.5", "dur": 2.0,
         "args": {"correlation": "2", "stream": 12, "device": 3}},
        {"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "pid": "Spans", "tid": "PyTorch Profiler", "ts": 0.0, "dur": 99.0},
    ]
    k = _one(tmp_path, ev).set_index("name")
    assert k.loc["a", ["device", "stream"]].tolist() == [3, 11]
    assert k.loc["b", ["device", "stream", "correlation", "start_ns"]].tolist() == [3, 12, 2, 20_500]


KINDS_FOR_RULES = ("comm", "compute", "memory", "other")


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.one_of(st.none(), st.sampled_from(["ncclDevKernel_AllReduce", "NCCL_x", "sgemm", "gloo:all_reduce",
                                                  "c10d::allreduce_", "aten::mm", "ProfilerStep#3", "Memcpy HtoD",
                                                  "record_param_comms", "ovz_comm_ar", "rcclGeneric", ""])),
            st.one_of(st.none(), st.sampled_from(["kernel", "cpu_op", "user_annotation", "gpu_memcpy", "gpu_memset", "python_function"])),
        ),
        max_size=40,
    ),
    st.lists(st.tuples(st.sampled_from(KINDS_FOR_RULES), st.one_of(st.none(), st.sampled_from(["nccl", "^gloo:", "mm$", "Step#\\d"])),
                       st.lists(st.sampled_from(["kernel", "cpu_op", "user_annotation"]), max_size=2)), max_size=3),
)  # fmt: skip
def test_classify_equals_reading_the_rules_row_by_row(rows, extra):
    """Vectorized classification (each distinct pair once) against DESIGN.md's reading of the
    rules: the first rule whose case-insensitive regex and category list both match, else
    ``compute`` for GPU kernels and ``other`` for the rest."""
    import re

    from overlapviz.domain.rules import Rule, default_rules

    rules = default_rules().with_overrides([Rule(k, p, tuple(c)) for k, p, c in extra])
    names = [n for n, _ in rows]
    cats = [c for _, c in rows]

    def expected(name, cat):
        for r in rules.rules:
            if r.pattern is not None and (name is None or not re.search(r.pattern, name, re.IGNORECASE)):
                continue
            if r.categories and cat not in r.categories:
                continue
            return r.kind
        return "compute" if cat == "kernel" else "other"

    got = rules.classify(pa.array(names, pa.string()), pa.array(cats, pa.string())).to_pylist()
    assert got == [expected(n, c) for n, c in rows]


def test_deepep_kernels_are_communication_by_default():
    import pyarrow as pa

    from overlapviz.domain.rules import default_rules

    names = ["void dpsk::ep::internode::dispatch<false, 8, true, 8>(int4*)", "void deep_ep::intranode::combine<8>(int4*)",
             "void deep_ep::internode_ll::dispatch<3>(void*)", "void dpsk::ep::cuda::get_dispatch_layout<256, 32, 8>(long const*)",
             "sm90_xmma_gemm_bf16bf16"]  # fmt: skip
    kinds = default_rules().classify(pa.array(names), pa.array(["kernel"] * len(names))).to_pylist()
    assert kinds == ["comm", "comm", "comm", "compute", "compute"]  # the layout kernel computes, it moves nothing
