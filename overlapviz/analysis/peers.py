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

import numpy as np
import pandas as pd

__all__ = ["attach_peer_wait", "collective_instances", "bus_factor", "ends_apart", "END_TOLERANCE_NS"]

# the ranks of one collective instance on comparable clocks end it together (NCCL/RCCL: within
# microseconds; DLRM's 8 ranks within 1-7 µs): ends further apart than the instance lasted, plus this
# much for integer-µs traces, mean the matched kernels are not one instance on comparable clocks
END_TOLERANCE_NS = 10_000


def ends_apart(end_min, end_max, last_arrival):
    """Per instance, whether its ranks' ends (each rank's last end: ``end_min``, ``end_max`` over ranks)
    disagree by more than the instance lasted once its last rank arrived (``end_max − last_arrival``)
    plus :data:`END_TOLERANCE_NS`: no peer wait, skew or straggler is computed for such an instance."""
    end_min, end_max, last_arrival = (np.asarray(a, np.int64) for a in (end_min, end_max, last_arrival))
    return (end_max - end_min) > np.maximum(end_max - last_arrival, 0) + END_TOLERANCE_NS


def instance_keys(explained: pd.DataFrame) -> pd.Series:
    """The instance id of each comm kernel record (see the module docstring)."""
    group = explained["comm_group"].astype(object).where(explained["comm_group"].notna(), "")
    seq = explained["comm_seq"]
    what = explained["collective"].astype(object).where(explained["collective"].notna(), explained["name"])
    by_seq = seq.notna() & (group != "")
    order = explained.assign(_g=group, _w=what).sort_values(["run_id", "rank", "start_ns"], kind="stable")
    pos = order.groupby(["run_id", "rank", "_g", "_w"], sort=False).cumcount().reindex(explained.index)
    positional = "pos:" + group.astype(str) + ":" + what.astype(str) + "#" + pos.astype(str)
    seqd = "seq:" + group.astype(str) + "#" + seq.astype("Int64").astype(str)
    return pd.Series(np.where(by_seq, seqd, positional), index=explained.index, dtype=object)


