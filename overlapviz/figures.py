"""Figure builders: ``(table, *, keyword options) -> HoloViews object``, never shown; dashboards and export compose them. They draw analysis results and compute no metric."""

from __future__ import annotations

import functools

import datashader as ds
import datashader.transfer_functions as tf
import holoviews as hv
import holoviews.plotting.bokeh  # noqa: F401  (registers the bokeh backend's options without notebook output)
import numpy as np
import pandas as pd

from overlapviz.analysis import ranks as ranks_analysis

# builders use bokeh-backend options; register it as current without notebook output (hv.extension prints)
hv.Store.set_current_backend("bokeh")

# Okabe-Ito colours: distinguishable with the common colour-vision deficiencies and in greyscale print
KIND_COLORS = {"compute": "#0072B2", "comm": "#D55E00", "memory": "#009E73", "other": "#999999"}
STAND_IN_NOTE = "single-GPU stand-in collective, not real NCCL/RCCL"
MAX_GLYPHS = 20_000  # above this many kernels in view the timeline is rasterized (datashader)
ROWS_PER_LANE = 5  # raster rows per rank x stream lane; the outer two are left blank as a gap
TIMELINE_COLUMNS = [
    "run_id", "rank", "stream", "name", "kind", "start_ns", "end_ns", "grid_x", "grid_y", "grid_z",
    "block_x", "block_y", "block_z", "regs_per_thread", "shared_mem_bytes", "step",
]  # fmt: skip


def _plain(frame: pd.DataFrame) -> pd.DataFrame:
    """NumPy-backed columns for HoloViews, which reshapes and flattens them (pandas extension arrays refuse).

    Strings become object; nullable numbers become float64 with NaN (int64 when no value is missing).
    """
    casts = {}
    for c in frame.columns:
        dtype = frame[c].dtype
        if not isinstance(dtype, pd.api.extensions.ExtensionDtype) or isinstance(dtype, pd.CategoricalDtype):
            continue
        if pd.api.types.is_integer_dtype(dtype):
            casts[c] = "int64" if not frame[c].isna().any() else "float64"
        elif pd.api.types.is_float_dtype(dtype):
            casts[c] = "float64"
        else:
            casts[c] = object
    if not casts:
        return frame
    out = frame.astype({c: t for c, t in casts.items() if t is object})
    for c, t in casts.items():
        if t != object:
            out[c] = frame[c].to_numpy(dtype=t, na_value=np.nan)
    return out


def _title(base: str, stand_in: bool) -> str:
    return f"{base} ({STAND_IN_NOTE})" if stand_in else base


# --- timeline ---------------------------------------------------------------------


