"""Figure builders: ``(table, *, keyword options) -> HoloViews object``, never shown; dashboards and export compose them. They draw analysis results and compute no metric.

This module holds the shared style (colours, labels, number formats) and the configuration
grid (heatmap, speedup forest plot), per-rank communication, residency and the compare
deltas; ``overlapviz.figures.timeline`` draws timelines and ``overlapviz.figures.why`` the
why-views (late starts by cause, one SM's budget, collectives across ranks).
"""

from __future__ import annotations

import holoviews as hv
import holoviews.plotting.bokeh  # noqa: F401  (registers the bokeh backend's options without notebook output)
import numpy as np
import pandas as pd

from overlapviz.domain import vocabulary
from overlapviz.analysis import ranks as ranks_analysis

# builders use bokeh-backend options; register it as current without notebook output (hv.extension prints)
hv.Store.set_current_backend("bokeh")

# the timeline's kinds: in greyscale print their lightness (CIE L*) is 46, 63, 79 and 29, at least 15 apart, and under
# simulated deuteranopia, protanopia and tritanopia any two stay > 28 CIELAB units apart (tests/test_figures.py checks
# both). Okabe-Ito blue, Paul Tol's orange and light cyan, a dark grey; Okabe-Ito's blue, vermilion, green and grey
# were L* 46, 54, 58 and 63: compute, comm and memory printed as nearly one grey (issue 33)
KIND_COLORS = {"compute": "#0072B2", "comm": "#EE7733", "memory": "#88CCEE", "other": "#444444"}
# why a collective waited (overlapviz.analysis.explain's causes). Picked so that in greyscale print their lightness
# (CIE L*) is 0, 22, 54, 71 and 88, at least 15 apart, and under simulated deuteranopia, protanopia and tritanopia
# any two stay > 30 CIELAB units apart (tests/test_figures.py checks both). Okabe-Ito's sky blue and orange were 1 L*
# apart: stream order and SM resources read alike in greyscale (issue 33)
CAUSE_COLORS = {
    "stream_order": "#EE3377", "dependency": "#332288", "sm_resources": "#E69F00", "launch_latency": "#DDDDDD",
    "unknown": "#000000", "none": "#FFFFFF", "launch_call": "#7A5A00",
}  # fmt: skip
# where communication time went (overlapviz.analysis.breakdown's parts): Paul Tol's high-contrast scheme (made for
# greyscale and colour-blind readers: L* 29, 50, 72, black, light grey)
BREAKDOWN_COLORS = {"overlapped": "#004488", "peer wait": "#BB5566", "dependent": "#DDAA33", "host idle": "#000000",
                    "other exposed": "#DDDDDD"}  # fmt: skip
# the ranks figure's communication, overlapped or exposed (L* 29 and 72; Okabe-Ito's green and vermilion were 58 and 54)
RANKS_COLORS = {"overlapped": BREAKDOWN_COLORS["overlapped"], "exposed": "#DDAA33"}
# the ranks figure's GPU span: normal, or long (> median + tolerance), L* 46 and 72; the old pink #CC79A7 (L* 61) was
# 23 CIELAB units from the blue under protanopia
SPAN_COLORS = {"normal": KIND_COLORS["compute"], "long": "#EE99AA"}
# what limits a kernel's resident blocks (occupancy.RESOURCES; unknown: no limiter known). L* 0, 22, 40, 54, 70 and 88,
# and > 25 CIELAB units apart under simulated deuteranopia, protanopia and tritanopia (tests/test_figures.py); Paul
# Tol's indigo and magenta, Okabe-Ito's sky blue, a brown, black. The Okabe-Ito set it replaces printed shared memory
# (L* 71) and SGPRs (70) as one grey, and warps (58), block slots (61) and unknown (63) nearly so (issue 33)
LIMITER_COLORS = {"registers": "#332288", "shared_memory": "#56B4E9", "warps": "#EE3377", "blocks": "#7A5A00",
                  "sgprs": "#000000", "unknown": "#DDDDDD"}  # fmt: skip
BREAKDOWN_PARTS = {"overlapped": "overlapped_ns", "peer wait": "peer_wait_ns", "dependent": "dependent_ns", "host idle": "host_idle_ns",
                   "other exposed": "exposed_other_ns"}  # fmt: skip
CAUSE_LABELS = {
    "stream_order": "stream order", "dependency": "event dependency", "sm_resources": "SM resources",
    "launch_latency": "launch latency", "unknown": "unknown", "none": "no delay", "launch_call": "long launch call",
}  # fmt: skip
STAND_IN_NOTE = "single-GPU stand-in collective, not real NCCL/RCCL"
TITLE_FONT = "11pt"


def legend_points(items: dict) -> hv.Points:
    """One element of zero-size points whose colours carry a legend (``{entry: colour}``)."""
    frame = pd.DataFrame({"x": np.full(len(items), np.nan), "y": np.full(len(items), np.nan), "entry": list(items)})
    return hv.Points(frame, kdims=["x", "y"], vdims=["entry"]).opts(
        color="entry", cmap=items, marker="square", size=10, show_legend=True, default_tools=[])


