"""The C scanner (overlapviz/ingest/_kineto.c) against the Python readers it stands in for.

Every Kineto trace in tests/data, and random documents (hypothesis) in every shape the
scanner claims to read, must give the same RankTrace through both paths; malformed
JSON must make the scanner hand over (Unsupported), never crash and never return.
"""

from __future__ import annotations

import json
import math
import os
from decimal import Decimal
from fractions import Fraction
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from overlapviz.ingest import chrome, chrome_columns, chrome_events

DATA = Path(__file__).parent / "data"
KINETO = sorted(
    p for p in DATA.rglob("*.json*")
    if p.name.startswith(("trace_rank", "rank", "sampled_rank", "nccl_data", "resnet", "gpu_only", "gaunernst", "h200_torch",
                          "transformer_stack"))
)  # fmt: skip
# real traces with cuda_sync records, sync calls, epoch-scale integer µs, zero-length memsets
KINETO_REAL = sorted((DATA / "kineto_real").rglob("*.json.gz"))
CATS = chrome_columns._CATS
META_KEYS = chrome_events.META_KEYS

needs_c = pytest.mark.skipif(chrome_columns._kineto is None, reason="the C scanner is not built (no C compiler)")


def test_scanner_is_built_where_required():
    """.ci/run sets OVERLAPVIZ_REQUIRE_C=1: there a failed build must fail the suite, not skip it."""
    if os.environ.get("OVERLAPVIZ_REQUIRE_C", "") in ("", "0"):
        pytest.skip("OVERLAPVIZ_REQUIRE_C is not set")
    assert chrome_columns._kineto is not None


def _read(path: Path, pure: bool, monkeypatch):
    monkeypatch.setenv("OVERLAPVIZ_PURE_PYTHON", "1" if pure else "0")
    try:
        return chrome.ChromeReader().read(path), None
    except ValueError as exc:
        return None, str(exc)


def _same(a, b) -> bool:
    return all(
        x.rank == y.rank and x.kernels.equals(y.kernels) and x.steps.equals(y.steps)
        and x.devices.equals(y.devices) and x.info == y.info and x.syncs.equals(y.syncs)
        for x, y in zip(a, b)
    ) and len(a) == len(b)  # fmt: skip


@needs_c
@pytest.mark.parametrize("path", KINETO, ids=lambda p: str(p.relative_to(DATA)))
def test_real_traces_read_alike(path, monkeypatch):
    assert len(KINETO) >= 15
    raw = chrome.read_bytes(path)
    assert chrome_columns.scan_tables(raw) is not None
    pure, err_pure = _read(path, True, monkeypatch)
    fast, err_fast = _read(path, False, monkeypatch)
    assert err_pure is None and err_fast is None
    assert _same(pure, fast)


@needs_c
@pytest.mark.parametrize("path", KINETO_REAL, ids=lambda p: p.parent.name + "/" + p.name[:24])
def test_real_traces_with_syncs_read_alike(path, monkeypatch):
    # roctracer's hipMemcpyWithStream "stream": "0x0" is the Python reader's to judge
    handed_over = path.name.startswith("mi250_minitoy")
    assert (chrome_columns.scan_tables(chrome.read_bytes(path)) is None) == handed_over
    pure, err_pure = _read(path, True, monkeypatch)
    fast, err_fast = _read(path, False, monkeypatch)
    assert err_pure is None and err_fast is None, (err_pure, err_fast)
    assert _same(pure, fast)


# --- random documents --------------------------------------------------------------------

_NAMES = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12) | st.sampled_from(
    ["ProfilerStep#3", "ovz_iter#7", "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)",
     "cudaLaunchKernel", "hipExtModuleLaunchKernel", "record_param_comms", 'q"uote\\back\tslash', "\u00e9\U0001f600",
     "cudaEventRecord", "cudaStreamWaitEvent_ptsz", "hipEventRecordWithFlags", "cudaDeviceSynchronize", "cudaEventQuery",
     "Stream Wait Event", "Event Sync", "Context Sync", "Stream Sync"]
)  # fmt: skip
_INT = st.integers(min_value=-(2**63), max_value=2**63 - 1)
_SMALL = st.integers(min_value=0, max_value=70000)


