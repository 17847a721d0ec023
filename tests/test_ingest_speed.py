"""The Chrome reader's Python reader (msgspec structs, what ChromeReader reads with when the
C scanner is off or hands a file over) on its own, and the worker pool.

Every real Kineto trace in tests/data must read with its times exactly what Decimal reads
from the JSON text; float literals are read from their text (never a double); odd
documents (an object where a number belongs, an event that is not an object, no
traceEvents, args not an object) are read, or refused, by the same reader.
"""

import gzip
import json
import os
import sys
from decimal import Decimal
from fractions import Fraction
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest

from overlapviz.ingest import driver, files, pool
from overlapviz.dataset import schema
from overlapviz.ingest import chrome, chrome_events, ingest
from overlapviz.testing import (
    generate_trace,
    kernel_event,
    kineto_trace,
    process_alive,
    runtime_event,
    write_trace,
)

DATA = Path(__file__).parent / "data"
REAL = sorted(
    p
    for d in ("gloo_cpu", "h200_carveout_check", "hta_nccl_parser_config", "hta_trace_filter_2rank", "occupancy_h200", "torch_rocm")
    for p in (DATA / d).rglob("*.json.gz")
)
_GPU = {"kernel", "Kernel", "gpu_memcpy", "Memcpy", "cuda_memcpy", "gpu_memset", "Memset", "cuda_memset"}
_HOST = {"cpu_op", "Operator", "user_annotation"}


def _python(path: Path):
    """What ChromeReader.read does without the scanner (OVERLAPVIZ_PURE_PYTHON=1)."""
    events, meta = chrome_events.decode_events(chrome.read_bytes(path), path)
    return chrome._assemble(*chrome_events.event_tables(events, path), meta, len(events), path)


def _reference(path: Path) -> tuple[int, list, list]:
    """(events, sorted (name, start, end) of the complete GPU activities, the same of the
    host ranges), ns by exact rational arithmetic on the JSON text."""
    doc = json.loads(chrome.read_bytes(path), parse_float=Decimal)
    ns = lambda v: round(Fraction(Decimal(v)) * 1000)  # noqa: E731
    rows = {"gpu": [], "host": []}
    for e in doc["traceEvents"]:
        if e.get("ph", "X") == "X" and e.get("cat") in _GPU | _HOST:
            start = ns(e["ts"])
            rows["gpu" if e["cat"] in _GPU else "host"].append((e["name"], start, start + ns(e["dur"])))
    return len(doc["traceEvents"]), sorted(rows["gpu"]), sorted(rows["host"])


def test_real_traces_found():
    assert len(REAL) >= 12


