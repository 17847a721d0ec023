"""The system's headless chromium and the page figures are drawn in: an export drives chromium over its DevTools pipe
(``Chromium``: no chromedriver, no Selenium); ``chromium()`` is the Selenium driver the tests and Bokeh's own export use.

Importing this module imports no plotting library: ``overlapviz export`` starts the browser here and loads the export
page (BokehJS) while HoloViews is still being imported (``prestart``), so neither the browser's start nor parsing
BokehJS is added to the command's time.
"""

from __future__ import annotations

import atexit
import fcntl
import json
import os
import select
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

__all__ = ["Chromium", "chromium", "chromium_args", "chromium_options", "find_browser", "find_chromium", "headless_chromium",
           "load_export_page", "page_drawn", "prestart", "shared_chromium"]  # fmt: skip

CHROMIUM_CANDIDATES = ("/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome")
CHROMEDRIVER_CANDIDATES = ("/usr/bin/chromedriver",)
MISSING = "PNG/SVG/PDF export needs chromium (Debian: apt-get install chromium)"
COMMAND_TIMEOUT = 120.0  # seconds for the browser's answer to a command (a script's: set_script_timeout, 30 s)


def find_browser() -> str | None:
    """Path of the system chromium (``OVERLAPVIZ_CHROMIUM`` overrides), or None when it is missing."""
    return os.environ.get("OVERLAPVIZ_CHROMIUM") or next((p for p in CHROMIUM_CANDIDATES if os.path.exists(p)), None)


def find_chromium() -> tuple[str, str] | None:
    """Paths of the system chromium and chromedriver (``OVERLAPVIZ_CHROMIUM`` / ``OVERLAPVIZ_CHROMEDRIVER``
    override), or None when either is missing (the Selenium driver of ``chromium()`` needs both)."""
    browser = find_browser()
    driver = os.environ.get("OVERLAPVIZ_CHROMEDRIVER") or next(
        (p for p in CHROMEDRIVER_CANDIDATES if os.path.exists(p)), shutil.which("chromedriver")
    )
    if not browser or not driver:
        return None
    return browser, driver


def chromium_args(*, width: int = 1400, height: int = 1000) -> list[str]:
    """The headless chromium's command-line switches (both drivers)."""
    args = ["--headless=new", "--disable-gpu", "--hide-scrollbars", "--disable-dev-shm-usage", "--disable-extensions",
            "--no-first-run", "--no-default-browser-check", "--disable-background-networking", "--disable-component-update",
            "--disable-sync", "--mute-audio", "--force-device-scale-factor=1", f"--window-size={width},{height}"]  # fmt: skip
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        args.append("--no-sandbox")  # chromium refuses to run as root with its sandbox
    return args


def chromium_options(browser: str, *, width: int = 1400, height: int = 1000):
    from selenium import webdriver

    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for arg in chromium_args(width=width, height=height):
        options.add_argument(arg)
    return options


@contextmanager
def chromium(**kwargs) -> Iterator:
    """A headless Selenium driver on the system chromium, quit on exit (the tests', and Bokeh's ``export_png``'s).

    Raises
    ------
    ValueError
        If chromium or chromedriver is not installed (``apt-get install chromium chromium-driver``).
    """
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    found = find_chromium()
    if found is None:
        raise ValueError("the Selenium driver needs chromium and chromedriver (Debian: apt-get install chromium chromium-driver)")
    browser, driver_path = found
    driver = webdriver.Chrome(service=Service(executable_path=driver_path), options=chromium_options(browser, **kwargs))
    try:
        yield driver
    finally:
        driver.quit()


