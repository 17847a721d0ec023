"""Every patch of Bokeh, Panel and HoloViews internals the dashboard makes, in one place (``install``), each checked
against the running versions before it is used; ``tests/test_dashboard_patches.py`` fails when upstream changes what
they rely on. pyproject.toml pins Bokeh and Panel to the minor versions they are tested on (issue 34).

* ``HasProps.query_properties_with_values`` (Bokeh), made to skip the defaults it does not send before computing them
  (reads ``HasProps._property_values``, ``_unstable_default_values``): ``install_serialization``.
* ``bokeh.model.util.visit_immediate_value_references`` and ``visit_value_and_its_immediate_references``, made to read
  the values a model holds (``_property_values``, ``_unstable_default_values``, ``_unstable_themed_values``):
  ``install_walk``.
* The Bokeh server's Tornado application (``Server._tornado``), where ``security.install`` puts its gate: ``tornado_app``.
* HoloViews' registry of the Bokeh callbacks of its streams (``Stream._callbacks``), where the Timeline's zoom stream is
  linked to the browser's range as ``RangeX`` is: ``link_stream``.
* In the browser, BokehJS's ``VisualProperties._get_css_value`` and ``PlotView.base_font_size``: ``PAGE_TEMPLATE``, the
  page's template (a session's ``Document.template``), runs ``BROWSER_PATCH`` once BokehJS is loaded.

Serialization
-------------
Every model a page sends to the browser goes through ``HasProps.query_properties_with_values(include_defaults=False)``,
and Bokeh (3.x) computes the value of every property there, defaults included (validated, themed, copied), and only
then drops those it does not send: its own TODO says the check "should happen before get_value()". On the
Collectives page of a million-kernel dataset that was 0.8 s of the server's 1.7 s per visit (py-spy), and 70-80% of
each figure's serialization. The version here checks first and sends the same properties with the same values.

The walk over a document's models
---------------------------------
Every change of a session's document walks every model in it, more than once: Panel's ``Bokeh`` pane selects the
``CustomJS`` of a figure it shows (``Model.select``), a layout's update collects the references of what it holds, and
Bokeh's ``DocumentModelManager.recompute`` collects those of every root. Bokeh's walk
(``bokeh.model.util.visit_immediate_value_references``) reads each property that may hold a model through its
descriptor: a property left at its default has that default computed again (themed, validated, copied) on each
walk, and each value visited imports ``Model`` anew. On the samples' Overview, with the Compare and the Timeline in
the document, that was 230 ms of the server's 280 ms per metric change (py-spy). The walk here reads what was set,
and the defaults Bokeh keeps once made, from the model itself; it computes a default only where Bokeh keeps none,
and once per class for a default that refers to no model. It visits the same values in the same order.

The browser: visuals' CSS variables
-----------------------------------
BokehJS 3.9 lets a stylesheet style a plot's lines, fills, text and hatches through CSS variables (``--bk-line-color``
and the like): every time a visual is asked whether it draws (``doit``: each plot's layout, each label measured) or is
applied to the canvas, it reads ``getComputedStyle(element).getPropertyValue(...)`` for each of its properties, and that
read makes the browser recompute the page's styles whenever a layout has changed the page since the last one. On a page
switch of the million-kernel set that was a third of chromium's busy time (0.3-1.5 s; Collectives 0.47-0.71 s, Residency
0.97-1.46 s of 2.5-4.3 s: Chrome CPU profiles, 2026-12-07), spent in ``getPropertyValue``. No stylesheet of this page
(BokehJS's, Panel's, ours) sets such a variable, so every read returns "" and the model's value is used: the patch
returns "" without the read. ``base_font_size`` (a plot's font size in px, for sizes in ``em``) reads the computed font
size of the plot at each layout for the same reason; it is kept per plot view once known (no stylesheet here changes
it). Each patch is made only where BokehJS still defines what it replaces (checked in the page, and against the BokehJS
file by tests/test_dashboard_patches.py); ``Bokeh.overlapviz_patches`` lists those made.
"""

from __future__ import annotations

from typing import Any, Callable

