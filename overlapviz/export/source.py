"""The tables an export draws, read and computed straight from a dataset (the CLI's path; the dashboard passes its store)."""

from __future__ import annotations

import functools
import os

import pandas as pd

from overlapviz.figures import timeline as figures_timeline
from overlapviz.dataset import computed, schema
from overlapviz.analysis import budget, explain, peers
from overlapviz.analysis.metrics import analyze
from overlapviz.analysis.residency import by_rank, kernel_residency
from overlapviz.analysis.speedup import compare as compare_runs
from overlapviz.analysis.speedup import config_table

__all__ = ["DatasetSource", "TABLE_CODE"]

# what the kept tables are computed by: the analysis and what it reads, and this module (which analysis it calls how)
TABLE_CODE = (*computed.TABLE_CODE, "export")


class DatasetSource:
    """The tables ``build_figure`` draws, read and computed straight from a dataset (the CLI's path).

    Each table is computed once per process, and kept on disk for the next command (``overlapviz.dataset.computed``:
    under the overlapviz cache, keyed by the dataset's stamp, the code and ``device``; ``OVERLAPVIZ_TABLE_CACHE=0``
    keeps them in memory only): a second export of the same dataset computes no findings, breakdown, explain,
    residency or configuration table again, and a dataset written again is computed anew. A table covers what the
    figure draws (one run's explain, residency, metrics), not the whole dataset, where the analysis can say less.

    The dashboard passes its ``DataStore`` instead, which offers the same methods from its per-dataset cache, so an
    export from a page recomputes nothing. Every method raises ValueError (naming what is missing) when it cannot
    answer; that answer is kept as well (it is the dataset's).
    """

    def __init__(self, dataset: str, device: str | None = None):
        self.path = str(dataset)
        self.device = device  # the GPU for ranks whose trace does not say (``residency.device_table``)
        self._memo: dict = {}

    def _once(self, key, compute):
        if key not in self._memo:
            self._memo[key] = compute()
        return self._memo[key]

    def _kept(self, key: tuple, compute):
        """``compute()`` once per process, and once per dataset state and code across commands (the table cache)."""
        if key not in self._memo:

            def table():
                try:
                    return ("table", compute())
                except ValueError as exc:  # the dataset lacks what the table needs: so does the next command's
                    return ("unavailable", str(exc))

            stamp = self._stamp
            self._memo[key] = table() if stamp is None else computed.on_disk(
                os.path.realpath(self.path), stamp, repr(("export", key, self.device)), table,
                code=computed.code_stamp(TABLE_CODE), valid=_kept_value)  # fmt: skip
        return self._memo[key]

    def _table(self, key: tuple, compute):
        kind, value = self._kept(key, compute)
        if kind == "unavailable":
            raise ValueError(value)
        return value

    @functools.cached_property
    def _stamp(self) -> str | None:
        """The dataset's state (``computed.dataset_stamp``); None where nothing is kept (the cache turned off, or not a
        dataset: the reader says so)."""
        if not computed.enabled():
            return None
        try:
            return computed.dataset_stamp(self.path)
        except OSError:
            return None

    def runs(self):
        return self._once("runs", lambda: schema.read_frame(self.path, "runs"))

    def is_stand_in(self, run_id: str) -> bool:
        r = self.runs()
        return bool(r.loc[r["run_id"] == run_id, "stand_in"].fillna(False).astype(bool).any())

    def steps(self, run_id: str):
        s = self._once("steps", lambda: schema.read_frame(self.path, "steps"))
        return s.loc[s["run_id"] == run_id]

    def devices(self, run_id: str):
        d = self._once("devices", lambda: schema.read_frame(self.path, "devices"))
        return d.loc[d["run_id"] == run_id]

    def config_table(self):
        return self._table(("config_table",), lambda: config_table(self.path))

    def compare(self, a: str, b: str):
        return self._table(("compare", a, b), lambda: compare_runs(self.path, a, b, table=self.config_table()))

    def metrics(self, run_ids=None):
        key = ("metrics", None if run_ids is None else tuple(run_ids))
        return self._table(key, lambda: analyze(self.path, run_ids=None if run_ids is None else list(run_ids)))

    def run_metrics(self, run_id: str):
        """``metrics`` (per rank) of one run: the ranks figure's, without every other run's kernels."""
        return self.metrics([run_id])

    def kernel_residency(self):
        return self._table(("residency",), lambda: kernel_residency(self.path, device=self.device))

    def run_residency(self, run_id: str):
        """``kernel_residency`` rows of one run (as the dashboard store's), computed from that run's kernels alone."""
        return self._table(("residency", run_id), lambda: kernel_residency(self.path, run_ids=[run_id], device=self.device))

    def explained(self, run_id: str):
        return self._table(("explain", run_id), lambda: explain.explain(self.path, run_ids=[run_id], device=self.device))

    def summary(self, run_id: str):
        return explain.summarize(self.explained(run_id))

    def blockers(self, run_id: str):
        return budget.blocker_table(self.explained(run_id))

    def instances(self, run_id: str):
        return self._table(("instances", run_id), lambda: peers.collective_instances(
            self.explained(run_id), budget.message_bytes(self.explained(run_id), self.runs())))  # fmt: skip

    def instance_cells(self, run_id: str):
        return budget.instance_ranks(self.explained(run_id), self.instances(run_id))

    def breakdown(self, run_id: str):
        try:
            from overlapviz.analysis.breakdown import breakdown
        except ImportError:
            raise ValueError(f"{self.path}: the breakdown figure needs overlapviz.analysis.breakdown, not in this version") from None
        return self._table(("breakdown", run_id), lambda: breakdown(self.path, run_ids=[run_id]))

    def findings(self, run_id: str):
        try:
            from overlapviz.analysis.findings import findings
        except ImportError:
            return None  # the figure goes without its subtitle
        return self._table(("findings", run_id), lambda: findings(self.path, run_ids=[run_id], device=self.device,
                                                                  explained=self.explained(run_id)))  # fmt: skip

    def budget(self, record: dict, what_if: dict | None = None):
        return budget.kernel_budget(self.path, record, what_if=what_if, device=self.device)

    def timeline(self, run_id: str, ranks=None, *, hover: bool = True) -> figures_timeline.TimelineData:
        """The run's ``TimelineData``; ``hover=False`` (a static file: nothing to hover) leaves out the kernels'
        residency, which only the hover shows (2.8 of a 1M-kernel timeline export's 9 s)."""
        import pyarrow.compute as pc

        filt = pc.field("rank").isin([int(r) for r in ranks]) if ranks else None
        kernels = schema.read_kernels(self.path, columns=figures_timeline.TIMELINE_COLUMNS + ["launch_ns"], run_ids=[run_id],
                                      filter=filt).to_pandas()  # fmt: skip
        if not len(kernels):
            raise ValueError(f"{self.path}: run {run_id!r} has no kernels" + (f" on ranks {list(ranks)}" if ranks else ""))
        residency = None
        if hover:
            try:
                residency = by_rank(self.kernel_residency(), self.path, self.device)
            except ValueError:  # the hover's residency is optional: a timeline without it beats no timeline
                pass
        try:
            why = self.explained(run_id)
            if ranks:
                why = why.loc[why["rank"].isin([int(r) for r in ranks])]
            why = pd.concat([why, budget.blocker_positions(why, kernels)], axis=1)
            waits = budget.wait_segments(why)
        except ValueError:
            why = waits = None
        return figures_timeline.TimelineData(kernels, residency=residency, why=why, waits=waits)


def _kept_value(value) -> bool:
    """What ``DatasetSource._kept`` writes: ``("table", value)`` or ``("unavailable", why)``."""
    return isinstance(value, tuple) and len(value) == 2 and value[0] in ("table", "unavailable")
