"""Advisor: the smallest shared-memory padding, tile (launch shape) or carve-out that lets k communication blocks fit beside a computation kernel, and its cost in computation residency."""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass

import numpy as np
import pandas as pd

from overlapviz.dataset import schema
from overlapviz.analysis.occupancy import blocks_fit, capacity, limits_for, occupancy_table
from overlapviz.analysis.residency import device_table, kernel_shapes


@dataclass(frozen=True)
class Footprint:
    """A kernel's launch shape: threads per block, registers per thread, shared memory per block (bytes), and optionally its grid (blocks)."""

    threads: int
    regs: int
    smem: int = 0
    grid: int | None = None
    name: str | None = None

    def __post_init__(self):
        for field in ("threads", "regs", "smem"):
            value = getattr(self, field)
            if value is None or int(value) < 0:
                raise ValueError(f"footprint {field} must be a non-negative integer, not {value!r}")
        if int(self.threads) == 0:
            raise ValueError("footprint threads must be at least 1")

    def describe(self) -> str:
        return f"{self.threads} threads, {self.regs} regs, {self.smem} B smem"


def _evaluate(limits: dict, compute_threads, compute_regs, compute_smem, comm: Footprint, *, carveout=None, grid=None):
    """Compute residency and comm fit for arrays of compute shapes (vectorized)."""
    c = occupancy_table(limits, compute_threads, compute_regs, compute_smem, carveout=carveout)
    # the preference is the computation's: a collective library's kernel keeps the driver's default
    m = occupancy_table(limits, [comm.threads], comm.regs, comm.smem)
    n = c["blocks_per_sm"].to_numpy(np.float64)
    if grid and limits.get("num_sms"):
        n = np.minimum(n, math.ceil(grid / limits["num_sms"]))
    wpb = c["warps_per_block"].to_numpy(np.float64)
    rpw = c["regs_per_block_allocated"].to_numpy(np.float64) / wpb
    # the SM keeps the carve-out of the blocks already on it; alone, the comm kernel's own
    config = np.where(n > 0, c["shared_mem_config"].to_numpy(np.float64), float(m["shared_mem_config"].iloc[0]))
    fit, limiter, _ = blocks_fit(
        capacity(limits), n * wpb, n, n * wpb * rpw, n * c["shared_mem_per_block_allocated"].to_numpy(np.float64), config,
        float(m["warps_per_block"].iloc[0]), float(m["regs_per_block_allocated"].iloc[0]) / float(m["warps_per_block"].iloc[0]),
        float(m["shared_mem_per_block_allocated"].iloc[0]), own_config=float(m["shared_mem_config_needed"].iloc[0]),
    )
    return c.assign(resident=n, comm_fit=fit, fit_limiter=limiter)


