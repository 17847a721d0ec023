"""Findings (DESIGN.md): the answer in plain sentences, each with the rank-time at stake, its evidence and what to change.

Kinds, each built from one measure so that no instant of a rank counts twice in one finding:

* ``straggler``: per rank that started some collective instances last, the exposed time
  the other ranks spent waiting for it there (the breakdown's peer wait, restricted to
  those instances), and what it was doing before it arrived: its computation and the
  time its GPU sat idle since its previous collective, against the median rank's.
* ``dependent``, ``host_idle``, ``exposed_other``: the breakdown's parts of the same names
  over the run's ranks, with the kernels and host calls they rest on.
* ``sm_resources`` and one per start-delay cause (``stream_order``, ``dependency``,
  ``launch_latency``, ``unknown``, ``launch_call``): per rank the union of the waits of
  the collectives of that cause (for ``sm_resources``, ``launch_latency`` and
  ``unknown`` ready -> start; for ``stream_order`` launch -> stream ready; for
  ``dependency`` the wait after the stream was ready; for ``launch_call`` the time
  inside the launch call), summed over ranks. Start delays are not all exposed time:
  a collective can start late beside computation and still overlap.

Sorted by ``time_ns``, largest first.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import pandas as pd

from overlapviz.dataset import schema
from overlapviz.analysis import breakdown as bd
from overlapviz.analysis import clocks, intervals
from overlapviz.analysis import explain as explain_lib

__all__ = ["KINDS", "COLUMNS", "findings", "answer", "digest", "RankDigest", "format_ns", "headline", "compare_runs", "changes_by_kind"]

KINDS = ("straggler", "dependent", "host_idle", "sm_resources", "stream_order", "dependency", "launch_latency", "unknown",
         "launch_call", "exposed_other")  # fmt: skip
COLUMNS = ["run_id", "kind", "time_ns", "ranks", "evidence", "action", "text", "share", "waiting_ranks"]
_LIST = 5  # evidence items kept per finding
_EXPOSED_KINDS = ("straggler", "dependent", "host_idle", "stream_order", "exposed_other")  # findings of exposed time


def format_ns(ns: int | float) -> str:
    """A duration for a sentence: ``320 µs``, ``11.1 ms``, ``53.2 s`` (3 significant digits)."""
    ns = float(ns)
    for unit, scale in (("s", 1e9), ("ms", 1e6), ("µs", 1e3)):
        if abs(ns) >= scale:
            v = ns / scale
            return f"{v:.3g} {unit}" if v < 1000 else f"{v:,.0f} {unit}"
    return "0" if ns == 0 else f"{ns:.0f} ns"


def headline(total) -> str:
    """One run's breakdown in a sentence (``total``: a row of :func:`overlapviz.analysis.breakdown.run_totals`)."""
    if not total["comm_ns"]:
        return "no communication"
    ranks = f"{int(total['n_ranks'])} rank" + ("s" if total["n_ranks"] != 1 else "")
    parts = ", ".join(f"{name} {format_ns(total[col])}" for name, col in (
        ("peer wait", "peer_wait_ns"), ("dependent", "dependent_ns"), ("host idle", "host_idle_ns"),
        ("other", "exposed_other_ns")))  # fmt: skip
    return (f"communication {format_ns(total['comm_ns'])} over {ranks}, {format_ns(total['overlapped_ns'])} overlapped "
            f"with computation, {format_ns(total['exposed_ns'])} exposed: {parts}")


def findings(dataset_path: str | os.PathLike, *, run_ids=None, device: str | None = None, explained: pd.DataFrame | None = None,
             timelines: list | None = None, pause=None) -> pd.DataFrame:  # fmt: skip
    """The findings of each run (module docstring).

    Parameters
    ----------
    dataset_path
        An overlapviz dataset.
    run_ids
        Only these runs (default: all).
    device
        The GPU for traces that do not say (as ``explain --device-name``).
    explained
        :func:`overlapviz.analysis.explain.explain` records of the same runs, when already computed.
    timelines
        :func:`overlapviz.analysis.breakdown.rank_timelines` of the same runs, when already computed.

    Returns
    -------
    pandas.DataFrame
        ``run_id, kind, time_ns`` (int64 rank-time, summed over ranks), ``ranks`` (list of
        ints: the straggler for ``straggler``, else the ranks whose time is counted),
        ``evidence`` (list of dicts naming instances, kernels, streams or calls, each with
        its ``time_ns``), ``action`` (what to change), ``text`` (one sentence with the
        numbers), ``share`` (time_ns over the run's exposed communication summed over its
        ranks; null where it has none). Sorted by ``time_ns``, largest first.
    """
    return answer(dataset_path, run_ids=run_ids, device=device, explained=explained, timelines=timelines, pause=pause)[0]


