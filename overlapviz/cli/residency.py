"""``overlapviz residency``: resident blocks per SM of each kernel launch shape, or why each collective started late."""

from __future__ import annotations

import click

from overlapviz.cli._options import dataset_argument, device_option, format_option, runs_option, scheduler_option, wide_option
from overlapviz.cli.explain import TABLE_COLUMNS as EXPLAIN_COLUMNS
from overlapviz.cli.explain import with_kernel_id

# the compact table's columns (--wide: all; JSON and CSV carry every column); residency_note
# says why a shape has no residency (device or launch shape unknown)
TABLE_COLUMNS = {
    "shapes": ["run_id", "name", "kind", "blocks_per_sm", "limiter", "occupancy", "n_launches", "total_us", "residency_note"],
    "delays": EXPLAIN_COLUMNS["kernels"],
}


@click.command()
@dataset_argument
@runs_option()
@click.option("--kind", type=click.Choice(["all", "compute", "comm"]), default="all", show_default=True,
              help="Only kernels of this kind (shapes view).")
@click.option("--delays", is_flag=True, help="One record per communication kernel: what `overlapviz explain` prints.")
@device_option()
@format_option
@wide_option
@scheduler_option()
def residency(dataset: str, runs: tuple[str, ...], kind: str, delays: bool, device_name: str | None, fmt: str, wide: bool,
              scheduler: str | None) -> None:  # fmt: skip
    """Occupancy of every distinct kernel launch shape in DATASET, or (--delays) why each collective started when it did.

    Shapes: blocks_per_sm (resident blocks per SM/CU by the device's occupancy rules),
    limiter (warps | blocks | registers | sgprs | shared_memory), occupancy (resident
    warps / warp slots). Delays: the records of `overlapviz explain` (one implementation:
    ready time from launch, stream and event dependencies; SM room by occupancy and grid;
    the cause).
    """
    from overlapviz.analysis import explain
    from overlapviz.analysis import residency as residency_lib
    from overlapviz.cli._table import render_output

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
