"""rocprof text outputs: legacy v1 ``results.csv``, rocprofv3 CSV directories, rocprofv2 ``cli`` text."""

from __future__ import annotations

import csv
import io
import re
from pathlib import Path

import pandas as pd

from overlapviz.ingest.base import RankTrace, rank_from_name
from overlapviz.ingest.rocprof_common import (
    amd_device_row,
    assign_collectives,
    blocks,
    check_one_generation,
    ones_where,
    clean_kernel_names,
    csv_line,
    device_table,
    kernel_table,
    parse_ints,
    v3_csv_role,
    v3_group,
)

# host calls that enqueue GPU work: the only API records a kernel's or copy's correlation may join to
LAUNCH_FUNCTIONS = r"(?i)launch|memcpy|memset|copy|fill|graphlaunch"


# --- CSV plumbing ---------------------------------------------------------------------


def _header(path: Path) -> list[str]:
    try:
        with open(path, newline="", encoding="utf-8-sig") as f:
            first = f.readline()
    except OSError as exc:
        raise ValueError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not a text CSV file") from None
    if not first.strip():
        raise ValueError(f"{path}: empty file (no CSV header)")
    return next(csv.reader([first]))


def read_csv(path: Path, *, ints: list[str], strings: list[str], check_complete: bool = True) -> pd.DataFrame:
    """Read the named columns of a rocprof CSV, exactly (int64 ns, never through float).

    Columns missing from the header are simply absent from the result. Integer
    columns come back as nullable ``Int64``; string columns as ``string``.

    Raises
    ------
    ValueError
        Naming ``path`` for an unreadable file, a non-integer value in an integer column,
        or a truncated file (a last line with missing fields or no final newline).
    """
    header = _header(path)
    last = header[-1]
    use = [c for c in dict.fromkeys(ints + strings + ([last] if check_complete else [])) if c in header]
    dtype = {c: "Int64" for c in ints if c in use} | {c: "string" for c in use if c not in ints}
    try:
        frame = _read(path, use, dtype)
    except (ValueError, TypeError, OverflowError) as exc:
        # a value the fast parse refused (text, a fraction, past int64): find and name it
        _name_bad_integer(path, use, [c for c in ints if c in use])
        msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ValueError(f"{path}: malformed CSV: {msg}") from None
    if check_complete and len(frame):
        bad = frame[last].isna().to_numpy().nonzero()[0]
        if len(bad):
            raise ValueError(f"{path}: line {bad[0] + 2} has missing fields (truncated file?)")
        with open(path, "rb") as f:
            f.seek(-1, 2)
            if f.read(1) != b"\n":
                raise ValueError(f"{path}: last line is cut off (truncated file?)")
    return frame


def _read(path: Path, use: list[str], dtype: dict) -> pd.DataFrame:
    try:
        return pd.read_csv(
            path,
            usecols=use,
            dtype=dtype,
            keep_default_na=False,
            na_values={c: [""] for c in use},
            encoding="utf-8-sig",
            engine="c",
        )
    except (pd.errors.ParserError, UnicodeDecodeError, OSError, MemoryError) as exc:
        msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ValueError(f"{path}: malformed CSV: {msg}") from None


def _name_bad_integer(path: Path, use: list[str], ints: list[str]) -> None:
    """Raise naming the line and column of the first value of ``ints`` that is not an int64 (if any)."""
    frame = _read(path, use, {c: "string" for c in use})
    for c in ints:
        parse_ints(frame[c], where=f"{path}: malformed CSV", field=c, row=csv_line)


def _require(path: Path, header: list[str], columns: list[str], what: str) -> None:
    missing = [c for c in columns if c not in header]
    if missing:
        shown = ",".join(header[:6]) + ("..." if len(header) > 6 else "")
        raise ValueError(f"{path}: unknown {what} header (no {missing[0]} column; header starts {shown})")


def _check_times(path: Path, start: pd.Series, end: pd.Series, what: str) -> None:
    if start.isna().any() or end.isna().any():
        i = int((start.isna() | end.isna()).to_numpy().nonzero()[0][0])
        raise ValueError(f"{path}: {what} on line {i + 2} has no timestamp")
    neg = (end < start).to_numpy().nonzero()[0]
    if len(neg):
        raise ValueError(f"{path}: {what} on line {neg[0] + 2} ends before it starts (negative duration)")


