"""Kineto trace events -> the three event tables ingest reads (GPU activities, runtime
calls, host ranges), by the Python paths: msgspec structs, or orjson dicts for documents
msgspec cannot type. ``chrome_columns`` (the C scanner) builds the same tables faster;
``chrome`` assembles a rank from them.
"""

from __future__ import annotations

import re
from operator import attrgetter
from pathlib import Path

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from msgspec.structs import astuple

# category spellings across Kineto versions -> the name stored in kernels.category
_GPU_CATS = {
    "kernel": "kernel",
    "Kernel": "kernel",
    "gpu_memcpy": "gpu_memcpy",
    "Memcpy": "gpu_memcpy",
    "cuda_memcpy": "gpu_memcpy",
    "gpu_memset": "gpu_memset",
    "Memset": "gpu_memset",
    "cuda_memset": "gpu_memset",
}
_RUNTIME_CATS = {
    "cuda_runtime": "cuda_runtime",
    "Runtime": "cuda_runtime",
    "cuda_driver": "cuda_driver",
    "Driver": "cuda_driver",
    "xpu_runtime": "xpu_runtime",
    "privateuse1_runtime": "privateuse1_runtime",
    "privateuse1_driver": "privateuse1_driver",
}
_HOST_CATS = {"cpu_op": "cpu_op", "Operator": "cpu_op", "user_annotation": "user_annotation"}
_ROUTE = {**{k: ("gpu", v) for k, v in _GPU_CATS.items()}, **{k: ("runtime", v) for k, v in _RUNTIME_CATS.items()}}
_ROUTE.update({k: ("host", v) for k, v in _HOST_CATS.items()})

_ARG_TYPES = {
    "device": pa.int64(),
    "stream": pa.int64(),
    "correlation": pa.int64(),
    "grid": pa.list_(pa.int64()),
    "block": pa.list_(pa.int64()),
    "registers per thread": pa.int64(),
    "shared memory": pa.int64(),
    "bytes": pa.int64(),
    "External id": pa.int64(),
    "Collective name": pa.string(),
}
_TOP_TYPES = {
    "ph": pa.string(),
    "name": pa.string(),
    "pid": pa.int64(),
    "tid": pa.int64(),
    "ts": pa.float64(),
    "dur": pa.float64(),
}


def _event_type(*args: str) -> pa.StructType:
    """The struct of the top-level fields plus the named ``args`` fields; converting only
    what a category needs keeps the bulk conversion cheap."""
    arg_struct = pa.struct([(a, _ARG_TYPES[a]) for a in args])
    return pa.struct([*_TOP_TYPES.items(), ("args", arg_struct)])


_GPU_EVENT = _event_type(*_ARG_TYPES)
_RUNTIME_EVENT = _event_type("correlation", "grid", "block", "shared memory")
_HOST_EVENT = _event_type("External id", "Collective name")

# --- the fast path: typed decoding with msgspec -----------------------------------------
#
# orjson builds a dict per event, and most events (cpu_op arguments, flows, python
# functions) are never used. msgspec decodes into typed structs that keep only the fields
# below (unknown keys are skipped in C) and builds no dict at all: 2x faster, 1/3 the
# memory. A document msgspec cannot type (an object or a list where a number belongs, a non-object
# event, invalid JSON) goes through load_document + parse_document instead, which accept
# what they can and word the errors.


# Numbers written as strings (ROCm's hipMemcpy "bytes": "128") are typed as such here and
# converted like the dict path does (_lenient_column), so they cost no fallback.
class _Args(msgspec.Struct, frozen=True, gc=False, rename={
    "regs": "registers per thread", "smem": "shared memory", "external_id": "External id",
    "collective": "Collective name",
}):  # fmt: skip
    device: int | str | None = None
    stream: int | str | None = None
    correlation: int | str | None = None
    grid: list[int] | None = None
    block: list[int] | None = None
    regs: int | str | None = None
    smem: int | str | None = None
    bytes: int | str | None = None
    external_id: int | str | None = None
    collective: str | None = None