from bokeh.core.has_props import HasProps
from bokeh.core.property.descriptors import UnsetValueError
from bokeh.core.property.singletons import Undefined
from bokeh.core.property.wrappers import PropertyValueContainer
from bokeh.core.serialization import Buffer
from bokeh.model import Model
from bokeh.model import util as _util
from bokeh.util.dataclasses import entries, is_dataclass


def install() -> dict[str, bool]:
    """Use the patches that pass their check in this process (the dashboard server's): which were installed."""
    return {"serialization": install_serialization(), "walk": install_walk()}


def tornado_app(server):
    """The Tornado application of a Bokeh ``Server`` (Panel's ``pn.serve(..., start=False)``): Bokeh keeps it private
    (``Server._tornado``, a ``BokehTornado``) and offers no other way to add a rule before its own routes."""
    from bokeh.server.tornado import BokehTornado

    app = getattr(server, "_tornado", None)
    if not isinstance(app, BokehTornado):
        raise TypeError(f"this Bokeh's Server keeps no BokehTornado as _tornado ({type(app).__name__}): security.install "
                        "cannot put its gate in front of the routes")  # fmt: skip
    return app


def link_stream(stream: type, callback: type) -> None:
    """Make HoloViews' Bokeh backend link ``stream`` (a stream class) to the browser with ``callback`` (a
    ``holoviews.plotting.bokeh.callbacks.Callback`` class), as HoloViews registers its own streams' callbacks."""
    from holoviews.streams import Stream

    Stream._callbacks["bokeh"][stream] = callback


# -- serialization ----------------------------------------------------------------------------------------------------

_ORIGINAL_QUERY = HasProps.query_properties_with_values


def _query_properties_with_values(self: HasProps, query, *, include_defaults: bool = True,
                                  include_undefined: bool = False) -> dict[str, Any]:  # fmt: skip
    """``HasProps.query_properties_with_values`` with the keys that are not sent left out before their value is computed."""
    if include_defaults:
        return _ORIGINAL_QUERY(self, query, include_defaults=True, include_undefined=include_undefined)
    # as Bokeh's: what was set, the defaults that are mutable containers or models (kept once made), what a theme sets
    themed = self.themed_values()
    themed_keys = set(themed) if themed is not None else set()
    selected = set(self._property_values) | set(self._unstable_default_values) | themed_keys
    result: dict[str, Any] = {}
    for key in self.properties(_with_props=True):
        if key not in selected:
            continue  # (Bokeh computes it here, then drops it)
        descriptor = self.lookup(key)
        if not query(descriptor):
            continue
        try:
            value = descriptor.get_value(self)
        except UnsetValueError:
            if not include_undefined:
                raise
            value = Undefined
        else:
            if key not in themed_keys and isinstance(value, PropertyValueContainer) and key in self._unstable_default_values:
                continue  # an unmodified default container
        result[key] = value
    return result


def install_serialization() -> bool:
    """Use the version here in this process (the dashboard server's) if it sends what Bokeh's sends for a figure; the
    check keeps Bokeh's where a later Bokeh changed what the version here relies on. Returns whether it is used."""
    try:
        probe = _probe_figure()
        same = sent(probe, _ORIGINAL_QUERY) == sent(probe, _query_properties_with_values)
    except Exception:  # noqa: BLE001  (another Bokeh's internals: keep its own)
        same = False
    if same:
        HasProps.query_properties_with_values = _query_properties_with_values
    return same


def uninstall_serialization() -> None:
    """Bokeh's own again (tests compare the two)."""
    HasProps.query_properties_with_values = _ORIGINAL_QUERY


def sent(model, query_properties_with_values=None):
    """What a model's serialization holds, with ``query_properties_with_values`` (the one in use when None) and its
    binary buffers as bytes (their ids are new on each serialization): equal for the same models sent the same way."""
    from bokeh.core.serialization import Serializer

    used = HasProps.query_properties_with_values
    if query_properties_with_values is not None:
        HasProps.query_properties_with_values = query_properties_with_values
    try:
        content = Serializer().serialize(model).content
    finally:
        HasProps.query_properties_with_values = used

    return with_buffers(content, Buffer.to_bytes)


