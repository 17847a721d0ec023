"""Reader for PyTorch-profiler (Kineto) Chrome traces: ``.json`` or ``.json.gz``, CUDA (CUPTI) or ROCm (roctracer).

Two readers turn ``traceEvents`` into Arrow columns by category (GPU activities, runtime
calls, host ranges, sync records) and give the same tables: the C scanner
(``chrome_columns``, where it is built), else the Python reader (``chrome_events``:
msgspec structs, then one ``pyarrow`` conversion per table, not a Python loop per
field); the scanner hands the documents it does not read exactly (odd values, invalid
JSON) to the Python reader, which words the errors. The joins (kernel -> launching
runtime call by correlation id, step ranges, record_param_comms metadata) are vectorized
with numpy/pyarrow.

Kineto writes ``ts``/``dur`` in microseconds: decimals with three places (ns resolution,
relative to its own base) or integers (older traces, epoch µs ~1.7e15). Both readers
read them from their text into int64 ns, never through a double (at epoch scale a double
holds µs to 0.25 µs only): three fractional digits are whole ns, more round to the
nearest ns with ties to even (``chrome_events.decimal_us_to_ns``); a time past int64 ns
fails naming the file.
"""

from __future__ import annotations

import gc
import json
import re
from decimal import Decimal
from pathlib import Path

import numpy as np
import numpy.ma  # noqa: F401  pyarrow imports it at its first conversion of an ndarray (~40 ms): with the reader instead
import pyarrow as pa
import pyarrow.compute as pc

from overlapviz.ingest import chrome_columns
from overlapviz.ingest.base import RankTrace
from overlapviz.ingest.files import read_bytes
from overlapviz.ingest.text import REPAIRED_KEY, needs_repair, repair_json_text
from overlapviz.ingest.chrome_events import require, event_times, decode_events, event_tables, sync_table
from overlapviz.domain.collectives import collective_of
from overlapviz.domain.devices import amd_arch_from_name
from overlapviz.dataset.schema import DEVICES, conform

SOURCE_FORMAT = "chrome"

# HIP launch APIs whose grid arguments are work-items, not blocks: Kineto's roctracer and
# rocprofiler-sdk loggers record hipExtModuleLaunchKernel's globalWorkSize as "grid"
# (pytorch/kineto libkineto/src/RoctracerLogger.cpp reads it through the
# hipModuleLaunchKernel union member; RocprofLogger.cpp maps globalWorkSize* to gridSize).
_WORKITEM_GRID_APIS = ("hipExtModuleLaunchKernel", "hipHccModuleLaunchKernel")

_STEP_PATTERNS = (
    ("iteration", re.compile(r"^ovz_iter#(\d+)$")),
    ("profiler_step", re.compile(r"^ProfilerStep#(\d+)$")),
)

_AMD_NAME = re.compile(r"\bAMD\b|Radeon|Instinct", re.IGNORECASE)
_DEVICE_KEYS = {
    "id": "device",
    "name": "name",
    "computeMajor": "compute_major",
    "computeMinor": "compute_minor",
    "numSms": "num_sms",
    "maxThreadsPerMultiprocessor": "max_threads_per_sm",
    "maxThreadsPerBlock": "max_threads_per_block",
    "maxBlocksPerMultiProcessor": "max_blocks_per_sm",
    "maxBlocksPerMultiprocessor": "max_blocks_per_sm",
    "regsPerMultiprocessor": "regs_per_sm",
    "regsPerBlock": "regs_per_block",
    "sharedMemPerMultiprocessor": "shared_mem_per_sm",
    "maxSharedMemoryPerMultiProcessor": "shared_mem_per_sm",
    "sharedMemPerBlock": "shared_mem_per_block",
    "sharedMemPerBlockOptin": "shared_mem_per_block_optin",
    "warpSize": "warp_size",
    "totalGlobalMem": "total_mem_bytes",
}
_KINETO_MARKERS = (
    b'"schemaVersion"',
    b'"deviceProperties"',
    b'"distributedInfo"',
    b'"baseTimeNanoseconds"',
    b'"cpu_op"',
    b'"cuda_runtime"',
    b'"user_annotation"',
    b'"python_function"',
    b'"kernel"',
    b'"gpu_memcpy"',
)


