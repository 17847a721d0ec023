"""Nsight Systems SQLite exports (``nsys export --type sqlite``) as a reader: one rank per profiled process.

What is read, and how it maps to the dataset, is documented in docs/nsys_rocpd.md. In short:

* GPU activities: ``CUPTI_ACTIVITY_KIND_KERNEL`` / ``_MEMCPY`` / ``_MEMSET``; names through
  ``StringIds``; times are the export's int64 ns, kept as they are.
* Launch calls: ``CUPTI_ACTIVITY_KIND_RUNTIME`` (and ``_DRIVER`` where an export has it),
  joined by (process, ``correlationId``); correlation ids are per process.
* Syncs: ``CUPTI_ACTIVITY_KIND_SYNCHRONIZATION`` (source ``cuda_sync``), event records and
  untraced synchronising calls from the runtime table (source ``runtime``).
* Steps: NVTX ranges named ``ovz_iter#N`` or ``ProfilerStep#N``.
* Devices: ``TARGET_INFO_GPU`` (through ``TARGET_INFO_CUDA_DEVICE`` where present).

Export schemas 2.9.1 (Nsight Systems 2022.2) to 3.25.0 (2026.2) are read: columns are
looked up by name (``PRAGMA table_info``), and missing optional ones read as null.

The database is opened read-only and immutable (``mode=ro&immutable=1``): the user's file
is never written, locked or given a journal. The SQLite plumbing and the tables a reader
hands over are shared with the rocpd reader, which holds them.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Mapping
from pathlib import Path
from typing import ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from overlapviz.domain.collectives import collective_of
from overlapviz.ingest.base import RankTrace
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

SOURCE_FORMAT = "nsys_sqlite"

# --- the reader ---------------------------------------------------------------------------

_GPU_TABLES = ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET")
_API_TABLES = ("CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_DRIVER")
_EXPORT_META = ("META_DATA_EXPORT", "EXPORT_META_DATA")  # 3.x, 2.x


class NsysReader:
    """``nsys export --type sqlite`` output: a ``StringIds`` table and CUPTI activity tables."""

    name = SOURCE_FORMAT
    per_process = True  # one trace per process: the driver splits one driving several GPUs (NCCL's -g N)

    def sniff(self, path: Path, head: bytes) -> bool:
        tables = sniff_tables(path, head)
        return "StringIds" in tables and any(t in tables for t in _GPU_TABLES + _API_TABLES + _EXPORT_META)

    def read(self, path: Path) -> list[RankTrace]:
        return read_nsys(path)

    def companions(self, path: Path) -> list[Path]:
        """The report this export was made from, beside it (``nsys export`` writes ``r.sqlite``
        next to ``r.nsys-rep``): read once, from the export."""
        return [p for p in (path.with_suffix(s) for s in (".nsys-rep", ".qdrep")) if p.is_file()]


READERS = [NsysReader()]


def read_nsys(path: str | Path) -> list[RankTrace]:
    """Read every process of an Nsight Systems SQLite export that ran GPU work.

    Each process with a kernel, memcpy or memset becomes one ``RankTrace`` (in the order of
    the lowest device it used, then pid). Its rank is ``MPI Rank N`` from nsys's MPI
    thread naming; else, for an export of one GPU process, the launched process's
    ``RANK`` / ``OMPI_COMM_WORLD_RANK`` / ``PMI_RANK`` / ``PALS_RANKID`` / ``SLURM_PROCID``
    (``META_DATA_CAPTURE``); else None (the ingest driver numbers ranks).

    Raises
    ------
    ValueError
        One line naming ``path``: not SQLite, truncated or corrupt, not an nsys export, no
        GPU activity, a negative duration.
    """
    path = Path(path)
    with open_readonly(path) as db:
        try:
            return with_repaired(_read(db, path), repaired_count(db))
        except sqlite3.Error as exc:
            raise ValueError(f"{path}: corrupt or unreadable SQLite database ({' '.join(str(exc).split())})") from None


def _read(db: sqlite3.Connection, path: Path) -> list[RankTrace]:
    tables = table_names(db)
    if "StringIds" not in tables or not any(t in tables for t in _GPU_TABLES):
        raise ValueError(
            f"{path}: not an Nsight Systems export with CUDA activity (no StringIds or "
            "CUPTI_ACTIVITY_KIND_KERNEL/MEMCPY/MEMSET table; was CUDA tracing on?)"
        )
    strings = _Strings(db, path)
    acts = _activities(db, tables, strings, path)
    if not len(acts["start_ns"]):
        raise ValueError(f"{path}: the export holds no kernel, memcpy or memset activity")
    api = _api_calls(db, tables, path)
    nvtx = _nvtx(db, tables, strings, path)
    syncs = _sync_records(db, tables, path)
    events = _cuda_events(db, tables, path)
    gpus = _gpu_info(db, tables, path)
    meta = _metadata(db, tables)

    proc = np_int(acts["process"], _NO_PROCESS)
    device = np_int(acts["device"])
    keys = sorted(set(proc.tolist()), key=lambda p: (int(device[proc == p].min()), p & 0xFFFFFF))
    one = len(keys) == 1
    return [
        _process(p, acts.filter(pa.array(proc == p)), api, nvtx, syncs, events, gpus, meta, strings, one, path)
        for p in keys
    ]


_NO_PROCESS = np.iinfo(np.int64).min  # process key of activities without a globalPid


# --- tables -----------------------------------------------------------------------------


class _Strings:
    """``StringIds`` as an id -> position index and a string array, for vectorized look-ups."""

    def __init__(self, db: sqlite3.Connection, path: Path):
        rows = fetch(db, {"id": "id", "value": "value"}, "FROM StringIds ORDER BY id", where=f"{path}: StringIds",
                     strings=("value",))  # fmt: skip
        ids = np_int(rows["id"], -1)
        self.values = rows["value"]
        self.ids = ids
        # ids are dense from 0 or 1 in every export: a direct index (else binary search)
        self.dense = len(ids) and ids[0] >= 0 and ids[-1] < 4 * len(ids) + 1024
        if self.dense:
            self.index = np.full(int(ids[-1]) + 2, -1, np.int64)  # the last slot: every id out of range
            self.index[ids[::-1]] = np.arange(len(ids))[::-1]  # the first row of an id, as a binary search finds

    def positions(self, v: np.ndarray) -> np.ndarray:
        """The position of each id in ``StringIds``; -1 where it is not there."""
        if not len(self.ids):
            return np.full(len(v), -1, np.int64)
        if self.dense:
            return self.index[np.where((v >= 0) & (v < len(self.index)), v, -1)]
        pos = np.minimum(np.searchsorted(self.ids, v), len(self.ids) - 1)
        return np.where(self.ids[pos] == v, pos, -1)

    def lookup(self, ids: pa.Array) -> pa.Array:
        """The strings of ``ids``; null where an id is null or not in ``StringIds``."""
        pos = self.positions(np_int(ids, -1))
        if not len(self.ids):
            return pa.nulls(len(pos), pa.string())
        return self.values.take(masked(pos, pos >= 0))

    def get(self, i) -> str | None:
        if i is None:
            return None
        pos = int(self.positions(np.array([i], np.int64))[0])
        return self.values[pos].as_py() if pos >= 0 else None


def _fetch_table(db: sqlite3.Connection, table: str, wanted: Mapping[str, str], path: Path) -> dict[str, pa.Array]:
    """The ``wanted`` integer columns of ``table`` (result name -> column), null for absent ones, in table order.

    ``NOT INDEXED``: the table's own order whatever the columns, never an index's that
    happens to cover them (nsys-ai adds one on ``shortName``), so that two reads of one
    table line up row for row.
    """
    have = set(columns_of(db, table))
    cols = {alias: quote(col) if col in have else "NULL" for alias, col in wanted.items()}
    return fetch(db, cols, f"FROM {quote(table)} NOT INDEXED", where=f"{path}: {table}")


_ACT_COLUMNS = {
    "start_ns": "start",
    "end_ns": "end",
    "device": "deviceId",
    "stream": "streamId",
    "correlation": "correlationId",
    "gpid": "globalPid",
}


def _activities(db: sqlite3.Connection, tables: set[str], strings: _Strings, path: Path) -> pa.Table:
    """Kernels, memcpys and memsets of every process, with a ``process`` key (globalPid >> 24)."""
    parts = []
    if "CUPTI_ACTIVITY_KIND_KERNEL" in tables:
        t = "CUPTI_ACTIVITY_KIND_KERNEL"
        cols = set(columns_of(db, t))
        name_cols = [c for c in ("demangledName", "shortName", "mangledName", "nameId") if c in cols]
        if not name_cols:
            raise ValueError(f"{path}: {t} has no kernel name column (demangledName/shortName)")
        wanted = dict(_ACT_COLUMNS) | {
            "grid_x": "gridX", "grid_y": "gridY", "grid_z": "gridZ",
            "block_x": "blockX", "block_y": "blockY", "block_z": "blockZ",
            "regs_per_thread": "registersPerThread",
            "static_smem": "staticSharedMemory", "dynamic_smem": "dynamicSharedMemory",
        }  # fmt: skip
        k = _fetch_table(db, t, wanted | {"name": name_cols[0]}, path)
        name = strings.lookup(k["name"])
        for c in name_cols[1:]:  # the next name column, read only where a kernel has none yet
            if not name.null_count:
                break
            name = pc.coalesce(name, strings.lookup(_fetch_table(db, t, {"name": c}, path)["name"]))
        shape = {c: k[c] for c in ("grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z", "regs_per_thread")}
        try:
            smem = pc.add_checked(k["static_smem"], k["dynamic_smem"])  # per block: static + dynamic
        except pa.ArrowInvalid:
            raise ValueError(f"{path}: {t}: staticSharedMemory + dynamicSharedMemory is past int64") from None
        parts.append(_act_part(k, name, "kernel", extra=shape | {"shared_mem_bytes": smem}))
    enums = _Enums(db, tables)
    if "CUPTI_ACTIVITY_KIND_MEMCPY" in tables:
        t = "CUPTI_ACTIVITY_KIND_MEMCPY"
        wanted = dict(_ACT_COLUMNS) | {"bytes": "bytes", "copy_kind": "copyKind", "src": "srcKind", "dst": "dstKind"}
        m = _fetch_table(db, t, wanted, path)
        name = enums.memcpy_names(m["copy_kind"], m["src"], m["dst"])
        parts.append(_act_part(m, name, "gpu_memcpy", extra={"bytes": m["bytes"]}))
    if "CUPTI_ACTIVITY_KIND_MEMSET" in tables:
        t = "CUPTI_ACTIVITY_KIND_MEMSET"
        m = _fetch_table(db, t, dict(_ACT_COLUMNS) | {"bytes": "bytes", "mem_kind": "memKind"}, path)
        parts.append(_act_part(m, enums.memset_names(m["mem_kind"]), "gpu_memset", extra={"bytes": m["bytes"]}))
    table = pa.concat_tables(parts, promote_options="default")  # _read checked that one table exists
    for col in ("start_ns", "end_ns"):
        if table.column(col).null_count:
            raise ValueError(f"{path}: a GPU activity has no {col.split('_')[0]} timestamp")
    check_durations(path, "GPU activity", np_int(table.column("start_ns")), np_int(table.column("end_ns")),
                    table.column("name"))  # fmt: skip
    return table


def _act_part(cols: Mapping[str, pa.Array], name: pa.Array, category: str, extra: Mapping[str, pa.Array]) -> pa.Table:
    """One activity table's rows, with the process key nsys serialises in the global id
    (``globalPid = hwId << 56 | vmId << 48 | pid << 24``)."""
    n = len(name)
    return pa.table(
        {c: cols[c] for c in ("device", "stream", "correlation")}
        | {"name": name, "category": pa.repeat(pa.scalar(category, pa.string()), n)}
        | {c: cols[c] for c in ("start_ns", "end_ns")}
        | {"process": pc.shift_right(cols["gpid"], 24)}
        | dict(extra)
    )


class _Enums:
    """nsys's enum labels (the ``ENUM_*`` tables where the export has them, else nsys's own
    numbering as those tables give it), for Kineto-style memcpy/memset names."""

    # ENUM_CUDA_MEMCPY_OPER (same numbering as CUPTI's CUpti_ActivityMemcpyKind)
    COPY: ClassVar[dict[int, str]] = {
        0: "Unknown", 1: "HtoD", 2: "DtoH", 3: "HtoA", 4: "AtoH", 5: "AtoA", 6: "AtoD", 7: "DtoA",
        8: "DtoD", 9: "HtoH", 10: "PtoP", 11: "HtoD", 12: "DtoH", 13: "DtoD",
    }  # fmt: skip
    # ENUM_CUDA_MEM_KIND: nsys's numbering, NOT CUPTI's (0 is Pageable here, Unknown in CUPTI)
    MEM: ClassVar[dict[int, str]] = {
        0: "Pageable", 1: "Pinned", 2: "Device", 3: "Array", 4: "Managed", 5: "Device Static",
        6: "Managed Static", 7: "Unknown",
    }  # fmt: skip

    def __init__(self, db: sqlite3.Connection, tables: set[str]):
        self.mem = dict(self.MEM)
        if "ENUM_CUDA_MEM_KIND" in tables and "label" in columns_of(db, "ENUM_CUDA_MEM_KIND"):
            self.mem.update({int(i): str(lbl) for i, lbl in db.execute("SELECT id, label FROM ENUM_CUDA_MEM_KIND")})
        self.copy = dict(self.COPY)
        if "ENUM_CUDA_MEMCPY_OPER" in tables and "name" in columns_of(db, "ENUM_CUDA_MEMCPY_OPER"):
            for i, nm in db.execute("SELECT id, name FROM ENUM_CUDA_MEMCPY_OPER"):
                short = re.sub(r"^CUDA_MEMCPY_KIND_(?:UVM_)?", "", str(nm))
                self.copy[int(i)] = {"UNKNOWN": "Unknown"}.get(short, short.replace("TO", "to"))

    def memcpy_names(self, kind: pa.Array, src: pa.Array, dst: pa.Array) -> pa.Array:
        """Kineto's ``Memcpy HtoD (Pageable -> Device)``, so names match across formats."""

        def name(k, s, d):
            label = self.copy.get(k, "Unknown")
            if s < 0 or d < 0:
                return f"Memcpy {label}"
            return f"Memcpy {label} ({self.mem.get(s, 'Unknown')} -> {self.mem.get(d, 'Unknown')})"

        return _by_distinct(name, np_int(kind), np_int(src), np_int(dst))

    def memset_names(self, kind: pa.Array) -> pa.Array:
        return _by_distinct(lambda k: "Memset" if k < 0 else f"Memset ({self.mem.get(k, 'Unknown')})", np_int(kind))


