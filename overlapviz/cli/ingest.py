"""``overlapviz ingest``: traces (Chrome/Kineto, rocprof) into a Parquet dataset."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

import click

from overlapviz.cli._options import scheduler_option

if TYPE_CHECKING:
    from overlapviz.domain.rules import RuleSet


def build_rules(rule_texts: tuple[str, ...], comm_patterns: tuple[str, ...], rules_file: str | None) -> RuleSet | None:
    """The rule set the options ask for, or None when they ask for nothing (then runs keep their own).

    ``--rules-file`` replaces the defaults; ``--comm-pattern`` adds comm patterns for GPU
    kernels; ``--rule`` entries come first, in the order given, so they win over both.
    """
    if not (rule_texts or comm_patterns or rules_file):
        return None
    from overlapviz.domain.rules import Rule, RuleSet, default_rules, parse_rule

    base = default_rules()
    if rules_file:
        try:
            base = RuleSet.from_json(Path(rules_file).read_text())
        except OSError as exc:
            raise ValueError(f"{rules_file}: cannot read: {exc.strerror or exc}") from None
        except json.JSONDecodeError as exc:
            raise ValueError(f"{rules_file}: not valid JSON ({exc})") from None
        except UnicodeDecodeError:
            raise ValueError(f"{rules_file}: not UTF-8 text") from None
        except RecursionError:
            raise ValueError(f"{rules_file}: not a rule set (JSON nested too deeply)") from None
        except (ValueError, TypeError, AttributeError, KeyError) as exc:
            raise ValueError(f"{rules_file}: {exc}") from None
    overrides = [parse_rule(t) for t in rule_texts]
    overrides += [Rule("comm", p, ("kernel",)) for p in comm_patterns]
    return base.with_overrides(overrides)


@click.command("ingest")
@click.argument("sources", nargs=-1, required=True, type=click.Path(readable=False, path_type=str))  # ingest says why (one line)
@click.option("-o", "--output", "out", required=True, type=click.Path(readable=False, path_type=str), help="Dataset directory to create.")
@click.option("--run-id", default=None, help="Run id, when the sources make one run (default: the directory's or the lone file's name).")
@click.option("--overwrite", is_flag=True, help="Replace an existing overlapviz dataset at --output (never anything else; see docs/robustness.md); "
              "with --append: replace its runs whose ids the sources give again.")
@click.option("--append", is_flag=True, help="Add the runs to the existing dataset at --output (built beside it and swapped in: "
              "on any error it stays as it was). A run id it already has is an error (see --overwrite).")
@click.option("--skip-bad", is_flag=True, help="Go on past sources that cannot be read (missing, not a trace, corrupt), then list "
              "them on stderr. Exit status 0 when at least one run was ingested, 1 when none.")
@click.option("--workers", type=click.IntRange(min=1), default=None, help="Processes reading traces at once, this one included (default: min(2, CPUs); one when the traces hold under 32 MiB in all).")
@click.option(
    "--rule",
    "rule_texts",
    multiple=True,
    metavar="KIND=REGEX[@cat,...]",
    help="Classification rule, tried before the defaults (repeatable). KIND: comm, compute, memory, other.",
)
@click.option(
    "--comm-pattern",
    "comm_patterns",
    multiple=True,
    metavar="REGEX",
    help="Extra regex for comm kernels, beside the default communication vocabulary (docs/ingest.md) (repeatable).",
)
@click.option("--rules-file", type=click.Path(readable=False, path_type=str), default=None, help="JSON rule set replacing the defaults.")
@click.option("--align-clocks", "align_clocks", type=click.Choice(["collectives", "none"]), default=None,
              help="Align ranks' clocks on collective completion (NCCL/RCCL instances end within microseconds on every "
                   "rank): 'collectives' for every run of several ranks, 'none' never. Default: where the clocks are not "
                   "comparable (ranks on different hosts, or instances that end further apart than they lasted). "
                   "Offsets are added to every time of the rank, stored in ranks.clock_offset_ns and shown (docs/ingest.md).")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar and no summary line.")
@scheduler_option("Read the traces on a Dask cluster", local=" for a LocalCluster started and stopped here", after="")
def ingest(sources, out, run_id, overwrite, append, skip_bad, workers, rule_texts, comm_patterns, rules_file,
           align_clocks, quiet, scheduler) -> None:  # fmt: skip
    """Ingest PyTorch-profiler (Kineto) Chrome traces and rocprof output into a Parquet dataset.

    SOURCES are trace files (.json, .json.gz), directories of per-rank files (one run,
    named after the directory), collected run directories (manifest.json) or sweep
    directories of runs. Loose files form one run per parent directory, named
    after it (one run in all with --run-id); a file named alone from its directory is
    a run named after the file (worker0.pt.trace.json.gz -> worker0). Files of one
    directory that are not the ranks of one job (two give the same rank, their world
    sizes differ, or one says its world is 1 process) are a run each, named after the
    file (docs/ingest.md).
    """
    from overlapviz import lifetime
    from overlapviz.dataset import schema
    from overlapviz.ingest import ingest as run_ingest
    from overlapviz.ingest.files import display, printable

    skipped: list[tuple[str, str]] = []
    before = _runs_of(out) if append else set()
    try:
        # SIGTERM and SIGHUP (a job killed by its scheduler, a closed terminal) unwind like Ctrl-C, so the temporary
        # directory is removed on the way out; the next ingest of the same output removes what a SIGKILL left
        with lifetime.signals_interrupt(once=True), _left_out_on_stderr():
            rules = build_rules(rule_texts, comm_patterns, rules_file)
            if scheduler:
                if workers is not None:
                    raise ValueError("--workers and --scheduler are two engines: give one")
                if append or skip_bad:
                    raise ValueError("--append and --skip-bad are not yet passed to the cluster: run without --scheduler")
                from overlapviz.distributed import client_for, ingest_on

                with client_for(scheduler) as client:
                    path = ingest_on(client, list(sources), out, rules=rules, run_id=run_id, overwrite=overwrite,
                                     progress=None if not quiet else False, align_clocks=align_clocks or "auto")  # fmt: skip
            else:
                path = run_ingest(
                    list(sources),
                    out,
                    rules=rules,
                    run_id=run_id,
                    overwrite=overwrite,
                    workers=workers,
                    progress=None if not quiet else False,
                    skip_bad=skip_bad,
                    skipped=skipped,
                    append=append,
                    align_clocks=align_clocks or "auto",
                )
        meta = schema.read_metadata(path)
        n_ranks = _rows(path / "ranks.parquet")
    except ValueError as exc:
        _print_skipped(skipped)
        raise click.ClickException(printable(exc)) from None
    except KeyboardInterrupt:
        raise click.ClickException("interrupted") from None
    except Exception as exc:  # never a traceback for the user: one line, and the way to the traceback
        if os.environ.get(DEBUG_ENV, "") not in ("", "0"):
            raise
        first = (str(exc).strip().splitlines() or [""])[0][:300]
        raise click.ClickException(printable(
            f"internal error ({type(exc).__name__}: {first}); nothing was written; "
            f"please report it (set {DEBUG_ENV}=1 for the traceback)")) from None  # fmt: skip
    _print_skipped(skipped)
    if not quiet:
        n_runs = len(meta.get("runs", []))
        what = (f"{n_runs} run{'s' * (n_runs != 1)}, {n_ranks} rank{'s' * (n_ranks != 1)}, "
                f"{meta.get('n_kernels', 0):,} GPU activities (kernels, copies, memsets)")
        # profiling cycles: how per-cycle files became runs, on the same line
        how = "".join(f"; {line}" for line in meta.get("grouped_cycles") or [])
        if append:
            added = [r for r in meta.get("runs", []) if r not in before]
            click.echo(f"appended to {display(path)} ({len(added)} new run{'s' * (len(added) != 1)}): it now holds {what}{how}")
        else:
            click.echo(f"ingested {what} into {display(path)}{how}")
        for line in _clock_lines(path, None if not append else set(meta.get("runs", [])) - before):
            click.echo(printable(line))


def _clock_lines(path, runs: set | None) -> list[str]:
    """What ingest did to the clocks of the runs (``runs``; None: all): offsets added, clocks kept apart."""
    from overlapviz.dataset import schema
    from overlapviz.ingest.align import ClockFix, summary_lines

    ranks = schema.read_table(path, "ranks")
    by_run: dict = {}
    for row in ranks.select(["run_id", "rank", "clock_domain", "clock_offset_ns", "clock_note"]).to_pylist():
        if runs is None or row["run_id"] in runs:
            by_run.setdefault(row["run_id"], {})[row["rank"]] = ClockFix(row["clock_domain"], row["clock_offset_ns"],
                                                                         row["clock_note"])  # fmt: skip
    return [line for run_id, fixes in by_run.items() for line in summary_lines(run_id, fixes)]


def _runs_of(path: str) -> set[str]:
    """The run ids of the dataset at ``path`` (none where it is not one: ingest says why)."""
    from overlapviz.dataset import schema

    try:
        return set(schema.read_metadata(path).get("runs") or [])
    except ValueError:
        return set()


def _print_skipped(skipped: list[tuple[str, str]]) -> None:
    """--skip-bad's summary on stderr: each source left out and why, one line each."""
    from overlapviz.ingest.files import printable

    if not skipped:
        return
    click.echo(f"skipped {len(skipped)} source{'s' * (len(skipped) != 1)} (--skip-bad):", err=True)
    for path, why in skipped:
        click.echo("  " + printable(f"{path}: {why}"), err=True)


DEBUG_ENV = "OVERLAPVIZ_DEBUG"


def _rows(path: Path) -> int:
    """Rows of a Parquet file, opened by Python (its directory's name need not be UTF-8)."""
    import pyarrow.parquet as pq

    with open(path, "rb") as fh:
        return pq.ParquetFile(fh).metadata.num_rows


@contextlib.contextmanager
def _left_out_on_stderr():
    """Each file of a run's directory that looks like a rank trace but was not read, one line on stderr
    (discover.LeftOut), as it is found."""
    import warnings

    from overlapviz.ingest.discover import LeftOut
    from overlapviz.ingest.files import printable

    def show(message, category, filename, lineno, file=None, line=None, previous=warnings.showwarning):
        if issubclass(category, LeftOut):
            click.echo("warning: " + printable(str(message)), err=True)
        else:
            previous(message, category, filename, lineno, file, line)

    with warnings.catch_warnings():
        warnings.simplefilter("always", LeftOut)
        warnings.showwarning = show
        yield
