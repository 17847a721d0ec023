"""Per-rank readings of the overlap metrics: ranks whose GPU span is longer than the run's median, and two runs' means over ranks side by side.

A long span is not a straggler: a straggler is the rank that started a collective instance last
(:mod:`overlapviz.analysis.findings`); the ranks that waited for it have the longest spans.
"""

from __future__ import annotations

import pandas as pd

__all__ = ["long_span_ranks", "metric_deltas"]


def long_span_ranks(metrics: pd.DataFrame, *, tolerance: float = 0.05) -> pd.Series:
    """Boolean per row: the rank's span exceeds its run's median span by more than ``tolerance``."""
    span = pd.to_numeric(metrics["span_us"], errors="coerce")
    median = span.groupby(metrics["run_id"]).transform("median")
    return (span > median * (1 + tolerance)).fillna(False)


def metric_deltas(metrics: pd.DataFrame, run_a: str, run_b: str) -> pd.DataFrame:
    """Mean over ranks of each per-rank metric of two runs side by side, and B − A.

    Parameters
    ----------
    metrics
        ``overlapviz.analysis.metrics.analyze`` rows (per rank). Not modified.
    """
    cols = ["comm_us", "compute_us", "overlap_us", "overlap_fraction", "exposed_comm_us", "span_us", "idle_us"]
    cols = [c for c in cols if c in metrics]
    mean = metrics.loc[metrics["run_id"].isin([run_a, run_b])].groupby("run_id")[cols].mean()
    if run_a not in mean.index or run_b not in mean.index:
        return pd.DataFrame()
    a, b = mean.loc[run_a], mean.loc[run_b]
    return pd.DataFrame({"metric (mean over ranks)": cols, "A": a.to_numpy().round(3), "B": b.to_numpy().round(3),
                         "B − A": (b - a).to_numpy().round(3)})  # fmt: skip
