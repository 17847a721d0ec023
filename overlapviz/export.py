"""Paper-ready figure export to PNG, SVG, PDF and self-contained HTML, fully offline.

PNG and SVG are rendered by Bokeh's own export in Debian's headless chromium (driven by
Selenium through the system chromedriver; no browser is ever downloaded). SVG is true vector
output: every plot is switched to Bokeh's SVG backend before export. PDF is that SVG converted
by cairosvg, so SVG and PDF are the same drawing; cairosvg was chosen over svglib+reportlab
because it needs only small pure-Python packages over the system cairo (which chromium
already depends on) and follows SVG transforms, clipping and text closely. HTML embeds
BokehJS inline, so the file opens with no network.
"""

from __future__ import annotations

import atexit
import os
import re
import shutil
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Sequence

import holoviews as hv
import pandas as pd

from overlapviz import figures, figures_timeline, figures_why, schema
from overlapviz.analysis import budget, explain, peers
from overlapviz.analysis.metrics import analyze
from overlapviz.analysis.ranks import metric_deltas
from overlapviz.analysis.residency import by_rank, kernel_residency
from overlapviz.analysis.speedup import compare as compare_runs, config_table

FIGURES = ("timeline", "heatmap", "speedup", "compare", "residency", "ranks", "why", "budget", "collectives")
FORMATS = ("png", "svg", "pdf", "html")
CHROMIUM_CANDIDATES = ("/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome")
CHROMEDRIVER_CANDIDATES = ("/usr/bin/chromedriver",)


def find_chromium() -> tuple[str, str] | None:
    """Paths of the system chromium and chromedriver (``OVERLAPVIZ_CHROMIUM`` / ``OVERLAPVIZ_CHROMEDRIVER``
    override), or None when either is missing."""
    browser = os.environ.get("OVERLAPVIZ_CHROMIUM") or next((p for p in CHROMIUM_CANDIDATES if os.path.exists(p)), None)
    driver = os.environ.get("OVERLAPVIZ_CHROMEDRIVER") or next(
        (p for p in CHROMEDRIVER_CANDIDATES if os.path.exists(p)), shutil.which("chromedriver")
    )
    if not browser or not driver:
        return None
    return browser, driver


def chromium_options(browser: str, *, width: int = 1400, height: int = 1000):
    from selenium import webdriver

    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for arg in ("--headless=new", "--disable-gpu", "--hide-scrollbars", "--disable-dev-shm-usage",
                "--disable-extensions", "--no-first-run", "--force-device-scale-factor=1",
                f"--window-size={width},{height}"):  # fmt: skip
        options.add_argument(arg)
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        options.add_argument("--no-sandbox")  # chromium refuses to run as root with its sandbox
    return options


@contextmanager
def chromium(**kwargs) -> Iterator:
    """A headless Selenium driver on the system chromium, quit on exit.

    Raises
    ------
    ValueError
        If chromium or chromedriver is not installed (``apt-get install chromium chromium-driver``).
    """
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    found = find_chromium()
    if found is None:
        raise ValueError("PNG/SVG/PDF export needs chromium and chromedriver (Debian: apt-get install chromium chromium-driver)")
    browser, driver_path = found
    driver = webdriver.Chrome(service=Service(executable_path=driver_path), options=chromium_options(browser, **kwargs))
    try:
        yield driver
    finally:
        _PNG_USES.pop(id(driver), None)
        driver.quit()


@contextmanager
def _offline_layout_html() -> Iterator:
    """Bokeh's PNG/SVG export renders ``get_layout_html``'s page; with Panel imported (the dashboard) that page also
    names Panel's extension scripts by relative path and Tabulator's stylesheet on its CDN. Strip them (everything
    the figure needs is inline), so an export makes no request at all, as the HTML export does."""
    import bokeh.io.export as bokeh_export

    original = bokeh_export.get_layout_html

    def offline(obj, **kwargs):
        return _drop_external_scripts(original(obj, **kwargs))

    with _EXPORT_LOCK:
        bokeh_export.get_layout_html = offline
        try:
            yield
        finally:
            bokeh_export.get_layout_html = original


_EXPORT_LOCK = threading.RLock()
_SHARED: dict = {}
_SHARED_LOCK = threading.Lock()


