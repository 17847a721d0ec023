"""When each GPU activity could have started: its launch, the previous activity on its stream, and the events its stream was made to wait on.

DESIGN.md ("Why a collective started late"). For one rank's activities and sync records:

* ``stream_ready_ns``: end of the previous activity on the same stream (the latest end of
  the earlier ones, in start order).
* a stream wait (``cudaStreamWaitEvent`` / ``hipStreamWaitEvent``, with its ``cuda_sync``
  "Stream Wait Event" record where the trace has one) is linked to the event's recording
  call and that call's *producer*, the last activity launched on the recording stream
  before the record call. Each link part comes from the sync record where it names it
  (``stream``, ``wait_on_stream``, ``wait_on_cuda_event_record_corr_id``; -1 = not
  named) and is otherwise inferred from host order on the calling thread:

  - the waiting stream: the stream of the next launch on the waiting thread;
  - the record call: the latest record call on the waiting thread before the wait;
  - the recording stream: the stream of the last launch on the recording thread before
    the record call.

  ``dependency_source`` is ``cuda_sync`` where the sync record names the recording stream
  or the record call, else ``inferred``.
* a wait whose record call the trace does not hold (no record call on the waiting thread
  before it, none named by a sync record: Kineto traces from before ``cudaEventRecord`` was
  traced) gets its producer from host order on the waiting thread alone: the last activity
  launched there on another stream than the waiting one before the wait. PyTorch's
  ProcessGroupNCCL records the event and waits on it from the same thread, right after the
  work it guards was enqueued. ``dependency_source`` is ``inferred``.
* a wait gates the first activity launched on its stream after it; an activity's
  ``dependency_ready_ns`` is the latest producer end among its waits. A link whose
  producer ends after the gated activity started contradicts the trace (the GPU honours
  the wait): it is dropped, and counted in ``rejected_waits``.

All times are int64 ns; -1 stands for unknown in the arrays this module returns.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from overlapviz.analysis import intervals

__all__ = ["Ready", "stream_previous", "stream_ready", "dependency_ready"]

UNKNOWN = -1


@dataclass
class Ready:
    """Per activity (aligned with the input arrays): ``dependency_ready_ns`` (-1 none),
    ``source`` (object: ``cuda_sync`` / ``inferred`` / None), ``producer`` (index of the
    producing activity, -1 none), and ``rejected_waits``, the links dropped as impossible."""

    dependency_ready_ns: np.ndarray
    source: np.ndarray
    producer: np.ndarray
    rejected_waits: int = 0


def stream_previous(stream: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Per activity, the row of the latest-ending earlier activity on the same stream (in start order;
    the last such row on a tie), -1 for a stream's first: the activity whose end is its stream ready."""
    n = len(start)
    out = np.full(n, UNKNOWN, np.int64)
    if not n:
        return out
    order = np.lexsort((end, start, stream))
    s, e = np.asarray(stream[order], np.int64), np.asarray(end[order], np.int64)
    first = np.ones(n, bool)
    first[1:] = s[1:] != s[:-1]
    # running argmax of end within each stream (position in order, the last on a tie): the rows that reach
    # their stream's running maximum, latest so far; a stream's first row always reaches it, so one
    # accumulate over all streams never carries a position into the next stream
    reach = intervals.grouped_cummax(s, e)
    best = np.maximum.accumulate(np.where(e == reach, np.arange(n), 0))
    prev = np.full(n, UNKNOWN, np.int64)
    prev[1:] = order[best[:-1]]
    prev[first] = UNKNOWN
    out[order] = prev
    return out


def stream_ready(stream: np.ndarray, start: np.ndarray, end: np.ndarray, previous: np.ndarray | None = None) -> np.ndarray:
    """End of the latest-ending earlier activity on the same stream, -1 for a stream's first
    (``previous``: :func:`stream_previous` of the same arrays, when already computed)."""
    prev = stream_previous(stream, start, end) if previous is None else previous
    return np.where(prev >= 0, end[np.maximum(prev, 0)], UNKNOWN) if len(prev) else np.full(0, UNKNOWN, np.int64)


def _last_before(times: np.ndarray, values: np.ndarray, at: np.ndarray, *, strict: bool = True) -> np.ndarray:
    """``values`` of the latest entry of sorted ``times`` before each of ``at`` (-1 where none)."""
    pos = np.searchsorted(times, at, side="left" if strict else "right") - 1
    out = np.full(len(at), UNKNOWN, np.int64)
    ok = pos >= 0
    out[ok] = values[pos[ok]]
    return out


def _first_after(times: np.ndarray, values: np.ndarray, at: np.ndarray) -> np.ndarray:
    pos = np.searchsorted(times, at, side="right")
    out = np.full(len(at), UNKNOWN, np.int64)
    ok = pos < len(times)
    out[ok] = values[pos[ok]]
    return out


