"""The Chrome reader's fast path (typed msgspec decoding) against its dict path (orjson).

Every real Kineto trace in tests/data must take the fast path and give exactly what the
dict path gives; a document the fast path cannot type must still read (or fail) the same.
"""

from pathlib import Path

import pytest

from overlapviz.ingest import chrome

DATA = Path(__file__).parent / "data"
REAL = sorted(
    p
    for d in ("gloo_cpu", "h200_carveout_check", "hta_nccl_parser_config", "hta_trace_filter_2rank", "occupancy_h200", "torch_rocm")
    for p in (DATA / d).rglob("*.json.gz")
)


def _fast(path: Path):
    events, meta = chrome.decode_typed(chrome.read_bytes(path))
    return chrome._assemble(*chrome._split_typed(events, path), meta, len(events), path)


def _slow(path: Path):
    return chrome.parse_document(chrome.load_document(path), path)


def _same(a, b):
    assert a.rank == b.rank
    assert a.info == b.info
    assert a.kernels.equals(b.kernels), (a.kernels.schema, b.kernels.schema)
    assert a.steps.equals(b.steps)
    assert a.devices.equals(b.devices)


def test_real_traces_found():
    assert len(REAL) >= 12


@pytest.mark.parametrize("path", REAL, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_fast_path_equals_dict_path(path):
    assert chrome.decode_typed(chrome.read_bytes(path)) is not None, "fell back to the dict path"
    _same(_fast(path), _slow(path))
