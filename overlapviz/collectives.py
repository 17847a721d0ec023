"""The one collective vocabulary: the snake_case name of the collective a kernel, host record or library call names, whatever the trace format."""

from __future__ import annotations

import re

import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["COLLECTIVES", "api_collective", "collective_names", "collective_of"]

# (normalised name, pattern searched in the lower-cased name stripped of everything but
# letters and digits); order matters: compound names before their parts
COLLECTIVES = (
    ("reduce_scatter", "reducescatter"),
    ("all_reduce", "allreduce"),
    ("all_gather", "allgather"),
    ("all_to_all", "alltoall"),
    ("send_recv", "sendrecv"),
    ("broadcast", "broadcast"),
    ("broadcast", "bcast"),
    ("reduce", "reduce"),
    ("gather", "gather"),
    ("scatter", "scatter"),
    ("send", "send"),
    ("recv", "recv"),
    ("barrier", "barrier"),
)
_NOT_ALNUM = re.compile(r"[^a-z0-9]+")
# a library call names a collective by its whole name after the library prefix
# (``ncclAllReduce``, ``rcclAllToAllv``); ``ncclGroupEnd``, ``ncclCommGetAsyncError`` name none
_API_CALL = re.compile(r"^(?:nccl|rccl|mscclx?)_?([a-z_]+?)_?$", re.IGNORECASE)
_API_WORDS = {pattern: label for label, pattern in COLLECTIVES} | {"alltoallv": "all_to_all"}


def collective_of(name: str | None) -> str | None:
    """The collective a kernel or host record names (``ncclKernel_AllReduce_RING_LL_Sum_float``
    and ``gloo:all_reduce`` give ``all_reduce``, ``ncclDevKernel_SendRecv`` ``send_recv``), else None."""
    if not name:
        return None
    key = _NOT_ALNUM.sub("", name.lower())
    return next((label for label, pattern in COLLECTIVES if pattern in key), None)


def collective_names(names: pa.Array | pa.ChunkedArray) -> pa.Array:
    """:func:`collective_of` of each name, null where none; evaluated once per distinct name."""
    arr = names.combine_chunks() if isinstance(names, pa.ChunkedArray) else names
    if len(arr) == 0:
        return pa.array([], pa.string())
    encoded = pc.dictionary_encode(arr.cast(pa.string()))
    labels = [collective_of(v) for v in encoded.dictionary.to_pylist()]  # once per distinct name
    return pa.array(labels, pa.string()).take(encoded.indices)


def api_collective(function: str | None) -> str | None:
    """The collective a communication library call makes (``ncclAllReduce`` -> ``all_reduce``,
    ``ncclSend`` -> ``send``, as the kernel ``ncclKernel_SendRecv`` would not say); None for
    calls that are not collectives (``ncclGroupEnd``, ...)."""
    if not function:
        return None
    m = _API_CALL.match(function)
    return _API_WORDS.get(m.group(1).replace("_", "").lower()) if m else None
