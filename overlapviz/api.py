"""The notebook API: ``overlapviz.open(path)`` gives a dataset's tables and figures, a dataset or raw traces alike.

    >>> import overlapviz
    >>> ds = overlapviz.open("traces/")          # raw traces: read once into the cache
    >>> ds.findings()                            # where communication time went, what would win it back
    >>> ds.breakdown()                           # exposed communication per rank: peer wait, dependent, ...
    >>> ds.analyze()                             # overlap per run x rank (pandas)
    >>> ds.explain(summary=True)                 # why collectives started late, per rank
    >>> ds.timeline(run=ds.runs[0])              # a HoloViews figure; shows in Jupyter as is

Every table method is the library function the CLI command of the same name prints
(``overlapviz analyze``, ``explain``, ``residency``, ``compare``); figures are the dashboard's
builders. In a notebook, the first figure loads HoloViews' Bokeh extension with BokehJS
inline (nothing from the network), so no ``hv.extension`` call is needed.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["Dataset", "open"]


def open(path: str | os.PathLike, *, cache: str | os.PathLike | None = None) -> Dataset:  # noqa: A001 (as tarfile.open)
    """The dataset at ``path``, or the dataset of the raw traces at ``path`` (ingested into
    ``cache``, default ``overlapviz.ingest.samples.cache_dir()``, once per content).

    Raises
    ------
    ValueError
        One line naming the path and the problem.
    """
    from overlapviz.ingest import samples

    p = Path(path)
    if not p.exists():
        raise ValueError(f"{p}: no such file or directory")
    if p.is_dir() and samples.is_dataset(p):
        return Dataset(p)
    return Dataset(samples.cached_dataset([p], cache=cache), source=p)


class Dataset:
    """One overlapviz dataset: its tables (pandas) and figures (HoloViews)."""

    def __init__(self, path: str | os.PathLike, *, source: str | os.PathLike | None = None):
        from overlapviz.dataset import schema

        self.path = Path(path)
        self.source = None if source is None else Path(source)
        self.metadata = schema.read_metadata(self.path)

    def __repr__(self) -> str:
        where = f" (from {self.source})" if self.source else ""
        return f"<overlapviz.Dataset {self.path}{where}: {len(self.runs)} run(s)>"

    # --- tables ------------------------------------------------------------------------------

    def table(self, name: str):
        """A dataset table by name: ``kernels``, ``runs``, ``ranks``, ``devices``, ``steps``, ``iterations``, ``syncs``."""
        from overlapviz.dataset import schema

        return schema.read_frame(self.path, name)

    @property
    def runs(self) -> list[str]:
        return self.table("runs")["run_id"].tolist()

    def analyze(self, *, per: str = "rank", run: str | list[str] | None = None):
        """Overlap metrics per run x rank (or step): what ``overlapviz analyze`` prints."""
        from overlapviz.analysis.metrics import analyze

        return analyze(self.path, per=per, run_ids=_runs(run))

    def findings(self, *, run: str | list[str] | None = None, device: str | None = None):
        """The findings of each run, largest first: what ``overlapviz explain --findings`` prints (docs/explain.md)."""
        from overlapviz.analysis.findings import findings

        return findings(self.path, run_ids=_runs(run), device=device)

    def breakdown(self, *, per: str = "rank", run: str | list[str] | None = None):
        """Exposed communication per run x rank (or step) split into peer wait, dependent, host idle and other
        (int64 ns): what ``overlapviz explain --breakdown`` prints."""
        from overlapviz.analysis.breakdown import breakdown

        return breakdown(self.path, run_ids=_runs(run), per=per)

    def explain(self, *, run: str | list[str] | None = None, summary: bool = False, instances: bool = False,
                all_kernels: bool = False):  # fmt: skip
        """Why each collective started late: what ``overlapviz explain`` prints (docs/explain.md)."""
        from overlapviz.analysis import explain, peers

        kinds = ("comm", "compute", "memory", "other") if all_kernels else ("comm",)
        records = explain.explain(self.path, run_ids=_runs(run), kinds=kinds)
        if summary:
            return explain.summarize(records)
        if instances:
            return peers.collective_instances(records)
        return records

    def residency(self, *, run: str | list[str] | None = None):
        """Resident blocks per SM of every kernel launch shape: what ``overlapviz residency`` prints."""
        from overlapviz.analysis.residency import kernel_residency

        return kernel_residency(self.path, run_ids=_runs(run))

    def compare(self, run_a: str | None = None, run_b: str | None = None):
        """Two runs side by side (with both), else every configuration: what ``overlapviz compare`` prints."""
        from overlapviz.analysis import speedup

        if run_a is None and run_b is None:
            return speedup.config_table(self.path)
        if run_a is None or run_b is None:
            raise ValueError("compare takes two runs, or none for the whole table")
        return speedup.compare(self.path, run_a, run_b)

    # --- figures -----------------------------------------------------------------------------

    def figure(self, name: str, **selection):
        """The figure ``overlapviz export --figure NAME`` writes (timeline, heatmap, speedup, compare,
        residency, ranks), as a HoloViews object; ``selection`` as ``overlapviz.export.render.build_figure``.

        Raises
        ------
        ImportError
            HoloViews, Bokeh or Panel not installed: one line naming them and ``pip install 'overlapviz[dashboard]'``.
        """
        from overlapviz._extras import DASHBOARD, require

        require("overlapviz figures", DASHBOARD)
        _notebook_extension()
        from overlapviz.export.render import build_figure

        return build_figure(self.path, name, **selection)

    def timeline(self, run: str | None = None, **selection):
        return self.figure("timeline", runs=None if run is None else [run], **selection)

    def heatmap(self, **selection):
        return self.figure("heatmap", **selection)

    def ranks(self, run: str | None = None):
        return self.figure("ranks", runs=None if run is None else [run])

    def perfetto(self, out: str | os.PathLike, run: str | None = None) -> Path:
        """Write the run as a Perfetto trace with the findings (``overlapviz export --format perfetto``)."""
        from overlapviz.export.perfetto import write_perfetto

        return write_perfetto(self.path, run or self.runs[0], out)


def _runs(run) -> list[str] | None:
    if run is None:
        return None
    return [run] if isinstance(run, str) else list(run)


def _notebook_extension() -> None:
    """Load HoloViews' Bokeh extension (BokehJS inline, offline) once, inside an IPython kernel only."""
    global _LOADED
    if _LOADED:
        return
    try:
        from IPython import get_ipython
    except ImportError:
        return
    shell = get_ipython()
    if shell is None or not hasattr(shell, "kernel"):
        return
    import holoviews as hv

    hv.extension("bokeh", logo=False, inline=True)
    _LOADED = True


_LOADED = False
