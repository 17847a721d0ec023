"""The ingest driver: read each run's files (in this process and a pool), classify, write one Parquet file per run x rank, and assemble the run's small tables."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from overlapviz.dataset import schema
from overlapviz.ingest import align, pool
from overlapviz.ingest.base import RankTrace, rank_from_name
from overlapviz.ingest.classify import finish_kernels, set_column, split_multi_gpu
from overlapviz.ingest.discover import TIMINGS_RE, MANIFEST, RunSource, check_unique, discover, input_paths, split_run
from overlapviz.ingest.files import display, input_bytes, read_regular
from overlapviz.ingest.ranges import check_ranges, check_time_span, check_value, time_extremes
from overlapviz.ingest.registry import reader_named
from overlapviz.ingest.text import REPAIRED_KEY, repaired_message
from overlapviz.domain.rules import RuleSet, default_rules

__all__ = ["ingest", "ingest_held"]

# after a file with at least this much content, freed memory is handed back to the OS
# (see pool.release_memory); below it there is little to hand back and trimming costs time
RELEASE_MIN_BYTES = 8 * 1024 * 1024
# ingest_held holds the kernels it read where this process reads every file: one file, whatever its size (its one
# table is what analysis would read back), or several below this much trace content in all (pool.POOL_MIN_BYTES):
# above it, what analysis reads comes from the files, and memory stays bounded per rank
HOLD_MAX_BYTES = pool.POOL_MIN_BYTES


@dataclass
class RankPart:
    """What the parent needs of one rank a process read and wrote: its small tables and facts."""

    rank: int
    kernels_file: str  # relative to the dataset directory
    n_kernels: int
    steps: pa.Table | None
    devices: pa.Table | None
    info: dict
    syncs: pa.Table | None
    top_device: int | None  # the device most of the rank's kernels ran on
    extremes: tuple | None = None  # (earliest, latest) time of the rank with their events (ranges.time_extremes)
    kernels: pa.Table | None = None  # the kernels file's table, where the parent read the file and holds it (not yet written)


# OVERLAPVIZ_DEBUG=1: an unexpected exception while reading a file keeps its traceback
# instead of becoming a one-line "internal error" naming the file
DEBUG_ENV = "OVERLAPVIZ_DEBUG"
INTERNAL_ERROR = "internal error"


def ingest_file(path: str, reader_name: str, rules_json: str, file_index: int, run_id: str,
                directory: str, hold_pid: int = 0) -> list[RankPart]:
    """Read one trace file, finish its kernels and write each rank's kernels file into the
    dataset's temporary ``directory``; return only the small per-rank parts.

    Runs wherever the file is read (the parent or a worker), so the expensive per-file work
    (parse, classify, steps, conform, Parquet write) stays with the process that holds the
    trace, and no kernels table crosses between processes. The parent checks the ranks.
    Read by process ``hold_pid`` (the parent of an ``ingest_held``), the parts keep the tables, which the
    writer writes at its commit (``DatasetWriter.add_kernels_later``) rather than here.

    Whatever goes wrong comes out as a one-line ValueError naming the file: a reader's own
    message (prefixed with the file where it does not name it), nesting past the recursion
    limit, memory exhausted, the dataset's disk full, and any other exception as an
    "internal error" (a bug to report; ``OVERLAPVIZ_DEBUG=1`` keeps its traceback).
    """
    shown = display(path)
    try:
        return _read_and_write(path, reader_name, rules_json, file_index, run_id, directory, hold_pid == os.getpid())
    except _WriteError as exc:
        raise ValueError(f"cannot write the dataset while ingesting {shown}: {exc}") from None
    except ValueError as exc:
        raise ValueError(_naming(str(exc), path)) from None
    except RecursionError:
        raise ValueError(f"{shown}: nested too deeply to read (more levels than Python's recursion limit)") from None
    except MemoryError:
        raise ValueError(f"{shown}: too large to read in the memory available") from None
    except OSError as exc:
        raise ValueError(f"{shown}: cannot read: {exc.strerror or exc}") from None
    except Exception as exc:
        if os.environ.get(DEBUG_ENV, "") not in ("", "0"):
            raise
        first = (str(exc).strip().splitlines() or [""])[0][:300]
        raise ValueError(f"{shown}: {INTERNAL_ERROR} while reading this file ({type(exc).__name__}: {first}{raised_at(exc)}); "
                         f"please report it (set {DEBUG_ENV}=1 for the traceback)") from None  # fmt: skip


def raised_at(exc: BaseException) -> str:
    """`` at ingest/chrome.py:LINE in function``: the innermost frame of ``exc``'s traceback in overlapviz's own code
    (else the innermost frame), so that an internal error's one line says where it happened, in a worker process too."""
    import traceback

    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return ""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ours = [f for f in frames if os.path.abspath(f.filename).startswith(package + os.sep)]
    f = (ours or frames)[-1]
    shown = os.path.relpath(os.path.abspath(f.filename), package) if ours else os.path.basename(f.filename)
    return f" at {shown}:{f.lineno} in {f.name}"