def answer(dataset_path: str | os.PathLike, *, run_ids=None, device: str | None = None, explained: pd.DataFrame | None = None,
           timelines: list | None = None, pause=None) -> tuple[pd.DataFrame, pd.DataFrame]:  # fmt: skip
    """:func:`findings` and :func:`overlapviz.analysis.breakdown.run_totals` of the same runs, in one read of each rank.

    Without ``timelines``, the ranks are read one at a time (issue 36): each rank's timeline is
    reduced to what the findings use (its exposed communication, labelled segments, the kernels
    they name, its computation and idle time before each of its collective arrivals) before the
    next is read, so that memory holds one rank's kernels, the communication records and those
    reductions. Same parameters as :func:`findings`.
    """
    if timelines is None:
        if explained is None:
            arrivals = bd.arrivals_of(dataset_path, run_ids)  # each rank's arrivals: the instances need every rank's
        else:
            arrivals = _arrivals(dataset_path, explained, run_ids)
        waits, arrive_by, late_by = _rank_arrivals(arrivals)
        digests, total_rows = [], []

        def take(run_id, rank, rk, syncs, links=None):
            tl = bd.timeline_of(run_id, rank, rk, syncs, waits.get((run_id, rank)), links=links)
            total_rows.extend(bd.group_rows(tl, "rank"))
            digests.append(digest(tl, arrive_by.get((run_id, rank)), late_by.get((run_id, rank))))

        if explained is None:  # of each rank's records, the columns and rows the start delays read (issue 36)
            explained = explain_lib.explain(dataset_path, run_ids=run_ids, device=device, pause=pause, on_rank=take,
                                            columns=DELAY_READS, peers_matched=False, keep_rows=_delayed)  # fmt: skip
        else:
            from overlapviz.analysis.rankwise import rank_tables

            for run_id, rank, rk, syncs in rank_tables(dataset_path, bd.READ, run_ids=run_ids, dictionary=bd.DICTIONARY,
                                                       pause=pause):  # fmt: skip
                take(run_id, rank, rk, syncs)
        totals = bd.totals_of(total_rows)
    else:
        if explained is None:
            explained = explain_lib.explain(dataset_path, run_ids=run_ids, device=device, pause=pause)
        arrivals = _arrivals(dataset_path, explained, run_ids)
        _, arrive_by, late_by = _rank_arrivals(arrivals)
        totals = bd.run_totals(timelines)
        digests = [digest(tl, arrive_by.get((tl.run_id, tl.rank)), late_by.get((tl.run_id, tl.rank))) for tl in timelines]
    return _found(dataset_path, digests, explained, arrivals, device), totals


# the explain record columns the start-delay findings read (_start_delays, and budget.what_if_options of the worst)
DELAY_READS = ("run_id", "rank", "kind", "name", "stream", "correlation", "start_ns", "end_ns", "launch_ns", "stream_ready_ns",
               "dependency_ready_ns", "ready_ns", "launch_call_ns", "cause", "ready_part", "ready_blocker",
               "ready_blocking_resource", "stream_previous", "stream_previous_kind", "resident_compute", "blocker", "free_sms")  # fmt: skip


def _delayed(records: pd.DataFrame) -> pd.DataFrame:
    """The records that some start-delay finding counts (a wait of one of its parts), in order: the others
    change no finding (:func:`_start_delays` reads the records with a wait alone)."""
    if not len(records):
        return records
    has = np.zeros(len(records), bool)
    for part in ("sm_resources",) + tuple(_CAUSE_TEXT):
        lo, hi = explain_lib.part_waits(records, part)
        has |= (lo >= 0) & (hi > lo)
        if part == "sm_resources" and "resident_compute" in records:  # read of the sm_resources records alone (_padding)
            records = records.assign(resident_compute=records["resident_compute"].where((lo >= 0) & (hi > lo), None))
    records = records if has.all() else records.loc[has]
    return records.assign(**{c: _shared_words(records[c]) for c in records.columns if pd.api.types.is_string_dtype(records[c])
                             and records[c].dtype != object})  # fmt: skip


def _shared_words(col: pd.Series) -> pd.Series:
    """A text column (pandas' ``str``: each row holds its bytes) as objects, one string per distinct word, null as
    the ``str`` column reads it (NaN): 8 bytes a row kept, whatever the kernel name's length."""
    codes, words = pd.factorize(col, use_na_sentinel=True)
    table = np.array(list(words) + [col.dtype.na_value if hasattr(col.dtype, "na_value") else None], dtype=object)
    return pd.Series(table[codes], index=col.index, dtype=object)


def _found(dataset_path, timelines: list, explained: pd.DataFrame, arrivals: pd.DataFrame, device) -> pd.DataFrame:
    rows: list[dict] = []
    by_run: dict[str, list] = {}
    for tl in timelines:
        by_run.setdefault(tl.run_id, []).append(tl)
    runs = schema.read_frame(dataset_path, "runs")
    for run_id, tls in by_run.items():
        exposed_total = sum(int(intervals.measure(t.exposed, 1)[0]) for t in tls)
        found = []
        found += _stragglers(run_id, tls, arrivals.loc[arrivals["run_id"] == run_id])
        found += _dependent(run_id, tls)
        found += _host_idle(run_id, tls)
        found += _exposed_other(run_id, tls)
        ex = explained.loc[explained["run_id"] == run_id] if len(explained) else explained
        found += _start_delays(dataset_path, run_id, ex, runs, device, {t.rank: t for t in tls})
        for f in found:  # a share of the exposed time: start delays are waits, not exposed time
            f["share"] = f["time_ns"] / exposed_total if exposed_total and f["kind"] in _EXPOSED_KINDS else None
            if f["kind"] in _CAUSE_TEXT or f["kind"] == "sm_resources":
                if exposed_total * 20 < f["time_ns"]:  # the late starts cost (almost) no exposed time
                    f["text"] += (f" Overlap hid it: {format_ns(exposed_total)} of the run's communication was exposed.")
                    f["action"] = "Nothing to win while the communication stays hidden behind computation. " + f["action"]
        rows += found
    if not rows:
        return pd.DataFrame({c: pd.Series(dtype="int64" if c == "time_ns" else object) for c in COLUMNS})
    out = pd.DataFrame(rows).reindex(columns=COLUMNS)
    out["time_ns"] = out["time_ns"].astype(np.int64)
    kind_order = out["kind"].map({k: i for i, k in enumerate(KINDS)})
    out = out.assign(_k=kind_order).sort_values(["time_ns", "run_id", "_k"], ascending=[False, True, True], kind="stable")
    return out.drop(columns="_k").reset_index(drop=True)


