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