class _WriteError(Exception):
    """Writing into the dataset's temporary directory failed (disk full, read-only, removed)."""


@dataclass
class _Skipped:
    """A file ``--skip-bad`` left out: why (one line)."""

    why: str


def _ingest_file_or_skip(*args) -> list[RankPart] | _Skipped:
    """``ingest_file``, a file it cannot read coming back as ``_Skipped`` (``--skip-bad``);
    the dataset's own write errors still raise."""
    try:
        return ingest_file(*args)
    except ValueError as exc:
        if str(exc).startswith("cannot write the dataset"):
            raise
        return _Skipped(str(exc))


class NotOneJob(Exception):
    """The files of a directory-grouped run are not the ranks of one job (``discover.split_run``)."""

    def __init__(self, index: int):
        super().__init__(index)
        self.index = index


def _naming(message: str, path: str) -> str:
    """``message`` with the file in front where it does not name it already."""
    if str(path) in message or display(path) in message:
        return message
    return f"{display(path)}: {message}"


def _read_and_write(path: str, reader_name: str, rules_json: str, file_index: int, run_id: str,
                    directory: str, hold: bool = False) -> list[RankPart]:  # fmt: skip
    reader = reader_named(reader_name)
    traces = reader.read(Path(path))
    rules = _rules_from_json(rules_json)
    if getattr(reader, "per_process", False):
        traces = split_multi_gpu(traces, rules)
    big = input_bytes(Path(path)) >= RELEASE_MIN_BYTES
    parts = []
    for ti, t in enumerate(traces):
        rank = _rank_of(t, Path(path), file_index, ti, len(traces))
        _check_rank_trace(t, display(path))
        k = finish_kernels(t, rules)
        n = k.num_rows
        check_ranges(k, schema.KERNELS, display(path), "kernel")
        extremes = time_extremes([("kernel", k), ("step", t.steps), ("sync record", getattr(t, "syncs", None))])
        check_time_span(extremes, display(path))
        k = set_column(k, "run_id", pa.repeat(pa.scalar(run_id, pa.string()), n))
        k = set_column(k, "rank", pa.repeat(pa.scalar(rank, pa.int32()), n))
        if hold:  # as write_kernels writes it, so that the held table is the file's
            k = schema.conform(k, schema.KERNELS, where=f"kernels of {run_id} rank {rank}")
            k = k if schema.is_sorted(k.column("start_ns")) else k.sort_by([("start_ns", "ascending")])
            rel = schema.kernels_file(run_id, rank)
        else:
            try:
                rel, n = schema.write_kernels(k, directory, run_id, rank)
            except OSError as exc:
                raise _WriteError(exc.strerror or str(exc)) from None
        info = {key: display(v) if isinstance(v, str) else v for key, v in t.info.items()}
        parts.append(RankPart(rank, rel, n, t.steps, t.devices, info, getattr(t, "syncs", None), _top_device(k),
                              extremes, k if hold else None))
        big = big or k.nbytes >= RELEASE_MIN_BYTES
        del k
        t.kernels = None
    del traces
    if big:
        pool.release_memory()
    return parts


_RANK_MAX = 2**31 - 1  # ranks are int32 in every table


def _rank_of(t: RankTrace, path: Path, file_index: int, trace_index: int, n_traces: int) -> int:
    rank = t.rank
    if rank is None:
        rank = rank_from_name(path.name) if n_traces == 1 else None
    if rank is None:
        rank = file_index if n_traces == 1 else trace_index
    if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)):
        raise ValueError(f"{display(path)}: rank {rank!r} is not an integer")
    if not 0 <= int(rank) <= _RANK_MAX:
        raise ValueError(f"{display(path)}: rank {int(rank)} is outside 0..{_RANK_MAX}")
    return int(rank)


# --- every number fits the column it becomes ------------------------------------------------

