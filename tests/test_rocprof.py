"""rocprof v1 / v2 / v3 outputs through ``overlapviz ingest``, checked against the raw files.

Every expectation is computed here from the files in tests/data/rocprof with ``csv`` /
``json`` (never through overlapviz), so a reader that misparses a column fails.
"""

from __future__ import annotations

import csv
import gzip
import json
import math
import re
import shutil
from pathlib import Path

import pandas as pd
import pytest

from overlapviz.domain.collectives import api_collective
from overlapviz.ingest import detect
from overlapviz.ingest.rocprof_common import gfx_arch
from overlapviz.dataset.schema import read_frame
from overlapviz.testing import analyze_cli as analyze
from overlapviz.testing import check_metrics, expected_overlap
from overlapviz.testing import ingest_cli as ingest
from overlapviz.testing import measure, union

DATA = Path(__file__).parent / "data" / "rocprof"
V1_CSV = DATA / "v1" / "llamacpp_gfx1201_stats"
V1_JSON = DATA / "v1" / "kokkos_gfx906_hiptrace"
V2 = DATA / "v2" / "rocprofiler_goldentraces"
V3_CSV = DATA / "v3" / "rocprofiler_sdk_docs_data"
V3_JSON = DATA / "v3" / "tracelens_mi350x_json" / "908_results.json.gz"
COMM = re.compile(r"nccl|rccl|msccl", re.IGNORECASE)


