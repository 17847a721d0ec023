"""The DataStore: one object bound to one dataset, holding its tables, the analysis results and the filters."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import panel as pn
import param
import pyarrow as pa
import pyarrow.compute as pc

from overlapviz import figures, schema
from overlapviz.analysis import explain, metrics, residency, speedup


class Unavailable(Exception):
    """An analysis cannot run on this dataset (it raised ValueError saying why); the page shows the reason."""


# the analyses the pages show, by the name their cache entries are kept under
ANALYSES = {
    "analyze": metrics.analyze,
    "config_table": speedup.config_table,
    "compare": speedup.compare,
    "kernel_residency": residency.kernel_residency,
    "comm_start_delays": explain.comm_start_delays,
}


_NULLABLE = {pa.int32(): pd.Int32Dtype(), pa.int64(): pd.Int64Dtype(), pa.bool_(): pd.BooleanDtype()}


def _stamp(path: str) -> str:
    """Cache key part that changes when the dataset is rewritten (ingest replaces the directory)."""
    meta = Path(path) / schema.METADATA_FILE
    return f"{meta.stat().st_mtime_ns}"


# loaders: pn.cache memoizes per (path, stamp, ...) across sessions of one server process


@pn.cache(max_items=4)
def load_runs(path: str, stamp: str) -> pd.DataFrame:
    return schema.read_frame(path, "runs")


@pn.cache(max_items=4)
def load_table(path: str, stamp: str, name: str) -> pd.DataFrame:
    return schema.read_frame(path, name)


@pn.cache(max_items=6)
def load_timeline(path: str, stamp: str, run_id: str, ranks: tuple[int, ...] | None) -> figures.TimelineData:
    filt = pc.field("rank").isin(list(ranks)) if ranks else None
    table = schema.read_kernels(path, columns=figures.TIMELINE_COLUMNS, run_ids=[run_id], filter=filt)
    table = table.set_column(table.schema.get_field_index("name"), "name", table.column("name").dictionary_encode())
    kernels = table.to_pandas(types_mapper=_NULLABLE.get)
    residency = None
    try:
        residency = load_analysis(path, stamp, "kernel_residency")
    except Unavailable:  # the hover's residency is optional: a timeline without it beats no timeline
        pass
    return figures.TimelineData(kernels, residency=residency)


@pn.cache(max_items=16)
def load_analysis(path: str, stamp: str, name: str, *args, **kwargs) -> pd.DataFrame:
    """``ANALYSES[name](path, *args, **kwargs)``; Unavailable when it cannot run on this dataset.

    Only ValueError (the analyses' "this dataset lacks what I need", with the reason) becomes
    Unavailable; any other exception is a bug and propagates to the server log and the page.
    """
    try:
        return ANALYSES[name](path, *args, **kwargs)
    except ValueError as exc:
        raise Unavailable(str(exc)) from None


def _true(value) -> bool:
    return value is not None and not pd.isna(value) and bool(value)


class DataStore(param.Parameterized):
    """Data and filters shared by every page of one dashboard session.

    Parameters
    ----------
    path
        The dataset directory.
    """

    run_id = param.Selector(default=None, objects=[], doc="The configuration shown on Timeline, Ranks and Residency")
    run_a = param.Selector(default=None, objects=[], doc="The first configuration on Compare")
    run_b = param.Selector(default=None, objects=[], doc="The second configuration on Compare")
    ranks = param.ListSelector(default=[], objects=[], doc="Ranks shown on the timeline (empty: all)")

    def __init__(self, path: str | Path, **params):
        super().__init__(**params)
        self.path = str(Path(path).resolve())
        schema.read_metadata(self.path)  # ValueError naming the path when it is not a dataset
        self.stamp = _stamp(self.path)
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

    def run_labels(self) -> dict[str, str]:
        """Selector labels ``{label: run_id}``: the configuration in words, the stand-in marked."""
        out = {}
        for row in self.runs.itertuples(index=False):
            parts = [str(row.run_id)]
            if pd.notna(row.setup):
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

    def timeline(self, run_id: str | None = None, ranks=None) -> figures.TimelineData:
        run_id = self.run_id if run_id is None else run_id
        ranks = self.ranks if ranks is None else ranks
        return load_timeline(self.path, self.stamp, run_id, tuple(sorted(ranks)) or None)

    def steps(self, run_id: str | None = None) -> pd.DataFrame:
        steps = load_table(self.path, self.stamp, "steps")
        return steps.loc[steps["run_id"] == (self.run_id if run_id is None else run_id)]

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

    def comm_start_delays(self) -> pd.DataFrame:
        return load_analysis(self.path, self.stamp, "comm_start_delays")

    def configuration_text(self, run_id: str | None = None) -> str:
        """The run's configuration as one line of Markdown."""
        row = self.run_row(run_id)
        if not row:
            return "no run selected"
        keys = ["workload", "setup", "compute_impl", "smem_pad_bytes", "comm_priority", "comm_priority_effective",
                "collective", "message_bytes", "world_size", "n_ranks", "backend", "device_name"]  # fmt: skip
        parts = [f"**{k}** {row[k]}" for k in keys if row.get(k) is not None]
        text = " · ".join(parts) or f"imported from {json.loads(row.get('source_paths') or '[]')}"
        if _true(row.get("stand_in")):
            text += f" · ⚠ **{figures.STAND_IN_NOTE}**"
        if row.get("status") == "failed":
            text += f" · ❌ run failed: {row.get('error')}"
        return text
