"""An independent computation of DESIGN.md's overlap metrics straight from raw Kineto JSON.

Deliberately shares nothing with overlapviz: the standard ``json`` module with exact
``Decimal`` parsing of ``ts``/``dur`` (µs with ns decimals -> int ns, no float), the
DESIGN.md classification written out again, and a plain Python event sweep (counters
per kind over sorted boundaries) instead of interval merging. Slow, simple, obviously
right; used by ``bench_ingest.py`` and by the tests as the yardstick.

GPU side: activities are ``kernel`` / ``gpu_memcpy`` / ``gpu_memset`` events (``ph: X``);
comm = a kernel whose name matches ``nccl|rccl|msccl|ovz_comm|ep::(intra|inter)node(_ll)?::`` (case-insensitive),
memory = memcpy/memset, compute = every other kernel. CPU-only traces (no GPU activity):
``gloo:*`` ranges are comm and the top-level ``cpu_op``s of the main thread are compute
(except ``c10d::*``, ``record_param_comms``, ``ProfilerStep#*``, which are neither).
"""

from __future__ import annotations

import gzip
import json
import re
from decimal import Decimal
from pathlib import Path

from overlapviz.testing import reference_metrics

COMM_RE = re.compile(r"nccl|rccl|msccl|ovz_comm|ep::(?:intra|inter)node(?:_ll)?::", re.IGNORECASE)
GPU_CATS = {"kernel": "kernel", "Kernel": "kernel", "gpu_memcpy": "memory", "Memcpy": "memory",
            "gpu_memset": "memory", "Memset": "memory"}  # fmt: skip
HOST_NOT_COMPUTE = re.compile(r"^c10d::|^record_param_comms$|ProcessGroup|^ProfilerStep#")


def load(path: str | Path) -> dict:
    raw = Path(path).read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    return json.loads(raw, parse_float=Decimal)


def ns(v) -> int:
    """Kineto µs (int or Decimal with <= 3 decimals) -> int ns, exactly."""
    scaled = Decimal(v) * 1000
    if scaled != scaled.to_integral_value():
        raise ValueError(f"{v} µs is not a whole number of ns")
    return int(scaled)


def activities(doc: dict) -> list[tuple[str, int, int]]:
    """``(kind, start_ns, end_ns)`` of every activity of one rank's trace."""
    events = [e for e in doc.get("traceEvents", []) if isinstance(e, dict) and e.get("ph") == "X"]
    out = []
    for e in events:
        cat = GPU_CATS.get(e.get("cat"))
        if cat is None:
            continue
        kind = "memory" if cat == "memory" else ("comm" if COMM_RE.search(e.get("name", "")) else "compute")
        s = ns(e["ts"])
        out.append((kind, s, s + ns(e["dur"])))
    if out:
        return out
    return _host_activities(events)


def _host_activities(events: list[dict]) -> list[tuple[str, int, int]]:
    """CPU-only trace: gloo ranges are comm, the main thread's top-level cpu_ops compute."""
    steps = [e for e in events if str(e.get("name", "")).startswith("ProfilerStep#")]
    main = (steps[0]["pid"], steps[0]["tid"]) if steps else None
    out = []
    ops = []
    for e in events:
        name = str(e.get("name", ""))
        s = ns(e["ts"])
        end = s + ns(e["dur"])
        if e.get("cat") in ("user_annotation", "cpu_op") and name.startswith("gloo:"):
            out.append(("comm", s, end))
        elif e.get("cat") == "cpu_op" and (main is None or (e["pid"], e["tid"]) == main):
            ops.append((s, -end, name))
    # top level: not inside an earlier-starting op of the same thread
    ops.sort()
    reach = None
    for s, neg_end, name in ops:
        end = -neg_end
        if reach is not None and s < reach and end <= reach:
            continue
        reach = end if reach is None else max(reach, end)
        if not HOST_NOT_COMPUTE.search(name):
            out.append(("compute", s, end))
        else:
            out.append(("other", s, end))
    return out


def metrics(acts: list[tuple[str, int, int]]) -> dict:
    """DESIGN.md's metrics of one rank (µs, from exact ns): the tests' one reference computation."""
    return reference_metrics(acts)


def trace_dir_metrics(files: list[str | Path]) -> dict[int, dict]:
    """Per rank (``distributedInfo.rank``, else file order) metrics of a set of trace files."""
    out = {}
    for i, f in enumerate(sorted(files)):
        doc = load(f)
        rank = (doc.get("distributedInfo") or {}).get("rank", i)
        out[int(rank)] = metrics(activities(doc))
    return out


# --- HTA's own rules, to compare HTA like with like ---------------------------------------

HTA_COMM_RE = re.compile(r"^nccl.*Kernel")
HTA_NOT_COMPUTE_RE = re.compile(r"(^nccl.*Kernel)|(.*(Memcpy)|(Memset))|(.*Sync)")
HTA_MEMORY_RE = re.compile(r"(^Memcpy)|(^Memset)|(^dma)")


