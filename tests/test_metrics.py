"""Overlap metrics: hand-computed TraceLens-style edge cases, hypothesis invariants, and an
independent brute force of DESIGN.md's definitions on a discrete time grid.

Edge cases covered by name: touching ends do not overlap; zero-length activities count
in ``n_kernels`` but add no time; nested kernels; overlapping kernels on the same
stream; comm without compute; compute without comm; memory-only groups; null steps.
"""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from overlapviz.dataset import schema
from overlapviz.analysis.metrics import analyze, metric_columns, overlap_metrics
from overlapviz.testing import reference_metrics

KINDS = ("comm", "compute", "memory", "other")


def frame(rows, *, run_id="r", rank=0):
    """Kernels from ``(kind, start_ns, end_ns[, step])`` tuples (an edge-case builder)."""
    return pd.DataFrame(
        {
            "run_id": run_id,
            "rank": rank,
            "kind": [r[0] for r in rows],
            "start_ns": pd.array([r[1] for r in rows], dtype="int64"),
            "end_ns": pd.array([r[2] for r in rows], dtype="int64"),
            "step": pd.array([r[3] if len(r) > 3 else None for r in rows], dtype="Int64"),
        }
    )


def one(rows, **kw) -> dict:
    out = overlap_metrics(frame(rows), **kw)
    assert len(out) == 1
    return out.iloc[0].to_dict()


def test_columns_and_dtypes():
    out = overlap_metrics(frame([("comm", 0, 10)]))
    assert list(out.columns) == metric_columns("rank")
    assert "step" not in out.columns
    for c in metric_columns("rank")[2:]:
        assert out[c].dtype == (np.int64 if c.startswith("n_") else np.float64), c
    stepped = overlap_metrics(frame([("comm", 0, 10, 3)]), per="step")
    assert list(stepped.columns) == metric_columns("step")


def test_partial_overlap_hand_computed():
    # comm [0,100) ; compute [50,150) and [200,300) ; memory [0,1000) ; other [400,410)
    m = one([("comm", 0, 100), ("compute", 50, 150), ("compute", 200, 300), ("memory", 0, 1000), ("other", 400, 410)])
    assert m["comm_us"] == 0.1 and m["compute_us"] == 0.2
    assert m["overlap_us"] == 0.05 and m["exposed_comm_us"] == 0.05
    assert m["overlap_fraction"] == 0.5
    assert m["span_us"] == 0.41  # memory excluded; 'other' included
    assert m["busy_us"] == 0.26 and math.isclose(m["idle_us"], 0.15)
    assert m["memory_us"] == 1.0
    assert m["n_kernels"] == 4 and m["n_comm_kernels"] == 1


def test_touching_ends_do_not_overlap():
    m = one([("comm", 0, 100), ("compute", 100, 200)])
    assert m["overlap_us"] == 0 and m["overlap_fraction"] == 0
    assert m["exposed_comm_us"] == 0.1 and m["idle_us"] == 0


def test_zero_duration_counts_but_adds_no_time():
    m = one([("comm", 50, 50), ("compute", 0, 100), ("comm", 10, 10)])
    assert m["n_kernels"] == 3 and m["n_comm_kernels"] == 2
    assert m["comm_us"] == 0 and math.isnan(m["overlap_fraction"])


def test_zero_duration_bounds_the_span():
    m = one([("compute", 0, 100), ("compute", 500, 500)])
    assert m["span_us"] == 0.5 and m["busy_us"] == 0.1 and m["idle_us"] == 0.4


def test_nested_and_same_stream_overlaps_are_counted_once():
    m = one([("comm", 0, 1000), ("comm", 100, 200), ("compute", 300, 900), ("compute", 400, 500), ("compute", 850, 1500)])
    assert m["comm_us"] == 1.0 and m["compute_us"] == 1.2 and m["overlap_us"] == 0.7
    assert math.isclose(m["overlap_fraction"], 0.7)


def test_comm_without_compute():
    m = one([("comm", 0, 100), ("comm", 200, 300)])
    assert m["overlap_fraction"] == 0 and m["exposed_comm_us"] == 0.2 and m["compute_us"] == 0
    assert m["idle_us"] == 0.1


def test_compute_without_comm_has_null_fraction():
    m = one([("compute", 0, 100)])
    assert m["comm_us"] == 0 and math.isnan(m["overlap_fraction"]) and m["exposed_comm_us"] == 0


