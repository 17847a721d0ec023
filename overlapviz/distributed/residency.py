"""Kernel residency on a Dask cluster, rank by rank, with ``residency.kernel_residency``'s table.

Residency per kernel launch shape depends only on the kernels of one run x rank x device, that
rank's device limits (or ``--device-name``'s) and its run's carve-out preference
(``residency.rank_shapes``): each task computes it for whole ranks. The one step that crosses
ranks is ``residency.merge_shapes``: the rows of a run's ranks with the same device name, arch,
kernel and launch shape become one (launches and time summed, the first rank's non-null
occupancy, the median of the ranks' median grids). It is reduced over the batches on the
workers as a tree, in dataset order, so that "first" is the same rank as the local path's; a
median of medians is not a function of partial medians, so the partials carry each merged row's
ranks' medians as a histogram (value, count), and the median is taken from it at the end (the
same two middle values, the same ``(a + b) / 2``). The client receives one row per merged shape.
"""

from __future__ import annotations

import os

import numpy as np
import pandas as pd
import pyarrow as pa

from overlapviz.dataset import schema
from overlapviz.analysis.rankwise import check_rank
from overlapviz.distributed.analysis import rank_items
from overlapviz.distributed.cluster import gather_in_order
from overlapviz.distributed.partitions import kernel_files, plan_batches, read_file
from overlapviz.ingest.files import display

__all__ = ["residency_on"]


def _shapes_batch(root: str, where: str, items: list[tuple]):
    """``residency.rank_shapes`` of the ranks of ``items`` (``(file, run_id, rank, limits, carve-outs)``), as one partial.

    One call over the batch's kernels stacked in dataset order: ``rank_shapes`` works per run x rank x
    device, so its rows are each rank's, in the same order (each rank lies in one file).
    """
    from overlapviz.analysis import residency

    tables, dev_limits, carveouts = [], {}, {}
    for rel, run_id, rank, limits, carveout in items:
        t = read_file(root, rel, residency.KERNEL_COLUMNS, (), where)
        if t.num_rows:
            check_rank(t, rel, run_id, rank, where)
        tables.append(t)
        dev_limits |= limits  # each rank's own keys (and --device-name's, the same in every item)
        carveouts |= carveout
    kernels = tables[0] if len(tables) == 1 else pa.concat_tables(tables)
    return _partial(residency.rank_shapes(kernels.to_pandas(types_mapper=schema.nullable_dtype), dev_limits, carveouts))


def _concat(frames: list[pd.DataFrame]) -> pd.DataFrame:
    """``frames`` stacked with the column types one frame of all their rows gets: pandas infers a text column's type
    from its values when it is made (``str`` where any is a string, ``object`` where all are None), so a part whose
    ranks had no limits (``limiter`` all None) and one that had them stack into the type of the whole."""
    out = pd.concat(frames, ignore_index=True)
    mixed = [c for c in out.columns if out[c].dtype == object]
    return out.assign(**{c: out[c].to_numpy(object) for c in mixed}) if mixed else out


