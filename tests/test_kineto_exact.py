"""Kineto ``ts``/``dur`` become int64 ns exactly, by every reader path, at epoch scale too.

The rule (chrome_events.decimal_us_to_ns, and _kineto.c's num_ns): integer µs * 1000 plus
the first three fractional digits; further digits round to the nearest ns, ties to even.
The reference here is exact rational arithmetic (``fractions.Fraction`` of the decimal
text, Python's ``round``, which ties to even). Paths: the C scanner, the Python reader,
and the Python reader on a document that also holds an odd event (a string where grid's
list belongs).

Edge cases: a double holds epoch-scale µs (1.7e15) only to 0.25 µs, so ns fractions
there are what a float detour loses; exponents (``1.5e3``); numeric strings; more than
three fractional digits (ties); times past int64 ns (rejected, naming the file, never
wrapped); ``true``/``false``/non-numeric strings (rejected); zero-length activities
(kept).
"""

from __future__ import annotations

import json
from decimal import Decimal
from fractions import Fraction
from pathlib import Path

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from overlapviz.ingest import chrome, chrome_columns
from overlapviz.ingest.chrome_events import decimal_us_to_ns

DATA = Path(__file__).parent / "data"
PATHS = ["scanner", "python", "python_odd"]
needs_c = pytest.mark.skipif(chrome_columns._kineto is None, reason="the C scanner is not built (no C compiler)")


def exact_ns(text: str) -> int:
    return round(Fraction(Decimal(text)) * 1000)


def _doc(events: list[dict]) -> bytes:
    """A Kineto document; a value ``("raw", text)`` is written as that JSON text."""
    raw = {}

    def sub(v):
        if isinstance(v, tuple):
            raw[f"@@{len(raw)}@@"] = v[1]
            return f"@@{len(raw) - 1}@@"
        return v

    events = [{k: sub(v) for k, v in e.items()} for e in events]
    text = orjson.dumps({"schemaVersion": 1, "traceEvents": events}).decode()
    for key, value in raw.items():
        text = text.replace(f'"{key}"', value)
    return text.encode()


def _kernel(i: int, ts: str, dur: str = "1.000", cat: str = "kernel") -> dict:
    return {"ph": "X", "cat": cat, "name": f"k{i}", "pid": 0, "tid": 7, "ts": ("raw", ts), "dur": ("raw", dur),
            "args": {"device": 0, "stream": 7, "correlation": i + 1}}  # fmt: skip


def _launch(i: int, ts: str) -> dict:
    return {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 9, "tid": 9, "ts": ("raw", ts),
            "dur": ("raw", "2"), "args": {"correlation": i + 1}}  # fmt: skip


# an instant event with a string where grid's list belongs: read past, whatever reads the document
_UNTYPABLE = {"ph": "i", "cat": "cpu_instant_event", "name": "odd", "ts": 1.0, "args": {"grid": "none"}}


def read(doc: bytes, tmp_path: Path, how: str, monkeypatch):
    if how == "python_odd":
        doc = doc.replace(b'"traceEvents":[', b'"traceEvents":[' + orjson.dumps(_UNTYPABLE) + b",", 1)
    path = tmp_path / f"{how}.json"
    path.write_bytes(doc)
    if how == "scanner" and chrome_columns._kineto is None:
        pytest.skip("the C scanner is not built")
    monkeypatch.setenv("OVERLAPVIZ_PURE_PYTHON", "0" if how == "scanner" else "1")
    (trace,) = chrome.ChromeReader().read(path)
    return trace


# --- the rule --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text,ns",
    [
        ("1694128201436255.123", 1_694_128_201_436_255_123),  # epoch µs with ns: a double says ...255.125
        ("1694128201436255", 1_694_128_201_436_255_000),
        ("0.0005", 0), ("0.0015", 2), ("0.0025", 2), ("0.00250001", 3),  # ties to even; above half up
        ("-0.0015", -2), ("-0.0025", -2), ("-0", 0),
        ("1.5e3", 1_500_000), ("1.5E-3", 2), ("2.5e-4", 0), ("1e-300", 0), ("15e-1", 1500),
        ("9223372036854775.807", 2**63 - 1), ("-9223372036854775.808", -(2**63)),
        ("-9223372036854775.8085", -(2**63)),  # .5 ns tie, 808 even: stays in range
        (" 20.5 ", 20_500), ("1_000", 1_000_000),  # strings: what Decimal reads
    ],
)  # fmt: skip
def test_rule(text, ns):
    assert decimal_us_to_ns(text) == ns


