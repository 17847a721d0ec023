"""Figure builders, checked structurally (dimensions, layers, one rendered Bokeh attribute); no screenshots here."""

from __future__ import annotations

import holoviews as hv
import numpy as np
import pandas as pd
import pytest

from overlapviz import figures
from overlapviz.analysis import ranks as ranks_analysis


def kernels(n=6, lanes=((0, 7), (0, 13), (1, 7))):
    rows = []
    for i in range(n):
        rank, stream = lanes[i % len(lanes)]
        rows.append({"run_id": "r", "rank": rank, "stream": stream, "name": f"void k{i}(float*)",
                     "kind": "comm" if stream == 13 else "compute", "start_ns": 1_000_000 + i * 10_000,
                     "end_ns": 1_000_000 + i * 10_000 + 8_000, "grid_x": 128, "grid_y": 1, "grid_z": 1,
                     "block_x": 256, "block_y": 1, "block_z": 1, "regs_per_thread": 64,
                     "shared_mem_bytes": 49152, "step": i // 3})  # fmt: skip
    return pd.DataFrame(rows)


def test_timeline_lanes_and_ms_origin():
    k = kernels()
    before = k.copy()
    data = figures.TimelineData(k)
    assert data.lane_labels == ["rank 0 · stream 7", "rank 0 · stream 13", "rank 1 · stream 7"]
    assert data.start_ms[0] == 0.0 and data.end_ms[0] == pytest.approx(0.008)
    pd.testing.assert_frame_equal(k, before)  # the argument is not modified


def test_timeline_glyphs_carry_hover_fields():
    ov = figures.timeline(kernels())
    rects = ov.get(2)
    assert isinstance(rects, hv.Rectangles)
    assert [d.name for d in rects.kdims] == ["start_ms", "lane_lo", "end_ms", "lane_hi"]
    for field in ("name", "duration_us", "grid", "block", "regs_per_thread", "shared_mem_bytes", "blocks_per_sm"):
        assert field in [d.name for d in rects.vdims]
    assert len(rects) == 6
    assert rects.dframe()["grid"].iloc[0] == "128×1×1"
    assert rects.dframe()["duration_us"].iloc[0] == pytest.approx(8.0)
    plot = hv.render(ov, backend="bokeh")
    assert plot.xaxis.axis_label == "Time since first kernel (ms)"
    assert "6 kernels in view" in plot.title.text


def test_timeline_rasterizes_above_the_glyph_budget():
    ov = figures.timeline(kernels(300), max_glyphs=100)
    raster, rects = ov.get(1), ov.get(2)
    assert isinstance(raster, hv.RGB) and len(rects) == 0
    alpha = raster.dimension_values("A", flat=False)
    assert alpha.shape == (3 * figures.ROWS_PER_LANE, 1100)  # three lanes, one column per pixel
    assert (alpha > 0).any() and (alpha[0] == 0).all()  # something was drawn; each lane's edge row is a gap
    # zoomed in far enough, the same data turns back into glyphs
    zoomed = figures.timeline(kernels(300), max_glyphs=100, x_range=(0.0, 0.5))
    assert len(zoomed.get(2)) > 0 and zoomed.get(1).dimension_values("A", flat=False).shape == (1, 1)


def test_timeline_dynamic_follows_the_range():
    dm = figures.timeline(kernels(300), dynamic=True, max_glyphs=100)
    assert isinstance(dm, hv.DynamicMap)
    full = dm[()]
    assert len(full.get(2)) == 0
    dm.event(x_range=(0.0, 0.2))
    assert 0 < len(dm[()].get(2)) <= 100


def test_step_bands_span_each_steps_gpu_extent():
    bands = figures.step_bands(figures.TimelineData(kernels()))
    frame = bands.dframe()
    assert len(frame) == 4  # ranks 0 and 1, steps 0 and 1 each
    first = frame.iloc[0]  # rank 0, step 0: kernels 0 and 1, on lanes 0 and 1
    assert first["x0"] == 0.0 and first["x1"] == pytest.approx(0.018)
    assert (first["y0"], first["y1"]) == (-0.48, 1.48)
    assert list(frame["shade"]) == ["0", "1", "0", "1"]


def config_table():
    return pd.DataFrame(
        {
            "run_id": ["a", "b", "c", "d"],
            "workload": ["cb-ar"] * 4,
            "setup": ["optimized"] * 4,
            "smem_pad_bytes": [0, 16384, 0, 16384],
            "comm_priority": [0, 0, -1, -1],
            "time_ratio": [0.9, 0.8, 0.85, 0.75],
            "speedup": [1.0, 1.1, 1.05, 1.2],
            "speedup_ci_low": [0.95, 1.05, 1.0, 1.15],
            "speedup_ci_high": [1.05, 1.15, 1.1, 1.25],
            "overlap_fraction": [0.2, 0.5, 0.4, 0.9],
            "stand_in": [True] * 4,
        }
    )


def test_heatmap_axes_values_and_stand_in_title():
    layout = figures.heatmap(config_table(), value="time_ratio")
    (overlay,) = layout
    hm = overlay.get(0)
    assert [d.name for d in hm.kdims] == ["shaping", "priority"]
    assert hm.vdims[0].name == "time_ratio" and "run_id" in [d.name for d in hm.vdims]
    assert set(hm.dimension_values("shaping")) == {"0 B", "16 KiB"}
    assert set(hm.dimension_values("priority")) == {"0 (default)", "-1 (higher)"}
    plot = hv.render(layout, backend="bokeh")
    assert figures.STAND_IN_NOTE in plot.children[0].text  # the layout's title Div
    with pytest.raises(ValueError, match="no column 'nope'"):
        figures.heatmap(config_table(), value="nope")


def test_speedup_bars_with_confidence_interval():
    ov = figures.speedup_bars(config_table())
    bars = ov.get(0)
    err = ov.get(2)
    assert isinstance(bars, hv.Scatter) and isinstance(err, hv.ErrorBars)  # a forest plot: point + interval
    assert bars.vdims[0].name == "speedup" and len(bars) == 4
    assert np.allclose(err.dimension_values("neg"), 0.05)
    assert figures.STAND_IN_NOTE in hv.render(ov).title.text


def test_ranks_marks_stragglers():
    m = pd.DataFrame({"run_id": "r", "rank": [0, 1, 2, 3], "overlap_us": [5.0, 5, 5, 5], "exposed_comm_us": [1.0, 1, 1, 9],
                      "span_us": [100.0, 101, 99, 130]})  # fmt: skip
    assert ranks_analysis.straggler_ranks(m).tolist() == [False, False, False, True]
    layout = figures.ranks(m)
    comm, span = layout
    assert comm.opts.get().kwargs["stacked"] is True
    assert list(span.dframe()["status"]).count("normal") == 3


def test_residency_bars_and_delays():
    table = pd.DataFrame({"name": ["void gemm(float*)", "ncclDevKernel_AllReduce"], "threads_per_block": [128, 512],
                          "regs_per_thread": [128, 96], "shared_mem_bytes": [65536, 0], "blocks_per_sm": [3, 1],
                          "limiter": ["shared_mem", "registers"]})  # fmt: skip
    delays = pd.DataFrame({"name": ["nccl"] * 3, "rank": [0, 0, 1], "start_delay_us": [1.0, 20.0, 3.0],
                           "n_resident_compute": [0, 2, 1]})  # fmt: skip
    layout = figures.residency(table, delays)
    bars, scatter, hist = layout
    assert bars.vdims[0].name == "blocks_per_sm" and scatter.vdims[0].name == "start_delay_us"
    assert set(bars.dframe()["kernel"].str.split(" ").str[0]) == {"gemm", "ncclDevKernel_AllReduce"}
    assert hist.dimension_values(1).sum() == 3


def test_compare_links_time_axes():
    a, b = figures.TimelineData(kernels()), figures.TimelineData(kernels(9))
    deltas = ranks_analysis.metric_deltas(
        pd.DataFrame({"run_id": ["a", "b"], "rank": [0, 0], "comm_us": [10.0, 4.0]}), "a", "b"
    )
    layout = figures.compare(a, b, deltas, labels=("A", "B"))
    assert len(layout) == 3
    plot = hv.render(layout, backend="bokeh")
    figs = [c[0] for c in plot.children if hasattr(c[0], "x_range")]
    assert figs[0].x_range is figs[1].x_range  # linked: zooming one zooms the other
