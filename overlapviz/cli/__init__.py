"""The ``overlapviz`` command: one click group; each subcommand is a thin layer over a library function."""

from __future__ import annotations

import importlib
import importlib.util

import click

from overlapviz import __version__


@click.group(context_settings={"help_option_names": ["-h", "--help"], "auto_envvar_prefix": "OVERLAPVIZ"})
@click.version_option(__version__, prog_name="overlapviz")
def main() -> None:
    """Computation-communication overlap: collect, ingest, analyze, explain and show GPU traces."""


# one module per subcommand, each defining a click command named like the module
_COMMANDS = ("collect", "ingest", "analyze", "residency", "compare", "advise", "serve", "export")
for _name in _COMMANDS:
    if importlib.util.find_spec(f"overlapviz.cli.{_name}") is not None:  # TODO(foundation): plain imports once all exist
        main.add_command(getattr(importlib.import_module(f"overlapviz.cli.{_name}"), _name))