def advise(
    limits: dict,
    compute: Footprint,
    comm: Footprint,
    *,
    k: int = 1,
    alternatives: list[Footprint] | None = None,
    carveout: int | None = None,
) -> pd.DataFrame:
    """What to change so that ``k`` communication blocks fit beside the computation on one SM.

    Three levers, each tried exhaustively with the occupancy rules of
    :mod:`overlapviz.analysis.residency` and the fit rule of :func:`overlapviz.analysis.occupancy.blocks_fit`:

    * ``smem_pad``: extra shared memory per computation block (occupancy shaping), in
      steps of the allocation unit (128 B NVIDIA, 512 B AMD LDS) up to the per-block
      limit; the smallest pad that meets the target is recommended. With no carve-out
      preference the driver configures the SM with the smallest carve-out step that holds
      the padded blocks, which can leave no room for the communication block
      (``fit_limiter`` ``shared_memory_carveout``); such a pad is listed again with the
      smallest carve-out preference (percent) that makes room at the same residency.
    * ``tile``: other launch shapes of the computation (``alternatives``, e.g. the other
      tiles of the same GEMM found in a trace), unpadded.
    * ``carveout`` (NVIDIA): each shared-memory carve-out preference (percent); the
      recommended one is the smallest (most L1 left) that meets the target with the least
      loss of computation residency.
    * ``sm_carveout`` (when ``comm.grid`` is known): leave the SMs the collective's whole
      grid needs at its own occupancy to it (cuBLAS's SM carve-out, or a persistent
      kernel's grid); the computation keeps its residency on the other SMs and pays in
      waves.

    Parameters
    ----------
    limits
        Device limits (:func:`overlapviz.domain.devices.device_limits`).
    compute, comm
        The two kernels' footprints. ``compute.grid`` (blocks), when given, caps the
        computation's resident blocks at ceil(grid / SMs) and gives ``compute_waves``.
    k
        Communication blocks wanted per SM (>= 1).
    alternatives
        Other launch shapes of the computation to consider.
    carveout
        NVIDIA: the computation's current shared-memory carve-out preference, percent
        (``cudaFuncAttributePreferredSharedMemoryCarveout``); None: none (the driver's
        default). Applies to ``current``, ``smem_pad`` and ``tile``.

    Returns
    -------
    pandas.DataFrame
        One row per option: ``lever`` (``current``, ``smem_pad``, ``tile``, ``carveout``),
        ``setting`` (pad bytes, shape, or carve-out percent), ``smem_pad_bytes``,
        ``carveout``, ``compute_threads``, ``compute_regs``, ``compute_smem_bytes``,
        ``compute_blocks_per_sm``, ``compute_limiter``, ``compute_occupancy``,
        ``compute_sms`` (SMs the computation runs on), ``compute_waves``
        (ceil(grid / (blocks per SM x compute_sms)); null without a grid),
        ``comm_blocks_fit_per_sm``, ``fit_limiter``, ``meets_target``,
        ``residency_cost_blocks`` (computation blocks per SM lost against ``current``),
        ``occupancy_cost`` (occupancy points lost, 0..1), ``recommended``. For
        ``smem_pad`` only the smallest pad reaching each distinct residency is listed.
    """
    if int(k) < 1:
        raise ValueError(f"k must be at least 1, not {k!r}")
    rows = []
    cur = _evaluate(limits, [compute.threads], compute.regs, compute.smem, comm, carveout=carveout, grid=compute.grid)
    rows.append(_rows(cur, "current", ["as is"], compute, pads=[0], carve=[carveout]))

    unit = int(limits.get("shared_mem_alloc_unit") or limits.get("lds_alloc_unit") or 128)
    top = int(limits.get("shared_mem_per_block_optin") or limits["shared_mem_per_block"])
    pads = np.arange(unit, max(top - compute.smem, 0) + unit, unit, dtype=np.int64)
    if len(pads):
        ev = _evaluate(limits, np.full(len(pads), compute.threads), compute.regs, compute.smem + pads, comm,
                       carveout=carveout, grid=compute.grid)
        ev = ev.assign(pad=pads)
        ev = ev[ev["blocks_per_sm"] > 0]
        first = ev.drop_duplicates(subset=["blocks_per_sm"], keep="first")  # smallest pad per residency
        first = first[first["blocks_per_sm"] < cur["blocks_per_sm"].iloc[0]]
        rows.append(_rows(first, "smem_pad", [f"+{p} B" for p in first["pad"]], compute, pads=first["pad"].tolist(),
                          carve=[carveout] * len(first)))
        rows.append(_pad_with_carveout(limits, compute, comm, first, k))

    for alt in alternatives or []:
        ev = _evaluate(limits, [alt.threads], alt.regs, alt.smem, comm, carveout=carveout, grid=alt.grid or compute.grid)
        rows.append(_rows(ev, "tile", [alt.name or alt.describe()], alt, pads=[0], carve=[carveout]))

    if limits["vendor"] == "nvidia" and limits.get("carveouts_bytes"):
        for p in _carveout_percents(limits):
            ev = _evaluate(limits, [compute.threads], compute.regs, compute.smem, comm, carveout=p, grid=compute.grid)
            rows.append(_rows(ev, "carveout", [f"{p} %"], compute, pads=[0], carve=[p]))

    num_sms = limits.get("num_sms")
    sm_rows = None
    if comm.grid and num_sms:
        alone = occupancy_table(limits, [comm.threads], comm.regs, comm.smem)
        per_sm = int(alone["blocks_per_sm"].iloc[0])
        free = math.ceil(comm.grid / per_sm) if per_sm > 0 else None
        if free is not None and free < num_sms:
            sm_rows = _rows(cur.assign(comm_fit=per_sm, fit_limiter=alone["limiter"].iloc[0]), "sm_carveout",
                            [f"{free} SMs left to communication"], compute, pads=[0], carve=[None])
            sm_rows["compute_sms"] = num_sms - free
            rows.append(sm_rows)

    out = pd.concat([r for r in rows if len(r)], ignore_index=True)
    if "compute_sms" not in out:
        out["compute_sms"] = np.nan
    out["compute_sms"] = out["compute_sms"].fillna(num_sms if num_sms else np.nan).astype("Int64")
    base_blocks, base_occ = out.loc[0, "compute_blocks_per_sm"], out.loc[0, "compute_occupancy"]
    if compute.grid and num_sms:
        denom = out["compute_blocks_per_sm"].astype(float) * out["compute_sms"].astype(float).to_numpy()
        out["compute_waves"] = np.where(denom > 0, np.ceil(compute.grid / denom.where(denom > 0, 1.0)), np.nan)
    else:
        out["compute_waves"] = np.nan
    out["meets_target"] = (out["comm_blocks_fit_per_sm"] >= k) & (out["compute_blocks_per_sm"] > 0)
    out["residency_cost_blocks"] = base_blocks - out["compute_blocks_per_sm"]
    out["occupancy_cost"] = base_occ - out["compute_occupancy"]
    out["recommended"] = False
    for lever in ("smem_pad", "tile", "carveout", "sm_carveout"):
        cand = out[(out["lever"] == lever) & out["meets_target"]]
        if lever == "smem_pad":  # at one pad, no preference before one
            cand = cand.sort_values(["smem_pad_bytes", "carveout"], kind="stable", na_position="first")
        elif lever == "tile":
            cand = cand.sort_values(["residency_cost_blocks", "occupancy_cost"], kind="stable")
        elif lever == "carveout":
            cand = cand.sort_values(["residency_cost_blocks", "carveout"], kind="stable")
        if len(cand):
            out.loc[cand.index[0], "recommended"] = True
    if out.loc[0, "meets_target"]:
        out.loc[0, "recommended"] = True
    return out


