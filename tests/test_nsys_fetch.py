"""``sqlite_common.fetch``, the column reader of both SQLite formats (Nsight Systems, rocpd), on databases built here.

Every expectation is the test's own: the values it inserted, or what plain ``sqlite3``
returns for the same query. Edge cases: NULL in every column, int64's extremes, results
spanning several blocks, an empty result, text that is not UTF-8, and every kind of value
that is not an integer (text, a numeric string, a real with or without a fraction, a
blob), which must be refused naming the file, the table and the field, never truncated.
"""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from overlapviz.ingest import sqlite_common
from overlapviz.ingest.nsys import read_nsys
from overlapviz.ingest.sqlite_common import fetch, open_readonly

from _sqlite_tables import make  # one table-maker for the SQLite reader tests

MOCK = Path(__file__).parent / "data" / "nsys" / "mock.sqlite"
I64 = (-(2**63), 2**63 - 1)


def plain(path: Path, sql: str) -> list[tuple]:
    db = sqlite3.connect(path)
    db.text_factory = lambda b: b.decode("utf-8", "replace")
    try:
        return db.execute(sql).fetchall()
    finally:
        db.close()


def read(path: Path, columns: dict, tail: str, strings=()) -> dict[str, pa.Array]:
    with open_readonly(path) as db:
        return fetch(db, columns, tail, where=f"{path}: t", strings=strings)


@pytest.mark.parametrize("block", [3, 65536])
def test_integers_and_nulls_exactly_in_order(tmp_path, block, monkeypatch):
    monkeypatch.setattr(sqlite_common, "_FETCH_ROWS", block)  # several blocks, and one
    values = [I64[0], I64[1], 0, -1, 1, 2**53 + 1, None, 1_700_000_000_123_456_789]
    rows = [(i, values[i % len(values)], values[(3 * i) % len(values)], None if i % 4 else i) for i in range(50)]
    p = make(tmp_path / "a.db", "CREATE TABLE t (id INTEGER, a INTEGER, b INTEGER, c INTEGER)", rows)
    got = read(p, {"id": "id", "a": "a", "b": "b", "c": "c", "none": "NULL"}, "FROM t ORDER BY b, id DESC")
    want = plain(p, "SELECT id, a, b, c, NULL FROM t ORDER BY b, id DESC")
    assert [tuple(got[k][i].as_py() for k in ("id", "a", "b", "c", "none")) for i in range(len(want))] == want
    assert all(a.type == pa.int64() for a in got.values())
    assert got["a"].null_count == sum(r[1] is None for r in rows)


@pytest.mark.parametrize("block", [4, 65536])
def test_order_by_in_numpy_is_sqls_order(tmp_path, block, monkeypatch):
    """``order_by`` sorts as ``ORDER BY`` those columns: NULL first, ascending, int64's extremes,
    several keys; rows equal on every key keep the table's order (SQL leaves theirs open, so the
    test orders them by rowid)."""
    monkeypatch.setattr(sqlite_common, "_FETCH_ROWS", block)
    keys = [None, I64[0], I64[1], -1, 0, 7, 7, 2**53 + 1]
    rows = [(keys[(5 * i) % len(keys)], keys[(3 * i + 1) % len(keys)] if i % 5 else None, i % 3, f"r{i}")
            for i in range(60)]  # fmt: skip
    p = make(tmp_path / "o.db", "CREATE TABLE t (a INTEGER, b INTEGER, c INTEGER, s TEXT)", rows)
    with open_readonly(p) as db:
        got = fetch(db, {"a": "a", "b": "b", "c": "c", "s": "s"}, "FROM t", where="t", strings=("s",), order_by=("a", "b", "c"))
    want = plain(p, "SELECT a, b, c, s FROM t ORDER BY a, b, c, rowid")
    assert [tuple(got[k][i].as_py() for k in "abcs") for i in range(len(want))] == want
    assert len(set(want)) == len(want) and want != plain(p, "SELECT a, b, c, s FROM t")  # a real reordering


def test_order_by_names_the_first_bad_value_in_that_order(tmp_path):
    p = make(tmp_path / "b.db", "CREATE TABLE t (a INTEGER, b)", [(3, "late"), (1, "early"), (2, 5)])
    with open_readonly(p) as db, pytest.raises(ValueError, match=r"^t: field 'b' holds a text value \('early'\)"):
        fetch(db, {"a": "a", "b": "b"}, "FROM t", where="t", order_by=("a",))


