"""The dashboard served by ``overlapviz serve`` and exported files, driven in Debian's headless chromium as a user would.

One server per dataset for the whole module (started through the CLI on a free 127.0.0.1 port with a
known token, stopped at the end): every page must draw, widgets and zoom must redraw, hover must show
the right fields, every export button must produce its file, partial datasets must say why, and no
request may leave 127.0.0.1. Each bug this module names was seen in the dashboard once; its test
fails on the code that had it. Screenshots of each page: see OVERLAPVIZ_SCREENSHOTS below.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
from pathlib import Path
from urllib.parse import urlparse

import pytest

from overlapviz.export.render import find_chromium

from _browser import GATED_EXPLAIN, MODELS, SAMPLES, TITLES_JS, _serve, browser, dataset, downloads, idle, page_text, set_model, wait_for  # noqa: F401 (shared helpers and fixtures)

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(find_chromium() is None, reason="Debian chromium + chromium-driver not installed"),
]

# screenshots of each page go to a temporary folder, or to OVERLAPVIZ_SCREENSHOTS when set (the README's
# come from `OVERLAPVIZ_SCREENSHOTS=docs/screenshots OVERLAPVIZ_BROWSER_DATASET=samples pytest tests/test_browser.py`,
# which serves the bundled sample traces instead of the synthetic grid)
SCREENSHOTS_ENV = os.environ.get("OVERLAPVIZ_SCREENSHOTS")
# a plot title each page must show once drawn
PAGE_TITLES = {"Overview": "TimeRatio", "Timeline": "Timeline of", "Why late": "Late-start time by cause",
               "Collectives": "Communication per rank", "Residency": "Resident blocks per SM", "Compare": "A: "}  # fmt: skip
LOCAL_HOSTS = {"127.0.0.1", "localhost"}

# every <canvas>, through Bokeh's shadow roots, with its size and the number of distinct colours sampled
CANVASES_JS = """
function all(root, out) {
  root.querySelectorAll('canvas').forEach(c => out.push(c));
  root.querySelectorAll('*').forEach(e => { if (e.shadowRoot) all(e.shadowRoot, out); });
  return out;
}
return all(document, []).map(c => {
  const r = c.getBoundingClientRect();
  if (r.width < 100 || r.height < 100) return null;
  const ctx = c.getContext('2d');
  if (!ctx) return null;
  const d = ctx.getImageData(0, 0, c.width, c.height).data;
  const colours = new Set();
  for (let i = 0; i < d.length; i += 4 * 53) colours.add((d[i] << 16) | (d[i + 1] << 8) | d[i + 2] | (d[i + 3] << 24));
  return [Math.round(r.width), Math.round(r.height), colours.size];
}).filter(x => x);
"""
# the controls (selects, inputs, buttons, downloads) of the open tab that overlap another one: [[a, b], ...]
OVERLAPPING_CONTROLS_JS = """const tabs = [...Bokeh.index.all_views()].find(v => v.model.type === 'panel.models.tabs.Tabs');
const views = []; (function walk(v) { views.push(v); (v.child_views || []).forEach(walk); })(tabs.child_views[tabs.model.active]);
const boxes = views.filter(v => v.el && v.el.isConnected && /(Select|MultiChoice|FileDownload|Button|Checkbox|Input|Spinner)/.test(v.model.type))
  .map(v => { const r = v.el.getBoundingClientRect(); return [v.model.type + ' ' + (v.model.title || v.model.label || ''), r]; })
  .filter(([, r]) => r.width > 1 && r.height > 1);