@dataclass
class RankDigest:
    """What the findings read of one rank's :class:`overlapviz.analysis.breakdown.RankTimeline`, per collective
    and per kernel name, never per kernel: its exposed communication; per label (``dependent``, ``host_idle``,
    ``other``) the exposed time of its segments and that time by the next computation kernel (and, for
    ``dependent``, the communication it was gated on), in order of first appearance (``parts``: label ->
    ``(time_ns, [(kernel, gate, time_ns), ...])``, names shortened; None where none of it is exposed); the
    time its host sat in each blocking call during its idle exposed time (``host_calls``); per collective
    instance it arrived at, its computation and idle time since its previous collective (``before``:
    instance -> ``(compute_ns, idle_ns)``); ``top_kernel``: its computation kernel with the most time before
    its last late arrival (None where it arrived last nowhere)."""

    run_id: str
    rank: int
    exposed: intervals.IntervalSet
    parts: dict
    host_calls: dict
    before: dict
    top_kernel: str | None


def digest(tl: bd.RankTimeline, arrived: pd.DataFrame | None, late_ns: int | None) -> RankDigest:
    """The :class:`RankDigest` of ``tl``, given the rank's rows of the run's :func:`overlapviz.analysis.breakdown.arrivals`
    (``arrived``, in that table's order; None: none) and its latest arrival at an instance it arrived at last
    (``late_ns``; None: none)."""
    parts = {label: _label_part(tl, label) for label in ("dependent", "host_idle", "other")}
    calls: dict[str, int] = {}  # the host calls that blocked the launching threads during the idle time
    keep = np.flatnonzero(tl.label == bd.LABELS.index("host_idle"))
    s = tl.syncs
    if len(keep) and len(s.get("kind", ())):
        is_wait = np.isin(s["kind"], ("stream_sync", "context_sync", "event_sync")) & (s["source"] == "runtime")
        if is_wait.any():
            idle = intervals.intersect(_set(tl.seg_start[keep], tl.seg_end[keep]), tl.exposed)
            w = np.flatnonzero(is_wait)
            got = intervals.covered(idle, np.zeros(len(w), np.int64), s["start_ns"][w], s["end_ns"][w])
            for name, g in zip(s["name"][w].tolist(), got.tolist()):
                if g:
                    calls[name] = calls.get(name, 0) + int(g)
    before, top = {}, None
    comp, busy = tl.kind == "compute", tl.kind != "memory"
    if arrived is not None and len(arrived):
        # each arrival's computation and idle time since the rank's previous collective end
        a = arrived.sort_values("arrival_ns")
        prev_end = np.concatenate([[np.iinfo(np.int64).min], a["end_ns"].to_numpy(np.int64)[:-1]])
        first = int(tl.start.min()) if len(tl.start) else 0
        lo = np.maximum(prev_end, first)
        hi = a["arrival_ns"].to_numpy(np.int64)
        lo = np.minimum(lo, hi)
        z = np.zeros(len(lo), np.int64)
        c = intervals.covered(_set(tl.start[comp], tl.end[comp]), z, lo, hi)
        b = intervals.covered(_set(tl.start[busy], tl.end[busy]), z, lo, hi)
        before = {inst: (ci, gi) for inst, ci, gi in zip(a["instance"].tolist(), c.tolist(), (hi - lo - b).tolist())}
    if late_ns is not None:  # its longest computation kernel (by name) before its late arrivals
        cp = np.flatnonzero(comp & (tl.end <= late_ns))
        if len(cp):
            top = pd.Series(tl.end[cp] - tl.start[cp]).groupby(tl.names[cp]).sum().idxmax()
    return RankDigest(tl.run_id, tl.rank, tl.exposed, parts, calls, before, top)


def _label_part(tl: bd.RankTimeline, label: str):
    """``(exposed time of the label's segments, [(next kernel, gate, time_ns), ...])`` of one rank, summed per
    name pair in order of first appearance (names shortened; a missing kernel is ``None``, its shortened name
    ``"None"`` for the gate pairs), or None where none of the label's time is exposed."""
    keep = np.flatnonzero(tl.label == bd.LABELS.index(label))
    if not len(keep) or not len(tl.exposed):
        return None
    got = intervals.covered(tl.exposed, np.zeros(len(keep), np.int64), tl.seg_start[keep], tl.seg_end[keep])
    n = int(got.sum())
    if n == 0:
        return None
    nk, gt = tl.next_kernel[keep], tl.gate[keep]
    kernel = np.where(nk >= 0, tl.names[np.maximum(nk, 0)], None) if len(tl.names) else np.full(len(keep), None)
    gate = np.where(gt >= 0, tl.names[np.maximum(gt, 0)], None) if len(tl.names) else np.full(len(keep), None)
    if label != "dependent":  # the next kernel alone, where there is one
        has = pd.notna(kernel)
        kernel, gate, got = kernel[has], np.full(int(has.sum()), None), got[has]
    short = {}  # each distinct name once
    ks = [short.get(k) or short.setdefault(k, _short(k)) for k in kernel.tolist()]
    gs = [short.get(g) or short.setdefault(g, _short(g)) for g in gate.tolist()] if label == "dependent" else [None] * len(ks)
    sums: dict = {}
    for k, g, t in zip(ks, gs, got.tolist()):
        sums[(k, g)] = sums.get((k, g), 0) + t
    return n, [(k, g, t) for (k, g), t in sums.items()]


def _rank_arrivals(arr: pd.DataFrame) -> tuple[dict, dict, dict]:
    """Of the arrivals table, per ``(run_id, rank)``: :func:`overlapviz.analysis.breakdown.rank_waits`' arrays,
    the rank's rows, and its latest arrival at the instances it arrived at last."""
    if not len(arr):
        return {}, {}, {}
    waits, rows = {}, {}
    for key, g in arr.groupby(["run_id", "rank"], sort=False):
        key = (key[0], int(key[1]))
        waits[key] = (g["arrival_ns"].to_numpy(np.int64), g["last_arrival_ns"].to_numpy(np.int64))
        rows[key] = g
    last = arr.loc[arr["straggler"].to_numpy(np.int64) == arr["rank"].to_numpy(np.int64)]
    late = {(r, int(k)): int(v) for (r, k), v in last.groupby(["run_id", "rank"])["arrival_ns"].max().items()}
    return waits, rows, late


