"""Overlap metrics (DESIGN.md) per run x rank or per run x rank x step, vectorized over all groups at once."""

from __future__ import annotations

import os

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from overlapviz import intervals, schema

PER = ("rank", "step")
TIME_COLUMNS = (
    "comm_us",
    "compute_us",
    "overlap_us",
    "overlap_fraction",
    "exposed_comm_us",
    "span_us",
    "busy_us",
    "idle_us",
    "memory_us",
)
COUNT_COLUMNS = ("n_kernels", "n_comm_kernels")
# the columns analysis needs; reading only these keeps 1M-row datasets well under a second
INPUT_COLUMNS = ("run_id", "rank", "kind", "start_ns", "end_ns")


def metric_columns(per: str = "rank") -> list[str]:
    """Column names of :func:`overlap_metrics`'s result, in order."""
    keys = ["run_id", "rank"] + (["step"] if per == "step" else [])
    return keys + list(TIME_COLUMNS) + list(COUNT_COLUMNS)


def overlap_metrics(kernels: pa.Table | pd.DataFrame, *, per: str = "rank") -> pd.DataFrame:
    """Computation-communication overlap of each run x rank (x step).

    All interval arithmetic is exact on int64 ns; times are divided into µs at the end.
    Intervals are half-open, so activities that only touch do not overlap, and a
    zero-length activity adds no time (it still counts in ``n_kernels`` and can bound
    ``span_us``).

    Parameters
    ----------
    kernels : pyarrow.Table or pandas.DataFrame
        Rows of the dataset's ``kernels`` table. Needs ``run_id``, ``rank``, ``kind``
        (``comm`` | ``compute`` | ``memory`` | ``other``), ``start_ns``, ``end_ns``, and
        ``step`` when ``per="step"``. Host activities (CPU-only traces) are counted like
        kernels. Not modified.
    per : {"rank", "step"}
        Group by run x rank (whole trace), or by run x rank x step; with ``"step"``,
        activities whose ``step`` is null belong to no step and are left out.

    Returns
    -------
    pandas.DataFrame
        One row per group, sorted by ``run_id, rank[, step]``, with columns

        - ``run_id``, ``rank``, and ``step`` with ``per="step"``;
        - ``comm_us``: measure of the union of comm intervals; ``compute_us`` likewise;
        - ``overlap_us``: measure of (union comm ∩ union compute);
        - ``overlap_fraction``: ``overlap_us / comm_us``, NaN (null) when ``comm_us == 0``;
        - ``exposed_comm_us``: ``comm_us - overlap_us``;
        - ``span_us``: last end − first start over every kind but ``memory``; NaN for a
          group with only memory activities;
        - ``busy_us``: measure of the union of every kind but ``memory``;
        - ``idle_us``: ``span_us - busy_us``;
        - ``memory_us``: measure of the union of ``memory`` activities;
        - ``n_kernels``: activities of every kind but ``memory``; ``n_comm_kernels``: comm ones.

        Times are float64 µs.

    Raises
    ------
    ValueError
        If a needed column is missing, ``kind``, ``start_ns``, ``end_ns``, ``run_id`` or
        ``rank`` has nulls, an activity ends before it starts, or ``per`` is unknown.
    """
    if per not in PER:
        raise ValueError(f"per={per!r}: expected one of {', '.join(PER)}")
    table = _as_table(kernels, list(INPUT_COLUMNS) + (["step"] if per == "step" else []))
    if per == "step":
        table = table.filter(pc.is_valid(table.column("step")))

    keys, code = _group_codes(table, per)
    n = len(keys)
    start = _int64(table, "start_ns")
    end = _int64(table, "end_ns")
    bad = end < start
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(f"kernels.end_ns < start_ns ({end[i]} < {start[i]}) in {len(np.flatnonzero(bad))} rows")
    kind = table.column("kind")
    if kind.null_count:
        raise ValueError(f"kernels.kind: {kind.null_count} null values (ingest classifies every activity)")

    is_comm, is_compute, is_memory = _is(kind, "comm"), _is(kind, "compute"), _is(kind, "memory")
    # one sort by (group, start); every kind's subset below is then already sorted, so
    # each intervals.merge skips its own sort
    order = intervals.sort_order(code, start)
    if order is not None:
        code, start, end = code[order], start[order], end[order]
        is_comm, is_compute, is_memory = is_comm[order], is_compute[order], is_memory[order]
    not_memory = ~is_memory

    comm = intervals.merge(code[is_comm], start[is_comm], end[is_comm])
    compute = intervals.merge(code[is_compute], start[is_compute], end[is_compute])
    busy = intervals.merge(code[not_memory], start[not_memory], end[not_memory])
    memory = intervals.merge(code[is_memory], start[is_memory], end[is_memory])
    comm_ns = intervals.measure(comm, n)
    compute_ns = intervals.measure(compute, n)
    overlap_ns = intervals.intersect_measure(comm, compute, n)
    busy_ns = intervals.measure(busy, n)
    memory_ns = intervals.measure(memory, n)
    first_ns, last_ns, has_span = _span(code[not_memory], start[not_memory], end[not_memory], n)
    span_ns = last_ns - first_ns

    with np.errstate(invalid="ignore", divide="ignore"):
        fraction = np.where(comm_ns > 0, overlap_ns / np.where(comm_ns > 0, comm_ns, 1), np.nan)
    span_us = np.where(has_span, span_ns / 1e3, np.nan)
    idle_us = np.where(has_span, (span_ns - busy_ns) / 1e3, np.nan)
    out = keys.assign(
        comm_us=comm_ns / 1e3,
        compute_us=compute_ns / 1e3,
        overlap_us=overlap_ns / 1e3,
        overlap_fraction=fraction,
        exposed_comm_us=(comm_ns - overlap_ns) / 1e3,
        span_us=span_us,
        busy_us=busy_ns / 1e3,
        idle_us=idle_us,
        memory_us=memory_ns / 1e3,
        n_kernels=np.bincount(code[not_memory], minlength=n).astype(np.int64),
        n_comm_kernels=np.bincount(code[is_comm], minlength=n).astype(np.int64),
    )
    return out[metric_columns(per)]


