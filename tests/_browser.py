"""The browser tests' server, headless Debian chromium and page helpers (fixtures `dataset`, `downloads`, `browser`), shared
by test_browser and test_browser_answer."""

from __future__ import annotations
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
import pytest
from overlapviz.export.render import chromium_options, find_chromium
from overlapviz.testing import write_grid_dataset


SAMPLES = os.environ.get("OVERLAPVIZ_BROWSER_DATASET") == "samples"


TOKEN = "overlapviz-browser-test-token-0123456789"


# the models in the page now (reachable from its roots): Bokeh's all_models keeps those a redraw replaced until 30 s
# after the last change, and a stale widget set there changes nothing
MODELS = "[...new Set(Bokeh.documents[0].roots().flatMap(r => [...r.references()]))]"


TITLES_JS = f"return {MODELS}.filter(m => m.type === 'Title').map(m => m.text)"


TEXT_JS = """function t(root){ let s = ''; const w = document.createTreeWalker(root, NodeFilter.SHOW_TEXT);
  while (w.nextNode()) { const p = w.currentNode.parentNode; if (p && !['STYLE', 'SCRIPT'].includes(p.nodeName)) s += w.currentNode.textContent + ' '; }
  root.querySelectorAll('*').forEach(e => { if (e.shadowRoot) s += t(e.shadowRoot); }); return s; }
return t(document)"""


# `overlapviz serve` whose explain waits until the file $OVZ_TEST_WHY_GATE exists: what the pages show before and after
GATED_EXPLAIN = """
import os, time
from overlapviz.dashboards import store
real = store.ANALYSES["explain"]
def gated(*args, **kwargs):
    while not os.path.exists(os.environ["OVZ_TEST_WHY_GATE"]):
        time.sleep(0.05)
    return real(*args, **kwargs)
store.ANALYSES["explain"] = gated
from overlapviz.cli import main
main()
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(dataset, log: Path, *, code: str = "from overlapviz.cli import main; main()", env: dict | None = None):
    """``overlapviz serve`` on a free port with a known token; yields (url, log path)."""
    port = _free_port()
    env = dict(os.environ, OVERLAPVIZ_TOKEN=TOKEN, PYTHONFAULTHANDLER="1", **(env or {}))
    with open(log, "wb") as fh:
        proc = subprocess.Popen(
            [sys.executable, "-c", code, "serve", *([str(dataset)] if dataset else []),
             "--port", str(port), "--no-show"], stdout=fh, stderr=subprocess.STDOUT, env=env,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"server did not start: {log.read_text()[-2000:]}")
                time.sleep(0.3)
        yield f"http://127.0.0.1:{port}/?token={TOKEN}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=15)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    if SAMPLES:
        return None  # `overlapviz serve` with no dataset: the bundled sample traces
    return write_grid_dataset(tmp_path_factory.mktemp("browser") / "ds")


@pytest.fixture(scope="module")
def downloads(tmp_path_factory):
    return tmp_path_factory.mktemp("downloads")


@pytest.fixture(scope="module")
def browser(downloads):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    binary, driver_path = find_chromium()
    options = chromium_options(binary, width=1400, height=1100)
    options.set_capability("goog:loggingPrefs", {"performance": "ALL", "browser": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=driver_path), options=options)
    driver.set_page_load_timeout(120)
    driver.set_script_timeout(60)
    driver.execute_cdp_cmd("Browser.setDownloadBehavior", {"behavior": "allow", "downloadPath": str(downloads)})
    try:
        yield driver
    finally:
        driver.quit()


def wait_for(driver, predicate, timeout=90.0, what="condition"):
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = predicate()
        except Exception:  # the page is still loading its scripts
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}; {_state(driver)}")
        time.sleep(0.2)


def _state(driver) -> str:
    """What the page showed when a wait ran out (for the failure's message): idle or not, its text, its console errors."""
    parts = []
    for label, get in (("idle", lambda: idle(driver)), ("text", lambda: page_text(driver)[:1500]),
                       ("console", lambda: [e["message"][:300] for e in driver.get_log("browser") if e["level"] == "SEVERE"][-8:])):
        try:
            parts.append(f"{label}: {get()!r}")
        except Exception as exc:  # noqa: BLE001  (a page that cannot be asked: said as such)
            parts.append(f"{label}: {type(exc).__name__}")
    return "; ".join(parts)


def idle(driver) -> bool:
    return driver.execute_script("return !!(window.Bokeh && Bokeh.documents.length && Bokeh.documents[0].is_idle)")


def page_text(driver) -> str:
    """The text a user reads (styles and scripts left out), through Bokeh's shadow roots."""
    return driver.execute_script(TEXT_JS)


def set_model(driver, model_type: str, prop: str, value, *, where: str | None = None, every: bool = False) -> None:
    """Set a property of a Bokeh model in the page (of every such model with ``every``), as a click or a selection
    would (synced to the server)."""
    driver.execute_script(
        f"""
        const [type, prop, value, title, every] = arguments;
        const ms = {MODELS}.filter(m => m.type === type && (title === null || m.title === title || m.label === title));
        if (!ms.length) throw new Error('no ' + type + ' ' + title);
        for (const m of (every ? ms : ms.slice(0, 1))) m[prop] = value;
        """,
        model_type, prop, value, where, every,
    )  # fmt: skip

