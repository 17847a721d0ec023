"""The hostile-input corpus: malformed and hostile inputs made at test time from real traces,
each driven through ``overlapviz ingest`` with its expected outcome (docs/robustness.md).

Every refused input must give: exit code 1; one line, ``Error: ...``, naming the file
(undecodable bytes and control characters shown as ``\\xNN``) and never "internal error";
no traceback; and the whole workspace byte for byte as it was (inputs intact, nothing at
``-o``, an existing dataset untouched, no temporary directory left). Every accepted input
must give exit 0, a readable dataset at ``-o`` and nothing else changed.

The bases are real traces: two small Kineto traces (tests/data/hostile), rocprof v1/v2/v3
output (tests/data/rocprof), an Nsight Systems export (tests/data/nsys/mock.sqlite) and a
rocpd database built by tests/_rocpd_db.py. A case whose refusal belongs to a reader this
module's authors do not own is marked ``xfail(strict=True)`` with the fix it needs.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from overlapviz.dataset import outdir

from _hostile import DATA, EVENT_SYNC, MI250, NSYS, ROCPROF_V1_CSV, ROCPROF_V2, ROCPROF_V3, Run, check_dataset, invoke, shown, small_v3_json, snapshot

ROCPROF_V1_JSON = DATA / "rocprof" / "v1" / "kokkos_gfx906_hiptrace"
IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0


# --- the invariants ---------------------------------------------------------------------------


def under(rel: bytes, out_rel: bytes) -> bool:
    return rel == out_rel or rel.startswith(out_rel + b"/")


def assert_refused(run: Run, ws: Path, *, subprocess_cli: bool = False) -> str:
    root = run.root or ws
    before = snapshot(root)
    code, text, exc = invoke(run, subprocess_cli=subprocess_cli)
    assert "Traceback" not in text, text
    assert exc is None or isinstance(exc, SystemExit), repr(exc)
    assert code == 1, text
    lines = text.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), text
    culprit = shown(run.culprit if run.culprit is not None else run.sources[0])
    assert culprit in lines[0], f"{culprit!r} not named in: {lines[0]}"
    if run.names is not None:  # what else it must say, the workspace's path (the test's name) left out
        assert run.names in lines[0].replace(str(ws), "WS"), f"{run.names!r} not said in: {lines[0]}"
    assert "internal error" not in lines[0], lines[0]
    assert snapshot(root) == before, "the workspace changed"
    return lines[0]


def assert_ingested(run: Run, ws: Path, *, subprocess_cli: bool = False) -> Path:
    root = run.root or ws
    before = snapshot(root)
    code, text, exc = invoke(run, subprocess_cli=subprocess_cli)
    assert exc is None or isinstance(exc, SystemExit), repr(exc)
    assert code == 0, text
    assert "Traceback" not in text
    out_rel = os.fsencode(os.path.relpath(run.out, root))
    after = snapshot(root)
    assert {k: v for k, v in after.items() if not under(k, out_rel)} == {
        k: v for k, v in before.items() if not under(k, out_rel)
    }, "something beside the dataset changed"
    check_dataset(run.out)
    return run.out


# --- building inputs from the real traces ---------------------------------------------------------


_DOCS: dict[Path, dict] = {}


def doc_of(path: Path) -> dict:
    if path not in _DOCS:
        _DOCS[path] = json.loads(gzip.decompress(path.read_bytes()))
    return json.loads(json.dumps(_DOCS[path]))  # a fresh copy to mutate


def first(doc: dict, cat: str) -> dict:
    return next(e for e in doc["traceEvents"] if e.get("cat") == cat)


def put(path: Path, data: bytes | str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    return path


def put_doc(path: Path, doc, *, gz: bool | None = None) -> Path:
    text = json.dumps(doc, allow_nan=True).encode()
    gz = path.name.endswith(".gz") if gz is None else gz
    return put(path, gzip.compress(text, compresslevel=1) if gz else text)


def copy_dir(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def make_dataset(ws: Path, name: str = "ds") -> Path:
    out = ws / "out" / name
    code, text, _ = invoke(Run([str(EVENT_SYNC)], out))
    assert code == 0, text
    return out


def edit_csv(src: Path, dst: Path, column: str, value: str, row: int = 0) -> Path:
    """``src`` with one cell changed (data row ``row``, from 0), written to ``dst``, every cell quoted."""
    import csv
    import io

    rows = list(csv.reader(io.StringIO(src.read_text())))
    rows[1 + row][rows[0].index(column)] = value
    buf = io.StringIO()
    csv.writer(buf, quoting=csv.QUOTE_ALL, lineterminator="\n").writerows(rows)
    return put(dst, buf.getvalue())


def gpu_event(doc: dict) -> dict:
    """The first complete event on a rocprof v1 ``GPU<N>`` lane."""
    lanes = {str(e.get("pid")) for e in doc["traceEvents"]
             if e.get("ph") == "M" and str((e.get("args") or {}).get("name", "")).startswith("GPU")}  # fmt: skip
    return next(e for e in doc["traceEvents"] if e.get("ph") == "X" and str(e.get("pid")) in lanes)


# --- the corpus -------------------------------------------------------------------------------------


@dataclass
class Case:
    build: Callable[[Path], Run]
    ok: bool = False  # True: the input is legitimate and must be ingested
    xfail: str | None = None  # the fix a reader outside this module's files needs
    subprocess_cli: bool = False  # run the real executable (inputs that could hang or crash a process)
    skip: str | None = None


CASES: dict[str, Case] = {}


def case(*, ok: bool = False, xfail: str | None = None, subprocess_cli: bool = False, skip: str | None = None):
    def register(fn):
        CASES[fn.__name__] = Case(fn, ok, xfail, subprocess_cli, skip)
        return fn

    return register


# Kineto JSON -----------------------------------------------------------------------------------


@case()
def kineto_truncated_gzip(ws):
    data = EVENT_SYNC.read_bytes()
    return Run([put(ws / "in" / "rank0.json.gz", data[: len(data) // 2])], ws / "out" / "ds")


@case()
def kineto_corrupt_gzip(ws):
    data = bytearray(EVENT_SYNC.read_bytes())
    data[len(data) // 2: len(data) // 2 + 64] = bytes(64)
    return Run([put(ws / "in" / "rank0.json.gz", bytes(data))], ws / "out" / "ds")


@case()
def kineto_gzip_trailing_garbage(ws):
    return Run([put(ws / "in" / "rank0.json.gz", EVENT_SYNC.read_bytes() + b"garbage!")], ws / "out" / "ds")


@case()
def kineto_gzip_header_only(ws):
    return Run([put(ws / "in" / "rank0.json.gz", EVENT_SYNC.read_bytes()[:10])], ws / "out" / "ds")


@case(subprocess_cli=True)
def kineto_gzip_bomb_of_zeros(ws):
    # 64 MiB of NUL bytes in 64 KiB: inflates, is no JSON, and must be refused without a crash
    bomb = gzip.compress(bytes(64 * 1024 * 1024), compresslevel=9)
    return Run([put(ws / "in" / "rank0.json.gz", bomb)], ws / "out" / "ds")


@case(subprocess_cli=True)
def kineto_gzip_bomb_past_the_limit(ws):
    body = b'{"traceEvents": [' + b" " * (8 * 1024 * 1024) + b"]}"
    run = Run([put(ws / "in" / "rank0.json.gz", gzip.compress(body, compresslevel=9))], ws / "out" / "ds")
    run.env = {"OVERLAPVIZ_MAX_INFLATED_BYTES": str(1024 * 1024)}
    run.names = "inflates to more than"
    return run


@case()
def kineto_truncated_json(ws):
    text = gzip.decompress(EVENT_SYNC.read_bytes())
    return Run([put(ws / "in" / "rank0.json", text[: len(text) * 2 // 3])], ws / "out" / "ds")


@case()
def kineto_empty_file(ws):
    return Run([put(ws / "in" / "rank0.json", b"")], ws / "out" / "ds")


@case()
def kineto_empty_gzip(ws):
    return Run([put(ws / "in" / "rank0.json.gz", gzip.compress(b""))], ws / "out" / "ds")


@case()
def kineto_whitespace_only(ws):
    return Run([put(ws / "in" / "rank0.json", b" \n\t\r\n" * 1000)], ws / "out" / "ds")


@case()
def kineto_random_bytes(ws):
    return Run([put(ws / "in" / "rank0.json", hashlib.sha512(b"x").digest() * 100)], ws / "out" / "ds")


@case()
def kineto_nul_bytes_inside(ws):
    text = gzip.decompress(EVENT_SYNC.read_bytes())
    i = text.index(b'"traceEvents"') + 20
    return Run([put(ws / "in" / "rank0.json", text[:i] + b"\x00" * 16 + text[i:])], ws / "out" / "ds")


@case(ok=True)
def kineto_not_utf8_inside_a_string(ws):
    """Bytes that are not UTF-8 in a name: read as U+FFFD with a warning (issue 32), not refused."""
    text = gzip.decompress(EVENT_SYNC.read_bytes()).replace(b"ampere_sgemm", b"ampere\xff\xfesgemm", 1)
    return Run([put(ws / "in" / "rank0.json", text)], ws / "out" / "ds")


@case()
def kineto_nan_timestamp(ws):
    doc = doc_of(EVENT_SYNC)
    first(doc, "kernel")["ts"] = float("nan")
    return Run([put_doc(ws / "in" / "rank0.json", doc)], ws / "out" / "ds")


@case()
def kineto_infinite_duration(ws):
    doc = doc_of(EVENT_SYNC)
    first(doc, "kernel")["dur"] = float("inf")
    return Run([put_doc(ws / "in" / "rank0.json", doc)], ws / "out" / "ds")


@case()
def kineto_negative_duration(ws):
    doc = doc_of(EVENT_SYNC)
    first(doc, "kernel")["dur"] = -5
    return Run([put_doc(ws / "in" / "rank0.json", doc)], ws / "out" / "ds")


@case()
def kineto_timestamp_1e300(ws):
    doc = doc_of(EVENT_SYNC)
    first(doc, "kernel")["ts"] = 1e300
    return Run([put_doc(ws / "in" / "rank0.json", doc)], ws / "out" / "ds")


@case()
def kineto_timestamp_past_int64_ns(ws):
    doc = doc_of(EVENT_SYNC)
    first(doc, "kernel")["ts"] = 9_300_000_000_000_000  # µs: 9.3e18 ns > 2^63
    return Run([put_doc(ws / "in" / "rank0.json", doc)], ws / "out" / "ds")


@case()
def kineto_integer_timestamp_past_int64(ws):
    doc = doc_of(EVENT_SYNC)
    first(doc, "kernel")["ts"] = 2**64 + 7
    return Run([put_doc(ws / "in" / "rank0.json", doc)], ws / "out" / "ds")


@case()
def kineto_end_past_int64_ns(ws):
    # start fits int64 ns, start + duration does not: the end must not wrap negative
    doc = doc_of(EVENT_SYNC)
    k = first(doc, "kernel")
    k["ts"], k["dur"] = 9_200_000_000_000_000, 50_000_000_000_000
    return Run([put_doc(ws / "in" / "rank0.json", doc)], ws / "out" / "ds")


@case()
def kineto_boolean_duration(ws):
    doc = doc_of(EVENT_SYNC)
    first(doc, "kernel")["dur"] = True
    return Run([put_doc(ws / "in" / "rank0.json", doc)], ws / "out" / "ds")


@case()
def kineto_boolean_stream(ws):
    doc = doc_of(EVENT_SYNC)
    first(doc, "kernel")["args"]["stream"] = True
    return Run([put_doc(ws / "in" / "rank0.json", doc)], ws / "out" / "ds")


@case()
def kineto_boolean_in_grid(ws):
    doc = doc_of(EVENT_SYNC)
    first(doc, "kernel")["args"]["grid"] = [True, 1, 1]
    return Run([put_doc(ws / "in" / "rank0.json", doc)], ws / "out" / "ds")


@case()
def kineto_text_timestamp(ws):
    doc = doc_of(EVENT_SYNC)
    first(doc, "kernel")["ts"] = "soon"
    return Run([put_doc(ws / "in" / "rank0.json", doc)], ws / "out" / "ds")


@case()
def kineto_grid_past_int32(ws):
    doc = doc_of(EVENT_SYNC)
    first(doc, "kernel")["args"]["grid"] = [2**40, 1, 1]
    run = Run([put_doc(ws / "in" / "rank0.json", doc)], ws / "out" / "ds")
    return run


@case()
def kineto_correlation_past_int64(ws):
    doc = doc_of(EVENT_SYNC)
    first(doc, "kernel")["args"]["correlation"] = 2**70
    return Run([put_doc(ws / "in" / "rank0.json", doc)], ws / "out" / "ds")


@case()
def kineto_pid_past_int64(ws):
    doc = doc_of(EVENT_SYNC)
    first(doc, "cuda_runtime")["pid"] = 2**70
    return Run([put_doc(ws / "in" / "rank0.json", doc)], ws / "out" / "ds")


@case()
def kineto_device_limit_past_int32(ws):
    doc = doc_of(EVENT_SYNC)
    doc["deviceProperties"][0]["numSms"] = 2**40
    return Run([put_doc(ws / "in" / "rank0.json", doc)], ws / "out" / "ds")


@case()
def kineto_rank_past_int32(ws):
    doc = doc_of(EVENT_SYNC)
    doc["distributedInfo"] = {"rank": 2**40, "world_size": 2}
    return Run([put_doc(ws / "in" / "rank0.json", doc)], ws / "out" / "ds")


@case()
def kineto_negative_rank(ws):
    doc = doc_of(EVENT_SYNC)
    doc["distributedInfo"] = {"rank": -3, "world_size": 2}
    return Run([put_doc(ws / "in" / "rank0.json", doc)], ws / "out" / "ds")


@case()
def kineto_text_rank(ws):
    doc = doc_of(EVENT_SYNC)
    doc["distributedInfo"] = {"rank": "zero", "world_size": 2}
    return Run([put_doc(ws / "in" / "rank0.json", doc)], ws / "out" / "ds")


@case()
def kineto_rank_in_name_past_int32(ws):
    return Run([put(ws / "in" / "trace_rank99999999999.json.gz", MI250.read_bytes())], ws / "out" / "ds")


@case()
def kineto_world_size_past_int32(ws):
    doc = doc_of(EVENT_SYNC)
    doc["distributedInfo"] = {"rank": 0, "world_size": 2**40}
    return Run([put_doc(ws / "in" / "rank0.json", doc)], ws / "out" / "ds")


@case(subprocess_cli=True)
def kineto_deeply_nested_args(ws):
    text = gzip.decompress(EVENT_SYNC.read_bytes()).decode()
    deep = "[" * 60_000 + "]" * 60_000
    text = text.replace('"args": {', '"args": {"deep": ' + deep + ", ", 1)
    return Run([put(ws / "in" / "rank0.json", text)], ws / "out" / "ds")


@case(subprocess_cli=True)
def kineto_deeply_nested_objects(ws):
    deep = '{"a":' * 100_000 + "1" + "}" * 100_000
    text = '{"schemaVersion": 1, "traceEvents": [' + deep + "]}"
    return Run([put(ws / "in" / "rank0.json", text)], ws / "out" / "ds")


@case()
def kineto_trace_events_not_a_list(ws):
    doc = doc_of(EVENT_SYNC)
    doc["traceEvents"] = {"0": doc["traceEvents"][0]}
    return Run([put_doc(ws / "in" / "rank0.json", doc)], ws / "out" / "ds")


@case()
def kineto_events_are_numbers(ws):
    return Run([put(ws / "in" / "rank0.json", '{"schemaVersion": 1, "traceEvents": [1, 2, 3]}')], ws / "out" / "ds")


@case()
def kineto_kernel_without_name(ws):
    doc = doc_of(EVENT_SYNC)
    del first(doc, "kernel")["name"]
    return Run([put_doc(ws / "in" / "rank0.json", doc)], ws / "out" / "ds")


@case()
def kineto_kernel_args_not_an_object(ws):
    doc = doc_of(EVENT_SYNC)
    first(doc, "kernel")["args"] = [1, 2, 3]
    return Run([put_doc(ws / "in" / "rank0.json", doc)], ws / "out" / "ds", names="field 'args' is an array, not an object")


@case()
def kineto_runtime_args_null(ws):
    doc = doc_of(EVENT_SYNC)
    first(doc, "cuda_runtime")["args"] = None
    return Run([put_doc(ws / "in" / "rank0.json.gz", doc)], ws / "out" / "ds", names="runtime event #")


@case()
def kineto_numeric_string_past_a_double(ws):
    doc = doc_of(EVENT_SYNC)
    first(doc, "gpu_memset")["args"]["bytes"] = "1e400"
    return Run([put_doc(ws / "in" / "rank0.json", doc)], ws / "out" / "ds", names="'args.bytes'")


@case()
def kineto_numeric_string_past_int64(ws):
    doc = doc_of(EVENT_SYNC)
    first(doc, "gpu_memset")["args"]["bytes"] = "1e30"
    return Run([put_doc(ws / "in" / "rank0.json", doc)], ws / "out" / "ds", names="'args.bytes' ('1e30') is past")


@case()
def kineto_compute_capability_a_list(ws):
    doc = doc_of(EVENT_SYNC)
    doc["deviceProperties"][0]["computeMajor"] = [8, 0]
    return Run([put_doc(ws / "in" / "rank0.json", doc)], ws / "out" / "ds", names="deviceProperties")


@case()
def kineto_device_limit_past_int64(ws):
    doc = doc_of(EVENT_SYNC)
    doc["deviceProperties"][0]["maxThreadsPerBlock"] = 2**70
    return Run([put_doc(ws / "in" / "rank0.json", doc)], ws / "out" / "ds", names="'maxThreadsPerBlock'")


@case(ok=True)
def kineto_lone_surrogate_in_an_ignored_event(ws):
    """An unpaired surrogate escape is read as U+FFFD wherever it is (every reader alike, issue 32)."""
    text = gzip.decompress(EVENT_SYNC.read_bytes()).decode()
    text = text.replace('"ph": "i"', '"ph": "i\\udcff"', 1)
    assert "udcff" in text
    return Run([put(ws / "in" / "rank0.json", text)], ws / "out" / "ds")


@case(ok=True)
def kineto_category_not_a_string(ws):
    """An event whose cat is a list or a number is in no category ingest reads: ignored."""
    doc = doc_of(EVENT_SYNC)
    doc["traceEvents"] += [{"ph": "X", "cat": ["kernel"], "name": "k", "ts": 1, "dur": 1},
                           {"ph": "X", "cat": 7, "name": "k", "ts": 1, "dur": 1, "args": [1]}]  # fmt: skip
    return Run([put_doc(ws / "in" / "rank0.json", doc)], ws / "out" / "ds")


@case()
def kineto_duplicate_ranks(ws):
    """Two files of one run (named with --run-id) giving the same rank."""
    put(ws / "job" / "a.json.gz", EVENT_SYNC.read_bytes())
    b = put(ws / "job" / "b.json.gz", EVENT_SYNC.read_bytes())
    return Run([ws / "job"], ws / "out" / "ds", args=["--run-id", "job"], culprit=b, names="rank 0 of run 'job' also comes from")


@case()
def kineto_duplicate_ranks_in_a_collected_run(ws):
    d = collected_run(ws)
    b = put(d / "rank0_again.json.gz", EVENT_SYNC.read_bytes())
    return Run([d], ws / "out" / "ds", culprit=b, names="also comes from")


@case(ok=True)
def kineto_duplicate_ranks_in_a_directory(ws):
    """A directory whose files give one rank twice is not one job: a run per file (overlapviz.ingest.discover)."""
    put(ws / "job" / "a.json.gz", EVENT_SYNC.read_bytes())
    put(ws / "job" / "b.json.gz", EVENT_SYNC.read_bytes())
    return Run([ws / "job"], ws / "out" / "ds")


@case()
def kineto_bad_rank_among_good_ones(ws):
    put(ws / "job" / "rank0.json.gz", MI250.read_bytes())
    data = MI250.read_bytes()
    bad = put(ws / "job" / "rank1.json.gz", data[:-40])
    return Run([ws / "job"], ws / "out" / "ds", culprit=bad)


@case()
def kineto_file_name_with_control_characters(ws):
    bad = put(ws / "in" / "rank0\n\x1b[31mred.json", b"{")
    return Run([bad], ws / "out" / "ds", names="rank0\\x0a\\x1b[31mred.json")


@case(ok=True)
def kineto_zero_length_kernel(ws):
    doc = doc_of(EVENT_SYNC)
    first(doc, "kernel")["dur"] = 0
    return Run([put_doc(ws / "in" / "rank0.json", doc)], ws / "out" / "ds")


@case(ok=True)
def kineto_multi_member_gzip(ws):
    text = gzip.decompress(EVENT_SYNC.read_bytes())
    half = len(text) // 2
    data = gzip.compress(text[:half]) + gzip.compress(text[half:])
    return Run([put(ws / "in" / "rank0.json.gz", data)], ws / "out" / "ds")


@case(ok=True)
def kineto_bare_event_array(ws):
    doc = doc_of(EVENT_SYNC)
    return Run([put_doc(ws / "in" / "rank0.json", doc["traceEvents"])], ws / "out" / "ds")


# the file system ---------------------------------------------------------------------------------


@case()
def out_is_the_input_directory_with_overwrite(ws):
    """issue 13: this deleted the user's traces and put a dataset in their place."""
    put(ws / "traces" / "rank0.json.gz", EVENT_SYNC.read_bytes())
    return Run([ws / "traces"], ws / "traces", ["--overwrite"], names="is the input")


