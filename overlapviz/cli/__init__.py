"""The ``overlapviz`` command: one click group; each subcommand is a thin layer over a library function."""

from __future__ import annotations

import importlib

import click

from overlapviz import __version__

# one module per subcommand, each defining a click command named like the module
COMMANDS = ("collect", "ingest", "analyze", "explain", "residency", "compare", "advise", "serve", "export")


class _LazyGroup(click.Group):
    """Imports a subcommand's module only when it runs (or when help lists it).

    ``overlapviz ingest`` should not pay for importing HoloViews and Panel, which
    only ``serve`` and ``export`` need: that is seconds on a small machine.
    """

    def list_commands(self, ctx):
        return sorted(COMMANDS)

    def get_command(self, ctx, name):
        if name not in COMMANDS:
            return None
        return getattr(importlib.import_module(f"overlapviz.cli.{name}"), name)


@click.group(
    cls=_LazyGroup,
    context_settings={"help_option_names": ["-h", "--help"], "auto_envvar_prefix": "OVERLAPVIZ"},
)
@click.version_option(__version__, prog_name="overlapviz")
def main() -> None:
    """Computation-communication overlap: collect, ingest, analyze, explain and show GPU traces."""