@contextmanager
def _shared_chromium() -> Iterator:
    """The process's one headless chromium (started on first use, quit at exit), one export at a time."""
    with _SHARED_LOCK:
        driver = _SHARED.get("driver")
        if driver is not None:
            try:
                driver.execute_script("return 1")
            except Exception:  # noqa: BLE001  (a dead browser is replaced)
                driver = None
        if driver is None:
            cm = chromium()
            driver = cm.__enter__()
            _SHARED.update(driver=driver, cm=cm)
            atexit.register(_quit_shared)
        yield driver


def _quit_shared() -> None:
    cm = _SHARED.pop("cm", None)
    _SHARED.pop("driver", None)
    if cm is not None:
        try:
            cm.__exit__(None, None, None)
        except Exception:  # noqa: BLE001  (at exit: nothing left to report to)
            pass


def _legends_to_the_right(plot) -> None:
    """Move a legend laid out above the plot to its right: BokehJS's SVG backend measures a legend above the
    frame far too tall and pushes the frame out of the picture (Bokeh 3.9); at the right it lays out as on canvas."""
    from bokeh.models import Legend

    for legend in [r for r in plot.above if isinstance(r, Legend)]:
        plot.above.remove(legend)
        legend.orientation, legend.ncols = "vertical", 1
        plot.add_layout(legend, "right")


def _bokeh_model(obj, *, toolbar: bool):
    from bokeh.models import GridPlot, Plot

    model = hv.render(obj, backend="bokeh")
    if not toolbar:
        for item in model.select({"type": Plot}):
            item.toolbar_location = None
        for item in model.select({"type": GridPlot}):
            item.toolbar_location = None
    return model


def export_figure(obj, out: str | os.PathLike, fmt: str | None = None, *, title: str = "overlapviz", reuse_browser: bool = False) -> Path:
    """Write a HoloViews figure to ``out`` as PNG, SVG, PDF or self-contained HTML.

    Parameters
    ----------
    obj
        A static HoloViews object (a figures builder's result).
    out
        The output file; its suffix gives the format when ``fmt`` is None.
    fmt : {"png", "svg", "pdf", "html"}
    reuse_browser
        Keep one headless chromium for every export of this process (the dashboard's: saves its
        start, about a second); otherwise each export starts and quits its own.

    Raises
    ------
    ValueError
        If the format is unknown, or chromium is missing for png/svg/pdf.
    """
    out = Path(out)
    fmt = (fmt or out.suffix.lstrip(".")).lower()
    if fmt not in FORMATS:
        raise ValueError(f"{out}: format {fmt!r} is not one of {', '.join(FORMATS)}")
    if not out.parent.exists():
        raise ValueError(f"{out}: directory {out.parent} does not exist")
    if fmt == "html":
        from bokeh.embed import file_html
        from bokeh.resources import INLINE

        html = file_html(_bokeh_model(obj, toolbar=True), resources=INLINE, title=title)
        out.write_text(_drop_external_scripts(html), encoding="utf-8")
        return out
    from bokeh.io.export import get_svgs
    from bokeh.models import Plot

    model = _bokeh_model(obj, toolbar=False)
    for item in model.select({"type": Plot}):
        item.output_backend = "canvas"  # headless chromium has no GPU: WebGL would fall back to software
    with (_shared_chromium() if reuse_browser else chromium()) as driver, _offline_layout_html():
        if fmt == "png":
            _png(model, out, driver)
            return out
        for item in model.select({"type": Plot}):
            item.output_backend = "svg"
            _legends_to_the_right(item)
        svgs = get_svgs(model, driver=driver, timeout=30)
    if not svgs:
        raise ValueError(f"{out}: the browser produced no SVG")
    svg = svgs[0]
    if fmt == "svg":
        out.write_text(svg, encoding="utf-8")
    else:
        import cairosvg

        cairosvg.svg2pdf(bytestring=svg.encode("utf-8"), write_to=str(out))
    return out


# the page PNG exports are drawn in: every BokehJS bundle inline (nothing is requested), the body laid out as in
# Bokeh's own export page (bokeh.io.export.get_layout_html), and one element the figure is drawn into
_PNG_PAGE = """<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>overlapviz export</title>
<style>html, body { box-sizing: border-box; width: 100%; height: 100%; margin: 0; border: 0; padding: 0; overflow: hidden; }</style>
{scripts}</head><body><div id="overlapviz-export" style="display: contents;"></div></body></html>"""
_PNG_PAGE_USES = 25  # figures drawn in one load of the page, then it is loaded again (the old documents let go)

