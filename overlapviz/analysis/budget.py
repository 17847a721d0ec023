"""What the dashboard's why-views draw beyond explain's records: each late start's wait split by cause, the blocker's own kernel, one SM's resource budget for a collective (with the advisor's what-ifs), blocker totals, and collective instances across ranks.

Everything here reads :func:`overlapviz.analysis.explain.explain` records and the
occupancy rules of :mod:`overlapviz.analysis.occupancy`; nothing decides a cause anew.
Times are int64 ns; ``*_us`` columns are µs computed from exact ns.
"""

from __future__ import annotations

import os

import numpy as np
import pandas as pd

from overlapviz.dataset import schema
from overlapviz.analysis import peers
from overlapviz.analysis.advise import Footprint, advise
from overlapviz.analysis.explain import LAUNCH_LATENCY_NS
from overlapviz.analysis.occupancy import blocks_fit, capacity, kernel_occupancy, limits_for, occupancy_table
from overlapviz.analysis.residency import device_table, run_carveouts

__all__ = [
    "WAIT_PARTS", "ready_part", "wait_segments", "blocker_positions", "blocker_table", "sm_budget",
    "kernel_budget", "what_if_options", "worst_record", "instance_ranks", "message_bytes",
    "start_delay_table",
]  # fmt: skip

# the parts of start - launch, in the order they happen (the last one is named by ready_part)
WAIT_PARTS = ("stream_order", "dependency", "sm_resources", "launch_latency", "unknown")
_DTYPE_BYTES = {
    "double": 8, "float64": 8, "float": 4, "float32": 4, "half": 2, "float16": 2, "bfloat16": 2, "long": 8,
    "int64": 8, "int": 4, "int32": 4, "short": 2, "int16": 2, "char": 1, "int8": 1, "byte": 1, "uint8": 1,
    "bool": 1, "float8_e4m3fn": 1, "float8_e5m2": 1, "float8_e4m3fnuz": 1, "float8_e5m2fnuz": 1,
}  # fmt: skip


def _i64(series: pd.Series) -> np.ndarray:
    """A nullable integer column as int64 with -1 for null."""
    if pd.api.types.is_integer_dtype(series.dtype):
        return series.to_numpy(dtype=np.int64, na_value=-1)
    return pd.to_numeric(series, errors="coerce").astype("Float64").fillna(-1).to_numpy(np.float64).astype(np.int64)


def _isin(series: pd.Series, values) -> np.ndarray:
    """``series.isin(values)`` as a boolean array, decided once per category when the column has categories."""
    values = set(values)
    if isinstance(series.dtype, pd.CategoricalDtype):
        hit = np.append(series.cat.categories.isin(values), False)
        codes = series.cat.codes.to_numpy()
        return hit[np.where(codes < 0, len(hit) - 1, codes)]
    return series.isin(values).to_numpy(bool)


def _obj(series: pd.Series) -> pd.Series:
    """A string column as plain objects, through its categories when it has them (no string built per row)."""
    if isinstance(series.dtype, pd.CategoricalDtype):
        cats = series.cat.categories.to_numpy(object)
        codes = series.cat.codes.to_numpy()
        return pd.Series(np.append(cats, None)[np.where(codes < 0, len(cats), codes)], index=series.index, dtype=object)
    return pd.Series(series.to_numpy(object), index=series.index, dtype=object)


def ready_part(explained: pd.DataFrame) -> pd.Series:
    """The name of each record's ready -> start part, by explain's rule (null where there is none).

    ``sm_resources`` where no block fit at ready (``comm_blocks_fit_per_sm`` 0),
    ``launch_latency`` up to :data:`overlapviz.analysis.explain.LAUNCH_LATENCY_NS`, else
    ``unknown``. It is the record's ``cause`` when that part is the largest.
    """
    wait = _i64(explained["ready_wait_ns"])
    blocked = _i64(explained["comm_blocks_fit_per_sm"]) == 0
    name = np.where(blocked, "sm_resources", np.where(wait <= LAUNCH_LATENCY_NS, "launch_latency", "unknown")).astype(object)
    name[wait <= 0] = None
    return pd.Series(name, index=explained.index, dtype=object)


