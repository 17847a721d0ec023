"""Kineto trace events -> the four event tables ingest reads (GPU activities, runtime
calls, host ranges, CUDA sync records), by the Python paths: msgspec structs, or dicts for
documents msgspec cannot type. ``chrome_columns`` (the C scanner) builds the same tables
faster; ``chrome`` assembles a rank from them.

Times are exact: ``ts``/``dur`` are decimal µs and become int64 ns by
``decimal_us_to_ns``'s rule (three fractional digits are whole ns; more round to the
nearest ns, ties to even), which ``_kineto.c`` applies too. A double holds epoch-scale µs
only to 0.25 µs, so a float literal is read from its text, or as a double only where
``_provable`` shows the double gives the same ns.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
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
# the tables events are sorted into (by ROUTE, category -> bucket), their struct types and what errors call them
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


class FloatText(float):
    """A JSON float literal that keeps its text: ``ts``/``dur`` are read exactly from it,
    everything else sees the float (the dict path's ``float_hook``)."""

    text: str


def float_text(text: str) -> FloatText:
    f = FloatText(text)
    f.text = text
    return f


# decimal µs texts the vectorized conversion takes (everything else goes value by value)
_PLAIN_US = r"^-?[0-9]{1,19}(?:\.[0-9]{1,3})?$"
_NONE = type(None)


class InexactTimes(Exception):
    """A ``ts``/``dur`` double whose ns the decimal rule may give otherwise than the double
    does: the caller reads the times from their text instead (``decode_text``)."""


def ns_column(values: list, path: Path, what: str, label: str, *, doubles: str = "trust") -> pa.Array:
    """``ts`` or ``dur`` values as decoded (int µs, decimal text, ``FloatText``, double,
    None) -> exact int64 ns (null where None).

    Integers and plain decimal text (up to three fractional digits) convert in bulk,
    other text value by value through ``decimal_us_to_ns``. A double (a float literal
    msgspec parsed) converts by ``float_us_to_ns``: with ``doubles="prove"`` only where
    that provably is the decimal rule's ns (``_provable``), else InexactTimes; with
    ``"trust"`` always (the dict path has no bare doubles: its float literals are
    ``FloatText``).

    Raises
    ------
    ValueError
        Naming ``path`` and the field: a value that is not a number (true/false, a
        non-numeric string, a list, an object) or past int64 ns.
    InexactTimes
        ``doubles="prove"`` and a double that cannot be proven.
    """
    types = set(map(type, values))
    types.discard(_NONE)
    try:
        if types <= {int}:
            return pc.multiply_checked(pa.array(values, pa.int64()), 1000)
        if types <= {int, str, FloatText}:
            texts = values if types <= {str} else [_text(v) for v in values]
            text = pa.array(texts, pa.string())
            if pc.all(pc.match_substring_regex(text, _PLAIN_US)).as_py() is not False:
                return _plain_ns(text)
        elif types <= {float}:
            arr = pa.array(values, pa.float64())
            us = np.asarray(pc.fill_null(arr, 0.0), dtype=np.float64)
            if doubles == "prove" and not _provable(us):
                raise InexactTimes(label)
            ns = float_us_to_ns(us)
            return pa.array(ns, pa.int64(), mask=np.asarray(arr.is_null(), dtype=bool) if arr.null_count else None)
    except (pa.ArrowInvalid, OverflowError):
        pass  # past int64: value by value names the value
    return pa.array([_one_ns(v, path, what, label, doubles) for v in values], pa.int64())


def _provable(us: np.ndarray) -> bool:
    """Whether ``float_us_to_ns(us)`` is, value by value, the decimal rule's ns of the text
    the double was parsed from, whatever that text was.

    The double is within one ulp of the text's value, so the text's ns lie within
    ``d + 1000 ulp`` of the double's rounded ns, ``d`` being the double's own distance
    to it (0.001 ns spare for the arithmetic here); below half a ns no rounding, ties
    included, can come out otherwise. Kineto's three-decimal times pass up to 2**40 µs
    (12.7 days after its base time); epoch-scale ones, and more than three decimals
    near a half ns, do not.
    """
    with np.errstate(invalid="ignore"):  # infinities: NaN, which compares False
        whole = np.floor(us)
        frac_ns = (us - whole) * 1000.0
        return bool((np.abs(frac_ns - np.rint(frac_ns)) + 1000.0 * np.spacing(np.abs(us)) < 0.499).all())


def _text(v):
    return v.text if type(v) is FloatText else str(v) if type(v) is int else v


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


def float_us_to_ns(us: np.ndarray) -> np.ndarray:
    """Doubles of µs -> int64 ns, whole µs and the fraction apart: exact for values
    written with three decimals below 2**43 µs and integers up to 2**53; the reader uses
    it only where ``_provable`` says so. Raises OverflowError for NaN, infinities and past
    int64 ns."""
    if not (np.abs(us) < 9.2e15).all():  # NaN compares False
        raise OverflowError("past int64 ns")
    whole = np.floor(us)
    return whole.astype(np.int64) * 1000 + np.rint((us - whole) * 1000.0).astype(np.int64)


def _one_ns(v, path: Path, what: str, label: str, doubles: str) -> int | None:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float, str)):
        return _bad(path, what, label, v)
    text = v.text if isinstance(v, FloatText) else v if isinstance(v, str) else None
    try:
        if isinstance(v, int):
            ns = v * 1000
            if not _INT64_MIN <= ns <= _INT64_MAX:
                raise OverflowError(v)
            return ns
        if text is None:  # a double
            us = np.array([v], dtype=np.float64)
            if doubles == "prove" and not _provable(us):
                raise InexactTimes(label)
            return int(float_us_to_ns(us)[0])
        ns = decimal_us_to_ns(text)
    except OverflowError:
        shown = text if text is not None else repr(v)
        raise ValueError(f"{path}: {what} events: field {label!r} ({shown:.40} us) is past what int64 nanoseconds hold") from None
    return _bad(path, what, label, v) if ns is None else ns


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
    "collective": "Collective name", "pg_name": "Process Group Name", "pg_ranks": "Process Group Ranks",
    "group_size": "Group size", "in_nelems": "In msg nelems", "out_nelems": "Out msg nelems", "seq": "Seq",
    "wait_stream": "wait_on_stream", "wait_event": "wait_on_cuda_event_id",
    "wait_record": "wait_on_cuda_event_record_corr_id",
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
    pg_name: str | None = None
    pg_ranks: str | None = None
    group_size: int | str | None = None
    in_nelems: int | str | None = None
    out_nelems: int | str | None = None
    dtype: str | None = None
    seq: int | str | None = None
    wait_stream: int | str | None = None
    wait_event: int | str | None = None
    wait_record: int | str | None = None


