"""``overlapviz serve`` against other accounts and other web pages: raw requests to real servers on loopback.

Each server is the real CLI in a subprocess (127.0.0.1, [::1] or a unix socket; never another address).
What is checked: the per-launch token (query, cookie, header) and its absence from logs and pages, the
403s and their bodies, the pinned Host/Origin (HTTP and WebSocket) with the real port of ``--port 0``,
Bokeh's signed session ids, Panel's component route that imported any module, the headers, and the
flags that refuse to start. docs/security.md states the promise these tests hold.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import re
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from overlapviz.cli import main

from _serve import Served, dataset, start_server  # noqa: F401 (shared helpers and fixtures)

# each test starts `overlapviz serve` in a process of its own: `pytest -m slow` and CI run them
pytestmark = pytest.mark.slow
WS_HEADERS = {"Connection": "Upgrade", "Upgrade": "websocket", "Sec-WebSocket-Version": "13",
              "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="}  # fmt: skip


def request(served: Served, path: str = "/", headers: dict | None = None, *, host: str | None = None, method="GET"):
    """(status, headers, body) of one raw request to ``served`` (over its unix socket when it has one)."""
    if served.scheme == "https":
        conn = http.client.HTTPSConnection(served.host.strip("[]"), served.port, timeout=60, context=served.tls_context)
    else:
        conn = http.client.HTTPConnection(served.host.strip("[]"), served.port, timeout=60)
    conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
    conn.putheader("Host", host or served.netloc)
    for name, value in (headers or {}).items():
        conn.putheader(name, value)
    conn.endheaders()
    resp = conn.getresponse()
    body = b"" if resp.status == 101 else resp.read()
    conn.close()
    return resp.status, resp.headers, body.decode("utf-8", "replace")


def cookie_of(headers) -> str:
    """The ``name=value`` of the Set-Cookie in ``headers``."""
    return headers["Set-Cookie"].split(";", 1)[0]


@pytest.fixture(scope="module")
def served(dataset, tmp_path_factory):
    server = start_server(dataset, "--port", "0", "--no-show", log=tmp_path_factory.mktemp("log") / "serve.log")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def cookie(served):
    status, headers, _ = request(served, f"/?token={served.token}")
    assert status == 200
    return cookie_of(headers)


def dataset_leaks(body: str, dataset) -> list[str]:
    """Strings of the dataset (path, run ids, kernel names) found in ``body``."""
    marks = [str(dataset), "cb-ar-sequential", "ovz_gemm", "ovz_comm", "sequential-pad0"]
    return [m for m in marks if m in body]


def test_port_0_banner_prints_the_real_port_and_a_token(served):
    assert served.port != 0 and served.host == "127.0.0.1"
    assert re.fullmatch(r"[A-Za-z0-9_-]{43}", served.token), served.url  # 256 random bits, URL-safe
    with socket.create_connection(("127.0.0.1", served.port), timeout=5):
        pass


def test_only_the_token_or_its_cookie_gets_in(served, dataset):
    bare = request(served, "/")
    wrong = request(served, f"/?token={'x' * len(served.token)}")
    prefix = request(served, f"/?token={served.token[:-1]}")
    for status, headers, body in (bare, wrong, prefix):
        assert status == 403 and body.startswith("403 Forbidden"), body[:300]
        assert not dataset_leaks(body, dataset) and "Set-Cookie" not in headers
    status, headers, body = request(served, f"/?token={served.token}")
    assert status == 200 and "<title>overlapviz</title>" in body
    attrs = [a.strip().lower() for a in headers["Set-Cookie"].split(";")[1:]]
    assert {"httponly", "samesite=strict", "path=/"} <= set(attrs), headers["Set-Cookie"]
    name, value = cookie_of(headers).split("=", 1)
    assert served.token not in value  # the cookie is derived from the token, not the token
    assert request(served, "/", {"Cookie": f"{name}={value}"})[0] == 200  # in-app links: the cookie alone
    forged = value[:-1] + ("1" if value[-1] == "0" else "0")  # one character changed (the cookie ends in "0" 1 time in 16)
    assert request(served, "/", {"Cookie": f"{name}={forged}"})[0] == 403
    assert request(served, "/", {"Authorization": f"token {served.token}"})[0] == 200  # scripts
    # nothing of the token in the page, nor in the Bokeh session token it embeds (arguments, cookies, headers)
    from bokeh.util.token import get_token_payload

    status, _, body = request(served, f"/?token={served.token}&x=1", {"Cookie": f"{name}={value}"})
    payload = repr(get_token_payload(re.search(r'"token":\s*"([^"]+)"', body).group(1)))
    assert status == 200 and "'x': [b'1']" in payload  # the other arguments are there ...
    for secret in (served.token, value):
        assert secret not in body and secret not in payload  # ... not the token, not the cookie


def test_every_route_but_static_files_needs_the_token(served):
    for path in ("/ws", "/metadata", "/autoload.js?bokeh-autoload-element=x", "/components/panel/x/__css__/a.css",
                 "/liveness", "/rest/session_info", "/nonexistent", "//", "/%73tatic/js/bokeh.min.js"):  # fmt: skip
        assert request(served, path)[0] == 403, path
    for method in ("POST", "PUT", "DELETE", "OPTIONS", "HEAD"):
        assert request(served, "/", method=method)[0] == 403, method
    status, _, body = request(served, "/static/js/bokeh.min.js")  # BokehJS stays open
    assert status == 200 and "Bokeh" in body[:2000]
    for path in ("/static/", "/static/js/", "/static/../../../../etc/passwd", "/static/..%2f..%2f..%2f..%2fetc%2fpasswd"):
        status, _, body = request(served, path)
        assert status in (403, 404) and "root:" not in body and "bokeh.min.js" not in body, path  # no listing


def test_headers_on_every_answer(served, cookie):
    for path, extra in (("/", {"Cookie": cookie}), ("/", {}), ("/static/js/bokeh.min.js", {})):
        _, headers, _ = request(served, path, extra)
        assert "frame-ancestors 'none'" in headers["Content-Security-Policy"], path
        assert headers["X-Frame-Options"] == "DENY" and headers["X-Content-Type-Options"] == "nosniff"
        assert headers["Referrer-Policy"] == "no-referrer"


def test_other_origins_and_host_names_are_refused(served, cookie, dataset):
    other_port = served.port + 1 if served.port < 65535 else served.port - 1
    for origin in ("http://evil.example", f"http://127.0.0.1:{other_port}", f"http://localhost:{other_port}", "null",
                   f"file://127.0.0.1:{served.port}"):  # fmt: skip
        status, _, body = request(served, "/", {"Cookie": cookie, "Origin": origin})
        assert status == 403 and not dataset_leaks(body, dataset), origin
        assert request(served, "/ws", {"Cookie": cookie, "Origin": origin, **WS_HEADERS})[0] == 403, origin
    # DNS rebinding: a name that resolves to 127.0.0.1 but is not this server's
    for host in (f"evil.example:{served.port}", f"127.0.0.1:{other_port}", "127.0.0.1"):
        assert request(served, "/", {"Cookie": cookie}, host=host)[0] == 403, host
    # the same requests from the served origin pass: the refusals above are the origin's doing
    assert request(served, "/", {"Cookie": cookie, "Origin": f"http://127.0.0.1:{served.port}"})[0] == 200
    assert request(served, "/", {"Cookie": cookie}, host=f"localhost:{served.port}")[0] == 200
    assert request(served, "/ws", {"Cookie": cookie, "Origin": f"http://127.0.0.1:{served.port}", **WS_HEADERS})[0] == 101


def _session_token(served, cookie) -> str:
    body = request(served, "/", {"Cookie": cookie})[2]
    return re.search(r'"token":\s*"([^"]+)"', body).group(1)


def _bokeh_ws(served, cookie: str | None, session_token: str, origin: str | None = None) -> str:
    """Open a Bokeh WebSocket as BokehJS does; the type of the first message, or why it failed."""
    from tornado.httpclient import HTTPClientError, HTTPRequest
    from tornado.websocket import websocket_connect

    headers = {"Origin": origin or f"http://{served.netloc}", **({"Cookie": cookie} if cookie else {})}

    async def run():
        req = HTTPRequest(f"ws://{served.netloc}/ws", headers=headers, request_timeout=30)
        try:
            conn = await websocket_connect(req, subprotocols=["bokeh", session_token])
        except HTTPClientError as exc:
            return f"HTTP {exc.code}"
        msg = await asyncio.wait_for(conn.read_message(), 30)
        conn.close()
        return "closed" if msg is None else json.loads(msg)["msgtype"]

    return asyncio.run(run())


def test_websocket_needs_the_cookie_the_origin_and_a_signed_session(served, cookie):
    from bokeh.util.token import generate_jwt_token, generate_secret_key, generate_session_id, get_token_payload

    token = _session_token(served, cookie)
    assert _bokeh_ws(served, cookie, token) == "ACK"  # the real client's way in works
    assert _bokeh_ws(served, None, token) == "HTTP 403"  # no cookie
    assert _bokeh_ws(served, cookie, token, origin="http://evil.example") == "HTTP 403"
    # a session token and id signed with another key (a guessed or forged session) is useless
    other = generate_secret_key().encode()
    payload = {k: v for k, v in get_token_payload(token).items() if k != "session_expiry"}
    forged = generate_jwt_token(generate_session_id(secret_key=other, signed=True), secret_key=other, signed=True,
                                extra_payload=payload)  # fmt: skip
    # refused at the door (403, one access-log line), before Bokeh would accept the upgrade and close it
    assert _bokeh_ws(served, cookie, forged) == "HTTP 403"
    unsigned = generate_jwt_token(generate_session_id(signed=False), signed=False, extra_payload=payload)
    assert _bokeh_ws(served, cookie, unsigned) == "HTTP 403"


def test_forged_session_ids_are_refused(served, cookie, dataset):
    from bokeh.util.token import generate_secret_key, generate_session_id

    forged = generate_session_id(secret_key=generate_secret_key().encode(), signed=True)
    for session_id in (forged, "guessed", forged.split(".")[0]):
        status, _, body = request(served, f"/?bokeh-session-id={session_id}", {"Cookie": cookie})
        assert status == 403 and not dataset_leaks(body, dataset), session_id


def test_no_token_in_the_server_log(served, cookie):
    request(served, f"/?token={served.token}&x=1")
    request(served, "/?token=a-wrong-token-of-some-length")
    request(served, "/", {"Authorization": f"token {served.token}"})
    time.sleep(0.5)
    lines = served.text().splitlines()
    banner = [line for line in lines if "overlapviz dashboard for" in line]
    rest = "\n".join(line for line in lines if line not in banner)
    assert len(banner) == 1 and served.token in banner[0]  # printed once, to the user, as Jupyter does
    assert "403 GET / (" in rest  # the access log is there ...
    assert served.token not in rest and "a-wrong-token" not in rest and cookie.split("=", 1)[1] not in rest  # ... without it


def test_component_route_imports_no_module_from_a_url(dataset, tmp_path, served, cookie):
    probe_dir = tmp_path / "probe"
    probe_dir.mkdir()
    marker = tmp_path / "imported"
    (probe_dir / "ovz_probe_mod.py").write_text(
        f"open({str(marker)!r}, 'w').write('imported')\nclass C:\n    __css__ = ['a.css']\n"
    )
    (probe_dir / "a.css").write_text("body {}")
    # the probe works: importing it leaves the marker
    subprocess.run([sys.executable, "-c", "import ovz_probe_mod"], check=True, env={**os.environ, "PYTHONPATH": str(probe_dir)})
    assert marker.exists()
    marker.unlink()
    path = os.pathsep.join(p for p in (str(probe_dir), os.environ.get("PYTHONPATH")) if p)
    server = start_server(dataset, "--port", "0", log=tmp_path / "serve.log", env={"PYTHONPATH": path})
    try:
        auth = {"Authorization": f"token {server.token}"}
        for module in ("ovz_probe_mod", "antigravity", "this", "os"):
            status, _, _ = request(server, f"/components/{module}/C/__css__/a.css", auth)
            assert status == 404, module
        assert not marker.exists()
        assert request(server, "/components/ovz_probe_mod/C/__css__/a.css")[0] == 403  # and the route needs the token
    finally:
        server.stop()


def test_no_token_is_explicit_and_warned(dataset, tmp_path):
    server = start_server(dataset, "--port", "0", "--no-token", log=tmp_path / "serve.log")
    try:
        assert server.token is None
        warnings = [line for line in server.text().splitlines() if line.startswith("warning:")]
        assert len(warnings) == 1 and "--no-token" in warnings[0], server.text()
        assert request(server, "/")[0] == 200
        assert request(server, "/", {"Origin": "http://evil.example"})[0] == 403  # origins stay pinned
    finally:
        server.stop()


def test_token_from_the_environment_and_a_private_token_file(dataset, tmp_path):
    token = "env-token-0123456789abcdef"
    token_file = tmp_path / "url"
    banner = re.compile(r"overlapviz dashboard for .* at (http://\S+)  \(the URL with its token is in")
    server = start_server(dataset, "--port", "0", "--token-file", str(token_file), log=tmp_path / "serve.log",
                          env={"OVERLAPVIZ_TOKEN": token}, banner=banner)  # fmt: skip
    try:
        assert token not in server.text()  # the token goes to the file only
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
        url = token_file.read_text().strip()
        assert url == f"{server.url}?token={token}"
        assert request(server, f"/?token={token}")[0] == 200
    finally:
        assert server.stop() == 0
    assert not token_file.exists()  # removed at exit
    mine = tmp_path / "notes.txt"
    mine.write_text("the user's own file\n")
    result = CliRunner().invoke(main, ["serve", str(dataset), "--port", "0", "--token-file", str(mine)])
    assert result.exit_code != 0 and "exists" in result.output, result.output
    assert mine.read_text() == "the user's own file\n"


def test_unix_socket_is_private_and_answers_through_a_tunnel(dataset, tmp_path):
    folder = tmp_path / "run"
    folder.mkdir(mode=0o700)
    path = folder / "ovz.sock"
    banner = re.compile(r"on unix socket (\S+) \(only you can connect\)\. From your machine: ssh -N -L 5006:\S+ \S+ "
                        r"then open (http://localhost:5006/\?token=\S+)")  # fmt: skip
    log = tmp_path / "serve.log"
    with open(log, "wb") as fh:
        proc = subprocess.Popen([sys.executable, "-c", "from overlapviz.cli import main; main()", "serve", str(dataset),
                                 "--unix-socket", str(path)], stdout=fh, stderr=subprocess.STDOUT)  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not (found := banner.search(log.read_text())):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        token = found.group(2).split("token=")[1]
        st = path.lstat()
        assert stat.S_ISSOCK(st.st_mode) and st.st_uid == os.getuid() and stat.S_IMODE(st.st_mode) == 0o600

        def get(target, headers):
            conn = http.client.HTTPConnection("localhost", timeout=60)
            conn.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            conn.sock.connect(str(path))
            conn.request("GET", target, headers=headers)
            status = conn.getresponse().status
            conn.close()
            return status

        assert get(f"/?token={token}", {"Host": "localhost:8888"}) == 200  # any local end of an SSH tunnel
        assert get("/", {"Host": "localhost:8888"}) == 403
        assert get(f"/?token={token}", {"Host": "evil.example:8888"}) == 403
        assert get(f"/?token={token}", {"Host": "localhost:8888", "Origin": "http://evil.example"}) == 403
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=20)
    assert not path.exists()  # removed at exit


def test_flags_that_refuse_to_start(dataset, tmp_path):
    def refused(*args, env=None):
        result = CliRunner().invoke(main, ["serve", str(dataset), *args], env=env)
        assert result.exit_code != 0 and "Traceback" not in result.output, result.output
        return result.output

    # nothing here binds: each is refused before the server listens
    assert "--allow-remote" in refused("--address", "0.0.0.0")
    assert "--allow-remote" in refused("--address", "::")
    assert "TLS" in refused("--address", "0.0.0.0", "--allow-remote")
    assert "network" in refused("--address", "0.0.0.0", "--allow-remote", "--allow-http", "--no-token")
    assert "16-256 characters" in refused("--token", "short")
    assert "16-256 characters" in refused(env={"OVERLAPVIZ_TOKEN": "has spaces in it, 16+"})
    assert "both" in refused("--no-token", "--token", "a" * 20)
    assert "--port" in refused("--unix-socket", str(tmp_path / "s"), "--port", "6000")
    assert "HOST" in refused("--allow-websocket-origin", "*")
    assert "HOST" in refused("--allow-websocket-origin", "http://proxy.example")
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # writable by all, no sticky bit: another account could swap the socket
    assert "writable by other accounts" in refused("--unix-socket", str(shared / "s"))


def test_listen_rules_and_warnings():
    from overlapviz.dashboards import security

    assert security.is_loopback("127.0.0.1") and security.is_loopback("::1") and security.is_loopback("localhost")
    assert not security.is_loopback("0.0.0.0") and not security.is_loopback("") and not security.is_loopback("10.1.2.3")
    assert security.check_listen("127.0.0.1", allow_remote=False, tls=False, allow_http=False, token="t") == []
    (line,) = security.check_listen("10.1.2.3", allow_remote=True, tls=False, allow_http=True, token="t")
    assert line.startswith("warning:") and "10.1.2.3" in line and "plain HTTP" in line
    (line,) = security.check_listen("10.1.2.3", allow_remote=True, tls=True, allow_http=False, token="t")
    assert "plain HTTP" not in line and "\n" not in line
    with pytest.raises(ValueError, match="--allow-remote"):
        security.check_listen("10.1.2.3", allow_remote=False, tls=True, allow_http=False, token="t")


def test_ipv6_loopback_and_a_proxy_name(dataset, tmp_path):
    try:
        socket.socket(socket.AF_INET6).bind(("::1", 0))
    except OSError:
        pytest.skip("no IPv6 loopback here")
    server = start_server(dataset, "--address", "::1", "--port", "0", "--allow-websocket-origin", "proxy.example:8443",
                          log=tmp_path / "serve.log")  # fmt: skip
    try:
        assert server.host == "[::1]" and server.port != 0
        status, headers, _ = request(server, f"/?token={server.token}")
        assert status == 200
        cookie = cookie_of(headers)
        assert request(server, "/", {"Cookie": cookie, "Origin": f"http://[::1]:{server.port}"})[0] == 200
        assert request(server, "/", {"Cookie": cookie, "Origin": "https://proxy.example:8443"},
                       host="proxy.example:8443")[0] == 200  # fmt: skip
        assert request(server, "/", {"Cookie": cookie, "Origin": "https://proxy.example:9999"})[0] == 403
        assert request(server, "/ws", {"Cookie": cookie, "Origin": "https://proxy.example:8443", **WS_HEADERS})[0] == 101
    finally:
        server.stop()


def test_tls_on_loopback_and_a_secure_cookie(dataset, tmp_path):
    import shutil
    import ssl

    if shutil.which("openssl") is None:
        pytest.skip("no openssl to make a certificate")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)  # fmt: skip
    server = start_server(dataset, "--port", "0", "--ssl-certfile", str(cert), "--ssl-keyfile", str(key),
                          log=tmp_path / "serve.log")  # fmt: skip
    try:
        assert server.scheme == "https"
        server.tls_context = ssl.create_default_context(cafile=str(cert))
        status, headers, _ = request(server, f"/?token={server.token}")
        assert status == 200 and "; Secure" in headers["Set-Cookie"]
        assert request(server, "/")[0] == 403
        with pytest.raises((http.client.HTTPException, OSError)):  # plain HTTP to the TLS port gets nothing
            request(Served(server.proc, server.log, server.url.replace("https", "http", 1)), "/")
    finally:
        server.stop()


def test_sigterm_stops_the_server_and_removes_its_files(dataset, tmp_path):
    folder = tmp_path / "run"
    folder.mkdir(mode=0o700)
    sock, url_file = folder / "ovz.sock", folder / "url"
    banner = re.compile(r"on unix socket .* then open (\S+)")
    server = start_server(dataset, "--unix-socket", str(sock), "--token-file", str(url_file), log=tmp_path / "serve.log",
                          banner=banner)  # fmt: skip
    assert sock.exists() and url_file.exists()
    server.proc.terminate()  # what a batch system sends at the end of a job
    assert server.proc.wait(timeout=30) == 0
    assert not sock.exists() and not url_file.exists()


@pytest.mark.slow
def test_soak_runs_real_sessions_without_errors(dataset):
    # the soak of docs/security.md, for seconds instead of minutes: its clients really drive the server
    from overlapviz.dashboards.soak import soak

    report = soak(Path(dataset), clients=2, minutes=0.3, actions=4, warmup_s=5, expiry_wait_s=0)
    assert report["sessions"] >= 2 and report["actions"] >= 4, report
    assert report["server_patches_received"] > 0 and report["n_switches"] > 0, report
    assert report["client_errors"] == 0 and report["server_log_errors"] == 0, report


def test_serve_get_keeps_working(dataset):
    result = CliRunner().invoke(main, ["serve", str(dataset), "--get", "/"])
    assert result.exit_code == 0 and "<title>overlapviz</title>" in result.output, result.output[-2000:]


def _log_after(served: Served, requests) -> list[str]:
    """The server's log lines written while ``requests`` (a callable) ran."""
    time.sleep(0.3)
    before = len(served.text().splitlines())
    requests()
    time.sleep(0.5)
    return served.text().splitlines()[before:]


