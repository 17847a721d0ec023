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
    check_columns,
    check_durations,
    check_not_null,
    columns_of,
    env_int,
    fetch,
    kernel_table,
    masked,
    np_bool,
    np_int,
    open_readonly,
    quote,
    repaired_count,
    sniff_tables,
    step_rows,
    sync_kind,
    sync_table,
    table_names,
    with_repaired,
    with_syncs,
)
from overlapviz.dataset.schema import conform

SOURCE_FORMAT = "rocpd"
_UUID_SUFFIX = re.compile(r"_[0-9a-f]{8}_[0-9a-f]{4}_[0-9a-f]{4}_[0-9a-f]{4}_[0-9a-f]{12}", re.IGNORECASE)
_ACTIVITY_TABLES = ("rocpd_kernel_dispatch", "rocpd_memory_copy")
_CORE_TABLES = ("rocpd_string", "rocpd_info_node", "rocpd_info_process", "rocpd_info_agent", "rocpd_info_kernel_symbol",
                "rocpd_event", "rocpd_region", "rocpd_arg")  # fmt: skip


# the columns each table must have (the rest may be absent in older schemas and read as NULL), and which
# of them hold integers
_TIMES = ("start", "end")
_NEEDED = {
    "rocpd_kernel_dispatch": (("id", "agent_id", "kernel_id", *_TIMES), ("id", "agent_id", "kernel_id", *_TIMES)),
    "rocpd_memory_copy": (("id", *_TIMES), ("id", *_TIMES)),
    "rocpd_region": (("id", *_TIMES), ("id", *_TIMES)),
    "rocpd_info_kernel_symbol": (("id",), ("id",)),
    "rocpd_string": (("id", "string"), ("id",)),
    "rocpd_event": (("id",), ("id",)),
}


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
            return with_repaired(_read(db, path), repaired_count(db))
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
    for base, (required, integers) in _NEEDED.items():  # another schema's columns: refused, not read as NULL
        for table in src.parts(base):
            if table in src.real:
                check_columns(db, path, table, required, integers=integers)
    guids = _Guids(db, src, path)
    strings = _Strings(db, src, guids, path)
    agents = _agents(db, src, path)
    kernels = _kernels(db, src, guids, strings, agents, path)
    copies = _copies(db, src, guids, strings, agents, path)
    processes = _processes(db, src)
    lowest = _lowest_devices([t for t in (kernels, copies) if t is not None])
    if not lowest:
        raise ValueError(f"{path}: the database holds no kernel dispatch or memory copy")
    keys = sorted(lowest, key=lambda k: (lowest[k], k[1], k[0]))
    env_ranks = [env_int(processes.get(k, {}).get("env", {}), RANK_ENV) for k in keys]
    use_env = all(r is not None for r in env_ranks) and len(set(env_ranks)) == len(env_ranks)
    api = _api_regions(db, src, strings.by_key)
    args = _StreamArgs(db, src)
    steps = _marker_steps(db, src, path)
    return [
        _process(key, rank if use_env else None, kernels, copies, processes.get(key, {}), agents, api, args, steps, path)
        for key, rank in zip(keys, env_ranks)
    ]


# --- tables ------------------------------------------------------------------------------


def _lowest_devices(tables: list[pa.Table]) -> dict[tuple[str | None, int | None], int]:
    """Each process (guid, pid) with activity -> the lowest device it used (``1 << 30`` where none is known)."""
    none = 1 << 30
    lowest: dict[tuple[str | None, int | None], int] = {}
    for t in tables:
        guid, pid = t.column("guid"), t.column("pid")
        device, p, p_null = np_int(t.column("device"), none), np_int(pid, 0), np.asarray(pid.is_null())
        for g in pc.unique(guid).to_pylist():
            of_guid = np.asarray(guid.is_null()) if g is None else np_bool(pc.equal(guid, g))
            if (of_guid & p_null).any():
                lowest[(g, None)] = min(lowest.get((g, None), none), int(device[of_guid & p_null].min()))
            sel = of_guid & ~p_null
            ps, ds = p[sel], device[sel]
            if len(ps) and ps.min() == ps.max():  # one process (a rank's own database): no grouping
                pids, least = ps[:1], np.minimum(ds.min(keepdims=True), none)
            else:
                pids, inverse = np.unique(ps, return_inverse=True)
                least = np.full(len(pids), none, np.int64)
                np.minimum.at(least, inverse, ds)
            for q, d in zip(pids.tolist(), least.tolist()):
                lowest[(g, q)] = min(lowest.get((g, q), none), d)
    return lowest

