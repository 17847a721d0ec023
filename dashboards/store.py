"""The DataStore: one object bound to one dataset, holding its tables, the analysis results and the filters.

Every table a page shows is computed once per dataset and server process (``memo``; the key
holds the dataset's stamp, so a re-ingested dataset is computed anew) and shared by all
sessions; the first DataStore of a dataset warms them in a background thread, so the first
visit of a page finds them ready. The store computes nothing itself: it calls the analysis
layer and keeps the results.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import threading
import time
from collections import OrderedDict
from pathlib import Path

import numpy as np
import pandas as pd
import param
import pyarrow as pa

from overlapviz.figures import charts as figures
from overlapviz.dataset import schema
from overlapviz.analysis import breakdown, budget, explain, findings, metrics, peers, residency, speedup
from overlapviz.dashboards.table_cache import TABLE_CACHE_ENV, disk_file as _disk_file, figure_stamp as _figure_stamp
from overlapviz.dashboards.table_cache import on_disk as _on_disk, private as _private, storable as _storable
from overlapviz.figures.timeline import RESIDENCY_PENDING, TIMELINE_COLUMNS, TimelineData


class Unavailable(ValueError):
    """An analysis cannot run on this dataset (it raised ValueError saying why); the page shows the reason."""


def _compare(path: str, run_a: str, run_b: str) -> pd.DataFrame:
    """``speedup.compare`` of two runs, given the configuration table the store keeps (not computed per pair)."""
    return speedup.compare(path, run_a, run_b, table=load_analysis(path, dataset_stamp(path), "config_table"), explain=_explain)


def _explain(path: str, **kwargs) -> pd.DataFrame:
    return explain.explain(path, **kwargs, device=DEVICE["name"])


def _residency(path: str, **kwargs) -> pd.DataFrame:
    return residency.kernel_residency(path, **kwargs, device=DEVICE["name"])


# the analyses the pages show, by the name their cache entries are kept under
ANALYSES = {
    "analyze": metrics.analyze,
    "config_table": speedup.config_table,
    "compare": _compare,
    "kernel_residency": _residency,
    "explain": _explain,
    "breakdown": breakdown.breakdown,
}
PAUSABLE = ("explain", "kernel_residency", "breakdown")  # analyses that call yield_to_pages between ranks
# `serve --scheduler`: a dashboards.dask_source.DaskSource computes the analyses it has and the timelines on its cluster
ENGINE: dict = {"dask": None}
# `serve --device-name`: the GPU the traces ran on, for ranks whose trace does not say (``residency.device_table``); part
# of every table's key (``dataset_stamp``): the tables of one dataset under two names are two sets
DEVICE: dict = {"name": None}


class Memo:
    """A bounded cache where each key is computed once, even when several threads (the warm-up and a
    session) ask for it at the same time: the later ones wait for the first. Exceptions are kept too."""

    def __init__(self, max_items: int):
        self.max_items = max_items
        self._values: OrderedDict = OrderedDict()
        self._locks: dict = {}
        self._lock = threading.Lock()

    def get(self, key, compute):
        with self._lock:
            if key in self._values:
                self._values.move_to_end(key)
                return self._unwrap(self._values[key])
            lock = self._locks.setdefault(key, threading.Lock())
        if not lock.acquire(blocking=False):
            # another thread computes it: that one must not pause for pages (yield_to_pages) while a session waits for it
            me = None if _is_background() else threading.get_ident()
            if me is not None:
                _WAITERS.add(me)
            try:
                lock.acquire()
            finally:
                _WAITERS.discard(me)
        try:
            with self._lock:
                if key in self._values:
                    return self._unwrap(self._values[key])
            try:
                value = ("ok", compute())
            except Unavailable as exc:
                value = ("err", exc)
            with self._lock:
                self._values[key] = value
                self._locks.pop(key, None)
                while len(self._values) > self.max_items:
                    self._values.popitem(last=False)
        finally:
            lock.release()
        return self._unwrap(value)

    @staticmethod
    def _unwrap(value):
        if value[0] == "err":
            raise value[1]
        return value[1]

    def has(self, key) -> bool:
        """Whether ``key``'s value is at hand (computed, not being computed)."""
        with self._lock:
            return key in self._values

    def clear(self) -> None:
        with self._lock:
            self._values.clear()


def _is_background() -> bool:
    return threading.current_thread().name.startswith("overlapviz-")


_WAITERS: set = set()  # threads waiting for a table another thread computes
_YIELDING: set = set()  # background threads past what the first pages wait for: they pause for pages (yield_to_pages)