def with_buffers(content, convert):
    """``content`` (a serialized form: dicts, lists and tuples) with each binary ``Buffer`` in it replaced by
    ``convert(buffer)``."""
    if isinstance(content, Buffer):
        return convert(content)
    if isinstance(content, dict):
        return {k: with_buffers(v, convert) for k, v in content.items()}
    if isinstance(content, (list, tuple)):
        return type(content)(with_buffers(v, convert) for v in content)
    return content


def _probe_figure():
    """A small figure with a data source, a glyph, axes, tools and a title (every kind of default is in it)."""
    import numpy as np
    from bokeh.models import ColumnDataSource, HoverTool, LinearAxis, Plot, Quad, Range1d, Title, WheelZoomTool

    source = ColumnDataSource({"left": np.arange(3), "right": np.arange(3) + 1, "color": ["#000000", "#111111", "#222222"]})
    fig = Plot(x_range=Range1d(0, 4), y_range=Range1d(0, 1), title=Title(text="probe"), tools=[WheelZoomTool(), HoverTool()])
    fig.add_glyph(source, Quad(left="left", right="right", bottom=0, top=1, fill_color="color"))
    fig.add_layout(LinearAxis(), "below")
    return fig


# -- the walk over a document's models --------------------------------------------------------------------------------

_ORIGINAL_WALK = (_util.visit_immediate_value_references, _util.visit_value_and_its_immediate_references)
_SCALARS = frozenset({int, float, str, bool, type(None)})
# (class, property) whose unthemed default is the same value for every instance (not one made per instance) and
# refers to no model: skipped without computing it
_NO_REFS: set[tuple[type, str]] = set()


def _visit_immediate(value: Any, visitor: Callable[[Model], None]) -> None:
    """``visit_immediate_value_references``: the models ``value`` refers to directly (through its properties when it is
    a model or another ``HasProps``), without descending into them."""
    if not isinstance(value, HasProps):
        _visit_value(value, visitor)
        return
    cls = type(value)
    held = value._property_values
    themed = value.themed_values()
    for name in cls.properties_with_refs():
        if name in held:
            child = held[name]
        else:
            is_themed = themed is not None and name in themed
            kept = value._unstable_themed_values if is_themed else value._unstable_default_values
            if name in kept:
                child = kept[name]
            elif not is_themed and (cls, name) in _NO_REFS:
                continue
            else:
                child = getattr(value, name)  # Bokeh's own (and it keeps a default made per instance)
                if not is_themed and name not in kept and not _refers(child):
                    _NO_REFS.add((cls, name))  # a default shared by every instance of the class, with no model in it
        if type(child) not in _SCALARS:
            _visit_value(child, visitor)


def _visit_value(obj: Any, visitor: Callable[[Model], None]) -> None:
    """``visit_value_and_its_immediate_references``: a model is visited; containers, dataclasses and other ``HasProps``
    are descended into (the same order as Bokeh's)."""
    typ = type(obj)
    if typ in _SCALARS:
        return
    if typ is list or issubclass(typ, (list, tuple)):
        for item in obj:
            if type(item) not in _SCALARS:
                _visit_value(item, visitor)
    elif issubclass(typ, dict):
        for key, value in obj.items():
            if type(key) not in _SCALARS:
                _visit_value(key, visitor)
            if type(value) not in _SCALARS:
                _visit_value(value, visitor)
    elif issubclass(typ, HasProps):
        if issubclass(typ, Model):
            visitor(obj)
        else:
            _visit_immediate(obj, visitor)
    elif is_dataclass(obj):
        for _, value in entries(obj):
            _visit_value(value, visitor)


def _refers(value: Any) -> bool:
    found: list[Model] = []
    _visit_value(value, found.append)
    return bool(found)


def install_walk() -> bool:
    """Use the walk here in this process (the dashboard server's) if it finds what Bokeh's finds, in the same order, for
    a probe document; the check keeps Bokeh's where a later Bokeh changed what the walk here relies on. Returns whether
    it is used."""
    try:
        probe = _probe_layout()  # (the walk here first: Bokeh's keeps the defaults it makes, which the walk here then reads)
        same = walked(probe, _visit_immediate, _visit_value) == walked(probe, *_ORIGINAL_WALK)
    except Exception:  # noqa: BLE001  (another Bokeh's internals: keep its own)
        same = False
    if same:
        _use((_visit_immediate, _visit_value))
    return same