@case()
def out_is_the_input_directory(ws):
    put(ws / "traces" / "rank0.json.gz", EVENT_SYNC.read_bytes())
    return Run([ws / "traces"], ws / "traces", names="is the input")


@case()
def out_is_the_input_file_with_overwrite(ws):
    p = put(ws / "in" / "rank0.json.gz", EVENT_SYNC.read_bytes())
    return Run([p], p, ["--overwrite"], names="is the input")


@case()
def out_inside_the_input_directory(ws):
    put(ws / "traces" / "rank0.json.gz", EVENT_SYNC.read_bytes())
    return Run([ws / "traces"], ws / "traces" / "ds", names="lies inside the input")


@case()
def out_deep_inside_the_input_directory(ws):
    put(ws / "traces" / "rank0.json.gz", EVENT_SYNC.read_bytes())
    (ws / "traces" / "a" / "b").mkdir(parents=True)
    return Run([ws / "traces"], ws / "traces" / "a" / "b" / "ds", names="lies inside the input")


@case()
def out_contains_the_input(ws):
    put(ws / "work" / "traces" / "rank0.json.gz", EVENT_SYNC.read_bytes())
    return Run([ws / "work" / "traces"], ws / "work", ["--overwrite"], names="contains the input")


@case()
def out_contains_the_input_file(ws):
    p = put(ws / "work" / "rank0.json.gz", EVENT_SYNC.read_bytes())
    return Run([p], ws / "work", ["--overwrite"], names="contains the input")


