"""``overlapviz residency``: resident blocks per SM of each kernel launch shape, or why each collective started late."""

from __future__ import annotations

import click

from overlapviz.analysis import explain
from overlapviz.analysis import residency as residency_lib
from overlapviz.cli._dataset import DATASET
from overlapviz.cli._table import FORMATS, render_output, wide_option
from overlapviz.cli.explain import TABLE_COLUMNS as EXPLAIN_COLUMNS
from overlapviz.cli.explain import with_kernel_id

# the compact table's columns (--wide: all; JSON and CSV carry every column); residency_note
# says why a shape has no residency (device or launch shape unknown)
TABLE_COLUMNS = {
    "shapes": ["run_id", "name", "kind", "blocks_per_sm", "limiter", "occupancy", "n_launches", "total_us", "residency_note"],
    "delays": EXPLAIN_COLUMNS["kernels"],
}


@click.command()
@click.argument("dataset", type=DATASET)
@click.option("--run", "runs", multiple=True, metavar="RUN_ID", help="Only this run (repeatable).")
@click.option("--kind", type=click.Choice(["all", "compute", "comm"]), default="all", show_default=True,
              help="Only kernels of this kind (shapes view).")
@click.option("--delays", is_flag=True, help="One record per communication kernel: what `overlapviz explain` prints.")
@click.option("--device-name", "--arch", "device_name", metavar="GPU", help="The GPU the traces ran on, for traces that do not "
              "say (a product name such as 'NVIDIA A100-SXM4-80GB', or an architecture such as sm_80 or gfx942).")
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="table", show_default=True, help="Output format.")
@wide_option
@click.option("--scheduler", envvar="OVERLAPVIZ_SCHEDULER", metavar="ADDRESS", default=None,
              help="Compute on a Dask cluster: tcp://host:8786, a scheduler file, or local / local:N (pip install "
                   "'overlapviz[dask]'; docs/dask.md). Same results as without.")
def residency(dataset: str, runs: tuple[str, ...], kind: str, delays: bool, device_name: str | None, fmt: str, wide: bool,
              scheduler: str | None) -> None:  # fmt: skip
    """Occupancy of every distinct kernel launch shape in DATASET, or (--delays) why each collective started when it did.

    Shapes: blocks_per_sm (resident blocks per SM/CU by the device's occupancy rules),
    limiter (warps | blocks | registers | sgprs | shared_memory), occupancy (resident
    warps / warp slots). Delays: the records of `overlapviz explain` (one implementation:
    ready time from launch, stream and event dependencies; SM room by occupancy and grid;
    the cause).
    """
    try:
        if scheduler:
            from overlapviz.distributed import client_for, explain_on, residency_on

            with client_for(scheduler) as client:
                on = explain_on if delays else residency_on
                frame = on(client, dataset, run_ids=list(runs) or None, device=device_name)
        elif delays:
            frame = explain.explain(dataset, run_ids=list(runs) or None, device=device_name)
        else:
            frame = residency_lib.kernel_residency(dataset, run_ids=list(runs) or None, device=device_name)
        if not delays and kind != "all":
            frame = frame[frame["kind"] == kind].reset_index(drop=True)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    columns = TABLE_COLUMNS["delays" if delays else "shapes"]
    if "residency_note" in frame.columns and not frame["residency_note"].notna().any():
        columns = [c for c in columns if c != "residency_note"]
    if delays and fmt == "table" and not wide:
        frame = with_kernel_id(frame)
    click.echo(render_output(frame, fmt, columns=columns, wide=wide), nl=fmt != "csv")
