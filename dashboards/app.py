"""The overlapviz dashboard: six pages over one dataset, served by Panel on 127.0.0.1 behind a per-launch token, offline."""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import sys
import threading
import traceback
import urllib.error
import urllib.request
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import holoviews as hv
import panel as pn
from bokeh.util.token import generate_secret_key
from panel.io.state import set_curdoc
from panel.viewable import Viewer

from overlapviz import lifetime
from overlapviz.figures import charts as figures
from overlapviz.dashboards import patches, security
from overlapviz.dashboards.pages import CollectivesPage, ComparePage, OverviewPage, ResidencyPage, TimelinePage, WhyPage
from overlapviz.dashboards.store import DataStore, drawing, page_sent

# the tabs, named after what they show: the grid, one run's kernels, why its collectives started late (with one SM's
# budget), the collectives across ranks, residency per launch shape, two runs side by side
PAGES = ("Overview", "Timeline", "Why late", "Collectives", "Residency", "Compare")
# the pages whose drawings stay in the session's document: the open one and the one opened before it. Bokeh walks
# every model of the document on each change (the server's DocumentModelManager.recompute) and lays out every plot
# in it (the browser's invalidate_layout goes to the root): with all six pages in, a metric change or a run switch
# cost about twice what it costs with two. An older page is taken out and put back, drawn again, when reopened.
KEPT = 2
TUNNEL_PORT = 5006  # the local end of the SSH tunnel the banner of a --unix-socket server proposes
DATASET_ENV = "OVERLAPVIZ_DATASET"  # how `panel serve dashboards/app.py` finds its dataset

# Offline: every JS/CSS resource inlined into the page or served by this server, never a CDN
pn.config.inline = True
pn.extension("tabulator", inline=True, notifications=False)
# Canvas, not WebGL: our glyph budget (figures.MAX_GLYPHS) is small enough for canvas, and browsers
# without a GPU (headless chromium, remote desktops) fall back to a software WebGL that stalls for seconds
hv.renderer("bokeh").webgl = False
# every model sent to a browser: the properties set, without computing the defaults first; every walk over a document's
# models (each change): the values held, without computing defaults (each where this Bokeh passes its check)
patches.install()

_SHOWN: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # a session's Document -> its Dashboard


def _failed(exc: BaseException) -> None:
    """Panel's handler of an exception raised while a session's event is handled (a page drawn on a tab switch, a widget
    change): the traceback goes to the server log, one line to the page above the tabs. Panel's default re-raises it
    into the event loop: the log had it, the page stayed blank."""
    traceback.print_exception(type(exc), exc, exc.__traceback__, file=sys.stderr)
    dash = _SHOWN.get(pn.state.curdoc) if pn.state.curdoc is not None else None
    if dash is not None:
        dash.failure.object = (f"**Drawing this failed** ({type(exc).__name__}: {str(exc)[:300]}); the server log has the "
                               "traceback. Other pages and other runs still work.")  # fmt: skip
        dash.failure.visible = True