_TABLES = Memo(256)  # small tables and analysis results, per (path, stamp, name, args)
_FIGURES = Memo(64)  # serialized static figures (common.static_plot): apart, so that figures never evict tables
_TIMELINES = Memo(10)  # TimelineData per (path, stamp, run, ranks[, kernels alone]): a 1M-kernel run is ~150 MB


def dataset_stamp(path: str) -> str:
    """Cache key part that changes when the dataset is rewritten (ingest replaces the directory)."""
    meta = Path(path) / schema.METADATA_FILE
    return f"{meta.stat().st_mtime_ns}" + (f" device={DEVICE['name']}" if DEVICE["name"] else "")


def load_runs(path: str, stamp: str) -> pd.DataFrame:
    return _TABLES.get((path, stamp, "runs"), lambda: schema.read_frame(path, "runs"))


def load_table(path: str, stamp: str, name: str) -> pd.DataFrame:
    return _TABLES.get((path, stamp, "table", name), lambda: schema.read_frame(path, name))


def load_analysis(path: str, stamp: str, name: str, *args, **kwargs) -> pd.DataFrame:
    """``ANALYSES[name](path, *args, **kwargs)``, once per dataset; Unavailable when it cannot run on it.

    Only ValueError (the analyses' "this dataset lacks what I need", with the reason) becomes
    Unavailable; any other exception is a bug and propagates to the server log and the page.
    """

    key = (path, stamp, "analysis", name, args, tuple(sorted(kwargs.items())))

    def compute():
        try:
            dask = ENGINE["dask"]
            if dask and name in dask.analyses:
                return dask.analyses[name](path, *args, **kwargs)  # (its explain and residency take DEVICE too)
            extra = {"pause": yield_to_pages} if name in PAUSABLE else {}
            return ANALYSES[name](path, *args, **kwargs, **extra)
        except ValueError as exc:
            return Unavailable(str(exc))  # kept on disk too: the reason is the dataset's, not this process's

    def value():
        out = _on_disk(path, stamp, repr(key[2:]), compute) if ANALYSES[name].__module__.startswith("overlapviz.") else compute()
        if isinstance(out, Unavailable):
            raise out
        return out

    return _TABLES.get(key, value)


def _at_hand(path: str, stamp: str, key: tuple, disk_name: str) -> bool:
    """Whether a table is computed already: in this process, or in the table cache on disk."""
    if _TABLES.has(key):
        return True
    file = _disk_file(path, stamp, disk_name)
    return file is not None and file.exists() and _private(file)


def _whole_at_hand(path: str, stamp: str, name: str) -> bool:
    """Whether the whole dataset's ``name`` (an analysis without arguments, or a derived table) is computed already."""
    if name in ANALYSES:
        key = (path, stamp, "analysis", name, (), ())
        return _at_hand(path, stamp, key, repr(key[2:]))
    return _at_hand(path, stamp, (path, stamp, "derived", name), f"derived:{name}")


def run_analysis(path: str, stamp: str, name: str, run_id: str) -> pd.DataFrame:
    """The rows of one run of ``name`` (an analysis taking ``run_ids``, or a table derived from explain): cut from the
    whole dataset's table when that is computed (or the dataset has one run), else computed for this run alone, once.

    A page shows one run: on a dataset of many runs its first visit never waits for every run's explain (3 s for the
    144 sample runs, 20 ms for one), which the warm-up computes meanwhile for the pages that show them all.
    """
    runs = load_runs(path, stamp)
    if len(runs) <= 1 or _whole_at_hand(path, stamp, name):
        t = load_analysis(path, stamp, name) if name in ANALYSES else _derived(path, stamp, name)
        return t.loc[t["run_id"] == run_id] if len(t) else t
    if name in ANALYSES:
        return load_analysis(path, stamp, name, run_ids=(run_id,))
    return _derived(path, stamp, name, run_id)


def _derived(path: str, stamp: str, name: str, run_id: str | None = None):
    """Tables derived from explain's records by the analysis layer, once per dataset (or per run)."""

    def compute():
        explained = load_analysis(path, stamp, "explain") if run_id is None else run_analysis(path, stamp, "explain", run_id)
        if name == "summary":
            return explain.summarize(explained)
        if name == "blockers":
            return budget.blocker_table(explained)
        if name == "instances":
            sizes = budget.message_bytes(explained, load_runs(path, stamp))
            return peers.collective_instances(explained, sizes)
        if name == "cells":
            return budget.instance_ranks(explained, _derived(path, stamp, "instances", run_id))
        if name == "delays":
            return budget.start_delay_table(explained)
        raise KeyError(name)

    if run_id is None:
        return _TABLES.get((path, stamp, "derived", name), lambda: _on_disk(path, stamp, f"derived:{name}", compute))
    return _TABLES.get((path, stamp, "derived", name, run_id), lambda: _on_disk(path, stamp, f"derived:{name}:{run_id}", compute))


