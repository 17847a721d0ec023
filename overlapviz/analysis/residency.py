"""Residency of a dataset's kernels: device limits per run, carve-out preferences, and one row per kernel launch shape with its occupancy (rules in :mod:`overlapviz.analysis.occupancy`)."""

from __future__ import annotations

import json
from collections.abc import Callable

import numpy as np
import pandas as pd

from overlapviz.dataset import schema
from overlapviz.domain.devices import device_limits
from overlapviz.analysis.occupancy import kernel_occupancy, limits_for

# --- datasets -------------------------------------------------------------------------

SHAPE_KEYS = ["threads_per_block", "regs_per_thread", "shared_mem_bytes", "sgprs", "accum_vgprs", "wave_size"]


def device_table(dataset_path, device: str | None = None) -> dict:
    """Completed limits for every ``(run_id, rank, device)`` of a dataset's devices table.

    Parameters
    ----------
    device
        The GPU the traces ran on, for ranks whose trace does not say (HTA traces, rocprof v1
        without agent info): a product name (``NVIDIA A100-SXM4-80GB``, ``MI300X``) or an
        architecture (``sm_90``, ``gfx942``). It fills ranks with no devices row or whose row
        names no known architecture; rows that do are kept.

    Returns
    -------
    dict
        ``{(run_id, rank, device): limits}``; a row whose architecture cannot be found maps
        to the ``ValueError`` message (a str), so callers can say why a kernel has no
        residency. With ``device``, ``ANY_RANK`` maps to its limits.

    Raises
    ------
    ValueError
        When ``device`` names no known GPU or architecture.
    """
    devices = schema.read_frame(dataset_path, "devices")
    out = {}
    for rec in devices.to_dict("records"):  # one row per device, not per event
        key = (rec["run_id"], int(rec["rank"]), None if pd.isna(rec["device"]) else int(rec["device"]))
        try:
            out[key] = device_limits(rec)
        except ValueError as exc:
            out[key] = str(exc)
    if device:
        given = device_override(device)
        out = {k: (given if isinstance(v, str) else v) for k, v in out.items()}
        out[ANY_RANK] = given
    return out


ANY_RANK = ("*", -1, None)  # device_table's key for the limits that --device-name gives every rank


def device_override(device: str) -> dict:
    """The limits of a GPU named by product (``NVIDIA H100 80GB HBM3``, ``MI250X``) or arch (``sm_80``, ``gfx90a``).

    Raises
    ------
    ValueError
        Naming ``device`` when neither its name nor an architecture is known.
    """
    text = str(device).strip()
    row = {"arch": text} if text.lower().startswith(("sm_", "gfx")) else {"name": text}
    try:
        return device_limits(row) | {"name": text}
    except ValueError:
        raise ValueError(f"--device-name {text!r}: not a GPU overlapviz knows (give a product name such as "
                         f"'NVIDIA A100-SXM4-80GB' or an architecture such as sm_80 or gfx942)") from None


UNKNOWN_CARVEOUT_NOTE = "carve-out preference unknown (imported trace): no preference assumed"


def _carveout_entry(config_json) -> tuple[int | None, str, frozenset]:
    unknown = (None, UNKNOWN_CARVEOUT_NOTE, frozenset())
    if not isinstance(config_json, str) or not config_json:
        return unknown
    try:
        doc = json.loads(config_json)
    except ValueError:
        return unknown
    config = doc.get("config") if isinstance(doc, dict) else None
    if not isinstance(config, dict) or "smem_carveout_percent" not in config:
        return unknown
    value = config["smem_carveout_percent"]
    if value is None or int(value) < 0:
        return None, "no carve-out preference (run config): the driver's default", frozenset()
    effective = doc.get("effective") or {}
    if not effective.get("smem_carveout_applied"):
        return None, f"carve-out preference {int(value)} % requested but not applied (run config): the driver's default", frozenset()
    # the collector sets it on its own tiled GEMM and on the stand-in (collectors/workload.py), never on library kernels
    facts = effective.get("kernels") or {}
    names = set()
    if config.get("compute_impl") == "tiled" and (facts.get("gemm") or {}).get("name"):
        names.add(facts["gemm"]["name"])
    if config.get("backend") == "stand-in" and (facts.get("comm") or {}).get("name"):
        names.add(facts["comm"]["name"])
    if not names:
        return None, f"carve-out preference {int(value)} % applied to kernels the manifest does not name: the driver's default assumed", frozenset()
    return int(value), f"preferred carve-out {int(value)} % on {', '.join(sorted(names))} (run config)", frozenset(names)