def plain_frame(frame: pd.DataFrame) -> pd.DataFrame:
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


# occupancy's limiter names (``occupancy.kernel_occupancy``) in words, as the pages and figures say them
LIMITER_LABELS = {"registers": "registers", "shared_memory": "shared memory", "warps": "warps", "blocks": "block slots",
                  "sgprs": "SGPRs", "vgprs": "VGPRs", "shared_memory_carveout": "shared memory (carve-out)"}  # fmt: skip


def limiter_words(limiters: pd.Series) -> pd.Series:
    """``limiter`` values as the pages say them ("shared memory", not ``shared_memory``); unknown where missing."""
    return limiters.map(lambda v: "unknown" if _null(v) else LIMITER_LABELS.get(str(v), str(v).replace("_", " ")))


def hv_title(text: str) -> str:
    """``text`` as a HoloViews plot's ``title`` option. HoloViews fills a title's ``{label}``, ``{group}``... with
    ``str.format``: a brace in a kernel's or a run's name (PyTorch's ``{lambda(float)#1}``, GCC's ``{anonymous}``) raised
    KeyError and the plot was not drawn. Braces doubled, it shows the text as it is."""
    return str(text).replace("{", "{{").replace("}", "}}")


def plot_title(base: str, stand_in: bool) -> str:
    """A plot title, the stand-in marked on a second line (one line would be clipped)."""
    return f"{base}\n({STAND_IN_NOTE})" if stand_in else base


# --- number formats (the CLI's: µs to 3 decimals under 10 and 1 above, ratios to 3, fractions in %) ---


def _null(v) -> bool:
    return v is None or (not isinstance(v, str) and pd.isna(v))


def fmt_us(v) -> str:
    """µs as the CLI prints them: ``5,841.9``, ``0.930``; ``—`` for null."""
    if _null(v):
        return "—"
    return f"{v:,.3f}" if abs(v) < 10 else f"{v:,.1f}"


def fmt_ratio(v) -> str:
    return "—" if _null(v) else f"{v:,.3f}"


def fmt_pct(v) -> str:
    return "—" if _null(v) else f"{100 * v:.1f} %"


def fmt_bytes(v) -> str:
    """Bytes as ``48 KiB``, ``1.5 MiB``, ``512 B``; ``—`` for null."""
    if _null(v):
        return "—"
    v = float(v)
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(v) >= size:
            return f"{v / size:,.1f} {unit}".replace(".0 ", " ")
    return f"{int(v)} B"


def fmt_num(v) -> str:
    """Any number for a table cell: integers with separators, others to 4 significant digits, never in e-notation."""
    if _null(v):
        return "—"
    if isinstance(v, (bool, np.bool_)):
        return "yes" if v else "no"
    if isinstance(v, (int, np.integer)) or (isinstance(v, (float, np.floating)) and float(v).is_integer() and abs(v) >= 1):
        return f"{int(v):,}"
    if isinstance(v, (float, np.floating)):
        a = abs(v)
        if a >= 1000:
            return f"{v:,.1f}"
        if a >= 1:
            return f"{v:,.4g}"
        return f"{v:.4f}".rstrip("0").rstrip(".") if a >= 1e-4 else f"{v:.2g}"
    return str(v)


def int_text(values, missing: str = "—") -> np.ndarray:
    """Integers as text (object array), ``missing`` where a value is missing or not a number. Not ``astype(str)``: pandas
    3 keeps a missing value missing there (a table shows it as NaN), where pandas 2 wrote "<NA>"."""
    v = pd.to_numeric(pd.Series(values, copy=False), errors="coerce")
    out = np.full(len(v), missing, dtype=object)
    ok = v.notna().to_numpy(bool)
    out[ok] = v[ok].to_numpy(np.int64).astype(str)
    return out


def fmt_duration(us) -> str:
    """A duration given in µs, in the unit that reads best: ``930.1 µs``, ``12.3 ms``, ``81.4 s``."""
    if _null(us):
        return "—"
    unit, div = time_unit(abs(us))
    return f"{fmt_us(us)} µs" if unit == "µs" else f"{us / div:,.1f} {unit}"


def time_unit(max_us: float) -> tuple[str, float]:
    """A readable unit for µs values up to ``max_us``: (name, divisor)."""
    if max_us >= 1e6:
        return "s", 1e6
    if max_us >= 1e4:
        return "ms", 1e3
    return "µs", 1.0


def short_name(name, n: int = 60) -> str:
    """A kernel's function name with its template arguments, no return type or parameter list
    (``vocabulary.function_name``), at most ``n`` characters; "—" for none."""
    return "—" if _null(name) else vocabulary.short_name(str(name), n, templates=True)


