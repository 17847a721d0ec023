"""rocprof JSON outputs: legacy v1 ``results.json`` and rocprofv3 ``--output-format json``."""

from __future__ import annotations

from decimal import Decimal, InvalidOperation
from pathlib import Path

import numpy as np
import orjson
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from overlapviz.ingest.base import RankTrace, rank_from_name
from overlapviz.ingest.rocprof_common import (
    amd_device_row,
    assign_collectives,
    blocks,
    check_one_generation,
    clean_kernel_names,
    device_table,
    kernel_table,
    parse_int,
    rocminfo_agents,
)
from overlapviz.ingest.files import gunzip_bounded, read_regular

INT64_MAX = 2**63 - 1


def load_json(path: Path):
    """Parse a JSON file, gzipped or not; a one-line ValueError naming the file on any failure.

    Inflating stops at ``files.max_inflated_bytes`` (a gzip bomb); orjson refuses NaN,
    infinities and nesting past 1024 levels.
    """
    raw = read_regular(path)
    if raw[:2] == b"\x1f\x8b":
        raw = gunzip_bounded(raw, path)
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON (truncated?): {str(exc).splitlines()[0]}") from None


def us_to_ns(text) -> int:
    """A µs value written as a string (``"340781"``, ``"12.3456"``) or a number to int ns,
    exactly (no float); refused: booleans, NaN, infinities, text, and times past int64 ns."""
    if isinstance(text, bool) or not isinstance(text, (str, int, float)):
        raise ValueError(f"{text!r} is not a number of µs")
    try:
        d = Decimal(str(text).strip())
    except (InvalidOperation, ValueError):
        raise ValueError(f"{str(text)[:40]!r} is not a number of µs") from None
    if not d.is_finite():
        raise ValueError(f"{text!r} is not a finite number of µs")
    if d.adjusted() > 18:
        raise ValueError(f"{str(text)[:40]!r} µs is past what int64 nanoseconds hold")
    ns = int((d * 1000).to_integral_value())
    if abs(ns) > INT64_MAX:
        raise ValueError(f"{str(text)[:40]!r} µs is past what int64 nanoseconds hold")
    return ns


def _whole_us(text) -> int:
    """The whole µs of a time (for joining flow arrows), with ``us_to_ns``'s refusals."""
    return us_to_ns(text) // 1000


# --- legacy rocprof v1 results.json --------------------------------------------------------

_V1_MEMSET = ("FillBuffer",)
_V1_BARRIER = "Unknown command type"
_V1_MEMORY_CALLS = r"(?i)memcpy|memset|copy|fill"


