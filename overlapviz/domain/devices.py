"""Per-architecture resource limits of NVIDIA SMs and AMD CUs, and completion of a dataset's devices rows.

Sources (checked 2026-12):

* NVIDIA: CUDA C++ Programming Guide, "Technical Specifications per Compute
  Capability" (threads, resident blocks, registers, shared memory per SM and per
  block) and CUDA's ``cuda_occupancy.h`` (allocation granularities, sub-partitions,
  the shared-memory carve-out sizes, the 1 KB per-block reservation from sm_80 on).
  The sm_90 row (H100/H200) is checked against the driver on an H200:
  tests/data/occupancy_h200/PROVENANCE.md.
* AMD: LLVM's ``AMDGPUBaseInfo.cpp`` (``getMaxWavesPerEU``, ``getVGPRAllocGranule``,
  ``getTotalNumVGPRs``, ``getOccupancyWithNumSGPRs``, ``getMaxWorkGroupsPerCU``,
  ``getLocalMemorySize``) and AMD's CDNA2/CDNA3/CDNA4 ISA guides (LDS per CU).
"""

from __future__ import annotations

import math
import re


KB = 1024

# --- NVIDIA, per compute capability ---------------------------------------------
# threads/SM, resident blocks/SM, shared memory per SM (the largest carve-out),
# opt-in shared memory per block, and the carve-outs the unified L1/shared can take.
_CARVE_V100 = (0, 8, 16, 32, 64, 96)
_CARVE_A100 = (0, 8, 16, 32, 64, 100, 132, 164)
_CARVE_GA10X = (0, 8, 16, 32, 64, 100)
_CARVE_H100 = (0, 8, 16, 32, 64, 100, 132, 164, 196, 228)

_NV = {
    # (major, minor): (threads/SM, blocks/SM, smem/SM KB, optin/block KB, carveouts KB)
    (7, 0): (2048, 32, 96, 96, _CARVE_V100),
    (7, 2): (2048, 32, 96, 96, _CARVE_V100),
    (7, 5): (1024, 16, 64, 64, (32, 64)),
    (8, 0): (2048, 32, 164, 163, _CARVE_A100),
    (8, 6): (1536, 16, 100, 99, _CARVE_GA10X),
    (8, 7): (1536, 16, 164, 163, _CARVE_A100),
    (8, 9): (1536, 24, 100, 99, _CARVE_GA10X),
    (9, 0): (2048, 32, 228, 227, _CARVE_H100),
    (10, 0): (2048, 32, 228, 227, _CARVE_H100),
    (10, 3): (2048, 32, 228, 227, _CARVE_H100),
    (12, 0): (1536, 32, 100, 99, _CARVE_GA10X),
}

# SM counts by product (the trace's numSms wins; this fills traces that lack it)
_NV_SMS = (
    (r"GH200|H200", 132),
    (r"H100.*PCIe", 114),
    (r"H100", 132),
    (r"H800", 132),
    (r"H20\b", 78),
    (r"B200", 148),
    (r"A100", 108),
    (r"A800", 108),
    (r"A40\b", 84),
    (r"A30\b", 56),
    (r"A10\b", 72),
    (r"L40S", 142),
    (r"L40\b", 142),
    (r"L4\b", 58),
    (r"RTX 4090", 128),
    (r"RTX 3090", 82),
    (r"V100", 80),
    (r"T4\b", 40),
)
_NV_NAME_CC = (
    (r"H200|H100|H800|H20\b|GH200", (9, 0)),
    (r"B200|GB200|B100", (10, 0)),
    (r"A100|A800|A30\b", (8, 0)),
    (r"A40\b|A10\b|RTX 30|RTX A\d", (8, 6)),
    (r"L40|L4\b|RTX 40|RTX \d000 Ada", (8, 9)),
    (r"RTX 50", (12, 0)),
    (r"V100", (7, 0)),
    (r"T4\b|RTX 20", (7, 5)),
)