def wait_segments(explained: pd.DataFrame) -> pd.DataFrame:
    """Each comm kernel's wait from launch to start, cut where its cause changes.

    Parameters
    ----------
    explained
        :func:`overlapviz.analysis.explain.explain` records. Not modified.

    Returns
    -------
    pandas.DataFrame
        One row per non-empty part: ``record`` (the record's index label), ``run_id``,
        ``rank``, ``stream``, ``part`` (``stream_order``: launch -> previous activity on the
        stream ends; ``dependency``: -> the last producer the stream waited on ends; then
        ready -> start named by :func:`ready_part`), ``start_ns``, ``end_ns``, ``us``.
        Without a known launch only the ready -> start part is given.
    """
    cols = ["record", "run_id", "rank", "stream", "part", "start_ns", "end_ns", "us"]
    if not len(explained):
        return pd.DataFrame(columns=cols)
    launch, stream_ready = _i64(explained["launch_ns"]), _i64(explained["stream_ready_ns"])
    dep, ready = _i64(explained["dependency_ready_ns"]), _i64(explained["ready_ns"])
    start = explained["start_ns"].to_numpy(np.int64)
    known = launch >= 0
    s_end = np.where(known & (stream_ready > launch), stream_ready, -1)
    base = np.maximum(launch, stream_ready)
    d_end = np.where(known & (dep >= 0) & (dep > base), dep, -1)
    r0 = np.where(ready >= 0, ready, -1)
    pieces = [
        (np.flatnonzero(s_end >= 0), launch, s_end, "stream_order"),
        (np.flatnonzero(d_end >= 0), base, d_end, "dependency"),
    ]
    last = ready_part(explained).to_numpy(object)
    has_r = np.flatnonzero((r0 >= 0) & (start > r0) & pd.notna(last))
    frames = []
    for idx, lo, hi, name in pieces:
        frames.append(pd.DataFrame({"i": idx, "start_ns": lo[idx], "end_ns": hi[idx], "part": name}))
    frames.append(pd.DataFrame({"i": has_r, "start_ns": r0[has_r], "end_ns": start[has_r], "part": last[has_r]}))
    seg = pd.concat(frames, ignore_index=True).sort_values(["i", "start_ns"], kind="stable")
    i = seg["i"].to_numpy(np.int64)
    out = pd.DataFrame(
        {
            "record": explained.index.to_numpy()[i],
            "run_id": explained["run_id"].to_numpy(object)[i],
            "rank": explained["rank"].to_numpy()[i],
            "stream": explained["stream"].to_numpy()[i],
            "part": seg["part"].to_numpy(object),
            "start_ns": seg["start_ns"].to_numpy(np.int64),
            "end_ns": seg["end_ns"].to_numpy(np.int64),
        }
    )
    return out.assign(us=(out["end_ns"] - out["start_ns"]) / 1000.0).reset_index(drop=True)


def blocker_positions(explained: pd.DataFrame, kernels: pd.DataFrame) -> pd.DataFrame:
    """Where each ``sm_resources`` record's blocker ran: the resident kernel of that name at ready.

    Parameters
    ----------
    explained
        explain records (any runs and ranks).
    kernels
        ``kernels`` rows covering those runs and ranks (``run_id, rank, device, stream,
        correlation, name, kind, start_ns, end_ns``). Neither is modified.

    Returns
    -------
    pandas.DataFrame
        Aligned with ``explained``: ``blocker_stream``, ``blocker_correlation``,
        ``blocker_start_ns``, ``blocker_end_ns`` (nullable Int64): the computation kernel
        named ``blocker`` resident at ``ready_ns`` on the record's device whose end (or the
        comm kernel's start, if earlier) came last, as explain picks it. Null where there
        is no blocker or it is not in ``kernels``.
    """
    n = len(explained)
    out = {c: np.full(n, -1, np.int64) for c in ("blocker_stream", "blocker_correlation", "blocker_start_ns", "blocker_end_ns")}
    want = np.flatnonzero(explained["blocker"].notna().to_numpy(bool)) if n else np.empty(0, np.int64)
    comp = kernels.iloc[:0]
    if len(want) and len(kernels):
        rec = explained.iloc[want]
        t = _i64(rec["ready_ns"])
        t = np.where(t >= 0, t, rec["start_ns"].to_numpy(np.int64))
        # only kernels named as some blocker, and running at some record's ready time, can be one
        start, end = kernels["start_ns"].to_numpy(np.int64), kernels["end_ns"].to_numpy(np.int64)
        near = (start <= t.max()) & (end > t.min()) & _isin(kernels["name"], rec["blocker"].astype(str))
        comp = kernels.loc[near]
        comp = comp.loc[_isin(comp["kind"], ["compute", "other"])]
    if len(comp):
        s_c, dev_r = rec["start_ns"].to_numpy(np.int64), _i64(rec["device"])
        name_r = rec["blocker"].astype(str).to_numpy(object)
        best = np.full(len(want), -np.inf)
        by_rank = pd.Series(np.arange(len(want))).groupby([rec["run_id"].astype(str).to_numpy(), _i64(rec["rank"])]).indices
        # one pass per stream of a rank: the kernel resident on it at each ready time (streams run in order)
        lanes = comp.groupby([_obj(comp["run_id"]).astype(str).to_numpy(), _i64(comp["rank"]), _i64(comp["stream"])], sort=False).indices
        for (run_id, rank, stream), rows in lanes.items():
            mine = by_rank.get((run_id, rank))
            if mine is None:
                continue
            g = comp.iloc[rows]
            order = np.argsort(g["start_ns"].to_numpy(np.int64), kind="stable")
            gs, ge = g["start_ns"].to_numpy(np.int64)[order], g["end_ns"].to_numpy(np.int64)[order]
            gname, gdev = _obj(g["name"]).to_numpy(object)[order], _i64(g["device"])[order]
            gcorr = _i64(g["correlation"])[order]
            pos = np.searchsorted(gs, t[mine], side="right") - 1
            j = np.maximum(pos, 0)
            ok = (pos >= 0) & (ge[j] > t[mine]) & (gdev[j] == dev_r[mine]) & (gname[j] == name_r[mine])
            finish = np.where(ok, np.minimum(ge[j], s_c[mine]), -np.inf).astype(np.float64)
            better = finish > best[mine]
            sel, jj = mine[better], j[better]
            best[sel] = finish[better]
            out["blocker_stream"][want[sel]] = int(stream)
            out["blocker_correlation"][want[sel]] = gcorr[jj]
            out["blocker_start_ns"][want[sel]] = gs[jj]
            out["blocker_end_ns"][want[sel]] = ge[jj]
    return pd.DataFrame({c: pd.array(np.where(v == -1, None, v).tolist(), dtype="Int64") for c, v in out.items()},
                        index=explained.index)  # fmt: skip


