"""`overlapviz explain` (DESIGN.md "Why a collective started late") on constructed datasets whose causes are known, and on real H200 runs.

Constructed datasets are written through the real DatasetWriter (kernels and syncs tables),
so these tests hold the analysis to the contract whatever reader produced the tables; the
readers' sync records are tested in test_kineto_syncs.py, real traces in test_explain_real.py.
"""

from __future__ import annotations

from pathlib import Path

import orjson
import pandas as pd
import pytest
from click.testing import CliRunner

from overlapviz.analysis.explain import KEYS, LAUNCH_LATENCY_NS, explain, summarize
from overlapviz.analysis.peers import bus_factor, collective_instances
from overlapviz.cli import main
from overlapviz.testing import (
    H200_ROW,
    ROW_BASE_NS,
    ROW_TID,
    kernel_row,
    sync_row,
    write_rows_dataset,
)

DATA = Path(__file__).parent / "data"
BASE, TID = ROW_BASE_NS, ROW_TID
_k, _sync = kernel_row, sync_row


def _dataset(path, kernels, syncs=(), *, ranks=(0,), devices=True):
    return write_rows_dataset(path, kernels, syncs, ranks=ranks, devices=H200_ROW if devices else None)


COMM = dict(block=512, regs=32, smem=0, grid=8)
KERNELS = [
    # a GEMM filling the device: 4096 blocks, 4 resident per SM by registers (256 threads x 64 regs)
    _k("gemm", "compute", 7, 0, 100_000, launch=0, grid=4096, corr=1),
    _k("memcpy HtoD", "memory", 20, 0, 5_000, block=None, regs=None, grid=None, category="gpu_memcpy", corr=2),
    # launched at 2 µs, its stream busy until 5 µs, no block fits beside the GEMM: waits for it to drain
    _k("ncclDevKernel_A", "comm", 20, 40_000, 50_000, launch=2_000, corr=3, **COMM),
    # nothing resident: starts 500 ns after its launch
    _k("ncclDevKernel_C", "comm", 20, 150_500, 151_000, launch=150_000, corr=4, **COMM),
    # a partial grid: 44 blocks of 200 KB shared memory (1 per SM) hold 44 SMs; 88 are free
    _k("reduce_small_grid", "compute", 8, 200_000, 400_000, launch=199_000, grid=44, smem=200_000, corr=5),
    _k("ncclDevKernel_F", "comm", 20, 211_000, 212_000, launch=210_000, corr=6, **COMM),  # fits at once
    _k("ncclDevKernel_U", "comm", 20, 300_000, 301_000, launch=230_000, corr=7, **COMM),  # room, late: unknown
    # a GEMM in its last wave: 1066 blocks, 4 per SM -> 3 waves; at 80 % only 10 blocks (3 SMs) remain
    _k("gemm_tail", "compute", 7, 500_000, 600_000, launch=499_000, grid=1066, corr=8),
    _k("ncclDevKernel_T", "comm", 20, 581_000, 582_000, launch=580_000, corr=9, **COMM),
    # queued behind a long kernel on its own stream
    _k("long_on_comm_stream", "compute", 21, 700_000, 900_000, launch=699_000, grid=1, corr=10),
    _k("ncclDevKernel_S", "comm", 21, 901_000, 902_000, launch=701_000, corr=11, **COMM),
    # started exactly at its launch
    _k("ncclDevKernel_N", "comm", 22, 950_000, 951_000, launch=950_000, corr=12, **COMM),
]


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    return explain(_dataset(tmp_path_factory.mktemp("explain") / "ds", KERNELS)).set_index("name")


def test_keys_are_designs_and_times_are_exact_int64(plain):
    assert set(KEYS) <= set(plain.reset_index().columns)  # their order: test_cli_json_keys_and_formats
    a = plain.loc["ncclDevKernel_A"]
    assert a["start_ns"] == BASE + 40_000 and a["launch_ns"] == BASE + 2_000  # exact at epoch scale
    assert a["start_minus_launch_ns"] == 38_000 and a["stream_ready_ns"] == BASE + 5_000
    assert (a["ready_ns"], a["ready_from"], a["start_delay_us"]) == (BASE + 5_000, "stream", 35.0)
    assert (a["stream_wait_ns"], a["dependency_wait_ns"], a["ready_wait_ns"]) == (3_000, 0, 35_000)


def test_no_room_beside_a_full_grid_is_sm_resources_with_the_resource_and_blocker(plain):
    a = plain.loc["ncclDevKernel_A"]
    assert (a["cause"], a["blocking_resource"], a["blocker"]) == ("sm_resources", "registers", "gemm")
    assert (a["comm_blocks_fit_per_sm"], a["free_sms"], a["sms_with_room"]) == (0, 0, 0)