def load_findings(path: str, stamp: str, run_id: str) -> dict:
    """The run's findings (``findings.findings`` over the run's explain records) and its breakdown summed over ranks
    (``breakdown.run_totals``: the headline), once per run: ``{"findings": frame, "totals": frame}``."""

    def compute():
        try:
            explained = run_analysis(path, stamp, "explain", run_id)
            tls = list(breakdown.rank_timelines(path, run_ids=[run_id], pause=yield_to_pages))
            found = findings.findings(path, run_ids=[run_id], device=DEVICE["name"], explained=explained, timelines=tls)
            return {"findings": found, "totals": breakdown.run_totals(tls)}
        except ValueError as exc:  # Unavailable included: the reason is the dataset's
            return Unavailable(str(exc))

    def value():
        out = _on_disk(path, stamp, f"findings:{run_id}", compute)
        if isinstance(out, Unavailable):
            raise out
        return out

    return _TABLES.get((path, stamp, "findings", run_id), value)


def answer_ready(path: str, stamp: str, run_id: str) -> bool:
    """Whether the run's answer (``load_findings`` and its ``breakdown``) is at hand: computed in this process or in the
    table cache, or kept as the reason it cannot be computed. The Overview draws at once and adds the answer when it comes."""
    key = (path, stamp, "findings", run_id)
    return _at_hand(path, stamp, key, f"findings:{run_id}") and _run_at_hand(path, stamp, "breakdown", run_id)


def _read_kernels(path: str, run_id: str) -> pd.DataFrame:
    cols = TIMELINE_COLUMNS + ["launch_ns"]
    table = schema.read_kernels(path, columns=cols, run_ids=[run_id], dictionary=("run_id", "name", "kind"))
    return _frame_of(table)


def _frame_of(table: pa.Table) -> pd.DataFrame:
    """``table`` as pandas, integer columns without a null as NumPy arrays (no copy), the others nullable: building
    the nullable dtypes' masks cost 0.8 s per million kernels in a fresh server, the slowest part of a first Timeline."""
    cols = {}
    for name, col in zip(table.column_names, table.columns):
        if pa.types.is_integer(col.type) and col.null_count == 0:
            cols[name] = col.to_numpy()
        else:
            cols[name] = col.to_pandas(types_mapper=schema.nullable_dtype)
    return pd.DataFrame(cols, copy=False)


def _why_parts(path: str, stamp: str, run_id: str, kernels: pd.DataFrame) -> dict:
    """The run's residency (the hover's blocks per SM and limiter) and explain records with their waits (the why tracks).

    Explain first: the Why late and Collectives pages wait for it too, the residency only the Timeline's hover."""
    why = waits = None
    try:
        why = run_analysis(path, stamp, "explain", run_id)
        why = pd.concat([why, budget.blocker_positions(why, kernels)], axis=1)
        waits = budget.wait_segments(why)
    except Unavailable:
        pass
    try:
        res = residency.by_rank(run_analysis(path, stamp, "kernel_residency", run_id), path, DEVICE["name"])
    except Unavailable:  # the hover's residency is optional: a timeline without it beats no timeline
        res = None
    return {"residency": res, "why": why, "waits": waits}


def why_ready(path: str, stamp: str, run_id: str) -> bool:
    """Whether the run's timeline with its why (explain, waits, residency) is at hand, or only its joining to the kernels
    is left (the run's explain and residency are computed: 0.03 s for a sample run, 0.3 s for a 1M-kernel one, less
    than drawing the kernels alone and then a second frame with the why)."""
    if ENGINE["dask"] is not None or _TIMELINES.has((path, stamp, run_id, None)):
        return True
    return all(_run_at_hand(path, stamp, name, run_id) for name in ("explain", "kernel_residency"))


def _run_at_hand(path: str, stamp: str, name: str, run_id: str) -> bool:
    """Whether ``run_analysis(path, stamp, name, run_id)`` waits for no analysis (its table, whole or the run's, is computed)."""
    if _whole_at_hand(path, stamp, name):
        return True
    key = (path, stamp, "analysis", name, (), (("run_ids", (run_id,)),))
    return len(load_runs(path, stamp)) > 1 and _at_hand(path, stamp, key, repr(key[2:]))


