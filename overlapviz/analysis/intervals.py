"""Interval algebra over int64 nanoseconds, vectorized across many groups at once.

Intervals are half-open, ``[start, end)``: two intervals that only touch do not
overlap, and a zero-length interval has measure 0. Every function takes parallel
arrays ``(group, start, end)`` where ``group`` is a non-negative integer code (for
example the row number of a ``(run_id, rank, step)`` key), and never modifies them.

An :class:`IntervalSet` is the canonical form: per group, disjoint, non-touching,
non-empty intervals sorted by start, with groups in ascending order. ``merge``
produces one; ``intersect``, ``subtract`` and ``union`` combine two of them with one
sort-and-sweep (no Python loop per interval or per group).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

_I64 = np.int64


@dataclass(frozen=True)
class IntervalSet:
    """Disjoint sorted intervals per group (see the module docstring)."""

    group: np.ndarray
    start: np.ndarray
    end: np.ndarray

    def __len__(self) -> int:
        return len(self.start)

    @classmethod
    def empty(cls) -> "IntervalSet":
        z = np.empty(0, _I64)
        return cls(z, z, z)


def _as_i64(a) -> np.ndarray:
    return np.asarray(a, dtype=_I64)


def merge(group, start, end) -> IntervalSet:
    """Union of the intervals of each group.

    Parameters
    ----------
    group, start, end : array-like of int
        Parallel arrays; ``group`` >= 0, ``start`` and ``end`` in ns. Rows with
        ``end <= start`` are empty and dropped.

    Returns
    -------
    IntervalSet
    """
    group, start, end = _as_i64(group), _as_i64(start), _as_i64(end)
    keep = end > start
    if not keep.all():
        group, start, end = group[keep], start[keep], end[keep]
    if len(start) == 0:
        return IntervalSet.empty()
    order = sort_order(group, start)
    if order is None:  # already sorted: the common case (the dataset stores rows by start)
        g, s, e = group, start, end
    else:
        g, s, e = group[order], start[order], end[order]
    # running maximum of ends, restarted at each group: shift each group's ends above
    # every earlier group's so one global accumulate stays within groups
    reach = grouped_cummax(g, e)
    new_group = np.empty(len(g), bool)
    new_group[0] = True
    np.not_equal(g[1:], g[:-1], out=new_group[1:])
    # an interval starts a new merged run when it begins after everything before it ended
    opens = new_group.copy()
    opens[1:] |= s[1:] > reach[:-1]
    first = np.flatnonzero(opens)
    last = np.append(first[1:] - 1, len(g) - 1)
    return IntervalSet(g[first], s[first], reach[last])


def sort_order(group: np.ndarray, key: np.ndarray) -> np.ndarray | None:
    """Stable permutation that sorts rows by ``(group, key)``.

    Sorted or nearly sorted input is the rule here (rows come by start time, and
    ``segments`` concatenates sorted runs), so a stable sort on one combined int64 key
    (timsort: linear on sorted runs) beats ``lexsort``, which always does two passes.

    Parameters
    ----------
    group, key : numpy.ndarray of int64
        Parallel arrays.

    Returns
    -------
    numpy.ndarray or None
        Row indices in sorted order, or None when the rows are already sorted.
    """
    n = len(key)
    if n < 2:
        return None
    dg = group[1:] - group[:-1]
    if bool(np.all((dg > 0) | ((dg == 0) & (key[1:] >= key[:-1])))):
        return None
    lo, hi = int(key.min()), int(key.max())
    span = hi - lo + 1
    gmin, gmax = int(group.min()), int(group.max())
    if (gmax - gmin + 1) * span < np.iinfo(_I64).max // 2:
        combined = (group - gmin) * _I64(span) + (key - lo)
        return np.argsort(combined, kind="stable")
    return np.lexsort((key, group))


def grouped_cummax(g: np.ndarray, e: np.ndarray) -> np.ndarray:
    """Running maximum of ``e`` within each run of equal ``g``, vectorized (no loop over groups).

    Parameters
    ----------
    g : numpy.ndarray of int64
        Group of each row, each group's rows contiguous (sorted by group, say); not empty.
    e : numpy.ndarray of int64
        Values (ns), parallel to ``g``.

    Returns
    -------
    numpy.ndarray of int64
        Per row, the maximum of ``e`` over its group's rows up to and including it.
    """
    lo, hi = int(e.min()), int(e.max())
    span = hi - lo + 1
    codes = np.cumsum(np.r_[False, g[1:] != g[:-1]], dtype=_I64)
    if int(codes[-1]) < (np.iinfo(_I64).max // 2) // span:
        shifted = (e - lo) + codes * _I64(span)
        return np.maximum.accumulate(shifted) - codes * _I64(span) + lo
    # values too far apart to shift safely: shift their ranks instead (rank < len(e))
    values, rank = np.unique(e, return_inverse=True)
    shifted = rank.astype(_I64) + codes * _I64(len(values))
    return values[np.maximum.accumulate(shifted) - codes * _I64(len(values))]


def measure(iset: IntervalSet, n_groups: int) -> np.ndarray:
    """Total length (ns) of each group's intervals, as an int64 array of length ``n_groups``."""
    out = np.zeros(n_groups, _I64)
    if len(iset):
        np.add.at(out, iset.group, iset.end - iset.start)
    return out


