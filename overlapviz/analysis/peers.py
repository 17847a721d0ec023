"""One collective instance across the ranks of its group: matching, peer wait, arrival skew, the slowest rank and bandwidth.

An instance is matched by process group and sequence number where the trace records
them (``record_param_comms`` / the kernel's args: ``comm_group``, ``comm_seq``), else by
position: the n-th kernel of the same collective (within the same group where known) on
every rank of the run. ``peer_wait_us`` = (latest start among the instance's ranks) −
(this rank's start), assuming comparable rank clocks (one host, or synchronized); null
where the instance was seen on one rank only.

Bandwidth follows nccl-tests (``doc/PERFORMANCE.md``): ``algbw = bytes / time`` and
``busbw = algbw x factor``: all_reduce 2(n−1)/n; all_gather, reduce_scatter and all_to_all
(n−1)/n; broadcast, reduce, send/recv 1. ``time`` is the instance's span once every rank
has arrived: last end − last start.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["attach_peer_wait", "collective_instances", "bus_factor", "ends_apart", "END_TOLERANCE_NS", "instance_ids",
           "peer_waits", "instances_of", "factorize", "group_min", "group_max", "collective_or_name", "INSTANCE_COLUMNS"]  # fmt: skip

# the ranks of one collective instance on comparable clocks end it together (NCCL/RCCL: within
# microseconds; DLRM's 8 ranks within 1-7 µs): ends further apart than the instance lasted, plus this
# much for integer-µs traces, mean the matched kernels are not one instance on comparable clocks
END_TOLERANCE_NS = 10_000
# collective_instances' columns, in order
INSTANCE_COLUMNS = ["run_id", "instance", "collective", "n_ranks", "first_ready_ns", "last_ready_ns", "arrival_skew_us",
                    "slowest_rank", "straggler", "first_start_ns", "last_start_ns", "last_end_ns", "time_us", "max_peer_wait_us",
                    "bytes", "algbw_gbps", "busbw_gbps", "clock_note"]  # fmt: skip
# the arithmetic below is numpy over codes, without pandas: ``overlapviz explain --instances`` computes its table
# with no pandas import (issue 36); the pandas functions (attach_peer_wait, collective_instances) wrap it


def ends_apart(end_min, end_max, last_arrival):
    """Per instance, whether its ranks' ends (each rank's last end: ``end_min``, ``end_max`` over ranks)
    disagree by more than the instance lasted once its last rank arrived (``end_max − last_arrival``)
    plus :data:`END_TOLERANCE_NS`: no peer wait, skew or straggler is computed for such an instance."""
    end_min, end_max, last_arrival = (np.asarray(a, np.int64) for a in (end_min, end_max, last_arrival))
    return (end_max - end_min) > np.maximum(end_max - last_arrival, 0) + END_TOLERANCE_NS


def _first_seen(codes: np.ndarray) -> tuple[np.ndarray, int]:
    """``codes`` (int64) renumbered 0, 1, ... in order of first appearance, and how many distinct."""
    if not len(codes):
        return np.empty(0, np.int64), 0
    uniq, first, inverse = np.unique(codes, return_index=True, return_inverse=True)
    number = np.empty(len(uniq), np.int64)
    number[np.argsort(first, kind="stable")] = np.arange(len(uniq))
    return number[inverse.reshape(-1)], len(uniq)


def factorize(*keys) -> np.ndarray:
    """Dense int64 codes of the rows' key tuples (each key an array: integers, or text as str / None), numbered in
    order of first appearance, as ``pandas.factorize`` numbers them."""
    out, n = None, 1
    for key in keys:
        key = np.asarray(key)
        if key.dtype == object:
            key = _text_codes(key)
        code, m = _first_seen(key.astype(np.int64, copy=False))
        out, n = (code, m) if out is None else _first_seen(out * max(m, 1) + code)
    return np.zeros(0, np.int64) if out is None else out


def _text_codes(values: np.ndarray) -> np.ndarray:
    """A code per distinct value of an object array (text and None, each None alike), by Arrow's hashing."""
    import pyarrow as pa
    import pyarrow.compute as pc

    try:
        encoded = pc.dictionary_encode(pa.array(values, type=pa.string()), null_encoding="encode")
    except (pa.ArrowException, TypeError):  # not all text: Python's hashing
        seen: dict = {}
        return np.fromiter((seen.setdefault(v, len(seen)) for v in values.tolist()), np.int64, len(values))
    return encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)


