"""rocprofv3's rocpd SQLite output (``--output-format rocpd``, ``<pid>_results.db``; ROCm 7.0+) as a reader.

rocpd schema 3 (rocprofiler-sdk 1.0, ROCm 7.0) writes every table once per profiled process
as ``rocpd_<table>_<uuid>`` (the process's guid, ``-`` as ``_``); each row carries that
``guid`` and upstream joins on ``(id, guid)``. A merged database holds several guids, one
process each. The suffixed tables are read (all guids, ``UNION ALL``), not the convenience
views: the ``kernels`` view INNER JOINs event, region name, queue and thread rows and drops
a dispatch that lacks one. docs/nsys_rocpd.md maps every column. Not read: zero-length API
calls (stored as ``rocpd_sample`` rows whose track names only the category) and schema
3.0.4's ``rocpd_hip_event`` table.

What both SQLite readers share is in ``sqlite_common``.
"""

from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from overlapviz.ingest.base import RankTrace
from overlapviz.ingest.rocprof_common import amd_device_row, assign_collectives
from overlapviz.ingest.sqlite_common import (
    RANK_ENV,
    READER_DEVICE_SCHEMA,
    READER_STEP_SCHEMA,
    WORLD_SIZE_ENV,
    check_durations,
    columns_of,
    env_int,
    fetch,
    kernel_table,
    masked,
    np_int,
    open_readonly,
    quote,
    sniff_tables,
    step_rows,
    sync_kind,
    sync_table,
    table_names,
    with_syncs,
)
from overlapviz.schema import conform

SOURCE_FORMAT = "rocpd"
_UUID_SUFFIX = re.compile(r"_[0-9a-f]{8}_[0-9a-f]{4}_[0-9a-f]{4}_[0-9a-f]{4}_[0-9a-f]{12}", re.IGNORECASE)
_ACTIVITY_TABLES = ("rocpd_kernel_dispatch", "rocpd_memory_copy")
_CORE_TABLES = ("rocpd_string", "rocpd_info_node", "rocpd_info_process", "rocpd_info_agent", "rocpd_info_kernel_symbol",
                "rocpd_event", "rocpd_region", "rocpd_arg")  # fmt: skip


def _is_part(table: str, base: str) -> bool:
    """True when ``table`` is ``base`` with a guid suffix (``rocpd_event_0000..._19a2073d19ee``)."""
    return table.startswith(base) and _UUID_SUFFIX.fullmatch(table[len(base) :]) is not None


def _has(tables: set[str], base: str) -> bool:
    return base in tables or any(_is_part(t, base) for t in tables)


class RocpdReader:
    """rocprofv3 rocpd database: ``rocpd_kernel_dispatch`` / ``rocpd_memory_copy`` tables.

    The older rocmProfileData "RPD" format also names its tables ``rocpd_*`` (``rocpd_op``,
    ``rocpd_api``) but has neither of these, so it is not taken for this one.
    """

    name = SOURCE_FORMAT
    per_process = True  # one trace per process, like rocprof's: a process driving several GPUs is split

    def sniff(self, path: Path, head: bytes) -> bool:
        tables = sniff_tables(path, head)
        return any(_has(tables, t) for t in _ACTIVITY_TABLES)

    def read(self, path: Path) -> list[RankTrace]:
        return read_rocpd(path)


READERS = [RocpdReader()]


def read_rocpd(path: str | Path) -> list[RankTrace]:
    """Read every process (guid x pid) of a rocpd database that ran GPU work.

    Rank: the process's own ``RANK`` / ``OMPI_COMM_WORLD_RANK`` / ``PMI_RANK`` /
    ``PALS_RANKID`` / ``SLURM_PROCID`` (``rocpd_info_process.environment``) when every
    process of the file has a distinct one, else None (the ingest driver numbers ranks).

    Raises
    ------
    ValueError
        One line naming ``path``: not SQLite, truncated or corrupt, not rocpd, a kernel
        without its symbol, a negative duration.
    """
    path = Path(path)
    with open_readonly(path) as db:
        try:
            return _read(db, path)
        except sqlite3.Error as exc:
            raise ValueError(f"{path}: corrupt or unreadable SQLite database ({' '.join(str(exc).split())})") from None