def uninstall_walk() -> None:
    """Bokeh's own again (tests compare the two)."""
    _use(_ORIGINAL_WALK)
    _NO_REFS.clear()


def _use(pair) -> tuple:
    """Make ``collect_models`` walk with ``pair`` (visit_immediate_value_references, visit_value_and_its_immediate_references);
    returns the pair it used before."""
    used = (_util.visit_immediate_value_references, _util.visit_value_and_its_immediate_references)
    _util.visit_immediate_value_references, _util.visit_value_and_its_immediate_references = pair
    return used


def walked(roots, visit_immediate=None, visit_value=None) -> list[str]:
    """The ids of every model reachable from ``roots`` (a model or a list of them), in Bokeh's order, walked with the
    given pair of functions (the ones in use when None)."""
    used = _use((visit_immediate, visit_value)) if visit_immediate is not None else None
    try:
        return [m.id for m in _util.collect_models(*(roots if isinstance(roots, list) else [roots]))]
    finally:
        if used is not None:
            _use(used)


def _probe_layout():
    """A figure with a data source, glyphs, axes, tools and a legend, and a bare plot, in a layout: models set, models
    left at their default (made per instance), containers and dicts of models (callbacks)."""
    from bokeh.layouts import column
    from bokeh.models import ColumnDataSource, CustomJS, Div, HoverTool, Legend, LegendItem, Plot, Range1d, Slider
    from bokeh.plotting import figure

    source = ColumnDataSource({"x": [0, 1, 2], "y": [1.0, 2.0, 3.0], "name": ["a", "b", "c"]})
    fig = figure(x_range=Range1d(0, 3), title="probe", tools=[HoverTool(tooltips=[("name", "@name")])])
    line = fig.line("x", "y", source=source)
    fig.add_layout(Legend(items=[LegendItem(label="y", renderers=[line])]), "right")
    slider = Slider(start=0, end=3, value=1)
    slider.js_on_change("value", CustomJS(args={"r": fig.x_range, "many": [source, line]}, code="r.end = this.value"))
    return column(Div(text="probe"), slider, fig, Plot())  # (a plot with every property at its default)


# -- the browser: visuals' CSS variables ------------------------------------------------------------------------------

# run in the page once BokehJS is loaded, before the document is drawn (see "The browser" above); a patch whose target
# BokehJS no longer defines is not made (the page then draws as BokehJS does)
BROWSER_PATCH = """(function () {
  const made = [];
  try {
    const visual = Bokeh.require("core/visuals/visual").VisualProperties;
    if (visual && typeof visual.prototype._get_css_value === "function") {
      visual.prototype._get_css_value = function () { return ""; };
      made.push("css_values");
    }
    const plot = Bokeh.require("models/plots/plot_canvas").PlotView;
    const font = plot && Object.getOwnPropertyDescriptor(plot.prototype, "base_font_size");
    if (font && typeof font.get === "function") {
      Object.defineProperty(plot.prototype, "base_font_size", {configurable: true, get() {
        if (this.__ovz_font_size == null) { this.__ovz_font_size = font.get.call(this); }
        return this.__ovz_font_size;
      }});
      made.push("base_font_size");
    }
  } catch (e) {
    console.warn("overlapviz: BokehJS not patched", e);
  }
  Bokeh.overlapviz_patches = made;
})();"""

# a session's page: Panel's template (``panel.io.server.html_page_for_render_items`` extends it with this), the patch
# after BokehJS's scripts in the head, before the document's script in the body draws it
PAGE_TEMPLATE = "{% block postamble %}<script type=\"text/javascript\">" + BROWSER_PATCH + "</script>{% endblock %}"


def patch_page(doc) -> None:
    """Serve ``doc`` (a session's Document) in the page that runs ``BROWSER_PATCH``."""
    doc.template = PAGE_TEMPLATE
