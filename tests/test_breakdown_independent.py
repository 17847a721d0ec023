"""``breakdown()`` against an independent implementation of its contract, and its properties.

``tests/_independent_breakdown.py`` implements DESIGN.md "Where communication time went" by brute
force over elementary segments of the dataset's ``kernels``/``syncs`` rows, without
``overlapviz.analysis``. Here it is compared with :func:`overlapviz.analysis.breakdown.breakdown`
for exact int64 equality per rank on every real trace of the answer checks and every test dataset
(``slow``), and on datasets built by :func:`build_ranks`, a builder of multi-rank traces with known
peer wait, dependent and host-idle time (Hypothesis).

Where the two readings differed, the independent one was wrong, and is fixed with the reason
written where it applies: a stream wait linked by host order (HTA's NCCL trace: no ``cuda_sync``
records) whose gated kernel starts before the producer ends cannot have gated it; 4.9 ms of
"dependent" there came from such links.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from _independent_breakdown import PARTS, instance_starts, run_breakdown
from overlapviz.dataset import schema
from overlapviz.analysis.breakdown import breakdown
from overlapviz.analysis.metrics import analyze
from overlapviz.testing import H200_ROW, ingest_cli, kernel_row

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"
REFERENCE = Path(os.environ.get("OVERLAPVIZ_REFERENCE_TRACES", "/work/shared/reference_traces"))
COLS = ["run_id", "rank", "kind", "stream", "name", "start_ns", "end_ns", "launch_ns", "launch_tid", "collective",
        "comm_group", "comm_seq", "step"]


def independent(ds, per: str = "rank") -> dict[tuple, dict]:
    kernels = schema.read_kernels(ds, columns=COLS).to_pylist()
    syncs = schema.read_table(ds, "syncs").to_pylist()
    peers = {(r["run_id"], r["rank"]): bool(r["peers_known"]) for r in breakdown(ds).to_dict("records")}
    out = {}
    for run in sorted({k["run_id"] for k in kernels}):
        ks = [k for k in kernels if k["run_id"] == run]
        # peer wait only where the ranks' clocks compare (the dataset's clock domains say so)
        known = any(v for (r, _), v in peers.items() if r == run)
        for key, rec in run_breakdown(ks, [s for s in syncs if s["run_id"] == run], peers=known, per=per).items():
            out[(run, *key) if per == "step" else (run, key)] = rec
    return out


def check_exact(ds) -> int:
    """breakdown() == the independent breakdown per rank and per step; the parts add up; exposed and
    comm == analyze's."""
    got = breakdown(ds)
    mine = independent(ds)
    assert set(mine) == {(r, k) for r, k in zip(got.run_id, got["rank"])}
    a = analyze(ds).set_index(["run_id", "rank"])
    for rec in got.to_dict("records"):
        key = (rec["run_id"], rec["rank"])
        want = mine[key]
        have = {c: int(rec[c]) for c in want}
        assert have == want, (key, have, want)
        assert sum(have[p] for p in PARTS) == have["exposed_ns"]
        assert have["exposed_ns"] / 1000 == a.loc[key, "exposed_comm_us"]
        assert have["comm_ns"] / 1000 == a.loc[key, "comm_us"]
    # per step: the step's own exposed time, the rank's labels
    steps = breakdown(ds, per="step")
    got_steps = {(r["run_id"], r["rank"], r["step"]): {c: int(r[c]) for c in ("comm_ns", "overlapped_ns", "exposed_ns", *PARTS)}
                 for r in steps.to_dict("records")}
    assert got_steps == independent(ds, per="step")
    return len(got)