def _by_distinct(fn, *keys: np.ndarray) -> pa.Array:
    """``fn`` of each row's keys, evaluated once per distinct key tuple."""
    if not len(keys[0]):
        return pa.array([], pa.string())
    stacked = np.stack(keys, axis=1)
    distinct, inverse = np.unique(stacked, axis=0, return_inverse=True)
    labels = pa.array([fn(*map(int, row)) for row in distinct], pa.string())
    return labels.take(pa.array(inverse.ravel(), pa.int64()))


def _api_calls(db: sqlite3.Connection, tables: set[str], path: Path) -> pa.Table | None:
    """CUDA runtime/driver API calls: start, end, gtid, correlation, nameId."""
    parts = []
    for t in _API_TABLES:
        if t in tables:
            a = _fetch_table(db, t, {"start_ns": "start", "end_ns": "end", "gtid": "globalTid",
                                     "correlation": "correlationId", "name_id": "nameId"}, path)  # fmt: skip
            parts.append(pa.table(a))
    if not parts:
        return None
    table = pa.concat_tables(parts)
    check_durations(path, "CUDA API call", np_int(table.column("start_ns")), np_int(table.column("end_ns")))
    return table.append_column("process", pc.shift_right(table.column("gtid"), 24))


_NVTX_RANGES = (59, 60, 70, 71)  # NvtxPushPopRange, NvtxStartEndRange, Nvtxt* (domain) ranges
_NVTX_THREAD = 39  # NvtxThread: a thread's name (nsys's MPI tracing names them "MPI Rank N")


