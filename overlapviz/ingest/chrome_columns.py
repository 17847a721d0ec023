"""Kineto trace JSON straight into Arrow columns through the C scanner ``_kineto``.

The Python readers (msgspec structs, then pyarrow) pay ~2 µs per kept event for its
Python objects; the scanner writes each field of the kept events into a column buffer
while it parses, so no event ever becomes a Python object. It returns None for anything
it does not read exactly like the msgspec path (the caller then takes that path), so
the two give the same tables; ``tests/test_chrome_columns.py`` holds them to it.

``OVERLAPVIZ_PURE_PYTHON=1`` turns it off (benchmarks and tests compare both paths).
"""

from __future__ import annotations

import os

import msgspec
import numpy as np
import pyarrow as pa

try:
    from overlapviz.ingest import _kineto
except ImportError:  # built without a C compiler: the msgspec path reads everything
    _kineto = None

__all__ = ["available", "scan_tables"]

_INT_ARGS = ("device", "stream", "correlation", "registers per thread", "shared memory", "bytes", "External id")


def available() -> bool:
    """Whether the C scanner is built and not turned off by ``OVERLAPVIZ_PURE_PYTHON``."""
    return _kineto is not None and os.environ.get("OVERLAPVIZ_PURE_PYTHON", "") in ("", "0")


def scan_tables(raw: bytes, route: dict[str, tuple[int, str]], bucket_types: list[pa.StructType],
                meta_keys: tuple[str, ...]) -> tuple[list[pa.Table], dict, int] | None:  # fmt: skip
    """``(tables, meta, n_events)`` of a Kineto document, or None when the scanner is not
    available or leaves this document to the Python reader.

    Parameters
    ----------
    raw
        The document's JSON bytes (not gzipped).
    route
        ``{cat: (bucket, category)}``: the complete events of these categories, by bucket.
    bucket_types
        Per bucket, the struct type whose top-level and ``args`` fields its table holds.
    meta_keys
        Top-level keys to decode into ``meta`` when present.

    Returns
    -------
    tables
        One table per bucket: the fields of its type (``args`` flattened), ``ph`` (null:
        only complete events are kept) and ``category``.
    meta
        The present ``meta_keys``, decoded.
    n_events
        Every event of ``traceEvents``, kept or not.
    """
    if not available():
        return None
    cats = list(route)
    try:
        out = _kineto.scan(raw, [(c.encode(), route[c][0]) for c in cats], meta_keys)
        view = memoryview(raw)
        meta = {k: msgspec.json.decode(view[a:b]) for k, (a, b) in out["meta"].items()}
        category = pa.array([route[c][1] for c in cats], pa.string())
        tables = []
        for b, type_ in enumerate(bucket_types):
            cols = out["buckets"][b] if b < len(out["buckets"]) else None
            tables.append(_table(cols, type_, category))
    except (_kineto.Unsupported, msgspec.DecodeError, pa.ArrowInvalid):
        return None
    return tables, meta, out["n_events"]


def _table(cols: dict | None, type_: pa.StructType, category: pa.Array) -> pa.Table:
    if cols is None:
        empty = {f.name: pa.array([], f.type) for f in type_ if f.name != "args"}
        empty.update({f.name: pa.array([], f.type) for f in type_.field("args").type})
        return pa.table({**empty, "category": pa.array([], pa.string())})
    n = cols["n"]
    builders = {
        "ph": lambda: pa.nulls(n, pa.string()),
        "name": lambda: _strings(cols, "name", n),
        "pid": lambda: _numbers(cols, "pid", np.int64),
        "tid": lambda: _numbers(cols, "tid", np.int64),
        "ts": lambda: _numbers(cols, "ts", np.float64),
        "dur": lambda: _numbers(cols, "dur", np.float64),
        "grid": lambda: _lists(cols, "grid", n),
        "block": lambda: _lists(cols, "block", n),
        "Collective name": lambda: _strings(cols, "coll", n),
        **{k: (lambda k=k: _numbers(cols, k, np.int64)) for k in _INT_ARGS},
    }
    table = {f.name: builders[f.name]() for f in type_ if f.name != "args"}
    table.update({f.name: builders[f.name]() for f in type_.field("args").type})
    table["category"] = category.take(pa.array(np.frombuffer(cols["cat"], np.int8)))
    return pa.table(table)


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
