"""Occupancy: the one owner of how many blocks of a kernel fit on one SM (NVIDIA) or CU (AMD), which resource limits them, and what still fits beside them.

NVIDIA follows CUDA's ``cuda_occupancy.h`` (the rules behind
``cudaOccupancyMaxActiveBlocksPerMultiprocessor``) and was checked row by row against
the driver on an H200 (tests/data/occupancy_h200/). AMD follows LLVM's AMDGPU
occupancy rules (``AMDGPUBaseInfo.cpp``). Resource names are the same for both
vendors: ``warps`` (warp / wave slots), ``blocks`` (block slots; on AMD the
workgroup barrier limit), ``registers`` (VGPRs on AMD), ``sgprs`` (AMD gfx9 only),
``shared_memory`` (LDS on AMD).
"""

from __future__ import annotations

import numpy as np
import pandas as pd


RESOURCES = ("warps", "blocks", "registers", "sgprs", "shared_memory")
FIT_RESOURCES = ("warps", "blocks", "registers", "shared_memory")
UNLIMITED = np.iinfo(np.int64).max // 4  # a resource the kernel does not use never limits


def _ceil_div(a, b):
    return -(-np.asarray(a, np.int64) // np.asarray(b, np.int64))


def _round_up(a, b):
    return _ceil_div(a, b) * np.asarray(b, np.int64)


def _col(x, n: int) -> np.ndarray:
    a = np.asarray(x, dtype=np.int64)
    return np.broadcast_to(a, (n,)).copy() if a.ndim == 0 else a.astype(np.int64)


def _carveout_up(size: np.ndarray, carveouts: tuple[int, ...]) -> np.ndarray:
    """The smallest carve-out (bytes) >= ``size``; sizes above the largest keep their value.

    ``cudaOccAlignUpShmemSizeVoltaPlus``: the unified L1/shared memory of sm_70+ is
    configured in steps, and a request is rounded up to the next step.
    """
    steps = np.asarray(sorted(carveouts), np.int64)
    if len(steps) == 0:
        return size
    idx = np.searchsorted(steps, size, side="left")
    return np.where(idx < len(steps), steps[np.minimum(idx, len(steps) - 1)], size)


def _nvidia(limits: dict, threads, regs, smem, *, carveout, optin) -> dict:
    """Per-resource block limits by CUDA's rules (``cuda_occupancy.h``, CUDA 12/13).

    * warps: ``(max_threads_per_sm / 32) // ceil(threads / 32)``; 0 when ``threads`` exceeds
      the block limit.
    * registers: a warp's registers are ``regs * 32`` rounded up to the allocation unit
      (256); the register file is split between 4 sub-partitions and each holds
      ``(regs_per_sm / 4) // regs_per_warp`` warps, so the SM holds 4x that and
      ``// warps_per_block`` blocks. A block whose warps, rounded up to a multiple of 4,
      need more than ``regs_per_block`` registers cannot launch (the hardware check).
    * shared memory: a block takes its static + dynamic bytes plus the per-block
      reservation (1 KB from sm_80), rounded up to 128 B. The SM's shared memory is the
      carve-out: the preferred fraction of the largest carve-out (default: the largest),
      rounded up to a configurable step, or, when one block needs more than that, the
      smallest step that holds one block. Above ``shared_mem_per_block`` (48 KB) a block
      needs the per-function opt-in (``optin=True``), up to ``shared_mem_per_block_optin``.
    * the configuration the SM is left in (``shared_mem_config``): with a preference, the
      carve-out above; with none, occupancy is counted with the largest carve-out but the
      driver configures the smallest step >= resident blocks x allocation per block
      (the kernel's maximum occupancy at the least shared memory), so a kernel launched
      later fits beside it only within what remains of that step.
    * ``shared_mem_config_needed``: a kernel joins an SM already configured (by resident
      blocks of another kernel) only if that configuration is at least the driver's own
      choice for it (the default rule above, or its preference if larger); a kernel that
      declares no shared memory joins any SM.
    * blocks: ``max_blocks_per_sm``.
    """
    n = len(threads)
    warp = int(limits["warp_size"])
    warps_per_block = _ceil_div(threads, warp)
    max_warps = int(limits["max_threads_per_sm"]) // warp
    by_warps = np.where(threads > int(limits["max_threads_per_block"]), 0, max_warps // np.maximum(warps_per_block, 1))
    by_blocks = np.full(n, int(limits["max_blocks_per_sm"]), np.int64)

    unit, parts = int(limits["reg_alloc_unit"]), int(limits["sub_partitions"])
    regs_per_warp = _round_up(regs * warp, unit)
    assumed = regs_per_warp * _round_up(warps_per_block, parts)
    fits = (regs <= int(limits["max_regs_per_thread"])) & (assumed <= int(limits["regs_per_block"]))
    warps_per_part = (int(limits["regs_per_sm"]) // parts) // np.maximum(regs_per_warp, 1)
    by_regs = np.where(regs == 0, UNLIMITED, np.where(fits, warps_per_part * parts // warps_per_block, 0))

    reserved = int(limits["reserved_shared_mem_per_block"])
    smem_alloc = _round_up(smem + reserved, int(limits["shared_mem_alloc_unit"]))
    per_block = int(limits["shared_mem_per_block_optin"] if optin else limits["shared_mem_per_block"])
    sm_total = int(limits["shared_mem_per_sm"])
    # steps above what this SM reports do not exist on it; its own size is always a step
    carve = tuple(sorted({c for c in (limits.get("carveouts_bytes") or ()) if c <= sm_total} | {sm_total}))
    no_preference = carveout is None or carveout < 0
    if no_preference:
        preferred = _carveout_up(np.full(n, sm_total, np.int64), carve)
    else:
        preferred = _carveout_up(np.full(n, int(carveout) * sm_total // 100, np.int64), carve)
    config = np.where(preferred >= smem_alloc, preferred, _carveout_up(smem_alloc, carve))
    by_smem = np.where(
        smem_alloc > per_block + reserved,
        0,
        np.where(smem_alloc > 0, config // np.maximum(smem_alloc, 1), UNLIMITED),
    )
    # the driver's own choice for the kernel, whatever its preference (see below)
    resident = np.minimum.reduce([by_warps, by_blocks, by_regs, by_smem if no_preference else
                                  np.where(smem_alloc > per_block + reserved, 0, sm_total // np.maximum(smem_alloc, 1))])
    default_config = np.minimum(_carveout_up(np.maximum(resident, 1) * smem_alloc, carve), sm_total)
    if no_preference:
        # Occupancy is counted with the largest carve-out (what cudaOccupancy* report), but the
        # driver then configures the SM with the smallest step that still holds the kernel's
        # resident blocks (CUDA C Programming Guide, "Shared Memory" of compute capability
        # 7.x-9.0: it sizes the carve-out "to avoid shared memory occupancy bottlenecks");
        # evidence on an H200: tests/data/h200_carveout_check.
        config = np.where(smem_alloc > 0, default_config, config)
    # A kernel launched beside resident blocks joins only an SM configured at least as large as
    # the driver's own choice for it (its preference does not lower that); one that declares no
    # shared memory joins any (H200 probe: tests/data/carveout_coresidency_h200).
    needed = np.where(smem > 0, np.maximum(default_config, config), 0)
    return {
        "warps_per_block": warps_per_block,
        "max_warps_per_sm": np.full(n, max_warps, np.int64),
        "by": {"warps": by_warps, "blocks": by_blocks, "registers": by_regs, "shared_memory": by_smem},
        "regs_per_block_allocated": regs_per_warp * warps_per_block,
        "shared_mem_per_block_allocated": smem_alloc,
        "shared_mem_config": config,
        "shared_mem_config_needed": needed,
    }


def _amd_sgpr_waves(sgprs: np.ndarray, max_waves: int) -> np.ndarray:
    # LLVM getOccupancyWithNumSGPRs, gfx8/gfx9 (800 SGPRs per SIMD)
    w = np.select([sgprs <= 80, sgprs <= 88, sgprs <= 100], [10, 9, 8], 7)
    return np.minimum(w, max_waves)


def _amd(limits: dict, threads, regs, smem, *, sgprs, accum_vgprs, wave_size) -> dict:
    """Per-resource workgroup limits by LLVM's AMDGPU rules (``AMDGPUBaseInfo.cpp``).

    * waves: a workgroup has ``ceil(threads / wave)`` waves; a CU (RDNA: a WGP in HIP's
      default WGP mode) holds ``max_waves_per_simd * simds`` waves.
    * VGPRs (``getNumWavesPerEUWithNumVGPRs``): waves per SIMD =
      ``vgprs_per_simd // round_up(vgprs, granule)``, at most ``max_waves_per_simd``. On
      gfx90a/gfx94x/gfx950 ArchVGPRs and AccVGPRs share one file:
      ``round_up(arch, 4) + accum``; on gfx908 the two files are separate and the
      larger one counts.
    * SGPRs (gfx9 only, ``getOccupancyWithNumSGPRs``): <= 80: 10 waves, <= 88: 9,
      <= 100: 8, else 7. gfx10+ gives every wave its SGPRs.
    * LDS: rounded up to 512 B; the CU's LDS // that.
    * workgroups (``getMaxWorkGroupsPerCU``): a one-wave workgroup takes no barrier;
      otherwise at most 16 per CU (gfx9) or 32 per WGP (gfx10+).
    Per-SIMD limits become per-CU workgroup limits as ``waves_per_simd * simds //
    waves_per_workgroup`` (a workgroup's waves spread over the CU's SIMDs).
    """
    n = len(threads)
    wave = int(wave_size or limits["warp_size"])
    simds = int(limits["simds_per_cu"])
    max_waves = int(limits["max_waves_per_simd"])
    wpb = _ceil_div(threads, wave)
    cu_waves = max_waves * simds
    by_warps = np.where(threads > int(limits["max_threads_per_block"]), 0, cu_waves // np.maximum(wpb, 1))
    slots = 16 if str(limits.get("arch", "")).startswith("gfx9") else 32
    by_blocks = np.where(wpb <= 1, cu_waves, np.minimum(cu_waves // np.maximum(wpb, 1), slots))

    granule, total = int(limits["vgpr_alloc_unit"]), int(limits["vgprs_per_simd"])
    accum = _col(0 if accum_vgprs is None else accum_vgprs, n)
    if limits.get("unified_vgprs"):
        vgprs = np.where(accum > 0, _round_up(regs, 4) + accum, regs)
    else:
        vgprs = np.maximum(regs, accum)
    rounded = _round_up(np.maximum(vgprs, 1), granule)
    simd_waves = np.where(vgprs < granule, max_waves, np.minimum(np.maximum(total // rounded, 1), max_waves))
    simd_waves = np.where(vgprs > min(total, 512), 0, simd_waves)
    by_regs = np.where(regs == 0, UNLIMITED, simd_waves * simds // np.maximum(wpb, 1))

    if sgprs is not None and limits.get("sgprs_per_simd"):
        sg = _col(sgprs, n)
        by_sgprs = np.where(sg > 0, _amd_sgpr_waves(sg, max_waves) * simds // np.maximum(wpb, 1), UNLIMITED)
    else:
        by_sgprs = np.full(n, UNLIMITED, np.int64)

    lds_alloc = _round_up(smem, int(limits.get("lds_alloc_unit", 512)))
    lds_cu = int(limits.get("lds_per_cu") or limits["shared_mem_per_sm"])
    by_smem = np.where(
        lds_alloc > int(limits["shared_mem_per_block"]),
        0,
        np.where(lds_alloc > 0, lds_cu // np.maximum(lds_alloc, 1), UNLIMITED),
    )
    return {
        "warps_per_block": wpb,
        "max_warps_per_sm": np.full(n, cu_waves, np.int64),
        "by": {"warps": by_warps, "blocks": by_blocks, "registers": by_regs, "sgprs": by_sgprs, "shared_memory": by_smem},
        "regs_per_block_allocated": rounded * wpb,
        "shared_mem_per_block_allocated": lds_alloc,
        "shared_mem_config": np.full(n, lds_cu, np.int64),
        "shared_mem_config_needed": np.zeros(n, np.int64),
    }


def occupancy_table(
    limits: dict,
    threads_per_block,
    regs_per_thread,
    shared_mem_bytes,
    *,
    carveout: int | None = None,
    optin: bool = True,
    sgprs=None,
    accum_vgprs=None,
    wave_size: int | None = None,
) -> pd.DataFrame:
    """Vectorized :func:`occupancy` over arrays of launch shapes (one row each).

    Returns a frame with ``blocks_per_sm``, ``limiter``, ``occupancy``,
    ``warps_per_block``, ``active_warps``, one ``blocks_limit_<resource>`` column per
    resource (null: the kernel does not use it), ``regs_per_block_allocated``,
    ``shared_mem_per_block_allocated`` and ``shared_mem_config`` (the SM's shared memory
    under the chosen carve-out) and ``shared_mem_config_needed`` (the least configuration
    of an SM the kernel's blocks join beside others' blocks; 0: any).
    """
    threads = np.atleast_1d(np.asarray(threads_per_block, np.int64))
    n = len(threads)
    regs = _col(regs_per_thread, n)
    smem = _col(shared_mem_bytes, n)
    if limits["vendor"] == "nvidia":
        res = _nvidia(limits, threads, regs, smem, carveout=carveout, optin=optin)
    else:
        res = _amd(limits, threads, regs, smem, sgprs=sgprs, accum_vgprs=accum_vgprs, wave_size=wave_size)
    by = res["by"]
    names = [r for r in RESOURCES if r in by]
    stack = np.vstack([by[r] for r in names])
    blocks = stack.min(axis=0)
    # ties: the first resource in RESOURCES order (slots before registers before memory)
    limiter = np.asarray(names, dtype=object)[stack.argmin(axis=0)]
    wpb = res["warps_per_block"]
    out = pd.DataFrame(
        {
            "threads_per_block": threads,
            "regs_per_thread": regs,
            "shared_mem_bytes": smem,
            "blocks_per_sm": blocks,
            "limiter": limiter,
            "occupancy": blocks * wpb / res["max_warps_per_sm"],
            "warps_per_block": wpb,
            "active_warps": blocks * wpb,
            "max_warps_per_sm": res["max_warps_per_sm"],
        }
    )
    for r in RESOURCES:
        col = by.get(r)
        if col is None:
            out[f"blocks_limit_{r}"] = pd.array([pd.NA] * n, dtype="Int64")
        else:
            out[f"blocks_limit_{r}"] = pd.Series(col, dtype="Int64").mask(col >= UNLIMITED).array
    out["regs_per_block_allocated"] = res["regs_per_block_allocated"]
    out["shared_mem_per_block_allocated"] = res["shared_mem_per_block_allocated"]
    out["shared_mem_config"] = res["shared_mem_config"]
    out["shared_mem_config_needed"] = res["shared_mem_config_needed"]
    return out


def occupancy(
    limits: dict,
    threads_per_block: int,
    regs_per_thread: int,
    shared_mem_bytes: int,
    *,
    carveout: int | None = None,
    optin: bool = True,
    sgprs: int | None = None,
    accum_vgprs: int | None = None,
    wave_size: int | None = None,
) -> dict:
    """Resident blocks of one kernel per SM (NVIDIA) or CU (AMD), and what limits them.

    Parameters
    ----------
    limits
        A device's limits, as :func:`overlapviz.domain.devices.device_limits` returns them.
    threads_per_block
        Threads (work-items) per block.
    regs_per_thread
        Registers per thread (AMD: ArchVGPRs per work-item); 0 means none.
    shared_mem_bytes
        Static + dynamic shared memory (AMD: LDS) per block, bytes, without the driver's
        per-block reservation (added here).
    carveout
        NVIDIA: the preferred shared-memory carve-out, percent of the largest
        (``cudaFuncAttributePreferredSharedMemoryCarveout``); None or -1: no preference.
    optin
        NVIDIA: the kernel opted in to more than 48 KB of dynamic shared memory per block
        (any kernel that ran with more did). False reproduces the profiler's
        calculation, which assumes no opt-in.
    sgprs, accum_vgprs, wave_size
        AMD: scalar registers per wave, AccVGPRs per work-item, wave size (default: the
        device's).

    Returns
    -------
    dict
        ``blocks_per_sm`` (0: the block cannot launch), ``limiter`` (one of ``warps``,
        ``blocks``, ``registers``, ``sgprs``, ``shared_memory``; ties go to the first of
        that list), ``occupancy`` (resident warps / the SM's warp slots, 0..1),
        ``warps_per_block``, ``active_warps``, ``blocks_limit_<resource>`` (None where the
        kernel does not use the resource), ``regs_per_block_allocated``,
        ``shared_mem_per_block_allocated`` (bytes, reservation and rounding included),
        ``shared_mem_config`` (bytes of shared memory the SM is configured with when the
        kernel lands on an idle SM), ``shared_mem_config_needed`` (bytes: the least
        configuration of an SM that its blocks join while other blocks are resident).
    """
    for name, value in (("threads_per_block", threads_per_block), ("regs_per_thread", regs_per_thread), ("shared_mem_bytes", shared_mem_bytes)):
        if value is None or pd.isna(value) or int(value) < 0:
            raise ValueError(f"{name} must be a non-negative integer, not {value!r}")
    if int(threads_per_block) == 0:
        raise ValueError("threads_per_block must be at least 1")
    row = occupancy_table(
        limits,
        [int(threads_per_block)],
        int(regs_per_thread),
        int(shared_mem_bytes),
        carveout=carveout,
        optin=optin,
        sgprs=sgprs,
        accum_vgprs=accum_vgprs,
        wave_size=wave_size,
    ).iloc[0]
    out = {}
    for key, value in row.items():
        if value is pd.NA:
            out[key] = None
        elif isinstance(value, (np.integer,)):
            out[key] = int(value)
        elif isinstance(value, (np.floating,)):
            out[key] = float(value)
        else:
            out[key] = value
    return out


def profiler_estimated_occupancy(limits: dict, threads_per_block, regs_per_thread, shared_mem_bytes, grid_blocks) -> np.ndarray:
    """Kineto's ``est. achieved occupancy %`` recomputed (for cross-checks).

    Kineto (``CuptiActivity``) runs ``cudaOccMaxActiveBlocksPerMultiprocessor`` with no
    shared-memory opt-in, caps the result at its ``blocks per SM`` field (grid blocks /
    SMs, not a residency) and reports ``round(100 * blocks * threads / max_threads_per_sm)``.
    A kernel with more than 48 KB of shared memory therefore reads 0 %.
    """
    occ = occupancy_table(limits, threads_per_block, regs_per_thread, shared_mem_bytes, optin=False)
    per_sm = np.asarray(grid_blocks, np.float64) / float(limits["num_sms"])
    blocks = np.minimum(occ["blocks_per_sm"].to_numpy(np.float64), per_sm)
    return np.round(100.0 * blocks * occ["threads_per_block"].to_numpy() / float(limits["max_threads_per_sm"]))


def occupancy_with_preference(limits: dict, names, threads, regs, smem, preference: tuple | None = None, **kw) -> pd.DataFrame:
    """:func:`occupancy_table` for kernels of one run, the run's carve-out preference applied to the kernels it names.

    ``preference`` is one value of :func:`run_carveouts` (None: no preference anywhere);
    ``names`` the kernels' names, row by row.
    """
    table = occupancy_table(limits, threads, regs, smem, **kw)
    pref, _note, applies = preference or (None, None, frozenset())
    if pref is None or not applies:
        return table
    use = pd.Series(names).isin(applies).to_numpy(bool)
    if not use.any():
        return table
    preferred = occupancy_table(limits, threads, regs, smem, carveout=pref, **kw)
    return table.mask(np.broadcast_to(use[:, None], table.shape), preferred)


def limits_for(dev_limits: dict, run_id, rank, device):
    """The limits of ``(run_id, rank, device)`` in :func:`overlapviz.analysis.residency.device_table`'s dict (a str: why none), None when absent; a trace that did not say which device gets its rank's only device."""
    hit = dev_limits.get((run_id, rank, device))
    if hit is None:  # a trace that did not say which device: the rank's only device
        cands = [v for (r, k, _d), v in dev_limits.items() if r == run_id and k == rank]
        hit = cands[0] if len(cands) == 1 else None
    if hit is None:  # the user said which GPU (--device-name): every rank without a row of its own
        hit = dev_limits.get(("*", -1, None))
    return hit


def kernel_occupancy(kernels: pd.DataFrame, dev_limits: dict, carveouts: dict | None = None) -> pd.DataFrame:
    """Occupancy and per-block resource costs of each kernel (rows with ``threads_per_block``): the one per-kernel computation.

    Adds ``blocks_per_sm`` (occupancy alone), ``limiter``, ``occupancy``, ``warps_per_block``,
    ``regs_per_warp`` (registers a warp is allocated; AMD: VGPRs a wave is allocated),
    ``smem_alloc_bytes`` (per block, with reservation and rounding), ``smem_config_bytes``
    (the SM's shared memory as the driver configures it for the kernel: under the run's
    carve-out preference from ``carveouts`` = :func:`overlapviz.analysis.residency.run_carveouts`,
    or with none, the smallest carve-out step that holds the kernel's resident blocks),
    ``smem_config_needed_bytes`` (the least configuration of an SM its blocks join beside
    others') and ``num_sms``. Columns are null where the shape or the device's limits are
    unknown; ``residency_note`` says why. ``kernels`` needs ``run_id, rank, device, name,
    threads_per_block, regs_per_thread, shared_mem_bytes`` (``sgprs``, ``accum_vgprs``
    where known); it is not modified.
    """
    n = len(kernels)
    cols = {
        "blocks_per_sm": np.full(n, np.nan),
        "limiter": np.full(n, None, dtype=object),
        "occupancy": np.full(n, np.nan),
        "warps_per_block": np.full(n, np.nan),
        "regs_per_warp": np.full(n, np.nan),
        "smem_alloc_bytes": np.full(n, np.nan),
        "smem_config_bytes": np.full(n, np.nan),
        "smem_config_needed_bytes": np.full(n, np.nan),
        "num_sms": np.full(n, np.nan),
        "residency_note": np.full(n, None, dtype=object),
    }
    if n:
        keys = pd.DataFrame(
            {"run_id": kernels["run_id"].to_numpy(), "rank": kernels["rank"].astype(int).to_numpy(),
             "device": kernels["device"].astype("Int64").fillna(-1).to_numpy()}
        )
        for (run_id, rank, device), idx in keys.groupby(["run_id", "rank", "device"]).indices.items():
            lim = limits_for(dev_limits, run_id, int(rank), None if device < 0 else int(device))
            if not isinstance(lim, dict):
                cols["residency_note"][idx] = lim or (f"no devices row for run {run_id} rank {rank}: the trace does not say which GPU "
                                                      "it ran on (give --device-name)")
                continue
            part = kernels.iloc[idx]
            threads = part["threads_per_block"].fillna(0).to_numpy(np.int64)
            ok = threads > 0
            # registers bound every vendor's residency: unknown registers, unknown residency
            ok &= part["regs_per_thread"].notna().to_numpy()
            cols["residency_note"][idx[~ok]] = "launch shape incomplete in the trace (block size or registers missing)"
            if not ok.any():
                continue
            sel = part[ok]
            t = occupancy_with_preference(
                lim,
                sel["name"].to_numpy(object),
                threads[ok],
                sel["regs_per_thread"].fillna(0).to_numpy(np.int64),
                sel["shared_mem_bytes"].fillna(0).to_numpy(np.int64),
                sgprs=sel["sgprs"].fillna(0).to_numpy(np.int64) if "sgprs" in sel else None,
                accum_vgprs=sel["accum_vgprs"].fillna(0).to_numpy(np.int64) if "accum_vgprs" in sel else None,
                preference=(carveouts or {}).get(run_id),
            )
            where = idx[ok]
            cols["blocks_per_sm"][where] = t["blocks_per_sm"]
            cols["limiter"][where] = t["limiter"]
            cols["occupancy"][where] = t["occupancy"]
            cols["warps_per_block"][where] = t["warps_per_block"]
            cols["regs_per_warp"][where] = t["regs_per_block_allocated"] / t["warps_per_block"]
            cols["smem_alloc_bytes"][where] = t["shared_mem_per_block_allocated"]
            cols["smem_config_bytes"][where] = t["shared_mem_config"]
            cols["smem_config_needed_bytes"][where] = t["shared_mem_config_needed"]
            if lim.get("num_sms"):
                cols["num_sms"][where] = lim["num_sms"]
    return kernels.assign(**cols)


# --- what fits beside resident blocks ---------------------------------------------------


def capacity(limits: dict) -> dict:
    """An SM's (CU's) capacity in the units :func:`blocks_fit` uses.

    ``warps`` (warp / wave slots), ``blocks`` (block slots; AMD: workgroup barriers),
    ``reg_parts`` and ``regs_per_part`` (NVIDIA: 4 register-file sub-partitions of
    ``regs_per_sm / 4``; AMD: one VGPR file of ``vgprs_per_simd`` per SIMD), and
    ``shared_mem_per_sm`` (NVIDIA: the largest carve-out; AMD: the LDS).
    """
    if limits["vendor"] == "nvidia":
        parts, per_part = int(limits["sub_partitions"]), int(limits["regs_per_sm"]) // int(limits["sub_partitions"])
        warps = int(limits["max_threads_per_sm"]) // int(limits["warp_size"])
        blocks = int(limits["max_blocks_per_sm"])
        smem = int(limits["shared_mem_per_sm"])
    else:
        parts, per_part = int(limits["simds_per_cu"]), int(limits["vgprs_per_simd"])
        warps = int(limits["max_waves_per_simd"]) * parts
        blocks = 16 if str(limits.get("arch", "")).startswith("gfx9") else 32
        smem = int(limits.get("lds_per_cu") or limits["shared_mem_per_sm"])
    return {"warps": warps, "blocks": blocks, "reg_parts": parts, "regs_per_part": per_part, "shared_mem_per_sm": smem}


def blocks_fit(cap: dict, used_warps, used_blocks, used_regs, used_smem, smem_config, warps_per_block, regs_per_warp, smem_alloc,
               own_config=None):
    """How many blocks of one kernel fit on an SM beside resident blocks of others (vectorized).

    Parameters
    ----------
    cap
        :func:`capacity` of the device.
    used_warps, used_blocks, used_regs, used_smem
        What resident blocks already hold on the SM: warps, block slots, allocated
        registers (warps x registers per warp) and shared memory bytes.
    smem_config
        The SM's shared memory under its current carve-out, bytes.
    warps_per_block, regs_per_warp, smem_alloc
        The newcomer's footprint per block.
    own_config
        NVIDIA: the least SM configuration the newcomer's blocks join
        (``shared_mem_config_needed`` of :func:`occupancy`). None: not
        checked. Where it exceeds ``smem_config`` no block fits: the SM cannot grow its
        carve-out while the resident blocks run (measured on an H200:
        tests/data/carveout_coresidency_h200).

    Returns
    -------
    (numpy.ndarray, numpy.ndarray, dict)
        Blocks that fit (>= 0), the limiting resource (``warps``, ``blocks``,
        ``registers``, ``shared_memory``; ties to the first; ``shared_memory_carveout``
        where shared memory limits and the SM's largest carve-out would hold more: the
        configuration the resident kernel left, not the hardware, stops the blocks, or
        where ``own_config`` exceeds it), and the per-resource counts.

    Notes
    -----
    Registers follow the occupancy rule per register-file part: resident warps are
    spread evenly over the parts, so each part has ``regs_per_part - ceil(used_regs /
    parts)`` left and takes ``that // regs_per_warp`` more warps; the SM takes
    ``parts x that // warps_per_block`` blocks. With nothing resident this is exactly
    the occupancy calculator's register limit.
    """
    f = lambda a: np.asarray(a, np.float64)  # noqa: E731  (NaN-aware arithmetic)
    wpb, rpw, salloc = f(warps_per_block), f(regs_per_warp), f(smem_alloc)
    parts = cap["reg_parts"]
    by = {
        "warps": np.floor((cap["warps"] - f(used_warps)) / wpb),
        "blocks": cap["blocks"] - f(used_blocks),
        "registers": np.where(
            rpw > 0,
            np.floor(np.floor((cap["regs_per_part"] - np.ceil(f(used_regs) / parts)) / np.where(rpw > 0, rpw, 1)) * parts / wpb),
            np.inf,
        ),
        "shared_memory": np.where(salloc > 0, np.floor((f(smem_config) - f(used_smem)) / np.where(salloc > 0, salloc, 1)), np.inf),
    }
    stack = np.vstack([np.maximum(by[r], 0) for r in FIT_RESOURCES])
    nan = np.isnan(stack).any(axis=0)
    fit = np.where(nan, np.nan, np.nanmin(np.where(np.isnan(stack), np.inf, stack), axis=0))
    limiter = np.asarray(FIT_RESOURCES, dtype=object)[np.argmin(np.where(np.isnan(stack), np.inf, stack), axis=0)]
    if own_config is not None:  # a resource that already stops every block keeps its name (ties to the first)
        above = (f(own_config) > f(smem_config)) & ~nan & (fit > 0)
        fit = np.where(above, 0.0, fit)
        limiter = np.where(above, "shared_memory_carveout", limiter)
    largest = cap.get("shared_mem_per_sm")
    if largest is not None:
        by_largest = np.where(salloc > 0, np.floor((largest - f(used_smem)) / np.where(salloc > 0, salloc, 1)), np.inf)
        limiter = np.where((limiter == "shared_memory") & (by_largest > by["shared_memory"]), "shared_memory_carveout", limiter)
    limiter = np.where(nan, None, limiter)
    return fit, limiter, by
