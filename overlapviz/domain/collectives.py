"""The one collective vocabulary: the snake_case name of the collective a kernel, host record or library call names, whatever the trace format."""

from __future__ import annotations

import re

import pyarrow as pa
import pyarrow.compute as pc

from overlapviz.domain.vocabulary import vocabulary

__all__ = ["COLLECTIVES", "api_collective", "collective_names", "collective_of"]

# (normalised name, key searched in the lower-cased name stripped of everything but letters
# and digits), in order: compound names before their parts; vocabulary.toml's [[word]] table
COLLECTIVES = vocabulary().words
_NOT_ALNUM = re.compile(r"[^a-z0-9]+")
# a library call names a collective by its whole name after the library prefix
# (``ncclAllReduce``, ``rcclAllToAllv``); ``ncclGroupEnd``, ``ncclCommGetAsyncError`` name none
_API_CALL = re.compile(r"^(?:nccl|rccl|mscclx?)_?([a-z_]+?)_?$", re.IGNORECASE)
_API_WORDS = {key: label for label, key in reversed(COLLECTIVES)}


def collective_of(name: str | None) -> str | None:
    """The collective a kernel or host record names, else None.

    First the collective rules of the libraries whose patterns match the name
    (vocabulary.toml: DeepEP's ``dispatch``/``combine`` -> ``all_to_all``,
    ``cross_device_reduce_1stage`` -> ``all_reduce``), then the generic words
    (``ncclKernel_AllReduce_RING_LL_Sum_float`` and ``gloo:all_reduce`` give ``all_reduce``,
    ``ncclDevKernel_SendRecv`` ``send_recv``, ``ncclDevKernel_Generic`` none).
    """
    if not name:
        return None
    for lib in vocabulary().libraries:
        if lib.collectives and lib.names(name):
            found = lib.collective(name)
            if found is not None:
                return found
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
