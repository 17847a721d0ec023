"""What the SQLite trace readers (Nsight Systems exports, rocpd) share: read-only SQLite plumbing, the tables a reader hands over, steps from markers, rank environments and the synchronisation-call vocabulary."""

from __future__ import annotations

import contextlib
import os
import re
import sqlite3
from collections.abc import Collection, Iterator, Mapping, Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv

from overlapviz.dataset import schema
from overlapviz.ingest.base import RankTrace
from overlapviz.dataset.schema import conform

try:
    from overlapviz.ingest import _sqlite
except ImportError:  # built without a C compiler: fetch reads through json_array
    _sqlite = None

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
    check_ranges(table, READER_KERNEL_SCHEMA, where, "kernel")  # "kernel <i> (<name>): <field> = ..."
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
    _OPENED[id(db)] = (db, uri)  # fetch's C reader opens the same URI
    # exports hold a few strings that are not UTF-8 (environment dumps, names): never fail on
    # them, read them with U+FFFD and count them (``repaired_count``)
    _REPAIRED[id(db)] = 0

    def decode(b: bytes) -> str:
        try:
            return b.decode("utf-8")
        except UnicodeDecodeError:
            _REPAIRED[id(db)] += 1
            return b.decode("utf-8", "replace")

    db.text_factory = decode
    try:
        try:
            db.execute("SELECT count(*) FROM sqlite_master").fetchone()
        except sqlite3.Error as exc:
            raise ValueError(f"{path}: not a readable SQLite database ({exc})") from None
        yield db
    finally:
        _OPENED.pop(id(db), None)
        _REPAIRED.pop(id(db), None)
        db.close()


def repaired_count(db: sqlite3.Connection) -> int:
    """How many text values read so far through ``open_readonly``'s ``db`` were not UTF-8
    (read with U+FFFD in place of the bad bytes)."""
    return _REPAIRED.get(id(db), 0)


def with_repaired(traces: list, n: int) -> list:
    """``traces`` with ``n`` repaired strings noted in the first one's info (the driver
    warns once per file)."""
    if n and traces:
        from overlapviz.ingest.text import REPAIRED_KEY

        traces[0].info[REPAIRED_KEY] = n
    return traces


# open_readonly's connections (id -> connection, URI): the only ones fetch's C reader reads
# again through its own connection (another may hold temporary tables or uncommitted rows)
_OPENED: dict[int, tuple[sqlite3.Connection, str]] = {}
# open_readonly's connections (id -> how many text values were not UTF-8)
_REPAIRED: dict[int, int] = {}


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


def check_columns(db: sqlite3.Connection, path: Path, table: str, required: Sequence[str], *,
                  integers: Collection[str] = ()) -> None:
    """Refuse a table of another schema before anything is read from it: each of ``required`` must
    be a column of ``table``, and each of ``integers`` a column whose declared type an integer
    can have (not TEXT, CHAR, CLOB, BLOB or REAL). A column read from a table that lacks it would
    be NULL in every row (times, ids): a dataset without times.

    Raises
    ------
    ValueError
        ``"<path>: table <table> has no column '<c>' (it has ...): ..."`` or ``"... column '<c>' is
        declared TEXT, not an integer ..."``, one line naming the file, table and column.
    """
    info = {r[1]: str(r[2] or "").upper() for r in db.execute(f"PRAGMA table_info({quote(table)})")}
    for c in required:
        if c not in info:
            have = ", ".join(list(info)[:12]) + (", ..." if len(info) > 12 else "")
            raise ValueError(f"{path}: table {table} has no column {c!r} (it has {have}): a schema overlapviz does not read")
    for c in integers:
        declared = info.get(c, "")
        if any(word in declared for word in ("CHAR", "CLOB", "TEXT", "BLOB", "REAL", "FLOA", "DOUB")):
            raise ValueError(f"{path}: table {table}: column {c!r} is declared {declared}, not an integer: "
                             "a schema overlapviz does not read")  # fmt: skip


def check_not_null(path: Path, table: str, arrays: Mapping[str, pa.Array], columns: Mapping[str, str]) -> None:
    """Refuse NULL in the ``columns`` (alias -> the table's column) that every row needs (times).

    Raises
    ------
    ValueError
        ``"<path>: table <table>: column '<c>' is NULL in N rows ..."``.
    """
    for alias, column in columns.items():
        nulls = arrays[alias].null_count
        if nulls:
            raise ValueError(f"{path}: table {table}: column {column!r} is NULL in {nulls} of {len(arrays[alias])} rows "
                             "(every activity needs its times)")  # fmt: skip


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


