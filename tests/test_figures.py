"""Figure builders, checked structurally (dimensions, layers, one rendered Bokeh attribute); no screenshots here."""

from __future__ import annotations

import holoviews as hv
import numpy as np
import pandas as pd
import pytest

from overlapviz.figures import charts as figures
from overlapviz.figures import timeline as ftl
from overlapviz.figures import why as figures_why
from overlapviz.analysis import budget
from overlapviz.analysis import ranks as ranks_analysis


def kernels(n=6, lanes=((0, 7), (0, 13), (1, 7))):
    rows = []
    for i in range(n):
        rank, stream = lanes[i % len(lanes)]
        rows.append({"run_id": "r", "rank": rank, "stream": stream, "name": f"void k{i}(float*)", "correlation": i,
                     "kind": "comm" if stream == 13 else "compute", "start_ns": 1_000_000 + i * 10_000,
                     "end_ns": 1_000_000 + i * 10_000 + 8_000, "grid_x": 128, "grid_y": 1, "grid_z": 1,
                     "block_x": 256, "block_y": 1, "block_z": 1, "regs_per_thread": 64,
                     "shared_mem_bytes": 49152, "step": i // 3})  # fmt: skip
    return pd.DataFrame(rows)


def why_of(k: pd.DataFrame) -> pd.DataFrame:
    """explain-like records of the comm kernels of ``k``: launched 5 µs before the previous kernel on their rank ended."""
    c = k.loc[k["kind"] == "comm"]
    n = len(c)
    return pd.DataFrame({
        "run_id": "r", "rank": c["rank"].to_numpy(), "stream": c["stream"].to_numpy(), "correlation": c["correlation"].to_numpy(),
        "name": c["name"].to_numpy(), "start_ns": c["start_ns"].to_numpy(), "end_ns": c["end_ns"].to_numpy(),
        "launch_ns": pd.array(c["start_ns"].to_numpy() - 7_000, dtype="Int64"), "stream_ready_ns": pd.array([pd.NA] * n, dtype="Int64"),
        "dependency_ready_ns": pd.array(c["start_ns"].to_numpy() - 3_000, dtype="Int64"),
        "ready_ns": pd.array(c["start_ns"].to_numpy() - 3_000, dtype="Int64"), "ready_from": "dependency",
        "start_delay_us": pd.array([3.0] * n, dtype="Float64"), "start_minus_launch_ns": pd.array([7_000] * n, dtype="Int64"),
        "stream_wait_ns": pd.array([0] * n, dtype="Int64"), "dependency_wait_ns": pd.array([4_000] * n, dtype="Int64"),
        "ready_wait_ns": pd.array([3_000] * n, dtype="Int64"), "cause": "dependency", "blocking_resource": None, "blocker": None,
        "comm_blocks_fit_per_sm": pd.array([2] * n, dtype="Int64"), "free_sms": pd.array([10] * n, dtype="Int64"),
        "num_sms": pd.array([132] * n, dtype="Int64"), "producer": "void k0(float*)", "producer_stream": pd.array([7] * n, dtype="Int64"),
        "peer_wait_us": pd.array([pd.NA] * n, dtype="Float64"), "residency_note": None,
    })  # fmt: skip


def test_timeline_lanes_and_ms_origin():
    k = kernels()
    before = k.copy()
    data = ftl.TimelineData(k)
    assert data.lane_labels == ["rank 0 · stream 7", "rank 0 · stream 13", "rank 1 · stream 7"]
    assert data.start_ms[0] == 0.0 and data.end_ms[0] == pytest.approx(0.008)
    pd.testing.assert_frame_equal(k, before)  # the argument is not modified


def test_timeline_glyphs_carry_hover_fields():
    ov = ftl.timeline(kernels())
    rects = ov.get(2)
    assert isinstance(rects, hv.Rectangles)
    assert [d.name for d in rects.kdims] == ["start_ms", "lane_lo", "end_ms", "lane_hi"]
    for field in ("name", "duration_us", "grid", "block", "regs", "smem", "residency", "start", "end"):
        assert field in [d.name for d in rects.vdims]
    comm = ov.get(4)
    assert len(rects) + len(comm) == 6 and set(comm.dframe()["kind"]) == {"comm"}
    assert rects.dframe()["grid"].iloc[0] == "128×1×1"
    assert rects.dframe()["duration_us"].iloc[0] == pytest.approx(8.0)
    assert rects.dframe()["name"].iloc[0] == "k0"  # "void k0(float*)" as a tooltip shows it: no return type, no parameters
    plot = hv.render(ov, backend="bokeh")
    assert plot.xaxis.axis_label == "Time since the first GPU activity (ms)"
    assert "6 GPU activities in view" in plot.title.text
    # hover: every field a tooltip names is a column of its glyphs (HoloViews once expanded @block inside @blocks_per_sm)
    from bokeh.models import HoverTool

    for tool in plot.select({"type": HoverTool}):
        for renderer in tool.renderers:
            cols = set(renderer.data_source.data)
            for _, spec in tool.tooltips:
                for field in __import__("re").findall(r"@\{(\w+)\}", spec):
                    assert field in cols, (field, spec)
    # time-only tools: the wheel and the drag never move the lanes
    assert plot.toolbar.active_scroll.dimensions == "width" and plot.toolbar.active_drag.dimensions == "width"


def test_timeline_comm_kernels_carry_their_why_and_waits():
    k = kernels()
    why = why_of(k)
    data = ftl.TimelineData(k, why=why, waits=budget.wait_segments(why))
    ov = ftl.timeline_view(data)
    comm = ov.get(4).dframe()
    assert list(comm["cause"].unique()) == ["event dependency"] and (comm["launch"].str.endswith(" ms")).all()
    assert comm["late"].iloc[0] == "7.0 µs" and comm["ready"].iloc[0].startswith("3.0 µs after dependency ready")
    assert comm["fit"].iloc[0] == "2 comm blocks/SM at ready; 10 of 132 SMs free"
    waits = ov.get(3).dframe()
    assert set(waits["part"]) == {"dependency", "launch_latency"}  # launch -> dependency ready, then ready -> start
    assert (waits["lane_lo"] > waits["lane_lo"].round()).all()  # under the kernels of the lane
    arrows = ov.get(5).dframe()
    assert len(arrows) == 2 and (arrows["what"] == "producer").all()  # from the producer's stream (7) to the comm lane
    assert (arrows["y0"] < arrows["y1"]).all()


def test_timeline_rasterizes_above_the_glyph_budget():
    ov = ftl.timeline(kernels(300), max_glyphs=100)
    raster, rects = ov.get(1), ov.get(2)
    assert isinstance(raster, hv.RGB) and len(rects) == 0
    alpha = raster.dimension_values("A", flat=False)
    assert alpha.shape == (3 * ftl.ROWS_PER_LANE, 1100)  # three lanes, one column per pixel
    assert (alpha > 0).any() and (alpha[0] == 0).all()  # something was drawn; each lane's edge row is a gap
    # colours are the kinds': a compute-only lane is Okabe-Ito blue
    rgb = np.stack([raster.dimension_values(c, flat=False) for c in "RGB"], axis=-1)
    drawn = rgb[alpha > 0]
    assert any(tuple(p) == (0, 114, 178) for p in drawn)
    # zoomed in far enough, the same data turns back into glyphs
    zoomed = ftl.timeline(kernels(300), max_glyphs=100, x_range=(0.0, 0.5))
    assert len(zoomed.get(2)) > 0 and zoomed.get(1).dimension_values("A", flat=False).shape == (1, 1)


def test_raster_counts_every_interval_once():
    counts = ftl._coverage(np.array([0.0, 0.25, 0.9]), np.array([0.5, 0.3, 0.95]), np.array([0, 0, 1]), np.array([0, 1, 0]), 2, 2, 10, 0.0, 1.0)
    assert counts.shape == (2, 2, 10)
    assert counts[0, 0].tolist() == [1, 1, 1, 1, 1, 1, 0, 0, 0, 0]  # 0 - 0.5 covers columns 0..5
    assert counts[1, 0].tolist() == [0, 0, 1, 1, 0, 0, 0, 0, 0, 0]
    assert counts[0, 1, 9] == 1


def test_timeline_dynamic_follows_the_range():
    dm = ftl.timeline(kernels(300), dynamic=True, max_glyphs=100)
    assert isinstance(dm, hv.DynamicMap)
    full = dm[()]
    assert len(full.get(2)) == 0
    dm.event(x_range=(0.0, 0.2))
    assert 0 < len(dm[()].get(2)) + len(dm[()].get(4)) <= 100


def test_step_bands_span_each_steps_gpu_extent():
    bands = ftl.step_bands(ftl.TimelineData(kernels()))
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
    ov = figures.heatmap(config_table(), value="time_ratio")
    hm, labels = ov.get(0), ov.get(1)
    assert [d.name for d in hm.kdims] == ["shaping", "label"]
    assert hm.vdims[0].name == "time_ratio" and "run_id" in [d.name for d in hm.vdims]
    assert set(hm.dimension_values("shaping")) == {"0 B", "16 KiB"}
    assert set(hm.dimension_values("label")) == {"optimized · prio 0", "optimized · prio -1"}  # the one workload is in the title
    assert set(labels.dimension_values("text")) == {"0.900", "0.800", "0.850", "0.750"}
    plot = hv.render(ov, backend="bokeh")
    assert figures.STAND_IN_NOTE in plot.title.text and "— cb-ar" in plot.title.text
    with pytest.raises(ValueError, match="no column 'nope'"):
        figures.heatmap(config_table(), value="nope")


def test_heatmap_gives_every_run_its_own_cell():
    # was: runs differing in tile, GEMM size or launch order shared a cell and their numbers were printed on each other
    t = pd.concat([config_table(), config_table().assign(run_id=["e", "f", "g", "h"], tile_k=64, time_ratio=0.5)], ignore_index=True)
    t["tile_m"], t["tile_n"] = 64, 64
    t.loc[:3, "tile_k"] = 32
    grid = figures.config_grid(t)
    assert not grid.duplicated(["label", "shaping"]).any()
    assert grid.loc[grid["run_id"] == "e", "label"].item() == "tile 64×64×64 │ optimized · prio 0"
    again = figures.config_grid(pd.concat([config_table(), config_table().assign(run_id=["e", "f", "g", "h"])], ignore_index=True))
    assert not again.duplicated(["label", "shaping"]).any() and again["label"].str.endswith(" · #2").sum() == 4


def test_heatmap_groups_and_names_every_run_by_workload_gemm_dtype_and_control():
    # was: rows named only what set a run apart from its group's usual value (a bf16 cuBLAS row did not say bf16, the
    # usual tile went unnamed), and the rows of every workload were interleaved by setup
    base = dict(setup="optimized", compute_impl="vendor", dtype="bfloat16", gemm_m=8192, gemm_n=8192, gemm_k=8192, smem_pad_bytes=0,
                comm_priority=-3, time_ratio=0.9, stand_in=True)  # fmt: skip
    rows = [dict(base, run_id="seq", setup="sequential", comm_priority=0, time_ratio=1.0),
            dict(base, run_id="opt"), dict(base, run_id="green", green_ctx_sms=112), dict(base, run_id="carve", sm_carveout=16),
            dict(base, run_id="conn", cuda_max_connections=1), dict(base, run_id="first", cuda_max_connections=1, launch_order="comm-first"),
            dict(base, run_id="fp32", dtype="float32"), dict(base, run_id="mb", workload="mb-ar"),
            dict(base, run_id="tiled", compute_impl="tiled", dtype="float32", gemm_m=2048, gemm_n=2048, gemm_k=2048, tile_m=64,
                 tile_n=64, tile_k=32, smem_pad_bytes=65536)]  # fmt: skip
    t = pd.DataFrame(rows).assign(workload=lambda f: f.get("workload").fillna("cb-ar"))
    grid = figures.config_grid(t).set_index("run_id")
    label = grid["label"]
    assert label["opt"] == "cb-ar · vendor bf16 8192³ │ optimized · prio -3"
    assert label["green"].endswith("│ optimized · prio -3 · green ctx 112 SMs") and label["carve"].endswith("carve-out 16 SMs")
    assert label["conn"].endswith("· 1 connection") and label["first"].endswith("· 1 connection · comm first")
    assert label["fp32"].startswith("cb-ar · vendor fp32 8192³ │") and label["mb"].startswith("mb-ar · vendor bf16 8192³ │")
    assert label["tiled"] == "cb-ar · tiled fp32 2048³ tile 64×64×32 │ optimized · prio -3"
    assert not grid.reset_index().duplicated(["label", "shaping"]).any()
    # a workload's GEMM group is one block of rows on the y axis
    hm = figures.heatmap(t).get(0)
    order = [v for v in hm.kdims[1].values[::-1]]
    facets = [grid.loc[grid["label"] == v, "facet"].iloc[0] for v in order]
    assert all(facets.index(f) == i or facets[i - 1] == f for i, f in enumerate(facets)), facets


def test_heatmap_numbers_read_on_their_cells():
    # was: white numbers on viridis' yellow cells
    ov = figures.heatmap(config_table(), value="overlap_fraction")
    labels = ov.get(1).dframe().set_index("text")
    assert labels.loc["90.0 %", "text_color"] == "black"  # bright yellow
    assert labels.loc["20.0 %", "text_color"] == "white"  # dark purple


def test_speedup_forest_plot_has_a_vertical_line_at_one():
    # was: the "no change" line was drawn horizontally between two configuration rows
    ov = figures.speedup_bars(config_table())
    ci, points = ov.get(0), ov.get(1)
    assert isinstance(points, hv.Scatter) and isinstance(ci, hv.Segments)  # a forest plot: point + interval
    assert points.kdims[0].name == "speedup" and len(points) == 4
    assert np.allclose(ci.dframe()["high"] - ci.dframe()["low"], 0.1)
    plot = hv.render(ov)
    from bokeh.models import Span

    (span,) = plot.select({"type": Span})
    assert span.dimension == "height" and span.location == 1.0  # vertical, at speedup 1
    assert figures.STAND_IN_NOTE in plot.title.text


def test_ranks_marks_stragglers():
    m = pd.DataFrame({"run_id": "r", "rank": [0, 1, 2, 3], "overlap_us": [5.0, 5, 5, 5], "exposed_comm_us": [1.0, 1, 1, 9],
                      "span_us": [100.0, 101, 99, 130], "comm_us": [6.0, 6, 6, 14]})  # fmt: skip
    assert ranks_analysis.long_span_ranks(m).tolist() == [False, False, False, True]
    layout = figures.ranks(m)
    comm, span = layout
    assert comm.opts.get().kwargs["stacked"] is True
    assert list(span.dframe()["status"]).count("normal") == 3


def test_residency_bars_only_the_top_shapes():
    table = pd.DataFrame({"name": [f"void gemm{i}(float*)" for i in range(40)], "threads_per_block": 128, "regs_per_thread": 128,
                          "shared_mem_bytes": 65536, "blocks_per_sm": 3, "limiter": "shared_memory",
                          "total_us": np.arange(40.0)})  # fmt: skip
    bars = figures.residency(table)
    assert len(bars) == figures.RESIDENCY_TOP and "top 25 of 40" in bars.opts.get().kwargs["title"]
    assert bars.dframe()["kernel"].iloc[-1].startswith("gemm39")  # the busiest on top


def test_residency_names_each_shape_readably_and_has_a_legend_of_its_limiters():
    """Real demangled names: a return type (std::enable_if<...>::type) and an anonymous namespace were cut at their first
    '(' into 'std::enable_if<' and '' on the axis; the colour (limiting resource) had no legend."""
    from bokeh.models import Legend

    names = ["std::enable_if<!(cute::is_valid<int>), void>::type internal::gemvx::kernel<int, float>(int, float)",
             "void (anonymous namespace)::multimem_all_reduce_kernel<c10::BFloat16>(int, void*)",
             "Memcpy HtoD (Pageable -> Device)", "void at::native::elementwise_kernel<128, 4, Fill>(int)",
             "void at::native::elementwise_kernel<128, 4, Add>(int)"]  # fmt: skip
    table = pd.DataFrame({"name": names, "threads_per_block": [128, 1024, 1, 128, 128], "regs_per_thread": [32, 26, 1, 20, 20],
                          "shared_mem_bytes": 0, "blocks_per_sm": [16, 2, 1, 16, 12],
                          "limiter": ["warps", "registers", "blocks", "warps", "registers"], "total_us": [5.0, 4, 3, 2, 1]})  # fmt: skip
    bars = figures.residency(table)
    labels = bars.dframe()["kernel"].tolist()[::-1]
    assert labels[0].startswith("internal::gemvx::kernel<int, float> · 128 thr")
    assert labels[1].startswith("{anonymous}::multimem_all_reduce_kernel<c10::BF… · 1024 thr")  # cut at 48
    assert labels[2].startswith("Memcpy HtoD · 1 thr")
    assert len(set(labels)) == 5 and labels[3] != labels[4]  # same function and shape, another residency: both kept
    legend = next(m for m in hv.render(bars, backend="bokeh").select({"type": Legend}))
    shown = set()
    for item in legend.items:  # a fixed label, or one per value of a column of its glyph's data (grouped in the browser)
        label = item.label
        if getattr(label, "field", None) or (isinstance(label, dict) and "field" in label):
            field = label["field"] if isinstance(label, dict) else label.field
            shown |= {str(v) for r in item.renderers for v in r.data_source.data[field]}
        else:
            shown.add(str(label["value"] if isinstance(label, dict) else label.value))
    assert shown == {"warps", "registers", "block slots"}  # in words, as the SM budget says them


def test_number_formats_follow_the_cli():
    # was: `1.147e+05` in the deltas table and `1.600e+7 µs` on axes
    assert figures.fmt_num(114_700.0) == "114,700" and figures.fmt_num(0.84736) == "0.8474"
    assert figures.fmt_us(5841.86) == "5,841.9" and figures.fmt_us(0.93) == "0.930"
    assert figures.time_unit(1.6e7) == ("s", 1e6) and figures.time_unit(5e4) == ("ms", 1e3)
    d = figures.delta_display(pd.DataFrame({"section": ["metric", "metric"], "item": ["comm_us", "time_ratio"], "a": [114_700.0, 0.9],
                                            "b": [100_000.0, 0.85], "delta": [-14_700.0, -0.05]}))  # fmt: skip
    assert d["A"].tolist() == ["114,700.0", "0.900"] and d["item"].iloc[0] == "comm time per rank (µs)"


def test_late_by_cause_and_budget_figures():
    summary = pd.DataFrame({"rank": [0, 1], "stream_order_us": [10.0, 0.0], "dependency_us": [0.0, 0.0], "sm_resources_us": [5.0, 30.0],
                            "launch_latency_us": [1.0, 1.0], "unknown_us": [0.0, 0.0]})  # fmt: skip
    ov = figures_why.late_by_cause(summary)
    bars = ov.get(0).dframe()
    assert len(bars) == 5 and set(bars["cause"]) == {"stream order", "SM resources", "launch latency"}
    r1 = bars.loc[bars["rank"] == 1]
    assert r1["x1"].max() == pytest.approx(31.0)  # stacked: the rank's segments end at its total
    from overlapviz.domain.devices import nvidia_arch

    limits = dict(nvidia_arch(9, 0), num_sms=132)
    t = budget.sm_budget(limits, [{"name": "gemm", "blocks": 4, "warps_per_block": 4, "regs_per_warp": 4096, "smem_alloc_bytes": 33792}],
                         {"warps_per_block": 16, "regs_per_warp": 3072, "smem_alloc_bytes": 1024, "smem_config_needed_bytes": 0},
                         smem_config=135168)  # fmt: skip
    fig = figures_why.sm_budget(t, {"fit": t.attrs["fit"], "limiter": t.attrs["limiter"], "comm": "nccl", "resident": "gemm", "blocks_per_sm": 4})
    assert "0 comm blocks fit, limited by registers" in fig.opts.get().kwargs["title"]
    outline = fig.get(1).dframe()
    assert len(outline) == 2  # registers and the shared memory the carve-out left both overflow


def test_braces_in_a_kernel_s_or_a_run_s_name_are_drawn_as_they_are():
    """HoloViews fills a plot title's {label} fields with str.format: the SM budget of a collective beside a PyTorch
    kernel (``{lambda(float)#1}``), found on the real HTA trace with `serve --device-name`, and a Timeline of a run
    named with braces raised KeyError and were not drawn."""
    from overlapviz.domain.devices import nvidia_arch

    limits = dict(nvidia_arch(8, 0), num_sms=108)
    name = "elementwise<{lambda(float)#1}>"
    t = budget.sm_budget(limits, [{"name": name, "blocks": 4, "warps_per_block": 4, "regs_per_warp": 4096, "smem_alloc_bytes": 0}],
                         {"warps_per_block": 16, "regs_per_warp": 3072, "smem_alloc_bytes": 1024, "smem_config_needed_bytes": 0})  # fmt: skip
    facts = {"fit": t.attrs["fit"], "limiter": t.attrs["limiter"], "comm": "nccl{anonymous}", "resident": name, "blocks_per_sm": 4}
    title = hv.render(figures_why.sm_budget(t, facts), backend="bokeh").title.text
    assert "nccl{anonymous}" in title and "{lambda(float)#1}" in title and "{{" not in title
    title = hv.render(ftl.timeline(kernels(3), title="Timeline of run{0}"), backend="bokeh").title.text
    assert title.startswith("Timeline of run{0} — ")


def test_an_amd_sm_budget_counts_wavefronts_of_64():
    """An MI350X's budget said "limited by warps (threads / 32)" beside a detail counting waves of 64 (QA, real trace)."""
    from overlapviz.domain.devices import amd_arch, device_limits

    limits = device_limits({"arch": "gfx950", "name": "AMD Instinct MI350X"})
    assert limits["warp_size"] == 64 and amd_arch("gfx950")
    t = budget.sm_budget(limits, [{"name": "gemm", "blocks": 30, "warps_per_block": 1, "regs_per_warp": 512, "smem_alloc_bytes": 0}],
                         {"warps_per_block": 4, "regs_per_warp": 512, "smem_alloc_bytes": 0, "smem_config_needed_bytes": 0})  # fmt: skip
    facts = {"fit": t.attrs["fit"], "limiter": "warps", "comm": "rccl", "resident": "gemm", "blocks_per_sm": 30}
    plot = hv.render(figures_why.sm_budget(t, facts), backend="bokeh")
    assert "waves (threads / 64)" in plot.title.text and "32" not in plot.title.text.split("limited by")[1].split("\n")[0]
    assert "waves (threads / 64)" in [str(v) for v in plot.yaxis[0].major_label_overrides.values()]


def test_collectives_figure():
    cells = pd.DataFrame({"run_id": "r", "instance": ["i0", "i0", "i1", "i1"], "ordinal": [0, 0, 1, 1], "rank": [0, 1, 0, 1],
                          "arrival_us": [0.0, 12.0, 3.0, 0.0], "peer_wait_us": [12.0, 0.0, 0.0, 3.0], "start_delay_us": 1.0,
                          "cause": "none", "slowest": [False, True, True, False]})  # fmt: skip
    inst = pd.DataFrame({"run_id": "r", "instance": ["i0", "i1"], "collective": "all_reduce", "n_ranks": 2, "first_start_ns": [0, 100],
                         "arrival_skew_us": [12.0, 3.0], "slowest_rank": pd.array([1, 0], dtype="Int64"), "busbw_gbps": [np.nan, np.nan]})  # fmt: skip
    img = figures_why.arrival_grid(cells)
    grid = img.dimension_values(2, flat=False)
    assert grid.shape == (2, 2) and np.nanmax(grid) == 12.0
    # the hover names the cell (instance, the rank of its row), not the cursor's coordinates ("3.254e-3"); the colour
    # bar's title is the unit (the value's whole label was cut off beside a short grid)
    plot = hv.render(figures_why.arrival_grid(cells.assign(rank=cells["rank"].map({0: 3, 1: 7}))), backend="bokeh")
    hover = next(t for t in plot.tools if type(t).__name__ == "HoverTool")
    assert [name for name, _ in hover.tooltips] == ["instance", "rank", "arrival after the first rank (µs)"]
    assert hover.formatters["$y"].args["ranks"] == [3, 7] and hover.formatters["$x"].args["n"] == 2
    assert [c.title for c in plot.right if type(c).__name__ == "ColorBar"] == ["µs"]
    skew = hv.render(figures_why.arrival_skew(inst), backend="bokeh")
    assert sorted(skew.renderers[0].data_source.data["slowest"]) == ["rank 0", "rank 1"]  # the legend's entries
    for fig in figures_why.rank_waits(cells, inst):  # every field named with its unit (it said "peer: 132.166")
        tips = next(t for t in hv.render(fig, backend="bokeh").tools if type(t).__name__ == "HoverTool").tooltips
        assert [name for name, _ in tips] == ["rank", "instances ready last", "peer wait, summed (µs)"]
    layout = figures_why.collectives(cells, inst)
    assert len(layout) == 4  # no bandwidth panel without message sizes
    assert figures_why.bus_bandwidth(inst) is None


def test_arrival_skew_of_instances_on_clocks_that_do_not_compare_says_there_is_nothing_to_draw(tmp_path):
    """Two ranks whose clocks are 1 s apart, ingested with ``--align-clocks none``: no instance has an arrival skew
    (``peers.collective_instances`` leaves it <NA> in a Float64 column). ``export --figure collectives`` failed with
    HoloViews' "TypeError: boolean value of NA is ambiguous" and a traceback; it now draws the other panels and an empty
    skew plot that says why."""
    from click.testing import CliRunner

    from overlapviz import testing
    from overlapviz.cli import main

    run = tmp_path / "run"
    run.mkdir()
    for r in (0, 1):  # (seeded per rank: the collectives' ends differ too)
        testing.write_trace(testing.generate_trace(60, rank=r, world_size=2, start_ns=5_000_000_000_000 + r * 1_000_000_000), run / f"rank{r}.json")
    ds = tmp_path / "ds"
    result = CliRunner().invoke(main, ["ingest", str(run), "-o", str(ds), "--align-clocks", "none", "-q"])
    assert result.exit_code == 0, result.output
    out = tmp_path / "c.html"
    result = CliRunner().invoke(main, ["export", str(ds), "--figure", "collectives", "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert "Arrival skew per instance: nothing to draw" in out.read_text()

    for skew in (pd.array([None, None], dtype="Float64"), np.array([np.nan, np.nan])):
        inst = pd.DataFrame({"instance": ["i0", "i1"], "first_start_ns": [0, 100], "collective": "all_reduce", "arrival_skew_us": skew,
                             "slowest_rank": pd.array([None, None], dtype="Int64")})  # fmt: skip
        plot = hv.render(figures_why.arrival_skew(inst), backend="bokeh")
        assert plot.title.text == "Arrival skew per instance: nothing to draw"
    # one instance on comparable clocks among others: drawn (a nullable column with <NA>)
    inst = inst.assign(arrival_skew_us=pd.array([2.5, None], dtype="Float64"), slowest_rank=pd.array([1, None], dtype="Int64"))
    data = hv.render(figures_why.arrival_skew(inst), backend="bokeh").renderers[0].data_source.data
    assert data["skew"][0] == 2.5 and np.isnan(data["skew"][1])


def test_compare_links_time_axes():
    a, b = ftl.TimelineData(kernels()), ftl.TimelineData(kernels(9))
    deltas = ranks_analysis.metric_deltas(
        pd.DataFrame({"run_id": ["a", "b"], "rank": [0, 0], "comm_us": [10.0, 4.0]}), "a", "b"
    )
    layout = ftl.compare(a, b, deltas, labels=("A", "B"))
    assert len(layout) == 3
    plot = hv.render(layout, backend="bokeh")
    figs = [c[0] for c in plot.children if hasattr(c[0], "x_range")]
    assert figs[0].x_range is figs[1].x_range  # linked: zooming one zooms the other
    assert figs[0].y_range is not figs[1].y_range  # but each has its own lanes (was: B's lanes squeezed into A's range)


def test_compare_labels_the_shared_time_axis_in_one_format():
    # was: each panel took its format from its own run's extent, so a 0.06 ms run above a 10 ms one labelled the one
    # axis they share in µs (%.3f) in one panel and in ms (%.1f) in the other
    short = kernels(6)
    long_ = short.assign(start_ns=1_000_000 + np.arange(6) * 2_000_000, end_ns=1_000_000 + np.arange(6) * 2_000_000 + 8_000)
    for a, b in ((short, long_), (long_, short)):
        plot = hv.render(ftl.compare(ftl.TimelineData(a), ftl.TimelineData(b), labels=("A", "B")), backend="bokeh")
        figs = [c[0] for c in plot.children if hasattr(c[0], "x_range")]
        assert [f.xaxis[0].formatter.format for f in figs] == ["%.1f", "%.1f"]
        assert all("— 6 GPU activities in view" in f.title.text for f in figs)


def test_the_timeline_legend_has_as_many_rows_for_every_run():
    """A run switch changes the legend's data source before its items reach the browser: with fewer rows than the
    run shown before, an old item pointed past them and BokehJS threw while painting, dropping the rest of the switch
    (the Timeline kept the old run's title; a heatmap tap from the samples' Overview with the why already cached).
    Every run's legend element has the same rows, and one entry per kind and cause of the run, in order."""
    from overlapviz.figures import timeline as ftl
    from overlapviz.figures.charts import CAUSE_COLORS, CAUSE_LABELS, KIND_COLORS

    kinds, causes = tuple(KIND_COLORS), tuple(CAUSE_COLORS)
    for ks, ps in [(kinds[:1], ()), (kinds[:2], causes[:1]), (kinds, causes[2:4]), (kinds, causes)]:
        frame = ftl._legend(ks, ps).data
        assert len(frame) == len(kinds) + len(causes)
        assert list(dict.fromkeys(frame["entry"])) == [*ks, *(f"wait: {CAUSE_LABELS[p]}" for p in ps)]
    assert len(ftl._legend((), ()).data) == 0


def test_the_time_axis_has_the_decimals_its_ticks_need():
    # was: "%.3f" for any window under 5 ms, so a 4 ms window's ticks read "8.000, 8.500"
    data = ftl.TimelineData(kernels())
    fmt = {span: ftl.view_labels(data, (8.0, 8.0 + span), title="t")[1] for span in (40.0, 4.0, 0.4, 0.04, 0.004)}
    assert fmt == {40.0: "%.1f", 4.0: "%.1f", 0.4: "%.2f", 0.04: "%.3f", 0.004: "%.4f"}


# --- colours for greyscale print and colour-blind readers (issue 33) ----------------------------------------------

# Machado, Oliveira & Fernandes (2009), severity 1.0, on linear RGB
_CVD = {
    "deuteranopia": np.array([[0.367322, 0.860646, -0.227968], [0.280085, 0.672501, 0.047413], [-0.011820, 0.042940, 0.968881]]),
    "protanopia": np.array([[0.152286, 1.052583, -0.204868], [0.114503, 0.786281, 0.099216], [-0.003882, -0.048116, 1.051998]]),
    "tritanopia": np.array([[1.255528, -0.076749, -0.178779], [-0.078411, 0.930809, 0.147602], [0.004733, 0.691367, 0.303900]]),
}


def _linear(hex_colour: str) -> np.ndarray:
    c = np.array([int(hex_colour[i : i + 2], 16) / 255 for i in (1, 3, 5)])
    return np.where(c <= 0.04045, c / 12.92, ((c + 0.055) / 1.055) ** 2.4)


def _lab(linear_rgb: np.ndarray) -> np.ndarray:
    xyz = np.array([[0.4124, 0.3576, 0.1805], [0.2126, 0.7152, 0.0722], [0.0193, 0.1192, 0.9505]]) @ np.clip(linear_rgb, 0, 1)
    f = xyz / np.array([0.95047, 1.0, 1.08883])
    f = np.where(f > 0.008856, np.cbrt(f), 7.787 * f + 16 / 116)
    return np.array([116 * f[1] - 16, 500 * (f[0] - f[1]), 200 * (f[1] - f[2])])


def _palette(name: str) -> dict:
    """A categorical colour map the figures or the dashboards draw with, by its dotted name."""
    if name == "pages_findings.PARTS":
        from overlapviz.dashboards import pages_findings

        return {label: colour for _, label, colour, _ in pages_findings.PARTS}
    module, attr = name.split(".") if "." in name else ("charts", name)
    value = getattr({"charts": figures, "why": figures_why}[module], attr)
    return dict(enumerate(value)) if isinstance(value, (list, tuple)) else dict(value)


PALETTES = ["CAUSE_COLORS", "BREAKDOWN_COLORS", "KIND_COLORS", "RANKS_COLORS", "SPAN_COLORS", "LIMITER_COLORS",
            "why.BUDGET_COLORS", "why.RANK_COLORS", "pages_findings.PARTS"]  # fmt: skip


@pytest.mark.parametrize("palette", PALETTES)
def test_every_categorical_palette_reads_in_greyscale_and_for_colour_blind_readers(palette):
    """Greyscale: the lightness (CIE L*) of any two parts at least 12 apart; deuteranopia, protanopia, tritanopia (and
    normal vision): any two at least 25 CIELAB units apart. Fails on the old causes: stream order #56B4E9 (L* 70) and
    SM resources #E69F00 (L* 71) printed as the same grey; and on the old kinds: compute #0072B2, comm #D55E00,
    memory #009E73 and other #999999 (L* 46, 54, 58, 63); on the ranks figure's overlapped #009E73 and exposed
    #D55E00 (L* 58, 54) and its long span #CC79A7 (23 units from the normal blue under protanopia); on the residency
    limiters (shared memory #E69F00 and SGPRs #56B4E9: L* 71 and 70); on the eight Okabe-Ito rank colours; and on the
    Answer page's own breakdown colours (dependent #56B4E9 and host idle #E69F00: L* 70 and 71)."""
    colours = {k: v for k, v in _palette(palette).items() if k != "none"}  # (no delay: never drawn)
    names = list(colours)
    light = {k: _lab(_linear(c))[0] for k, c in colours.items()}
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            assert abs(light[a] - light[b]) >= 12, (palette, a, b, light[a], light[b])
            for vision, m in {"normal": np.eye(3), **_CVD}.items():
                d = np.linalg.norm(_lab(m @ _linear(colours[a])) - _lab(m @ _linear(colours[b])))
                assert d >= 25, (palette, vision, a, b, d)


def test_the_figures_and_the_answer_page_draw_with_the_checked_palettes():
    """The palettes above are the ones drawn: every limiter has its colour, the Answer page's breakdown has the
    figures' colours (one palette, not its own), and up to 25 slowest ranks get each their own colour and marker."""
    from overlapviz.analysis import occupancy
    from overlapviz.dashboards import pages_findings

    assert set(occupancy.RESOURCES) | {"unknown"} == set(figures.LIMITER_COLORS)
    table = pd.DataFrame({"name": [f"void k{i}(float*)" for i in range(6)], "threads_per_block": 128, "regs_per_thread": 32,
                          "shared_mem_bytes": 0, "blocks_per_sm": 4, "total_us": np.arange(6.0),
                          "limiter": ["warps", "blocks", "registers", "sgprs", "shared_memory", None]})  # fmt: skip
    cmap = figures.residency(table).opts.get().kwargs["cmap"]
    assert sorted(cmap.values()) == sorted(figures.LIMITER_COLORS.values())
    assert cmap["unknown"] == figures.LIMITER_COLORS["unknown"] and cmap["block slots"] == figures.LIMITER_COLORS["blocks"]

    chart = pages_findings.breakdown_chart(_breakdown_frame(), title="t")
    assert chart.opts.get().kwargs["cmap"] == figures.BREAKDOWN_COLORS

    m = pd.DataFrame({"run_id": "r", "rank": [0, 1, 2, 3], "overlap_us": 5.0, "exposed_comm_us": 1.0,
                      "span_us": [100.0, 101, 99, 130], "comm_us": 6.0})  # fmt: skip
    span = hv.render(figures.ranks(m).Bars.II, backend="bokeh").renderers[0].data_source.data
    assert sorted(set(span["color"])) == sorted(figures.SPAN_COLORS.values())

    inst = pd.DataFrame({"instance": range(30), "first_start_ns": range(30), "arrival_skew_us": 1.0, "collective": "allreduce",
                         "slowest_rank": pd.array([i % 25 for i in range(30)], dtype="Int64")})  # fmt: skip
    glyph = hv.render(figures_why.arrival_skew(inst), backend="bokeh").renderers[0]
    data, mapper = glyph.data_source.data, glyph.glyph.fill_color.transform
    colour = dict(zip(mapper.factors, mapper.palette))
    looks = {r: (colour[r], mk) for r, mk in zip(data["color"], data["marker"] if "marker" in data else [None] * len(data["color"]))}
    assert len(looks) == 25 and len(set(looks.values())) == 25 and {c for c, _ in looks.values()} == set(figures_why.RANK_COLORS)


def _breakdown_frame() -> pd.DataFrame:
    parts = {"overlapped_ns": [400_000, 0, 90_000], "peer_wait_ns": [100_000, 0, 0], "dependent_ns": [50_000, 0, 10_000],
             "host_idle_ns": [0, 0, 25_000], "exposed_other_ns": [7_000, 3_000, 0]}  # fmt: skip
    t = pd.DataFrame({"run_id": "r", "rank": [0, 1, 2], **parts}).astype({k: "int64" for k in parts})
    exposed = t[["peer_wait_ns", "dependent_ns", "host_idle_ns", "exposed_other_ns"]].sum(axis=1)
    return t.assign(exposed_ns=exposed, comm_ns=exposed + t["overlapped_ns"])


def test_breakdown_stacks_each_rank_s_parts_in_order_in_microseconds():
    findings = pd.DataFrame({"run_id": ["r", "r"], "kind": ["host_idle", "straggler"], "time_ns": [25_000, 100_000],
                             "ranks": [[2], [1]], "evidence": ["", ""], "action": ["", ""],
                             "text": ["Rank 2 idled.", "Rank 1 started 1 of 1 all-reduce instances last; rank 0 waited 100.0 µs."]})  # fmt: skip
    fig = figures.breakdown(_breakdown_frame(), findings)
    rects = fig.get(0).data
    r0 = rects.loc[rects["rank"] == 0]
    assert list(r0["part"]) == ["overlapped", "peer wait", "dependent", "other exposed"]  # zero parts are not drawn
    assert r0["x0"].tolist() == [0.0, 400.0, 500.0, 550.0] and r0["x1"].tolist() == [400.0, 500.0, 550.0, 557.0]  # µs
    assert rects.loc[rects["rank"] == 1, "part"].tolist() == ["other exposed"]
    title = fig.opts.get().kwargs["title"]
    assert title.startswith("Where communication time went, per rank\n") and "Rank 1 started 1 of 1" in title  # the largest finding
    assert "Rank 2 idled" not in title
    with pytest.raises(ValueError, match="host_idle_ns"):
        figures.breakdown(_breakdown_frame().drop(columns="host_idle_ns"))
