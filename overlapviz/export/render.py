"""Paper-ready figure export to PNG, SVG, PDF and self-contained HTML, fully offline.

PNG, SVG and PDF come from one drawing of the figure in Debian's headless chromium (``overlapviz.export.browser``): BokehJS
lays the figure out once with its canvas text measures, then paints that layout to pixels (a screenshot at the
asked resolution) and to SVG (each panel's ``PlotView.export("svg")``, placed as in the layout). PDF is that SVG
printed by the same browser (``Page.printToPDF``), so SVG and PDF are the same drawing as the PNG. HTML embeds BokehJS inline, so the file opens
with no network.
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

import holoviews as hv
import pandas as pd

from overlapviz.figures import charts as figures
from overlapviz.figures import timeline as figures_timeline
from overlapviz.figures import why as figures_why
from overlapviz.dataset import schema
from overlapviz.figures.catalog import FIGURES, FORMATS
from overlapviz.analysis import budget
from overlapviz.analysis.ranks import metric_deltas
from overlapviz.export.browser import CHROMEDRIVER_CANDIDATES, CHROMIUM_CANDIDATES, chromium, chromium_options, find_chromium  # noqa: F401
from overlapviz.export.browser import headless_chromium, load_export_page, page_drawn
from overlapviz.export.browser import shared_chromium as _shared_chromium
from overlapviz.export.source import DatasetSource  # noqa: F401 (export.DatasetSource, as before)


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


@dataclass(frozen=True)
class Look:
    """How a static figure (PNG, SVG, PDF) is laid out.

    Attributes
    ----------
    width, height
        The whole figure in CSS pixels (96 to the inch; ``catalog.parse_length``); None keeps the builder's size. A
        figure of several panels is scaled panel by panel. With a width and a font size but no height, the height is
        scaled by ``font_pt / 10``: the rows keep the room their text needs.
    font_pt
        The axis labels', legends' and cell labels' size in points (ticks one point less, the title one more); None
        keeps the builder's fonts.
    dpi
        PNG resolution: the figure is laid out at 96 px per inch and drawn at ``dpi / 96`` device pixels per CSS pixel,
        so a 3.5 in wide figure is 1050 px wide at 300 dpi with the same layout. SVG and PDF are vector (PDF at
        0.75 pt per CSS pixel: 3.5 in stays 3.5 in).
    title
        Keep the panels' titles (a paper usually says it in the caption).
    """

    width: int | None = None
    height: int | None = None
    font_pt: float | None = None
    dpi: int = 96
    title: bool = True


# hints that only make sense in a browser, taken out of titles of static files
_BROWSER_HINTS = (re.compile(r"; wheel: zoom instances"), re.compile(r": zoom in for single kernels, their waits and arrows"))


def _bokeh_model(obj, *, toolbar: bool):
    from bokeh.models import GridPlot, Plot

    model = hv.render(obj, backend="bokeh")
    if not toolbar:
        for item in model.select({"type": Plot}):
            item.toolbar_location = None
        for item in model.select({"type": GridPlot}):
            item.toolbar_location = None
    return model


def _plots(model) -> list:
    from bokeh.models import Plot

    return list(model.select({"type": Plot}))


def _static_model(obj, look: Look):
    """The Bokeh model of a static export: no toolbar, canvas backend, no browser hints in titles, ``look`` applied."""
    from bokeh.models import DataTable, Div, Column, GridPlot

    model = _bokeh_model(obj, toolbar=False)
    for grid in model.select({"type": GridPlot}):  # a table (compare's deltas) cannot be drawn as vector: HTML only
        grid.children = [c for c in grid.children if not isinstance(c[0], (Column, DataTable, Div))]
    plots = _plots(model)
    for plot in plots:
        plot.output_backend = "canvas"  # headless chromium has no GPU: WebGL would fall back to software
        if plot.title is not None:
            text = plot.title.text or ""
            for hint in _BROWSER_HINTS:
                text = hint.sub("", text)
            plot.title.text = text if look.title else ""
    _resize(model, plots, look)
    if look.font_pt:
        _fonts(plots, look.font_pt)
    if look.width is not None:
        _narrow(plots, look.font_pt or 10.0)
    return model


def _resize(model, plots: list, look: Look) -> None:
    """Scale the panels so that the whole figure is ``look.width`` x ``look.height`` CSS px (each unset: unchanged).

    Each row of panels fills the width (a row of one half-width panel under a full-width one too: scaled by the
    figure's factor it was 170 px wide in a 3.5 in column, its ticks over each other); heights scale by one factor."""
    from bokeh.models import GridPlot

    if not plots or (look.width is None and look.height is None):
        return
    grids = list(model.select({"type": GridPlot}))
    if grids and look.width is not None and look.width < 480 and len({c[2] for c in grids[0].children}) > 1:
        # a paper column: panels side by side would each get a sliver (ranks' two: 37 px plots), so one under another
        order = sorted(grids[0].children, key=lambda c: (c[1], c[2]))
        grids[0].children = [(c[0], i, 0) for i, c in enumerate(order)]
    if grids:  # rows and columns of the (one) grid: the figure's height is its tallest column
        cells = [(c[0], c[1], c[2]) for c in grids[0].children]
        row_w = {row: sum(p.width for p, r, _ in cells if r == row) for _, row, _ in cells}
        total_h = max(sum(p.height for p, _, c in cells if c == col) for _, _, col in cells)
        rows = {id(p): r for p, r, _ in cells}
    else:
        row_w, total_h, rows = {0: plots[0].width}, plots[0].height, {id(plots[0]): 0}
    # no height given: a narrower figure keeps the rows its text needs (their height goes with the font, ~10 pt before)
    fy = look.height / total_h if look.height is not None else (look.font_pt / 10.0 if look.font_pt and look.width else 1.0)
    for plot in plots:
        fx = 1.0 if look.width is None else look.width / row_w[rows.get(id(plot), next(iter(row_w)))]
        plot.width, plot.height = max(60, round(plot.width * fx)), max(60, round(plot.height * fy))


def _narrow(plots: list, font_pt: float) -> None:
    """Fit a narrowed figure's horizontal texts: a legend above or below the plot in two columns, the labels of a
    categorical x axis at 45 degrees where they would not fit side by side (about 0.55 em per character)."""
    from bokeh.models import FactorRange, Legend

    for plot in plots:
        for legend in [*plot.above, *plot.below]:
            if isinstance(legend, Legend) and plot.width < 640 and (not isinstance(legend.ncols, int) or legend.ncols > 2):
                legend.ncols = 2
        if isinstance(plot.x_range, FactorRange) and plot.x_range.factors:
            em = font_pt * 96 / 72
            text = [f if isinstance(f, str) else " ".join(map(str, f)) for f in plot.x_range.factors]
            need = sum(len(t) + 2 for t in text) * 0.55 * em
            # the frame is what the y labels (and a colour bar) leave of the plot's width
            ylabels = plot.y_range.factors if isinstance(plot.y_range, FactorRange) else []
            frame = plot.width - max((len(str(f)) for f in ylabels), default=6) * 0.55 * em - 80
            if need > frame:
                for axis in plot.xaxis:
                    axis.major_label_orientation = 0.785


def _fonts(plots: list, size_pt: float) -> None:
    """Every text of the panels in ``size_pt`` points: labels and legends at it, ticks one point less, titles one more."""
    from bokeh.models import ColorBar, GlyphRenderer, Legend, Text

    pt = lambda v: f"{v:g}pt"  # noqa: E731
    for plot in plots:
        if plot.title is not None:
            plot.title.text_font_size = pt(size_pt + 1)
        for axis in [*plot.xaxis, *plot.yaxis]:
            axis.axis_label_text_font_size, axis.major_label_text_font_size = pt(size_pt), pt(size_pt - 1)
            axis.axis_label_standoff = 4
        for legend in plot.select({"type": Legend}):
            legend.label_text_font_size, legend.title_text_font_size = pt(size_pt - 1), pt(size_pt - 1)
            legend.glyph_height = legend.glyph_width = legend.label_height = round(size_pt * 1.6)
            legend.padding, legend.spacing, legend.margin = 3, 1, 4
        for bar in plot.select({"type": ColorBar}):
            bar.major_label_text_font_size, bar.title_text_font_size = pt(size_pt - 1), pt(size_pt - 1)
        for r in plot.select({"type": GlyphRenderer}):
            if isinstance(r.glyph, Text):
                r.glyph.text_font_size = pt(size_pt - 1)


def export_figure(obj, out: str | os.PathLike, fmt: str | None = None, *, title: str = "overlapviz", reuse_browser: bool = False,
                  look: Look | None = None, driver=None) -> Path:  # fmt: skip
    """Write a HoloViews figure to ``out`` as PNG, SVG, PDF or self-contained HTML.

    PNG, SVG and PDF come from one drawing in the browser: the figure is laid out once (as on screen) and that layout
    is painted to pixels (PNG) and to vector paths and text (SVG; PDF is that SVG printed by the browser), so every
    static format has the plot frames, axes, labels and legends at the same places.

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
    look
        Size, fonts, resolution and titles of a static format (``Look``); the builder's when None.
    driver
        A started browser (``browser.Chromium``, or Selenium's ``chromium()``) to draw in.

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
    look = look or Look()
    model = _static_model(obj, look)
    if driver is not None:
        data = draw_static(model, driver, (fmt,), dpi=look.dpi)
    else:
        with (_shared_chromium() if reuse_browser else headless_chromium()) as d:
            data = draw_static(model, d, (fmt,), dpi=look.dpi)
    write_static(data, fmt, out, dpi=look.dpi)
    return out


def write_static(data: dict, fmt: str, out: Path, *, dpi: int = 96) -> None:
    """Write ``draw_static``'s ``fmt`` to ``out`` (PDF: its SVG printed by the browser, 0.75 pt per CSS pixel)."""
    if fmt == "svg":
        out.write_text(data["svg"], encoding="utf-8")
    else:
        out.write_bytes(data[fmt])


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

# each panel of the drawn figure: where it is (CSS px from the figure's corner), its plot frame, and (svg=true) the
# panel painted again with the same layout into BokehJS's SVG context (PlotView.export("svg")). Setting the plots'
# output_backend to "svg" instead lays them out with the SVG context's text measures: Bokeh 3.9 then drew the why
# figure's frame 43 px wide in a 600 px canvas and the ticks over each other (issue 33)
_PANELS_JS = """
const want_svg = arguments[0];
const {LayoutDOMView} = Bokeh.require("models/layouts/layout_dom");
const {PlotView} = Bokeh.require("models/plots/plot");
const root = Bokeh.index.roots[0];
const r0 = root.el.getBoundingClientRect();
const panels = [];
function walk(view) {
  if (view instanceof PlotView) {
    const r = view.el.getBoundingClientRect();
    const f = view.frame.bbox;
    panels.push({x: r.left - r0.left, y: r.top - r0.top, width: r.width, height: r.height,
                 frame: [f.left, f.top, f.width, f.height],
                 svg: want_svg ? view.export("svg").ctx.get_serialized_svg(true) : null});
  }
  if (view instanceof LayoutDOMView) for (const child of view.child_views) walk(child);
}
walk(root);
return {width: Math.round(r0.width), height: Math.round(r0.height), panels};
"""


def draw_static(model, driver, formats: Sequence[str], *, dpi: int = 96) -> dict:
    """Draw ``model`` once in ``driver``'s page and return what ``formats`` need from that one layout.

    Returns
    -------
    dict with ``width``, ``height`` (CSS px), ``panels`` (each panel's position and plot frame, CSS px), and ``png``
    (bytes, at ``dpi``) and/or ``svg`` (text: the panels' SVGs placed as in the layout) as asked.
    """
    import base64
    import json

    from bokeh.embed import json_item
    from bokeh.io.state import curstate

    item = json.dumps(json_item(model, theme=curstate().document.theme))  # the theme Bokeh's export page applies
    with _offline_layout_html():
        load_export_page(driver, widgets=_has_widgets(model))
        page_drawn(driver)
        # the device scale is the PNG's resolution only: BokehJS's SVG took it too (a 3.5 in column's legend markers
        # drawn 3.125 times too large in the SVG and the PDF at the preset's 300 dpi), and a vector-only drawing at
        # 1 px per CSS px rasterises a tenth of the pixels
        scale = max(0.25, dpi / 96.0) if "png" in formats else 1.0
        # a viewport that holds the whole figure (the panels' sizes summed: an upper bound): Chromium paints nothing
        # below the viewport even with captureBeyondViewport (a 2,316 px heatmap was cut at 1,000 px)
        plots = _plots(model)
        view_w, view_h = max(1400, sum(p.width or 0 for p in plots) + 100), max(1000, sum(p.height or 0 for p in plots) + 100)
        driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {"width": view_w, "height": view_h, "deviceScaleFactor": scale,
                                                                      "mobile": False})  # fmt: skip
        try:
            driver.set_script_timeout(30)
            error = driver.execute_async_script(_DRAW_JS, item)
            if error:
                raise ValueError(f"the browser could not draw the figure ({error})")
            layout = driver.execute_script(_PANELS_JS, any(f in ("svg", "pdf") for f in formats))
            out = {"width": layout["width"], "height": layout["height"], "panels": layout["panels"]}
            if "png" in formats:
                shot = driver.execute_cdp_cmd("Page.captureScreenshot", {
                    "format": "png", "captureBeyondViewport": True,
                    "clip": {"x": 0, "y": 0, "width": layout["width"], "height": layout["height"], "scale": 1}})  # fmt: skip
                out["png"] = _png_with_dpi(base64.b64decode(shot["data"]), dpi)
        finally:
            driver.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})
    _check_room(layout)
    if any(f in ("svg", "pdf") for f in formats):
        out["svg"] = _compose_svg(layout)
    if "pdf" in formats:
        out["pdf"] = _print_pdf(driver, out["svg"], layout["width"], layout["height"])
    return out