def _arrivals(dataset_path, explained: pd.DataFrame, run_ids) -> pd.DataFrame:
    """:func:`overlapviz.analysis.breakdown.arrivals` of the communication kernels (``explained``'s
    comm records carry every column it needs)."""
    comm = explained.loc[explained["kind"] == "comm", bd.ARRIVAL_COLUMNS] if len(explained) else explained
    if not len(comm):
        return bd.arrivals(comm)
    for c in ("run_id", "name", "kind", "collective", "comm_group"):
        comm = comm.assign(**{c: comm[c].astype(object).where(comm[c].notna(), None)})
    return bd.arrivals(comm.astype({"start_ns": np.int64, "end_ns": np.int64}), clocks.clock_domains(dataset_path, run_ids))


def _label(instance: str, collective) -> str:
    """``all_reduce #3`` from ``pos:group:all_reduce#3`` / ``seq:group#12``."""
    tail = instance.split(":")[-1]
    if instance.startswith("seq:"):
        return f"{collective or 'collective'} seq {tail.split('#')[-1]}"
    name, _, n = tail.rpartition("#")
    return f"{name or collective} #{n}"


def _set(start, end) -> intervals.IntervalSet:
    start, end = np.asarray(start, np.int64), np.asarray(end, np.int64)
    return intervals.merge(np.zeros(len(start), np.int64), start, end)


def _measure_in(tl: bd.RankTimeline, s: intervals.IntervalSet) -> int:
    """Length of ``s`` inside ``tl``'s exposed communication."""
    if not len(s) or not len(tl.exposed):
        return 0
    return int(intervals.covered(tl.exposed, np.zeros(len(s), np.int64), s.start, s.end).sum())


def _stragglers(run_id: str, tls: list, arr: pd.DataFrame) -> list[dict]:
    if not len(arr):
        return []
    tl_of = {t.rank: t for t in tls}
    n_instances = arr["instance"].nunique()
    out, before_of = [], None
    for straggler, mine in arr.groupby("straggler", sort=True):
        straggler = int(straggler)
        late = mine["instance"].unique()
        waited = 0
        waiting = []
        for rank, w in mine.loc[mine["rank"] != straggler].groupby("rank"):
            t = tl_of.get(int(rank))
            if t is None:
                continue
            got = _measure_in(t, _set(w["arrival_ns"], w["last_arrival_ns"]))
            if got:
                waited += got
                waiting.append(int(rank))
        if waited == 0:
            continue
        if before_of is None:  # instance -> rank (ascending) -> (compute, idle), once per run
            before_of = {}
            for r, t in sorted(tl_of.items()):
                for inst, v in t.before.items():
                    before_of.setdefault(inst, {})[r] = v
        before = _before_arrival(arr.loc[arr["instance"].isin(late)], tl_of, before_of, straggler)
        evidence = []
        for inst, g in mine.groupby("instance", sort=False):
            wait = int(g["wait_ns"].sum())
            evidence.append({"instance": inst, "collective": g["collective"].iloc[0], "straggler": straggler,
                             "arrival_ns": int(g["last_arrival_ns"].iloc[0]), "time_ns": wait,
                             "label": _label(inst, g["collective"].iloc[0]), **before["per_instance"].get(inst, {})})  # fmt: skip
        evidence.sort(key=lambda e: -e["time_ns"])
        names = ", ".join(e["label"] for e in evidence[:_LIST]) + (", …" if len(evidence) > _LIST else "")
        c, mc, gap, mg = before["compute_ns"], before["median_compute_ns"], before["idle_ns"], before["median_idle_ns"]
        doing = (f"Before those arrivals rank {straggler} computed {format_ns(c)} (median rank {format_ns(mc)}) and ran "
                 f"nothing for {format_ns(gap)} (median rank {format_ns(mg)}).")  # fmt: skip
        if c == mc == gap == mg == 0:  # the late arrivals are the ranks' first activities in the trace
            doing = (f"The trace holds nothing of rank {straggler} or the others before those arrivals, so what kept it "
                     "is outside the trace.")  # fmt: skip
            action = (f"Profile a longer window (start the profiler earlier) to see what rank {straggler} did before "
                      "these collectives.")  # fmt: skip
        elif c - mc >= gap - mg and c > mc:
            top = before["top_kernel"]
            action = (f"Balance the work across ranks: rank {straggler}'s computation before these collectives ran "
                      f"{format_ns(c - mc)} longer than the median rank's" + (f" (longest kernel: {top})" if top else "") + ".")  # fmt: skip
        elif gap > mg:
            action = (f"Find what held rank {straggler}'s host before these collectives (data loading, host syncs, Python "
                      f"work): it ran nothing for {format_ns(gap - mg)} longer than the median rank.")  # fmt: skip
        else:
            action = (f"Rank {straggler} arrived last without more computation or idle GPU time than the median rank: look "
                      "at what delayed its launches (host, network, other processes on its GPU).")  # fmt: skip
        text = (f"Rank {straggler} started {len(late)} of {n_instances} collective instances last ({names}); the other "
                f"ranks waited {format_ns(waited)} for it with nothing else to run. {doing}")  # fmt: skip
        out.append({"run_id": run_id, "kind": "straggler", "time_ns": waited, "ranks": [straggler], "waiting_ranks": waiting,
                    "evidence": evidence, "action": action, "text": text})  # fmt: skip
    return out