@case()
def out_through_dotdot_is_the_input(ws):
    put(ws / "traces" / "rank0.json.gz", EVENT_SYNC.read_bytes())
    (ws / "traces" / "sub").mkdir()
    return Run([ws / "traces"], Path(f"{ws}/traces/sub/.."), ["--overwrite"], names="is the input")


@case()
def out_is_a_symlink_to_the_input(ws):
    put(ws / "traces" / "rank0.json.gz", EVENT_SYNC.read_bytes())
    (ws / "link").symlink_to(ws / "traces")
    return Run([ws / "traces"], ws / "link", ["--overwrite"], names="symbolic link", culprit=ws / "link")


@case()
def out_under_a_symlinked_parent_inside_the_input(ws):
    put(ws / "traces" / "rank0.json.gz", EVENT_SYNC.read_bytes())
    (ws / "alias").symlink_to(ws / "traces")
    return Run([ws / "traces"], ws / "alias" / "ds", names="lies inside the input")


@case()
def out_is_a_trace_inside_the_input_via_its_companion(ws):
    # rocprof v3: naming kernel_trace.csv reads the hip_trace.csv beside it; -o may not be that file
    d = copy_dir(ROCPROF_V3, ws / "v3")
    return Run([d / "kernel_trace.csv"], d / "hip_trace.csv", ["--overwrite"], names="is the input", culprit=d / "hip_trace.csv")


@case()
def out_existing_directory_of_other_files_with_overwrite(ws):
    p = put(ws / "in" / "rank0.json.gz", EVENT_SYNC.read_bytes())
    put(ws / "out" / "ds" / "notes.txt", "my notes")
    return Run([p], ws / "out" / "ds", ["--overwrite"], names="not an overlapviz dataset", culprit=ws / "out" / "ds")


@case()
def out_existing_file_with_overwrite(ws):
    p = put(ws / "in" / "rank0.json.gz", EVENT_SYNC.read_bytes())
    put(ws / "out" / "ds", "a file the user cares about")
    return Run([p], ws / "out" / "ds", ["--overwrite"], names="not a directory", culprit=ws / "out" / "ds")


@case()
def out_existing_dataset_without_overwrite(ws):
    out = make_dataset(ws)
    return Run([put(ws / "in" / "rank0.json.gz", MI250.read_bytes())], out, names="--overwrite", culprit=out)


