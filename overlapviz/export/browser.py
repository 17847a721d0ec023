"""The system's headless chromium, driven by Selenium through the system chromedriver (never a browser download).

Importing this module imports no plotting library: ``overlapviz export`` starts the browser here while HoloViews is
still being imported (``prestart``), so the browser's start (about a second) is not added to the command's time.
"""

from __future__ import annotations

import atexit
import os
import shutil
import threading
from contextlib import contextmanager
from typing import Iterator

__all__ = ["chromium", "chromium_options", "find_chromium", "prestart", "shared_chromium"]

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
    """Start the shared chromium in a background thread now (``overlapviz export`` calls it before importing HoloViews):
    ``shared_chromium`` then waits for that start instead of beginning its own. Nothing happens without chromium."""
    if find_chromium() is None or "thread" in _PRESTARTED:
        return

    def start():
        try:
            with shared_chromium():
                pass
        except Exception:  # noqa: BLE001  (the export that needs it starts one again and reports the error)
            pass

    _PRESTARTED["thread"] = threading.Thread(target=start, name="overlapviz-chromium", daemon=True)
    _PRESTARTED["thread"].start()
