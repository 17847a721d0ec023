"""``overlapviz export``: paper-ready figures of a dataset as PNG, SVG, PDF or self-contained HTML (one, or ``--all`` of
them into a folder), or a run as a Perfetto trace."""

from __future__ import annotations

import gc

import click

from overlapviz.figures.catalog import FIGURES, FORMATS, PAPER_SIZES, help_lines
from overlapviz.cli._dataset import check_output
from overlapviz.cli._options import dataset_argument, device_option, runs_option

ALL_FORMATS = (*FORMATS, "perfetto")


class _Length(click.ParamType):
    """``800``, ``800px``, ``3.5in``, ``8.9cm``: (CSS px, given in a physical unit)."""

    name = "LENGTH"

    def convert(self, value, param, ctx):
        if isinstance(value, tuple):
            return value
        from overlapviz.figures.catalog import parse_length

        try:
            return parse_length(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


class _Export(click.Command):
    """Starts the browser before the arguments are read: reading DATASET imports pandas (0.4 s it could start in)."""

    def parse_args(self, ctx, args):
        # SIGTERM and SIGHUP end the command as Ctrl-C does: through the exit handlers that end the browser and remove
        # its profile (/dev/shm/overlapviz-chromium-*, left behind by a job's `kill` before); until the context closes
        from overlapviz import lifetime

        ctx.with_resource(lifetime.signals_interrupt(once=True))
        try:
            if _draws_static(args):
                from overlapviz.export.browser import prestart

                prestart()  # the browser starts while pandas and HoloViews are imported and the tables are read
                gc.disable()  # until the plotting libraries are imported (export below): collecting found nothing in 0.1-0.3 s
            return super().parse_args(ctx, args)
        except BaseException as exc:
            gc.enable()
            ctx.close()
            if isinstance(exc, KeyboardInterrupt):
                raise click.ClickException("interrupted") from None
            raise

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:  # Ctrl-C, or a job's SIGTERM: one line (as ingest's), no output file
            raise click.ClickException("interrupted") from None
        finally:
            gc.enable()


def _draws_static(args: list[str]) -> bool:
    """Whether the command line asks for a PNG, SVG or PDF (then a browser draws it), from its words as given."""
    if "--help" in args or "-h" in args:
        return False
    value = lambda *names: next((a.split("=", 1)[1] if "=" in a else (args[i + 1] if i + 1 < len(args) else "")  # noqa: E731
                                 for i, a in enumerate(args) if a.split("=", 1)[0] in names), None)  # fmt: skip
    fmt = value("--format") or ("png" if "--all" in args else (value("-o", "--output") or "").rsplit(".", 1)[-1].lower())
    return fmt in ("png", "svg", "pdf")


@click.command(cls=_Export, epilog="\b\nFigures:\n" + help_lines())
@dataset_argument
@click.option("--figure", "figure", type=click.Choice(list(FIGURES)), help="Which figure (below; not with --all or --format perfetto).")
@click.option("--all", "all_figures", is_flag=True, help="Every figure that applies to the dataset, one file per figure and run, "
              "into the folder -o, with an index.html that links them.")
@click.option("--format", "fmt", type=click.Choice(ALL_FORMATS),
              help="Output format (default: from the file suffix; png with --all). perfetto: the run's timeline with the findings "
                   "as a trace Perfetto opens (.json or .json.gz).")
@click.option("-o", "--output", "output", required=True, type=click.Path(path_type=str), help="Output file (a folder with --all).")
@runs_option("Run(s) to draw; compare takes two (repeat the option).")
@click.option("--rank", "ranks", multiple=True, type=int, metavar="N", help="Ranks on the timeline (repeatable; default all).")
@click.option("--start-ms", type=float, help="Timeline/compare window start, ms since the first GPU activity.")
@click.option("--end-ms", type=float, help="Timeline/compare window end, ms since the first GPU activity.")
@click.option("--value", default="time_ratio", show_default=True,
              type=click.Choice(["time_ratio", "speedup", "overlap_fraction"]), help="Heatmap metric.")  # fmt: skip
@click.option("--size", "size", type=click.Choice(list(PAPER_SIZES)), help="A paper preset: column (3.5 in wide, 8 pt) or page "
              "(7.16 in, 9 pt), 300 dpi, no titles (the caption says it); --width, --height, --font-size, --dpi, --title override.")
@click.option("--width", type=_Length(), help="Figure width: pixels (800, 800px) or a length (3.5in, 8.9cm, 89mm, 252pt; 96 px to the "
              "inch). Default: the figure's own (1100 px for most).")
@click.option("--height", type=_Length(), help="Figure height, as --width (default: the figure's own, scaled with the font size).")
@click.option("--font-size", "font_pt", type=click.FloatRange(4, 40), metavar="PT", help="Text size in points (ticks 1 pt less, "
              "titles 1 pt more).")
@click.option("--dpi", type=click.IntRange(48, 1200), help="PNG resolution (default 96, or 300 with --size or a width in inches/cm/mm/pt); "
              "SVG and PDF are vector.")
@click.option("--title/--no-title", "title", default=None, help="Keep the figure's titles (default: yes, no with --size).")
@click.option("--kernel", metavar="RANK:START_NS", help="Budget: the communication kernel (the kernel column of "
              "`overlapviz explain`; default: the run's longest wait for SM resources).")
@click.option("--what-if", "what_if", metavar="SETTING", help="Budget: apply this option of `overlapviz advise` to the "
              "computation kernel (its setting column, e.g. '+29312 B' or '16 SMs left to communication').")
@device_option(uses=": residency, fit and SM budget as `overlapviz explain --device-name` computes them")
def export(dataset, figure, all_figures, fmt, output, runs, ranks, start_ms, end_ms, value, size, width, height, font_pt, dpi, title,
           kernel, what_if, device_name) -> None:  # fmt: skip
    """Write FIGURE of DATASET to a file, fully offline.

    PNG, SVG and PDF are one drawing in the system's headless chromium (Debian: chromium): the
    same layout in each; SVG and PDF are vector; HTML embeds BokehJS inline.
    Figures need the dashboard extra (pip install 'overlapviz[dashboard]'); --format perfetto does not.
    """
    check_output(output, dataset)
    if fmt == "perfetto":
        from overlapviz.export.perfetto import write_perfetto

        if len(runs) > 1:
            raise click.ClickException("--format perfetto writes one run: give one --run")
        try:
            run_id = runs[0] if runs else _first_run(dataset)
            click.echo(str(write_perfetto(dataset, run_id, output, device=device_name)))
        except ValueError as exc:
            raise click.ClickException(str(exc)) from None
        return
    if figure is None and not all_figures:
        raise click.UsageError("give --figure NAME or --all (except with --format perfetto)")
    if figure is not None and all_figures:
        raise click.UsageError("--figure and --all go apart: --all writes every figure")
    if not all_figures and fmt is None and not output.lower().endswith(tuple(f".{f}" for f in FORMATS)):
        raise click.ClickException(f"{output}: give --format or a .png/.svg/.pdf/.html file name")
    if (start_ms is None) != (end_ms is None):
        raise click.ClickException("--start-ms and --end-ms go together")
    if start_ms is not None and not end_ms > start_ms:
        raise click.ClickException(f"--end-ms {end_ms} is not after --start-ms {start_ms}")
    window = None if start_ms is None else (start_ms, end_ms)
    if (kernel or what_if) and figure != "budget":
        raise click.UsageError("--kernel and --what-if choose the budget figure's collective: give --figure budget")
    from overlapviz._extras import DASHBOARD, require

    require(f"overlapviz export {'--all' if all_figures else '--figure ' + figure}", DASHBOARD,
            after=" (--format perfetto needs none of them)")  # fmt: skip
    look, builder_width = _look(size, width, height, font_pt, dpi, title)
    from overlapviz.export import render as export_mod

    gc.freeze()  # (what is imported stays: no collection needs to look at it again)
    gc.enable()

    try:
        if all_figures:
            written = export_mod.export_all(dataset, output, fmt or "png", runs=list(runs) or None, ranks=list(ranks) or None,
                                            window_ms=window, value=value, width=builder_width, device=device_name, look=look)  # fmt: skip
            drawn = len(written) - 1 if written else 0  # (index.html is the last file written)
            click.echo(f"{drawn} figure{'' if drawn == 1 else 's'} and {'index.html' if written else 'no index'} in {output}")
            return
        extra = {}
        if figure == "budget" and (kernel or what_if):
            run_id = runs[0] if runs else _first_run(dataset)
            extra = budget_selection(dataset, run_id, kernel, what_if, device_name)
        path = export_mod.export_dataset_figure(
            dataset, figure, output, fmt, runs=list(runs) or None, ranks=list(ranks) or None, window_ms=window,
            value=value, width=builder_width, device=device_name, look=look, reuse_browser=True, **extra,
        )  # fmt: skip
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(str(path))


def _look(size, width, height, font_pt, dpi, title):
    """(the ``export.Look`` of the options, the width the figure builder lays its panels out for)."""
    from overlapviz.export.render import Look

    preset = PAPER_SIZES.get(size) if size else None
    w = width[0] if width else (round(preset.width_in * 96) if preset else None)
    h = height[0] if height else None
    font = font_pt or (preset.font_pt if preset else None)
    physical = bool(preset) or bool(width and width[1]) or bool(height and height[1])
    dpi = dpi or (preset.dpi if preset else 300 if physical else 96)
    look = Look(width=w, height=h, font_pt=font, dpi=dpi, title=(preset is None) if title is None else title)
    return look, (w or 1100)


def budget_selection(dataset: str, run_id: str, kernel: str | None, what_if: str | None, device: str | None = None) -> dict:
    """``record`` and ``what_if`` of the budget figure from ``--kernel RANK:START_NS`` and ``--what-if SETTING``
    (``device``: as explain's ``--device-name``).

    Raises
    ------
    ValueError
        A malformed id, no kernel there, a kernel that is not a communication kernel, an
        unknown setting: each saying how to find a good one.
    """
    from overlapviz.dataset import schema
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
    from overlapviz.dataset import schema

    runs = schema.read_frame(dataset, "runs")
    ok = runs.loc[runs["status"].fillna("ok") != "failed", "run_id"].tolist()
    if not ok:
        raise ValueError(f"{dataset}: no run to export")
    return ok[0]
