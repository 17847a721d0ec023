"""Timeline figures: kernels per rank and stream, each collective's wait from launch to start split by cause with arrows from its producer or blocker, and two runs compared. Rasterized with NumPy above a glyph budget; never computes a metric (the why columns come from ``overlapviz.analysis.explain``/``budget``)."""

from __future__ import annotations

import copy
import functools

import holoviews as hv
import numpy as np
import pandas as pd

from overlapviz.figures import charts as figures
from overlapviz.figures.charts import CAUSE_COLORS, CAUSE_LABELS, KIND_COLORS, plain_frame, fmt_bytes, int_text
from overlapviz.figures.raster import coverage as _coverage  # the raster rule the Dask workers share

MAX_GLYPHS = 20_000  # above this many kernels in view the timeline is rasterized
MAX_ARROWS = 2_000  # producer/blocker arrows drawn at most (zoom in for the rest)
ROWS_PER_LANE = 10  # raster rows per rank x stream lane: gap, 6 kernel rows, 2 wait rows, gap
KERNEL_Y = (-0.40, 0.18)  # a kernel's bar within its lane (lane-relative; the axis is inverted: -0.4 is the top)
WAIT_Y = (0.22, 0.42)  # a collective's wait track, under its kernels
TIMELINE_COLUMNS = [
    "run_id", "rank", "device", "stream", "correlation", "name", "kind", "start_ns", "end_ns", "grid_x", "grid_y",
    "grid_z", "block_x", "block_y", "block_z", "regs_per_thread", "shared_mem_bytes", "step",
]  # fmt: skip
WHY_COLUMNS = [
    "rank", "stream", "start_ns", "launch_ns", "ready_ns", "ready_from", "start_delay_us", "start_minus_launch_ns",
    "cause", "blocking_resource", "blocker", "comm_blocks_fit_per_sm", "free_sms", "num_sms", "producer",
    "dependency_ready_ns", "producer_stream", "peer_wait_us", "residency_note",
]  # fmt: skip
KINDS = list(KIND_COLORS)  # the kernel kinds, in the raster's order
PARTS = ["stream_order", "dependency", "sm_resources", "launch_latency", "unknown"]  # the wait tracks' parts, in order
_TOOLS = ["xwheel_zoom", "xpan", "xbox_zoom", "reset"]  # time only: lanes never zoom away


def int64_filled(s: pd.Series) -> np.ndarray:
    """A nullable integer column as int64 with -1 for null."""
    if pd.api.types.is_integer_dtype(s.dtype):
        return s.to_numpy(dtype=np.int64, na_value=-1)
    return pd.to_numeric(s, errors="coerce").astype("Float64").fillna(-1).to_numpy(np.float64).astype(np.int64)


def ms_from(ns: np.ndarray, origin: int) -> np.ndarray:
    """Times in ns as ms after ``origin`` (ns): the int64 difference first, then the division."""
    return (np.asarray(ns, np.int64) - origin) / 1e6


