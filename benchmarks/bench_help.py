"""``overlapviz --help`` and every subcommand's ``--help`` as whole commands (issue #36: each <= 0.15 s).

Not a test: prints a table. Each row is ``python -m overlapviz [CMD] --help`` in a fresh
process, run --repeat times; the commands take turns (one run of each, then the next
round), so a load that comes and goes falls on all of them alike; medians are shown, of
the wall time and of the CPU time (user + system: on a loaded machine the wall time is
mostly waiting for a core). ``python -c pass`` is the interpreter's own start, the floor.
The heavy column lists the libraries the command imported (``-X importtime``) among
numpy, pyarrow, pandas, holoviews, bokeh, panel and dask: it should be empty. With
``--baseline DIR`` (another checkout with its own .venv, e.g. the main branch), its times
are measured in the same rounds and shown beside.

    .venv/bin/python benchmarks/bench_help.py [--repeat 15] [--baseline /work/main] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HEAVY = ("numpy", "pyarrow", "pandas", "holoviews", "bokeh", "panel", "dask", "distributed")
TARGET_S = 0.15


def commands() -> list[str]:
    """The subcommands, from the click group (as ``overlapviz --help`` lists them)."""
    import click

    from overlapviz.cli import main

    return main.list_commands(click.Context(main))


def heavy_imports(python: str, cwd: Path, args: list[str]) -> list[str]:
    """The heavy top-level packages ``python -X importtime -m overlapviz ARGS`` imports."""
    res = subprocess.run([python, "-X", "importtime", "-m", "overlapviz", *args], cwd=cwd, capture_output=True, text=True,
                         check=True)  # fmt: skip
    found = {line.rsplit("|", 1)[-1].strip().split(".")[0] for line in res.stderr.splitlines() if line.startswith("import time:")}
    return sorted(found & set(HEAVY))


def timed(argv: list[str], cwd: Path) -> tuple[float, float]:
    """(wall seconds, CPU seconds: user + system) of one run of ``argv``. On a loaded machine the wall time
    mostly says how long the process waited for a core; its CPU time says what it cost."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise subprocess.CalledProcessError(proc.returncode, argv)
    return wall, usage.ru_utime + usage.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--baseline", type=Path, help="another checkout (with .venv) to time in the same rounds")
    ap.add_argument("--json", type=Path, help="also write the results here (benchmarks/results/help.json: the README's table)")
    opts = ap.parse_args()
    rows = [("(python -c pass)", None), ("overlapviz --help", [])] + [(f"{c} --help", [c]) for c in commands()]
    trees = {"this": (sys.executable, ROOT)}
    if opts.baseline:
        trees["baseline"] = (str(opts.baseline / ".venv" / "bin" / "python"), opts.baseline.resolve())
    load_before = os.getloadavg()[0]
    times: dict[tuple[str, str], list[tuple[float, float]]] = {(t, name): [] for t in trees for name, _ in rows}
    for _ in range(opts.repeat):
        for name, args in rows:
            for tree, (python, cwd) in trees.items():
                argv = [python, "-c", "pass"] if args is None else [python, "-m", "overlapviz", *args, "--help"]
                times[(tree, name)].append(timed(argv, cwd))

    def medians(tree: str, name: str) -> tuple[float, float]:
        runs = times[(tree, name)]
        return statistics.median(w for w, _ in runs), statistics.median(c for _, c in runs)

    results, extra = [], {}
    head = f"{'command':<22} {'wall s':>7} {'cpu s':>6}" + (f" {'base wall':>9} {'base cpu':>8}" if opts.baseline else "")
    print(f"{head}  {'<= 0.15':<7}  heavy imports")
    for name, args in rows:
        wall, cpu = medians("this", name)
        heavy = [] if args is None else heavy_imports(sys.executable, ROOT, [*args, "--help"])
        row = {"task": name, "value": round(wall, 3), "unit": "s", "baseline": None, "baseline_label": None,
               "target": None if args is None else f"<= {TARGET_S} s"}  # fmt: skip
        extra[name] = {"cpu_s": round(cpu, 3), "heavy": heavy}
        line = f"{name:<22} {wall:>7.3f} {cpu:>6.3f}"
        if opts.baseline:
            base_wall, base_cpu = medians("baseline", name)
            row |= {"baseline": round(base_wall, 3), "baseline_label": _commit(opts.baseline)}
            extra[name]["baseline_cpu_s"] = round(base_cpu, 3)
            line += f" {base_wall:>9.3f} {base_cpu:>8.3f}"
        ok = "" if args is None else ("yes" if wall <= TARGET_S else "NO")
        print(f"{line}  {ok:<7}  {', '.join(heavy) or '-'}")
        results.append(row)
    load = [round(load_before, 1), round(os.getloadavg()[0], 1)]
    print(f"load average (1 min) before and after: {load[0]} {load[1]} ({os.cpu_count()} CPUs)")
    if opts.json:  # the format of benchmarks/results/*.json (overlapviz-bench/1), from which the README's table is made
        doc = {"format": "overlapviz-bench/1", "benchmark": "help", "title": "--help of every command, as a whole command",
               "command": " ".join([".venv/bin/python", "benchmarks/bench_help.py", *sys.argv[1:]]),
               "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "commit": _commit(ROOT),
               "machine": f"{os.cpu_count()} cores, {platform.machine()}, Python {platform.python_version()}", "load": load,
               "note": f"Medians of {opts.repeat} fresh processes, the commands taking turns (wall time; cpu_s: user + "
                       "system, what a loaded machine does not inflate)" + (", alternating with the baseline checkout's"
                       if opts.baseline else "") + "; the CPU times and the heavy libraries imported (none) are in the file.",
               "rows": results, "per_command": extra}  # fmt: skip
        opts.json.write_text(json.dumps(doc, indent=1) + "\n")


def _commit(tree: Path) -> str:
    """The checkout's short HEAD, with -dirty when its code has uncommitted changes."""
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=tree, capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=tree, capture_output=True, text=True).stdout
    return head + ("-dirty" if dirty.strip() else "")

if __name__ == "__main__":
    main()