_NO_ARGS = _Args()
_ARG_ATTR = {  # args name in _ARG_TYPES -> _Args attribute
    "device": "device", "stream": "stream", "correlation": "correlation", "grid": "grid", "block": "block",
    "registers per thread": "regs", "shared memory": "smem", "bytes": "bytes", "External id": "external_id",
    "Collective name": "collective", "Process Group Name": "pg_name", "Process Group Ranks": "pg_ranks",
    "Group size": "group_size", "In msg nelems": "in_nelems", "Out msg nelems": "out_nelems", "dtype": "dtype",
    "Seq": "seq", "wait_on_stream": "wait_stream", "wait_on_cuda_event_id": "wait_event",
    "wait_on_cuda_event_record_corr_id": "wait_record",
}  # fmt: skip


class _Event(msgspec.Struct, gc=False):
    """``decode_exact``'s events: ts/dur as exact ints, doubles that ``ns_column`` proves or
    rejects, or strings."""

    ph: str | None = None
    cat: str | None = None
    name: str | None = None
    pid: int | str | None = None
    tid: int | str | None = None
    args: _Args = _NO_ARGS
    ts: int | float | str | None = None
    dur: int | float | str | None = None


class _TextEvent(_Event, gc=False):
    """``decode_text``'s events: ts/dur as ints, a float literal's text (the decoder's
    float_hook), or whatever else the trace holds, for ``ns_column`` to judge."""

    ts: Any = None
    dur: Any = None