pn.config.exception_handler = _failed


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
            WhyPage(self.store),
            CollectivesPage(self.store),
            ResidencyPage(self.store),
            ComparePage(self.store),
        ]
        # pages are built on first visit: Panel's own Tabs(dynamic=True) left switched-to tabs
        # empty in the browser (Panel 1.9), and building every page up front slows the first render
        self.holders = [pn.Column(sizing_mode="stretch_width") for _ in PAGES]
        self.tabs = pn.Tabs(*zip(PAGES, self.holders), sizing_mode="stretch_width")
        self.failure = pn.pane.Alert("", alert_type="danger", visible=False, sizing_mode="stretch_width")  # said by _failed
        self.views: dict[int, pn.viewable.Viewable] = {}  # page -> its view, built once: put back, not built again
        self.opened: list[int] = []  # pages, the last opened first
        self.tabs.param.watch(self._fill, "active")
        # the browser shows the open tab's page as the tab is clicked, not a round trip later (``_fill`` sets the same on
        # the server): until then the page was blank, and a test that turned the wheel over it, right after, lost it
        self.tabs.jscallback(args={f"h{i}": h for i, h in enumerate(self.holders)},
                             active=f"[{', '.join(f'h{i}' for i in range(len(PAGES)))}].forEach((h, i) => {{ h.visible = i == cb_obj.active }})")
        self._fill()

    def _fill(self, *_) -> None:
        with drawing():  # the background tables wait meanwhile (one interpreter)
            self.failure.visible = False  # a failure said is about the page it happened on
            active = self.tabs.active
            self.opened = [active, *(i for i in self.opened if i != active)]
            for i, page in enumerate(self.pages):
                page.shown = i == active  # hidden pages skip their re-render when the store changes
                # Panel's Tabs hides a closed tab with CSS alone (visibility: hidden): the browser still laid out and
                # painted every page kept in the document (the live Timeline, the page opened before) on each change, a
                # third to a half of a page's time in the browser on the million-kernel set. An invisible holder is
                # display: none, out of the layout; the open tab's is made visible with its page (one round trip)
                self.holders[i].visible = i == active
            holder = self.holders[active]
            if not holder.objects:
                if active not in self.views:
                    # one view per page for the session: a page's methods are watched once, however often its
                    # tab is taken out of the document and put back
                    self.views[active] = pn.panel(self.pages[active])
                holder.objects = [self.views[active]]
        doc = pn.state.curdoc
        if doc is not None and doc.session_context is not None:
            doc.add_next_tick_callback(lambda: self._take_out(doc))  # once the opened page is on its way
        else:
            self._take_out(doc)

    def _take_out(self, doc) -> None:
        """Take the pages opened before the last ``KEPT`` out of the document: in one change of its models."""
        kept = set(self.opened[:KEPT])
        old = [holder for i, holder in enumerate(self.holders) if i not in kept and holder.objects and not self.pages[i].live]
        if not old:
            return
        with set_curdoc(doc), (doc.models.freeze() if doc is not None else contextlib.nullcontext()):
            for holder in old:
                holder.objects = []

    def open_timeline(self, run_id: str) -> None:
        self.tabs.active = PAGES.index("Timeline")

    def __panel__(self):
        store = self.store
        header = pn.pane.Markdown(
            f"## overlapviz · computation-communication overlap\n"
            f"Dataset `{store.path}` · {len(store.runs):,} run{'' if len(store.runs) == 1 else 's'} · {_n_kernels(store.path):,} GPU activities",
            sizing_mode="stretch_width", margin=(0, 10),
        )  # fmt: skip
        parts = [header]
        if store.any_stand_in:
            parts.append(pn.pane.Alert(f"Some runs use a **{figures.STAND_IN_NOTE}**; they are marked wherever shown.",
                                       alert_type="warning", sizing_mode="stretch_width"))  # fmt: skip
        parts += [self.failure, self.tabs]
        if pn.state.curdoc is not None:
            _SHOWN[pn.state.curdoc] = self
        return pn.Column(*parts, sizing_mode="stretch_width")


def build_app(dataset: str | os.PathLike) -> Dashboard:
    """The dashboard for ``dataset`` (see ``Dashboard``), in a page that patches BokehJS (``patches.BROWSER_PATCH``)."""
    doc = pn.state.curdoc
    if doc is not None:
        patches.patch_page(doc)
        doc.add_next_tick_callback(page_sent)  # the page is built: the warm-up goes on (``store.warm``)
    return Dashboard(dataset)


def _n_kernels(path: str) -> int:
    from overlapviz.dataset import schema

    return int(schema.read_metadata(path).get("n_kernels", 0))


@dataclass
class Listening:
    """A bound, not yet started dashboard server (``listen``); ``url`` opens it (with ``?token=`` unless --no-token)."""

    server: Any  # panel's Bokeh Server: ``server.start()``, then run ``server.io_loop``
    access: security.Access
    url: str
    base_url: str  # the same without the token
    unix_socket: Path | None
    warnings: list[str]


