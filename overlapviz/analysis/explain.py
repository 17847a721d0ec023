"""Why a collective did or did not start: its start delay, the computation resident beside it, and how many of its blocks fit."""

from __future__ import annotations

import os

import numpy as np
import pandas as pd

from overlapviz import schema
from overlapviz.analysis import intervals
from overlapviz.analysis.occupancy import blocks_fit, capacity, kernel_occupancy, limits_for
from overlapviz.analysis.residency import UNKNOWN_CARVEOUT_NOTE, device_table, kernel_shapes, run_carveouts

_COLUMNS = [
    "run_id", "rank", "device", "stream", "correlation", "name", "kind", "is_host", "start_ns", "end_ns",
    "grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z", "regs_per_thread", "shared_mem_bytes",
    "sgprs", "accum_vgprs", "launch_ns", "step", "collective",
]


def footprints(kernels: pd.DataFrame, dev_limits: dict, carveouts: dict | None = None) -> pd.DataFrame:
    """:func:`overlapviz.analysis.occupancy.kernel_occupancy` of each kernel, and the blocks it keeps on a busy SM.

    Adds ``resident_blocks_per_sm`` = min(``blocks_per_sm``, ceil(grid blocks / SMs)): the
    blocks it keeps on a busy SM while its full waves run (its last, partial wave holds
    fewer). ``kernels`` needs ``grid_blocks`` besides what ``kernel_occupancy`` reads.
    """
    out = kernel_occupancy(kernels, dev_limits, carveouts)
    per_sm = np.ceil(out["grid_blocks"].astype("Float64").to_numpy(np.float64, na_value=np.nan) / out["num_sms"].to_numpy())
    resident = np.fmin(out["blocks_per_sm"].to_numpy(), per_sm)
    resident = np.where(np.isnan(per_sm), out["blocks_per_sm"].to_numpy(), resident)
    return out.assign(resident_blocks_per_sm=resident)


def _prev_end_on_stream(k: pd.DataFrame) -> np.ndarray:
    """End of the latest-ending earlier activity on the same stream (NaN for the first)."""
    key = ["run_id", "rank", "device_key", "stream"]
    s = k.sort_values(key + ["start_ns", "end_ns"], kind="stable")
    cm = s.groupby(key, sort=False)["end_ns"].cummax()
    prev = cm.groupby([s[c] for c in key], sort=False).shift(1)
    return prev.reindex(k.index).to_numpy(np.float64, na_value=np.nan)


def _resident_at(comm: pd.DataFrame, compute: pd.DataFrame, when: str) -> pd.DataFrame:
    """Compute kernels running at ``comm[when]`` (start <= t < end), any stream of the same device.

    Streams serialise their kernels, so per stream at most one kernel runs at t: the last
    one started at or before t, if it has not ended. One ``merge_asof`` per (comm,
    stream) pair finds it.
    """
    left = comm.loc[comm[when].notna(), ["cid", "run_id", "rank", "device_key", when]].rename(columns={when: "t"})
    streams = compute[["run_id", "rank", "device_key", "stream"]].drop_duplicates()
    pairs = left.merge(streams, on=["run_id", "rank", "device_key"])
    if pairs.empty:
        return pairs.assign(kid=pd.Series(dtype="int64"))
    pairs = pairs.assign(t=pairs["t"].astype(np.int64)).sort_values("t", kind="stable")
    right = compute[["run_id", "rank", "device_key", "stream", "start_ns", "end_ns", "kid"]]
    right = right.assign(start_ns=right["start_ns"].astype(np.int64)).sort_values("start_ns", kind="stable")
    hit = pd.merge_asof(
        pairs, right, left_on="t", right_on="start_ns", by=["run_id", "rank", "device_key", "stream"], direction="backward"
    )
    return hit[hit["end_ns"].notna() & (hit["end_ns"] > hit["t"])][["cid", "kid"]].astype(np.int64)


def _summarise(resident: pd.DataFrame, compute: pd.DataFrame, n_comm: int) -> pd.DataFrame:
    """Per comm kernel: how many compute kernels are resident, their names, and the per-SM resources they hold."""
    r = resident.merge(compute, on="kid")
    warps = r["resident_blocks_per_sm"] * r["warps_per_block"]
    r = r.assign(
        u_blocks=r["resident_blocks_per_sm"],
        u_warps=warps,
        u_regs=warps * r["regs_per_warp"],
        u_smem=r["resident_blocks_per_sm"] * r["smem_alloc_bytes"],
    )
    g = r.groupby("cid")
    uniq = r[["cid", "name"]].drop_duplicates().sort_values(["cid", "name"], kind="stable")
    names = uniq.groupby("cid")["name"].agg("; ".join)
    out = pd.DataFrame(
        {
            "n": g.size(),
            "names": names,
            "u_blocks": g["u_blocks"].sum(min_count=1),
            "u_warps": g["u_warps"].sum(min_count=1),
            "u_regs": g["u_regs"].sum(min_count=1),
            "u_smem": g["u_smem"].sum(min_count=1),
            "smem_config": g["smem_config_bytes"].max(),
            "unknown": r["resident_blocks_per_sm"].isna().groupby(r["cid"]).any(),
        }
    )
    return out.reindex(np.arange(n_comm))


