"""Who may use a running dashboard: a per-launch token, pinned hosts and origins, and the headers of every answer.

One gate sits in front of every route of the Bokeh/Panel server (a tornado rule matched before all
others), so a route added by a later Panel or Bokeh is closed too. docs/security.md states the promise.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import ipaddress
import logging
import os
import re
import secrets
import socket
import stat
import sys
import tempfile
import webbrowser
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlencode, urlsplit

from panel.io.server import ComponentResourceHandler
from tornado.httputil import parse_qs_bytes
from tornado.routing import Matcher, Rule
from tornado.web import HTTPError, OutputTransform, RequestHandler

from overlapviz.dashboards import patches

TOKEN_ARG = "token"  # ?token=... as Jupyter prints it
TOKEN_PATTERN = re.compile(r"[A-Za-z0-9_.~-]{16,256}")  # URL- and cookie-safe, long enough not to be guessed
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "[::1]")
# BokehJS, Panel's and the extensions' packaged JS/CSS, and the icon: package files, nothing of the dataset
OPEN_PREFIXES = ("/static/",)
OPEN_PATHS = ("/favicon.ico",)
BAD_REQUEST = "this path is not UTF-8 text or holds a NUL byte: no file has such a name"
# modules whose component resources (CSS/JS listed on a class) the page may fetch by URL
OWN_PACKAGES = ("panel", "bokeh", "holoviews", "overlapviz")
COMPONENTS_ROUTE = r"/components/(.*)"  # panel.io.resources.COMPONENT_PATH
# BokehJS and Panel run inline scripts, build functions at run time and draw into blob:/data: images;
# everything else stays on this server, and no other site may frame the page
CSP_DIRECTIVES = (
    "default-src 'self'",
    "script-src 'self' 'unsafe-inline' 'unsafe-eval' blob:",  # blob: Panel's es-module-shims
    "style-src 'self' 'unsafe-inline'",
    "img-src 'self' data: blob:",
    "font-src 'self' data:",
    "connect-src 'self'",
    "worker-src 'self' blob:",
    "object-src 'none'",
    "base-uri 'self'",
    "form-action 'self'",
    "frame-ancestors 'none'",
)
CONTENT_SECURITY_POLICY = "; ".join(CSP_DIRECTIVES)
HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",  # the page's own requests never carry ?token= to anyone
    "Cross-Origin-Resource-Policy": "same-origin",
}


def new_token() -> str:
    """A random token for one launch (256 bits, URL-safe)."""
    return secrets.token_urlsafe(32)


def check_token(token: str) -> str:
    """``token`` if it is usable in a URL and a cookie and long enough; else ValueError."""
    if not TOKEN_PATTERN.fullmatch(token):
        raise ValueError("the token must be 16-256 characters of A-Z a-z 0-9 _ . ~ - (it goes into a URL and a cookie)")
    return token


def is_loopback(address: str) -> bool:
    """Whether every address ``address`` resolves to is a loopback address ('' and 0.0.0.0 are not)."""
    host = address.strip("[]")
    if not host:
        return False
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(i[4][0].split("%")[0]).is_loopback for i in infos)


def check_listen(address: str, *, allow_remote: bool, tls: bool, allow_http: bool, token: str | None) -> list[str]:
    """Refuse a risky place to listen (ValueError); return the one-line warnings for an allowed one."""
    warnings = []
    if not is_loopback(address):
        if not allow_remote:
            raise ValueError(f"--address {address} is reachable from other machines; pass --allow-remote to serve there "
                             "(or use --unix-socket / an SSH tunnel, docs/security.md)")  # fmt: skip
        if token is None:
            raise ValueError(f"--no-token with --address {address} would open the dataset to the network; keep the token")
        if not tls and not allow_http:
            raise ValueError(f"--address {address} without TLS sends the token and the data in clear text; give "
                             "--ssl-certfile/--ssl-keyfile, or --allow-http to accept that")  # fmt: skip
        warnings.append(f"warning: listening on {address} (--allow-remote): anyone who can reach this host and holds the "
                        f"token can read the dataset{'' if tls else ', and the network can read both (plain HTTP)'}")  # fmt: skip
    if token is None:
        warnings.append("warning: --no-token: every account on this host that can reach the server can read the dataset "
                        "and drive the session")  # fmt: skip
    return warnings


def netloc(host: str, port: int | None) -> str:
    """``host:port`` as a URL and a Host header write it (IPv6 in brackets), lower case."""
    host = f"[{host}]" if ":" in host and not host.startswith("[") else host
    return host.lower() if port is None else f"{host.lower()}:{port}"


def served_hosts(address: str, port: int) -> set[str]:
    """The ``host:port`` names a browser may use for a server on ``address``:``port`` (Host and Origin)."""
    names = {address}
    if is_loopback(address):
        names.update(LOOPBACK_NAMES)
    elif address in ("", "0.0.0.0", "::"):  # every interface: this machine's names and addresses
        names = {socket.gethostname(), socket.getfqdn(), *LOOPBACK_NAMES}
        try:
            names.update(i[4][0] for i in socket.getaddrinfo(socket.gethostname(), None))
        except OSError:
            pass
    return {netloc(n, port) for n in names if n}


def check_origin_value(value: str) -> str:
    """An ``--allow-websocket-origin`` value, HOST or HOST:PORT as the browser's address bar shows it."""
    if not value or any(c in value for c in "*/ ?#@") or value.count(":") > 1 and not value.startswith("["):
        raise ValueError(f"--allow-websocket-origin {value!r}: give HOST or HOST:PORT (no scheme, path or wildcard)")
    return value.lower()


