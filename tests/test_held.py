"""Raw traces analysed right after their ingest read the tables from memory (``ingest_held``): the same tables and
the same answers as the dataset written and read back, on the real traces in tests/data."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest

from overlapviz.analysis import breakdown, explain, findings, metrics, peers
from overlapviz.dataset import schema
from overlapviz.ingest import driver
from overlapviz.testing import generate_trace, write_trace

DATA = Path(__file__).parent / "data"
REAL = {
    "dlrm_8rank": DATA / "kineto_real" / "param_dlrm_8rank",
    "hta_event_sync": DATA / "kineto_real" / "hta_event_sync_multistream",
    "mi250_rocm": DATA / "kineto_real" / "hta_mi250_rocm62",
    "gloo_cpu": DATA / "gloo_cpu",
    "nsys_2gpu": DATA / "nsys" / "mfu_2gpu_before_window40ms.sqlite",
    "rocpd": DATA / "rocpd" / "mi300x_rocm711_ck_bmm",
}


def _misaligned(tmp_path: Path) -> Path:
    """Two ranks whose clocks differ by 7 ms: ingest aligns them on collective completion (kernels shifted)."""
    d = tmp_path / "misaligned"
    for rank, start in ((0, 5_000_000_000_000), (1, 5_000_007_000_000)):
        write_trace(generate_trace(400, rank=rank, world_size=2, seed=3, start_ns=start), d / f"rank{rank}.json")
    return d


def _same_frames(a: pd.DataFrame, b: pd.DataFrame) -> None:
    pd.testing.assert_frame_equal(a.reset_index(drop=True), b.reset_index(drop=True), check_exact=True)


@pytest.fixture(params=[*REAL, "misaligned"])
def pair(request, tmp_path):
    src = _misaligned(tmp_path) if request.param == "misaligned" else REAL[request.param]
    held = driver.ingest_held([src], tmp_path / "held", progress=False)
    written = driver.ingest([src], tmp_path / "written", progress=False)
    return request.param, held, written


def test_held_tables_are_the_written_files(pair):
    name, held, written = pair
    assert isinstance(held, schema.HeldDataset)
    # every kernels file is held (a few small files, all read here): the reads below never touch them
    assert sorted(held.kernels) == sorted(schema.read_metadata(held.path)["kernel_files"]) != []
    meta = schema.read_metadata(held.path)
    assert schema.read_metadata(held) == meta
    assert {k: v for k, v in meta.items() if k != "ingested_from"} == \
        {k: v for k, v in schema.read_metadata(written).items() if k != "ingested_from"}  # fmt: skip
    for table in schema.TABLES:
        assert schema.read_table(held, table).equals(schema.read_table(held.path, table)), (name, table)
        assert schema.read_table(held, table).equals(schema.read_table(written, table)), (name, table)
    run_ids = schema.read_table(held, "runs").column("run_id").to_pylist()
    for columns, dictionary in ((None, ()), (["run_id", "rank", "kind", "start_ns", "end_ns"], ("run_id", "kind")),
                                (["name", "stream", "launch_ns"], ("name",))):  # fmt: skip
        got = schema.read_kernels(held, columns, run_ids=run_ids[:1], dictionary=dictionary)
        assert got.schema.equals(schema.read_kernels(held.path, columns, run_ids=run_ids[:1], dictionary=dictionary).schema)
        assert got.equals(schema.read_kernels(written, columns, run_ids=run_ids[:1], dictionary=dictionary)), (name, columns)


def test_held_answers_are_the_written_datasets(pair):
    name, held, written = pair
    assert metrics.analyze_table(held).equals(metrics.analyze_table(written))
    assert metrics.analyze_table(held, per="step").equals(metrics.analyze_table(written, per="step"))
    rec_held, rec_written = explain.explain(held), explain.explain(written)
    _same_frames(rec_held, rec_written)
    _same_frames(peers.collective_instances(rec_held), peers.collective_instances(rec_written))
    _same_frames(breakdown.breakdown(held), breakdown.breakdown(written))
    _same_frames(findings.findings(held), findings.findings(written))


def test_held_shift_is_the_files_shift(tmp_path):
    """Where ingest aligns a rank's clock, the held table is shifted as its file is."""
    held = driver.ingest_held([_misaligned(tmp_path)], tmp_path / "held", progress=False)
    offsets = schema.read_table(held, "ranks").column("clock_offset_ns").to_pylist()
    assert any(offsets), offsets  # the case really shifts a rank
    for rel, table in held.kernels.items():
        assert table.equals(schema.conform(pq.read_table(held.path / rel), schema.KERNELS)), rel


