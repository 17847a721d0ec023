"""Occupancy calculator: hand-computed cases (sm_80, sm_86, sm_90, gfx90a), CUDA's own answers on an H200, Kineto's estimate, datasets and the CLI."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import importlib.util

import numpy as np
import pandas as pd
import pytest

from overlapviz.dataset import schema
from overlapviz.domain.devices import amd_arch, device_limits, nvidia_arch
from overlapviz.analysis.occupancy import occupancy, occupancy_table, profiler_estimated_occupancy
from overlapviz.analysis.residency import kernel_residency

DATA = Path(__file__).parent / "data"
ROOT = Path(__file__).parent.parent
SM80, SM86, SM90 = nvidia_arch(8, 0), nvidia_arch(8, 6), nvidia_arch(9, 0)
GFX90A = amd_arch("gfx90a")


# Each case: (limits, threads, regs, smem, kwargs, blocks, limiter, occupancy); the arithmetic is in the comment.
CASES = [
    # sm_80: warps 64//8 = 8; regs 64*32 = 2048/warp, 16384 per sub-partition // 2048 = 8 warps x 4 = 32 // 8 = 4
    ("sm80 regs", SM80, 256, 64, 0, {}, 4, "registers", 32 / 64),
    # sm_80: smem (49152 + 1024 reserved) = 50176 -> 167936 // 50176 = 3; warps 16, regs 16
    ("sm80 smem", SM80, 128, 32, 49152, {}, 3, "shared_memory", 12 / 64),
    # sm_80: 72 regs -> 2304/warp x 32 warps = 73728 > 65536 registers per block: cannot launch
    ("sm80 too many regs", SM80, 1024, 72, 0, {}, 0, "registers", 0.0),
    # sm_80: 100 threads = 4 warps -> 16 blocks by warps; no registers used
    ("sm80 warps", SM80, 100, 0, 0, {}, 16, "warps", 1.0),
    # sm_86: 2 warps -> 24 by warps, but 16 block slots
    ("sm86 blocks", SM86, 64, 32, 0, {}, 16, "blocks", 32 / 48),
    # sm_86: warps 48//8 = 6; regs 1280/warp -> 12 warps per part -> 48 // 8 = 6;
    # smem 20000 + 1024 -> 21120 (128 B units) -> 102400 // 21120 = 4
    ("sm86 smem", SM86, 256, 40, 20000, {}, 4, "shared_memory", 32 / 48),
    # sm_86, carve-out 50 %: 51200 B rounds up to the 64 KB step -> 65536 // 21120 = 3
    ("sm86 carveout", SM86, 256, 40, 20000, {"carveout": 50}, 3, "shared_memory", 24 / 48),
    # sm_90 (the H200's nvjet GEMM): regs 168*32 = 5376 -> 16384 // 5376 = 3 warps/part -> 12 // 12 = 1;
    # smem 213188 + 1024 -> 214272 -> 233472 // 214272 = 1; tie: registers named first
    ("sm90 gemm", SM90, 384, 168, 213188, {}, 1, "registers", 12 / 64),
    # the same kernel without the shared-memory opt-in (what the profiler assumes): cannot launch
    ("sm90 no optin", SM90, 384, 168, 213188, {"optin": False}, 0, "shared_memory", 0.0),
    # sm_90: 1 warp blocks -> 64 by warps, 32 block slots
    ("sm90 blocks", SM90, 32, 16, 0, {}, 32, "blocks", 32 / 64),
    # gfx90a: 4 waves; 128 VGPRs -> 512 // 128 = 4 waves/SIMD x 4 SIMDs = 16 // 4 = 4; waves 32 // 4 = 8
    ("gfx90a vgpr", GFX90A, 256, 128, 0, {}, 4, "registers", 16 / 32),
    # gfx90a: LDS 16384 -> 65536 // 16384 = 4; VGPRs 512 // 64 = 8 waves -> 8 workgroups
    ("gfx90a lds", GFX90A, 256, 64, 16384, {}, 4, "shared_memory", 16 / 32),
    # gfx90a: one-wave workgroups use no barrier: 32 waves per CU -> 32
    ("gfx90a waves", GFX90A, 64, 24, 0, {}, 32, "warps", 1.0),
    # gfx90a unified VGPRs: round_up(96, 4) + 64 AccVGPRs = 160 -> 512 // 160 = 3 waves/SIMD -> 12 // 8 = 1
    ("gfx90a agpr", GFX90A, 512, 96, 0, {"accum_vgprs": 64}, 1, "registers", 8 / 32),
    # gfx90a: 104 SGPRs -> 7 waves/SIMD -> 28 // 2 = 14 (VGPRs and barriers allow 16)
    ("gfx90a sgpr", GFX90A, 128, 32, 0, {"sgprs": 104}, 14, "sgprs", 28 / 32),
    # gfx906 (MI50/MI60): 256 VGPRs per lane, granule 4: 84 -> 256 // 84 = 3 waves/SIMD -> 12 // 4 = 3 (of 40 wave slots)
    ("gfx906 vgpr", amd_arch("gfx906"), 256, 84, 0, {}, 3, "registers", 12 / 40),
]


@pytest.mark.parametrize("label, limits, threads, regs, smem, kw, blocks, limiter, occ", CASES, ids=[c[0] for c in CASES])
def test_hand_computed(label, limits, threads, regs, smem, kw, blocks, limiter, occ):
    r = occupancy(limits, threads, regs, smem, **kw)
    assert (r["blocks_per_sm"], r["limiter"]) == (blocks, limiter)
    assert r["occupancy"] == pytest.approx(occ)


def test_per_resource_limits_are_reported():
    r = occupancy(SM80, 256, 64, 0)
    assert (r["blocks_limit_warps"], r["blocks_limit_registers"], r["blocks_limit_blocks"]) == (8, 4, 32)
    assert r["blocks_limit_shared_memory"] == 167936 // 1024  # the 1 KB reservation alone
    assert r["blocks_limit_sgprs"] is None
    assert occupancy(SM80, 256, 0, 0)["blocks_limit_registers"] is None
    with pytest.raises(ValueError, match="threads_per_block"):
        occupancy(SM80, 0, 32, 0)


def _h200_limits():
    dev = json.loads((DATA / "occupancy_h200" / "device.json").read_text())
    return device_limits({k: v for k, v in dev.items() if k not in ("driver_version", "runtime_version", "cupy_version")})


def _cuda_rule(frame: pd.DataFrame, limits: dict) -> np.ndarray:
    """Our prediction for rows of the H200 table (CUDA refuses a dynamic size above the function's attribute)."""
    out = np.empty(len(frame), np.int64)
    for (attr, carve), g in frame.groupby(["max_dynamic_smem_attr", "carveout"]):
        t = occupancy_table(limits, g["threads"], g["regs"], g["smem_static"] + g["smem_dynamic"],
                            carveout=int(carve), optin=attr > limits["shared_mem_per_block"])
        pos = frame.index.get_indexer(g.index)
        out[pos] = np.where(g["smem_dynamic"].to_numpy() > attr, 0, t["blocks_per_sm"].to_numpy())
    return out


def test_every_row_of_the_h200_table_matches_cuda():
    table = pd.read_csv(DATA / "occupancy_h200" / "occupancy_h200.csv.gz")
    assert len(table) > 17000 and (table["cuda_status"] == 0).all()
    ours = _cuda_rule(table, _h200_limits())
    bad = table[ours != table["blocks_per_sm"].to_numpy()]
    assert bad.empty, bad.head().to_string()
    # the table exercises every limiter and the edges
    lim = occupancy_table(_h200_limits(), table["threads"], table["regs"], table["smem_static"] + table["smem_dynamic"])
    assert set(lim["limiter"]) >= {"warps", "blocks", "registers", "shared_memory"}
    assert set(table["blocks_per_sm"]) >= {0, 1, 32}


def test_triton_kernels_on_the_h200_match_cuda():
    table = pd.read_csv(DATA / "occupancy_h200" / "triton_kernels.csv")
    assert (_cuda_rule(table, _h200_limits()) == table["blocks_per_sm"].to_numpy()).all()


def _kineto_kernels(path):
    doc = json.load(gzip.open(path))
    p = doc["deviceProperties"][0]
    limits = device_limits({"name": p["name"], "compute_major": p["computeMajor"], "compute_minor": p["computeMinor"],
                            "num_sms": p["numSms"], "max_threads_per_sm": p["maxThreadsPerMultiprocessor"],
                            "shared_mem_per_sm": p["sharedMemPerMultiprocessor"],
                            "shared_mem_per_block_optin": p["sharedMemPerBlockOptin"]})
    ks = [e["args"] for e in doc["traceEvents"] if e.get("cat") == "kernel" and "est. achieved occupancy %" in e.get("args", {})]
    return limits, ks


@pytest.mark.parametrize("path", [DATA / "occupancy_h200" / "h200_torch_trace.json.gz",
                                  DATA / "hta_nccl_parser_config" / "nccl_data.json.gz"], ids=["h200", "a100"])
def test_kineto_estimated_occupancy_is_reproduced(path):
    """Kineto's 'est. achieved occupancy %' = min(occupancy without opt-in, grid/SMs) x threads / max threads."""
    limits, ks = _kineto_kernels(path)
    assert len(ks) >= 12
    est = profiler_estimated_occupancy(
        limits, [np.prod(a["block"]) for a in ks], [a["registers per thread"] for a in ks],
        [a["shared memory"] for a in ks], [np.prod(a["grid"]) for a in ks])
    assert (est == np.array([a["est. achieved occupancy %"] for a in ks])).all()
    # Kineto's "blocks per SM" is grid blocks / SMs, not residency
    assert all(a["blocks per SM"] == pytest.approx(np.prod(a["grid"]) / limits["num_sms"], rel=1e-4, abs=1e-6) for a in ks)


def _dataset(path, kernels, devices):
    with schema.DatasetWriter(path) as w:
        w.add("runs", pd.DataFrame([{"run_id": "r"}]))
        w.add("devices", pd.DataFrame(devices))
        w.add_kernels(pd.DataFrame(kernels).assign(run_id="r", rank=0, category="kernel", is_host=False), "r", 0)
        w.commit()
    return path


def _k(name, kind, start, dur, block, regs, smem, grid=264, stream=7):
    return dict(name=name, kind=kind, start_ns=start, end_ns=start + dur, device=0, stream=stream, grid_x=grid, grid_y=1,
                grid_z=1, block_x=block, block_y=1, block_z=1, regs_per_thread=regs, shared_mem_bytes=smem)


def test_kernel_residency_one_row_per_shape(tmp_path):
    kernels = [_k("gemm", "compute", i * 100, 50, 256, 64, 0) for i in range(3)]
    kernels += [_k("gemm", "compute", 1000, 50, 128, 64, 0), _k("ncclDevKernel_AllReduce", "comm", 2000, 10, 512, 32, 0),
                _k("noshape", "compute", 3000, 5, 256, None, 0)]
    ds = _dataset(tmp_path / "ds", kernels, [{"run_id": "r", "rank": 0, "device": 0, "name": "NVIDIA H200", "arch": "sm_90"}])
    r = kernel_residency(ds)
    assert len(r) == 4
    gemm = r[(r["name"] == "gemm") & (r["threads_per_block"] == 256)].iloc[0]
    assert (gemm["blocks_per_sm"], gemm["limiter"], gemm["n_launches"], gemm["total_us"]) == (4, "registers", 3, 0.15)
    assert gemm["waves"] == pytest.approx(264 / (4 * 132))
    assert r.loc[r["name"] == "noshape", "residency_note"].str.contains("registers missing").all()
    assert pd.isna(r.loc[r["name"] == "noshape", "blocks_per_sm"]).all()


def test_cli_json_has_the_documented_keys(tmp_path):
    import orjson
    from click.testing import CliRunner

    from overlapviz.cli import main

    ds = _dataset(tmp_path / "ds", [_k("gemm", "compute", 0, 50, 256, 64, 0)],
                  [{"run_id": "r", "rank": 0, "device": 0, "name": "NVIDIA A100-SXM4-80GB", "compute_major": 8, "compute_minor": 0}])
    res = CliRunner().invoke(main, ["residency", str(ds), "--format", "json"])
    assert res.exit_code == 0, res.output
    rec = orjson.loads(res.output)[0]
    assert {"name", "threads_per_block", "regs_per_thread", "shared_mem_bytes", "blocks_per_sm", "limiter", "occupancy"} <= set(rec)
    assert (rec["blocks_per_sm"], rec["limiter"], rec["occupancy"]) == (4, "registers", 0.5)
    table = CliRunner().invoke(main, ["residency", str(ds)])
    assert table.exit_code == 0 and "registers" in table.output
    csv = CliRunner().invoke(main, ["residency", str(ds), "--format", "csv"])
    assert csv.output.splitlines()[0].startswith("run_id,device_name,arch,name")
    bad = CliRunner().invoke(main, ["residency", str(tmp_path / "nope")])
    assert bad.exit_code == 1 and "no such file or directory" in bad.output


def test_real_h200_trace_through_ingest(tmp_path):
    from overlapviz.ingest import ingest

    ds = ingest([DATA / "occupancy_h200" / "h200_torch_trace.json.gz"], tmp_path / "ds", progress=False)
    r = kernel_residency(ds)
    gemm = r[r["name"].str.startswith("nvjet")].iloc[0]
    assert (gemm["blocks_per_sm"], gemm["limiter"], gemm["threads_per_block"], gemm["shared_mem_bytes"]) == (1, "registers", 384, 213188)
    assert r["blocks_per_sm"].notna().all()


def test_amd_kernels_without_registers_get_no_residency(tmp_path):
    kernels = [_k("rocm_gemm", "compute", 0, 50, 256, None, 0), _k("rocm_gemm", "compute", 100, 50, 256, 128, 16384)]
    ds = _dataset(tmp_path / "ds", kernels, [{"run_id": "r", "rank": 0, "device": 0, "name": "AMD Instinct MI300X",
                                              "compute_major": 9, "compute_minor": 4, "num_sms": 304}])
    r = kernel_residency(ds).set_index("regs_per_thread", drop=False)
    assert r["residency_note"].notna().sum() == 1 and pd.isna(r.loc[r["regs_per_thread"].isna(), "blocks_per_sm"]).all()
    known = r[r["regs_per_thread"].notna()].iloc[0]
    assert (known["arch"], known["blocks_per_sm"], known["limiter"]) == ("gfx942", 4, "registers")


@pytest.mark.gpu
def test_calculator_matches_cuda_on_this_gpu(tmp_path):
    """Re-measure the table on whatever NVIDIA GPU is here and compare every row (needs CuPy)."""
    cupy = pytest.importorskip("cupy")
    try:
        n = cupy.cuda.runtime.getDeviceCount()
    except Exception:  # no driver
        n = 0
    if n < 1:
        pytest.skip("no CUDA device")
    spec = importlib.util.spec_from_file_location("occupancy_h200", ROOT / "benchmarks" / "occupancy_h200.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert bench.main(["--out", str(tmp_path)]) == 0
    dev = json.loads((tmp_path / "device.json").read_text())
    limits = device_limits({k: v for k, v in dev.items() if k not in ("driver_version", "runtime_version", "cupy_version")})
    table = pd.read_csv(tmp_path / "occupancy_h200.csv")
    table = table[table["cuda_status"] == 0]
    assert len(table) > 1000
    ours = _cuda_rule(table.reset_index(drop=True), limits)
    assert (ours == table["blocks_per_sm"].to_numpy()).all()


# The SM's shared-memory configuration the driver leaves: with no preference, the smallest carve-out step
# >= resident blocks x allocation; with one, the preferred step (at least one block's allocation).
CONFIG_CASES = [
    # sm_90: 5 blocks (registers: 48 x 32 = 1536/warp -> 10 warps/part -> 40 // 8) x 17408 = 87040 -> 100 KB step
    ("sm90 gemm pad0", SM90, 256, 48, 16384, None, 5, 100 * 1024),
    # sm_90: 1 block (131072 + 1024 = 132096; 233472 // 132096 = 1) -> the 132 KB step
    ("sm90 gemm pad112k", SM90, 256, 48, 131072, None, 1, 132 * 1024),
    ("sm90 gemm pad112k 100%", SM90, 256, 48, 131072, 100, 1, 228 * 1024),
    # sm_90: 2 blocks x 82944 = 165888 -> the 164 KB step
    ("sm90 gemm pad64k", SM90, 256, 48, 81920, None, 2, 164 * 1024),
    # sm_90: the stand-in comm kernel, 1 block (registers) x 24576 -> 32 KB
    ("sm90 standin", SM90, 512, 96, 23552, None, 1, 32 * 1024),
    # sm_80: 3 blocks (50176 each) = 150528 -> the 164 KB step (the largest on sm_80)
    ("sm80 smem", SM80, 128, 32, 49152, None, 3, 164 * 1024),
    # sm_80: 8 blocks (warps and registers) x 9216 = 73728 -> 100 KB
    ("sm80 8 blocks", SM80, 256, 32, 8192, None, 8, 100 * 1024),
    # sm_80: only the 1 KB reservation, 4 blocks (registers) -> 4096 B -> the 8 KB step
    ("sm80 no smem", SM80, 256, 64, 0, None, 4, 8 * 1024),
    # sm_80, 50 %: 83968 B rounds up to 100 KB, 11 blocks fit by memory, 8 by warps
    ("sm80 50%", SM80, 256, 32, 8192, 50, 8, 100 * 1024),
    # sm_80, 0 %: at least one block: 9216 -> the 16 KB step, 1 block
    ("sm80 0%", SM80, 256, 32, 8192, 0, 1, 16 * 1024),
    # AMD has no carve-out: the CU's LDS
    ("gfx90a", GFX90A, 256, 64, 16384, None, 4, 64 * 1024),
]


@pytest.mark.parametrize("label, limits, threads, regs, smem, carve, blocks, config", CONFIG_CASES, ids=[c[0] for c in CONFIG_CASES])
def test_shared_memory_configuration(label, limits, threads, regs, smem, carve, blocks, config):
    r = occupancy(limits, threads, regs, smem, carveout=carve)
    assert (r["blocks_per_sm"], r["shared_mem_config"]) == (blocks, config)


def test_default_configuration_never_changes_occupancy():
    """The default configuration holds exactly the blocks counted with the largest carve-out."""
    table = pd.read_csv(DATA / "occupancy_h200" / "occupancy_h200.csv.gz")
    t = occupancy_table(_h200_limits(), table["threads"], table["regs"], table["smem_static"] + table["smem_dynamic"])
    launchable = t["blocks_per_sm"] > 0
    held = t["shared_mem_config"] // t["shared_mem_per_block_allocated"]
    assert (held[launchable] >= t["blocks_per_sm"][launchable]).all()
    assert (t["shared_mem_config"] <= 228 * 1024).all()


def test_collected_runs_carry_their_carveout_preference(tmp_path):
    from overlapviz.ingest import ingest
    from overlapviz.analysis.residency import run_carveouts

    ds = ingest([DATA / "h200_carveout_check" / "runs"], tmp_path / "ds", progress=False)
    pref = run_carveouts(ds)
    assert sorted(p for p, _note, _names in pref.values() if p is not None) == [100, 100, 100]
    r = kernel_residency(ds).set_index(["run_id", "name"])
    gemm = "ovz_gemm_tiled_64x64x32"
    default = r.loc[("cb-ar_optimized_tiled64x64x32-pad112k_phigh_standin_ca2155fe", gemm)]
    forced = r.loc[("cb-ar_optimized_tiled64x64x32-pad112k_phigh_standin_41a177af", gemm)]
    assert (default["blocks_per_sm"], default["smem_config_bytes"]) == (1, 132 * 1024)
    assert (forced["blocks_per_sm"], forced["smem_config_bytes"]) == (1, 228 * 1024)
    assert "run config" in default["carveout_note"] and "100 %" in forced["carveout_note"]
    imported = kernel_residency(ingest([DATA / "occupancy_h200" / "h200_torch_trace.json.gz"], tmp_path / "imp", progress=False))
    assert imported["carveout_note"].str.contains("unknown").all()


def test_gcn5_kokkos_trace_has_limits(tmp_path):
    """The AMD engineer's gfx906 (MI50/MI60) Kokkos trace: device_limits must know GCN5."""
    from overlapviz.ingest import ingest
    from overlapviz.analysis.residency import device_table

    ds = ingest([DATA / "rocprof" / "v1" / "kokkos_gfx906_hiptrace"], tmp_path / "ds", progress=False)
    limits = list(device_table(ds).values())
    assert limits and all(isinstance(v, dict) for v in limits), limits
    assert {(v["arch"], v["simds_per_cu"], v["max_waves_per_simd"], v["lds_per_cu"]) for v in limits} == {("gfx906", 4, 10, 65536)}


def _manifest(pref, *, impl="tiled", backend="stand-in", applied=True):
    return json.dumps({"config": {"smem_carveout_percent": pref, "compute_impl": impl, "backend": backend},
                       "effective": {"smem_carveout_applied": applied,
                                     "kernels": {"gemm": {"name": "ovz_gemm_tiled_64x64x32"}, "comm": {"name": "ovz_comm_allreduce_standin"}}}})


def test_carveout_preference_applies_to_the_kernels_the_collector_set_it_on(tmp_path):
    from overlapviz.analysis.occupancy import occupancy_with_preference
    from overlapviz.analysis.residency import run_carveouts

    runs = pd.DataFrame({"run_id": ["imported", "none", "both", "standin_only", "refused"],
                         "config_json": [None, _manifest(None), _manifest(100), _manifest(32, impl="torch"), _manifest(50, applied=False)]})
    with schema.DatasetWriter(tmp_path / "ds") as w:
        w.add("runs", runs)
        w.commit()
    pref = run_carveouts(tmp_path / "ds")
    assert pref["imported"][0] is None and "unknown" in pref["imported"][1]
    assert pref["none"][:1] == (None,) and "no carve-out preference" in pref["none"][1]
    assert pref["both"][0] == 100 and pref["both"][2] == {"ovz_gemm_tiled_64x64x32", "ovz_comm_allreduce_standin"}
    # torch.matmul's cuBLAS kernels never get the collector's preference: only the stand-in does
    assert pref["standin_only"][0] == 32 and pref["standin_only"][2] == {"ovz_comm_allreduce_standin"}
    assert pref["refused"][0] is None and "not applied" in pref["refused"][1]
    t = occupancy_with_preference(SM90, ["sm90_xmma_gemm", "ovz_comm_allreduce_standin"], [256, 512], [48, 96], [131072, 23552],
                                  preference=pref["standin_only"])
    # the library GEMM keeps the default (1 block -> 132 KB); the stand-in at 32 % gets 74711 B -> the 100 KB step
    assert list(t["shared_mem_config"]) == [132 * 1024, 100 * 1024]
    assert list(t["blocks_per_sm"]) == [1, 1]


@pytest.mark.parametrize(
    "label, threads, regs, smem, carve, config, needed",
    [
        # the stand-in: 1 block x 24576 -> 32 KB; it joins any SM configured with >= 32 KB
        ("standin", 512, 96, 23552, None, 32 * 1024, 32 * 1024),
        # at 100 % it lands on an idle SM at 228 KB and asks as much of a configured one
        ("standin 100%", 512, 96, 23552, 100, 228 * 1024, 228 * 1024),
        # 0 % lands at one block's step (8 KB) but does not lower what it asks of a configured SM: 16 x 6144 -> 100 KB
        ("probe 0%", 128, 16, 5120, 0, 8 * 1024, 100 * 1024),
        # no shared memory declared: 8 blocks x the 1 KB reservation -> 8 KB on an idle SM; joins any
        ("no smem", 256, 16, 0, None, 8 * 1024, 0),
    ],
)
def test_configuration_a_kernel_joins(label, threads, regs, smem, carve, config, needed):
    r = occupancy(SM90, threads, regs, smem, carveout=carve)
    assert (r["shared_mem_config"], r["shared_mem_config_needed"]) == (config, needed)


def test_pause_between_ranks_changes_nothing(tmp_path, monkeypatch):
    # the dashboard's warm-up passes `pause` (it waits there while a page draws): rank_shapes then runs on blocks of whole
    # ranks, whose rows concatenated must be the one-shot rows; both call it before reading and explain before each rank
    from overlapviz.analysis import explain, residency
    from overlapviz.testing import write_grid_dataset

    ds = write_grid_dataset(tmp_path / "ds", ranks=3, iters=3)
    ranks = schema.read_frame(ds, "kernels", columns=["run_id", "rank"]).drop_duplicates()
    calls = []
    for rows in (1, 10**9):  # a block per rank; one block
        monkeypatch.setattr(residency, "PAUSE_ROWS", rows)
        calls.clear()
        pd.testing.assert_frame_equal(kernel_residency(ds, pause=lambda: calls.append(1)), kernel_residency(ds))
        assert len(calls) == 1 + (len(ranks) if rows == 1 else 1)  # before reading, before each block
    calls.clear()
    pd.testing.assert_frame_equal(explain.explain(ds, pause=lambda: calls.append(1)), explain.explain(ds))
    assert len(calls) == 1 + len(ranks)
