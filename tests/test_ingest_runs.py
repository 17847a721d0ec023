"""Which runs sources make (#15 item 5): a lone file's run named after it, unrelated traces in one directory a run
each, --skip-bad's summary and exit status, and --append (atomic: the dataset is byte-identical when it fails)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from overlapviz.dataset import schema
from overlapviz.cli import main
from overlapviz.ingest import ingest
from overlapviz.ingest.discover import file_run_name
from overlapviz.testing import kernel_event, kineto_trace, runtime_event, write_trace

DATA = Path(__file__).parent / "data"
REFERENCE_TORCH_ROCM = Path("/work/shared/reference_traces/torch_rocm")


def doc(**kw) -> dict:
    return kineto_trace(runtime_event(1, 0), kernel_event("k", 10_000, 5_000, correlation=1), **kw)


def cli(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def runs_of(ds) -> dict:
    r = schema.read_frame(ds, "runs")
    return dict(zip(r["run_id"], r["n_ranks"].astype(int)))


def tree_digest(path: Path) -> str:
    """Every file's relative path and bytes, and the directory's listing."""
    h = hashlib.sha256()
    for p in sorted(path.rglob("*")):
        h.update(str(p.relative_to(path)).encode())
        if p.is_file():
            h.update(p.read_bytes())
    return h.hexdigest()


# --- naming and grouping ------------------------------------------------------------------------


@pytest.mark.parametrize("name, run", [("worker0_step_12.1694128201545.pt.trace.json.gz", "worker0_step_12.1694128201545"),
                                       ("rank3.json", "rank3"), ("trace.JSON.GZ", "trace"), ("report.sqlite", "report"),
                                       ("results.csv", "results"), (".json", ".json")])  # fmt: skip
def test_file_run_name(name, run):
    assert file_run_name(Path(name)) == run


def test_a_lone_file_is_a_run_named_after_it(tmp_path):
    path = write_trace(doc(rank=0, world_size=1), tmp_path / "job" / "bert_step3.pt.trace.json.gz")
    assert runs_of(ingest([path], tmp_path / "ds", progress=False)) == {"bert_step3": 1}
    # several files named from one directory stay that directory's run (ranks of one job)
    b = write_trace(doc(rank=1, world_size=2), tmp_path / "job" / "b.json")
    a = write_trace(doc(rank=0, world_size=2), tmp_path / "job" / "a.json")
    assert runs_of(ingest([a, b], tmp_path / "ds2", progress=False)) == {"job": 2}


def test_unrelated_traces_in_one_directory_are_a_run_each(tmp_path):
    """Both rank 0: not one job's ranks."""
    write_trace(doc(rank=0, world_size=1), tmp_path / "mixed" / "bert.json.gz")
    write_trace(doc(rank=0, world_size=1), tmp_path / "mixed" / "resnet.json")
    assert runs_of(ingest([tmp_path / "mixed"], tmp_path / "ds", progress=False)) == {"bert": 1, "resnet": 1}


@pytest.mark.parametrize("docs, expected", [
    # distinct ranks of one world: one job
    ([doc(rank=0, world_size=2), doc(rank=1, world_size=2)], {"job": 2}),
    # a world of one process each, distinct ranks by position: two single-process traces
    ([doc(rank=0, world_size=1), doc(rank=None)], {"f0": 1, "f1": 1}),
    # world sizes that disagree: two jobs
    ([doc(rank=0, world_size=4), doc(rank=1, world_size=8)], {"f0": 1, "f1": 1}),
    # nothing said (no distributedInfo): ranks of one job by name order, as before
    ([doc(rank=None), doc(rank=None)], {"job": 2}),
])  # fmt: skip
def test_the_one_job_rule(tmp_path, docs, expected):
    for i, d in enumerate(docs):
        write_trace(d, tmp_path / "job" / f"f{i}.json")
    assert runs_of(ingest([tmp_path / "job"], tmp_path / "ds", progress=False)) == expected


def test_split_runs_that_clash_with_other_runs_are_an_error(tmp_path):
    write_trace(doc(rank=0), tmp_path / "mixed" / "a.json")
    write_trace(doc(rank=0), tmp_path / "mixed" / "b.json")
    write_trace(doc(rank=0), tmp_path / "other" / "a.json.gz")
    res = cli("ingest", tmp_path / "mixed", tmp_path / "other" / "a.json.gz", "-o", tmp_path / "ds")
    assert res.exit_code == 1 and "run id 'a' appears twice" in res.output and not (tmp_path / "ds").exists()


