"""The system's headless chromium, driven by Selenium through the system chromedriver (never a browser download), and
the page figures are drawn in.

Importing this module imports no plotting library: ``overlapviz export`` starts the browser here and loads the export
page (BokehJS) while HoloViews is still being imported (``prestart``), so neither the browser's start (about a second)
nor parsing BokehJS is added to the command's time.
"""

from __future__ import annotations

import atexit
import os
import shutil
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

__all__ = ["chromium", "chromium_options", "find_chromium", "load_export_page", "page_drawn", "prestart", "shared_chromium"]

CHROMIUM_CANDIDATES = ("/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome")
CHROMEDRIVER_CANDIDATES = ("/usr/bin/chromedriver",)


def find_chromium() -> tuple[str, str] | None:
    """Paths of the system chromium and chromedriver (``OVERLAPVIZ_CHROMIUM`` / ``OVERLAPVIZ_CHROMEDRIVER``
    override), or None when either is missing."""
    browser = os.environ.get("OVERLAPVIZ_CHROMIUM") or next((p for p in CHROMIUM_CANDIDATES if os.path.exists(p)), None)
    driver = os.environ.get("OVERLAPVIZ_CHROMEDRIVER") or next(
        (p for p in CHROMEDRIVER_CANDIDATES if os.path.exists(p)), shutil.which("chromedriver")
    )
    if not browser or not driver:
        return None
    return browser, driver


def chromium_options(browser: str, *, width: int = 1400, height: int = 1000):
    from selenium import webdriver

    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for arg in ("--headless=new", "--disable-gpu", "--hide-scrollbars", "--disable-dev-shm-usage",
                "--disable-extensions", "--no-first-run", "--force-device-scale-factor=1",
                f"--window-size={width},{height}"):  # fmt: skip
        options.add_argument(arg)
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        options.add_argument("--no-sandbox")  # chromium refuses to run as root with its sandbox
    return options


@contextmanager
def chromium(**kwargs) -> Iterator:
    """A headless Selenium driver on the system chromium, quit on exit.

    Raises
    ------
    ValueError
        If chromium or chromedriver is not installed (``apt-get install chromium chromium-driver``).
    """
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    found = find_chromium()
    if found is None:
        raise ValueError("PNG/SVG/PDF export needs chromium and chromedriver (Debian: apt-get install chromium chromium-driver)")
    browser, driver_path = found
    driver = webdriver.Chrome(service=Service(executable_path=driver_path), options=chromium_options(browser, **kwargs))
    try:
        yield driver
    finally:
        driver.quit()


_SHARED: dict = {}
_SHARED_LOCK = threading.Lock()


@contextmanager
def shared_chromium() -> Iterator:
    """The process's one headless chromium (started on first use, quit at exit), one export at a time."""
    with _SHARED_LOCK:
        driver = _SHARED.get("driver")
        if driver is not None:
            try:
                driver.execute_script("return 1")
            except Exception:  # noqa: BLE001  (a dead browser is replaced)
                driver = None
        if driver is None:
            cm = chromium()
            driver = cm.__enter__()
            _SHARED.update(driver=driver, cm=cm)
            atexit.register(quit_shared)
        yield driver


def quit_shared() -> None:
    cm = _SHARED.pop("cm", None)
    _SHARED.pop("driver", None)
    if cm is not None:
        try:
            cm.__exit__(None, None, None)
        except Exception:  # noqa: BLE001  (at exit: nothing left to report to)
            pass


_PRESTARTED: dict = {}


def prestart() -> None:
    """Start the shared chromium and load the export page in it, in a background thread now (``overlapviz export`` calls
    it before importing HoloViews): ``shared_chromium`` then waits for that instead of beginning its own. Nothing
    happens without chromium."""
    if find_chromium() is None or "thread" in _PRESTARTED:
        return
    # the page is written here, not in the thread: importing Bokeh in two threads at once (HoloViews imports it here)
    # can end in the import system's deadlock error; HoloViews imports what it needs of Bokeh anyway
    page = _page_file(widgets=False)

    def start():
        try:
            with shared_chromium() as driver:
                load_export_page(driver, page=page)  # most figures have no widgets; one with a table loads the other page
        except Exception:  # noqa: BLE001  (the export that needs it starts one again and reports the error)
            pass

    _PRESTARTED["thread"] = threading.Thread(target=start, name="overlapviz-chromium", daemon=True)
    _PRESTARTED["thread"].start()


# the page figures are drawn in: every BokehJS bundle inline (nothing is requested), the body laid out as in
# Bokeh's own export page (bokeh.io.export.get_layout_html), and one element the figure is drawn into
_PAGE = """<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>overlapviz export</title>
<style>html, body { box-sizing: border-box; width: 100%; height: 100%; margin: 0; border: 0; padding: 0; overflow: hidden; }</style>
{scripts}</head><body><div id="overlapviz-export" style="display: contents;"></div></body></html>"""
PAGE_USES = 25  # figures drawn in one load of the page, then it is loaded again (the old documents let go)
_PAGES: dict = {}  # id(driver) -> (figures drawn in its current load of the export page, whether it has the widgets)
_PAGE_DIR: dict = {}


def load_export_page(driver, *, widgets: bool = False, page: Path | None = None) -> None:
    """Load the export page (BokehJS inline) unless ``driver`` has it loaded and has drawn fewer than ``PAGE_USES``
    figures in it (``page_drawn`` counts them): each figure then sends only its JSON (loading Bokeh's 2 MB page was
    0.7-1.1 s of each export).

    The page holds bokeh.min.js, and the widgets and tables bundles only where ``widgets`` (a figure with a table):
    never bokeh-mathjax (1.8 MB of the 3.9 MB; no figure has math text) nor bokeh-gl (static plots draw on canvas),
    which the browser parsed for every export. Imports Bokeh (not HoloViews) unless given the ``page`` (``_page_file``)."""
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
    """The export page of this Bokeh version (written once, in a private temporary directory of this process)."""
    import tempfile

    import bokeh
    from bokeh.resources import INLINE

    folder = _PAGE_DIR.get("dir")
    if folder is None:
        folder = _PAGE_DIR["dir"] = Path(tempfile.mkdtemp(prefix="overlapviz-export-"))
        atexit.register(shutil.rmtree, folder, True)
    page = folder / f"bokeh-{bokeh.__version__}{'-widgets' if widgets else ''}.html"
    if not page.exists():
        keep = ("bokeh.min.js", "bokeh-widgets.min.js", "bokeh-tables.min.js") if widgets else ("bokeh.min.js",)
        scripts = "".join(f"<script>{js}</script>" for js in INLINE.js_raw if any(f"BEGIN {k} " in js[:60] for k in keep))
        tmp = page.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(_PAGE.replace("{scripts}", scripts), encoding="utf-8")
        os.replace(tmp, page)
    return page