def rows(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


# --- legacy rocprof v1 ------------------------------------------------------------------


def test_v1_results_csv(tmp_path):
    raw = rows(V1_CSV / "results.csv")
    out, _ = ingest(tmp_path, V1_CSV)
    k = read_frame(out, "kernels").sort_values("start_ns", kind="stable").reset_index(drop=True)
    assert len(k) == len(raw) == 1963
    raw.sort(key=lambda r: int(r["BeginNs"]))
    assert k["start_ns"].tolist() == [int(r["BeginNs"]) for r in raw]
    assert k["end_ns"].tolist() == [int(r["EndNs"]) for r in raw]
    # grd is work-items, wgr the work-group size: stored as blocks
    assert k["grid_x"].tolist() == [math.ceil(int(r["grd"]) / int(r["wgr"])) for r in raw]
    assert k["block_x"].tolist() == [int(r["wgr"]) for r in raw]
    assert k["shared_mem_bytes"].tolist() == [int(r["lds"]) for r in raw]
    assert k["regs_per_thread"].tolist() == [int(r["arch_vgpr"]) for r in raw]
    assert k["sgprs"].tolist() == [int(r["sgpr"]) for r in raw]
    assert set(k["wave_size"]) == {32}
    assert k["stream"].tolist() == [int(r["queue-id"]) for r in raw]
    assert not k["name"].str.endswith(".kd").any()
    assert set(k["source_format"]) == {"rocprof_v1_csv"}
    assert k["kind"].eq("compute").all() and not any(COMM.search(r["KernelName"]) for r in raw)
    (m,) = analyze(out)
    expected = expected_overlap([], [(int(r["BeginNs"]), int(r["EndNs"])) for r in raw])
    check_metrics(m, expected)
    assert m["span_us"] == pytest.approx((max(int(r["EndNs"]) for r in raw) - int(raw[0]["BeginNs"])) / 1e3)
    assert m["n_kernels"] == 1963 and m["n_comm_kernels"] == 0
    dev = read_frame(out, "devices")
    assert dev["vendor"].tolist() == ["amd"] and dev["warp_size"].tolist() == [32]


def v1_json_events():
    doc = json.loads((V1_JSON / "results.json").read_text())
    lanes = {str(e["pid"]): e["args"]["name"] for e in doc["traceEvents"] if e.get("ph") == "M"}
    x = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
    return doc, lanes, x


def test_v1_results_json(tmp_path):
    doc, lanes, x = v1_json_events()
    gpu = [e for e in x if lanes[e["pid"]] == "GPU0" and e["name"] != "Unknown command type"]
    copies = [e for e in x if lanes[e["pid"]] == "COPY"]
    launches = {int(e["args"]["BeginNs"]) for e in x if lanes[e["pid"]] == "CPU HIP API" and e["name"] == "hipLaunchKernel"}
    out, _ = ingest(tmp_path, V1_JSON)
    k = read_frame(out, "kernels")
    kern = k[k["category"] == "kernel"].sort_values("start_ns")
    assert len(kern) == len(gpu) == 8
    # exact ns from args.BeginNs/EndNs, not the µs-truncated ts/dur strings
    assert kern["start_ns"].tolist() == sorted(int(e["args"]["BeginNs"]) for e in gpu)
    assert sorted(kern["end_ns"]) == sorted(int(e["args"]["EndNs"]) for e in gpu)
    assert len(k[k["kind"] == "memory"]) == len(copies) == 30
    assert (k["category"] == "gpu_memset").sum() == sum(e["name"] == "FillBuffer" for e in copies)
    # each kernel's launch is the begin of a real hipLaunchKernel call, before the kernel
    assert kern["launch_ns"].notna().all()
    assert set(kern["launch_ns"]) <= launches
    assert (kern["launch_ns"] <= kern["start_ns"]).all()
    assert len(set(kern["launch_ns"])) == 8
    # a copy's launch: the last hipMemcpy*/hipMemset* call begun before it (rocprof draws the
    # arrow at the copy itself); copies without an arrow have none
    mem_calls = sorted(int(e["args"]["BeginNs"]) for e in x
                       if lanes[e["pid"]] == "CPU HIP API" and re.search("Memcpy|Memset", e["name"]))  # fmt: skip
    arrows = {int(e["ts"]) for e in doc["traceEvents"] if e.get("ph") == "t" and str(e.get("pid")) in
              {p for p, n in lanes.items() if n == "COPY"}}  # fmt: skip
    got = k[k["kind"] == "memory"].set_index("start_ns")["launch_ns"]
    for e in copies:
        begin = int(e["args"]["BeginNs"])
        if int(e["ts"]) in arrows:
            assert got[begin] == max(c for c in mem_calls if c <= begin)
        else:
            assert pd.isna(got[begin])
    assert got.notna().sum() == 28
    # AQL barrier packets ("Unknown command type", zero length) stay as kind "other": they count
    # as GPU activities like in rocprof's own kernel stats, never as computation
    lane = [e for e in x if lanes[e["pid"]] == "GPU0"]
    barriers = k[k["category"] == "barrier"]
    assert len(barriers) == len(lane) - len(gpu) == 4 and barriers["kind"].eq("other").all()
    # (rocprof v1 leaves commas in kernel names unquoted here: Calls is the 4th field from the end)
    stats = (V1_JSON / "results.stats.csv").read_text().splitlines()[1:]
    stats_calls = sum(int(line.rsplit(",", 4)[1]) for line in stats)
    (m,) = analyze(out)
    check_metrics(m, expected_overlap([], [(int(e["args"]["BeginNs"]), int(e["args"]["EndNs"])) for e in gpu]))
    assert m["n_kernels"] == len(lane) == stats_calls == 12
    span = max(int(e["args"]["EndNs"]) for e in lane) - min(int(e["args"]["BeginNs"]) for e in lane)
    assert m["span_us"] == pytest.approx(span / 1e3)
    assert m["memory_us"] == pytest.approx(
        measure(union((int(e["args"]["BeginNs"]), int(e["args"]["EndNs"])) for e in copies)) / 1e3
    )
    dev = read_frame(out, "devices").sort_values("device")
    info = doc["otherData"]
    gpus = sorted(int(k.split(".")[0][5:]) for k, v in info.items() if k.endswith(".DeviceType") and v == "GPU")
    assert dev["device"].tolist() == list(range(len(gpus))) == [0, 1, 2, 3]
    first = f"Agent{gpus[0]}"
    assert dev["arch"].iloc[0] == info[f"{first}.Name"] == "gfx906"
    assert dev["num_sms"].iloc[0] == int(info[f"{first}.ComputeUnit"])
    assert dev["simds_per_cu"].iloc[0] == int(info[f"{first}.SIMDsperCU"])
    assert dev["warp_size"].iloc[0] == int(info[f"{first}.WavefrontSize"].split("(")[0])
    waves = int(info[f"{first}.MaxWavesPerCU"].split("(")[0])
    assert dev["max_waves_per_simd"].iloc[0] * int(info[f"{first}.SIMDsperCU"]) == waves


def test_v1_json_and_csv_side_by_side_read_once(tmp_path):
    """rocprof writes results.json and results.csv together: one rank, kernels enriched from the CSV."""
    doc, lanes, x = v1_json_events()
    gpu = [e for e in x if lanes[e["pid"]] == "GPU0" and e["name"] != "Unknown command type"]
    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(V1_JSON / "results.json", run)
    header = ["Index", "KernelName", "gpu-id", "queue-id", "grd", "wgr", "lds", "arch_vgpr", "sgpr", "BeginNs", "EndNs"]
    with open(run / "results.csv", "w", newline="") as f:
        w = csv.writer(f, quoting=csv.QUOTE_NONNUMERIC)
        w.writerow(header)
        for i, e in enumerate(gpu):  # the kernels of the JSON with a launch shape, as results.csv has them
            w.writerow([i, e["name"], 0, 0, 4096 * (i + 1), 256, 512, 24, 32, int(e["args"]["BeginNs"]), int(e["args"]["EndNs"])])
    out, _ = ingest(tmp_path, run)
    k = read_frame(out, "kernels")
    assert set(k["rank"]) == {0} and set(k["source_format"]) == {"rocprof_v1_json"}
    kern = k[k["category"] == "kernel"].sort_values("start_ns")
    assert kern["grid_x"].tolist() == [16 * (i + 1) for i in range(8)]
    assert set(kern["shared_mem_bytes"]) == {512}


def test_files_named_together_read_each_process_once(tmp_path):
    """`ingest out/*.csv` names a process's companion files too: they are read with their primary."""
    whole, _ = ingest(tmp_path, V3_CSV, name="whole")
    each, _ = ingest(tmp_path, *sorted(V3_CSV.glob("*.csv")), name="each")
    a, b = read_frame(whole, "kernels"), read_frame(each, "kernels")
    assert len(a) == len(b) == 9 + len(rows(V3_CSV / "memory_copy_trace.csv"))
    assert sorted(a["start_ns"]) == sorted(b["start_ns"])
    # the stats file beside rocprof v1's results.json is claimed by it, not refused
    out, _ = ingest(tmp_path, V1_JSON / "results.json", V1_JSON / "results.stats.csv", name="v1")
    assert len(read_frame(out, "ranks")) == 1
    _, result = ingest(tmp_path, V1_JSON / "results.stats.csv", name="alone", ok=False)
    assert result.exit_code != 0 and "results.stats.csv" in result.output


# --- rocprofv2 cli text ---------------------------------------------------------------------


def test_v2_cli_dispatch_lines(tmp_path):
    line = next(l for l in (V2 / "hip_vectoradd_golden_traces.txt").read_text().splitlines() if l.startswith("Dispatch_ID"))
    fields = dict(re.findall(r"(\w+)\(([^()]*)\)", line))
    out, _ = ingest(tmp_path, V2 / "hip_vectoradd_golden_traces.txt")
    k = read_frame(out, "kernels")
    assert len(k) == 1
    row = k.iloc[0]
    assert row["name"] == fields["Kernel_Name"].strip('"')
    assert row["start_ns"] == int(fields["Begin_Timestamp"]) and row["end_ns"] == int(fields["End_Timestamp"])
    assert row["grid_x"] == int(fields["Grid_Size"]) // int(fields["Workgroup_Size"]) == 4096
    assert row["block_x"] == 256 and row["wave_size"] == 64 and row["device"] == int(fields["GPU_ID"])


def test_v2_cli_api_only_is_refused(tmp_path):
    out, result = ingest(tmp_path, V2, ok=False)
    assert result.exit_code != 0
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "hip_helloworld_golden_traces.txt" in lines[0] and "no kernel dispatch" in lines[0]
    assert not out.exists()


# --- rocprofv3 CSV --------------------------------------------------------------------------


def test_v3_csv_directory(tmp_path):
    raw = rows(V3_CSV / "kernel_trace.csv")
    copies = rows(V3_CSV / "memory_copy_trace.csv")
    hip = {int(r["Correlation_Id"]): r["Function"] for r in rows(V3_CSV / "hip_trace.csv")}
    out, _ = ingest(tmp_path, V3_CSV)
    k = read_frame(out, "kernels")
    kern = k[k["category"] == "kernel"].sort_values("correlation")
    raw.sort(key=lambda r: int(r["Correlation_Id"]))
    assert len(kern) == len(raw) == 9 and len(k) == 9 + len(copies)
    for axis in "xyz":
        A = axis.upper()
        assert kern[f"grid_{axis}"].tolist() == [math.ceil(int(r[f"Grid_Size_{A}"]) / int(r[f"Workgroup_Size_{A}"])) for r in raw]
        assert kern[f"block_{axis}"].tolist() == [int(r[f"Workgroup_Size_{A}"]) for r in raw]
    assert kern["stream"].tolist() == [int(r["Stream_Id"]) for r in raw]
    assert kern["regs_per_thread"].tolist() == [int(r["VGPR_Count"]) for r in raw]
    assert kern["accum_vgprs"].tolist() == [int(r["Accum_VGPR_Count"]) for r in raw]
    assert kern["device"].tolist() == [int(r["Agent_Id"].split()[-1]) for r in raw]
    assert kern["start_ns"].tolist() == [int(r["Start_Timestamp"]) for r in raw]
    # these documentation files come from different runs: the kernels' correlation ids land
    # on registration / allocation calls, which must not be taken for launches
    assert all(not re.search("launch", hip[int(r["Correlation_Id"])], re.I) for r in raw)
    assert k["launch_ns"].isna().all()
    mem = k[k["kind"] == "memory"].sort_values("start_ns")
    copies.sort(key=lambda r: int(r["Start_Timestamp"]))
    gpu_side = [r["Destination_Agent_Id"] if "HOST_TO_DEVICE" in r["Direction"] else r["Source_Agent_Id"] for r in copies]
    assert mem["device"].tolist() == [int(a.split()[-1]) for a in gpu_side]
    assert mem["end_ns"].tolist() == [int(r["End_Timestamp"]) for r in copies]
    (m,) = analyze(out)
    check_metrics(m, expected_overlap([], [(int(r["Start_Timestamp"]), int(r["End_Timestamp"])) for r in raw]))


def test_v3_csv_prefixes_are_ranks_and_rccl_api_gives_collective(tmp_path):
    """Two processes' files in one directory (prefix = process) and an RCCL kernel launched inside ncclAllReduce."""
    rccl = rows(V3_CSV / "rccl_trace.csv")
    allreduce = [r for r in rccl if r["Function"] == "ncclAllReduce"]
    header = (V3_CSV / "kernel_trace.csv").read_text().splitlines()[0]
    run = tmp_path / "run"
    run.mkdir()
    for rank in (0, 1):
        lines = [header]
        for i, call in enumerate(allreduce):
            corr = int(call["Correlation_Id"]) + 2  # after the call's own id and its nested GetAsyncError
            start = int(call["Start_Timestamp"]) + 50_000
            lines.append(f'"KERNEL_DISPATCH","Agent 2",1,3,{call["Thread_Id"]},{i},7,'
                         f'"ncclDevKernel_Generic_4(ncclDevKernelArgsStorage<4096ul>)",{corr},{start},{start + 20_000},'
                         '37888,0,92,0,112,256,1,1,1024,1,1')  # fmt: skip
        (run / f"rank{rank}_kernel_trace.csv").write_text("\n".join(lines) + "\n")
        shutil.copy(V3_CSV / "rccl_trace.csv", run / f"rank{rank}_rccl_api_trace.csv")
    out, _ = ingest(tmp_path, run)
    k = read_frame(out, "kernels")
    assert sorted(set(k["rank"])) == [0, 1]
    assert len(k) == 2 * len(allreduce) and k["kind"].eq("comm").all()
    assert set(k["collective"]) == {"all_reduce"}
    assert k["grid_x"].eq(4).all() and k["stream"].eq(3).all()


def test_v3_agent_info_maps_agents_to_devices(tmp_path):
    """agent_info.csv (rocprofv3's own columns) gives the devices and turns "Agent N" into the GPU index."""
    doc = json.loads(gzip.decompress(V3_JSON.read_bytes()))
    agents = doc["rocprofiler-sdk-tool"][0]["agents"]
    cols = ["Node_Id", "Logical_Node_Id", "Agent_Type", "Simd_Count", "Max_Waves_Per_Simd", "Lds_Size_In_Kb",
            "Wave_Front_Size", "Cu_Count", "Simd_Per_Cu", "Gfx_Target_Version", "Max_Waves_Per_Cu",
            "Workgroup_Max_Size", "Name", "Vendor_Name", "Product_Name", "Model_Name"]  # fmt: skip
    run = tmp_path / "run"
    run.mkdir()
    with open(run / "908_agent_info.csv", "w", newline="") as f:
        w = csv.writer(f, quoting=csv.QUOTE_NONNUMERIC)
        w.writerow(cols)
        for a in agents:
            w.writerow([a["node_id"], a["logical_node_id"], "GPU" if a["type"] == 2 else "CPU"]
                       + [a[c.lower()] for c in cols[3:]])  # fmt: skip
    raw = (V3_CSV / "kernel_trace.csv").read_text().replace('"Agent 4"', '"Agent 5"')
    (run / "908_kernel_trace.csv").write_text(raw)
    out, _ = ingest(tmp_path, run)
    k = read_frame(out, "kernels")
    gpu_nodes = sorted(a["logical_node_id"] for a in agents if a["type"] == 2)
    assert set(k["device"]) == {gpu_nodes.index(5)} == {3}
    dev = read_frame(out, "devices").sort_values("device")
    assert len(dev) == 8 and set(dev["arch"]) == {"gfx950"} and set(dev["num_sms"]) == {256}
    assert set(dev["lds_per_cu"]) == {160 * 1024} and set(dev["max_waves_per_simd"]) == {8}
    assert read_frame(out, "ranks")["pid"].tolist() == [908]


# --- rocprofv3 JSON ---------------------------------------------------------------------------


def test_v3_json_mi350x(tmp_path):
    tool = json.loads(gzip.decompress(V3_JSON.read_bytes()))["rocprofiler-sdk-tool"][0]
    names = {s["kernel_id"]: s["formatted_kernel_name"] for s in tool["kernel_symbols"]}
    disp = tool["buffer_records"]["kernel_dispatch"]
    comm = [(d["start_timestamp"], d["end_timestamp"]) for d in disp if COMM.search(names[d["dispatch_info"]["kernel_id"]])]
    compute = [(d["start_timestamp"], d["end_timestamp"]) for d in disp if not COMM.search(names[d["dispatch_info"]["kernel_id"]])]
    out, _ = ingest(tmp_path, V3_JSON)
    k = read_frame(out, "kernels")
    assert len(k) == len(disp) == 43915
    assert (k["kind"] == "comm").sum() == len(comm) == 1310
    assert k["start_ns"].min() == min(d["start_timestamp"] for d in disp)
    assert k["end_ns"].max() == max(d["end_timestamp"] for d in disp)
    assert k[k["kind"] == "comm"]["name"].str.startswith("ncclDevKernel_Generic_1(").all()
    by_corr = k.set_index("correlation")
    sample = disp[::997]
    for d in sample:
        row = by_corr.loc[d["correlation_id"]["internal"]]
        info = d["dispatch_info"]
        assert row["grid_x"] == math.ceil(info["grid_size"]["x"] / info["workgroup_size"]["x"])
        assert row["block_x"] == info["workgroup_size"]["x"]
        assert row["stream"] == d["stream_id"]["handle"]
        assert row["shared_mem_bytes"] == info["group_segment_size"]
    (m,) = analyze(out)
    check_metrics(m, expected_overlap(comm, compute))
    assert m["n_comm_kernels"] == 1310
    dev = read_frame(out, "devices")
    gpus = [a for a in tool["agents"] if a["type"] == 2]
    assert len(dev) == len(gpus) == 8
    assert set(dev["arch"]) == {"gfx950"} and set(dev["name"]) == {"AMD Instinct MI350X"}
    assert set(dev["num_sms"]) == {gpus[0]["cu_count"]} and set(dev["warp_size"]) == {64}
    assert set(dev["lds_per_cu"]) == {gpus[0]["lds_size_in_kb"] * 1024}
    assert read_frame(out, "runs")["device_name"].tolist() == ["AMD Instinct MI350X"]


# --- detection and bad input -------------------------------------------------------------------


def test_detection_by_content(tmp_path):
    from overlapviz.ingest.chrome import READERS as CHROME

    head = (V1_JSON / "results.json").read_bytes()[:65536]
    assert not any(r.sniff(V1_JSON / "results.json", head) for r in CHROME)
    renamed = tmp_path / "trace.json"
    shutil.copy(V1_JSON / "results.json", renamed)
    assert detect(renamed).name == "rocprof_v1_json"
    for src, name in [(V1_CSV / "results.csv", "rocprof_v1_csv"), (V3_CSV / "kernel_trace.csv", "rocprof_v3_csv"),
                      (V3_JSON, "rocprof_v3_json"), (V2 / "hip_vectoradd_golden_traces.txt", "rocprof_v2_cli")]:  # fmt: skip
        other = tmp_path / f"x_{name}.dat"
        shutil.copy(src, other)
        assert detect(other).name == name
    # text that merely mentions the formats' markers is not a trace, whatever its name
    notes = tmp_path / "notes.json"
    notes.write_bytes((DATA / "PROVENANCE.md").read_bytes() + b'\n{"rocprofiler-sdk-tool": [], "traceEvents", "BeginNs"}\n')
    assert detect(notes) is None


def assert_refused(tmp_path, source, *needles):
    out, result = ingest(tmp_path, source, name="refused", ok=False)
    assert result.exit_code != 0
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    for n in needles:
        assert n in lines[0], lines[0]
    assert not out.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".refused")]