def group_min(codes, n, values, fill):
    """Per group ``0 .. n-1`` of ``codes``, the least of its ``values`` (int64; ``fill`` where a group has none)."""
    out = np.full(n, fill, np.int64)
    np.minimum.at(out, codes, values)
    return out


def group_max(codes, n, values, fill):
    """Per group ``0 .. n-1`` of ``codes``, the greatest of its ``values`` (int64; ``fill`` where a group has none)."""
    out = np.full(n, fill, np.int64)
    np.maximum.at(out, codes, values)
    return out


def collective_or_name(collective, name) -> np.ndarray:
    """Per comm kernel, its collective, else (None) its kernel name: the ``what`` of :func:`instance_ids` (object)."""
    return np.array([c if c is not None else n for c, n in zip(np.asarray(collective, object).tolist(),
                                                              np.asarray(name, object).tolist())] + [None], object)[:-1]  # fmt: skip


def instance_ids(run_id, rank, start, group, seq, what) -> np.ndarray:
    """The instance id of each comm kernel record (see the module docstring): ``seq:GROUP#SEQ`` where the
    record has a process group and a sequence number, else ``pos:GROUP:WHAT#N`` (the N-th kernel of that
    collective in that group on its rank, by start). ``group``, ``what`` (the collective, else the kernel's
    name): str or None; ``seq``: int64, -1 where unknown."""
    n = len(rank)
    group = ["" if g is None else g for g in np.asarray(group, object).tolist()]
    what = np.asarray(what, object).tolist()
    run_id, rank, start = np.asarray(run_id, object), np.asarray(rank, np.int64), np.asarray(start, np.int64)
    seq = np.asarray(seq, np.int64)
    # the n-th by (run, rank, start), ties in record order
    runs = {r: i for i, r in enumerate(sorted(set(run_id.tolist())))}
    run_order = np.fromiter((runs[r] for r in run_id.tolist()), np.int64, n) if len(runs) > 1 else np.zeros(n, np.int64)
    order = np.lexsort((start, rank, run_order))
    key = factorize(run_id, rank, np.asarray(group, object), np.asarray(what, object))[order]
    by_key = np.argsort(key, kind="stable")
    ks = key[by_key]
    begins = np.r_[0, np.flatnonzero(ks[1:] != ks[:-1]) + 1] if n else np.empty(0, np.int64)
    counts = np.diff(np.r_[begins, n])
    pos_sorted = np.arange(n) - np.repeat(begins, counts)
    pos = np.empty(n, np.int64)
    pos[order[by_key]] = pos_sorted
    return np.array([f"seq:{g}#{q}" if q != -1 and g != "" else f"pos:{g}:{w}#{p}"
                     for g, w, q, p in zip(group, what, seq.tolist(), pos.tolist())] + [None], dtype=object)[:-1]  # fmt: skip


def peer_waits(run_id, instance, rank, start, end, domain) -> tuple[np.ndarray, np.ndarray]:
    """``(wait_ns, known)`` per comm kernel record: its instance's latest arrival (a rank arrives with its first
    kernel of the instance) − its rank's arrival, exact int64 ns; known where the instance has two ranks or more
    on comparable clocks (``domain``: the records' clock domains) whose ends agree (:func:`ends_apart`)."""
    code = factorize(run_id, instance)
    rank = np.asarray(rank, np.int64)
    start, end = np.asarray(start, np.int64), np.asarray(end, np.int64)
    if not len(code):
        return np.empty(0, np.int64), np.empty(0, bool)
    n = int(code.max()) + 1
    cr = factorize(code, rank)
    m = int(cr.max()) + 1
    cr_code = np.empty(m, np.int64)
    cr_code[cr] = code
    arrival = group_min(cr, m, start, np.iinfo(np.int64).max)
    rank_end = group_max(cr, m, end, np.iinfo(np.int64).min)
    latest = group_max(cr_code, n, arrival, np.iinfo(np.int64).min)
    ranks = np.bincount(cr_code, minlength=n)
    domains = np.bincount(np.unique(np.stack([code, factorize(np.asarray(domain, object))]), axis=1)[0], minlength=n)
    apart = ends_apart(group_min(cr_code, n, rank_end, np.iinfo(np.int64).max), group_max(cr_code, n, rank_end, np.iinfo(np.int64).min),
                       latest)  # fmt: skip
    return latest[code] - arrival[cr], ((ranks > 1) & (domains <= 1) & ~apart)[code]


