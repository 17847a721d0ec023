"""rocprofv3's rocpd SQLite output through ``overlapviz.ingest.rocpd``, on databases built here.

No real rocpd database is small enough to ship (see reference_traces/rocpd/PROVENANCE.md),
so each test builds one with ``sqlite3`` from the DDL that rocprofiler-sdk 1.0.0 (ROCm 7.0,
rocpd schema 3.0.0) writes: ``ROCPD_TABLES`` below is quoted from
rocm-systems ``projects/rocprofiler-sdk/source/share/rocprofiler-sdk-rocpd/rocpd_tables.sql``
as it appears in the ``.schema`` dump of a real rocprofv3 database (guid
``00000450-565d-765d-bc41-19a2073d19ee``), the tables this reader touches, verbatim, with
the ``{{uuid}}`` / ``{{guid}}`` placeholders rocprofv3 fills; ``ROCPD_VIEWS`` is the
``rocpd_<table>`` views and the ``kernels`` data view from the same dump. Rows are written
as ``generateRocpd.cpp`` writes them: region ids are internal correlation ids, a dispatch's
event carries its launch's id as ``stack_id``, agent ``extdata`` is rocprofiler's agent
record (here a real MI350X one, read from tests/data/rocprof/v3's rocprofv3 JSON), ``pid``
columns hold the OS pid. HIP argument values (``stream``, ``event``) are written as
hexadecimal handles, the form rocprofiler's argument stringifier gives pointers.

Every expectation is the test's own: the rows it inserted, or SQL over the database.
"""

from __future__ import annotations

import functools
import gzip
import json
import sqlite3
from pathlib import Path

import pyarrow.compute as pc
import pytest

from overlapviz.ingest.nsys import NsysReader
from overlapviz.ingest.rocpd import RocpdReader, handle_value, read_rocpd
from overlapviz.ingest.sqlite_common import READER_SYNC_SCHEMA

MI350X_JSON = Path(__file__).parent / "data" / "rocprof" / "v3" / "tracelens_mi350x_json" / "908_results.json.gz"
NSYS_MOCK = Path(__file__).parent / "data" / "nsys" / "mock.sqlite"

