"""Export benchmark: ``overlapviz export`` as a whole command (a fresh process: imports, tables, browser, drawing,
writing), this checkout side by side with another one in the same run.

Not a test: prints a Markdown table (and writes it as JSON with --json, row by row, so a run cut short keeps what it
measured). For every case the two checkouts' commands alternate (old, new, new, old, ...), so a machine whose speed
drifts (2 cores shared with other work) slows both alike; each figure is the median of --repeat runs and the ratio is
old / new. CPU is user + system of the command and its browser: on a shared machine it moves much less than the wall
time. Cases: every figure of the bundled samples (the H200 stand-in sweep, the paper grid) and of the real 8-rank DLRM
trace in png, svg and pdf, ``export --help``, and the timeline of a generated trace of one million kernels over 8 ranks
(``bench_dashboard.big_dataset``, kept in --work) in each format.

The commands share a table cache of the run's own (``OVERLAPVIZ_CACHE_DIR`` under --work, emptied at the start): by
default each checkout's command runs once untimed before its timed runs, so the times are those of an export whose
tables an earlier command computed (``overlapviz.dataset.computed``; a checkout without that table cache computes
them every time). ``--cold`` gives every command an empty cache of its own instead: the first export of a dataset.

The other checkout is a git worktree with its own virtual environment, e.g. today's code (commit 708e13e)::

    git worktree add --detach /tmp/ovz-708e13e 708e13e && cp -a .venv /tmp/ovz-708e13e/.venv
    (cd /tmp/ovz-708e13e && .venv/bin/python -m pip install -q --no-deps --no-build-isolation -e . \
        && .venv/bin/python setup.py -q build_ext --inplace)
    .venv/bin/python benchmarks/bench_export.py --old /tmp/ovz-708e13e [--repeat 3] [--json out.json] [--only DATASET,...]
        [--no-big | --big-only] [--quick] [--cold]

(``--old`` may also be a bare source tree, put first on this interpreter's path, as before.)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

_PAIR = ["--run", "cb-ar_baseline_tiled64x64x32-pad0k_p0_standin_072509d6", "--run", "cb-ar_optimized_tiled64x64x32-pad112k_p-1_standin_9b3b4e5c"]
CASES = {  # dataset -> (figure, extra options): every figure that applies to it (the sweep's runs have one rank each: no collectives)
    "h200_standin_sweep": [("timeline", []), ("breakdown", []), ("why", []), ("ranks", []), ("residency", []), ("budget", []),
                           ("heatmap", []), ("speedup", []), ("compare", _PAIR)],
    "h200_paper_grid": [("timeline", []), ("breakdown", []), ("why", []), ("ranks", []), ("residency", []), ("budget", []),
                        ("heatmap", []), ("speedup", [])],  # (116 runs of one rank: the per-run figures read one run of many)
    "param_dlrm_8rank": [("timeline", []), ("breakdown", []), ("why", []), ("collectives", []), ("ranks", []), ("residency", []),
                         ("budget", [])],
}  # fmt: skip
QUICK = {"h200_standin_sweep": {"why", "timeline", "heatmap", "budget"}, "h200_paper_grid": {"breakdown", "heatmap", "speedup"},
         "param_dlrm_8rank": {"timeline", "collectives"}}  # --quick: one of each kind of figure
SOURCES = {"h200_standin_sweep": ROOT / "sample_traces" / "h200_standin_sweep", "h200_paper_grid": ROOT / "sample_traces" / "h200_paper_grid",
           "param_dlrm_8rank": ROOT / "tests" / "data" / "kineto_real" / "param_dlrm_8rank"}  # fmt: skip


def _subreaper() -> None:
    """Become the reaper of the commands' orphans (Linux ``PR_SET_CHILD_SUBREAPER``): an export ends its chromium with
    SIGKILL, so the browser's renderer and zygote outlive it for a moment, are reparented here and reaped by
    ``_reap_orphans``; their CPU then counts in the command's (with init as their reaper it counted nowhere)."""
    import ctypes

    try:
        ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER (linux/prctl.h)
    except (OSError, AttributeError):
        pass


