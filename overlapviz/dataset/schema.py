"""The canonical dataset: table schemas, and atomic reading and writing of a dataset directory.

A dataset is a directory::

    DATASET/
      dataset.json                      # schema_version, writer version, kind rules, table list
      runs.parquet                      # one row per run
      ranks.parquet                     # one row per run x rank (source file, distributed info)
      devices.parquet                   # device limits per run x rank x device
      steps.parquet                     # host ranges of profiler steps / collector iterations
      iterations.parquet                # collector's CUDA-event iteration times (may be empty)
      kernels/<run_key>/rank<N>.parquet # one row per GPU (or host stand-in) activity

Every kernels file carries all columns, ``run_id`` and ``rank`` included, so the
directory can be read with one ``pyarrow.dataset`` call and no partition parsing.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Sequence

import pyarrow as pa
import pyarrow.parquet as pq

from overlapviz.dataset import _nopandas, outdir
from overlapviz._version import __version__
from overlapviz.dataset.outdir import SCHEMA_VERSION, display_path

_shown = display_path

_nopandas.defer_pandas_in_pyarrow()  # pyarrow's first conversion imports no pandas (see there)

SCHEMA_MAJOR = 1
METADATA_FILE = "dataset.json"
KINDS = ("comm", "compute", "memory", "other")

# --- kernels -------------------------------------------------------------------
KERNELS = pa.schema(
    [
        ("run_id", pa.string()),
        ("rank", pa.int32()),
        ("device", pa.int32()),  # null for host activities
        ("stream", pa.int64()),  # GPU stream / HIP queue id; thread id for host activities
        ("correlation", pa.int64()),  # runtime correlation id; null where the trace has none
        ("name", pa.string()),
        ("kind", pa.string()),  # comm | compute | memory | other
        ("category", pa.string()),  # source category: kernel, gpu_memcpy, gpu_memset, cpu_op, ...
        ("is_host", pa.bool_()),  # True: a host activity standing in for a kernel (CPU-only traces)
        ("start_ns", pa.int64()),
        ("end_ns", pa.int64()),
        ("grid_x", pa.int32()),  # blocks (work-groups), never work-items
        ("grid_y", pa.int32()),
        ("grid_z", pa.int32()),
        ("block_x", pa.int32()),  # threads (work-items) per block
        ("block_y", pa.int32()),
        ("block_z", pa.int32()),
        ("regs_per_thread", pa.int32()),  # AMD: arch VGPRs per work-item
        ("shared_mem_bytes", pa.int64()),  # static + dynamic shared memory / LDS per block
        ("sgprs", pa.int32()),  # AMD scalar registers per wave; null on NVIDIA
        ("accum_vgprs", pa.int32()),  # AMD accumulation VGPRs per work-item; null elsewhere
        ("wave_size", pa.int32()),  # warp / wavefront size where the trace says
        ("bytes", pa.int64()),  # memcpy/memset size; null for kernels
        ("launch_ns", pa.int64()),  # start of the host launch call (by correlation); null where unknown
        ("step", pa.int64()),  # profiler step / collector iteration containing launch_ns; null where none
        ("collective", pa.string()),  # all_reduce, all_to_all, ... for comm kernels where known
        ("source_format", pa.string()),  # chrome, rocprof_v1_csv, rocprof_v1_json, rocprof_v3_csv, rocprof_v3_json
        ("launch_tid", pa.int64()),  # host thread of the launch call (by correlation); null where unknown
        ("launch_end_ns", pa.int64()),  # end of the host launch call, clock of launch_ns; null where unknown (1.1)
        # what the profiler recorded of a collective (record_param_comms / the kernel's args); null elsewhere
        ("comm_group", pa.string()),  # process group name
        ("comm_group_ranks", pa.string()),  # the group's ranks, as recorded
        ("comm_group_size", pa.int32()),
        ("comm_seq", pa.int64()),  # the collective's sequence number in its group
        ("comm_in_elems", pa.int64()),
        ("comm_out_elems", pa.int64()),
        ("comm_dtype", pa.string()),
    ]
)

# --- syncs: the host's event records, stream waits and synchronizations (why a stream waited)
SYNCS = pa.schema(
    [
        ("run_id", pa.string()),
        ("rank", pa.int32()),
        ("source", pa.string()),  # runtime (the host API call) | cuda_sync (Kineto's cuda_sync / CUPTI sync record)
        ("kind", pa.string()),  # event_record | stream_wait_event | event_sync | stream_sync | context_sync | event_query
        ("name", pa.string()),  # as recorded: cudaStreamWaitEvent, hipEventRecord, "Stream Wait Event", ...
        ("pid", pa.int64()),
        ("tid", pa.int64()),  # host thread of a runtime call; null for cuda_sync records
        ("start_ns", pa.int64()),  # host clock
        ("end_ns", pa.int64()),
        ("correlation", pa.int64()),
        ("device", pa.int32()),
        ("stream", pa.int64()),  # the stream the record names (the waiting stream of a wait); null where not named
        ("event_id", pa.int64()),  # wait_on_cuda_event_id; null where not named
        ("wait_on_stream", pa.int64()),  # the recording stream a wait names; null where not named (-1)
        ("wait_on_record_correlation", pa.int64()),  # the record call a wait names; null where not named (-1)
    ]
)

# --- runs ---------------------------------------------------------------------
RUNS = pa.schema(
    [
        ("run_id", pa.string()),
        ("source", pa.string()),  # imported | collected
        ("source_paths", pa.string()),  # JSON list of the ingested paths
        ("workload", pa.string()),  # cb-ar, mb-ar, cb-a2a, mb-a2a, ... (null for imported traces)
        ("setup", pa.string()),  # sequential | baseline | optimized
        ("compute_impl", pa.string()),  # tiled (our GEMM) | vendor (torch.matmul)
        ("gemm_m", pa.int64()),
        ("gemm_n", pa.int64()),
        ("gemm_k", pa.int64()),
        ("tile_m", pa.int32()),
        ("tile_n", pa.int32()),
        ("tile_k", pa.int32()),
        ("smem_pad_bytes", pa.int64()),
        ("comm_priority", pa.int32()),  # requested stream priority of the collective
        ("comm_priority_effective", pa.int32()),  # after torch's clamping
        ("collective", pa.string()),  # all_reduce | all_to_all
        ("message_bytes", pa.int64()),
        ("sm_carveout", pa.int32()),
        ("world_size", pa.int32()),
        ("n_ranks", pa.int32()),  # ranks present in the dataset for this run
        ("backend", pa.string()),  # nccl | rccl | gloo | stand-in
        ("stand_in", pa.bool_()),  # True: single-GPU stand-in for the collective, not real NCCL
        ("iterations", pa.int32()),
        ("warmup_iterations", pa.int32()),
        ("device_name", pa.string()),
        ("torch_version", pa.string()),
        ("cuda_version", pa.string()),
        ("hip_version", pa.string()),
        ("nccl_version", pa.string()),
        ("host", pa.string()),
        ("start_time", pa.string()),  # ISO 8601
        ("status", pa.string()),  # ok | failed (collected runs)
        ("error", pa.string()),
        ("kind_rules", pa.string()),  # JSON of the rules that classified this run's kernels
        ("config_json", pa.string()),  # the full manifest configuration, JSON
    ]
)

RANKS = pa.schema(
    [
        ("run_id", pa.string()),
        ("rank", pa.int32()),
        ("world_size", pa.int32()),
        ("backend", pa.string()),
        ("host", pa.string()),
        ("pid", pa.int64()),
        ("source_path", pa.string()),
        ("source_format", pa.string()),
        ("base_time_ns", pa.int64()),  # the trace's baseTimeNanoseconds (0 where absent); add to *_ns for wall time
        ("n_events", pa.int64()),  # trace events read
        ("distributed_info", pa.string()),  # JSON
        # (1.1) the rank's clock (overlapviz.ingest.align, overlapviz.analysis.clocks): ranks of a run with
        # equal clock_domain compare; null in older datasets (then: their host's)
        ("clock_domain", pa.string()),
        ("clock_offset_ns", pa.int64()),  # added by ingest to every time of this rank to align it; null: none
        ("clock_note", pa.string()),  # how the clock was aligned, or why it is kept apart
    ]
)

DEVICES = pa.schema(
    [
        ("run_id", pa.string()),
        ("rank", pa.int32()),
        ("device", pa.int32()),
        ("name", pa.string()),
        ("vendor", pa.string()),  # nvidia | amd
        ("arch", pa.string()),  # sm_90, gfx942, ...
        ("compute_major", pa.int32()),
        ("compute_minor", pa.int32()),
        ("num_sms", pa.int32()),  # SMs (NVIDIA) or CUs (AMD)
        ("max_threads_per_sm", pa.int32()),
        ("max_threads_per_block", pa.int32()),
        ("max_blocks_per_sm", pa.int32()),
        ("regs_per_sm", pa.int64()),
        ("regs_per_block", pa.int64()),
        ("shared_mem_per_sm", pa.int64()),
        ("shared_mem_per_block", pa.int64()),
        ("shared_mem_per_block_optin", pa.int64()),
        ("warp_size", pa.int32()),
        ("total_mem_bytes", pa.int64()),
        ("simds_per_cu", pa.int32()),  # AMD only
        ("max_waves_per_simd", pa.int32()),
        ("vgprs_per_simd", pa.int32()),
        ("sgprs_per_simd", pa.int32()),
        ("lds_per_cu", pa.int64()),
    ]
)

STEPS = pa.schema(
    [
        ("run_id", pa.string()),
        ("rank", pa.int32()),
        ("step", pa.int64()),
        ("name", pa.string()),  # ProfilerStep#12, ovz_iter#3
        ("source", pa.string()),  # profiler_step | iteration
        ("start_ns", pa.int64()),  # host range, same clock as kernels.launch_ns
        ("end_ns", pa.int64()),
    ]
)

ITERATIONS = pa.schema(
    [
        ("run_id", pa.string()),
        ("rank", pa.int32()),
        ("iteration", pa.int32()),
        ("time_ms", pa.float64()),  # CUDA-event elapsed time of one iteration
        ("measured", pa.bool_()),  # False for warm-up iterations (the first third)
    ]
)

TABLES = {
    "runs": RUNS,
    "ranks": RANKS,
    "devices": DEVICES,
    "steps": STEPS,
    "iterations": ITERATIONS,
    "syncs": SYNCS,
}


def conform(table, schema: pa.Schema, *, where: str = "table") -> pa.Table:
    """Return ``table`` with exactly ``schema``'s columns, in order, cast to its types.

    Missing nullable columns are filled with nulls; extra columns are dropped. A table
    that already has exactly ``schema`` comes back as it is.

    Parameters
    ----------
    table : pyarrow.Table or pandas.DataFrame
        Not modified.
    schema : pyarrow.Schema
    where : str
        What to name in an error message.

    Raises
    ------
    ValueError
        If a column cannot be cast, naming the column and ``where``.
    """
    if not isinstance(table, pa.Table) and _is_pandas_frame(table):
        table = pa.Table.from_pandas(table, preserve_index=False)
    if table.schema.equals(schema) and table.schema.metadata == schema.metadata:
        return table
    n = table.num_rows
    index = {name: i for i, name in enumerate(table.column_names)}
    arrays = []
    for field in schema:
        if field.name in index:
            col = table.column(index[field.name])
            if col.type == pa.null():  # all nulls (a row dict's None): no cast needed
                col = pa.nulls(n, field.type)
            elif col.type != field.type:
                try:
                    col = col.cast(field.type)
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                    raise ValueError(f"{where}: column {field.name!r} is not {field.type}: {exc}") from None
            arrays.append(col)
        else:
            arrays.append(pa.nulls(n, field.type))
    return pa.Table.from_arrays(arrays, schema=schema)


def empty(schema: pa.Schema) -> pa.Table:
    return schema.empty_table()


def _is_pandas_frame(obj) -> bool:
    """True for a pandas DataFrame, told by its class's module so this module never imports pandas."""
    return any(c.__module__.split(".")[0] == "pandas" and c.__name__ == "DataFrame" for c in type(obj).__mro__)


