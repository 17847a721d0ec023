"""`overlapviz explain` on a million kernels over 8 ranks, beside the previous implementation (residency --delays before it).

Not a test: prints a table. The dataset is written straight through the DatasetWriter (no
reader in the loop): per rank, compute kernels back to back on one stream and every 10th
kernel a collective on another, each collective preceded by ProcessGroupNCCL's pattern on
the host (cudaEventRecord on the compute stream, cudaStreamWaitEvent on the NCCL stream,
then the launch), with an H200's limits. The previous implementation is the
``overlapviz/analysis/explain.py`` of commit PREVIOUS, loaded from git.

    .venv/bin/python benchmarks/bench_explain.py [--kernels 1000000] [--ranks 8] [--repeat 3] [--work /tmp/ovz-bench]
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

PREVIOUS = "8f5f896"  # the last commit with the launch/stream-only comm_start_delays
H200 = {"device": 0, "name": "NVIDIA H200", "arch": "sm_90", "num_sms": 132}


def build(out: Path, n_kernels: int, n_ranks: int) -> Path:
    from overlapviz.dataset import schema

    if (out / "dataset.json").exists():
        return out
    per = n_kernels // n_ranks
    with schema.DatasetWriter(out, overwrite=True) as w:
        w.add("runs", pa.table({"run_id": ["bench"]}))
        for rank in range(n_ranks):
            rng = np.random.default_rng(rank)
            comm = (np.arange(per) % 10) == 9
            dur = np.where(comm, rng.integers(20_000, 80_000, per), rng.integers(5_000, 50_000, per))
            launch = 1_700_000_000_000_000_000 + np.cumsum(rng.integers(3_000, 8_000, per))
            start = np.empty(per, np.int64)
            free = {7: 0, 20: 0}
            for i in range(per):  # each stream in order; a kernel starts 2 µs after its launch or its stream
                s = 20 if comm[i] else 7
                start[i] = max(launch[i] + 2_000, free[s])
                free[s] = start[i] + dur[i]
            corr = np.arange(per, dtype=np.int64) * 3 + 10
            k = pa.table({
                "run_id": ["bench"] * per, "rank": pa.array([rank] * per, pa.int32()), "device": pa.array([0] * per, pa.int32()),
                "stream": np.where(comm, 20, 7), "correlation": corr,
                "name": np.where(comm, "ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "sm90_xmma_gemm_bf16"),
                "kind": np.where(comm, "comm", "compute"), "category": ["kernel"] * per, "is_host": np.zeros(per, bool),
                "start_ns": start, "end_ns": start + dur, "grid_x": pa.array(np.where(comm, 16, 1024), pa.int32()),
                "grid_y": pa.array([1] * per, pa.int32()), "grid_z": pa.array([1] * per, pa.int32()),
                "block_x": pa.array(np.where(comm, 512, 256), pa.int32()), "block_y": pa.array([1] * per, pa.int32()),
                "block_z": pa.array([1] * per, pa.int32()), "regs_per_thread": pa.array(np.where(comm, 96, 128), pa.int32()),
                "shared_mem_bytes": np.where(comm, 0, 98304), "launch_ns": launch, "launch_tid": np.full(per, 100 + rank),
                "step": np.arange(per) * 10 // per, "collective": np.where(comm, "all_reduce", None),
            })  # fmt: skip
            w.add_kernels(schema.conform(k, schema.KERNELS), "bench", rank)
            c = np.flatnonzero(comm)
            t_rec, t_wait = launch[c] - 1_500, launch[c] - 1_000
            n = len(c)
            syncs = pa.table({
                "run_id": ["bench"] * 2 * n, "rank": pa.array([rank] * 2 * n, pa.int32()), "source": ["runtime"] * 2 * n,
                "kind": ["event_record"] * n + ["stream_wait_event"] * n, "name": ["cudaEventRecord"] * n + ["cudaStreamWaitEvent"] * n,
                "tid": np.full(2 * n, 100 + rank), "start_ns": np.concatenate([t_rec, t_wait]),
                "end_ns": np.concatenate([t_rec, t_wait]) + 300, "correlation": np.concatenate([corr[c] - 2, corr[c] - 1]),
            })  # fmt: skip
            w.add("syncs", schema.conform(syncs, schema.SYNCS))
            w.add("devices", pa.Table.from_pylist([{"run_id": "bench", "rank": rank, **H200}]))
        w.commit()
    return out


def previous_module(work: Path):
    root = Path(__file__).resolve().parent.parent
    src = subprocess.run(["git", "-C", str(root), "show", f"{PREVIOUS}:overlapviz/analysis/explain.py"], capture_output=True,
                         text=True, check=True).stdout  # fmt: skip
    path = work / "previous_explain.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location("previous_explain", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def timed(fn, repeat: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kernels", type=int, default=1_000_000)
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--work", type=Path, default=Path("/tmp/ovz-bench"))
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    ds = build(args.work / f"explain-{args.kernels}-{args.ranks}", args.kernels, args.ranks)
    from overlapviz.analysis.explain import explain

    t_new, new = timed(lambda: explain(ds), args.repeat)
    old = previous_module(args.work)
    t_old, prev = timed(lambda: old.comm_start_delays(ds), args.repeat)
    causes = new["cause"].value_counts().to_dict()
    print(f"{args.kernels:,} kernels over {args.ranks} ranks, {len(new):,} comm kernels (medians of {args.repeat})")
    print("| implementation | s | comm records |\n|---|---|---|")
    print(f"| explain (this version: + dependencies, grid-aware room, peers) | {t_new:.2f} | {len(new):,} |")
    print(f"| comm_start_delays ({PREVIOUS}: launch/stream only) | {t_old:.2f} | {len(prev):,} |")
    print(f"ratio this / previous: {t_new / t_old:.2f}; causes: {causes}")


if __name__ == "__main__":
    sys.exit(main())