# the composed SVG alone on a page of its size, for chromium's print: the drawing's own text and paths as PDF
_PRINT_JS = """
const [svg, w, h] = arguments;
for (const view of [...Bokeh.index.roots]) view.remove();
for (const doc of [...Bokeh.documents]) doc.clear();
Bokeh.documents.length = 0;
let style = document.getElementById("overlapviz-print");
if (!style) { style = document.createElement("style"); style.id = "overlapviz-print"; document.head.appendChild(style); }
style.textContent = `@page { size: ${w}px ${h}px; margin: 0; } svg { display: block; }`;
document.getElementById("overlapviz-export").innerHTML = svg;
"""


def _print_pdf(driver, svg: str, width: int, height: int) -> bytes:
    """``svg`` (``_compose_svg``) as a one-page PDF of its size (0.75 pt per CSS pixel: 3.5 in stays 3.5 in), printed
    by the browser that drew it: the SVG's text stays text, its paths paths. cairosvg did the same in 0.3 s of import
    and 0.6 s (the DLRM timeline) of conversion per export; chromium prints it in a fraction, beside the drawing."""
    import base64

    driver.execute_script(_PRINT_JS, svg, width, height)
    pdf = driver.execute_cdp_cmd("Page.printToPDF", {"printBackground": True, "preferCSSPageSize": True, "marginTop": 0, "marginBottom": 0,
                                                     "marginLeft": 0, "marginRight": 0, "pageRanges": "1"})  # fmt: skip
    return base64.b64decode(pdf["data"])


