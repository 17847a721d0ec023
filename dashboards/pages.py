"""Dashboard pages: Panel Viewers over one DataStore; each composes overlapviz figure builders and computes nothing.

Overview (a run's findings and where its communication time went, then the configuration grid of a sweep), Timeline (kernels, each collective's wait by cause, arrows
from producers and blockers), Compare (two runs on linked time axes); the why-pages
(``WhyPage``: late starts by cause, blockers, one SM's budget; ``CollectivesPage``: collectives
across ranks; ``ResidencyPage``: residency per launch shape) live in ``pages_why``.
"""

from __future__ import annotations

import contextlib

import holoviews as hv
import numpy as np
import pandas as pd
import panel as pn
import param
from holoviews.plotting.bokeh.callbacks import RangeXCallback
from holoviews.plotting.plot import Plot as HvPlot
from panel.io.state import set_curdoc

from overlapviz.figures import charts as figures
from overlapviz.figures import timeline as ftl
from overlapviz.analysis import ranks as ranks_analysis
from overlapviz.dashboards.common import (PLOT_WIDTH, Page, controls_row, export_button, export_buttons, hidden, notice, once_loaded, perfetto_button, plot,
                                          StaticTable, in_session, static_plot, table, unavailable, when_computed)  # fmt: skip
from overlapviz.dashboards import pages_findings, patches
from overlapviz.dashboards.pages_why import CollectivesPage, ResidencyPage, WhyPage
from overlapviz.dashboards.store import DataStore, Unavailable, background, busy, stopping, wait_idle

__all__ = ["CollectivesPage", "ComparePage", "OverviewPage", "ResidencyPage", "TimelinePage", "WhyPage"]

# the info note of a page (an Alert's look, drawn inline)
NOTE_STYLE = {"background": "#e7f1fb", "color": "#0b3d66", "border": "1px solid #b6d4f2", "border-radius": "4px", "padding": "0 10px"}

def _note_html(text: str) -> str:
    """A page's info note (an Alert's look, styled inline), or nothing."""
    if not text:
        return ""
    import html

    style = "; ".join(f"{k}: {v}" for k, v in NOTE_STYLE.items())
    return f'<div style="{style}"><p>{html.escape(text)}</p></div>'


COMPUTING_ANSWER = ("Computing this run's findings and where its communication time went (overlapviz explain)… they "
                    "appear here when they come; the Timeline shows the kernels meanwhile.")
_METRICS = {"TimeRatio": "time_ratio", "Speedup": "speedup", "Overlap fraction": "overlap_fraction"}

_CONFIG_TITLES = {
    "run_id": "run", "workload": "workload", "setup": "setup", "smem_pad_bytes": "smem pad (B)", "comm_priority": "comm priority",
    "median_ms": "median iteration (ms)", "time_ratio": "TimeRatio", "speedup": "speedup", "speedup_ci_low": "speedup 95% CI low",
    "speedup_ci_high": "speedup 95% CI high", "overlap_fraction": "overlap", "compute_slowdown": "compute slowdown",
    "stand_in": "stand-in",
}  # fmt: skip