_DRAW_JS = """
const [item, done] = [JSON.parse(arguments[0]), arguments[arguments.length - 1]];
for (const view of [...Bokeh.index.roots]) view.remove();
for (const doc of [...Bokeh.documents]) doc.clear();
Bokeh.documents.length = 0;
document.getElementById("overlapviz-export").replaceChildren();
Bokeh.embed.embed_item(item, "overlapviz-export").then(() => {
  const doc = Bokeh.documents[Bokeh.documents.length - 1];
  if (doc.is_idle) done(null); else doc.idle.connect(() => done(null));
}, (error) => done(String(error)));
"""
_SIZE_JS = """const r = Bokeh.index.roots[0].el.getBoundingClientRect();
return [Math.round(r.width), Math.round(r.height), window.devicePixelRatio,
        Math.max(0, window.outerWidth - window.innerWidth), Math.max(0, window.outerHeight - window.innerHeight)];"""


def _png(model, out: Path, driver) -> None:
    """``model`` as a PNG, drawn as Bokeh's ``export_png`` draws it (window maximized, the figure laid out, the window set
    to its size, the screenshot cropped to it) but in a page that keeps BokehJS loaded: each export sends only the
    figure's JSON. Loading Bokeh's 2 MB export page was 0.7-1.1 s of each export (the samples' compare: 2.0 → 0.7 s
    for the browser's part). The page is loaded again after ``_PNG_PAGE_USES`` figures."""
    import io
    import json

    from bokeh.embed import json_item
    from bokeh.io.state import curstate
    from PIL import Image

    item = json.dumps(json_item(model, theme=curstate().document.theme))  # the theme Bokeh's export page applies
    uses = _PNG_USES.get(id(driver), 0)
    if uses == 0 or uses >= _PNG_PAGE_USES or not driver.execute_script("return !!window.Bokeh && !!document.getElementById('overlapviz-export')"):
        from bokeh.resources import INLINE

        page = _png_page_file()
        if not page.exists():
            scripts = "".join(f"<script>{js}</script>" for js in INLINE.js_raw)
            tmp = page.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(_PNG_PAGE.replace("{scripts}", scripts), encoding="utf-8")
            os.replace(tmp, page)
        driver.get(page.as_uri())
        uses = 0
    _PNG_USES[id(driver)] = uses + 1
    driver.maximize_window()  # (the last export set the window to its figure's size)
    driver.set_script_timeout(30)
    error = driver.execute_async_script(_DRAW_JS, item)
    if error:
        raise ValueError(f"{out}: the browser could not draw the figure ({error})")
    width, height, dpr, extra_w, extra_h = driver.execute_script(_SIZE_JS)
    eps = 100  # as Bokeh: a window manager may not set the size exactly; the screenshot is cropped to the figure
    driver.set_window_size(round(extra_w + width * dpr) + eps, round(extra_h + height * dpr) + eps)
    png = Image.open(io.BytesIO(driver.get_screenshot_as_png())).convert("RGBA").crop((0, 0, width * dpr, height * dpr))
    png.save(out)


_PNG_USES: dict = {}  # id(driver) -> figures drawn in its current load of the export page


def _png_page_file() -> Path:
    """The export page of this Bokeh version (written once, in a private temporary directory of this process)."""
    import bokeh
    import tempfile

    folder = _PNG_DIR.get("dir")
    if folder is None:
        folder = _PNG_DIR["dir"] = Path(tempfile.mkdtemp(prefix="overlapviz-export-"))
        atexit.register(shutil.rmtree, folder, True)
    return folder / f"bokeh-{bokeh.__version__}.html"


_PNG_DIR: dict = {}


_SCRIPT_SRC = re.compile(r"<script\b[^>]*\bsrc=\"(?!data:)[^\"]*\"[^>]*>\s*</script>\s*", re.IGNORECASE)


# stylesheets Panel extensions register (Tabulator's, once the dashboard is imported) point at its CDN
_REMOTE_LINK = re.compile(r"<link\b[^>]*\bhref=\"(?:https?:)?//[^\"]*\"[^>]*>\s*", re.IGNORECASE)