def run_key(run_id: str) -> str:
    """A file-system-safe directory name for a run id (unique per run id)."""
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", run_id).strip("._") or "run"
    if safe != run_id:
        # keep distinct ids distinct even when sanitising maps them together
        import hashlib

        safe = f"{safe[:80]}-{hashlib.sha1(run_id.encode()).hexdigest()[:8]}"
    return safe


# --- writing --------------------------------------------------------------------


class DatasetWriter:
    """Builds a dataset in a temporary directory beside ``out``; ``commit`` moves it into place.

    Used as a context manager: on any exception the temporary directory is removed and
    ``out`` is left as it was, so a failed ingest never leaves a half-written dataset.
    ``out`` may be absent or an empty directory; an overlapviz dataset is replaced only with
    ``overwrite``, and nothing else ever is; ``out`` may not be, contain or lie inside any of
    ``inputs``. Temporary directories that killed writers of ``out`` left are removed first;
    the replacement is one atomic exchange where the file system has one (``outdir``).
    """

    def __init__(self, out: str | os.PathLike, *, overwrite: bool = False, rules: dict | None = None,
                 inputs: Sequence[str | os.PathLike] = ()):  # fmt: skip
        self.out = Path(out)
        if self.out.name in ("", ".", ".."):  # "." or "/": a name to put the temporary directory beside
            self.out = Path(os.path.abspath(self.out))
        self.overwrite = overwrite
        self.rules = rules
        self.inputs = list(inputs)
        self._tables: dict[str, list[pa.Table]] = {name: [] for name in TABLES}
        self._kernel_files: list[str] = []
        self._kernel_rows = 0
        self._unwritten: dict[str, tuple[pa.Table, str, int]] = {}  # kernels file -> (table, run_id, rank): commit writes it
        self._tmp: Path | None = None

    def __enter__(self) -> "DatasetWriter":
        out = self.out
        parent = out.parent if str(out.parent) else Path(".")
        try:
            parent_mode = os.stat(parent).st_mode
        except FileNotFoundError:
            raise ValueError(f"{_shown(out)}: parent directory {_shown(parent)} does not exist") from None
        except OSError as exc:
            raise ValueError(f"{_shown(out)}: cannot use parent directory {_shown(parent)}: {exc.strerror or exc}") from None
        if not stat.S_ISDIR(parent_mode):
            raise ValueError(f"{_shown(out)}: {_shown(parent)} is not a directory")
        outdir.check_output(out, self.inputs, may_be_dataset=True)
        outdir.check_replaceable(out, self.overwrite)
        outdir.clean_stale_temporaries(out)
        try:
            self._tmp = Path(tempfile.mkdtemp(prefix=outdir.temporary_prefix(out, "tmp") + outdir.process_tag(), dir=parent))
            (self._tmp / outdir.INCOMPLETE).write_text(json.dumps({"pid": os.getpid(), "out": _shown(out)}) + "\n")
            (self._tmp / "kernels").mkdir()
        except OSError as exc:
            self._remove_tmp()
            raise ValueError(f"{_shown(out)}: cannot write here: {exc.strerror or exc}") from None
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self._remove_tmp()

    def _remove_tmp(self) -> None:
        if self._tmp is not None and os.path.lexists(self._tmp):
            shutil.rmtree(self._tmp, ignore_errors=True)
        self._tmp = None

    @property
    def directory(self) -> Path:
        """The temporary directory the dataset is built in (``kernels/`` already made).

        Other processes may write kernels files into it with ``write_kernels`` and hand them
        over with ``add_kernels_file``; all of it is removed if the dataset is not committed.
        """
        assert self._tmp is not None, "use DatasetWriter as a context manager"
        return self._tmp

    def add_kernels(self, table: pa.Table, run_id: str, rank: int) -> None:
        """Write one run x rank's kernels (already conformed to KERNELS) to their own file."""
        self._check_new(run_id, rank)
        self.add_kernels_file(*write_kernels(table, self.directory, run_id, rank), run_id, rank)

    def add_kernels_file(self, rel: str, n_rows: int, run_id: str, rank: int) -> None:
        """Count a kernels file that ``write_kernels`` wrote into ``directory`` as part of the dataset.

        Raises
        ------
        ValueError
            When the run x rank already has a file.
        """
        self._check_new(run_id, rank)
        self._kernel_files.append(rel)
        self._kernel_rows += int(n_rows)

    def add_kernels_later(self, table: pa.Table, run_id: str, rank: int) -> str:
        """Count one run x rank's kernels (conformed to KERNELS, sorted by ``start_ns``: as ``write_kernels``
        writes them) whose file ``commit`` writes; ``replace_kernels`` may still change them. Returns the file's
        relative path."""
        rel = kernels_file(run_id, rank)
        self.add_kernels_file(rel, table.num_rows, run_id, rank)
        self._unwritten[rel] = (table, run_id, rank)
        return rel

    def replace_kernels(self, rel: str, table: pa.Table) -> None:
        """The table a kernels file counted by ``add_kernels_later`` will hold instead (same rows: a clock shift)."""
        _, run_id, rank = self._unwritten[rel]
        self._unwritten[rel] = (table, run_id, rank)

    def _check_new(self, run_id: str, rank: int) -> None:
        if kernels_file(run_id, rank) in self._kernel_files:
            raise ValueError(f"{run_id}: rank {rank} appears twice")

    def add(self, name: str, table) -> None:
        """Append rows to one of the small tables (runs, ranks, devices, steps, iterations)."""
        self._tables[name].append(conform(table, TABLES[name], where=name))

    def commit(self, extra_metadata: dict | None = None, *, background: bool = False) -> Path | outdir.Finishing:
        """Write the kernels files still to write (``add_kernels_later``), the small tables and ``dataset.json``,
        then move the dataset into place.

        ``background``: the tables are assembled here (``written``, ``metadata``), and the files written and
        moved into place by a thread, which owns the temporary directory from then on (removes it if it fails):
        returns that ``outdir.Finishing``, whose ``wait`` gives the path or raises.

        Raises
        ------
        ValueError
            Naming ``out``: a run id twice, the disk full or read-only, or ``out`` changed
            meanwhile into something that may not be replaced.
        """
        assert self._tmp is not None
        self._assemble(extra_metadata)
        if not background:
            self._finish(self._tmp)
            self._tmp = None
            return self.out
        tmp, self._tmp = self._tmp, None  # the thread's now: __exit__ leaves it

        def finish() -> Path:
            try:
                self._finish(tmp)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
            return self.out

        return outdir.Finishing(finish)

    def _finish(self, tmp: Path) -> None:
        try:
            for rel, (table, run_id, rank) in self._unwritten.items():
                write_kernels(table, tmp, run_id, rank)
            for name, table in self.written.items():
                if table.num_rows:
                    _write(table, tmp / f"{name}.parquet", lean=True)
                else:
                    _write_empty(name, tmp / f"{name}.parquet")
            (tmp / METADATA_FILE).write_text(json.dumps(self.metadata, indent=2) + "\n")
        except OSError as exc:
            raise ValueError(f"{_shown(self.out)}: cannot write the dataset: {exc.strerror or exc}") from None
        outdir.check_replaceable(self.out, self.overwrite)  # again: out may have changed meanwhile
        try:
            outdir.finish_tree(tmp)
            (tmp / outdir.INCOMPLETE).unlink()
            outdir.move_into_place(tmp, self.out)
        except OSError as exc:
            raise ValueError(f"{_shown(self.out)}: cannot move the dataset into place: {exc.strerror or exc}") from None

    def _assemble(self, extra_metadata: dict | None) -> None:
        """The small tables (``written``: HeldDataset's) and dataset.json (``metadata``), in memory."""
        self.written = {}
        for name in TABLES:
            parts = [t for t in self._tables[name] if t.num_rows]
            if not parts:
                self.written[name] = empty(TABLES[name])
                continue
            table = parts[0] if len(parts) == 1 else pa.concat_tables(parts)
            if name == "runs":
                ids = table.column("run_id").to_pylist()
                dup = sorted({i for i in ids if ids.count(i) > 1})
                if dup:
                    raise ValueError(f"run id {dup[0]!r} appears twice")
            self.written[name] = table
        meta = {
            "schema_version": SCHEMA_VERSION,
            "writer": f"overlapviz {__version__}",
            "kind_rules": self.rules,
            "kernel_files": sorted(self._kernel_files),
            "n_kernels": self._kernel_rows,
        }
        meta.update(extra_metadata or {})
        self.metadata = json.loads(json.dumps(meta))  # as read_metadata would give it back