def _first(frame: pd.DataFrame, *names: str) -> pd.Series | None:
    for n in names:
        if n in frame:
            return frame[n]
    return None


# --- legacy rocprof v1 results.csv -----------------------------------------------------------

V1_INTS = ["gpu-id", "queue-id", "pid", "tid", "grd", "wgr", "lds", "arch_vgpr", "vgpr", "accum_vgpr", "sgpr",
           "wave_size", "BeginNs", "EndNs", "Correlation_ID"]  # fmt: skip


def read_v1_csv(path: Path) -> RankTrace:
    """Legacy rocprof ``results.csv``: one row per kernel dispatch, ns timestamps, grid in work-items.

    ``grd``/``wgr`` are total work-items and work-group size (products over the three
    dimensions), so the grid is stored as ``grid_x = ceil(grd / wgr)`` blocks with
    ``grid_y = grid_z = 1`` and ``block_x = wgr``. ``lds`` is LDS bytes per
    work-group, ``arch_vgpr`` (``vgpr`` in older versions) VGPRs per work-item.
    Stream = ``queue-id`` (v1 has no HIP stream ids); device = ``gpu-id``.
    """
    check_one_generation(path)
    header = _header(path)
    _require(path, header, ["KernelName", "BeginNs", "EndNs"], "rocprof results.csv")
    d = read_csv(path, ints=V1_INTS, strings=["KernelName"])
    _check_times(path, d["BeginNs"], d["EndNs"], "kernel")
    wgr = _first(d, "wgr")
    grid = blocks(d["grd"], wgr) if "grd" in d and wgr is not None else None
    cols = {
        "device": _first(d, "gpu-id"),
        "stream": _first(d, "queue-id"),
        "correlation": _first(d, "Correlation_ID"),
        "name": clean_kernel_names(d["KernelName"]),
        "category": ["kernel"] * len(d),
        "is_host": [False] * len(d),
        "start_ns": d["BeginNs"],
        "end_ns": d["EndNs"],
        "grid_x": grid,
        "grid_y": ones_where(grid),
        "grid_z": ones_where(grid),
        "block_x": wgr,
        "block_y": ones_where(wgr),
        "block_z": ones_where(wgr),
        "regs_per_thread": _first(d, "arch_vgpr", "vgpr"),
        "shared_mem_bytes": _first(d, "lds"),
        "sgprs": _first(d, "sgpr"),
        "accum_vgprs": _first(d, "accum_vgpr"),
        "wave_size": _first(d, "wave_size"),
        "source_format": ["rocprof_v1_csv"] * len(d),
    }
    kernels = kernel_table({k: v for k, v in cols.items() if v is not None}, where=str(path), row=csv_line)
    devices = _v1_sysinfo_devices(path)
    if not devices and "gpu-id" in d:
        for dev, waves in d.groupby("gpu-id")["wave_size"] if "wave_size" in d else d.groupby("gpu-id")["gpu-id"]:
            sizes = waves.dropna().unique() if "wave_size" in d else []
            wave = int(sizes[0]) if len(sizes) == 1 else None
            devices.append({"device": int(dev), "vendor": "amd", "warp_size": wave})
    pids = d["pid"].dropna().unique() if "pid" in d else []
    return RankTrace(
        rank=rank_from_name(path.parent.name),
        kernels=kernels,
        devices=device_table(devices, where=str(path)),
        info={
            "pid": int(pids[0]) if len(pids) == 1 else None,
            "source_path": str(path),
            "source_format": "rocprof_v1_csv",
            "base_time_ns": 0,
            "n_events": len(d),
        },
    )


def _v1_sysinfo_devices(path: Path) -> list[dict]:
    """Device rows from the rocminfo dump rocprof v1 writes beside its CSV (``<base>.sysinfo.txt``).

    GPU agents in rocminfo order are HIP devices 0, 1, ... (rocprof's ``gpu-id``).
    """
    from overlapviz.ingest.rocprof_common import v1_base, parse_rocminfo, rocminfo_agents

    sysinfo = path.with_name(v1_base(path) + ".sysinfo.txt")
    if not sysinfo.exists():
        return []
    try:
        text = sysinfo.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise ValueError(f"{sysinfo}: cannot read: {exc.strerror or exc}") from None
    return [amd_device_row(i, a) for i, a in enumerate(rocminfo_agents(parse_rocminfo(text)))]


