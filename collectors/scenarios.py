"""Ground-truth scenarios: the stand-in collective starts late (or not) for a cause known by construction.

    python -m overlapviz.collectors.scenarios --scenario all --out DIR      # one GPU
    python -m overlapviz.collectors.scenarios --evidence DIR/runs/<run_id>  # what its trace shows
    overlapviz collect --scenario all -o DIR                                # the same, then ingest

Each scenario arranges the tiled GEMM and the single-GPU communication STAND-IN
(``ovz_comm_allreduce_standin``, not NCCL) so that exactly one cause of DESIGN.md's "Why a
collective started late" accounts for the comm kernel's start − launch. Each is recorded
twice, with and without Kineto's CUDA synchronization events
(``_ExperimentalConfig(enable_cuda_sync_events=True)``), into ``DIR/runs/<run_id>/``
(``manifest.json`` in the collector's format plus a ``scenario`` object, and
``trace_rank0.json.gz``): 2 untraced warm-up iterations, then 5 traced ones, each started
on an idle GPU.

The constructions depend on the device (SM count, shared memory, registers); they are
computed from its limits at run time and checked before anything runs
(:func:`construction`), so a device where one cannot hold fails that run, naming why.
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import json
import math
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

from overlapviz.collectors import manifest as mf
from overlapviz.collectors.config import CollectConfig, cb_ar_standin
from overlapviz.collectors.profiler import Profiler, iteration

# DESIGN.md, "Why a collective started late (contract)"
CAUSES = ("stream_order", "dependency", "sm_resources", "launch_latency", "unknown", "none")
BLOCKING_RESOURCES = ("registers", "shared_memory", "shared_memory_carveout", "threads", "warps", "block_slots")
LAYOUTS = {
    "two_streams": "GEMM on the compute stream, the comm on the comm stream, no wait between them",
    "event_dependency": "GEMM on the compute stream, an event recorded after it, the comm stream waits on the event, then the comm",
    "same_stream": "GEMM, then the comm, on one stream",
    "host_sleep": "GEMM on the compute stream, the host sleeps, then the comm on the comm stream",
}
RUNS_DIR = "runs"
HOST_SLEEP_RANGE = "ovz_host_sleep"  # record_function around the host's sleep (scenario host_late)
HOST_SETTLE_RANGE = "ovz_host_settle"  # record_function around the wait that lets the GEMM fill the SMs first
WARMUP_ITERATIONS = 2
TRACED_ITERATIONS = 5
GEMM_THREADS = 256  # collectors/ovz_kernels.cu: OVZ_GEMM_THREADS
TILE = (64, 64, 32)
TILE_SMEM_BYTES = (TILE[0] * TILE[2] + TILE[2] * TILE[1]) * 4
GEMM_KERNEL = "ovz_gemm_tiled_{}x{}x{}".format(*TILE)
COMM_KERNEL = "ovz_comm_allreduce_standin"
SETTLE_US = 200  # host wait between the GEMM's launch and the comm's: the GEMM's blocks are resident first
HOST_SLEEP_MS = 3.0
REG_ALLOC_UNIT = 256  # registers are allocated per warp in units of 256 (NVIDIA sm_50 and later)
WARP = 32


@dataclass(frozen=True)
class DeviceLimits:
    """The device limits the constructions use; the defaults are the NVIDIA H200's (sm_90)."""

    num_sms: int = 132
    threads_per_sm: int = 2048
    regs_per_sm: int = 65536
    smem_per_sm: int = 233472
    smem_per_block_optin: int = 232448
    reserved_smem_per_block: int = 1024
    max_blocks_per_sm: int = 32

    @classmethod
    def from_device_row(cls, row: dict) -> DeviceLimits:
        """From a manifest ``devices`` row (``manifest.device_row``).

        Raises
        ------
        ValueError
            Naming the limit the row lacks.
        """
        keys = {"num_sms": "num_sms", "threads_per_sm": "max_threads_per_sm", "regs_per_sm": "regs_per_sm",
                "smem_per_sm": "shared_mem_per_sm", "smem_per_block_optin": "shared_mem_per_block_optin",
                "max_blocks_per_sm": "max_blocks_per_sm"}
        values = {}
        for field_name, key in keys.items():
            if row.get(key) is None:
                raise ValueError(f"device row: {key} is unknown; the scenarios need it")
            values[field_name] = int(row[key])
        values["reserved_smem_per_block"] = int((row.get("extra") or {}).get("reserved_shared_mem_per_block", 0))
        return cls(**values)


