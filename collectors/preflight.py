"""Check a whole sweep against this machine before the first run, and list every problem at once.

    python -P -m overlapviz.collectors.preflight --probe     # what the collector's processes would see (JSON)

The machine is probed in a child process started as the runs are (same interpreter,
environment and safe-path mode), so the parent never initializes CUDA. Checked per
configuration: a GPU where one is needed, the backend and enough ranks / GPUs for it,
the collective library in this torch, a compiler for the collector's kernels, shared
memory per block against the device's opt-in limit, green-context and carve-out
support, and GPU (or, for gloo, host) memory for the configuration. With ``--launcher``
the ranks run elsewhere (srun, another node), so the local machine says nothing about
them and the machine checks are skipped.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from dataclasses import dataclass, field

from overlapviz.collectors.config import CollectConfig, run_id as make_run_id
from overlapviz.collectors.launch import child_env, python_command

GIB = 1 << 30
# CUDA context, cuBLAS workspace and the caching allocator's slack, on top of the tensors
GPU_OVERHEAD_BYTES = 768 << 20
_ELEMENT = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass
class Problem:
    """One reason one or more configurations cannot run here."""

    message: str
    run_ids: list[str] = field(default_factory=list)


class SweepNotRunnable(ValueError):
    """Some configurations of a sweep cannot run on this machine; ``problems`` lists why."""

    def __init__(self, problems: list[Problem], total: int):
        self.problems = problems
        self.total = total
        super().__init__(format_problems(problems, total))


# --- the probe (runs in a child) -----------------------------------------------------------


def probe() -> dict:
    """What this process sees: torch, GPUs (limits, free memory), collective backends, compilers, controls."""
    out: dict = {"python": sys.version.split()[0], "cpu_count": os.cpu_count(), "host_mem_available_bytes": _host_available()}
    try:
        import torch
    except ImportError as exc:
        out["torch_error"] = f"torch is not installed ({exc}); pip install 'overlapviz[collect]'"
        return out
    import torch.distributed as dist

    out.update(torch=torch.__version__, cuda=torch.version.cuda, hip=torch.version.hip)
    out["distributed"] = dist.is_available()
    out["gloo"] = bool(dist.is_available() and dist.is_gloo_available())
    out["nccl"] = bool(dist.is_available() and dist.is_nccl_available())
    out["sm_carveout_setter"] = hasattr(torch._C, "_set_sm_carveout_experimental")
    gpus = []
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            try:
                free, total = torch.cuda.mem_get_info(i)
            except Exception:  # a GPU we may not create a context on: its total is still known
                free, total = None, p.total_memory
            gpus.append({"index": i, "name": p.name, "sms": p.multi_processor_count, "total_bytes": total,
                         "free_bytes": free, "smem_per_block_optin": getattr(p, "shared_memory_per_block_optin", None)})
    out["gpus"] = gpus
    out["compiler"] = _compiler(torch)
    out["green_ctx"] = _green_ctx(torch, gpus)
    return out


def _host_available() -> int | None:
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def _compiler(torch) -> dict:
    """Can torch.utils.cpp_extension build the collector's kernels here (nvcc or hipcc, ninja)?"""
    import shutil

    try:
        from torch.utils import cpp_extension
    except Exception as exc:  # noqa: BLE001 - any import failure means no builds
        return {"ok": False, "why": f"torch.utils.cpp_extension does not import ({exc})"}
    home = cpp_extension.ROCM_HOME if torch.version.hip else cpp_extension.CUDA_HOME
    tool = "hipcc" if torch.version.hip else "nvcc"
    found = (os.path.exists(os.path.join(home, "bin", tool)) if home else False) or shutil.which(tool) is not None
    ninja = cpp_extension.is_ninja_available()
    why = []
    if not found:
        why.append(f"no {tool} (CUDA_HOME/ROCM_HOME or PATH)")
    if not ninja:
        why.append("no ninja (pip install ninja)")
    return {"ok": found and ninja, "why": "; ".join(why) or None, "tool": tool}


def _green_ctx(torch, gpus) -> dict:
    if not gpus:
        return {"ok": False, "why": "no GPU"}
    if torch.version.hip:
        return {"ok": False, "why": "green contexts are CUDA only"}
    try:
        import torch.cuda.green_contexts as gcm
    except ImportError:
        return {"ok": False, "why": f"torch {torch.__version__} has no torch.cuda.green_contexts"}
    if getattr(gcm, "SUPPORTED", True) is False:
        return {"ok": False, "why": f"torch {torch.__version__} was built without green context support"}
    try:  # the driver must support them too (CUDA 12.8+ driver): make one
        from overlapviz.collectors.workload import create_green_context

        ctx = create_green_context(gpus[0]["sms"], 0)
        del ctx
    except Exception as exc:  # noqa: BLE001 - whatever the driver or torch says is the reason
        return {"ok": False, "why": f"creating a green context failed: {type(exc).__name__}: {str(exc).strip()[:200]}"}
    return {"ok": True, "why": None}