REAL = {
    "dlrm_8rank": [DATA / "kineto_real" / "param_dlrm_8rank"],
    "hta_trace_filter_2rank": [DATA / "hta_trace_filter_2rank"],
    "hta_nccl": [DATA / "hta_nccl_parser_config" / "nccl_data.json.gz"],
    "deepseek_v3": [DATA / "kineto_real" / "deepseek_v3_train" / "train.json.gz"],
    "b200_eager": [DATA / "kineto_real" / "tracelens_b200_eager" / "eager_trace.json.gz"],
    "mi300_ddp": [DATA / "kineto_real" / "tracelens_mi300_ddp_resnet18" / "train_resnet18.json.gz"],
    "mi250": [DATA / "kineto_real" / "hta_mi250_rocm62" / "mi250_minitoy_train_ROCm6_2_kineto.json.gz"],
    "rocm_resnet_ac": [DATA / "torch_rocm" / "resnet_act_checkpoint.json.gz"],
    "rocm_bert": [DATA / "torch_rocm" / "gaunernst_bert-small-uncased__1016001.json.gz"],
    "rocm_gpu_only": [DATA / "torch_rocm" / "gpu_only_trace.json.gz"],
    "sdma_cu": [DATA / "torch_rocm" / "sdma_rccl_mi300x_ffn_down" / "ag_gemm_llama70b_ffn_down_cu_rank0.json"],
    "sdma_sdma": [DATA / "torch_rocm" / "sdma_rccl_mi300x_ffn_down" / "ag_gemm_llama70b_ffn_down_sdma_rank0.json"],
    "nsys_fastvideo_window": [DATA / "nsys" / "mfu_2gpu_before_window40ms.sqlite"],
    "rocprofv3_mi350x": [DATA / "rocprof" / "v3" / "tracelens_mi350x_json" / "908_results.json.gz"],
    "h200_standin_sweep": [ROOT / "sample_traces" / "h200_standin_sweep"],
    "h200_paper_grid": [ROOT / "sample_traces" / "h200_paper_grid"],
    "scenarios": [ROOT / "sample_traces" / "scenarios"],
    "alexnet_cuda_sync": [DATA / "kineto_real" / "hta_alexnet_cuda_sync"],
    "event_sync_multistream": [DATA / "kineto_real" / "hta_event_sync_multistream"],
    "hostile_event_sync": [DATA / "hostile" / "event_sync_trace.json.gz"],
    "gloo_cpu": [DATA / "gloo_cpu"],
    "h200_carveout_check": [DATA / "h200_carveout_check"],
    "h200_transformer_stack": [DATA / "h200_transformer_stack" / "transformer_stack.json.gz"],
    "occupancy_h200": [DATA / "occupancy_h200" / "h200_torch_trace.json.gz"],
    "rocprof_v1_kokkos": [DATA / "rocprof" / "v1" / "kokkos_gfx906_hiptrace" / "results.json"],
    "rocprof_v1_llamacpp": [DATA / "rocprof" / "v1" / "llamacpp_gfx1201_stats" / "results.csv"],
    "rocprof_v3_docs": [DATA / "rocprof" / "v3" / "rocprofiler_sdk_docs_data"],
    "nsys_mock": [DATA / "nsys" / "mock.sqlite"],
    "nsys_saxpy": [DATA / "nsys" / "saxpy-mpi-cuda_nsys_perlmutter0.sqlite"],
    # too big to copy (> 2 MB): read from the reference set where it exists
    "nsys_fastvideo_before": [REFERENCE / "nsys" / "nsysai_mfu_2gpu" / "mfu_2gpu_before.sqlite"],
    "nsys_fastvideo_after": [REFERENCE / "nsys" / "nsysai_mfu_2gpu" / "mfu_2gpu_after.sqlite"],
}


@pytest.mark.slow
@pytest.mark.corpus
@pytest.mark.parametrize("name", sorted(REAL))
def test_breakdown_equals_independent_on_real_traces(tmp_path, name):
    sources = REAL[name]
    if not all(p.exists() for p in sources):
        pytest.skip(f"{sources[0]} not here")
    ds, _ = ingest_cli(tmp_path, *sources)
    assert check_exact(ds) >= 1


# --- a builder of multi-rank traces with known parts ---------------------------------------------

COMM_STREAM, COMP_STREAM = 9, 7
SPACING = 100_000  # ns between instances; every instance's activities fit in 60 µs of it
COMM_END = 40_000  # every rank's collective ends together, 40 µs into its slot


