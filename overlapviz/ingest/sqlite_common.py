"""What the SQLite trace readers (Nsight Systems exports, rocpd) share: read-only SQLite plumbing, the tables a reader hands over, steps from markers, rank environments and the synchronisation-call vocabulary."""

from __future__ import annotations

import contextlib
import re
import sqlite3
from collections.abc import Iterator, Mapping
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from overlapviz import schema
from overlapviz.ingest.base import RankTrace
from overlapviz.schema import conform

SQLITE_MAGIC = b"SQLite format 3\x00"

# --- what a reader hands over ----------------------------------------------------------

# columns the ingest driver fills itself
_DRIVER_FILLS = ("run_id", "rank", "kind", "step")
READER_KERNEL_SCHEMA = pa.schema([f for f in schema.KERNELS if f.name not in _DRIVER_FILLS])
READER_DEVICE_SCHEMA = pa.schema([f for f in schema.DEVICES if f.name not in ("run_id", "rank")])
READER_STEP_SCHEMA = pa.schema([f for f in schema.STEPS if f.name not in ("run_id", "rank")])

READER_SYNC_SCHEMA = pa.schema([f for f in schema.SYNCS if f.name not in ("run_id", "rank")])
SYNC_KINDS = ("event_record", "stream_wait_event", "event_sync", "stream_sync", "context_sync", "event_query")


def kernel_table(columns: Mapping[str, object], *, where: str) -> pa.Table:
    """A reader's kernels table from column arrays, with every ``READER_KERNEL_SCHEMA`` column.

    Raises
    ------
    ValueError
        Naming ``where``, the kernel and the field, for a number that does not fit its column.
    """
    from overlapviz.ingest.ranges import check_ranges

    table = pa.table(dict(columns))
    names = table.column("name") if "name" in table.column_names else None
    check_ranges(table, READER_KERNEL_SCHEMA, where, "kernel",
                 row=None if names is None else (lambda i: repr(names[i].as_py())[:60]))  # fmt: skip
    return conform(table, READER_KERNEL_SCHEMA, where=where)


def sync_table(records: list[dict], *, where: str) -> pa.Table:
    """A reader's syncs table from row dicts, with exactly ``READER_SYNC_SCHEMA``'s columns
    (absent keys null), in call order."""
    types = {f.name: f.type for f in READER_SYNC_SCHEMA}
    table = pa.table({k: pa.array([r.get(k) for r in records], t) for k, t in types.items()})
    table = conform(table, READER_SYNC_SCHEMA, where=where)
    return table.sort_by([("start_ns", "ascending"), ("correlation", "ascending")]) if records else table


def with_syncs(trace: RankTrace, syncs: pa.Table | None) -> RankTrace:
    """``trace`` with its ``syncs`` table set."""
    trace.syncs = syncs
    return trace


# --- SQLite plumbing --------------------------------------------------------------------


@contextlib.contextmanager
def open_readonly(path: Path) -> Iterator[sqlite3.Connection]:
    """A read-only, immutable connection to ``path``, closed on exit.

    Raises
    ------
    ValueError
        One line naming ``path``: not SQLite, truncated, or unreadable.
    """
    check_sqlite_file(path)
    uri = Path(path).resolve().as_uri() + "?mode=ro&immutable=1"
    try:
        db = sqlite3.connect(uri, uri=True)
    except sqlite3.Error as exc:
        raise ValueError(f"{path}: cannot open as SQLite ({exc})") from None
    # exports hold a few strings that are not UTF-8 (environment dumps): never fail on them
    db.text_factory = lambda b: b.decode("utf-8", "replace")
    try:
        try:
            db.execute("SELECT count(*) FROM sqlite_master").fetchone()
        except sqlite3.Error as exc:
            raise ValueError(f"{path}: not a readable SQLite database ({exc})") from None
        yield db
    finally:
        db.close()


