"""Local pool vs a Dask cluster on the same generated jobs: ingest, analyze, explain, residency; peak memory per process; a cost model.

    .venv/bin/python benchmarks/bench_dask.py                  # 128 and 512 small ranks, 64 x 100k kernels (~8 min, 2 cores)
    .venv/bin/python benchmarks/bench_dask.py --full           # the big job at 64 ranks x 1M kernels (~3.5 GB of gzip)
    .venv/bin/python benchmarks/bench_dask.py --workers 8      # local pool of 8 vs local:8
    .venv/bin/python benchmarks/bench_dask.py --ranks 8 64 512 --kernels-total 1000000 --json benchmarks/results/dask_scaling.json
                                                               # the same 1M kernels over more ranks: each process's peak per step

For each job, each side runs in a fresh subprocess, timed from inside per phase (ingest,
analyze per rank, analyze per step, explain, residency) and from outside (wall, with interpreter start),
while a sampler reads the resident memory of every process of its tree every 20 ms and keeps
each one's peak:

- ``local``: ``ingest(..., workers=N)`` (this process and N-1 forked readers), then
  ``analyze_table``, ``explain`` and ``kernel_residency`` in the same process;
- ``dask``: ``client_for("local:N")`` (a LocalCluster on 127.0.0.1: N single-threaded worker
  processes) and ``ingest_on``, ``analyze_on``, ``explain_on``, ``residency_on``; the cluster's start is its own phase.

Each phase also counts CPU seconds (this process, with the pool's readers it waited for or the
cluster's scheduler that runs in it; and the cluster's workers apart): on a shared machine
they move less than wall time. Both sides' analyze, explain and residency results are compared (they
must be identical). The small jobs at two sizes show which peaks grow with the number of
ranks (the client's, by the small tables of each rank it assembles; a worker's must not).
From the Dask side's workers' CPU seconds per kernel and its client's per rank, the cost
model estimates a 16,384-rank job on clusters of N workers.

Results: a markdown table on stdout and in benchmarks/out/dask.md (+ dask.json).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
MODEL_RANKS = 16_384
MODEL_WORKERS = (64, 256, 1024, 4096)


# --- the generated jobs ------------------------------------------------------------------------


def _generate_one(args) -> int:
    n, rank, world, path = args
    from overlapviz.testing import generate_trace, write_trace

    write_trace(generate_trace(n, rank=rank, world_size=world, seed=11), path)
    return os.path.getsize(path)


def generate(directory: Path, ranks: int, kernels: int, procs: int) -> dict:
    """``ranks`` Kineto traces of ``kernels`` kernels each (one run), made once and kept."""
    done = directory / "DONE"
    if done.exists():
        return json.loads(done.read_text())
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    import multiprocessing

    t = time.perf_counter()
    jobs = [(kernels, r, ranks, str(directory / f"rank{r}.json.gz")) for r in range(ranks)]
    with multiprocessing.get_context("fork").Pool(procs) as pool:
        sizes = pool.map(_generate_one, jobs, chunksize=1)
    facts = {"ranks": ranks, "kernels_per_rank": kernels, "gzip_bytes": sum(sizes), "generate_s": time.perf_counter() - t}
    done.write_text(json.dumps(facts))
    return facts


# --- one side, in its own process -----------------------------------------------------------


def child(side: str, source: str, out: str, workers: int) -> None:
    """Run one side over ``source``; print its phase times as JSON (the last line)."""
    import pyarrow.parquet as pq

    from overlapviz.dataset import schema

    phases: dict = {}
    extra: dict = {}
    t0 = time.perf_counter()
    workers_cpu = lambda: {}
    workers_hwm = lambda: {}
    workers_rss = lambda: {}
    hwm_so_far = [0]

    def phase(name, fn, *args, **kwargs):
        _hwm_reset()
        workers_hwm()
        # resident size at the step's start: what earlier steps left (the peak counts it too)
        extra[f"{name}_start_bytes"] = _rss(os.getpid())
        extra[f"{name}_workers_start_bytes"] = dict(sorted(workers_rss().items()))
        t, c, w = time.perf_counter(), _cpu_s(children=True), workers_cpu()
        value = fn(*args, **kwargs)
        phases[name] = time.perf_counter() - t
        # CPU seconds: this process (with the pool's readers it waited for; with the cluster's
        # scheduler, which runs in it) and the cluster's workers, apart (each, and their sum)
        extra[f"{name}_cpu_s"] = _cpu_s(children=True) - c
        w_after = workers_cpu()
        extra[f"{name}_workers_cpu_s"] = {k: w_after[k] - w.get(k, 0.0) for k in sorted(w_after)}
        extra[f"{name}_worker_cpu_s"] = sum(extra[f"{name}_workers_cpu_s"].values())
        # peak resident memory during this phase: this process's, and each worker's (VmHWM, reset before the phase)
        extra[f"{name}_peak_bytes"] = _hwm_reset()
        extra[f"{name}_workers_peak_bytes"] = dict(sorted(workers_hwm().items()))
        hwm_so_far[0] = max(hwm_so_far[0], extra[f"{name}_peak_bytes"])
        extra[f"hwm_after_{name}_bytes"] = hwm_so_far[0]  # this process's peak so far
        return value

    dataset = Path(out) / "ds"
    if side == "local":
        from overlapviz.analysis.explain import explain
        from overlapviz.analysis.metrics import analyze_table
        from overlapviz.analysis.residency import kernel_residency
        from overlapviz.ingest import ingest

        phases["import"] = time.perf_counter() - t0
        phase("ingest", ingest, [source], dataset, workers=workers, progress=False)
        rank = phase("analyze", analyze_table, dataset)
        step = phase("analyze_step", analyze_table, dataset, per="step")
        why = phase("explain", explain, dataset)
        res = phase("residency", kernel_residency, dataset)
    else:
        from overlapviz import distributed as ovd

        phases["import"] = time.perf_counter() - t0
        t = time.perf_counter()
        with ovd.client_for(f"local:{workers}") as client:
            phases["cluster_start"] = time.perf_counter() - t
            workers_cpu = lambda: client.run(_cpu_s)
            workers_hwm = lambda: client.run(_hwm_reset)
            workers_rss = lambda: client.run(_rss_self)
            # each worker imports what its tasks need once (the local side paid it under "import")
            phase("warm", client.run, _warm)
            phase("ingest", ovd.ingest_on, client, [source], dataset, progress=False)
            rank = phase("analyze", ovd.analyze_on, client, dataset)
            step = phase("analyze_step", ovd.analyze_on, client, dataset, per="step")
            why = phase("explain", ovd.explain_on, client, dataset)
            res = phase("residency", ovd.residency_on, client, dataset)
            t = time.perf_counter()
        phases["cluster_stop"] = time.perf_counter() - t
    pq.write_table(rank, Path(out) / "analyze.parquet")
    pq.write_table(step, Path(out) / "analyze_step.parquet")
    why.to_parquet(Path(out) / "explain.parquet")
    res.to_parquet(Path(out) / "residency.parquet")
    n = schema.read_metadata(dataset)["n_kernels"]
    # CPU seconds of this process and every process it started and waited for (the pool's
    # readers, the cluster's workers): less moved than wall time by other jobs on the machine
    cpu = _cpu_s(children=True)
    print(json.dumps({"phases": phases, "extra": extra, "n_kernels": n, "n_comm": len(why), "cpu_s": cpu}))


def _warm() -> None:
    import importlib

    for name in ("overlapviz.ingest.driver", "overlapviz.analysis.metrics", "overlapviz.analysis.explain"):
        importlib.import_module(name)  # explain: pandas and the occupancy tables


def _cpu_s(children: bool = False) -> float:
    import resource

    who = (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN) if children else (resource.RUSAGE_SELF,)
    return sum(getattr(resource.getrusage(w), f) for w in who for f in ("ru_utime", "ru_stime"))


def _hwm_reset() -> int:
    """This process's peak resident size since the last reset, then reset (``clear_refs`` 5: the peak becomes the current size)."""
    peak = _hwm_bytes()
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass  # not Linux, or not allowed: the peaks are then those since the process started
    return peak


