"""Overlap metrics (DESIGN.md) per run x rank or per run x rank x step, vectorized over all groups at once.

``overlap_table`` / ``analyze_table`` compute them as Arrow tables without importing pandas
(the CLI and ``ingest`` + analysis stay light); ``overlap_metrics`` / ``analyze`` are the
same results as pandas DataFrames for the dashboards and notebooks.
"""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from overlapviz.dataset import schema
from overlapviz.analysis import intervals

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


def overlap_table(kernels: pa.Table, *, per: str = "rank") -> pa.Table:
    """Computation-communication overlap of each run x rank (x step), as an Arrow table.

    All interval arithmetic is exact on int64 ns; times are divided into µs at the end.
    Intervals are half-open, so activities that only touch do not overlap, and a
    zero-length activity adds no time (it still counts in ``n_kernels`` and can bound
    ``span_us``). Needs neither pandas nor a per-event Python loop.

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
    pyarrow.Table
        One row per group, sorted by ``run_id, rank[, step]``, with columns

        - ``run_id`` (string), ``rank`` (int64), and ``step`` (int64) with ``per="step"``;
        - ``comm_us``: measure of the union of comm intervals; ``compute_us`` likewise;
        - ``overlap_us``: measure of (union comm ∩ union compute);
        - ``overlap_fraction``: ``overlap_us / comm_us``, null when ``comm_us == 0``;
        - ``exposed_comm_us``: ``comm_us - overlap_us``;
        - ``span_us``: last end − first start over every kind but ``memory``; null for a
          group with only memory activities;
        - ``busy_us``: measure of the union of every kind but ``memory``;
        - ``idle_us``: ``span_us - busy_us`` (null where ``span_us`` is);
        - ``memory_us``: measure of the union of ``memory`` activities;
        - ``n_kernels``: activities of every kind but ``memory``; ``n_comm_kernels``: comm ones.

        Times are float64 µs, counts int64.

    Raises
    ------
    ValueError
        If a needed column is missing, ``kind``, ``start_ns``, ``end_ns``, ``run_id`` or
        ``rank`` has nulls, an activity ends before it starts, or ``per`` is unknown.
    """
    if per not in PER:
        raise ValueError(f"per={per!r}: expected one of {', '.join(PER)}")
    table = _as_table(kernels, list(INPUT_COLUMNS) + (["step"] if per == "step" else []))
    if per == "step" and table.column("step").null_count:
        table = table.filter(pc.is_valid(table.column("step")))

    keys, code = _group_codes(table, per)
    n = len(keys[0])
    start = _int64(table, "start_ns")
    end = _int64(table, "end_ns")
    bad = end < start
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(f"kernels.end_ns < start_ns ({end[i]} < {start[i]}) in {len(np.flatnonzero(bad))} rows")
    kind = table.column("kind")
    if kind.null_count:
        raise ValueError(f"kernels.kind: {kind.null_count} null values (ingest classifies every activity)")

    is_comm, is_compute, is_memory = _kind_masks(kind)
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
    # int64 ns arithmetic wraps where times lie more than 2**63 ns apart: ingest refuses such traces, a dataset
    # written before it did may hold them; never print the wrapped (negative) span or idle time
    wrapped = (has_span & (span_ns < 0)) | (busy_ns < 0) | (comm_ns < 0) | (compute_ns < 0) | (memory_ns < 0)
    if wrapped.any():
        g = int(np.flatnonzero(wrapped)[0])
        raise ValueError(f"run {keys[0][g].as_py()!r} rank {keys[1][g].as_py()}: its activities lie further apart than "
                         "int64 nanoseconds hold (±292 years): no span or idle time can be computed; ingest the trace "
                         "again (ingest now refuses such times, naming the events)")  # fmt: skip

    no_comm = comm_ns == 0
    fraction = overlap_ns / np.where(no_comm, 1, comm_ns)
    no_span = ~has_span
    columns = {
        "comm_us": pa.array(comm_ns / 1e3),
        "compute_us": pa.array(compute_ns / 1e3),
        "overlap_us": pa.array(overlap_ns / 1e3),
        "overlap_fraction": pa.array(fraction, mask=no_comm),
        "exposed_comm_us": pa.array((comm_ns - overlap_ns) / 1e3),
        "span_us": pa.array(span_ns / 1e3, mask=no_span),
        "busy_us": pa.array(busy_ns / 1e3),
        "idle_us": pa.array((span_ns - busy_ns) / 1e3, mask=no_span),
        "memory_us": pa.array(memory_ns / 1e3),
        "n_kernels": pa.array(np.bincount(code[not_memory], minlength=n).astype(np.int64)),
        "n_comm_kernels": pa.array(np.bincount(code[is_comm], minlength=n).astype(np.int64)),
    }
    arrays = list(keys) + [columns[c] for c in TIME_COLUMNS + COUNT_COLUMNS]
    return pa.Table.from_arrays(arrays, schema=result_schema(per))