class Chromium:
    """A headless chromium driven over its DevTools pipe (``--remote-debugging-pipe``: JSON messages on fds 3 and 4),
    with the few methods of a Selenium driver an export calls (``get``, ``execute_script``, ``execute_async_script``,
    ``execute_cdp_cmd``, ``set_script_timeout``, ``quit``), so that ``render.draw_static`` draws in either.

    Selenium went through chromedriver (a second process, started before chromium) and HTTP; importing it was 0.2-0.3 s
    of the export's Python, in the thread that competes with HoloViews' import for the interpreter. Start it with
    ``Chromium.start`` (immediate: the process only) and wait for it with ``ready``.
    """

    def __init__(self, proc: subprocess.Popen, send_fd: int, recv_fd: int, profile: str):
        self._proc, self._send, self._recv, self._profile = proc, send_fd, recv_fd, profile
        self._buf = b""
        self._id = 0
        self._session: str | None = None
        self._timeout = 30.0
        self._lock = threading.RLock()

    @classmethod
    def start(cls, *, width: int = 1400, height: int = 1000) -> "Chromium":
        """Start the browser process now (a fork and exec); ``ready`` (called by every method) waits for its page. The
        browser ends itself when its pipe closes: with this process, even one killed with SIGKILL (in 0.06 s).

        Raises
        ------
        ValueError
            If chromium is not installed.
        """
        browser = find_browser()
        if browser is None:
            raise ValueError(MISSING)
        # the profile chromium writes (~140 files it never reads again) in memory where there is a tmpfs: removing it
        # from the disk of a busy machine took 0.3 s of the command's end
        shm = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK | os.X_OK) else None
        profile = tempfile.mkdtemp(prefix="overlapviz-chromium-", dir=shm)
        to_browser, from_browser = os.pipe(), os.pipe()

        def child() -> None:  # chromium reads commands on fd 3 and writes answers on fd 4
            a, b = (fcntl.fcntl(fd, fcntl.F_DUPFD, 5) for fd in (to_browser[0], from_browser[1]))  # (neither can be 3 or 4)
            os.dup2(a, 3)
            os.dup2(b, 4)

        proc = subprocess.Popen([browser, *chromium_args(width=width, height=height), "--remote-debugging-pipe",
                                 f"--user-data-dir={profile}", "about:blank"], preexec_fn=child, pass_fds=(3, 4),
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)  # fmt: skip
        os.close(to_browser[0])
        os.close(from_browser[1])
        return cls(proc, to_browser[1], from_browser[0], profile)

    def ready(self) -> None:
        """Wait until the browser answers and attach to its page (once)."""
        with self._lock:
            if self._session is None:
                targets = self._call("Target.getTargets", {}, session=None)["targetInfos"]
                page = next((t["targetId"] for t in targets if t["type"] == "page"), None)
                if page is None:
                    page = self._call("Target.createTarget", {"url": "about:blank"}, session=None)["targetId"]
                self._session = self._call("Target.attachToTarget", {"targetId": page, "flatten": True}, session=None)["sessionId"]
                self._call("Page.enable", {})

    # --- the Selenium driver's methods an export uses

    def set_script_timeout(self, seconds: float) -> None:
        self._timeout = float(seconds)

    def execute_cdp_cmd(self, method: str, params: dict) -> dict:
        """The DevTools command ``method`` in the page; its result."""
        self.ready()
        return self._call(method, params)

    def get(self, url: str) -> None:
        """Load ``url`` and wait for its load event."""
        self.ready()
        with self._lock:
            sent = self._send_cmd("Page.navigate", {"url": url}, self._session)
            answered = loaded = False
            while not (answered and loaded):
                msg = self._next(COMMAND_TIMEOUT)
                if msg.get("id") == sent:
                    if "error" in msg or msg.get("result", {}).get("errorText"):
                        raise RuntimeError(f"chromium could not load {url}: {msg.get('error') or msg['result']['errorText']}")
                    answered = True
                elif msg.get("method") == "Page.loadEventFired" and msg.get("sessionId") == self._session:
                    loaded = True  # (the page before was loaded before this navigation was asked for)

    def execute_script(self, script: str, *args):
        """``script`` as the body of a function called with ``args`` (as ``arguments``); its result, as JSON."""
        return self._evaluate(f"(function() {{ {script}\n}}).apply(window, {json.dumps(list(args))})", wait=False)

    def execute_async_script(self, script: str, *args):
        """As ``execute_script``, the function given one more argument: the callback its result is passed to."""
        call = f"new Promise((done) => (function() {{ {script}\n}}).apply(window, [...{json.dumps(list(args))}, done]))"
        return self._evaluate(call, wait=True)

    def quit(self) -> None:
        """End the browser (all of its processes: they share its session) and remove its profile."""
        if self._proc.poll() is None:  # first, outside the lock: a thread waiting for an answer gets the pipe's end
            try:
                os.killpg(self._proc.pid, signal.SIGKILL)  # nothing of the profile is kept: no orderly shutdown needed
            except OSError:
                pass
        with self._lock:
            self._proc.wait()
            for fd in (self._send, self._recv):
                try:
                    os.close(fd)
                except OSError:
                    pass
            self._send = self._recv = -1
            shutil.rmtree(self._profile, ignore_errors=True)

    # --- the pipe

    def _evaluate(self, expression: str, *, wait: bool):
        self.ready()
        result = self._call("Runtime.evaluate", {"expression": expression, "returnByValue": True, "awaitPromise": wait},
                            timeout=self._timeout)
        if "exceptionDetails" in result:
            details = result["exceptionDetails"]
            raise RuntimeError(f"javascript error: {details.get('exception', {}).get('description') or details.get('text')}")
        return result["result"].get("value")

    def _send_cmd(self, method: str, params: dict, session: str | None) -> int:
        self._id += 1
        msg = {"id": self._id, "method": method, "params": params}
        if session:
            msg["sessionId"] = session
        data = json.dumps(msg).encode() + b"\0"
        while data:
            data = data[os.write(self._send, data):]
        return self._id

    def _call(self, method: str, params: dict, *, session: str | None | bool = True, timeout: float = 0) -> dict:
        with self._lock:
            sent = self._send_cmd(method, params, self._session if session is True else session)
            while True:
                msg = self._next(timeout or COMMAND_TIMEOUT)
                if msg.get("id") == sent:
                    if "error" in msg:
                        raise RuntimeError(f"chromium: {method}: {msg['error'].get('message')}")
                    return msg["result"]

    def _next(self, timeout: float) -> dict:
        """The browser's next message (an answer or an event)."""
        end = time.monotonic() + timeout
        while b"\0" not in self._buf:
            ready, _, _ = select.select([self._recv], [], [], max(0.0, end - time.monotonic()))
            if not ready:
                raise TimeoutError(f"chromium did not answer in {timeout:g} s")
            chunk = os.read(self._recv, 1 << 20)
            if not chunk:
                raise RuntimeError(f"chromium ended (exit status {self._proc.wait()})")
            self._buf += chunk
        raw, _, self._buf = self._buf.partition(b"\0")
        return json.loads(raw)


