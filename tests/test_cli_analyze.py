"""``overlapviz analyze``: formats, JSON keys and nulls, filters, and one-line errors."""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path

import pytest
from click.testing import CliRunner

from overlapviz import testing
from overlapviz.cli import main
from overlapviz.ingest import ingest
from overlapviz.analysis.metrics import analyze, metric_columns

GLOO = Path(__file__).parent / "data" / "gloo_cpu"
DESIGN_KEYS = {
    "run_id", "rank", "comm_us", "compute_us", "overlap_us", "overlap_fraction",
    "exposed_comm_us", "span_us", "n_kernels", "n_comm_kernels",
}  # fmt: skip


def run(*args) -> str:
    result = CliRunner().invoke(main, ["analyze", *map(str, args)])
    assert result.exit_code == 0, result.output
    return result.output


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    """Two runs made by the real ingest from synthetic Kineto traces with hand-known overlap.

    run ``hand`` rank 0, step 0: comm [100, 300) µs, compute [200, 500) µs -> overlap 100 µs;
    step 1: compute only, [1000, 1010) µs. rank 1: one memcpy only.
    """
    root = tmp_path_factory.mktemp("cli")
    hand = root / "hand"
    hand.mkdir()
    ev = [
        testing.step_event(0, 0, 900_000),
        testing.runtime_event(1, 10_000, 1_000),
        testing.kernel_event("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 100_000, 200_000, correlation=1, stream=20),
        testing.runtime_event(2, 20_000, 1_000),
        testing.kernel_event("ampere_sgemm_128x64_nn", 200_000, 300_000, correlation=2, stream=7),
        testing.step_event(1, 950_000, 100_000),
        testing.runtime_event(3, 960_000, 1_000),
        testing.kernel_event("ampere_sgemm_128x64_nn", 1_000_000, 10_000, correlation=3, stream=7),
    ]
    testing.write_trace(testing.kineto_trace(ev, rank=0, world_size=2), hand / "rank0.json.gz")
    mem = [testing.runtime_event(1, 10_000, 1_000, name="cudaMemcpyAsync"), testing.memcpy_event(50_000, 5_000, correlation=1)]
    testing.write_trace(testing.kineto_trace(mem, rank=1, world_size=2), hand / "rank1.json.gz")
    big = root / "big"
    big.mkdir()
    for r in range(2):
        doc = testing.generate_trace(2_000, rank=r, world_size=2, seed=3, comm_every=10)
        testing.write_trace(doc, big / f"rank{r}.json.gz")
    out = root / "ds"
    ingest([hand, big], out, progress=False)
    return out


def test_json_records_have_design_keys_and_hand_values(dataset):
    records = json.loads(run(dataset, "--format", "json"))
    assert isinstance(records, list) and len(records) == 4
    for rec in records:
        assert DESIGN_KEYS <= rec.keys() and "step" not in rec
        assert list(rec) == metric_columns("rank")
    hand = {r["rank"]: r for r in records if r["run_id"] == "hand"}
    r0 = hand[0]
    assert (r0["comm_us"], r0["compute_us"], r0["overlap_us"]) == (200.0, 310.0, 100.0)
    assert r0["overlap_fraction"] == 0.5 and r0["exposed_comm_us"] == 100.0
    assert r0["span_us"] == 910.0 and r0["busy_us"] == 410.0 and r0["idle_us"] == 500.0
    assert (r0["n_kernels"], r0["n_comm_kernels"]) == (3, 1)
    r1 = hand[1]  # memcpy only: nulls are JSON null, not NaN
    assert r1["overlap_fraction"] is None and r1["span_us"] is None and r1["memory_us"] == 5.0
    assert r1["n_kernels"] == 0


def test_json_per_step(dataset):
    records = json.loads(run(dataset, "--per", "step", "--format", "json", "--run", "hand"))
    assert [(r["rank"], r["step"]) for r in records] == [(0, 0), (0, 1)]
    assert records[0]["overlap_us"] == 100.0 and records[0]["overlap_fraction"] == 0.5
    assert records[1]["overlap_fraction"] is None and records[1]["compute_us"] == 10.0
    assert all(list(r) == metric_columns("step") for r in records)


def test_json_equals_library(dataset):
    records = json.loads(run(dataset, "--format", "json", "--run", "big"))
    frame = analyze(dataset, run_ids=["big"])
    assert len(records) == len(frame) == 2
    for rec, (_, row) in zip(records, frame.iterrows()):
        for k, v in rec.items():
            assert v == row[k], k
        assert 0 < rec["overlap_fraction"] < 1 and rec["n_kernels"] == 2_000 and rec["n_comm_kernels"] == 200


def test_csv(dataset):
    text = run(dataset, "--format", "csv")
    rows = list(csv.DictReader(io.StringIO(text)))
    assert list(rows[0]) == metric_columns("rank") and len(rows) == 4
    memonly = next(r for r in rows if r["run_id"] == "hand" and r["rank"] == "1")
    assert memonly["overlap_fraction"] == "" and memonly["span_us"] == ""
    r0 = next(r for r in rows if r["run_id"] == "hand" and r["rank"] == "0")
    assert float(r0["overlap_us"]) == 100.0


def test_table_is_aligned(dataset):
    lines = run(dataset).rstrip("\n").split("\n")
    assert lines[0].split()[:3] == ["rank", "comm_us", "compute_us"]
    assert [line for line in lines if line.startswith("run ")] == ["run big", "run hand"]  # each run's id above its rows
    rows = [line for line in lines[1:] if not line.startswith("run ")]
    assert len(rows) == 4 and len({len(line) for line in rows}) == 1  # right-aligned numbers
    hand0 = lines[lines.index("run hand") + 1]
    assert hand0.split()[0] == "0" and "50.0%" in hand0 and "200.0" in hand0
    wide = run(dataset, "--wide").rstrip("\n").split("\n")
    assert wide[0].split()[:3] == ["run_id", "rank", "comm_us"] and "busy_us" in wide[0] and len(wide) == 5


def test_run_filter_repeatable(dataset):
    records = json.loads(run(dataset, "--format", "json", "--run", "big", "--run", "hand"))
    assert {r["run_id"] for r in records} == {"big", "hand"}


def test_real_gloo_trace(tmp_path):
    out = tmp_path / "gloo"
    ingest([GLOO], out, progress=False)
    records = json.loads(run(out, "--format", "json"))
    assert [r["rank"] for r in records] == [0, 1]
    for r in records:
        # 3 gloo:all_reduce per rank, overlapping the host's mm/div
        assert r["n_comm_kernels"] == 3 and r["comm_us"] > 0 and 0 < r["overlap_fraction"] < 1
        assert math.isclose(r["comm_us"], r["overlap_us"] + r["exposed_comm_us"])


@pytest.mark.parametrize(
    "setup, message",
    [
        (lambda p: p, "not an overlapviz dataset"),
        (lambda p: (p / "dataset.json").write_text('{"schema_version": "9.0"}') and p, "schema_version 9.0"),
        (lambda p: (p / "dataset.json").write_text("{not json") and p, "unreadable dataset metadata"),
    ],
)
def test_errors_are_one_line(tmp_path, setup, message):
    path = setup(tmp_path)
    result = CliRunner().invoke(main, ["analyze", str(path), "--format", "json"])
    assert result.exit_code != 0 and not isinstance(result.exception, (ValueError, KeyError, TypeError))
    assert message in result.output and result.output.count("\n") == 1, result.output


def test_unknown_run_is_one_line(dataset):
    result = CliRunner().invoke(main, ["analyze", str(dataset), "--run", "nope"])
    assert result.exit_code != 0 and "no run 'nope'" in result.output and result.output.count("\n") == 1


def test_table_per_step_has_step_column(dataset):
    lines = run(dataset, "--per", "step", "--run", "hand").rstrip("\n").split("\n")
    assert lines[0].split()[:3] == ["rank", "step", "comm_us"] and lines[1] == "run hand"
    assert [line.split()[1] for line in lines[2:]] == ["0", "1"]
    assert lines[3].split()[5] == "-"  # step 1 has no comm: overlap is null


def test_empty_selection_prints_no_rows(tmp_path):
    from overlapviz.dataset import schema

    with schema.DatasetWriter(tmp_path / "empty") as w:
        w.commit()
    assert json.loads(run(tmp_path / "empty", "--format", "json")) == []
    assert run(tmp_path / "empty", "--format", "csv").strip() == ",".join(metric_columns("rank"))
    assert "no kernels" in run(tmp_path / "empty")


# --- the Arrow path prints what the pandas path printed ---------------------------------

SAMPLE = Path(__file__).parents[1] / "sample_traces" / "h200_standin_sweep"
SOURCES = {
    "sample": SAMPLE,
    "gloo": GLOO,
    "hta_nccl": GLOO.parent / "hta_nccl_parser_config",
    "hta_filter": GLOO.parent / "hta_trace_filter_2rank",
    "rocm_gpu_only": GLOO.parent / "torch_rocm" / "gpu_only_trace.json.gz",
    "rocprof_v1": GLOO.parent / "rocprof" / "v1",
    "rocprof_v3": GLOO.parent / "rocprof" / "v3",
}


def pandas_json(frame) -> str:
    """JSON as the command printed it from a pandas frame before it moved to Arrow."""
    import orjson
    import pandas as pd

    def value(v):
        if v is None or v is pd.NA:
            return None
        if hasattr(v, "item"):
            v = v.item()
        return None if isinstance(v, float) and math.isnan(v) else v

    records = [{c: value(v) for c, v in zip(frame.columns, row)} for row in frame.itertuples(index=False, name=None)]
    return orjson.dumps(records).decode() + "\n"


@pytest.mark.parametrize("name", sorted(SOURCES))
@pytest.mark.parametrize("per", ["rank", "step"])
def test_json_and_csv_equal_the_pandas_rendering(tmp_path, name, per):
    out = tmp_path / name
    ingest([SOURCES[name]], out, progress=False)
    frame = analyze(out, per=per)
    assert len(frame) or name == "rocprof_v3" or per == "step"
    assert run(out, "--per", per, "--format", "json") == pandas_json(frame)
    assert run(out, "--per", per, "--format", "csv") == frame.to_csv(index=False, lineterminator="\n")


def test_csv_floats_are_spelled_as_pandas_spells_them():
    """Awkward floats (shortest round-trip, exponents, nulls) through both writers."""
    import numpy as np
    import pyarrow as pa

    from overlapviz.cli.analyze import render
    from overlapviz.analysis.metrics import result_schema, to_frame

    rng = np.random.default_rng(7)
    special = [0.1 + 0.2, 1e16, 1.5e-7, 123456789.123, 5e-324, 1e22, 2.0**53 + 2, 0.0, 1 / 3]
    n = 200
    floats = np.concatenate([special, rng.random(n - len(special)) * 10.0 ** rng.integers(-8, 18, n - len(special))])
    columns = {"run_id": pa.array([f"r,{i}" if i % 7 == 0 else f'r"{i}' if i % 11 == 0 else f"r{i}" for i in range(n)]),
               "rank": pa.array(np.arange(n, dtype=np.int64))}  # fmt: skip
    schema = result_schema("rank")
    for field in schema:
        if field.name not in columns:
            mask = rng.random(n) < 0.2 if field.type == pa.float64() else None
            values = rng.permutation(floats) if field.type == pa.float64() else rng.integers(0, 10**12, n)
            columns[field.name] = pa.array(values, field.type, mask=mask)
    table = pa.Table.from_arrays([columns[f.name] for f in schema], schema=schema)
    frame = to_frame(table)
    assert render(table, "csv") == frame.to_csv(index=False, lineterminator="\n")
    assert render(table, "json") + "\n" == pandas_json(frame)