class TimelineData:
    """Kernels of one run prepared once for repeated drawing: lanes, ms offsets, sorted by start.

    Parameters
    ----------
    kernels
        Rows of the ``kernels`` table (at least ``rank, stream, kind, start_ns, end_ns``; the
        hover columns of ``TIMELINE_COLUMNS`` where present). Not modified.
    residency
        Optional ``overlapviz.analysis.residency.kernel_residency`` frame; its ``blocks_per_sm`` and
        ``limiter`` are shown in the hover, joined on the launch shape.
    origin_ns
        Time shown as 0 ms; the first kernel start by default.
    """

    def __init__(self, kernels: pd.DataFrame, *, residency: pd.DataFrame | None = None, origin_ns: int | None = None):
        frame = kernels.sort_values("start_ns", kind="stable").reset_index(drop=True)
        lanes = frame[["rank", "stream"]].drop_duplicates().sort_values(["rank", "stream"]).reset_index(drop=True)
        lanes = lanes.assign(lane=np.arange(len(lanes)))
        self.lane_labels = [f"rank {r} · stream {s}" for r, s in zip(lanes["rank"], lanes["stream"])]
        frame = frame.merge(lanes, on=["rank", "stream"], how="left", sort=False)
        if origin_ns is None:
            origin_ns = int(frame["start_ns"].min()) if len(frame) else 0
        self.origin_ns = origin_ns
        self.frame = frame
        self.lane = frame["lane"].to_numpy(np.int64)
        self.start_ms = (frame["start_ns"].to_numpy(np.int64) - origin_ns) / 1e6
        self.end_ms = (frame["end_ns"].to_numpy(np.int64) - origin_ns) / 1e6
        self.kind = pd.Categorical(frame["kind"].astype(str), categories=list(KIND_COLORS))
        self.residency = residency
        self.n_lanes = len(lanes)
        self.lanes = lanes

    @property
    def x_extent(self) -> tuple[float, float]:
        if not len(self.start_ms):
            return (0.0, 1.0)
        return (float(self.start_ms.min()), float(self.end_ms.max()))

    def visible(self, x_range: tuple[float, float] | None) -> np.ndarray:
        """Boolean mask of kernels intersecting ``x_range`` (ms); all when None."""
        if x_range is None:
            return np.ones(len(self.start_ms), bool)
        return (self.end_ms >= x_range[0]) & (self.start_ms <= x_range[1])

    def hover_frame(self, mask: np.ndarray) -> pd.DataFrame:
        """Rectangles' columns for the selected kernels, with readable hover fields."""
        sub = self.frame.loc[mask]
        out = pd.DataFrame(
            {
                "start_ms": self.start_ms[mask],
                "lane_lo": self.lane[mask] - 0.38,
                "end_ms": np.maximum(self.end_ms[mask], self.start_ms[mask] + 1e-9),
                "lane_hi": self.lane[mask] + 0.38,
                "kind": np.asarray(self.kind)[mask],
                "name": sub["name"].astype(str).to_numpy() if "name" in sub else "",
                "duration_us": (sub["end_ns"].to_numpy(np.int64) - sub["start_ns"].to_numpy(np.int64)) / 1e3,
            }
        )
        for col in ("rank", "stream", "step", "regs_per_thread", "shared_mem_bytes"):
            out[col] = sub[col].to_numpy() if col in sub else pd.NA
        out["grid"] = _dims3(sub, "grid")
        out["block"] = _dims3(sub, "block")
        out["blocks_per_sm"] = pd.NA
        out["limiter"] = pd.NA
        if self.residency is not None and len(sub) and len(self.residency):
            out = _join_residency(out, sub, self.residency)
        return _plain(out)

    def raster(self, x_range: tuple[float, float], width: int) -> hv.RGB:
        """Kernels of every lane aggregated per pixel column by datashader, coloured by kind."""
        x0, x1 = x_range
        if not x1 > x0:
            x1 = x0 + 1e-6
        height = max(self.n_lanes, 1)
        mask = self.visible(x_range)
        df = pd.DataFrame(
            {"x0": self.start_ms[mask], "x1": self.end_ms[mask], "y": self.lane[mask].astype(float), "kind": self.kind[mask]}
        )
        canvas = ds.Canvas(plot_width=int(width), plot_height=height, x_range=(x0, x1), y_range=(-0.5, height - 0.5))
        agg = canvas.line(df, x=["x0", "x1"], y=["y", "y"], axis=1, agg=ds.count_cat("kind"))
        img = tf.shade(agg, color_key=KIND_COLORS, how="log", min_alpha=160).data  # uint32 RGBA, row 0 = lowest y
        rows = np.repeat(img, ROWS_PER_LANE, axis=0)
        gap = np.zeros(len(rows), bool)
        gap[0::ROWS_PER_LANE] = True
        gap[ROWS_PER_LANE - 1 :: ROWS_PER_LANE] = True
        rows[gap] = 0
        rgba = rows.view(np.uint8).reshape(rows.shape + (4,))[::-1]  # hv.RGB wants the top row first
        bounds = (x0, -0.5, x1, height - 0.5)
        return hv.RGB(rgba, bounds=bounds, kdims=["time_ms", "lane"], vdims=list("RGBA"))


def _dims3(frame: pd.DataFrame, prefix: str) -> np.ndarray:
    cols = [f"{prefix}_{a}" for a in "xyz"]
    if not all(c in frame for c in cols) or not len(frame):
        return np.full(len(frame), "", dtype=object)
    parts = [frame[c].astype("Int64").astype(str).replace("<NA>", "?") for c in cols]
    return (parts[0] + "×" + parts[1] + "×" + parts[2]).where(frame[cols[0]].notna(), "").to_numpy(dtype=object)