class _Sources:
    """FROM-clause text per rocpd table: the union of its per-guid tables."""

    def __init__(self, db: sqlite3.Connection):
        self.db = db
        self.tables = table_names(db)
        self.real = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}

    def parts(self, base: str) -> list[str]:
        """The per-guid tables of ``base``; else ``base`` itself (a database without guid suffixes)."""
        return sorted(t for t in self.real if _is_part(t, base)) or ([base] if base in self.tables else [])

    def has(self, base: str) -> bool:
        return bool(self.parts(base))

    def __call__(self, base: str, columns: list[str]) -> str:
        """``(SELECT cols FROM t1 UNION ALL SELECT cols FROM t2 ...)``; absent columns as NULL."""
        selects = []
        for t in self.parts(base):
            have = set(columns_of(self.db, t))
            cols = ", ".join(f"{quote(c)}" if c in have else f"NULL AS {quote(c)}" for c in columns)
            selects.append(f"SELECT {cols} FROM {quote(t)}")
        return "(" + " UNION ALL ".join(selects) + ")"


def _read(db: sqlite3.Connection, path: Path) -> list[RankTrace]:
    src = _Sources(db)
    if not any(src.has(t) for t in _ACTIVITY_TABLES):
        raise ValueError(f"{path}: not a rocpd database (no rocpd_kernel_dispatch or rocpd_memory_copy table)")
    missing = [t for t in _CORE_TABLES if not src.has(t)]
    if missing:  # rocprofv3 creates every table of the schema, used or not
        raise ValueError(f"{path}: not a complete rocpd database (no {', '.join(missing)} table)")
    strings = _strings(db, src)
    agents = _agents(db, src, path)
    launch_names = {k for k, s in strings.items() if re.search(_LAUNCH_FUNCTIONS, s or "")}
    kernels = _kernels(db, src, strings, agents, launch_names, path)
    copies = _copies(db, src, strings, agents, launch_names, path)
    processes = _processes(db, src)

    lowest: dict[tuple[str, int], int] = {}  # process -> the lowest device it used
    for t in (kernels, copies):
        if t is not None:
            cols = (t.column(c).to_pylist() for c in ("guid", "pid", "device"))
            for g, p, d in zip(*cols):
                lowest[(g, p)] = min(lowest.get((g, p), 1 << 30), d if d is not None else 1 << 30)
    if not lowest:
        raise ValueError(f"{path}: the database holds no kernel dispatch or memory copy")
    keys = sorted(lowest, key=lambda k: (lowest[k], k[1], k[0]))
    env_ranks = [env_int(processes.get(k, {}).get("env", {}), RANK_ENV) for k in keys]
    use_env = all(r is not None for r in env_ranks) and len(set(env_ranks)) == len(env_ranks)
    api = _api_regions(db, src, strings)
    args = _stream_args(db, src)
    steps = _marker_steps(db, src, path)
    return [
        _process(key, rank if use_env else None, kernels, copies, processes.get(key, {}), agents, api, args, steps, path)
        for key, rank in zip(keys, env_ranks)
    ]


# --- tables ------------------------------------------------------------------------------

# the enqueueing HIP calls an activity's correlation may join to (as for rocprofv3 CSV)
_LAUNCH_FUNCTIONS = r"(?i)launch|memcpy|memset|copy|fill|graphlaunch"


def _strings(db: sqlite3.Connection, src: _Sources) -> dict[tuple[str, int], str]:
    table = src("rocpd_string", ["id", "guid", "string"])
    return {(g, i): s for i, g, s in db.execute(f"SELECT id, guid, string FROM {table}")}


def _agents(db: sqlite3.Connection, src: _Sources, path: Path) -> dict[tuple[str, int], dict]:
    """GPU agents by (guid, agent id): device index and DEVICES row."""
    out: dict[tuple[str, int], dict] = {}
    cols = ["id", "guid", "type", "absolute_index", "logical_index", "type_index", "name", "model_name",
            "vendor_name", "product_name", "extdata"]  # fmt: skip
    for row in db.execute(f"SELECT {', '.join(map(quote, cols))} FROM {src('rocpd_info_agent', cols)}"):
        a = dict(zip(cols, row))
        if str(a["type"] or "").upper() != "GPU":
            continue
        try:
            ext = json.loads(a["extdata"]) if a["extdata"] else {}
        except (TypeError, ValueError):
            raise ValueError(f"{path}: rocpd_info_agent {a['id']} has extdata that is not JSON") from None
        ext = ext if isinstance(ext, dict) else {}
        # the extdata is rocprofiler's agent record; the columns fill what it lacks
        record = {k: v for k, v in (("name", a["name"]), ("product_name", a["product_name"]),
                                    ("model_name", a["model_name"])) if v} | ext  # fmt: skip
        idx = ext.get("gpu_index")
        device = idx if isinstance(idx, int) and idx >= 0 else a["type_index"]
        out[(a["guid"], a["id"])] = {"device": device, "row": amd_device_row(device, record)}
    return out