def listen(dataset: str | os.PathLike, *, address: str = "127.0.0.1", port: int = 5006, unix_socket: str | None = None,
           token: str | None = None, no_token: bool = False, allow_remote: bool = False, allow_http: bool = False,
           allow_websocket_origin: Sequence[str] = (), ssl_certfile: str | None = None,
           ssl_keyfile: str | None = None) -> Listening:  # fmt: skip
    """Bind the dashboard server for ``dataset``, behind the gate of ``dashboards.security`` (docs/security.md).

    Parameters
    ----------
    dataset
        An overlapviz dataset directory; checked before anything listens.
    address, port
        Where to listen (TCP); port 0 picks a free port (``url`` has the real one). An address other
        than loopback needs ``allow_remote``, and TLS (``ssl_certfile``) or ``allow_http``.
    unix_socket
        Listen on this unix socket file instead (mode 0600: only this account can connect).
    token, no_token
        The token every request must carry (as ``?token=``, the cookie set on the first visit, or an
        ``Authorization: token ...`` header); a new random one when None; none at all with ``no_token``.
    allow_websocket_origin
        Further ``HOST[:PORT]`` names the browser may use (a reverse proxy, an SSH tunnel's other port).

    Raises
    ------
    ValueError
        If the dataset, a name, the token or the place to listen is refused.
    OSError
        If the address or port cannot be bound.
    """
    dataset = str(Path(dataset).resolve())
    if no_token and token is not None:
        raise ValueError("--no-token and --token (or $OVERLAPVIZ_TOKEN) both given")
    token = None if no_token else security.check_token(token) if token is not None else security.new_token()
    extra = {security.check_origin_value(o) for o in allow_websocket_origin}
    tls = ssl_certfile is not None
    if unix_socket is not None:
        socket_path = security.check_unix_socket_path(unix_socket)
        warnings = security.check_listen("localhost", allow_remote=False, tls=tls, allow_http=False, token=token)
        where = {"unix_socket": str(socket_path)}
    else:
        socket_path = None
        warnings = security.check_listen(address, allow_remote=allow_remote, tls=tls, allow_http=allow_http, token=token)
        where = {"address": address, "port": port}
    DataStore(dataset)  # fail now, with the dataset's error, rather than in the first browser session
    secret_key = generate_secret_key().encode()
    # a unix socket file is created 0600, not chmod-ed to it after a window in which others could connect
    old_umask = os.umask(0o177) if socket_path is not None else None
    try:
        server = pn.serve(
            # location=False: no page uses the URL, and Panel's Location would copy it (?token= included) into
            # the session, and fails on an IPv6 Host ("[::1]:5006", panel.io.location._get_location_params)
            {"/": lambda: build_app(dataset)}, show=False, start=False, title="overlapviz", threaded=False, verbose=False,
            location=False,
            ssl_certfile=ssl_certfile, ssl_keyfile=ssl_keyfile, **where, **security.server_options(secret_key),
        )  # fmt: skip
    finally:
        if old_umask is not None:
            os.umask(old_umask)
    if socket_path is not None:
        try:
            security.check_own_socket(socket_path)
        except ValueError:
            server.stop()
            raise
        hosts, base_url = set(), f"http://localhost:{TUNNEL_PORT}/"  # the SSH tunnel's end (docs/security.md)
    else:
        hosts = security.served_hosts(address, server.port)
        base_url = f"{'https' if tls else 'http'}://{security.netloc(address, server.port)}/"
    access = security.Access(token=token, secret_key=secret_key, hosts=frozenset(hosts | extra),
                             any_loopback_port=socket_path is not None, secure=tls,
                             cookie_name=f"overlapviz-{secrets.token_hex(4)}")  # fmt: skip
    security.install(server, access)
    url = base_url if token is None else f"{base_url}?{security.TOKEN_ARG}={token}"
    return Listening(server, access, url, base_url, socket_path, warnings)


def serve(dataset: str | os.PathLike, *, show: bool = False, on_ready: Callable[[Listening], None] | None = None,
          **options):  # fmt: skip
    """Serve the dashboard until interrupted (blocking); ``options`` as for ``listen``.

    ``on_ready(listening)`` runs once the server listens (the CLI prints its banner there); ``show``
    opens the system's browser on the page (through a private file, so the token is in no argv).
    """
    listening = listen(dataset, **options)
    server, leftovers = listening.server, []
    # a batch job's end (SIGTERM) stops the server as Ctrl-C does (Panel handles SIGINT), so the socket
    # file and the token file are removed
    with lifetime.signals_call(lambda: server.io_loop.asyncio_loop.call_soon_threadsafe(server.io_loop.stop)):
        server.io_loop.asyncio_loop.set_exception_handler(_closed_quietly)
        try:
            server.start()
            if on_ready is not None:
                on_ready(listening)
            if show and listening.unix_socket is None:
                leftovers.append(security.open_browser(listening.url))
            server.io_loop.start()
        finally:
            server.stop()
            if listening.unix_socket is not None:
                listening.unix_socket.unlink(missing_ok=True)
            for folder in leftovers:
                shutil.rmtree(folder, ignore_errors=True)


def _closed_quietly(loop, context: dict) -> None:
    """The server loop's handler of an exception no task awaited: a browser tab closed while the server was sending it
    a change (Tornado's WebSocketClosedError in a send nobody waits for) is nothing to report; asyncio logged it as
    "ERROR Task exception was never retrieved" with two tracebacks. Anything else goes to asyncio's own handler."""
    from tornado.iostream import StreamClosedError
    from tornado.websocket import WebSocketClosedError

    if isinstance(context.get("exception"), (WebSocketClosedError, StreamClosedError)):
        return
    loop.default_exception_handler(context)


def get(dataset: str | os.PathLike, path: str = "/") -> tuple[int, str]:
    """Start the server on a free port, fetch ``path`` once, stop it (``overlapviz serve --get``).

    The request goes through the same gate as a browser's (with this launch's token); the page is
    built server-side for it, so a failing page raises here. Returns (HTTP status, body).
    """
    listening = listen(dataset, address="127.0.0.1", port=0)
    server = listening.server
    server.start()
    request = urllib.request.Request(listening.base_url.rstrip("/") + path,
                                     headers={"Authorization": f"token {listening.access.token}"})  # fmt: skip
    result: dict = {}

    def fetch():
        try:
            with urllib.request.urlopen(request, timeout=60) as resp:
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
