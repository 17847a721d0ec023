"""Builders of synthetic PyTorch-profiler (Kineto) Chrome traces, for tests and benchmarks.

The events have the shape Kineto writes (torch 2.x, CUPTI): ``ph: "X"``, ``ts``/``dur``
in microseconds as floats with three decimals, GPU activities on ``pid`` = device and
``tid`` = stream, with ``args.device/stream/correlation/grid/block/...``, runtime calls
on the host process carrying the same ``correlation``. Times are given to the builders
in integer nanoseconds (``*_ns``) so tests can state exact expectations.

    >>> doc = kineto_trace(
    ...     runtime_event(1, 1_000_000, 5_000),
    ...     kernel_event("gemm", 1_010_000, 20_000, correlation=1),
    ...     step_event(0, 900_000, 200_000),
    ...     rank=0, world_size=2)
    >>> path = write_trace(doc, tmp_path / "rank0.json.gz")

``generate_trace`` builds big realistic traces (compute stream + NCCL stream + launches +
steps) fast enough for 1 million kernels over 8 ranks.
"""

from __future__ import annotations

import gzip as _gzip
import os
from pathlib import Path
from typing import Iterable

import numpy as np
import orjson

HOST_PID = 4242  # the training process
HOST_TID = 4242  # its main thread
DEFAULT_BASE_NS = 1_700_000_000_000_000_000  # baseTimeNanoseconds written into traces

# deviceProperties of an NVIDIA A100 as torch 2.x's Kineto writes them
A100_PROPERTIES = {
    "id": 0,
    "name": "NVIDIA A100-SXM4-80GB",
    "totalGlobalMem": 85198045184,
    "computeMajor": 8,
    "computeMinor": 0,
    "maxThreadsPerBlock": 1024,
    "maxThreadsPerMultiprocessor": 2048,
    "regsPerBlock": 65536,
    "warpSize": 32,
    "sharedMemPerBlock": 49152,
    "numSms": 108,
    "regsPerMultiprocessor": 65536,
    "sharedMemPerBlockOptin": 166912,
    "sharedMemPerMultiprocessor": 167936,
}


def us(ns: int) -> float:
    """Integer nanoseconds -> Kineto's float microseconds (three decimals)."""
    return round(int(ns) / 1000.0, 3)


def kernel_event(
    name: str,
    start_ns: int,
    dur_ns: int,
    *,
    correlation: int | None = None,
    device: int = 0,
    stream: int = 7,
    grid: tuple = (1, 1, 1),
    block: tuple = (128, 1, 1),
    regs_per_thread: int = 32,
    shared_mem_bytes: int = 0,
    external_id: int | None = None,
    cat: str = "kernel",
    **args,
) -> dict:
    """A GPU kernel (``cat`` kernel) as CUPTI-based Kineto writes it; extra ``args`` are merged in."""
    a = {"External id": external_id if external_id is not None else correlation, "queued": 0, "device": device}
    a.update({"context": 1, "stream": stream, "correlation": correlation})
    if grid is not None:
        a["grid"] = list(grid)
    if block is not None:
        a["block"] = list(block)
    if regs_per_thread is not None:
        a["registers per thread"] = regs_per_thread
    if shared_mem_bytes is not None:
        a["shared memory"] = shared_mem_bytes
    a.update(args)
    a = {k: v for k, v in a.items() if v is not None}
    return {"ph": "X", "cat": cat, "name": name, "pid": device, "tid": stream, "ts": us(start_ns), "dur": us(dur_ns), "args": a}


def memcpy_event(start_ns: int, dur_ns: int, *, bytes: int = 4096, correlation: int | None = None, device: int = 0,
                 stream: int = 7, kind: str = "HtoD (Pageable -> Device)") -> dict:
    """A ``gpu_memcpy`` activity."""
    a = {"device": device, "context": 1, "stream": stream, "correlation": correlation, "bytes": bytes}
    a = {k: v for k, v in a.items() if v is not None}
    return {"ph": "X", "cat": "gpu_memcpy", "name": f"Memcpy {kind}", "pid": device, "tid": stream,
            "ts": us(start_ns), "dur": us(dur_ns), "args": a}


