"""Soak the dashboard server on loopback: concurrent Bokeh client sessions switching pages and zooming the timeline.

Not a test: it starts ``overlapviz serve DATASET --port 0`` (with a token, as a user would), runs
``--clients`` real Bokeh WebSocket clients for ``--minutes`` — each fetches the page with the token,
opens the session with the signed session token from it, pulls the document, then switches pages
and zooms the Timeline (a ``rangesupdate`` event, as BokehJS sends on a wheel zoom) and opens a
new session every ``--actions`` actions — and reports requests served, errors and the server's
memory (RSS) at start, after warm-up, at the end and once the closed sessions have expired.

    .venv/bin/python -m overlapviz.dashboards.soak --kernels 1000000 --work /tmp/ovz-bench --clients 12 --minutes 5
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import re
import secrets
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

PAGES = ("Overview", "Timeline", "Why late", "Collectives", "Residency", "Compare")  # as dashboards.app (not imported: no Panel here)
EXPIRY_WAIT_S = 50  # Bokeh drops a closed session after 15 s unused, checked every 17 s


class Stats:
    """Counters shared by the client threads."""

    def __init__(self):
        self.lock = threading.Lock()
        self.pages = self.sessions = self.actions = self.patches = 0
        self.unanswered = {"switch": 0, "zoom": 0}  # no patch from the server within 60 s
        self.errors: list[str] = []
        self.latency_s: dict[str, list[float]] = {"switch": [], "zoom": []}

    def add(self, **counts) -> None:
        with self.lock:
            for name, n in counts.items():
                setattr(self, name, getattr(self, name) + n)


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("VmRSS:")) / 1024


def big_dataset(work: Path, n: int) -> Path:
    """A generated trace of ``n`` kernels, ingested once into ``work`` (as benchmarks/bench_dashboard.py)."""
    from overlapviz.ingest import ingest
    from overlapviz.testing import generate_trace, write_trace

    out = work / f"generated-{n}"
    if not (out / "dataset.json").exists():
        trace = write_trace(generate_trace(n, rank=0, world_size=1, seed=0), work / f"generated-{n}.json.gz")
        ingest([str(trace)], out, overwrite=True)
    return out


def client(index: int, base: str, token: str, deadline: float, actions: int, stats: Stats) -> None:
    """One user: sessions one after another until ``deadline``, ``actions`` page switches or zooms each."""
    asyncio.set_event_loop(asyncio.new_event_loop())
    rng = random.Random(index)
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{base}?token={token}", timeout=300) as resp:
                page = resp.read().decode()
            stats.add(pages=1)
            _Session(re.search(r'"token":\s*"([^"]+)"', page).group(1), base, token, stats).play(rng, actions, deadline)
        except Exception as exc:  # noqa: BLE001  counted and reported; the user carries on with a new session
            with stats.lock:
                stats.errors.append(f"client {index}: {type(exc).__name__}: {exc}"[:300])
            time.sleep(1)


class _Session:
    """One Bokeh session driven as BokehJS would, over the WebSocket the page's signed session token opens."""

    def __init__(self, signed: str, base: str, token: str, stats: Stats):
        from bokeh.client.session import ClientSession
        from bokeh.util.token import get_session_id
        from tornado.ioloop import IOLoop

        class Client(ClientSession):  # the signed session token the page embeds, not one of our own making
            @property
            def token(self) -> str:
                return signed

        self.loop, self.stats = IOLoop.current(), stats
        self.client = Client(get_session_id(signed), websocket_url=base.replace("http", "ws", 1) + "ws", io_loop=self.loop,
                             arguments={"token": token}, max_message_size=512 * 1024 * 1024)  # fmt: skip
        self.conn = self.client._connection
        self.inbox: asyncio.Queue = asyncio.Queue()

    def play(self, rng: random.Random, actions: int, deadline: float) -> None:
        from bokeh.models import Plot

        try:
            self.client.pull()
            self.stats.add(sessions=1)
            reader = self.loop.asyncio_loop.create_task(self._read())
            self._send("document_ready")  # Panel holds the session's updates until the page says it is rendered
            self.loop.run_sync(lambda: self._pump(5))
            doc = self.client.document
            tabs = next(m for m in doc.models if type(m).__name__ == "Tabs")
            timeline_tab = PAGES.index("Timeline")
            for _ in range(actions):
                if time.monotonic() >= deadline:
                    break
                timeline = [m for m in doc.models if isinstance(m, Plot) and m.title is not None
                            and str(m.title.text).startswith("Timeline of")]  # fmt: skip
                t0 = time.monotonic()
                if tabs.active == timeline_tab and timeline and rng.random() < 0.75:
                    plot = timeline[0]
                    x0, x1 = plot.x_range.start, plot.x_range.end
                    if x0 is None or x1 is None or not x1 > x0:
                        continue
                    a = x0 + (x1 - x0) * rng.uniform(0, 0.6)
                    b = a + (x1 - a) * rng.uniform(0.05, 1)
                    plot.x_range.start, plot.x_range.end = a, b  # as a wheel zoom does, then its event
                    self._send("rangesupdate", model={"id": plot.id}, x0=a, x1=b, y0=plot.y_range.start, y1=plot.y_range.end)
                    self._settle("zoom", t0)
                else:
                    others = [i for i in range(len(PAGES)) if i != tabs.active]  # half the switches go to the Timeline
                    tabs.active = timeline_tab if timeline_tab in others and rng.random() < 0.5 else rng.choice(others)
                    self._settle("switch", t0)
            reader.cancel()
        finally:
            self.client.close()
            self.loop.run_sync(lambda: asyncio.sleep(0.1))

    def _send(self, name: str, **values) -> None:
        # a Bokeh UI event as BokehJS writes it (Python's RangesUpdate would drop x0..y1 and inline the plot)
        from bokeh.document.events import MessageSentEvent

        class Sent(MessageSentEvent):
            def to_serializable(self, serializer):
                return {"kind": "MessageSent", "msg_type": "bokeh_event", "msg_data": event}

        event = {"type": "event", "name": name, "values": {"type": "map", "entries": [[k, v] for k, v in values.items()]}}
        message = self.conn._protocol.create("PATCH-DOC", [Sent(self.client.document, "bokeh_event", None)])
        self.loop.run_sync(lambda: self.conn.send_message(message))

    async def _read(self) -> None:
        # one reader for the session's lifetime: a read cancelled by a timeout could drop a fragment of a
        # multi-part Bokeh message (and Bokeh's synchronous client drops the patches that arrive while it
        # waits for a reply), so the socket is read here, into a queue
        while (message := await self.conn._pop_message()) is not None:
            await self.inbox.put(message)
        await self.inbox.put(None)

    async def _pump(self, first_s: float, quiet_s: float = 2.0, limit_s: float = 300) -> tuple[int, float | None]:
        # apply the server's patches: the first within first_s, then until none comes for quiet_s;
        # returns how many, and when the first came
        n, t0, first = 0, time.monotonic(), None
        while time.monotonic() - t0 < limit_s:
            try:
                message = await asyncio.wait_for(self.inbox.get(), quiet_s if n else first_s)
            except TimeoutError:
                break
            if message is None:
                raise RuntimeError(f"disconnected: {self.conn.error_detail or self.conn.error_reason}")
            if message.msgtype == "PATCH-DOC":
                self.client._handle_patch(message)
                n, first = n + 1, first or time.monotonic()
            elif message.msgtype == "ERROR":
                raise RuntimeError(f"server error: {message.content.get('text')}")
        return n, first

    def _settle(self, kind: str, t0: float) -> None:
        n, first = self.loop.run_sync(lambda: self._pump(60))
        self.stats.add(actions=1, patches=n)
        with self.stats.lock:
            if n == 0:
                self.stats.unanswered[kind] += 1
            else:
                self.stats.latency_s[kind].append(first - t0)


