"""``overlapviz export``: one paper-ready figure of a dataset as PNG, SVG, PDF or self-contained HTML, or a run as a Perfetto trace."""

from __future__ import annotations

import click

from overlapviz.cli._dataset import DATASET, check_output
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
@click.option("--start-ms", type=float, help="Timeline/compare window start, ms since the first GPU activity.")
@click.option("--end-ms", type=float, help="Timeline/compare window end, ms since the first GPU activity.")
@click.option("--value", default="time_ratio", show_default=True,
              type=click.Choice(["time_ratio", "speedup", "overlap_fraction"]), help="Heatmap metric.")  # fmt: skip
@click.option("--width", default=1100, show_default=True, type=click.IntRange(300, 6000), help="Timeline width in pixels.")
@click.option("--kernel", metavar="RANK:START_NS", help="Budget: the communication kernel (the kernel column of "
              "`overlapviz explain`; default: the run's longest wait for SM resources).")
@click.option("--what-if", "what_if", metavar="SETTING", help="Budget: apply this option of `overlapviz advise` to the "
              "computation kernel (its setting column, e.g. '+29312 B' or '16 SMs left to communication').")
@click.option("--device-name", "--arch", "device_name", metavar="GPU", help="The GPU the traces ran on, for traces that do not "
              "say (a product name such as 'NVIDIA A100-SXM4-80GB', or an architecture such as sm_80 or gfx942): residency, "
              "fit and SM budget as `overlapviz explain --device-name` computes them.")
def export(dataset, figure, fmt, output, runs, ranks, start_ms, end_ms, value, width, kernel, what_if, device_name) -> None:
    """Write FIGURE of DATASET to a file, fully offline.

    PNG and SVG are rendered in the system's headless chromium (Debian: chromium,
    chromium-driver); SVG and PDF are vector; HTML embeds BokehJS inline.
    """
    check_output(output, dataset)
    if fmt == "perfetto":
        from overlapviz.perfetto import write_perfetto

        if len(runs) > 1:
            raise click.ClickException("--format perfetto writes one run: give one --run")
        try:
            run_id = runs[0] if runs else _first_run(dataset)
            click.echo(str(write_perfetto(dataset, run_id, output, device=device_name)))
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
    if (kernel or what_if) and figure != "budget":
        raise click.UsageError("--kernel and --what-if choose the budget figure's collective: give --figure budget")
    try:
        extra = {}
        if figure == "budget" and (kernel or what_if):
            run_id = runs[0] if runs else _first_run(dataset)
            extra = budget_selection(dataset, run_id, kernel, what_if, device_name)
        path = export_mod.export_dataset_figure(
            dataset, figure, output, fmt, runs=list(runs) or None, ranks=list(ranks) or None, window_ms=window,
            value=value, width=width, device=device_name, **extra,
        )  # fmt: skip
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(str(path))


def budget_selection(dataset: str, run_id: str, kernel: str | None, what_if: str | None, device: str | None = None) -> dict:
    """``record`` and ``what_if`` of the budget figure from ``--kernel RANK:START_NS`` and ``--what-if SETTING``
    (``device``: as explain's ``--device-name``).

    Raises
    ------
    ValueError
        A malformed id, no kernel there, a kernel that is not a communication kernel, an
        unknown setting: each saying how to find a good one.
    """
    from overlapviz import schema
    from overlapviz.analysis import budget, explain

    records = explain.explain(dataset, run_ids=[run_id], device=device)
    how = f"list them with `overlapviz explain {dataset} --run {run_id}` (the kernel column is RANK:START_NS)"
    if kernel is None:
        record = budget.worst_record(records)
        if record is None:
            raise ValueError(f"{dataset}: run {run_id!r} has no communication kernels")
    else:
        rank_text, sep, start_text = kernel.partition(":")
        try:
            rank, start = int(rank_text), int(start_text)
        except ValueError:
            rank = start = None
        if not sep or rank is None:
            raise ValueError(f"--kernel {kernel!r} is not RANK:START_NS (two integers, e.g. 0:1740461679471440000); {how}")
        hit = records.loc[(records["rank"] == rank) & (records["start_ns"] == start)]
        if not len(hit):
            import pyarrow.compute as pc

            other = schema.read_kernels(dataset, columns=["kind", "name"], run_ids=[run_id],
                                        filter=(pc.field("rank") == rank) & (pc.field("start_ns") == start))  # fmt: skip
            if other.num_rows:
                k = other.to_pylist()[0]
                raise ValueError(f"--kernel {kernel}: {k['name']!r} is a {k['kind']} kernel, not a communication kernel; {how}")
            raise ValueError(f"--kernel {kernel}: run {run_id!r} has no kernel starting at {start} ns on rank {rank}; {how}")
        record = hit.iloc[0].to_dict()
    option = None
    if what_if is not None:
        options = budget.what_if_options(dataset, record, device=device)
        settings = [] if not len(options) else [str(s) for s in options["setting"]]
        if what_if not in settings:
            offered = ", ".join(repr(s) for s in settings) if settings else "none (nothing resident, or a shape or the device unknown)"
            raise ValueError(f"--what-if {what_if!r} is not an option for this kernel; the options: {offered}")
        option = options.loc[options["setting"].astype(str) == what_if].iloc[0].to_dict()
    return {"record": record, "what_if": option}


def _first_run(dataset: str) -> str:
    from overlapviz import schema

    runs = schema.read_frame(dataset, "runs")
    ok = runs.loc[runs["status"].fillna("ok") != "failed", "run_id"].tolist()
    if not ok:
        raise ValueError(f"{dataset}: no run to export")
    return ok[0]