_SMALL_TABLES = (("steps", schema.STEPS, "step"), ("syncs", schema.SYNCS, "sync record"),
                 ("devices", schema.DEVICES, "device"))  # fmt: skip


def _check_rank_trace(t: RankTrace, where: str) -> None:
    """Range-check what a reader handed over besides the kernels (steps, syncs, devices, facts)."""
    for attr, target, what in _SMALL_TABLES:
        table = getattr(t, attr, None)
        if table is not None and table.num_rows:
            check_ranges(table, target, where, what)
    for key, value in (t.info or {}).items():
        if key in schema.RANKS.names and key not in ("run_id", "rank"):
            check_value(value, schema.RANKS.field(key).type, where, f"{key}")
        elif key in schema.RUNS.names:
            check_value(value, schema.RUNS.field(key).type, where, f"{key}")


@functools.lru_cache(maxsize=16)
def _rules_from_json(text: str) -> RuleSet:
    return RuleSet.from_json(text)  # frozen: one parse per rule set, not one per file


def ingest(
    sources: Sequence[str | os.PathLike],
    out: str | os.PathLike,
    *,
    rules: RuleSet | None = None,
    run_id: str | None = None,
    overwrite: bool = False,
    workers: int | None = None,
    progress: bool | None = None,
    skip_bad: bool = False,
    skipped: list[tuple[str, str]] | None = None,
    append: bool = False,
    align_clocks: str = "auto",
    _hold: bool = False,
    _write_behind: bool = False,
) -> Path:
    """Ingest traces into the dataset directory ``out`` and return its path.

    Parameters
    ----------
    sources
        Trace files, run directories (per-rank files, or a collected run with
        ``manifest.json``) and sweep directories; see the module docstring.
    out
        The dataset directory to create. Built in a temporary directory beside it and moved
        into place at the end, so a failure leaves ``out`` as it was.
    rules
        Kind rules for every run. None: a collected run's manifest ``kind_rules`` where given,
        else the DESIGN.md defaults (``rules.default_rules``).
    run_id
        The run's id when the sources make exactly one run.
    overwrite
        Replace an existing non-empty ``out``; with ``append``, replace the runs of ``out``
        whose ids the sources give again.
    workers
        Processes reading traces at once, this one included (default ``min(2, cpu
        count)``); each holds one trace in memory at a time. Below ``POOL_MIN_BYTES`` of
        trace content in all, this process reads every file alone.
    progress
        Show a progress bar on stderr; None: only when stderr is a terminal.
    skip_bad
        Leave out what cannot be read (a missing source, a file that is no trace or fails to
        read, a run directory with a bad manifest) instead of stopping; each is appended to
        ``skipped`` as ``(path, why)``. A run left with no file is left out; none left: error.
    append
        Add the runs to the existing dataset ``out`` (kept byte for byte if this fails): a
        new dataset of its runs and the new ones is built beside it and swapped in. A run id
        already in ``out`` is an error unless ``overwrite``. Each run keeps the kind rules
        it was classified by (``runs.kind_rules``).
    align_clocks
        ``auto``: align a run's ranks on collective completion where their clocks are not
        comparable (different hosts, or collective instances that end further apart than
        they lasted); ``collectives``: align every run of several ranks; ``none``: never
        (ranks whose clocks do not compare are then kept in distinct ``clock_domain`` s).
        Offsets are added to every time of the rank and recorded in ``ranks.clock_offset_ns``
        (``overlapviz.ingest.align``).

    Raises
    ------
    ValueError
        One line naming the file and the problem (missing, not a trace, truncated or corrupt,
        missing fields, bad durations, duplicate ranks, unwritable output, ...).
    """
    if isinstance(sources, (str, os.PathLike)):
        sources = [sources]
    if align_clocks not in align.MODES:
        raise ValueError(f"align_clocks {align_clocks!r}: expected one of {', '.join(align.MODES)}")
    skipped = [] if skipped is None else skipped
    existing = _existing(out) if append else None
    runs = discover(sources, run_id=run_id, skipped=skipped if skip_bad else None)
    if not runs:
        raise ValueError(f"nothing to ingest: {len(skipped)} source(s) skipped")
    n_discover = len(skipped)
    while True:
        # files grouped by directory that turn out not to be one job's ranks are ingested
        # again as a run per file (discover's module docstring); only then are they read twice
        del skipped[n_discover:]
        try:
            return _ingest_runs(sources, runs, out, rules=rules, overwrite=overwrite or append, workers=workers,
                                progress=progress, skipped=skipped if skip_bad else None, existing=existing,
                                replace=overwrite, align_clocks=align_clocks, hold=_hold, behind=_write_behind)  # fmt: skip
        except NotOneJob as d:
            runs = runs[: d.index] + split_run(runs[d.index]) + runs[d.index + 1:]
            check_unique(runs)


