"""The ``overlapviz`` command: one click group; each subcommand is a thin layer over a library function."""

from __future__ import annotations

import importlib

import click

from overlapviz._version import __version__

# one module per subcommand, each defining a click command named like the module; the line
# `overlapviz --help` shows for each, so listing the commands imports none of them
COMMANDS = {
    "collect": "Run the overlap experiment (a preset, a config, a sweep or a scenario) and ingest it.",
    "ingest": "Read traces (Kineto, Nsight Systems SQLite, rocprof, rocpd) into a Parquet dataset.",
    "analyze": "Computation-communication overlap per run x rank (or step).",
    "explain": "Why each collective started late: stream order, dependency, SM room, peers.",
    "residency": "Resident blocks per SM of every kernel launch shape.",
    "compare": "Configurations side by side: iteration time, TimeRatio, speedup with intervals.",
    "advise": "The padding, tile or carve-out that lets K comm blocks fit beside a kernel.",
    "serve": "Serve the dashboard (the bundled sample traces when no dataset is given).",
    "export": "Write a figure (PNG, SVG, PDF, HTML) or a Perfetto trace of a dataset.",
}


# what every command that reads traces says of them in its --help (one text, so they agree)
TRACE_FORMATS = (
    "Traces are recognised by content, not by name: PyTorch profiler (Kineto) JSON (.json, .json.gz; "
    "per-rank files, rank_<N>/ folders, tensorboard_trace_handler's per-cycle files), Nsight Systems "
    "SQLite exports (nsys export --type sqlite; .nsys-rep reports where nsys is installed), rocpd "
    "databases (rocprofv3, ROCm 7), rocprofv3 CSV and JSON, rocprofv2 cli text and file-plugin "
    "results_<pid>.csv, legacy rocprof results.csv/.json. A directory is read as its files "
    "(docs/ingest.md)."
)
_READS_TRACES = ("ingest", "analyze", "explain", "residency", "compare", "advise", "serve", "export")


def _completed(cmd: click.Command) -> click.Command:
    """The shared parts of a subcommand, added once: the trace formats in its help, and
    ``--list-devices`` beside a ``--device-name``."""
    if cmd.name in _READS_TRACES and TRACE_FORMATS not in (cmd.epilog or ""):
        # after the command's own epilog (export's list of figures), not instead of it
        cmd.epilog = f"{cmd.epilog}\n\n{TRACE_FORMATS}" if cmd.epilog else TRACE_FORMATS
    names = {p.name for p in cmd.params}
    if "device_name" in names and "list_devices" not in names:
        cmd.params.append(click.Option(["--list-devices"], is_flag=True, expose_value=False, is_eager=True,
                                       callback=_list_devices, help="List the short GPU names --device-name takes "
                                       "(H100, MI300X, 'A100 80GB', ...) and what they stand for, and exit."))  # fmt: skip
    return cmd


def _list_devices(ctx: click.Context, _param, value: bool) -> None:
    if not value or ctx.resilient_parsing:
        return
    from overlapviz.domain.devices import device_catalog

    rows = device_catalog()
    width = max(len(r["name"]) for r in rows)
    pwidth = max(len(r["product"]) for r in rows)
    click.echo(f"{'name':<{width}}  {'product':<{pwidth}}  {'arch':<7}  SMs/CUs")
    for r in rows:
        click.echo(f"{r['name']:<{width}}  {r['product']:<{pwidth}}  {r['arch'] or '-':<7}  {r['num_sms'] or '-'}")
    click.echo("Also: any product name a driver reports (e.g. 'NVIDIA H100 80GB HBM3'), or an architecture "
               "(sm_90, gfx942). Names are matched ignoring case, spaces, '-' and '_'.")
    ctx.exit(0)


class _LazyGroup(click.Group):
    """Imports a subcommand's module only when it runs (or when its own help shows).

    ``overlapviz ingest`` should not pay for importing HoloViews and Panel, which only
    ``serve`` and ``export`` need, and ``overlapviz --help`` imports no subcommand at all.
    """

    def list_commands(self, ctx):
        return sorted(COMMANDS)

    def get_command(self, ctx, name):
        if name not in COMMANDS:
            return None
        return _completed(getattr(importlib.import_module(f"overlapviz.cli.{name}"), name))

    def resolve_command(self, ctx, args):
        name = args[0] if args else None
        if name is not None and not name.startswith("-") and name not in COMMANDS:
            import difflib

            close = difflib.get_close_matches(name, self.list_commands(ctx), n=1, cutoff=0.6)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            ctx.fail(f"No such command {name!r}.{hint} Commands: {', '.join(self.list_commands(ctx))}.")
        return super().resolve_command(ctx, args)

    def invoke(self, ctx):
        from overlapviz._extras import MissingExtra

        try:
            return super().invoke(ctx)
        except MissingExtra as exc:  # serve, or a drawn figure, in a base install: one line, no traceback
            raise click.ClickException(str(exc)) from None
        except click.ClickException as exc:  # every command's error: the tables' escaping rule (cli/_table.py)
            from overlapviz.dataset.outdir import display_path

            exc.message = "\n".join(display_path(line) for line in str(exc.message).split("\n"))
            raise

    def format_commands(self, ctx, formatter):
        rows = [(name, COMMANDS[name]) for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(
    cls=_LazyGroup,
    context_settings={"help_option_names": ["-h", "--help"], "auto_envvar_prefix": "OVERLAPVIZ"},
)
@click.version_option(__version__, prog_name="overlapviz")
def main() -> None:
    """Computation-communication overlap: collect, ingest, analyze, explain and show GPU traces."""