def run_carveouts(dataset_path) -> dict:
    """The shared-memory carve-out preference of each run, from its manifest.

    Collected runs record ``config.smem_carveout_percent`` in ``runs.config_json`` (null:
    no preference, the driver's default) and, under ``effective``, whether it was applied
    and to which of the collector's kernels (its tiled GEMM, the stand-in); imported traces
    do not say, and no preference is assumed.

    Returns
    -------
    dict
        ``{run_id: (percent or None, note, kernel names)}``: the preference, a sentence
        saying where it came from, and the names of the kernels it applies to (other
        kernels of the run have none).
    """
    runs = schema.read_frame(dataset_path, "runs")
    if "config_json" not in runs:
        return {r: (None, UNKNOWN_CARVEOUT_NOTE, frozenset()) for r in runs["run_id"]}
    return {r: _carveout_entry(c) for r, c in zip(runs["run_id"], runs["config_json"])}  # one per run


def kernel_shapes(kernels: pd.DataFrame) -> pd.DataFrame:
    """``kernels`` with ``threads_per_block`` and ``grid_blocks`` (null where the trace lacks them)."""
    k = kernels
    threads = k["block_x"].astype("Int64") * k["block_y"].fillna(1).astype("Int64") * k["block_z"].fillna(1).astype("Int64")
    grid = k["grid_x"].astype("Int64") * k["grid_y"].fillna(1).astype("Int64") * k["grid_z"].fillna(1).astype("Int64")
    return k.assign(threads_per_block=threads, grid_blocks=grid)


def attach_occupancy(kernels: pd.DataFrame, dev_limits: dict, *, prefix: str = "", carveouts: dict | None = None) -> pd.DataFrame:
    """Add occupancy columns to a kernels frame (with ``threads_per_block``), per device.

    :func:`overlapviz.analysis.occupancy.kernel_occupancy`'s ``blocks_per_sm`` (Int64),
    ``limiter``, ``occupancy``, ``smem_config_bytes`` (Int64) and ``residency_note``, each
    name after ``prefix``. ``carveouts`` maps run ids to their carve-out preference
    (:func:`run_carveouts`; missing: none).
    """
    occ = kernel_occupancy(kernels, dev_limits, carveouts)
    return kernels.assign(
        **{
            f"{prefix}blocks_per_sm": pd.array(occ["blocks_per_sm"].to_numpy(), dtype="Float64").astype("Int64"),
            f"{prefix}limiter": occ["limiter"].to_numpy(object),
            f"{prefix}occupancy": occ["occupancy"].to_numpy(np.float64),
            f"{prefix}smem_config_bytes": pd.array(occ["smem_config_bytes"].to_numpy(), dtype="Float64").astype("Int64"),
            f"{prefix}residency_note": occ["residency_note"].to_numpy(object),
        }
    )


# what kernel_residency reads of the kernels table
KERNEL_COLUMNS = ["run_id", "rank", "device", "name", "kind", "is_host", "start_ns", "end_ns", "grid_x", "grid_y", "grid_z",
                  "block_x", "block_y", "block_z", "regs_per_thread", "shared_mem_bytes", "sgprs", "accum_vgprs"]  # fmt: skip
_ENCODED = ("run_id", "name", "kind")  # string columns kernel_residency reads dictionary-encoded
# one residency row merges the ranks of a run whose kernel shows this launch shape on a device of this name and arch
MERGE_KEYS = ["run_id", "device_name", "arch", "name", "kind", "threads_per_block", "regs_per_thread", "shared_mem_bytes"]
# per merged row, the first non-null value over its ranks (in dataset order) of each
MERGE_FIRST = ["blocks_per_sm", "limiter", "occupancy", "smem_config_bytes", "num_sms", "residency_note"]