def short_names(names, n: int = 60) -> np.ndarray:
    """``short_name`` of each name, computed once per distinct name."""
    codes, uniq = pd.factorize(pd.Series(names, dtype=object), use_na_sentinel=True)
    table = np.array([short_name(u, n) for u in uniq] + ["—"], dtype=object)
    return table[np.where(codes < 0, len(uniq), codes)]


# --- configuration grid ---------------------------------------------------------------

VALUE_LABELS = {
    "time_ratio": "TimeRatio (t / t sequential, lower is better)",
    "speedup": "Speedup (t baseline / t, higher is better)",
    "overlap_fraction": "Overlap fraction (overlapped comm / comm)",
}
VALUE_SHORT = {"time_ratio": "TimeRatio", "speedup": "Speedup", "overlap_fraction": "Overlap"}
_SETUP_ORDER = {"sequential": 0, "baseline": 1, "optimized": 2}


def _pad_label(values: pd.Series) -> pd.Series:
    v = pd.to_numeric(values, errors="coerce")
    return v.map(lambda b: "n/a" if pd.isna(b) else (f"{b / 1024:g} KiB" if b >= 1024 else f"{int(b)} B"))


def config_grid(table: pd.DataFrame) -> pd.DataFrame:
    """``config_table`` rows with the axis labels the heatmap uses: ``shaping`` (x); ``facet``, the group of runs of one
    workload and GEMM (implementation, dtype, size, tile); ``row``, what varies inside a group (setup, stream priority and
    the SM-partitioning controls: SM carve-out, green-context SMs, work queues, launch order, shared-memory carve-out);
    ``label`` (the y axis: ``facet │ row``, without the workload when only one is shown, with ``#2``, ``#3``... for
    repeated recordings, so no two runs share a cell); and the sort keys (``facet_sort`` first: groups stay together)."""
    prio = pd.to_numeric(table.get("comm_priority_effective", table.get("comm_priority")), errors="coerce")
    if "comm_priority" in table:
        prio = prio.fillna(pd.to_numeric(table["comm_priority"], errors="coerce"))
    priority = prio.map(lambda p: "prio 0" if pd.isna(p) or p == 0 else f"prio {int(p)}")
    workload = _col(table, "workload").astype(object).where(_col(table, "workload").notna(), "imported").astype(str)
    gemm = _gemm_label(table)
    facet = workload + np.where(gemm != "", " · " + gemm, "")
    setup = _col(table, "setup").astype(object).where(_col(table, "setup").notna(), "?").astype(str)
    controls = _controls_label(table)
    row = setup + " · " + priority + np.where(controls != "", " · " + controls, "")
    grid = table.assign(
        shaping=_pad_label(table["smem_pad_bytes"]) if "smem_pad_bytes" in table else "n/a",
        # CUDA and HIP: a lower number is a higher stream priority; 0 is the default
        priority=priority, facet=facet, row=row, controls=controls,
        pad_sort=pd.to_numeric(table["smem_pad_bytes"], errors="coerce").fillna(-1) if "smem_pad_bytes" in table else 0,
        prio_sort=prio.fillna(0), setup_sort=setup.map(_SETUP_ORDER).fillna(9),
        facet_sort=pd.Series(pd.factorize(pd.Series(list(zip(workload, gemm == "", gemm)), index=table.index).map(str), sort=True)[0], index=table.index),
    )  # fmt: skip
    one = workload.nunique() == 1
    inner = np.where(gemm != "", gemm + " │ " + row, row) if one else facet + " │ " + row
    grid = grid.assign(label=pd.Series(inner, index=table.index, dtype=object))
    grid = grid.assign(row=grid["row"] + (rep := _repeats(grid.assign(row=grid["label"]))), label=grid["label"] + rep)
    return grid


def _col(table: pd.DataFrame, name: str) -> pd.Series:
    return table[name] if name in table else pd.Series(pd.NA, index=table.index, dtype=object)


_DTYPES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "float64": "fp64", "float8_e4m3fn": "fp8"}


def _gemm_label(table: pd.DataFrame) -> pd.Series:
    """The GEMM of each run in words, every known part named on every row: ``tiled fp32 2048³ tile 64×64×32``,
    ``vendor bf16 8192³`` (implementation, dtype, M×N×K, tile); empty when none is known (imported traces)."""
    num = {c: pd.to_numeric(_col(table, c), errors="coerce") for c in ("gemm_m", "gemm_n", "gemm_k", "tile_m", "tile_n", "tile_k")}
    out = []
    for i, (impl, dtype) in enumerate(zip(_col(table, "compute_impl"), _col(table, "dtype"))):
        parts = [] if _null(impl) else [str(impl)]
        if not _null(dtype):
            parts.append(_DTYPES.get(str(dtype), str(dtype)))
        m, n, k = (num[c].iloc[i] for c in ("gemm_m", "gemm_n", "gemm_k"))
        if not pd.isna(m):
            parts.append(f"{int(m)}³" if m == n == k else f"{int(m)}×{int(n)}×{int(k)}")
        tm, tn, tk = (num[c].iloc[i] for c in ("tile_m", "tile_n", "tile_k"))
        if not pd.isna(tm):
            parts.append(f"tile {int(tm)}×{int(tn)}×{int(tk)}")
        out.append(" ".join(parts))
    return pd.Series(out, index=table.index, dtype=object)


