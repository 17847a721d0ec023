"""Connecting to a Dask scheduler (or starting a local cluster), checking its workers, and taking task results in order."""

from __future__ import annotations

import contextlib
import os
import re
import sys
import uuid
from collections.abc import Callable, Iterator

from overlapviz import __version__

__all__ = ["EXTRA", "SCHEDULER_ENV", "SCHEDULER_HELP", "client_for", "require_dask"]

SCHEDULER_ENV = "OVERLAPVIZ_SCHEDULER"
EXTRA = "dask"
SCHEDULER_HELP = ("A Dask scheduler: tcp://HOST:PORT, a scheduler file (dask scheduler --scheduler-file), "
                  "'local' (a LocalCluster of one worker process per core available) or 'local:N' (N worker processes).")  # fmt: skip
WAIT_FOR_WORKERS_S = 120.0  # a scheduler whose workers are still starting (SLURM): how long to wait for the first
CONNECT_TIMEOUT_S = 30.0
_LOCAL_RE = re.compile(r"^local(?::(\d+))?$")


def require_dask():
    """``distributed``, or a one-line ValueError naming the extra to install."""
    try:
        import distributed
    except ImportError as exc:
        raise ValueError(f"--scheduler needs Dask: pip install 'overlapviz[{EXTRA}]' ({exc})") from None
    return distributed


@contextlib.contextmanager
def client_for(address: str | None = None, *, connect_timeout: float = CONNECT_TIMEOUT_S,
               wait_for_workers: float = WAIT_FOR_WORKERS_S, **cluster_options) -> Iterator:  # fmt: skip
    """A ``distributed.Client`` for ``address``, closed (and a local cluster stopped) on exit.

    Parameters
    ----------
    address
        ``tcp://HOST:PORT`` (any Dask address), the path of a scheduler file, ``local`` (a
        ``LocalCluster`` on 127.0.0.1 of one single-threaded worker process per core) or
        ``local:N`` (N worker processes). None: ``$OVERLAPVIZ_SCHEDULER``.
    connect_timeout
        Seconds to reach the scheduler.
    wait_for_workers
        Seconds to wait for the first worker to join (workers of a SLURM job may start
        after the scheduler).
    **cluster_options
        Passed to ``LocalCluster`` for ``local`` (``memory_limit="2GiB"``, say).

    Raises
    ------
    ValueError
        One line: Dask not installed (naming the extra), an address of no known form, a
        scheduler that cannot be reached, no worker within ``wait_for_workers``.
    """
    address = address or os.environ.get(SCHEDULER_ENV) or ""
    if not address.strip():
        raise ValueError(f"no Dask scheduler given (--scheduler ADDRESS or ${SCHEDULER_ENV}): {SCHEDULER_HELP}")
    address = address.strip()
    distributed = require_dask()
    local = _LOCAL_RE.match(address)
    with contextlib.ExitStack() as stack:
        if local:
            n = int(local.group(1)) if local.group(1) else _cores()
            if n < 1:
                raise ValueError(f"{address}: a local cluster needs at least one worker (local:N, N >= 1)")
            import logging

            # loopback only; the scheduler's HTTP routes (always served) on a free port, no dashboard
            scheduler = {"dashboard": False, "dashboard_address": "127.0.0.1:0"} | cluster_options.pop("scheduler_kwargs", {})
            options = {"n_workers": n, "threads_per_worker": 1, "processes": True, "host": "127.0.0.1",
                       "dashboard_address": None, "silence_logs": logging.ERROR,
                       "scheduler_kwargs": scheduler} | cluster_options  # fmt: skip
            import dask

            try:
                # one task at a time on a single-threaded worker (none queued behind it): a worker
                # that dies then counts against the file it was reading only
                with dask.config.set({"distributed.scheduler.worker-saturation": 1.0}):
                    cluster = stack.enter_context(distributed.LocalCluster(**options))
            except Exception as exc:  # noqa: BLE001 - a worker process that could not start, a port, ...
                raise ValueError(f"{address}: cannot start a local Dask cluster ({_first_line(exc)}); a Python "
                                 "script that starts one must do it under `if __name__ == '__main__':`") from None  # fmt: skip
            client = stack.enter_context(distributed.Client(cluster, set_as_default=False))
            stack.callback(_quiet_workers, client)  # first on the way out: before the client and cluster close
        else:
            where = {"scheduler_file": address} if _is_scheduler_file(address) else {"address": address}
            if "address" in where and "://" not in address and not re.match(r"^[\w.\-\[\]:]+:\d+$", address):
                raise ValueError(f"{address}: neither a Dask scheduler address nor a scheduler file. {SCHEDULER_HELP}")
            try:
                client = distributed.Client(**where, timeout=connect_timeout, set_as_default=False)
            except (OSError, TimeoutError, ValueError) as exc:
                raise ValueError(f"{address}: cannot reach the Dask scheduler ({_first_line(exc)})") from None
            stack.enter_context(client)
            _wait_for_workers(client, address, wait_for_workers)
        yield client


def _quiet_workers(client) -> None:
    """Before a local cluster this process started is stopped: its workers log no error for a heartbeat
    cut by that stop (distributed logs one, with a traceback, when the scheduler closes while a
    worker's heartbeat is on its way: a user stopping ``serve --scheduler local`` would read it as
    a failure). Errors of the work itself have been reported through the client by then."""
    try:
        client.run(_silence_heartbeat_errors, wait=True)
    except Exception:  # noqa: BLE001,S110 - the cluster is being stopped either way; a worker already gone says nothing
        pass


def _silence_heartbeat_errors() -> None:
    """(Runs on a worker.)"""
    import logging

    logging.getLogger("distributed.worker").setLevel(logging.CRITICAL)


