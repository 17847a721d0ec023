"""The answer on a million kernels over 8 ranks: findings, the breakdown and `explain --instances`, beside the previous version.

Not a test: prints a table. The dataset is bench_explain's (compute kernels on one stream,
every 10th kernel an all-reduce on another, ProcessGroupNCCL's event pattern on the host,
an H200's limits), written straight through the DatasetWriter. Targets (issue "The answer,
stated"): findings and breakdown < 2 s after ingest, `explain --instances` < 2 s.

The previous version is commit PREVIOUS, exported with `git archive` into the work folder and
run as a whole command there (`python -m overlapviz explain DS --instances`), alternating with
this version's command, medians of ``--repeat``.

    .venv/bin/python benchmarks/bench_answer.py [--kernels 1000000] [--ranks 8] [--repeat 3] [--work /tmp/ovz-bench]
        [--json benchmarks/results/answer.json]   # also the result file the README's table is made of

``--commands``: the answer as one command on raw traces (issue "Fast as a command"), each in a fresh
process, cold (an empty ``OVERLAPVIZ_CACHE_DIR``) and warm (the same cache again): on DLRM (tests/data,
8 ranks) ``explain --instances`` and ``explain`` (the findings first), this version against commit
BEFORE, alternating; on a generated 100k-kernel single-rank trace, ``analyze TRACE`` against HTA 0.5's
in-call load + overlap (``TraceAnalysis`` + ``get_comm_comp_overlap``, bench_ingest's worker, in HTA's
own venv: ``--hta-python``), both sides' bytecode compiled first. Wall seconds and CPU seconds (user +
system of the command, from wait4: on a shared machine the CPU seconds move less), medians of
``--repeat``; records into benchmarks/results/answer_commands.json.

    .venv/bin/python benchmarks/bench_answer.py --commands [--repeat 5] [--hta-python PATH] [--old TREE] [--only TEXT]

``--old TREE``: the baseline is the checkout TREE run by its own ``TREE/.venv`` (a worktree made as
bench_export.py's docstring shows), instead of commit BEFORE; ``--only TEXT``: the cases whose name holds TEXT.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_explain import build  # noqa: E402
from bench_explain import timed as _timed  # noqa: E402

PREVIOUS = "0ed1792"  # the last commit before the breakdown and findings
BEFORE = "708e13e"  # the last commit before raw traces were answered from memory (--commands)
DLRM = Path(__file__).resolve().parent.parent / "tests" / "data" / "kineto_real" / "param_dlrm_8rank"
ROOT = Path(__file__).resolve().parent.parent


def previous_tree(work: Path, commit: str = PREVIOUS) -> Path:
    out = work / f"overlapviz-{commit}"
    if not (out / "overlapviz").exists():
        out.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", commit, "overlapviz"], capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(out)], input=archive, check=True)
        for so in (ROOT / "overlapviz" / "ingest").glob("_*.so"):  # the C readers, unchanged since
            (out / "overlapviz" / "ingest" / so.name).write_bytes(so.read_bytes())
    return out


def command(tree: Path, *args: str) -> float:
    env = dict(os.environ, PYTHONPATH=str(tree))
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "overlapviz", *args], env=env, cwd=tree, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


def run_measured(cmd: list[str], env: dict, cwd: Path) -> tuple[float, float]:
    """Wall and CPU seconds (user + system, wait4) of one command, its output discarded."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    if os.waitstatus_to_exitcode(status):
        raise SystemExit(f"failed: {' '.join(cmd)}")
    return wall, usage.ru_utime + usage.ru_stime


