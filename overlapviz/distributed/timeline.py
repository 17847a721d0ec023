"""The timeline of a dataset too big for one process: raster counts summed over ranks (zoomed out), a time window's kernels (zoomed in)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from overlapviz.dataset import schema
from overlapviz.figures.raster import coverage as _coverage  # the figure's own rule, no HoloViews import
from overlapviz.distributed.cluster import task_key
from overlapviz.distributed.partitions import (
    file_batches,
    kernel_files,
    rank_of_file,
    read_file,
)

__all__ = ["KINDS", "timeline_counts_on", "timeline_window_on"]

KINDS = ("comm", "compute", "memory", "other")  # the raster's categories, in the timeline's order


def _extent_batch(root: str, where: str, rels: list[str]) -> tuple[set, tuple[int, int] | None]:
    """The ``(rank, stream)`` lanes of some kernels files, and their first start and last end."""
    lanes, span = set(), None
    for rel in rels:
        t = read_file(root, rel, ["rank", "stream", "start_ns", "end_ns"], (), where)
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
        t = read_file(root, rel, ["rank", "stream", "kind", "start_ns", "end_ns"], ("kind",), where, filter=window)
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
        pixel column of each row (``figures.timeline.shade`` colours it).
    x_range_ns
        The window rasterized.

    The client holds the raster and the lanes, whatever the number of kernels; each task
    sends the rows of its own ranks only.
    """
    files = sorted(kernel_files(dataset_path, [run_id]), key=rank_of_file)  # rank order: a batch's rows are consecutive
    root = os.path.abspath(dataset_path)
    batches = file_batches(root, files, client)
    where = str(dataset_path)
    extents = client.gather([client.submit(_extent_batch, root, where, b, key=task_key("ovz-extent")) for b in batches])
    lanes = sorted(set().union(*(lanes for lanes, _ in extents)))
    if x_range_ns is None:
        spans = [span for _, span in extents if span is not None]
        x_range_ns = (min(s[0] for s in spans), max(s[1] for s in spans)) if spans else (0, 1)
    x0, x1 = int(x_range_ns[0]), int(x_range_ns[1])
    x1 = max(x1, x0 + 1)
    n_rows = len(lanes) if height is None else max(1, min(int(height), len(lanes)))
    rows = {lane: i * n_rows // max(len(lanes), 1) for i, lane in enumerate(lanes)}
    [rows_f] = client.scatter([rows], broadcast=False, hash=False)  # a key per call, as in view_counts_on
    parts = [client.submit(_counts_batch, root, where, rows_f, n_rows, x0, x1, int(width), b, key=task_key("ovz-raster"))
             for b in batches]  # fmt: skip
    total = np.zeros((len(KINDS), n_rows, int(width)), np.int64)
    from distributed import as_completed

    for fut in as_completed(parts, loop=client.loop):  # summed as they come
        r0, block = fut.result()
        total[:, r0 : r0 + block.shape[1], :] += block
    return lanes, total, (x0, x1)


def _window_batch(root: str, where: str, columns: list[str], x0_ns: int, x1_ns: int, rels: list[str]) -> pa.Table:
    window = (pc.field("end_ns") >= x0_ns) & (pc.field("start_ns") <= x1_ns)
    parts = [read_file(root, rel, columns, (), where, filter=window) for rel in rels]
    return pa.concat_tables(parts)


def timeline_window_on(client, dataset_path: str | os.PathLike, run_id: str, x_range_ns: tuple[int, int], *,
                       ranks: Sequence[int] | None = None, columns: Sequence[str] | None = None) -> pa.Table:  # fmt: skip
    """The kernels of one run (of ``ranks``) that intersect ``x_range_ns``, for the zoomed-in glyphs.

    Each rank's file is read on a worker with the window as a filter (its row groups are
    sorted by ``start_ns``, so most are skipped); rows come back in run x rank file order,
    each rank's by start. Columns: ``figures_timeline.TIMELINE_COLUMNS`` by default.
    """
    files = kernel_files(dataset_path, [run_id])
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
    batches = file_batches(root, files, client)
    futures = [client.submit(_window_batch, root, str(dataset_path), cols, int(x_range_ns[0]), int(x_range_ns[1]), b,
                             key=task_key("ovz-window")) for b in batches]  # fmt: skip
    return pa.concat_tables(client.gather(futures))


# --- the dashboard's timeline, by its own rules (figures_timeline.TimelineData), for runs the server cannot hold ---
# Times there are float ms since the run's first start (``(start_ns - origin_ns) / 1e6``); these tasks compute
# them the same way, element by element, so masks, pixel columns and counts are the local path's exactly. The
# files are first cut in int64 ns with a margin (the kernels a window can touch, and a few more), then the
# window's own rule is applied in ms.

_MARGIN_NS = 1_000  # a float ms offset is exact to far below 1 µs for any run shorter than a century


def ns_bounds(origin_ns: int, lo_ms: float, hi_ms: float) -> tuple[int, int]:
    """Int64 ns bounds around ``[lo_ms, hi_ms]`` (ms since ``origin_ns``) that hold every kernel the ms rule keeps."""
    def ns(v: float, side: int) -> int:
        v = float(v)
        if not np.isfinite(v):
            return side * (1 << 62)
        return int(origin_ns) + int(np.floor(v * 1e6) if side < 0 else np.ceil(v * 1e6)) + side * (_MARGIN_NS + int(abs(v) * 1e-3))

    return ns(lo_ms, -1), ns(hi_ms, 1)


def _ms_of(col, origin_ns: int) -> np.ndarray:
    return (col.to_numpy().astype(np.int64) - int(origin_ns)) / 1e6  # figures.timeline.ms_from, the same operations


def _rank_summary_batch(root: str, where: str, kinds: tuple, rels: list[str]) -> list[dict]:
    """Per kernels file (one run x rank): its lanes, kernels, first start, last end, kernels per kind, and per
    step its first start and last end (the step bands), with the streams of the kernels that have a step."""
    out = []
    for rel in rels:
        t = read_file(root, rel, ["rank", "stream", "kind", "start_ns", "end_ns", "step"], ("kind",), where)
        if not t.num_rows:
            continue
        ranks = pc.unique(t.column("rank")).to_pylist()
        if len(ranks) != 1 or ranks[0] is None:
            raise ValueError(f"{where}: kernels file {rel} holds ranks {ranks}, not one")
        stream = pc.fill_null(t.column("stream"), -1).to_numpy().astype(np.int64)
        start, end = t.column("start_ns").to_numpy().astype(np.int64), t.column("end_ns").to_numpy().astype(np.int64)
        step = t.column("step")
        has = pc.is_valid(step).to_numpy(zero_copy_only=False)
        steps = {}
        if has.any():
            sv = pc.fill_null(step, 0).to_numpy().astype(np.int64)[has]
            u, inv = np.unique(sv, return_inverse=True)
            lo = np.full(len(u), np.iinfo(np.int64).max)
            hi = np.full(len(u), np.iinfo(np.int64).min)
            np.minimum.at(lo, inv, start[has])
            np.maximum.at(hi, inv, end[has])
            steps = {"step": u, "lo": lo, "hi": hi}
        out.append({"rank": int(ranks[0]), "streams": np.unique(stream).tolist(), "n": t.num_rows,
                    "start": int(start.min()), "end": int(end.max()), "kinds": _kind_counts(t.column("kind"), kinds),
                    "steps": steps, "step_streams": np.unique(stream[has]).tolist()})  # fmt: skip
    return out


def _kind_codes(kind: pa.ChunkedArray, kinds: tuple) -> np.ndarray:
    """Each row's index in ``kinds`` (an unknown or null kind is ``other``), as ``figures_timeline._kind_codes``."""
    kind = kind.combine_chunks() if isinstance(kind, pa.ChunkedArray) else kind
    if not pa.types.is_dictionary(kind.type):
        kind = pc.dictionary_encode(kind)
    other = kinds.index("other")
    names = kind.dictionary.to_pylist()
    table = np.array([kinds.index(n) if n in kinds else other for n in names] + [other], np.int64)
    return table[pc.fill_null(kind.indices, len(names)).to_numpy().astype(np.int64)]


def _kind_counts(kind, kinds: tuple) -> list[int]:
    return np.bincount(_kind_codes(kind, kinds), minlength=len(kinds)).tolist()


def _lane_rows(t: pa.Table, lanes: dict) -> np.ndarray:
    """The lane of each row (``lanes``: ``{(rank, stream): lane}``; a null stream is -1)."""
    rank = t.column("rank").to_numpy(zero_copy_only=False).astype(np.int64)
    stream = pc.fill_null(t.column("stream"), -1).to_numpy().astype(np.int64)
    if not len(rank):
        return np.empty(0, np.int64)
    pairs, inverse = np.unique(np.stack([rank, stream], axis=1), axis=0, return_inverse=True)
    return np.array([lanes[(int(r), int(s))] for r, s in pairs], np.int64)[inverse.ravel()]


def _view_counts_batch(root: str, where: str, lanes: dict, kinds: tuple, origin_ns: int, mask_ms: tuple, cover_ms: tuple,
                       width: int | None, bounds_ns: tuple, rels: list[str]):  # fmt: skip
    """Kernels of some files intersecting ``mask_ms`` (``TimelineData.visible``): their number and, with ``width``,
    ``(first lane, counts per kind x lane x pixel column)`` over ``cover_ms`` (``overlapviz.figures.raster.coverage``)."""
    cut = (pc.field("end_ns") >= bounds_ns[0]) & (pc.field("start_ns") <= bounds_ns[1])
    parts, n = [], 0
    for rel in rels:
        t = read_file(root, rel, ["rank", "stream", "kind", "start_ns", "end_ns"], ("kind",), where, filter=cut)
        s, e = _ms_of(t.column("start_ns"), origin_ns), _ms_of(t.column("end_ns"), origin_ns)
        keep = (e >= mask_ms[0]) & (s <= mask_ms[1])
        n += int(np.count_nonzero(keep))
        if width is not None and keep.any():
            t = t.filter(pa.array(keep))
            parts.append((_lane_rows(t, lanes), _kind_codes(t.column("kind"), kinds), s[keep], e[keep]))
    if width is None:
        return n, None
    if not parts:
        return n, (0, np.zeros((len(kinds), 0, width), np.int64))
    lane, cat, s, e = (np.concatenate(x) for x in zip(*parts))
    r0 = int(lane.min())
    return n, (r0, _coverage(s, e, lane - r0, cat, len(kinds), int(lane.max()) - r0 + 1, width, cover_ms[0], cover_ms[1]))


def view_counts_on(client, dataset_path, run_id: str, ranks: Sequence[int] | None, lanes: dict, kinds: tuple,
                   origin_ns: int, mask_ms: tuple, cover_ms: tuple | None = None, width: int | None = None):  # fmt: skip
    """``(kernels intersecting mask_ms, counts or None)`` of a run's ``ranks`` (all when None), by the dashboard's rules.

    ``counts`` (with ``width``): int64 ``(len(kinds), len(lanes), width)``, what ``TimelineData.raster``
    counts for its kernels; lanes are ``lanes``' values (``{(rank, stream): lane}``), consecutive per rank.
    """
    files = _files_of(dataset_path, run_id, ranks)
    total = np.zeros((len(kinds), len(lanes), int(width)), np.int64) if width is not None else None
    if not files:
        return 0, total
    root = os.path.abspath(dataset_path)
    bounds = ns_bounds(origin_ns, *mask_ms)
    # a unique key per call: with content-hashed keys (scatter's default) two zooms scattering the
    # same lanes share one key, and the first call's release can drop the data under the second's
    # tasks ("lost dependencies", seen in CI; dask/distributed#8576)
    [lanes_f] = client.scatter([lanes], broadcast=False, hash=False)
    futures = [client.submit(_view_counts_batch, root, str(dataset_path), lanes_f, tuple(kinds), int(origin_ns),
                             tuple(map(float, mask_ms)), None if cover_ms is None else tuple(map(float, cover_ms)),
                             None if width is None else int(width), bounds, b, key=task_key("ovz-view")) for b in file_batches(root, files, client)]  # fmt: skip
    n = 0
    from distributed import as_completed

    for fut in as_completed(futures, loop=client.loop):
        k, part = fut.result()
        n += k
        if part is not None:
            r0, block = part
            total[:, r0 : r0 + block.shape[1], :] += block
    return n, total


def _files_of(dataset_path, run_id: str, ranks: Sequence[int] | None) -> list[str]:
    files = sorted(kernel_files(dataset_path, [run_id]), key=rank_of_file)
    if ranks is not None:
        wanted = {int(r) for r in ranks}
        files = [f for f in files if rank_of_file(f) in wanted]
    return files


def rank_summaries_on(client, dataset_path, run_id: str, kinds: tuple) -> list[dict]:
    """``_rank_summary_batch`` of each kernels file of the run, in rank order: what a timeline needs before it draws."""
    files = _files_of(dataset_path, run_id, None)
    if not files:
        return []
    root = os.path.abspath(dataset_path)
    futures = [client.submit(_rank_summary_batch, root, str(dataset_path), tuple(kinds), b, key=task_key("ovz-summary"))
               for b in file_batches(root, files, client)]  # fmt: skip
    return [row for part in client.gather(futures) for row in part]


def glyph_rows_on(client, dataset_path, run_id: str, ranks: Sequence[int] | None, columns: list[str], dictionary: tuple,
                  bounds_ns: tuple | None, comm_ns: tuple | None = None) -> pa.Table:  # fmt: skip
    """The kernels of a run's ``ranks`` in ``bounds_ns`` (all when None), and the comm kernels starting in ``comm_ns``,
    in ``schema.read_kernels``' row order (run x rank file order, each rank's by start)."""
    bounds = (-(1 << 62), 1 << 62) if bounds_ns is None else bounds_ns
    cut = (pc.field("end_ns") >= bounds[0]) & (pc.field("start_ns") <= bounds[1])
    if comm_ns is not None:  # and the collectives an arrow can point into (TimelineData.arrow_frame looks one window ahead)
        cut = cut | ((pc.field("kind") == "comm") & (pc.field("start_ns") >= comm_ns[0]) & (pc.field("start_ns") <= comm_ns[1]))
    return rows_on(client, dataset_path, run_id, ranks, columns, dictionary, cut)


def _rows_batch(root: str, where: str, columns: list[str], dictionary: tuple, cut, rels: list[str]) -> pa.Table | None:
    parts = [read_file(root, rel, columns, dictionary, where, filter=cut) for rel in rels]
    return pa.concat_tables(parts) if parts else None


def rows_on(client, dataset_path, run_id: str, ranks: Sequence[int] | None, columns: list[str], dictionary: tuple,
            cut) -> pa.Table:  # fmt: skip
    """The kernels of a run's ``ranks`` (all when None) that ``cut`` (a ``pyarrow.compute`` expression) keeps, read on
    the workers, in ``schema.read_kernels``' row order (a zoomed-in window's glyphs, the SM budget's resident kernels)."""
    target = pa.schema([pa.field(c, pa.dictionary(pa.int32(), schema.KERNELS.field(c).type)) if c in dictionary
                        else schema.KERNELS.field(c) for c in columns])  # fmt: skip
    order = {f: i for i, f in enumerate(kernel_files(dataset_path, [run_id]))}
    files = sorted(_files_of(dataset_path, run_id, ranks), key=order.__getitem__)
    if not files:
        return target.empty_table()
    root = os.path.abspath(dataset_path)
    futures = [client.submit(_rows_batch, root, str(dataset_path), list(columns), tuple(dictionary), cut, b,
                             key=task_key("ovz-rows")) for b in file_batches(root, files, client)]  # fmt: skip
    return pa.concat_tables([t for t in client.gather(futures) if t is not None] or [target.empty_table()])


def _blockers_batch(root: str, where: str, records: dict, spread, rels: list[str]):
    """``budget.blocker_positions`` of each rank's records over its own kernels, with ``spread`` (records standing for
    the whole run's ready times and blocker names, matched to no rank) so that its candidate kernels are the ones
    the call over the whole run considers."""
    import pandas as pd

    from overlapviz.analysis import budget

    cols = ["run_id", "rank", "device", "stream", "correlation", "name", "kind", "start_ns", "end_ns"]
    out = []
    for rel in rels:
        rec = records.get(rank_of_file(rel))
        if rec is None or not len(rec):
            continue
        k = read_file(root, rel, cols, ("run_id", "name", "kind"), where).to_pandas(types_mapper=schema.nullable_dtype)
        both = pd.concat([rec, spread], ignore_index=False) if len(spread) else rec
        out.append(budget.blocker_positions(both, k).loc[rec.index])
    return pd.concat(out) if out else None


def blocker_positions_on(client, dataset_path, run_id: str, records):
    """``budget.blocker_positions(records, the run's kernels)`` computed per rank on the cluster; the same frame."""
    import pandas as pd

    empty = pd.DataFrame({c: pd.array([], dtype="Int64") for c in ("blocker_stream", "blocker_correlation", "blocker_start_ns",
                                                                     "blocker_end_ns")})  # fmt: skip
    want = records.loc[records["blocker"].notna()] if len(records) else records
    if not len(want):
        return pd.DataFrame({c: pd.array([pd.NA] * len(records), dtype="Int64") for c in empty}, index=records.index)
    t = want["ready_ns"].astype("Int64").to_numpy(np.int64, na_value=-1)
    t = np.where(t >= 0, t, want["start_ns"].to_numpy(np.int64))
    names = sorted(set(want["blocker"].astype(str)))
    n = len(names)
    # rank -1 is no rank's file (rank<N>.parquet): these rows only widen what each call looks at to the whole run's
    spread = want.iloc[[0] * (n + 1)].copy()
    spread.index = pd.RangeIndex(int(records.index.max()) + 1, int(records.index.max()) + 2 + n)
    spread["rank"] = pd.array([-1] * (n + 1), dtype=records["rank"].dtype)
    spread["blocker"] = names + [names[0]]
    spread["ready_ns"] = pd.array([int(t.min())] * n + [int(t.max())], dtype=records["ready_ns"].dtype)
    files = _files_of(dataset_path, run_id, sorted(set(int(r) for r in want["rank"])))
    root = os.path.abspath(dataset_path)
    futures = []
    for b in file_batches(root, files, client):
        mine = {rank_of_file(f) for f in b}
        recs = {r: g for r, g in want.groupby(want["rank"].astype(int)) if r in mine}
        futures.append(client.submit(_blockers_batch, root, str(dataset_path), recs, spread, b, key=task_key("ovz-blockers")))
    parts = [p for p in client.gather(futures) if p is not None]
    got = pd.concat(parts) if parts else empty
    return got.reindex(records.index).astype("Int64")
