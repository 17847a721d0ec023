"""Child processes that die with their parent: Linux's ``prctl(PR_SET_PDEATHSIG)``, for the ingest pool's
forked readers and every process ``overlapviz collect`` starts (a parent killed with SIGKILL leaves none behind);
and signals held back while such children are started (``signals_deferred``)."""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import sys
import threading

__all__ = ["die_with_parent", "load", "signals_deferred"]

_DEFERRED = tuple(s for s in (signal.SIGINT, signal.SIGTERM, getattr(signal, "SIGHUP", None)) if s is not None)

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
def signals_deferred(signums: tuple[int, ...] = _DEFERRED):
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
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    owner = os.getpid()
    noted: list[int] = []

    def note(signum, frame):
        if os.getpid() != owner:  # a child forked inside: the handler it would have had
            signal.signal(signum, saved[signum])
            os.kill(os.getpid(), signum)
            return
        noted.append(signum)

    saved = {}
    for sig in signums:
        previous = signal.getsignal(sig)
        if previous is None:  # a handler not set from Python could not be put back: left as it is
            continue
        try:
            signal.signal(sig, note)
        except (ValueError, OSError):
            continue
        saved[sig] = previous
    try:
        yield
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
        for sig in dict.fromkeys(noted):
            signal.raise_signal(sig)