def _drop_external_scripts(html: str) -> str:
    """Remove ``<script src=...>`` and remote ``<link href=...>`` tags from an INLINE-resources page.

    With INLINE resources every BokehJS bundle is already in the page; Panel (imported by
    HoloViews) adds two ``src`` scripts to Bokeh's resources anyway, es-module-shims by a
    relative path and MathJax from cdn.jsdelivr.net, which our figures never use. Left in,
    opening the file would request them from the network.
    """
    return _REMOTE_LINK.sub("", _SCRIPT_SRC.sub("", html))


# --- figures from a dataset --------------------------------------------------------------


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

    def budget(self, record: dict, what_if: dict | None = None):
        return budget.kernel_budget(self.path, record, what_if=what_if, device=self.device)

    def timeline(self, run_id: str, ranks=None) -> figures_timeline.TimelineData:
        import pyarrow.compute as pc

        filt = pc.field("rank").isin([int(r) for r in ranks]) if ranks else None
        kernels = schema.read_kernels(self.path, columns=figures_timeline.TIMELINE_COLUMNS + ["launch_ns"], run_ids=[run_id],
                                      filter=filt).to_pandas()  # fmt: skip
        if not len(kernels):
            raise ValueError(f"{self.path}: run {run_id!r} has no kernels" + (f" on ranks {list(ranks)}" if ranks else ""))
        try:
            residency = by_rank(self.kernel_residency(), self.path, self.device)
        except ValueError:  # the hover's residency is optional: a timeline without it beats no timeline
            residency = None
        try:
            why = self.explained(run_id)
            if ranks:
                why = why.loc[why["rank"].isin([int(r) for r in ranks])]
            why = pd.concat([why, budget.blocker_positions(why, kernels)], axis=1)
            waits = budget.wait_segments(why)
        except ValueError:
            why = waits = None
        return figures_timeline.TimelineData(kernels, residency=residency, why=why, waits=waits)


def _pick_runs(source, dataset: str, runs: Sequence[str] | None, n: int) -> list[str]:
    table = source.runs() if hasattr(source, "runs") and callable(source.runs) else schema.read_frame(dataset, "runs")
    known = table["run_id"].tolist()
    if runs:
        missing = [r for r in runs if r not in known]
        if missing:
            raise ValueError(f"{dataset}: no run {missing[0]!r} (runs: {', '.join(known) or 'none'})")
        picked = list(dict.fromkeys(runs))
    else:
        picked = table.loc[table["status"].fillna("ok") != "failed", "run_id"].tolist()[:n]
    if len(picked) < n:
        raise ValueError(f"{dataset}: this figure needs {n} run(s) (--run; different ones), the dataset offers {len(picked)}")
    return picked[:n]