_ABSENT = msgspec.Raw(b"")
# the top-level keys parse_document reads besides traceEvents; kept raw, decoded when present
META_KEYS = ("deviceProperties", "distributedInfo", "baseTimeNanoseconds", "host_name", "hip_runtime_version",
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


class _TextDoc(_Doc, gc=False):
    traceEvents: list[_TextEvent]


_DECODERS = {
    "exact": (msgspec.json.Decoder(_Doc), msgspec.json.Decoder(list[_Event])),
    # float_hook=str: a float literal in ts/dur (the only fields typed Any) stays its text
    "text": (msgspec.json.Decoder(_TextDoc, float_hook=str), msgspec.json.Decoder(list[_TextEvent], float_hook=str)),
}
_ROUTE_KEYS = pa.array(list(ROUTE), pa.string())
_BARE_LIST = re.compile(rb"\s*\[")  # a document that is a bare event list (no copy of it)
_ROUTE_BUCKET = np.array([BUCKETS.index(b) for b, _ in ROUTE.values()], dtype=np.int8)


# the document's first times, to guess whether doubles will hold its times (_doubles_hold)
_FIRST_TIMES = re.compile(rb'"(?:ts|dur)"\s*:\s*(-?[0-9][0-9.eE+-]*)')


def decode_exact(raw: bytes) -> tuple[list, dict] | None:
    """``(events, meta)`` of a Kineto document decoded into typed structs, or None when
    msgspec cannot type it (the caller then falls back to ``load_document``).

    ``ts``/``dur``: integer literals as exact ints, strings as strings, float literals as
    doubles where the document's first times say doubles hold them to the ns (Kineto's
    times relative to its base, below 2**40 µs: 3-4x faster to decode than text), else as
    their text (``decode_text``). ``split_typed(..., doubles="prove")`` raises
    InexactTimes where that guess was wrong; ``meta`` holds the top-level keys of
    ``META_KEYS`` that are present, decoded.
    """
    return _decode(raw, "exact" if _doubles_hold(raw) else "text")


def _doubles_hold(raw: bytes) -> bool:
    """Whether the float literals among the times in the first 64 KiB of ``raw`` are
    provably exact as doubles (``_provable``); no float literals: True."""
    first = [t for t in _FIRST_TIMES.findall(raw[: 1 << 16]) if not t.lstrip(b"-").isdigit()]
    try:
        return not first or _provable(np.array([float(t) for t in first]))
    except ValueError:  # not a number after all: the decoder judges it
        return True


def decode_text(raw: bytes) -> tuple[list, dict] | None:
    """``decode_exact`` with every float literal of ``ts``/``dur`` as its text: exact ns
    always, at the cost of a Python string per time (~2x the decoding)."""
    return _decode(raw, "text")


def _decode(raw: bytes, times: str) -> tuple[list, dict] | None:
    doc_decoder, list_decoder = _DECODERS[times]
    try:
        if _BARE_LIST.match(raw):
            return list_decoder.decode(raw), {}
        doc = doc_decoder.decode(raw)
        meta = {k: msgspec.json.decode(v) for k in META_KEYS if len(v := getattr(doc, k))}
    except msgspec.DecodeError:
        return None
    return doc.traceEvents, meta


def split_typed(events: list, path: Path, *, doubles: str = "trust") -> tuple[pa.Table, pa.Table, pa.Table, pa.Table]:
    """The GPU, runtime, host and sync tables of ``events`` (typed structs, complete events
    only), like ``events_table`` builds from dicts; ``doubles`` as in ``ns_column``."""
    cats = pa.array(list(map(attrgetter("cat"), events)), pa.string())
    code = pc.fill_null(pc.index_in(cats, value_set=_ROUTE_KEYS), -1).to_numpy().astype(np.int64)
    kept = np.flatnonzero(code >= 0)
    phase = pa.array([events[i].ph for i in kept.tolist()], pa.string())
    code[kept[~np.asarray(pc.fill_null(pc.equal(phase, "X"), True), dtype=bool)]] = -1  # flows, instants: not activities
    bucket = np.where(code >= 0, _ROUTE_BUCKET[np.maximum(code, 0)], -1)
    category = pa.array([v for _, v in ROUTE.values()], pa.string())
    out = []
    for b, (what, type_) in enumerate(zip(BUCKET_WHAT, BUCKET_TYPES, strict=True)):
        idx = np.flatnonzero(bucket == b)
        evs = [events[i] for i in idx.tolist()]
        table = _typed_table(evs, path, what, type_, doubles)
        out.append(table.append_column("category", category.take(pa.array(code[idx]))))
    return tuple(out)


# the structs' top-level fields (name, pid, tid), for converting their tuples in one pass
_EVENT_TUPLE = pa.struct(list(_TOP_TYPES.items()))
_TOP = attrgetter(*_TOP_TYPES)


def _typed_table(events: list, path: Path, what: str, type_: pa.StructType, doubles: str) -> pa.Table:
    args_type = type_.field("args").type  # only the args this bucket reads: half the conversion
    try:
        # one C++ pass over tuples converts all fields ~1.5x faster than a list per field
        top = pa.array(list(map(_TOP, events)), _EVENT_TUPLE).flatten()
        get_args = attrgetter(*[_ARG_ATTR[f.name] for f in args_type])
        args = pa.array(list(map(get_args, map(attrgetter("args"), events))), args_type).flatten()
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError):
        return _typed_columns(events, path, what, type_, doubles)  # numbers as strings: field by field
    cols = {f.name: top[_EVENT_TUPLE.get_field_index(f.name)] for f in type_ if f.name != "args"}
    for t in TIMES:
        cols[t] = ns_column(list(map(attrgetter(t), events)), path, what, t, doubles=doubles)
    cols.update(zip(args_type.names, args))
    return pa.table(cols)