def _kernels(db, src: _Sources, strings, agents, launch_names, path: Path) -> pa.Table | None:
    if not src.has("rocpd_kernel_dispatch"):
        return None
    kd = src("rocpd_kernel_dispatch", ["id", "guid", "pid", "tid", "agent_id", "kernel_id", "dispatch_id", "queue_id",
                                       "stream_id", "start", "end", "group_segment_size", "workgroup_size_x",
                                       "workgroup_size_y", "workgroup_size_z", "grid_size_x", "grid_size_y",
                                       "grid_size_z", "event_id"])  # fmt: skip
    joins, extra = _event_and_launch_joins(src, "K")
    ks = src("rocpd_info_kernel_symbol", ["id", "guid", "kernel_name", "display_name", "arch_vgpr_count",
                                           "accum_vgpr_count", "sgpr_count"])  # fmt: skip
    sym = f"LEFT JOIN {ks} S ON S.id = K.kernel_id AND S.guid = K.guid"
    sym_cols = ("S.display_name AS display_name, S.kernel_name AS kernel_name, S.arch_vgpr_count AS vgpr, "
                "S.accum_vgpr_count AS agpr, S.sgpr_count AS sgpr, S.id AS sym_id")  # fmt: skip
    sql = (
        f"SELECT K.guid AS guid, K.pid AS pid, K.tid AS tid, K.agent_id AS agent, K.kernel_id AS kernel_id, "
        f'K.queue_id AS queue, K.stream_id AS stream_id, K.start AS start_ns, K."end" AS end_ns, '
        f"K.group_segment_size AS lds, K.workgroup_size_x AS wx, K.workgroup_size_y AS wy, K.workgroup_size_z AS wz, "
        f"K.grid_size_x AS gx, K.grid_size_y AS gy, K.grid_size_z AS gz, {sym_cols}, {extra} "
        f"FROM {kd} K {sym} {joins} ORDER BY K.guid, K.start, K.id"
    )
    k = fetch(db, sql, {"guid": pa.string(), "display_name": pa.string(), "kernel_name": pa.string()})
    n = len(k["guid"])
    missing = np.flatnonzero(np.asarray(k["sym_id"].is_null()))
    if len(missing):
        raise ValueError(f"{path}: a kernel dispatch names kernel_id {k['kernel_id'][int(missing[0])].as_py()} "
                         f"that is not in rocpd_info_kernel_symbol ({len(missing)} such dispatches)")  # fmt: skip
    display = pc.if_else(pc.equal(k["display_name"], ""), pa.nulls(n, pa.string()), k["display_name"])
    name = pc.coalesce(display, k["kernel_name"])
    name = pc.replace_substring_regex(name, r"(?: \[clone \.kd\]|\.kd)$", "")  # as the rocprof readers name them
    check_durations(path, "kernel dispatch", np_int(k["start_ns"]), np_int(k["end_ns"]), name)
    cols = {
        "guid": k["guid"], "pid": k["pid"],
        "device": _device_of(k["guid"], k["agent"], agents),
        "queue": k["queue"], "stream_id": k["stream_id"],
        "correlation": k["corr"],
        "name": name,
        "category": pa.array(["kernel"] * n, pa.string()),
        "start_ns": k["start_ns"], "end_ns": k["end_ns"],
        "grid_x": _blocks(k["gx"], k["wx"]), "grid_y": _blocks(k["gy"], k["wy"]), "grid_z": _blocks(k["gz"], k["wz"]),
        "block_x": k["wx"], "block_y": k["wy"], "block_z": k["wz"],
        "regs_per_thread": k["vgpr"], "accum_vgprs": k["agpr"], "sgprs": k["sgpr"],
        "shared_mem_bytes": k["lds"],
        "bytes": pa.nulls(n, pa.int64()),
    }  # fmt: skip
    cols |= _launch_columns(k, launch_names)
    cols["launch_tid"] = pc.coalesce(cols["launch_tid"], k["tid"])  # the dispatching thread
    return pa.table(cols)


