"""Speedup over runs: median iteration time with bootstrap confidence intervals, TimeRatio vs sequential, speedup vs baseline overlap, and side-by-side comparison."""

from __future__ import annotations

import os
import threading
from collections import OrderedDict

import numpy as np
import pandas as pd

from overlapviz.dataset import schema
from overlapviz.analysis.statistics import (
    DEFAULT_LEVEL,
    DEFAULT_RESAMPLES,
    DEFAULT_SEED,
    bootstrap_difference,
    bootstrap_median,
    bootstrap_ratio,
    check_level,
)

# runs with equal values here run the same workload; only the overlap setup and its knobs differ
# (dtype and the SM-partitioning controls come from each collected run's manifest config: runs_frame)
WORKLOAD_KEY = (
    "workload", "compute_impl", "dtype", "gemm_m", "gemm_n", "gemm_k", "tile_m", "tile_n", "tile_k",
    "collective", "message_bytes", "world_size", "backend", "stand_in", "device_name",
)
CONFIG_COLUMNS = (
    "workload", "setup", "compute_impl", "gemm_m", "gemm_n", "gemm_k", "tile_m", "tile_n", "tile_k",
    "smem_pad_bytes", "comm_priority", "comm_priority_effective", "collective", "message_bytes",
    "sm_carveout", "world_size", "backend", "stand_in", "device_name",
    "dtype", "green_ctx_sms", "cuda_max_connections", "launch_order", "smem_carveout_percent",
)


def iteration_times(dataset_path: str | os.PathLike, *, run_ids=None) -> pd.DataFrame:
    """Measured iteration times of each run, one row per run x iteration.

    Warm-up rows (``measured`` false or null) are dropped. An iteration that several
    ranks timed takes the slowest rank's time: the iteration is over when every rank is.

    Returns
    -------
    pandas.DataFrame
        ``run_id, iteration, time_ms, n_ranks``.
    """
    it = schema.read_frame(dataset_path, "iterations")
    if run_ids is not None:
        it = it[it["run_id"].isin(list(run_ids))]
    it = it[it["measured"].fillna(False).astype(bool) & it["time_ms"].notna()]
    return (
        it.groupby(["run_id", "iteration"], sort=True)
        .agg(time_ms=("time_ms", "max"), n_ranks=("rank", "nunique"))
        .reset_index()
    )


def _is_reference(runs: pd.DataFrame, setup: str) -> pd.Series:
    pad = runs["smem_pad_bytes"].fillna(0) == 0
    prio = runs["comm_priority"].fillna(0) == 0
    return (runs["setup"] == setup) & pad & prio


# the computation's own configuration: a run's slowdown is measured against the sequential
# run that ran the very same computation kernel
COMPUTE_KEY = ("smem_pad_bytes", "sm_carveout")


# configuration fields a collected run's manifest holds (config_json) beyond the runs table's columns
MANIFEST_CONFIG = ("dtype", "green_ctx_sms", "cuda_max_connections", "launch_order", "smem_carveout_percent")


def runs_frame(dataset_path: str | os.PathLike) -> pd.DataFrame:
    """The runs table with ``MANIFEST_CONFIG`` columns from each collected run's manifest (null elsewhere)."""
    import json

    runs = schema.read_frame(dataset_path, "runs")
    extra = {c: [] for c in MANIFEST_CONFIG}
    for text in runs["config_json"] if "config_json" in runs else [None] * len(runs):
        try:
            config = (json.loads(text) or {}).get("config") or {} if isinstance(text, str) and text else {}
        except ValueError:
            config = {}
        for c in MANIFEST_CONFIG:
            extra[c].append(config.get(c) if isinstance(config, dict) else None)
    return runs.assign(**{c: pd.Series(v, index=runs.index, dtype=object) for c, v in extra.items() if c not in runs})


def _key_frame(runs: pd.DataFrame, columns=WORKLOAD_KEY) -> pd.Series:
    """One hashable key per run from its workload columns (nulls compare equal)."""
    parts = [runs[c].astype("string").fillna("\x00null") for c in columns]
    key = parts[0]
    for p in parts[1:]:
        key = key + "\x1f" + p
    return key