def _carveout_percents(limits: dict) -> list[int]:
    """The smallest whole percent whose share of the SM rounds up to each carve-out step, ascending."""
    total = int(limits["shared_mem_per_sm"])
    return sorted({100 * c // total for c in limits.get("carveouts_bytes") or () if c <= total})


def _pad_with_carveout(limits: dict, compute: Footprint, comm: Footprint, padded: pd.DataFrame, k: int) -> pd.DataFrame:
    """Padded rows that the default carve-out alone keeps from meeting ``k``, with the smallest preference that does.

    The preference must keep the computation's residency (a smaller carve-out could lower
    it further); one evaluation per carve-out step, over all such pads at once.
    """
    short = padded[(padded["fit_limiter"] == "shared_memory_carveout") & (padded["comm_fit"] < k)]
    if short.empty or limits["vendor"] != "nvidia":
        return short.iloc[:0]
    pads = short["pad"].to_numpy(np.int64)
    percents = _carveout_percents(limits)
    evs = [
        _evaluate(limits, np.full(len(pads), compute.threads), compute.regs, compute.smem + pads, comm, carveout=p, grid=compute.grid)
        for p in percents  # one vectorized evaluation per carve-out step
    ]
    meets = np.vstack([(e["comm_fit"].to_numpy() >= k) & (e["resident"].to_numpy() == short["resident"].to_numpy()) for e in evs])
    keep = meets.any(axis=0)
    if not keep.any():
        return short.iloc[:0]
    which = meets.argmax(axis=0)[keep]  # the first (smallest) percent that meets the target
    rows = np.flatnonzero(keep)
    ev = pd.concat(evs, keys=range(len(evs))).loc[list(zip(which, rows))]
    chosen = np.asarray(percents)[which]
    return _rows(ev, "smem_pad", [f"+{q} B, carve-out {p} %" for q, p in zip(pads[keep], chosen)], compute,
                 pads=pads[keep].tolist(), carve=chosen.tolist())


def _rows(ev: pd.DataFrame, lever: str, settings, shape: Footprint, *, pads, carve) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "lever": lever,
            "setting": list(settings),
            "smem_pad_bytes": list(pads),
            "carveout": pd.array(carve, dtype="Int64"),
            "compute_threads": shape.threads,
            "compute_regs": shape.regs,
            "compute_smem_bytes": shape.smem + np.asarray(pads, np.int64),
            "compute_blocks_per_sm": ev["resident"].to_numpy(np.int64) if len(ev) else [],
            "compute_limiter": ev["limiter"].to_numpy(),
            "compute_occupancy": (ev["resident"] * ev["warps_per_block"] / ev["max_warps_per_sm"]).to_numpy(np.float64),
            "comm_blocks_fit_per_sm": ev["comm_fit"].to_numpy(np.int64),
            "fit_limiter": ev["fit_limiter"].to_numpy(),
        }
    )


