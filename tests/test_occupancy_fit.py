"""The fit model (what fits beside resident blocks on one SM), against the occupancy calculator and co-residency measured on an H200."""

from __future__ import annotations

from pathlib import Path

import orjson
import pandas as pd

from overlapviz.domain.devices import nvidia_arch
from overlapviz.analysis.occupancy import blocks_fit, capacity

DATA = Path(__file__).parent / "data"


def test_blocks_fit_reduces_to_the_occupancy_calculator_when_nothing_is_resident():
    cap = capacity(nvidia_arch(9, 0))
    fit, lim, by = blocks_fit(cap, 0, 0, 0, 0, 233472, 8, 2048, 1024)
    assert (fit[0], lim[0]) == (4, "registers")  # occupancy(sm_90, 256 threads, 64 regs) = 4
    fit, lim, _ = blocks_fit(cap, 60, 4, 0, 0, 233472, 8, 2048, 1024)
    assert (fit[0], lim[0]) == (0, "warps")


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
    from overlapviz.domain.devices import device_limits

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
