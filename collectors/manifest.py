"""The run manifest (``overlapviz-run/1``): what was run, on what, with which software, and how it went."""

from __future__ import annotations

import datetime
import json
import os
import platform
import socket
from pathlib import Path

from overlapviz.collectors.config import CollectConfig, run_id as make_run_id

FORMAT = "overlapviz-run/1"
MANIFEST = "manifest.json"
TRACE = "trace_rank{rank}.json.gz"
TIMINGS = "timings_rank{rank}.json"
ERROR = "error_rank{rank}.txt"  # one line, written by a rank that failed; read back by the sweep
LOG = "collect.log"  # the launcher's stdout and stderr
ENV_PREFIXES = ("NCCL_", "TORCH_NCCL_", "RCCL_", "TORCH_DISTRIBUTED_", "CUDA_", "HIP_", "ROCR_", "HSA_", "OMP_NUM_THREADS",
                "SLURM_JOB_ID", "SLURM_NNODES", "SLURM_NTASKS", "GLOO_", "TORCH_CUDA_ARCH_LIST", "PYTORCH_")
STATUSES = ("ok", "failed")


def now_iso() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def environment() -> dict:
    """The environment variables that change how collectives and kernels run (NCCL_*, TORCH_NCCL_*, ...)."""
    env = {k: v for k, v in sorted(os.environ.items()) if k.startswith(ENV_PREFIXES)}
    return {"variables": env, "python": platform.python_version(), "platform": platform.platform()}


def versions() -> dict:
    """torch / CUDA or ROCm / NCCL or RCCL versions of this process (None where absent)."""
    import torch

    nccl = None
    try:
        v = torch.cuda.nccl.version()
        nccl = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
    except Exception:  # CPU builds have no NCCL; torch raises different errors across versions
        nccl = None
    return {
        "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda,
        "hip_version": torch.version.hip,
        "nccl_version": nccl,
    }


def device_row(index: int, ext=None) -> dict:
    """One DEVICES row for GPU ``index``: torch's properties, completed by cudaDeviceGetAttribute via ``ext``."""
    import torch

    p = torch.cuda.get_device_properties(index)
    arch = getattr(p, "gcnArchName", None)
    is_amd = bool(torch.version.hip)
    row = {
        "device": index,
        "name": p.name,
        "vendor": "amd" if is_amd else "nvidia",
        "arch": (arch.split(":")[0] if arch else None) if is_amd else f"sm_{p.major}{p.minor}",
        "compute_major": p.major,
        "compute_minor": p.minor,
        "num_sms": p.multi_processor_count,
        "max_threads_per_sm": getattr(p, "max_threads_per_multi_processor", None),
        "max_threads_per_block": getattr(p, "max_threads_per_block", None),
        "max_blocks_per_sm": None,
        "regs_per_sm": getattr(p, "regs_per_multiprocessor", None),
        "regs_per_block": None,
        "shared_mem_per_sm": getattr(p, "shared_memory_per_multiprocessor", None),
        "shared_mem_per_block": getattr(p, "shared_memory_per_block", None),
        "shared_mem_per_block_optin": getattr(p, "shared_memory_per_block_optin", None),
        "warp_size": getattr(p, "warp_size", None),
        "total_mem_bytes": p.total_memory,
    }
    extra = {}
    if ext is not None:
        attrs = dict(ext.device_attributes(index))
        for key in ("max_blocks_per_sm", "regs_per_block", "max_threads_per_block", "max_threads_per_sm", "regs_per_sm",
                    "shared_mem_per_sm", "shared_mem_per_block", "shared_mem_per_block_optin", "warp_size"):
            if row.get(key) is None and key in attrs:
                row[key] = attrs[key]
        extra = {k: v for k, v in attrs.items() if k not in row}
    if extra:
        row["extra"] = extra  # e.g. reserved_shared_mem_per_block; not a DEVICES column
    return row


def run_record(config: CollectConfig, *, run_id: str | None = None, status: str, error: str | None = None, **known) -> dict:
    """The manifest's ``run`` section: the RUNS columns known for this run.

    ``known`` adds or overrides columns measured at run time (world_size, backend,
    comm_priority_effective, device_name, versions, host, start_time, ...).
    """
    if status not in STATUSES:
        raise ValueError(f"status must be one of {STATUSES}, got {status!r}")
    tiled = config.compute_impl == "tiled"
    record = {
        "run_id": run_id or make_run_id(config),
        "workload": config.workload,
        "setup": config.setup,
        "compute_impl": config.compute_impl,
        "gemm_m": config.gemm_m,
        "gemm_n": config.gemm_n,
        "gemm_k": config.gemm_k,
        "tile_m": config.tile_m if tiled else None,
        "tile_n": config.tile_n if tiled else None,
        "tile_k": config.tile_k if tiled else None,
        "smem_pad_bytes": config.smem_pad_bytes,
        "comm_priority": config.requested_priority,
        "comm_priority_effective": None,
        "collective": config.collective,
        "message_bytes": config.message_bytes,
        "sm_carveout": config.sm_carveout,
        "world_size": None,
        "backend": None if config.backend == "auto" else config.backend,
        "stand_in": config.backend == "stand-in",
        "iterations": config.iterations,
        "warmup_iterations": config.warmup_iterations,
        "device_name": None,
        "torch_version": None,
        "cuda_version": None,
        "hip_version": None,
        "nccl_version": None,
        "host": socket.gethostname(),
        "start_time": None,
        "status": status,
        "error": error,
    }
    record.update(known)
    record["stand_in"] = record["backend"] == "stand-in"
    return record


def manifest(config: CollectConfig, run: dict, *, devices: list | None = None, effective: dict | None = None,
             measurement: dict | None = None, kind_rules: dict | None = None) -> dict:
    out = {
        "format": FORMAT,
        "run": run,
        "config": config.to_dict(),
        "environment": environment(),
        "devices": devices or [],
        "kind_rules": kind_rules,
    }
    if effective is not None:
        out["effective"] = effective  # controls that applied, clamped priorities, kernel facts, checks
    if measurement is not None:
        out["measurement"] = measurement  # per-rank median iteration time and its interval
    return out


def write_json_atomic(path: Path, data: dict) -> None:
    """Write JSON so that a reader sees the old file or the whole new one, never a part."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")
    os.replace(tmp, path)


def write_manifest(run_dir: Path, data: dict) -> Path:
    path = Path(run_dir) / MANIFEST
    write_json_atomic(path, data)
    return path


def read_manifest(run_dir: Path) -> dict | None:
    """The run's manifest, or None when there is none (or it is unreadable: an interrupted write)."""
    try:
        data = json.loads((Path(run_dir) / MANIFEST).read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) and data.get("format") == FORMAT else None


def run_status(run_dir: Path) -> str | None:
    """``ok`` or ``failed`` for a finished run, None for one not run or interrupted."""
    data = read_manifest(run_dir)
    status = (data or {}).get("run", {}).get("status")
    return status if status in STATUSES else None
