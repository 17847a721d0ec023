"""AMD rocprof outputs (legacy rocprof v1, rocprofv2 ``cli`` text, rocprofv3 CSV and JSON) as readers.

Formats and how they map to the dataset are documented in docs/amd.md. This module
holds what the formats share (kernel-table building, grid conversion, collective
names, AMD device rows, output-directory grouping) and the ``READERS`` registry; the
parsing lives in ``rocprof_csv`` (v1 ``results.csv``, v3 ``*_kernel_trace.csv`` and
friends, v2 ``cli`` text) and ``rocprof_json`` (v1 ``results.json``, v3 JSON).

Importing this module (as ``ingest.readers()`` does to sniff every file) imports no
pandas: the helpers that use it import it when called, from the readers' ``read``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Mapping

import numpy as np
import pyarrow as pa

if TYPE_CHECKING:  # for annotations only: the helpers that use pandas import it when called
    import pandas as pd

from overlapviz.ingest.base import RankTrace, rank_from_name
from overlapviz.schema import DEVICES, KERNELS, conform

# columns a reader fills (the driver adds run_id, rank, kind and step)
READER_KERNEL_SCHEMA = pa.schema([f for f in KERNELS if f.name not in ("run_id", "rank", "kind", "step")])
READER_DEVICE_SCHEMA = pa.schema([f for f in DEVICES if f.name not in ("run_id", "rank")])

# --- rocprofv3 CSV file roles, by file-name suffix (the prefix is rocprofv3's -o/--output-file) ---
V3_TRACE_ROLES = (
    "kernel_trace",
    "memory_copy_trace",
    "memory_allocation_trace",
    "scratch_memory_trace",
    "counter_collection",
    "agent_info",
)
_V3_API_DOMAINS = "hip|hip_api|hsa|hsa_api|rccl|rccl_api|marker|marker_api|rocdecode_api|rocjpeg_api|kfd|ompt"
_V3_STATS = f"kernel|{_V3_API_DOMAINS}|memory_copy|memory_allocation|scratch_memory|domain|counter_collection"
_V3_NAME = re.compile(
    rf"^(?P<prefix>.*?)(?P<role>{'|'.join(V3_TRACE_ROLES)}|(?:{_V3_API_DOMAINS})_trace|(?:{_V3_STATS})_stats)\.csv$"
)
# legacy rocprof v1 writes <base>.csv next to <base>.stats.csv, <base>.json, <base>.sysinfo.txt, ...
_V1_SIBLINGS = (".stats.csv", ".hip_stats.csv", ".hsa_stats.csv", ".copy_stats.csv", ".sysinfo.txt", ".db", ".txt")


def v3_csv_role(path: Path) -> tuple[str, str] | None:
    """``(prefix, role)`` of a rocprofv3 CSV file name, e.g. ``("908", "kernel_trace")``; None if not one."""
    m = _V3_NAME.match(path.name)
    if not m:
        return None
    return m.group("prefix").rstrip("_-."), m.group("role")


def v3_group(path: Path) -> dict[str, Path]:
    """The rocprofv3 CSV files of ``path``'s process: same directory, same file-name prefix, by role."""
    mine = v3_csv_role(path)
    if mine is None:
        return {}
    prefix = mine[0]
    group = {}
    try:
        siblings = sorted(p for p in path.parent.iterdir() if p.is_file())
    except OSError:
        return {mine[1]: path}
    for p in siblings:
        role = v3_csv_role(p)
        if role is not None and role[0] == prefix:
            group[role[1]] = p
    return group


def kernel_table(columns: Mapping[str, Iterable], *, where: str) -> pa.Table:
    """A reader's kernels table from column arrays (absent columns become null)."""
    n = None
    arrays = {}
    for name, values in columns.items():
        if name not in READER_KERNEL_SCHEMA.names:
            raise KeyError(f"not a kernels column: {name}")
        arr = values if isinstance(values, (pa.Array, pa.ChunkedArray)) else _to_arrow(values)
        arrays[name] = arr
        n = len(arr) if n is None else n
    table = pa.table(arrays) if arrays else pa.table({"start_ns": pa.array([], pa.int64())})
    return conform(table, READER_KERNEL_SCHEMA, where=where)