# the enqueueing HIP calls an activity's correlation may join to (as for rocprofv3 CSV)
_LAUNCH_FUNCTIONS = r"(?i)launch|memcpy|memset|copy|fill|graphlaunch"


class _Guids:
    """The guids of a database's activities and symbols, each coded as a small integer in the
    SQL (``CASE guid WHEN '...' THEN 0 ...``), so no row brings its guid string into Python."""

    def __init__(self, db: sqlite3.Connection, src: _Sources, path: Path):
        found: set = set()
        for base in (*_ACTIVITY_TABLES, "rocpd_info_kernel_symbol"):
            if src.has(base):
                found |= {g for (g,) in db.execute(f"SELECT DISTINCT guid FROM {src(base, ['guid'])}")}
        found.discard(None)
        bad = [g for g in found if not isinstance(g, str)]
        if bad:
            raise ValueError(f"{path}: a rocpd table holds the guid {bad[0]!r}, which is not text")
        self.values = sorted(found)
        self.index = {g: i for i, g in enumerate(self.values)}
        self.array = pa.array(self.values, pa.string())

    def code(self, expr: str) -> str:
        """SQL for the code of ``expr``'s guid (NULL for a NULL guid)."""
        if not self.values:
            return "NULL"
        whens = " ".join(f"WHEN '{g.replace(chr(39), chr(39) * 2)}' THEN {i}" for i, g in enumerate(self.values))
        return f"CASE {expr} {whens} END"

    def take(self, codes: pa.Array) -> pa.Array:
        """The guid strings of ``codes`` (null stays null)."""
        return self.array.take(codes)


class _Strings:
    """``rocpd_string`` by (guid, id): a dict for the few per-call look-ups, an index for the per-row ones."""

    def __init__(self, db: sqlite3.Connection, src: _Sources, guids: _Guids, path: Path):
        table = src("rocpd_string", ["id", "guid", "string"])
        self.by_key = {(g, i): s for i, g, s in db.execute(f"SELECT id, guid, string FROM {table}")}
        keys = list(self.by_key)
        codes = np.array([guids.index.get(g, -1) for g, _ in keys], np.int64)
        ids = np.array([i if isinstance(i, int) else -1 for _, i in keys], np.int64)
        self.values = pa.array([v if isinstance(v, str) else None for v in self.by_key.values()], pa.string())
        self.index = _ByGuid(codes, ids)  # one row per key already (a dict's)
        self.launch = np.asarray(pc.fill_null(pc.match_substring_regex(self.values, _LAUNCH_FUNCTIONS), False))

    def _find(self, codes: np.ndarray, code_valid: pa.Array, ids: pa.Array) -> np.ndarray:
        valid = np.asarray(pc.and_(code_valid.is_valid(), ids.is_valid()))
        return self.index.find(codes, np_int(ids), valid)

    def lookup(self, codes: np.ndarray, code_valid: pa.Array, ids: pa.Array) -> pa.Array:
        """The string of each (guid, id); null where there is none."""
        at = self._find(codes, code_valid, ids)
        return self.values.take(masked(at, at >= 0))

    def is_launch(self, codes: np.ndarray, code_valid: pa.Array, ids: pa.Array) -> np.ndarray:
        """Whether each (guid, id) names an enqueueing call (``_LAUNCH_FUNCTIONS``)."""
        at = self._find(codes, code_valid, ids)
        return (at >= 0) & self.launch[np.maximum(at, 0)] if len(self.launch) else np.zeros(len(at), bool)


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