def nvidia_arch(major: int, minor: int) -> dict:
    """The occupancy-relevant limits of one NVIDIA compute capability.

    Raises
    ------
    ValueError
        For a compute capability the table does not hold (never a guess).
    """
    key = (int(major), int(minor))
    if key not in _NV:
        known = ", ".join(f"{a}.{b}" for a, b in _NV)
        raise ValueError(f"compute capability {key[0]}.{key[1]} is not in overlapviz's tables (known: {known})")
    threads, blocks, smem_kb, optin_kb, carve = _NV[key]
    return {
        "vendor": "nvidia",
        "arch": f"sm_{key[0]}{key[1]}",
        "compute_major": key[0],
        "compute_minor": key[1],
        "warp_size": 32,
        "max_threads_per_sm": threads,
        "max_threads_per_block": 1024,
        "max_blocks_per_sm": blocks,
        "regs_per_sm": 65536,
        "regs_per_block": 65536,
        # cuda_occupancy.h: cudaOccRegAllocationMaxPerThread; 255 is the ISA's limit
        "max_regs_per_thread": 255,
        "reg_alloc_unit": 256,  # registers per warp are rounded up to this (cudaOccRegAllocationGranularity)
        "sub_partitions": 4,  # register file split in 4 (cudaOccSubPartitionsPerMultiprocessor)
        "shared_mem_per_sm": smem_kb * KB,
        "shared_mem_per_block": 48 * KB,
        "shared_mem_per_block_optin": optin_kb * KB,
        "reserved_shared_mem_per_block": KB if key[0] >= 8 else 0,  # cudaDevAttrReservedSharedMemoryPerBlock
        "shared_mem_alloc_unit": 128 if key[0] >= 8 else 256,  # cudaOccSMemAllocationGranularity
        "carveouts_bytes": tuple(c * KB for c in carve),
    }


# --- AMD, per gfx target -----------------------------------------------------------
# LLVM AMDGPUBaseInfo: max waves per SIMD (getMaxWavesPerEU), VGPRs per SIMD lane
# (getTotalNumVGPRs), VGPR allocation granule (getVGPRAllocGranule); LDS per CU.
_AMD = {
    # gfx: (family, waves/SIMD, VGPRs/SIMD, VGPR granule, wave size, LDS/CU KB, max LDS/block KB, SIMDs/CU)
    "gfx900": ("gcn5", 10, 256, 4, 64, 64, 64, 4),
    "gfx906": ("gcn5", 10, 256, 4, 64, 64, 64, 4),
    "gfx908": ("cdna1", 10, 256, 4, 64, 64, 64, 4),  # separate 256 ArchVGPR + 256 AccVGPR files
    "gfx90a": ("cdna2", 8, 512, 8, 64, 64, 64, 4),  # unified 512: ArchVGPRs then AccVGPRs
    "gfx940": ("cdna3", 8, 512, 8, 64, 64, 64, 4),
    "gfx941": ("cdna3", 8, 512, 8, 64, 64, 64, 4),
    "gfx942": ("cdna3", 8, 512, 8, 64, 64, 64, 4),
    "gfx950": ("cdna4", 8, 512, 8, 64, 160, 160, 4),
    # RDNA (wave32): residency per WGP (2 CUs = 4 SIMDs, LDS shared in WGP mode, HIP's default)
    "gfx1030": ("rdna2", 16, 1024, 16, 32, 128, 64, 4),
    "gfx1100": ("rdna3", 16, 1536, 24, 32, 128, 64, 4),
    "gfx1101": ("rdna3", 16, 1536, 24, 32, 128, 64, 4),
    "gfx1102": ("rdna3", 16, 1024, 16, 32, 128, 64, 4),
    "gfx1103": ("rdna3", 16, 1024, 16, 32, 128, 64, 4),
    "gfx1151": ("rdna3.5", 16, 1536, 24, 32, 128, 64, 4),
    "gfx1200": ("rdna4", 16, 1536, 24, 32, 128, 64, 4),
    "gfx1201": ("rdna4", 16, 1536, 24, 32, 128, 64, 4),
}
_AMD_NAME = (
    (r"MI355|MI350", "gfx950", 256),
    (r"MI325", "gfx942", 304),
    (r"MI300A", "gfx942", 228),
    (r"MI300", "gfx942", 304),
    (r"MI250X", "gfx90a", 110),
    (r"MI250|MI210", "gfx90a", 104),
    (r"MI100", "gfx908", 120),
    (r"MI60\b", "gfx906", 64),
    (r"MI50\b|Radeon VII", "gfx906", 60),
    (r"7900 XTX", "gfx1100", 48),
    (r"9070", "gfx1201", 32),
)
# HIP's major.minor for gfx targets (deviceProperties in ROCm Kineto traces)
_AMD_CC = {(9, 4): "gfx942", (9, 5): "gfx950", (9, 0): None}  # 9.0 is gfx908 or gfx90a: name decides


