"""Communication start delay, resident computation and fit rules on small constructed traces and a real A100 trace."""

from __future__ import annotations

import re
from pathlib import Path

import orjson
import pandas as pd
import pytest
from click.testing import CliRunner

from overlapviz import schema
from overlapviz.cli import main
from overlapviz.analysis.devices import nvidia_arch
from overlapviz.analysis.explain import comm_start_delays, summarize_delays
from overlapviz.analysis.occupancy import blocks_fit, capacity

DATA = Path(__file__).parent / "data"
H200 = {"run_id": "r", "rank": 0, "device": 0, "name": "NVIDIA H200", "arch": "sm_90", "num_sms": 132}


def _k(name, kind, stream, start, end, *, launch=None, block=256, regs=64, smem=0, grid=132, category="kernel"):
    return dict(name=name, kind=kind, stream=stream, start_ns=start, end_ns=end, launch_ns=launch, device=0,
                grid_x=grid, grid_y=1, grid_z=1, block_x=block, block_y=1, block_z=1, regs_per_thread=regs,
                shared_mem_bytes=smem, category=category, is_host=False)


def _dataset(path, kernels, devices=(H200,)):
    with schema.DatasetWriter(path) as w:
        w.add("runs", pd.DataFrame([{"run_id": "r"}]))
        w.add("devices", pd.DataFrame(list(devices)))
        w.add_kernels(pd.DataFrame(kernels).assign(run_id="r", rank=0), "r", 0)
        w.commit()
    return path


COMM = dict(block=512, regs=32, smem=0, grid=132)
KERNELS = [
    # a GEMM filling the device: 4096 blocks, 4 resident per SM (registers: 64 x 32 = 2048/warp)
    _k("gemm", "compute", 7, 0, 100_000, launch=0, smem=16384, grid=4096),
    _k("small", "compute", 8, 10_000, 30_000, launch=9_000, block=128, regs=32),
    _k("memcpy HtoD", "memory", 20, 0, 5_000, block=None, regs=None, category="gpu_memcpy"),
    # launched at 2 µs, its stream busy until 5 µs: ready at 5 µs, started at 40 µs
    _k("ncclDevKernel_A", "comm", 20, 40_000, 50_000, launch=2_000, **COMM),
    # ready at its launch (60 µs), after the previous comm ended (50 µs)
    _k("ncclDevKernel_B", "comm", 20, 61_000, 62_000, launch=60_000, **COMM),
    # nothing resident
    _k("ncclDevKernel_C", "comm", 20, 150_500, 151_000, launch=150_000, **COMM),
    # a padded GEMM: 3 blocks per SM (57472 + 1024 B -> 58496 B each), leaving registers for one comm block
    _k("gemm_padded", "compute", 7, 200_000, 300_000, launch=199_000, smem=57472, grid=4096),
    _k("ncclDevKernel_G", "comm", 20, 211_000, 212_000, launch=210_000, **COMM),
    # launch unknown: the first on its stream has no ready time; the second is ready when the first ends
    _k("ncclDevKernel_D", "comm", 21, 400_000, 401_000, **COMM),
    _k("ncclDevKernel_E", "comm", 21, 403_000, 404_000, **COMM),
]


@pytest.fixture(scope="module")
def delays(tmp_path_factory):
    return comm_start_delays(_dataset(tmp_path_factory.mktemp("explain") / "ds", KERNELS)).set_index("name")


def test_start_delay_is_start_minus_the_later_of_launch_and_stream(delays):
    a = delays.loc["ncclDevKernel_A"]
    assert (a["launch_ns"], a["prev_end_ns"], a["ready_ns"], a["ready_from"]) == (2_000, 5_000, 5_000, "previous_on_stream")
    assert a["start_delay_us"] == 35.0
    b = delays.loc["ncclDevKernel_B"]
    assert (b["prev_end_ns"], b["ready_ns"], b["ready_from"], b["start_delay_us"]) == (50_000, 60_000, "launch", 1.0)
    d, e = delays.loc["ncclDevKernel_D"], delays.loc["ncclDevKernel_E"]
    assert pd.isna(d["ready_ns"]) and pd.isna(d["start_delay_us"]) and pd.isna(d["ready_from"])
    assert (e["ready_ns"], e["ready_from"], e["start_delay_us"]) == (401_000, "previous_on_stream", 2.0)