def soak(dataset: Path, *, clients: int, minutes: float, actions: int = 20, warmup_s: float = 60,
         expiry_wait_s: float = EXPIRY_WAIT_S) -> dict:  # fmt: skip
    """Run the soak (see the module docstring) and return its report."""
    from overlapviz.dashboards import app  # noqa: F401  the clients' documents need every model the server's have

    token = secrets.token_urlsafe(32)
    log = Path(os.environ.get("TMPDIR", "/tmp")) / f"overlapviz-soak-{os.getpid()}.log"
    with open(log, "wb") as fh:
        proc = subprocess.Popen([sys.executable, "-c", "from overlapviz.cli import main; main()", "serve", str(dataset),
                                 "--port", "0"], stdout=fh, stderr=subprocess.STDOUT,
                                env={**os.environ, "OVERLAPVIZ_TOKEN": token})  # fmt: skip
    try:
        while not (found := re.search(r"at (http://\S+/)\?token=", log.read_text(errors="replace"))):
            if proc.poll() is not None:
                raise SystemExit(f"server did not start:\n{log.read_text()[-3000:]}")
            time.sleep(0.2)
        base = found.group(1)
        memory = [(0.0, rss_mb(proc.pid))]
        stats, t_start = Stats(), time.monotonic()
        deadline = t_start + minutes * 60
        threads = [threading.Thread(target=client, args=(i, base, token, deadline, actions, stats), daemon=True)
                   for i in range(clients)]  # fmt: skip
        for t in threads:
            t.start()
        while any(t.is_alive() for t in threads):
            time.sleep(5)
            memory.append((time.monotonic() - t_start, rss_mb(proc.pid)))
        t_end = time.monotonic() - t_start
        time.sleep(expiry_wait_s)
        memory.append((time.monotonic() - t_start, rss_mb(proc.pid)))
        server_log = log.read_text(errors="replace")
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.unlink(missing_ok=True)
    after_warmup = next((mb for t, mb in memory if t >= warmup_s), memory[-1][1])
    during = [mb for t, mb in memory if t <= t_end]
    return {
        "clients": clients, "minutes": round(t_end / 60, 2), "page_loads": stats.pages, "sessions": stats.sessions,
        "actions": stats.actions, "unanswered": stats.unanswered, "server_patches_received": stats.patches,
        # seconds from a page switch / zoom to the server's first patch in answer (median, 95th percentile)
        "switch_answer_s_median": _median(stats.latency_s["switch"]), "switch_answer_s_p95": _p95(stats.latency_s["switch"]),
        "zoom_answer_s_median": _median(stats.latency_s["zoom"]), "zoom_answer_s_p95": _p95(stats.latency_s["zoom"]),
        "n_switches": len(stats.latency_s["switch"]), "n_zooms": len(stats.latency_s["zoom"]),
        "client_errors": len(stats.errors), "client_error_samples": stats.errors[:5],
        "server_log_errors": len(re.findall(r"^(?:ERROR|Traceback)", server_log, re.MULTILINE)),
        "server_error_samples": re.findall(r"^ERROR.*$", server_log, re.MULTILINE)[:5],
        "rss_mb_start": round(memory[0][1]), "rss_mb_after_warmup": round(after_warmup),
        "rss_mb_max": round(max(during)), "rss_mb_end": round(during[-1]),
        "rss_mb_after_expiry": round(memory[-1][1]),
        "rss_mb_every_minute": [round(mb) for t, mb in memory if t % 60 < 5],
    }  # fmt: skip


def _median(xs):
    return round(statistics.median(xs), 2) if xs else None


def _p95(xs):
    return round(sorted(xs)[math.ceil(0.95 * (len(xs) - 1))], 2) if xs else None


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dataset", nargs="?", type=Path, help="a dataset (default: generate --kernels into --work)")
    parser.add_argument("--kernels", type=int, default=1_000_000)
    parser.add_argument("--work", type=Path, default=Path("/tmp/ovz-bench"))
    parser.add_argument("--clients", type=int, default=12)
    parser.add_argument("--minutes", type=float, default=5.0)
    parser.add_argument("--actions", type=int, default=20, help="page switches / zooms per session")
    parser.add_argument("--warmup", type=float, default=60.0, help="seconds before the warm RSS is read")
    parser.add_argument("--json", type=Path, help="also write the report here")
    args = parser.parse_args(argv)
    dataset = args.dataset
    if dataset is None:
        args.work.mkdir(parents=True, exist_ok=True)
        dataset = big_dataset(args.work, args.kernels)
    report = soak(dataset, clients=args.clients, minutes=args.minutes, actions=args.actions, warmup_s=args.warmup)
    text = json.dumps(report, indent=1)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