def test_memory_only_group_has_null_span():
    m = one([("memory", 0, 100)])
    assert m["n_kernels"] == 0 and math.isnan(m["span_us"]) and math.isnan(m["idle_us"])
    assert m["memory_us"] == 0.1 and m["busy_us"] == 0


def test_full_overlap_and_exact_microseconds():
    # odd ns values: µs are exact ns / 1000, not rounded to whole µs as HTA does
    m = one([("comm", 1_001, 2_003), ("compute", 0, 10_007)])
    assert m["comm_us"] == 1.002 and m["overlap_fraction"] == 1.0 and m["span_us"] == 10.007


def test_per_step_leaves_out_null_steps_and_keeps_steps_apart():
    rows = [("comm", 0, 100, 1), ("compute", 50, 150, 2), ("compute", 0, 1000, None), ("comm", 500, 600, 2)]
    out = overlap_metrics(frame(rows), per="step")
    assert out["step"].tolist() == [1, 2]
    s1, s2 = out.iloc[0], out.iloc[1]
    assert s1["overlap_us"] == 0 and s1["comm_us"] == 0.1 and s1["n_kernels"] == 1
    assert s2["overlap_us"] == 0 and s2["span_us"] == 0.55 and s2["n_kernels"] == 2
    whole = overlap_metrics(frame(rows)).iloc[0]
    assert whole["overlap_us"] == 0.2 and whole["n_kernels"] == 4  # the null-step compute covers both


def test_groups_sorted_and_separate_runs_and_ranks():
    a = frame([("comm", 0, 10)], run_id="b", rank=1)
    b = frame([("compute", 0, 10)], run_id="a", rank=3)
    c = frame([("compute", 0, 10)], run_id="b", rank=0)
    out = overlap_metrics(pd.concat([a, b, c]))
    assert list(zip(out["run_id"], out["rank"])) == [("a", 3), ("b", 0), ("b", 1)]
    assert out["overlap_us"].tolist() == [0, 0, 0]  # no overlap across ranks


def test_arrow_input_and_input_not_modified():
    df = frame([("comm", 0, 100), ("compute", 50, 150)])
    before = df.copy()
    t = pa.Table.from_pandas(df, preserve_index=False)
    assert overlap_metrics(t).equals(overlap_metrics(df))
    pd.testing.assert_frame_equal(df, before)


def test_empty_input():
    out = overlap_metrics(frame([]))
    assert out.empty and list(out.columns) == metric_columns("rank")


@pytest.mark.parametrize(
    "df, message",
    [
        (frame([("comm", 10, 5)]), "end_ns < start_ns"),
        (frame([("comm", 0, 5)]).drop(columns="kind"), "missing column"),
        (frame([("comm", 0, 5)]).assign(kind=[None]), "kernels.kind"),
        (frame([("comm", 0, 5)]).assign(start_ns=pd.array([None], dtype="Int64")), "kernels.start_ns"),
    ],
)
def test_bad_input_raises_naming_the_field(df, message):
    with pytest.raises(ValueError, match=message):
        overlap_metrics(df)


def test_bad_per():
    with pytest.raises(ValueError, match="per="):
        overlap_metrics(frame([]), per="device")


# --- hypothesis: invariants and an independent brute force -----------------------------

T_MAX = 80
activities = st.lists(
    st.tuples(
        st.sampled_from(["a", "b"]),  # run_id
        st.integers(0, 2),  # rank
        st.sampled_from(KINDS),
        st.integers(0, T_MAX),
        st.integers(0, 30),  # duration, zero included
        st.one_of(st.none(), st.integers(0, 2)),  # step
    ),
    max_size=40,
)


def _frame_of(rows) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "run_id": pd.Series([r[0] for r in rows], dtype=object),
            "rank": pd.array([r[1] for r in rows], dtype="int32"),
            "kind": pd.Series([r[2] for r in rows], dtype=object),
            "start_ns": pd.array([r[3] for r in rows], dtype="int64"),
            "end_ns": pd.array([r[3] + r[4] for r in rows], dtype="int64"),
            "step": pd.array([r[5] for r in rows], dtype="Int64"),
        }
    )