def build_ranks(path, plan: list[dict], *, ranks: int, host: str | None = "node0", shuffle: int | None = None):
    """A dataset of run ``r`` whose breakdown is known by construction, and that breakdown.

    ``plan`` has one dict per collective instance ``i`` (slot ``T = i * SPACING``): ``arrive[r]``,
    rank r's start offset in [0, 20 µs]; ``busy[r]``, the length of rank r's computation kernel
    starting at ``T`` on stream 7 (0: none); ``mode``: what follows the collective (ending at
    ``T + 40 µs`` on every rank), a computation kernel 1-5 µs later that is ``dependent`` (on the
    collective's stream 9), ``host_idle`` (stream 7, launched when the collective ends) or
    ``other`` (stream 7, launched before the collective). Every rank's exposed time in slot ``T`` is
    ``[max(own start, end of computation), T + 40 µs)``; the part before the latest start is peer
    wait, the rest goes to ``mode``. ``host`` names one host for every rank (comparable clocks),
    None writes no ranks table. ``shuffle`` seeds a shuffle of each rank's rows.
    Returns ``(path, {rank: {comm_ns, overlapped_ns, exposed_ns, *PARTS}})``."""
    rows, expect = [], {r: dict.fromkeys(("comm_ns", "overlapped_ns", "exposed_ns", *PARTS), 0) for r in range(ranks)}
    corr = 0
    for i, inst in enumerate(plan):
        t = i * SPACING + 20_000  # launches at t - 15 µs stay after the previous slot's end
        end = t + COMM_END
        latest = t + max(inst["arrive"][:ranks])
        for r in range(ranks):
            start = t + inst["arrive"][r]
            busy_end = t + inst["busy"][r]
            corr += 3
            if busy_end > t:
                rows.append(dict(kernel_row("gemm_prev", "compute", COMP_STREAM, t, busy_end, launch=t - 15_000, corr=corr),
                                 rank=r))
            rows.append(dict(kernel_row("ncclDevKernel_AllReduce_Sum_f32", "comm", COMM_STREAM, start, end,
                                        launch=t - 14_000, corr=corr + 1, collective="all_reduce", comm_group="0",
                                        comm_seq=i), rank=r))
            nxt = end + inst["gap"]
            stream = COMM_STREAM if inst["mode"] == "dependent" else COMP_STREAM
            launch = end if inst["mode"] == "host_idle" else t - 13_000
            rows.append(dict(kernel_row("gemm_next", "compute", stream, nxt, nxt + 1_000, launch=launch, corr=corr + 2),
                             rank=r))
            e = expect[r]
            e["comm_ns"] += end - start
            x = min(max(start, busy_end), end)
            e["overlapped_ns"] += x - start
            e["exposed_ns"] += end - x
            peer = max(0, latest - x) if ranks > 1 and host is not None else 0
            e["peer_wait_ns"] += peer
            part = {"dependent": "dependent_ns", "host_idle": "host_idle_ns", "other": "exposed_other_ns"}[inst["mode"]]
            e[part] += end - x - peer
    if shuffle is not None:
        random.Random(shuffle).shuffle(rows)
    _write(path, rows, ranks, host)
    return path, expect


def _write(path, rows, ranks, host):
    keys = sorted({k for r in rows for k in r if k != "rank"})

    def table(rs, rank, sch):
        # every key in every row: from_pylist takes its columns from the first row alone
        t = pa.Table.from_pylist([{k: r.get(k) for k in keys} for r in rs])
        t = t.append_column("run_id", pa.array(["r"] * len(t))).append_column("rank", pa.array([rank] * len(t), pa.int32()))
        return schema.conform(t, sch)

    with schema.DatasetWriter(path) as w:
        w.add("runs", pa.table({"run_id": ["r"]}))
        if host is not None:
            w.add("ranks", pa.Table.from_pylist([{"run_id": "r", "rank": r, "world_size": ranks, "host": host, "pid": 100 + r,
                                                  "base_time_ns": 0} for r in range(ranks)], schema=schema.RANKS))
        for r in range(ranks):
            w.add("devices", pa.Table.from_pylist([{"run_id": "r", "rank": r, **H200_ROW}]))
            w.add_kernels(table([x for x in rows if x["rank"] == r], r, schema.KERNELS), "r", r)
        w.commit()


def got_parts(ds) -> dict[int, dict]:
    b = breakdown(ds)
    return {int(r["rank"]): {c: int(r[c]) for c in ("comm_ns", "overlapped_ns", "exposed_ns", *PARTS)}
            for r in b.to_dict("records")}


instances = st.fixed_dictionaries({
    "arrive": st.lists(st.integers(0, 20_000), min_size=4, max_size=4),
    "busy": st.lists(st.integers(0, 45_000), min_size=4, max_size=4),
    "gap": st.integers(1, 5_000),
    "mode": st.sampled_from(["dependent", "host_idle", "other"]),
})
# each example writes and reads datasets (~0.2 s): few examples, and no shrinking (minutes here)
PROPS = settings(max_examples=10, deadline=None, phases=[Phase.explicit, Phase.reuse, Phase.generate],
                 suppress_health_check=[HealthCheck.function_scoped_fixture])


def test_known_by_construction_one_case(tmp_path):
    """Two ranks, two instances, every part non-zero: rank 1 arrives 7 µs late at instance 0 (rank 0
    waits 7 µs, then 33 µs dependent: the next kernel is on the collective's stream), rank 0 arrives
    5 µs late at instance 1 where rank 1 computes 2 µs of it (rank 1 waits 3 µs exposed, then 35 µs
    host idle: the next kernel is launched when the collective ends)."""
    plan = [dict(arrive=[0, 7_000, 0, 0], busy=[0, 0, 0, 0], gap=100, mode="dependent"),
            dict(arrive=[5_000, 0, 0, 0], busy=[0, 2_000, 0, 0], gap=100, mode="host_idle")]
    ds, want = build_ranks(tmp_path / "ds", plan, ranks=2)
    assert want[0] == dict(comm_ns=75_000, overlapped_ns=0, exposed_ns=75_000, peer_wait_ns=7_000,
                           dependent_ns=33_000, host_idle_ns=35_000, exposed_other_ns=0)
    assert want[1]["peer_wait_ns"] == 3_000 and want[1]["overlapped_ns"] == 2_000
    assert got_parts(ds) == want
    assert bool(breakdown(ds).peers_known.all())


