"""Bokeh's walk over the models a model refers to, made to read the values it already holds (``install``).

Every change of a session's document walks every model in it, more than once: Panel's ``Bokeh`` pane selects the
``CustomJS`` of a figure it shows (``Model.select``), a layout's update collects the references of what it holds, and
Bokeh's ``DocumentModelManager.recompute`` collects those of every root. Bokeh's walk
(``bokeh.model.util.visit_immediate_value_references``) reads each property that may hold a model through its
descriptor: a property left at its default has that default computed again (themed, validated, copied) on each
walk, and each value visited imports ``Model`` anew. On the samples' Overview, with the Compare and the Timeline in
the document, that was 230 ms of the server's 280 ms per metric change (py-spy). The walk here reads what was set,
and the defaults Bokeh keeps once made, from the model itself; it computes a default only where Bokeh keeps none,
and once per class for a default that refers to no model. It visits the same values in the same order.
"""

from __future__ import annotations

from typing import Any, Callable

from bokeh.core.has_props import HasProps
from bokeh.model import Model
from bokeh.model import util as _util
from bokeh.util.dataclasses import entries, is_dataclass

_ORIGINAL = (_util.visit_immediate_value_references, _util.visit_value_and_its_immediate_references)
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


def install() -> bool:
    """Use the walk here in this process (the dashboard server's) if it finds what Bokeh's finds, in the same order, for
    a probe document; the check keeps Bokeh's where a later Bokeh changed what the walk here relies on. Returns whether
    it is used."""
    try:
        probe = _probe()  # (the walk here first: Bokeh's keeps the defaults it makes, which the walk here then reads)
        same = walked(probe, _visit_immediate, _visit_value) == walked(probe, *_ORIGINAL)
    except Exception:  # noqa: BLE001  (another Bokeh's internals: keep its own)
        same = False
    if same:
        _use((_visit_immediate, _visit_value))
    return same


def uninstall() -> None:
    """Bokeh's own again (tests compare the two)."""
    _use(_ORIGINAL)
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


def _probe():
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
