"""Why each collective started late (DESIGN.md): its ready time from launch, stream order and event dependencies; SM room by occupancy and grid; one cause; peers across ranks.

For a communication kernel ``c`` (start ``S``, launch ``L``):

* ``stream_ready_ns`` / ``dependency_ready_ns``: :mod:`overlapviz.analysis.dependencies`;
  ``ready_ns`` the latest known of ``L``, stream and dependency (``ready_from``: the first
  of ``launch``, ``stream``, ``dependency`` that reaches it).
* ``S − L`` splits into ``stream_wait_ns`` = max(0, stream − L), ``dependency_wait_ns`` =
  max(0, dependency − max(L, stream)) and ``ready_wait_ns`` = S − ready.
* SM room at ``ready_ns``: each computation kernel resident then (one per stream:
  start <= ready < end) with ``G`` blocks and ``b`` blocks per SM (occupancy) on an
  ``N``-SM device is in wave ``w`` of ``ceil(G / (N b))`` (its elapsed fraction of its
  duration) and holds ``min(N, ceil(G_left / b))`` SMs, ``G_left = G − w N b``. SMs that
  none holds are free, and ``c`` fits there (its occupancy alone); on a held SM it fits
  beside ``b`` of that kernel's blocks by :func:`overlapviz.analysis.occupancy.blocks_fit`.
  ``comm_blocks_fit_per_sm`` is the best SM's; ``sms_with_room`` how many SMs take one
  block. Unknown (null) where the device limits or a launch shape are unknown.
* ``cause``: ``none`` when S <= L; else the largest of the three parts, the ready part
  named ``sm_resources`` when no block of ``c`` fits at ready (then ``blocking_resource``
  and ``blocker``: the resident computation kernel whose end, or last wave, came last
  before ``S``), ``launch_latency`` when it is at most ``LAUNCH_LATENCY_NS``, else
  ``unknown``. Ties go to ``dependency``, then ``stream_order``.
* ``peer_wait_us``: :mod:`overlapviz.analysis.peers`.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from overlapviz.dataset import schema
from overlapviz.analysis import clocks, peers
from overlapviz.analysis.dependencies import UNKNOWN, dependency_ready, stream_previous, stream_ready
from overlapviz.analysis.rankwise import per_rank, rank_tables

if TYPE_CHECKING:
    import pandas as pd

# pandas, and the occupancy and residency modules (pandas), are imported where they are used: the collective
# instances (``instance_columns``, ``overlapviz explain --instances``) are computed without them (issue 36)

__all__ = ["CAUSES", "LAUNCH_LATENCY_NS", "KEYS", "PEER_READS", "INSTANCE_READS", "explain", "per_rank", "summarize", "cause_waits", "part_waits", "rank_links", "comm_start_delays",
           "summarize_delays", "ready_times", "instance_columns"]

CAUSES = ("stream_order", "dependency", "launch_call", "sm_resources", "launch_latency", "unknown", "none")
# ready -> start with room for the collective: up to this much is the launch path's own
# latency under the profiler (measured on an H200: 8-29 µs on an idle or lightly loaded GPU, sample_traces/scenarios)
LAUNCH_LATENCY_NS = 50_000
# DESIGN.md's keys of `overlapviz explain`, in order
KEYS = [
    "run_id", "rank", "stream", "correlation", "name", "collective", "start_ns", "launch_ns", "stream_ready_ns",
    "dependency_ready_ns", "dependency_source", "ready_ns", "ready_from", "start_delay_us", "cause",
    "blocking_resource", "blocker", "comm_blocks_fit_per_sm", "peer_wait_us",
]  # fmt: skip
EXTRA = [
    "kind", "device", "step", "end_ns", "launch_tid", "start_minus_launch_ns", "stream_wait_ns", "dependency_wait_ns",
    "ready_wait_ns", "producer", "producer_correlation", "producer_stream", "n_resident_compute", "resident_compute",
    "free_sms", "sms_with_room", "num_sms", "comm_group", "comm_seq", "instance", "host_wait_ns", "host_wait_call",
    "residency_note", "launch_call_ns", "ready_part", "ready_blocker", "ready_blocking_resource", "stream_previous", "stream_previous_kind", "launch_to_start_us",
    "clock_domain",
]  # fmt: skip
READ = [
    "run_id", "rank", "device", "stream", "correlation", "name", "kind", "is_host", "start_ns", "end_ns", "grid_x",
    "grid_y", "grid_z", "block_x", "block_y", "block_z", "regs_per_thread", "shared_mem_bytes", "sgprs", "accum_vgprs",
    "launch_ns", "launch_tid", "step", "collective", "comm_group", "comm_seq",
]  # fmt: skip
# the launch call's end (launch_call), where the dataset's schema has it
READ += [c for c in ("launch_end_ns",) if c in schema.KERNELS.names]
DICTIONARY = ("run_id", "name", "kind", "collective", "comm_group")  # read without a string per row
# the record columns peers.attach_peer_wait reads; and those peers.collective_instances reads
PEER_READS = ("run_id", "rank", "kind", "name", "collective", "comm_group", "comm_seq", "start_ns", "end_ns")
INSTANCE_READS = PEER_READS + ("ready_ns", "instance", "peer_wait_us", "clock_domain")
_SYNC_INTS = ("tid", "start_ns", "end_ns", "correlation", "stream", "wait_on_stream", "wait_on_record_correlation")
_HOST_WAITS = ("stream_sync", "context_sync", "event_sync")  # calls that block the host until the GPU catches up
_RESOURCE = {"blocks": "block_slots"}  # the fit model's names -> DESIGN.md's


def int_column(table: pa.Table, name: str) -> np.ndarray:
    """An integer column as an int64 array, null as ``UNKNOWN`` (-1)."""
    col = table.column(name)
    return pc.fill_null(col, UNKNOWN).to_numpy().astype(np.int64) if len(col) else np.empty(0, np.int64)


def str_column(table: pa.Table, name: str) -> np.ndarray:
    """A string column as an object array (dictionary-encoded columns decoded through their dictionary)."""
    col = table.column(name)
    if not len(col):
        return np.empty(0, object)
    col = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    if pa.types.is_dictionary(col.type):
        words = np.asarray(col.dictionary.to_pylist() + [None], dtype=object)
        return words[pc.fill_null(col.indices, len(col.dictionary)).to_numpy().astype(np.int64)]
    return col.to_numpy(zero_copy_only=False).astype(object)


def explain(dataset_path: str | os.PathLike, *, run_ids=None, kinds: tuple[str, ...] = ("comm",), device: str | None = None,
            pause: Callable[[], None] | None = None, on_rank: Callable | None = None, columns=None, peers_matched: bool = True,
            keep_rows: Callable | None = None) -> pd.DataFrame:  # fmt: skip
    """One record per communication kernel (or per kernel of ``kinds``): why it started when it did (module docstring).

    The definitions are the same for any GPU activity; ``kinds=("comm", "compute", "memory", "other")``
    explains every one (a computation kernel that waited on an event, say). Peers are matched
    for communication kernels only. ``device`` names the GPU for ranks whose trace does not
    (:func:`overlapviz.analysis.residency.device_table`). ``pause``, when given, is called before reading and
    each rank: a host computing this in the background (the dashboard) waits there while it draws a page.
    ``on_rank``, when given, is called with ``(run_id, rank, rows, syncs, links)`` for every rank
    (:class:`Links`), so that a caller reusing the rank's rows reads and links them once (the findings).
    ``columns``, when given, keeps only those record columns (and those peer matching reads) of each rank
    as it is explained: a caller that needs a few (``peers.collective_instances``) holds a few per kernel.
    ``peers_matched=False`` leaves out the peer columns (``instance``, ``peer_wait_us``, ``clock_domain``) and
    what matching them reads; ``keep_rows``, when given, takes each rank's records (after ``columns``) and
    returns those to keep: a caller that reads a few records (the findings' start delays) holds those alone
    (issue 36: what is kept of every rank is what bounds the memory).

    Returns
    -------
    pandas.DataFrame
        ``KEYS`` then ``EXTRA`` columns; times int64 ns (nullable), ``start_delay_us`` and
        ``peer_wait_us`` float µs computed from exact ns. Sorted by run, rank, start.
    """
    import pandas as pd

    from overlapviz.analysis.residency import device_table, run_carveouts

    keep = None if columns is None else set(columns) | (set(PEER_READS) if peers_matched else set())
    dev_limits = device_table(dataset_path, device)
    carveouts = run_carveouts(dataset_path)
    parts = []
    memo: dict = {}  # occupancy per launch shape and device limits, shared by the ranks (_occupancy)
    # one rank's kernels in memory at a time (issue 36): the records kept are the comm kernels'
    for run_id, rank, rk, rs in rank_tables(dataset_path, READ, run_ids=run_ids, dictionary=DICTIONARY, pause=pause):
        links = rank_links(rk, rs)
        if on_rank is not None:
            on_rank(run_id, rank, rk, rs, links)
        part = explain_rank(rk, rs, dev_limits, carveouts, kinds, links=links, memo=memo)
        if part is not None:
            part = part if columns is None else part[[c for c in part.columns if c in keep]]
            parts.append(part if keep_rows is None else keep_rows(part))
        del rk, rs, links, part
    # each step frees the one before: one copy of the kept records at a time beside the next
    out = pd.concat(parts, ignore_index=True) if parts else empty_records()
    del parts
    if peers_matched:
        out = peers.attach_peer_wait(out, clocks.clock_domains(dataset_path, run_ids))
    order = KEYS + EXTRA if columns is None and peers_matched else [c for c in KEYS + EXTRA if c in out.columns]
    if list(out.columns) != order:
        out = out[order]
    if _in_order(out):  # the ranks are read in run, rank order, each by start: no sorted copy of every record
        return out
    return out.sort_values(["run_id", "rank", "start_ns"], kind="stable").reset_index(drop=True)


def _in_order(records: pd.DataFrame) -> bool:
    """Whether ``records`` are already as a stable sort by run, rank, start leaves them (no null key, an index 0..n-1)."""
    import pandas as pd

    n = len(records)
    if not isinstance(records.index, pd.RangeIndex) or records.index.start != 0 or records.index.step != 1:
        return False
    if n < 2:
        return True
    run = records["run_id"].to_numpy(object)
    rank, start = pd.array(records["rank"], dtype="Int64"), pd.array(records["start_ns"], dtype="Int64")
    if pd.isna(run).any() or rank.isna().any() or start.isna().any() or not all(isinstance(r, str) for r in run.tolist()):
        return False
    rank, start = rank.to_numpy(np.int64), start.to_numpy(np.int64)
    same_run = run[:-1] == run[1:]
    same_rank = same_run & (rank[:-1] == rank[1:])
    return bool(np.all((run[:-1] < run[1:]) | (same_run & (rank[:-1] < rank[1:])) | (same_rank & (start[:-1] <= start[1:]))))


# what instance_columns reads of each rank: rank_links' columns and the instance's keys
_INSTANCE_KERNEL_READS = ["run_id", "rank", "device", "stream", "name", "kind", "is_host", "start_ns", "end_ns", "launch_ns",
                          "launch_tid", "collective", "comm_group", "comm_seq"]  # fmt: skip


def instance_columns(dataset_path: str | os.PathLike, *, run_ids=None) -> dict:
    """:func:`overlapviz.analysis.peers.collective_instances` of ``explain(dataset_path)``'s records, computed
    without pandas and without what the instances do not read (the SM room, the causes): the columns as arrays,
    nullable ones as ``(values, null mask)`` (:func:`overlapviz.analysis.peers.instances_of`). What
    ``overlapviz explain --instances`` prints.

    Each rank's comm kernels are reduced as the rank is read (issue 36): their instance ids (numbered within
    the rank, :func:`overlapviz.analysis.peers.instance_ids`) as a code per distinct id, the run, collective and
    clock domain as shared words, and the times: what is kept per comm kernel of the dataset is a few int64s.
    """
    dom_of = clocks.domain_map(dataset_path)
    ids: dict[str, int] = {}  # instance id -> code, one entry per distinct id (an instance's ranks share it)
    got: dict[str, list] = {k: [] for k in ("run_id", "rank", "collective", "instance", "start", "end", "ready", "domain")}
    for run_id, rank, rk, rs in rank_tables(dataset_path, _INSTANCE_KERNEL_READS, run_ids=run_ids, dictionary=DICTIONARY):
        c = np.flatnonzero(str_column(rk, "kind") == "comm")
        if not len(c):
            continue
        links = rank_links(rk, rs)
        runs, ranks = str_column(rk, "run_id")[c], int_column(rk, "rank")[c]
        name, coll = str_column(rk, "name")[c], str_column(rk, "collective")[c]
        what = peers.collective_or_name(coll, name)
        inst = peers.instance_ids(runs, ranks, links.start[c], str_column(rk, "comm_group")[c], int_column(rk, "comm_seq")[c], what)
        got["instance"].append(np.fromiter((ids.setdefault(i, len(ids)) for i in inst.tolist()), np.int64, len(c)))
        for key, values in (("run_id", runs), ("rank", ranks), ("collective", coll), ("start", links.start[c]),
                            ("end", links.end[c]), ("ready", ready_times(links, c))):  # fmt: skip
            got[key].append(values)
        got["domain"].append(np.full(len(c), dom_of.get((run_id, rank), ""), object))
        del rk, rs, links, inst, what, name
    col = {k: np.concatenate(v) if v else np.empty(0, object if k in ("run_id", "collective", "domain") else np.int64)
           for k, v in got.items()}  # fmt: skip
    del got
    # explain's order: run, rank, start (ties as read)
    runs = {r: i for i, r in enumerate(sorted(set(col["run_id"].tolist())))}
    order = np.lexsort((col["start"], col["rank"], np.fromiter((runs[r] for r in col["run_id"].tolist()), np.int64, len(col["rank"]))))
    for k in list(col):
        col[k] = col[k][order]
    del order
    wait_ns, known = peers.peer_waits(col["run_id"], col["instance"], col["rank"], col["start"], col["end"], col["domain"])
    peer_us = np.where(known, wait_ns / 1000.0, np.nan)
    del wait_ns, known
    out = peers.instances_of(col["run_id"], col["instance"], col["collective"], col["rank"], col["ready"], col["start"], col["end"],
                             peer_us, col["domain"])  # fmt: skip
    names = np.array(list(ids) + [None], object)[:-1]  # code -> id
    out["instance"] = names[out["instance"].astype(np.int64)]
    return out


def _lanes(device: np.ndarray, stream: np.ndarray, host: np.ndarray) -> np.ndarray:
    """A dense code per (device, stream, host) triple, numbered in order of first appearance: a stream is a device's,
    a host thread is not a stream."""
    if len(stream) and stream.min() >= -1 and stream.max() < (1 << 50) and device.min() >= -1 and device.max() < 1000:
        return peers.factorize((stream + 1) * 2048 + (device + 1) * 2 + host.astype(np.int64))
    return peers.factorize(device, stream, host.astype(np.int64))


def empty_records() -> pd.DataFrame:
    """The records of no kernel: ``explain``'s columns (less ``peer_wait_us``), no rows."""
    import pandas as pd

    return pd.DataFrame({c: pd.Series(dtype=object) for c in KEYS + EXTRA if c != "peer_wait_us"})


