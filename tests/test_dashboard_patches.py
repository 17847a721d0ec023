"""What ``overlapviz.dashboards.patches`` relies on in Bokeh, Panel and HoloViews, checked on the installed versions: a
new upstream release that renames, moves or changes one of these fails here, before the dashboard misbehaves. The
patches' own equivalence with Bokeh's code on every page is in test_dashboard.py (serialization, the walk)."""

from __future__ import annotations

import inspect
import tomllib
from importlib.metadata import version
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from overlapviz.dashboards import patches

ROOT = Path(__file__).parent.parent


def _pinned() -> dict[str, Requirement]:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["dashboard"]
    return {r.name: r for r in map(Requirement, deps) if r.name in ("bokeh", "panel")}


def test_bokeh_and_panel_are_pinned_to_a_minor_range_that_holds_the_installed_versions():
    # was: "bokeh>=3.4", "panel>=1.4": any later release, whatever it did to the internals the patches read
    pinned = _pinned()
    assert set(pinned) == {"bokeh", "panel"}
    for name, req in pinned.items():
        bounds = {s.operator: s.version for s in req.specifier}
        assert set(bounds) == {">=", "<"}, req  # a floor and a ceiling, nothing else
        low, high = (tuple(int(x) for x in bounds[op].split(".")[:2]) for op in (">=", "<"))
        assert high == (low[0], low[1] + 1), req  # one minor version: the one tested
        assert req.specifier.contains(version(name)), (name, version(name), str(req))


def test_bokeh_keeps_set_values_and_made_defaults_on_the_model_as_the_patches_read_them():
    from bokeh.document import Document
    from bokeh.models import Div, Plot, Range1d
    from bokeh.themes import Theme

    div = Div()
    assert div._property_values == {} or "text" not in div._property_values
    div.text = "x"
    assert div._property_values["text"] == "x"  # a value set
    # a mutable default (a container, a model made per instance): kept on the model, the value every read returns
    assert {"tags", "css_classes"} <= set(div._unstable_default_values)
    assert all(getattr(div, n) is v for n, v in div._unstable_default_values.items())
    assert not set(div._unstable_default_values) & set(div._property_values)
    made = div.tags
    made.append("changed in place")  # a default container changed in place is a value set: sent (the patches skip
    assert div._property_values["tags"] is made and "tags" not in div._unstable_default_values  # only those left alone)
    plot = Plot()
    plot.x_range = Range1d(0, 1)
    assert plot._property_values["x_range"] is plot.x_range
    doc = Document(theme=Theme(json={"attrs": {"Plot": {"renderers": [], "background_fill_color": "#fafafa"}}}))
    themed = Plot()
    doc.add_root(themed)
    assert themed.themed_values() == {"renderers": [], "background_fill_color": "#fafafa"}
    kept = themed.renderers  # a themed container: kept apart from the unthemed defaults
    assert themed._unstable_themed_values["renderers"] is kept
    assert set(Plot.properties_with_refs()) >= {"renderers", "x_range", "toolbar"}  # the properties the walk reads


def test_the_patched_functions_keep_the_signatures_and_the_module_lookup_the_patches_assume():
    from bokeh.core.has_props import HasProps
    from bokeh.model import util

    # our replacement is called with what Bokeh's takes
    def shape(f):
        return [(p.name, p.kind, p.default) for p in inspect.signature(f).parameters.values()]

    assert shape(patches._ORIGINAL_QUERY) == shape(patches._query_properties_with_values)
    assert [p[0] for p in shape(patches._ORIGINAL_QUERY)] == ["self", "query", "include_defaults", "include_undefined"]
    for original, ours in zip(patches._ORIGINAL_WALK, (patches._visit_immediate, patches._visit_value)):
        assert shape(original) == shape(ours), original
    # collect_models looks the walk up in bokeh.model.util at each call: a function set there is the one used
    seen = []
    used = patches._use((lambda value, visitor: seen.append(value) or patches._ORIGINAL_WALK[0](value, visitor),
                         patches._ORIGINAL_WALK[1]))
    try:
        from bokeh.models import Div

        util.collect_models(Div())
    finally:
        patches._use(used)
    assert seen, "collect_models no longer walks through bokeh.model.util.visit_immediate_value_references"
    assert HasProps.query_properties_with_values in (patches._ORIGINAL_QUERY, patches._query_properties_with_values)


