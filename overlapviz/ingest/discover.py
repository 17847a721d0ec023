"""Which runs a list of sources makes: collected run directories (manifest.json), per-rank trace directories, sweeps and loose files.

How sources become runs (first match wins for each source):

* a directory with ``manifest.json``: one collected run (``overlapviz-run/1``), its id from
  the manifest (else the directory name);
* a directory holding trace files: one run named after the directory (the ranks of one job);
* a directory holding neither: a sweep; each subdirectory (``runs/<run_id>/`` included)
  that is a run by the two rules above becomes one;
* trace files named on the command line: one run per parent directory, named after it; a
  file that is the only one named from its directory is a run named after the file
  (``file_run_name``: ``worker0.pt.trace.json.gz`` -> ``worker0``).

``run_id`` names the run when the sources make exactly one; loose files given with it
form one run whatever their directories.

A file's rank is ``distributedInfo.rank``; else the number in its name (``rank3``,
``rank-3``, ``trace_rank3``; never a bare number); else its position among the run's files
sorted by name.

Ranks of one job or unrelated traces: files grouped by directory (not by a manifest or
``run_id``) are the ranks of one job only while what they say agrees; ingest reads them and,
when two files give the same rank, or their ``distributedInfo.world_size`` differ, or a
file says its world is 1 process, makes each file a run of its own named after the file
(``split_by_file``). Files that say nothing (no rank anywhere) stay ranks of one job in name
order. With a manifest or ``run_id`` the grouping is the user's: a rank twice is an error.

``skipped``: where given, a source that is missing, not a trace, or a run directory that
cannot be read is recorded there as ``(path, why)`` and left out instead of raising.
"""

from __future__ import annotations

import errno
import json
import os
import re
import stat
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from overlapviz.ingest.base import companions
from overlapviz.ingest.cycles import cycle_name, cycles_of_ranks, group_cycles, is_rank_dir, peek
from overlapviz.ingest.files import display, head_bytes, read_regular, regular_file_problem
from overlapviz.ingest.registry import detect, reader_named

__all__ = ["MANIFEST", "MANIFEST_FORMAT", "LeftOut", "RunSource", "check_distinct", "check_unique", "discover", "file_run_name", "input_paths",
           "split_by_file"]

MANIFEST = "manifest.json"
MANIFEST_FORMAT = "overlapviz-run/1"
TIMINGS_RE = re.compile(r"^timings_rank(\d+)\.json$")
_SKIP_NAMES = {MANIFEST}
# in a directory scan, files with these endings are documentation, code or outputs, never
# traces (files named on the command line are always sniffed)
_SKIP_SUFFIXES = (".md", ".rst", ".py", ".sh", ".slurm", ".log", ".png", ".svg", ".pdf", ".html", ".parquet",
                  ".yaml", ".yml", ".toml", ".cu", ".cpp", ".h")


@dataclass
class RunSource:
    """One run to ingest: its trace files (with their readers) and, for collected runs, the manifest."""

    run_id: str
    files: list[tuple[Path, str]] = field(default_factory=list)  # (path, reader name), sorted by name
    manifest: dict | None = None
    directory: Path | None = None
    timings: list[Path] = field(default_factory=list)
    grouped: bool = False  # files grouped by their directory only: may be unrelated traces (split_by_file)
    cycles: str | None = None  # one profiling cycle of several: how the files were grouped (cycles.py)


# endings dropped from a file's name to name its run (repeatedly: x.pt.trace.json.gz -> x)
_RUN_NAME_SUFFIXES = (".gz", ".json", ".pt.trace", ".trace", ".sqlite", ".sqlite3", ".db", ".csv", ".txt", ".rocpd")


def file_run_name(path: Path) -> str:
    """The run id of a trace file that is a run by itself: its name without the trace endings."""
    name = path.name
    changed = True
    while changed:
        changed = False
        for suffix in _RUN_NAME_SUFFIXES:
            if name.lower().endswith(suffix) and len(name) > len(suffix):
                name, changed = name[: -len(suffix)], True
    return display(name)


def split_by_file(run: RunSource) -> list[RunSource]:
    """``run``'s files as runs of their own, each named after its file."""
    return [RunSource(file_run_name(path), [(path, reader)]) for path, reader in run.files]


