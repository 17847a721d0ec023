"""Kineto trace events -> the four event tables ingest reads (GPU activities, runtime
calls, host ranges, CUDA sync records) by the Python reader (msgspec structs). The C
scanner (``chrome_columns``) builds the same tables faster where it is built; ``chrome``
assembles a rank from them.

Times are exact: ``ts``/``dur`` are decimal µs and become int64 ns by
``decimal_us_to_ns``'s rule (three fractional digits are whole ns; more round to the
nearest ns, ties to even), which ``_kineto.c`` applies too. A double holds epoch-scale µs
only to 0.25 µs, so a float literal there is read from its text, never as a double.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from itertools import compress
from operator import attrgetter
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from overlapviz.dataset.schema import SYNCS, conform

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
# CUPTI's synchronization records (Kineto >= 2023): which stream waited on which event
_SYNC_CATS = {"cuda_sync": "cuda_sync"}
ROUTE = {**{k: ("gpu", v) for k, v in _GPU_CATS.items()}, **{k: ("runtime", v) for k, v in _RUNTIME_CATS.items()}}
ROUTE.update({k: ("host", v) for k, v in _HOST_CATS.items()})
ROUTE.update({k: ("sync", v) for k, v in _SYNC_CATS.items()})

# what PyTorch records of a collective: on record_param_comms (torch >= 2.1), and copied
# by Kineto onto the NCCL kernels it launched (pytorch/kineto output_json.cpp
# appendCollectiveArgs); "Seq" from torch 2.5
_COMM_ARGS = {
    "Process Group Name": pa.string(),
    "Process Group Ranks": pa.string(),
    "Group size": pa.int64(),
    "In msg nelems": pa.int64(),
    "Out msg nelems": pa.int64(),
    "dtype": pa.string(),
    "Seq": pa.int64(),
}
# what a cuda_sync record names besides its stream: the event waited on, its recording stream and record call
_SYNC_ARGS = {
    "wait_on_stream": pa.int64(),
    "wait_on_cuda_event_id": pa.int64(),
    "wait_on_cuda_event_record_corr_id": pa.int64(),
}
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
    **_COMM_ARGS,
    **_SYNC_ARGS,
}
_TOP_TYPES = {"name": pa.string(), "pid": pa.int64(), "tid": pa.int64()}
TIMES = ("ts", "dur")  # int64 ns columns after the top-level ones, by decimal_us_to_ns


def _event_type(*args: str) -> pa.StructType:
    """The struct of the top-level fields plus the named ``args`` fields; converting only
    what a category needs keeps the bulk conversion cheap. Each bucket's table has the
    top-level columns, ``ts`` and ``dur`` (int64 ns), these args and ``category``."""
    arg_struct = pa.struct([(a, _ARG_TYPES[a]) for a in args])
    return pa.struct([*_TOP_TYPES.items(), ("args", arg_struct)])


_GPU_EVENT = _event_type(*[a for a in _ARG_TYPES if a not in _SYNC_ARGS])
_RUNTIME_EVENT = _event_type("correlation", "grid", "block", "shared memory", "stream", "device")
_HOST_EVENT = _event_type("External id", "Collective name", *_COMM_ARGS)
_SYNC_EVENT = _event_type("device", "stream", "correlation", *_SYNC_ARGS)
BUCKETS = ("gpu", "runtime", "host", "sync")
BUCKET_TYPES = (_GPU_EVENT, _RUNTIME_EVENT, _HOST_EVENT, _SYNC_EVENT)
BUCKET_WHAT = ("GPU activity", "runtime", "host", "cuda_sync")

# --- exact times --------------------------------------------------------------------

_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1


def decimal_us_to_ns(text: str) -> int | None:
    """Exact ns of a decimal µs text (``"1694128201436255.123"``, ``"1.5e3"``, ``" 20 "``).

    Integer µs * 1000 plus the first three fractional digits; further digits round to
    the nearest ns, ties to even (``"0.0005"`` -> 0, ``"0.0015"`` -> 2). The text is read
    as ``decimal.Decimal`` reads it, never as a double.

    Returns
    -------
    int or None
        None when ``text`` is not a finite decimal number.

    Raises
    ------
    OverflowError
        When the ns are past int64.
    """
    try:
        d = Decimal(text)
    except (InvalidOperation, ValueError, TypeError):
        return None
    if not d.is_finite():
        return None
    sign, digits, exp = d.as_tuple()
    n = int("".join(map(str, digits)))
    shift = exp + 3  # ns = n * 10**shift
    if n == 0:
        return 0
    if shift >= 0:
        if len(digits) + shift > 20:  # >= 10**19 ns: past int64, without building 10**shift
            raise OverflowError(text)
        ns = n * 10**shift
    elif len(digits) < -shift:  # under 0.1 ns
        ns = 0
    else:
        ns, rem = divmod(n, 10**-shift)
        half = 5 * 10 ** (-shift - 1)
        if rem > half or (rem == half and ns & 1):
            ns += 1
    ns = -ns if sign else ns
    if not _INT64_MIN <= ns <= _INT64_MAX:
        raise OverflowError(text)
    return ns


# decimal µs texts the vectorized conversion takes (everything else goes value by value)
_PLAIN_US = r"^-?[0-9]{1,19}(?:\.[0-9]{1,3})?$"
_NONE = type(None)


def ns_column(values: list, path: Path, what: str, label: str) -> pa.Array:
    """``ts`` or ``dur`` values as decoded (int µs, decimal text: a float literal's or a
    string's, None) -> exact int64 ns (null where None).

    Integers and plain decimal text (up to three fractional digits) convert in bulk,
    other text value by value through ``decimal_us_to_ns``.

    Raises
    ------
    ValueError
        Naming ``path`` and the field: a value that is not a number (true/false, a
        non-numeric string, a list, an object) or past int64 ns.
    """
    types = set(map(type, values))
    types.discard(_NONE)
    try:
        if types <= {int}:
            return pc.multiply_checked(pa.array(values, pa.int64()), 1000)
        if types <= {int, str}:
            texts = values if types <= {str} else [str(v) if type(v) is int else v for v in values]
            text = pa.array(texts, pa.string())
            if pc.all(pc.match_substring_regex(text, _PLAIN_US)).as_py() is not False:
                return _plain_ns(text)
    except (pa.ArrowInvalid, OverflowError):
        pass  # past int64: value by value names the value
    return pa.array([_one_ns(v, path, what, label) for v in values], pa.int64())


def _plain_ns(text: pa.Array) -> pa.Array:
    """ns of decimal texts matching ``_PLAIN_US``: their decimal128(38, 3) value's unscaled
    integer is the ns, read from its low 64 bits (the high ones only extend the sign)."""
    dec = pc.cast(text, pa.decimal128(38, 3))
    words = np.frombuffer(dec.buffers()[1], np.int64, count=2 * len(dec), offset=16 * dec.offset).reshape(-1, 2)
    lo, hi = words[:, 0], words[:, 1]
    null = np.asarray(dec.is_null(), dtype=bool) if dec.null_count else None
    wraps = hi != (lo >> 63)
    if (wraps if null is None else wraps & ~null).any():
        raise OverflowError("past int64 ns")
    return pa.array(lo, pa.int64(), mask=null)


def _one_ns(v, path: Path, what: str, label: str) -> int | None:
    if v is None:
        return None
    if type(v) not in (int, str):  # true/false, a list, an object
        return _bad(path, what, label, v)
    text = str(v)
    try:
        ns = v * 1000 if type(v) is int else decimal_us_to_ns(text)
        if ns is not None and not _INT64_MIN <= ns <= _INT64_MAX:
            raise OverflowError(text)
    except OverflowError:
        raise ValueError(f"{path}: {what} events: field {label!r} ({text:.40} us) is past what int64 nanoseconds hold") from None
    return _bad(path, what, label, v) if ns is None else ns


# --- the Python reader: msgspec structs ------------------------------------------------
#
# A dict per event (json, orjson) costs ~3x the decoding into structs, and most events
# (cpu_op arguments, flows, python functions) are never used: msgspec decodes into the
# structs below, which keep only the fields ingest reads (other keys are skipped in C).
# Each field takes any JSON value, and an event or its args may be any JSON value, so
# every document with a traceEvents list decodes and the column building judges the
# values: one Python reader for the odd documents too (a string where a number belongs,
# an event or args that is not an object). ts/dur are the only fields typed Any: the
# float_hook gives their float literals as text (and those of values nested two levels
# deep, which no field accepts); every other field gets floats as floats. Numbers
# written as strings (ROCm's hipMemcpy "bytes": "128") are read by _lenient_column.

_SCALAR = int | float | str | bool | None
_VALUE = _SCALAR | list[_SCALAR | list | dict] | dict  # floats as floats
_NOT_OBJECT = _SCALAR | list  # where an event or args belongs: refused


# the args keys of _ARG_TYPES (not identifiers: "registers per thread") as struct attributes
_ARG_ATTR = {key: f"arg{i}" for i, key in enumerate(_ARG_TYPES)}
# integer fields (and grid/block's integers) take Any: their float literals come as text, which the fast conversion
# refuses, so _lenient_column judges them (a whole number, or an error). As floats, pyarrow truncated 1.5 to 1.
_WHOLE = {key for key, t in _ARG_TYPES.items() if pa.types.is_integer(t) or pa.types.is_list(t)}
_Args = msgspec.defstruct("_Args", [(attr, Any if key in _WHOLE else _VALUE, None) for key, attr in _ARG_ATTR.items()],
                          rename={attr: key for key, attr in _ARG_ATTR.items()}, frozen=True, gc=False)  # fmt: skip
_NO_ARGS = _Args()  # an event without "args" (flows, instants): legitimate


class _Event(msgspec.Struct, gc=False):
    ph: _VALUE = None
    cat: _VALUE = None
    name: _VALUE = None
    pid: Any = None  # (as the integer args)
    tid: Any = None
    args: _Args | _NOT_OBJECT = _NO_ARGS
    ts: Any = None  # a float literal as its text
    dur: Any = None


_ABSENT = msgspec.Raw(b"")
# the top-level keys a rank reads besides traceEvents; kept raw, decoded when present
META_KEYS = ("deviceProperties", "distributedInfo", "baseTimeNanoseconds", "host_name", "hip_runtime_version",
              "cuda_runtime_version", "roctracer_version", "hip_driver_version")  # fmt: skip


_Doc = msgspec.defstruct(
    "_Doc", [("traceEvents", list[_Event | _NOT_OBJECT]), *((key, msgspec.Raw, _ABSENT) for key in META_KEYS)], gc=False
)
_DOC_DECODER = msgspec.json.Decoder(_Doc, float_hook=str)
_LIST_DECODER = msgspec.json.Decoder(list[_Event | _NOT_OBJECT], float_hook=str)
_BARE_LIST = re.compile(rb"\s*\[")  # a document that is a bare event list (no copy of it)
_ROUTE_KEYS = pa.array(list(ROUTE), pa.string())
_ROUTE_BUCKET = np.array([BUCKETS.index(b) for b, _ in ROUTE.values()], dtype=np.int8)
CATEGORY = pa.array([category for _, category in ROUTE.values()], pa.string())  # kernels.category by ROUTE index


def decode_events(raw: bytes, path: Path) -> tuple[list, dict]:
    """``(events, meta)`` of a Kineto document (JSON bytes, valid UTF-8): ``traceEvents``
    as structs (``event_tables`` reads them) and the keys of ``META_KEYS`` present at the
    top level, decoded. A bare JSON array is the events of a document without metadata.

    Raises
    ------
    ValueError
        Naming ``path``: truncated or invalid JSON, or a document that is not a trace.
    RecursionError
        Nesting deeper than Python's recursion limit.
    """
    try:
        if _BARE_LIST.match(raw):
            return _LIST_DECODER.decode(raw), {}
        doc = _DOC_DECODER.decode(raw)
        return doc.traceEvents, {k: msgspec.json.decode(v) for k in META_KEYS if len(v := getattr(doc, k))}
    except msgspec.DecodeError as exc:  # a RecursionError (nesting past Python's limit) goes up: the driver words it
        raise ValueError(f"{path}: {_json_error(raw, exc)}") from None


def _json_error(raw: bytes, exc: Exception) -> str:
    import orjson  # words JSON errors with a line and column

    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError as oexc:
        what = "truncated JSON" if "unexpected end" in str(oexc).lower() or oexc.pos >= len(raw) - 1 else "invalid JSON"
        return f"{what}: {oexc}"
    if not isinstance(doc, list) and not (isinstance(doc, dict) and isinstance(doc.get("traceEvents"), list)):
        return "not a Chrome trace (no traceEvents list)"
    return f"invalid JSON: {exc}"


def event_tables(events: list, path: Path) -> list[pa.Table]:
    """The GPU activity, runtime, host and sync tables of the complete events (``ph`` "X"
    or absent) of the categories ingest reads: the fields of each bucket's event type
    (``args`` flattened, ``ts``/``dur`` as exact int64 ns) and ``category``, as
    ``chrome_columns.scan_tables`` builds them.

    Raises
    ------
    ValueError
        Naming ``path``: first, in document order, an event that is not an object or a
        kept event whose ``args`` is not an object (the C scanner reports the same one);
        then a field of the wrong type or a time past int64 ns.
    """
    code = _routes(events, path)
    bucket = np.where(code >= 0, _ROUTE_BUCKET[np.maximum(code, 0)], -1)
    out = []
    for b, (what, type_) in enumerate(zip(BUCKET_WHAT, BUCKET_TYPES, strict=True)):
        idx = np.flatnonzero(bucket == b)
        table = _typed_table([events[i] for i in idx.tolist()], path, what, type_)
        out.append(table.append_column("category", CATEGORY.take(pa.array(code[idx]))))
    return out


_CAT, _PH, _ARGS = attrgetter("cat"), attrgetter("ph"), attrgetter("args")


def _routes(events: list, path: Path) -> np.ndarray:
    """Each event's index in ``ROUTE``, -1 where ingest does not keep it (another category,
    a category that is not a string, or not a complete event)."""
    try:
        cats = list(map(_CAT, events))
        stop = len(events)
    except AttributeError:  # a value that is not an object: the error, unless a kept event before it fails first
        stop = next(i for i, e in enumerate(events) if type(e) is not _Event)
        cats = list(map(_CAT, events[:stop]))
    code = pc.fill_null(pc.index_in(_strings(cats), value_set=_ROUTE_KEYS), -1).to_numpy().astype(np.int64)
    kept = np.flatnonzero(code >= 0)
    kept_events = list(map(events.__getitem__, kept.tolist()))
    complete = np.asarray(pc.fill_null(pc.equal(_strings(list(map(_PH, kept_events))), "X"), True), dtype=bool)
    code[kept[~complete]] = -1  # flows, instants: not activities
    kept, kept_events = kept[complete], list(compress(kept_events, complete))
    if set(map(type, map(_ARGS, kept_events))) - {_Args}:
        i, e = next((i, e) for i, e in zip(kept.tolist(), kept_events) if type(e.args) is not _Args)
        what = BUCKET_WHAT[_ROUTE_BUCKET[code[i]]]
        raise ValueError(f"{path}: {args_error(what, i, e.name, json_kind(e.args))}")
    if stop < len(events):
        raise ValueError(f"{path}: traceEvents holds a {type(events[stop]).__name__}, not an event object")
    return code


def _strings(values: list) -> pa.Array:
    """``values`` as strings: None as null, any other value that is not a string as "" (a
    category or phase no event of ingest has)."""
    try:
        return pa.array(values, pa.string())
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        return pa.array([v if type(v) is str else "" if v is not None else None for v in values], pa.string())


# the structs' top-level fields (name, pid, tid), for converting their tuples in one pass
_EVENT_TUPLE = pa.struct(list(_TOP_TYPES.items()))
_TOP = attrgetter(*_TOP_TYPES)


def _typed_table(events: list, path: Path, what: str, type_: pa.StructType) -> pa.Table:
    args_type = type_.field("args").type  # only the args this bucket reads: half the conversion
    try:
        # one C++ pass over tuples converts all fields ~1.5x faster than a list per field
        top = pa.array(list(map(_TOP, events)), _EVENT_TUPLE).flatten()
        get_args = attrgetter(*[_ARG_ATTR[f.name] for f in args_type])
        args = pa.array(list(map(get_args, map(_ARGS, events))), args_type).flatten()
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError):
        return _typed_columns(events, path, what, type_)  # numbers as strings, odd values: field by field
    cols = {f.name: top[_EVENT_TUPLE.get_field_index(f.name)] for f in type_ if f.name != "args"}
    for t in TIMES:
        cols[t] = ns_column(list(map(attrgetter(t), events)), path, what, t)
    cols.update(zip(args_type.names, args))
    return pa.table(cols)


def _typed_columns(events: list, path: Path, what: str, type_: pa.StructType) -> pa.Table:
    cols = {}
    for f in type_:
        if f.name != "args":
            cols[f.name] = _lenient_column(list(map(attrgetter(f.name), events)), f, path, what, f.name)
    for t in TIMES:
        cols[t] = ns_column(list(map(attrgetter(t), events)), path, what, t)
    args = list(map(_ARGS, events))
    for f in type_.field("args").type:
        cols[f.name] = _lenient_column(list(map(attrgetter(_ARG_ATTR[f.name]), args)), f, path, what, f"args.{f.name}")
    return pa.table(cols)


# --- what the tables are checked and joined by ---------------------------------------


def require(table: pa.Table, path: Path, what: str, columns=("name", "ts", "dur")) -> None:
    for col in columns:
        nulls = table.column(col).null_count
        if nulls:
            idx = int(np.flatnonzero(np.asarray(table.column(col).is_null()))[0])
            name = table.column("name")[idx].as_py()
            label = f" ({name!r:.60})" if name is not None and col != "name" else ""
            raise ValueError(f"{path}: {what} event{label} has no {col!r} ({nulls} such events)")


def event_times(table: pa.Table, path: Path, what: str) -> tuple[np.ndarray, np.ndarray]:
    """(start, duration) in int64 ns of events whose ``ts``/``dur`` were required; an end
    past int64 fails (numpy would wrap)."""
    start = table.column("ts").to_numpy()
    dur = table.column("dur").to_numpy()
    end = start + dur
    wrapped = (dur > 0) & (end < start) | (dur < 0) & (end > start)
    if wrapped.any():
        i = int(np.flatnonzero(wrapped)[0])
        raise ValueError(f"{path}: {what} event {table.column('name')[i].as_py()!r:.60} ends past what int64 nanoseconds hold")
    return start, dur


# runtime calls that record, wait on or synchronize with events and streams -> syncs.kind;
# any spelling: cuda*/hip*, per-thread-stream (_ptsz, _spt) and versioned (_v2) variants
_SYNC_CALL = (r"^(?:cuda|hip)(?P<call>EventRecordWithFlags|EventRecord|StreamWaitEvent|StreamSynchronize"
              r"|EventSynchronize|DeviceSynchronize|EventQuery)(?:_ptsz|_spt|_v[0-9]+)*$")  # fmt: skip
_SYNC_CALL_KINDS = {
    "EventRecord": "event_record",
    "EventRecordWithFlags": "event_record",
    "StreamWaitEvent": "stream_wait_event",
    "StreamSynchronize": "stream_sync",
    "EventSynchronize": "event_sync",
    "DeviceSynchronize": "context_sync",
    "EventQuery": "event_query",
}
# CUPTI synchronization record names (Kineto's cuda_sync events) -> syncs.kind
_CUDA_SYNC_KINDS = {
    "Stream Wait Event": "stream_wait_event",
    "Event Sync": "event_sync",
    "Context Sync": "context_sync",
    "Stream Sync": "stream_sync",
}
_SYNCS = pa.schema([f for f in SYNCS if f.name not in ("run_id", "rank")])
_NOT_SET = pa.array([-1], pa.int64())  # what CUPTI writes for an id it does not know
_NO_STREAM = pa.array([-1, 0xFFFFFFFF], pa.int64())  # and for a stream, also as uint32


def sync_table(runtime: pa.Table, sync: pa.Table, path: Path) -> pa.Table:
    """The rank's synchronization records (``schema.SYNCS`` without run_id/rank), by start.

    Runtime calls of ``_SYNC_CALL`` (``source`` "runtime", ``tid`` the calling thread) and
    every ``cuda_sync`` record (``source`` "cuda_sync", ``tid`` null: Kineto puts the
    stream there). Ids CUPTI sets to -1 (or 2**32 - 1 for streams) are null.
    """
    parts = []
    if runtime.num_rows:
        # a few dozen distinct API names among thousands of calls: match each name once
        names = pc.dictionary_encode(runtime.column("name")).combine_chunks()
        call = pc.struct_field(pc.extract_regex(names.dictionary, _SYNC_CALL), "call").take(names.indices)  # null: no match
        is_sync = pc.is_valid(call)
        if call.null_count < len(call):
            rows = runtime.filter(is_sync)
            parts.append(_sync_rows(rows, "runtime", _mapped(call.filter(is_sync), _SYNC_CALL_KINDS), rows.column("tid"), path))
    if sync.num_rows:
        parts.append(_sync_rows(sync, "cuda_sync", _mapped(sync.column("name"), _CUDA_SYNC_KINDS),
                                pa.nulls(sync.num_rows, pa.int64()), path))  # fmt: skip
    if not parts:
        return _SYNCS.empty_table()
    table = parts[0] if len(parts) == 1 else pa.concat_tables(parts)
    return table.sort_by([("start_ns", "ascending")])  # stable: runtime calls first at a tie


def _mapped(values, mapping: dict) -> pa.Array:
    return pa.array(list(mapping.values()), pa.string()).take(pc.index_in(values, pa.array(list(mapping), pa.string())))


def _sync_rows(rows: pa.Table, source: str, kind: pa.Array, tid, path: Path) -> pa.Table:
    require(rows, path, f"{source} sync")
    start, dur = event_times(rows, path, f"{source} sync")
    if (dur < 0).any():
        i = int(np.flatnonzero(dur < 0)[0])
        raise ValueError(f"{path}: {source} sync event {rows.column('name')[i].as_py()!r:.60} has negative duration")
    n = rows.num_rows

    def arg(name: str, invalid: pa.Array = _NOT_SET):
        if name not in rows.column_names:
            return pa.nulls(n, pa.int64())
        col = rows.column(name)
        return pc.if_else(pc.fill_null(pc.is_in(col, invalid), False), pa.scalar(None, pa.int64()), col)

    table = pa.table(
        {
            "source": pa.array(np.full(n, source, dtype=object), pa.string()),
            "kind": kind,
            "name": rows.column("name"),
            "pid": rows.column("pid"),
            "tid": tid,
            "start_ns": start,
            "end_ns": start + dur,
            "correlation": rows.column("correlation"),
            "device": rows.column("device"),
            "stream": arg("stream", _NO_STREAM),
            "event_id": arg("wait_on_cuda_event_id"),
            "wait_on_stream": arg("wait_on_stream", _NO_STREAM),
            "wait_on_record_correlation": arg("wait_on_cuda_event_record_corr_id"),
        }
    )
    return conform(table, _SYNCS, where=f"{path}: {source} sync events")


# --- values of the wrong type ------------------------------------------------------


# fields where a string that is not a number is a handle, not an id, and reads as null (like
# pid/tid labels such as Kineto's "Spans"): roctracer writes a runtime call's hipStream_t
# pointer ("stream": "0x0"), which names no stream of the GPU activities
_HANDLES = {("runtime", "args.stream")}


def _lenient_column(values: list, field: pa.Field, path: Path, what: str, label: str) -> pa.Array:
    try:
        return pa.array(values, type=field.type)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError):
        pass
    conv = values
    if pa.types.is_integer(field.type) or pa.types.is_floating(field.type):
        conv = []
        for v in values:
            if isinstance(v, str):
                try:
                    v = float(v) if pa.types.is_floating(field.type) else _whole(v, path, what, label)
                except _NotWhole:
                    raise
                except (ValueError, OverflowError):  # not a number; "inf", "1e400"
                    v = None if label in ("pid", "tid") or (what, label) in _HANDLES else _bad(path, what, label, v)
            conv.append(v)
        try:
            return pa.array(conv, type=field.type)
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError):
            pass
    elif pa.types.is_list(field.type) and pa.types.is_integer(field.type.value_type):  # grid, block: [x, y, z]
        conv = [[_whole(x, path, what, label) if isinstance(x, str) and _is_finite(x) else x for x in v]
                if isinstance(v, list) else v for v in values]  # fmt: skip
        try:
            return pa.array(conv, type=field.type)
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError):
            pass
    if pa.types.is_string(field.type):
        return pa.array([None if v is None else str(v) for v in values], type=field.type)
    # the first value that is not of the field's type, or past its range (shown as the trace wrote it)
    ok = list if pa.types.is_list(field.type) else (int, float)
    for v, c in zip(values, conv, strict=True):
        if c is None:
            continue
        if not isinstance(c, ok) or isinstance(c, bool):
            return _bad(path, what, label, v)
        if pa.types.is_integer(field.type) and isinstance(c, int) and not _INT64_MIN <= c <= _INT64_MAX:
            raise ValueError(f"{path}: {what} events: field {label!r} ({v!r:.40}) is past what int64 holds")
    return _bad(path, what, label, next((v for v in values if v is not None), values[0]))


class _NotWhole(ValueError):
    """A number that is not whole in an integer field (not "not a number": pid/tid labels read as null, this never)."""


def _whole(text: str, path, what, label) -> int:
    """The integer of a number's text in an integer field (a float literal's text, or a numeric string such as ROCm's
    ``"bytes": "128"``): ``int(float(text))``, as the C scanner reads it, where that is whole (``"2.0"``, ``"1e3"``).

    Raises
    ------
    ValueError
        ``text`` is not a number (the caller judges it); naming ``path`` and the field where it is a number that is not
        whole (``"device": 1.5`` was stored as device 1).
    """
    v = float(text)
    if v.is_integer():
        return int(v)
    if v != v or abs(v) == float("inf"):  # not a number
        raise ValueError(text)
    raise _NotWhole(f"{path}: {what} events: field {label!r} holds {text.strip():.40}, not a whole number")


def _is_finite(text: str) -> bool:
    try:
        v = float(text)
    except ValueError:
        return False
    return v == v and abs(v) != float("inf")


def _bad(path, what, label, value):
    raise ValueError(f"{path}: {what} events: field {label!r} has a value of the wrong type ({value!r:.40})")


# --- args must be an object -----------------------------------------------------------------
#
# Kineto writes an event's arguments as a JSON object, or leaves the key out (flows,
# instants). A kept event (GPU activity, runtime call, host range, cuda_sync record) whose
# "args" is anything else (an array, a string, a number, a boolean, null) is malformed:
# reading it as "no args" would drop its device, stream and correlation without a word.
# Both readers refuse it with this message: the Python reader (``_routes``), the C
# scanner through ``chrome_columns`` (``_kineto.BadArgs``).

JSON_KIND = {"[": "an array", '"': "a string", "t": "a boolean", "f": "a boolean", "n": "null"}  # else a number


def json_kind(value) -> str:
    """What a decoded JSON value is, in JSON's words (``"an array"``, ``"null"``, ...)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object" if isinstance(value, dict) else type(value).__name__


def args_error(what: str, index: int, name, kind: str) -> str:
    """The message (without the file) for the kept event ``index`` of ``traceEvents``
    whose ``args`` is ``kind``; its name is shown when it is a string."""
    label = f" {name!r:.60}" if isinstance(name, str) else ""
    return f"{what} event #{index}{label}: field 'args' is {kind}, not an object"