def check_sqlite_file(path: Path) -> None:
    """Refuse a file that is not SQLite or is shorter than its header says.

    SQLite notices a missing page only when a query reaches it; the header's page count
    (valid when its version-valid-for number equals the change counter, as every SQLite
    since 3.7.0 writes it) tells a truncated copy at once.
    """
    try:
        with open(path, "rb") as fh:
            header = fh.read(100)
            size = fh.seek(0, 2)
    except OSError as exc:
        raise ValueError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if not header.startswith(SQLITE_MAGIC):
        raise ValueError(f"{path}: not an SQLite database")
    if len(header) < 100:
        raise ValueError(f"{path}: truncated SQLite database ({size} bytes, shorter than its header)")
    page_size = int.from_bytes(header[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    pages = int.from_bytes(header[28:32], "big")
    if header[24:28] == header[92:96] and pages and pages * page_size > size:
        raise ValueError(f"{path}: truncated SQLite database (header says {pages * page_size} bytes, file has {size})")
    wal = Path(f"{path}-wal")
    if header[18] == 2 and wal.exists() and wal.stat().st_size:  # an immutable open would not see its pages
        raise ValueError(f"{path}: its write-ahead log {wal.name} is not checkpointed (still being written?)")


def table_names(db: sqlite3.Connection) -> set[str]:
    return {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type IN ('table', 'view')")}


def columns_of(db: sqlite3.Connection, table: str) -> list[str]:
    return [r[1] for r in db.execute(f"PRAGMA table_info({quote(table)})")]


def quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def sniff_tables(path: Path, head: bytes) -> set[str]:
    """Table and view names of an SQLite ``path``; empty when it is not one or cannot be read."""
    if not head.startswith(SQLITE_MAGIC):
        return set()
    try:
        with open_readonly(path) as db:
            return table_names(db)
    except (ValueError, sqlite3.Error):
        return set()


def fetch(db: sqlite3.Connection, sql: str, types: Mapping[str, pa.DataType], params=()) -> dict[str, pa.Array]:
    """Run ``sql`` and return its columns as Arrow arrays of the given types (by result name)."""
    cur = db.execute(sql, params)
    names = [d[0] for d in cur.description]
    rows = cur.fetchall()
    cols = list(zip(*rows)) if rows else [()] * len(names)
    out = {}
    for name, values in zip(names, cols):
        typ = types.get(name, pa.int64())
        try:
            out[name] = pa.array(values, typ)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as exc:
            raise sqlite3.DatabaseError(f"column {name!r} does not hold {typ} values ({exc})") from None
    return out


def np_int(arr: pa.Array | pa.ChunkedArray, fill: int = -1) -> np.ndarray:
    """An integer Arrow array as int64 numpy, nulls as ``fill``."""
    return np.asarray(pc.fill_null(arr.cast(pa.int64()), fill).to_numpy(zero_copy_only=False), dtype=np.int64)


def np_bool(arr: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """A boolean Arrow array as numpy, nulls as False."""
    return np.asarray(pc.fill_null(arr, False).to_numpy(zero_copy_only=False), dtype=bool)


def masked(values: np.ndarray, valid: np.ndarray, typ: pa.DataType | None = None) -> pa.Array:
    """``values`` as an Arrow array (int64 unless ``typ``), null where not ``valid``."""
    return pa.array(values, typ or pa.int64(), mask=~np.asarray(valid, dtype=bool))


def check_durations(path: Path, what: str, start: np.ndarray, end: np.ndarray, names=None) -> None:
    """Negative durations are an error; zero-length activities are legitimate.

    ``names`` (an Arrow array, optional) names the first offending row in the message.
    """
    bad = np.flatnonzero(end < start)
    if len(bad):
        i = int(bad[0])
        label = f" {names[i].as_py()!r:.80}" if names is not None else ""
        raise ValueError(
            f"{path}: {what}{label} ends before it starts (negative duration: start {int(start[i])} ns, "
            f"end {int(end[i])} ns; {len(bad)} such rows)"
        )


def step_rows(names: pa.Array, start: np.ndarray, end: np.ndarray, path: Path) -> pa.Table:
    """STEPS rows from host ranges named ``ovz_iter#N`` (preferred) or ``ProfilerStep#N``.

    A suffix after a comma is allowed (``ProfilerStep#3, op_id = 12``: autograd's NVTX
    ranges append one). The same range written twice is kept once.
    """
    # one vectorized filter first: a trace holds millions of ranges and a few hundred steps
    candidates = np.flatnonzero(np_bool(pc.match_substring_regex(names, r"^(?:ovz_iter|ProfilerStep)#\d")))
    text = names.take(pa.array(candidates, pa.int64())).to_pylist()
    for source, pattern in _STEP_PATTERNS:
        rows = []
        for i, name in zip(candidates, text):
            m = pattern.match(name) if name else None
            if m:
                rows.append((int(m.group(1)), m.group(0).split(",")[0], int(start[i]), int(end[i])))
        if rows:
            rows = sorted(set(rows), key=lambda r: (r[2], -r[3], r[0]))
            bad = [r for r in rows if r[3] < r[2]]
            if bad:
                raise ValueError(f"{path}: step range {bad[0][1]!r} ends before it starts")
            keys = ("step", "name", "start_ns", "end_ns")
            table = pa.Table.from_pylist([dict(zip(keys, r)) | {"source": source} for r in rows])
            return conform(table, READER_STEP_SCHEMA, where=f"{path}: steps")
    return READER_STEP_SCHEMA.empty_table()


_STEP_PATTERNS = (
    ("iteration", re.compile(r"^ovz_iter#(\d+)(?:,.*)?$")),
    ("profiler_step", re.compile(r"^ProfilerStep#(\d+)(?:,.*)?$")),
)

# rank and world size from the launched process's environment, most specific first
RANK_ENV = ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PALS_RANKID", "SLURM_PROCID")
WORLD_SIZE_ENV = ("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE")


def env_int(env: Mapping[str, str], keys) -> int | None:
    for key in keys:
        value = env.get(key)
        if value is not None and re.fullmatch(r"\s*\d+\s*", str(value)):
            return int(value)
    return None


# --- synchronisation calls ------------------------------------------------------------

_SYNC_API = re.compile(
    r"^(?:cuda|cu|hip)(EventRecord(?:WithFlags)?|StreamWaitEvent|EventSynchronize|StreamSynchronize|"
    r"DeviceSynchronize|CtxSynchronize|ThreadSynchronize|EventQuery)(?:_v\d+)*(?:_ptsz|_ptds|_spt)?(?:_v\d+)*$"
)
_API_KIND = {
    "EventRecord": "event_record", "EventRecordWithFlags": "event_record", "StreamWaitEvent": "stream_wait_event",
    "EventSynchronize": "event_sync", "StreamSynchronize": "stream_sync", "DeviceSynchronize": "context_sync",
    "CtxSynchronize": "context_sync", "ThreadSynchronize": "context_sync", "EventQuery": "event_query",
}  # fmt: skip


def sync_kind(api_name: str | None) -> str | None:
    """``cudaStreamWaitEvent_v3020`` / ``hipStreamWaitEvent`` -> ``stream_wait_event``; None for other calls."""
    m = _SYNC_API.match(api_name) if api_name else None
    return _API_KIND[m.group(1)] if m else None


# --- the rocpd reader -------------------------------------------------------------------