def _join_residency(out: pd.DataFrame, sub: pd.DataFrame, residency: pd.DataFrame) -> pd.DataFrame:
    """Residency per launch shape (name, threads per block, registers, shared memory), joined for the hover."""
    threads = sub[["block_x", "block_y", "block_z"]].astype("Int64").prod(axis=1, min_count=3)
    key = pd.DataFrame(
        {
            "run_id": sub["run_id"].to_numpy() if "run_id" in sub else pd.NA,
            "name": out["name"].to_numpy(),
            "threads_per_block": threads.to_numpy(),
            "regs_per_thread": sub["regs_per_thread"].astype("Int64").to_numpy(),
            "shared_mem_bytes": sub["shared_mem_bytes"].astype("Int64").to_numpy(),
        }
    )
    on = [c for c in key.columns if c in residency.columns and not (c == "run_id" and key[c].isna().all())]
    right = residency[on + ["blocks_per_sm", "limiter"]].drop_duplicates(on)
    for c in on:
        if c != "name" and c != "run_id":
            key[c] = key[c].astype("Int64")
            right = right.assign(**{c: right[c].astype("Int64")})
        else:
            key[c] = key[c].astype(str)
            right = right.assign(**{c: right[c].astype(str)})
    joined = key.merge(right, on=on, how="left", sort=False)
    return out.assign(blocks_per_sm=joined["blocks_per_sm"].to_numpy(), limiter=joined["limiter"].to_numpy())


_HOVER = [
    ("kernel", "@name"), ("kind", "@kind"), ("duration", "@duration_us{0,0.000} µs"), ("rank", "@rank"),
    ("stream", "@stream"), ("step", "@step"), ("grid", "@grid"), ("block", "@block"),
    ("registers/thread", "@regs_per_thread"), ("shared mem", "@shared_mem_bytes{0,0} B"),
    ("resident blocks/SM", "@blocks_per_sm"), ("limiter", "@limiter"),
]  # fmt: skip


def timeline_view(
    data: TimelineData,
    x_range: tuple[float, float] | None = None,
    *,
    max_glyphs: int = MAX_GLYPHS,
    width: int = 1100,
    steps: pd.DataFrame | None = None,
    title: str = "Timeline",
) -> hv.Overlay:
    """One frame of the timeline: step bands, then a datashader raster or hover-able rectangles.

    When more than ``max_glyphs`` kernels intersect ``x_range`` (ms; the whole run when None)
    the kernels are rasterized and the rectangles layer is empty, and the other way round, so
    the overlay has the same layers in both modes (as a DynamicMap requires).
    """
    extent = data.x_extent if x_range is None else x_range
    mask = data.visible(x_range)
    n = int(mask.sum())
    empty_rgb = hv.RGB(np.zeros((1, 1, 4), np.uint8), bounds=(extent[0], -0.5, extent[1], max(data.n_lanes, 1) - 0.5),
                       kdims=["time_ms", "lane"], vdims=list("RGBA"))  # fmt: skip
    if n > max_glyphs:
        raster = data.raster(extent, width)
        rects = hv.Rectangles(data.hover_frame(np.zeros(len(mask), bool)), kdims=_RECT_KDIMS, vdims=_RECT_VDIMS)
        mode = f"{n:,} kernels in view, rasterized; zoom in for individual kernels"
    else:
        raster = empty_rgb
        rects = hv.Rectangles(data.hover_frame(mask), kdims=_RECT_KDIMS, vdims=_RECT_VDIMS)
        mode = f"{n:,} kernels in view"
    bands = step_bands(data, steps)
    rects = rects.opts(
        color=hv.dim("kind").categorize(KIND_COLORS, default="#999999"), line_alpha=0, tools=["hover"],
        hover_tooltips=_HOVER,
    )  # fmt: skip
    legend = _kind_legend()
    xlim = {} if x_range is None else {"xlim": tuple(x_range)}
    overlay = (bands * raster * rects * legend).opts(
        hv.opts.Overlay(
            title=f"{title} — {mode}", width=width, height=max(240, 34 * data.n_lanes + 120),
            yticks=list(enumerate(data.lane_labels)), ylim=(-1.5, max(data.n_lanes, 1) - 0.4), legend_cols=4,
            legend_opts={"background_fill_alpha": 0.85, "padding": 3, "margin": 4, "label_height": 14, "glyph_height": 14},
            xlabel="Time since first kernel (ms)", ylabel="", show_grid=False, legend_position="top_left", invert_yaxis=True,
            active_tools=["xwheel_zoom", "xpan"], tools=["xwheel_zoom", "xpan", "box_zoom", "reset"], **xlim,
        )
    )  # fmt: skip
    return overlay


