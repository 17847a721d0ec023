"""Export benchmark: ``overlapviz export`` as a whole command (a fresh process: imports, tables, browser, drawing,
writing), this checkout side by side with another one in the same run.

Not a test: prints a Markdown table. For every case the two checkouts' commands alternate (old, new, new, old, ...),
so a machine whose speed drifts (2 cores shared with other work) slows both alike; each figure is the median of
--repeat runs and the ratio is old / new. Cases: every figure of the bundled samples (the H200 stand-in sweep and
paper grid) and of the real 8-rank DLRM trace in png, svg and pdf, ``export --help``, and the timeline of a generated
trace of one million kernels over 8 ranks (``bench_dashboard.big_dataset``, kept in --work).

The other checkout is a source tree, e.g. today's code before issue 33::

    git archive 0ed1792 overlapviz | tar -x -C /tmp/ovz-old   # (copy the built overlapviz/ingest/*.so beside it)
    .venv/bin/python benchmarks/bench_export.py --old /tmp/ovz-old [--repeat 3] [--work /tmp/ovz-bench] [--no-big] [--quick]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CASES = {  # dataset -> (figure, extra options)
    "h200_standin_sweep": [("why", []), ("timeline", []), ("residency", []), ("ranks", []), ("budget", []), ("heatmap", []),
                           ("speedup", [])],
    "h200_paper_grid": [("heatmap", []), ("speedup", []), ("timeline", [])],
    "param_dlrm_8rank": [("timeline", []), ("why", []), ("collectives", []), ("ranks", []), ("residency", []), ("budget", [])],
}  # fmt: skip
QUICK = {"h200_standin_sweep": {"why", "timeline", "heatmap", "budget"}, "h200_paper_grid": {"heatmap", "speedup"},
         "param_dlrm_8rank": {"timeline", "collectives"}}  # --quick: one of each kind of figure
SOURCES = {"h200_standin_sweep": ROOT / "sample_traces" / "h200_standin_sweep", "h200_paper_grid": ROOT / "sample_traces" / "h200_paper_grid",
           "param_dlrm_8rank": ROOT / "tests" / "data" / "kineto_real" / "param_dlrm_8rank"}  # fmt: skip


def command_time(pythonpath: str | None, args: list[str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of ``python -m overlapviz ARGS`` with ``pythonpath`` first on the path (None: this
    checkout). CPU is user + system of the command and everything it waited for (chromedriver, chromium): on a machine
    whose other work varies it moves much less than the wall time."""
    import resource

    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    # run outside any checkout: `python -m` puts the working directory first on sys.path, before PYTHONPATH (run from
    # this checkout, the "old" runs imported this checkout's code)
    proc = subprocess.run([sys.executable, "-m", "overlapviz", *args], env=env, capture_output=True, text=True, timeout=600,
                          cwd=tempfile.gettempdir())  # fmt: skip
    took = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise RuntimeError(f"{pythonpath or 'this checkout'}: overlapviz {' '.join(args)}: {proc.stderr.strip()[-400:]}")
    return took, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def side_by_side(old: str, args_of, repeat: int) -> tuple[float, float, float, float]:
    """Medians (old wall, new wall, old CPU, new CPU) of ``repeat`` alternating runs; ``args_of(who)`` gives each
    run's arguments."""
    times: dict = {"old": [], "new": []}
    for i in range(repeat):
        for who in (("old", "new") if i % 2 == 0 else ("new", "old")):
            times[who].append(command_time(old if who == "old" else None, args_of(who)))
    med = {w: [statistics.median(t[k] for t in times[w]) for k in (0, 1)] for w in times}
    return med["old"][0], med["new"][0], med["old"][1], med["new"][1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", required=True, help="the other checkout's source tree (its overlapviz/ package)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "ovz-bench")
    ap.add_argument("--formats", default="png,svg,pdf")
    ap.add_argument("--no-big", action="store_true", help="leave out the one-million-kernel timeline")
    ap.add_argument("--only", help="one dataset of CASES")
    ap.add_argument("--quick", action="store_true", help="the figures of QUICK only")
    a = ap.parse_args()
    from overlapviz.ingest import ingest

    a.work.mkdir(parents=True, exist_ok=True)
    out = Path(tempfile.mkdtemp(prefix="ovz-bench-export-"))
    rows = []
    rows.append(("—", "export --help", "—", *side_by_side(a.old, lambda who: ["export", "--help"], a.repeat)))
    for name, cases in CASES.items():
        if a.only and name != a.only:
            continue
        ds = a.work / name
        if not (ds / "dataset.json").exists():
            ingest([str(SOURCES[name])], ds, progress=False, overwrite=True)
        for figure, extra in cases:
            if a.quick and figure not in QUICK[name]:
                continue
            for fmt in a.formats.split(","):
                args = lambda who: ["export", str(ds), "--figure", figure, "-o", str(out / f"{who}-{figure}.{fmt}"), *extra]  # noqa: E731
                try:
                    t = side_by_side(a.old, args, a.repeat)
                except RuntimeError as exc:
                    print(f"skipped {name} {figure} {fmt}: {exc}", file=sys.stderr)
                    continue
                rows.append((name, figure, fmt, *t))
                print(f"{name} {figure} {fmt}: wall {t[0]:.2f} -> {t[1]:.2f} s, CPU {t[2]:.2f} -> {t[3]:.2f} s", file=sys.stderr)
    if not a.no_big:
        sys.path.insert(0, str(ROOT / "benchmarks"))
        from bench_dashboard import big_dataset

        big = big_dataset(a.work, 1_000_000, 8)
        for fmt in ("png", "pdf"):
            t = side_by_side(a.old, lambda who: ["export", str(big), "--figure", "timeline", "-o", str(out / f"{who}-big.{fmt}")], a.repeat)
            rows.append(("1M kernels, 8 ranks", "timeline", fmt, *t))
            print(f"1M timeline {fmt}: wall {t[0]:.2f} -> {t[1]:.2f} s, CPU {t[2]:.2f} -> {t[3]:.2f} s", file=sys.stderr)
    print("| dataset | figure | format | wall old (s) | wall new (s) | old / new | CPU old (s) | CPU new (s) | old / new |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, figure, fmt, wo, wn, co, cn in rows:
        print(f"| {name} | {figure} | {fmt} | {wo:.2f} | {wn:.2f} | {wo / wn:.2f} | {co:.2f} | {cn:.2f} | {co / cn:.2f} |")
    print(f"\n{os.cpu_count()} cores; load average at the end {os.getloadavg()[0]:.1f}; medians of {a.repeat} alternating runs")


if __name__ == "__main__":
    main()