@pytest.mark.skipif(not REFERENCE_TORCH_ROCM.is_dir(), reason="shared reference traces not present")
def test_reference_torch_rocm_directory(tmp_path):
    ds = ingest([REFERENCE_TORCH_ROCM], tmp_path / "ds", progress=False)
    assert runs_of(ds) == {"gaunernst_bert-small-uncased__1016001": 1, "gpu_only_trace": 1, "resnet_act_checkpoint": 1}


def test_ranks_of_one_job_in_tests_data_stay_one_run(tmp_path):
    ds = ingest([DATA / "kineto_real" / "param_dlrm_8rank", DATA / "hta_trace_filter_2rank", DATA / "gloo_cpu"], tmp_path / "ds",
                progress=False)  # fmt: skip
    assert runs_of(ds) == {"param_dlrm_8rank": 8, "hta_trace_filter_2rank": 2, "gloo_cpu": 2}


# --- --skip-bad -----------------------------------------------------------------------------------


def test_skip_bad_goes_on_and_says_what_it_left_out(tmp_path):
    good = write_trace(doc(rank=0), tmp_path / "in" / "good.json")
    (tmp_path / "in" / "empty.json").write_bytes(b"")
    (tmp_path / "in" / "truncated.json.gz").write_bytes(b"\x1f\x8b\x08\x00garbage")
    (tmp_path / "in" / "notes.txt").write_text("hello")
    rocprof = DATA / "rocprof" / "v2" / "rocprofiler_goldentraces" / "hip_helloworld_golden_traces.txt"
    args = [good, tmp_path / "in" / "empty.json", tmp_path / "in" / "truncated.json.gz", tmp_path / "in" / "notes.txt",
            tmp_path / "missing.json", rocprof]  # fmt: skip
    strict = cli("ingest", *args, "-o", tmp_path / "ds")
    assert strict.exit_code == 1 and not (tmp_path / "ds").exists()
    res = cli("ingest", *args, "-o", tmp_path / "ds", "--skip-bad")
    assert res.exit_code == 0, res.output
    assert "skipped 5 sources (--skip-bad):" in res.output
    for name in ("empty.json", "truncated.json.gz", "notes.txt", "missing.json", "hip_helloworld_golden_traces.txt"):
        line = next(line for line in res.output.splitlines() if name in line)
        assert line.startswith("  ") and ": " in line.strip()
    assert "no such file or directory" in res.output and "nothing to ingest" in res.output
    assert runs_of(tmp_path / "ds") == {"good": 1}
    assert len(list((tmp_path / "ds" / "kernels").glob("*/*.parquet"))) == 1


def test_skip_bad_in_a_directory_keeps_the_good_ranks_and_leaves_no_stray_files(tmp_path):
    write_trace(doc(rank=0, world_size=3), tmp_path / "job" / "rank0.json")
    write_trace(doc(rank=1, world_size=3), tmp_path / "job" / "rank1.json")
    (tmp_path / "job" / "rank2.json").write_text('{"traceEvents": [')
    res = cli("ingest", tmp_path / "job", "-o", tmp_path / "ds", "--skip-bad")
    assert res.exit_code == 0 and "rank2.json" in res.output
    assert runs_of(tmp_path / "ds") == {"job": 2}
    meta = schema.read_metadata(tmp_path / "ds")
    on_disk = sorted(p.relative_to(tmp_path / "ds").as_posix() for p in (tmp_path / "ds" / "kernels").rglob("*.parquet"))
    assert on_disk == sorted(meta["kernel_files"])


def test_skip_bad_with_nothing_readable_exits_1_and_writes_nothing(tmp_path):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "empty.json").write_bytes(b"")
    res = cli("ingest", tmp_path / "in" / "empty.json", tmp_path / "nope", "-o", tmp_path / "ds", "--skip-bad")
    assert res.exit_code == 1 and "skipped 2 sources" in res.output and "nothing" in res.output
    assert not (tmp_path / "ds").exists() and sorted(os.listdir(tmp_path)) == ["in"]


# --- --append -------------------------------------------------------------------------------------


@pytest.fixture()
def base(tmp_path) -> Path:
    ds = tmp_path / "ds"
    assert cli("ingest", DATA / "gloo_cpu", "-o", ds, "-q").exit_code == 0
    return ds


