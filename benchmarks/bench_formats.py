"""Ingest throughput per format, side by side in one run: Nsight Systems SQLite and rocpd against Kineto JSON, on the same kernels.

    .venv/bin/python benchmarks/bench_formats.py                      # 1M kernels over 8 ranks
    .venv/bin/python benchmarks/bench_formats.py --kernels 200000 --ranks 4 --workers 2

The workload is overlapviz.testing.generate_trace (compute kernels on one stream, NCCL
kernels on another, a cudaLaunchKernel per kernel, ProfilerStep ranges), one rank per file,
written three times: as Kineto traces (``rank<N>.json.gz``), as Nsight Systems exports
(``rank<N>.sqlite``: the tables, columns and enum rows of a real 3.25.0 export,
tests/data/nsys/mfu_2gpu_before_window40ms.sqlite, with the same kernels in
CUPTI_ACTIVITY_KIND_KERNEL, the launches in CUPTI_ACTIVITY_KIND_RUNTIME, the steps in
NVTX_EVENTS) and as rocprofv3 rocpd databases (``rank<N>_results.db``: rocpd schema 3.0.0
from the DDL tests/_rocpd_db.py quotes, the kernels as dispatches with their symbols, the
launches as hipLaunchKernel regions with their stream argument, the steps as roctx ranges;
no real rocpd database could be obtained, see docs/nsys_rocpd.md). Each format is ingested
by the real path (``overlapviz.ingest.ingest``, same ``--workers``) in a fresh subprocess, timed from outside (wall, with interpreter start-up)
and inside (the ingest call), its process tree's peak RSS sampled every 10 ms; all three
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
sys.path.insert(1, str(ROOT / "tests"))  # _rocpd_db: the rocpd DDL and fixed rows
from bench_ingest import measure  # noqa: E402  (same sampler as the Kineto/HTA benchmark)

SCHEMA_SOURCE = ROOT / "tests" / "data" / "nsys" / "mfu_2gpu_before_window40ms.sqlite"
REFERENCE = Path(os.environ.get("OVERLAPVIZ_REFERENCE_TRACES", ROOT.parent / "shared" / "reference_traces")) / "nsys"
PID_BASE = 4000
TID = 4000


# --- the workload, written twice -------------------------------------------------------


FORMATS = ("kineto_json", "nsys_sqlite", "rocpd_sqlite")


def write_sets(out: Path, n_kernels: int, ranks: int) -> dict[str, list[Path]]:
    """The workload as one file per rank in each format (``out/<format>/rank<N>.*``); kept
    when ``out`` already holds it (``--data``), so alternating runs read the same files."""
    from overlapviz.testing import generate_trace, write_trace

    done = out / f"complete-{n_kernels}-{ranks}"
    names = {"kineto_json": "rank{}.json.gz", "nsys_sqlite": "rank{}.sqlite", "rocpd_sqlite": "rank{}_results.db"}
    sets = {f: [out / f / names[f].format(r) for r in range(ranks)] for f in FORMATS}
    if done.exists():
        return sets
    per = [n_kernels // ranks + (1 if r < n_kernels % ranks else 0) for r in range(ranks)]
    for f in FORMATS:
        (out / f).mkdir(parents=True, exist_ok=True)
        for p in (out / f).iterdir():
            p.unlink()
    for r in range(ranks):
        doc = generate_trace(per[r], rank=r, world_size=ranks, seed=1, comm_every=7, n_steps=20)
        write_trace(doc, sets["kineto_json"][r])
        write_nsys(doc, sets["nsys_sqlite"][r], pid=PID_BASE + r, rank=r, world_size=ranks)
        write_rocpd(doc, sets["rocpd_sqlite"][r], pid=PID_BASE + r, rank=r, world_size=ranks)
        del doc
    done.touch()
    return sets


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


def write_rocpd(doc: dict, path: Path, *, pid: int, rank: int, world_size: int) -> None:
    """``doc``'s kernels, launches and steps as a rocprofv3 rocpd database (schema 3.0.0).

    The tables are made by tests/_rocpd_db.py's ``Process`` (rocprofiler-sdk 1.0.0's DDL,
    the node/process/agent/queue rows of a real MI350X run), the rows written as
    generateRocpd.cpp writes them (tests/_rocpd_db.py's ``Process`` methods), in bulk: a
    dispatch's event carries its launch region's id (the correlation) as ``stack_id``, the
    launch names its stream by handle in ``rocpd_arg``, steps are roctx ranges whose
    message is in the event's ``extdata``.
    """
    from _rocpd_db import GUID_A, Process

    db = sqlite3.connect(path)
    db.execute("PRAGMA journal_mode = OFF")
    db.execute("PRAGMA synchronous = OFF")
    p = Process(db, GUID_A, pid, {"RANK": str(rank), "WORLD_SIZE": str(world_size)}, create_views=False)
    main = p.pid
    launch_name = p.string("hipLaunchKernel")
    cat_api, cat_kernel, cat_marker = (p.string(c) for c in ("HIP_RUNTIME_API_EXT", "KERNEL_DISPATCH", "MARKER_CORE_RANGE_API"))
    push = p.string("roctxRangePushA")
    symbols: dict[str, int] = {}
    stream_of: dict[int, int] = {}  # correlation -> the stream of its kernel (written before its launch)
    events, args, regions, dispatches = [], [], [], []

    def event(category: int, stack_id: int, extdata: str = "{}") -> int:
        e = p.next_event
        p.next_event += 1
        events.append((e, category, stack_id, stack_id, 0, extdata))
        return e

    step_corr = 1 << 40  # region ids of the roctx ranges, apart from the launches' correlation ids
    for ev in doc["traceEvents"]:
        cat = ev.get("cat")
        if cat == "kernel":
            a = ev["args"]
            if ev["name"] not in symbols:
                symbols[ev["name"]] = kid = len(symbols) + 1
                p.symbol(kid, ev["name"], ev["name"], vgpr=a["registers per thread"], agpr=0, sgpr=32, lds=0)
            start = _ns(ev["ts"])
            (gx, gy, gz), (bx, by, bz) = a["grid"], a["block"]
            e = event(cat_kernel, a["correlation"])
            stream_of[a["correlation"]] = a["stream"]
            dispatches.append((len(dispatches) + 1, p.node, main, main, p.gpu[0], symbols[ev["name"]], len(dispatches) + 1,
                               a["stream"], a["stream"], start, start + _ns(ev["dur"]), 0, a["shared memory"], bx, by,
                               bz, gx * bx, gy * by, gz * bz, None, e))  # fmt: skip
        elif cat == "cuda_runtime":
            start, corr = _ns(ev["ts"]), ev["args"]["correlation"]
            e = event(cat_api, corr)
            args.append((e, 0, "hipStream_t", "stream", hex(0x55D5C0A10000 + stream_of[corr])))
            regions.append((corr, p.node, main, main, start, start + _ns(ev["dur"]), launch_name, e))
        elif cat == "user_annotation" or str(ev.get("name", "")).startswith("ProfilerStep#"):
            start = _ns(ev["ts"])
            step_corr += 1
            e = event(cat_marker, step_corr, json.dumps({"message": ev["name"]}))
            regions.append((step_corr, p.node, main, main, start, start + _ns(ev["dur"]), push, e))

    def ins(table: str, cols: str, rows: list) -> None:
        names = ", ".join(f'"{c}"' for c in cols.split())
        db.executemany(f'INSERT INTO "rocpd_{table}{p.uuid}" ({names}) VALUES ({", ".join("?" * len(cols.split()))})', rows)

    ins("event", "id category_id stack_id parent_stack_id correlation_id extdata", events)
    ins("arg", "event_id position type name value", args)
    ins("region", "id nid pid tid start end name_id event_id", regions)
    ins("kernel_dispatch", "id nid pid tid agent_id kernel_id dispatch_id queue_id stream_id start end "
        "private_segment_size group_segment_size workgroup_size_x workgroup_size_y workgroup_size_z grid_size_x "
        "grid_size_y grid_size_z region_name_id event_id", dispatches)  # fmt: skip
    db.commit()
    db.close()


# --- the measured worker (a fresh interpreter per format) -------------------------------


def worker(out: str, workers: int, files: list[str]) -> None:
    t0 = time.perf_counter()
    import pyarrow.compute as pc

    from overlapviz.ingest import ingest
    from overlapviz.dataset.schema import read_kernels

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
    ap.add_argument("--data", help="keep the generated traces in this folder and reuse them (same --kernels/--ranks)")
    ap.add_argument("--worker", nargs="+", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        out, workers, *files = args.worker
        return worker(out, int(workers), files)

    results = []
    with tempfile.TemporaryDirectory(prefix="bench-formats-") as tmp:
        tmp = Path(tmp)
        t0 = time.perf_counter()
        sets = write_sets(Path(args.data) if args.data else tmp / "src", args.kernels, args.ranks)
        print(f"{args.kernels} kernels x {len(FORMATS)} formats ready in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
        for label in FORMATS:
            results.append(run_side(label, sets[label], tmp / f"ds_{label}", args.workers))
            print(json.dumps({k: v for k, v in results[-1].items()}), file=sys.stderr)
        keys = ("n_kernels", "kinds", "sum_dur_ns", "n_launch", "n_step", "n_collective")
        for r in results[1:]:
            if [r[k] for k in keys] != [results[0][k] for k in keys]:
                raise SystemExit(f"the datasets differ: {results[0]} vs {r}")
        refs = []
        if not args.no_reference and REFERENCE.is_dir():
            for f in sorted(REFERENCE.glob("*/*.sqlite")):
                r = run_side(f"reference {f.parent.name}/{f.name}", [f], tmp / f"ref_{f.parent.name}_{f.stem}", 1)
                refs.append(r)
    kineto = results[0]
    for r in results:
        r["cpu_us_per_kernel"] = r["cpu_s"] / r["n_kernels"] * 1e6
        r["kernels_per_s_over_kineto"] = r["kernels_per_s"] / kineto["kernels_per_s"]
        r["cpu_over_kineto"] = r["cpu_s"] / kineto["cpu_s"]
    from overlapviz.ingest.sqlite_common import c_reader_available

    # the SQLite formats' column reader the ingest subprocesses used (same build, same environment)
    sqlite_reader = "C (_sqlite)" if c_reader_available() else "json_array"
    report = {"kernels": args.kernels, "ranks": args.ranks, "workers": args.workers, "cpus": os.cpu_count(),
              "load_avg": os.getloadavg(), "python": platform.python_version(), "sqlite_reader": sqlite_reader,
              "sides": results,
              "nsys_over_kineto": results[1]["kernels_per_s_over_kineto"],
              "rocpd_over_kineto": results[2]["kernels_per_s_over_kineto"], "reference": refs}  # fmt: skip
    (HERE / "out").mkdir(exist_ok=True)
    (HERE / "out" / "formats.json").write_text(json.dumps(report, indent=1))
    print(f"{args.kernels} kernels, {args.ranks} ranks, --workers {args.workers}, {os.cpu_count()} CPUs, "
          f"load average {os.getloadavg()[0]:.1f}, SQLite column reader {sqlite_reader}\n")  # fmt: skip
    print("| format | files | MB on disk | kernels | ingest s | kernels/s | CPU s | CPU / Kineto's | wall s (process) | peak RSS MB |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in results + refs:
        ratio = f"{r['cpu_over_kineto']:.2f}" if "cpu_over_kineto" in r else ""
        print(f"| {r['format']} | {r['files']} | {r['bytes'] / 2**20:.1f} | {r['n_kernels']} | {r['ingest_s']:.2f} | "
              f"{r['kernels_per_s']:,.0f} | {r['cpu_s']:.2f} | {ratio} | {r['wall_s']:.2f} | {r['peak_rss_mb']:.0f} |")  # fmt: skip
    print(f"\nkernels/s over kineto_json's: nsys_sqlite {results[1]['kernels_per_s_over_kineto']:.2f}, rocpd_sqlite "
          f"{results[2]['kernels_per_s_over_kineto']:.2f}; same kernels, kinds, total duration, launch links, steps and "
          "collectives in all three datasets")  # fmt: skip

if __name__ == "__main__":
    main()