@case()
def out_existing_dataset_and_a_bad_input_with_overwrite(ws):
    out = make_dataset(ws)
    bad = put(ws / "in" / "rank0.json", b'{"traceEvents": [')
    return Run([bad], out, ["--overwrite"])


@case()
def out_existing_dataset_with_a_user_file_added(ws):
    out = make_dataset(ws)
    put(out / "analysis-notes.md", "mine")
    return Run([put(ws / "in" / "rank0.json.gz", MI250.read_bytes())], out, ["--overwrite"],
               names="analysis-notes.md", culprit=out)  # fmt: skip


@case()
def out_existing_dataset_whose_kernels_hold_a_symlink(ws):
    out = make_dataset(ws)
    (out / "kernels" / "elsewhere").symlink_to(ws)
    return Run([put(ws / "in" / "rank0.json.gz", MI250.read_bytes())], out, ["--overwrite"], names="did not write", culprit=out)


@case(ok=True)
def out_existing_dataset_with_overwrite_is_replaced(ws):
    out = make_dataset(ws)
    return Run([put(ws / "in" / "rank0.json.gz", MI250.read_bytes())], out, ["--overwrite"])


@case(ok=True)
def out_existing_empty_directory(ws):
    (ws / "out" / "ds").mkdir(parents=True)
    return Run([put(ws / "in" / "rank0.json.gz", MI250.read_bytes())], ws / "out" / "ds")


@case()
def out_parent_missing(ws):
    p = put(ws / "in" / "rank0.json.gz", EVENT_SYNC.read_bytes())
    return Run([p], ws / "nowhere" / "ds", names="does not exist", culprit=ws / "nowhere" / "ds")


@case()
def out_parent_is_a_file(ws):
    p = put(ws / "in" / "rank0.json.gz", EVENT_SYNC.read_bytes())
    put(ws / "afile", "x")
    return Run([p], ws / "afile" / "ds", names="not a directory", culprit=ws / "afile" / "ds")


@case(skip=None if sys.platform.startswith("linux") else "Linux /proc")
def out_parent_not_writable(ws):
    # /proc refuses new directories to every user, root included
    p = put(ws / "in" / "rank0.json.gz", EVENT_SYNC.read_bytes())
    return Run([p], Path("/proc/overlapviz-ds"), names="cannot write", culprit="/proc/overlapviz-ds")


@case(skip="root writes anywhere" if IS_ROOT else None)
def out_parent_read_only_mode(ws):
    p = put(ws / "in" / "rank0.json.gz", EVENT_SYNC.read_bytes())
    (ws / "ro").mkdir()
    os.chmod(ws / "ro", 0o555)
    return Run([p], ws / "ro" / "ds", names="cannot write", culprit=ws / "ro" / "ds")


@case(subprocess_cli=True)
def source_is_a_fifo(ws):
    (ws / "in").mkdir()
    os.mkfifo(ws / "in" / "rank0.json")
    return Run([ws / "in" / "rank0.json"], ws / "out" / "ds")


@case(ok=True, subprocess_cli=True)
def fifo_in_a_trace_directory_is_skipped(ws):
    put(ws / "in" / "rank0.json.gz", EVENT_SYNC.read_bytes())
    os.mkfifo(ws / "in" / "rank1.json")
    return Run([ws / "in"], ws / "out" / "ds")


@case(subprocess_cli=True)
def source_is_dev_zero(ws):
    return Run(["/dev/zero"], ws / "out" / "ds", root=ws)


@case()
def source_is_a_socket(ws):
    import socket

    (ws / "in").mkdir()
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(ws / "in" / "rank0.json"))
    return Run([ws / "in" / "rank0.json"], ws / "out" / "ds")


@case()
def source_is_a_symlink_loop(ws):
    (ws / "in").mkdir()
    (ws / "in" / "a.json").symlink_to(ws / "in" / "b.json")
    (ws / "in" / "b.json").symlink_to(ws / "in" / "a.json")
    return Run([ws / "in" / "a.json"], ws / "out" / "ds")


@case()
def source_is_a_dangling_symlink(ws):
    (ws / "in").mkdir()
    (ws / "in" / "rank0.json").symlink_to(ws / "gone.json")
    return Run([ws / "in" / "rank0.json"], ws / "out" / "ds")


@case(ok=True)
def directory_with_a_symlink_loop_and_a_cycle(ws):
    put(ws / "runs" / "a" / "rank0.json.gz", EVENT_SYNC.read_bytes())
    (ws / "runs" / "up").symlink_to(ws / "runs")  # a cycle back to the sweep
    (ws / "runs" / "a" / "loop.json").symlink_to(ws / "runs" / "a" / "loop.json")
    return Run([ws / "runs"], ws / "out" / "ds")


@case()
def source_is_missing(ws):
    return Run([ws / "missing.json.gz"], ws / "out" / "ds")


@case()
def source_is_an_empty_directory(ws):
    (ws / "in").mkdir()
    return Run([ws / "in"], ws / "out" / "ds")


@case()
def source_directory_of_non_traces(ws):
    put(ws / "in" / "notes.txt", "hello")
    put(ws / "in" / "data.csv", "a,b\n1,2\n")
    return Run([ws / "in"], ws / "out" / "ds")


@case()
def same_directory_given_twice(ws):
    put(ws / "in" / "rank0.json.gz", EVENT_SYNC.read_bytes())
    return Run([ws / "in", ws / "in"], ws / "out" / "ds")


@case()
def kineto_times_further_apart_than_int64(ws):
    # each time fits int64 ns; their difference (the rank's span) does not: it wrapped to a negative span_us
    doc = doc_of(EVENT_SYNC)
    kernels = [e for e in doc["traceEvents"] if e.get("cat") == "kernel"]
    kernels[0]["ts"], kernels[-1]["ts"] = -9_200_000_000_000_000, 9_200_000_000_000_000
    return Run([put_doc(ws / "in" / "rank0.json.gz", doc)], ws / "out" / "ds", names="past what int64")


@case()
def kineto_ranks_further_apart_than_int64(ws):
    # each rank's span fits; the run's (peer waits compare its ranks' times) does not
    docs = []
    for rank, shift in ((0, -1), (1, 1)):
        doc = doc_of(EVENT_SYNC)
        doc["distributedInfo"] = {"rank": rank, "world_size": 2}
        for e in doc["traceEvents"]:
            if isinstance(e.get("ts"), (int, float)) and e.get("ph") == "X":
                e["ts"] = shift * 5_000_000_000_000_000 + (e["ts"] - 1_700_000_000_000_000 if e["ts"] > 1e15 else e["ts"])
        docs.append(put_doc(ws / "in" / f"rank{rank}.json.gz", doc))
    return Run([ws / "in"], ws / "out" / "ds", names="past what int64", culprit=docs[1])


@case()
def same_file_given_twice(ws):
    p = put(ws / "in" / "rank0.json.gz", EVENT_SYNC.read_bytes())
    return Run([p, p], ws / "out" / "ds", names="the same file as")


@case()
def a_trace_and_a_symbolic_link_to_it(ws):
    p = put(ws / "in" / "rank0.json.gz", EVENT_SYNC.read_bytes())
    (ws / "in" / "rank1.json.gz").symlink_to(p)
    return Run([p, ws / "in" / "rank1.json.gz"], ws / "out" / "ds", names="the same file as", culprit=ws / "in" / "rank1.json.gz")


@case()
def a_trace_and_a_hard_link_to_it_in_another_directory(ws):
    p = put(ws / "a" / "rank0.json.gz", EVENT_SYNC.read_bytes())
    (ws / "b").mkdir()
    os.link(p, ws / "b" / "rank0.json.gz")
    return Run([p, ws / "b" / "rank0.json.gz"], ws / "out" / "ds", names="the same file as", culprit=ws / "b" / "rank0.json.gz")


@case()
def a_directory_and_one_of_its_files(ws):
    put(ws / "in" / "rank0.json.gz", EVENT_SYNC.read_bytes())
    put(ws / "in" / "rank1.json.gz", MI250.read_bytes())
    return Run([ws / "in", ws / "in" / "rank1.json.gz"], ws / "out" / "ds", names="the same file as",
               culprit=ws / "in" / "rank1.json.gz")  # fmt: skip


@case()
def a_directory_and_a_symbolic_link_to_it(ws):
    put(ws / "in" / "rank0.json.gz", EVENT_SYNC.read_bytes())
    (ws / "alias").symlink_to(ws / "in")
    return Run([ws / "in", ws / "alias"], ws / "out" / "ds", names="the same directory as", culprit=ws / "alias")