def ingest_held(sources: Sequence[str | os.PathLike], out: str | os.PathLike, *, write_behind: bool = False,
                **options) -> schema.HeldDataset:  # fmt: skip
    """``ingest`` (same ``options``), returning the dataset with the tables this process wrote still held
    (``schema.HeldDataset``), so that the analysis of a raw trace right after its ingest reads them from memory
    instead of back from the files just written (``overlapviz analyze|explain TRACES`` with a cold cache).

    The kernels are held only where this process read every file itself: one file, or several below
    ``HOLD_MAX_BYTES`` of trace content in all; above it they are read from the files as from any dataset, and memory stays bounded per
    rank. The small tables and metadata are always held. Raises what ``ingest`` raises.

    ``write_behind``: return as soon as the tables are held; the held kernels, the small tables and
    ``dataset.json`` are written, and the dataset moved into place, by a thread meanwhile (Parquet and fsync
    release the GIL: an analysis of the held tables runs beside it). ``HeldDataset.wait`` (and ``os.fspath``)
    waits for it and raises its ValueError; a write that fails leaves no dataset and nothing temporary.
    """
    return ingest(sources, out, _hold=True, _write_behind=write_behind, **options)


def _existing(out) -> dict:
    """What ``--append`` keeps of the dataset ``out``: its metadata and tables (one-line errors)."""
    path = Path(out)
    if not path.exists():
        raise ValueError(f"{display(path)}: no such dataset to append to (drop --append to create it)")
    if not (path / schema.METADATA_FILE).is_file():
        raise ValueError(f"{display(path)}: not an overlapviz dataset (no {schema.METADATA_FILE}): nothing to append to")
    meta = schema.read_metadata(path)
    tables = {name: schema.read_table(path, name) for name in schema.TABLES}
    return {"path": path, "meta": meta, "tables": tables}


def _ingest_runs(sources, runs: list[RunSource], out, *, rules, overwrite, workers, progress, skipped, existing,
                 replace, align_clocks="auto", hold=False, behind=False) -> Path:  # fmt: skip
    old_ids: list[str] = [] if existing is None else list(existing["tables"]["runs"].column("run_id").to_pylist())
    clash = [r.run_id for r in runs if r.run_id in old_ids]
    if clash and not replace:
        raise ValueError(f"{display(out)}: already has run {clash[0]!r} (give --run-id, or --overwrite to replace it)")
    run_rules = {r.run_id: rules_for_run(r, rules) for r in runs}
    # dataset.json records the rules every run shares (each run's own are in runs.kind_rules)
    shared = {rs.to_json() for rs in run_rules.values()}
    default_set = next(iter(run_rules.values())) if len(shared) == 1 else (rules or default_rules())
    n_workers = max(1, int(workers) if workers is not None else min(2, os.cpu_count() or 1))
    if progress is None:
        progress = sys.stderr.isatty()
    tasks = [(ri, fi, path, reader) for ri, r in enumerate(runs) for fi, (path, reader) in enumerate(r.files)]

    inputs = input_paths(sources, runs)
    if existing is not None:
        kept_rules = {rs for rid, rs in zip(old_ids, existing["tables"]["runs"].column("kind_rules").to_pylist())
                      if rid not in clash and rs}  # fmt: skip
        if len(kept_rules | shared) > 1:  # dataset.json keeps the rules only when every run shares them
            default_set = rules or default_rules()
    with schema.DatasetWriter(out, overwrite=overwrite, rules=default_set.to_dict(), inputs=inputs) as writer:
        kept = [] if existing is None else _keep_existing(writer, existing, set(clash))
        state = [RunState() for _ in runs]
        bar = pool.progress_bar(len(tasks), progress)
        rules_json = {rid: rs.to_json() for rid, rs in run_rules.items()}
        # held only where this process reads every file (one, or a few small ones): what it holds stays one rank's or small
        alone = len(tasks) == 1 or sum(input_bytes(Path(t[2])) for t in tasks) < HOLD_MAX_BYTES
        hold_pid = os.getpid() if hold and alone else 0
        jobs = [(t, (str(t[2]), t[3], rules_json[runs[t[0]].run_id], t[1], runs[t[0]].run_id, str(writer.directory),
                     hold_pid))
                for t in tasks]
        work = ingest_file if skipped is None else _ingest_file_or_skip
        # closing: on an error the worker is stopped before the writer removes its directory
        with contextlib.closing(pool.ordered_map(work, jobs, n_workers)) as results:
            try:
                for (ri, fi, path, _), parts in results:
                    if isinstance(parts, _Skipped):
                        skipped.append((display(path), _without_path(parts.why, path)))
                    else:
                        add_parts(writer, runs[ri], state[ri], path, parts, ri)
                    bar.update(1)
            finally:
                bar.close()
        done = [(r, st) for r, st in zip(runs, state) if st.ranks or not r.files]
        if skipped is not None:
            _remove_unlisted_kernels(writer.directory, {part for st in state for part in st.files})
            if not done:
                raise ValueError(f"nothing ingested: every trace was skipped ({len(skipped)})")
        for r, st in done:
            add_run(writer, r, st, run_rules[r.run_id], align_clocks)
        old_from = [] if existing is None else list(existing["meta"].get("ingested_from") or [])
        meta = {"runs": kept + [r.run_id for r, _ in done], "ingested_from": old_from + [display(s) for s in sources]}
        cycles = list(dict.fromkeys(r.cycles for r, _ in done if r.cycles))
        if cycles:  # how per-cycle files became runs (ingest's summary line says it)
            meta["grouped_cycles"] = cycles
        if not hold:
            return writer.commit(meta)
        held = {rel: t for _, st in done for rel, t in st.held.items()}
        finishing = writer.commit(meta, background=True) if behind else None  # written while the held tables are analysed
        path = writer.out if behind else writer.commit(meta)
        return schema.HeldDataset(path, writer.metadata, writer.written, held, finishing)