const out = [];
boxes.forEach(([a, r], i) => boxes.slice(i + 1).forEach(([b, q]) => {
  if (Math.min(r.right, q.right) - Math.max(r.left, q.left) > 2 && Math.min(r.bottom, q.bottom) - Math.max(r.top, q.top) > 2) out.push([a, b]);
}));
return out;"""
# the view of the plot whose title starts with arguments[0]
PLOT_VIEW = """const pv = [...Bokeh.index.all_views()].filter(v => v.renderer_views && v.model.title && v.model.title.text
  && v.model.title.text.startsWith(arguments[0]) && v.el.isConnected)[0];"""


# a hang must not eat CI's time: a test running past this dumps every thread's stack and ends the run (conftest)
HANG_S = 300


# the page tests run twice on the grid: on a server that computes every table and figure (a table cache with nothing
# for the dataset), and on one that finds them all in the table cache, as a second `serve` of a dataset does (drawn
# from a warm cache, the Timeline once dropped a run switch: on the samples, whose runs differ in their legends, not on
# the grid, whose runs do not); the samples run on the default cache, whatever it holds
CACHES = ["default table cache"] if SAMPLES else ["empty table cache", "warm table cache"]


@pytest.fixture(scope="module", params=CACHES)
def table_cache(request, dataset, browser, tmp_path_factory):
    """The server's environment (``env``): a table cache of its own, filled (``warm``) by an earlier server on which
    every page was drawn and whose warm-up finished; ``warmed``: the files that server left there, and when."""
    if SAMPLES:
        return {"env": {}, "warmed": None}
    cache = tmp_path_factory.mktemp("cache")
    env = {"OVERLAPVIZ_CACHE_DIR": str(cache)}
    if request.param == "warm table cache":
        log = tmp_path_factory.mktemp("warming") / "serve.log"
        with contextlib.closing(_serve(dataset, log, env=env)) as warming:
            url = next(warming)
            browser.get(url)
            # the Overview adds the run's answer when it is computed: a user who waits for it sees its figures, which
            # then come from the cache on the next server too
            wait_for(browser, lambda: idle(browser) and drawn_canvases(browser)
                     and "Computing this run's findings" not in page_text(browser), timeout=180, what="the Overview's answer")  # fmt: skip
            for name in pages(browser):
                open_page(browser, name)
            wait_for(browser, lambda: _warmed(dataset, cache), timeout=180, what="the warm-up's last table")
        assert not server_errors(log), server_errors(log)
        browser.get("about:blank")
        return {"env": env, "warmed": _files(cache)}
    return {"env": env, "warmed": None}


def _files(cache: Path) -> dict[str, int]:
    """Each file of ``cache`` and the time it was last written."""
    return {str(f.relative_to(cache)): f.stat().st_mtime_ns for f in cache.rglob("*") if f.is_file()}


def _warmed(dataset, cache: Path, seconds: float = 2.0) -> bool:
    """The warm-up's last two tables are in ``cache`` (its last step is one of them), and nothing was written there for
    ``seconds`` (a figure drawn last)."""
    from overlapviz.dashboards import store, table_cache

    before = os.environ.get("OVERLAPVIZ_CACHE_DIR")
    os.environ["OVERLAPVIZ_CACHE_DIR"] = str(cache)
    try:
        path = str(Path(dataset).resolve())
        stamp = store.dataset_stamp(path)
        last = [table_cache.disk_file(path, stamp, n) for n in ("derived:delays", repr(("analysis", "config_table", (), ())))]
    finally:
        if before is None:
            del os.environ["OVERLAPVIZ_CACHE_DIR"]
        else:
            os.environ["OVERLAPVIZ_CACHE_DIR"] = before
    files = [f for f in cache.rglob("*") if f.is_file()]
    return (all(f.exists() for f in last) and not any(f.suffix == ".tmp" for f in files)
            and time.time() - max(f.stat().st_mtime for f in files) > seconds)


@pytest.fixture(scope="module")
def server_log(table_cache, tmp_path_factory):
    return tmp_path_factory.mktemp("server") / "serve.log"


@pytest.fixture(scope="module")
def server(dataset, server_log, table_cache):
    yield from _serve(dataset, server_log, env=table_cache["env"])


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    """One imported run (a Kineto trace of one rank, no deviceProperties, no experiment configuration)."""
    from overlapviz.ingest import ingest
    from overlapviz.testing import generate_trace, write_trace

    root = tmp_path_factory.mktemp("imported")
    write_trace(generate_trace(3000, rank=0, world_size=1, seed=1, device_properties=[]), root / "job" / "rank0.json.gz")
    return ingest([str(root / "job")], root / "ds", progress=False)


@pytest.fixture(scope="module")
def imported_log(tmp_path_factory):
    return tmp_path_factory.mktemp("server2") / "serve.log"


@pytest.fixture(scope="module")
def imported_server(imported, imported_log):
    yield from _serve(imported, imported_log)


def requested_urls(driver) -> list[str]:
    """URLs the page asked for since the last call (Chrome DevTools Network events)."""
    urls = []
    for entry in driver.get_log("performance"):
        msg = json.loads(entry["message"])["message"]
        if msg["method"] in ("Network.requestWillBeSent", "Network.webSocketCreated"):
            urls.append(msg["params"].get("request", {}).get("url") or msg["params"].get("url"))
    return [u for u in urls if u]


def off_host(urls: list[str], allowed=LOCAL_HOSTS) -> list[str]:
    out = []
    for u in urls:
        parsed = urlparse(u)
        if parsed.scheme in ("data", "blob", "about", "file"):
            continue
        if parsed.hostname not in allowed:
            out.append(u)
    return out


def drawn_canvases(driver) -> list:
    """Canvases showing a plot: more than a handful of colours (a blank canvas has one or two)."""
    return [c for c in driver.execute_script(CANVASES_JS) if c[2] >= 8]


def pages(driver) -> list[str]:
    return driver.execute_script(f"return {MODELS}.filter(m => m.type === 'panel.models.tabs.Tabs')[0].tabs.map(t => t.title)")


def open_page(driver, name: str, title: str | None = None) -> float:
    t0 = time.monotonic()
    set_model(driver, "panel.models.tabs.Tabs", "active", pages(driver).index(name))
    title = PAGE_TITLES[name] if title is None else title

    def shown():
        titles = driver.execute_script(TITLES_JS)
        return idle(driver) and any(title in t for t in titles) and drawn_canvases(driver)

    wait_for(driver, shown, what=f"{name} plots")
    return time.monotonic() - t0


def open_tab(driver, name: str, text: str) -> None:
    """Open a tab that shows ``text`` (a notice, not a plot)."""
    set_model(driver, "panel.models.tabs.Tabs", "active", pages(driver).index(name))
    wait_for(driver, lambda: idle(driver) and text in page_text(driver), what=f"{name}: {text!r}")


def plot_state(driver, title: str) -> dict:
    """The ranges, title and tick labels of the plot whose title starts with ``title``."""
    return driver.execute_script(PLOT_VIEW + """
      const m = pv.model;
      return {x: [m.x_range.start, m.x_range.end], y: [m.y_range.start, m.y_range.end], title: m.title.text,
              yticks: Object.values(m.left[0].major_label_overrides ? Object.fromEntries(m.left[0].major_label_overrides) : {}),
              scroll: m.toolbar.active_scroll ? [m.toolbar.active_scroll.type, m.toolbar.active_scroll.dimensions] : null,
              drag: m.toolbar.active_drag ? [m.toolbar.active_drag.type, m.toolbar.active_drag.dimensions] : null};
    """, title)  # fmt: skip


def server_errors(log: Path) -> list[str]:
    text = log.read_text(errors="replace")
    return re.findall(r"(?m)^(?:Traceback.*|\w*Error: .*|ERROR:.*)$", text)


@pytest.fixture(scope="module")
def loaded(server, browser):
    browser.get(server)
    wait_for(browser, lambda: idle(browser) and drawn_canvases(browser), timeout=180, what="the dashboard")
    return browser


# on the sample traces the screenshots show these runs (the README's: the baseline the explain section quotes, and
# the best shaping against sequential); the first run otherwise
SHOWN_RUNS = {"run_id": "cb-ar_baseline_tiled64x64x32-pad0k_p0", "run_a": "cb-ar_sequential_tiled64x64x32-pad0k_p0",
              "run_b": "cb-ar_optimized_tiled64x64x32-pad64k_phigh"}  # fmt: skip


def _choose_runs(driver) -> None:
    for title, (field, prefix) in zip(("Configuration", "A", "B"), SHOWN_RUNS.items()):
        labels = driver.execute_script(
            f"return {MODELS}.filter(m => m.type === 'panel.models.widgets.CustomSelect' && m.title === arguments[0])"
            ".map(m => m.options)[0] || []", title)  # fmt: skip
        labels = [o if isinstance(o, str) else o[0] for o in labels]
        hit = next((o for o in labels if o.startswith(prefix)), None)
        if hit:
            set_model(driver, "panel.models.widgets.CustomSelect", "value", hit, where=title)
            wait_for(driver, lambda: idle(driver), what=f"{field} = {prefix}")


def test_every_page_draws_and_stays_on_localhost(loaded, tmp_path, server_log, table_cache):
    driver = loaded
    # BokehJS patched before the page was drawn (dashboards/patches.py, BROWSER_PATCH): every page below draws with it
    assert driver.execute_script("return Bokeh.overlapviz_patches") == ["css_values", "base_font_size"]
    shots = Path(SCREENSHOTS_ENV) if SCREENSHOTS_ENV else tmp_path
    shots.mkdir(parents=True, exist_ok=True)
    for name in pages(driver):
        open_page(driver, name)
        if name == "Overview":  # its grid is drawn; the run's answer may come after (said by a notice meanwhile)
            wait_for(driver, lambda: idle(driver) and "Where each rank's communication time went" in page_text(driver),
                     timeout=180, what="the Overview's answer")  # fmt: skip  (as the warm-up's wait: a hang guard)
        if SAMPLES and name in ("Timeline", "Compare"):
            _choose_runs(driver)
            wait_for(driver, lambda: idle(driver) and any(SHOWN_RUNS["run_id" if name == "Timeline" else "run_b"] in t
                                                          for t in driver.execute_script(TITLES_JS)) and drawn_canvases(driver),
                     what=f"{name} of the chosen runs")  # fmt: skip
        canvases = drawn_canvases(driver)
        assert canvases, f"{name}: no plot drawn"
        errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
        assert not errors, f"{name}: {errors}"
        for width in (1000, 1400):  # a laptop's window and the screenshots': the controls wrap, never overlap
            driver.set_window_size(width, 1100)
            time.sleep(0.5)
            assert not driver.execute_script(OVERLAPPING_CONTROLS_JS), (name, width, driver.execute_script(OVERLAPPING_CONTROLS_JS))
        time.sleep(0.5)
        height = driver.execute_script("return document.documentElement.scrollHeight")
        driver.set_window_size(1400, min(max(height, 1100), 4000))
        time.sleep(0.8)
        shot = shots / f"{name.lower().replace(' ', '_')}.png"
        driver.save_screenshot(str(shot))
        driver.set_window_size(1400, 1100)
        assert shot.stat().st_size > 10_000
    urls = requested_urls(driver)
    assert any("bokeh" in u for u in urls)  # the log works: BokehJS itself was requested, from the server
    assert not off_host(urls), off_host(urls)
    assert not server_errors(server_log), server_errors(server_log)
    if table_cache["warmed"] is not None:  # each table and figure shown was read from the warm cache, none computed again
        assert _files(Path(table_cache["env"]["OVERLAPVIZ_CACHE_DIR"])) == table_cache["warmed"]


def test_stand_in_is_labelled(loaded):
    titles = " ".join(loaded.execute_script(TITLES_JS))
    assert "single-GPU stand-in" in titles or "single-GPU stand-in" in page_text(loaded)


def _configuration_labels(driver) -> tuple[str, list[str]]:
    value, labels = driver.execute_script(
        f"return {MODELS}.filter(m => m.type === 'panel.models.widgets.CustomSelect' && m.title === 'Configuration')"
        ".map(m => [m.value, m.options])[0]"
    )
    return value, [o if isinstance(o, str) else o[0] for o in labels]


def test_a_heatmap_cell_opens_its_run_on_the_timeline(loaded):
    """A click on a cell of the Overview's heatmap opens that cell's run on the Timeline (the topmost and the
    rightmost cells that hold a run, so a wrong row or column would open another run)."""
    from selenium.webdriver.common.action_chains import ActionChains

    driver = loaded
    open_page(driver, "Timeline")
    before, _ = _configuration_labels(driver)
    for corner in ("top", "right"):
        open_page(driver, "Overview")
        wait_for(driver, lambda: driver.execute_script(PLOT_VIEW + "return !!pv;", "TimeRatio"), what="the heatmap in the page")
        el = driver.execute_script(PLOT_VIEW + "return pv.canvas_view.events_el;", "TimeRatio")
        run, px, py = driver.execute_script(PLOT_VIEW + """
          const r = pv.model.renderers.find(r => r.data_source && 'run_id' in r.data_source.data);
          const d = r.data_source.data, xf = r.glyph.x.field, yf = r.glyph.y.field;
          const cells = [...d.run_id].map((run, i) => [run, pv.frame.x_scale.compute(d[xf][i]), pv.frame.y_scale.compute(d[yf][i])]);
          cells.sort((a, b) => arguments[1] === 'top' ? a[2] - b[2] : b[1] - a[1]);
          return cells[0];""", "TimeRatio", corner)  # fmt: skip
        dx, dy = int(px - el.size["width"] / 2), int(py - el.size["height"] / 2)
        driver.execute_script("arguments[0].scrollIntoView({block: 'center'});", el)
        ActionChains(driver).move_to_element_with_offset(el, dx, dy).click().perform()
        wait_for(driver, lambda: any(t.startswith(f"Timeline of {run}") for t in driver.execute_script(TITLES_JS))
                 and driver.execute_script(f"return {MODELS}.filter(m => m.type === 'panel.models.tabs.Tabs')[0].active")
                 == pages(driver).index("Timeline"), what=f"the Timeline of {run}")  # fmt: skip
    set_model(driver, "panel.models.widgets.CustomSelect", "value", before, where="Configuration")  # as the other tests found it
    run = before.split(" — ")[0]
    wait_for(driver, lambda: idle(driver) and any(t.startswith(f"Timeline of {run}") for t in driver.execute_script(TITLES_JS)),
             what="the first run again")


@pytest.mark.skipif(SAMPLES, reason="the grid dataset's run names")
def test_widget_change_updates_the_timeline(loaded):
    driver = loaded
    open_page(driver, "Timeline")
    before = [t for t in driver.execute_script(TITLES_JS) if t.startswith("Timeline of")]
    value, labels = _configuration_labels(driver)
    target = next(o for o in labels if o != value and "optimized-pad16384-prio-1" in o)
    set_model(driver, "panel.models.widgets.CustomSelect", "value", target, where="Configuration")
    titles = wait_for(  # how soon: benchmarks/bench_dashboard.py measures it
        driver,
        lambda: [t for t in driver.execute_script(TITLES_JS) if "Timeline of cb-ar-optimized-pad16384-prio-1" in t],
        what="the timeline of the chosen run",
    )
    assert titles and titles != before
    wait_for(driver, lambda: idle(driver) and drawn_canvases(driver), what="redraw")
    assert not off_host(requested_urls(driver))


@pytest.mark.skipif(SAMPLES, reason="the sample traces have one rank per run")
def test_rank_filter_shows_only_the_chosen_ranks(loaded, server_log):
    # was: the selection stream's Tuple parameter refused the ranks; the server logged a ValueError, the page did nothing
    driver = loaded
    open_page(driver, "Timeline")
    lanes = plot_state(driver, "Timeline of")["yticks"]
    assert any(t.startswith("rank 0") for t in lanes) and any(t.startswith("rank 1") for t in lanes), lanes
    set_model(driver, "MultiChoice", "value", ["1"], where="Ranks (empty: all)")
    only = wait_for(driver, lambda: (t := plot_state(driver, "Timeline of")["yticks"]) and all(x.startswith("rank 1") for x in t) and t,
                    what="lanes of rank 1 only")  # fmt: skip
    assert only and all(t.startswith("rank 1") for t in only)
    set_model(driver, "MultiChoice", "value", [], where="Ranks (empty: all)")
    wait_for(driver, lambda: any(t.startswith("rank 0") for t in plot_state(driver, "Timeline of")["yticks"]), what="every rank again")
    assert not server_errors(server_log), server_errors(server_log)


@pytest.mark.skipif(SAMPLES, reason="the sample traces have one rank per run")
def test_rank_filter_fits_the_lanes_and_keeps_the_width(loaded, server_log):
    # was: the y range kept every rank's lanes (the chosen rank's squeezed into the top of the plot), the plot shrank from
    # the page's width to 1100 px, and the browser warned "nonexistent field 'color'" (a layer whose colours became one:
    # a rank of the 8-rank DLRM trace; the grid's layers are of one colour in every frame, so here that check only guards)
    driver = loaded
    open_page(driver, "Timeline")
    width_js = PLOT_VIEW + "return pv.el.getBoundingClientRect().width;"
    before, width = plot_state(driver, "Timeline of"), driver.execute_script(width_js, "Timeline of")
    lanes = before["yticks"]
    chosen = [t for t in lanes if t.startswith("rank 1 ")]
    assert chosen and len(chosen) < len(lanes) and sorted(before["y"]) == [-0.5, len(lanes) - 0.5], before
    driver.get_log("browser")  # what the page said before
    set_model(driver, "MultiChoice", "value", ["1"], where="Ranks (empty: all)")
    wait_for(driver, lambda: idle(driver) and plot_state(driver, "Timeline of")["yticks"] == chosen, what="lanes of rank 1 only")
    time.sleep(0.5)  # laid out
    after = plot_state(driver, "Timeline of")
    assert sorted(after["y"]) == [-0.5, len(chosen) - 0.5], (before, after)
    assert driver.execute_script(width_js, "Timeline of") == width
    warned = [e["message"] for e in driver.get_log("browser")
              if e["level"] in ("WARNING", "SEVERE") and "nonexistent field" in e["message"]]  # fmt: skip
    assert not warned, warned
    wheel(driver, "Timeline of")  # the wheel still zooms time only
    zoomed = wait_for(driver, lambda: (s := plot_state(driver, "Timeline of")) and s["x"] != after["x"] and s, what="a zoom")
    assert zoomed["y"] == after["y"] and zoomed["x"][1] - zoomed["x"][0] < after["x"][1] - after["x"][0], (after, zoomed)
    set_model(driver, "MultiChoice", "value", [], where="Ranks (empty: all)")
    wait_for(driver, lambda: idle(driver) and plot_state(driver, "Timeline of")["yticks"] == lanes, what="every rank again")
    time.sleep(0.5)
    again = plot_state(driver, "Timeline of")
    assert again["y"] == before["y"], (before, again)
    assert driver.execute_script(width_js, "Timeline of") == width
    assert not server_errors(server_log), server_errors(server_log)


def _hover_first(driver, title: str, field: str) -> str:
    """Move the mouse over the first glyph (of the renderer whose data has ``field``) and return the tooltip's text."""
    from selenium.webdriver.common.action_chains import ActionChains

    spot = driver.execute_script(PLOT_VIEW + """
      for (const r of pv.renderer_views.values()) {
        const d = r.model.data_source ? r.model.data_source.data : null;
        if (!d || !d[arguments[1]] || !d[arguments[1]].length) continue;
        const x = (d.start_ms[0] + d.end_ms[0]) / 2, y = (d.lane_lo[0] + d.lane_hi[0]) / 2;
        return [pv.frame.x_scale.compute(x), pv.frame.y_scale.compute(y)];
      }
      return null;""", title, field)  # fmt: skip
    assert spot, f"no glyph with {field} on {title}"
    el = driver.execute_script(PLOT_VIEW + "return pv.canvas_view.events_el;", title)
    size = el.size
    ActionChains(driver).move_to_element_with_offset(el, int(spot[0] - size["width"] / 2), int(spot[1] - size["height"] / 2)).perform()
    return wait_for(driver, lambda: driver.execute_script("""
      function all(root, out){ root.querySelectorAll('*').forEach(e => { if (e.shadowRoot) all(e.shadowRoot, out);
        if ((e.className || '').toString().includes('bk-tooltip-content') && e.offsetParent) out.push(e.innerText); }); return out; }
      return all(document, []).join('\\n');"""), what="a tooltip")  # fmt: skip


