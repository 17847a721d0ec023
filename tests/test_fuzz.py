"""A property-based fuzzer of ``overlapviz ingest``: real traces mutated in their bytes and in
their JSON structure, each ingested through the CLI, checking the promise of
docs/robustness.md whatever the input:

* never a traceback: exit 0, or exit 1 with one line ``Error: ...`` naming the file;
* never a half-written dataset: on exit 1 the workspace is byte for byte as it was (nothing
  at ``-o``, no temporary directory beside it);
* exit 0 means a readable dataset, whose every activity ends no earlier than it starts
  (a number that wrapped around int64 would break that).

Bounded for CI (about 10-20 s on two cores, derandomized so a run is reproducible);
``OVERLAPVIZ_FUZZ_EXAMPLES=N`` tries N inputs per property instead, with a fresh seed each
run when ``OVERLAPVIZ_FUZZ_RANDOM=1``.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import tempfile
from pathlib import Path

import pyarrow.compute as pc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from _hostile import (
    EVENT_SYNC,
    MI250,
    NSYS,
    ROCPROF_V1_CSV,
    ROCPROF_V2,
    ROCPROF_V3,
    Run,
    check_dataset,
    invoke,
    shown,
    snapshot,
)

from overlapviz.dataset import schema

EXAMPLES = int(os.environ.get("OVERLAPVIZ_FUZZ_EXAMPLES", "0")) or None
FUZZ = settings(
    max_examples=EXAMPLES or 60,
    deadline=None,
    derandomize=not os.environ.get("OVERLAPVIZ_FUZZ_RANDOM"),
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example],
)


def check_promise(name: str, data: bytes, *, extra: dict[str, bytes] | None = None) -> None:
    """Ingest ``data`` saved as ``name`` (with ``extra`` files beside it) and check the promise."""
    ws = Path(tempfile.mkdtemp(prefix="ovz-fuzz-"))
    try:
        src = ws / "in" / name
        src.parent.mkdir()
        src.write_bytes(data)
        for other, content in (extra or {}).items():
            (ws / "in" / other).write_bytes(content)
        (ws / "out").mkdir()
        run = Run([src], ws / "out" / "ds")
        before = snapshot(ws)
        code, text, exc = invoke(run)
        assert exc is None or isinstance(exc, SystemExit), f"{exc!r}\n{text}"
        assert "Traceback" not in text, text
        if code == 0:
            check_dataset(run.out)
            k = schema.read_kernels(run.out, ["start_ns", "end_ns"])
            if k.num_rows:
                assert pc.all(pc.greater_equal(k.column("end_ns"), k.column("start_ns"))).as_py() is not False
            return
        assert code == 1, text
        lines = text.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("Error: "), text
        assert shown(src) in lines[0] or shown(ws / "in") in lines[0], lines[0]
        assert "internal error" not in lines[0], lines[0]  # the problem named, not a bug to report
        assert snapshot(ws) == before, "a refused input changed the workspace"
    finally:
        shutil.rmtree(ws, ignore_errors=True)


# --- bytes ---------------------------------------------------------------------------------------

_RAW: dict[str, bytes] = {}


def raw(path: Path, limit: int | None = None) -> bytes:
    key = f"{path}:{limit}"
    if key not in _RAW:
        data = path.read_bytes()
        data = gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data
        _RAW[key] = data[:limit] if limit else data
    return _RAW[key]


def v1_csv_head() -> bytes:
    lines = raw(ROCPROF_V1_CSV).split(b"\n")[:60]
    return b"\n".join(lines) + b"\n"


TEXT_BASES = {
    "rank0.json": lambda: raw(EVENT_SYNC),
    "trace.json": lambda: raw(MI250),
    "kernel_trace.csv": lambda: raw(ROCPROF_V3 / "kernel_trace.csv"),
    "results.csv": v1_csv_head,
    "golden.txt": lambda: raw(ROCPROF_V2),
}


@st.composite
def mutated_bytes(draw, base: bytes) -> bytes:
    """``base`` with a few edits: bytes flipped, a span cut, repeated or replaced, the end cut."""
    data = bytearray(base)
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["flip", "cut", "repeat", "insert", "truncate", "digits"]))
        n = len(data)
        if n == 0:
            break
        i = draw(st.integers(0, n - 1))
        j = min(n, i + draw(st.integers(1, 64)))
        if op == "flip":
            data[i] ^= draw(st.integers(1, 255))
        elif op == "cut":
            del data[i:j]
        elif op == "repeat":
            data[i:i] = data[i:j] * draw(st.integers(1, 3))
        elif op == "insert":
            data[i:i] = draw(st.sampled_from([b"\x00", b"\xff\xfe", b"]", b"}", b"{", b'"', b",", b"NaN",
                                              b"-", b"9" * 30, b"true", b"\n", b"\\u0000", b"\\udcff"]))  # fmt: skip
        elif op == "truncate":
            del data[i:]
        elif op == "digits":  # a number made much longer: past int32, int64, double
            while i < n and not chr(data[i]).isdigit():
                i += 1
            data[i:i] = b"9" * draw(st.integers(1, 25))
    return bytes(data)


@FUZZ
@given(st.data())
def test_fuzz_bytes_of_text_traces(data):
    name = data.draw(st.sampled_from(sorted(TEXT_BASES)))
    mutated = data.draw(mutated_bytes(TEXT_BASES[name]()))
    if data.draw(st.booleans()):
        name, mutated = name + ".gz", gzip.compress(mutated, compresslevel=1)
    check_promise(name, mutated)


@FUZZ
@given(st.data())
def test_fuzz_bytes_of_gzip_streams(data):
    base = EVENT_SYNC.read_bytes()
    check_promise("rank0.json.gz", data.draw(mutated_bytes(base)))


@settings(FUZZ, max_examples=EXAMPLES or 20)
@given(st.data())
def test_fuzz_pages_of_an_nsys_export(data):
    base = bytearray(NSYS.read_bytes())
    for _ in range(data.draw(st.integers(1, 3))):
        page = data.draw(st.integers(0, len(base) // 4096 - 1))
        at = page * 4096 + data.draw(st.integers(0, 4000))
        base[at: at + 16] = data.draw(st.binary(min_size=16, max_size=16))
    check_promise("report.sqlite", bytes(base))


# --- JSON structure -------------------------------------------------------------------------------

HOSTILE_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([2**31, 2**63 - 1, 2**63, 2**64, -(2**63) - 1, 10**30]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
    st.sampled_from([[], {}, [1, 2, 3], [True, 1, 1], {"a": 1}, "\udcff", "12", "1e400"]),
)


def paths(doc, prefix=(), depth: int = 6):
    """Every (path, value) in ``doc``: the first six items of a list, six levels down at most."""
    if depth == 0:
        return
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield prefix + (k,), v
            yield from paths(v, prefix + (k,), depth - 1)
    elif isinstance(doc, list):
        for i, v in enumerate(doc[:6]):
            yield prefix + (i,), v
            yield from paths(v, prefix + (i,), depth - 1)


def set_at(doc, path, value) -> None:
    for p in path[:-1]:
        doc = doc[p]
    if value is _DELETE:
        del doc[path[-1]]
    else:
        doc[path[-1]] = value


_DELETE = object()
_DOCS: dict[Path, dict] = {}


def kineto_doc(path: Path) -> dict:
    if path not in _DOCS:
        _DOCS[path] = json.loads(raw(path))
    return json.loads(json.dumps(_DOCS[path]))


@st.composite
def mutated_doc(draw):
    base = draw(st.sampled_from([EVENT_SYNC, MI250]))
    doc = kineto_doc(base)
    # favour the events the reader reads (kernels, runtime calls, syncs) and the document's facts
    events = [i for i, e in enumerate(doc["traceEvents"])
              if isinstance(e, dict) and e.get("cat") in ("kernel", "cuda_runtime", "cuda_sync", "gpu_memcpy",
                                                          "gpu_memset", "cpu_op", "user_annotation")]  # fmt: skip
    for _ in range(draw(st.integers(1, 3))):
        where = draw(st.sampled_from(["event", "event", "event", "top"]))
        if where == "event" and events:
            i = draw(st.sampled_from(events))
            choices = list(paths(doc["traceEvents"][i], ("traceEvents", i)))
        else:
            choices = [(p, v) for p, v in paths(doc) if p[0] != "traceEvents"]
        if not choices:
            continue
        path, _ = draw(st.sampled_from(choices))
        op = draw(st.sampled_from(["replace", "replace", "delete", "nest"]))
        if op == "delete":
            set_at(doc, path, _DELETE)
        elif op == "nest":
            depth = draw(st.sampled_from([10, 1000, 20_000]))
            value = [1]
            for _ in range(depth):
                value = [value]
            set_at(doc, path, value)
        else:
            set_at(doc, path, draw(HOSTILE_VALUES))
    if draw(st.booleans()):  # a duplicated event
        doc["traceEvents"].append(doc["traceEvents"][draw(st.sampled_from(events))])
    return doc


def dumps(doc) -> bytes:
    import sys

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 50_000))  # json.dumps of the nested values themselves
    try:
        return json.dumps(doc, allow_nan=True).encode("utf-8", "surrogatepass")
    finally:
        sys.setrecursionlimit(limit)


@settings(FUZZ, max_examples=EXAMPLES or 100)
@given(mutated_doc(), st.booleans())
def test_fuzz_json_structure_of_kineto_traces(doc, gz):
    text = dumps(doc)
    check_promise("rank0.json.gz" if gz else "rank0.json", gzip.compress(text, compresslevel=1) if gz else text)


class Opaque:
    """A document hypothesis reports by its JSON's hash (its repr of 20,000 nested lists overflows the stack)."""

    def __init__(self, doc):
        self.doc = doc

    def __repr__(self) -> str:
        import hashlib

        return f"<document sha256 {hashlib.sha256(dumps(self.doc)).hexdigest()[:16]}>"


