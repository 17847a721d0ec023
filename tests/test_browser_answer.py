"""The answer on screen (issue 31): what the served dashboard shows in Debian's headless chromium, number for number
against the CLI (``overlapviz explain DS --findings/--breakdown/--instances --format json``), on the real 8-rank DLRM
trace and on the bundled H200 stand-in sweep. Every wait is on a condition of the page, never on a time."""

from __future__ import annotations

import contextlib
import re
from pathlib import Path

import pandas as pd
import pytest
from _browser import GATED_EXPLAIN, TITLES_JS, _serve, browser, downloads, idle, page_text, set_model, wait_for  # noqa: F401 (fixtures)

from overlapviz.analysis.findings import format_ns, headline
from overlapviz.export.render import find_chromium

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(find_chromium() is None, reason="Debian chromium + chromium-driver not installed"),
]
HANG_S = 300
ROOT = Path(__file__).parent.parent
ANSWER = "Where each rank's communication time went"  # the first page's breakdown, once drawn
PARTS = ("comm_ns", "overlapped_ns", "exposed_ns", "peer_wait_ns", "dependent_ns", "host_idle_ns", "exposed_other_ns")


def cli_json(dataset, *args) -> list[dict]:
    import json

    from click.testing import CliRunner

    from overlapviz.cli import main

    result = CliRunner().invoke(main, ["explain", str(dataset), *args, "--format", "json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def text(driver) -> str:
    """The page's text, runs of white space as one space."""
    return re.sub(r"\s+", " ", page_text(driver))


def open_tab(driver, name: str, shows: str) -> str:
    """Open tab ``name`` and wait until the page is idle and shows ``shows``; its text."""
    tabs = driver.execute_script("return [...new Set(Bokeh.documents[0].roots().flatMap(r => [...r.references()]))]"
                                 ".filter(m => m.type === 'panel.models.tabs.Tabs')[0].tabs.map(t => t.title)")  # fmt: skip
    set_model(driver, "panel.models.tabs.Tabs", "active", tabs.index(name))
    return wait_for(driver, lambda: idle(driver) and shows in (t := text(driver)) and t, timeout=180, what=f"{name}: {shows!r}")


def expected_headline(rows: list[dict]) -> str:
    frame = pd.DataFrame(rows)
    return headline({**{c: int(frame[c].sum()) for c in PARTS}, "n_ranks": len(frame)})


def breakdown_row(r: dict) -> str:
    """A rank's row of the breakdown table as the page reads (µs with 3 decimals: the exact ns)."""
    return " ".join([str(r["rank"]), *(f"{r[c] / 1000:,.3f}" for c in PARTS)])


def check_answer(said: str, found: list[dict], rows: list[dict], run: str) -> None:
    assert "no grid to show" not in said
    assert f"Run {run} : {expected_headline(rows)}." in said or f"Run {run}: {expected_headline(rows)}." in said, said[:1500]
    at = [said.index(f["text"]) for f in found]  # every finding, with its numbers, in the CLI's order
    assert at == sorted(at)
    for f in found:
        assert f["action"] in said
        assert f"{f['kind'].replace('_', ' ')} · {format_ns(f['time_ns'])}" in said
    for r in rows:
        assert breakdown_row(r) in said, breakdown_row(r)


@pytest.fixture(scope="module")
def dlrm(tmp_path_factory):
    from overlapviz.ingest import ingest

    return ingest([ROOT / "tests" / "data" / "kineto_real" / "param_dlrm_8rank"], tmp_path_factory.mktemp("dlrm") / "ds",
                  progress=False)  # fmt: skip


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    from overlapviz.ingest import ingest

    return ingest([ROOT / "sample_traces" / "h200_standin_sweep"], tmp_path_factory.mktemp("sweep") / "ds", progress=False)


def test_the_dlrm_trace_s_answer_on_screen_is_the_cli_s(dlrm, browser, tmp_path):
    # was: an imported trace's first page said "there is no grid to show"; Collectives painted the ranks that waited
    # as stragglers; Why late had no peer wait
    found, rows = cli_json(dlrm, "--findings"), cli_json(dlrm, "--breakdown")
    inst = pd.DataFrame(cli_json(dlrm, "--instances"))
    with contextlib.contextmanager(_serve)(dlrm, tmp_path / "serve.log") as url:
        browser.get(url)
        said = wait_for(browser, lambda: idle(browser) and ANSWER in (t := text(browser)) and t, timeout=180,
                        what="the first page's answer")  # fmt: skip
        check_answer(said, found, rows, "param_dlrm_8rank")
        assert "Rank 7 started 5 of 8 collective instances last" in said
        last = inst["straggler"].value_counts()
        said = open_tab(browser, "Collectives", "started an instance last")
        assert (f"most often the straggler (the rank that started an instance last): rank {int(last.index[0])} "
                f"({int(last.iloc[0])} of {len(inst)})") in said  # fmt: skip
        titles = wait_for(browser, lambda: (t := browser.execute_script(TITLES_JS)) and
                          "Stragglers: collective instances each rank started last" in t and t, what="the stragglers chart")  # fmt: skip
        assert not [t for t in titles if "pink" in t], titles
        peer = sum(r["peer_wait_ns"] for r in rows)
        said = open_tab(browser, "Why late", "Beside these start delays")
        assert f"the ranks waited {format_ns(peer)} of exposed time inside collectives" in said, said[:2000]


def test_the_sample_sweep_s_answer_and_comparison_on_screen_are_the_cli_s(sweep, browser, tmp_path):
    from overlapviz.dashboards.store import DataStore

    store = DataStore(sweep, warm_up=False)
    run, (a, b) = store.run_id, (store.run_a, store.run_b)
    found, rows = cli_json(sweep, "--findings", "--run", run), cli_json(sweep, "--breakdown", "--run", run)
    with contextlib.contextmanager(_serve)(sweep, tmp_path / "serve.log") as url:
        browser.get(url)
        said = wait_for(browser, lambda: idle(browser) and ANSWER in (t := text(browser)) and "The configuration grid" in t
                        and t, timeout=180, what="the first page's answer and the grid")  # fmt: skip
        check_answer(said, found, rows, run)
        said = open_tab(browser, "Compare", "The finding that changed most")
        time_of = {r: pd.DataFrame(cli_json(sweep, "--findings", "--run", r)).groupby("kind")["time_ns"].sum() for r in (a, b)}
        change = time_of[b].sub(time_of[a], fill_value=0)
        kind = change.abs().idxmax()
        assert f"The finding that changed most: {kind.replace('_', ' ')} , {format_ns(time_of[a].get(kind, 0))} in A" in said
        for r, w in ((a, "A"), (b, "B")):
            assert f"{w} {expected_headline(cli_json(sweep, '--breakdown', '--run', r))}." in said


# `overlapviz serve` whose explain waits for the file $OVZ_TEST_WHY_GATE and which takes a page's "document ready" (sent
# by the browser once it has drawn the document it pulled) only once $OVZ_TEST_READY_GATE exists, saying in its log when
# each background computation ends
GATED_READY = """
import asyncio, os
from panel.io.state import state
from tornado.ioloop import IOLoop
from overlapviz.dashboards import common
real_ready, real_background = state._schedule_on_load, common.background
def gated_ready(doc, event):
    async def later():
        while not os.path.exists(os.environ["OVZ_TEST_READY_GATE"]):
            await asyncio.sleep(0.05)
        doc.add_next_tick_callback(lambda: real_ready(doc, event))  # under the document's lock, as Bokeh calls it
    IOLoop.current().add_callback(later)
def background(target, name):
    def said():
        target()
        print("computed:", name, flush=True)
    return real_background(said, name)
state._schedule_on_load, common.background = gated_ready, background
""" + GATED_EXPLAIN


def test_an_answer_that_comes_before_the_page_is_ready_reaches_it(dlrm, browser, tmp_path):
    # was: Panel drops a change made after the browser pulled the document and before it says "document ready" (it
    # counts on a serialization still to come), so an answer computed in that window never reached the page: the
    # Overview said "Computing this run's findings…" for good (CI, under load: the browser drew for seconds). Here the
    # server takes the page's "document ready" only after the answer is computed.
    gates = {"OVZ_TEST_WHY_GATE": tmp_path / "explain", "OVZ_TEST_READY_GATE": tmp_path / "ready"}
    log = tmp_path / "serve.log"
    # a table cache of its own: the answer computed by this server (the module's other servers keep DLRM's in theirs)
    env = {**{k: str(v) for k, v in gates.items()}, "OVERLAPVIZ_CACHE_DIR": str(tmp_path / "cache")}
    with contextlib.contextmanager(_serve)(dlrm, log, code=GATED_READY, env=env) as url:
        browser.get(url)
        wait_for(browser, lambda: "Computing this run's findings" in text(browser), timeout=180,
                 what="the page drawn, its answer to come")  # fmt: skip
        gates["OVZ_TEST_WHY_GATE"].touch()
        wait_for(browser, lambda: "computed: overlapviz-answer" in log.read_text(), timeout=120, what="the answer computed")
        assert "Computing this run's findings" in text(browser)  # not ready: nothing reached the page yet
        gates["OVZ_TEST_READY_GATE"].touch()
        said = wait_for(browser, lambda: idle(browser) and ANSWER in (t := text(browser)) and t, timeout=60,
                        what="the first page's answer")  # fmt: skip
        assert "Computing this run's findings" not in said