def _nvtx(db: sqlite3.Connection, tables: set[str], strings: _Strings, path: Path) -> pa.Table | None:
    """NVTX ranges and thread names: start, end, gtid, event_type, name."""
    if "NVTX_EVENTS" not in tables:
        return None
    cols = set(columns_of(db, "NVTX_EVENTS"))
    text = "text" if "text" in cols else "NULL"
    text_id = "textId" if "textId" in cols else "NULL"
    types = ", ".join(map(str, _NVTX_RANGES + (_NVTX_THREAD,)))
    columns = {"start_ns": "start", "end_ns": '"end"', "gtid": "globalTid", "event_type": "eventType", "text": text,
               "text_id": text_id}  # fmt: skip
    rows = fetch(db, columns, f"FROM NVTX_EVENTS WHERE eventType IN ({types})", where=f"{path}: NVTX_EVENTS",
                 strings=("text",))  # fmt: skip
    name = pc.coalesce(rows["text"], strings.lookup(rows["text_id"]))
    table = pa.table({k: rows[k] for k in ("start_ns", "end_ns", "gtid", "event_type")} | {"name": name})
    return table.append_column("process", pc.shift_right(table.column("gtid"), 24))


def _sync_records(db: sqlite3.Connection, tables: set[str], path: Path) -> pa.Table | None:
    t = "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION"
    if t not in tables:
        return None
    s = _fetch_table(db, t, {"start_ns": "start", "end_ns": "end", "device": "deviceId", "stream": "streamId",
                             "correlation": "correlationId", "gpid": "globalPid", "sync_type": "syncType",
                             "event_id": "eventId", "event_sync_id": "eventSyncId"}, path)  # fmt: skip
    table = pa.table(s)
    check_durations(path, "synchronization record", np_int(table.column("start_ns")), np_int(table.column("end_ns")))
    labels = {}
    if "ENUM_CUPTI_SYNC_TYPE" in tables:
        labels = {int(i): str(n) for i, n in db.execute("SELECT id, name FROM ENUM_CUPTI_SYNC_TYPE")}
    label = pa.array([labels.get(v) for v in table.column("sync_type").to_pylist()], pa.string())
    table = table.append_column("type_label", label)
    return table.append_column("process", pc.shift_right(table.column("gpid"), 24))