class OverviewPage(Page):
    """The answer first: the chosen run's findings and its breakdown per rank (``pages_findings.answer``); below, for an
    experiment sweep, one heatmap over the configuration grid, where clicking a cell opens that run on the Timeline."""

    value = param.Selector(default="time_ratio", objects=_METRICS, label="Metric")
    workload = param.Selector(default="all", objects=["all"], label="Workload")
    answered = param.Integer(default=0, precedence=-1, doc="Counts the answers that came after the page was drawn")

    def __init__(self, store: DataStore, on_open=None, **params):
        self._fetching: set = set()  # runs whose answer a background thread computes for this page
        self._fetched: set = set()  # runs whose answer it computed (drawn from the store, even if evicted since)
        self._failed: dict = {}  # run -> the error its answer raised (not asked again by this page)
        super().__init__(store=store, **params)
        self.on_open = on_open
        store.open_timeline = on_open  # the other pages' "show on the Timeline" use the dashboard's own callback
        self._pane = None
        self._grid = None
        runs = store.runs
        workloads = sorted(runs.loc[runs["setup"].notna(), "workload"].dropna().astype(str).unique()) if "setup" in runs else []
        self.param.workload.objects = ["all", *workloads]
        if len(workloads) > 1 and runs["setup"].notna().sum() > 40:  # a grid taller than a screen: one workload at a time
            self.workload = workloads[0]

    def _configured(self, workload: str = "all") -> pd.DataFrame | None:
        runs = self.store.runs
        if "setup" not in runs or not runs["setup"].notna().any():
            return None  # imported traces: no grid, and no configuration table to wait for (analyze over every kernel)
        table_ = self.store.config_table()
        configured = table_.get("setup", pd.Series(dtype=object)).notna()
        if workload != "all" and "workload" in table_:
            configured &= table_["workload"] == workload
        return table_.loc[configured] if configured.any() else None

    def _open(self, x, y) -> None:
        if x is None or y is None or self._grid is None:
            return
        g = self._grid
        hit = g.loc[(g["shaping"] == str(x)) & (g["label"] == str(y)), "run_id"]
        if len(hit):
            self.store.run_id = hit.iloc[0]
            if self.on_open is not None:
                self.on_open(hit.iloc[0])

    def _heatmap(self) -> pn.pane.Bokeh:
        """The chosen metric's heatmap over the chosen workload's grid: drawn once per dataset (a copy per
        session, ``static_plot``), a click on a cell opening its run (a Python callback on this copy's tap)."""
        from bokeh.events import Tap

        value, workload = self.value, self.workload
        table_ = self._configured(workload)
        # the grid (cell -> run, whatever the metric) and the heatmap are the same for every session
        self._grid = self.store.memo(("overview grid", workload), lambda: figures.config_grid(table_))
        pane = static_plot(self.store, ("overview heatmap", value, workload), lambda: self._build(table_, value))
        figure = pane.object
        figure.on_event(Tap, lambda event: self._tapped(figure, event))
        self.store.memo(("overview heatmaps", workload), lambda: background(lambda: self._draw_others(table_, workload), "overlapviz-heatmaps"))
        return pane

    def _draw_others(self, table_: pd.DataFrame, workload: str) -> None:
        """The other metrics' heatmaps of ``workload``, drawn once in the background while the user looks at the first:
        a metric change then only copies one (0.3-0.45 s of the server's time each on the samples, drawn on demand)."""
        for value in _METRICS.values():
            wait_idle(5.0)  # a session's page first: one interpreter, one GIL
            if stopping():
                return
            static_plot(self.store, ("overview heatmap", value, workload), lambda value=value: self._build(table_, value), copy=False)

    def _tapped(self, figure, event) -> None:
        """A tap at (x, y) in the heatmap's categorical coordinates: factor k spans [k, k + 1] on its axis."""
        xs, ys = list(figure.x_range.factors), list(figure.y_range.factors)
        if event.x is None or event.y is None:
            return
        i, j = int(np.floor(event.x)), int(np.floor(event.y))
        if 0 <= i < len(xs) and 0 <= j < len(ys):
            self._open(xs[i], ys[j])

    @param.depends("value", "workload", watch=True)
    def _redraw(self) -> None:
        if self._pane is not None and self.shown:  # (a hidden page draws its copy when its tab opens)
            self._pane.objects = [self._heatmap()]

    @staticmethod
    def _build(table_: pd.DataFrame, value: str) -> hv.Overlay:
        sub = table_.loc[pd.to_numeric(table_[value], errors="coerce").notna()] if value in table_ else table_.iloc[:0]
        if not len(sub):  # an empty grid says so in its title
            return figures.heatmap(table_.assign(**{value: 1.0}).iloc[:0], value=value).opts(
                title=f"No {figures.VALUE_SHORT[value]} for these runs (needs sequential and baseline runs)")
        return figures.heatmap(sub, value=value)

    @param.depends("shown")
    def _heatmaps(self):
        # the one page that lets its plot go while its tab is closed (and draws a new copy when it opens: the
        # copy of a figure taken out of the page and put back answered no tap): the dashboard opens on it
        if not self.shown:
            if self._keys.get("heatmaps") == "dropped":
                raise param.Skip
            self._keys["heatmaps"] = "dropped"
            return hidden()
        self._keys["heatmaps"] = "shown"
        try:
            table_ = self._configured()
        except Unavailable as exc:
            return unavailable("Configuration grid", exc)
        if table_ is None:  # imported traces: no grid (the page shows their answer alone)
            return pn.Spacer(height=0)
        self._pane = pn.Column(self._heatmap(), max_height=900, scroll=True, sizing_mode="stretch_width")
        return self._pane

    @param.depends("workload", "shown")
    def _table(self):
        """The configuration table (TimeRatio, speedup with its interval, overlap) under the heatmap."""
        if (spacer := self.visit("table", (self.workload,))) is not None:
            return spacer
        try:
            t = self._configured(self.workload)
        except Unavailable:
            return pn.Spacer()
        if t is None:
            return pn.Spacer()
        cols = [c for c in _CONFIG_TITLES if c in t]
        digits = {c: 3 for c in ("median_ms", "time_ratio", "speedup", "speedup_ci_low", "speedup_ci_high", "compute_slowdown") if c in t}
        if "overlap_fraction" in t:
            t = t.assign(overlap_fraction=pd.to_numeric(t["overlap_fraction"], errors="coerce").map(figures.fmt_pct))
        return StaticTable(t[cols], titles=_CONFIG_TITLES, digits=digits, rows=12)

    @param.depends("store.run_id", "shown", "answered")
    def _answer(self):
        """The run's findings and breakdown (the store's; drawn when the run changes). Not waited for: until they are
        computed (the run's explain: seconds on a million kernels) the page says so, and draws them when they come."""
        run_id = self.store.run_id
        # (outside a served session nothing can be added later: drawn at once)
        ready = run_id is None or run_id in self._fetched or not in_session() or self.store.answer_ready(run_id)
        if (spacer := self.visit("answer", (run_id, ready, self._failed.get(run_id)))) is not None:
            return spacer
        if run_id is None:
            return notice("This dataset has no runs.", "info")
        if ready:
            return pages_findings.answer(self.store, run_id)
        if run_id in self._failed:
            return notice(f"**This run's findings could not be computed** ({self._failed[run_id]}); the server log has the "
                          "traceback. Its kernels are on the **Timeline**.", "danger")  # fmt: skip
        self._fetch_answer(run_id)
        return notice(COMPUTING_ANSWER, "info")

    def _fetch_answer(self, run_id: str) -> None:
        """Compute the run's answer in the background, then draw it (if the run is still the one shown)."""
        if run_id in self._fetching:
            return
        self._fetching.add(run_id)

        def work():
            try:
                for table in (self.store.findings, self.store.breakdown):
                    with contextlib.suppress(Unavailable):  # kept by the store: the answer says why
                        table(run_id)
                self._fetched.add(run_id)
            except Exception as exc:  # noqa: BLE001  (a bug in the analysis: said on the page, in the log)
                self._failed[run_id] = f"{type(exc).__name__}: {exc}"
                import traceback

                traceback.print_exc()
            finally:
                self._fetching.discard(run_id)

        def arrived():
            if self.store.run_id == run_id:
                self.answered += 1

        when_computed(work, arrived, "overlapviz-answer")

    def __panel__(self):
        try:
            grid = self._configured() is not None
        except Unavailable:
            grid = False
        top = [controls_row(self.run_select("Run")), pn.panel(self._answer)]
        if not grid:  # imported traces: their answer alone; no metric to choose, no cell to click
            return pn.Column(*top, sizing_mode="stretch_width", name="Overview")
        header = controls_row(pn.widgets.RadioButtonGroup.from_param(self.param.value, color="primary", variant="outline", align=("start", "end")))
        if len(self.param.workload.objects) > 2:
            header.append(pn.widgets.Select.from_param(self.param.workload, width=140))
        header.append(export_buttons(self.store, ("heatmap", lambda: {"value": self.value}, "Export heatmap"),
                                     ("speedup", dict, "Export forest plot")))  # fmt: skip
        hint = pn.pane.Markdown("Click a cell to open that configuration on the **Timeline**. The forest plot of the "
                                "speedup with its 95% CI is an export.", margin=(0, 10))  # fmt: skip
        return pn.Column(*top, pn.pane.Markdown("### The configuration grid", margin=(20, 10, 0, 10)), header, hint, self._heatmaps,
                         self._table, sizing_mode="stretch_width", name="Overview")  # fmt: skip