def test_the_token_under_another_name_or_case_is_kept_out_of_the_log(served, cookie):
    token = served.token

    def send():
        for query in (f"TOKEN={token}", f"Token={token}&x=1", f"x={token}", f"a=1&tOkEn={token}&b={token}"):
            assert request(served, f"/?{query}")[0] == 403, query  # only ?token= presents the token
        request(served, f"/{token}")  # in the path: not a query parameter, still not logged

    lines = _log_after(served, send)
    assert len(lines) == 5 and all(" GET /" in line for line in lines), lines  # the access log is there ...
    assert not any(token in line or cookie.split("=", 1)[1] in line for line in lines), lines  # ... without the token


def test_malformed_static_paths_and_forged_sessions_are_one_log_line_and_4xx(served, cookie):
    asked = []

    def send():
        for path in ("/static/%00", "/static/js/bokeh%00.min.js", "/static/%ff%fe", "/%00"):
            asked.append((path, request(served, path)[0], 400))
        for path in ("/?bokeh-session-id=forged.abc", "/?bokeh-token=garbage", "/?bokeh-token=eyJ9.x",
                     "/autoload.js?bokeh-autoload-element=x&bokeh-session-id=forged"):
            asked.append((path, request(served, path, {"Cookie": cookie})[0], 403))
        ws = {**WS_HEADERS, "Cookie": cookie, "Sec-WebSocket-Protocol": "bokeh, garbage"}
        asked.append(("/ws", request(served, "/ws", ws)[0], 403))

    lines = _log_after(served, send)
    assert [(p, got) for p, got, _ in asked] == [(p, want) for p, _, want in asked]
    assert len(lines) == len(asked), "\n".join(lines)  # one access-log line each: no traceback, no Bokeh error
    assert not any("Traceback" in line or "ERROR" in line for line in lines), lines
