"""A run's timeline and overlapviz's findings as a trace Perfetto (ui.perfetto.dev, trace_processor) and chrome://tracing open.

The Chrome trace-event JSON format, which Perfetto imports natively:

* one process per rank (``rank N``), one thread per stream (``stream S``): every GPU activity
  as a complete slice (``ph: "X"``) with its kind, correlation, grid, block, registers and
  shared memory in ``args``;
* per rank a ``why: comm waits`` thread (more lanes where waits overlap): each communication
  kernel's wait from its launch to its start as a slice named after its cause, carrying
  ``cause``, ``blocker``, ``blocking_resource``, ``comm_blocks_fit_per_sm``, ``free_sms``,
  ``dependency_source``, ``producer``, ``start_delay_us`` and ``peer_wait_us``, with child slices
  for its parts (stream order, dependency, ready -> start);
* flow arrows (``ph: "s"`` / ``"f"``) to the communication kernel from what held it back: the
  producer of the event its stream waited on (cause ``dependency``) or the computation kernel that
  held the SMs (cause ``sm_resources``);
* per rank counters ``overlap_fraction`` and ``exposed_comm_us``, one value per step (the whole
  trace where the run has no steps);
* the answer: a ``findings`` process whose ``finding N`` threads hold one slice each, the run's
  findings largest first (``kind``, ``time_us``, ``text``, ``action``, ``evidence``), spanning the
  instants they account for; and per rank an ``exposed: where it went`` thread whose slices are
  the rank's exposed communication by part (``peer wait``, ``dependent``, ``host idle``,
  ``other``, :mod:`overlapviz.analysis.breakdown`), with flow arrows from each instance's
  straggler (its kernel of the instance) to the waiting rank's peer-wait slice, and from the
  communication kernel a dependent computation waited on to that computation kernel.

Times are written as exact decimal µs text relative to the run's first activity (``ns // 1000``
"." ``ns % 1000``), never through a float, with ``displayTimeUnit: "ns"``; the absolute start
is in ``otherData.base_ns``. Nothing is loaded from the network to open the file.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.compute as pc

from overlapviz.dataset import schema
from overlapviz.analysis.explain import explain
from overlapviz.analysis.metrics import analyze

__all__ = ["perfetto_events", "write_perfetto"]

WHY_TID = 1 << 40  # thread ids of the "why" lanes, far from any stream id
EXPOSED_TID = (1 << 40) - 1  # the "exposed: where it went" lane of each rank
FINDINGS_PID = 1 << 30  # the findings process, far from any rank
_COLUMNS = ["rank", "device", "stream", "correlation", "name", "kind", "start_ns", "end_ns", "grid_x", "grid_y", "grid_z",
            "block_x", "block_y", "block_z", "regs_per_thread", "shared_mem_bytes", "step"]  # fmt: skip


class _Us:
    """An exact µs value (int ns inside) that json writes as decimal text."""

    __slots__ = ("ns",)

    def __init__(self, ns: int):
        self.ns = int(ns)

    def text(self) -> str:
        sign = "-" if self.ns < 0 else ""
        a = abs(self.ns)
        return f"{sign}{a // 1000}.{a % 1000:03d}"


class _Encoder(json.JSONEncoder):
    def default(self, o):
        if isinstance(o, np.generic):
            return o.item()
        return super().default(o)

    def iterencode(self, o, _one_shot=False):
        for chunk in super().iterencode(_swap(o), _one_shot):
            yield chunk.replace('"\\u0000us:', "").replace('\\u0000"', "")


def _swap(o):
    """Replace exact µs values by marked strings the encoder unquotes (json has no decimal hook)."""
    if isinstance(o, _Us):
        return f"\0us:{o.text()}\0"
    if isinstance(o, dict):
        return {k: _swap(v) for k, v in o.items()}
    if isinstance(o, list):
        return [_swap(v) for v in o]
    return o


def _clean(v):
    if v is None or v is pd.NA or (isinstance(v, float) and np.isnan(v)):
        return None
    return v.item() if isinstance(v, np.generic) else v


def perfetto_events(dataset_path: str | os.PathLike, run_id: str, *, device: str | None = None) -> dict:
    """The trace document of one run (see the module docstring); ``device``: the GPU for ranks whose trace does not say
    (as explain's).

    Raises
    ------
    ValueError
        Naming the dataset when the run does not exist or has no activities.
    """
    runs = schema.read_frame(dataset_path, "runs")
    if run_id not in set(runs["run_id"]):
        raise ValueError(f"{dataset_path}: no run {run_id!r} (runs: {', '.join(runs['run_id']) or 'none'})")
    k = schema.read_kernels(dataset_path, columns=_COLUMNS, run_ids=[run_id])
    if not k.num_rows:
        raise ValueError(f"{dataset_path}: run {run_id!r} has no activities to export")
    base = int(pc.min(k.column("start_ns")).as_py())
    kern = k.to_pandas()
    why = explain(dataset_path, run_ids=[run_id], device=device)
    events: list[dict] = []
    for rank in sorted(kern["rank"].unique().tolist()):
        events.append({"ph": "M", "name": "process_name", "pid": int(rank), "tid": 0, "args": {"name": f"rank {rank}"}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": int(rank), "tid": 0, "args": {"sort_index": int(rank)}})
    for (rank, stream), g in kern.groupby(["rank", "stream"], dropna=False, sort=True):
        tid = -1 if pd.isna(stream) else int(stream)
        kinds = "/".join(sorted(set(g["kind"].dropna())))
        events.append({"ph": "M", "name": "thread_name", "pid": int(rank), "tid": tid, "args": {"name": f"stream {tid} ({kinds})"}})
    slice_at = {}  # (rank, correlation) -> (tid, start_ns, end_ns) for flow anchors
    for r in kern.itertuples(index=False):
        tid = -1 if pd.isna(r.stream) else int(r.stream)
        args = {"kind": r.kind, "correlation": _clean(r.correlation), "step": _clean(r.step)}
        if not pd.isna(r.grid_x):
            args |= {"grid": [_clean(r.grid_x), _clean(r.grid_y), _clean(r.grid_z)],
                     "block": [_clean(r.block_x), _clean(r.block_y), _clean(r.block_z)],
                     "regs_per_thread": _clean(r.regs_per_thread), "shared_mem_bytes": _clean(r.shared_mem_bytes)}  # fmt: skip
        events.append({"ph": "X", "name": r.name, "cat": r.kind, "pid": int(r.rank), "tid": tid,
                       "ts": _Us(r.start_ns - base), "dur": _Us(r.end_ns - r.start_ns), "args": args})  # fmt: skip
        if not pd.isna(r.correlation):
            slice_at[(int(r.rank), int(r.correlation), int(r.start_ns))] = (tid, int(r.start_ns), int(r.end_ns))
    events += _why_events(why, kern, base, slice_at)
    events += _counters(dataset_path, run_id, kern, base)
    events += _answer_events(dataset_path, run_id, why, kern, base, device)
    return {"traceEvents": events, "displayTimeUnit": "ns",
            "otherData": {"producer": "overlapviz", "run_id": run_id, "base_ns": str(base),
                          "dataset": str(dataset_path)}}  # fmt: skip


def _why_events(why: pd.DataFrame, kern: pd.DataFrame, base: int, slice_at: dict) -> list[dict]:
    out: list[dict] = []
    flow = 0
    by_name = {}  # (rank, name) -> [(start, end, correlation, tid)] for blockers named by kernel name
    for r in kern.itertuples(index=False):
        by_name.setdefault((int(r.rank), r.name), []).append((int(r.start_ns), int(r.end_ns), r.correlation, r.stream))
    by_corr: dict = {}
    for (rk, corr, _start), val in slice_at.items():
        by_corr.setdefault((rk, corr), []).append(val)
    for rank, w in why.dropna(subset=["launch_ns"]).groupby("rank", sort=True):
        lanes: list[int] = []  # end of the last wait on each lane
        for r in w.sort_values("launch_ns").itertuples(index=False):
            lo, hi = int(r.launch_ns), int(r.start_ns)
            if hi < lo:
                continue
            lane = next((i for i, end in enumerate(lanes) if end <= lo), None)
            if lane is None:
                lanes.append(hi)
                lane = len(lanes) - 1
                out.append({"ph": "M", "name": "thread_name", "pid": int(rank), "tid": WHY_TID + lane,
                            "args": {"name": "why: comm waits" + (f" ({lane + 1})" if lane else "")}})  # fmt: skip
            lanes[lane] = hi
            tid = WHY_TID + lane
            args = {c: _clean(getattr(r, c)) for c in ("cause", "blocker", "blocking_resource", "comm_blocks_fit_per_sm",
                                                        "free_sms", "dependency_source", "producer", "start_delay_us",
                                                        "peer_wait_us", "correlation", "collective")}  # fmt: skip
            args["kernel"] = r.name
            out.append({"ph": "X", "name": f"wait: {r.cause}", "cat": "why", "pid": int(rank), "tid": tid,
                        "ts": _Us(lo - base), "dur": _Us(hi - lo), "args": args})  # fmt: skip
            t = lo
            for part, ns in (("stream order", r.stream_wait_ns), ("dependency", r.dependency_wait_ns), ("ready -> start", r.ready_wait_ns)):
                ns = 0 if pd.isna(ns) else int(ns)
                ns = min(ns, hi - t)
                if ns > 0:
                    out.append({"ph": "X", "name": part, "cat": "why", "pid": int(rank), "tid": tid, "ts": _Us(t - base),
                                "dur": _Us(ns), "args": {}})  # fmt: skip
                    t += ns
            # an arrow from what held the kernel back to the kernel
            target = slice_at.get((int(rank), int(r.correlation), hi)) if not pd.isna(r.correlation) else None
            source = None
            if r.cause == "dependency" and not pd.isna(r.producer_correlation):
                ends = [v for v in by_corr.get((int(rank), int(r.producer_correlation)), []) if v[2] <= hi]
                source = max(ends, key=lambda v: v[2]) if ends else None
            elif r.cause == "sm_resources" and isinstance(r.blocker, str):
                cands = [s for s in by_name.get((int(rank), r.blocker), []) if s[0] <= hi and s[0] <= int(r.ready_ns or hi)]
                if cands:
                    s = max(cands, key=lambda s: s[0])
                    source = (-1 if pd.isna(s[3]) else int(s[3]), s[0], s[1])
            if source is not None and target is not None:
                flow += 1
                at = min(source[2], hi) - 1 if source[2] > source[1] else source[1]
                out.append({"ph": "s", "id": flow, "name": f"why: {r.cause}", "cat": "why", "pid": int(rank), "tid": source[0],
                            "ts": _Us(max(at, source[1]) - base)})  # fmt: skip
                out.append({"ph": "f", "bp": "e", "id": flow, "name": f"why: {r.cause}", "cat": "why", "pid": int(rank),
                            "tid": target[0], "ts": _Us(target[1] - base)})  # fmt: skip
    return out


def _answer_events(dataset_path, run_id: str, why: pd.DataFrame, kern: pd.DataFrame, base: int, device) -> list[dict]:
    """The findings process and each rank's exposed-time lane, with the evidence linked by flows."""
    from overlapviz.analysis import breakdown as bd
    from overlapviz.analysis import intervals
    from overlapviz.analysis.findings import findings

    timelines = list(bd.rank_timelines(dataset_path, run_ids=[run_id]))
    found = findings(dataset_path, run_ids=[run_id], device=device, explained=why, timelines=timelines)
    out: list[dict] = [{"ph": "M", "name": "process_name", "pid": FINDINGS_PID, "tid": 0, "args": {"name": "findings"}},
                       {"ph": "M", "name": "process_sort_index", "pid": FINDINGS_PID, "tid": 0, "args": {"sort_index": -1}}]  # fmt: skip
    kind_time = {}
    for tl in timelines:
        if not len(tl.exposed):
            continue
        for label, name in zip(bd.LABELS, ("peer wait", "dependent", "host idle", "other")):
            got = intervals.intersect(tl.label_set(label), tl.exposed)
            kind_time.setdefault(label, []).extend(zip(got.start.tolist(), got.end.tolist()))
        out.append({"ph": "M", "name": "thread_name", "pid": tl.rank, "tid": EXPOSED_TID, "args": {"name": "exposed: where it went"}})
        out.append({"ph": "M", "name": "thread_sort_index", "pid": tl.rank, "tid": EXPOSED_TID, "args": {"sort_index": -1}})
    where = {"straggler": "peer_wait", "dependent": "dependent", "host_idle": "host_idle", "exposed_other": "other"}
    lo_all = int(kern["start_ns"].min())
    for i, f in enumerate(found.itertuples(index=False), 1):
        spans = kind_time.get(where.get(f.kind, ""), [])
        lo = min((a for a, _ in spans), default=lo_all)
        hi = max((b for _, b in spans), default=lo + 1)
        args = {"kind": f.kind, "time_us": _Us(int(f.time_ns)), "ranks": list(f.ranks), "text": f.text, "action": f.action,
                "evidence": json.loads(json.dumps(f.evidence, default=_clean))}  # fmt: skip
        out.append({"ph": "M", "name": "thread_name", "pid": FINDINGS_PID, "tid": i, "args": {"name": f"finding {i}: {f.kind}"}})
        out.append({"ph": "M", "name": "thread_sort_index", "pid": FINDINGS_PID, "tid": i, "args": {"sort_index": i}})
        out.append({"ph": "X", "name": f"{i}. {f.kind}: {f.text[:80]}", "cat": "finding", "pid": FINDINGS_PID, "tid": i,
                    "ts": _Us(lo - base), "dur": _Us(max(hi - lo, 1)), "args": args})  # fmt: skip
    out += _exposed_slices(timelines, kern, base)
    out += _straggler_flows(why, base)
    return out


def _straggler_flows(why: pd.DataFrame, base: int) -> list[dict]:
    """An arrow from each waiting rank's kernel of an instance to the straggler's (the rank that started it last)."""
    out: list[dict] = []
    if not len(why) or "instance" not in why:
        return out
    w = why.loc[why["instance"].notna() & why["peer_wait_us"].notna()]
    flow = 1 << 21
    for _, g in w.groupby(["instance"], sort=False):
        first = g.sort_values("start_ns").groupby("rank", sort=True).head(1)
        if first["rank"].nunique() < 2:
            continue
        last = first.loc[first["start_ns"] == first["start_ns"].max()].sort_values("rank").iloc[0]
        for r in first.itertuples(index=False):
            if int(r.rank) == int(last["rank"]) or int(r.start_ns) >= int(last["start_ns"]):
                continue
            flow += 1
            name = f"waited for rank {int(last['rank'])}"
            out.append({"ph": "s", "id": flow, "name": name, "cat": "exposed", "pid": int(r.rank),
                        "tid": -1 if pd.isna(r.stream) else int(r.stream), "ts": _Us(int(r.start_ns) - base)})  # fmt: skip
            out.append({"ph": "f", "bp": "e", "id": flow, "name": name, "cat": "exposed", "pid": int(last["rank"]),
                        "tid": -1 if pd.isna(last["stream"]) else int(last["stream"]), "ts": _Us(int(last["start_ns"]) - base)})  # fmt: skip
    return out


def _exposed_slices(timelines: list, kern: pd.DataFrame, base: int) -> list[dict]:
    """Each rank's exposed communication by part, with the flows that name what it waited for."""
    from overlapviz.analysis import breakdown as bd
    from overlapviz.analysis import intervals

    out: list[dict] = []
    at = {(int(r.rank), int(r.start_ns), r.name): (-1 if pd.isna(r.stream) else int(r.stream), int(r.start_ns), int(r.end_ns))
          for r in kern.itertuples(index=False)}  # fmt: skip
    flow = 1 << 20  # above the why lanes' flow ids
    names = dict(zip(bd.LABELS, ("peer wait", "dependent", "host idle", "other")))
    for tl in timelines:
        if not len(tl.exposed):
            continue
        z = np.zeros(len(tl.seg_start), np.int64)
        inside = intervals.covered(tl.exposed, z, tl.seg_start, tl.seg_end)
        for j in np.flatnonzero(inside > 0).tolist():
            a, b = int(tl.seg_start[j]), int(tl.seg_end[j])
            label = bd.LABELS[int(tl.label[j])]
            piece = intervals.intersect(intervals.IntervalSet(np.zeros(1, np.int64), np.array([a]), np.array([b])), tl.exposed)
            for lo, hi in zip(piece.start.tolist(), piece.end.tolist()):
                args = {"part": names[label]}
                if tl.next_kernel[j] >= 0:
                    args["next_computation"] = tl.names[tl.next_kernel[j]]
                if tl.gate[j] >= 0:
                    args["waited_on"] = tl.names[tl.gate[j]]
                out.append({"ph": "X", "name": names[label], "cat": "exposed", "pid": tl.rank, "tid": EXPOSED_TID,
                            "ts": _Us(lo - base), "dur": _Us(hi - lo), "args": args})  # fmt: skip
            if label == "dependent" and tl.gate[j] >= 0 and tl.next_kernel[j] >= 0:  # the collective -> the computation it held
                g, n = int(tl.gate[j]), int(tl.next_kernel[j])
                src = at.get((tl.rank, int(tl.start[g]), tl.names[g]))
                dst = at.get((tl.rank, int(tl.start[n]), tl.names[n]))
                if src is not None and dst is not None and (j == 0 or tl.gate[j - 1] != g or tl.next_kernel[j - 1] != n):
                    flow += 1
                    out.append({"ph": "s", "id": flow, "name": "dependent", "cat": "exposed", "pid": tl.rank, "tid": src[0],
                                "ts": _Us(max(src[2] - 1, src[1]) - base)})  # fmt: skip
                    out.append({"ph": "f", "bp": "e", "id": flow, "name": "dependent", "cat": "exposed", "pid": tl.rank,
                                "tid": dst[0], "ts": _Us(dst[1] - base)})  # fmt: skip
    return out


def _counters(dataset_path, run_id: str, kern: pd.DataFrame, base: int) -> list[dict]:
    out: list[dict] = []
    per_step = analyze(dataset_path, per="step", run_ids=[run_id])
    if len(per_step):
        starts = kern.groupby(["rank", "step"])["start_ns"].min()
        rows = [(int(r.rank), int(starts.get((r.rank, r.step), base)), r) for r in per_step.itertuples(index=False)]
    else:
        whole = analyze(dataset_path, per="rank", run_ids=[run_id])
        rows = [(int(r.rank), base, r) for r in whole.itertuples(index=False)]
    for rank, t, r in rows:
        ov = _clean(r.overlap_fraction)
        out.append({"ph": "C", "name": "overlap_fraction", "pid": rank, "tid": 0, "ts": _Us(t - base),
                    "args": {"overlap_fraction": 0.0 if ov is None else float(ov)}})  # fmt: skip
        out.append({"ph": "C", "name": "exposed_comm_us", "pid": rank, "tid": 0, "ts": _Us(t - base),
                    "args": {"exposed_comm_us": float(_clean(r.exposed_comm_us) or 0.0)}})  # fmt: skip
    return out


def write_perfetto(dataset_path: str | os.PathLike, run_id: str, out: str | os.PathLike, *, device: str | None = None) -> Path:
    """Write :func:`perfetto_events` of a run to ``out`` (``.json`` or ``.json.gz``), atomically."""
    import gzip

    out = Path(out)
    doc = perfetto_events(dataset_path, run_id, device=device)
    text = "".join(_Encoder(separators=(",", ":"), ensure_ascii=False).iterencode(doc)).encode()
    tmp = out.with_name(f".{out.name}.tmp{os.getpid()}")
    try:
        tmp.write_bytes(gzip.compress(text, 6) if out.name.endswith(".gz") else text)
        os.replace(tmp, out)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise ValueError(f"{out}: cannot write: {exc.strerror or exc}") from None
    return out