def start_delay_table(explained: pd.DataFrame) -> pd.DataFrame:
    """Per run, the comm start delay (ready -> start) under each name it goes by, so that every place shows the same
    number for the same name.

    Returns
    -------
    pandas.DataFrame
        ``run_id``, ``n_comm_kernels``, ``median_start_delay_us`` (median over all the run's comm kernels; with one
        rank this is ``explain --summary``'s), ``p95_start_delay_us``, ``median_start_delay_at_launch_us`` (median
        over the comm kernels whose ready time is their launch, else over all: the column of
        ``collectors/report.py``'s sweep table and of the README), ``n_at_launch`` (the kernels that median is over),
        ``n_ready_at_launch`` (those ready at their launch: 0 where the median is over all).
    """
    cols = ["run_id", "n_comm_kernels", "median_start_delay_us", "p95_start_delay_us", "median_start_delay_at_launch_us", "n_at_launch",
            "n_ready_at_launch"]  # fmt: skip
    if not len(explained):
        return pd.DataFrame(columns=cols)
    d = pd.DataFrame({"run_id": explained["run_id"].to_numpy(object),
                      "delay": pd.to_numeric(explained["start_delay_us"], errors="coerce").astype("float64").to_numpy(),
                      "at_launch": (explained["ready_from"] == "launch").fillna(False).to_numpy(bool)})  # fmt: skip
    rows = []
    for run_id, x in d.groupby("run_id", sort=True):
        use = x.loc[x["at_launch"]] if x["at_launch"].any() else x
        rows.append({"run_id": run_id, "n_comm_kernels": len(x), "median_start_delay_us": float(x["delay"].median()),
                     "p95_start_delay_us": float(x["delay"].quantile(0.95)),
                     "median_start_delay_at_launch_us": float(use["delay"].median()), "n_at_launch": int(len(use)),
                     "n_ready_at_launch": int(x["at_launch"].sum())})  # fmt: skip
    return pd.DataFrame(rows, columns=cols)


def blocker_table(explained: pd.DataFrame) -> pd.DataFrame:
    """The computation kernels that kept collectives off the SMs, per run, most time first.

    Returns
    -------
    pandas.DataFrame
        ``run_id, blocker, n_blocked`` (records whose cause is ``sm_resources`` with this
        blocker), ``ranks`` (how many ranks), ``blocked_us`` (their start − launch summed; null when the trace has
        the launch of none of them), ``ready_wait_us`` (their ready -> start summed), ``blocking_resource`` (the most
        frequent one).
    """
    cols = ["run_id", "blocker", "n_blocked", "ranks", "blocked_us", "ready_wait_us", "blocking_resource"]
    d = explained.loc[(explained["cause"] == "sm_resources") & explained["blocker"].notna()]
    if not len(d):
        return pd.DataFrame(columns=cols)
    sml = pd.to_numeric(d["start_minus_launch_ns"], errors="coerce").astype("Float64")
    d = d.assign(_sml=sml.fillna(0).clip(lower=0), _known=sml.notna().astype(int),
                 _rw=pd.to_numeric(d["ready_wait_ns"], errors="coerce").astype("Float64").fillna(0).clip(lower=0))  # fmt: skip
    g = d.groupby(["run_id", "blocker"], sort=False)
    out = g.agg(n_blocked=("cause", "size"), ranks=("rank", "nunique"), blocked_ns=("_sml", "sum"), known=("_known", "sum"),
                rw=("_rw", "sum"))  # fmt: skip
    res = g["blocking_resource"].agg(lambda s: s.value_counts().index[0] if s.notna().any() else None)
    out = out.assign(blocked_us=(out["blocked_ns"].astype(float) / 1000.0).where(out["known"] > 0),
                     ready_wait_us=out["rw"].astype(float) / 1000.0, blocking_resource=res).reset_index()  # fmt: skip
    return out[cols].sort_values(["run_id", "blocked_us", "ready_wait_us"], ascending=[True, False, False], kind="stable",
                                 na_position="last").reset_index(drop=True)  # fmt: skip


