"""The options several commands take, each defined once here (its name, type, default, env var and help).

Only click is imported: every ``--help`` builds these, and ``--help`` imports no array library.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from overlapviz.cli._dataset import DATASET

if TYPE_CHECKING:
    from collections.abc import Callable

    Decorator = Callable[[Callable], Callable]

FORMATS = ("table", "json", "csv")
PER = ("rank", "step")  # metrics.PER, spelled here so that --help imports neither numpy nor pyarrow (a test checks they agree)

# the DATASET argument of every command that reads a dataset, or raw traces into the cache
dataset_argument = click.argument("dataset", type=DATASET)

format_option = click.option("--format", "fmt", type=click.Choice(FORMATS), default="table", show_default=True,
                             help="Output format.")  # fmt: skip

wide_option = click.option("--wide", is_flag=True, help="Table: every column, run ids in a column (default: the key "
                           "columns, each run's id on a line above its rows).")  # fmt: skip


def runs_option(help: str = "Only this run (repeatable).") -> Decorator:  # noqa: A002 (click's name)
    """``--run RUN_ID``, repeatable, into the parameter ``runs`` (a tuple)."""
    return click.option("--run", "runs", multiple=True, metavar="RUN_ID", help=help)


def per_option(help: str) -> Decorator:  # noqa: A002
    """``--per rank|step``, default rank."""
    return click.option("--per", type=click.Choice(PER), default="rank", show_default=True, help=help)


def scheduler_option(purpose: str = "Compute on a Dask cluster", local: str = "",
                     after: str = " Same results as without.") -> Decorator:  # fmt: skip
    """``--scheduler ADDRESS`` (``$OVERLAPVIZ_SCHEDULER``): the Dask cluster a command runs on.

    Its help is ``PURPOSE: <the addresses>LOCAL (<how to install>).AFTER``: what the command does there,
    and what it does with a ``local`` cluster it starts.
    """
    return click.option("--scheduler", envvar="OVERLAPVIZ_SCHEDULER", metavar="ADDRESS", default=None,
                        help=f"{purpose}: tcp://host:8786, a scheduler file, or local / local:N{local} "
                             f"(pip install 'overlapviz[dask]'; docs/dask.md).{after}")  # fmt: skip


def device_option(subject: str = "The GPU the traces ran on, for traces that do not say",
                  uses: str = "") -> Decorator:  # fmt: skip
    """``--device-name GPU`` (alias ``--arch``) into the parameter ``device_name``: a product name or an
    architecture, resolved by ``residency.device_override`` (``--list-devices`` comes with it: cli.__init__)."""
    return click.option("--device-name", "--arch", "device_name", metavar="GPU",
                        help=f"{subject} (a product name such as 'NVIDIA A100-SXM4-80GB', or an architecture such as "
                             f"sm_80 or gfx942){uses}.")  # fmt: skip
