"""The overlapviz dashboard: five pages over one dataset, served by Panel on 127.0.0.1, fully offline."""

from __future__ import annotations

import os
import threading
import urllib.request
from pathlib import Path

import holoviews as hv
import panel as pn
from panel.viewable import Viewer

from overlapviz import figures
from overlapviz.dashboards.pages import ComparePage, OverviewPage, RanksPage, ResidencyPage, TimelinePage
from overlapviz.dashboards.store import DataStore

PAGES = ("Overview", "Timeline", "Compare", "Residency", "Ranks")
DATASET_ENV = "OVERLAPVIZ_DATASET"  # how `panel serve dashboards/app.py` finds its dataset

# Offline: every JS/CSS resource inlined into the page or served by this server, never a CDN
pn.config.inline = True
pn.extension("tabulator", inline=True, notifications=False)
# Canvas, not WebGL: our glyph budget (figures.MAX_GLYPHS) is small enough for canvas, and browsers
# without a GPU (headless chromium, remote desktops) fall back to a software WebGL that stalls for seconds
hv.renderer("bokeh").webgl = False


class Dashboard(Viewer):
    """The dashboard for one dataset: a header and the pages as tabs (``pages`` keeps the page objects).

    Parameters
    ----------
    dataset
        An overlapviz dataset directory.

    Raises
    ------
    ValueError
        If ``dataset`` is not a readable dataset.
    """

    def __init__(self, dataset: str | os.PathLike, **params):
        super().__init__(**params)
        self.store = DataStore(dataset)
        self.pages = [
            OverviewPage(self.store, on_open=self.open_timeline),
            TimelinePage(self.store),
            ComparePage(self.store),
            ResidencyPage(self.store),
            RanksPage(self.store),
        ]
        # pages are built on first visit: Panel's own Tabs(dynamic=True) left switched-to tabs
        # empty in the browser (Panel 1.9), and building every page up front slows the first render
        self.holders = [pn.Column(sizing_mode="stretch_width") for _ in PAGES]
        self.tabs = pn.Tabs(*zip(PAGES, self.holders), sizing_mode="stretch_width")
        self.tabs.param.watch(self._fill, "active")
        self._fill()

    def _fill(self, *_) -> None:
        active = self.tabs.active
        for i, page in enumerate(self.pages):
            page.shown = i == active  # hidden pages skip their re-render when the store changes
        holder = self.holders[active]
        if not holder.objects:
            holder.objects = [self.pages[active]]

    def open_timeline(self, run_id: str) -> None:
        self.tabs.active = PAGES.index("Timeline")

    def __panel__(self):
        store = self.store
        header = pn.pane.Markdown(
            f"## overlapviz · computation-communication overlap\n"
            f"Dataset `{store.path}` · {len(store.runs)} runs · {_n_kernels(store.path):,} GPU activities",
            sizing_mode="stretch_width", margin=(0, 10),
        )  # fmt: skip
        parts = [header]
        if store.any_stand_in:
            parts.append(pn.pane.Alert(f"Some runs use a **{figures.STAND_IN_NOTE}**; they are marked wherever shown.",
                                       alert_type="warning", sizing_mode="stretch_width"))  # fmt: skip
        parts.append(self.tabs)
        return pn.Column(*parts, sizing_mode="stretch_width")


def build_app(dataset: str | os.PathLike) -> Dashboard:
    """The dashboard for ``dataset`` (see ``Dashboard``)."""
    return Dashboard(dataset)


def _n_kernels(path: str) -> int:
    from overlapviz import schema

    return int(schema.read_metadata(path).get("n_kernels", 0))


def serve(dataset: str | os.PathLike, *, address: str = "127.0.0.1", port: int = 5006, show: bool = True,
          ready: threading.Event | None = None):  # fmt: skip
    """Serve the dashboard until interrupted (blocking).

    Parameters
    ----------
    dataset
        An overlapviz dataset directory; checked before the server starts.
    address, port
        Where to listen; port 0 picks a free port.
    show
        Open the system's web browser on the page.
    """
    dataset = str(Path(dataset).resolve())
    DataStore(dataset)  # fail now, with the dataset's error, rather than in the first browser session
    return pn.serve(
        {"/": lambda: build_app(dataset)}, address=address, port=port, show=show, title="overlapviz",
        websocket_origin=[f"{address}:{port}", f"localhost:{port}", f"127.0.0.1:{port}"] if port else "*",
        threaded=False, start=True, verbose=False,
    )  # fmt: skip


def get(dataset: str | os.PathLike, path: str = "/") -> tuple[int, str]:
    """Start the server on a free port, fetch ``path`` once, stop it (``overlapviz serve --get``).

    The page is built server-side for the request, so a failing page raises here.
    Returns (HTTP status, body).
    """
    dataset = str(Path(dataset).resolve())
    DataStore(dataset)
    server = pn.serve({"/": lambda: build_app(dataset)}, address="127.0.0.1", port=0, show=False, start=False, title="overlapviz",
                      websocket_origin="*", threaded=False)  # fmt: skip
    server.start()
    port = server.port
    result: dict = {}

    def fetch():
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=60) as resp:
                result["status"], result["body"] = resp.status, resp.read().decode("utf-8", "replace")
        except urllib.error.HTTPError as exc:
            result["status"], result["body"] = exc.code, exc.read().decode("utf-8", "replace")
        except Exception as exc:  # report any failure to fetch as the result, then stop the loop
            result["status"], result["body"] = 0, f"{type(exc).__name__}: {exc}"
        finally:
            server.io_loop.add_callback(server.io_loop.stop)

    threading.Thread(target=fetch, daemon=True).start()
    server.io_loop.start()
    server.stop()
    return result["status"], result["body"]


if pn.state.served:
    build_app(os.environ[DATASET_ENV]).servable(title="overlapviz")
