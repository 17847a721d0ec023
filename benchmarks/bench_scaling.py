"""Cost against size: ingest, analyze and explain (findings, breakdown, instances) on 1M, 10M and 30M kernels over 8, 64 and 512 ranks.

Not a test: appends records to benchmarks/results/scaling.json and prints a table. Each point
runs every step once as a whole command in a fresh process (``python -m overlapviz ...``),
timed from outside, while a sampler sums the resident memory of the process tree (ingest
forks a reader) every 20 ms; a step whose tree passes ``--max-rss-gb`` is stopped and
recorded as such. The trace sets are Kineto JSON (gzip level 1), one file per rank, made once
into ``--sets`` (outside the repository) by a streaming writer with generate_trace's shape:
compute kernels on stream 7, every 10th kernel an NCCL all-reduce on stream 20, a
cudaLaunchKernel per kernel, 10 profiler steps.

    .venv/bin/python benchmarks/bench_scaling.py [--kernels 1000000 ...] [--ranks 8 64 512] [--sets /work/bigsets]
    .venv/bin/python benchmarks/bench_scaling.py --plot   # docs/benchmarks_scaling.png from the records
"""

from __future__ import annotations

import argparse
import gzip
import json
import multiprocessing
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results" / "records" / "scaling.json"  # every measurement; results/scaling.json: the README's rows
PLOT = ROOT / "docs" / "benchmarks_scaling.png"
STEPS = {  # step -> the command's arguments after ``python -m overlapviz`` (DS: the dataset)
    "ingest": ["ingest", "{src}", "-o", "{ds}", "--overwrite"],
    "analyze": ["analyze", "{ds}", "--format", "json"],
    "findings": ["explain", "{ds}", "--findings", "--format", "json"],
    "breakdown": ["explain", "{ds}", "--breakdown", "--format", "json"],
    "instances": ["explain", "{ds}", "--instances", "--format", "json"],
}
COMPUTE = ("ampere_sgemm_128x64_nn", "void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl>",
           "sm80_xmma_gemm_f16f16_f16f32_f32_nn_n_tilesize128x128x32")  # fmt: skip
COMM = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"
CHUNK = 200_000


# --- the trace sets ------------------------------------------------------------------------


def _stream_starts(ready, dur, gap):
    """Start of each kernel of one stream: the later of its ``ready`` and the previous end + gap."""
    import numpy as np

    step = dur + gap
    before = np.concatenate([[0], np.cumsum(step)[:-1]])  # sum of (dur + gap) of the kernels before
    return before + np.maximum.accumulate(ready - before)


def write_rank(path: Path, n: int, rank: int, world: int) -> int:
    """One rank's trace of ``n`` kernels, written in chunks (memory bounded by CHUNK, not ``n``)."""
    import numpy as np

    from overlapviz.testing import A100_PROPERTIES, DEFAULT_BASE_NS, HOST_PID, HOST_TID

    rng = np.random.default_rng([11, rank])
    comm = np.zeros(n, bool)
    comm[9::10] = True
    dur = np.where(comm, rng.integers(50_000, 400_000, n), rng.integers(2_000, 60_000, n))
    launch_dur = rng.integers(2_000, 8_000, n)
    l0 = 5_000_000_000_000 + np.cumsum(rng.integers(1_500, 8_000, n) + launch_dur) - launch_dur
    ready = l0 + launch_dur + rng.integers(1_000, 6_000, n)
    gap = rng.integers(500, 5_000, n)
    start = np.empty(n, np.int64)
    for mask in (comm, ~comm):
        start[mask] = _stream_starts(ready[mask], dur[mask], gap[mask])
    names = rng.integers(0, len(COMPUTE), n)
    head = {"schemaVersion": 1, "deviceProperties": [dict(A100_PROPERTIES)],
            "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": world},
            "baseTimeNanoseconds": DEFAULT_BASE_NS, "displayTimeUnit": "ms"}  # fmt: skip
    us = lambda ns: f"{ns // 1000}.{ns % 1000:03d}"  # noqa: E731 (exact decimal µs)
    with gzip.open(path, "wt", compresslevel=1) as fh:
        fh.write(json.dumps(head)[:-1] + ', "traceEvents": [\n')
        bounds = np.linspace(0, n, 11).astype(np.int64)
        steps = [f'{{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#{s}", "pid": {HOST_PID}, "tid": {HOST_TID}, '
                 f'"ts": {us(int(l0[a]) - 500)}, "dur": {us(int(l0[b - 1] + launch_dur[b - 1] - l0[a]) + 1000)}, '
                 f'"args": {{"External id": 0}}}}' for s, (a, b) in enumerate(zip(bounds[:-1], bounds[1:])) if b > a]  # fmt: skip
        fh.write(",\n".join(steps))
        for c0 in range(0, n, CHUNK):
            rows = []
            for i, is_comm, s, d, l, ld, nm in zip(range(c0 + 1, min(n, c0 + CHUNK) + 1), comm[c0:c0 + CHUNK].tolist(),
                                                   start[c0:c0 + CHUNK].tolist(), dur[c0:c0 + CHUNK].tolist(),
                                                   l0[c0:c0 + CHUNK].tolist(), launch_dur[c0:c0 + CHUNK].tolist(),
                                                   names[c0:c0 + CHUNK].tolist()):  # fmt: skip
                stream, name = (20, COMM) if is_comm else (7, COMPUTE[nm])
                shape = '"registers per thread": 96, "shared memory": 41744, "grid": [16, 1, 1], "block": [640, 1, 1]' if is_comm \
                    else '"registers per thread": 128, "shared memory": 16384, "grid": [1024, 1, 1], "block": [256, 1, 1]'  # fmt: skip
                rows.append(f'{{"ph": "X", "cat": "kernel", "name": "{name}", "pid": 0, "tid": {stream}, "ts": {us(s)}, '
                            f'"dur": {us(d)}, "args": {{"External id": {i}, "device": 0, "stream": {stream}, '
                            f'"correlation": {i}, {shape}}}}},\n'
                            f'{{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": {HOST_PID}, '
                            f'"tid": {HOST_TID}, "ts": {us(l)}, "dur": {us(ld)}, '
                            f'"args": {{"External id": {i}, "cbid": 211, "correlation": {i}}}}}')  # fmt: skip
            fh.write(",\n" + ",\n".join(rows))
        fh.write("\n]}\n")
    return path.stat().st_size