def _dims(lists: pa.ChunkedArray | pa.Array, path: Path, label: str) -> list[pa.Array]:
    """Split a list<int64> column of [x, y, z] into three int64 columns (null where absent).

    A list shorter than three leaves the missing dimensions at 1, as CUDA's dim3 does.
    """
    arr = lists.combine_chunks() if isinstance(lists, pa.ChunkedArray) else lists
    n = len(arr)
    valid = np.asarray(arr.is_valid()) if n else np.zeros(0, dtype=bool)
    lengths = pc.fill_null(pc.list_value_length(arr), 0).to_numpy(zero_copy_only=False).astype(np.int64)
    if np.any(valid & (lengths < 1)):
        raise ValueError(f"{path}: kernel events: {label!r} is an empty list")
    flat = pc.fill_null(pc.list_flatten(arr), 1).to_numpy(zero_copy_only=False).astype(np.int64)
    first = np.cumsum(lengths) - lengths  # null lists have length 0 and add no values
    out = []
    for i in range(3):
        has = valid & (lengths > i)
        vals = np.ones(n, dtype=np.int64)
        vals[has] = flat[first[has] + i]
        out.append(pa.array(vals, pa.int64(), mask=~valid))
    return out


# --- the reader ---------------------------------------------------------------------


class ChromeReader:
    """PyTorch profiler (Kineto) Chrome trace JSON, plain or gzipped, one rank per file."""

    name = SOURCE_FORMAT

    def sniff(self, path: Path, head: bytes) -> bool:
        text = head.lstrip()
        if not text[:1] in (b"{", b"["):
            return False
        if b'"BeginNs"' in head or b'"rocprofiler-sdk-tool"' in head:  # rocprof's own JSON formats
            return False
        if text[:1] == b"[":
            return b'"ph"' in head
        return b'"traceEvents"' in head or any(m in head for m in _KINETO_MARKERS)

    def read(self, path: Path) -> list[RankTrace]:
        # The decoded events are millions of small objects that hold no cycles; with the
        # cyclic GC running, its generation-0 collections re-walk them over and over and
        # decoding takes 2-3x longer. Off while reading, back to its state after.
        was_enabled = gc.isenabled()
        gc.disable()
        try:
            raw = read_bytes(path)
            repaired = 0
            scanned = chrome_columns.scan_tables(raw)  # None: no scanner, or a document it leaves to Python
            if scanned is None and needs_repair(raw):  # every reader refuses text that is not UTF-8
                raw, repaired = repair_json_text(raw)
                scanned = chrome_columns.scan_tables(raw)
            if scanned is None:
                events, meta = decode_events(raw, path)
                del raw  # before the structs become columns: the text and both at once were the peak
                scanned = event_tables(events, path), meta, len(events)
                del events
            else:
                del raw
            tables, meta, n_events = scanned
            del scanned
            trace = _assemble(*tables, meta, n_events, path)
        except ValueError as exc:  # errors from the column helpers do not know the file
            if str(exc).startswith(str(path)):
                raise
            raise ValueError(f"{path}: {exc}") from None
        finally:
            if was_enabled:
                gc.enable()
        if repaired:
            trace.info[REPAIRED_KEY] = repaired
        return [trace]


READERS = [ChromeReader()]


