"""Dashboard benchmark: first render of every page (cold and warm), widget updates, zooms and exports, in headless chromium.

Not a test: prints Markdown tables. Datasets: the bundled sample traces and a generated trace of one
million kernels over 8 ranks (``overlapviz.testing.generate_trace`` per rank, ingested by
``overlapviz.ingest.ingest``, kept in --work).

* cold: a fresh ``overlapviz serve`` process; the page is opened as soon as the dashboard has loaded
  (the server's background warm-up may still be running, as it would be for a user);
* warm: a second browser session on the same server (its tables are computed);
* cold server, the browser's cache warm: fresh servers on one port opened in one chromium (a user's browser; the cold
  figures above start a new chromium, which compiles BokehJS and Panel anew each time);
* every figure is the median of --repeat fresh servers (cold) or sessions (warm); a widget update or a
  zoom runs from the change in the page until the redrawn plot is on screen.

Run against any checkout: ``PYTHONPATH=/path/to/other/checkout python benchmarks/bench_dashboard.py`` times
that code (the previous figures in docs/dashboard.md were taken that way, on the same datasets).
``OVZ_BENCH_LOG=FILE`` keeps the servers' stderr (tracebacks) in FILE. On a machine whose speed drifts, ``--interleave OLD_CHECKOUT --page PAGE`` alternates fresh servers of the two
checkouts instead (warm pages only); ``--against OLD_CHECKOUT`` alternates fresh servers of the two for the whole browser
part (cold, warm and the updates) and prints their medians side by side with the ratio.

    .venv/bin/python benchmarks/bench_dashboard.py [--kernels 1000000] [--ranks 8] [--repeat 3] [--work /tmp/ovz-bench] [--samples-only]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import socket
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

TOKEN = "overlapviz-bench-token-0123456789abcdef"
# the models in the page now (reachable from its roots): Bokeh's all_models keeps those a redraw replaced until 30 s
# after the last change, and a stale widget set there changes nothing
MODELS = "[...new Set(Bokeh.documents[0].roots().flatMap(r => [...r.references()]))]"
TITLES_JS = f"return {MODELS}.filter(m => m.type === 'Title').map(m => m.text)"
CANVAS_JS = """
function all(root, out) { root.querySelectorAll('canvas').forEach(c => out.push(c));
  root.querySelectorAll('*').forEach(e => { if (e.shadowRoot) all(e.shadowRoot, out); }); return out; }
return all(document, []).filter(c => { const r = c.getBoundingClientRect(); if (r.width < 100 || r.height < 100) return false;
  const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data; const s = new Set();
  for (let i = 0; i < d.length; i += 4 * 53) s.add((d[i] << 16) | (d[i + 1] << 8) | d[i + 2]); return s.size >= 8; }).length;
"""
TEXT_JS = """function t(root){ let s = ''; const w = document.createTreeWalker(root, NodeFilter.SHOW_TEXT);
  while (w.nextNode()) { const p = w.currentNode.parentNode; if (p && !['STYLE', 'SCRIPT'].includes(p.nodeName)) s += w.currentNode.textContent + ' '; }
  root.querySelectorAll('*').forEach(e => { if (e.shadowRoot) s += t(e.shadowRoot); }); return s; } return t(document)"""
SET_JS = f"""const [type, prop, value, title] = arguments;
const m = {MODELS}.find(m => m.type.endsWith(type) && (title === null || m.title === title));
m[prop] = value;"""
COMPUTING = "Computing this run's findings"  # the Overview's notice while its answer is computed
IDLE_JS = "return !!(window.Bokeh && Bokeh.documents.length && Bokeh.documents[0].is_idle)"
PLOT_VIEW = """const pv = [...Bokeh.index.all_views()].filter(v => v.renderer_views && v.model.title && v.model.title.text
  && v.model.title.text.startsWith(arguments[0]) && v.el.isConnected)[0];"""
# what each page shows once drawn (a plot title, or the notice a dataset without it gets); old and new page contents
MARKERS = {
    # (the previous Overview titled each heatmap "workload · setup"; one of imported traces shows the run's answer)
    "Overview": ["TimeRatio", "no grid to show", " · ", "Breakdown per rank", "has no communication"],
    "Timeline": ["Timeline of"],
    "Compare": ["A: ", "Compare needs two", "Needs two runs"],
    "Why late": ["Late-start time by cause", "no communication kernels"],
    "Collectives": ["Communication per rank"],
    # (the previous Residency page was the why page with the residency plot at its bottom; the previous Ranks is Collectives)
    "Residency": ["Resident blocks per SM", "Residency per kernel", "No residency"],
    "Ranks": ["Communication per rank"],
}


def big_dataset(work: Path, n: int, ranks: int) -> Path:
    """``n`` kernels over ``ranks`` ranks of one job (one Kineto trace per rank), ingested once into ``work``."""
    from overlapviz.ingest import ingest
    from overlapviz.testing import generate_trace, write_trace

    out = work / f"generated-{n}-{ranks}r"
    if (out / "dataset.json").exists():
        return out
    src = work / f"generated-{n}-{ranks}r-traces" / "gen1m"
    src.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    for r in range(ranks):
        path = src / f"rank{r}.json.gz"
        if not path.exists():
            write_trace(generate_trace(n // ranks, rank=r, world_size=ranks, seed=0), path)
    t1 = time.perf_counter()
    ingest([str(src)], out, overwrite=True)
    print(f"generated {n:,} kernels over {ranks} ranks in {t1 - t0:.1f} s, ingested in {time.perf_counter() - t1:.1f} s", file=sys.stderr)
    return out


def _size(dataset: Path) -> str:
    """The dataset's kernels and ranks in words (its metadata and ranks table)."""
    from overlapviz.dataset import schema

    n = int(schema.read_metadata(str(dataset)).get("n_kernels", 0))
    ranks = schema.read_frame(str(dataset), "ranks")
    return f"{n:,} kernels, {ranks[['run_id', 'rank']].drop_duplicates().shape[0]} ranks"