def _cuda_events(db: sqlite3.Connection, tables: set[str], path: Path) -> pa.Table | None:
    """``CUPTI_ACTIVITY_KIND_CUDA_EVENT``: one row per cudaEventRecord (nsys --cuda-event-trace)."""
    t = "CUPTI_ACTIVITY_KIND_CUDA_EVENT"
    if t not in tables:
        return None
    wanted = {"stream": "streamId", "correlation": "correlationId", "gpid": "globalPid", "event_id": "eventId",
              "event_sync_id": "eventSyncId", "device": "deviceId"}  # fmt: skip
    e = _fetch_table(db, t, wanted, path)
    table = pa.table(e)
    return table.append_column("process", pc.shift_right(table.column("gpid"), 24))


def _gpu_info(db: sqlite3.Connection, tables: set[str], path: Path) -> dict:
    """``TARGET_INFO_GPU`` rows (by nsys GPU id) and the per-process CUDA-device map.

    A field read as a number holding text, a real or a blob (``maxShmemPerSm = 'lots'``) is
    refused, naming the file, the table and the field, as the activity tables' values are;
    it was read as unknown (or another column stood in for it) without a word."""
    gpus: dict[int, dict] = {}
    if "TARGET_INFO_GPU" in tables:
        cur = db.execute("SELECT * FROM TARGET_INFO_GPU")
        names = [d[0] for d in cur.description]
        for row in cur.fetchall():
            r = dict(zip(names, row))
            for key in (*_GPU_INTEGERS, "id", "cuDevice", "computeMajor", "computeMinor"):
                _integer_field(r.get(key), path, "TARGET_INFO_GPU", key)
            if r.get("id") is not None:
                gpus[int(r["id"])] = r
    cuda: dict[tuple[int, int], tuple[int | None, int | None]] = {}  # (pid, cudaId) -> (gpuId, SMs)
    if "TARGET_INFO_CUDA_DEVICE" in tables:
        cols = set(columns_of(db, "TARGET_INFO_CUDA_DEVICE"))
        sms = "numMultiprocessors" if "numMultiprocessors" in cols else "NULL"
        for gpu, cuda_id, pid, n_sms in db.execute(f"SELECT gpuId, cudaId, pid, {sms} FROM TARGET_INFO_CUDA_DEVICE"):
            for key, value in (("gpuId", gpu), ("cudaId", cuda_id), ("pid", pid), ("numMultiprocessors", n_sms)):
                _integer_field(value, path, "TARGET_INFO_CUDA_DEVICE", key)
            if cuda_id is not None and pid is not None:
                cuda[(int(pid), int(cuda_id))] = (None if gpu is None else int(gpu), n_sms)
    return {"gpus": gpus, "cuda": cuda}


