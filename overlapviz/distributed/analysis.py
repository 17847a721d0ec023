"""Overlap metrics and explain on a Dask cluster, partition by partition, with the local path's results."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from overlapviz.analysis.rankwise import check_rank
from overlapviz.dataset import schema
from overlapviz.distributed.cluster import gather_in_order
from overlapviz.distributed.partitions import kernel_files, plan_batches, rank_of_file, read_file
from overlapviz.ingest.files import display

__all__ = ["analyze_on", "breakdown_on", "explain_on"]

_CHECKS = ("run_id", "rank", "start_ns", "end_ns", "bad", "kind")  # overlap_table's checks, in its order


def _analyze_batch(root: str, per: str, where: str, rels: list[str]):
    """``metrics.overlap_table`` of some kernels files; on bad rows, what is wrong with them
    (for the client to raise the local path's message over the whole dataset)."""
    from overlapviz.analysis import metrics

    columns = list(metrics.INPUT_COLUMNS) + (["step"] if per == "step" else [])
    parts = [read_file(root, rel, columns, ("run_id", "kind"), where) for rel in rels]
    table = parts[0] if len(parts) == 1 else pa.concat_tables(parts)
    try:
        return "ok", metrics.overlap_table(table, per=per)
    except ValueError as exc:
        return "bad", _problems(table, per, str(exc))


def _problems(table: pa.Table, per: str, message: str) -> dict:
    if per == "step" and table.column("step").null_count:
        table = table.filter(pc.is_valid(table.column("step")))
    facts = {c: table.column(c).null_count for c in ("run_id", "rank", "start_ns", "end_ns", "kind")}
    facts["message"] = message
    if not (facts["start_ns"] or facts["end_ns"]):
        start = table.column("start_ns").to_numpy()
        end = table.column("end_ns").to_numpy()
        bad = np.flatnonzero(end < start)
        facts["bad"] = len(bad)
        facts["first_bad"] = (int(end[bad[0]]), int(start[bad[0]])) if len(bad) else None
    return facts


def _raise_problems(dataset_path, problems: list[dict]) -> None:
    """The message ``metrics.overlap_table`` gives over the whole dataset, from its batches' facts."""
    for check in _CHECKS:
        if check == "bad":
            if any(p.get("start_ns") or p.get("end_ns") for p in problems):
                continue
            n = sum(p.get("bad", 0) for p in problems)
            if n:
                end, start = next(p["first_bad"] for p in problems if p.get("first_bad"))
                raise ValueError(f"{dataset_path}: kernels.end_ns < start_ns ({end} < {start}) in {n} rows")
            continue
        n = sum(p[check] for p in problems)
        if n:
            hint = " (ingest classifies every activity)" if check == "kind" else ""
            raise ValueError(f"{dataset_path}: kernels.{check}: {n} null values{hint}")
    raise ValueError(f"{dataset_path}: {problems[0]['message']}")


def analyze_on(client, dataset_path: str | os.PathLike, *, per: str = "rank", run_ids=None,
               progress: bool | None = False) -> pa.Table:  # fmt: skip
    """``metrics.analyze_table`` computed partition-wise on the cluster; the same table.

    Every metric is a function of one run x rank (x step) group, and every group lies in one
    kernels file: tasks compute ``overlap_table`` over batches of files, the client
    concatenates the groups and sorts them as the local path does.

    Raises
    ------
    ValueError
        As ``metrics.analyze_table``, with the same messages.
    """
    from overlapviz.analysis import metrics

    if per not in metrics.PER:
        raise ValueError(f"per={per!r}: expected one of {', '.join(metrics.PER)}")
    run_ids = metrics.check_runs(dataset_path, run_ids)
    files = kernel_files(dataset_path, run_ids)
    if not files:
        return metrics.analyze_table(dataset_path, per=per, run_ids=run_ids)  # nothing to spread
    root, batches, prefix = plan_batches(client, dataset_path, files, "analyze")
    results = gather_in_order(
        client, lambda: [client.submit(_analyze_batch, root, per, str(dataset_path), b, key=f"{prefix}-{i}", retries=0)
                         for i, b in enumerate(batches)],
        progress=progress, desc="analyze", what=lambda i: display(os.path.join(str(dataset_path), batches[i][0])))  # fmt: skip
    tables = [value for status, value in results if status == "ok"]
    problems = [value for status, value in results if status != "ok"]
    if problems:
        _raise_problems(dataset_path, problems)
    table = pa.concat_tables(tables)
    keys = ["run_id", "rank"] + (["step"] if per == "step" else [])
    table = table.sort_by([(k, "ascending") for k in keys])
    if table.num_rows and table.select(keys).group_by(keys).aggregate([]).num_rows != table.num_rows:
        raise ValueError(f"{dataset_path}: a run x rank has rows in more than one kernels file")
    return table


# --- explain ---------------------------------------------------------------------------------


def _explain_batch(root: str, kinds: tuple, where: str, items: list[tuple]) -> list[tuple]:
    """``explain.explain_rank`` of each ``(file, run_id, rank, device limits, carve-outs)``:
    ``(run_id, rank, frame, comm mask, instance keys)`` for each rank with kernels of ``kinds``."""
    from overlapviz.analysis import explain

    out = []
    for rel, run_id, rank, dev_limits, carveouts in items:
        k = read_file(root, rel, explain.READ, explain.DICTIONARY, where)
        if not k.num_rows:
            continue
        check_rank(k, rel, run_id, rank, where)
        part = explain.explain_rank(k, _rank_syncs(root, run_id, rank), dev_limits, carveouts, kinds)
        if part is not None:
            out.append((run_id, rank, part, *_comm_instances(part)))
    return out


def _rank_syncs(root: str, run_id: str, rank: int) -> pa.Table | None:
    """One rank's rows of the ``syncs`` table (row groups pruned by their statistics)."""
    path = os.path.join(root, "syncs.parquet")
    if "syncs" not in schema.TABLES or not os.path.exists(path):
        return None
    import pyarrow.dataset as pads

    data = pads.dataset(path, format="parquet")
    table = data.to_table(filter=(pads.field("run_id") == run_id) & (pads.field("rank") == rank))
    return schema.conform(table, schema.SYNCS, where=path)


# Peer matching split in two (``peers.attach_peer_wait`` over all ranks at once, the same
# arithmetic): each rank's instance keys and, per run x instance, the latest start and the
# number of ranks, reduced over the batches; then each rank's peer wait from that table.


def _comm_instances(frame):
    """``(comm mask, instance keys of the comm rows)`` of one rank's records (``peers.instance_keys``)."""
    from overlapviz.analysis import peers

    comm = (frame["kind"] == "comm").to_numpy() if "kind" in frame else np.ones(len(frame), bool)
    return comm, peers.instance_keys(frame[comm])


def _instance_table(parts: list[tuple], dom_of: dict):
    """Per run x instance of the comm kernels in ``parts``: the latest start, how many ranks had it and
    the least and greatest clock domain of its ranks (they differ: clocks that do not compare)."""
    import pandas as pd

    rows = []
    for run_id, rank, frame, comm, keys in parts:
        n = int(comm.sum())
        if n:
            rows.append(pd.DataFrame({"run_id": np.full(n, run_id, dtype=object), "instance": keys.to_numpy(object),
                                      "rank": np.full(n, rank, dtype=np.int64), "dom": dom_of.get((run_id, rank), ""),
                                      "start_ns": frame["start_ns"].to_numpy()[comm].astype(np.int64),
                                      "end_ns": frame["end_ns"].to_numpy()[comm].astype(np.int64)}))  # fmt: skip
    if not rows:
        return pd.DataFrame({"run_id": pd.Series(dtype=object), "instance": pd.Series(dtype=object),
                             "latest_ns": pd.Series(dtype=np.int64), "n_ranks": pd.Series(dtype=np.int64),
                             "dom_min": pd.Series(dtype=object), "dom_max": pd.Series(dtype=object),
                             "end_min": pd.Series(dtype=np.int64), "end_max": pd.Series(dtype=np.int64)})  # fmt: skip
    d = pd.concat(rows, ignore_index=True)
    # a rank arrives with its first kernel of the instance; each rank lies in one batch only, so its
    # arrival is whole here and the batches' rank counts add up to the run's
    d = d.groupby(["run_id", "instance", "rank"], sort=False).agg(start_ns=("start_ns", "min"), end_ns=("end_ns", "max"),
                                                                  dom=("dom", "first")).reset_index()  # fmt: skip
    g = d.groupby(["run_id", "instance"], sort=False)
    return g.agg(latest_ns=("start_ns", "max"), n_ranks=("rank", "nunique"), dom_min=("dom", "min"),
                 dom_max=("dom", "max"), end_min=("end_ns", "min"), end_max=("end_ns", "max")).reset_index()  # fmt: skip


def _merge_instances(*tables):
    import pandas as pd

    d = pd.concat(tables, ignore_index=True)
    return d.groupby(["run_id", "instance"], sort=False).agg(latest_ns=("latest_ns", "max"), n_ranks=("n_ranks", "sum"),
                                                             dom_min=("dom_min", "min"), dom_max=("dom_max", "max"),
                                                             end_min=("end_min", "min"), end_max=("end_max", "max")).reset_index()  # fmt: skip


def _with_peers(parts: list[tuple], instances, summary: bool, dom_of: dict) -> list:
    """The batch's records with ``instance`` and ``peer_wait_us``, its ranks' in one frame
    ``[(first run_id, first rank, frame)]`` (or, with ``summary``, each rank's ``explain.summarize`` row).

    One frame per task, not per rank: the client holds the same rows either way, but each
    frame it unpickles costs its own blocks, index and (unshared) strings, which made the
    client grow by ~85 KiB per rank at a fixed number of records (tracemalloc, 8 -> 512 ranks)."""
    import pandas as pd

    from overlapviz.analysis import explain, peers

    out = []
    for run_id, rank, frame, comm, keys in parts:
        inst = pd.Series(None, index=frame.index, dtype=object)
        peer = pd.array([pd.NA] * len(frame), dtype="Float64")
        if comm.any():
            found = pd.DataFrame({"run_id": np.full(int(comm.sum()), run_id, dtype=object), "instance": keys.to_numpy(object),
                                  "start_ns": frame["start_ns"].to_numpy()[comm].astype(np.int64)})  # fmt: skip
            arrival = found.groupby("instance", sort=False)["start_ns"].transform("min").to_numpy(np.int64)
            found = found.merge(instances, on=["run_id", "instance"], how="left", sort=False)
            wait_ns = found["latest_ns"].to_numpy().astype(np.int64) - arrival
            inst[comm] = keys.to_numpy(object)
            values = pd.array(wait_ns / 1000.0, dtype="Float64")
            apart = peers.ends_apart(found["end_min"], found["end_max"], found["latest_ns"])
            values[(found["n_ranks"].to_numpy() <= 1) | (found["dom_min"] != found["dom_max"]).to_numpy(bool) | apart] = pd.NA
            peer[np.flatnonzero(comm)] = values
        frame = frame.assign(instance=inst, peer_wait_us=peer,
                             clock_domain=np.full(len(frame), dom_of.get((run_id, rank), ""), dtype=object))  # fmt: skip
        out.append(explain.summarize(frame).to_dict("records")[0] if summary else (run_id, rank, frame))
    if summary or len(out) <= 1:
        return out
    out.sort(key=lambda p: (p[0], p[1]))  # explain's order: run, then rank
    return [(out[0][0], out[0][1], pd.concat([p[2] for p in out], ignore_index=True))]


def rank_items(dataset_path, files: list[str], device: str | None) -> list[tuple]:
    """``(file, run_id, rank, that rank's device limits, its run's carve-out)`` of each kernels file: what a task needs
    to compute per-rank occupancy (``occupancy.limits_for`` looks only at the rank's own limits and ``--device-name``'s).

    Raises
    ------
    ValueError
        ``device`` names no GPU (before any task); a file belongs to no run of the runs table.
    """
    from overlapviz.analysis.residency import ANY_RANK, device_table, run_carveouts

    dev_limits = device_table(dataset_path, device)  # a device name no GPU has: its ValueError, before any task
    given = {ANY_RANK: dev_limits.pop(ANY_RANK)} if ANY_RANK in dev_limits else {}
    carveouts = run_carveouts(dataset_path)
    by_rank: dict = {}
    for key, limits in dev_limits.items():
        by_rank.setdefault(key[:2], {})[key] = limits
    run_of_key = {schema.run_key(r): r for r in carveouts}
    items = []
    for rel in files:
        run_id = run_of_key.get(Path(rel).parent.name)
        rank = rank_of_file(rel)
        if run_id is None or rank < 0:
            raise ValueError(f"{dataset_path}: kernels file {rel} belongs to no run of the runs table")
        items.append((rel, run_id, rank, by_rank.get((run_id, rank), {}) | given, {run_id: carveouts[run_id]}))
    return items


def explain_on(client, dataset_path: str | os.PathLike, *, run_ids=None, kinds: tuple[str, ...] = ("comm",),
               device: str | None = None, summary: bool = False, progress: bool | None = False):  # fmt: skip
    """``explain.explain`` (``summary``: ``explain.summarize`` of it) on the cluster; the same frame.

    ``device`` names the GPU for ranks whose trace does not, as ``explain.explain``'s
    (``--device-name``): every task gets its ranks' own limits and those.

    Each task explains whole ranks (their kernels, syncs, device limits and carve-outs) and
    keeps the records on its worker. Matching a collective's instances across ranks needs
    every rank of the group: each batch's instance table (latest start and rank count per
    run x instance) is reduced over the batches on the workers, then each batch adds the
    peer wait to its ranks' records. The client receives the records (or, with ``summary``,
    one row per rank: the client's memory is then independent of the number of kernels).
    """
    import pandas as pd

    from overlapviz.analysis import clocks, explain, peers

    items = rank_items(dataset_path, kernel_files(dataset_path, run_ids), device)
    doms = clocks.clock_domains(dataset_path, run_ids)
    dom_of = {(r, int(k)): d for r, k, d in zip(doms["run_id"], doms["rank"], doms["clock_domain"])}
    results = []
    if items:
        root, batches, prefix = plan_batches(client, dataset_path, items, "explain")

        def submit():
            ranks = [client.submit(_explain_batch, root, tuple(kinds), str(dataset_path), b, key=f"{prefix}-{i}", retries=0)
                     for i, b in enumerate(batches)]  # fmt: skip
            tables = [client.submit(_instance_table, f, dom_of, key=f"{prefix}-instances-{i}") for i, f in enumerate(ranks)]
            level = 0
            while len(tables) > 1:  # a tree of merges: no one task (nor the client) takes every batch's table
                level += 1
                tables = [client.submit(_merge_instances, *tables[i : i + 8], key=f"{prefix}-merge{level}-{i}")
                          for i in range(0, len(tables), 8)]  # fmt: skip
            return [client.submit(_with_peers, f, tables[0], summary, dom_of, key=f"{prefix}-peers-{i}") for i, f in enumerate(ranks)]

        # every batch waits on every other's instance table: a failure is the dataset's (its ValueError names the file)
        for part in gather_in_order(client, submit, progress=progress, desc="explain", what=lambda i: display(dataset_path)):
            results.extend(part)
    if summary:
        results.sort(key=lambda row: (row["run_id"], row["rank"]))
        return pd.DataFrame(results)
    if not results:
        out = peers.attach_peer_wait(explain.empty_records())
    else:
        results.sort(key=lambda p: (p[0], p[1]))  # explain's order: run, then rank
        out = pd.concat([p[2] for p in results], ignore_index=True)
    return out[explain.KEYS + explain.EXTRA].sort_values(["run_id", "rank", "start_ns"], kind="stable").reset_index(drop=True)


# --- breakdown ---------------------------------------------------------------------------------


def _breakdown_batch(root: str, per: str, where: str, items: list[tuple], waits: dict) -> list[dict]:
    """``breakdown.group_rows`` of each ``(file, run_id, rank)``'s timeline (its instances' waits given)."""
    from overlapviz.analysis import breakdown as bd

    out = []
    for rel, run_id, rank in items:
        k = read_file(root, rel, bd.READ, bd.DICTIONARY, where)
        if not k.num_rows:
            continue
        check_rank(k, rel, run_id, rank, where)
        tl = bd.timeline_of(run_id, rank, k, _rank_syncs(root, run_id, rank), waits.get((run_id, rank)))
        out.extend(bd.group_rows(tl, per))
    return out


def breakdown_on(client, dataset_path: str | os.PathLike, *, run_ids=None, per: str = "rank", progress: bool | None = False):
    """``breakdown.breakdown`` on the cluster; the same frame.

    The client reads the communication rows alone (an instance's peer wait needs every rank's
    start of it) and sends each task its ranks' waits; each task labels its ranks' time.
    """
    from overlapviz.analysis import breakdown as bd

    if per not in ("rank", "step"):
        raise ValueError(f"per={per!r}: expected rank or step")
    files = kernel_files(dataset_path, run_ids)
    comm = schema.read_kernels(dataset_path, columns=bd.ARRIVAL_COLUMNS, run_ids=run_ids,
                               filter=pc.field("kind") == "comm").to_pandas()  # fmt: skip
    waits = bd.rank_waits(dataset_path, comm, run_ids)
    items = [(it[0], it[1], it[2]) for it in rank_items(dataset_path, files, None)]
    rows: list[dict] = []
    if items:
        root, batches, prefix = plan_batches(client, dataset_path, items, "breakdown")

        def submit():
            return [client.submit(_breakdown_batch, root, per, str(dataset_path), b,
                                  {(r, k): waits[(r, k)] for _, r, k in b if (r, k) in waits}, key=f"{prefix}-{i}", retries=0)
                    for i, b in enumerate(batches)]  # fmt: skip

        what = lambda i: display(os.path.join(str(dataset_path), batches[i][0][0]))
        for part in gather_in_order(client, submit, progress=progress, desc="breakdown", what=what):
            rows.extend(part)
    return bd.finish(dataset_path, rows, per, run_ids)
