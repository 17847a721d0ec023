"""Where communication time went (DESIGN.md): each rank's exposed communication split exactly into peer wait, dependent, host idle and other.

For one rank, ``E`` is the exposed communication time, the union of its communication
activities minus the union of its computation (``exposed_comm_us`` of ``analyze``). Every
instant ``t`` of the rank's communication is given one label, the first that holds:

1. ``peer_wait``: a collective instance the rank has started at ``t`` is not yet started by
   its last rank: ``t`` in ``[this rank's start, the latest start among the instance's
   ranks)``. A rank's start of an instance is its first activity of it; instances are
   matched across ranks as :func:`overlapviz.analysis.peers.instance_keys` does. Never
   across ranks whose clocks do not compare (:mod:`overlapviz.analysis.clocks`).
2. ``dependent``: the device's next computation kernel (the first to start after ``t``;
   with ties, any of them) is gated on a communication activity running at ``t``: one on
   the kernel's own stream (stream order), or one on the stream of the producer of the
   event the kernel waited on, enqueued no later than that producer (the producer is that
   communication, or comes after it on its stream).
3. ``host_idle``: every computation kernel that starts after ``t`` was launched after ``t``
   (none known to be launched before; a kernel whose launch the trace lacks is not known
   to be launched after): the host had given the GPU nothing to overlap.
4. ``other``: the rest.

``peer_wait_ns``, ``dependent_ns``, ``host_idle_ns`` and ``exposed_other_ns`` are the
measures of ``E`` under each label, so they add up to ``exposed_ns`` exactly, in int64
ns. Per step, ``E`` is the step's own (its activities, as ``analyze --per step``), the
labels the rank's.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from overlapviz.dataset import schema
from overlapviz.analysis import clocks, intervals, peers
from overlapviz.analysis import explain
from overlapviz.analysis.explain import int_column, per_rank, str_column, rank_links

__all__ = ["PARTS", "COLUMNS", "LABELS", "READ", "breakdown", "run_totals", "arrivals", "rank_waits", "rank_timelines", "comm_arrivals", "totals_of",
           "timeline_of", "group_rows", "finish", "RankTimeline"]

LABELS = ("peer_wait", "dependent", "host_idle", "other")
PARTS = ("peer_wait_ns", "dependent_ns", "host_idle_ns", "exposed_other_ns")
COLUMNS = ("comm_ns", "overlapped_ns", "exposed_ns") + PARTS
_NEVER = np.iinfo(np.int64).min  # a launch the trace lacks: never "after" any instant


@dataclass
class RankTimeline:
    """One rank's communication time cut into labelled segments (module docstring).

    ``seg_start``/``seg_end`` (int64 ns) cover the rank's communication; ``label`` indexes
    :data:`LABELS`; ``next_kernel`` is the row of the next computation kernel (-1 none) and
    ``gate`` the row of the communication activity it was gated on (-1 none), rows of the
    rank's ``kernels`` slice, whose ``names``, ``start``, ``end``, ``launch`` and ``step``
    are kept. ``exposed`` is the rank's exposed communication (an IntervalSet of group 0)."""

    run_id: str
    rank: int
    seg_start: np.ndarray
    seg_end: np.ndarray
    label: np.ndarray
    next_kernel: np.ndarray
    gate: np.ndarray
    names: np.ndarray
    kind: np.ndarray
    start: np.ndarray
    end: np.ndarray
    launch: np.ndarray
    launch_tid: np.ndarray
    step: np.ndarray
    exposed: intervals.IntervalSet
    syncs: dict
    peers_matched: bool = False  # some instance of this rank was matched with another rank's

    def label_set(self, label: str) -> intervals.IntervalSet:
        keep = self.label == LABELS.index(label)
        return intervals.merge(np.zeros(int(keep.sum()), np.int64), self.seg_start[keep], self.seg_end[keep])


