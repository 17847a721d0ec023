"""The answer, as the dashboard's first page states it: a run's findings (``overlapviz.analysis.findings``) and where
each rank's communication time went (``overlapviz.analysis.breakdown``), and two runs' side by side on Compare. The
store computes both; this module only draws them."""

from __future__ import annotations

import html

import holoviews as hv
import numpy as np
import pandas as pd
import panel as pn

from overlapviz.figures import charts as figures
from overlapviz.analysis.findings import changes_by_kind, format_ns
from overlapviz.dashboards.common import StaticTable, notice, static_plot, unavailable
from overlapviz.dashboards.store import DataStore, Unavailable

# the stacked parts of a rank's communication, bottom up: (column, label, colour, hatch). The figures' colours
# (``figures.BREAKDOWN_COLORS``: lightness far apart in greyscale print, told apart by colour-blind readers), and a
# hatch on every exposed part but host idle (black). The page's own Okabe-Ito set printed dependent and host idle
# (L* 70 and 71) as one grey (issue 33)
PARTS = tuple(
    (col, label, figures.BREAKDOWN_COLORS[label], hatch)
    for col, label, hatch in (("overlapped_ns", "overlapped", " "), ("peer_wait_ns", "peer wait", "/"), ("dependent_ns", "dependent", "x"),
                              ("host_idle_ns", "host idle", " "), ("exposed_other_ns", "other exposed", "."))
)  # fmt: skip
# the per-rank table: the breakdown in µs with 3 decimals (the exact ns)
BREAKDOWN_TITLES = {
    "rank": "rank", "comm_us": "comm (µs)", "overlapped_us": "overlapped (µs)", "exposed_us": "exposed (µs)",
    "peer_wait_us": "peer wait (µs)", "dependent_us": "dependent (µs)", "host_idle_us": "host idle (µs)",
    "exposed_other_us": "other exposed (µs)", "peers": "peers compared",
}  # fmt: skip
_EXPOSED_KINDS = ("straggler", "dependent", "host_idle")  # the findings that are parts of the exposed time (the breakdown's)
_STRAGGLER = "a straggler is the rank that started a collective instance last; the ranks that waited for it are not"


def _hatched(plot, element) -> None:
    """A HoloViews hook: each bar hatched by its row's ``hatch`` (Bars has no hatch option)."""
    glyph = plot.handles["glyph"]
    glyph.hatch_pattern, glyph.hatch_color, glyph.hatch_alpha = {"field": "hatch"}, "black", 0.45


def _unit(top_ns: int) -> tuple[str, float]:
    """A readable time unit for values up to ``top_ns``: (name, ns per unit)."""
    unit, div = figures.time_unit(top_ns / 1e3)
    return unit, div * 1e3


def breakdown_chart(rows: pd.DataFrame, *, title: str, width: int = 640, height: int = 320, top_ns: int | None = None) -> hv.Bars:
    """Stacked bars per rank: overlapped, peer wait, dependent, host idle and other exposed communication.

    Parameters
    ----------
    rows
        ``breakdown.breakdown`` rows of one run (``rank`` and the ``*_ns`` columns). Not modified.
    title
        The figure's title.
    width, height
        Pixels.
    top_ns
        The value axis' end (two runs drawn side by side share it); default: the largest rank's communication.

    Returns
    -------
    hv.Bars: kdims ``rank``, ``part``; vdims ``t`` (in the axis' unit), ``time`` (the exact time in words), ``hatch``.
    """
    top = int(rows["comm_ns"].max()) if top_ns is None and len(rows) else int(top_ns or 0)
    unit, div = _unit(top)
    ns = {col: rows[col].to_numpy(np.int64) for col, *_ in PARTS}
    frame = pd.DataFrame({
        "rank": np.repeat(rows["rank"].astype(int).astype(str).to_numpy(), len(PARTS)),
        "part": [label for _ in range(len(rows)) for _, label, *_ in PARTS],
        "t": [ns[col][i] / div for i in range(len(rows)) for col, *_ in PARTS],
        "time": [format_ns(ns[col][i]) for i in range(len(rows)) for col, *_ in PARTS],
        "hatch": [h for _ in range(len(rows)) for *_, h in PARTS],
    })  # fmt: skip
    return hv.Bars(frame, kdims=[hv.Dimension("rank", label="Rank"), hv.Dimension("part", label="Communication")],
                   vdims=[hv.Dimension("t", label=f"Communication time ({unit})"), "time", "hatch"]).opts(
        stacked=True, cmap={label: colour for _, label, colour, _ in PARTS}, tools=["hover"], default_tools=["save"],
        hover_tooltips=[("rank", "@{rank}"), ("part", "@{part}"), ("time", "@{time}")], width=width, height=height,
        title=figures.hv_title(title), legend_position="right", fontsize={"title": figures.TITLE_FONT}, line_color="white",
        ylim=(0, max(top / div, 1e-9) * 1.05), hooks=[_hatched])  # fmt: skip


