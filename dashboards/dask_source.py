"""The dashboard on a Dask cluster (``overlapviz serve --scheduler ADDRESS``): its tables and its Timeline computed there.

``serving(address)`` connects (or starts a ``local``/``local:N`` cluster, stopped when the server
stops) and installs a ``DaskSource`` in ``store.ENGINE`` for the server's lifetime. Then:

* the analyses run on the cluster, with the local path's results (``overlapviz.distributed``): ``analyze``,
  ``explain``, ``kernel_residency`` (rank by rank), and the configuration table and Compare from those
  (``speedup.config_table``/``compare`` given the cluster's ``analyze``/``explain``): the server reads no
  kernel for them;
* a run's timeline is a ``DaskTimeline``: the server holds the run's lanes, step bands, explain's
  records and its residency table (one row per launch shape), never its kernels. Zoomed out, each
  worker rasterizes its ranks' kernels in the window (``view_counts_on``) and the server sums the
  counts; zoomed in (at most the glyph budget in view), the window's kernels are read from each
  rank's file with the window as a filter and drawn as glyphs, their hover's residency joined from
  that table as the local path joins it. Both follow ``figures_timeline.TimelineData``'s rules to
  the float: the counts, pixels, glyph rows and hover fields are the local path's
  (tests/test_dask.py compares them).

Not datashader's own Dask aggregation: its pixel rule for a span is not the local raster's, and the
two views of one dataset must agree; the reduction is the same (per partition, then summed).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import numpy as np
import pandas as pd

from overlapviz.figures import timeline as ftl
from overlapviz.figures.raster import coverage  # the timeline's raster rule
from overlapviz.analysis import budget, metrics, speedup
from overlapviz.dataset import schema
from overlapviz.analysis.residency import by_rank
from overlapviz.dashboards import store
from overlapviz.distributed import timeline as dtl

KINDS = tuple(ftl.KINDS)  # the timeline's kinds, in its raster's order
_GLYPH_COLUMNS = ftl.TIMELINE_COLUMNS + ["launch_ns"]  # what store._read_kernels reads
_DICTIONARY = ("run_id", "name", "kind")


class DaskSource:
    """A ``distributed.Client`` serving the dashboard's analyses and timelines (``store.ENGINE["dask"]``)."""

    def __init__(self, client):
        self.client = client
        self.analyses = {"analyze": self.analyze, "explain": self.explain, "kernel_residency": self.residency,
                         "config_table": self.config_table, "compare": self.compare}  # fmt: skip
        self._runs = store.Memo(8)  # _Run per (path, stamp, run_id): lanes, bands, the why; no kernels

    def analyze(self, dataset_path, *, per: str = "rank", run_ids=None) -> pd.DataFrame:
        from overlapviz.distributed import analyze_on

        return metrics.to_frame(analyze_on(self.client, dataset_path, per=per, run_ids=run_ids))

    # device: `serve --device-name`'s GPU unless given (store.DEVICE, as store._explain and store._residency): every
    # caller, the store's tables and compare's explain alike, gets the same answers
    def explain(self, dataset_path, *, run_ids=None, kinds=("comm",), device=None) -> pd.DataFrame:
        from overlapviz.distributed import explain_on

        device = store.DEVICE["name"] if device is None else device
        return explain_on(self.client, dataset_path, run_ids=run_ids, kinds=kinds, device=device)

    def residency(self, dataset_path, *, run_ids=None, device=None) -> pd.DataFrame:
        from overlapviz.distributed import residency_on

        device = store.DEVICE["name"] if device is None else device
        return residency_on(self.client, dataset_path, run_ids=run_ids, device=device)

    def config_table(self, dataset_path, **kwargs) -> pd.DataFrame:
        """``speedup.config_table`` with the overlap metrics from the cluster (the iterations table is read here)."""
        return speedup.config_table(dataset_path, analyze=self.analyze, **kwargs)

    def compare(self, dataset_path, run_a: str, run_b: str) -> pd.DataFrame:
        """``speedup.compare`` (as ``store._compare``) with the two runs' metrics and explain from the cluster."""
        table = store.load_analysis(dataset_path, store.dataset_stamp(dataset_path), "config_table")
        return speedup.compare(dataset_path, run_a, run_b, table=table, analyze=self.analyze, explain=self.explain)

    def timeline(self, path: str, stamp: str, run_id: str, ranks: tuple[int, ...] | None) -> DaskTimeline:
        """The run's timeline (of ``ranks``; all when None), as ``store.load_timeline`` gives it locally."""
        run = self._runs.get((path, stamp, run_id), lambda: _Run(self.client, path, stamp, run_id))
        return DaskTimeline(run, run.selection(ranks))