class TimelineData:
    """Kernels of one run prepared once for repeated drawing: lanes, ms offsets, sorted by start, and the why.

    Parameters
    ----------
    kernels
        ``kernels`` rows (at least ``rank, stream, kind, start_ns, end_ns``; the hover columns of
        ``TIMELINE_COLUMNS`` where present). Not modified.
    residency
        Optional ``overlapviz.analysis.residency.kernel_residency`` rows: ``blocks_per_sm`` and
        ``limiter`` in the hover, joined on the launch shape.
    why
        Optional ``overlapviz.analysis.explain.explain`` records of the run, with
        ``overlapviz.analysis.budget.blocker_positions`` columns where known: the comm kernels'
        hover (launch, delay, cause, blocker, fit) and the arrows.
    waits
        Optional ``overlapviz.analysis.budget.wait_segments`` of those records: the wait tracks.
    origin_ns
        Time shown as 0 ms; the first kernel start by default.
    """

    def __init__(self, kernels: pd.DataFrame, *, residency=None, why=None, waits=None, origin_ns: int | None = None):
        # rows keep their order (a dataset stores each rank's kernels sorted by start): nothing here needs a global sort
        frame = kernels.reset_index(drop=True)
        rank, stream = int64_filled(frame["rank"]), int64_filled(frame["stream"])
        scode, suniq = pd.factorize(stream)
        width = max(len(suniq), 1)
        lane_code, lane_key = pd.factorize(rank * width + scode)
        lanes = pd.DataFrame({"rank": np.asarray(lane_key) // width, "stream": np.asarray(suniq)[np.asarray(lane_key) % width]})
        lanes = lanes.sort_values(["rank", "stream"], kind="stable")
        remap = np.empty(len(lanes), np.int64)
        remap[lanes.index.to_numpy()] = np.arange(len(lanes))
        self.lanes = lanes.reset_index(drop=True).assign(lane=np.arange(len(lanes)))
        self.lane_labels = [f"rank {r} · stream {s}" for r, s in zip(self.lanes["rank"], self.lanes["stream"])]
        self.n_lanes = len(self.lanes)
        self.lane = remap[lane_code].astype(np.int64) if len(frame) else np.empty(0, np.int64)
        start_ns = frame["start_ns"].to_numpy(np.int64)
        self.origin_ns = (int(start_ns.min()) if len(frame) else 0) if origin_ns is None else int(origin_ns)
        self.frame = frame
        self.start_ms = ms_from(start_ns, self.origin_ns)
        self.end_ms = ms_from(frame["end_ns"].to_numpy(np.int64), self.origin_ns)
        self.kind_code = _kind_codes(frame["kind"])
        self.residency = residency
        self._bands = None
        self._glyphs: dict = {}  # the whole run's glyph tables (a run that fits in the glyph budget), built once
        self.why_source, self.waits_source = why, waits  # as given (a rank selection is cut from them)
        self.why = self._join_why(why)
        self.waits = self._waits(waits)
        self.kinds_present = np.bincount(self.kind_code, minlength=len(KINDS)) > 0
        self.parts_present = (np.bincount(self.waits["part"], minlength=len(PARTS)) > 0) if self.waits is not None else \
            np.zeros(len(PARTS), bool)  # fmt: skip

    def with_why(self, *, residency=None, why=None, waits=None) -> "TimelineData":
        """This run's kernels with the why added (lanes and times shared, not computed again)."""
        out = copy.copy(self)
        out._glyphs = {}
        out.residency = residency
        out.why_source, out.waits_source = why, waits
        out.why = out._join_why(why)
        out.waits = out._waits(waits)
        out.parts_present = (np.bincount(out.waits["part"], minlength=len(PARTS)) > 0) if out.waits is not None else \
            np.zeros(len(PARTS), bool)  # fmt: skip
        return out

    # --- the why ---------------------------------------------------------------------

    def _lanes_of(self, rank, stream) -> np.ndarray:
        """The lane of each (rank, stream) pair, -1 where the run has no such lane."""
        r, s = int64_filled(pd.Series(rank)), int64_filled(pd.Series(stream))
        index = pd.MultiIndex.from_arrays([self.lanes["rank"].to_numpy(np.int64), self.lanes["stream"].to_numpy(np.int64)])
        return index.get_indexer(pd.MultiIndex.from_arrays([r, s])).astype(np.int64)

    def _join_why(self, why: pd.DataFrame | None) -> pd.DataFrame | None:
        """The why records aligned to the comm kernel rows of ``frame`` (``row``: its position)."""
        if why is None or not len(why) or not len(self.frame):
            return None
        comm = np.flatnonzero(self.kind_code == KINDS.index("comm"))
        key = pd.DataFrame({"row": comm, "rank": int64_filled(self.frame["rank"].iloc[comm]), "stream": int64_filled(self.frame["stream"].iloc[comm]),
                            "start_ns": self.frame["start_ns"].to_numpy(np.int64)[comm]})  # fmt: skip
        cols = [c for c in WHY_COLUMNS + ["blocker_stream", "blocker_end_ns"] if c in why]
        w = why[cols].assign(rank=int64_filled(why["rank"]), stream=int64_filled(why["stream"]), start_ns=why["start_ns"].to_numpy(np.int64))
        w = w.drop_duplicates(["rank", "stream", "start_ns"])
        out = key.merge(w, on=["rank", "stream", "start_ns"], how="inner", sort=False).sort_values("row", kind="stable")
        return out.reset_index(drop=True)

    def _waits(self, waits: pd.DataFrame | None) -> dict | None:
        if waits is None or not len(waits):
            return None
        lane = self._lanes_of(waits["rank"], waits["stream"])
        keep = lane >= 0
        w = waits.loc[keep]
        s = ms_from(w["start_ns"].to_numpy(np.int64), self.origin_ns)
        order = np.argsort(s, kind="stable")
        part = pd.Categorical(w["part"].astype(str), categories=PARTS).codes[order]
        return {"start_ms": s[order], "end_ms": ms_from(w["end_ns"].to_numpy(np.int64), self.origin_ns)[order], "lane": lane[keep][order],
                "part": np.where(part < 0, PARTS.index("unknown"), part).astype(np.int8), "us": w["us"].to_numpy(np.float64)[order]}  # fmt: skip

    # --- extents and selections ------------------------------------------------------

    @property
    def x_extent(self) -> tuple[float, float]:
        if not len(self.start_ms):
            return (0.0, 1.0)
        lo = float(self.start_ms.min())
        if self.waits is not None and len(self.waits["start_ms"]):
            lo = min(lo, float(self.waits["start_ms"][0]))
        return (lo, float(self.end_ms.max()))

    def visible(self, x_range: tuple[float, float] | None) -> np.ndarray:
        """Boolean mask of kernels intersecting ``x_range`` (ms); all when None."""
        if x_range is None:
            return np.ones(len(self.start_ms), bool)
        return (self.end_ms >= x_range[0]) & (self.start_ms <= x_range[1])

    def n_visible(self, x_range: tuple[float, float] | None) -> int:
        """Kernels intersecting ``x_range``, counted without a mask when the window is the whole run."""
        if x_range is None:
            return len(self.start_ms)
        return int(np.count_nonzero(self.visible(x_range)))

    def window_of(self, row: int, *, pad: float = 0.6) -> tuple[float, float]:
        """A window (ms) around kernel ``row`` that also shows its launch and its wait."""
        lo, hi = float(self.start_ms[row]), float(self.end_ms[row])
        if self.why is not None:
            hit = self.why.loc[self.why["row"] == row]
            if len(hit) and pd.notna(hit["launch_ns"].iloc[0]):
                lo = min(lo, (int(hit["launch_ns"].iloc[0]) - self.origin_ns) / 1e6)
        span = max(hi - lo, 1e-3)
        return (lo - pad * span, hi + pad * span)

    # --- glyph frames ---------------------------------------------------------------

    def hover_frame(self, mask: np.ndarray) -> pd.DataFrame:
        """Rectangles' columns for the selected kernels: readable text for every hover field."""
        sub = self.frame.loc[mask] if mask.dtype == bool else self.frame.iloc[mask]
        lane = self.lane[mask]
        s, e = self.start_ms[mask], self.end_ms[mask]
        dur = (sub["end_ns"].to_numpy(np.int64) - sub["start_ns"].to_numpy(np.int64)) / 1e3
        out = pd.DataFrame({
            "start_ms": s, "lane_lo": lane + KERNEL_Y[0], "end_ms": np.maximum(e, s + 1e-9), "lane_hi": lane + KERNEL_Y[1],
            "kind": np.asarray(KINDS, dtype=object)[self.kind_code[mask]],
            # the function with its template arguments, no return type or parameter list (a DeepEP or CUTLASS signature
            # ran the tooltip off the window); the whole name is in the Perfetto trace and `overlapviz explain`
            "name": figures.short_names(sub["name"].astype(str), HOVER_NAME_CHARS) if "name" in sub else "",
            "duration_us": dur, "start": s, "end": e,
            "where": "rank " + int_text(sub["rank"]) + " · stream " + int_text(sub["stream"]),
            "step": int_text(sub["step"]) if "step" in sub else "—",
            "grid": _dims3(sub, "grid"), "block": _dims3(sub, "block"),
            "regs": int_text(sub["regs_per_thread"]) if "regs_per_thread" in sub else "—",
            "smem": sub["shared_mem_bytes"].map(fmt_bytes).to_numpy(object) if "shared_mem_bytes" in sub else "—",
        })  # fmt: skip
        out["residency"] = _residency_text(sub, self.residency) if len(sub) else np.empty(0, object)
        return out

    def comm_frame(self, mask: np.ndarray) -> pd.DataFrame:
        """``hover_frame`` of the comm kernels in ``mask`` with their why (launch, delay, cause, blocker, fit)."""
        comm = mask & (self.kind_code == KINDS.index("comm"))
        out = self.hover_frame(comm)
        rows = np.flatnonzero(comm)
        n = len(rows)
        cols = {c: np.full(n, "—", dtype=object) for c in ("launch", "late", "ready", "cause", "blocker", "fit", "producer", "peer")}
        cause = np.full(n, "none", dtype=object)
        if self.why is not None and n:
            w = self.why
            pos = np.searchsorted(w["row"].to_numpy(np.int64), rows)
            pos = np.minimum(pos, max(len(w) - 1, 0))
            hit = (w["row"].to_numpy(np.int64)[pos] == rows) if len(w) else np.zeros(n, bool)
            h = w.iloc[pos[hit]]
            idx = np.flatnonzero(hit)
            launch = int64_filled(h["launch_ns"])
            cols["launch"][idx] = np.where(launch >= 0, pd.Series((launch - self.origin_ns) / 1e6).map("{:,.3f} ms".format), "unknown")
            sml = int64_filled(h["start_minus_launch_ns"])
            cols["late"][idx] = np.where(launch >= 0, pd.Series(sml / 1e3).map("{:,.1f} µs".format), "—")
            delay = pd.to_numeric(h["start_delay_us"], errors="coerce").astype("float64")
            cols["ready"][idx] = (delay.map("{:,.1f} µs after ".format) + h["ready_from"].astype(str).map(_READY).fillna("")).where(delay.notna(), "—").to_numpy(object)
            c = h["cause"].astype(str).to_numpy(object)
            cause[idx] = c
            res = h["blocking_resource"].astype(object).where(h["blocking_resource"].notna(), None)
            cols["cause"][idx] = [CAUSE_LABELS.get(x, x) + (f" ({_RES.get(r, r)})" if r else "") for x, r in zip(c, res)]
            cols["blocker"][idx] = h["blocker"].astype(object).where(h["blocker"].notna(), "—").map(figures.short_name).to_numpy(object)
            fit = pd.to_numeric(h["comm_blocks_fit_per_sm"], errors="coerce")
            free, nsm = pd.to_numeric(h["free_sms"], errors="coerce"), pd.to_numeric(h["num_sms"], errors="coerce")
            fit_txt = fit.map(lambda v: "—" if pd.isna(v) else f"{int(v)} comm {'block' if int(v) == 1 else 'blocks'}/SM at ready")
            sm_txt = [("" if pd.isna(f) else f"; {int(f)} of {int(m)} SMs free" if pd.notna(m) else f"; {int(f)} SMs free") for f, m in zip(free, nsm)]
            note = h["residency_note"].astype(object).where(h["residency_note"].notna(), "")
            cols["fit"][idx] = [a + b if a != "—" else (f"unknown: {n_}" if n_ else "—") for a, b, n_ in zip(fit_txt, sm_txt, note)]
            cols["producer"][idx] = h["producer"].astype(object).where(h["producer"].notna(), "—").map(figures.short_name).to_numpy(object)
            peer = pd.to_numeric(h["peer_wait_us"], errors="coerce")
            cols["peer"][idx] = peer.map(lambda v: "—" if pd.isna(v) else f"{v:,.1f} µs").to_numpy(object)
        return out.assign(cause_key=cause, **cols)

    def wait_frame(self, x_range) -> pd.DataFrame:
        """The wait tracks' rectangles intersecting ``x_range``."""
        cols = ["start_ms", "lane_lo", "end_ms", "lane_hi", "part", "label", "wait"]
        if self.waits is None:
            return pd.DataFrame({c: [] for c in cols})
        w = self.waits
        m = np.ones(len(w["start_ms"]), bool) if x_range is None else (w["end_ms"] >= x_range[0]) & (w["start_ms"] <= x_range[1])
        part = np.asarray(PARTS, dtype=object)[w["part"][m]]
        return pd.DataFrame({
            "start_ms": w["start_ms"][m], "lane_lo": w["lane"][m] + WAIT_Y[0], "end_ms": np.maximum(w["end_ms"][m], w["start_ms"][m] + 1e-9),
            "lane_hi": w["lane"][m] + WAIT_Y[1], "part": part, "label": [CAUSE_LABELS.get(p, p) for p in part],
            "wait": pd.Series(w["us"][m]).map("{:,.1f} µs".format).to_numpy(object),
        })  # fmt: skip

    def arrow_frame(self, x_range, limit: int = MAX_ARROWS) -> pd.DataFrame:
        """Arrows into the comm kernels in view: from the producer's end (dependency) or the blocker's end (SM resources)."""
        cols = ["x0", "y0", "x1", "y1", "what"]
        if self.why is None:
            return pd.DataFrame({c: [] for c in cols})
        w = self.why
        s = self.start_ms[w["row"].to_numpy(np.int64)]
        m = np.ones(len(w), bool) if x_range is None else (s >= x_range[0]) & (s <= x_range[1] + (x_range[1] - x_range[0]))
        w = w.loc[m]
        parts = []
        lane_c = self.lane[w["row"].to_numpy(np.int64)]
        if "producer_stream" in w and "dependency_ready_ns" in w:
            dep = int64_filled(w["dependency_ready_ns"])
            src = self._lanes_of(w["rank"], w["producer_stream"])
            ok = (dep >= 0) & (src >= 0) & (w["cause"].astype(str).to_numpy() == "dependency")
            t = ms_from(dep[ok], self.origin_ns)
            parts.append(pd.DataFrame({"x0": t, "y0": src[ok] + KERNEL_Y[1], "x1": t, "y1": lane_c[ok] + WAIT_Y[0], "what": "producer"}))
        if "blocker_stream" in w and "blocker_end_ns" in w:
            end = int64_filled(w["blocker_end_ns"])
            src = self._lanes_of(w["rank"], w["blocker_stream"])
            ok = (end >= 0) & (src >= 0)
            start_c = self.start_ms[w["row"].to_numpy(np.int64)[ok]]
            # from when room opened: the blocker's end, or the comm kernel's start while its last wave drained
            parts.append(pd.DataFrame({"x0": np.minimum(ms_from(end[ok], self.origin_ns), start_c), "y0": src[ok] + KERNEL_Y[1],
                                       "x1": start_c, "y1": lane_c[ok] + KERNEL_Y[0], "what": "blocker"}))  # fmt: skip
        out = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame({c: [] for c in cols})
        return out.iloc[:limit]

    def whole_glyphs(self, waits: bool) -> tuple:
        """(kernel rects, comm rects, wait rects, arrows) of the whole run, built once: a run drawn whole as glyphs sends
        them all, so a zoom inside it builds nothing (Bokeh clips what is out of view)."""
        if waits not in self._glyphs:
            mask = self.visible(None)
            none = (0.0, -1.0)
            self._glyphs[waits] = (self.hover_frame(mask & (self.kind_code != KINDS.index("comm"))), self.comm_frame(mask),
                                   self.wait_frame(None) if waits else self.wait_frame(none),
                                   self.arrow_frame(None) if waits else self.arrow_frame(none))  # fmt: skip
        return self._glyphs[waits]

    # --- raster ----------------------------------------------------------------------

    def raster(self, x_range: tuple[float, float], width: int) -> hv.RGB:
        """Kernels (and wait tracks) of every lane counted per pixel column, coloured by kind (cause)."""
        x0, x1 = x_range
        if not x1 > x0:
            x1 = x0 + 1e-6
        height = max(self.n_lanes, 1)
        width = int(width)
        mask = self.visible(x_range)
        kern = _coverage(self.start_ms[mask], self.end_ms[mask], self.lane[mask], self.kind_code[mask], len(KINDS), height, width, x0, x1)
        colors_k = rgb([KIND_COLORS[k] for k in KINDS])
        img = np.zeros((height * ROWS_PER_LANE, width, 4), np.uint8)  # row 0 = lowest y
        k_rgba = shade(kern, colors_k)
        for r in range(1, 7):
            img[r::ROWS_PER_LANE] = k_rgba
        if self.waits is not None:
            w = self.waits
            m = (w["end_ms"] >= x0) & (w["start_ms"] <= x1)
            waits = _coverage(w["start_ms"][m], w["end_ms"][m], w["lane"][m], w["part"][m], len(PARTS), height, width, x0, x1)
            w_rgba = shade(waits, rgb([CAUSE_COLORS[p] for p in PARTS]))
            for r in (7, 8):
                img[r::ROWS_PER_LANE] = w_rgba
        return hv.RGB(img[::-1], bounds=(x0, -0.5, x1, height - 0.5), kdims=["time_ms", "lane"], vdims=list("RGBA"))

    def bands(self) -> pd.DataFrame:
        """Step bands (computed once): the GPU extent of each rank's step, spanning that rank's lanes."""
        if self._bands is None:
            self._bands = _band_table(self)
        return self._bands


_READY = {"launch": "launch", "stream": "stream ready", "dependency": "dependency ready"}
_RES = {"registers": "registers", "shared_memory": "shared memory", "shared_memory_carveout": "shared-memory carve-out",
        "warps": "warps", "threads": "threads", "block_slots": "block slots"}  # fmt: skip


def _kind_codes(kind: pd.Series) -> np.ndarray:
    """Each row's index in ``KINDS`` (unknown kinds are ``other``), through the categories when the column has them."""
    other = KINDS.index("other")
    if isinstance(kind.dtype, pd.CategoricalDtype):
        table = np.array([KINDS.index(c) if c in KINDS else other for c in kind.cat.categories.astype(str)] + [other], np.int8)
        codes = kind.cat.codes.to_numpy()
        return table[np.where(codes < 0, len(table) - 1, codes)]
    cat = pd.Categorical(kind.astype(str), categories=KINDS)
    return np.where(cat.codes < 0, other, cat.codes).astype(np.int8)


def _dims3(frame: pd.DataFrame, prefix: str) -> np.ndarray:
    cols = [f"{prefix}_{a}" for a in "xyz"]
    if not all(c in frame for c in cols) or not len(frame):
        return np.full(len(frame), "—", dtype=object)
    parts = [int_text(frame[c], "?") for c in cols]
    return np.where(frame[cols[0]].notna().to_numpy(bool), parts[0] + "×" + parts[1] + "×" + parts[2], "—").astype(object)


HOVER_NAME_CHARS = 120  # a kernel's name in the tooltip, at most (figures.short_name)

# the hover's residency of a timeline drawn before the run's residency is computed (it comes with the why)
RESIDENCY_PENDING = "… (computing, with the why)"


def _residency_text(sub: pd.DataFrame, residency: pd.DataFrame | str | None) -> np.ndarray:
    """'N blocks/SM (limited by X)' per kernel, joined from kernel_residency by launch shape; why not, else."""
    n = len(sub)
    if isinstance(residency, str):  # RESIDENCY_PENDING: drawn before the run's residency was at hand
        return np.full(n, residency, dtype=object)
    if residency is None or not len(residency) or not {"block_x", "regs_per_thread", "shared_mem_bytes"} <= set(sub.columns):
        return np.full(n, "— (no device limits)" if residency is None else "—", dtype=object)
    threads = sub["block_x"].astype("Int64") * sub["block_y"].fillna(1).astype("Int64") * sub["block_z"].fillna(1).astype("Int64")
    key = pd.DataFrame({"name": sub["name"].astype(str).to_numpy(), "threads_per_block": threads.to_numpy(),
                        "regs_per_thread": sub["regs_per_thread"].astype("Int64").to_numpy(),
                        "shared_mem_bytes": sub["shared_mem_bytes"].astype("Int64").to_numpy()})  # fmt: skip
    if "run_id" in sub and "run_id" in residency:
        key["run_id"] = sub["run_id"].astype(str).to_numpy()
    if "rank" in residency:  # a run on two GPU models: residency.by_rank's rows, each rank its own model's
        key["rank"] = sub["rank"].astype("Int64").to_numpy()
    on = [c for c in key.columns if c in residency.columns]
    right = residency[on + ["blocks_per_sm", "limiter"] + (["residency_note"] if "residency_note" in residency else [])]
    right = right.drop_duplicates(on).astype({c: ("Int64" if c not in ("name", "run_id") else str) for c in on})
    joined = key.astype({c: ("Int64" if c not in ("name", "run_id") else str) for c in on}).merge(right, on=on, how="left", sort=False)
    b = pd.to_numeric(joined["blocks_per_sm"], errors="coerce")
    lim = joined["limiter"].astype(object)
    note = joined["residency_note"].astype(object) if "residency_note" in joined else pd.Series([None] * n)
    return np.array([
        (f"{int(x)} blocks/SM (limited by {_RES.get(y, y)})" if pd.notna(x) else f"— ({z})" if isinstance(z, str) and z else "—")
        for x, y, z in zip(b, lim, note)
    ], dtype=object)  # fmt: skip


def rgb(hexes: list[str]) -> np.ndarray:
    """``#RRGGBB`` colours as rows of (red, green, blue), 0-255."""
    return np.array([[int(h[i : i + 2], 16) for i in (1, 3, 5)] for h in hexes], np.float64)


def shade(counts: np.ndarray, colors: np.ndarray) -> np.ndarray:
    """RGBA per (lane, column): the categories' colours mixed by count, opacity by log count (as datashader's ``how='log'``)."""
    total = counts.sum(axis=0)
    mix = np.einsum("cly,ck->lyk", counts, colors) / np.maximum(total, 1)[..., None]
    top = np.log1p(total.max()) if total.size and total.max() > 0 else 1.0
    alpha = np.where(total > 0, 170 + 85 * np.log1p(total) / top, 0)
    out = np.zeros(total.shape + (4,), np.uint8)
    out[..., :3] = np.clip(mix, 0, 255).astype(np.uint8)
    out[..., 3] = alpha.astype(np.uint8)
    return out


def _band_table(data: TimelineData) -> pd.DataFrame:
    """One row per (rank, step) in that order: the step's GPU extent (x) over the rank's lanes (y) that hold a kernel of
    a step; NumPy over rows kept in each rank's time order (a sort of nearly sorted keys), not a two-key groupby."""
    frame = data.frame
    cols = ["x0", "y0", "x1", "y1", "step_name", "shade"]
    if "step" not in frame or not frame["step"].notna().any():
        return pd.DataFrame({c: [] for c in cols})
    raw = frame["step"]
    numeric = pd.api.types.is_numeric_dtype(raw.dtype) and not pd.api.types.is_bool_dtype(raw.dtype)
    step = (raw if numeric else pd.to_numeric(raw, errors="coerce")).to_numpy(np.float64, na_value=np.nan)
    ok = ~np.isnan(step)
    rank, stp = int64_filled(frame["rank"])[ok], step[ok].astype(np.int64)
    start, end, lane = data.start_ms[ok], data.end_ms[ok], data.lane[ok]
    r0, s0 = int(rank.min()), int(stp.min())
    span = int(stp.max()) - s0 + 1
    if (int(rank.max()) - r0 + 1) * span >= 2**62:  # keys that would not fit one int64: sort on both
        order = np.lexsort((stp, rank))
    else:
        order = np.argsort((rank - r0) * span + (stp - s0), kind="stable")
    rk, st = rank[order], stp[order]
    first = np.flatnonzero(np.r_[True, (rk[1:] != rk[:-1]) | (st[1:] != st[:-1])])
    ext = pd.DataFrame({"rank": rk[first], "step": st[first], "x0": np.minimum.reduceat(start[order], first),
                        "x1": np.maximum.reduceat(end[order], first)})  # fmt: skip
    by_rank = pd.DataFrame({"rank": rank, "lane": lane}).groupby("rank", sort=False)["lane"]
    lo, hi = by_rank.min(), by_rank.max()
    return ext.assign(y0=lo.reindex(ext["rank"]).to_numpy(np.float64) - 0.48, y1=hi.reindex(ext["rank"]).to_numpy(np.float64) + 0.48,
                      step_name=ext["step"].map("step {}".format), shade=(ext["step"] % 2).astype(str))[cols]  # fmt: skip


def step_bands(data: TimelineData, steps: pd.DataFrame | None = None) -> hv.Rectangles:
    """Alternating bands behind each rank's lanes, one per step, from the GPU extent of the step's kernels.

    The GPU extent (first start to last end of the kernels launched in the step) is drawn rather
    than the host range, because launches run ahead of the GPU; ``steps`` (the ``steps`` table)
    only supplies the step names.
    """
    ext = data.bands()
    if len(ext) and steps is not None and len(steps):
        names = dict(zip(pd.to_numeric(steps["step"], errors="coerce"), steps["name"].astype(str)))
        ext = ext.assign(step_name=[names.get(int(s.split()[-1]), s) for s in ext["step_name"]])
    el = hv.Rectangles(plain_frame(ext), vdims=["step_name", "shade"])
    return el.opts(**_coloured(ext, "shade", {"0": "#ECECEC", "1": "#F7F7F7"}, "#ECECEC"), line_alpha=0, alpha=1.0,
                   default_tools=[], tools=_TOOLS)  # fmt: skip


_KERNEL_HOVER = [
    ("kernel", "@{name}"), ("kind", "@{kind}"), ("on", "@{where}"), ("start", "@{start}{0,0.000} ms"), ("end", "@{end}{0,0.000} ms"),
    ("duration", "@{duration_us}{0,0.0} µs"), ("step", "@{step}"), ("grid × block", "@{grid} × @{block}"),
    ("registers/thread", "@{regs}"), ("shared memory/block", "@{smem}"), ("residency", "@{residency}"),
]  # fmt: skip
_COMM_HOVER = [
    ("collective", "@{name}"), ("on", "@{where}"), ("start", "@{start}{0,0.000} ms"), ("end", "@{end}{0,0.000} ms"),
    ("duration", "@{duration_us}{0,0.0} µs"), ("launch", "@{launch}"), ("start − launch", "@{late}"), ("ready → start", "@{ready}"),
    ("cause", "@{cause}"), ("blocker", "@{blocker}"), ("producer", "@{producer}"), ("fit", "@{fit}"), ("peer wait", "@{peer}"),
    ("step", "@{step}"), ("grid × block", "@{grid} × @{block}"),
]  # fmt: skip
_WAIT_HOVER = [("waiting for", "@{label}"), ("for", "@{wait}"), ("from", "@{start_ms}{0,0.000} ms"), ("to", "@{end_ms}{0,0.000} ms")]
_RECT_KDIMS = [hv.Dimension("start_ms", label="Time since the first GPU activity", unit="ms"), "lane_lo", "end_ms", "lane_hi"]


LOD_TIMEOUT_MS = 80  # the wheel's zoom is sent to the server this long after the last turn (Bokeh's default: 500)
RANGE_DEBOUNCE_MS = 40  # the server waits this long for more range events before redrawing (HoloViews' default: 100)


def _quick_ranges(plot, element) -> None:
    """Send a zoom to the server soon after the wheel stops and redraw soon after it arrives: a redraw waits for
    Bokeh's ``lod_timeout`` in the browser, then for HoloViews' range debounce on the server."""
    plot.state.lod_timeout = LOD_TIMEOUT_MS
    for cb in getattr(plot, "callbacks", []):
        if "Range" in type(cb).__name__ and getattr(cb, "debounce", None):
            cb.debounce = RANGE_DEBOUNCE_MS


def _arrows_hook(plot, element) -> None:
    """Draw the element's segments as one vectorized Bokeh Arrow annotation (kept and refilled on redraws)."""
    from bokeh.models import Arrow, ColumnDataSource, VeeHead

    fig = plot.state
    d = element.dframe()
    names = [k.name for k in element.kdims]  # renamed (redim) in a compare panel
    data = {k: d[n].to_numpy(np.float64) if n in d else np.empty(0) for k, n in zip(("x0", "y0", "x1", "y1"), names)}
    colors = np.where(d["what"].to_numpy(object) == "blocker", CAUSE_COLORS["sm_resources"], CAUSE_COLORS["dependency"]) if len(d) else np.empty(0, object)
    data["color"] = colors
    arrow = next((r for r in fig.center if isinstance(r, Arrow) and r.name == "ovz-arrows"), None)
    if arrow is None:
        head = VeeHead(size=7, line_color={"field": "color"}, fill_color={"field": "color"}, line_width=1.5)
        fig.add_layout(Arrow(name="ovz-arrows", end=head, x_start="x0", y_start="y0", x_end="x1", y_end="y1", line_width=1.5,
                             line_color={"field": "color"}, line_dash="solid", source=ColumnDataSource(data)))  # fmt: skip
    else:
        arrow.source.data = data


_LEGEND_ROWS = len(KIND_COLORS) + len(CAUSE_COLORS)


@functools.cache
def _legend(kinds: tuple[str, ...], parts: tuple[str, ...]) -> hv.Points:
    """One element of zero-size points whose colours carry the legend (the run's kinds, and the causes of its
    waits) in raster and glyph modes alike (one element, not one per entry: each element is a subplot to lay out)."""
    items = [(k, KIND_COLORS[k]) for k in kinds] + [(f"wait: {CAUSE_LABELS[p]}", CAUSE_COLORS[p]) for p in parts]
    # as many rows for every run (the last entry repeated: one legend item per entry still): the browser applies a run
    # switch's new rows before its new legend items, and an item of the old legend pointing past the new rows threw
    # while painting, which dropped the rest of the switch (the plot kept the old run's title)
    entries = [i[0] for i in items] + [items[-1][0]] * (_LEGEND_ROWS - len(items)) if items else []
    frame = pd.DataFrame({"x": np.full(len(entries), np.nan), "y": np.full(len(entries), np.nan), "entry": entries})
    return hv.Points(frame, kdims=["x", "y"], vdims=["entry"]).opts(
        color="entry", cmap=dict(items), marker="square", size=10, show_legend=True, default_tools=[])


def _follow_height(plot, element) -> None:
    """Give the drawn figure the height of the frame (``lane_height``): HoloViews sizes a figure on its first frame only,
    and a DynamicMap's frame of fewer lanes (a rank chosen) was squeezed into the first frame's height."""
    if plot.height is not None and plot.state.height != plot.height:
        plot.state.height = plot.height


def lane_height(n_lanes: int) -> int:
    """Pixels per lane: 60 for a few lanes, down to 14 for many (the page scrolls beyond 40 lanes or so)."""
    return int(max(14, min(60, 560 // max(n_lanes, 1))))


def timeline_view(
    data: TimelineData,
    x_range: tuple[float, float] | None = None,
    *,
    max_glyphs: int = MAX_GLYPHS,
    width: int = 1100,
    steps: pd.DataFrame | None = None,
    title: str = "Timeline",
    waits: bool = True,
    responsive: bool = False,
) -> hv.Overlay:
    """One frame of the timeline: step bands, raster or glyphs of the kernels, wait tracks and arrows.

    When more than ``max_glyphs`` kernels intersect ``x_range`` (ms; the whole run when None)
    kernels and waits are rasterized and the glyph layers are empty, and the other way round,
    so the overlay has the same layers in both modes (as a DynamicMap requires). Comm
    kernels carry their why in the hover; arrows run from a dependency's producer (its end)
    and from the blocker of an ``sm_resources`` wait (its end) to the collective. The
    height follows the lanes, in a DynamicMap's later frames too; ``responsive`` stretches
    the plot to its container's width (``width`` then only sets the raster's columns).
    """
    extent = data.x_extent if x_range is None else x_range
    n = data.n_visible(x_range)
    top = max(data.n_lanes, 1) - 0.5
    with_waits = waits and data.waits is not None
    title, xformatter = view_labels(data, x_range, title=title, max_glyphs=max_glyphs, n=n)
    if n > max_glyphs:
        raster = data.raster(extent, width)
        none = np.zeros(len(data.start_ms), bool)
        rects, comm = data.hover_frame(none), data.comm_frame(none)
        wait_rects = data.wait_frame((0.0, -1.0))
        arrows = data.arrow_frame((0.0, -1.0))
    else:
        raster = hv.RGB(np.zeros((1, 1, 4), np.uint8), bounds=(extent[0], -0.5, extent[1], top), kdims=["time_ms", "lane"],
                        vdims=list("RGBA"))  # fmt: skip
        if drawn_whole(data, max_glyphs):  # the run fits in the glyph budget: its glyphs are built once and sent whole, a zoom rebuilds none
            rects, comm, wait_rects, arrows = data.whole_glyphs(with_waits)
        else:
            mask = data.visible(x_range)
            rects = data.hover_frame(mask & (data.kind_code != KINDS.index("comm")))
            comm = data.comm_frame(mask)
            wait_rects = data.wait_frame(x_range) if with_waits else data.wait_frame((0.0, -1.0))
            arrows = data.arrow_frame(x_range) if with_waits else data.arrow_frame((0.0, -1.0))
    raster = raster.opts(default_tools=[])
    kvd = [c for c in rects.columns if c not in ("start_ms", "lane_lo", "end_ms", "lane_hi")]
    krects = hv.Rectangles(rects, kdims=_RECT_KDIMS, vdims=kvd).opts(
        **_coloured(rects, "kind", KIND_COLORS, KIND_COLORS["other"]), line_alpha=0, tools=["hover"],
        hover_tooltips=_KERNEL_HOVER, default_tools=[])  # fmt: skip
    cvd = [c for c in comm.columns if c not in ("start_ms", "lane_lo", "end_ms", "lane_hi")]
    crects = hv.Rectangles(comm, kdims=_RECT_KDIMS, vdims=cvd).opts(
        color=KIND_COLORS["comm"], **_coloured(
            comm, "cause_key", {"sm_resources": CAUSE_COLORS["sm_resources"], "dependency": CAUSE_COLORS["dependency"]}, KIND_COLORS["comm"],
            style="line_color"),
        line_width=2, tools=["hover"], hover_tooltips=_COMM_HOVER, default_tools=[])  # fmt: skip
    wvd = ["part", "label", "wait"]
    wrects = hv.Rectangles(wait_rects, kdims=_RECT_KDIMS, vdims=wvd).opts(
        **_coloured(wait_rects, "part", CAUSE_COLORS, CAUSE_COLORS["unknown"]), line_alpha=0, tools=["hover"],
        hover_tooltips=_WAIT_HOVER, default_tools=[])  # fmt: skip
    segs = hv.Segments(arrows, kdims=["x0", "y0", "x1", "y1"], vdims=["what"]).opts(alpha=0, hooks=[_arrows_hook], default_tools=[])
    bands = step_bands(data, steps)
    xlim = {} if x_range is None else {"xlim": tuple(x_range)}
    height = lane_height(data.n_lanes) * data.n_lanes + 150
    kinds = tuple(k for i, k in enumerate(KINDS) if data.kinds_present[i])
    parts = tuple(p for i, p in enumerate(PARTS) if with_waits and data.parts_present[i])
    return (bands * raster * krects * wrects * crects * segs * _legend(kinds, parts)).opts(
        hv.opts.Overlay(
            title=figures.hv_title(title), height=height, yticks=list(enumerate(data.lane_labels)),
            **({"responsive": True} if responsive else {"width": width}),
            padding=0, legend_position="top", legend_cols=6,
            legend_opts={"background_fill_alpha": 0.0, "padding": 2, "margin": 0, "label_height": 12, "glyph_height": 12,
                         "label_text_font_size": "9pt", "spacing": 2},
            xlabel="Time since the first GPU activity (ms)", ylabel="", show_grid=False, invert_yaxis=True,
            active_tools=["xwheel_zoom", "xpan"], fontsize={"title": "11pt"}, hooks=[_quick_ranges, _follow_height], xformatter=xformatter,
            **xlim,
        )
    )  # fmt: skip


def _coloured(frame: pd.DataFrame, column: str, colours: dict, default: str, *, style: str = "color") -> dict:
    """Style options that colour a layer by its category ``column`` through a colour map (``default`` for a value
    ``colours`` lacks), as ``_legend`` does: the glyph reads one mapped column of category names in every frame, of one
    category or none. Colours computed here (``dim.categorize``) came as a plain colour when all alike (HoloViews
    collapses such a column), and such a frame reached the browser as rows without the column before the glyph's new
    colour: "nonexistent field 'color'" (a rank whose waits had one cause). An empty layer's colours were mapped with
    the layout's ranges, in Compare the other panel's strings ("unsupported operand type(s) for -=: 'str' and 'float'");
    a colour map's factors are its keys. As text: an empty frame's column is float."""
    values = pd.unique(frame[column].astype(str)) if len(frame) else []
    return {style: hv.dim(column).astype(str), "cmap": {**dict.fromkeys(values, default), **colours}, "show_legend": False}


def drawn_whole(data: TimelineData, max_glyphs: int) -> bool:
    """Whether every window of the run is drawn from the same glyphs (the whole run fits the glyph budget, kernels and
    arrows): a zoom then changes only what ``view_labels`` says, never a layer."""
    return data.n_visible(None) <= max_glyphs and (data.why is None or len(data.why) <= MAX_ARROWS)


def view_labels(data: TimelineData, x_range: tuple[float, float] | None, *, title: str, max_glyphs: int = MAX_GLYPHS,
                n: int | None = None) -> tuple[str, str]:
    """(the frame's title, its time axis' printf format) for the window ``x_range`` (ms; None: the whole run): the title
    says how many GPU activities (kernels, copies, memsets) are in view and whether they are rasterized; the axis has the
    decimals its ticks need (a
    tenth of the window: 0.1 ms from a 1 ms window up, 1 µs for a 0.01-0.1 ms one, 0.1 µs at most)."""
    n = data.n_visible(x_range) if n is None else n
    kernels = "GPU activity" if n == 1 else "GPU activities"  # copies and memsets too (analyze's n_kernels has fewer)
    if n > max_glyphs:
        mode = f"{n:,} {kernels} in view, rasterized: zoom in for single kernels, their waits and arrows"
    else:
        mode = f"{n:,} {kernels} in view"
    full = f"{title} — {mode}" if "\n" not in title else title.replace("\n", f" — {mode}\n", 1)
    return full, f"%.{_decimals(data.x_extent if x_range is None else x_range)}f"


# the lane axis under its own names: two timelines in one layout share time, never lanes
_OWN_LANES = {"y0": "band_y0", "y1": "band_y1", "lane": "lane_{}", "lane_lo": "lane_lo_{}", "lane_hi": "lane_hi_{}", "y": "legend_y_{}"}


def own_lanes(overlay: hv.Overlay, tag: str) -> hv.Overlay:
    """``overlay`` with its lane (y) dimensions renamed for ``tag``: in a layout with another timeline only time is shared."""
    return overlay.redim(**{k: v.format(tag) if "{}" in v else f"{v}_{tag}" for k, v in _OWN_LANES.items()})


def _decimals(extent) -> int:
    """Decimals of ms that tell a window's ticks apart (about ten to a window: "8.5", not "8.500"), 1 to 4."""
    span = float(extent[1] - extent[0])
    if not span > 0:
        return 3
    return int(min(4, max(1, np.ceil(-np.log10(span / 10)))))


def timeline(kernels, *, x_range=None, residency=None, why=None, waits=None, steps=None, dynamic=False,
             max_glyphs: int = MAX_GLYPHS, width: int = 1100, title: str = "Timeline"):  # fmt: skip
    """Kernels per rank and stream, coloured by kind, with step bands and each collective's wait by cause.

    Parameters
    ----------
    kernels
        ``kernels`` rows of one run, or a ``TimelineData``.
    x_range
        (start, end) in ms since the first kernel; the whole run when None.
    residency, why, waits, steps
        Optional ``kernel_residency``, ``explain`` (+ ``budget.blocker_positions``),
        ``budget.wait_segments`` and ``steps`` frames (see ``TimelineData``).
    dynamic
        When True return a ``hv.DynamicMap`` that re-renders on zoom/pan; otherwise one overlay.
    max_glyphs, width, title
        See ``timeline_view``.

    Returns
    -------
    hv.Overlay or hv.DynamicMap
    """
    data = kernels if isinstance(kernels, TimelineData) else TimelineData(kernels, residency=residency, why=why, waits=waits)
    opts = {"steps": steps, "max_glyphs": max_glyphs, "width": width, "title": title}
    if not dynamic:
        return timeline_view(data, x_range, **opts)
    stream = hv.streams.RangeX(x_range=x_range)
    return hv.DynamicMap(lambda x_range: timeline_view(data, x_range, **opts), streams=[stream])


def shared_extent(*data: TimelineData) -> tuple[float, float]:
    """The window (ms) that holds every one of these runs: the time axis they share, drawn whole. Each run drawn for
    its own extent would label the shared axis in its own format (a 3 ms run in µs above a 40 ms one in ms)."""
    return (min(float(d.x_extent[0]) for d in data), max(float(d.x_extent[1]) for d in data))


def compare(data_a: TimelineData, data_b: TimelineData, deltas: pd.DataFrame | None = None, *, x_range=None,
            labels: tuple[str, str] = ("A", "B"), width: int = 1100, max_glyphs: int = MAX_GLYPHS) -> hv.Layout:
    """Two configurations' timelines one above the other on linked time axes, and the metric deltas (a table).

    Parameters
    ----------
    data_a, data_b
        ``TimelineData`` (or kernels frames) of the two runs; each starts at 0 ms.
    deltas
        Optional ``overlapviz.analysis.speedup.compare`` rows (or ``metric_deltas``), shown below.
    x_range
        (start, end) in ms; both whole runs when None (``shared_extent``: one axis, one format).
    labels, width, max_glyphs
        Panel titles; see ``timeline_view``.
    """
    data_a = data_a if isinstance(data_a, TimelineData) else TimelineData(data_a)
    data_b = data_b if isinstance(data_b, TimelineData) else TimelineData(data_b)
    x_range = shared_extent(data_a, data_b) if x_range is None else x_range
    a = own_lanes(timeline_view(data_a, x_range, title=str(labels[0]), width=width, max_glyphs=max_glyphs), "a")
    b = own_lanes(timeline_view(data_b, x_range, title=str(labels[1]), width=width, max_glyphs=max_glyphs), "b")
    panels = [a, b]
    if deltas is not None and len(deltas):
        shown = figures.delta_display(deltas)
        panels.append(hv.Table(shown).opts(width=width, height=25 * len(shown) + 60, title="Metric deltas (B − A)"))
    return hv.Layout(panels).cols(1)
