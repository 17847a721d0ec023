"""``export.source.DatasetSource``: what an export computes, and that the next command reuses it (issue 33).

The figures go out as HTML here (no browser): the tables are the same as for a PNG, SVG or PDF but the timeline's
hover residency.
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import pytest
from click.testing import CliRunner

from overlapviz.cli import main
from overlapviz.dataset import computed
from overlapviz.testing import write_grid_dataset

RUN = "cb-ar-baseline-pad0-prio0"


@pytest.fixture
def dataset(tmp_path, monkeypatch):
    monkeypatch.setenv("OVERLAPVIZ_CACHE_DIR", str(tmp_path / "cache"))  # a table cache of its own
    monkeypatch.delenv(computed.TABLE_CACHE_ENV, raising=False)
    return Path(write_grid_dataset(tmp_path / "ds"))


@pytest.fixture
def calls(monkeypatch):
    """How often each analysis an export draws from ran (in this process: CliRunner runs the command here)."""
    import overlapviz.analysis.breakdown as breakdown_mod
    import overlapviz.analysis.explain as explain_mod
    import overlapviz.analysis.findings as findings_mod
    from overlapviz.export import source

    counted: Counter = Counter()
    kwargs_of: dict = {}

    def counting(name, fn):
        def wrapper(*args, **kwargs):
            counted[name] += 1
            kwargs_of.setdefault(name, []).append(kwargs)
            return fn(*args, **kwargs)

        return wrapper

    monkeypatch.setattr(findings_mod, "findings", counting("findings", findings_mod.findings))
    monkeypatch.setattr(breakdown_mod, "breakdown", counting("breakdown", breakdown_mod.breakdown))
    monkeypatch.setattr(explain_mod, "explain", counting("explain", explain_mod.explain))
    for name in ("config_table", "kernel_residency", "analyze"):
        monkeypatch.setattr(source, name, counting(name, getattr(source, name)))
    counted.kwargs = kwargs_of
    return counted


def export(dataset, tmp_path, figure, *extra):
    out = tmp_path / f"{figure}.html"
    result = CliRunner().invoke(main, ["export", str(dataset), "--figure", figure, "-o", str(out), "--format", "html", *extra])
    assert result.exit_code == 0, result.output
    return out


def test_a_second_export_computes_nothing_again(dataset, tmp_path, calls):
    export(dataset, tmp_path, "breakdown", "--run", RUN)
    assert calls["findings"] == calls["breakdown"] == calls["explain"] == 1
    export(dataset, tmp_path, "breakdown", "--run", RUN)  # the next command: the table cache's
    export(dataset, tmp_path, "why", "--run", RUN)  # the same run's explain
    assert calls["findings"] == calls["breakdown"] == calls["explain"] == 1
    export(dataset, tmp_path, "heatmap")
    export(dataset, tmp_path, "speedup")
    export(dataset, tmp_path, "ranks", "--run", RUN)
    export(dataset, tmp_path, "ranks", "--run", RUN)
    export(dataset, tmp_path, "residency", "--run", RUN)
    export(dataset, tmp_path, "residency", "--run", RUN)
    # findings compute their own configuration table (analysis.findings): the figures' is computed once
    assert calls["config_table"] == 1 and calls["analyze"] == 1 and calls["kernel_residency"] == 1


def test_a_dataset_written_again_is_computed_again(dataset, tmp_path, calls, monkeypatch):
    export(dataset, tmp_path, "breakdown", "--run", RUN)
    export(dataset, tmp_path, "breakdown", "--run", RUN)
    assert calls["findings"] == calls["breakdown"] == 1
    meta = dataset / "dataset.json"
    st = meta.stat()
    os.utime(meta, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    export(dataset, tmp_path, "breakdown", "--run", RUN)
    assert calls["findings"] == calls["breakdown"] == 2
    write_grid_dataset(tmp_path / "ds2")
    os.replace(tmp_path / "ds2" / "dataset.json", meta)  # the same sizes and names, another file
    export(dataset, tmp_path, "breakdown", "--run", RUN)
    export(dataset, tmp_path, "breakdown", "--run", RUN)
    assert calls["findings"] == calls["breakdown"] == 3
    monkeypatch.setenv(computed.TABLE_CACHE_ENV, "0")  # turned off: each command computes, nothing is written
    kept = sorted((tmp_path / "cache").rglob("*"))
    export(dataset, tmp_path, "breakdown", "--run", RUN)
    export(dataset, tmp_path, "breakdown", "--run", RUN)
    assert calls["findings"] == calls["breakdown"] == 5
    assert sorted((tmp_path / "cache").rglob("*")) == kept


def test_an_unavailable_figure_is_one_line_again_from_the_cache(tmp_path, monkeypatch, calls):
    monkeypatch.setenv("OVERLAPVIZ_CACHE_DIR", str(tmp_path / "cache"))

    from overlapviz.ingest import ingest

    root = Path(__file__).resolve().parent.parent / "sample_traces" / "h200_standin_sweep"
    ds = ingest([root], tmp_path / "standin", progress=False)
    for _ in range(2):  # a run of one rank has no collective seen on two ranks: the reason, kept, not a traceback
        result = CliRunner().invoke(main, ["export", str(ds), "--figure", "collectives", "-o", str(tmp_path / "c.html")])
        assert result.exit_code != 0 and "no collective seen on two or more ranks" in result.output
        assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1
    assert calls["explain"] == 1


def test_one_run_s_figure_computes_that_run_only(dataset, tmp_path, calls):
    export(dataset, tmp_path, "residency", "--run", RUN)
    export(dataset, tmp_path, "ranks", "--run", RUN)
    assert [k.get("run_ids") for k in calls.kwargs["kernel_residency"]] == [[RUN]]
    assert [k.get("run_ids") for k in calls.kwargs["analyze"]] == [[RUN]]