def memset_event(start_ns: int, dur_ns: int, *, bytes: int = 4096, correlation: int | None = None, device: int = 0,
                 stream: int = 7) -> dict:
    """A ``gpu_memset`` activity."""
    a = {"device": device, "context": 1, "stream": stream, "correlation": correlation, "bytes": bytes}
    a = {k: v for k, v in a.items() if v is not None}
    return {"ph": "X", "cat": "gpu_memset", "name": "Memset (Device)", "pid": device, "tid": stream,
            "ts": us(start_ns), "dur": us(dur_ns), "args": a}


def runtime_event(correlation: int, start_ns: int, dur_ns: int = 4_000, *, name: str = "cudaLaunchKernel",
                  pid: int = HOST_PID, tid: int = HOST_TID, cat: str = "cuda_runtime", **args) -> dict:
    """A host runtime call (``cuda_runtime``) with its ``correlation`` id."""
    a = {"External id": correlation, "cbid": 211, "correlation": correlation}
    a.update(args)
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": us(start_ns), "dur": us(dur_ns), "args": a}


def step_event(step: int, start_ns: int, dur_ns: int, *, name: str | None = None, cat: str = "user_annotation",
               pid: int = HOST_PID, tid: int = HOST_TID) -> dict:
    """A host range ``ProfilerStep#<step>`` (or ``name``, e.g. ``ovz_iter#3``)."""
    return {"ph": "X", "cat": cat, "name": name or f"ProfilerStep#{step}", "pid": pid, "tid": tid,
            "ts": us(start_ns), "dur": us(dur_ns), "args": {"External id": 0}}


def cpu_op_event(name: str, start_ns: int, dur_ns: int, *, pid: int = HOST_PID, tid: int = HOST_TID,
                 cat: str = "cpu_op", **args) -> dict:
    """A host operator (``cpu_op``) or, with ``cat="user_annotation"``, a ``record_function`` range."""
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": us(start_ns), "dur": us(dur_ns),
            "args": dict(args)}


def kineto_trace(
    *events: dict | Iterable[dict],
    rank: int | None = 0,
    world_size: int | None = 1,
    backend: str = "nccl",
    device_properties: list[dict] | None = None,
    base_time_ns: int | None = DEFAULT_BASE_NS,
    **top,
) -> dict:
    """A whole trace document. ``events`` may be events or iterables of events.

    ``rank=None`` leaves ``distributedInfo`` out (as single-process traces do);
    ``device_properties=None`` writes one A100 entry, ``[]`` writes none. Extra keyword
    arguments become top-level keys.
    """
    flat: list[dict] = []
    for e in events:
        if isinstance(e, dict):
            flat.append(e)
        else:
            flat.extend(e)
    doc: dict = {"schemaVersion": 1}
    doc["deviceProperties"] = [dict(A100_PROPERTIES)] if device_properties is None else list(device_properties)
    if rank is not None:
        doc["distributedInfo"] = {"backend": backend, "rank": rank, "world_size": world_size}
    doc["traceEvents"] = flat
    if base_time_ns is not None:
        doc["baseTimeNanoseconds"] = base_time_ns
    doc["displayTimeUnit"] = "ms"
    doc.update(top)
    return doc


def write_trace(doc: dict, path: str | os.PathLike, *, gzip: bool | None = None, pretty: bool = False) -> Path:
    """Write ``doc`` as JSON (gzip when ``gzip`` is True, or None and the name ends ``.gz``)."""
    path = Path(path)
    data = orjson.dumps(doc, option=orjson.OPT_INDENT_2 if pretty else 0)
    if gzip is None:
        gzip = path.name.endswith(".gz")
    path.parent.mkdir(parents=True, exist_ok=True)
    if gzip:
        path.write_bytes(_gzip.compress(data, compresslevel=1))
    else:
        path.write_bytes(data)
    return path


