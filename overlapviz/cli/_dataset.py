"""The DATASET argument every analysis command takes: a dataset directory, or raw traces ingested into the cache once."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import click


class DatasetOrTraces(click.ParamType):
    """A dataset directory (``dataset.json``), or trace files / directories of traces, which are
    ingested into overlapviz's cache (``$OVERLAPVIZ_CACHE_DIR``, else ``~/.cache/overlapviz``)
    keyed by their content, with one line on stderr saying so. Converts to the dataset path; for the commands
    that only read the dataset once (``HELD_COMMANDS``), traces ingested now convert to a ``schema.HeldDataset``
    of that path, whose tables are read from memory rather than back from the files just written."""

    name = "DATASET|TRACES"

    def convert(self, value, param, ctx):
        from overlapviz.dataset import cache

        path = Path(os.fsdecode(value))
        if ctx is not None:  # what the command read: an output may not be it (check_output)
            ctx.meta.setdefault(INPUTS_KEY, []).append(path)
        if not path.exists():
            raise click.ClickException(f"{path}: no such file or directory: not an overlapviz dataset, nor traces "
                                       "(give a dataset directory, or trace files to read)")
        if path.is_dir() and cache.is_dataset(path):
            return str(path)
        hold = ctx is not None and ctx.info_name in HELD_COMMANDS
        try:
            out = where = cache.cached_path([path])
            if not cache.is_dataset(out):  # cold: only now the ingest package (~0.1 s of imports a warm cache skips)
                out = _ingest(path, where, ctx if hold else None)
        except ValueError as exc:
            why = str(exc)
            why = why[len(f"{path}: "):] if why.startswith(f"{path}: ") else why
            hint = f" (`overlapviz ingest {path} -o DIR --skip-bad` reads the files it can)" if path.is_dir() else ""
            raise click.ClickException(f"{path}: not an overlapviz dataset (no dataset.json), nor traces overlapviz can read: "
                                       f"{why}{hint}") from None
        from overlapviz.dataset.outdir import display_path as shown  # a name's control characters as \xNN, as in errors

        click.echo(f"{shown(path)}: raw traces, read into {shown(where)} (cached; `overlapviz ingest {shown(path)} -o DIR` "
                   "keeps a dataset of your own)",
                   err=True)  # fmt: skip
        return str(out) if isinstance(out, Path) else out  # a HeldDataset: what was just ingested, held


def _ingest(path: Path, out: Path, ctx: click.Context | None):
    """The traces ``path`` ingested into the cache dataset ``out`` (``samples.cached_dataset``, its key already known).

    With ``ctx`` (a command that reads the dataset once, in this process): a ``HeldDataset`` whose files are
    written behind the command (``driver.ingest_held``), finished when ``ctx`` closes: a failure to keep them
    is then the command's error, unless another process cached the same traces meanwhile."""
    from overlapviz.dataset import cache

    ahead = _inflate_ahead(path) if ctx is not None else None
    from overlapviz.ingest import driver, files  # ~0.1 s of imports: the file inflates meanwhile

    if ahead is not None:
        files.READ_AHEAD[files.file_identity(ahead[0])] = ahead[1]
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        if ctx is None:
            return driver.ingest([str(path)], out, progress=None)
        held = driver.ingest_held([str(path)], out, progress=None, write_behind=True)
    except ValueError:
        if cache.is_dataset(out):  # another process ingested the same traces meanwhile
            return out
        raise
    finally:
        files.READ_AHEAD.clear()  # what the ingest did not take (a file it did not read) is not kept

    def finish() -> None:
        try:
            held.wait()
        except ValueError as exc:
            if not cache.is_dataset(out):
                raise click.ClickException(f"{exc} (the traces' dataset is not kept in the cache)") from None

    ctx.call_on_close(finish)
    return held