def test_resident_computation_at_launch_and_at_ready(delays):
    a = delays.loc["ncclDevKernel_A"]
    assert (a["n_resident_compute_at_launch"], a["resident_compute_at_launch"]) == (1, "gemm")
    assert (a["n_resident_compute"], a["resident_compute"], a["resident_compute_blocks_per_sm"]) == (1, "gemm", 4)
    c = delays.loc["ncclDevKernel_C"]
    assert c["n_resident_compute"] == 0 and pd.isna(c["resident_compute"]) and c["resident_compute_blocks_per_sm"] == 0


def test_fit_rules(delays):
    # 4 GEMM blocks hold 32 warps x 2048 registers = the whole register file: no comm block fits
    a = delays.loc["ncclDevKernel_A"]
    assert (a["comm_blocks_fit_per_sm"], a["fit_limiter"]) == (0, "registers")
    # alone: 512 threads x 32 regs -> 4 blocks (warps 64 // 16 = 4, registers 16 warps/part x 4 // 16 = 4)
    c = delays.loc["ncclDevKernel_C"]
    assert (c["comm_blocks_fit_per_sm"], c["fit_limiter"], c["comm_blocks_per_sm_alone"]) == (4, "warps", 4)
    assert c["comm_blocks_needed_per_sm"] == 1
    # beside 3 padded GEMM blocks: 16384 - 24 x 2048 / 4 = 4096 registers per part -> 4 warps -> 16 warps -> 1 block
    g = delays.loc["ncclDevKernel_G"]
    assert (g["n_resident_compute"], g["resident_compute"]) == (1, "gemm_padded")
    assert (g["comm_blocks_fit_per_sm"], g["fit_limiter"]) == (1, "registers")


def test_computation_during_the_wait(delays):
    # A waited from 5 to 40 µs: the GEMM covered all of it, "small" 20 µs of it
    a = delays.loc["ncclDevKernel_A"]
    assert (a["n_compute_during_wait"], a["wait_blocker"], a["wait_compute_busy_fraction"]) == (2, "gemm", 1.0)
    assert (a["comm_blocks_fit_per_sm_beside_blocker"], a["fit_limiter_beside_blocker"]) == (0, "registers")
    g = delays.loc["ncclDevKernel_G"]
    assert (g["wait_blocker"], g["comm_blocks_fit_per_sm_beside_blocker"]) == ("gemm_padded", 1)
    c = delays.loc["ncclDevKernel_C"]
    assert c["n_compute_during_wait"] == 0 and pd.isna(c["wait_blocker"]) and c["wait_compute_busy_fraction"] == 0.0
    assert pd.isna(c["comm_blocks_fit_per_sm_beside_blocker"])
    d, e = delays.loc["ncclDevKernel_D"], delays.loc["ncclDevKernel_E"]
    assert pd.isna(d["n_compute_during_wait"]) and pd.isna(d["wait_compute_busy_fraction"])
    assert e["n_compute_during_wait"] == 0 and e["wait_compute_busy_fraction"] == 0.0


def test_blocks_fit_reduces_to_the_occupancy_calculator_when_nothing_is_resident():
    cap = capacity(nvidia_arch(9, 0))
    fit, lim, by = blocks_fit(cap, 0, 0, 0, 0, 233472, 8, 2048, 1024)
    assert (fit[0], lim[0]) == (4, "registers")  # occupancy(sm_90, 256 threads, 64 regs) = 4
    fit, lim, _ = blocks_fit(cap, 60, 4, 0, 0, 233472, 8, 2048, 1024)
    assert (fit[0], lim[0]) == (0, "warps")