def _kernels(db, src: _Sources, guids: _Guids, strings: _Strings, agents, path: Path) -> pa.Table | None:
    if not src.has("rocpd_kernel_dispatch"):
        return None
    kd = src("rocpd_kernel_dispatch", ["id", "guid", "pid", "tid", "agent_id", "kernel_id", "dispatch_id", "queue_id",
                                       "stream_id", "start", "end", "group_segment_size", "workgroup_size_x",
                                       "workgroup_size_y", "workgroup_size_z", "grid_size_x", "grid_size_y",
                                       "grid_size_z", "event_id"])  # fmt: skip
    joins, extra = _event_and_launch_joins(src, "K")
    columns = {
        "guid": guids.code("K.guid"), "pid": "K.pid", "tid": "K.tid", "agent": "K.agent_id", "kernel_id": "K.kernel_id",
        "queue": "K.queue_id", "stream_id": "K.stream_id", "start_ns": "K.start", "end_ns": 'K."end"',
        "lds": "K.group_segment_size", "wx": "K.workgroup_size_x", "wy": "K.workgroup_size_y",
        "wz": "K.workgroup_size_z", "gx": "K.grid_size_x", "gy": "K.grid_size_y", "gz": "K.grid_size_z",
    } | extra  # fmt: skip
    k = fetch(db, columns | {"id": "K.id"}, f"FROM {kd} K {joins}", where=f"{path}: rocpd_kernel_dispatch",
              order_by=("guid", "start_ns", "id"))  # fmt: skip
    check_not_null(path, "rocpd_kernel_dispatch", k, {"start_ns": "start", "end_ns": "end"})
    n = len(k["guid"])
    g = np_int(k["guid"])
    sym, sym_index = _symbols(db, src, guids, path)
    at = sym_index.find(g, np_int(k["kernel_id"]), np.asarray(pc.and_(k["guid"].is_valid(), k["kernel_id"].is_valid())))
    missing = np.flatnonzero(at < 0)
    if len(missing):
        raise ValueError(f"{path}: a kernel dispatch names kernel_id {k['kernel_id'][int(missing[0])].as_py()} "
                         f"that is not in rocpd_info_kernel_symbol ({len(missing)} such dispatches)")  # fmt: skip
    pos = pa.array(at, pa.int64())
    name = sym["name"].take(pos)
    check_durations(path, "kernel dispatch", np_int(k["start_ns"]), np_int(k["end_ns"]), name)
    cols = {
        "guid": guids.take(k["guid"]), "pid": k["pid"],
        "device": _device_of(g, k["agent"], agents, guids),
        "queue": k["queue"], "stream_id": k["stream_id"],
        "correlation": k["corr"],
        "name": name,
        "category": pa.repeat(pa.scalar("kernel", pa.string()), n),
        "start_ns": k["start_ns"], "end_ns": k["end_ns"],
        "grid_x": _blocks(k["gx"], k["wx"]), "grid_y": _blocks(k["gy"], k["wy"]), "grid_z": _blocks(k["gz"], k["wz"]),
        "block_x": k["wx"], "block_y": k["wy"], "block_z": k["wz"],
        "regs_per_thread": sym["vgpr"].take(pos), "accum_vgprs": sym["agpr"].take(pos), "sgprs": sym["sgpr"].take(pos),
        "shared_mem_bytes": k["lds"],
        "bytes": pa.nulls(n, pa.int64()),
    }  # fmt: skip
    cols |= _launch_columns(g, k, strings)
    cols["launch_tid"] = pc.coalesce(cols["launch_tid"], k["tid"])  # the dispatching thread
    return pa.table(cols)


