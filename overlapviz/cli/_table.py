"""The text tables every command prints with ``--format table``: one number format, ids whole, compact by default.

Rules (docs/cli.md): a compact table shows a command's key columns and ``--wide`` every
column; neither ever cuts an id (run ids, ranks, start times: what a command takes back): a
compact table is narrowed by choosing columns, and by printing each run's id once, on its
own line above its rows, instead of in a column. Kernel names, which no command takes as
an id, are shown in a compact table as their function name (``void ns::f<...>(...)`` ->
``ns::f``), and past ``NAME_MAX`` characters (ROCm's Tensile names run to 1,700) cut with
``…``; ``--wide``, JSON and CSV give them whole. Notes (why a number is missing) become
footnotes under a compact table.

Numbers: times in µs with one decimal (``*_ms`` columns are shown in µs, the header saying
``*_us``); fractions and occupancies as percentages with one decimal; dimensionless ratios
with three decimals; counts, bytes and ns as integers; no thousands separators and no
exponents anywhere; nulls as ``-``. JSON and CSV are untouched by all of this; every command's
records, in all three formats and from pandas or Arrow, are written by ``render_output``.
"""

from __future__ import annotations

import math
import textwrap
from typing import TYPE_CHECKING

from overlapviz.domain import vocabulary
from overlapviz.dataset.outdir import display_path as printable_text

if TYPE_CHECKING:
    from collections.abc import Callable

NULL = "-"
# columns that are shortened to a kernel's function name in a compact table
NAME_COLUMNS = ("name", "blocker", "producer", "comm", "resident", "instance")
NAME_MAX = 40  # 30 where a table shows two names
WRAP = 118  # footnotes are wrapped to fit 120 columns
_RATIO = ("time_ratio", "speedup", "compute_slowdown", "ratio", "waves", "compute_waves")
_INT_NAMES = ("rank", "stream", "correlation", "step", "device", "slowest_rank", "free_sms", "num_sms", "iteration",
              "instance_seq", "comm_seq", "blocks_per_sm", "comm_priority")  # fmt: skip


def is_null(v) -> bool:
    if v is None:
        return True
    if isinstance(v, float):
        return math.isnan(v)
    return type(v).__name__ in ("NAType", "NaTType")


def unit(column: str) -> str:
    """How a column's numbers are written: us, ms, pct, ratio, gbps, int or num."""
    base = column
    for suffix in ("_ci_low", "_ci_high"):
        if base.endswith(suffix):
            base = base[: -len(suffix)]
    if base.endswith("_us"):
        return "us"
    if base.endswith("_ms"):
        return "ms"
    if base.endswith("_fraction") or "occupancy" in base or base == "overlap":
        return "pct"
    if base.startswith(_RATIO) or base.endswith("_ratio"):
        return "ratio"
    if base.endswith("_gbps"):
        return "gbps"
    if base.endswith(("_ns", "_bytes")) or base.startswith("n_") or base in _INT_NAMES or base.endswith("_blocks_per_sm") \
            or base.endswith(("_sms", "_blocks", "_fit_per_sm")):  # fmt: skip
        return "int"
    return "num"


def header(column: str) -> str:
    """The table's header of ``column``: its name, with ``*_ms`` shown as ``*_us``."""
    return column[:-3] + "_us" if column.endswith("_ms") else column


def cell(column_unit: str, v) -> str:
    """One value in a column of ``column_unit`` (see ``unit``)."""
    if is_null(v):
        return NULL
    if hasattr(v, "item") and not isinstance(v, str):
        v = v.item()  # a numpy scalar
    if isinstance(v, bool):
        return "yes" if v else "no"
    if not isinstance(v, (int, float)):
        return str(v)
    if isinstance(v, int) and column_unit in ("int", "num"):
        return str(v)
    v = float(v)
    if not math.isfinite(v):
        return str(v)
    if column_unit == "us":
        return f"{v:.1f}"
    if column_unit == "ms":
        return f"{v * 1000.0:.1f}"
    if column_unit == "pct":
        return f"{v:.1%}"
    if column_unit == "ratio":
        return f"{v:.3f}"
    if column_unit == "gbps":
        return f"{v:.1f}"
    if v.is_integer() and abs(v) < 2**63:
        return str(int(v))
    return f"{v:.3f}"