# rocpd_tables.sql (rocpd schema 3.0.0, ROCm 7.0), the tables read here, verbatim
ROCPD_TABLES = """
CREATE TABLE IF NOT EXISTS
    "rocpd_metadata{{uuid}}" (
        "id" INTEGER NOT NULL PRIMARY KEY AUTOINCREMENT,
        "tag" TEXT NOT NULL,
        "value" TEXT NOT NULL
    );

CREATE TABLE IF NOT EXISTS
    `rocpd_string{{uuid}}` (
        "id" INTEGER NOT NULL PRIMARY KEY AUTOINCREMENT,
        "guid" TEXT DEFAULT "{{guid}}" NOT NULL,
        "string" TEXT NOT NULL UNIQUE ON CONFLICT ABORT
    );

CREATE TABLE IF NOT EXISTS
    `rocpd_info_node{{uuid}}` (
        "id" INTEGER NOT NULL PRIMARY KEY AUTOINCREMENT,
        "guid" TEXT DEFAULT "{{guid}}" NOT NULL,
        "hash" BIGINT NOT NULL UNIQUE,
        "machine_id" TEXT NOT NULL UNIQUE,
        "system_name" TEXT,
        "hostname" TEXT,
        "release" TEXT,
        "version" TEXT,
        "hardware_name" TEXT,
        "domain_name" TEXT
    );

CREATE TABLE IF NOT EXISTS
    `rocpd_info_process{{uuid}}` (
        "id" INTEGER NOT NULL PRIMARY KEY AUTOINCREMENT,
        "guid" TEXT DEFAULT "{{guid}}" NOT NULL,
        "nid" INTEGER NOT NULL,
        "ppid" INTEGER,
        "pid" INTEGER NOT NULL,
        "init" BIGINT,
        "fini" BIGINT,
        "start" BIGINT,
        "end" BIGINT,
        "command" TEXT,
        "environment" JSONB DEFAULT "{}" NOT NULL,
        "extdata" JSONB DEFAULT "{}" NOT NULL,
        FOREIGN KEY (nid) REFERENCES `rocpd_info_node{{uuid}}` (id) ON UPDATE CASCADE
    );

CREATE TABLE IF NOT EXISTS
    `rocpd_info_thread{{uuid}}` (
        "id" INTEGER NOT NULL PRIMARY KEY AUTOINCREMENT,
        "guid" TEXT DEFAULT "{{guid}}" NOT NULL,
        "nid" INTEGER NOT NULL,
        "ppid" INTEGER,
        "pid" INTEGER NOT NULL,
        "tid" INTEGER NOT NULL,
        "name" TEXT,
        "start" BIGINT,
        "end" BIGINT,
        "extdata" JSONB DEFAULT "{}" NOT NULL,
        FOREIGN KEY (nid) REFERENCES `rocpd_info_node{{uuid}}` (id) ON UPDATE CASCADE,
        FOREIGN KEY (pid) REFERENCES `rocpd_info_process{{uuid}}` (id) ON UPDATE CASCADE
    );

CREATE TABLE IF NOT EXISTS
    `rocpd_info_agent{{uuid}}` (
        "id" INTEGER NOT NULL PRIMARY KEY AUTOINCREMENT,
        "guid" TEXT DEFAULT "{{guid}}" NOT NULL,
        "nid" INTEGER NOT NULL,
        "pid" INTEGER NOT NULL,
        "type" TEXT CHECK ("type" IN ('CPU', 'GPU')),
        "absolute_index" INTEGER,
        "logical_index" INTEGER,
        "type_index" INTEGER,
        "uuid" INTEGER,
        "name" TEXT,
        "model_name" TEXT,
        "vendor_name" TEXT,
        "product_name" TEXT,
        "user_name" TEXT,
        "extdata" JSONB DEFAULT "{}" NOT NULL,
        FOREIGN KEY (nid) REFERENCES `rocpd_info_node{{uuid}}` (id) ON UPDATE CASCADE,
        FOREIGN KEY (pid) REFERENCES `rocpd_info_process{{uuid}}` (id) ON UPDATE CASCADE
    );

CREATE TABLE IF NOT EXISTS
    `rocpd_info_queue{{uuid}}` (
        "id" INTEGER NOT NULL PRIMARY KEY AUTOINCREMENT,
        "guid" TEXT DEFAULT "{{guid}}" NOT NULL,
        "nid" INTEGER NOT NULL,
        "pid" INTEGER NOT NULL,
        "name" TEXT,
        "extdata" JSONB DEFAULT "{}" NOT NULL,
        FOREIGN KEY (nid) REFERENCES `rocpd_info_node{{uuid}}` (id) ON UPDATE CASCADE,
        FOREIGN KEY (pid) REFERENCES `rocpd_info_process{{uuid}}` (id) ON UPDATE CASCADE
    );

CREATE TABLE IF NOT EXISTS
    `rocpd_info_stream{{uuid}}` (
        "id" INTEGER NOT NULL PRIMARY KEY AUTOINCREMENT,
        "guid" TEXT DEFAULT "{{guid}}" NOT NULL,
        "nid" INTEGER NOT NULL,
        "pid" INTEGER NOT NULL,
        "name" TEXT,
        "extdata" JSONB DEFAULT "{}" NOT NULL,
        FOREIGN KEY (nid) REFERENCES `rocpd_info_node{{uuid}}` (id) ON UPDATE CASCADE,
        FOREIGN KEY (pid) REFERENCES `rocpd_info_process{{uuid}}` (id) ON UPDATE CASCADE
    );

CREATE TABLE IF NOT EXISTS
    `rocpd_info_code_object{{uuid}}` (
        "id" INTEGER NOT NULL PRIMARY KEY AUTOINCREMENT,
        "guid" TEXT DEFAULT "{{guid}}" NOT NULL,
        "nid" INTEGER NOT NULL,
        "pid" INTEGER NOT NULL,
        "agent_id" INTEGER,
        "uri" TEXT,
        "load_base" BIGINT,
        "load_size" BIGINT,
        "load_delta" BIGINT,
        "storage_type" TEXT CHECK ("storage_type" IN ('FILE', 'MEMORY')),
        "extdata" JSONB DEFAULT "{}" NOT NULL,
        FOREIGN KEY (nid) REFERENCES `rocpd_info_node{{uuid}}` (id) ON UPDATE CASCADE,
        FOREIGN KEY (pid) REFERENCES `rocpd_info_process{{uuid}}` (id) ON UPDATE CASCADE,
        FOREIGN KEY (agent_id) REFERENCES `rocpd_info_agent{{uuid}}` (id) ON UPDATE CASCADE
    );

CREATE TABLE IF NOT EXISTS
    `rocpd_info_kernel_symbol{{uuid}}` (
        "id" INTEGER NOT NULL PRIMARY KEY AUTOINCREMENT,
        "guid" TEXT DEFAULT "{{guid}}" NOT NULL,
        "nid" INTEGER NOT NULL,
        "pid" INTEGER NOT NULL,
        "code_object_id" INTEGER NOT NULL,
        "kernel_name" TEXT,
        "display_name" TEXT,
        "kernel_object" INTEGER,
        "kernarg_segment_size" INTEGER,
        "kernarg_segment_alignment" INTEGER,
        "group_segment_size" INTEGER,
        "private_segment_size" INTEGER,
        "sgpr_count" INTEGER,
        "arch_vgpr_count" INTEGER,
        "accum_vgpr_count" INTEGER,
        "extdata" JSONB DEFAULT "{}" NOT NULL,
        FOREIGN KEY (nid) REFERENCES `rocpd_info_node{{uuid}}` (id) ON UPDATE CASCADE,
        FOREIGN KEY (pid) REFERENCES `rocpd_info_process{{uuid}}` (id) ON UPDATE CASCADE,
        FOREIGN KEY (code_object_id) REFERENCES `rocpd_info_code_object{{uuid}}` (id) ON UPDATE CASCADE
    );

-- Storage for a region, instant, and counter
CREATE TABLE IF NOT EXISTS
    `rocpd_event{{uuid}}` (
        "id" INTEGER NOT NULL PRIMARY KEY AUTOINCREMENT,
        "guid" TEXT DEFAULT "{{guid}}" NOT NULL,
        "category_id" INTEGER,
        "stack_id" INTEGER,
        "parent_stack_id" INTEGER,
        "correlation_id" INTEGER,
        "call_stack" JSONB DEFAULT "{}" NOT NULL,
        "line_info" JSONB DEFAULT "{}" NOT NULL,
        "extdata" JSONB DEFAULT "{}" NOT NULL,
        FOREIGN KEY (category_id) REFERENCES `rocpd_string{{uuid}}` (id) ON UPDATE CASCADE
    );

-- stores arguments for events
CREATE TABLE IF NOT EXISTS
    `rocpd_arg{{uuid}}` (
        "id" INTEGER NOT NULL PRIMARY KEY AUTOINCREMENT,
        "guid" TEXT DEFAULT "{{guid}}" NOT NULL,
        "event_id" INTEGER NOT NULL,
        "position" INTEGER NOT NULL,
        "type" TEXT NOT NULL,
        "name" TEXT NOT NULL,
        "value" TEXT, -- TODO: discuss make it value_id and integer, refer to string table --
        "extdata" JSONB DEFAULT "{}" NOT NULL,
        FOREIGN KEY (event_id) REFERENCES `rocpd_event{{uuid}}` (id) ON UPDATE CASCADE
    );

-- Region with a start/stop on the same thread (CPU)
CREATE TABLE IF NOT EXISTS
    `rocpd_region{{uuid}}` (
        "id" INTEGER NOT NULL PRIMARY KEY AUTOINCREMENT,
        "guid" TEXT DEFAULT "{{guid}}" NOT NULL,
        "nid" INTEGER NOT NULL,
        "pid" INTEGER NOT NULL,
        "tid" INTEGER NOT NULL,
        "start" BIGINT NOT NULL,
        "end" BIGINT NOT NULL,
        "name_id" INTEGER NOT NULL,
        "event_id" INTEGER,
        "extdata" JSONB DEFAULT "{}" NOT NULL,
        FOREIGN KEY (nid) REFERENCES `rocpd_info_node{{uuid}}` (id) ON UPDATE CASCADE,
        FOREIGN KEY (pid) REFERENCES `rocpd_info_process{{uuid}}` (id) ON UPDATE CASCADE,
        FOREIGN KEY (tid) REFERENCES `rocpd_info_thread{{uuid}}` (id) ON UPDATE CASCADE,
        FOREIGN KEY (name_id) REFERENCES `rocpd_string{{uuid}}` (id) ON UPDATE CASCADE,
        FOREIGN KEY (event_id) REFERENCES `rocpd_event{{uuid}}` (id) ON UPDATE CASCADE
    );

CREATE TABLE IF NOT EXISTS
    `rocpd_kernel_dispatch{{uuid}}` (
        "id" INTEGER NOT NULL PRIMARY KEY AUTOINCREMENT,
        "guid" TEXT DEFAULT "{{guid}}" NOT NULL,
        "nid" INTEGER NOT NULL,
        "pid" INTEGER NOT NULL,
        "tid" INTEGER,
        "agent_id" INTEGER NOT NULL,
        "kernel_id" INTEGER NOT NULL,
        "dispatch_id" INTEGER NOT NULL,
        "queue_id" INTEGER NOT NULL,
        "stream_id" INTEGER NOT NULL,
        "start" BIGINT NOT NULL,
        "end" BIGINT NOT NULL,
        "private_segment_size" INTEGER,
        "group_segment_size" INTEGER,
        "workgroup_size_x" INTEGER NOT NULL,
        "workgroup_size_y" INTEGER NOT NULL,
        "workgroup_size_z" INTEGER NOT NULL,
        "grid_size_x" INTEGER NOT NULL,
        "grid_size_y" INTEGER NOT NULL,
        "grid_size_z" INTEGER NOT NULL,
        "region_name_id" INTEGER,
        "event_id" INTEGER,
        "extdata" JSONB DEFAULT "{}" NOT NULL,
        FOREIGN KEY (nid) REFERENCES `rocpd_info_node{{uuid}}` (id) ON UPDATE CASCADE,
        FOREIGN KEY (pid) REFERENCES `rocpd_info_process{{uuid}}` (id) ON UPDATE CASCADE,
        FOREIGN KEY (tid) REFERENCES `rocpd_info_thread{{uuid}}` (id) ON UPDATE CASCADE,
        FOREIGN KEY (agent_id) REFERENCES `rocpd_info_agent{{uuid}}` (id) ON UPDATE CASCADE,
        FOREIGN KEY (kernel_id) REFERENCES `rocpd_info_kernel_symbol{{uuid}}` (id) ON UPDATE CASCADE,
        FOREIGN KEY (queue_id) REFERENCES `rocpd_info_queue{{uuid}}` (id) ON UPDATE CASCADE,
        FOREIGN KEY (stream_id) REFERENCES `rocpd_info_stream{{uuid}}` (id) ON UPDATE CASCADE,
        FOREIGN KEY (region_name_id) REFERENCES `rocpd_string{{uuid}}` (id) ON UPDATE CASCADE,
        FOREIGN KEY (event_id) REFERENCES `rocpd_event{{uuid}}` (id) ON UPDATE CASCADE
    );

CREATE TABLE IF NOT EXISTS
    `rocpd_memory_copy{{uuid}}` (
        "id" INTEGER NOT NULL PRIMARY KEY AUTOINCREMENT,
        "guid" TEXT DEFAULT "{{guid}}" NOT NULL,
        "nid" INTEGER NOT NULL,
        "pid" INTEGER NOT NULL,
        "tid" INTEGER,
        "start" BIGINT NOT NULL,
        "end" BIGINT NOT NULL,
        "name_id" INTEGER NOT NULL,
        "dst_agent_id" INTEGER,
        "dst_address" INTEGER,
        "src_agent_id" INTEGER,
        "src_address" INTEGER,
        "size" INTEGER NOT NULL,
        "queue_id" INTEGER,
        "stream_id" INTEGER,
        "region_name_id" INTEGER,
        "event_id" INTEGER,
        "extdata" JSONB DEFAULT "{}" NOT NULL,
        FOREIGN KEY (nid) REFERENCES `rocpd_info_node{{uuid}}` (id) ON UPDATE CASCADE,
        FOREIGN KEY (pid) REFERENCES `rocpd_info_process{{uuid}}` (id) ON UPDATE CASCADE,
        FOREIGN KEY (tid) REFERENCES `rocpd_info_thread{{uuid}}` (id) ON UPDATE CASCADE,
        FOREIGN KEY (name_id) REFERENCES `rocpd_string{{uuid}}` (id) ON UPDATE CASCADE,
        FOREIGN KEY (dst_agent_id) REFERENCES `rocpd_info_agent{{uuid}}` (id) ON UPDATE CASCADE,
        FOREIGN KEY (src_agent_id) REFERENCES `rocpd_info_agent{{uuid}}` (id) ON UPDATE CASCADE,
        FOREIGN KEY (stream_id) REFERENCES `rocpd_info_stream{{uuid}}` (id) ON UPDATE CASCADE,
        FOREIGN KEY (queue_id) REFERENCES `rocpd_info_queue{{uuid}}` (id) ON UPDATE CASCADE,
        FOREIGN KEY (region_name_id) REFERENCES `rocpd_string{{uuid}}` (id) ON UPDATE CASCADE,
        FOREIGN KEY (event_id) REFERENCES `rocpd_event{{uuid}}` (id) ON UPDATE CASCADE
    );
"""