def instances_of(run_id, instance, collective, rank, ready, start, end, peer_us, domain, message_bytes=None) -> dict:
    """:func:`collective_instances`' columns as arrays (one per instance, in order of first appearance), from the
    records' arrays: ``ready`` int64 (-1 unknown), ``peer_us`` float (NaN unknown), ``message_bytes`` float or None.
    Nullable columns come as ``(values, null mask)``."""
    code = factorize(run_id, instance)
    rank = np.asarray(rank, np.int64)
    ready, start, end = (np.asarray(a, np.int64) for a in (ready, start, end))
    n = int(code.max()) + 1 if len(code) else 0
    big, small = np.iinfo(np.int64).max, np.iinfo(np.int64).min
    first_row = np.full(n, len(code), np.int64)
    np.minimum.at(first_row, code, np.arange(len(code)))
    # a rank's arrival at an instance is its first kernel of it (a copy-engine collective runs as several kernels on
    # one rank): ready, start and skew compare ranks, never one rank's kernels with each other
    cr = factorize(code, rank)
    m = int(cr.max()) + 1 if len(cr) else 0
    cr_code, cr_rank = np.empty(m, np.int64), np.empty(m, np.int64)
    cr_code[cr], cr_rank[cr] = code, rank
    has_ready = ready != -1
    r_min = group_min(cr[has_ready], m, ready[has_ready], big)  # big: no ready time on that rank
    s_min, e_max = group_min(cr, m, start, big), group_max(cr, m, end, small)
    r_known = r_min != big
    first_ready = group_min(cr_code[r_known], n, r_min[r_known], big)
    last_ready = group_max(cr_code[r_known], n, r_min[r_known], small)
    ready_null = first_ready == big
    # the slowest rank: the lowest rank whose ready time is its instance's latest
    at_last = r_known & (r_min == last_ready[cr_code])
    slow = group_min(cr_code[at_last], n, cr_rank[at_last], big)
    last_start = group_max(cr_code, n, s_min, small)
    # the straggler: the rank whose first start of the instance is the latest (the lowest on a tie)
    at_start = s_min == last_start[cr_code]
    strag = group_min(cr_code[at_start], n, cr_rank[at_start], big)
    domains = np.bincount(np.unique(np.stack([code, factorize(np.asarray(domain, object))]), axis=1)[0], minlength=n) if n else \
        np.zeros(0, np.int64)  # fmt: skip
    clocks_apart = domains > 1
    ends = ends_apart(group_min(cr_code, n, e_max, big), group_max(cr_code, n, e_max, small), last_start)
    apart = clocks_apart | ends
    last_end = group_max(code, n, end, small)
    t_ns = last_end - last_start
    n_ranks = np.bincount(cr_code, minlength=n).astype(np.int64)
    coll = np.full(n, None, dtype=object)  # the first known collective of each instance
    collective = np.asarray(collective, object)
    known = np.flatnonzero(np.array([c is not None for c in collective.tolist()], bool))
    firsts = np.full(n, len(code), np.int64)
    np.minimum.at(firsts, code[known], known)
    has_coll = firsts < len(code)
    coll[has_coll] = collective[firsts[has_coll]]
    size = np.full(n, np.nan)
    if message_bytes is not None:
        b = np.asarray(message_bytes, np.float64)
        ok = ~np.isnan(b)
        np.fmax.at(size, code[ok], b[ok])
    has_size = ~np.isnan(size)
    alg = np.where(has_size & (t_ns > 0), size / np.where(t_ns > 0, t_ns, 1), np.nan)  # bytes/ns = GB/s
    factor = np.array([np.nan if (f := bus_factor(c, int(k))) is None else f for c, k in zip(coll.tolist(), n_ranks.tolist())])
    peer = np.asarray(peer_us, np.float64)
    max_peer = np.full(n, np.nan)
    np.fmax.at(max_peer, code, peer)
    no_skew = apart | (n_ranks < 2)  # one rank: no skew to speak of
    note = np.where(clocks_apart, "ranks on clocks that do not compare (different hosts, no alignment): no skew or wait",
                    np.where(ends, "the ranks' ends disagree by more than the instance lasted: not one instance on comparable "
                                   "clocks (matched by position?), no skew or wait", None))  # fmt: skip
    return {
        "run_id": np.asarray(run_id, object)[first_row], "instance": np.asarray(instance, object)[first_row],
        "collective": coll, "n_ranks": n_ranks,
        "first_ready_ns": (np.where(ready_null, 0, first_ready), ready_null),
        "last_ready_ns": (np.where(ready_null, 0, last_ready), ready_null),
        "arrival_skew_us": (np.where(ready_null | no_skew, 0, last_ready - first_ready) / 1000.0, ready_null | no_skew),
        "slowest_rank": (np.where(slow == big, 0, slow), (slow == big) | no_skew),
        "straggler": (np.where(strag == big, 0, strag), (strag == big) | no_skew),
        "first_start_ns": group_min(code, n, start, big), "last_start_ns": last_start, "last_end_ns": last_end,
        "time_us": t_ns / 1000.0, "max_peer_wait_us": max_peer,
        "bytes": (np.where(has_size, size, 0).astype(np.int64), ~has_size),
        "algbw_gbps": alg, "busbw_gbps": alg * factor, "clock_note": note,
    }  # fmt: skip