def load_timeline(path: str, stamp: str, run_id: str, ranks: tuple[int, ...] | None, why: bool | None = True) -> TimelineData:
    """A run's TimelineData (kernels, residency and the why), read once; a rank selection is cut from the whole
    run (same time origin, so times do not move when ranks are chosen).

    ``why``: True waits for the run's explain (and residency); None gives the why when it is at hand, else the kernels
    alone (the Timeline draws at once and adds the why tracks when they come); False the kernels alone.
    """
    if ENGINE["dask"] is not None:  # the kernels stay on the cluster (dashboards/dask_source.py)
        return ENGINE["dask"].timeline(path, stamp, run_id, ranks)

    kernels = _TIMELINES.get((path, stamp, run_id, None, "kernels"),
                             lambda: TimelineData(_read_kernels(path, run_id), residency=RESIDENCY_PENDING))  # fmt: skip
    if why or (why is None and why_ready(path, stamp, run_id)):
        full = _TIMELINES.get((path, stamp, run_id, None),
                              lambda: kernels.with_why(**_why_parts(path, stamp, run_id, kernels.frame)))  # fmt: skip
    else:
        full = kernels
    if not ranks:
        return full

    def subset():
        keep = full.frame["rank"].isin(list(ranks)).to_numpy(bool)
        why = None if full.why_source is None else full.why_source.loc[full.why_source["rank"].isin(list(ranks))]
        waits = None if full.waits_source is None else full.waits_source.loc[full.waits_source["rank"].isin(list(ranks))]
        return TimelineData(full.frame.loc[keep], residency=full.residency, why=why, waits=waits, origin_ns=full.origin_ns)

    return _TIMELINES.get((path, stamp, run_id, tuple(ranks), full is kernels), subset)


_FILES = Memo(4)  # files a button downloads, per (path, stamp, kind, run): a 1M-kernel run's Perfetto trace is ~30 MB


def perfetto_trace(path: str, stamp: str, run_id: str) -> bytes:
    """The run's Perfetto trace (``overlapviz.export.perfetto.write_perfetto``, gzip'd JSON), written once per run and
    dataset state: kept in memory and in the table cache (keyed by the writer's code too), not rewritten per click."""
    import tempfile

    from overlapviz.export import perfetto

    code = Path(perfetto.__file__).stat()

    def build() -> bytes:
        with tempfile.TemporaryDirectory(prefix="ovz-perfetto-") as tmp:
            return perfetto.write_perfetto(path, run_id, Path(tmp) / "trace.json.gz", device=DEVICE["name"]).read_bytes()

    name = f"perfetto:{run_id}:{code.st_size}:{code.st_mtime_ns}"
    return _FILES.get((path, stamp, "perfetto", run_id), lambda: _on_disk(path, stamp, name, build))


_WARMED: set = set()
_WARM_LOCK = threading.Lock()
_BUSY = {"until": 0.0}  # a session is drawing a page until then: the warm-up waits (one interpreter, one GIL)
_STOP = threading.Event()  # the process is exiting: background threads start no new table
_BACKGROUND: list[threading.Thread] = []  # the background threads this module started, joined at exit


def background(target, name: str) -> threading.Thread:
    """Start ``target`` in a daemon thread that the process waits for at exit (``stop_background``)."""
    thread = threading.Thread(target=target, name=name, daemon=True)
    with _WARM_LOCK:
        _BACKGROUND[:] = [t for t in _BACKGROUND if t.is_alive()]
        _BACKGROUND.append(thread)
    thread.start()
    return thread


def stopping() -> bool:
    """Whether the process is exiting (a background loop stops at its next step)."""
    return _STOP.is_set()


@atexit.register
def stop_background(timeout: float | None = None) -> None:
    """Stop the background threads after their current table, and wait for them.

    A daemon thread left inside pyarrow when the interpreter exits deadlocks the exit: Arrow's thread pool,
    shut down by the C exit handlers, waits for a conversion whose Python thread no longer runs (the
    process hangs after its last line; seen in test runs and on a server's Ctrl-C). Run at exit, before those.
    """
    _STOP.set()
    with _WARM_LOCK:
        threads = list(_BACKGROUND)
    for thread in threads:
        if thread is not threading.current_thread():
            thread.join(timeout)


_DRAWING = [0]  # pages being drawn now (``drawing``)
_DRAWING_LOCK = threading.Lock()
# HoloViews draws one figure at a time: a page's (``drawing``) and one drawn in the background (``common.static_plot``)
# never together. Its renderer is not thread-safe: a heatmap drawn in the background while a session drew a page once
# failed inside HoloViews ("'str' object has no attribute 'update'" on the plot's title)
RENDER_LOCK = threading.RLock()


@contextlib.contextmanager
def drawing():
    """Around the drawing of a page: background tables wait (``yield_to_pages``, ``wait_idle``) until it is drawn, and
    a figure drawn in the background (``common.static_plot``) is finished first."""
    with _DRAWING_LOCK:
        _DRAWING[0] += 1
    try:
        with RENDER_LOCK:
            yield
    finally:
        with _DRAWING_LOCK:
            _DRAWING[0] -= 1
        busy()  # and while it is laid out and sent


