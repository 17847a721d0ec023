"""overlapviz.testing: the trace builders other tests and the benchmark rely on."""

from __future__ import annotations

import gzip
import json
from decimal import Decimal

import numpy as np

from overlapviz.testing import (
    A100_PROPERTIES,
    generate_trace,
    kernel_event,
    kineto_trace,
    runtime_event,
    step_event,
    write_trace,
)


def _ns(us) -> int:
    return int(Decimal(repr(us)) * 1000)


def test_builders_write_kineto_shapes(tmp_path):
    doc = kineto_trace(
        runtime_event(3, 1_000_000), [kernel_event("k", 1_010_123, 2_001, correlation=3, grid=(4, 2, 1))],
        step_event(5, 0, 9_000_000), rank=1, world_size=4,
    )
    assert doc["distributedInfo"] == {"backend": "nccl", "rank": 1, "world_size": 4}
    assert doc["deviceProperties"] == [A100_PROPERTIES]
    k = doc["traceEvents"][1]
    assert (k["cat"], k["ts"], k["dur"], k["args"]["grid"], k["args"]["correlation"]) == ("kernel", 1010.123, 2.001, [4, 2, 1], 3)
    assert doc["traceEvents"][2]["name"] == "ProfilerStep#5"
    assert "distributedInfo" not in kineto_trace(rank=None) and kineto_trace(device_properties=[])["deviceProperties"] == []
    for name, opener in (("t.json.gz", gzip.open), ("t.json", open)):
        p = write_trace(doc, tmp_path / name, pretty=True)
        with opener(p, "rt") as fh:
            assert json.load(fh) == doc
    assert b"\n" not in write_trace(doc, tmp_path / "c.json").read_bytes()


def test_generate_trace_is_realistic_and_deterministic():
    n, every = 5_000, 8
    doc = generate_trace(n, rank=2, world_size=4, seed=7, comm_every=every, n_steps=6)
    assert doc == generate_trace(n, rank=2, world_size=4, seed=7, comm_every=every, n_steps=6)
    assert doc != generate_trace(n, rank=3, world_size=4, seed=7, comm_every=every, n_steps=6)
    ev = doc["traceEvents"]
    assert len(ev) == 2 * n + 6 and doc["distributedInfo"]["rank"] == 2
    kernels = [e for e in ev if e["cat"] == "kernel"]
    launches = {e["args"]["correlation"]: e for e in ev if e["cat"] == "cuda_runtime"}
    steps = sorted((_ns(e["ts"]), _ns(e["ts"]) + _ns(e["dur"])) for e in ev if e["name"].startswith("ProfilerStep#"))
    assert len(kernels) == n and len(launches) == n and len(steps) == 6
    comm = [e for e in kernels if "nccl" in e["name"]]
    assert len(comm) == n // every and {e["tid"] for e in comm} == {20}
    for stream in (7, 20):
        s = sorted((_ns(e["ts"]), _ns(e["ts"]) + _ns(e["dur"])) for e in kernels if e["tid"] == stream)
        starts, ends = np.array([a for a, _ in s]), np.array([b for _, b in s])
        assert (starts[1:] >= ends[:-1]).all()  # one kernel at a time per stream
    for e in kernels:
        launch = launches[e["args"]["correlation"]]
        assert _ns(launch["ts"]) + _ns(launch["dur"]) < _ns(e["ts"])
        assert sum(a <= _ns(launch["ts"]) < b for a, b in steps) == 1  # every launch in exactly one step
    assert all(steps[i][1] < steps[i + 1][0] for i in range(len(steps) - 1))
    # µs with at most three decimals: exact ns survive the float round trip
    assert all(abs(e["ts"] * 1000 - round(e["ts"] * 1000)) < 1e-3 for e in kernels[:500])