# the TARGET_INFO_GPU fields read as device limits (_device_row)
_GPU_INTEGERS = ("smCount", "maxWarpsPerSm", "threadsPerWarp", "maxThreadsPerBlock", "maxBlocksPerSm",
                 "maxRegistersPerSm", "maxRegistersPerBlock", "maxShmemPerSm", "maxShmemPerBlock",
                 "maxShmemPerBlockOptin", "totalMemory")  # fmt: skip


def _integer_field(value, path: Path, table: str, key: str) -> None:
    if value is None or (isinstance(value, int) and not isinstance(value, bool)):
        return
    kind = {str: "text", float: "real", bytes: "blob"}.get(type(value), type(value).__name__)
    raise ValueError(f"{path}: {table}: field {key!r} holds a {kind} value ({value!r:.40}), not an integer")


def _metadata(db: sqlite3.Connection, tables: set[str]) -> dict:
    meta: dict = {"env": {}, "host": None, "base_time_ns": 0, "export": {}}
    if "TARGET_INFO_SESSION_START_TIME" in tables and "utcEpochNs" in columns_of(db, "TARGET_INFO_SESSION_START_TIME"):
        row = db.execute("SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME").fetchone()
        meta["base_time_ns"] = int(row[0]) if row and row[0] is not None else 0
    if "TARGET_INFO_SYSTEM_ENV" in tables and {"name", "value"} <= set(columns_of(db, "TARGET_INFO_SYSTEM_ENV")):
        row = db.execute("SELECT value FROM TARGET_INFO_SYSTEM_ENV WHERE name = 'Hostname'").fetchone()
        meta["host"] = row[0] if row and row[0] else None
    if "META_DATA_CAPTURE" in tables:
        # the launched process's environment: PROCESS_0:ENVIRONMENT_VARIABLE = 'KEY="value"'
        for (value,) in db.execute(
            "SELECT value FROM META_DATA_CAPTURE WHERE name = 'PROCESS_0:ENVIRONMENT_VARIABLE'"
        ):
            m = re.match(r'^([A-Za-z_][A-Za-z0-9_]*)="?(.*?)"?$', str(value or ""), re.DOTALL)
            if m:
                meta["env"].setdefault(m.group(1), m.group(2))
    for t in _EXPORT_META:
        if t in tables:
            meta["export"] = {str(k): v for k, v in db.execute(f"SELECT name, value FROM {t}")}
            break
    return meta


# --- one process ------------------------------------------------------------------------