_RECT_KDIMS = [hv.Dimension("start_ms", label="Time since first kernel", unit="ms"), "lane_lo", "end_ms", "lane_hi"]
_RECT_VDIMS = ["kind", "name", "duration_us", "rank", "stream", "step", "regs_per_thread", "shared_mem_bytes",
               "grid", "block", "blocks_per_sm", "limiter"]  # fmt: skip


@functools.cache
def _kind_legend() -> hv.Overlay:
    """Zero-size points that carry the kind legend in both raster and glyph modes.

    Built once: the same legend joins every frame (40 ms a frame saved on a timeline redraw).
    """
    return hv.Overlay(
        [hv.Points(([np.nan], [np.nan]), label=kind).opts(color=color, size=11, marker="square", show_legend=True) for kind, color in KIND_COLORS.items()]
    )


def step_bands(data: TimelineData, steps: pd.DataFrame | None = None) -> hv.Rectangles:
    """Alternating bands behind each rank's lanes, one per step, from the GPU extent of the step's kernels.

    The GPU extent (first start to last end of the kernels launched in the step) is drawn rather
    than the host range, because launches run ahead of the GPU; ``steps`` (the ``steps`` table)
    only supplies the step names.
    """
    frame = data.frame
    cols = ["x0", "y0", "x1", "y1", "step_name", "shade"]
    if "step" not in frame or not frame["step"].notna().any():
        return hv.Rectangles(pd.DataFrame(columns=cols), vdims=cols[4:]).opts(alpha=0)
    sub = pd.DataFrame(
        {"rank": frame["rank"].to_numpy(), "step": frame["step"], "s": data.start_ms, "e": data.end_ms, "lane": data.lane}
    ).dropna(subset=["step"])
    ext = sub.groupby(["rank", "step"], sort=True).agg(x0=("s", "min"), x1=("e", "max")).reset_index()
    lanes = sub.groupby("rank").agg(y0=("lane", "min"), y1=("lane", "max")).reset_index()
    ext = ext.merge(lanes, on="rank")
    names = {}
    if steps is not None and len(steps):
        names = dict(zip(steps["step"].astype("Int64"), steps["name"].astype(str)))
    ext = ext.assign(
        y0=ext["y0"] - 0.48, y1=ext["y1"] + 0.48,
        step_name=[names.get(int(s), f"step {int(s)}") for s in ext["step"]],
        shade=(ext["step"].astype("int64") % 2).astype(str),
    )  # fmt: skip
    return hv.Rectangles(_plain(ext[cols]), vdims=cols[4:]).opts(
        color=hv.dim("shade").categorize({"0": "#E8E8E8", "1": "#F6F6F6"}), line_alpha=0, alpha=1.0
    )


def timeline(kernels: pd.DataFrame, *, x_range=None, residency=None, steps=None, dynamic=False, max_glyphs: int = MAX_GLYPHS,
             width: int = 1100, title: str = "Timeline"):
    """Kernels per rank and stream, coloured by kind, with step bands.

    Parameters
    ----------
    kernels
        ``kernels`` rows of one run (see ``TimelineData``).
    x_range
        (start, end) in ms since the first kernel; the whole run when None.
    residency, steps
        Optional ``kernel_residency`` and ``steps`` frames for the hover and the band names.
    dynamic
        When True return a ``hv.DynamicMap`` that re-renders on zoom/pan (raster when more than
        ``max_glyphs`` kernels are in view, glyphs otherwise); otherwise one static overlay.
    max_glyphs, width, title
        See ``timeline_view``.

    Returns
    -------
    hv.Overlay or hv.DynamicMap
    """
    data = kernels if isinstance(kernels, TimelineData) else TimelineData(kernels, residency=residency)
    opts = {"steps": steps, "max_glyphs": max_glyphs, "width": width, "title": title}
    if not dynamic:
        return timeline_view(data, x_range, **opts)
    stream = hv.streams.RangeX(x_range=x_range)
    return hv.DynamicMap(lambda x_range: timeline_view(data, x_range, **opts), streams=[stream])