def rank_shapes(kernels: pd.DataFrame, dev_limits: dict, carveouts: dict) -> pd.DataFrame:
    """Per ``(run_id, rank, device)`` x name x kind x launch shape of ``kernels``: the occupancy of that rank's device.

    The part of :func:`kernel_residency` that looks at kernels: each row depends only on the kernels of
    one run x rank x device, that rank's own limits in ``dev_limits`` (:func:`device_table`; with
    ``ANY_RANK`` for ``--device-name``) and its run's carve-out (:func:`run_carveouts`), so it can be
    computed one rank at a time (``overlapviz.distributed.residency_on``): the rows of several ranks
    concatenated in dataset order are the rows of all of them at once.

    Returns
    -------
    pandas.DataFrame
        ``run_id, rank, device, name, kind, threads_per_block, regs_per_thread, shared_mem_bytes,
        sgprs, accum_vgprs, n_launches, total_ns, grid_blocks_median``, the occupancy columns of
        :func:`attach_occupancy` and ``device_name, arch, num_sms``; groups in order of first
        appearance. Host activities and memcpy/memset are left out.
    """
    k = kernels[(~kernels["is_host"].fillna(False)) & kernels["kind"].isin(["compute", "comm", "other"])]
    k = kernel_shapes(k)
    keys = ["run_id", "rank", "device", "name", "kind", "threads_per_block", "regs_per_thread", "shared_mem_bytes", "sgprs", "accum_vgprs"]
    g = (
        k.assign(dur_ns=k["end_ns"] - k["start_ns"])
        .groupby(keys, dropna=False, sort=False, observed=True)
        .agg(n_launches=("dur_ns", "size"), total_ns=("dur_ns", "sum"), grid_blocks_median=("grid_blocks", "median"))
        .reset_index()
    )
    for c in _ENCODED:
        if isinstance(g[c].dtype, pd.CategoricalDtype):  # read dictionary-encoded (kernel_residency): strings again
            g[c] = g[c].astype(g[c].cat.categories.dtype)
    g = attach_occupancy(g, dev_limits, carveouts=carveouts)
    lims = _limits_of(g, dev_limits)  # per distinct shape
    return g.assign(device_name=[lim.get("name") for lim in lims], arch=[lim.get("arch") for lim in lims],
                    num_sms=pd.array([lim.get("num_sms") for lim in lims], dtype="Int64"))


def _limits_of(frame: pd.DataFrame, dev_limits: dict) -> list[dict]:
    """The device limits of each row of ``frame`` (``run_id, rank, device``) in ``device_table``'s dict; {} where unknown."""
    out = []
    for rec in frame[["run_id", "rank", "device"]].itertuples(index=False):
        lim = limits_for(dev_limits, rec.run_id, int(rec.rank), None if pd.isna(rec.device) else int(rec.device))
        out.append(lim if isinstance(lim, dict) else {})
    return out


def merge_shapes(shapes: pd.DataFrame) -> pd.DataFrame:
    """:func:`rank_shapes` rows merged over the ranks of each run (``MERGE_KEYS``): the one step that crosses ranks.

    Launches and time add up; ``MERGE_FIRST`` takes the first rank's non-null value; the median grid
    is the median of the ranks' medians.
    """
    return (
        shapes.groupby(MERGE_KEYS, dropna=False, sort=False)
        .agg(
            blocks_per_sm=("blocks_per_sm", "first"),
            limiter=("limiter", "first"),
            occupancy=("occupancy", "first"),
            smem_config_bytes=("smem_config_bytes", "first"),
            n_launches=("n_launches", "sum"),
            total_ns=("total_ns", "sum"),
            grid_blocks_median=("grid_blocks_median", "median"),
            num_sms=("num_sms", "first"),
            residency_note=("residency_note", "first"),
        )
        .reset_index()
    )


RESIDENCY_COLUMNS = ["run_id", "device_name", "arch", "name", "kind", "threads_per_block", "regs_per_thread", "shared_mem_bytes",
                     "blocks_per_sm", "limiter", "occupancy", "n_launches", "total_us", "grid_blocks_median", "waves",
                     "smem_config_bytes", "carveout_note", "residency_note"]  # fmt: skip


def finish_shapes(out: pd.DataFrame, carveouts: dict) -> pd.DataFrame:
    """:func:`merge_shapes`' rows as :func:`kernel_residency` returns them: waves, carve-out note, µs, sorted."""
    denom = out["blocks_per_sm"].astype("Float64") * out["num_sms"].astype("Float64")
    waves = out["grid_blocks_median"].astype("Float64") / denom.where(denom > 0)
    vendor_nv = out["arch"].astype(str).str.startswith("sm_").to_numpy()
    notes = out["run_id"].map({r: v[1] for r, v in carveouts.items()}).fillna(UNKNOWN_CARVEOUT_NOTE)
    carve_note = np.where(vendor_nv, notes.to_numpy(object), None)
    out = out.assign(total_us=out["total_ns"] / 1000.0, waves=waves, carveout_note=carve_note).drop(columns=["total_ns", "num_sms"])
    return out[RESIDENCY_COLUMNS].sort_values(["run_id", "total_us"], ascending=[True, False], kind="stable").reset_index(drop=True)


