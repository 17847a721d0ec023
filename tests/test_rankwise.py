"""The local analyses hold one rank's kernels at a time (issue 36): they read the dataset file by file, never the
whole kernels table, and give what reading it whole gives."""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest

from overlapviz.analysis import breakdown, explain, findings, metrics, rankwise
from overlapviz.dataset import schema
from overlapviz.ingest import driver
from overlapviz.testing import generate_trace, write_trace

DLRM = Path(__file__).parent / "data" / "kineto_real" / "param_dlrm_8rank"


@pytest.fixture(scope="module")
def dlrm(tmp_path_factory) -> Path:
    return driver.ingest([DLRM], tmp_path_factory.mktemp("rankwise") / "dlrm", progress=False)


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory) -> Path:
    """Two runs of three ranks each (runs named so that their order is not the files' order)."""
    root = tmp_path_factory.mktemp("rankwise_runs")
    for run in ("zeta", "alpha"):
        for rank in range(3):
            write_trace(generate_trace(300, rank=rank, world_size=3, seed=rank + 7), root / run / f"rank{rank}.json")
    return driver.ingest([root / "zeta", root / "alpha"], root / "ds", progress=False)


def _wholesale_reads(monkeypatch) -> list:
    """Record every ``schema.read_kernels`` call that reads more than one kernels file of the dataset unfiltered."""
    calls, real = [], schema.read_kernels

    def spy(path, columns=None, **kw):
        if kw.get("filter") is None and len(rankwise.kernel_files(path, kw.get("run_ids"))) > 1:
            calls.append(columns)
        return real(path, columns, **kw)

    monkeypatch.setattr(schema, "read_kernels", spy)
    return calls


@pytest.mark.parametrize("what", ["analyze", "explain", "breakdown", "findings", "timelines"])
def test_no_analysis_reads_every_rank_at_once(dlrm, monkeypatch, what):
    calls = _wholesale_reads(monkeypatch)
    {"analyze": lambda: metrics.analyze_table(dlrm), "explain": lambda: explain.explain(dlrm),
     "breakdown": lambda: breakdown.breakdown(dlrm, per="step"), "findings": lambda: findings.answer(dlrm),
     "timelines": lambda: list(breakdown.rank_timelines(dlrm))}[what]()  # fmt: skip
    assert calls == [], f"{what} read the whole kernels table: columns {calls}"


def test_rank_tables_are_read_kernels_split_per_rank(two_runs):
    whole = schema.read_kernels(two_runs, columns=explain.READ, dictionary=explain.DICTIONARY)
    expected = [(t.column("run_id")[0].as_py(), t.column("rank")[0].as_py(), t) for t in explain.per_rank(whole)]
    got = list(rankwise.rank_tables(two_runs, explain.READ, dictionary=explain.DICTIONARY))
    assert [(r, k) for r, k, *_ in got] == [(r, k) for r, k, _ in expected] == [(r, k) for r in ("alpha", "zeta") for k in range(3)]
    for (_, _, t, _), (_, _, e) in zip(got, expected):
        assert t.cast(e.schema).equals(e) and t.schema == e.schema
    syncs = schema.read_table(two_runs, "syncs")
    assert sum(0 if s is None else s.num_rows for *_, s in got) == syncs.num_rows


def test_results_same_as_whole_reads(two_runs):
    """The analyses of the per-rank reads equal those over the whole table (the two runs, one run)."""
    for run_ids in (None, ["zeta"]):
        table = schema.read_kernels(two_runs, columns=list(metrics.INPUT_COLUMNS), run_ids=run_ids, dictionary=("run_id", "kind"))
        assert metrics.analyze_table(two_runs, run_ids=run_ids).equals(metrics.overlap_table(table))
        tls = list(breakdown.rank_timelines(two_runs, run_ids=run_ids))
        found, totals = findings.answer(two_runs, run_ids=run_ids)
        pd.testing.assert_frame_equal(totals, breakdown.run_totals(tls))
        pd.testing.assert_frame_equal(found, findings.findings(two_runs, run_ids=run_ids, timelines=tls))


def test_a_file_holding_another_rank_is_named(dlrm, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(dlrm, bad)
    files = schema.read_metadata(bad)["kernel_files"]
    shutil.copy(bad / files[0], bad / files[1])  # rank 1's file now holds rank 0's rows
    with pytest.raises(ValueError, match=f"{files[1]}: holds run .* rank 0, not run .* rank 1"):
        explain.explain(bad)
    assert pq.read_table(bad / files[1]).num_rows  # the file is readable: the error is what it holds