# rocpd_views.sql: one view per table, over this process's table
VIEWED = ("metadata", "string", "info_node", "info_process", "info_thread", "info_agent", "info_queue", "info_stream",
          "info_code_object", "info_kernel_symbol", "event", "arg", "region", "kernel_dispatch", "memory_copy")  # fmt: skip
ROCPD_VIEW = """
CREATE VIEW IF NOT EXISTS
    `rocpd_{name}` AS
SELECT
    *
FROM
    `rocpd_{name}{{{{uuid}}}}`;
"""

# data_views.sql: the `kernels` view (INNER JOINs: a dispatch without a region name drops out)
KERNELS_VIEW = """
CREATE VIEW IF NOT EXISTS
    `kernels` AS
SELECT
    K.id,
    K.guid,
    T.tid,
    (
        SELECT
            string
        FROM
            `rocpd_string` RS
        WHERE
            RS.id = E.category_id
            AND RS.guid = E.guid
    ) AS category,
    R.string AS region,
    S.display_name AS name,
    K.nid,
    P.pid,
    A.absolute_index AS agent_abs_index,
    A.logical_index AS agent_log_index,
    A.type_index AS agent_type_index,
    A.type AS agent_type,
    S.code_object_id AS code_object_id,
    K.kernel_id,
    K.dispatch_id,
    K.stream_id,
    K.queue_id,
    Q.name AS queue,
    ST.name AS stream,
    K.start,
    K.end,
    (K.end - K.start) AS duration,
    K.grid_size_x AS grid_x,
    K.grid_size_y AS grid_y,
    K.grid_size_z AS grid_z,
    K.workgroup_size_x AS workgroup_x,
    K.workgroup_size_y AS workgroup_y,
    K.workgroup_size_z AS workgroup_z,
    K.group_segment_size AS lds_size,
    K.private_segment_size AS scratch_size,
    S.arch_vgpr_count AS vgpr_count,
    S.accum_vgpr_count,
    S.sgpr_count,
    S.group_segment_size AS static_lds_size,
    S.private_segment_size AS static_scratch_size,
    E.stack_id,
    E.parent_stack_id,
    E.correlation_id AS corr_id
FROM
    `rocpd_kernel_dispatch` K
    INNER JOIN `rocpd_info_agent` A ON A.id = K.agent_id
    AND A.guid = K.guid
    INNER JOIN `rocpd_event` E ON E.id = K.event_id
    AND E.guid = K.guid
    INNER JOIN `rocpd_string` R ON R.id = K.region_name_id
    AND R.guid = K.guid
    INNER JOIN `rocpd_info_kernel_symbol` S ON S.id = K.kernel_id
    AND S.guid = K.guid
    LEFT JOIN `rocpd_info_stream` ST ON ST.id = K.stream_id
    AND ST.guid = K.guid
    LEFT JOIN `rocpd_info_queue` Q ON Q.id = K.queue_id
    AND Q.guid = K.guid
    INNER JOIN `rocpd_info_process` P ON P.id = Q.pid
    AND P.guid = Q.guid
    INNER JOIN `rocpd_info_thread` T ON T.id = K.tid
    AND T.guid = K.guid;
"""