_NO_ARGS = _Args()
_ARG_ATTR = {  # args name in _ARG_TYPES -> _Args attribute
    "device": "device", "stream": "stream", "correlation": "correlation", "grid": "grid", "block": "block",
    "registers per thread": "regs", "shared memory": "smem", "bytes": "bytes", "External id": "external_id",
    "Collective name": "collective",
}  # fmt: skip


class _Event(msgspec.Struct, gc=False):
    ph: str | None = None
    cat: str | None = None
    name: str | None = None
    pid: int | str | None = None
    tid: int | str | None = None
    ts: float | str | None = None
    dur: float | str | None = None
    args: _Args = _NO_ARGS


_ABSENT = msgspec.Raw(b"")
# the top-level keys parse_document reads besides traceEvents; kept raw, decoded when present
_META_KEYS = ("deviceProperties", "distributedInfo", "baseTimeNanoseconds", "host_name", "hip_runtime_version",
              "cuda_runtime_version", "roctracer_version", "hip_driver_version")  # fmt: skip


class _Doc(msgspec.Struct, gc=False):
    traceEvents: list[_Event]
    deviceProperties: msgspec.Raw = _ABSENT
    distributedInfo: msgspec.Raw = _ABSENT
    baseTimeNanoseconds: msgspec.Raw = _ABSENT
    host_name: msgspec.Raw = _ABSENT
    hip_runtime_version: msgspec.Raw = _ABSENT
    cuda_runtime_version: msgspec.Raw = _ABSENT
    roctracer_version: msgspec.Raw = _ABSENT
    hip_driver_version: msgspec.Raw = _ABSENT


_DOC_DECODER = msgspec.json.Decoder(_Doc)
_LIST_DECODER = msgspec.json.Decoder(list[_Event])
_ROUTE_KEYS = pa.array(list(_ROUTE), pa.string())
_BUCKETS = ("gpu", "runtime", "host")
_BARE_LIST = re.compile(rb"\s*\[")  # a document that is a bare event list (no copy of it)
_ROUTE_BUCKET = np.array([_BUCKETS.index(b) for b, _ in _ROUTE.values()], dtype=np.int8)


def decode_typed(raw: bytes) -> tuple[list, dict] | None:
    """``(events, meta)`` of a Kineto document decoded into typed structs, or None when
    msgspec cannot type it (the caller then falls back to ``load_document``).

    ``meta`` holds the top-level keys of ``_META_KEYS`` that are present, decoded.
    """
    try:
        if _BARE_LIST.match(raw):
            return _LIST_DECODER.decode(raw), {}
        doc = _DOC_DECODER.decode(raw)
        meta = {k: msgspec.json.decode(v) for k in _META_KEYS if len(v := getattr(doc, k))}
    except msgspec.DecodeError:
        return None
    return doc.traceEvents, meta


def _split_typed(events: list, path: Path) -> tuple[pa.Table, pa.Table, pa.Table]:
    """The GPU, runtime and host events of ``events`` (typed structs) as flat tables, like
    ``_events_table`` builds from dicts."""
    cats = pa.array(list(map(attrgetter("cat"), events)), pa.string())
    code = pc.fill_null(pc.index_in(cats, value_set=_ROUTE_KEYS), -1).to_numpy().astype(np.int64)
    bucket = np.where(code >= 0, _ROUTE_BUCKET[np.maximum(code, 0)], -1)
    category = pa.array([v for _, v in _ROUTE.values()], pa.string())
    out = []
    for b, (what, type_) in enumerate((("GPU activity", _GPU_EVENT), ("runtime", _RUNTIME_EVENT), ("host", _HOST_EVENT))):
        idx = np.flatnonzero(bucket == b)
        evs = [events[i] for i in idx.tolist()]
        table = _typed_table(evs, path, what, type_)
        out.append(table.append_column("category", category.take(pa.array(code[idx]))))
    return tuple(out)


# the structs' fields in their order, for converting their tuples in one pyarrow pass
_EVENT_TUPLE = pa.struct([("ph", pa.string()), ("cat", pa.string()), *[(k, v) for k, v in _TOP_TYPES.items() if k != "ph"]])
_ARGS_TUPLE = pa.struct([(a, _ARG_TYPES[k]) for k, a in _ARG_ATTR.items()])
_EVENT_FIELDS = len(_EVENT_TUPLE)