def test_big_inputs_are_not_held(tmp_path, monkeypatch):
    """Above HOLD_MAX_BYTES nothing is held (memory stays bounded per rank); the answers are the same."""
    monkeypatch.setattr(driver, "HOLD_MAX_BYTES", 0)
    held = driver.ingest_held([REAL["dlrm_8rank"]], tmp_path / "held", progress=False)
    assert held.kernels == {}
    written = driver.ingest([REAL["dlrm_8rank"]], tmp_path / "written", progress=False)
    _same_frames(explain.explain(held), explain.explain(written))


@pytest.mark.parametrize("args", [["explain", "--instances"], ["explain", "--findings"], ["explain"], ["explain", "--breakdown"],
                                  ["analyze"]])  # fmt: skip
def test_cli_on_raw_traces_cold_and_warm_is_the_dataset(tmp_path, args):
    """``overlapviz CMD TRACES`` with a cold cache (held), then warm (read from the cache), prints what
    ``CMD DATASET`` prints for the dataset ``overlapviz ingest`` wrote."""
    src = REAL["dlrm_8rank"]
    env = {"OVERLAPVIZ_CACHE_DIR": str(tmp_path / "cache"), "PATH": "/usr/bin:/bin"}
    run = lambda target: subprocess.run([sys.executable, "-m", "overlapviz", *args, str(target), "--format", "json"],  # noqa: E731
                                        capture_output=True, text=True, env=env, check=True)  # fmt: skip
    subprocess.run([sys.executable, "-m", "overlapviz", "ingest", str(src), "-o", str(tmp_path / "ds"), "-q"], env=env, check=True)
    expected = run(tmp_path / "ds").stdout
    cold = run(src)
    assert "raw traces, read into" in cold.stderr
    assert cold.stdout == expected
    assert json.loads(expected), "an answer with records"
    warm = run(src)
    assert warm.stdout == expected


def test_one_file_is_held_whatever_its_size(tmp_path, monkeypatch):
    """One trace file is read in this process however large: its one table is held (memory: one rank's, which analysis
    would read back), the same as its file."""
    monkeypatch.setattr(driver, "HOLD_MAX_BYTES", 0)
    src = tmp_path / "rank0.json"
    write_trace(generate_trace(300, rank=0, world_size=1, seed=5), src)
    held = driver.ingest_held([src], tmp_path / "held", progress=False)
    assert list(held.kernels) == schema.read_metadata(held.path)["kernel_files"]
    for rel, table in held.kernels.items():
        assert table.equals(schema.conform(pq.read_table(held.path / rel), schema.KERNELS)), rel


def _files(directory: Path) -> dict[str, object]:
    """Every file of a dataset: Parquet files as their tables, the others as text (less the ingested paths)."""
    out: dict[str, object] = {}
    for f in sorted(p for p in directory.rglob("*") if p.is_file()):
        rel = f.relative_to(directory).as_posix()
        if f.suffix == ".parquet":
            out[rel] = pq.read_table(f)
        else:
            out[rel] = {k: v for k, v in json.loads(f.read_text()).items() if k != "ingested_from"}
    return out


@pytest.mark.parametrize("case", ["dlrm_8rank", "misaligned"])
def test_write_behind_writes_the_dataset_ingest_writes(tmp_path, case):
    """``write_behind``: the answers come from the held tables while a thread writes the files; once it is done the
    dataset is file for file the one ``ingest`` writes (a rank whose clock ingest shifts included), and nothing
    temporary is left beside it."""
    src = _misaligned(tmp_path) if case == "misaligned" else REAL[case]
    out = tmp_path / "cache" / "held"
    out.parent.mkdir()
    held = driver.ingest_held([src], out, progress=False, write_behind=True)
    assert held.finishing is not None and sorted(held.kernels)
    written = driver.ingest([src], tmp_path / "written", progress=False)
    assert metrics.analyze_table(held).equals(metrics.analyze_table(written))
    assert Path(held) == out  # os.fspath waits for the files
    assert held.finishing.done() and schema.read_metadata(out)["kernel_files"] == sorted(held.kernels)
    got, expected = _files(out), _files(written)
    assert sorted(got) == sorted(expected)
    for rel in expected:
        assert got[rel] == expected[rel] if isinstance(got[rel], dict) else got[rel].equals(expected[rel]), rel
    assert [p.name for p in out.parent.iterdir()] == ["held"]


