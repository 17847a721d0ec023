"""``overlapviz analyze``: overlap metrics of a dataset as a table, JSON or CSV."""

from __future__ import annotations

import math

import click
import orjson
import pandas as pd

from overlapviz import metrics

FORMATS = ("table", "json", "csv")


@click.command()
@click.argument("dataset", type=click.Path(file_okay=False, path_type=str))
@click.option(
    "--per",
    type=click.Choice(metrics.PER),
    default="rank",
    show_default=True,
    help="One record per run x rank (whole trace), or per run x rank x step (kernels with no step are left out).",
)
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="table", show_default=True, help="Output format.")
@click.option("--run", "runs", multiple=True, metavar="RUN_ID", help="Only this run (repeatable).")
def analyze(dataset: str, per: str, fmt: str, runs: tuple[str, ...]) -> None:
    """Computation-communication overlap of each run x rank (or step) in DATASET.

    Columns (µs, from exact int64 ns): comm_us, compute_us, overlap_us,
    overlap_fraction (= overlap_us / comm_us, null without comm), exposed_comm_us,
    span_us, busy_us, idle_us, memory_us, n_kernels, n_comm_kernels.
    """
    try:
        frame = metrics.analyze(dataset, per=per, run_ids=list(runs) or None)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(render(frame, fmt), nl=fmt != "csv")


def render(frame: pd.DataFrame, fmt: str) -> str:
    """The metrics frame as ``table`` (aligned text), ``json`` (one array) or ``csv`` text."""
    if fmt == "json":
        return orjson.dumps(_records(frame)).decode()
    if fmt == "csv":
        return frame.to_csv(index=False, lineterminator="\n")
    return _table(frame)


def _records(frame: pd.DataFrame) -> list[dict]:
    out = []
    columns = list(frame.columns)
    for row in frame.itertuples(index=False, name=None):  # one per group, not per event
        out.append({c: _json_value(v) for c, v in zip(columns, row)})
    return out


def _json_value(v):
    if v is None or v is pd.NA:
        return None
    if isinstance(v, float):
        return None if math.isnan(v) else v
    if hasattr(v, "item"):  # numpy scalar
        v = v.item()
        return None if isinstance(v, float) and math.isnan(v) else v
    return v


def _table(frame: pd.DataFrame) -> str:
    if frame.empty:
        return "(no kernels)"
    cells = {}
    for c in frame.columns:
        col = frame[c]
        if c == "overlap_fraction":
            cells[c] = ["-" if pd.isna(v) else f"{v:.1%}" for v in col]
        elif c.endswith("_us"):
            cells[c] = ["-" if pd.isna(v) else f"{v:,.1f}" for v in col]
        else:
            cells[c] = ["-" if pd.isna(v) else str(v) for v in col]
    headers = {c: ("overlap" if c == "overlap_fraction" else c) for c in frame.columns}
    widths = {c: max(len(headers[c]), *(len(s) for s in cells[c])) for c in frame.columns}

    def line(texts: dict) -> str:
        return "  ".join(texts[c].ljust(widths[c]) if c == "run_id" else texts[c].rjust(widths[c]) for c in frame.columns)

    rows = [line({c: cells[c][i] for c in frame.columns}) for i in range(len(frame))]
    return "\n".join([line(headers)] + rows)
