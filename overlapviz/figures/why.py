"""Why-views: late-start time by cause per rank and the blockers behind it, one SM's resource budget for a collective, and collective instances across ranks. Builders draw ``overlapviz.analysis.explain``/``budget``/``peers`` tables and compute no metric."""

from __future__ import annotations

import textwrap

import holoviews as hv
import numpy as np
import pandas as pd
from bokeh.models import NumeralTickFormatter

from overlapviz.figures.charts import CAUSE_COLORS, CAUSE_LABELS, KIND_COLORS, TITLE_FONT, fmt_bytes, fmt_us, hv_title, int_text, palette, short_name, time_unit
from overlapviz.figures.charts import legend_points as _legend

WAIT_CAUSES = ("stream_order", "dependency", "launch_call", "sm_resources", "launch_latency", "unknown")
RESOURCE_LABELS = {
    "block_slots": "block slots", "warps": "warps (threads / 32)", "registers": "registers", "shared_memory": "shared memory",
}  # fmt: skip

# the SM budget's parts (L* 94, 46 and 63)
BUDGET_COLORS = {"free": "#EEEEEE", "resident computation": KIND_COLORS["compute"], "one comm block": KIND_COLORS["comm"]}


def resource_labels(table: pd.DataFrame) -> dict:
    """``RESOURCE_LABELS`` for one SM budget (``budget.sm_budget``'s table): an AMD CU counts wavefronts of its own size
    ("waves (threads / 64)" on CDNA), an NVIDIA SM warps of 32."""
    out = dict(RESOURCE_LABELS)
    row = table.loc[table["resource"] == "warps"]
    if len(row):
        out["warps"] = f"{row['unit'].iloc[0]} (threads / {int(table.attrs.get('threads_per_warp') or 32)})"
    return out


def late_by_cause(summary: pd.DataFrame, *, width: int = 620, bar_height: int = 28) -> hv.Overlay:
    """Per rank, the time its collectives started after their launch, stacked by cause.

    Parameters
    ----------
    summary
        ``overlapviz.analysis.explain.summarize`` rows of one run (``rank`` and ``<cause>_us``).
        Not modified.

    Returns
    -------
    hv.Overlay: one horizontal bar per rank (``hv.Rectangles``), one segment per cause, and the legend.
    """
    cols = [c for c in WAIT_CAUSES if f"{c}_us" in summary]
    raw = summary[[f"{c}_us" for c in cols]].apply(pd.to_numeric, errors="coerce")
    title = "Late-start time by cause, per rank"
    if len(raw) and raw.isna().all(axis=None):
        title += " (unknown: the trace has none of the launches)"
    values = raw.fillna(0.0).to_numpy(np.float64)
    top = float(values.sum(axis=1).max()) if len(values) else 0.0
    unit, div = time_unit(top)
    n = len(summary)
    y = np.arange(n)[::-1].astype(float)  # rank order from the top
    ends = np.cumsum(values, axis=1) / div
    starts = ends - values / div
    rows = []
    for j, c in enumerate(cols):
        keep = values[:, j] > 0
        rows.append(pd.DataFrame({"x0": starts[keep, j], "y0": y[keep] - 0.34, "x1": ends[keep, j], "y1": y[keep] + 0.34,
                                  "cause": CAUSE_LABELS[c], "rank": summary["rank"].astype(int).to_numpy()[keep],
                                  "time": [fmt_us(v) + " µs" for v in values[keep, j]],
                                  "share": [f"{v / t:.0%}" if t > 0 else "—" for v, t in zip(values[keep, j], values[keep].sum(axis=1))]}))  # fmt: skip
    rect = pd.concat(rows, ignore_index=True) if rows else pd.DataFrame(columns=["x0", "y0", "x1", "y1", "cause", "rank", "time", "share"])
    colors = {CAUSE_LABELS[c]: CAUSE_COLORS[c] for j, c in enumerate(cols) if values[:, j].sum() > 0} or {
        CAUSE_LABELS["launch_latency"]: CAUSE_COLORS["launch_latency"]}
    bars = hv.Rectangles(rect, kdims=[hv.Dimension("x0", label=f"Collectives' start − launch, summed ({unit})"), "y0", "x1", "y1"],
                         vdims=["cause", "rank", "time", "share"]).opts(
        color=hv.dim("cause").categorize({CAUSE_LABELS[c]: CAUSE_COLORS[c] for c in WAIT_CAUSES}), line_color="white",
        tools=["hover"], default_tools=["save"],
        hover_tooltips=[("rank", "@{rank}"), ("cause", "@{cause}"), ("time", "@{time}"), ("share of the rank's", "@{share}")])  # fmt: skip
    ticks = [(float(v), f"rank {int(r)}") for v, r in zip(y, summary["rank"])]
    return (bars * _legend(colors)).opts(
        hv.opts.Overlay(title=title, width=width, height=max(200, bar_height * n + 150), yticks=ticks,
                        ylim=(-0.6, n - 0.4), xlim=(0, max(top / div, 1e-9) * 1.02), legend_position="top", legend_cols=3,
                        ylabel="", fontsize={"title": TITLE_FONT}, show_grid=False, toolbar="right",
                        legend_opts={"label_text_font_size": "9pt", "padding": 2, "spacing": 2}),
    )  # fmt: skip