def _ts_text(v: float) -> str:
    return f"{v:.3f}"


_MAX_US = 9_223_372_036_854_774  # whole µs that, with any fraction, int64 ns hold
_TS = st.one_of(
    st.floats(min_value=0, max_value=2**42, allow_nan=False).map(lambda v: ("raw", _ts_text(v))),
    st.integers(min_value=0, max_value=2**53).map(lambda v: ("raw", str(v))),
    st.floats(min_value=1e-300, max_value=9.2e15).map(lambda v: ("raw", repr(v))),
    st.floats(min_value=0, max_value=1e6, allow_nan=False).map(lambda v: ("str", repr(v))),
    # epoch-scale µs with ns and sub-ns digits (a double would lose them), signed
    st.tuples(st.integers(-_MAX_US, _MAX_US), st.integers(0, 10**7 - 1), st.integers(1, 7)).map(
        lambda t: ("raw", f"{t[0]}.{t[1] % 10 ** t[2]:0{t[2]}d}")),
    st.tuples(st.integers(1, 10**6), st.integers(-12, 9)).map(lambda t: ("raw", f"{t[0]}e{t[1]}")),
)
_ARG_KEYS = ["device", "stream", "correlation", "registers per thread", "shared memory", "bytes", "External id",
             "wait_on_stream", "wait_on_cuda_event_id", "wait_on_cuda_event_record_corr_id", "Group size",
             "In msg nelems", "Out msg nelems", "Seq"]  # fmt: skip


@st.composite
def _event(draw):
    ev = {}
    if draw(st.booleans()):
        ev["ph"] = draw(st.sampled_from(["X", "X", "X", "f", "s", "i", "M"]))
    if draw(st.integers(0, 9)):
        ev["cat"] = draw(st.sampled_from(
            ["kernel", "Kernel", "gpu_memcpy", "Memset", "cuda_runtime", "cuda_driver", "Runtime", "cpu_op",
             "user_annotation", "python_function", "ac2g", "Trace", "gpu_user_annotation", "cuda_sync"]
        ))  # fmt: skip
    if draw(st.integers(0, 9)):
        ev["name"] = draw(_NAMES)
    for key in ("pid", "tid"):
        pick = draw(st.integers(0, 6))
        if pick == 0:
            continue
        ev[key] = draw(_INT) if pick < 4 else (str(draw(_SMALL)) if pick == 4 else draw(st.sampled_from(["Spans", "PyTorch Profiler", "Traces"])))
    for key in ("ts", "dur"):
        if draw(st.integers(0, 12)):
            ev[key] = draw(_TS)
    if draw(st.integers(0, 4)):
        args = {}
        for key in _ARG_KEYS:
            pick = draw(st.integers(0, 5))
            if pick in (1, 2, 3):
                args[key] = draw(_SMALL) if pick < 3 else draw(_INT)
            elif pick == 4:
                args[key] = str(draw(_SMALL))
        for key in ("grid", "block"):
            if draw(st.booleans()):
                args[key] = draw(st.lists(st.integers(1, 2**31), max_size=4))
        if draw(st.booleans()):
            args["Collective name"] = draw(st.sampled_from(["allreduce", "all_gather", "_allgather_base", ""]))
        for key, values in (("Process Group Name", ["0", "3", ""]), ("Process Group Ranks", ["[0, 1]", "[]"]),
                            ("dtype", ["Float", "BFloat16"])):  # fmt: skip
            if draw(st.integers(0, 3)) == 0:
                args[key] = draw(st.sampled_from(values) | _NAMES)
        junk = st.recursive(
            st.none() | st.booleans() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=5) | _INT,
            lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
            max_leaves=6,
        )
        for key in draw(st.lists(st.sampled_from(["Input Dims", "queued", "cbid", "Sequence number", "context"]), max_size=3, unique=True)):
            args[key] = draw(junk)
        keys = draw(st.permutations(list(args)))
        ev["args"] = {k: args[k] for k in keys}
    order = draw(st.permutations(list(ev)))
    return {k: ev[k] for k in order}


