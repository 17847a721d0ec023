"""Which runs a list of sources makes: collected run directories (manifest.json), per-rank trace directories, sweeps and loose files.

How sources become runs (first match wins for each source):

* a directory with ``manifest.json``: one collected run (``overlapviz-run/1``), its id from
  the manifest (else the directory name);
* a directory holding trace files: one run named after the directory;
* a directory holding neither: a sweep; each subdirectory (``runs/<run_id>/`` included)
  that is a run by the two rules above becomes one;
* trace files named on the command line: one run per parent directory, named after it.

``run_id`` names the run when the sources make exactly one; loose files given with it
form one run whatever their directories.

A file's rank is ``distributedInfo.rank``; else the number in its name (``rank3``,
``rank-3``, ``trace_rank3``; never a bare number); else its position among the run's files
sorted by name. Two files with one rank in one run are an error.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from overlapviz.ingest.base import companions
from overlapviz.ingest.files import head_bytes
from overlapviz.ingest.registry import detect, reader_named

__all__ = ["MANIFEST", "MANIFEST_FORMAT", "RunSource", "discover"]

MANIFEST = "manifest.json"
MANIFEST_FORMAT = "overlapviz-run/1"
_TIMINGS_RE = re.compile(r"^timings_rank(\d+)\.json$")
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


def discover(sources: Sequence[str | os.PathLike], *, run_id: str | None = None) -> list[RunSource]:
    """Group ``sources`` into runs (see the module docstring for the rules).

    Raises
    ------
    ValueError
        A source that does not exist, is not a trace, or holds no traces; a run id used twice.
    """
    if not sources:
        raise ValueError("no sources given")
    runs: list[RunSource] = []
    loose: list[tuple[Path, str]] = []
    unknown: list[Path] = []
    for src in map(Path, sources):
        if not src.exists():
            raise ValueError(f"{src}: no such file or directory")
        if src.is_dir():
            found = _discover_dir(src, depth=0)
            if not found:
                raise ValueError(f"{src}: no traces found in this directory")
            runs.extend(found)
        else:
            reader = detect(src)
            if reader is None:
                unknown.append(src)
            else:
                loose.append((src, reader.name))
    # a file another file's reader reads along with it (rocprof's per-process CSVs) is not
    # a source of its own: `ingest out/*.csv` names them all
    claimed = _claimed(loose)
    loose = [f for f in loose if f[0].resolve() not in claimed]
    for src in unknown:
        if src.resolve() not in claimed:
            raise ValueError(f"{src}: not a recognised trace format ({_describe(src)})")
    if loose:
        # files named together: one run per parent directory, named after it (one run in
        # all when --run-id names it)
        groups: dict[Path, list] = {}
        for f in loose:
            groups.setdefault(Path("") if run_id is not None else f[0].resolve().parent, []).append(f)
        runs[:0] = [RunSource(run_id=parent.name or "run", files=sorted(files, key=lambda f: f[0].name))
                    for parent, files in groups.items()]
    if run_id is not None:
        if len(runs) != 1:
            raise ValueError(f"--run-id names one run but the sources hold {len(runs)} runs")
        runs[0].run_id = run_id
    seen: dict[str, RunSource] = {}
    for r in runs:
        if r.run_id in seen:
            where = r.directory or (r.files[0][0] if r.files else r.run_id)
            raise ValueError(f"{where}: run id {r.run_id!r} appears twice (use --run-id or rename)")
        seen[r.run_id] = r
    return runs


def _claimed(files: list[tuple[Path, str]]) -> set[Path]:
    """Files that the readers of ``files`` read along with their own (see base.companions)."""
    claimed = set()
    for path, name in files:
        claimed.update(c.resolve() for c in companions(reader_named(name), path) if c.resolve() != path.resolve())
    return claimed


def _describe(path: Path) -> str:
    try:
        head = head_bytes(path)
    except ValueError as exc:
        return str(exc).split(": ", 1)[-1]
    if not head.strip():
        return "empty file"
    if head.startswith(b"SQLite format 3"):
        return "a SQLite file that is neither an Nsight Systems export nor a rocpd database"
    if path.suffix in (".nsys-rep", ".qdrep"):
        return "an Nsight Systems report: export it first (nsys export --type sqlite REPORT)"
    return "not a Chrome trace, rocprof output, Nsight Systems export or rocpd database"


def _discover_dir(d: Path, depth: int) -> list[RunSource]:
    manifest_path = d / MANIFEST
    entries = sorted(p for p in d.iterdir() if not p.name.startswith("."))
    files = [
        p
        for p in entries
        if p.is_file()
        and p.name not in _SKIP_NAMES
        and not _TIMINGS_RE.match(p.name)
        and not p.name.lower().endswith(_SKIP_SUFFIXES)
    ]
    traces = []
    for p in files:
        reader = detect(p)
        if reader is not None:
            traces.append((p, reader.name))
    claimed = _claimed(traces)
    traces = [t for t in traces if t[0].resolve() not in claimed]
    if manifest_path.exists():
        manifest = _read_manifest(manifest_path)
        run = manifest.get("run") or {}
        rid = str(run.get("run_id") or d.name)
        timings = [p for p in entries if _TIMINGS_RE.match(p.name)]
        if not traces and run.get("status", "ok") != "failed":
            raise ValueError(f"{d}: manifest says the run succeeded but there are no traces in it")
        return [RunSource(rid, traces, manifest, d, timings)]
    if traces:
        return [RunSource(d.resolve().name, traces, None, d)]
    if depth >= 3:
        return []
    found: list[RunSource] = []
    for sub in entries:
        if sub.is_dir():
            found.extend(_discover_dir(sub, depth + 1))
    return found


def _read_manifest(path: Path) -> dict:
    try:
        manifest = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: cannot read: {exc}") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("run", {}), dict):
        raise ValueError(f"{path}: not an overlapviz run manifest (no 'run' object)")
    fmt = str(manifest.get("format", ""))
    if fmt.split("/")[0] != MANIFEST_FORMAT.split("/")[0] or fmt.split("/")[-1] != "1":
        raise ValueError(f"{path}: manifest format {fmt!r} is not {MANIFEST_FORMAT}")
    return manifest


# --- per-file work (runs in the worker processes) ----------------------------------------
