"""What every dashboard page shares: the Page base (told whether its tab is open), notices, tables and the export button."""

from __future__ import annotations

import io
import re
import tempfile
import threading
import time
import traceback
from pathlib import Path

import pandas as pd
import panel as pn
import param
from panel.io.state import set_curdoc
from panel.viewable import Viewer
from param import Skip

from overlapviz.dashboards.store import RENDER_LOCK, DataStore, Unavailable, background, busy, stopping, wait_idle

EXPORT_FORMATS = ["png", "svg", "pdf", "html"]
PLOT_WIDTH = 1100


def in_session() -> bool:
    """Whether a page is drawn for a served session (a browser that can be sent what comes later), not for a test or a
    notebook cell: only there does a page draw what it has at once and add the rest when it comes."""
    doc = pn.state.curdoc
    return doc is not None and doc.session_context is not None


def once_loaded(doc, change) -> None:
    """Make ``change`` to ``doc``'s models now (on the server's loop, as ``doc``'s) if the browser has said "document
    ready", else when it does (Panel's ``onload``). The browser draws the page from the document serialized into its HTML,
    then opens its websocket; Panel drops a change made before "document ready" (``panel.io.document.
    _drain_unconnected_events``: it counts on a serialization still to come). An answer computed in that window never
    reached the page, which said "Computing…" for good (CI, under load: the browser took seconds to connect)."""
    with set_curdoc(doc):
        pn.state.onload(change)


def when_computed(work, arrived, name: str) -> None:
    """Run ``work()`` in a background thread, then ``arrived()`` in the session that asked, on its next tick: the one
    Document call allowed from another thread. A page draws what it has at once and adds what ``work`` computes when it
    comes (the Timeline's why, the Overview's answer). ``work`` starts once the page being drawn is drawn and sent (one
    interpreter, one GIL; and a session being set up takes no callback from another thread: see below)."""
    doc = pn.state.curdoc

    def later():
        once_loaded(doc, arrived)

    def run():
        wait_idle(5.0)
        work()
        if stopping():
            return
        if doc is None or doc.session_context is None:  # (not in_session: a test, a notebook cell)
            arrived()
            return
        # Bokeh's ServerSession takes the document's callbacks in two steps (bokeh/server/session.py __init__): one added
        # from another thread in between raises here and would be lost; tried again, it is taken. A session that ended
        # keeps raising: its page is gone
        for _ in range(5):
            try:
                doc.add_next_tick_callback(later)
                return
            except Exception:  # noqa: BLE001
                time.sleep(0.2)

    background(run, name)


def hidden() -> pn.Spacer:
    """What a page's plot method returns while its tab is not shown: store changes then cost nothing."""
    return pn.Spacer(height=0)


def notice(text: str, kind: str = "warning") -> pn.pane.Alert:
    return pn.pane.Alert(text, alert_type=kind, sizing_mode="stretch_width")


def unavailable(what: str, exc: Exception) -> pn.pane.Alert:
    return notice(f"**{what} not available.** {exc}")


def plot(obj, **kw) -> pn.pane.HoloViews:
    """A HoloViews pane whose axes are its own: Panel would otherwise link the ranges of every plot in the
    document that shares a dimension name (the SM budget's y with the cause bars', a hidden timeline's with both)."""
    return pn.pane.HoloViews(obj, backend="bokeh", linked_axes=False, **kw)