def _without_path(message: str, path) -> str:
    for shown in (display(path), str(path)):
        if message.startswith(shown + ": "):
            return message[len(shown) + 2:]
    return message


def _remove_unlisted_kernels(directory: Path, listed: set[str]) -> None:
    """Kernels files a file that was then skipped wrote before failing (its other ranks): not the dataset's."""
    for path in (directory / "kernels").glob("*/*.parquet"):
        if path.relative_to(directory).as_posix() not in listed:
            path.unlink()


def _keep_existing(writer, existing: dict, replaced: set[str]) -> list[str]:
    """Put the runs of the dataset being appended to (less ``replaced``) into ``writer``: kernels
    files hard-linked (copied where links are not possible), small tables as they are."""
    import shutil

    import pyarrow.parquet as pq

    src: Path = existing["path"]
    ranks = existing["tables"]["ranks"]
    owner = {schema.kernels_file(r, k): (r, k) for r, k in zip(ranks.column("run_id").to_pylist(), ranks.column("rank").to_pylist())}
    for rel in existing["meta"].get("kernel_files") or []:
        if rel not in owner:
            raise ValueError(f"{display(src)}: {rel} belongs to no run x rank of ranks.parquet: not a dataset to append to")
        run_id, rank = owner[rel]
        if run_id in replaced:
            continue
        target = writer.directory / rel
        target.parent.mkdir(exist_ok=True)
        try:
            os.link(src / rel, target)
        except OSError:
            shutil.copyfile(src / rel, target)
        with open(target, "rb") as fh:
            writer.add_kernels_file(rel, pq.ParquetFile(fh).metadata.num_rows, run_id, rank)
    for name, table in existing["tables"].items():
        if table.num_rows and "run_id" in table.column_names:
            keep = pc.invert(pc.is_in(table.column("run_id"), pa.array(sorted(replaced), pa.string())))
            table = table.filter(keep)
        if table.num_rows:
            writer.add(name, table)
    return [r for r in existing["tables"]["runs"].column("run_id").to_pylist() if r not in replaced]


def rules_for_run(run: RunSource, explicit: RuleSet | None) -> RuleSet:
    """The kind rules of ``run``: ``explicit`` (``--rules``), else those its manifest records, else the defaults."""
    if explicit is not None:
        return explicit
    recorded = (run.manifest or {}).get("kind_rules")
    if recorded:
        try:
            return RuleSet.from_dict(recorded)
        except ValueError as exc:
            raise ValueError(f"{run.directory / MANIFEST}: {exc}") from None
    return default_rules()