def _inflate_ahead(path: Path):
    """``(stat, inflated)``: the one gzip file of ``path`` (its ``os.stat``), read and inflated by a thread (the
    inflater releases the GIL: it runs while the ingest modules import); ``inflated()`` gives its bytes, or None
    where the file is not one gzip member that inflates to the size its trailer says. ``files.read_bytes`` takes
    them for that file unchanged (``files.READ_AHEAD``), else reads it. None where ``path`` holds not exactly one
    ``.gz`` file, or an inflation limit is set (``files.MAX_INFLATED_BYTES_ENV``: the thread does not know it)."""
    import stat
    import threading

    if os.environ.get("OVERLAPVIZ_MAX_INFLATED_BYTES"):
        return None
    try:
        found = [path] if path.is_file() else [p for p in path.rglob("*.gz") if p.is_file()]
        if len(found) != 1:
            return None
        st = os.stat(found[0])
        if not stat.S_ISREG(st.st_mode):
            return None
    except OSError:
        return None
    result: list = [None]

    def inflate() -> None:
        try:
            data = found[0].read_bytes()
            if data[:2] != b"\x1f\x8b":
                return
            try:
                from isal import isal_zlib as inflating
            except ImportError:  # pragma: no cover - zlib inflates the same bytes
                import zlib as inflating
            inflater = inflating.decompressobj(wbits=31)
            out = inflater.decompress(data, int.from_bytes(data[-4:], "little") + 1)
            if inflater.eof and not inflater.unused_data:
                result[0] = out
        except Exception:  # noqa: BLE001 - read_bytes reads the file again, and says what is wrong with it
            pass

    thread = threading.Thread(target=inflate, name="overlapviz-inflate", daemon=True)
    thread.start()

    def inflated() -> bytes | None:
        thread.join()
        return result[0]

    return st, inflated


DATASET = DatasetOrTraces()
# commands that read a dataset in this process and are done: the tables of traces just ingested stay held for them
# (serve and export hand the path on to servers and browsers)
HELD_COMMANDS = ("analyze", "explain")
INPUTS_KEY = "overlapviz.inputs"


def kept_answer(ctx: click.Context, dataset, *, use: bool = True) -> tuple[str | None, Callable[[str], None]]:
    """``(text, keep)``: the output an earlier process printed for this command, its options and ``dataset``
    (``overlapviz.dataset.computed``: the answer cache), or None; and ``keep(text)``, which keeps the output
    computed now for the next process.

    The key: the command, every option (the format, ``--wide``, ``--run``, ``--device-name``, ...), the
    dataset's path and a stamp of its files (a dataset written again, or a file of it changed, is another),
    overlapviz's version and code. Traces just ingested (a ``HeldDataset``) have no answer yet: theirs is
    kept once their dataset is in place (when ``ctx`` closes), and not at all if it could not be kept.
    ``use`` False (``--scheduler``), or ``OVERLAPVIZ_TABLE_CACHE=0``: nothing is read or kept."""
    import json

    from overlapviz.dataset import cache, computed

    if not use or not computed.enabled():
        return None, lambda text: None
    params = {k: v for k, v in ctx.params.items() if k != "dataset"}
    key = json.dumps({"command": ctx.command.name, "options": params}, sort_keys=True, default=str)

    def entry(path) -> tuple[Path, str] | None:
        path = os.path.realpath(path)
        return computed.answer_file(path, computed.dataset_stamp(path), key)

    if not isinstance(dataset, str):  # a HeldDataset: traces ingested now, their files written behind
        def keep_when_in_place(text: str) -> None:
            def keep() -> None:
                try:
                    path = dataset.wait()
                    found = entry(path) if cache.is_dataset(path) else None
                except (ValueError, OSError):  # not kept: the command fails saying so (_ingest); nor is its answer
                    return
                if found is not None:
                    computed.write_answer(*found, text)

            ctx.call_on_close(keep)  # before _ingest's finish (the last registered runs first): it waits the same

        return None, keep_when_in_place
    try:
        found = entry(dataset)
    except OSError:  # a file vanished while it was listed: no answer to trust
        return None, lambda text: None
    if found is None:
        return None, lambda text: None
    return computed.read_answer(*found), lambda text: computed.write_answer(*found, text) and None


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