@dataclass(frozen=True)
class Access:
    """The rules for one launch: its token (None: --no-token), the names it answers to, its signing key."""

    token: str | None
    secret_key: bytes  # signs Bokeh session ids and derives the cookie; never leaves the process
    hosts: frozenset[str]
    any_loopback_port: bool = False  # a unix socket: an SSH tunnel's local port is not known here
    secure: bool = False  # served over TLS: the cookie is Secure
    cookie_name: str = "overlapviz-token"

    @functools.cached_property
    def cookie_value(self) -> str:
        # derived, not the token itself: a fixed --token never sits in a browser's cookie jar, and the
        # cookie dies with this launch's key
        return hmac.new(self.secret_key, b"cookie:" + (self.token or "").encode(), hashlib.sha256).hexdigest()

    def set_cookie(self) -> str:
        return (f"{self.cookie_name}={self.cookie_value}; Path=/; HttpOnly; SameSite=Strict"
                + ("; Secure" if self.secure else ""))  # fmt: skip

    def host_allowed(self, netloc: str) -> bool:
        netloc = netloc.lower()
        if netloc in self.hosts:
            return True
        if self.any_loopback_port:
            host = netloc.rsplit(":", 1)[0] if netloc.rsplit(":", 1)[-1].isdigit() and not netloc.endswith("]") else netloc
            return host in LOOPBACK_NAMES
        return False

    def websocket_origins(self) -> set[str]:
        """The same names in Bokeh's allowlist syntax (Bokeh checks the WebSocket Origin again)."""
        extra = {f"{n}:*" for n in LOOPBACK_NAMES} if self.any_loopback_port else set()
        return set(self.hosts) | extra

    def refusal(self, request) -> str | None:
        """Why ``request`` is refused, or None; also takes the token out of the request (logs, session)."""
        presented = _pop_token(request, self.token)
        if _malformed(request.path):  # Tornado's static handler raised on a NUL (500, a traceback in the log)
            return BAD_REQUEST
        if not self.sessions_signed(request):  # said here in one line, before Bokeh logs an error or a traceback
            return "this session id or session token was not issued by this server"
        if not self.host_allowed(request.headers.get("Host", "")):
            return "this server does not answer to that host name (see --allow-websocket-origin)"
        origin = request.headers.get("Origin")
        if origin is not None:
            parts = urlsplit(origin)
            if parts.scheme not in ("http", "https") or not self.host_allowed(parts.netloc):
                return "requests from another origin are refused"
        if self.token is None or request.path in OPEN_PATHS or request.path.startswith(OPEN_PREFIXES):
            return None
        given = [*presented, *_authorization(request)]
        if any(hmac.compare_digest(t.encode(), self.token.encode()) for t in given):
            request.overlapviz_set_cookie = bool(presented)  # the first visit: the cookie keeps in-app links working
            return None
        cookie = request.cookies.get(self.cookie_name)
        if cookie is not None and hmac.compare_digest(cookie.value.encode(), self.cookie_value.encode()):
            return None
        return "this server needs the token it printed at start: open the URL with ?token=... that it printed"


    def sessions_signed(self, request) -> bool:
        """False when ``request`` names a Bokeh session (``bokeh-session-id``, ``bokeh-token``, the
        ``Bokeh-Session-Id`` header, a WebSocket's ``bokeh, TOKEN`` subprotocol) that this launch's
        key did not sign, or that is not a session id or token at all."""
        from bokeh.util.token import check_session_id_signature, check_token_signature

        ids = [v.decode("utf-8", "replace") for v in request.query_arguments.get("bokeh-session-id", [])]
        ids += [request.headers["Bokeh-Session-Id"]] if "Bokeh-Session-Id" in request.headers else []
        tokens = [v.decode("utf-8", "replace") for v in request.query_arguments.get("bokeh-token", [])]
        protocols = [p.strip() for p in request.headers.get("Sec-WebSocket-Protocol", "").split(",")]
        tokens += protocols[1:2] if protocols[0] == "bokeh" else []
        try:
            return (all(check_session_id_signature(i, secret_key=self.secret_key, signed=True) for i in ids)
                    and all(check_token_signature(t, secret_key=self.secret_key, signed=True) for t in tokens))
        except Exception:  # not base64, not JSON, no session_id: not one of ours  # noqa: BLE001
            return False


