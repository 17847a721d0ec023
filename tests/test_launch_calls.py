"""``kernels.launch_end_ns``: the end of each activity's host launch call, from every reader that
has the call (issue 32, item 4: a launch call that loads modules runs milliseconds).

Every expectation is read from the raw trace without overlapviz: the Kineto runtime/driver event's
``ts + dur`` (decimal µs, exactly), Nsight Systems' ``CUPTI_ACTIVITY_KIND_RUNTIME.end``, rocpd's
``rocpd_region`` end, rocprof v1's ``EndNs``. Null where the trace has no launch call for the row.
"""

from __future__ import annotations

import gzip
import json
import sqlite3
from decimal import Decimal
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from overlapviz.dataset import schema
from overlapviz.ingest import chrome, chrome_columns, ingest

DATA = Path(__file__).parent / "data"
PATHS = ["0", "1"]  # OVERLAPVIZ_PURE_PYTHON: the C scanner, the msgspec reader
KINETO = {
    "hta_nccl_parser_config": DATA / "hta_nccl_parser_config" / "nccl_data.json.gz",  # cudaLaunchKernel(ExC)
    "hta_mi250_rocm62": DATA / "kineto_real" / "hta_mi250_rocm62" / "mi250_minitoy_train_ROCm6_2_kineto.json.gz",
    "tracelens_b200_eager": next((DATA / "kineto_real" / "tracelens_b200_eager").glob("*.json*")),  # cuLaunchKernelEx
}


def _raw_launch_calls(path: Path) -> dict[int, int]:
    """correlation -> end ns of its cuda_runtime / cuda_driver call (the earliest where several)."""
    doc = json.loads(gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes(),
                     parse_float=Decimal)  # fmt: skip
    calls = {}
    for e in doc["traceEvents"]:
        corr = (e.get("args") or {}).get("correlation")
        if e.get("ph") == "X" and e.get("cat") in ("cuda_runtime", "cuda_driver") and corr is not None:
            start, end = int(Decimal(e["ts"]) * 1000), int((Decimal(e["ts"]) + Decimal(e["dur"])) * 1000)
            if corr not in calls or start < calls[corr][0]:
                calls[corr] = (start, end)
    return {c: end for c, (_, end) in calls.items()}


@pytest.mark.parametrize("pure", PATHS)
@pytest.mark.parametrize("name", sorted(KINETO))
def test_kineto_launch_end_is_the_calls_ts_plus_dur(name, pure, monkeypatch):
    if pure == "0" and chrome_columns._kineto is None:
        pytest.skip("the C scanner is not built")
    monkeypatch.setenv("OVERLAPVIZ_PURE_PYTHON", pure)
    (trace,) = chrome.ChromeReader().read(KINETO[name])
    k = trace.kernels.to_pydict()
    calls = _raw_launch_calls(KINETO[name])
    n_known = 0
    for corr, launch, end in zip(k["correlation"], k["launch_ns"], k["launch_end_ns"], strict=True):
        assert end == (calls.get(corr) if launch is not None else None), (name, corr)
        n_known += end is not None
    assert n_known > 0


def test_kineto_slow_launch_calls_by_hand():
    """Read by hand from the raw JSON: HTA's first all-reduce (correlation 25941) was launched by
    cudaLaunchKernelExC at ts 4458676524703.113 µs, dur 11.862; the MI250 trace's first
    hipLaunchKernel ran 6.5 ms (module loading) and its kernel started after it returned."""
    (t,) = chrome.ChromeReader().read(KINETO["hta_nccl_parser_config"])
    k = t.kernels.to_pandas().set_index("correlation")
    assert (k.loc[25941, "launch_ns"], k.loc[25941, "launch_end_ns"]) == (4458676524703113, 4458676524714975)
    (t,) = chrome.ChromeReader().read(KINETO["hta_mi250_rocm62"])
    k = t.kernels.to_pandas()
    slow = k.loc[(k["launch_end_ns"] - k["launch_ns"]).idxmax()]
    assert slow["launch_end_ns"] - slow["launch_ns"] == 6_543_109 and slow["start_ns"] >= slow["launch_end_ns"]


NSYS = DATA / "nsys" / "mfu_2gpu_before_window10ms_slow_launch.sqlite"


