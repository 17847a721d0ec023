"""The tables an export draws, read and computed straight from a dataset (the CLI's path; the dashboard passes its store)."""

from __future__ import annotations

import pandas as pd
import pyarrow.compute as pc

from overlapviz.figures import timeline as figures_timeline
from overlapviz.dataset import schema
from overlapviz.analysis import budget, explain, peers
from overlapviz.analysis.metrics import analyze
from overlapviz.analysis.residency import by_rank, kernel_residency
from overlapviz.analysis.speedup import compare as compare_runs
from overlapviz.analysis.speedup import config_table

__all__ = ["DatasetSource"]


class DatasetSource:
    """The tables ``build_figure`` draws, read and computed straight from a dataset (the CLI's path).

    The dashboard passes its ``DataStore`` instead, which offers the same methods from its
    per-dataset cache, so an export from a page recomputes nothing. Every method raises
    ValueError (naming what is missing) when it cannot answer.
    """

    def __init__(self, dataset: str, device: str | None = None):
        self.path = str(dataset)
        self.device = device  # the GPU for ranks whose trace does not say (``residency.device_table``)
        self._memo: dict = {}

    def _once(self, key, compute):
        if key not in self._memo:
            self._memo[key] = compute()
        return self._memo[key]

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
        return self._once("config", lambda: config_table(self.path))

    def compare(self, a: str, b: str):
        return compare_runs(self.path, a, b)

    def metrics(self, run_ids=None):
        return analyze(self.path, run_ids=run_ids)

    def kernel_residency(self):
        return self._once("residency", lambda: kernel_residency(self.path, device=self.device))

    def explained(self, run_id: str):
        return self._once(("explain", run_id), lambda: explain.explain(self.path, run_ids=[run_id], device=self.device))

    def summary(self, run_id: str):
        return explain.summarize(self.explained(run_id))

    def blockers(self, run_id: str):
        return budget.blocker_table(self.explained(run_id))

    def instances(self, run_id: str):
        e = self.explained(run_id)
        return self._once(("instances", run_id), lambda: peers.collective_instances(e, budget.message_bytes(e, self.runs())))

    def instance_cells(self, run_id: str):
        return budget.instance_ranks(self.explained(run_id), self.instances(run_id))

    def breakdown(self, run_id: str):
        try:
            from overlapviz.analysis.breakdown import breakdown
        except ImportError:
            raise ValueError(f"{self.path}: the breakdown figure needs overlapviz.analysis.breakdown, not in this version") from None
        return self._once(("breakdown", run_id), lambda: breakdown(self.path, run_ids=[run_id]))

    def findings(self, run_id: str):
        try:
            from overlapviz.analysis.findings import findings
        except ImportError:
            return None  # the figure goes without its subtitle
        return self._once(("findings", run_id), lambda: findings(self.path, run_ids=[run_id], device=self.device))

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