@pytest.mark.parametrize("text", ["9223372036854775.8075", "9223372036854776", "1e16", "-9223372036854775.809", "1e400",
                                  "1e100000000"])  # fmt: skip
def test_past_int64_overflows(text):
    with pytest.raises(OverflowError):
        decimal_us_to_ns(text)


@pytest.mark.parametrize("text", ["soon", "", "nan", "NaN", "inf", "-Infinity", "0x10", "1.2.3"])
def test_not_a_number(text):
    assert decimal_us_to_ns(text) is None


_DECIMAL = st.one_of(
    st.tuples(st.integers(-(10**16), 10**16), st.integers(0, 10**9), st.integers(1, 9)).map(
        lambda t: f"{t[0]}.{t[1] % 10 ** t[2]:0{t[2]}d}"),
    st.tuples(st.integers(-(10**25), 10**25), st.integers(-40, 20)).map(lambda t: f"{t[0]}e{t[1]}"),
    st.decimals(allow_nan=False, allow_infinity=False).map(str),
)  # fmt: skip


@settings(max_examples=500, deadline=None)
@given(_DECIMAL)
def test_rule_is_exact_rounding(text):
    want = exact_ns(text) if abs(Decimal(text)) < Decimal("1e17") else None
    if want is None or not -(2**63) <= want < 2**63:
        with pytest.raises(OverflowError):
            decimal_us_to_ns(text)
    else:
        assert decimal_us_to_ns(text) == want


# --- every path, end to end --------------------------------------------------------------

_EPOCH_US = st.integers(1_600_000_000_000_000, 1_800_000_000_000_000)  # 2020-2027 in µs


@st.composite
def _epoch_text(draw):
    whole = draw(_EPOCH_US)
    digits = draw(st.integers(0, 7))
    if not digits:
        return str(whole)
    return f"{whole}.{draw(st.integers(0, 10**digits - 1)):0{digits}d}"


@needs_c
@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(_epoch_text(), _epoch_text(), st.integers(0, 10**9)), min_size=1, max_size=8))
def test_epoch_scale_times_are_exact_on_every_path(tmp_path_factory, times):
    events = []
    for i, (ts, launch, dur) in enumerate(times):
        dur_text = f"{dur // 1000}.{dur % 1000:03d}"
        events += [_kernel(i, ts, dur_text), _launch(i, launch)]
    doc = _doc(events)
    tmp = tmp_path_factory.mktemp("exact")
    with pytest.MonkeyPatch.context() as mp:
        traces = [read(doc, tmp, how, mp) for how in PATHS]
    for t in traces:
        k = t.kernels.sort_by("correlation")
        assert k.column("start_ns").to_pylist() == [exact_ns(ts) for ts, _, _ in times]
        assert k.column("end_ns").to_pylist() == [exact_ns(ts) + d for ts, _, d in times]
        assert k.column("launch_ns").to_pylist() == [exact_ns(launch) for _, launch, _ in times]
    assert traces[0].kernels.equals(traces[1].kernels) and traces[1].kernels.equals(traces[2].kernels)


@pytest.mark.parametrize("how", PATHS)
def test_forms_of_a_time(tmp_path, monkeypatch, how):
    texts = ["1694128201436255.123", "1694128201436255.1235", "1694128201436255.1225", "1694128201436255.12251",
             "1.5e3", "1694128201436255", '"20.5"', "0.000", "1E+2"]  # fmt: skip
    trace = read(_doc([_kernel(i, t, dur="0") for i, t in enumerate(texts)]), tmp_path, how, monkeypatch)
    k = trace.kernels.sort_by("correlation")
    want = [exact_ns(t.strip('"')) for t in texts]
    assert want[1:4] == [1_694_128_201_436_255_124, 1_694_128_201_436_255_122, 1_694_128_201_436_255_123]
    assert k.column("start_ns").to_pylist() == want
    assert k.column("end_ns").to_pylist() == want  # zero-length: kept