def test_missing_limits_or_shapes_give_null_fit_with_a_reason(tmp_path):
    kernels = [_k("gemm", "compute", 7, 0, 100, launch=0, regs=None), _k("nccl_x", "comm", 20, 50, 60, launch=40, **COMM)]
    d = comm_start_delays(_dataset(tmp_path / "a", kernels)).iloc[0]
    assert pd.isna(d["comm_blocks_fit_per_sm"]) and "launch shape is unknown" in d["residency_note"]
    assert d["start_delay_us"] == pytest.approx(0.01)
    nodev = comm_start_delays(_dataset(tmp_path / "b", kernels[1:], devices=())).iloc[0]
    assert pd.isna(nodev["comm_blocks_fit_per_sm"]) and "no devices row" in nodev["residency_note"]


def test_a100_trace_long_delays_are_the_blocked_collectives(tmp_path):
    """HTA's A100 NCCL trace: the three collectives that waited ~0.5 ms were launched while a
    batch-norm kernel held the SMs; NCCL's 544-thread, 96-register blocks could not fit beside it."""
    from overlapviz.ingest import ingest

    ds = ingest([DATA / "hta_nccl_parser_config" / "nccl_data.json.gz"], tmp_path / "ds", progress=False)
    d = comm_start_delays(ds)
    assert len(d) == 21 and (d["ready_from"] == "launch").all()
    blocked = d[d["comm_blocks_fit_per_sm"] == 0]
    assert len(blocked) == 3 and (blocked["start_delay_us"] > 400).all()
    assert (blocked["n_resident_compute"] == 1).all() and blocked["resident_compute"].str.contains("cudnn").all()
    assert (blocked["wait_compute_busy_fraction"] > 0.9).all() and (blocked["comm_blocks_fit_per_sm_beside_blocker"] == 0).all()
    free = d[d["comm_blocks_fit_per_sm"] == 1]
    assert len(free) == 18 and (free["start_delay_us"] < 40).all() and (free["n_resident_compute"] == 0).all()
    s = summarize_delays(d).iloc[0]
    assert (s["n_comm_kernels"], s["n_blocked"]) == (21, 3)


def test_cli_delays_json(tmp_path):
    ds = _dataset(tmp_path / "ds", KERNELS)
    res = CliRunner().invoke(main, ["residency", str(ds), "--delays", "--format", "json"])
    assert res.exit_code == 0, res.output
    recs = {r["name"]: r for r in orjson.loads(res.output)}
    assert recs["ncclDevKernel_A"]["start_delay_us"] == 35.0 and recs["ncclDevKernel_A"]["fit_limiter"] == "registers"
    assert recs["ncclDevKernel_D"]["start_delay_us"] is None and recs["ncclDevKernel_C"]["resident_compute"] is None


def test_cpu_only_gloo_trace_has_delays_but_no_residency(tmp_path):
    from overlapviz.ingest import ingest

    ds = ingest([DATA / "gloo_cpu"], tmp_path / "ds", progress=False)
    d = comm_start_delays(ds)
    assert len(d) > 0 and d["name"].str.startswith("gloo:").all()
    assert d["comm_blocks_fit_per_sm"].isna().all() and d["n_resident_compute"].isna().all()
    assert d["residency_note"].str.contains("host activity").all()


def test_every_output_key_is_documented(tmp_path, delays):
    """docs/residency.md names every column the four commands print."""
    from overlapviz.analysis.advise import Footprint, advise
    from overlapviz.analysis.residency import kernel_residency
    from overlapviz.analysis.speedup import compare, config_table

    doc = (Path(__file__).parent.parent / "docs" / "residency.md").read_text()
    ds = _dataset(tmp_path / "ds", KERNELS)
    with schema.DatasetWriter(tmp_path / "it") as w:
        w.add("runs", pd.DataFrame([{"run_id": "a", "setup": "sequential"}, {"run_id": "b", "setup": "baseline"}]))
        w.add("iterations", pd.DataFrame([{"run_id": r, "rank": 0, "iteration": 0, "time_ms": 1.0, "measured": True} for r in "ab"]))
        w.commit()
    frames = [delays.reset_index(), kernel_residency(ds), config_table(tmp_path / "it"), compare(tmp_path / "it", "a", "b"),
              advise(nvidia_arch(9, 0) | {"num_sms": 132}, Footprint(256, 64, 0, grid=999), Footprint(512, 32, 0, grid=8))]
    words = set(re.findall(r"[a-z_]+", doc))
    missing = sorted({c for f in frames for c in f.columns if c not in words})
    assert not missing, missing


