"""``overlapviz compare``: configurations by benefit, or two runs side by side."""

from __future__ import annotations

import textwrap

import click

from overlapviz.cli._options import dataset_argument, format_option, runs_option, wide_option

# statistics.DEFAULT_LEVEL, _RESAMPLES and _SEED, spelled here so that `compare --help` imports no numpy (a test checks
# they agree)
LEVEL, RESAMPLES, SEED = 0.95, 2000, 0

# the compact table's columns (--wide: all, the intervals included; JSON and CSV carry every column)
TABLE_COLUMNS = ["run_id", "workload", "setup", "n_iterations", "median_ms", "time_ratio", "speedup", "overlap_fraction",
                 "compute_slowdown"]
PAIR_COLUMNS = ["section", "item", "a", "b", "delta", "ratio"]


@click.command()
@dataset_argument
@click.argument("run_a", required=False)
@click.argument("run_b", required=False)
@runs_option("A run to compare (give two, A then B), as every other command names runs; the same as RUN_A RUN_B.")
@click.option("--level", type=float, default=LEVEL, show_default=True, help="Confidence level of the bootstrap intervals.")
@click.option("--resamples", type=click.IntRange(min=100), default=RESAMPLES, show_default=True, help="Bootstrap resamples.")
@click.option("--seed", type=int, default=SEED, show_default=True, help="Bootstrap seed.")
@format_option
@wide_option
def compare(dataset: str, run_a: str | None, run_b: str | None, runs: tuple[str, ...], level: float, resamples: int, seed: int,
            fmt: str, wide: bool) -> None:
    """Compare configurations in DATASET.

    With no runs: one record per run, best first: median iteration time with its
    bootstrap CI, TimeRatio (vs the sequential run of the same workload), speedup (vs
    its baseline overlap run), overlap fraction and computation slowdown. With RUN_A and
    RUN_B: the configuration columns that differ, then each metric for A and B with
    delta (B − A), its CI where one exists, and ratio (B / A); then where each run's
    communication time went (the breakdown summed over ranks, the time of each kind of
    finding) and, under the table, what changed most.
    """
    if runs:
        if run_a is not None:
            raise click.ClickException("name the runs either as --run A --run B or as RUN_A RUN_B, not both")
        if len(runs) != 2:
            raise click.ClickException(f"--run given {len(runs)} time(s): compare takes two runs (--run A --run B), or none")
        run_a, run_b = runs
    if (run_a is None) != (run_b is None):
        raise click.ClickException("give two runs (--run A --run B) to compare, or none for the table of all runs")
    from overlapviz.analysis import speedup
    from overlapviz.cli._table import render_output, unit

    row_units = None
    try:
        if run_a is None:
            frame, cols = speedup.config_table(dataset, level=level, n_resamples=resamples, seed=seed), TABLE_COLUMNS
        else:
            frame, cols = speedup.compare(dataset, run_a, run_b, level=level, n_resamples=resamples, seed=seed), PAIR_COLUMNS
            frame, why = _with_answer(frame, dataset, run_a, run_b, fmt)
            if fmt == "table":
                # each row is its own quantity: a, b, delta and its interval in the item's unit, ratio as a ratio;
                # the item is renamed as its values are shown (median_ms -> median_us)
                units = [unit(str(i)) for i in frame["item"]]
                row_units = {c: units for c in ("a", "b", "delta", "delta_ci_low", "delta_ci_high")}
                frame = frame.assign(item=[f"{i[:-3]}_us" if str(i).endswith("_ms") else i for i in frame["item"]])
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    if run_a is not None and fmt == "table":
        click.echo(f"A  {run_a}\nB  {run_b}")
    click.echo(render_output(frame, fmt, columns=cols, wide=wide, row_units=row_units), nl=fmt != "csv")
    if run_a is not None and fmt == "table":
        click.echo("\n".join(textwrap.wrap(f"Why: {why}", 118, subsequent_indent="  ", break_long_words=False)))


def _with_answer(frame, dataset, run_a, run_b, fmt):
    """The pair's rows and, below them, each run's breakdown summed over ranks and the time of each kind of
    finding (sections ``breakdown`` and ``finding``: exact ns in JSON and CSV, µs in the table), with the
    sentence saying what changed most (``findings.compare_runs``)."""
    import pandas as pd

    from overlapviz.analysis.findings import compare_runs

    answer, why = compare_runs(dataset, run_a, run_b)
    scale, suffix = (1000.0, "_us") if fmt == "table" else (1, "_ns")
    rows = pd.DataFrame({"section": answer["section"], "item": [i.removesuffix("_ns") + suffix for i in answer["item"]],
                         "a": answer["a_ns"] / scale, "b": answer["b_ns"] / scale, "delta": answer["delta_ns"] / scale})  # fmt: skip
    if scale == 1:
        rows = rows.astype({"a": "int64", "b": "int64", "delta": "int64"})
    fa = rows["a"].astype("float64")
    rows["ratio"] = rows["b"].astype("float64") / fa.where(fa != 0)
    exact = {c: object for c in ("a", "b", "delta")}  # ints stay ints in JSON beside the float metrics
    return pd.concat([frame.astype(exact), rows.astype(exact)], ignore_index=True), why
