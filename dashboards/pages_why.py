"""The why-pages. ``WhyPage`` ("Why late"): why collectives started late (time by cause per rank, the blockers,
every collective with its cause, one SM's budget with the advisor's what-ifs). ``CollectivesPage``: collectives
across ranks (arrival, peer wait, the slowest rank, bus bandwidth) and per-rank overlap. ``ResidencyPage``:
resident blocks per SM of each kernel launch shape. All draw what the store keeps
(``overlapviz.analysis.explain``/``budget``/``peers``/``residency``) and compute nothing before their tab opens."""

from __future__ import annotations

import shlex

import numpy as np
import pandas as pd
import panel as pn
import param
from bokeh.models import NumberFormatter

from overlapviz.figures import charts as figures
from overlapviz.figures import why as figures_why
from overlapviz.analysis import budget, explain as explain_lib
from overlapviz.analysis.findings import format_ns
from overlapviz.analysis.residency import ANY_RANK
from overlapviz.dashboards.common import PLOT_WIDTH, Page, StaticTable, controls_row, export_buttons, notice, static_plot, table, unavailable
from overlapviz.dashboards import pages_findings
from overlapviz.dashboards.store import DataStore, Unavailable

_CAUSES = {"all causes": "all", **{figures.CAUSE_LABELS[c]: c for c in
                                   ("sm_resources", "dependency", "stream_order", "launch_latency", "unknown", "none")}}  # fmt: skip
_KERNEL_TITLES = {
    "rank": "rank", "stream": "stream", "collective": "collective", "start": "start (ms)", "late": "start − launch (µs)",
    "delay": "ready → start (µs)", "cause": "cause", "resource": "blocking resource", "blocker": "blocker",
    "fit": "comm blocks fit/SM", "free": "free SMs", "peer": "peer wait (µs)",
}  # fmt: skip
_NO_DEVICE = ("so blocks per SM, the SM budget and the fit cannot be computed here. A trace records them in a Kineto "
              "trace's `deviceProperties` (torch ≥ 2.1), an Nsight Systems export's `TARGET_INFO_GPU`, or rocprof's agent "
              "info. Name the GPU the traces ran on to compute them: `overlapviz serve DATASET --device-name 'NVIDIA H200'` "
              "(also `overlapviz explain`, `residency` and `export`).")  # fmt: skip


# the most rows of a plain HTML table: the instances show that many (the largest skews); a longer per-rank table is a
# Tabulator with remote pages (only the page shown travels to the browser)
_STATIC_ROWS = 200


def _money(digits: int) -> NumberFormatter:
    """A table's number format: ``digits`` decimals with thousands separators, a missing value as "—" (``StaticTable``'s
    ``digits``; Tabulator's own "money" format printed "NaN" for a missing peer wait)."""
    return NumberFormatter(format="0,0" + ("." + "0" * digits if digits else ""), nan_format="—", null_format="—", text_align="right")


_DEVICE_FIELDS = ["arch", "num_sms", "max_threads_per_sm", "regs_per_sm", "shared_mem_per_sm", "warp_size"]


def _no_device(store: DataStore, rank: int | None = None) -> str | None:
    """Why residency, fit and SM budget cannot be computed for the run's devices (of ``rank``, or of every rank): the
    ranks whose device has no row, or whose row names no GPU whose limits are known (the reason, and the fields the row
    lacks); None when each has its limits (whatever else is missing, a kernel's registers, is said elsewhere)."""
    limits = store.device_limits()
    if isinstance(limits.get(ANY_RANK), dict):
        return None  # `serve --device-name`: the GPU named fills every rank that has no limits of its own
    devices = store.devices()
    if rank is not None and "rank" in devices:
        devices = devices.loc[devices["rank"] == int(rank)]
    mine = {k: v for k, v in limits.items() if k[0] == store.run_id and (rank is None or k[1] == int(rank))}
    if mine and all(isinstance(v, dict) for v in mine.values()):
        return None
    missing = [c for c in _DEVICE_FIELDS if not len(devices) or c not in devices or devices[c].isna().all()]
    fields = ", ".join(f"`{m}`" for m in missing)
    if not mine:
        return f"The dataset has no devices row for {'rank ' + str(rank) if rank is not None else 'this run'} ({fields} unknown), " + _NO_DEVICE
    why = sorted({v for v in mine.values() if isinstance(v, str)})
    return (f"The GPU's limits are unknown: {'; '.join(why[:2])} (the devices row lacks {fields or 'no field'}), " + _NO_DEVICE)