@PROPS
@given(plan=st.lists(instances, min_size=1, max_size=4), ranks=st.integers(1, 4))
def test_known_by_construction(tmp_path_factory, plan, ranks):
    ds, want = build_ranks(tmp_path_factory.mktemp("known") / "ds", plan, ranks=ranks)
    assert got_parts(ds) == want


@PROPS
@given(plan=st.lists(instances, min_size=1, max_size=3), ranks=st.integers(2, 4), seed=st.integers(0, 2**16))
def test_row_order_invariance_and_bounds(tmp_path_factory, plan, ranks, seed):
    """Shuffled rows give the same breakdown; the parts add up exactly; each part within its bound:
    peer wait <= the sum of the rank's instance waits (latest start - own start), dependent and host
    idle <= exposed; and the independent implementation agrees."""
    base = tmp_path_factory.mktemp("order")
    ds, _ = build_ranks(base / "a", plan, ranks=ranks)
    shuffled, _ = build_ranks(base / "b", plan, ranks=ranks, shuffle=seed)
    a, b = got_parts(ds), got_parts(shuffled)
    assert a == b
    kernels = schema.read_kernels(ds, columns=COLS).to_pylist()
    waits = {r: 0 for r in a}
    for starts in instance_starts(kernels).values():
        for r, s in starts.items():
            waits[r] += max(starts.values()) - s
    for r, p in a.items():
        assert sum(p[c] for c in PARTS) == p["exposed_ns"] == p["comm_ns"] - p["overlapped_ns"]
        assert 0 <= p["peer_wait_ns"] <= waits[r]
        assert 0 <= p["dependent_ns"] <= p["exposed_ns"] and 0 <= p["host_idle_ns"] <= p["exposed_ns"]
    assert check_exact(ds) == ranks


@st.composite
def loose_kernels(draw):
    """Unstructured kernels: 1-3 ranks, comm and compute on 3 streams at random times, launches
    before their starts or missing, collectives numbered per rank."""
    n_ranks = draw(st.integers(1, 3))
    rows = []
    for r in range(n_ranks):
        seq = 0
        for j in range(draw(st.integers(1, 12))):
            kind = draw(st.sampled_from(["comm", "compute", "compute", "memory"]))
            start = draw(st.integers(0, 200_000))
            end = start + draw(st.integers(0, 40_000))
            launch = draw(st.one_of(st.none(), st.integers(max(0, start - 50_000), start)))
            extra = dict(collective="all_reduce", comm_group="0", comm_seq=seq) if kind == "comm" else {}
            seq += kind == "comm"
            rows.append(dict(kernel_row("k" + kind, kind, draw(st.sampled_from([7, 9, 11])), start, end, launch=launch,
                                        corr=j + 1, **extra), rank=r))
    return n_ranks, rows


@PROPS
@given(case=loose_kernels(), seed=st.integers(0, 2**16))
def test_unstructured_traces_exact_and_order_invariant(tmp_path_factory, case, seed):
    n_ranks, rows = case
    base = tmp_path_factory.mktemp("loose")
    _write(base / "a", rows, n_ranks, "node0")
    shuffled = list(rows)
    random.Random(seed).shuffle(shuffled)
    _write(base / "b", shuffled, n_ranks, "node0")
    assert got_parts(base / "a") == got_parts(base / "b")
    check_exact(base / "a")


def test_peer_wait_only_where_peers_known(tmp_path):
    plan = [dict(arrive=[0, 4_000, 0, 0], busy=[0, 0, 0, 0], gap=100, mode="other")]
    ds, _ = build_ranks(tmp_path / "ds", plan, ranks=2, host=None)
    b = breakdown(ds)
    for rec in b.to_dict("records"):
        assert rec["peers_known"] or rec["peer_wait_ns"] == 0, rec


def test_write_rows_dataset_keeps_fields_of_later_rows(tmp_path):
    from overlapviz.testing import write_rows_dataset

    rows = [kernel_row("gemm", "compute", 7, 0, 10, launch=0, corr=1),
            kernel_row("ncclDevKernel_AllReduce", "comm", 9, 0, 20, launch=0, corr=2, comm_seq=5, comm_group="0",
                       collective="all_reduce")]
    ds = write_rows_dataset(tmp_path / "ds", rows)
    got = schema.read_kernels(ds, columns=["name", "comm_seq", "comm_group", "collective"]).to_pylist()
    assert got[1] == {"name": "ncclDevKernel_AllReduce", "comm_seq": 5, "comm_group": "0", "collective": "all_reduce"}