TimelineSelection = hv.streams.Stream.define(
    "TimelineSelection", run_id=param.String(default=None, allow_None=True), ranks=param.List(default=[]),
    max_glyphs=param.Integer(default=ftl.MAX_GLYPHS), waits=param.Boolean(default=True), window=param.Parameter(default=None),
    why=param.Integer(default=0, doc="Counts the runs whose why came after their first draw: a new value redraws with it"),
)  # fmt: skip


class ZoomRange(hv.streams.RangeX):
    """The browser's time window, a stream of the Timeline's DynamicMap that does not redraw it by itself: HoloViews
    subscribes each plot's refresh to every stream of its DynamicMap, this one refuses it and the page decides
    (``TimelinePage._zoomed``). A redraw asked for another reason still gets the window in view."""

    def add_subscriber(self, subscriber, precedence=0):
        if getattr(subscriber, "__name__", None) == "refresh" and isinstance(getattr(subscriber, "__self__", None), HvPlot):
            return
        super().add_subscriber(subscriber, precedence)


patches.link_stream(ZoomRange, RangeXCallback)  # linked to the browser's range as RangeX is


def _on_zoom(pane, selection, x_range, relabel, *, ready: bool = True) -> None:
    """A ``ZoomRange`` event of ``pane``: ``relabel(x_range, plot)`` on the server's next tick (a model changes only under
    the document's lock), else (it returns False, or there is no live document) a frame through ``selection``.
    HoloViews' first trigger, sent while the plot is built with the range being drawn, redraws nothing."""
    x_range = None if x_range is None else tuple(x_range)
    plots = [p for p, _ in getattr(pane, "_plots", {}).values()]
    if not plots:
        return
    doc = plots[0].document if len(plots) == 1 else None
    if not ready or doc is None or doc.session_context is None:
        selection.event()  # the frame for the window in view
        return

    def later():
        if not relabel(x_range, plots[0]):
            selection.event()

    doc.add_next_tick_callback(later)