@dataclass
class Links:
    """One rank's GPU activities as arrays (aligned with the rank's rows; -1 = unknown): their lane
    (a (device, stream) pair, or a host thread), times, launch, the stream's readiness and the
    event dependency of each (:mod:`overlapviz.analysis.dependencies`), and the rank's sync
    records as arrays with their streams mapped onto lanes."""

    host: np.ndarray
    lane: np.ndarray
    stream: np.ndarray
    device: np.ndarray
    start: np.ndarray
    end: np.ndarray
    launch: np.ndarray
    launch_tid: np.ndarray
    stream_ready: np.ndarray
    dependency_ready: np.ndarray
    dependency_source: np.ndarray
    producer: np.ndarray  # row of the producing activity, -1 none
    syncs: dict
    previous: np.ndarray  # row of the activity whose end is stream_ready, -1 none


def rank_links(k: pa.Table, syncs: pa.Table | None) -> Links:
    """:class:`Links` of one rank's rows ``k`` (the ``READ`` columns) and its ``syncs`` rows."""
    kind = str_column(k, "kind")
    host = pc.fill_null(k.column("is_host"), False).to_numpy(zero_copy_only=False)
    gpu = (~host) & (kind != "")
    stream, start, end = int_column(k, "stream"), int_column(k, "start_ns"), int_column(k, "end_ns")
    device = int_column(k, "device")
    launch, launch_tid = int_column(k, "launch_ns"), int_column(k, "launch_tid")
    # a stream is a (device, stream) pair; host activities (CPU-only traces) run on their thread
    lane = _lanes(device, stream, host)
    previous = stream_previous(lane, start, end)
    s_ready = stream_ready(lane, start, end, previous)
    sync_cols = {}
    if syncs is not None and syncs.num_rows:
        sync_cols = {c: int_column(syncs, c) for c in _SYNC_INTS}
        sync_cols["kind"] = str_column(syncs, "kind")
        sync_cols["name"] = str_column(syncs, "name")
        sync_cols["source"] = str_column(syncs, "source")
        # the stream ids syncs name are the trace's; map them onto this rank's lanes
        ids, first = np.unique(np.where(host, UNKNOWN, stream), return_index=True)
        for c in ("stream", "wait_on_stream"):
            v = sync_cols[c]
            pos = np.minimum(np.searchsorted(ids, v), len(ids) - 1)
            found = (ids[pos] == v) & (v != UNKNOWN)
            sync_cols[c] = np.where(v == UNKNOWN, UNKNOWN, np.where(found, lane[first[pos]], UNKNOWN - 1))
    g = np.flatnonzero(gpu)
    ready = dependency_ready(stream=lane[g], start=start[g], end=end[g], launch=launch[g], launch_tid=launch_tid[g], syncs=sync_cols)
    dep = np.full(len(start), UNKNOWN, np.int64)
    dep_src = np.full(len(start), None, dtype=object)
    prod = np.full(len(start), UNKNOWN, np.int64)
    dep[g], dep_src[g] = ready.dependency_ready_ns, ready.source
    prod[g] = np.where(ready.producer >= 0, g[np.maximum(ready.producer, 0)], UNKNOWN)

    return Links(host, lane, stream, device, start, end, launch, launch_tid, s_ready, dep, dep_src, prod, sync_cols, previous)