# the SM-partitioning controls beside shaping and priority, as row-label parts (named where set)
_CONTROLS = [
    ("sm_carveout", lambda v: f"carve-out {int(v)} SMs" if v > 0 else None),
    ("green_ctx_sms", lambda v: f"green ctx {int(v)} SMs"),
    ("cuda_max_connections", lambda v: f"{int(v)} connection{'s' if v != 1 else ''}"),
    ("smem_carveout_percent", lambda v: f"smem carve-out {int(v)} %"),
]


def _controls_label(table: pd.DataFrame) -> pd.Series:
    """The controls set on each run (``carve-out 16 SMs · green ctx 112 SMs · 1 connection · comm first``), else ''."""
    cols = [(_num_text(_col(table, c), f)) for c, f in _CONTROLS]
    order = _col(table, "launch_order")
    out = []
    for i in range(len(table)):
        parts = [c.iloc[i] for c in cols if not _null(c.iloc[i])]
        o = order.iloc[i]
        if not _null(o) and str(o) != "compute-first":  # the collectors' default order is not a control
            parts.append(str(o).replace("-", " "))
        out.append(" · ".join(parts))
    return pd.Series(out, index=table.index, dtype=object)


def _num_text(values: pd.Series, fmt) -> pd.Series:
    v = pd.to_numeric(values, errors="coerce")
    return pd.Series([None if pd.isna(x) else fmt(x) for x in v], index=values.index, dtype=object)


def _repeats(grid: pd.DataFrame) -> pd.Series:
    """``#2``, ``#3``... for later recordings of a configuration already in the grid (by start time, else order)."""
    order = grid.sort_values("start_time", kind="stable").index if "start_time" in grid else grid.index
    n = grid.loc[order].groupby(["row", "shaping"], sort=False).cumcount().reindex(grid.index)
    return pd.Series(np.where(n > 0, " · #" + (n + 1).astype(str), ""), index=grid.index)


def palette(name: str, n: int = 256) -> list[str]:
    """Bokeh's colour map ``name`` (``viridis``, ``RdBu``, ``RdBu_r``) as ``n`` hex colours: the list HoloViews'
    ``process_cmap`` gives, without its look through every provider (which imports colorcet: 0.3 s of an export)."""
    from holoviews.plotting.util import bokeh_palette_to_palette

    return list(bokeh_palette_to_palette(name, n))


def _text_colors(values: np.ndarray, cmap: list[str], clim: tuple[float, float]) -> np.ndarray:
    """Black or white per cell, whichever reads on the cell's colour (WCAG relative luminance)."""
    pos = np.clip((values - clim[0]) / max(clim[1] - clim[0], 1e-12), 0, 1)
    idx = np.nan_to_num(pos * (len(cmap) - 1)).round().astype(int)
    rgb = np.array([[int(c[i : i + 2], 16) / 255 for i in (1, 3, 5)] for c in cmap])[idx]
    lin = np.where(rgb <= 0.04045, rgb / 12.92, ((rgb + 0.055) / 1.055) ** 2.4)
    lum = lin @ np.array([0.2126, 0.7152, 0.0722])
    return np.where(lum > 0.22, "black", "white")