@dataclass
class RunState:
    """What the files of one run added so far (``add_parts``), until ``add_run`` writes the run."""

    ranks: dict = field(default_factory=dict)  # rank -> source path
    infos: list = field(default_factory=list)
    devices: list = field(default_factory=list)  # device names seen, most used first per rank
    n_kernels: int = 0
    files: set = field(default_factory=set)  # kernels files (relative) the run's ranks have
    world: int | None = None  # the world size its files state
    # per rank, held until the run is complete (its clock may be aligned): ranks row, steps, syncs
    pending: dict = field(default_factory=dict)
    held: dict = field(default_factory=dict)  # kernels file (relative) -> its table, where held (RankPart.kernels)
    extremes: tuple | None = None  # the earliest and latest time of its ranks so far (ranges.time_extremes)


def add_parts(writer, run: RunSource, st: RunState, path: Path, parts: list[RankPart], index: int) -> None:
    """Count one file's ranks (kernels files already written) and add their small tables."""
    repaired = max((p.info.get(REPAIRED_KEY) or 0 for p in parts), default=0)
    if repaired:  # once per file, on stderr: the names are kept, with U+FFFD where they were broken
        print(repaired_message(display(path), repaired), file=sys.stderr)
    if run.grouped:
        _check_one_job(run, st, path, parts, index)
    try:
        _add_file_parts(writer, run, st, path, parts)
    except (ValueError, pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError) as exc:
        raise ValueError(_naming(str(exc), str(path))) from None


def _check_one_job(run: RunSource, st: RunState, path: Path, parts: list[RankPart], index: int) -> None:
    """Raise NotOneJob when ``path``'s ranks show that ``run``'s files are not the ranks of one job."""
    for part in parts:
        world = part.info.get("world_size")
        world = int(world) if isinstance(world, (int, np.integer)) and not isinstance(world, bool) else None
        if world is not None and not 0 <= part.rank < world:
            world = None  # a rank outside the world it states: the world size says nothing
        if part.rank in st.ranks or world == 1 or (world is not None and st.world is not None and world != st.world):
            raise NotOneJob(index)
        st.world = st.world if world is None else world


def _add_file_parts(writer, run: RunSource, st: RunState, path: Path, parts: list[RankPart]) -> None:
    for part in parts:
        rank = part.rank
        if rank in st.ranks:
            raise ValueError(f"{display(path)}: rank {rank} of run {run.run_id!r} also comes from {display(st.ranks[rank])}")
        st.ranks[rank] = path
        if part.extremes is not None:  # the run's ranks are compared (peer waits, skews): one span for all
            low = min(st.extremes[0], part.extremes[0]) if st.extremes else part.extremes[0]
            high = max(st.extremes[1], part.extremes[1]) if st.extremes else part.extremes[1]
            st.extremes = (low, high)
            check_time_span(st.extremes, f"{display(path)}: run {run.run_id!r}")
        st.files.add(part.kernels_file)
        if part.kernels is not None:
            st.held[part.kernels_file] = part.kernels
            writer.add_kernels_later(part.kernels, run.run_id, rank)
        else:
            writer.add_kernels_file(part.kernels_file, part.n_kernels, run.run_id, rank)
        st.n_kernels += part.n_kernels
        ident = {"run_id": run.run_id, "rank": rank}
        timed = {}
        if part.steps is not None and part.steps.num_rows:
            timed["steps"] = _with_ident(part.steps, ident)
        if part.syncs is not None and part.syncs.num_rows:
            timed["syncs"] = _with_ident(part.syncs, ident)
        devices = part.devices if part.devices is not None and part.devices.num_rows else _manifest_devices(run, rank)
        if devices is not None and devices.num_rows:
            writer.add("devices", _with_ident(devices, ident))
            st.devices.append(_device_name(devices, part.top_device))
        info = {c: part.info.get(c) for c in schema.RANKS.names if c in part.info} | ident
        if run.manifest and not info.get("host"):
            info["host"] = (run.manifest.get("run") or {}).get("host")
        st.pending[rank] = (info, timed)
        st.infos.append(part.info)


def _with_ident(table: pa.Table, ident: dict) -> pa.Table:
    n = table.num_rows
    table = set_column(table, "run_id", pa.repeat(pa.scalar(ident["run_id"], pa.string()), n))
    return set_column(table, "rank", pa.repeat(pa.scalar(ident["rank"], pa.int32()), n))