def _held_off(explained: pd.DataFrame, blocked: int) -> str:
    """How many collectives computation held off the SMs, as far as it is known: explain finds it only where the device's
    limits and the launch shapes are known (``comm_blocks_fit_per_sm``); elsewhere 0 would be a claim."""
    unknown = int(explained["comm_blocks_fit_per_sm"].isna().sum())
    held = f"{blocked:,} {'was' if blocked == 1 else 'were'} held off the SMs by computation"
    if not unknown:
        return held + "."
    if unknown == len(explained):
        return ("Whether computation held any off the SMs is unknown: the SM room needs the GPU's limits and the launch "
                "shapes (see the SM budget below).")  # fmt: skip
    return f"{held}; for {unknown:,} the SM room is unknown (the GPU's limits or a launch shape are missing)."


class WhyPage(Page):
    """Why collectives started late: time by cause per rank, top blockers, every collective (click one for its
    SM budget and the advisor's what-ifs, or to open it on the Timeline)."""

    cause = param.Selector(default="all", objects=_CAUSES, label="Cause")
    rank = param.Selector(default="all", objects=["all"], label="Rank")
    record = param.Dict(default=None, allow_None=True, precedence=-1, doc="The explain record of the chosen collective")
    what_if = param.Selector(default="as recorded", objects=["as recorded"], label="What if")

    def __init__(self, store: DataStore, **params):
        self._options = pd.DataFrame()
        self._run = None  # the run whose collectives the filters and the chosen record belong to
        super().__init__(store=store, **params)
        self._table = None

    # --- data -------------------------------------------------------------------------

    def _records(self) -> pd.DataFrame:
        e = self._latest_first(self.store.run_id)
        # cut from the run's order: a stable sort of the rows kept is the whole run's order restricted to them
        if self.cause != "all":
            e = e.loc[e["cause"] == self.cause]
        if self.rank != "all":
            e = e.loc[e["rank"] == int(self.rank)]
        return e

    def _latest_first(self, run_id: str) -> pd.DataFrame:
        """The run's explain records in the table's order (``budget.latest_first``), sorted once per run for every session
        (0.07 s a visit for the 100k collectives of the million-kernel set)."""
        return self.store.memo(("latest first", run_id), lambda: budget.latest_first(self.store.explained(run_id)))

    @param.depends("store.run_id", "shown", watch=True, on_init=True)
    def _new_run(self) -> None:
        """A new run's filters and its worst collective, once the tab is open (explain is not waited for before)."""
        if not self.shown or self._run == self.store.run_id:
            return
        self._run = self.store.run_id
        try:
            e = self.store.explained()
        except Unavailable:
            self.record = None
            return
        ranks = sorted(int(r) for r in e["rank"].unique())
        self.param.rank.objects = ["all"] + [str(r) for r in ranks]
        self.param.update(rank="all", cause="all")
        # (once per run for every session, a copy each: 0.07 s a visit on the million-kernel set)
        worst = self.store.memo(("worst record", self._run), lambda: budget.worst_record(e))
        self.record = None if worst is None else dict(worst)

    @param.depends("record", watch=True)
    def _new_record(self) -> None:
        opts = {"as recorded": "as recorded"}
        self._options = pd.DataFrame()
        if self.record is not None:
            try:
                self._options = self.store.what_if(self.record)
            except Exception:  # noqa: BLE001  (no what-if is no reason to lose the budget)
                self._options = pd.DataFrame()
            for i, r in self._options.iterrows():
                if r["lever"] == "current":
                    continue
                star = " ★" if r["recommended"] else ""
                fit, held = int(r["comm_blocks_fit_per_sm"]), int(r["compute_blocks_per_sm"])
                opts[f"{r['lever'].replace('_', ' ')}: {r['setting']} → {fit} comm {'block fits' if fit == 1 else 'blocks fit'}, "
                     f"{held} computation {'block' if held == 1 else 'blocks'}/SM{star}"] = str(i)  # fmt: skip
        self.param.what_if.objects = opts
        self.what_if = "as recorded"

    def _display(self, run_id: str) -> pd.DataFrame:
        """The run's collectives as the table shows them (built once per run for every session; filters select rows)."""
        return self.store.memo(("collectives table", run_id), lambda: self._build_display(run_id))

    def _build_display(self, run_id: str) -> pd.DataFrame:
        e = self.store.explained(run_id)
        # (the kernels' origin: the run's why as well cost a Why late opened before the Timeline 0.6 s more, 1M kernels)
        origin = self.store.timeline(run_id, ranks=[], why=False).origin_ns
        return pd.DataFrame({
            "rank": e["rank"].astype(int).to_numpy(), "stream": figures.int_text(e["stream"]),
            "collective": figures.short_names(e["name"], 40),
            "start": (e["start_ns"].to_numpy(np.int64) - origin) / 1e6,
            "late": pd.to_numeric(e["start_minus_launch_ns"], errors="coerce").astype("float64").to_numpy() / 1e3,
            "delay": pd.to_numeric(e["start_delay_us"], errors="coerce").astype("float64").to_numpy(),
            "cause": e["cause"].map(figures.CAUSE_LABELS).fillna("—").to_numpy(),
            "resource": e["blocking_resource"].fillna("").astype(str).str.replace("_", " ").to_numpy(),
            "blocker": np.where(e["blocker"].notna(), figures.short_names(e["blocker"], 40), ""),
            "fit": figures.int_text(e["comm_blocks_fit_per_sm"]), "free": figures.int_text(e["free_sms"]),
            "peer": pd.to_numeric(e["peer_wait_us"], errors="coerce").astype("float64").to_numpy(),
        }, index=e.index)  # fmt: skip

    # --- views -------------------------------------------------------------------------

    @param.depends("store.run_id", "shown")
    def _summary(self):
        if (spacer := self.visit("summary", (self.store.run_id,))) is not None:
            return spacer
        try:
            summary, blocked = self.store.summary(), self.store.blockers()
        except Unavailable as exc:
            return unavailable("Why collectives started late (overlapviz explain)", exc)
        if not len(summary):
            self._exportable("why", False)
            self._exportable("budget", False)
            return notice(f"Run {self.store.run_id} has no communication kernels: nothing waited.", "info")
        self._exportable("why", True)
        n = int(summary["n_comm_kernels"].sum())
        unknown = int(summary["n_launch_unknown"].sum()) if "n_launch_unknown" in summary else 0
        ranks = f"{len(summary)} rank{'' if len(summary) == 1 else 's'}"
        run = self.store.run_id
        panes = []
        if unknown == n:  # no launch in the trace: no start − launch to sum (0 would be a claim)
            causes = self.store.explained()["cause"].value_counts()
            by = ", ".join(f"{k:,} {figures.CAUSE_LABELS.get(c, c)}" for c, k in causes.items())
            line = (f"**{n:,} collectives** on {ranks}. The trace has none of their launches (no runtime API records), so how "
                    f"long after its launch each started is unknown; by the cause of their ready → start: {by}.")  # fmt: skip
        else:
            # every part of start − launch the summary has (launch_call included, which the chart does not draw yet)
            total = {c: float(summary[f"{c}_us"].sum()) for c in explain_lib.CAUSES if f"{c}_us" in summary}
            worst = max(total, key=total.get)
            label = figures.CAUSE_LABELS.get(worst, worst.replace("_", " "))
            line = (f"**{n:,} collectives** on {ranks} started {figures.fmt_duration(sum(total.values()))} after their launches in "
                    f"all; most of it **{label}** ({figures.fmt_duration(total[worst])}).")  # fmt: skip
            if unknown:
                line += f" The trace has no launch for {unknown:,} of them (not in these sums)."
            panes.append(static_plot(self.store, ("late by cause", run), lambda: figures_why.late_by_cause(summary, width=600)))
        line += " " + _held_off(self.store.explained(), int(summary["n_blocked"].sum()))
        try:
            rows = self.store.breakdown()
        except Unavailable:
            rows = None
        if rows is not None and len(rows):  # beside the start delays: the wait inside collectives for the last rank
            wait = int(rows["peer_wait_ns"].sum())
            if not rows["peers_known"].astype(bool).any():
                line += (" **Peer wait** (waiting inside a collective for the rank that started it last) is not known here: "
                         "no collective was compared across ranks.")  # fmt: skip
            else:
                line += (f" Beside these start delays, the ranks waited **{format_ns(wait)}** of exposed time inside "
                         "collectives for the rank that started them last (**peer wait**, per rank in the chart; the "
                         "straggler findings on the **Overview** name that rank).")  # fmt: skip
                panes.append(static_plot(self.store, ("peer wait", run), lambda: pages_findings.peer_wait_chart(rows)))
        if len(blocked):
            panes.append(static_plot(self.store, ("blockers", run), lambda: figures_why.blockers(blocked, width=480)))
        return pn.Column(pn.pane.Markdown(line, margin=(0, 10)), *([pn.Row(*panes)] if panes else []), sizing_mode="stretch_width")

    @param.depends("store.run_id", "cause", "rank", "shown")
    def _kernels(self):
        if (spacer := self.visit("kernels", (self.store.run_id, self.cause, self.rank))) is not None:
            return spacer
        try:
            e = self._records()
        except Unavailable:
            return pn.Spacer(height=0)
        if not len(e):
            if not len(self.store.explained()):  # (the summary above says the run has none)
                return pn.Spacer(height=0)
            return notice("No collective of this cause on this rank.", "info")
        shown = self._display(self.store.run_id).loc[e.index].reset_index(drop=True)
        num = _money(1)
        tab = table(shown, titles=_KERNEL_TITLES, remote=len(shown) > 200, page_size=10, selectable=1,
                    formatters={"start": _money(3), "late": num, "delay": num,
                                "peer": num})  # fmt: skip
        keys = e[["run_id", "rank", "start_ns"]].reset_index(drop=True)

        def pick(event) -> None:
            if event.new:
                i = event.new[0]
                hit = self.store.explained().loc[(self.store.explained()["rank"] == keys.loc[i, "rank"])
                                                 & (self.store.explained()["start_ns"] == keys.loc[i, "start_ns"])]  # fmt: skip
                if len(hit):
                    self.record = hit.iloc[0].to_dict()

        tab.param.watch(pick, "selection")
        self._table = tab
        order = ("longest start − launch first" if e["start_minus_launch_ns"].notna().any() else
                 "longest ready → start first (the trace has none of their launches)")  # fmt: skip
        return pn.Column(pn.pane.Markdown(f"#### Every collective of this run, {order} ({len(shown):,}) — select one "
                                          "for its SM budget below", margin=(10, 10, 0, 10)), tab, sizing_mode="stretch_width")  # fmt: skip

    def _show_on_timeline(self, *_):
        r = self.record
        if r is None:
            return
        self.store.focus = {"run_id": r["run_id"], "rank": int(r["rank"]), "stream": r["stream"], "start_ns": int(r["start_ns"])}
        cb = getattr(self.store, "open_timeline", None)
        if cb is not None:
            cb(r["run_id"])

    @param.depends("record", "what_if", "shown")
    def _budget(self):
        if (spacer := self.visit("budget", (None if self.record is None else (self.record["run_id"], int(self.record["rank"]), int(self.record["start_ns"])), self.what_if))) is not None:
            return spacer
        r = self.record
        if r is None:
            return pn.Spacer(height=0)
        option = None
        if self.what_if != "as recorded" and len(self._options):
            option = self._options.loc[int(self.what_if)].to_dict()
        where = (f"rank {int(r['rank'])} · stream {r['stream']} · {figures.short_name(r['name'])} · cause "
                 f"**{figures.CAUSE_LABELS.get(r['cause'], r['cause'])}**")  # fmt: skip
        try:
            tab, facts = self.store.budget(r, option)
        except Unavailable as exc:
            self._exportable("budget", False)  # (the page says why: no button that can only fail)
            note = _no_device(self.store, int(r["rank"]))
            said = notice(f"**SM budget not available for rank {int(r['rank'])}.** {note}") if note else unavailable("SM budget", exc)
            return pn.Column(pn.pane.Markdown(f"#### SM budget of the chosen collective\n{where}"), said)
        self._exportable("budget", True)
        free = facts.get("free_sms")
        extra = ("" if free is None else " · no SM was free of computation at ready" if free == 0 else
                 f" · **{free} of {facts.get('num_sms')} SMs** were free of computation at ready (the collective fits there)")  # fmt: skip
        note = f"\n\n{facts['note']}" if facts.get("note") else ""
        if held := facts.get("held_sm"):
            k = int(held["fit"])
            note += (f"\n\nShown: one of the free SMs (on an SM {figures.short_name(held['resident'], 50)} held, "
                     f"{k} comm {'block' if k == 1 else 'blocks'} would fit).")  # fmt: skip
        opts = self._options
        if option is None and facts.get("resident") and len(opts) and (opts["comm_blocks_fit_per_sm"] < 1).all():
            note += "\n\nNone of the **What if** options makes room for one comm block on an SM this kernel holds."
        return pn.Column(
            pn.pane.Markdown(f"#### SM budget of the chosen collective at its ready time\n{where}{extra}{note}", margin=(10, 10, 0, 10)),
            static_plot(self.store, ("sm budget", r["run_id"], int(r["rank"]), int(r["start_ns"]), self.what_if),
                        lambda: figures_why.sm_budget(tab, facts, width=PLOT_WIDTH - 100)),
            sizing_mode="stretch_width",
        )

    def __panel__(self):
        store = self.store
        self._exports = export_buttons(store, ("why", lambda: {"runs": [store.run_id]}, "Export summary"),
                                       ("budget", lambda: {"runs": [store.run_id], "record": self.record, "what_if": self._chosen_option()},
                                        "Export SM budget"))  # fmt: skip
        controls = controls_row(self.run_select(), self._exports)
        intro = pn.pane.Markdown(
            "### Why did the collectives start late?\nEach collective's **start − launch** split by cause "
            "(`overlapviz explain`: stream order, event dependency, SM resources, launch latency), beside it the **peer "
            "wait** (time inside collectives waiting for the rank that started them last), the computation "
            "kernels that held the SMs, and for one collective the **SM budget**: what one SM had, what the "
            "resident computation held and what one communication block needed.", margin=(0, 10))  # fmt: skip
        filters = pn.Row(pn.widgets.Select.from_param(self.param.cause, width=200), pn.widgets.Select.from_param(self.param.rank, width=120),
                         pn.widgets.Button(label="Show the chosen collective on the Timeline", color="primary",
                                           on_click=self._show_on_timeline, align="end"))  # fmt: skip
        what = pn.widgets.Select.from_param(self.param.what_if, width=640)

        def chosen(*_):  # a run without collectives (no record) says so: no filter or what-if that can do nothing
            filters.visible = what.visible = self.record is not None

        chosen()
        self.param.watch(chosen, "record")
        return pn.Column(controls, intro, self._summary, filters, self._kernels, what, self._budget,
                         sizing_mode="stretch_width", name="Why late")  # fmt: skip

    def _chosen_option(self) -> dict | None:
        if self.what_if == "as recorded" or not len(self._options):
            return None
        return self._options.loc[int(self.what_if)].to_dict()


