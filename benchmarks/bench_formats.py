"""Ingest throughput per format, side by side in one run: Nsight Systems SQLite against Kineto JSON, on the same kernels.

    .venv/bin/python benchmarks/bench_formats.py                      # 1M kernels over 8 ranks
    .venv/bin/python benchmarks/bench_formats.py --kernels 200000 --ranks 4 --workers 2

The workload is overlapviz.testing.generate_trace (compute kernels on one stream, NCCL
kernels on another, a cudaLaunchKernel per kernel, ProfilerStep ranges), one rank per file,
written twice: as Kineto traces (``rank<N>.json.gz``) and as Nsight Systems exports
(``rank<N>.sqlite``: the tables, columns and enum rows of a real 3.25.0 export,
tests/data/nsys/mfu_2gpu_before_window40ms.sqlite, with the same kernels in
CUPTI_ACTIVITY_KIND_KERNEL, the launches in CUPTI_ACTIVITY_KIND_RUNTIME, the steps in
NVTX_EVENTS). Each format is ingested by the real path (``overlapviz.ingest.ingest``, same
``--workers``) in a fresh subprocess, timed from outside (wall, with interpreter start-up)
and inside (the ingest call), its process tree's peak RSS sampled every 10 ms; both
datasets must hold the same kernels. Then every reference export in
``$OVERLAPVIZ_REFERENCE_TRACES/nsys`` (default ../shared/reference_traces) is ingested alone.

Results: a markdown table on stdout and benchmarks/out/formats.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
from bench_ingest import measure  # noqa: E402  (same sampler as the Kineto/HTA benchmark)

SCHEMA_SOURCE = ROOT / "tests" / "data" / "nsys" / "mfu_2gpu_before_window40ms.sqlite"
REFERENCE = Path(os.environ.get("OVERLAPVIZ_REFERENCE_TRACES", ROOT.parent / "shared" / "reference_traces")) / "nsys"
PID_BASE = 4000
TID = 4000


# --- the workload, written twice -------------------------------------------------------


def write_sets(out: Path, n_kernels: int, ranks: int) -> tuple[list[Path], list[Path]]:
    from overlapviz.testing import generate_trace, write_trace

    kineto, nsys = [], []
    per = [n_kernels // ranks + (1 if r < n_kernels % ranks else 0) for r in range(ranks)]
    (out / "kineto").mkdir(parents=True)
    (out / "nsys").mkdir(parents=True)
    for r in range(ranks):
        doc = generate_trace(per[r], rank=r, world_size=ranks, seed=1, comm_every=7, n_steps=20)
        k = out / "kineto" / f"rank{r}.json.gz"
        write_trace(doc, k)
        s = out / "nsys" / f"rank{r}.sqlite"
        write_nsys(doc, s, pid=PID_BASE + r, rank=r, world_size=ranks)
        kineto.append(k)
        nsys.append(s)
        del doc
    return kineto, nsys


def _ns(us) -> int:
    # generate_trace writes integer ns as µs with three decimals: back to the same integer
    return round(float(us) * 1000)


def write_nsys(doc: dict, path: Path, *, pid: int, rank: int, world_size: int) -> None:
    """``doc``'s kernels, launches and steps as an Nsight Systems 3.25.0 export (schema copied from a real one)."""
    src = sqlite3.connect(f"file:{SCHEMA_SOURCE}?mode=ro", uri=True)
    db = sqlite3.connect(path)
    db.execute("PRAGMA journal_mode = OFF")
    db.execute("PRAGMA synchronous = OFF")
    for (sql,) in src.execute("SELECT sql FROM sqlite_master WHERE type = 'table' AND sql IS NOT NULL"):
        db.execute(sql)
    for (name,) in src.execute("SELECT name FROM sqlite_master WHERE type = 'table' AND (name LIKE 'ENUM_%' OR name = 'META_DATA_EXPORT')"):
        rows = src.execute(f"SELECT * FROM {name}").fetchall()
        if rows:
            db.executemany(f"INSERT INTO {name} VALUES ({','.join('?' * len(rows[0]))})", rows)
    src.close()

    strings: dict[str, int] = {}

    def sid(s: str) -> int:
        if s not in strings:
            strings[s] = len(strings) + 1
        return strings[s]

    gpid = pid << 24
    gtid = gpid | TID
    launch_name = sid("cudaLaunchKernel_v7000")
    kernels, launches, ranges = [], [], []
    for e in doc["traceEvents"]:
        cat = e.get("cat")
        if cat == "kernel":
            a = e["args"]
            start = _ns(e["ts"])
            name = sid(e["name"])
            (gx, gy, gz), (bx, by, bz) = a["grid"], a["block"]
            kernels.append((start, start + _ns(e["dur"]), a["device"], a["context"], None, a["stream"], a["correlation"],
                            gpid, name, name, None, 0, 0, a["registers per thread"], gx, gy, gz, bx, by, bz,
                            a["shared memory"], 0, 0, 0, len(kernels), None, None, None, None, None, None, None,
                            0, 0, 0, 0, 0, 0, 0, ""))  # fmt: skip
        elif cat == "cuda_runtime":
            start = _ns(e["ts"])
            launches.append((start, start + _ns(e["dur"]), 0, gtid, e["args"]["correlation"], launch_name, 0, None))
        elif cat == "user_annotation" or str(e.get("name", "")).startswith("ProfilerStep#"):
            start = _ns(e["ts"])
            ranges.append((start, start + _ns(e["dur"]), 59, None, None, None, e["name"], gtid, gtid)
                          + (None,) * 11)  # fmt: skip
    db.executemany(f"INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES ({','.join('?' * 40)})", kernels)
    db.executemany("INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (?,?,?,?,?,?,?,?)", launches)
    db.executemany(f"INSERT INTO NVTX_EVENTS VALUES ({','.join('?' * 20)})", ranges)
    db.executemany("INSERT INTO StringIds VALUES (?, ?)", [(i, s) for s, i in strings.items()])
    base = int(doc.get("baseTimeNanoseconds") or 0)
    db.execute("INSERT INTO TARGET_INFO_SESSION_START_TIME VALUES (?, NULL, NULL, 0)", (base,))
    db.executemany("INSERT INTO META_DATA_CAPTURE VALUES (?, ?)",
                   [("PROCESS_0:ENVIRONMENT_VARIABLE", f'RANK="{rank}"'),
                    ("PROCESS_0:ENVIRONMENT_VARIABLE", f'WORLD_SIZE="{world_size}"')])  # fmt: skip
    db.commit()
    db.close()


