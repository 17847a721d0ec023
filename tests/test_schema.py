"""The dataset contract: conforming tables, atomic writes, reading older datasets, kind rules."""

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from overlapviz.dataset import schema
from overlapviz.domain.rules import Rule, RuleSet, default_rules, parse_rule


def _kernels(n=3, run_id="r", rank=0):
    return pa.table(
        {
            "run_id": [run_id] * n,
            "rank": [rank] * n,
            "name": [f"k{i}" for i in range(n)],
            "kind": ["compute"] * n,
            "start_ns": list(range(0, 10 * n, 10))[::-1],
            "end_ns": [s + 5 for s in range(0, 10 * n, 10)][::-1],
        }
    )


def test_conform_fills_missing_columns_with_nulls_and_orders_them():
    t = schema.conform(_kernels(), schema.KERNELS)
    assert t.schema == schema.KERNELS
    assert t.column("grid_x").null_count == 3
    assert t.column("start_ns").type == pa.int64()


def test_conform_names_the_column_that_cannot_be_cast():
    bad = pa.table({"run_id": ["r"], "start_ns": ["not a number"]})
    with pytest.raises(ValueError, match="start_ns"):
        schema.conform(bad, schema.KERNELS, where="x.json")


def test_writer_commits_atomically_and_reads_back(tmp_path):
    out = tmp_path / "ds"
    with schema.DatasetWriter(out, rules=default_rules().to_dict()) as w:
        w.add_kernels(_kernels(run_id="a/b c"), "a/b c", 0)
        w.add_kernels(_kernels(run_id="a/b c", rank=1), "a/b c", 1)
        w.add("runs", pa.table({"run_id": ["a/b c"], "source": ["imported"]}))
        w.commit()
    meta = schema.read_metadata(out)
    assert meta["schema_version"] == schema.SCHEMA_VERSION
    assert meta["n_kernels"] == 6
    k = schema.read_kernels(out, ["rank", "start_ns"])
    assert k.num_rows == 6 and k.column_names == ["rank", "start_ns"]
    # files are sorted by start time
    starts = schema.read_kernels(out, ["start_ns"], run_ids=["a/b c"]).column("start_ns").to_pylist()
    assert starts[:3] == sorted(starts[:3])
    assert schema.read_table(out, "runs").column("source").to_pylist() == ["imported"]
    assert [p.name for p in tmp_path.iterdir()] == ["ds"]


def test_failed_write_leaves_nothing(tmp_path):
    out = tmp_path / "ds"
    with pytest.raises(RuntimeError):
        with schema.DatasetWriter(out) as w:
            w.add_kernels(_kernels(), "r", 0)
            raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []


def test_existing_output_is_kept_unless_overwrite(tmp_path):
    out = tmp_path / "ds"
    with schema.DatasetWriter(out) as w:
        w.add_kernels(_kernels(), "r", 0)
        w.commit()
    with pytest.raises(ValueError, match="not empty"):
        schema.DatasetWriter(out).__enter__()
    assert schema.read_kernels(out).num_rows == 3
    with schema.DatasetWriter(out, overwrite=True) as w:
        w.add_kernels(_kernels(), "r", 0)
        w.add_kernels(_kernels(rank=1), "r", 1)
        w.commit()
    assert schema.read_kernels(out).num_rows == 6
    assert [p.name for p in tmp_path.iterdir()] == ["ds"]


def test_overwrite_never_replaces_what_is_not_a_dataset(tmp_path):
    """issue 13: --overwrite replaced any directory (the user's traces among them)."""
    out = tmp_path / "ds"
    out.mkdir()
    (out / "keep.txt").write_text("x")
    with pytest.raises(ValueError, match="not an overlapviz dataset"):
        schema.DatasetWriter(out, overwrite=True).__enter__()
    assert (out / "keep.txt").read_text() == "x"
    assert [p.name for p in tmp_path.iterdir()] == ["ds"]


def test_duplicate_rank_is_rejected(tmp_path):
    with schema.DatasetWriter(tmp_path / "ds") as w:
        w.add_kernels(_kernels(), "r", 0)
        with pytest.raises(ValueError, match="rank 0 appears twice"):
            w.add_kernels(_kernels(), "r", 0)


def test_reader_accepts_an_older_minor_version_with_fewer_columns(tmp_path):
    out = tmp_path / "old"
    (out / "kernels" / "r").mkdir(parents=True)
    # a 1.0-era file lacking columns added later: readers must fill them with nulls
    pq.write_table(_kernels().drop_columns(["kind"]), out / "kernels" / "r" / "rank0.parquet")
    (out / "dataset.json").write_text(json.dumps({"schema_version": "1.0", "kernel_files": ["kernels/r/rank0.parquet"]}))
    k = schema.read_kernels(out, ["name", "kind", "collective"])
    assert k.num_rows == 3 and k.column("kind").null_count == 3
    assert schema.read_table(out, "devices").num_rows == 0