def kernels_file(run_id: str, rank: int) -> str:
    """Where one run x rank's kernels go, relative to the dataset directory."""
    return f"kernels/{run_key(run_id)}/rank{int(rank)}.parquet"


def write_kernels(table: pa.Table, directory: str | os.PathLike, run_id: str, rank: int) -> tuple[str, int]:
    """Conform one run x rank's kernels to KERNELS, sort them by ``start_ns`` and write them
    under ``directory`` (a ``DatasetWriter.directory``); return the file's relative path and
    its row count, for ``DatasetWriter.add_kernels_file``.

    Module-level so that a worker process can write the file it read (the writer stays in
    the parent). Creates only the run's folder, never ``directory`` itself: a worker that
    outlives a failed ingest cannot bring its removed directory back.
    """
    table = conform(table, KERNELS, where=f"kernels of {run_id} rank {rank}")
    rel = kernels_file(run_id, rank)
    path = Path(directory) / rel
    path.parent.mkdir(exist_ok=True)
    if not is_sorted(table.column("start_ns")):
        table = table.sort_by([("start_ns", "ascending")])
    # compressed, dictionary pages for the text columns only: on times, ids and sizes (mostly distinct, or runs that
    # zstd packs as well) they cost a third of the write and make the file larger (100k kernels: 0.099 -> 0.068 CPU s,
    # 2.75 -> 1.81 MB); a small file is not compressed, and dictionaries keep it smaller
    big = table.num_rows >= _COMPRESS_MIN_ROWS
    _write(table, path, row_group_size=1 << 20, use_dictionary=_TEXT_COLUMNS if big else True)
    return rel, table.num_rows