def test_append_adds_runs_and_keeps_the_old_ones_as_they_were(tmp_path, base):
    old = schema.read_kernels(base).to_pandas().sort_values(["rank", "start_ns"]).reset_index(drop=True)
    res = cli("ingest", DATA / "hta_trace_filter_2rank", "-o", base, "--append")
    assert res.exit_code == 0, res.output
    assert "appended to" in res.output and "(1 new run)" in res.output and "2 runs" in res.output
    assert runs_of(base) == {"gloo_cpu": 2, "hta_trace_filter_2rank": 2}
    meta = schema.read_metadata(base)
    assert meta["runs"] == ["gloo_cpu", "hta_trace_filter_2rank"] and len(meta["ingested_from"]) == 2
    kept = schema.read_kernels(base, run_ids=["gloo_cpu"]).to_pandas().sort_values(["rank", "start_ns"]).reset_index(drop=True)
    assert kept.equals(old)
    assert sorted(schema.read_frame(base, "ranks")["run_id"]) == ["gloo_cpu", "gloo_cpu", "hta_trace_filter_2rank", "hta_trace_filter_2rank"]
    # the analysis sees both
    assert cli("analyze", base, "--run", "hta_trace_filter_2rank").exit_code == 0


def test_append_of_a_run_already_there_is_an_error_unless_overwrite(tmp_path, base):
    digest = tree_digest(base)
    res = cli("ingest", DATA / "gloo_cpu", "-o", base, "--append")
    assert res.exit_code == 1 and "already has run 'gloo_cpu'" in res.output and "--overwrite" in res.output
    assert tree_digest(base) == digest
    # --run-id gives the same traces another id
    assert cli("ingest", DATA / "gloo_cpu", "-o", base, "--append", "--run-id", "gloo_again", "-q").exit_code == 0
    assert runs_of(base) == {"gloo_cpu": 2, "gloo_again": 2}
    # --overwrite replaces the run of that id (and only it)
    one = write_trace(doc(rank=0, world_size=1), tmp_path / "x" / "one.json")
    assert cli("ingest", one, "-o", base, "--append", "--overwrite", "--run-id", "gloo_cpu", "-q").exit_code == 0
    assert runs_of(base) == {"gloo_again": 2, "gloo_cpu": 1}
    assert len(schema.read_kernels(base, run_ids=["gloo_cpu"])) == 1


@pytest.mark.parametrize("make, message", [
    (lambda p: p, "no such dataset to append to"),
    (lambda p: p.mkdir() or p, "not an overlapviz dataset"),
    (lambda p: (p.mkdir(), (p / "keep.txt").write_text("mine")) and p, "not an overlapviz dataset"),
    (lambda p: (p.write_text("a file")) and p, "not an overlapviz dataset"),
])  # fmt: skip
def test_append_to_what_is_not_a_dataset(tmp_path, make, message):
    target = make(tmp_path / "target")
    digest = tree_digest(tmp_path)
    res = cli("ingest", DATA / "gloo_cpu", "-o", target, "--append")
    assert res.exit_code == 1 and message in res.output and res.output.count("\n") == 1, res.output
    assert tree_digest(tmp_path) == digest


def test_a_failed_append_leaves_the_dataset_byte_identical(tmp_path, base):
    digest = tree_digest(base)
    bad = tmp_path / "bad" / "broken.json"
    bad.parent.mkdir()
    bad.write_text('{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": "x"')
    res = cli("ingest", bad, "-o", base, "--append")
    assert res.exit_code == 1 and "broken.json" in res.output
    assert tree_digest(base) == digest
    assert sorted(os.listdir(tmp_path)) == ["bad", "ds"]  # no temporary directory left beside it


def test_append_with_other_kind_rules_keeps_each_runs_rules(tmp_path, base):
    old_rules = schema.read_frame(base, "runs").set_index("run_id").loc["gloo_cpu", "kind_rules"]
    res = cli("ingest", DATA / "hta_trace_filter_2rank", "-o", base, "--append", "--comm-pattern", "SendRecv", "-q")
    assert res.exit_code == 0, res.output
    runs = schema.read_frame(base, "runs").set_index("run_id")
    assert runs.loc["gloo_cpu", "kind_rules"] == old_rules
    assert "SendRecv" in runs.loc["hta_trace_filter_2rank", "kind_rules"] and "SendRecv" not in old_rules