def _typed_table(events: list, path: Path, what: str, type_: pa.StructType) -> pa.Table:
    try:
        # one C++ pass over tuples converts all fields ~1.5x faster than a list per field
        top = pa.array([t[:_EVENT_FIELDS] for t in map(astuple, events)], _EVENT_TUPLE).flatten()
        args = pa.array(list(map(astuple, map(attrgetter("args"), events))), _ARGS_TUPLE).flatten()
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError):
        return _typed_columns(events, path, what, type_)  # numbers as strings: field by field
    cols = {f.name: top[_EVENT_TUPLE.get_field_index(f.name)] for f in type_ if f.name != "args"}
    for f in type_.field("args").type:
        cols[f.name] = args[_ARGS_TUPLE.get_field_index(_ARG_ATTR[f.name])]
    return pa.table(cols)


def _typed_columns(events: list, path: Path, what: str, type_: pa.StructType) -> pa.Table:
    cols = {}
    for f in type_:
        if f.name != "args":
            cols[f.name] = _typed_column(list(map(attrgetter(f.name), events)), f, path, what, f.name)
    args = list(map(attrgetter("args"), events))
    for f in type_.field("args").type:
        cols[f.name] = _typed_column(list(map(attrgetter(_ARG_ATTR[f.name]), args)), f, path, what, f"args.{f.name}")
    return pa.table(cols)


def _typed_column(values: list, field: pa.Field, path: Path, what: str, label: str) -> pa.Array:
    try:
        return pa.array(values, type=field.type)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError):
        return _lenient_column(values, field, path, what, label)  # pid/tid as strings, ints past int64


# --- bulk column building ----------------------------------------------------------


def _events_table(events: list, path: Path, what: str, type_: pa.StructType) -> pa.Table:
    """The fields of ``type_`` for a list of event dicts, as a flat table (args.* flattened)."""
    try:
        arr = pa.array(events, type=type_)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError):
        arr = _events_lenient(events, path, what, type_)
    top = arr.flatten()
    cols = {f.name: top[i] for i, f in enumerate(type_)}
    args_type = type_.field("args").type
    args = cols.pop("args").flatten()
    for i, f in enumerate(args_type):
        cols[f.name] = args[i]
    return pa.table(cols)


def _events_lenient(events: list, path: Path, what: str, type_: pa.StructType) -> pa.StructArray:
    """Slow path: field by field, accepting numbers written as strings; names the bad field."""
    fields = []
    for f in type_:
        if f.name == "args":
            continue
        fields.append(_lenient_column([e.get(f.name) for e in events], f, path, what, f.name))
    args_type = type_.field("args").type
    args = [e.get("args") if isinstance(e.get("args"), dict) else {} for e in events]
    arg_cols = [_lenient_column([a.get(f.name) for a in args], f, path, what, f"args.{f.name}") for f in args_type]
    fields.append(pa.StructArray.from_arrays(arg_cols, fields=list(args_type)))
    return pa.StructArray.from_arrays(fields, fields=list(type_))


def _lenient_column(values: list, field: pa.Field, path: Path, what: str, label: str) -> pa.Array:
    try:
        return pa.array(values, type=field.type)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError):
        pass
    if pa.types.is_integer(field.type) or pa.types.is_floating(field.type):
        conv = []
        for v in values:
            if isinstance(v, str):
                try:
                    v = float(v) if pa.types.is_floating(field.type) else int(float(v))
                except ValueError:
                    v = None if label in ("pid", "tid") else _bad(path, what, label, v)
            conv.append(v)
        try:
            return pa.array(conv, type=field.type)
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError):
            pass
    if pa.types.is_string(field.type):
        return pa.array([None if v is None else str(v) for v in values], type=field.type)
    ok = list if pa.types.is_list(field.type) else (int, float)
    bad = next((v for v in values if v is not None and (not isinstance(v, ok) or isinstance(v, bool))), values[0])
    return _bad(path, what, label, bad)


def _bad(path, what, label, value):
    raise ValueError(f"{path}: {what} events: field {label!r} has a value of the wrong type ({value!r:.40})")