# --- configuration grid ---------------------------------------------------------------

VALUE_LABELS = {
    "time_ratio": "TimeRatio (t / t sequential, lower is better)",
    "speedup": "Speedup (t baseline / t, higher is better)",
    "overlap_fraction": "Overlap fraction (overlapped comm / comm)",
}


def _pad_label(values: pd.Series) -> pd.Series:
    v = pd.to_numeric(values, errors="coerce")
    return v.map(lambda b: "n/a" if pd.isna(b) else (f"{b / 1024:g} KiB" if b >= 1024 else f"{int(b)} B"))


def config_grid(table: pd.DataFrame) -> pd.DataFrame:
    """``config_table`` rows with the categorical axis labels the heatmaps use (shaping, priority, facet)."""
    prio = pd.to_numeric(table.get("comm_priority_effective", table.get("comm_priority")), errors="coerce")
    if "comm_priority" in table:
        prio = prio.fillna(pd.to_numeric(table["comm_priority"], errors="coerce"))
    return table.assign(
        shaping=_pad_label(table["smem_pad_bytes"]) if "smem_pad_bytes" in table else "n/a",
        # CUDA and HIP: a lower number is a higher stream priority; 0 is the default
        priority=prio.map(lambda p: "0 (default)" if pd.isna(p) or p == 0 else f"{int(p)} ({'higher' if p < 0 else 'lower'})"),
        pad_sort=pd.to_numeric(table["smem_pad_bytes"], errors="coerce") if "smem_pad_bytes" in table else 0,
        prio_sort=prio.fillna(0),
        facet=_facet(table),
    )


def _facet(table: pd.DataFrame) -> pd.Series:
    """Panel name per row: workload · setup, then the GEMM implementation and SM carve-out where given
    (runs differing only in those must not share a heatmap cell)."""

    def col(name: str, default: str = "") -> pd.Series:
        return table[name].astype(object).where(table[name].notna(), default) if name in table else pd.Series(default, index=table.index)

    facet = col("workload", "imported").astype(str) + " · " + col("setup", "?").astype(str)
    impl = col("compute_impl").astype(str)
    facet = facet + np.where(impl != "", " · " + impl, "")
    carve = pd.to_numeric(col("sm_carveout", 0), errors="coerce").fillna(0)
    return facet + np.where(carve > 0, " · carve-out " + carve.astype(int).astype(str) + " SMs", "")


def heatmap(table: pd.DataFrame, *, value: str = "time_ratio", width: int = 420, height: int = 300, cols: int = 2) -> hv.Layout:
    """Heatmaps of ``value`` over shaping (x) and priority (y), one per workload x setup.

    Parameters
    ----------
    table
        ``overlapviz.analysis.speedup.config_table`` rows: ``run_id``, ``workload``, ``setup``,
        ``smem_pad_bytes``, ``comm_priority`` and the value column. Not modified.
    value
        ``time_ratio``, ``speedup`` or ``overlap_fraction``; TimeRatio and speedup are coloured
        on a diverging scale centred on 1 (no change), overlap fraction from 0 to 1.
    width, height
        Per panel, pixels.
    cols
        Panels per row.

    Returns
    -------
    hv.Layout of ``hv.HeatMap * hv.Labels`` overlays; each HeatMap carries ``run_id``.
    """
    if value not in table:
        raise ValueError(f"config table has no column {value!r}")
    grid = config_grid(table)
    vals = pd.to_numeric(grid[value], errors="coerce")
    grid = grid.assign(**{value: vals, "text": vals.map(lambda v: "" if pd.isna(v) else f"{v:.3f}")})
    grid = grid.sort_values(["pad_sort", "prio_sort"], ascending=[True, False], kind="stable")
    if value == "overlap_fraction":
        cmap, clim = "viridis", (0.0, 1.0)
    else:
        dev = float(np.nanmax(np.abs(vals - 1.0))) if vals.notna().any() else 0.1
        cmap, clim = ("RdBu_r" if value == "time_ratio" else "RdBu"), (1 - max(dev, 0.02), 1 + max(dev, 0.02))
    # dark cells get white numbers
    far = (vals - (0.5 if value == "overlap_fraction" else 1.0)).abs() > 0.6 * (clim[1] - clim[0]) / 2
    grid = grid.assign(text_color=np.where(far.reindex(grid.index).fillna(False), "white", "black"))
    stand_in = bool(grid.get("stand_in", pd.Series(False, index=grid.index)).fillna(False).astype(bool).any())
    short = {"time_ratio": "TimeRatio", "speedup": "Speedup", "overlap_fraction": "Overlap fraction"}.get(value, value)
    panels = []
    for facet, sub in grid.groupby("facet", sort=True):
        sub = _plain(sub)
        hm = hv.HeatMap(sub, kdims=[hv.Dimension("shaping", label="Occupancy shaping (smem pad per block)"),
                                    hv.Dimension("priority", label="Comm stream priority")],
                        vdims=[hv.Dimension(value, label=VALUE_LABELS.get(value, value)), "run_id"])  # fmt: skip
        labels = hv.Labels(sub, kdims=["shaping", "priority"], vdims=["text", "text_color"])
        panels.append(
            (hm.opts(cmap=cmap, clim=clim, colorbar=True, tools=["hover", "tap"], xrotation=0, colorbar_opts={"title": short},
                     width=width, height=height)
             * labels.opts(text_font_size="10pt", text_color="text_color")).relabel(facet).opts(title=str(facet))
        )  # fmt: skip
    layout = hv.Layout(panels).opts(shared_axes=False, title=_title(VALUE_LABELS.get(value, value), stand_in))
    return layout.cols(cols)