def peer_wait_chart(rows: pd.DataFrame, *, width: int = 420, bar_height: int = 28) -> hv.Bars:
    """Per rank, its exposed peer wait (``peer_wait_ns`` of ``breakdown.breakdown``): time inside collectives waiting
    for the rank that started them last. Horizontal bars, rank order from the top (as the start-delay chart beside).

    Parameters
    ----------
    rows
        ``breakdown.breakdown`` rows of one run. Not modified.
    width, bar_height
        Pixels.

    Returns
    -------
    hv.Bars: kdim ``rank`` ("rank N"); vdims ``t`` (in the axis' unit) and ``time`` (the exact time in words).
    """
    top = int(rows["peer_wait_ns"].max()) if len(rows) else 0
    unit, div = _unit(top)
    values = rows["peer_wait_ns"].to_numpy(np.int64)[::-1]
    frame = pd.DataFrame({"rank": [f"rank {int(r)}" for r in rows["rank"]][::-1], "t": values / div,
                          "time": [format_ns(v) for v in values]})  # fmt: skip
    return hv.Bars(frame, kdims=[hv.Dimension("rank", label="Rank")],
                   vdims=[hv.Dimension("t", label=f"Waiting for the last rank to start ({unit})"), "time"]).opts(
        invert_axes=True, color=PARTS[1][2], line_color="white", tools=["hover"], default_tools=["save"],
        hover_tooltips=[("", "@{rank}"), ("peer wait", "@{time}")], width=width, height=90 + bar_height * len(frame),
        title="Peer wait per rank (exposed)", fontsize={"title": figures.TITLE_FONT},
        ylim=(0, max(top / div, 1e-9) * 1.05))  # fmt: skip


def straggler_chart(ranks: pd.DataFrame, *, width: int = 540, height: int = 320) -> hv.Bars:
    """Per rank, how many collective instances it started last (``started_last``: from ``peers.collective_instances``'
    ``straggler``), in one colour: the rank that arrived last, the one the others waited for.

    Parameters
    ----------
    ranks
        ``rank`` and ``started_last`` per rank. Not modified.
    width, height
        Pixels.

    Returns
    -------
    hv.Bars: kdim ``rank``; vdim ``n``.
    """
    frame = pd.DataFrame({"rank": ranks["rank"].astype(int).astype(str).to_numpy(),
                          "n": ranks["started_last"].to_numpy(np.int64)})  # fmt: skip
    return hv.Bars(frame, kdims=[hv.Dimension("rank", label="Rank")], vdims=[hv.Dimension("n", label="Instances started last")]).opts(
        color=PARTS[1][2], line_color="white", tools=["hover"], default_tools=["save"], width=width, height=height,
        hover_tooltips=[("rank", "@{rank}"), ("started last", "@{n} instances")],
        title="Stragglers: collective instances each rank started last", fontsize={"title": figures.TITLE_FONT},
        ylim=(0, max(int(frame["n"].max()) if len(frame) else 0, 1) * 1.08))  # fmt: skip


def breakdown_table(rows: pd.DataFrame) -> StaticTable:
    """The run's breakdown per rank in µs (3 decimals: the exact ns), with whether its peers were compared."""
    shown = pd.DataFrame({"rank": rows["rank"].astype(int).to_numpy()})
    for col in ("comm_ns", "overlapped_ns", "exposed_ns", "peer_wait_ns", "dependent_ns", "host_idle_ns", "exposed_other_ns"):
        shown[col[:-3] + "_us"] = rows[col].to_numpy(np.int64) / 1e3
    shown["peers"] = ["yes" if bool(k) else (note or "no") for k, note in zip(rows["peers_known"], rows["clock_note"].fillna(""))]
    digits = {c: 3 for c in shown if c.endswith("_us")}
    return StaticTable(shown, titles=BREAKDOWN_TITLES, digits=digits, rows=16, css_classes=["ovz-breakdown"])


