"""Dashboard pages: Panel Viewers over one DataStore; each composes overlapviz.figures builders."""

from __future__ import annotations

import io
import tempfile
from pathlib import Path

import holoviews as hv
import pandas as pd
import panel as pn
import param
from panel.viewable import Viewer
from param import Skip

from overlapviz import figures
from overlapviz.analysis import ranks as ranks_analysis
from overlapviz.dashboards.store import DataStore, Unavailable

EXPORT_FORMATS = ["png", "svg", "pdf", "html"]


def hidden() -> pn.Spacer:
    """What a page's plot method returns while its tab is not shown: store changes then cost nothing."""
    return pn.Spacer(height=0)


def notice(text: str, kind: str = "warning") -> pn.pane.Alert:
    return pn.pane.Alert(text, alert_type=kind, sizing_mode="stretch_width")


def unavailable(what: str, exc: Exception) -> pn.pane.Alert:
    return notice(f"**{what} not available.** {exc}")


def export_button(store: DataStore, figure: str, options) -> pn.Row:
    """A format choice and a download button producing the page's figure via overlapviz.export."""
    fmt = pn.widgets.Select(label="Export format", options=EXPORT_FORMATS, value="png", width=110)

    def _make():
        from overlapviz import export

        with tempfile.TemporaryDirectory(prefix="ovz-export-") as tmp:
            out = Path(tmp) / f"{figure}.{fmt.value}"
            export.export_dataset_figure(store.path, figure, out, **options())
            data = out.read_bytes()
        download.filename = f"{figure}.{fmt.value}"
        return io.BytesIO(data)

    download = pn.widgets.FileDownload(callback=_make, filename=f"{figure}.png", label="Export figure",
                                       width=150, embed=False)  # fmt: skip
    fmt.param.watch(lambda e: setattr(download, "filename", f"{figure}.{e.new}"), "value")
    return pn.Row(fmt, download, align="end")


class Page(Viewer):
    """A dashboard page over the session's DataStore, told by the Dashboard whether its tab is open."""

    store = param.ClassSelector(class_=DataStore, constant=True)
    shown = param.Boolean(default=False, doc="Set by the Dashboard while this page\'s tab is open")

    def __init__(self, store: DataStore, **params):
        super().__init__(store=store, **params)
        self._hidden_drawn = False

    @param.depends("shown", watch=True)
    def _on_show(self) -> None:
        if self.shown:
            self._hidden_drawn = False

    def hidden(self) -> pn.Spacer:
        """What a plot method returns while the tab is closed: a spacer once, then Skip.

        The spacer drops the page's plots from the document when the tab closes; later store
        changes (a run switch on another page) then re-render nothing and send nothing.
        """
        if self._hidden_drawn:
            raise Skip
        self._hidden_drawn = True
        return hidden()


class OverviewPage(Page):
    """Heatmaps over the configuration grid; clicking a cell opens that configuration on the Timeline."""


    value = param.Selector(default="time_ratio", objects=list(figures.VALUE_LABELS), label="Metric")

    def __init__(self, store: DataStore, on_open=None, **params):
        super().__init__(store=store, **params)
        self.on_open = on_open

    def _open(self, facet: str, grid: pd.DataFrame, x, y) -> None:
        if x is None or y is None:
            return
        hit = grid.loc[(grid["facet"] == facet) & (grid["shaping"] == str(x)) & (grid["priority"] == str(y)), "run_id"]
        if len(hit):
            self.store.run_id = hit.iloc[0]
            if self.on_open is not None:
                self.on_open(hit.iloc[0])

    @param.depends("value", "shown")
    def _heatmaps(self):
        if not self.shown:
            return self.hidden()
        try:
            table = self.store.config_table()
        except Unavailable as exc:
            return unavailable("Configuration grid", exc)
        configured = table.get("setup", pd.Series(dtype=object)).notna()
        if not configured.any():
            return notice("These runs are imported traces without an experiment configuration "
                          "(workload, setup, shaping, priority): there is no grid to show. Open them on the Timeline.",
                          "info")  # fmt: skip
        table = table.loc[configured]
        if self.value not in table or table[self.value].isna().all():
            return notice(f"No {figures.VALUE_LABELS[self.value]} for these runs (needs a sequential/baseline run).", "info")
        layout = figures.heatmap(table, value=self.value)
        grid = figures.config_grid(table)
        for overlay in layout:
            hm = overlay.get(0)
            tap = hv.streams.Tap(source=hm)
            facet = overlay.label
            tap.add_subscriber(lambda x, y, facet=facet: self._open(facet, grid, x, y))
        return pn.pane.HoloViews(layout, backend="bokeh", linked_axes=False)

    def _table(self):
        """The configuration table (TimeRatio, speedup with its interval, overlap) under the heatmaps.

        The speedup forest plot is offered by the export button rather than drawn here: a second
        HoloViews pane on this page kept BokehJS from ever reaching idle in chromium (Panel 1.9.4),
        which stopped every later server update from being applied.
        """
        try:
            table = self.store.config_table()
        except Unavailable:
            return pn.Spacer()
        cols = [c for c in ("run_id", "workload", "setup", "smem_pad_bytes", "comm_priority", "median_ms",
                            "time_ratio", "speedup", "speedup_ci_low", "speedup_ci_high", "overlap_fraction",
                            "compute_slowdown", "stand_in") if c in table]  # fmt: skip
        return pn.widgets.Tabulator(table[cols].round(4), disabled=True, pagination="local", page_size=12,
                                    show_index=False, sizing_mode="stretch_width")  # fmt: skip

    def __panel__(self):
        header = pn.Row(
            pn.widgets.RadioButtonGroup.from_param(self.param.value),
            export_button(self.store, "heatmap", lambda: {"value": self.value}),
        )
        hint = pn.pane.Markdown("Click a cell to open that configuration on the **Timeline** page.")
        return pn.Column(header, hint, self._heatmaps, pn.Row(export_button(self.store, "speedup", dict),
                         pn.pane.Markdown("Speedup per configuration with 95% CI (forest plot)", align="center")),
                         self._table(),
                         sizing_mode="stretch_width", name="Overview")  # fmt: skip