def test_a_partial_grid_leaves_free_sms_and_is_never_sm_resources(plain):
    f, u = plain.loc["ncclDevKernel_F"], plain.loc["ncclDevKernel_U"]
    assert (f["free_sms"], f["n_resident_compute"], f["resident_compute"]) == (88, 1, "reduce_small_grid")
    assert f["comm_blocks_fit_per_sm"] >= 1 and f["cause"] == "launch_latency"
    # room, yet 70 µs from launch to start: the model cannot say why, and says so
    assert u["free_sms"] == 88 and u["cause"] == "unknown" and pd.isna(u["blocker"])


def test_a_grid_in_its_last_wave_holds_only_the_sms_its_remaining_blocks_need(plain):
    t = plain.loc["ncclDevKernel_T"]
    assert t["free_sms"] == 132 - 3 and t["cause"] == "launch_latency"


def test_stream_order_none_and_launch_latency(plain):
    s, n, c = plain.loc["ncclDevKernel_S"], plain.loc["ncclDevKernel_N"], plain.loc["ncclDevKernel_C"]
    assert (s["cause"], s["ready_from"], s["stream_wait_ns"]) == ("stream_order", "stream", 199_000)
    assert n["cause"] == "none" and n["start_delay_us"] == 0.0
    assert c["cause"] == "launch_latency" and c["start_delay_us"] == 0.5 and c["free_sms"] == 132
    assert 500 <= LAUNCH_LATENCY_NS


# --- dependencies: the comm stream waits on an event recorded after a long gradient kernel ----------

DEP = [
    _k("grad_kernel", "compute", 7, 110_000, 300_000, launch=100_000, grid=4096, corr=900),
    _k("ncclDevKernel_AllReduce", "comm", 20, 305_000, 306_000, launch=103_000, corr=903, **COMM),
]
RECORD = _sync("event_record", 101_000, corr=901)
WAIT = _sync("stream_wait_event", 102_000, corr=902)


def _one(tmp_path, syncs, kernels=DEP):
    return explain(_dataset(tmp_path / "ds", kernels, syncs)).set_index("name").loc["ncclDevKernel_AllReduce"]


def test_dependency_inferred_from_host_order(tmp_path):
    c = _one(tmp_path, [RECORD, WAIT])
    assert (c["dependency_ready_ns"], c["dependency_source"], c["producer"]) == (BASE + 300_000, "inferred", "grad_kernel")
    assert (c["ready_from"], c["cause"], c["start_delay_us"]) == ("dependency", "dependency", 5.0)
    assert c["dependency_wait_ns"] == 197_000 and c["start_minus_launch_ns"] == 202_000
    assert pd.isna(c["blocking_resource"])  # the GEMM's registers are not blamed for a dependency


def test_dependency_named_by_the_cuda_sync_record(tmp_path):
    sync = _sync("stream_wait_event", 102_000, source="cuda_sync", corr=902, stream=20, wait_on_stream=7, record=901)
    c = _one(tmp_path, [RECORD, WAIT, sync])
    assert (c["dependency_source"], c["cause"], c["producer_correlation"]) == ("cuda_sync", "dependency", 900)


def test_cuda_sync_fields_at_minus_one_do_not_count(tmp_path):
    # torch 2.11 / CUDA 13 on an H200: the record names the waiting stream, not the recording one
    sync = _sync("stream_wait_event", 102_000, source="cuda_sync", corr=902, stream=20)
    c = _one(tmp_path, [RECORD, WAIT, sync])
    assert (c["dependency_source"], c["cause"]) == ("inferred", "dependency")


def test_the_sync_record_decides_the_recording_stream_against_host_order(tmp_path):
    # the host's last launch before the record was on stream 9 (a short kernel), but the record
    # names stream 7: the producer is the gradient kernel
    kernels = DEP + [_k("short_other", "compute", 9, 100_600, 100_700, launch=100_500, grid=1, corr=950)]
    inferred = _one(tmp_path / "a", [RECORD, WAIT], kernels)
    assert inferred["producer"] == "short_other" and inferred["cause"] != "dependency"
    sync = _sync("stream_wait_event", 102_000, source="cuda_sync", corr=902, stream=20, wait_on_stream=7)
    named = _one(tmp_path / "b", [RECORD, WAIT, sync], kernels)
    assert (named["producer"], named["cause"], named["dependency_source"]) == ("grad_kernel", "dependency", "cuda_sync")