def _text(values) -> np.ndarray:
    """A text column (a pandas Series) as str / None (pandas' NaN and NA as None)."""
    return values.to_numpy(dtype=object, na_value=None)


def instance_keys(explained: pd.DataFrame) -> pd.Series:
    """The instance id of each comm kernel record (see the module docstring; :func:`instance_ids`)."""
    import pandas as pd

    what = [c if isinstance(c, str) else n for c, n in zip(_text(explained["collective"]).tolist(), _text(explained["name"]).tolist())]
    seq = pd.array(explained["comm_seq"], dtype="Int64").to_numpy(np.int64, na_value=-1)
    ids = instance_ids(explained["run_id"].to_numpy(object), explained["rank"].to_numpy(np.int64),
                       explained["start_ns"].to_numpy(np.int64), _text(explained["comm_group"]), seq, what)  # fmt: skip
    return pd.Series(ids, index=explained.index, dtype=object)


def attach_peer_wait(explained: pd.DataFrame, domains: pd.DataFrame | None = None) -> pd.DataFrame:
    """``explained`` with ``instance``, ``peer_wait_us`` (exact ns differences shown in µs) and
    ``clock_domain``. ``domains``: :func:`overlapviz.analysis.clocks.clock_domains` rows; an
    instance whose ranks' clocks do not compare gets no peer wait (null), never one from clocks."""
    import pandas as pd

    n = len(explained)
    if domains is not None and len(domains) and n:
        dom = explained[["run_id", "rank"]].astype({"rank": "int64"}).merge(
            domains[["run_id", "rank", "clock_domain"]].astype({"rank": "int64"}), on=["run_id", "rank"], how="left"
        )["clock_domain"].fillna("").to_numpy(object)  # fmt: skip
    else:
        dom = np.full(n, "", dtype=object)
    if not n:
        return explained.assign(instance=pd.Series(dtype=object), peer_wait_us=pd.Series(dtype="Float64"),
                                clock_domain=pd.Series(dtype=object))  # fmt: skip
    comm = (explained["kind"] == "comm").to_numpy() if "kind" in explained else np.ones(n, bool)
    inst = pd.Series(None, index=explained.index, dtype=object)  # peers are a collective's: other kernels have none
    peer = pd.array([pd.NA] * n, dtype="Float64")
    sub = explained[comm]
    if len(sub):
        keys = instance_keys(sub).to_numpy(object)
        wait_ns, known = peer_waits(sub["run_id"].to_numpy(object), keys, sub["rank"].to_numpy(np.int64),
                                    sub["start_ns"].to_numpy(np.int64), sub["end_ns"].to_numpy(np.int64), dom[comm])  # fmt: skip
        inst[comm] = keys
        values = pd.array(wait_ns / 1000.0, dtype="Float64")
        values[~known] = pd.NA
        peer[np.flatnonzero(comm)] = values
    return explained.assign(instance=inst, peer_wait_us=peer, clock_domain=dom)


