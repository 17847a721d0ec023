"""Record two real torch.profiler traces of a CPU-only gloo job (2 ranks) for the ingest tests.

Each rank does a few profiler steps of matmuls with an async all_reduce in flight, so
the traces hold gloo's ``gloo:all_reduce`` ranges (on gloo's worker threads) beside
top-level ``aten::mm`` cpu_ops on the main thread. Run from the repository root::

    .venv/bin/python tests/data/gloo_cpu/make_traces.py tests/data/gloo_cpu

Writes ``rank0.json.gz`` and ``rank1.json.gz`` (gzip of the profiler's JSON export).
"""

from __future__ import annotations

import gzip
import os
import shutil
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WORLD_SIZE = 2
STEPS = 3  # profiler steps recorded (after 1 warm-up step)
MATMULS_PER_STEP = 4
N = 192  # matrix size: small enough that the traces stay small


def _worker(rank: int, init_file: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD_SIZE)
    torch.manual_seed(rank)
    a = torch.randn(N, N)
    b = torch.randn(N, N)
    grad = torch.randn(1 << 18)
    schedule = torch.profiler.schedule(wait=0, warmup=1, active=STEPS, repeat=1)
    tmp = os.path.join(out_dir, f".rank{rank}.json")
    with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU],
        schedule=schedule,
        on_trace_ready=lambda p: p.export_chrome_trace(tmp),
    ) as prof:
        for _ in range(1 + STEPS):
            work = dist.all_reduce(grad, async_op=True)  # runs on gloo's worker thread
            c = a
            for _ in range(MATMULS_PER_STEP):
                c = torch.mm(c, b) / N
            work.wait()
            prof.step()
    dist.barrier()
    dist.destroy_process_group()
    with open(tmp, "rb") as src, gzip.open(os.path.join(out_dir, f"rank{rank}.json.gz"), "wb", 9) as dst:
        shutil.copyfileobj(src, dst)
    os.remove(tmp)


def main(out_dir: str) -> None:
    os.makedirs(out_dir, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_worker, args=(os.path.join(tmp, "init"), out_dir), nprocs=WORLD_SIZE, join=True)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__)))
