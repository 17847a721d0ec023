"""The dashboard states the answer (issue 31): the first page is a run's findings and breakdown, Why late shows the peer
wait, a straggler is the rank that started last, Compare sets two runs' breakdowns side by side. Built in-process on
real traces and checked against what the CLI prints (``explain --findings/--breakdown/--instances --format json``)."""

from __future__ import annotations

import html
import json
from pathlib import Path

import pandas as pd
import panel as pn
import pytest
from bokeh.models import ColumnDataSource, Plot

from overlapviz.analysis.findings import format_ns, headline

DATA = Path(__file__).parent / "data"
SWEEP = Path(__file__).parent.parent / "sample_traces" / "h200_standin_sweep"
HANG_S = 240


@pytest.fixture(autouse=True)
def _no_table_cache(monkeypatch):
    from overlapviz.dashboards import store as store_mod

    monkeypatch.setenv(store_mod.TABLE_CACHE_ENV, "0")


@pytest.fixture(scope="module")
def dlrm(tmp_path_factory):
    """The real 8-rank DLRM trace (tests/data/kineto_real/param_dlrm_8rank), imported: no experiment configuration."""
    from overlapviz.ingest import ingest

    return ingest([DATA / "kineto_real" / "param_dlrm_8rank"], tmp_path_factory.mktemp("dlrm") / "ds", progress=False)


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """The bundled H200 stand-in sweep (16 runs: sequential, baseline and optimized with priority)."""
    from overlapviz.ingest import ingest

    return ingest([SWEEP], tmp_path_factory.mktemp("sweep") / "ds", progress=False)