def split_run(run: RunSource) -> list[RunSource]:
    """A run whose files turned out not to be the ranks of one job: one run per profiling
    cycle where they are the cycles of one job (``cycles.cycles_of_ranks``: ranks repeat,
    one world), else one run per file (``split_by_file``)."""
    if run.cycles is None:
        grouping = cycles_of_ranks(run.run_id, run.files)
        if grouping is not None:
            return [RunSource(rid, files, None, run.directory, grouped=True, cycles=f"{run.run_id}: {grouping.summary}")
                    for rid, files in grouping.runs]  # fmt: skip
    return split_by_file(run)


def check_unique(runs: list[RunSource]) -> None:
    """Raise ValueError naming a run id two runs share."""
    seen: dict[str, RunSource] = {}
    for r in runs:
        if r.run_id in seen:
            where = r.directory or (r.files[0][0] if r.files else r.run_id)
            raise ValueError(f"{display(where)}: run id {r.run_id!r} appears twice (use --run-id or rename)")
        seen[r.run_id] = r


def discover(sources: Sequence[str | os.PathLike], *, run_id: str | None = None,
             skipped: list[tuple[str, str]] | None = None) -> list[RunSource]:
    """Group ``sources`` into runs (see the module docstring for the rules).

    Raises
    ------
    ValueError
        A source that does not exist, is not a trace, or holds no traces (without
        ``skipped``); a run id used twice.
    """
    if not sources:
        raise ValueError("no sources given")
    runs: list[RunSource] = []
    loose: list[tuple[Path, str]] = []
    unknown: list[Path] = []
    for src in map(Path, sources):
        try:
            mode = _source_mode(src)
            if stat.S_ISDIR(mode):
                found = _discover_dir(src, depth=0, skipped=skipped)
                if not found:
                    stats = _stats_files(src)
                    if stats:
                        raise ValueError(f"{display(src)}: {STATS_ONLY} ({', '.join(p.name for p in stats[:3])})")
                    raise ValueError(f"{display(src)}: no traces found in this directory")
                runs.extend(found)
            else:
                problem = regular_file_problem(mode)
                if problem:
                    raise ValueError(f"{display(src)}: {problem}, not a trace file")
                reader = detect(src)
                if reader is None:
                    unknown.append(src)
                else:
                    loose.append((src, reader.name))
        except ValueError as exc:
            if skipped is None:
                raise
            skipped.append((display(src), _why(exc, src)))
    # a file another file's reader reads along with it (rocprof's per-process CSVs) is not
    # a source of its own: `ingest out/*.csv` names them all
    claimed = _claimed(loose)
    loose = [f for f in loose if f[0].resolve() not in claimed]
    for src in unknown:
        if src.resolve() not in claimed:
            why = (STATS_ONLY if _is_stats_name(src) else unmerged_wal(src, head_bytes(src))
                   or f"not a recognised trace format ({_describe(src)})")  # fmt: skip
            if skipped is None:
                raise ValueError(f"{display(src)}: {why}")
            skipped.append((display(src), why))
    if loose:
        # files named together: one run per parent directory, named after it (one run in
        # all when --run-id names it); the only file named from its directory: a run named after it
        groups: dict[Path, list] = {}
        for f in loose:
            groups.setdefault(Path("") if run_id is not None else f[0].resolve().parent, []).append(f)
        loose_runs = []
        for parent, files in groups.items():
            files = sorted(files, key=lambda f: f[0].name)
            if len(files) == 1:
                loose_runs.append(RunSource(run_id=file_run_name(files[0][0]) or "run", files=files))
            else:
                loose_runs.extend(_runs_of_files(display(files[0][0].resolve().parent.name) or "run", files, None))
        runs[:0] = loose_runs
    if run_id is not None and len(runs) > 1 and runs[0].cycles and all(r.cycles == runs[0].cycles for r in runs):
        for k, r in enumerate(runs, start=1):  # the profiling cycles of one job: <ID>_cycle<k>
            r.run_id, r.grouped = f"{display(run_id)}_cycle{k}", False
        run_id = None
    if run_id is not None:
        if len(runs) != 1:
            raise ValueError(f"--run-id names one run but the sources hold {len(runs)} runs")
        runs[0].run_id = display(run_id)
        runs[0].grouped = False
    check_distinct(runs)
    check_unique(runs)
    return runs