def _during_wait(comm: pd.DataFrame, compute: pd.DataFrame) -> pd.DataFrame:
    """Per comm kernel: the computation that ran while it waited, i.e. in [ready, start).

    Returns ``cid``-indexed ``n`` (compute kernels overlapping the window, any stream of
    the device), ``blocker`` (the kernel with the longest overlap; its ``kid``) and
    ``busy`` (the fraction of the window covered by the union of computation).
    Kernels of one stream run one after another, so the kernels of a stream that overlap
    a window are a contiguous run: the first ending after ready to the last starting
    before start; two ``merge_asof`` calls find both ends.
    """
    keys = ["run_id", "rank", "device_key", "stream"]
    n = len(comm)
    empty = pd.DataFrame({"n": np.zeros(n), "blocker": np.full(n, -1), "busy": np.full(n, np.nan)})
    win = comm.loc[comm["ready_ns"].notna(), ["cid", "run_id", "rank", "device_key", "ready_ns", "start_ns"]]
    win = win.assign(t0=win["ready_ns"].astype(np.int64), t1=win["start_ns"].astype(np.int64))
    win = win[win["t1"] > win["t0"]]
    if win.empty or compute.empty:
        return empty.assign(busy=np.where(comm["ready_ns"].notna().to_numpy(), np.nan, np.nan))
    c = compute[keys + ["start_ns", "end_ns", "kid"]].assign(
        start_ns=compute["start_ns"].astype(np.int64), end_ns=compute["end_ns"].astype(np.int64)
    ).sort_values(keys + ["start_ns"], kind="stable").reset_index(drop=True)
    c = c.assign(row=np.arange(len(c)), reach=c.groupby(keys, sort=False)["end_ns"].cummax())
    pairs = win.merge(c[keys].drop_duplicates(), on=["run_id", "rank", "device_key"])
    lo = pd.merge_asof(pairs.sort_values("t0", kind="stable"), c[keys + ["reach", "row"]].sort_values("reach", kind="stable"),
                       left_on="t0", right_on="reach", by=keys, direction="forward", allow_exact_matches=False)
    hi = pd.merge_asof(pairs.sort_values("t1", kind="stable"), c[keys + ["start_ns", "row"]].sort_values("start_ns", kind="stable"),
                       left_on="t1", right_on="start_ns", by=keys, direction="backward", allow_exact_matches=False)
    both = lo[["cid", "stream", "t0", "t1", "row"]].merge(hi[["cid", "stream", "row"]], on=["cid", "stream"], suffixes=("_lo", "_hi"))
    both = both.dropna(subset=["row_lo", "row_hi"])
    count = (both["row_hi"] - both["row_lo"] + 1).clip(lower=0).astype(np.int64).to_numpy()
    rows = np.repeat(both["row_lo"].astype(np.int64).to_numpy(), count) + (
        np.arange(count.sum()) - np.repeat(np.cumsum(count) - count, count)
    )
    ex = pd.DataFrame({"cid": np.repeat(both["cid"].to_numpy(), count), "t0": np.repeat(both["t0"].to_numpy(), count),
                       "t1": np.repeat(both["t1"].to_numpy(), count), "row": rows})
    ex = ex.assign(start=c["start_ns"].to_numpy()[rows], end=c["end_ns"].to_numpy()[rows], kid=c["kid"].to_numpy()[rows])
    ex = ex.assign(overlap=np.minimum(ex["end"], ex["t1"]) - np.maximum(ex["start"], ex["t0"]))
    ex = ex[ex["overlap"] > 0]
    out = empty.copy()
    if len(ex):
        g = ex.groupby("cid")
        out.loc[g.size().index, "n"] = g.size().to_numpy()
        top = ex.loc[g["overlap"].idxmax()]
        out.loc[top["cid"].to_numpy(), "blocker"] = top["kid"].to_numpy()
        # union of the overlapping parts per comm kernel (intervals.merge keeps it exact)
        u = intervals.merge(ex["cid"].to_numpy(), np.maximum(ex["start"], ex["t0"]).to_numpy(), np.minimum(ex["end"], ex["t1"]).to_numpy())
        covered = intervals.measure(u, n)
        w = win.set_index("cid")
        out.loc[w.index, "busy"] = covered[w.index] / (w["t1"] - w["t0"]).to_numpy()
    else:
        out.loc[win["cid"].to_numpy(), "busy"] = 0.0
    out.loc[win["cid"].to_numpy(), "busy"] = out.loc[win["cid"].to_numpy(), "busy"].fillna(0.0)
    return out