def _to_arrow(values) -> pa.Array:
    if type(values).__module__.split(".")[0] == "pandas":  # a Series: pandas is imported already
        import pandas as pd

        if isinstance(values.dtype, pd.StringDtype) or values.dtype == object:
            return pa.array(values.astype(object).where(values.notna(), None), from_pandas=True)
        return pa.Array.from_pandas(values)
    if isinstance(values, np.ndarray):
        return pa.array(values)
    return pa.array(list(values))


def device_table(rows: list[dict], *, where: str) -> pa.Table:
    """A reader's devices table from row dicts (absent keys become null)."""
    if not rows:
        return READER_DEVICE_SCHEMA.empty_table()
    cols = {f.name: [r.get(f.name) for r in rows] for f in READER_DEVICE_SCHEMA}
    table = pa.table({k: pa.array(v, READER_DEVICE_SCHEMA.field(k).type) for k, v in cols.items()})
    return conform(table, READER_DEVICE_SCHEMA, where=where)


def blocks(work_items, workgroup):
    """Work-groups (blocks) from work-items: ``ceil(work_items / workgroup)``, null where unknown or 0.

    rocprof reports the HSA dispatch grid in work-items; the dataset stores blocks.
    """
    import pandas as pd

    g = pd.Series(work_items, dtype="Int64")
    w = pd.Series(workgroup, dtype="Int64", index=g.index)
    w = w.where(w > 0)
    return (-(-g // w)).astype("Int64")


def ones_where(values: pd.Series | None) -> pd.Series | None:
    """1 where ``values`` is known, null elsewhere (the unit y/z extents of a 1-D grid); None if None."""
    if values is None:
        return None
    import pandas as pd

    return pd.Series(1, index=values.index, dtype="Int64").where(values.notna())


def clean_kernel_names(names: pd.Series) -> pd.Series:
    """Strip the code-object suffix rocprof keeps on some names (``foo.kd``, ``foo [clone .kd]``).

    rocprofv3's formatted names have neither, so the same kernel gets one name whatever the tool.
    """
    return names.str.replace(r"(?: \[clone \.kd\]|\.kd)$", "", regex=True)


# --- collectives -------------------------------------------------------------------

_COLLECTIVE_WORDS = {
    "allreduce": "all_reduce",
    "reducescatter": "reduce_scatter",
    "allgather": "all_gather",
    "alltoall": "all_to_all",
    "alltoallv": "all_to_all",
    "sendrecv": "send_recv",
    "send": "send_recv",
    "recv": "send_recv",
    "broadcast": "broadcast",
    "bcast": "broadcast",
    "reduce": "reduce",
    "gather": "gather",
    "scatter": "scatter",
}
_API_COLLECTIVE = re.compile(r"^(?:nccl|rccl|mscclx?)_?([a-z_]+?)_?$", re.IGNORECASE)


def api_collective(function: str | None) -> str | None:
    """``ncclAllReduce`` -> ``all_reduce``; None for RCCL calls that are not collectives (ncclGroupEnd, ...)."""
    if not function:
        return None
    m = _API_COLLECTIVE.match(function)
    if not m:
        return None
    return _COLLECTIVE_WORDS.get(m.group(1).replace("_", "").lower())


def assign_collectives(kernels: pd.DataFrame, api: pd.DataFrame | None) -> pd.Series:
    """Collective of each comm-looking kernel from the RCCL API calls of the same thread.

    A kernel launched inside ``ncclAllReduce`` gets a correlation id after the call's
    own (ids are handed out at API entry, in order, per process), so the collective is
    the RCCL collective call with the largest correlation id not above the kernel's,
    on the kernel's thread when both sides carry one. Calls that are not collectives
    (ncclCommGetAsyncError, nested inside the collective) are skipped. Null where no
    such call exists; the ingest driver also reads the collective from kernel names
    (older RCCL: ``ncclKernel_AllReduce_RING_LL_Sum_f32``) and prefers the name.

    Parameters
    ----------
    kernels
        Columns ``name``, ``correlation`` and optionally ``thread_id``.
    api
        RCCL API calls: ``function``, ``correlation`` and optionally ``thread_id``; None if absent.
    """
    import pandas as pd

    from overlapviz.rules import COMM_PATTERN

    result = pd.Series(None, index=kernels.index, dtype=object)
    if api is None or api.empty or kernels.empty:
        return result
    calls = api.assign(collective=api["function"].map(api_collective)).dropna(subset=["collective", "correlation"])
    comm = kernels["name"].str.contains(COMM_PATTERN, case=False, regex=True, na=False) & kernels["correlation"].notna()
    if calls.empty or not comm.any():
        return result
    by_thread = "thread_id" in kernels and "thread_id" in calls and kernels["thread_id"].notna().all()
    left = (
        kernels.loc[comm, ["correlation"] + (["thread_id"] if by_thread else [])]
        .assign(correlation=lambda d: d["correlation"].astype("int64"), _row=lambda d: d.index)
        .sort_values("correlation")
    )
    right = calls[["correlation", "collective"] + (["thread_id"] if by_thread else [])].astype(
        {"correlation": "int64"} | ({"thread_id": "int64"} if by_thread else {})
    )
    if by_thread:
        left = left.astype({"thread_id": "int64"})
    found = pd.merge_asof(
        left,
        right.sort_values("correlation"),
        on="correlation",
        by="thread_id" if by_thread else None,
        direction="backward",
    ).set_index("_row")["collective"]
    found = found.dropna()
    return result.where(~result.index.isin(found.index), found.reindex(result.index))


# --- AMD devices ------------------------------------------------------------------


def gfx_arch(name: str | None, target_version=None) -> str | None:
    """``gfx942`` from an agent name, or from ``gfx_target_version`` (90402 -> gfx942, 90010 -> gfx90a)."""
    if name:
        m = re.search(r"gfx[0-9a-f]+", str(name))
        if m:
            return m.group(0)
    try:
        v = int(target_version)
    except (TypeError, ValueError):
        return None
    if v <= 0:
        return None
    major, minor, step = v // 10000, (v // 100) % 100, v % 100
    return f"gfx{major}{minor:x}{step:x}"


def _pos(value) -> int | None:
    """A positive int, or None for absent/zero/unparsable values (rocprof writes 0 for 'unknown')."""
    if value is None:
        return None
    if isinstance(value, str):
        m = re.match(r"\s*(\d+)", value)  # rocminfo: "64(0x40)", "64KB"
        if not m:
            return None
        value = m.group(1)
    try:
        v = int(value)
    except (TypeError, ValueError):
        return None
    return v if v > 0 else None


def amd_device_row(device: int | None, agent: Mapping) -> dict:
    """A DEVICES row from a rocprofiler agent record (rocprofv3 JSON ``agents`` / ``agent_info.csv``).

    Only what the record says: CUs, SIMDs per CU, waves per SIMD, wave size, LDS per
    CU, work-group size, memory; the residency module completes the rest (VGPR/SGPR
    files, work-group slots) from its per-arch tables, keyed by ``arch``.
    """
    a = {str(k).lower(): v for k, v in agent.items()}
    wave = _pos(a.get("wave_front_size"))
    waves_cu = _pos(a.get("max_waves_per_cu"))
    simds = _pos(a.get("simd_per_cu"))
    waves_simd = _pos(a.get("max_waves_per_simd"))
    if waves_simd is None and waves_cu and simds and waves_cu % simds == 0:
        waves_simd = waves_cu // simds
    lds_kb = _pos(a.get("lds_size_in_kb"))
    banks = a.get("mem_banks") or []
    mem = sum(int(b.get("size_in_bytes") or 0) for b in banks if b.get("heap_type") in (1, 2)) or None
    arch = gfx_arch(a.get("name"), a.get("gfx_target_version"))
    product = a.get("product_name") or a.get("marketing_name") or a.get("name")
    return {
        "device": device,
        "name": str(product).strip() if product else None,
        "vendor": "amd",
        "arch": arch,
        "num_sms": _pos(a.get("cu_count")),
        "max_threads_per_sm": waves_cu * wave if waves_cu and wave else None,
        "max_threads_per_block": _pos(a.get("workgroup_max_size")),
        "shared_mem_per_sm": lds_kb * 1024 if lds_kb else None,
        "shared_mem_per_block": _pos(a.get("group_segment_bytes")),
        "warp_size": wave,
        "total_mem_bytes": mem if mem else _pos(a.get("total_mem_bytes")),
        "simds_per_cu": simds,
        "max_waves_per_simd": waves_simd,
        "lds_per_cu": lds_kb * 1024 if lds_kb else None,
    }


def rocminfo_agents(info: Mapping[str, str]) -> list[dict]:
    """GPU agents from rocprof v1's flattened rocminfo (``otherData`` of results.json: ``Agent5.ComputeUnit``...).

    Returns agent dicts in rocprofv3's field names (for ``amd_device_row``), in agent
    order, so the i-th one is HIP device i.
    """
    agents: dict[int, dict] = {}
    for key, value in info.items():
        m = re.match(r"Agent(\d+)\.(.+)$", key)
        if m:
            agents.setdefault(int(m.group(1)), {})[m.group(2)] = value
    out = []
    for _, a in sorted(agents.items()):
        if str(a.get("DeviceType", "")).upper() != "GPU":
            continue
        group = [
            a.get(k.replace(".Segment", ".Size"))
            for k, v in a.items()
            if k.startswith("PoolInfo.") and k.endswith(".Segment") and str(v).startswith("GROUP")
        ]
        glob = [
            a.get(k.replace(".Segment", ".Size"))
            for k, v in a.items()
            if k.startswith("PoolInfo.") and k.endswith(".Segment") and str(v).startswith("GLOBAL")
        ]
        group_kb, glob_kb = _pos(group[0]) if group else None, _pos(glob[0]) if glob else None
        out.append(
            {
                "name": a.get("Name"),
                "product_name": a.get("MarketingName"),
                "cu_count": a.get("ComputeUnit"),
                "simd_per_cu": a.get("SIMDsperCU"),
                "wave_front_size": a.get("WavefrontSize"),
                "workgroup_max_size": a.get("WorkgroupMaxSize"),
                "max_waves_per_cu": a.get("MaxWavesPerCU"),
                "group_segment_bytes": group_kb * 1024 if group_kb else None,
                "total_mem_bytes": glob_kb * 1024 if glob_kb else None,
            }
        )
    return out


def parse_rocminfo(text: str) -> dict[str, str]:
    """rocminfo's text (rocprof v1's ``<base>.sysinfo.txt``) flattened like ``otherData`` of results.json.

    ``Agent 2`` / ``Compute Unit: 64`` becomes ``{"Agent2.ComputeUnit": "64"}``; pool lines
    become ``Agent2.PoolInfo.Pool1.Segment``...; ISA sections are skipped. Feed the
    result to ``rocminfo_agents``.
    """
    out: dict[str, str] = {}
    agent = pool = None
    for line in text.splitlines():
        stripped = line.strip()
        m = re.fullmatch(r"Agent\s+(\d+)", stripped)
        if m:
            agent, pool = f"Agent{m.group(1)}", None
            continue
        if agent is None or not stripped or stripped.startswith("*"):
            continue
        indent = len(line) - len(line.lstrip())
        m = re.fullmatch(r"Pool\s+(\d+)", stripped)
        if m and indent >= 4:
            pool = f"PoolInfo.Pool{m.group(1)}"
            continue
        key, sep, value = stripped.partition(":")
        if not sep:
            continue
        key = key.replace(" ", "")
        if indent <= 2:
            pool = "skip" if key == "ISAInfo" else None
            out[f"{agent}.{key}"] = value.strip()
        elif pool and pool != "skip" and indent >= 6:
            out[f"{agent}.{pool}.{key}"] = value.strip()
    return out


# --- ranks ------------------------------------------------------------------------

def check_one_generation(path: Path) -> None:
    """Refuse a directory holding both legacy rocprof (v1) and rocprofv3 CSV output.

    The two generations number agents, queues and correlation ids differently, so
    their files cannot be combined into one run; the user must separate them.

    Raises
    ------
    ValueError
        Naming one file of each generation.
    """
    folder = path.parent
    try:
        names = sorted(p.name for p in folder.iterdir() if p.is_file())
    except OSError:
        return
    v3 = [n for n in names if n.endswith(".csv") and v3_csv_role(Path(n)) is not None and _is_v3_csv(folder / n)]
    v1 = [n for n in names if (n.endswith(".csv") or n.endswith(".json")) and _is_v1(folder / n)]
    if v3 and v1:
        raise ValueError(
            f"{folder}: mixes legacy rocprof output ({v1[0]}) with rocprofv3 output ({v3[0]}); "
            "put each profiling run in its own directory"
        )


def _head(path: Path, n: int = 4096) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read(n)
    except OSError:
        return b""


def _is_v3_csv(path: Path) -> bool:
    head = _head(path, 512).lstrip(b"\xef\xbb\xbf")
    return head.startswith(b'"Kind"') or head.startswith(b'"Domain"') or head.startswith(b'"Node_Id"')


def _is_v1(path: Path) -> bool:
    head = _head(path).lstrip(b"\xef\xbb\xbf")
    if path.suffix == ".csv":
        return head.startswith(b'"Index","KernelName"') or head.startswith(b"Index,KernelName")
    return head.lstrip().startswith(b"{") and b'"traceEvents"' in head and b'"BeginNs"' in head


def split_multi_gpu(traces: list[RankTrace]) -> list[RankTrace]:
    """One rank per GPU for a process that drives a collective on several GPUs itself.

    rocprof profiles processes, but overlap is a per-GPU question: a single process
    running RCCL over several GPUs (``ncclCommInitAll``, rccl-tests' ``-g N``) would
    otherwise have GPU 1's communication "overlap" GPU 0's computation. Such a process
    (communication kernels, by the default ``nccl|rccl|msccl`` pattern, on two or more
    devices) becomes one rank per device, numbered by device index; activities without
    a device go with the first. Processes whose rank is named in their file name, or
    that only touch a second GPU in passing (no collective there), stay one rank.
    """
    from overlapviz.rules import COMM_PATTERN

    out = []
    for t in traces:
        k = t.kernels
        if t.rank is not None or k.num_rows == 0:
            out.append(t)
            continue
        frame = k.select(["device", "name", "category"]).to_pandas()  # rocprof's read imported pandas
        comm = (frame["category"] == "kernel") & frame["name"].str.contains(COMM_PATTERN, case=False, regex=True)
        comm_devices = sorted(int(d) for d in frame.loc[comm, "device"].dropna().unique())
        if len(comm_devices) < 2:
            out.append(t)
            continue
        devices = sorted(int(d) for d in frame["device"].dropna().unique())
        for i, dev in enumerate(devices):
            mask = (frame["device"] == dev).fillna(False)
            if i == 0:
                mask |= frame["device"].isna()
            dev_rows = t.devices
            if dev_rows is not None and dev_rows.num_rows:
                keep = (dev_rows.column("device").to_pandas() == dev).fillna(False).to_numpy()
                dev_rows = dev_rows.filter(pa.array(keep))
            part = k.filter(pa.array(mask.to_numpy()))
            out.append(RankTrace(rank=dev, kernels=part, steps=t.steps, devices=dev_rows,
                                 info=t.info | {"n_events": part.num_rows}))  # fmt: skip
    return out


# --- the readers --------------------------------------------------------------------


class _Reader:
    name = ""

    def companions(self, path: Path) -> list[Path]:
        return []


class RocprofV1CsvReader(_Reader):
    """Legacy rocprof ``results.csv`` (``--stats`` / ``--timestamp on`` kernel table)."""

    name = "rocprof_v1_csv"

    def sniff(self, path: Path, head: bytes) -> bool:
        text = head.lstrip(b"\xef\xbb\xbf")
        first = text.split(b"\n", 1)[0].replace(b'"', b"")
        if not (first.startswith(b"Index,KernelName,") and b"BeginNs" in first):
            return False
        # rocprof wrote <base>.json beside it: that file is the process (it reads this one for details)
        twin = path.with_name(_v1_base(path) + ".json")
        return not (twin.exists() and _is_v1(twin))

    def read(self, path: Path) -> list[RankTrace]:
        from overlapviz.ingest.rocprof_csv import read_v1_csv

        return split_multi_gpu([read_v1_csv(path)])

    def companions(self, path: Path) -> list[Path]:
        base = _v1_base(path)
        return [p for p in (path.with_name(base + s) for s in _V1_SIBLINGS) if p.exists()]


class RocprofV1JsonReader(_Reader):
    """Legacy rocprof ``results.json`` (Chrome-trace-like, µs as strings, lanes by pid, rocminfo in otherData)."""

    name = "rocprof_v1_json"

    def sniff(self, path: Path, head: bytes) -> bool:
        doc = head.lstrip(b"\xef\xbb\xbf \t\r\n")
        return doc.startswith(b"{") and b'"traceEvents"' in doc and b'"BeginNs"' in doc

    def read(self, path: Path) -> list[RankTrace]:
        from overlapviz.ingest.rocprof_json import read_v1_json

        return split_multi_gpu([read_v1_json(path)])

    def companions(self, path: Path) -> list[Path]:
        base = _v1_base(path)
        return [p for p in (path.with_name(base + s) for s in _V1_SIBLINGS + (".csv",)) if p.exists()]


class RocprofV3CsvReader(_Reader):
    """rocprofv3 CSV output: ``<prefix>kernel_trace.csv`` and its siblings of the same prefix."""

    name = "rocprof_v3_csv"

    def sniff(self, path: Path, head: bytes) -> bool:
        first = head.lstrip(b"\xef\xbb\xbf").split(b"\n", 1)[0].replace(b'"', b"")
        if first.startswith(b"Kind,Agent_Id,Queue_Id,") and b"Kernel_Name" in first:
            return True
        # a memory-copy trace stands for the process only when it has no kernel trace
        if first.startswith(b"Kind,Direction,") and b"Start_Timestamp" in first:
            return "kernel_trace" not in v3_group(path)
        return False

    def read(self, path: Path) -> list[RankTrace]:
        from overlapviz.ingest.rocprof_csv import read_v3_csv

        return split_multi_gpu([read_v3_csv(path)])

    def companions(self, path: Path) -> list[Path]:
        return [p for p in v3_group(path).values() if p != path]


class RocprofV3JsonReader(_Reader):
    """rocprofv3 ``--output-format json`` (``{"rocprofiler-sdk-tool": [...]}``)."""

    name = "rocprof_v3_json"

    def sniff(self, path: Path, head: bytes) -> bool:
        # a JSON document whose (first) key is the tool's: not a text that merely mentions it
        return _V3_JSON_HEAD.match(head.lstrip(b"\xef\xbb\xbf")) is not None

    def read(self, path: Path) -> list[RankTrace]:
        from overlapviz.ingest.rocprof_json import read_v3_json

        return split_multi_gpu(read_v3_json(path))


class RocprofV2CliReader(_Reader):
    """rocprofv2 ``cli`` plugin text (``Dispatch_ID(1), GPU_ID(4), ...`` lines)."""

    name = "rocprof_v2_cli"

    def sniff(self, path: Path, head: bytes) -> bool:
        # the substring test first: a line-anchored search through 64 KiB of someone
        # else's JSON costs ~1 ms per file
        return (b"Dispatch_ID(" in head or b"Domain(" in head) and _V2_CLI_LINE.search(head) is not None

    def read(self, path: Path) -> list[RankTrace]:
        from overlapviz.ingest.rocprof_csv import read_v2_cli

        return split_multi_gpu([read_v2_cli(path)])


_V3_JSON_HEAD = re.compile(rb'\s*\{\s*"rocprofiler-sdk-tool"\s*:')
_V2_CLI_LINE = re.compile(rb"^(?:Dispatch_ID\(\d+\), |Domain\([A-Z_]+\), Function\()", re.MULTILINE)


def _v1_base(path: Path) -> str:
    name = path.name
    for suffix in (".json", ".csv"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return path.stem


READERS = [
    RocprofV3JsonReader(),
    RocprofV1JsonReader(),
    RocprofV3CsvReader(),
    RocprofV1CsvReader(),
    RocprofV2CliReader(),
]