def amd_arch(gfx: str) -> dict:
    """The occupancy-relevant limits of one AMD gfx target (``gfx942``, ``gfx90a:sramecc+:xnack-``).

    Raises
    ------
    ValueError
        For a target the table does not hold.
    """
    base = str(gfx).split(":")[0].strip().lower()
    if base not in _AMD:
        raise ValueError(f"AMD target {gfx!r} is not in overlapviz's tables (known: {', '.join(_AMD)})")
    family, waves, vgprs, granule, wave, lds_kb, lds_block_kb, simds = _AMD[base]
    gfx9 = base.startswith("gfx9")
    return {
        "vendor": "amd",
        "arch": base,
        "family": family,
        "warp_size": wave,
        "simds_per_cu": simds,
        "max_waves_per_simd": waves,
        "max_threads_per_sm": waves * simds * wave,
        "max_threads_per_block": 1024,
        # getMaxWorkGroupsPerCU: 16 barriers per CU on gfx9, 32 per WGP on gfx10+
        "max_blocks_per_sm": 16 if gfx9 else 32,
        "vgprs_per_simd": vgprs,
        "vgpr_alloc_unit": granule,
        "unified_vgprs": base in ("gfx90a", "gfx940", "gfx941", "gfx942", "gfx950"),
        # getTotalNumSGPRs: 800 per SIMD on gfx8/9; gfx10+ gives every wave its SGPRs
        "sgprs_per_simd": 800 if gfx9 else None,
        "lds_per_cu": lds_kb * KB,
        "shared_mem_per_sm": lds_kb * KB,
        "shared_mem_per_block": lds_block_kb * KB,
        "shared_mem_per_block_optin": lds_block_kb * KB,
        "lds_alloc_unit": 512,  # COMPUTE_PGM_RSRC2.LDS_SIZE counts 128-dword blocks
        "regs_per_sm": vgprs * simds * wave,
        "regs_per_block": None,
    }


def _present(value) -> bool:
    if value is None or type(value).__name__ == "NAType":  # pandas.NA, without importing pandas
        return False
    return not (isinstance(value, float) and math.isnan(value))


def _clean(row: dict) -> dict:
    return {k: v for k, v in dict(row).items() if _present(v)}


def _vendor(row: dict) -> str:
    vendor = str(row.get("vendor", "")).lower()
    if vendor in ("nvidia", "amd"):
        return vendor
    arch = str(row.get("arch", "")).lower()
    if arch.startswith("sm_"):
        return "nvidia"
    if arch.startswith("gfx"):
        return "amd"
    name = str(row.get("name", ""))
    if re.search(r"AMD|Instinct|Radeon", name, re.I):
        return "amd"
    if re.search(r"NVIDIA|GeForce|Tesla|Quadro|RTX", name, re.I):
        return "nvidia"
    if row.get("warp_size") == 64:
        return "amd"
    raise ValueError(
        f"device {row.get('name')!r}: cannot tell NVIDIA from AMD (fields vendor, arch and name say nothing)"
    )


def _nvidia_table(row: dict) -> dict:
    arch = str(row.get("arch", ""))
    m = re.fullmatch(r"sm_(\d+?)(\d)[af]?", arch.lower())
    if "compute_major" in row and "compute_minor" in row:
        return nvidia_arch(row["compute_major"], row["compute_minor"])
    if m:
        return nvidia_arch(int(m.group(1)), int(m.group(2)))
    name = str(row.get("name", ""))
    for pattern, cc in _NV_NAME_CC:
        if re.search(pattern, name, re.I):
            return nvidia_arch(*cc)
    raise ValueError(f"device {name!r}: no compute_major/compute_minor or arch to look its limits up by")


def _amd_table(row: dict) -> dict:
    if row.get("arch"):
        return amd_arch(row["arch"])
    name = str(row.get("name", ""))
    for pattern, gfx, _cus in _AMD_NAME:
        if re.search(pattern, name, re.I):
            return amd_arch(gfx)
    cc = (row.get("compute_major"), row.get("compute_minor"))
    if _AMD_CC.get(cc):
        return amd_arch(_AMD_CC[cc])
    raise ValueError(f"device {name!r}: no arch (gfx target) or known product name to look its limits up by")


def _unit_count(row: dict, vendor: str) -> int | None:
    name = str(row.get("name", ""))
    table = _NV_SMS if vendor == "nvidia" else [(p, n) for p, _g, n in _AMD_NAME]
    for pattern, n in table:
        if re.search(pattern, name, re.I):
            return n
    return None


# the limits a trace may state itself; these win over the tables
_TRACE_FIELDS = (
    "num_sms",
    "max_threads_per_sm",
    "max_threads_per_block",
    "max_blocks_per_sm",
    "regs_per_sm",
    "regs_per_block",
    "shared_mem_per_sm",
    "shared_mem_per_block",
    "shared_mem_per_block_optin",
    "warp_size",
    "simds_per_cu",
    "max_waves_per_simd",
    "vgprs_per_simd",
    "sgprs_per_simd",
    "lds_per_cu",
)


