"""The C column reader of ``sqlite_common.fetch`` (``overlapviz.ingest._sqlite``) against its json_array path.

Both paths must give the same arrays and, through ``ingest``, byte-identical datasets on
every SQLite file we have (tests/data, the reference Nsight Systems exports, rocpd
databases built from rocprofv3's DDL, the benchmark's generated files); both must refuse a
value of the wrong storage class (text, a real or a blob in an integer column; an integer or
a real in a string column) with the same one-line message, and both hand NULLs over as nulls.
Each test checks which path ran (a spy on ``_sqlite.read``), so the C path cannot silently
fall back and pass. ``OVERLAPVIZ_PURE_PYTHON=1`` selects the json_array path.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sqlite3
import sys
from pathlib import Path

import pyarrow as pa
import pytest

from overlapviz.ingest import sqlite_common
from overlapviz.ingest.sqlite_common import fetch, open_readonly
from _sqlite_tables import make  # one table-maker for the SQLite reader tests

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
REFERENCE = Path(os.environ.get("OVERLAPVIZ_REFERENCE_TRACES", ROOT.parent / "shared" / "reference_traces"))
I64 = (-(2**63), 2**63 - 1)

# .ci/run sets OVERLAPVIZ_REQUIRE_C=1: there a failed build fails these tests instead of skipping them
REQUIRE_C = os.environ.get("OVERLAPVIZ_REQUIRE_C", "") not in ("", "0")
pytestmark = pytest.mark.skipif(sqlite_common._sqlite is None and not REQUIRE_C,
                                reason="the C SQLite reader is not built (no C compiler)")  # fmt: skip


class Spy:
    """``_sqlite`` with each ``read`` recorded: ('rows' | 'bad' | 'none', result)."""

    def __init__(self, real):
        self.real, self.calls = real, []

    def bind(self, names):
        return self.real.bind(names)

    def read(self, *args):
        got = self.real.read(*args)
        self.calls.append(("none" if got is None else "bad" if got[0] == "bad" else "rows", got))
        return got


@pytest.fixture
def spy(monkeypatch):
    s = Spy(sqlite_common._sqlite)
    monkeypatch.setattr(sqlite_common, "_sqlite", s)
    return s


def use(monkeypatch, path: str) -> None:
    monkeypatch.setenv("OVERLAPVIZ_PURE_PYTHON", "1" if path == "json" else "0")


def both(monkeypatch, spy, path: Path, columns: dict, tail: str, **kw) -> dict[str, pa.Array]:
    """``fetch`` through the json_array path, then through C (which must have read it): the
    same arrays (types, values, nulls), returned once."""
    got = {}
    for how in ("json", "c"):
        use(monkeypatch, how)
        spy.calls.clear()
        with open_readonly(path) as db:
            got[how] = fetch(db, columns, tail, where="t", **kw)
        assert [c[0] for c in spy.calls] == ([] if how == "json" else ["rows"])
    for a in columns:
        assert got["c"][a].type == got["json"][a].type, a
        assert got["c"][a].equals(got["json"][a]), (a, got["c"][a], got["json"][a])
    return got["c"]


def test_bound_to_pythons_own_sqlite(monkeypatch):
    monkeypatch.delenv("OVERLAPVIZ_PURE_PYTHON", raising=False)
    assert sqlite_common.c_reader_available(), "the C reader is built but could not bind Python's SQLite"
    monkeypatch.setenv("OVERLAPVIZ_PURE_PYTHON", "1")
    assert not sqlite_common.c_reader_available()


def test_no_sqlite_header_is_used():
    """The module builds without libsqlite3's headers (CI has only Python's sqlite3)."""
    text = (ROOT / "overlapviz" / "ingest" / "_sqlite.c").read_text()
    includes = [line for line in text.splitlines() if line.lstrip().startswith("#include")]
    assert includes and not any("sqlite" in line for line in includes), includes


def test_integers_nulls_and_extremes_over_many_blocks(tmp_path, monkeypatch, spy):
    values = [I64[0], I64[1], 0, -1, 1, 2**53 + 1, None, 1_700_000_000_123_456_789]
    rows = [(i, values[i % 8], values[(3 * i) % 8], None if i % 4 else i) for i in range(20_000)]  # > one buffer
    p = make(tmp_path / "a.db", "CREATE TABLE t (id INTEGER, a INTEGER, b INTEGER, c INTEGER)", rows)
    got = both(monkeypatch, spy, p, {"id": "id", "a": "a", "b": "b", "c": "c", "none": "NULL"}, "FROM t ORDER BY id")
    assert got["a"].to_pylist() == [r[1] for r in rows] and got["c"].to_pylist() == [r[3] for r in rows]
    assert got["none"].null_count == len(rows) and got["c"].null_count == sum(r[3] is None for r in rows)
    assert got["id"].null_count == 0 and got["id"].buffers()[0] is None  # no validity where nothing is null


def test_strings_null_empty_not_utf8_and_large(tmp_path, monkeypatch, spy):
    text = ["plain", None, "", 'quote " comma , newline \n tab \t é', "x" * 100_000, "a\x00b"]
    rows = [(i, text[i % len(text)]) for i in range(3_000)]  # ~50 MB of text: the data buffer grows
    p = make(tmp_path / "a.db", "CREATE TABLE t (a INTEGER, s TEXT)", rows)
    db = sqlite3.connect(p)
    db.execute("UPDATE t SET s = CAST(x'41ff42' AS TEXT) WHERE a = 7")  # not UTF-8
    db.commit()
    db.close()
    got = both(monkeypatch, spy, p, {"a": "a", "s": "s"}, "FROM t ORDER BY a", strings=("s",))
    want = [r[1] for r in rows]
    want[7] = "A\ufffdB"  # open_readonly's decoding
    assert got["s"].to_pylist() == want and got["s"].type == pa.string()


def test_a_blob_in_a_string_column_is_its_bytes_as_before(tmp_path, monkeypatch, spy):
    p = make(tmp_path / "a.db", "CREATE TABLE t (a, s)", [(1, b"abc"), (2, b""), (3, b"\xff"), (4, None)])
    got = both(monkeypatch, spy, p, {"a": "a", "s": "s"}, "FROM t ORDER BY a", strings=("s",))
    assert got["s"].to_pylist() == ["abc", "", "\ufffd", None]


def test_empty_result_params_and_order_by(tmp_path, monkeypatch, spy):
    keys = [None, I64[0], I64[1], -1, 0, 7, 7]
    rows = [(keys[(5 * i) % 7], keys[(3 * i + 1) % 7] if i % 5 else None, i, f"r{i}") for i in range(60)]
    p = make(tmp_path / "o.db", "CREATE TABLE t (a INTEGER, b INTEGER, c INTEGER, s TEXT)", rows)
    cols = {"a": "a", "b": "b", "c": "c", "s": "s"}
    empty = both(monkeypatch, spy, p, cols, "FROM t WHERE c < 0", strings=("s",))
    assert all(len(v) == 0 for v in empty.values()) and empty["s"].type == pa.string()
    got = both(monkeypatch, spy, p, cols, "FROM t WHERE c >= ? AND s <> ?", strings=("s",), params=(10, "r20"),
               order_by=("a", "b", "c"))  # fmt: skip
    want = sorted((r for r in rows if r[2] >= 10 and r[3] != "r20"), key=lambda r: (r[0] is not None, r[0] or 0,
                  r[1] is not None, r[1] or 0, r[2]))  # fmt: skip
    assert [tuple(got[k][i].as_py() for k in "abcs") for i in range(len(want))] == want


# --- refusals: the same message on both paths -------------------------------------------------

BAD = [
    ("b", "yesterday", "text", ()),
    ("b", "12", "text", ()),
    ("b", 2.5, "real", ()),
    ("b", 2.0, "real", ()),
    ("b", b"\x00\x01", "blob", ()),
    ("s", 7, "integer", ("s",)),
    ("s", 0.5, "real", ("s",)),
]


@pytest.mark.parametrize("how", ["c", "json"])
@pytest.mark.parametrize(("field", "value", "kind", "strings"), BAD)
def test_a_value_of_the_wrong_storage_class_is_refused(tmp_path, monkeypatch, spy, how, field, value, kind, strings):
    # no declared types: SQLite keeps each value's storage class as given
    rows = [(i, i, f"s{i}") for i in range(5_000)]
    rows[4_321] = (4_321, value, "x") if field == "b" else (4_321, 1, value)
    p = make(tmp_path / "a.db", "CREATE TABLE t (a, b, s)", rows)
    use(monkeypatch, how)
    with open_readonly(p) as db, pytest.raises(ValueError) as exc:
        fetch(db, {"a": "a", "b": "b", "s": "s"}, "FROM t", where=f"{p}: t", strings=("s",))
    msg = str(exc.value)
    want = "a string" if strings else "an integer"
    article = "an" if kind == "integer" else "a"
    assert msg.startswith(f"{p}: t: field '{field}' holds {article} {kind} value (") and msg.endswith(f"not {want}"), msg
    assert len(msg.splitlines()) == 1
    if how == "c":  # C found it itself, at that row and column, with SQLite's type code
        types = {"integer": 1, "real": 2, "text": 3, "blob": 4}
        assert [c[1] for c in spy.calls] == [("bad", 4_321, 1 if field == "b" else 2, types[kind])]
    else:
        assert spy.calls == []


@pytest.mark.parametrize("how", ["c", "json"])
def test_the_first_bad_value_in_order_by_order_is_named(tmp_path, monkeypatch, spy, how):
    p = make(tmp_path / "b.db", "CREATE TABLE t (a INTEGER, b)", [(3, "late"), (1, "early"), (2, 5)])
    use(monkeypatch, how)
    with open_readonly(p) as db, pytest.raises(ValueError, match=r"^t: field 'b' holds a text value \('early'\)"):
        fetch(db, {"a": "a", "b": "b"}, "FROM t", where="t", order_by=("a",))
    assert len(spy.calls) == (how == "c")


@pytest.mark.parametrize("how", ["c", "json"])
def test_a_corrupt_database_raises_sqlite_error(tmp_path, monkeypatch, spy, how):
    p = make(tmp_path / "a.db", "CREATE TABLE t (a INTEGER, s TEXT)", [(i, "x" * 200) for i in range(5000)])
    data = bytearray(p.read_bytes())
    data[8192:16384] = b"\xa5" * 8192
    p.write_bytes(bytes(data))
    use(monkeypatch, how)
    with open_readonly(p) as db, pytest.raises(sqlite3.DatabaseError):
        fetch(db, {"a": "a", "s": "s"}, "FROM t", where="t", strings=("s",))
    assert [c[0] for c in spy.calls] == (["none"] if how == "c" else [])  # C gives it back; json_array raises


def test_a_connection_not_from_open_readonly_is_read_by_json_array(tmp_path, monkeypatch, spy):
    """Another connection may see rows another would not (uncommitted, temporary tables)."""
    p = make(tmp_path / "a.db", "CREATE TABLE t (a INTEGER)", [(1,), (2,)])
    use(monkeypatch, "c")
    db = sqlite3.connect(p)
    try:
        db.execute("INSERT INTO t VALUES (3)")  # not committed: only this connection sees it
        assert fetch(db, {"a": "a"}, "FROM t", where="t")["a"].to_pylist() == [1, 2, 3]
    finally:
        db.close()
    assert spy.calls == []


def test_the_c_module_reports_row_column_and_type(tmp_path, monkeypatch):
    use(monkeypatch, "c")
    assert sqlite_common.c_reader_available()  # bound
    p = make(tmp_path / "a.db", "CREATE TABLE t (a, s)", [(1, "x"), (2, None), (None, "y"), (4, 5.5)])
    uri = p.resolve().as_uri() + "?mode=ro&immutable=1"
    read = sqlite_common._sqlite.read
    n, (a, s) = read(uri, "SELECT a, s FROM t LIMIT 3", (), "is")
    assert n == 3 and a[2] == 1 and s[3] == 1  # null counts
    assert pa.Array.from_buffers(pa.int64(), 3, [pa.py_buffer(a[1]), pa.py_buffer(a[0])]).to_pylist() == [1, 2, None]
    assert read(uri, "SELECT a, s FROM t", (), "is") == ("bad", 3, 1, 2)  # the real at row 3
    assert read(uri, "SELECT a, s FROM t", (), "ii") == ("bad", 0, 1, 3)  # text in an integer column
    assert read(uri, "SELECT a FROM no_such_table", (), "i") is None
    assert read(uri, "SELECT a, s FROM t", (), "i") is None  # kinds do not match the columns


# --- whole files: byte-identical datasets ---------------------------------------------------


def _bench():
    spec = importlib.util.spec_from_file_location("bench_formats", ROOT / "benchmarks" / "bench_formats.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("bench_formats", mod)
    spec.loader.exec_module(mod)
    return mod


def _rocpd(tmp_path: Path, which: str) -> Path:
    from _rocpd_db import make_db

    if which == "rocpd_one":
        return make_db(tmp_path / "4242_results.db")
    if which == "rocpd_merged":
        envs = ({"RANK": "0", "WORLD_SIZE": "2"}, {"RANK": "1", "WORLD_SIZE": "2"})
        return make_db(tmp_path / "merged_results.db", envs=envs)
    from overlapviz.testing import generate_trace

    bench = _bench()
    doc = generate_trace(3_000, rank=1, world_size=2, seed=3, comm_every=5, n_steps=4)
    out = tmp_path / ("rank1_results.db" if which == "rocpd_bench" else "rank1.sqlite")
    writer = bench.write_rocpd if which == "rocpd_bench" else bench.write_nsys
    writer(doc, out, pid=4001, rank=1, world_size=2)
    return out


SOURCES = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests" / "data").rglob("*") if p.is_file() and
                 p.read_bytes()[:16] == sqlite_common.SQLITE_MAGIC)  # fmt: skip
SOURCES += sorted(str(p) for p in (REFERENCE / "nsys").rglob("*.sqlite")) + sorted(str(p) for p in (REFERENCE / "rocpd").rglob("*.db"))
SOURCES += ["rocpd_one", "rocpd_merged", "rocpd_bench", "nsys_bench"]


def test_every_sqlite_file_is_covered():
    assert len([s for s in SOURCES if s.startswith("tests")]) >= 3


@pytest.mark.parametrize("source", SOURCES)
def test_datasets_are_byte_identical_on_both_paths(tmp_path, monkeypatch, spy, source):
    from overlapviz.ingest import ingest

    src = _rocpd(tmp_path, source) if source in ("rocpd_one", "rocpd_merged", "rocpd_bench", "nsys_bench") else ROOT / source
    files = {}
    for how in ("c", "json"):
        use(monkeypatch, how)
        spy.calls.clear()
        out = ingest([src], tmp_path / how, run_id="r", workers=1, progress=False)
        kinds = {c[0] for c in spy.calls}
        assert kinds == ({"rows"} if how == "c" else set()), kinds  # C read every query itself
        files[how] = {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}
    assert any(k.startswith("kernels") for k in files["c"])
    assert files["c"].keys() == files["json"].keys()
    for name in files["c"]:
        assert files["c"][name] == files["json"][name], name


def test_a_copy_with_nulls_everywhere_is_identical(tmp_path, monkeypatch, spy):
    """A real export with NULL in every nullable integer and string column the reader fetches."""
    from overlapviz.ingest import ingest

    p = tmp_path / "report.sqlite"
    shutil.copy(ROOT / "tests" / "data" / "nsys" / "mock.sqlite", p)
    db = sqlite3.connect(p)
    for table, column, notnull in [(r[0], c[1], c[3]) for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
                                   for c in db.execute(f"PRAGMA table_info({r[0]})")]:  # fmt: skip
        if not notnull and column not in ("start", "end", "id", "globalPid", "globalTid", "deviceId", "correlationId"):
            db.execute(f'UPDATE "{table}" SET "{column}" = NULL WHERE rowid % 3 = 0')
    db.commit()
    db.close()
    files = {}
    for how in ("c", "json"):
        use(monkeypatch, how)
        spy.calls.clear()
        out = ingest([p], tmp_path / how, run_id="r", workers=1, progress=False)
        assert {c[0] for c in spy.calls} == ({"rows"} if how == "c" else set())
        files[how] = {str(q.relative_to(out)): q.read_bytes() for q in sorted(out.rglob("*")) if q.is_file()}
    assert files["c"] == files["json"]


def test_many_chunks_of_rows(tmp_path, monkeypatch, spy):
    """More rows than the C reader steps between two looks at signals (262,144)."""
    p = make(tmp_path / "a.db", "CREATE TABLE t (a INTEGER)", [(1,)])
    cte = "FROM (WITH RECURSIVE c(x) AS (SELECT 0 UNION ALL SELECT x + 1 FROM c LIMIT 600000) SELECT x FROM c)"
    got = both(monkeypatch, spy, p, {"x": "x", "odd": "CASE WHEN x % 2 THEN x END", "s": "printf('%d', x)"}, cte,
               strings=("s",))  # fmt: skip
    assert got["x"].to_pylist() == list(range(600_000)) and got["odd"].null_count == 300_000
    assert got["s"][599_999].as_py() == "599999"


def test_a_long_read_is_interrupted(tmp_path, monkeypatch):
    """Ctrl-C (here: an exception raised by a SIGALRM handler) stops a long read between chunks.

    A timer rings every 20 ms; the handler raises on its third call. A reader that looks at signals between chunks
    calls the handler at each chunk boundary (a call each), so it raises mid-read; one that never looks returns the
    whole result first, its rings merged into one pending signal: one call, no exception."""
    import signal

    class Stop(Exception):
        pass

    calls = []

    def stop(*_):
        calls.append(1)
        if len(calls) == 3:
            raise Stop

    use(monkeypatch, "c")
    assert sqlite_common.c_reader_available()  # bound
    p = make(tmp_path / "a.db", "CREATE TABLE t (a INTEGER)", [(1,)])
    uri = p.resolve().as_uri() + "?mode=ro&immutable=1"
    # 20M rows: 76 chunks (~5 s here); the first ring comes at 0.1 s
    sql = "WITH RECURSIVE c(x) AS (SELECT 0 UNION ALL SELECT x + 1 FROM c LIMIT 20000000) SELECT x FROM c"
    old = signal.signal(signal.SIGALRM, stop)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.1, 0.02)
        with pytest.raises(Stop):
            sqlite_common._sqlite.read(uri, sql, (), "i")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    # Stop is raised on the third call; a ring that comes between the raise and the timer's stop above (a loaded
    # machine) calls the handler again without raising: the count is at least 3, not exactly 3
    assert len(calls) >= 3


@pytest.mark.parametrize("encoding", ["UTF-8", "UTF-16le", "UTF-16be"])
def test_a_path_needing_uri_escapes_and_utf16_databases(tmp_path, monkeypatch, spy, encoding):
    """The C reader opens the URI ``open_readonly`` built (``#``, ``?``, ``%``, spaces, non-ASCII
    escaped), and hands text over as UTF-8 whatever the database's encoding."""
    d = tmp_path / "run #1 ?x"
    d.mkdir()
    p = d / "a b#c?d%e é.sqlite"
    db = sqlite3.connect(p)
    db.execute(f"PRAGMA encoding = '{encoding}'")
    db.execute("CREATE TABLE t (a INTEGER, s TEXT)")
    db.executemany("INSERT INTO t VALUES (?, ?)", [(1, "héllo"), (2, None), (3, "x€"), (4, "")])
    db.commit()
    db.close()
    got = both(monkeypatch, spy, p, {"a": "a", "s": "s"}, "FROM t ORDER BY a", strings=("s",))
    assert got["s"].to_pylist() == ["héllo", None, "x€", ""] and got["a"].to_pylist() == [1, 2, 3, 4]