def _brute_force(rows, per: str) -> dict:
    """DESIGN.md by the letter per group, from overlapviz.testing's reference computation
    (plain-integer interval unions, independent of overlapviz.analysis.intervals)."""
    groups: dict = {}
    for run_id, rank, kind, start, dur, step in rows:
        if per == "step" and step is None:
            continue
        key = (run_id, rank, step) if per == "step" else (run_id, rank)
        groups.setdefault(key, []).append((kind, start, start + dur))
    return {key: reference_metrics(acts) for key, acts in groups.items()}


def _as_dict(out: pd.DataFrame, per: str) -> dict:
    keys = ["run_id", "rank"] + (["step"] if per == "step" else [])
    res = {}
    for rec in out.to_dict("records"):
        key = tuple(rec.pop(k) for k in keys)
        res[key] = {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in rec.items()}
    return res


@settings(max_examples=250, deadline=None)
@given(activities, st.sampled_from(["rank", "step"]))
def test_matches_brute_force(rows, per):
    got = _as_dict(overlap_metrics(_frame_of(rows), per=per), per)
    want = _brute_force(rows, per)
    assert got.keys() == want.keys()
    for key in want:
        for col, v in want[key].items():
            g = got[key][col]
            assert (g is None) == (v is None), (key, col, g, v)
            if v is not None:
                assert math.isclose(g, v, rel_tol=1e-12, abs_tol=1e-15), (key, col, g, v)


@settings(max_examples=250, deadline=None)
@given(activities, st.sampled_from(["rank", "step"]), st.randoms(use_true_random=False))
def test_invariants_and_row_order(rows, per, rnd):
    df = _frame_of(rows)
    out = overlap_metrics(df, per=per)
    assert np.allclose(out["comm_us"], out["overlap_us"] + out["exposed_comm_us"])
    assert (out["overlap_us"] <= np.minimum(out["comm_us"], out["compute_us"])).all()
    assert (out["overlap_us"] >= 0).all() and (out["exposed_comm_us"] >= 0).all()
    has_span = out["span_us"].notna()
    assert (out["busy_us"][has_span] <= out["span_us"][has_span]).all()
    assert (out["idle_us"][has_span] >= 0).all()
    assert (out["busy_us"] >= np.maximum(out["comm_us"], out["compute_us"])).all()
    frac = out["overlap_fraction"]
    assert ((frac >= 0) & (frac <= 1) | frac.isna()).all()
    assert (frac.isna() == (out["comm_us"] == 0)).all()
    assert (out["n_comm_kernels"] <= out["n_kernels"]).all()

    perm = list(range(len(rows)))
    rnd.shuffle(perm)
    shuffled = overlap_metrics(df.iloc[perm].reset_index(drop=True), per=per)
    pd.testing.assert_frame_equal(out, shuffled)


@settings(max_examples=100, deadline=None)
@given(activities)
def test_groups_independent(rows):
    df = _frame_of(rows)
    out = overlap_metrics(df)
    for (run_id, rank), part in df.groupby(["run_id", "rank"]):
        alone = overlap_metrics(part).reset_index(drop=True)
        mine = out[(out["run_id"] == run_id) & (out["rank"] == rank)].reset_index(drop=True)
        pd.testing.assert_frame_equal(alone, mine)


# --- from a dataset ---------------------------------------------------------------


def write_dataset(path, frames: dict) -> None:
    """A dataset with one kernels file per (run_id, rank), written through the schema's writer."""
    with schema.DatasetWriter(path) as w:
        for (run_id, rank), df in frames.items():
            t = pa.Table.from_pandas(df.assign(run_id=run_id, rank=rank), preserve_index=False)
            w.add_kernels(schema.conform(t, schema.KERNELS), run_id, rank)
        runs = pd.DataFrame({"run_id": sorted({r for r, _ in frames})})
        w.add("runs", runs)
        w.commit()


