"""Bad input through the CLI: a one-line error naming the file and the problem, a non-zero
exit, and nothing written (no dataset, no temporary directory left beside it)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from overlapviz.cli import main
from overlapviz.testing import kernel_event, kineto_trace, runtime_event, write_trace

NCCL = Path(__file__).parent / "data" / "hta_nccl_parser_config" / "nccl_data.json.gz"


def good_doc(**kw) -> dict:
    return kineto_trace(runtime_event(1, 0), kernel_event("k", 10_000, 5_000, correlation=1), **kw)


def run_cli(tmp_path: Path, *args: str, out: Path | None = None):
    out = out or tmp_path / "out" / "ds"
    out.parent.mkdir(parents=True, exist_ok=True)
    before = sorted(p.name for p in out.parent.iterdir())
    result = CliRunner().invoke(main, ["ingest", *args, "-o", str(out)])
    after = sorted(p.name for p in out.parent.iterdir())
    return result, before, after


def assert_failed(result, before, after, *needles: str) -> str:
    assert result.exit_code != 0
    assert not isinstance(result.exception, (AssertionError, TypeError, KeyError, AttributeError, IndexError))
    msg = result.output.strip()
    assert len(msg.splitlines()) == 1, msg
    assert msg.startswith("Error: ")
    for n in needles:
        assert n in msg, msg
    assert after == before  # nothing half-written, no temp dir left
    return msg


def _write(tmp_path: Path, name: str, data: bytes) -> Path:
    p = tmp_path / "in" / name
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(data)
    return p


def test_truncated_gzip(tmp_path):
    data = NCCL.read_bytes()
    p = _write(tmp_path, "rank0.json.gz", data[: len(data) // 2])
    msg = assert_failed(*run_cli(tmp_path, str(p)), str(p))
    assert "gzip" in msg and ("truncated" in msg or "corrupt" in msg)


def test_corrupt_gzip(tmp_path):
    data = bytearray(gzip.compress(json.dumps(good_doc()).encode()))
    data[20:40] = b"\xff" * 20
    p = _write(tmp_path, "rank0.json.gz", bytes(data))
    msg = assert_failed(*run_cli(tmp_path, str(p)), str(p))
    assert "gzip" in msg or "JSON" in msg


def test_truncated_json(tmp_path):
    text = json.dumps(good_doc())
    p = _write(tmp_path, "rank0.json", text[: len(text) - 40].encode())
    msg = assert_failed(*run_cli(tmp_path, str(p)), str(p))
    assert "JSON" in msg


def test_invalid_json_inside_gzip(tmp_path):
    text = json.dumps(good_doc()).replace('"kernel"', "kernel", 1)
    p = _write(tmp_path, "rank0.json.gz", gzip.compress(text.encode()))
    assert_failed(*run_cli(tmp_path, str(p)), str(p), "JSON")


@pytest.mark.parametrize(
    "content",
    [b'{"hello": "world"}', b"name,start,end\nk,1,2\n", b"", b"[1, 2, 3]", b'{"traceEvents": 5, "schemaVersion": 1}'],
)
def test_not_a_trace(tmp_path, content):
    p = _write(tmp_path, "thing.json", content)
    msg = assert_failed(*run_cli(tmp_path, str(p)), str(p))
    assert "trace" in msg or "empty" in msg


@pytest.mark.parametrize("field", ["ts", "dur", "name"])
def test_missing_field(tmp_path, field):
    doc = good_doc()
    del doc["traceEvents"][1][field]
    p = write_trace(doc, tmp_path / "in" / "rank0.json")
    assert_failed(*run_cli(tmp_path, str(p)), str(p), repr(field))


def test_wrong_type_field(tmp_path):
    doc = good_doc()
    doc["traceEvents"][1]["args"]["stream"] = "seven"
    p = write_trace(doc, tmp_path / "in" / "rank0.json")
    assert_failed(*run_cli(tmp_path, str(p)), str(p), "stream")


def test_negative_duration(tmp_path):
    doc = good_doc()
    doc["traceEvents"][1]["dur"] = -1.5
    p = write_trace(doc, tmp_path / "in" / "rank0.json.gz")
    assert_failed(*run_cli(tmp_path, str(p)), str(p), "negative", "duration")


def test_zero_duration_is_an_activity(tmp_path):
    """DESIGN.md: zero-length activities (integer-µs traces, memsets) are legitimate."""
    doc = good_doc()
    doc["traceEvents"][1]["dur"] = 0.0
    p = write_trace(doc, tmp_path / "in" / "rank0.json.gz")
    result, _, after = run_cli(tmp_path, str(p))
    assert result.exit_code == 0, result.output
    assert after == ["ds"]


def test_duplicate_ranks_name_both_files(tmp_path):
    """Named one run by the user (--run-id), two files with one rank are an error naming both
    (without it they are two unrelated traces: tests/test_ingest_runs.py)."""
    a = write_trace(good_doc(rank=0, world_size=2), tmp_path / "job" / "a.json")
    b = write_trace(good_doc(rank=0, world_size=2), tmp_path / "job" / "b.json")
    msg = assert_failed(*run_cli(tmp_path, str(tmp_path / "job"), "--run-id", "job"), "rank 0")
    assert str(a) in msg and str(b) in msg


def test_empty_directory(tmp_path):
    (tmp_path / "empty").mkdir()
    assert_failed(*run_cli(tmp_path, str(tmp_path / "empty")), str(tmp_path / "empty"), "no traces")


def test_directory_without_traces(tmp_path):
    _write(tmp_path, "notes.txt", b"hello")
    assert_failed(*run_cli(tmp_path, str(tmp_path / "in")), str(tmp_path / "in"), "no traces")


def test_missing_source(tmp_path):
    missing = tmp_path / "nope.json.gz"
    assert_failed(*run_cli(tmp_path, str(missing)), str(missing), "no such file")


def test_unwritable_output(tmp_path):
    p = write_trace(good_doc(), tmp_path / "in" / "rank0.json")
    blocker = tmp_path / "out" / "afile"
    blocker.parent.mkdir(parents=True)
    blocker.write_text("x")
    out = blocker / "ds"  # its parent is a file: nothing can be created there
    result = CliRunner().invoke(main, ["ingest", str(p), "-o", str(out)])
    assert result.exit_code != 0 and len(result.output.strip().splitlines()) == 1
    assert str(out) in result.output
    assert sorted(x.name for x in blocker.parent.iterdir()) == ["afile"]


def test_existing_output_needs_overwrite_and_is_replaced_whole(tmp_path):
    p = write_trace(good_doc(), tmp_path / "in" / "rank0.json")
    out = tmp_path / "out" / "ds"
    out.mkdir(parents=True)
    (out / "keep.txt").write_text("old")
    result, before, after = run_cli(tmp_path, str(p), out=out)
    assert_failed(result, before, after, str(out), "not an overlapviz dataset")
    # issue 13: --overwrite replaces only an overlapviz dataset, never another directory
    result = CliRunner().invoke(main, ["ingest", str(p), "-o", str(out), "--overwrite"])
    assert result.exit_code != 0 and (out / "keep.txt").read_text() == "old"
    (out / "keep.txt").unlink()
    assert CliRunner().invoke(main, ["ingest", str(p), "-o", str(out)]).exit_code == 0
    result, before, after = run_cli(tmp_path, str(p), out=out)
    assert_failed(result, before, after, str(out), "--overwrite")
    # a failing ingest with --overwrite leaves the old dataset in place
    old = (out / "dataset.json").read_bytes()
    bad = _write(tmp_path, "bad.json", b"{")
    result = CliRunner().invoke(main, ["ingest", str(bad), "-o", str(out), "--overwrite"])
    assert result.exit_code != 0 and (out / "dataset.json").read_bytes() == old
    result = CliRunner().invoke(main, ["ingest", str(p), "-o", str(out), "--overwrite", "--run-id", "again"])
    assert result.exit_code == 0, result.output
    assert (out / "dataset.json").read_bytes() != old
    assert sorted(x.name for x in out.parent.iterdir()) == ["ds"]


def test_bad_file_among_good_ones_writes_nothing(tmp_path):
    write_trace(good_doc(rank=0), tmp_path / "job" / "rank0.json.gz")
    data = gzip.compress(json.dumps(good_doc(rank=1)).encode())
    (tmp_path / "job" / "rank1.json.gz").write_bytes(data[:-30])
    assert_failed(*run_cli(tmp_path, str(tmp_path / "job"), "--workers", "2"), "rank1.json.gz")


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--rule", "fast=foo"], "fast"),
        (["--rule", "comm=("], "regular expression"),
        (["--comm-pattern", "[unclosed"], "regular expression"),
    ],
)
def test_bad_rules(tmp_path, args, needle):
    p = write_trace(good_doc(), tmp_path / "in" / "rank0.json")
    assert_failed(*run_cli(tmp_path, str(p), *args), needle)


def test_bad_rules_file(tmp_path):
    p = write_trace(good_doc(), tmp_path / "in" / "rank0.json")
    rf = _write(tmp_path, "rules.json", b'{"rules": [{"kind": "comm", "nope": 1}]}')
    assert_failed(*run_cli(tmp_path, str(p), "--rules-file", str(rf)), str(rf))


def test_run_id_with_many_runs(tmp_path):
    write_trace(good_doc(), tmp_path / "sweep" / "a" / "rank0.json")
    write_trace(good_doc(), tmp_path / "sweep" / "b" / "rank0.json")
    assert_failed(*run_cli(tmp_path, str(tmp_path / "sweep"), "--run-id", "x"), "--run-id")


def test_bad_manifest(tmp_path):
    d = tmp_path / "run"
    write_trace(good_doc(), d / "trace_rank0.json.gz")
    (d / "manifest.json").write_text('{"format": "something-else/2", "run": {}}')
    assert_failed(*run_cli(tmp_path, str(d)), str(d / "manifest.json"), "format")


def test_an_internal_error_says_where_in_overlapviz_it_happened(tmp_path, monkeypatch):
    """A bug while a file is read is one line naming the file, the exception and the innermost frame of overlapviz's
    own code (a one-off ``KeyError: 30`` in CI could not be traced from its line alone)."""
    import inspect

    from overlapviz.ingest import driver, ingest

    def broken(*args, **kwargs):
        raise KeyError(30)

    monkeypatch.delenv(driver.DEBUG_ENV, raising=False)
    monkeypatch.setattr(driver, "finish_kernels", broken)
    write_trace(kineto_trace([kernel_event("gemm", 1_000_000, 2_000_000, correlation=1)]), tmp_path / "t.json")
    with pytest.raises(ValueError) as err:
        ingest([str(tmp_path / "t.json")], tmp_path / "ds", progress=False)
    lines, start = inspect.getsourcelines(driver._read_and_write)
    line = start + next(i for i, text in enumerate(lines) if "finish_kernels(" in text)
    assert f"internal error while reading this file (KeyError: 30 at ingest/driver.py:{line} in _read_and_write)" in str(err.value)
    assert "t.json" in str(err.value) and "\n" not in str(err.value)
    assert not (tmp_path / "ds").exists()


@pytest.mark.parametrize("members", [1, 3])
def test_gzip_inflates_whole_whatever_its_size_trailer_says(tmp_path, monkeypatch, members):
    """The trailer's size (the last member's) is only how much to ask for at once: several members, and members
    larger than a chunk, inflate whole; the inflated-size limit still stops a file at the limit."""
    from overlapviz.ingest import files

    monkeypatch.setattr(files, "_CHUNK", 1000)
    parts = [json.dumps(good_doc(rank=i)).encode() * (30 if i == 0 else 1) for i in range(members)]
    data = b"".join(gzip.compress(p) for p in parts)
    assert files.gunzip_bounded(data, tmp_path / "t.json.gz") == b"".join(parts)
    whole = sum(map(len, parts))
    assert files.gunzip_bounded(data, tmp_path / "t.json.gz", limit=whole) == b"".join(parts)
    with pytest.raises(ValueError, match="inflates to more than"):
        files.gunzip_bounded(data, tmp_path / "t.json.gz", limit=whole - 1)
