"""What ingest adds to a reader's kernels before anything depends on them: kinds (by the run's rules), steps and collectives."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from overlapviz.domain.collectives import collective_names
from overlapviz.ingest.base import RankTrace
from overlapviz.domain.rules import RuleSet

__all__ = ["assign_steps", "finish_kernels", "set_column", "split_multi_gpu"]


def assign_steps(launch_ns: pa.Array | pa.ChunkedArray, steps: pa.Table | None) -> pa.Array:
    """The step whose host range ``[start_ns, end_ns)`` contains each launch time.

    Where steps nest or overlap, the innermost (the last started) containing step wins.
    Null where the launch time is null or outside every step. Vectorized: one
    ``searchsorted`` over the sorted launch times per step, never a loop over kernels.
    """
    launch = pa.array(launch_ns, pa.int64()) if not isinstance(launch_ns, (pa.Array, pa.ChunkedArray)) else launch_ns
    if isinstance(launch, pa.ChunkedArray):
        launch = launch.combine_chunks()
    n = len(launch)
    out = np.full(n, -1, dtype=np.int64)
    found = np.zeros(n, dtype=bool)
    if steps is not None and steps.num_rows and n:
        valid = np.asarray(launch.is_valid())
        values = np.asarray(launch.fill_null(0), dtype=np.int64)
        idx = np.flatnonzero(valid)
        order = idx[np.argsort(values[idx], kind="stable")]
        sorted_launch = values[order]
        st = steps.sort_by([("start_ns", "ascending")])  # later-started steps overwrite earlier ones
        for s, a, b in zip(
            st.column("step").to_numpy(zero_copy_only=False),
            st.column("start_ns").to_numpy(zero_copy_only=False),
            st.column("end_ns").to_numpy(zero_copy_only=False),
        ):
            lo, hi = np.searchsorted(sorted_launch, [a, b], side="left")
            out[order[lo:hi]] = s
            found[order[lo:hi]] = True
    return pa.array(out, pa.int64(), mask=~found)


def finish_kernels(trace: RankTrace, rules: RuleSet) -> pa.Table:
    """A reader's kernels with ``kind``, ``step`` and (comm only) ``collective`` filled in.

    Host ``user_annotation`` ranges that the rules call ``other`` are dropped: in a
    CPU-only trace they are labels (``## forward ##``, a user's ``record_function``), not
    activities; the ones the rules make comm or compute (``gloo:all_reduce``) stay.
    """
    k = trace.kernels
    kind = _tagged_comm(k, rules.classify(k.column("name"), k.column("category")))
    if TAGGED in k.column_names:
        k = k.drop_columns([TAGGED])
    if "is_host" in k.column_names and k.num_rows:
        label = pc.and_(
            pc.and_(pc.fill_null(k.column("is_host"), False), pc.equal(k.column("category"), "user_annotation")),
            pc.equal(kind, "other"),
        )
        label = pc.fill_null(label, False)
        if pc.any(label).as_py():
            keep = pc.invert(label)
            k, kind = k.filter(keep), kind.filter(keep)
    launch = k.column("launch_ns") if "launch_ns" in k.column_names else pa.nulls(k.num_rows, pa.int64())
    step = assign_steps(launch, trace.steps)
    k = set_column(k, "kind", kind)
    k = set_column(k, "step", step)
    k = set_column(k, "collective", _comm_collectives(k, kind))
    # what a reader linked from record_param_comms belongs to communication kernels only
    # (the reader links every GPU row of the op; the run's rules say which are comm)
    comm = pc.fill_null(pc.equal(kind, "comm"), False)
    for name in COMM_FIELDS:
        if name in k.column_names and k.column(name).null_count < k.num_rows:
            col = k.column(name)
            k = set_column(k, name, pc.if_else(comm, col, pa.nulls(k.num_rows, col.type)))
    return k


# a reader's per-row flag: the activity itself carries a collective's metadata (Kineto's
# "Collective name" in the activity's args; a memcpy launched inside a ``nccl:*`` range)
TAGGED = "comm_tagged"


def _tagged_comm(k: pa.Table, kind: pa.Array) -> pa.Array:
    """``kind`` with every GPU activity the reader flagged as carrying a collective made ``comm``.

    DESIGN.md: an activity that carries the collective's metadata is communication of that
    collective whatever its name -- RCCL's copy-engine collectives run as
    ``__amd_rocclr_copyBufferBatch.kd`` kernels, NCCL's copy-engine and P2P paths as memcpys.
    Host activities stay as the rules say.
    """
    if TAGGED not in k.column_names or not k.num_rows:
        return kind
    tagged = pc.fill_null(k.column(TAGGED), False)
    if "is_host" in k.column_names:
        tagged = pc.and_(tagged, pc.invert(pc.fill_null(k.column("is_host"), False)))
    if not pc.any(tagged).as_py():
        return kind
    return pc.if_else(tagged, pa.scalar("comm"), kind)


COMM_FIELDS = ("comm_group", "comm_group_ranks", "comm_group_size", "comm_seq", "comm_in_elems", "comm_out_elems", "comm_dtype")


def _comm_collectives(k: pa.Table, kind: pa.Array) -> pa.Array:
    """The collective of each comm row (from its name, else the reader's ``collective``); null elsewhere."""
    n = k.num_rows
    comm = np.asarray(pc.equal(kind, "comm").fill_null(False), dtype=bool) if n else np.zeros(0, bool)
    rows = np.flatnonzero(comm)
    if not len(rows):
        return pa.nulls(n, pa.string())
    take = pa.array(rows)
    names = k.column("name").take(take)
    given = k.column("collective").take(take) if "collective" in k.column_names else pa.nulls(len(rows), pa.string())
    found = pc.coalesce(collective_names(names), collective_names(given))
    slot = np.full(n, -1, np.int64)
    slot[rows] = np.arange(len(rows))
    return found.take(pa.array(slot, mask=slot < 0))


def set_column(table: pa.Table, name: str, column) -> pa.Table:
    if name in table.column_names:
        return table.set_column(table.column_names.index(name), name, column)
    return table.append_column(name, column)


def split_multi_gpu(traces: list[RankTrace], rules: RuleSet) -> list[RankTrace]:
    """One rank per GPU for a process that drives a collective on several GPUs itself.

    Profilers of processes (rocprof) see one trace per process, but overlap is a per-GPU
    question: a single process running RCCL over several GPUs (``ncclCommInitAll``,
    rccl-tests' ``-g N``) would otherwise have GPU 1's communication "overlap" GPU 0's
    computation. Such a process (communication kernels, by the run's ``rules``, on two or
    more devices) becomes one rank per device, numbered by device index; activities
    without a device go with the first. Processes whose rank is known, or that only touch
    a second GPU in passing (no collective there), stay one rank.
    """
    out = []
    for t in traces:
        k = t.kernels
        if t.rank is not None or k.num_rows == 0:
            out.append(t)
            continue
        device = k.column("device")
        comm = pc.and_(pc.equal(rules.classify(k.column("name"), k.column("category")), "comm"),
                       pc.equal(k.column("category"), "kernel"))  # fmt: skip
        comm_devices = pc.unique(device.filter(pc.fill_null(comm, False)).drop_null())
        if len(comm_devices) < 2:
            out.append(t)
            continue
        devices = sorted(pc.unique(device.drop_null()).to_pylist())
        for i, dev in enumerate(devices):
            mask = pc.fill_null(pc.equal(device, dev), False)
            if i == 0:
                mask = pc.or_(mask, pc.is_null(device))
            dev_rows = t.devices
            if dev_rows is not None and dev_rows.num_rows:
                dev_rows = dev_rows.filter(pc.fill_null(pc.equal(dev_rows.column("device"), dev), False))
            part = k.filter(mask)
            out.append(RankTrace(rank=int(dev), kernels=part, steps=t.steps, devices=dev_rows,
                                 info=t.info | {"n_events": part.num_rows}))  # fmt: skip
    return out
