"""Record real multi-cycle torch.profiler traces of a CPU-only gloo job for the ingest tests.

``torch.profiler.schedule(wait=1, warmup=1, active=2, repeat=3)`` with
``tensorboard_trace_handler`` writes one file per rank *per cycle*,
``<worker>.<timestamp_ms>.pt.trace.json.gz`` with the handler's default worker name
``<hostname>_<pid>``. Each step issues an async all_reduce and a few matmuls. Run from the
repository root::

    .venv/bin/python tests/data/gloo_cycles/make_traces.py tests/data/gloo_cycles

Writes two layouts of two different jobs: ``per_rank/rank_<N>/`` (each rank's handler
writes into its own folder, 2 ranks x 3 cycles) and ``flat/`` (every rank's handler writes
into one folder, 3 ranks x 3 cycles).
"""

from __future__ import annotations

import os
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WAIT, WARMUP, ACTIVE, REPEAT = 1, 1, 2, 3
MATMULS_PER_STEP = 3
N = 96  # matrix size: small enough that the traces stay small


def _worker(rank: int, world: int, init_file: str, out_dir: str, per_rank: bool) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    torch.manual_seed(rank)
    a, b = torch.randn(N, N), torch.randn(N, N)
    grad = torch.randn(1 << 14)
    folder = os.path.join(out_dir, f"rank_{rank}") if per_rank else out_dir
    with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU],
        schedule=torch.profiler.schedule(wait=WAIT, warmup=WARMUP, active=ACTIVE, repeat=REPEAT),
        on_trace_ready=torch.profiler.tensorboard_trace_handler(folder, use_gzip=True),
    ) as prof:
        for _ in range((WAIT + WARMUP + ACTIVE) * REPEAT):
            work = dist.all_reduce(grad, async_op=True)  # runs on gloo's worker thread
            c = a
            for _ in range(MATMULS_PER_STEP):
                c = torch.mm(c, b) / N
            work.wait()
            prof.step()
    dist.barrier()
    dist.destroy_process_group()


def main(out_dir: str) -> None:
    for layout, world in (("per_rank", 2), ("flat", 3)):
        with tempfile.TemporaryDirectory() as tmp:
            mp.spawn(_worker, args=(world, os.path.join(tmp, "init"), os.path.join(out_dir, layout), layout == "per_rank"),
                     nprocs=world, join=True)  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__)))