_TEXT_COLUMNS = [f.name for f in KERNELS if pa.types.is_string(f.type)]


# below this many rows a table is written uncompressed: zstd's per-column setup costs more
# time (~1 ms for the 36 run columns) than it saves bytes on a few rows
_COMPRESS_MIN_ROWS = 4096
_EMPTY_FILES: dict[str, bytes] = {}


def _write(table: pa.Table, path: Path, *, lean: bool = False, **kwargs) -> None:
    """Write ``table`` to ``path``; ``lean``: a small table read whole, so without
    dictionary pages and column statistics (they cost ~30% of writing one)."""
    small = table.num_rows < _COMPRESS_MIN_ROWS
    if small:
        kwargs["compression"] = "none"
        if lean:
            kwargs.update(use_dictionary=False, write_statistics=False)
    else:
        kwargs["compression"] = "zstd"
    # an OSFile, not a path: pyarrow's file-system resolution of a path string costs more
    # than writing a small table
    with pa.OSFile(os.fsencode(path), "wb") as fh:  # bytes: a directory name need not be UTF-8
        pq.write_table(table, fh, **kwargs)


def _write_empty(name: str, path: Path) -> None:
    """Write table ``name`` with no rows: the same bytes every time, so made once per process."""
    data = _EMPTY_FILES.get(name)
    if data is None:
        sink = pa.BufferOutputStream()
        pq.write_table(empty(TABLES[name]), sink, compression="none")
        data = _EMPTY_FILES[name] = sink.getvalue().to_pybytes()
    path.write_bytes(data)


