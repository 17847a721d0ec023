"""Ranks on clocks that do not compare: detect them at ingest and align them on collective completion (DESIGN.md, "Clocks").

Ranks on one host share its clock. Ranks on different hosts do not (each node's Nsight
Systems export and each host's Kineto trace use that node's clock), and neither do two
ranks whose matched collective instances end further apart than the instance lasted (an
NCCL/RCCL instance ends within microseconds on every rank). Such a run is aligned on
collective completion. Each clock group (the ranks of one host; a rank alone where its host
is unknown) gets one offset: the lower median, over the instances it shares with the
reference clock, of (the reference ranks' lower-median end) − (its end), so that the few
instances whose ends really differ (send/recv pairs, a stalled rank) do not move it. The
reference is the clock of the lowest rank that took part in a collective (offset 0).
Instances are matched as ``overlapviz.analysis.peers`` matches them (process group and
sequence number, else position).

``mode``: ``auto`` aligns a run whose clocks are found not comparable (hosts differ, or
ends disagree), a rank of unknown host whose ends agree with the reference rank's sharing
its clock; ``collectives`` aligns every run of several ranks, each rank of unknown host on
its own (the ranks of one named host still share one clock); ``none`` aligns nothing. A run
whose clocks are not comparable and not aligned (``none``, or no matched instance for a
group) keeps its groups in distinct ``clock_domain`` s, so that no peer wait or arrival skew
is computed across them (``overlapviz.analysis.clocks``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["MODES", "ClockFix", "instance_ends", "plan", "summary_lines"]

MODES = ("auto", "collectives", "none")


@dataclass(frozen=True)
class ClockFix:
    """One rank's clock: ``domain`` (ranks of a run with equal domains compare), ``offset_ns``
    (added to every time of the rank; None: not aligned) and ``note`` (how, or why not)."""

    domain: str
    offset_ns: int | None
    note: str | None


def _group_of(rank: int, host) -> str:
    return f"host:{host}" if isinstance(host, str) and host else f"rank:{rank}"


def plan(hosts: dict[int, str | None], ends: dict, mode: str = "auto") -> dict[int, ClockFix]:
    """The clock of every rank of one run.

    Parameters
    ----------
    hosts
        rank -> host name (None where the trace does not say).
    ends
        The run's matched collective instances (:func:`instance_ends`), each rank on its own clock.
    mode
        ``auto``, ``collectives`` or ``none`` (see the module docstring).

    Returns
    -------
    dict
        rank -> :class:`ClockFix`, for every rank of ``hosts``.
    """
    if mode not in MODES:
        raise ValueError(f"--align-clocks {mode!r}: expected one of {', '.join(MODES)}")
    ranks = sorted(hosts)
    if len(ranks) < 2:
        return {r: ClockFix("host:" + (hosts[r] or ""), None, None) for r in ranks}
    known = {h for h in hosts.values() if isinstance(h, str) and h}
    hosts_differ = len(known) > 1
    in_instances = sorted({r for per in ends.values() for r in per})
    ref = in_instances[0] if in_instances else ranks[0]  # the lowest rank that took part in one
    group, disagree = _clock_groups(hosts, ends, ref, merge=mode != "collectives")
    comparable = not hosts_differ and not disagree
    if mode == "none" or (mode == "auto" and comparable):
        if comparable:  # one clock: the ranks of unknown host share the one host named, if any
            shared = "host:" + (next(iter(known)) if known else "")
            return {r: ClockFix(shared, None, None) for r in ranks}
        why = _why(hosts_differ, disagree, known)
        return {r: ClockFix(group[r], None, f"{why}; not aligned (--align-clocks none): peer waits and skews "
                                           "across them are not computed") for r in ranks}  # fmt: skip
    offsets, used, spread = _align(ends, group, ref)
    why = "aligned as asked (--align-clocks collectives)" if comparable else _why(hosts_differ, disagree, known)
    out = {}
    for r in ranks:
        g = group[r]
        if g == group[ref]:
            out[r] = ClockFix(f"aligned:rank{ref}", 0, f"{why}; the reference clock of the alignment")
        elif g in offsets:
            out[r] = ClockFix(f"aligned:rank{ref}", offsets[g],
                              f"{why}; aligned on collective completion to rank {ref}'s clock from {used[g]} matched "
                              f"instance{'s' * (used[g] != 1)} (median end difference; the ends then lie within "
                              f"{spread[g] / 1000:,.1f} µs, median)")  # fmt: skip
        else:
            out[r] = ClockFix(g, None, f"{why}; no collective instance matched to align {g.replace(':', ' ')} with "
                                       f"rank {ref}'s clock: peer waits and skews across them are not computed")  # fmt: skip
    return out


def _clock_groups(hosts: dict, ends: dict, ref: int, *, merge: bool = True) -> tuple[dict, list[int]]:
    """Which ranks share a clock, and the ranks found on a clock of their own.

    The ranks of one host share its clock, unless a rank's instances end further from those of
    the host's lowest rank than they lasted (two Nsight Systems sessions on one host each count
    from their own start): that rank is then alone. A rank of unknown host is alone; with
    ``merge``, it shares the reference rank's clock where their ends agree.
    """
    ranks = sorted(hosts)
    group = {r: _group_of(r, hosts[r]) for r in ranks}
    lead = {}
    for r in ranks:
        lead.setdefault(group[r], r)
    disagree = []
    for r in ranks:
        anchor = lead[group[r]] if group[r].startswith("host:") else ref
        if anchor == r:
            continue
        verdict = _disagree_pair(ends, anchor, r)
        if verdict:
            disagree.append(r)
            group[r] = f"rank:{r}"
        elif merge and verdict is not None and group[r].startswith("rank:"):
            group[r] = group[ref]
    return group, disagree


def _disagree_pair(ends: dict, a: int, b: int) -> bool | None:
    """Whether ranks ``a`` and ``b``'s shared instances end, in the (lower) median, further apart than
    the instance lasted on either; None where they share none."""
    x = [abs(per[a][0] - per[b][0]) - max(per[a][1], per[b][1]) for per in ends.values() if a in per and b in per]
    return None if not x else _lower_median(x) > 0


def _why(hosts_differ: bool, disagree: list[int], known: set) -> str:
    if hosts_differ:
        return f"ranks on {len(known)} hosts ({', '.join(sorted(known))})"
    shown = ", ".join(str(r) for r in sorted(disagree))
    return f"collective instances of rank{'s' * (len(disagree) != 1)} {shown} end further from the others' than they lasted"


def instance_ends(rank, start_ns, end_ns, comm_group, comm_seq, what) -> dict[str, dict[int, tuple[int, int]]]:
    """Per collective instance, per rank: (the last end, the longest duration) of the rank's
    kernels of that instance, ns. Instances are keyed as ``overlapviz.analysis.peers.instance_keys``
    keys them: ``seq:<group>#<seq>`` where the group and sequence number are recorded, else
    ``pos:<group>:<collective or name>#<n>``, n counting that rank's kernels of the same group and
    collective in start order. Instances seen on one rank only are left out.

    Parameters
    ----------
    rank, start_ns, end_ns
        int64 arrays, one entry per communication kernel of one run.
    comm_group, comm_seq, what
        Lists aligned with them (None where not recorded); ``what`` is the collective, else the name.
    """
    order = np.lexsort((np.asarray(start_ns, np.int64), np.asarray(rank, np.int64)))  # stable: ties keep table order
    seen: dict = {}
    out: dict[str, dict[int, tuple[int, int]]] = {}
    for i in order.tolist():
        r, g, q, w = int(rank[i]), comm_group[i] or "", comm_seq[i], what[i]
        if q is not None and g != "":
            key = f"seq:{g}#{int(q)}"
        else:
            n = seen.get((r, g, w), 0)
            seen[(r, g, w)] = n + 1
            key = f"pos:{g}:{w}#{n}"
        e, d = int(end_ns[i]), int(end_ns[i]) - int(start_ns[i])
        per = out.setdefault(key, {})
        old = per.get(r)
        per[r] = (e, d) if old is None else (max(old[0], e), max(old[1], d))
    return {k: v for k, v in out.items() if len(v) > 1}


def _lower_median(values) -> int:
    """The lower median of int64 values (exact: never a .5 from averaging two)."""
    v = np.sort(np.asarray(values, dtype=np.int64))
    return int(v[(len(v) - 1) // 2])


def _gaps(ends: dict, group: dict, members: set, others: set, offsets: dict) -> tuple[np.ndarray, np.ndarray]:
    """For each instance shared by ``members`` ranks and ``others`` ranks: ``diff`` = the others'
    lower-median end (shifted by their offsets) − each member's end, and ``lasted``, the longest
    duration among them; int64 ns (epoch ns do not survive a float64 median)."""
    diff, lasted = [], []
    for per in ends.values():
        theirs = [(e + offsets.get(group[r], 0), d) for r, (e, d) in per.items() if group[r] in others]
        mine = [(e, d) for r, (e, d) in per.items() if group[r] in members]
        if not theirs or not mine:
            continue
        ref = _lower_median([e for e, _ in theirs])
        longest = max(d for _, d in theirs)
        for e, d in mine:
            diff.append(ref - e)
            lasted.append(max(d, longest))
    return np.asarray(diff, np.int64), np.asarray(lasted, np.int64)


def _gaps_to(ends: dict, group: dict, ref: str) -> dict[str, np.ndarray]:
    """``_gaps(ends, group, {g}, {ref}, {})[0]`` of every group ``g`` but ``ref``, in one pass over the instances:
    per group, one call each walked every instance's ranks, groups x instances x ranks (quadratic in ranks)."""
    out: dict[str, list[int]] = {}
    for per in ends.values():
        theirs = [e for r, (e, _) in per.items() if group[r] == ref]
        if not theirs:
            continue
        median = _lower_median(theirs)
        for r, (e, _) in per.items():
            if group[r] != ref:
                out.setdefault(group[r], []).append(median - e)
    return {g: np.asarray(diff, np.int64) for g, diff in out.items()}