def heatmap(table: pd.DataFrame, *, value: str = "time_ratio", width: int = 1100, row_height: int = 32) -> hv.Overlay:
    """One heatmap of ``value`` over the configuration grid: shaping (x) by workload · setup · GEMM · priority (y).

    Parameters
    ----------
    table
        ``overlapviz.analysis.speedup.config_table`` rows: ``run_id``, ``workload``, ``setup``,
        ``smem_pad_bytes``, ``comm_priority`` and the value column. Not modified. Runs without
        a value (no measured iterations) are left out.
    value
        ``time_ratio``, ``speedup`` or ``overlap_fraction``; TimeRatio and speedup are coloured
        on a diverging scale centred on 1 (no change), overlap fraction from 0 to 1. One colour
        bar for the whole grid.
    width, row_height
        Pixels.

    Returns
    -------
    hv.Overlay of ``hv.HeatMap`` (carrying ``run_id``) and ``hv.Labels``.
    """
    if value not in table:
        raise ValueError(f"config table has no column {value!r}")
    grid = config_grid(table)
    vals = pd.to_numeric(grid[value], errors="coerce")
    grid = grid.assign(**{value: vals}).loc[vals.notna()]
    vals = grid[value]
    if value == "overlap_fraction":
        cmap_name, clim = "viridis", (0.0, 1.0)
        text = vals.map(fmt_pct)
    else:
        dev = float(np.nanmax(np.abs(vals - 1.0))) if len(vals) else 0.1
        cmap_name, clim = ("RdBu_r" if value == "time_ratio" else "RdBu"), (1 - max(dev, 0.02), 1 + max(dev, 0.02))
        text = vals.map(fmt_ratio if value == "time_ratio" else (lambda v: f"{v:.3f}×"))
    cmap = palette(cmap_name)
    grid = grid.assign(text=text, text_color=_text_colors(vals.to_numpy(np.float64), cmap, clim))
    grid = grid.sort_values(["facet_sort", "setup_sort", "prio_sort", "label", "pad_sort"], ascending=[True, True, False, True, True],
                            kind="stable")  # fmt: skip
    rows = list(dict.fromkeys(grid["label"]))
    cols = list(dict.fromkeys(grid.sort_values("pad_sort", kind="stable")["shaping"]))
    stand_in = bool(grid.get("stand_in", pd.Series(False, index=grid.index)).fillna(False).astype(bool).any())
    sub = plain_frame(grid[["shaping", "label", value, "run_id", "text", "text_color"]])
    xdim = hv.Dimension("shaping", label="Occupancy shaping (smem pad per GEMM block)", values=cols)
    ydim = hv.Dimension("label", label="configuration", values=rows[::-1])
    workloads = grid["workload"].dropna().unique() if "workload" in grid else []
    what = f"{VALUE_LABELS[value]} — {workloads[0]}" if len(workloads) == 1 else VALUE_LABELS[value]
    hm = hv.HeatMap(sub, kdims=[xdim, ydim], vdims=[hv.Dimension(value, label=VALUE_SHORT[value]), "run_id", "text"])
    labels = hv.Labels(sub, kdims=[xdim, ydim], vdims=["text", "text_color"])
    fmt = "0.0%" if value == "overlap_fraction" else "0.000"
    from bokeh.models import NumeralTickFormatter

    return (
        hm.opts(cmap=cmap, clim=clim, colorbar=True, tools=["hover", "tap"], xrotation=0, default_tools=["save"], ylabel="",
                colorbar_opts={"title": VALUE_SHORT[value], "formatter": NumeralTickFormatter(format=fmt), "width": 12},
                hover_tooltips=[("run", "@{run_id}"), ("configuration", "@{label}"), ("shaping", "@{shaping}"),
                                (VALUE_SHORT[value], "@{text}")])  # fmt: skip
        * labels.opts(text_font_size="10pt", text_color="text_color")
    ).opts(title=hv_title(plot_title(what, stand_in)), width=width, height=max(220, row_height * len(rows) + 140),
           fontsize={"title": TITLE_FONT}, toolbar="right", ylabel="")  # fmt: skip


def speedup_bars(table: pd.DataFrame, *, width: int = 900, height: int | None = None) -> hv.Overlay:
    """Speedup over baseline per configuration with its confidence interval (a forest plot).

    Parameters
    ----------
    table
        ``config_table`` rows with ``speedup`` and, where present, ``speedup_ci_low`` /
        ``speedup_ci_high``. Not modified.

    Returns
    -------
    hv.Overlay: the intervals (``hv.Segments``), one point per configuration (``hv.Scatter``,
    speedup on x, configurations on y) and a vertical line at 1 (no change).
    """
    grid = config_grid(table)
    grid = grid.assign(speedup=pd.to_numeric(grid["speedup"], errors="coerce")).loc[lambda g: g["speedup"].notna()]
    grid = grid.sort_values(["facet_sort", "setup_sort", "prio_sort", "label", "pad_sort"], ascending=[True, True, False, True, True],
                            kind="stable")  # fmt: skip
    label = grid["label"] + " · pad " + grid["shaping"]
    frame = pd.DataFrame({"configuration": label.to_numpy(object), "speedup": grid["speedup"].to_numpy(np.float64),
                          "run_id": grid["run_id"].astype(str).to_numpy(object)})  # fmt: skip
    lo, hi = _ci_columns(grid, "speedup")
    frame["low"] = pd.to_numeric(grid[lo], errors="coerce").to_numpy(np.float64) if lo else frame["speedup"]
    frame["high"] = pd.to_numeric(grid[hi], errors="coerce").to_numpy(np.float64) if hi else frame["speedup"]
    stand_in = bool(grid.get("stand_in", pd.Series(False, index=grid.index)).fillna(False).astype(bool).any())
    height = max(260, 26 * len(frame) + 110) if height is None else height
    ydim = hv.Dimension("configuration", label="Configuration", values=list(frame["configuration"])[::-1])
    xdim = hv.Dimension("speedup", label="Speedup vs baseline overlap (×)")
    ci = hv.Segments(frame, kdims=[hv.Dimension("low", label=xdim.label), ydim, "high", "configuration"]).opts(
        color="black", line_width=1.5, default_tools=[])  # fmt: skip
    points = hv.Scatter(frame, kdims=[xdim], vdims=[ydim, "run_id", "low", "high"]).opts(
        color="#0072B2", size=9, tools=["hover"], default_tools=["save"],
        hover_tooltips=[("run", "@{run_id}"), ("speedup", "@{speedup}{0.000}×"), ("95% CI", "@{low}{0.000} – @{high}{0.000}")])  # fmt: skip
    ref = hv.VLine(1.0).opts(color="black", line_dash="dashed", line_width=1)
    return (ci * points * ref).opts(title=plot_title("Speedup over baseline overlap (median iteration, 95% CI)", stand_in),
                                    width=width, height=height, show_grid=True, fontsize={"title": TITLE_FONT})  # fmt: skip