def is_sorted(col: pa.ChunkedArray) -> bool:
    """True when a non-null int64 column is in ascending order (nulls: False)."""
    if col.null_count:
        return False
    values = col.to_numpy()
    return bool(len(values) < 2 or (values[1:] >= values[:-1]).all())


@contextmanager
def writing(out: str | os.PathLike, **kwargs) -> Iterator[DatasetWriter]:
    with DatasetWriter(out, **kwargs) as writer:
        yield writer


# --- reading --------------------------------------------------------------------


class HeldDataset(os.PathLike):
    """A dataset directory whose tables this process also holds, as written: the readers below
    take them from memory instead of reading the files back (``ingest.driver.ingest_held``).

    A path like any other (``os.fspath`` gives the directory); kernels of a run x rank it does
    not hold are read from their file. The tables are those the writer wrote, conformed and
    sorted as in the files, so what is read is the same either way.

    ``finishing``: the directory is still being written by a thread (``DatasetWriter.commit(background=True)``);
    ``os.fspath`` and every read of a file wait for it (``wait``), the held tables do not.
    """

    def __init__(self, path: str | os.PathLike, metadata: dict, tables: dict[str, pa.Table], kernels: dict[str, pa.Table],
                 finishing: outdir.Finishing | None = None):  # fmt: skip
        self.path = Path(path)
        self.metadata = metadata
        self.tables = tables  # name -> the small table as read_table returns it
        self.kernels = kernels  # kernels_file(run_id, rank) -> that file's table
        self.finishing = finishing

    def wait(self) -> Path:
        """The directory, once it is written and in place. Raises the ValueError of a write that failed."""
        if self.finishing is not None:
            self.finishing.wait()
        return self.path

    def __fspath__(self) -> str:
        return os.fspath(self.wait())

    def __str__(self) -> str:
        return str(self.path)

    def __repr__(self) -> str:
        return f"HeldDataset({str(self.path)!r}, {len(self.kernels)} kernels tables held)"