def static_plot(store: DataStore, key, build, *, copy: bool = True) -> pn.pane.Bokeh | None:
    """A figure with no server-side interaction (its hover, zoom and pan run in the browser), drawn by
    HoloViews once per dataset and ``key`` for every session: each session gets a copy of the Bokeh
    models made from the first drawing's serialized form, with model ids of its own (a document may
    hold two copies). A copy costs a quarter of a drawing (a 12.5k-point scatter: 0.07 s, drawn 0.31 s), and is made
    ahead: the drawing itself is the first session's, and the next session's is made in the background
    (``_spare``) while the page is looked at. Not for a figure with streams or a DynamicMap: their callbacks belong to
    the HoloViews plot. ``copy=False``: only draw it, or make its next copy, ahead (from a background thread), no pane."""
    import holoviews as hv
    from bokeh.core.serialization import Serializer

    name = (store.path, store.stamp, key)
    drawn = []

    def draw():
        model = hv.render(build(), backend="bokeh")
        serialized = Serializer().serialize(model)
        drawn.append(model)  # in no document yet: the first copy
        return serialized

    # one HoloViews drawing at a time, a background one (a heatmap, Compare's pair) or a page's (``drawing`` holds the
    # lock too); taken before the figure's own lock in the figure cache, in every thread (the one order: no deadlock)
    with RENDER_LOCK:
        serialized = store.figure(key, draw)
    if drawn:
        _put_spare(name, serialized, drawn[0])
    if not copy:
        if not drawn and not _has_spare(name, serialized):
            # drawn by an earlier server (the table cache): its first copy is made here, ahead, too
            _put_spare(name, serialized, _copy_of(serialized))
        return None
    figure = _take_spare(name, serialized)
    _spare(name, serialized)
    return pn.pane.Bokeh(figure if figure is not None else _copy_of(serialized))


_SPARES: dict = {}  # (dataset, state, figure key) -> (its serialized form, a copy in no document yet)
_SPARES_LOCK = threading.Lock()
_MAX_SPARES = 64  # as many as the figure cache holds (a copy of a million-kernel page's figure: a few MB)


def _put_spare(name, serialized, figure) -> None:
    with _SPARES_LOCK:
        _SPARES.pop(name, None)
        _SPARES[name] = (serialized, figure)
        while len(_SPARES) > _MAX_SPARES:
            _SPARES.pop(next(iter(_SPARES)))


def _has_spare(name, serialized) -> bool:
    """Whether a copy made from this serialized form waits for ``name`` (one made from an older drawing does not count)."""
    with _SPARES_LOCK:
        return name in _SPARES and _SPARES[name][0] is serialized


def _take_spare(name, serialized):
    """The copy made ahead for ``name``, if one was made from this serialized form (else None)."""
    with _SPARES_LOCK:
        entry = _SPARES.get(name)
        if entry is None or entry[0] is not serialized:
            return None
        del _SPARES[name]
        return entry[1]


def _spare(name, serialized) -> None:
    """Ask for the next session's copy of ``name``: made by one background thread, one copy at a time, each once no
    page is being drawn (one interpreter: a dozen copies made at once after a page held the GIL through the user's next
    widget change). Asked for when a figure is shown (a page drawn, a widget change): that waits until it is sent."""
    busy()
    with _SPARES_LOCK:
        _WANTED[name] = serialized
        if _WORKER and _WORKER[0].is_alive():
            return
        _WORKER[:] = [background(_make_spares, "overlapviz-copies")]


def _make_spares() -> None:
    while not stopping():
        wait_idle(5.0)
        with _SPARES_LOCK:
            if not _WANTED:
                _WORKER.clear()
                return
            name, serialized = _WANTED.popitem()
        if not _has_spare(name, serialized):
            _put_spare(name, serialized, _copy_of(serialized))


_WANTED: dict = {}  # figure name -> its serialized form: copies asked for, not yet made
_WORKER: list = []  # the thread making them (``_make_spares``), while it runs


def _copy_of(serialized):
    """New Bokeh models from ``Serializer().serialize(model)`` (the model and every model it refers to)."""
    from bokeh.core.serialization import Deserializer, Serialized
    from bokeh.util.serialization import make_id

    ids: dict[str, str] = {}

    def renamed(rep):
        if isinstance(rep, dict):
            # a model ({"type": "object", "id": ...}) or a reference to one ({"id": ...}); any other
            # mapping is {"type": "map", "entries": [...]} in this form
            if "id" in rep and (rep.get("type") == "object" or len(rep) == 1):
                if rep["id"] not in ids:
                    ids[rep["id"]] = make_id()
                return {k: ids[rep["id"]] if k == "id" else renamed(v) for k, v in rep.items()}
            return {k: renamed(v) for k, v in rep.items()}
        if isinstance(rep, (list, tuple)):  # a map's entries are (key, value) tuples: a model's callbacks refer to models
            return type(rep)(renamed(v) for v in rep)
        return rep

    return Deserializer().deserialize(Serialized(content=renamed(serialized.content), buffers=serialized.buffers))


