"""The registry of trace readers: which formats ingest knows, and which one reads a file (by content, not by name)."""

from __future__ import annotations

import functools
import importlib
import importlib.util
from pathlib import Path

from overlapviz.ingest.base import Reader
from overlapviz.ingest.files import head_bytes

__all__ = ["detect", "reader_named", "readers"]

# the most specific formats first: the SQLite formats (Nsight Systems, rocpd; their sniff returns
# at once on anything that is not SQLite), then rocprof's CSV/JSON before Chrome's JSON; last
# Nsight Systems reports, claimed by their name where no format claims the content
READER_MODULES = ("overlapviz.ingest.nsys", "overlapviz.ingest.rocpd", "overlapviz.ingest.rocprof", "overlapviz.ingest.chrome",
                  "overlapviz.ingest.nsys_report")


def readers() -> list[Reader]:
    """Every registered trace reader, the most specific formats first (rocprof before Chrome).

    Importing them is cheap: each format's parsing modules are imported by its ``read``.
    """
    return list(registered_readers())


@functools.lru_cache(maxsize=1)
def registered_readers() -> tuple[Reader, ...]:
    """The readers of ``READER_MODULES`` that are installed, in the order they are tried."""
    found: list[Reader] = []
    for module in READER_MODULES:
        if importlib.util.find_spec(module) is not None:
            found.extend(importlib.import_module(module).READERS)
    return tuple(found)


def reader_named(name: str) -> Reader:
    for r in registered_readers():
        if r.name == name:
            return r
    raise ValueError(f"no trace reader named {name!r}")


def detect(path: Path) -> Reader | None:
    """The reader whose ``sniff`` accepts ``path`` (by content, not by name), or None."""
    head = head_bytes(path)
    for r in registered_readers():
        if r.sniff(path, head):
            return r
    return None


# --- discovery ------------------------------------------------------------------------