def _write_one(job) -> int:
    return write_rank(*job)


def trace_set(sets: Path, kernels: int, ranks: int, procs: int) -> Path:
    """``sets/k<kernels>_r<ranks>``: ``ranks`` files of ``kernels // ranks`` kernels, made once."""
    d = sets / f"k{kernels}_r{ranks}"
    done = d / "DONE"
    if done.exists():
        return d
    d.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    jobs = [(d / f"rank{r}.json.gz", kernels // ranks, r, ranks) for r in range(ranks)]
    with multiprocessing.get_context("fork").Pool(procs) as pool:
        size = sum(pool.map(_write_one, jobs, chunksize=1))
    # written last: a set without it is made again
    done.write_text(json.dumps({"kernels": kernels, "ranks": ranks, "gzip_bytes": size, "generate_s": time.perf_counter() - t0}))
    print(f"generated {d.name}: {size / 2**20:.0f} MiB gzip in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return d


# --- one measured command ------------------------------------------------------------------


def _tree_rss(pid: int) -> int:
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/statm") as fh:
                total += int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
            with open(f"/proc/{p}/task/{p}/children") as fh:
                todo.extend(int(c) for c in fh.read().split())
        except (OSError, ValueError):
            pass
    return total


def measure(cmd: list[str], max_rss: int, timeout: float) -> dict:
    """Wall seconds, CPU seconds (user + system of the command and the workers it reaped, wait4) and peak tree
    RSS of ``cmd`` (stdout discarded); stopped past ``max_rss`` bytes or ``timeout`` seconds."""
    import tempfile

    peak, over = [0], [False]
    err_file = tempfile.TemporaryFile(mode="w+")
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err_file, cwd=ROOT, text=True)
    done = threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], _tree_rss(proc.pid))
            if (peak[0] > max_rss and not over[0]) or time.perf_counter() - t0 > timeout:
                over[0] = over[0] or peak[0] > max_rss
                proc.kill()
            done.wait(0.02)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - t0
    done.set()
    thread.join()
    err_file.seek(0)
    return {"wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime, "peak_mb": peak[0] / 2**20, "rc": proc.returncode,
            "over": over[0], "err": err_file.read()[-600:]}


def commit() -> str:
    out = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                           text=True).stdout.strip()  # fmt: skip
    return out.stdout.strip() + ("+" if dirty else "")


def load() -> list[dict]:
    return json.loads(RESULTS.read_text()) if RESULTS.exists() else []


def save(records: list[dict]) -> None:
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(records, indent=1) + "\n")
    readme_result(records)


README_STEPS = ("ingest", "findings")  # the README shows these; docs/benchmarks.md the whole table


