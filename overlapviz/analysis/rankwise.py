"""A dataset read one run x rank at a time: what keeps an analysis's memory bounded by the ranks in flight (issue 36).

The dataset stores one kernels file per run x rank (``schema.kernels_file``); reading them one by
one gives the rows that ``schema.read_kernels`` followed by a split per rank gives, without the
whole kernels table in memory. The local analyses and the Dask tasks (``overlapviz.distributed``)
read their ranks through the same functions here.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from overlapviz.dataset import schema

__all__ = ["per_rank", "rank_of_file", "kernel_files", "rank_files", "read_rank", "rank_syncs", "rank_tables"]


def rank_of_file(rel: str) -> int:
    """The rank a kernels file's name states (``rank3.parquet``: 3), -1 for another name."""
    m = re.match(r"^rank(\d+)\.parquet$", Path(rel).name)
    return int(m.group(1)) if m else -1


def kernel_files(dataset_path, run_ids=None) -> list[str]:
    """The kernels files ``schema.read_kernels`` would read, in its order (relative paths)."""
    files = list(schema.read_metadata(dataset_path).get("kernel_files", []))
    if run_ids is not None:
        keys = {schema.run_key(r) for r in run_ids}
        files = [f for f in files if Path(f).parent.name in keys]
    return files


def rank_files(dataset_path, run_ids=None) -> list[tuple[str, int, str]] | None:
    """``(run_id, rank, file)`` of each kernels file, in run, rank order (the order in which
    ``explain.per_rank`` yields the ranks); None where a file's path names no run of the runs
    table or no rank (a dataset this reader cannot split by file)."""
    files = kernel_files(dataset_path, run_ids)
    runs = schema.read_table(dataset_path, "runs")
    run_of_key = {schema.run_key(r): r for r in runs.column("run_id").to_pylist()} if runs.num_rows else {}
    out = []
    for rel in files:
        run_id, rank = run_of_key.get(Path(rel).parent.name), rank_of_file(rel)
        if run_id is None or rank < 0:
            return None
        out.append((run_id, rank, rel))
    if len({(r, k) for r, k, _ in out}) != len(out):
        return None
    return sorted(out, key=lambda t: (t[0], t[1]))


def read_rank(dataset_path, rel: str, columns: Sequence[str], dictionary: Sequence[str] = ()) -> pa.Table:
    """One kernels file's rows as ``schema.read_kernels`` returns them (same columns, types and
    dictionaries; from memory where ``dataset_path`` is a ``schema.HeldDataset`` holding it)."""
    # read_kernels over a view of the dataset that lists this file alone: the one reader, the same
    # conforming, the held table where there is one
    meta = {**schema.read_metadata(dataset_path), "kernel_files": [rel]}
    if isinstance(dataset_path, schema.HeldDataset):
        held = {rel: dataset_path.kernels[rel]} if rel in dataset_path.kernels else {}
        # the same finishing: a file not held is read once the dataset's write behind has put it in place
        view = schema.HeldDataset(dataset_path.path, meta, dataset_path.tables, held, dataset_path.finishing)
    else:
        view = schema.HeldDataset(dataset_path, meta, {}, {})
    return schema.read_kernels(view, columns=columns, dictionary=dictionary)


def rank_syncs(syncs: pa.Table | None, run_ids=None) -> dict:
    """The ``syncs`` rows of each ``(run_id, rank)``, in table order (one pass, not one filter per rank)."""
    if syncs is None or not syncs.num_rows:
        return {}
    if run_ids is not None:
        syncs = syncs.filter(pc.is_in(syncs.column("run_id"), pa.array(list(run_ids), pa.string())))
        if not syncs.num_rows:
            return {}
    run = syncs.column("run_id").combine_chunks().dictionary_encode()
    names = run.dictionary.to_pylist()
    rank = pc.fill_null(syncs.column("rank"), -1).to_numpy().astype(np.int64)
    code = run.indices.to_numpy(zero_copy_only=False).astype(np.int64) * (1 << 32) + (rank + 1)
    order = np.argsort(code, kind="stable")
    cut = np.flatnonzero(np.diff(code[order])) + 1
    out = {}
    for rows in np.split(order, cut):
        c = int(code[rows[0]])
        out[(names[c >> 32], int(c & 0xFFFFFFFF) - 1)] = syncs.take(pa.array(rows))
    return out