def ready_times(links: Links, c: np.ndarray) -> np.ndarray:
    """The ready time of the activities ``c`` (rows of ``links``' rank): the latest known of their launch, their
    stream's readiness and their event dependency; -1 where none is known."""
    known = np.stack([links.launch[c], links.stream_ready[c], links.dependency_ready[c]])
    return np.where((known == UNKNOWN).all(axis=0), UNKNOWN, np.max(np.where(known == UNKNOWN, np.iinfo(np.int64).min, known), axis=0))


def explain_rank(k: pa.Table, syncs: pa.Table | None, dev_limits: dict, carveouts: dict, kinds=("comm",),
                  links: Links | None = None, memo: dict | None = None) -> pd.DataFrame | None:  # fmt: skip
    import pandas as pd

    kind = str_column(k, "kind")
    is_comm = np.isin(kind, list(kinds))
    if not is_comm.any():
        return None
    links = rank_links(k, syncs) if links is None else links
    host, lane, s_ready, sync_cols = links.host, links.lane, links.stream_ready, links.syncs
    stream, start, end, device = links.stream, links.start, links.end, links.device
    launch, launch_tid = links.launch, links.launch_tid
    dep, dep_src, prod = links.dependency_ready, links.dependency_source, links.producer

    c = np.flatnonzero(is_comm)
    host_wait, host_wait_call = _host_waits(c, launch, launch_tid, sync_cols)
    L, S, D, start_c = launch[c], s_ready[c], dep[c], start[c]
    known = np.stack([L, S, D])
    ready_ns = ready_times(links, c)
    which = np.argmax(known == ready_ns, axis=0)
    ready_from = np.where(ready_ns == UNKNOWN, None, np.array(["launch", "stream", "dependency"], dtype=object)[which])
    total = np.where(L != UNKNOWN, start_c - L, UNKNOWN)
    stream_wait = np.where((L != UNKNOWN) & (S != UNKNOWN), np.maximum(0, S - L), 0)
    base = np.maximum(L, S)  # unknowns are -1, below any time
    dep_wait = np.where((D != UNKNOWN) & (base != UNKNOWN), np.maximum(0, D - base), 0)
    ready_wait = np.where(ready_ns != UNKNOWN, start_c - ready_ns, UNKNOWN)
    # the time inside a long launch call (module loading: the first NCCL launch of a process); the
    # ready part is then counted from the call's own end
    E = int_column(k, "launch_end_ns")[c] if "launch_end_ns" in k.column_names else np.full(len(c), UNKNOWN, np.int64)
    call_end = np.where((E != UNKNOWN) & (L != UNKNOWN), np.minimum(np.maximum(E, L), start_c), UNKNOWN)
    # an ordinary launch call (5-30 µs) is the launch path itself, part of launch latency: only a call
    # longer than LAUNCH_LATENCY_NS (module loading, the first NCCL launch of a process) is its own part
    call_end = np.where((call_end != UNKNOWN) & (call_end - L > LAUNCH_LATENCY_NS), call_end, UNKNOWN)
    call_wait = np.where(call_end != UNKNOWN, call_end - L, 0)
    after_call = np.where((ready_wait != UNKNOWN) & (call_end != UNKNOWN), start_c - np.maximum(ready_ns, call_end), ready_wait)

    names = str_column(k, "name")
    room = _sm_room(k, names, c, ready_ns, host, kind, device, lane, start, end, dev_limits, carveouts, memo)
    # a race at ready: the collective and a computation kernel became ready together (both waited on
    # the same event or stream end) and the computation took the SMs first, microseconds after ready.
    # The SMs are then judged at that kernel's start.
    raced = _raced(c, ready_ns, start, host, kind, device, room["fit"])
    if len(raced[0]):
        again = _sm_room(k, names, c[raced[0]], raced[1], host, kind, device, lane, start, end, dev_limits, carveouts, memo)
        blocked = again["fit"] == 0
        for key in room:
            room[key] = np.asarray(room[key]).copy()
            room[key][raced[0][blocked]] = np.asarray(again[key])[blocked]
    fit = room["fit"]
    prev_row = links.previous[c]
    # the three words shared by every row (one string object each, not one per kernel)
    ready_part = np.array(["sm_resources", "launch_latency", "unknown"], dtype=object)[np.where(
        ~np.isnan(fit) & (fit == 0), 0, np.where(np.maximum(after_call, 0) <= LAUNCH_LATENCY_NS, 1, 2))]  # fmt: skip
    parts = np.stack([dep_wait, stream_wait, call_wait, np.maximum(after_call, 0)])
    pick = np.argmax(parts, axis=0)  # ties: dependency, then stream order, then the launch call
    cause = np.array(["dependency", "stream_order", "launch_call", None], dtype=object)[pick]
    cause = np.where(pick == 3, ready_part, cause).astype(object)
    no_delay = np.where(total != UNKNOWN, total <= 0, np.maximum(ready_wait, 0) == 0)
    cause[no_delay] = "none"
    sm = cause == "sm_resources"
    blocking = np.where(sm, room["resource"], None)
    blocker = np.where(sm, room["blocker"], None)

    def nint(a):
        a = np.asarray(a, np.int64)
        return pd.arrays.IntegerArray(a, a == UNKNOWN)

    pcorr = np.where(prod[c] >= 0, int_column(k, "correlation")[np.maximum(prod[c], 0)], UNKNOWN)
    pstream = np.where(prod[c] >= 0, stream[np.maximum(prod[c], 0)], UNKNOWN)
    out = pd.DataFrame(
        {
            "run_id": str_column(k, "run_id")[c],
            "rank": int_column(k, "rank")[c],
            "stream": nint(stream[c]),
            "correlation": nint(int_column(k, "correlation")[c]),
            "name": names[c],
            "collective": str_column(k, "collective")[c],
            "start_ns": start_c,
            "launch_ns": nint(L),
            "stream_ready_ns": nint(S),
            "dependency_ready_ns": nint(D),
            "dependency_source": dep_src[c],
            "ready_ns": nint(ready_ns),
            "ready_from": ready_from,
            "start_delay_us": pd.array(np.where(ready_ns == UNKNOWN, None, ready_wait / 1000.0).tolist(), dtype="Float64"),
            "cause": cause,
            "blocking_resource": blocking,
            "blocker": blocker,
            "comm_blocks_fit_per_sm": pd.array(np.where(np.isnan(fit), None, fit).tolist(), dtype="Float64").astype("Int64"),
            "kind": kind[c],
            "device": nint(device[c]),
            "step": nint(int_column(k, "step")[c]),
            "end_ns": end[c],
            "launch_tid": nint(launch_tid[c]),
            "start_minus_launch_ns": nint(total),
            "stream_wait_ns": nint(np.where(L != UNKNOWN, stream_wait, UNKNOWN)),
            "dependency_wait_ns": nint(np.where(L != UNKNOWN, dep_wait, UNKNOWN)),
            "ready_wait_ns": nint(ready_wait),
            "producer": np.where(prod[c] >= 0, names[np.maximum(prod[c], 0)], None),
            "producer_correlation": nint(pcorr),
            "producer_stream": nint(pstream),
            "n_resident_compute": pd.array(room["n_resident"].tolist(), dtype="Int64"),
            "resident_compute": room["resident"],
            "free_sms": pd.array(np.where(np.isnan(room["free"]), None, room["free"]).tolist(), dtype="Float64").astype("Int64"),
            "sms_with_room": pd.array(np.where(np.isnan(room["with_room"]), None, room["with_room"]).tolist(), dtype="Float64").astype("Int64"),
            "num_sms": pd.array(np.where(np.isnan(room["num_sms"]), None, room["num_sms"]).tolist(), dtype="Float64").astype("Int64"),
            "comm_group": str_column(k, "comm_group")[c],
            "comm_seq": nint(int_column(k, "comm_seq")[c]),
            "host_wait_ns": nint(host_wait),
            "host_wait_call": host_wait_call,
            "residency_note": room["note"],
            "launch_call_ns": nint(np.where((E != UNKNOWN) & (L != UNKNOWN), np.where(call_end != UNKNOWN, call_wait, 0), UNKNOWN)),
            # object columns, as blocker's: pandas would infer str for a rank whose values are all
            # strings and object for one without any, and the concatenation would depend on the ranks
            "ready_part": pd.Series(np.where(ready_ns == UNKNOWN, None, ready_part), dtype=object),
            "ready_blocker": pd.Series(np.where(ready_part == "sm_resources", room["blocker"], None), dtype=object),
            "ready_blocking_resource": pd.Series(np.where(ready_part == "sm_resources", room["resource"], None), dtype=object),
            "stream_previous": pd.Series(np.where(prev_row >= 0, names[np.maximum(prev_row, 0)], None), dtype=object),
            "stream_previous_kind": pd.Series(np.where(prev_row >= 0, kind[np.maximum(prev_row, 0)], None), dtype=object),
            "launch_to_start_us": pd.array(np.where(total == UNKNOWN, None, total / 1000.0).tolist(), dtype="Float64"),
        }
    )
    return out