def device_limits(devices_row: dict) -> dict:
    """Complete one ``schema.DEVICES`` row with the limits its trace did not record.

    Values present in the row win (they are what the device reported); missing ones come
    from the per-architecture tables of this module. The architecture is found from
    ``arch`` (``sm_90``, ``gfx942``), else ``compute_major``/``compute_minor`` (NVIDIA), else
    the product ``name``.

    Parameters
    ----------
    devices_row
        A mapping with ``schema.DEVICES`` keys; nulls (None, NaN, pd.NA) count as missing.

    Returns
    -------
    dict
        Every ``DEVICES`` limit plus the allocation rules the occupancy calculator needs
        (``reg_alloc_unit``, ``sub_partitions``, ``shared_mem_alloc_unit``,
        ``reserved_shared_mem_per_block``, ``carveouts_bytes``; AMD: ``vgpr_alloc_unit``,
        ``lds_alloc_unit``, ``unified_vgprs``), and ``limits_source``: for each limit,
        ``"trace"`` or ``"table"``. ``num_sms`` is null when neither the trace nor the
        product table knows it.

    Raises
    ------
    ValueError
        When the vendor or architecture cannot be determined, naming the fields read.
    """
    given = _clean(devices_row)
    row = given | ({"name": product_name(given["name"])} if "name" in given else {})  # "H100": its product's limits
    vendor = _vendor(row)
    table = _nvidia_table(row) if vendor == "nvidia" else _amd_table(row)
    out = dict(table)
    source = {k: "table" for k in table}
    table_sms = _unit_count(row, vendor)
    out["num_sms"] = table_sms
    source["num_sms"] = "table" if table_sms is not None else "missing"
    for field in _TRACE_FIELDS:
        if field in row:
            out[field] = int(row[field])
            source[field] = "trace"
    if vendor == "amd" and "lds_per_cu" in row and "shared_mem_per_sm" not in row:
        out["shared_mem_per_sm"] = int(row["lds_per_cu"])
    for key in ("name", "run_id", "rank", "device", "total_mem_bytes"):
        if key in given:
            out[key] = given[key]
    out["limits_source"] = source
    return out


# the GPU names people type (``--device-name H100``), each with the product name it stands for:
# the name the driver reports for the most common board (SXM where there are several)
SHORT_NAMES = (
    ("B200", "NVIDIA B200"),
    ("GH200", "NVIDIA GH200 480GB"),
    ("H200", "NVIDIA H200"),
    ("H100", "NVIDIA H100 80GB HBM3"),
    ("H100 PCIe", "NVIDIA H100 PCIe"),
    ("H800", "NVIDIA H800"),
    ("H20", "NVIDIA H20"),
    ("A100", "NVIDIA A100-SXM4-40GB"),
    ("A100 40GB", "NVIDIA A100-SXM4-40GB"),
    ("A100 80GB", "NVIDIA A100-SXM4-80GB"),
    ("A800", "NVIDIA A800-SXM4-80GB"),
    ("A40", "NVIDIA A40"),
    ("A30", "NVIDIA A30"),
    ("A10", "NVIDIA A10"),
    ("L40S", "NVIDIA L40S"),
    ("L40", "NVIDIA L40"),
    ("L4", "NVIDIA L4"),
    ("RTX 4090", "NVIDIA GeForce RTX 4090"),
    ("RTX 3090", "NVIDIA GeForce RTX 3090"),
    ("V100", "Tesla V100-SXM2-32GB"),
    ("T4", "Tesla T4"),
    ("MI355X", "AMD Instinct MI355X"),
    ("MI350X", "AMD Instinct MI350X"),
    ("MI325X", "AMD Instinct MI325X"),
    ("MI300X", "AMD Instinct MI300X"),
    ("MI300A", "AMD Instinct MI300A"),
    ("MI250X", "AMD Instinct MI250X"),
    ("MI250", "AMD Instinct MI250"),
    ("MI210", "AMD Instinct MI210"),
    ("MI100", "AMD Instinct MI100"),
    ("MI50", "AMD Instinct MI50"),
)


def _short_key(text: str) -> str:
    return re.sub(r"[\s_\-]+", "", str(text)).lower()


_SHORT = {_short_key(short): product for short, product in SHORT_NAMES}


def product_name(text: str) -> str:
    """The product name a short GPU name stands for (``H100`` -> ``NVIDIA H100 80GB HBM3``,
    ``a100-80gb`` -> ``NVIDIA A100-SXM4-80GB``, ``MI300X`` -> ``AMD Instinct MI300X``), matched
    ignoring case, spaces, ``-`` and ``_``; ``text`` itself when it is no short name."""
    return _SHORT.get(_short_key(text), text)


def device_catalog() -> list[dict]:
    """Every short name ``product_name`` knows, with its product name, architecture and SM/CU count."""
    out = []
    for short, product in SHORT_NAMES:
        limits = device_limits({"name": product})
        out.append({"name": short, "product": product, "arch": limits.get("arch"), "num_sms": limits.get("num_sms")})
    return out


def amd_arch_from_name(name: str | None) -> str | None:
    """The gfx target of an AMD product name (``AMD Instinct MI300X`` -> ``gfx942``), None when the name does not say."""
    if not name:
        return None
    return next((arch for pattern, arch, _cus in _AMD_NAME if re.search(pattern, str(name), re.IGNORECASE)), None)
