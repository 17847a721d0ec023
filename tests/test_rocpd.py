"""rocprofv3's rocpd SQLite output through ``overlapviz.ingest.rocpd``, on databases built by ``tests/_rocpd_db.py``
(rocprofiler-sdk 1.0.0's DDL, verbatim, filled as ``generateRocpd.cpp`` fills it: its docstring says how).

Every expectation is the test's own: the rows it inserted, or SQL over the database.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pyarrow.compute as pc
import pytest

from overlapviz.ingest.nsys import NsysReader
from overlapviz.ingest.rocpd import RocpdReader, handle_value, read_rocpd
from overlapviz.ingest.sqlite_common import READER_SYNC_SCHEMA

from _rocpd_db import EV, GUID_A, T0, make_db, mi350x_agents  # the rocpd schema as ROCm publishes it, filled like rocprofv3

NSYS_MOCK = Path(__file__).parent / "data" / "nsys" / "mock.sqlite"


@pytest.fixture
def rocpd_db(tmp_path) -> Path:
    return make_db(tmp_path / "4242_results.db")


def q(path: Path, sql: str) -> list[tuple]:
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return db.execute(sql).fetchall()
    finally:
        db.close()


# --- the database built from the DDL ---------------------------------------------------------


def test_the_ddl_builds_what_rocprofv3_writes(rocpd_db):
    names = {r[0] for r in q(rocpd_db, "SELECT name FROM sqlite_master")}
    uuid = "_" + GUID_A.replace("-", "_")
    assert f"rocpd_kernel_dispatch{uuid}" in names and "rocpd_kernel_dispatch" in names and "kernels" in names
    assert q(rocpd_db, "SELECT value FROM rocpd_metadata WHERE tag = 'schema_version'") == [("3",)]
    # the kernels view INNER JOINs the region name: it loses dispatch 3
    assert [r[0] for r in q(rocpd_db, "SELECT dispatch_id FROM kernels ORDER BY dispatch_id")] == [1, 2]


def test_sniffed_by_content(rocpd_db, tmp_path):
    head = rocpd_db.read_bytes()[:65536]
    assert RocpdReader().sniff(rocpd_db, head)
    assert not NsysReader().sniff(rocpd_db, head)
    assert not RocpdReader().sniff(NSYS_MOCK, NSYS_MOCK.read_bytes()[:65536])
    # the older rocmProfileData "RPD" format also names its tables rocpd_*
    rpd = tmp_path / "trace.rpd"
    db = sqlite3.connect(rpd)
    db.executescript("CREATE TABLE rocpd_string (id INTEGER PRIMARY KEY, string TEXT); "
                     "CREATE TABLE rocpd_op (id INTEGER PRIMARY KEY, gpuId INTEGER, start INTEGER, end INTEGER); "
                     "CREATE TABLE rocpd_api (id INTEGER PRIMARY KEY, pid INTEGER, tid INTEGER, start INTEGER, end INTEGER);")  # fmt: skip
    db.close()
    assert not RocpdReader().sniff(rpd, rpd.read_bytes())
    text = tmp_path / "x.db"
    text.write_text("not sqlite")
    assert not RocpdReader().sniff(text, text.read_bytes())


def test_kernels_copies_and_launches(rocpd_db):
    (t,) = read_rocpd(rocpd_db)
    k = t.kernels.sort_by("start_ns")
    rows = k.to_pylist()
    assert [r["category"] for r in rows] == ["gpu_memcpy", "kernel", "kernel", "kernel"]
    copy, gemm, nccl, gemm2 = rows
    assert gemm["name"] == "gemm_tile_64x64(float const*, float*)"
    assert nccl["name"] == "ncclDevKernel_Generic(ncclDevKernelArgsStorage<4096ul>)"
    # exact ns, grid in blocks (ceil(work-items / work-group)), registers from the symbol
    assert (gemm["start_ns"], gemm["end_ns"]) == (T0 + 2_000, T0 + 5_000)
    assert (gemm["grid_x"], gemm["grid_y"], gemm["grid_z"]) == (32, 64, 1)
    assert (gemm["block_x"], gemm["block_y"], gemm["block_z"]) == (256, 1, 1)
    assert (gemm["regs_per_thread"], gemm["accum_vgprs"], gemm["sgprs"], gemm["shared_mem_bytes"]) == (128, 64, 96, 20_480)
    assert (gemm2["grid_x"], gemm2["grid_y"], gemm2["block_y"]) == (10, 2, 4)
    assert (nccl["grid_x"], nccl["regs_per_thread"], nccl["sgprs"]) == (8, 64, 32)
    # devices: the agents' GPU index; stream: rocprofiler's stream id (the trace has non-zero ones)
    assert (gemm["device"], nccl["device"], gemm2["device"], copy["device"]) == (0, 0, 1, 0)
    assert (gemm["stream"], nccl["stream"], copy["stream"]) == (1, 2, 1)
    assert {r["wave_size"] for r in rows if r["category"] == "kernel"} == {64}
    # launch: the API region whose id is the event's stack_id; dispatch 3 has none
    assert (gemm["launch_ns"], gemm["launch_tid"], gemm["correlation"]) == (T0 + 1_000, 4242, 10)
    assert (nccl["launch_ns"], nccl["launch_tid"], nccl["correlation"]) == (T0 + 1_330, 4243, 14)
    assert gemm2["launch_ns"] is None and gemm2["launch_tid"] == 4242  # the dispatching thread
    # a zero-length copy is an activity like any other
    assert (copy["start_ns"], copy["end_ns"], copy["bytes"], copy["launch_ns"]) == (T0 + 960, T0 + 960, 4096, T0 + 900)
    assert copy["name"] == "MEMORY_COPY_HOST_TO_DEVICE"
    assert set(k.column("source_format").to_pylist()) == {"rocpd"}


def test_view_rows_agree_with_the_reader(rocpd_db):
    (t,) = read_rocpd(rocpd_db)
    by_start = {r["start_ns"]: r for r in t.kernels.to_pylist()}
    for start, end, name, gx, gy, wx, wy, lds, vgpr, sgpr, stack in q(rocpd_db, """
            SELECT start, "end", name, grid_x, grid_y, workgroup_x, workgroup_y, lds_size, vgpr_count, sgpr_count,
                   stack_id FROM kernels"""):  # fmt: skip
        r = by_start[start]
        assert (r["end_ns"], r["name"], r["block_x"], r["block_y"], r["shared_mem_bytes"], r["regs_per_thread"],
                r["sgprs"], r["correlation"]) == (end, name, wx, wy, lds, vgpr, sgpr, stack)  # fmt: skip
        assert (r["grid_x"], r["grid_y"]) == (-(-gx // wx), -(-gy // wy))


def test_collective_from_the_enclosing_rccl_call(rocpd_db):
    (t,) = read_rocpd(rocpd_db)
    k = t.kernels
    got = dict(zip(k.column("correlation").to_pylist(), k.column("collective").to_pylist()))
    assert got[14] == "all_reduce" and got[10] is None


def test_syncs_from_hip_calls(rocpd_db):
    (t,) = read_rocpd(rocpd_db)
    s = t.syncs
    assert s.schema.names == READER_SYNC_SCHEMA.names
    rows = {r["kind"]: r for r in s.to_pylist()}
    assert sorted(rows) == ["event_record", "stream_sync", "stream_wait_event"]
    assert set(s.column("source").to_pylist()) == {"runtime"}
    rec, wait, sync = rows["event_record"], rows["stream_wait_event"], rows["stream_sync"]
    # the handles in the call's arguments become the stream ids the kernels carry
    assert (rec["stream"], rec["event_id"], rec["correlation"], rec["tid"], rec["device"]) == (1, int(EV, 16), 11, 4242, 0)
    assert (wait["stream"], wait["event_id"], wait["tid"]) == (2, int(EV, 16), 4243)
    assert (wait["wait_on_stream"], wait["wait_on_record_correlation"]) == (1, 11)
    assert (wait["start_ns"], wait["end_ns"], wait["name"], wait["pid"]) == (T0 + 1_310, T0 + 1_320, "hipStreamWaitEvent", 4242)
    assert (sync["stream"], sync["start_ns"], sync["wait_on_stream"]) == (2, T0 + 9_100, None)


def test_devices_steps_rank_and_info(rocpd_db):
    (t,) = read_rocpd(rocpd_db)
    agents = mi350x_agents()[:2]
    assert [d["device"] for d in t.devices.to_pylist()] == [a["gpu_index"] for a in agents]
    d = t.devices.to_pylist()[0]
    a = agents[0]
    assert (d["vendor"], d["arch"], d["name"], d["num_sms"], d["warp_size"], d["simds_per_cu"]) == (
        "amd", a["name"], a["product_name"], a["cu_count"], a["wave_front_size"], a["simd_per_cu"])  # fmt: skip
    assert d["lds_per_cu"] == a["lds_size_in_kb"] * 1024
    assert t.steps.to_pylist() == [{"step": 5, "name": "ProfilerStep#5", "source": "profiler_step",
                                    "start_ns": T0 + 800, "end_ns": T0 + 9_500}]  # fmt: skip
    assert t.rank == 1  # the process's own RANK
    assert (t.info["world_size"], t.info["pid"], t.info["host"], t.info["source_format"]) == (2, 4242, "mi350-node07", "rocpd")


def test_merged_database_one_trace_per_process(tmp_path):
    p = make_db(tmp_path / "merged.db", envs=({"RANK": "1"}, {"RANK": "0"}), views=False)
    traces = read_rocpd(p)
    assert [(t.info["pid"], t.rank) for t in traces] == [(4242, 1), (5242, 0)]
    for i, t in enumerate(traces):
        starts = t.kernels.column("start_ns").to_pylist()
        assert len(starts) == 4 and min(starts) == T0 + 100_000 * i + 960  # its own rows only
        assert t.syncs.num_rows == 3 and t.devices.num_rows == 2
    # without distinct ranks in the environments, the driver numbers them
    p2 = make_db(tmp_path / "merged2.db", envs=({}, {"RANK": "0"}), views=False)
    assert [t.rank for t in read_rocpd(p2)] == [None, None]


# --- hostile inputs ------------------------------------------------------------------------


def _one_line_error(path: Path) -> str:
    with pytest.raises(ValueError) as exc:
        read_rocpd(path)
    msg = str(exc.value)
    assert str(path) in msg and len(msg.splitlines()) == 1, msg
    return msg


def test_truncated_database(rocpd_db, tmp_path):
    data = rocpd_db.read_bytes()
    p = tmp_path / "cut.db"
    p.write_bytes(data[: len(data) // 2])
    assert "truncated" in _one_line_error(p)


def test_not_a_rocpd_database(tmp_path):
    p = tmp_path / "other.db"
    db = sqlite3.connect(p)
    db.execute("CREATE TABLE rocpd_op (id INTEGER)")
    db.close()
    assert "not a rocpd database" in _one_line_error(p)
    txt = tmp_path / "results.db"
    txt.write_text("x")
    assert "not an SQLite database" in _one_line_error(txt)


def test_kernel_without_symbol(rocpd_db):
    db = sqlite3.connect(rocpd_db)
    db.execute(f'DELETE FROM "rocpd_info_kernel_symbol_{GUID_A.replace("-", "_")}" WHERE id = 2')
    db.commit()
    db.close()
    assert "kernel_id 2" in _one_line_error(rocpd_db)


def test_negative_duration(rocpd_db):
    db = sqlite3.connect(rocpd_db)
    db.execute(f'UPDATE "rocpd_kernel_dispatch_{GUID_A.replace("-", "_")}" SET "end" = start - 5 WHERE id = 2')
    db.commit()
    db.close()
    assert "negative duration" in _one_line_error(rocpd_db)


def test_handle_values():
    assert handle_value("0x55d5c0a1e2f0") == 0x55D5C0A1E2F0
    assert handle_value("nullptr") == 0 and handle_value("0") == 0 and handle_value("(nil)") == 0
    assert handle_value("12") == 12 and handle_value("stream?") is None and handle_value(None) is None


def test_ingest_end_to_end(rocpd_db, tmp_path, monkeypatch):
    import importlib

    from overlapviz.ingest.nsys import READERS as NSYS
    from overlapviz.ingest.rocpd import READERS as ROCPD

    registry = importlib.import_module("overlapviz.ingest.registry")
    assert [r.name for r in registry.readers()][:2] == [NSYS[0].name, ROCPD[0].name]  # registered, sniffed first
    from overlapviz.ingest import ingest
    from overlapviz.dataset.schema import read_kernels, read_table

    ds = ingest([rocpd_db], tmp_path / "ds", progress=False)
    k = read_kernels(ds)
    assert k.num_rows == 4 and set(k.column("rank").to_pylist()) == {1}
    comm = k.filter(pc.equal(k.column("kind"), "comm"))
    assert comm.column("collective").to_pylist() == ["all_reduce"]
    assert comm.column("step").to_pylist() == [5]  # launched inside ProfilerStep#5
    assert read_table(ds, "devices").num_rows == 2


REAL_DB = Path(__file__).parent / "data" / "rocpd" / "mi300x_rocm711_ck_bmm" / "28_results.db"


def test_real_rocm711_database(tmp_path):
    """A real rocprofv3 database (ROCm 7.1.1, MI300X): ids from 0, 8 GPUs listed and one used.
    Every dispatch is read with its exact times, on the GPU that ran it (agent type_index), with
    the start of the hipLaunchKernel/hipMemset region its event names as launch."""
    from overlapviz.dataset.schema import read_frame
    from overlapviz.testing import ingest_cli

    db = sqlite3.connect(f"file:{REAL_DB}?mode=ro", uri=True)
    want = db.execute(
        "SELECT k.id, k.start, k.\"end\", a.type_index, r.start FROM rocpd_kernel_dispatch k "
        "JOIN rocpd_info_agent a ON a.id = k.agent_id JOIN rocpd_event e ON e.id = k.event_id "
        "JOIN rocpd_region r ON r.id = e.stack_id "
        "ORDER BY k.start").fetchall()  # fmt: skip
    gpus = db.execute("SELECT count(*) FROM rocpd_info_agent WHERE type = 'GPU'").fetchone()[0]
    assert db.execute("SELECT min(id) FROM rocpd_info_agent").fetchone()[0] == 0  # ids from 0
    out, _ = ingest_cli(tmp_path, REAL_DB.parent)
    k = read_frame(out, "kernels").sort_values("start_ns", kind="stable")
    assert len(k) == len(want) == 151 and gpus == 8
    assert k["start_ns"].tolist() == [w[1] for w in want]
    assert k["end_ns"].tolist() == [w[2] for w in want]
    assert k["device"].tolist() == [w[3] for w in want] == [0] * 151
    assert k["launch_ns"].tolist() == [w[4] for w in want]
    runs = read_frame(out, "runs")
    assert runs["device_name"].tolist() == ["AMD Instinct MI300X"]
    dev = read_frame(out, "devices").set_index("device")
    assert dev.index.tolist() == [0]  # the GPU the process used, not the 8 the node lists
    assert dev.loc[0, "num_sms"] == 304 and dev.loc[0, "arch"] == "gfx942"