def _copies(db, src: _Sources, strings, agents, launch_names, path: Path) -> pa.Table | None:
    if not src.has("rocpd_memory_copy"):
        return None
    mc = src("rocpd_memory_copy", ["id", "guid", "pid", "tid", "start", "end", "name_id", "dst_agent_id",
                                   "src_agent_id", "size", "queue_id", "stream_id", "event_id"])  # fmt: skip
    joins, extra = _event_and_launch_joins(src, "K")
    sql = (
        f'SELECT K.guid AS guid, K.pid AS pid, K.tid AS tid, K.start AS start_ns, K."end" AS end_ns, '
        f"K.name_id AS name_id, K.dst_agent_id AS dst, K.src_agent_id AS src, K.size AS bytes, "
        f"K.queue_id AS queue, K.stream_id AS stream_id, {extra} FROM {mc} K {joins} ORDER BY K.guid, K.start, K.id"
    )
    m = fetch(db, sql, {"guid": pa.string()})
    n = len(m["guid"])
    guid = m["guid"].to_pylist()
    name = pa.array([strings.get((g, i)) or "MEMORY_COPY" for g, i in zip(guid, m["name_id"].to_pylist())], pa.string())
    check_durations(path, "memory copy", np_int(m["start_ns"]), np_int(m["end_ns"]), name)
    to_device = np.asarray(pc.fill_null(pc.match_substring(name, "HOST_TO_DEVICE"), False))
    # the GPU end of the copy: the destination of a host-to-device copy, else the source
    device = pc.if_else(pa.array(to_device), _device_of(m["guid"], m["dst"], agents),
                        _device_of(m["guid"], m["src"], agents))  # fmt: skip
    cols = {
        "guid": m["guid"], "pid": m["pid"], "device": device,
        "queue": m["queue"], "stream_id": m["stream_id"], "correlation": m["corr"],
        "name": name, "category": pa.array(["gpu_memcpy"] * n, pa.string()),
        "start_ns": m["start_ns"], "end_ns": m["end_ns"], "bytes": m["bytes"],
    }  # fmt: skip
    cols |= _launch_columns(m, launch_names)
    cols["launch_tid"] = pc.coalesce(cols["launch_tid"], m["tid"])
    return pa.table(cols)


def _event_and_launch_joins(src: _Sources, alias: str) -> tuple[str, str]:
    """JOINs from an activity to its event (internal correlation = ``stack_id``) and to the
    API region with that id (the launch call), and the columns they add."""
    ev = src("rocpd_event", ["id", "guid", "stack_id"])
    joins = f"LEFT JOIN {ev} E ON E.id = {alias}.event_id AND E.guid = {alias}.guid "
    rg = src("rocpd_region", ["id", "guid", "tid", "start", "name_id"])
    joins += f"LEFT JOIN {rg} R ON R.id = E.stack_id AND R.guid = {alias}.guid AND R.start <= {alias}.start"
    return joins, "E.stack_id AS corr, R.start AS launch_ns, R.tid AS launch_tid, R.name_id AS launch_name"


def _launch_columns(t: dict, launch_names: set) -> dict:
    """``launch_ns`` / ``launch_tid`` where the joined region is an enqueueing call."""
    ok = np.array([(g, i) in launch_names for g, i in zip(t["guid"].to_pylist(), t["launch_name"].to_pylist())], bool)
    ok &= np.asarray(t["launch_ns"].is_valid())
    return {
        "launch_ns": masked(np_int(t["launch_ns"]), ok),
        "launch_tid": masked(np_int(t["launch_tid"]), ok),
    }


def _device_of(guid: pa.Array, agent: pa.Array, agents: dict) -> pa.Array:
    found = [agents.get((g, a), {}).get("device") for g, a in zip(guid.to_pylist(), agent.to_pylist())]
    return pa.array(found, pa.int32())