def test_truncated_csv(tmp_path):
    text = (V1_CSV / "results.csv").read_bytes()
    bad = tmp_path / "cut"
    bad.mkdir()
    (bad / "results.csv").write_bytes(text[: len(text) // 2])
    assert_refused(tmp_path, bad / "results.csv", "results.csv", "truncated")
    v3 = tmp_path / "cut3"
    v3.mkdir()
    raw = (V3_CSV / "kernel_trace.csv").read_bytes()
    (v3 / "kernel_trace.csv").write_bytes(raw[: raw.rindex(b",1024,")])
    assert_refused(tmp_path, v3, "kernel_trace.csv", "truncated")


def test_truncated_json_gz(tmp_path):
    raw = V3_JSON.read_bytes()
    bad = tmp_path / "908_results.json.gz"
    bad.write_bytes(raw[: len(raw) // 3])
    assert_refused(tmp_path, bad, "908_results.json.gz")


def test_unknown_header(tmp_path):
    d = tmp_path / "hdr"
    d.mkdir()
    text = (V3_CSV / "kernel_trace.csv").read_text().replace('"Start_Timestamp"', '"Begin_Time"', 1)
    (d / "kernel_trace.csv").write_text(text)
    assert_refused(tmp_path, d / "kernel_trace.csv", "kernel_trace.csv", "unknown rocprofv3 kernel trace header", "Start_Timestamp")


def test_negative_duration(tmp_path):
    d = tmp_path / "neg"
    d.mkdir()
    table = list(csv.reader(open(V3_CSV / "kernel_trace.csv", newline="")))
    start, end = table[0].index("Start_Timestamp"), table[0].index("End_Timestamp")
    table[3][start], table[3][end] = table[3][end], table[3][start]  # line 4 ends before it starts
    with open(d / "kernel_trace.csv", "w", newline="") as f:
        csv.writer(f, quoting=csv.QUOTE_NONNUMERIC, lineterminator="\n").writerows(table)
    assert_refused(tmp_path, d, "kernel_trace.csv", "line 4", "negative duration")


def test_mixed_generations_in_one_directory(tmp_path):
    d = tmp_path / "mixed"
    d.mkdir()
    shutil.copy(V1_CSV / "results.csv", d)
    shutil.copy(V3_CSV / "kernel_trace.csv", d)
    assert_refused(tmp_path, d, str(d), "results.csv", "kernel_trace.csv", "own directory")


# --- small pure helpers ------------------------------------------------------------------------


def test_collective_and_arch_names():
    assert api_collective("ncclAllReduce") == "all_reduce"
    assert api_collective("ncclAllToAllv") == "all_to_all"
    assert api_collective("ncclReduceScatter") == "reduce_scatter"
    # one vocabulary for every format: the call names the direction, as Kineto's record_param_comms does
    assert api_collective("ncclSend") == "send" and api_collective("ncclRecv") == "recv"
    assert api_collective("ncclSendRecv") == "send_recv"
    assert api_collective("ncclCommGetAsyncError") is None and api_collective("ncclGroupEnd") is None
    assert gfx_arch(None, 90402) == "gfx942" and gfx_arch(None, 90010) == "gfx90a"
    assert gfx_arch(None, 90500) == "gfx950" and gfx_arch(None, 120001) == "gfx1201"
    assert gfx_arch("amdgcn-amd-amdhsa--gfx906:sramecc+:xnack-", None) == "gfx906"


# rocminfo as it prints an agent (layout of ROCm 3.x-6.x rocminfo; the values of a gfx900 card)
ROCMINFO = """ROCk module is loaded
=====================
HSA System Attributes
=====================
Runtime Version:         1.1
==========
HSA Agents
==========
*******
Agent 1
*******
  Name:                    AMD Ryzen 7 1700X Eight-Core Processor
  Device Type:             CPU
  Compute Unit:            16
  Pool Info:
    Pool 1
      Segment:                 GLOBAL; FLAGS: KERNARG, FINE GRAINED
      Size:                    16337780(0xf94c74) KB
*******
Agent 2
*******
  Name:                    gfx900
  Marketing Name:          Vega 10 XL/XT [Radeon RX Vega 56/64]
  Vendor Name:             AMD
  Device Type:             GPU
  Compute Unit:            64
  SIMDs per CU:            4
  Wavefront Size:          64(0x40)
  Workgroup Max Size:      1024(0x400)
  Max Waves Per CU:        40(0x28)
  Max Work-item Per CU:    2560(0xa00)
  Pool Info:
    Pool 1
      Segment:                 GLOBAL; FLAGS: COARSE GRAINED
      Size:                    8372224(0x7fc000) KB
    Pool 2
      Segment:                 GROUP
      Size:                    64(0x40) KB
  ISA Info:
    ISA 1
      Name:                    amdgcn-amd-amdhsa--gfx900
      Workgroup Max Size:      1024(0x400)
*** Done ***
"""


def test_v1_csv_with_sysinfo_gets_device_limits(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(V1_CSV / "results.csv", run)
    (run / "results.sysinfo.txt").write_text(ROCMINFO)
    out, _ = ingest(tmp_path, run)
    dev = read_frame(out, "devices")
    assert len(dev) == 1  # the CPU agent is not a device
    row = dev.iloc[0]
    assert (row["device"], row["arch"], row["name"], row["vendor"]) == (0, "gfx900", "Vega 10 XL/XT [Radeon RX Vega 56/64]", "amd")
    assert (row["num_sms"], row["simds_per_cu"], row["max_waves_per_simd"], row["warp_size"]) == (64, 4, 10, 64)
    assert row["shared_mem_per_block"] == 64 * 1024 and row["total_mem_bytes"] == 8372224 * 1024
    assert row["max_threads_per_block"] == 1024


def test_non_integer_timestamp_and_empty_trace(tmp_path):
    d = tmp_path / "text"
    d.mkdir()
    table = list(csv.reader(open(V1_CSV / "results.csv", newline="")))
    table[5][table[0].index("BeginNs")] = "7695x7350389689"
    with open(d / "results.csv", "w", newline="") as f:
        csv.writer(f, lineterminator="\n").writerows(table)
    assert_refused(tmp_path, d, "results.csv", "malformed CSV")
    e = tmp_path / "empty"
    e.mkdir()
    (e / "kernel_trace.csv").write_text((V3_CSV / "kernel_trace.csv").read_text().splitlines()[0] + "\n")
    assert_refused(tmp_path, e, "kernel_trace.csv", "no kernel dispatch or memory copy records")


def test_truncated_v1_json(tmp_path):
    raw = (V1_JSON / "results.json").read_bytes()
    d = tmp_path / "cutjson"
    d.mkdir()
    (d / "results.json").write_bytes(raw[: len(raw) // 2])
    assert_refused(tmp_path, d / "results.json", "results.json", "not valid JSON")


def test_default_rules_make_rccl_kernels_comm():
    from overlapviz.domain.rules import default_rules

    names = ["ncclDevKernel_Generic_1(ncclDevKernelArgsStorage<4096ul>)", "rcclGenericKernel<1, false>(ncclDevComm*)",
             "mscclKernel_Sum_uint8_t_LL128_false(ncclDevComm*, mscclAlgo*, mscclWork*)",
             "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)",
             "__amd_rocclr_copyBuffer", "__amd_rocclr_fillBufferAligned", "Cijk_Alik_Bljk_HSS_BH_MT16x128x32"]  # fmt: skip
    kinds = default_rules().classify(names, ["kernel"] * len(names)).to_pylist()
    assert kinds == ["comm"] * 4 + ["compute"] * 3


def test_v3_csv_launch_from_hip_api(tmp_path):
    """A kernel's launch_ns is the begin of the HIP launch call with its Correlation_Id."""
    raw = rows(V3_CSV / "kernel_trace.csv")
    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(V3_CSV / "kernel_trace.csv", run / "p_kernel_trace.csv")
    lines = ['"Domain","Function","Process_Id","Thread_Id","Correlation_Id","Start_Timestamp","End_Timestamp"']
    for r in raw:
        begin = int(r["Start_Timestamp"]) - 7_000
        lines.append(f'"HIP_RUNTIME_API_EXT","hipLaunchKernel",1,{r["Thread_Id"]},{r["Correlation_Id"]},{begin},{begin + 3_000}')
    lines.append('"HIP_RUNTIME_API_EXT","hipMalloc",1,1,999,1,2')
    (run / "p_hip_api_trace.csv").write_text("\n".join(lines) + "\n")
    out, _ = ingest(tmp_path, run)
    k = read_frame(out, "kernels").sort_values("correlation")
    raw.sort(key=lambda r: int(r["Correlation_Id"]))
    assert k["launch_ns"].tolist() == [int(r["Start_Timestamp"]) - 7_000 for r in raw]


def test_v3_json_host_records(tmp_path):
    """hip_api gives launch_ns, rccl_api the collective, memory_copy the copies, in rocprofv3's JSON layout.

    Built from the MI350X file: its real agents, symbols, strings and a slice of its
    dispatches, plus host records in the same schema (that file was recorded with
    kernel tracing only).
    """
    doc = json.loads(gzip.decompress(V3_JSON.read_bytes()))
    tool = doc["rocprofiler-sdk-tool"][0]
    names = {s["kernel_id"]: s["formatted_kernel_name"] for s in tool["kernel_symbols"]}
    disp = tool["buffer_records"]["kernel_dispatch"]
    comm = [d for d in disp if COMM.search(names[d["dispatch_info"]["kernel_id"]])][:5]
    compute = [d for d in disp if not COMM.search(names[d["dispatch_info"]["kernel_id"]])][:15]
    ops = {k["kind"]: (i, k["operations"]) for i, k in enumerate(tool["strings"]["buffer_records"])}
    hip_kind, hip_ops = ops["HIP_RUNTIME_API"]
    rccl_kind, rccl_ops = ops["RCCL_API"]
    copy_kind, copy_ops = ops["MEMORY_COPY"]

    def record(kind, op, corr, thread, start, end, **extra):
        return {"size": 0, "kind": kind, "operation": op, "thread_id": thread,
                "correlation_id": {"internal": corr, "external": 0},
                "start_timestamp": start, "end_timestamp": end, **extra}  # fmt: skip

    hip = [record(hip_kind, hip_ops.index("hipLaunchKernel"), d["correlation_id"]["internal"], d["thread_id"],
                  d["start_timestamp"] - 9_000, d["start_timestamp"] - 4_000) for d in compute + comm]  # fmt: skip
    rccl = [record(rccl_kind, rccl_ops.index("ncclAllReduce"), d["correlation_id"]["internal"] - 1, d["thread_id"],
                   d["start_timestamp"] - 20_000, d["start_timestamp"] - 1_000) for d in comm]  # fmt: skip
    gpu0 = next(a for a in tool["agents"] if a["type"] == 2 and a["gpu_index"] == 0)["id"]["handle"]
    cpu = next(a for a in tool["agents"] if a["type"] == 1)["id"]["handle"]
    t0 = compute[0]["start_timestamp"]
    copies = [record(copy_kind, copy_ops.index("MEMORY_COPY_HOST_TO_DEVICE"), 10**9 + i, 908, t0 - 50_000 + 10_000 * i,
                     t0 - 45_000 + 10_000 * i, src_agent_id={"handle": cpu}, dst_agent_id={"handle": gpu0}, bytes=4096 << i)
              for i in range(2)]  # fmt: skip
    tool["buffer_records"] = {"kernel_dispatch": compute + comm, "hip_api": hip, "rccl_api": rccl, "memory_copy": copies}
    src = tmp_path / "rank3_results.json"
    src.write_text(json.dumps(doc))
    out, _ = ingest(tmp_path, src)
    k = read_frame(out, "kernels")
    assert set(k["rank"]) == {3}
    kern = k[k["category"] == "kernel"].set_index("correlation")
    for d in compute + comm:
        assert kern.loc[d["correlation_id"]["internal"], "launch_ns"] == d["start_timestamp"] - 9_000
    assert kern[kern["kind"] == "comm"]["collective"].tolist() == ["all_reduce"] * 5
    assert kern[kern["kind"] == "compute"]["collective"].isna().all()
    mem = k[k["kind"] == "memory"].sort_values("start_ns")
    assert mem["bytes"].tolist() == [4096, 8192] and mem["device"].tolist() == [0, 0]
    assert mem["name"].tolist() == ["MEMORY_COPY_HOST_TO_DEVICE"] * 2


def test_single_process_multi_gpu_collective_is_one_rank_per_gpu(tmp_path):
    """rccl-tests style: one process runs RCCL on two GPUs; overlap must not mix the GPUs."""
    header = (V3_CSV / "kernel_trace.csv").read_text().splitlines()[0]
    lines = [header]
    # GPU "Agent 4": compute 0..100 us, comm 150..250 us; GPU "Agent 5": comm 0..100 us (overlaps GPU 4's compute)
    spans = [("Agent 4", "gemm_kernel", 0, 100), ("Agent 4", "ncclDevKernel_Generic", 150, 250),
             ("Agent 5", "ncclDevKernel_Generic", 0, 100)]  # fmt: skip
    for i, (agent, name, a, b) in enumerate(spans):
        lines.append(f'"KERNEL_DISPATCH","{agent}",1,1,7,{i},1,"{name}",{i + 1},{a * 1000},{b * 1000},0,0,8,0,16,256,1,1,256,1,1')
    run = tmp_path / "rccltests"
    run.mkdir()
    (run / "kernel_trace.csv").write_text("\n".join(lines) + "\n")
    out, _ = ingest(tmp_path, run)
    k = read_frame(out, "kernels")
    assert sorted(set(zip(k["rank"], k["device"]))) == [(4, 4), (5, 5)]
    m = {r["rank"]: r for r in analyze(out)}
    assert m[4]["overlap_us"] == 0 and m[4]["comm_us"] == 100 and m[4]["compute_us"] == 100
    assert m[5]["comm_us"] == 100 and m[5]["compute_us"] == 0


def test_a_reader_s_surprise_says_where_and_keeps_its_traceback_under_debug(monkeypatch):
    """A KeyError inside a reader is one line naming the file and where it happened; with OVERLAPVIZ_DEBUG=1 it keeps
    its traceback (test_cli_tables once failed on "not a well-formed rocprof_v1_json file (unexpected content:
    KeyError: 30)", not reproduced since, with nothing to say where)."""
    from overlapviz.ingest.rocprof import _guarded

    class Reader:
        name = "rocprof_v1_json"

        @_guarded
        def read(self, path):
            return {}[30]

    monkeypatch.delenv("OVERLAPVIZ_DEBUG", raising=False)
    # (where: the innermost frame in overlapviz's code, a reader's own line; here the guard's, the reader being the test's)
    with pytest.raises(ValueError, match=r"x\.json: not a well-formed rocprof_v1_json file \(unexpected content: KeyError: 30 at "
                                         r"ingest/rocprof\.py:\d+ in guarded\)"):  # fmt: skip
        Reader().read(Path("x.json"))
    monkeypatch.setenv("OVERLAPVIZ_DEBUG", "1")
    with pytest.raises(KeyError):
        Reader().read(Path("x.json"))


def test_columns_reach_pyarrow_as_arrays_never_as_a_series(monkeypatch):
    """The rocprof readers' columns are handed to pyarrow as arrays: a pyarrow that does not take a Series for one reads
    it as a sequence, ``values[i]``, which a Series answers by label — "KeyError: 30" for a rocprof v1 trace's kernels
    (rows 30... of its events), in test_cli_tables' worker processes now and then."""
    import types

    import pyarrow as pa

    from overlapviz.ingest import rocprof_common

    def arrays_only(values, *args, **kwargs):
        assert not isinstance(values, pd.Series), "a Series handed to pyarrow"
        return pa.array(values, *args, **kwargs)

    # what the module sees of pyarrow: arrays taken, a Series refused, Array.from_pandas (which takes one) gone
    monkeypatch.setattr(rocprof_common, "pa", types.SimpleNamespace(array=arrays_only, Array=types.SimpleNamespace()))
    index = [30, 31, 33]
    cases = [(pd.Series([1, None, 3], index=index, dtype="Int64"), [1, None, 3]),
             (pd.Series([1.5, None, 2.0], index=index), [1.5, None, 2.0]),
             (pd.Series(["a", None, "c"], index=index, dtype="string"), ["a", None, "c"]),
             (pd.Series([True, None, False], index=index, dtype="boolean"), [True, None, False]),
             (pd.Series([7, 8, 9], index=index, dtype=pd.ArrowDtype(pa.int64())), [7, 8, 9])]  # fmt: skip
    for series, want in cases:
        assert rocprof_common._to_arrow(series).to_pylist() == want, series.dtype


V2_CSV = DATA / "v2_csv_mi300" / "results_430889.csv"


def test_v2_file_plugin_csv(tmp_path):
    """rocprofv2's file-plugin ``results_<pid>.csv`` (MI300): every dispatch with exact ns times,
    the `` (.kd)`` suffix gone from names, grids in blocks, correlation id 0 = none."""
    want = rows(V2_CSV)
    assert detect(V2_CSV).name == "rocprof_v2_csv"
    out, _ = ingest(tmp_path, V2_CSV.parent)
    k = read_frame(out, "kernels").sort_values("start_ns", kind="stable")
    want = sorted(want, key=lambda r: int(r["Start_Timestamp"]))
    assert len(k) == len(want) == 187
    assert k["start_ns"].tolist() == [int(r["Start_Timestamp"]) for r in want]
    assert k["end_ns"].tolist() == [int(r["End_Timestamp"]) for r in want]
    assert k["name"].tolist() == [r["Kernel_Name"].removesuffix(" (.kd)") for r in want]
    assert all(r["Kernel_Name"].endswith(" (.kd)") for r in want)
    assert k["grid_x"].tolist() == [math.ceil(int(r["Grid_Size"]) / int(r["Workgroup_Size"])) for r in want]
    assert k["shared_mem_bytes"].tolist() == [int(r["LDS_Per_Workgroup"]) for r in want]
    assert k["regs_per_thread"].tolist() == [int(r["Arch_VGPR"]) for r in want]
    assert [None if pd.isna(c) else c for c in k["correlation"]] == [int(r["Correlation_ID"]) or None for r in want]
    assert set(k["device"]) == {2} and set(k["stream"]) == {1} and set(k["source_format"]) == {"rocprof_v2_csv"}
    assert read_frame(out, "devices")["warp_size"].tolist() == [64]


@pytest.mark.parametrize("named", ["directory", "file"])
def test_stats_only_refused_with_reason(tmp_path, named):
    """A rocprof ``--stats`` summary alone has no timeline: refused saying how to get one."""
    d = tmp_path / "stats"
    d.mkdir()
    shutil.copy(V1_CSV / "results.stats.csv", d)
    src = d if named == "directory" else d / "results.stats.csv"
    _, result = ingest(tmp_path, src, ok=False)
    assert result.exit_code != 0
    assert "a summary without a timeline: rerun with --kernel-trace" in result.output
    assert not (tmp_path / "ds").exists()
