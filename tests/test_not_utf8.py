"""Names that are not valid UTF-8 in a real Kineto trace: read with U+FFFD, everything else exact.

PyTorch writes Python function names as it finds them; a real H100 NVL trace held five
names a JSON parser refuses ("str is not valid UTF-8: surrogates not allowed"). The trace
here is the real AlexNet/A100 trace of tests/data/kineto_real with three of its names
broken the two ways such names come: a JSON escape of an unpaired surrogate (``\\udcff``,
``\\ud800``) and raw bytes that are not UTF-8 (a UTF-8 sequence cut short, a stray 0xff).
Both readers (the C scanner, and the Python reader, also with an odd event added) must read
it, with U+FFFD exactly where the bad text was, and every other value as in the unbroken trace.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import orjson
import pytest

from overlapviz.ingest import chrome, chrome_columns
from overlapviz.ingest.text import REPAIRED_KEY
from overlapviz.dataset.schema import read_frame
from overlapviz.testing import ingest_cli

REAL = Path(__file__).parent / "data" / "kineto_real" / "hta_alexnet_cuda_sync" / "benchmark_result_2869224_1695835535_trace.json.gz"
PATHS = ["scanner", "python", "python_odd"]
# an instant event with a string where grid's list belongs: read past
_UNTYPABLE = {"ph": "i", "cat": "cpu_instant_event", "name": "odd", "ts": 1.0, "args": {"grid": "none"}}


def _broken() -> tuple[bytes, bytes, dict[str, str], int]:
    """(the real trace, the same with three kernel names broken, original name -> expected name,
    how many JSON strings were broken)."""
    raw = gzip.decompress(REAL.read_bytes())
    kernels = sorted({e["name"] for e in json.loads(raw)["traceEvents"] if e.get("cat") == "kernel"})
    a, b, c = kernels[:3]
    edits = {  # the JSON text of the name -> (the broken JSON text, the name read back)
        a: (a + "\\udcff", a + "\ufffd"),  # a lone low surrogate escape
        b: ("\\ud800" + b, "\ufffd" + b),  # a lone high surrogate escape
        c: (c[:5] + "\xe4\xb8" + c[5:], c[:5] + "\ufffd" + c[5:]),  # a cut UTF-8 sequence (bytes below)
    }
    out, n = raw, 1  # the key below
    for name, (text, _) in edits.items():
        old = json.dumps(name).encode()
        assert old in out
        new = b'"' + text.encode("latin-1" if "\xe4" in text else "ascii") + b'"'
        n += out.count(old)
        out = out.replace(old, new)
    out = out.replace(b'"schemaVersion"', b'"\xff": 1, "schemaVersion"', 1)  # a key that is not UTF-8 either
    return raw, out, {name: want for name, (_, want) in edits.items()}, n


def _read(doc: bytes, tmp_path: Path, how: str, monkeypatch):
    if how == "scanner" and chrome_columns._kineto is None:
        pytest.skip("the C scanner is not built")
    if how == "python_odd":
        doc = doc.replace(b'"traceEvents": [', b'"traceEvents": [' + orjson.dumps(_UNTYPABLE) + b",", 1)
    path = tmp_path / f"{how}.json"
    path.write_bytes(doc)
    monkeypatch.setenv("OVERLAPVIZ_PURE_PYTHON", "0" if how == "scanner" else "1")
    (trace,) = chrome.ChromeReader().read(path)
    return trace


@pytest.mark.parametrize("how", PATHS)
def test_names_not_utf8_read_with_replacement(tmp_path, monkeypatch, how):
    raw, broken, want, n = _broken()
    assert b'"traceEvents": [' in raw
    (tmp_path / "good").mkdir()
    good = _read(raw, tmp_path / "good", how, monkeypatch)
    bad = _read(broken, tmp_path, how, monkeypatch)
    assert bad.info[REPAIRED_KEY] == n and REPAIRED_KEY not in good.info
    names = [want.get(n, n) for n in good.kernels.column("name").to_pylist()]
    assert bad.kernels.column("name").to_pylist() == names
    assert sum(n != m for n, m in zip(names, good.kernels.column("name").to_pylist())) >= 3
    rest = [c for c in good.kernels.column_names if c != "name"]
    assert bad.kernels.select(rest).equals(good.kernels.select(rest))


def test_one_warning_per_file_with_the_count(tmp_path):
    _, broken, _, n = _broken()
    src = tmp_path / "trace.json"
    src.write_bytes(broken)
    out, result = ingest_cli(tmp_path, src)
    lines = [line for line in result.output.splitlines() if "UTF-8" in line]
    assert lines == [f"warning: {src}: {n} strings not valid UTF-8 (bytes that are not UTF-8, unpaired surrogates) "
                     "read with U+FFFD in their place"]  # fmt: skip
    assert "\ufffd" in "".join(read_frame(out, "kernels")["name"])


# --- SQLite exports: text columns that are not UTF-8 ------------------------------------------

NSYS_MOCK = Path(__file__).parent / "data" / "nsys" / "mock.sqlite"
ROCPD_REAL = Path(__file__).parent / "data" / "rocpd" / "mi300x_rocm711_ck_bmm" / "28_results.db"


def _cut(column: str) -> str:
    """SQL: ``column``'s text with a cut UTF-8 sequence (0xE4 0xB8) appended, stored as TEXT."""
    return f"{column} = CAST(CAST({column} AS BLOB) || x'e4b8' AS TEXT)"


def _break_names(db_path: Path, fmt: str) -> None:
    import sqlite3

    db = sqlite3.connect(db_path)
    if fmt == "nsys":
        db.execute(f"UPDATE StringIds SET {_cut('value')} WHERE id IN (SELECT shortName FROM CUPTI_ACTIVITY_KIND_KERNEL "
                   "UNION SELECT demangledName FROM CUPTI_ACTIVITY_KIND_KERNEL)")  # fmt: skip
    else:
        (table,) = db.execute("SELECT name FROM sqlite_master WHERE type = 'table' "
                              "AND name LIKE 'rocpd_info_kernel_symbol_%'").fetchone()  # fmt: skip
        db.execute(f"UPDATE {table} SET {_cut('kernel_name')}, {_cut('display_name')} WHERE kernel_name LIKE '%kentry%'")
    db.commit()
    db.close()


@pytest.mark.parametrize("fmt", ["nsys", "rocpd"])
def test_sqlite_names_not_utf8(tmp_path, fmt):
    """Nsight Systems and rocpd: a kernel name whose stored text is not UTF-8 is read with
    U+FFFD for the bad bytes, the rest of the export as before, and one warning line."""
    import shutil

    src = NSYS_MOCK if fmt == "nsys" else ROCPD_REAL
    good = tmp_path / "good"
    good.mkdir()
    shutil.copy(src, good)
    bad = tmp_path / "bad"
    bad.mkdir()
    copy = Path(shutil.copy(src, bad))
    _break_names(copy, fmt)
    want, _ = ingest_cli(tmp_path, good / src.name, name="want")
    got, result = ingest_cli(tmp_path, copy, name="got")
    warnings = [line for line in result.output.splitlines() if line.startswith("warning:") and "UTF-8" in line]
    assert len(warnings) == 1 and str(copy) in warnings[0], result.output
    a, b = read_frame(want, "kernels"), read_frame(got, "kernels")
    changed = a["name"] != b["name"]
    assert changed.any()
    assert (b.loc[changed, "name"] == a.loc[changed, "name"] + "\ufffd").all()
    rest = [c for c in a.columns if c not in ("name", "run_id")]
    assert a[rest].equals(b[rest])
