"""The base install (``pip install .``, no extras) is the trace tool: every command but the dashboard and the drawn
figures works with only pyproject's ``[project] dependencies``; ``serve`` and the figure formats of ``export`` say in
one line which extra to install.

The real CLI runs in a fresh interpreter whose ``sitecustomize`` (first on ``PYTHONPATH``) marks absent, in
``sys.modules``, every top-level module of every installed distribution outside the base dependencies and their own
requirements (computed from pyproject.toml and the installed metadata): holoviews, bokeh, panel, selenium, param,
jinja2, dask, pytest, ... An import of any of them fails as if it were not installed, and ``importlib.util.find_spec``
answers None for it, as it does in a base install.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from _install import distributions, norm
from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[1]
SCENARIOS = REPO / "sample_traces" / "scenarios" / "runs"
DLRM = REPO / "tests" / "data" / "kineto_real" / "param_dlrm_8rank"
# always in a virtual environment made by `python -m venv` (Python 3.11), whatever the project needs
VENV_OWN = {"pip", "setuptools"}
INSTALL_HINT = "pip install 'overlapviz[dashboard]'"

SITECUSTOMIZE = '''
"""Only the base install's distributions (and the standard library) can be imported."""
import importlib.metadata as md
import os
import re
import sys

allowed = set(os.environ["OVERLAPVIZ_TEST_ALLOWED_DISTS"].split(","))


def _norm(name):
    return re.sub(r"[-_.]+", "-", name).lower()


for top, dists in md.packages_distributions().items():
    if top.isidentifier() and top not in sys.modules and not any(_norm(d) in allowed for d in dists):
        sys.modules[top] = None  # import fails with ModuleNotFoundError; find_spec answers None
