"""Every number fits the column it becomes: range checks that name the file, the row and the field.

A reader's tables hold what the trace said, often in wider types than the dataset's
(int64 grid sizes for int32 columns, uint64 ids, a JSON ``true`` as a boolean, floats).
Casting them silently wraps or truncates; these checks refuse such a value first, with a
message a user can act on, before ``schema.conform`` casts.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from overlapviz.ingest.files import display

__all__ = ["SPAN_MAX_NS", "bounds", "check_ranges", "check_time_span", "check_value", "time_extremes"]


def bounds(t: pa.DataType) -> tuple[int, int]:
    """The smallest and largest value of integer type ``t``."""
    bits = t.bit_width
    if pa.types.is_signed_integer(t):
        return -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
    return 0, 2**bits - 1


def check_value(value, t: pa.DataType, where: str, field: str) -> None:
    """Refuse one value (a rank's fact, a manifest field) that does not fit integer type ``t``.

    Raises
    ------
    ValueError
        ``"<where>: <field> <value> is ..."``: a boolean, a fraction, text, or out of range.
    """
    if value is None or not pa.types.is_integer(t):
        return
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        else:
            raise ValueError(f"{where}: {field} {value!r} is not an integer")
    lo, hi = bounds(t)
    if not lo <= int(value) <= hi:
        raise ValueError(f"{where}: {field} {int(value)} is outside the range of {t} ({lo}..{hi})")


def check_ranges(table: pa.Table, target: pa.Schema, where: str, what: str,
                 row: Callable[[int], str] | None = None) -> None:  # fmt: skip
    """Refuse a number that does not fit the column it becomes, naming the file, the row and the field.

    ``table``'s columns are checked against the same-named integer fields of ``target``:
    integers against the target's range (an int64 grid size for an int32 column),
    floats for being finite whole numbers in range, booleans where a number belongs
    (a JSON ``true``). Columns already of the target's type, or narrower, cost nothing.

    Parameters
    ----------
    where
        The file (shown as it is).
    what
        What a row is: "kernel", "step", ...
    row
        The row's place in the file (``i -> "line 12"``); default: ``"<what> <i>"``. The
        row's ``name`` is added where the table has one.

    Raises
    ------
    ValueError
        ``"<where>: <row> (<name>): <field> = <value> is ..."``.
    """
    names = set(table.column_names)
    for field in target:
        if field.name not in names or not pa.types.is_integer(field.type):
            continue
        col = table.column(field.name)
        src = col.type
        if src == field.type or src == pa.null() or col.null_count == len(col):
            continue
        lo, hi = bounds(field.type)
        if pa.types.is_boolean(src):
            bad = pc.is_valid(col)
            reason = "a boolean (true/false) where a number belongs"
        elif pa.types.is_integer(src):
            slo, shi = bounds(src)
            if lo <= slo and shi <= hi:
                continue
            mm = pc.min_max(col)
            if lo <= mm["min"].as_py() and mm["max"].as_py() <= hi:
                continue
            bad = pc.or_(pc.less(col, pa.scalar(max(lo, slo), src)), pc.greater(col, pa.scalar(min(hi, shi), src)))
            reason = f"outside the range of {field.type} ({lo}..{hi})"
        elif pa.types.is_floating(src):
            f = pc.cast(col, pa.float64())
            ok = pc.and_(pc.is_finite(f), pc.equal(pc.floor(f), f))
            ok = pc.and_(ok, pc.and_(pc.greater_equal(f, float(lo)), pc.less_equal(f, float(hi))))
            bad = pc.invert(ok)
            reason = f"not a whole number in the range of {field.type}"
        else:
            continue  # text and other types: conform names the column it cannot cast
        bad = pc.fill_null(bad, False)
        if not pc.any(bad).as_py():
            continue
        i = int(pc.index(bad, True).as_py())
        label = row(i) if row is not None else f"{what} {i}"
        if "name" in names and pa.types.is_string(table.column("name").type):
            name = table.column("name")[i].as_py()
            if name is not None:
                label += f" ({display(name[:120])!r})"
        raise ValueError(f"{where}: {label}: {field.name} = {col[i].as_py()!r} is {reason}")


# every duration derived from two times of one rank (span, idle, delays, waits) or of one run (peer waits,
# skews) is int64 ns arithmetic: the times may lie at most this far apart
SPAN_MAX_NS = 2**63 - 1


def time_extremes(tables: list[tuple[str, pa.Table | None]]) -> tuple[tuple[int, str], tuple[int, str]] | None:
    """The earliest and the latest time (every integer ``*_ns`` column but ``base_time_ns``) of the
    ``(what, table)`` pairs, each with a description of its event (``kernel 'name' start_ns = T``);
    None where there is no time."""
    low = high = None
    for what, table in tables:
        if table is None or not table.num_rows:
            continue
        for c in table.column_names:
            if not c.endswith("_ns") or c == "base_time_ns" or not pa.types.is_integer(table.schema.field(c).type):
                continue
            mm = pc.min_max(table.column(c)).as_py()
            if mm["min"] is None:
                continue
            if low is None or mm["min"] < low[0]:
                low = (mm["min"], what, table, c)
            if high is None or mm["max"] > high[0]:
                high = (mm["max"], what, table, c)
    if low is None:
        return None
    return (low[0], _event(*low)), (high[0], _event(*high))


def _event(value: int, what: str, table: pa.Table, column: str) -> str:
    row = pc.index(table.column(column), value).as_py()
    name = table.column("name")[row].as_py() if "name" in table.column_names else None
    return f"{what} {display(name)!r} {column} = {value}" if name is not None else f"{what} {column} = {value}"


def check_time_span(extremes, where: str) -> None:
    """Refuse times so far apart that a duration between them does not fit int64 ns (it would wrap:
    a negative span or idle time).

    Raises
    ------
    ValueError
        ``"<where>: <event> and <event> are N ns apart, past what int64 ns holds ..."``.
    """
    if extremes is None:
        return
    (low, low_text), (high, high_text) = extremes
    if high - low > SPAN_MAX_NS:
        raise ValueError(f"{where}: {low_text} and {high_text} are {high - low} ns apart, past what int64 "
                         f"nanoseconds hold (±292 years): no duration between them can be computed")  # fmt: skip