def _raced(c, ready_ns, start, host, kind, device, fit) -> tuple[np.ndarray, np.ndarray]:
    """Positions in ``c`` of collectives with room at ready that still waited past the launch latency
    while a computation kernel on their device started within that latency after ready, and that
    kernel's start (the first such)."""
    late = (ready_ns != UNKNOWN) & (start[c] - ready_ns > LAUNCH_LATENCY_NS) & ~(fit == 0)
    comp = np.flatnonzero(~host & np.isin(kind, ["compute", "other"]))
    if not late.any() or not len(comp):
        return np.empty(0, np.int64), np.empty(0, np.int64)
    comp = comp[np.argsort(start[comp], kind="stable")]
    cs = start[comp]
    pos = np.flatnonzero(late)
    i = np.searchsorted(cs, ready_ns[pos], side="right")  # the first computation starting after ready
    keep, at = [], []
    for p, j in zip(pos.tolist(), i.tolist()):
        while j < len(comp) and cs[j] <= ready_ns[p] + LAUNCH_LATENCY_NS:
            if device[comp[j]] == device[c[p]] and cs[j] < start[c[p]]:
                keep.append(p)
                at.append(int(cs[j]))
                break
            j += 1
    return np.asarray(keep, np.int64), np.asarray(at, np.int64)