def speedup_bars(table: pd.DataFrame, *, width: int = 760, height: int | None = None) -> hv.Overlay:
    """Speedup over baseline per configuration with its confidence interval (a forest plot), per workload.

    Parameters
    ----------
    table
        ``config_table`` rows with ``speedup`` and, where present, ``speedup_ci_low`` /
        ``speedup_ci_high``. Not modified.

    Returns
    -------
    hv.Overlay of ``hv.Scatter`` (one point per configuration, configurations on y), the
    interval as horizontal ``hv.ErrorBars`` when known, and a line at 1 (no change).
    """
    grid = config_grid(table).sort_values(["facet", "pad_sort", "prio_sort"], ascending=[True, True, False], kind="stable")
    label = grid["facet"] + " · pad " + grid["shaping"] + " · prio " + grid["priority"]
    value = pd.to_numeric(grid["speedup"], errors="coerce")
    frame = _plain(pd.DataFrame({"configuration": label, "speedup": value, "run_id": grid["run_id"].astype(str)}))
    stand_in = bool(grid.get("stand_in", pd.Series(False, index=grid.index)).fillna(False).astype(bool).any())
    height = max(260, 28 * len(frame) + 110) if height is None else height
    ydim = hv.Dimension("configuration", label="Configuration")
    points = hv.Scatter(frame, kdims=[ydim], vdims=[hv.Dimension("speedup", label="Speedup vs baseline (×)"), "run_id"]).opts(
        color="#0072B2", size=9, tools=["hover"], invert_axes=True, width=width, height=height,
        show_grid=True)  # fmt: skip
    overlay = points * hv.VLine(1.0).opts(color="black", line_dash="dashed", line_width=1)
    lo, hi = _ci_columns(grid, "speedup")
    if lo and hi:
        ci = _plain(pd.DataFrame({"configuration": label, "y": value, "neg": value - pd.to_numeric(grid[lo], errors="coerce"),
                                  "pos": pd.to_numeric(grid[hi], errors="coerce") - value}))  # fmt: skip
        overlay = overlay * hv.ErrorBars(ci, kdims=[ydim], vdims=["y", "neg", "pos"]).opts(
            color="black", invert_axes=True)
    return overlay.opts(title=_title("Speedup over baseline overlap (median iteration, 95% CI)", stand_in))


def _ci_columns(table: pd.DataFrame, value: str) -> tuple[str | None, str | None]:
    for lo, hi in ((f"{value}_ci_low", f"{value}_ci_high"), (f"{value}_low", f"{value}_high"), (f"{value}_lo", f"{value}_hi")):
        if lo in table and hi in table:
            return lo, hi
    return None, None


# --- ranks, residency, compare -------------------------------------------------------------