def _check_room(layout: dict) -> None:
    """Refuse a layout whose labels leave a panel's plot too little room (long configuration or kernel names in a
    paper column): BokehJS then shrinks the plot to a sliver and the labels run off the picture.

    Raises
    ------
    ValueError
        Saying how wide the figure is and what to give instead.
    """
    for p in layout["panels"]:
        left, _, width, _ = p["frame"]
        if width < max(60.0, 0.2 * p["width"]) or left < 0:
            w = layout["width"]
            raise ValueError(f"at {w} px ({w / 96:.2f} in) wide, this figure's labels leave its plot {max(width, 0):.0f} px: give a "
                             f"larger --width (or --size page), or fewer runs or ranks")  # fmt: skip


def _png_with_dpi(data: bytes, dpi: int) -> bytes:
    """The PNG with its resolution recorded (a word processor then places it at its size in inches): chromium's PNG
    with a ``pHYs`` chunk after its header, the pixels untouched (decoding and encoding them again with Pillow was
    0.1-0.3 s at the end of every PNG export, and made them RGBA with an opaque alpha channel)."""
    import struct
    import zlib

    if data[:8] != b"\x89PNG\r\n\x1a\n" or data[12:16] != b"IHDR":
        raise ValueError("the browser's screenshot is not a PNG")
    chunks, pos = [], 8
    while pos < len(data):
        (n,) = struct.unpack(">I", data[pos : pos + 4])
        if data[pos + 4 : pos + 8] != b"pHYs":
            chunks.append(data[pos : pos + 12 + n])
        pos += 12 + n
    per_metre = int(dpi / 0.0254 + 0.5)  # (as Pillow writes it)
    body = b"pHYs" + struct.pack(">IIB", per_metre, per_metre, 1)
    phys = struct.pack(">I", 9) + body + struct.pack(">I", zlib.crc32(body) & 0xFFFFFFFF)
    return b"\x89PNG\r\n\x1a\n" + chunks[0] + phys + b"".join(chunks[1:])


