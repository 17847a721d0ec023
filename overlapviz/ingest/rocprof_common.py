"""What AMD's rocprof formats share: kernel-table building, grid conversion, collective calls, AMD device rows, output-directory grouping.

The readers are in ``rocprof``; the parsing in ``rocprof_csv`` and ``rocprof_json``, which
import this module (and never ``rocprof``). Importing it imports no pandas: the helpers
that use it import it when called, from the readers' ``read``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable, Mapping

import numpy as np
import pyarrow as pa

if TYPE_CHECKING:  # for annotations only: the helpers that use pandas import it when called
    import pandas as pd

from overlapviz.domain.collectives import api_collective
from overlapviz.dataset.schema import DEVICES, KERNELS, conform

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
V1_SIBLINGS = (".stats.csv", ".hip_stats.csv", ".hsa_stats.csv", ".copy_stats.csv", ".sysinfo.txt", ".db", ".txt")


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


def kernel_table(columns: Mapping[str, Iterable], *, where: str, what: str = "activity",
                 row: Callable[[int], str] | None = None) -> pa.Table:  # fmt: skip
    """A reader's kernels table from column arrays (absent columns become null).

    Every number is range-checked for its column first (``ranges.check_ranges``): a
    grid of 2^40 blocks or a timestamp past int64 is refused naming ``where``, the row
    (``row(i)``, e.g. ``"line 7"``; else ``"<what> <i>"``) and the field.
    """
    from overlapviz.ingest.ranges import check_ranges

    n = None
    arrays = {}
    for name, values in columns.items():
        if name not in READER_KERNEL_SCHEMA.names:
            raise KeyError(f"not a kernels column: {name}")
        arr = values if isinstance(values, (pa.Array, pa.ChunkedArray)) else _to_arrow(values)
        arrays[name] = arr
        n = len(arr) if n is None else n
    table = pa.table(arrays) if arrays else pa.table({"start_ns": pa.array([], pa.int64())})
    check_ranges(table, READER_KERNEL_SCHEMA, where, what, row)
    return conform(table, READER_KERNEL_SCHEMA, where=where)


def csv_line(i: int) -> str:
    """The line of a CSV file that data row ``i`` (from 0) is on: the header is line 1."""
    return f"line {i + 2}"


_INT_TEXT = re.compile(r"^\s*[+-]?0*([0-9]+)\s*$")
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def parse_int(value, *, where: str = "", field: str = "", place: str = "") -> int | None:
    """One integer of a trace, exactly: an int (never a bool) or decimal digits; None for
    null or empty text. Refused, naming ``where``, ``place`` and ``field``: fractions,
    NaN, infinities, booleans, other text, and values outside int64."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None

    def refuse(reason: str):
        head = ": ".join(p for p in (where, place) if p)
        shown = repr(value[:40] if isinstance(value, str) else value)
        subject = f"{field} {shown}" if field else shown
        return ValueError(f"{head}: {subject} {reason}" if head else f"{subject} {reason}")

    if isinstance(value, bool):
        raise refuse("is a boolean, not a number")
    if isinstance(value, (int, np.integer)):
        number = int(value)
    elif isinstance(value, str) and (m := _INT_TEXT.match(value)):
        if len(m.group(1)) > 19:  # past int64 (and never a 4300-digit int() for Python to refuse)
            raise refuse("is outside the range of int64")
        number = int(value)
    elif isinstance(value, (float, np.floating)) and np.isfinite(value) and float(value).is_integer():
        number = int(value)
    else:
        raise refuse("is not an integer")
    if not INT64_MIN <= number <= INT64_MAX:
        raise refuse("is outside the range of int64")
    return number


def parse_ints(values, *, where: str, field: str, row: Callable[[int], str]) -> pd.Series:
    """``parse_int`` over a column (text or numbers) -> nullable Int64, the first bad value named by its row."""
    import pandas as pd

    out = []
    for i, v in enumerate(values):
        v = None if v is pd.NA or (isinstance(v, float) and np.isnan(v)) else v
        try:
            out.append(parse_int(v, where=where, field=field))
        except ValueError:
            parse_int(v, where=where, field=field, place=row(i))  # the same refusal, with its row
            raise
    return pd.Series(out, dtype="Int64")