def test_a_kernels_file_not_held_is_read_once_the_write_behind_has_written_it(tmp_path):
    """A cold command whose kernels are not all held (several sources: rocprof/v3's two folders) reads the others from
    the dataset being written behind: each rank's read waits for the write (``rankwise.read_rank`` made a view of the
    dataset without its ``finishing``, and ``explain`` on rocprof/v3 failed 2 runs in 3 with "No such file")."""
    import shutil
    import time

    from overlapviz.dataset import outdir

    written = driver.ingest([REAL["dlrm_8rank"]], tmp_path / "written", progress=False)
    final = tmp_path / "cache" / "ds"

    def finish() -> Path:
        time.sleep(0.5)  # the files arrive after the analysis has started
        shutil.copytree(written, final)
        return final

    meta = schema.read_metadata(written)
    tables = {t: schema.read_table(written, t) for t in schema.TABLES}
    held = schema.HeldDataset(final, meta, tables, {}, outdir.Finishing(finish))
    _same_frames(explain.explain(held), explain.explain(written))


def test_cache_that_cannot_be_written_fails_the_command_and_leaves_nothing(tmp_path):
    """A cold ``analyze TRACES`` whose cache files cannot be written (here: larger than the process may write,
    RLIMIT_FSIZE) still prints the answer from memory, then fails with one line saying the dataset is not kept;
    the cache holds no dataset and nothing temporary, and the next run ingests again."""
    import resource

    cache = tmp_path / "cache"
    env = {"OVERLAPVIZ_CACHE_DIR": str(cache), "PATH": "/usr/bin:/bin"}
    cmd = [sys.executable, "-m", "overlapviz", "analyze", str(REAL["dlrm_8rank"]), "--format", "json"]
    limit = lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))  # noqa: E731 (Python ignores SIGXFSZ)
    # no bytecode written under the limit: a .pyc cut at 4 KB would break every later import of its module
    failed = subprocess.run(cmd, capture_output=True, text=True, env=env | {"PYTHONDONTWRITEBYTECODE": "1"}, preexec_fn=limit)
    assert failed.returncode == 1, failed.stderr
    error = [line for line in failed.stderr.splitlines() if line.startswith("Error")]
    assert len(error) == 1 and "cannot write the dataset" in error[0] and "File too large" in error[0] and "not kept" in error[0], failed.stderr
    assert [p.name for p in cache.iterdir()] == [], "no dataset, nothing temporary"
    ok = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True)
    assert json.loads(failed.stdout) == json.loads(ok.stdout)
    assert [p.name for p in cache.iterdir() if p.name.startswith("traces-")] and "raw traces, read into" in ok.stderr


def test_one_gzip_trace_is_inflated_ahead_and_read_as_the_file(tmp_path):
    """A cold ``analyze TRACE.json.gz`` inflates the file in a thread while the ingest modules import
    (cli/_dataset._inflate_ahead); ``files.read_bytes`` takes those bytes only for that file unchanged and only
    where they are what it would read (one gzip member), else it reads the file itself."""
    import gzip

    from overlapviz.cli import _dataset
    from overlapviz.ingest import files

    src = tmp_path / "one" / "rank0.json.gz"
    write_trace(generate_trace(500, rank=0, world_size=1, seed=9), src)
    text = gzip.decompress(src.read_bytes())
    ahead = _dataset._inflate_ahead(src.parent)
    assert ahead is not None and ahead[1]() == text
    # taken once, by that file only
    files.READ_AHEAD[files.file_identity(ahead[0])] = lambda: b"from the read-ahead"
    assert files.read_bytes(src) == b"from the read-ahead" and not files.READ_AHEAD
    assert files.read_bytes(src) == text
    # the file changed since: read anew
    ahead = _dataset._inflate_ahead(src.parent)
    files.READ_AHEAD[files.file_identity(ahead[0])] = lambda: b"stale"
    src.write_bytes(gzip.compress(b" ") + gzip.compress(text))  # two members now, the trailer giving the second's size
    try:
        assert files.read_bytes(src) == b" " + text
    finally:
        files.READ_AHEAD.clear()
    ahead = _dataset._inflate_ahead(src.parent)
    assert ahead is not None and ahead[1]() is None, "not one member: left to read_bytes"
    # the command: cold (inflated ahead) and warm print what the ingested dataset prints
    src.write_bytes(gzip.compress(text))
    env = {"OVERLAPVIZ_CACHE_DIR": str(tmp_path / "cache"), "PATH": "/usr/bin:/bin"}
    run = lambda target: subprocess.run([sys.executable, "-m", "overlapviz", "analyze", str(target), "--format", "json"],  # noqa: E731
                                        capture_output=True, text=True, env=env, check=True).stdout  # fmt: skip
    subprocess.run([sys.executable, "-m", "overlapviz", "ingest", str(src.parent), "-o", str(tmp_path / "ds"), "-q"], env=env,
                   check=True)  # fmt: skip
    expected = run(tmp_path / "ds")
    assert run(src.parent) == expected and json.loads(expected)
    assert run(src.parent) == expected
