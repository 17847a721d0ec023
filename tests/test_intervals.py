"""Interval algebra against a brute force over a discrete time grid (hypothesis), plus hand cases.

The brute force marks every integer instant ``t`` with ``start <= t < end`` in a boolean
array per group: half-open intervals on integers are exactly sets of instants, so
union/intersection/difference are ``|``, ``&``, ``& ~`` and the measure is the count.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from overlapviz.analysis import intervals
from overlapviz.analysis.intervals import IntervalSet

N_GROUPS = 4
T_MIN, T_MAX = -20, 60  # negative times too: nothing may assume start >= 0

interval_rows = st.lists(
    st.tuples(
        st.integers(0, N_GROUPS - 1),
        st.integers(T_MIN, T_MAX),
        st.integers(0, 25),  # zero-length activities included
    ),
    max_size=40,
)


def _arrays(rows):
    g = np.array([r[0] for r in rows], np.int64)
    s = np.array([r[1] for r in rows], np.int64)
    e = np.array([r[1] + r[2] for r in rows], np.int64)
    return g, s, e


def _grid(g, s, e) -> np.ndarray:
    """Boolean cover ``[group, instant]`` of raw (possibly overlapping, empty) intervals."""
    grid = np.zeros((N_GROUPS, T_MAX + 30 - T_MIN), bool)
    for gi, si, ei in zip(g.tolist(), s.tolist(), e.tolist()):
        grid[gi, si - T_MIN : ei - T_MIN] = True
    return grid


def _grid_of(iset: IntervalSet) -> np.ndarray:
    return _grid(iset.group, iset.start, iset.end)


def _assert_canonical(iset: IntervalSet) -> None:
    """Per group: non-empty, sorted, disjoint and non-touching; groups ascending."""
    assert iset.group.dtype == iset.start.dtype == iset.end.dtype == np.int64
    assert np.all(iset.end > iset.start)
    same = iset.group[1:] == iset.group[:-1]
    assert np.all(iset.group[1:] >= iset.group[:-1])
    assert np.all(iset.start[1:][same] > iset.end[:-1][same])  # '>' : touching intervals are joined


@settings(max_examples=300, deadline=None)
@given(interval_rows)
def test_merge_matches_grid(rows):
    g, s, e = _arrays(rows)
    merged = intervals.merge(g, s, e)
    _assert_canonical(merged)
    assert np.array_equal(_grid_of(merged), _grid(g, s, e))
    assert np.array_equal(intervals.measure(merged, N_GROUPS), _grid(g, s, e).sum(axis=1))


@settings(max_examples=300, deadline=None)
@given(interval_rows, interval_rows)
def test_set_operations_match_grid(rows_a, rows_b):
    a = intervals.merge(*_arrays(rows_a))
    b = intervals.merge(*_arrays(rows_b))
    ga, gb = _grid_of(a), _grid_of(b)
    for result, expected in (
        (intervals.intersect(a, b), ga & gb),
        (intervals.subtract(a, b), ga & ~gb),
        (intervals.subtract(b, a), gb & ~ga),
        (intervals.union(a, b), ga | gb),
    ):
        _assert_canonical(result)
        assert np.array_equal(_grid_of(result), expected)
    assert np.array_equal(intervals.intersect_measure(a, b, N_GROUPS), (ga & gb).sum(axis=1))


@settings(max_examples=200, deadline=None)
@given(interval_rows, interval_rows, interval_rows)
def test_segments_cover_masks(rows_a, rows_b, rows_c):
    sets = [intervals.merge(*_arrays(r)) for r in (rows_a, rows_b, rows_c)]
    grids = [_grid_of(x) for x in sets]
    g, s, e, m = intervals.segments(*sets)
    assert np.all(e > s) and np.all(m != 0)
    expected = np.zeros_like(grids[0], dtype=np.int64)
    for i, grid in enumerate(grids):
        expected |= grid.astype(np.int64) << i
    got = np.zeros_like(expected)
    covered = np.zeros(expected.shape, np.int64)
    for gi, si, ei, mi in zip(g.tolist(), s.tolist(), e.tolist(), m.tolist()):
        got[gi, si - T_MIN : ei - T_MIN] = mi
        covered[gi, si - T_MIN : ei - T_MIN] += 1
    assert covered.max(initial=0) <= 1  # segments never overlap each other
    assert np.array_equal(got, expected)


@settings(max_examples=200, deadline=None)
@given(interval_rows, st.randoms(use_true_random=False))
def test_merge_ignores_row_order_and_leaves_inputs_alone(rows, rnd):
    g, s, e = _arrays(rows)
    copies = g.copy(), s.copy(), e.copy()
    perm = list(range(len(rows)))
    rnd.shuffle(perm)
    a = intervals.merge(g, s, e)
    b = intervals.merge(g[perm], s[perm], e[perm])
    for x, y in zip((a.group, a.start, a.end), (b.group, b.start, b.end)):
        assert np.array_equal(x, y)
    for before, after in zip(copies, (g, s, e)):
        assert np.array_equal(before, after)


@settings(max_examples=100, deadline=None)
@given(interval_rows)
def test_groups_are_independent(rows):
    g, s, e = _arrays(rows)
    whole = intervals.measure(intervals.merge(g, s, e), N_GROUPS)
    for k in range(N_GROUPS):
        alone = intervals.measure(intervals.merge(g[g == k], s[g == k], e[g == k]), N_GROUPS)
        assert alone[k] == whole[k]


def test_touching_intervals_join_but_do_not_intersect():
    a = intervals.merge([0, 0], [0, 10], [10, 20])
    assert (a.start.tolist(), a.end.tolist()) == ([0], [20])
    left, right = intervals.merge([0], [0], [10]), intervals.merge([0], [10], [20])
    assert len(intervals.intersect(left, right)) == 0
    assert intervals.intersect_measure(left, right, 1).tolist() == [0]


def test_zero_length_and_nested():
    a = intervals.merge([0, 0, 0, 1], [5, 0, 2, 7], [5, 10, 3, 7])
    assert (a.group.tolist(), a.start.tolist(), a.end.tolist()) == ([0], [0], [10])
    assert intervals.measure(a, 2).tolist() == [10, 0]


def test_empty_inputs():
    e = intervals.merge([], [], [])
    assert len(e) == 0
    assert intervals.measure(e, 3).tolist() == [0, 0, 0]
    one = intervals.merge([1], [0], [4])
    assert intervals.intersect(e, one).start.tolist() == []
    assert intervals.subtract(one, e).end.tolist() == [4]
    assert intervals.union(e, one).start.tolist() == [0]


def test_large_values_near_int64_limits():
    # wide spans take the rank-shift path of the grouped running maximum
    big = np.iinfo(np.int64).max // 2
    g = [0, 0, 1, 1, 2]
    s = [-big, big - 100, 0, 5, big - 10]
    e = [-big + 10, big - 50, 10, 20, big]
    a = intervals.merge(g, s, e)
    assert intervals.measure(a, 3).tolist() == [60, 20, 10]
    assert a.start.tolist() == [-big, big - 100, 0, big - 10]


def test_many_groups_sorted_and_unsorted_agree():
    rng = np.random.default_rng(1)
    n = 20_000
    g = rng.integers(0, 500, n)
    s = rng.integers(0, 10**9, n)
    e = s + rng.integers(0, 10**6, n)
    order = np.lexsort((s, g))
    a = intervals.merge(g, s, e)
    b = intervals.merge(g[order], s[order], e[order])
    assert np.array_equal(a.start, b.start) and np.array_equal(a.end, b.end) and np.array_equal(a.group, b.group)


def test_too_many_sets():
    with pytest.raises(ValueError, match="at most 62"):
        intervals.segments(*([IntervalSet.empty()] * 63))


@settings(max_examples=200, deadline=None)
@given(interval_rows)
def test_sort_order_sorts_stably(rows):
    g, s, _ = _arrays(rows)
    order = intervals.sort_order(g, s)
    expected = np.lexsort((s, g))  # stable too
    if order is None:
        assert np.array_equal(expected, np.arange(len(rows)))
    else:
        assert np.array_equal(order, expected)


def test_intersect_measure_with_keys_too_wide_to_combine():
    # spans near the int64 limit cannot share one (group, time) key: the sweep path answers
    big = np.iinfo(np.int64).max // 2
    a = intervals.merge([0, 1], [-big, 0], [-big + 100, 10])
    b = intervals.merge([0, 1], [-big + 50, 5], [big, 7])
    assert intervals.intersect_measure(a, b, 2).tolist() == [50, 2]
    assert intervals.measure(intervals.intersect(a, b), 2).tolist() == [50, 2]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(-5, 5)), min_size=1, max_size=40), st.sampled_from([0, 1 << 61]))
def test_grouped_cummax_is_each_groups_running_maximum(rows, offset):
    # offset: epoch-scale values whose spread cannot be shifted group by group (the fallback through ranks)
    g = np.sort(np.array([r[0] for r in rows], np.int64))
    e = np.array([r[1] for r in rows], np.int64) * (1 + offset // 8) + offset
    want = [max(e[j] for j in range(len(g)) if g[j] == g[i] and j <= i) for i in range(len(g))]
    assert intervals.grouped_cummax(g, e).tolist() == [int(w) for w in want]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 12), st.integers(0, 6)), max_size=40))
def test_stream_previous_is_the_latest_ending_earlier_row_of_the_stream(rows):
    from overlapviz.analysis.dependencies import stream_previous, stream_ready

    stream = np.array([r[0] for r in rows], np.int64)
    start = np.array([r[1] for r in rows], np.int64)
    end = start + np.array([r[2] for r in rows], np.int64)
    # brute force: in (stream, start, end) order, the earlier row of the stream with the greatest end, the last on a tie
    order = sorted(range(len(rows)), key=lambda i: (stream[i], start[i], end[i], i))
    want = [-1] * len(rows)
    for pos, i in enumerate(order):
        before = [j for j in order[:pos] if stream[j] == stream[i]]
        if before:
            top = max(end[j] for j in before)
            want[i] = [j for j in before if end[j] == top][-1]
    assert stream_previous(stream, start, end).tolist() == want
    assert stream_ready(stream, start, end).tolist() == [int(end[w]) if w >= 0 else -1 for w in want]