CARVE = DATA / "h200_carveout_check"
# run ids of tests/data/h200_carveout_check (manifest config.smem_carveout_percent: None = the driver's default)
PAD112K_DEFAULT, PAD112K_100 = "cb-ar_optimized_tiled64x64x32-pad112k_phigh_standin_ca2155fe", "cb-ar_optimized_tiled64x64x32-pad112k_phigh_standin_41a177af"
PAD64K_DEFAULT, PAD64K_100 = "cb-ar_optimized_tiled64x64x32-pad64k_phigh_standin_821717de", "cb-ar_optimized_tiled64x64x32-pad64k_phigh_standin_184eebf3"
PAD0_DEFAULT, PAD0_100 = "cb-ar_optimized_tiled64x64x32-pad0k_phigh_standin_ed5c1ad0", "cb-ar_optimized_tiled64x64x32-pad0k_phigh_standin_37564e85"


@pytest.fixture(scope="module")
def carve_delays(tmp_path_factory):
    from overlapviz.ingest import ingest

    ds = ingest([CARVE / "runs"], tmp_path_factory.mktemp("carve") / "ds", progress=False)
    return comm_start_delays(ds)


def test_h200_default_carveout_keeps_the_comm_block_out(carve_delays):
    """Real H200: at 1 GEMM block per SM (132096 B) the stand-in (512 threads, 96 regs, 24576 B) fits by
    registers beside it, but with no preference the driver gave the SM the 132 KB step (135168 B): no room."""
    d = carve_delays.groupby("run_id")
    default, forced = d.get_group(PAD112K_DEFAULT), d.get_group(PAD112K_100)
    assert len(default) == 3 and (default["n_resident_compute"] == 1).all()
    assert (default["comm_blocks_fit_per_sm"] == 0).all() and (default["fit_limiter"] == "shared_memory_carveout").all()
    assert (default["sm_smem_config_bytes"] == 132 * 1024).all() and default["smem_carveout_percent"].isna().all()
    assert default["carveout_note"].str.contains("no carve-out preference").all()
    assert (forced["comm_blocks_fit_per_sm"] >= 1).all() and (forced["fit_limiter"] == "registers").all()
    assert (forced["sm_smem_config_bytes"] == 228 * 1024).all() and (forced["smem_carveout_percent"] == 100).all()
    # what the model separates is what the device did: ~148 µs of waiting against ~9 µs
    assert default["start_delay_us"].median() > 80 and forced["start_delay_us"].median() < 15


@pytest.mark.parametrize("run_id", [PAD0_DEFAULT, PAD0_100, PAD64K_DEFAULT, PAD64K_100])
def test_h200_registers_keep_the_comm_block_out_at_any_carveout(carve_delays, run_id):
    # 5 (pad 0) or 2 (pad 64 KB) GEMM blocks of 8 warps x 1536 registers leave < 16 warps x 3072 registers
    d = carve_delays[carve_delays["run_id"] == run_id]
    assert len(d) == 3 and (d["comm_blocks_fit_per_sm"] == 0).all() and (d["fit_limiter"] == "registers").all()


def test_imported_trace_carveout_is_unknown(tmp_path):
    from overlapviz.ingest import ingest

    ds = ingest([DATA / "hta_nccl_parser_config" / "nccl_data.json.gz"], tmp_path / "ds", progress=False)
    d = comm_start_delays(ds)
    assert d["carveout_note"].str.contains("unknown").all() and d["smem_carveout_percent"].isna().all()
    assert d["sm_smem_config_bytes"].notna().all()


def test_blocks_fit_names_the_carveout_when_the_largest_step_would_hold_more():
    cap = capacity(nvidia_arch(9, 0))
    # one 132096 B GEMM block in the 135168 B step: 3072 B left; the largest step would leave 101376 B
    fit, lim, _ = blocks_fit(cap, 8, 1, 8 * 1536, 132096, 135168, 16, 3072, 24576)
    assert (fit[0], lim[0]) == (0, "shared_memory_carveout")
    fit, lim, _ = blocks_fit(cap, 8, 1, 8 * 1536, 132096, 233472, 16, 3072, 24576)
    assert (fit[0], lim[0]) == (1, "registers")
    # at the largest carve-out the memory itself is the limit
    fit, lim, _ = blocks_fit(cap, 0, 1, 0, 220000, 233472, 1, 256, 24576)
    assert (fit[0], lim[0]) == (0, "shared_memory")