def _symbols(db, src: _Sources, guids: _Guids, path: Path) -> tuple[dict[str, pa.Array], _ByGuid]:
    """``rocpd_info_kernel_symbol``: each symbol's kernel name (``display_name``, else
    ``kernel_name``, without the code object's ``.kd`` suffix) and registers, and an index
    by (guid, id) that finds the first row of a key."""
    ks = src("rocpd_info_kernel_symbol", ["id", "guid", "kernel_name", "display_name", "arch_vgpr_count",
                                           "accum_vgpr_count", "sgpr_count"])  # fmt: skip
    columns = {"guid": guids.code("S.guid"), "id": "S.id", "display_name": "S.display_name",
               "kernel_name": "S.kernel_name", "vgpr": "S.arch_vgpr_count", "agpr": "S.accum_vgpr_count",
               "sgpr": "S.sgpr_count"}  # fmt: skip
    rows = fetch(db, columns, f"FROM {ks} S", where=f"{path}: rocpd_info_kernel_symbol",
                 strings=("display_name", "kernel_name"))  # fmt: skip
    display, kernel = rows["display_name"], rows["kernel_name"]
    display = pc.if_else(pc.equal(display, ""), pa.nulls(len(display), pa.string()), display)
    name = pc.replace_substring_regex(pc.coalesce(display, kernel), r"(?: \[clone \.kd\]|\.kd)$", "")
    valid = np.asarray(pc.and_(rows["guid"].is_valid(), rows["id"].is_valid()))
    codes = np.where(valid, np_int(rows["guid"]), -2)  # a symbol without guid or id matches nothing
    return rows | {"name": name}, _ByGuid(codes, np_int(rows["id"]))


class _ByGuid:
    """Rows keyed by (guid code, id), for vectorized look-ups (guids are few, ids many)."""

    def __init__(self, codes: np.ndarray, ids: np.ndarray, *, last: bool = False):
        self.order = np.lexsort((ids, codes))  # stable: rows of one key stay in table order
        self.codes, self.ids = codes[self.order], ids[self.order]
        self.last = last  # the last row of a key wins (as in a dict built in table order), else the first

    def find(self, codes: np.ndarray, ids: np.ndarray, valid: np.ndarray) -> np.ndarray:
        """The row (in table order) of each valid (code, id); -1 where there is none."""
        out = np.full(len(ids), -1, np.int64)
        for c in np.unique(self.codes).tolist():
            lo, hi = np.searchsorted(self.codes, [c, c + 1])
            sel = np.flatnonzero(valid & (codes == c))
            if not len(sel):
                continue
            keys = self.ids[lo:hi]
            if self.last:
                p = np.searchsorted(keys, ids[sel], side="right") - 1
                hit = (p >= 0) & (keys[np.maximum(p, 0)] == ids[sel])
            else:
                p = np.searchsorted(keys, ids[sel], side="left")
                hit = (p < len(keys)) & (keys[np.minimum(p, len(keys) - 1)] == ids[sel])
            out[sel] = np.where(hit, self.order[lo + np.clip(p, 0, len(keys) - 1)], -1)
        return out


def _copies(db, src: _Sources, guids: _Guids, strings: _Strings, agents, path: Path) -> pa.Table | None:
    if not src.has("rocpd_memory_copy"):
        return None
    mc = src("rocpd_memory_copy", ["id", "guid", "pid", "tid", "start", "end", "name_id", "dst_agent_id",
                                   "src_agent_id", "size", "queue_id", "stream_id", "event_id"])  # fmt: skip
    joins, extra = _event_and_launch_joins(src, "K")
    columns = {
        "guid": guids.code("K.guid"), "pid": "K.pid", "tid": "K.tid", "start_ns": "K.start", "end_ns": 'K."end"',
        "name_id": "K.name_id", "dst": "K.dst_agent_id", "src": "K.src_agent_id", "bytes": "K.size",
        "queue": "K.queue_id", "stream_id": "K.stream_id",
    } | extra  # fmt: skip
    m = fetch(db, columns | {"id": "K.id"}, f"FROM {mc} K {joins}", where=f"{path}: rocpd_memory_copy",
              order_by=("guid", "start_ns", "id"))  # fmt: skip
    check_not_null(path, "rocpd_memory_copy", m, {"start_ns": "start", "end_ns": "end"})
    n = len(m["guid"])
    g = np_int(m["guid"])
    name = strings.lookup(g, m["guid"], m["name_id"])
    name = pc.if_else(pc.fill_null(pc.equal(name, ""), True), pa.scalar("MEMORY_COPY"), name)  # none or empty
    check_durations(path, "memory copy", np_int(m["start_ns"]), np_int(m["end_ns"]), name)
    to_device = np.asarray(pc.fill_null(pc.match_substring(name, "HOST_TO_DEVICE"), False))
    # the GPU end of the copy: the destination of a host-to-device copy, else the source
    device = pc.if_else(pa.array(to_device), _device_of(g, m["dst"], agents, guids),
                        _device_of(g, m["src"], agents, guids))  # fmt: skip
    cols = {
        "guid": guids.take(m["guid"]), "pid": m["pid"], "device": device,
        "queue": m["queue"], "stream_id": m["stream_id"], "correlation": m["corr"],
        "name": name, "category": pa.repeat(pa.scalar("gpu_memcpy", pa.string()), n),
        "start_ns": m["start_ns"], "end_ns": m["end_ns"], "bytes": m["bytes"],
    }  # fmt: skip
    cols |= _launch_columns(g, m, strings)
    cols["launch_tid"] = pc.coalesce(cols["launch_tid"], m["tid"])
    return pa.table(cols)