def blockers(table: pd.DataFrame, *, width: int = 520, top: int = 8) -> hv.Bars:
    """The computation kernels that kept collectives off the SMs, most blocked time first.

    Parameters
    ----------
    table
        ``overlapviz.analysis.budget.blocker_table`` rows of one run. Not modified.
    """
    t = table.head(top)
    # start − launch, or ready → start where the trace has none of the blocked collectives' launches
    launch = len(t) and pd.to_numeric(t["blocked_us"], errors="coerce").notna().any()
    col, what = ("blocked_us", "start − launch") if launch or not len(t) else ("ready_wait_us", "ready → start")
    values = pd.to_numeric(t[col], errors="coerce").fillna(0.0).to_numpy(np.float64)
    total = float(values.max()) if len(t) else 0.0
    unit, div = time_unit(total)
    frame = pd.DataFrame({"kernel": [short_name(n, 28) for n in t["blocker"]],
                          "t": values / div,
                          "n": t["n_blocked"].astype(int).to_numpy(), "resource": t["blocking_resource"].fillna("—").astype(str),
                          "name": t["blocker"].astype(str)}).drop_duplicates("kernel")  # fmt: skip
    return hv.Bars(frame[::-1], kdims=[hv.Dimension("kernel", label="Blocker")],
                   vdims=[hv.Dimension("t", label=f"Collectives held off the SMs: {what} ({unit})"), "n", "resource", "name"]).opts(
        invert_axes=True, color=CAUSE_COLORS["sm_resources"], tools=["hover"], default_tools=["save"], width=width,
        height=max(180, 26 * len(frame) + 110), title="Top blockers (SM resources)", fontsize={"title": TITLE_FONT},
        ylabel=f"Collectives held off the SMs: {what} ({unit})",  # (the value axis: drawn horizontal, invert_axes)
        hover_tooltips=[("blocker", "@{name}"), ("collectives held", "@{n}"), ("time", "@{t}{0,0.0} " + unit),
                        ("resource", "@{resource}")], xformatter=NumeralTickFormatter(format="0,0.[0]"))  # fmt: skip