def _coresidency_prediction(row, limits):
    """Blocks of kernel B that fit beside kernel A's resident blocks, by the model, for one probe case."""
    from overlapviz.analysis.occupancy import occupancy

    a = occupancy(limits, row.a_threads, row.a_regs, row.a_dynamic_smem, carveout=None if row.a_carveout < 0 else row.a_carveout)
    b_pref = getattr(row, "b_carveout", -1)
    b = occupancy(limits, row.b_threads, row.b_regs, row.b_dynamic_smem, carveout=None if b_pref < 0 else b_pref)
    n = min(a["blocks_per_sm"], row.a_grid // limits["num_sms"])
    wa = a["warps_per_block"]
    fit, lim, _ = blocks_fit(capacity(limits), n * wa, n, n * a["regs_per_block_allocated"], n * a["shared_mem_per_block_allocated"],
                             a["shared_mem_config"], b["warps_per_block"], b["regs_per_block_allocated"] / b["warps_per_block"],
                             b["shared_mem_per_block_allocated"], own_config=b["shared_mem_config_needed"])
    return a, int(fit[0]), lim[0]


def test_coresidency_on_the_h200_follows_the_carveout_rule():
    """tests/data/carveout_coresidency_h200: kernel A holds every SM for 4 ms, kernel B is launched 0.5 ms later on
    another stream; B's blocks either all start beside A or all wait for it. The model must say which, case by case."""
    from overlapviz.analysis.devices import device_limits

    dev = orjson.loads((DATA / "carveout_coresidency_h200" / "device.json").read_bytes())
    limits = device_limits({"name": dev["name"], "arch": "sm_90", "num_sms": dev["num_sms"], "shared_mem_per_sm": dev["shared_mem_per_sm"]})
    t = pd.read_csv(DATA / "carveout_coresidency_h200" / "coresidency_h200.csv")
    assert len(t) >= 60 and t.groupby("case")["b_blocks_beside_a"].nunique().eq(1).all()  # all or nothing, every rep
    cases = t.drop_duplicates("case")
    verdicts = []
    for row in cases.itertuples(index=False):  # one per measured case
        a, fit, lim = _coresidency_prediction(row, limits)
        assert a["blocks_per_sm"] == row.a_occupancy_cuda, row.case
        beside = row.b_blocks_beside_a == row.b_grid
        assert beside == (fit > 0) and (beside or row.b_blocks_beside_a == 0), (row.case, fit, lim)
        verdicts.append((row.case, beside, lim))
    # both outcomes occur, and most waits are the carve-out's doing, not the memory's
    assert {v[1] for v in verdicts} == {True, False}
    assert sum(1 for _c, ok, lim in verdicts if not ok and lim == "shared_memory_carveout") >= 5


def test_a_newcomer_needing_a_larger_carveout_waits():
    cap = capacity(nvidia_arch(9, 0))
    # one zero-smem block (1 KB reserved) in the 8 KB step leaves 7 KB: a 6 KB block would fit by memory, but its
    # kernel's own configuration (100 KB) is larger than the SM's: it waits (measured: a1of8_1024_b6144)
    fit, lim, _ = blocks_fit(cap, 8, 1, 8 * 512, 1024, 8192, 4, 512, 6144, own_config=102400)
    assert (fit[0], lim[0]) == (0, "shared_memory_carveout")
    fit, lim, _ = blocks_fit(cap, 8, 1, 8 * 512, 1024, 8192, 4, 512, 6144, own_config=8192)
    assert fit[0] == 1
    # a resource that already stops it keeps its name
    fit, lim, _ = blocks_fit(cap, 64, 1, 0, 1024, 8192, 4, 512, 6144, own_config=102400)
    assert (fit[0], lim[0]) == (0, "warps")