def read_metadata(path: str | os.PathLike) -> dict:
    """Read and check ``dataset.json``.

    Raises
    ------
    ValueError
        If ``path`` is not a dataset or its schema major version is newer than this reader's.
    """
    if isinstance(path, HeldDataset):
        return path.metadata
    meta_path = Path(path) / METADATA_FILE
    try:
        meta = json.loads(meta_path.read_text())
    except FileNotFoundError:
        raise ValueError(f"{path}: not an overlapviz dataset (no {METADATA_FILE})") from None
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{meta_path}: unreadable dataset metadata: {exc}") from None
    version = str(meta.get("schema_version", ""))
    try:
        major = int(version.split(".")[0])
    except ValueError:
        raise ValueError(f"{meta_path}: bad schema_version {version!r}") from None
    if major != SCHEMA_MAJOR:
        raise ValueError(f"{meta_path}: schema_version {version} is not readable by schema {SCHEMA_VERSION}")
    return meta


def read_kernels(
    path: str | os.PathLike,
    columns: Sequence[str] | None = None,
    *,
    run_ids: Sequence[str] | None = None,
    filter=None,
    dictionary: Sequence[str] = (),
) -> pa.Table:
    """Read the kernels table (all runs and ranks), conformed to the current schema.

    Parameters
    ----------
    columns
        Columns to read (all by default). Columns absent from an older dataset come back null.
    run_ids
        Only these runs.
    filter
        An optional ``pyarrow.compute`` expression applied while reading.
    dictionary
        String columns to return dictionary-encoded (``dictionary<int32, string>``, as
        Parquet stores them): no string per row is built, which halves the time and memory
        of reading ``run_id`` and ``kind`` for a million kernels.
    """
    meta = read_metadata(path)
    files = [str(_directory(path) / f) for f in meta.get("kernel_files", [])]
    if run_ids is not None:
        keys = {run_key(r) for r in run_ids}
        files = [f for f in files if Path(f).parent.name in keys]
    wanted = list(columns) if columns is not None else KERNELS.names
    encoded = [c for c in wanted if c in dictionary]
    schema = pa.schema(
        [
            pa.field(c, pa.dictionary(pa.int32(), KERNELS.field(c).type)) if c in encoded else KERNELS.field(c)
            for c in wanted
        ]
    )
    if not files:
        return schema.empty_table()
    if isinstance(path, HeldDataset) and filter is None:
        held = [path.kernels.get(Path(f).relative_to(path.path).as_posix()) for f in files]
        if all(t is not None for t in held):
            return _from_held(held, wanted, encoded, schema)
    if isinstance(path, HeldDataset):
        path.wait()  # the files are read: they must be there
    if filter is None and (len(files) == 1 or _total_bytes(files) < _DATASET_MIN_BYTES):
        # one Parquet reader per file: a pyarrow.dataset scan costs ~1 ms more to set up,
        # and pays only when several large files are read at once
        parts = []
        for f in files:
            try:
                with pq.ParquetFile(f, read_dictionary=encoded) as reader:
                    present = [c for c in wanted if c in reader.schema_arrow.names]
                    part = reader.read(columns=present)
            except (OSError, pa.ArrowException) as exc:
                raise unreadable_file(f, exc) from None
            parts.append(conform(part, schema, where=str(path)))
        return parts[0] if len(parts) == 1 else pa.concat_tables(parts)
    import pyarrow.dataset as pads

    fmt = pads.ParquetFileFormat(read_options=pads.ParquetReadOptions(dictionary_columns=encoded))
    try:
        dataset = pads.dataset(files, format=fmt)
        present = [c for c in wanted if c in dataset.schema.names]
        table = dataset.to_table(columns=present, filter=filter)
    except (OSError, pa.ArrowException) as exc:
        # the scan's message may not say which file: find the first one that does not open
        for f in files:
            try:
                pq.read_metadata(f)
            except (OSError, pa.ArrowException) as bad:
                raise unreadable_file(f, bad) from None
        raise unreadable_file(Path(path), exc) from None
    return conform(table, schema, where=str(path))


