"""Collection from the root of a clone with a non-editable install, as CI and users run it (gloo, CPU), with no other extra.

``pip install .`` then ``overlapviz collect`` from the clone's root used to fail every run:
each rank was started as ``python -m overlapviz.collectors.run``, which puts the current
directory first on ``sys.path``, and the clone's own ``overlapviz/`` (no ``collectors``
inside) shadowed the installed package. Here a copy of the repository is installed
(``pip install --no-deps --no-build-isolation``, not editable) into a fresh virtual
environment that sees, of the running one, exactly the distributions ``pip install '.[collect]'``
brings (pyproject's dependencies, torch, what they require: no HoloViews, Bokeh, Panel, selenium),
and the README's CPU tour is run exactly as written from the copy's root; so are the trace tool
over the sample traces and ``serve``, which names the dashboard extra.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from _install import distributions, link_site

pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
TOUR = re.compile(r"<!-- cpu-tour -->\s*```bash\n(.*?)```\s*<!-- /cpu-tour -->", re.S)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs gloo"),
]


def tour_commands() -> list[str]:
    """The README's CPU tour: its commands, comments dropped."""
    m = TOUR.search((REPO / "README.md").read_text())
    assert m, "README.md: no <!-- cpu-tour --> ```bash ... ``` <!-- /cpu-tour --> block"
    lines = [ln.split("  #")[0].strip() for ln in m.group(1).splitlines()]
    return [ln for ln in lines if ln and not ln.startswith("#")]


