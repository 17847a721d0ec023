"""The hostile-input tests' inputs and invariants, shared by test_hostile, test_fuzz and test_crash: the real
traces they start from, the CLI as a user runs it, ``snapshot`` (a tree byte for byte) and ``check_dataset``."""

from __future__ import annotations
import gzip
import hashlib
import json
import os
import stat
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from click.testing import CliRunner
from overlapviz.dataset import schema
from overlapviz.cli import main


DATA = Path(__file__).parent / "data"
HOSTILE = DATA / "hostile"
EVENT_SYNC = HOSTILE / "event_sync_trace.json.gz"  # A100, cuda_sync records, rank 0
MI250 = HOSTILE / "mi250_rocm62_kineto.json.gz"  # ROCm 6.2, no distributedInfo
ROCPROF_V3 = DATA / "rocprof" / "v3" / "rocprofiler_sdk_docs_data"
ROCPROF_V3_JSON = DATA / "rocprof" / "v3" / "tracelens_mi350x_json" / "908_results.json.gz"
ROCPROF_V1_CSV = DATA / "rocprof" / "v1" / "llamacpp_gfx1201_stats" / "results.csv"
ROCPROF_V2 = DATA / "rocprof" / "v2" / "rocprofiler_goldentraces" / "hip_vectoradd_golden_traces.txt"
NSYS = DATA / "nsys" / "mock.sqlite"


# the installed command, as a user runs it (for inputs that could hang or crash a process)
_SCRIPT = Path(sys.executable).with_name("overlapviz")
CLI = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-c", "from overlapviz.cli import main; main()"]


def snapshot(root: Path) -> dict:
    """Everything under ``root``, byte for byte: files by content hash and mode, links by
    target, directories and special files by type and mode (nothing followed)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(os.fsencode(root)):
        for name in dirnames + filenames:
            p = os.path.join(dirpath, name)
            rel = os.path.relpath(p, os.fsencode(root))
            st = os.lstat(p)
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("link", os.readlink(p))
            elif stat.S_ISREG(st.st_mode):
                with open(p, "rb") as fh:
                    out[rel] = ("file", st.st_mode, hashlib.sha256(fh.read()).hexdigest())
            else:
                out[rel] = ("other", st.st_mode)
    return out


@dataclass
class Run:
    """One ingest to try: its arguments and what the error must name."""

    sources: list
    out: Path
    args: list = field(default_factory=list)
    names: str | None = None  # what else the one-line error must say (the field, the rule broken)
    culprit: object = None  # the file it must name (default: the first source), shown
    env: dict = field(default_factory=dict)
    root: Path | None = None  # what must stay unchanged (default: the whole workspace)


def shown(path) -> str:
    from overlapviz.ingest.files import display

    return display(path)


def invoke(run: Run, *, subprocess_cli: bool = False, timeout: float = 60):
    """Run ``overlapviz ingest``; return (exit code, output text)."""
    argv = ["ingest", *[str(s) for s in run.sources], "-o", str(run.out), "--quiet", *run.args]
    if subprocess_cli:
        env = dict(os.environ, **run.env)
        r = subprocess.run([*CLI, *argv], capture_output=True, timeout=timeout, env=env, check=False)
        text = (r.stdout + r.stderr).decode("utf-8", "backslashreplace")
        return r.returncode, text, None
    result = CliRunner().invoke(main, argv, env=run.env or None)
    return result.exit_code, result.output, result.exception


def check_dataset(out: Path) -> None:
    """A complete, readable dataset (read through Python's open: the path need not be UTF-8)."""
    import pyarrow.parquet as pq

    meta = json.loads((out / "dataset.json").read_bytes())
    assert meta["schema_version"] == schema.SCHEMA_VERSION
    rows = 0
    for rel in meta["kernel_files"]:
        with open(out / rel, "rb") as fh:
            rows += pq.ParquetFile(fh).read().num_rows
    assert rows == meta["n_kernels"]
    for name in schema.TABLES:
        with open(out / f"{name}.parquet", "rb") as fh:
            pq.ParquetFile(fh).read()
    assert not (out / ".overlapviz-incomplete").exists()


_V3_JSON: dict = {}


def small_v3_json() -> dict:
    """The real rocprofv3 JSON (MI350X), cut to its first records of each kind: a fresh copy."""
    if not _V3_JSON:
        doc = json.loads(gzip.decompress(ROCPROF_V3_JSON.read_bytes()))
        for tool in doc["rocprofiler-sdk-tool"]:
            buffers = tool.get("buffer_records") or {}
            for k, v in list(buffers.items()):
                if isinstance(v, list):
                    buffers[k] = v[:40]
            for k in list(tool):
                if k not in ("metadata", "agents", "strings", "kernel_symbols", "buffer_records"):
                    tool.pop(k)
            # only the kernel symbols and agents the kept records name (the whole file's are 18 MB)
            used = {r["dispatch_info"]["kernel_id"] for r in buffers.get("kernel_dispatch") or []}
            symbols = tool["kernel_symbols"]
            symbols = symbols if isinstance(symbols, list) else list(symbols.values())
            tool["kernel_symbols"] = [sym for sym in symbols if sym.get("kernel_id") in used]
            handles = {r["dispatch_info"]["agent_id"]["handle"] for r in buffers.get("kernel_dispatch") or []}
            tool["agents"] = [a for a in tool["agents"] if (a.get("id") or {}).get("handle") in handles]
        _V3_JSON["doc"] = doc
    return json.loads(json.dumps(_V3_JSON["doc"]))