@contextlib.contextmanager
def serving(address: str) -> Iterator[DaskSource]:
    """Install a ``DaskSource`` on ``address`` for the dashboards of this process; on exit remove it, close the
    client and stop a cluster it started (``local``, ``local:N``)."""
    from overlapviz.distributed import client_for

    if store.ENGINE.get("dask") is not None:
        raise ValueError("a Dask scheduler is already serving this process's dashboards")
    with client_for(address) as client:
        source = DaskSource(client)
        store.ENGINE["dask"] = source
        try:
            yield source
        finally:
            store.ENGINE["dask"] = None


class _Run:
    """What the server keeps of one run: each rank's lanes, extent, kinds and step extents (from the cluster), the
    run's explain records with their blockers' positions, and its residency table (for the hover: one row per launch
    shape, computed on the cluster)."""

    def __init__(self, client, path: str, stamp: str, run_id: str):
        self.client, self.path, self.stamp, self.run_id = client, path, stamp, run_id
        self.ranks = {r["rank"]: r for r in dtl.rank_summaries_on(client, path, run_id, KINDS)}
        self.origin_ns = min((r["start"] for r in self.ranks.values()), default=0)
        try:  # as store.load_timeline's: the run's rows
            self.residency = by_rank(store.run_analysis(path, stamp, "kernel_residency", run_id), path, store.DEVICE["name"])
        except store.Unavailable:
            self.residency = None
        self.why = None
        try:
            why = store.run_analysis(path, stamp, "explain", run_id)
            self.why = pd.concat([why, dtl.blocker_positions_on(client, path, run_id, why)], axis=1)
        except store.Unavailable:
            pass
        self._selections = store.Memo(16)

    def selection(self, ranks: tuple[int, ...] | None) -> _Selection:
        return self._selections.get(ranks, lambda: _Selection(self, ranks))


