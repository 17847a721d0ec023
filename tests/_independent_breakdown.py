"""An independent implementation of DESIGN.md "Where communication time went", for tests only.

Written from the contract, not from ``overlapviz.analysis.breakdown``: plain Python over the
dataset's ``kernels`` and ``syncs`` rows (lists of dicts), brute force over the elementary
segments between sorted breakpoints. Each elementary segment ``[a, b)`` holds no breakpoint
inside, so every condition of the contract has one value on its open interior ``(a, b)``;
the segment gets the first label that holds there:

1. ``peer_wait``: ``t`` in ``[this rank's start of an instance, the latest start among the
   instance's ranks)`` (a rank's start of an instance is its first activity of it).
2. ``dependent``: the next computation kernel (the first to start after ``t``; with ties, any of
   them) is gated on a communication activity running at ``t``: one on its own stream, or one on
   the stream of the producer of an event the kernel's stream was made to wait on (between the
   previous launch on that stream and the kernel's launch), enqueued no later than the producer.
3. ``host_idle``: every computation kernel starting after ``t`` was launched after ``t`` (a kernel
   without a launch is not known to be; no kernel after ``t`` makes it hold).
4. ``other``.

Only the exposed segments count: covered by communication and by no computation (per step: by
the step's own activities, the labels the rank's). Breakpoints:
every activity's start and end, every computation kernel's launch and every instance's latest
start. Instances are matched by ``(comm_group, comm_seq)`` where recorded, else by position
among the rank's collectives of one group and collective name.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import defaultdict

from overlapviz.testing import union as _union  # plain Python, independent of overlapviz.analysis

PARTS = ("peer_wait_ns", "dependent_ns", "host_idle_ns", "exposed_other_ns")


def instance_starts(kernels: list[dict], ends: dict | None = None) -> dict[tuple, dict[int, int]]:
    """``{instance key: {rank: first start}}`` over the comm rows of one run (every rank); ``ends``, when
    given, is filled with ``{instance key: {rank: last end}}``."""
    by_rank: dict[int, list[dict]] = defaultdict(list)
    for k in kernels:
        if k["kind"] == "comm":
            by_rank[k["rank"]].append(k)
    out: dict[tuple, dict[int, int]] = defaultdict(dict)
    for rank, rows in by_rank.items():
        rows = sorted(rows, key=lambda k: (k["start_ns"], k["end_ns"]))
        seen_pos: dict[tuple, int] = defaultdict(int)
        pos_key_of: dict[tuple, tuple] = {}
        for k in rows:
            if k.get("comm_seq") is not None:
                key = ("seq", k.get("comm_group") or "", k["comm_seq"])
            else:
                # one instance per kernel where nothing records the sequence
                lane = (k.get("comm_group") or "", k.get("collective") or k["name"])
                key = ("pos", *lane, seen_pos[lane])
                seen_pos[lane] += 1
                pos_key_of[key] = key
            first = out[key].get(rank)
            if first is None or k["start_ns"] < first:
                out[key][rank] = k["start_ns"]
            if ends is not None:
                ends.setdefault(key, {})[rank] = max(ends.get(key, {}).get(rank, k["end_ns"]), k["end_ns"])
    return out


def _waits(kernels: list[dict], syncs: list[dict]) -> dict[int, list[tuple[int, int]]]:
    """For each computation/comm kernel index, the (producer stream, producer start) of the events
    its stream was made to wait on just before its launch."""
    launched = sorted((k["launch_ns"], i) for i, k in enumerate(kernels) if k["launch_ns"] is not None)
    by_tid: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for t, i in launched:
        by_tid[kernels[i]["launch_tid"]].append((t, i))
    records = [s for s in syncs if s["kind"] == "event_record" and s["source"] == "runtime"]
    record_by_corr = {s["correlation"]: s for s in records if s["correlation"] is not None}
    records_by_tid: dict[int, list[dict]] = defaultdict(list)
    for s in sorted(records, key=lambda s: s["start_ns"]):
        records_by_tid[s["tid"]].append(s)
    cs_by_corr = {s["correlation"]: s for s in syncs
                  if s["source"] == "cuda_sync" and s["kind"] == "stream_wait_event" and s["correlation"] is not None}

    def known(v):
        return v is not None and v != -1

    def last_launch_on_tid(tid, before):
        xs = by_tid.get(tid, [])
        j = bisect_left(xs, (before, -1)) - 1
        return kernels[xs[j][1]] if j >= 0 else None

    out: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for w in syncs:
        if not (w["source"] == "runtime" and w["kind"] == "stream_wait_event"):
            continue
        cs = cs_by_corr.get(w["correlation"])
        # the waiting stream
        wstream = cs["stream"] if cs is not None and known(cs["stream"]) else None
        if wstream is None:
            nxt = [(t, i) for t, i in by_tid.get(w["tid"], []) if t > w["start_ns"]]
            if not nxt:
                continue
            wstream = kernels[nxt[0][1]]["stream"]
        # the record call
        rec = None
        if cs is not None and known(cs["wait_on_record_correlation"]):
            rec = record_by_corr.get(cs["wait_on_record_correlation"])
        if rec is None:
            prior = [s for s in records_by_tid.get(w["tid"], []) if s["start_ns"] < w["start_ns"]]
            rec = prior[-1] if prior else None
        if rec is None:
            if cs is not None and (known(cs["wait_on_stream"]) or known(cs["wait_on_record_correlation"])):
                continue
            # no record call for this wait in the trace (Kineto before cudaEventRecord was traced):
            # the producer is the last activity launched on the waiting thread, on another stream,
            # before the wait (ProcessGroupNCCL records and waits on one thread; issue 32 item 0)
            other = [kernels[i] for t, i in by_tid.get(w["tid"], []) if t < w["start_ns"] and kernels[i]["stream"] != wstream]
            if not other:
                continue
            producer = other[-1]
            rstream = producer["stream"]
        else:
            # the recording stream
            if cs is not None and known(cs["wait_on_stream"]):
                rstream = cs["wait_on_stream"]
            else:
                prev = last_launch_on_tid(rec["tid"], rec["start_ns"])
                if prev is None:
                    continue
                rstream = prev["stream"]
            # the producer: last activity enqueued on the recording stream before the record call
            cands = [k for k in kernels if k["stream"] == rstream and k["launch_ns"] is not None
                     and k["launch_ns"] < rec["start_ns"]]
            if not cands:
                continue
            producer = max(cands, key=lambda k: (k["launch_ns"], k["start_ns"]))
        # the kernel it gates: the first launch on the waiting stream after the wait call
        gated = [(k["launch_ns"], i) for i, k in enumerate(kernels)
                 if k["stream"] == wstream and k["launch_ns"] is not None and k["launch_ns"] > w["start_ns"]]
        if not gated:
            continue
        first = min(gated)[1]
        # a link the GPU timeline contradicts (the kernel started before the producer ended) is not
        # a wait: a host-order inference that picked the wrong stream or event
        if kernels[first]["start_ns"] >= producer["end_ns"]:
            out[first].append((rstream, producer["start_ns"]))
    return out


def rank_segments(kernels: list[dict], syncs: list[dict], peer_windows: list[tuple[int, int]]) -> list[tuple]:
    """One rank's communication cut into elementary segments ``(a, b, label, covered by computation)``."""
    comm = [k for k in kernels if k["kind"] == "comm"]
    comp = [k for k in kernels if k["kind"] == "compute"]
    points = set()
    for k in comm + comp:
        points.add(k["start_ns"])
        points.add(k["end_ns"])
    for k in comp:
        if k["launch_ns"] is not None:
            points.add(k["launch_ns"])
    for s, e in peer_windows:
        points.add(s)
        points.add(e)
    pts = sorted(points)
    n = len(pts)
    idx = {p: i for i, p in enumerate(pts)}

    def coverage(rows_or_windows):
        d = [0] * (n + 1)
        for s, e in rows_or_windows:
            if e > s:
                d[idx[s]] += 1
                d[idx[e]] -= 1
        c, out = 0, []
        for i in range(n):
            c += d[i]
            out.append(c)
        return out

    comm_cov = coverage([(k["start_ns"], k["end_ns"]) for k in comm])
    comp_cov = coverage([(k["start_ns"], k["end_ns"]) for k in comp])
    peer_cov = coverage(peer_windows)

    kernel_index = {id(k): i for i, k in enumerate(kernels)}
    waits = _waits(kernels, syncs)
    comp_sorted = sorted(comp, key=lambda k: k["start_ns"])
    comp_starts = [k["start_ns"] for k in comp_sorted]
    # suffix minimum of launches (None: not known to be launched after anything)
    NEG = float("-inf")
    suffix_min = [float("inf")] * (len(comp_sorted) + 1)
    for j in range(len(comp_sorted) - 1, -1, -1):
        lj = comp_sorted[j]["launch_ns"]
        suffix_min[j] = min(suffix_min[j + 1], NEG if lj is None else lj)

    segs = []  # (a, b, label or None where computation covers it); labels for every comm instant
    comm_by_start = sorted(comm, key=lambda k: k["start_ns"])
    active: list[dict] = []  # comm activities started by the current segment's start
    nxt = 0
    for i in range(n - 1):
        a, b = pts[i], pts[i + 1]
        while nxt < len(comm_by_start) and comm_by_start[nxt]["start_ns"] <= a:
            active.append(comm_by_start[nxt])
            nxt += 1
        active = [c for c in active if c["end_ns"] > a]
        if comm_cov[i] == 0:
            continue
        segs.append((a, b, _label(a, b, peer_cov[i] > 0, active, comp_sorted, comp_starts, suffix_min, waits,
                                  kernel_index), comp_cov[i] > 0))
    return segs


