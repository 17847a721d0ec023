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
ROOT = Path(__file__).resolve().parent.parent


def previous_tree(work: Path) -> Path:
    out = work / f"overlapviz-{PREVIOUS}"
    if not (out / "overlapviz").exists():
        out.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", PREVIOUS, "overlapviz"], capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(out)], input=archive, check=True)
        for so in (ROOT / "overlapviz" / "ingest").glob("_*.so"):  # the C readers, unchanged since
            (out / "overlapviz" / "ingest" / so.name).write_bytes(so.read_bytes())
    return out


def command(tree: Path, *args: str) -> float:
    env = dict(os.environ, PYTHONPATH=str(tree))
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "overlapviz", *args], env=env, cwd=tree, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


def timed(fn, repeat: int) -> float:
    return _timed(fn, repeat)[0]  # bench_explain's median, without the last result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kernels", type=int, default=1_000_000)
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--work", type=Path, default=Path("/tmp/ovz-bench"))
    ap.add_argument("--json", type=Path, help="also write the result here (format: benchmarks/readme_table.py)")
    args = ap.parse_args()
    load_before = os.getloadavg()[0]
    args.work.mkdir(parents=True, exist_ok=True)
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