def read_v1_json(path: Path) -> RankTrace:
    """Legacy rocprof ``results.json``: Chrome-trace-like, lanes by pid, times as strings.

    Lanes are named by ``process_name`` metadata: ``GPU<N>`` lanes hold kernels,
    ``COPY`` holds copies (``FillBuffer`` is a memset), ``CPU HIP API`` the HIP
    calls. Times come from ``args.BeginNs``/``EndNs`` (exact ns, the same clock as
    ``results.csv``); a file without them falls back to ``ts``/``dur`` µs strings,
    converted exactly. ``Unknown command type`` rows are AQL barrier packets (zero
    length; rocprof's own kernel stats list them): kept with category ``barrier``, so
    the default rules make them ``other``, never compute. ``launch_ns`` follows the
    ``DataFlow`` arrows: for kernels the arrow leaves the HIP call at its end; for
    copies rocprof draws it at the copy's own start, so the call is the last
    ``hipMemcpy*``/``hipMemset*`` on the arrow's thread begun by then. A
    ``<base>.csv`` beside the file (rocprof writes both) adds grid, block, LDS and
    register counts to the kernels, matched by (begin, end). Devices come from the
    rocminfo dump in ``otherData``.
    """
    check_one_generation(path)
    doc = load_json(path)
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise ValueError(f"{path}: no traceEvents list (not a rocprof results.json)")
    events = [e for e in doc["traceEvents"] if isinstance(e, dict) and e]
    lanes = {
        str(e.get("pid")): str((e.get("args") or {}).get("name", ""))
        for e in events
        if e.get("ph") == "M" and e.get("name") == "process_name"
    }
    gpu_lanes = {pid for pid, name in lanes.items() if name.upper().startswith("GPU")}
    copy_lanes = {pid for pid, name in lanes.items() if name.upper() == "COPY"}
    api_lanes = {pid for pid, name in lanes.items() if "HIP" in name.upper() and "API" in name.upper()}
    x = pd.DataFrame(
        [
            {
                "pid": str(e.get("pid")),
                "tid": str(e.get("tid")),
                "ts": e.get("ts"),
                "dur": e.get("dur"),
                "name": e.get("name"),
                "begin": (e.get("args") or {}).get("BeginNs"),
                "end": (e.get("args") or {}).get("EndNs"),
                "dev": (e.get("args") or {}).get("dev-id"),
                "queue": (e.get("args") or {}).get("queue-id"),
                "proc": (e.get("args") or {}).get("proc-id"),
            }
            for e in events
            if e.get("ph") == "X" and str(e.get("pid")) in gpu_lanes | copy_lanes | api_lanes
        ],
        columns=["pid", "tid", "ts", "dur", "name", "begin", "end", "dev", "queue", "proc"],
    )
    if x.empty:
        raise ValueError(f"{path}: no GPU or COPY activity in this rocprof trace")
    x = x.assign(**_v1_times(path, x))
    neg = x.index[x["end_ns"] < x["start_ns"]]
    if len(neg):
        raise ValueError(f"{path}: event {x.loc[neg[0], 'name']!r} ends before it starts (negative duration)")

    is_gpu = x["pid"].isin(gpu_lanes)
    is_copy = x["pid"].isin(copy_lanes)
    acts = x[is_gpu | is_copy].copy()
    acts["category"] = "kernel"
    acts.loc[is_copy[is_gpu | is_copy], "category"] = "gpu_memcpy"
    acts.loc[acts["name"] == _V1_BARRIER, "category"] = "barrier"
    acts.loc[(acts["category"] == "gpu_memcpy") & acts["name"].isin(_V1_MEMSET), "category"] = "gpu_memset"
    lane_device = acts["pid"].map(lambda p: lanes[p][3:] if lanes[p][3:].isdigit() else None)
    acts["device"] = pd.to_numeric(acts["dev"].where(acts["dev"].notna(), lane_device), errors="coerce").astype("Int64")
    acts["stream"] = pd.to_numeric(acts["queue"], errors="coerce").astype("Int64")
    acts = _v1_flows(acts, x[x["pid"].isin(api_lanes)], events)

    names = clean_kernel_names(acts["name"].astype(str))
    cols = {
        "device": acts["device"],
        "stream": acts["stream"],
        "correlation": acts["correlation"],
        "name": names,
        "category": acts["category"],
        "is_host": [False] * len(acts),
        "start_ns": acts["start_ns"],
        "end_ns": acts["end_ns"],
        "launch_ns": acts["launch_ns"],
        "launch_end_ns": acts["launch_end_ns"],
        "source_format": ["rocprof_v1_json"] * len(acts),
    }
    cols |= _v1_csv_details(path, acts)
    kernels = kernel_table(cols, where=str(path))
    agents = rocminfo_agents(doc.get("otherData") or {})
    procs = acts["proc"].dropna().unique()
    return RankTrace(
        rank=rank_from_name(path.parent.name),
        kernels=kernels,
        devices=device_table([amd_device_row(i, a) for i, a in enumerate(agents)], where=str(path)),
        info={
            "pid": int(procs[0]) if len(procs) == 1 and str(procs[0]).isdigit() else None,
            "source_path": str(path),
            "source_format": "rocprof_v1_json",
            "base_time_ns": 0,
            "n_events": len(events),
        },
    )


def _ns(value) -> int:
    """An exact ns count (``"1550151853029637"`` or an int), with ``parse_int``'s refusals."""
    number = parse_int(value)
    if number is None:
        raise ValueError("is empty")
    return number


