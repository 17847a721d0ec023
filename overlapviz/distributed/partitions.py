"""A dataset's kernels files as the partitions of distributed work: which, in batches, read as ``schema.read_kernels`` reads them."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from overlapviz.analysis.rankwise import kernel_files, rank_of_file  # noqa: F401 (the local path's: one reading of a rank)
from overlapviz.dataset import schema
from overlapviz.distributed.cluster import check_workers, task_key

BATCH_BYTES = 64 << 20  # analysis tasks read about this much Parquet each (or one bigger file)
BATCH_FILES = 64  # and at most this many files


def file_batches(root: str, files: list[str], client=None) -> list[list[str]]:
    """Consecutive runs of ``files`` of about ``BATCH_BYTES`` (and at most ``BATCH_FILES``)
    each, and at least four per worker thread of ``client``'s cluster where there are files
    enough (a small dataset in one task would keep every worker but one idle)."""
    threads = sum(w.get("nthreads", 1) for w in client.scheduler_info()["workers"].values()) if client is not None else 1
    most = max(1, min(BATCH_FILES, -(-len(files) // (4 * max(threads, 1)))))
    out, cur, size = [], [], 0
    for f in files:
        try:
            n = os.path.getsize(os.path.join(root, f))
        except OSError:
            n = 0  # the task names the missing file
        if cur and (size + n > BATCH_BYTES or len(cur) >= most):
            out.append(cur)
            cur, size = [], 0
        cur.append(f)
        size += n
    return out + ([cur] if cur else [])


def plan_batches(client, dataset_path, items: list, name: str) -> tuple[str, list[list], str]:
    """The work of one call on the cluster: ``(root, batches, prefix)``.

    ``root`` is the dataset's absolute path (what the tasks read), ``batches`` are ``items`` in
    the batches of ``file_batches`` (an item is a kernels file's relative path, or a tuple that
    starts with it), ``prefix`` starts the call's task keys (``ovz-NAME-...``). The workers are
    checked first (``cluster.check_workers``).
    """
    root = os.path.abspath(dataset_path)
    check_workers(client)
    files = [it if isinstance(it, str) else it[0] for it in items]
    lookup = dict(zip(files, items))
    return root, [[lookup[f] for f in b] for b in file_batches(root, files, client)], task_key(f"ovz-{name}")


def read_file(root: str, rel: str, columns: Sequence[str], dictionary: Sequence[str] = (), where: str = "",
               filter=None) -> pa.Table:  # fmt: skip
    """One kernels file as ``schema.read_kernels`` returns its rows (same columns, types, dictionaries)."""
    wanted = list(columns)
    encoded = [c for c in wanted if c in dictionary]
    target = pa.schema([pa.field(c, pa.dictionary(pa.int32(), schema.KERNELS.field(c).type)) if c in encoded
                        else schema.KERNELS.field(c) for c in wanted])  # fmt: skip
    path = os.path.join(root, rel)
    try:
        with pq.ParquetFile(path, read_dictionary=encoded) as reader:
            present = [c for c in wanted if c in reader.schema_arrow.names]
            if filter is None:
                table = reader.read(columns=present)
            else:
                import pyarrow.dataset as pads

                fmt = pads.ParquetFileFormat(read_options=pads.ParquetReadOptions(dictionary_columns=encoded))
                table = pads.dataset([path], format=fmt).to_table(columns=present, filter=filter)
    except (OSError, pa.ArrowException) as exc:  # the local reader's one line, naming the file
        raise schema.unreadable_file(Path(where or root) / rel, exc) from None
    return schema.conform(table, target, where=where or root)