def _ci_columns(table: pd.DataFrame, value: str) -> tuple[str | None, str | None]:
    for lo, hi in ((f"{value}_ci_low", f"{value}_ci_high"), (f"{value}_low", f"{value}_high"), (f"{value}_lo", f"{value}_hi")):
        if lo in table and hi in table:
            return lo, hi
    return None, None


# --- ranks, residency, compare deltas ----------------------------------------------------------


def ranks(metrics: pd.DataFrame, *, width: int = 560, height: int = 320, tolerance: float = 0.05) -> hv.Layout:
    """Per-rank overlapped vs exposed communication and busy span, spans longer than the median's highlighted
    (not stragglers: the ranks that waited for one have the longest spans).

    Parameters
    ----------
    metrics
        ``overlapviz.analysis.metrics.analyze`` rows (per rank) of one run (``rank``, ``overlap_us``,
        ``exposed_comm_us``, ``span_us``, ``run_id``). Not modified.
    width, height
        Per panel, pixels.
    tolerance
        Threshold over the run's median span (:func:`overlapviz.analysis.ranks.long_span_ranks`).
    """
    rank = metrics["rank"].astype(int).astype(str)
    top = float(pd.to_numeric(metrics["comm_us"], errors="coerce").max()) if "comm_us" in metrics else 0.0
    unit, div = time_unit(top if np.isfinite(top) else 0.0)
    stacked = pd.concat(
        [
            pd.DataFrame({"rank": rank, "part": "overlapped", "t": pd.to_numeric(metrics["overlap_us"]) / div}),
            pd.DataFrame({"rank": rank, "part": "exposed", "t": pd.to_numeric(metrics["exposed_comm_us"]) / div}),
        ],
        ignore_index=True,
    )
    comm = hv.Bars(plain_frame(stacked), kdims=[hv.Dimension("rank", label="Rank"), hv.Dimension("part", label="Communication")],
                   vdims=[hv.Dimension("t", label=f"Communication time ({unit})")]).opts(
        stacked=True, cmap=RANKS_COLORS, tools=["hover"], width=width, default_tools=["save"],
        height=height, title="Communication per rank: overlapped vs exposed", legend_position="right", fontsize={"title": TITLE_FONT},
        yformatter="%.1f", padding=(0, (0, 0.05)))  # fmt: skip
    strag = ranks_analysis.long_span_ranks(metrics, tolerance=tolerance)
    spans = pd.DataFrame(
        {"rank": rank, "span_ms": pd.to_numeric(metrics["span_us"]) / 1e3,
         "status": np.where(strag, f"span > median + {tolerance:.0%}", "normal")}
    )  # fmt: skip
    span = hv.Bars(plain_frame(spans), kdims=[hv.Dimension("rank", label="Rank")],
                   vdims=[hv.Dimension("span_ms", label="GPU span (ms)"), "status"]).opts(
        color=hv.dim("status").categorize({"normal": SPAN_COLORS["normal"]}, default=SPAN_COLORS["long"]), tools=["hover"], default_tools=["save"],
        width=width, height=height, title=f"GPU span per rank (pink: > median + {tolerance:.0%})", fontsize={"title": TITLE_FONT},
        yformatter="%.2f", padding=(0, (0, 0.05)))  # fmt: skip
    return (comm + span).opts(shared_axes=False)


RESIDENCY_TOP = 25  # kernel shapes drawn at most (by total time); the table lists them all