def worst_record(explained: pd.DataFrame) -> dict | None:
    """The collective to look at first: the longest start − launch among those held off the SMs
    (cause ``sm_resources``), else the longest of all; None without records."""
    if not len(explained):
        return None
    return explained.loc[latest_first(explained, blocked_first=True).index[0]].to_dict()


def latest_first(explained: pd.DataFrame, *, blocked_first: bool = False) -> pd.DataFrame:
    """``explained`` by start − launch, longest first, then those whose launch the trace does not have, by ready → start
    (the Why late page's order); ``blocked_first``: the collectives held off the SMs (cause ``sm_resources``) first."""
    late = pd.to_numeric(explained["start_minus_launch_ns"], errors="coerce").astype("Float64")
    wait = pd.to_numeric(explained["ready_wait_ns"], errors="coerce").astype("Float64")
    keys = pd.DataFrame({"blocked": (explained["cause"] == "sm_resources").to_numpy(bool) if blocked_first else False,
                         "known": late.notna().to_numpy(bool), "late": late.fillna(-1).to_numpy(float),
                         "wait": wait.fillna(-1).to_numpy(float)}, index=explained.index)  # fmt: skip
    order = keys.sort_values(["blocked", "known", "late", "wait"], ascending=False, kind="stable").index
    return explained.loc[order]


# --- one SM's budget ----------------------------------------------------------------------------


def sm_budget(limits: dict, resident: list[dict], comm: dict, *, smem_config: float | None = None) -> pd.DataFrame:
    """One SM's (CU's) resources: capacity, what resident computation blocks hold, what one comm block needs.

    Parameters
    ----------
    limits
        Device limits (:func:`overlapviz.domain.devices.device_limits`).
    resident
        What holds the SM: dicts with ``name``, ``blocks`` (resident blocks of it on this SM),
        ``warps_per_block``, ``regs_per_warp``, ``smem_alloc_bytes``; empty for an SM free of
        computation.
    comm
        The comm kernel's ``warps_per_block``, ``regs_per_warp``, ``smem_alloc_bytes`` and
        ``smem_config_needed_bytes`` (NVIDIA: the least carve-out its blocks join; 0: any).
    smem_config
        The shared memory the SM is configured with (the carve-out the resident blocks left);
        None: the SM's largest.

    Returns
    -------
    pandas.DataFrame
        One row per resource (``block_slots``, ``warps``, ``registers``, ``shared_memory``):
        ``unit``, ``capacity`` (shared memory: the configured carve-out), ``max_capacity``
        (shared memory: the largest carve-out; else = capacity), ``used`` (resident
        computation), ``need`` (one comm block), ``free``, ``blocks_fit`` (comm blocks this
        resource alone admits, by :func:`overlapviz.analysis.occupancy.blocks_fit`),
        ``overflow`` (it admits none), ``limiting`` (the resource that sets the fit), and the
        fit of the whole SM in ``attrs["fit"]``, its limiter in ``attrs["limiter"]``.
    """
    cap = capacity(limits)
    nvidia = limits["vendor"] == "nvidia"
    used = {"warps": 0.0, "blocks": 0.0, "regs": 0.0, "smem": 0.0}
    for r in resident:
        b = float(r["blocks"])
        used["warps"] += b * float(r["warps_per_block"])
        used["blocks"] += b
        used["regs"] += b * float(r["warps_per_block"]) * float(r["regs_per_warp"])
        used["smem"] += b * float(r["smem_alloc_bytes"])
    config = float(cap["shared_mem_per_sm"] if smem_config is None or pd.isna(smem_config) else smem_config)
    need_cfg = comm.get("smem_config_needed_bytes")
    one = lambda v: np.array([float(v)])  # noqa: E731  (blocks_fit is vectorized)
    fit, lim, by = blocks_fit(cap, one(used["warps"]), one(used["blocks"]), one(used["regs"]), one(used["smem"]), one(config),
                              one(comm["warps_per_block"]), one(comm["regs_per_warp"]), one(comm["smem_alloc_bytes"]),
                              own_config=None if need_cfg is None or pd.isna(need_cfg) else one(need_cfg))  # fmt: skip
    by = {r: np.broadcast_to(np.asarray(v, np.float64), (1,)) for r, v in by.items()}
    fit_n, limiter = float(fit[0]), lim[0]
    warp = int(limits.get("warp_size") or 32)
    regs_total = cap["reg_parts"] * cap["regs_per_part"]
    rows = [
        ("block_slots", "blocks", cap["blocks"], cap["blocks"], used["blocks"], 1.0, by["blocks"][0]),
        ("warps", "warps" if nvidia else "waves", cap["warps"], cap["warps"], used["warps"], float(comm["warps_per_block"]),
         by["warps"][0]),
        ("registers", "registers" if nvidia else "VGPRs", regs_total, regs_total, used["regs"],
         float(comm["warps_per_block"]) * float(comm["regs_per_warp"]), by["registers"][0]),
        ("shared_memory", "bytes", config, float(cap["shared_mem_per_sm"]), used["smem"], float(comm["smem_alloc_bytes"]),
         by["shared_memory"][0]),
    ]  # fmt: skip
    out = pd.DataFrame(rows, columns=["resource", "unit", "capacity", "max_capacity", "used", "need", "blocks_fit"])
    out["blocks_fit"] = np.maximum(np.where(np.isinf(out["blocks_fit"]), np.nan, out["blocks_fit"]), 0)
    out["free"] = out["capacity"] - out["used"]
    out["overflow"] = (out["blocks_fit"] < 1).fillna(False)
    name = {"blocks": "block_slots"}.get(limiter, limiter)
    out["limiting"] = out["resource"] == ("shared_memory" if name == "shared_memory_carveout" else name)
    if name == "shared_memory_carveout":  # the carve-out the SM is in stops the block, not the hardware
        out.loc[out["resource"] == "shared_memory", "overflow"] = fit_n < 1
    out.attrs.update(fit=fit_n, limiter=name, threads_per_warp=warp, smem_config_needed=need_cfg)
    return out


