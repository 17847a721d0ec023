"""``overlapviz residency``: resident blocks per SM of each kernel launch shape, or why each collective started late."""

from __future__ import annotations

import math

import click
import orjson
import pandas as pd

from overlapviz.analysis import explain
from overlapviz.analysis import residency as residency_lib
from overlapviz.cli._dataset import DATASET

FORMATS = ("table", "json", "csv")
# columns the table view shows (JSON and CSV carry every column)
TABLE_COLUMNS = {
    "shapes": ["run_id", "name", "kind", "threads_per_block", "regs_per_thread", "shared_mem_bytes", "blocks_per_sm",
               "limiter", "occupancy", "n_launches", "total_us", "waves"],
    "delays": ["run_id", "rank", "stream", "name", "start_delay_us", "ready_from", "cause", "blocking_resource", "blocker",
               "n_resident_compute", "comm_blocks_fit_per_sm", "free_sms"],
}


@click.command()
@click.argument("dataset", type=DATASET)
@click.option("--run", "runs", multiple=True, metavar="RUN_ID", help="Only this run (repeatable).")
@click.option("--kind", type=click.Choice(["all", "compute", "comm"]), default="all", show_default=True,
              help="Only kernels of this kind (shapes view).")
@click.option("--delays", is_flag=True, help="One record per communication kernel: what `overlapviz explain` prints.")
@click.option("--device-name", metavar="GPU", help="The GPU the traces ran on, for traces that do not say (a product name "
              "such as 'NVIDIA A100-SXM4-80GB', or an architecture such as sm_80 or gfx942).")
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="table", show_default=True, help="Output format.")
def residency(dataset: str, runs: tuple[str, ...], kind: str, delays: bool, device_name: str | None, fmt: str) -> None:
    """Occupancy of every distinct kernel launch shape in DATASET, or (--delays) why each collective started when it did.

    Shapes: blocks_per_sm (resident blocks per SM/CU by the device's occupancy rules),
    limiter (warps | blocks | registers | sgprs | shared_memory), occupancy (resident
    warps / warp slots). Delays: the records of `overlapviz explain` (one implementation:
    ready time from launch, stream and event dependencies; SM room by occupancy and grid;
    the cause).
    """
    try:
        if delays:
            frame = explain.explain(dataset, run_ids=list(runs) or None, device=device_name)
        else:
            frame = residency_lib.kernel_residency(dataset, run_ids=list(runs) or None, device=device_name)
            if kind != "all":
                frame = frame[frame["kind"] == kind].reset_index(drop=True)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(render(frame, fmt, columns=TABLE_COLUMNS["delays" if delays else "shapes"]), nl=fmt != "csv")


def render(frame: pd.DataFrame, fmt: str, *, columns: list[str] | None = None) -> str:
    """``frame`` as ``json`` (one array of objects, nulls as null), ``csv``, or an aligned ``table`` of ``columns``."""
    if fmt == "json":
        cols = list(frame.columns)
        return orjson.dumps([{c: json_value(v) for c, v in zip(cols, row)} for row in frame.itertuples(index=False, name=None)]).decode()
    if fmt == "csv":
        return frame.to_csv(index=False, lineterminator="\n")
    return table(frame[[c for c in (columns or frame.columns) if c in frame.columns]])


def json_value(v):
    """A JSON-ready scalar: None for every kind of null, Python numbers for numpy ones."""
    if v is None or v is pd.NA or v is pd.NaT:
        return None
    if hasattr(v, "item"):
        v = v.item()
    if isinstance(v, float) and math.isnan(v):
        return None
    return v


def _cell(c: str, v) -> str:
    if v is None or (not isinstance(v, str) and pd.isna(v)):
        return "-"
    if (c == "occupancy" or c.endswith("_fraction")) and isinstance(v, (float, int)):
        return f"{v:.1%}"
    if isinstance(v, float):
        return f"{v:,.3f}" if abs(v) < 10 else f"{v:,.1f}"
    s = str(v)
    return s if len(s) <= 60 else s[:57] + "..."


def table(frame: pd.DataFrame) -> str:
    """Aligned text; text columns left-aligned, long names cut to 60 characters."""
    if frame.empty:
        return "(nothing to show)"
    cols = list(frame.columns)
    cells = {c: [_cell(c, v) for v in frame[c].tolist()] for c in cols}
    left = {c for c in cols if frame[c].dtype == object or str(frame[c].dtype) in ("string", "str")}
    widths = {c: max(len(c), *(len(s) for s in cells[c])) for c in cols}
    fmt = lambda c, s: s.ljust(widths[c]) if c in left else s.rjust(widths[c])  # noqa: E731
    lines = ["  ".join(fmt(c, c) for c in cols)]
    lines += ["  ".join(fmt(c, cells[c][i]) for c in cols) for i in range(len(frame))]
    return "\n".join(line.rstrip() for line in lines)