def sm_budget(table: pd.DataFrame, facts: dict, *, width: int = 900) -> hv.Overlay:
    """One SM's resources for one collective: per resource a bar of its capacity, the resident computation
    blocks' share, and one comm block's need on top; a resource that cannot take the block is marked.

    Parameters
    ----------
    table
        ``overlapviz.analysis.budget.sm_budget`` / ``kernel_budget`` rows (``resource``, ``unit``,
        ``capacity``, ``max_capacity``, ``used``, ``need``, ``blocks_fit``, ``overflow``, ``limiting``).
    facts
        ``kernel_budget``'s facts (names, fit, limiter, free SMs, the what-if in use).

    Returns
    -------
    hv.Overlay of rectangles on a capacity-relative axis (1 = the SM's capacity of that resource),
    a dashed mark at the largest carve-out for shared memory, and the numbers as labels.
    """
    t = table.reset_index(drop=True)
    n = len(t)
    y = np.arange(n)[::-1].astype(float)  # the first resource on top
    cap = t["capacity"].to_numpy(np.float64)
    used = t["used"].to_numpy(np.float64) / cap
    need = t["need"].to_numpy(np.float64) / cap
    over = t["overflow"].to_numpy(bool)
    labels = resource_labels(t)
    label = [labels.get(r, r) for r in t["resource"]]

    def amount(v, unit):
        if unit == "bytes":
            return fmt_bytes(v)
        return f"{v:,.0f} {unit[:-1] if unit.endswith('s') and round(v) == 1 else unit}"

    # a paper column (about 240 px here): the numbers wrap to lines of ``chars`` (9 pt, ~5.6 px a character, the room
    # the frame leaves), the resources keep their short names and the carve-out moves from the axes into the numbers;
    # in one line they ran off the picture (issue 33)
    narrow = width < 500
    chars = max(24, int((width + 10) / 5.6)) if narrow else 1_000
    carved = [r == "shared_memory" and m > c for r, c, m in zip(t["resource"], t["capacity"], t["max_capacity"])]
    if narrow:
        label = [lab.split(" (")[0] for lab in label]
    else:
        label = [f"shared memory (SM set to {fmt_bytes(c)} of {fmt_bytes(m)})" if k else lab
                 for k, c, m, lab in zip(carved, t["capacity"], t["max_capacity"], label)]  # fmt: skip

    detail = [f"{amount(u, un)} used + {amount(nd, un)} needed of {amount(c, un)}"
              + (f" (dotted: the {fmt_bytes(m)} carve-out)" if k and narrow else "")
              for u, nd, c, m, un, k in zip(t["used"], t["need"], t["capacity"], t["max_capacity"], t["unit"], carved)]  # fmt: skip
    verdict = np.where(over, "✗ no room", [f"✓ room for {int(b)}" if np.isfinite(b) else "✓" for b in t["blocks_fit"].fillna(np.inf)])
    base = pd.DataFrame({"y0": y - 0.18, "y1": y + 0.18, "resource": label, "detail": detail, "verdict": verdict})
    cap_r = base.assign(x0=0.0, x1=1.0, part="free")
    used_r = base.assign(x0=0.0, x1=used, part="resident computation")
    need_r = base.assign(x0=used, x1=used + need, part="one comm block")
    rect = pd.concat([cap_r, used_r, need_r], ignore_index=True)[["x0", "y0", "x1", "y1", "part", "resource", "detail", "verdict"]]
    colors = BUDGET_COLORS
    bars = hv.Rectangles(rect, vdims=["part", "resource", "detail", "verdict"]).opts(
        color=hv.dim("part").categorize(colors), line_color="white", line_width=1, tools=["hover"], default_tools=["save"],
        hover_tooltips=[("resource", "@{resource}"), ("", "@{detail}"), ("", "@{verdict}")])  # fmt: skip
    outline = hv.Rectangles(pd.DataFrame({"x0": used[over], "y0": y[over] - 0.21, "x1": (used + need)[over], "y1": y[over] + 0.21}))
    outline = outline.opts(fill_alpha=0, line_color="#B00000", line_width=2.5, line_dash="dashed", default_tools=[])
    limit = hv.VLine(1.0).opts(color="black", line_width=1.5)
    smem = t.index[t["resource"] == "shared_memory"]
    marks = hv.Segments(pd.DataFrame({"x0": [], "y0": [], "x1": [], "y1": []}))
    if len(smem) and t.loc[smem[0], "max_capacity"] > t.loc[smem[0], "capacity"]:
        i = smem[0]
        x = float(t.loc[i, "max_capacity"] / t.loc[i, "capacity"])
        marks = hv.Segments(pd.DataFrame({"x0": [x], "y0": [y[i] - 0.3], "x1": [x], "y1": [y[i] + 0.3]}))
    marks = marks.opts(color="black", line_dash="dotted", line_width=1.5, default_tools=[])
    right = max(1.15, float(np.nanmax(used + need)) + 0.05, float(t["max_capacity"].max() / t["capacity"].max()) + 0.05)
    lines = [textwrap.wrap(f"{v}  ·  {d}", chars) for v, d in zip(verdict, detail)]
    text = hv.Labels(pd.DataFrame({"x": np.zeros(n), "y": y + (0.22 if narrow else 0.36), "t": ["\n".join(w) for w in lines],
                                   "c": np.where(over, "#B00000", "#222222")}), kdims=["x", "y"], vdims=["t", "c"]).opts(
        text_align="left", text_font_size="9pt", text_color="c", text_baseline="bottom" if narrow else "middle")  # fmt: skip
    legend = _legend({k: c for k, c in colors.items() if k != "free"})
    fit = facts.get("fit")
    lim = facts.get("limiter")
    what = facts.get("what_if")
    n_fit = int(fit) if fit is not None and np.isfinite(fit) else "?"
    why = f", limited by {labels.get(lim, str(lim).replace('_', ' '))}" if lim and (fit is None or fit < 1) else ""
    held = int(facts["blocks_per_sm"]) if facts.get("resident") else 0
    beside = (f"beside {held} {'block' if held == 1 else 'blocks'} of {short_name(facts.get('resident'))[:50]}" if facts.get("resident")
              else "on an SM free of computation")  # fmt: skip
    fits = "comm block fits" if n_fit == 1 else "comm blocks fit"
    title = f"SM budget{' — what if ' + str(what) if what else ''}: {n_fit} {fits}{why}\n{short_name(facts.get('comm'))[:60]} {beside}"
    if narrow:
        title = "\n".join(w for line in title.split("\n") for w in textwrap.wrap(line, int(chars * 0.75)))  # (bold, 1 pt more)
    ticks = list(zip(y.tolist(), label))
    row = 70 if not narrow else 40 + 16 * max(len(w) for w in lines)  # (two or three lines of numbers over each bar)
    xlabel = "share of the SM's capacity (1 = full" + (")" if narrow else "; dotted: the largest shared-memory carve-out)")
    return (bars * outline * limit * marks * text * legend).opts(
        hv.opts.Overlay(title=hv_title(title), width=width, height=row * n + 140, yticks=ticks, xlim=(0, right), ylim=(-0.5, n - 0.35),
                        xlabel=xlabel, ylabel="",
                        legend_position="top", fontsize={"title": "10pt"}, show_grid=False, toolbar="right"),
    )  # fmt: skip


