"""How the collector starts Python processes, so that the installed ``overlapviz`` is the one imported.

``python -m overlapviz.collectors.run`` puts the current directory first on ``sys.path``.
Started from the root of a clone, that directory's own ``overlapviz/`` (which has no
``collectors``: they live in ``collectors/`` and are installed as
``overlapviz.collectors``) then shadows the installed package and every rank fails with
``No module named 'overlapviz.collectors'``. Every process the collector starts
therefore runs with Python's safe-path mode: ``-P`` where we start Python ourselves, and
``PYTHONSAFEPATH=1`` in the environment, which torchrun, srun and any launcher prefix
pass on to the Python processes they start (Python >= 3.11).

No process the collector starts outlives it: the sweep starts its children with
``PR_SET_PDEATHSIG`` (``sweep._popen``), and every rank and batch process sets it again
for its own parent (``stay_with_parent``), so that a killed torchrun (or one killed while
it was still starting its ranks, before it could stop them) takes its ranks along. Linux
only; elsewhere children may outlive a parent killed with SIGKILL.
"""

from __future__ import annotations

import os
import signal
import sys

from overlapviz.lifetime import die_with_parent

SAFE_PATH_ENV = "PYTHONSAFEPATH"
MAX_CONNECTIONS_ENV = "CUDA_DEVICE_MAX_CONNECTIONS"
SWEEP_PID_ENV = "OVERLAPVIZ_SWEEP_PID"  # the sweep process a locally started rank belongs to


def python_command() -> list[str]:
    """This interpreter in safe-path mode: ``[sys.executable, "-P"]``."""
    return [sys.executable, "-P"]


def child_env(base: dict | None = None, *, max_connections: int | None = None, sweep_pid: int | None = None) -> dict:
    """The environment of a child the collector starts.

    ``base`` (default ``os.environ``) with ``PYTHONSAFEPATH=1``, unbuffered output, and
    ``CUDA_DEVICE_MAX_CONNECTIONS`` when a configuration asks for it (read by the CUDA
    driver when a process creates its context, so it must be set before the child starts).
    ``sweep_pid``: the sweep process, for ranks started on this host (``stay_with_parent``).
    """
    env = dict(os.environ if base is None else base)
    env[SAFE_PATH_ENV] = "1"
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.pop(SWEEP_PID_ENV, None)
    if max_connections is not None:
        env[MAX_CONNECTIONS_ENV] = str(max_connections)
    if sweep_pid is not None:
        env[SWEEP_PID_ENV] = str(sweep_pid)
    return env


def stay_with_parent() -> None:
    """In a rank or a batch process: be killed (SIGKILL) when the process that started it
    (torchrun, srun's step, the sweep) dies. A sweep on this host that is already gone (it
    died while its launcher was still starting this process, and the launcher with it,
    before this could be set) ends this process now."""
    if not die_with_parent(signal.SIGKILL):
        return
    sweep = os.environ.get(SWEEP_PID_ENV, "")
    if sweep.isdigit() and not _running(int(sweep)):
        os.kill(os.getpid(), signal.SIGKILL)


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie (killed, not yet reaped) is gone too
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True
