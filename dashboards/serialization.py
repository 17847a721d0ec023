"""Bokeh's serialization of a model without its default values, made to skip those before computing them (``install``).

Every model a page sends to the browser goes through ``HasProps.query_properties_with_values(include_defaults=False)``,
and Bokeh (3.x) computes the value of every property there, defaults included (validated, themed, copied), and only
then drops those it does not send: its own TODO says the check "should happen before get_value()". On the
Collectives page of a million-kernel dataset that was 0.8 s of the server's 1.7 s per visit (py-spy), and 70-80% of
each figure's serialization. The version here checks first and sends the same properties with the same values.
"""

from __future__ import annotations

from typing import Any

from bokeh.core.has_props import HasProps
from bokeh.core.serialization import Buffer
from bokeh.core.property.descriptors import UnsetValueError
from bokeh.core.property.singletons import Undefined
from bokeh.core.property.wrappers import PropertyValueContainer

_ORIGINAL = HasProps.query_properties_with_values


def _query_properties_with_values(self: HasProps, query, *, include_defaults: bool = True,
                                  include_undefined: bool = False) -> dict[str, Any]:  # fmt: skip
    """``HasProps.query_properties_with_values`` with the keys that are not sent left out before their value is computed."""
    if include_defaults:
        return _ORIGINAL(self, query, include_defaults=True, include_undefined=include_undefined)
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


def install() -> bool:
    """Use the version here in this process (the dashboard server's) if it sends what Bokeh's sends for a figure; the
    check keeps Bokeh's where a later Bokeh changed what the version here relies on. Returns whether it is used."""
    try:
        probe = _probe()
        same = sent(probe, _ORIGINAL) == sent(probe, _query_properties_with_values)
    except Exception:  # noqa: BLE001  (another Bokeh's internals: keep its own)
        same = False
    if same:
        HasProps.query_properties_with_values = _query_properties_with_values
    return same


def uninstall() -> None:
    """Bokeh's own again (tests compare the two)."""
    HasProps.query_properties_with_values = _ORIGINAL


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


def _probe():
    """A small figure with a data source, a glyph, axes, tools and a title (every kind of default is in it)."""
    import numpy as np
    from bokeh.models import ColumnDataSource, HoverTool, LinearAxis, Plot, Quad, Range1d, Title, WheelZoomTool

    source = ColumnDataSource({"left": np.arange(3), "right": np.arange(3) + 1, "color": ["#000000", "#111111", "#222222"]})
    fig = Plot(x_range=Range1d(0, 4), y_range=Range1d(0, 1), title=Title(text="probe"), tools=[WheelZoomTool(), HoverTool()])
    fig.add_glyph(source, Quad(left="left", right="right", bottom=0, top=1, fill_color="color"))
    fig.add_layout(LinearAxis(), "below")
    return fig