def _align(ends: dict, group: dict, ref_rank: int) -> tuple[dict, dict, dict]:
    """Offsets per group (reference: ``ref_rank``'s group, 0), the instances each rests on and the
    median |end − reference end| after alignment. A group sharing instances with the reference
    clock is aligned to it alone; one that does not, to the groups aligned so far (the one sharing
    most instances with them first); a group no matched instance reaches is left out."""
    ref = group[ref_rank]
    offsets, used, spread = {ref: 0}, {ref: 0}, {ref: 0}

    def fix(g, diff):
        offsets[g] = _lower_median(diff)
        used[g] = len(diff)
        spread[g] = _lower_median(np.abs(diff - offsets[g]))

    todo = sorted(set(group.values()) - {ref})
    to_ref = _gaps_to(ends, group, ref)
    for g in list(todo):
        diff = to_ref.get(g, ())
        if len(diff):
            fix(g, diff)
            todo.remove(g)
    while todo:
        best = None
        for g in todo:
            diff, _ = _gaps(ends, group, {g}, set(offsets), offsets)
            if len(diff) and (best is None or len(diff) > len(best[1])):
                best = (g, diff)
        if best is None:
            break
        fix(*best)
        todo.remove(best[0])
    return offsets, used, spread


def summary_lines(run_id: str, fixes: dict[int, ClockFix]) -> list[str]:
    """What ingest says of a run's clocks: nothing where its ranks share one clock as they are."""
    aligned = {r: f for r, f in sorted(fixes.items()) if f.offset_ns is not None}
    apart = {r: f for r, f in sorted(fixes.items()) if f.offset_ns is None and f.note}
    lines = []
    if aligned:
        shown = ", ".join(f"rank {r} {f.offset_ns:+,} ns" for r, f in aligned.items())
        how = next((f.note for f in aligned.values() if f.offset_ns), next(iter(aligned.values())).note)
        lines.append(f"{run_id}: clock offsets added: {shown}")
        lines.append(f"{run_id}: {how}")
    if apart:
        lines.append(f"{run_id}: {next(iter(apart.values())).note}")
    return lines