def _record_kernels(dataset_path, record: dict, kernels: pd.DataFrame | None) -> pd.DataFrame:
    """The record's comm kernel and the computation resident at its ready time (rows of ``kernels``)."""
    cols = ["run_id", "rank", "device", "stream", "correlation", "name", "kind", "start_ns", "end_ns", "grid_x", "grid_y",
            "grid_z", "block_x", "block_y", "block_z", "regs_per_thread", "shared_mem_bytes"]  # fmt: skip
    t = record.get("ready_ns")
    t = int(record["start_ns"]) if t is None or pd.isna(t) else int(t)
    if kernels is None:
        import pyarrow.compute as pc

        flt = (pc.field("rank") == int(record["rank"])) & (((pc.field("start_ns") <= t) & (pc.field("end_ns") > t))
                                                          | (pc.field("start_ns") == int(record["start_ns"])))  # fmt: skip
        kernels = schema.read_frame(dataset_path, "kernels", columns=cols, run_ids=[record["run_id"]], filter=flt)
    k = kernels.loc[(kernels["run_id"] == record["run_id"]) & (kernels["rank"] == int(record["rank"]))]
    return k, t


def _listed(name: str, joined: str) -> bool:
    """``name`` is one of the names explain joined with ", " into ``joined`` (a C++ signature holds ", " too: the
    joined string is never split)."""
    return bool(name) and (joined == name or joined.startswith(name + ", ") or joined.endswith(", " + name)
                           or f", {name}, " in joined)


def _occ_rows(rows: pd.DataFrame, dev_limits: dict, carveouts: dict) -> pd.DataFrame:
    threads = rows["block_x"].astype("Int64") * rows["block_y"].fillna(1).astype("Int64") * rows["block_z"].fillna(1).astype("Int64")
    grid = rows["grid_x"].astype("Int64") * rows["grid_y"].fillna(1).astype("Int64") * rows["grid_z"].fillna(1).astype("Int64")
    return kernel_occupancy(rows.assign(threads_per_block=threads, grid_blocks=grid), dev_limits, carveouts)