TimelineSelection = hv.streams.Stream.define("TimelineSelection", run_id=None, ranks=(), max_glyphs=figures.MAX_GLYPHS)


class TimelinePage(Page):
    """Kernels per rank and stream: rasterized when zoomed out, hover-able glyphs when zoomed in.

    One HoloViews pane lives for the page's lifetime: a run, rank or glyph-budget change sends the
    new selection through a stream to its DynamicMap, which redraws the frame into the same Bokeh
    figure (only its data sources, ranges and title travel to the browser) rather than building a
    new plot and layout per change.
    """


    max_glyphs = param.Integer(default=figures.MAX_GLYPHS, bounds=(1_000, 200_000), label="Glyphs up to (kernels in view)")
    content = param.String(default="hidden", precedence=-1, doc="What the plot area shows: hidden, plot, or a notice")

    def __init__(self, store: DataStore, **params):
        super().__init__(store=store, **params)
        self._selection = None  # TimelineSelection stream of the live pane, created with it
        self._pane = None
        self._range = None
        self._drawn = None  # (run_id, ranks) of the last frame: a new one resets the zoom

    def _current(self) -> dict:
        return {"run_id": self.store.run_id, "ranks": tuple(sorted(self.store.ranks)), "max_glyphs": self.max_glyphs}

    @param.depends("store.run_id", "store.ranks", "max_glyphs", "shown", watch=True, on_init=True)
    def _follow(self) -> None:
        """Decide what the plot area shows; while the live plot stays, send it the new selection."""
        if not self.shown:
            return  # hidden: no work; the plot catches up when the tab opens
        if self.store.run_id is None:
            self.content = "The dataset has no runs."
            return
        if not len(self.store.timeline().frame):
            self.content = f"Run {self.store.run_id} has no kernels. {self.store.configuration_text()}"
            return
        if self._selection is not None:
            current = self._current()
            if any(getattr(self._selection, k) != v for k, v in current.items()):
                self._selection.event(**current)
        self.content = "plot"

    def _frame(self, x_range, run_id, ranks, max_glyphs) -> hv.Overlay:
        data = self.store.timeline(run_id, ranks=list(ranks))
        if (run_id, ranks) != self._drawn:
            # another run's zoom means nothing here: show the whole run (xlim sets the axis explicitly)
            x_range, self._drawn = data.x_extent, (run_id, ranks)
            self._range.update(x_range=None)  # a later budget change must not bring the old zoom back
        frame = figures.timeline_view(data, x_range, steps=self.store.steps(run_id), max_glyphs=max_glyphs,
                                      title=f"Timeline of {run_id}")  # fmt: skip
        # framewise: each frame sets the axes (another run has another extent, lanes and zoom)
        return frame.opts(hv.opts.RGB(framewise=True), hv.opts.Rectangles(framewise=True), hv.opts.Overlay(shared_axes=False))

    def live_pane(self) -> pn.pane.HoloViews:
        """The page's one timeline pane (built on first use with the current selection)."""
        if self._pane is None:
            self._selection = TimelineSelection(**self._current())
            self._range = hv.streams.RangeX()
            dmap = hv.DynamicMap(self._frame, streams=[self._range, self._selection])
            self._pane = pn.pane.HoloViews(dmap, backend="bokeh", sizing_mode="stretch_width")
        return self._pane

    @param.depends("content")
    def _plot(self):
        if self.content == "hidden":
            return hidden()
        if self.content != "plot":
            return notice(self.content, "info")
        return self.live_pane()

    def _info(self) -> pn.pane.Markdown:
        """The run's configuration; its text follows the run in place (no new pane per switch)."""
        return pn.pane.Markdown(pn.bind(self.store.configuration_text, self.store.param.run_id), sizing_mode="stretch_width")

    def __panel__(self):
        controls = pn.Row(
            pn.widgets.Select.from_param(self.store.param.run_id, label="Configuration", width=420),
            pn.widgets.MultiChoice.from_param(self.store.param.ranks, label="Ranks (empty: all)", width=260),
            pn.widgets.IntInput.from_param(self.param.max_glyphs, width=200),
            export_button(self.store, "timeline", lambda: {"runs": [self.store.run_id], "ranks": self.store.ranks or None}),
        )
        return pn.Column(controls, self._info(), self._plot, sizing_mode="stretch_width", name="Timeline")


