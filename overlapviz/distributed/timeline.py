"""The timeline of a dataset too big for one process: raster counts summed over ranks (zoomed out), a time window's kernels (zoomed in)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from overlapviz import schema
from overlapviz.distributed.cluster import _key
from overlapviz.distributed.partitions import (
    _batches,
    _kernel_files,
    _rank_of_file,
    _read_file,
)

__all__ = ["KINDS", "timeline_counts_on", "timeline_window_on"]

KINDS = ("comm", "compute", "memory", "other")  # the raster's categories, in the timeline's order


def _extent_batch(root: str, where: str, rels: list[str]) -> tuple[set, tuple[int, int] | None]:
    """The ``(rank, stream)`` lanes of some kernels files, and their first start and last end."""
    lanes, span = set(), None
    for rel in rels:
        t = _read_file(root, rel, ["rank", "stream", "start_ns", "end_ns"], (), where)
        if not t.num_rows:
            continue
        pairs = pa.table({"r": t.column("rank").cast(pa.int64()), "s": pc.fill_null(t.column("stream"), -1)})
        u = pairs.group_by(["r", "s"]).aggregate([])
        lanes.update(zip(u.column("r").to_pylist(), u.column("s").to_pylist()))
        lo, hi = pc.min(t.column("start_ns")).as_py(), pc.max(t.column("end_ns")).as_py()
        span = (lo, hi) if span is None else (min(span[0], lo), max(span[1], hi))
    return lanes, span


def _counts_batch(root: str, where: str, rows: dict, n_rows: int, x0_ns: int, x1_ns: int, width: int,
                  rels: list[str]) -> tuple[int, np.ndarray]:  # fmt: skip
    """Raster counts of some kernels files: ``(first row, counts of the rows from it on that they touch)``."""
    parts = []
    window = (pc.field("end_ns") >= x0_ns) & (pc.field("start_ns") <= x1_ns)
    for rel in rels:
        t = _read_file(root, rel, ["rank", "stream", "kind", "start_ns", "end_ns"], ("kind",), where, filter=window)
        if not t.num_rows:
            continue
        rank = t.column("rank").to_numpy(zero_copy_only=False).astype(np.int64)
        stream = pc.fill_null(t.column("stream"), -1).to_numpy().astype(np.int64)
        pairs, inverse = np.unique(np.stack([rank, stream], axis=1), axis=0, return_inverse=True)
        row = np.array([rows[(int(r), int(s))] for r, s in pairs], np.int64)[inverse.ravel()]
        kind = t.column("kind").combine_chunks()
        names = kind.dictionary.to_pylist()
        code_of = np.array([KINDS.index(n) if n in KINDS else KINDS.index("other") for n in names] + [3], np.int64)
        cat = code_of[pc.fill_null(kind.indices, len(names)).to_numpy()]
        # offsets from the window's start in exact int64 first: epoch-scale ns lose digits in a double
        s = (t.column("start_ns").to_numpy() - x0_ns).astype(np.float64)
        e = (t.column("end_ns").to_numpy() - x0_ns).astype(np.float64)
        parts.append((row, cat, s, e))
    if not parts:
        return 0, np.zeros((len(KINDS), 0, width), np.int64)
    row, cat, s, e = (np.concatenate(x) for x in zip(*parts))
    r0 = int(row.min())  # the rows of the batch's ranks, consecutive
    n = int(row.max()) - r0 + 1
    return r0, _coverage(s, e, row - r0, cat, len(KINDS), n, width, 0.0, float(x1_ns - x0_ns))


def _coverage(s, e, lane, cat, n_cat, n_lanes, width, x0, x1) -> np.ndarray:
    """Counts of intervals covering each (category, lane, pixel column): the rule of
    ``figures_timeline._coverage``, here so workers need not import HoloViews."""
    scale = width / (x1 - x0)
    c0 = np.clip(np.floor((np.asarray(s) - x0) * scale), 0, width - 1).astype(np.int64)
    c1 = np.clip(np.floor((np.asarray(e) - x0) * scale), 0, width - 1).astype(np.int64)
    row = np.asarray(cat, np.int64) * n_lanes + np.asarray(lane, np.int64)
    size = n_cat * n_lanes * (width + 1)
    diff = np.bincount(row * (width + 1) + c0, minlength=size) - np.bincount(row * (width + 1) + c1 + 1, minlength=size)
    return np.cumsum(diff.reshape(n_cat, n_lanes, width + 1), axis=2)[:, :, :width]


def timeline_counts_on(client, dataset_path: str | os.PathLike, run_id: str, *, x_range_ns: tuple[int, int] | None = None,
                       width: int = 1100, height: int | None = None) -> tuple[list[tuple[int, int]], np.ndarray, tuple[int, int]]:  # fmt: skip
    """The zoomed-out timeline of one run, rasterized where its kernels are and summed on the client.

    Parameters
    ----------
    x_range_ns
        The window to rasterize (ns, the kernels' clock); the run's first start to last end
        when None.
    width
        Pixel columns.
    height
        Raster rows: None, one per lane; else at most this many, consecutive lanes summed
        into one row (thousands of ranks on one screen).

    Returns
    -------
    lanes
        ``(rank, stream)`` of each lane, sorted (a null stream is -1); lane ``i`` is in row
        ``i * n_rows // len(lanes)``.
    counts
        int64 array ``(len(KINDS), n_rows, width)``: how many kernels of each kind cover each
        pixel column of each row (``figures_timeline._shade`` colours it).
    x_range_ns
        The window rasterized.

    The client holds the raster and the lanes, whatever the number of kernels; each task
    sends the rows of its own ranks only.
    """
    files = sorted(_kernel_files(dataset_path, [run_id]), key=_rank_of_file)  # rank order: a batch's rows are consecutive
    root = os.path.abspath(dataset_path)
    batches = _batches(root, files, client)
    where = str(dataset_path)
    extents = client.gather([client.submit(_extent_batch, root, where, b, key=_key("ovz-extent")) for b in batches])
    lanes = sorted(set().union(*(lanes for lanes, _ in extents)))
    if x_range_ns is None:
        spans = [span for _, span in extents if span is not None]
        x_range_ns = (min(s[0] for s in spans), max(s[1] for s in spans)) if spans else (0, 1)
    x0, x1 = int(x_range_ns[0]), int(x_range_ns[1])
    x1 = max(x1, x0 + 1)
    n_rows = len(lanes) if height is None else max(1, min(int(height), len(lanes)))
    rows = {lane: i * n_rows // max(len(lanes), 1) for i, lane in enumerate(lanes)}
    [rows_f] = client.scatter([rows], broadcast=False)
    parts = [client.submit(_counts_batch, root, where, rows_f, n_rows, x0, x1, int(width), b, key=_key("ovz-raster"))
             for b in batches]  # fmt: skip
    total = np.zeros((len(KINDS), n_rows, int(width)), np.int64)
    from distributed import as_completed

    for fut in as_completed(parts, loop=client.loop):  # summed as they come
        r0, block = fut.result()
        total[:, r0 : r0 + block.shape[1], :] += block
    return lanes, total, (x0, x1)


def _window_batch(root: str, where: str, columns: list[str], x0_ns: int, x1_ns: int, rels: list[str]) -> pa.Table:
    window = (pc.field("end_ns") >= x0_ns) & (pc.field("start_ns") <= x1_ns)
    parts = [_read_file(root, rel, columns, (), where, filter=window) for rel in rels]
    return pa.concat_tables(parts)


def timeline_window_on(client, dataset_path: str | os.PathLike, run_id: str, x_range_ns: tuple[int, int], *,
                       ranks: Sequence[int] | None = None, columns: Sequence[str] | None = None) -> pa.Table:  # fmt: skip
    """The kernels of one run (of ``ranks``) that intersect ``x_range_ns``, for the zoomed-in glyphs.

    Each rank's file is read on a worker with the window as a filter (its row groups are
    sorted by ``start_ns``, so most are skipped); rows come back in run x rank file order,
    each rank's by start. Columns: ``figures_timeline.TIMELINE_COLUMNS`` by default.
    """
    files = _kernel_files(dataset_path, [run_id])
    if ranks is not None:
        wanted = {f"rank{int(r)}.parquet" for r in ranks}
        files = [f for f in files if Path(f).name in wanted]
    cols = list(columns) if columns is not None else [
        "run_id", "rank", "device", "stream", "correlation", "name", "kind", "start_ns", "end_ns", "grid_x", "grid_y",
        "grid_z", "block_x", "block_y", "block_z", "regs_per_thread", "shared_mem_bytes", "step"]  # fmt: skip
    target = pa.schema([schema.KERNELS.field(c) for c in cols])
    if not files:
        return target.empty_table()
    root = os.path.abspath(dataset_path)
    batches = _batches(root, files, client)
    futures = [client.submit(_window_batch, root, str(dataset_path), cols, int(x_range_ns[0]), int(x_range_ns[1]), b,
                             key=_key("ovz-window")) for b in batches]  # fmt: skip
    return pa.concat_tables(client.gather(futures))