def _held_sms(dataset_path, record: dict, kernels: pd.DataFrame | None, device: str | None = None) -> dict:
    """The SMs around ``record``'s comm kernel at its ready time, as explain models them: the comm kernel's row and
    occupancy (``comm_row``, ``comm``), its device's ``limits``, each resident computation kernel (one per stream, on
    its device, named in explain's ``resident_compute``; only the blocker when there is one) with the comm blocks that
    fit beside its blocks on an SM it holds, the best of them (``best``: (fit, occupancy row, shape, kernel row); the
    first such: the blocker's, else in stream order; None without one), the fit on an SM free of computation (``alone``)
    and why a resident kernel has no residency (``note``). ValueError when the comm kernel, its shape or its
    device's limits are unknown. ``device``: the GPU for ranks whose trace does not say (``residency.device_table``)."""
    k, t = _record_kernels(dataset_path, record, kernels)
    comm_rows = k.loc[(k["start_ns"] == int(record["start_ns"])) & (k["stream"] == record["stream"])]
    if record.get("correlation") is not None and not pd.isna(record.get("correlation")):
        comm_rows = comm_rows.loc[comm_rows["correlation"] == int(record["correlation"])] if len(comm_rows) > 1 else comm_rows
    if not len(comm_rows):
        raise ValueError(f"{dataset_path}: comm kernel of run {record['run_id']} rank {record['rank']} at {record['start_ns']} not found")
    joined = record.get("resident_compute")
    joined = "" if joined is None or pd.isna(joined) else str(joined)
    res = k.loc[k["kind"].astype(str).isin(["compute", "other"]) & (k["start_ns"] <= t) & (k["end_ns"] > t)
                & k["name"].map(lambda n: _listed(str(n), joined)).astype(bool)]  # fmt: skip
    c_device = comm_rows["device"].iloc[0]
    if not pd.isna(c_device):  # explain's residents: on the comm kernel's device
        res = res.loc[res["device"].isna() | (res["device"] == c_device)]
    res = res.drop_duplicates("stream", keep="last")
    blocker = record.get("blocker")
    if blocker is not None and not pd.isna(blocker) and (res["name"] == blocker).any():
        res = res.loc[res["name"] == blocker]
    dev_limits = device_table(dataset_path, device)
    rows = pd.concat([comm_rows.iloc[:1], res], ignore_index=True)
    occ = _occ_rows(rows, dev_limits, run_carveouts(dataset_path))
    c = occ.iloc[0]
    limits = limits_for(dev_limits, record["run_id"], int(record["rank"]), None if pd.isna(c["device"]) else int(c["device"]))
    if not isinstance(limits, dict):
        raise ValueError(f"device limits of run {record['run_id']} rank {record['rank']} unknown: {limits or 'no devices row'}")
    if pd.isna(c["blocks_per_sm"]):
        raise ValueError(f"the comm kernel's launch shape is unknown: {c['residency_note']}")
    comm = {f: float(c[f]) for f in ("warps_per_block", "regs_per_warp", "smem_alloc_bytes", "smem_config_needed_bytes")}
    unknown = occ.iloc[1:].loc[occ["blocks_per_sm"].iloc[1:].isna()]
    note = f"resident {unknown['name'].iloc[0]}: {unknown['residency_note'].iloc[0]}" if len(unknown) else None
    held = []
    for j in range(1, len(occ)):
        r = occ.iloc[j]
        if pd.isna(r["blocks_per_sm"]):
            continue
        shape = {"warps_per_block": float(r["warps_per_block"]), "regs_per_warp": float(r["regs_per_warp"]),
                 "smem_alloc_bytes": float(r["smem_alloc_bytes"])}  # fmt: skip
        one = [{"name": str(r["name"]), "blocks": float(r["blocks_per_sm"]), **shape}]
        held.append((sm_budget(limits, one, comm, smem_config=float(r["smem_config_bytes"])).attrs["fit"], r, shape, rows.iloc[j]))
    return {"comm_row": c, "comm_kernel": rows.iloc[0], "limits": limits, "comm": comm, "note": note,
            "best": max(held, key=lambda h: h[0]) if held else None, "alone": sm_budget(limits, [], comm).attrs["fit"]}