def _assemble(gpu: pa.Table, runtime: pa.Table, host: pa.Table, sync: pa.Table, doc: dict, n_events: int,
              path: Path) -> RankTrace:  # fmt: skip
    """The rank from its GPU, runtime, host and sync tables (complete events only, times
    in int64 ns) and the document's other keys."""
    steps = _steps(host, path)
    main_pid, main_tid = _main_thread(host, runtime, steps)
    if gpu.num_rows:
        kernels = _gpu_activities(gpu, runtime, host, main_pid, path)
    else:
        kernels = _host_stand_ins(host, main_tid, path)
    if not kernels.num_rows:
        raise ValueError(f"{path}: no GPU or host activities in this trace (nothing to measure)")
    devices = _devices(doc, path)
    kernels = _with_wave_size(kernels, devices)

    dist = doc.get("distributedInfo") if isinstance(doc.get("distributedInfo"), dict) else {}
    rank = dist.get("rank")
    if rank is not None and not isinstance(rank, int):
        try:
            rank = int(rank)
        except (TypeError, ValueError):
            raise ValueError(f"{path}: distributedInfo.rank is not an integer ({rank!r})") from None
    base = doc.get("baseTimeNanoseconds")
    info = {
        "world_size": _int_or_none(dist.get("world_size")),
        "backend": dist.get("backend"),
        "host": doc.get("host_name") if isinstance(doc.get("host_name"), str) else None,
        "pid": main_pid,
        "source_path": str(path),
        "source_format": SOURCE_FORMAT,
        "base_time_ns": int(base) if isinstance(base, (int, float)) else 0,
        "n_events": n_events,
        "distributed_info": json.dumps(dist, sort_keys=True) if dist else None,
        # run facts (schema.RUNS columns) the driver copies into the run's row
        "nccl_version": dist.get("nccl_version"),
        "hip_version": _hip_version(doc.get("hip_runtime_version")),
        "cuda_version": _cuda_version(doc.get("cuda_runtime_version")),
    }
    syncs = sync_table(runtime, sync, path)
    return RankTrace(rank=rank, kernels=kernels, steps=steps, devices=devices, info=info, syncs=syncs)


def _us_text(ns: int) -> str:
    return str(Decimal(int(ns)).scaleb(-3))