def _v1_times(path: Path, x: pd.DataFrame) -> dict:
    """Exact int64 times of the v1 events: ``args.BeginNs``/``EndNs`` where every event has
    them, else ``ts``/``dur`` µs; each value checked, the first bad one named with its event."""
    exact = x["begin"].notna().all() and x["end"].notna().all()
    cols: dict[str, list] = {"ts_us": [], "end_us": [], "start_ns": [], "end_ns": []}
    for i, (ts, dur, begin, end, name) in enumerate(zip(x["ts"], x["dur"], x["begin"], x["end"], x["name"])):
        field = "ts"
        try:
            ts_us = _whole_us(ts)
            field = "dur"
            end_us = ts_us + _whole_us(dur)
            if exact:
                field = "args.BeginNs"
                start_ns = _ns(begin)
                field = "args.EndNs"
                end_ns = _ns(end)
            else:
                start_ns = us_to_ns(ts)
                field = "dur"
                end_ns = start_ns + us_to_ns(dur)
            if abs(end_ns) > INT64_MAX or abs(end_us) > INT64_MAX // 1000:
                raise ValueError("the event ends past what int64 nanoseconds hold")
        except ValueError as exc:
            msg = str(exc)
            raise ValueError(f"{path}: event {i} ({str(name)[:120]!r}): field {field!r}: {msg}") from None
        cols["ts_us"].append(ts_us)
        cols["end_us"].append(end_us)
        cols["start_ns"].append(start_ns)
        cols["end_ns"].append(end_ns)
    return {k: pd.Series(v, index=x.index, dtype="int64") for k, v in cols.items()}


def _v1_flows(acts: pd.DataFrame, api: pd.DataFrame, events: list[dict]) -> pd.DataFrame:
    """Attach ``correlation`` (the flow id), ``launch_ns`` and ``launch_end_ns`` (its HIP call's begin
    and end) via DataFlow arrows."""
    flows = pd.DataFrame(
        [
            {"id": e.get("id"), "ph": e["ph"], "pid": str(e.get("pid")), "tid": str(e.get("tid")), "ts": e.get("ts")}
            for e in events
            if e.get("ph") in ("s", "t") and e.get("cat") == "DataFlow"
        ],
        columns=["id", "ph", "pid", "tid", "ts"],
    )
    acts = acts.assign(correlation=pd.NA, launch_ns=pd.NA, launch_end_ns=pd.NA)
    types = {"correlation": "Int64", "launch_ns": "Int64", "launch_end_ns": "Int64"}
    if flows.empty or api.empty:
        return acts.astype(types)
    flows["ts"] = pd.to_numeric(flows["ts"], errors="coerce")
    flows = flows.dropna(subset=["ts", "id"]).astype({"ts": "int64"})
    src = flows[flows["ph"] == "s"].drop_duplicates("id")
    dst = flows[flows["ph"] == "t"].drop_duplicates("id")
    # the arrow leaves the HIP call at its end (µs, as written); nested calls: the innermost
    calls = api.sort_values("start_ns")[["pid", "tid", "end_us", "ts_us", "start_ns", "end_ns"]]
    by_end = src.merge(calls.drop_duplicates(["pid", "tid", "end_us"], keep="last"),
                       left_on=["pid", "tid", "ts"], right_on=["pid", "tid", "end_us"], how="left")  # fmt: skip
    # copies: rocprof draws their arrow at the copy's own start, so it names only the thread;
    # the call is the latest memory call (hipMemcpy*, hipMemset*) on it that began by then
    mem_calls = api[api["name"].str.contains(_V1_MEMORY_CALLS, regex=True, na=False)]
    before = pd.merge_asof(
        src.reset_index(drop=True).sort_values("ts"),
        mem_calls[["pid", "tid", "ts_us", "start_ns", "end_ns"]].sort_values("ts_us"),
        left_on="ts",
        right_on="ts_us",
        by=["pid", "tid"],
        direction="backward",
    ).set_index("id")
    src = src.reset_index(drop=True)
    via_end = by_end["start_ns"].notna().to_numpy()
    src = src.assign(launch_ns=by_end["start_ns"].fillna(src["id"].map(before["start_ns"])).to_numpy(),
                     launch_end_ns=np.where(via_end, by_end["end_ns"], src["id"].map(before["end_ns"])))  # fmt: skip
    # the arrow lands on the activity's own ts; equal keys pair in order
    keyed = acts[["pid", "tid", "ts_us", "start_ns"]].assign(
        _k=acts.groupby(["pid", "tid", "ts_us"]).cumcount(), _row=acts.index
    )
    dst = dst.assign(_k=dst.groupby(["pid", "tid", "ts"]).cumcount())
    hit = keyed.merge(dst.rename(columns={"ts": "ts_us"}), on=["pid", "tid", "ts_us", "_k"], how="inner")
    hit = hit.merge(src[["id", "launch_ns", "launch_end_ns"]], on="id", how="left").set_index("_row")
    acts.loc[hit.index, "correlation"] = pd.to_numeric(hit["id"], errors="coerce")
    ok = hit["launch_ns"].notna() & (hit["launch_ns"] <= hit["start_ns"])
    acts.loc[hit.index[ok], "launch_ns"] = hit.loc[ok, "launch_ns"]
    acts.loc[hit.index[ok], "launch_end_ns"] = hit.loc[ok, "launch_end_ns"]
    return acts.astype(types)


