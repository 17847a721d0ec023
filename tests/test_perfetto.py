"""`overlapviz export --format perfetto`: the run's timeline and the findings as a Chrome/Perfetto trace, re-read by an independent parser."""

from __future__ import annotations

import gzip
import json
from collections import defaultdict
from decimal import Decimal

from click.testing import CliRunner

from overlapviz.dataset import schema
from overlapviz.analysis.explain import explain
from overlapviz.cli import main
from overlapviz.testing import kernel_row as _k
from overlapviz.testing import sync_row
from overlapviz.testing import write_rows_dataset as _dataset

COMM = dict(block=512, regs=32, smem=0, grid=8)
DEP = [
    _k("grad_kernel", "compute", 7, 110_000, 300_000, launch=100_000, grid=4096, corr=900),
    _k("ncclDevKernel_AllReduce", "comm", 20, 305_000, 306_000, launch=103_000, corr=903, **COMM),
]
RECORD, WAIT = sync_row("event_record", 101_000, corr=901), sync_row("stream_wait_event", 102_000, corr=902)


def _read(path):
    raw = path.read_bytes()
    return json.loads(gzip.decompress(raw) if path.suffix == ".gz" else raw, parse_float=Decimal, parse_int=Decimal)


def _ns(us: Decimal) -> int:
    return int(us * 1000)


def test_export_holds_every_kernel_exactly_and_the_why(tmp_path):
    kernels = DEP + [_k("gemm_full", "compute", 8, 400_000, 500_000, launch=399_000, grid=4096, corr=950),
                     _k("ncclDevKernel_Blocked", "comm", 20, 480_000, 481_000, launch=401_000, corr=951, **COMM)]  # fmt: skip
    ds = _dataset(tmp_path / "ds", kernels, [RECORD, WAIT])
    out = tmp_path / "run.json.gz"
    res = CliRunner().invoke(main, ["export", str(ds), "--format", "perfetto", "-o", str(out)])
    assert res.exit_code == 0, res.output
    doc = _read(out)
    base = int(doc["otherData"]["base_ns"])
    ev = doc["traceEvents"]
    k = schema.read_frame(ds, "kernels")
    slices = [e for e in ev if e["ph"] == "X" and e["cat"] not in ("why", "finding", "exposed")]
    assert len(slices) == len(k)
    got = sorted((e["name"], _ns(e["ts"]) + base, _ns(e["ts"]) + _ns(e["dur"]) + base) for e in slices)
    assert got == sorted(zip(k["name"], k["start_ns"].astype(int), k["end_ns"].astype(int)))  # exact, no float
    why = explain(ds).set_index("name")
    waits = {e["args"]["kernel"]: e for e in ev if e["ph"] == "X" and e["name"].startswith("wait: ")}
    assert set(waits) == set(why.index)
    for name, e in waits.items():
        assert e["args"]["cause"] == why.loc[name, "cause"] and e["name"] == f"wait: {why.loc[name, 'cause']}"
        assert _ns(e["ts"]) + base == why.loc[name, "launch_ns"] and _ns(e["dur"]) == why.loc[name, "start_minus_launch_ns"]
    assert waits["ncclDevKernel_Blocked"]["args"]["blocker"] == "gemm_full"
    # one arrow per dependency or SM block: from the producer / blocker to the collective
    flows = defaultdict(dict)
    for e in ev:
        if e["ph"] in ("s", "f") and e["cat"] == "why":
            flows[e["id"]][e["ph"]] = e
    assert len(flows) == 2 and all(set(f) == {"s", "f"} for f in flows.values())
    ends = sorted(_ns(f["f"]["ts"]) + base for f in flows.values())
    assert ends == sorted(int(why.loc[n, "start_ns"]) for n in ("ncclDevKernel_AllReduce", "ncclDevKernel_Blocked"))
    # slices on one thread nest (Perfetto draws only properly nested slices)
    by_thread = defaultdict(list)
    for e in ev:
        if e["ph"] == "X":
            by_thread[(e["pid"], e["tid"])].append((_ns(e["ts"]), _ns(e["ts"]) + _ns(e["dur"])))
    for spans in by_thread.values():
        stack = []
        for a, b in sorted(spans, key=lambda s: (s[0], -s[1])):
            while stack and stack[-1] <= a:
                stack.pop()
            assert not stack or b <= stack[-1], spans
            stack.append(b)
    assert {e["name"] for e in ev if e["ph"] == "C"} == {"overlap_fraction", "exposed_comm_us"}


def test_export_perfetto_refuses_what_it_cannot_do(tmp_path):
    ds = _dataset(tmp_path / "ds", DEP, [RECORD, WAIT])
    runner = CliRunner()
    bad = runner.invoke(main, ["export", str(ds), "--format", "perfetto", "--run", "nope", "-o", str(tmp_path / "x.json")])
    assert bad.exit_code == 1 and "no run 'nope'" in bad.output and not (tmp_path / "x.json").exists()
    two = runner.invoke(main, ["export", str(ds), "--format", "perfetto", "--run", "r", "--run", "r", "-o", str(tmp_path / "y.json")])
    assert two.exit_code == 1 and "one run" in two.output


def test_the_answer_is_in_the_trace_with_its_evidence_linked(tmp_path):
    """DLRM's 8 ranks: a findings process with the findings in order, each rank's exposed communication by part
    summing exactly to the breakdown's, and an arrow from each waiting rank's kernel to the straggler's."""
    from pathlib import Path

    from overlapviz.analysis.breakdown import breakdown
    from overlapviz.analysis.findings import findings
    from overlapviz.ingest import ingest

    ds = ingest([Path(__file__).parent / "data" / "kineto_real" / "param_dlrm_8rank"], tmp_path / "ds", progress=False)
    out = tmp_path / "run.json.gz"
    res = CliRunner().invoke(main, ["export", str(ds), "--format", "perfetto", "-o", str(out)])
    assert res.exit_code == 0, res.output
    ev = _read(out)["traceEvents"]
    found = findings(ds)
    slices = [e for e in ev if e.get("cat") == "finding"]
    assert [s["args"]["kind"] for s in slices] == list(found["kind"])
    assert [s["args"]["text"] for s in slices] == list(found["text"]) and _ns(slices[0]["args"]["time_us"]) == found["time_ns"][0]
    parts = defaultdict(int)
    names = {"peer wait": "peer_wait_ns", "dependent": "dependent_ns", "host idle": "host_idle_ns", "other": "exposed_other_ns"}
    for e in ev:
        if e.get("cat") == "exposed" and e["ph"] == "X":
            parts[(int(e["pid"]), names[e["name"]])] += _ns(e["dur"])
    for row in breakdown(ds).to_dict("records"):
        for col in names.values():
            assert parts[(row["rank"], col)] == row[col], (row["rank"], col)
    waited = [e for e in ev if e.get("name", "").startswith("waited for") and e["ph"] == "f"]
    assert len(waited) == 8 * 7 and sum(e["name"] == "waited for rank 7" for e in waited) == 5 * 7
