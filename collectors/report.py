"""A Markdown table of a collected sweep: time with its interval, TimeRatio, overlap, comm start delay, residency.

    python -m overlapviz.collectors.report DATASET

The numbers come from the analysis layer (overlapviz.analysis.speedup.config_table,
overlapviz.analysis.explain.comm_start_delays); this module only joins and formats them.
"""

from __future__ import annotations

import argparse
import json
import sys

import pandas as pd


def sweep_table(dataset_path) -> pd.DataFrame:
    """One row per run: configuration, median [CI] ms, TimeRatio [CI], overlap fraction, comm start delay, blocks/SM.

    ``comm_start_delay_us`` is the median over the run's comm kernels (traced pass) whose
    ready time is their launch call, where a run has any: a comm kernel queued behind an
    earlier one on its stream in an overlapped setup also waited, through an event, for
    the previous iteration's GEMM on another stream, which the start-delay definition
    (launch or previous activity on the same stream) does not see. Runs without such
    kernels (sequential: comm behind the GEMM on one stream) use all their comm kernels;
    ``n_delay_kernels`` says how many were used.
    ``gemm_blocks_per_sm`` is the tiled GEMM's resident blocks per SM from the run's
    manifest (cudaOccupancyMaxActiveBlocksPerMultiprocessor), null for the vendor GEMM.
    """
    from overlapviz import schema
    from overlapviz.analysis.explain import comm_start_delays
    from overlapviz.analysis.speedup import config_table

    table = config_table(dataset_path)
    d = comm_start_delays(dataset_path)
    at_launch = d["ready_from"].eq("launch")
    use = at_launch | ~at_launch.groupby(d["run_id"]).transform("any")
    g = d[use].groupby("run_id")["start_delay_us"]
    delays = pd.DataFrame({"comm_start_delay_us": g.median(), "n_delay_kernels": g.size()})
    runs = schema.read_frame(dataset_path, "runs")

    def blocks(config_json):
        facts = (json.loads(config_json or "{}").get("effective") or {}).get("kernels") or {}
        return (facts.get("gemm") or {}).get("blocks_per_sm")

    resident = pd.Series([blocks(c) for c in runs["config_json"]], index=runs["run_id"], name="gemm_blocks_per_sm")
    out = table.join(delays, on="run_id").join(resident, on="run_id")
    order = {"sequential": 0, "baseline": 1, "optimized": 2}
    return out.assign(_o=out["setup"].map(order)).sort_values(
        ["compute_impl", "smem_pad_bytes", "_o", "comm_priority"], ascending=[False, True, True, False]
    ).drop(columns="_o").reset_index(drop=True)


def markdown(table: pd.DataFrame) -> str:
    """The sweep table as GitHub Markdown."""
    head = ("| GEMM | pad (KiB) | GEMM blocks/SM | setup | comm priority (eff.) | median ms [95% CI] "
            "| TimeRatio [CI] | overlap fraction | comm start delay µs |")
    lines = [head, "|" + "|".join("---" for _ in range(9)) + "|"]
    for r in table.itertuples(index=False):
        gemm = f"tiled {r.tile_m}x{r.tile_n}x{r.tile_k}" if r.compute_impl == "tiled" else "torch.matmul fp32"
        if pd.notna(getattr(r, "sm_carveout", None)):
            gemm += f", carve-out {int(r.sm_carveout)}"
        ratio = "" if pd.isna(r.time_ratio) else f"{r.time_ratio:.3f} [{r.time_ratio_ci_low:.3f}, {r.time_ratio_ci_high:.3f}]"
        lines.append(
            f"| {gemm} | {int(r.smem_pad_bytes) // 1024} | {'' if pd.isna(r.gemm_blocks_per_sm) else int(r.gemm_blocks_per_sm)} "
            f"| {r.setup} | {r.comm_priority_effective} | {r.median_ms:.3f} [{r.ci_low_ms:.3f}, {r.ci_high_ms:.3f}] "
            f"| {ratio} | {r.overlap_fraction:.3f} | {r.comm_start_delay_us:.1f} |"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m overlapviz.collectors.report", description=__doc__)
    p.add_argument("dataset")
    args = p.parse_args(argv)
    try:
        print(markdown(sweep_table(args.dataset)))
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