def _label(a, b, in_peer_window, active, comp_sorted, comp_starts, suffix_min, waits, kernel_index) -> str:
    """The first label of the contract that holds on (a, b)."""
    if in_peer_window:
        return "peer_wait_ns"
    j = bisect_left(comp_starts, b)  # computation kernels starting after t in (a, b)
    if j < len(comp_sorted):
        first = comp_starts[j]
        nexts = []
        while j + len(nexts) < len(comp_sorted) and comp_starts[j + len(nexts)] == first:
            nexts.append(comp_sorted[j + len(nexts)])
        running = [c for c in active if c["end_ns"] >= b]
        for kk in nexts:
            producers = waits.get(kernel_index[id(kk)], [])
            for c in running:
                if c["stream"] == kk["stream"] or any(
                        c["stream"] == ps and c["start_ns"] <= pstart for ps, pstart in producers):
                    return "dependent_ns"
    return "host_idle_ns" if suffix_min[j] >= b else "exposed_other_ns"


def rank_breakdown(kernels: list[dict], syncs: list[dict], peer_windows: list[tuple[int, int]]) -> dict:
    """The breakdown of one rank from its kernel rows, its sync rows and its peer-wait windows
    ``[own start, latest start)``. Returns ``comm_ns, overlapped_ns, exposed_ns`` and :data:`PARTS`."""
    res = dict.fromkeys(("comm_ns", "overlapped_ns", "exposed_ns", *PARTS), 0)
    for a, b, label, covered in rank_segments(kernels, syncs, peer_windows):
        res["comm_ns"] += b - a
        res["overlapped_ns" if covered else "exposed_ns"] += b - a
        if not covered:
            res[label] += b - a
    return res