def _references(runs: pd.DataFrame, setup: str) -> dict:
    """workload key -> list of reference run ids (all that match; their iterations are pooled)."""
    key = _key_frame(runs)
    ref = runs[_is_reference(runs, setup)]
    return {k: sorted(g["run_id"].tolist()) for k, g in ref.assign(_k=key[ref.index]).groupby("_k")}


def _overlap_by_run(dataset_path, run_ids, analyze=None) -> pd.DataFrame:
    """Run-level overlap from overlapviz.analysis.metrics: sums over ranks, and the median step's compute time."""
    if analyze is None:
        from overlapviz.analysis.metrics import analyze  # analysis owns the metric; we only aggregate it

    per_rank = analyze(dataset_path, per="rank", run_ids=run_ids)
    g = per_rank.groupby("run_id")
    comm, overlap = g["comm_us"].sum(), g["overlap_us"].sum()
    out = pd.DataFrame({"overlap_fraction": (overlap / comm.where(comm > 0)).astype("Float64"), "comm_us": g["comm_us"].mean(), "compute_us": g["compute_us"].mean(), "exposed_comm_us": g["exposed_comm_us"].mean()})
    per_step = analyze(dataset_path, per="step", run_ids=run_ids)
    if len(per_step):
        out = out.join(per_step.groupby("run_id")["compute_us"].median().rename("step_compute_us"))
    else:
        out = out.assign(step_compute_us=np.nan)
    return out


def config_table(
    dataset_path: str | os.PathLike,
    *,
    level: float = DEFAULT_LEVEL,
    n_resamples: int = DEFAULT_RESAMPLES,
    seed: int = DEFAULT_SEED,
    run_ids=None,
    analyze=None,
) -> pd.DataFrame:
    """One row per run: configuration, median iteration time with its CI, TimeRatio, speedup, overlap, slowdown.

    Definitions (DESIGN.md): t = median measured iteration time (see
    :func:`iteration_times`); ``time_ratio = t(run) / t(sequential)``; ``speedup =
    t(baseline) / t(run)``. The references are the runs with the same workload key
    (``WORKLOAD_KEY``), ``setup`` "sequential" (TimeRatio) or "baseline" (speedup),
    ``smem_pad_bytes`` 0 or null and ``comm_priority`` 0 or null; several matching runs
    are pooled. Where no reference exists the ratio and its CI are null (never a
    default). Confidence intervals are percentile bootstraps at ``level``
    (:func:`bootstrap_median`, :func:`bootstrap_ratio`), seeded by ``seed``.

    ``overlap_fraction`` is overlapviz.analysis.metrics' overlap summed over the run's ranks
    (sum overlap_us / sum comm_us) over the whole trace; ``compute_slowdown`` is the
    median per-step compute time (metrics, ``per="step"``) of the run over that of the
    sequential run of the same workload *and the same computation* (same
    ``smem_pad_bytes`` and ``sm_carveout``, any priority; ``slowdown_run_id``): > 1 means
    the same computation kernels ran slower beside communication. Both are null where the
    run has no kernels (or no steps, or no such sequential run, for the slowdown).

    ``analyze``: ``metrics.analyze`` by default, or a function giving the same frames (the dashboard's
    ``serve --scheduler`` computes them on a Dask cluster: no kernel is read here then).

    Returns
    -------
    pandas.DataFrame
        ``run_id``, the ``CONFIG_COLUMNS``, ``n_iterations, median_ms, ci_low_ms,
        ci_high_ms, sequential_run_id, time_ratio, time_ratio_ci_low, time_ratio_ci_high,
        baseline_run_id, speedup, speedup_ci_low, speedup_ci_high, overlap_fraction,
        slowdown_run_id, compute_slowdown, level``; sorted by benefit (speedup, then TimeRatio, best first;
        nulls last).
    """
    check_level(level)
    if run_ids is not None:
        _require_runs(dataset_path, schema.read_frame(dataset_path, "runs"), run_ids)
    out = _config_table_once(dataset_path, level, n_resamples, seed, analyze)
    if run_ids is not None:
        out = out[out["run_id"].isin(list(run_ids))].reset_index(drop=True)
    return out