def short_name(name: str, limit: int | None = NAME_MAX) -> str:
    """A kernel's function name (``vocabulary.function_name``: no return type, template arguments or parameter list),
    cut to ``limit`` characters (the last one ``…``); a collective instance (``pos:GROUP:NAME#SEQ``) keeps its prefix and
    sequence number."""
    return vocabulary.short_name(name, limit)


def _distinct_names(values: list, limit: int) -> list[str]:
    """Kernel names shortened to their function name, except where two different names would read the same: those keep
    their template arguments (the residency of ``clover::par_ranged2d_kernel<PdV_kernel…>`` and of its other instances
    were 25 rows named alike, which the dashboard tells apart)."""
    short = [NULL if is_null(v) else short_name(str(v), limit) for v in values]
    full: dict[str, set] = {}
    for v, s in zip(values, short):
        if not is_null(v):
            full.setdefault(s, set()).add(str(v))
    out = [s if is_null(v) or len(full[s]) < 2 else vocabulary.short_name(str(v), limit, templates=True)
           for v, s in zip(values, short)]  # fmt: skip
    # still alike once cut to the width: the second name so shown is "(2)", the third "(3)" (--wide has them whole)
    seen: dict[str, list] = {}
    for i, (v, s) in enumerate(zip(values, out)):
        if is_null(v):
            continue
        names = seen.setdefault(s, [])
        if str(v) not in names:
            names.append(str(v))
        k = names.index(str(v))
        if k:
            tag = f" ({k + 1})"
            out[i] = (s if limit is None else vocabulary.shorten(s, limit - len(tag))) + tag
    return out


def render(columns: list[str], data: dict[str, list], *, wide: bool, text: set[str] | None = None,
           row_units: dict[str, list[str]] | None = None, notes: tuple[str, ...] = ("residency_note",)) -> str:
    """An aligned text table of ``columns`` (each a list of values in ``data``).

    Compact (``wide`` False): kernel names shortened to their function name, and where a
    ``run_id`` column is given its values are printed once per run, on a line of their own
    (``run ID``) above the run's consecutive rows, never cut. Wide: every value as is, the
    run id in its column. ``row_units``: a unit per row for the named columns (a table whose
    rows are different quantities), instead of the column's own. ``notes``: prose columns that a compact table shows as
    ``[N]``, with each distinct text once under the table.
    """
    n = len(data[columns[0]]) if columns else 0
    if not n:
        return "(nothing to show)"
    grouped = not wide and "run_id" in columns
    shown = [c for c in columns if not (grouped and c == "run_id")]
    cells = {}
    footnotes: dict[str, int] = {}
    name_max = NAME_MAX if sum(c in NAME_COLUMNS for c in shown) < 2 else 30
    for c in shown:
        u = unit(c)
        values = data[c]
        if not wide and c in notes:
            cells[c] = [NULL if is_null(v) else f"[{footnotes.setdefault(str(v), len(footnotes) + 1)}]" for v in values]
        elif not wide and c in NAME_COLUMNS:
            cells[c] = _distinct_names(values, name_max)
        elif row_units and c in row_units:
            cells[c] = [cell(ru, v) for ru, v in zip(row_units[c], values)]
        else:
            cells[c] = [cell(u, v) for v in values]
    # one escaping rule for every table (as for every message): a name's control characters (ESC, BEL, CSI, a
    # newline) are written as \xNN, so no trace can drive the terminal or break a row
    cells = {c: [printable_text(t) for t in texts] for c, texts in cells.items()}
    left = set(text or ()) | {c for c in shown if any(isinstance(v, str) for v in data[c])}
    heads = {c: "note" if not wide and c in notes else header(c) for c in shown}
    widths = {c: max(len(heads[c]), *(len(s) for s in cells[c])) for c in shown}

    def line(texts) -> str:
        return "  ".join(t.ljust(widths[c]) if c in left else t.rjust(widths[c]) for c, t in zip(shown, texts)).rstrip()

    lines = [line([heads[c] for c in shown])]
    previous = object()
    for i in range(n):
        if grouped:
            rid = data["run_id"][i]
            if rid != previous:
                lines.append(f"run {NULL if is_null(rid) else printable_text(str(rid))}")
                previous = rid
        lines.append(line([cells[c][i] for c in shown]))
    for note, number in footnotes.items():
        lines.extend(textwrap.wrap(printable_text(note), WRAP, initial_indent=f"[{number}] ", subsequent_indent=" " * (len(str(number)) + 3),
                                   break_on_hyphens=False))  # fmt: skip
    return "\n".join(lines)


