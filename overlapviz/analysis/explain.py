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

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from overlapviz import schema
from overlapviz.analysis import peers
from overlapviz.analysis.dependencies import UNKNOWN, dependency_ready, stream_ready
from overlapviz.analysis.occupancy import blocks_fit, capacity, kernel_occupancy, limits_for
from overlapviz.analysis.residency import device_table, run_carveouts

__all__ = ["CAUSES", "LAUNCH_LATENCY_NS", "KEYS", "explain", "summarize", "comm_start_delays", "summarize_delays"]

CAUSES = ("stream_order", "dependency", "sm_resources", "launch_latency", "unknown", "none")
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
    "device", "step", "end_ns", "launch_tid", "start_minus_launch_ns", "stream_wait_ns", "dependency_wait_ns",
    "ready_wait_ns", "producer", "producer_correlation", "producer_stream", "n_resident_compute", "resident_compute",
    "free_sms", "sms_with_room", "num_sms", "comm_group", "comm_seq", "instance", "residency_note",
]  # fmt: skip
_READ = [
    "run_id", "rank", "device", "stream", "correlation", "name", "kind", "is_host", "start_ns", "end_ns", "grid_x",
    "grid_y", "grid_z", "block_x", "block_y", "block_z", "regs_per_thread", "shared_mem_bytes", "sgprs", "accum_vgprs",
    "launch_ns", "launch_tid", "step", "collective", "comm_group", "comm_seq",
]  # fmt: skip
_SYNC_INTS = ("tid", "start_ns", "correlation", "stream", "wait_on_stream", "wait_on_record_correlation")
_RESOURCE = {"blocks": "block_slots"}  # the fit model's names -> DESIGN.md's


def _ints(table: pa.Table, name: str) -> np.ndarray:
    col = table.column(name)
    return pc.fill_null(col, UNKNOWN).to_numpy().astype(np.int64) if len(col) else np.empty(0, np.int64)


def _strs(table: pa.Table, name: str) -> np.ndarray:
    return np.asarray(table.column(name).to_pylist(), dtype=object)


def explain(dataset_path: str | os.PathLike, *, run_ids=None) -> pd.DataFrame:
    """One record per communication kernel: why it started when it did (module docstring).

    Returns
    -------
    pandas.DataFrame
        ``KEYS`` then ``EXTRA`` columns; times int64 ns (nullable), ``start_delay_us`` and
        ``peer_wait_us`` float µs computed from exact ns. Sorted by run, rank, start.
    """
    k = schema.read_kernels(dataset_path, columns=_READ, run_ids=run_ids)
    syncs = schema.read_table(dataset_path, "syncs") if "syncs" in schema.TABLES else None
    if syncs is not None and run_ids is not None:
        syncs = syncs.filter(pc.is_in(syncs.column("run_id"), pa.array(list(run_ids), pa.string())))
    dev_limits = device_table(dataset_path)
    carveouts = run_carveouts(dataset_path)
    parts = []
    keys = pa.table({"run_id": k.column("run_id"), "rank": k.column("rank")})
    groups = keys.group_by(["run_id", "rank"], use_threads=False).aggregate([]).to_pylist() if k.num_rows else []
    run_col = _strs(k, "run_id") if k.num_rows else np.empty(0, object)
    rank_col = _ints(k, "rank")
    for g in sorted(groups, key=lambda r: (r["run_id"], r["rank"])):
        rows = np.flatnonzero((run_col == g["run_id"]) & (rank_col == g["rank"]))
        rk = k.take(pa.array(rows))
        rs = None
        if syncs is not None and syncs.num_rows:
            m = pc.and_(pc.equal(syncs.column("run_id"), g["run_id"]), pc.equal(syncs.column("rank"), g["rank"]))
            rs = syncs.filter(m)
        part = _explain_rank(rk, rs, dev_limits, carveouts)
        if part is not None:
            parts.append(part)
    out = pd.concat(parts, ignore_index=True) if parts else _empty()
    out = peers.attach_peer_wait(out)
    return out[KEYS + EXTRA].sort_values(["run_id", "rank", "start_ns"], kind="stable").reset_index(drop=True)


def _empty() -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype=object) for c in KEYS + EXTRA if c != "peer_wait_us"})