def test_timeline_tooltips_show_the_fields_and_their_values(loaded):
    # was: `resident blocks/SM: 256×1×1s_per_sm` (HoloViews expanded @block inside @blocks_per_sm) and `???` limiters
    driver = loaded
    open_page(driver, "Timeline")
    # the kernels are drawn at once, their residency and why when the run's explain is ready
    wait_for(driver, lambda: "Computing why" not in page_text(driver) and idle(driver), what="the why of the run")
    # every field a tooltip names is a column of its glyphs' data, so no tooltip can print ??? or a mangled name
    bad = driver.execute_script(PLOT_VIEW + """
      const out = [];
      for (const t of pv.model.toolbar.tools.filter(t => t.type === 'HoverTool')) {
        const tips = Array.isArray(t.tooltips) ? t.tooltips : [];
        for (const r of t.renderers) {
          const cols = Object.keys(r.data_source.data);
          for (const [label, spec] of tips)
            for (const m of String(spec).matchAll(/@\\{?([A-Za-z_][A-Za-z0-9_]*)\\}?/g))
              if (!cols.includes(m[1]) || String(spec).match(/\\}[A-Za-z_]/)) out.push(label + ': ' + spec);
        }
      }
      return out;""", "Timeline of")  # fmt: skip
    assert not bad, bad
    kernel = _hover_first(driver, "Timeline of", "residency")
    assert "kernel" in kernel and "gemm_tiled_64x64x32_kernel" in kernel or "ovz_gemm" in kernel, kernel
    assert "???" not in kernel and "s_per_sm" not in kernel, kernel
    assert re.search(r"residency:\s*\d+ blocks/SM \(limited by [a-z ]+\)", kernel), kernel
    assert re.search(r"grid × block:\s*\d+×\d+×\d+ × \d+×\d+×\d+", kernel), kernel
    driver.execute_script("document.body.dispatchEvent(new MouseEvent('mousemove', {clientX: 1, clientY: 1}))")
    comm = _hover_first(driver, "Timeline of", "cause")
    for field in ("start:", "end:", "launch:", "start − launch:", "ready → start:", "cause:", "blocker:", "fit:"):
        assert field in comm, (field, comm)
    assert "???" not in comm and re.search(r"start:\s*[\d,.]+ ms", comm) and re.search(r"launch:\s*[\d,.]+ ms", comm), comm