def test_both_bokeh_patches_pass_their_check_on_the_installed_bokeh():
    installed = patches.install()
    try:
        assert installed == {"serialization": True, "walk": True}  # else the server silently runs Bokeh's slower code
        from bokeh.core.has_props import HasProps
        from bokeh.model import util

        assert HasProps.query_properties_with_values is patches._query_properties_with_values
        assert util.visit_immediate_value_references is patches._visit_immediate
    finally:
        patches.uninstall_walk()
        patches.uninstall_serialization()
    assert HasProps.query_properties_with_values is patches._ORIGINAL_QUERY


def test_the_bokeh_server_keeps_the_tornado_application_the_gate_is_put_in():
    import panel as pn

    server = pn.serve({"/": lambda: pn.pane.Markdown("x")}, port=0, address="127.0.0.1", show=False, start=False,
                      threaded=False, verbose=False)  # fmt: skip
    try:
        app = patches.tornado_app(server)
        router = app.default_router
        assert isinstance(router.rules, list) and callable(router.process_rule) and callable(app.add_transform)
        assert isinstance(app.websocket_origins, set)
    finally:
        server.stop()
    with pytest.raises(TypeError, match="_tornado"):
        patches.tornado_app(object())


def test_holoviews_registers_stream_callbacks_and_subscribes_plot_refreshes_as_the_timeline_assumes():
    import holoviews as hv
    from holoviews.plotting.bokeh.callbacks import RangeXCallback
    from holoviews.plotting.plot import Plot as HvPlot

    from overlapviz.dashboards.pages import ZoomRange

    assert hv.streams.Stream._callbacks["bokeh"][hv.streams.RangeX] is RangeXCallback
    assert hv.streams.Stream._callbacks["bokeh"][ZoomRange] is RangeXCallback  # link_stream, at import of the pages
    # a plot of a DynamicMap subscribes its bound ``refresh`` to each stream: what ZoomRange.add_subscriber refuses
    stream = hv.streams.RangeX()
    plot = hv.renderer("bokeh").get_plot(hv.DynamicMap(lambda x_range: hv.Curve([0, 1]), streams=[stream]))
    refreshes = [s for _, s in stream._subscribers if getattr(s, "__name__", None) == "refresh"]
    assert refreshes and all(isinstance(s.__self__, HvPlot) for s in refreshes)
    zoom = ZoomRange()
    hv.renderer("bokeh").get_plot(hv.DynamicMap(lambda x_range: hv.Curve([0, 1]), streams=[zoom]))
    assert not [s for _, s in zoom._subscribers if getattr(s, "__name__", None) == "refresh"]
    plot.cleanup()


def test_panel_serves_components_where_the_security_handler_replaces_its_own():
    from panel.io import resources
    from panel.io.server import ComponentResourceHandler

    from overlapviz.dashboards.security import COMPONENTS_ROUTE, OwnComponents

    assert COMPONENTS_ROUTE == f"/{resources.COMPONENT_PATH}(.*)"
    assert "parse_url_path" in vars(ComponentResourceHandler) and issubclass(OwnComponents, ComponentResourceHandler)


def test_bokehjs_defines_what_the_browser_patch_replaces_and_no_stylesheet_sets_a_visual_css_variable():
    """``patches.BROWSER_PATCH`` returns "" for each visual's CSS variable (``VisualProperties._get_css_value``) and keeps a
    plot's font size once read (``PlotView.base_font_size``): both must still read the computed style in this BokehJS,
    and no stylesheet the page loads may set a ``--bk-*`` variable of a visual (the patch would hide it)."""
    import re
    from pathlib import Path

    import bokeh
    import panel

    import overlapviz.dashboards

    js = (Path(bokeh.__file__).parent / "server" / "static" / "js" / "bokeh.js").read_text(encoding="utf-8")
    assert re.search(r"class VisualProperties \{.*?_get_css_value\(name\) \{\s*const style = getComputedStyle\(this\.obj\.el\);"
                     r"\s*return style\.getPropertyValue\(", js, re.S)
    assert '"core/visuals/visual":' in js and '"models/plots/plot_canvas":' in js  # the names the patch requires them by
    assert re.search(r"class PlotView extends .*?get base_font_size\(\) \{\s*const font_size = getComputedStyle\(this\.el\)\.fontSize;",
                     js, re.S)
    visual = re.compile(r"--bk-[\w-]*(?:line|fill|text|hatch)-")
    sources = [*(Path(bokeh.__file__).parent / "server" / "static").rglob("*.js"), *(Path(panel.__file__).parent / "dist").rglob("*.css"),
               *(Path(panel.__file__).parent / "dist").rglob("*.js"), *(p for p in Path(overlapviz.dashboards.__file__).parent.glob("*.py") if p.name != "patches.py")]  # (its prose names one)
    found = [str(p) for p in sources if visual.search(p.read_text(encoding="utf-8", errors="replace"))]
    assert not found, found