def _to_arrow(values) -> pa.Array:
    if type(values).__module__.split(".")[0] == "pandas":  # a Series: pandas is imported already
        import pandas as pd

        # never the Series itself: pyarrow that does not take it for one reads it as a sequence, ``values[i]``, which a
        # Series answers by label: "KeyError: 30" for a rocprof v1 trace's kernels (rows 30... of its events), seen in a
        # worker process now and then
        if isinstance(values.dtype, pd.StringDtype) or values.dtype == object:
            return pa.array(values.astype(object).where(values.notna(), None).to_numpy(object), from_pandas=True)
        array = values.array
        return pa.array(array) if hasattr(array, "__arrow_array__") else pa.array(values.to_numpy(), from_pandas=True)
    if isinstance(values, np.ndarray):
        return pa.array(values)
    return pa.array(list(values))


def device_table(rows: list[dict], *, where: str) -> pa.Table:
    """A reader's devices table from row dicts (absent keys become null)."""
    from overlapviz.ingest.ranges import check_value

    if not rows:
        return READER_DEVICE_SCHEMA.empty_table()
    for i, r in enumerate(rows):
        for f in READER_DEVICE_SCHEMA:
            check_value(r.get(f.name), f.type, where, f"device {r.get('device', i)}: {f.name}")
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
    """Strip the code-object suffix rocprof keeps on some names (``foo.kd``, ``foo [clone .kd]``,
    rocprofv2's ``foo (.kd)``).

    rocprofv3's formatted names have neither, so the same kernel gets one name whatever the tool.
    """
    return names.str.replace(r"(?: \[clone \.kd\]| \(\.kd\)|\.kd)$", "", regex=True)


# --- collectives -------------------------------------------------------------------

def assign_collectives(kernels: pd.DataFrame, api: pd.DataFrame | None) -> pd.Series:
    """Collective of each kernel from the RCCL API call it was launched inside, on the same thread.

    Every kernel with a correlation id gets one (which kernels are communication is the
    run's rules' business: the ingest driver keeps the collective of comm kernels only).

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

    result = pd.Series(None, index=kernels.index, dtype=object)
    if api is None or api.empty or kernels.empty:
        return result
    calls = api.assign(collective=api["function"].map(api_collective)).dropna(subset=["collective", "correlation"])
    comm = kernels["correlation"].notna()
    if calls.empty or not comm.any():
        return result
    by_thread = "thread_id" in kernels and "thread_id" in calls and kernels.loc[comm, "thread_id"].notna().all()
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
    if value is None or isinstance(value, bool):  # a JSON true is not the number 1
        return None
    if isinstance(value, str):
        m = re.match(r"\s*([0-9]{1,18})", value)  # rocminfo: "64(0x40)", "64KB"
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
    v1 = [n for n in names if (n.endswith(".csv") or n.endswith(".json")) and is_v1(folder / n)]
    if v3 and v1:
        raise ValueError(
            f"{folder}: mixes legacy rocprof output ({v1[0]}) with rocprofv3 output ({v3[0]}); "
            "put each profiling run in its own directory"
        )


def _head(path: Path, n: int = 4096) -> bytes:
    """The first ``n`` bytes of ``path`` (gunzipped, as every reader sees it); empty when unreadable."""
    from overlapviz.ingest.files import head_bytes

    try:
        return head_bytes(path)[:n]
    except ValueError:
        return b""


def _is_v3_csv(path: Path) -> bool:
    head = _head(path, 512).lstrip(b"\xef\xbb\xbf")
    return head.startswith(b'"Kind"') or head.startswith(b'"Domain"') or head.startswith(b'"Node_Id"')


def is_v1(path: Path) -> bool:
    """Whether ``path`` is rocprof v1 output (``results.csv`` / ``results.json``), by its first bytes."""
    head = _head(path).lstrip(b"\xef\xbb\xbf")
    if path.suffix == ".csv":
        return head.startswith(b'"Index","KernelName"') or head.startswith(b"Index,KernelName")
    return head.lstrip().startswith(b"{") and b'"traceEvents"' in head and b'"BeginNs"' in head


def v1_base(path: Path) -> str:
    """The name a rocprof v1 output file and its siblings (``V1_SIBLINGS``) share: ``results`` of ``results.csv``."""
    name = path.name
    for suffix in (".json", ".csv"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return path.stem