def readme_result(records: list[dict]) -> Path:
    """benchmarks/results/scaling.json in readme_table's format: wall time and peak memory of ingest and findings
    per trace set (the records keep every step)."""
    import readme_table

    value = {(r["kernels"], r["ranks"], r["step"], r["metric"].split()[-1]): r["value"] for r in records}
    rows = []
    for k, n in sorted({(r["kernels"], r["ranks"]) for r in records}):
        for step in README_STEPS:
            if (k, n, step, "cpu") in value:
                what = f"{step}, {k / 1e6:g}M kernels over {n} ranks"
                rows.append(readme_table.row(f"{what} (CPU: user + system)", value[(k, n, step, "cpu")]))
                rows.append(readme_table.row(f"{what} (peak memory)", value[(k, n, step, "peak_rss")], "MiB"))
    loads = [x for x in (load_of(r) for r in records) if x is not None]
    return readme_table.write(HERE / "results" / "scaling.json", "scaling", "Cost against size (generated Kineto sets)", rows,
                              note="One run per point, each step a whole command in a fresh process, its CPU seconds (the machine was shared: "
                                   "wall times are in the records); time linear in kernels is the target. Every step and the CPU seconds: docs/benchmarks.md.",
                              load_before=max(loads) if loads else None)  # fmt: skip


def load_of(record: dict) -> float | None:
    """The 1-minute load average before the record's step: its ``load_before`` field, or (records written before
    the field) parsed from its note, ``load average X before; ...``."""
    if record.get("load_before") is not None:
        return float(record["load_before"])
    note = record.get("note", "")
    return float(note.split()[2]) if note.startswith("load average") else None


def run_point(sets: Path, work: Path, kernels: int, ranks: int, steps: list[str], args) -> list[dict]:
    src = trace_set(sets, kernels, ranks, args.procs)
    ds = work / f"ds_k{kernels}_r{ranks}"
    case = f"{kernels // 1_000_000}M kernels, {ranks} ranks"
    out = []
    for step in steps:
        cmd = [sys.executable, "-m", "overlapviz", *(a.format(src=src, ds=ds) for a in STEPS[step])]
        load_before = os.getloadavg()[0]
        m = measure(cmd, int(args.max_rss_gb * 2**30), args.timeout)
        note = f"load average {load_before:.1f} before; one run" + ("; STOPPED over the memory limit" if m["over"] else "") \
            + ("" if m["rc"] == 0 else f"; exit {m['rc']}: {m['err'].strip().splitlines()[-1:] or ''}")  # fmt: skip
        shown = "python -m overlapviz " + " ".join(a.format(src=f"{sets.name}/{src.name}", ds="DS") for a in STEPS[step])
        for metric, value, unit in (("wall", m["wall_s"], "s"), ("cpu", m["cpu_s"], "s"), ("peak_rss", m["peak_mb"], "MiB")):
            out.append({"benchmark": "scaling", "case": case, "metric": f"{step} {metric}", "value": round(value, 3),
                        "unit": unit, "command": shown, "commit": commit(), "note": note,
                        "kernels": kernels, "ranks": ranks, "step": step, "load_before": round(load_before, 2)})  # fmt: skip
        print(f"{case:>24} {step:>10}: {m['wall_s']:8.1f} s {m['cpu_s']:8.1f} s CPU {m['peak_mb']:8.0f} MiB  {note}", file=sys.stderr)
        done = {(r["case"], r["metric"]) for r in out}
        save([r for r in load() if (r["case"], r["metric"]) not in done] + out)  # each step as it ends: a long point may be cut
        if m["rc"] != 0 and step == "ingest":
            break
    if not args.keep:
        subprocess.run(["rm", "-rf", str(ds)], check=False)
    return out