def _event_and_launch_joins(src: _Sources, alias: str) -> tuple[str, dict[str, str]]:
    """JOINs from an activity to its event (internal correlation = ``stack_id``) and to the
    API region with that id (the launch call), and the columns they add."""
    ev = src("rocpd_event", ["id", "guid", "stack_id"])
    joins = f"LEFT JOIN {ev} E ON E.id = {alias}.event_id AND E.guid = {alias}.guid "
    rg = src("rocpd_region", ["id", "guid", "tid", "start", "end", "name_id"])
    joins += f"LEFT JOIN {rg} R ON R.id = E.stack_id AND R.guid = {alias}.guid AND R.start <= {alias}.start"
    return joins, {"corr": "E.stack_id", "launch_ns": "R.start", "launch_end_ns": 'R."end"', "launch_tid": "R.tid",
                   "launch_name": "R.name_id"}  # fmt: skip


def _launch_columns(guid: np.ndarray, t: dict, strings: _Strings) -> dict:
    """``launch_ns`` / ``launch_end_ns`` / ``launch_tid`` where the joined region is an enqueueing call."""
    ok = strings.is_launch(guid, t["guid"], t["launch_name"]) & np.asarray(t["launch_ns"].is_valid())
    start, end = np_int(t["launch_ns"]), np_int(t["launch_end_ns"])
    return {
        "launch_ns": masked(start, ok),
        "launch_end_ns": masked(end, ok & np.asarray(t["launch_end_ns"].is_valid()) & (end >= start)),
        "launch_tid": masked(np_int(t["launch_tid"]), ok),
    }


def _device_of(guid: np.ndarray, agent: pa.Array, agents: dict, guids: _Guids) -> pa.Array:
    """The device index of each (guid code, agent id); null where the agent is not a GPU agent."""
    a = np_int(agent, -1)
    known = np.asarray(agent.is_valid())
    device = np.zeros(len(a), np.int64)
    found = np.zeros(len(a), bool)
    for (g, agent_id), info in agents.items():
        if info.get("device") is None or g not in guids.index or not isinstance(agent_id, int):
            continue
        rows = known & (guid == guids.index[g]) & (a == agent_id)
        device[rows], found[rows] = info["device"], True
    return masked(device, found, pa.int32())


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
    args = _args(db, src, {(r[0], r[7]) for r in rows if r[7] is not None}, rg, ids)
    for g, pid, tid, rid, start, end, name_id, event_id in rows:
        out.setdefault((g, pid), []).append({
            "name": wanted[(g, name_id)], "tid": tid, "id": rid, "start": start, "end": end,
            "args": args.get((g, event_id), {}),
        })  # fmt: skip
    return out


def _args(db, src: _Sources, events: set, regions: str, name_ids: str) -> dict[tuple[str, int], dict[str, str]]:
    """``rocpd_arg`` name -> value per (guid, event id), for the given events (of the
    ``regions`` calls named by ``name_ids``: the arguments of other calls, every kernel
    launch's among them, stay in SQLite)."""
    out: dict[tuple[str, int], dict[str, str]] = {}
    if not events:
        return out
    ag = src("rocpd_arg", ["guid", "event_id", "name", "value"])
    # MATERIALIZED: one table of these arguments (searched through an automatic index), not
    # every region table joined with every argument table of a merged database
    sql = (
        f"WITH A AS MATERIALIZED (SELECT guid, event_id, name, value FROM {ag} "
        f"WHERE name IN ('stream', 'hStream', 'event')) "
        f"SELECT A.guid, A.event_id, A.name, A.value FROM {regions} R "
        f"CROSS JOIN A ON A.event_id = R.event_id AND A.guid = R.guid WHERE R.name_id IN ({name_ids})"
    )
    for g, e, name, value in db.execute(sql):
        if (g, e) in events:
            out.setdefault((g, e), {})[name] = value
    return out