# --- the measured worker (a fresh interpreter per format) -------------------------------


def worker(out: str, workers: int, files: list[str]) -> None:
    t0 = time.perf_counter()
    import pyarrow.compute as pc

    from overlapviz.ingest import ingest
    from overlapviz.schema import read_kernels

    t1 = time.perf_counter()
    ds = ingest(files, out, run_id="bench", workers=workers, progress=False)
    t2 = time.perf_counter()
    k = read_kernels(ds, ["kind", "start_ns", "end_ns", "rank", "name", "launch_ns", "step", "collective"])
    counts = {kind: int(pc.sum(pc.equal(k.column("kind"), kind)).as_py() or 0) for kind in ("comm", "compute", "memory", "other")}
    print(json.dumps({"import_s": t1 - t0, "ingest_s": t2 - t1, "n_kernels": k.num_rows, "kinds": counts,
                      "n_launch": k.num_rows - k.column("launch_ns").null_count, "n_step": k.num_rows - k.column("step").null_count,
                      "n_collective": k.num_rows - k.column("collective").null_count,
                      "sum_dur_ns": int(pc.sum(pc.subtract(k.column("end_ns"), k.column("start_ns"))).as_py() or 0)}))  # fmt: skip


def run_side(label: str, files: list[Path], out: Path, workers: int) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", str(out), str(workers), *map(str, files)]
    m = measure(cmd, timeout=3600)
    if m["rc"] != 0:
        raise SystemExit(f"{label} failed ({m['rc']}): {m['stderr']}")
    res = json.loads(m["stdout"].strip().splitlines()[-1])
    size = sum(f.stat().st_size for f in files)
    return {"format": label, "files": len(files), "bytes": size, "wall_s": m["wall_s"], "cpu_s": m["cpu_s"],
            "peak_rss_mb": m["peak_rss_mb"], **res, "kernels_per_s": res["n_kernels"] / res["ingest_s"]}  # fmt: skip


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kernels", type=int, default=1_000_000, help="kernels in all (default 1M)")
    ap.add_argument("--ranks", type=int, default=8, help="one file per rank (default 8)")
    ap.add_argument("--workers", type=int, default=2, help="ingest --workers for both formats (default 2)")
    ap.add_argument("--no-reference", action="store_true", help="skip the reference nsys exports")
    ap.add_argument("--worker", nargs="+", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        out, workers, *files = args.worker
        return worker(out, int(workers), files)

    results = []
    with tempfile.TemporaryDirectory(prefix="bench-formats-") as tmp:
        tmp = Path(tmp)
        t0 = time.perf_counter()
        kineto, nsys = write_sets(tmp / "src", args.kernels, args.ranks)
        print(f"wrote {args.kernels} kernels x 2 formats in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
        for label, files in (("kineto_json", kineto), ("nsys_sqlite", nsys)):
            results.append(run_side(label, files, tmp / f"ds_{label}", args.workers))
            print(json.dumps({k: v for k, v in results[-1].items()}), file=sys.stderr)
        a, b = results
        keys = ("n_kernels", "kinds", "sum_dur_ns", "n_launch", "n_step", "n_collective")
        same = [a[k] for k in keys] == [b[k] for k in keys]
        if not same:
            raise SystemExit(f"the two datasets differ: {a} vs {b}")
        refs = []
        if not args.no_reference and REFERENCE.is_dir():
            for f in sorted(REFERENCE.glob("*/*.sqlite")):
                r = run_side(f"reference {f.parent.name}/{f.name}", [f], tmp / f"ref_{f.parent.name}_{f.stem}", 1)
                refs.append(r)
    ratio = results[1]["kernels_per_s"] / results[0]["kernels_per_s"]
    report = {"kernels": args.kernels, "ranks": args.ranks, "workers": args.workers, "cpus": os.cpu_count(),
              "python": platform.python_version(), "sides": results, "nsys_over_kineto": ratio, "reference": refs}  # fmt: skip
    (HERE / "out").mkdir(exist_ok=True)
    (HERE / "out" / "formats.json").write_text(json.dumps(report, indent=1))
    print(f"{args.kernels} kernels, {args.ranks} ranks, --workers {args.workers}, {os.cpu_count()} CPUs\n")
    print("| format | files | MB on disk | kernels | ingest s | kernels/s | CPU s | wall s (process) | peak RSS MB |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in results + refs:
        print(f"| {r['format']} | {r['files']} | {r['bytes'] / 2**20:.1f} | {r['n_kernels']} | {r['ingest_s']:.2f} | "
              f"{r['kernels_per_s']:,.0f} | {r['cpu_s']:.2f} | {r['wall_s']:.2f} | {r['peak_rss_mb']:.0f} |")  # fmt: skip
    print(f"\nnsys_sqlite / kineto_json kernels/s: {ratio:.2f}; same kernels, kinds, total duration, "
          "launch links, steps and collectives in both datasets")


if __name__ == "__main__":
    main()