def _blocks(work_items: pa.Array, workgroup: pa.Array) -> pa.Array:
    """ceil(work-items / work-group size); null where either is unknown or the size is 0."""
    g, w = np_int(work_items), np_int(workgroup)
    ok = np.asarray(work_items.is_valid()) & np.asarray(workgroup.is_valid()) & (w > 0)
    blocks = -(-g // np.where(ok, w, 1))
    big = ok & ((blocks > np.iinfo(np.int32).max) | (blocks < 0))
    if big.any():
        raise ValueError(f"kernel dispatch field grid (work-items / work-group size): {int(blocks[big][0])} blocks do not fit int32")
    return masked(blocks, ok, pa.int32())


def _processes(db, src: _Sources) -> dict[tuple[str, int], dict]:
    out: dict[tuple[str, int], dict] = {}
    nodes = src("rocpd_info_node", ["id", "guid", "hostname"])
    hosts = {(g, i): h for i, g, h in db.execute(f"SELECT id, guid, hostname FROM {nodes}")}
    cols = ["id", "guid", "nid", "pid", "environment"]
    for i, g, nid, pid, env in db.execute(f"SELECT {', '.join(cols)} FROM {src('rocpd_info_process', cols)}"):
        try:
            parsed = json.loads(env) if env else {}
        except (TypeError, ValueError):
            parsed = {}
        out[(g, i)] = {"pid": pid, "host": hosts.get((g, nid)), "env": parsed if isinstance(parsed, dict) else {}}
    return out


# --- API calls: collectives, syncs, steps ---------------------------------------------------


def _api_regions(db, src: _Sources, strings) -> dict[tuple[str, int], list[dict]]:
    """Synchronising HIP calls and RCCL calls per process (guid, pid), with their arguments."""
    wanted = {k: s for k, s in strings.items() if s and (sync_kind(s) or s.startswith(("nccl", "rccl")))}
    out: dict[tuple[str, int], list[dict]] = {}
    if not wanted:
        return out
    rg = src("rocpd_region", ["id", "guid", "pid", "tid", "start", "end", "name_id", "event_id"])
    ids = ", ".join(str(int(i)) for i in sorted({i for _, i in wanted}))
    rows = [
        r for r in db.execute(
            f"SELECT R.guid, R.pid, R.tid, R.id, R.start, R.\"end\", R.name_id, R.event_id FROM {rg} R "
            f"WHERE R.name_id IN ({ids}) ORDER BY R.guid, R.start, R.id"
        )
        if (r[0], r[6]) in wanted
    ]  # fmt: skip
    args = _args(db, src, {(r[0], r[7]) for r in rows if r[7] is not None})
    for g, pid, tid, rid, start, end, name_id, event_id in rows:
        out.setdefault((g, pid), []).append({
            "name": wanted[(g, name_id)], "tid": tid, "id": rid, "start": start, "end": end,
            "args": args.get((g, event_id), {}),
        })  # fmt: skip
    return out


def _args(db, src: _Sources, events: set) -> dict[tuple[str, int], dict[str, str]]:
    """``rocpd_arg`` name -> value per (guid, event id), for the given events."""
    out: dict[tuple[str, int], dict[str, str]] = {}
    if not events:
        return out
    ag = src("rocpd_arg", ["guid", "event_id", "name", "value"])
    sql = f"SELECT guid, event_id, name, value FROM {ag} WHERE name IN ('stream', 'hStream', 'event')"
    for g, e, name, value in db.execute(sql):
        if (g, e) in events:
            out.setdefault((g, e), {})[name] = value
    return out


def _stream_args(db, src: _Sources) -> dict[tuple[str, int, int], tuple]:
    """(guid, pid, hipStream_t value) -> (stream_id, queue_id, agent) from the launch calls of kernels.

    A kernel's launch call names its stream by handle (``rocpd_arg`` ``stream``); the
    dispatch record names it by rocprofiler's stream id. Joining the two maps handles in
    synchronisation calls to the ids the kernels carry.
    """
    out: dict[tuple[str, int, int], tuple] = {}
    if not src.has("rocpd_kernel_dispatch"):
        return out
    kd = src("rocpd_kernel_dispatch", ["guid", "pid", "event_id", "stream_id", "queue_id", "agent_id"])
    ev = src("rocpd_event", ["id", "guid", "stack_id"])
    rg = src("rocpd_region", ["id", "guid", "event_id"])
    ag = src("rocpd_arg", ["guid", "event_id", "name", "value"])
    sql = (
        f"SELECT DISTINCT K.guid, K.pid, A.value, K.stream_id, K.queue_id, K.agent_id FROM {kd} K "
        f"JOIN {ev} E ON E.id = K.event_id AND E.guid = K.guid "
        f"JOIN {rg} R ON R.id = E.stack_id AND R.guid = K.guid "
        f"JOIN {ag} A ON A.event_id = R.event_id AND A.guid = K.guid AND A.name IN ('stream', 'hStream')"
    )
    for g, pid, value, sid, qid, agent in db.execute(sql):
        handle = handle_value(value)
        if handle is not None:
            out.setdefault((g, pid, handle), (sid, qid, agent))
    return out


def handle_value(text) -> int | None:
    """A pointer-valued argument as an integer: ``0x7f3a...``, decimal, or 0 for a null handle."""
    if text is None:
        return None
    s = str(text).strip().lower()
    if s in ("0", "nullptr", "(nil)", "null", "0x0"):
        return 0
    m = re.fullmatch(r"(0x[0-9a-f]+|\d+)", s)
    return int(m.group(1), 0) if m else None


def _marker_steps(db, src: _Sources, path: Path) -> dict[tuple[str, int], pa.Table]:
    """Step ranges per process from roctx ranges (the message is in ``rocpd_event.extdata``)."""
    out: dict[tuple[str, int], pa.Table] = {}
    rg = src("rocpd_region", ["guid", "pid", "start", "end", "event_id"])
    ev = src("rocpd_event", ["id", "guid", "extdata"])
    rows = db.execute(
        f'SELECT R.guid, R.pid, R.start, R."end", E.extdata FROM {rg} R JOIN {ev} E ON E.id = R.event_id AND '
        f"E.guid = R.guid WHERE E.extdata LIKE '%ProfilerStep#%' OR E.extdata LIKE '%ovz_iter#%'"
    ).fetchall()
    per: dict[tuple[str, int], list] = {}
    for g, pid, start, end, ext in rows:
        try:
            msg = (json.loads(ext) or {}).get("message")
        except (TypeError, ValueError, AttributeError):
            msg = None
        if isinstance(msg, str):
            per.setdefault((g, pid), []).append((msg, start, end))
    for key, items in per.items():
        names, starts, ends = zip(*items)
        out[key] = step_rows(pa.array(names, pa.string()), np.array(starts, np.int64), np.array(ends, np.int64), path)
    return out


# --- one process ---------------------------------------------------------------------------


def _process(key, rank, kernels, copies, proc: dict, agents, api, stream_args, steps, path: Path) -> RankTrace:
    guid, pid_id = key
    where = f"{path} (pid {proc.get('pid', pid_id)})"
    parts = []
    for t in (kernels, copies):
        if t is not None:
            mask = pc.and_(pc.equal(t.column("guid"), guid), pc.equal(t.column("pid"), pid_id))
            parts.append(t.filter(pc.fill_null(mask, False)))
    acts = pa.concat_tables(parts, promote_options="default")
    n = acts.num_rows
    # stream: rocprofiler's HIP stream id when the trace has any non-zero one, else the HSA queue
    sid = acts.column("stream_id")
    use_stream = bool(pc.any(pc.not_equal(pc.fill_null(sid, 0), 0)).as_py() or False)
    stream = sid if use_stream else acts.column("queue")

    mine = [a for (g, _), a in agents.items() if g == guid]
    dev_rows = [a["row"] for a in sorted(mine, key=lambda a: (a["device"] is None, a["device"] or 0))]
    devices = conform(pa.Table.from_pylist(dev_rows), READER_DEVICE_SCHEMA, where=where) if dev_rows else None
    wave = np.full(n, -1, np.int64)
    device = np_int(acts.column("device"))
    for r in dev_rows:
        if r.get("warp_size") and r.get("device") is not None:
            wave[device == r["device"]] = r["warp_size"]

    calls = api.get((guid, pid_id), [])
    kernels_out = kernel_table(
        {
            "device": acts.column("device"),
            "stream": stream,
            "correlation": acts.column("correlation"),
            "name": acts.column("name"),
            "category": acts.column("category"),
            "is_host": pa.array(np.zeros(n, dtype=bool)),
            "start_ns": acts.column("start_ns"),
            "end_ns": acts.column("end_ns"),
            **{c: _col(acts, c) for c in ("grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z",
                                          "regs_per_thread", "accum_vgprs", "sgprs", "shared_mem_bytes", "bytes")},
            "wave_size": masked(wave, wave >= 0, pa.int32()),
            "launch_ns": acts.column("launch_ns"),
            "launch_tid": acts.column("launch_tid"),
            "collective": _collectives(acts, calls),
            "source_format": pa.array([SOURCE_FORMAT] * n, pa.string()),
        },
        where=where,
    )  # fmt: skip
    sync = _syncs(guid, pid_id, proc, calls, stream_args, agents, use_stream, where)
    env = proc.get("env", {})
    info = {
        "world_size": env_int(env, WORLD_SIZE_ENV),
        "host": proc.get("host"),
        "pid": proc.get("pid", pid_id),
        "source_path": str(path),
        "source_format": SOURCE_FORMAT,
        "base_time_ns": 0,  # rocprofiler timestamps are absolute (the host's monotonic clock)
        "n_events": n + len(calls),
    }
    step = steps.get((guid, pid_id), READER_STEP_SCHEMA.empty_table())
    return with_syncs(RankTrace(rank=rank, kernels=kernels_out, steps=step, devices=devices, info=info), sync)


def _col(t: pa.Table, name: str) -> pa.ChunkedArray | pa.Array:
    return t.column(name) if name in t.column_names else pa.nulls(t.num_rows, pa.int64())


def _collectives(acts: pa.Table, calls: list[dict]) -> pa.Array:
    """The collective of each communication kernel from the RCCL call it was launched in."""
    import pandas as pd

    rccl = [c for c in calls if c["name"].startswith(("nccl", "rccl"))]
    if not rccl or not acts.num_rows:
        return pa.nulls(acts.num_rows, pa.string())
    kernels = pd.DataFrame({
        "name": acts.column("name").to_pylist(),
        "correlation": pd.array(acts.column("correlation").to_pylist(), dtype="Int64"),
        "thread_id": pd.array(acts.column("launch_tid").to_pylist(), dtype="Int64"),
    })  # fmt: skip
    api = pd.DataFrame({"function": [c["name"] for c in rccl], "correlation": [c["id"] for c in rccl],
                        "thread_id": [c["tid"] for c in rccl]})  # fmt: skip
    found = assign_collectives(kernels, api)
    return pa.array(found.where(found.notna(), None).tolist(), pa.string())


def _syncs(guid, pid_id, proc, calls, stream_args, agents, use_stream, where) -> pa.Table:
    """Synchronising HIP calls as SYNCS rows (source ``runtime``).

    ``stream``: the call's ``stream`` handle mapped to the id the kernels carry (through the
    launches on that handle); a wait's ``wait_on_stream`` / ``wait_on_record_correlation``:
    the latest ``hipEventRecord`` of the same event handle that began before the wait (a
    wait waits for the most recent record of its event at the time of the call).
    """
    pid = proc.get("pid", pid_id)
    records = []

    def stream_of(handle):
        if handle is None:
            return None, None
        hit = stream_args.get((guid, pid_id, handle))
        if hit is None:
            return None, None
        sid, qid, agent = hit
        return (sid if use_stream else qid), agents.get((guid, agent), {}).get("device")

    last_record: dict[int, tuple] = {}  # event handle -> (stream, correlation)
    for c in sorted(calls, key=lambda c: (c["start"], c["id"])):
        kind = sync_kind(c["name"])
        if kind is None:
            continue
        handle = handle_value(c["args"].get("stream", c["args"].get("hStream")))
        event = handle_value(c["args"].get("event"))
        stream, device = stream_of(handle)
        wait_stream = wait_corr = None
        if kind == "event_record" and event is not None:
            last_record[event] = (stream, c["id"])
        elif kind in ("stream_wait_event", "event_sync") and event in last_record:
            wait_stream, wait_corr = last_record[event]
        records.append({"source": "runtime", "kind": kind, "name": c["name"], "pid": pid, "tid": c["tid"],
                        "start_ns": c["start"], "end_ns": c["end"], "correlation": c["id"], "device": device,
                        "stream": stream, "event_id": event, "wait_on_stream": wait_stream,
                        "wait_on_record_correlation": wait_corr})  # fmt: skip
    return sync_table(records, where=where)
