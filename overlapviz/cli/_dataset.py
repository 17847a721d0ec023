"""The DATASET argument every analysis command takes: a dataset directory, or raw traces ingested into the cache once."""

from __future__ import annotations

import os
from pathlib import Path

import click


class DatasetOrTraces(click.ParamType):
    """A dataset directory (``dataset.json``), or trace files / directories of traces, which are
    ingested into overlapviz's cache (``$OVERLAPVIZ_CACHE_DIR``, else ``~/.cache/overlapviz``)
    keyed by their content, with one line on stderr saying so. Converts to the dataset path."""

    name = "DATASET|TRACES"

    def convert(self, value, param, ctx):
        from overlapviz.dataset.schema import METADATA_FILE

        path = Path(os.fsdecode(value))
        if ctx is not None:  # what the command read: an output may not be it (check_output)
            ctx.meta.setdefault(INPUTS_KEY, []).append(path)
        if not path.exists():
            raise click.ClickException(f"{path}: no such file or directory: not an overlapviz dataset, nor traces "
                                       "(give a dataset directory, or trace files to read)")
        if path.is_dir() and (path / METADATA_FILE).is_file():  # samples.is_dataset, before importing the ingest package (0.3 s)
            return str(path)
        from overlapviz.ingest import samples
        try:
            out = samples.cached_dataset([path], progress=None)
        except ValueError as exc:
            why = str(exc)
            why = why[len(f"{path}: "):] if why.startswith(f"{path}: ") else why
            hint = f" (`overlapviz ingest {path} -o DIR --skip-bad` reads the files it can)" if path.is_dir() else ""
            raise click.ClickException(f"{path}: not an overlapviz dataset (no dataset.json), nor traces overlapviz can read: "
                                       f"{why}{hint}") from None
        from overlapviz.dataset.outdir import display_path as shown  # a name's control characters as \xNN, as in errors

        click.echo(f"{shown(path)}: raw traces, read into {shown(out)} (cached; `overlapviz ingest {shown(path)} -o DIR` "
                   "keeps a dataset of your own)",
                   err=True)  # fmt: skip
        return str(out)


DATASET = DatasetOrTraces()
INPUTS_KEY = "overlapviz.inputs"


def check_output(out: str | os.PathLike, *inputs: str | os.PathLike, may_be_dataset: bool = False) -> None:
    """Refuse, before anything is written, an output of a command that is or holds one of its inputs
    (the DATASET arguments as given and as read, and ``inputs``) or lies inside a dataset
    (``outdir.check_output``): a ``click.ClickException`` of one line."""
    from overlapviz.dataset import outdir

    ctx = click.get_current_context(silent=True)
    given = [*(ctx.meta.get(INPUTS_KEY, []) if ctx is not None else []), *inputs]
    try:
        outdir.check_output(out, given, may_be_dataset=may_be_dataset)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