def _reap_orphans(timeout: float = 10.0) -> None:
    """Wait for every process left to this one (``_subreaper``), at most ``timeout`` seconds."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            time.sleep(0.01)


CACHE: dict = {}  # "dir": the table cache the commands share; "cold": a fresh one for every command


def _cache_env() -> dict:
    if CACHE.get("cold"):
        return {"OVERLAPVIZ_CACHE_DIR": tempfile.mkdtemp(prefix="cold-", dir=CACHE["dir"])}
    return {"OVERLAPVIZ_CACHE_DIR": str(CACHE["dir"])} if CACHE.get("dir") else {}


def command_time(checkout: str | None, args: list[str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of ``python -m overlapviz ARGS`` of ``checkout`` (None: this one): its own
    ``.venv/bin/python`` where it has one, else this interpreter with the checkout first on the path. CPU is user +
    system of the command and every process it started (chromedriver, chromium and its renderers, also those that
    outlive it by a moment): on a machine whose other work varies it moves much less than the wall time."""
    import resource

    env = {**os.environ, **_cache_env()}
    python = sys.executable
    if checkout and (Path(checkout) / ".venv" / "bin" / "python").exists():
        python = str(Path(checkout) / ".venv" / "bin" / "python")
    elif checkout:
        env["PYTHONPATH"] = checkout
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    # run outside any checkout: `python -m` puts the working directory first on sys.path, before PYTHONPATH (run from
    # this checkout, the "old" runs imported this checkout's code)
    proc = subprocess.run([python, "-m", "overlapviz", *args], env=env, capture_output=True, text=True, timeout=600,
                          cwd=tempfile.gettempdir())  # fmt: skip
    took = time.perf_counter() - t0
    _reap_orphans()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise RuntimeError(f"{checkout or 'this checkout'}: overlapviz {' '.join(args)}: {proc.stderr.strip()[-400:]}")
    return took, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def side_by_side(old: str, args_of, repeat: int) -> tuple[float, float, float, float]:
    """Medians (old wall, new wall, old CPU, new CPU) of ``repeat`` alternating runs; ``args_of(who)`` gives each
    run's arguments."""
    times: dict = {"old": [], "new": []}
    if not CACHE.get("cold"):  # untimed: the tables of this dataset and figure computed by an earlier command
        for who in ("old", "new"):
            command_time(old if who == "old" else None, args_of(who))
    for i in range(repeat):
        for who in (("old", "new") if i % 2 == 0 else ("new", "old")):
            times[who].append(command_time(old if who == "old" else None, args_of(who)))
    med = {w: [statistics.median(t[k] for t in times[w]) for k in (0, 1)] for w in times}
    return med["old"][0], med["new"][0], med["old"][1], med["new"][1]