def footprints_from_dataset(dataset_path: str | os.PathLike, pattern: str, *, run_id: str | None = None) -> tuple[list[Footprint], dict]:
    """The launch shapes of the kernels whose name matches ``pattern``, most total time first, and their device's limits.

    Parameters
    ----------
    pattern
        Case-insensitive regular expression searched in kernel names.
    run_id
        The run to look in (default: the dataset's only run; an error when it has several).

    Raises
    ------
    ValueError
        When no kernel matches, the pattern is not a regular expression, the run is
        ambiguous or unknown, or the shape or device limits are missing.
    """
    try:
        re.compile(pattern)
    except re.error as exc:
        raise ValueError(f"pattern {pattern!r} is not a regular expression: {exc}") from None
    runs = schema.read_frame(dataset_path, "runs")["run_id"].tolist()
    if run_id is None:
        if len(runs) != 1:
            raise ValueError(f"{dataset_path}: {len(runs)} runs; name one with --run ({', '.join(runs)})")
        run_id = runs[0]
    elif run_id not in runs:
        raise ValueError(f"{dataset_path}: no run {run_id!r} (runs: {', '.join(runs)})")
    cols = ["run_id", "rank", "device", "name", "is_host", "start_ns", "end_ns", "grid_x", "grid_y", "grid_z",
            "block_x", "block_y", "block_z", "regs_per_thread", "shared_mem_bytes"]
    k = schema.read_frame(dataset_path, "kernels", columns=cols, run_ids=[run_id])
    k = k[~k["is_host"].fillna(False) & k["name"].str.contains(pattern, case=False, regex=True, na=False)]
    if k.empty:
        raise ValueError(f"{dataset_path}: no kernel of run {run_id!r} matches {pattern!r}")
    k = kernel_shapes(k)
    k = k[k["threads_per_block"].notna() & k["regs_per_thread"].notna()]
    if k.empty:
        raise ValueError(f"{dataset_path}: kernels matching {pattern!r} have no block size or register count in the trace")
    first = k.iloc[0]
    limits = limits_for(device_table(dataset_path), run_id, int(first["rank"]), None if pd.isna(first["device"]) else int(first["device"]))
    if not isinstance(limits, dict):
        raise ValueError(f"{dataset_path}: device limits of run {run_id!r} unknown: {limits or 'no devices row'}")
    g = (
        k.assign(dur=k["end_ns"] - k["start_ns"], smem=k["shared_mem_bytes"].fillna(0))
        .groupby(["threads_per_block", "regs_per_thread", "smem"])
        .agg(total=("dur", "sum"), grid=("grid_blocks", "median"), name=("name", "first"))
        .reset_index()
        .sort_values("total", ascending=False, kind="stable")
    )
    shapes = [
        Footprint(int(r.threads_per_block), int(r.regs_per_thread), int(r.smem), None if pd.isna(r.grid) else int(r.grid), r.name)
        for r in g.itertuples(index=False)  # per distinct shape
    ]
    return shapes, limits