def _page_busy() -> bool:
    return _DRAWING[0] > 0 or time.monotonic() < _BUSY["until"]


def _wait_while(condition, limit: float, poll: float) -> None:
    """Sleep in steps of ``poll`` while ``condition()`` holds, at most ``limit`` s, until the process stops."""
    deadline = time.monotonic() + limit
    while condition() and time.monotonic() < deadline and not _STOP.is_set():
        time.sleep(poll)


_SENT = threading.Event()  # a session's first page was built and is on its way (``page_sent``)


def page_sent() -> None:
    """Say that a session's first page is built and sent (its document's first tick): the warm-up's steps that wait for it
    begin."""
    _SENT.set()


def busy(seconds: float = 0.6) -> None:
    """Say that a session is drawing a page: the warm-up starts no new table for ``seconds``."""
    _BUSY["until"] = max(_BUSY["until"], time.monotonic() + seconds)


def yield_to_pages(limit: float = 5.0) -> None:
    """Called by a long analysis between ranks: on a background thread, wait (at most ``limit`` s) while a session draws
    a page, unless a session waits for a table being computed. One interpreter runs both: a warm-up computing a run's
    explain while the Timeline draws its first million kernels slowed that page by half again (GIL)."""
    if threading.get_ident() not in _YIELDING:
        return  # a page's own computation, or what the next pages wait for
    _wait_while(lambda: _page_busy() and not _WAITERS, limit, 0.02)


def wait_idle(limit: float = 10.0) -> None:
    """Wait (at most ``limit`` s) until no session has said it is drawing a page (``busy``)."""
    _wait_idle(limit)


def _wait_idle(limit: float = 10.0) -> None:
    _wait_while(_page_busy, limit, 0.05)  # limited: never starve the warm-up (a table asked for later is computed then)


def warm(path: str, stamp: str, run_id: str | None, pair: tuple[str, str] | None = None) -> threading.Thread | None:
    """Compute every table the pages show, and the first run's timeline, in a background thread (once per dataset)."""
    with _WARM_LOCK:
        if (path, stamp) in _WARMED:
            return None
        _WARMED.add((path, stamp))

    def work():
        runs = load_runs(path, stamp)
        configured = "setup" in runs and runs["setup"].notna().any()
        two = pair is not None and pair[0] != pair[1]
        # what the first pages a user opens need, first: the grid (when there is one), the default run's timeline and why
        # (that run alone when the dataset has several), the Compare pair; then every run's tables
        steps = [
            (lambda: load_analysis(path, stamp, "config_table")) if configured else None,
            # the first page's answer: the run's findings and breakdown
            ("now", lambda: load_findings(path, stamp, run_id)) if run_id else None,
            ("now", lambda: run_analysis(path, stamp, "breakdown", run_id)) if run_id else None,
            # its kernels (the Timeline a user opens next draws them), then its why (the next pages wait for it): not paused
            # for pages, but begun once a session's first page is built and sent ("next": ``page_sent``). Begun at once,
            # they took the GIL from that page: a restarted server's first Overview of the 1M-kernel set spent half its
            # 3 s waiting for it (py-spy). Begun once the page was sent and drawn (``busy``), they came too late for the
            # Timeline opened next (1.9 -> 3.2 s cold, bench_dashboard --against, 2026-12-07)
            ("next", lambda: load_timeline(path, stamp, run_id, None, why=False)) if run_id else None,
            ("next", lambda: load_timeline(path, stamp, run_id, None)) if run_id else None,
            "nice",
            *[(lambda n=n: run_analysis(path, stamp, n, run_id)) if run_id else None for n in ("summary", "blockers", "cells")],
            (lambda: load_timeline(path, stamp, pair[1], None)) if two else None,
            (lambda: load_analysis(path, stamp, "compare", *pair)) if two else None,
            *[(lambda r=r: load_findings(path, stamp, r)) if two else None for r in pair or ()],
            *[(lambda r=r: run_analysis(path, stamp, "breakdown", r)) if two else None for r in pair or ()],
            lambda: load_analysis(path, stamp, "explain"),
            lambda: load_analysis(path, stamp, "kernel_residency"),
            lambda: _derived(path, stamp, "summary"),
            lambda: _derived(path, stamp, "blockers"),
            lambda: _derived(path, stamp, "cells"),
            lambda: load_analysis(path, stamp, "analyze", per="rank"),
            lambda: _derived(path, stamp, "delays"),
            None if configured else (lambda: load_analysis(path, stamp, "config_table")),
        ]
        for i, step in enumerate(steps):
            if step == "nice":
                # what a page waits for came first at the server's priority (a page waiting on a niced thread waits
                # longer on a busy machine); the rest yields the CPU (nice) and the GIL (yield_to_pages) to the sessions
                _YIELDING.add(threading.get_ident())
                try:
                    os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)
                except (AttributeError, OSError):
                    pass
                continue
            if step is None:
                continue
            now = step[0] if isinstance(step, tuple) else None
            step = step[1] if now else step
            if i and not now:
                _wait_idle()
            elif now == "now":  # not while a page's server side is drawn (the browser's part is not waited for)
                _wait_while(lambda: _DRAWING[0] > 0, 3.0, 0.02)
            elif now == "next":  # nor before a session's first page is sent, for a few seconds at most
                _wait_while(lambda: not _SENT.is_set() or _DRAWING[0] > 0, 4.0, 0.02)
            if _STOP.is_set():
                return
            try:
                step()
            except Exception:  # noqa: BLE001  (a page asking later reports it; the warm-up goes on with the next table)
                continue

    def run():
        try:
            work()
        finally:
            _YIELDING.discard(threading.get_ident())  # a later thread may get the same id

    return background(run, "overlapviz-warm")