def _directory(path: str | os.PathLike) -> Path:
    """The dataset directory ``path`` names, a HeldDataset's without waiting for its files."""
    return path.path if isinstance(path, HeldDataset) else Path(path)


def _from_held(tables: list[pa.Table], wanted: list[str], encoded: list[str], schema: pa.Schema) -> pa.Table:
    """``read_kernels``' table from held kernels tables: the columns, with ``encoded`` dictionary-encoded as Parquet
    gives them."""
    parts = []
    for t in tables:
        t = t.select([c for c in wanted if c in t.column_names])
        for c in encoded:
            if c in t.column_names:
                t = t.set_column(t.column_names.index(c), c, t.column(c).dictionary_encode())
        parts.append(conform(t, schema))
    return parts[0] if len(parts) == 1 else pa.concat_tables(parts)


def unreadable_file(file: str | os.PathLike, exc: BaseException) -> ValueError:
    """The one-line error for a dataset file Parquet cannot read (truncated, corrupt, missing)."""
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return ValueError(f"{file}: unreadable dataset file ({first}); re-run `overlapviz ingest` to rebuild the dataset")


# below this many bytes of kernel files in all, they are read one by one (see read_kernels)
_DATASET_MIN_BYTES = 8 * 1024 * 1024


def _total_bytes(files: list[str]) -> int:
    total = 0
    for f in files:
        try:
            total += os.path.getsize(f)
        except OSError:
            pass  # the reader names the missing file
    return total