def check_distinct(runs: list[RunSource]) -> None:
    """Raise ValueError naming a trace file or run directory that ``runs`` read twice.

    Compared by device and inode: a file named twice, a symbolic or hard link beside its
    target, a directory and one of its files, a run directory inside a sweep also named,
    would each become extra ranks or runs of the same trace.
    """
    seen: dict[tuple[int, int], Path] = {}
    for r in runs:
        for path in [*([r.directory] if r.directory is not None else []), *(p for p, _ in r.files)]:
            try:
                st = os.stat(path)
            except OSError:
                continue
            first = seen.setdefault((st.st_dev, st.st_ino), path)
            if first is not path:
                what = "directory" if stat.S_ISDIR(st.st_mode) else "file"
                raise ValueError(f"{display(path)}: the same {what} as {display(first)} (named twice, through a link, or "
                                 f"inside a directory also named): it would be read twice; name each trace once")


def _why(exc: ValueError, path: Path) -> str:
    """An error's message without the path it starts with (the summary names the path)."""
    text = str(exc)
    for shown in (display(path), str(path)):
        if text.startswith(shown + ": "):
            return text[len(shown) + 2:]
    return text


def _claimed(files: list[tuple[Path, str]]) -> set[Path]:
    """Files that the readers of ``files`` read along with their own (see base.companions)."""
    claimed = set()
    for path, name in files:
        claimed.update(c.resolve() for c in companions(reader_named(name), path) if c.resolve() != path.resolve())
    return claimed


# rocprof's --stats summaries (v1 ``results.stats.csv``, v3 ``*_kernel_stats.csv``): totals per
# kernel, no timeline to find overlap in
STATS_ONLY = "a summary without a timeline: rerun with --kernel-trace"
_STATS_NAME = re.compile(r"[._]stats\.csv$", re.IGNORECASE)


def _is_stats_name(path: Path) -> bool:
    return _STATS_NAME.search(path.name) is not None


def _stats_files(d: Path) -> list[Path]:
    """rocprof stats summaries in ``d`` or its subdirectories (3 levels, as a scan), sorted."""
    found = []
    for root, dirs, files in os.walk(d):
        if len(Path(root).relative_to(d).parts) >= 3:
            dirs.clear()
        found.extend(Path(root) / f for f in files if _is_stats_name(Path(f)))
    return sorted(found)


def unmerged_wal(path: Path, head: bytes) -> str | None:
    """Why an SQLite file in WAL mode cannot be read yet: rows still in its ``-wal`` file.

    SQLite in write-ahead-log mode (header byte 18 = 2) keeps new pages in ``FILE-wal``
    until a checkpoint merges them; overlapviz opens traces immutable (never writing the
    user's file), which sees only the merged pages -- possibly no tables at all. None where
    the file is not in WAL mode or its log is empty or absent.
    """
    if len(head) < 19 or not head.startswith(b"SQLite format 3") or head[18] != 2:
        return None
    wal = Path(f"{path}-wal")
    try:
        size = wal.stat().st_size
    except OSError:
        return None
    if not size:
        return None
    return (f"an SQLite database in WAL mode whose rows are not all merged into it: {wal.name} holds {size:,} bytes "
            f"(still being written? once the writer is done, sqlite3 {path.name} 'PRAGMA wal_checkpoint' merges them)")


def _describe(path: Path) -> str:
    try:
        head = head_bytes(path)
    except ValueError as exc:
        return str(exc).split(": ", 1)[-1]
    if not head.strip():
        return "empty file"
    if head.startswith(b"SQLite format 3"):
        return unmerged_wal(path, head) or "a SQLite file that is neither an Nsight Systems export nor a rocpd database"
    if path.suffix in (".nsys-rep", ".qdrep"):
        return "an Nsight Systems report: export it first (nsys export --type sqlite REPORT)"
    return "not a Chrome trace, rocprof output, Nsight Systems export or rocpd database"