def wheel(driver, title: str, clicks: int = 3) -> None:
    """Turn the mouse wheel over the middle of the plot (zoom in; out for negative ``clicks``), as a user does: the zoom
    tools, not a range set in JS."""
    from selenium.webdriver.common.action_chains import ActionChains, ScrollOrigin

    el = driver.execute_script(PLOT_VIEW + "return pv.canvas_view.events_el;", title)
    spot = driver.execute_script(PLOT_VIEW + "return [pv.frame.bbox.hcenter, pv.frame.bbox.vcenter];", title)
    dx, dy = int(spot[0] - el.size["width"] / 2), int(spot[1] - el.size["height"] / 2)
    for _ in range(abs(clicks)):
        ActionChains(driver).scroll_from_origin(ScrollOrigin.from_element(el, dx, dy), 0, -120 if clicks > 0 else 120).perform()
        time.sleep(0.1)


def test_wheel_zooms_time_only(loaded):
    # was: the wheel zoomed y as well until the lanes vanished
    driver = loaded
    open_page(driver, "Timeline")
    before = plot_state(driver, "Timeline of")
    assert before["scroll"] == ["WheelZoomTool", "width"] and before["drag"] == ["PanTool", "width"], before
    wheel(driver, "Timeline of")
    after = wait_for(driver, lambda: (s := plot_state(driver, "Timeline of")) and s["x"] != before["x"] and s, what="a zoom")
    assert after["y"] == before["y"], (before, after)
    assert after["x"][1] - after["x"][0] < before["x"][1] - before["x"][0]
    # the zoomed window is drawn again by the server (a new count of kernels in view), not stretched
    wait_for(driver, lambda: plot_state(driver, "Timeline of")["title"] != before["title"], what="the redraw of the zoomed window")