def arrival_grid(cells: pd.DataFrame, *, width: int = 1100, value: str = "arrival_us") -> hv.Image:
    """Instance x rank: each rank's arrival after the instance's first rank (or its peer wait), as an image.

    Parameters
    ----------
    cells
        ``overlapviz.analysis.budget.instance_ranks`` rows of one run.
    value
        ``arrival_us`` (ready − the instance's first ready) or ``peer_wait_us``.
    """
    n_inst = int(cells["ordinal"].max()) + 1 if len(cells) else 0
    ranks = sorted(cells["rank"].unique().tolist())
    grid = np.full((len(ranks), max(n_inst, 1)), np.nan)
    ri = {r: i for i, r in enumerate(ranks)}
    grid[[ri[r] for r in cells["rank"]], cells["ordinal"].to_numpy(np.int64)] = pd.to_numeric(cells[value], errors="coerce").to_numpy(np.float64)
    top = float(np.nanmax(grid)) if np.isfinite(grid).any() else 0.0
    unit, div = time_unit(top)
    vlabel = {"arrival_us": "arrival after the first rank", "peer_wait_us": "peer wait"}[value]
    return hv.Image(grid[::-1] / div, bounds=(-0.5, -0.5, max(n_inst, 1) - 0.5, len(ranks) - 0.5),
                    kdims=[hv.Dimension("instance", label="Collective instance (by first start)"), hv.Dimension("rank", label="Rank")],
                    vdims=[hv.Dimension("v", label=f"{vlabel} ({unit})")]).opts(
        cmap=palette("viridis"), colorbar=True, clim=(0, max(top / div, 1e-9)), width=width,
        height=max(200, int(max(6, min(24, 640 // max(len(ranks), 1)))) * len(ranks) + 120),
        tools=["hover"], default_tools=["save", "xwheel_zoom", "xpan", "reset"], active_tools=["xwheel_zoom"],
        title=f"Each rank's {vlabel} per collective instance ({unit}; wheel: zoom instances)",
        yticks=[(i, str(r)) for i, r in enumerate(ranks)], fontsize={"title": TITLE_FONT},
        clabel=unit, colorbar_opts={"width": 12}, **_grid_hover(n_inst, ranks, f"{vlabel} ({unit})"))  # fmt: skip


def _grid_hover(n_inst: int, ranks: list, vlabel: str) -> dict:
    """The instance x rank image's hover: the instance and the rank under the cursor (the pixel's, not the cursor's
    coordinates: "3.254e-3") and its value with one decimal, "—" where the rank had no kernel of that instance."""
    from bokeh.models import CustomJSHover

    at = "const i = Math.round(value); "
    inst = CustomJSHover(code=at + "return i >= 0 && i < n ? String(i) : '';", args={"n": int(n_inst)})
    rank = CustomJSHover(code=at + "return i >= 0 && i < ranks.length ? String(ranks[i]) : '';", args={"ranks": [int(r) for r in ranks]})
    num = CustomJSHover(code="return value == null || isNaN(value) ? '—' : value.toLocaleString('en-US', "
                             "{minimumFractionDigits: 1, maximumFractionDigits: 1});")  # fmt: skip
    return {"hover_tooltips": [("instance", "$x{instance}"), ("rank", "$y{rank}"), (vlabel, "@image{value}")],
            "hover_formatters": {"$x": inst, "$y": rank, "@image": num}}


# the slowest rank's colour, and past five ranks its marker: the colours' lightness (CIE L*) 0, 22, 40, 54 and 70, and
# > 25 CIELAB units apart under simulated colour blindness (tests/test_figures.py); dark enough for points on white. The
# eight Okabe-Ito colours it replaces printed five ranks within 13 L* (54 to 67) (issue 33)
RANK_COLORS = ("#000000", "#332288", "#7A5A00", "#EE3377", "#56B4E9")
RANK_MARKERS = ("circle", "square", "triangle", "diamond", "inverted_triangle")


def arrival_skew(instances: pd.DataFrame, *, width: int = 1100) -> hv.Scatter | hv.Overlay:
    """Arrival skew per instance (last − first ready), coloured by the slowest rank.

    Where no instance has a skew (its ranks' clocks do not compare: ``peers.collective_instances``' ``clock_note``),
    an empty plot that says so.
    """
    inst = instances.sort_values("first_start_ns", kind="stable").reset_index(drop=True)
    # float64 with NaN: HoloViews' range of a nullable (Float64) column that is all <NA> raised "boolean value of NA is
    # ambiguous", and `export --figure collectives` of a run on clocks that do not compare with it
    skew = pd.Series(pd.to_numeric(inst["arrival_skew_us"], errors="coerce"), dtype="Float64").to_numpy(np.float64, na_value=np.nan)
    if not np.isfinite(skew).any():
        return _nothing_to_draw(
            "Arrival skew per instance: nothing to draw", "no instance has ranks on clocks that compare (see the instances' clock_note)",
            xlabel="Collective instance (by first start)", ylabel="arrival skew", xlim=(-0.5, max(len(inst), 1) - 0.5), width=width, height=260)
    unit, div = time_unit(float(np.nanmax(skew)))
    frame = pd.DataFrame({"instance": np.arange(len(inst)), "skew": skew / div,
                          "slowest": np.where(inst["slowest_rank"].notna().to_numpy(bool), "rank " + int_text(inst["slowest_rank"]), "—"),
                          "collective": inst["collective"].fillna("—").astype(str), "id": inst["instance"].astype(str)})  # fmt: skip
    ranks = sorted(frame["slowest"].unique(), key=lambda r: (len(r), r))  # (the legend: "rank 7", by rank)
    n = len(RANK_COLORS)
    cmap = {r: RANK_COLORS[i % n] for i, r in enumerate(ranks)}
    markers = {r: RANK_MARKERS[i // n % len(RANK_MARKERS)] for i, r in enumerate(ranks)}
    return hv.Scatter(frame, kdims=[hv.Dimension("instance", label="Collective instance (by first start)")],
                      vdims=[hv.Dimension("skew", label=f"arrival skew ({unit})"), "slowest", "collective", "id"]).opts(
        color="slowest", cmap=cmap, marker=hv.dim("slowest").categorize(markers), size=6, tools=["hover"], width=width, height=260, show_legend=True, legend_position="right",
        default_tools=["save", "xwheel_zoom", "xpan", "reset"], title="Arrival skew per instance (colour: the slowest rank)",
        fontsize={"title": TITLE_FONT}, hover_tooltips=[("instance", "@{id}"), ("collective", "@{collective}"),
                                                        ("skew", "@{skew}{0,0.0} " + unit), ("slowest", "@{slowest}")])  # fmt: skip


def _nothing_to_draw(title: str, why: str, *, xlabel: str, ylabel: str, xlim: tuple, width: int, height: int) -> hv.Overlay:
    """Empty axes of a figure with no data, ``why`` written in their middle."""
    empty = hv.Scatter(pd.DataFrame({"x": np.empty(0), "y": np.empty(0)}), kdims=[hv.Dimension("x", label=xlabel)],
                       vdims=[hv.Dimension("y", label=ylabel)])  # fmt: skip
    middle = (xlim[0] + xlim[1]) / 2
    return (empty * hv.Text(middle, 0.5, why).opts(text_font_size="10pt", text_color="#444444")).opts(
        hv.opts.Overlay(title=hv_title(title), width=width, height=height, xlim=xlim, ylim=(0, 1), yaxis=None,
                        fontsize={"title": TITLE_FONT}, default_tools=["save"], toolbar="right"))  # fmt: skip


def rank_waits(cells: pd.DataFrame, instances: pd.DataFrame, *, width: int = 540) -> tuple[hv.Bars, hv.Bars]:
    """Per rank: how often it was the last ready, and how long its collectives waited for their peers in all."""
    ranks = sorted(cells["rank"].unique().tolist())
    last = instances["slowest_rank"].astype("Int64").value_counts()
    peer = cells.groupby("rank")["peer_wait_us"].sum()
    unit, div = time_unit(float(peer.max()) if len(peer) else 0.0)
    per_rank = pd.DataFrame({"rank": [str(r) for r in ranks], "last": [int(last.get(r, 0)) for r in ranks],
                             "peer": [float(peer.get(r, 0.0)) / div for r in ranks]})  # fmt: skip
    # one hover for both: every field named, with its unit (the first said "peer: 132.166", the second "Rank: 1")
    hover = [("rank", "@{rank}"), ("instances ready last", "@{last}"), (f"peer wait, summed ({unit})", "@{peer}{0,0.0}")]
    slow = hv.Bars(per_rank, kdims=[hv.Dimension("rank", label="Rank")], vdims=[hv.Dimension("last", label="instances"), "peer"]).opts(
        color=KIND_COLORS["compute"], tools=["hover"], width=width, height=260, default_tools=["save"], hover_tooltips=hover,
        title="Instances where the rank was ready last", fontsize={"title": TITLE_FONT})  # fmt: skip
    pw = hv.Bars(per_rank, kdims=[hv.Dimension("rank", label="Rank")], vdims=[hv.Dimension("peer", label=f"peer wait, summed ({unit})"), "last"]).opts(
        color=KIND_COLORS["comm"], tools=["hover"], width=width, height=260, default_tools=["save"], hover_tooltips=hover,
        title="Time the rank's collectives waited for their peers", fontsize={"title": TITLE_FONT}, yformatter="%.1f")  # fmt: skip
    return slow, pw


def has_bus_bandwidth(instances: pd.DataFrame) -> bool:
    """Whether any instance has a bus bandwidth (a known message size): else ``bus_bandwidth`` draws nothing."""
    return bool(pd.to_numeric(instances["busbw_gbps"], errors="coerce").notna().any())


def bus_bandwidth(instances: pd.DataFrame, *, width: int = 1100) -> hv.Scatter | None:
    """Bus bandwidth per instance (nccl-tests' convention), None where no message size is known."""
    if not has_bus_bandwidth(instances):
        return None
    inst = instances.sort_values("first_start_ns", kind="stable").reset_index(drop=True)
    bw = pd.to_numeric(inst["busbw_gbps"], errors="coerce")
    return hv.Scatter(pd.DataFrame({"instance": np.arange(len(inst)), "busbw": bw, "collective": inst["collective"].fillna("—")}),
                      kdims=[hv.Dimension("instance", label="Collective instance (by first start)")],
                      vdims=[hv.Dimension("busbw", label="bus bandwidth (GB/s)"), "collective"]).opts(
        color=KIND_COLORS["comm"], size=5, tools=["hover"], width=width, height=240, default_tools=["save"],
        title="Bus bandwidth per instance (nccl-tests' convention; time = last end − last start)", fontsize={"title": TITLE_FONT})  # fmt: skip


def collectives(cells: pd.DataFrame, instances: pd.DataFrame, *, width: int = 1100, value: str = "arrival_us") -> hv.Layout:
    """Collective instances across ranks in one figure (the export): arrivals (or peer waits) per instance and
    rank, the arrival skew with the slowest rank, per-rank last-ready counts and peer wait, bus bandwidth."""
    slow, pw = rank_waits(cells, instances, width=width // 2 - 10)
    panels = [arrival_grid(cells, width=width, value=value), arrival_skew(instances, width=width), slow, pw]
    bw = bus_bandwidth(instances, width=width)
    if bw is not None:
        panels.append(bw)
    return hv.Layout(panels).opts(shared_axes=False).cols(1)


def why(summary: pd.DataFrame, blocker_rows: pd.DataFrame, *, width: int = 1100) -> hv.Layout:
    """The why-page as one figure (for export): late-start time by cause per rank, and the top blockers."""
    panels = [late_by_cause(summary, width=width // 2 + 60)]
    if len(blocker_rows):
        panels.append(blockers(blocker_rows, width=width // 2 - 60))
    return hv.Layout(panels).opts(shared_axes=False).cols(2)