def ranks(metrics: pd.DataFrame, *, width: int = 560, height: int = 340, tolerance: float = 0.05) -> hv.Layout:
    """Per-rank overlapped vs exposed communication and busy span, stragglers highlighted.

    Parameters
    ----------
    metrics
        ``overlapviz.analysis.metrics.overlap_metrics(per="rank")`` rows for one run (``rank``,
        ``overlap_us``, ``exposed_comm_us``, ``span_us``, ``run_id``). Not modified.
    width, height
        Per panel, pixels.
    tolerance
        Straggler threshold over the run's median span (:func:`overlapviz.analysis.ranks.straggler_ranks`).
    """
    rank = metrics["rank"].astype(int).astype(str)
    stacked = pd.concat(
        [
            pd.DataFrame({"rank": rank, "part": "overlapped", "us": pd.to_numeric(metrics["overlap_us"])}),
            pd.DataFrame({"rank": rank, "part": "exposed", "us": pd.to_numeric(metrics["exposed_comm_us"])}),
        ],
        ignore_index=True,
    )
    comm = hv.Bars(_plain(stacked), kdims=[hv.Dimension("rank", label="Rank"), hv.Dimension("part", label="Communication")],
                   vdims=[hv.Dimension("us", label="Communication time (µs)")]).opts(
        stacked=True, cmap={"overlapped": "#009E73", "exposed": "#D55E00"}, tools=["hover"], width=width,
        height=height, title="Communication per rank: overlapped vs exposed", legend_position="top_right")  # fmt: skip
    strag = ranks_analysis.straggler_ranks(metrics, tolerance=tolerance)
    spans = pd.DataFrame(
        {"rank": rank, "span_ms": pd.to_numeric(metrics["span_us"]) / 1e3,
         "status": np.where(strag, "straggler (> median + 5%)", "normal")}
    )  # fmt: skip
    span = hv.Bars(_plain(spans), kdims=[hv.Dimension("rank", label="Rank")],
                   vdims=[hv.Dimension("span_ms", label="GPU span (ms)"), "status"]).opts(
        color=hv.dim("status").categorize({"normal": "#0072B2"}, default="#CC79A7"), tools=["hover"],
        width=width, height=height, title="GPU span per rank (stragglers in pink)")  # fmt: skip
    return (comm + span).opts(shared_axes=False)


def residency(table: pd.DataFrame, delays: pd.DataFrame | None = None, *, width: int = 1000, height: int = 380) -> hv.Layout:
    """Resident computation blocks per SM per kernel launch shape (coloured by limiter) and comm start delays.

    Parameters
    ----------
    table
        ``overlapviz.analysis.residency.kernel_residency`` rows (``name``, ``blocks_per_sm``, ``limiter``,
        ``threads_per_block``, ``regs_per_thread``, ``shared_mem_bytes``). Not modified.
    delays
        Optional ``overlapviz.analysis.explain.comm_start_delays`` rows (``start_delay_us``,
        ``n_resident_compute``).
    width, height
        Per panel, pixels.
    """
    shapes = table.assign(
        kernel=_short(table["name"].astype(str))
        + " ["
        + table["threads_per_block"].astype("Int64").astype(str)
        + " thr, "
        + table["regs_per_thread"].astype("Int64").astype(str)
        + " reg, "
        + (pd.to_numeric(table["shared_mem_bytes"], errors="coerce") / 1024).round(1).astype(str)
        + " KiB]",
        limiter=table["limiter"].fillna("unknown").astype(str),
        blocks_per_sm=pd.to_numeric(table["blocks_per_sm"], errors="coerce"),
    ).sort_values("blocks_per_sm", kind="stable")
    palette = ["#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#999999"]
    limits = sorted(shapes["limiter"].unique())
    bars = hv.Bars(_plain(shapes), kdims=[hv.Dimension("kernel", label="Kernel launch shape")],
                   vdims=[hv.Dimension("blocks_per_sm", label="Resident blocks per SM"), "limiter", "name"]).opts(
        color=hv.dim("limiter").categorize(dict(zip(limits, palette)), default="#999999"), invert_axes=True,
        tools=["hover"], width=width, height=max(height, 22 * len(shapes) + 120),
        title="Residency per kernel (colour: limiting resource)", show_legend=True)  # fmt: skip
    panels = [bars]
    if delays is not None and len(delays):
        d = delays.assign(
            start_delay_us=pd.to_numeric(delays["start_delay_us"], errors="coerce"),
            n_resident_compute=pd.to_numeric(delays.get("n_resident_compute"), errors="coerce"),
            kernel=_short(delays["name"].astype(str)),
        )
        panels.append(
            hv.Scatter(_plain(d), kdims=[hv.Dimension("n_resident_compute", label="Computation kernels resident at launch")],
                       vdims=[hv.Dimension("start_delay_us", label="Comm start delay (µs)"), "kernel", "rank"]).opts(
                color="#D55E00", size=6, alpha=0.6, tools=["hover"], width=width, height=height,
                title="Communication start delay vs resident computation", jitter=0.3)  # fmt: skip
        )
        panels.append(
            hv.Histogram(np.histogram(d["start_delay_us"].dropna(), bins=40), kdims=[hv.Dimension("start_delay_us", label="Comm start delay (µs)")]).opts(
                color="#D55E00", width=width, height=height, title="Communication start delays", ylabel="Comm kernels")  # fmt: skip
        )
    return hv.Layout(panels).opts(shared_axes=False).cols(1)