@case()
def a_sweep_and_one_of_its_runs(ws):
    put(ws / "sweep" / "a" / "rank0.json.gz", EVENT_SYNC.read_bytes())
    put(ws / "sweep" / "b" / "rank0.json.gz", MI250.read_bytes())
    return Run([ws / "sweep", ws / "sweep" / "b"], ws / "out" / "ds", names="the same directory as",
               culprit=ws / "sweep" / "b")  # fmt: skip


@case(skip="root reads anything" if IS_ROOT else None)
def source_unreadable(ws):
    p = put(ws / "in" / "rank0.json.gz", EVENT_SYNC.read_bytes())
    os.chmod(p, 0)
    return Run([p], ws / "out" / "ds")


@case(ok=True)
def directory_name_not_utf8(ws):
    d = Path(os.fsdecode(os.fsencode(ws) + b"/caf\xe9"))
    put(d / "rank0.json.gz", EVENT_SYNC.read_bytes())
    return Run([d], ws / "out" / "ds")


@case()
def file_name_not_utf8_and_not_a_trace(ws):
    p = Path(os.fsdecode(os.fsencode(ws) + b"/in/rank0\xff.json"))
    put(p, b'{"traceEvents": [')
    return Run([p], ws / "out" / "ds", names="rank0\\xff.json")


@case(ok=True)
def out_name_not_utf8(ws):
    p = put(ws / "in" / "rank0.json.gz", EVENT_SYNC.read_bytes())
    return Run([p], Path(os.fsdecode(os.fsencode(ws) + b"/out\xfe")))


@case(ok=True)
def out_name_of_255_bytes(ws):
    p = put(ws / "in" / "rank0.json.gz", EVENT_SYNC.read_bytes())
    return Run([p], ws / ("d" * 255))


@case(ok=True)
def stale_temporaries_of_a_killed_ingest_are_removed(ws):
    """Only a temporary directory this writer names and shapes, of a dead process on this host."""
    p = put(ws / "in" / "rank0.json.gz", EVENT_SYNC.read_bytes())
    out = ws / "out" / "ds"
    dead = _dead_pid()
    prefix = outdir.temporary_prefix(out, "tmp")
    stale = out.parent / f"{prefix}{outdir._host()}.{dead}.0.abc123"
    put(stale / ".overlapviz-incomplete", "{}")
    put(stale / "kernels" / "r" / "rank0.parquet", b"half")
    # left alone: a live process's, another host's, and a directory without the marker
    live = out.parent / f"{prefix}{outdir._host()}.{os.getppid()}.0.live01"
    put(live / ".overlapviz-incomplete", "{}")
    other_host = out.parent / f"{prefix}otherhost.{dead}.0.abc123"
    put(other_host / ".overlapviz-incomplete", "{}")
    unmarked = out.parent / f"{prefix}{outdir._host()}.{dead}.0.mine99"
    put(unmarked / "precious.txt", "not overlapviz's")
    run = Run([p], out)
    run.expect_removed = [stale]  # type: ignore[attr-defined]
    return run


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


# rocprof (CSV, JSON, v2 text) -----------------------------------------------------------------


@case()
def rocprof_v3_truncated_kernel_trace(ws):
    d = copy_dir(ROCPROF_V3, ws / "v3")
    text = (d / "kernel_trace.csv").read_bytes()
    (d / "kernel_trace.csv").write_bytes(text[: len(text) - 30])
    return Run([d / "kernel_trace.csv"], ws / "out" / "ds")


@case()
def rocprof_v3_timestamp_past_int64(ws):
    d = copy_dir(ROCPROF_V3, ws / "v3")
    edit_csv(ROCPROF_V3 / "kernel_trace.csv", d / "kernel_trace.csv", "End_Timestamp", "99999999999999999999")
    return Run([d / "kernel_trace.csv"], ws / "out" / "ds", names="End_Timestamp")


@case()
def rocprof_v3_timestamp_uint64(ws):
    d = copy_dir(ROCPROF_V3, ws / "v3")
    edit_csv(ROCPROF_V3 / "kernel_trace.csv", d / "kernel_trace.csv", "Start_Timestamp", "18446744073709551615")
    return Run([d / "kernel_trace.csv"], ws / "out" / "ds", names="line 2")


@case()
def rocprof_v3_timestamp_nan(ws):
    d = copy_dir(ROCPROF_V3, ws / "v3")
    edit_csv(ROCPROF_V3 / "kernel_trace.csv", d / "kernel_trace.csv", "Start_Timestamp", "NaN", row=1)
    return Run([d / "kernel_trace.csv"], ws / "out" / "ds", names="line 3")


@case()
def rocprof_v3_timestamp_true(ws):
    d = copy_dir(ROCPROF_V3, ws / "v3")
    edit_csv(ROCPROF_V3 / "kernel_trace.csv", d / "kernel_trace.csv", "Start_Timestamp", "true")
    return Run([d / "kernel_trace.csv"], ws / "out" / "ds", names="Start_Timestamp")


@case()
def rocprof_v3_timestamp_fraction(ws):
    d = copy_dir(ROCPROF_V3, ws / "v3")
    edit_csv(ROCPROF_V3 / "kernel_trace.csv", d / "kernel_trace.csv", "End_Timestamp", "1550151853042437.5")
    return Run([d / "kernel_trace.csv"], ws / "out" / "ds", names="End_Timestamp")


@case()
def rocprof_v3_negative_duration(ws):
    d = copy_dir(ROCPROF_V3, ws / "v3")
    edit_csv(ROCPROF_V3 / "kernel_trace.csv", d / "kernel_trace.csv", "End_Timestamp", "1")
    return Run([d / "kernel_trace.csv"], ws / "out" / "ds", names="negative duration")


@case()
def rocprof_v3_grid_past_int32(ws):
    d = copy_dir(ROCPROF_V3, ws / "v3")
    edit_csv(ROCPROF_V3 / "kernel_trace.csv", d / "kernel_trace.csv", "Grid_Size_X", str(2**45))
    return Run([d / "kernel_trace.csv"], ws / "out" / "ds", names="grid_x")


@case()
def rocprof_v3_agent_id_past_int64(ws):
    d = copy_dir(ROCPROF_V3, ws / "v3")
    edit_csv(ROCPROF_V3 / "kernel_trace.csv", d / "kernel_trace.csv", "Agent_Id", "Agent 99999999999999999999")
    return Run([d / "kernel_trace.csv"], ws / "out" / "ds", names="Agent_Id")


@case()
def rocprof_v3_header_only(ws):
    d = copy_dir(ROCPROF_V3, ws / "v3")
    (d / "memory_copy_trace.csv").unlink()
    header = (d / "kernel_trace.csv").read_text().splitlines()[0]
    (d / "kernel_trace.csv").write_text(header + "\n")
    return Run([d / "kernel_trace.csv"], ws / "out" / "ds")


@case()
def rocprof_v3_binary_garbage_line(ws):
    d = copy_dir(ROCPROF_V3, ws / "v3")
    with open(d / "kernel_trace.csv", "ab") as fh:
        fh.write(b"\xff\xfe\x00garbage,\x80\x81\n")
    return Run([d / "kernel_trace.csv"], ws / "out" / "ds")


@case()
def rocprof_v3_companion_api_trace_corrupt(ws):
    d = copy_dir(ROCPROF_V3, ws / "v3")
    edit_csv(ROCPROF_V3 / "hip_trace.csv", d / "hip_trace.csv", "Correlation_Id", "1e400")
    return Run([d / "kernel_trace.csv"], ws / "out" / "ds", names="Correlation_Id", culprit=d / "hip_trace.csv")


@case()
def rocprof_v3_rank_in_prefix_past_int32(ws):
    d = ws / "v3"
    d.mkdir()
    for p in ROCPROF_V3.iterdir():
        shutil.copy(p, d / f"rank99999999999_{p.name}")
    return Run([d / "rank99999999999_kernel_trace.csv"], ws / "out" / "ds", names="rank")


@case()
def rocprof_v1_csv_begin_past_int64(ws):
    lines = ROCPROF_V1_CSV.read_text().splitlines()[:40]
    p = put(ws / "v1" / "results.csv", "\n".join(lines) + "\n")
    edit_csv(p, p, "BeginNs", "9" * 25, row=3)
    return Run([p], ws / "out" / "ds", names="line 5")