class _StreamArgs:
    """``_stream_args``, queried on the first look-up: only a synchronisation call that names
    a stream needs it, and the join reads every kernel launch's arguments."""

    def __init__(self, db, src: _Sources):
        self.db, self.src, self.found = db, src, None

    def get(self, key: tuple[str, int, int]) -> tuple | None:
        if self.found is None:
            self.found = _stream_args(self.db, self.src)
        return self.found.get(key)


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
    # CROSS JOIN fixes the order, dispatches outermost: each inner table is searched through an
    # automatic index on its join key (O(n log n)); left to itself, the planner (no statistics)
    # may put the arguments outermost and search the dispatches by guid alone, O(n^2)
    sql = (
        f"SELECT DISTINCT K.guid, K.pid, A.value, K.stream_id, K.queue_id, K.agent_id FROM {kd} K "
        f"CROSS JOIN {ev} E ON E.id = K.event_id AND E.guid = K.guid "
        f"CROSS JOIN {rg} R ON R.id = E.stack_id AND R.guid = K.guid "
        f"CROSS JOIN {ag} A ON A.event_id = R.event_id AND A.guid = K.guid AND A.name IN ('stream', 'hStream')"
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
    # the few marker events first, MATERIALIZED: else SQLite joins every region table with every
    # event table of a merged database (processes squared)
    rows = db.execute(
        f"WITH E AS MATERIALIZED (SELECT id, guid, extdata FROM {ev} "
        f"WHERE extdata LIKE '%ProfilerStep#%' OR extdata LIKE '%ovz_iter#%') "
        f'SELECT R.guid, R.pid, R.start, R."end", E.extdata FROM {rg} R JOIN E ON E.id = R.event_id AND E.guid = R.guid'
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
            mask = pc.fill_null(pc.and_(pc.equal(t.column("guid"), guid), pc.equal(t.column("pid"), pid_id)), False)
            parts.append(t if pc.all(mask).as_py() else t.filter(mask))  # one process: no copy
    acts = pa.concat_tables(parts, promote_options="default")
    n = acts.num_rows
    # stream: rocprofiler's HIP stream id when the trace has any non-zero one, else the HSA queue
    sid = acts.column("stream_id")
    use_stream = bool(pc.any(pc.not_equal(pc.fill_null(sid, 0), 0)).as_py() or False)
    stream = sid if use_stream else acts.column("queue")

    # the GPUs this process ran activities on (a node's database lists every GPU: 8 listed, 1 used)
    used = set(pc.unique(acts.column("device").drop_null()).to_pylist())
    mine = [a for (g, _), a in agents.items() if g == guid and a["device"] in used]
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
            "launch_end_ns": acts.column("launch_end_ns"),
            "collective": _collectives(acts, calls),
            "source_format": pa.repeat(pa.scalar(SOURCE_FORMAT, pa.string()), n),
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
    rccl = [c for c in calls if c["name"].startswith(("nccl", "rccl"))]
    if not rccl or not acts.num_rows:
        return pa.nulls(acts.num_rows, pa.string())
    import pandas as pd  # only here: importing it costs a worker ~0.25 s CPU, more than reading 125k dispatches

    def nullable(col) -> pd.arrays.IntegerArray:  # no Python object per value
        return pd.arrays.IntegerArray(np_int(col, 0), ~np.asarray(col.is_valid()))

    kernels = pd.DataFrame({"correlation": nullable(acts.column("correlation")),
                            "thread_id": nullable(acts.column("launch_tid"))})  # fmt: skip
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
        hit = stream_args.get((guid, pid_id, handle))  # a _StreamArgs
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