def test_analyze_dataset_equals_in_memory(tmp_path):
    frames = {
        ("run-a", 0): frame([("comm", 0, 100, 1), ("compute", 50, 150, 1), ("memory", 0, 10, 1)]),
        ("run-a", 1): frame([("comm", 0, 100, 1), ("compute", 100, 150, 2)]),
        ("run-b", 0): frame([("compute", 0, 100, None)]),
    }
    write_dataset(tmp_path / "ds", frames)
    whole = pd.concat([df.assign(run_id=r, rank=k) for (r, k), df in frames.items()])
    for per in ("rank", "step"):
        pd.testing.assert_frame_equal(analyze(tmp_path / "ds", per=per), overlap_metrics(whole, per=per))
    only_b = analyze(tmp_path / "ds", run_ids=["run-b"])
    assert only_b["run_id"].tolist() == ["run-b"] and only_b["compute_us"].tolist() == [0.1]
    with pytest.raises(ValueError, match="no run 'nope'"):
        analyze(tmp_path / "ds", run_ids=["nope"])


def test_arrow_results_equal_the_pandas_results(tmp_path):
    """analyze_table / overlap_table: the same rows as the pandas API, typed columns, null for NaN."""
    from overlapviz.analysis.metrics import analyze_table, overlap_table, result_schema

    frames = {
        ("run-a", 0): frame([("comm", 0, 100, 1), ("compute", 50, 150, 1), ("memory", 0, 10, 1)]),
        ("run-a", 1): frame([("memory", 0, 100, 1)]),  # memory only: null span and fraction
        ("run-b", 3): frame([("compute", 0, 100, None), ("comm", 10, 10, 2)]),  # zero-length comm
    }
    write_dataset(tmp_path / "ds", frames)
    whole = pd.concat([df.assign(run_id=r, rank=k) for (r, k), df in frames.items()])
    for per in ("rank", "step"):
        table = analyze_table(tmp_path / "ds", per=per)
        assert table.schema == result_schema(per)
        assert table.equals(overlap_table(pa.Table.from_pandas(whole, preserve_index=False), per=per))
        pandas = analyze(tmp_path / "ds", per=per)
        assert pandas["run_id"].dtype == object and pandas.index.equals(pd.RangeIndex(len(pandas)))
        for c in table.column_names:
            got = table.column(c).to_pylist()
            want = [None if isinstance(v, float) and math.isnan(v) else v for v in pandas[c].tolist()]
            assert got == want, c
    by_rank = analyze_table(tmp_path / "ds").to_pylist()
    assert by_rank[1]["span_us"] is None and by_rank[1]["idle_us"] is None and by_rank[1]["overlap_fraction"] is None
    assert by_rank[1]["memory_us"] == 0.1 and by_rank[2]["overlap_fraction"] is None and by_rank[2]["n_comm_kernels"] == 1
    batch = pa.Table.from_pandas(whole, preserve_index=False).combine_chunks().to_batches()[0]
    assert overlap_table(batch).equals(analyze_table(tmp_path / "ds"))


def test_analyze_not_a_dataset(tmp_path):
    with pytest.raises(ValueError, match="not an overlapviz dataset"):
        analyze(tmp_path)


# --- real traces against an independent computation from the raw JSON ------------------

DATA = Path(__file__).parent / "data"
REAL_TRACES = {
    "hta_trace_filter_2rank": sorted((DATA / "hta_trace_filter_2rank").glob("*.json.gz")),
    "hta_nccl_parser_config": sorted((DATA / "hta_nccl_parser_config").glob("*.json.gz")),
    "torch_rocm_resnet": [DATA / "torch_rocm" / "resnet_act_checkpoint.json.gz"],
    "torch_rocm_gpu_only": [DATA / "torch_rocm" / "gpu_only_trace.json.gz"],
    "gloo_cpu": sorted((DATA / "gloo_cpu").glob("*.json.gz")),
}


def _reference_module():
    spec = importlib.util.spec_from_file_location(
        "ovz_bench_reference", Path(__file__).parents[1] / "benchmarks" / "reference.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name", sorted(REAL_TRACES))
def test_real_trace_equals_independent_computation(tmp_path, name):
    from overlapviz.ingest import ingest

    files = REAL_TRACES[name]
    assert files and all(f.exists() for f in files), files
    ingest(files, tmp_path / "ds", progress=False)
    got = analyze(tmp_path / "ds")
    want = _reference_module().trace_dir_metrics(files)
    assert sorted(got["rank"]) == sorted(want)
    for rec in got.to_dict("records"):
        ref = want[rec["rank"]]
        assert ref["n_kernels"] > 0
        for col, v in ref.items():
            g = rec[col]
            if v is None:
                assert math.isnan(g), (rec["rank"], col)
            else:
                assert math.isclose(g, v, rel_tol=1e-9, abs_tol=1e-12), (rec["rank"], col, g, v)