@contextmanager
def headless_chromium(**kwargs) -> Iterator[Chromium]:
    """A ``Chromium`` of its own, quit on exit.

    Raises
    ------
    ValueError
        If chromium is not installed.
    """
    driver = Chromium.start(**kwargs)
    try:
        yield driver
    finally:
        driver.quit()


_SHARED: dict = {}
_SHARED_LOCK = threading.Lock()


@contextmanager
def shared_chromium() -> Iterator[Chromium]:
    """The process's one headless ``Chromium`` (started on first use, quit at exit), one export at a time."""
    with _SHARED_LOCK:
        driver = _SHARED.get("driver")
        if driver is not None:
            try:
                driver.execute_script("return 1")
            except Exception:  # noqa: BLE001  (a dead browser is replaced)
                quit_shared()
                driver = None
        if driver is None:
            driver = _SHARED["driver"] = Chromium.start()
            if not _SHARED.get("atexit"):
                _SHARED["atexit"] = atexit.register(quit_shared)
        yield driver


def quit_shared() -> None:
    driver = _SHARED.pop("driver", None)
    if driver is not None:
        try:
            driver.quit()
        except Exception:  # noqa: BLE001  (at exit: nothing left to report to)
            pass


_PRESTARTED: dict = {}


def prestart() -> None:
    """Start the shared chromium now and load the export page in it in a background thread (``overlapviz export``
    calls it before importing pandas and HoloViews): ``shared_chromium`` then waits for that instead of beginning its
    own. Nothing happens without chromium or BokehJS (the dashboard extra)."""
    if find_browser() is None or "thread" in _PRESTARTED:
        return
    try:
        page = _page_file(widgets=False)  # most figures have no widgets; one with a table loads the other page
        with shared_chromium():  # the process, from this (the main) thread: it dies with the command
            pass
    except Exception:  # noqa: BLE001  (no BokehJS, no browser: the export that needs them reports the error)
        return

    def start():
        try:
            with shared_chromium() as driver:
                load_export_page(driver, page=page)
        except Exception:  # noqa: BLE001  (as above)
            pass

    _PRESTARTED["thread"] = threading.Thread(target=start, name="overlapviz-chromium", daemon=True)
    _PRESTARTED["thread"].start()