def _set_labels(fig, title: str, fmt: str) -> None:
    """A drawn timeline figure's title and time-axis printf format (``ftl.view_labels``), set in place."""
    from bokeh.models import PrintfTickFormatter

    fig.title.text = title
    for axis in fig.xaxis:
        if getattr(axis.formatter, "format", None) != fmt:
            axis.formatter = PrintfTickFormatter(format=fmt)


COMPUTING_WHY = "Computing why… the kernels are drawn; each collective's wait, arrows and hover why fields follow."


class TimelinePage(Page):
    """Kernels per rank and stream with each collective's wait by cause: rasterized when zoomed out, glyphs with
    hover and arrows when zoomed in.

    One HoloViews pane lives for the page's lifetime: a run, rank, glyph-budget or focus change sends the
    new selection through a stream to its DynamicMap, which redraws the frame into the same Bokeh figure
    (its data sources, ranges and title travel to the browser), as zoom and pan do.
    """

    max_glyphs = param.Integer(default=ftl.MAX_GLYPHS, bounds=(1_000, 200_000), label="Glyphs up to (kernels in view)")
    waits = param.Boolean(default=True, label="Waits and arrows")
    content = param.String(default="hidden", precedence=-1, doc="What the plot area shows: hidden, plot, or a notice")
    why_note = param.String(default="", precedence=-1, doc="Said above the plot while the shown run's why is computed")

    def __init__(self, store: DataStore, **params):
        super().__init__(store=store, **params)
        self._selection = None  # TimelineSelection stream of the live pane, created with it
        self._pane = None
        self._range = None  # the browser's zoom (RangeX linked to the plot)
        self._drawn = None  # (run_id, ranks) of the last frame: a new one resets the zoom
        self._window = None  # a window asked for (focus on a kernel), applied once
        self._applied = None
        self._last = None  # (what was drawn, the frame): the frame asked again for the same view is not drawn again
        self._why_tick = 0  # bumped when a run's why arrives after its kernels were drawn
        self._fetching: set = set()  # runs whose why a background thread computes for this page
        self._why_failed: dict = {}  # run -> the error its why raised (not asked again by this page)

    def _current(self) -> dict:
        return {"run_id": self.store.run_id, "ranks": sorted(int(r) for r in self.store.ranks), "max_glyphs": self.max_glyphs,
                "waits": self.waits, "window": self._window, "why": self._why_tick}  # fmt: skip

    @param.depends("store.run_id", "store.ranks", "max_glyphs", "waits", "shown", watch=True, on_init=True)
    def _follow(self) -> None:
        """Decide what the plot area shows; while the live plot stays, send it the new selection."""
        if not self.shown:
            return  # hidden: no work; the plot catches up when the tab opens
        if self.store.run_id is None:
            self.content = "The dataset has no runs."
            return
        if not len(self.store.timeline(why=None).frame):
            self.content = f"Run {self.store.run_id} has no kernels. {self.store.configuration_text()}"
            return
        if self._selection is not None:
            current = self._current()
            if any(getattr(self._selection, k) != v for k, v in current.items()):
                self._selection.event(**current)
        self.content = "plot"

    @param.depends("store.focus", watch=True)
    def _focus(self) -> None:
        """Show one kernel (asked by another page): its run, its rank's lanes kept, a window around its launch and start."""
        f = self.store.focus
        if not f:
            return
        if self.store.ranks and int(f["rank"]) not in self.store.ranks:
            self.store.ranks = []
        if self.store.run_id != f["run_id"]:
            self.store.run_id = f["run_id"]
        data = self.store.timeline(why=None)
        if hasattr(data, "window_at"):  # kernels on a Dask cluster (dashboards/dask_source.py): found there
            window = data.window_at(int(f["rank"]), int(f["start_ns"]))
            if window is not None:
                self._window = window
                self._follow()
            return
        fr = data.frame
        hit = np.flatnonzero((fr["rank"].to_numpy() == int(f["rank"])) & (fr["start_ns"].to_numpy(np.int64) == int(f["start_ns"])))
        if len(hit):
            self._window = data.window_of(int(hit[0]))
            self._follow()

    def _fetch_why(self, run_id: str) -> None:
        """Compute the run's why in the background, then redraw the view (same zoom) with its tracks."""
        if run_id in self._fetching or run_id in self._why_failed:
            return
        self._fetching.add(run_id)

        def work():
            try:
                self.store.timeline(run_id, ranks=[], why=True)
            except Exception as exc:  # noqa: BLE001  (a bug in the why: said on the page, in the log; the kernels stay)
                self._why_failed[run_id] = f"{type(exc).__name__}: {exc}"
                import traceback

                traceback.print_exc()
            finally:
                self._fetching.discard(run_id)

        when_computed(work, lambda: self._why_arrived(run_id), "overlapviz-why")

    def _why_arrived(self, run_id: str) -> None:
        if self._selection is None or self.store.run_id != run_id:
            return  # another run is shown now: its own frame asked for its why
        self._why_tick += 1
        if not self.shown:
            return  # another tab is open (its page is being drawn): the redraw waits for this tab (_follow)
        self._selection.event(why=self._why_tick)

    def _frame(self, x_range, run_id, ranks, max_glyphs, waits, window, why=0) -> hv.Overlay:
        busy()
        ready = self.store.why_ready(run_id)
        data = self.store.timeline(run_id, ranks=list(ranks), why=None)  # the kernels now, the why when it is at hand
        if not ready:
            self._fetch_why(run_id)
        failed = self._why_failed.get(run_id)
        note = (f"The why of this run could not be computed ({failed}); the kernels are shown." if failed and not ready
                else "" if ready else COMPUTING_WHY)  # fmt: skip
        if (run_id, tuple(ranks)) != self._drawn:
            # another run's zoom means nothing here: show the whole run (xlim sets the axis explicitly)
            x_range, self._drawn = data.x_extent, (run_id, tuple(ranks))
            self._range.update(x_range=None)  # a later budget change must not bring the old zoom back
        if window is not None and window != self._applied:
            x_range = self._applied = window
        key = (run_id, tuple(ranks), max_glyphs, waits, ready, None if x_range is None else tuple(x_range))
        if self._last is not None and self._last[0] == key:
            # the same view asked again: HoloViews re-asks once after the first draw, with the drawn range in the stream
            self._say(note)
            return self._last[1]
        frame = ftl.timeline_view(data, x_range, steps=self.store.steps(run_id), max_glyphs=max_glyphs, waits=waits,
                                  title=self._title(run_id), width=PLOT_WIDTH, responsive=True)  # fmt: skip
        # framewise: each frame sets the axes (another run or rank has another extent, lanes and zoom). The axes stay
        # shared (HoloViews' default): an overlay whose axes are not (shared_axes=False: axiswise) has its ranges computed
        # on the first frame only, and a rank chosen kept every rank's lanes on the y axis
        frame = frame.opts(hv.opts.RGB(framewise=True), hv.opts.Rectangles(framewise=True))
        self._last = (key if x_range is not None else key[:-1] + (tuple(data.x_extent),), frame)
        self._say(note)  # said (or cleared) with the frame it is about
        busy()  # the frame is still to be laid out and sent: background tables wait a little longer
        return frame

    def _title(self, run_id: str) -> str:
        """The run's timeline title, before the count of kernels in view (``ftl.view_labels`` adds it)."""
        return figures.plot_title(f"Timeline of {run_id}", self.store.is_stand_in(run_id))

    def _say(self, note: str) -> None:
        """Set the note above the plot after the frame being drawn is sent: a pane updated while the page around
        it is still being rendered (its model not yet in the document) gets new stylesheet objects, resolved
        to Panel's CDN (blocked by the CSP; no network offline) instead of the page's own."""
        doc = pn.state.curdoc
        if note == self.why_note:
            return
        if doc is None or doc.session_context is None:
            self.why_note = note
            return

        def later():
            once_loaded(doc, lambda: setattr(self, "why_note", note))

        doc.add_next_tick_callback(later)

    def live_pane(self) -> pn.pane.HoloViews:
        """The page's one timeline pane (built on first use with the current selection)."""
        if self._pane is None:
            self._selection = TimelineSelection(**self._current())
            self._range = ZoomRange()
            self._range.add_subscriber(self._zoomed)
            dmap = hv.DynamicMap(self._frame, streams=[self._range, self._selection])
            self._pane = plot(dmap, sizing_mode="stretch_width")
        return self._pane

    def _zoomed(self, x_range=None) -> None:
        """A zoom or pan from the browser. A run drawn whole as glyphs has every kernel, wait and arrow in the browser
        already (Bokeh clips to the window): only the title's count and the axis format change, set on the figure in
        place, with no frame built or sent. Otherwise the window is redrawn (raster, or the glyphs in view)."""
        _on_zoom(self._pane, self._selection, x_range, self._relabel, ready=self._last is not None and self._drawn is not None)

    def _relabel(self, x_range, drawn) -> bool:
        """Set the title and axis format of the drawn figures for ``x_range`` when the drawn frame stays right for it."""
        run_id, ranks = self._drawn
        if x_range is None or self._selection is None or (self._selection.run_id, tuple(self._selection.ranks)) != self._drawn:
            return False
        data = self.store.timeline(run_id, ranks=list(ranks), why=None)
        if not isinstance(data, ftl.TimelineData):
            return False
        drawn_as = self._last[0]  # (run, ranks, max_glyphs, waits, why ready, window)
        if drawn_as[2:5] != (self._selection.max_glyphs, self._selection.waits, self.store.why_ready(run_id)):
            return False  # drawn with another budget or waits, or the why arrived since: a new frame
        if not ftl.drawn_whole(data, self.max_glyphs) and not self._reraster(data, x_range, drawn, drawn_as):
            return False
        _set_labels(drawn.state, *ftl.view_labels(data, x_range, max_glyphs=self.max_glyphs, title=self._title(run_id)))
        return True

    def _reraster(self, data: ftl.TimelineData, x_range, drawn, drawn_as) -> bool:
        """A window rasterized after a frame that was (no glyph layer then or now): only the image changes. It is set in
        the drawn figure's image source, from HoloViews' own conversion of the new raster, instead of HoloViews updating
        every layer of the overlay (most of a million-kernel zoom's server time). False if a frame must be drawn."""
        from holoviews.plotting.bokeh.raster import RGBPlot

        drawn_window = drawn_as[5]
        if data.n_visible(drawn_window) <= self.max_glyphs or data.n_visible(x_range) <= self.max_glyphs:
            return False
        image = next((p for p in drawn.subplots.values() if isinstance(p, RGBPlot) and "source" in p.handles), None)
        if image is None:
            return False
        frame, _, _ = image.get_data(data.raster(x_range, PLOT_WIDTH), {}, {})
        image.handles["source"].data.update(frame)
        return True

    def window(self) -> tuple[float, float] | None:
        """The time window in view (ms since the first kernel), None for the whole run."""
        return None if self._range is None or self._range.x_range is None else tuple(float(v) for v in self._range.x_range)

    @param.depends("content")
    def _plot(self):
        if self.content == "hidden":
            return hidden()
        if self.content != "plot":
            return notice(self.content, "info")
        if getattr(self, "_box", None) is None:  # many lanes: the page keeps its height and the plot scrolls
            self._box = pn.Column(self.live_pane(), max_height=1000, scroll=True, sizing_mode="stretch_width")
        return self._box

    def _info(self) -> pn.pane.Markdown:
        """The run's configuration; its text follows the run in place (no new pane per switch)."""
        return pn.pane.Markdown(pn.bind(self.store.configuration_text, self.store.param.run_id), sizing_mode="stretch_width")

    def __panel__(self):
        controls = controls_row(
            self.run_select(),
            pn.widgets.MultiChoice.from_param(self.store.param.ranks, name="Ranks (empty: all)", width=240),
            pn.widgets.IntInput.from_param(self.param.max_glyphs, width=190),
            pn.widgets.Checkbox.from_param(self.param.waits, align=("start", "end")),
            export_button(self.store, "timeline", lambda: {"runs": [self.store.run_id], "ranks": self.store.ranks or None,
                                                           "window_ms": self.window()}, label="Export timeline",
                          extra=[perfetto_button(self.store)]),
        )  # fmt: skip
        legend = pn.pane.Markdown(
            "Wheel: zoom time · drag: pan · Under each collective its wait from launch to start, by cause "
            "(stream order, event dependency, SM resources, launch latency); arrows come from the producer it waited "
            "for and from the computation kernel that held the SMs. Hover a collective for start, end, launch, delay, "
            "cause, blocker and fit.", sizing_mode="stretch_width", styles={"color": "#444"}, margin=(0, 10))  # fmt: skip
        # the note as inline-styled HTML (no component type of its own to bring a stylesheet); it is set after the
        # frame is drawn (_say), never while the page is being rendered
        note = pn.pane.HTML(self.param.why_note.rx.pipe(_note_html), margin=(0, 10), sizing_mode="stretch_width")
        return pn.Column(controls, self._info(), legend, note, self._plot, sizing_mode="stretch_width", name="Timeline")