def findings_html(found: pd.DataFrame, limit: int | None = None) -> str:
    """The findings as a numbered list: kind, the time at stake with its share of the exposed communication (a start
    delay: the waiting to start), the sentence, and the action (HTML, every text escaped: a kernel's name is not markup)."""
    items = []
    for row in (found if limit is None else found.head(limit)).itertuples(index=False):
        if row.kind in _EXPOSED_KINDS:  # a part of the exposed communication: its share of it
            share = "" if row.share is None or pd.isna(row.share) else f", {100 * row.share:.0f} % of the exposed communication"
            stake = f"{format_ns(row.time_ns)} at stake{share}"
        else:  # a start delay: waiting to start, which overlap may hide (its share of the exposed time can pass 100 %)
            stake = f"{format_ns(row.time_ns)} of waiting to start"
        items.append(f'<li class="ovz-finding" data-kind="{html.escape(row.kind)}" data-time-ns="{int(row.time_ns)}">'
                     f'<b>{html.escape(row.kind.replace("_", " "))}</b> · {stake}<br>'
                     f'<span class="ovz-finding-text">{html.escape(row.text)}</span><br>'
                     f'→ <span class="ovz-finding-action">{html.escape(row.action)}</span></li>')  # fmt: skip
    return '<ol class="ovz-findings" style="padding-left: 1.4em; line-height: 1.45">' + "".join(items) + "</ol>"


def answer(store: DataStore, run_id: str) -> pn.Column:
    """A run's answer: its breakdown in a sentence, its findings largest first, and the breakdown per rank."""
    try:
        found, head = store.findings(run_id), store.headline(run_id)
        rows = store.breakdown(run_id)
    except Unavailable as exc:
        return pn.Column(unavailable("Findings and where communication time went (overlapviz explain)", exc))
    if not len(rows) or not int(rows["comm_ns"].sum()):
        return pn.Column(notice(f"Run {run_id} has no communication: no time to account for. Its kernels are on the "
                                "**Timeline**; their residency on **Residency**.", "info"), sizing_mode="stretch_width")  # fmt: skip
    parts = [pn.pane.HTML(f'<p class="ovz-headline" style="font-size: 15px"><b>Run {html.escape(str(run_id))}</b>: '
                          f"{html.escape(head)}.</p>", sizing_mode="stretch_width", margin=(0, 10))]  # fmt: skip
    if len(found):
        parts += [pn.pane.Markdown("#### Findings: where the time went and what would win it back, largest first",
                                   margin=(0, 10)),  # fmt: skip
                  pn.pane.HTML(findings_html(found), sizing_mode="stretch_width", margin=(0, 10))]
    else:
        parts.append(pn.pane.Markdown("No findings: nothing held this run's communication back.", margin=(0, 10)))
    unknown = rows.loc[~rows["peers_known"].astype(bool)]
    note = ""
    if len(rows) == 1 and len(unknown):
        note = " Peer wait needs the traces of two or more ranks of the job (this run has one)."
    elif len(unknown):
        why = "; ".join(sorted({str(n) for n in unknown["clock_note"].dropna() if str(n)})) or "one rank per instance"
        note = f" Peer wait is 0 on ranks {', '.join(map(str, unknown['rank'].astype(int)))}: not compared with their peers ({why})."
    parts += [pn.pane.Markdown("#### Where each rank's communication time went\nExposed communication split by the first "
                               "reason that holds at each instant: waiting for a peer that had not started the collective "
                               "(peer wait), the next computation needed its result (dependent), the host had launched "
                               "nothing to overlap (host idle), the rest (other). Bars stack from overlapped up; "
                               f"{_STRAGGLER}.{note}", margin=(10, 10, 0, 10)),  # fmt: skip
              static_plot(store, ("breakdown", run_id), lambda: breakdown_chart(rows, title=f"Breakdown per rank: {run_id}", width=760)),
              breakdown_table(rows)]
    return pn.Column(*parts, sizing_mode="stretch_width")