def _names(s: pd.Series) -> np.ndarray:
    return np.asarray([v if isinstance(v, str) else None for v in s.tolist()], dtype=object)


def comm_start_delays(dataset_path: str | os.PathLike, *, run_ids=None) -> pd.DataFrame:
    """One row per communication kernel: its start delay and what was resident beside it.

    Start delay (DESIGN.md) = kernel start − ready, where ready is the later of its launch
    call (``launch_ns``) and the end of the previous activity on its stream. Where one of
    the two is unknown the other alone gives ready (``ready_from`` says which); where both
    are, ready is null. Delays are not clamped: a negative one means the trace's host and
    device clocks disagree.

    A compute kernel is resident at time t when it runs on the same device (any stream)
    with start <= t < end. Each holds ``resident_blocks_per_sm`` blocks on a busy SM
    (see :func:`footprints`); the communication kernel's blocks that still fit beside
    all of them, and the resource that stops more, come from :func:`blocks_fit`.

    Parameters
    ----------
    dataset_path
        An overlapviz dataset directory.
    run_ids
        Only these runs (all by default).

    Returns
    -------
    pandas.DataFrame
        Columns ``run_id, rank, device, stream, step, name, collective, correlation,
        start_ns, end_ns, launch_ns, prev_end_ns, ready_ns, ready_from, start_delay_us,
        duration_us, grid_blocks, threads_per_block, regs_per_thread, shared_mem_bytes,
        comm_blocks_per_sm_alone, comm_blocks_needed_per_sm, n_resident_compute_at_launch,
        resident_compute_at_launch, n_resident_compute, resident_compute,
        resident_compute_blocks_per_sm, comm_blocks_fit_per_sm, fit_limiter,
        comm_blocks_fit_per_sm_at_launch, fit_limiter_at_launch, n_compute_during_wait,
        wait_blocker, wait_compute_busy_fraction, comm_blocks_fit_per_sm_beside_blocker,
        fit_limiter_beside_blocker, sm_smem_config_bytes, smem_carveout_percent,
        carveout_note, residency_note`` (see :func:`_during_wait`); ``n_*``
        and ``resident_*`` are "at ready" unless the name says ``at_launch``. Sorted by
        run, rank, start. Fit columns are null where a launch shape or the device limits
        are unknown (``residency_note`` says which). ``sm_smem_config_bytes`` is the SM's
        shared memory the fit at ready used: the configuration the resident computation
        left (the largest when several), else the communication kernel's own;
        ``smem_carveout_percent`` the run's preference (null: none, or unknown for an
        imported trace: ``carveout_note`` says which). NVIDIA only; null on AMD.
    """
    k = schema.read_frame(dataset_path, "kernels", columns=_COLUMNS, run_ids=run_ids)
    k = kernel_shapes(k).reset_index(drop=True)
    k = k.assign(device_key=k["device"].astype("Int64").fillna(-1).astype(np.int64))
    prev_end = _prev_end_on_stream(k)
    k = k.assign(prev_end_ns=pd.array(np.where(np.isnan(prev_end), np.nan, prev_end), dtype="Float64").astype("Int64"))
    comm = k[k["kind"] == "comm"].reset_index(drop=True)
    comm = comm.assign(cid=np.arange(len(comm)))
    launch = comm["launch_ns"].astype("Float64").to_numpy(np.float64, na_value=np.nan)
    prev = comm["prev_end_ns"].astype("Float64").to_numpy(np.float64, na_value=np.nan)
    ready = np.fmax(launch, prev)
    ready_from = np.select(
        [np.isnan(launch) & np.isnan(prev), np.isnan(prev) | (launch >= prev), np.isnan(launch) | (prev > launch)],
        [None, "launch", "previous_on_stream"],
        None,
    )
    comm = comm.assign(ready_ns=pd.array(ready, dtype="Float64").astype("Int64"), ready_from=ready_from)

    dev_limits = device_table(dataset_path)
    carveouts = run_carveouts(dataset_path)
    gpu = ~k["is_host"].fillna(False)
    compute = k[(k["kind"] == "compute") & gpu].reset_index(drop=True)
    compute = footprints(compute.assign(kid=np.arange(len(compute))), dev_limits, carveouts)
    comm = footprints(comm, dev_limits, carveouts)

    at_ready = _summarise(_resident_at(comm, compute, "ready_ns"), compute, len(comm))
    at_launch = _summarise(_resident_at(comm, compute, "launch_ns"), compute, len(comm))

    wait = _during_wait(comm, compute)
    fit_cols = {}
    sm_config = np.full(len(comm), np.nan)
    blocker = compute.set_index("kid").reindex(wait["blocker"].to_numpy())
    bwarps = blocker["resident_blocks_per_sm"].to_numpy() * blocker["warps_per_block"].to_numpy()
    at_blocker = pd.DataFrame(
        {"u_warps": bwarps, "u_blocks": blocker["resident_blocks_per_sm"].to_numpy(),
         "u_regs": bwarps * blocker["regs_per_warp"].to_numpy(),
         "u_smem": blocker["resident_blocks_per_sm"].to_numpy() * blocker["smem_alloc_bytes"].to_numpy(),
         "smem_config": blocker["smem_config_bytes"].to_numpy(),
         "unknown": (wait["blocker"].to_numpy() >= 0) & np.isnan(blocker["resident_blocks_per_sm"].to_numpy())}
    )
    for tag, s in (("", at_ready), ("_at_launch", at_launch), ("_beside_blocker", at_blocker)):
        fit = np.full(len(comm), np.nan)
        lim = np.full(len(comm), None, dtype=object)
        for _, idx in comm.groupby(["run_id", "rank", "device_key"]).indices.items():
            row = comm.iloc[idx[0]]
            limits = limits_for(dev_limits, row["run_id"], int(row["rank"]), None if row["device_key"] < 0 else int(row["device_key"]))
            if not isinstance(limits, dict):
                continue
            part, ss = comm.iloc[idx], s.iloc[idx]
            used = lambda c: ss[c].fillna(0).to_numpy(np.float64)  # noqa: E731  (no resident kernel: nothing used)
            # the SM keeps the carve-out of the computation already on it; alone, the comm kernel's own
            res_config = ss["smem_config"].to_numpy(np.float64)
            config = np.where(np.isnan(res_config), part["smem_config_bytes"].to_numpy(np.float64), res_config)
            f, lm, _ = blocks_fit(
                capacity(limits), used("u_warps"), used("u_blocks"), used("u_regs"), used("u_smem"), config,
                part["warps_per_block"], part["regs_per_warp"], part["smem_alloc_bytes"],
                own_config=part["smem_config_needed_bytes"],
            )
            unknown = ss["unknown"].eq(True).to_numpy(bool)
            fit[idx] = np.where(unknown, np.nan, f)
            lim[idx] = np.where(unknown, None, lm)
            if tag == "" and limits["vendor"] == "nvidia":
                sm_config[idx] = np.where(unknown, np.nan, config)
        fit_cols[f"comm_blocks_fit_per_sm{tag}"] = pd.array(np.where(np.isnan(fit), np.nan, fit), dtype="Float64").astype("Int64")
        fit_cols[f"fit_limiter{tag}"] = lim
    host = comm["is_host"].fillna(False).to_numpy(bool)
    no_blocker = wait["blocker"].to_numpy() < 0
    fit_cols["comm_blocks_fit_per_sm_beside_blocker"] = fit_cols["comm_blocks_fit_per_sm_beside_blocker"].copy()
    fit_cols["comm_blocks_fit_per_sm_beside_blocker"][no_blocker] = pd.NA
    fit_cols["fit_limiter_beside_blocker"] = np.where(no_blocker, None, fit_cols["fit_limiter_beside_blocker"])
    for col in ("comm_blocks_fit_per_sm", "comm_blocks_fit_per_sm_at_launch", "comm_blocks_fit_per_sm_beside_blocker"):
        fit_cols[col] = fit_cols[col].copy()
        fit_cols[col][host] = pd.NA
    for col in ("fit_limiter", "fit_limiter_at_launch", "fit_limiter_beside_blocker"):
        fit_cols[col] = np.where(host, None, fit_cols[col])
    note = comm["residency_note"].to_numpy(object).copy()
    note[host] = "host activity (CPU-only trace): no SM residency"
    unknown_res = at_ready["unknown"].eq(True).to_numpy(bool)
    note = np.where(note == None, np.where(unknown_res, "a resident compute kernel's launch shape is unknown", None), note)  # noqa: E711
    sm_config[host] = np.nan
    nvidia = np.isfinite(sm_config)
    pref = comm["run_id"].map({r: v[0] for r, v in carveouts.items()}).astype("Float64").to_numpy(np.float64, na_value=np.nan)
    carve_note = comm["run_id"].map({r: v[1] for r, v in carveouts.items()}).fillna(UNKNOWN_CARVEOUT_NOTE).to_numpy(object)

    out = pd.DataFrame(
        {
            "run_id": comm["run_id"],
            "rank": comm["rank"],
            "device": comm["device"],
            "stream": comm["stream"],
            "step": comm["step"],
            "name": comm["name"],
            "collective": comm["collective"],
            "correlation": comm["correlation"],
            "start_ns": comm["start_ns"],
            "end_ns": comm["end_ns"],
            "launch_ns": comm["launch_ns"],
            "prev_end_ns": comm["prev_end_ns"],
            "ready_ns": comm["ready_ns"],
            "ready_from": comm["ready_from"],
            "start_delay_us": (comm["start_ns"].astype("Float64") - comm["ready_ns"].astype("Float64")) / 1000.0,
            "duration_us": (comm["end_ns"] - comm["start_ns"]) / 1000.0,
            "grid_blocks": comm["grid_blocks"],
            "threads_per_block": comm["threads_per_block"],
            "regs_per_thread": comm["regs_per_thread"],
            "shared_mem_bytes": comm["shared_mem_bytes"],
            "comm_blocks_per_sm_alone": pd.array(comm["blocks_per_sm"].to_numpy(), dtype="Float64").astype("Int64"),
            "comm_blocks_needed_per_sm": pd.array(
                np.ceil(comm["grid_blocks"].astype("Float64").to_numpy(np.float64, na_value=np.nan) / comm["num_sms"].to_numpy()),
                dtype="Float64",
            ).astype("Int64"),
            "n_resident_compute_at_launch": pd.array(
                np.where(comm["launch_ns"].isna().to_numpy() | host, np.nan, at_launch["n"].fillna(0).to_numpy(np.float64)), dtype="Float64"
            ).astype("Int64"),
            "resident_compute_at_launch": _names(at_launch["names"]),
            "n_resident_compute": pd.array(
                np.where(comm["ready_ns"].isna().to_numpy() | host, np.nan, at_ready["n"].fillna(0).to_numpy(np.float64)), dtype="Float64"
            ).astype("Int64"),
            "resident_compute": _names(at_ready["names"]),
            "resident_compute_blocks_per_sm": np.where(
                comm["ready_ns"].isna().to_numpy() | at_ready["n"].notna().to_numpy() | host,
                np.where(host, np.nan, at_ready["u_blocks"].to_numpy(np.float64)),
                0.0,
            ),
            "n_compute_during_wait": pd.array(
                np.where(comm["ready_ns"].isna().to_numpy() | host, np.nan, wait["n"].to_numpy(np.float64)), dtype="Float64"
            ).astype("Int64"),
            "wait_blocker": _names(pd.Series(np.where(no_blocker, None, blocker["name"].to_numpy()), dtype=object)),
            "wait_compute_busy_fraction": np.where(host, np.nan, wait["busy"].to_numpy(np.float64)),
            **fit_cols,
            "sm_smem_config_bytes": pd.array(sm_config, dtype="Float64").astype("Int64"),
            "smem_carveout_percent": pd.array(np.where(nvidia, pref, np.nan), dtype="Float64").astype("Int64"),
            "carveout_note": np.where(nvidia, carve_note, None),
            "residency_note": note,
        }
    )
    return out.sort_values(["run_id", "rank", "start_ns"], kind="stable").reset_index(drop=True)


def summarize_delays(delays: pd.DataFrame) -> pd.DataFrame:
    """Per run x rank: comm kernels, median / p95 / max start delay (µs), and how many could not fit a block beside the computation."""
    g = delays.groupby(["run_id", "rank"], dropna=False)
    return pd.DataFrame(
        {
            "n_comm_kernels": g.size(),
            "median_start_delay_us": g["start_delay_us"].median(),
            "p95_start_delay_us": g["start_delay_us"].quantile(0.95),
            "max_start_delay_us": g["start_delay_us"].max(),
            "n_blocked": delays["comm_blocks_fit_per_sm"].eq(0).fillna(False).groupby([delays["run_id"], delays["rank"]], dropna=False).sum().astype(int),
        }
    ).reset_index()


__all__ = ["comm_start_delays", "footprints", "summarize_delays"]
