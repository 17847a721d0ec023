"""The optional extras of pyproject.toml that commands check for, and the one line that says how to install one."""

from __future__ import annotations

import importlib.util

__all__ = ["DASHBOARD", "MissingExtra", "require"]

# `pip install 'overlapviz[dashboard]'`: the Panel server and the drawn figures (HoloViews imports Panel too;
# PNG, SVG and PDF are drawn by the system's chromium over its DevTools pipe, no Python package). The trace tool
# (ingest, analyze, explain, advise, compare, residency, the Perfetto export) imports none of them
DASHBOARD = ("holoviews", "bokeh", "panel")


class MissingExtra(ImportError):
    """An extra's packages are not installed; the message is one line naming them and the install command."""


def require(what: str, modules: tuple[str, ...] = DASHBOARD, extra: str = "dashboard", after: str = "") -> None:
    """Nothing when ``modules`` are all importable (none is imported), else ``MissingExtra``: "WHAT needs the
    'EXTRA' extra (M, N not installed): pip install 'overlapviz[EXTRA]'AFTER" (the CLI prints it as its error)."""
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        raise MissingExtra(f"{what} needs the '{extra}' extra ({', '.join(missing)} not installed): "
                           f"pip install 'overlapviz[{extra}]'{after}")