@case()
def rocprof_v1_csv_grid_past_int32(ws):
    lines = ROCPROF_V1_CSV.read_text().splitlines()[:40]
    p = put(ws / "v1" / "results.csv", "\n".join(lines) + "\n")
    edit_csv(p, p, "grd", str(2**50), row=2)
    edit_csv(p, p, "wgr", "1", row=2)
    return Run([p], ws / "out" / "ds", names="grid_x")


@case()
def rocprof_v1_csv_last_line_cut(ws):
    text = ROCPROF_V1_CSV.read_bytes()[:20_000]
    return Run([put(ws / "v1" / "results.csv", text)], ws / "out" / "ds")


@case()
def rocprof_v1_json_boolean_begin(ws):
    d = copy_dir(ROCPROF_V1_JSON, ws / "v1")
    doc = json.loads((d / "results.json").read_text())
    gpu_event(doc)["args"]["BeginNs"] = True
    put_doc(d / "results.json", doc)
    return Run([d / "results.json"], ws / "out" / "ds", names="BeginNs")


@case()
def rocprof_v1_json_infinite_ts(ws):
    d = copy_dir(ROCPROF_V1_JSON, ws / "v1")
    doc = json.loads((d / "results.json").read_text())
    ev = gpu_event(doc)
    ev["args"].pop("BeginNs")  # then every event's times come from ts/dur
    ev["ts"] = "Infinity"
    put_doc(d / "results.json", doc)
    return Run([d / "results.json"], ws / "out" / "ds", names="'ts'")