# --- rocprofv3 CSV ------------------------------------------------------------------


V3_KERNEL_INTS = ["Queue_Id", "Stream_Id", "Thread_Id", "Correlation_Id", "Start_Timestamp", "End_Timestamp",
                  "Group_Segment_Size", "LDS_Block_Size", "LDS_Size", "VGPR_Count", "Arch_VGPR_Count",
                  "Accum_VGPR_Count", "SGPR_Count", "Workgroup_Size_X", "Workgroup_Size_Y", "Workgroup_Size_Z",
                  "Grid_Size_X", "Grid_Size_Y", "Grid_Size_Z", "Workgroup_Size", "Grid_Size"]  # fmt: skip


def _agent_numbers(path: Path, values: pd.Series, column: str) -> pd.DataFrame:
    """``"Agent 4"`` / ``"GPU 0"`` / ``"4"`` -> (kind, number); kind is ``gpu`` for type-relative ids."""
    parts = values.str.extract(r"^\s*(?:(Agent|GPU|CPU)\s*)?([0-9]+)\s*$", flags=re.IGNORECASE)
    bad = values.notna() & parts[1].isna()
    if bad.any():
        i = int(bad.to_numpy().nonzero()[0][0])
        raise ValueError(f"{path}: {csv_line(i)}: {column} {values[bad].iloc[0]!r} is not an agent id")
    number = parse_ints(parts[1], where=str(path), field=column, row=csv_line)
    return pd.DataFrame({"kind": parts[0].str.lower(), "number": number.set_axis(values.index)})


def _read_agent_info(path: Path | None) -> tuple[dict[int, int], list[dict]]:
    """Map rocprofv3 agent numbers (logical and absolute node ids) to HIP device index, and device rows."""
    if path is None:
        return {}, []
    header = _header(path)
    _require(path, header, ["Node_Id", "Agent_Type"], "rocprofv3 agent_info")
    frame = read_csv(path, ints=[], strings=header, check_complete=False)
    gpus = frame[frame["Agent_Type"].str.upper() == "GPU"]
    order = "Logical_Node_Id" if "Logical_Node_Id" in gpus else "Node_Id"
    gpus = gpus.assign(_o=pd.to_numeric(gpus[order], errors="coerce")).sort_values("_o")
    mapping, rows = {}, []
    for index, (_, rec) in enumerate(gpus.iterrows()):  # one row per agent: a handful
        for key in ("Node_Id", "Logical_Node_Id"):
            if key in rec and pd.notna(rec[key]) and str(rec[key]).strip().isdigit():
                mapping.setdefault(int(rec[key]), index)
        rows.append(amd_device_row(index, {k: (None if pd.isna(v) else v) for k, v in rec.items()}))
    return mapping, rows


def _devices_of(agents: pd.DataFrame, mapping: dict[int, int]) -> pd.Series:
    gpu_relative = agents["kind"] == "gpu"
    mapped = agents["number"].map(lambda n: mapping.get(int(n), n) if pd.notna(n) else pd.NA)
    return pd.Series(agents["number"].where(gpu_relative, mapped), dtype="Int64")


def _read_api(paths: list[Path]) -> pd.DataFrame | None:
    frames = []
    for p in paths:
        header = _header(p)
        _require(p, header, ["Function", "Correlation_Id", "Start_Timestamp"], "rocprofv3 API trace")
        frames.append(
            read_csv(p, ints=["Thread_Id", "Correlation_Id", "Start_Timestamp", "End_Timestamp"],
                     strings=["Domain", "Function"])  # fmt: skip
        )
    if not frames:
        return None
    api = pd.concat(frames, ignore_index=True)
    return api.rename(columns={"Function": "function", "Correlation_Id": "correlation", "Thread_Id": "thread_id",
                               "Start_Timestamp": "api_start_ns", "End_Timestamp": "api_end_ns",
                               "Domain": "domain"})  # fmt: skip


