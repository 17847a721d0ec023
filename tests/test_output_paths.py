"""Every command that writes refuses, before writing anything, an output inside a dataset or equal to one of its inputs."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from overlapviz.cli import main
from overlapviz.ingest import ingest

DATA = Path(__file__).parent / "data"
TRACE = DATA / "hostile" / "event_sync_trace.json.gz"


def snapshot(root: Path) -> dict:
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            if p.is_symlink():
                out[p] = ("link", os.readlink(p))
            elif p.is_file():
                out[p] = hashlib.sha256(p.read_bytes()).hexdigest()
            else:
                out[p] = "dir"
    return out


@pytest.fixture()
def ws(tmp_path, monkeypatch):
    monkeypatch.setenv("OVERLAPVIZ_CACHE_DIR", str(tmp_path / "cache"))
    shutil.copy(TRACE, tmp_path / "rank0.json.gz")
    ingest([tmp_path / "rank0.json.gz"], tmp_path / "ds", progress=False)
    return tmp_path


def refused(ws: Path, argv: list[str], says: str) -> str:
    before = snapshot(ws / "ds"), (ws / "rank0.json.gz").read_bytes()
    result = CliRunner().invoke(main, argv)
    # raw traces given as DATASET are first read into the cache, which says so on a line of its own
    lines = [line for line in result.output.strip().splitlines() if "raw traces, read into" not in line]
    assert result.exit_code == 1 and len(lines) == 1 and lines[0].startswith("Error: "), result.output
    assert says in lines[0], lines[0]
    assert (snapshot(ws / "ds"), (ws / "rank0.json.gz").read_bytes()) == before, "the dataset or the trace changed"
    return lines[0]


def kernel_file(ds: Path) -> Path:
    return next((ds / "kernels").rglob("*.parquet"))


def test_export_perfetto_onto_the_datasets_metadata_is_refused(ws):
    refused(ws, ["export", str(ws / "ds"), "--format", "perfetto", "-o", str(ws / "ds" / "dataset.json")], "inside")


def test_export_figure_onto_a_kernel_file_of_the_dataset_is_refused(ws):
    target = kernel_file(ws / "ds")
    refused(ws, ["export", str(ws / "ds"), "--figure", "timeline", "--format", "html", "-o", str(target)], "inside")


def test_export_through_a_symbolic_link_into_the_dataset_is_refused(ws):
    (ws / "link.json").symlink_to(ws / "ds" / "dataset.json")
    refused(ws, ["export", str(ws / "ds"), "--format", "perfetto", "-o", str(ws / "link.json")], "symbolic link")


def test_export_onto_a_hard_link_to_a_dataset_file_is_refused(ws):
    os.link(kernel_file(ws / "ds"), ws / "figure.html")
    refused(ws, ["export", str(ws / "ds"), "--figure", "timeline", "-o", str(ws / "figure.html")], "hard link")


def test_export_of_raw_traces_onto_the_trace_is_refused(ws):
    trace = str(ws / "rank0.json.gz")
    refused(ws, ["export", trace, "--format", "perfetto", "-o", trace], "is the input")


def test_export_into_another_dataset_is_refused(ws):
    ingest([ws / "rank0.json.gz"], ws / "other", progress=False)
    refused(ws, ["export", str(ws / "ds"), "--format", "perfetto", "-o", str(ws / "other" / "run.json")], "dataset")
    assert not (ws / "other" / "run.json").exists()


def test_ingest_into_a_dataset_is_refused(ws):
    refused(ws, ["ingest", str(ws / "rank0.json.gz"), "-o", str(ws / "ds" / "kernels" / "more")], "inside the overlapviz dataset")


@pytest.mark.parametrize("where", [".", "kernels"])
def test_collect_into_a_dataset_is_refused(ws, where):
    refused(ws, ["collect", "--preset", "cb_ar_standin", "--list", "-o", str(ws / "ds" / where)], "overlapviz dataset")


def test_serve_token_file_in_the_dataset_is_refused(ws):
    refused(ws, ["serve", str(ws / "ds"), "--token-file", str(ws / "ds" / "dataset.json"), "--get", "/"], "inside")


def test_export_beside_the_dataset_still_works(ws):
    result = CliRunner().invoke(main, ["export", str(ws / "ds"), "--format", "perfetto", "-o", str(ws / "run.json")])
    assert result.exit_code == 0, result.output
    assert (ws / "run.json").stat().st_size > 0


def test_another_tools_dataset_json_does_not_make_a_dataset(ws):
    (ws / "project").mkdir()
    (ws / "project" / "dataset.json").write_text('{"name": "my data", "rows": 3}')
    result = CliRunner().invoke(main, ["export", str(ws / "ds"), "--format", "perfetto", "-o", str(ws / "project" / "run.json")])
    assert result.exit_code == 0, result.output