def wait(predicate, timeout=120.0) -> float:
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < timeout:
        try:
            if predicate():
                return time.perf_counter() - t0
        except Exception:  # scripts still loading
            pass
        time.sleep(0.03)
    raise TimeoutError


PROFILE_ENV = "OVZ_BENCH_PROFILE"  # a directory: each server runs under cProfile (its main thread: the sessions' pages)


def _server_code() -> str:
    """The server's ``-c`` program: the CLI, under cProfile into $OVZ_BENCH_PROFILE/serve-PID.prof when that is set (written
    when the server stops: ``close`` terminates it, the CLI stops its loop on SIGTERM)."""
    if not os.environ.get(PROFILE_ENV):
        return "from overlapviz.cli import main; main()"
    return ("import cProfile, os; from overlapviz.cli import main; p = cProfile.Profile(); p.enable()\ntry: main()\n"
            f"finally: p.disable(); p.dump_stats(os.path.join({os.environ[PROFILE_ENV]!r}, f'serve-{{os.getpid()}}.prof'))")


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (every thread)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Session:
    """One ``overlapviz serve`` process and a headless chromium on it."""

    def __init__(self, dataset: Path):
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service

        from overlapviz.export.render import chromium_options, find_chromium

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        env = dict(os.environ, OVERLAPVIZ_TOKEN=TOKEN)
        # -P: the server imports the checkout on PYTHONPATH (another one's, for the side-by-side figures), not the current
        # directory's (run from a clone's root, `-c` would put it first)
        self.log = open(os.environ.get("OVZ_BENCH_LOG", os.devnull), "w")  # (closed by close())
        self.proc = subprocess.Popen([sys.executable, "-P", "-c", _server_code(), "serve", str(dataset),
                                      "--port", str(self.port), "--no-show"], stdout=subprocess.DEVNULL, stderr=self.log, env=env)  # fmt: skip
        browser, driver_path = find_chromium()
        self.driver = webdriver.Chrome(service=Service(driver_path), options=chromium_options(browser, width=1400, height=1100))
        self.url = f"http://127.0.0.1:{self.port}/?token={TOKEN}"
        t0 = time.perf_counter()
        wait(lambda: socket.create_connection(("127.0.0.1", self.port), timeout=1).close() or True)
        self.listening = time.perf_counter() - t0  # the server's start (chromium's launch overlaps it)

    def cpu(self) -> tuple[float, float]:
        """(the server's CPU seconds so far, the page's main-thread task seconds so far in chromium): what a page costs
        whatever the machine's load, where its wall time is the share of two cores it got."""
        if not getattr(self, "_perf", False):
            self.driver.execute_cdp_cmd("Performance.enable", {})
            self._perf = True
        metrics = {m["name"]: m["value"] for m in self.driver.execute_cdp_cmd("Performance.getMetrics", {})["metrics"]}
        return _cpu_seconds(self.proc.pid), metrics.get("TaskDuration", float("nan"))

    def js(self, script, *args):
        return self.driver.execute_script(script, *args)

    def shown(self, page: str) -> bool:
        if not self.js(IDLE_JS):
            return False
        titles = " ".join(self.js(TITLES_JS))
        if any(m in titles for m in MARKERS[page]) and self.js(CANVAS_JS) > 0:
            return True
        text = self.js(TEXT_JS)
        return any(m in text for m in MARKERS[page] if m[0].islower() or m.startswith(("Compare", "Needs", "No ")))

    def load(self, timeout: float = 120.0) -> float:
        """Open the dashboard: the seconds until the Overview is drawn with its answer. ``painted``: the seconds until
        it first showed (since 2026-12-07 the page is sent at once, saying its answer is being computed)."""
        t0 = time.perf_counter()
        self.driver.get(self.url)
        self.painted = None

        def drawn():
            if not self.js(IDLE_JS):
                return False
            computing = COMPUTING in self.js(TEXT_JS)
            if self.painted is None and (computing or self.shown("Overview")):
                self.painted = time.perf_counter() - t0
            return not computing and self.shown("Overview")

        wait(drawn, timeout)
        return time.perf_counter() - t0

    def pages(self) -> list[str]:
        return self.js(f"return {MODELS}.filter(m => m.type === 'panel.models.tabs.Tabs')[0].tabs.map(t => t.title)")

    def open(self, page: str) -> float:
        t0 = time.perf_counter()
        self.js(SET_JS, "panel.models.tabs.Tabs", "active", self.pages().index(page), None)
        time.sleep(0.05)
        wait(lambda: self.shown(page), 60.0)  # (a page that fails to draw: "failed")
        return time.perf_counter() - t0

    def title(self, prefix: str) -> str:
        return self.js(PLOT_VIEW + "return pv ? pv.model.title.text : '';", prefix)

    def zoom(self, prefix: str, clicks: int = 1) -> float:
        """One turn of the wheel over the plot (zoom in) until the server has redrawn the window (the title's kernel
        count changes) and the page is idle."""
        from selenium.webdriver.common.action_chains import ActionChains, ScrollOrigin

        before = self.title(prefix)
        el = self.js(PLOT_VIEW + "return pv.canvas_view.events_el;", prefix)
        spot = self.js(PLOT_VIEW + "return [pv.frame.bbox.hcenter, pv.frame.bbox.vcenter];", prefix)
        dx, dy = int(spot[0] - el.size["width"] / 2), int(spot[1] - el.size["height"] / 2)
        t0 = time.perf_counter()
        for _ in range(clicks):
            ActionChains(self.driver).scroll_from_origin(ScrollOrigin.from_element(el, dx, dy), 0, -600).perform()
        wait(lambda: self.title(prefix) != before and self.js(IDLE_JS), 30)
        return time.perf_counter() - t0

    def change(self, model_type: str, title: str, value, done, prop: str = "value") -> float:
        t0 = time.perf_counter()
        self.js(SET_JS.replace("m[prop]", "m[prop]"), model_type, prop, value, title)
        time.sleep(0.05)
        wait(lambda: done() and self.js(IDLE_JS), 30)
        return time.perf_counter() - t0

    def close(self) -> None:
        self.driver.quit()
        self.proc.terminate()
        self.proc.wait(timeout=30)
        self.log.close()


