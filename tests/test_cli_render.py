"""One record renderer (``cli/_table.render_output``) for every command's JSON, CSV and table, from pandas or Arrow.

Its CSV is pandas' ``to_csv`` and its JSON the former per-row rendering, for the column types
the commands print; an Arrow table and the same records as a pandas frame print alike.
"""

from __future__ import annotations

import math

import numpy as np
import orjson
import pandas as pd
import pyarrow as pa
import pytest

from overlapviz.cli._table import render_output


def _frame() -> pd.DataFrame:
    n = 60
    rng = np.random.default_rng(3)
    floats = rng.random(n) * 10.0 ** rng.integers(-8, 18, n)
    floats[::7] = np.nan
    floats[:6] = [0.1 + 0.2, 1e16, 5e-324, 2.0**53 + 2, -0.0, 1 / 3]
    names = [f'r,{i}' if i % 5 == 0 else f'r"{i}' if i % 5 == 1 else f"r\n{i}" if i % 5 == 2 else f"r{i}" for i in range(n)]
    mixed = [None if i % 4 == 0 else i if i % 4 == 1 else i / 8 if i % 4 == 2 else np.float64(i) / 3 for i in range(n)]
    return pd.DataFrame({
        "run_id": names,
        "rank": np.arange(n, dtype=np.int64),
        "start_ns": np.arange(n, dtype=np.int64) * 1_740_461_679_471_440 + 7,
        "overlap_fraction": floats,
        "step": pd.array([None if i % 3 == 0 else i for i in range(n)], dtype="Int64"),
        "meets_target": np.arange(n) % 2 == 0,
        "recommended": pd.array([None if i % 5 == 0 else i % 2 == 0 for i in range(n)], dtype="boolean"),
        "a": pd.Series(mixed, dtype=object),  # compare's a/b/delta: ints beside floats
        "kind": pd.Categorical(["comm", "compute", "memory"] * (n // 3)),
        "note": pd.array([None if i % 6 == 0 else f"note {i}" for i in range(n)], dtype="string"),
        "blocker": [None if i % 2 else "void f<int>(float)" for i in range(n)],
        "ratio": pd.array([None if i % 4 == 0 else i / 7 for i in range(n)], dtype="Float64"),
        "occupancy": np.where(np.arange(n) % 9 == 0, np.nan, np.arange(n) / 7).astype(np.float32),
        "day": pd.to_datetime([None if i % 8 == 0 else f"2026-12-{1 + i % 28:02d}" for i in range(n)]),
        "started": pd.to_datetime([None if i % 8 == 0 else 1_765_000_000_000_000_000 + i * 1_500_000 for i in range(n)]),
    })  # fmt: skip


def _previous_json(frame: pd.DataFrame) -> str:
    """The JSON every pandas-printing command wrote before the renderers were one: row by row, nulls as null."""

    def value(v):
        if v is None or (isinstance(v, float) and math.isnan(v)) or type(v).__name__ in ("NAType", "NaTType"):
            return None
        return v.item() if hasattr(v, "item") and not isinstance(v, str) else v

    return orjson.dumps([{c: value(v) for c, v in zip(frame.columns, row)} for row in frame.itertuples(index=False, name=None)]).decode()


@pytest.mark.parametrize("rows", [slice(None), slice(0, 1), slice(0, 0)])
def test_pandas_records_print_as_pandas_and_as_before(rows):
    frame = _frame().iloc[rows].reset_index(drop=True)
    assert render_output(frame, "csv") == frame.to_csv(index=False, lineterminator="\n")
    no_times = frame.drop(columns=["day", "started"])  # JSON has no time type: no command prints one
    assert render_output(no_times, "json") == _previous_json(no_times)
    for col in frame.columns:  # one column at a time too: a lone empty field is written "" as pandas writes it
        assert render_output(frame[[col]], "csv") == frame[[col]].to_csv(index=False, lineterminator="\n"), col


def test_arrow_and_pandas_records_print_alike():
    # an object column of ints and floats has no Arrow type; Arrow spells float32 and times as Python does (analyze prints
    # neither)
    frame = _frame().drop(columns=["a", "occupancy", "day", "started"])
    table = pa.Table.from_pandas(frame, preserve_index=False)
    assert render_output(table, "json") == render_output(frame, "json")
    assert render_output(table, "csv") == render_output(frame, "csv")
    for wide in (False, True):
        columns = ["run_id", "rank", "step", "overlap_fraction", "kind", "note", "blocker", "ratio"]
        assert render_output(table, "table", columns=columns, wide=wide) == render_output(frame, "table", columns=columns, wide=wide)
    assert render_output(table.slice(0, 0), "table", empty="(no kernels)") == "(no kernels)"
    assert render_output(frame.iloc[:0], "table") == "(nothing to show)"