def _before_arrival(late: pd.DataFrame, tl_of: dict, before_of: dict, straggler: int) -> dict:
    """Computation and idle time of each rank between its previous collective and its arrival at
    each of ``late``'s instances (``before_of``: instance -> rank -> :class:`RankDigest`'s ``before``);
    the straggler's sums against the median of the other ranks'."""
    per_instance = {}
    tot = {"compute_ns": 0, "median_compute_ns": 0, "idle_ns": 0, "median_idle_ns": 0}
    for inst in late["instance"].unique():
        got = before_of.get(inst, {})
        if straggler not in got:
            continue
        others = [r for r in got if r != straggler] or list(got)  # the median of the ranks that waited
        cs = [got[r][0] for r in others]
        gs = [got[r][1] for r in others]
        row = {"compute_ns": got[straggler][0], "median_compute_ns": int(np.median(cs)),
               "idle_ns": got[straggler][1], "median_idle_ns": int(np.median(gs))}  # fmt: skip
        per_instance[inst] = row
        for k2 in tot:
            tot[k2] += row[k2]
    tot["per_instance"] = per_instance
    t = tl_of.get(straggler)
    tot["top_kernel"] = _short(t.top_kernel) if t is not None and t.top_kernel is not None else None
    return tot


def _short(name) -> str:
    name = str(name)
    return name if len(name) <= 80 else name[:77] + "…"


def _pairs(tls: list, label: str) -> tuple[int, list[int], pd.DataFrame]:
    """The exposed time of ``label`` per rank and its time per (next kernel, gate) with the ranks behind it
    (:class:`RankDigest`'s ``parts``, summed over the ranks in order of first appearance)."""
    total, ranks, sums = 0, [], {}
    for t in tls:
        part = t.parts.get(label)
        if part is None:
            continue
        total += part[0]
        ranks.append(t.rank)
        for k, g, n in part[1]:
            acc = sums.setdefault((k, g), [0, set()])
            acc[0] += n
            acc[1].add(int(t.rank))
    segs = pd.DataFrame({"kernel": [k for k, _ in sums], "gate": [g for _, g in sums],
                         "time_ns": np.array([v[0] for v in sums.values()], np.int64),
                         "ranks": [sorted(v[1]) for v in sums.values()]})  # fmt: skip
    return total, ranks, segs


def _dependent(run_id: str, tls: list) -> list[dict]:
    total, ranks, segs = _pairs(tls, "dependent")
    if not total:
        return []
    top = segs.set_index(["kernel", "gate"])[["time_ns", "ranks"]]  # summed per pair as it is read (_label_part)
    top = top.sort_values("time_ns", ascending=False).reset_index()
    evidence = [{"kernel": r.kernel, "waited_on": r.gate, "ranks": r.ranks, "time_ns": int(r.time_ns)} for r in top.head(_LIST).itertuples()]
    first = evidence[0]
    text = (f"{format_ns(total)} of exposed communication on {len(ranks)} rank(s) had nothing to overlap: the next "
            f"computation needed its result ({first['kernel']} waited on {first['waited_on']}, {format_ns(first['time_ns'])}).")  # fmt: skip
    action = ("Give the collective independent work: start it earlier (bucket gradients so the all-reduce runs during the "
              "backward pass; prefetch the next layer's parameters), or move computation that does not need its result "
              "before the wait; a collective on the computation's own stream serializes everything after it: run it on a "
              "stream of its own.")  # fmt: skip
    return [{"run_id": run_id, "kind": "dependent", "time_ns": total, "ranks": ranks, "evidence": evidence, "action": action, "text": text}]


def _host_idle(run_id: str, tls: list) -> list[dict]:
    total, ranks, segs = _pairs(tls, "host_idle")
    if not total:
        return []
    evidence = []
    # the host calls that blocked the launching threads during the idle time (per rank: RankDigest.host_calls)
    calls: dict[str, int] = {}
    for t in tls:
        for name, g in t.host_calls.items():
            calls[name] = calls.get(name, 0) + g
    for name, n in sorted(calls.items(), key=lambda kv: -kv[1])[:_LIST]:
        evidence.append({"host_call": name, "time_ns": n})
    nxt = segs.dropna(subset=["kernel"]).assign(kernel=lambda d: d["kernel"].map(_short))
    if len(nxt):
        top = nxt.groupby("kernel")["time_ns"].sum().sort_values(ascending=False).head(_LIST)
        evidence += [{"next_kernel": k, "time_ns": int(v)} for k, v in top.items()]
    where = (f"; the host sat in {evidence[0]['host_call']} for {format_ns(evidence[0]['time_ns'])} of it"
             if evidence and "host_call" in evidence[0] else "")  # fmt: skip
    text = (f"{format_ns(total)} of exposed communication on {len(ranks)} rank(s) ran while the host had launched no "
            f"computation to overlap{where}.")  # fmt: skip
    action = ("Launch independent computation before anything waits on the collective: remove host synchronizations "
              "(.item(), .cpu(), torch.cuda.synchronize, blocking copies) between the collective's launch and the next "
              "computation, and keep data loading and Python work off that path (CUDA graphs remove launch gaps).")  # fmt: skip
    return [{"run_id": run_id, "kind": "host_idle", "time_ns": total, "ranks": ranks, "evidence": evidence, "action": action, "text": text}]