def bus_factor(collective: str | None, n: int) -> float | None:
    """nccl-tests' bus bandwidth factor of a collective over ``n`` ranks (None: unknown collective)."""
    if n < 1 or collective is None:
        return None
    if collective == "all_reduce":
        return 2.0 * (n - 1) / n
    if collective in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    if collective in ("broadcast", "reduce", "send", "recv", "send_recv"):
        return 1.0
    return None


def collective_instances(explained: pd.DataFrame, message_bytes: pd.Series | None = None) -> pd.DataFrame:
    """One row per collective instance: ranks, arrival skew, the slowest rank, peer wait, and bandwidth.

    Parameters
    ----------
    explained
        :func:`overlapviz.analysis.explain.explain` records (with ``instance``).
    message_bytes
        Optional bytes of each record's message (aligned with ``explained``): where given,
        ``algbw_gbps`` and ``busbw_gbps`` (GB/s, 1e9 bytes) are filled.

    Returns
    -------
    pandas.DataFrame
        ``run_id, instance, collective, n_ranks, first_ready_ns, last_ready_ns,
        arrival_skew_us`` (last − first ready: when the last rank could start),
        ``slowest_rank`` (the last to be ready), ``straggler`` (the rank that started it
        last: DESIGN.md's straggler; the lowest such rank on a tie), ``first_start_ns,
        last_start_ns, last_end_ns, time_us, max_peer_wait_us, bytes, algbw_gbps,
        busbw_gbps``, ``clock_note``. Where the instance's ranks' clocks do not compare
        (``clock_domain``), or their ends disagree by more than the instance lasted
        (:func:`ends_apart`: not one instance on comparable clocks), the skew, the slowest
        rank, the straggler and the peer wait are null and ``clock_note`` says why.
    """
    import pandas as pd

    if not len(explained):
        return pd.DataFrame(columns=INSTANCE_COLUMNS)
    ready = pd.array(explained["ready_ns"], dtype="Int64").to_numpy(np.int64, na_value=-1)
    peer = pd.array(pd.to_numeric(explained["peer_wait_us"], errors="coerce"), dtype="Float64").to_numpy(np.float64, na_value=np.nan)
    size = None if message_bytes is None else \
        pd.array(pd.to_numeric(message_bytes, errors="coerce"), dtype="Float64").to_numpy(np.float64, na_value=np.nan)  # fmt: skip
    dom = _text(explained["clock_domain"]) if "clock_domain" in explained else np.full(len(explained), "", object)
    cols = instances_of(explained["run_id"].to_numpy(object), explained["instance"].to_numpy(object), _text(explained["collective"]),
                        pd.array(explained["rank"], dtype="Int64").to_numpy(np.int64), ready,
                        explained["start_ns"].to_numpy().astype(np.int64), explained["end_ns"].to_numpy().astype(np.int64),
                        peer, np.where(pd.isna(dom), "", dom), size)  # fmt: skip
    out = {}
    for c in INSTANCE_COLUMNS:
        v = cols[c]
        if c == "arrival_skew_us":
            v = pd.arrays.FloatingArray(v[0].astype(np.float64), v[1])
        elif isinstance(v, tuple):
            v = pd.arrays.IntegerArray(v[0].astype(np.int64), v[1])
        out[c] = v
    return pd.DataFrame(out)[INSTANCE_COLUMNS]