def attach_peer_wait(explained: pd.DataFrame, domains: pd.DataFrame | None = None) -> pd.DataFrame:
    """``explained`` with ``instance``, ``peer_wait_us`` (exact ns differences shown in µs) and
    ``clock_domain``. ``domains``: :func:`overlapviz.analysis.clocks.clock_domains` rows; an
    instance whose ranks' clocks do not compare gets no peer wait (null), never one from clocks."""
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
        keys = instance_keys(sub)
        sub = sub.assign(instance=keys, _dom=dom[comm])
        # a rank arrives at an instance with its first kernel of it (a copy-engine collective can be several)
        by_rank = sub.groupby(["run_id", "instance", "rank"], sort=False)
        arrival = by_rank["start_ns"].transform("min").astype(np.int64)
        rank_end = by_rank["end_ns"].transform("max").astype(np.int64)
        g = sub.assign(_arrival=arrival, _end=rank_end).groupby(["run_id", "instance"], sort=False)
        latest = g["_arrival"].transform("max").to_numpy().astype(np.int64)  # int64 ns, exact
        ranks = g["rank"].transform("nunique").to_numpy()
        clocks_apart = g["_dom"].transform("nunique").to_numpy() > 1
        apart = ends_apart(g["_end"].transform("min"), g["_end"].transform("max"), latest)
        wait_ns = latest - arrival.to_numpy()
        inst[comm] = keys.to_numpy(object)
        values = pd.array(wait_ns / 1000.0, dtype="Float64")
        values[(ranks <= 1) | clocks_apart | apart] = pd.NA
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
    cols = ["run_id", "instance", "collective", "n_ranks", "first_ready_ns", "last_ready_ns", "arrival_skew_us",
            "slowest_rank", "straggler", "first_start_ns", "last_start_ns", "last_end_ns", "time_us", "max_peer_wait_us",
            "bytes", "algbw_gbps", "busbw_gbps", "clock_note"]  # fmt: skip
    if not len(explained):
        return pd.DataFrame(columns=cols)
    # vectorized over instances (a million kernels in well under a second), in int64 ns where times
    # are: ready times are epoch-scale ns, which float64 would round to 256 ns
    code = pd.factorize(pd.MultiIndex.from_arrays([explained["run_id"].to_numpy(object),
                                                   explained["instance"].to_numpy(object)]), sort=False)[0]  # fmt: skip
    ready = pd.array(explained["ready_ns"], dtype="Int64")
    d = pd.DataFrame({
        "code": code, "run_id": explained["run_id"].to_numpy(object), "instance": explained["instance"].to_numpy(object),
        "collective": explained["collective"].to_numpy(object), "rank": pd.array(explained["rank"], dtype="Int64"),
        "ready": ready, "start": explained["start_ns"].to_numpy().astype(np.int64),
        "end": explained["end_ns"].to_numpy().astype(np.int64),
        "peer": pd.array(pd.to_numeric(explained["peer_wait_us"], errors="coerce"), dtype="Float64"),
        "bytes": pd.array([pd.NA] * len(explained) if message_bytes is None else pd.to_numeric(message_bytes, errors="coerce"),
                          dtype="Float64"),
        "dom": explained["clock_domain"].fillna("").to_numpy(object) if "clock_domain" in explained else "",
    })  # fmt: skip
    g = d.groupby("code", sort=True)  # codes number the instances in order of first appearance
    # a rank's arrival at an instance is its first kernel of it (a copy-engine collective runs as several
    # kernels on one rank): ready, start and skew compare ranks, never one rank's kernels with each other
    arrive = d.groupby(["code", "rank"], sort=True).agg(ready=("ready", "min"), start=("start", "min"),
                                                         end=("end", "max")).reset_index()  # fmt: skip
    ga = arrive.groupby("code", sort=True)
    first_ready, last_ready = ga["ready"].min(), ga["ready"].max()
    # the slowest rank: the lowest rank whose ready time is its instance's latest
    at_max = (arrive["ready"] == ga["ready"].transform("max")).fillna(False).to_numpy(bool)
    slow = arrive.loc[at_max].groupby("code")["rank"].min().reindex(first_ready.index)
    last_start, last_end = ga["start"].max(), g["end"].max()
    # the straggler: the rank whose first start of the instance is the latest
    arrive["last"] = ga["start"].transform("max")
    strag = arrive.loc[arrive["start"] == arrive["last"]].groupby("code")["rank"].min().reindex(first_ready.index)
    clocks_apart = (g["dom"].nunique() > 1).to_numpy(bool)
    ends = ends_apart(ga["end"].min(), ga["end"].max(), last_start)
    apart = clocks_apart | ends
    t_ns = (last_end - last_start).to_numpy(np.int64)
    n = g["rank"].nunique().to_numpy(np.int64)
    coll = g["collective"].first()
    size = g["bytes"].max()
    has_size = size.notna().to_numpy(bool)
    size_f = size.to_numpy(np.float64, na_value=np.nan)
    alg = np.where(has_size & (t_ns > 0), size_f / np.where(t_ns > 0, t_ns, 1), np.nan)  # bytes/ns = GB/s
    factor = np.array([np.nan if (f := bus_factor(c, int(m))) is None else f for c, m in zip(coll.to_numpy(object), n)])
    firsts = g[["run_id", "instance"]].first()
    skew_ns = last_ready - first_ready  # Int64: exact, NA where no rank has a ready time
    skew = pd.array(skew_ns, dtype="Float64") / 1000.0
    skew[apart | (n < 2)] = pd.NA  # one rank: no skew to speak of
    slow_ranks = pd.array(slow.to_numpy(), dtype="Int64")
    slow_ranks[apart | (n < 2)] = pd.NA
    strag_ranks = pd.array(strag.to_numpy(), dtype="Int64")
    strag_ranks[apart | (n < 2)] = pd.NA
    note = np.where(clocks_apart, "ranks on clocks that do not compare (different hosts, no alignment): no skew or wait",
                    np.where(ends, "the ranks' ends disagree by more than the instance lasted: not one instance on comparable "
                                   "clocks (matched by position?), no skew or wait", None))  # fmt: skip
    out = pd.DataFrame({
        "run_id": firsts["run_id"].to_numpy(object), "instance": firsts["instance"].to_numpy(object),
        "collective": coll.to_numpy(object), "n_ranks": n,
        "first_ready_ns": first_ready.to_numpy(), "last_ready_ns": last_ready.to_numpy(),
        "arrival_skew_us": skew, "slowest_rank": slow_ranks, "straggler": strag_ranks,
        "first_start_ns": g["start"].min().to_numpy(np.int64), "last_start_ns": last_start.to_numpy(np.int64),
        "last_end_ns": last_end.to_numpy(np.int64), "time_us": t_ns / 1000.0, "max_peer_wait_us": g["peer"].max().to_numpy(),
        "bytes": pd.array(np.where(has_size, size_f, np.nan), dtype="Float64").astype("Int64"),
        "algbw_gbps": alg, "busbw_gbps": alg * factor, "clock_note": note,
    })  # fmt: skip
    return out[cols]
