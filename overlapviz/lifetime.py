"""Child processes that die with their parent: Linux's ``prctl(PR_SET_PDEATHSIG)``, for the ingest pool's
forked readers and every process ``overlapviz collect`` starts (a parent killed with SIGKILL leaves none behind)."""

from __future__ import annotations

import functools
import os
import signal
import sys

__all__ = ["die_with_parent", "load"]

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