def _cores() -> int:
    """Cores this process may run on (a SLURM allocation's, not the node's)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _is_scheduler_file(address: str) -> bool:
    return "://" not in address and (os.path.isfile(address) or address.endswith(".json"))


def _wait_for_workers(client, address: str, timeout: float) -> None:
    if client.scheduler_info().get("workers"):
        return
    try:
        client.wait_for_workers(1, timeout=timeout)
    except (TimeoutError, OSError) as exc:
        raise ValueError(f"{address}: no Dask worker joined the scheduler within {timeout:g} s ({_first_line(exc)})") from None


def _first_line(exc: BaseException) -> str:
    text = (str(exc).strip().splitlines() or [""])[0][:300]
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _worker_facts() -> dict:
    """What the client must know of a worker process (runs there)."""
    return {"version": __version__, "cwd": os.getcwd()}


def check_workers(client) -> bool:
    """Check the workers run this overlapviz; True when each one's working directory is this
    process's (relative paths then mean the same files there)."""
    _wait_for_workers(client, str(client.scheduler.address), WAIT_FOR_WORKERS_S)
    try:
        facts = client.run(_worker_facts)
    except Exception as exc:  # noqa: BLE001 - a worker without overlapviz cannot unpickle the call
        raise ValueError(f"the Dask workers cannot run overlapviz ({_first_line(exc)}): install it where they run") from None
    for where, f in sorted(facts.items()):
        if f["version"] != __version__:
            raise ValueError(f"Dask worker {where} runs overlapviz {f['version']}, this process {__version__}: "
                             "install the same version on the workers")  # fmt: skip
    return all(f["cwd"] == os.getcwd() for f in facts.values())


# --- tasks in order ---------------------------------------------------------------------------


def task_progress(total: int, enabled: bool | None, desc: str):
    """A progress bar of ``total`` tasks named ``desc`` (``pool.progress_bar``; None: when stderr is a terminal)."""
    from overlapviz.ingest import pool

    enabled = sys.stderr.isatty() if enabled is None else enabled
    bar = pool.progress_bar(total, enabled)
    if enabled and hasattr(bar, "set_description"):
        bar.set_description(desc, refresh=False)
    return bar


def in_order(client, futures: list, bar, what, stops=lambda value: False) -> Iterator[tuple[int, object]]:
    """``(i, result)`` of each future in submission order, fed by the cluster's task progress
    (``distributed.as_completed``; each completion moves ``bar``).

    The first task in order that failed raises the one-line error of ``_task_error`` (named
    by ``what(i)``); the tasks after a failed one, or after one whose result ``stops``, are
    cancelled (the local path reads nothing after a bad file either), as are all unfinished
    ones when the caller stops early. Results are fetched as tasks finish and held until
    their turn; a future is dropped as soon as its result is here.
    """
    from distributed import as_completed

    pending = dict(enumerate(futures))
    if not pending:
        return
    index = {f.key: i for i, f in pending.items()}
    done: dict[int, tuple[str, object]] = {}
    first_stop = None
    nxt = 0
    try:
        completions = as_completed(futures, with_results=True, raise_errors=False, loop=client.loop)
        del futures  # only `pending` holds them
        for fut, value in completions:
            i = index[fut.key]
            bar.update(1)
            done[i] = (fut.status, value)
            pending.pop(i, None)
            if (fut.status != "finished" or stops(value)) and (first_stop is None or i < first_stop):
                first_stop = i
                client.cancel([f for j, f in pending.items() if j > i])
            while nxt in done:
                status, value = done.pop(nxt)
                if status != "finished":
                    raise _task_error(status, value, what(nxt))
                yield nxt, value
                nxt += 1
            if nxt == len(index):
                return
        # the stream ended with a task before the end neither finished nor failed: never commit a part
        raise ValueError(f"{what(nxt)}: its Dask task never completed (the scheduler lost it)")
    finally:
        if pending:
            client.cancel(list(pending.values()))


def gather_in_order(client, submit: Callable[[], list], *, progress: bool | None, desc: str,
                    what: Callable[[int], str]) -> list:  # fmt: skip
    """The results of the futures ``submit()`` returns, in their order, with a progress bar moved as they finish.

    ``submit`` puts the call's tasks on the cluster and returns the futures whose results the
    client wants; only this function holds them, so each is released as soon as its result is
    here (``in_order``: the first failed task in order raises its one line, naming ``what(i)``).
    """
    futures = submit()
    bar = task_progress(len(futures), progress, desc)
    try:
        with contextlib.closing(in_order(client, futures, bar, what)) as got:
            del futures
            return [value for _, value in got]
    finally:
        bar.close()


def _task_error(status: str, exc, what: str) -> ValueError:
    """A failed task's error as the one line the local path raises (its ValueError as it is)."""
    if isinstance(exc, tuple) and len(exc) == 3:  # as_completed(with_results=True) hands (type, value, traceback)
        exc = exc[1]
    if status == "cancelled" or not isinstance(exc, BaseException):
        return ValueError(f"{what}: its Dask task was cancelled (the scheduler or this client lost it)")
    if isinstance(exc, ValueError):
        return ValueError(str(exc))
    from distributed import KilledWorker

    if isinstance(exc, KilledWorker):
        return ValueError(f"{what}: the Dask workers running it died, every time it was tried (out of memory, or "
                          "killed); see the workers' logs")  # fmt: skip
    return ValueError(f"{what}: failed on the Dask cluster ({_first_line(exc)})")


def task_key(prefix: str) -> str:
    """A Dask key no other call shares: ``prefix`` and a random suffix."""
    return f"{prefix}-{uuid.uuid4().hex[:12]}"