KERNELS_IN_VIEW_JS = PLOT_VIEW + """
  // kernels whose [start, end] meets the window, counted from the glyphs in the page (a run drawn whole sends them all)
  const [x0, x1] = [pv.model.x_range.start, pv.model.x_range.end];
  let n = 0;
  for (const rv of pv.renderer_views.values()) {
    const d = rv.model.data_source && rv.model.data_source.data;
    if (!d || !('start_ms' in d) || !('name' in d)) continue;
    for (let i = 0; i < d.start_ms.length; i++) if (d.end_ms[i] >= x0 && d.start_ms[i] <= x1) n++;
  }
  return n;"""


WAITS_JS = PLOT_VIEW + """
  let n = 0;
  for (const rv of pv.renderer_views.values()) { const d = rv.model.data_source && rv.model.data_source.data;
    if (d && 'part' in d) n += d.part.length; }
  return n;"""


def _in_view(title: str) -> int:
    return int(re.search(r"— ([\d,]+) GPU activit(?:y|ies) in view", title).group(1).replace(",", ""))


def test_zoom_in_a_run_drawn_whole_counts_the_window_and_keeps_it(loaded, server_log):
    # a run whose every kernel is drawn is not rebuilt on a zoom (the title's count and the axis change in place):
    # the count must still be the window's, and a redraw for another reason must keep the window
    driver = loaded
    open_page(driver, "Timeline")
    before = plot_state(driver, "Timeline of")
    assert "rasterized" not in before["title"], before["title"]  # the test's premise: the grid's runs are drawn whole
    wheel(driver, "Timeline of", clicks=4)
    after = wait_for(driver, lambda: (s := plot_state(driver, "Timeline of")) and s["title"] != before["title"] and idle(driver) and s,
                     what="the zoomed window's count")  # fmt: skip
    time.sleep(0.5)  # every turn of the wheel answered
    after = plot_state(driver, "Timeline of")
    assert _in_view(after["title"]) == driver.execute_script(KERNELS_IN_VIEW_JS, "Timeline of") < _in_view(before["title"])
    assert driver.execute_script(WAITS_JS, "Timeline of") > 0
    set_model(driver, "Checkbox", "active", False, where="Waits and arrows")  # a redraw of the frame
    wait_for(driver, lambda: idle(driver) and driver.execute_script(WAITS_JS, "Timeline of") == 0, what="the redraw without waits")
    redrawn = plot_state(driver, "Timeline of")
    assert redrawn["x"] == after["x"], (after, redrawn)
    assert _in_view(redrawn["title"]) == _in_view(after["title"])
    set_model(driver, "Checkbox", "active", True, where="Waits and arrows")
    assert not server_errors(server_log), server_errors(server_log)


@pytest.mark.skipif(SAMPLES, reason="the grid dataset's two-rank runs")
def test_compare_redraws_on_zoom(loaded):
    # was: Compare drew both runs once; zooming stretched the raster instead of drawing the window
    driver = loaded
    open_page(driver, "Compare")
    _zoom_compare(driver)


def _zoom_compare(driver, clicks: int = 6) -> None:
    """Zoom Compare's A panel in (``clicks`` > 0) or out: both panels must show the window with their own counts of
    kernels in view, fewer (in) or more (out) than before."""
    a0, b0 = plot_state(driver, "A: "), plot_state(driver, "B: ")
    assert a0["x"] == b0["x"]  # one time axis for both
    wheel(driver, "A: ", clicks=clicks)

    def redrawn():
        a, b = plot_state(driver, "A: "), plot_state(driver, "B: ")
        n = [_in_view(s["title"]) for s in (a, b)]
        n0 = [_in_view(s["title"]) for s in (a0, b0)]
        return all(x < x0 if clicks > 0 else x > x0 for x, x0 in zip(n, n0)) and b["x"] == a["x"]

    wait_for(driver, redrawn, what="both compare panels redrawn for the zoomed window")
    # runs drawn whole are relabelled in place, not rebuilt: each count must still be its own panel's window
    wait_for(driver, lambda: idle(driver), what="the page idle")
    time.sleep(0.5)  # every turn of the wheel answered
    for prefix in ("A: ", "B: "):
        state = plot_state(driver, prefix)
        assert "rasterized" not in state["title"], state["title"]  # the premise: both runs drawn whole
        assert _in_view(state["title"]) == driver.execute_script(KERNELS_IN_VIEW_JS, prefix), (prefix, state)


@pytest.mark.skipif(SAMPLES, reason="the grid dataset's two-rank runs")
def test_a_page_taken_out_of_the_document_is_drawn_again_and_answers(loaded, server_log):
    """Only the open page and the one opened before it stay in the session's document (``app.KEPT``): an older one is
    taken out, and put back when its tab opens again. It must then be drawn whole and answer as before: Compare's
    zoom (a Python callback on the copied figure's range event) and the Why late page's figures."""
    driver = loaded
    open_page(driver, "Compare")
    _zoom_compare(driver, clicks=3)
    for name in ("Why late", "Timeline", "Overview"):
        open_page(driver, name)
    titles = " ".join(driver.execute_script(TITLES_JS))
    # Compare and Why late are out of the document now; the Timeline and the Overview are in it
    assert "A: " not in titles and PAGE_TITLES["Why late"] not in titles, titles
    assert "Timeline of" in titles and PAGE_TITLES["Overview"] in titles, titles
    open_page(driver, "Compare")
    _zoom_compare(driver, clicks=-6)  # (out: the window was zoomed in before the page was taken out)
    open_page(driver, "Why late")
    assert len(drawn_canvases(driver)) >= 2
    assert "A: " in " ".join(driver.execute_script(TITLES_JS))  # the page before stays
    assert not server_errors(server_log), server_errors(server_log)


def _click_button(driver, label: str) -> None:
    driver.execute_script("""
      function all(root, out){ root.querySelectorAll('button').forEach(b => out.push(b));
        root.querySelectorAll('*').forEach(e => { if (e.shadowRoot) all(e.shadowRoot, out); }); return out; }
      const b = all(document, []).filter(b => b.checkVisibility({visibilityProperty: true}) && b.textContent.trim() === arguments[0])[0];
      if (!b) throw new Error('no button ' + arguments[0]);
      (b.querySelector('a') || b).click();""", label)  # fmt: skip


def _download(driver, downloads: Path, label: str, name: str, fmt: str, timeout: float = 120) -> Path:
    for f in downloads.glob(f"{name}*"):
        f.unlink()
    set_model(driver, "panel.models.widgets.CustomSelect", "value", fmt, where="Export format", every=True)
    time.sleep(0.3)
    _click_button(driver, label)
    try:
        return wait_for(driver, lambda: next((f for f in downloads.glob(f"{name}.{fmt}") if f.stat().st_size > 0), None),
                        timeout=timeout, what=f"{name}.{fmt} downloaded")  # fmt: skip
    except AssertionError:
        text = page_text(driver)
        at = text.find("Export failed")
        raise AssertionError(f"{name}.{fmt} not downloaded: {text[at:at + 400] if at >= 0 else 'no message in the page'}") from None


