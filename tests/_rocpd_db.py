"""rocpd databases for the tests (test_rocpd, test_hostile, test_sqlite_reader).

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


MI350X_JSON = Path(__file__).parent / "data" / "rocprof" / "v3" / "tracelens_mi350x_json" / "908_results.json.gz"


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