def _typed_columns(events: list, path: Path, what: str, type_: pa.StructType, doubles: str) -> pa.Table:
    cols = {}
    for f in type_:
        if f.name != "args":
            cols[f.name] = _typed_column(list(map(attrgetter(f.name), events)), f, path, what, f.name)
    for t in TIMES:
        cols[t] = ns_column(list(map(attrgetter(t), events)), path, what, t, doubles=doubles)
    args = list(map(attrgetter("args"), events))
    for f in type_.field("args").type:
        cols[f.name] = _typed_column(list(map(attrgetter(_ARG_ATTR[f.name]), args)), f, path, what, f"args.{f.name}")
    return pa.table(cols)


def _typed_column(values: list, field: pa.Field, path: Path, what: str, label: str) -> pa.Array:
    try:
        return pa.array(values, type=field.type)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError):
        return _lenient_column(values, field, path, what, label)  # pid/tid as strings, ints past int64


# --- what the tables are checked and joined by ---------------------------------------


def require(table: pa.Table, path: Path, what: str, columns=("name", "ts", "dur")) -> None:
    """A one-line ValueError naming ``path`` where an event of ``table`` (``what``) lacks one of ``columns``."""
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


# --- bulk column building ----------------------------------------------------------


def events_table(events: list, path: Path, what: str, type_: pa.StructType) -> pa.Table:
    """The fields of ``type_`` for a list of event dicts, as a flat table (args.* flattened),
    ``ts``/``dur`` as exact ns (a float literal's text is its ``FloatText``)."""
    try:
        arr = pa.array(events, type=type_)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError):
        arr = _events_lenient(events, path, what, type_)
    top = arr.flatten()
    cols = {f.name: top[i] for i, f in enumerate(type_)}
    args = cols.pop("args").flatten()
    for t in TIMES:
        cols[t] = ns_column([e.get(t) for e in events], path, what, t)
    for i, f in enumerate(type_.field("args").type):
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
                    v = float(v) if pa.types.is_floating(field.type) else int(float(v))
                except (ValueError, OverflowError):  # not a number; "inf", "1e400"
                    v = None if label in ("pid", "tid") or (what, label) in _HANDLES else _bad(path, what, label, v)
            conv.append(v)
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


def _bad(path, what, label, value):
    raise ValueError(f"{path}: {what} events: field {label!r} has a value of the wrong type ({value!r:.40})")


# --- args must be an object -----------------------------------------------------------------
#
# Kineto writes an event's arguments as a JSON object, or leaves the key out (flows,
# instants). A kept event (GPU activity, runtime call, host range, cuda_sync record) whose
# "args" is anything else (an array, a string, a number, a boolean, null) is malformed:
# reading it as "no args" would drop its device, stream and correlation without a word.
# Both readers refuse it with this message: the dict path here (``args_error``), the C
# scanner through ``chrome_columns`` (``_kineto.BadArgs``).

# what a JSON value that is not an object is, by its first character, for one-line errors
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