def kernel_budget(dataset_path: str | os.PathLike, record: dict, *, kernels: pd.DataFrame | None = None,
                  what_if: dict | None = None, device: str | None = None) -> tuple[pd.DataFrame, dict]:  # fmt: skip
    """The SM budget of one comm kernel at its ready time, on the SM explain's ``comm_blocks_fit_per_sm`` is of (the
    best SM's): the SM held by the resident computation kernel beside which the most comm blocks fit (the blocker's when
    none fits), or an SM free of computation when none is resident or free SMs remain and take more. With ``what_if``,
    the SM that kernel holds, the kernel changed by the option.

    Parameters
    ----------
    record
        One :func:`overlapviz.analysis.explain.explain` record (a dict or row).
    kernels
        Optional ``kernels`` rows of the record's run and rank (read from the dataset when None).
    what_if
        Optional row of :func:`what_if_options` (an :func:`overlapviz.analysis.advise.advise`
        option): the computation kernel as that option changes it (threads, registers, shared
        memory, carve-out preference, blocks per SM).
    device
        The GPU the traces ran on, for ranks whose trace does not say (as explain's ``device``;
        :func:`overlapviz.analysis.residency.device_table`).

    Returns
    -------
    (pandas.DataFrame, dict)
        :func:`sm_budget`'s table and the facts around it: ``comm`` and ``resident`` (names),
        ``blocks_per_sm`` (the resident kernel's blocks on this SM), ``fit``, ``limiter``,
        ``free_sms``, ``num_sms``, ``smem_config_bytes``, ``device``, ``note``, ``held_sm`` (shown on a free SM while
        computation held others: the kernel on the best of those and the comm blocks that fit beside it; else None).

    Raises
    ------
    ValueError
        When the device limits or the comm kernel's launch shape are unknown (the reason).
    """
    record = dict(record)
    sm = _held_sms(dataset_path, record, kernels, device)
    c, limits, comm, best, alone = sm["comm_row"], sm["limits"], sm["comm"], sm["best"], sm["alone"]
    free = record.get("free_sms")
    free = None if free is None or pd.isna(free) else int(free)
    # the SM explain's fit is of (comm_blocks_fit_per_sm: the best SM's): the held SM where the most comm blocks fit
    # beside its resident blocks (the blocker's when none fits), or an SM free of computation when free SMs remain and
    # take more; a what-if changes the computation kernel, so it is shown on the SM that kernel holds
    resident, config, note, blocks = [], None, sm["note"], 0.0
    if best is not None and (what_if is not None or not ((free or 0) > 0 and alone > best[0])):
        _, r, shape, _row = best
        blocks, config = float(r["blocks_per_sm"]), float(r["smem_config_bytes"])
        if what_if is not None and what_if.get("lever") == "sm_carveout":
            # whole SMs left to the collective: it runs alone there
            blocks, config, shape = 0.0, None, None
            note = f"{what_if.get('setting')}: the collective runs alone on them, the computation keeps the others"
        elif what_if is not None:
            blocks, config, shape = _apply_option(limits, what_if)
        if shape is not None:
            resident = [{"name": str(r["name"]), "blocks": blocks, **shape}]
    held_sm = None  # shown on a free SM: the best held SM's kernel and fit, for the reader to compare
    if best is not None and not resident and what_if is None:
        held_sm = {"resident": str(best[1]["name"]), "fit": float(best[0])}
    table = sm_budget(limits, resident, comm, smem_config=config)
    facts = {
        "comm": str(c["name"]), "resident": resident[0]["name"] if resident else None, "blocks_per_sm": blocks,
        "fit": table.attrs["fit"], "limiter": table.attrs["limiter"], "free_sms": free,
        "num_sms": limits.get("num_sms"), "smem_config_bytes": table.loc[table["resource"] == "shared_memory", "capacity"].iloc[0],
        "device": limits.get("name") or limits.get("arch"), "vendor": limits["vendor"], "note": note, "held_sm": held_sm,
        "what_if": None if what_if is None else what_if.get("setting"),
    }  # fmt: skip
    return table, facts


def _apply_option(limits: dict, option: dict) -> tuple[float, float, dict]:
    """Blocks per SM, carve-out (bytes) and per-block footprint of the computation under an advise option."""
    carve = option.get("carveout")
    carve = None if carve is None or pd.isna(carve) else int(carve)
    t = occupancy_table(limits, [int(option["compute_threads"])], int(option["compute_regs"]), int(option["compute_smem_bytes"]),
                        carveout=carve).iloc[0]  # fmt: skip
    shape = {"warps_per_block": float(t["warps_per_block"]),
             "regs_per_warp": float(t["regs_per_block_allocated"]) / float(t["warps_per_block"]),
             "smem_alloc_bytes": float(t["shared_mem_per_block_allocated"])}  # fmt: skip
    return float(option["compute_blocks_per_sm"]), float(t["shared_mem_config"]), shape


def what_if_options(dataset_path: str | os.PathLike, record: dict, *, kernels: pd.DataFrame | None = None,
                    device: str | None = None) -> pd.DataFrame:  # fmt: skip
    """The advisor's options (:func:`overlapviz.analysis.advise.advise`, one comm block per SM) for the
    computation kernel that held the SM when ``record``'s comm kernel was ready: the one whose SM
    :func:`kernel_budget` shows a what-if on (the blocker, else the resident kernel with the most room).

    Empty when nothing was resident or a shape or the device limits are unknown. ``device``: as for
    :func:`kernel_budget`.
    """
    try:
        sm = _held_sms(dataset_path, dict(record), kernels, device)
    except ValueError:
        return pd.DataFrame()
    if sm["best"] is None:
        return pd.DataFrame()
    limits = sm["limits"]
    rows = pd.DataFrame([sm["comm_kernel"], sm["best"][3]]).reset_index(drop=True)

    def fp(r) -> Footprint | None:
        threads = int(r["block_x"] or 0) * int(1 if pd.isna(r["block_y"]) else r["block_y"]) * int(1 if pd.isna(r["block_z"]) else r["block_z"])
        if threads <= 0 or pd.isna(r["regs_per_thread"]):
            return None
        grid = int(r["grid_x"]) * int(1 if pd.isna(r["grid_y"]) else r["grid_y"]) * int(1 if pd.isna(r["grid_z"]) else r["grid_z"]) \
            if not pd.isna(r["grid_x"]) else None  # fmt: skip
        smem = 0 if pd.isna(r["shared_mem_bytes"]) else int(r["shared_mem_bytes"])
        return Footprint(threads, int(r["regs_per_thread"]), smem, grid, str(r["name"]))

    comm, compute = fp(rows.iloc[0]), fp(rows.iloc[1])
    if comm is None or compute is None:
        return pd.DataFrame()
    pref, _note, applies = run_carveouts(dataset_path).get(record["run_id"], (None, None, frozenset()))
    carve = pref if pref is not None and compute.name in applies else None
    return advise(limits, compute, comm, k=1, carveout=carve)