def probe_machine(env: dict | None = None, timeout_s: float = 180.0) -> dict:
    """Run :func:`probe` in a child started like the collector's ranks; returns its answer."""
    cmd = python_command() + ["-m", "overlapviz.collectors.preflight", "--probe"]
    try:
        done = subprocess.run(cmd, env=child_env(env), capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"probe_error": f"the machine probe did not answer in {timeout_s:g} s"}
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return {"probe_error": f"the machine probe failed: {tail}"}
    return json.loads(lines[-1])


# --- the checks ------------------------------------------------------------------------------


def estimate_gpu_bytes(config: CollectConfig) -> int:
    """About how much GPU memory one rank of ``config`` takes at its peak (the result check included)."""
    m, n, k = config.gemm_m, config.gemm_n, config.gemm_k
    e = _ELEMENT[config.dtype]
    gemm = (m * k + k * n + m * n) * e
    comm = 2 * config.message_bytes  # send + receive (the stand-in's "peer" buffer)
    check = 0
    if config.check:
        if config.compute_impl == "tiled":  # float64 copies of A and B, the reference, C and torch.matmul's C
            check = (m * k + k * n) * 8 + m * n * (8 + 8 + 4 + 8)
        check = max(check, 2 * config.message_bytes)  # the collective's check keeps copies of the message
    return gemm + comm + check + GPU_OVERHEAD_BYTES


def estimate_host_bytes(config: CollectConfig) -> int:
    """About how much host memory one CPU (gloo) rank takes: the tensors and the check's copies."""
    m, n, k = config.gemm_m, config.gemm_n, config.gemm_k
    return (m * k + k * n + m * n) * _ELEMENT[config.dtype] + 3 * config.message_bytes + (256 << 20)


def _gib(x: float) -> str:
    return f"{x / GIB:.1f} GiB"