def _process(p: int, acts: pa.Table, api, nvtx, syncs, events, gpus, meta, strings, only_one: bool,
             path: Path) -> RankTrace:  # fmt: skip
    pid = None if p == _NO_PROCESS else p & 0xFFFFFF
    n = acts.num_rows
    where = f"{path} (pid {pid})"

    calls = _Calls(_of_process(api, p))
    at = calls.find(np_int(acts.column("correlation")))
    launch, launch_tid = calls.take(calls.start, at), calls.take(calls.tid, at)
    launch_end = calls.take(calls.end, at)  # CUPTI_ACTIVITY_KIND_RUNTIME.end: the call's own end

    devices = _devices(np_int(acts.column("device")), pid, gpus)
    wave = np.full(n, -1, np.int64)
    device = np_int(acts.column("device"))
    for d, w in zip(devices.column("device").to_pylist(), devices.column("warp_size").to_pylist()):
        if d is not None and w is not None:
            wave[device == d] = w

    ranges = _of_process(nvtx, p)
    kernels = kernel_table(
        {
            "device": acts.column("device"),
            "stream": acts.column("stream"),
            "correlation": acts.column("correlation"),
            "name": acts.column("name"),
            "category": acts.column("category"),
            "is_host": pa.array(np.zeros(n, dtype=bool)),
            "start_ns": acts.column("start_ns"),
            "end_ns": acts.column("end_ns"),
            **{c: _column(acts, c, pa.int32()) for c in
               ("grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z", "regs_per_thread")},
            "shared_mem_bytes": _column(acts, "shared_mem_bytes", pa.int64()),
            "wave_size": masked(wave, wave >= 0, pa.int32()),
            "bytes": _column(acts, "bytes", pa.int64()),
            "launch_ns": masked(launch, at >= 0),
            "launch_tid": masked(launch_tid, at >= 0),
            "launch_end_ns": masked(launch_end, (at >= 0) & (launch_end >= launch)),
            "collective": _nvtx_collectives(acts.column("name"), launch, launch_tid, ranges),
            "source_format": pa.array([SOURCE_FORMAT] * n, pa.string()),
        },
        where=where,
    )  # fmt: skip
    # NCCL's copy-engine and P2P-copy paths: a memcpy launched inside an nccl:* range is
    # that collective's communication (the driver makes flagged rows comm)
    kernels = kernels.append_column("comm_tagged", pc.and_(
        pc.equal(kernels.column("category"), "gpu_memcpy"), pc.is_valid(kernels.column("collective"))))

    steps = READER_STEP_SCHEMA.empty_table()
    rank = None
    if ranges is not None and ranges.num_rows:
        is_range = pc.is_in(ranges.column("event_type"), pa.array(_NVTX_RANGES, pa.int64()))
        rr = ranges.filter(pc.and_(is_range, pc.is_valid(ranges.column("end_ns"))))
        steps = step_rows(rr.column("name"), np_int(rr.column("start_ns")), np_int(rr.column("end_ns")), path)
        rank = _mpi_rank(ranges)
    env = meta["env"]
    if rank is None and only_one:
        rank = env_int(env, RANK_ENV)

    sync = _syncs(p, pid, calls, syncs, events, strings, where)
    n_records = pc.sum(pc.equal(sync.column("source"), "cuda_sync")).as_py() or 0
    n_events = n + calls.n_rows + (ranges.num_rows if ranges is not None else 0) + n_records
    info = {
        "world_size": env_int(env, WORLD_SIZE_ENV) if only_one else None,
        "host": meta["host"],
        "pid": pid,
        "source_path": str(path),
        "source_format": SOURCE_FORMAT,
        "base_time_ns": meta["base_time_ns"],
        "n_events": n_events,  # activities, API calls, NVTX events and sync records read
    }
    return with_syncs(RankTrace(rank=rank, kernels=kernels, steps=steps, devices=devices if devices.num_rows else None,
                                info=info), sync)  # fmt: skip


def _of_process(table: pa.Table | None, p: int) -> pa.Table | None:
    if table is None:
        return None
    return table.filter(pc.fill_null(pc.equal(table.column("process"), p), False))


def _column(table: pa.Table, name: str, typ: pa.DataType) -> pa.Array:
    """``name`` as read (``kernel_table`` checks that it fits ``typ``, naming the file, kernel
    and field), or nulls of ``typ`` where the export has no such column."""
    return table.column(name) if name in table.column_names else pa.nulls(table.num_rows, typ)


class _Calls:
    """A process's CUDA API calls, one per correlation id, sorted by it: the outermost
    (earliest) call where several share one (2.x exports write both ``cudaLaunchKernel`` and
    ``cudaLaunchKernel_v7000`` for one launch)."""

    def __init__(self, rt: pa.Table | None):
        self.n_rows = rt.num_rows if rt is not None else 0
        if rt is None or not rt.num_rows:
            self.corr = self.start = self.end = self.tid = self.name_id = np.zeros(0, np.int64)
            return
        rt = rt.filter(pc.is_valid(rt.column("correlation")))
        corr, start = np_int(rt.column("correlation")), np_int(rt.column("start_ns"))
        order = np.lexsort((start, corr))
        first = order[np.concatenate([[True], corr[order][1:] != corr[order][:-1]])] if len(order) else order
        self.corr, self.start = corr[first], start[first]
        self.end = np_int(rt.column("end_ns"))[first]
        self.tid = (np_int(rt.column("gtid")) & 0xFFFFFF)[first]
        self.name_id = np_int(rt.column("name_id"))[first]

    @staticmethod
    def take(values: np.ndarray, at: np.ndarray) -> np.ndarray:
        """``values[at]``, -1 where ``at`` is -1."""
        return np.where(at >= 0, values[np.maximum(at, 0)], -1) if len(values) else np.full(len(at), -1, np.int64)

    def find(self, corr: np.ndarray) -> np.ndarray:
        """Index of each correlation id's call; -1 where there is none (or the id is not > 0)."""
        if not len(self.corr):
            return np.full(len(corr), -1, np.int64)
        pos = np.minimum(np.searchsorted(self.corr, corr), len(self.corr) - 1)
        return np.where((corr > 0) & (self.corr[pos] == corr), pos, -1)


