"""Kineto trace JSON straight into Arrow columns through the C scanner ``_kineto``.

The Python reader (``chrome_events``: msgspec structs, then pyarrow) pays ~2 µs per kept
event for its Python objects; the scanner writes each field of the kept events into a
column buffer while it parses, so no event ever becomes a Python object. It returns None
for anything it does not read exactly like the Python reader (the caller then takes that
reader), so the two give the same tables; ``tests/test_chrome_columns.py`` holds them to it.

``OVERLAPVIZ_PURE_PYTHON=1`` turns it off (benchmarks and tests compare both paths).
"""

from __future__ import annotations

import os

import msgspec
import numpy as np
import pyarrow as pa

from overlapviz.ingest.chrome_events import (
    BUCKET_TYPES,
    BUCKET_WHAT,
    BUCKETS,
    JSON_KIND,
    META_KEYS,
    ROUTE,
    TIMES,
    CATEGORY,
    args_error,
)

try:
    from overlapviz.ingest import _kineto
except ImportError:  # built without a C compiler: the Python reader reads everything
    _kineto = None

__all__ = ["available", "scan_tables"]

# what the scanner keeps: each category's name and bucket (GPU activity, runtime, host, sync)
_CATS = [(cat.encode(), BUCKETS.index(bucket)) for cat, (bucket, _) in ROUTE.items()]


def available() -> bool:
    """Whether the C scanner is built and not turned off by ``OVERLAPVIZ_PURE_PYTHON``."""
    return _kineto is not None and os.environ.get("OVERLAPVIZ_PURE_PYTHON", "") in ("", "0")


def scan_tables(raw: bytes) -> tuple[list[pa.Table], dict, int] | None:
    """``(tables, meta, n_events)`` of a Kineto document, or None when the scanner is not
    available or leaves this document to the Python reader.

    Parameters
    ----------
    raw
        The document's JSON bytes (not gzipped).

    Returns
    -------
    tables
        The GPU activity, runtime, host and sync tables of the complete events: the
        fields of ``chrome_events``'s event type for each (``args`` flattened, ``ts`` and
        ``dur`` as exact int64 ns) and ``category``, like ``chrome_events.event_tables``
        builds.
    meta
        The keys of ``chrome_events.META_KEYS`` present at the top level, decoded.
    n_events
        Every event of ``traceEvents``, kept or not.

    Raises
    ------
    ValueError
        For a kept event whose ``args`` is not an object, worded as the Python reader
        words it (``chrome_events.args_error``), without the file (the reader adds it).
    """
    if not available():
        return None
    try:
        out = _kineto.scan(raw, _CATS, META_KEYS)
        view = memoryview(raw)
        meta = {k: msgspec.json.decode(view[a:b]) for k, (a, b) in out["meta"].items()}
        tables = [_table(cols, type_) for cols, type_ in zip(out["buckets"], BUCKET_TYPES, strict=True)]
    except _kineto.BadArgs as exc:
        index, bucket, name, first = exc.args
        raise ValueError(args_error(BUCKET_WHAT[bucket], index, name, JSON_KIND.get(first, "a number"))) from None
    except (_kineto.Unsupported, msgspec.DecodeError, pa.ArrowInvalid):
        return None
    return tables, meta, out["n_events"]


def _table(cols: dict, type_: pa.StructType) -> pa.Table:
    """One bucket's columns (the scanner fills every field for every bucket; the bucket's
    event type says which it reads), named by their trace keys."""
    n = cols["n"]
    table = {f.name: _column(cols, f, n) for f in type_ if f.name != "args"}
    table.update({t: _numbers(cols, t, np.int64) for t in TIMES})  # int64 ns
    table.update({f.name: _column(cols, f, n) for f in type_.field("args").type})
    table["category"] = CATEGORY.take(pa.array(np.frombuffer(cols["cat"], np.int8)))
    return pa.table(table)


def _column(cols: dict, field: pa.Field, n: int) -> pa.Array:
    key = field.name
    if f"{key}_rows" in cols:  # a rare field, stored (row, value) where present
        rows = np.frombuffer(cols[f"{key}_rows"], np.int64)
        if not len(rows):
            return pa.nulls(n, field.type)
        if pa.types.is_string(field.type):
            values = pa.LargeStringArray.from_buffers(len(rows), pa.py_buffer(cols[f"{key}_off"]), pa.py_buffer(cols[f"{key}_data"]))
            at = np.full(n, -1, np.int64)
            at[rows] = np.arange(len(rows))
            return values.take(pa.array(at, mask=at < 0)).cast(pa.string())
        present = np.zeros(n, dtype=bool)
        present[rows] = True
        values = np.zeros(n, np.int64)
        values[rows] = np.frombuffer(cols[key], np.int64)
        return pa.array(values, pa.int64(), mask=None if present.all() else ~present)
    if pa.types.is_string(field.type):
        return _strings(cols, key, n)
    if pa.types.is_list(field.type):
        return _lists(cols, key, n)
    return _numbers(cols, key, np.int64)


def _valid(cols: dict, key: str) -> np.ndarray | None:
    """The null mask (True = null) of a column, None when every value is present."""
    valid = np.frombuffer(cols[f"{key}_valid"], np.uint8)
    return None if valid.all() else valid == 0


def _numbers(cols: dict, key: str, dtype) -> pa.Array:
    return pa.array(np.frombuffer(cols[key], dtype), mask=_valid(cols, key))


def _bitmap(mask: np.ndarray | None):
    return None if mask is None else pa.py_buffer(np.packbits(~mask, bitorder="little"))


def _strings(cols: dict, key: str, n: int) -> pa.Array:
    mask = _valid(cols, key)
    arr = pa.LargeStringArray.from_buffers(
        n, pa.py_buffer(cols[f"{key}_off"]), pa.py_buffer(cols[f"{key}_data"]), _bitmap(mask),
        0 if mask is None else int(mask.sum()),
    )
    return arr.cast(pa.string())  # the scanner checked the UTF-8 (offsets past 2 GiB raise)


def _lists(cols: dict, key: str, n: int) -> pa.Array:
    mask = _valid(cols, key)
    offsets = pa.array(np.frombuffer(cols[f"{key}_off"], np.int32))
    values = pa.array(np.frombuffer(cols[f"{key}_vals"], np.int64))
    return pa.ListArray.from_arrays(offsets, values, mask=None if mask is None else pa.array(mask))