def rank_tables(dataset_path, columns: Sequence[str], *, run_ids=None, dictionary: Sequence[str] = (),
                syncs: bool = True, pause=None) -> Iterator[tuple[str, int, pa.Table, pa.Table | None]]:  # fmt: skip
    """Yield ``(run_id, rank, kernels, syncs)`` per run x rank with kernels, in run, rank order: the
    rank's rows of ``columns`` (as ``schema.read_kernels`` reads them) and of the ``syncs`` table
    (None without). One kernels file is read at a time; a dataset whose files do not name their
    run x rank is read whole and split (``explain.per_rank``).

    Raises
    ------
    ValueError
        A kernels file holds another run x rank than its path names (naming the file).
    """
    if pause is not None:
        pause()
    sync_rows = rank_syncs(schema.read_table(dataset_path, "syncs") if syncs and "syncs" in schema.TABLES else None, run_ids)
    plan = rank_files(dataset_path, run_ids)
    if plan is None:
        k = schema.read_kernels(dataset_path, columns=columns, run_ids=run_ids, dictionary=dictionary)
        parts = ((rk.column("run_id")[0].as_py(), int(rk.column("rank")[0].as_py()), rk) for rk in per_rank(k))
    else:
        parts = ((run_id, rank, read_rank(dataset_path, rel, columns, dictionary), rel) for run_id, rank, rel in plan)
    for run_id, rank, rk, *rel in parts:
        if pause is not None:
            pause()
        if not rk.num_rows:
            continue
        if rel:
            check_rank(rk, rel[0], run_id, rank, dataset_path)
        yield run_id, rank, rk, sync_rows.get((run_id, rank))


def check_rank(table: pa.Table, rel: str, run_id: str, rank: int, where) -> None:
    """A kernels file holds the run x rank its path names, and that alone (its rows get that rank's limits)."""
    runs, ranks = table.column("run_id"), table.column("rank")
    got = (runs[0].as_py(), ranks[0].as_py())
    runs = runs.combine_chunks() if isinstance(runs, pa.ChunkedArray) else runs
    if pa.types.is_dictionary(runs.type):  # the distinct words used, not every row's string
        runs = runs.dictionary.take(pc.unique(runs.indices))
    bounds = pc.min_max(ranks).as_py()
    one = pc.count_distinct(runs).as_py() == 1 and bounds["min"] == bounds["max"]
    if got != (run_id, rank) or not one:
        raise ValueError(f"{schema.display_path(os.path.join(str(where), rel))}: holds run {got[0]!r} rank {got[1]}, not run {run_id!r} rank {rank}")


def per_rank(k: pa.Table):
    """``k``'s rows of each run x rank, in run, rank order: slices where a rank's rows are
    contiguous (the dataset stores one file per run x rank), else taken."""
    if not k.num_rows:
        return
    run = k.column("run_id").combine_chunks().dictionary_encode()
    code = run.indices.to_numpy(zero_copy_only=False).astype(np.int64) * (1 << 32) + pc.fill_null(k.column("rank"), -1).to_numpy().astype(np.int64)
    cut = np.flatnonzero(code[1:] != code[:-1]) + 1
    lo, hi = np.concatenate([[0], cut]), np.concatenate([cut, [len(code)]])
    names = run.dictionary.to_pylist()
    segments = sorted(zip(lo.tolist(), hi.tolist()), key=lambda ab: (names[code[ab[0]] >> 32], int(code[ab[0]] & 0xFFFFFFFF)))
    if len(np.unique(code[lo])) == len(lo):  # each run x rank one contiguous block
        for a, b in segments:
            yield k.slice(a, b - a)
        return
    for key in sorted(np.unique(code), key=lambda c: (names[c >> 32], int(c & 0xFFFFFFFF))):
        yield k.take(pa.array(np.flatnonzero(code == key)))