_SVG_ROOT = re.compile(r"<svg\b")
# BokehJS paints each text a second time as an outline with stroke-opacity 0 (its text_outline_color, unset): nothing
# shows, but a PDF reader's search and copy found every label twice
_HIDDEN_TEXT = re.compile(r'<text fill="none"[^>]*\bstroke-opacity="0"[^>]*>[^<]*</text>')


def _compose_svg(layout: dict) -> str:
    """One SVG of the figure: a white page of its size with each panel's SVG placed where the layout put it."""
    w, h = layout["width"], layout["height"]
    parts = [f'<svg version="1.1" xmlns="http://www.w3.org/2000/svg" xmlns:xlink="http://www.w3.org/1999/xlink" width="{w}" '
             f'height="{h}" viewBox="0 0 {w} {h}">', f'<rect x="0" y="0" width="{w}" height="{h}" fill="#ffffff"/>']  # fmt: skip
    for p in layout["panels"]:
        parts.append(_SVG_ROOT.sub(f'<svg x="{p["x"]:g}" y="{p["y"]:g}"', _HIDDEN_TEXT.sub("", p["svg"]), count=1))
    parts.append("</svg>")
    return "\n".join(parts)


def _has_widgets(model) -> bool:
    from bokeh.models import Widget

    return any(isinstance(m, Widget) for m in model.references())