def test_a_wait_gates_only_the_next_launch_on_its_stream(tmp_path):
    later = _k("ncclDevKernel_Later", "comm", 20, 400_000, 401_000, launch=399_000, corr=904, **COMM)
    d = explain(_dataset(tmp_path / "ds", DEP + [later], [RECORD, WAIT])).set_index("name")
    assert d.loc["ncclDevKernel_AllReduce", "cause"] == "dependency"
    assert pd.isna(d.loc["ncclDevKernel_Later", "dependency_ready_ns"])


def test_an_inferred_link_the_trace_contradicts_is_dropped(tmp_path):
    # the guessed producer ends after the collective started: the GPU would not have let it start
    early = [DEP[0], _k("ncclDevKernel_AllReduce", "comm", 20, 120_000, 121_000, launch=103_000, corr=903, **COMM)]
    c = _one(tmp_path, [RECORD, WAIT], early)
    assert pd.isna(c["dependency_ready_ns"]) and c["cause"] != "dependency"


def test_no_wait_no_dependency(tmp_path):
    c = _one(tmp_path, [RECORD])
    assert pd.isna(c["dependency_ready_ns"]) and pd.isna(c["dependency_source"])


# --- peers ------------------------------------------------------------------------------------------


def test_peer_wait_by_group_and_sequence_then_by_position(tmp_path):
    ks = []
    for rank, start in ((0, 10_000), (1, 25_000)):
        ks.append(_k("ncclDevKernel_AllReduce", "comm", 20, start, 40_000, launch=start - 1_000, corr=1, rank=rank,
                     comm_group="0", comm_seq=5, collective="all_reduce", **COMM))  # fmt: skip
        ks.append(_k("ncclDevKernel_AllGather", "comm", 20, 50_000 + rank * 7_000, 60_000, launch=45_000, corr=2, rank=rank,
                     collective="all_gather", **COMM))  # fmt: skip
    d = explain(_dataset(tmp_path / "ds", ks, ranks=(0, 1)))
    ar = d[d["name"] == "ncclDevKernel_AllReduce"].set_index("rank")
    assert (ar.loc[0, "peer_wait_us"], ar.loc[1, "peer_wait_us"]) == (15.0, 0.0)
    assert ar.loc[0, "instance"] == ar.loc[1, "instance"] == "seq:0#5"
    ag = d[d["name"] == "ncclDevKernel_AllGather"].set_index("rank")
    assert (ag.loc[0, "peer_wait_us"], ag.loc[1, "peer_wait_us"]) == (7.0, 0.0)
    inst = collective_instances(d, message_bytes=pd.Series(1_000_000, index=d.index)).set_index("instance")
    row = inst.loc["seq:0#5"]
    assert (row["n_ranks"], row["slowest_rank"], row["arrival_skew_us"]) == (2, 1, 15.0)
    assert row["time_us"] == 15.0 and row["algbw_gbps"] == pytest.approx(1_000_000 / 15_000)
    assert row["busbw_gbps"] == pytest.approx(row["algbw_gbps"] * bus_factor("all_reduce", 2))
    s = summarize(d).set_index("rank")
    assert s.loc[0, "peer_wait_us"] == 22.0 and s.loc[1, "peer_wait_us"] == 0.0


def test_bus_factors_follow_nccl_tests():
    assert bus_factor("all_reduce", 8) == 2 * 7 / 8
    assert bus_factor("all_gather", 8) == bus_factor("reduce_scatter", 8) == bus_factor("all_to_all", 8) == 7 / 8
    assert bus_factor("broadcast", 8) == 1.0 and bus_factor("mystery", 8) is None


# --- unknowns are said, not guessed ------------------------------------------------------------------


def test_missing_limits_or_shapes_give_no_sm_claim(tmp_path):
    kernels = [_k("gemm", "compute", 7, 0, 100_000, launch=0, regs=None, grid=4096),
               _k("nccl_x", "comm", 20, 60_000, 61_000, launch=1_000, **COMM)]  # fmt: skip
    d = explain(_dataset(tmp_path / "a", kernels)).iloc[0]
    assert pd.isna(d["comm_blocks_fit_per_sm"]) and "gemm" in d["residency_note"] and d["cause"] == "unknown"
    nodev = explain(_dataset(tmp_path / "b", kernels, devices=False)).iloc[0]
    assert pd.isna(nodev["comm_blocks_fit_per_sm"]) and nodev["cause"] == "unknown"


def _union_ns(pairs) -> int:
    """Length of the union of [lo, hi) pairs, by a plain sweep (independent of overlapviz.intervals)."""
    total, reach = 0, None
    for lo, hi in sorted(p for p in pairs if p[1] > p[0]):
        if reach is None or lo >= reach:
            total += hi - lo
            reach = hi
        elif hi > reach:
            total += hi - reach
            reach = hi
    return total