@pytest.mark.skipif(SAMPLES, reason="the grid dataset")
def test_every_export_button_downloads_its_file(loaded, downloads, server_log):
    # was: Ranks had no export button; the Timeline's export ignored the zoom
    driver = loaded
    cases = {
        "Overview": [("Export heatmap", "heatmap", "png"), ("Export forest plot", "speedup", "html")],
        "Compare": [("Export comparison", "compare", "html")],
        "Why late": [("Export summary", "why", "png"), ("Export SM budget", "budget", "svg")],
        "Collectives": [("Export collectives", "collectives", "html"), ("Export ranks", "ranks", "pdf")],
        "Residency": [("Export residency", "residency", "html")],
    }  # fmt: skip
    for page, buttons in cases.items():
        open_page(driver, page)
        for label, name, fmt in buttons:
            out = _download(driver, downloads, label, name, fmt)
            data = out.read_bytes()
            magic = {"png": b"\x89PNG", "pdf": b"%PDF-", "svg": b"<svg", "html": b"<!DOCTYPE html>"}[fmt]
            assert magic in data[:200], (name, data[:80])
            assert len(data) > 5_000, (name, len(data))
    # the timeline's export is the window in view: zoom, export, and the file says as many kernels as the page
    open_page(driver, "Timeline")
    st = plot_state(driver, "Timeline of")
    wheel(driver, "Timeline of", clicks=5)
    wait_for(driver, lambda: plot_state(driver, "Timeline of")["title"] != st["title"], what="zoom")

    def settled():  # every wheel turn redrawn: the same title twice, half a second apart, on an idle page
        first = plot_state(driver, "Timeline of")["title"]
        time.sleep(0.5)
        return idle(driver) and plot_state(driver, "Timeline of")["title"] == first and first

    zoomed = wait_for(driver, settled, what="the zoom settled")
    html = _download(driver, downloads, "Export timeline", "timeline", "html").read_text()
    shown = re.search(r"([\d,]+) GPU activit(?:y|ies) in view", zoomed).group(1)
    assert re.search(rf"\b{shown} GPU activit(?:y|ies) in view", html), (zoomed, re.findall(r"[\d,]+ GPU activit(?:y|ies) in view", html))
    assert not server_errors(server_log), server_errors(server_log)


def test_forest_plot_reference_line_is_vertical(dataset, browser, tmp_path):
    # was: the "no change" line at speedup 1 was drawn horizontally between two configuration rows
    from overlapviz.export.render import export_dataset_figure

    if dataset is None:
        from overlapviz.ingest import samples

        dataset = samples.sample_dataset(progress=None)
    out = export_dataset_figure(dataset, "speedup", tmp_path / "speedup.html")
    browser.get(out.as_uri())
    wait_for(browser, lambda: idle(browser) and drawn_canvases(browser), timeout=120, what="the forest plot")
    spans = browser.execute_script(f"return {MODELS}.filter(m => m.type === 'Span').map(m => [m.dimension, m.location])")
    assert spans == [["height", 1.0]], spans
    xr = browser.execute_script(f"return {MODELS}.filter(m => m.type === 'Plot' || m.type === 'Figure').map(m => [m.x_range.start, m.x_range.end])[0]")
    assert xr[0] < 1.0 < xr[1] or xr[0] <= 1.0, xr


def test_exported_html_opens_offline(dataset, browser, tmp_path):
    from overlapviz.export.render import export_dataset_figure

    if dataset is None:
        from overlapviz.ingest import samples

        dataset = samples.sample_dataset(progress=None)
    out = export_dataset_figure(dataset, "heatmap", tmp_path / "heatmap.html")
    browser.get_log("performance")
    browser.get(out.as_uri())
    wait_for(browser, lambda: idle(browser) and drawn_canvases(browser), timeout=120, what="the exported figure")
    urls = requested_urls(browser)
    assert any(u.startswith("file:") for u in urls), urls  # the log saw the page itself
    assert not off_host(urls, allowed=set()), off_host(urls, allowed=set())  # nothing over the network at all


def test_a_one_run_imported_dataset_says_why_on_every_page(imported_server, browser, downloads):
    # was: Compare showed the one run twice; the Overview's export failed silently on imported traces; Residency drew
    # 150 empty bars over 5,900 px with no word of why
    driver = browser
    driver.get(imported_server)
    wait_for(driver, lambda: idle(driver) and "Where each rank's communication time went" in page_text(driver), timeout=180,
             what="the dashboard")  # an imported trace opens on its answer
    assert "Export heatmap" not in page_text(driver)  # nothing to export: no button that can only fail
    # nor a metric to choose or a cell to click
    assert "Click a cell" not in page_text(driver) and "TimeRatio" not in page_text(driver), page_text(driver)[:600]
    open_tab(driver, "Compare", "Compare needs two")
    assert not [t for t in driver.execute_script(TITLES_JS) if t.startswith(("A: ", "B: "))]
    open_tab(driver, "Residency", "No residency for")
    text = page_text(driver)
    assert "num_sms" in text and "deviceProperties" in text and "--device-name" in text, text[-1500:]
    # and no export of the residency it cannot draw (the button could only fail)
    shown = driver.execute_script(f"return {MODELS}.filter(m => m.label === 'Export residency').map(m => m.visible)")
    assert shown == [False], shown
    open_tab(driver, "Collectives", "seen on one rank only")
    # an export that cannot be made says why in the page
    set_model(driver, "panel.models.widgets.CustomSelect", "value", "html", where="Export format", every=True)
    _click_button(driver, "Export collectives")
    wait_for(driver, lambda: "Export failed" in page_text(driver) and "two or more ranks" in page_text(driver), what="the reason")
    open_page(driver, "Timeline")
    assert not drawn_canvases(driver) == []
    # a collective of one rank has no peer wait: the table says "—" (Tabulator's number format printed "NaN")
    open_tab(driver, "Why late", "peer wait (µs)")
    text = page_text(driver)
    assert "peer wait (µs)" in text and not re.search(r"\bNaN\b", text), text[-1500:]


IMAGE_JS = PLOT_VIEW + """
  // the raster layer's source: its window and a checksum of its pixels
  for (const rv of pv.renderer_views.values()) {
    const d = rv.model.data_source && rv.model.data_source.data;
    if (!d || !('image' in d) || !('dw' in d)) continue;
    const fresh = d.image !== window.__ovzImage;  // another image column than the one marked by the last call
    window.__ovzImage = d.image;
    const img = d.image[0], flat = img.length !== undefined && img[0] !== undefined && img[0].length !== undefined ? img.flat() : img;
    let sum = 0, lit = 0;
    for (let i = 0; i < flat.length; i++) { sum = (sum * 31 + (flat[i] >>> 0)) % 2147483647; if (flat[i]) lit++; }
    return {x: d.x[0], dw: d.dw[0], n: flat.length, sum: sum, lit: lit, fresh: fresh};
  }
  return null;"""


