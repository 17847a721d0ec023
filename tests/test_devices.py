"""Per-architecture limit tables and completion of a devices row."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from overlapviz.domain.devices import amd_arch, device_limits, nvidia_arch

DATA = Path(__file__).parent / "data"


def test_h200_table_matches_what_the_device_reported():
    # tests/data/occupancy_h200/device.json was read with cuDeviceGetAttribute on an H200
    measured = json.loads((DATA / "occupancy_h200" / "device.json").read_text())
    lim = device_limits({"name": measured["name"], "compute_major": 9, "compute_minor": 0})
    for key in ("num_sms", "max_threads_per_sm", "max_blocks_per_sm", "regs_per_sm", "regs_per_block",
                "shared_mem_per_sm", "shared_mem_per_block", "shared_mem_per_block_optin",
                "reserved_shared_mem_per_block", "warp_size", "max_threads_per_block"):
        assert lim[key] == measured[key], key
    assert lim["limits_source"]["max_blocks_per_sm"] == "table"


def test_trace_values_win_and_are_marked():
    lim = device_limits({"name": "NVIDIA A100-PG509-200", "compute_major": 8, "compute_minor": 0, "num_sms": 108,
                         "shared_mem_per_sm": 167936, "max_blocks_per_sm": None, "regs_per_sm": float("nan")})
    assert lim["arch"] == "sm_80" and lim["num_sms"] == 108 and lim["limits_source"]["num_sms"] == "trace"
    assert lim["max_blocks_per_sm"] == 32 and lim["limits_source"]["max_blocks_per_sm"] == "table"
    assert lim["regs_per_sm"] == 65536 and lim["reserved_shared_mem_per_block"] == 1024


@pytest.mark.parametrize(
    "cc, threads, blocks, smem_kb, optin_kb",
    [((7, 0), 2048, 32, 96, 96), ((7, 5), 1024, 16, 64, 64), ((8, 0), 2048, 32, 164, 163), ((8, 6), 1536, 16, 100, 99),
     ((8, 9), 1536, 24, 100, 99), ((9, 0), 2048, 32, 228, 227), ((10, 0), 2048, 32, 228, 227)],
)
def test_nvidia_rows(cc, threads, blocks, smem_kb, optin_kb):
    a = nvidia_arch(*cc)
    assert (a["max_threads_per_sm"], a["max_blocks_per_sm"]) == (threads, blocks)
    assert (a["shared_mem_per_sm"], a["shared_mem_per_block_optin"]) == (smem_kb * 1024, optin_kb * 1024)
    assert max(a["carveouts_bytes"]) == smem_kb * 1024
    assert a["reserved_shared_mem_per_block"] == (1024 if cc[0] >= 8 else 0)


def test_amd_from_rocm_kineto_device_properties():
    # deviceProperties of the ROCm traces in /work/shared/reference_traces/torch_rocm
    mi300 = device_limits({"name": "AMD Instinct MI300X", "compute_major": 9, "compute_minor": 4, "num_sms": 304,
                           "warp_size": 64, "shared_mem_per_sm": 65536})
    assert (mi300["arch"], mi300["num_sms"], mi300["max_waves_per_simd"], mi300["vgprs_per_simd"]) == ("gfx942", 304, 8, 512)
    mi210 = device_limits({"name": "AMD Instinct MI210", "compute_major": 9, "compute_minor": 0})
    assert mi210["arch"] == "gfx90a" and mi210["num_sms"] == 104 and mi210["vendor"] == "amd"
    assert amd_arch("gfx90a:sramecc+:xnack-")["arch"] == "gfx90a"
    assert amd_arch("gfx950")["lds_per_cu"] == 160 * 1024
    assert amd_arch("gfx1100")["vgpr_alloc_unit"] == 24 and amd_arch("gfx1100")["warp_size"] == 32


def test_nullable_pandas_row_is_accepted():
    row = pd.DataFrame([{"name": "NVIDIA H100 80GB HBM3", "arch": "sm_90", "num_sms": pd.NA}]).astype({"num_sms": "Int32"}).iloc[0].to_dict()
    lim = device_limits(row)
    assert lim["num_sms"] == 132 and lim["limits_source"]["num_sms"] == "table"


@pytest.mark.parametrize(
    "row, message",
    [({"name": "Mystery Accelerator"}, "cannot tell NVIDIA from AMD"),
     ({"vendor": "nvidia", "compute_major": 6, "compute_minor": 1}, "compute capability 6.1"),
     ({"vendor": "amd", "arch": "gfx803"}, "gfx803"),
     ({"vendor": "amd", "name": "AMD Something", "compute_major": 9, "compute_minor": 0}, "no arch")],
)
def test_unknown_devices_are_errors_not_guesses(row, message):
    with pytest.raises(ValueError, match=message):
        device_limits(row)
