"""Speedup statistics (bootstrap medians and ratios), reference-run matching, and compare, on datasets built here."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from overlapviz.dataset import schema
from overlapviz.analysis.speedup import (
    bootstrap_difference,
    bootstrap_median,
    bootstrap_ratio,
    compare,
    config_table,
    iteration_times,
)

BASE = dict(workload="cb-ar", compute_impl="tiled", gemm_m=4096, gemm_n=4096, gemm_k=4096, tile_m=64, tile_n=64,
            tile_k=32, collective="all_reduce", message_bytes=1 << 26, world_size=2, backend="nccl",
            stand_in=False, device_name="NVIDIA H200")


def run(run_id, setup, **kw):
    return {"run_id": run_id, "setup": setup, "source": "collected", **BASE, **kw}


def build(path, runs, times, kernels=None):
    """times: {run_id: list of per-iteration ms (measured)}; 2 warm-up iterations of 1000 ms are added."""
    with schema.DatasetWriter(path) as w:
        w.add("runs", pd.DataFrame(runs))
        rows = []
        for run_id, ts in times.items():
            for rank in (0, 1):
                for i in range(2):
                    rows.append(dict(run_id=run_id, rank=rank, iteration=i, time_ms=1000.0, measured=False))
                for i, t in enumerate(ts):
                    rows.append(dict(run_id=run_id, rank=rank, iteration=i + 2, time_ms=t - (0.5 if rank else 0), measured=True))
        w.add("iterations", pd.DataFrame(rows))
        for (run_id, rank), k in (kernels or {}).items():
            w.add_kernels(k, run_id, rank)
        w.commit()
    return path


def test_bootstrap_median_of_constant_is_exact():
    assert bootstrap_median([4.0] * 7) == (4.0, 4.0, 4.0)
    assert bootstrap_ratio([8.0] * 5, [10.0] * 9) == (0.8, 0.8, 0.8)
    assert bootstrap_difference([10.0] * 3, [7.0] * 4) == (-3.0, -3.0, -3.0)


def test_bootstrap_is_seeded_and_brackets_the_median():
    x = np.random.default_rng(1).normal(10, 1, 41)
    a = bootstrap_median(x, seed=3)
    assert a == bootstrap_median(x, seed=3)
    assert a[0] == np.median(x)
    assert a[1] < a[0] < a[2]
    # a lower level gives a narrower interval
    b = bootstrap_median(x, seed=3, level=0.5)
    assert a[1] < b[1] <= b[2] < a[2]


def test_bootstrap_interval_covers_the_true_median_about_95_percent():
    rng = np.random.default_rng(7)
    covered = 0
    for trial in range(200):
        x = rng.exponential(2.0, 60)  # true median 2 ln 2
        _, lo, hi = bootstrap_median(x, seed=trial, n_resamples=500)
        covered += lo <= 2 * np.log(2) <= hi
    assert 0.88 <= covered / 200 <= 0.995


def test_bootstrap_ratio_interval_shrinks_with_more_samples():
    rng = np.random.default_rng(2)
    small = bootstrap_ratio(rng.normal(8, 1, 10), rng.normal(10, 1, 10))
    big = bootstrap_ratio(rng.normal(8, 1, 1000), rng.normal(10, 1, 1000))
    assert (big[2] - big[1]) < (small[2] - small[1])
    assert big[1] < 0.8 < big[2]


def test_level_outside_0_1_is_an_error():
    with pytest.raises(ValueError, match="level"):
        bootstrap_median([1.0, 2.0], level=95)


def test_config_table_ratios_against_references(tmp_path):
    runs = [
        run("seq", "sequential", smem_pad_bytes=0),
        run("base", "baseline"),
        run("opt", "optimized", smem_pad_bytes=8192, comm_priority=-1),
        run("opt-nopad", "optimized", smem_pad_bytes=0, comm_priority=-1),
        run("other", "optimized", gemm_m=1024),  # another workload: no reference exists
    ]
    times = {"seq": [10.0] * 9, "base": [9.0] * 9, "opt": [7.5] * 9, "opt-nopad": [8.0] * 9, "other": [3.0] * 5}
    ds = build(tmp_path / "ds", runs, times)
    t = config_table(ds).set_index("run_id")
    assert t.loc["seq", "median_ms"] == 10.0  # slowest rank per iteration; warm-up dropped
    assert t.loc["opt", "time_ratio"] == pytest.approx(0.75)
    assert t.loc["opt", "speedup"] == pytest.approx(9.0 / 7.5)
    assert t.loc["opt", "sequential_run_id"] == "seq" and t.loc["opt", "baseline_run_id"] == "base"
    assert t.loc["seq", "time_ratio"] == 1.0 and t.loc["base", "speedup"] == 1.0
    assert pd.isna(t.loc["other", "time_ratio"]) and pd.isna(t.loc["other", "speedup"])
    assert pd.isna(t.loc["other", "sequential_run_id"])
    order = config_table(ds)["run_id"].tolist()
    assert order[:4] == ["opt", "opt-nopad", "base", "seq"] and order[-1] == "other"


def test_config_table_ci_on_noisy_iterations(tmp_path):
    rng = np.random.default_rng(0)
    runs = [run("seq", "sequential"), run("base", "baseline")]
    times = {"seq": list(rng.normal(10, 0.2, 30)), "base": list(rng.normal(9, 0.2, 30))}
    ds = build(tmp_path / "ds", runs, times)
    t = config_table(ds, seed=5).set_index("run_id")
    x = iteration_times(ds, run_ids=["base"])["time_ms"].to_numpy()
    assert len(x) == 30 and t.loc["base", "n_iterations"] == 30
    assert t.loc["base", "median_ms"] == pytest.approx(np.median(x))
    assert t.loc["base", "ci_low_ms"] < t.loc["base", "median_ms"] < t.loc["base", "ci_high_ms"]
    lo, hi = t.loc["base", "time_ratio_ci_low"], t.loc["base", "time_ratio_ci_high"]
    assert lo < t.loc["base", "time_ratio"] < hi < 1.0
    assert config_table(ds, seed=5).equals(config_table(ds, seed=5))


def _kernels(run_id, rank, gemm_ns, comm_ns, overlap):
    """Two steps; each a GEMM on stream 7 and an all-reduce on stream 20, overlapping or after it."""
    rows = []
    for step in (0, 1):
        t0 = step * 1_000_000
        rows.append(dict(stream=7, name="gemm", kind="compute", start_ns=t0, end_ns=t0 + gemm_ns, step=step))
        c0 = t0 if overlap else t0 + gemm_ns
        rows.append(dict(stream=20, name="ncclDevKernel_AllReduce", kind="comm", start_ns=c0, end_ns=c0 + comm_ns, step=step))
    return pd.DataFrame(rows).assign(run_id=run_id, rank=rank, category="kernel", is_host=False)


def test_overlap_and_compute_slowdown_come_from_metrics(tmp_path):
    runs = [run("seq", "sequential"), run("base", "baseline")]
    kernels = {("seq", 0): _kernels("seq", 0, 100_000, 40_000, False), ("base", 0): _kernels("base", 0, 120_000, 40_000, True)}
    ds = build(tmp_path / "ds", runs, {"seq": [10.0] * 3, "base": [9.0] * 3}, kernels)
    t = config_table(ds).set_index("run_id")
    assert t.loc["seq", "overlap_fraction"] == 0.0
    assert t.loc["base", "overlap_fraction"] == 1.0
    assert t.loc["base", "compute_slowdown"] == pytest.approx(1.2)


def test_slowdown_compares_the_same_computation(tmp_path):
    runs = [run("seq", "sequential"), run("seq-pad", "sequential", smem_pad_bytes=65536),
            run("opt-pad", "optimized", smem_pad_bytes=65536, comm_priority=-1), run("opt-pad2", "optimized", smem_pad_bytes=4096)]
    kernels = {("seq", 0): _kernels("seq", 0, 100_000, 40_000, False),
               ("seq-pad", 0): _kernels("seq-pad", 0, 110_000, 40_000, False),
               ("opt-pad", 0): _kernels("opt-pad", 0, 132_000, 40_000, True),
               ("opt-pad2", 0): _kernels("opt-pad2", 0, 132_000, 40_000, True)}
    ds = build(tmp_path / "ds", runs, {r["run_id"]: [10.0] * 3 for r in runs}, kernels)
    t = config_table(ds).set_index("run_id")
    # padding alone cost 10 %; beside communication the padded GEMM ran another 20 % slower
    assert t.loc["opt-pad", "slowdown_run_id"] == "seq-pad"
    assert t.loc["opt-pad", "compute_slowdown"] == pytest.approx(1.2)
    assert t.loc["opt-pad", "sequential_run_id"] == "seq"  # TimeRatio still against the unpadded sequential run
    assert pd.isna(t.loc["opt-pad2", "compute_slowdown"]) and pd.isna(t.loc["opt-pad2", "slowdown_run_id"])


def test_compare_side_by_side(tmp_path):
    runs = [run("seq", "sequential"), run("base", "baseline", comm_priority=0), run("opt", "optimized", smem_pad_bytes=4096, comm_priority=-1)]
    ds = build(tmp_path / "ds", runs, {"seq": [10.0] * 5, "base": [9.0] * 5, "opt": [8.0] * 5})
    c = compare(ds, "base", "opt")
    config = c[c["section"] == "config"].set_index("item")
    assert set(config.index) == {"setup", "smem_pad_bytes", "comm_priority"}
    assert config.loc["smem_pad_bytes", "b"] == 4096
    time = c[c["item"] == "median_ms"].iloc[0]
    assert (time["a"], time["b"], time["delta"], time["delta_ci_low"], time["delta_ci_high"]) == (9.0, 8.0, -1.0, -1.0, -1.0)
    assert time["ratio"] == pytest.approx(8 / 9)
    sp = c[c["item"] == "speedup"].iloc[0]
    assert sp["a"] == 1.0 and sp["b"] == pytest.approx(9 / 8)
    with pytest.raises(ValueError, match="no run 'nope'"):
        compare(ds, "base", "nope")


def test_compare_cli(tmp_path):
    from click.testing import CliRunner
    import orjson

    from overlapviz.cli import main

    runs = [run("seq", "sequential"), run("base", "baseline"), run("opt", "optimized", smem_pad_bytes=4096)]
    ds = build(tmp_path / "ds", runs, {"seq": [10.0] * 5, "base": [9.0] * 5, "opt": [8.0] * 5})
    table = CliRunner().invoke(main, ["compare", str(ds), "--format", "json"])
    assert table.exit_code == 0, table.output
    recs = orjson.loads(table.output)
    assert [r["run_id"] for r in recs] == ["opt", "base", "seq"]
    assert {"median_ms", "ci_low_ms", "ci_high_ms", "time_ratio", "time_ratio_ci_low", "time_ratio_ci_high", "speedup",
            "speedup_ci_low", "speedup_ci_high", "overlap_fraction", "compute_slowdown", "level"} <= set(recs[0])
    assert recs[0]["time_ratio"] == 0.8 and recs[0]["overlap_fraction"] is None
    ab = CliRunner().invoke(main, ["compare", str(ds), "seq", "opt", "--format", "json"])
    assert ab.exit_code == 0, ab.output
    items = {r["item"]: r for r in orjson.loads(ab.output)}
    assert items["median_ms"]["delta"] == -2.0 and items["smem_pad_bytes"]["b"] == 4096
    one = CliRunner().invoke(main, ["compare", str(ds), "seq"])
    assert one.exit_code != 0 and "two runs" in one.output
    missing = CliRunner().invoke(main, ["compare", str(ds), "seq", "zzz"])
    assert missing.exit_code != 0 and "no run 'zzz'" in missing.output
    assert CliRunner().invoke(main, ["compare", str(ds)]).exit_code == 0


def test_compare_names_runs_with_run_as_every_command(tmp_path):
    from click.testing import CliRunner

    from overlapviz.cli import main

    runs = [run("seq", "sequential"), run("opt", "optimized", smem_pad_bytes=4096)]
    ds = build(tmp_path / "ds", runs, {"seq": [10.0] * 5, "opt": [8.0] * 5})
    by_option = CliRunner().invoke(main, ["compare", str(ds), "--run", "seq", "--run", "opt", "--format", "json"])
    by_position = CliRunner().invoke(main, ["compare", str(ds), "seq", "opt", "--format", "json"])
    assert by_option.exit_code == 0 and by_option.output == by_position.output
    three = CliRunner().invoke(main, ["compare", str(ds), "--run", "seq"])
    assert three.exit_code == 1 and "compare takes two runs" in three.output
    both = CliRunner().invoke(main, ["compare", str(ds), "seq", "--run", "opt"])
    assert both.exit_code == 1 and "not both" in both.output


def test_compare_computes_each_config_table_once(tmp_path, monkeypatch):
    # was: every compare(A, B) recomputed the whole configuration table with its bootstraps (1.2 s per pair on the samples)
    import os
    import shutil

    from overlapviz.analysis import speedup

    calls = []
    real = speedup._compute_config_table
    monkeypatch.setattr(speedup, "_compute_config_table", lambda *a, **k: calls.append(a) or real(*a, **k))
    runs = [run("seq", "sequential"), run("base", "baseline"), run("opt", "optimized", smem_pad_bytes=4096, comm_priority=-1)]
    ds = build(tmp_path / "ds", runs, {"seq": [10.0] * 5, "base": [9.0] * 5, "opt": [8.0] * 5})
    pairs = [compare(ds, a, b) for a, b in (("seq", "opt"), ("base", "opt"), ("seq", "base"))]
    assert config_table(ds, run_ids=["opt"])["run_id"].tolist() == ["opt"]
    assert len(calls) == 1
    assert pairs[1].set_index("item").loc["speedup", "b"] == pytest.approx(9 / 8)
    # each caller gets its own copy
    mine = config_table(ds)
    mine["speedup"] = 0.0
    assert config_table(ds).set_index("run_id").loc["opt", "speedup"] == pytest.approx(9 / 8)
    # other parameters are another table; the dataset written again (new dataset.json) is computed anew
    config_table(ds, seed=9)
    assert len(calls) == 2
    build(tmp_path / "new", runs, {"seq": [10.0] * 5, "base": [9.0] * 5, "opt": [6.0] * 5})
    shutil.rmtree(ds)
    os.rename(tmp_path / "new", ds)
    assert compare(ds, "base", "opt").set_index("item").loc["speedup", "b"] == pytest.approx(9 / 6)
    assert len(calls) == 3
    # a caller that has the table passes it: nothing is computed
    table = config_table(ds)
    assert compare(ds, "seq", "opt", table=table).equals(compare(ds, "seq", "opt"))
    assert len(calls) == 3


def test_bootstrap_medians_equal_numpy_median_bit_for_bit():
    # _boot_medians sorts each resample and takes its middle: it must be numpy.median's value exactly (odd and even
    # lengths, ties, a single sample, infinities, NaN) for the same draws
    from overlapviz.analysis.statistics import _boot_medians

    gen = np.random.default_rng(7)
    samples = [gen.random(n) * 10.0 ** gen.integers(-3, 9) for n in (1, 2, 3, 4, 5, 6, 11, 12, 31, 64)]
    samples += [np.array([3.0, 3.0, 1.0, 3.0]), np.array([1e308, 1.7e308]), np.array([-np.inf, 1.0, np.inf, 2.0]),
                np.array([1.0, np.nan, 2.0]), np.round(gen.random(40) * 4)]  # fmt: skip
    for x in samples:
        with np.errstate(over="ignore", invalid="ignore"):  # 1e308 + 1.7e308, -inf + inf: both ways alike
            got = _boot_medians(x, np.random.default_rng(3), 500)
            idx = np.random.default_rng(3).integers(0, len(x), size=(500, len(x)))
            want = np.median(x[idx], axis=1)
        assert np.array_equal(got, want, equal_nan=True), x
