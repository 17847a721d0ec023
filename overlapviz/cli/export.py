"""``overlapviz export``: one paper-ready figure of a dataset as PNG, SVG, PDF or self-contained HTML, or a run as a Perfetto trace."""

from __future__ import annotations

import click

from overlapviz.cli._dataset import DATASET
from overlapviz.export import FIGURES, FORMATS

ALL_FORMATS = (*FORMATS, "perfetto")


@click.command()
@click.argument("dataset", type=DATASET)
@click.option("--figure", "figure", type=click.Choice(FIGURES), help="Which figure (not with --format perfetto).")
@click.option("--format", "fmt", type=click.Choice(ALL_FORMATS),
              help="Output format (default: from the file suffix). perfetto: the run's timeline with the findings as a trace "
                   "Perfetto opens (.json or .json.gz).")
@click.option("-o", "--output", "output", required=True, type=click.Path(dir_okay=False, path_type=str), help="Output file.")
@click.option("--run", "runs", multiple=True, metavar="RUN_ID", help="Run(s) to draw; compare takes two (repeat the option).")
@click.option("--rank", "ranks", multiple=True, type=int, metavar="N", help="Ranks on the timeline (repeatable; default all).")
@click.option("--start-ms", type=float, help="Timeline/compare window start, ms since the first kernel.")
@click.option("--end-ms", type=float, help="Timeline/compare window end, ms since the first kernel.")
@click.option("--value", default="time_ratio", show_default=True,
              type=click.Choice(["time_ratio", "speedup", "overlap_fraction"]), help="Heatmap metric.")  # fmt: skip
@click.option("--width", default=1100, show_default=True, type=click.IntRange(300, 6000), help="Timeline width in pixels.")
def export(dataset, figure, fmt, output, runs, ranks, start_ms, end_ms, value, width) -> None:
    """Write FIGURE of DATASET to a file, fully offline.

    PNG and SVG are rendered in the system's headless chromium (Debian: chromium,
    chromium-driver); SVG and PDF are vector; HTML embeds BokehJS inline.
    """
    if fmt == "perfetto":
        from overlapviz.perfetto import write_perfetto

        if len(runs) > 1:
            raise click.ClickException("--format perfetto writes one run: give one --run")
        try:
            run_id = runs[0] if runs else _first_run(dataset)
            click.echo(str(write_perfetto(dataset, run_id, output)))
        except ValueError as exc:
            raise click.ClickException(str(exc)) from None
        return
    if figure is None:
        raise click.UsageError("--figure is required (except with --format perfetto)")
    from overlapviz import export as export_mod

    if fmt is None and not output.lower().endswith(tuple(f".{f}" for f in FORMATS)):
        raise click.ClickException(f"{output}: give --format or a .png/.svg/.pdf/.html file name")
    if (start_ms is None) != (end_ms is None):
        raise click.ClickException("--start-ms and --end-ms go together")
    if start_ms is not None and not end_ms > start_ms:
        raise click.ClickException(f"--end-ms {end_ms} is not after --start-ms {start_ms}")
    window = None if start_ms is None else (start_ms, end_ms)
    try:
        path = export_mod.export_dataset_figure(
            dataset, figure, output, fmt, runs=list(runs) or None, ranks=list(ranks) or None, window_ms=window,
            value=value, width=width,
        )  # fmt: skip
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(str(path))


def _first_run(dataset: str) -> str:
    from overlapviz import schema

    runs = schema.read_frame(dataset, "runs")
    ok = runs.loc[runs["status"].fillna("ok") != "failed", "run_id"].tolist()
    if not ok:
        raise ValueError(f"{dataset}: no run to export")
    return ok[0]
