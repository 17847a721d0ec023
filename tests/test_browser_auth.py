"""Only the holder of the printed URL gets in, in Debian's headless chromium (``overlapviz serve`` on 127.0.0.1).

The tokenized URL loads and draws every page (under the server's Content-Security-Policy: a blocked
script or style is a console error here) and leaves an HttpOnly, SameSite=Strict cookie that keeps the
bare URL working in that browser; a fresh browser gets 403 for the bare URL, a wrong token and a
forged session id; a page of another origin on the same host (same site: the cookie goes with it)
can open no WebSocket to the dashboard, and cannot frame it.
"""

from __future__ import annotations

import http.server
import threading
import time

import pytest
from _browser import wait_for  # the browser tests' wait
from _serve import start_server  # the same CLI server as the raw-request tests

from overlapviz.export.render import chromium_options, find_chromium
from overlapviz.testing import write_grid_dataset

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(find_chromium() is None, reason="Debian chromium + chromium-driver not installed"),
]

# the dashboard's tab names, in order, as the page has them
TABS_JS = "return [...Bokeh.documents[0].all_models].find(m => m.type === 'panel.models.tabs.Tabs').tabs.map(t => t.title)"
TITLES_JS = "return [...Bokeh.documents[0].all_models].filter(m => m.type === 'Title').map(m => m.text)"
IDLE_JS = "return !!(window.Bokeh && Bokeh.documents.length && Bokeh.documents[0].is_idle)"
# canvases with a plot drawn on them (more than a handful of colours), through Bokeh's shadow roots
DRAWN_JS = """
function all(root, out) {
  root.querySelectorAll('canvas').forEach(c => out.push(c));
  root.querySelectorAll('*').forEach(e => { if (e.shadowRoot) all(e.shadowRoot, out); });
  return out;
}
return all(document, []).filter(c => {
  const r = c.getBoundingClientRect(), ctx = c.getContext('2d');
  if (r.width < 100 || r.height < 100 || !ctx) return false;
  const d = ctx.getImageData(0, 0, c.width, c.height).data, colours = new Set();
  for (let i = 0; i < d.length; i += 4 * 53) colours.add((d[i] << 16) | (d[i + 1] << 8) | d[i + 2] | (d[i + 3] << 24));
  return colours.size >= 8;
}).length;
"""
# open a Bokeh WebSocket as BokehJS does ("bokeh" subprotocol + the session token): "open" or "refused"
WEBSOCKET_JS = """
const [url, token, done] = arguments;
const ws = new WebSocket(url, ['bokeh', token]);
ws.onopen = () => { ws.close(); done('open'); };
ws.onerror = () => done('refused');
"""


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return write_grid_dataset(tmp_path_factory.mktemp("auth") / "ds")


@pytest.fixture(scope="module")
def served(dataset, tmp_path_factory):
    server = start_server(dataset, "--port", "0", "--no-show", log=tmp_path_factory.mktemp("log") / "serve.log")
    yield server
    server.stop()


def _chromium():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    binary, driver_path = find_chromium()
    options = chromium_options(binary, width=1400, height=1100)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=driver_path), options=options)
    driver.set_page_load_timeout(120)
    driver.set_script_timeout(60)
    return driver


@pytest.fixture(scope="module")
def browser():
    driver = _chromium()
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def fresh_browser():
    """A browser that has never seen the token (its own profile, no cookie)."""
    driver = _chromium()
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture(scope="module")
def other_origin():
    """A page on another port of the same host: another account's web server, same site as the dashboard."""
    page = b"<!DOCTYPE html><html><head><title>other</title></head><body>other origin</body></html>"

    class Page(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.end_headers()
            self.wfile.write(page)

        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Page)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/"
    httpd.shutdown()


def loaded(driver) -> bool:
    return driver.execute_script(IDLE_JS) and driver.execute_script(DRAWN_JS) > 0


def refused(driver, dataset) -> str:
    """The page's text, asserting it is a 403 with nothing of the dataset and no Bokeh document."""
    text = driver.execute_script("return document.body ? document.body.innerText : ''")
    assert "403" in text, text[:500]
    assert not driver.execute_script("return !!window.Bokeh"), "BokehJS ran on a refused page"
    for mark in (str(dataset), "cb-ar-", "ovz_gemm", "ovz_comm"):
        assert mark not in driver.page_source, mark
    return text


