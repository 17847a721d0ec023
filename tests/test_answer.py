"""The answer stated: the breakdown of exposed communication, the findings, and how explain prints them.

Edge cases: the four parts add up exactly; a rank that arrived last is the straggler, never one that
waited; clocks that do not compare give no peer wait; a start delay hidden by overlap says so;
--summary never reports more than the trace lasted (test_explain); every finding's time is a union
per rank (no instant counted twice).
"""

from __future__ import annotations

import orjson
import pandas as pd
import pyarrow as pa
import pytest
from click.testing import CliRunner

from overlapviz import testing
from overlapviz.dataset import schema
from overlapviz.analysis import breakdown as bd
from overlapviz.analysis.findings import KINDS, findings
from overlapviz.analysis.metrics import analyze
from overlapviz.cli import main
from overlapviz.ingest import ingest

DATA = testing.Path(__file__).parent / "data"
PARTS = ["peer_wait_ns", "dependent_ns", "host_idle_ns", "exposed_other_ns"]


@pytest.fixture(scope="module")
def scenario(tmp_path_factory):
    return testing.breakdown_scenario(tmp_path_factory.mktemp("answer") / "ds")


@pytest.fixture(scope="module")
def dlrm(tmp_path_factory):
    return ingest([DATA / "kineto_real" / "param_dlrm_8rank"], tmp_path_factory.mktemp("dlrm") / "ds", progress=False)


def test_breakdown_known_by_construction(scenario):
    b = bd.breakdown(scenario).set_index("rank")
    for rank, (comm, exposed, peer, dep, idle, other) in testing.BREAKDOWN_EXPECTED.items():
        row = b.loc[rank]
        assert (row["comm_ns"], row["exposed_ns"]) == (comm, exposed), rank
        assert [row[c] for c in PARTS] == [peer, dep, idle, other], rank
        assert row["overlapped_ns"] == comm - exposed and bool(row["peers_known"])
    assert all(b[c].dtype == "int64" for c in PARTS + ["comm_ns", "exposed_ns", "overlapped_ns"])


def test_breakdown_equals_analyze_and_parts_add_up(dlrm, scenario):
    for ds in (dlrm, scenario):
        for per in ("rank", "step"):
            b = bd.breakdown(ds, per=per)
            a = analyze(ds, per=per)
            keys = ["run_id", "rank"] + (["step"] if per == "step" else [])
            m = b.merge(a, on=keys, validate="one_to_one")
            assert len(m) == len(a) == len(b) and (len(m) or (per == "step" and ds == scenario))
            assert (m["exposed_ns"] == (m["exposed_comm_us"] * 1000).round().astype("int64")).all()
            assert (m["comm_ns"] == (m["comm_us"] * 1000).round().astype("int64")).all()
            assert (b[PARTS].sum(axis=1) == b["exposed_ns"]).all()
            assert (b[PARTS] >= 0).all().all()


def test_breakdown_does_not_depend_on_row_order(scenario, tmp_path):
    k = schema.read_kernels(scenario)
    shuffled = k.take(pa.array(list(range(k.num_rows))[::-1]))
    syncs = schema.read_table(scenario, "syncs")
    with schema.DatasetWriter(tmp_path / "rev") as w:
        w.add("runs", schema.read_table(scenario, "runs"))
        w.add("devices", schema.read_table(scenario, "devices"))
        w.add("syncs", syncs)
        for rank in (1, 0):
            mine = shuffled.filter(pa.compute.equal(shuffled.column("rank"), rank))
            w.add_kernels(mine, "scenario", rank)
        w.commit()
    pd.testing.assert_frame_equal(bd.breakdown(tmp_path / "rev"), bd.breakdown(scenario))