def overlap_metrics(kernels, *, per: str = "rank"):
    """:func:`overlap_table` as a pandas DataFrame.

    ``run_id`` is an object column of str, ``rank`` (and ``step``) int64, times float64
    with NaN where :func:`overlap_table` has null, counts int64; a default RangeIndex.

    Parameters
    ----------
    kernels : pyarrow.Table or pandas.DataFrame
        As :func:`overlap_table`. Not modified.
    per : {"rank", "step"}
        As :func:`overlap_table`.

    Returns
    -------
    pandas.DataFrame

    Raises
    ------
    ValueError
        As :func:`overlap_table`.
    """
    return to_frame(overlap_table(kernels, per=per))


def analyze_table(dataset_path: str | os.PathLike, *, per: str = "rank", run_ids=None) -> pa.Table:
    """Overlap metrics of a dataset as an Arrow table, read from its ``kernels`` table.

    Imports no pandas: the path ``overlapviz analyze`` and light scripts take.

    Parameters
    ----------
    dataset_path
        An overlapviz dataset directory.
    per : {"rank", "step"}
        See :func:`overlap_table`.
    run_ids : sequence of str, optional
        Only these runs (all by default).

    Returns
    -------
    pyarrow.Table
        As :func:`overlap_table`.

    Raises
    ------
    ValueError
        If ``dataset_path`` is not a readable dataset (see ``schema.read_metadata``), a
        requested run is not in it, or its kernels break :func:`overlap_table`'s rules.
    """
    if per not in PER:
        raise ValueError(f"per={per!r}: expected one of {', '.join(PER)}")
    run_ids = check_runs(dataset_path, run_ids)
    from overlapviz.analysis.rankwise import rank_files, read_rank

    columns = list(INPUT_COLUMNS) + (["step"] if per == "step" else [])
    plan = rank_files(dataset_path, run_ids)
    if plan is not None and len(plan) > 1:
        # every metric is a function of one run x rank (x step): one kernels file in memory at a time (issue 36),
        # in run, rank order, so that the groups come out sorted as overlap_table sorts them
        parts = []
        try:
            for _, _, rel in plan:
                part = overlap_table(read_rank(dataset_path, rel, columns, ("run_id", "kind")), per=per)
                parts.append(part)
        except ValueError:
            parts = None  # the message over the whole dataset (its counts and first bad row), below
        if parts is not None and _one_group_per_file(parts, per):
            return pa.concat_tables(parts).combine_chunks()
    table = schema.read_kernels(dataset_path, columns=columns, run_ids=run_ids, dictionary=("run_id", "kind"))
    try:
        return overlap_table(table, per=per)
    except ValueError as exc:
        raise ValueError(f"{dataset_path}: {exc}") from None


def _one_group_per_file(parts: list[pa.Table], per: str) -> bool:
    """Whether the files' groups are distinct and in order (each run x rank in one file, as ingest writes them)."""
    last = None
    for t in parts:
        if not t.num_rows:
            continue
        runs, ranks = t.column("run_id").to_pylist(), t.column("rank").to_pylist()
        if len(set(zip(runs, ranks))) != 1:
            return False
        key = (runs[0], ranks[0])
        if last is not None and key <= last:
            return False
        last = key
    return True


def check_runs(dataset_path: str | os.PathLike, run_ids) -> list[str] | None:
    """``run_ids`` as a list (None stays None), every one checked to be a run of the dataset.

    Raises
    ------
    ValueError
        ``"<dataset>: no run 'X' (runs: A, B)"`` for the first one that is not.
    """
    if run_ids is None:
        return None
    run_ids = list(run_ids)
    known = set(schema.read_table(dataset_path, "runs").column("run_id").to_pylist())
    missing = [r for r in run_ids if r not in known]
    if missing:
        raise ValueError(f"{dataset_path}: no run {missing[0]!r} (runs: {', '.join(sorted(known)) or 'none'})")
    return run_ids


def analyze(dataset_path: str | os.PathLike, *, per: str = "rank", run_ids=None):
    """:func:`analyze_table` as a pandas DataFrame (see :func:`overlap_metrics` for its dtypes).

    Parameters
    ----------
    dataset_path
        An overlapviz dataset directory.
    per : {"rank", "step"}
        See :func:`overlap_table`.
    run_ids : sequence of str, optional
        Only these runs (all by default).

    Returns
    -------
    pandas.DataFrame

    Raises
    ------
    ValueError
        As :func:`analyze_table`.
    """
    return to_frame(analyze_table(dataset_path, per=per, run_ids=run_ids))


def result_schema(per: str = "rank") -> pa.Schema:
    """The Arrow schema of :func:`overlap_table`'s result."""
    keys = [pa.field("run_id", pa.string()), pa.field("rank", pa.int64())]
    if per == "step":
        keys.append(pa.field("step", pa.int64()))
    return pa.schema(keys + [pa.field(c, pa.float64()) for c in TIME_COLUMNS]
                     + [pa.field(c, pa.int64()) for c in COUNT_COLUMNS])  # fmt: skip