def _mpi_rank(ranges: pa.Table) -> int | None:
    """The rank from nsys's MPI thread naming (``NvtxThread`` events named ``MPI Rank N``)."""
    names = ranges.filter(pc.equal(ranges.column("event_type"), _NVTX_THREAD)).column("name").to_pylist()
    found = {int(m.group(1)) for s in names if s for m in [re.match(r"^MPI Rank (\d+)$", s)] if m}
    return found.pop() if len(found) == 1 else None


def _nvtx_collectives(names, launch: np.ndarray, launch_tid: np.ndarray, ranges: pa.Table | None) -> pa.Array:
    """The collective of each kernel from the innermost NVTX range around its launch on the
    launching thread: PyTorch's ``nccl:all_to_all, op_id = 7`` or NCCL's own ``ncclAllReduce``
    ranges. Every kernel launched inside one gets it (which kernels are communication is the
    run's rules' business: the driver keeps the collective of comm kernels only); null elsewhere."""
    n = len(names)
    if ranges is None or not n:
        return pa.nulls(n, pa.string())
    labels = [collective_of(s) if s and s.startswith(("nccl", "rccl")) else None for s in ranges.column("name").to_pylist()]
    labelled = np.flatnonzero([lbl is not None for lbl in labels])
    start = np_int(ranges.column("start_ns"))[labelled]
    end = np_int(ranges.column("end_ns"), -1)[labelled]
    tid = (np_int(ranges.column("gtid")) & 0xFFFFFF)[labelled]
    best = np.full(n, -1, np.int64)  # the labelled range that starts last around each launch
    best_start = np.full(n, np.iinfo(np.int64).min)
    known = launch_tid >= 0
    for j in range(len(labelled)):  # one vectorized pass per labelled range (they are few)
        inside = known & (launch_tid == tid[j]) & (launch >= start[j]) & (launch < end[j]) & (start[j] > best_start)
        best[inside], best_start[inside] = j, start[j]
    words = np.asarray([labels[i] for i in labelled] + [None], dtype=object)
    return pa.array(words[np.where(best >= 0, best, len(labelled))].tolist(), pa.string())


# --- devices ------------------------------------------------------------------------------


def _devices(device_ids: np.ndarray, pid: int | None, gpus: dict) -> pa.Table:
    """DEVICES rows for the CUDA devices a process used.

    The activity tables' ``deviceId`` is the process's CUDA device. ``TARGET_INFO_CUDA_DEVICE``
    maps (pid, CUDA device) to an nsys GPU id (``CUDA_VISIBLE_DEVICES`` renumbering
    included); without it (older exports) the ``TARGET_INFO_GPU`` row whose ``cuDevice``
    is that number is taken, which is right unless the process saw renumbered devices.
    """
    rows = []
    info = gpus["gpus"]
    for dev in np.unique(device_ids[device_ids >= 0]).tolist():
        gpu_id, n_sms = gpus["cuda"].get((pid, dev), (None, None)) if pid is not None else (None, None)
        g = info.get(gpu_id) if gpu_id is not None else None
        if g is None and not gpus["cuda"]:
            g = next((r for r in info.values() if r.get("cuDevice") == dev), None)
            if g is None and len(info) == 1:
                g = next(iter(info.values()))
        if g is None:
            continue
        rows.append(_device_row(dev, g, n_sms))
    if not rows:
        return READER_DEVICE_SCHEMA.empty_table()
    return conform(pa.Table.from_pylist(rows), READER_DEVICE_SCHEMA, where="TARGET_INFO_GPU")


def _device_row(dev: int, g: Mapping, n_sms) -> dict:
    def pos(key):
        v = g.get(key)
        return int(v) if isinstance(v, int) and v > 0 else None

    major, minor = g.get("computeMajor"), g.get("computeMinor")
    warps, warp = pos("maxWarpsPerSm"), pos("threadsPerWarp")
    return {
        "device": dev,
        "name": g.get("name"),
        "vendor": "nvidia",
        "arch": f"sm_{major}{minor}" if isinstance(major, int) and isinstance(minor, int) and major > 0 else None,
        "compute_major": major,
        "compute_minor": minor,
        "num_sms": n_sms if isinstance(n_sms, int) and n_sms > 0 else pos("smCount"),
        "max_threads_per_sm": warps * warp if warps and warp else None,
        "max_threads_per_block": pos("maxThreadsPerBlock"),
        "max_blocks_per_sm": pos("maxBlocksPerSm"),
        "regs_per_sm": pos("maxRegistersPerSm"),
        "regs_per_block": pos("maxRegistersPerBlock"),
        "shared_mem_per_sm": pos("maxShmemPerSm"),
        "shared_mem_per_block": pos("maxShmemPerBlock"),
        "shared_mem_per_block_optin": pos("maxShmemPerBlockOptin"),
        "warp_size": warp,
        "total_mem_bytes": pos("totalMemory"),
    }