class _Selection:
    """The run's ranks on screen: lanes, kernels, extent, bands, waits (what TimelineData computes from its frame)."""

    def __init__(self, run: _Run, ranks: tuple[int, ...] | None):
        rows = [run.ranks[r] for r in sorted(run.ranks) if ranks is None or r in set(ranks)]
        self.ranks = None if ranks is None else list(ranks)
        self.n = sum(r["n"] for r in rows)
        pairs = [(r["rank"], s) for r in rows for s in r["streams"]]
        self.lanes = pd.DataFrame({"rank": np.array([p[0] for p in pairs], np.int64), "stream": np.array([p[1] for p in pairs], np.int64)})
        self.lanes = self.lanes.assign(lane=np.arange(len(pairs)))
        self.lane_of = {p: i for i, p in enumerate(pairs)}  # ranks in order, each one's streams sorted: lanes sorted
        self.start_ns = min((r["start"] for r in rows), default=None)
        self.end_ns = max((r["end"] for r in rows), default=None)
        self.kinds_present = np.sum([r["kinds"] for r in rows], axis=0) > 0 if rows else np.zeros(len(KINDS), bool)
        why = run.why
        if why is not None and ranks is not None:
            why = why.loc[why["rank"].isin(list(ranks))]
        self.why_source = why
        self.waits_source = None if why is None else budget.wait_segments(why)
        # the wait tracks as TimelineData keeps them: one empty frame with these lanes computes them once
        self.empty = _view(run, self, None, waits=self.waits_source)
        self.bands = self._bands(rows, run.origin_ns)

    def _bands(self, rows: list[dict], origin_ns: int) -> pd.DataFrame:
        """``figures_timeline._band_table`` from each rank's step extents."""
        cols = ["x0", "y0", "x1", "y1", "step_name", "shade"]
        parts = [(r["rank"], r) for r in rows if len(r["steps"])]
        if not parts:
            return pd.DataFrame({c: [] for c in cols})
        ext = pd.DataFrame({
            "rank": np.concatenate([np.full(len(r["steps"]["step"]), k, np.int64) for k, r in parts]),
            "step": np.concatenate([r["steps"]["step"] for _, r in parts]).astype(np.int64),
            "x0": np.concatenate([ftl.ms_from(r["steps"]["lo"], origin_ns) for _, r in parts]),
            "x1": np.concatenate([ftl.ms_from(r["steps"]["hi"], origin_ns) for _, r in parts]),
        }).sort_values(["rank", "step"], kind="stable").reset_index(drop=True)  # fmt: skip
        lanes = pd.DataFrame({"rank": np.array([k for k, _ in parts], np.int64),
                              "y0": [min(self.lane_of[(k, s)] for s in r["step_streams"]) for k, r in parts],
                              "y1": [max(self.lane_of[(k, s)] for s in r["step_streams"]) for k, r in parts]})  # fmt: skip
        ext = ext.merge(lanes, on="rank")
        return ext.assign(y0=ext["y0"] - 0.48, y1=ext["y1"] + 0.48, step_name=ext["step"].map("step {}".format),
                          shade=(ext["step"] % 2).astype(str))[cols]  # fmt: skip


def _view(run: _Run, sel: _Selection, kernels: pd.DataFrame, waits=None) -> ftl.TimelineData:
    """A TimelineData of some of the selection's kernels, on the selection's lanes and the run's time origin, with
    the selection's why and wait tracks: its glyph frames are the whole selection's restricted to these kernels."""
    if kernels is None:  # no kernels, the columns and types of a read
        kernels = _to_pandas(dtl.glyph_rows_on(None, run.path, run.run_id, [], _GLYPH_COLUMNS, _DICTIONARY, None))
    view = ftl.TimelineData(kernels, residency=run.residency, origin_ns=run.origin_ns)
    view.lanes, view.n_lanes = sel.lanes, len(sel.lanes)
    view.lane_labels = [f"rank {r} · stream {s}" for r, s in zip(sel.lanes["rank"], sel.lanes["stream"])]
    if len(kernels):
        pairs, inverse = np.unique(np.stack([ftl.int64_filled(kernels["rank"]), ftl.int64_filled(kernels["stream"])], axis=1), axis=0,
                                   return_inverse=True)  # fmt: skip
        view.lane = np.array([sel.lane_of[(int(r), int(s))] for r, s in pairs], np.int64)[inverse.ravel()]
    view.why_source, view.waits_source = sel.why_source, sel.waits_source
    view.why = view._join_why(_near(sel.why_source, kernels))
    view.waits = view._waits(waits) if waits is not None else sel.empty.waits
    view.parts_present = (np.bincount(view.waits["part"], minlength=len(ftl.PARTS)) > 0) if view.waits is not None else \
        np.zeros(len(ftl.PARTS), bool)  # fmt: skip
    return view


def _to_pandas(rows) -> pd.DataFrame:
    return rows.to_pandas(types_mapper=schema.nullable_dtype)  # as store._read_kernels


def _near(why: pd.DataFrame | None, kernels: pd.DataFrame) -> pd.DataFrame | None:
    """The records of ``why`` that can join ``kernels`` (their start within the kernels' first and last start)."""
    if why is None or not len(kernels):
        return why
    start = kernels["start_ns"].to_numpy(np.int64)
    s = why["start_ns"].to_numpy(np.int64)
    return why.loc[(s >= start.min()) & (s <= start.max())]