def test_summary_is_rank_time_by_cause_and_kernel_time_beside(plain):
    s = summarize(plain.reset_index()).iloc[0]
    d = plain.reset_index()
    for cause in ("sm_resources", "stream_order", "launch_latency", "unknown"):
        mine = d.loc[d["cause"] == cause]
        want_kernel = mine["start_minus_launch_ns"].astype("Int64").sum() / 1000
        assert s[f"{cause}_kernel_us"] == pytest.approx(want_kernel), cause
        if cause == "stream_order":
            pairs = [(int(r.launch_ns), max(int(r.launch_ns), int(r.stream_ready_ns))) for r in mine.itertuples()]
        else:
            pairs = [(int(r.ready_ns), int(r.start_ns)) for r in mine.itertuples()]
        assert s[f"{cause}_us"] == _union_ns(pairs) / 1000, cause
        assert s[f"{cause}_us"] <= s[f"{cause}_kernel_us"] + 1e-9
    assert s["n_comm_kernels"] == len(d) and s["n_blocked"] == 1 and s["top_blockers"] == "gemm (1)"


def test_summary_never_exceeds_the_time_it_describes(tmp_path):
    # ten collectives on ten streams, all launched at once behind one busy stream each: their
    # waits overlap, so the kernel-time sum is ten times the rank time
    kernels = []
    for i in range(10):
        kernels.append(_k(f"gemm{i}", "compute", 100 + i, 0, 500_000, launch=0, grid=1))
        kernels.append(_k("nccl_x", "comm", 100 + i, 500_000, 501_000, launch=1_000, **COMM))
    s = summarize(explain(_dataset(tmp_path / "ds", kernels))).iloc[0]
    assert s["stream_order_kernel_us"] == pytest.approx(10 * 499.0)
    assert s["stream_order_us"] == pytest.approx(499.0)


def test_cli_json_keys_and_formats(tmp_path):
    ds = _dataset(tmp_path / "ds", DEP, [RECORD, WAIT])
    runner = CliRunner()
    res = runner.invoke(main, ["explain", str(ds), "--format", "json"])
    assert res.exit_code == 0, res.output
    (rec,) = orjson.loads(res.output)
    assert list(rec)[: len(KEYS)] == KEYS
    assert rec["start_ns"] == BASE + 305_000 and isinstance(rec["ready_ns"], int) and rec["cause"] == "dependency"
    res = runner.invoke(main, ["explain", str(ds), "--summary", "--format", "csv"])
    assert res.exit_code == 0 and res.output.splitlines()[0].startswith("run_id,rank,n_comm_kernels")
    assert "dependency_us" in res.output.splitlines()[0]
    res = runner.invoke(main, ["explain", str(ds)])
    assert res.exit_code == 0 and "dependency" in res.output
    # residency --delays is the same implementation
    res = runner.invoke(main, ["residency", str(ds), "--delays", "--format", "json"])
    assert orjson.loads(res.output)[0]["cause"] == "dependency"
    bad = runner.invoke(main, ["explain", str(tmp_path / "nope")])
    assert bad.exit_code == 1 and "no such file or directory" in bad.output


# --- real H200 runs of the collector (tests/data/h200_carveout_check) -------------------------------

CARVE = DATA / "h200_carveout_check"
PAD112K_DEFAULT, PAD112K_100 = "cb-ar_optimized_tiled64x64x32-pad112k_phigh_standin_ca2155fe", "cb-ar_optimized_tiled64x64x32-pad112k_phigh_standin_41a177af"


@pytest.fixture(scope="module")
def carve(tmp_path_factory):
    from overlapviz.ingest import ingest

    return explain(ingest([CARVE / "runs"], tmp_path_factory.mktemp("carve") / "ds", progress=False))


def test_h200_default_carveout_keeps_the_comm_block_out(carve):
    """At 1 GEMM block per SM (132096 B) the stand-in fits by registers, but with no carve-out preference
    the driver gave the SM the 132 KB step: no room. Measured: ~148 µs of waiting against ~9 µs."""
    d = carve.groupby("run_id")
    default, forced = d.get_group(PAD112K_DEFAULT), d.get_group(PAD112K_100)
    assert (default["cause"] == "sm_resources").all() and (default["blocking_resource"] == "shared_memory_carveout").all()
    assert default["blocker"].str.startswith("ovz_gemm").all()
    assert (forced["cause"] == "launch_latency").all() and (forced["comm_blocks_fit_per_sm"] >= 1).all()
    assert default["start_delay_us"].median() > 80 and forced["start_delay_us"].median() < 15