# --- syncs -----------------------------------------------------------------------------------

_INVALID = 0xFFFFFFFF  # CUPTI_SYNCHRONIZATION_INVALID_VALUE (and CUPTI's "no event")
# ENUM_CUPTI_SYNC_TYPE names: used only where the API call is not in the export. nsys
# versions disagree on the numbers (3.13: cudaDeviceSynchronize is 1; 3.24: cudaStreamSynchronize
# is 2; 3.25: cudaEventQuery 1, cudaStreamWaitEvent 2, cudaStreamSynchronize 3), so the API
# name decides wherever it is known.
_TYPE_KIND = {
    "CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_EVENT_SYNCHRONIZE": "event_sync",
    "CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_STREAM_WAIT_EVENT": "stream_wait_event",
    "CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_STREAM_SYNCHRONIZE": "stream_sync",
    "CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_CONTEXT_SYNCHRONIZE": "context_sync",
}


def _syncs(p: int, pid, calls: _Calls, syncs: pa.Table | None, events: pa.Table | None, strings: _Strings,
           where: str) -> pa.Table:  # fmt: skip
    """One row per synchronisation-related API call of the process.

    ``cuda_sync``: every ``CUPTI_ACTIVITY_KIND_SYNCHRONIZATION`` record (stream, event and
    the record it waits on, through ``eventSyncId`` and ``CUPTI_ACTIVITY_KIND_CUDA_EVENT``);
    ``runtime``: event records (the CUDA-event table gives their stream and event where
    nsys traced it) and synchronising calls that have no sync record.
    """
    api_name = {nid: strings.get(nid) for nid in set(calls.name_id.tolist())}
    kinds = {nid: sync_kind(name) for nid, name in api_name.items()}
    ev = _of_process(events, p)
    record_of: dict[int, tuple] = {}  # record correlation -> (stream, event_id, device)
    record_by_sync: dict[tuple[int, int], tuple] = {}  # (event_id, eventSyncId) -> (stream, correlation)
    if ev is not None and ev.num_rows:
        cols = (ev.column(k).to_pylist() for k in ("stream", "correlation", "event_id", "event_sync_id", "device"))
        for s, c, e, sid, d in zip(*cols):
            if c is not None:
                record_of[c] = (s, e, d)
            if e is not None and sid is not None and sid != _INVALID:
                record_by_sync[(e, sid)] = (s, c)

    records = []

    def add(**row):
        # CUPTI writes 0xFFFFFFFF where a stream or event does not apply
        records.append({k: None if k in _MAYBE_INVALID and v in (_INVALID, -1) else v for k, v in row.items()})

    seen = set()
    sr = _of_process(syncs, p)
    if sr is not None and sr.num_rows:
        cols = {k: sr.column(k).to_pylist() for k in ("start_ns", "end_ns", "device", "stream", "correlation",
                                                       "event_id", "event_sync_id", "type_label")}  # fmt: skip
        at = calls.find(np_int(sr.column("correlation")))
        for i in range(sr.num_rows):
            c = cols["correlation"][i]
            name = api_name.get(int(calls.name_id[at[i]])) if at[i] >= 0 else None
            kind = sync_kind(name) or _TYPE_KIND.get(cols["type_label"][i] or "")
            wait_stream = wait_corr = None
            e, sid = cols["event_id"][i], cols["event_sync_id"][i]
            if kind in ("stream_wait_event", "event_sync") and (e, sid) in record_by_sync:
                wait_stream, wait_corr = record_by_sync[(e, sid)]
            add(source="cuda_sync", kind=kind, name=name or cols["type_label"][i], pid=pid,
                tid=int(calls.tid[at[i]]) if at[i] >= 0 else None, start_ns=cols["start_ns"][i],
                end_ns=cols["end_ns"][i], correlation=c, device=cols["device"][i], stream=cols["stream"][i],
                event_id=e, wait_on_stream=wait_stream, wait_on_record_correlation=wait_corr)  # fmt: skip
            if c is not None:
                seen.add(c)
    # the API calls themselves: event records always (no sync record describes them), other
    # synchronising calls where CUPTI gave no sync record (sync tracing off, 2.x exports)
    is_sync = np.isin(calls.name_id, np.array([nid for nid, k in kinds.items() if k is not None], np.int64))
    for i in np.flatnonzero(is_sync)[np.argsort(calls.start[is_sync], kind="stable")]:
        c, nid = int(calls.corr[i]), int(calls.name_id[i])
        kind = kinds[nid]
        if kind != "event_record" and c in seen:
            continue  # described by its sync record
        stream, event_id, device = record_of.get(c, (None, None, None)) if kind == "event_record" else (None,) * 3
        add(source="runtime", kind=kind, name=api_name[nid], pid=pid, tid=int(calls.tid[i]),
            start_ns=int(calls.start[i]), end_ns=int(calls.end[i]), correlation=c, device=device, stream=stream,
            event_id=event_id)  # fmt: skip
    return sync_table(records, where=where)


_MAYBE_INVALID = ("stream", "event_id", "wait_on_stream")