def _source_mode(src: Path) -> int:
    """``st_mode`` of a source named by the user (followed through symbolic links), or a
    one-line error naming it: missing, a dangling link, a link loop, no permission."""
    try:
        return os.stat(src).st_mode
    except FileNotFoundError:
        if os.path.islink(src):
            raise ValueError(f"{display(src)}: a symbolic link to nothing ({display(os.readlink(src))} does not exist)") from None
        raise ValueError(f"{display(src)}: no such file or directory") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ValueError(f"{display(src)}: a loop of symbolic links") from None
        raise ValueError(f"{display(src)}: cannot read: {exc.strerror or exc}") from None


def _list_dir(d: Path) -> list[Path]:
    try:
        return sorted(p for p in d.iterdir() if not p.name.startswith("."))
    except OSError as exc:
        raise ValueError(f"{display(d)}: cannot list this directory: {exc.strerror or exc}") from None


def _regular(p: Path) -> bool:
    """A regular file (through symbolic links); False for links to nothing, loops, FIFOs, devices."""
    try:
        return stat.S_ISREG(os.stat(p).st_mode)
    except OSError:
        return False


def _directory_identity(p: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(p)
    except OSError:
        return None
    return (st.st_dev, st.st_ino) if stat.S_ISDIR(st.st_mode) else None


def _discover_dir(d: Path, depth: int, visited: set | None = None, skipped: list | None = None) -> list[RunSource]:
    # a directory reached twice (a symbolic link to it, or to a directory above it) is read once
    visited = set() if visited is None else visited
    ident = _directory_identity(d)
    if ident is not None:
        if ident in visited:
            return []
        visited.add(ident)
    manifest_path = d / MANIFEST
    entries = _list_dir(d)
    files = [
        p
        for p in entries
        if _regular(p)
        and p.name not in _SKIP_NAMES
        and not TIMINGS_RE.match(p.name)
        and not p.name.lower().endswith(_SKIP_SUFFIXES)
    ]
    traces = []
    for p in files:
        reader = detect(p)
        if reader is not None:
            traces.append((p, reader.name))
        else:
            wal = unmerged_wal(p, head_bytes(p))  # an export read before its log was merged: say so, never skip it
            if wal:
                raise ValueError(f"{display(p)}: {wal}")
    claimed = _claimed(traces)
    traces = [t for t in traces if t[0].resolve() not in claimed]
    if traces:
        _warn_left_out(d, [p for p in files if p.resolve() not in claimed], traces)
    if _regular(manifest_path):
        manifest = _read_manifest(manifest_path)
        run = manifest.get("run") or {}
        rid = display(str(run.get("run_id") or d.name))
        timings = [p for p in entries if TIMINGS_RE.match(p.name) and _regular(p)]
        if not traces and run.get("status", "ok") != "failed":
            raise ValueError(f"{display(d)}: manifest says the run succeeded but there are no traces in it")
        return [RunSource(rid, traces, manifest, d, timings)]
    if traces:
        return _runs_of_files(display(d.resolve().name), traces, d)
    if depth >= 3:
        return []
    found: list[RunSource] = []
    ranks = _rank_dirs(entries)
    if ranks:  # rank_<N>/ folders: the ranks of one job (one run per profiling cycle)
        found.extend(_runs_of_files(display(d.resolve().name), [t for r in sorted(ranks) for t in ranks[r]], d,
                                    {t[0]: r for r in ranks for t in ranks[r]}))  # fmt: skip
    for sub in entries:
        if is_rank_dir(sub) in ranks:
            continue
        if _directory_identity(sub) is not None:
            try:
                found.extend(_discover_dir(sub, depth + 1, visited, skipped))
            except ValueError as exc:
                if skipped is None:
                    raise
                skipped.append((display(sub), _why(exc, sub)))
    return found


class LeftOut(UserWarning):
    """A file of a run's directory that looks like one of its rank traces but is none (empty,
    truncated to nothing): the run is ingested from its other files. ``overlapviz ingest``
    prints it on stderr."""


# names a rank trace has (``rank1.json``, ``worker1.pt.trace.json.gz``)
_TRACE_NAME = re.compile(r"\.(json|json\.gz|gz)$|rank[-_]?\d", re.IGNORECASE)


def _warn_left_out(d: Path, files: list[Path], traces: list[tuple[Path, str]]) -> None:
    """Say which files of ``d`` that look like rank traces are not read (``LeftOut``)."""
    import warnings

    read = {p for p, _ in traces}
    for p in files:
        if p not in read and _TRACE_NAME.search(p.name):
            n = len(traces)
            warnings.warn(LeftOut(f"{display(p)}: {_describe(p)}, not read: the run of {display(d)} has "
                                  f"{n} trace file{'s' * (n != 1)} without it (fewer ranks)"), stacklevel=2)  # fmt: skip


def input_paths(sources: Sequence[str | os.PathLike], runs: Sequence[RunSource]) -> list[Path]:
    """Every path an ingest of ``runs`` reads: the sources, run directories, trace files and
    the files their readers read along with them, manifests, timings. The output may be
    none of them, hold none and lie inside none (``schema.check_output_path``)."""
    paths = [Path(s) for s in sources]
    for r in runs:
        if r.directory is not None:
            paths.append(r.directory)
            if r.manifest is not None:
                paths.append(r.directory / MANIFEST)
        paths.extend(r.timings)
        for path, name in r.files:
            paths.append(path)
            paths.extend(companions(reader_named(name), path))
    return list(dict.fromkeys(paths))


def _read_manifest(path: Path) -> dict:
    try:
        manifest = json.loads(read_regular(path))
    except UnicodeDecodeError as exc:
        raise ValueError(f"{display(path)}: cannot read: {exc}") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{display(path)}: not valid JSON ({exc})") from None
    except RecursionError:
        raise ValueError(f"{display(path)}: not a run manifest (JSON nested too deeply)") from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("run", {}), dict):
        raise ValueError(f"{display(path)}: not an overlapviz run manifest (no 'run' object)")
    fmt = str(manifest.get("format", ""))
    if fmt.split("/")[0] != MANIFEST_FORMAT.split("/")[0] or fmt.split("/")[-1] != "1":
        raise ValueError(f"{display(path)}: manifest format {fmt!r} is not {MANIFEST_FORMAT}")
    return manifest


