"""The table of a collected sweep: configuration (workload, GEMM, shaping, controls, setup), time, TimeRatio, speedup, overlap, comm start delay.

    python -P -m overlapviz.collectors.report DATASET [--best | --controls] [--workload W] [--format markdown|csv|json]
    overlapviz collect --sweep FILE -o DIR --report            # the same table after a sweep

The numbers come from the analysis layer (overlapviz.analysis.speedup.config_table,
overlapviz.analysis.explain.comm_start_delays); this module only joins and formats them,
with the configuration read from each run's manifest (``runs.config_json``). Failed runs
are listed with their errors, never as rows of empty numbers.
"""

from __future__ import annotations

import argparse
import json
import re
import sys

import pandas as pd

WORKLOAD_ORDER = {"cb-ar": 0, "mb-ar": 1, "cb-a2a": 2, "mb-a2a": 3}
SETUP_ORDER = {"sequential": 0, "baseline": 1, "optimized": 2}
DTYPE_SHORT = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


def _manifest(config_json) -> dict:
    try:
        doc = json.loads(config_json) if isinstance(config_json, str) and config_json else {}
    except ValueError:
        doc = {}
    return doc if isinstance(doc, dict) else {}


def gemm_label(config: dict) -> str:
    """``tiled 64x64x32 fp32`` or ``torch.matmul bf16`` (the vendor library's GEMM)."""
    dtype = DTYPE_SHORT.get(config.get("dtype") or "float32", config.get("dtype"))
    if config.get("compute_impl", "tiled") == "tiled":
        return f"tiled {config.get('tile_m')}x{config.get('tile_n')}x{config.get('tile_k')} {dtype}"
    return f"torch.matmul {dtype}"


def controls_label(config: dict, effective: dict) -> str:
    """The controls beside priority and shaping, requested (effective where it differs); ``-`` for none."""
    controls = (effective or {}).get("controls") or {}
    parts = []
    if config.get("sm_carveout") is not None:
        parts.append(f"cuBLAS SM carve-out {config['sm_carveout']}"
                     + ("" if (controls.get("sm_carveout") or {}).get("applied", True) else " (not applied)"))
    if config.get("smem_carveout_percent") is not None:
        applied = (effective or {}).get("smem_carveout_applied", True)
        parts.append(f"smem carve-out {config['smem_carveout_percent']} %" + ("" if applied else " (not applied)"))
    if config.get("green_ctx_sms") is not None:
        got = (controls.get("green_ctx_sms") or {}).get("effective")
        parts.append(f"green ctx {config['green_ctx_sms']} SMs" + (f" (got {got})" if got not in (None, config["green_ctx_sms"]) else ""))
    if config.get("cuda_max_connections") is not None:
        parts.append(f"max connections {config['cuda_max_connections']}")
    if config.get("launch_order") == "comm-first":
        parts.append("comm launched first")
    return " + ".join(parts) or "-"