def _rss_self() -> int:
    return _rss(os.getpid())


def _hwm_bytes() -> int:
    """This process's peak resident size so far (``VmHWM``: reset at exec, unlike ``ru_maxrss``)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


# --- measuring a subprocess tree ---------------------------------------------------------------


def _children(pid: int) -> list[int]:
    out = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                out.extend(int(c) for c in f.read().split())
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        pass
    return out


def _rss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        pass
    return 0


def measure(cmd: list[str], timeout: float) -> dict:
    """Run ``cmd``; its last stdout line (JSON), wall time, and the peak RSS of each process of its tree."""
    t = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peaks: dict[int, int] = {}
    total_peak = [0]
    stop = threading.Event()

    def sample():
        while not stop.is_set():
            tree, todo = [], [proc.pid]
            while todo:
                p = todo.pop()
                tree.append(p)
                todo.extend(_children(p))
            total = 0
            for p in tree:
                r = _rss(p)
                total += r
                peaks[p] = max(peaks.get(p, 0), r)
            total_peak[0] = max(total_peak[0], total)
            stop.wait(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    finally:
        stop.set()
        sampler.join()
    wall = time.perf_counter() - t
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[-6:])} failed ({proc.returncode}):\n{stderr[-3000:]}")
    result = json.loads(stdout.strip().splitlines()[-1])
    others = [v for p, v in peaks.items() if p != proc.pid]
    result.update(wall_s=wall, peak_main_bytes=peaks.get(proc.pid, 0), peak_child_bytes=max(others, default=0),
                  n_processes=len(peaks), peak_total_bytes=total_peak[0])  # fmt: skip
    return result


def run_side(side: str, source: Path, work: Path, workers: int, timeout: float) -> dict:
    out = work / f"out-{side}-{source.name}"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", side, "--source", str(source), "--child-out", str(out),
           "--workers", str(workers)]  # fmt: skip
    result = measure(cmd, timeout)
    result["out"] = str(out)
    return result


def same_results(a: dict, b: dict) -> bool:
    import pandas as pd
    import pyarrow.parquet as pq

    for name in ("analyze.parquet", "analyze_step.parquet"):
        if not pq.read_table(Path(a["out"]) / name).equals(pq.read_table(Path(b["out"]) / name)):
            return False
    try:
        for name in ("explain.parquet", "residency.parquet"):
            pd.testing.assert_frame_equal(pd.read_parquet(Path(a["out"]) / name), pd.read_parquet(Path(b["out"]) / name))
    except AssertionError:
        return False
    return True


# --- report ----------------------------------------------------------------------------------


def mib(n: float) -> str:
    return f"{n / 2**20:,.0f}"


def report(rows: list[dict], model: list[dict], args, cpu: str) -> str:
    load = ", ".join(f"{r['job']} {r['load'][0]:.1f}-{r['load'][1]:.1f}" for r in rows)
    lines = [f"# Dask benchmark: local pool vs LocalCluster ({args.workers} workers)", "",
             (f"{cpu}; python {platform.python_version()}; workers = processes reading at once on each side; "
              f"load average (1 min) before and after each job: {load}. CPU s: every process of the side "
              "(Dask: the client with its scheduler, and the workers)."), "",
             ("| job | kernels | side | wall s | CPU s | ingest s | ingest CPU s | analyze s | analyze/step s | explain s "
              "| explain CPU s | residency s | cluster start + warm s | main MiB after ingest | peak main MiB | peak child MiB "
              "| peak tree MiB | same results |"),
             "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]  # fmt: skip

    def cpu_of(s, p):
        return s["extra"][f"{p}_cpu_s"] + s["extra"][f"{p}_worker_cpu_s"]

    for r in rows:
        for side in ("local", "dask"):
            s = r[side]
            p = s["phases"]
            lines.append(
                f"| {r['job']} | {s['n_kernels']:,} | {side} | {s['wall_s']:.1f} | {s['cpu_s']:.1f} | {p['ingest']:.2f} | "
                f"{cpu_of(s, 'ingest'):.1f} | {p['analyze']:.2f} | {p['analyze_step']:.2f} | {p['explain']:.2f} | "
                f"{cpu_of(s, 'explain'):.1f} | {p['residency']:.2f} | {p.get('cluster_start', 0) + p.get('warm', 0):.1f} | "
                f"{mib(s['extra']['hwm_after_ingest_bytes'])} | {mib(s['peak_main_bytes'])} | {mib(s['peak_child_bytes'])} | "
                f"{mib(s['peak_total_bytes'])} | {'yes' if r['same'] else 'NO'} |"
            )  # fmt: skip
        lo, da = r["local"], r["dask"]
        lp, dp = lo["phases"], da["phases"]
        lines.append(f"| {r['job']} | | dask/local | {da['wall_s'] / lo['wall_s']:.2f} | {da['cpu_s'] / lo['cpu_s']:.2f} | "
                     f"{dp['ingest'] / lp['ingest']:.2f} | {cpu_of(da, 'ingest') / cpu_of(lo, 'ingest'):.2f} | "
                     f"{dp['analyze'] / lp['analyze']:.2f} | {dp['analyze_step'] / lp['analyze_step']:.2f} | "
                     f"{dp['explain'] / lp['explain']:.2f} | {cpu_of(da, 'explain') / cpu_of(lo, 'explain'):.2f} | "
                     f"{dp['residency'] / lp['residency']:.2f} | | "
                     f"{da['extra']['hwm_after_ingest_bytes'] / lo['extra']['hwm_after_ingest_bytes']:.2f} | "
                     f"{da['peak_main_bytes'] / lo['peak_main_bytes']:.2f} | | | |")  # fmt: skip
    c = model[0]["coefficients"] if model else {}
    lines += ["", f"## Cost model: {MODEL_RANKS:,} ranks", "",
              (f"Measured on the Dask side, in CPU seconds (robust to the machine's other load): the workers' per kernel "
               f"(the job with the most kernels) ingest {c.get('ingest_us_per_kernel', 0):.2f} µs, analyze "
               f"{c.get('analyze_us_per_kernel', 0):.3f} µs, explain {c.get('explain_us_per_kernel', 0):.2f} µs; the client's "
               f"(with its scheduler) per rank (the job with the most ranks) ingest {c.get('ingest_ms_per_rank', 0):.2f} ms, "
               f"analyze {c.get('analyze_ms_per_rank', 0):.2f} ms, explain {c.get('explain_ms_per_rank', 0):.2f} ms; the "
               f"client's memory during ingest {c.get('client_kib_per_rank', 0):.0f} KiB per rank (growth of its peak "
               "between the small jobs)."),
              "",
              ("Model: time = max(kernels x c_kernel / N, ranks x c_rank): the workers' share, or the client's serial "
               "part, whichever is longer. Not modelled: the shared file system's bandwidth (N workers read N x ~70 MB/s "
               "of JSON), worker start-up, and stragglers (one rank of 1 GB is one task). explain's records come to the "
               "client (one row per comm kernel, ~1 KiB each): `--summary` keeps the client at one row per rank."), ""]  # fmt: skip
    lines += ["| workers N | kernels/rank | ingest | analyze | explain | client memory, ingest | explain records on the client |",
              "|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for m in model:
        lines.append(f"| {m['workers']} | {m['kernels_per_rank']:,} | {m['ingest_s'] / 60:.1f} min | {m['analyze_s'] / 60:.1f} min | "
                     f"{m['explain_s'] / 60:.1f} min | {m['client_gib']:.1f} GiB | {m['records_gib']:,.0f} GiB |")  # fmt: skip
    return "\n".join(lines) + "\n"


STEPS = ("ingest", "analyze", "analyze_step", "explain", "residency")


def client_slope(rows: list[dict], step: str, what: str = "peak") -> float:
    """The Dask client's peak during ``step`` (``what="start"``: its size at the step's start): MiB per rank
    between the fewest and the most ranks."""
    a, b = min(rows, key=lambda r: r["facts"]["ranks"]), max(rows, key=lambda r: r["facts"]["ranks"])
    grow = b["dask"]["extra"][f"{step}_{what}_bytes"] - a["dask"]["extra"][f"{step}_{what}_bytes"]
    return grow / 2**20 / (b["facts"]["ranks"] - a["facts"]["ranks"])


def scaling_report(rows: list[dict], cpu: str) -> str:
    """--ranks: per job and step, each side's peak MiB per process and CPU seconds; the client's slope in ranks."""
    load = ", ".join(f"{r['job']} {r['load'][0]:.1f}-{r['load'][1]:.1f}" for r in rows)
    lines = [f"# Dask against the local pool, the same kernels over more ranks ({rows[0]['workers']} workers)", "",
             (f"{cpu}; python {platform.python_version()}; load average (1 min) before and after each job: {load}. "
              "MiB: the process's resident peak during the step (VmHWM, reset before it), in brackets its resident size at the step's start (what earlier steps left; the peak includes it). local: the command's "
              "process (ingest's forked readers: the worker column, their peak over the whole run). dask: the client "
              "(with its scheduler) and each worker. CPU s: user + system."), "",
             ("| ranks | kernels | step | local s | local CPU s | local MiB | dask s | client CPU s | workers CPU s "
              "| client MiB | worker MiB (each) | same results |"),
             "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]  # fmt: skip
    for r in sorted(rows, key=lambda r: r["facts"]["ranks"]):
        lo, da = r["local"], r["dask"]
        for step in STEPS:
            le, de = lo["extra"], da["extra"]
            each = " / ".join(mib(v) for v in de[f"{step}_workers_peak_bytes"].values())
            local_mib = f"{mib(le[f'{step}_peak_bytes'])} ({mib(le[f'{step}_start_bytes'])})"
            if step == "ingest" and lo["peak_child_bytes"]:
                local_mib += f" (+ readers {mib(lo['peak_child_bytes'])})"
            lines.append(f"| {r['facts']['ranks']} | {da['n_kernels']:,} | {step} | {lo['phases'][step]:.2f} | "
                         f"{le[f'{step}_cpu_s']:.2f} | {local_mib} | {da['phases'][step]:.2f} | {de[f'{step}_cpu_s']:.2f} | "
                         f"{de[f'{step}_worker_cpu_s']:.2f} | {mib(de[f'{step}_peak_bytes'])} ({mib(de[f'{step}_start_bytes'])}) | {each} | "
                         f"{'yes' if r['same'] else 'NO'} |")  # fmt: skip
        lines.append(f"| {r['facts']['ranks']} | | whole run | {lo['wall_s']:.1f} | {lo['cpu_s']:.1f} | {mib(lo['peak_main_bytes'])} | "
                     f"{da['wall_s']:.1f} | {da['cpu_s']:.1f} (all) | | {mib(da['peak_main_bytes'])} | {mib(da['peak_child_bytes'])} (largest) | |")  # fmt: skip
    if len(rows) >= 2:
        lo_r = min(r["facts"]["ranks"] for r in rows)
        hi_r = max(r["facts"]["ranks"] for r in rows)
        slopes = ", ".join(f"{step} {client_slope(rows, step) * 1024:+.0f} KiB" for step in STEPS)
        own = ", ".join(f"{step} {client_slope(rows, step, 'start') * 1024:+.0f} KiB" for step in STEPS)
        lines += ["", f"The Dask client's peak per rank, {lo_r} -> {hi_r} ranks: {slopes}. "
                      f"Its resident size at each step's start, per rank: {own}."]
    return "\n".join(lines) + "\n"


def scaling_result(rows: list[dict], path: Path, load_before: float) -> Path:
    """The client's and the largest worker's peak per step and rank count, in readme_table's format."""
    import readme_table

    out = []
    for r in sorted(rows, key=lambda r: r["facts"]["ranks"]):
        de, n = r["dask"]["extra"], r["facts"]["ranks"]
        kernels = r["dask"]["n_kernels"]
        for step in ("ingest", "analyze", "explain"):
            what = f"{step}, {kernels / 1e6:.1f}M kernels over {n} ranks on local:{r['workers']}"
            out.append(readme_table.row(f"{what}: client peak", round(de[f"{step}_peak_bytes"] / 2**20), "MiB",
                                        baseline=round(r["local"]["extra"][f"{step}_peak_bytes"] / 2**20),
                                        baseline_label="local process"))  # fmt: skip
            out.append(readme_table.row(f"{what}: largest worker peak", round(max(de[f"{step}_workers_peak_bytes"].values()) / 2**20), "MiB"))
    slope = {s: client_slope(rows, s) for s in ("ingest", "analyze", "explain")}
    lo_r, hi_r = min(r["facts"]["ranks"] for r in rows), max(r["facts"]["ranks"] for r in rows)
    note = ("One run per point; each side a fresh process; peaks per step (VmHWM reset before each step), the baseline is the "
            "local pool's process on the same set; both sides' results identical. Client slope "
            f"{lo_r} -> {hi_r} ranks: " + ", ".join(f"{s} {v * 1024:+.0f} KiB/rank" for s, v in slope.items())
            + ". Every step and the CPU seconds: docs/benchmarks.md.")  # fmt: skip
    title = f"The same kernels over more ranks on a local Dask cluster ({rows[0]['workers']} workers)"
    return readme_table.write(path, "dask_scaling", title, out, note=note, load_before=load_before)


