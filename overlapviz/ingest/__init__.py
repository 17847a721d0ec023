"""Ingest raw traces (Chrome/Kineto JSON, rocprof) into the canonical Parquet dataset.

``ingest`` finds the runs in its sources, reads each trace file (one at a time per process,
this one and a bounded pool of workers), classifies, assigns steps and writes one Parquet
file per run x rank there, into the temporary directory of a ``schema.DatasetWriter``, which
moves the dataset into place only when everything succeeded.

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

import contextlib
import functools
import gzip
import importlib
import importlib.util
import json
import os
import re
import sys
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from overlapviz import schema
from overlapviz.ingest.base import RankTrace, Reader, companions, rank_from_name
from overlapviz.rules import RuleSet, default_rules

__all__ = ["ingest", "readers", "detect", "discover", "assign_steps", "RunSource"]

SNIFF_BYTES = 64 * 1024
# below this much trace content (uncompressed) in all, files are read in this process only:
# forking a pool costs more than the second core gives back (~70 MB/s of JSON per core)
POOL_MIN_BYTES = 32 * 1024 * 1024
# after a file with at least this much content, freed memory is handed back to the OS
# (see _release_memory); below it there is little to hand back and trimming costs time
RELEASE_MIN_BYTES = 8 * 1024 * 1024
MANIFEST = "manifest.json"
MANIFEST_FORMAT = "overlapviz-run/1"
_TIMINGS_RE = re.compile(r"^timings_rank(\d+)\.json$")
_SKIP_NAMES = {MANIFEST}
# in a directory scan, files with these endings are documentation, code or outputs, never
# traces (files named on the command line are always sniffed)
_SKIP_SUFFIXES = (".md", ".rst", ".py", ".sh", ".slurm", ".log", ".png", ".svg", ".pdf", ".html", ".parquet",
                  ".yaml", ".yml", ".toml", ".cu", ".cpp", ".h")


# --- reader registry -----------------------------------------------------------------


def readers() -> list[Reader]:
    """Every registered trace reader, the most specific formats first (rocprof before Chrome).

    Importing them is cheap: each format's parsing modules are imported by its ``read``.
    """
    return list(_registered_readers())


@functools.lru_cache(maxsize=1)
def _registered_readers() -> tuple[Reader, ...]:
    found: list[Reader] = []
    for module in ("overlapviz.ingest.rocprof", "overlapviz.ingest.chrome"):
        if importlib.util.find_spec(module) is not None:
            found.extend(importlib.import_module(module).READERS)
    return tuple(found)


def _reader(name: str) -> Reader:
    for r in _registered_readers():
        if r.name == name:
            return r
    raise ValueError(f"no trace reader named {name!r}")


def head_bytes(path: Path) -> bytes:
    """The first 64 KiB of ``path``, gunzipped when it is gzip.

    Raises
    ------
    ValueError
        Naming ``path`` when it cannot be read or its gzip stream is corrupt.
    """
    try:
        with open(path, "rb") as fh:
            magic = fh.read(2)
            fh.seek(0)
            if magic == b"\x1f\x8b":
                with gzip.GzipFile(fileobj=fh) as gz:
                    return gz.read(SNIFF_BYTES)
            return fh.read(SNIFF_BYTES)
    except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
        raise ValueError(f"{path}: truncated or corrupt gzip ({' '.join(str(exc).split())})") from None
    except OSError as exc:
        raise ValueError(f"{path}: cannot read: {exc.strerror or exc}") from None


def detect(path: Path) -> Reader | None:
    """The reader whose ``sniff`` accepts ``path`` (by content, not by name), or None."""
    head = head_bytes(path)
    for r in _registered_readers():
        if r.sniff(path, head):
            return r
    return None


# --- discovery ------------------------------------------------------------------------


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
        claimed.update(c.resolve() for c in companions(_reader(name), path) if c.resolve() != path.resolve())
    return claimed


def _describe(path: Path) -> str:
    try:
        head = head_bytes(path)
    except ValueError as exc:
        return str(exc).split(": ", 1)[-1]
    if not head.strip():
        return "empty file"
    return "not a Chrome trace or rocprof output"


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


def assign_steps(launch_ns: pa.Array | pa.ChunkedArray, steps: pa.Table | None) -> pa.Array:
    """The step whose host range ``[start_ns, end_ns)`` contains each launch time.

    Where steps nest or overlap, the innermost (the last started) containing step wins.
    Null where the launch time is null or outside every step. Vectorized: one
    ``searchsorted`` over the sorted launch times per step, never a loop over kernels.
    """
    launch = pa.array(launch_ns, pa.int64()) if not isinstance(launch_ns, (pa.Array, pa.ChunkedArray)) else launch_ns
    if isinstance(launch, pa.ChunkedArray):
        launch = launch.combine_chunks()
    n = len(launch)
    out = np.full(n, -1, dtype=np.int64)
    found = np.zeros(n, dtype=bool)
    if steps is not None and steps.num_rows and n:
        valid = np.asarray(launch.is_valid())
        values = np.asarray(launch.fill_null(0), dtype=np.int64)
        idx = np.flatnonzero(valid)
        order = idx[np.argsort(values[idx], kind="stable")]
        sorted_launch = values[order]
        st = steps.sort_by([("start_ns", "ascending")])  # later-started steps overwrite earlier ones
        for s, a, b in zip(
            st.column("step").to_numpy(zero_copy_only=False),
            st.column("start_ns").to_numpy(zero_copy_only=False),
            st.column("end_ns").to_numpy(zero_copy_only=False),
        ):
            lo, hi = np.searchsorted(sorted_launch, [a, b], side="left")
            out[order[lo:hi]] = s
            found[order[lo:hi]] = True
    return pa.array(out, pa.int64(), mask=~found)


def finish_kernels(trace: RankTrace, rules: RuleSet) -> pa.Table:
    """A reader's kernels with ``kind``, ``step`` and (comm only) ``collective`` filled in.

    Host ``user_annotation`` ranges that the rules call ``other`` are dropped: in a
    CPU-only trace they are labels (``## forward ##``, a user's ``record_function``), not
    activities; the ones the rules make comm or compute (``gloo:all_reduce``) stay.
    """
    k = trace.kernels
    kind = rules.classify(k.column("name"), k.column("category"))
    if "is_host" in k.column_names and k.num_rows:
        label = pc.and_(
            pc.and_(pc.fill_null(k.column("is_host"), False), pc.equal(k.column("category"), "user_annotation")),
            pc.equal(kind, "other"),
        )
        label = pc.fill_null(label, False)
        if pc.any(label).as_py():
            keep = pc.invert(label)
            k, kind = k.filter(keep), kind.filter(keep)
    launch = k.column("launch_ns") if "launch_ns" in k.column_names else pa.nulls(k.num_rows, pa.int64())
    step = assign_steps(launch, trace.steps)
    k = _set(k, "kind", kind)
    k = _set(k, "step", step)
    return _set(k, "collective", _comm_collectives(k, kind))


def _comm_collectives(k: pa.Table, kind: pa.Array) -> pa.Array:
    """The collective of each comm row (from its name, else the reader's ``collective``); null elsewhere."""
    n = k.num_rows
    comm = np.asarray(pc.equal(kind, "comm").fill_null(False), dtype=bool) if n else np.zeros(0, bool)
    rows = np.flatnonzero(comm)
    if not len(rows):
        return pa.nulls(n, pa.string())
    take = pa.array(rows)
    names = k.column("name").take(take)
    given = k.column("collective").take(take) if "collective" in k.column_names else pa.nulls(len(rows), pa.string())
    found = pc.coalesce(collective_names(names), collective_names(given))
    slot = np.full(n, -1, np.int64)
    slot[rows] = np.arange(len(rows))
    return found.take(pa.array(slot, mask=slot < 0))


# (normalised name, pattern searched in the lower-cased name stripped of everything but
# letters and digits); order matters: compound names before their parts
_COLLECTIVES = (
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


def collective_names(names: pa.Array | pa.ChunkedArray) -> pa.Array:
    """The collective a kernel or host record names, in snake_case; null where none.

    ``ncclKernel_AllReduce_RING_LL_Sum_float`` and ``allreduce`` give ``all_reduce``;
    ``ncclDevKernel_SendRecv`` gives ``send_recv``; ``gloo:all_to_all`` gives
    ``all_to_all``; RCCL's ``ncclDevKernel_Generic`` gives null. Evaluated once per
    distinct name.
    """
    arr = names.combine_chunks() if isinstance(names, pa.ChunkedArray) else names
    if len(arr) == 0:
        return pa.array([], pa.string())
    encoded = pc.dictionary_encode(arr.cast(pa.string()))
    labels = [_collective_of(v) for v in encoded.dictionary.to_pylist()]  # once per distinct name
    return pa.array(labels, pa.string()).take(encoded.indices)


_NOT_ALNUM = re.compile(r"[^a-z0-9]+")


def _collective_of(name: str) -> str | None:
    key = _NOT_ALNUM.sub("", name.lower())
    return next((label for label, pattern in _COLLECTIVES if pattern in key), None)


def _set(table: pa.Table, name: str, column) -> pa.Table:
    if name in table.column_names:
        return table.set_column(table.column_names.index(name), name, column)
    return table.append_column(name, column)


@dataclass
class _RankPart:
    """What the parent needs of one rank a process read and wrote: its small tables and facts."""

    rank: int
    kernels_file: str  # relative to the dataset directory
    n_kernels: int
    steps: pa.Table | None
    devices: pa.Table | None
    info: dict
    top_device: int | None  # the device most of the rank's kernels ran on


def _ingest_file(path: str, reader_name: str, rules_json: str, file_index: int, run_id: str,
                 directory: str) -> list[_RankPart]:
    """Read one trace file, finish its kernels and write each rank's kernels file into the
    dataset's temporary ``directory``; return only the small per-rank parts.

    Runs wherever the file is read (the parent or a worker), so the expensive per-file work
    (parse, classify, steps, conform, Parquet write) stays with the process that holds the
    trace, and no kernels table crosses between processes. The parent checks the ranks.
    """
    traces = _reader(reader_name).read(Path(path))
    rules = _rules_from_json(rules_json)
    big = _input_bytes(Path(path)) >= RELEASE_MIN_BYTES
    parts = []
    for ti, t in enumerate(traces):
        rank = _rank_of(t, Path(path), file_index, ti, len(traces))
        k = finish_kernels(t, rules)
        n = k.num_rows
        k = _set(k, "run_id", pa.repeat(pa.scalar(run_id, pa.string()), n))
        k = _set(k, "rank", pa.repeat(pa.scalar(rank, pa.int32()), n))
        rel, n = schema.write_kernels(k, directory, run_id, rank)
        parts.append(_RankPart(rank, rel, n, t.steps, t.devices, t.info, _top_device(k)))
        big = big or k.nbytes >= RELEASE_MIN_BYTES
        del k
        t.kernels = None
    del traces
    if big:
        _release_memory()
    return parts


def _rank_of(t: RankTrace, path: Path, file_index: int, trace_index: int, n_traces: int) -> int:
    rank = t.rank
    if rank is None:
        rank = rank_from_name(path.name) if n_traces == 1 else None
    if rank is None:
        rank = file_index if n_traces == 1 else trace_index
    return int(rank)


@functools.lru_cache(maxsize=16)
def _rules_from_json(text: str) -> RuleSet:
    return RuleSet.from_json(text)  # frozen: one parse per rule set, not one per file


def _release_memory() -> None:
    """Hand freed memory back to the OS after a file. Arrow's allocator keeps what a parse
    freed (~80 MB for a 250k-event rank) for reuse, glibc's heap another ~25 MB; kept, each
    file raises the process's floor and the next file's peak by that much."""
    pa.default_memory_pool().release_unused()
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)


@functools.lru_cache(maxsize=1)
def _glibc():  # ctypes is imported only when a big file asks for a trim
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        return libc if hasattr(libc, "malloc_trim") else None
    except OSError:  # musl and others: nothing to trim
        return None



# --- the driver --------------------------------------------------------------------------


def ingest(
    sources: Sequence[str | os.PathLike],
    out: str | os.PathLike,
    *,
    rules: RuleSet | None = None,
    run_id: str | None = None,
    overwrite: bool = False,
    workers: int | None = None,
    progress: bool | None = None,
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
        Replace an existing non-empty ``out``.
    workers
        Processes reading traces at once, this one included (default ``min(2, cpu
        count)``); each holds one trace in memory at a time. Below ``POOL_MIN_BYTES`` of
        trace content in all, this process reads every file alone.
    progress
        Show a progress bar on stderr; None: only when stderr is a terminal.

    Raises
    ------
    ValueError
        One line naming the file and the problem (missing, not a trace, truncated or corrupt,
        missing fields, bad durations, duplicate ranks, unwritable output, ...).
    """
    if isinstance(sources, (str, os.PathLike)):
        sources = [sources]
    runs = discover(sources, run_id=run_id)
    run_rules = {r.run_id: _run_rules(r, rules) for r in runs}
    # dataset.json records the rules every run shares (each run's own are in runs.kind_rules)
    shared = {rs.to_json() for rs in run_rules.values()}
    default_set = next(iter(run_rules.values())) if len(shared) == 1 else (rules or default_rules())
    n_workers = max(1, int(workers) if workers is not None else min(2, os.cpu_count() or 1))
    if progress is None:
        progress = sys.stderr.isatty()
    tasks = [(ri, fi, path, reader) for ri, r in enumerate(runs) for fi, (path, reader) in enumerate(r.files)]

    with schema.DatasetWriter(out, overwrite=overwrite, rules=default_set.to_dict()) as writer:
        state = [_RunState() for _ in runs]
        bar = _progress_bar(len(tasks), progress)
        # closing: on an error the worker is stopped before the writer removes its directory
        with contextlib.closing(_map(tasks, run_rules, runs, n_workers, writer.directory)) as results:
            try:
                for (ri, fi, path, _), parts in results:
                    _add_parts(writer, runs[ri], state[ri], path, parts)
                    bar.update(1)
            finally:
                bar.close()
        for r, st in zip(runs, state):
            _add_run(writer, r, st, run_rules[r.run_id])
        meta = {"runs": [r.run_id for r in runs], "ingested_from": [str(s) for s in sources]}
        return writer.commit(meta)


def _run_rules(run: RunSource, explicit: RuleSet | None) -> RuleSet:
    if explicit is not None:
        return explicit
    recorded = (run.manifest or {}).get("kind_rules")
    if recorded:
        try:
            return RuleSet.from_dict(recorded)
        except ValueError as exc:
            raise ValueError(f"{run.directory / MANIFEST}: {exc}") from None
    return default_rules()


def _progress_bar(total: int, enabled: bool):
    if not enabled:
        return _NoBar()
    from tqdm import tqdm  # 40 ms to import: only when a bar shows

    return tqdm(total=total, file=sys.stderr, unit="file", desc="ingest", leave=False)


class _NoBar:
    def update(self, n: int = 1) -> None:
        pass

    def close(self) -> None:
        pass


def _map(tasks, run_rules, runs, n_workers, directory: Path) -> Iterator:
    """(task, parts) for every task in file order, the parent process reading too.

    With ``n_workers`` > 1 and enough input to pay for it (``POOL_MIN_BYTES``), a pool of
    ``n_workers - 1`` forked processes reads beside the parent: ``n_workers`` traces are
    parsed at once, in ``n_workers`` processes rather than ``n_workers + 1`` (each process
    counts its copy of numpy/pandas/pyarrow, ~115 MB, in the peak memory). Each process
    takes the next file in order as soon as it is free (a feeder thread per worker hands
    them out), so all stay busy to the end whatever the files' sizes, and none holds more
    than the one trace it is reading. Otherwise every file is read in this process, one at
    a time: no fork for one or a few small files.
    """
    rules_json = {rid: rs.to_json() for rid, rs in run_rules.items()}
    jobs = [(t, (str(t[2]), t[3], rules_json[runs[t[0]].run_id], t[1], runs[t[0]].run_id, str(directory)))
            for t in tasks]
    n_pool = min(n_workers - 1, len(jobs) - 1)
    if n_pool < 1 or sum(_input_bytes(Path(args[0])) for _, args in jobs) < POOL_MIN_BYTES:
        for task, args in jobs:
            yield task, _ingest_file(*args)
        return
    import multiprocessing
    import threading

    ctx = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn")
    pool = ProcessPoolExecutor(max_workers=n_pool, mp_context=ctx)
    lock = threading.Lock()
    ready = threading.Condition(lock)
    results: dict[int, tuple[bool, object]] = {}  # job index -> (ok, parts or exception)
    state = {"next": 0, "stop": False}

    def take() -> int | None:
        with lock:
            if state["stop"] or state["next"] >= len(jobs):
                return None
            state["next"] += 1
            return state["next"] - 1

    def put(i: int, ok: bool, value) -> None:
        with ready:
            results[i] = (ok, value)
            if not ok:
                state["stop"] = True  # the error is raised in file order; read nothing more
            ready.notify_all()

    def feed() -> None:  # one per worker: keeps it busy with the next files in order
        queued: list = []  # (job index, future), oldest first
        while True:
            # a second file waits in the worker's queue, so it never idles while this
            # thread waits for the parent to let go of the GIL; not at the end, where the
            # parent reads the last files rather than wait for a worker's queue
            with lock:
                want = 2 if len(jobs) - state["next"] > n_pool else 1
            while len(queued) < want and (i := take()) is not None:
                try:
                    queued.append((i, pool.submit(_ingest_file, *jobs[i][1])))
                except BaseException as exc:  # noqa: BLE001 - raised again in the parent's thread
                    put(i, False, exc)
            if not queued:
                return
            i, fut = queued.pop(0)
            try:
                put(i, True, fut.result())
            except BaseException as exc:  # noqa: BLE001 - raised again in the parent's thread
                put(i, False, exc)

    feeders = []
    emitted = 0
    try:
        # fork the workers from this thread, before any other thread runs (a fork copies
        # only the thread that forks: a lock another thread held would stay held)
        pool.submit(os.getpid).result()
        feeders = [threading.Thread(target=feed, daemon=True) for _ in range(n_pool)]
        for f in feeders:
            f.start()
        while emitted < len(jobs):
            i = take()
            if i is not None:
                try:
                    put(i, True, _ingest_file(*jobs[i][1]))
                except Exception as exc:  # noqa: BLE001 - raised in file order below
                    put(i, False, exc)
            with ready:
                while i is None and emitted not in results:
                    ready.wait()
                done = []
                while emitted in results:
                    done.append((emitted, results.pop(emitted)))
                    emitted += 1
            for j, (ok, value) in done:
                if not ok:
                    raise value
                yield jobs[j][0], value
    finally:
        with lock:
            state["stop"] = True
        for f in feeders:
            f.join()
        pool.shutdown(wait=True, cancel_futures=True)


def ProcessPoolExecutor(*args, **kwargs):  # named as the class it makes (tests patch it by that name)
    """``concurrent.futures.ProcessPoolExecutor``, imported only when a pool is started:
    it and multiprocessing cost ~20 ms of start-up that small ingests never use."""
    from concurrent.futures import ProcessPoolExecutor as pool_class

    return pool_class(*args, **kwargs)


def _input_bytes(path: Path) -> int:
    """The size of ``path``'s content: a gzip file's trailer says it (modulo 4 GiB)."""
    try:
        with open(path, "rb") as fh:
            if fh.read(2) != b"\x1f\x8b":
                return os.fstat(fh.fileno()).st_size
            fh.seek(-4, os.SEEK_END)
            return int.from_bytes(fh.read(4), "little")
    except OSError:
        return 0


@dataclass
class _RunState:
    ranks: dict = field(default_factory=dict)  # rank -> source path
    infos: list = field(default_factory=list)
    devices: list = field(default_factory=list)  # device names seen, most used first per rank
    n_kernels: int = 0


def _add_parts(writer, run: RunSource, st: _RunState, path: Path, parts: list[_RankPart]) -> None:
    """Count one file's ranks (kernels files already written) and add their small tables."""
    for part in parts:
        rank = part.rank
        if rank in st.ranks:
            raise ValueError(f"{path}: rank {rank} of run {run.run_id!r} also comes from {st.ranks[rank]}")
        st.ranks[rank] = path
        writer.add_kernels_file(part.kernels_file, part.n_kernels, run.run_id, rank)
        st.n_kernels += part.n_kernels
        ident = {"run_id": run.run_id, "rank": rank}
        if part.steps is not None and part.steps.num_rows:
            writer.add("steps", _with_ident(part.steps, ident))
        devices = part.devices if part.devices is not None and part.devices.num_rows else _manifest_devices(run, rank)
        if devices is not None and devices.num_rows:
            writer.add("devices", _with_ident(devices, ident))
            st.devices.append(_device_name(devices, part.top_device))
        info = {c: part.info.get(c) for c in schema.RANKS.names if c in part.info} | ident
        if run.manifest and not info.get("host"):
            info["host"] = (run.manifest.get("run") or {}).get("host")
        writer.add("ranks", pa.Table.from_pylist([info]))
        st.infos.append(part.info)


def _with_ident(table: pa.Table, ident: dict) -> pa.Table:
    n = table.num_rows
    table = _set(table, "run_id", pa.repeat(pa.scalar(ident["run_id"], pa.string()), n))
    return _set(table, "rank", pa.repeat(pa.scalar(ident["rank"], pa.int32()), n))


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


_RUN_FACTS = ("world_size", "backend", "nccl_version", "hip_version", "cuda_version", "torch_version", "host")


def _add_run(writer, run: RunSource, st: _RunState, rules: RuleSet) -> None:
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
        source_paths=json.dumps([str(p) for p, _ in run.files] or ([str(run.directory)] if run.directory else [])),
        kind_rules=rules.to_json(),
    )
    where = run.directory / MANIFEST if run.manifest is not None else run.run_id
    try:
        writer.add("runs", pa.Table.from_pylist([row]))
    except (ValueError, pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        raise ValueError(f"{where}: {exc}") from None
    for path in run.timings:
        writer.add("iterations", _timings(path, run.run_id))


def _timings(path: Path, run_id: str) -> pa.Table:
    """``timings_rank<N>.json`` as ITERATIONS rows."""
    try:
        doc = json.loads(path.read_text())
        rank = int(doc.get("rank", _TIMINGS_RE.match(path.name).group(1)))
        items = doc["iterations"]
        rows = [
            {
                "run_id": run_id,
                "rank": rank,
                "iteration": int(it["iteration"]),
                "time_ms": float(it["time_ms"]),
                "measured": bool(it.get("measured", True)),
            }
            for it in items
        ]
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON ({exc})") from None
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ValueError(f"{path}: not a timings file ({type(exc).__name__}: {exc})") from None
    if not rows:
        return schema.empty(schema.ITERATIONS)
    return pa.Table.from_pylist(rows)


# The readers (their sniffing and the Kineto reader; rocprof's pandas parsers stay lazy) are
# what every ingest needs first: imported with the package, not by the first call.
_registered_readers()