def cli_json(dataset, *args) -> list[dict]:
    from click.testing import CliRunner

    from overlapviz.cli import main

    result = CliRunner().invoke(main, ["explain", str(dataset), *args, "--format", "json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def texts(view) -> str:
    """Every text and HTML of a view (its Markdown, HTML and Alert panes)."""
    view = pn.panel(view)
    return "\n".join(str(p.object) for kind in (pn.pane.Markdown, pn.pane.HTML, pn.pane.Alert) for p in view.select(kind))


def figures_in(view) -> dict:
    """The Bokeh figures of a view, by title."""
    return {f.title.text: f for p in pn.panel(view).select(pn.pane.Bokeh) for f in p.object.select({"type": Plot}) if f.title}


def drawn(page, view: str):
    """``page``'s view as its open tab draws it."""
    page.shown = True
    page._keys.clear()
    return getattr(page, view)()


def expected_headline(rows: list[dict]) -> str:
    frame = pd.DataFrame(rows)
    total = {c: int(frame[c].sum()) for c in ("comm_ns", "overlapped_ns", "exposed_ns", "peer_wait_ns", "dependent_ns",
                                               "host_idle_ns", "exposed_other_ns")}  # fmt: skip
    return headline({**total, "n_ranks": len(frame)})


def test_an_imported_trace_s_first_page_is_its_findings_and_breakdown(dlrm):
    # was: "These runs are imported traces ...: there is no grid to show" and nothing else
    from overlapviz.dashboards.app import PAGES, build_app

    app = build_app(dlrm)
    overview = app.pages[PAGES.index("Overview")]
    view = drawn(overview, "_answer")
    said = texts(view)
    assert "no grid" not in said
    found = cli_json(dlrm, "--findings")
    rows = cli_json(dlrm, "--breakdown")
    assert found[0]["kind"] == "straggler" and found[0]["ranks"] == [7]  # the answer: rank 7 started last
    # every finding, in the CLI's order, with its time at stake
    at = [said.index(html.escape(f["text"])) for f in found]
    assert at == sorted(at)
    for f in found:
        assert f'data-kind="{f["kind"]}" data-time-ns="{f["time_ns"]}"' in said
        assert html.escape(f["action"]) in said
    assert html.escape(expected_headline(rows)) in said
    # the breakdown per rank, exact: the table's µs are the CLI's ns, the chart's bars stack to each rank's communication
    (table,) = [p for p in pn.panel(view).select(pn.pane.HTML) if hasattr(p, "frame")]
    shown = table.frame.set_index("rank")
    for r in rows:
        for col in ("comm_ns", "overlapped_ns", "exposed_ns", "peer_wait_ns", "dependent_ns", "host_idle_ns", "exposed_other_ns"):
            assert round(shown.loc[r["rank"], col[:-3] + "_us"] * 1000) == r[col], (r["rank"], col)
    (chart,) = figures_in(view).values()
    data = next(iter(chart.select({"type": ColumnDataSource}))).data
    labels = {"overlapped": "overlapped_ns", "peer wait": "peer_wait_ns", "dependent": "dependent_ns",
              "host idle": "host_idle_ns", "other exposed": "exposed_other_ns"}  # fmt: skip
    by_rank = {r["rank"]: r for r in rows}
    assert len(data["rank"]) == 5 * len(rows)  # five stacked parts per rank, each hovering its exact time
    for rank, part, time in zip(data["rank"], data["part"], data["time"]):
        assert time == format_ns(by_rank[int(rank)][labels[part]]), (rank, part)


def test_straggler_means_the_rank_that_started_last_on_collectives_and_why_late(dlrm):
    # was: "GPU span per rank (stragglers in pink)" painted ranks 1, 3, 4 and 5, which waited; rank 7 was blue
    from overlapviz.dashboards.pages_why import CollectivesPage, WhyPage
    from overlapviz.dashboards.store import DataStore

    store = DataStore(dlrm, warm_up=False)
    page = CollectivesPage(store)
    inst = pd.DataFrame(cli_json(dlrm, "--instances"))
    last = inst["straggler"].value_counts()
    assert int(last.index[0]) == 7 and int(last.iloc[0]) == 5
    line = texts(drawn(page, "_collectives"))
    assert f"**straggler** (the rank that started an instance last): **rank 7** (5 of {len(inst)})" in line
    ranks = drawn(page, "_ranks")
    titles = set(figures_in(ranks))
    assert not [t for t in titles if "pink" in t], titles
    assert "Stragglers: collective instances each rank started last" in titles
    (table,) = [p for p in pn.panel(ranks).select(pn.pane.HTML) if hasattr(p, "frame")]
    assert dict(zip(table.frame["rank"], table.frame["started_last"])) == {r: int(last.get(r, 0)) for r in range(8)}
    # Why late: the peer wait beside the start-delay causes, the breakdown's (45.3 ms here, against ~1 ms of late starts)
    rows = pd.DataFrame(cli_json(dlrm, "--breakdown"))
    why = drawn(WhyPage(store), "_summary")
    assert f"waited **{format_ns(int(rows['peer_wait_ns'].sum()))}** of exposed time" in texts(why)
    chart = figures_in(why)["Peer wait per rank (exposed)"]
    data = next(iter(chart.select({"type": ColumnDataSource}))).data
    assert dict(zip(data["rank"], data["time"])) == {f"rank {r}": format_ns(w) for r, w in zip(rows["rank"], rows["peer_wait_ns"])}


def test_a_sweep_s_first_page_states_the_run_s_findings_and_keeps_the_grid(sweep):
    from overlapviz.dashboards.app import PAGES, build_app

    app = build_app(sweep)
    overview = app.pages[PAGES.index("Overview")]
    run = overview.store.run_id
    found = [f for f in cli_json(sweep, "--findings", "--run", run)]
    said = texts(drawn(overview, "_answer"))
    assert found and all(html.escape(f["text"]) in said for f in found)
    assert found[0]["kind"] == "sm_resources"  # the baseline's answer: held off the SMs beside the GEMM
    layout = texts(overview.__panel__())
    assert "The configuration grid" in layout and "Click a cell" in layout


def test_compare_sets_two_runs_breakdowns_side_by_side_with_the_finding_that_changed(sweep):
    from overlapviz.dashboards.pages import ComparePage
    from overlapviz.dashboards.store import DataStore

    store = DataStore(sweep, warm_up=False)
    a = "cb-ar_baseline_tiled64x64x32-pad0k_p0_standin_072509d6"
    b = "cb-ar_optimized_tiled64x64x32-pad0k_p-1_standin_51d1fe90"
    store.run_a, store.run_b = a, b
    view = drawn(ComparePage(store), "_breakdowns")
    charts = figures_in(view)
    ta, tb = f"Breakdown per rank, A: {a}", f"Breakdown per rank, B: {b}"
    assert set(charts) == {ta, tb}  # (not "A: ...": the timelines' titles, which tests and users find them by)
    assert charts[ta].y_range.end == charts[tb].y_range.end  # one value axis: bars compare
    # the kind whose time changed most, from the two runs' findings as the CLI prints them
    time_of = {r: pd.DataFrame(cli_json(sweep, "--findings", "--run", r)).groupby("kind")["time_ns"].sum() for r in (a, b)}
    change = time_of[b].sub(time_of[a], fill_value=0)
    kind = change.abs().idxmax()
    said = texts(view)
    assert f"The finding that changed most: <b>{kind.replace('_', ' ')}</b>" in said
    exposed = {r: sum(x["exposed_ns"] for x in cli_json(sweep, "--breakdown", "--run", r)) for r in (a, b)}
    assert f"<b>A</b> {format_ns(exposed[a])}, <b>B</b> {format_ns(exposed[b])}" in said
    assert exposed[b] < exposed[a]  # the optimized run exposes less: the page says by how much
    assert f"(B −{format_ns(exposed[a] - exposed[b])})" in said


def test_changed_matches_findings_by_kind_largest_change_first():
    from overlapviz.dashboards.pages_findings import changed

    a = pd.DataFrame({"kind": ["straggler", "straggler", "host_idle"], "time_ns": [5, 3, 4]})
    b = pd.DataFrame({"kind": ["host_idle", "dependent"], "time_ns": [1, 2]})
    out = changed(a, b)
    assert out.to_dict("records") == [
        {"kind": "straggler", "a_ns": 8, "b_ns": 0, "change_ns": -8},
        {"kind": "host_idle", "a_ns": 4, "b_ns": 1, "change_ns": -3},
        {"kind": "dependent", "a_ns": 0, "b_ns": 2, "change_ns": 2},
    ]
