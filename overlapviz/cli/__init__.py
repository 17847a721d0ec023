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
        return getattr(importlib.import_module(f"overlapviz.cli.{name}"), name)

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except click.ClickException as exc:  # every command's error: the tables' escaping rule (cli/_table.py)
            from overlapviz.outdir import display_path

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
