"""One experiment configuration: a validated keyword-only dataclass, its presets, and its run id."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import typing
from dataclasses import dataclass, field
from typing import Any, Callable

WORKLOADS = {  # workload -> (GEMM kind, collective)
    "cb-ar": ("compute-bound", "all_reduce"),
    "mb-ar": ("memory-bound", "all_reduce"),
    "cb-a2a": ("compute-bound", "all_to_all"),
    "mb-a2a": ("memory-bound", "all_to_all"),
}
SETUPS = ("sequential", "baseline", "optimized")
COMPUTE_IMPLS = ("tiled", "vendor")
BACKENDS = ("auto", "nccl", "gloo", "stand-in")
TILES = ((64, 64, 32), (64, 64, 64), (128, 128, 32))  # built into collectors/ovz_kernels.cu
DTYPES = ("float32", "bfloat16", "float16")
LAUNCH_ORDERS = ("compute-first", "comm-first")
PROFILERS = ("torch", "none")
# Requested priority of the optimized setup's comm stream when none is given: far below any
# device's range, so torch clamps it to the highest priority there is (-3 on an H200 with
# torch 2.11, -1 on older CUDA); the manifest records the clamped value.
HIGHEST_PRIORITY = -128


# fields added after sample_traces/ was first recorded; written into manifests only when set
ADDED_FIELDS = ("green_ctx_sms", "cuda_max_connections")


def _help(text: str, default: Any) -> Any:
    return field(default=default, metadata={"help": text})


@dataclass(kw_only=True, frozen=True)
class CollectConfig:
    """One configuration of the overlap experiment (one run directory).

    Every field carries its help text in ``metadata["help"]``; the CLI options, the docs
    and the manifest are generated from the fields, so a field documented here is a knob
    everywhere.
    """

    workload: str = _help("cb-ar | mb-ar | cb-a2a | mb-a2a: compute- or memory-bound GEMM with all-reduce or all-to-all", "cb-ar")
    setup: str = _help("sequential (comm after compute, one stream) | baseline (two streams + events) | optimized (comm on a high-priority stream)", "baseline")
    compute_impl: str = _help("tiled (our CUDA GEMM, shapeable) | vendor (torch.matmul / cuBLAS / hipBLASLt)", "tiled")
    gemm_m: int = _help("GEMM rows of A and C", 4096)
    gemm_n: int = _help("GEMM columns of B and C", 4096)
    gemm_k: int = _help("GEMM inner dimension", 4096)
    dtype: str = _help("GEMM element type; the tiled GEMM is float32 only", "float32")
    tile_m: int = _help("tiled GEMM: rows of C per block (tiles built: 64x64x32, 64x64x64, 128x128x32)", 64)
    tile_n: int = _help("tiled GEMM: columns of C per block", 64)
    tile_k: int = _help("tiled GEMM: depth of one shared-memory stage", 32)
    smem_pad_bytes: int = _help("occupancy shaping: extra dynamic shared memory per GEMM block, unused, so fewer blocks fit per SM (tiled only)", 0)
    smem_carveout_percent: typing.Optional[int] = _help("preferred shared-memory share of the SM's L1/shared split for our GEMM and stand-in kernels (0-100, cudaFuncAttributePreferredSharedMemoryCarveout); None: the driver's choice", None)
    comm_priority: typing.Optional[int] = _help("requested priority of the comm stream (lower = higher); None: 0, or the highest for optimized", None)
    message_bytes: int = _help("bytes of the collective's buffer per rank (the paper used 896 MiB)", 64 << 20)
    sm_carveout: typing.Optional[int] = _help("vendor GEMM: SMs left free for communication, via torch._C._set_sm_carveout_experimental where this torch has it", None)
    green_ctx_sms: typing.Optional[int] = _help("overlapped setups, CUDA: run the GEMM on a green context of this many SMs (torch.cuda.green_contexts), leaving the rest to the collective; the driver may round it up (the manifest records the SMs granted); None: all SMs", None)
    cuda_max_connections: typing.Optional[int] = _help("CUDA_DEVICE_MAX_CONNECTIONS (1-32) for the run's processes: hardware work queues shared by all streams (1 = launch order is dispatch order); None: inherited from the environment", None)
    backend: str = _help("auto (nccl/rccl for 2+ GPUs, stand-in on one GPU, gloo on CPU) | nccl | gloo | stand-in", "auto")
    standin_ranks: int = _help("stand-in: ranks of the ring it plays, for the bytes it moves (all-reduce: 2(n-1)/n x message)", 8)
    standin_ctas: int = _help("stand-in: CTAs (like NCCL channels)", 16)
    standin_threads: int = _help("stand-in: threads per CTA (NCCL uses 512-640)", 512)
    standin_smem_bytes: int = _help("stand-in: dynamic shared memory per CTA (NCCL-like, about 23 KB)", 23 * 1024)
    standin_link_gbps: float = _help("stand-in: pace the bytes to this link bandwidth in GB/s, so the kernel stays resident as long as a link-bound collective; 0 = unpaced", 0.0)
    launch_order: str = _help("compute-first | comm-first: which of the two is launched first in the overlapped setups (GPU)", "compute-first")
    iterations: int = _help("timed iterations (CUDA events); the first third are warm-up and discarded", 30)
    trace_iterations: int = _help("iterations in the separate traced pass (torch.profiler)", 5)
    nproc: int = _help("processes (one per GPU) the local launcher starts; torchrun/SLURM may override through WORLD_SIZE", 1)
    timeout_s: float = _help("seconds before a configuration is killed and recorded as failed (timeout)", 600.0)
    profiler: str = _help("torch (torch.profiler writes trace_rank<N>.json.gz) | none (no torch.profiler: for running under rocprofv3 or nsys, whose output is ingested instead)", "torch")
    check: bool = _help("check the tiled GEMM against torch.matmul and the collective's result before timing", True)
    seed: int = _help("random seed of the inputs", 0)

    def __post_init__(self) -> None:
        def bad(name: str, why: str) -> ValueError:
            return ValueError(f"{name}: {why} (got {getattr(self, name)!r})")

        for name, allowed in (
            ("workload", tuple(WORKLOADS)),
            ("setup", SETUPS),
            ("compute_impl", COMPUTE_IMPLS),
            ("backend", BACKENDS),
            ("dtype", DTYPES),
            ("launch_order", LAUNCH_ORDERS),
            ("profiler", PROFILERS),
        ):
            if getattr(self, name) not in allowed:
                raise bad(name, f"must be one of {', '.join(allowed)}")
        for name in ("gemm_m", "gemm_n", "gemm_k", "message_bytes", "iterations", "trace_iterations", "nproc"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise bad(name, "must be a positive integer")
        if self.iterations < 3:
            raise bad("iterations", "needs at least 3 (the first third is warm-up)")
        if self.message_bytes % 16:
            raise bad("message_bytes", "must be a multiple of 16")
        if self.smem_pad_bytes < 0:
            raise bad("smem_pad_bytes", "must be >= 0")
        if self.smem_carveout_percent is not None and not 0 <= self.smem_carveout_percent <= 100:
            raise bad("smem_carveout_percent", "must be in [0, 100]")
        if self.timeout_s <= 0:
            raise bad("timeout_s", "must be > 0")
        if self.compute_impl == "tiled":
            if (self.tile_m, self.tile_n, self.tile_k) not in TILES:
                built = ", ".join("x".join(map(str, t)) for t in TILES)
                raise bad("tile_m", f"tile {self.tile_m}x{self.tile_n}x{self.tile_k} is not built; built: {built}")
            if self.dtype != "float32":
                raise bad("dtype", "the tiled GEMM is float32 only")
            if self.sm_carveout is not None:
                raise bad("sm_carveout", "applies to the vendor GEMM only (compute_impl='vendor')")
        else:
            if self.smem_pad_bytes:
                raise bad("smem_pad_bytes", "shaping needs our tiled GEMM (compute_impl='tiled'); the vendor GEMM cannot be padded")
            if self.sm_carveout is not None and self.sm_carveout < 0:
                raise bad("sm_carveout", "must be >= 0")
        if self.green_ctx_sms is not None:
            if self.green_ctx_sms < 1:
                raise bad("green_ctx_sms", "must be >= 1")
            if self.setup == "sequential":
                raise bad("green_ctx_sms", "a green context splits SMs between the GEMM and the collective running beside it; "
                                           "sequential runs them one after the other (use baseline or optimized)")
        if self.cuda_max_connections is not None and not 1 <= self.cuda_max_connections <= 32:
            raise bad("cuda_max_connections", "must be in [1, 32] (CUDA_DEVICE_MAX_CONNECTIONS)")
        if self.setup == "sequential" and self.comm_priority not in (None, 0):
            raise bad("comm_priority", "sequential runs comm on the compute stream; it has no priority of its own")
        if self.setup == "baseline" and self.comm_priority is not None and self.comm_priority < 0:
            raise bad("comm_priority", "a high (negative) priority is the optimized setup; use setup='optimized'")
        if self.setup == "optimized" and self.comm_priority is not None and self.comm_priority >= 0:
            raise bad("comm_priority", "the optimized setup needs a high (negative) comm priority")
        if self.backend == "stand-in" and self.nproc != 1:
            raise bad("nproc", "the stand-in plays one rank on one GPU; use nproc=1")
        if self.standin_ranks < 2:
            raise bad("standin_ranks", "must be >= 2")
        if not (64 <= self.standin_threads <= 640 and self.standin_threads % 32 == 0):
            raise bad("standin_threads", "must be a multiple of 32 in [64, 640]")
        if self.standin_ctas < 1:
            raise bad("standin_ctas", "must be >= 1")
        if self.standin_smem_bytes < 16 * self.standin_threads:
            raise bad("standin_smem_bytes", "must hold 16 bytes per stand-in thread")
        if self.standin_link_gbps < 0:
            raise bad("standin_link_gbps", "must be >= 0")

    # -- derived ---------------------------------------------------------------------
    @property
    def collective(self) -> str:
        return WORKLOADS[self.workload][1]

    @property
    def warmup_iterations(self) -> int:
        """The first third of the timed iterations, discarded as warm-up."""
        return self.iterations // 3

    @property
    def single_process(self) -> bool:
        """One process runs it (the stand-in, or one GPU): a sweep may run several such in one process."""
        return self.nproc == 1

    @property
    def requested_priority(self) -> int:
        """The comm stream priority asked for (before torch clamps it to the device's range)."""
        if self.comm_priority is not None:
            return self.comm_priority
        return HIGHEST_PRIORITY if self.setup == "optimized" else 0

    def to_dict(self) -> dict:
        """The fields as a dict; the fields added after the first recordings (``ADDED_FIELDS``) only when set.

        So a configuration recorded before those fields existed reads back equal to the same
        configuration today (``from_dict`` fills them with their defaults).
        """
        out = dataclasses.asdict(self)
        for name in ADDED_FIELDS:
            if out[name] is None:
                del out[name]
        return out

    def replace(self, **changes: Any) -> "CollectConfig":
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_dict(cls, data: dict, *, where: str = "config") -> "CollectConfig":
        """Build a config from a mapping (JSON, TOML), rejecting unknown keys and wrong types.

        Raises
        ------
        ValueError
            Naming ``where`` and the offending key.
        """
        known = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - set(known))
        if unknown:
            raise ValueError(f"{where}: unknown key {unknown[0]!r}; known: {', '.join(known)}")
        values = {k: coerce(k, v, where=where) for k, v in data.items()}
        try:
            return cls(**values)
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None