def _png(model, out: Path, driver) -> None:
    """``model`` as a PNG at 96 dpi, drawn as ``export_figure`` draws it (kept for the test against Bokeh's own ``export_png``)."""
    for plot in _plots(model):
        plot.output_backend = "canvas"
    Path(out).write_bytes(draw_static(model, driver, ("png",))["png"])


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
    static: bool = False,
):
    """The static HoloViews figure ``figure`` of a dataset (what ``overlapviz export`` writes).

    Parameters
    ----------
    figure
        A name of ``overlapviz.figures.catalog.FIGURES`` (``export --help`` lists them with what each shows).
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
    static
        For a PNG, SVG or PDF: what only a hover shows is not computed (a ``DatasetSource``'s timeline residency).

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
    tl = {"hover": False} if static and isinstance(src, DatasetSource) else {}
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
        labels = (figures.plot_title(f"A: {a}", src.is_stand_in(a)), figures.plot_title(f"B: {b}", src.is_stand_in(b)))
        return figures_timeline.compare(src.timeline(a, list(ranks or []), **tl), src.timeline(b, list(ranks or []), **tl), deltas, labels=labels, x_range=window_ms,
                                        width=width)  # fmt: skip
    (run_id,) = _pick_runs(src, dataset, runs, 1)
    if figure == "timeline":
        title = figures.plot_title(f"Timeline of {run_id}", src.is_stand_in(run_id))
        return figures_timeline.timeline(src.timeline(run_id, list(ranks or []), **tl), x_range=window_ms, steps=src.steps(run_id), width=width,
                                         title=title)  # fmt: skip
    if figure == "residency":
        if hasattr(src, "run_residency"):  # the run's launch shapes alone (the whole dataset's took 1.7 s of 116 runs)
            table = src.run_residency(run_id)
        else:
            table = src.kernel_residency()
            table = table.loc[table["run_id"] == run_id] if "run_id" in table else table
        if not len(table) or not pd.to_numeric(table["blocks_per_sm"], errors="coerce").notna().any():
            why = "; ".join(map(str, table["residency_note"].dropna().unique()[:2])) if len(table) else "no launch shapes"
            raise ValueError(f"{dataset}: run {run_id!r} has no kernel residency ({why or 'device limits unknown'})")
        return figures.residency(table, width=width)
    if figure == "breakdown":
        if not hasattr(src, "breakdown"):  # (a dashboard store of a version without it)
            raise ValueError(f"{dataset}: this source has no breakdown table")
        table = src.breakdown(run_id)
        if not len(table) or not (pd.to_numeric(table["comm_ns"], errors="coerce") > 0).any():
            raise ValueError(f"{dataset}: run {run_id!r} has no communication time")
        return figures.breakdown(table, src.findings(run_id) if hasattr(src, "findings") else None, width=width)
    if figure == "ranks":
        m = src.run_metrics(run_id) if hasattr(src, "run_metrics") else src.metrics()
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
                          reuse_browser: bool = False, look: Look | None = None, **selection) -> Path:  # fmt: skip
    """``build_figure(dataset, figure, **selection)`` written by ``export_figure`` (the CLI's and the dashboard's export)."""
    static = (fmt or Path(out).suffix.lstrip(".")).lower() != "html"
    obj = build_figure(dataset, figure, static=static, **selection)
    return export_figure(obj, out, fmt, title=f"overlapviz {figure} · {Path(dataset).name}", reuse_browser=reuse_browser, look=look)


_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def file_stem(figure: str, run_ids: Sequence[str] = ()) -> str:
    """The file name (no suffix) ``export --all`` gives a figure: ``heatmap``, ``timeline-<run>``, ``compare-<a>-vs-<b>``;
    characters other than letters, digits, ``.``, ``_`` and ``-`` in a run id become ``_``."""
    return "-".join([figure, "-vs-".join(_UNSAFE.sub("_", r).strip("_") or "run" for r in run_ids)]) if run_ids else figure


def all_figures(dataset: str | os.PathLike, runs: Sequence[str] | None = None, source=None) -> list[tuple[str, list[str]]]:
    """(figure, run ids) of every figure ``export --all`` tries: each dataset-wide figure once, each per-run figure for
    every run that did not fail (or ``runs``), compare for the pair when ``runs`` names exactly two."""
    src = source or DatasetSource(str(dataset))
    table = src.runs()
    run_ids = list(runs) if runs else table.loc[table["status"].fillna("ok") != "failed", "run_id"].tolist()
    jobs: list[tuple[str, list[str]]] = []
    for f in FIGURES.values():
        if f.scope == "dataset":
            jobs.append((f.name, []))
        elif f.scope == "pair":
            if runs and len(runs) == 2:
                jobs.append((f.name, list(runs)))
        else:
            jobs += [(f.name, [r]) for r in run_ids]
    return jobs


def export_all(dataset: str | os.PathLike, folder: str | os.PathLike, fmt: str = "png", *, runs: Sequence[str] | None = None,
               look: Look | None = None, device: str | None = None, **selection) -> list[Path]:  # fmt: skip
    """Every figure that applies to ``dataset`` (``all_figures``) as ``fmt`` into ``folder`` (created), named by
    ``file_stem``, with an ``index.html`` linking them and saying why each other figure was not drawn.

    Every static figure is drawn in one browser. A figure that does not apply (a run without collectives has no why
    figure; imported traces have no heatmap) is listed in the index with the reason, not written.

    Returns
    -------
    The files written, index.html last (none when no figure applies).

    Raises
    ------
    ValueError
        The dataset is unreadable, ``folder`` is a file, or no figure applies.
    """
    import html as html_mod

    dataset = str(dataset)
    schema.read_metadata(dataset)
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"{folder}: is a file; --all writes into a folder")
    folder.mkdir(parents=True, exist_ok=True)
    src = DatasetSource(dataset, device)
    if runs:
        _pick_runs(src, dataset, runs, len(set(runs)))  # an unknown run: one line, before anything is drawn
    look = look or Look()
    written, skipped = [], []
    with contextlib.ExitStack() as stack:
        driver = stack.enter_context(_shared_chromium()) if fmt != "html" else None
        for figure, run_ids in all_figures(dataset, runs, src):
            out = folder / f"{file_stem(figure, run_ids)}.{fmt}"
            try:
                obj = build_figure(dataset, figure, runs=run_ids or runs, source=src, device=device, static=fmt != "html", **selection)
                export_figure(obj, out, fmt, title=f"overlapviz {figure} · {Path(dataset).name}", look=look, driver=driver)
            except ValueError as exc:
                skipped.append((figure, run_ids, str(exc).removeprefix(f"{dataset}: ")))
                continue
            written.append((figure, run_ids, out))
    if not written:
        raise ValueError(f"{dataset}: no figure applies ({'; '.join(s[2] for s in skipped[:3])})")
    esc = html_mod.escape
    rows = []
    for figure, run_ids, out in written:
        shown = (f'<a href="{esc(out.name)}"><img src="{esc(out.name)}" alt="{esc(figure)}" loading="lazy"></a>' if fmt in ("png", "svg")
                 else f'<a href="{esc(out.name)}">{esc(out.name)}</a>')  # fmt: skip
        rows.append(f"<section><h2>{esc(figure)}{' · ' + esc(' vs '.join(run_ids)) if run_ids else ''}</h2>"
                    f"<p>{esc(FIGURES[figure].summary)}</p>{shown}</section>")  # fmt: skip
    notes = "".join(f"<li>{esc(f)}{' · ' + esc(' vs '.join(r)) if r else ''}: {esc(why)}</li>" for f, r, why in skipped)
    index = folder / "index.html"
    index.write_text(_INDEX.format(name=esc(Path(dataset).name), n=len(written), rows="\n".join(rows),
                                   skipped=f"<h2>Not drawn</h2><ul>{notes}</ul>" if notes else ""), encoding="utf-8")  # fmt: skip
    return [out for _, _, out in written] + [index]


_INDEX = """<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>overlapviz figures · {name}</title>
<style>body {{ font-family: sans-serif; margin: 2em; max-width: 1200px; }} img {{ max-width: 100%; border: 1px solid #ddd; }}
section {{ margin-bottom: 2em; }} h2 {{ font-size: 1.1em; margin-bottom: 0.2em; }} p {{ margin-top: 0; color: #444; }}</style>
</head><body><h1>{n} figures of {name}</h1>
{rows}
{skipped}
</body></html>
"""


__all__ = ["DatasetSource", "FIGURES", "FORMATS", "Look", "all_figures", "build_figure", "chromium", "draw_static", "export_all",
           "export_dataset_figure", "export_figure", "file_stem", "find_chromium", "write_static"]  # fmt: skip
