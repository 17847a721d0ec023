"""Every analysis command takes a dataset or raw traces (ingested once into a content-keyed cache), and says what a bad path is."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from overlapviz.cli import main
from overlapviz.ingest import ingest

DATA = Path(__file__).parent / "data"
TRACES = DATA / "hta_trace_filter_2rank"


@pytest.fixture()
def runner(tmp_path, monkeypatch):
    monkeypatch.setenv("OVERLAPVIZ_CACHE_DIR", str(tmp_path / "cache"))
    return CliRunner()


@pytest.mark.parametrize("command", [["analyze"], ["explain", "--summary"], ["residency"]])
def test_raw_traces_give_what_their_dataset_gives(runner, tmp_path, command):
    ds = ingest([TRACES], tmp_path / "ds", progress=False)
    want = runner.invoke(main, [command[0], str(ds), *command[1:], "--format", "json"])
    got = runner.invoke(main, [command[0], str(TRACES), *command[1:], "--format", "json"])
    assert want.exit_code == 0 and got.exit_code == 0, got.output
    assert got.stdout == want.stdout
    assert "raw traces, read into" in got.stderr and str(tmp_path / "cache") in got.stderr
    cached = sorted((tmp_path / "cache").glob("traces-*"))  # beside it: tables/, the answers (test_answers.py)
    assert len(cached) == 1 and (cached[0] / "dataset.json").exists()
    again = runner.invoke(main, [command[0], str(TRACES), *command[1:], "--format", "json"])
    assert again.stdout == want.stdout and sorted((tmp_path / "cache").glob("traces-*")) == cached  # read from the cache


@pytest.mark.parametrize("command", ["analyze", "explain", "residency", "compare"])
def test_bad_paths_are_one_line_and_exit_1(runner, tmp_path, command):
    missing = runner.invoke(main, [command, str(tmp_path / "nope")])
    assert missing.exit_code == 1 and "no such file or directory" in missing.output
    text = tmp_path / "notes.txt"
    text.write_text("hello\n")
    bad = runner.invoke(main, [command, str(text)])
    assert bad.exit_code == 1 and str(text) in bad.output and "not an overlapviz dataset" in bad.output
    assert len(bad.output.strip().splitlines()) == 1


def test_a_directory_with_an_unreadable_file_says_how_to_read_the_rest(runner, tmp_path):
    import shutil

    mixed = tmp_path / "mixed"
    shutil.copytree(DATA / "hta_nccl_parser_config", mixed)
    (mixed / "notes.json").write_text('{"traceEvents": [')  # truncated JSON beside a good trace
    bad = runner.invoke(main, ["explain", str(mixed), "--summary"])
    assert bad.exit_code == 1 and len(bad.output.strip().splitlines()) == 1, bad.output
    assert "notes.json" in bad.output and f"overlapviz ingest {mixed} -o DIR --skip-bad" in bad.output
    # and the hint is true: that command reads the good trace
    ok = runner.invoke(main, ["ingest", str(mixed), "-o", str(tmp_path / "ds"), "--skip-bad"])
    assert ok.exit_code == 0, ok.output
    assert runner.invoke(main, ["explain", str(tmp_path / "ds"), "--summary"]).exit_code == 0


def _as_another_user(argv: list[str]) -> tuple[int, str]:
    """``overlapviz ARGV`` run by an account that may not read what this one made unreadable:
    this process when it is not root, else a forked copy of it that became ``nobody`` (root
    reads everything, and ``os.access`` says so)."""
    if os.geteuid() != 0:
        result = CliRunner().invoke(main, argv)
        return result.exit_code, result.output
    import overlapviz.cli.ingest  # noqa: F401  (imported here: the child may not read root's files)
    import overlapviz.ingest.driver  # noqa: F401

    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        try:
            os.close(read)
            os.setgroups([])
            os.setresgid(65534, 65534, 65534)
            os.setresuid(65534, 65534, 65534)
            result = CliRunner().invoke(main, argv)
            os.write(write, f"{result.exit_code}\n{result.output}".encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as fh:
        data = fh.read().decode()
    os.waitpid(pid, 0)
    code, _, output = data.partition("\n")
    return int(code), output


def test_an_unreadable_source_is_one_line_and_exit_1():
    import tempfile

    with tempfile.TemporaryDirectory(dir="/tmp") as tmp:  # a place the other account can reach
        ws = Path(tmp)
        os.chmod(ws, 0o777)
        trace = ws / "rank0.json.gz"
        trace.write_bytes((DATA / "hostile" / "event_sync_trace.json.gz").read_bytes())
        os.chmod(trace, 0)
        code, output = _as_another_user(["ingest", str(trace), "-o", str(ws / "ds")])
        lines = output.strip().splitlines()
        assert code == 1 and len(lines) == 1 and lines[0].startswith("Error: "), output
        assert str(trace) in lines[0] and "Permission denied" in lines[0], output
        assert not (ws / "ds").exists()


@pytest.mark.parametrize("content", [b"", b"  \n"])  # a corrupt gzip is an error of its own
def test_an_empty_rank_file_beside_good_ones_is_named(runner, tmp_path, content):
    run = tmp_path / "job"
    run.mkdir()
    (run / "rank0.json.gz").write_bytes((DATA / "hostile" / "event_sync_trace.json.gz").read_bytes())
    (run / "rank1.json").write_bytes(content)
    (run / "notes.txt").write_text("not a trace, and not named like one: no word about it\n")
    result = runner.invoke(main, ["ingest", str(run), "-o", str(tmp_path / "ds"), "--quiet"])
    assert result.exit_code == 0, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"warning: {run / 'rank1.json'}: "), result.stderr
    assert "fewer ranks" in lines[0] and "notes.txt" not in result.stderr


@pytest.mark.parametrize("command", [["serve", "--get", "/"], ["advise", "--compute-shape", "256,64,0"]])
def test_a_file_given_as_the_dataset_of_serve_or_advise_is_one_line_and_exit_1(runner, tmp_path, command):
    text = tmp_path / "notes.txt"
    text.write_text("hello\n")
    result = runner.invoke(main, [command[0], str(text), *command[1:]])
    lines = result.output.strip().splitlines()
    assert result.exit_code == 1 and len(lines) == 1 and lines[0].startswith("Error: "), result.output
    assert str(text) in lines[0]