def table(frame: pd.DataFrame, *, titles: dict | None = None, page_size: int = 12, remote: bool = False, height: int | None = None,
          selectable=False, **kw) -> pn.widgets.Tabulator:  # fmt: skip
    """A read-only Tabulator: paginated (remotely for long tables: only the shown page travels), readable titles,
    a fixed height (a page of rows, its titles and the page buttons). Left to find its height, Tabulator
    measures it again on each layout pass: 0.2-0.3 s of the browser's time per table."""
    if height is None:
        rows = min(page_size, len(frame))
        height = _TITLE_ROW_PX + rows * _ROW_PX + _PAGER_PX  # the page buttons are there for one page too
    return pn.widgets.Tabulator(
        frame, disabled=True, show_index=False, pagination="remote" if remote else "local", page_size=page_size,
        titles=titles or {}, sizing_mode="stretch_width", layout="fit_data_stretch", selectable=selectable, height=height, **kw,
    )  # fmt: skip


_TITLE_ROW_PX, _ROW_PX, _PAGER_PX = 40, 29, 44  # Tabulator's rows in Panel's design (a short table scrolls inside)

_STATIC_CSS = """
.ovz-table { max-height: var(--ovz-height); overflow: auto; border: 1px solid #dee2e6; border-radius: 4px; }
.ovz-table table { border-collapse: collapse; width: 100%; font-size: 13px; font-variant-numeric: tabular-nums; }
.ovz-table th { position: sticky; top: 0; background: #f4f5f7; text-align: left; font-weight: 600; white-space: nowrap;
  padding: 6px 10px; border-bottom: 1px solid #dee2e6; }
.ovz-table td { padding: 4px 10px; border-bottom: 1px solid #eef0f2; white-space: nowrap; }
.ovz-table tbody tr:nth-child(even) { background: #fafbfc; }
.ovz-table tbody tr:hover { background: #eef3fb; }
.ovz-table td:first-child { white-space: normal; overflow-wrap: anywhere; min-width: 12em; }
"""