def fetch(db: sqlite3.Connection, columns: Mapping[str, str], tail: str, *, where: str, strings: Collection[str] = (),
          params=(), order_by: Sequence[str] = ()) -> dict[str, pa.Array]:  # fmt: skip
    """``SELECT <columns> <tail>`` as Arrow arrays: exact int64, or strings for the aliases in ``strings``.

    No Python object per value. Where the C column reader (``_sqlite``, see
    ``c_reader_available``) is there and ``db`` is one of ``open_readonly``'s, it runs the
    SELECT on its own connection to the same URI and returns each column's buffers (int64
    values and validity; string offsets and bytes). Otherwise SQLite renders each row's
    integers as one JSON array in C (``json_array``: integers in decimal, NULL as ``null``,
    text quoted, reals with a point or an exponent), a block of rows is parsed by
    ``pyarrow.csv`` as int64 columns (multithreaded), and only those strings cross into
    Python. Both take exactly SQLite's storage classes: an integer column holds INTEGER or
    NULL (text, a real, a blob is refused), a string column TEXT, NULL or a blob's bytes
    (an integer or a real is refused); both give the same arrays.

    Parameters
    ----------
    columns
        Result alias -> SQL expression (a column, ``NULL``, ...), in result order.
    tail
        ``FROM ... [WHERE ...] [ORDER BY ...]``: the rows keep its order.
    order_by
        Integer aliases to sort the rows by, as ``ORDER BY`` those expressions would (NULL
        first, ascending), but in numpy after the fetch: SQLite's sorter copies every
        whole row into a temporary B-tree, a lexsort of the keys costs a fraction of that.
        Rows equal on every key keep ``tail``'s order.
    where
        The file and table, for messages.

    Raises
    ------
    ValueError
        ``"<where>: field '<column>' holds a text value ('x'), not an integer"`` (or a
        real, a blob; a string column holding a number): the first such value in the
        order the rows are handed over.
    sqlite3.Error
        The database cannot be read (corrupt pages).
    """
    texts = [a for a in columns if a in strings]
    out = _fetch_c(db, columns, tail, where, texts, params, order_by) if c_reader_available() else None
    if out is None:
        out = _fetch_json(db, columns, tail, where, texts, params, order_by)
    return _sorted(out, order_by) if order_by else out


def c_reader_available() -> bool:
    """Whether ``fetch`` may read through the C column reader: built, bound to the SQLite
    library Python's ``sqlite3`` uses, and not turned off by ``OVERLAPVIZ_PURE_PYTHON``."""
    global _BOUND
    if _sqlite is None or os.environ.get("OVERLAPVIZ_PURE_PYTHON", "") not in ("", "0"):
        return False
    if _BOUND is None:
        _BOUND = _bind()
    return bool(_BOUND)


_BOUND: str | None = None  # the library the C reader bound ("" none), once tried


def _bind() -> str:
    """Bind ``_sqlite`` to Python's own SQLite: ``_sqlite3`` itself first (its symbols, or
    those of the libsqlite3 it links), among the libraries already loaded, then by name."""
    import _sqlite3

    names = [getattr(_sqlite3, "__file__", None), "libsqlite3.so.0", "libsqlite3.so", "libsqlite3.dylib",
             "/usr/lib/libsqlite3.dylib"]  # fmt: skip
    return _sqlite.bind([n for n in names if n]) or ""


def _fetch_c(db, columns: Mapping[str, str], tail: str, where: str, texts, params, order_by) -> dict | None:
    """``fetch`` through ``_sqlite``; None where it leaves the query to the json_array path
    (a connection not from ``open_readonly``, parameters it does not bind, any SQLite
    error, which that path raises as it always has)."""
    opened = _OPENED.get(id(db))
    if opened is None or opened[0] is not db or not isinstance(params, (tuple, list)):
        return None
    kinds = "".join("s" if a in texts else "i" for a in columns)
    got = _sqlite.read(opened[1], f"SELECT {', '.join(columns.values())} {tail}", tuple(params), kinds)
    if got is None:
        return None
    if got[0] == "bad":  # (row, column, type) in SQLite's order; the message names the first in fetch's
        bad = _first_bad_value(db, columns, tail + _order_sql(columns, order_by), params, texts)
        if bad is None:
            return None
        raise ValueError(f"{where}: {bad}")
    n, buffers = got
    out = {}
    for a, col in zip(columns, buffers):
        if a in texts:
            offsets, data, valid, nulls = col
            raw = pa.Array.from_buffers(pa.binary(), n, [_buffer(valid), pa.py_buffer(offsets), pa.py_buffer(data)], nulls)
            out[a] = _text(raw, db.text_factory)
        else:
            values, valid, nulls = col
            out[a] = pa.Array.from_buffers(pa.int64(), n, [_buffer(valid), pa.py_buffer(values)], nulls)
    return out


def _buffer(data: bytes | None) -> pa.Buffer | None:
    return None if data is None else pa.py_buffer(data)


def _order_sql(columns: Mapping[str, str], order_by: Sequence[str]) -> str:
    return f" ORDER BY {', '.join(columns[a] for a in order_by)}" if order_by else ""


