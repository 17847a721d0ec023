"""The `overlapviz serve` subprocess the server tests start (test_serve_security, test_browser_auth), its banner and dataset."""

from __future__ import annotations
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
import pytest
from overlapviz.testing import write_grid_dataset


BANNER = re.compile(r"overlapviz dashboard for .* (?:at|then open) (https?://\S+)")


class Served:
    """A ``overlapviz serve`` subprocess and what its banner said."""

    def __init__(self, proc, log: Path, url: str):
        self.proc, self.log, self.url = proc, log, url
        parts = re.match(r"(https?)://(\[[^\]]+\]|[^:/]+):(\d+)/(?:\?token=(\S+))?", url)
        self.scheme, self.host, self.port, self.token = parts.group(1), parts.group(2), int(parts.group(3)), parts.group(4)
        self.tls_context = None  # set for an HTTPS server: the context trusting its certificate
        self.netloc = f"{self.host}:{self.port}"

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)  # as Ctrl-C: the server cleans up (socket, token file)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=20)
        return self.proc.returncode


def start_server(dataset, *args: str, log: Path, env: dict | None = None, banner: re.Pattern = BANNER) -> Served:
    """Start ``overlapviz serve DATASET ARGS`` and wait for its banner (the URL it prints)."""
    with open(log, "wb") as fh:
        proc = subprocess.Popen([sys.executable, "-c", "from overlapviz.cli import main; main()", "serve", str(dataset), *args],
                                stdout=fh, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})  # fmt: skip
    deadline = time.monotonic() + 120
    while True:
        found = banner.search(log.read_text(errors="replace"))
        if found:
            return Served(proc, log, found.group(1))
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"server did not start: {log.read_text(errors='replace')[-3000:]}")
        time.sleep(0.2)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return write_grid_dataset(tmp_path_factory.mktemp("sec") / "ds")

