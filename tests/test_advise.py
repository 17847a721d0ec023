"""Advisor: smallest padding / tile / carve-out for k communication blocks, hand-checked on sm_90 and gfx942; CLI."""

from __future__ import annotations

from pathlib import Path

import orjson
import pandas as pd
import pytest
from click.testing import CliRunner

from overlapviz.analysis.advise import Footprint, advise, footprints_from_dataset
from overlapviz.cli import main
from overlapviz.domain.devices import amd_arch, device_limits
from overlapviz.analysis.occupancy import occupancy

DATA = Path(__file__).parent / "data"
H200 = device_limits({"name": "NVIDIA H200", "arch": "sm_90"})
GEMM = Footprint(256, 64, 16384, grid=4096)  # a 64x64 tiled GEMM block
COMM = Footprint(512, 32, 0)


def test_smallest_padding_for_one_comm_block():
    a = advise(H200, GEMM, COMM, k=1).set_index("lever", append=True)
    cur = a.xs("current", level="lever").iloc[0]
    assert (cur["compute_blocks_per_sm"], cur["comm_blocks_fit_per_sm"], cur["fit_limiter"]) == (4, 0, "registers")
    pad = a.xs("smem_pad", level="lever")
    best = pad[pad["recommended"]].iloc[0]
    # 3 blocks per SM need > 233472 / 4 = 58368 B each: 58496 (128 B units) - 16384 - 1024 reserved = 41088
    assert best["smem_pad_bytes"] == 41088
    assert (best["compute_blocks_per_sm"], best["comm_blocks_fit_per_sm"], best["residency_cost_blocks"]) == (3, 1, 1)
    assert best["occupancy_cost"] == pytest.approx(0.125)
    assert best["compute_waves"] == 11  # ceil(4096 / (3 x 132)), was ceil(4096 / (4 x 132)) = 8
    # one allocation unit less keeps 4 blocks: the pad is the smallest
    assert occupancy(H200, 256, 64, 16384 + 41088 - 128)["blocks_per_sm"] == 4


def test_k_two_needs_more_padding():
    a = advise(H200, GEMM, COMM, k=2)
    best = a[(a["lever"] == "smem_pad") & a["recommended"]].iloc[0]
    assert (best["compute_blocks_per_sm"], best["comm_blocks_fit_per_sm"]) == (2, 2)


def test_tiles_and_carveouts():
    small_tile = Footprint(128, 64, 8192, name="32x32 tile")
    a = advise(H200, GEMM, COMM, alternatives=[small_tile])
    tile = a[a["lever"] == "tile"].iloc[0]
    # 128 threads x 64 regs: 8 blocks by registers fill the file just the same -> no room
    assert (tile["compute_blocks_per_sm"], tile["comm_blocks_fit_per_sm"], tile["meets_target"]) == (8, 0, False)
    carve = a[a["lever"] == "carveout"].set_index("carveout")
    # 28 % of 233472 B rounds up to the 64 KB step: 65536 // 17408 = 3 GEMM blocks, one comm block fits
    assert (carve.loc[28, "compute_blocks_per_sm"], carve.loc[28, "comm_blocks_fit_per_sm"]) == (3, 1)
    assert carve.loc[100, "compute_blocks_per_sm"] == 4
    rec = carve[carve["recommended"]]
    assert list(rec.index) == [28]


def test_sm_carveout_lever():
    a = advise(H200, GEMM, Footprint(512, 32, 0, grid=16))
    sm = a[a["lever"] == "sm_carveout"].iloc[0]
    # 16 comm blocks at 4 per SM need 4 SMs; the GEMM keeps 4 blocks per SM on the other 128:
    # ceil(4096 / (4 x 128)) = 8 waves, as before
    assert (sm["compute_sms"], sm["comm_blocks_fit_per_sm"], sm["compute_waves"], sm["residency_cost_blocks"]) == (128, 4, 8, 0)
    assert sm["recommended"] and sm["meets_target"]
    assert not (advise(H200, GEMM, COMM)["lever"] == "sm_carveout").any()  # no comm grid, no SM count to leave


def test_amd_lds_padding():
    mi300 = device_limits({"name": "AMD Instinct MI300X", "arch": "gfx942"})
    gemm, comm = Footprint(256, 128, 8192), Footprint(256, 64, 0)
    a = advise(mi300, gemm, comm)
    cur = a.iloc[0]
    # 128 VGPRs -> 4 waves/SIMD -> 16 waves = 4 workgroups; they hold all 512 VGPRs of each SIMD
    assert (cur["compute_blocks_per_sm"], cur["comm_blocks_fit_per_sm"]) == (4, 0)
    best = a[(a["lever"] == "smem_pad") & a["recommended"]].iloc[0]
    # 3 workgroups per CU need > 65536 / 4 B of LDS each: 16896 (512 B units) - 8192 = 8704; their 12 waves
    # take 3 x 128 VGPRs of each SIMD, leaving 128: two 64-VGPR comm waves per SIMD = 8 waves = 2 workgroups
    assert (best["smem_pad_bytes"], best["compute_blocks_per_sm"], best["comm_blocks_fit_per_sm"]) == (8704, 3, 2)
    assert not (a["lever"] == "carveout").any()
    assert amd_arch("gfx942")["lds_alloc_unit"] == 512


def test_bad_inputs():
    with pytest.raises(ValueError, match="k must be"):
        advise(H200, GEMM, COMM, k=0)
    with pytest.raises(ValueError, match="threads"):
        Footprint(0, 32)