def bench_browser(dataset: Path, repeat: int) -> dict:
    """``repeat`` + 1 fresh servers: the first with nothing computed (an empty table cache), then ``repeat`` cold ones
    (a fresh server whose tables an earlier one left on disk), each with a second, warm session."""
    out: dict = defaultdict(list)
    for rep in range(repeat + 1):
        _one_server(dataset, "first ever: nothing computed" if rep == 0 else "cold", out)
    return _medians(out)


def _medians(out: dict) -> dict:
    return {k: statistics.median(v) if all(x == x for x in v) else FAILED for k, v in out.items()}


def _one_server(dataset: Path, cold: str, out: dict) -> None:
    """A fresh server: every page opened in a fresh browser (``cold``), then again in a second session (warm), then the
    updates; each time appended to ``out[measure]``."""
    s = Session(dataset)
    try:
        out[f"Overview first render ({cold})"].append(s.load())
        out[f"Overview first paint ({cold})"].append(s.painted)
        pages = s.pages()
        for page in pages[1:]:
            _try(out, f"{page} first render ({cold})", lambda page=page: s.open(page))
        s.driver.get("about:blank")
        out["Overview first render (warm)"].append(s.load())
        out["Overview first paint (warm)"].append(s.painted)
        for page in pages[1:]:
            _try(out, f"{page} first render (warm)", lambda page=page: s.open(page))
        _updates(s, out)
    finally:
        s.close()