def _host_waits(c: np.ndarray, launch: np.ndarray, launch_tid: np.ndarray, syncs: dict) -> tuple[np.ndarray, np.ndarray]:
    """Time the launching thread spent blocked in synchronous waits (``cudaStreamSynchronize``,
    ``cudaDeviceSynchronize``, ``cudaEventSynchronize``) between its previous launch and each
    kernel's launch, and the longest such call: what made a launch itself late (-1: unknown)."""
    total = np.full(len(c), UNKNOWN, np.int64)
    longest = np.full(len(c), None, dtype=object)
    if not len(syncs.get("kind", ())) or not len(c):
        return total, longest
    is_wait = np.isin(syncs["kind"], _HOST_WAITS) & (syncs["source"] == "runtime") & (syncs["tid"] != UNKNOWN)
    known = (launch != UNKNOWN) & (launch_tid != UNKNOWN)
    for tid in np.unique(launch_tid[c][known[c]]):
        mine = np.flatnonzero(known & (launch_tid == tid))
        t = np.sort(launch[mine])
        w = np.flatnonzero(is_wait & (syncs["tid"] == tid))
        q = c[known[c] & (launch_tid[c] == tid)]
        qi = np.searchsorted(c, q)
        total[qi] = 0
        if not len(w):
            continue
        prev = _last_before_value(t, launch[q])  # the previous launch on this thread (-1: none)
        ends, starts = syncs["end_ns"][w], syncs["start_ns"][w]
        for j, (lo, hi) in enumerate(zip(prev.tolist(), launch[q].tolist())):
            inside = (starts >= lo) & (ends <= hi)
            if inside.any():
                dur = ends[inside] - starts[inside]
                total[qi[j]] = int(dur.sum())
                longest[qi[j]] = syncs["name"][w[inside][np.argmax(dur)]]
    return total, longest


def _last_before_value(sorted_times: np.ndarray, at: np.ndarray) -> np.ndarray:
    pos = np.searchsorted(sorted_times, at, side="left") - 1
    return np.where(pos >= 0, sorted_times[np.maximum(pos, 0)], UNKNOWN)