def _clone_copy(dst: Path) -> Path:
    """What a clone holds: the repository without this checkout's environment, builds and caches."""
    ignore = shutil.ignore_patterns(".git", ".venv", "venv", "build", "dist", "*.egg-info", "__pycache__", "*.so",
                                    ".pytest_cache", ".hypothesis", ".whl", ".gl", ".devcarry")
    # runs/ of the root only (collect's output here): sample_traces/*/runs are the bundled traces
    shutil.copytree(REPO, dst, ignore=lambda d, names: set(ignore(d, names)) | ({"runs"} & set(names) if Path(d) == REPO else set()))
    return dst


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(clone root, the venv's bin directory) after a non-editable install of the copy."""
    base = tmp_path_factory.mktemp("install")
    root = _clone_copy(base / "clone")
    venv = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    vpython = venv / "bin" / "python"
    purelib = subprocess.run([str(vpython), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    # the dependencies of .[collect] (torch, pandas, pyarrow, click, ...) and the build's (setuptools, wheel) come
    # from this environment through a folder of links to those distributions alone, read after the new
    # environment's own site-packages; overlapviz is not linked (an editable install here is not seen there)
    deps = link_site(distributions("collect", build=True), base / "deps")
    Path(purelib, "_overlapviz_test_deps.pth").write_text(f"{deps}\n")
    # offline with this environment's setuptools where it is recent enough for pyproject.toml (SPDX
    # license: >= 77), else pip's build isolation fetches one
    offline = ["--no-build-isolation", "--no-index"] if _setuptools_at_least(77) else []
    # -v: the build backend's own output too (its warnings), kept for test_the_build_warns_of_nothing
    done = subprocess.run([sys.executable, "-m", "pip", "--python", str(vpython), "install", "--no-deps", *offline,
                           "-v", str(root)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (base / "pip.log").write_text(done.stdout + done.stderr)
    return root, venv / "bin"


def _setuptools_at_least(major: int) -> bool:
    try:
        from importlib.metadata import version

        return int(version("setuptools").split(".")[0]) >= major
    except Exception:  # not installed, or an odd version string
        return False


def _run(cmd, cwd: Path, bindir: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSAFEPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{bindir}{os.pathsep}{env.get('PATH', '')}"
    env["VIRTUAL_ENV"] = str(bindir.parent)
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
                          shell=isinstance(cmd, str), executable="/bin/bash" if isinstance(cmd, str) else None)


def test_the_install_holds_every_package_and_the_clone_does_not_shadow_it(installed):
    root, bindir = installed
    packages = sorted(p.parent.relative_to(root).as_posix().replace("/", ".")
                      for p in (root / "overlapviz").rglob("__init__.py"))
    probe = ("import importlib, sys\n"
             f"for name in {packages + ['overlapviz.collectors', 'overlapviz.dashboards']!r}:\n"
             "    try:\n"
             "        m = importlib.import_module(name)\n"
             "    except ImportError as exc:\n"
             "        print('MISSING', name, exc); continue\n"
             "    print('OK', name, m.__file__)\n")
    done = _run([str(bindir / "python"), "-P", "-c", probe], root, bindir)
    assert done.returncode == 0, done.stderr[-2000:]
    missing = [ln for ln in done.stdout.splitlines() if ln.startswith("MISSING")]
    assert not missing, ("a non-editable install lacks packages (pyproject.toml [tool.setuptools] packages): "
                         + "; ".join(missing))
    for ln in done.stdout.splitlines():
        assert str(root) not in ln, f"imported from the clone, not the install: {ln}"


def test_the_build_warns_of_nothing(installed):
    """Each folder of sample traces whose name Python could import drew a 45-line setuptools warning ("Package
    'overlapviz.sample_traces.scenarios' is absent from the `packages` configuration"): six of them, ~270 lines per
    install. The data installed is what [tool.setuptools.package-data] says (include-package-data = false)."""
    root, _ = installed
    log = (root.parent / "pip.log").read_text()
    assert "Successfully installed overlapviz" in log  # the verbose log of the build, not an empty one
    absent = re.findall(r"Package '([\w.]+)' is absent from the `packages` configuration", log)
    assert not absent, absent


def test_the_readme_cpu_tour_works_as_written_from_the_clone_root(installed):
    root, bindir = installed
    commands = tour_commands()
    assert commands[0].startswith("overlapviz collect --sweep cpu_tour")
    outputs = []
    for cmd in commands:
        done = _run(cmd, root, bindir, timeout=400)
        assert done.returncode == 0, f"{cmd}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        outputs.append(done.stdout)
    collect_out = outputs[0]
    assert "cpu_tour: 6 runs, 6 ok, 0 failed" in collect_out, collect_out
    assert "| cb-ar | torch.matmul fp32 |" in collect_out and "| mb-a2a | torch.matmul fp32 |" in collect_out
    runs = sorted((root / "runs" / "cpu" / "runs").iterdir())
    assert len(runs) == 6
    for rd in runs:
        assert sorted(p.name for p in rd.glob("trace_rank*.json.gz")) == ["trace_rank0.json.gz", "trace_rank1.json.gz"]


def test_the_trace_tool_runs_without_the_dashboard_extra(installed):
    """The base install's commands from the clone's root: explain over the bundled scenarios (raw traces, into the
    cache), the Perfetto export; serve and a drawn figure say in one line which extra to install."""
    root, bindir = installed
    assert _run([str(bindir / "python"), "-c", "import holoviews"], root, bindir).returncode != 0
    cache = root.parent / "cache"
    done = _run(f"OVERLAPVIZ_CACHE_DIR={cache} overlapviz explain sample_traces/scenarios/runs --summary", root, bindir)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "scenario-fits_sync-events-on" in done.stdout
    done = _run(f"overlapviz ingest sample_traces/scenarios/runs -q -o {root.parent / 'ds'} && overlapviz export "
                f"{root.parent / 'ds'} --format perfetto -o {root.parent / 'run.json.gz'}", root, bindir)  # fmt: skip
    assert done.returncode == 0 and (root.parent / "run.json.gz").stat().st_size > 1000, done.stderr[-3000:]
    for cmd in ("overlapviz serve", f"overlapviz export {root.parent / 'ds'} --figure timeline -o t.png"):
        done = _run(cmd, root, bindir, timeout=60)
        assert done.returncode == 1, (cmd, done.stdout[-2000:], done.stderr[-2000:])
        assert len(done.stderr.strip().splitlines()) == 1 and "pip install 'overlapviz[dashboard]'" in done.stderr, done.stderr
