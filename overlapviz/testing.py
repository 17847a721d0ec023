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