def test_dlrm_rank_seven_is_the_straggler_and_waiting_ranks_are_not(dlrm):
    f = findings(dlrm)
    top = f.iloc[0]
    assert top["kind"] == "straggler" and top["ranks"] == [7]
    assert "started 5 of 8 collective instances last" in top["text"]
    stragglers = f.loc[f["kind"] == "straggler"]
    assert set(r for rs in stragglers["ranks"] for r in rs) == {7, 5, 4}  # ranks 1 and 3 only waited
    b = bd.breakdown(dlrm)
    assert stragglers["time_ns"].sum() == b["peer_wait_ns"].sum()  # every exposed wait belongs to one straggler
    assert list(f["time_ns"]) == sorted(f["time_ns"], reverse=True)
    assert set(f["kind"]) <= set(KINDS)
    share = f.loc[0, "share"]
    assert share == pytest.approx(top["time_ns"] / b["exposed_ns"].sum())


def test_a_finding_never_counts_an_instant_of_a_rank_twice(scenario):
    f = findings(scenario).set_index("kind")
    b = bd.breakdown(scenario)
    assert f.loc["dependent", "time_ns"] == b["dependent_ns"].sum() == 10_000
    assert f.loc["host_idle", "time_ns"] == b["host_idle_ns"].sum() == 6_000
    # rank 0 waited 6 µs for rank 1 at instance 0; rank 1 waited for nobody
    assert f.loc["straggler", "ranks"] == [1] and f.loc["straggler", "time_ns"] == 6_000
    assert f.loc["straggler", "waiting_ranks"] == [0]
    ev = f.loc["dependent", "evidence"][0]
    assert ev["kernel"] == "gemm_b" and ev["waited_on"] == "ncclDevKernel_AllReduce" and ev["time_ns"] == 10_000


def test_clocks_that_do_not_compare_give_no_peer_wait(scenario, tmp_path):
    ds = tmp_path / "two_hosts"
    k = schema.read_kernels(scenario)
    with schema.DatasetWriter(ds) as w:
        for name in ("runs", "devices", "syncs"):
            w.add(name, schema.read_table(scenario, name))
        w.add("ranks", pa.table({"run_id": ["scenario"] * 2, "rank": pa.array([0, 1], pa.int32()), "host": ["node-a", "node-b"]}))
        for rank in (0, 1):
            w.add_kernels(k.filter(pa.compute.equal(k.column("rank"), rank)), "scenario", rank)
        w.commit()
    b = bd.breakdown(ds).set_index("rank")
    assert (b["peer_wait_ns"] == 0).all() and not b["peers_known"].any()
    assert b["clock_note"].str.contains("not comparable").all()
    assert (b[PARTS].sum(axis=1) == b["exposed_ns"]).all()
    assert "straggler" not in set(findings(ds)["kind"])
    res = CliRunner().invoke(main, ["explain", str(ds), "--instances", "--format", "json"])
    assert res.exit_code == 0, res.output
    for rec in orjson.loads(res.output):
        assert rec["arrival_skew_us"] is None and rec["straggler"] is None and "clocks" in rec["clock_note"]
    res = CliRunner().invoke(main, ["explain", str(ds), "--format", "json"])
    assert all(r["peer_wait_us"] is None for r in orjson.loads(res.output))


def test_cli_prints_the_answer_first_and_records_as_documented(dlrm):
    runner = CliRunner()
    out = runner.invoke(main, ["explain", str(dlrm)])
    assert out.exit_code == 0, out.output
    lines = out.output.splitlines()
    assert lines[0] == "run param_dlrm_8rank" and lines[1].startswith("  Communication 48.5 ms over 8 ranks")
    assert "peer wait 45.3 ms" in out.output and "1. [straggler] Rank 7 started 5 of 8" in out.output
    assert out.output.index("[straggler]") < out.output.index("launch_to_start_us")
    rec = orjson.loads(runner.invoke(main, ["explain", str(dlrm), "--findings", "--format", "json"]).output)
    assert {"run_id", "kind", "time_ns", "ranks", "evidence", "action", "text"} <= set(rec[0])
    assert rec[0]["evidence"][0]["instance"] and isinstance(rec[0]["time_ns"], int)
    rows = orjson.loads(runner.invoke(main, ["explain", str(dlrm), "--breakdown", "--per", "step", "--format", "json"]).output)
    assert {"run_id", "rank", "step", "comm_ns", "overlapped_ns", "exposed_ns", *PARTS} <= set(rows[0])
    assert all(sum(r[c] for c in PARTS) == r["exposed_ns"] for r in rows)
    bad = runner.invoke(main, ["explain", str(dlrm), "--findings", "--breakdown"])
    assert bad.exit_code == 2 and "pick one" in bad.output
    bad = runner.invoke(main, ["explain", str(dlrm), "--per", "step"])
    assert bad.exit_code == 2 and "--breakdown" in bad.output