def _gpu_activities(gpu: pa.Table, runtime: pa.Table, host: pa.Table, main_pid, path: Path) -> pa.Table:
    require(gpu, path, "GPU activity")
    start, dur = event_times(gpu, path, "GPU activity")
    if (dur < 0).any():  # zero is fine: integer-µs traces and memsets have them (DESIGN.md)
        i = int(np.flatnonzero(dur < 0)[0])
        raise ValueError(
            f"{path}: {gpu.column('category')[i].as_py()} event {gpu.column('name')[i].as_py()!r:.60} "
            f"has negative duration ({_us_text(dur[i])} us; {int((dur < 0).sum())} such events)"
        )
    n = gpu.num_rows
    corr = np.asarray(pc.fill_null(gpu.column("correlation"), -1), dtype=np.int64)

    # launch: the runtime/driver call with the same correlation id, preferring the main process
    launch = np.zeros(n, dtype=np.int64)
    launch_end = np.zeros(n, dtype=np.int64)
    launch_end_ok = np.zeros(n, dtype=bool)
    rt_idx = np.full(n, -1, dtype=np.int64)
    rt = runtime.filter(pc.is_valid(runtime.column("correlation"))) if runtime.num_rows else runtime
    if rt.num_rows:
        require(rt, path, "runtime", ("ts",))
        r_corr = rt.column("correlation").to_numpy()
        r_start = rt.column("ts").to_numpy()
        r_pid = rt.column("pid").to_numpy(zero_copy_only=False)
        other = (r_pid != main_pid).astype(np.int8) if main_pid is not None else np.zeros(len(r_corr), np.int8)
        order = np.lexsort((r_start, other, r_corr))  # by correlation, main process first, then earliest
        keep = order[np.concatenate([[True], r_corr[order][1:] != r_corr[order][:-1]])]
        kc = r_corr[keep]
        pos = np.searchsorted(kc, corr)
        pos_c = np.minimum(pos, len(kc) - 1)
        hit = (corr >= 0) & (kc[pos_c] == corr)
        rt_idx[hit] = keep[pos_c[hit]]
        launch[hit] = r_start[keep[pos_c[hit]]]
        # the call's own end (cuda_runtime / cuda_driver dur): a launch call that loads modules runs ms
        r_dur = rt.column("dur")
        d_ok = np.asarray(r_dur.is_valid()) if r_dur.null_count else np.ones(rt.num_rows, bool)
        r_end = r_start + pc.fill_null(r_dur, 0).to_numpy()
        d_ok &= r_end >= r_start
        launch_end[hit] = r_end[keep[pos_c[hit]]]
        launch_end_ok[hit] = d_ok[keep[pos_c[hit]]]

    grid_col, block_col = gpu.column("grid"), gpu.column("block")
    smem = gpu.column("shared memory")
    if rt.num_rows and (grid_col.null_count or smem.null_count):
        # ROCm: kernels may lack grid/block/shared memory that their hipLaunchKernel call carries
        has_rt = rt_idx >= 0
        take_idx = pa.array(np.where(has_rt, rt_idx, 0), mask=~has_rt)
        from_rt = rt.select(["grid", "block", "shared memory"]).take(take_idx)
        is_kernel = pc.equal(gpu.column("category"), "kernel")
        need = pc.and_(pc.is_null(grid_col), is_kernel)
        grid_col = pc.if_else(need, from_rt.column("grid"), grid_col)
        block_col = pc.if_else(need, from_rt.column("block"), block_col)
        smem = pc.if_else(pc.and_(pc.is_null(smem), is_kernel), from_rt.column("shared memory"), smem)
    gx, gy, gz = _dims(grid_col, path, "grid")
    bx, by, bz = _dims(block_col, path, "block")
    if rt.num_rows:
        has_rt = rt_idx >= 0
        api = rt.column("name").take(pa.array(np.where(has_rt, rt_idx, 0), mask=~has_rt))
        workitems = pc.fill_null(pc.is_in(api, pa.array(_WORKITEM_GRID_APIS)), False).to_numpy(zero_copy_only=False)
        if workitems.any():
            gx, gy, gz = (_blocks(g, b, workitems) for g, b in ((gx, bx), (gy, by), (gz, bz)))

    has_rt = rt_idx >= 0
    launch_tid = rt.column("tid").take(pa.array(np.where(has_rt, rt_idx, 0), mask=~has_rt)) if rt.num_rows else pa.nulls(n, pa.int64())
    device = gpu.column("device")
    if device.null_count:
        device = pc.coalesce(device, gpu.column("pid"))
    stream = gpu.column("stream")
    if stream.null_count:
        stream = pc.coalesce(stream, gpu.column("tid"))
    table = pa.table(
        {
            "device": device.cast(pa.int32()),
            "stream": stream,
            "correlation": pa.array(corr, mask=corr < 0),
            "name": gpu.column("name"),
            "category": gpu.column("category"),
            "is_host": pa.array(np.zeros(n, dtype=bool)),
            "start_ns": start,
            "end_ns": start + dur,
            "grid_x": gx,
            "grid_y": gy,
            "grid_z": gz,
            "block_x": bx,
            "block_y": by,
            "block_z": bz,
            "regs_per_thread": gpu.column("registers per thread"),
            "shared_mem_bytes": smem,
            "bytes": gpu.column("bytes"),
            "launch_ns": pa.array(launch, mask=~has_rt),
            "source_format": pa.array(np.full(n, SOURCE_FORMAT, dtype=object), pa.string()),
            "launch_tid": launch_tid,
            "launch_end_ns": pa.array(launch_end, mask=~(has_rt & launch_end_ok)),
            **_comm_metadata(gpu, host),
        }
    )
    # the activity's own args name a collective (Kineto copied PyTorch's metadata onto it:
    # copy-engine collectives run as copy kernels and memcpys), or it is a memcpy launched
    # inside a c10d ``nccl:*`` range (NCCL's copy-engine and P2P-copy paths); the driver
    # makes flagged rows comm (classify.TAGGED)
    in_range = _nccl_range_memcpys(gpu.column("category"), launch, launch_tid, has_rt, host)
    table = table.append_column("comm_tagged", pc.or_(pc.is_valid(gpu.column("Collective name")), pc.is_valid(in_range)))
    i = table.column_names.index("collective")
    return table.set_column(i, "collective", pc.coalesce(table.column(i), in_range))