_COMPUTE_NAMES = (
    "ampere_sgemm_128x64_nn",
    "void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl>",
    "void at::native::reduce_kernel<512, 1>",
    "sm80_xmma_gemm_f16f16_f16f32_f32_nn_n_tilesize128x128x32",
    "void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_64x64_32x6_nn_align4>",
)
_COMM_NAMES = (
    "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)",
    "ncclDevKernel_AllGather_RING_LL(ncclDevComm*, unsigned long, ncclWork*)",
    "ncclDevKernel_ReduceScatter_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)",
)


def generate_trace(
    n_kernels: int,
    rank: int = 0,
    world_size: int = 1,
    seed: int = 0,
    *,
    comm_every: int = 10,
    n_steps: int = 10,
    start_ns: int = 5_000_000_000_000,
    device_properties: list[dict] | None = None,
) -> dict:
    """A realistic big trace: ``n_kernels`` GPU kernels with their launches and steps.

    Each kernel has a ``cudaLaunchKernel`` on the main thread (correlation ids 1..n);
    launches follow each other on the host. Compute kernels run on stream 7, every
    ``comm_every``-th kernel is an NCCL kernel on stream 20 (so it overlaps the compute
    launched after it); a kernel starts 1-6 µs after its launch ends or when its stream
    is free, whichever is later. The launches are split evenly into ``n_steps``
    ``ProfilerStep#N`` ranges (N = 0, 1, ...). ``start_ns`` is on Kineto's clock (µs
    values below 2^43, where float µs keep ns exactly). Deterministic for ``seed``/``rank``.

    Returns
    -------
    dict
        The trace document (``write_trace`` writes it). ``len(doc["traceEvents"])`` is
        ``2 * n_kernels + n_steps`` (kernels, launches, steps).
    """
    n = int(n_kernels)
    rng = np.random.default_rng([seed, rank])
    is_comm = np.zeros(n, dtype=bool)
    if comm_every and comm_every > 0:
        is_comm[comm_every - 1 :: comm_every] = True
    dur = rng.integers(2_000, 60_000, n)  # ns
    dur[is_comm] = rng.integers(50_000, 400_000, int(is_comm.sum()))
    gpu_gap = rng.integers(500, 5_000, n).tolist()
    host_gap = rng.integers(1_500, 8_000, n).tolist()  # > 1 µs, so step ranges never touch
    lag = rng.integers(1_000, 6_000, n).tolist()  # launch end -> earliest kernel start
    launch_dur = rng.integers(2_000, 8_000, n).tolist()
    names_idx = rng.integers(0, len(_COMPUTE_NAMES), n).tolist()
    comm_idx = rng.integers(0, len(_COMM_NAMES), n).tolist()
    grid_l = rng.integers(1, 4096, n).tolist()
    regs_l = rng.choice(np.array([32, 64, 96, 128, 255]), n).tolist()
    smem_l = rng.choice(np.array([0, 8192, 16384, 49152]), n).tolist()
    dur_l, comm_l = dur.tolist(), is_comm.tolist()

    # one loop to honour the causal chain (host launches in sequence; a kernel starts after
    # its launch and after its stream's previous kernel); trace generation, not analysis
    host, compute_free, comm_free = start_ns, start_ns, start_ns
    launch = [0] * n
    launch_end = [0] * n
    events: list[dict] = []
    append = events.append
    for i in range(n):
        corr = i + 1
        comm = comm_l[i]
        l0 = host + host_gap[i]
        l1 = l0 + launch_dur[i]
        host = l1
        launch[i], launch_end[i] = l0, l1
        if comm:
            k0 = max(comm_free, l1 + lag[i])
            comm_free = k0 + dur_l[i] + gpu_gap[i]
            stream, name = 20, _COMM_NAMES[comm_idx[i]]
        else:
            k0 = max(compute_free, l1 + lag[i])
            compute_free = k0 + dur_l[i] + gpu_gap[i]
            stream, name = 7, _COMPUTE_NAMES[names_idx[i]]
        append(
            {
                "ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": stream,
                "ts": round(k0 / 1000.0, 3), "dur": round(dur_l[i] / 1000.0, 3),
                "args": {
                    "External id": corr, "queued": 0, "device": 0, "context": 1, "stream": stream,
                    "correlation": corr, "registers per thread": 96 if comm else regs_l[i],
                    "shared memory": 41744 if comm else smem_l[i],
                    "grid": [16 if comm else grid_l[i], 1, 1], "block": [640 if comm else 256, 1, 1],
                },
            }
        )
        append(
            {
                "ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": HOST_PID, "tid": HOST_TID,
                "ts": round(l0 / 1000.0, 3), "dur": round(launch_dur[i] / 1000.0, 3),
                "args": {"External id": corr, "cbid": 211, "correlation": corr},
            }
        )
    if n and n_steps > 0:
        bounds = np.linspace(0, n, min(n_steps, n) + 1).astype(np.int64)
        for s in range(len(bounds) - 1):
            a, b = int(bounds[s]), int(bounds[s + 1]) - 1
            events.append(step_event(s, launch[a] - 500, launch_end[b] + 500 - (launch[a] - 500)))
    return kineto_trace(events, rank=rank, world_size=world_size, device_properties=device_properties)


