"""How the collector starts Python processes, so that the installed ``overlapviz`` is the one imported.

``python -m overlapviz.collectors.run`` puts the current directory first on ``sys.path``.
Started from the root of a clone, that directory's own ``overlapviz/`` (which has no
``collectors``: they live in ``collectors/`` and are installed as
``overlapviz.collectors``) then shadows the installed package and every rank fails with
``No module named 'overlapviz.collectors'``. Every process the collector starts
therefore runs with Python's safe-path mode: ``-P`` where we start Python ourselves, and
``PYTHONSAFEPATH=1`` in the environment, which torchrun, srun and any launcher prefix
pass on to the Python processes they start (Python >= 3.11).
"""

from __future__ import annotations

import os
import sys

SAFE_PATH_ENV = "PYTHONSAFEPATH"
MAX_CONNECTIONS_ENV = "CUDA_DEVICE_MAX_CONNECTIONS"


def python_command() -> list[str]:
    """This interpreter in safe-path mode: ``[sys.executable, "-P"]``."""
    return [sys.executable, "-P"]


def child_env(base: dict | None = None, *, max_connections: int | None = None) -> dict:
    """The environment of a child the collector starts.

    ``base`` (default ``os.environ``) with ``PYTHONSAFEPATH=1``, unbuffered output, and
    ``CUDA_DEVICE_MAX_CONNECTIONS`` when a configuration asks for it (read by the CUDA
    driver when a process creates its context, so it must be set before the child starts).
    """
    env = dict(os.environ if base is None else base)
    env[SAFE_PATH_ENV] = "1"
    env.setdefault("PYTHONUNBUFFERED", "1")
    if max_connections is not None:
        env[MAX_CONNECTIONS_ENV] = str(max_connections)
    return env