@pytest.mark.parametrize("name", sorted(REAL_TRACES))
def test_real_trace_per_step_equals_independent_computation(tmp_path, name):
    """Step membership (launch call inside a ProfilerStep range, by correlation) and the metrics per step."""
    from overlapviz.ingest import ingest

    files = REAL_TRACES[name]
    ingest(files, tmp_path / "ds", progress=False)
    got = analyze(tmp_path / "ds", per="step")
    reference = _reference_module()
    want = {}
    for i, f in enumerate(files):
        doc = reference.load(f)
        rank = int((doc.get("distributedInfo") or {}).get("rank", i))
        for step, m in reference.step_metrics(doc).items():
            want[(rank, step)] = m
    assert sorted(zip(got["rank"], got["step"])) == sorted(want)
    for rec in got.to_dict("records"):
        ref = want[(rec["rank"], rec["step"])]
        for col, v in ref.items():
            g = rec[col]
            if v is None:
                assert math.isnan(g), (rec["rank"], rec["step"], col)
            else:
                assert math.isclose(g, v, rel_tol=1e-9, abs_tol=1e-12), (rec["rank"], rec["step"], col, g, v)


def test_wide_key_ranges_and_negative_times():
    # steps far apart take the hashing path of the group codes; negative ns are legal times
    rows = [("comm", -100, 0, 10**15), ("compute", -50, 50, 10**15), ("comm", 0, 10, -3), ("compute", 5, 20, -3)]
    out = overlap_metrics(frame(rows), per="step")
    assert out["step"].tolist() == [-3, 10**15]
    assert out["overlap_us"].tolist() == [0.005, 0.05]
    assert out["span_us"].tolist() == [0.02, 0.15]


def test_dictionary_encoded_keys_and_kinds_give_the_same_rows():
    """analyze_table reads run_id and kind dictionary-encoded; chunks with their own
    dictionaries, unused and repeated dictionary values must not split or invent groups."""
    from overlapviz.analysis.metrics import overlap_table

    plain = pa.Table.from_pandas(
        pd.concat([frame([("comm", 0, 100), ("compute", 50, 150)], run_id="b", rank=1),
                   frame([("memory", 0, 10), ("compute", 5, 8)], run_id="a", rank=0)]),
        preserve_index=False,
    ).select(["run_id", "rank", "kind", "start_ns", "end_ns"])  # fmt: skip

    def dict_chunk(values, dictionary):
        idx = [dictionary.index(v) for v in values]
        return pa.DictionaryArray.from_arrays(pa.array(idx, pa.int32()), pa.array(dictionary))

    run = pa.chunked_array([dict_chunk(["b", "b"], ["zz", "b", "b"]), dict_chunk(["a", "a"], ["a"])])
    kind = pa.chunked_array([dict_chunk(["comm", "compute"], ["compute", "comm", "comm"]),
                             dict_chunk(["memory", "compute"], ["memory", "compute", "other"])])  # fmt: skip
    encoded = pa.table({"run_id": run, "rank": plain.column("rank"), "kind": kind,
                        "start_ns": plain.column("start_ns"), "end_ns": plain.column("end_ns")})  # fmt: skip
    assert overlap_table(encoded).equals(overlap_table(plain))
    assert overlap_table(encoded).column("run_id").to_pylist() == ["a", "b"]


def test_times_further_apart_than_int64_are_refused_not_wrapped(tmp_path):
    # each time fits int64 ns; the span does not (it printed span_us -46744073709548.62); ingest refuses
    # such traces now, a dataset written before may hold them
    from click.testing import CliRunner

    from overlapviz.cli import main
    from overlapviz.testing import kernel_row, write_rows_dataset

    low, high = -9_200_000_000_000_000_000, 9_200_000_000_000_000_000
    ds = write_rows_dataset(tmp_path / "ds", [kernel_row("a", "compute", 7, low, low + 1000, base=0),
                                              kernel_row("b", "comm", 7, high, high + 1000, base=0)])  # fmt: skip
    result = CliRunner().invoke(main, ["analyze", str(ds), "--format", "json"])
    assert result.exit_code == 1, result.output
    assert "further apart than int64" in result.output and "-4674" not in result.output