def test_a_rasterized_zoom_draws_the_window_as_a_full_redraw_would(imported_server, browser, imported_log):
    # a zoom that stays rasterized sets only the image (not a frame through HoloViews): it must be the window's
    # image, the same pixels a frame drawn for that window has
    driver = browser
    driver.get(imported_server)
    wait_for(driver, lambda: idle(driver) and "Where each rank's communication time went" in page_text(driver), timeout=180,
             what="the dashboard")  # an imported trace opens on its answer
    open_page(driver, "Timeline")
    set_model(driver, "Spinner", "value", 1000, where="Glyphs up to (kernels in view)")
    wait_for(driver, lambda: "rasterized" in plot_state(driver, "Timeline of")["title"] and idle(driver), what="the run rasterized")
    time.sleep(0.5)
    whole = driver.execute_script(IMAGE_JS, "Timeline of")
    before = plot_state(driver, "Timeline of")
    wheel(driver, "Timeline of", clicks=1)
    wait_for(driver, lambda: plot_state(driver, "Timeline of")["title"] != before["title"] and idle(driver), what="the zoom drawn")
    time.sleep(0.5)  # the turn of the wheel answered
    zoomed, state = driver.execute_script(IMAGE_JS, "Timeline of"), plot_state(driver, "Timeline of")
    assert "rasterized" in state["title"], state["title"]  # the premise: still more kernels in view than the budget
    assert zoomed["fresh"] and zoomed["sum"] != whole["sum"] and zoomed["lit"] > 0, (whole, zoomed)
    assert zoomed["x"] == pytest.approx(state["x"][0]) and zoomed["x"] + zoomed["dw"] == pytest.approx(state["x"][1])
    set_model(driver, "Checkbox", "active", False, where="Waits and arrows")  # a frame drawn for the same window
    redrawn = wait_for(driver, lambda: idle(driver) and (i := driver.execute_script(IMAGE_JS, "Timeline of"))["fresh"] and i,
                       what="the frame drawn again")  # fmt: skip
    assert plot_state(driver, "Timeline of")["x"] == state["x"]
    assert {**redrawn, "fresh": True} == {**zoomed, "fresh": True}, (zoomed, redrawn)
    set_model(driver, "Checkbox", "active", True, where="Waits and arrows")
    assert not server_errors(imported_log), server_errors(imported_log)


def test_tabs_are_named_after_what_they_show(loaded):
    assert pages(loaded) == ["Overview", "Timeline", "Why late", "Collectives", "Residency", "Compare"]


def test_perfetto_button_downloads_the_run_s_trace(loaded, server, downloads, server_log):
    # the run on screen as `overlapviz export --format perfetto` writes it: kernels, waits by cause, arrows, counters
    import gzip

    driver = loaded
    driver.get(server)  # an earlier test may have left the shared browser on another server
    wait_for(driver, lambda: idle(driver) and drawn_canvases(driver), timeout=180, what="the dashboard")
    open_page(driver, "Timeline")
    if not SAMPLES:  # a run whose collectives waited for the SMs the GEMM held (arrows from the blocker)
        _, labels = _configuration_labels(driver)
        set_model(driver, "panel.models.widgets.CustomSelect", "value", next(o for o in labels if "baseline-pad0" in o), where="Configuration")
        wait_for(driver, lambda: idle(driver) and "baseline-pad0" in plot_state(driver, "Timeline of")["title"], what="the baseline run")
    run = plot_state(driver, "Timeline of")["title"].split("Timeline of ", 1)[1].split()[0]
    for f in downloads.glob("*.perfetto.json.gz"):
        f.unlink()
    _click_button(driver, "Perfetto trace")
    out = wait_for(driver, lambda: next((f for f in downloads.glob("*.perfetto.json.gz") if f.stat().st_size > 0), None),
                   timeout=120, what="the Perfetto trace downloaded")  # fmt: skip
    assert out.name == f"{run}.perfetto.json.gz", out.name
    doc = json.loads(gzip.decompress(out.read_bytes()))
    assert doc["otherData"]["run_id"] == run and doc["displayTimeUnit"] == "ns"
    events = doc["traceEvents"]
    names = {(e["name"], e["args"].get("name")) for e in events if e["ph"] == "M"}
    processes = {n for k, n in names if k == "process_name"}
    threads = {n for k, n in names if k == "thread_name"}
    ranks = processes - {"findings"}  # the answer's process beside one per rank
    assert "findings" in processes and ranks and all(r.startswith("rank ") for r in ranks), processes
    assert any(t.startswith("why: comm waits") for t in threads), threads  # the findings' track
    assert any(t.startswith("stream ") for t in threads), threads
    slices = [e for e in events if e["ph"] == "X"]
    assert any(e.get("cat") == "comm" for e in slices) and any(e.get("cat") == "compute" for e in slices)
    assert any("cause" in e.get("args", {}) for e in slices)  # each wait carries its cause
    assert {"overlap_fraction", "exposed_comm_us"} <= {e["name"] for e in events if e["ph"] == "C"}
    if not SAMPLES:
        assert {"s", "f"} <= {e["ph"] for e in events}
    assert not server_errors(server_log), server_errors(server_log)


@pytest.fixture(scope="module")
def controls_dataset(tmp_path_factory):
    """One workload's grid as the paper grid records it: the cuBLAS GEMM in bf16 and fp32 and the tiled GEMM, in the three
    setups, with the SM-partitioning controls (carve-out, green context, work queues, launch order) in the manifests."""
    import pandas as pd

    from overlapviz.dataset import schema

    base = dict(source="collected", workload="cb-ar", compute_impl="vendor", gemm_m=8192, gemm_n=8192, gemm_k=8192,
                smem_pad_bytes=0, comm_priority=-3, comm_priority_effective=-3, collective="all_reduce", message_bytes=64 << 20,
                world_size=1, n_ranks=1, backend="stand-in", stand_in=True, device_name="NVIDIA H200", status="ok")  # fmt: skip
    tiled = dict(compute_impl="tiled", gemm_m=2048, gemm_n=2048, gemm_k=2048, tile_m=64, tile_n=64, tile_k=32)
    runs = [  # run id, runs-table fields, manifest config, median ms
        ("v-seq", dict(setup="sequential", comm_priority=0, comm_priority_effective=0), dict(dtype="bfloat16"), 10.0),
        ("v-base", dict(setup="baseline", comm_priority=0, comm_priority_effective=0), dict(dtype="bfloat16"), 9.5),
        ("v-opt", dict(setup="optimized"), dict(dtype="bfloat16"), 9.4),
        ("v-carve", dict(setup="optimized", sm_carveout=16), dict(dtype="bfloat16"), 9.3),
        ("v-green", dict(setup="optimized"), dict(dtype="bfloat16", green_ctx_sms=112), 8.2),
        ("v-conn", dict(setup="optimized"), dict(dtype="bfloat16", cuda_max_connections=1), 9.0),
        ("v-first", dict(setup="optimized"), dict(dtype="bfloat16", cuda_max_connections=1, launch_order="comm-first"), 7.9),
        ("f-seq", dict(setup="sequential", comm_priority=0, comm_priority_effective=0), dict(dtype="float32"), 20.0),
        ("f-opt", dict(setup="optimized"), dict(dtype="float32"), 14.0),
        ("t-seq", dict(setup="sequential", comm_priority=0, comm_priority_effective=0, **tiled), dict(dtype="float32"), 4.0),
        ("t-opt", dict(setup="optimized", **tiled), dict(dtype="float32"), 3.0),
    ]  # fmt: skip
    out = tmp_path_factory.mktemp("controls") / "ds"
    with schema.DatasetWriter(out) as w:
        for run_id, fields, config, ms in runs:
            manifest = {"config": {"workload": "cb-ar", **fields, **config, "launch_order": config.get("launch_order", "compute-first")}}
            w.add("runs", pd.DataFrame([{**base, **fields, "run_id": run_id, "config_json": json.dumps(manifest)}]))
            w.add("ranks", pd.DataFrame([{"run_id": run_id, "rank": 0, "world_size": 1, "source_format": "chrome"}]))
            w.add("iterations", pd.DataFrame([{"run_id": run_id, "rank": 0, "iteration": i, "time_ms": ms + 0.01 * (i % 3),
                                               "measured": True} for i in range(9)]))  # fmt: skip
        w.commit()
    return out