def field_types() -> dict[str, type]:
    """Each field's base type (int, float, str, bool), Optional unwrapped."""
    hints = typing.get_type_hints(CollectConfig)
    out = {}
    for f in dataclasses.fields(CollectConfig):
        t = hints[f.name]
        args = [a for a in typing.get_args(t) if a is not type(None)]
        out[f.name] = args[0] if args else t
    return out


def is_optional(name: str) -> bool:
    t = typing.get_type_hints(CollectConfig)[name]
    return type(None) in typing.get_args(t)


def coerce(name: str, value: Any, *, where: str = "config") -> Any:
    """Convert ``value`` (also a CLI string) to field ``name``'s type.

    Raises
    ------
    ValueError
        If it cannot, naming ``where`` and the field.
    """
    types = field_types()
    if name not in types:
        raise ValueError(f"{where}: unknown key {name!r}")
    t = types[name]
    if value is None or (isinstance(value, str) and value.lower() in ("none", "null", "")):
        if is_optional(name):
            return None
        raise ValueError(f"{where}: {name} cannot be empty")
    try:
        if t is bool:
            if isinstance(value, str):
                if value.lower() in ("1", "true", "yes", "on"):
                    return True
                if value.lower() in ("0", "false", "no", "off"):
                    return False
                raise ValueError(value)
            if not isinstance(value, bool):
                raise ValueError(value)
            return value
        if t is int:
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise ValueError(value)
            return int(value)
        if t is float:
            if isinstance(value, bool):
                raise ValueError(value)
            return float(value)
        return str(value)
    except (TypeError, ValueError):
        raise ValueError(f"{where}: {name} must be {t.__name__}, got {value!r}") from None


