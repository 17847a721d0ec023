"""A process's lifetime: children that die with their parent (Linux's ``prctl(PR_SET_PDEATHSIG)``, for the ingest
pool's forked readers and every process ``overlapviz collect`` starts: a parent killed with SIGKILL leaves none
behind), and every signal handler of the package: signals held back while such children start
(``signals_deferred``), SIGTERM and SIGHUP unwinding as Ctrl-C (``signals_interrupt``: ingest, the sweep),
SIGTERM stopping a server (``signals_call``: the dashboard)."""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import sys
import threading

__all__ = ["die_with_parent", "load", "signals_call", "signals_deferred", "signals_interrupt"]

# the signals that end a job: Ctrl-C, a scheduler's kill or time limit, a closed terminal
_ENDING = tuple(s for s in (signal.SIGINT, signal.SIGTERM, getattr(signal, "SIGHUP", None)) if s is not None)

_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def die_with_parent(sig: int = signal.SIGKILL, parent: int | None = None) -> bool:
    """Have the kernel send ``sig`` to this process when its parent dies.

    Call it in the child (a pool's initializer, a ``Popen`` preexec_fn, a rank's start). ``parent``:
    the parent's pid as the parent knew it; if the child already has another parent (the parent died
    before this ran, too early for the kernel to tell), ``sig`` is sent now. The kernel sends it when
    the *thread* that forked the child ends, so fork from a thread that lives as long as the parent
    (the main thread). Returns False where it cannot be set (not Linux): the child then outlives a
    killed parent.
    """
    libc = _libc()
    if libc is None or libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        return False
    if parent is not None and os.getppid() != parent:
        os.kill(os.getpid(), sig)
    return True


def load() -> bool:
    """Load the C library in the parent, so a forked child or a preexec_fn only calls it; whether it is there."""
    return _libc() is not None


@functools.lru_cache(maxsize=1)
def _libc():
    """The C library's functions of this process (Linux: glibc or musl), None elsewhere."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    try:
        libc = ctypes.CDLL(None)
    except OSError:
        return None
    return libc if hasattr(libc, "prctl") else None


@contextlib.contextmanager
def _handled(signums: tuple[int, ...], handler, in_child: str):
    """Within the block, ``handler(signum, frame)`` receives ``signums`` in this process; the handlers
    they had are put back at its end. A child forked inside inherits the handler: there a signal
    goes to the handler it replaced (``in_child="previous"``) or to the default action
    (``"default"``: a forked reader ends), and is sent again. A handler not set from Python (which
    could not be put back) is left as it is; outside the main thread, where Python delivers no
    signal, nothing is set."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    owner = os.getpid()

    def dispatch(signum, frame):
        if os.getpid() != owner:  # a child forked inside: the handler it would have had
            signal.signal(signum, saved[signum] if in_child == "previous" else signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        handler(signum, frame)

    saved = {}
    for sig in signums:
        previous = signal.getsignal(sig)
        if previous is None:
            continue
        try:
            signal.signal(sig, dispatch)
        except (ValueError, OSError):
            continue
        saved[sig] = previous
    try:
        yield
    finally:
        for sig, previous in saved.items():
            signal.signal(sig, previous)


@contextlib.contextmanager
def signals_deferred(signums: tuple[int, ...] = _ENDING):
    """Act on SIGINT, SIGTERM and SIGHUP only when the block ends: for a step that must not be cut
    in two, such as forking a pool's workers and starting the thread that manages them.

    Cut there (a ``KeyboardInterrupt`` raised between a fork and that thread's start), a pool has
    a worker no shutdown reaches, forked after a signal to the job's process group and so never
    told, and the interpreter's exit waits for it for ever. Inside the block a signal is only
    noted; at its end each one noted is raised again, to the handlers that were there before.
    A child forked inside inherits the note-taker: there a signal goes to the handler it replaced,
    as in a child forked outside (ignored if it was ignored, a forked reader's end otherwise).
    Outside the main thread, where Python delivers no signal, it does nothing.
    """
    noted: list[int] = []
    try:
        with _handled(signums, lambda signum, frame: noted.append(signum), in_child="previous"):
            yield
    finally:  # the handlers that were there before, then the signals noted
        for sig in dict.fromkeys(noted):
            signal.raise_signal(sig)


@contextlib.contextmanager
def signals_interrupt(signums: tuple[int, ...] = _ENDING, *, once: bool = False):
    """Within the block, ``signums`` (SIGINT, SIGTERM and SIGHUP) raise ``KeyboardInterrupt`` as Ctrl-C
    does: a job killed by its scheduler, a closed terminal or ``timeout`` unwinds through the
    ``finally`` blocks that remove temporary files or stop child processes. Only SIGKILL skips them.

    ``once``: only the first signal interrupts. Python swallows an interrupt that lands in a
    finalizer and prints its traceback ("Exception ignored in ..."): after a signal that one is not
    printed, and the work goes on to its end; a second signal ends the process at once (its
    default action). A child forked inside ends by the signal (its default action).
    Outside the main thread it does nothing.
    """
    hit: list[int] = []

    def interrupt(signum, frame):
        if once and hit:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        hit.append(signum)
        raise KeyboardInterrupt(f"signal {signum}")

    def unraisable(info, previous=sys.unraisablehook):
        if not (isinstance(info.exc_value, KeyboardInterrupt) and hit):
            previous(info)

    with _handled(signums, interrupt, in_child="default"):
        if not once:
            yield
            return
        saved_hook, sys.unraisablehook = sys.unraisablehook, unraisable
        try:
            yield
        finally:
            sys.unraisablehook = saved_hook


@contextlib.contextmanager
def signals_call(action, signums: tuple[int, ...] = (signal.SIGTERM,)):
    """Within the block, ``signums`` (SIGTERM) call ``action()`` instead of their handlers: a server
    stops its loop there, so that a batch job's end removes its files as Ctrl-C does. A child
    forked inside ends by the signal. Outside the main thread it does nothing."""
    with _handled(signums, lambda signum, frame: action(), in_child="default"):
        yield