def _v1_csv_details(path: Path, acts: pd.DataFrame) -> dict:
    """Grid, block, LDS and registers from the ``<base>.csv`` rocprof wrote beside the JSON, if any."""
    from overlapviz.ingest.rocprof_common import v1_base, is_v1
    from overlapviz.ingest.rocprof_csv import read_v1_csv

    csv_path = path.with_name(v1_base(path) + ".csv")
    if not csv_path.exists() or not is_v1(csv_path):
        return {}
    detail = read_v1_csv(csv_path).kernels.to_pandas(types_mapper=pd.ArrowDtype)
    keep = ["grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z", "regs_per_thread", "shared_mem_bytes",
            "sgprs", "accum_vgprs", "wave_size"]  # fmt: skip
    detail = detail.drop_duplicates(["start_ns", "end_ns"], keep=False)[["start_ns", "end_ns"] + keep]
    detail = detail.astype({c: "Int64" for c in ["start_ns", "end_ns"] + keep})
    kernel_rows = acts[["start_ns", "end_ns", "category"]].reset_index(drop=True)
    merged = kernel_rows.merge(detail, on=["start_ns", "end_ns"], how="left")
    mask = merged["category"] == "kernel"
    return {c: merged[c].where(mask) for c in keep}


# --- rocprofv3 JSON -----------------------------------------------------------------------


# the record fields read as numbers: each must be a JSON integer that fits int64
_V3_INT_FIELDS = frozenset(
    ["start_timestamp", "end_timestamp", "correlation_id.internal", "thread_id", "kind", "operation", "bytes",
     "dispatch_info.kernel_id", "dispatch_info.queue_id.handle", "dispatch_info.agent_id.handle",
     "dispatch_info.group_segment_size", "stream_id.handle", "src_agent_id.handle", "dst_agent_id.handle"]
    + [f"dispatch_info.{size}.{axis}" for size in ("workgroup_size", "grid_size") for axis in "xyz"]
)  # fmt: skip
_SYMBOL_INT_FIELDS = ("kernel_id", "arch_vgpr_count", "accum_vgpr_count", "sgpr_count")


def _name_bad_integer(records: list, where: str, what: str) -> None:
    """Raise naming the first record whose number field (``_V3_INT_FIELDS``) is not a JSON
    integer within int64; return when every one is."""
    for i, record in enumerate(records):
        for name in _V3_INT_FIELDS:
            value = record
            for part in name.split("."):
                value = value.get(part) if isinstance(value, dict) else None
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int):
                kind = "a boolean" if isinstance(value, bool) else "not an integer"
                raise ValueError(f"{where}: {what} record {i}: {name} = {value!r} is {kind}")
            if not -(2**63) <= value <= INT64_MAX:
                raise ValueError(f"{where}: {what} record {i}: {name} = {value} is outside the range of int64")