def _dumps(value, indent, ascii_only) -> str:
    """json.dumps, except that ts/dur pairs ("raw", text) are written as the number text itself."""
    if isinstance(value, tuple):
        kind, text = value
        return text if kind == "raw" else json.dumps(text)
    if isinstance(value, dict):
        sep = ",\n" + " " * indent if indent else ", "
        return "{" + sep.join(f"{json.dumps(k, ensure_ascii=ascii_only)}: {_dumps(v, indent, ascii_only)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        sep = ",\n" + " " * indent if indent else ","
        return "[" + sep.join(_dumps(v, indent, ascii_only) for v in value) + "]"
    return json.dumps(value, ensure_ascii=ascii_only)


@st.composite
def _document(draw):
    events = draw(st.lists(_event(), max_size=25))
    # a few kernels with sound times, so most documents get past the duration checks
    for i in range(draw(st.integers(0, 4))):
        events.append({"ph": "X", "cat": "kernel", "name": f"k{i}", "pid": 0, "tid": 7, "ts": ("raw", f"{100 + i}.5"),
                       "dur": ("raw", "2.125"), "args": {"correlation": i, "device": 0, "stream": 7}})  # fmt: skip
    # and sound sync records: a record, a wait (as CUPTI writes one) and a context sync
    if draw(st.booleans()):
        events += [
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaEventRecord", "pid": 9, "tid": 9, "ts": ("raw", "90.25"),
             "dur": ("raw", "1"), "args": {"correlation": 40}},
            {"ph": "X", "cat": "cuda_sync", "name": "Stream Wait Event", "pid": 0, "tid": 20, "ts": ("raw", "95"),
             "dur": ("raw", "0.5"), "args": {"cuda_sync_kind": "Stream Wait Event", "wait_on_stream": 7, "stream": 20,
             "wait_on_cuda_event_record_corr_id": 40, "wait_on_cuda_event_id": 1, "correlation": 41, "device": 0}},
            {"ph": "X", "cat": "cuda_sync", "name": "Context Sync", "pid": 0, "tid": -1, "ts": ("raw", "99"),
             "dur": ("raw", "2"), "args": {"stream": draw(st.sampled_from([-1, 4294967295])), "correlation": 42,
             "wait_on_stream": -1, "device": 0}},
        ]  # fmt: skip
    events = draw(st.permutations(events))
    indent = draw(st.sampled_from([0, 1, 2, 4]))
    ascii_only = draw(st.booleans())
    body = _dumps(list(events), indent, ascii_only)
    if draw(st.integers(0, 5)) == 0:
        return body.encode()
    meta = {"traceEvents": None, "schemaVersion": 1, "distributedInfo": {"rank": draw(st.integers(0, 7)), "backend": "nccl"},
            "deviceProperties": [{"id": 0, "name": "NVIDIA H200", "computeMajor": 9, "computeMinor": 0, "warpSize": 32}],
            "baseTimeNanoseconds": 1700000000000000000, "displayTimeUnit": "ms"}  # fmt: skip
    keys = draw(st.permutations(list(meta)))
    parts = [f'"traceEvents": {body}' if k == "traceEvents" else f"{json.dumps(k)}: {json.dumps(meta[k])}" for k in keys]
    return ("{" + (",\n" if indent else ",").join(parts) + "}").encode()


@needs_c
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(doc=_document())
def test_random_documents_read_alike(doc, tmp_path, monkeypatch):
    path = tmp_path / "trace.json"
    path.write_bytes(doc)
    pure, err_pure = _read(path, True, monkeypatch)
    fast, err_fast = _read(path, False, monkeypatch)
    assert err_pure == err_fast
    if pure is not None:
        assert _same(pure, fast)
    # the scanner itself reads every document this strategy makes (nothing is handed over)
    assert chrome_columns._kineto.scan(doc, CATS, META_KEYS) is not None