def _fetch_json(db, columns: Mapping[str, str], tail: str, where: str, texts, params, order_by) -> dict[str, pa.Array]:
    """``fetch`` through ``json_array`` and ``pyarrow.csv`` (unsorted)."""
    ints = [a for a in columns if a not in texts]
    exprs = [f"json_array('', {', '.join(columns[a] for a in ints)}, '')"] if ints else []
    exprs += [columns[a] for a in texts]
    first_text = 1 if ints else 0
    parts: dict[str, list[pa.Array]] = {a: [] for a in columns}
    decode = db.text_factory
    db.text_factory = bytes  # text as it is stored: no Python call per value
    try:
        cur = db.execute(f"SELECT {', '.join(exprs)} {tail}", params)
        while rows := cur.fetchmany(_FETCH_ROWS):
            if ints:
                block = _parse_ints(b"\n".join([r[0] for r in rows]), ints)
                for a in ints:
                    parts[a].append(block.column(a).combine_chunks())
            for j, a in enumerate(texts, first_text):
                parts[a].append(_text(pa.array([r[j] for r in rows], pa.binary()), decode))
    except (sqlite3.Error, pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        db.text_factory = decode
        if "no such function: json_array" in str(exc):
            raise ValueError(f"{where}: this Python's SQLite library ({sqlite3.sqlite_version}) was built without "
                             "the JSON functions the reader needs (json_array)") from None  # fmt: skip
        # the first bad value in the order the rows are handed over (a corrupt database raises here again)
        bad = _first_bad_value(db, columns, tail + _order_sql(columns, order_by), params, texts)
        if bad is None:
            raise exc from None
        raise ValueError(f"{where}: {bad}") from None
    finally:
        db.text_factory = decode
    return {a: _concat(parts[a], pa.string() if a in texts else pa.int64()) for a in columns}


def _sorted(arrays: dict[str, pa.Array], keys: Sequence[str]) -> dict[str, pa.Array]:
    """``arrays`` (columns of one length) in the order of ``keys`` (int64 arrays, NULL first), stable."""
    sort_keys = []
    for a in reversed(keys):  # np.lexsort: the last key is the primary one
        col = arrays[a]
        sort_keys.append(np_int(col, 0))
        if col.null_count:
            sort_keys.append(np.asarray(col.is_valid()))  # False (NULL) before True
    order = np.lexsort(sort_keys)
    if (order[1:] > order[:-1]).all():  # already in that order
        return arrays
    at = pa.array(order, pa.int64())
    return {a: col.take(at) for a, col in arrays.items()}


_FETCH_ROWS = 65536  # rows per block: a few MB of text at a time, whatever the table's size
_CSV_PARSE = pcsv.ParseOptions(quote_char=False, double_quote=False, escape_char=False, newlines_in_values=False)


def _parse_ints(text: bytes, names: list[str]) -> pa.Table:
    """Rows ``["",1,null,...,""]`` (``json_array`` output) as int64 columns ``names``: the
    brackets and the empty strings around the values are two extra fields, left unread."""
    return pcsv.read_csv(
        pa.py_buffer(text),
        read_options=pcsv.ReadOptions(column_names=["[", *names, "]"], use_threads=False),
        parse_options=_CSV_PARSE,
        convert_options=pcsv.ConvertOptions(
            column_types=dict.fromkeys(names, pa.int64()), include_columns=names, null_values=["null"]
        ),
    )


def _text(raw: pa.Array, decode) -> pa.Array:
    """Stored text (a binary array) as a string array; where some is not UTF-8, every value
    through the connection's own decoding (``open_readonly``'s replaces what is not UTF-8)."""
    try:
        return raw.cast(pa.string())
    except pa.ArrowInvalid:
        decode = (lambda v: v.decode()) if decode is str else decode  # sqlite3's default: strict UTF-8
        return pa.array([None if v is None else decode(v) for v in raw.to_pylist()], pa.string())


def _concat(arrays: list[pa.Array], typ: pa.DataType) -> pa.Array:
    if not arrays:
        return pa.array([], typ)
    return arrays[0] if len(arrays) == 1 else pa.concat_arrays(arrays)


def _first_bad_value(db, columns: Mapping[str, str], tail: str, params, texts) -> str | None:
    """What the first value of the wrong type is, and in which column; None if there is none."""
    for alias, expr in columns.items():
        allowed = ("text", "null") if alias in texts else ("integer", "null")
        sql = f"SELECT t, v FROM (SELECT typeof({expr}) AS t, quote({expr}) AS v {tail}) WHERE t NOT IN {allowed} LIMIT 1"
        row = db.execute(sql, params).fetchone()
        if row is not None:
            field = re.sub(r"^\w+\.", "", expr).strip('"')
            want = "a string" if alias in texts else "an integer"
            article = "an" if row[0] == "integer" else "a"
            return f"field {field!r} holds {article} {row[0]} value ({str(row[1])[:60]}), not {want}"
    return None


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