class DaskTimeline:
    """A run's timeline whose kernels stay on the cluster: what ``figures_timeline.timeline_view`` draws from.

    Zoomed out (``raster``) the counts come from the workers; ``visible`` reads the window's kernels (and the
    collectives an arrow can point into, one window ahead) into a ``TimelineData`` on the selection's lanes, which
    the glyph frames come from. One per drawing (``DaskSource.timeline``): the window read is its own.
    """

    def __init__(self, run: _Run, sel: _Selection):
        self.run, self.sel = run, sel
        self.origin_ns = run.origin_ns
        self.lanes, self.n_lanes = sel.lanes, len(sel.lanes)
        self.lane_labels = sel.empty.lane_labels
        self.kinds_present, self.parts_present = sel.kinds_present, sel.empty.parts_present
        self.waits, self.why_source, self.waits_source = sel.empty.waits, sel.why_source, sel.waits_source
        self.frame = pd.DataFrame(index=pd.RangeIndex(sel.n))  # its length only: the kernels stay on the cluster
        self.residency = run.residency
        self._view = sel.empty
        self._lock = threading.Lock()

    @property
    def x_extent(self) -> tuple[float, float]:
        if not self.sel.n:
            return (0.0, 1.0)
        lo = float(ftl.ms_from(np.array([self.sel.start_ns]), self.origin_ns)[0])
        if self.waits is not None and len(self.waits["start_ms"]):
            lo = min(lo, float(self.waits["start_ms"][0]))
        return (lo, float(ftl.ms_from(np.array([self.sel.end_ns]), self.origin_ns)[0]))

    def n_visible(self, x_range) -> int:
        if x_range is None:
            return self.sel.n
        n, _ = dtl.view_counts_on(self.run.client, self.run.path, self.run.run_id, self.sel.ranks, self.sel.lane_of, KINDS,
                                  self.origin_ns, tuple(x_range))  # fmt: skip
        return n

    def raster(self, x_range, width: int):
        """``TimelineData.raster``: the kernel counts summed from the workers, the wait tracks counted here."""
        import holoviews as hv

        x0, x1 = x_range
        if not x1 > x0:
            x1 = x0 + 1e-6
        height, width = max(self.n_lanes, 1), int(width)
        _, kern = dtl.view_counts_on(self.run.client, self.run.path, self.run.run_id, self.sel.ranks, self.sel.lane_of, KINDS,
                                     self.origin_ns, tuple(x_range), (x0, x1), width)  # fmt: skip
        if not self.n_lanes:
            kern = np.zeros((len(KINDS), 1, width), np.int64)
        img = np.zeros((height * ftl.ROWS_PER_LANE, width, 4), np.uint8)
        k_rgba = ftl.shade(kern, ftl.rgb([ftl.KIND_COLORS[k] for k in KINDS]))
        for r in range(1, 7):
            img[r :: ftl.ROWS_PER_LANE] = k_rgba
        if self.waits is not None:
            w = self.waits
            m = (w["end_ms"] >= x0) & (w["start_ms"] <= x1)
            waits = coverage(w["start_ms"][m], w["end_ms"][m], w["lane"][m], w["part"][m], len(ftl.PARTS), height, width, x0, x1)
            w_rgba = ftl.shade(waits, ftl.rgb([ftl.CAUSE_COLORS[p] for p in ftl.PARTS]))
            for r in (7, 8):
                img[r :: ftl.ROWS_PER_LANE] = w_rgba
        return hv.RGB(img[::-1], bounds=(x0, -0.5, x1, height - 0.5), kdims=["time_ms", "lane"], vdims=list("RGBA"))

    def counts(self, x_range, width: int) -> np.ndarray:
        """The kernel counts ``raster`` shades: int64 (kind, lane, pixel column)."""
        x0, x1 = x_range
        x1 = x1 if x1 > x0 else x0 + 1e-6
        return dtl.view_counts_on(self.run.client, self.run.path, self.run.run_id, self.sel.ranks, self.sel.lane_of, KINDS,
                                  self.origin_ns, tuple(x_range), (x0, x1), int(width))[1]  # fmt: skip

    def visible(self, x_range) -> np.ndarray:
        """Read the kernels ``x_range`` shows into this drawing's view; its mask of them (``TimelineData.visible``)."""
        with self._lock:
            if x_range is None:
                bounds = comm = None
            else:
                x0, x1 = float(x_range[0]), float(x_range[1])
                bounds = dtl.ns_bounds(self.origin_ns, x0, x1)
                comm = dtl.ns_bounds(self.origin_ns, x0, x1 + (x1 - x0))  # arrow_frame's reach
            rows = dtl.glyph_rows_on(self.run.client, self.run.path, self.run.run_id, self.sel.ranks, _GLYPH_COLUMNS,
                                     _DICTIONARY, bounds, comm)  # fmt: skip
            self._view = _view(self.run, self.sel, _to_pandas(rows))
            return self._view.visible(x_range)

    def whole_glyphs(self, waits: bool) -> tuple:
        """``TimelineData.whole_glyphs``: the whole run read into this drawing's view (``timeline_view`` asks only
        for a run that fits the glyph budget), its glyph frames built from it as the local path builds them."""
        self.visible(None)
        return self._view.whole_glyphs(waits)

    def rank_kernels(self, rank: int, t_ns: int, start_ns: int) -> pd.DataFrame:
        """The rank's kernels running at ``t_ns`` or starting at ``start_ns``, read on a worker (what
        ``DataStore._rank_kernels`` cuts from a local timeline's frame, in its row order and types)."""
        import pyarrow.compute as pc

        cut = ((pc.field("start_ns") <= int(t_ns)) & (pc.field("end_ns") > int(t_ns))) | (pc.field("start_ns") == int(start_ns))
        rows = dtl.rows_on(self.run.client, self.run.path, self.run.run_id, [int(rank)], _GLYPH_COLUMNS, _DICTIONARY, cut)
        return _to_pandas(rows)

    # the glyph frames and arrays of the kernels read by ``visible`` (none before it)
    @property
    def start_ms(self):
        return self._view.start_ms

    @property
    def end_ms(self):
        return self._view.end_ms

    @property
    def kind_code(self):
        return self._view.kind_code

    @property
    def lane(self):
        return self._view.lane

    @property
    def why(self):
        return self._view.why

    def hover_frame(self, mask):
        return self._view.hover_frame(mask)

    def comm_frame(self, mask):
        return self._view.comm_frame(mask)

    def wait_frame(self, x_range):
        return self._view.wait_frame(x_range)

    def arrow_frame(self, x_range, limit: int = ftl.MAX_ARROWS):
        return self._view.arrow_frame(x_range, limit)

    def bands(self) -> pd.DataFrame:
        return self.sel.bands

    def window_at(self, rank: int, start_ns: int, *, pad: float = 0.6) -> tuple[float, float] | None:
        """``TimelineData.window_of`` the kernel of ``rank`` starting at ``start_ns`` (None when there is none)."""
        if self.sel.ranks is not None and rank not in self.sel.ranks:
            return None
        rows = dtl.glyph_rows_on(self.run.client, self.run.path, self.run.run_id, [rank], _GLYPH_COLUMNS, _DICTIONARY,
                                 (start_ns, start_ns), None)  # fmt: skip
        kernels = _to_pandas(rows)
        view = _view(self.run, self.sel, kernels)
        hit = np.flatnonzero(kernels["start_ns"].to_numpy(np.int64) == int(start_ns))
        return view.window_of(int(hit[0]), pad=pad) if len(hit) else None


__all__ = ["DaskSource", "DaskTimeline", "serving"]