def _escape(text: str) -> str:
    """Text as HTML content (what ``DataFrame.to_html(escape=True)`` escapes: a kernel's name is not markup)."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _cell_text(x, digits: int | None) -> str:
    if x is None or x is pd.NA or x is pd.NaT or (isinstance(x, float) and x != x):
        return "—"
    return f"{x:,.{digits}f}" if digits is not None and isinstance(x, (int, float)) else str(x)


class StaticTable(pn.pane.HTML):
    """A short read-only table as plain HTML: its titles stay in view while it scrolls inside a fixed height, numbers
    right-aligned with thousands separators, a missing value as "—". What the browser draws in a few milliseconds where
    a Tabulator (``table``) costs 0.3 s of its time and 0.1 s of the server's; for a long table (remote pages) or one
    whose rows are chosen, use ``table``. ``frame``: the rows shown (in that order); ``digits``: decimals per number
    column; ``right``: text columns of numbers, right-aligned too; ``rows``: the rows in view before it scrolls."""

    def __init__(self, frame: pd.DataFrame, *, titles: dict | None = None, digits: dict | None = None, right=(), rows: int = 12,
                 **params):  # fmt: skip
        self.frame = frame
        titles, digits = titles or {}, digits or {}
        numeric = [i for i, c in enumerate(frame.columns, 1)
                   if c in digits or c in right or pd.api.types.is_numeric_dtype(frame[c].dtype)]  # fmt: skip
        # the rows written out here: DataFrame.to_html formats every cell again through its own machinery (0.09 s of
        # the 200 instances on Collectives, a fifth of the page's server time; this: 0.02 s)
        cells = [[_escape(_cell_text(x, digits.get(c))) for x in frame[c].tolist()] for c in frame.columns]
        head = "".join(f"<th>{_escape(str(titles.get(c, c)))}</th>" for c in frame.columns)
        lines = "\n".join("<tr>" + "".join(f"<td>{v}</td>" for v in row) + "</tr>" for row in zip(*cells))
        body = f'<table border="0" class="dataframe">\n<thead><tr style="text-align: right;">{head}</tr></thead>\n<tbody>\n{lines}\n</tbody>\n</table>'
        css = "".join(f".ovz-table td:nth-child({i}), .ovz-table th:nth-child({i}) {{ text-align: right; }}\n" for i in numeric)
        height = _TITLE_ROW_PX + min(rows, max(len(frame), 1)) * _ROW_PX
        params.setdefault("sizing_mode", "stretch_width")
        super().__init__(f'<div class="ovz-table" style="--ovz-height: {height}px">{body}</div>',
                         stylesheets=[_STATIC_CSS + css], disable_math=True, **params)  # fmt: skip


def controls_row(*objects) -> pn.FlexBox:
    """A page's row of controls, wrapped onto a second line where the window is too narrow for it (a Row let its last
    buttons overlap: the export format and buttons, one Column, were laid out narrower than they are)."""
    return pn.FlexBox(*objects, flex_wrap="wrap", align_items="flex-end", sizing_mode="stretch_width", margin=0)


class ExportButton(pn.widgets.FileDownload):
    """A FileDownload whose failure is said in the page (``message``), not only in the server log."""

    def __init__(self, message: pn.pane.Alert, **params):
        super().__init__(**params)
        self._message = message

    @param.depends("_clicks", watch=True)
    def _transfer(self):
        try:
            super()._transfer()
            self._message.visible = False
        except Exception as exc:  # noqa: BLE001  (any failure is the user's to read, with the reason)
            reason = str(exc) if isinstance(exc, (ValueError, Unavailable)) else f"{type(exc).__name__}: {exc}"
            self._message.object = f"**Export failed.** {reason}"
            self._message.visible = True
            if not isinstance(exc, (ValueError, Unavailable)):
                traceback.print_exc()


def export_buttons(store: DataStore, *items, extra=()) -> pn.Column:
    """One format choice and a download button per ``(figure, options, label)``: ``figure`` as the page shows it
    (``options()``: ``build_figure``'s selection), drawn from the store's cached tables; a failure is shown
    under the buttons. ``extra``: other download buttons kept in the same group. The group's ``buttons`` attribute
    holds each figure's button: a page hides one while its view is unavailable."""
    fmt = pn.widgets.Select(label="Export format", options=EXPORT_FORMATS, value="png", width=110)
    message = pn.pane.Alert("", alert_type="danger", visible=False, width=460, margin=(0, 5))  # not stretched: the group keeps its width in a wrapping row
    buttons: dict[str, ExportButton] = {}
    for figure, options, label in items:

        def _make(figure=figure, options=options):
            from overlapviz.export import render as export

            with tempfile.TemporaryDirectory(prefix="ovz-export-") as tmp, RENDER_LOCK:  # (HoloViews draws it: see static_plot)
                out = Path(tmp) / f"{figure}.{fmt.value}"
                export.export_dataset_figure(store.path, figure, out, source=store, reuse_browser=True, **options())
                data = out.read_bytes()
            buttons[figure].filename = f"{figure}.{fmt.value}"
            return io.BytesIO(data)

        buttons[figure] = ExportButton(message, callback=_make, filename=f"{figure}.png", label=label, width=170, embed=False,
                                       color="primary", variant="outline", align=("start", "end"))  # fmt: skip

    def _fmt(event):
        for figure, b in buttons.items():
            b.filename = f"{figure}.{event.new}"

    fmt.param.watch(_fmt, "value")
    group = pn.Column(pn.Row(fmt, *buttons.values(), *extra, align=("start", "end")), message, margin=0)
    group.buttons = buttons
    return group


def perfetto_button(store: DataStore) -> pn.Column:
    """Download the shown run's trace for Perfetto (``<run>.perfetto.json.gz``): exactly what
    ``overlapviz export DATASET --format perfetto --run RUN`` writes (``overlapviz.export.perfetto.write_perfetto``: kernels per
    rank and stream, each collective's wait with its cause, blocker and fit, flow arrows, overlap counters)."""
    message = pn.pane.Alert("", alert_type="danger", visible=False, width=460, margin=(0, 5))  # not stretched: the group keeps its width in a wrapping row

    def _make():
        run_id = store.run_id
        if run_id is None:
            raise ValueError("no run chosen")
        data = store.perfetto_trace(run_id)  # written once per run and dataset state, not per click
        button.filename = f"{re.sub(r'[^A-Za-z0-9._-]', '_', str(run_id))}.perfetto.json.gz"
        return io.BytesIO(data)

    button = ExportButton(message, callback=_make, filename="trace.perfetto.json.gz", label="Perfetto trace", width=150,
                          embed=False, color="primary", variant="outline", align=("start", "end"),
                          description="The run's kernels and the why (waits by cause, blockers, arrows) as a trace for "
                                      "ui.perfetto.dev")  # fmt: skip
    return pn.Column(button, message, margin=0, align=("start", "end"))


def export_button(store: DataStore, figure: str, options, *, label: str = "Export figure", extra=()) -> pn.Column:
    """``export_buttons`` for one figure."""
    return export_buttons(store, (figure, options, label), extra=extra)


class Page(Viewer):
    """A dashboard page over the session's DataStore, told by the Dashboard whether its tab is open."""

    store = param.ClassSelector(class_=DataStore, constant=True)
    shown = param.Boolean(default=False, doc="Set by the Dashboard while this page's tab is open")

    def __init__(self, store: DataStore, **params):
        self._keys: dict = {}  # what each view shows now (set before the Page's init: views may be drawn there)
        super().__init__(store=store, **params)

    def _exportable(self, figure: str, yes: bool) -> None:
        """Show the export button of ``figure`` (of the group the page keeps as ``_exports``) only while its view is drawn:
        a view the page says is unavailable has no export but a failure."""
        group = getattr(self, "_exports", None)
        if group is not None and figure in group.buttons:
            group.buttons[figure].visible = yes

    @property
    def live(self) -> bool:
        """Whether the page holds a live HoloViews plot (a DynamicMap fed by streams): it stays in the session's document.
        Taken out and put back, the Timeline's new plot showed the run it showed before (HoloViews draws a new plot of a
        DynamicMap from the frame the DynamicMap holds; ``DynamicMap.reset()`` before putting it back fixes that, 224dfd7).
        Kept anyway: on the million-kernel set, taking the Timeline out cost the page opened after it 0.5-0.7 s (the 1M
        Collectives 1.7 → 2.3 s warm) for 0.1 s saved per samples' metric change (bench, 2026-12-04)."""
        return isinstance(getattr(self, "_pane", None), pn.pane.HoloViews)

    def visit(self, name: str, key) -> pn.Spacer | None:
        """Whether view ``name`` must be drawn for ``key`` (what it shows: run, filters, ...).

        Returns None when it must be drawn; raises Skip to keep what the page has (the tab is closed, or it already
        shows ``key``: reopening a tab redraws nothing); returns a spacer for a view never drawn while its tab
        is closed. A store change made on another page (a run switch) is drawn when this tab opens again.
        """
        if not self.shown:
            if name in self._keys:
                raise Skip
            return hidden()
        if name in self._keys and self._keys[name] == key:
            raise Skip
        self._keys[name] = key
        busy()
        return None

    def hidden(self) -> pn.Spacer:
        """A spacer for a plot area while the tab is closed (the Timeline and Compare keep their live plots)."""
        return hidden()

    def run_select(self, label: str = "Configuration") -> pn.widgets.Select:
        return pn.widgets.Select.from_param(self.store.param.run_id, name=label, width=460)