def commands(args) -> None:
    import json
    import shutil

    from overlapviz.testing import generate_trace, write_trace

    trace100k = args.work / "trace100k"
    if not (trace100k / "rank0.json.gz").exists():  # indented: HTA finds the rank with '"rank":\s+(\d+)'
        write_trace(generate_trace(100_000, rank=0, world_size=1, seed=0), trace100k / "rank0.json.gz", pretty=True)
    baseline = BEFORE
    if args.old:  # a checkout with its own venv
        baseline = "old " + subprocess.run(["git", "-C", str(args.old), "rev-parse", "--short", "HEAD"], capture_output=True,
                                           text=True, check=True).stdout.strip()  # fmt: skip
    trees = {"this": (ROOT, sys.executable),
             baseline: (args.old.resolve(), str(args.old.resolve() / ".venv" / "bin" / "python")) if args.old
             else (previous_tree(args.work, BEFORE), sys.executable)}  # fmt: skip
    cases = [("DLRM explain --instances", DLRM, ["explain", "--instances", "--format", "json"]),
             ("DLRM explain (findings first)", DLRM, ["explain"]),
             ("100k kernels analyze", trace100k, ["analyze", "--format", "json"])]  # fmt: skip
    cases = [c for c in cases if args.only is None or args.only in c[0]]
    for tree, python in trees.values():  # both sides' bytecode compiled and written (PYTHONDONTWRITEBYTECODE would
        # leave a changed module to be compiled again by every run: a cost no installed copy pays)
        subprocess.run([python, "-m", "compileall", "-q", str(tree / "overlapviz")], check=True, stdout=subprocess.DEVNULL)
    got: dict = {}
    for i in range(args.repeat):  # alternating (old first every other round), so both see the same machine
        for case, src, argv in cases:
            for side, (tree, python) in sorted(trees.items(), reverse=bool(i % 2)):
                cache = args.work / f"cache-{side}"
                shutil.rmtree(cache, ignore_errors=True)
                env = dict(os.environ, PYTHONPATH=str(tree), OVERLAPVIZ_CACHE_DIR=str(cache))
                cmd = [python, "-m", "overlapviz", *argv, str(src)]
                for state in ("cold", "warm"):
                    got.setdefault((case, side, state), []).append(run_measured(cmd, env, tree))
        if args.hta_python:
            t0 = time.perf_counter()
            out = subprocess.run([str(args.hta_python), str(Path(__file__).with_name("bench_ingest.py")), "--worker", "hta",
                                  "--src", str(trace100k)], capture_output=True, text=True, check=True).stdout  # fmt: skip
            wall = time.perf_counter() - t0
            r = json.loads(out.strip().splitlines()[-1])
            got.setdefault(("100k kernels analyze", "HTA 0.5 in-call", "load + overlap"), []).append((r["load_s"] + r["overlap_s"], None))
            got.setdefault(("100k kernels analyze", "HTA 0.5 whole", "process"), []).append((wall, None))
    med = {k: (statistics.median(w for w, _ in v), None if v[0][1] is None else statistics.median(c for _, c in v))
           for k, v in got.items()}  # fmt: skip
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    print(f"one command on raw traces, medians of {args.repeat}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}")
    print("| case | side | cache | wall s | CPU s |\n|---|---|---|---|---|")
    records = []
    for (case, side, state), (wall, cpu) in med.items():
        print(f"| {case} | {side} | {state} | {wall:.2f} | {'-' if cpu is None else f'{cpu:.2f}'} |")
        for metric, value in (("wall", wall), ("cpu", cpu)):
            if value is not None:
                records.append({"benchmark": "answer_commands", "case": f"{case}, {side}, {state}", "metric": metric,
                                "value": round(value, 3), "unit": "s", "command": "benchmarks/bench_answer.py --commands",
                                "commit": commit, "note": f"median of {args.repeat}; 2 shared cores"})  # fmt: skip
    hta = med.get(("100k kernels analyze", "HTA 0.5 in-call", "load + overlap"))
    for state in ("cold", "warm"):
        if hta and ("100k kernels analyze", "this", state) in med:  # --only may leave the case out
            ours = med[("100k kernels analyze", "this", state)][0]
            print(f"HTA in-call / overlapviz whole command ({state}): {hta[0] / ours:.1f}x")
            records.append({"benchmark": "answer_commands", "case": f"100k kernels analyze, {state}", "metric": "HTA in-call / ours",
                            "value": round(hta[0] / ours, 2), "unit": "x", "command": "benchmarks/bench_answer.py --commands",
                            "commit": commit, "note": f"median of {args.repeat}; HTA 0.5 load + overlap in-call"})  # fmt: skip
    for case, _, _ in cases:
        for state in ("cold", "warm"):
            a, b = med[(case, "this", state)], med[(case, baseline, state)]
            print(f"{case} {state}: this / {baseline} wall {a[0] / b[0]:.2f}, CPU {a[1] / b[1]:.2f}")
    print(f"load after: {os.getloadavg()[0]:.1f}")
    if args.only is not None:
        return  # a partial run: the result files keep the whole one
    out = Path(__file__).resolve().parent / "results" / "records" / "answer_commands.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(records, indent=1) + "\n")
    commands_result(records, baseline)


