"""``overlapviz compare``: configurations by benefit, or two runs side by side."""

from __future__ import annotations

import click

from overlapviz.analysis import speedup, statistics
from overlapviz.cli._dataset import DATASET
from overlapviz.cli.residency import FORMATS, render

TABLE_COLUMNS = ["run_id", "workload", "setup", "smem_pad_bytes", "comm_priority", "n_iterations", "median_ms",
                 "ci_low_ms", "ci_high_ms", "time_ratio", "time_ratio_ci_low", "time_ratio_ci_high", "speedup",
                 "speedup_ci_low", "speedup_ci_high", "overlap_fraction", "compute_slowdown"]


@click.command()
@click.argument("dataset", type=DATASET)
@click.argument("run_a", required=False)
@click.argument("run_b", required=False)
@click.option("--run", "runs", multiple=True, metavar="RUN_ID",
              help="A run to compare (give two, A then B), as every other command names runs; the same as RUN_A RUN_B.")
@click.option("--level", type=float, default=statistics.DEFAULT_LEVEL, show_default=True, help="Confidence level of the bootstrap intervals.")
@click.option("--resamples", type=click.IntRange(min=100), default=statistics.DEFAULT_RESAMPLES, show_default=True, help="Bootstrap resamples.")
@click.option("--seed", type=int, default=statistics.DEFAULT_SEED, show_default=True, help="Bootstrap seed.")
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="table", show_default=True, help="Output format.")
def compare(dataset: str, run_a: str | None, run_b: str | None, runs: tuple[str, ...], level: float, resamples: int, seed: int,
            fmt: str) -> None:
    """Compare configurations in DATASET.

    With no runs: one record per run, best first: median iteration time with its
    bootstrap CI, TimeRatio (vs the sequential run of the same workload), speedup (vs
    its baseline overlap run), overlap fraction and computation slowdown. With RUN_A and
    RUN_B: the configuration columns that differ, then each metric for A and B with
    delta (B − A), its CI where one exists, and ratio (B / A).
    """
    if runs:
        if run_a is not None:
            raise click.ClickException("name the runs either as --run A --run B or as RUN_A RUN_B, not both")
        if len(runs) != 2:
            raise click.ClickException(f"--run given {len(runs)} time(s): compare takes two runs (--run A --run B), or none")
        run_a, run_b = runs
    if (run_a is None) != (run_b is None):
        raise click.ClickException("give two runs (--run A --run B) to compare, or none for the table of all runs")
    try:
        if run_a is None:
            frame, cols = speedup.config_table(dataset, level=level, n_resamples=resamples, seed=seed), TABLE_COLUMNS
        else:
            frame = speedup.compare(dataset, run_a, run_b, level=level, n_resamples=resamples, seed=seed)
            cols = ["section", "item", "a", "b", "delta", "delta_ci_low", "delta_ci_high", "ratio"]
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(render(frame, fmt, columns=cols), nl=fmt != "csv")