def launch_times(correlation: pd.Series, start_ns: pd.Series, api: pd.DataFrame | None) -> pd.Series:
    """Start of the host call that enqueued each activity, joined by correlation id; null where unknown.

    Only enqueueing calls (launch, memcpy, memset) that start no later than the
    activity count, so a correlation id that lands on an unrelated call (files from
    different runs) gives null rather than a wrong time.
    """
    return _launch_call(correlation, start_ns, api, "api_start_ns")


def launch_end_times(correlation: pd.Series, start_ns: pd.Series, api: pd.DataFrame | None) -> pd.Series:
    """End of the host call :func:`launch_times` finds (the API record's end timestamp); null
    where that call is unknown or the record has no end."""
    return _launch_call(correlation, start_ns, api, "api_end_ns")


def _launch_call(correlation: pd.Series, start_ns: pd.Series, api: pd.DataFrame | None, column: str) -> pd.Series:
    out = pd.Series(pd.NA, index=correlation.index, dtype="Int64")
    if api is None or api.empty or column not in api:
        return out
    calls = api[api["function"].str.contains(LAUNCH_FUNCTIONS, regex=True, na=False)]
    calls = calls.dropna(subset=["correlation", "api_start_ns"]).drop_duplicates("correlation")
    wanted = ["correlation", "api_start_ns"] + ([column] if column != "api_start_ns" else [])
    found = pd.DataFrame({"correlation": correlation, "start": start_ns}).merge(calls[wanted], on="correlation", how="left")
    ok = found["api_start_ns"].notna() & (found["api_start_ns"] <= found["start"]) & found[column].notna()
    if column != "api_start_ns":
        ok &= found[column].fillna(-1) >= found["api_start_ns"].fillna(0)
    return pd.Series(found[column].where(ok, pd.NA).to_numpy(), index=correlation.index, dtype="Int64")


def read_v3_csv(path: Path) -> RankTrace:
    """One process's rocprofv3 CSV output: kernel trace + memory copy trace (+ API traces, agent info).

    ``path`` is the ``<prefix>kernel_trace.csv`` (or, for a process without kernels,
    the ``<prefix>memory_copy_trace.csv``); the other files of the same prefix in
    its directory are read with it (see ``v3_group``). Grid sizes are work-items in
    rocprofv3 and become blocks per dimension. Stream = ``Stream_Id`` when the file
    has that column with any non-zero value, else ``Queue_Id``. ``launch_ns`` from
    HIP API records with the same ``Correlation_Id``; ``collective`` from RCCL API
    records (``assign_collectives``).
    """
    check_one_generation(path)
    group = v3_group(path) or {"kernel_trace": path}
    mapping, device_rows = _read_agent_info(group.get("agent_info"))
    api = _read_api([p for role, p in group.items() if role.startswith(("hip", "rccl")) and role.endswith("_trace")])
    hip = api[~api["domain"].str.upper().str.startswith("RCCL")] if api is not None else None
    rccl = api[api["domain"].str.upper().str.startswith("RCCL")] if api is not None else None
    tables, n_events = [], 0
    if "kernel_trace" in group:
        kernels, n = _v3_kernels(group["kernel_trace"], mapping, hip, rccl)
        tables.append(kernels)
        n_events += n
    if "memory_copy_trace" in group:
        copies, n = _v3_copies(group["memory_copy_trace"], mapping, hip)
        tables.append(copies)
        n_events += n
    if not tables:
        raise ValueError(f"{path}: no rocprofv3 kernel or memory-copy trace for prefix of {path.name}")
    if n_events == 0:
        raise ValueError(f"{path}: no kernel dispatch or memory copy records")
    import pyarrow as pa

    prefix = v3_csv_role(path)[0] if v3_csv_role(path) else ""
    return RankTrace(
        rank=rank_from_name(prefix, path.parent.name),
        kernels=pa.concat_tables(tables),
        devices=device_table(device_rows, where=str(path)),
        info={
            "pid": int(prefix) if prefix.isascii() and prefix.isdigit() and len(prefix) < 19 else None,
            "source_path": str(path),
            "source_format": "rocprof_v3_csv",
            "base_time_ns": 0,
            "n_events": n_events,
        },
    )