def breakdown(dataset_path: str | os.PathLike, *, run_ids=None, per: str = "rank",
              pause: Callable[[], None] | None = None) -> pd.DataFrame:  # fmt: skip
    """Where each rank's communication time went (module docstring).

    Parameters
    ----------
    dataset_path
        An overlapviz dataset.
    run_ids
        Only these runs (default: all).
    per : {"rank", "step"}
        One row per run x rank, or per run x rank x step (activities of no step left out).
    pause
        Called before each rank (the dashboard's background work yields there).

    Returns
    -------
    pandas.DataFrame
        ``run_id, rank[, step], comm_ns, overlapped_ns, exposed_ns, peer_wait_ns,
        dependent_ns, host_idle_ns, exposed_other_ns`` (int64 ns; the four parts add up to
        ``exposed_ns``), ``peers_known`` (True where some collective instance of the rank
        was matched with another rank's on a comparable clock; False: its peer wait is 0
        because none was, one rank or clocks that do not compare) and ``clock_note`` (why
        the rank's clock is kept apart). Sorted by run, rank[, step].
    """
    if per not in ("rank", "step"):
        raise ValueError(f"per={per!r}: expected rank or step")
    rows = []
    for tl in rank_timelines(dataset_path, run_ids=run_ids, pause=pause):
        rows.extend(group_rows(tl, per))
    return finish(dataset_path, rows, per, run_ids)


def finish(dataset_path, rows: list[dict], per: str, run_ids=None) -> pd.DataFrame:
    """:func:`breakdown`'s frame from :func:`group_rows`' rows of every rank (with each rank's
    ``peers_known`` and ``clock_note``), sorted."""
    keys = ["run_id", "rank"] + (["step"] if per == "step" else [])
    cols = keys + list(COLUMNS) + ["peers_known", "clock_note"]
    if not rows:
        return pd.DataFrame({c: pd.Series(dtype="int64" if c.endswith("_ns") else object) for c in cols})
    out = pd.DataFrame(rows).merge(_clock_notes(dataset_path, run_ids), on=["run_id", "rank"], how="left")
    out["peers_known"] = out["peers_known"].astype(bool)
    for c in COLUMNS:
        out[c] = out[c].astype(np.int64)
    return out[cols].sort_values(keys, kind="stable").reset_index(drop=True)


def run_totals(timelines) -> pd.DataFrame:
    """Per run, the breakdown summed over its ranks (``n_ranks`` and :data:`COLUMNS`, int64 ns), from
    :func:`rank_timelines`' timelines already computed."""
    return totals_of([row for tl in timelines for row in group_rows(tl, "rank")])


def totals_of(rank_rows: list[dict]) -> pd.DataFrame:
    """:func:`run_totals` from each rank's :func:`group_rows` row (``per="rank"``), in rank order."""
    rows: dict[str, dict] = {}
    for r in rank_rows:
        acc = rows.setdefault(r["run_id"], {"run_id": r["run_id"], "n_ranks": 0, **{c: 0 for c in COLUMNS}})
        acc["n_ranks"] += 1
        for c in COLUMNS:
            acc[c] += r[c]
    return pd.DataFrame(list(rows.values()), columns=["run_id", "n_ranks", *COLUMNS])