class ResidencyPage(Page):
    """Resident blocks per SM of the run's busiest kernel launch shapes, coloured by the limiting resource, and every
    shape in a table; without device limits, which fields are missing and how to give them."""

    @param.depends("store.run_id", "shown")
    def _residency(self):
        if (spacer := self.visit("residency", (self.store.run_id,))) is not None:
            return spacer
        self._exportable("residency", False)  # until there is a figure to export (the page says why there is none)
        try:
            t = self.store.run_residency()
        except Unavailable as exc:
            return unavailable("Residency", exc)
        if note := _no_device(self.store):
            return notice(f"**No residency for {self.store.run_id}.** {note}")
        known = pd.to_numeric(t["blocks_per_sm"], errors="coerce").notna()
        if not known.any():
            notes = t["residency_note"].dropna().unique()[:3]
            return notice(f"No kernel launch shape of {self.store.run_id} has a residency: {'; '.join(map(str, notes)) or 'shapes unknown'}.")
        self._exportable("residency", True)
        cols = {"name": "kernel", "kind": "kind", "threads_per_block": "threads/block", "regs_per_thread": "registers/thread",
                "shared_mem_bytes": "shared mem/block (B)", "blocks_per_sm": "blocks/SM", "limiter": "limited by",
                "occupancy": "occupancy (%)", "n_launches": "launches", "total_us": "total (µs)", "waves": "waves"}  # fmt: skip
        shown = t[[c for c in cols if c in t]].assign(name=t["name"].map(figures.short_name))
        if "limiter" in shown:
            shown["limiter"] = figures.limiter_words(shown["limiter"])
        if "occupancy" in shown:  # a bar and its percentage as the CLI gives it (62.5, not 62: round() goes to even)
            shown["occupancy"] = (pd.to_numeric(shown["occupancy"], errors="coerce") * 100).round(1)
        # waves to 4 decimals at most: a 2-block grid on 108 SMs is 0.0046 of a wave, not "0.00"
        waves = NumberFormatter(format="0,0.[0000]", nan_format="—", null_format="—", text_align="right")
        fmts = {"occupancy": {"type": "progress", "max": 100, "legend": True}, "total_us": _money(1), "waves": waves}
        return pn.Column(
            static_plot(self.store, ("residency", self.store.run_id), lambda: figures.residency(t, width=PLOT_WIDTH)),
            table(shown, titles=cols, formatters={k: v for k, v in fmts.items() if k in shown}, page_size=10,
                  remote=len(shown) > 200),
            sizing_mode="stretch_width",
        )

    def __panel__(self):
        store = self.store
        self._exports = export_buttons(store, ("residency", lambda: {"runs": [store.run_id]}, "Export residency"))
        controls = controls_row(self.run_select(), self._exports)
        intro = pn.pane.Markdown(
            "### Residency per kernel launch shape\nHow many blocks of each launch shape one SM holds at once (registers, "
            "shared memory, threads and block slots of the run's GPU) and which resource limits it: what is left on an "
            "SM for a collective's blocks while the computation runs.", margin=(0, 10))  # fmt: skip
        return pn.Column(controls, intro, self._residency, sizing_mode="stretch_width", name="Residency")


