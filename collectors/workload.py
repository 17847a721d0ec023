"""The experiment on one rank: a GEMM and a collective in one of the paper's three setups.

GPU (one process per GPU):
  sequential  GEMM, then the collective, on one stream.
  baseline    the GEMM on a compute stream and the collective on a comm stream of the same
              priority; both wait on an event of the main stream and the main stream waits
              on both (two streams + events).
  optimized   baseline with the comm stream at high priority (for NCCL/RCCL the process
              group's own stream, through ProcessGroupNCCL.Options(is_high_priority_stream)).
CPU (gloo): sequential runs the collective after the GEMM; the overlapped setups issue
  the collective asynchronously (gloo's worker thread) and run the GEMM meanwhile;
  stream priorities do not exist there and are recorded as not applied.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass, field

from overlapviz.collectors.config import CollectConfig


@dataclass
class Dist:
    """Where this process runs: rank, world, the resolved backend and the device."""

    rank: int
    world_size: int
    local_rank: int
    backend: str  # nccl | rccl | gloo | stand-in
    device: "object"  # torch.device
    initialized: bool  # a torch.distributed process group exists
    notes: dict = field(default_factory=dict)

    @property
    def is_cuda(self) -> bool:
        return self.device.type == "cuda"


def resolve_backend(config: CollectConfig, world_size: int, cuda: bool, hip: bool) -> str:
    """The backend ``auto`` stands for here; ``nccl`` is reported as ``rccl`` on ROCm.

    Raises
    ------
    RuntimeError
        If the backend cannot run with this world size or without a GPU.
    """
    backend = config.backend
    if backend == "auto":
        backend = ("nccl" if world_size > 1 else "stand-in") if cuda else "gloo"
    if backend in ("nccl", "gloo") and world_size < 2:
        raise RuntimeError(
            f"backend {backend} needs 2+ ranks (WORLD_SIZE={world_size}); on one GPU use backend stand-in, "
            "on CPU launch 2+ gloo processes (nproc=2)"
        )
    if backend == "stand-in" and world_size != 1:
        raise RuntimeError(f"the stand-in plays one rank on one GPU; WORLD_SIZE is {world_size}")
    if backend in ("nccl", "stand-in") and not cuda:
        raise RuntimeError(f"backend {backend} needs a CUDA or ROCm GPU; none is visible (use backend gloo on CPU)")
    if backend == "nccl" and hip:
        backend = "rccl"
    return backend


_UNSET = object()
# CUDA_DEVICE_MAX_CONNECTIONS as it was when this process created its CUDA context (read once, then)
_CONNECTIONS_AT_CUDA_INIT: object = _UNSET


def apply_max_connections(config: CollectConfig) -> dict:
    """Set CUDA_DEVICE_MAX_CONNECTIONS as ``config`` asks, before this process initializes CUDA.

    The driver reads the variable once, when the process creates its CUDA context; a
    sweep therefore starts a new process for each value. Returns what the manifest
    records: requested, effective (the value when CUDA was initialized; None = unset,
    the driver's default) and a note.

    Raises
    ------
    RuntimeError
        If CUDA was already initialized here with another value.
    """
    global _CONNECTIONS_AT_CUDA_INIT
    import torch

    from overlapviz.collectors.launch import MAX_CONNECTIONS_ENV

    want = config.cuda_max_connections
    initialized = torch.cuda.is_initialized()
    if _CONNECTIONS_AT_CUDA_INIT is _UNSET:
        if want is not None and not initialized:
            os.environ[MAX_CONNECTIONS_ENV] = str(want)
        # CUDA initialized before the collector looked (an embedding program): the environment
        # then is the best evidence there is
        _CONNECTIONS_AT_CUDA_INIT = os.environ.get(MAX_CONNECTIONS_ENV)
    have = _CONNECTIONS_AT_CUDA_INIT
    if want is not None and have != str(want):
        raise RuntimeError(
            f"cuda_max_connections: {want} asked for, but this process created its CUDA context with "
            f"{MAX_CONNECTIONS_ENV}={have if have is not None else 'unset'}; the driver reads it once per process "
            "(overlapviz collect starts a process per value)"
        )
    try:
        effective = int(have) if have is not None else None
    except ValueError:
        effective = None
    note = (f"{MAX_CONNECTIONS_ENV}={have} when this process created its CUDA context" if have is not None
            else f"{MAX_CONNECTIONS_ENV} unset: the driver's default (8 work queues)")
    return {"requested": want, "effective": effective, "applied": want is not None, "note": note}


def init_dist(config: CollectConfig) -> Dist:
    """Read torchrun's environment and create the process group (none for the stand-in)."""
    import torch
    import torch.distributed as dist

    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    connections = apply_max_connections(config)  # before anything creates the CUDA context
    cuda = torch.cuda.is_available()
    backend = resolve_backend(config, world, cuda, bool(torch.version.hip))
    notes: dict = {"cuda_max_connections": connections}
    if backend in ("nccl", "rccl", "stand-in"):
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
    else:
        device = torch.device("cpu")
        # two gloo ranks on a few cores: split them instead of oversubscribing
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ.get("LOCAL_WORLD_SIZE", world))))
    timeout = datetime.timedelta(seconds=config.timeout_s)
    if backend in ("nccl", "rccl"):
        options = dist.ProcessGroupNCCL.Options()
        options.is_high_priority_stream = config.setup == "optimized"
        notes["is_high_priority_stream"] = options.is_high_priority_stream
        dist.init_process_group("nccl", pg_options=options, device_id=device, timeout=timeout)
    elif backend == "gloo":
        dist.init_process_group("gloo", timeout=timeout)
    return Dist(rank, world, local, backend, device, backend != "stand-in", notes)