def group_rows(tl: RankTimeline, per: str) -> list[dict]:
    """The breakdown rows of one rank's timeline: one (``per="rank"``) or one per step."""
    kind = tl.kind
    comm, comp = kind == "comm", kind == "compute"
    if per == "step":
        step = tl.step
        has = step != -1
        codes, keys = pd.factorize(step[has], sort=True)
        group = np.full(len(step), -1, np.int64)
        group[has] = codes
        n = len(keys)
    else:
        group = np.zeros(len(kind), np.int64)
        keys, n = np.array([None]), 1
    if n == 0:
        return []
    cm, cp = comm & (group >= 0), comp & (group >= 0)
    comm_set = intervals.merge(group[cm], tl.start[cm], tl.end[cm])
    comp_set = intervals.merge(group[cp], tl.start[cp], tl.end[cp])
    exposed = intervals.subtract(comm_set, comp_set)
    comm_ns = intervals.measure(comm_set, n)
    exposed_ns = intervals.measure(exposed, n)
    parts = {}
    q = np.zeros(len(exposed), np.int64)
    for label, col in zip(LABELS[:3], PARTS[:3]):
        part = np.zeros(n, np.int64)
        if len(exposed):
            np.add.at(part, exposed.group, intervals.covered(tl.label_set(label), q, exposed.start, exposed.end))
        parts[col] = part
    other = exposed_ns - parts["peer_wait_ns"] - parts["dependent_ns"] - parts["host_idle_ns"]
    rows = []
    for i in range(n):
        row = {"run_id": tl.run_id, "rank": tl.rank, "peers_known": tl.peers_matched}
        if per == "step":
            row["step"] = int(keys[i])
        row.update(comm_ns=int(comm_ns[i]), overlapped_ns=int(comm_ns[i] - exposed_ns[i]), exposed_ns=int(exposed_ns[i]),
                   peer_wait_ns=int(parts["peer_wait_ns"][i]), dependent_ns=int(parts["dependent_ns"][i]),
                   host_idle_ns=int(parts["host_idle_ns"][i]), exposed_other_ns=int(other[i]))  # fmt: skip
        rows.append(row)
    return rows


def _clock_notes(dataset_path, run_ids) -> pd.DataFrame:
    dom = clocks.clock_domains(dataset_path, run_ids)
    return pd.DataFrame({"run_id": dom["run_id"], "rank": dom["rank"].astype(np.int64), "clock_note": dom["clock_note"]})


ARRIVAL_COLUMNS = ["run_id", "rank", "name", "kind", "collective", "comm_group", "comm_seq", "start_ns", "end_ns"]