def segments(*sets: IntervalSet) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Cut the time line of each group into elementary segments and say which sets cover each.

    Returns ``(group, start, end, mask)``: bit ``i`` of ``mask`` is set where set ``i``
    covers the segment. Segments covered by no set are omitted; adjacent segments are
    not re-joined.
    """
    if len(sets) > 62:
        raise ValueError("at most 62 interval sets")
    gs, ts, ws = [], [], []
    for i, s in enumerate(sets):
        bit = _I64(1) << _I64(i)
        # interleave each interval's start and end: a canonical set then gives one run
        # already sorted by (group, time), and the sort below only merges sorted runs
        gs.append(np.repeat(s.group, 2))
        ts.append(np.column_stack((s.start, s.end)).ravel())
        ws.append(np.tile(np.array([bit, -bit], _I64), len(s)))
    g, t, w = np.concatenate(gs), np.concatenate(ts), np.concatenate(ws)
    if len(t) == 0:
        z = np.empty(0, _I64)
        return z, z, z, z
    order = sort_order(g, t)
    if order is not None:
        g, t, w = g[order], t[order], w[order]
    # each set is disjoint per group, so the running sum of +bit/-bit is the cover mask;
    # every group ends with all intervals closed, so the sum is 0 between groups
    mask = np.cumsum(w)
    seg_start, seg_end = t[:-1], t[1:]
    seg_mask, seg_group = mask[:-1], g[:-1]
    keep = (seg_mask != 0) & (seg_end > seg_start) & (g[1:] == g[:-1])
    return seg_group[keep], seg_start[keep], seg_end[keep], seg_mask[keep]


def _select(a: IntervalSet, b: IntervalSet, want) -> IntervalSet:
    g, s, e, m = segments(a, b)
    keep = want(m)
    return merge(g[keep], s[keep], e[keep])


def intersect(a: IntervalSet, b: IntervalSet) -> IntervalSet:
    """Per group, the time covered by both ``a`` and ``b``."""
    return _select(a, b, lambda m: m == 3)


def subtract(a: IntervalSet, b: IntervalSet) -> IntervalSet:
    """Per group, the time covered by ``a`` and not by ``b``."""
    return _select(a, b, lambda m: m == 1)


def union(a: IntervalSet, b: IntervalSet) -> IntervalSet:
    """Per group, the time covered by ``a`` or ``b``."""
    return merge(
        np.concatenate([a.group, b.group]), np.concatenate([a.start, b.start]), np.concatenate([a.end, b.end])
    )


def intersect_measure(a: IntervalSet, b: IntervalSet, n_groups: int) -> np.ndarray:
    """``measure(intersect(a, b))`` without building the intersection (see :func:`covered`)."""
    out = np.zeros(n_groups, _I64)
    if len(a) and len(b):
        np.add.at(out, a.group, covered(b, a.group, a.start, a.end))
    return out


def covered(b: IntervalSet, group, start, end) -> np.ndarray:
    """Per query interval ``[start, end)`` of ``group``, the length of ``b`` inside it (int64 ns).

    The queries need not be disjoint or sorted. Each looks up, by binary search, how much of
    ``b`` lies before its start and before its end (prefix sums of ``b``'s lengths); the
    difference is the part of ``b`` inside it. No sort: ``O(len(queries) log len(b))``.
    """
    group, start, end = _as_i64(group), _as_i64(start), _as_i64(end)
    out = np.zeros(len(start), _I64)
    if len(start) == 0 or len(b) == 0:
        return out
    lo = min(int(start.min()), int(b.start.min()))
    hi = max(int(end.max()), int(b.end.max()))
    span = hi - lo + 1
    gmax = max(int(group.max()), int(b.group.max()))
    if (gmax + 1) * span >= np.iinfo(_I64).max // 2:  # keys would overflow: one group at a time
        for gv in np.unique(group).tolist():
            q = group == gv
            mine = b.group == gv
            sub = IntervalSet(np.zeros(int(mine.sum()), _I64), b.start[mine], b.end[mine])
            out[q] = _covered_one(sub, start[q], end[q])
        return out
    # one int64 key per (group, time): groups never interleave, so a difference of two
    # positions inside one group only ever counts that group's intervals of b
    b_start = b.group * _I64(span) + (b.start - lo)
    b_len = b.end - b.start
    before = np.concatenate(([0], np.cumsum(b_len)))  # b's length before interval i

    def covered_before(g, t):
        key = g * _I64(span) + (t - lo)
        i = np.searchsorted(b_start, key, side="right") - 1  # last b interval starting at or before t
        inside = np.clip(key - b_start[np.maximum(i, 0)], 0, b_len[np.maximum(i, 0)])
        return np.where(i >= 0, before[np.maximum(i, 0)] + inside, 0)

    return covered_before(group, end) - covered_before(group, start)


def _covered_one(b: IntervalSet, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """:func:`covered` for one group, on times alone (no combined key to overflow)."""
    if len(b) == 0:
        return np.zeros(len(start), _I64)
    b_len = b.end - b.start
    before = np.concatenate(([0], np.cumsum(b_len)))

    def covered_before(t):
        i = np.searchsorted(b.start, t, side="right") - 1
        j = np.maximum(i, 0)
        inside = np.minimum(np.maximum(t - b.start[j], 0), b_len[j])
        return np.where(i >= 0, before[j] + inside, 0)

    return covered_before(end) - covered_before(start)