def _v3_kernels(path: Path, mapping: dict, hip, rccl):
    header = _header(path)
    _require(path, header, ["Agent_Id", "Kernel_Name", "Start_Timestamp", "End_Timestamp"], "rocprofv3 kernel trace")
    d = read_csv(path, ints=V3_KERNEL_INTS, strings=["Kind", "Agent_Id", "Kernel_Name"])
    _check_times(path, d["Start_Timestamp"], d["End_Timestamp"], "kernel dispatch")
    device = _devices_of(_agent_numbers(path, d["Agent_Id"], "Agent_Id"), mapping)
    stream = _first(d, "Queue_Id")
    if "Stream_Id" in d and (d["Stream_Id"].fillna(0) != 0).any():
        stream = d["Stream_Id"]
    dims = {}
    for axis in "XYZ":
        wg = _first(d, f"Workgroup_Size_{axis}")
        gr = _first(d, f"Grid_Size_{axis}")
        if wg is None and axis == "X":  # counter-collection style totals
            wg, gr = _first(d, "Workgroup_Size"), _first(d, "Grid_Size")
        dims[f"block_{axis.lower()}"] = wg
        dims[f"grid_{axis.lower()}"] = blocks(gr, wg) if gr is not None and wg is not None else None
    names = d["Kernel_Name"].fillna("")
    correlation = _first(d, "Correlation_Id")
    n = len(d)
    cols = {
        "device": device,
        "stream": stream,
        "correlation": correlation,
        "name": clean_kernel_names(names),
        "category": ["kernel"] * n,
        "is_host": [False] * n,
        "start_ns": d["Start_Timestamp"],
        "end_ns": d["End_Timestamp"],
        "regs_per_thread": _first(d, "VGPR_Count", "Arch_VGPR_Count"),
        "shared_mem_bytes": _first(d, "Group_Segment_Size", "LDS_Block_Size", "LDS_Size"),
        "sgprs": _first(d, "SGPR_Count"),
        "accum_vgprs": _first(d, "Accum_VGPR_Count"),
        "source_format": ["rocprof_v3_csv"] * n,
        **dims,
    }
    if correlation is not None:
        cols["launch_ns"] = launch_times(correlation, d["Start_Timestamp"], hip)
        cols["launch_end_ns"] = launch_end_times(correlation, d["Start_Timestamp"], hip)
    frame = pd.DataFrame({"name": cols["name"], "correlation": correlation if correlation is not None else pd.NA})
    if "Thread_Id" in d:
        frame["thread_id"] = d["Thread_Id"]
    cols["collective"] = assign_collectives(frame, rccl)
    return kernel_table({k: v for k, v in cols.items() if v is not None}, where=str(path), row=csv_line), n


def _v3_copies(path: Path, mapping: dict, hip):
    header = _header(path)
    _require(path, header, ["Direction", "Start_Timestamp", "End_Timestamp"], "rocprofv3 memory copy trace")
    d = read_csv(
        path,
        ints=["Stream_Id", "Correlation_Id", "Start_Timestamp", "End_Timestamp", "Size", "Bytes", "Copy_Bytes"],
        strings=["Direction", "Source_Agent_Id", "Destination_Agent_Id"],
    )
    _check_times(path, d["Start_Timestamp"], d["End_Timestamp"], "memory copy")
    direction = d["Direction"].fillna("")
    # the GPU side of the copy: destination for host-to-device, else the source
    to_device = direction.str.contains("HOST_TO_DEVICE", na=False)
    host_only = direction.str.contains("HOST_TO_HOST", na=False)
    device = pd.Series(pd.NA, index=d.index, dtype="Int64")
    if "Source_Agent_Id" in d and "Destination_Agent_Id" in d:
        src = _devices_of(_agent_numbers(path, d["Source_Agent_Id"], "Source_Agent_Id"), mapping)
        dst = _devices_of(_agent_numbers(path, d["Destination_Agent_Id"], "Destination_Agent_Id"), mapping)
        device = src.where(~to_device, dst).where(~host_only, pd.NA)
    correlation = _first(d, "Correlation_Id")
    n = len(d)
    cols = {
        "device": device,
        "stream": _first(d, "Stream_Id"),
        "correlation": correlation,
        "name": direction,
        "category": ["gpu_memcpy"] * n,
        "is_host": [False] * n,
        "start_ns": d["Start_Timestamp"],
        "end_ns": d["End_Timestamp"],
        "bytes": _first(d, "Size", "Bytes", "Copy_Bytes"),
        "source_format": ["rocprof_v3_csv"] * n,
    }
    if correlation is not None:
        cols["launch_ns"] = launch_times(correlation, d["Start_Timestamp"], hip)
        cols["launch_end_ns"] = launch_end_times(correlation, d["Start_Timestamp"], hip)
    return kernel_table({k: v for k, v in cols.items() if v is not None}, where=str(path), row=csv_line), n