def _sm_room(k, names, c, ready_ns, host, kind, device, lane, start, end, dev_limits, carveouts, memo=None) -> dict:
    """SM room for each comm kernel ``c`` at its ready time (module docstring), vectorized over
    (comm kernel, resident computation kernel) pairs."""
    from overlapviz.analysis.occupancy import blocks_fit, capacity

    n = len(c)
    res = {"fit": np.full(n, np.nan), "free": np.full(n, np.nan), "with_room": np.full(n, np.nan),
           "num_sms": np.full(n, np.nan), "resource": np.full(n, None, object), "blocker": np.full(n, None, object),
           "n_resident": np.zeros(n, np.int64), "resident": np.full(n, None, object), "note": np.full(n, None, object)}  # fmt: skip
    if host[c].all():
        res["note"][:] = "host activity (CPU-only trace): no SMs"
        res["n_resident"] = np.full(n, None)
        return res
    comp = np.flatnonzero(~host & np.isin(kind, ["compute", "other"]))
    # resident computation at each comm kernel's ready time: at most one per stream (streams run in order)
    t = np.where(ready_ns == UNKNOWN, start[c], ready_ns)
    pair_i, pair_r = [], []
    for ln in np.unique(lane[comp]):
        m = comp[lane[comp] == ln]
        m = m[np.argsort(start[m], kind="stable")]
        pos = np.searchsorted(start[m], t, side="right") - 1
        idx = m[np.maximum(pos, 0)]
        hit = np.flatnonzero((pos >= 0) & (end[idx] > t) & (device[idx] == device[c]))
        pair_i.append(hit)
        pair_r.append(idx[hit])
    pi = np.concatenate(pair_i) if pair_i else np.empty(0, np.int64)
    pr = np.concatenate(pair_r) if pair_r else np.empty(0, np.int64)
    order = np.lexsort((pr, pi))
    pi, pr = pi[order], pr[order]
    res["n_resident"] = np.bincount(pi, minlength=n).astype(np.int64)
    if len(pi):  # names of what was resident, for the record (pairs are sorted by comm kernel)
        single = res["n_resident"][pi] == 1
        res["resident"][pi[single]] = names[pr[single]]
        multi = np.flatnonzero(~single)
        for i in np.unique(pi[multi]).tolist():
            res["resident"][i] = ", ".join(names[pr[multi[pi[multi] == i]]])
    occ = _occupancy(k, np.concatenate([c, pr]), dev_limits, carveouts, memo)
    oc = {f: v[: n] for f, v in occ.items()}
    ro = {f: v[n:] for f, v in occ.items()}
    # the comm kernel's own facts
    N = oc["num_sms"]
    ok_c = ~np.isnan(oc["blocks_per_sm"]) & (N > 0)
    res["note"] = np.where(ok_c, None, np.where(np.isnan(oc["blocks_per_sm"]), oc["note"],
                                                "the device's SM count is unknown (an architecture alone does not say it: "
                                                "give --device-name a product name)"))  # fmt: skip
    res["num_sms"] = np.where(ok_c, N, np.nan)
    # each resident kernel: the SMs it holds in its current wave, and the comm blocks that fit beside it
    b = ro["blocks_per_sm"]
    G = _grid(k)[pr].astype(np.float64)
    Np = N[pi] if len(pi) else np.empty(0)
    good = ~np.isnan(b) & (b > 0) & (G > 0) & ok_c[pi]
    bb, GG, NN = np.where(good, b, 1), np.where(good, G, 1), np.where(good & (Np > 0), Np, 1)
    waves = np.ceil(GG / (NN * bb))
    dur = np.maximum(end[pr] - start[pr], 1).astype(np.float64)
    w = np.minimum(np.floor((t[pi] - start[pr]).astype(np.float64) * waves / dur), waves - 1)
    left = GG - w * NN * bb
    held = np.minimum(NN, np.ceil(left / bb))
    cap_fit = np.full(len(pi), np.nan)
    lim = np.full(len(pi), None, dtype=object)
    lim_code = peers.factorize(np.array([id(x) for x in oc["limits"]], np.int64)) if n else np.empty(0, np.int64)
    for key in np.unique(lim_code[pi]) if len(pi) else ():  # one capacity per device's limits
        key = int(np.flatnonzero(lim_code == key)[0])
        same = good & (lim_code[pi] == lim_code[key])
        if not same.any() or not isinstance(oc["limits"][key], dict):
            continue
        ci = pi[same]
        f, lm, _ = blocks_fit(capacity(oc["limits"][key]), b[same] * ro["warps_per_block"][same], b[same],
                              b[same] * ro["warps_per_block"][same] * ro["regs_per_warp"][same], b[same] * ro["smem_alloc_bytes"][same],
                              ro["smem_config_bytes"][same], oc["warps_per_block"][ci], oc["regs_per_warp"][ci],
                              oc["smem_alloc_bytes"][ci], own_config=oc["smem_config_needed_bytes"][ci])  # fmt: skip
        cap_fit[same], lim[same] = f, lm
    bad = ~good | np.isnan(cap_fit)
    unknown = np.bincount(pi[bad], minlength=n) > 0 if len(pi) else np.zeros(n, bool)
    for j in np.flatnonzero(bad):
        if res["note"][pi[j]] is None:
            why = ro["note"][j] or "launch shape unknown"
            res["note"][pi[j]] = f"resident {names[pr[j]]}: {why}"
    held_total = np.bincount(pi, weights=np.where(bad, 0, held), minlength=n)
    best = np.full(n, -1.0)
    np.maximum.at(best, pi[~bad], cap_fit[~bad])
    room = np.bincount(pi, weights=np.where(~bad & (cap_fit > 0), held, 0), minlength=n)
    free = np.maximum(0, np.where(ok_c, N, 0) - held_total)
    alone = oc["blocks_per_sm"]
    best = np.where((free > 0) | (res["n_resident"] == 0), np.fmax(best, alone), best)
    known = ok_c & ~unknown
    res["fit"] = np.where(known, best, np.nan)
    res["free"] = np.where(known, free, np.nan)
    res["with_room"] = np.where(known, np.where(alone > 0, np.minimum(N, free + room), 0), np.nan)
    # the blocker: the resident kernel whose end (or the comm's start, if later) came last
    finish = np.minimum(end[pr], start[c][pi]).astype(np.float64)
    latest = np.full(n, -np.inf)
    np.maximum.at(latest, pi, finish)
    top = np.flatnonzero(finish == latest[pi])
    top = top[np.unique(pi[top], return_index=True)[1]]  # the first such pair per comm kernel
    blocked = known[pi[top]] & (best[pi[top]] == 0)
    res["blocker"][pi[top[blocked]]] = names[pr[top[blocked]]]
    res["resource"][pi[top[blocked]]] = [_RESOURCE.get(x, x) for x in lim[top[blocked]]]
    return res