_TABLES: OrderedDict = OrderedDict()  # (dataset, its stamp, level, resamples, seed) -> config table
_TABLES_LOCK = threading.Lock()
_KEEP_TABLES = 8


def _dataset_stamp(dataset_path) -> tuple:
    """Changes whenever the dataset is written again (ingest and ``--append`` replace dataset.json)."""
    meta = os.stat(os.path.join(dataset_path, schema.METADATA_FILE))
    return os.path.realpath(dataset_path), meta.st_mtime_ns, meta.st_size, meta.st_ino


def _config_table_once(dataset_path, level: float, n_resamples: int, seed: int, analyze=None) -> pd.DataFrame:
    """``config_table`` of the whole dataset, computed once per dataset state and parameters in this process (compare
    asks for it for every pair); each caller gets its own copy."""
    try:
        key = (_dataset_stamp(dataset_path), float(level), int(n_resamples), int(seed))
    except OSError:  # not a dataset: the reader below says so
        key = None
    with _TABLES_LOCK:
        if key is not None and key in _TABLES:
            _TABLES.move_to_end(key)
            return _TABLES[key].copy()
    table = _compute_config_table(dataset_path, level=level, n_resamples=n_resamples, seed=seed, analyze=analyze)
    if key is not None:
        with _TABLES_LOCK:
            _TABLES[key] = table
            while len(_TABLES) > _KEEP_TABLES:
                _TABLES.popitem(last=False)
    return table.copy()


def _compute_config_table(dataset_path, *, level: float, n_resamples: int, seed: int, analyze=None) -> pd.DataFrame:
    runs = runs_frame(dataset_path)
    times = iteration_times(dataset_path)
    samples = {r: g["time_ms"].to_numpy(np.float64) for r, g in times.groupby("run_id")}
    key = _key_frame(runs)
    seq_refs, base_refs = _references(runs, "sequential"), _references(runs, "baseline")
    same_compute = _key_frame(runs.assign(smem_pad_bytes=runs["smem_pad_bytes"].fillna(0)), WORKLOAD_KEY + COMPUTE_KEY)
    seq = runs["setup"] == "sequential"
    slow_refs = {k: sorted(g["run_id"].tolist()) for k, g in runs[seq].assign(_k=same_compute[seq]).groupby("_k")}
    try:
        overlap = _overlap_by_run(dataset_path, None, analyze)
    except ValueError:
        overlap = pd.DataFrame(columns=["overlap_fraction", "step_compute_us"])

    def pooled(ids):
        parts = [samples[r] for r in ids if r in samples]
        return np.concatenate(parts) if parts else np.empty(0)

    rows = []
    for i, run in runs.iterrows():  # one row per run (a handful), not per event
        run_id = run["run_id"]
        x = samples.get(run_id, np.empty(0))
        med, lo, hi = bootstrap_median(x, level=level, n_resamples=n_resamples, seed=seed)
        rec = {"run_id": run_id, **{c: run.get(c) for c in CONFIG_COLUMNS}, "n_iterations": len(x),
               "median_ms": med, "ci_low_ms": lo, "ci_high_ms": hi}
        for name, refs, num_is_run in (("time_ratio", seq_refs, True), ("speedup", base_refs, False)):
            ref_ids = refs.get(key[i], [])
            ref = pooled(ref_ids)
            if run_id in ref_ids and len(ref_ids) == 1:
                value = (1.0, 1.0, 1.0) if len(x) else (np.nan,) * 3
            elif num_is_run:
                value = bootstrap_ratio(x, ref, level=level, n_resamples=n_resamples, seed=seed)
            else:
                value = bootstrap_ratio(ref, x, level=level, n_resamples=n_resamples, seed=seed)
            label = "sequential_run_id" if name == "time_ratio" else "baseline_run_id"
            rec[label] = ",".join(ref_ids) if ref_ids else None
            rec[name], rec[f"{name}_ci_low"], rec[f"{name}_ci_high"] = value
        ov = overlap.loc[run_id] if run_id in overlap.index else None
        rec["overlap_fraction"] = None if ov is None or pd.isna(ov["overlap_fraction"]) else float(ov["overlap_fraction"])
        seq_ids = slow_refs.get(same_compute[i], [])
        rec["slowdown_run_id"] = ",".join(seq_ids) if seq_ids else None
        seq_compute = [overlap.loc[r, "step_compute_us"] for r in seq_ids if r in overlap.index]
        seq_compute = [v for v in seq_compute if pd.notna(v)]
        mine = None if ov is None else ov["step_compute_us"]
        rec["compute_slowdown"] = (
            float(mine / np.median(seq_compute)) if seq_compute and pd.notna(mine) and np.median(seq_compute) > 0 else None
        )
        rec["level"] = level
        rows.append(rec)
    out = pd.DataFrame(rows, columns=_table_columns())
    for c in ("median_ms", "ci_low_ms", "ci_high_ms", "time_ratio", "time_ratio_ci_low", "time_ratio_ci_high",
              "speedup", "speedup_ci_low", "speedup_ci_high", "overlap_fraction", "compute_slowdown"):
        out[c] = pd.to_numeric(out[c], errors="coerce").astype("Float64")
    out = out.sort_values(["speedup", "time_ratio", "run_id"], ascending=[False, True, True], na_position="last", kind="stable")
    return out.reset_index(drop=True)


