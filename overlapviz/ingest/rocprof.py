"""AMD rocprof outputs (legacy rocprof v1, rocprofv2 ``cli`` text, rocprofv3 CSV and JSON) as readers.

Formats and how they map to the dataset are documented in docs/amd.md. What the formats
share is in ``rocprof_common``; the parsing lives in ``rocprof_csv`` (v1 ``results.csv``,
v3 ``*_kernel_trace.csv`` and friends, v2 ``cli`` text) and ``rocprof_json`` (v1
``results.json``, v3 JSON).

Importing this module (as ``ingest.readers()`` does to sniff every file) imports no
pandas: the parsers that use it are imported by the readers' ``read``. rocprof profiles
processes, not ranks: its readers say so (``per_process``), and the ingest driver splits a
process that drives a collective on several GPUs into one rank per GPU, by the run's rules.
"""

from __future__ import annotations

import functools
import os
import re
from pathlib import Path

from overlapviz.ingest.base import RankTrace
from overlapviz.ingest.rocprof_common import V1_SIBLINGS, is_v1, v1_base, v3_group

# --- the readers --------------------------------------------------------------------


def _guarded(read):
    """A reader's ``read`` whose surprises in the file's structure (an object where a list
    belongs, a missing key, a number of the wrong kind) come out as one line naming the
    file, like every other refusal, instead of a traceback."""

    @functools.wraps(read)
    def guarded(self, path: Path):
        try:
            return read(self, path)
        except ValueError:
            raise
        except (TypeError, AttributeError, KeyError, IndexError, OverflowError, ArithmeticError,
                UnicodeError, NotImplementedError) as exc:  # fmt: skip
            from overlapviz.ingest.driver import DEBUG_ENV, raised_at  # (here: the driver imports the readers)

            if os.environ.get(DEBUG_ENV, "") not in ("", "0"):
                raise  # the traceback, as for an internal error (a one-off "KeyError: 30" in CI had none)
            first = (str(exc).strip().splitlines() or [""])[0][:200]
            raise ValueError(f"{path}: not a well-formed {self.name} file "
                             f"(unexpected content: {type(exc).__name__}: {first}{raised_at(exc)})") from None  # fmt: skip

    return guarded


class _Reader:
    name = ""
    per_process = True  # one trace per profiled process: the driver splits one driving several GPUs

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
        twin = path.with_name(v1_base(path) + ".json")
        return not (twin.exists() and is_v1(twin))

    @_guarded
    def read(self, path: Path) -> list[RankTrace]:
        from overlapviz.ingest.rocprof_csv import read_v1_csv

        return [read_v1_csv(path)]

    def companions(self, path: Path) -> list[Path]:
        base = v1_base(path)
        return [p for p in (path.with_name(base + s) for s in V1_SIBLINGS) if p.exists()]


class RocprofV1JsonReader(_Reader):
    """Legacy rocprof ``results.json`` (Chrome-trace-like, µs as strings, lanes by pid, rocminfo in otherData)."""

    name = "rocprof_v1_json"

    def sniff(self, path: Path, head: bytes) -> bool:
        doc = head.lstrip(b"\xef\xbb\xbf \t\r\n")
        if not (doc.startswith(b"{") and b'"traceEvents"' in doc):
            return False
        # exact ns times, or (a file without them, read from ts/dur) rocprof's own lane records
        return b'"BeginNs"' in doc or _V1_LANE.search(doc) is not None

    @_guarded
    def read(self, path: Path) -> list[RankTrace]:
        from overlapviz.ingest.rocprof_json import read_v1_json

        return [read_v1_json(path)]

    def companions(self, path: Path) -> list[Path]:
        base = v1_base(path)
        return [p for p in (path.with_name(base + s) for s in V1_SIBLINGS + (".csv",)) if p.exists()]


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

    @_guarded
    def read(self, path: Path) -> list[RankTrace]:
        from overlapviz.ingest.rocprof_csv import read_v3_csv

        return [read_v3_csv(path)]

    def companions(self, path: Path) -> list[Path]:
        return [p for p in v3_group(path).values() if p != path]


class RocprofV3JsonReader(_Reader):
    """rocprofv3 ``--output-format json`` (``{"rocprofiler-sdk-tool": [...]}``)."""

    name = "rocprof_v3_json"

    def sniff(self, path: Path, head: bytes) -> bool:
        # a JSON document whose (first) key is the tool's: not a text that merely mentions it
        return _V3_JSON_HEAD.match(head.lstrip(b"\xef\xbb\xbf")) is not None

    @_guarded
    def read(self, path: Path) -> list[RankTrace]:
        from overlapviz.ingest.rocprof_json import read_v3_json

        return read_v3_json(path)


class RocprofV2CliReader(_Reader):
    """rocprofv2 ``cli`` plugin text (``Dispatch_ID(1), GPU_ID(4), ...`` lines)."""

    name = "rocprof_v2_cli"

    def sniff(self, path: Path, head: bytes) -> bool:
        # the substring test first: a line-anchored search through 64 KiB of someone
        # else's JSON costs ~1 ms per file
        return (b"Dispatch_ID(" in head or b"Domain(" in head) and _V2_CLI_LINE.search(head) is not None

    @_guarded
    def read(self, path: Path) -> list[RankTrace]:
        from overlapviz.ingest.rocprof_csv import read_v2_cli

        return [read_v2_cli(path)]


class RocprofV2CsvReader(_Reader):
    """rocprofv2's file plugin kernel trace ``results_<pid>.csv`` (``Dispatch_ID,GPU_ID,Queue_ID,...``)."""

    name = "rocprof_v2_csv"

    def sniff(self, path: Path, head: bytes) -> bool:
        first = head.lstrip(b"\xef\xbb\xbf").split(b"\n", 1)[0].replace(b'"', b"")
        return first.startswith(b"Dispatch_ID,GPU_ID,Queue_ID,") and b"Kernel_Name" in first and b"Start_Timestamp" in first

    @_guarded
    def read(self, path: Path) -> list[RankTrace]:
        from overlapviz.ingest.rocprof_csv import read_v2_csv

        return [read_v2_csv(path)]


# rocprof v1 names its lanes first, in this exact form (Kineto writes "GPU 0" and other keys)
_V1_LANE = re.compile(rb'\{\s*"args"\s*:\s*\{\s*"name"\s*:\s*"(?:CPU HIP API|COPY|GPU\d+)"\s*\}\s*,\s*"ph"\s*:\s*"M"')
_V3_JSON_HEAD = re.compile(rb'\s*\{\s*"rocprofiler-sdk-tool"\s*:')
_V2_CLI_LINE = re.compile(rb"^(?:Dispatch_ID\(\d+\), |Domain\([A-Z_]+\), Function\()", re.MULTILINE)


READERS = [
    RocprofV3JsonReader(),
    RocprofV1JsonReader(),
    RocprofV3CsvReader(),
    RocprofV1CsvReader(),
    RocprofV2CliReader(),
    RocprofV2CsvReader(),
]