def test_reader_rejects_a_newer_major_version(tmp_path):
    (tmp_path / "dataset.json").write_text(json.dumps({"schema_version": "2.0"}))
    with pytest.raises(ValueError, match="schema_version 2.0"):
        schema.read_metadata(tmp_path)


def test_not_a_dataset(tmp_path):
    with pytest.raises(ValueError, match="not an overlapviz dataset"):
        schema.read_kernels(tmp_path)


def test_nullable_dtype_keeps_integers_with_nulls_exact():
    import pandas as pd

    table = pa.table({"i8": pa.array([1, None], pa.int8()), "i64": pa.array([2**62 + 1, None], pa.int64()),
                      "b": pa.array([True, None]), "f": pa.array([1.5, None]), "s": pa.array(["a", None])})  # fmt: skip
    frame = table.to_pandas(types_mapper=schema.nullable_dtype)
    assert [str(t) for t in frame.dtypes[:4]] == ["Int8", "Int64", "boolean", "float64"]  # (strings: pandas' default)
    assert frame["i64"].iloc[0] == 2**62 + 1 and frame["i64"].isna().iloc[1]
    assert schema.nullable_dtype(pa.int32()) == pd.Int32Dtype() and schema.nullable_dtype(pa.uint64()) is None


def test_the_arrow_to_pandas_nullable_map_is_written_once():
    """``schema.nullable_dtype`` is the one Arrow -> pandas nullable map: the dashboards' store, the Dask residency and
    timeline each had their own copy (the store's without Int8/Int16)."""
    root = Path(__file__).resolve().parent.parent
    copies = sorted(str(p.relative_to(root)) for d in ("overlapviz", "dashboards", "collectors") for p in (root / d).rglob("*.py")
                    if "pa.bool_(): pd.BooleanDtype()" in p.read_text())  # fmt: skip
    assert copies == ["overlapviz/dataset/schema.py"]


