"""``--help`` of every command is light (issue #36), and the options several commands take are defined once (#34).

Help must come at the interpreter's pace: no array, dataframe, plotting or cluster library
on its path. Checked by what a fresh ``python -X importtime -m overlapviz CMD --help``
imports, never by its time (benchmarks/bench_help.py times it).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import click
import pytest

from overlapviz.cli import main

ROOT = Path(__file__).resolve().parent.parent
HEAVY = ("numpy", "pyarrow", "pandas", "holoviews", "bokeh", "panel", "dask", "distributed")
SUBCOMMANDS = main.list_commands(click.Context(main))


@pytest.mark.parametrize("command", [None, *SUBCOMMANDS])
def test_help_imports_no_heavy_library(command, tmp_path):
    args = ["--help"] if command is None else [command, "--help"]
    res = subprocess.run([sys.executable, "-X", "importtime", "-m", "overlapviz", *args], cwd=tmp_path, capture_output=True,
                         text=True, timeout=120, check=False)  # fmt: skip
    assert res.returncode == 0 and "Usage:" in res.stdout, res.stderr[-2000:]
    imported = [line.rsplit("|", 1)[-1].strip() for line in res.stderr.splitlines() if line.startswith("import time:")]
    assert "overlapviz.cli" in imported, imported  # the listing is what was imported (not an empty one)
    heavy = sorted({m.split(".")[0] for m in imported} & set(HEAVY))
    assert not heavy, f"overlapviz {' '.join(args)} imports {heavy}"


def test_defaults_spelled_for_help_are_the_library_s():
    # spelled in the CLI so that --help imports neither numpy nor pyarrow; they must not drift from the library's
    from overlapviz.analysis import metrics, statistics
    from overlapviz.cli import _options, collect, compare
    from overlapviz.collectors.scenarios import SCENARIOS

    assert _options.PER == metrics.PER
    assert collect.SCENARIOS == tuple(SCENARIOS)
    assert (compare.LEVEL, compare.RESAMPLES, compare.SEED) == (
        statistics.DEFAULT_LEVEL, statistics.DEFAULT_RESAMPLES, statistics.DEFAULT_SEED)  # fmt: skip


SHARED = {"--scheduler": "scheduler_option", "--device-name": "device_option", "--run": "runs_option", "--wide": "wide_option"}


def test_shared_options_are_defined_once():
    """No command spells a shared option again (cli/_options.py defines each), and every command that takes one
    takes it with the same name, type, default and environment variable."""
    for path in sorted((ROOT / "overlapviz" / "cli").glob("*.py")):
        if path.name == "_options.py":
            continue
        source = path.read_text()
        for flag, helper in SHARED.items():
            assert not re.search(rf"click\.option\(\s*\"{flag}\"", source), f"{path.name} defines {flag}: use _options.{helper}"
    seen: dict[str, tuple] = {}
    for name in SUBCOMMANDS:
        for p in main.get_command(click.Context(main), name).params:
            if set(p.opts) & {"--scheduler", "--device-name", "--format", "--run", "--wide"}:
                fmt_choice = tuple(p.type.choices) if isinstance(p.type, click.Choice) else None
                if p.opts == ["--format"] and fmt_choice != ("table", "json", "csv"):
                    continue  # export's --format is the figure's file format, another option
                key = (tuple(p.opts), p.name, p.envvar, p.metavar, p.default, p.multiple, p.is_flag, fmt_choice)
                assert seen.setdefault(p.opts[0], key) == key, (name, key, seen[p.opts[0]])
    assert {"--scheduler", "--device-name", "--format", "--run", "--wide"} <= set(seen), seen