def cost_model(rows: list[dict], kernels_per_rank: int) -> list[dict]:
    phases = ("ingest", "analyze", "explain")
    # the workers' CPU seconds per kernel, from the job with the most kernels
    big = max(rows, key=lambda r: r["dask"]["n_kernels"])["dask"]
    c_kernel = {p: big["extra"][f"{p}_worker_cpu_s"] / big["n_kernels"] for p in phases}
    comm_per_kernel = big["n_comm"] / big["n_kernels"]
    # the client's (and its scheduler's) CPU seconds per rank, from the job with the most ranks
    many = max(rows, key=lambda r: r["facts"]["ranks"])
    c_rank = {p: many["dask"]["extra"][f"{p}_cpu_s"] / many["facts"]["ranks"] for p in phases}
    # the client's memory during ingest: growth of its peak per rank between the small jobs
    key = "hwm_after_ingest_bytes"
    small = sorted((r for r in rows if r["job"].startswith("small")), key=lambda r: r["facts"]["ranks"])
    if len(small) >= 2:
        a, b = small[0]["dask"]["extra"][key], small[-1]["dask"]["extra"][key]
        per_rank_bytes = max(0, b - a) / (small[-1]["facts"]["ranks"] - small[0]["facts"]["ranks"])
        base = a
    else:
        per_rank_bytes, base = 0.0, big["extra"][key]
    coefficients = {f"{p}_us_per_kernel": c_kernel[p] * 1e6 for p in phases}
    coefficients |= {f"{p}_ms_per_rank": c_rank[p] * 1e3 for p in phases}
    coefficients["client_kib_per_rank"] = per_rank_bytes / 1024
    out = []
    total = MODEL_RANKS * kernels_per_rank
    for n in MODEL_WORKERS:
        row = {"workers": n, "kernels_per_rank": kernels_per_rank, "coefficients": coefficients}
        for p in phases:
            row[f"{p}_s"] = max(total * c_kernel[p] / n, MODEL_RANKS * c_rank[p])
        row["client_gib"] = (base + MODEL_RANKS * per_rank_bytes) / 2**30
        row["records_gib"] = total * comm_per_kernel * 1024 / 2**30
        out.append(row)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, default=2, help="processes on each side (local pool size = Dask workers)")
    ap.add_argument("--small-ranks", type=int, nargs="+", default=[128, 512], help="ranks of the small jobs")
    ap.add_argument("--small-kernels", type=int, default=2_000, help="kernels per rank of the small jobs")
    ap.add_argument("--big-ranks", type=int, default=64)
    ap.add_argument("--big-kernels", type=int, default=100_000)
    ap.add_argument("--full", action="store_true", help="the big job at 1M kernels per rank (needs ~3.5 GB of disk)")
    ap.add_argument("--ranks", type=int, nargs="+", default=None,
                    help="instead of the small and big jobs: one job per rank count, --kernels-total kernels in all")
    ap.add_argument("--kernels-total", type=int, default=1_000_000, help="kernels of each --ranks job (kernels-total // ranks per rank)")
    ap.add_argument("--json", type=Path, default=None,
                    help="with --ranks: also write the client's and workers' peaks in readme_table's format (benchmarks/results/dask_scaling.json)")
    ap.add_argument("--work", default=None, help="where the traces and datasets go (kept between runs)")
    ap.add_argument("--timeout", type=float, default=3600)
    ap.add_argument("--child", choices=["local", "dask"], help=argparse.SUPPRESS)
    ap.add_argument("--source", help=argparse.SUPPRESS)
    ap.add_argument("--child-out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child, args.source, args.child_out, args.workers)
        return
    if args.full:
        args.big_kernels = 1_000_000
    work = Path(args.work or Path(tempfile.gettempdir()) / "overlapviz-bench-dask")
    if args.ranks:
        jobs = [(f"ranks{r}", r, args.kernels_total // r) for r in args.ranks]
    else:
        jobs = [(f"small{r}", r, args.small_kernels) for r in args.small_ranks]
        if args.big_ranks and args.big_kernels:
            jobs.append((f"big{args.big_ranks}x{args.big_kernels // 1000}k", args.big_ranks, args.big_kernels))
    load_before = os.getloadavg()[0]
    procs = os.cpu_count() or 1
    rows = []
    for name, ranks, kernels in jobs:
        source = work / "traces" / name
        facts = generate(source, ranks, kernels, procs)
        print(f"{name}: {ranks} ranks x {kernels:,} kernels, {facts['gzip_bytes'] / 2**20:,.0f} MiB gzip", file=sys.stderr)
        before = os.getloadavg()[0]
        local = run_side("local", source, work, args.workers, args.timeout)
        dask = run_side("dask", source, work, args.workers, args.timeout)
        rows.append({"job": name, "facts": facts, "workers": args.workers, "local": local, "dask": dask,
                     "same": same_results(local, dask), "load": (before, os.getloadavg()[0])})  # fmt: skip
        print(f"  local {local['wall_s']:.1f} s, dask {dask['wall_s']:.1f} s, same results: {rows[-1]['same']}", file=sys.stderr)
    cpu = f"{platform.machine()}, {os.cpu_count()} cores"
    (HERE / "out").mkdir(exist_ok=True)
    if args.ranks:
        text = scaling_report(rows, cpu)
        print(text)
        (HERE / "out" / "dask_scaling.md").write_text(text)
        (HERE / "out" / "dask_scaling.json").write_text(json.dumps({"rows": rows}, indent=1, default=str))
        if args.json:
            scaling_result(rows, args.json, load_before)
        if not all(r["same"] for r in rows):
            sys.exit("bench_dask: the local and Dask sides' results differ (see the table)")
        return
    model = cost_model(rows, kernels_per_rank=1_000_000)
    text = report(rows, model, args, cpu)
    print(text)
    (HERE / "out" / "dask.md").write_text(text)
    (HERE / "out" / "dask.json").write_text(json.dumps({"rows": rows, "model": model}, indent=1, default=str))


if __name__ == "__main__":
    main()