def create_green_context(num_sms: int, device_index: int):
    """A ``torch.cuda.green_contexts.GreenContext`` of ``num_sms`` SMs, through whichever API this torch has.

    torch 2.9-2.13: ``GreenContext.create(num_sms, device_id)``; later: ``GreenContext(num_sms=..., device_id=...)``.
    """
    import torch.cuda.green_contexts as gcm

    GC = gcm.GreenContext
    if hasattr(GC, "create"):
        try:
            return GC.create(num_sms=num_sms, device_id=device_index)
        except TypeError:
            return GC.create(num_sms, device_index)
    return GC(num_sms=num_sms, device_id=device_index)


def _dtype(name: str):
    import torch

    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


class Workload:
    """Buffers, streams and one iteration (``step``) of one configuration on one rank."""

    def __init__(self, config: CollectConfig, where: Dist):
        import torch

        self.config = config
        self.dist = where
        self.ext = None
        self.effective: dict = {}
        gen = torch.Generator(device=where.device).manual_seed(config.seed + where.rank)
        dtype = _dtype(config.dtype)
        dev = where.device
        self.a = torch.randn(config.gemm_m, config.gemm_k, device=dev, dtype=dtype, generator=gen)
        self.b = torch.randn(config.gemm_k, config.gemm_n, device=dev, dtype=dtype, generator=gen)
        self.c = torch.empty(config.gemm_m, config.gemm_n, device=dev, dtype=dtype)
        numel = config.message_bytes // 4
        if config.collective == "all_to_all" and where.backend != "stand-in" and numel % where.world_size:
            raise ValueError(f"message_bytes: {config.message_bytes} is not divisible into {where.world_size} float32 chunks")
        self.send = torch.randn(numel, device=dev, generator=gen)
        self.recv = torch.empty_like(self.send)  # all-to-all output; the stand-in's "peer" bytes
        if where.backend == "stand-in":
            self.recv.copy_(torch.randn(numel, device=dev, generator=gen))
        if where.is_cuda:
            from overlapviz.collectors import extension

            self.ext = extension.load()
        self._setup_streams()
        self._setup_controls()

    # -- controls ------------------------------------------------------------------------
    def _setup_streams(self) -> None:
        import torch

        cfg = self.config
        eff = self.effective
        eff["comm_priority_requested"] = cfg.requested_priority
        if not self.dist.is_cuda:
            if cfg.green_ctx_sms is not None:
                raise RuntimeError("green_ctx_sms: green contexts need a CUDA GPU")
            eff["comm_priority_effective"] = None
            eff["priority_applied"] = False
            eff["priority_note"] = "gloo runs on CPU threads: stream priorities do not exist"
            return
        self.main = torch.cuda.current_stream()
        low, high = torch.cuda.Stream.priority_range()
        eff["priority_range"] = [low, high]
        # "the highest there is" is recorded as this device's highest, not the sentinel asked for
        requested = high if cfg.comm_priority is None and cfg.setup == "optimized" else cfg.requested_priority
        eff["comm_priority_requested"] = requested
        if cfg.setup == "sequential":
            self.compute_stream = self.comm_stream = self.main
            eff["comm_priority_effective"] = self.main.priority
            eff["priority_applied"] = False
            return
        self.compute_stream = torch.cuda.Stream(priority=0)
        self.comm_stream = torch.cuda.Stream(priority=requested)  # torch clamps to its range
        if cfg.green_ctx_sms is not None:
            self._setup_green_context()
        eff["compute_priority_effective"] = self.compute_stream.priority
        if self.dist.backend in ("nccl", "rccl"):
            # the collective runs on the process group's internal stream; with
            # is_high_priority_stream torch takes it from its highest-priority pool
            eff["comm_priority_effective"] = high if self.dist.notes.get("is_high_priority_stream") else 0
            eff["comm_stream"] = "ProcessGroupNCCL internal stream"
        else:
            eff["comm_priority_effective"] = self.comm_stream.priority
            eff["comm_stream"] = "collector comm stream"
        eff["priority_applied"] = cfg.setup == "optimized"

    def _setup_green_context(self) -> None:
        """Put the GEMM on a green context of ``green_ctx_sms`` SMs (torch.cuda.green_contexts).

        Two ways, by what this torch offers: the green context's own stream
        (``GreenContext.Stream()``, torch >= 2.10), else making the green context current
        around each GEMM launch (``set_context``/``pop_context``, ``make_current``/``pop_current``).
        The SMs granted are measured: a probe kernel whose blocks record their SM id runs
        where the GEMM runs. Where the stream way fails (a driver that refuses events across
        contexts), the context way is taken and the manifest says so.
        """
        import torch

        cfg, eff = self.config, self.effective
        rec = {"requested": cfg.green_ctx_sms, "effective": None, "applied": False}
        eff["green_ctx"] = rec
        try:
            import torch.cuda.green_contexts as gcm
        except ImportError:
            raise RuntimeError(f"green_ctx_sms: torch {torch.__version__} has no torch.cuda.green_contexts") from None
        if getattr(gcm, "SUPPORTED", True) is False:
            raise RuntimeError(f"green_ctx_sms: torch {torch.__version__} was built without green context support")
        ctx = create_green_context(cfg.green_ctx_sms, self.dist.device.index or 0)
        self._green = ctx
        modes = []
        if hasattr(ctx, "Stream") and os.environ.get("OVZ_GREEN_CTX_MODE", "stream") == "stream":
            modes.append("stream")
        modes.append("context")
        errors = []
        for mode in modes:
            try:
                if mode == "stream":
                    self._green_stream = ctx.Stream()
                    self._green_push = None
                else:
                    push = getattr(ctx, "set_context", None) or getattr(ctx, "make_current")
                    pop = getattr(ctx, "pop_context", None) or getattr(ctx, "pop_current")
                    self._green_stream = None
                    self._green_push = (push, pop)
                granted = self._probe_green_sms()
            except (RuntimeError, AttributeError) as exc:
                errors.append(f"{mode}: {type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}")
                torch.cuda.synchronize(self.dist.device)
                continue
            if self._green_stream is not None:
                self.compute_stream = self._green_stream
            rec.update(effective=granted, applied=True,
                       mode="GreenContext.Stream()" if mode == "stream" else "context pushed around each GEMM launch")
            if errors:
                rec["note"] = "; ".join(errors)
            return
        raise RuntimeError(f"green_ctx_sms: no way to run the GEMM on the green context worked ({'; '.join(errors)})")

    def _probe_green_sms(self) -> int:
        """How many SMs work placed where the GEMM runs can reach (distinct SM ids of a probe grid).

        It also checks what the run relies on: an event recorded there, waited on by the
        main stream.
        """
        import torch

        sms = torch.cuda.get_device_properties(self.dist.device).multi_processor_count

        def launch():
            ids = self.ext.probe_sms(4 * sms, 20_000)
            done = torch.cuda.Event()
            done.record()
            return ids, done

        with torch.cuda.stream(self.compute_stream):
            ids, done = self._on_green(launch)
        self.main.wait_event(done)
        torch.cuda.synchronize(self.dist.device)
        return int(torch.unique(ids).numel())

    def _on_green(self, fn):
        """Run ``fn`` (a launch on the current stream) where the GEMM runs: its green context when pushed."""
        if getattr(self, "_green_push", None) is None:
            if getattr(self, "_green_stream", None) is not None:
                import torch

                with torch.cuda.stream(self._green_stream):
                    return fn()
            return fn()
        push, pop = self._green_push
        push()
        try:
            return fn()
        finally:
            pop()

    def _setup_controls(self) -> None:
        import torch

        cfg = self.config
        eff = self.effective
        eff["shaping_applied"] = cfg.compute_impl == "tiled" and cfg.smem_pad_bytes > 0
        eff["sm_carveout_applied"] = False
        if cfg.compute_impl == "vendor" and cfg.sm_carveout is not None:
            setter = getattr(torch._C, "_set_sm_carveout_experimental", None)
            if setter is None or not self.dist.is_cuda:
                eff["sm_carveout_note"] = (
                    "this torch has no torch._C._set_sm_carveout_experimental" if setter is None else "no GPU"
                )
            else:
                setter(cfg.sm_carveout)
                eff["sm_carveout_applied"] = True
                getter = getattr(torch._C, "_get_sm_carveout_experimental", None)
                if getter is not None:
                    eff["sm_carveout_effective"] = getter()
        if cfg.compute_impl == "tiled" and not self.dist.is_cuda:
            raise RuntimeError("compute_impl tiled needs a CUDA or ROCm GPU (on CPU use compute_impl vendor)")
        if cfg.compute_impl == "tiled":
            # checked here, not in the extension: an exception thrown from the extension's
            # host code crashed the process on torch 2.11 (seen on an H200)
            optin = torch.cuda.get_device_properties(self.dist.device).shared_memory_per_block_optin
            smem = (cfg.tile_m * cfg.tile_k + cfg.tile_k * cfg.tile_n) * 4 + cfg.smem_pad_bytes
            if smem > optin:
                raise ValueError(
                    f"smem_pad_bytes: {cfg.smem_pad_bytes} bytes of padding + the tiles make {smem} bytes of shared "
                    f"memory per block, above this device's opt-in limit of {optin}"
                )
        eff["smem_carveout_applied"] = False
        if cfg.smem_carveout_percent is not None and self.ext is not None:
            from overlapviz.collectors import extension

            names = []
            if cfg.compute_impl == "tiled":
                names.append(extension.gemm_kernel_name(cfg.tile_m, cfg.tile_n, cfg.tile_k))
            if self.dist.backend == "stand-in":
                names.append(extension.STANDIN_KERNELS[cfg.collective])
            accepted = [bool(self.ext.set_smem_carveout(n, cfg.smem_carveout_percent)) for n in names]
            self._carveout_set = [n for n, ok in zip(names, accepted) if ok]  # reset in close(): it outlives the run
            eff["smem_carveout_applied"] = bool(names) and all(accepted)
            if not names:
                eff["smem_carveout_note"] = "no kernel of ours runs in this configuration"
        if self.ext is not None:
            eff["kernels"] = self.kernel_facts()
        eff["controls"] = self.controls()

    def controls(self) -> dict:
        """Every control of the run, requested vs effective (the manifest's ``effective.controls``)."""
        cfg, eff, gpu = self.config, self.effective, self.dist.is_cuda
        gemm = (eff.get("kernels") or {}).get("gemm") or {}
        out = {
            "comm_priority": {"requested": eff.get("comm_priority_requested"), "effective": eff.get("comm_priority_effective"),
                              "applied": bool(eff.get("priority_applied"))},
            "smem_pad_bytes": {"requested": cfg.smem_pad_bytes, "effective": gemm.get("blocks_per_sm"),
                               "effective_is": "GEMM blocks resident per SM (cudaOccupancyMaxActiveBlocksPerMultiprocessor)",
                               "applied": bool(eff.get("shaping_applied"))},
            "smem_carveout_percent": {"requested": cfg.smem_carveout_percent,
                                      "effective": cfg.smem_carveout_percent if eff.get("smem_carveout_applied") else None,
                                      "applied": bool(eff.get("smem_carveout_applied"))},
            "sm_carveout": {"requested": cfg.sm_carveout, "effective": eff.get("sm_carveout_effective",
                                                                           cfg.sm_carveout if eff.get("sm_carveout_applied") else None),
                            "effective_is": "torch's setting, passed to cuBLAS (torch._C._get_sm_carveout_experimental); "
                                            "whether the kernel cuBLAS picked honours it shows in the trace (its grid)",
                            "applied": bool(eff.get("sm_carveout_applied"))},
            "green_ctx_sms": dict(eff.get("green_ctx") or {"requested": None, "effective": None, "applied": False}),
            "cuda_max_connections": dict(self.dist.notes.get("cuda_max_connections")
                                         or {"requested": cfg.cuda_max_connections, "effective": None, "applied": False}),
        }
        if "green_ctx" in eff:
            out["green_ctx_sms"]["effective_is"] = "distinct SMs a probe grid on the GEMM's green context reached"
        if not gpu:
            for name in ("cuda_max_connections",):
                if out[name]["requested"] is not None:
                    out[name].update(applied=False, note="no GPU: nothing reads it")
        for note in ("priority_note", "sm_carveout_note", "smem_carveout_note"):
            if note in eff:
                key = {"priority_note": "comm_priority", "sm_carveout_note": "sm_carveout",
                       "smem_carveout_note": "smem_carveout_percent"}[note]
                out[key]["note"] = eff[note]
        return out

    def kernel_facts(self) -> dict:
        """Registers, shared memory and blocks per SM of our kernels at this configuration."""
        from overlapviz.collectors import extension

        cfg, ext, out = self.config, self.ext, {}
        if cfg.compute_impl == "tiled":
            name = extension.gemm_kernel_name(cfg.tile_m, cfg.tile_n, cfg.tile_k)
            smem = ext.gemm_smem_bytes(cfg.tile_m, cfg.tile_n, cfg.tile_k, cfg.smem_pad_bytes)
            out["gemm"] = dict(ext.kernel_attributes(name), threads_per_block=256, dynamic_shared_mem_bytes=smem,
                               blocks_per_sm=ext.blocks_per_sm(name, 256, smem))
        if self.dist.backend == "stand-in":
            name = extension.STANDIN_KERNELS[cfg.collective]
            out["comm"] = dict(ext.kernel_attributes(name), threads_per_block=cfg.standin_threads,
                               ctas=cfg.standin_ctas, dynamic_shared_mem_bytes=cfg.standin_smem_bytes,
                               blocks_per_sm=ext.blocks_per_sm(name, cfg.standin_threads, cfg.standin_smem_bytes),
                               bytes_moved=self.standin_bytes())
        return out

    def standin_bytes(self) -> int:
        """Bytes the stand-in reads from its "peer" buffer: what the collective receives per rank."""
        n, m = self.config.standin_ranks, self.config.message_bytes
        return (2 * (n - 1) * m) // n if self.config.collective == "all_reduce" else ((n - 1) * m) // n

    def close(self) -> None:
        """Undo what outlives the run in this process (a sweep may run the next configuration here)."""
        import torch

        if self.effective.get("sm_carveout_applied"):
            torch._C._set_sm_carveout_experimental(None)
        for name in getattr(self, "_carveout_set", []):
            self.ext.set_smem_carveout(name, -1)  # -1: cudaSharedmemCarveoutDefault, the driver's choice
        self._carveout_set = []
        if getattr(self, "_green", None) is not None:
            torch.cuda.synchronize(self.dist.device)
            self._green_stream = self._green_push = None
            self.compute_stream = None
            self._green = None  # destroyed with its last reference

    # -- the two halves --------------------------------------------------------------------
    def compute(self) -> None:
        import torch

        cfg = self.config
        if cfg.compute_impl == "tiled":
            self.ext.tiled_gemm(self.a, self.b, self.c, cfg.tile_m, cfg.tile_n, cfg.tile_k, cfg.smem_pad_bytes)
        else:
            torch.mm(self.a, self.b, out=self.c)

    def comm(self, *, async_op: bool = False):
        """Issue the collective on the current stream; returns the work handle when ``async_op``."""
        import torch.distributed as dist

        cfg, d = self.config, self.dist
        if d.backend == "stand-in":
            self.ext.standin(cfg.collective, self.send, self.recv, cfg.standin_ranks, cfg.standin_ctas,
                             cfg.standin_threads, cfg.standin_smem_bytes, float(cfg.standin_link_gbps))
            return None
        if cfg.collective == "all_reduce":
            # AVG keeps values bounded over many iterations; gloo has no AVG
            op = dist.ReduceOp.AVG if d.backend in ("nccl", "rccl") else dist.ReduceOp.SUM
            return dist.all_reduce(self.send, op=op, async_op=async_op)
        return dist.all_to_all_single(self.recv, self.send, async_op=async_op)

    # -- one iteration -------------------------------------------------------------------
    def step(self) -> None:
        cfg = self.config
        if not self.dist.is_cuda:
            if cfg.setup == "sequential":
                self.compute()
                self.comm()
            else:
                work = self.comm(async_op=True)  # gloo's thread runs it while this one computes
                self.compute()
                work.wait()
            return
        if cfg.setup == "sequential":
            self.compute()
            self.comm()
            return
        self.compute_stream.wait_stream(self.main)
        self.comm_stream.wait_stream(self.main)
        halves = [self._compute_on_stream, self._comm_on_stream]
        if cfg.launch_order == "comm-first":
            halves.reverse()
        for half in halves:
            half()
        self.main.wait_stream(self.compute_stream)
        self.main.wait_stream(self.comm_stream)

    def _compute_on_stream(self) -> None:
        import torch

        with torch.cuda.stream(self.compute_stream):
            if getattr(self, "_green", None) is not None:
                self._on_green(self.compute)
            else:
                self.compute()

    def _comm_on_stream(self) -> None:
        import torch

        with torch.cuda.stream(self.comm_stream):
            work = self.comm(async_op=True)
            if work is not None:
                work.wait()  # NCCL: the comm stream waits for the process group's stream (no host block)

    def synchronize(self) -> None:
        import torch

        if self.dist.is_cuda:
            torch.cuda.synchronize(self.dist.device)

    # -- checks ----------------------------------------------------------------------------
    def check(self) -> dict:
        """Check the GEMM and the collective once on fresh inputs; returns what was measured.

        Raises
        ------
        RuntimeError
            If a result is wrong.
        """
        import torch

        out: dict = {}
        cfg = self.config
        if cfg.compute_impl == "tiled":
            self.c.fill_(float("nan"))  # poison: an unwritten element fails the check
            self.compute()
            self.synchronize()
            ref = self.a.double() @ self.b.double()
            rel = float(torch.linalg.norm(self.c.double() - ref) / torch.linalg.norm(ref))
            vendor = torch.matmul(self.a, self.b)
            out["tiled_gemm_rel_err_vs_fp64"] = rel
            out["torch_matmul_rel_err_vs_fp64"] = float(torch.linalg.norm(vendor.double() - ref) / torch.linalg.norm(ref))
            out["tiled_vs_torch_matmul_rel_diff"] = float(
                torch.linalg.norm(self.c.double() - vendor.double()) / torch.linalg.norm(vendor.double())
            )
            del ref, vendor
            if not rel < 1e-4:
                raise RuntimeError(f"tiled GEMM is wrong: relative error {rel:.3g} against torch.matmul in float64")
        out.update(self._check_comm())
        return out

    def _check_comm(self) -> dict:
        import torch
        import torch.distributed as dist

        cfg, d = self.config, self.dist
        if d.backend == "stand-in":
            before = self.send.clone()
            self.comm()
            self.synchronize()
            want = standin_expected(before, self.recv, cfg.standin_ranks, cfg.collective)
            ok = bool(torch.equal(self.send, want))
            if not ok:
                raise RuntimeError("stand-in collective is wrong: its result differs from the ring reference")
            self.send.copy_(before)
            return {"comm_check": "stand-in matches its ring reference"}
        world = d.world_size
        saved = self.send.clone()
        if cfg.collective == "all_reduce":
            self.send.fill_(d.rank + 1.0)
            self.comm()
            self.synchronize()
            expect = (world + 1) / 2 if d.backend in ("nccl", "rccl") else world * (world + 1) / 2
            ok = bool(torch.all(self.send == expect))
        else:
            chunks = self.send.view(world, -1)
            chunks.copy_((d.rank * 1000 + torch.arange(world, device=d.device, dtype=self.send.dtype))[:, None])
            self.comm()
            self.synchronize()
            got = self.recv.view(world, -1)
            want = (torch.arange(world, device=d.device, dtype=self.send.dtype) * 1000 + d.rank)[:, None]
            ok = bool(torch.all(got == want))
        self.send.copy_(saved)
        flag = torch.tensor([0.0 if ok else 1.0], device=d.device)
        dist.all_reduce(flag)  # every rank learns whether any rank saw a wrong result
        if flag.item():
            raise RuntimeError(f"{cfg.collective} through {d.backend} gave a wrong result on some rank")
        return {"comm_check": f"{cfg.collective} through {d.backend} gave the right result on every rank"}


def standin_expected(data, peer, n_ranks: int, collective: str):
    """What the stand-in kernel must leave in ``data`` (see collectors/ovz_kernels.cu)."""
    out = data.clone()
    n_vec = data.numel() // 4

    def chunk(j):
        return slice(4 * (n_vec * j // n_ranks), 4 * (n_vec * (j + 1) // n_ranks))

    if collective == "all_reduce":
        for s in range(n_ranks - 1):  # reduce-scatter
            j = chunk(n_ranks - 1 - s)
            out[j] = out[j] + peer[j]
        for s in range(n_ranks - 1):  # all-gather
            j = chunk((n_ranks - s) % n_ranks)
            out[j] = peer[j]
    else:
        for j in range(1, n_ranks):
            out[chunk(j)] = peer[chunk(j)]
    return out
