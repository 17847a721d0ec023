"""``overlapviz explain``: why each collective started late (DESIGN.md's contract), per kernel, per rank or per instance."""

from __future__ import annotations

import click

from overlapviz.analysis import explain as explain_lib
from overlapviz.analysis import peers
from overlapviz.cli._dataset import DATASET
from overlapviz.cli._table import FORMATS, render_output, wide_option

# the compact table's columns (--wide: all; JSON and CSV carry every column). kernel is
# RANK:START_NS, what `export --figure budget --kernel` takes
TABLE_COLUMNS = {
    "kernels": ["run_id", "kernel", "name", "start_delay_us", "cause", "blocker"],
    "summary": ["run_id", "rank", "n_comm_kernels", "stream_order_us", "dependency_us", "sm_resources_us", "launch_latency_us",
                "unknown_us", "peer_wait_us"],
    "instances": ["run_id", "instance", "n_ranks", "arrival_skew_us", "slowest_rank", "time_us", "busbw_gbps"],
}  # fmt: skip


@click.command()
@click.argument("dataset", type=DATASET)
@click.option("--run", "runs", multiple=True, metavar="RUN_ID", help="Only this run (repeatable).")
@click.option("--summary", is_flag=True, help="Per run x rank: start − launch summed by cause, total peer wait, top blockers.")
@click.option("--instances", is_flag=True, help="Per collective instance across ranks: arrival skew, slowest rank, bandwidth.")
@click.option("--all-kernels", is_flag=True, help="Explain every GPU activity (same rules), not only communication kernels.")
@click.option("--device-name", "--arch", "device_name", metavar="GPU", help="The GPU the traces ran on, for traces that do not "
              "say (a product name such as 'NVIDIA A100-SXM4-80GB', or an architecture such as sm_80 or gfx942).")
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="table", show_default=True, help="Output format.")
@wide_option
@click.option("--scheduler", envvar="OVERLAPVIZ_SCHEDULER", metavar="ADDRESS", default=None,
              help="Compute on a Dask cluster: tcp://host:8786, a scheduler file, or local / local:N (pip install "
                   "'overlapviz[dask]'; docs/dask.md). Same results as without.")
def explain(dataset: str, runs: tuple[str, ...], summary: bool, instances: bool, all_kernels: bool, device_name: str | None,
            fmt: str, wide: bool, scheduler: str | None) -> None:
    """Why each communication kernel in DATASET started when it did.

    ready_ns = the latest of its launch call, the end of the previous activity on its
    stream and the end of the producers of the events its stream waited on
    (dependency_source: cuda_sync where the trace's sync record names them, inferred from
    host order otherwise). cause: stream_order | dependency | sm_resources (no block fits
    beside the resident computation, by occupancy and grid; blocking_resource, blocker) |
    launch_latency | unknown | none. Times are exact int64 ns; *_us columns are µs.
    """
    if summary and instances:
        raise click.UsageError("--summary and --instances are two views: pick one")
    try:
        kinds = ("comm", "compute", "memory", "other") if all_kernels else ("comm",)
        if scheduler:
            from overlapviz.distributed import client_for, explain_on

            with client_for(scheduler) as client:
                frame = explain_on(client, dataset, run_ids=list(runs) or None, kinds=kinds, device=device_name)
        else:
            frame = explain_lib.explain(dataset, run_ids=list(runs) or None, kinds=kinds, device=device_name)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    view = "kernels"
    if summary:
        frame, view = explain_lib.summarize(frame), "summary"
    elif instances:
        frame, view = peers.collective_instances(frame), "instances"
    if view == "kernels" and fmt == "table" and not wide:
        frame = with_kernel_id(frame)
    click.echo(render_output(frame, fmt, columns=TABLE_COLUMNS[view], wide=wide), nl=fmt != "csv")


def with_kernel_id(frame):
    """``frame`` with ``kernel`` = ``RANK:START_NS`` (exact int64 ns), the id ``export --kernel`` takes."""
    if not {"rank", "start_ns"} <= set(frame.columns):
        return frame
    ids = [f"{r}:{s}" for r, s in zip(frame["rank"].tolist(), frame["start_ns"].tolist())]
    return frame.assign(kernel=ids)