@settings(FUZZ, max_examples=EXAMPLES or 60)
@given(mutated_doc().map(Opaque))
def test_fuzz_both_kineto_readers_agree(doc):
    """The C scanner and the Python reader (OVERLAPVIZ_PURE_PYTHON=1) give the same rank or
    the same error for any mutated Kineto document (args made a list, null, ... included;
    the ingest driver words a RecursionError, both must raise it alike)."""
    from overlapviz.ingest import chrome, chrome_columns

    if chrome_columns._kineto is None:
        pytest.skip("the C scanner is not built")
    ws = Path(tempfile.mkdtemp(prefix="ovz-fuzz-"))
    try:
        src = ws / "rank0.json"
        src.write_bytes(dumps(doc.doc))
        out = []
        for pure in ("1", "0"):
            old = os.environ.get("OVERLAPVIZ_PURE_PYTHON")
            os.environ["OVERLAPVIZ_PURE_PYTHON"] = pure
            try:
                (trace,) = chrome.ChromeReader().read(src)
                out.append((trace.rank, trace.kernels, trace.steps, trace.syncs, trace.devices, trace.info))
            except ValueError as exc:
                out.append(str(exc))
            except RecursionError:
                out.append("RecursionError")
            finally:
                os.environ.pop("OVERLAPVIZ_PURE_PYTHON") if old is None else os.environ.__setitem__("OVERLAPVIZ_PURE_PYTHON", old)
        pure, fast = out
        assert type(pure) is type(fast), out
        if isinstance(pure, str):
            assert pure == fast
        else:
            assert pure[0] == fast[0] and pure[5] == fast[5]
            assert all(a.equals(b) for a, b in zip(pure[1:5], fast[1:5]))
    finally:
        shutil.rmtree(ws, ignore_errors=True)