def residency(table: pd.DataFrame, *, width: int = 1000, top: int = RESIDENCY_TOP) -> hv.Bars:
    """Resident computation blocks per SM of the busiest kernel launch shapes, coloured by the limiting resource.

    Parameters
    ----------
    table
        ``overlapviz.analysis.residency.kernel_residency`` rows (``name``, ``blocks_per_sm``,
        ``limiter``, ``threads_per_block``, ``regs_per_thread``, ``shared_mem_bytes``,
        ``total_us``). Not modified. Shapes without a residency are left out.
    top
        Shapes drawn, most total time first.
    """
    t = table.assign(blocks_per_sm=pd.to_numeric(table["blocks_per_sm"], errors="coerce")).loc[lambda d: d["blocks_per_sm"].notna()]
    if "total_us" in t:
        t = t.sort_values("total_us", ascending=False, kind="stable")
    n_all = len(t)
    t = t.head(top)
    shapes = t.assign(
        kernel=pd.Series(short_names(t["name"], 48), index=t.index) + " · " + int_text(t["threads_per_block"], "?") + " thr, "
        + int_text(t["regs_per_thread"], "?") + " reg, " + t["shared_mem_bytes"].map(fmt_bytes),
        limiter=limiter_words(t["limiter"]),
        time=t["total_us"].map(fmt_us) if "total_us" in t else "—",
    )  # fmt: skip
    # one bar per label: a shape drawn twice is left out; two template instances of one function with the same launch
    # shape but another residency (their names differ only in what the label leaves out) are numbered
    shapes = shapes.drop_duplicates(["kernel", "blocks_per_sm", "limiter"])
    again = shapes.groupby("kernel", sort=False).cumcount().to_numpy()
    shapes = shapes.assign(kernel=shapes["kernel"] + np.where(again > 0, [f" ({i + 1})" for i in again], ""))
    by_limiter = {LIMITER_LABELS.get(k, k): c for k, c in LIMITER_COLORS.items()}
    more = f"top {len(shapes)} of {n_all} by time, all in the table; " if n_all > len(shapes) else ""
    # the limiter as a second key of one-segment stacks: HoloViews then draws its legend (a colour by dim has none)
    limiters = list(dict.fromkeys(shapes["limiter"]))
    return hv.Bars(plain_frame(shapes[::-1]), kdims=[hv.Dimension("kernel", label="Kernel launch shape"), hv.Dimension("limiter", label="limited by")],
                   vdims=[hv.Dimension("blocks_per_sm", label="Resident blocks per SM"), "name", "time"]).opts(
        stacked=True, cmap={lim: by_limiter.get(lim, LIMITER_COLORS["unknown"]) for lim in limiters}, invert_axes=True, tools=["hover"],
        default_tools=["save"], width=width, height=max(200, 24 * len(shapes) + 110), show_legend=True,
        legend_position="right", legend_opts={"title": "limited by"}, fontsize={"title": TITLE_FONT},
        # two lines: a long kernel name's axis labels leave the title little of the figure's width
        title=f"Resident blocks per SM by kernel launch shape\n({more}colour: limiting resource)",
        hover_tooltips=[("kernel", "@{name}"), ("blocks/SM", "@{blocks_per_sm}"), ("limited by", "@{limiter}"), ("total time", "@{time} µs")],
    )  # fmt: skip


# friendly names of speedup.compare's items (its `item` column), with units
ITEM_LABELS = {
    "smem_pad_bytes": "smem pad per GEMM block (B)",
    "comm_priority": "comm stream priority (requested)",
    "comm_priority_effective": "comm stream priority (effective)",
    "compute_impl": "GEMM implementation",
    "sm_carveout": "SM carve-out (SMs)",
    "message_bytes": "message size (B)",
    "median_ms": "median iteration time (ms)",
    "time_ratio": "TimeRatio (t / t sequential)",
    "speedup": "speedup (t baseline / t)",
    "overlap_fraction": "overlap fraction",
    "compute_slowdown": "compute slowdown",
    "comm_us": "comm time per rank (µs)",
    "compute_us": "compute time per rank (µs)",
    "exposed_comm_us": "exposed comm per rank (µs)",
    "median_start_delay_us": "comm start delay, ready → start: median over ranks of each rank's median (µs; explain --summary)",
    "p95_start_delay_us": "comm start delay, ready → start: p95, worst rank (µs)",
    "median_start_delay_at_launch_us": "comm start delay, ready → start: median of the collectives ready at their launch (µs; the sweep report's and README's column)",
    "n_comm_blocked": "comm kernels held off the SMs (sm_resources)",
}


def _item_format(item: str):
    if item in ("time_ratio", "speedup", "compute_slowdown", "median_ms"):
        return fmt_ratio
    if item == "overlap_fraction":
        return fmt_pct
    if item.endswith("_us"):
        return fmt_us
    return fmt_num


def delta_display(deltas: pd.DataFrame) -> pd.DataFrame:
    """A deltas table as text for display: friendly item names with units, the CLI's number formats (ratios and ms to
    3 decimals, µs to 1 above 10, fractions in %), intervals as ``[low, high]``.

    Accepts ``overlapviz.analysis.speedup.compare`` rows (``section, item, a, b, delta, delta_ci_low,
    delta_ci_high, ratio``) or ``metric_deltas`` rows; other columns are dropped.
    """
    if "item" not in deltas:
        return pd.DataFrame({c: deltas[c].map(fmt_num) for c in deltas.columns}).astype(object)
    items = deltas["item"].astype(str).tolist()
    fmts = [_item_format(i) for i in items]

    def col(name: str, fmt=None) -> list[str]:
        if name not in deltas:
            return ["—"] * len(items)
        return [(fmt or f)(v) if not isinstance(v, str) else v for f, v in zip(fmts, deltas[name])]

    out = {"section": col("section", fmt_num), "item": [ITEM_LABELS.get(i, i) for i in items], "A": col("a"), "B": col("b"),
           "B − A": col("delta")}  # fmt: skip
    if "delta_ci_low" in deltas and "delta_ci_high" in deltas:
        lo, hi = col("delta_ci_low"), col("delta_ci_high")
        out["95% CI of B − A"] = [f"[{a}, {b}]" if a != "—" else "—" for a, b in zip(lo, hi)]
    if "ratio" in deltas:
        out["B / A"] = col("ratio", fmt_ratio)
    return pd.DataFrame(out).astype(object)