def _grid(k: pa.Table) -> np.ndarray:
    g = [pc.fill_null(k.column(c), 1 if c != "grid_x" else 0).to_numpy().astype(np.int64) for c in ("grid_x", "grid_y", "grid_z")]
    return g[0] * g[1] * g[2]


_OCC_FIELDS = ("blocks_per_sm", "warps_per_block", "regs_per_warp", "smem_alloc_bytes", "smem_config_bytes",
               "smem_config_needed_bytes", "num_sms")  # fmt: skip


def _occupancy(k: pa.Table, rows: np.ndarray, dev_limits: dict, carveouts: dict, memo: dict | None = None) -> dict:
    """Occupancy facts of ``rows`` of ``k`` as arrays aligned with ``rows`` (NaN where unknown, ``note``
    saying why), computed once per distinct launch shape; ``limits`` holds each row's device limits.

    ``memo`` (one per ``explain`` call) keeps each shape's facts by its device limits' content, so that
    ranks of one GPU model compute a shape once: ``kernel_occupancy`` costs ~20 ms a call in pandas,
    which on 512 ranks was most of ``explain``."""
    import pandas as pd

    from overlapviz.analysis.occupancy import kernel_occupancy, limits_for

    n = len(rows)
    out = {f: np.full(n, np.nan) for f in _OCC_FIELDS}
    out["note"] = np.full(n, None, dtype=object)
    out["limits"] = np.full(n, None, dtype=object)
    if not n:
        return out
    # one occupancy per distinct launch shape: group the rows by their shape's integers (the name by
    # its dictionary index), without a pandas row per kernel
    t = k.take(pa.array(rows))
    name_idx = pd.factorize(str_column(t, "name"))[0].astype(np.int64)
    run_idx = pd.factorize(str_column(t, "run_id"))[0].astype(np.int64)
    bx, by, bz = (pc.fill_null(t.column(c), -1 if c == "block_x" else 1).to_numpy().astype(np.int64) for c in ("block_x", "block_y", "block_z"))
    threads = np.where(bx < 0, -1, bx * by * bz)
    key = np.stack([run_idx, int_column(t, "rank"), int_column(t, "device"), name_idx, threads, int_column(t, "regs_per_thread"),
                    int_column(t, "shared_mem_bytes"), int_column(t, "sgprs"), int_column(t, "accum_vgprs")])  # fmt: skip
    order = np.lexsort(key[::-1])
    ks = key[:, order]
    new = np.ones(n, bool)
    new[1:] = (ks[:, 1:] != ks[:, :-1]).any(axis=0)
    code = np.empty(n, np.int64)
    code[order] = np.cumsum(new) - 1
    first = order[new]
    memo = {} if memo is None else memo
    cols = ["run_id", "rank", "device", "name", "regs_per_thread", "shared_mem_bytes", "sgprs", "accum_vgprs"]
    shapes = t.take(pa.array(first)).select(cols).to_pylist()
    lims, keys = [], []
    for r, th in zip(shapes, threads[first].tolist()):
        lim = limits_for(dev_limits, r["run_id"], int(r["rank"]), r["device"])
        lims.append(lim)
        # a device's limits by content (ranks of one GPU model share them); without limits, the note names the rank
        where = _limits_key(lim, memo) if isinstance(lim, dict) else ("rank", r["rank"], r["device"], lim)
        keys.append((r["run_id"], where, r["name"], th, *(r[c] for c in cols[4:])))
    missing = [i for i, kk in enumerate(keys) if kk not in memo]
    if missing:
        sub = t.take(pa.array(first[missing])).select(cols).to_pandas()
        th = threads[first[missing]]
        uniq = sub.assign(threads_per_block=pd.array(np.where(th < 0, None, th).tolist(), dtype="Int64"))
        occ = kernel_occupancy(uniq.astype({"threads_per_block": "Int64"}), dev_limits, carveouts)
        facts = np.stack([occ[f].to_numpy(np.float64, na_value=np.nan) for f in _OCC_FIELDS], axis=1)
        notes = occ["residency_note"].fillna("launch shape or device limits unknown").to_numpy(object)
        for j, i in enumerate(missing):
            memo[keys[i]] = (facts[j], notes[j])
    facts = np.stack([memo[kk][0] for kk in keys])
    for fi, f in enumerate(_OCC_FIELDS):
        out[f] = facts[:, fi][code]
    notes = np.array([memo[kk][1] for kk in keys] + [None], dtype=object)[:-1]
    out["note"] = np.where(np.isnan(out["blocks_per_sm"]), notes[code], None)
    out["limits"] = np.array(lims + [None], dtype=object)[:-1][code]
    return out


def _limits_key(lim: dict, memo: dict):
    """A device's limits as a hashable key, made once per limits object of the call: its content less whose
    they are (``run_id``, ``rank``, ``device``), which no occupancy rule reads."""
    got = memo.get(("limits", id(lim)))
    if got is None or got[0] is not lim:
        content = sorted(((k, v) for k, v in lim.items() if k not in _WHOSE), key=lambda kv: str(kv[0]))
        got = memo[("limits", id(lim))] = (lim, repr(content))
    return got[1]


_WHOSE = ("run_id", "rank", "device")