def read_table(path: str | os.PathLike, name: str) -> pa.Table:
    """Read one of the small tables, conformed to the current schema (older datasets included)."""
    if isinstance(path, HeldDataset) and name in path.tables:
        return path.tables[name]
    read_metadata(path)
    file = Path(path) / f"{name}.parquet"
    if not file.exists():
        return empty(TABLES[name])
    try:
        with pq.ParquetFile(file) as reader:
            table = reader.read()
    except (OSError, pa.ArrowException) as exc:
        raise unreadable_file(file, exc) from None
    return conform(table, TABLES[name], where=str(file))


def nullable_dtype(arrow_type: pa.DataType):
    """The pandas nullable dtype for an Arrow column's type: ``Int8`` ... ``Int64`` for signed integers, ``boolean`` for
    booleans, None for any other type (pandas' default). Pass it as ``Table.to_pandas(types_mapper=nullable_dtype)``:
    an integer column with nulls stays exact integers with <NA> (not float64 with NaN). Imports pandas."""
    return _nullable_dtypes().get(arrow_type)


def _nullable_dtypes() -> dict:
    global _NULLABLE
    if _NULLABLE is None:
        import pandas as pd

        _NULLABLE = {pa.int8(): pd.Int8Dtype(), pa.int16(): pd.Int16Dtype(), pa.int32(): pd.Int32Dtype(), pa.int64(): pd.Int64Dtype(),
                     pa.bool_(): pd.BooleanDtype()}  # fmt: skip
    return _NULLABLE


_NULLABLE: dict | None = None  # built on first use: importing pandas costs the CLI's other commands time


def read_frame(path: str | os.PathLike, name: str, **kwargs):
    """``read_table`` / ``read_kernels`` as a pandas DataFrame with nullable dtypes (:func:`nullable_dtype`; imports pandas)."""
    table = read_kernels(path, **kwargs) if name == "kernels" else read_table(path, name)
    return table.to_pandas(types_mapper=nullable_dtype)