def _nccl_range_memcpys(category, launch: np.ndarray, launch_tid, has_rt: np.ndarray, host: pa.Table) -> pa.Array:
    """The collective of each memcpy whose launch call lies inside a host ``nccl:<collective>``
    range (c10d's record_function) on the launching thread, the innermost; null elsewhere."""
    n = len(launch)
    if not host.num_rows or not n:
        return pa.nulls(n, pa.string())
    is_nccl = pc.fill_null(pc.starts_with(host.column("name"), "nccl:"), False)
    if not pc.any(is_nccl).as_py():
        return pa.nulls(n, pa.string())
    ranges = host.filter(is_nccl)
    memcpy = np.asarray(pc.fill_null(pc.equal(category, "gpu_memcpy"), False), dtype=bool) & has_rt
    tid = np.asarray(pc.fill_null(launch_tid, -1).to_numpy(zero_copy_only=False), dtype=np.int64)
    start = ranges.column("ts").to_numpy()
    end = start + ranges.column("dur").to_numpy()
    r_tid = np.asarray(pc.fill_null(ranges.column("tid"), -2).to_numpy(zero_copy_only=False), dtype=np.int64)
    labels = [collective_of(x) or x.removeprefix("nccl:") for x in ranges.column("name").to_pylist()]
    best = np.full(n, -1, np.int64)
    best_start = np.full(n, np.iinfo(np.int64).min)
    for j in range(ranges.num_rows):  # one vectorized pass per range (a few per step)
        inside = memcpy & (tid == r_tid[j]) & (launch >= start[j]) & (launch < end[j]) & (start[j] > best_start)
        best[inside], best_start[inside] = j, start[j]
    words = np.asarray(labels + [None], dtype=object)
    return pa.array(words[np.where(best >= 0, best, len(labels))].tolist(), pa.string())


