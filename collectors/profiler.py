"""A context manager that owns torch.profiler for the traced pass and writes one gzipped Chrome trace per rank."""

from __future__ import annotations

import gzip
import os
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from overlapviz.collectors.manifest import TRACE

ITERATION_RANGE = "ovz_iter#{iteration}"  # record_function name of one traced iteration (ingest: steps source "iteration")


class Profiler:
    """Trace the block it wraps with torch.profiler (CPU + CUDA activities, no shapes, no stacks).

    On exit the Chrome trace is written to ``run_dir / TRACE.format(rank=rank)``, gzipped,
    through a temporary file so that a crash never leaves a truncated trace behind.
    With ``enabled=False`` nothing is profiled (for running under rocprofv3 or nsys) and
    only the iteration ranges are emitted.
    """

    def __init__(self, run_dir: str | os.PathLike, rank: int, *, cuda: bool, enabled: bool = True):
        self.path = Path(run_dir) / TRACE.format(rank=rank)
        self.cuda = cuda
        self.enabled = enabled
        self._prof = None

    def __enter__(self) -> "Profiler":
        if not self.enabled:
            return self
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.cuda else [])
        self._prof = profile(activities=activities, record_shapes=False, with_stack=False, profile_memory=False)
        self._prof.__enter__()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if self._prof is None:
            return
        prof, self._prof = self._prof, None
        if self.cuda:
            import torch

            torch.cuda.synchronize()  # every kernel of the traced pass ends inside the trace
        prof.__exit__(exc_type, exc, tb)
        if exc_type is not None:
            return
        raw = self.path.with_name(f".{self.path.name}.{os.getpid()}.json")
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        try:
            prof.export_chrome_trace(str(raw))
            with open(raw, "rb") as src, gzip.open(tmp, "wb", compresslevel=6) as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
            os.replace(tmp, self.path)
        finally:
            for p in (raw, tmp):
                p.unlink(missing_ok=True)


@contextmanager
def iteration(i: int) -> Iterator[None]:
    """Mark traced iteration ``i`` as a host range the analysis windows by."""
    import torch

    with torch.profiler.record_function(ITERATION_RANGE.format(iteration=i)):
        yield