def _records(records: list, where: str = "", what: str = "record") -> pd.DataFrame:
    """Flatten a list of nested record dicts to columns (``dispatch_info.grid_size.x``...) through Arrow.

    The fields read as numbers (``_V3_INT_FIELDS``) must hold JSON integers within int64:
    a ``true``, a fraction, text or a number past int64 is refused, naming the record.
    """
    if not records:
        return pd.DataFrame()
    if not isinstance(records, list) or not all(isinstance(r, dict) for r in records):
        raise ValueError(f"{where}: {what} records are not a list of objects")
    try:
        arr = pa.array(records)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
        _name_bad_integer(records, where, what)  # the usual cause, named; else the generic message
        raise
    table = pa.Table.from_struct_array(arr)
    while any(pa.types.is_struct(t) for t in table.schema.types):
        table = table.flatten()
    for name, col in zip(table.column_names, table.columns):
        if name not in _V3_INT_FIELDS or col.type == pa.null() or col.type == pa.int64():
            continue
        valid = pc.is_valid(col)
        if pa.types.is_unsigned_integer(col.type):
            over = pc.fill_null(pc.greater(col, pa.scalar(INT64_MAX, col.type)), False)
            if not pc.any(over).as_py():
                continue
            i = int(pc.index(over, True).as_py())
            raise ValueError(f"{where}: {what} record {i}: {name} = {col[i].as_py()} is outside the range of int64")
        if pa.types.is_integer(col.type):
            continue
        i = int(pc.index(valid, True).as_py())
        kind = "a boolean" if pa.types.is_boolean(col.type) else "not an integer"
        raise ValueError(f"{where}: {what} record {i}: {name} = {col[i].as_py()!r} is {kind}")
    return table.to_pandas(types_mapper={pa.int64(): pd.Int64Dtype(), pa.uint64(): pd.Int64Dtype()}.get)


def _col(frame: pd.DataFrame, *names: str):
    for n in names:
        if n in frame:
            return frame[n]
    return None


def read_v3_json(path: Path) -> list[RankTrace]:
    """rocprofv3 JSON: one RankTrace per ``rocprofiler-sdk-tool`` entry (one per profiled process).

    Kernels from ``buffer_records.kernel_dispatch`` joined to ``kernel_symbols`` (name:
    the formatted name, as rocprofv3's CSV writes it; VGPR/AGPR/SGPR counts), copies from
    ``memory_copy``, ``launch_ns`` from ``hip_api`` records with the same internal
    correlation id, ``collective`` from ``rccl_api`` records, devices from ``agents``
    (device index = the agent's GPU index). Grid sizes are work-items and become
    blocks. Stream = ``stream_id`` when records carry a non-zero one, else the queue.
    """
    doc = load_json(path)
    tools = doc.get("rocprofiler-sdk-tool") if isinstance(doc, dict) else None
    if isinstance(tools, dict):
        tools = [tools]
    if not isinstance(tools, list) or not tools:
        raise ValueError(f"{path}: no rocprofiler-sdk-tool entries (not a rocprofv3 JSON)")
    out = [_v3_process(path, tool, i) for i, tool in enumerate(tools)]
    return out


