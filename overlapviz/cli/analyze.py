"""``overlapviz analyze``: overlap metrics of a dataset as a table, JSON or CSV.

Computed and printed from Arrow (``metrics.analyze_table``): the command imports no pandas.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from overlapviz.cli._options import PER  # noqa: F401 (analyze.PER: tests check it is metrics.PER)
from overlapviz.cli._options import dataset_argument, format_option, per_option, runs_option, scheduler_option, wide_option

if TYPE_CHECKING:
    import pyarrow as pa

# the compact table's columns (--wide: all; JSON and CSV carry every column)
TABLE_COLUMNS = ["run_id", "rank", "step", "comm_us", "compute_us", "overlap_us", "overlap_fraction", "exposed_comm_us",
                 "span_us", "n_kernels", "n_comm_kernels"]


@click.command()
@dataset_argument
@per_option("One record per run x rank (whole trace), or per run x rank x step (kernels with no step are left out).")
@format_option
@runs_option()
@scheduler_option()
@wide_option
def analyze(dataset: str, per: str, fmt: str, runs: tuple[str, ...], scheduler: str | None, wide: bool) -> None:
    """Computation-communication overlap of each run x rank (or step) in DATASET.

    Columns (µs, from exact int64 ns): comm_us, compute_us, overlap_us,
    overlap_fraction (= overlap_us / comm_us, null without comm), exposed_comm_us,
    span_us, busy_us, idle_us, memory_us, n_kernels, n_comm_kernels.
    """
    from overlapviz.cli._dataset import kept_answer

    # a warm answer is printed as the process that computed it printed it: no pyarrow or dataset read
    text, keep = kept_answer(click.get_current_context(), dataset, use=not scheduler)
    if text is None:
        from overlapviz.analysis import metrics

        try:
            if scheduler:
                from overlapviz.distributed import analyze_on, client_for

                with client_for(scheduler) as client:
                    table = analyze_on(client, dataset, per=per, run_ids=list(runs) or None)
            else:
                table = metrics.analyze_table(dataset, per=per, run_ids=list(runs) or None)
        except ValueError as exc:
            raise click.ClickException(str(exc)) from None
        text = render(table, fmt, wide=wide) + ("" if fmt == "csv" else "\n")
        keep(text)
    click.echo(text, nl=False)


def render(table: pa.Table, fmt: str, *, wide: bool = False) -> str:
    """The metrics table as ``table`` (aligned text), ``json`` (one array) or ``csv`` text (``_table.render_output``).

    JSON and CSV spell numbers as Python does (shortest round-trip floats), nulls as
    ``null`` and empty fields; one record per group, never per event.
    """
    from overlapviz.cli._table import render_output

    return render_output(table, fmt, columns=TABLE_COLUMNS, wide=wide, empty="(no kernels)")