# --- per-file work (runs in the worker processes) ----------------------------------------


def _rank_dirs(entries: list[Path]) -> dict[int, list[tuple[Path, str]]]:
    """The Kineto traces of each ``rank_<N>/`` folder among ``entries``, when there are such
    folders and each holds Kineto traces only, no manifest and no folder of its own; else {}."""
    out: dict[int, list[tuple[Path, str]]] = {}
    for sub in entries:
        rank = is_rank_dir(sub)
        if rank is None or _directory_identity(sub) is None:
            continue
        inside = _list_dir(sub)
        if _regular(sub / MANIFEST) or any(_directory_identity(p) is not None for p in inside):
            return {}
        traces = [(p, r.name) for p in inside if _regular(p) and (r := detect(p)) is not None]
        if not traces or any(name != "chrome" for _, name in traces) or rank in out:
            return {}
        out[rank] = sorted(traces, key=lambda t: t[0].name)
    return out


def _runs_of_files(name: str, traces: list[tuple[Path, str]], directory: Path | None,
                   folder_ranks: dict[Path, int] | None = None) -> list[RunSource]:
    """The runs of trace files grouped together: one per profiling cycle where they are
    ``tensorboard_trace_handler`` files of several cycles (cycles.py), else one run."""
    folder_ranks = folder_ranks or {}
    named = [(p, r, cycle_name(p)) for p, r in traces]
    if len(traces) > 1 and all(c is not None and r == "chrome" for _, r, c in named):
        files = [peek(p, r, str(folder_ranks.get(p, c[0])), c[1], folder_ranks.get(p)) for p, r, c in named]
        grouping = group_cycles(name, files)
        if grouping is not None:
            return [RunSource(rid, files, None, directory, grouped=True, cycles=f"{name}: {grouping.summary}")
                    for rid, files in grouping.runs]  # fmt: skip
    if folder_ranks:  # rank folders: files in rank order
        traces = sorted(traces, key=lambda t: (folder_ranks.get(t[0], -1), t[0].name))
    return [RunSource(name, traces, None, directory, grouped=len(traces) > 1)]