def to_frame(table: pa.Table):
    """A metrics table as the pandas DataFrame :func:`overlap_metrics` returns (imports pandas)."""
    import pandas as pd

    data = {}
    for name in table.column_names:
        col = table.column(name)
        if name == "run_id":
            data[name] = pd.Series(col.to_pylist(), dtype=object)
        elif pa.types.is_floating(col.type):
            data[name] = np.asarray(col.to_numpy(zero_copy_only=False), dtype=np.float64)  # null -> NaN
        else:
            data[name] = np.asarray(col.to_numpy(zero_copy_only=False), dtype=np.int64)
    return pd.DataFrame(data, columns=table.column_names)


# --- helpers --------------------------------------------------------------------


def _as_table(kernels, columns: list[str]) -> pa.Table:
    if isinstance(kernels, pa.RecordBatch):
        kernels = pa.Table.from_batches([kernels])
    if _is_pandas_frame(kernels):  # pandas is imported already: the caller made the frame
        names = list(kernels.columns)
    elif isinstance(kernels, pa.Table):
        names = kernels.column_names
    else:
        raise TypeError(f"kernels: expected a pyarrow.Table or a pandas.DataFrame, not {type(kernels).__name__}")
    missing = [c for c in columns if c not in names]
    if missing:
        raise ValueError(f"kernels: missing column(s) {', '.join(missing)}")
    if _is_pandas_frame(kernels):
        table = pa.Table.from_pandas(kernels[columns], preserve_index=False)
    else:
        table = kernels
    if len(table) == 0:  # an empty frame's object columns come as null/double: give them their types
        return pa.schema([schema.KERNELS.field(c) for c in columns]).empty_table()
    return table.select(columns)


def _is_pandas_frame(obj) -> bool:
    """True for a pandas DataFrame, told by its class's module so pandas is never imported here."""
    return any(c.__module__.split(".")[0] == "pandas" and c.__name__ == "DataFrame" for c in type(obj).__mro__)


def _int64(table: pa.Table, name: str) -> np.ndarray:
    col = table.column(name)
    if col.null_count:
        raise ValueError(f"kernels.{name}: {col.null_count} null values")
    if col.type != pa.int64():
        col = col.cast(pa.int64())
    return np.asarray(col.to_numpy(), dtype=np.int64)


def _kind_masks(kind: pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Boolean masks of ``kind == comm``, ``compute`` and ``memory``: each chunk dictionary-
    encoded (a no-op when it is read so), its few distinct values compared in Python."""
    chunks = kind.chunks if isinstance(kind, pa.ChunkedArray) else [kind]
    masks: list[list[np.ndarray]] = [[], [], []]
    for chunk in chunks:
        if not pa.types.is_dictionary(chunk.type):
            chunk = pc.dictionary_encode(chunk)
        values = chunk.dictionary.cast(pa.string()).to_pylist()
        indices = np.asarray(chunk.indices.to_numpy(zero_copy_only=False), dtype=np.int64)
        for mask, name in zip(masks, ("comm", "compute", "memory")):
            is_name = np.array([v == name for v in values] + [False], dtype=bool)  # one entry per distinct kind
            mask.append(is_name[indices])
    if not chunks:
        return np.zeros(0, bool), np.zeros(0, bool), np.zeros(0, bool)
    comm, compute, memory = (np.concatenate(m) if len(m) > 1 else m[0] for m in masks)
    return comm, compute, memory


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
    if pa.types.is_dictionary(col.type):
        # chunks read from several files carry their own dictionaries: one for all, and the
        # values' own type (an unused or repeated value only widens the radix below)
        col = col.unify_dictionaries() if isinstance(col, pa.ChunkedArray) else col
        dictionary = col.chunk(0).dictionary if isinstance(col, pa.ChunkedArray) and col.num_chunks else None
        if dictionary is not None and len(pc.unique(dictionary)) != len(dictionary):
            col = col.cast(col.type.value_type)  # a value listed twice would make two groups
    encoded = pc.dictionary_encode(col).combine_chunks()
    dictionary = encoded.dictionary
    order = pc.sort_indices(dictionary)
    rank_of = np.empty(len(dictionary), np.int64)
    rank_of[np.asarray(order)] = np.arange(len(dictionary))
    indices = encoded.indices.to_numpy(zero_copy_only=False)
    return rank_of[indices], dictionary.take(order)


def _group_codes(table: pa.Table, per: str) -> tuple[list[pa.Array], np.ndarray]:
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
    arrays = [keys["run_id"].cast(pa.string()), keys["rank"].cast(pa.int64())]
    if per == "step":
        arrays.append(keys["step"].cast(pa.int64()))
    return arrays, code.astype(np.int64).ravel()


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