@dataclass(frozen=True, kw_only=True)
class Scenario:
    """One constructed situation; ``expected_cause`` is what ``overlapviz explain`` must find."""

    name: str
    expected_cause: str
    accepted_causes: tuple[str, ...]
    expected_blocking_resource: str | None
    layout: str
    grid: str  # "third": one wave on about a third of the SMs; "full": whole waves over every SM
    gemm_blocks_per_sm: int  # what the shared-memory pad makes resident per SM
    gemm_k: int
    settle_us: int = 0
    host_sleep_ms: float = 0.0
    description: str

    def __post_init__(self) -> None:
        if self.expected_cause not in CAUSES:
            raise ValueError(f"{self.name}: expected_cause must be one of {', '.join(CAUSES)}")
        if self.expected_cause not in self.accepted_causes or not set(self.accepted_causes) <= set(CAUSES):
            raise ValueError(f"{self.name}: accepted_causes must hold expected_cause and only causes of DESIGN.md")
        if (self.expected_blocking_resource is not None) != (self.expected_cause == "sm_resources"):
            raise ValueError(f"{self.name}: expected_blocking_resource is given exactly when the cause is sm_resources")
        if self.expected_blocking_resource not in (None, *BLOCKING_RESOURCES):
            raise ValueError(f"{self.name}: expected_blocking_resource must be one of {', '.join(BLOCKING_RESOURCES)}")
        if self.layout not in LAYOUTS:
            raise ValueError(f"{self.name}: layout must be one of {', '.join(LAYOUTS)}")
        if self.grid not in ("third", "full") or self.gemm_blocks_per_sm not in (1, 2):
            raise ValueError(f"{self.name}: grid is third or full, gemm_blocks_per_sm 1 or 2")

    def config(self, limits: DeviceLimits = DeviceLimits()) -> CollectConfig:
        """The collector configuration that builds this scenario on a device with ``limits``."""
        if self.grid == "full":  # 8 rows of tiles x one column of tiles per SM: whole waves
            m, n = 8 * TILE[0], limits.num_sms * TILE[1]
        else:  # 4 rows of tiles, about a third of the SMs in all: one wave, most SMs free
            m, n = 4 * TILE[0], max(1, limits.num_sms // 12) * TILE[1]
        return base_config().replace(
            setup="sequential" if self.layout == "same_stream" else "baseline",
            gemm_m=m, gemm_n=n, gemm_k=self.gemm_k,
            smem_pad_bytes=smem_pad_bytes(self.gemm_blocks_per_sm, limits),
        )

    def record(self, *, sync_events: bool) -> dict:
        """The manifest's ``scenario`` object (construction facts are added at run time)."""
        return {
            "name": self.name,
            "expected_cause": self.expected_cause,
            "accepted_causes": list(self.accepted_causes),
            "expected_blocking_resource": self.expected_blocking_resource,
            "expected_blocker": GEMM_KERNEL if self.expected_cause == "sm_resources" else None,
            "description": self.description,
            "layout": self.layout,
            "layout_description": LAYOUTS[self.layout],
            "host_settle_us": self.settle_us,
            "host_sleep_ms": self.host_sleep_ms,
            "warmup_iterations": WARMUP_ITERATIONS,
            "traced_iterations": TRACED_ITERATIONS,
            "cuda_sync_events": sync_events,
            "comm_is_stand_in": True,
        }


def base_config() -> CollectConfig:
    """What every scenario shares: the tiled 64x64x32 GEMM and the stand-in all-reduce paced to 200 GB/s.

    16 MiB per rank (about 150 µs of stand-in), the shared-memory carve-out preference at 100 %
    for both kernels (so the L1/shared split is never what keeps the comm out), 2 warm-up +
    5 traced iterations (``iterations = 7``: its first third, 2, is the warm-up).
    """
    return cb_ar_standin().replace(message_bytes=16 << 20, smem_carveout_percent=100, iterations=7,
                                   trace_iterations=TRACED_ITERATIONS)


def smem_pad_bytes(blocks_per_sm: int, limits: DeviceLimits) -> int:
    """The GEMM pad that makes shared memory allow exactly ``blocks_per_sm`` blocks per SM.

    1: one block takes the whole opt-in limit, so nothing else with shared memory fits
    beside it. 2: the multiple of 4 KB nearest the middle of the pads that let two blocks
    and one stand-in block share an SM but not three GEMM blocks.
    """
    reserved = limits.reserved_smem_per_block
    if blocks_per_sm == 1:
        return limits.smem_per_block_optin - TILE_SMEM_BYTES
    comm = base_config().standin_smem_bytes + reserved
    low = limits.smem_per_sm // 3 - TILE_SMEM_BYTES - reserved + 1  # 3 blocks no longer fit
    high = (limits.smem_per_sm - comm) // 2 - TILE_SMEM_BYTES - reserved  # 2 blocks + the comm still fit
    if low > high:
        raise ValueError(f"smem_pad_bytes: no pad gives 2 GEMM blocks per SM with room for the comm on this device ({limits})")
    pad = round((low + high) / 2 / 4096) * 4096
    return min(max(pad, -(-low // 4096) * 4096), high // 4096 * 4096)


def _regs_per_block(regs_per_thread: int, threads: int) -> int:
    per_warp = -(-regs_per_thread * WARP // REG_ALLOC_UNIT) * REG_ALLOC_UNIT
    return per_warp * -(-threads // WARP)


def construction(scenario: Scenario, config: CollectConfig, limits: DeviceLimits, *, gemm_regs: int = 48,
                 comm_regs: int = 96) -> dict:
    """Check that ``config`` builds ``scenario`` on ``limits``; return the facts it rests on.

    ``gemm_regs`` / ``comm_regs`` are the kernels' registers per thread (48 and 96 as
    compiled for sm_90; the run passes what ``cudaFuncGetAttributes`` says). Whole-SM
    sums: a block takes its threads, its warps' registers (256-register units) and its
    shared memory plus the per-block reservation; the carve-out is at 100 %.

    Raises
    ------
    ValueError
        Naming the scenario and what does not hold.
    """
    gemm_smem = TILE_SMEM_BYTES + config.smem_pad_bytes + limits.reserved_smem_per_block
    comm_smem = config.standin_smem_bytes + limits.reserved_smem_per_block
    gemm_regs_block = _regs_per_block(gemm_regs, GEMM_THREADS)
    comm_regs_block = _regs_per_block(comm_regs, config.standin_threads)
    per_sm = min(limits.threads_per_sm // GEMM_THREADS, limits.regs_per_sm // gemm_regs_block,
                 limits.smem_per_sm // gemm_smem, limits.max_blocks_per_sm)
    blocks = math.ceil(config.gemm_m / TILE[0]) * math.ceil(config.gemm_n / TILE[1])
    room = {  # one stand-in block beside `per_sm` GEMM blocks on one SM
        "threads": per_sm * GEMM_THREADS + config.standin_threads <= limits.threads_per_sm,
        "registers": per_sm * gemm_regs_block + comm_regs_block <= limits.regs_per_sm,
        "shared_memory": per_sm * gemm_smem + comm_smem <= limits.smem_per_sm,
        "block_slots": per_sm + 1 <= limits.max_blocks_per_sm,
    }
    facts = {
        "gemm_grid_blocks": blocks,
        "gemm_blocks_per_sm": per_sm,
        "gemm_waves": blocks / (per_sm * limits.num_sms),
        "gemm_sms_used_first_wave": min(limits.num_sms, math.ceil(blocks / per_sm)),
        "sms_free_of_gemm_first_wave": max(0, limits.num_sms - math.ceil(blocks / per_sm)),
        "gemm_block_smem_bytes_with_reserved": gemm_smem,
        "gemm_block_regs": gemm_regs_block,
        "comm_block_smem_bytes_with_reserved": comm_smem,
        "comm_block_regs": comm_regs_block,
        "comm_fits_beside_full_sm": room,
        "device_limits": dataclasses.asdict(limits),
    }

    def bad(why: str) -> ValueError:
        return ValueError(f"scenario {scenario.name}: {why} on this device ({facts})")

    if per_sm != scenario.gemm_blocks_per_sm:
        raise bad(f"the GEMM gets {per_sm} blocks per SM, not {scenario.gemm_blocks_per_sm}")
    if scenario.grid == "full":
        if blocks % (per_sm * limits.num_sms) or blocks // (per_sm * limits.num_sms) < 2:
            raise bad("the GEMM's grid is not 2 or more whole waves over every SM")
        blocked = sorted(r for r, ok in room.items() if not ok)
        if blocked != [scenario.expected_blocking_resource]:
            raise bad(f"the comm is kept out by {blocked or 'nothing'}, not by {scenario.expected_blocking_resource} alone")
    elif 3 * facts["gemm_sms_used_first_wave"] > limits.num_sms + 2:
        raise bad("the GEMM's one wave takes more than about a third of the SMs")
    return facts


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario(
            name="dependency", expected_cause="dependency", accepted_causes=("dependency",),
            expected_blocking_resource=None, layout="event_dependency", grid="third", gemm_blocks_per_sm=1,
            gemm_k=8192,
            description="A long GEMM (one wave on about a third of the SMs, ~1 ms) on the compute stream; a "
                        "torch.cuda.Event recorded after it; the comm stream waits on that event "
                        "(cudaStreamWaitEvent) and the stand-in is launched on it at once, long before the GEMM "
                        "ends. Most SMs are free, so only the event holds the comm back: it starts when the GEMM "
                        "(the event's producer) ends.",
        ),
        Scenario(
            name="sm_resources_smem", expected_cause="sm_resources", accepted_causes=("sm_resources",),
            expected_blocking_resource="shared_memory", layout="two_streams", grid="full", gemm_blocks_per_sm=1,
            gemm_k=2048, settle_us=SETTLE_US,
            description="A GEMM of 8 whole waves over every SM whose blocks are padded to the opt-in shared-memory "
                        "limit (one block fills an SM's shared memory), on the compute stream; the stand-in on the "
                        "comm stream (same priority, no dependency) 200 µs after the GEMM's launch. Registers, "
                        "threads and block slots would leave room for a stand-in block beside a GEMM block; shared "
                        "memory does not, and pending GEMM blocks take every SM that frees until the last wave: "
                        "the comm starts when the GEMM drains.",
        ),
        Scenario(
            name="sm_resources_regs", expected_cause="sm_resources", accepted_causes=("sm_resources",),
            expected_blocking_resource="registers", layout="two_streams", grid="full", gemm_blocks_per_sm=2,
            gemm_k=2048, settle_us=SETTLE_US,
            description="As sm_resources_smem, but the GEMM's pad makes shared memory allow 2 blocks per SM (4 whole "
                        "waves) with room for a stand-in block beside them (carve-out preference 100 %); two GEMM "
                        "blocks hold 2 x 12,288 registers and a stand-in block needs 49,152 (96 per thread x 512), "
                        "more than the 40,960 left of 65,536: registers keep the comm out until the GEMM drains.",
        ),
        Scenario(
            name="fits", expected_cause="none", accepted_causes=("none", "launch_latency"),
            expected_blocking_resource=None, layout="two_streams", grid="third", gemm_blocks_per_sm=1,
            gemm_k=8192, settle_us=SETTLE_US,
            description="The dependency scenario's GEMM (one wave on about a third of the SMs) on the compute stream "
                        "and the stand-in on the comm stream 200 µs later, no dependency: about two thirds of the "
                        "SMs are free, so the comm starts at once beside the GEMM (start - launch is the launch "
                        "latency alone).",
        ),
        Scenario(
            name="stream_order", expected_cause="stream_order", accepted_causes=("stream_order",),
            expected_blocking_resource=None, layout="same_stream", grid="third", gemm_blocks_per_sm=1,
            gemm_k=8192,
            description="The dependency scenario's GEMM and then the stand-in on the same stream (setup sequential): "
                        "the comm is launched long before the GEMM ends and waits for it in stream order, though "
                        "most SMs are free.",
        ),
        Scenario(
            name="host_late", expected_cause="none", accepted_causes=("none", "launch_latency"),
            expected_blocking_resource=None, layout="host_sleep", grid="third", gemm_blocks_per_sm=1,
            gemm_k=1024, host_sleep_ms=HOST_SLEEP_MS,
            description="A short GEMM (~0.1 ms) on the compute stream, then the host sleeps 3 ms (a user_annotation "
                        "range 'ovz_host_sleep') before launching the stand-in on the comm stream of an idle GPU. "
                        "The comm is late only on the host side: measured from its launch it starts at once.",
        ),
    )
}


def run_id(name: str, sync_events: bool) -> str:
    return f"scenario-{name}_sync-events-{'on' if sync_events else 'off'}"


def select(names: str | list[str]) -> list[Scenario]:
    """Scenarios by name (``all`` for every one; a comma-separated string too).

    Raises
    ------
    ValueError
        Naming the unknown scenario and the known ones.
    """
    items = names.split(",") if isinstance(names, str) else list(names)
    items = [n.strip().replace("-", "_") for n in items if n.strip()]
    if not items:
        raise ValueError(f"scenario: none given; scenarios: all, {', '.join(SCENARIOS)}")
    if "all" in items:
        return list(SCENARIOS.values())
    unknown = [n for n in items if n not in SCENARIOS]
    if unknown:
        raise ValueError(f"scenario: {unknown[0]!r} does not exist; scenarios: all, {', '.join(SCENARIOS)}")
    return [SCENARIOS[n] for n in dict.fromkeys(items)]


def validate_manifest(data: dict, *, where: str = "manifest") -> dict:
    """Check a scenario run's manifest; returns its ``scenario`` object.

    Raises
    ------
    ValueError
        Naming ``where`` and the field that is missing or wrong.
    """
    if data.get("format") != mf.FORMAT:
        raise ValueError(f"{where}: format is {data.get('format')!r}, not {mf.FORMAT!r}")
    sc = data.get("scenario")
    if not isinstance(sc, dict):
        raise ValueError(f"{where}: no scenario object")
    for key in ("name", "expected_cause", "accepted_causes", "expected_blocking_resource", "description",
                "cuda_sync_events"):
        if key not in sc:
            raise ValueError(f"{where}: scenario.{key} is missing")
    known = SCENARIOS.get(sc["name"])
    if known is None:
        raise ValueError(f"{where}: scenario.name {sc['name']!r} is not a scenario of this collector")
    for key in ("expected_cause", "expected_blocking_resource"):
        if sc[key] != getattr(known, key):
            raise ValueError(f"{where}: scenario.{key} is {sc[key]!r}, the scenario says {getattr(known, key)!r}")
    if not isinstance(sc["cuda_sync_events"], bool) or (data.get("profiler") or {}).get("cuda_sync_events") != sc["cuda_sync_events"]:
        raise ValueError(f"{where}: scenario.cuda_sync_events must be a bool equal to profiler.cuda_sync_events")
    run = data.get("run") or {}
    if run.get("run_id") != run_id(sc["name"], sc["cuda_sync_events"]):
        raise ValueError(f"{where}: run.run_id {run.get('run_id')!r} does not name the scenario and its sync events")
    if run.get("backend") != "stand-in" or run.get("stand_in") is not True:
        raise ValueError(f"{where}: a scenario's comm is the stand-in: run.backend must be 'stand-in'")
    CollectConfig.from_dict(data.get("config") or {}, where=f"{where} config")
    return sc


# --- running (on a GPU) -------------------------------------------------------------------


class SyncEventsProfiler(Profiler):
    """The collector's Profiler (CPU + CUDA, no shapes), with Kineto's CUDA sync events when ``sync_events``."""

    def __init__(self, run_dir: str | Path, *, sync_events: bool):
        super().__init__(run_dir, 0, cuda=True)
        self.sync_events = sync_events

    def __enter__(self) -> SyncEventsProfiler:
        from torch._C._profiler import _ExperimentalConfig
        from torch.profiler import ProfilerActivity, profile

        extra = {"experimental_config": _ExperimentalConfig(enable_cuda_sync_events=True)} if self.sync_events else {}
        self._prof = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=False,
                             with_stack=False, profile_memory=False, **extra)
        self._prof.__enter__()
        return self


def _iteration(wl, scenario: Scenario) -> None:
    """One iteration of ``scenario`` on ``wl`` (a collector Workload); the GPU is idle when it starts."""
    import torch

    if scenario.layout == "same_stream":
        with torch.cuda.stream(wl.compute_stream):  # setup sequential: compute and comm stream are one
            wl.compute()
            wl.comm()
        return
    with torch.cuda.stream(wl.compute_stream):
        wl.compute()
    if scenario.layout == "event_dependency":
        done = torch.cuda.Event()
        done.record(wl.compute_stream)
        wl.comm_stream.wait_event(done)
    if scenario.settle_us:
        with torch.profiler.record_function(HOST_SETTLE_RANGE):
            until = time.perf_counter() + scenario.settle_us / 1e6
            while time.perf_counter() < until:  # busy: a sleep overshoots by tens of µs
                pass
    if scenario.host_sleep_ms:
        with torch.profiler.record_function(HOST_SLEEP_RANGE):
            time.sleep(scenario.host_sleep_ms / 1e3)
    with torch.cuda.stream(wl.comm_stream):
        wl.comm()


def _driver() -> dict:
    out: dict = {}
    try:
        import pynvml

        pynvml.nvmlInit()
        v = pynvml.nvmlSystemGetDriverVersion()
        out["nvidia_driver_version"] = v.decode() if isinstance(v, bytes) else v
    except Exception:  # no NVML (or not NVIDIA): the trace's cuda_driver_version still says the API level
        out["nvidia_driver_version"] = None
    return out


def run_scenario(scenario: Scenario, out: Path, *, sync_events: bool) -> dict:
    """Record ``scenario`` into ``out/runs/<run_id>/``; returns its manifest (status failed on error, re-raised)."""
    import torch

    from overlapviz.collectors import extension
    from overlapviz.collectors.workload import Workload, init_dist

    rid = run_id(scenario.name, sync_events)
    run_dir = Path(out) / RUNS_DIR / rid
    run_dir.mkdir(parents=True, exist_ok=True)
    known = {"start_time": mf.now_iso(), **mf.versions(), "world_size": 1, "backend": "stand-in"}
    record = scenario.record(sync_events=sync_events)
    profiler_record = {"tool": "torch.profiler", "activities": ["CPU", "CUDA"], "record_shapes": False,
                       "with_stack": False, "cuda_sync_events": sync_events,
                       "experimental_config": "torch._C._profiler._ExperimentalConfig(enable_cuda_sync_events=True)"
                       if sync_events else None}
    config = scenario.config()  # the H200's construction until the device's limits are read
    wl = None
    try:
        ext = extension.load()
        device = mf.device_row(0, ext)
        device["rank"] = 0
        limits = DeviceLimits.from_device_row(device)
        config = scenario.config(limits)
        gemm_attr, comm_attr = ext.kernel_attributes(GEMM_KERNEL), ext.kernel_attributes(COMM_KERNEL)
        record["construction"] = construction(scenario, config, limits, gemm_regs=int(gemm_attr["regs_per_thread"]),
                                              comm_regs=int(comm_attr["regs_per_thread"]))
        wl = Workload(config, init_dist(config))
        gemm_cuda = wl.effective["kernels"]["gemm"]["blocks_per_sm"]
        if gemm_cuda != scenario.gemm_blocks_per_sm:  # CUDA's own occupancy answer must agree
            raise ValueError(f"scenario {scenario.name}: cudaOccupancyMaxActiveBlocksPerMultiprocessor gives the GEMM "
                             f"{gemm_cuda} blocks per SM, not {scenario.gemm_blocks_per_sm}")
        checks = wl.check() if config.check else {}
        for _ in range(WARMUP_ITERATIONS):
            _iteration(wl, scenario)
            wl.synchronize()
        with SyncEventsProfiler(run_dir, sync_events=sync_events):
            for i in range(TRACED_ITERATIONS):
                with iteration(i):
                    _iteration(wl, scenario)
                wl.synchronize()  # the next iteration starts on an idle GPU
        eff = dict(wl.effective, checks=[checks], dist=wl.dist.notes)
        run = mf.run_record(config, run_id=rid, status="ok", comm_priority=eff.get("comm_priority_requested"),
                            comm_priority_effective=eff.get("comm_priority_effective"), device_name=device["name"],
                            **known)
        data = mf.manifest(config, run, devices=[device], effective=eff)
        data.update(scenario=record, profiler=profiler_record, driver=_driver())
        mf.write_manifest(run_dir, data)
        return data
    except BaseException as exc:
        message = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}".strip()
        run = mf.run_record(config, run_id=rid, status="failed", error=message, **known)
        data = mf.manifest(config, run, effective=wl.effective if wl else None)
        data.update(scenario=record, profiler=profiler_record)
        for trace in run_dir.glob(mf.TRACE.format(rank="*")):
            trace.unlink()
        mf.write_manifest(run_dir, data)
        raise
    finally:
        if wl is not None:
            wl.close()
        if torch.cuda.is_available():
            torch.cuda.synchronize()


def run_all(scenarios: list[Scenario], out: str | Path, *, sync_events: tuple[bool, ...] = (True, False),
            log=print) -> list[tuple[str, str, str | None]]:
    """Record every scenario with each sync-events setting; finished runs (manifest ok or failed) are kept.

    Returns (run_id, status, error) per run; a failed run does not stop the others.
    """
    results = []
    for sc in scenarios:
        for sync in sync_events:
            rid = run_id(sc.name, sync)
            status = mf.run_status(Path(out) / RUNS_DIR / rid)
            if status is not None:
                results.append((rid, f"skipped-{status}", None))
                continue
            t0 = time.perf_counter()
            try:
                run_scenario(sc, Path(out), sync_events=sync)
                results.append((rid, "ok", None))
            except Exception as exc:
                traceback.print_exc()
                results.append((rid, "failed", f"{type(exc).__name__}: {exc}"))
            log(f"{rid}: {results[-1][1]} ({time.perf_counter() - t0:.1f} s)")
    return results


def launch_command(names: list[str], out: str | Path, *, launcher: str | None = None) -> list[str]:
    """The command that records ``names`` into ``out`` (``launcher`` prefixes it, default this Python)."""
    import shlex

    from overlapviz.collectors.launch import python_command

    prefix = shlex.split(launcher) if launcher else python_command()  # -P: a clone's overlapviz/ must not shadow
    return prefix + ["-m", "overlapviz.collectors.scenarios", "--scenario", ",".join(names), "--out", str(out)]


def collect(scenarios: list[Scenario], out: str | Path, *, launcher: str | None = None,
            timeout_s: float | None = None) -> list[tuple[str, str, str | None]]:
    """Record ``scenarios`` in one child process (CUDA and the extension load once); returns (run_id, status, error).

    Runs finished before (manifest ok or failed) are kept. A run the child left
    without a finished manifest (a crash, the timeout) is reported failed.
    """
    import subprocess

    out = Path(out)
    (out / RUNS_DIR).mkdir(parents=True, exist_ok=True)
    ids = [run_id(sc.name, s) for sc in scenarios for s in (True, False)]
    todo = [sc.name for sc in scenarios
            if any(mf.run_status(out / RUNS_DIR / run_id(sc.name, s)) is None for s in (True, False))]
    error = None
    if todo:
        limit = timeout_s if timeout_s is not None else base_config().timeout_s * 2 * len(todo)
        try:
            from overlapviz.collectors.launch import child_env

            subprocess.run(launch_command(todo, out, launcher=launcher), timeout=limit, check=False, env=child_env())
        except subprocess.TimeoutExpired:
            error = f"timeout: the scenarios did not finish in {limit:g} s"
    results = []
    for rid in ids:
        data = mf.read_manifest(out / RUNS_DIR / rid) or {}
        status = (data.get("run") or {}).get("status")
        results.append((rid, status or "failed", (data.get("run") or {}).get("error") or (None if status else error or "no manifest")))
    return results


# --- what a trace shows (a check of the construction, not an analysis) ---------------------


def evidence(run_dir: str | Path) -> list[dict]:
    """Per traced iteration: the comm kernel, its launch, the kernel before it on its stream, the GEMM, sync records.

    Times are the trace's µs (``ts``), as strings where exact; deltas in µs. For reading a
    recording, not for metrics (those come from the dataset).
    """
    with gzip.open(Path(run_dir) / mf.TRACE.format(rank=0)) as f:
        doc = json.loads(f.read())
    kernel_facts = ((mf.read_manifest(Path(run_dir)) or {}).get("effective") or {}).get("kernels") or {}
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    kernels = sorted((e for e in events if e.get("cat") == "kernel"), key=lambda e: float(e["ts"]))
    launches = {e["args"]["correlation"]: e for e in events
                if e.get("cat") == "cuda_runtime" and "Launch" in e.get("name", "")}
    syncs = [e for e in events if e.get("cat") == "cuda_sync"]
    runtime = [e for e in events if e.get("cat") == "cuda_runtime"]
    host = [e for e in events if e.get("cat") == "user_annotation"]
    iters = sorted((e for e in host if e["name"].startswith("ovz_iter#")), key=lambda e: float(e["ts"]))
    out = []
    for it in iters:
        lo, hi = float(it["ts"]), float(it["ts"]) + float(it["dur"])

        def inside(e, lo=lo, hi=hi):
            return lo <= float(e["ts"]) <= hi

        mine = [k for k in kernels if k["args"]["correlation"] in launches and inside(launches[k["args"]["correlation"]])]
        comm = next((k for k in mine if k["name"].startswith("ovz_comm")), None)
        gemm = next((k for k in mine if k["name"].startswith("ovz_gemm")), None)
        if comm is None:
            continue
        launch = launches[comm["args"]["correlation"]]
        before = [k for k in kernels if k["args"]["stream"] == comm["args"]["stream"] and float(k["ts"]) < float(comm["ts"])]
        prev = before[-1] if before else None
        row = {
            "iteration": it["name"],
            "comm": {k: comm["args"].get(k) for k in ("stream", "correlation", "grid", "block", "registers per thread",
                                                          "shared memory", "blocks per SM")},
            "comm_launch_ts": launch["ts"], "comm_start_ts": comm["ts"], "comm_dur_us": comm["dur"],
            "start_minus_launch_us": round(float(comm["ts"]) - float(launch["ts"]), 3),
            "prev_on_stream": None if prev is None else {
                "name": prev["name"], "end_ts": round(float(prev["ts"]) + float(prev["dur"]), 3),
                "comm_start_minus_prev_end_us": round(float(comm["ts"]) - float(prev["ts"]) - float(prev["dur"]), 3)},
            "gemm": None if gemm is None else {
                **{k: gemm["args"].get(k) for k in ("stream", "grid", "block", "registers per thread", "shared memory",
                                                     "blocks per SM", "warps per SM")},
                "resident_blocks_per_sm_cuda": (kernel_facts.get("gemm") or {}).get("blocks_per_sm"),
                "launch_ts": launches[gemm["args"]["correlation"]]["ts"], "start_ts": gemm["ts"], "dur_us": gemm["dur"],
                "end_ts": round(float(gemm["ts"]) + float(gemm["dur"]), 3),
                "comm_start_minus_gemm_end_us": round(float(comm["ts"]) - float(gemm["ts"]) - float(gemm["dur"]), 3)},
            "host_ranges": [{"name": h["name"], "ts": h["ts"], "dur_us": h["dur"]} for h in host
                            if inside(h) and not h["name"].startswith("ovz_iter#")],
            "runtime_sync_calls": [{"name": r["name"], "ts": r["ts"], "correlation": r["args"].get("correlation")}
                                   for r in runtime if inside(r) and r["name"] in
                                   ("cudaEventRecord", "cudaEventRecordWithFlags", "cudaStreamWaitEvent")],
            "cuda_sync": [{"name": s["name"], "ts": s["ts"], **s.get("args", {})} for s in syncs if inside(s)],
        }
        out.append(row)
    return out


def brief(row: dict) -> str:
    """One line of :func:`evidence`: the comm's start after its launch, after the kernel before it, after the GEMM."""
    c, g, p = row["comm"], row["gemm"], row["prev_on_stream"]
    parts = [f"{row['iteration']} comm s{c['stream']} start-launch {row['start_minus_launch_us']}us"]
    parts.append(f"prev {p['name'][:24]} start-prevend {p['comm_start_minus_prev_end_us']}us" if p else "prev none")
    if g:
        parts.append(f"gemm s{g['stream']} grid {g['grid']} resident/SM {g['resident_blocks_per_sm_cuda']} "
                     f"dur {g['dur_us']}us "
                     f"start-gemmend {g['comm_start_minus_gemm_end_us']}us")
    for s in row["cuda_sync"]:
        if s["name"] == "Stream Wait Event":
            parts.append(f"SWE(stream {s.get('stream')} waits {s.get('wait_on_stream')} rec_corr "
                         f"{s.get('wait_on_cuda_event_record_corr_id')})")
    parts.extend(f"{h['name']} {h['dur_us']}us" for h in row["host_ranges"])
    return " | ".join(parts)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m overlapviz.collectors.scenarios", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--scenario", help=f"all, or a comma-separated list of: {', '.join(SCENARIOS)}")
    what.add_argument("--evidence", metavar="RUN_DIR", help="print what a recorded run's trace shows, as JSON")
    p.add_argument("--brief", action="store_true", help="with --evidence: one line per traced iteration")
    p.add_argument("--out", help="output directory: runs go to OUT/runs/<run_id>/")
    p.add_argument("--sync-events", choices=("both", "on", "off"), default="both",
                   help="record with Kineto's CUDA sync events, without, or both (default)")
    p.add_argument("--list", action="store_true", help="print the run ids and their state, run nothing")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.evidence:
        rows = evidence(args.evidence)
        if args.brief:
            for row in rows:
                print(f"{Path(args.evidence).name} {brief(row)}")
        else:
            print(json.dumps(rows, indent=1))
        return 0
    try:
        chosen = select(args.scenario)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if not args.out:
        print("error: --out is required with --scenario", file=sys.stderr)
        return 2
    sync = {"both": (True, False), "on": (True,), "off": (False,)}[args.sync_events]
    if args.list:
        for sc in chosen:
            for s in sync:
                rid = run_id(sc.name, s)
                print(f"{rid}\t{mf.run_status(Path(args.out) / RUNS_DIR / rid) or 'todo'}")
        return 0
    results = run_all(chosen, args.out, sync_events=sync, log=lambda m: print(m, flush=True))
    return 1 if any(status == "failed" for _, status, _ in results) else 0


if __name__ == "__main__":
    sys.exit(main())