@needs_c
@settings(max_examples=200, deadline=None)
@given(doc=_document(), data=st.data())
def test_malformed_json_is_handed_over(doc, data):
    cut = data.draw(st.integers(0, len(doc) - 1))
    broken = doc[:cut]
    if cut and data.draw(st.booleans()):  # or a byte in the middle changed
        broken = doc[:cut] + data.draw(st.sampled_from([b"{", b"]", b",", b'"', b"\\", b"\x01", b"nul"])) + doc[cut + 1:]
    try:
        json.loads(broken)
        return  # still valid JSON: nothing to check
    except (ValueError, UnicodeDecodeError):
        pass
    with pytest.raises(chrome_columns._kineto.Unsupported):
        chrome_columns._kineto.scan(broken, CATS, META_KEYS)


def _scan_one(event_json: str) -> dict:
    doc = ('{"traceEvents": [' + event_json + "]}").encode()
    out = chrome_columns._kineto.scan(doc, CATS, META_KEYS)
    gpu = chrome_columns._table(out["buckets"][0], chrome_events._GPU_EVENT)
    return gpu.to_pylist()[0]


def _exact_ns(text: str) -> int | None:
    """The rule, by exact rational arithmetic: µs * 1000 rounded to the nearest ns, ties to
    even (Python's round of a Fraction); None past int64."""
    ns = round(Fraction(Decimal(text)) * 1000)
    return ns if -(2**63) <= ns < 2**63 else None


@needs_c
@settings(max_examples=300, deadline=None)
@given(st.floats(min_value=0, max_value=9.2e15, allow_nan=False), st.sampled_from(["repr", "3f", "e", "17g", "9f"]))
def test_times_are_exact_ns(value, style):
    text = {"repr": repr(value), "3f": f"{value:.3f}", "e": f"{value:e}", "17g": f"{value:.17g}", "9f": f"{value:.9f}"}[style]
    row = _scan_one(f'{{"cat": "kernel", "name": "k", "ts": {text}, "dur": "{text}"}}')
    assert row["ts"] == row["dur"] == _exact_ns(text)
    assert chrome_events.ns_column([text], Path("t"), "GPU activity", "ts").to_pylist() == [_exact_ns(text)]


@needs_c
@pytest.mark.parametrize("text", ["9223372036854775.8075", "9223372036854776", "1e16", "-9223372036854775.809", "1e400"])
def test_times_past_int64_are_handed_over(text):
    with pytest.raises(chrome_columns._kineto.Unsupported, match="past int64"):
        _scan_one(f'{{"cat": "kernel", "name": "k", "ts": {text}}}')
    # an event ingest does not keep is not judged
    assert chrome_columns._kineto.scan(f'[{{"cat": "python_function", "ts": {text}}}]'.encode(), CATS, ())["n_events"] == 1


@needs_c
@given(_NAMES, st.booleans())
def test_strings_unescape_like_json(name, ascii_only):
    row = _scan_one(json.dumps({"cat": "kernel", "name": name, "args": {"Collective name": name}}, ensure_ascii=ascii_only))
    assert row["name"] == name and row["Collective name"] == name


@needs_c
@pytest.mark.parametrize(
    "event",
    [
        '{"cat": "kernel", "ts": NaN}',  # not JSON
        '{"cat": "kernel", "ts": 1.}',
        '{"cat": "kernel", "ts": 01}',
        '{"cat": "kernel", "name": "\\ud800"}',  # unpaired surrogate
        '{"cat": "kernel", "name": "a\\x"}',
        '{"cat": "kernel", "args": {"device": 1.5}}',  # a float where an integer belongs
        '{"cat": "kernel", "args": {"device": 9223372036854775808}}',  # past int64
        '{"cat": "kernel", "args": {"grid": [1, "2"]}}',
        '{"cat": "kernel", "pid": "12 "}',  # float() reads it: the Python reader decides
        '{"cat": "kernel", "pid": "inf"}',
        '{"cat": "kernel", "name": 5}',
        '{"cat": "kernel", "ts": "soon"}',
        '{"cat": "kernel", "ts": true}',
        '{"cat": "kernel", "dur": [1]}',
        '{"cat": "kernel", "ts": " 12"}',  # Decimal reads it: the Python reader decides
        '{"cat": "cuda_sync", "args": {"wait_on_stream": 1.5}}',
        '{"cat": "cpu_op", "args": {"Process Group Name": 0}}',
        "[1, 2]",
    ],
)
def test_what_the_python_reader_must_judge(event):
    doc = ('{"traceEvents": [' + event + "]}").encode()
    with pytest.raises(chrome_columns._kineto.Unsupported):
        chrome_columns._kineto.scan(doc, CATS, META_KEYS)