def changed(found_a: pd.DataFrame, found_b: pd.DataFrame) -> pd.DataFrame:
    """The findings of two runs matched by kind: ``kind, a_ns, b_ns, change_ns`` (B − A), the largest change first
    (``findings.changes_by_kind``: the analysis layer's one computation of it)."""
    both = pd.concat([found_a.assign(run_id="A"), found_b.assign(run_id="B")], ignore_index=True)
    return changes_by_kind(both, "A", "B").rename(columns={"delta_ns": "change_ns"})


def compared(store: DataStore, run_a: str, run_b: str) -> pn.Column:
    """Two runs' breakdowns side by side (one value axis) and the finding whose time changed most: why B is faster."""
    try:
        rows = {w: store.breakdown(r) for w, r in (("A", run_a), ("B", run_b))}
        found = {w: store.findings(r) for w, r in (("A", run_a), ("B", run_b))}
        heads = {w: store.headline(r) for w, r in (("A", run_a), ("B", run_b))}
    except Unavailable as exc:
        return pn.Column(unavailable("The two runs' breakdowns (overlapviz explain --breakdown)", exc))
    top = max((int(r["comm_ns"].max()) for r in rows.values() if len(r)), default=0)
    # one figure of the two (a Layout, as the timelines' pair below): two figure panes in a Row beside the copied pair
    # left the pair's plots unsized in the browser (no width, no zoom)
    charts = [static_plot(store, ("breakdowns", run_a, run_b, top), lambda: hv.Layout([breakdown_chart(
        rows[w], title=f"Breakdown per rank, {w}: {r}", width=540, top_ns=top) for w, r in (("A", run_a), ("B", run_b))]
    ).opts(shared_axes=False))]
    exposed = {w: int(rows[w]["exposed_ns"].sum()) if len(rows[w]) else 0 for w in rows}
    diff = changed(found["A"], found["B"])
    faster = exposed["B"] < exposed["A"]
    sign = "−" if faster else "+"
    lines = [f"Exposed communication, summed over ranks: <b>A</b> {format_ns(exposed['A'])}, <b>B</b> "
             f"{format_ns(exposed['B'])} (B {sign}{format_ns(abs(exposed['B'] - exposed['A']))})."]  # fmt: skip
    if len(diff) and int(diff["change_ns"].iloc[0]):
        first = diff.iloc[0]
        kind = str(first["kind"])
        verb = "less" if first["change_ns"] < 0 else "more"
        lines[0] += (f" The finding that changed most: <b>{html.escape(kind.replace('_', ' '))}</b>, {format_ns(first['a_ns'])} "
                     f"in A, {format_ns(first['b_ns'])} in B ({format_ns(abs(int(first['change_ns'])))} {verb} in B).")  # fmt: skip
        for w in ("A", "B"):
            f = found[w].loc[found[w]["kind"] == kind]
            lines.append(f"<b>{w}</b>: " + (html.escape(f["text"].iloc[0]) if len(f) else "no such finding."))
    elif exposed["A"] != exposed["B"]:
        lines[0] += " No finding's time changed."
    line = "".join(f"<p>{x}</p>" for x in lines)
    shown = diff.assign(**{c: diff[c] / 1e3 for c in ("a_ns", "b_ns", "change_ns")}).rename(
        columns={"a_ns": "A (µs)", "b_ns": "B (µs)", "change_ns": "B − A (µs)"})
    return pn.Column(
        pn.pane.Markdown("#### Where communication time went, A beside B", margin=(10, 10, 0, 10)),
        pn.pane.Markdown(f"**A** {heads['A']}.\n\n**B** {heads['B']}.", margin=(0, 10)),
        pn.Row(*charts),
        pn.pane.HTML(line, margin=(0, 10), css_classes=["ovz-changed"], sizing_mode="stretch_width"),
        StaticTable(shown, digits={"A (µs)": 3, "B (µs)": 3, "B − A (µs)": 3}, rows=10) if len(shown) else pn.Spacer(height=0),
        sizing_mode="stretch_width",
    )  # fmt: skip


__all__ = ["PARTS", "answer", "breakdown_chart", "breakdown_table", "changed", "compared", "findings_html", "peer_wait_chart", "straggler_chart"]
