"""``overlapviz serve --scheduler local:2``: the server starts its LocalCluster, answers, and leaves no process behind when stopped."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("distributed")
psutil = pytest.importorskip("psutil")

from overlapviz.ingest import ingest
from overlapviz.testing import generate_trace, write_trace


@pytest.mark.slow
def test_serve_with_a_local_cluster_stops_it_with_the_server(tmp_path):
    traces = tmp_path / "job"
    traces.mkdir()
    for rank in range(2):
        write_trace(generate_trace(500, rank=rank, world_size=2, seed=3), traces / f"rank{rank}.json.gz")
    dataset = ingest([traces], tmp_path / "ds", progress=False)
    url_file = tmp_path / "url"
    env = dict(os.environ, OVERLAPVIZ_TABLE_CACHE="0")
    env.pop("OVERLAPVIZ_SCHEDULER", None)
    server = subprocess.Popen([sys.executable, "-m", "overlapviz", "serve", str(dataset), "--port", "0", "--scheduler", "local:2",
                               "--token-file", str(url_file)], stderr=subprocess.PIPE, text=True, env=env)  # fmt: skip
    try:
        banner = ""
        deadline = time.monotonic() + 120
        while "Ctrl-C to stop" not in banner and time.monotonic() < deadline and server.poll() is None:
            banner += server.stderr.readline()
        assert "Ctrl-C to stop" in banner, banner
        children = psutil.Process(server.pid).children(recursive=True)
        assert len(children) >= 2  # the cluster's worker processes (and their nannies) belong to the server
        url = url_file.read_text().strip()
        with urllib.request.urlopen(url, timeout=60) as resp:
            assert resp.status == 200 and "overlapviz" in resp.read().decode("utf-8", "replace")
        server.send_signal(signal.SIGTERM)  # a batch job's end
        rest = server.communicate(timeout=90)[1]
        assert server.returncode == 0, banner + rest
        gone, alive = psutil.wait_procs(children, timeout=30)
        assert not alive, [p.pid for p in alive]
        assert not url_file.exists()
        assert not re.search(r"Traceback|leaked", rest), rest
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()