# --- collectives across ranks ------------------------------------------------------------------


def message_bytes(explained: pd.DataFrame, runs: pd.DataFrame | None = None, kernels: pd.DataFrame | None = None) -> pd.Series:
    """Bytes of each record's message: ``comm_in_elems`` x the element size of ``comm_dtype`` where the
    trace recorded them (``kernels`` rows joined on run, rank, correlation), else the run's
    ``message_bytes`` (collected runs); null where neither says."""
    out = pd.Series(np.nan, index=explained.index, dtype="Float64")
    if kernels is not None and len(kernels) and {"comm_in_elems", "comm_dtype", "correlation"} <= set(kernels.columns):
        k = kernels.loc[kernels["comm_in_elems"].notna(), ["run_id", "rank", "correlation", "comm_in_elems", "comm_dtype"]]
        size = k["comm_dtype"].astype(str).str.lower().str.replace("torch.", "", regex=False).map(_DTYPE_BYTES)
        k = k.assign(_b=pd.to_numeric(k["comm_in_elems"], errors="coerce") * size).dropna(subset=["_b"])
        k = k.drop_duplicates(["run_id", "rank", "correlation"])
        key = explained[["run_id", "rank", "correlation"]].astype({"rank": "int64", "correlation": "Int64"})
        j = key.merge(k.astype({"rank": "int64", "correlation": "Int64"})[["run_id", "rank", "correlation", "_b"]],
                      on=["run_id", "rank", "correlation"], how="left")  # fmt: skip
        out = pd.Series(j["_b"].to_numpy(), index=explained.index, dtype="Float64")
    if runs is not None and "message_bytes" in runs:
        per_run = pd.to_numeric(runs.set_index("run_id")["message_bytes"], errors="coerce")
        out = out.fillna(explained["run_id"].map(per_run).astype("Float64"))
    return out


def instance_ranks(explained: pd.DataFrame, instances: pd.DataFrame) -> pd.DataFrame:
    """Instance x rank cells for the collectives view: when each rank arrived and how long it waited.

    Parameters
    ----------
    explained
        explain records (with ``instance``).
    instances
        :func:`overlapviz.analysis.peers.collective_instances` of the same records.

    Returns
    -------
    pandas.DataFrame
        ``run_id, instance, ordinal`` (the instance's place in its run by first start,
        0-based), ``rank``, ``arrival_us`` (this rank's ready − the instance's first ready),
        ``peer_wait_us``, ``start_delay_us``, ``cause``, ``slowest`` (this rank was the last
        ready). One row per record.
    """
    cols = ["run_id", "instance", "ordinal", "rank", "arrival_us", "peer_wait_us", "start_delay_us", "cause", "slowest"]
    if not len(explained) or not len(instances):
        return pd.DataFrame(columns=cols)
    inst = instances.sort_values(["run_id", "first_start_ns"], kind="stable")
    inst = inst.assign(ordinal=inst.groupby("run_id", sort=False).cumcount())
    key = explained[["run_id", "instance", "rank", "ready_ns", "peer_wait_us", "start_delay_us", "cause"]]
    j = key.merge(inst[["run_id", "instance", "ordinal", "first_ready_ns", "slowest_rank"]], on=["run_id", "instance"], how="left")
    arrival = (pd.to_numeric(j["ready_ns"], errors="coerce").astype("Float64")
               - pd.to_numeric(j["first_ready_ns"], errors="coerce").astype("Float64")) / 1000.0  # fmt: skip
    return pd.DataFrame({
        "run_id": j["run_id"], "instance": j["instance"], "ordinal": j["ordinal"].astype("int64"), "rank": _i64(j["rank"]),
        "arrival_us": arrival.astype("float64"), "peer_wait_us": pd.to_numeric(j["peer_wait_us"], errors="coerce").astype("float64"),
        "start_delay_us": pd.to_numeric(j["start_delay_us"], errors="coerce").astype("float64"), "cause": j["cause"],
        "slowest": (pd.to_numeric(j["slowest_rank"], errors="coerce") == _i64(j["rank"])).fillna(False).astype(bool),
    })[cols]  # fmt: skip