def _per_key(keys: np.ndarray, query_keys: np.ndarray, fn) -> np.ndarray:
    """Apply ``fn(member_rows, query_rows)`` per distinct key; returns its results aligned with the queries."""
    out = np.full(len(query_keys), UNKNOWN, np.int64)
    for key in np.unique(query_keys):
        if key == UNKNOWN:
            continue
        q = np.flatnonzero(query_keys == key)
        m = np.flatnonzero(keys == key)
        if len(m):
            out[q] = fn(m, q)
    return out


def _last_other_stream(l_tid, l_t, l_stream, l_idx, tid, t, stream) -> np.ndarray:
    """Per query: ``l_idx`` of the last launch on thread ``tid`` strictly before ``t`` whose
    stream is not ``stream`` (-1 where none). The launches are sorted by (thread, time)."""
    n = len(l_t)
    out = np.full(len(t), UNKNOWN, np.int64)
    if not n:
        return out
    # prev_other[i]: the last launch before i on i's thread whose stream differs from i's
    new_run = np.ones(n, bool)
    new_run[1:] = (l_tid[1:] != l_tid[:-1]) | (l_stream[1:] != l_stream[:-1])
    run_start = np.maximum.accumulate(np.where(new_run, np.arange(n), 0))
    prev_other = run_start - 1
    same_thread = prev_other >= 0
    same_thread[same_thread] = l_tid[prev_other[same_thread]] == l_tid[same_thread]
    prev_other[~same_thread] = UNKNOWN
    # the last launch before t on the thread (tid sorts first, then time)
    pos = np.full(len(t), UNKNOWN, np.int64)
    for key in np.unique(tid):
        if key == UNKNOWN:
            continue
        q = np.flatnonzero(tid == key)
        lo, hi = np.searchsorted(l_tid, [key, key + 1])
        p = np.searchsorted(l_t[lo:hi], t[q], side="left") - 1
        pos[q] = np.where(p >= 0, lo + p, UNKNOWN)
    have = pos != UNKNOWN
    at = np.where(have, pos, 0)
    pick = np.where(have & (l_stream[at] == stream), prev_other[at], np.where(have, at, UNKNOWN))
    ok = pick != UNKNOWN
    out[ok] = l_idx[pick[ok]]
    return out


