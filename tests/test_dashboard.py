"""The dashboard's DataStore and pages, built and driven in-process as a user would (no browser here)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import panel as pn
import pytest
from bokeh.models import Plot

from overlapviz.dataset import schema
from overlapviz.testing import write_grid_dataset


# a hang must not eat CI's time: a test running past this dumps every thread's stack and ends the run (conftest)
HANG_S = 240


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return write_grid_dataset(tmp_path_factory.mktemp("dash") / "ds")


def test_store_binds_runs_and_filters(dataset):
    from overlapviz.dashboards.store import DataStore

    store = DataStore(dataset)
    assert len(store.runs) == 6
    assert store.run_id == "cb-ar-sequential-pad0-prio0"
    assert store.param.ranks.objects == [0, 1]
    assert any("stand-in" in label for label in store.param.run_id.names)
    full = store.timeline()
    store.ranks = [1]
    only1 = store.timeline()
    assert set(only1.frame["rank"]) == {1} and len(only1.frame) * 2 == len(full.frame)
    assert "single-GPU stand-in" in store.configuration_text()


def test_store_says_why_an_analysis_cannot_run_and_lets_bugs_through(dataset, monkeypatch):
    from overlapviz.dashboards import store as store_mod

    def cannot(path, **kw):
        raise ValueError(f"{path}: no iterations recorded")

    def broken(path, **kw):
        raise KeyError("a bug")

    monkeypatch.setitem(store_mod.ANALYSES, "analyze", cannot)
    with pytest.raises(store_mod.Unavailable, match="no iterations recorded"):
        store_mod.load_analysis(str(dataset), "stamp-cannot", "analyze", per="rank")
    # a bug in an analysis is not turned into "not available": it reaches the log and the page
    monkeypatch.setitem(store_mod.ANALYSES, "analyze", broken)
    with pytest.raises(KeyError, match="a bug"):
        store_mod.load_analysis(str(dataset), "stamp-broken", "analyze", per="rank")


def test_pages_build_and_follow_the_store(dataset):
    from overlapviz.dashboards.app import PAGES, build_app
    from overlapviz.dashboards.pages import TimelinePage

    app = build_app(dataset)
    app.__panel__()
    assert list(app.tabs._names) == list(PAGES)
    for page in app.pages:
        page.__panel__()  # every page composes without error
    timeline = next(p for p in app.pages if isinstance(p, TimelinePage))
    assert not timeline.shown and isinstance(timeline._plot(), pn.Spacer)  # hidden: no work on store changes
    app.tabs.active = PAGES.index("Timeline")
    assert timeline.shown and not app.pages[0].shown
    store = timeline.store
    pane = timeline._plot()
    root = pane.get_root()  # drawn, as in a session
    figure = next(iter(root.select({"type": Plot})))
    store.run_id = "cb-ar-optimized-pad16384-prio-1"
    # a run switch redraws the frame of the one live plot into the same figure instead of building another
    assert timeline._plot() is pane
    assert next(iter(root.select({"type": Plot}))) is figure
    assert figure.title.text.startswith("Timeline of cb-ar-optimized-pad16384-prio-1")
    assert "16 KiB" in timeline._info().object


def test_only_the_open_tab_s_page_is_visible_in_the_document(dataset):
    """Panel's Tabs hides a closed tab with CSS alone (visibility: hidden): the browser laid out and painted every page
    kept in the session's document (the live Timeline, the page opened before) on each change. The pages of closed
    tabs are invisible (display: none, out of the layout), the open one visible, whichever was opened before."""
    from overlapviz.dashboards.app import PAGES, build_app

    app = build_app(dataset)
    app.__panel__()
    assert [h.visible for h in app.holders] == [i == 0 for i in range(len(PAGES))]
    for name in ("Timeline", "Why late", "Overview", "Timeline"):
        app.tabs.active = PAGES.index(name)
        assert [h.visible for h in app.holders] == [p == name for p in PAGES], name
    assert app.holders[PAGES.index("Overview")].objects  # opened before: kept in the document (``KEPT``), not shown
    root = app.holders[PAGES.index("Overview")].get_root()
    assert root.visible is False
    # and in the browser as the tab is clicked (a JS callback on the tabs), not a round trip later
    from panel.links import Callback

    code = [c.code["active"] for c in Callback.registry.get(app.tabs, []) if "active" in (c.code or {})]
    assert code and "visible" in code[0] and set(code[0].split("[")[1].split("]")[0].split(", ")) == {f"h{i}" for i in range(len(PAGES))}


def test_metric_deltas_present_analyze_rows():
    from overlapviz.analysis.ranks import metric_deltas

    m = pd.DataFrame({"run_id": ["a", "a", "b", "b"], "rank": [0, 1, 0, 1], "comm_us": [10.0, 20.0, 5.0, 5.0],
                      "overlap_fraction": [0.5, 0.5, 1.0, 1.0]})  # fmt: skip
    d = metric_deltas(m, "a", "b").set_index("metric (mean over ranks)")
    assert d.loc["comm_us", "A"] == 15.0 and d.loc["comm_us", "B − A"] == -10.0
    assert d.loc["overlap_fraction", "B − A"] == 0.5


def test_get_serves_the_page_once(dataset):
    from overlapviz.dashboards.app import get

    status, body = get(dataset, "/")
    assert status == 200, body[:500]
    assert "<title>overlapviz</title>" in body
    # offline: every script and stylesheet comes from this server
    import re

    refs = re.findall(r'(?:src|href)="([^"]+)"', body)
    assert any("bokeh.min.js" in r for r in refs)
    assert not [r for r in refs if "//" in r], refs
    assert pn.state.served is False


def test_the_page_patches_bokehjs_once_it_is_loaded_before_the_document_is_drawn(dataset):
    from overlapviz.dashboards.app import get
    from overlapviz.dashboards.patches import BROWSER_PATCH

    status, body = get(dataset, "/")
    assert status == 200, body[:500]
    patch = body.find(BROWSER_PATCH)
    assert patch > body.find("bokeh.min.js") > 0  # after BokehJS is loaded
    assert patch < body.find('type="application/json"')  # before the document (its JSON and the script that draws it)


def test_serve_get_through_the_cli(dataset):
    from click.testing import CliRunner

    from overlapviz.cli import main

    result = CliRunner().invoke(main, ["serve", dataset, "--get", "/"])
    assert result.exit_code == 0, result.output
    assert "<title>overlapviz</title>" in result.output
    bad = CliRunner().invoke(main, ["serve", dataset + "-missing", "--get", "/"])
    assert bad.exit_code != 0 and "not an overlapviz dataset" in bad.output and "Traceback" not in bad.output


def test_sample_traces_are_ingested_once_per_content(tmp_path):
    import shutil

    from overlapviz.ingest import samples

    sources = samples.sample_sources()
    if not sources:
        pytest.skip("no sample traces bundled in this checkout")
    root = tmp_path / "samples"
    shutil.copytree(sources[0], root / sources[0].name)
    first = samples.sample_dataset(root=root, cache=tmp_path / "cache")
    assert (first / schema.METADATA_FILE).exists()
    stamp = (first / schema.METADATA_FILE).stat().st_mtime_ns
    assert samples.sample_dataset(root=root, cache=tmp_path / "cache") == first  # cached, not ingested again
    assert (first / schema.METADATA_FILE).stat().st_mtime_ns == stamp
    runs = schema.read_frame(first, "runs")
    assert len(runs) and runs["run_id"].is_unique
    (root / "extra.json").write_text("{}")  # outside the sweep directory: not a source, same key
    assert samples.content_key(samples.sample_sources(root)) == first.name.removeprefix("samples-")
    with pytest.raises(ValueError, match="no sample traces"):
        samples.sample_dataset(root=tmp_path / "empty", cache=tmp_path / "cache")


def test_every_table_is_computed_once_per_dataset_even_when_asked_at_once(dataset, monkeypatch, tmp_path):
    import threading

    from overlapviz.dashboards import store as store_mod

    monkeypatch.setenv("OVERLAPVIZ_CACHE_DIR", str(tmp_path / "cache"))
    calls = []

    def slow(path, **kw):
        if threading.current_thread().name.startswith("asker"):  # not an earlier test's warm-up, still running
            calls.append(path)
        threading.Event().wait(0.3)
        return pd.DataFrame({"run_id": ["x"]})

    slow.__module__ = "overlapviz.analysis.fake"  # kept on disk like the real analyses
    monkeypatch.setitem(store_mod.ANALYSES, "analyze", slow)
    stamp = "stamp-once"
    threads = [threading.Thread(target=store_mod.load_analysis, args=(str(dataset), stamp, "analyze"), name=f"asker{i}")
               for i in range(4)]  # fmt: skip
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1  # the warm-up and the sessions that ask meanwhile wait for the one computation
    # a fresh server process finds the table on disk
    store_mod._TABLES.clear()
    threading.current_thread().name = "asker-main"
    try:
        assert store_mod.load_analysis(str(dataset), stamp, "analyze")["run_id"].tolist() == ["x"] and len(calls) == 1
    finally:
        threading.current_thread().name = "MainThread"
    files = list((tmp_path / "cache" / "tables").rglob("*.pickle"))
    assert files and all(oct(f.stat().st_mode & 0o777) == "0o600" for f in files)


def test_compare_says_why_it_shows_no_pair(dataset):
    from overlapviz.dashboards.pages import ComparePage
    from overlapviz.dashboards.store import DataStore

    store = DataStore(dataset, warm_up=False)
    page = ComparePage(store)
    page.shown = True
    store.run_b = store.run_a
    assert page.content.startswith("A and B are the same run")
    store.run_b = "cb-ar-optimized-pad0-prio0"
    assert page.content == f"copy\0{store.run_a}\0{store.run_b}"  # two runs drawn whole: a copy of their drawing
    deltas = page._deltas(store.run_a, store.run_b)
    items = set(deltas["item"])
    assert {"median_start_delay_us", "median_start_delay_at_launch_us"} <= items  # the start delay under each of its names


def test_opening_the_dashboard_computes_only_what_its_first_page_shows(dataset, monkeypatch):
    # was: the why page's constructor ran explain (6 s on the samples) before the Overview could be sent
    from bokeh.document import Document

    from overlapviz.dashboards import store as store_mod
    from overlapviz.dashboards.app import PAGES, build_app

    monkeypatch.setenv(store_mod.TABLE_CACHE_ENV, "0")
    monkeypatch.setattr(store_mod, "warm", lambda *a, **k: None)  # the background warm-up is not the session's
    store_mod._TABLES.clear()
    asked = []
    for name, f in list(store_mod.ANALYSES.items()):
        monkeypatch.setitem(store_mod.ANALYSES, name, lambda *a, _f=f, _n=name, **k: asked.append(_n) or _f(*a, **k))
    app = build_app(dataset)
    pn.panel(app).get_root(Document())
    # the first page is the first run's answer: its findings (explain) and breakdown, and the sweep's grid
    assert set(asked) == {"config_table", "explain", "breakdown"}, asked
    app.tabs.active = PAGES.index("Why late")
    assert "explain" in asked and app.pages[PAGES.index("Why late")].record is not None


def test_the_why_page_follows_the_chosen_collective(dataset):
    from overlapviz.dashboards.pages import WhyPage
    from overlapviz.dashboards.store import DataStore

    store = DataStore(dataset, warm_up=False)
    store.run_id = "cb-ar-baseline-pad0-prio0"
    page = WhyPage(store)
    assert page.record is None  # nothing computed before the tab opens
    page.shown = True
    assert page.record["cause"] == "sm_resources"  # the longest wait for SM room first
    names = page.param.what_if.names  # label -> value
    assert any("smem pad" in k for k in names)
    tab, facts = store.budget(page.record)
    assert facts["fit"] == 0 and facts["limiter"] == "registers"
    page.what_if = names[next(k for k in names if "★" in k and "smem pad" in k)]
    budget_pane = page._budget()
    assert "what if" in budget_pane.objects[1].object.title.text  # the Bokeh figure (drawn once per dataset, copied per session)
    page.cause = "sm_resources"
    kernels = page._kernels()
    assert set(kernels.objects[1].value["cause"]) == {"SM resources"}
    opened = []
    store.open_timeline = opened.append
    page._show_on_timeline()
    assert opened == [store.run_id] and store.focus["start_ns"] == page.record["start_ns"]


def test_the_why_page_sorts_a_run_once_and_its_filters_cut_that_order(dataset, monkeypatch):
    """The Why late page's order of a run's collectives (``budget.latest_first``) and its worst one are computed once per
    run for every session (0.14 s a visit on the million-kernel set); a cause or rank filter shows the rows
    ``latest_first`` gives for the filtered records, in its order."""
    from overlapviz.analysis import budget
    from overlapviz.dashboards.pages import WhyPage
    from overlapviz.dashboards.store import DataStore

    run = "cb-ar-baseline-pad0-prio0"
    store = DataStore(dataset, warm_up=False)
    store.run_id = run
    first = WhyPage(store)
    first.shown = True
    first._kernels()
    e = first.store.explained()
    for cause, rank in (("all", "all"), ("sm_resources", "all"), ("all", "1"), ("sm_resources", "0")):
        first.param.update(cause=cause, rank=rank)
        want = e if cause == "all" else e.loc[e["cause"] == cause]
        want = want if rank == "all" else want.loc[want["rank"] == int(rank)]
        pd.testing.assert_frame_equal(first._records(), budget.latest_first(want))
    asked = []
    for name in ("latest_first", "worst_record"):
        monkeypatch.setattr(budget, name, lambda *a, _n=name, **k: asked.append(_n))
    store = DataStore(dataset, warm_up=False)  # another session
    store.run_id = run
    second = WhyPage(store)
    second.shown = True
    second._kernels()
    assert not asked and second.record == first.record and second.record is not first.record


def test_what_if_options_are_kept_in_the_table_cache(dataset, monkeypatch, tmp_path):
    """A restarted server reads a collective's what-if options from the table cache instead of computing them again."""
    from overlapviz.analysis import budget
    from overlapviz.dashboards import store as st

    monkeypatch.setenv("OVERLAPVIZ_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(st, "_TABLES", st.Memo(256))
    store = st.DataStore(dataset, warm_up=False)
    record = budget.worst_record(store.explained("cb-ar-baseline-pad0-prio0"))
    options = store.what_if(record)
    assert len(options)
    monkeypatch.setattr(st, "_TABLES", st.Memo(256))  # a new server process: nothing in memory
    monkeypatch.setattr(budget, "what_if_options", lambda *a, **k: pytest.fail("computed again"))
    pd.testing.assert_frame_equal(st.DataStore(dataset, warm_up=False).what_if(record), options)


def test_an_export_that_cannot_be_made_says_why_in_the_page(dataset):
    from overlapviz.dashboards.common import export_buttons
    from overlapviz.dashboards.store import DataStore

    store = DataStore(dataset, warm_up=False)
    col = export_buttons(store, ("timeline", lambda: {"runs": ["no-such-run"]}, "Export timeline"))
    button, message = col.objects[0].objects[1], col.objects[1]
    button._transfer()
    assert message.visible and "Export failed" in message.object and "no-such-run" in message.object
    assert button.data in (None, "")


def test_show_on_timeline_zooms_to_the_collective(dataset):
    from bokeh.models import Plot

    from overlapviz.dashboards.pages import TimelinePage
    from overlapviz.dashboards.store import DataStore

    store = DataStore(dataset, warm_up=False)
    page = TimelinePage(store)
    page.shown = True
    root = page._plot().get_root()
    rec = store.explained("cb-ar-optimized-pad0-prio-1").iloc[3]
    store.focus = {"run_id": rec["run_id"], "rank": int(rec["rank"]), "stream": rec["stream"], "start_ns": int(rec["start_ns"])}
    assert store.run_id == rec["run_id"]
    lo, hi = page._window
    start_ms = (rec["start_ns"] - store.timeline().origin_ns) / 1e6
    assert lo < start_ms < hi and hi - lo < 1.0  # a window around the collective, its launch and its wait
    figure = next(iter(root.select({"type": Plot})))
    assert (figure.x_range.start, figure.x_range.end) == pytest.approx((lo, hi))


def test_a_run_s_tables_are_its_rows_of_the_whole_dataset_s(dataset, monkeypatch):
    # a page's first visit computes its run alone (a dataset of many runs: never every run's explain); the rows must be
    # the same as those cut from the whole dataset's tables, which the warm-up computes meanwhile
    from overlapviz.dashboards import store as store_mod

    monkeypatch.setenv(store_mod.TABLE_CACHE_ENV, "0")
    store_mod._TABLES.clear()
    store = store_mod.DataStore(dataset, warm_up=False)
    run = "cb-ar-baseline-pad0-prio0"
    names = ("summary", "blockers", "instances", "cells", "delays")

    def tables():
        out = {n: store._of_run(n, run) for n in names}
        return out | {"explain": store.explained(run), "residency": store.run_residency(run)}

    alone = tables()
    assert not store_mod._whole_at_hand(store.path, store.stamp, "explain") and len(alone["explain"])
    store.explained("*"), store.kernel_residency()
    assert store_mod._whole_at_hand(store.path, store.stamp, "explain")
    whole = tables()
    for name, frame in alone.items():
        assert set(frame["run_id"]) == {run}, name
        pd.testing.assert_frame_equal(frame.reset_index(drop=True), whole[name].reset_index(drop=True), check_dtype=False)


def test_the_process_exits_while_the_warm_up_is_reading_tables(dataset, tmp_path):
    """A process ending while the warm-up thread is inside pyarrow hung forever in Arrow's exit handlers (a test
    run that hung after its last line, a server that never stopped on Ctrl-C); the warm-up is stopped and joined
    at exit now, before those run."""
    import subprocess
    import sys

    script = f"""
import atexit, threading, time
seen = {{}}
atexit.register(lambda: print("warm-up alive at exit:", any(t.is_alive() for t in threading.enumerate()
                                                         if t.name == "overlapviz-warm"), seen, flush=True))
from overlapviz.dashboards import store
real = store.load_analysis
def slow(*a, **k):  # each table takes a while: the exit comes while one is being computed
    seen["steps"] = seen.get("steps", 0) + 1
    time.sleep(0.3)
    return real(*a, **k)
store.load_analysis = slow
store.DataStore({str(dataset)!r})
store._BUSY["until"] = 0.0
while not seen:
    time.sleep(0.01)
"""
    env = {**__import__("os").environ, "OVERLAPVIZ_TABLE_CACHE": "0"}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "warm-up alive at exit: False" in out.stdout, out.stdout + out.stderr[-2000:]
    steps = int(out.stdout.split("'steps': ")[1].split("}")[0])
    assert steps < 5, out.stdout  # stopped after the table it was computing, not after every table


def test_the_timeline_draws_the_kernels_at_once_and_adds_the_why_when_it_comes(dataset, monkeypatch):
    """The first draw of a run never waits for its explain: the kernels come at once with a 'computing why' note,
    the wait tracks, arrows and hover why fields are added to the same figure (same zoom) when the why is ready."""
    import threading
    import time

    import holoviews as hv

    from overlapviz.dashboards import store as store_mod
    from overlapviz.dashboards.pages import COMPUTING_WHY, TimelinePage

    monkeypatch.setenv(store_mod.TABLE_CACHE_ENV, "0")
    store_mod._TABLES.clear()
    store_mod._TIMELINES.clear()
    gate = threading.Event()
    real = store_mod.ANALYSES["explain"]

    def slow(path, **kw):
        gate.wait(60)
        return real(path, **kw)

    monkeypatch.setitem(store_mod.ANALYSES, "explain", slow)

    def layers(frame):
        rects = [e for e in frame.values() if isinstance(e, hv.Rectangles)]
        waits = next(e for e in rects if "part" in [d.name for d in e.vdims])
        comm = next(e for e in rects if "cause" in [d.name for d in e.vdims])
        return len(waits.data), comm.data["cause"].astype(str).ne("—").sum(), len(comm.data)

    store = store_mod.DataStore(dataset, warm_up=False)
    page = TimelinePage(store)
    page.shown = True
    root = page._plot().get_root()  # drawn while explain is blocked: it must not wait for it
    figure = next(iter(root.select({"type": Plot})))
    assert page.why_note == COMPUTING_WHY and not store.why_ready()
    n_waits, n_why, n_comm = layers(page._last[1])
    assert n_waits == 0 and n_why == 0 and n_comm > 0  # the collectives are drawn, their why not yet
    gate.set()
    deadline = time.monotonic() + 60
    while (page._fetching or page.why_note) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert page.why_note == "" and store.why_ready()
    n_waits, n_why, n_comm = layers(page._last[1])
    assert n_waits > 0 and n_why == n_comm  # the redraw has the wait tracks and every collective's why
    assert next(iter(root.select({"type": Plot}))) is figure  # added to the drawn figure, not a new page


def test_a_run_whose_explain_is_computed_is_drawn_with_its_why_in_one_frame(dataset, monkeypatch):
    """A run switch after the warm-up (explain and residency computed, the run's timeline not): the first frame already
    has the waits and every collective's why, with no 'computing why' note and no second frame."""
    import holoviews as hv

    from overlapviz.dashboards import store as store_mod
    from overlapviz.dashboards.pages import TimelinePage

    monkeypatch.setenv(store_mod.TABLE_CACHE_ENV, "0")
    # an earlier test's warm-up (it reads the Compare pair's timelines) stopped after its current table: left to run on
    # (niced, it outlived a 120 s join on a loaded machine), it computed the run's explain after the clear below
    store_mod._STOP.set()
    try:
        for thread in list(store_mod._BACKGROUND):
            thread.join(120)
            assert not thread.is_alive(), f"{thread.name} still runs"
    finally:
        store_mod._STOP.clear()
    store_mod._TABLES.clear()
    store_mod._TIMELINES.clear()
    store = store_mod.DataStore(dataset, warm_up=False)
    page = TimelinePage(store)
    page.shown = True
    page._plot().get_root()
    assert page._fetching or page.why_note  # nothing computed: the kernels first
    for name in ("explain", "kernel_residency"):
        store_mod.load_analysis(store.path, store.stamp, name)
    other = next(r for r in store.runs["run_id"] if r != store.run_id)
    assert not store_mod._TIMELINES.has((store.path, store.stamp, other, None)) and store.why_ready(other)
    store.run_id = other
    rects = [e for e in page._last[1].values() if isinstance(e, hv.Rectangles)]
    waits = next(e for e in rects if "part" in [d.name for d in e.vdims])
    comm = next(e for e in rects if "cause" in [d.name for d in e.vdims])
    assert page._last[0][:1] == (other,) and page._last[0][4] is True
    assert len(waits.data) > 0 and comm.data["cause"].astype(str).ne("—").sum() == len(comm.data) > 0
    assert page.why_note == "" and other not in page._fetching


def test_the_perfetto_trace_is_written_once_per_run_and_dataset_state(dataset, monkeypatch, tmp_path):
    import gzip
    import json

    from overlapviz.export import perfetto
    from overlapviz.dashboards import store as store_mod

    monkeypatch.setenv("OVERLAPVIZ_CACHE_DIR", str(tmp_path / "cache"))
    calls = []
    real = perfetto.write_perfetto

    def counted(path, run_id, out, **kw):
        calls.append(run_id)
        return real(path, run_id, out, **kw)

    monkeypatch.setattr(perfetto, "write_perfetto", counted)
    store = store_mod.DataStore(dataset, warm_up=False)
    run = store.run_id
    first = store.perfetto_trace(run)
    assert store.perfetto_trace(run) == first and calls == [run]  # a second click: the same file, not written again
    store_mod._FILES.clear()  # a restarted server: read from the table cache
    assert store.perfetto_trace(run) == first and calls == [run]
    exported = real(str(dataset), run, tmp_path / "t.json.gz").read_bytes()
    assert gzip.decompress(exported) == gzip.decompress(first)  # what `export --format perfetto` writes
    assert any(e.get("ph") == "X" for e in json.loads(gzip.decompress(first))["traceEvents"])
    other = [r for r in store.runs["run_id"] if r != run][0]
    store.perfetto_trace(other)
    assert calls == [run, other]
    # another dataset state (re-ingested: a new stamp) is written anew
    store_mod.perfetto_trace(store.path, "another-stamp", run)
    assert calls == [run, other, run]


def test_a_timeline_drawn_before_its_why_says_the_residency_is_coming_not_missing(tmp_path):
    # the kernels-only timeline (drawn at once) must not claim "no device limits" for a run that has them
    import numpy as np

    from overlapviz.figures import timeline as ftl

    frame = pd.DataFrame({"run_id": ["r"], "rank": [0], "stream": [7], "name": ["gemm"], "kind": ["compute"], "start_ns": [0],
                          "end_ns": [10], "block_x": [128], "block_y": [1], "block_z": [1], "regs_per_thread": [64],
                          "shared_mem_bytes": [0]})  # fmt: skip
    pending = ftl.TimelineData(frame, residency=ftl.RESIDENCY_PENDING)
    text = pending.hover_frame(np.ones(1, bool))["residency"].tolist()
    assert text == [ftl.RESIDENCY_PENDING] and "no device limits" not in text[0]
    assert ftl.TimelineData(frame).hover_frame(np.ones(1, bool))["residency"].tolist() == ["— (no device limits)"]


def test_the_timeline_hover_gives_each_rank_the_residency_on_its_own_gpu(tmp_path, monkeypatch):
    """A job on two GPU models (rank 0 an A100, rank 1 an H100): the same launch shape fits 3 blocks of 48 KiB of shared
    memory on an SM of the first, 4 on the second; the hover of each rank's kernel says its own GPU's, as the per-kernel
    occupancy computes it (the merged residency rows name the model, not the ranks: a join on the shape alone gave
    every rank the first model's)."""
    import numpy as np

    from overlapviz.export import render as export
    from overlapviz.analysis.occupancy import kernel_occupancy
    from overlapviz.analysis.residency import device_table, kernel_shapes, run_carveouts
    from overlapviz.dashboards import store as store_mod
    from overlapviz.ingest import ingest
    from overlapviz.testing import A100_PROPERTIES, generate_trace, write_trace

    h100 = dict(A100_PROPERTIES, name="NVIDIA H100 80GB HBM3", computeMajor=9, computeMinor=0, numSms=132,
                sharedMemPerBlockOptin=232448, sharedMemPerMultiprocessor=233472)  # fmt: skip
    for rank, props in enumerate((A100_PROPERTIES, h100)):
        write_trace(generate_trace(400, rank=rank, world_size=2, seed=3, device_properties=[props]), tmp_path / "job" / f"rank{rank}.json.gz")
    path = ingest([str(tmp_path / "job")], tmp_path / "ds", progress=False)
    monkeypatch.setenv(store_mod.TABLE_CACHE_ENV, "0")
    store = store_mod.DataStore(path, warm_up=False)
    for data in (store.timeline(why=True), export.DatasetSource(path).timeline(store.run_id)):
        frame = data.frame
        hover = data.hover_frame(np.ones(len(frame), bool))
        oracle = kernel_occupancy(kernel_shapes(frame.assign(run_id=frame["run_id"].astype(str))), device_table(path), run_carveouts(path))
        known = oracle["blocks_per_sm"].notna().to_numpy()
        want = [f"{int(b)} blocks/SM" for b in oracle["blocks_per_sm"].to_numpy()[known]]
        got = hover["residency"].to_numpy()[known]
        assert [g.split(" (")[0] for g in got] == want
        # the shapes the two GPUs hold differently are in the trace (else this test would not tell the join apart)
        by = oracle.assign(rank=frame["rank"].to_numpy()).loc[known].groupby(["name", "threads_per_block", "regs_per_thread",
                                                                              "shared_mem_bytes"])  # fmt: skip
        assert (by["blocks_per_sm"].nunique() > 1).any()


def test_the_warm_up_reads_the_first_run_s_timeline_once_the_first_page_is_sent(dataset, monkeypatch):
    """A server's warm-up computes its first page's answer at once, but begins the first run's timeline (the kernels and
    the why, for the Timeline opened next) only once a session's first page is built (``page_sent``): begun at once, it
    took the GIL from that page (a restarted server's first Overview of 1M kernels waited half its time for it)."""
    import threading
    import time

    from overlapviz.dashboards import store

    asked = []
    for name in ("load_findings", "load_timeline", "run_analysis", "load_analysis", "_derived"):
        monkeypatch.setattr(store, name, lambda *a, _n=name, **k: asked.append((_n, store._SENT.is_set())))
    monkeypatch.setattr(store, "_WARMED", set())
    monkeypatch.setattr(store, "_SENT", threading.Event(), raising=False)  # no session's page yet
    path = str(dataset)
    stamp = store.dataset_stamp(path)
    thread = store.warm(path, stamp, store.load_runs(path, stamp)["run_id"].iloc[0])
    time.sleep(1.0)
    assert ("load_findings", False) in asked  # the answer the first page shows: at once
    assert not [name for name, _ in asked if name == "load_timeline"], asked
    store.page_sent()
    thread.join(HANG_S)
    assert not thread.is_alive()
    timeline = [sent for name, sent in asked if name == "load_timeline"]
    assert timeline and all(timeline), asked  # the timeline: once the page was sent


def test_a_session_s_first_page_says_it_is_sent_on_its_first_tick(dataset, monkeypatch):
    import threading

    from bokeh.document import Document
    from panel.io.state import set_curdoc

    from overlapviz.dashboards import store
    from overlapviz.dashboards.app import build_app

    monkeypatch.setattr(store, "_SENT", threading.Event())
    doc = Document()
    with set_curdoc(doc):
        build_app(dataset)
    assert not store._SENT.is_set()
    for callback in doc.session_callbacks:  # what the session runs on its first tick, once the page is built
        callback.callback()
    assert store._SENT.is_set()


def test_background_analysis_yields_to_a_page_being_drawn_unless_a_page_waits_for_it():
    """Who pauses for a page, and until when: told by whether a page is still busy when ``yield_to_pages`` returns,
    never by how long it took (each wait's limit is far past the join's, so a wait that ends on its limit fails)."""
    import threading
    import time

    from overlapviz.dashboards import store

    LIMIT, JOIN = 600.0, 60.0

    def in_thread(work, yielding=True):
        """``work`` on a thread named as the warm-up's (in ``_YIELDING`` when ``yielding``); out["busy"]: whether a page
        was still busy when it returned."""
        out, entered = {}, threading.Event()

        def run():
            if yielding:
                store._YIELDING.add(threading.get_ident())  # a warm-up past what the first pages wait for
            try:
                entered.set()
                out["value"] = work()
                out["busy"] = store._page_busy()
            finally:
                store._YIELDING.discard(threading.get_ident())

        t = threading.Thread(target=run, name="overlapviz-warm")
        t.start()
        entered.wait(JOIN)
        return t, out

    def finished(t):
        t.join(JOIN)
        return not t.is_alive()

    try:
        store.busy(0.8)  # a session draws a page
        t, out = in_thread(lambda: store.yield_to_pages(limit=LIMIT))
        assert finished(t) and out["busy"] is False  # paused until the page was drawn, not past it
        assert store._BUSY["until"] <= time.monotonic()
        with store.drawing():  # a page being drawn, however long
            t, out = in_thread(lambda: store.yield_to_pages(limit=LIMIT))
            time.sleep(0.3)
            assert t.is_alive()  # still paused while the page is drawn
        assert finished(t) and out["busy"] is False  # and past the moment after it (``drawing`` ends in ``busy``)
        store._BUSY["until"] = 0.0
        # a background thread computing what the first pages wait for never pauses: it returns while the page is busy
        t, out = in_thread(lambda: (store.busy(LIMIT), store.yield_to_pages(limit=LIMIT)), yielding=False)
        assert finished(t) and out["busy"] is True
        store.yield_to_pages(limit=LIMIT)  # a page's own thread never pauses (the page is still busy)
        assert store._page_busy()
        # a session waiting for a table the background thread computes lifts the pause
        memo, started = store.Memo(4), threading.Event()

        def compute():
            started.set()
            store.yield_to_pages(limit=LIMIT)
            return 1

        bg, out = in_thread(lambda: memo.get("k", compute))
        assert started.wait(JOIN)
        time.sleep(0.2)
        waiter = {}
        session = threading.Thread(target=lambda: waiter.update(value=memo.get("k", lambda: 2)))
        session.start()
        assert finished(session) and waiter["value"] == 1  # waited for the background thread's value
        assert finished(bg) and out["busy"] is True  # which stopped pausing while the page was still busy
    finally:
        store._BUSY["until"] = 0.0  # (a thread still paused ends within its next poll)


def test_a_static_plot_is_drawn_once_and_each_copy_has_models_of_its_own(dataset):
    import holoviews as hv
    from bokeh.document import Document
    from bokeh.embed.util import standalone_docs_json

    from overlapviz.dashboards.common import static_plot
    from overlapviz.dashboards.store import DataStore

    store = DataStore(dataset, warm_up=False)
    drawn = []

    def build():
        drawn.append(1)
        return hv.Scatter(([1, 2, 3], [4.0, 5.0, 6.5]), "x", "y").opts(title="scatter", tools=["hover"], color="#123456")

    a, b = (static_plot(store, ("test scatter",), build) for _ in range(2))
    assert drawn == [1]  # HoloViews drew it once
    ma, mb = a.object, b.object
    ids_a, ids_b = {m.id for m in ma.references()}, {m.id for m in mb.references()}
    assert len(ids_a) == len(ma.references()) > 10 and not ids_a & ids_b
    assert ma.title.text == mb.title.text == "scatter"
    glyph = next(r for r in mb.renderers if hasattr(r, "data_source"))
    assert list(glyph.data_source.data["y"]) == [4.0, 5.0, 6.5]
    assert getattr(glyph.glyph.fill_color, "value", glyph.glyph.fill_color) == "#123456"  # a value spec once copied
    assert any(type(t).__name__ == "HoverTool" for t in mb.toolbar.tools)
    doc = Document()  # one document holds both copies (a page drawn again with the same figure)
    doc.add_root(ma)
    doc.add_root(mb)
    assert standalone_docs_json([ma, mb])


def test_missing_numbers_read_as_a_dash_in_tables_and_hovers_never_nan(tmp_path, monkeypatch):
    """A real 2-rank HTA trace has no device limits: the Why late table's fit and free SMs, the Collectives table's slowest
    rank (where unknown) and the hover's launch shapes say "—", not pandas' missing value (NaN in a table under pandas 3,
    "<NA>" under pandas 2); the SM budget says which device fields are missing and how to give them."""
    from pathlib import Path

    import numpy as np

    from overlapviz.figures import charts as figures
    from overlapviz.dashboards import store as store_mod
    from overlapviz.dashboards.pages_why import ResidencyPage, WhyPage
    from overlapviz.ingest import ingest

    monkeypatch.setenv(store_mod.TABLE_CACHE_ENV, "0")
    path = ingest([Path(__file__).parent / "data" / "hta_trace_filter_2rank"], tmp_path / "ds", progress=False)
    store = store_mod.DataStore(path, warm_up=False)
    shown = WhyPage(store)._build_display(store.run_id)
    assert (shown["fit"] == "—").all() and (shown["free"] == "—").all()
    hover = store.timeline(why=True).hover_frame(np.ones(len(store.timeline().frame), bool))
    for column in ("where", "step", "grid", "block", "regs"):
        text = hover[column].astype(str)
        assert not text.str.contains("nan|<NA>", case=False).any(), column
    page = WhyPage(store)
    page.shown = True  # opens the run: its worst collective is chosen
    said = " ".join(str(getattr(o, "object", "")) for o in page._budget().objects)
    assert "`num_sms`" in said and "--device-name" in said and "no devices row" in said  # which fields, and how to give them
    # no export offered of a budget or a residency the page says it cannot draw (one that could only fail)
    for page, figure in ((WhyPage(store), "budget"), (ResidencyPage(store), "residency")):
        page.__panel__()
        page.shown = True  # (its views are drawn)
        assert not page._exports.buttons[figure].visible, figure
    assert figures.int_text(pd.Series([3.0, None, "x"], dtype=object)).tolist() == ["3", "—", "—"]
    assert figures.int_text(pd.Series([1, None], dtype="Int64"), "?").tolist() == ["1", "?"]


def test_serve_device_name_gives_every_page_the_residency_a_trace_without_device_properties_lacks(tmp_path, monkeypatch):
    """`serve --device-name GPU` on the real 2-rank HTA trace (no device rows): the dashboard's explain, residency, SM
    budget, what-ifs and hover are explain's and residency's with ``device=GPU`` (what the CLI's --device-name prints),
    the notice is gone, and the tables of the dataset without the name are kept apart (not served under it). A name no
    GPU has: one line, before anything listens."""
    from pathlib import Path

    from click.testing import CliRunner

    from overlapviz.analysis import budget, explain, residency
    from overlapviz.cli import main
    from overlapviz.dashboards import store as store_mod
    from overlapviz.dashboards.pages_why import ResidencyPage, WhyPage
    from overlapviz.ingest import ingest

    gpu = "NVIDIA A100-SXM4-80GB"
    monkeypatch.setenv(store_mod.TABLE_CACHE_ENV, "0")
    path = ingest([Path(__file__).parent / "data" / "hta_trace_filter_2rank"], tmp_path / "ds", progress=False)
    plain = store_mod.DataStore(path, warm_up=False)
    assert plain.explained()["comm_blocks_fit_per_sm"].isna().all()
    monkeypatch.setitem(store_mod.DEVICE, "name", gpu)
    store = store_mod.DataStore(path, warm_up=False)
    assert store.stamp != plain.stamp  # every table of the named GPU under keys of its own
    want = explain.explain(path, run_ids=[store.run_id], device=gpu)
    got = store.explained()
    assert want["comm_blocks_fit_per_sm"].notna().any()
    pd.testing.assert_frame_equal(got.reset_index(drop=True), want.reset_index(drop=True))
    pd.testing.assert_frame_equal(store.run_residency().reset_index(drop=True),
                                  residency.kernel_residency(path, run_ids=[store.run_id], device=gpu).reset_index(drop=True))
    hover = store.timeline(why=True).residency
    assert hover is not None and hover["blocks_per_sm"].notna().any()
    record = budget.worst_record(got)
    table, facts = store.budget(record)
    assert facts["num_sms"] == 108 and facts["fit"] == budget.kernel_budget(path, record, device=gpu)[1]["fit"]
    pd.testing.assert_frame_equal(store.what_if(record), budget.what_if_options(path, record, device=gpu))
    page = WhyPage(store)
    page.shown = True
    said = " ".join(str(getattr(o, "object", "")) for o in page._budget().objects)
    assert "--device-name" not in said and "no devices row" not in said
    for page, figure in ((WhyPage(store), "budget"), (ResidencyPage(store), "residency")):
        page.__panel__()
        page.shown = True
        assert page._exports.buttons[figure].visible, figure
    monkeypatch.setitem(store_mod.DEVICE, "name", None)
    assert store_mod.DataStore(path, warm_up=False).explained()["comm_blocks_fit_per_sm"].isna().all()  # not the GPU's
    bad = CliRunner().invoke(main, ["serve", str(path), "--device-name", "no such gpu", "--port", "0"])
    assert bad.exit_code == 1 and bad.output.strip().count("\n") == 0 and "--device-name 'no such gpu'" in bad.output
    assert store_mod.DEVICE["name"] is None
    good = CliRunner().invoke(main, ["serve", str(path), "--device-name", gpu, "--get", "/"])
    assert good.exit_code == 0 and store_mod.DEVICE["name"] == gpu, good.output[-500:]  # (monkeypatch puts it back)


def test_a_trace_without_launch_records_is_not_said_to_have_started_its_collectives_0_us_late(tmp_path, monkeypatch):
    """The real MI350X rocprofv3 trace has no HIP API records: no collective's launch is known. Its summary's sums by cause
    are unknown (the CLI prints "-"), not 0 µs "mostly stream order"; the page says why, lists the collectives by
    ready → start, and the blockers by ready → start (zero-length bars before). On the HTA trace (no device limits)
    the page does not claim that 0 collectives were held off the SMs."""
    from pathlib import Path

    import holoviews as hv

    from overlapviz.figures import why as figures_why
    from overlapviz.analysis import budget, explain
    from overlapviz.dashboards import store as store_mod
    from overlapviz.dashboards.pages_why import WhyPage
    from overlapviz.ingest import ingest

    monkeypatch.setenv(store_mod.TABLE_CACHE_ENV, "0")
    data = Path(__file__).parent / "data"
    path = ingest([data / "rocprof" / "v3" / "tracelens_mi350x_json" / "908_results.json.gz"], tmp_path / "mi350", progress=False)
    e = explain.explain(path)
    assert len(e) == 1310 and e["start_minus_launch_ns"].isna().all() and e["start_delay_us"].notna().any()
    s = explain.summarize(e).iloc[0]
    causes = [c for c in explain.CAUSES if f"{c}_us" in s]  # ("none" is a cause, not a wait: no column)
    assert s["n_launch_unknown"] == 1310 and len(causes) >= 5 and all(pd.isna(s[f"{c}_us"]) for c in causes)
    known = e.copy()
    known.loc[known.index[:2], "start_minus_launch_ns"] = [5_000, 7_000]  # two launches known: summed, the rest not
    s = explain.summarize(known).iloc[0]
    assert s["n_launch_unknown"] == 1308 and all(pd.notna(s[f"{c}_us"]) for c in causes)  # (their waits: docs/explain.md)
    blockers = budget.blocker_table(e)
    assert len(blockers) and blockers["blocked_us"].isna().all() and (blockers["ready_wait_us"] > 0).all()
    bars = hv.render(figures_why.blockers(blockers), backend="bokeh")
    assert "ready → start" in bars.xaxis[0].axis_label or "ready → start" in bars.yaxis[0].axis_label
    order = budget.latest_first(e)["ready_wait_ns"].astype("Float64").fillna(-1).to_numpy()
    assert (order[:-1] >= order[1:]).all()  # longest ready → start first
    store = store_mod.DataStore(path, warm_up=False)
    page = WhyPage(store)
    page.shown = True
    said = " ".join(str(getattr(o, "object", "")) for o in page._summary().objects)
    assert "0.000" not in said and "none of their launches" in said and "1,310 collectives" in said, said
    assert "longest ready → start first" in " ".join(str(getattr(o, "object", "")) for o in page._kernels().objects)
    hta = ingest([data / "hta_trace_filter_2rank"], tmp_path / "hta", progress=False)
    page = WhyPage(store_mod.DataStore(hta, warm_up=False))
    page.shown = True
    said = " ".join(str(getattr(o, "object", "")) for o in page._summary().objects)
    assert "held any off the SMs is unknown" in said and "0 were held" not in said, said


def test_a_run_without_collectives_offers_no_why_export(tmp_path, monkeypatch):
    """Why late of a run with no communication kernel says nothing waited, and offers no export of the summary or the SM
    budget (QA: both buttons were shown, and a click downloaded nothing and said nothing)."""
    from overlapviz.dashboards import store as store_mod
    from overlapviz.dashboards.pages_why import WhyPage
    from overlapviz.testing import kernel_row, write_rows_dataset

    monkeypatch.setenv(store_mod.TABLE_CACHE_ENV, "0")
    path = write_rows_dataset(tmp_path / "ds", [kernel_row("gemm", "compute", 7, 0, 100_000, launch=0, grid=64, corr=1)])
    page = WhyPage(store_mod.DataStore(path, warm_up=False))
    page.__panel__()
    page.shown = True
    assert not page._exports.buttons["why"].visible and not page._exports.buttons["budget"].visible


def test_residency_and_collectives_of_small_compute_only_runs_read_as_the_cli(tmp_path, monkeypatch):
    """QA on real Nsight Systems traces (saxpy, a mock): a 2-block grid's waves read "0.00" (now up to 4 decimals),
    occupancy was rounded to even (62.5 -> 62; now one decimal, as the CLI), the limiter was the raw "shared_memory";
    a run without communication drew an empty "overlapped vs exposed" chart."""
    from overlapviz.dashboards import store as store_mod
    from overlapviz.dashboards.pages_why import CollectivesPage, ResidencyPage
    from overlapviz.testing import kernel_row, write_rows_dataset

    monkeypatch.setenv(store_mod.TABLE_CACHE_ENV, "0")
    path = write_rows_dataset(tmp_path / "ds", [kernel_row("saxpy", "compute", 7, 0, 100_000, launch=0, grid=2, corr=1),
                                                kernel_row("stencil", "compute", 7, 200_000, 300_000, launch=0, grid=64, smem=100_000,
                                                           corr=2)])  # fmt: skip
    store = store_mod.DataStore(path, warm_up=False)
    page = ResidencyPage(store)
    page.shown = True
    tab = next(o for o in page._residency().objects if isinstance(o, pn.widgets.Tabulator))
    shown = tab.value.set_index("name")
    res = store.run_residency().set_index("name")
    assert tab.formatters["waves"].format == "0,0.[0000]" and 0 < res.loc["saxpy", "waves"] < 0.01
    assert (shown["occupancy"] == (res["occupancy"] * 100).round(1)).all()
    assert set(shown["limiter"]) <= {"registers", "shared memory", "warps", "block slots"} and "shared memory" in set(shown["limiter"])
    coll = CollectivesPage(store)
    coll.shown = True
    ranks = coll._ranks()
    plots = [o for o in ranks.objects if isinstance(o, pn.Row)][0].objects
    assert len(plots) == 0  # no communication chart of nothing, no straggler chart without collectives
    assert "span_us" in next(o for o in ranks.objects if hasattr(o, "frame")).frame  # the GPU span is in the table


def test_compare_of_two_imported_traces_says_what_they_lack_instead_of_rows_of_dashes(tmp_path, monkeypatch):
    """Two imported runs (no iteration times, no sequential baseline): the deltas table shows what was measured, and one
    line names the metrics left out and what they need; the configuration line is readable (ranks, source file)."""
    from pathlib import Path

    from overlapviz.dashboards import store as store_mod
    from overlapviz.dashboards.pages import ComparePage
    from overlapviz.ingest import ingest

    monkeypatch.setenv(store_mod.TABLE_CACHE_ENV, "0")
    data = Path(__file__).parent / "data"
    path = ingest([data / "nsys" / "mfu_2gpu_before_window40ms.sqlite", data / "hta_trace_filter_2rank"], tmp_path / "ds", progress=False)
    store = store_mod.DataStore(path, warm_up=False)
    page = ComparePage(store)
    page.shown = True
    assert store.run_a != store.run_b
    title, tab = page._table().objects
    rows = tab.frame
    assert len(rows) and not ((rows["A"] == "—") & (rows["B"] == "—")).any()
    assert "overlap fraction" in set(rows["item"]) and "TimeRatio" in title.object and "overlapviz collect" in title.object
    line = store.configuration_text(store.run_a) + " " + store.configuration_text(store.run_b)
    assert "2 ranks" in line and "mfu_2gpu_before_window40ms.sqlite" in line and "n ranks" not in line


def test_compare_and_timeline_draw_runs_whose_layers_are_empty_beside_full_ones(tmp_path, monkeypatch):
    """Real ROCm traces: a run without steps or collectives (empty band, wait and collective layers) beside one with them.
    Compare drew nothing at all (HoloViews mapped the empty colour column with the other panel's strings: a TypeError
    the page never showed); the Timeline must switch between such runs both ways."""
    from pathlib import Path

    import holoviews as hv

    from overlapviz.figures import timeline as ftl
    from overlapviz.dashboards import store as store_mod
    from overlapviz.dashboards.pages import ComparePage, TimelinePage
    from overlapviz.ingest import ingest

    monkeypatch.setenv(store_mod.TABLE_CACHE_ENV, "0")
    path = ingest([Path(__file__).parent / "data" / "torch_rocm"], tmp_path / "ds", progress=False)
    store = store_mod.DataStore(path, warm_up=False)
    runs = list(store.runs["run_id"])
    bare, full = runs[0], next(r for r in runs if (store.timeline(r).frame["kind"].astype(str) == "comm").any())
    assert not len(store.timeline(bare, why=True).comm_frame(np.ones(len(store.timeline(bare).frame), bool)))
    for budget in (ftl.MAX_GLYPHS, 1):  # runs drawn whole (a copy of one drawing), then too large for that (live frames)
        monkeypatch.setattr(ftl, "MAX_GLYPHS", budget)
        for a, b in ((runs[0], runs[1]), (bare, full), (full, bare)):
            store.param.update(run_a=a, run_b=b)
            page = ComparePage(store)
            page.shown = True
            assert page.content.startswith("copy") == (budget > 1), page.content
            root = page._plot().get_root()
            assert sum(1 for _ in root.select({"type": Plot})) == 2, (a, b)
    page = TimelinePage(store)
    page.shown = True
    page._plot().get_root()
    for run in (bare, full, bare):
        store.run_id = run
        comm = next(e for e in page._last[1].values() if isinstance(e, hv.Rectangles) and "cause" in [d.name for d in e.vdims])
        assert page._last[0][0] == run and (len(comm.data) > 0) == (run == full)


def test_a_failure_while_drawing_is_said_on_the_page_and_logged(dataset, capsys):
    """An exception raised while a session's event is handled (Panel hands it to pn.config.exception_handler) is said
    above the tabs of that session's page, and its traceback goes to the server log; the next tab switch clears it."""
    from bokeh.document import Document
    from panel.io.state import set_curdoc

    from overlapviz.dashboards.app import Dashboard

    doc = Document()
    with set_curdoc(doc):
        dash = Dashboard(dataset)
        pn.panel(dash).get_root(doc)
        try:
            raise TypeError("unsupported operand type(s) for -=: 'str' and 'float'")
        except TypeError as exc:
            pn.state._handle_exception(exc)  # what Panel does with an event callback's exception
    assert dash.failure.visible and "TypeError: unsupported operand" in dash.failure.object
    assert "Traceback" in capsys.readouterr().err
    with set_curdoc(doc):
        dash.tabs.active = 1
    assert not dash.failure.visible


def test_a_static_table_escapes_text_formats_numbers_and_says_missing():
    """The plain-HTML table (short read-only tables): a kernel name is text, never markup; numbers get the CLI's
    separators and decimals and are right-aligned; a missing value reads "—"; titles replace column names; the
    height shows ``rows`` rows and scrolls beyond them."""
    import re

    from overlapviz.dashboards.common import StaticTable

    frame = pd.DataFrame({"name": ["<script>alert(1)</script>", "void k<float>(int)"], "time_us": [1234567.891, np.nan],
                          "rank": pd.array([3, None], dtype="Int64"), "note": ["a & b", None]})  # fmt: skip
    html = StaticTable(frame, titles={"time_us": "time (µs)"}, digits={"time_us": 1}, rows=1).object
    assert "<script>" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html and "k&lt;float&gt;(int)" in html
    assert "1,234,567.9" in html and "a &amp; b" in html
    cells = re.findall(r"<td>(.*?)</td>", html)
    assert cells == ["&lt;script&gt;alert(1)&lt;/script&gt;", "1,234,567.9", "3", "a &amp; b", "void k&lt;float&gt;(int)", "—", "—", "—"]
    assert "<th>time (µs)</th>" in html and "time_us" not in html
    css = StaticTable(frame, digits={"time_us": 1}).stylesheets[0]
    assert "td:nth-child(2)" in css and "td:nth-child(3)" in css and "td:nth-child(4)" not in css  # numbers, not text
    one, two, five = (int(re.search(r"--ovz-height: (\d+)px", StaticTable(frame, rows=n).object).group(1)) for n in (1, 2, 5))
    assert one < two == five  # two rows: no room kept for rows that are not there


def test_a_figure_copy_renames_every_model_even_inside_callbacks():
    """``static_plot``'s copy: every model gets an id of its own, also those reached through a map's (key, value)
    entries (a renderer's ``js_property_callbacks``: HoloViews links a legend's mute across Compare's two panels with a
    CustomJS referring back to the renderer). A copy left them with the drawing's ids and failed to decode."""
    from bokeh.core.serialization import Serializer
    from bokeh.document import Document
    from bokeh.models import CustomJS
    from bokeh.plotting import figure

    from overlapviz.dashboards.common import _copy_of

    fig = figure(title="A: x")
    a, b = fig.scatter([1, 2], [3, 4]), fig.scatter([1], [2])
    a.js_on_change("muted", CustomJS(args={"src": a, "dst": b}, code="dst.muted = src.muted"))
    b.js_on_change("muted", CustomJS(args={"src": b, "dst": a}, code="dst.muted = src.muted"))
    serialized = Serializer().serialize(fig)
    first, second = _copy_of(serialized), _copy_of(serialized)
    originals = {m.id for m in fig.references()}
    for copy in (first, second):
        ids = {m.id for m in copy.references()}
        assert len(ids) == len(originals) and not ids & originals
        renderer = copy.renderers[0]
        callback = renderer.js_property_callbacks["change:muted"][0]
        assert callback.args["src"] is renderer and callback.args["dst"] is copy.renderers[1]
    assert not {m.id for m in first.references()} & {m.id for m in second.references()}
    doc = Document()
    doc.add_root(first)
    doc.add_root(second)  # two copies in one document


def test_collectives_list_the_largest_skews_first_and_say_where_the_rest_are(tmp_path, monkeypatch):
    """The instances table of the Collectives page: largest arrival skew first; beyond ``_STATIC_ROWS`` instances only
    those, with the count and the CLI command that lists every one."""
    from pathlib import Path

    from overlapviz.dashboards import pages_why
    from overlapviz.dashboards import store as store_mod
    from overlapviz.dashboards.common import StaticTable
    from overlapviz.ingest import ingest

    monkeypatch.setenv(store_mod.TABLE_CACHE_ENV, "0")
    path = ingest([Path(__file__).parent / "data" / "hta_trace_filter_2rank"], tmp_path / "ds", progress=False)
    store = store_mod.DataStore(path, warm_up=False)
    page = pages_why.CollectivesPage(store)
    page.shown = True

    def shown():
        view = page._collectives()
        heading = next(o.object for o in view.objects if isinstance(o, pn.pane.Markdown) and "Instances" in str(o.object))
        return heading, next(o for o in view.objects if isinstance(o, StaticTable)).frame

    n = len(store.instances())
    assert n >= 4, n  # the test's premise
    heading, rows = shown()
    skew = pd.to_numeric(rows["arrival_skew_us"], errors="coerce").fillna(-1)
    assert len(rows) == n and skew.is_monotonic_decreasing and "largest of" not in heading
    monkeypatch.setattr(pages_why, "_STATIC_ROWS", 3)
    page._keys.clear()
    heading, rows = shown()
    assert len(rows) == 3 and f"the 3 largest of {n:,}" in heading and "--instances" in heading and store.run_id in heading
    assert pd.to_numeric(rows["arrival_skew_us"]).min() >= skew.iloc[3]


def _app_drawn_once(dataset):
    """The dashboard, its Timeline's run's why computed first. Without it the Timeline draws the kernels, fetches the
    why in a background thread and redraws the page when it arrives (with no session, from that thread): on a loaded
    machine that landed between the two serializations a test compares, which then differed (3 of 4 runs failed)."""
    from overlapviz.dashboards.app import build_app

    app = build_app(dataset)
    app.__panel__()
    app.store.timeline(app.store.run_id, ranks=[], why=True)
    assert app.store.why_ready()
    return app


def test_models_are_sent_as_bokeh_sends_them_without_computing_their_defaults(dataset):
    """``patches`` (serialization): Bokeh computes every property's default before dropping the defaults from what it sends; the
    version installed in the server checks first. Every page of the dashboard, drawn (under a theme, as Panel's design
    themes the figures), must serialize to the same content with either, whichever runs first."""
    from bokeh.document import Document
    from bokeh.themes import Theme

    from overlapviz.dashboards import patches
    from overlapviz.dashboards.app import PAGES

    assert patches.install_serialization()  # this Bokeh passes the check, so the server uses it
    app = _app_drawn_once(dataset)
    theme = Theme(json={"attrs": {"Title": {"text_color": "#123456"}, "Axis": {"major_label_text_font_size": "11px"}}})
    checked = 0
    for i, name in enumerate(PAGES):
        app.tabs.active = i
        doc = Document(theme=theme)
        root = app.holders[i].get_root(doc)
        doc.add_root(root)
        ours = patches.sent(root, patches._query_properties_with_values)
        assert patches.sent(root, patches._ORIGINAL_QUERY) == ours, name
        assert patches.sent(root, patches._query_properties_with_values) == ours, name
        checked += len(root.references())
    assert checked > 500  # the pages' figures, not empty spacers


def test_the_walk_over_a_document_s_models_finds_what_bokeh_s_finds(dataset):
    """``patches`` (the walk): every change of a session's document walks its models; the walk installed in the server reads
    the values the models hold instead of computing each default again. With every page of the dashboard in one
    themed document, it must find the same models in the same order as Bokeh's, walking first (Bokeh's keeps the
    defaults it makes) and again after a model's default container was filled and another was themed."""
    from bokeh.document import Document
    from bokeh.models import CustomJS, Plot
    from bokeh.themes import Theme

    from overlapviz.dashboards import patches
    from overlapviz.dashboards.app import PAGES

    assert patches.install_walk()  # this Bokeh passes the check, so the server uses it
    try:
        app = _app_drawn_once(dataset)
        doc = Document(theme=Theme(json={"attrs": {"Title": {"text_color": "#123456"}}}))
        for i, _ in enumerate(PAGES):
            app.tabs.active = i
            doc.add_root(app.holders[i].get_root(doc))
        roots = list(doc.roots)
        ours = patches.walked(roots, patches._visit_immediate, patches._visit_value)
        assert ours == patches.walked(roots, *patches._ORIGINAL_WALK)
        assert len(ours) > 300  # the pages' figures, not empty spacers
        roots.append(Plot())  # every property at its default (its toolbar: a model made per instance)
        plot = next(m for m in doc.models if isinstance(m, Plot))
        plot.js_on_event("tap", CustomJS(code=""))  # a model put into a default container that was left alone
        plot.toolbar = type(plot.toolbar)()  # a model-valued property set anew
        doc.theme = Theme(json={"attrs": {"Plot": {"background_fill_color": "#fafafa"}}})
        again = patches.walked(roots, patches._visit_immediate, patches._visit_value)
        assert again == patches.walked(roots, *patches._ORIGINAL_WALK) and again != ours
        assert patches.walked(roots) == again  # the installed walk (what collect_models uses)
    finally:
        patches.uninstall_walk()


def test_each_session_s_copy_of_a_static_figure_is_made_ahead_and_its_own(dataset):
    """``static_plot``: the drawing itself is the first session's figure, the next one's copy is made in the background
    (after no page is being drawn), and every session's models are its own."""
    import holoviews as hv

    from overlapviz.dashboards import common, store as store_mod
    from overlapviz.dashboards.common import static_plot
    from overlapviz.dashboards.store import DataStore

    store = DataStore(dataset, warm_up=False)
    drawn = []

    def build():
        drawn.append(1)
        return hv.Curve(([1, 2, 3], [4.0, 5.0, 6.5]), "x", "y").opts(title="ahead")

    def copies_made():
        for thread in list(store_mod._BACKGROUND):
            if thread.name == "overlapviz-copies":
                thread.join(30)

    first = static_plot(store, ("test ahead",), build).object
    copies_made()
    name = (store.path, store.stamp, ("test ahead",))
    spare = common._SPARES[name][1]
    second = static_plot(store, ("test ahead",), build).object
    assert second is spare and drawn == [1]
    copies_made()
    third = static_plot(store, ("test ahead",), build).object
    models = [{m.id for m in f.references()} for f in (first, second, third)]
    assert all(len(ids) > 10 for ids in models)
    assert not models[0] & models[1] and not models[1] & models[2] and not models[0] & models[2]
    assert first.title.text == second.title.text == third.title.text == "ahead"


def test_a_static_figure_is_drawn_once_per_dataset_across_server_processes(dataset, monkeypatch, tmp_path):
    """``DataStore.figure``: a drawn figure is kept in the table cache, so a restarted server copies it instead of drawing
    it again (what a cold visit of a page of figures paid); a change of the code that draws figures draws it anew, and
    with the table cache off nothing is written."""
    import holoviews as hv

    from overlapviz.dashboards import store as store_mod
    from overlapviz.dashboards.common import static_plot
    from overlapviz.dashboards.store import DataStore

    monkeypatch.setenv("OVERLAPVIZ_CACHE_DIR", str(tmp_path / "cache"))
    store = DataStore(dataset, warm_up=False)
    drawn = []

    def build():
        drawn.append(1)
        return hv.Scatter((np.arange(50), np.linspace(0.0, 1.0, 50)), "x", "y").opts(title="kept", tools=["hover"])

    first = static_plot(store, ("test kept",), build).object
    assert drawn == [1] and list((tmp_path / "cache").rglob("*.pickle"))
    store_mod._FIGURES.clear()  # a new server process: only the disk has it
    again = static_plot(store, ("test kept",), build).object
    assert drawn == [1] and again.title.text == "kept"
    source = next(r.data_source for r in again.renderers if hasattr(r, "data_source"))
    assert list(source.data["y"]) == list(np.linspace(0.0, 1.0, 50))
    assert not {m.id for m in first.references()} & {m.id for m in again.references()}
    store_mod._FIGURES.clear()
    monkeypatch.setattr(store_mod, "_figure_stamp", lambda: "other drawing code")
    static_plot(store, ("test kept",), build)
    assert drawn == [1, 1]
    store_mod._FIGURES.clear()
    monkeypatch.setenv(store_mod.TABLE_CACHE_ENV, "0")
    before = sorted((tmp_path / "cache").rglob("*.pickle"))
    static_plot(store, ("test kept, not on disk",), build)
    assert drawn == [1, 1, 1] and sorted((tmp_path / "cache").rglob("*.pickle")) == before


def test_the_stamp_of_drawn_figures_covers_the_code_that_draws_them():
    """``figure_stamp`` names every module of ``overlapviz.figures`` (a package since the layout move; a glob of
    ``figures*.py`` found none, so a figure kept on disk outlived a change to its drawing code) and the dashboard's."""
    from pathlib import Path

    import overlapviz.figures
    from overlapviz.dashboards.table_cache import figure_stamp

    stamp = figure_stamp()
    drawing = sorted(Path(overlapviz.figures.__file__).parent.glob("*.py"))
    assert len(drawing) >= 5
    assert all(f"{f.name}:{f.stat().st_size}:" in stamp for f in drawing)
    assert "pages.py:" in stamp and "store.py:" in stamp


def test_a_gpu_whose_limits_are_known_is_not_called_missing_its_device_properties(tmp_path, monkeypatch):
    """An MI300X trace (ROCm Kineto: deviceProperties with the gfx target, no registers per kernel): the Residency page
    says what stops the residency, the kernels' launch shapes, not "no device properties" (it listed `regs_per_sm`,
    which AMD's rows never have: their limits come from the architecture)."""
    from pathlib import Path

    from overlapviz.dashboards import store as store_mod
    from overlapviz.dashboards.pages_why import ResidencyPage, _no_device
    from overlapviz.ingest import ingest

    monkeypatch.setenv(store_mod.TABLE_CACHE_ENV, "0")
    path = ingest([Path(__file__).parent / "data" / "torch_rocm" / "resnet_act_checkpoint.json.gz"], tmp_path / "ds", progress=False)
    store = store_mod.DataStore(path, warm_up=False)
    assert _no_device(store) is None and _no_device(store, 0) is None
    page = ResidencyPage(store)
    page.shown = True
    said = str(page._residency().object)
    assert "launch shape" in said and "devices row" not in said and "limits are unknown" not in said, said


def test_a_run_without_collectives_shows_no_control_that_can_do_nothing(tmp_path, monkeypatch):
    """A trace with no communication kernel (HTA's multi-stream event-sync trace): Why late says the run has none, and
    shows no cause and rank filter, no "show on the Timeline" and no what-if (they were there, over "No collective of
    this cause on this rank")."""
    from pathlib import Path

    from overlapviz.dashboards import store as store_mod
    from overlapviz.dashboards.pages_why import WhyPage

    monkeypatch.setenv(store_mod.TABLE_CACHE_ENV, "0")
    from overlapviz.ingest import ingest

    path = ingest([Path(__file__).parent / "data" / "kineto_real" / "hta_event_sync_multistream"], tmp_path / "ds", progress=False)
    store = store_mod.DataStore(path, warm_up=False)
    assert not len(store.explained())
    page = WhyPage(store)
    page.shown = True
    view = page.__panel__()
    hidden = [o for o in view.objects if isinstance(o, (pn.Row, pn.widgets.Select)) and not o.visible]
    assert len(hidden) == 2  # the filters and the what-if
    page._keys.clear()  # (the view drew them: drawn again here to look at)
    assert "no communication kernels" in str(page._summary().object)
    assert isinstance(page._kernels(), pn.Spacer)


def test_a_tab_closed_mid_send_is_not_an_error_in_the_server_log():
    """A browser tab closed while the server sent it a change: Tornado's WebSocketClosedError in a send no task awaited,
    logged by asyncio as "ERROR Task exception was never retrieved" with two tracebacks (the browser suite on the
    sample traces failed on it, before and after this session's changes). It is dropped; anything else is not."""
    from tornado.websocket import WebSocketClosedError

    from overlapviz.dashboards.app import _closed_quietly

    seen = []

    class Loop:
        def default_exception_handler(self, context):
            seen.append(context["exception"])

    _closed_quietly(Loop(), {"message": "Task exception was never retrieved", "exception": WebSocketClosedError()})
    assert seen == []
    other = RuntimeError("a bug")
    _closed_quietly(Loop(), {"message": "Task exception was never retrieved", "exception": other})
    assert seen == [other]


def test_collectives_with_no_instance_on_comparable_clocks_draws_the_rest(tmp_path):
    # was: on the generated 1M-kernel, 8-rank set (no instance on comparable clocks: every arrival skew null) HoloViews
    # raised on the skew scatter's all-null column and the whole Collectives page failed to draw
    from overlapviz.dashboards.pages_why import CollectivesPage
    from overlapviz.dashboards.store import DataStore
    from overlapviz.ingest import ingest
    from overlapviz.testing import generate_trace, write_trace

    src = tmp_path / "traces" / "gen"
    src.mkdir(parents=True)
    for r in range(2):
        write_trace(generate_trace(2000, rank=r, world_size=2, seed=r), src / f"rank{r}.json.gz")
    store = DataStore(ingest([str(src)], tmp_path / "ds", progress=False), warm_up=False)
    page = CollectivesPage(store)
    inst, cells = store.instances(), store.instance_cells()
    assert inst["arrival_skew_us"].notna().any() and inst["arrival_skew_us"].isna().any()  # some compare, most not

    def titles(plots) -> set[str]:
        return {f.title.text for p in plots for pane in pn.panel(p).select(pn.pane.Bokeh) for f in pane.object.select({"type": Plot})
                if f.title is not None}  # fmt: skip

    assert "Arrival skew per instance (colour: the slowest rank)" in titles(page._collective_plots(cells, inst))
    none = inst.assign(arrival_skew_us=pd.array([pd.NA] * len(inst), dtype="Float64"))  # the 1M set's: not one skew
    shown = titles(page._collective_plots(cells, none))
    assert not [t for t in shown if t.startswith("Arrival skew")] and len(shown) >= 3, shown  # the grid and the waits