class ComparePage(Page):
    """Two configurations on linked time axes, with the metric deltas."""


    def _deltas(self, a: str, b: str) -> pd.DataFrame | None:
        try:
            return self.store.compare(a, b)
        except Unavailable:
            pass
        try:
            metrics = self.store.metrics()
        except Unavailable:
            return None
        return ranks_analysis.metric_deltas(metrics, a, b)

    @param.depends("store.run_a", "store.run_b", "shown")
    def _plot(self):
        if not self.shown:
            return self.hidden()
        a, b = self.store.run_a, self.store.run_b
        if a is None or b is None:
            return notice("Needs two runs.", "info")
        da, db = self.store.timeline(a, ranks=[]), self.store.timeline(b, ranks=[])
        if not len(da.frame) or not len(db.frame):
            return notice("One of the two runs has no kernels.", "info")
        layout = figures.compare(da, db, self._deltas(a, b), labels=(f"A: {a}", f"B: {b}"))
        return pn.pane.HoloViews(layout, backend="bokeh", sizing_mode="stretch_width")

    @param.depends("store.run_a", "store.run_b")
    def _info(self):
        return pn.pane.Markdown(
            f"**A** {self.store.configuration_text(self.store.run_a)}\n\n**B** {self.store.configuration_text(self.store.run_b)}"
        )

    def __panel__(self):
        controls = pn.Row(
            pn.widgets.Select.from_param(self.store.param.run_a, label="A", width=420),
            pn.widgets.Select.from_param(self.store.param.run_b, label="B", width=420),
            export_button(self.store, "compare", lambda: {"runs": [self.store.run_a, self.store.run_b]}),
        )
        return pn.Column(controls, self._info, self._plot, sizing_mode="stretch_width", name="Compare")


class ResidencyPage(Page):
    """Resident blocks per SM per kernel, the limiter, and the communication start delays."""


    @param.depends("store.run_id", "shown")
    def _plot(self):
        if not self.shown:
            return self.hidden()
        try:
            table = self.store.kernel_residency()
        except Unavailable as exc:
            return unavailable("Residency", exc)
        if "run_id" in table:
            table = table.loc[table["run_id"] == self.store.run_id]
        if not len(table):
            return notice(f"No kernel launch shapes with residency for {self.store.run_id}.", "info")
        try:
            delays = self.store.comm_start_delays()
            delays = delays.loc[delays["run_id"] == self.store.run_id]
            extra = None
        except Unavailable as exc:
            delays, extra = None, unavailable("Communication start delays", exc)
        fig = pn.pane.HoloViews(figures.residency(table, delays), backend="bokeh")
        cols = [c for c in ("name", "threads_per_block", "regs_per_thread", "shared_mem_bytes", "blocks_per_sm",
                            "limiter", "occupancy", "comm_blocks_fit_per_sm") if c in table]  # fmt: skip
        tab = pn.widgets.Tabulator(table[cols], pagination="local", page_size=15, disabled=True, show_index=False,
                                   sizing_mode="stretch_width")
        return pn.Column(*([extra] if extra is not None else []), fig, tab, sizing_mode="stretch_width")

    def __panel__(self):
        controls = pn.Row(
            pn.widgets.Select.from_param(self.store.param.run_id, label="Configuration", width=420),
            export_button(self.store, "residency", lambda: {"runs": [self.store.run_id]}),
        )
        return pn.Column(controls, self._plot, sizing_mode="stretch_width", name="Residency")


class RanksPage(Page):
    """Per-rank overlapped and exposed communication, to spot stragglers."""


    @param.depends("store.run_id", "shown")
    def _plot(self):
        if not self.shown:
            return self.hidden()
        try:
            metrics = self.store.metrics()
        except Unavailable as exc:
            return unavailable("Per-rank metrics", exc)
        mine = metrics.loc[metrics["run_id"] == self.store.run_id]
        if not len(mine):
            return notice(f"No kernels, so no per-rank metrics, for {self.store.run_id}.", "info")
        strag = ranks_analysis.straggler_ranks(mine)
        table = mine.assign(straggler=strag.to_numpy()).round(3)
        return pn.Column(
            pn.pane.HoloViews(figures.ranks(mine), backend="bokeh"),
            pn.widgets.Tabulator(table, disabled=True, pagination="local", page_size=16, show_index=False,
                                 sizing_mode="stretch_width"),
            sizing_mode="stretch_width",
        )

    def __panel__(self):
        controls = pn.Row(pn.widgets.Select.from_param(self.store.param.run_id, label="Configuration", width=420))
        return pn.Column(controls, self._plot, sizing_mode="stretch_width", name="Ranks")