# --- rocprofv2 file plugin CSV -------------------------------------------------------------

V2_CSV_INTS = ["Dispatch_ID", "GPU_ID", "Queue_ID", "PID", "TID", "Grid_Size", "Workgroup_Size", "LDS_Per_Workgroup",
               "Arch_VGPR", "Accum_VGPR", "SGPR", "Wave_Size", "Start_Timestamp", "End_Timestamp", "Correlation_ID"]


def read_v2_csv(path: Path) -> RankTrace:
    """rocprofv2's file plugin kernel trace (``results_<pid>.csv``): one row per dispatch.

    ``Grid_Size``/``Workgroup_Size`` are work-items (stored as ``ceil(grid / wg)`` blocks),
    ``LDS_Per_Workgroup`` LDS bytes, ``Arch_VGPR``/``Accum_VGPR`` per work-item, ``SGPR``
    per wave; names lose rocprofv2's `` (.kd)`` suffix. Times are ns. ``Correlation_ID`` 0
    means none (the file has no API records to take launch times from). Stream =
    ``Queue_ID``, device = ``GPU_ID``.
    """
    header = _header(path)
    _require(path, header, ["Kernel_Name", "Start_Timestamp", "End_Timestamp"], "rocprofv2 results CSV")
    d = read_csv(path, ints=V2_CSV_INTS, strings=["Kernel_Name"])
    _check_times(path, d["Start_Timestamp"], d["End_Timestamp"], "kernel dispatch")
    wg = _first(d, "Workgroup_Size")
    grid = blocks(d["Grid_Size"], wg) if "Grid_Size" in d and wg is not None else None
    correlation = _first(d, "Correlation_ID")
    n = len(d)
    cols = {
        "device": _first(d, "GPU_ID"),
        "stream": _first(d, "Queue_ID"),
        "correlation": correlation.where(correlation != 0, pd.NA) if correlation is not None else None,
        "name": clean_kernel_names(d["Kernel_Name"]),
        "category": ["kernel"] * n,
        "is_host": [False] * n,
        "start_ns": d["Start_Timestamp"],
        "end_ns": d["End_Timestamp"],
        "grid_x": grid,
        "grid_y": ones_where(grid),
        "grid_z": ones_where(grid),
        "block_x": wg,
        "block_y": ones_where(wg),
        "block_z": ones_where(wg),
        "regs_per_thread": _first(d, "Arch_VGPR"),
        "accum_vgprs": _first(d, "Accum_VGPR"),
        "sgprs": _first(d, "SGPR"),
        "shared_mem_bytes": _first(d, "LDS_Per_Workgroup"),
        "wave_size": _first(d, "Wave_Size"),
        "source_format": ["rocprof_v2_csv"] * n,
    }
    devices = []
    if "GPU_ID" in d:
        for dev in sorted(d["GPU_ID"].dropna().unique().tolist()):
            waves = d.loc[d["GPU_ID"] == dev, "Wave_Size"].dropna().unique() if "Wave_Size" in d else []
            devices.append({"device": int(dev), "vendor": "amd", "warp_size": int(waves[0]) if len(waves) == 1 else None})
    pids = d["PID"].dropna().unique() if "PID" in d else []
    return RankTrace(
        rank=rank_from_name(path.parent.name),
        kernels=kernel_table({k: v for k, v in cols.items() if v is not None}, where=str(path), row=csv_line),
        devices=device_table(devices, where=str(path)),
        info={
            "pid": int(pids[0]) if len(pids) == 1 else None,
            "source_path": str(path),
            "source_format": "rocprof_v2_csv",
            "base_time_ns": 0,
            "n_events": n,
        },
    )


# --- rocprofv2 cli plugin text -------------------------------------------------------------

_V2_FIELD = re.compile(r'(\w+)\(("(?:[^"\\]|\\.)*"|[^()]*(?:\([^()]*\)[^()]*)*)\)')


