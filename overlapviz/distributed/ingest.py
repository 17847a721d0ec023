"""Ingest on a Dask cluster: one task per trace file, written into the dataset's temporary directory, assembled and committed by the client."""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

from overlapviz.dataset import schema
from overlapviz.distributed.cluster import check_workers, in_order, task_key, task_progress
from overlapviz.ingest.files import display

__all__ = ["ingest_on"]

DRAIN_TIMEOUT_S = 600.0  # after a failure: how long to wait for tasks still writing into the temporary directory
STAGING = ".ovz-staging"  # in the temporary dataset directory: one folder per task attempt
_STOP = ".stop"  # in STAGING: the ingest failed, tasks that start now write nothing

_ACTIVE: dict[str, int] = {}  # in a worker: temporary dataset directory -> tasks writing into it now
_ACTIVE_LOCK = threading.Lock()


@contextlib.contextmanager
def _writing(directory: str):
    with _ACTIVE_LOCK:
        _ACTIVE[directory] = _ACTIVE.get(directory, 0) + 1
    try:
        yield
    finally:
        with _ACTIVE_LOCK:
            _ACTIVE[directory] -= 1
            if not _ACTIVE[directory]:
                del _ACTIVE[directory]


def _active_in(directory: str) -> int:
    with _ACTIVE_LOCK:
        return _ACTIVE.get(directory, 0)


def _ingest_task(path: str, reader_name: str, rules_json: str, file_index: int, run_id: str, directory: str) -> tuple:
    """One trace file on a worker: ``driver.ingest_file`` into a folder of its own under
    ``STAGING``, then each kernels file renamed into ``directory`` (atomic: a second attempt
    of this file, its first worker presumed dead, can only replace a whole file by the same
    whole file). ``("ok", parts)``, or ``("error", message)`` for the file's one-line error
    (returned, not raised: the worker logs no traceback for a bad trace)."""
    try:
        return _ingest_staged(path, reader_name, rules_json, file_index, run_id, directory)
    except ValueError as exc:  # the file's one-line error, for the client to raise in file order
        return "error", str(exc)


def _ingest_staged(path: str, reader_name: str, rules_json: str, file_index: int, run_id: str, directory: str):
    from overlapviz.ingest import driver

    staging = os.path.join(directory, STAGING)
    with _writing(directory):
        if os.path.lexists(os.path.join(staging, _STOP)):
            raise ValueError(f"{display(path)}: not read (the ingest failed on another file)")
        attempt = os.path.join(staging, uuid.uuid4().hex)
        try:
            os.mkdir(attempt)  # never with parents: a removed temporary directory stays removed
            os.mkdir(os.path.join(attempt, "kernels"))
        except OSError as exc:
            raise ValueError(f"cannot write the dataset while ingesting {display(path)}: {exc.strerror or exc}") from None
        try:
            parts = driver.ingest_file(path, reader_name, rules_json, file_index, run_id, attempt)
            for part in parts:
                final = os.path.join(directory, part.kernels_file)
                try:
                    with contextlib.suppress(FileExistsError):
                        os.mkdir(os.path.dirname(final))
                    os.replace(os.path.join(attempt, part.kernels_file), final)
                except OSError as exc:
                    raise ValueError(f"cannot write the dataset while ingesting {display(path)}: "
                                     f"{exc.strerror or exc}") from None  # fmt: skip
            return "ok", parts
        finally:
            shutil.rmtree(attempt, ignore_errors=True)


def _drain(client, directory: str, timeout: float = DRAIN_TIMEOUT_S) -> None:
    """After a failure: stop tasks that have not started writing and wait (up to ``timeout``)
    for those that have, so the writer removes a directory no worker writes into."""
    with contextlib.suppress(OSError):
        Path(directory, STAGING, _STOP).touch()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            counts = client.run(_active_in, directory, on_error="ignore")
        except Exception:  # noqa: BLE001 - the cluster itself is gone: nobody writes
            return
        if not any(counts.values()):
            return
        time.sleep(0.05)