def arrivals(comm: pd.DataFrame, domains: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per collective instance x rank: when the rank started it and the instance's last start.

    Parameters
    ----------
    comm
        Communication activities (``run_id, rank, name, collective, comm_group, comm_seq,
        start_ns, end_ns``). Not modified.
    domains
        :func:`overlapviz.analysis.clocks.clock_domains` rows; instances whose ranks span
        several clock domains are left out (their waits are not computable).

    Returns
    -------
    pandas.DataFrame
        ``run_id, instance, collective, rank, arrival_ns`` (the rank's first start of the
        instance), ``end_ns`` (its last end), ``last_arrival_ns`` (the latest arrival among
        the instance's ranks), ``straggler`` (the rank that arrived last; the lowest such
        rank on a tie), ``n_ranks``, ``wait_ns`` = last arrival − arrival. Instances seen on
        one rank only, or whose ranks' ends disagree by more than the instance lasted
        (:func:`overlapviz.analysis.peers.ends_apart`), are left out.
    """
    cols = ["run_id", "instance", "collective", "rank", "arrival_ns", "end_ns", "last_arrival_ns", "straggler",
            "n_ranks", "wait_ns"]  # fmt: skip
    if not len(comm):
        return pd.DataFrame(columns=cols)
    inst = peers.instance_keys(comm)
    d = pd.DataFrame({"run_id": comm["run_id"].to_numpy(object), "instance": inst.to_numpy(object),
                      "collective": comm["collective"].astype(object).where(comm["collective"].notna(), comm["name"]).to_numpy(object),
                      "rank": comm["rank"].to_numpy(np.int64), "start": comm["start_ns"].to_numpy(np.int64),
                      "end": comm["end_ns"].to_numpy(np.int64)})  # fmt: skip
    g = d.groupby(["run_id", "instance", "rank"], sort=False)
    per = g.agg(collective=("collective", "first"), arrival_ns=("start", "min"), end_ns=("end", "max")).reset_index()
    if domains is not None and len(domains):
        per = per.merge(domains[["run_id", "rank", "clock_domain"]].astype({"rank": np.int64}), on=["run_id", "rank"], how="left")
        per["clock_domain"] = per["clock_domain"].fillna("")
        nd = per.groupby(["run_id", "instance"])["clock_domain"].transform("nunique")
        per = per.loc[nd.to_numpy() <= 1].drop(columns="clock_domain")
    gi = per.groupby(["run_id", "instance"], sort=False)
    per["n_ranks"] = gi["rank"].transform("nunique").to_numpy(np.int64)
    apart = peers.ends_apart(gi["end_ns"].transform("min"), gi["end_ns"].transform("max"), gi["arrival_ns"].transform("max"))
    per = per.loc[(per["n_ranks"] > 1).to_numpy() & ~apart]
    if not len(per):
        return pd.DataFrame(columns=cols)
    gi = per.groupby(["run_id", "instance"], sort=False)
    per["last_arrival_ns"] = gi["arrival_ns"].transform("max").to_numpy(np.int64)
    last = per.loc[per["arrival_ns"] == per["last_arrival_ns"]].groupby(["run_id", "instance"])["rank"].min()
    per = per.merge(last.rename("straggler").reset_index(), on=["run_id", "instance"], how="left")
    per["wait_ns"] = (per["last_arrival_ns"] - per["arrival_ns"]).astype(np.int64)
    return per[cols].reset_index(drop=True)


READ = list(dict.fromkeys(explain.READ + ["comm_group", "comm_seq"]))  # the kernels columns a timeline reads
DICTIONARY = explain.DICTIONARY


def rank_waits(dataset_path, comm: pd.DataFrame, run_ids=None) -> dict:
    """Per (run_id, rank), the arrays ``(arrival_ns, last_arrival_ns)`` of its collective
    instances (:func:`arrivals` of the ``comm`` rows, within the dataset's clock domains)."""
    for c in ("run_id", "name", "kind", "collective", "comm_group"):
        comm = comm.assign(**{c: comm[c].astype(object).where(comm[c].notna(), None)})
    return waits_of(arrivals(comm, clocks.clock_domains(dataset_path, run_ids)))


def waits_of(arr: pd.DataFrame) -> dict:
    """:func:`rank_waits`' arrays from an :func:`arrivals` table."""
    return {key: (g["arrival_ns"].to_numpy(np.int64), g["last_arrival_ns"].to_numpy(np.int64))
            for key, g in arr.groupby(["run_id", "rank"], sort=False)}  # fmt: skip


def arrivals_of(dataset_path, run_ids=None, pause=None) -> pd.DataFrame:
    """:func:`arrivals` of the dataset's communication kernels (``arrivals(comm_arrivals(...), clock_domains(...))``,
    the same rows in the same order), read one rank at a time (issue 36): each rank's comm kernels are reduced to
    one row per instance it took part in (its first start, its last end) before the next rank is read, and the
    instance ids are shared strings (one per distinct id, not one per kernel)."""
    from overlapviz.analysis.rankwise import rank_tables

    cols = ["run_id", "instance", "collective", "rank", "arrival_ns", "end_ns", "last_arrival_ns", "straggler",
            "n_ranks", "wait_ns"]  # fmt: skip
    domains = clocks.clock_domains(dataset_path, run_ids)
    dom_of = {(r, int(k)): d for r, k, d in zip(domains["run_id"].tolist(), domains["rank"].tolist(),
                                                 domains["clock_domain"].tolist())} if len(domains) else None  # fmt: skip
    ids: dict[str, str] = {}  # each distinct instance id once
    got: dict[str, list] = {k: [] for k in ("run_id", "instance", "collective", "rank", "arrival_ns", "end_ns", "domain")}
    for run_id, rank, rk, _ in rank_tables(dataset_path, ARRIVAL_COLUMNS, run_ids=run_ids, dictionary=DICTIONARY, syncs=False,
                                           pause=pause):  # fmt: skip
        c = np.flatnonzero(str_column(rk, "kind") == "comm")
        if not len(c):
            continue
        start = int_column(rk, "start_ns")[c]
        order = np.argsort(start, kind="stable")  # comm_arrivals' order: run, rank, start
        c, start = c[order], start[order]
        runs, ranks = str_column(rk, "run_id")[c], int_column(rk, "rank")[c]
        coll, name = str_column(rk, "collective")[c], str_column(rk, "name")[c]
        what = peers.collective_or_name(coll, name)
        inst = peers.instance_ids(runs, ranks, start, str_column(rk, "comm_group")[c], int_column(rk, "comm_seq")[c], what)
        inst = np.array([ids.setdefault(i, i) for i in inst.tolist()] + [None], object)[:-1]
        # one row per (instance) of this rank, in order of first appearance: its first start and last end
        code = peers.factorize(inst)
        n = int(code.max()) + 1
        first = np.full(n, len(code), np.int64)
        known = np.flatnonzero(pd.notna(what))  # pandas' "first": the first value that is not null
        np.minimum.at(first, code[known], known)
        head = np.full(n, len(code), np.int64)
        np.minimum.at(head, code, np.arange(len(code)))
        got["collective"].append(np.array([what[i] if i < len(code) else None for i in first.tolist()] + [None], object)[:-1])
        got["run_id"].append(runs[head])
        got["instance"].append(inst[head])
        got["rank"].append(ranks[head])
        got["arrival_ns"].append(peers.group_min(code, n, start, np.iinfo(np.int64).max))
        got["end_ns"].append(peers.group_max(code, n, int_column(rk, "end_ns")[c], np.iinfo(np.int64).min))
        got["domain"].append(np.full(n, "" if dom_of is None else (dom_of.get((run_id, rank)) or ""), object))
        del rk, inst, what, coll, name
    if not got["rank"]:
        return pd.DataFrame(columns=cols)
    per = {k: np.concatenate(v) for k, v in got.items()}
    del got
    g = peers.factorize(per["run_id"], per["instance"])  # the instances, in order of first appearance
    n = int(g.max()) + 1
    keep = np.ones(len(g), bool)
    if dom_of is not None:  # instances whose ranks span clock domains are left out
        nd = np.bincount(np.unique(np.stack([g, peers.factorize(per["domain"])]), axis=1)[0], minlength=n)
        keep = nd[g] <= 1
    n_ranks = np.bincount(g, minlength=n).astype(np.int64)
    big, small = np.iinfo(np.int64).max, np.iinfo(np.int64).min
    last = peers.group_max(g, n, per["arrival_ns"], small)
    apart = peers.ends_apart(peers.group_min(g, n, per["end_ns"], big), peers.group_max(g, n, per["end_ns"], small), last)
    keep &= (n_ranks > 1)[g] & ~apart[g]
    if not keep.any():
        return pd.DataFrame(columns=cols)
    at_last = per["arrival_ns"] == last[g]
    straggler = peers.group_min(g[at_last], n, per["rank"][at_last], big)
    rows = np.flatnonzero(keep)
    gk = g[rows]
    out = pd.DataFrame({"run_id": per["run_id"][rows], "instance": per["instance"][rows], "collective": per["collective"][rows],
                        "rank": per["rank"][rows], "arrival_ns": per["arrival_ns"][rows], "end_ns": per["end_ns"][rows],
                        "last_arrival_ns": last[gk], "straggler": straggler[gk], "n_ranks": n_ranks[gk],
                        "wait_ns": (last[gk] - per["arrival_ns"][rows]).astype(np.int64)})  # fmt: skip
    return out[cols]


def rank_timelines(dataset_path, *, run_ids=None, pause=None):
    """Yield a :class:`RankTimeline` per run x rank, in run, rank order (one rank's kernels read at a time)."""
    from overlapviz.analysis.rankwise import rank_tables

    waits = waits_of(arrivals_of(dataset_path, run_ids))
    for run_id, rank, rk, rs in rank_tables(dataset_path, READ, run_ids=run_ids, dictionary=DICTIONARY, pause=pause):
        yield timeline_of(run_id, rank, rk, rs, waits.get((run_id, rank)))


def comm_arrivals(dataset_path, run_ids=None) -> pd.DataFrame:
    """The communication kernels' :data:`ARRIVAL_COLUMNS` (what :func:`rank_waits` and :func:`arrivals` read), in
    ``explain``'s order (run, rank, start), without reading the other kernels' rows."""
    comm = schema.read_kernels(dataset_path, columns=ARRIVAL_COLUMNS, run_ids=run_ids, filter=pc.field("kind") == "comm",
                               dictionary=("run_id", "name", "kind", "collective", "comm_group"))  # fmt: skip
    comm = comm.to_pandas()
    for c in ("run_id", "name", "kind", "collective", "comm_group"):  # strings shared through the dictionary, as objects
        comm[c] = comm[c].astype(object).where(comm[c].notna(), None)
    return comm.sort_values(["run_id", "rank", "start_ns"], kind="stable").reset_index(drop=True) if len(comm) else comm


def timeline_of(run_id: str, rank: int, k: pa.Table, syncs: pa.Table | None, waits, links=None) -> RankTimeline:
    """The :class:`RankTimeline` of one rank's rows (``waits``: its instances' arrival and last
    arrival arrays, or None; ``links``: :func:`overlapviz.analysis.explain.rank_links` of the same
    rows, when already computed)."""
    kind = str_column(k, "kind")
    comm = np.flatnonzero(kind == "comm")
    links = rank_links(k, syncs) if links is None else links
    start, end, lane, launch = links.start, links.end, links.lane, links.launch
    comp = np.flatnonzero(kind == "compute")
    comm_set = intervals.merge(np.zeros(len(comm), np.int64), start[comm], end[comm])
    comp_set = intervals.merge(np.zeros(len(comp), np.int64), start[comp], end[comp])
    if waits is not None:
        pw = intervals.merge(np.zeros(len(waits[0]), np.int64), waits[0], waits[1])
    else:
        pw = intervals.IntervalSet.empty()
    # cut the communication time wherever a label could change: activity starts and ends,
    # computation launches, peer-wait bounds
    known_launch = launch[comp][launch[comp] != -1]
    cuts = _sorted_unique(np.concatenate([comm_set.start, comm_set.end, start[comm], end[comm], start[comp], known_launch,
                                          pw.start, pw.end]))  # fmt: skip
    lo, hi = cuts[:-1], cuts[1:]
    inside = _contains(comm_set, lo) & (hi > lo)
    lo, hi = lo[inside], hi[inside]
    n = len(lo)
    label = np.full(n, LABELS.index("other"), np.int8)
    next_k = np.full(n, -1, np.int64)
    gate = np.full(n, -1, np.int64)
    in_pw = _contains(pw, lo)
    label[in_pw] = LABELS.index("peer_wait")
    # the next computation kernel(s): the first start after t
    order = comp[np.argsort(start[comp], kind="stable")]
    cstart = start[order]
    pos = np.searchsorted(cstart, lo, side="right")
    has_next = pos < len(order)
    next_k[has_next] = order[pos[has_next]]
    # host idle: the earliest launch among the kernels starting after t is after t
    claunch = np.where(launch[order] == -1, _NEVER, launch[order])
    suffix_min = np.minimum.accumulate(claunch[::-1])[::-1] if len(order) else claunch
    first_launch = np.where(has_next, suffix_min[np.minimum(pos, max(len(order) - 1, 0))] if len(order) else 0, np.iinfo(np.int64).max)
    idle = first_launch > lo
    # dependent: a communication activity running at t gates one of the next kernels (ties too)
    running = _CommOnLanes(lane[comm], start[comm], end[comm], comm)
    dep = np.zeros(n, bool)
    j = 0
    while True:
        p = pos + j
        ok = has_next & (p < len(order))
        if j:
            ok &= cstart[np.minimum(p, len(order) - 1)] == cstart[np.minimum(pos, len(order) - 1)]
        if not ok.any():
            break
        kk = order[np.minimum(p, len(order) - 1)]
        g1 = running.at(lane[kk], lo, lo)  # its own stream
        prod = links.producer[kk]
        has_p = ok & (prod >= 0)
        pp = np.maximum(prod, 0)
        g2 = np.where(has_p, running.at(lane[pp], np.minimum(lo, start[pp]), lo), -1)
        g = np.where(g1 >= 0, g1, g2)
        hit = ok & (g >= 0) & ~dep
        gate[hit] = g[hit]
        next_k[hit] = kk[hit]
        dep |= hit
        j += 1
    free = ~in_pw
    label[free & dep] = LABELS.index("dependent")
    label[free & ~dep & idle] = LABELS.index("host_idle")
    return RankTimeline(
        run_id=run_id, rank=rank, seg_start=lo, seg_end=hi, label=label, next_kernel=next_k, gate=gate,
        names=str_column(k, "name"), kind=kind, start=start, end=end, launch=launch, launch_tid=links.launch_tid,
        step=int_column(k, "step"), exposed=intervals.subtract(comm_set, comp_set), syncs=links.syncs,
        peers_matched=waits is not None and len(waits[0]) > 0,
    )  # fmt: skip


def _sorted_unique(a: np.ndarray) -> np.ndarray:
    """``np.unique`` of int64 times by one sort (numpy 2.4's hash-based unique is ~25x slower on
    600k distinct times)."""
    a = np.sort(a)
    return a[np.r_[True, a[1:] != a[:-1]]] if len(a) else a


def _contains(s: intervals.IntervalSet, t: np.ndarray) -> np.ndarray:
    """Whether each instant of ``t`` lies in the (one-group) set ``s``."""
    if not len(s):
        return np.zeros(len(t), bool)
    i = np.searchsorted(s.start, t, side="right") - 1
    j = np.maximum(i, 0)
    return (i >= 0) & (s.end[j] > t)


class _CommOnLanes:
    """Which communication activity runs at an instant on a lane, among those enqueued by a time."""

    def __init__(self, lane, start, end, rows):
        order = np.lexsort((start, lane))
        self.lane, self.start, self.end, self.rows = lane[order], start[order], end[order], rows[order]
        # running maximum of ends within each lane (a lane's activities can overlap in a trace)
        self.reach = self.end.copy()
        for a, b in _lane_runs(self.lane):
            self.reach[a:b] = np.maximum.accumulate(self.end[a:b])

    def at(self, lanes: np.ndarray, by: np.ndarray, t: np.ndarray) -> np.ndarray:
        """Row of an activity on ``lanes`` that started no later than ``by`` and runs at ``t``
        (ends after it), -1 where none."""
        out = np.full(len(t), -1, np.int64)
        for a, b in _lane_runs(self.lane):
            q = np.flatnonzero(lanes == self.lane[a])
            if not len(q):
                continue
            i = np.searchsorted(self.start[a:b], by[q], side="right") - 1
            ok = i >= 0
            i0 = a + np.maximum(i, 0)
            hit = ok & (self.reach[i0] > t[q])
            # the activity itself: the latest-started one that still runs, else the one whose end reaches t
            own = hit & (self.end[i0] > t[q])
            out[q[own]] = self.rows[i0[own]]
            for qi, ii in zip(q[hit & ~own].tolist(), i0[hit & ~own].tolist()):
                back = np.flatnonzero(self.end[a : ii + 1] > t[qi])
                out[qi] = self.rows[a + back[-1]]
        return out


def _lane_runs(lane: np.ndarray):
    if not len(lane):
        return []
    cut = np.flatnonzero(lane[1:] != lane[:-1]) + 1
    lo = np.concatenate([[0], cut])
    hi = np.concatenate([cut, [len(lane)]])
    return list(zip(lo.tolist(), hi.tolist()))