'''


@pytest.fixture(scope="module")
def base_env(tmp_path_factory):
    site = tmp_path_factory.mktemp("base_only")
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSAFEPATH")}
    env["PYTHONPATH"] = str(site)
    env["OVERLAPVIZ_TEST_ALLOWED_DISTS"] = ",".join(sorted(distributions() | VENV_OWN))
    env["OVERLAPVIZ_CACHE_DIR"] = str(tmp_path_factory.mktemp("cache"))
    return env


def overlapviz(env: dict, *args, cwd: Path | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """``overlapviz ARGS`` as the console script runs it, in a fresh interpreter with only the base install importable."""
    return subprocess.run([sys.executable, "-m", "overlapviz", *map(str, args)], env=env, cwd=cwd or REPO,
                          capture_output=True, text=True, timeout=timeout, check=False)  # fmt: skip


def test_the_dashboard_extra_holds_what_the_commands_check_for():
    from overlapviz._extras import DASHBOARD

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    extra = {norm(Requirement(r).name) for r in project["optional-dependencies"]["dashboard"]}
    assert extra == set(DASHBOARD)
    assert not extra & {norm(Requirement(r).name) for r in project["dependencies"]}
    assert "overlapviz[dashboard]" in project["optional-dependencies"]["test"]  # .ci/run installs .[test,collect]


def test_the_blocker_blocks_the_dashboard_packages_and_keeps_the_base(base_env):
    probe = ("import importlib, importlib.util\n"
             "for name in ('holoviews', 'bokeh', 'panel', 'selenium', 'param', 'dask', 'pytest'):\n"
             "    assert importlib.util.find_spec(name) is None, name\n"
             "    try:\n        importlib.import_module(name)\n    except ModuleNotFoundError:\n        pass\n"
             "    else:\n        raise AssertionError(name)\n"
             "import numpy, pandas, pyarrow, click, msgspec, orjson, tqdm\nprint('ok')\n")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", probe], env=base_env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]


@pytest.fixture(scope="module")
def datasets(base_env, tmp_path_factory):
    """The scenarios' and PARAM DLRM's traces ingested by the base install."""
    out = tmp_path_factory.mktemp("datasets")
    made = {}
    for name, src in (("scenarios", SCENARIOS), ("dlrm", DLRM)):
        done = overlapviz(base_env, "ingest", src, "-o", out / name, "-q")
        assert done.returncode == 0, done.stderr[-3000:]
        made[name] = out / name
    return made


@pytest.mark.parametrize("command", ["", "collect", "ingest", "analyze", "explain", "residency", "compare", "advise",
                                     "serve", "export"])  # fmt: skip
def test_every_help_works_without_the_dashboard(base_env, command):
    done = overlapviz(base_env, *([command] if command else []), "--help")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Usage: overlapviz" in done.stdout


@pytest.mark.parametrize("args", [
    ["analyze", "{scenarios}"],
    ["analyze", "{dlrm}", "--per", "step", "--format", "json"],
    ["explain", "{scenarios}"],
    ["explain", "{dlrm}", "--findings"],
    ["explain", "{dlrm}", "--breakdown"],
    ["explain", "{dlrm}", "--instances"],
    ["explain", "{scenarios}", "--summary", "--format", "csv"],
    ["advise", "{scenarios}", "--run", "scenario-fits_sync-events-on", "--compute", "ovz_gemm", "--comm", "ovz_comm"],
    ["advise", "--arch", "sm_90", "--compute-shape", "256,48,16384", "--comm-shape", "512,96,23552", "-k", "1"],
    ["compare", "{scenarios}"],
    ["residency", "{scenarios}"],
    ["explain", SCENARIOS],  # raw traces: ingested into the cache first
])  # fmt: skip
def test_the_trace_tool_works_without_the_dashboard(base_env, datasets, args):
    done = overlapviz(base_env, *(str(a).format(**datasets) for a in args))
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip(), done.stderr[-3000:]


def test_perfetto_export_works_without_the_dashboard(base_env, datasets, tmp_path):
    out = tmp_path / "dlrm.json.gz"
    done = overlapviz(base_env, "export", datasets["dlrm"], "--format", "perfetto", "-o", out)
    assert done.returncode == 0, done.stderr[-3000:]
    assert out.stat().st_size > 1000


def test_the_api_tables_work_without_the_dashboard_and_figures_name_the_extra(base_env, datasets):
    code = ("import sys, overlapviz\n"
            "ds = overlapviz.open(sys.argv[1])\n"
            "print(len(ds.findings()), len(ds.analyze()), len(ds.explain(summary=True)))\n"
            "try:\n    ds.timeline()\nexcept ImportError as exc:\n    print('ImportError:', exc)\n")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", code, str(datasets["dlrm"])], env=base_env, capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    counts, error = done.stdout.strip().splitlines()
    assert all(int(n) > 0 for n in counts.split()), done.stdout
    assert error.startswith("ImportError: ") and INSTALL_HINT in error, error


@pytest.mark.parametrize("args", [
    ["serve", "{scenarios}"],
    ["serve"],  # the bundled samples
    ["serve", "{scenarios}", "--get", "/"],
    ["export", "{scenarios}", "--figure", "timeline", "-o", "{tmp}/t.png"],
    ["export", "{scenarios}", "--figure", "why", "-o", "{tmp}/t.html"],
    ["export", "{scenarios}", "--all", "-o", "{tmp}/all"],
])  # fmt: skip
def test_the_dashboard_and_figures_say_which_extra_in_one_line(base_env, datasets, tmp_path, args):
    # a server that starts instead runs into the timeout: a failure too
    done = overlapviz(base_env, *(a.format(tmp=tmp_path, **datasets) for a in args), timeout=60)
    assert done.returncode != 0, done.stdout[-3000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr[-3000:]
    assert lines[0].startswith(f"Error: overlapviz {args[0]} ") and "'dashboard' extra" in lines[0] \
        and INSTALL_HINT in lines[0], lines[0]  # fmt: skip
    assert not list(tmp_path.iterdir())  # nothing written