def _config_frame(runs: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for run_id, cj in zip(runs["run_id"], runs["config_json"] if "config_json" in runs else [None] * len(runs)):
        doc = _manifest(cj)
        config, effective = doc.get("config") or {}, doc.get("effective") or {}
        gemm_facts = (effective.get("kernels") or {}).get("gemm") or {}
        rows.append({
            "run_id": run_id,
            "gemm": gemm_label(config) if config else None,
            "dtype": config.get("dtype"),
            "controls": controls_label(config, effective) if config else "-",
            "gemm_blocks_per_sm": gemm_facts.get("blocks_per_sm"),
            "green_ctx_sms": config.get("green_ctx_sms"),
            "green_ctx_sms_effective": ((effective.get("controls") or {}).get("green_ctx_sms") or {}).get("effective"),
            "cuda_max_connections": config.get("cuda_max_connections"),
            "smem_carveout_percent": config.get("smem_carveout_percent"),
            "launch_order": config.get("launch_order"),
        })
    return pd.DataFrame(rows, columns=["run_id", "gemm", "dtype", "controls", "gemm_blocks_per_sm", "green_ctx_sms",
                                       "green_ctx_sms_effective", "cuda_max_connections", "smem_carveout_percent",
                                       "launch_order"])


def failures(dataset_path) -> pd.DataFrame:
    """The failed runs: ``run_id, workload, setup, gemm, controls, error``."""
    from overlapviz.dataset import schema

    runs = schema.read_frame(dataset_path, "runs")
    bad = runs[runs["status"].fillna("ok") != "ok"]
    conf = _config_frame(bad)
    out = bad[["run_id", "workload", "setup", "error"]].merge(conf[["run_id", "gemm", "controls"]], on="run_id", how="left")
    return out[["run_id", "workload", "setup", "gemm", "controls", "error"]].reset_index(drop=True)


def sweep_table(dataset_path) -> pd.DataFrame:
    """One row per finished (ok) run: configuration, median [CI] ms, TimeRatio [CI], speedup [CI], overlap, comm start delay.

    ``comm_start_delay_us`` is the median over the run's comm kernels (traced pass) whose
    ready time is their launch call, where a run has any (the collector synchronizes
    between traced iterations, so in its recordings all are); otherwise over all its comm
    kernels; ``n_delay_kernels`` says how many. ``gemm_blocks_per_sm`` is the tiled GEMM's
    resident blocks per SM from the run's manifest (cudaOccupancyMaxActiveBlocksPerMultiprocessor),
    null for the vendor GEMM. ``controls`` names the controls beside priority and shaping
    (cuBLAS SM carve-out, shared-memory carve-out, green context, CUDA_DEVICE_MAX_CONNECTIONS,
    launch order). TimeRatio and speedup are config_table's (references: the same workload's
    unshaped sequential / baseline run; ``sequential_run_id``, ``baseline_run_id``).
    """
    from overlapviz.dataset import schema
    from overlapviz.analysis.speedup import config_table

    runs = schema.read_frame(dataset_path, "runs")
    ok_ids = set(runs.loc[runs["status"].fillna("ok") == "ok", "run_id"])
    table = config_table(dataset_path)
    table = table[table["run_id"].isin(ok_ids)]
    if table.empty:
        return table.assign(gemm=pd.Series(dtype=object))
    try:
        from overlapviz.analysis.explain import comm_start_delays

        d = comm_start_delays(dataset_path)
        at_launch = d["ready_from"].eq("launch")
        use = at_launch | ~at_launch.groupby(d["run_id"]).transform("any")
        g = d[use].groupby("run_id")["start_delay_us"]
        delays = pd.DataFrame({"comm_start_delay_us": g.median(), "n_delay_kernels": g.size()})
    except ValueError:  # no kernels at all (e.g. only host activities): no delays to show
        delays = pd.DataFrame(columns=["comm_start_delay_us", "n_delay_kernels"])
    conf = _config_frame(runs).set_index("run_id")
    # config_table already carries the manifest's configuration columns (dtype, controls): keep its values
    conf = conf.drop(columns=[c for c in conf.columns if c in table.columns])
    out = table.join(delays, on="run_id").join(conf, on="run_id")
    out = out.assign(
        _w=out["workload"].map(WORKLOAD_ORDER).fillna(9),
        _i=out["compute_impl"].map({"tiled": 0, "vendor": 1}).fillna(2),
        _s=out["setup"].map(SETUP_ORDER).fillna(9),
        _p=pd.to_numeric(out["smem_pad_bytes"], errors="coerce").fillna(0),
    )
    out = out.sort_values(["_w", "_i", "gemm", "_p", "_s", "controls", "comm_priority"],
                          ascending=[True, True, True, True, True, True, False], kind="stable")
    return out.drop(columns=["_w", "_i", "_s", "_p"]).reset_index(drop=True)


def best_table(table: pd.DataFrame) -> pd.DataFrame:
    """Per workload and GEMM: the sequential time, the baseline's and the best run's TimeRatio, and what the best run used."""
    rows = []
    for (workload, gemm), g in table.groupby(["workload", "gemm"], sort=False):
        seq = g[(g["setup"] == "sequential") & (pd.to_numeric(g["smem_pad_bytes"], errors="coerce").fillna(0) == 0)]
        base = g[(g["setup"] == "baseline") & (pd.to_numeric(g["smem_pad_bytes"], errors="coerce").fillna(0) == 0)]
        ranked = g[g["time_ratio"].notna()].sort_values("time_ratio", kind="stable")
        if ranked.empty:
            continue
        best = ranked.iloc[0]
        rows.append({
            "workload": workload, "gemm": gemm,
            "sequential_ms": seq["median_ms"].iloc[0] if len(seq) else None,
            "baseline_time_ratio": base["time_ratio"].iloc[0] if len(base) else None,
            "best_setup": best["setup"], "best_pad_kib": int(best["smem_pad_bytes"] or 0) // 1024,
            "best_blocks_per_sm": best["gemm_blocks_per_sm"], "best_controls": best["controls"],
            "best_time_ratio": best["time_ratio"], "best_time_ratio_ci_low": best["time_ratio_ci_low"],
            "best_time_ratio_ci_high": best["time_ratio_ci_high"], "best_speedup": best["speedup"],
            "best_overlap_fraction": best["overlap_fraction"], "best_run_id": best["run_id"],
        })
    return pd.DataFrame(rows)


def _arm(r) -> str:
    """A run's arm within its workload and GEMM: setup, shaping (resident blocks per SM) and controls."""
    parts = [r["setup"]]
    pad = r["smem_pad_bytes"]
    if not pd.isna(pad) and int(pad) > 0:
        blocks = r["gemm_blocks_per_sm"]
        parts.append(f"shaped {int(blocks)}/SM" if not pd.isna(blocks) else f"pad {int(pad) // 1024} KiB")
    if r["controls"] != "-":
        parts.append(r["controls"])
    return ", ".join(parts)


def controls_table(table: pd.DataFrame) -> pd.DataFrame:
    """TimeRatio of every arm (setup, shaping, controls; columns) per workload and GEMM (rows), the sequential time first.

    Unshaped sequential is the reference (1.0) and is left out; an arm a GEMM has no run of is empty.
    """
    t = table[~((table["setup"] == "sequential") & (pd.to_numeric(table["smem_pad_bytes"], errors="coerce").fillna(0) == 0))]
    t = t.assign(arm=[_arm(r) for _, r in t.iterrows()])
    def key(arm: str):
        m = re.search(r"shaped (\d+)/SM", arm)
        controls = arm.count(",") - (1 if m else 0)
        return SETUP_ORDER.get(arm.split(",")[0], 9), controls, -(int(m.group(1)) if m else 99), arm

    order = list(dict.fromkeys(sorted(t["arm"], key=key)))
    wide = t.pivot_table(index=["workload", "gemm"], columns="arm", values="time_ratio", aggfunc="first", sort=False)
    seq = table[(table["setup"] == "sequential") & (pd.to_numeric(table["smem_pad_bytes"], errors="coerce").fillna(0) == 0)]
    seq_ms = seq.set_index(["workload", "gemm"])["median_ms"].rename("sequential ms")
    return pd.concat([seq_ms, wide[[a for a in order if a in wide.columns]]], axis=1).reset_index()


def controls_markdown(ct: pd.DataFrame) -> str:
    """:func:`controls_table` as GitHub Markdown; the lowest TimeRatio of each row in bold."""
    arms = [c for c in ct.columns if c not in ("workload", "gemm", "sequential ms")]
    lines = ["| workload | GEMM | sequential ms | " + " | ".join(arms) + " |", "|" + "---|" * (3 + len(arms))]
    for _, r in ct.iterrows():
        vals = pd.to_numeric(r[arms], errors="coerce")
        best = vals.min()
        cells = ["" if pd.isna(v) else (f"**{v:.3f}**" if v == best else f"{v:.3f}") for v in vals]
        lines.append(f"| {r['workload']} | {r['gemm']} | {_num(r['sequential ms'])} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _num(x, fmt: str = ".3f") -> str:
    return "" if x is None or pd.isna(x) else format(float(x), fmt)


def _ci(v, lo, hi) -> str:
    return "" if v is None or pd.isna(v) else f"{_num(v)} [{_num(lo)}, {_num(hi)}]"


def _shaping(r) -> str:
    pad = int(r.smem_pad_bytes or 0) // 1024 if not pd.isna(r.smem_pad_bytes) else 0
    blocks = "" if pd.isna(r.gemm_blocks_per_sm) else f"{int(r.gemm_blocks_per_sm)}"
    return f"{blocks} ({pad})" if blocks else ("-" if not pad else f"? ({pad})")


def markdown(table: pd.DataFrame) -> str:
    """The sweep table as GitHub Markdown."""
    head = ("| workload | GEMM | blocks/SM (pad KiB) | setup | comm prio (eff.) | controls | median ms [95% CI] "
            "| TimeRatio [CI] | speedup [CI] | overlap | comm start µs |")
    lines = [head, "|" + "|".join("---" for _ in range(11)) + "|"]
    for r in table.itertuples(index=False):
        prio = "" if pd.isna(r.comm_priority_effective) else str(int(r.comm_priority_effective))
        lines.append(
            f"| {r.workload} | {r.gemm} | {_shaping(r)} | {r.setup} | {prio} | {r.controls} "
            f"| {_ci(r.median_ms, r.ci_low_ms, r.ci_high_ms)} | {_ci(r.time_ratio, r.time_ratio_ci_low, r.time_ratio_ci_high)} "
            f"| {_ci(r.speedup, r.speedup_ci_low, r.speedup_ci_high)} | {_num(r.overlap_fraction, '.2f')} "
            f"| {_num(r.comm_start_delay_us, '.1f')} |"
        )
    return "\n".join(lines)


def best_markdown(best: pd.DataFrame) -> str:
    """The per-workload summary (:func:`best_table`) as GitHub Markdown."""
    lines = ["| workload | GEMM | sequential ms | baseline TimeRatio | best: setup, blocks/SM (pad KiB), controls "
             "| best TimeRatio [CI] | its speedup | its overlap |", "|---|---|---|---|---|---|---|---|"]
    for r in best.itertuples(index=False):
        blocks = "" if pd.isna(r.best_blocks_per_sm) else f"{int(r.best_blocks_per_sm)}"
        shaping = f", {blocks} ({r.best_pad_kib})" if blocks else ""
        lines.append(f"| {r.workload} | {r.gemm} | {_num(r.sequential_ms)} | {_num(r.baseline_time_ratio)} "
                     f"| {r.best_setup}{shaping}, {r.best_controls} "
                     f"| {_ci(r.best_time_ratio, r.best_time_ratio_ci_low, r.best_time_ratio_ci_high)} "
                     f"| {_num(r.best_speedup)} | {_num(r.best_overlap_fraction, '.2f')} |")
    return "\n".join(lines)


def _stand_in_note(dataset_path) -> str | None:
    from overlapviz.dataset import schema

    runs = schema.read_frame(dataset_path, "runs")
    if "stand_in" in runs and runs["stand_in"].fillna(False).astype(bool).any():
        return ("Communication: the single-GPU stand-in kernel (ovz_comm_*_standin), NOT NCCL: "
                "it shows SM contention on one GPU, nothing about links or peers.")
    return None


def failure_text(fails: pd.DataFrame) -> str:
    lines = [f"{len(fails)} failed:"]
    for r in fails.itertuples(index=False):
        lines.append(f"  - {r.run_id}: {r.error or 'no error recorded'}")
    return "\n".join(lines)


def render(dataset_path, *, best: bool = False, controls: bool = False, workload: str | None = None) -> str:
    """The report as text: a stand-in note where it applies, the table (or the summary), then the failed runs.

    Raises
    ------
    ValueError
        When no run finished: the message lists every failed run and its error.
    """
    table = sweep_table(dataset_path)
    fails = failures(dataset_path)
    if workload is not None:
        table = table[table["workload"] == workload]
        fails = fails[fails["workload"] == workload]
    if table.empty:
        if len(fails):
            raise ValueError(f"{dataset_path}: every configuration failed, nothing to tabulate.\n" + failure_text(fails))
        raise ValueError(f"{dataset_path}: no runs")
    parts = [p for p in (_stand_in_note(dataset_path),) if p]
    if controls:
        parts.append(controls_markdown(controls_table(table)))
    elif best:
        parts.append(best_markdown(best_table(table)))
    else:
        parts.append(markdown(table))
    pooled = table[table["sequential_run_id"].fillna("").str.contains(",") | table["baseline_run_id"].fillna("").str.contains(",")]
    if len(pooled):
        parts.append(f"Note: {len(pooled)} runs have several reference runs (same workload key; iterations pooled): "
                     "see sequential_run_id / baseline_run_id in --format csv.")
    if len(fails):
        parts.append(failure_text(fails))
    return "\n\n".join(parts)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -P -m overlapviz.collectors.report", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dataset")
    p.add_argument("--best", action="store_true", help="one row per workload and GEMM: the best configuration")
    p.add_argument("--controls", action="store_true",
                   help="one row per workload and GEMM, one TimeRatio column per arm (setup, shaping, control)")
    p.add_argument("--workload", help="only this workload's runs (cb-ar, mb-ar, cb-a2a, mb-a2a)")
    p.add_argument("--format", choices=("markdown", "csv", "json"), default="markdown")
    args = p.parse_args(argv)
    try:
        if args.format == "markdown":
            print(render(args.dataset, best=args.best, controls=args.controls, workload=args.workload))
        else:
            table = sweep_table(args.dataset)
            if args.workload:
                table = table[table["workload"] == args.workload]
            table = controls_table(table) if args.controls else best_table(table) if args.best else table
            print(table.to_csv(index=False) if args.format == "csv" else table.to_json(orient="records", indent=1))
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
