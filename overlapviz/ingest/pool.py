"""Reading many trace files at once: this process and a bounded pool of forked workers, results in file order, with a progress bar."""

from __future__ import annotations

import functools
import os
import signal
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pyarrow as pa

from overlapviz.ingest.files import input_bytes
from overlapviz import lifetime
from overlapviz.lifetime import die_with_parent

__all__ = ["POOL_MIN_BYTES", "ProcessPoolExecutor", "die_with_parent", "ordered_map", "progress_bar", "release_memory"]

# below this much trace content (uncompressed) in all, files are read in this process only:
# forking a pool costs more than the second core gives back (~70 MB/s of JSON per core)
POOL_MIN_BYTES = 32 * 1024 * 1024


def release_memory() -> None:
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


def progress_bar(total: int, enabled: bool):
    if not enabled:
        return _NoBar()
    from tqdm import tqdm  # 40 ms to import: only when a bar shows

    return tqdm(total=total, file=sys.stderr, unit="file", desc="ingest", leave=False)


class _NoBar:
    def update(self, n: int = 1) -> None:
        pass

    def close(self) -> None:
        pass


def ordered_map(work: Callable, jobs: Sequence[tuple], n_workers: int) -> Iterator:
    """``(task, work(*args))`` for every ``(task, args)`` of ``jobs`` in order, the parent process working too.

    ``args[0]`` is the job's input file (its size decides whether a pool pays); ``work``
    must be picklable by name (a module-level function).

    With ``n_workers`` > 1 and enough input to pay for it (``POOL_MIN_BYTES``), a pool of
    ``n_workers - 1`` forked processes reads beside the parent: ``n_workers`` traces are
    parsed at once, in ``n_workers`` processes rather than ``n_workers + 1`` (each process
    counts its copy of numpy/pandas/pyarrow, ~115 MB, in the peak memory). Each process
    takes the next file in order as soon as it is free (a feeder thread per worker hands
    them out), so all stay busy to the end whatever the files' sizes, and none holds more
    than the one trace it is reading. Otherwise every file is read in this process, one at
    a time: no fork for one or a few small files.
    """
    n_pool = min(n_workers - 1, len(jobs) - 1)
    if n_pool < 1 or sum(input_bytes(Path(args[0])) for _, args in jobs) < POOL_MIN_BYTES:
        for task, args in jobs:
            yield task, work(*args)
        return
    import multiprocessing
    import threading

    ctx = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn")
    lifetime.load()  # loaded here: the workers only call it
    # a parent killed alone (SIGKILL, the OOM killer) takes its workers with it: none goes on
    # reading for nobody, holding its memory and writing into a temporary directory
    pool = ProcessPoolExecutor(max_workers=n_pool, mp_context=ctx, initializer=die_with_parent,
                               initargs=(signal.SIGKILL, os.getpid()))
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
                    queued.append((i, pool.submit(work, *jobs[i][1])))
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
        # only the thread that forks: a lock another thread held would stay held); a
        # Ctrl-C or SIGTERM waits until the pool can be shut down (lifetime.signals_deferred)
        with lifetime.signals_deferred():
            pool.submit(os.getpid).result()
        feeders = [threading.Thread(target=feed, daemon=True) for _ in range(n_pool)]
        for f in feeders:
            f.start()
        while emitted < len(jobs):
            i = take()
            if i is not None:
                try:
                    put(i, True, work(*jobs[i][1]))
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