def _exposed_other(run_id: str, tls: list) -> list[dict]:
    """The breakdown's ``exposed_other_ns``: exposed communication while the next computation had
    been launched and waited on something other than communication."""
    total, ranks, segs = _pairs(tls, "other")
    if not total:
        return []
    nxt = segs.dropna(subset=["kernel"]).assign(kernel=lambda d: d["kernel"].map(_short))
    evidence = []
    if len(nxt):
        top = nxt.groupby("kernel")["time_ns"].sum().sort_values(ascending=False).head(_LIST)
        evidence = [{"next_kernel": k, "time_ns": int(v)} for k, v in top.items()]
    first = f" (the next computation: {evidence[0]['next_kernel']}, {format_ns(evidence[0]['time_ns'])})" if evidence else ""
    text = (f"{format_ns(total)} of exposed communication on {len(ranks)} rank(s) ran while the next computation, already "
            f"launched, waited on something other than communication{first}.")  # fmt: skip
    action = ("See what held that computation back (`overlapviz explain --all-kernels`: its stream, its event waits, "
              "copies ahead of it) and start it beside the collective.")  # fmt: skip
    return [{"run_id": run_id, "kind": "exposed_other", "time_ns": total, "ranks": ranks, "evidence": evidence,
             "action": action, "text": text}]  # fmt: skip


_CAUSE_TEXT = {
    "stream_order": ("ran on a stream shared with computation or copies, queued behind them, with nothing beside them",
                     "Put the collective on a stream of its own (with an event wait where it needs the computation's "
                     "result), so that independent computation can run beside it."),
    "dependency": ("waited for the events their stream was made to wait on, once the stream was free (their input came late)",
                   "Start the collective on a smaller first piece (bucketing) so its input is ready earlier, or move "
                   "the work that produces its input earlier."),
    "launch_latency": ("started within the launch path's latency (50 µs) once ready",
                       "Nothing to win per collective; fewer, larger collectives or CUDA graphs remove the launches."),
    "unknown": ("started more than 50 µs after they were ready with room on the SMs, for a reason the trace does not show",
                "Record with cuda_sync events or Nsight Systems (NCCL proxy, channels, another process on the GPU) to see what held them."),
    "launch_call": ("waited inside their own launch call (module loading, the first NCCL launch of a process)",
                    "Warm up: run one collective of each kind before profiling or timing, so the launch call is short."),
}


def _start_delays(dataset_path, run_id: str, ex: pd.DataFrame, runs: pd.DataFrame, device, tl_of: dict) -> list[dict]:
    if not len(ex):
        return []
    out = []
    for part in ("sm_resources",) + tuple(_CAUSE_TEXT):
        if part == "stream_order":
            out += _shared_stream(run_id, ex, tl_of)
            continue
        lo, hi = explain_lib.part_waits(ex, part)
        has = (lo >= 0) & (hi > lo)
        if not has.any():
            continue
        d = ex.loc[has]
        lo, hi = lo[has], hi[has]
        total, ranks = 0, []
        rank = d["rank"].to_numpy(np.int64)
        for r in np.unique(rank).tolist():
            m = rank == r
            n = int(intervals.measure(_set(lo[m], hi[m]), 1)[0])
            if n:
                total += n
                ranks.append(int(r))
        if not total:
            continue
        d = d.assign(wait=hi - lo)
        if part == "sm_resources":
            out.append(_sm_finding(dataset_path, run_id, d, total, ranks, runs, device))
            continue
        what, action = _CAUSE_TEXT[part]
        top = d.sort_values("wait", ascending=False).head(_LIST)
        evidence = [{"rank": int(r.rank), "start_ns": int(r.start_ns), "name": _short(r.name),
                     "stream": None if pd.isna(r.stream) else int(r.stream), "time_ns": int(r.wait),
                     **({"behind": _short(r.stream_previous)} if part == "stream_order" and not pd.isna(r.stream_previous) else {})}
                    for r in top.itertuples()]  # fmt: skip
        text = f"{len(d)} collective kernel(s) {what}: {format_ns(total)} of waiting on {len(ranks)} rank(s)."
        out.append({"run_id": run_id, "kind": part, "time_ns": total, "ranks": ranks, "evidence": evidence, "action": action, "text": text})
    return out


def _shared_stream(run_id: str, ex: pd.DataFrame, tl_of: dict) -> list[dict]:
    """``stream_order``: collectives queued behind computation or copies on their own stream. The wait
    itself is mostly the host running ahead of the GPU; what it costs is that such a collective runs
    after that work, with nothing to overlap: the finding's time is those collectives' exposed time
    (per rank the union of their intervals inside the exposed communication)."""
    lo, hi = explain_lib.part_waits(ex, "stream_order")
    has = (lo >= 0) & (hi > lo)
    if not has.any():
        return []
    d = ex.loc[has]
    total, ranks, evidence = 0, [], []
    for rank, g in d.groupby("rank", sort=True):
        t = tl_of.get(int(rank))
        if t is None:
            continue
        got = intervals.covered(t.exposed, np.zeros(len(g), np.int64), g["start_ns"].to_numpy(np.int64), g["end_ns"].to_numpy(np.int64))
        n = _measure_in(t, _set(g["start_ns"], g["end_ns"]))
        if n:
            total += n
            ranks.append(int(rank))
            for r, e in zip(g.itertuples(), got.tolist()):
                if e:
                    evidence.append({"rank": int(rank), "start_ns": int(r.start_ns), "name": _short(r.name),
                                     "stream": None if pd.isna(r.stream) else int(r.stream),
                                     "behind": None if pd.isna(r.stream_previous) else _short(r.stream_previous), "time_ns": int(e)})  # fmt: skip
    if not total:
        return []
    evidence = sorted(evidence, key=lambda e: -e["time_ns"])[:_LIST]
    what, action = _CAUSE_TEXT["stream_order"]
    n_k = len(d)
    text = f"{n_k} collective kernel(s) {what}: {format_ns(total)} of their time exposed on {len(ranks)} rank(s)."
    return [{"run_id": run_id, "kind": "stream_order", "time_ns": total, "ranks": ranks, "evidence": evidence, "action": action,
             "text": text}]  # fmt: skip