def analyze(dataset_path: str | os.PathLike, *, per: str = "rank", run_ids=None) -> pd.DataFrame:
    """Overlap metrics of a dataset, read from its ``kernels`` table.

    Parameters
    ----------
    dataset_path
        An overlapviz dataset directory.
    per : {"rank", "step"}
        See :func:`overlap_metrics`.
    run_ids : sequence of str, optional
        Only these runs (all by default).

    Returns
    -------
    pandas.DataFrame
        As :func:`overlap_metrics`.

    Raises
    ------
    ValueError
        If ``dataset_path`` is not a readable dataset (see ``schema.read_metadata``), a
        requested run is not in it, or its kernels break :func:`overlap_metrics`'s rules.
    """
    if per not in PER:
        raise ValueError(f"per={per!r}: expected one of {', '.join(PER)}")
    if run_ids is not None:
        run_ids = list(run_ids)
        known = set(schema.read_table(dataset_path, "runs").column("run_id").to_pylist())
        missing = [r for r in run_ids if r not in known]
        if missing:
            raise ValueError(f"{dataset_path}: no run {missing[0]!r} (runs: {', '.join(sorted(known)) or 'none'})")
    columns = list(INPUT_COLUMNS) + (["step"] if per == "step" else [])
    table = schema.read_kernels(dataset_path, columns=columns, run_ids=run_ids)
    try:
        return overlap_metrics(table, per=per)
    except ValueError as exc:
        raise ValueError(f"{dataset_path}: {exc}") from None


# --- helpers --------------------------------------------------------------------


def _as_table(kernels, columns: list[str]) -> pa.Table:
    names = list(kernels.columns) if isinstance(kernels, pd.DataFrame) else kernels.column_names
    missing = [c for c in columns if c not in names]
    if missing:
        raise ValueError(f"kernels: missing column(s) {', '.join(missing)}")
    if isinstance(kernels, pd.DataFrame):
        table = pa.Table.from_pandas(kernels[columns], preserve_index=False)
    else:
        table = kernels
    if len(table) == 0:  # an empty frame's object columns come as null/double: give them their types
        return pa.schema([schema.KERNELS.field(c) for c in columns]).empty_table()
    return table.select(columns)