def kernel_residency(dataset_path, *, run_ids=None, device: str | None = None, pause: Callable[[], None] | None = None) -> pd.DataFrame:
    """One row per distinct kernel launch shape in a dataset, with its residency.

    Parameters
    ----------
    dataset_path
        An overlapviz dataset directory.
    run_ids
        Only these runs (all by default).

    Returns
    -------
    pandas.DataFrame
        Columns ``run_id, device_name, arch, name, kind, threads_per_block,
        regs_per_thread, shared_mem_bytes, blocks_per_sm, limiter, occupancy,
        n_launches, total_us, grid_blocks_median, waves`` (grid blocks over
        ``blocks_per_sm * num_sms``: how many full rounds the grid needs),
        ``smem_config_bytes`` (NVIDIA: the shared memory the driver configures the SM
        with for this kernel, under the run's carve-out preference; AMD: the CU's LDS),
        ``carveout_note`` (NVIDIA: where the preference came from; null on AMD, which has
        no carve-out) and ``residency_note``, sorted by ``total_us`` descending. Host activities and
        memcpy/memset are left out. ``blocks_per_sm`` is null where the trace lacks the
        launch shape or the device's limits (``residency_note`` says which).

    Only :func:`merge_shapes` looks across ranks; ``overlapviz.distributed.residency_on`` computes
    :func:`rank_shapes` per rank on a Dask cluster and merges them there, with this result. With
    ``pause`` (called before reading and before each rank: a host computing this in the background waits there while it
    draws a page) :func:`rank_shapes` runs one rank at a time, with the same result.
    """
    if pause is not None:
        pause()
    # names dictionary-encoded (categoricals): no string per kernel is built or hashed (0.8 -> 0.4 s for a million)
    k = schema.read_frame(dataset_path, "kernels", columns=KERNEL_COLUMNS, run_ids=run_ids, dictionary=_ENCODED)
    dev_limits = device_table(dataset_path, device)
    carveouts = run_carveouts(dataset_path)
    blocks = _rank_blocks(k) if pause is not None else None
    if blocks is None:
        shapes = rank_shapes(k, dev_limits, carveouts)
    else:
        parts = []
        for a, b in blocks:
            pause()
            parts.append(rank_shapes(k.iloc[a:b], dev_limits, carveouts))
        shapes = pd.concat(parts, ignore_index=True)
    return finish_shapes(merge_shapes(shapes), carveouts)


def by_rank(residency: pd.DataFrame | None, dataset_path, device: str | None = None) -> pd.DataFrame | None:
    """:func:`kernel_residency`'s rows as a rank's kernels look theirs up (a hover's "N blocks/SM").

    Unchanged where every run ran on one GPU model. Where one did not (its ranks on two models: a launch shape has a
    residency per model, and the merged rows name the model, not the ranks), every row of every run is repeated for
    each rank that ran on its model, with a ``rank`` column: a rank finds its own GPU's row. A rank whose device is
    unknown finds the rows of no model (their note says why). ``device``: as for :func:`kernel_residency`.
    """
    if residency is None or not len(residency) or "device_name" not in residency:
        return residency
    models = residency.groupby("run_id", sort=False, dropna=False)["device_name"].nunique(dropna=False)
    if not (models > 1).any():
        return residency
    pairs = schema.read_frame(dataset_path, "kernels", columns=["run_id", "rank", "device"],
                              run_ids=residency["run_id"].dropna().unique().tolist()).drop_duplicates()  # fmt: skip
    names = pd.Series([lim.get("name") for lim in _limits_of(pairs, device_table(dataset_path, device))], index=pairs.index, dtype=object)
    ranks = (pairs.assign(device_name=names)[["run_id", "rank", "device_name"]]
             .drop_duplicates(["run_id", "rank"]))  # (a rank on two devices of two models: its first)
    return residency.merge(ranks, on=["run_id", "device_name"], how="inner", sort=False)


PAUSE_ROWS = 200_000  # with ``pause``: kernels per call of rank_shapes (whole ranks; a call per small rank costs 4x)


def _rank_blocks(k: pd.DataFrame) -> list[tuple[int, int]] | None:
    """``[start, end)`` row ranges of ``k`` in dataset order, each whole ranks of ``PAUSE_ROWS`` kernels or more (the last
    fewer); None unless each run x rank is one contiguous block (the dataset stores one file per run x rank), where
    :func:`rank_shapes` of the blocks concatenated is :func:`rank_shapes` of ``k``."""
    rows = PAUSE_ROWS
    if len(k) < 2:
        return None
    run = pd.factorize(k["run_id"])[0].astype(np.int64)
    rank = k["rank"].to_numpy(np.int64, na_value=-1)
    change = np.flatnonzero((run[1:] != run[:-1]) | (rank[1:] != rank[:-1])) + 1
    lo, hi = np.r_[0, change], np.r_[change, len(k)]
    if len(set(zip(run[lo].tolist(), rank[lo].tolist()))) != len(lo):
        return None
    out, start = [], 0
    for end in hi.tolist():
        if end - start >= rows or end == len(k):
            out.append((start, end))
            start = end
    return out