CompareSelection = hv.streams.Stream.define(
    "CompareSelection", run_a=param.String(default=None, allow_None=True), run_b=param.String(default=None, allow_None=True))


class ComparePage(Page):
    """Two configurations: their breakdowns side by side with the finding that changed most, their timelines on linked
    time axes that redraw on zoom, and the metric deltas."""

    content = param.String(default="hidden", precedence=-1)

    def __init__(self, store: DataStore, **params):
        super().__init__(store=store, **params)
        self._pane = self._selection = self._range = None
        self._drawn = {}
        self._window = None  # the window in view of a copied pair (``_copied``): the live pane's is its range stream's
        a, b = store.run_a, store.run_b
        if store.warm_up:  # (a store that computes only what is asked draws nothing ahead either)
            store.memo(("compare drawn ahead", a, b), lambda: background(lambda: self._draw_ahead(a, b), "overlapviz-compare"))

    @param.depends("store.run_a", "store.run_b", "shown", watch=True, on_init=True)
    def _follow(self) -> None:
        if not self.shown:
            return
        a, b = self.store.run_a, self.store.run_b
        if self.store.n_runs < 2:
            self.content = (f"This dataset has one run ({a}): Compare needs two. Its timeline is on the **Timeline** page.")
            return
        if a is None or b is None:
            self.content = "Choose two runs."
            return
        if a == b:
            self.content = f"A and B are the same run ({a}): choose another B."
            return
        if not len(self.store.timeline(a, ranks=[]).frame) or not len(self.store.timeline(b, ranks=[]).frame):
            self.content = "One of the two runs has no kernels."
            return
        if self._whole(a) and self._whole(b):
            self.content = f"copy\0{a}\0{b}"
            return
        if self._selection is not None and (self._selection.run_a, self._selection.run_b) != (a, b):
            self._selection.event(run_a=a, run_b=b)
        self.content = "plot"

    def _panel(self, which: str, run: str, x_range) -> hv.Overlay:
        """Run ``run`` as panel ``which`` ("a" or "b") for the window ``x_range``: its title says which, its lanes are
        its own (the two panels share only time)."""
        ov = ftl.timeline_view(self.store.timeline(run, ranks=[]), x_range, title=self._label(which, run), width=PLOT_WIDTH,
                               steps=self.store.steps(run))  # fmt: skip
        return ftl.own_lanes(ov, which)

    def _pair(self, a: str, b: str) -> hv.Layout:
        """The two runs drawn whole, one above the other on one time axis (``_copied``)."""
        both = ftl.shared_extent(self.store.timeline(a, ranks=[]), self.store.timeline(b, ranks=[]))
        return (self._panel("a", a, both) + self._panel("b", b, both)).cols(1)

    def _draw_ahead(self, a: str, b: str) -> None:
        """The first pair's drawing, made in the background once the pages a user opens first are drawn: Compare's first
        visit then copies it (its first drawing cost the samples' cold Compare about 1 s more than a copy)."""
        wait_idle(10.0)
        if stopping() or self.store.n_runs < 2 or a is None or b is None or a == b:
            return
        if self._whole(a) and self._whole(b):
            static_plot(self.store, ("compare", a, b), lambda: self._pair(a, b), copy=False)

    def _whole(self, run: str) -> bool:
        data = self.store.timeline(run, ranks=[])
        return isinstance(data, ftl.TimelineData) and ftl.drawn_whole(data, ftl.MAX_GLYPHS)

    def _copied(self, a: str, b: str) -> pn.pane.Bokeh:
        """Two runs drawn whole (every kernel in the browser, which zooms them by itself): one drawing per dataset and
        pair for every session (``static_plot``: a copy costs a quarter of a HoloViews drawing), whose zoom only sets
        the titles' counts and the axis format in place (``zoomed``, on Bokeh's ``RangesUpdate`` event)."""
        from bokeh.events import RangesUpdate
        from bokeh.plotting import figure as BokehFigure

        pane = static_plot(self.store, ("compare", a, b), lambda: self._pair(a, b))
        shown = {f: f.title.text[:3] for f in pane.object.select({"type": BokehFigure}) if f.title is not None}
        figs = {which: next(f for f, t in shown.items() if t == f"{which.upper()}: ") for which in "ab"}
        self._window = None

        def zoomed(event):
            if event.x0 is None or event.x1 is None:
                return
            self._window = (float(event.x0), float(event.x1))
            for which, run in zip("ab", (a, b)):
                _set_labels(figs[which], *ftl.view_labels(self.store.timeline(run, ranks=[]), self._window, title=self._label(which, run)))

        for fig in figs.values():
            fig.on_event(RangesUpdate, zoomed)
        return pane

    def _frame(self, which: str):
        def frame(x_range, run_a, run_b):
            busy()
            run = run_a if which == "a" else run_b
            if self._drawn.get(which) != (run_a, run_b):
                self._drawn[which] = (run_a, run_b)
                if self._drawn.get("range") != (run_a, run_b):
                    self._drawn["range"] = (run_a, run_b)
                    self._range.update(x_range=None)
                x_range = None
            if x_range is None:  # both runs whole on their shared axis
                x_range = ftl.shared_extent(self.store.timeline(run_a, ranks=[]), self.store.timeline(run_b, ranks=[]))
            key = (run, tuple(x_range))
            last = self._drawn.get(("frame", which))
            if last is not None and last[0] == key:  # asked again for the same view (HoloViews does after the first draw)
                return last[1]
            frame = self._panel(which, run, x_range).opts(hv.opts.RGB(framewise=True), hv.opts.Rectangles(framewise=True))
            self._drawn[("frame", which)] = (key, frame)
            return frame

        return frame

    def live_pane(self) -> pn.pane.HoloViews:
        if self._pane is None:
            self._selection = CompareSelection(run_a=self.store.run_a, run_b=self.store.run_b)
            self._range = ZoomRange()  # one range for both: zoom either, both follow; what is redrawn: _zoomed
            self._range.add_subscriber(self._zoomed)
            a = hv.DynamicMap(self._frame("a"), streams=[self._range, self._selection])
            b = hv.DynamicMap(self._frame("b"), streams=[self._range, self._selection])
            self._pane = plot((a + b).cols(1), sizing_mode="stretch_width")
        return self._pane

    def _zoomed(self, x_range=None) -> None:
        """A zoom or pan (of either panel: they share the time axis) of the live plots, which only a run too large to
        draw whole gets (two runs drawn whole are a copy relabelled in place: ``_copied``): both windows are redrawn.
        Also called once after the first draw with the drawn range, which then redraws nothing."""
        _on_zoom(self._pane, self._selection, x_range, lambda x_range, drawn: False)

    def _label(self, which: str, run: str) -> str:
        return figures.plot_title(f"{which.upper()}: {run}", self.store.is_stand_in(run))

    def window(self):
        if self.content.startswith("copy\0"):
            return self._window
        return None if self._range is None or self._range.x_range is None else tuple(float(v) for v in self._range.x_range)

    @param.depends("content")
    def _plot(self):
        if self.content == "hidden":
            return hidden()
        if self.content.startswith("copy\0"):
            return self._copied(*self.content.split("\0")[1:])
        if self.content != "plot":
            return notice(self.content, "info")
        return self.live_pane()

    def _deltas(self, a: str, b: str) -> pd.DataFrame | None:
        try:
            deltas = self.store.compare(a, b)
        except Unavailable:
            try:
                return ranks_analysis.metric_deltas(self.store.metrics(), a, b)
            except Unavailable:
                return None
        try:  # the start delay also as the sweep report and the README give it (its own name, its own number)
            da, db = self.store.start_delays(a), self.store.start_delays(b)
        except Unavailable:
            return deltas
        rows = []
        for item in ("median_start_delay_at_launch_us",):
            # only where some collective was ready at its launch (the table's fallback, the median of all, is another
            # quantity than the row's name says: a delta between the two would compare unlike numbers)
            va = da[item].iloc[0] if len(da) and da["n_ready_at_launch"].iloc[0] > 0 else None
            vb = db[item].iloc[0] if len(db) and db["n_ready_at_launch"].iloc[0] > 0 else None
            if va is None and vb is None:  # (not "not measured, needs collect": no collective of either was ready at launch)
                continue
            rows.append({"section": "metric", "item": item, "a": va, "b": vb,
                         "delta": None if va is None or vb is None else vb - va,
                         "ratio": None if va in (None, 0) or vb is None else vb / va})  # fmt: skip
        return pd.concat([deltas, pd.DataFrame(rows)], ignore_index=True)

    @param.depends("store.run_a", "store.run_b", "shown")
    def _table(self):
        if (spacer := self.visit("deltas", (self.store.run_a, self.store.run_b))) is not None:
            return spacer
        a, b = self.store.run_a, self.store.run_b
        if self.store.n_runs < 2 or a is None or b is None or a == b:
            return pn.Spacer(height=0)
        deltas = self._deltas(a, b)
        if deltas is None or not len(deltas):
            return notice("No metric deltas for these runs.", "info")
        shown = figures.delta_display(deltas)
        empty = (shown["A"] == "—") & (shown["B"] == "—") if {"A", "B"} <= set(shown) else pd.Series(False, index=shown.index)
        left = ""
        if empty.any():  # e.g. iteration time, TimeRatio, speedup of imported traces: said once, not as rows of dashes
            left = (f"\n\nNot measured in either run, so not shown: {', '.join(shown.loc[empty, 'item'])} (these need runs "
                    "recorded by `overlapviz collect`: its iteration times and sequential baselines).")  # fmt: skip
        return pn.Column(pn.pane.Markdown("#### Metric deltas (B − A)" + left, margin=(10, 10, 0, 10)),
                         StaticTable(shown.loc[~empty].reset_index(drop=True), rows=25, right=["A", "B", "B − A", "95% CI of B − A", "B / A"]))  # fmt: skip

    @param.depends("store.run_a", "store.run_b", "shown")
    def _breakdowns(self):
        """The two runs' breakdowns side by side and the finding that changed most (``pages_findings.compared``)."""
        if (spacer := self.visit("breakdowns", (self.store.run_a, self.store.run_b))) is not None:
            return spacer
        a, b = self.store.run_a, self.store.run_b
        if self.store.n_runs < 2 or a is None or b is None or a == b:
            return pn.Spacer(height=0)
        return pages_findings.compared(self.store, a, b)

    @param.depends("store.run_a", "store.run_b")
    def _info(self):
        return pn.pane.Markdown(
            f"**A** {self.store.configuration_text(self.store.run_a)}\n\n**B** {self.store.configuration_text(self.store.run_b)}"
        )

    def __panel__(self):
        controls = controls_row(
            pn.widgets.Select.from_param(self.store.param.run_a, name="A", width=420),
            pn.widgets.Select.from_param(self.store.param.run_b, name="B", width=420),
        )
        if self.store.n_runs >= 2:
            controls.append(export_button(self.store, "compare", lambda: {"runs": [self.store.run_a, self.store.run_b],
                                                                          "window_ms": self.window()}, label="Export comparison"))  # fmt: skip
        return pn.Column(controls, self._info, self._plot, self._breakdowns, self._table, sizing_mode="stretch_width", name="Compare")