_INSTANCE_TITLES = {
    "instance": "instance", "collective": "collective", "n_ranks": "ranks", "arrival_skew_us": "arrival skew (µs)",
    "slowest_rank": "last ready", "straggler": "straggler (started last)", "max_peer_wait_us": "max peer wait (µs)", "time_us": "time (µs)", "busbw_gbps": "bus bw (GB/s)",
}  # fmt: skip


class CollectivesPage(Page):
    """Collectives across ranks (instance x rank: arrival and peer wait, skew, the last ready rank and the straggler, bus
    bandwidth) and per rank where communication time went and how many instances it started last."""

    value = param.Selector(default="arrival_us", objects={"arrival after the first rank": "arrival_us", "peer wait": "peer_wait_us"},
                           label="Cells show")  # fmt: skip

    @param.depends("store.run_id", "value", "shown")
    def _collectives(self):
        if (spacer := self.visit("collectives", (self.store.run_id, self.value))) is not None:
            return spacer
        try:
            inst, cells = self.store.instances(), self.store.instance_cells()
        except Unavailable as exc:
            return unavailable("Collectives across ranks (overlapviz explain --instances)", exc)
        if not len(inst):
            return notice(f"Run {self.store.run_id} has no communication kernels.", "info")
        if int(inst["n_ranks"].max()) < 2:
            return notice(f"Every collective of {self.store.run_id} was seen on one rank only: arrival skew, peer wait and the "
                          "slowest rank need the traces of two or more ranks of the same job (ingest them as one run: a "
                          "directory of per-rank traces).", "info")  # fmt: skip
        skew = pd.to_numeric(inst["arrival_skew_us"], errors="coerce")
        last = inst["straggler"].astype("Int64").value_counts()
        line = (f"**{len(inst):,} collective instances** over {int(inst['n_ranks'].max())} ranks · median arrival skew "
                f"{figures.fmt_us(skew.median())} µs, max {figures.fmt_us(skew.max())} µs")  # fmt: skip
        if len(last):
            line += (f" · most often the **straggler** (the rank that started an instance last): **rank {int(last.index[0])}** "
                     f"({int(last.iloc[0]):,} of {len(inst):,})")  # fmt: skip
        else:
            line += " · no straggler: the ranks' clocks do not compare (see the Overview's breakdown)"
        if inst["bytes"].isna().all():
            line += " · bus bandwidth needs the message size (record_param_comms' element count, or the run's message_bytes)"
        shown = inst.sort_values("arrival_skew_us", ascending=False, kind="stable")[[c for c in _INSTANCE_TITLES if c in inst]]
        shown = shown.assign(**{c: figures.int_text(shown[c]) for c in ("slowest_rank", "straggler") if c in shown})
        digits = {c: 1 for c in ("arrival_skew_us", "max_peer_wait_us", "time_us", "busbw_gbps") if c in shown}
        return pn.Column(
            pn.pane.Markdown(line, margin=(0, 10)),
            *self._collective_plots(cells, inst),
            pn.pane.Markdown("#### Instances, largest arrival skew first" + (
                f" (the {_STATIC_ROWS} largest of {len(shown):,}; every instance: `overlapviz explain DATASET --run "
                f"{shlex.quote(str(self.store.run_id))} --instances`)" if len(shown) > _STATIC_ROWS else ""), margin=(10, 10, 0, 10)),
            StaticTable(shown.head(_STATIC_ROWS), titles=_INSTANCE_TITLES, digits=digits, right=["slowest_rank", "straggler"], rows=10),
            sizing_mode="stretch_width",
        )  # fmt: skip

    def _collective_plots(self, cells: pd.DataFrame, inst: pd.DataFrame) -> list:
        """The collectives' figures (built once per run and cell value for every session), as panes."""

        store, run, value = self.store, self.store.run_id, self.value
        # no instance with an arrival skew (the ranks' clocks do not compare: the line above says so): no empty scatter
        # (HoloViews failed on its all-null column, and the whole page with it: the generated 1M-kernel set, 2026-12-07)
        skewed = pd.to_numeric(inst["arrival_skew_us"], errors="coerce").notna().any()
        drawn = [static_plot(store, ("arrival grid", run, value), lambda: figures_why.arrival_grid(cells, width=PLOT_WIDTH, value=value)),
                 *([static_plot(store, ("arrival skew", run), lambda: figures_why.arrival_skew(inst, width=PLOT_WIDTH))] if skewed else []),
                 pn.Row(*[static_plot(store, ("rank waits", run, i), lambda i=i: figures_why.rank_waits(cells, inst, width=PLOT_WIDTH // 2 - 10)[i])
                          for i in (0, 1)])]  # fmt: skip
        if figures_why.has_bus_bandwidth(inst):
            drawn.append(static_plot(store, ("bus bandwidth", run), lambda: figures_why.bus_bandwidth(inst, width=PLOT_WIDTH)))
        return drawn

    @param.depends("store.run_id", "shown")
    def _ranks(self):
        if (spacer := self.visit("ranks", (self.store.run_id,))) is not None:
            return spacer
        try:
            metrics, rows, inst = self.store.metrics(), self.store.breakdown(), self.store.instances()
        except Unavailable as exc:
            return unavailable("Per-rank metrics", exc)
        run = self.store.run_id
        mine = metrics.loc[metrics["run_id"] == run]
        if not len(mine):
            return notice(f"No kernels, so no per-rank metrics, for {run}.", "info")
        last = inst["straggler"].dropna().astype(int).value_counts() if "straggler" in inst else pd.Series(dtype="int64")
        cols = {"rank": "rank", "comm_us": "comm (µs)", "compute_us": "compute (µs)", "overlap_us": "overlapped (µs)",
                "exposed_comm_us": "exposed comm (µs)", "overlap_fraction": "overlap", "span_us": "GPU span (µs)",
                "n_kernels": "kernels", "n_comm_kernels": "comm kernels", "started_last": "straggler at (instances)"}  # fmt: skip
        shown = mine.assign(started_last=[int(last.get(int(r), 0)) for r in mine["rank"]],
                            overlap_fraction=pd.to_numeric(mine["overlap_fraction"], errors="coerce").map(figures.fmt_pct))
        shown = shown[[c for c in cols if c in shown]]
        digits = {c: 1 for c in cols if c.endswith("_us") and c in shown}
        has_comm = len(rows) and int(rows["comm_ns"].sum()) > 0
        return pn.Column(
            pn.pane.Markdown("#### Per rank: where communication time went, and the collectives each started last\nThe "
                             "**straggler** of a collective instance is the rank that started it last; the other ranks "
                             "waited for it (their **peer wait**). A rank that waited is never called a straggler.",
                             margin=(10, 10, 0, 10)),  # fmt: skip
            pn.Row(*([static_plot(self.store, ("ranks breakdown", run), lambda: pages_findings.breakdown_chart(
                         rows, title="Communication per rank", width=PLOT_WIDTH // 2 - 10))] if has_comm else []),
                   *([static_plot(self.store, ("stragglers", run), lambda: pages_findings.straggler_chart(
                       shown, width=PLOT_WIDTH // 2 - 10))] if len(last) else [])),
            StaticTable(shown, titles=cols, digits=digits, rows=16) if len(shown) <= _STATIC_ROWS else
            table(shown, titles=cols, page_size=16, remote=True, formatters={c: _money(n) for c, n in digits.items()}),
            sizing_mode="stretch_width",
        )  # fmt: skip

    def __panel__(self):
        store = self.store
        controls = controls_row(
            self.run_select(),
            pn.widgets.RadioButtonGroup.from_param(self.param.value, color="primary", variant="outline", align=("start", "end")),
            export_buttons(store, ("collectives", lambda: {"runs": [store.run_id], "value": self.value}, "Export collectives"),
                           ("ranks", lambda: {"runs": [store.run_id]}, "Export ranks")),
        )  # fmt: skip
        intro = pn.pane.Markdown(
            "### Collectives across ranks\nOne instance of a collective, matched across ranks by process group and sequence "
            "number (else by position): when each rank was ready, how long each waited for its peers (peer wait, assuming "
            "comparable clocks), which rank was last, and the bus bandwidth (nccl-tests' convention).", margin=(0, 10))  # fmt: skip
        return pn.Column(controls, intro, self._collectives, self._ranks, sizing_mode="stretch_width", name="Collectives")


__all__ = ["CollectivesPage", "ResidencyPage", "WhyPage"]