@pytest.mark.parametrize(
    "name,cat,kind",
    [
        ("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "kernel", "comm"),
        ("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t", "kernel", "comm"),
        ("rcclGenericKernel", "kernel", "comm"),
        ("mscclKernel_Sum_float_LL", "kernel", "comm"),
        ("ovz_comm_allreduce_standin", "kernel", "comm"),
        ("NCCL_whatever", "kernel", "comm"),
        ("sm90_xmma_gemm_bf16bf16_bf16f32", "kernel", "compute"),
        ("Memcpy DtoD (Device -> Device)", "gpu_memcpy", "memory"),
        ("Memset (Device)", "gpu_memset", "memory"),
        ("gloo:all_reduce", "user_annotation", "comm"),
        ("aten::mm", "cpu_op", "compute"),
        ("c10d::allreduce_", "cpu_op", "other"),
        ("record_param_comms", "cpu_op", "other"),
        ("something", "gpu_user_annotation", "other"),
    ],
)
def test_default_rules(name, cat, kind):
    assert default_rules().classify([name], [cat]).to_pylist() == [kind]


def test_overrides_win_and_round_trip_through_json():
    rules = default_rules().with_overrides([parse_rule("comm=^my_allgather"), parse_rule("other=fill@kernel")])
    kinds = rules.classify(["my_allgather_kernel", "fill_kernel", "gemm"], ["kernel"] * 3).to_pylist()
    assert kinds == ["comm", "other", "compute"]
    assert RuleSet.from_json(rules.to_json()) == rules


def test_classify_keeps_row_order_and_handles_many_rows():
    names = ["nccl", "gemm"] * 5000
    kinds = default_rules().classify(names, ["kernel"] * len(names)).to_pylist()
    assert kinds == ["comm", "compute"] * 5000


@pytest.mark.parametrize("text", ["comm", "=x", "bogus=x", "comm=("])
def test_bad_rules_are_rejected(text):
    with pytest.raises(ValueError):
        parse_rule(text)


def test_rule_kind_checked():
    with pytest.raises(ValueError, match="kind"):
        Rule("gpu", "x")


def test_read_kernels_dictionary_columns(tmp_path):
    """``dictionary=`` gives the same values as plain strings, typed dictionary<int32, string>,
    on the one-reader-per-file path and on the dataset-scan path alike."""
    from overlapviz.ingest import ingest

    data = Path(__file__).parent / "data" / "hta_trace_filter_2rank"
    ingest([data], tmp_path / "ds", progress=False)
    cols = ["run_id", "rank", "kind", "name", "start_ns"]
    plain = schema.read_kernels(tmp_path / "ds", columns=cols)
    for scan in (False, True):
        if scan:  # a filter makes it scan with pyarrow.dataset
            import pyarrow.compute as pc

            encoded = schema.read_kernels(tmp_path / "ds", columns=cols, dictionary=("run_id", "kind"),
                                          filter=pc.field("start_ns") >= -(2**62))  # fmt: skip
        else:
            encoded = schema.read_kernels(tmp_path / "ds", columns=cols, dictionary=("run_id", "kind"))
        assert pa.types.is_dictionary(encoded.schema.field("kind").type)
        assert encoded.schema.field("name").type == pa.string() and encoded.num_rows == plain.num_rows > 0
        for c in cols:
            assert encoded.column(c).to_pylist() == plain.column(c).to_pylist(), c


def test_kernels_file_written_elsewhere_is_counted_once(tmp_path):
    with schema.DatasetWriter(tmp_path / "ds") as w:
        rel, n = schema.write_kernels(_kernels(), w.directory, "r", 0)  # as a worker process does
        assert (rel, n) == ("kernels/r/rank0.parquet", 3)
        w.add_kernels_file(rel, n, "r", 0)
        with pytest.raises(ValueError, match="rank 0 appears twice"):
            w.add_kernels_file(rel, n, "r", 0)
        w.commit()
    meta = schema.read_metadata(tmp_path / "ds")
    assert meta["kernel_files"] == ["kernels/r/rank0.parquet"] and meta["n_kernels"] == 3
    assert schema.read_kernels(tmp_path / "ds").column("start_ns").to_pylist() == [0, 10, 20]  # sorted on write


def test_write_kernels_never_recreates_a_removed_dataset_directory(tmp_path):
    with schema.DatasetWriter(tmp_path / "ds") as w:
        directory = w.directory
    assert not directory.exists()  # a worker still writing after a failure must not bring it back
    with pytest.raises(FileNotFoundError):
        schema.write_kernels(_kernels(), directory, "r", 0)
    assert not directory.exists()


@pytest.mark.parametrize("damage", ["truncate", "garbage", "remove"])
def test_a_damaged_dataset_file_is_named_in_one_line(tmp_path, damage):
    import subprocess
    import sys

    import pyarrow.compute as pc

    out = tmp_path / "ds"
    with schema.DatasetWriter(out, rules=default_rules().to_dict()) as w:
        w.add_kernels(_kernels(run_id="a"), "a", 0)
        w.add_kernels(_kernels(run_id="a", rank=1), "a", 1)
        w.add("runs", pa.table({"run_id": ["a"], "source": ["imported"]}))
        w.commit()
    victim = out / schema.read_metadata(out)["kernel_files"][1]
    runs = out / "runs.parquet"
    runs_bytes = runs.read_bytes()
    for f in (victim, runs):
        data = f.read_bytes()
        if damage == "truncate":
            f.write_bytes(data[: len(data) // 2])
        elif damage == "garbage":
            f.write_bytes(b"\0" * len(data))
        else:
            f.unlink()
    reads = [
        lambda: schema.read_kernels(out),  # one reader per file
        lambda: schema.read_kernels(out, filter=pc.field("rank") == 1),  # the dataset scan
    ]
    for read in reads:
        with pytest.raises(ValueError) as err:
            read()
        assert str(victim) in str(err.value) and "\n" not in str(err.value), str(err.value)
    if damage != "remove":  # a missing small table reads as empty (older datasets lack some)
        with pytest.raises(ValueError, match=str(runs)):
            schema.read_table(out, "runs")
    runs.write_bytes(runs_bytes)  # the command names the first damaged file it reads: the kernels file alone is, now
    cli = subprocess.run([sys.executable, "-m", "overlapviz", "analyze", str(out)], capture_output=True, text=True)
    assert cli.returncode == 1 and str(victim) in cli.stderr and len(cli.stderr.strip().splitlines()) == 1, cli.stderr


@pytest.mark.parametrize("n", [10, schema._COMPRESS_MIN_ROWS])
def test_kernels_files_keep_dictionaries_for_text_where_compressed(tmp_path, n):
    """A compressed (large) kernels file has dictionary pages for its text columns only: on times and ids they cost a
    third of the write and grow the file. A small one (not compressed) keeps them for every column. Read back: the
    same table either way."""
    table = schema.conform(_kernels(n), schema.KERNELS)
    (tmp_path / "kernels").mkdir()
    rel, rows = schema.write_kernels(table, tmp_path, "r", 0)
    meta = pq.ParquetFile(tmp_path / rel).metadata
    encoded = {meta.schema.column(i).name for i in range(meta.num_columns)
               if any("DICTIONARY" in e for e in meta.row_group(0).column(i).encodings)}  # fmt: skip
    text = {f.name for f in schema.KERNELS if pa.types.is_string(f.type)}
    every = {f.name for f in schema.KERNELS if not pa.types.is_boolean(f.type)}  # Parquet has no boolean dictionaries
    assert encoded == (text if n >= schema._COMPRESS_MIN_ROWS else every)
    assert rows == n and schema.conform(pq.read_table(tmp_path / rel), schema.KERNELS).equals(table.sort_by("start_ns"))