def ingest_on(client, sources: Sequence[str | os.PathLike] | str | os.PathLike, out: str | os.PathLike, *,
              rules=None, run_id: str | None = None, overwrite: bool = False,
              progress: bool | None = None, align_clocks: str = "auto") -> Path:  # fmt: skip
    """``overlapviz.ingest.ingest`` with one Dask task per trace file; the same dataset, byte for byte.

    Parameters
    ----------
    client
        A ``distributed.Client`` (``client_for``). Its workers must see ``sources`` and
        ``out``'s parent directory at the same paths (a shared file system); relative paths
        are kept as given where the workers' working directory is this process's, else made
        absolute (and recorded so in ``ranks.source_path``).
    sources, out, rules, run_id, overwrite, align_clocks
        As ``overlapviz.ingest.ingest``.
    progress
        A progress bar on stderr, moved as the cluster finishes files; None: when stderr is
        a terminal.

    Returns
    -------
    pathlib.Path
        ``out``, moved into place only when every file succeeded.

    Raises
    ------
    ValueError
        The one line the local path raises for the first failing file in file order (a bad
        file, a duplicate rank, ...); a file whose every worker died names it. ``out`` is
        left as it was.
    """
    from overlapviz.ingest import driver
    from overlapviz.ingest.discover import check_unique, discover, split_run

    if isinstance(sources, (str, os.PathLike)):
        sources = [sources]
    runs = discover(sources, run_id=run_id)
    same_cwd = check_workers(client)
    while True:
        # files grouped by directory that turn out not to be one job's ranks are ingested again as a run per file,
        # as the local path does (driver.ingest)
        try:
            return _ingest_runs(client, sources, runs, out, rules, overwrite, progress, same_cwd, align_clocks)
        except driver.NotOneJob as d:
            runs = runs[: d.index] + split_run(runs[d.index]) + runs[d.index + 1 :]
            check_unique(runs)


def _ingest_runs(client, sources, runs, out, rules, overwrite: bool, progress, same_cwd: bool,
                 align_clocks: str = "auto") -> Path:  # fmt: skip
    from overlapviz.ingest import driver
    from overlapviz.ingest.discover import input_paths
    from overlapviz.domain.rules import default_rules

    run_rules = {r.run_id: driver.rules_for_run(r, rules) for r in runs}
    shared = {rs.to_json() for rs in run_rules.values()}
    default_set = next(iter(run_rules.values())) if len(shared) == 1 else (rules or default_rules())
    tasks = [(ri, fi, path, reader) for ri, r in enumerate(runs) for fi, (path, reader) in enumerate(r.files)]
    rules_json = {rid: rs.to_json() for rid, rs in run_rules.items()}

    with schema.DatasetWriter(out, overwrite=overwrite, rules=default_set.to_dict(), inputs=input_paths(sources, runs)) as writer:
        directory = os.path.abspath(writer.directory)
        try:
            os.mkdir(os.path.join(directory, STAGING))
        except OSError as exc:
            raise ValueError(f"{display(out)}: cannot write here: {exc.strerror or exc}") from None
        state = [driver.RunState() for _ in runs]
        prefix = task_key("ovz-ingest")
        futures = [
            client.submit(_ingest_task, str(path) if same_cwd else os.path.abspath(path), reader,
                          rules_json[runs[ri].run_id], fi, runs[ri].run_id, directory, key=f"{prefix}-{n}",
                          priority=_size(path) >> 20, retries=0)  # biggest first: the shortest tail
            for n, (ri, fi, path, reader) in enumerate(tasks)
        ]  # fmt: skip
        bar = task_progress(len(tasks), progress, "ingest")
        try:
            stops = lambda value: value[0] != "ok"
            with contextlib.closing(in_order(client, futures, bar, lambda i: display(tasks[i][2]), stops)) as results:
                del futures
                for i, (status, parts) in results:
                    if status != "ok":
                        raise ValueError(parts)
                    ri, _, path, _ = tasks[i]
                    driver.add_parts(writer, runs[ri], state[ri], path, parts, ri)
        except BaseException as exc:
            # before the writer removes the directory; briefly when the user interrupts
            _drain(client, directory, 5.0 if isinstance(exc, KeyboardInterrupt) else DRAIN_TIMEOUT_S)
            raise
        finally:
            bar.close()
        shutil.rmtree(os.path.join(directory, STAGING), ignore_errors=True)  # what workers that died left
        done = [(r, st) for r, st in zip(runs, state) if st.ranks or not r.files]  # as driver._ingest_runs
        for r, st in done:
            driver.add_run(writer, r, st, run_rules[r.run_id], align_clocks)
        meta = {"runs": [r.run_id for r, _ in done], "ingested_from": [display(s) for s in sources]}
        cycles = list(dict.fromkeys(r.cycles for r, _ in done if r.cycles))
        if cycles:  # how per-cycle files became runs (ingest's summary line says it)
            meta["grouped_cycles"] = cycles
        return writer.commit(meta)


def _size(path) -> int:
    try:
        return os.stat(path).st_size  # a stat, not an open: thousands of files on a parallel file system
    except OSError:
        return 0