def test_nsys_launch_end_is_the_runtime_calls_end(tmp_path):
    """Every activity's launch_end_ns is CUPTI_ACTIVITY_KIND_RUNTIME.end of its call (same process and
    correlation id, the outermost call where several share one); the longest call of the FastVideo
    export: cudaLaunchKernel 2641744 ran 1.503 ms, and its kernel started 72.754 µs before it returned."""
    ds = ingest([NSYS], tmp_path / "ds", progress=False)
    k = schema.read_frame(ds, "kernels")
    with sqlite3.connect(f"file:{NSYS}?mode=ro", uri=True) as db:
        rows = db.execute("SELECT globalTid >> 24 & 16777215, correlationId, start, end FROM CUPTI_ACTIVITY_KIND_RUNTIME "
                          "ORDER BY start").fetchall()  # fmt: skip
    outer = {}
    for pid, corr, start, end in rows:
        outer.setdefault((pid, corr), (start, end))
    pids = {r: int(p) for r, p in schema.read_frame(ds, "ranks")[["rank", "pid"]].itertuples(index=False)}
    n = 0
    for r in k.itertuples():
        call = outer.get((pids[r.rank], r.correlation))
        want = call[1] if call is not None and call[0] <= r.start_ns else None
        got = None if r.launch_end_ns is None or str(r.launch_end_ns) == "<NA>" else int(r.launch_end_ns)
        assert got == want, (r.rank, r.correlation)
        n += got is not None
    assert n > 0.9 * len(k)
    slow = k.loc[(k["launch_end_ns"] - k["launch_ns"]).idxmax()]
    assert (slow["correlation"], slow["launch_ns"], slow["launch_end_ns"]) == (2641744, 60363819339, 60365322165)
    assert slow["launch_end_ns"] - slow["start_ns"] == 72_754


ROCPD = DATA / "rocpd" / "mi300x_rocm711_ck_bmm" / "28_results.db"


def test_rocpd_launch_end_is_the_regions_end(tmp_path):
    """ROCm 7.1.1 on an MI300X: each dispatch's hipLaunchKernel region (the dispatch's event
    stack_id), its end from SQL; the first launch ran 1.604 ms and its GEMM started 43 µs after."""
    ds = ingest([ROCPD], tmp_path / "ds", progress=False)
    k = schema.read_frame(ds, "kernels").set_index("correlation")
    with sqlite3.connect(f"file:{ROCPD}?mode=ro", uri=True) as db:
        ends = dict(db.execute("SELECT R.id, R.\"end\" FROM rocpd_kernel_dispatch K JOIN rocpd_event E ON E.id = K.event_id "
                               "JOIN rocpd_region R ON R.id = E.stack_id").fetchall())  # fmt: skip
    assert len(k) == 151 and k["launch_end_ns"].notna().all()
    assert {int(c): int(v) for c, v in k["launch_end_ns"].items()} == ends
    r = k.loc[21]
    assert (r["launch_ns"], r["launch_end_ns"], r["start_ns"]) == (1071423124549392, 1071423126153440, 1071423126196616)


def test_rocprof_v1_launch_end_is_the_hip_calls_end(tmp_path):
    """rocprof v1 JSON (Kokkos on a gfx906): the first copy's hipMemcpy ran from BeginNs
    704648887430307 to EndNs 704649222161405 (334.7 ms: runtime start-up); memsets launched
    without a traced call stay null."""
    ds = ingest([DATA / "rocprof" / "v1" / "kokkos_gfx906_hiptrace"], tmp_path / "ds", progress=False)
    k = schema.read_frame(ds, "kernels")
    first = k.loc[k["launch_ns"] == 704648887430307].iloc[0]
    assert (first["name"], first["launch_end_ns"]) == ("CopyHostToDevice", 704649222161405)
    assert (k["launch_end_ns"].isna() == k["launch_ns"].isna()).all()
    known = k.dropna(subset=["launch_end_ns"])
    assert (known["launch_end_ns"] >= known["launch_ns"]).all()


def test_an_older_dataset_reads_launch_end_as_null(tmp_path):
    """A 1.0 dataset (no launch_end_ns column) reads with the column null."""
    ds = ingest([KINETO["hta_nccl_parser_config"]], tmp_path / "ds", progress=False)
    meta = json.loads((ds / "dataset.json").read_text())
    for rel in meta["kernel_files"]:
        f = ds / rel
        pq.write_table(pq.read_table(f).drop_columns(["launch_end_ns"]), f)
    (ds / "dataset.json").write_text(json.dumps(meta | {"schema_version": "1.0"}))
    k = schema.read_kernels(ds, ["launch_ns", "launch_end_ns"])
    assert k.column("launch_end_ns").null_count == k.num_rows > 0 and k.column("launch_ns").null_count == 0
