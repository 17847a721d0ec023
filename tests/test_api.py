"""The notebook API: overlapviz.open on a dataset or raw traces gives what the CLI commands print."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

import overlapviz
from overlapviz.analysis.explain import explain
from overlapviz.analysis.metrics import analyze
from overlapviz.ingest import ingest

TRACES = Path(__file__).parent / "data" / "hta_trace_filter_2rank"


def test_open_raw_traces_and_dataset_alike(tmp_path, monkeypatch):
    monkeypatch.setenv("OVERLAPVIZ_CACHE_DIR", str(tmp_path / "cache"))
    ds_path = ingest([TRACES], tmp_path / "ds", progress=False)
    raw, ds = overlapviz.open(TRACES), overlapviz.open(ds_path)
    assert raw.source == TRACES and raw.path.parent == tmp_path / "cache" and ds.path == ds_path
    pd.testing.assert_frame_equal(raw.analyze(), analyze(ds_path))
    pd.testing.assert_frame_equal(ds.explain(), explain(ds_path))
    assert list(ds.explain(summary=True)["rank"]) == [0, 1]
    assert raw.runs == ["hta_trace_filter_2rank"] and repr(ds).endswith(": 1 run(s)>")
    assert len(ds.table("kernels")) == len(raw.table("kernels"))
    with pytest.raises(ValueError, match="no such file"):
        overlapviz.open(tmp_path / "nope")
    with pytest.raises(ValueError, match="two runs"):
        ds.compare("a")


def test_figures_and_perfetto_from_the_api(tmp_path):
    import holoviews as hv

    ds = overlapviz.open(ingest([TRACES], tmp_path / "ds", progress=False))
    assert isinstance(ds.ranks(), hv.core.dimension.ViewableElement) or isinstance(ds.ranks(), hv.Layout)
    out = ds.perfetto(tmp_path / "t.json")
    assert out.exists() and out.stat().st_size > 0