def _sm_finding(dataset_path, run_id, d: pd.DataFrame, total: int, ranks: list, runs: pd.DataFrame, device) -> dict:
    blockers = (d.groupby(["ready_blocker", "ready_blocking_resource"], dropna=False)["wait"].agg(["sum", "count"])
                .sort_values("sum", ascending=False).reset_index())  # fmt: skip
    evidence = [{"blocker": None if pd.isna(r.ready_blocker) else _short(r.ready_blocker),
                 "resource": None if pd.isna(r.ready_blocking_resource) else r.ready_blocking_resource,
                 "collectives": int(r.count), "time_ns": int(r.sum)} for r in blockers.head(_LIST).itertuples()]  # fmt: skip
    top = evidence[0] if evidence else {"blocker": None, "resource": None}
    resource = (top["resource"] or "resources").replace("_", " ")
    text = (f"{len(d)} collective kernel(s) were held off the SMs by {top['blocker'] or 'resident computation'} "
            f"({resource}): {format_ns(total)} of waiting to start on {len(ranks)} rank(s).")  # fmt: skip
    action = ("Put the collective on a high-priority stream (torch.cuda.Stream(priority=-1); ProcessGroupNCCL's "
              "is_high_priority_stream) so its blocks are scheduled first as the computation's blocks retire.")  # fmt: skip
    same = _same_workload(run_id, runs, dataset_path)
    if same is not None:
        action += " " + _priority_measured(*same)
    pad = _padding(dataset_path, d, device)
    if pad is not None:
        slower = _padding_measured(pad[1], *same) if same is not None else None
        if slower:
            action += f" Shaping the occupancy instead ({pad[0]}) does not pay here: {slower}"
        else:
            action += f" Or shape the computation's occupancy: {pad[0]}."
    return {"run_id": run_id, "kind": "sm_resources", "time_ns": total, "ranks": ranks, "evidence": evidence, "action": action, "text": text}


def _padding(dataset_path, d: pd.DataFrame, device) -> tuple[str, int] | None:
    """The advisor's smallest shared-memory padding that fits one communication block beside
    the blocker of the longest-waiting collective, in words, and its bytes (None where it cannot say)."""
    from overlapviz.analysis import budget

    # the longest wait, among those the SM model places at ready first (the budget is drawn there)
    worst = d.assign(_at_ready=(d["cause"] == "sm_resources")).sort_values(["_at_ready", "wait"], ascending=False)
    try:
        options = budget.what_if_options(dataset_path, worst.iloc[0].drop("_at_ready").to_dict(), device=device)
    except (ValueError, KeyError):
        return None
    if not len(options):
        return None
    pads = options.loc[(options["lever"] == "smem_pad") & options["meets_target"].astype(bool)]
    if not len(pads):
        return None
    p = pads.iloc[0]
    name = _short(worst.iloc[0]["ready_blocker"]) if not pd.isna(worst.iloc[0]["ready_blocker"]) else "the computation"
    carve = p.get("carveout")
    extra = f" with a {int(carve)} % shared-memory carve-out preference" if carve is not None and not pd.isna(carve) else ""
    return (f"padding {name}'s shared memory by {int(p['smem_pad_bytes']):,} B per block{extra} leaves "
            f"{int(p['compute_blocks_per_sm'])} of its blocks per SM and fits one communication block (overlapviz advise)",
            int(p["smem_pad_bytes"]))


def _same_workload(run_id: str, runs: pd.DataFrame, dataset_path):
    """``(this run's row, the other runs of the same workload)`` of the configuration table, with
    measured iteration times (an experiment sweep); None for imported traces or without times."""
    from overlapviz.analysis import speedup

    if "workload" not in runs or runs.loc[runs["run_id"] == run_id, "workload"].isna().all():
        return None
    try:
        table = speedup.config_table(dataset_path)
    except ValueError:
        return None
    me = table.loc[table["run_id"] == run_id]
    if not len(me) or pd.isna(me["median_ms"].iloc[0]):
        return None
    me = me.iloc[0]
    same = table
    for c in [c for c in speedup.WORKLOAD_KEY if c in table]:
        same = same.loc[(same[c] == me[c]) | (same[c].isna() & pd.isna(me[c]))]
    same = same.loc[(same["run_id"] != run_id) & (same["setup"] != "sequential") & same["median_ms"].notna()]
    return me, same


def _num(v, default=0):
    return default if v is None or pd.isna(v) else v


def _priority_measured(me, same: pd.DataFrame) -> str:
    """What the dataset measured of a higher collective priority: at this run's padding and carve-out
    (one control changed) where it can, else with other settings too (said so)."""
    prio = pd.to_numeric(same["comm_priority"], errors="coerce").fillna(0)
    higher = same.loc[prio < _num(me["comm_priority"])]
    pads = pd.to_numeric(higher["smem_pad_bytes"], errors="coerce").fillna(0)
    carve = pd.to_numeric(higher["sm_carveout"], errors="coerce").fillna(-1)
    alone = higher.loc[(pads == _num(me["smem_pad_bytes"])) & (carve == _num(me["sm_carveout"], -1))]
    pick, alone_ok = (alone, True) if len(alone) else (higher, False)
    if not len(pick):
        return "This dataset holds no run of the same workload at a higher collective priority to measure it."
    best = pick.sort_values("median_ms").iloc[0]
    ratio = float(me["median_ms"]) / float(best["median_ms"])
    also = "" if alone_ok else (f", padding {int(_num(best['smem_pad_bytes'])):,} B" if _num(best["smem_pad_bytes"]) else "")
    what = (f"the same workload at priority {int(best['comm_priority'])}{also} (run {best['run_id']}) took "
            f"{best['median_ms']:.3f} ms per iteration against this run's {me['median_ms']:.3f} ms")  # fmt: skip
    if ratio < 1.01:
        return f"Measured in this dataset: {what}, no faster."
    return f"Measured in this dataset: {what} ({ratio:.2f}x faster)."