# --- where communication time went -------------------------------------------------------------


def breakdown(table: pd.DataFrame, findings: pd.DataFrame | None = None, *, width: int = 900, bar_height: int = 26) -> hv.Overlay:
    """Per rank, its communication time as one horizontal bar: overlapped, then the exposed part split into peer wait,
    dependent, host idle and other (``overlapviz.analysis.breakdown``'s parts, which add up to the exposed time).

    Parameters
    ----------
    table
        ``breakdown(..., per="rank")`` rows of one run: ``rank``, ``comm_ns``, ``overlapped_ns``, ``peer_wait_ns``,
        ``dependent_ns``, ``host_idle_ns``, ``exposed_other_ns`` (int64 ns; summed over steps when ``step`` is there).
        Not modified.
    findings
        ``overlapviz.analysis.findings.findings`` rows of the run (or None): the largest one's ``text`` is the
        subtitle.
    width, bar_height
        Pixels.

    Returns
    -------
    hv.Overlay: the segments (``hv.Rectangles``, µs on x, one row per rank) and their legend.
    """
    missing = [c for c in ["rank", *BREAKDOWN_PARTS.values()] if c not in table]
    if missing:
        raise ValueError(f"breakdown table has no column {missing[0]!r}")
    per_rank = table.groupby("rank", sort=True)[list(BREAKDOWN_PARTS.values())].sum()
    values = per_rank.to_numpy(np.float64) / 1e3  # µs
    n = len(per_rank)
    y = np.arange(n)[::-1].astype(float)
    ends = np.cumsum(values, axis=1)
    starts = ends - values
    rows = []
    for j, part in enumerate(BREAKDOWN_PARTS):
        keep = values[:, j] > 0
        total = values[keep].sum(axis=1)
        rows.append(pd.DataFrame({"x0": starts[keep, j], "y0": y[keep] - 0.36, "x1": ends[keep, j], "y1": y[keep] + 0.36, "part": part,
                                  "rank": per_rank.index.to_numpy()[keep].astype(int), "time": [fmt_us(v) + " µs" for v in values[keep, j]],
                                  "share": [f"{v / t:.0%}" if t > 0 else "—" for v, t in zip(values[keep, j], total)]}))  # fmt: skip
    rect = pd.concat(rows, ignore_index=True)
    present = [p for j, p in enumerate(BREAKDOWN_PARTS) if values[:, j].sum() > 0] or ["overlapped"]
    bars = hv.Rectangles(rect, kdims=[hv.Dimension("x0", label="Communication time per rank (µs)"), "y0", "x1", "y1"],
                         vdims=["part", "rank", "time", "share"]).opts(
        color=hv.dim("part").categorize(BREAKDOWN_COLORS), line_color="white", line_width=0.5, tools=["hover"], default_tools=["save"],
        hover_tooltips=[("rank", "@{rank}"), ("part", "@{part}"), ("time", "@{time}"), ("share of the rank's", "@{share}")])  # fmt: skip

    top = float(ends[:, -1].max()) if n else 0.0
    title = "Where communication time went, per rank"
    if findings is not None and len(findings):
        first = findings.sort_values("time_ns", ascending=False, kind="stable").iloc[0]
        title += "\n" + _wrap(str(first["text"]), max(40, width // 9))  # a bold 12-13 px title: ~8.5 px a character
    ticks = [(float(v), f"rank {int(r)}") for v, r in zip(y, per_rank.index)]
    return (bars * legend_points({p: BREAKDOWN_COLORS[p] for p in present})).opts(
        hv.opts.Overlay(title=hv_title(title), width=width, height=max(180, bar_height * n + 150), yticks=ticks, ylim=(-0.6, n - 0.4),
                        xlim=(0, max(top, 1e-9) * 1.02), legend_position="top", legend_cols=len(present) if width >= 640 else 3, ylabel="",
                        fontsize={"title": TITLE_FONT}, show_grid=False, toolbar="right", xformatter=_thousands(),
                        legend_opts={"label_text_font_size": "9pt", "padding": 2, "spacing": 2}),
    )  # fmt: skip


def _thousands():
    from bokeh.models import NumeralTickFormatter

    return NumeralTickFormatter(format="0,0.[0]")


def _wrap(text: str, n: int) -> str:
    """``text`` broken at spaces into lines of at most ``n`` characters (a subtitle under a figure's title)."""
    import textwrap

    return "\n".join(textwrap.wrap(text, n)) or text