def bench_against(dataset: Path, other: Path, repeat: int) -> None:
    """Side by side on a shared machine: ``repeat`` + 1 rounds, each a fresh server of the ``other`` checkout
    (``PYTHONPATH``) then one of this one, as ``bench_browser`` times them (the first round with nothing computed, each
    checkout with a table cache of its own); printed as medians, before / after and their ratio, and every sample."""
    here = str(Path(__file__).resolve().parent.parent)
    codes = {"before": str(other), "after": here}
    caches = {label: tempfile.mkdtemp(prefix=f"ovz-bench-cache-{label}-") for label in codes}
    out: dict = {label: defaultdict(list) for label in codes}
    for rep in range(repeat + 1):
        for label, code in codes.items():
            os.environ["PYTHONPATH"], os.environ["OVERLAPVIZ_CACHE_DIR"] = code, caches[label]
            _one_server(dataset, "first ever: nothing computed" if rep == 0 else "cold", out[label])
    before, after = _medians(out["before"]), _medians(out["after"])
    print("| measure | before | after | after / before | samples before · after |\n|---|---|---|---|---|")
    for key in dict.fromkeys([*before, *after]):
        b, a = before.get(key, FAILED), after.get(key, FAILED)
        ratio = a / b if a == a and b == b and b else FAILED
        every = " · ".join(" ".join("—" if x is None or x != x else f"{x:.2f}" for x in out[w].get(key, [])) for w in codes)
        print(f"| {key} | {_s(b)} | {_s(a)} | {_s(ratio)} | {every} |", flush=True)
    return before, after


def _s(x) -> str:
    return "failed" if x is None or x != x else f"{x:.2f}"


def target(measure: str) -> str | None:
    """Issue 36's target for a measure: a page's first render cold 1.5 s, warm 1 s (a fresh browser session), a widget
    update or a zoom 0.2 s; the first page of the 10M-kernel set 3 s."""
    if "with its answer" in measure or "first paint" in measure:
        return "<= 3 s (10M kernels, 64 ranks)" if "10,000,000" in measure else None
    if "first render (warm)" in measure:
        return "<= 1 s"
    if "first render (cold)" in measure:
        return "<= 1.5 s"
    if "(widget update)" in measure or "zoom" in measure:
        return "<= 0.2 s"
    return None