GUID_A = "0197a3c2-7d10-7e2b-9f3a-4c5d6e7f8091"
GUID_B = "0197a3c2-7d11-7a01-8b22-13579bdf0246"
T0 = 63_857_982_592_000  # a rocprofiler timestamp (ns), as in the MI350X trace


@functools.lru_cache(maxsize=1)
def _mi350x_agents() -> str:
    with gzip.open(MI350X_JSON, "rt") as f:
        tool = json.load(f)["rocprofiler-sdk-tool"]
    tool = tool[0] if isinstance(tool, list) else tool
    return json.dumps([a for a in tool["agents"] if a["type"] == 2])


def mi350x_agents() -> list[dict]:
    """The GPU agent records of a real rocprofv3 run on MI350X (a fresh copy each call)."""
    return json.loads(_mi350x_agents())


class Process:
    """One rocprofv3 process's rows, inserted as generateRocpd.cpp inserts them."""

    def __init__(self, db: sqlite3.Connection, guid: str, pid: int, env: dict, *, create_views: bool):
        self.db, self.guid, self.pid = db, guid, pid
        self.uuid = "_" + guid.replace("-", "_")
        db.executescript(ROCPD_TABLES.replace("{{uuid}}", self.uuid).replace("{{guid}}", guid))
        if create_views:
            db.executescript("".join(ROCPD_VIEW.format(name=n).replace("{{uuid}}", self.uuid) for n in VIEWED))
            db.executescript(KERNELS_VIEW)
        self.strings: dict[str, int] = {}
        self.next_event = 1
        self.node = 2_882_400_000 + pid
        for tag, value in (("schema_version", "3"), ("uuid", self.uuid[1:]), ("guid", guid)):
            self.ins("metadata", tag=tag, value=value)
        self.ins("info_node", id=self.node, hash=self.node, machine_id=f"machine-{pid}", hostname="mi350-node07",
                 system_name="Linux")  # fmt: skip
        self.ins("info_process", id=pid, nid=self.node, ppid=1, pid=pid, init=T0 - 10**9, fini=T0 + 10**9,
                 start=T0 - 10**9, end=T0 + 10**9, command="python train.py", environment=json.dumps(env))  # fmt: skip
        for s in ("", "KERNEL_DISPATCH", "MEMORY_COPY", "HIP_RUNTIME_API_EXT", "RCCL_API", "MARKER_CORE_RANGE_API"):
            self.string(s)
        agents = mi350x_agents()
        self.ins("info_agent", id=0, nid=self.node, pid=pid, type="CPU", absolute_index=0, logical_index=0, type_index=0,
                 name="AMD EPYC 9575F 64-Core Processor", extdata="{}")  # fmt: skip
        for a in agents[:2]:
            self.ins("info_agent", id=a["node_id"], nid=self.node, pid=pid, type="GPU", absolute_index=a["node_id"],
                     logical_index=a["logical_node_id"], type_index=a["logical_node_type_id"], uuid=0, name=a["name"],
                     model_name=a.get("model_name", ""), vendor_name=a.get("vendor_name", "AMD"),
                     product_name=a["product_name"], user_name=a["product_name"], extdata=json.dumps(a))  # fmt: skip
        self.gpu = [a["node_id"] for a in agents[:2]]
        for i, name in enumerate(("Default Queue", "Queue 0", "Queue 1")):
            self.ins("info_queue", id=i, nid=self.node, pid=pid, name=name)
        for i, name in enumerate(("Default Stream", "Stream 0", "Stream 1")):
            self.ins("info_stream", id=i, nid=self.node, pid=pid, name=name)
        self.ins("info_code_object", id=1, nid=self.node, pid=pid, agent_id=self.gpu[0], uri="file:///app.hsaco",
                 load_base=0, load_size=4096, load_delta=0, storage_type="FILE")  # fmt: skip
        for tid in (pid, pid + 1):
            self.ins("info_thread", id=tid, nid=self.node, ppid=1, pid=pid, tid=tid)

    def ins(self, table: str, **values):
        cols = ", ".join(f'"{c}"' for c in values)
        marks = ", ".join("?" for _ in values)
        self.db.execute(f'INSERT INTO "rocpd_{table}{self.uuid}" ({cols}) VALUES ({marks})', list(values.values()))

    def string(self, s: str) -> int:
        if s not in self.strings:
            self.strings[s] = len(self.strings) + 1
            self.ins("string", id=self.strings[s], string=s)
        return self.strings[s]

    def event(self, category: str, stack_id: int, extdata: str = "{}") -> int:
        e = self.next_event
        self.next_event += 1
        self.ins("event", id=e, category_id=self.string(category), stack_id=stack_id, parent_stack_id=stack_id,
                 correlation_id=0, extdata=extdata)  # fmt: skip
        return e

    def api(self, corr: int, name: str, tid: int, start: int, end: int, category="HIP_RUNTIME_API_EXT", extdata="{}",
            **args) -> int:  # fmt: skip
        e = self.event(category, corr, extdata)
        for pos, (arg, value) in enumerate(args.items()):
            self.ins("arg", event_id=e, position=pos, type="hipStream_t" if arg == "stream" else "void*", name=arg,
                     value=value)  # fmt: skip
        self.ins("region", id=corr, nid=self.node, pid=self.pid, tid=tid, start=start, end=end, name_id=self.string(name),
                 event_id=e)  # fmt: skip
        return e

    def symbol(self, kid: int, mangled: str, display: str, vgpr: int, agpr: int, sgpr: int, lds: int):
        self.ins("info_kernel_symbol", id=kid, nid=self.node, pid=self.pid, code_object_id=1, kernel_name=mangled,
                 display_name=display, kernel_object=0x7F00_0000 + kid, kernarg_segment_size=64, kernarg_segment_alignment=8,
                 group_segment_size=lds, private_segment_size=0, sgpr_count=sgpr, arch_vgpr_count=vgpr,
                 accum_vgpr_count=agpr)  # fmt: skip

    def dispatch(self, did: int, kernel_id: int, corr: int, tid: int, agent: int, queue: int, stream: int, start: int,
                 end: int, lds: int, wg: tuple, grid: tuple, region_name: str | None = ""):  # fmt: skip
        e = self.event("KERNEL_DISPATCH", corr)
        self.ins("kernel_dispatch", id=did, nid=self.node, pid=self.pid, tid=tid, agent_id=agent, kernel_id=kernel_id,
                 dispatch_id=did, queue_id=queue, stream_id=stream, start=start, end=end, private_segment_size=0,
                 group_segment_size=lds, workgroup_size_x=wg[0], workgroup_size_y=wg[1], workgroup_size_z=wg[2],
                 grid_size_x=grid[0], grid_size_y=grid[1], grid_size_z=grid[2],
                 region_name_id=None if region_name is None else self.string(region_name), event_id=e)  # fmt: skip

    def copy(self, cid: int, corr: int, tid: int, start: int, end: int, direction: str, src: int, dst: int, size: int,
             stream: int):  # fmt: skip
        e = self.event("MEMORY_COPY", corr)
        self.ins("memory_copy", id=cid, nid=self.node, pid=self.pid, tid=tid, start=start, end=end,
                 name_id=self.string(direction), dst_agent_id=dst, dst_address=0x7F10_0000, src_agent_id=src,
                 src_address=0x5500_0000, size=size, stream_id=stream, event_id=e)  # fmt: skip