def _covers(merged, starts, a, b) -> bool:
    j = bisect_left(starts, a + 1) - 1
    return j >= 0 and merged[j][0] <= a and merged[j][1] >= b


def step_breakdown(kernels: list[dict], syncs: list[dict], peer_windows) -> dict[int, dict]:
    """Per step (kernels of no step left out): the step's own comm/compute/exposed time, its exposed
    instants labelled as the rank's (the contract's "per step")."""
    segs = rank_segments(kernels, syncs, peer_windows)
    out = {}
    for step in sorted({k["step"] for k in kernels if k["step"] is not None}):
        mine = [k for k in kernels if k["step"] == step]
        comm = _union([(k["start_ns"], k["end_ns"]) for k in mine if k["kind"] == "comm"])
        comp = _union([(k["start_ns"], k["end_ns"]) for k in mine if k["kind"] == "compute"])
        comm_starts, comp_starts = [x for x, _ in comm], [x for x, _ in comp]
        res = dict.fromkeys(("comm_ns", "overlapped_ns", "exposed_ns", *PARTS), 0)
        for a, b, label, _ in segs:
            if not _covers(comm, comm_starts, a, b):
                continue
            res["comm_ns"] += b - a
            if _covers(comp, comp_starts, a, b):
                res["overlapped_ns"] += b - a
            else:
                res["exposed_ns"] += b - a
                res[label] += b - a
        out[step] = res
    return out


def run_breakdown(kernels: list[dict], syncs: list[dict], *, peers: bool, per: str = "rank") -> dict:
    """``{rank: breakdown}`` (``per="step"``: ``{(rank, step): breakdown}``) for one run's rows (every
    rank). ``peers``: whether the ranks' clocks compare (else no peer wait)."""
    windows: dict[int, list[tuple[int, int]]] = defaultdict(list)
    if peers:
        ends: dict = {}
        for key, starts in instance_starts(kernels, ends).items():
            if len(starts) < 2:
                continue
            latest = max(starts.values())
            # one instance on comparable clocks ends together: ranks whose ends disagree by more than the
            # instance lasted after its last arrival (+10 µs for integer-µs traces) are not one instance
            e = ends[key].values()
            if max(e) - min(e) > max(max(e) - latest, 0) + 10_000:
                continue
            for rank, s in starts.items():
                if latest > s:
                    windows[rank].append((s, latest))
    ranks = sorted({k["rank"] for k in kernels})
    if per == "step":
        return {(r, st): rec for r in ranks
                for st, rec in step_breakdown([k for k in kernels if k["rank"] == r],
                                              [s for s in syncs if s["rank"] == r], windows[r]).items()}
    return {r: rank_breakdown([k for k in kernels if k["rank"] == r], [s for s in syncs if s["rank"] == r],
                              windows[r]) for r in ranks}