def _manifest_devices(run: RunSource, rank: int) -> pa.Table | None:
    rows = [d for d in (run.manifest or {}).get("devices") or [] if isinstance(d, dict)]
    rows = [d for d in rows if d.get("rank") in (None, rank)]
    if not rows:
        return None
    rows = [{k: v for k, v in d.items() if k in schema.DEVICES.names and k not in ("run_id", "rank")} for d in rows]
    try:
        return schema.conform(pa.Table.from_pylist(rows), pa.schema([f for f in schema.DEVICES if f.name not in ("run_id", "rank")]))
    except (ValueError, pa.ArrowInvalid) as exc:
        raise ValueError(f"{run.directory / MANIFEST}: devices: {exc}") from None


def _top_device(kernels: pa.Table) -> int | None:
    """The device most of ``kernels`` ran on (the first seen of a tie); None where unknown."""
    dev = kernels.column("device").drop_null() if "device" in kernels.column_names else pa.array([])
    if not len(dev):
        return None
    counts = pc.value_counts(dev)
    return counts.field("values")[int(np.argmax(counts.field("counts").to_numpy()))].as_py()


def _device_name(devices: pa.Table, top_device: int | None) -> str | None:
    """Name of the device most of the rank's kernels ran on (the first listed where unknown)."""
    if "name" not in devices.column_names:
        return None
    names = devices.column("name").to_pylist()
    ids = devices.column("device").to_pylist() if "device" in devices.column_names else []
    if top_device is not None and ids and top_device in ids:
        return names[ids.index(top_device)]
    return names[0] if names else None


# every time of a rank, by table: what an alignment offset is added to
_TIMES = {"kernels": ("start_ns", "end_ns", "launch_ns", "launch_end_ns"), "steps": ("start_ns", "end_ns"),
          "syncs": ("start_ns", "end_ns")}  # fmt: skip


def _add_clocked(writer, run: RunSource, st: RunState, mode: str) -> None:
    """Decide the run's clocks (``overlapviz.ingest.align``), shift the ranks to align, and add
    their ranks rows, steps and syncs."""
    hosts = {rank: info.get("host") for rank, (info, _) in st.pending.items()}
    ends = _comm_instance_ends(writer.directory, run.run_id, sorted(hosts), st.held) if len(hosts) > 1 else {}
    fixes = align.plan(hosts, ends, mode) if hosts else {}
    for rank, (info, timed) in sorted(st.pending.items()):
        fix = fixes[rank]
        if fix.offset_ns:
            _shift_kernels(writer, run.run_id, rank, fix.offset_ns, st.held)
            timed = {name: _shifted(t, _TIMES[name], fix.offset_ns, f"{run.run_id} rank {rank}") for name, t in timed.items()}
        for name, table in timed.items():
            writer.add(name, table)
        writer.add("ranks", pa.Table.from_pylist([info | {"clock_domain": fix.domain, "clock_offset_ns": fix.offset_ns,
                                                           "clock_note": fix.note}]))  # fmt: skip
    st.pending.clear()


_COMM_COLUMNS = ["kind", "start_ns", "end_ns", "name", "collective", "comm_group", "comm_seq"]


def _comm_instance_ends(directory: Path, run_id: str, ranks: list[int], held: dict | None = None) -> dict:
    """``align.instance_ends`` of the run's communication kernels, from the ``held`` tables or read back from its
    kernels files."""
    import pyarrow.parquet as pq

    parts = []
    for rank in ranks:
        rel = schema.kernels_file(run_id, rank)
        t = held[rel].select(_COMM_COLUMNS) if held and rel in held else pq.read_table(Path(directory) / rel, columns=_COMM_COLUMNS)
        t = t.filter(pc.equal(t.column("kind"), "comm"))
        parts.append(t.append_column("rank", pa.repeat(pa.scalar(rank, pa.int64()), t.num_rows)))
    t = pa.concat_tables(parts)
    if not t.num_rows:
        return {}
    what = pc.coalesce(t.column("collective"), t.column("name")).to_pylist()
    return align.instance_ends(t.column("rank").to_numpy(), t.column("start_ns").to_numpy(), t.column("end_ns").to_numpy(),
                               t.column("comm_group").to_pylist(), t.column("comm_seq").to_pylist(), what)  # fmt: skip