def _v3_process(path: Path, tool: dict, index: int) -> RankTrace:
    where = f"{path} (process {index})"
    meta = tool.get("metadata") or {}
    buffers = tool.get("buffer_records") or {}
    strings = tool.get("strings") or {}
    kinds = strings.get("buffer_records") or []
    kind_ops = {i: (k.get("kind"), k.get("operations") or []) for i, k in enumerate(kinds)}

    # operation names by (kind, operation): one small table, joined to the records
    ops = pd.DataFrame(
        [(k, o, name) for k, (_, names) in kind_ops.items() for o, name in enumerate(names)],
        columns=["kind", "operation", "op_name"],
    ).astype({"kind": "Int64", "operation": "Int64"})

    def op_names(frame: pd.DataFrame) -> pd.Series:
        keys = frame[["kind", "operation"]].astype("Int64")
        found = keys.merge(ops, on=["kind", "operation"], how="left")["op_name"]
        return pd.Series(found.to_numpy(dtype=object), index=frame.index)

    agents = [a for a in tool.get("agents") or [] if isinstance(a, dict)]
    gpu_agents = [a for a in agents if a.get("type") == 2]
    device_of: dict[int, int] = {}
    rows = []
    for order, a in enumerate(sorted(gpu_agents, key=lambda a: a.get("logical_node_id", 0))):
        idx = a.get("gpu_index")
        idx = idx if isinstance(idx, int) and idx >= 0 else a.get("logical_node_type_id", order)
        device_of[int((a.get("id") or {}).get("handle", -1))] = int(idx)
        rows.append(amd_device_row(int(idx), a))

    def devices(handles: pd.Series | None) -> pd.Series | None:
        if handles is None:
            return None
        return handles.astype("Int64").map(device_of).astype("Int64")

    try:
        api = _records(buffers.get("hip_api") or [], where, "hip_api")
        rccl = _records(buffers.get("rccl_api") or [], where, "rccl_api")
        disp = _records(buffers.get("kernel_dispatch") or [], where, "kernel_dispatch")
        copies = _records(buffers.get("memory_copy") or [], where, "memory_copy")
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as exc:
        if str(exc).startswith(where):
            raise
        raise ValueError(f"{where}: malformed buffer records: {exc}") from None
    hip = None
    if not api.empty:
        hip = pd.DataFrame({"function": op_names(api), "correlation": api["correlation_id.internal"],
                            "api_start_ns": api["start_timestamp"], "api_end_ns": api.get("end_timestamp")})  # fmt: skip
    calls = None
    if not rccl.empty:
        calls = pd.DataFrame({"function": op_names(rccl), "correlation": rccl["correlation_id.internal"],
                              "thread_id": rccl.get("thread_id")})  # fmt: skip
    from overlapviz.ingest.rocprof_csv import launch_end_times, launch_times

    tables = []
    if not disp.empty:
        for c in ("start_timestamp", "end_timestamp", "dispatch_info.kernel_id"):
            if c not in disp:
                raise ValueError(f"{where}: kernel_dispatch records lack {c}")
        _check(where, disp, "kernel dispatch")
        symbols = tool.get("kernel_symbols") or []
        symbols = list(symbols.values()) if isinstance(symbols, dict) else symbols
        if not isinstance(symbols, list) or not all(isinstance(sym, dict) for sym in symbols):
            raise ValueError(f"{where}: kernel_symbols is not a list of objects")
        symbols = pd.DataFrame(symbols)
        for c in _SYMBOL_INT_FIELDS:
            if c in symbols:
                symbols[c] = [parse_int(v, where=where, field=c, place=f"kernel_symbols entry {i}")
                              for i, v in enumerate(symbols[c].astype(object).where(symbols[c].notna(), None))]  # fmt: skip
        if symbols.empty or "kernel_id" not in symbols:
            raise ValueError(f"{where}: kernel_dispatch records but no kernel_symbols")
        symbols = symbols.drop_duplicates("kernel_id").set_index("kernel_id")
        sym_name = symbols.get("formatted_kernel_name", pd.Series(dtype=object)).replace("", pd.NA)
        for alt in ("demangled_kernel_name", "kernel_name"):
            if alt in symbols:
                sym_name = sym_name.fillna(symbols[alt].replace("", pd.NA))
        kid = disp["dispatch_info.kernel_id"]
        unknown = ~kid.isin(symbols.index)
        if unknown.any():
            raise ValueError(f"{where}: kernel_dispatch names kernel_id {kid[unknown].iloc[0]} not in kernel_symbols")
        names = clean_kernel_names(kid.map(sym_name).astype(str))
        stream = _col(disp, "dispatch_info.queue_id.handle")
        sid = _col(disp, "stream_id.handle")
        if sid is not None and (sid.fillna(0) != 0).any():
            stream = sid
        cols = {
            "device": devices(_col(disp, "dispatch_info.agent_id.handle")),
            "stream": stream,
            "correlation": disp["correlation_id.internal"],
            "name": names,
            "category": ["kernel"] * len(disp),
            "is_host": [False] * len(disp),
            "start_ns": disp["start_timestamp"],
            "end_ns": disp["end_timestamp"],
            "shared_mem_bytes": _col(disp, "dispatch_info.group_segment_size"),
            "regs_per_thread": kid.map(symbols.get("arch_vgpr_count", pd.Series(dtype=object))).astype("Int64"),
            "accum_vgprs": kid.map(symbols.get("accum_vgpr_count", pd.Series(dtype=object))).astype("Int64"),
            "sgprs": kid.map(symbols.get("sgpr_count", pd.Series(dtype=object))).astype("Int64"),
            "launch_ns": launch_times(disp["correlation_id.internal"], disp["start_timestamp"], hip),
            "launch_end_ns": launch_end_times(disp["correlation_id.internal"], disp["start_timestamp"], hip),
            "source_format": ["rocprof_v3_json"] * len(disp),
        }
        for axis in "xyz":
            wg = _col(disp, f"dispatch_info.workgroup_size.{axis}")
            gr = _col(disp, f"dispatch_info.grid_size.{axis}")
            cols[f"block_{axis}"] = wg
            cols[f"grid_{axis}"] = blocks(gr, wg) if gr is not None and wg is not None else None
        frame = pd.DataFrame({"name": names, "correlation": disp["correlation_id.internal"],
                              "thread_id": disp.get("thread_id")})  # fmt: skip
        cols["collective"] = assign_collectives(frame, calls)
        tables.append(kernel_table({k: v for k, v in cols.items() if v is not None}, where=where))
    if not copies.empty:
        _check(where, copies, "memory copy")
        direction = op_names(copies)
        src = devices(_col(copies, "src_agent_id.handle"))
        dst = devices(_col(copies, "dst_agent_id.handle"))
        device = dst.where(direction.str.contains("HOST_TO_DEVICE", na=False), src) if src is not None else None
        cols = {
            "device": device,
            "stream": _col(copies, "stream_id.handle"),
            "correlation": copies["correlation_id.internal"],
            "name": direction.fillna("MEMORY_COPY"),
            "category": ["gpu_memcpy"] * len(copies),
            "is_host": [False] * len(copies),
            "start_ns": copies["start_timestamp"],
            "end_ns": copies["end_timestamp"],
            "bytes": _col(copies, "bytes"),
            "launch_ns": launch_times(copies["correlation_id.internal"], copies["start_timestamp"], hip),
            "launch_end_ns": launch_end_times(copies["correlation_id.internal"], copies["start_timestamp"], hip),
            "source_format": ["rocprof_v3_json"] * len(copies),
        }
        tables.append(kernel_table({k: v for k, v in cols.items() if v is not None}, where=where))
    if not tables:
        raise ValueError(f"{where}: no kernel_dispatch or memory_copy records (was kernel tracing on?)")
    pid = meta.get("pid")
    config = meta.get("config") or {}
    return RankTrace(
        rank=rank_from_name(str(config.get("output_file", "")), path.name),
        kernels=pa.concat_tables(tables),
        devices=device_table(rows, where=where),
        info={
            "pid": pid if type(pid) is int else None,
            "host": (meta.get("node") or {}).get("hostname"),
            "source_path": str(path),
            "source_format": "rocprof_v3_json",
            "base_time_ns": 0,
            "n_events": len(disp) + len(copies) + len(api) + len(rccl),
        },
    )


def _check(where: str, frame: pd.DataFrame, what: str) -> None:
    start, end = frame["start_timestamp"], frame["end_timestamp"]
    if start.isna().any() or end.isna().any():
        raise ValueError(f"{where}: a {what} record has no start/end timestamp")
    bad = (end < start).to_numpy().nonzero()[0]
    if len(bad):
        raise ValueError(f"{where}: {what} record {bad[0]} ends before it starts (negative duration)")