@pytest.mark.parametrize("path", REAL, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_python_reader_reads_real_traces_exactly(path, monkeypatch):
    monkeypatch.setenv("OVERLAPVIZ_PURE_PYTHON", "1")
    (trace,) = chrome.ChromeReader().read(path)
    same = _python(path)
    assert trace.info == same.info and trace.kernels.equals(same.kernels) and trace.syncs.equals(same.syncs)
    n_events, gpu, host = _reference(path)
    k = trace.kernels
    rows = sorted(zip(k.column("name").to_pylist(), k.column("start_ns").to_pylist(), k.column("end_ns").to_pylist()))
    assert trace.info["n_events"] == n_events
    if gpu:
        assert rows == gpu
    else:  # CPU-only: host ranges stand in
        assert rows and set(rows) <= set(host)


def test_float_literals_are_read_from_their_text():
    """Kineto's three-decimal times and epoch-scale µs with ns digits (a double holds them
    to 0.25 µs only) give the decimal rule's ns, wherever they come in the document;
    integer µs stay exact ints."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from overlapviz.ingest.chrome_events import decimal_us_to_ns

    def gpu(raw: bytes):
        events, _ = chrome_events.decode_events(raw, Path("t.json"))
        return events, chrome_events.event_tables(events, Path("t.json"))[0]

    @settings(max_examples=200, deadline=None)
    @given(st.lists(st.integers(min_value=-(2**62), max_value=2**62), min_size=1, max_size=50))
    def check(ns):
        text = [f"{'-' if n < 0 else ''}{abs(n) // 1000}.{abs(n) % 1000:03d}" for n in ns]
        body = ",".join(f'{{"ph":"X","cat":"kernel","name":"k","ts":{t},"dur":{t}}}' for t in text)
        events, table = gpu(f"[{body}]".encode())
        assert [e.ts for e in events] == text  # the float literals' text, not doubles
        assert table.column("ts").to_pylist() == table.column("dur").to_pylist() == ns

    check()
    early = b'{"ph":"X","cat":"kernel","name":"k","ts":1.5,"dur":1},' * 2000
    _, table = gpu(b"[" + early + b'{"ph":"X","cat":"kernel","name":"k","ts":1694128201436255.123,"dur":1}]')
    assert table.column("ts").to_pylist()[-1] == 1_694_128_201_436_255_123  # a double says ...255.125
    events, table = gpu(b'{"traceEvents": [{"ph":"X","cat":"kernel","name":"k","ts": 1682725898082228, "dur": 3}]}')
    assert events[0].ts == 1682725898082228 and type(events[0].ts) is int
    assert table.column("ts").to_pylist() == [decimal_us_to_ns("1682725898082228")]


@pytest.mark.parametrize("pure", ["0", "1"])
def test_odd_documents_are_read_or_refused_by_the_python_reader(tmp_path, monkeypatch, pure):
    monkeypatch.setenv("OVERLAPVIZ_PURE_PYTHON", pure)

    def error(doc: bytes) -> str:
        path = tmp_path / "t.json"
        path.write_bytes(doc)
        with pytest.raises(ValueError) as err:
            chrome.ChromeReader().read(path)
        assert str(err.value).startswith(f"{path}: ") and "\n" not in str(err.value)
        return str(err.value).removeprefix(f"{path}: ")

    assert error(b'{"traceEvents": [{"ts": {"a": 1}}]}') == "no GPU or host activities in this trace (nothing to measure)"
    assert error(b'{"traceEvents": [3]}') == "traceEvents holds a int, not an event object"
    assert error(b'{"foo": []}') == error(b'{"traceEvents": 3}') == "not a Chrome trace (no traceEvents list)"
    assert error(b'{"traceEvents": [').startswith("truncated JSON: ")
    assert error(b'{"traceEvents": [}, "x": 1}').startswith("invalid JSON: ")
    assert error(b'{"traceEvents": [{"cat": "kernel", "args": null}]}') == "GPU activity event #0: field 'args' is null, not an object"
    assert error(b'{"traceEvents": [{"cat": "Runtime", "name": "x", "args": [1]}, 3]}') == \
        "runtime event #0 'x': field 'args' is an array, not an object"  # fmt: skip
    assert error(b'{"traceEvents": [3, {"cat": "kernel", "args": "a"}]}') == "traceEvents holds a int, not an event object"
    assert error(b'{"traceEvents": [{"cat": "kernel", "name": "k", "ts": 1, "dur": 1, "args": {"device": true}}]}') == \
        "GPU activity events: field 'args.device' has a value of the wrong type (True)"  # fmt: skip
    assert error(b'{"traceEvents": [{"cat": "kernel", "name": "k", "ts": 1e400, "dur": 1}]}') == \
        "GPU activity events: field 'ts' (1e400 us) is past what int64 nanoseconds hold"  # fmt: skip
    doc = kineto_trace(kernel_event("k", 10_000, 2_000, correlation=1), runtime_event(1, 9_000, 500))
    doc["traceEvents"].append({"ph": "i", "cat": "cpu_instant_event", "name": "odd", "ts": 1.0, "args": {"grid": "none"}})
    doc["traceEvents"].append({"ph": "s", "cat": "kernel", "name": 7, "args": None})  # a flow: not an activity, not judged
    path = write_trace(doc, tmp_path / "rank0.json")
    (trace,) = chrome.ChromeReader().read(path)
    assert trace.kernels.column("start_ns").to_pylist() == [10_000] and trace.kernels.column("launch_ns").to_pylist() == [9_000]


def _generated(tmp_path, n_ranks=3):
    for r in range(n_ranks):
        write_trace(generate_trace(2_000, rank=r, world_size=n_ranks, seed=r, n_steps=4), tmp_path / "gen" / f"rank{r}.json.gz")
    return tmp_path / "gen"


def test_worker_pool_gives_what_one_process_gives(tmp_path, monkeypatch):
    src = _generated(tmp_path)
    one = ingest([src], tmp_path / "one", workers=1, progress=False)
    monkeypatch.setattr(pool, "POOL_MIN_BYTES", 0)
    forked = []
    real_pool = pool.ProcessPoolExecutor
    monkeypatch.setattr(pool, "ProcessPoolExecutor", lambda *a, **kw: forked.append(kw) or real_pool(*a, **kw))
    two = ingest([src], tmp_path / "two", workers=2, progress=False)
    assert forked and forked[0]["max_workers"] == 1  # the parent reads too: one forked process for 2 workers
    for table, order in (("kernels", ["rank", "start_ns", "stream"]), ("steps", ["rank", "start_ns"]), ("ranks", ["rank"])):
        a = schema.read_frame(one, table).sort_values(order, ignore_index=True)
        b = schema.read_frame(two, table).sort_values(order, ignore_index=True)
        pd.testing.assert_frame_equal(a, b)


def test_small_inputs_are_read_without_forking(tmp_path, monkeypatch):
    src = _generated(tmp_path, n_ranks=2)
    monkeypatch.setattr(pool, "ProcessPoolExecutor", lambda *a, **kw: pytest.fail("forked a pool for 2 small files"))
    out = ingest([src], tmp_path / "ds", workers=2, progress=False)
    assert len(schema.read_frame(out, "kernels")) == 4_000


def test_bad_file_read_by_the_pool_fails_naming_it(tmp_path, monkeypatch):
    src = _generated(tmp_path)
    data = (src / "rank2.json.gz").read_bytes()
    (src / "rank2.json.gz").write_bytes(data[:-30])
    monkeypatch.setattr(pool, "POOL_MIN_BYTES", 0)
    with pytest.raises(ValueError, match=r"rank2\.json\.gz: truncated gzip"):
        ingest([src], tmp_path / "ds", workers=2, progress=False)
    assert not (tmp_path / "ds").exists()


def test_input_bytes_reads_the_gzip_trailer(tmp_path):
    src = _generated(tmp_path, n_ranks=1)
    f = src / "rank0.json.gz"
    assert files.input_bytes(f) == len(gzip.decompress(f.read_bytes()))
    plain = tmp_path / "plain.json"
    plain.write_bytes(b"[]")
    assert files.input_bytes(plain) == 2


def _record_reads(monkeypatch, log: Path):
    """Make every process append '<pid> <file>' to ``log`` when it ingests a file."""
    real = driver.ingest_file

    def spy(path, *args):
        with open(log, "a") as fh:
            fh.write(f"{os.getpid()} {Path(path).name}\n")
        return real(path, *args)

    spy.__module__, spy.__qualname__ = driver.__name__, "ingest_file"  # pickled by that name
    monkeypatch.setattr(driver, "ingest_file", spy)


def test_parent_and_worker_both_read_and_write_and_the_result_is_the_in_process_one(tmp_path, monkeypatch):
    src = _generated(tmp_path, n_ranks=6)
    one = ingest([src], tmp_path / "one", workers=1, progress=False)
    monkeypatch.setattr(pool, "POOL_MIN_BYTES", 0)
    _record_reads(monkeypatch, tmp_path / "reads.log")
    two = ingest([src], tmp_path / "two", workers=2, progress=False)
    reads = [line.split() for line in (tmp_path / "reads.log").read_text().splitlines()]
    by_pid = {pid: sum(1 for p, _ in reads if p == pid) for pid, _ in reads}
    assert sorted(name for _, name in reads) == sorted(p.name for p in src.iterdir())  # each file once
    assert str(os.getpid()) in by_pid and len(by_pid) == 2  # the parent reads too, beside one worker
    # the same files and the same tables, row order included (small tables in file order)
    assert schema.read_metadata(one)["kernel_files"] == schema.read_metadata(two)["kernel_files"]
    for name in ("kernels/gen/rank0.parquet", "kernels/gen/rank5.parquet", *(f"{t}.parquet" for t in schema.TABLES)):
        assert pq.read_table(one / name).equals(pq.read_table(two / name)), name


def test_duplicate_rank_read_by_the_pool_names_the_files_in_file_order(tmp_path, monkeypatch):
    src = _generated(tmp_path, n_ranks=4)
    # rank 0 again (distributedInfo), last in file order
    write_trace(generate_trace(2_000, rank=0, world_size=4, seed=9, n_steps=4), src / "zz_rank0.json.gz")
    # one run named on the command line (a directory's files giving a rank twice would be a run each)
    with pytest.raises(ValueError) as one:
        ingest([src], tmp_path / "one", workers=1, progress=False, run_id="gen")
    monkeypatch.setattr(pool, "POOL_MIN_BYTES", 0)
    with pytest.raises(ValueError) as two:
        ingest([src], tmp_path / "two", workers=2, progress=False, run_id="gen")
    assert str(two.value) == str(one.value)
    assert str(two.value).startswith(f"{src / 'zz_rank0.json.gz'}: rank 0 of run 'gen' also comes from {src / 'rank0.json.gz'}")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gen"]  # no dataset, no temporary directory


def test_failed_file_stops_the_worker_before_the_directory_goes(tmp_path, monkeypatch):
    src = _generated(tmp_path, n_ranks=6)
    data = (src / "rank1.json.gz").read_bytes()
    (src / "rank1.json.gz").write_bytes(data[:-30])
    monkeypatch.setattr(pool, "POOL_MIN_BYTES", 0)
    _record_reads(monkeypatch, tmp_path / "reads.log")
    with pytest.raises(ValueError, match=r"rank1\.json\.gz: truncated gzip"):
        ingest([src], tmp_path / "ds", workers=2, progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gen", "reads.log"]  # nothing a worker wrote is left


_HANGING_READER = """
import os, sys, time
from pathlib import Path
from overlapviz.ingest import pool

def work(path):  # a reader that never finishes: says its pid, then waits
    Path(f"{path}.pid{os.getpid()}").write_text("")
    time.sleep(120)

pool.POOL_MIN_BYTES = 0
files = sys.argv[1:]
for _ in pool.ordered_map(work, [(f, (f,)) for f in files], n_workers=3):
    pass
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_forked_readers_die_with_a_parent_killed_alone(tmp_path):
    """SIGKILL to the ingesting process alone (not its group): its forked readers go too."""
    import signal
    import subprocess
    import time

    files = [tmp_path / f"t{i}.json" for i in range(4)]
    for f in files:
        f.write_text("[]")
    parent = subprocess.Popen([sys.executable, "-c", _HANGING_READER, *map(str, files)], start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while len(pids := {int(p.suffix[4:]) for p in tmp_path.glob("*.pid*")}) < 3:  # the parent and 2 workers
            assert time.monotonic() < deadline and parent.poll() is None, "the readers never started"
            time.sleep(0.05)
        workers = pids - {parent.pid}
        assert len(workers) == 2 and all(process_alive(w) for w in workers)
        os.kill(parent.pid, signal.SIGKILL)  # the parent only: the workers are in its group, not signalled
        parent.wait()
        deadline = time.monotonic() + 10  # they would sleep 120 s
        while any(process_alive(w) for w in workers) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not [w for w in workers if process_alive(w)], "a forked reader outlived its parent"
    finally:
        if parent.poll() is None:
            parent.kill()
        for w in {int(p.suffix[4:]) for p in tmp_path.glob("*.pid*")} - {parent.pid}:
            try:
                os.kill(w, signal.SIGKILL)
            except ProcessLookupError:
                pass