@needs_c
@pytest.mark.parametrize("value", ["null", "[1]", '"x"', "3", "true"])
def test_args_not_an_object_is_said_not_handed_over(value):
    # worded like the Python reader words it: tests/test_hostile.py test_args_not_an_object_*
    doc = ('{"traceEvents": [{"cat": "kernel", "args": ' + value + "}]}").encode()
    with pytest.raises(chrome_columns._kineto.BadArgs) as err:
        chrome_columns._kineto.scan(doc, CATS, META_KEYS)
    assert err.value.args == (0, 0, None, value[0])


@needs_c
def test_documents_without_events_are_handed_over():
    for doc in (b"", b"  ", b"{}", b'{"traceEvents": {}}', b'{"a": 1}', b"[]x", b'{"traceEvents": [], "traceEvents": []}'):
        with pytest.raises(chrome_columns._kineto.Unsupported):
            chrome_columns._kineto.scan(doc, CATS, META_KEYS)


@needs_c
def test_meta_spans_and_counts():
    doc = b'{"schemaVersion": 1, "distributedInfo": {"rank": 3}, "traceEvents": [{"ph": "M"}, {"cat": "cpu_op", "name": "x"}]}'
    out = chrome_columns._kineto.scan(doc, CATS, META_KEYS)
    a, b = out["meta"]["distributedInfo"]
    assert json.loads(doc[a:b]) == {"rank": 3} and "schemaVersion" not in out["meta"]
    assert out["n_events"] == 2 and not out["top_list"]
    assert [len(bucket["cat"]) for bucket in out["buckets"]] == [0, 0, 1, 0]
    assert math.isclose(len(out["buckets"][2]["ts_valid"]), 1) and out["buckets"][2]["ts_valid"] == b"\x00"


@needs_c
@pytest.mark.parametrize("bad", [b"\xc2", b"\x80", b"\xc0\xaf", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xff"])
def test_invalid_utf8_anywhere_is_handed_over(bad):
    """Even in an event ingest ignores: the Python reader rejects the whole document."""
    for event in (b'{"cat": "python_function", "name": "' + bad + b'"}', b'{"cat": "kernel", "args": {"x' + bad + b'": 1}}'):
        with pytest.raises(chrome_columns._kineto.Unsupported):
            chrome_columns._kineto.scan(b'{"traceEvents": [' + event + b"]}", CATS, META_KEYS)
    good = "é€😀".encode()
    assert chrome_columns._kineto.scan(b'{"traceEvents": [{"cat": "cpu_op", "name": "' + good + b'"}]}', CATS, ())["n_events"] == 1


@needs_c
@pytest.mark.parametrize("field", ["name", "cat"])
def test_an_empty_string_first_in_its_column_is_read(field):
    # .ci/sanitize (UBSan) found memcpy(NULL, ..., 0) here: the column's buffer not yet allocated when its
    # first string is empty; this fails under that build on the old scanner
    event = {"ph": "X", "cat": "kernel", "name": "k", "ts": 1, "dur": 1, "pid": 0, "tid": 7, "args": {"stream": 7}}
    event[field] = ""
    doc = json.dumps({"traceEvents": [event, {**event, field: "x"}]}).encode()
    out = chrome_columns._kineto.scan(doc, CATS, META_KEYS)
    assert out["n_events"] == 2