def hta_rules_fraction(doc: dict, *, round_to_us: bool = True) -> float | None:
    """HTA 0.5's ``get_comm_comp_overlap`` ratio of one rank, re-derived from its documented rules.

    What HTA does differently from DESIGN.md (read from hta/common/trace.py,
    hta/utils/utils.py and hta/analyzers/communication_analysis.py, v0.5.0):

    - with two or more ``ProfilerStep`` ranges, it keeps only GPU activities whose
      correlation id matches a host event that starts before the last ProfilerStep starts
      (``include_last_profiler_step=False``): the last step and un-launched kernels drop out;
    - comm = kernel name matching ``^nccl.*Kernel`` (not ``rccl``/``msccl``, not anywhere in
      the name); names matching ``.*Sync`` are neither comm nor compute; memory =
      ``^Memcpy|^Memset|^dma`` by name; every GPU event with a stream counts;
    - ns-resolution (float) timestamps are rounded to whole µs: start up, end down.
    """
    events = [e for e in doc.get("traceEvents", []) if isinstance(e, dict) and e.get("ph") == "X"]
    gpu = [e for e in events if isinstance(e.get("args"), dict) and "stream" in e["args"] and e.get("cat") != "Trace"]
    host = [e for e in events if not (isinstance(e.get("args"), dict) and "stream" in e["args"])]
    step_names = {e["name"] for e in host if "ProfilerStep" in str(e.get("name", ""))}
    if len(step_names) >= 2:
        last = max(Decimal(e["ts"]) for e in host if e.get("name") in step_names)
        launched = {
            e["args"]["correlation"]
            for e in host
            if isinstance(e.get("args"), dict) and "correlation" in e["args"] and Decimal(e["ts"]) < last
        }
        gpu = [e for e in gpu if e["args"].get("correlation") in launched]
    acts = []
    for e in gpu:
        name = str(e.get("name", ""))
        if HTA_COMM_RE.match(name):
            kind = "comm"
        elif HTA_MEMORY_RE.match(name):
            kind = "memory"
        elif not HTA_NOT_COMPUTE_RE.match(name):
            kind = "compute"
        else:
            continue
        ts, end = Decimal(e["ts"]), Decimal(e["ts"]) + Decimal(e["dur"])
        if round_to_us and (ts != ts.to_integral_value() or end != end.to_integral_value()):
            ts, end = ts.to_integral_value(rounding="ROUND_CEILING"), end.to_integral_value(rounding="ROUND_FLOOR")
        acts.append((kind, ns(ts), ns(end)))
    return reference_metrics(acts)["overlap_fraction"]


# --- per step ------------------------------------------------------------------------------

RUNTIME_CATS = {"cuda_runtime", "Runtime", "cuda_driver", "Driver"}
STEP_RE = re.compile(r"^ProfilerStep#(\d+)$")


def step_metrics(doc: dict) -> dict[int, dict]:
    """DESIGN.md's metrics per profiler step of one rank.

    A GPU activity belongs to the ``ProfilerStep#N`` whose host range ``[ts, ts + dur)``
    contains the start of its launch call (the runtime/driver event with the same
    correlation id; the earliest when several); where steps nest, the latest-starting
    one. A host stand-in (CPU-only trace) is its own launch. Activities with no launch or
    outside every step belong to no step and are left out.
    """
    events = [e for e in doc.get("traceEvents", []) if isinstance(e, dict) and e.get("ph") == "X"]
    steps = sorted(
        (ns(e["ts"]), ns(e["ts"]) + ns(e["dur"]), int(m.group(1)))
        for e in events
        if (m := STEP_RE.match(str(e.get("name", ""))))
    )
    launch: dict = {}
    for e in events:
        if e.get("cat") in RUNTIME_CATS and isinstance(e.get("args"), dict) and "correlation" in e["args"]:
            c, t = e["args"]["correlation"], ns(e["ts"])
            launch[c] = min(t, launch.get(c, t))
    gpu = [e for e in events if e.get("cat") in GPU_CATS]

    def step_of(t):
        found = None
        for s, end, n in steps:  # sorted by start: the last match is the latest-starting
            if s <= t < end:
                found = n
        return found

    per: dict[int, list] = {}
    if gpu:
        for e, act in zip(gpu, activities(doc)):
            c = (e.get("args") or {}).get("correlation")
            t = launch.get(c) if c is not None else None
            n = step_of(t) if t is not None else None
            if n is not None:
                per.setdefault(n, []).append(act)
    else:
        for act in _host_activities(events):
            n = step_of(act[1])
            if n is not None:
                per.setdefault(n, []).append(act)
    return {n: metrics(acts) for n, acts in sorted(per.items())}