@pytest.fixture(scope="module")
def controls_server(controls_dataset, tmp_path_factory):
    yield from _serve(controls_dataset, tmp_path_factory.mktemp("server3") / "serve.log")


def test_overview_names_every_run_by_gemm_dtype_and_control(controls_server, browser):
    # was: a row named only what set it apart from its group's usual value (the bf16 cuBLAS rows never said bf16, the
    # usual tile went unnamed) and the rows of every GEMM were interleaved by setup
    driver = browser
    driver.get(controls_server)
    wait_for(driver, lambda: idle(driver) and drawn_canvases(driver) and any("TimeRatio" in t for t in driver.execute_script(TITLES_JS)),
             timeout=180, what="the Overview")  # fmt: skip
    rows = driver.execute_script(PLOT_VIEW + "return [...pv.model.y_range.factors];", "TimeRatio")[::-1]  # top row first
    assert len(rows) == len(set(rows)) == 11, rows  # every run its own row
    assert all(("bf16" in r) != ("fp32" in r) for r in rows), rows  # every row names its dtype
    assert sum("vendor bf16 8192³" in r for r in rows) == 7 and sum("tiled fp32 2048³ tile 64×64×32" in r for r in rows) == 2
    by_end = {r.split(" │ ")[1] for r in rows if r.startswith("vendor bf16")}
    assert {"sequential · prio 0", "baseline · prio 0", "optimized · prio -3", "optimized · prio -3 · carve-out 16 SMs",
            "optimized · prio -3 · green ctx 112 SMs", "optimized · prio -3 · 1 connection",
            "optimized · prio -3 · 1 connection · comm first"} == by_end, by_end  # fmt: skip
    groups = [r.split(" │ ")[0] for r in rows]
    assert all(groups.index(g) == i or groups[i - 1] == g for i, g in enumerate(groups)), groups  # a GEMM's rows together


# the server of `overlapviz serve`, with explain held until a file exists (the test's stand-in for a run whose explain
# takes seconds): what the Timeline shows before and after a run's why is computed
COMM_CAUSES_JS = PLOT_VIEW + """
  for (const r of pv.renderer_views.values()) {
    const d = r.model.data_source ? r.model.data_source.data : null;
    if (d && d.cause && d.cause_key) return [...d.cause];
  }
  return null;"""
WAIT_GLYPHS_JS = PLOT_VIEW + """
  for (const r of pv.renderer_views.values()) {
    const d = r.model.data_source ? r.model.data_source.data : null;
    if (d && d.part && d.wait) return d.part.length;
  }
  return null;"""


@pytest.fixture(scope="module")
def why_gate(tmp_path_factory):
    return tmp_path_factory.mktemp("gate") / "open"


@pytest.fixture(scope="module")
def gated_server(dataset, why_gate, tmp_path_factory):
    env = {"OVERLAPVIZ_TABLE_CACHE": "0", "OVZ_TEST_WHY_GATE": str(why_gate)}  # no explain from an earlier server's cache
    yield from _serve(dataset, tmp_path_factory.mktemp("server-gated") / "serve.log", code=GATED_EXPLAIN, env=env)


def test_the_timeline_draws_before_the_why_and_adds_it_when_it_comes(gated_server, browser, why_gate):
    # was: the first Timeline of a run waited for the run's explain (8.7 s on 1M kernels x 8 ranks) before drawing anything;
    # then the first page (the run's findings and breakdown: its explain too) never finished drawing while explain ran
    browser.get(gated_server)
    wait_for(browser, lambda: idle(browser) and drawn_canvases(browser) and "Computing this run's findings" in page_text(browser),
             timeout=180, what="the Overview: its grid drawn, its answer to come")  # fmt: skip
    assert "Findings: where the time went" not in page_text(browser)
    # a second session, left on the Overview: it adds the answer when it comes, with nothing clicked
    first = browser.current_window_handle
    browser.switch_to.new_window("window")
    browser.get(gated_server)
    wait_for(browser, lambda: idle(browser) and "Computing this run's findings" in page_text(browser), timeout=180,
             what="the second session's Overview")  # fmt: skip
    second = browser.current_window_handle
    browser.switch_to.window(first)
    open_page(browser, "Timeline")  # drawn while explain is held
    assert "Computing why" in page_text(browser)
    causes = browser.execute_script(COMM_CAUSES_JS, "Timeline of")
    assert causes and set(causes) == {"—"}, causes  # the collectives are drawn, their why not yet
    assert browser.execute_script(WAIT_GLYPHS_JS, "Timeline of") == 0
    why_gate.touch()
    wait_for(browser, lambda: "Computing why" not in page_text(browser) and idle(browser)
             and "—" not in browser.execute_script(COMM_CAUSES_JS, "Timeline of"), what="the why added to the timeline")  # fmt: skip
    assert browser.execute_script(WAIT_GLYPHS_JS, "Timeline of") > 0  # the wait tracks
    comm = _hover_first(browser, "Timeline of", "cause")
    for field in ("launch:", "ready → start:", "cause:", "blocker:", "fit:"):
        assert field in comm, (field, comm)
    browser.switch_to.window(second)
    wait_for(browser, lambda: idle(browser) and "Findings: where the time went" in page_text(browser)
             and "Computing this run's findings" not in page_text(browser), what="the answer added to the Overview")  # fmt: skip
    assert browser.execute_script(TITLES_JS) and any(t.startswith("Breakdown per rank") for t in browser.execute_script(TITLES_JS))
    browser.close()
    browser.switch_to.window(first)
    open_page(browser, "Overview")  # the first session's, drawn while explain was held: its answer now
    wait_for(browser, lambda: idle(browser) and "Findings: where the time went" in page_text(browser), what="the first session's answer")