def _true(value) -> bool:
    return value is not None and not pd.isna(value) and bool(value)


# a run's configuration as the pages say it (the runs table's columns, in this order)
_CONFIG_LABELS = {"workload": "workload", "setup": "setup", "compute_impl": "compute", "smem_pad_bytes": "smem padding",
                  "comm_priority": "comm priority", "comm_priority_effective": "effective priority", "collective": "collective",
                  "message_bytes": "message", "world_size": "world size", "n_ranks": "ranks", "backend": "backend",
                  "device_name": "device"}  # fmt: skip


class DataStore(param.Parameterized):
    """Data and filters shared by every page of one dashboard session.

    Parameters
    ----------
    path
        The dataset directory.
    warm_up
        Start computing the pages' tables in the background (once per dataset and process).
    """

    run_id = param.Selector(default=None, objects=[], doc="The configuration shown on Timeline, Why, Collectives and Residency")
    run_a = param.Selector(default=None, objects=[], doc="The first configuration on Compare")
    run_b = param.Selector(default=None, objects=[], doc="The second configuration on Compare")
    ranks = param.ListSelector(default=[], objects=[], doc="Ranks shown on the timeline (empty: all)")
    focus = param.Dict(default=None, allow_None=True, doc="A kernel to show on the Timeline: run_id, rank, stream, start_ns")

    def __init__(self, path: str | Path, *, warm_up: bool = True, **params):
        super().__init__(**params)
        busy(2.0)  # a session begins: its first page comes before the background tables
        self.path = str(Path(path).resolve())
        schema.read_metadata(self.path)  # ValueError naming the path when it is not a dataset
        self.stamp = dataset_stamp(self.path)
        self.runs = load_runs(self.path, self.stamp)
        labels = self.run_labels()
        self.param.run_id.objects = labels
        self.param.run_a.objects = labels
        self.param.run_b.objects = labels
        ids = list(labels.values())
        ok = self.runs.loc[self.runs["status"].fillna("ok") != "failed", "run_id"].tolist() or ids
        if ids:
            self.run_id = self.run_a = ok[0]
            self.run_b = ok[1] if len(ok) > 1 else ok[0]
        self._update_ranks()
        self.warm_up = warm_up
        if warm_up:
            warm(self.path, self.stamp, self.run_id, (self.run_a, self.run_b))

    @property
    def n_runs(self) -> int:
        return len(self.runs)

    def run_labels(self) -> dict[str, str]:
        """Selector labels ``{label: run_id}``: the configuration in words, the stand-in marked."""
        out = {}
        for row in self.runs.itertuples(index=False):
            parts = [str(row.run_id)]
            if pd.notna(row.setup) and str(row.workload) not in str(row.run_id):
                parts.append(f"{row.workload} · {row.setup}")
            if _true(row.stand_in):
                parts.append("stand-in")
            if row.status == "failed":
                parts.append("FAILED")
            out[" — ".join(parts)] = row.run_id
        return out

    @param.depends("run_id", watch=True)
    def _update_ranks(self) -> None:
        ranks = load_table(self.path, self.stamp, "ranks")
        mine = sorted(int(r) for r in ranks.loc[ranks["run_id"] == self.run_id, "rank"].dropna().unique())
        self.param.ranks.objects = mine
        self.ranks = []

    def run_row(self, run_id: str | None = None) -> dict:
        run_id = self.run_id if run_id is None else run_id
        rows = self.runs.loc[self.runs["run_id"] == run_id]
        return {} if rows.empty else {k: (None if pd.isna(v) else v) for k, v in rows.iloc[0].items()}

    def is_stand_in(self, run_id: str | None = None) -> bool:
        return _true(self.run_row(run_id).get("stand_in"))

    @property
    def any_stand_in(self) -> bool:
        return bool(self.runs["stand_in"].fillna(False).astype(bool).any())

    def timeline(self, run_id: str | None = None, ranks=None, why: bool | None = True) -> TimelineData:
        """The run's TimelineData (``why`` as for ``load_timeline``: None does not wait for the run's explain)."""
        run_id = self.run_id if run_id is None else run_id
        ranks = self.ranks if ranks is None else ranks
        return load_timeline(self.path, self.stamp, run_id, tuple(sorted(int(r) for r in ranks)) or None, why=why)

    def why_ready(self, run_id: str | None = None) -> bool:
        """Whether the run's timeline with its why is at hand (``timeline(why=None)`` has it)."""
        return why_ready(self.path, self.stamp, self.run_id if run_id is None else run_id)

    def answer_ready(self, run_id: str | None = None) -> bool:
        """Whether the run's findings, headline and breakdown are at hand (``findings`` etc. wait for none)."""
        return answer_ready(self.path, self.stamp, self.run_id if run_id is None else run_id)

    def steps(self, run_id: str | None = None) -> pd.DataFrame:
        steps = load_table(self.path, self.stamp, "steps")
        return steps.loc[steps["run_id"] == (self.run_id if run_id is None else run_id)]

    def device_limits(self) -> dict:
        """``residency.device_table`` of the dataset: each (run, rank, device)'s limits, or why there are none."""
        return _TABLES.get((self.path, self.stamp, "device limits"), lambda: residency.device_table(self.path, DEVICE["name"]))

    def devices(self, run_id: str | None = None) -> pd.DataFrame:
        dev = load_table(self.path, self.stamp, "devices")
        return dev.loc[dev["run_id"] == (self.run_id if run_id is None else run_id)]

    # analyses; each raises Unavailable with a reason when it cannot be shown on this dataset

    def metrics(self, per: str = "rank") -> pd.DataFrame:
        return load_analysis(self.path, self.stamp, "analyze", per=per)

    def config_table(self) -> pd.DataFrame:
        return load_analysis(self.path, self.stamp, "config_table")

    def compare(self, run_a: str, run_b: str) -> pd.DataFrame:
        return load_analysis(self.path, self.stamp, "compare", run_a, run_b)

    def kernel_residency(self) -> pd.DataFrame:
        return load_analysis(self.path, self.stamp, "kernel_residency")

    def explained(self, run_id: str | None = None) -> pd.DataFrame:
        """explain's records (one per comm kernel) of the run (all runs when ``run_id`` is "*")."""
        run_id = self.run_id if run_id is None else run_id
        if run_id == "*":
            return load_analysis(self.path, self.stamp, "explain")
        return run_analysis(self.path, self.stamp, "explain", run_id)

    def run_residency(self, run_id: str | None = None) -> pd.DataFrame:
        """``kernel_residency`` rows of the run."""
        return run_analysis(self.path, self.stamp, "kernel_residency", self.run_id if run_id is None else run_id)

    def _of_run(self, name: str, run_id: str | None) -> pd.DataFrame:
        return run_analysis(self.path, self.stamp, name, self.run_id if run_id is None else run_id)

    def breakdown(self, run_id: str | None = None) -> pd.DataFrame:
        """``breakdown.breakdown`` rows of the run (per rank: overlapped, exposed and its four parts, int64 ns)."""
        return self._of_run("breakdown", run_id)

    def findings(self, run_id: str | None = None) -> pd.DataFrame:
        """``findings.findings`` rows of the run, largest time first."""
        return load_findings(self.path, self.stamp, self.run_id if run_id is None else run_id)["findings"]

    def headline(self, run_id: str | None = None) -> str:
        """The run's breakdown in one sentence (``findings.headline``), or "" where the run has no rank with kernels."""
        totals = load_findings(self.path, self.stamp, self.run_id if run_id is None else run_id)["totals"]
        return findings.headline(totals.iloc[0]) if len(totals) else ""

    def summary(self, run_id: str | None = None) -> pd.DataFrame:
        """``explain.summarize`` rows of the run (per rank: time by cause, peer wait, top blockers)."""
        return self._of_run("summary", run_id)

    def blockers(self, run_id: str | None = None) -> pd.DataFrame:
        return self._of_run("blockers", run_id)

    def instances(self, run_id: str | None = None) -> pd.DataFrame:
        return self._of_run("instances", run_id)

    def instance_cells(self, run_id: str | None = None) -> pd.DataFrame:
        return self._of_run("cells", run_id)

    def start_delays(self, run_id: str | None = None) -> pd.DataFrame:
        """``budget.start_delay_table`` rows of the run: the start delay under each name it is reported by."""
        return self._of_run("delays", run_id)

    def perfetto_trace(self, run_id: str | None = None) -> bytes:
        """The run's Perfetto trace (gzip'd JSON), once per run and dataset state."""
        return perfetto_trace(self.path, self.stamp, self.run_id if run_id is None else run_id)

    def memo(self, key, build):
        """``build()`` once per dataset and server process for ``key`` (shared by every session)."""
        return _TABLES.get((self.path, self.stamp, "memo", key), build)

    def figure(self, key, build):
        """``build()`` (a serialized figure: ``Serializer().serialize(model)``) once per dataset for ``key``, in a cache
        of its own, and kept in the table cache between server processes (with the stamp of the code that draws it)."""
        name = repr(("figure", _figure_stamp(), key))
        return _FIGURES.get((self.path, self.stamp, key), lambda: _on_disk(self.path, self.stamp, name, lambda: _storable(build())))

    def budget(self, record: dict, what_if: dict | None = None):
        """``budget.kernel_budget`` of one explain record (the run's kernels from the timeline cache)."""
        key = (self.path, self.stamp, "budget", record["run_id"], int(record["rank"]), int(record["start_ns"]), json.dumps(what_if, default=str))

        def compute():
            try:
                return budget.kernel_budget(self.path, record, kernels=self._rank_kernels(record), what_if=what_if,
                                            device=DEVICE["name"])  # fmt: skip
            except ValueError as exc:
                raise Unavailable(str(exc)) from None

        return _TABLES.get(key, compute)

    def what_if(self, record: dict) -> pd.DataFrame:
        """``budget.what_if_options`` of one explain record, once per dataset, in the table cache too (0.14 s on 1M kernels)."""
        key = (self.path, self.stamp, "what_if", record["run_id"], int(record["rank"]), int(record["start_ns"]))

        def compute():
            return budget.what_if_options(self.path, record, kernels=self._rank_kernels(record), device=DEVICE["name"])

        return _TABLES.get(key, lambda: _on_disk(self.path, self.stamp, repr(key[2:]), compute))

    def _rank_kernels(self, record: dict) -> pd.DataFrame | None:
        """The record's rank's kernels around its ready time, from the cached timeline when it is loaded."""
        try:
            data = self.timeline(record["run_id"], ranks=[], why=None)  # its kernels: the run's why is not waited for
        except Exception:  # noqa: BLE001  (fall back to reading the dataset)
            return None
        t = record.get("ready_ns")
        t = int(record["start_ns"]) if t is None or pd.isna(t) else int(t)
        if hasattr(data, "rank_kernels"):  # kernels on a Dask cluster (dashboards/dask_source.py): read there
            k = data.rank_kernels(int(record["rank"]), t, int(record["start_ns"]))
            return k.astype({"name": str, "kind": str, "run_id": str})
        frame = data.frame
        k = frame.loc[(frame["rank"] == int(record["rank"]))]
        return k.loc[((k["start_ns"] <= t) & (k["end_ns"] > t)) | (k["start_ns"] == int(record["start_ns"]))].astype(
            {"name": str, "kind": str, "run_id": str})

    def configuration_text(self, run_id: str | None = None) -> str:
        """The run's configuration as one line of Markdown."""
        row = self.run_row(run_id)
        if not row:
            return "no run selected"
        parts = []
        for k, label in _CONFIG_LABELS.items():
            v = row.get(k)
            if v is None or (k == "world_size" and v == row.get("n_ranks")):  # said once, as the ranks traced
                continue
            if k == "n_ranks":
                parts.append(f"{int(v):,} rank{'' if int(v) == 1 else 's'}")
                continue
            v = figures.fmt_bytes(v) if k.endswith("_bytes") else f"{int(v):,}" if isinstance(v, (int, np.integer)) else v
            parts.append(f"**{label}** {v}")
        if not _true(row.get("setup")):  # an imported trace: where it came from (file names; the paths are in `runs`)
            paths = [Path(p) for p in json.loads(row.get("source_paths") or "[]")]
            parents = {p.parent.name for p in paths}
            if len(paths) == 1:
                parts.append(f"imported from {paths[0].name}")
            elif paths:
                parts.append(f"imported from {len(paths):,} traces" + (f" in {parents.pop()}/" if len(parents) == 1 else ""))
        text = " · ".join(parts) or "no configuration recorded"
        if _true(row.get("stand_in")):
            text += f" · ⚠ **{figures.STAND_IN_NOTE}**"
        if row.get("status") == "failed":
            text += f" · ❌ run failed: {row.get('error')}"
        return text


__all__ = ["ANALYSES", "DataStore", "Unavailable", "load_analysis", "load_timeline", "warm"]
