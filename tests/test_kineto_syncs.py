"""What the Kineto reader keeps for "why a collective started late" (DESIGN.md): the sync
records (``RankTrace.syncs``: event records, stream waits, synchronizations, from runtime
calls and CUPTI's ``cuda_sync`` records), the launching thread of each kernel and what
PyTorch recorded of each collective, by the C scanner and the Python reader alike.

Edge cases: ids CUPTI sets to -1 (or 2**32 - 1 for a stream) are null; per-thread-stream
and versioned API spellings (``_ptsz``, ``_spt``, ``_v2``) and HIP's names count, driver
calls and look-alikes do not; a runtime call's stream is kept when it is a number
(roctracer's ``"0x0"`` pointer is not); a kernel's own collective args win over its
record_param_comms op's; a trace without sync records gives an empty table, not None.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pyarrow as pa
import pytest

from overlapviz.dataset import schema
from overlapviz.ingest import chrome, chrome_columns, ingest
from overlapviz.testing import (
    cpu_op_event,
    kernel_event,
    kineto_trace,
    runtime_event,
    write_trace,
)

DATA = Path(__file__).parent / "data"
REAL = DATA / "kineto_real"
SYNC_SCHEMA = pa.schema([f for f in schema.SYNCS if f.name not in ("run_id", "rank")])
PATHS = ["0", "1"]  # OVERLAPVIZ_PURE_PYTHON: the C scanner, the msgspec reader


def read(path: Path, pure: str, monkeypatch):
    if pure == "0" and chrome_columns._kineto is None:
        pytest.skip("the C scanner is not built")
    monkeypatch.setenv("OVERLAPVIZ_PURE_PYTHON", pure)
    (trace,) = chrome.ChromeReader().read(path)
    return trace


def counts(syncs: pa.Table) -> dict:
    return dict(Counter(zip(syncs.column("source").to_pylist(), syncs.column("kind").to_pylist())))


# (source, kind) -> rows, as the raw traces hold them (cudaEventRecordWithFlags is a record)
EXPECTED = {
    "hta_alexnet_cuda_sync/benchmark_result_2869224_1695835535_trace.json.gz": {
        ("runtime", "event_record"): 30, ("runtime", "stream_wait_event"): 34, ("runtime", "stream_sync"): 16,
        ("runtime", "context_sync"): 5, ("cuda_sync", "stream_wait_event"): 20, ("cuda_sync", "stream_sync"): 16,
        ("cuda_sync", "context_sync"): 5},
    "hta_event_sync_multistream/event_sync_trace.json.gz": {
        ("runtime", "event_record"): 4, ("runtime", "event_query"): 3, ("runtime", "stream_wait_event"): 1,
        ("runtime", "context_sync"): 1, ("cuda_sync", "event_sync"): 3, ("cuda_sync", "stream_wait_event"): 1,
        ("cuda_sync", "context_sync"): 1},
    "deepseek_v3_train/train.json.gz": {
        ("runtime", "event_query"): 2241, ("runtime", "stream_wait_event"): 56, ("runtime", "context_sync"): 1},
    "param_dlrm_8rank/worker0_step_12.1694128201545.pt.trace.json.gz": {
        ("runtime", "event_query"): 72, ("runtime", "stream_wait_event"): 44, ("runtime", "stream_sync"): 10,
        ("runtime", "context_sync"): 1},
    "tracelens_b200_eager/eager_trace.json.gz": {("runtime", "event_record"): 5, ("runtime", "stream_wait_event"): 2},
    "hta_mi250_rocm62/mi250_minitoy_train_ROCm6_2_kineto.json.gz": {("runtime", "context_sync"): 1},
    "tracelens_mi300_ddp_resnet18/train_resnet18.json.gz": {("runtime", "context_sync"): 1},
}  # fmt: skip


@pytest.mark.parametrize("pure", PATHS)
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_real_traces(name, pure, monkeypatch):
    path = REAL / name
    if not path.exists():
        pytest.skip(f"{path} not in tests/data")
    syncs = read(path, pure, monkeypatch).syncs
    assert syncs.schema == SYNC_SCHEMA
    assert counts(syncs) == EXPECTED[name]
    start = syncs.column("start_ns").to_numpy()
    assert (start[1:] >= start[:-1]).all() and (syncs.column("end_ns").to_numpy() >= start).all()
    runtime = syncs.filter(pa.compute.equal(syncs.column("source"), "runtime"))
    assert runtime.column("tid").null_count == 0
    cuda_sync = syncs.filter(pa.compute.equal(syncs.column("source"), "cuda_sync"))
    assert cuda_sync.column("tid").null_count == cuda_sync.num_rows


@pytest.mark.parametrize("pure", PATHS)
def test_a_stream_wait_names_its_record(pure, monkeypatch):
    syncs = read(REAL / "hta_event_sync_multistream" / "event_sync_trace.json.gz", pure, monkeypatch).syncs
    rows = {(r["source"], r["correlation"]): r for r in syncs.to_pylist()}
    wait = rows[("cuda_sync", 1389)]
    assert wait == {
        "source": "cuda_sync", "kind": "stream_wait_event", "name": "Stream Wait Event", "pid": 0, "tid": None,
        "start_ns": 1_712_867_402_367_683_000, "end_ns": 1_712_867_402_367_685_000, "correlation": 1389, "device": 0,
        "stream": 24, "event_id": 19, "wait_on_stream": 20, "wait_on_record_correlation": 1385,
    }  # fmt: skip
    record = rows[("runtime", 1385)]
    assert (record["kind"], record["name"], record["tid"], record["stream"]) == ("event_record", "cudaEventRecord", 3727853, None)
    # "Event Sync" on an event whose record the trace missed: stream and wait fields -1 -> null
    first = rows[("cuda_sync", 24)]
    assert (first["kind"], first["stream"], first["event_id"], first["wait_on_stream"], first["wait_on_record_correlation"]) == (
        "event_sync", None, 9, None, None)
    assert rows[("cuda_sync", 1424)]["kind"] == "context_sync" and rows[("cuda_sync", 1424)]["stream"] is None


@pytest.mark.parametrize("pure", PATHS)
def test_uint32_no_stream_is_null(pure, monkeypatch):
    syncs = read(REAL / "hta_alexnet_cuda_sync" / "benchmark_result_2869224_1695835535_trace.json.gz", pure, monkeypatch).syncs
    ctx = syncs.filter(pa.compute.equal(syncs.column("name"), "Context Sync"))
    assert ctx.num_rows == 5 and ctx.column("stream").null_count == 5  # written as 4294967295
    stream_sync = syncs.filter(pa.compute.equal(syncs.column("name"), "Stream Sync"))
    assert set(stream_sync.column("stream").to_pylist()) == {7}


def _calls(*names, **args):
    return [runtime_event(100 + i, 1_000_000 + 10_000 * i, 2_000, name=n, **args) for i, n in enumerate(names)]


KEPT = {
    "cudaEventRecord": "event_record", "cudaEventRecord_ptsz": "event_record", "cudaEventRecordWithFlags": "event_record",
    "cudaEventRecordWithFlags_ptsz": "event_record", "hipEventRecord": "event_record",
    "hipEventRecordWithFlags": "event_record", "cudaStreamWaitEvent": "stream_wait_event",
    "cudaStreamWaitEvent_ptsz": "stream_wait_event", "hipStreamWaitEvent_spt": "stream_wait_event",
    "cudaStreamSynchronize_v2": "stream_sync", "hipStreamSynchronize": "stream_sync",
    "cudaEventSynchronize": "event_sync", "hipEventSynchronize": "event_sync",
    "cudaDeviceSynchronize": "context_sync", "hipDeviceSynchronize": "context_sync", "cudaEventQuery": "event_query",
    "hipEventQuery": "event_query",
}  # fmt: skip
NOT_KEPT = ["cudaLaunchKernel", "cudaEventCreate", "cudaEventDestroy", "cudaStreamCreateWithPriority", "cuEventRecord",
            "cudaEventRecordX", "xcudaEventRecord", "cudaStreamQuery", "hipStreamWaitValue32"]  # fmt: skip


@pytest.mark.parametrize("pure", PATHS)
def test_which_runtime_calls_count(tmp_path, pure, monkeypatch):
    doc = kineto_trace(kernel_event("k", 2_000_000, 1_000, correlation=1), runtime_event(1, 1_990_000),
                       _calls(*KEPT, *NOT_KEPT), runtime_event(300, 5_000_000, name="cuEventRecord", cat="cuda_driver"))  # fmt: skip
    syncs = read(write_trace(doc, tmp_path / "rank0.json"), pure, monkeypatch).syncs
    assert dict(zip(syncs.column("name").to_pylist(), syncs.column("kind").to_pylist())) == KEPT
    assert set(syncs.column("source").to_pylist()) == {"runtime"} and syncs.column("device").null_count == len(KEPT)


@pytest.mark.parametrize("pure", PATHS)
def test_a_runtime_calls_stream_where_it_is_a_number(tmp_path, pure, monkeypatch):
    doc = kineto_trace(kernel_event("k", 2_000_000, 1_000, correlation=1), runtime_event(1, 1_990_000),
                       _calls("cudaStreamWaitEvent", "cudaStreamSynchronize", "hipStreamSynchronize"))  # fmt: skip
    doc["traceEvents"][2]["args"]["stream"] = 13
    doc["traceEvents"][3]["args"]["stream"] = 4294967295
    doc["traceEvents"][4]["args"]["stream"] = "0x7f00deadbeef"  # roctracer: a hipStream_t pointer
    path = write_trace(doc, tmp_path / "rank0.json")
    if pure == "0":
        assert chrome_columns.scan_tables(chrome.read_bytes(path)) is None  # the pointer is the Python reader's
    syncs = read(path, pure, monkeypatch).syncs
    assert syncs.column("stream").to_pylist() == [13, None, None]


@pytest.mark.parametrize("pure", PATHS)
def test_no_sync_records_is_an_empty_table(pure, monkeypatch):
    trace = read(DATA / "gloo_cpu" / "rank0.json.gz", pure, monkeypatch)
    assert trace.syncs is not None and trace.syncs.num_rows == 0 and trace.syncs.schema == SYNC_SCHEMA


def test_ingest_writes_the_syncs(tmp_path):
    src = REAL / "hta_event_sync_multistream" / "event_sync_trace.json.gz"
    out = ingest([src], tmp_path / "ds", progress=False)
    syncs = schema.read_table(out, "syncs")
    assert syncs.num_rows == 14 and set(syncs.column("rank").to_pylist()) == {0}


# --- kernels: launching thread and collective metadata ---------------------------------


@pytest.mark.parametrize("pure", PATHS)
def test_comm_metadata_from_the_kernels_own_args(pure, monkeypatch):
    k = read(REAL / "tracelens_b200_eager" / "eager_trace.json.gz", pure, monkeypatch).kernels
    nccl = k.filter(pa.compute.match_substring(k.column("name"), "nccl")).to_pylist()
    assert len(nccl) == 1
    got = {c: nccl[0][c] for c in ("collective", "comm_group", "comm_group_ranks", "comm_group_size", "comm_seq",
                                   "comm_in_elems", "comm_out_elems", "comm_dtype", "launch_tid")}  # fmt: skip
    assert got == {"collective": "_allgather_base", "comm_group": "3", "comm_group_ranks": "[0, 1, 2, 3, 4, 5, 6, 7]",
                   "comm_group_size": 8, "comm_seq": None, "comm_in_elems": 25136, "comm_out_elems": 201088,
                   "comm_dtype": "BFloat16", "launch_tid": 6583}  # fmt: skip
    assert k.column("launch_tid").null_count == 0  # every kernel's launch call is in this trace


COMM = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"
RPC_ARGS = {"External id": 50, "Collective name": "allreduce", "Process Group Name": "7", "Process Group Ranks": "[0, 1]",
            "Group size": 2, "In msg nelems": 1024, "Out msg nelems": 1024, "dtype": "Float", "Seq": 41}  # fmt: skip


@pytest.mark.parametrize("pure", PATHS)
def test_comm_metadata_from_record_param_comms(tmp_path, pure, monkeypatch):
    doc = kineto_trace(
        cpu_op_event("record_param_comms", 900_000, 200_000, tid=77, **RPC_ARGS),
        runtime_event(5, 1_000_000, tid=77),
        kernel_event(COMM, 1_100_000, 50_000, correlation=5, external_id=50, stream=20),
        # its own args win, field by field (newer Kineto copies them onto the kernel)
        runtime_event(6, 1_010_000, tid=78),
        kernel_event(COMM, 1_200_000, 50_000, correlation=6, external_id=50, stream=20, Seq=42, dtype="BFloat16"),
        kernel_event("gemm", 1_300_000, 50_000, correlation=7, external_id=51),  # no launch call, no link
    )
    k = read(write_trace(doc, tmp_path / "rank0.json"), pure, monkeypatch).kernels.sort_by("start_ns").to_pylist()
    linked = {"collective": "allreduce", "comm_group": "7", "comm_group_ranks": "[0, 1]", "comm_group_size": 2,
              "comm_seq": 41, "comm_in_elems": 1024, "comm_out_elems": 1024, "comm_dtype": "Float", "launch_tid": 77}  # fmt: skip
    assert {c: k[0][c] for c in linked} == linked
    assert {c: k[1][c] for c in linked} == {**linked, "comm_seq": 42, "comm_dtype": "BFloat16", "launch_tid": 78}
    assert all(k[2][c] is None for c in linked)


@pytest.mark.parametrize("pure", PATHS)
def test_host_stand_ins_launch_themselves(pure, monkeypatch):
    k = read(DATA / "gloo_cpu" / "rank0.json.gz", pure, monkeypatch).kernels
    assert k.column("launch_tid").to_pylist() == k.column("stream").to_pylist()