def json_value(v):
    """A JSON-ready scalar: None for every kind of null, Python numbers for numpy ones."""
    if is_null(v):
        return None
    if hasattr(v, "item") and not isinstance(v, str):
        v = v.item()
    if isinstance(v, float) and math.isnan(v):
        return None
    return v


def _csv_value(v):
    """A CSV field as pandas' ``to_csv`` writes it: nulls empty, floats shortest round-trip, the rest ``str``."""
    return "" if is_null(v) else v


class Columns:
    """Records as columns of Python values (str, int, float, bool; None or NaN for null), computed without pandas or
    Arrow; ``text``: the columns a table aligns as text (left), as a pandas frame's text columns."""

    def __init__(self, data: dict[str, list], text=()):
        self.data = data
        self.text = set(text)

    def __len__(self) -> int:
        return len(next(iter(self.data.values()))) if self.data else 0


def _columns(records) -> tuple[list[str], Callable[[str], list], Callable[[str], list], Callable[[str], bool]]:
    """Of a pandas frame or a pyarrow table (the two kinds of records the commands print): the column names,
    a column's values as Python objects, its CSV fields, and whether it holds text."""
    if isinstance(records, Columns):
        return (list(records.data), lambda c: records.data[c], lambda c: [_csv_value(v) for v in records.data[c]],
                lambda c: c in records.text)  # fmt: skip
    if hasattr(records, "column_names"):  # pyarrow.Table (analyze prints Arrow: no pandas on its path)
        import pyarrow as pa

        def arrow_values(c):
            return records.column(c).to_pylist()

        def arrow_text(c):
            t = records.schema.field(c).type
            return pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_dictionary(t)

        return list(records.column_names), arrow_values, lambda c: [_csv_value(v) for v in arrow_values(c)], arrow_text

    def frame_csv(c):
        col = records[c]
        if col.dtype.kind == "M" or (col.dtype.kind == "f" and col.dtype.itemsize < 8):
            # pandas' own spelling: float32 as float32 (0.1, not 0.10000000149011612), dates without a time of day
            return [text if ok else "" for text, ok in zip(col.astype(str).tolist(), col.notna().tolist())]
        return [_csv_value(v) for v in col.tolist()]

    def frame_text(c):
        dtype = records[c].dtype
        return dtype == object or str(dtype) in ("string", "str", "category")

    return list(records.columns), lambda c: records[c].tolist(), frame_csv, frame_text


def render_output(records, fmt: str, *, columns: list[str] | None = None, wide: bool = False,
                  row_units: dict[str, list[str]] | None = None, empty: str = "(nothing to show)") -> str:  # fmt: skip
    """``records`` (a pandas frame, a pyarrow table or ``Columns``, one record per row) as every command prints them.

    ``json``: one array of objects, every column, nulls as null, numbers as Python spells them.
    ``csv``: every column, nulls as empty fields, floats shortest round-trip (as pandas' ``to_csv``).
    ``table``: ``columns`` (compact) or every column (``wide``), by ``render``; ``empty`` when no row.
    """
    names, values, csv_fields, is_text = _columns(records)
    n = len(records)
    if fmt == "json":
        import orjson

        data = [[json_value(v) for v in values(c)] for c in names]
        return orjson.dumps([dict(zip(names, row)) for row in zip(*data)] if names else [{}] * n).decode()
    if fmt == "csv":
        import csv
        import io

        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(names)
        writer.writerows(zip(*(csv_fields(c) for c in names)) if names else [[]] * n)
        return out.getvalue()
    shown = names if wide or columns is None else [c for c in columns if c in names]
    if not n:
        return empty
    if not shown:
        return "(nothing to show)"
    return render(shown, {c: values(c) for c in shown}, wide=wide, text={c for c in shown if is_text(c)}, row_units=row_units)