def test_sweep_baseline_is_held_off_the_sms_and_cites_the_measured_priority(tmp_path):
    ds = ingest([testing.Path(__file__).parent.parent / "sample_traces" / "h200_standin_sweep"], tmp_path / "ds", progress=False)
    runs = schema.read_frame(ds, "runs")
    base = runs.loc[(runs["setup"] == "baseline") & (runs["smem_pad_bytes"] == 0) & (runs["compute_impl"] == "tiled"), "run_id"].iloc[0]
    f = findings(ds, run_ids=[base])
    top = f.iloc[0]
    assert top["kind"] == "sm_resources" and "ovz_gemm_tiled_64x64x32" in top["text"] and "registers" in top["text"]
    assert "priority" in top["action"] and "Measured in this dataset" in top["action"] and "faster" in top["action"]
    best = runs.loc[(runs["setup"] == "optimized") & (runs["compute_impl"] == "tiled"), "run_id"]
    opt = findings(ds, run_ids=list(best))
    hidden = opt.loc[opt["kind"] == "sm_resources"]
    assert hidden["text"].str.contains("Overlap hid it").any()  # late starts that cost no exposed time say so


def test_compare_says_what_changed_between_two_runs(tmp_path):
    ds = ingest([testing.Path(__file__).parent.parent / "sample_traces" / "h200_standin_sweep"], tmp_path / "ds", progress=False)
    runs = schema.read_frame(ds, "runs")
    tiled = runs.loc[(runs["compute_impl"] == "tiled") & (runs["smem_pad_bytes"] == 0)]
    a = tiled.loc[tiled["setup"] == "baseline", "run_id"].iloc[0]
    b = tiled.loc[(tiled["setup"] == "optimized"), "run_id"].iloc[0]
    res = CliRunner().invoke(main, ["compare", str(ds), a, b, "--format", "json"])
    assert res.exit_code == 0, res.output
    rows = {(r["section"], r["item"]): r for r in orjson.loads(res.output)}
    exp = rows[("breakdown", "exposed_ns")]
    want = bd.breakdown(ds, run_ids=[a, b]).groupby("run_id")["exposed_ns"].sum()
    assert (exp["a"], exp["b"]) == (int(want[a]), int(want[b])) and exp["delta"] == exp["b"] - exp["a"]
    assert isinstance(exp["a"], int) and ("finding", "sm_resources_ns") in rows
    table = CliRunner().invoke(main, ["compare", str(ds), a, b]).output
    assert "Why: B exposes" in table and "less communication than A" in table


def test_a_long_launch_call_is_its_own_cause_and_an_ordinary_one_is_not(tmp_path):
    """A 10 ms window of a real Nsight Systems export (FastVideo, 2 x H100) whose cudaLaunchKernel of an
    elementwise kernel ran 1,502,826 ns (60363819339 -> 60365322165; the kernel started at 60365249411,
    72.8 µs before the call returned): launch_call, 1,430,072 ns inside the call, nothing left after it.
    Every other launch call of the window lasts under 50 µs but four: none of the others is launch_call."""
    from overlapviz.analysis.explain import explain

    ds = ingest([DATA / "nsys" / "mfu_2gpu_before_window10ms_slow_launch.sqlite"], tmp_path / "ds", progress=False)
    e = explain(ds, kinds=("comm", "compute", "memory", "other"))
    slow = e.loc[(e["rank"] == 0) & (e["start_ns"] == 60365249411)].iloc[0]
    assert slow["cause"] == "launch_call" and slow["launch_call_ns"] == 1_430_072
    assert (e.loc[e["cause"] == "launch_call", "launch_call_ns"] > 50_000).all()
    ordinary = e.loc[e["launch_call_ns"].notna() & (e["launch_call_ns"] == 0)]
    assert len(ordinary) > 100 and (ordinary["cause"] != "launch_call").all()