def write_json(path: Path, name: str, medians: dict, baseline: dict | None, baseline_label: str | None, note: str,
               load_before: float) -> None:  # fmt: skip
    """The measures in readme_table's format (benchmarks/results/*.json; the README's table is made from them)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import readme_table

    rows = [readme_table.row(k, None if v != v else round(v, 3),
                             baseline=None if baseline is None or baseline.get(k, FAILED) != baseline.get(k, FAILED)
                             else round(baseline[k], 3), baseline_label=baseline_label if baseline else None,
                             target=target(f"{name}: {k}")) for k, v in medians.items()]  # fmt: skip
    readme_table.write(path, path.stem, f"The dashboard in headless chromium (issue 36, item 3): {name}", rows, note=note,
                       load_before=load_before)


def bench_restarted(dataset: Path, repeat: int) -> dict:
    """The Overview of ``repeat`` fresh servers (tables on disk: cold) on one port, in one chromium kept open: a user's
    browser, whose cache already holds BokehJS and Panel (their URLs carry a version hash, not the server's launch). The
    cold figures of ``bench_browser`` start a new chromium each time: they include compiling ~3.5 MB of JavaScript."""
    out: dict = defaultdict(list)
    s = Session(dataset)
    try:
        s.load()
        for _ in range(repeat):
            s.driver.get("about:blank")
            s.proc.terminate()
            s.proc.wait(timeout=30)
            s.proc = subprocess.Popen([sys.executable, "-P", "-c", _server_code(), "serve", str(dataset),
                                       "--port", str(s.port), "--no-show"], stdout=subprocess.DEVNULL, stderr=s.log,
                                      env=dict(os.environ, OVERLAPVIZ_TOKEN=TOKEN))  # fmt: skip
            wait(lambda: socket.create_connection(("127.0.0.1", s.port), timeout=1).close() or True)
            out["Overview first render (cold server, the browser's cache warm)"].append(s.load())
    finally:
        s.close()
    return {k: statistics.median(v) for k, v in out.items()}


FAILED = float("nan")  # an update that never showed (within 30 s) or could not be made: printed as "failed"


def _try(out: dict, label: str, measure) -> None:
    try:
        out[label].append(measure())
    except Exception:  # noqa: BLE001  (an older checkout's bug is a result too)
        out[label].append(FAILED)


def _updates(s: Session, out: dict) -> None:
    """Widget updates and zooms, on a warm server."""
    s.open("Overview")
    if "TimeRatio" in " ".join(s.js(TITLES_JS)):  # (until the Speedup heatmap is drawn: its title says so, "No Speedup …" too)
        _try(out, "Overview metric change (widget update)", lambda: s.change(
            "RadioButtonGroup", None, 1, lambda: "Speedup" in " ".join(s.js(TITLES_JS)) and s.js(CANVAS_JS) > 0, prop="active"))
        s.js(SET_JS, "RadioButtonGroup", "active", 0, None)
        time.sleep(1.0)  # the server redraws the Overview for the reset: a zoom sent meanwhile would queue behind it
        wait(lambda: s.js(IDLE_JS), 30)
    s.open("Timeline")
    time.sleep(1.0)  # the Timeline's why may still be coming (a redraw); the zoom is timed on a settled page
    _try(out, "Timeline zoom (wheel, redrawn)", lambda: s.zoom("Timeline of"))
    ranks = s.js(f"return {MODELS}.find(m => m.type === 'MultiChoice').options")
    if ranks and len(ranks) > 1:
        _try(out, "Timeline rank filter (widget update)", lambda: s.change(
            "MultiChoice", "Ranks (empty: all)", [ranks[1]],
            lambda: all(str(t).startswith(f"rank {ranks[1]}") for t in s.js(PLOT_VIEW + "return [...pv.model.left[0].major_label_overrides.values()]", "Timeline of"))))  # fmt: skip
        s.js(SET_JS, "MultiChoice", "value", [], "Ranks (empty: all)")
        wait(lambda: s.js(IDLE_JS), 60)
    labels = s.js(f"return {MODELS}.find(m => m.type === 'panel.models.widgets.CustomSelect' && m.title === 'Configuration').options")
    labels = [o if isinstance(o, str) else o[0] for o in labels]
    if len(labels) > 1:
        run = labels[1].split(" — ")[0]
        _try(out, "Timeline run switch (widget update)", lambda: s.change(
            "panel.models.widgets.CustomSelect", "Configuration", labels[1], lambda: f"Timeline of {run}" in s.title("Timeline of")))
    pages = s.pages()
    if "Compare" in pages:
        s.open("Compare")
        if "A: " in " ".join(s.js(TITLES_JS)):
            _try(out, "Compare zoom (wheel, both redrawn)", lambda: s.zoom("A: "))
    # a page opened three or more tabs ago (taken out of the session's document since 8df99e9, drawn again)
    for page in ("Why late", "Collectives"):
        if page in pages:
            _try(out, f"{page} reopened (3+ tabs ago)", lambda page=page: s.open(page))


def bench_first_ever(dataset: Path, repeat: int) -> None:
    """``repeat`` fresh servers, each with an empty table cache: every page opened once, one after the other as soon as the
    previous one is drawn (no time to look at a page: the warm-up gets none), printed one line per server."""
    for _ in range(repeat):
        os.environ["OVERLAPVIZ_CACHE_DIR"] = tempfile.mkdtemp(prefix="ovz-bench-cache-")
        s = Session(dataset)
        try:
            out = [("Overview", s.load())] + [(page, s.open(page)) for page in s.pages()[1:]]
        finally:
            s.close()
        print(" / ".join(f"{p} {t:.2f}" for p, t in out) + f" · sum {sum(t for _, t in out):.2f}", flush=True)


def bench_first_page(dataset: Path, repeat: int, timeout: float, computed: bool = False, other: Path | None = None) -> dict:
    """The first page alone, as a user opening a big dataset sees it: ``repeat`` + 1 fresh servers, each opened once in a
    fresh chromium as soon as it listens; the first with an empty table cache (nothing computed), then cold ones (the
    tables an earlier server left on disk). Each: the seconds until the Overview first showed (its "Computing…" notice
    or its answer) and until its answer was on screen, and the server's start (until it listened). ``computed``: the
    table cache holds the tables already (every server is cold). ``other``: each round is a server of that checkout
    (``PYTHONPATH``) then one of this one, sharing the table cache (their analysis code must be the same); returns
    ``{"before": medians, "after": medians}``."""
    here = str(Path(__file__).resolve().parent.parent)
    codes = {"before": str(other), "after": here} if other is not None else {"after": os.environ.get("PYTHONPATH")}
    out: dict = {label: defaultdict(list) for label in codes}
    for rep in range(repeat + 1):
        cold = "first ever: nothing computed" if rep == 0 and not computed else "cold"
        for label, code in codes.items():
            if code is not None:
                os.environ["PYTHONPATH"] = code
            s = Session(dataset)
            try:
                out[label][f"server start, until it listens ({cold})"].append(s.listening)
                try:
                    answer = s.load(timeout)
                except TimeoutError:
                    answer = FAILED
                out[label][f"Overview first paint ({cold})"].append(s.painted if s.painted is not None else FAILED)
                out[label][f"Overview with its answer ({cold})"].append(answer)
            finally:
                s.close()
            print(f"# server {rep} ({label}): " + ", ".join(f"{k} {_s(v[-1])}" for k, v in out[label].items() if cold in k),
                  flush=True)  # fmt: skip
    medians = {label: _medians(o) for label, o in out.items()}
    return medians if other is not None else medians["after"]


def bench_cpu(dataset: Path, repeat: int) -> None:
    """What each page costs on a loaded machine: ``repeat`` fresh servers (the first fills the table cache and is not
    counted), every page opened in a fresh browser (cold) then in a second session (warm), each with its wall seconds, the
    server's CPU seconds (every thread) and chromium's main-thread task seconds during it; printed as medians."""
    out: dict = defaultdict(list)
    for rep in range(repeat + 1):
        s = Session(dataset)
        try:
            for session in ("cold", "warm"):
                if session == "warm":
                    s.driver.get("about:blank")
                    time.sleep(1.0)
                before = s.cpu()
                wall = s.load()
                after = s.cpu()
                rows = [("Overview", wall, after[0] - before[0], after[1] - before[1] if after[1] >= before[1] else after[1])]
                for page in s.pages()[1:]:
                    time.sleep(0.5)
                    before = s.cpu()
                    try:
                        wall = s.open(page)
                    except TimeoutError:
                        wall = FAILED
                    after = s.cpu()
                    rows.append((page, wall, after[0] - before[0], after[1] - before[1]))
                if rep:
                    for page, *values in rows:
                        out[(page, session)].append(values)
        finally:
            s.close()
    print("| page | session | wall s | server CPU s | browser main thread s |\n|---|---|---|---|---|")
    for (page, session), values in out.items():
        med = [statistics.median(v[i] for v in values) for i in range(3)]
        print(f"| {page} | {session} | " + " | ".join(_s(x) for x in med) + " |", flush=True)


def bench_interleaved(dataset: Path, page: str, other: Path, rounds: int, visits: int) -> None:
    """Side by side on a machine whose speed drifts: ``rounds`` pairs of fresh servers, one of the ``other`` checkout
    (``PYTHONPATH``) then one of this one, each with every table computed (every page opened once), then ``visits``
    new sessions each opening the Overview and ``page`` (warm), printed as one line per pair."""
    here = str(Path(__file__).resolve().parent.parent)
    for _ in range(rounds):
        line = []
        for label, code in (("before", str(other)), ("after", here)):
            os.environ["PYTHONPATH"] = code
            s = Session(dataset)
            try:
                s.load()
                for p in s.pages()[1:]:
                    s.open(p)
                time.sleep(3)  # the warm-up's last tables
                times = []
                for _ in range(visits):
                    s.driver.get("about:blank")
                    time.sleep(2)
                    overview = s.load()
                    time.sleep(1.5)
                    times.append(f"{overview:.2f}/{s.open(page):.2f}")
            finally:
                s.close()
            line.append(f"{label}: {' '.join(times)}")
        print(" | ".join(line), flush=True)


def bench_exports(dataset: Path) -> dict:
    """Every page's export (PNG), as the dashboard's button makes it: from the warm store, one chromium kept."""
    from overlapviz.export import render as export
    from overlapviz.dashboards.store import DataStore

    try:
        store = DataStore(dataset, warm_up=False)
        extra = {"source": store, "reuse_browser": True}
    except TypeError:  # an older checkout: its export reads and computes everything itself
        store, extra = DataStore(dataset), {}
    out = {}
    for figure in export.FIGURES:
        kw = {"runs": [store.run_id]} if figure not in ("heatmap", "speedup", "compare") else {}
        if figure == "compare":
            if store.run_a == store.run_b:
                continue
            kw = {"runs": [store.run_a, store.run_b]}
        try:
            if extra:
                export.build_figure(dataset, figure, source=store, **kw)  # compute the store's tables (warm), not timed
        except ValueError:
            continue
        times = []
        for _ in range(2):
            t0 = time.perf_counter()
            try:
                export.export_dataset_figure(dataset, figure, Path("/tmp") / f"ovz-bench-{figure}.png", **extra, **kw)
            except ValueError:
                break
            times.append(time.perf_counter() - t0)
        if not times:
            continue
        out[f"export {figure} (PNG)"] = min(times[1:] or times)
    return out


def bench_server_side(dataset: Path) -> dict:
    """The tables the store keeps, computed once per dataset (what the warm-up does; the table cache off), read back
    from the table cache (what a restarted server does), and timeline frames."""
    from overlapviz.figures import timeline as ftl
    from overlapviz.dashboards import store as st

    out = {}
    steps = [("config_table", lambda s: s.config_table()), ("explain", lambda s: s.explained("*")),
             ("kernel_residency", lambda s: s.kernel_residency()), ("summarize + blockers", lambda s: (s.summary(), s.blockers())),
             ("collective instances", lambda s: s.instance_cells()), ("analyze (per rank)", lambda s: s.metrics())]  # fmt: skip
    for mode, env in (("compute", "0"), ("write", "1"), ("read from the table cache", "1")):
        os.environ[st.TABLE_CACHE_ENV] = env
        st._TABLES.clear()
        s = st.DataStore(dataset, warm_up=False)
        total = 0.0
        for label, f in steps:
            t0 = time.perf_counter()
            try:
                f(s)
            except ValueError:
                pass
            dt = time.perf_counter() - t0
            total += dt
            if mode == "compute":
                out[f"compute {label}"] = dt
        if mode != "write":
            out[f"{mode}: every table of the pages"] = total
    os.environ.pop(st.TABLE_CACHE_ENV, None)
    t0 = time.perf_counter()
    data = s.timeline()
    out["timeline data of a run (kernels read, why, waits)"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    ftl.timeline_view(data, None)
    out["timeline frame, whole run"] = time.perf_counter() - t0
    lo, hi = data.x_extent
    t0 = time.perf_counter()
    ftl.timeline_view(data, (lo, lo + (hi - lo) / 2000))
    out["timeline frame, zoomed (glyphs)"] = time.perf_counter() - t0
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernels", type=int, default=1_000_000)
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--work", type=Path, default=Path("/tmp/ovz-bench"))
    parser.add_argument("--samples-only", action="store_true", help="skip the generated dataset")
    parser.add_argument("--big-only", action="store_true", help="skip the sample traces")
    parser.add_argument("--dataset", type=Path, metavar="DATASET",
                        help="an ingested dataset instead of the generated one (--kernels and --ranks then only name it)")
    parser.add_argument("--no-exports", action="store_true")
    parser.add_argument("--first-ever", type=int, default=0, metavar="N",
                        help="only N fresh servers with nothing computed, every page opened back to back (one line each)")
    parser.add_argument("--browser-only", action="store_true", help="no server-side table timings (an older checkout has no store API for them)")
    parser.add_argument("--interleave", type=Path, metavar="OTHER_CHECKOUT",
                        help="only pairs of warm servers, OTHER_CHECKOUT's then this one's (--page, --repeat pairs, --visits): "
                             "warm Overview/PAGE seconds per new session")
    parser.add_argument("--against", type=Path, metavar="OTHER_CHECKOUT",
                        help="only the browser part, a fresh server of OTHER_CHECKOUT then one of this one per round "
                             "(--repeat + 1 rounds): medians before / after and their ratio")
    parser.add_argument("--first-page", action="store_true",
                        help="only the Overview (first paint and its answer) of --repeat + 1 fresh servers, the first with nothing computed")
    parser.add_argument("--cpu", action="store_true", help="only each page's wall, server CPU and browser CPU seconds (--repeat fresh servers)")
    parser.add_argument("--json", type=Path, metavar="PATH",
                        help="with --against or --first-page: also write the medians as a result file (benchmarks/readme_table.py's format)")
    parser.add_argument("--note", default="", help="the result file's note (method, load)")
    parser.add_argument("--first-page-against", type=Path, metavar="OTHER_CHECKOUT",
                        help="--first-page alternating a server of OTHER_CHECKOUT and one of this one (the same analysis code)")
    parser.add_argument("--cache", type=Path, metavar="DIR",
                        help="--first-page's table cache (default: a new one, so the first server computes everything)")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds --first-page waits for the answer")
    parser.add_argument("--page", default="Collectives", help="the page --interleave opens")
    parser.add_argument("--visits", type=int, default=3, help="new sessions per server with --interleave")
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    import overlapviz
    import overlapviz.dashboards
    from overlapviz.ingest import samples

    # the dashboards live outside the package in a checkout (pyproject maps them in): with PYTHONPATH=OTHER_CHECKOUT the
    # editable install would still serve THIS checkout's dashboards unless OTHER_CHECKOUT/overlapviz/dashboards exists
    code = Path(overlapviz.__file__).resolve().parent.parent
    dash = Path(overlapviz.dashboards.__file__).resolve().parent.parent
    if code != dash:
        sys.exit(f"overlapviz comes from {code} but overlapviz.dashboards from {dash}: the timings would mix two checkouts "
                 f"(ln -s ../dashboards {code}/overlapviz/dashboards)")
    print(f"# code: {code}")
    datasets = {} if args.big_only else {"sample traces": samples.sample_dataset(cache=args.work / "cache")}
    if args.dataset is not None:
        datasets[f"{args.dataset.name}: {_size(args.dataset)}"] = args.dataset.resolve()
    elif not args.samples_only:
        datasets[f"generated {args.kernels:,} kernels, {args.ranks} ranks"] = big_dataset(args.work, args.kernels, args.ranks)
    load = os.getloadavg()[0]
    print(f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load average {load:.2f}, {os.cpu_count()} CPUs")
    for name, path in datasets.items():
        if args.interleave:
            print(f"\n## {name} ({path}): warm Overview / {args.page} (s), {args.interleave} then this checkout")
            bench_interleaved(path, args.page, args.interleave.resolve(), args.repeat, args.visits)
            continue
        if args.against:
            print(f"\n## {name} ({path}): {args.against} (before) against this checkout (after), alternating\n")
            before, after = bench_against(path, args.against.resolve(), args.repeat)
            if args.json:
                old = subprocess.run(["git", "-C", str(args.against), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
                write_json(args.json, name, after, before, old.stdout.strip() or str(args.against), args.note, load)
            continue
        if args.cpu:
            print(f"\n## {name} ({path}): wall and CPU per page, medians of {args.repeat} fresh servers (tables on disk)\n")
            os.environ["OVERLAPVIZ_CACHE_DIR"] = tempfile.mkdtemp(prefix="ovz-bench-cache-")
            bench_cpu(path, args.repeat)
            continue
        if args.first_page:
            print(f"\n## {name} ({path}): the first page, {args.repeat + 1} fresh servers\n\n| measure | seconds |\n|---|---|")
            cache = args.cache or Path(tempfile.mkdtemp(prefix="ovz-bench-cache-"))
            computed = (cache / "tables").is_dir() and any((cache / "tables").iterdir())
            os.environ["OVERLAPVIZ_CACHE_DIR"] = str(cache)
            other = args.first_page_against.resolve() if args.first_page_against else None
            medians = bench_first_page(path, args.repeat, args.timeout, computed, other)
            before, after = (medians["before"], medians["after"]) if other else (None, medians)
            for label, secs in after.items():
                print(f"| {label} | {_s(secs)} |" + (f" before: {_s(before.get(label, FAILED))} |" if before else ""), flush=True)
            if args.json:
                old = None if other is None else subprocess.run(["git", "-C", str(other), "rev-parse", "--short", "HEAD"],
                                                                capture_output=True, text=True).stdout.strip()  # fmt: skip
                write_json(args.json, name, after, before, old, args.note, load)
            continue
        if args.first_ever:
            print(f"\n## {name} ({path}): first ever, pages back to back")
            bench_first_ever(path, args.first_ever)
            continue
        print(f"\n## {name} ({path})\n\n| measure | seconds |\n|---|---|")
        # a table cache of the benchmark's own: the first server finds nothing computed
        os.environ["OVERLAPVIZ_CACHE_DIR"] = tempfile.mkdtemp(prefix="ovz-bench-cache-")
        parts = [bench_browser(path, args.repeat), bench_restarted(path, args.repeat)]
        parts += [] if args.browser_only else [bench_server_side(path)]
        if not args.no_exports:
            parts.append(bench_exports(path))
        for part in parts:
            for label, secs in part.items():
                print(f"| {label} | {'failed' if secs != secs else f'{secs:.2f}'} |", flush=True)


if __name__ == "__main__":
    main()