def _table_columns() -> list[str]:
    return (
        ["run_id", *CONFIG_COLUMNS, "n_iterations", "median_ms", "ci_low_ms", "ci_high_ms",
         "sequential_run_id", "time_ratio", "time_ratio_ci_low", "time_ratio_ci_high",
         "baseline_run_id", "speedup", "speedup_ci_low", "speedup_ci_high",
         "overlap_fraction", "slowdown_run_id", "compute_slowdown", "level"]
    )


def _require_runs(dataset_path, runs: pd.DataFrame, run_ids) -> None:
    known = set(runs["run_id"])
    for r in run_ids:
        if r not in known:
            raise ValueError(f"{dataset_path}: no run {r!r} (runs: {', '.join(sorted(known)) or 'none'})")


def compare(
    dataset_path: str | os.PathLike,
    run_a: str,
    run_b: str,
    *,
    level: float = DEFAULT_LEVEL,
    n_resamples: int = DEFAULT_RESAMPLES,
    seed: int = DEFAULT_SEED,
    table: pd.DataFrame | None = None,
    analyze=None,
    explain=None,
) -> pd.DataFrame:
    """Two runs side by side: configuration differences, metrics, deltas and intervals.

    Parameters
    ----------
    run_a, run_b
        Run ids; ``delta = b − a`` and ``ratio = b / a``.
    table
        ``config_table(dataset_path, level=level, n_resamples=n_resamples, seed=seed)`` when the caller already
        has it (a dashboard keeps it); otherwise it is computed, once per dataset and parameters in this process.
    analyze, explain
        ``metrics.analyze`` and ``explain.explain`` by default, or functions giving the same frames (``serve
        --scheduler`` computes them on a Dask cluster).

    Returns
    -------
    pandas.DataFrame
        One row per item, columns ``section`` (``config`` for configuration columns that
        differ, ``time`` for iteration time, ``metric`` for the rest), ``item``, ``a``,
        ``b``, ``delta``, ``delta_ci_low``, ``delta_ci_high``, ``ratio``. The iteration
        time row carries the bootstrap interval of the difference of medians (ms) at
        ``level``; ``a_ci_low``..``b_ci_high`` give each run's own interval. Metrics a run
        lacks are null, and so are their deltas.

    Raises
    ------
    ValueError
        When a run id is not in the dataset.
    """
    runs = schema.read_frame(dataset_path, "runs")
    _require_runs(dataset_path, runs, [run_a, run_b])
    if table is None:
        table = config_table(dataset_path, level=level, n_resamples=n_resamples, seed=seed)  # computed once per dataset
    table = table.set_index("run_id")
    a, b = table.loc[run_a], table.loc[run_b]
    rows = []
    for c in CONFIG_COLUMNS:
        va, vb = a[c], b[c]
        if not (_null(va) and _null(vb)) and (_null(va) or _null(vb) or va != vb):
            rows.append({"section": "config", "item": c, "a": _py(va), "b": _py(vb)})
    times = iteration_times(dataset_path, run_ids=[run_a, run_b])
    xa = times.loc[times["run_id"] == run_a, "time_ms"].to_numpy()
    xb = times.loc[times["run_id"] == run_b, "time_ms"].to_numpy()
    d, dlo, dhi = bootstrap_difference(xa, xb, level=level, n_resamples=n_resamples, seed=seed)
    rows.append({"section": "time", "item": "median_ms", "a": _py(a["median_ms"]), "b": _py(b["median_ms"]),
                 "delta": _py(d), "delta_ci_low": _py(dlo), "delta_ci_high": _py(dhi),
                 "a_ci_low": _py(a["ci_low_ms"]), "a_ci_high": _py(a["ci_high_ms"]),
                 "b_ci_low": _py(b["ci_low_ms"]), "b_ci_high": _py(b["ci_high_ms"])})
    extra = _run_metrics(dataset_path, [run_a, run_b], analyze, explain)
    for item in ("time_ratio", "speedup", "overlap_fraction", "compute_slowdown"):
        row = {"section": "metric", "item": item, "a": _py(a[item]), "b": _py(b[item])}
        if item in ("time_ratio", "speedup"):
            row.update(a_ci_low=_py(a[f"{item}_ci_low"]), a_ci_high=_py(a[f"{item}_ci_high"]),
                       b_ci_low=_py(b[f"{item}_ci_low"]), b_ci_high=_py(b[f"{item}_ci_high"]))
        rows.append(row)
    for item in ("comm_us", "compute_us", "exposed_comm_us", "median_start_delay_us", "p95_start_delay_us", "n_comm_blocked"):
        rows.append({"section": "metric", "item": item, "a": _py(extra.get(run_a, {}).get(item)), "b": _py(extra.get(run_b, {}).get(item))})
    out = pd.DataFrame(rows, columns=["section", "item", "a", "b", "delta", "delta_ci_low", "delta_ci_high", "ratio",
                                      "a_ci_low", "a_ci_high", "b_ci_low", "b_ci_high"])
    num = out["section"] != "config"
    fa = pd.to_numeric(out.loc[num, "a"], errors="coerce")
    fb = pd.to_numeric(out.loc[num, "b"], errors="coerce")
    out.loc[num, "delta"] = out.loc[num, "delta"].where(out.loc[num, "delta"].notna(), fb - fa)
    out.loc[num, "ratio"] = fb / fa.where(fa != 0)
    return out