def _explain_rank(k: pa.Table, syncs: pa.Table | None, dev_limits: dict, carveouts: dict) -> pd.DataFrame | None:
    kind = _strs(k, "kind")
    is_comm = kind == "comm"
    if not is_comm.any():
        return None
    host = pc.fill_null(k.column("is_host"), False).to_numpy(zero_copy_only=False)
    gpu = (~host) & (kind != "")
    stream, start, end = _ints(k, "stream"), _ints(k, "start_ns"), _ints(k, "end_ns")
    device = _ints(k, "device")
    launch, launch_tid = _ints(k, "launch_ns"), _ints(k, "launch_tid")
    # a stream is a (device, stream) pair; host activities (CPU-only traces) run on their thread
    lane = np.unique(np.stack([device, stream, host.astype(np.int64)]), axis=1, return_inverse=True)[1].reshape(-1).astype(np.int64)
    s_ready = stream_ready(lane, start, end)
    sync_cols = {}
    if syncs is not None and syncs.num_rows:
        sync_cols = {c: _ints(syncs, c) for c in _SYNC_INTS}
        sync_cols["kind"] = _strs(syncs, "kind")
        sync_cols["source"] = _strs(syncs, "source")
        # the stream ids syncs name are the trace's; map them onto this rank's lanes
        sid = {int(s): int(lnum) for s, lnum, h in zip(stream.tolist(), lane.tolist(), host.tolist()) if not h}
        for c in ("stream", "wait_on_stream"):
            sync_cols[c] = np.array([sid.get(int(v), UNKNOWN - 1) if v != UNKNOWN else UNKNOWN for v in sync_cols[c]], np.int64)
    g = np.flatnonzero(gpu)
    ready = dependency_ready(stream=lane[g], start=start[g], end=end[g], launch=launch[g], launch_tid=launch_tid[g], syncs=sync_cols)
    dep = np.full(len(start), UNKNOWN, np.int64)
    dep_src = np.full(len(start), None, dtype=object)
    prod = np.full(len(start), UNKNOWN, np.int64)
    dep[g], dep_src[g] = ready.dependency_ready_ns, ready.source
    prod[g] = np.where(ready.producer >= 0, g[np.maximum(ready.producer, 0)], UNKNOWN)

    c = np.flatnonzero(is_comm)
    L, S, D, start_c = launch[c], s_ready[c], dep[c], start[c]
    known = np.stack([L, S, D])
    ready_ns = np.where((known == UNKNOWN).all(axis=0), UNKNOWN, np.max(np.where(known == UNKNOWN, np.iinfo(np.int64).min, known), axis=0))
    which = np.argmax(known == ready_ns, axis=0)
    ready_from = np.where(ready_ns == UNKNOWN, None, np.array(["launch", "stream", "dependency"], dtype=object)[which])
    total = np.where(L != UNKNOWN, start_c - L, UNKNOWN)
    stream_wait = np.where((L != UNKNOWN) & (S != UNKNOWN), np.maximum(0, S - L), 0)
    base = np.maximum(L, S)  # unknowns are -1, below any time
    dep_wait = np.where((D != UNKNOWN) & (base != UNKNOWN), np.maximum(0, D - base), 0)
    ready_wait = np.where(ready_ns != UNKNOWN, start_c - ready_ns, UNKNOWN)

    room = _sm_room(k, c, ready_ns, host, kind, device, lane, start, end, dev_limits, carveouts)
    fit = room["fit"]
    ready_part = np.where(
        ~np.isnan(fit) & (fit == 0), "sm_resources",
        np.where(np.maximum(ready_wait, 0) <= LAUNCH_LATENCY_NS, "launch_latency", "unknown"),
    ).astype(object)  # fmt: skip
    parts = np.stack([dep_wait, stream_wait, np.maximum(ready_wait, 0)])
    pick = np.argmax(parts, axis=0)  # ties: dependency, then stream order
    cause = np.where(pick == 0, "dependency", np.where(pick == 1, "stream_order", ready_part)).astype(object)
    no_delay = np.where(total != UNKNOWN, total <= 0, np.maximum(ready_wait, 0) == 0)
    cause[no_delay] = "none"
    sm = cause == "sm_resources"
    blocking = np.where(sm, room["resource"], None)
    blocker = np.where(sm, room["blocker"], None)

    names = _strs(k, "name")

    def nint(a):
        return pd.array(np.where(a == UNKNOWN, None, a).tolist(), dtype="Int64")

    pcorr = np.where(prod[c] >= 0, _ints(k, "correlation")[np.maximum(prod[c], 0)], UNKNOWN)
    pstream = np.where(prod[c] >= 0, stream[np.maximum(prod[c], 0)], UNKNOWN)
    out = pd.DataFrame(
        {
            "run_id": _strs(k, "run_id")[c],
            "rank": _ints(k, "rank")[c],
            "stream": nint(stream[c]),
            "correlation": nint(_ints(k, "correlation")[c]),
            "name": names[c],
            "collective": _strs(k, "collective")[c],
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
            "device": nint(device[c]),
            "step": nint(_ints(k, "step")[c]),
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
            "comm_group": _strs(k, "comm_group")[c],
            "comm_seq": nint(_ints(k, "comm_seq")[c]),
            "residency_note": room["note"],
        }
    )
    return out