def plot(records: list[dict]) -> Path:
    """Per step, CPU seconds per million kernels (flat = linear in kernels, not in ranks) and peak tree memory,
    against the trace sets in order of size."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = sorted({(r["kernels"], r["ranks"]) for r in records})
    labels = [f"{k / 1e6:g}M / {n}" for k, n in cases]
    value = {(r["kernels"], r["ranks"], r["step"], r["metric"].split()[-1]): r["value"] for r in records}
    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(11, 4.2))
    for step in STEPS:
        xs = [i for i, (k, n) in enumerate(cases) if (k, n, step, "cpu") in value]
        if not xs:
            continue
        per_m = [value[(*cases[i], step, "cpu")] / (cases[i][0] / 1e6) for i in xs]
        line = ax_t.plot(xs, per_m, "-o", label=step)[0]
        mem = [(i, value[(*cases[i], step, "peak_rss")]) for i in xs]
        ax_m.plot(*zip(*mem), "-o", color=line.get_color(), label=step)
    for ax, what in ((ax_t, "CPU seconds per million kernels"), (ax_m, "peak resident memory, process tree (MiB)")):
        ax.set_xticks(range(len(cases)), labels, fontsize=8)
        ax.set_xlabel("trace set: kernels / ranks")
        ax.set_ylabel(what)
        ax.grid(True, alpha=0.3)
    ax_m.set_yscale("log")
    ax_t.set_ylim(bottom=0)
    ax_t.legend(fontsize=8)
    fig.suptitle("overlapviz whole commands on generated Kineto sets, one run each, 2 shared cores "
                 "(benchmarks/bench_scaling.py)", fontsize=9)  # fmt: skip
    fig.tight_layout()
    PLOT.parent.mkdir(exist_ok=True)
    fig.savefig(PLOT, dpi=110)
    return PLOT


def memory_fit(records: list[dict]) -> dict:
    """Per step, the least-squares fit of its peak memory over the trace sets: ``(base MiB, MiB per 100k kernels
    of the rank in flight, MiB per million communication kernels of the whole set, largest residual MiB, points)``.
    The first slope is what a rank in flight costs (one per process), the second what the cross-rank step keeps
    of every rank (the generated sets: every 10th kernel a collective); bounded per rank means the second is small."""
    import numpy as np

    value = {(r["kernels"], r["ranks"], r["step"], r["metric"].split()[-1]): r["value"] for r in records
             if "STOPPED" not in r.get("note", "") and "exit" not in r.get("note", "")}  # fmt: skip
    out = {}
    for step in STEPS:
        pts = sorted((k, n, v) for (k, n, st, m), v in value.items() if st == step and m == "peak_rss")
        if len(pts) < 3:
            continue
        a = np.array([[1.0, k / n / 1e5, k / 10 / 1e6] for k, n, _ in pts])
        y = np.array([v for _, _, v in pts])
        coef = np.linalg.lstsq(a, y, rcond=None)[0]
        out[step] = (*coef.tolist(), float(np.abs(a @ coef - y).max()), len(pts))
    return out


def table(records: list[dict]) -> str:
    """The records as a markdown table: per trace set and step, wall s, CPU s, CPU s per million kernels, peak MiB
    (with the kernels of one rank: what a process holds in flight), then :func:`memory_fit` per step."""
    value = {(r["kernels"], r["ranks"], r["step"], r["metric"].split()[-1]): r for r in records}
    lines = ["| kernels | ranks | kernels / rank | step | wall s | CPU s | CPU s / M kernels | peak MiB | load before |",
             "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for k, n in sorted({(r["kernels"], r["ranks"]) for r in records}):
        for step in STEPS:
            if (k, n, step, "wall") not in value:
                continue
            wall, peak = value[(k, n, step, "wall")], value[(k, n, step, "peak_rss")]["value"]
            cpu = value.get((k, n, step, "cpu"), {}).get("value")
            load = "-" if load_of(wall) is None else f"{load_of(wall):.1f}"
            stopped = " (stopped)" if "STOPPED" in wall["note"] or "exit" in wall["note"] else ""
            lines.append(f"| {k / 1e6:g}M | {n} | {k // n:,} | {step}{stopped} | {wall['value']:.1f} | {'-' if cpu is None else f'{cpu:.1f}'} | "
                         f"{'-' if cpu is None else f'{cpu / (k / 1e6):.2f}'} | {peak:.0f} | {load} |")  # fmt: skip
    fit = memory_fit(records)
    if fit:
        lines += ["", "| step | base MiB | MiB per 100k kernels of the rank in flight | MiB per million comm kernels of the set | "
                      "largest residual MiB | sets |", "|---|---|---|---|---|---|"]  # fmt: skip
        lines += [f"| {st} | {b:.0f} | {r:.0f} | {c:.0f} | {res:.0f} | {m} |" for st, (b, r, c, res, m) in fit.items()]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kernels", type=int, nargs="+", default=[1_000_000, 10_000_000, 30_000_000])
    ap.add_argument("--ranks", type=int, nargs="+", default=[8, 64, 512])
    ap.add_argument("--steps", nargs="+", default=list(STEPS), choices=list(STEPS))
    ap.add_argument("--sets", type=Path, default=Path("/work/bigsets"))
    ap.add_argument("--work", type=Path, default=Path("/work/bigsets/datasets"))
    ap.add_argument("--procs", type=int, default=2, help="processes writing the trace sets")
    ap.add_argument("--max-rss-gb", type=float, default=12.0)
    ap.add_argument("--timeout", type=float, default=3600)
    ap.add_argument("--keep", action="store_true", help="keep the datasets")
    ap.add_argument("--generate-only", action="store_true")
    ap.add_argument("--plot", action="store_true", help="only draw docs/benchmarks_scaling.png and print the table from the records")
    args = ap.parse_args()
    if args.plot:
        readme_result(load())
        print(table(load()))
        print(plot(load()), file=sys.stderr)
        return
    args.work.mkdir(parents=True, exist_ok=True)
    for kernels in args.kernels:
        for ranks in args.ranks:
            if args.generate_only:
                trace_set(args.sets, kernels, ranks, args.procs)
                continue
            run_point(args.sets, args.work, kernels, ranks, args.steps, args)


if __name__ == "__main__":
    sys.exit(main())