def _run_metrics(dataset_path, run_ids, analyze=None, explain=None) -> dict:
    """Per run: mean per-rank comm/compute/exposed time (metrics) and start-delay summary (explain)."""
    from overlapviz.analysis.explain import comm_start_delays, summarize_delays

    out: dict = {r: {} for r in run_ids}
    try:
        ov = _overlap_by_run(dataset_path, run_ids, analyze)
    except ValueError:
        ov = pd.DataFrame()
    for r in run_ids:
        if r in ov.index:
            out[r].update({c: ov.loc[r, c] for c in ("comm_us", "compute_us", "exposed_comm_us")})
    delays = (explain or comm_start_delays)(dataset_path, run_ids=run_ids)
    if len(delays):
        s = summarize_delays(delays).groupby("run_id").agg(
            median_start_delay_us=("median_start_delay_us", "median"),
            p95_start_delay_us=("p95_start_delay_us", "max"),
            n_comm_blocked=("n_blocked", "sum"),
        )
        for r in run_ids:
            if r in s.index:
                out[r].update(s.loc[r].to_dict())
    return out


def _null(v) -> bool:
    return v is None or (not isinstance(v, str) and pd.isna(v))


def _py(v):
    """A plain Python value (None for any null) for mixed-type columns and JSON."""
    if _null(v):
        return None
    if isinstance(v, np.generic):
        return v.item()
    return v
