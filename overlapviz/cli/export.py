"""``overlapviz export``: one paper-ready figure of a dataset as PNG, SVG, PDF or self-contained HTML."""

from __future__ import annotations

import click

from overlapviz.export import FIGURES, FORMATS


@click.command()
@click.argument("dataset", type=click.Path(file_okay=False, path_type=str))
@click.option("--figure", "figure", required=True, type=click.Choice(FIGURES), help="Which figure.")
@click.option("--format", "fmt", type=click.Choice(FORMATS), help="Output format (default: from the file suffix).")
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