# --- a collected-style dataset (dashboards, export) -----------------------------------------

# a devices row of an NVIDIA H200 (what the collector records on one)
H200_DEVICE_ROW = {
    "device": 0, "name": "NVIDIA H200", "vendor": "nvidia", "arch": "sm_90", "compute_major": 9, "compute_minor": 0,
    "num_sms": 132, "max_threads_per_sm": 2048, "max_threads_per_block": 1024, "max_blocks_per_sm": 32,
    "regs_per_sm": 65536, "regs_per_block": 65536, "shared_mem_per_sm": 233472, "shared_mem_per_block": 49152,
    "shared_mem_per_block_optin": 232448, "warp_size": 32,
}  # fmt: skip


def write_grid_dataset(out, *, pads=(0, 16384), priorities=(0, -1), ranks=2, iters=6, per_iter=4, seed=0,
                       stand_in=True) -> str:  # fmt: skip
    """A small collected-style dataset written through the real DatasetWriter: a shaping x priority grid
    of cb-ar runs (sequential, baseline, optimized), two ranks, GEMM tiles on one stream and an
    all-reduce on another, steps, iteration times and an H200's limits."""
    import json

    import pandas as pd

    from overlapviz.dataset import schema

    rng = np.random.default_rng(seed)
    configs = [("sequential", 0, 0), ("baseline", 0, 0)] + [("optimized", p, q) for p in pads for q in priorities]
    with schema.DatasetWriter(out) as w:
        for i, (setup, pad, prio) in enumerate(configs):
            run_id = f"cb-ar-{setup}-pad{pad}-prio{prio}"
            slow = {"sequential": 1.0, "baseline": 0.85}.get(setup, 0.8 - pad / 400000 + prio * 0.01)
            w.add("runs", pd.DataFrame([{
                "run_id": run_id, "source": "collected", "workload": "cb-ar", "setup": setup, "compute_impl": "tiled",
                "gemm_m": 4096, "gemm_n": 4096, "gemm_k": 4096, "tile_m": 64, "tile_n": 64, "tile_k": 32,
                "smem_pad_bytes": pad, "comm_priority": prio, "comm_priority_effective": prio, "collective": "all_reduce",
                "message_bytes": 64 << 20, "world_size": ranks, "n_ranks": ranks, "backend": "stand-in" if stand_in else "nccl",
                "stand_in": stand_in, "iterations": iters, "warmup_iterations": iters // 3, "device_name": "NVIDIA H200",
                "status": "ok", "config_json": json.dumps({"setup": setup}),
            }]))  # fmt: skip
            for r in range(ranks):
                w.add("ranks", pd.DataFrame([{"run_id": run_id, "rank": r, "world_size": ranks, "source_format": "chrome"}]))
                w.add("devices", pd.DataFrame([{"run_id": run_id, "rank": r, **H200_DEVICE_ROW}]))
                rows, steps, t = [], [], 1_000
                for it in range(iters):
                    steps.append({"run_id": run_id, "rank": r, "step": it, "name": f"ovz_iter#{it}", "source": "iteration",
                                  "start_ns": t - 500, "end_ns": t + 2_000})  # fmt: skip
                    t0 = t
                    for k in range(per_iter):
                        d = int(rng.integers(40_000, 60_000))
                        rows.append(("gemm_tiled_64x64x32_kernel", "compute", 7, t, t + d, 4096, 128, 128, pad + 32768, it))
                        t += d + 2_000
                    cstart = t0 + (30_000 if setup != "sequential" else t - t0)
                    cdur = int(rng.integers(90_000, 110_000))
                    rows.append(("ncclDevKernel_AllReduce_Sum_f32_RING_LL", "comm", 13, cstart, cstart + cdur, 16, 512, 96, 0, it))
                    t = max(t, cstart + cdur) + 5_000 + 3_000 * r
                k = pd.DataFrame(rows, columns=["name", "kind", "stream", "start_ns", "end_ns", "grid_x", "block_x",
                                                "regs_per_thread", "shared_mem_bytes", "step"])  # fmt: skip
                k = k.assign(run_id=run_id, rank=r, device=0, grid_y=1, grid_z=1, block_y=1, block_z=1, category="kernel",
                             is_host=False, launch_ns=k["start_ns"] - 800, correlation=np.arange(len(k)),
                             source_format="chrome")  # fmt: skip
                w.add_kernels(schema.conform(k, schema.KERNELS), run_id, r)
                w.add("steps", pd.DataFrame(steps))
                times = slow * (1 + 0.01 * rng.standard_normal(iters))
                w.add("iterations", pd.DataFrame({"run_id": run_id, "rank": r, "iteration": np.arange(iters),
                                                  "time_ms": times, "measured": np.arange(iters) >= iters // 3}))  # fmt: skip
        w.commit()
    return str(out)


# --- the reference computation of the overlap metrics (the tests' one oracle) -------------------


def union(intervals: Iterable[tuple[int, int]]) -> list[list[int]]:
    """Sorted, merged ``[start, end]`` pairs of ``intervals`` (touching ones joined, empty ones dropped);
    plain Python integers, independent of :mod:`overlapviz.analysis.intervals`."""
    merged: list[list[int]] = []
    for a, b in sorted((int(a), int(b)) for a, b in intervals):
        if b <= a:
            continue
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return merged


def measure(intervals) -> int:
    """Total length of disjoint ``intervals``."""
    return sum(b - a for a, b in intervals)


def intersect_measure(xs, ys) -> int:
    """Length of the intersection of two :func:`union` results."""
    total, i, j = 0, 0, 0
    while i < len(xs) and j < len(ys):
        lo, hi = max(xs[i][0], ys[j][0]), min(xs[i][1], ys[j][1])
        total += max(0, hi - lo)
        if xs[i][1] < ys[j][1]:
            i += 1
        else:
            j += 1
    return total


def reference_metrics(activities: Iterable[tuple[str, int, int]]) -> dict:
    """DESIGN.md's overlap metrics of one group, by the letter: ``activities`` are ``(kind, start_ns, end_ns)``.

    Returns the ``analyze`` fields (``comm_us`` ... ``n_comm_kernels``, ``busy_us``,
    ``idle_us``, ``memory_us``), None where DESIGN.md says null.
    """
    acts = [(k, int(s), int(e)) for k, s, e in activities]
    by = {kind: union((s, e) for k, s, e in acts if k == kind) for kind in ("comm", "compute", "other", "memory")}
    comm, compute = measure(by["comm"]), measure(by["compute"])
    overlap = intersect_measure(by["comm"], by["compute"])
    busy = measure(union((s, e) for k, s, e in acts if k != "memory"))
    nonmem = [(s, e) for k, s, e in acts if k != "memory"]
    span = (max(e for _, e in nonmem) - min(s for s, _ in nonmem)) if nonmem else None
    return {
        "comm_us": comm / 1e3,
        "compute_us": compute / 1e3,
        "overlap_us": overlap / 1e3,
        "overlap_fraction": overlap / comm if comm else None,
        "exposed_comm_us": (comm - overlap) / 1e3,
        "span_us": None if span is None else span / 1e3,
        "busy_us": busy / 1e3,
        "idle_us": None if span is None else (span - busy) / 1e3,
        "memory_us": measure(by["memory"]) / 1e3,
        "n_kernels": len(nonmem),
        "n_comm_kernels": sum(k == "comm" for k, _, _ in acts),
    }


def expected_overlap(comm, compute) -> dict:
    """:func:`reference_metrics`' ``comm_us, compute_us, overlap_us, overlap_fraction`` of two interval lists."""
    ref = reference_metrics([("comm", s, e) for s, e in comm] + [("compute", s, e) for s, e in compute])
    return {k: ref[k] for k in ("comm_us", "compute_us", "overlap_us", "overlap_fraction")}


# --- the CLI as a test drives it -----------------------------------------------------------------


def ingest_cli(tmp_path, *sources, name: str = "ds", ok: bool = True):
    """``overlapviz ingest SOURCES -o TMP/NAME --quiet`` in-process; ``(dataset path, click Result)``.
    With ``ok`` an exit code other than 0 raises AssertionError carrying the output."""
    from click.testing import CliRunner

    from overlapviz.cli import main

    out = Path(tmp_path) / name
    result = CliRunner().invoke(main, ["ingest", *map(str, sources), "-o", str(out), "--quiet"])
    if ok:
        assert result.exit_code == 0, result.output
    return out, result


def analyze_cli(dataset) -> list[dict]:
    """``overlapviz analyze DATASET --format json`` in-process, parsed."""
    import json

    from click.testing import CliRunner

    from overlapviz.cli import main

    result = CliRunner().invoke(main, ["analyze", str(dataset), "--format", "json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def check_metrics(record: dict, expected: dict) -> None:
    """Each expected metric equals the record's (relative 1e-9; None must be None)."""
    import math

    for key, value in expected.items():
        if value is None:
            assert record[key] is None, key
        else:
            assert record[key] is not None and math.isclose(record[key], value, rel_tol=1e-9, abs_tol=1e-6), (key, record[key], value)


# --- datasets written row by row (explain, perfetto: exact causes by construction) --------------

ROW_BASE_NS = 1_700_000_000_123_456_789  # epoch-scale ns: nothing may pass through float64
ROW_TID = 77
# an H200's devices row by name (occupancy limits come from the arch tables)
H200_ROW = {"device": 0, "name": "NVIDIA H200", "arch": "sm_90", "num_sms": 132}


def kernel_row(name: str, kind: str, stream: int, start: int, end: int, *, launch: int | None = None, block=256, regs=64,
               smem=0, grid=132, corr=None, tid=ROW_TID, category="kernel", base: int = ROW_BASE_NS, **extra) -> dict:
    """One ``kernels`` row: times are ns after ``base``; the launch call on thread ``tid``."""
    return dict(name=name, kind=kind, stream=stream, start_ns=base + start, end_ns=base + end,
                launch_ns=None if launch is None else base + launch, launch_tid=None if launch is None else tid, device=0,
                grid_x=grid, grid_y=1, grid_z=1, block_x=block, block_y=1, block_z=1, regs_per_thread=regs,
                shared_mem_bytes=smem, category=category, is_host=False, correlation=corr, **extra)  # fmt: skip


def sync_row(kind: str, t: int, *, source="runtime", corr=None, stream=None, wait_on_stream=None, record=None, tid=ROW_TID,
             base: int = ROW_BASE_NS) -> dict:
    """One ``syncs`` row at ``t`` ns after ``base`` (1 µs long)."""
    return dict(source=source, kind=kind, name=kind, tid=tid if source == "runtime" else None, start_ns=base + t,
                end_ns=base + t + 1_000, correlation=corr, device=0, stream=stream, wait_on_stream=wait_on_stream,
                wait_on_record_correlation=record)  # fmt: skip


def write_rows_dataset(path, kernels: list[dict], syncs=(), *, ranks=(0,), devices: dict | None = H200_ROW, run_id: str = "r"):
    """A dataset of run ``run_id`` from ``kernel_row``/``sync_row`` dicts (a ``rank`` key picks the
    rank, 0 by default), written through the real DatasetWriter. Rows go through Arrow, not
    pandas: a column with nulls stays int64 (pandas would round epoch-scale ns in float64)."""
    import pyarrow as pa

    from overlapviz.dataset import schema

    def table(rows, name_schema):
        # every row with every key: from_pylist takes its columns from the first row alone
        keys = list(dict.fromkeys(k for r in rows for k in r if k != "rank"))
        t = pa.Table.from_pylist([{k: r.get(k) for k in keys} for r in rows])
        t = t.append_column("run_id", pa.array([run_id] * len(t))).append_column("rank", pa.array([rank] * len(t), pa.int32()))
        return schema.conform(t, name_schema)

    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with schema.DatasetWriter(path) as w:
        w.add("runs", pa.table({"run_id": [run_id]}))
        for rank in ranks:
            if devices is not None:
                w.add("devices", pa.Table.from_pylist([{"run_id": run_id, "rank": rank, **devices}]))
            w.add_kernels(table([k for k in kernels if k.get("rank", 0) == rank], schema.KERNELS), run_id, rank)
            mine = [s for s in syncs if s.get("rank", 0) == rank]
            if mine:
                w.add("syncs", table(mine, schema.SYNCS))
        w.commit()
    return path


def process_alive(pid: int) -> bool:
    """Whether ``pid`` runs (Linux ``/proc``; a zombie, which a container's init may never reap, does not): for tests
    that kill a parent and check its children are gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


# --- a two-rank trace whose breakdown is known by construction -----------------------------------

BREAKDOWN_EXPECTED = {
    # rank: (comm, exposed, peer_wait, dependent, host_idle, other), ns
    0: (16_000, 16_000, 6_000, 5_000, 3_000, 2_000),
    1: (10_000, 10_000, 0, 5_000, 3_000, 2_000),
}


def breakdown_scenario(path) -> Path:
    """A dataset of two ranks whose exposed communication splits into every part of the breakdown
    (``BREAKDOWN_EXPECTED``, ns), each by construction:

    * instance 0 (``all_reduce``, group ``g``, seq 0): rank 1 computes 10 µs before it, rank 0 only 4 µs,
      so rank 0 waits 6 µs for rank 1 (peer wait); then both ranks' next GEMM waits on an event recorded
      after the all-reduce (ProcessGroupNCCL's pattern, inferred from host order): 5 µs dependent;
    * instance 1: both ranks start together and the host launches the next GEMM only after it ends:
      3 µs host idle;
    * instance 2: the next GEMM was launched before it but waits on a copy on a third stream: 2 µs other.
    """
    kernels, syncs = [], []
    for rank, gemm_a in ((0, 4_000), (1, 10_000)):
        coll = dict(collective="all_reduce", comm_group="g", rank=rank)
        kernels += [
            kernel_row("gemm_a", "compute", 7, 0, gemm_a, launch=0, corr=1, rank=rank),
            kernel_row("ncclDevKernel_AllReduce", "comm", 20, gemm_a, 15_000, launch=1_000, corr=2, comm_seq=0, **coll),
            kernel_row("gemm_b", "compute", 7, 15_100, 20_000, launch=2_000, corr=3, rank=rank),
            kernel_row("ncclDevKernel_AllReduce", "comm", 20, 20_000, 23_000, launch=16_000, corr=4, comm_seq=1, **coll),
            kernel_row("gemm_c", "compute", 7, 24_500, 30_000, launch=24_000, corr=5, rank=rank),
            kernel_row("ncclDevKernel_AllReduce", "comm", 20, 30_000, 32_000, launch=25_000, corr=6, comm_seq=2, **coll),
            kernel_row("Memcpy DtoD", "memory", 30, 30_000, 32_500, launch=26_500, corr=7, category="memcpy", rank=rank),
            kernel_row("gemm_d", "compute", 7, 33_000, 40_000, launch=28_000, corr=8, rank=rank),
        ]
        # ProcessGroupNCCL on the launching thread: record after the all-reduce, wait before the GEMM
        syncs += [dict(sync_row("event_record", 1_100), rank=rank), dict(sync_row("stream_wait_event", 1_200), rank=rank),
                  dict(sync_row("event_record", 27_000), rank=rank), dict(sync_row("stream_wait_event", 27_500), rank=rank)]
    return write_rows_dataset(path, kernels, syncs, ranks=(0, 1), run_id="scenario")
