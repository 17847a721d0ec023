"""The Chrome reader's paths against each other: the msgspec structs it reads with when the
C scanner is off or hands a file over (``decode_exact``, its doubles proven exact, else
``decode_text``), and the dict path (``load_document`` + ``parse_document``).

Every real Kineto trace in tests/data must take the msgspec path and give exactly what
the dict path gives; a document msgspec cannot type must still read (or fail) the same.
"""

import gzip
import os
import sys
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest

from overlapviz.ingest import driver, files, pool
from overlapviz.dataset import schema
from overlapviz.ingest import chrome, ingest
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


def _fast(path: Path):
    """What ChromeReader.read does when the scanner is off: doubles only where proven exact."""
    events, meta = chrome.decode_exact(chrome.read_bytes(path))
    try:
        tables = chrome.split_typed(events, path, doubles="prove")
    except chrome.InexactTimes:
        events, meta = chrome.decode_text(chrome.read_bytes(path))
        tables = chrome.split_typed(events, path, doubles="prove")
    return chrome._assemble(*tables, meta, len(events), path)


def _slow(path: Path):
    return chrome.parse_document(chrome.load_document(path), path)


def _same(a, b):
    assert a.rank == b.rank
    assert a.info == b.info
    assert a.kernels.equals(b.kernels), (a.kernels.schema, b.kernels.schema)
    assert a.steps.equals(b.steps)
    assert a.devices.equals(b.devices)


def test_real_traces_found():
    assert len(REAL) >= 12


@pytest.mark.parametrize("path", REAL, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_fast_path_equals_dict_path(path):
    assert chrome.decode_exact(chrome.read_bytes(path)) is not None, "fell back to the dict path"
    _same(_fast(path), _slow(path))


def test_msgspec_doubles_are_used_only_where_proven_exact():
    """Kineto's three-decimal times below 2**40 µs: msgspec's doubles are Python's floats,
    proven exact, and give the decimal rule's ns; epoch-scale µs with ns digits are not
    proven (InexactTimes) and read from their text; integer µs stay exact ints."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from overlapviz.ingest.chrome_events import decimal_us_to_ns

    def split(raw: bytes):
        events, _ = chrome.decode_exact(raw)
        return events, chrome.split_typed(events, Path("t.json"), doubles="prove")[0]

    @settings(max_examples=200, deadline=None)
    @given(st.lists(st.integers(min_value=0, max_value=(1 << 40) * 1000 - 1), min_size=1, max_size=50))
    def check(ns):
        text = [f"{n // 1000}.{n % 1000:03d}" for n in ns]
        body = ",".join(f'{{"ph":"X","cat":"kernel","name":"k","ts":{t},"dur":{t}}}' for t in text)
        events, gpu = split(f"[{body}]".encode())
        assert [e.ts for e in events] == [float(t) for t in text]
        assert gpu.column("ts").to_pylist() == gpu.column("dur").to_pylist() == ns

    check()
    epoch = b'[{"ph":"X","cat":"kernel","name":"k","ts":1694128201436255.123,"dur":1.5}]'
    assert chrome.decode_exact(epoch) is not None and type(chrome.decode_exact(epoch)[0][0].ts) is str  # text at once
    early = b'{"ph":"X","cat":"kernel","name":"k","ts":1.5,"dur":1},' * 2000  # past the 64 KiB decode_exact looks at
    events, _ = chrome.decode_exact(b"[" + early + b'{"ph":"X","cat":"kernel","name":"k","ts":1694128201436255.123,"dur":1}]')
    assert type(events[-1].ts) is float
    with pytest.raises(chrome.InexactTimes):  # the first times looked fine, a later one is not provable
        chrome.split_typed(events, Path("t.json"), doubles="prove")
    events, gpu = split(b'{"traceEvents": [{"ph":"X","cat":"kernel","name":"k","ts": 1682725898082228, "dur": 3}]}')
    assert events[0].ts == 1682725898082228 and type(events[0].ts) is int
    assert gpu.column("ts").to_pylist() == [decimal_us_to_ns("1682725898082228")]


def test_untypable_documents_fall_back_to_the_dict_path(tmp_path):
    # an object where a number belongs, an event that is not an object, no traceEvents, args not an object
    assert chrome.decode_exact(b'{"traceEvents": [{"ts": {"a": 1}}]}') is None
    assert chrome.decode_exact(b'{"traceEvents": [3]}') is None
    assert chrome.decode_exact(b'{"foo": []}') is None
    assert chrome.decode_exact(b'{"traceEvents": [') is None
    assert chrome.decode_exact(b'{"traceEvents": [{"cat": "kernel", "args": null}]}') is None
    assert chrome.decode_text(b'{"traceEvents": [{"cat": "kernel", "args": [1]}]}') is None
    doc = kineto_trace(kernel_event("k", 10_000, 2_000, correlation=1), runtime_event(1, 9_000, 500))
    doc["traceEvents"].append({"ph": "i", "cat": "cpu_instant_event", "name": "odd", "ts": 1.0, "args": {"grid": "none"}})
    path = write_trace(doc, tmp_path / "rank0.json")
    assert chrome.decode_exact(chrome.read_bytes(path)) is None
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