def _short(names: pd.Series, n: int = 48) -> pd.Series:
    names = names.str.replace(r"^void ", "", regex=True).str.replace(r"\(.*$", "", regex=True)
    return names.where(names.str.len() <= n, names.str.slice(0, n - 1) + "…")


def compare(data_a: TimelineData, data_b: TimelineData, deltas: pd.DataFrame | None = None, *, x_range=None,
            labels: tuple[str, str] = ("A", "B"), width: int = 1100, max_glyphs: int = MAX_GLYPHS) -> hv.Layout:
    """Two configurations' timelines one above the other on linked time axes, and the metric deltas.

    Parameters
    ----------
    data_a, data_b
        ``TimelineData`` (or kernels frames) of the two runs; both start at 0 ms.
    deltas
        Optional table of metric values and their differences (from ``overlapviz.analysis.speedup.compare``
        or the metrics frames), shown as a table below.
    x_range
        (start, end) in ms; both whole runs when None.
    labels
        The two panels' titles.
    width, max_glyphs
        See ``timeline_view``.
    """
    data_a = data_a if isinstance(data_a, TimelineData) else TimelineData(data_a)
    data_b = data_b if isinstance(data_b, TimelineData) else TimelineData(data_b)
    a = timeline_view(data_a, x_range, title=str(labels[0]), width=width, max_glyphs=max_glyphs)
    b = timeline_view(data_b, x_range, title=str(labels[1]), width=width, max_glyphs=max_glyphs)
    panels = [a, b]
    if deltas is not None and len(deltas):
        deltas = delta_display(deltas)
        panels.append(hv.Table(deltas).opts(width=width, height=25 * len(deltas) + 60, title="Metric deltas (B − A)"))
    return hv.Layout(panels).cols(1)


def delta_display(deltas: pd.DataFrame) -> pd.DataFrame:
    """A deltas table as text for display: numbers to 4 significant digits, intervals as ``[low, high]``.

    Accepts ``overlapviz.analysis.speedup.compare`` rows (``section, item, a, b, delta, delta_ci_low,
    delta_ci_high, ratio``) or ``metric_deltas`` rows; other columns are dropped.
    """

    def fmt(v) -> str:
        if v is None or (not isinstance(v, str) and pd.isna(v)):
            return ""
        if isinstance(v, (float, np.floating)):
            return f"{v:.4g}"
        return str(v)

    if "item" not in deltas:
        return pd.DataFrame({c: deltas[c].map(fmt) for c in deltas.columns}).astype(object)
    out = {"section": deltas["section"].map(fmt) if "section" in deltas else "", "item": deltas["item"].map(fmt),
           "A": deltas["a"].map(fmt), "B": deltas["b"].map(fmt), "B − A": deltas["delta"].map(fmt)}  # fmt: skip
    if "delta_ci_low" in deltas and "delta_ci_high" in deltas:
        lo, hi = deltas["delta_ci_low"].map(fmt), deltas["delta_ci_high"].map(fmt)
        out["95% CI of B − A"] = np.where(lo != "", "[" + lo + ", " + hi + "]", "")
    if "ratio" in deltas:
        out["B / A"] = deltas["ratio"].map(fmt)
    return pd.DataFrame(out).astype(object)
