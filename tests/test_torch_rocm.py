"""PyTorch-profiler traces recorded on ROCm (tests/data/torch_rocm) through ``overlapviz ingest``.

They go through the Kineto reader (overlapviz/ingest/chrome.py); these tests check the
ROCm-specific parts against the raw JSON read here with ``json`` + ``Decimal``: grids in
blocks (``hipExtModuleLaunchKernel`` reports work-items), RCCL kernels without grid/block
(taken from their launch call), stream vs queue, the collective from
``record_param_comms``, exact ns launch times and the overlap figures.
"""

from __future__ import annotations

import gzip
import json
import math
import re
from decimal import Decimal
from pathlib import Path

import pandas as pd
import pytest

from overlapviz.dataset.schema import read_frame
from overlapviz.testing import analyze_cli as analyze
from overlapviz.testing import check_metrics, expected_overlap
from overlapviz.testing import ingest_cli as ingest

DATA = Path(__file__).parent / "data" / "torch_rocm"
TRACES = ["resnet_act_checkpoint.json.gz", "gaunernst_bert-small-uncased__1016001.json.gz", "gpu_only_trace.json.gz"]
COMM = re.compile(r"nccl|rccl|msccl", re.IGNORECASE)
WORKITEM_APIS = {"hipExtModuleLaunchKernel", "hipHccModuleLaunchKernel"}  # their "grid" is globalWorkSize


def ns(value: Decimal) -> int:
    return int(value * 1000)


def raw(name: str) -> dict:
    return json.loads(gzip.decompress((DATA / name).read_bytes()), parse_float=Decimal)


def expected_grid(kernel: dict, launch: dict | None) -> list | None:
    args = dict(launch["args"]) if launch is not None and "grid" in launch["args"] else kernel["args"]
    if "grid" not in args:
        return None
    grid, block = args["grid"], args["block"]
    if launch is not None and launch["name"] in WORKITEM_APIS:
        return [math.ceil(g / b) for g, b in zip(grid, block)]
    return list(grid)


@pytest.mark.parametrize("name", TRACES)
def test_rocm_trace(tmp_path, name):
    doc = raw(name)
    events = doc["traceEvents"]
    kernels = [e for e in events if e.get("cat") == "kernel"]
    memory = [e for e in events if e.get("cat") in ("gpu_memcpy", "gpu_memset")]
    runtime = {e["args"]["correlation"]: e for e in events if e.get("cat") == "cuda_runtime" and "correlation" in e["args"]}
    steps = {
        int(e["name"].split("#")[1]): (ns(e["ts"]), ns(e["ts"]) + ns(e["dur"]))
        for e in sorted(events, key=lambda e: e.get("ts", 0))
        if e.get("cat") in ("user_annotation", "cpu_op") and str(e.get("name", "")).startswith("ProfilerStep#")
    }
    out, _ = ingest(tmp_path, DATA / name)
    k = read_frame(out, "kernels")
    assert len(k) == len(kernels) + len(memory)
    st = read_frame(out, "steps")
    assert sorted(st["step"]) == sorted(steps) and all(st.set_index("step")["start_ns"][n] == a for n, (a, _) in steps.items())
    gpu = k[k["category"] == "kernel"].set_index("correlation")
    assert len(gpu) == len(kernels)
    for e in kernels:
        row = gpu.loc[e["args"]["correlation"]]
        launch = runtime.get(e["args"]["correlation"])
        grid = expected_grid(e, launch)
        got = [row["grid_x"], row["grid_y"], row["grid_z"]]
        assert (got == grid) if grid is not None else all(pd.isna(v) for v in got), e["name"]
        assert row["stream"] == e["args"]["stream"]  # the HIP stream, not the HSA queue
        assert row["start_ns"] == ns(e["ts"]) and row["end_ns"] == ns(e["ts"]) + ns(e["dur"])
        if launch is not None:
            assert row["launch_ns"] == ns(launch["ts"])
            inside = [n for n, (a, b) in steps.items() if a <= ns(launch["ts"]) < b]
            assert (row["step"] == inside[-1]) if inside else pd.isna(row["step"])
        else:
            assert pd.isna(row["step"])
    comm = [(ns(e["ts"]), ns(e["ts"]) + ns(e["dur"])) for e in kernels if COMM.search(e["name"])]
    compute = [(ns(e["ts"]), ns(e["ts"]) + ns(e["dur"])) for e in kernels if not COMM.search(e["name"])]
    assert (k["kind"] == "comm").sum() == len(comm)
    (m,) = analyze(out)
    check_metrics(m, expected_overlap(comm, compute))
    dev = read_frame(out, "devices")
    assert set(dev["vendor"]) == {"amd"}
    assert dev["name"].tolist() == [d["name"] for d in doc["deviceProperties"]]
    assert dev["num_sms"].tolist() == [d["numSms"] for d in doc["deviceProperties"]]