def _commit(checkout: Path) -> str:
    try:
        return subprocess.run(["git", "-C", str(checkout), "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip() + ("" if not subprocess.run(["git", "-C", str(checkout), "status", "--porcelain"],
                                                                                    capture_output=True, text=True).stdout.strip() else "+changes")  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return "?"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", required=True, help="the other checkout: a worktree with its own .venv, or a source tree (its overlapviz/)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "ovz-bench")
    ap.add_argument("--formats", default="png,svg,pdf")
    ap.add_argument("--no-big", action="store_true", help="leave out the one-million-kernel timeline")
    ap.add_argument("--big-only", action="store_true", help="the one-million-kernel timeline only")
    ap.add_argument("--no-help", action="store_true", help="leave out `export --help`")
    ap.add_argument("--only", help="datasets of CASES, comma-separated")
    ap.add_argument("--quick", action="store_true", help="the figures of QUICK only")
    ap.add_argument("--json", type=Path, help="also write the rows here as JSON (after every row)")
    ap.add_argument("--results", type=Path, help="also write the wall times in readme_table's format here at the end "
                    "(benchmarks/results/export.json; then run benchmarks/readme_table.py)")  # fmt: skip
    ap.add_argument("--cold", action="store_true", help="every command with an empty table cache (the first export of a dataset); "
                    "default: the commands share one, each checkout's command run once untimed first")  # fmt: skip
    a = ap.parse_args()
    _subreaper()
    from overlapviz.ingest import ingest

    a.work.mkdir(parents=True, exist_ok=True)
    import shutil

    CACHE["dir"], CACHE["cold"] = a.work / "table-cache", a.cold
    shutil.rmtree(CACHE["dir"], ignore_errors=True)
    CACHE["dir"].mkdir()
    out = Path(tempfile.mkdtemp(prefix="ovz-bench-export-"))
    meta = {"old": f"{a.old} ({_commit(Path(a.old))})", "new": f"{ROOT} ({_commit(ROOT)})", "repeat": a.repeat, "cores": os.cpu_count(),
            "cache": "cold: an empty table cache per command" if a.cold else "warm: tables computed by an earlier command",
            "note": "medians of alternating runs (old, new, new, old, ...) on a machine shared with other work"}  # fmt: skip
    rows: list = []
    load_first = os.getloadavg()[0]

    def measure(name: str, figure: str, fmt: str, args_of) -> None:
        load = os.getloadavg()[0]
        try:
            t = side_by_side(a.old, args_of, a.repeat)
        except RuntimeError as exc:
            print(f"skipped {name} {figure} {fmt}: {exc}", file=sys.stderr)
            return
        rows.append({"dataset": name, "figure": figure, "format": fmt, "wall_old_s": t[0], "wall_new_s": t[1], "wall_ratio": t[0] / t[1],
                     "cpu_old_s": t[2], "cpu_new_s": t[3], "cpu_ratio": t[2] / t[3], "load_before": load})  # fmt: skip
        print(f"{name} {figure} {fmt}: wall {t[0]:.2f} -> {t[1]:.2f} s, CPU {t[2]:.2f} -> {t[3]:.2f} s (load {load:.1f})", file=sys.stderr)
        if a.json:
            a.json.write_text(json.dumps({**meta, "rows": rows}, indent=1))

    if not a.big_only and not a.no_help:
        measure("—", "export --help", "—", lambda who: ["export", "--help"])
    for name, cases in CASES.items():
        if a.big_only or (a.only and name not in a.only.split(",")):
            continue
        ds = a.work / name
        if not (ds / "dataset.json").exists():
            ingest([str(SOURCES[name])], ds, progress=False, overwrite=True)
        for figure, extra in cases:
            if a.quick and figure not in QUICK[name]:
                continue
            for fmt in a.formats.split(","):
                measure(name, figure, fmt, lambda who: ["export", str(ds), "--figure", figure, "-o", str(out / f"{who}-{name}-{figure}.{fmt}"), *extra])  # noqa: B023
    if not a.no_big:
        sys.path.insert(0, str(ROOT / "benchmarks"))
        from bench_dashboard import big_dataset

        big = big_dataset(a.work, 1_000_000, 8)
        for fmt in a.formats.split(","):
            measure("1M kernels, 8 ranks", "timeline", fmt, lambda who: ["export", str(big), "--figure", "timeline", "-o", str(out / f"{who}-big.{fmt}")])  # noqa: B023
    print("| dataset | figure | format | wall old (s) | wall new (s) | old / new | CPU old (s) | CPU new (s) | old / new |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['dataset']} | {r['figure']} | {r['format']} | {r['wall_old_s']:.2f} | {r['wall_new_s']:.2f} | {r['wall_ratio']:.2f} | "
              f"{r['cpu_old_s']:.2f} | {r['cpu_new_s']:.2f} | {r['cpu_ratio']:.2f} |")
    print(f"\nold {meta['old']}, new {meta['new']}; {os.cpu_count()} cores, shared; load average at the end {os.getloadavg()[0]:.1f}; "
          f"medians of {a.repeat} alternating runs")
    if a.results and rows:
        write_results(a.results, rows, _commit(Path(a.old)), a.repeat, load_first, a.cold)


def write_results(path: Path, rows: list[dict], old_label: str, repeat: int, load_before: float, cold: bool = False) -> None:
    """The rows' wall times as benchmarks/results/export.json (``readme_table.write``: new = value, old = baseline)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import readme_table

    def target(r: dict) -> str:
        return "<= 0.15 s" if r["figure"] == "export --help" else "<= 10 s" if r["dataset"].startswith("1M") else "<= 3 s"

    out = [readme_table.row(r["figure"] if r["figure"] == "export --help" else f"{r['dataset']} {r['figure']} {r['format']} (whole command)",
                            r["wall_new_s"], baseline=r["wall_old_s"], baseline_label=old_label, target=target(r)) for r in rows]  # fmt: skip
    readme_table.write(path, "export", "overlapviz export of the bundled samples and DLRM, as a whole command", out, load_before=load_before,
                       note=f"Medians of {repeat} alternating runs ({old_label}, this, this, {old_label}, ...), "
                            + ("each with an empty table cache (a dataset's first export)" if cold else
                               "after one untimed run of each (the tables an earlier command computed)")
                            + "; CPU seconds (command + browser) in the script's table.")  # fmt: skip


if __name__ == "__main__":
    main()
