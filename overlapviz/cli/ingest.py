"""``overlapviz ingest``: traces (Chrome/Kineto, rocprof) into a Parquet dataset."""

from __future__ import annotations

import json
from pathlib import Path

import click

from overlapviz.rules import COMM_PATTERN, Rule, RuleSet, default_rules, parse_rule


def build_rules(rule_texts: tuple[str, ...], comm_patterns: tuple[str, ...], rules_file: str | None) -> RuleSet | None:
    """The rule set the options ask for, or None when they ask for nothing (then runs keep their own).

    ``--rules-file`` replaces the defaults; ``--comm-pattern`` adds comm patterns for GPU
    kernels; ``--rule`` entries come first, in the order given, so they win over both.
    """
    if not (rule_texts or comm_patterns or rules_file):
        return None
    base = default_rules()
    if rules_file:
        try:
            base = RuleSet.from_json(Path(rules_file).read_text())
        except OSError as exc:
            raise ValueError(f"{rules_file}: cannot read: {exc.strerror or exc}") from None
        except json.JSONDecodeError as exc:
            raise ValueError(f"{rules_file}: not valid JSON ({exc})") from None
        except (ValueError, TypeError) as exc:
            raise ValueError(f"{rules_file}: {exc}") from None
    overrides = [parse_rule(t) for t in rule_texts]
    overrides += [Rule("comm", p, ("kernel",)) for p in comm_patterns]
    return base.with_overrides(overrides)


@click.command("ingest")
@click.argument("sources", nargs=-1, required=True, type=click.Path(path_type=str))
@click.option("-o", "--output", "out", required=True, type=click.Path(path_type=str), help="Dataset directory to create.")
@click.option("--run-id", default=None, help="Run id, when the sources make one run (default: the directory name).")
@click.option("--overwrite", is_flag=True, help="Replace an existing dataset at --output.")
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
    help=f"Extra regex for comm kernels, beside the default {COMM_PATTERN!r} (repeatable).",
)
@click.option("--rules-file", type=click.Path(path_type=str), default=None, help="JSON rule set replacing the defaults.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar and no summary line.")
def ingest(sources, out, run_id, overwrite, workers, rule_texts, comm_patterns, rules_file, quiet) -> None:
    """Ingest PyTorch-profiler (Kineto) Chrome traces and rocprof output into a Parquet dataset.

    SOURCES are trace files (.json, .json.gz), directories of per-rank files (one run,
    named after the directory), collected run directories (manifest.json) or sweep
    directories of runs. Loose files form one run per parent directory, named
    after it (one run in all with --run-id).
    """
    from overlapviz import schema
    from overlapviz.ingest import ingest as run_ingest

    try:
        rules = build_rules(rule_texts, comm_patterns, rules_file)
        path = run_ingest(
            list(sources),
            out,
            rules=rules,
            run_id=run_id,
            overwrite=overwrite,
            workers=workers,
            progress=None if not quiet else False,
        )
        meta = schema.read_metadata(path)
        ranks = schema.read_table(path, "ranks")
    except ValueError as exc:
        raise click.ClickException(" ".join(str(exc).split())) from None
    if not quiet:
        n_runs = len(meta.get("runs", []))
        click.echo(f"ingested {n_runs} run{'s' * (n_runs != 1)}, {ranks.num_rows} rank{'s' * (ranks.num_rows != 1)}, {meta.get('n_kernels', 0)} kernels into {path}")