def test_empty_result_has_typed_columns(tmp_path):
    p = make(tmp_path / "a.db", "CREATE TABLE t (a INTEGER, s TEXT)", [])
    got = read(p, {"a": "a", "s": "s"}, "FROM t", strings=("s",))
    assert got["a"].type == pa.int64() and len(got["a"]) == 0
    assert got["s"].type == pa.string() and len(got["s"]) == 0


def test_strings_null_empty_and_not_utf8(tmp_path):
    rows = [(1, "plain"), (2, None), (3, ""), (4, 'quote " comma , newline \n tab \t é'), (5, "x")]
    p = make(tmp_path / "a.db", "CREATE TABLE t (a INTEGER, s TEXT)", rows)
    db = sqlite3.connect(p)
    db.execute("UPDATE t SET s = CAST(x'41ff42' AS TEXT) WHERE a = 5")  # not UTF-8
    db.commit()
    db.close()
    got = read(p, {"a": "a", "s": "s"}, "FROM t ORDER BY a", strings=("s",))
    assert got["s"].to_pylist() == [r[0] for r in plain(p, "SELECT s FROM t ORDER BY a")]
    assert got["s"].to_pylist()[4] == "A\ufffdB" and got["s"][1].as_py() is None and got["s"][2].as_py() == ""
    assert got["a"].to_pylist() == [1, 2, 3, 4, 5]


@pytest.mark.parametrize(
    ("value", "kind"),
    [("yesterday", "text"), ("12", "text"), (2.5, "real"), (1e300, "real"), (2.0, "real"), (b"\x00\x01", "blob")],
)
def test_a_value_that_is_not_an_integer_is_refused(tmp_path, value, kind):
    # no declared type: SQLite keeps each value as given (a column with INTEGER affinity
    # would store '12' and 2.0 as integers, which they then are)
    p = make(tmp_path / "a.db", "CREATE TABLE t (a, b)", [(1, 1), (2, value), (3, None)])
    with pytest.raises(ValueError) as exc:
        read(p, {"a": "a", "b": "b"}, "FROM t")
    msg = str(exc.value)
    assert msg.startswith(f"{p}: t: field 'b' holds a {kind} value") and msg.endswith("not an integer"), msg
    assert len(msg.splitlines()) == 1


def test_a_number_in_a_string_column_is_refused(tmp_path):
    p = make(tmp_path / "a.db", "CREATE TABLE t (a, s)", [(1, "x"), (2, 7)])
    with pytest.raises(ValueError, match=r": t: field 's' holds an integer value \(7\), not a string"):
        read(p, {"a": "a", "s": "s"}, "FROM t", strings=("s",))


def test_a_corrupt_database_is_not_taken_for_a_bad_value(tmp_path):
    p = make(tmp_path / "a.db", "CREATE TABLE t (a INTEGER, s TEXT)", [(i, "x" * 200) for i in range(5000)])
    data = bytearray(p.read_bytes())
    data[8192:16384] = b"\xa5" * 8192
    p.write_bytes(bytes(data))
    with pytest.raises(sqlite3.DatabaseError):
        read(p, {"a": "a", "s": "s"}, "FROM t", strings=("s",))


# --- through the nsys reader --------------------------------------------------------------


def nsys_copy(tmp_path: Path, sql: str) -> Path:
    p = tmp_path / "report.sqlite"
    shutil.copy(MOCK, p)
    db = sqlite3.connect(p)
    db.executescript(sql)
    db.commit()
    db.close()
    return p


