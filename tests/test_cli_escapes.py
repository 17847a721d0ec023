"""No byte of a trace reaches the terminal raw: every table and message escapes control characters (ESC, BEL, CSI)."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from overlapviz.cli import main
from overlapviz.ingest import ingest

TRACE = Path(__file__).parent / "data" / "hostile" / "event_sync_trace.json.gz"
# an OSC that retitles the terminal, a CSI colour, a bare BEL and a C1 CSI
HOSTILE = "\x1b]0;owned\x07\x1b[31mred\x1b[0m\x9b2J"
RAW = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")  # what may not appear (a newline may)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("escapes")
    doc = json.loads(gzip.decompress(TRACE.read_bytes()))
    for e in doc["traceEvents"]:
        if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and isinstance(e.get("name"), str):
            e["name"] = HOSTILE + e["name"]
    src = tmp / "rank0.json"
    src.write_text(json.dumps(doc))
    return str(ingest([src], tmp / "ds", progress=False))


@pytest.mark.parametrize("argv", [["explain"], ["explain", "--wide"], ["explain", "--all-kernels"],
                                  ["explain", "--summary"], ["explain", "--instances", "--wide"],
                                  ["residency"], ["residency", "--wide"], ["analyze"], ["analyze", "--wide"]])
def test_tables_escape_control_characters_of_kernel_names(dataset, argv):
    result = CliRunner().invoke(main, [argv[0], dataset, *argv[1:]])
    assert result.exit_code == 0, result.output
    assert not RAW.search(result.output), repr(RAW.search(result.output))
    if "--all-kernels" in argv or argv == ["residency", "--wide"]:
        assert "\\x1b]0;owned\\x07" in result.output  # shown, escaped


def test_error_messages_escape_control_characters(tmp_path):
    bad = tmp_path / "\x1b]0;owned\x07.json"
    bad.write_text('{"traceEvents": [')
    result = CliRunner().invoke(main, ["analyze", str(bad)])
    assert result.exit_code == 1
    assert not RAW.search(result.output), result.output


def test_the_note_on_raw_traces_escapes_their_name(tmp_path, monkeypatch):
    monkeypatch.setenv("OVERLAPVIZ_CACHE_DIR", str(tmp_path / "cache"))
    trace = tmp_path / "\x1b]0;owned\x07rank0.json.gz"
    trace.write_bytes(TRACE.read_bytes())
    result = CliRunner().invoke(main, ["analyze", str(trace)])
    assert result.exit_code == 0, result.output
    assert "raw traces, read into" in result.output and not RAW.search(result.output), repr(result.output)