def _blocks(grid: pa.Array, block: pa.Array, workitems: np.ndarray) -> pa.Array:
    """Work-items -> blocks (ceil division) where ``workitems``; unchanged elsewhere."""
    valid = np.asarray(grid.is_valid()) & np.asarray(block.is_valid())
    g = np.where(valid, pc.fill_null(grid, 0).to_numpy(), 0).astype(np.int64)  # nulls filled: no NaN to cast
    b = np.where(valid, pc.fill_null(block, 1).to_numpy(), 1).astype(np.int64)
    conv = workitems & valid & (b > 0)
    out = np.where(conv, -(-g // np.maximum(b, 1)), g)
    return pa.array(out, pa.int64(), mask=~valid)


# kernels column <- what PyTorch records of a collective (the raw values), on the kernel or
# on its record_param_comms op
_COMM_COLUMNS = {
    "collective": "Collective name",
    "comm_group": "Process Group Name",
    "comm_group_ranks": "Process Group Ranks",
    "comm_group_size": "Group size",
    "comm_seq": "Seq",
    "comm_in_elems": "In msg nelems",
    "comm_out_elems": "Out msg nelems",
    "comm_dtype": "dtype",
}


def _comm_metadata(gpu: pa.Table, host: pa.Table) -> dict[str, pa.ChunkedArray]:
    """The collective's metadata of each GPU activity, field by field: the kernel's own args
    (Kineto copies them onto the kernels a record_param_comms op launched), else those of
    the ``record_param_comms`` host op (the one with a "Collective name") sharing its
    External id. Rows that are not communication get whatever their link says; the driver
    keeps it for comm rows only."""
    own = {col: gpu.column(arg) for col, arg in _COMM_COLUMNS.items()}
    if not host.num_rows or not any(c.null_count for c in own.values()):
        return own
    rpc = host.filter(
        pc.and_(pc.is_valid(host.column("Collective name")), pc.is_valid(host.column("External id")))
    )
    if not rpc.num_rows:
        return own
    # the first record per External id (np.unique's indices are first occurrences)
    eids, first = np.unique(np.asarray(rpc.column("External id").to_numpy()), return_index=True)
    at = pa.array(first).take(pc.index_in(gpu.column("External id"), pa.array(eids)))  # null: no record
    linked = rpc.select(list(_COMM_COLUMNS.values())).take(at)
    return {col: pc.coalesce(c, linked.column(_COMM_COLUMNS[col])) if c.null_count else c for col, c in own.items()}


def _steps(host: pa.Table, path: Path) -> pa.Table:
    """Host ranges named ``ovz_iter#N`` (preferred) or ``ProfilerStep#N``."""
    empty = pa.table(
        {
            "step": pa.array([], pa.int64()),
            "name": pa.array([], pa.string()),
            "source": pa.array([], pa.string()),
            "start_ns": pa.array([], pa.int64()),
            "end_ns": pa.array([], pa.int64()),
            "tid": pa.array([], pa.int64()),
            "pid": pa.array([], pa.int64()),
        }
    )
    if not host.num_rows:
        return empty
    for source, pattern in _STEP_PATTERNS:
        mask = pc.fill_null(pc.match_substring_regex(host.column("name"), pattern.pattern), False)
        rows = host.filter(mask)
        if not rows.num_rows:
            continue
        require(rows, path, "step range")
        start, dur = event_times(rows, path, "step range")
        if (dur < 0).any():
            raise ValueError(f"{path}: step range {rows.column('name')[int(np.argmax(dur < 0))].as_py()!r} has negative duration")
        numbers = pc.extract_regex(rows.column("name"), pattern.pattern.replace("(\\d+)", "(?P<n>\\d+)"))
        step = pc.struct_field(numbers, "n").cast(pa.int64())
        table = pa.table(
            {
                "step": step,
                "name": rows.column("name"),
                "source": pa.array([source] * rows.num_rows, pa.string()),
                "start_ns": start,
                "end_ns": start + dur,
                "tid": rows.column("tid"),
                "pid": rows.column("pid"),
            }
        )
        # the same range written twice (cpu_op and user_annotation in some torch versions):
        # the first row of each (step, name, start, end) stays (a few hundred rows: Python)
        first: dict = {}
        for i, key in enumerate(zip(step.to_pylist(), table.column("name").to_pylist(), start.tolist(), (start + dur).tolist())):
            first.setdefault(key, i)
        table = table.take(pa.array(list(first.values()), pa.int64()))
        return table.sort_by([("start_ns", "ascending"), ("end_ns", "descending")])
    return empty


def _main_thread(host: pa.Table, runtime: pa.Table, steps: pa.Table):
    """(pid, tid) of the training loop: where the steps are, else the busiest cpu_op thread."""
    if steps.num_rows:
        return _mode(steps.column("pid")), _mode(steps.column("tid"))
    ops = host.filter(pc.equal(host.column("category"), "cpu_op")) if host.num_rows else host
    ops = ops.filter(pc.and_(pc.is_valid(ops.column("tid")), pc.is_valid(ops.column("dur")))) if ops.num_rows else ops
    if ops.num_rows:
        # total cpu_op time per (pid, tid), threads in order of first appearance, busiest first
        pid_col = ops.column("pid")
        pid = np.asarray(pc.fill_null(pid_col, 0).to_numpy(), dtype=np.int64)
        pid_null = np.asarray(pid_col.is_null().to_numpy(zero_copy_only=False), dtype=np.int64)
        tid = np.asarray(ops.column("tid").to_numpy(), dtype=np.int64)
        keys, first, group = np.unique(np.stack([pid, pid_null, tid], axis=1), axis=0, return_index=True, return_inverse=True)
        busy = np.bincount(group.ravel(), weights=ops.column("dur").to_numpy(), minlength=len(keys))
        by_appearance = np.argsort(first, kind="stable")
        order = by_appearance[np.argsort(-busy[by_appearance], kind="stable")]
        keys = keys[order]
        same = np.flatnonzero((keys[:, 1] == 0) & (keys[:, 0] == keys[:, 2]))  # the main thread has tid == pid on Linux
        pid_i, null_i, tid_i = keys[int(same[0]) if len(same) else 0]
        return (None if null_i else int(pid_i)), int(tid_i)
    if runtime.num_rows:
        return _mode(runtime.column("pid")), _mode(runtime.column("tid"))
    return None, None


def _mode(col: pa.ChunkedArray):
    """The most frequent non-null value (None when there is none)."""
    col = col.drop_null()
    if len(col) == 0:
        return None
    vc = pc.value_counts(col).to_pylist()
    return max(vc, key=lambda d: d["counts"])["values"]


def _host_stand_ins(host: pa.Table, main_tid, path: Path) -> pa.Table:
    """CPU-only traces: top-level ``cpu_op``s of the main thread and every ``user_annotation``
    (the driver drops those its rules call ``other``: labels, not activities).

    Top-level means not contained in another cpu_op of the same thread (ties: the first
    in (start, longest) order is the parent). Step ranges are not activities. gloo's
    collectives are ``user_annotation`` ranges (``gloo:all_reduce``) on its worker
    threads; the rules decide their kind.
    """
    if not host.num_rows:
        return pa.table({"name": pa.array([], pa.string())})
    step_like = pc.fill_null(pc.match_substring_regex(host.column("name"), r"^(ProfilerStep|ovz_iter)#\d+$"), False)
    host = host.filter(pc.invert(step_like))
    require(host, path, "host")
    start, dur = event_times(host, path, "host")
    if (dur < 0).any():
        i = int(np.flatnonzero(dur < 0)[0])
        raise ValueError(f"{path}: host event {host.column('name')[i].as_py()!r:.60} has negative duration")
    end = start + dur
    cat = host.column("category").to_numpy(zero_copy_only=False)
    tid = host.column("tid").to_numpy(zero_copy_only=False)
    is_op = cat == "cpu_op"
    if main_tid is not None:
        on_main = np.asarray(pc.fill_null(pc.equal(host.column("tid"), main_tid), False))
    else:
        on_main = np.asarray(pc.is_valid(host.column("tid")))
    top = np.zeros(len(start), dtype=bool)
    ops = np.flatnonzero(is_op & on_main)
    if len(ops):
        # per thread in (start, longest first) order, an op that ends no later than the
        # latest end before it lies inside an earlier op: not top-level
        order = ops[np.lexsort((-end[ops], start[ops], tid[ops].astype(np.int64)))]
        t, e = tid[order].astype(np.int64), end[order]
        inside = np.zeros(len(order), dtype=bool)
        heads = np.flatnonzero(np.r_[True, t[1:] != t[:-1]])
        for lo, hi in zip(heads, np.r_[heads[1:], len(t)]):  # one pass per thread, not per op
            running = np.maximum.accumulate(e[lo:hi])
            inside[lo + 1:hi] = e[lo + 1:hi] <= running[:-1]
        top[order[~inside]] = True
    keep = top | (cat == "user_annotation")
    rows = np.flatnonzero(keep)
    sub = host.take(pa.array(rows))
    n = len(rows)
    return pa.table(
        {
            "device": pa.nulls(n, pa.int32()),
            "stream": sub.column("tid"),
            "correlation": pa.nulls(n, pa.int64()),
            "name": sub.column("name"),
            "category": sub.column("category"),
            "is_host": pa.array(np.ones(n, dtype=bool)),
            "start_ns": start[rows],
            "end_ns": end[rows],
            "launch_ns": start[rows],  # a host activity launches itself: its step is where it starts
            "source_format": pa.array(np.full(n, SOURCE_FORMAT, dtype=object), pa.string()),
            "launch_tid": sub.column("tid"),
            **{col: sub.column(arg) for col, arg in _COMM_COLUMNS.items()},
        }
    )


def _devices(doc: dict, path: Path) -> pa.Table:
    """``deviceProperties`` as DEVICES rows (without run_id/rank); only what the trace says."""
    props = doc.get("deviceProperties")
    amd_trace = any(k in doc for k in ("roctracer_version", "hip_runtime_version", "hip_driver_version"))
    rows = []
    if isinstance(props, list):
        for p in props:
            if not isinstance(p, dict):
                raise ValueError(f"{path}: deviceProperties holds a {type(p).__name__}, not an object")
            row = {}
            for key, col in _DEVICE_KEYS.items():
                if key in p and p[key] is not None and col not in row:
                    row[col] = p[key]
            name = str(row.get("name") or "")
            vendor = "amd" if (amd_trace or _AMD_NAME.search(name)) else "nvidia"
            row["vendor"] = vendor
            cc = (row.get("compute_major"), row.get("compute_minor"))
            if vendor == "nvidia" and all(type(v) is int for v in cc):  # another type: conform names the field
                row["arch"] = f"sm_{cc[0]}{cc[1]}"
            elif vendor == "amd":
                row["arch"] = amd_arch_from_name(name)
                if "shared_mem_per_sm" in row:
                    row["lds_per_cu"] = row["shared_mem_per_sm"]  # the same number: LDS per CU
            rows.append(row)
    schema = pa.schema([f for f in DEVICES if f.name not in ("run_id", "rank")])
    if not rows:
        return schema.empty_table()
    arrays = {}
    for c in schema.names:
        if any(c in r for r in rows):
            values = [r.get(c) for r in rows]
            try:
                arrays[c] = pa.array(values)
            except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError):
                key = next(k for k, col in _DEVICE_KEYS.items() if col == c)
                bad = next((v for v in values if isinstance(v, int) and not -(2**63) <= v < 2**63), None)
                what = f"{bad} is past int64" if bad is not None else "values of mixed or unreadable types"
                raise ValueError(f"{path}: deviceProperties: field {key!r}: {what}") from None
    try:
        return conform(pa.table(arrays), schema, where=f"{path}: deviceProperties")
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        raise ValueError(f"{path}: deviceProperties: {exc}") from None


def _with_wave_size(kernels: pa.Table, devices: pa.Table) -> pa.Table:
    if not kernels.num_rows or not devices.num_rows or "device" not in kernels.column_names:
        return kernels
    lookup = devices.select(["device", "warp_size"]).filter(pc.is_valid(devices.column("warp_size")))
    if not lookup.num_rows:
        return kernels
    idx = pc.index_in(kernels.column("device"), lookup.column("device").cast(pa.int32()))
    return kernels.append_column("wave_size", lookup.column("warp_size").take(idx))


def _int_or_none(v):
    try:
        return None if v is None else int(v)
    except (TypeError, ValueError):
        return None


def _hip_version(v) -> str | None:
    """HIP_VERSION-style integer (major*1e7 + minor*1e5 + patch) -> '6.4.43483'."""
    if not isinstance(v, (int, float)) or v <= 0:
        return None if v is None else str(v)
    v = int(v)
    return f"{v // 10_000_000}.{(v // 100_000) % 100}.{v % 100_000}"


def _cuda_version(v) -> str | None:
    """CUDA_VERSION-style integer (major*1000 + minor*10) -> '12.4'."""
    if not isinstance(v, (int, float)) or v <= 0:
        return None if v is None else str(v)
    v = int(v)
    return f"{v // 1000}.{(v % 1000) // 10}"