@st.composite
def mutated_v3_json(draw):
    from _hostile import small_v3_json

    doc = small_v3_json()
    tool = doc["rocprofiler-sdk-tool"][0]
    targets = [("buffer_records", k, 0) for k, v in tool["buffer_records"].items() if isinstance(v, list) and v]
    targets += [("agents", i) for i in range(min(2, len(tool.get("agents") or [])))]
    targets += [("kernel_symbols",), ("metadata",)]
    for _ in range(draw(st.integers(1, 3))):
        target = draw(st.sampled_from(targets))
        node = tool
        for p in target:
            node = node[p]
        choices = list(paths(node, target))
        if not choices:
            continue
        path, _ = draw(st.sampled_from(choices))
        value = _DELETE if draw(st.integers(0, 4)) == 0 else draw(HOSTILE_VALUES)
        set_at(tool, path, value)
    return doc


@settings(FUZZ, max_examples=EXAMPLES or 40)
@given(mutated_v3_json())
def test_fuzz_json_structure_of_rocprof_v3(doc):
    check_promise("908_results.json", dumps(doc))


@FUZZ
@given(st.data())
def test_fuzz_cells_of_rocprof_v3_csv(data):
    """One cell of the kernel or copy trace replaced by a hostile value (its companions beside it)."""
    import csv
    import io

    which = data.draw(st.sampled_from(["kernel_trace.csv", "memory_copy_trace.csv"]))
    rows = list(csv.reader(io.StringIO(raw(ROCPROF_V3 / which).decode())))
    for _ in range(data.draw(st.integers(1, 3))):
        r = data.draw(st.integers(1, len(rows) - 1))
        c = data.draw(st.integers(0, len(rows[0]) - 1))
        rows[r][c] = data.draw(st.sampled_from(["", "-1", "NaN", "inf", "true", "1.5", "9" * 20, str(2**63),
                                                str(2**31), "Agent 99999999999", "x", "\x00", "\ufeff"]))  # fmt: skip
    buf = io.StringIO()
    csv.writer(buf, quoting=csv.QUOTE_ALL, lineterminator="\n").writerows(rows)
    others = {p.name: p.read_bytes() for p in ROCPROF_V3.iterdir() if p.name != which}
    name = which
    check_promise(name, buf.getvalue().encode("utf-8", "surrogatepass"), extra=others)


def test_fuzzer_bases_are_accepted_unmutated():
    """The properties mean something only if the real traces they start from ingest."""
    for name, base in TEXT_BASES.items():
        extra = {p.name: p.read_bytes() for p in ROCPROF_V3.iterdir() if p.name != name} if name == "kernel_trace.csv" else None
        ws = Path(tempfile.mkdtemp(prefix="ovz-fuzz-"))
        try:
            (ws / "in").mkdir()
            (ws / "in" / name).write_bytes(base())
            for other, content in (extra or {}).items():
                (ws / "in" / other).write_bytes(content)
            code, text, _ = invoke(Run([ws / "in" / name], ws / "ds"))
            assert code == 0, f"{name}: {text}"
        finally:
            shutil.rmtree(ws, ignore_errors=True)


pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")