S1, S2 = "0x55d5c0a1e2f0", "0x55d5c0a1f3a0"  # hipStream_t handles of "Stream 0" and "Stream 1"
EV = "0x55d5c0b00040"  # a hipEvent_t


def populate(p: Process, t0: int = T0):
    """A GEMM on stream 1 overlapped with an RCCL all-reduce on stream 2 that waits on its event."""
    main, comm = p.pid, p.pid + 1
    p.symbol(1, "_Z14gemm_tile_64x64PKfPf", "gemm_tile_64x64(float const*, float*)", vgpr=128, agpr=64, sgpr=96, lds=16384)
    p.symbol(2, "_Z21ncclDevKernel_Generic24ncclDevKernelArgsStorageILm4096EE",
             "ncclDevKernel_Generic(ncclDevKernelArgsStorage<4096ul>)", vgpr=64, agpr=0, sgpr=32, lds=0)  # fmt: skip
    p.api(9, "roctxRangePushA", main, t0 + 800, t0 + 9_500, category="MARKER_CORE_RANGE_API",
          extdata=json.dumps({"message": "ProfilerStep#5"}))  # fmt: skip
    p.api(15, "hipMemcpyAsync", main, t0 + 900, t0 + 950, dst="0x7f1000000000", src="0x550000000000", sizeBytes="4096",
          kind="1", stream=S1)  # fmt: skip
    p.copy(1, 15, main, t0 + 960, t0 + 960, "MEMORY_COPY_HOST_TO_DEVICE", src=0, dst=p.gpu[0], size=4096, stream=1)  # zero-length
    p.api(10, "hipLaunchKernel", main, t0 + 1_000, t0 + 1_100, function_address="0x55d5a0000000", numBlocks="{32, 64, 1}",
          dimBlocks="{256, 1, 1}", args="0x7ffc00000000", sharedMemBytes="4096", stream=S1)  # fmt: skip
    p.dispatch(1, 1, 10, main, p.gpu[0], queue=1, stream=1, start=t0 + 2_000, end=t0 + 5_000, lds=20_480,
               wg=(256, 1, 1), grid=(8_192, 64, 1))  # fmt: skip
    p.api(11, "hipEventRecord", main, t0 + 1_200, t0 + 1_210, event=EV, stream=S1)
    p.api(12, "ncclAllReduce", comm, t0 + 1_300, t0 + 1_400, category="RCCL_API", sendbuff="0x7f2000000000",
          recvbuff="0x7f2000000000", count="1048576", datatype="7", op="0", comm="0x55d5c1000000", stream=S2)  # fmt: skip
    p.api(13, "hipStreamWaitEvent", comm, t0 + 1_310, t0 + 1_320, stream=S2, event=EV, flags="0")
    p.api(14, "hipExtLaunchKernel", comm, t0 + 1_330, t0 + 1_390, function_address="0x55d5a0001000",
          numBlocks="{8, 1, 1}", dimBlocks="{256, 1, 1}", args="0x7ffc00001000", sharedMemBytes="0", stream=S2)  # fmt: skip
    p.dispatch(2, 2, 14, comm, p.gpu[0], queue=2, stream=2, start=t0 + 5_100, end=t0 + 9_000, lds=0,
               wg=(256, 1, 1), grid=(2_048, 1, 1))  # fmt: skip
    # a dispatch whose region name row is missing: the `kernels` view drops it, the reader must not
    p.dispatch(3, 1, 18, main, p.gpu[1], queue=1, stream=1, start=t0 + 9_100, end=t0 + 9_300, lds=16_384,
               wg=(64, 4, 1), grid=(640, 8, 1), region_name=None)  # fmt: skip
    p.api(16, "hipStreamSynchronize", main, t0 + 9_100, t0 + 9_200, stream=S2)


def make_db(path: Path, *, envs=({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"},), views=True) -> Path:
    db = sqlite3.connect(path)
    for i, env in enumerate(envs):
        p = Process(db, (GUID_A, GUID_B)[i], 4242 + 1000 * i, env, create_views=views and i == 0)
        populate(p, T0 + 100_000 * i)
    db.commit()
    db.close()
    return path


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