def run_id(config: CollectConfig) -> str:
    """A readable id that is a function of the whole configuration (so a sweep can resume).

    The readable part names the knobs a reader compares; the hash covers every field set
    away from its default, so adding a field (with a default) keeps existing ids, and a
    resumed sweep still finds its runs.
    """
    defaults = dataclasses.asdict(CollectConfig())
    changed = {k: v for k, v in dataclasses.asdict(config).items() if v != defaults[k]}
    digest = hashlib.sha1(json.dumps(changed, sort_keys=True).encode()).hexdigest()[:8]
    gemm = (
        f"tiled{config.tile_m}x{config.tile_n}x{config.tile_k}-pad{config.smem_pad_bytes // 1024}k"
        if config.compute_impl == "tiled"
        else f"vendor-{config.dtype}" + (f"-carve{config.sm_carveout}" if config.sm_carveout is not None else "")
    )
    prio = f"p{config.requested_priority}" if config.requested_priority != HIGHEST_PRIORITY else "phigh"
    backend = "standin" if config.backend == "stand-in" else config.backend
    controls = "".join(
        part for part in (
            f"-smemcarve{config.smem_carveout_percent}" if config.smem_carveout_percent is not None else "",
            f"-gc{config.green_ctx_sms}" if config.green_ctx_sms is not None else "",
            f"-conn{config.cuda_max_connections}" if config.cuda_max_connections is not None else "",
            "-commfirst" if config.launch_order == "comm-first" else "",
        )
    )
    return f"{config.workload}_{config.setup}_{gemm}{controls}_{prio}_{backend}_{digest}"