def _sm_room(k, c, ready_ns, host, kind, device, lane, start, end, dev_limits, carveouts) -> dict:
    """SM room for each comm kernel ``c`` at its ready time (module docstring)."""
    n = len(c)
    res = {"fit": np.full(n, np.nan), "free": np.full(n, np.nan), "with_room": np.full(n, np.nan),
           "num_sms": np.full(n, np.nan), "resource": np.full(n, None, object), "blocker": np.full(n, None, object),
           "n_resident": np.zeros(n, np.int64), "resident": np.full(n, None, object), "note": np.full(n, None, object)}  # fmt: skip
    if host[c].all():
        res["note"][:] = "host activity (CPU-only trace): no SMs"
        res["n_resident"] = np.full(n, None)
        return res
    comp = np.flatnonzero(~host & np.isin(kind, ["compute", "other"]))
    # resident computation at each comm kernel's ready time: at most one per stream (streams are in order)
    resident: list[list[int]] = [[] for _ in range(n)]
    t = np.where(ready_ns == UNKNOWN, start[c], ready_ns)
    for ln in np.unique(lane[comp]):
        m = comp[lane[comp] == ln]
        m = m[np.argsort(start[m], kind="stable")]
        pos = np.searchsorted(start[m], t, side="right") - 1
        ok = pos >= 0
        idx = np.where(ok, m[np.maximum(pos, 0)], 0)
        hit = ok & (end[idx] > t) & (device[idx] == device[c])
        for i in np.flatnonzero(hit):
            resident[i].append(int(idx[i]))
    # occupancy of the comm kernels and the resident ones, once per distinct launch shape
    need = np.unique(np.concatenate([c, np.asarray([r for rr in resident for r in rr], np.int64)]))
    occ = _occupancy(k, need, dev_limits, carveouts)
    names = _strs(k, "name")
    gx = _grid(k)
    for i, ci in enumerate(c.tolist()):
        res["n_resident"][i] = len(resident[i])
        res["resident"][i] = ", ".join(names[r] for r in resident[i]) or None
        oc = occ.get(ci)
        if oc is None or isinstance(oc, str):
            res["note"][i] = oc or "launch shape or device limits unknown"
            continue
        lim = oc["limits"]
        N = int(lim.get("num_sms") or 0)
        if N <= 0:
            res["note"][i] = "device has no SM count"
            continue
        res["num_sms"][i] = N
        cap = capacity(lim)
        held_total, best, room_sms, blocker, resource, latest = 0, -1.0, 0, None, None, None
        unknown = False
        for r in resident[i]:
            ro = occ.get(r)
            if ro is None or isinstance(ro, str) or gx[r] <= 0 or not ro["blocks_per_sm"]:
                unknown = True
                res["note"][i] = f"resident {names[r]}: {ro if isinstance(ro, str) else 'launch shape unknown'}"
                break
            b = int(ro["blocks_per_sm"])
            G = int(gx[r])
            waves = -(-G // (N * b))
            dur = max(int(end[r] - start[r]), 1)
            w = min(int((int(t[i]) - int(start[r])) * waves // dur), waves - 1)
            left = G - w * N * b
            held = min(N, -(-left // b))
            held_total += held
            f, lm, _ = blocks_fit(cap, b * ro["warps_per_block"], b, b * ro["warps_per_block"] * ro["regs_per_warp"],
                                  b * ro["smem_alloc_bytes"], ro["smem_config_bytes"], oc["warps_per_block"], oc["regs_per_warp"],
                                  oc["smem_alloc_bytes"], own_config=oc["smem_config_needed_bytes"])  # fmt: skip
            f = float(np.asarray(f).reshape(-1)[0])
            if np.isnan(f):
                unknown = True
                break
            best = max(best, f)
            room_sms += held if f > 0 else 0
            finish = min(int(end[r]), int(start[c[i]]))
            if latest is None or finish > latest:
                latest, blocker = finish, names[r]
                resource = np.asarray(lm, dtype=object).reshape(-1)[0]
        if unknown:
            continue
        free = max(0, N - held_total)
        alone = float(oc["blocks_per_sm"])
        if free > 0 or not resident[i]:
            best = max(best, alone)
        res["fit"][i] = best
        res["free"][i] = free
        res["with_room"][i] = min(N, free + room_sms) if alone > 0 else 0
        if best == 0:
            res["blocker"][i] = blocker
            res["resource"][i] = _RESOURCE.get(resource, resource)
    return res


def _grid(k: pa.Table) -> np.ndarray:
    g = [pc.fill_null(k.column(c), 1 if c != "grid_x" else 0).to_numpy().astype(np.int64) for c in ("grid_x", "grid_y", "grid_z")]
    return g[0] * g[1] * g[2]


def _occupancy(k: pa.Table, rows: np.ndarray, dev_limits: dict, carveouts: dict) -> dict:
    """``{row: facts}`` for ``rows`` of ``k``: occupancy facts, or a str saying why none."""
    if not len(rows):
        return {}
    sub = k.take(pa.array(rows)).select(["run_id", "rank", "device", "name", "block_x", "block_y", "block_z",
                                          "regs_per_thread", "shared_mem_bytes", "sgprs", "accum_vgprs"]).to_pandas()  # fmt: skip
    threads = sub["block_x"] * sub["block_y"].fillna(1) * sub["block_z"].fillna(1)
    sub = sub.assign(threads_per_block=threads.astype("Int64") if len(sub) else threads)
    key = ["run_id", "rank", "device", "name", "threads_per_block", "regs_per_thread", "shared_mem_bytes", "sgprs", "accum_vgprs"]
    uniq = sub.drop_duplicates(key).reset_index(drop=True)
    occ = kernel_occupancy(uniq, dev_limits, carveouts)
    facts = {}
    for rec in occ.to_dict("records"):
        kk = tuple(None if (v is None or (not isinstance(v, str) and pd.isna(v))) else v for v in (rec[c] for c in key))
        if pd.isna(rec["blocks_per_sm"]):
            facts[kk] = rec["residency_note"] or "launch shape or device limits unknown"
            continue
        lim = limits_for(dev_limits, rec["run_id"], int(rec["rank"]), None if pd.isna(rec["device"]) else int(rec["device"]))
        facts[kk] = {"limits": lim, **{c: rec[c] for c in ("blocks_per_sm", "warps_per_block", "regs_per_warp", "smem_alloc_bytes",
                                                          "smem_config_bytes", "smem_config_needed_bytes")}}  # fmt: skip
    out = {}
    for r, rec in zip(rows.tolist(), sub[key].to_dict("records")):
        kk = tuple(None if (v is None or (not isinstance(v, str) and pd.isna(v))) else v for v in (rec[c] for c in key))
        out[r] = facts.get(kk)
    return out


def summarize(explained: pd.DataFrame) -> pd.DataFrame:
    """Per run x rank: comm kernels, start − launch summed by cause (``<cause>_us``), total peer wait, top blockers.

    Also ``median_start_delay_us``, ``p95_start_delay_us`` (ready -> start) and ``n_blocked``
    (cause ``sm_resources``).
    """
    rows = []
    for (run_id, rank), d in explained.groupby(["run_id", "rank"], sort=True):
        row = {"run_id": run_id, "rank": int(rank), "n_comm_kernels": len(d)}
        sml = d["start_minus_launch_ns"].astype("Float64").fillna(0)
        for cause in CAUSES:
            row[f"{cause}_us"] = float(sml[d["cause"] == cause].clip(lower=0).sum()) / 1000.0
        row["peer_wait_us"] = float(d["peer_wait_us"].astype("Float64").fillna(0).sum())
        delay = d["start_delay_us"].astype("Float64").dropna()
        row["median_start_delay_us"] = float(delay.median()) if len(delay) else None
        row["p95_start_delay_us"] = float(delay.quantile(0.95)) if len(delay) else None
        row["n_blocked"] = int((d["cause"] == "sm_resources").sum())
        top = d.loc[d["cause"] == "sm_resources", "blocker"].dropna().value_counts().head(3)
        row["top_blockers"] = "; ".join(f"{name} ({n})" for name, n in top.items()) or None
        rows.append(row)
    return pd.DataFrame(rows)


# the names earlier versions exported (residency --delays, the dashboard, speedup.compare)
comm_start_delays = explain
summarize_delays = summarize