def commands_result(records: list[dict], baseline: str = BEFORE) -> Path:
    """benchmarks/results/answer_commands.json in readme_table's format, from the --commands records (wall seconds)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import readme_table

    wall = {r["case"]: r["value"] for r in records if r["metric"] == "wall"}
    rows = []
    for case, targets in (("DLRM explain --instances", ("<= 0.5 s", "<= 0.3 s")),
                          ("DLRM explain (findings first)", ("<= 0.5 s", "<= 0.3 s"))):  # fmt: skip
        for state, target in zip(("cold", "warm"), targets, strict=True):
            rows.append(readme_table.row(f"{case}, {state} cache (whole command)", wall[f"{case}, this, {state}"],
                                         baseline=wall.get(f"{case}, {baseline}, {state}"), baseline_label=baseline, target=target))
    hta = wall.get("100k kernels analyze, HTA 0.5 in-call, load + overlap")
    for state in ("cold", "warm"):
        rows.append(readme_table.row(f"100k kernels: overlap as one command, {state} cache", wall[f"100k kernels analyze, this, {state}"],
                                     baseline=hta, baseline_label="HTA 0.5 in-call load + overlap", target=">= 10x HTA"))
    return readme_table.write(Path(__file__).resolve().parent / "results" / "answer_commands.json", "answer_commands",
                              "The answer from raw traces as one command", rows,
                              note=records[0]["note"] if records else "")


def timed(fn, repeat: int) -> float:
    return _timed(fn, repeat)[0]  # bench_explain's median, without the last result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kernels", type=int, default=1_000_000)
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--work", type=Path, default=Path("/tmp/ovz-bench"))
    ap.add_argument("--json", type=Path, help="also write the result here (format: benchmarks/readme_table.py)")
    ap.add_argument("--commands", action="store_true", help="one command on raw traces, cold and warm (module docstring)")
    ap.add_argument("--hta-python", type=Path, help="HTA 0.5's interpreter (bench_ingest creates benchmarks/.venv-hta)")
    ap.add_argument("--old", type=Path, help="--commands: the baseline checkout, run by its own .venv (default: commit BEFORE)")
    ap.add_argument("--only", help="--commands: only the cases whose name holds this text (no result files written)")
    args = ap.parse_args()
    load_before = os.getloadavg()[0]
    args.work.mkdir(parents=True, exist_ok=True)
    if args.commands:
        return commands(args)
    ds = str(build(args.work / f"explain-{args.kernels}-{args.ranks}", args.kernels, args.ranks))
    from overlapviz.analysis import breakdown, findings

    rows = [("findings (library call)", timed(lambda: findings.findings(ds), args.repeat), None),
            ("breakdown (library call)", timed(lambda: breakdown.breakdown(ds), args.repeat), None)]  # fmt: skip
    prev = previous_tree(args.work)
    new_t, old_t = [], []
    for _ in range(args.repeat):  # alternating, so both see the same machine
        new_t.append(command(ROOT, "explain", ds, "--instances", "--format", "json"))
        old_t.append(command(prev, "explain", ds, "--instances", "--format", "json"))
    rows.append(("explain --instances (whole command)", statistics.median(new_t), statistics.median(old_t)))
    new_t, old_t = [], []
    for _ in range(args.repeat):
        new_t.append(command(ROOT, "explain", ds, "--findings", "--format", "json"))
        old_t.append(command(prev, "explain", ds, "--summary", "--format", "json"))
    rows.append(("explain --findings (whole command; previous: --summary)", statistics.median(new_t), statistics.median(old_t)))
    print(f"{args.kernels:,} kernels over {args.ranks} ranks, medians of {args.repeat}, {os.cpu_count()} cores")
    print(f"| task | this version s | {PREVIOUS} s | ratio |\n|---|---|---|---|")
    for name, t, old in rows:
        print(f"| {name} | {t:.2f} | {'-' if old is None else f'{old:.2f}'} | {'-' if old is None else f'{t / old:.2f}'} |")
    if args.json:
        import readme_table

        readme_table.write(args.json, "answer", f"The answer on {args.kernels:,} kernels over {args.ranks} ranks",
                           [readme_table.row(name, t, baseline=old, baseline_label=None if old is None else PREVIOUS, target="< 2 s")
                            for name, t, old in rows],
                           note=f"Medians of {args.repeat}; library calls in this process, whole commands in fresh "
                                f"processes alternating with commit {PREVIOUS}'s (the last before findings and the breakdown).",
                           load_before=load_before)  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