def _malformed(path: str) -> bool:
    """True for a URL path that no file name matches: not UTF-8 once unquoted, or holding a NUL."""
    try:
        return "\x00" in unquote(path, errors="strict")
    except UnicodeDecodeError:
        return True


def _pop_token(request, token: str | None = None) -> list[str]:
    """Remove the token from the request (URI, query, arguments) and return the values of ``?token=``.

    Removed: every query parameter named ``token`` in any case (``?TOKEN=``, ``?Token=``) and every
    parameter whose value is ``token`` (``?x=<token>``). Only ``?token=`` presents a token. The URI
    is what tornado's access log prints and the arguments go into the Bokeh session token
    embedded in the page: neither may carry the token.
    """
    values = [v.decode("utf-8", "replace") for v in request.query_arguments.get(TOKEN_ARG, [])]
    secret = token.encode() if token else None

    def carries(name: str, value: bytes) -> bool:
        return name.lower() == TOKEN_ARG or (secret is not None and hmac.compare_digest(value, secret))

    if any(carries(k, v) for k, vs in request.query_arguments.items() for v in vs):
        for name in [k for k, vs in request.query_arguments.items() if any(carries(k, v) for v in vs)]:
            kept = [v for v in request.query_arguments.pop(name) if not carries(name, v)]
            request.arguments.pop(name, None)
            if kept:
                request.query_arguments[name] = request.arguments[name] = kept
        pairs = [(k, v) for k, vs in parse_qs_bytes(request.query, keep_blank_values=True).items() for v in vs
                 if not carries(k, v)]  # fmt: skip
        request.query = urlencode(pairs, doseq=False)
        request.uri = request.path + (f"?{request.query}" if request.query else "")
    return values


def redact_logs(secrets_: list[str]) -> None:
    """From now on, no log record of this process carries one of ``secrets_`` (the token, its cookie):
    each is replaced with ``<redacted>`` in the message, whichever logger writes it (the access log,
    Tornado's and Bokeh's warnings, a traceback's text)."""
    secrets_ = [s for s in secrets_ if s]
    if not secrets_:
        return
    previous = logging.getLogRecordFactory()

    def factory(*args, **kwargs):
        record = previous(*args, **kwargs)
        try:
            text = record.getMessage()
        except Exception:  # a malformed record is logging's to report
            return record
        if any(s in text for s in secrets_):
            for s in secrets_:
                text = text.replace(s, "<redacted>")
            record.msg, record.args = text, ()
        return record

    logging.setLogRecordFactory(factory)


def _authorization(request) -> list[str]:
    # scripts: `curl -H "Authorization: token $OVERLAPVIZ_TOKEN"`, as Jupyter accepts
    scheme, _, value = request.headers.get("Authorization", "").partition(" ")
    return [value.strip()] if scheme.lower() in ("token", "bearer") and value.strip() else []


class _Gate(Matcher):
    """Matches the requests to refuse (so the rule placed first sends them to ``Refused``)."""

    def __init__(self, access: Access):
        self.access = access

    def match(self, request):
        reason = self.access.refusal(request)
        return None if reason is None else {"target_kwargs": {"reason": reason}}


class Refused(RequestHandler):
    """403 (400 for a malformed request) with one sentence: nothing of the dataset, for any method, WebSocket
    upgrades included; one line in the access log."""

    def initialize(self, reason: str) -> None:
        self.reason = reason

    def prepare(self) -> None:
        status = 400 if self.reason == BAD_REQUEST else 403
        self.set_status(status)
        self.set_header("Content-Type", "text/plain; charset=utf-8")
        self.set_header("Cache-Control", "no-store")
        self.finish(f"{status} {'Bad Request' if status == 400 else 'Forbidden'}: {self.reason}\n")