def dependency_ready(
    *,
    stream: np.ndarray,
    start: np.ndarray,
    end: np.ndarray,
    launch: np.ndarray,
    launch_tid: np.ndarray,
    syncs: dict,
) -> Ready:
    """Producer end of the events each activity's stream waited on (see the module docstring).

    Parameters
    ----------
    stream, start, end
        One rank's GPU activities (int64; ``start``/``end`` ns on the trace clock).
    launch, launch_tid
        Their launch call's start (ns, host clock) and thread; -1 where unknown.
    syncs
        The rank's ``syncs`` rows as numpy arrays by column (``source``, ``kind``, ``tid``,
        ``start_ns``, ``correlation``, ``stream``, ``wait_on_stream``,
        ``wait_on_record_correlation``), -1 for null integers.
    """
    n = len(start)
    dep = np.full(n, UNKNOWN, np.int64)
    src = np.full(n, None, dtype=object)
    producer = np.full(n, UNKNOWN, np.int64)
    if not n or not len(syncs.get("kind", ())):
        return Ready(dep, src, producer)

    kind, source = syncs["kind"], syncs["source"]
    # launches in host order per thread
    has = (launch != UNKNOWN) & (launch_tid != UNKNOWN)
    li = np.flatnonzero(has)
    li = li[np.lexsort((launch[li], launch_tid[li]))]
    l_tid, l_t, l_stream = launch_tid[li], launch[li], stream[li]

    def launch_stream_before(tid: np.ndarray, t: np.ndarray, after: bool = False) -> np.ndarray:
        def fn(m, q):
            return (_first_after if after else _last_before)(l_t[m], l_stream[m], t[q])

        return _per_key(l_tid, tid, fn)

    # runtime record calls, per thread in host order
    rec = np.flatnonzero((kind == "event_record") & (source == "runtime"))
    rec = rec[np.lexsort((syncs["start_ns"][rec], syncs["tid"][rec]))]
    rec_tid, rec_t, rec_corr = syncs["tid"][rec], syncs["start_ns"][rec], syncs["correlation"][rec]
    rec_by_corr = {int(c): i for i, c in enumerate(rec_corr.tolist()) if c != UNKNOWN}

    # waits: runtime calls, each with its cuda_sync record (same correlation) where there is one
    is_wait = kind == "stream_wait_event"
    rt = np.flatnonzero(is_wait & (source == "runtime"))
    cs = np.flatnonzero(is_wait & (source == "cuda_sync"))
    cs_by_corr = {int(c): i for i, c in zip(cs.tolist(), syncs["correlation"][cs].tolist()) if c != UNKNOWN}
    rt_corrs = set(syncs["correlation"][rt].tolist())
    lone = [i for i in cs.tolist() if syncs["correlation"][i] == UNKNOWN or syncs["correlation"][i] not in rt_corrs]
    w_rows = np.concatenate([rt, np.asarray(lone, np.int64)]).astype(np.int64)
    if not len(w_rows):
        return Ready(dep, src, producer)
    w_sync = np.array([cs_by_corr.get(int(c), -1) if source[r] == "runtime" else r
                       for r, c in zip(w_rows.tolist(), syncs["correlation"][w_rows].tolist())], np.int64)  # fmt: skip
    w_t = syncs["start_ns"][w_rows]
    w_tid = syncs["tid"][w_rows]

    def field(name: str) -> np.ndarray:
        out = np.full(len(w_rows), UNKNOWN, np.int64)
        ok = w_sync >= 0
        out[ok] = syncs[name][w_sync[ok]]
        return out

    named_stream, named_rec_stream, named_rec_corr = field("stream"), field("wait_on_stream"), field("wait_on_record_correlation")
    # the waiting stream
    w_stream = np.where(named_stream != UNKNOWN, named_stream, launch_stream_before(w_tid, w_t, after=True))
    # the record call: named, else the latest on the waiting thread before the wait
    r_idx = np.array([rec_by_corr.get(int(c), -1) for c in named_rec_corr.tolist()], np.int64)
    guess = _per_key(rec_tid, w_tid, lambda m, q: _last_before(rec_t[m], m, w_t[q]))
    r_idx = np.where(r_idx >= 0, r_idx, guess)
    if len(rec):
        r_t = np.where(r_idx >= 0, rec_t[np.maximum(r_idx, 0)], UNKNOWN)
        r_tid = np.where(r_idx >= 0, rec_tid[np.maximum(r_idx, 0)], UNKNOWN)
    else:  # waits for events whose record calls the trace does not hold: no producer can be named
        r_t = r_tid = np.full(len(w_rows), UNKNOWN, np.int64)
    # the recording stream: named, else the last launch on the recording thread before the record call
    r_stream = np.where(named_rec_stream != UNKNOWN, named_rec_stream, launch_stream_before(r_tid, r_t))
    w_source = np.where((named_rec_stream != UNKNOWN) | (named_rec_corr != UNKNOWN), "cuda_sync", "inferred").astype(object)

    # the producer: the last activity launched on the recording stream before the record call
    # (its own launch time, so a wait for work the host has not enqueued yet is impossible)
    ok = (w_stream != UNKNOWN) & (r_stream != UNKNOWN) & (r_t != UNKNOWN)
    by_launch = np.flatnonzero(launch != UNKNOWN)
    by_launch = by_launch[np.lexsort((launch[by_launch], stream[by_launch]))]
    s_sorted, t_sorted = stream[by_launch], launch[by_launch]
    prod = np.full(len(w_rows), UNKNOWN, np.int64)
    for s in np.unique(r_stream[ok]):
        q = np.flatnonzero(ok & (r_stream == s))
        lo, hi = np.searchsorted(s_sorted, [s, s + 1])
        prod[q] = _last_before(t_sorted[lo:hi], by_launch[lo:hi], r_t[q])
    # no record call to go by: the last launch on another stream on the waiting thread
    unrecorded = (r_idx < 0) & (named_rec_stream == UNKNOWN) & (named_rec_corr == UNKNOWN) & (w_stream != UNKNOWN)
    if unrecorded.any():
        q = np.flatnonzero(unrecorded)
        prod[q] = _last_other_stream(l_tid, l_t, l_stream, li, w_tid[q], w_t[q], w_stream[q])
    # the gated activity: the first launched on the waiting stream after the wait
    gated = np.full(len(w_rows), UNKNOWN, np.int64)
    for s in np.unique(w_stream[prod != UNKNOWN]):
        q = np.flatnonzero((prod != UNKNOWN) & (w_stream == s))
        lo, hi = np.searchsorted(s_sorted, [s, s + 1])
        gated[q] = _first_after(t_sorted[lo:hi], by_launch[lo:hi], w_t[q])
    use = (gated != UNKNOWN) & (prod != UNKNOWN)
    use &= prod != gated
    d_end = np.where(use, end[np.maximum(prod, 0)], UNKNOWN)
    impossible = use & (d_end > start[np.maximum(gated, 0)])
    use &= ~impossible
    j = np.flatnonzero(use)
    np.maximum.at(dep, gated[j], d_end[j])  # the latest producer among an activity's waits
    j = j[d_end[j] == dep[gated[j]]]
    src[gated[j]] = w_source[j]
    producer[gated[j]] = prod[j]
    return Ready(dep, src, producer, rejected_waits=int(impossible.sum()))