@pytest.mark.parametrize("how", PATHS)
@pytest.mark.parametrize("field,text", [("ts", "9223372036854776"), ("ts", "-9.3e15"), ("dur", "1e17"), ("ts", "1e400")])
def test_time_past_int64_names_the_file(tmp_path, monkeypatch, how, field, text):
    ev = _kernel(0, "10")
    ev[field] = ("raw", text)
    with pytest.raises(ValueError) as exc:
        read(_doc([ev]), tmp_path, how, monkeypatch)
    msg = str(exc.value)
    assert msg.startswith(str(tmp_path / f"{how}.json")) and "int64" in msg and len(msg.splitlines()) == 1


@pytest.mark.parametrize("how", PATHS)
def test_end_past_int64_does_not_wrap(tmp_path, monkeypatch, how):
    with pytest.raises(ValueError, match=r"ends past what int64"):
        read(_doc([_kernel(0, "9223372036854775", dur="1")]), tmp_path, how, monkeypatch)


@pytest.mark.parametrize("how", PATHS)
@pytest.mark.parametrize("field,text", [("ts", "true"), ("dur", "false"), ("ts", '"soon"'), ("dur", "[1]"),
                                        ("ts", '{"us": 1}'), ("ts", '"NaN"')])  # fmt: skip
def test_not_a_time_names_the_file(tmp_path, monkeypatch, how, field, text):
    ev = _kernel(0, "10")
    ev[field] = ("raw", text)
    with pytest.raises(ValueError) as exc:
        read(_doc([ev]), tmp_path, how, monkeypatch)
    msg = str(exc.value)
    assert msg.startswith(str(tmp_path)) and repr(field) in msg and len(msg.splitlines()) == 1


def _raw_args(args: dict, **texts: str) -> tuple:
    """``args`` with the fields of ``texts`` (``shared_memory`` for "shared memory") written as those JSON texts."""
    fields = {k: orjson.dumps(v).decode() for k, v in args.items()} | {k.replace("_", " "): t for k, t in texts.items()}
    return ("raw", "{" + ", ".join(f"{orjson.dumps(k).decode()}: {t}" for k, t in fields.items()) + "}")


# an integer field holding a number that is not whole: pyarrow truncated "device": 1.5 to device 1 (the Python reader),
# and the C scanner read "1.5" as 1; both readers now refuse it with one message
@pytest.mark.parametrize("how", PATHS)
@pytest.mark.parametrize("where,text,label", [
    ("args.device", "1.5", "'args.device' holds 1.5"), ("args.device", '"1.5"', "'args.device' holds 1.5"),
    ("args.stream", "7.25e0", "'args.stream' holds 7.25e0"), ("args.correlation", "-0.5", "'args.correlation' holds -0.5"),
    ("pid", "0.5", "'pid' holds 0.5"), ("tid", '" 7.5 "', "'tid' holds 7.5"), ("args.grid", "[1.5, 1, 1]", "'args.grid' holds 1.5"),
    ("args.shared memory", '"128.5"', "'args.shared memory' holds 128.5"),
])  # fmt: skip
def test_a_number_that_is_not_whole_in_an_integer_field_names_the_file(tmp_path, monkeypatch, how, where, text, label):
    ev = _kernel(0, "10")
    if where.startswith("args."):
        ev["args"] = _raw_args(ev["args"], **{where[5:]: text})
    else:
        ev[where] = ("raw", text)
    with pytest.raises(ValueError) as exc:
        read(_doc([ev, _launch(0, "9")]), tmp_path, how, monkeypatch)
    assert str(exc.value) == f"{tmp_path / f'{how}.json'}: GPU activity events: field {label}, not a whole number"


@pytest.mark.parametrize("how", PATHS)
def test_whole_numbers_written_otherwise_are_read(tmp_path, monkeypatch, how):
    ev = _kernel(0, "10")
    ev["args"] = _raw_args(ev["args"], device="1.0", stream='"7"', grid="[2.0, 1e0, 1]")
    ev["pid"] = ("raw", "1e0")
    k = read(_doc([ev, _launch(0, "9")]), tmp_path, how, monkeypatch).kernels
    assert (k.column("device").to_pylist(), k.column("stream").to_pylist(), k.column("grid_x").to_pylist()) == ([1], [7], [2])