def _int64(table: pa.Table, name: str) -> np.ndarray:
    col = table.column(name)
    if col.null_count:
        raise ValueError(f"kernels.{name}: {col.null_count} null values")
    return np.asarray(col.cast(pa.int64()).to_numpy(), dtype=np.int64)


def _is(kind: pa.ChunkedArray, value: str) -> np.ndarray:
    return np.asarray(pc.equal(kind, value).to_numpy(zero_copy_only=False), dtype=bool)


def _dense_codes(col: pa.ChunkedArray, name: str) -> tuple[np.ndarray, pa.Array]:
    """``(codes, sorted distinct values)`` of a non-null column; codes follow the sort order."""
    if col.null_count:
        raise ValueError(f"kernels.{name}: {col.null_count} null values")
    if pa.types.is_integer(col.type) and len(col):
        # ranks and steps: a presence table over the value range beats hashing
        v = np.asarray(col.to_numpy(), dtype=np.int64)
        lo, hi = int(v.min()), int(v.max())
        if hi - lo < 4 * len(v) + (1 << 20):
            present = np.zeros(hi - lo + 1, bool)
            present[v - lo] = True
            values = np.flatnonzero(present) + lo
            return (np.cumsum(present) - 1)[v - lo], pa.array(values, col.type)
    encoded = pc.dictionary_encode(col).combine_chunks()
    dictionary = encoded.dictionary
    rank_of = np.empty(len(dictionary), np.int64)
    rank_of[np.asarray(pc.sort_indices(dictionary))] = np.arange(len(dictionary))
    indices = encoded.indices.to_numpy(zero_copy_only=False)
    return rank_of[indices], dictionary.take(pc.sort_indices(dictionary))


def _group_codes(table: pa.Table, per: str) -> tuple[pd.DataFrame, np.ndarray]:
    """Sorted distinct group keys, and each row's group number (0..n-1) into them."""
    names = ["run_id", "rank"] + (["step"] if per == "step" else [])
    parts = [_dense_codes(table.column(c), c) for c in names]
    combined = np.zeros(table.num_rows, np.int64)
    for codes, values in parts:  # mixed radix: sorts like the tuple of keys
        combined = combined * len(values) + codes
    total = int(np.prod([max(len(v), 1) for _, v in parts], dtype=object))
    if total >= 1 << 62:  # cannot happen with real traces (needs ~2**20 runs, ranks and steps)
        raise ValueError(f"kernels: too many distinct {' x '.join(names)} groups")
    if total <= 4 * table.num_rows + (1 << 20):
        # dense lookup instead of a sort: the key space is small
        present = np.zeros(total, bool)
        present[combined] = True
        uniq = np.flatnonzero(present)
        code = (np.cumsum(present) - 1)[combined]
    else:
        uniq, code = np.unique(combined, return_inverse=True)
    keys = {}
    rest = uniq
    for (codes, values), name in reversed(list(zip(parts, names))):
        keys[name] = values.take(pa.array(rest % len(values))) if len(values) else values
        rest = rest // len(values) if len(values) else rest
    frame = pd.DataFrame(
        {
            "run_id": pd.Series(keys["run_id"].to_pylist(), dtype=object),
            "rank": np.asarray(keys["rank"].to_numpy(zero_copy_only=False), dtype=np.int64),
        }
    )
    if per == "step":
        frame["step"] = np.asarray(keys["step"].to_numpy(zero_copy_only=False), dtype=np.int64)
    return frame, code.astype(np.int64).ravel()


def _span(code: np.ndarray, start: np.ndarray, end: np.ndarray, n: int):
    """Per group: first start, last end, and whether the group has any row; rows sorted by (code, start)."""
    first = np.zeros(n, np.int64)
    last = np.zeros(n, np.int64)
    has = np.zeros(n, bool)
    if len(code):
        heads = np.flatnonzero(np.r_[True, code[1:] != code[:-1]])
        groups = code[heads]
        first[groups] = start[heads]
        last[groups] = np.maximum.reduceat(end, heads)
        has[groups] = True
    return first, last, has