class _Headers(OutputTransform):
    """The security headers on every answer, and the cookie on the answer to a valid ?token=."""

    def __init__(self, access: Access, request):
        self.access, self.request = access, request

    def transform_first_chunk(self, status_code, headers, chunk, finishing):
        for name, value in HEADERS.items():
            headers[name] = value
        if getattr(self.request, "overlapviz_set_cookie", False):
            headers.add("Set-Cookie", self.access.set_cookie())
        return status_code, headers, chunk


class OwnComponents(ComponentResourceHandler):
    """Panel's component resources without its ``importlib.import_module`` of whatever module a URL names.

    Panel's handler (panel.io.server.ComponentResourceHandler) imports the first path segment: any
    installed module, run for its import side effects by anyone who can send a request. Here only a
    module the dashboard has already imported, from its own packages, is looked at.
    """

    def parse_url_path(self, path: str) -> str:
        module = path.split("/", 1)[0]
        if module not in sys.modules or module.split(".")[0] not in OWN_PACKAGES:
            raise HTTPError(404)
        return super().parse_url_path(path)


def server_options(secret_key: bytes) -> dict:
    """Keyword arguments for ``pn.serve``/Bokeh's Server: signed session ids and what a session may see."""
    return {
        # Bokeh signs every session id it generates with this launch's key and refuses any other
        # (a guessed or forged ?bokeh-session-id= or WebSocket token): bokeh.util.token
        "sign_sessions": True, "secret_key": secret_key, "generate_session_ids": True,
        # no cookie and no credential header is copied into the session token embedded in the page
        "include_cookies": [], "exclude_headers": ["Cookie", "Authorization"],
        "extra_patterns": [(COMPONENTS_ROUTE, OwnComponents, {})],  # listed before Panel's own, so it wins
    }  # fmt: skip


def install(server, access: Access) -> None:
    """Put the gate in front of every route of ``server`` (a Bokeh Server), the headers on every answer."""
    app = patches.tornado_app(server)
    router = app.default_router
    router.rules.insert(0, router.process_rule(Rule(_Gate(access), Refused)))
    app.add_transform(functools.partial(_Headers, access))
    redact_logs([access.token, access.cookie_value] if access.token else [])
    origins = app.websocket_origins  # Bokeh's own WebSocket Origin check: the same names, real port included
    origins.clear()
    origins.update(access.websocket_origins())


def check_unix_socket_path(path: str) -> Path:
    """A path for ``--unix-socket``: in a directory others cannot replace files in; ValueError else."""
    if not path or path.startswith("\0"):
        raise ValueError("--unix-socket needs a file path (an abstract socket has no owner-only permissions)")
    target = Path(path).absolute()
    parent = target.parent
    try:
        st = parent.stat()
    except OSError as exc:
        raise ValueError(f"--unix-socket {path}: {parent}: {exc.strerror}") from None
    if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
        raise ValueError(f"--unix-socket {path}: {parent} is writable by other accounts (they could replace the socket)")
    return target


def check_own_socket(path: Path) -> None:
    """After binding: the socket file is ours and only we can connect (mode 0600)."""
    st = path.lstat()
    if not stat.S_ISSOCK(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise ValueError(f"--unix-socket {path}: the socket file is not private to this account")


def write_private(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` (one URL) to a new file only its owner can read (0600).

    An existing file is replaced only when it is one this function wrote (a stale URL file of this
    account, mode 0600, one ``http`` line): never a file of the user's.
    """
    path = Path(path)
    try:
        st = path.lstat()
    except FileNotFoundError:
        pass
    else:
        if not (stat.S_ISREG(st.st_mode) and st.st_uid == os.getuid() and st.st_mode & 0o777 == 0o600
                and st.st_size < 4096 and _is_url_file(path)):  # fmt: skip
            raise ValueError(f"{path}: exists; choose another path for the token file")
        path.unlink()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    return path


def _is_url_file(path: Path) -> bool:
    lines = path.read_text(errors="replace").splitlines()
    return len(lines) == 1 and lines[0].startswith(("http://", "https://"))


def open_browser(url: str) -> Path:
    """Open ``url`` through a private redirect file, as Jupyter does: the token never sits in a browser's argv.

    Returns the file's folder (0700), for the caller to remove when the server stops.
    """
    folder = Path(tempfile.mkdtemp(prefix="overlapviz-"))
    page = write_private(folder / "open.html", f'<meta http-equiv="refresh" content="0;url={url}">\n')
    webbrowser.open(page.as_uri())
    return folder