@pytest.mark.parametrize("pure", ["0", "1"])
def test_ingest_of_a_fractional_device_fails_and_writes_nothing(tmp_path, monkeypatch, pure):
    from click.testing import CliRunner

    from overlapviz.cli import main

    monkeypatch.setenv("OVERLAPVIZ_PURE_PYTHON", pure)
    ev = _kernel(0, "10")
    ev["args"] = _raw_args(ev["args"], device="1.5")
    trace = tmp_path / "rank0.json"
    trace.write_bytes(_doc([_kernel(1, "5"), ev, _launch(0, "9"), _launch(1, "4")]))
    result = CliRunner().invoke(main, ["ingest", str(trace), "-o", str(tmp_path / "ds"), "-q"])
    assert result.exit_code != 0
    assert result.output.strip() == f"Error: {trace}: GPU activity events: field 'args.device' holds 1.5, not a whole number"
    assert not (tmp_path / "ds").exists()


@pytest.mark.parametrize("how", PATHS)
def test_unkept_events_are_not_judged(tmp_path, monkeypatch, how):
    odd = [{"ph": "X", "cat": "python_function", "name": "f", "ts": ("raw", "1e400"), "dur": ("raw", "true")},
           {"ph": "i", "cat": "kernel", "name": "instant", "ts": ("raw", "9e99")}]  # fmt: skip
    trace = read(_doc([*odd, _kernel(0, "5.5")]), tmp_path, how, monkeypatch)
    assert trace.kernels.column("start_ns").to_pylist() == [5_500]


@pytest.mark.parametrize("how", PATHS)
def test_zero_length_activities_are_kept_and_negative_ones_rejected(tmp_path, monkeypatch, how):
    events = [_kernel(0, "10", dur="0"), _kernel(1, "11", dur="0.000", cat="gpu_memset"),
              _kernel(2, "12", dur="0", cat="gpu_memcpy"), _kernel(3, "13", dur="2")]  # fmt: skip
    k = read(_doc(events), tmp_path, how, monkeypatch).kernels.sort_by("correlation")
    assert k.column("end_ns").to_pylist() == [10_000, 11_000, 12_000, 15_000]
    with pytest.raises(ValueError, match=r"gpu_memset event 'k1' has negative duration \(-0\.001 us; 1 such events\)"):
        read(_doc([_kernel(0, "10"), _kernel(1, "11", dur="-0.001", cat="gpu_memset")]), tmp_path, how, monkeypatch)


# --- real traces ---------------------------------------------------------------------------


def _raw_kernel_times(path: Path) -> list[tuple[int, int]]:
    """(start, end) ns of every complete kernel/memcpy/memset, from the JSON text by Decimal."""
    doc = json.loads(chrome.read_bytes(path), parse_float=Decimal, parse_int=Decimal)
    out = []
    for e in doc["traceEvents"]:
        if e.get("cat") in ("kernel", "Kernel", "gpu_memcpy", "gpu_memset", "Memcpy", "Memset") and e.get("ph", "X") == "X":
            start = round(Fraction(e["ts"]) * 1000)
            out.append((start, start + round(Fraction(e["dur"]) * 1000)))
    return sorted(out)


@pytest.mark.parametrize(
    "path",
    [DATA / "kineto_real" / "deepseek_v3_train" / "train.json.gz",  # epoch integer µs, zero-length memsets
     DATA / "kineto_real" / "tracelens_b200_eager" / "eager_trace.json.gz",  # three decimals
     DATA / "hta_trace_filter_2rank" / "sampled_rank-0.json.gz"],
    ids=lambda p: p.parent.name,
)  # fmt: skip
@pytest.mark.parametrize("pure", ["0", "1"])
def test_real_traces_are_exact(path, pure, monkeypatch):
    if not path.exists():
        pytest.skip(f"{path} not in tests/data")
    monkeypatch.setenv("OVERLAPVIZ_PURE_PYTHON", pure)
    (trace,) = chrome.ChromeReader().read(path)
    k = trace.kernels
    got = sorted(zip(k.column("start_ns").to_pylist(), k.column("end_ns").to_pylist()))
    assert got == _raw_kernel_times(path)
    if path.parent.name == "deepseek_v3_train":
        assert any(s == e for s, e in got)  # its zero-length memsets are activities