def build_figure(
    dataset: str | os.PathLike,
    figure: str,
    *,
    runs: Sequence[str] | None = None,
    ranks: Sequence[int] | None = None,
    window_ms: tuple[float, float] | None = None,
    value: str = "time_ratio",
    width: int = 1100,
    record: dict | None = None,
    what_if: dict | None = None,
    source=None,
    device: str | None = None,
):
    """The static HoloViews figure ``figure`` of a dataset (what ``overlapviz export`` writes).

    Parameters
    ----------
    figure : {"timeline", "heatmap", "speedup", "compare", "residency", "ranks", "why", "budget", "collectives"}
        ``why``: late-start time by cause per rank and the top blockers; ``budget``: one SM's
        budget for one collective; ``collectives``: instances across ranks.
    runs
        Run ids: the run of timeline/residency/ranks/why/budget/collectives (first), the compare pair
        (two); the first runs of the dataset when None.
    ranks
        Timeline ranks (all when None).
    window_ms
        Timeline/compare time window, ms since the first kernel.
    value
        Heatmap metric (``time_ratio``, ``speedup``, ``overlap_fraction``); collectives cells
        (``arrival_us``, ``peer_wait_us``; arrival otherwise).
    record, what_if
        Budget: the explain record of the collective (default: the run's longest wait for SM
        resources, else its latest start after launch) and an advisor option to apply.
    source
        Where the tables come from: a ``DatasetSource`` (default) or the dashboard's DataStore.
    device
        The GPU the traces ran on, for ranks whose trace does not say (``residency.device_table``; the
        ``DatasetSource``'s: a DataStore has its own).

    Raises
    ------
    ValueError
        Naming the dataset and what is missing (run, analysis module, column).
    """
    dataset = str(dataset)
    schema.read_metadata(dataset)
    if figure not in FIGURES:
        raise ValueError(f"figure {figure!r} is not one of {', '.join(FIGURES)}")
    src = DatasetSource(dataset, device) if source is None else source
    if figure in ("heatmap", "speedup"):
        table = src.config_table()
        if runs:
            table = table.loc[table["run_id"].isin(list(runs))]
        table = table.loc[table["setup"].notna()] if "setup" in table else table.iloc[:0]
        if not len(table):
            raise ValueError(f"{dataset}: no configured runs (workload, setup) to draw a {figure}: its runs are imported traces")
        return figures.heatmap(table, value=value) if figure == "heatmap" else figures.speedup_bars(table)
    if figure == "compare":
        a, b = _pick_runs(src, dataset, runs, 2)
        try:
            deltas = src.compare(a, b)
        except ValueError:
            m = src.metrics()
            deltas = metric_deltas(m.loc[m["run_id"].isin([a, b])], a, b)
        labels = (figures._title(f"A: {a}", src.is_stand_in(a)), figures._title(f"B: {b}", src.is_stand_in(b)))
        return figures_timeline.compare(src.timeline(a, list(ranks or [])), src.timeline(b, list(ranks or [])), deltas, labels=labels, x_range=window_ms,
                                        width=width)  # fmt: skip
    (run_id,) = _pick_runs(src, dataset, runs, 1)
    if figure == "timeline":
        title = figures._title(f"Timeline of {run_id}", src.is_stand_in(run_id))
        return figures_timeline.timeline(src.timeline(run_id, list(ranks or [])), x_range=window_ms, steps=src.steps(run_id), width=width,
                                         title=title)  # fmt: skip
    if figure == "residency":
        table = src.kernel_residency()
        table = table.loc[table["run_id"] == run_id] if "run_id" in table else table
        if not len(table) or not pd.to_numeric(table["blocks_per_sm"], errors="coerce").notna().any():
            why = "; ".join(map(str, table["residency_note"].dropna().unique()[:2])) if len(table) else "no launch shapes"
            raise ValueError(f"{dataset}: run {run_id!r} has no kernel residency ({why or 'device limits unknown'})")
        return figures.residency(table, width=width)
    if figure == "ranks":
        m = src.metrics()
        m = m.loc[m["run_id"] == run_id]
        if not len(m):
            raise ValueError(f"{dataset}: run {run_id!r} has no kernels for a ranks figure")
        return figures.ranks(m)
    if figure == "why":
        summary = src.summary(run_id)
        if not len(summary):
            raise ValueError(f"{dataset}: run {run_id!r} has no communication kernels")
        return figures_why.why(summary, src.blockers(run_id), width=width)
    if figure == "collectives":
        inst = src.instances(run_id)
        if not len(inst) or int(inst["n_ranks"].max()) < 2:
            raise ValueError(f"{dataset}: run {run_id!r} has no collective seen on two or more ranks")
        cells_value = value if value in ("arrival_us", "peer_wait_us") else "arrival_us"
        return figures_why.collectives(src.instance_cells(run_id), inst, width=width, value=cells_value)
    # budget
    if record is None:
        record = budget.worst_record(src.explained(run_id))
        if record is None:
            raise ValueError(f"{dataset}: run {run_id!r} has no communication kernels")
    table, facts = src.budget(record, what_if)
    return figures_why.sm_budget(table, facts, width=width - 100)


def export_dataset_figure(dataset: str | os.PathLike, figure: str, out: str | os.PathLike, fmt: str | None = None, *,
                          reuse_browser: bool = False, **selection) -> Path:  # fmt: skip
    """``build_figure(dataset, figure, **selection)`` written by ``export_figure`` (the CLI's and the dashboard's export)."""
    obj = build_figure(dataset, figure, **selection)
    return export_figure(obj, out, fmt, title=f"overlapviz {figure} · {Path(dataset).name}", reuse_browser=reuse_browser)


__all__ = ["DatasetSource", "FIGURES", "FORMATS", "build_figure", "chromium", "export_dataset_figure", "export_figure",
           "find_chromium"]  # fmt: skip