def problems_for(config: CollectConfig, machine: dict) -> list[str]:
    """Why ``config`` cannot run on ``machine`` (a :func:`probe` answer); empty when it can."""
    from overlapviz.collectors.workload import resolve_backend

    if machine.get("probe_error"):
        return [machine["probe_error"]]
    if machine.get("torch_error"):
        return [machine["torch_error"]]
    out = []
    gpus = machine.get("gpus") or []
    hip = bool(machine.get("hip"))
    where = f"this machine (torch {machine.get('torch')})"
    cpu_hint = ("on a CPU use compute_impl = \"vendor\" with backend = \"gloo\" and nproc >= 2 "
                "(e.g. overlapviz collect --sweep cpu_tour)")
    if config.compute_impl == "tiled" and not gpus:
        out.append(f"compute_impl tiled (our CUDA GEMM) needs a CUDA or ROCm GPU; {where} has none: {cpu_hint}")
    try:
        backend = resolve_backend(config, config.nproc, bool(gpus), hip)
    except RuntimeError as exc:
        msg = str(exc)
        if "WORLD_SIZE" in msg:
            msg = msg.replace(f"(WORLD_SIZE={config.nproc})", f"(nproc = {config.nproc})")
        out.append(msg)
        backend = None
    if backend in ("nccl", "rccl"):
        if not machine.get("nccl"):
            out.append(f"backend nccl: this torch ({machine.get('torch')}) has no NCCL/RCCL")
        if config.nproc > len(gpus):
            out.append(f"nproc = {config.nproc} needs {config.nproc} GPUs (one process per GPU), this machine has "
                       f"{len(gpus)}; on one GPU use backend = \"stand-in\" (single-GPU stand-in, not NCCL)")
    if backend == "gloo" and not machine.get("gloo"):
        out.append(f"backend gloo: this torch ({machine.get('torch')}) has no gloo")
    uses_gpu = backend in ("nccl", "rccl", "stand-in")
    needs_kernels = uses_gpu and (config.compute_impl == "tiled" or backend == "stand-in")
    compiler = machine.get("compiler") or {}
    if needs_kernels and gpus and not compiler.get("ok", False):
        out.append(f"the collector's CUDA/HIP kernels (tiled GEMM, stand-in) are built on first use and need "
                   f"{compiler.get('why') or 'a compiler'}")
    if not gpus:
        for name, value in (("green_ctx_sms", config.green_ctx_sms), ("cuda_max_connections", config.cuda_max_connections),
                            ("smem_carveout_percent", config.smem_carveout_percent)):
            if value is not None:
                out.append(f"{name}: a GPU control; {where} has no GPU")
        if config.sm_carveout is not None:
            out.append(f"sm_carveout: a cuBLAS control; {where} has no GPU")
    if uses_gpu and gpus:
        used = gpus[: max(1, config.nproc)]
        optin = min((g["smem_per_block_optin"] or 0) for g in used)
        if config.compute_impl == "tiled" and optin:
            smem = (config.tile_m * config.tile_k + config.tile_k * config.tile_n) * 4 + config.smem_pad_bytes
            if smem > optin:
                out.append(f"smem_pad_bytes: {config.smem_pad_bytes} bytes of padding + the {config.tile_m}x{config.tile_n}x"
                           f"{config.tile_k} tiles make {smem} bytes of shared memory per block, above the {used[0]['name']}'s "
                           f"opt-in limit of {optin}")
        if backend == "stand-in" and optin and config.standin_smem_bytes > optin:
            out.append(f"standin_smem_bytes: {config.standin_smem_bytes} is above the {used[0]['name']}'s opt-in limit of {optin}")
        need = estimate_gpu_bytes(config)
        frees = [g["free_bytes"] if g["free_bytes"] is not None else g["total_bytes"] for g in used]
        if need > min(frees):
            g = used[frees.index(min(frees))]
            out.append(f"memory: about {_gib(need)} of GPU memory per rank (GEMM {config.gemm_m}x{config.gemm_n}x"
                       f"{config.gemm_k} {config.dtype}, message {config.message_bytes >> 20} MiB, result checks), "
                       f"GPU {g['index']} ({g['name']}) has {_gib(min(frees))} free")
        sms = min(g["sms"] for g in used)
        if config.green_ctx_sms is not None:
            gc = machine.get("green_ctx") or {}
            if not gc.get("ok"):
                out.append(f"green_ctx_sms: {gc.get('why') or 'green contexts are not available here'}")
            elif config.green_ctx_sms > sms:
                out.append(f"green_ctx_sms: {config.green_ctx_sms} SMs asked for, the {used[0]['name']} has {sms}")
        if config.sm_carveout is not None:
            if not machine.get("sm_carveout_setter"):
                out.append(f"sm_carveout: this torch ({machine.get('torch')}) has no torch._C._set_sm_carveout_experimental")
            elif config.sm_carveout >= sms:
                out.append(f"sm_carveout: {config.sm_carveout} SMs left free of {sms} leaves none for the GEMM")
    if backend == "gloo":
        need = estimate_host_bytes(config) * config.nproc
        avail = machine.get("host_mem_available_bytes")
        if avail and need > avail:
            out.append(f"memory: about {_gib(need)} of host memory for {config.nproc} gloo processes, {_gib(avail)} available")
    return out


def check_configs(configs, machine: dict) -> list[Problem]:
    """Every problem of every configuration, grouped by message (first seen first)."""
    grouped: dict[str, Problem] = {}
    for cfg in configs:
        for msg in problems_for(cfg, machine):
            grouped.setdefault(msg, Problem(msg)).run_ids.append(make_run_id(cfg))
    return list(grouped.values())


def format_problems(problems: list[Problem], total: int) -> str:
    """One paragraph per problem: the message, how many configurations it stops, and which."""
    bad = len({r for p in problems for r in p.run_ids})
    lines = [f"{bad} of {total} configurations cannot run on this machine; nothing was run:"]
    for p in problems:
        ids = p.run_ids[:3] + ([f"and {len(p.run_ids) - 3} more"] if len(p.run_ids) > 3 else [])
        lines.append(f"  - {p.message} [{len(p.run_ids)} configuration{'s' if len(p.run_ids) != 1 else ''}: "
                     f"{', '.join(ids)}]")
    lines.append("Change the sweep (or the options), or pass --no-check to run anyway (each such run is recorded as failed).")
    return "\n".join(lines)


def require_runnable(configs, *, env: dict | None = None, launcher: str | None = None, total: int | None = None,
                     machine: dict | None = None) -> dict | None:
    """Probe this machine and raise :class:`SweepNotRunnable` listing every problem of ``configs``.

    Skipped (returns None) when ``launcher`` is given: the ranks run where it puts them.
    Returns the probe's answer.
    """
    if launcher:
        return None
    configs = list(configs)
    machine = machine if machine is not None else probe_machine(env)
    problems = check_configs(configs, machine)
    if problems:
        raise SweepNotRunnable(problems, total if total is not None else len(configs))
    return machine


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -P -m overlapviz.collectors.preflight", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--probe", action="store_true", help="print what this process sees, as one JSON line")
    args = p.parse_args(argv)
    if args.probe:
        print(json.dumps(probe(), default=str))
        return 0
    p.print_help()
    return 0


if __name__ == "__main__":
    sys.exit(main())