def test_rccl_kernels_resnet(tmp_path):
    """17 RCCL kernels on their own stream; grid/block and the collective come from the host side."""
    doc = raw("resnet_act_checkpoint.json.gz")
    events = doc["traceEvents"]
    runtime = {e["args"]["correlation"]: e for e in events if e.get("cat") == "cuda_runtime" and "correlation" in e["args"]}
    comms = {e["args"]["External id"]: e["args"]["Collective name"] for e in events if e.get("name") == "record_param_comms"}
    rccl = [e for e in events if e.get("cat") == "kernel" and COMM.search(e["name"])]
    assert len(rccl) == 17
    out, _ = ingest(tmp_path, DATA / "resnet_act_checkpoint.json.gz")
    k = read_frame(out, "kernels").set_index("correlation")
    normal = {"allreduce": "all_reduce", "broadcast": "broadcast"}
    with_launch = 0
    for e in rccl:
        row = k.loc[e["args"]["correlation"]]
        assert row["kind"] == "comm" and row["stream"] == 4
        launch = runtime.get(e["args"]["correlation"])
        if launch is None:  # launched before the profiling window: nothing says which collective
            assert pd.isna(row["launch_ns"]) and pd.isna(row["grid_x"]) and "grid" not in e["args"]
            continue
        with_launch += 1
        assert [row["grid_x"], row["block_x"]] == [launch["args"]["grid"][0], launch["args"]["block"][0]]
        assert row["collective"] == normal[comms[launch["args"]["External id"]]]
    assert with_launch == 12
    assert read_frame(out, "ranks")["world_size"].tolist() == [doc["distributedInfo"]["world_size"]]


SDMA = DATA / "sdma_rccl_mi300x_ffn_down"


def test_copy_engine_collectives_are_communication(tmp_path):
    """RCCL 2.28's copy-engine all-gather runs as ``__amd_rocclr_*`` kernels, no NCCL kernel:
    the kernels whose own args carry PyTorch's collective metadata are that collective's
    communication (DESIGN.md), as many instances as the same job's RCCL-kernel trace shows."""
    out, _ = ingest(tmp_path, SDMA)
    k = read_frame(out, "kernels")
    expected = {}
    for variant in ("cu", "sdma"):
        name = f"ag_gemm_llama70b_ffn_down_{variant}_rank0"
        events = json.loads((SDMA / f"{name}.json").read_text(), parse_float=Decimal)["traceEvents"]
        tagged = {e["args"]["correlation"]: e["args"] for e in events
                  if e.get("cat") == "kernel" and "Collective name" in e["args"]}  # fmt: skip
        rows = k[k["run_id"] == name]
        comm = rows[rows["kind"] == "comm"].set_index("correlation")
        assert sorted(comm.index) == sorted(tagged)
        for corr, args in tagged.items():
            assert comm.loc[corr, "collective"] == "all_gather"
            assert comm.loc[corr, "comm_seq"] == args["Seq"]
            assert comm.loc[corr, "comm_group_ranks"] == args["Process Group Ranks"]
        expected[variant] = {a["Seq"] for a in tagged.values()}
    assert len(tagged) == 18 and expected["sdma"] == expected["cu"] and len(expected["cu"]) == 6
    by_run = {r["run_id"]: r for r in analyze(out)}
    sdma = by_run["ag_gemm_llama70b_ffn_down_sdma_rank0"]
    assert sdma["n_comm_kernels"] == 18 and sdma["comm_us"] > 0
