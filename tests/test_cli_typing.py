"""The command line as people type it (issue 32 item 7): short GPU names, --list-devices,
"did you mean" for a mistyped command, the same trace formats in every --help, and
``serve RAW_TRACES`` ingesting into the cache as ``analyze`` does."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from overlapviz.cli import TRACE_FORMATS, main
from overlapviz.domain.devices import device_limits

DATA = Path(__file__).parent / "data"
TRACE = DATA / "kineto_real" / "hta_alexnet_cuda_sync"  # a real A100 trace
TRACE_COMMANDS = ["ingest", "analyze", "explain", "residency", "compare", "advise", "serve", "export"]


def run(*args: str):
    return CliRunner().invoke(main, list(args))


@pytest.mark.parametrize("typed,meant", [("anlyze", "analyze"), ("explian", "explain"), ("serv", "serve"),
                                         ("ingset", "ingest")])  # fmt: skip
def test_mistyped_command_gets_did_you_mean(typed, meant):
    result = run(typed, "x")
    assert result.exit_code == 2
    assert f"No such command '{typed}'. Did you mean '{meant}'?" in result.output


@pytest.mark.parametrize("short,product", [("H100", "NVIDIA H100 80GB HBM3"), ("MI300X", "AMD Instinct MI300X"),
                                           ("A100 80GB", "NVIDIA A100-SXM4-80GB"), ("a100-80gb", "NVIDIA A100-SXM4-80GB"),
                                           ("h200", "NVIDIA H200")])  # fmt: skip
def test_short_device_names(short, product):
    mine = {k: v for k, v in device_limits({"name": short}).items() if k != "name"}
    full = {k: v for k, v in device_limits({"name": product}).items() if k != "name"}
    assert mine == full and mine["num_sms"]


def test_short_device_name_on_the_command_line(tmp_path, monkeypatch):
    monkeypatch.setenv("OVERLAPVIZ_CACHE_DIR", str(tmp_path / "cache"))
    short = run("residency", str(TRACE), "--device-name", "A100 80GB", "--format", "json")
    full = run("residency", str(TRACE), "--device-name", "NVIDIA A100-SXM4-80GB", "--format", "json")
    assert short.exit_code == 0, short.output
    assert json.loads(short.stdout) == json.loads(full.stdout)


@pytest.mark.parametrize("command", ["explain", "residency", "serve", "export", "advise"])
def test_list_devices(command):
    result = run(command, "--list-devices")
    assert result.exit_code == 0, result.output
    rows = {line.split("  ")[0].strip(): line for line in result.output.splitlines()}
    for short, product in (("H100", "NVIDIA H100 80GB HBM3"), ("MI300X", "AMD Instinct MI300X"),
                           ("A100 80GB", "NVIDIA A100-SXM4-80GB")):  # fmt: skip
        assert product in rows[short]
    assert re.search(r"^MI300X\s+AMD Instinct MI300X\s+gfx942\s+304$", result.output, re.M)


def test_every_command_lists_the_same_formats():
    want = " ".join(TRACE_FORMATS.split())
    for command in TRACE_COMMANDS:
        result = run(command, "--help")
        assert result.exit_code == 0, result.output
        assert want in " ".join(result.output.split()), command
    for fmt in ("Kineto", "Nsight Systems", "rocpd", "rocprofv3", "rocprofv2", "rocprof"):
        assert fmt in want


def test_serve_raw_traces_ingests_into_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("OVERLAPVIZ_CACHE_DIR", str(tmp_path / "cache"))
    result = run("serve", str(TRACE), "--get", "/")
    assert result.exit_code == 0, result.output[-800:]
    assert f"{TRACE}: raw traces, read into {tmp_path / 'cache'}" in result.output
    assert "<title>overlapviz</title>" in result.output
    bad = run("serve", str(tmp_path / "missing"), "--get", "/")
    assert bad.exit_code != 0 and "not an overlapviz dataset" in bad.output