def test_footprints_from_a_real_trace(tmp_path):
    from overlapviz.ingest import ingest

    ds = ingest([DATA / "hta_nccl_parser_config" / "nccl_data.json.gz"], tmp_path / "ds", progress=False)
    shapes, limits = footprints_from_dataset(ds, r"ncclKernel_AllReduce")
    assert limits["arch"] == "sm_80" and shapes[0].threads == 544 and shapes[0].regs == 96 and shapes[0].smem == 87568
    with pytest.raises(ValueError, match="matches"):
        footprints_from_dataset(ds, "no_such_kernel")
    res = CliRunner().invoke(main, ["advise", str(ds), "--compute", "bn_bw_1C11_kernel_new", "--format", "json"])
    assert res.exit_code == 0, res.output
    recs = orjson.loads(res.output)
    assert recs[0]["lever"] == "current" and recs[0]["comm_blocks_fit_per_sm"] == 0
    # NCCL's block needs 17 warps x 3072 registers: it cannot fit beside even one batch-norm block;
    # only leaving its 8 blocks 8 SMs of their own works
    assert [r["lever"] for r in recs if r["meets_target"]] == ["sm_carveout"]
    sm = [r for r in recs if r["lever"] == "sm_carveout"][0]
    assert (sm["compute_sms"], sm["setting"]) == (100, "8 SMs left to communication")
    table = CliRunner().invoke(main, ["advise", str(ds), "--compute", "bn_bw_1C11_kernel_new", "--comm-shape", "544,96,87568"])
    assert table.exit_code == 0 and "no option lets 1 communication block" in table.output


def test_cli_with_shapes_only():
    res = CliRunner().invoke(main, ["advise", "--arch", "sm_90", "--device-name", "NVIDIA H200", "--compute-shape",
                                    "256,64,16384,4096", "--comm-shape", "512,32,0", "--format", "json"])
    assert res.exit_code == 0, res.output
    best = [r for r in orjson.loads(res.output) if r["lever"] == "smem_pad" and r["recommended"]][0]
    assert best["smem_pad_bytes"] == 41088
    bad = CliRunner().invoke(main, ["advise", "--compute-shape", "256,64", "--comm-shape", "512,32"])
    assert bad.exit_code != 0 and "--arch" in bad.output
    worse = CliRunner().invoke(main, ["advise", "--arch", "sm_90", "--compute-shape", "x", "--comm-shape", "512,32"])
    assert worse.exit_code != 0 and "THREADS,REGS" in worse.output


def test_padding_that_needs_a_carveout_preference():
    """The H200 carve-out check (tests/data/h200_carveout_check): tiled GEMM 256 threads x 48 regs, 16 KB;
    stand-in 512 x 96 regs, 23552 B. Only 1 GEMM block per SM leaves registers for a comm block, and then
    the default carve-out (the 132 KB step) leaves 3 KB of shared memory: padding alone does not do it."""
    gemm, comm = Footprint(256, 48, 16384, grid=1024), Footprint(512, 96, 23552)
    a = advise(H200, gemm, comm)
    pad = a[a["lever"] == "smem_pad"].set_index("setting")
    # 1 block needs > 233472 / 2 B: 116864 - 17408 = 99456 B of padding
    alone = pad.loc["+99456 B"]
    assert (alone["compute_blocks_per_sm"], alone["comm_blocks_fit_per_sm"], alone["fit_limiter"]) == (1, 0, "shared_memory_carveout")
    assert not alone["meets_target"] and pd.isna(alone["carveout"])
    # 116864 + 24576 = 141440 B needs the 164 KB step: 71 % of 233472 = 165765 B rounds up to it (57 % gives 132 KB)
    both = pad.loc["+99456 B, carve-out 71 %"]
    assert (both["carveout"], both["compute_blocks_per_sm"], both["comm_blocks_fit_per_sm"], both["fit_limiter"]) == (71, 1, 1, "registers")
    assert both["recommended"] and both["meets_target"]
    assert (pad["recommended"]).sum() == 1
    # with the preference already set (the collector's smem_carveout_percent = 100) the pad alone does it
    forced = advise(H200, gemm, comm, carveout=100)
    best = forced[(forced["lever"] == "smem_pad") & forced["recommended"]].iloc[0]
    assert (best["setting"], best["carveout"], best["comm_blocks_fit_per_sm"]) == ("+99456 B", 100, 1)
    assert forced.iloc[0]["carveout"] == 100


def test_cli_takes_the_runs_carveout_preference(tmp_path):
    """A collected run's smem_carveout_percent reaches the advisor: on the H200 recording the 100 % run's GEMM
    (pad 112 KiB) already leaves room for the stand-in, the default run's does not."""
    from overlapviz.ingest import ingest

    ds = ingest([DATA / "h200_carveout_check"], tmp_path / "ds", progress=False)
    current = {}
    for run in ("cb-ar_optimized_tiled64x64x32-pad112k_phigh_standin_41a177af",  # carve-out 100 %
                "cb-ar_optimized_tiled64x64x32-pad112k_phigh_standin_ca2155fe"):  # driver's default
        res = CliRunner().invoke(main, ["advise", str(ds), "--run", run, "--compute", "ovz_gemm", "--comm", "ovz_comm",
                                        "--format", "json"])
        assert res.exit_code == 0, res.output
        rec = [r for r in orjson.loads(res.output) if r["lever"] == "current"][0]
        current[run[-8:]] = (rec["comm_blocks_fit_per_sm"], rec["fit_limiter"])
    assert current == {"41a177af": (1, "registers"), "ca2155fe": (0, "shared_memory_carveout")}