def _partial(shapes: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``residency.merge_shapes`` of some ranks' rows without its median: ``(rows, medians)``, ``medians`` being the
    ranks' non-null median grids per row (``row``, ``value``, ``count``)."""
    from overlapviz.analysis import residency

    keys = residency.MERGE_KEYS
    grouped = shapes.groupby(keys, dropna=False, sort=False)
    rows = grouped.agg(**{c: (c, "first") for c in residency.MERGE_FIRST}, n_launches=("n_launches", "sum"),
                       total_ns=("total_ns", "sum")).reset_index()  # fmt: skip
    row = grouped.ngroup().to_numpy(np.int64)  # numbered in order of first appearance, as the rows above
    value = shapes["grid_blocks_median"].astype("Float64")
    ok = value.notna().to_numpy()
    medians = pd.DataFrame({"row": row[ok], "value": value.to_numpy(np.float64, na_value=np.nan)[ok], "count": np.ones(int(ok.sum()), np.int64)})
    return rows, _count(medians)


def _count(medians: pd.DataFrame) -> pd.DataFrame:
    return medians.groupby(["row", "value"], sort=False)["count"].sum().reset_index()


def _merge(*partials):
    """Partials of consecutive batches (in dataset order) merged into one, as if their ranks were one batch."""
    from overlapviz.analysis import residency

    full = [p for p in partials if p is not None and len(p[0])]
    if len(full) <= 1:
        return full[0] if full else next(p for p in partials if p is not None)
    rows = _concat([p[0] for p in full])
    grouped = rows.groupby(residency.MERGE_KEYS, dropna=False, sort=False)
    new = grouped.ngroup().to_numpy(np.int64)  # each partial row's row in the merge
    offsets = np.cumsum([0] + [len(p[0]) for p in full[:-1]])
    medians = pd.concat([p[1].assign(row=new[p[1]["row"].to_numpy(np.int64) + off]) for p, off in zip(full, offsets)],
                        ignore_index=True)  # fmt: skip
    merged = grouped.agg(**{c: (c, "first") for c in residency.MERGE_FIRST}, n_launches=("n_launches", "sum"),
                         total_ns=("total_ns", "sum")).reset_index()  # fmt: skip
    return merged, _count(medians)


def median_of_counts(row: np.ndarray, value: np.ndarray, count: np.ndarray, n_rows: int) -> np.ndarray:
    """Per row ``0..n_rows-1``, the median of its values repeated ``count`` times (NaN for none), as pandas' groupby
    median computes it: the middle value, or ``(lower + upper) / 2`` of the two middle ones."""
    out = np.full(n_rows, np.nan)
    if not len(row):
        return out
    order = np.lexsort((value, row))
    row, value, count = row[order], value[order], count[order]
    ends = np.cumsum(count)  # values of sorted (row, value) pairs occupy [ends - count, ends)
    n = np.bincount(row, weights=count, minlength=n_rows).astype(np.int64)
    base = np.concatenate([[0], np.cumsum(n)[:-1]])
    has = n > 0
    lo = value[np.searchsorted(ends, (base + (n - 1) // 2)[has], side="right")]
    hi = value[np.searchsorted(ends, (base + n // 2)[has], side="right")]
    out[has] = np.where(n[has] % 2 == 1, lo, (lo + hi) / 2)
    return out


def _finish(partial) -> pd.DataFrame:
    """The merged partial as ``residency.merge_shapes`` returns it (its columns and order)."""
    rows, medians = partial
    grid = median_of_counts(medians["row"].to_numpy(np.int64), medians["value"].to_numpy(np.float64),
                            medians["count"].to_numpy(np.int64), len(rows))  # fmt: skip
    out = rows.assign(grid_blocks_median=pd.array(grid, dtype="Float64"))
    out["grid_blocks_median"] = out["grid_blocks_median"].mask(np.isnan(grid))  # NaN: no rank had a grid (NA, as pandas')
    order = ["blocks_per_sm", "limiter", "occupancy", "smem_config_bytes", "n_launches", "total_ns", "grid_blocks_median",
             "num_sms", "residency_note"]  # fmt: skip
    from overlapviz.analysis import residency

    return out[residency.MERGE_KEYS + order]


def residency_on(client, dataset_path: str | os.PathLike, *, run_ids=None, device: str | None = None,
                 progress: bool | None = False) -> pd.DataFrame:  # fmt: skip
    """``residency.kernel_residency`` computed rank by rank on the cluster; the same frame.

    ``device`` names the GPU for ranks whose trace does not say (``--device-name``), as the local
    path's. Each task reads whole ranks' kernels files and computes ``residency.rank_shapes``; the
    merge over ranks runs on the workers as a tree of partials; the client receives one row per
    merged shape and finishes it (waves, carve-out note, order) as the local path does.

    Raises
    ------
    ValueError
        As ``residency.kernel_residency`` (a ``device`` no GPU has, a kernels file that cannot be read, naming it).
    """
    from overlapviz.analysis import residency

    files = kernel_files(dataset_path, run_ids)
    if not files:
        return residency.kernel_residency(dataset_path, run_ids=run_ids, device=device)  # nothing to spread
    items = rank_items(dataset_path, files, device)
    carveouts = residency.run_carveouts(dataset_path)
    root, batches, prefix = plan_batches(client, dataset_path, items, "residency")
    merged = []

    def submit():
        parts = [client.submit(_shapes_batch, root, str(dataset_path), b, key=f"{prefix}-{i}", retries=0)
                 for i, b in enumerate(batches)]  # fmt: skip
        level, tree = 0, list(parts)
        while len(tree) > 1:  # consecutive partials merged in order: no one task (nor the client) takes every rank's rows
            level += 1
            tree = [client.submit(_merge, *tree[i : i + 8], key=f"{prefix}-merge{level}-{i}") for i in range(0, len(tree), 8)]
        merged.append(tree[0])
        # each batch's end (nothing of it comes here), in file order: the first bad file is the one the local path meets
        return [client.submit(_nothing, p, key=f"{prefix}-done-{i}") for i, p in enumerate(parts)]

    gather_in_order(client, submit, progress=progress, desc="residency",
                    what=lambda i: display(os.path.join(str(dataset_path), batches[i][0][0])))  # fmt: skip
    total = merged.pop().result()
    return residency.finish_shapes(_finish(total), carveouts)


def _nothing(_partial) -> None:
    return None