@case()
def rocprof_v1_json_truncated(ws):
    d = copy_dir(ROCPROF_V1_JSON, ws / "v1")
    text = (d / "results.json").read_bytes()
    (d / "results.json").write_bytes(text[: len(text) // 2])
    return Run([d / "results.json"], ws / "out" / "ds")


@case()
def rocprof_v1_json_events_not_objects(ws):
    d = copy_dir(ROCPROF_V1_JSON, ws / "v1")
    doc = json.loads((d / "results.json").read_text())
    for e in doc["traceEvents"]:
        if e.get("ph") == "M":
            e["args"] = "not an object"
    put_doc(d / "results.json", doc)
    return Run([d / "results.json"], ws / "out" / "ds")


@case()
def kineto_no_activities(ws):
    return Run([put(ws / "in" / "rank0.json", '{"schemaVersion": 1, "traceEvents": []}')], ws / "out" / "ds")


@case(ok=True)
def rocprof_v1_json_without_exact_times(ws):
    """Older rocprof v1 JSON has no args.BeginNs: known by its lanes, timed from ts/dur."""
    d = copy_dir(ROCPROF_V1_JSON, ws / "v1")
    doc = json.loads((d / "results.json").read_text())
    for e in doc["traceEvents"]:
        (e.get("args") or {}).pop("BeginNs", None)
    put_doc(d / "results.json", doc)
    return Run([d / "results.json"], ws / "out" / "ds")


def v3_dispatch(doc: dict) -> dict:
    return doc["rocprofiler-sdk-tool"][0]["buffer_records"]["kernel_dispatch"][0]


@case(ok=True)
def rocprof_v3_json_cut_is_legitimate(ws):
    return Run([put_doc(ws / "in" / "908_results.json", small_v3_json())], ws / "out" / "ds")


@case()
def rocprof_v3_json_boolean_timestamp(ws):
    doc = small_v3_json()
    v3_dispatch(doc)["start_timestamp"] = True
    return Run([put_doc(ws / "in" / "908_results.json", doc)], ws / "out" / "ds", names="start_timestamp")


@case()
def rocprof_v3_json_uint64_timestamp(ws):
    doc = small_v3_json()
    v3_dispatch(doc)["end_timestamp"] = 2**64 - 1
    return Run([put_doc(ws / "in" / "908_results.json", doc)], ws / "out" / "ds", names="end_timestamp")


@case()
def rocprof_v3_json_fraction_timestamp(ws):
    doc = small_v3_json()
    v3_dispatch(doc)["end_timestamp"] = 1.5
    return Run([put_doc(ws / "in" / "908_results.json", doc)], ws / "out" / "ds", names="end_timestamp")


@case()
def rocprof_v3_json_grid_past_int32(ws):
    doc = small_v3_json()
    info = v3_dispatch(doc)["dispatch_info"]
    info["grid_size"]["x"], info["workgroup_size"]["x"] = 2**50, 1
    return Run([put_doc(ws / "in" / "908_results.json", doc)], ws / "out" / "ds", names="grid_x")


@case()
def rocprof_v3_json_symbol_registers_boolean(ws):
    doc = small_v3_json()
    tool = doc["rocprofiler-sdk-tool"][0]
    sym = tool["kernel_symbols"][0] if isinstance(tool["kernel_symbols"], list) else next(iter(tool["kernel_symbols"].values()))
    sym["arch_vgpr_count"] = True
    return Run([put_doc(ws / "in" / "908_results.json", doc)], ws / "out" / "ds", names="arch_vgpr_count")


@case()
def rocprof_v3_json_records_not_objects(ws):
    doc = small_v3_json()
    doc["rocprofiler-sdk-tool"][0]["buffer_records"]["kernel_dispatch"] = [1, 2, 3]
    return Run([put_doc(ws / "in" / "908_results.json", doc)], ws / "out" / "ds")


@case()
def rocprof_v3_json_tool_entries_not_objects(ws):
    return Run([put(ws / "in" / "908_results.json", '{"rocprofiler-sdk-tool": [5, "x"]}')], ws / "out" / "ds")


@case()
def rocprof_v3_json_agents_of_the_wrong_shape(ws):
    doc = small_v3_json()
    for a in doc["rocprofiler-sdk-tool"][0]["agents"]:
        a["id"] = "not an object"
        a["mem_banks"] = [1, 2]
    return Run([put_doc(ws / "in" / "908_results.json", doc)], ws / "out" / "ds")


@case()
def rocprof_v3_json_deeply_nested(ws):
    deep = "[" * 5000 + "]" * 5000
    return Run([put(ws / "in" / "908_results.json", '{"rocprofiler-sdk-tool": ' + deep + "}")], ws / "out" / "ds")


@case(subprocess_cli=True)
def rocprof_v3_json_gzip_bomb_past_the_limit(ws):
    body = json.dumps(small_v3_json()).encode()
    body = body[:-1] + b" " * (8 * 1024 * 1024) + b"}"
    run = Run([put(ws / "in" / "908_results.json.gz", gzip.compress(body, compresslevel=9))], ws / "out" / "ds",
              names="inflates to more than")  # fmt: skip
    run.env = {"OVERLAPVIZ_MAX_INFLATED_BYTES": str(2 * 1024 * 1024)}
    return run


@case()
def rocprof_v2_timestamp_past_int64(ws):
    text = ROCPROF_V2.read_text()
    import re

    text = re.sub(r"End_Timestamp\(\d+\)", "End_Timestamp(99999999999999999999)", text, count=1)
    return Run([put(ws / "v2" / "golden.txt", text)], ws / "out" / "ds", names="End_Timestamp")


@case()
def rocprof_v2_text_in_grid(ws):
    text = ROCPROF_V2.read_text()
    import re

    text = re.sub(r"Grid_Size\(\d+\)", "Grid_Size(lots)", text, count=1)
    return Run([put(ws / "v2" / "golden.txt", text)], ws / "out" / "ds", names="Grid_Size")


# Nsight Systems and rocpd SQLite ------------------------------------------------------------------


def nsys_copy(ws: Path, sql: str | None = None) -> Path:
    p = ws / "in" / "report.sqlite"
    p.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(NSYS, p)
    if sql:
        db = sqlite3.connect(p)
        db.executescript(sql)
        db.commit()
        db.close()
    return p


@case(ok=True)
def nsys_legitimate(ws):
    return Run([nsys_copy(ws)], ws / "out" / "ds")


@case()
def nsys_truncated(ws):
    p = nsys_copy(ws)
    data = p.read_bytes()
    p.write_bytes(data[: len(data) // 3])
    return Run([p], ws / "out" / "ds")


@case()
def nsys_pages_overwritten(ws):
    p = nsys_copy(ws)
    data = bytearray(p.read_bytes())
    for i in range(4096, len(data), 8192):
        data[i: i + 512] = b"\xa5" * 512
    p.write_bytes(bytes(data))
    return Run([p], ws / "out" / "ds")


@case()
def nsys_kernel_start_past_its_end(ws):
    return Run([nsys_copy(ws, "UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET start = end + 1000;")], ws / "out" / "ds")


@case()
def nsys_text_in_a_time_column(ws):
    return Run([nsys_copy(ws, "UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET start = 'yesterday';")], ws / "out" / "ds")


@case()
def nsys_real_in_a_time_column(ws):
    return Run([nsys_copy(ws, "UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET end = 1e300;")], ws / "out" / "ds")


@case()
def nsys_grid_past_int32(ws):
    return Run([nsys_copy(ws, f"UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET gridX = {2**40};")], ws / "out" / "ds",
               names="grid")  # fmt: skip


@case()
def nsys_gpu_limit_of_the_wrong_type(ws):
    # was stored as null without a word (docs/nsys_rocpd.md says a value of the wrong type is refused)
    return Run([nsys_copy(ws, "UPDATE TARGET_INFO_GPU SET maxShmemPerSm = 'lots';")], ws / "out" / "ds",
               names="TARGET_INFO_GPU: field 'maxShmemPerSm' holds a text value ('lots')")  # fmt: skip


@case()
def nsys_sm_count_of_the_wrong_type(ws):
    # smCount stood in for it without a word
    return Run([nsys_copy(ws, "UPDATE TARGET_INFO_CUDA_DEVICE SET numMultiprocessors = 'many';")], ws / "out" / "ds",
               names="TARGET_INFO_CUDA_DEVICE: field 'numMultiprocessors' holds a text value")  # fmt: skip


@case()
def nsys_gpu_limit_a_real(ws):
    return Run([nsys_copy(ws, "UPDATE TARGET_INFO_GPU SET maxThreadsPerBlock = 1024.5;")], ws / "out" / "ds",
               names="'maxThreadsPerBlock' holds a real value")  # fmt: skip


@case(ok=True)
def nsys_kernel_table_dropped(ws):
    """A report without kernels (copies and memsets only) is a trace all the same."""
    return Run([nsys_copy(ws, "DROP TABLE CUPTI_ACTIVITY_KIND_KERNEL;")], ws / "out" / "ds")


@case()
def sqlite_of_unrelated_tables(ws):
    p = ws / "in" / "data.sqlite"
    p.parent.mkdir()
    db = sqlite3.connect(p)
    db.executescript("CREATE TABLE people (name TEXT, age INT); INSERT INTO people VALUES ('a', 1);")
    db.close()
    return Run([p], ws / "out" / "ds")


@case()
def sqlite_header_only(ws):
    return Run([put(ws / "in" / "report.sqlite", b"SQLite format 3\x00" + bytes(84))], ws / "out" / "ds")


def rocpd_db(ws: Path, set_dispatch: str | None = None) -> Path:
    from _rocpd_db import (
        make_db,  # the rocpd schema as ROCm publishes it, filled like rocprofv3 does
    )

    (ws / "in").mkdir(parents=True, exist_ok=True)
    p = make_db(ws / "in" / "4242_results.db")
    if set_dispatch:
        db = sqlite3.connect(p)
        (table,) = db.execute("SELECT name FROM sqlite_master WHERE type = 'table' "
                              "AND name LIKE 'rocpd_kernel_dispatch_%'").fetchone()  # fmt: skip
        db.execute(f"UPDATE {table} SET {set_dispatch}")
        db.commit()
        db.close()
    return p


@case(ok=True)
def rocpd_legitimate(ws):
    return Run([rocpd_db(ws)], ws / "out" / "ds")


@case()
def rocpd_truncated(ws):
    p = rocpd_db(ws)
    data = p.read_bytes()
    p.write_bytes(data[: len(data) // 2])
    return Run([p], ws / "out" / "ds")


@case()
def rocpd_dispatch_end_before_start(ws):
    return Run([rocpd_db(ws, "end = start - 5")], ws / "out" / "ds")


@case()
def rocpd_dispatch_time_past_int64(ws):
    return Run([rocpd_db(ws, "end = 1e30")], ws / "out" / "ds")


@case()
def rocpd_grid_past_int32(ws):
    return Run([rocpd_db(ws, f"grid_size_x = {2**45}, workgroup_size_x = 1")], ws / "out" / "ds", names="grid")


def rocpd_redeclared(ws: Path, base: str, declare, fill: str | None = None) -> Path:
    """``rocpd_db`` whose ``rocpd_<base>_<guid>`` table is declared again: ``declare(name, type)`` gives each
    column's new ``(name, type)`` (no constraints); its rows are copied, then ``fill`` (an UPDATE's SET) runs."""
    p = rocpd_db(ws)
    db = sqlite3.connect(p)
    db.execute("PRAGMA legacy_alter_table = ON")  # the views name the old columns: leave them be
    (table,) = db.execute("SELECT name FROM sqlite_master WHERE type = 'table' AND name LIKE ?", (f"rocpd_{base}_%",)).fetchone()
    cols = [declare(r[1], r[2]) for r in db.execute(f"PRAGMA table_info({table})")]
    db.executescript(f"ALTER TABLE {table} RENAME TO old_table; CREATE TABLE {table} ("
                     + ", ".join(f'"{c}" {t}' for c, t in cols) + f"); INSERT INTO {table} SELECT * FROM old_table; "
                     + "DROP TABLE old_table;" + (f"UPDATE {table} SET {fill};" if fill else ""))  # fmt: skip
    db.commit()
    db.close()
    return p


@case()
def rocpd_dispatch_times_of_another_schema(ws):
    # start_id / end_id where rocpd has start / end: read as NULL times, the ingest said ok (exit 0)
    p = rocpd_redeclared(ws, "kernel_dispatch", lambda c, t: (f"{c}_id" if c in ("start", "end") else c, t))
    return Run([p], ws / "out" / "ds", names="has no column 'start'")


@case()
def rocpd_copy_without_its_end(ws):
    p = rocpd_redeclared(ws, "memory_copy", lambda c, t: ("finish" if c == "end" else c, t))
    return Run([p], ws / "out" / "ds", names="has no column 'end'")


@case()
def rocpd_region_time_declared_text(ws):
    p = rocpd_redeclared(ws, "region", lambda c, t: (c, "TEXT" if c == "start" else t))
    return Run([p], ws / "out" / "ds", names="'start' is declared TEXT")


@case()
def rocpd_dispatch_null_times(ws):
    p = rocpd_redeclared(ws, "kernel_dispatch", lambda c, t: (c, t), fill="start = NULL")
    return Run([p], ws / "out" / "ds", names="is NULL")


# collected runs: manifests and timings ----------------------------------------------------------


def collected_run(ws: Path) -> Path:
    d = ws / "runs" / "r1"
    put(d / "rank0.json.gz", EVENT_SYNC.read_bytes())
    put(d / "manifest.json", json.dumps({"format": "overlapviz-run/1", "run": {"run_id": "r1", "status": "ok"}}))
    return d


@case(ok=True)
def manifest_legitimate(ws):
    return Run([collected_run(ws)], ws / "out" / "ds")


@case()
def manifest_invalid_json(ws):
    d = collected_run(ws)
    put(d / "manifest.json", '{"format": "overlapviz-run/1", "run": {')
    return Run([d], ws / "out" / "ds", culprit=d / "manifest.json")


@case()
def manifest_deeply_nested(ws):
    d = collected_run(ws)
    put(d / "manifest.json", '{"format": "overlapviz-run/1", "run": {}, "x": ' + "[" * 100_000 + "]" * 100_000 + "}")
    return Run([d], ws / "out" / "ds", culprit=d / "manifest.json")


@case()
def manifest_world_size_past_int32(ws):
    d = collected_run(ws)
    put(d / "manifest.json", json.dumps({"format": "overlapviz-run/1", "run": {"run_id": "r1", "world_size": 2**40}}))
    return Run([d], ws / "out" / "ds", culprit=d / "manifest.json")


@case()
def timings_with_nan(ws):
    d = collected_run(ws)
    put(d / "timings_rank0.json", '{"rank": 0, "iterations": [{"iteration": 0, "time_ms": NaN}]}')
    return Run([d], ws / "out" / "ds", culprit=d / "timings_rank0.json")


@case()
def timings_with_boolean_iteration(ws):
    d = collected_run(ws)
    put(d / "timings_rank0.json", '{"rank": 0, "iterations": [{"iteration": true, "time_ms": 1.0}]}')
    return Run([d], ws / "out" / "ds", culprit=d / "timings_rank0.json")


# --- running the corpus -------------------------------------------------------------------------------


def _params():
    for name, c in CASES.items():
        marks = []
        if c.xfail:
            marks.append(pytest.mark.xfail(strict=True, reason=c.xfail))
        if c.skip:
            marks.append(pytest.mark.skip(reason=c.skip))
        yield pytest.param(name, marks=marks, id=name)


def test_the_corpus_is_large_enough():
    assert len(CASES) >= 60
    assert sum(not c.ok for c in CASES.values()) >= 60


@pytest.mark.parametrize("name", list(_params()))
def test_hostile_input(name, tmp_path):
    c = CASES[name]
    ws = tmp_path / "ws"
    (ws / "out").mkdir(parents=True)  # -o's parent: each case makes its own inputs
    try:
        run = c.build(ws)
        removed = getattr(run, "expect_removed", [])
        if c.ok:
            if removed:
                before = snapshot(ws)
            out = assert_ingested(run, ws, subprocess_cli=c.subprocess_cli) if not removed else None
            if removed:
                code, text, _ = invoke(run, subprocess_cli=c.subprocess_cli)
                assert code == 0, text
                check_dataset(run.out)
                gone = {k for k in before if not os.path.lexists(os.path.join(os.fsencode(ws), k))}
                expected = {os.fsencode(os.path.relpath(r, ws)) for r in removed}
                assert {g for g in gone if not any(under(g, e) for e in expected)} == set()
                assert all(not os.path.lexists(r) for r in removed)
                assert {k for k in snapshot(ws) if k not in before} <= {
                    k for k in snapshot(ws) if under(k, os.fsencode(os.path.relpath(run.out, ws)))
                }
            else:
                assert out is not None
        else:
            assert_refused(run, ws, subprocess_cli=c.subprocess_cli)
    finally:
        for dirpath, dirnames, _ in os.walk(ws):  # let pytest remove what a case made read-only
            for d in dirnames:
                try:
                    os.chmod(os.path.join(dirpath, d), 0o755)
                except OSError:
                    pass


# --- a kept event's args must be an object: both Kineto readers alike ---------------------------------

# the first complete event of each category, and the bucket word its error uses
_ARGS_CATS = {"kernel": "GPU activity", "gpu_memset": "GPU activity", "cuda_runtime": "runtime", "cpu_op": "host",
              "cuda_sync": "cuda_sync"}  # fmt: skip
_NON_OBJECTS = {"array": ([1, 2, 3], "an array"), "empty_array": ([], "an array"), "string": ("{}", "a string"),
                "number": (7, "a number"), "float": (-0.5, "a number"), "true": (True, "a boolean"),
                "false": (False, "a boolean"), "null": (None, "null")}  # fmt: skip


def _with_args(value, cat: str) -> tuple[bytes, int, str]:
    """The EVENT_SYNC trace with the first complete ``cat`` event's args replaced; its index and name."""
    doc = doc_of(EVENT_SYNC)
    i, ev = next((i, e) for i, e in enumerate(doc["traceEvents"]) if e.get("cat") == cat and e.get("ph") == "X")
    ev["args"] = value
    return json.dumps(doc).encode(), i, ev["name"]


@pytest.mark.parametrize("kind", list(_NON_OBJECTS))
@pytest.mark.parametrize("cat", list(_ARGS_CATS))
def test_args_not_an_object_is_refused_alike_by_both_readers(cat, kind, tmp_path):
    from overlapviz.ingest import chrome_columns

    value, said = _NON_OBJECTS[kind]
    raw, index, name = _with_args(value, cat)
    src = put(tmp_path / "in" / "rank0.json", raw)
    (tmp_path / "out").mkdir()
    want = f"Error: {shown(src)}: {_ARGS_CATS[cat]} event #{index} {name!r}: field 'args' is {said}, not an object"
    errors = {}
    for pure in ("1", "0"):
        before = snapshot(tmp_path)
        code, text, exc = invoke(Run([src], tmp_path / "out" / "ds", env={"OVERLAPVIZ_PURE_PYTHON": pure}))
        assert (code, text.strip()) == (1, want), (pure, text, exc)
        assert snapshot(tmp_path) == before
        errors[pure] = text
    assert errors["1"] == errors["0"]
    if chrome_columns._kineto is not None:  # the scanner itself says it, it does not hand the file over
        with pytest.raises(ValueError) as err:
            chrome_columns._kineto.scan(raw, chrome_columns._CATS, ())
        assert isinstance(err.value, chrome_columns._kineto.BadArgs)
        with pytest.raises(ValueError, match=r"^" + re.escape(want.split(": ", 2)[2]) + "$"):
            chrome_columns.scan_tables(raw)


def test_args_error_names_the_first_bad_event_and_its_unescaped_name(tmp_path, monkeypatch):
    from overlapviz.ingest import chrome

    doc = doc_of(EVENT_SYNC)
    kept = [i for i, e in enumerate(doc["traceEvents"]) if e.get("cat") == "cuda_runtime" and e.get("ph") == "X"]
    doc["traceEvents"][kept[3]]["args"] = "late"
    doc["traceEvents"][kept[1]]["args"] = None
    name = doc["traceEvents"][kept[1]]["name"] = 'k"\u00e9\\n\U0001f600'  # escaped in the JSON
    doc["traceEvents"][kept[0]]["ts"] = "soon"  # a worse time earlier: the args rule is checked first, by both
    src = put(tmp_path / "rank0.json", json.dumps(doc, ensure_ascii=True))
    messages = set()
    for pure in ("1", "0"):
        monkeypatch.setenv("OVERLAPVIZ_PURE_PYTHON", pure)
        with pytest.raises(ValueError) as err:
            chrome.ChromeReader().read(src)
        messages.add(str(err.value))
    assert messages == {f"{src}: runtime event #{kept[1]} {name!r}: field 'args' is null, not an object"}


def test_args_of_events_ingest_does_not_keep_are_not_judged(tmp_path, monkeypatch):
    """Flows, instants, metadata, python_function and unknown categories: ignored (their
    args are never read), by both readers, and the scanner reads the file itself."""
    from overlapviz.ingest import chrome, chrome_columns

    doc = doc_of(EVENT_SYNC)
    doc["traceEvents"] += [
        {"ph": "X", "cat": "python_function", "name": "f", "ts": 1, "dur": 1, "args": [1]},
        {"ph": "i", "cat": "kernel", "name": "k", "ts": 1, "args": "x"},
        {"ph": "s", "cat": "ac2g", "id": 1, "ts": 1, "args": None},
        {"ph": "M", "name": "process_name", "pid": 1, "args": 3},
        {"args": [], "ph": "X", "cat": "Trace", "name": "t", "ts": 1, "dur": 1},
        {"args": True, "name": "no category", "ts": 1, "dur": 1},
    ]
    src = put(tmp_path / "rank0.json", json.dumps(doc))
    if chrome_columns._kineto is not None:
        assert chrome_columns.scan_tables(src.read_bytes()) is not None
    reads = []
    for pure in ("1", "0"):
        monkeypatch.setenv("OVERLAPVIZ_PURE_PYTHON", pure)
        (trace,) = chrome.ChromeReader().read(src)
        reads.append(trace)
    assert reads[0].kernels.equals(reads[1].kernels) and reads[0].kernels.num_rows == 6


@pytest.mark.parametrize("event", [
    '{"cat": "python_function", "cat": "kernel", "ph": "X", "name": "k", "ts": 1, "dur": 1, "args": []}',
    '{"ph": "i", "ph": "X", "cat": "kernel", "name": "k", "ts": 1, "dur": 1, "args": 5}',
    '{"cat": "kernel", "ph": "X", "name": "k", "ts": 1, "dur": 1, "args": [], "args": {"stream": 3}}',
])  # fmt: skip
def test_duplicate_keys_read_as_json_reads_them(event, tmp_path, monkeypatch):
    """The last value of a key counts (Python's dict): the scanner hands such events over
    or keeps the last args, so both readers agree."""
    from overlapviz.ingest import chrome

    text = gzip.decompress(EVENT_SYNC.read_bytes()).decode()
    src = put(tmp_path / "rank0.json", text.replace('"traceEvents": [', '"traceEvents": [' + event + ", ", 1))
    out = []
    for pure in ("1", "0"):
        monkeypatch.setenv("OVERLAPVIZ_PURE_PYTHON", pure)
        try:
            out.append(chrome.ChromeReader().read(src)[0].kernels)
        except ValueError as exc:
            out.append(str(exc))
    assert out[0] == out[1] if isinstance(out[0], str) else out[0].equals(out[1])
    if "stream" in event:
        assert isinstance(out[0], str) is False and 3 in out[0].column("stream").to_pylist()
    else:
        assert out[0] == f"{src}: GPU activity event #0 'k': field 'args' is {'an array' if '[]' in event else 'a number'}, not an object"