@pytest.mark.parametrize(
    ("sql", "expected"),
    [
        ("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET start = 'yesterday'", "CUPTI_ACTIVITY_KIND_KERNEL: field 'start' holds a text"),
        # a half nanosecond was truncated to an integer before: refused now
        ('UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET "end" = "end" + 0.5', "CUPTI_ACTIVITY_KIND_KERNEL: field 'end' holds a real"),
        ("UPDATE CUPTI_ACTIVITY_KIND_RUNTIME SET correlationId = x'01'", "CUPTI_ACTIVITY_KIND_RUNTIME: field 'correlationId' holds a blob"),
        (f"UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET gridX = {2**40}", "grid_x = 1099511627776 is outside the range of int32"),
        (f"UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET staticSharedMemory = {2**63 - 1}, dynamicSharedMemory = 1",
         "staticSharedMemory + dynamicSharedMemory is past int64"),
    ],
)  # fmt: skip
def test_nsys_refusals_name_the_file_table_and_field(tmp_path, sql, expected):
    p = nsys_copy(tmp_path, sql)
    with pytest.raises(ValueError) as exc:
        read_nsys(p)
    msg = str(exc.value)
    assert msg.startswith(str(p)) and expected in msg and len(msg.splitlines()) == 1, msg


def test_nsys_strings_that_are_not_utf8_and_int64_extremes_are_read(tmp_path):
    p = nsys_copy(tmp_path, f"""
        UPDATE StringIds SET value = CAST(x'6b65726e656cff' AS TEXT)
            WHERE id = (SELECT demangledName FROM CUPTI_ACTIVITY_KIND_KERNEL ORDER BY rowid LIMIT 1);
        UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET correlationId = {2**63 - 1} WHERE rowid = (SELECT min(rowid) FROM CUPTI_ACTIVITY_KIND_KERNEL);
    """)  # fmt: skip
    (t,) = read_nsys(p)
    k = t.kernels.filter(pc.equal(t.kernels.column("category"), "kernel")).sort_by("start_ns")
    corr = plain(p, "SELECT correlationId FROM CUPTI_ACTIVITY_KIND_KERNEL ORDER BY start")
    assert k.column("correlation").to_pylist() == [c for (c,) in corr] and 2**63 - 1 in k.column("correlation").to_pylist()
    assert "kernel\ufffd" in t.kernels.column("name").to_pylist()


def test_nsys_kernel_names_fall_back_row_by_row_whatever_the_indexes(tmp_path):
    """Where ``demangledName`` is NULL the name is ``shortName``'s (else ``mangledName``'s) of the
    same row: the fallback column is read apart, in table order even where an index covers it
    (nsys-ai adds one on ``shortName``) and would hand its rows over in another order."""
    p = nsys_copy(tmp_path, """
        CREATE TABLE k AS SELECT * FROM CUPTI_ACTIVITY_KIND_KERNEL;  -- without the export's NOT NULL
        DROP TABLE CUPTI_ACTIVITY_KIND_KERNEL;
        ALTER TABLE k RENAME TO CUPTI_ACTIVITY_KIND_KERNEL;
        INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL SELECT * FROM CUPTI_ACTIVITY_KIND_KERNEL;
        INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL SELECT * FROM CUPTI_ACTIVITY_KIND_KERNEL;
        UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET start = start + 1000 * rowid, "end" = "end" + 1000 * rowid,
            shortName = (SELECT max(id) FROM StringIds) - rowid,
            demangledName = CASE WHEN rowid % 2 THEN NULL ELSE demangledName END,
            mangledName = CASE WHEN rowid = 3 THEN NULL ELSE mangledName END;
        UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET shortName = NULL WHERE rowid = 3;
        CREATE INDEX short ON CUPTI_ACTIVITY_KIND_KERNEL (shortName);
    """)  # fmt: skip
    want = plain(p, """SELECT k.start, s.value FROM CUPTI_ACTIVITY_KIND_KERNEL k
                       LEFT JOIN StringIds s ON s.id = coalesce(k.demangledName, k.shortName, k.mangledName) ORDER BY k.start""")
    by_index = plain(p, "SELECT shortName FROM CUPTI_ACTIVITY_KIND_KERNEL")  # the index's order: the trap
    assert by_index != plain(p, "SELECT shortName FROM CUPTI_ACTIVITY_KIND_KERNEL ORDER BY rowid")
    (t,) = read_nsys(p)
    k = t.kernels.filter(pc.equal(t.kernels.column("category"), "kernel")).sort_by("start_ns")
    assert list(zip(k.column("start_ns").to_pylist(), k.column("name").to_pylist())) == want
    assert len(want) == 8 and len({n for _, n in want}) >= 5 and [n for _, n in want].count(None) == 1  # rowid 3: no name
