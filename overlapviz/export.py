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

import os
import re
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Sequence

import holoviews as hv

from overlapviz import figures, schema
from overlapviz.analysis.explain import comm_start_delays
from overlapviz.analysis.metrics import analyze
from overlapviz.analysis.ranks import metric_deltas
from overlapviz.analysis.residency import kernel_residency
from overlapviz.analysis.speedup import compare as compare_runs, config_table

FIGURES = ("timeline", "heatmap", "speedup", "compare", "residency", "ranks")
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
        driver.quit()


def _bokeh_model(obj, *, toolbar: bool):
    from bokeh.models import GridPlot, Plot

    model = hv.render(obj, backend="bokeh")
    if not toolbar:
        for item in model.select({"type": Plot}):
            item.toolbar_location = None
        for item in model.select({"type": GridPlot}):
            item.toolbar_location = None
    return model


def export_figure(obj, out: str | os.PathLike, fmt: str | None = None, *, title: str = "overlapviz") -> Path:
    """Write a HoloViews figure to ``out`` as PNG, SVG, PDF or self-contained HTML.

    Parameters
    ----------
    obj
        A static HoloViews object (a figures builder's result).
    out
        The output file; its suffix gives the format when ``fmt`` is None.
    fmt : {"png", "svg", "pdf", "html"}

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
    from bokeh.io.export import export_png, get_svgs
    from bokeh.models import Plot

    model = _bokeh_model(obj, toolbar=False)
    for item in model.select({"type": Plot}):
        item.output_backend = "canvas"  # headless chromium has no GPU: WebGL would fall back to software
    with chromium() as driver:
        if fmt == "png":
            export_png(model, filename=str(out), webdriver=driver, timeout=30)
            return out
        for item in model.select({"type": Plot}):
            item.output_backend = "svg"
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


def _pick_runs(dataset: str, runs: Sequence[str] | None, n: int) -> list[str]:
    table = schema.read_frame(dataset, "runs")
    known = table["run_id"].tolist()
    if runs:
        missing = [r for r in runs if r not in known]
        if missing:
            raise ValueError(f"{dataset}: no run {missing[0]!r} (runs: {', '.join(known) or 'none'})")
        picked = list(runs)
    else:
        picked = table.loc[table["status"].fillna("ok") != "failed", "run_id"].tolist()[:n]
    if len(picked) < n:
        raise ValueError(f"{dataset}: this figure needs {n} run(s) (--run), the dataset offers {len(picked)}")
    return picked[:n]


def _stand_in(dataset: str, run_ids: Sequence[str]) -> bool:
    table = schema.read_frame(dataset, "runs")
    return bool(table.loc[table["run_id"].isin(list(run_ids)), "stand_in"].fillna(False).astype(bool).any())


def _timeline_data(dataset: str, run_id: str, ranks: Sequence[int] | None) -> figures.TimelineData:
    import pyarrow.compute as pc

    filt = pc.field("rank").isin([int(r) for r in ranks]) if ranks else None
    kernels = schema.read_kernels(dataset, columns=figures.TIMELINE_COLUMNS, run_ids=[run_id], filter=filt).to_pandas()
    if not len(kernels):
        raise ValueError(f"{dataset}: run {run_id!r} has no kernels" + (f" on ranks {list(ranks)}" if ranks else ""))
    try:
        residency = kernel_residency(dataset)
    except ValueError:  # the hover's residency is optional: a timeline without it beats no timeline
        residency = None
    return figures.TimelineData(kernels, residency=residency)


def build_figure(
    dataset: str | os.PathLike,
    figure: str,
    *,
    runs: Sequence[str] | None = None,
    ranks: Sequence[int] | None = None,
    window_ms: tuple[float, float] | None = None,
    value: str = "time_ratio",
    width: int = 1100,
):
    """The static HoloViews figure ``figure`` of a dataset (what ``overlapviz export`` writes).

    Parameters
    ----------
    figure : {"timeline", "heatmap", "speedup", "compare", "residency", "ranks"}
    runs
        Run ids: the timeline/residency/ranks run (first), the compare pair (two); the first
        runs of the dataset when None.
    ranks
        Timeline ranks (all when None).
    window_ms
        Timeline/compare time window, ms since the first kernel.
    value
        Heatmap metric: ``time_ratio``, ``speedup`` or ``overlap_fraction``.

    Raises
    ------
    ValueError
        Naming the dataset and what is missing (run, analysis module, column).
    """
    dataset = str(dataset)
    schema.read_metadata(dataset)
    if figure not in FIGURES:
        raise ValueError(f"figure {figure!r} is not one of {', '.join(FIGURES)}")
    if figure == "timeline":
        (run_id,) = _pick_runs(dataset, runs, 1)
        data = _timeline_data(dataset, run_id, ranks)
        steps = schema.read_frame(dataset, "steps")
        title = figures._title(f"Timeline of {run_id}", _stand_in(dataset, [run_id]))
        return figures.timeline(data, x_range=window_ms, steps=steps.loc[steps["run_id"] == run_id], width=width, title=title)
    if figure in ("heatmap", "speedup"):
        table = config_table(dataset)
        if runs:
            table = table.loc[table["run_id"].isin(list(runs))]
        table = table.loc[table["setup"].notna()] if "setup" in table else table.iloc[:0]
        if not len(table):
            raise ValueError(f"{dataset}: no configured runs (workload/setup) to draw a {figure}")
        return figures.heatmap(table, value=value) if figure == "heatmap" else figures.speedup_bars(table)
    if figure == "compare":
        a, b = _pick_runs(dataset, runs, 2)
        try:
            deltas = compare_runs(dataset, a, b)
        except ValueError:
            deltas = metric_deltas(analyze(dataset, run_ids=[a, b]), a, b)
        labels = (figures._title(f"A: {a}", _stand_in(dataset, [a])), figures._title(f"B: {b}", _stand_in(dataset, [b])))
        return figures.compare(_timeline_data(dataset, a, ranks), _timeline_data(dataset, b, ranks), deltas,
                               labels=labels, x_range=window_ms, width=width)  # fmt: skip
    (run_id,) = _pick_runs(dataset, runs, 1)
    if figure == "residency":
        table = kernel_residency(dataset)
        table = table.loc[table["run_id"] == run_id] if "run_id" in table else table
        try:
            delays = comm_start_delays(dataset)
            delays = delays.loc[delays["run_id"] == run_id]
        except ValueError:
            delays = None
        if not len(table):
            raise ValueError(f"{dataset}: run {run_id!r} has no kernel launch shapes for a residency figure")
        return figures.residency(table, delays)
    metrics = analyze(dataset, run_ids=[run_id])
    if not len(metrics):
        raise ValueError(f"{dataset}: run {run_id!r} has no kernels for a ranks figure")
    return figures.ranks(metrics)


def export_dataset_figure(dataset: str | os.PathLike, figure: str, out: str | os.PathLike, fmt: str | None = None,
                          **selection) -> Path:  # fmt: skip
    """``build_figure(dataset, figure, **selection)`` written by ``export_figure`` (the CLI's and the dashboard's export)."""
    obj = build_figure(dataset, figure, **selection)
    return export_figure(obj, out, fmt, title=f"overlapviz {figure} · {Path(dataset).name}")


__all__ = ["FIGURES", "FORMATS", "build_figure", "chromium", "export_dataset_figure", "export_figure", "find_chromium"]
