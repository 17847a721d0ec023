"""Profiling cycles: torch.profiler's one-file-per-rank-per-cycle output regrouped into one run per cycle of all ranks.

``torch.profiler.schedule(..., repeat=N)`` with ``tensorboard_trace_handler`` writes, on every
rank, one ``<worker>.<timestamp>.pt.trace.json[.gz]`` per cycle (``<worker>`` is the
handler's worker name, ``<hostname>_<pid>`` by default), into one folder or into
``rank_<N>/`` folders. Grouped by folder, a 4-rank x 8-cycle job would be 32 one-rank runs
and the cross-rank view would be gone. Here the files of one cycle of every rank become one
run: by the profiler step numbers the files hold (``ProfilerStep#N``: a cycle's files share
their first step) where every file has them, else by each worker's cycle order (its files
sorted by the handler's timestamp, which is when the cycle's trace was written).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

__all__ = ["CycleFile", "Grouping", "cycle_name", "cycles_of_ranks", "group_cycles", "is_rank_dir", "peek"]

# tensorboard_trace_handler's file name: worker, then time.time_ns() (ms in torch < 2.1)
_CYCLE_FILE = re.compile(r"^(?P<worker>.+)\.(?P<stamp>\d{10,})\.pt\.trace\.json(?:\.gz)?$")
_RANK_DIR = re.compile(r"^rank[_-]?(\d+)$", re.IGNORECASE)
_STEP = re.compile(rb'"name"\s*:\s*"ProfilerStep#(\d+)"')
_DIST_RANK = re.compile(rb'"distributedInfo"\s*:\s*\{[^{}]*?"rank"\s*:\s*(\d+)')
_DIST_WORLD = re.compile(rb'"distributedInfo"\s*:\s*\{[^{}]*?"world_size"\s*:\s*(\d+)')


@dataclass(frozen=True)
class CycleFile:
    """One per-cycle trace file and what groups it."""

    path: Path
    reader: str
    worker: str  # the rank folder, else the handler's worker name
    stamp: int  # the handler's timestamp
    rank: int | None  # distributedInfo.rank, else the rank folder's number; None: unknown
    first_step: int | None  # the lowest ProfilerStep#N in the file; None: none
    world: int | None = None  # distributedInfo.world_size; None: not stated


@dataclass(frozen=True)
class Grouping:
    """Runs made of cycles: ``runs`` is ``[(run_id, [(path, reader), ...]), ...]`` in cycle order,
    each run's files in rank order; ``summary`` says how (shown by ``ingest``)."""

    runs: list[tuple[str, list[tuple[Path, str]]]]
    summary: str


def cycle_name(path: Path) -> tuple[str, int] | None:
    """(worker, timestamp) of a ``tensorboard_trace_handler`` file name; None for other names."""
    m = _CYCLE_FILE.match(path.name)
    return (m.group("worker"), int(m.group("stamp"))) if m else None


def is_rank_dir(path: Path) -> int | None:
    """The rank of a ``rank_<N>`` / ``rank<N>`` / ``rank-<N>`` folder name, else None."""
    m = _RANK_DIR.match(path.name)
    return int(m.group(1)) if m else None


def peek(path: Path, reader: str, worker: str, stamp: int, folder_rank: int | None) -> CycleFile:
    """What groups one per-cycle file: its rank and first profiler step, read from its text.

    Reads the whole file (gunzipped) once more than the ingest itself does: step ranges lie
    anywhere in the document.
    """
    from overlapviz.ingest.files import read_bytes

    raw = read_bytes(path)
    m = _DIST_RANK.search(raw)
    w = _DIST_WORLD.search(raw)
    steps = [int(s) for s in _STEP.findall(raw)]
    return CycleFile(path, reader, worker, stamp, int(m.group(1)) if m else folder_rank, min(steps) if steps else None,
                     int(w.group(1)) if w else None)  # fmt: skip


def cycles_of_ranks(name: str, files: list[tuple[Path, str]]) -> Grouping | None:
    """Files of one folder that repeat ranks, named in any way (``rank0_step12.json``): cycles
    of one job where every file is a Kineto trace whose rank is known (``distributedInfo.rank``,
    else the rank in its name), they state one world size (not 1), hold profiler steps (a
    rank's files at different first steps) and come from two ranks or more; then one run per
    cycle, by profiler step, as ``group_cycles`` makes them. None otherwise (unrelated traces:
    the caller makes a run per file)."""
    from overlapviz.ingest.base import rank_from_name

    if not files or any(reader != "chrome" for _, reader in files):
        return None
    peeked = []
    for path, reader in files:
        named = cycle_name(path)
        f = peek(path, reader, "", named[1] if named else 0, rank_from_name(path.name))
        if f.rank is None:
            return None
        peeked.append(CycleFile(f.path, reader, f"rank{f.rank}", f.stamp, f.rank, f.first_step, f.world))
    worlds = {f.world for f in peeked if f.world is not None}
    if len(worlds) > 1 or worlds == {1} or any(w is not None and not 0 <= f.rank < w for f in peeked for w in worlds):
        return None
    # the evidence of cycles: profiler steps in every file, a rank's files at different steps,
    # and two ranks or more (one rank's files of one world are variants of a job, not cycles)
    if any(f.first_step is None for f in peeked) or len({f.rank for f in peeked}) < 2:
        return None
    seen = set()
    for f in peeked:
        if (f.rank, f.first_step) in seen:
            return None
        seen.add((f.rank, f.first_step))
    return group_cycles(name, peeked)


def group_cycles(name: str, files: list[CycleFile]) -> Grouping | None:
    """One run per profiling cycle of every rank, named ``<name>_cycle<k>`` (k from 1).

    None where ``files`` are not several cycles (no worker has two files): the caller keeps
    its own grouping. Cycles are matched by the files' first profiler step where every file
    has steps and no worker has two files with one first step; else by order (the k-th
    file of each worker, by timestamp, is cycle k).
    """
    by_worker: dict[str, list[CycleFile]] = {}
    for f in files:
        by_worker.setdefault(f.worker, []).append(f)
    if max((len(v) for v in by_worker.values()), default=0) < 2:
        return None
    keyed = all(f.first_step is not None for f in files) and all(
        len({f.first_step for f in v}) == len(v) for v in by_worker.values()
    )
    cycles: dict[int, list[CycleFile]] = {}
    if keyed:
        for f in files:
            cycles.setdefault(f.first_step, []).append(f)
        how = "by profiler step"
    else:
        for v in by_worker.values():
            for k, f in enumerate(sorted(v, key=lambda f: (f.stamp, f.path.name))):
                cycles.setdefault(k, []).append(f)
        how = "by cycle order (no profiler steps to match)" if not all(f.first_step is not None for f in files) \
            else "by cycle order"  # fmt: skip
    workers = sorted(by_worker, key=lambda w: _worker_order(by_worker[w], w))
    order = {w: i for i, w in enumerate(workers)}
    runs = []
    for k, key in enumerate(sorted(cycles), start=1):
        members = sorted(cycles[key], key=lambda f: order[f.worker])
        runs.append((f"{name}_cycle{k}", [(f.path, f.reader) for f in members]))
    summary = (f"{len(files)} files of {len(by_worker)} ranks grouped into {len(runs)} cycle"
               f"{'s' * (len(runs) != 1)} {how}")  # fmt: skip
    return Grouping(runs, summary)


def _worker_order(files: list[CycleFile], worker: str) -> tuple:
    ranks = [f.rank for f in files if f.rank is not None]
    return (min(ranks) if ranks else float("inf"), worker)