def _shifted(table: pa.Table, columns, offset: int, where: str) -> pa.Table:
    """``table`` with ``offset`` ns added to ``columns`` (nulls stay null); one line naming ``where``
    where a time would leave int64."""
    for name in columns:
        if name in table.column_names:
            try:
                col = pc.add_checked(table.column(name), pa.scalar(offset, pa.int64()))
            except pa.ArrowInvalid:
                raise ValueError(f"{where}: {name} + clock offset {offset:,} ns overflows int64 ns") from None
            table = table.set_column(table.column_names.index(name), name, col)
    return table


def _shift_kernels(writer, run_id: str, rank: int, offset: int, held: dict | None = None) -> None:
    """Add ``offset`` to every time of the rank's kernels file, or of its ``held`` table (which the writer writes
    at its commit)."""
    import pyarrow.parquet as pq

    rel = schema.kernels_file(run_id, rank)
    if held and rel in held:
        held[rel] = schema.conform(_shifted(held[rel], _TIMES["kernels"], offset, f"{run_id} rank {rank}"), schema.KERNELS)
        writer.replace_kernels(rel, held[rel])
        return
    table = _shifted(pq.read_table(writer.directory / rel), _TIMES["kernels"], offset, f"{run_id} rank {rank}")
    schema.write_kernels(table, writer.directory, run_id, rank)


_RUN_FACTS = ("world_size", "backend", "nccl_version", "hip_version", "cuda_version", "torch_version", "host")


def add_run(writer, run: RunSource, st: RunState, rules: RuleSet, align_clocks: str = "auto") -> None:
    """Write ``run`` once all its files are in: its ranks' clocks aligned (``align_clocks``), its ``runs`` row, its timings."""
    _add_clocked(writer, run, st, align_clocks)
    row: dict = {}
    if run.manifest is not None:
        row.update({k: v for k, v in (run.manifest.get("run") or {}).items() if k in schema.RUNS.names})
        row["source"] = "collected"
        row["config_json"] = json.dumps(run.manifest, sort_keys=True, default=str)
    else:
        row["source"] = "imported"
    for key in _RUN_FACTS:  # what the traces say fills what the manifest does not
        if row.get(key) is None:
            row[key] = next((i.get(key) for i in st.infos if i.get(key) is not None), None)
    if row.get("device_name") is None:
        row["device_name"] = next((d for d in st.devices if d), None)
    row.setdefault("status", "ok")
    row.update(
        run_id=run.run_id,
        n_ranks=len(st.ranks),
        source_paths=json.dumps([display(p) for p, _ in run.files] or ([display(run.directory)] if run.directory else [])),
        kind_rules=rules.to_json(),
    )
    where = display(run.directory / MANIFEST) if run.manifest is not None else run.run_id
    try:
        writer.add("runs", pa.Table.from_pylist([row]))
    except (ValueError, pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        raise ValueError(f"{where}: {exc}") from None
    for path in run.timings:
        table = _timings(path, run.run_id)
        try:
            writer.add("iterations", table)
        except (ValueError, pa.ArrowInvalid) as exc:
            raise ValueError(f"{display(path)}: {exc}") from None


def _timings(path: Path, run_id: str) -> pa.Table:
    """``timings_rank<N>.json`` as ITERATIONS rows."""
    shown = display(path)
    try:
        doc = json.loads(read_regular(path))
        rank = _whole(doc.get("rank", TIMINGS_RE.match(path.name).group(1)), "rank")
        items = doc["iterations"]
        rows = [
            {
                "run_id": run_id,
                "rank": rank,
                "iteration": _whole(it["iteration"], "iteration"),
                "time_ms": _finite(it["time_ms"]),
                "measured": _flag(it.get("measured", True)),
            }
            for it in items
        ]
    except json.JSONDecodeError as exc:
        raise ValueError(f"{shown}: not valid JSON ({exc})") from None
    except RecursionError:
        raise ValueError(f"{shown}: not a timings file (JSON nested too deeply)") from None
    except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as exc:
        if str(exc).startswith(shown):
            raise
        raise ValueError(f"{shown}: not a timings file ({type(exc).__name__}: {exc})") from None
    if not rows:
        return schema.empty(schema.ITERATIONS)
    return pa.Table.from_pylist(rows)


def _whole(value, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ValueError(f"{field} {value!r} is not an integer")
    number = int(value)
    if not 0 <= number <= _RANK_MAX:
        raise ValueError(f"{field} {number} is outside 0..{_RANK_MAX}")
    return number


def _finite(value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not np.isfinite(value):
        raise ValueError(f"time_ms {value!r} is not a finite number")
    return float(value)


def _flag(value) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"measured {value!r} is not true or false")
    return value