# --- presets: functions returning a full config; variants call a base and change fields ---


def cb_ar() -> CollectConfig:
    """The paper's compute-bound GEMM + all-reduce, paper-sized message (896 MiB)."""
    return CollectConfig(workload="cb-ar", gemm_m=8192, gemm_n=8192, gemm_k=8192, message_bytes=896 << 20)


def mb_ar() -> CollectConfig:
    """Memory-bound GEMM (K=8: about 4 FLOP per byte in fp32, output-write bound) + all-reduce."""
    return cb_ar().replace(workload="mb-ar", gemm_m=16384, gemm_n=16384, gemm_k=8)


def cb_a2a() -> CollectConfig:
    return cb_ar().replace(workload="cb-a2a")


def mb_a2a() -> CollectConfig:
    return mb_ar().replace(workload="mb-a2a")


def cb_ar_small() -> CollectConfig:
    """A few milliseconds per iteration: for quick checks and sample traces."""
    return cb_ar().replace(gemm_m=2048, gemm_n=2048, gemm_k=2048, message_bytes=64 << 20, iterations=30, trace_iterations=3)


def mb_ar_small() -> CollectConfig:
    return cb_ar_small().replace(workload="mb-ar", gemm_m=8192, gemm_n=8192, gemm_k=8)


def cb_a2a_small() -> CollectConfig:
    return cb_ar_small().replace(workload="cb-a2a")


def mb_a2a_small() -> CollectConfig:
    return mb_ar_small().replace(workload="mb-a2a")


def cb_ar_standin() -> CollectConfig:
    """One GPU: the tiled GEMM beside the stand-in all-reduce (not NCCL), paced like a link."""
    return cb_ar_small().replace(backend="stand-in", standin_link_gbps=200.0)


def mb_ar_standin() -> CollectConfig:
    return cb_ar_standin().replace(workload="mb-ar", gemm_m=8192, gemm_n=8192, gemm_k=8)


def cb_a2a_standin() -> CollectConfig:
    return cb_ar_standin().replace(workload="cb-a2a")


def mb_a2a_standin() -> CollectConfig:
    return mb_ar_standin().replace(workload="mb-a2a")


def gloo_smoke() -> CollectConfig:
    """CPU only: two gloo processes, tiny sizes, so the whole path runs in CI in seconds."""
    return CollectConfig(
        workload="cb-ar",
        compute_impl="vendor",
        backend="gloo",
        nproc=2,
        gemm_m=128,
        gemm_n=128,
        gemm_k=128,
        message_bytes=1 << 16,
        iterations=6,
        trace_iterations=2,
        timeout_s=120.0,
    )


PRESETS: dict[str, Callable[[], CollectConfig]] = {
    f.__name__: f
    for f in (cb_ar, mb_ar, cb_a2a, mb_a2a, cb_ar_small, mb_ar_small, cb_a2a_small, mb_a2a_small,
              cb_ar_standin, mb_ar_standin, cb_a2a_standin, mb_a2a_standin, gloo_smoke)
}


def preset(name: str) -> CollectConfig:
    """The preset called ``name`` (dashes or underscores).

    Raises
    ------
    ValueError
        If there is none, listing the presets.
    """
    fn = PRESETS.get(name.replace("-", "_"))
    if fn is None:
        raise ValueError(f"preset {name!r} does not exist; presets: {', '.join(PRESETS)}")
    return fn()
