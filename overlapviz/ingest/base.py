"""The reader interface every trace format implements, and what readers hand to the ingest driver."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import pyarrow as pa


@dataclass
class RankTrace:
    """One rank's activities read from one source, before classification and step assignment.

    Attributes
    ----------
    rank
        The rank from the trace (``distributedInfo.rank``, a manifest, ...); None when the
        source does not say, and the driver then numbers ranks in file order.
    kernels
        Columns of ``schema.KERNELS`` except ``run_id``, ``rank``, ``kind`` and ``step``,
        which the driver fills (absent columns become null). ``start_ns``/``end_ns`` and
        ``launch_ns`` are int64 ns on one clock per rank; grids are in blocks.
    steps
        Columns of ``schema.STEPS`` except ``run_id`` and ``rank``: host ranges of profiler
        steps or collector iterations on the ``launch_ns`` clock.
    devices
        Columns of ``schema.DEVICES`` except ``run_id`` and ``rank``: what the trace says of
        its devices (the residency module completes missing limits from its arch tables).
    info
        Columns of ``schema.RANKS`` except ``run_id`` and ``rank``; it may also carry run
        facts by their ``schema.RUNS`` names (``nccl_version``, ``hip_version``,
        ``cuda_version``, ``torch_version``), which fill the run's row where a manifest
        does not say.
    syncs
        Columns of ``schema.SYNCS`` except ``run_id`` and ``rank``: the rank's event
        records, stream waits and synchronizations (runtime calls and CUPTI's
        ``cuda_sync`` records), on the ``launch_ns`` clock for runtime calls and the
        kernels' clock for ``cuda_sync`` ones. None where the format has none to give;
        an empty table where the trace had none.
    """

    rank: int | None
    kernels: pa.Table
    steps: pa.Table | None = None
    devices: pa.Table | None = None
    info: dict = field(default_factory=dict)
    syncs: pa.Table | None = None


class Reader(Protocol):
    """A trace format. Readers are pure: they read one path and return tables, writing nothing."""

    name: str  # source_format value, e.g. "chrome", "rocprof_v1_csv"

    def sniff(self, path: Path, head: bytes) -> bool:
        """True when ``path`` is in this format; ``head`` is its first 64 KiB, gunzipped."""

    def read(self, path: Path) -> list[RankTrace]:
        """Read every rank in ``path``.

        Raises
        ------
        ValueError
            With a one-line message naming ``path`` and the problem (truncated, corrupt,
            missing field, negative duration, ...).
        """


def companions(reader: Reader, path: Path) -> list[Path]:
    """Files that ``reader.read(path)`` reads along with ``path`` or deliberately leaves out.

    Optional for readers (``[]`` when a reader does not define ``companions(path)``). A
    profiler that writes several files per process (rocprof: ``<pid>_kernel_trace.csv``
    with its memory-copy, API, agent-info and stats CSVs; ``results.json`` with
    ``results.csv`` and ``results.stats.csv``) names one of them the primary: its
    reader sniffs only that file and lists the rest here, so a driver given all of
    them (``ingest out/*.csv``) reads each process once and does not call the others
    unrecognised.
    """
    fn = getattr(reader, "companions", None)
    return list(fn(path)) if fn is not None else []


# only an explicit rank marker: a bare trailing number is as often a job id or a pid
# (``bert__1016001.json.gz``) as a rank
_RANK_IN_NAME = re.compile(r"(?:^|[^a-z])rank[_-]?(\d+)", re.IGNORECASE)


def rank_from_name(*names: str) -> int | None:
    """Rank spelled in a file or directory name (``rank3``, ``rank_3``, ``rank-3``), else None."""
    for name in names:
        m = _RANK_IN_NAME.search(name)
        if m:
            return int(m.group(1))
    return None