def test_tokenized_url_loads_every_page_and_sets_the_cookie(served, browser):
    browser.get(served.url)
    wait_for(browser, lambda: loaded(browser), timeout=120.0, what="the dashboard")
    shown = browser.execute_script(TITLES_JS)
    pages = browser.execute_script(TABS_JS)
    assert len(pages) >= 6, pages  # every tab is visited below, the first one last
    for i, name in enumerate(pages[1:] + pages[:1], start=1):
        browser.execute_script(
            "[...Bokeh.documents[0].all_models].find(m => m.type === 'panel.models.tabs.Tabs').active = arguments[0]",
            i % len(pages),
        )  # fmt: skip

        def drawn(before=shown):  # this page's plots (their titles differ from the last page's), drawn
            titles = browser.execute_script(TITLES_JS)
            return browser.execute_script(IDLE_JS) and titles and titles != before and browser.execute_script(DRAWN_JS) > 0 and titles

        shown = wait_for(browser, drawn, timeout=120.0, what=f"{name} plots")
    errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert not errors, errors  # a CSP violation is one
    (cookie,) = [c for c in browser.get_cookies() if c["name"].startswith("overlapviz-")]
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and cookie["path"] == "/"
    assert served.token not in cookie["value"]
    assert not browser.execute_script("return document.cookie")  # HttpOnly: no script of the page reads it
    # links inside the app (no ?token=) keep working with the cookie
    browser.get(served.url.split("?")[0])
    wait_for(browser, lambda: loaded(browser), timeout=120.0, what="the dashboard from the bare URL with the cookie")


@pytest.mark.parametrize("query", ["", "?token=not-the-token-0123456789", "?token="])
def test_bare_url_and_wrong_token_are_refused(served, fresh_browser, dataset, query):
    fresh_browser.get(served.url.split("?")[0] + query)
    refused(fresh_browser, dataset)
    assert not fresh_browser.get_cookies()


def test_forged_session_id_is_refused(served, browser, dataset):
    from bokeh.util.token import generate_secret_key, generate_session_id

    browser.get(served.url)  # holds the cookie: only the session id is wrong
    wait_for(browser, lambda: loaded(browser), timeout=120.0, what="the dashboard")
    forged = generate_session_id(secret_key=generate_secret_key().encode(), signed=True)
    for session_id in (forged, "guessed-session-id"):
        browser.get(f"{served.url.split('?')[0]}?bokeh-session-id={session_id}")
        refused(browser, dataset)


def test_websocket_from_another_origin_or_without_the_cookie_is_refused(served, browser, fresh_browser, other_origin):
    browser.get(served.url)
    wait_for(browser, lambda: loaded(browser), timeout=120.0, what="the dashboard")
    session_token = browser.execute_script(
        "return [...document.scripts].map(s => s.textContent.match(/\"token\":\\s*\"([^\"]+)\"/)).find(m => m)[1]"
    )
    ws_url = f"ws://{served.netloc}/ws"
    # the dashboard's own page opens it (the check below can tell "open" from "refused")
    assert browser.execute_async_script(WEBSOCKET_JS, ws_url, session_token) == "open"
    # another origin on the same host: same site, so the SameSite=Strict cookie goes along; the Origin pin refuses
    browser.get(other_origin)
    assert browser.execute_async_script(WEBSOCKET_JS, ws_url, session_token) == "refused"
    # a browser without the cookie (another account), from the dashboard's own origin
    fresh_browser.get(f"http://{served.netloc}/static/js/bokeh.min.js")  # open; gives the page the dashboard's origin
    assert fresh_browser.execute_async_script(WEBSOCKET_JS, ws_url, session_token) == "refused"


def test_no_other_page_can_frame_the_dashboard(served, browser, other_origin):
    browser.get(served.url)
    wait_for(browser, lambda: loaded(browser), timeout=120.0, what="the dashboard")
    browser.get(other_origin)
    browser.execute_script(
        "const f = document.createElement('iframe'); f.id = 'f'; f.src = arguments[0]; f.width = 800; f.height = 600;"
        "document.body.appendChild(f);",
        served.url,
    )  # fmt: skip
    time.sleep(3)
    # a framed dashboard would run BokehJS in the frame; a blocked frame is an error page without it
    browser.switch_to.frame("f")
    try:
        assert not browser.execute_script("return !!window.Bokeh")
    finally:
        browser.switch_to.default_content()
    assert any("frame" in e["message"].lower() for e in browser.get_log("browser")), "no frame refusal logged"