def read_v2_cli(path: Path) -> RankTrace:
    """rocprofv2's ``cli`` plugin output: ``Key(value), ...`` lines for dispatches and API calls.

    Kernel dispatch lines carry ``Begin_Timestamp``/``End_Timestamp`` (ns), grid and
    work-group sizes in work-items, LDS, VGPR/SGPR counts and the wave size; API lines
    give ``launch_ns`` by ``Correlation_ID`` (0 means none). Other lines (banners,
    counter lists) are ignored. A file with API lines but no dispatch lines has nothing
    to analyse and is refused.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: cannot read: {exc}") from None
    dispatches, calls = [], []
    for number, line in enumerate(io.StringIO(text), start=1):  # line-oriented text: one parse per line
        if line.startswith("Dispatch_ID("):
            rec = {k: v.strip('"') for k, v in _V2_FIELD.findall(line)}
            if "Begin_Timestamp" not in rec or "End_Timestamp" not in rec or "Kernel_Name" not in rec:
                raise ValueError(f"{path}: dispatch on line {number} lacks Kernel_Name/Begin_Timestamp/End_Timestamp")
            rec["_line"] = number
            dispatches.append(rec)
        elif line.startswith("Domain("):
            calls.append({k: v for k, v in _V2_FIELD.findall(line)})
    if not dispatches:
        what = "only API records" if calls else "no rocprofv2 records"
        raise ValueError(f"{path}: rocprofv2 cli output with no kernel dispatch lines ({what}); nothing to ingest")
    d = pd.DataFrame(dispatches)

    lines = d["_line"].tolist()

    def line(i: int) -> str:
        return f"dispatch on line {lines[i]}"

    def ints(col):
        if col not in d:
            return None
        return parse_ints(d[col], where=str(path), field=col, row=line)

    start, end = ints("Begin_Timestamp"), ints("End_Timestamp")
    _check_times(path, start, end, "kernel dispatch")
    wg = ints("Workgroup_Size")
    grid = blocks(ints("Grid_Size"), wg) if "Grid_Size" in d and wg is not None else None
    correlation = ints("Correlation_ID")
    correlation = correlation.where(correlation != 0, pd.NA) if correlation is not None else None
    api = None
    if calls:
        c = pd.DataFrame(calls)
        if {"Function", "Correlation_ID", "Start_Timestamp"} <= set(c):
            def api_ints(col):
                return parse_ints(c[col], where=str(path), field=col, row=lambda i: f"API record {i}")

            api = pd.DataFrame(
                {"function": c["Function"], "correlation": api_ints("Correlation_ID"),
                 "api_start_ns": api_ints("Start_Timestamp")}  # fmt: skip
            )
            if "End_Timestamp" in c:
                api["api_end_ns"] = api_ints("End_Timestamp")
    n = len(d)
    cols = {
        "device": ints("GPU_ID"),
        "stream": ints("Queue_ID"),
        "correlation": correlation,
        "name": clean_kernel_names(d["Kernel_Name"]),
        "category": ["kernel"] * n,
        "is_host": [False] * n,
        "start_ns": start,
        "end_ns": end,
        "grid_x": grid,
        "grid_y": ones_where(grid),
        "grid_z": ones_where(grid),
        "block_x": wg,
        "block_y": ones_where(wg),
        "block_z": ones_where(wg),
        "regs_per_thread": ints("Arch_VGPR"),
        "accum_vgprs": ints("Accumulative_VGPR"),
        "sgprs": ints("SGPR"),
        "shared_mem_bytes": ints("LDS"),
        "wave_size": ints("Wave_Size"),
        "source_format": ["rocprof_v2_cli"] * n,
    }
    if correlation is not None:
        cols["launch_ns"] = launch_times(correlation, start, api)
        cols["launch_end_ns"] = launch_end_times(correlation, start, api)
    pids = d["Process_ID"].unique() if "Process_ID" in d else []
    return RankTrace(
        rank=rank_from_name(path.name),
        kernels=kernel_table({k: v for k, v in cols.items() if v is not None}, where=str(path), row=line),
        info={
            "pid": int(pids[0]) if len(pids) == 1 and str(pids[0]).isascii() and str(pids[0]).isdigit() else None,
            "source_path": str(path),
            "source_format": "rocprof_v2_cli",
            "base_time_ns": 0,
            "n_events": n + len(calls),
        },
    )