def summarize(explained: pd.DataFrame) -> pd.DataFrame:
    """Per run x rank: comm kernels, the time they spent waiting by cause, the time peers kept them waiting, top blockers.

    ``<cause>_us`` is the measure of the union, over the rank's kernels of that cause, of the
    part of start − launch the cause names (``stream_order``: launch -> stream ready;
    ``dependency``: stream ready -> dependency ready; ``sm_resources``, ``launch_latency``,
    ``unknown``: ready -> start; ``launch_call``: launch -> the launch call's end): rank time,
    never more than the trace lasted, however many kernels waited at once. ``peer_wait_us``
    likewise: the union of each kernel's wait for its instance's last rank. Sums of
    overlapping per-kernel waits are in ``<cause>_kernel_us`` (kernel time, for comparing
    kernels; it can exceed the trace). ``median_start_delay_us``, ``p95_start_delay_us``
    (ready -> start), ``n_blocked`` (cause ``sm_resources``) and ``n_launch_unknown``
    (kernels whose launch the trace does not have: their start − launch is unknown and in no
    sum; every ``<cause>_us`` is null when no kernel of the rank has one, not 0).
    """
    import pandas as pd

    from overlapviz.analysis import intervals

    rows = []
    for (run_id, rank), d in explained.groupby(["run_id", "rank"], sort=True):
        row = {"run_id": run_id, "rank": int(rank), "n_comm_kernels": len(d)}
        sml = d["start_minus_launch_ns"].astype("Float64")
        known = sml.notna().to_numpy(bool)
        for cause in CAUSES:
            if cause == "none":
                continue
            lo, hi = cause_waits(d, cause)
            ok = known & (lo >= 0) & (hi > lo)
            row[f"{cause}_us"] = (int(intervals.measure(intervals.merge(np.zeros(int(ok.sum()), np.int64), lo[ok], hi[ok]), 1)[0])
                                  / 1000.0 if known.any() else None)  # fmt: skip
        for cause in CAUSES:
            if cause == "none":
                continue
            row[f"{cause}_kernel_us"] = float(sml[known & (d["cause"] == cause).to_numpy(bool)].clip(lower=0).sum()) / 1000.0 if known.any() else None
        start = d["start_ns"].to_numpy(np.int64)
        wait = pd.array(d["peer_wait_us"], dtype="Float64")
        has = ~pd.isna(wait)
        wait_ns = np.round(wait.to_numpy(dtype=np.float64, na_value=0.0) * 1000).astype(np.int64)
        row["peer_wait_us"] = int(intervals.measure(intervals.merge(np.zeros(int(has.sum()), np.int64), start[has],
                                                                     start[has] + wait_ns[has]), 1)[0]) / 1000.0  # fmt: skip
        delay = d["start_delay_us"].astype("Float64").dropna()
        row["median_start_delay_us"] = float(delay.median()) if len(delay) else None
        row["p95_start_delay_us"] = float(delay.quantile(0.95)) if len(delay) else None
        row["n_blocked"] = int((d["cause"] == "sm_resources").sum())
        top = d.loc[d["cause"] == "sm_resources", "blocker"].dropna().value_counts().head(3)
        row["top_blockers"] = "; ".join(f"{name} ({n})" for name, n in top.items()) or None
        row["n_launch_unknown"] = int((~known).sum())
        rows.append(row)
    return pd.DataFrame(rows)


def part_waits(records: pd.DataFrame, part: str) -> tuple[np.ndarray, np.ndarray]:
    """Per record, the interval ``[lo, hi)`` (int64 ns; ``lo = hi`` or -1 where none or unknown) of
    its wait that ``part`` names, whatever its cause: ``stream_order`` launch -> stream ready,
    only where the stream's previous activity is not communication (a collective queued behind
    earlier collectives waits for them, whose own delays are counted there); ``dependency``
    stream ready -> dependency ready; ``launch_call`` inside the launch call; ``sm_resources``,
    ``launch_latency``, ``unknown``: ready (or the launch call's end, if later) -> start where
    the ready part is of that kind."""
    import pandas as pd

    n = len(records)

    def col(name):
        if name not in records:
            return np.full(n, UNKNOWN, np.int64)
        return pd.array(records[name], dtype="Int64").to_numpy(np.int64, na_value=UNKNOWN)

    none = np.full(n, UNKNOWN, np.int64)
    start = records["start_ns"].to_numpy(np.int64)
    L, S, D, R, C = col("launch_ns"), col("stream_ready_ns"), col("dependency_ready_ns"), col("ready_ns"), col("launch_call_ns")
    if part == "stream_order":
        prev = records["stream_previous_kind"].to_numpy(object) if "stream_previous_kind" in records else np.full(n, None)
        mine = (L != UNKNOWN) & (S != UNKNOWN) & (prev != "comm") & pd.notna(prev)
        return np.where(mine, L, none), np.where(mine, np.maximum(L, S), none)
    if part == "dependency":
        base = np.maximum(L, S)
        mine = (D != UNKNOWN) & (base != UNKNOWN)
        return np.where(mine, base, none), np.where(mine, np.maximum(base, D), none)
    if part == "launch_call":
        mine = (L != UNKNOWN) & (C != UNKNOWN)
        return np.where(mine, L, none), np.where(mine, L + C, none)
    kinds = records["ready_part"].to_numpy(object) if "ready_part" in records else np.full(n, None)
    lo = np.where((C != UNKNOWN) & (L != UNKNOWN), np.maximum(R, L + C), R)
    mine = (R != UNKNOWN) & (kinds == part)
    return np.where(mine, lo, none), np.where(mine, np.maximum(lo, start), none)


def cause_waits(records: pd.DataFrame, cause: str) -> tuple[np.ndarray, np.ndarray]:
    """Per record, the interval ``[lo, hi)`` (int64 ns) of start − launch that ``cause`` names
    (see :func:`summarize`), for the records whose cause it is; ``lo = hi`` elsewhere and -1
    where a bound is unknown."""
    import pandas as pd

    n = len(records)

    def col(name):
        if name not in records:
            return np.full(n, UNKNOWN, np.int64)
        return pd.array(records[name], dtype="Int64").to_numpy(np.int64, na_value=UNKNOWN)

    start = records["start_ns"].to_numpy(np.int64)
    L, S, D, R = col("launch_ns"), col("stream_ready_ns"), col("dependency_ready_ns"), col("ready_ns")
    if cause == "stream_order":
        lo, hi = L, np.maximum(L, S)
    elif cause == "dependency":
        lo = np.maximum(L, S)
        hi = np.maximum(lo, D)
    elif cause == "launch_call":
        E = col("launch_end_ns")
        lo, hi = L, np.where(E >= 0, np.minimum(E, start), L)
    else:
        lo, hi = R, np.where(R >= 0, start, R)
    mine = (records["cause"] == cause).to_numpy(bool)
    return np.where(mine, lo, UNKNOWN), np.where(mine, hi, UNKNOWN)


# the names earlier versions exported (residency --delays, the dashboard, speedup.compare)
comm_start_delays = explain
summarize_delays = summarize