def test_h200_sequential_runs_wait_on_their_stream(carve):
    seq = carve[carve["run_id"].str.contains("sequential")]
    assert len(seq) == 3 and (seq["cause"] == "stream_order").all() and (seq["free_sms"] == 132).all()


def test_every_output_column_is_documented(plain):
    doc = (Path(__file__).parent.parent / "docs" / "explain.md").read_text()
    d = plain.reset_index()
    frames = [d, summarize(d), collective_instances(d)]
    missing = sorted({c for f in frames for c in f.columns if f"`{c}`" not in doc})
    assert not missing, missing


def test_host_synchronization_before_the_launch_is_reported(tmp_path):
    # the host blocked 80 µs in cudaStreamSynchronize between its previous launch and the collective's
    sync = _sync("stream_sync", 104_000) | {"end_ns": BASE + 184_000, "name": "cudaStreamSynchronize"}
    kernels = [DEP[0], _k("ncclDevKernel_AllReduce", "comm", 20, 305_000, 306_000, launch=190_000, corr=903, **COMM)]
    c = _one(tmp_path, [sync], kernels)
    assert (c["host_wait_ns"], c["host_wait_call"]) == (80_000, "cudaStreamSynchronize")
    other_thread = _sync("stream_sync", 104_000, tid=TID + 1) | {"end_ns": BASE + 184_000}
    c = _one(tmp_path / "b", [other_thread], kernels)
    assert c["host_wait_ns"] == 0 and pd.isna(c["host_wait_call"])


def test_device_name_fills_traces_that_do_not_say_which_gpu(tmp_path):
    ds = _dataset(tmp_path / "ds", KERNELS[:3], devices=False)
    plain = explain(ds).set_index("name").loc["ncclDevKernel_A"]
    assert pd.isna(plain["comm_blocks_fit_per_sm"]) and "--device-name" in plain["residency_note"]
    given = explain(ds, device="NVIDIA H200").set_index("name").loc["ncclDevKernel_A"]
    assert (given["cause"], given["blocking_resource"], given["num_sms"]) == ("sm_resources", "registers", 132)
    # an architecture alone has no SM count: occupancy per SM, but no claim about the grid's SMs
    arch = explain(ds, device="sm_90").set_index("name").loc["ncclDevKernel_A"]
    assert arch["cause"] != "sm_resources" and "SM count" in arch["residency_note"]
    res = CliRunner().invoke(main, ["residency", str(ds), "--device-name", "sm_90", "--format", "json"])
    assert res.exit_code == 0 and {r["blocks_per_sm"] for r in orjson.loads(res.output) if r["name"] == "gemm"} == {4}
    bad = CliRunner().invoke(main, ["explain", str(ds), "--device-name", "no such gpu"])
    assert bad.exit_code == 1 and "--device-name 'no such gpu'" in bad.output
    # export: the budget figure and the Perfetto trace's findings of the named GPU (without it: no budget, no fit)
    out = tmp_path / "budget.html"
    assert CliRunner().invoke(main, ["export", str(ds), "--figure", "budget", "-o", str(out)]).exit_code == 1
    res = CliRunner().invoke(main, ["export", str(ds), "--figure", "budget", "--device-name", "NVIDIA H200", "-o", str(out)])
    assert res.exit_code == 0 and "0 comm blocks fit" in out.read_text(), res.output
    fits = {}
    for args in ([], ["--device-name", "NVIDIA H200"]):
        trace = tmp_path / f"t{len(args)}.json"
        assert CliRunner().invoke(main, ["export", str(ds), "--format", "perfetto", *args, "-o", str(trace)]).exit_code == 0
        waits = [e for e in orjson.loads(trace.read_bytes())["traceEvents"] if e.get("name") == "wait: sm_resources"]
        fits[len(args)] = [e["args"]["comm_blocks_fit_per_sm"] for e in waits]
    assert fits[0] == [] and fits[2] == [0]
    bad = CliRunner().invoke(main, ["export", str(ds), "--figure", "budget", "--device-name", "no such gpu", "-o", str(out)])
    assert bad.exit_code == 1 and "--device-name 'no such gpu'" in bad.output
    # --arch is the same option under the name advise uses
    for cmd in ("residency", "explain"):
        by_arch = CliRunner().invoke(main, [cmd, str(ds), "--arch", "sm_90", "--format", "json"])
        by_name = CliRunner().invoke(main, [cmd, str(ds), "--device-name", "sm_90", "--format", "json"])
        assert by_arch.exit_code == 0 and by_arch.output == by_name.output, cmd