# the page figures are drawn in: BokehJS from Bokeh's own files (nothing is requested from the network), the body laid
# out as in Bokeh's own export page (bokeh.io.export.get_layout_html), and one element the figure is drawn into
_PAGE = """<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>overlapviz export</title>
<style>html, body { box-sizing: border-box; width: 100%; height: 100%; margin: 0; border: 0; padding: 0; overflow: hidden; }</style>
{scripts}</head><body><div id="overlapviz-export" style="display: contents;"></div></body></html>"""
PAGE_USES = 25  # figures drawn in one load of the page, then it is loaded again (the old documents let go)
_PAGES: dict = {}  # id(driver) -> (figures drawn in its current load of the export page, whether it has the widgets)
_PAGE_DIR: dict = {}


def load_export_page(driver, *, widgets: bool = False, page: Path | None = None) -> None:
    """Load the export page (BokehJS) unless ``driver`` has it loaded and has drawn fewer than ``PAGE_USES``
    figures in it (``page_drawn`` counts them): each figure then sends only its JSON (loading Bokeh's 2 MB page was
    0.7-1.1 s of each export).

    The page holds bokeh.min.js, and the widgets and tables bundles only where ``widgets`` (a figure with a table):
    never bokeh-mathjax (1.8 MB of the 3.9 MB; no figure has math text) nor bokeh-gl (static plots draw on canvas),
    which the browser parsed for every export."""
    drawn, loaded = _PAGES.get(id(driver), (0, None))
    if (drawn >= PAGE_USES or loaded != widgets
            or not driver.execute_script("return !!window.Bokeh && !!document.getElementById('overlapviz-export')")):  # fmt: skip
        driver.get((page or _page_file(widgets)).as_uri())
        _PAGES[id(driver)] = (0, widgets)


def page_drawn(driver) -> None:
    """Count one figure drawn in ``driver``'s export page (``load_export_page`` loads it again after ``PAGE_USES``)."""
    drawn, loaded = _PAGES.get(id(driver), (0, None))
    _PAGES[id(driver)] = (drawn + 1, loaded)


def _page_file(widgets: bool) -> Path:
    """The export page (written once, in a private temporary directory of this process). Its scripts are the files of
    the installed Bokeh, found without importing it (0.2 s, in the command's main thread before the browser started;
    they were copied into the page, 1.3 MB of it)."""
    import importlib.util

    folder = _PAGE_DIR.get("dir")
    if folder is None:
        folder = _PAGE_DIR["dir"] = Path(tempfile.mkdtemp(prefix="overlapviz-export-"))
        atexit.register(shutil.rmtree, folder, True)
    page = folder / f"export{'-widgets' if widgets else ''}.html"
    if not page.exists():
        spec = importlib.util.find_spec("bokeh")
        js = Path(spec.origin).parent / "server" / "static" / "js" if spec and spec.origin else None
        keep = ("bokeh.min.js", "bokeh-widgets.min.js", "bokeh-tables.min.js") if widgets else ("bokeh.min.js",)
        if js is None or not all((js / k).is_file() for k in keep):
            raise ValueError(f"PNG/SVG/PDF export needs BokehJS: {', '.join(keep)} not found in the installed bokeh ({js})")
        scripts = "".join(f'<script src="{(js / k).as_uri()}"></script>' for k in keep)
        tmp = page.with_suffix(f".{threading.get_ident()}.tmp")  # (a dashboard's threads: never half a page)
        tmp.write_text(_PAGE.replace("{scripts}", scripts), encoding="utf-8")
        os.replace(tmp, page)
    return page
