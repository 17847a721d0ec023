"""Nsight Systems SQLite exports through ``overlapviz.ingest.nsys``, checked against the files.

Every expectation is computed here with ``sqlite3`` queries of the test's own (never through
overlapviz) from the real exports in tests/data/nsys (schemas 2.9.1, 3.24.14, 3.25.0; see
its PROVENANCE.md) and, where the folder exists, the larger reference exports in
``$OVERLAPVIZ_REFERENCE_TRACES/nsys`` (3.13.2 and the full 3.25.0 pair).

Edge cases: several processes in one export (one rank each), correlation ids that repeat
across processes, two runtime rows for one launch (2.9.1), kernels whose launch call fell
outside the capture window, zero-length activities, negative durations, corrupt, truncated
and foreign SQLite files, a read-only file that must stay byte-identical.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import sqlite3
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from click.testing import CliRunner

from overlapviz.ingest.nsys import NsysReader, read_nsys
from overlapviz.ingest.sqlite_common import READER_SYNC_SCHEMA, sync_kind

DATA = Path(__file__).parent / "data" / "nsys"
MOCK = DATA / "mock.sqlite"
SAXPY = DATA / "saxpy-mpi-cuda_nsys_perlmutter0.sqlite"
MFU = DATA / "mfu_2gpu_before_window40ms.sqlite"
REFERENCE = Path(os.environ.get("OVERLAPVIZ_REFERENCE_TRACES", "/work/shared/reference_traces")) / "nsys"
SHARED = {
    "cloverleaf": REFERENCE / "pipit_cloverleaf" / "perlmutter-cloverleaf-cuda.sqlite",
    "mfu_before": REFERENCE / "nsysai_mfu_2gpu" / "mfu_2gpu_before.sqlite",
    "mfu_after": REFERENCE / "nsysai_mfu_2gpu" / "mfu_2gpu_after.sqlite",
}


def _exports():
    out = [pytest.param(p, id=p.name) for p in (MOCK, SAXPY, MFU)]
    for name, p in SHARED.items():
        out.append(pytest.param(p, id=name, marks=pytest.mark.skipif(not p.exists(), reason=f"{p} not present")))
    return out


EXPORTS = _exports()


def q(path: Path, sql: str, *params) -> list[tuple]:
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    db.text_factory = lambda b: b.decode("utf-8", "replace")
    try:
        return db.execute(sql, params).fetchall()
    finally:
        db.close()


def has_table(path: Path, name: str) -> bool:
    return bool(q(path, "SELECT 1 FROM sqlite_master WHERE type='table' AND name=?", name))


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def by_pid(traces) -> dict:
    return {t.info["pid"]: t for t in traces}


def activities_sql(path: Path) -> dict[int, list[tuple]]:
    """(start, end, device, stream, correlation, category) per pid, sorted."""
    parts = []
    for table, cat in (("CUPTI_ACTIVITY_KIND_KERNEL", "kernel"), ("CUPTI_ACTIVITY_KIND_MEMCPY", "gpu_memcpy"),
                       ("CUPTI_ACTIVITY_KIND_MEMSET", "gpu_memset")):  # fmt: skip
        if has_table(path, table):
            parts.append(f"SELECT (globalPid >> 24) & 16777215, start, \"end\", deviceId, streamId, correlationId, '{cat}' FROM {table}")
    out: dict[int, list] = {}
    for pid, *row in q(path, " UNION ALL ".join(parts)):
        out.setdefault(pid, []).append(tuple(row))
    return {k: sorted(v) for k, v in out.items()}


def rows(table: pa.Table, *cols) -> list[tuple]:
    return sorted(zip(*(table.column(c).to_pylist() for c in cols)))


# --- every export: activities, launches, syncs against SQL ------------------------------


@pytest.mark.parametrize("path", EXPORTS)
def test_activities_match_sql_exactly(path):
    traces = read_nsys(path)
    expected = activities_sql(path)
    assert sorted(by_pid(traces)) == sorted(expected)  # one rank per process with GPU work
    for pid, t in by_pid(traces).items():
        got = rows(t.kernels, "start_ns", "end_ns", "device", "stream", "correlation", "category")
        assert got == expected[pid]  # int64 ns, exact
        assert t.kernels.schema.field("start_ns").type == pa.int64()
        assert set(t.kernels.column("source_format").to_pylist()) == {"nsys_sqlite"}
        assert t.info["source_format"] == "nsys_sqlite" and t.info["source_path"] == str(path)


@pytest.mark.parametrize("path", EXPORTS)
def test_kernel_shapes_names_and_registers_match_sql(path):
    expected = {}
    for pid, start, corr, dev, name, gx, gy, gz, bx, by, bz, regs, smem in q(path, """
            SELECT (k.globalPid >> 24) & 16777215, k.start, k.correlationId, k.deviceId, s.value,
                   k.gridX, k.gridY, k.gridZ, k.blockX, k.blockY, k.blockZ, k.registersPerThread,
                   k.staticSharedMemory + k.dynamicSharedMemory
            FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.demangledName"""):  # fmt: skip
        expected[(pid, start, corr, dev)] = (name, gx, gy, gz, bx, by, bz, regs, smem)
    assert expected
    got = {}
    for t in read_nsys(path):
        k = t.kernels.filter(pc.equal(t.kernels.column("category"), "kernel"))
        for r in k.to_pylist():
            got[(t.info["pid"], r["start_ns"], r["correlation"], r["device"])] = (
                r["name"], r["grid_x"], r["grid_y"], r["grid_z"], r["block_x"], r["block_y"], r["block_z"],
                r["regs_per_thread"], r["shared_mem_bytes"])  # fmt: skip
    assert got == expected


@pytest.mark.parametrize("path", EXPORTS)
def test_launch_is_the_earliest_runtime_call_of_the_same_process_and_correlation(path):
    # correlation ids are per process: the join must not cross processes
    launches = {}
    for table in ("CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_DRIVER"):
        if not has_table(path, table):
            continue
        for proc, corr, start, gtid in q(path, f"SELECT globalTid >> 24, correlationId, start, globalTid FROM {table} WHERE correlationId IS NOT NULL"):
            key = (proc & 0xFFFFFF, corr)
            if key not in launches or start < launches[key][0]:
                launches[key] = (start, gtid & 0xFFFFFF)
    n_checked = n_null = 0
    for t in read_nsys(path):
        pid = t.info["pid"]
        for corr, launch, tid in zip(*(t.kernels.column(c).to_pylist() for c in ("correlation", "launch_ns", "launch_tid"))):
            exp = launches.get((pid, corr)) if corr and corr > 0 else None
            assert (launch, tid) == (exp if exp else (None, None))
            n_checked += 1
            n_null += launch is None
    assert n_checked and n_null < n_checked


def test_two_runtime_rows_per_launch_take_the_outer_call():
    # 2.9.1 writes cudaLaunchKernel and cudaLaunchKernel_v7000 for one launch (same correlation)
    dup = q(SAXPY, """SELECT r.correlationId, MIN(r.start), MAX(r.start), COUNT(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME r
                      JOIN CUPTI_ACTIVITY_KIND_KERNEL k ON k.correlationId = r.correlationId GROUP BY r.correlationId""")
    assert dup and all(n == 2 and lo < hi for _, lo, hi, n in dup)
    (t,) = read_nsys(SAXPY)
    launch = dict(zip(t.kernels.column("correlation").to_pylist(), t.kernels.column("launch_ns").to_pylist()))
    assert all(launch[c] == lo for c, lo, _, _ in dup)


@pytest.mark.parametrize("path", EXPORTS)
def test_sync_records_become_cuda_sync_rows(path):
    traces = read_nsys(path)
    for t in traces:
        s = t.syncs
        assert s.schema.names == READER_SYNC_SCHEMA.names
        assert set(s.column("source").to_pylist()) <= {"runtime", "cuda_sync"}
        assert set(s.column("kind").drop_null().to_pylist()) <= {"event_record", "stream_wait_event", "event_sync",
                                                                  "stream_sync", "context_sync", "event_query"}  # fmt: skip
    if not has_table(path, "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION"):
        return
    expected: dict[int, list] = {}
    for pid, start, end, stream, corr, name in q(path, """
            SELECT (s.globalPid >> 24) & 16777215, s.start, s."end", s.streamId, s.correlationId,
                   (SELECT v.value FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds v ON v.id = r.nameId
                    WHERE r.correlationId = s.correlationId AND (r.globalTid >> 24) = (s.globalPid >> 24) LIMIT 1)
            FROM CUPTI_ACTIVITY_KIND_SYNCHRONIZATION s"""):  # fmt: skip
        expected.setdefault(pid, []).append((start, end, None if stream == 0xFFFFFFFF else stream, corr, name))
    for t in traces:
        s = t.syncs.filter(pc.equal(t.syncs.column("source"), "cuda_sync"))
        assert rows(s, "start_ns", "end_ns", "stream", "correlation", "name") == sorted(expected.get(t.info["pid"], []))
        # the kind is the API's (nsys versions number syncType differently); a record whose
        # call is not in the export is named and kinded by ENUM_CUPTI_SYNC_TYPE instead
        named = [(n, k) for n, k in zip(s.column("name").to_pylist(), s.column("kind").to_pylist()) if sync_kind(n)]
        assert all(k == sync_kind(n) for n, k in named)
        assert len(named) >= s.num_rows - 2  # in these exports at most a cut-off call or two


@pytest.mark.parametrize("path", [MFU] + [p for p in (SHARED["mfu_before"], SHARED["mfu_after"]) if p.exists()], ids=lambda p: p.name)
def test_event_records_and_waits_in_the_nccl_trace(path):
    records = dict(q(path, """SELECT (r.globalTid >> 24) & 16777215, COUNT(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME r
                              JOIN StringIds v ON v.id = r.nameId WHERE v.value LIKE 'cudaEventRecord%' GROUP BY 1"""))
    waits = dict(q(path, """SELECT (s.globalPid >> 24) & 16777215, COUNT(*) FROM CUPTI_ACTIVITY_KIND_SYNCHRONIZATION s
                            JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId = s.correlationId
                              AND (r.globalTid >> 24) = (s.globalPid >> 24)
                            JOIN StringIds v ON v.id = r.nameId WHERE v.value LIKE 'cudaStreamWaitEvent%' GROUP BY 1"""))
    assert records and waits
    for t in read_nsys(path):
        s = t.syncs
        rec = s.filter(pc.equal(s.column("kind"), "event_record"))
        assert rec.num_rows == records[t.info["pid"]]
        assert set(rec.column("source").to_pylist()) == {"runtime"}
        wait = s.filter(pc.and_(pc.equal(s.column("kind"), "stream_wait_event"), pc.equal(s.column("source"), "cuda_sync")))
        assert wait.num_rows == waits[t.info["pid"]]
        assert wait.column("event_id").null_count == 0 and wait.column("stream").null_count == 0
        assert wait.column("tid").null_count == 0  # the API call's thread


# --- NCCL, ranks, devices -------------------------------------------------------------------


@pytest.mark.parametrize("path", [MFU] + [p for p in (SHARED["mfu_before"], SHARED["mfu_after"]) if p.exists()], ids=lambda p: p.name)
def test_nccl_kernels_two_ranks_and_their_collective(path):
    nccl = dict(q(path, """SELECT (k.globalPid >> 24) & 16777215, COUNT(*) FROM CUPTI_ACTIVITY_KIND_KERNEL k
                           JOIN StringIds s ON s.id = k.demangledName WHERE s.value LIKE 'ncclDevKernel%' GROUP BY 1"""))
    devices = dict(q(path, "SELECT (globalPid >> 24) & 16777215, MIN(deviceId) FROM CUPTI_ACTIVITY_KIND_KERNEL GROUP BY 1"))
    assert len(nccl) == 2 and all(n > 0 for n in nccl.values())
    traces = read_nsys(path)
    # torchrun's two workers in one export: one trace each, in device order, rank left to the driver
    assert [t.info["pid"] for t in traces] == sorted(devices, key=devices.get)
    assert [t.rank for t in traces] == [None, None]
    for t in traces:
        k = t.kernels
        comm = k.filter(pc.match_substring(k.column("name"), "ncclDevKernel"))
        assert comm.num_rows == nccl[t.info["pid"]]
        launched = comm.filter(pc.is_valid(comm.column("launch_ns")))
        assert launched.num_rows  # through cuLaunchKernelEx (driver API rows in the runtime table)
        # PyTorch's "nccl:all_to_all, op_id = N" NVTX range around the launch names the collective
        assert set(launched.column("collective").to_pylist()) == {"all_to_all"}
        assert t.devices is None  # this export has no TARGET_INFO_GPU


def test_ranks_from_mpi_thread_name_and_from_the_launch_environment():
    (saxpy,) = read_nsys(SAXPY)
    assert q(SAXPY, "SELECT text FROM NVTX_EVENTS WHERE eventType = 39") == [("MPI Rank 0",)]
    assert saxpy.rank == 0
    (mock,) = read_nsys(MOCK)
    assert mock.rank is None  # nothing says: the driver decides (file name, then position)
    if SHARED["cloverleaf"].exists():
        env = [v for (v,) in q(SHARED["cloverleaf"], "SELECT value FROM META_DATA_CAPTURE WHERE name = 'PROCESS_0:ENVIRONMENT_VARIABLE'")]
        assert 'PMI_RANK="0"' in env
        (clover,) = read_nsys(SHARED["cloverleaf"])
        assert clover.rank == 0


def test_devices_from_target_info():
    (t,) = read_nsys(MOCK)
    (g,) = q(MOCK, """SELECT name, smCount, computeMajor, computeMinor, maxWarpsPerSm * threadsPerWarp, maxThreadsPerBlock,
                      maxBlocksPerSm, maxRegistersPerSm, maxRegistersPerBlock, maxShmemPerSm, maxShmemPerBlock,
                      maxShmemPerBlockOptin, threadsPerWarp, totalMemory FROM TARGET_INFO_GPU""")
    (cuda,) = q(MOCK, "SELECT gpuId, cudaId, pid, numMultiprocessors FROM TARGET_INFO_CUDA_DEVICE")
    assert cuda[2] == t.info["pid"]
    (d,) = t.devices.to_pylist()
    assert d["device"] == cuda[1] and d["vendor"] == "nvidia" and d["arch"] == f"sm_{g[2]}{g[3]}"
    assert (d["name"], d["num_sms"], d["compute_major"], d["compute_minor"], d["max_threads_per_sm"],
            d["max_threads_per_block"], d["max_blocks_per_sm"], d["regs_per_sm"], d["regs_per_block"],
            d["shared_mem_per_sm"], d["shared_mem_per_block"], d["shared_mem_per_block_optin"], d["warp_size"],
            d["total_mem_bytes"]) == g  # fmt: skip
    assert set(t.kernels.column("wave_size").to_pylist()) == {g[12]}
    (host,) = q(MOCK, "SELECT value FROM TARGET_INFO_SYSTEM_ENV WHERE name = 'Hostname'")
    (base,) = q(MOCK, "SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME")
    assert t.info["host"] == host[0] and t.info["base_time_ns"] == base[0]


def test_old_layout_devices_and_memcpy_names():
    (t,) = read_nsys(SAXPY)  # 2.9.1: no TARGET_INFO_CUDA_DEVICE, no ENUM tables
    (name, sms) = q(SAXPY, "SELECT name, smCount FROM TARGET_INFO_GPU")[0]
    (d,) = t.devices.to_pylist()
    assert (d["name"], d["num_sms"]) == (name, sms)
    kinds = q(SAXPY, "SELECT copyKind, srcKind, dstKind, COUNT(*) FROM CUPTI_ACTIVITY_KIND_MEMCPY GROUP BY 1, 2, 3")
    labels = {1: "HtoD", 2: "DtoH"}
    mem = {0: "Pageable", 1: "Pinned", 2: "Device"}  # nsys's ENUM_CUDA_MEM_KIND numbering (see mock.sqlite)
    expected = {f"Memcpy {labels[k]} ({mem[s]} -> {mem[d]})": n for k, s, d, n in kinds}
    copies = t.kernels.filter(pc.equal(t.kernels.column("category"), "gpu_memcpy"))
    got = {}
    for nm in copies.column("name").to_pylist():
        got[nm] = got.get(nm, 0) + 1
    assert got == expected
    assert copies.column("bytes").to_pylist() and None not in copies.column("bytes").to_pylist()


def test_enum_tables_name_copies_like_kineto():
    assert q(MOCK, "SELECT label FROM ENUM_CUDA_MEM_KIND WHERE id IN (1, 2) ORDER BY id") == [("Pinned",), ("Device",)]
    (t,) = read_nsys(MOCK)
    copies = t.kernels.filter(pc.equal(t.kernels.column("category"), "gpu_memcpy"))
    assert copies.column("name").to_pylist() == ["Memcpy DtoH (Device -> Pinned)"]  # tensor.item()


# --- steps, zero-length, negative -----------------------------------------------------------


def _writable_copy(src: Path, tmp_path: Path, name: str | None = None) -> Path:
    dst = tmp_path / (name or src.name)
    shutil.copyfile(src, dst)
    dst.chmod(0o644)
    return dst


def test_steps_from_nvtx_ranges(tmp_path):
    p = _writable_copy(SAXPY, tmp_path)
    launches = [r[0] for r in q(p, "SELECT MIN(r.start) FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN CUPTI_ACTIVITY_KIND_KERNEL k "
                                   "ON k.correlationId = r.correlationId GROUP BY k.correlationId ORDER BY 1")]  # fmt: skip
    (gtid,) = q(p, "SELECT DISTINCT globalTid FROM NVTX_EVENTS WHERE eventType = 59 LIMIT 1")[0]
    db = sqlite3.connect(p)
    ranges = [(launches[0] - 10, launches[1] - 1, "ProfilerStep#7"), (launches[1] - 1, launches[-1] + 1, "ProfilerStep#8, op_id = 3"),
              (launches[0] - 10, launches[-1] + 10, "ProfilerStep#")]  # the last is not a step  # fmt: skip
    db.executemany("INSERT INTO NVTX_EVENTS (start, \"end\", eventType, text, globalTid) VALUES (?, ?, 59, ?, ?)",
                   [(a, b, text, gtid) for a, b, text in ranges])  # fmt: skip
    db.commit()
    db.close()
    (t,) = read_nsys(p)
    assert t.steps.to_pylist() == [
        {"step": 7, "name": "ProfilerStep#7", "source": "profiler_step", "start_ns": ranges[0][0], "end_ns": ranges[0][1]},
        {"step": 8, "name": "ProfilerStep#8", "source": "profiler_step", "start_ns": ranges[1][0], "end_ns": ranges[1][1]},
    ]


def test_zero_length_activity_is_kept(tmp_path):
    p = _writable_copy(MOCK, tmp_path)
    db = sqlite3.connect(p)
    db.execute("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET \"end\" = start WHERE rowid = (SELECT MIN(rowid) FROM CUPTI_ACTIVITY_KIND_KERNEL)")
    db.commit()
    db.close()
    (t,) = read_nsys(p)
    k = t.kernels
    assert k.num_rows == sum(len(v) for v in activities_sql(p).values())
    assert pc.sum(pc.equal(k.column("start_ns"), k.column("end_ns"))).as_py() == 1


def test_negative_duration_is_an_error_naming_the_file(tmp_path):
    p = _writable_copy(MOCK, tmp_path)
    db = sqlite3.connect(p)
    db.execute("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET \"end\" = start - 1 WHERE rowid = (SELECT MAX(rowid) FROM CUPTI_ACTIVITY_KIND_KERNEL)")
    db.commit()
    db.close()
    with pytest.raises(ValueError, match="negative duration") as exc:
        read_nsys(p)
    assert str(p) in str(exc.value) and len(str(exc.value).splitlines()) == 1


# --- hostile inputs -------------------------------------------------------------------------


def _one_line_error(path: Path) -> str:
    with pytest.raises(ValueError) as exc:
        read_nsys(path)
    msg = str(exc.value)
    assert str(path) in msg and len(msg.splitlines()) == 1, msg
    return msg


def test_not_sqlite(tmp_path):
    p = tmp_path / "trace.sqlite"
    p.write_text('{"traceEvents": []}')
    assert "not an SQLite database" in _one_line_error(p)
    assert not NsysReader().sniff(p, p.read_bytes())


def test_sqlite_without_nsys_tables(tmp_path):
    p = tmp_path / "other.sqlite"
    db = sqlite3.connect(p)
    db.execute("CREATE TABLE things (a INTEGER)")
    db.commit()
    db.close()
    assert "not an Nsight Systems export" in _one_line_error(p)
    assert not NsysReader().sniff(p, p.read_bytes()[:65536])


def test_truncated_export(tmp_path):
    data = MFU.read_bytes()
    p = tmp_path / "cut.sqlite"
    p.write_bytes(data[: len(data) // 2])
    assert "truncated" in _one_line_error(p)


def test_truncated_export_without_a_page_count(tmp_path):
    # an old header without the in-header size: SQLite itself finds the missing pages
    data = bytearray(MFU.read_bytes())
    data[92:96] = (int.from_bytes(data[92:96], "big") + 1).to_bytes(4, "big")  # version-valid-for no longer matches
    p = tmp_path / "cut.sqlite"
    p.write_bytes(bytes(data[: len(data) // 2]))
    assert "corrupt" in _one_line_error(p) or "malformed" in _one_line_error(p)


def test_corrupt_pages(tmp_path):
    data = bytearray(MFU.read_bytes())
    page = int.from_bytes(data[16:18], "big")
    for i in range(2 * page, len(data) - page, 3 * page):  # scribble over most b-tree pages
        data[i : i + 64] = b"\xa5" * 64
    p = tmp_path / "bad.sqlite"
    p.write_bytes(bytes(data))
    msg = _one_line_error(p)
    assert "corrupt" in msg or "not a readable" in msg or "malformed" in msg


def test_empty_file(tmp_path):
    p = tmp_path / "empty.sqlite"
    p.write_bytes(b"")
    assert "not an SQLite database" in _one_line_error(p)


def test_export_without_gpu_activity(tmp_path):
    p = _writable_copy(MOCK, tmp_path)
    db = sqlite3.connect(p)
    for t in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY"):
        db.execute(f"DELETE FROM {t}")
    db.commit()
    db.close()
    assert "no kernel, memcpy or memset" in _one_line_error(p)


def test_unfinished_write_ahead_log(tmp_path):
    # an immutable open would not see the log's pages: refused rather than read short
    p = _writable_copy(MOCK, tmp_path)
    db = sqlite3.connect(p)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("DELETE FROM CUPTI_ACTIVITY_KIND_MEMCPY")
    db.commit()
    try:
        assert "write-ahead log" in _one_line_error(p)
    finally:
        db.close()  # checkpoints the log and removes it
    (t,) = read_nsys(p)
    assert pc.sum(pc.equal(t.kernels.column("category"), "gpu_memcpy")).as_py() in (0, None)


def test_read_only_file_is_left_untouched(tmp_path):
    d = tmp_path / "ro"
    d.mkdir()
    p = _writable_copy(MFU, d)
    before = sha256(p)
    p.chmod(stat.S_IRUSR)
    d.chmod(stat.S_IRUSR | stat.S_IXUSR)  # no journal, no -wal/-shm can be created beside it
    try:
        assert len(read_nsys(p)) == 2
        assert sorted(x.name for x in d.iterdir()) == [p.name]
    finally:
        d.chmod(0o755)
        p.chmod(0o644)
    assert sha256(p) == before


# --- detection and the ingest driver ---------------------------------------------------------


def test_sniffed_by_content_not_by_name(tmp_path):
    from overlapviz.ingest.chrome import ChromeReader
    from overlapviz.ingest.rocpd import RocpdReader
    from overlapviz.ingest.rocprof import READERS as ROCPROF

    p = tmp_path / "trace.json"  # a misleading name
    shutil.copyfile(MOCK, p)
    head = p.read_bytes()[:65536]
    assert NsysReader().sniff(p, head)
    assert not RocpdReader().sniff(p, head)
    assert not ChromeReader().sniff(p, head) and not any(r.sniff(p, head) for r in ROCPROF)
    assert not NsysReader().sniff(DATA / "PROVENANCE.md", (DATA / "PROVENANCE.md").read_bytes())


def test_ingest_and_analyze_the_nccl_export(tmp_path):
    from overlapviz.cli import main
    from overlapviz.ingest import ingest
    from overlapviz.dataset.schema import read_table

    src = tmp_path / "mfu"
    src.mkdir()
    shutil.copyfile(MFU, src / MFU.name)
    ds = ingest([src], tmp_path / "ds", progress=False)
    ranks = read_table(ds, "ranks").to_pylist()
    assert sorted(r["rank"] for r in ranks) == [0, 1]
    assert {r["source_format"] for r in ranks} == {"nsys_sqlite"}
    result = CliRunner().invoke(main, ["analyze", str(ds), "--format", "json"])
    assert result.exit_code == 0, result.output
    records = {r["rank"]: r for r in json.loads(result.output)}
    nccl = dict(q(MFU, """SELECT MIN(k.deviceId), COUNT(*) FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s
                          ON s.id = k.demangledName WHERE s.value LIKE 'ncclDevKernel%' GROUP BY k.globalPid"""))
    kernels = dict(q(MFU, "SELECT MIN(deviceId), COUNT(*) FROM CUPTI_ACTIVITY_KIND_KERNEL GROUP BY globalPid"))
    for rank in (0, 1):  # ranks in device order
        assert records[rank]["n_comm_kernels"] == nccl[rank]
        assert records[rank]["n_kernels"] == kernels[rank]


def test_reading_an_export_imports_no_pandas():
    code = textwrap.dedent(
        """
        import sys
        from overlapviz.ingest.nsys import read_nsys
        print(sum(t.kernels.num_rows for t in read_nsys(sys.argv[1])))
        print('pandas' in sys.modules)
        """
    )
    out = subprocess.run([sys.executable, "-c", code, str(MFU)], capture_output=True, text=True, timeout=120, check=True)
    lines = out.stdout.split()
    assert int(lines[0]) > 0 and lines[-1] == "False", out.stdout + out.stderr


def test_sync_kind_names():
    assert sync_kind("cudaStreamWaitEvent_v3020") == "stream_wait_event"
    assert sync_kind("cudaEventRecordWithFlags_v11010") == "event_record"
    assert sync_kind("cuStreamSynchronize") == "stream_sync"
    assert sync_kind("cudaStreamSynchronize_ptsz_v7000") == "stream_sync"
    assert sync_kind("cudaDeviceSynchronize_v3020") == "context_sync"
    assert sync_kind("cudaEventQuery_v3020") == "event_query"
    assert sync_kind("cudaLaunchKernel_v7000") is None and sync_kind(None) is None
    assert re.match(r"^cuda", "cudaEventSynchronize") and sync_kind("cudaEventSynchronize") == "event_sync"


# a writer that stops before SQLite checkpoints its write-ahead log (a killed or still
# running export): the export's rows stay in FILE-wal
_WAL_WRITER = textwrap.dedent("""
    import os, sqlite3, sys
    src, out, whole = sys.argv[1], sys.argv[2], sys.argv[3] == "whole"
    if not whole:
        import shutil
        shutil.copy(src, out)
        c = sqlite3.connect(out); c.execute("PRAGMA journal_mode=WAL"); c.commit(); c.close()
    c = sqlite3.connect(out)
    c.execute("PRAGMA journal_mode=WAL"); c.execute("PRAGMA wal_autocheckpoint=0")
    if whole:  # every table written in WAL mode: the main file holds no table yet
        c.execute("ATTACH ? AS m", (src,))
        for name, sql in c.execute("SELECT name, sql FROM m.sqlite_master WHERE type = 'table' AND sql IS NOT NULL").fetchall():
            c.execute(sql); c.execute(f'INSERT INTO main."{name}" SELECT * FROM m."{name}"')
    else:  # later rows added to an export
        c.execute("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL SELECT * FROM CUPTI_ACTIVITY_KIND_KERNEL LIMIT 1")
    c.commit()
    os._exit(0)  # no close, no checkpoint
""")


@pytest.mark.parametrize("whole", ["whole", "tail"])
@pytest.mark.parametrize("named", ["file", "directory"])
def test_wal_export_with_unmerged_rows(tmp_path, whole, named):
    """An export in WAL mode whose log still holds rows is refused saying so (not "not a
    trace"), named alone or found in a directory, and nothing is written."""
    from overlapviz.testing import ingest_cli

    d = tmp_path / "export"
    d.mkdir()
    out = d / "report.sqlite"
    subprocess.run([sys.executable, "-c", _WAL_WRITER, str(MOCK), str(out), whole], check=True)
    (d / "report.sqlite-shm").unlink(missing_ok=True)
    assert Path(f"{out}-wal").stat().st_size > 0
    _, result = ingest_cli(tmp_path, out if named == "file" else d, ok=False)
    assert result.exit_code != 0
    line = result.output.strip().splitlines()[-1]
    assert "report.sqlite" in line and "WAL mode" in line and "not all merged" in line, line
    assert not (tmp_path / "ds").exists()