def _padding_measured(pad_bytes: int, me, same: pd.DataFrame) -> str | None:
    """Where the dataset measured the same workload padded at least as much as the advisor proposes, and
    every such run was slower than this one, that in words (shaping costs more than it wins); else None."""
    pads = pd.to_numeric(same["smem_pad_bytes"], errors="coerce").fillna(0)
    padded = same.loc[pads >= pad_bytes]
    if not len(padded):
        return None
    best = padded.sort_values("median_ms").iloc[0]
    if float(best["median_ms"]) <= float(me["median_ms"]):
        return None
    return (f"the dataset measured the same workload padded by {int(_num(best['smem_pad_bytes'])):,} B slower "
            f"(run {best['run_id']}: {best['median_ms']:.3f} ms per iteration against this run's {me['median_ms']:.3f} ms), "
            "the computation losing more than the collective wins.")


def compare_runs(dataset_path: str | os.PathLike, run_a: str, run_b: str, *, device: str | None = None,
                 found: pd.DataFrame | None = None, totals: pd.DataFrame | None = None) -> tuple[pd.DataFrame, str]:  # fmt: skip
    """Two runs' answers side by side, and in one sentence what changed most.

    Parameters
    ----------
    found, totals
        :func:`findings` and :func:`overlapviz.analysis.breakdown.run_totals` of (at least) both runs, when
        already computed.

    Returns
    -------
    (pandas.DataFrame, str)
        Rows ``section`` (``breakdown``: the run's breakdown summed over its ranks; ``finding``: the time of
        each kind of finding), ``item``, ``a_ns``, ``b_ns``, ``delta_ns`` (B − A, int64 ns), sorted within
        each section by the size of the change; and the sentence naming the exposed-time part or
        finding whose time changed most (why B is faster or slower).
    """
    if totals is None or found is None:
        both = answer(dataset_path, run_ids=[run_a, run_b], device=device)
        found, totals = (both[0] if found is None else found), (both[1] if totals is None else totals)
    tot = totals.set_index("run_id")
    rows = []
    for col in bd.COLUMNS:
        a = int(tot.loc[run_a, col]) if run_a in tot.index else 0
        b = int(tot.loc[run_b, col]) if run_b in tot.index else 0
        rows.append({"section": "breakdown", "item": col, "a_ns": a, "b_ns": b, "delta_ns": b - a})
    for r in changes_by_kind(found, run_a, run_b).to_dict("records"):
        rows.append({"section": "finding", "item": r["kind"], "a_ns": r["a_ns"], "b_ns": r["b_ns"], "delta_ns": r["delta_ns"]})
    out = pd.DataFrame(rows, columns=["section", "item", "a_ns", "b_ns", "delta_ns"])
    out = out.assign(_o=out["section"].map({"breakdown": 0, "finding": 1}), _d=-out["delta_ns"].abs())
    fixed = out["item"].isin(["comm_ns", "overlapped_ns", "exposed_ns"])
    out = pd.concat([out.loc[fixed], out.loc[~fixed].sort_values(["_o", "_d"], kind="stable")]).drop(columns=["_o", "_d"])
    return out.reset_index(drop=True), _why(out, found, run_a, run_b)


def changes_by_kind(found: pd.DataFrame, run_a: str, run_b: str) -> pd.DataFrame:
    """The time of each kind of finding in two runs: ``kind, a_ns, b_ns, delta_ns`` (B − A, int64 ns),
    the largest change first (kinds in :data:`KINDS` order on ties)."""
    per = found.groupby(["run_id", "kind"])["time_ns"].sum() if len(found) else pd.Series(dtype="int64")
    rows = [{"kind": k, "a_ns": int(per.get((run_a, k), 0)), "b_ns": int(per.get((run_b, k), 0))}
            for k in KINDS if (run_a, k) in per.index or (run_b, k) in per.index]  # fmt: skip
    out = pd.DataFrame(rows, columns=["kind", "a_ns", "b_ns"]).astype({"a_ns": "int64", "b_ns": "int64"})
    out["delta_ns"] = out["b_ns"] - out["a_ns"]
    return out.iloc[np.argsort(-out["delta_ns"].abs().to_numpy(), kind="stable")].reset_index(drop=True)


def _why(table: pd.DataFrame, found: pd.DataFrame, run_a: str, run_b: str) -> str:
    exp = table.set_index("item").loc["exposed_ns"] if "exposed_ns" in set(table["item"]) else None
    movers = table.loc[~table["item"].isin(["comm_ns", "overlapped_ns", "exposed_ns"]) & (table["delta_ns"] != 0)]
    if exp is None or not len(movers):
        return "The two runs' communication time went to the same places."
    top = movers.iloc[movers["delta_ns"].abs().argmax()]
    d = int(exp["delta_ns"])
    head = (f"B exposes {format_ns(-d)} less communication than A" if d < 0 else
            f"B exposes {format_ns(d)} more communication than A" if d > 0 else "A and B expose the same communication")  # fmt: skip
    name = str(top["item"]).removesuffix("_ns").replace("_", " ")
    what = "finding" if top["section"] == "finding" else "part"
    line = f"{head}; the {what} that changed most is {name}: {format_ns(top['a_ns'])} in A, {format_ns(top['b_ns'])} in B"
    if top["section"] == "finding":
        side = run_a if top["delta_ns"] < 0 else run_b
        text = found.loc[(found["run_id"] == side) & (found["kind"] == top["item"]), "text"]
        if len(text):
            line += f" ({'A' if side == run_a else 'B'}: {text.iloc[0]})"
    return line + "."
