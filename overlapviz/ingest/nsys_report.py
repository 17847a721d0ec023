"""Nsight Systems reports (``.nsys-rep``, older ``.qdrep``) as a reader: exported to SQLite with the user's ``nsys``, then read as an export.

The export goes to a temporary directory (``$OVERLAPVIZ_NSYS_EXPORT_DIR``, else the system's
temporary directory), never beside the user's report, and is deleted once read. Without an
``nsys`` the error names the report and the command that exports it. A report with its
export beside it (``nsys export`` writes ``report.sqlite`` next to ``report.nsys-rep``) is
read from that export: see ``NsysReader.companions``.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from overlapviz.ingest.base import RankTrace
from overlapviz.ingest.sqlite_common import SQLITE_MAGIC

__all__ = ["NsysReportReader", "REPORT_SUFFIXES", "export_command", "find_nsys", "read_report"]

REPORT_SUFFIXES = (".nsys-rep", ".qdrep")  # Nsight Systems 2021.4+, and before
NSYS_ENV = "OVERLAPVIZ_NSYS"  # the nsys executable to use
EXPORT_DIR_ENV = "OVERLAPVIZ_NSYS_EXPORT_DIR"  # where exports are written (and deleted)
TIMEOUT_ENV = "OVERLAPVIZ_NSYS_TIMEOUT"  # seconds one export may take
DEFAULT_TIMEOUT_S = 3600.0
# where the Nsight Systems installers put nsys when it is not on the PATH
_INSTALL_GLOBS = ("/opt/nvidia/nsight-systems*/bin/nsys", "/opt/nvidia/nsight-systems*/*/bin/nsys",
                  "/usr/local/cuda*/bin/nsys", "/usr/local/cuda*/nsight-systems*/bin/nsys")  # fmt: skip


class NsysReportReader:
    """A ``.nsys-rep`` / ``.qdrep`` report: claimed by its name, after every format claimed by content."""

    name = "nsys_report"
    per_process = True

    def sniff(self, path: Path, head: bytes) -> bool:
        # the report's own container is not documented: claim the name, unless the content is
        # one of the text or SQLite formats read elsewhere (a renamed export, a JSON trace)
        return (path.name.lower().endswith(REPORT_SUFFIXES) and bool(head)
                and not head.startswith(SQLITE_MAGIC) and head.lstrip()[:1] not in (b"{", b"["))  # fmt: skip

    def read(self, path: Path) -> list[RankTrace]:
        return read_report(path)


READERS = [NsysReportReader()]


def export_command(report: Path, output: Path | str = "REPORT.sqlite", nsys: str = "nsys") -> list[str]:
    """The ``nsys export`` command line that writes ``report``'s SQLite export to ``output``."""
    return [nsys, "export", "--type", "sqlite", "--output", str(output), str(report)]


def find_nsys() -> str | None:
    """``$OVERLAPVIZ_NSYS``; else ``nsys`` on the PATH; else the newest ``/opt/nvidia/nsight-systems*/bin/nsys``.

    Raises
    ------
    ValueError
        ``$OVERLAPVIZ_NSYS`` names something that is not an executable file.
    """
    given = os.environ.get(NSYS_ENV)
    if given:
        if not (os.path.isfile(given) and os.access(given, os.X_OK)):
            raise ValueError(f"${NSYS_ENV}={given} is not an executable file")
        return given
    found = shutil.which("nsys")
    if found:
        return found
    import glob

    installed = [p for g in _INSTALL_GLOBS for p in glob.glob(g) if os.access(p, os.X_OK)]
    return max(installed, key=_version_key) if installed else None


def _version_key(path: str) -> tuple:
    return tuple(int(n) for n in re.findall(r"\d+", path))


def read_report(path: str | Path) -> list[RankTrace]:
    """Export ``path`` with ``nsys export --type sqlite`` into a temporary directory and read the export.

    A progress line goes to stderr before and after the export (it can take minutes for a
    large report). Each rank's ``source_path`` is the report.

    Raises
    ------
    ValueError
        One line naming the report: no ``nsys`` (with the command to run instead), the
        export failed or ran past ``$OVERLAPVIZ_NSYS_TIMEOUT`` seconds (default 3600), or
        what the SQLite reader says of the export.
    """
    from overlapviz.ingest.nsys import read_nsys  # the SQLite reader, imported when a report is read

    path = Path(path)
    nsys = find_nsys()
    if nsys is None:
        cmd = shlex.join(export_command(path, path.with_suffix(".sqlite")))
        raise ValueError(f"{path}: an Nsight Systems report, and no nsys to export it (install Nsight Systems, put nsys "
                         f"on the PATH or set ${NSYS_ENV}), or export it yourself and ingest the .sqlite: {cmd}")  # fmt: skip
    timeout = _timeout()
    with tempfile.TemporaryDirectory(prefix="overlapviz-nsys-", dir=os.environ.get(EXPORT_DIR_ENV) or None) as tmp:
        out = Path(tmp) / "export.sqlite"
        cmd = export_command(path, out, nsys)
        print(f"overlapviz: exporting {path} to SQLite with {nsys} (large reports take minutes) ...", file=sys.stderr, flush=True)
        t0 = time.monotonic()
        _run_export(cmd, path, timeout)
        if not out.is_file():
            raise ValueError(f"{path}: nsys export finished without writing the SQLite export ({shlex.join(cmd)})")
        print(f"overlapviz: exported {path} in {time.monotonic() - t0:.1f} s", file=sys.stderr, flush=True)
        try:
            traces = read_nsys(out)
        except ValueError as exc:
            raise ValueError(str(exc).replace(str(out), f"{path} (its SQLite export)")) from None
    return [replace(t, info=t.info | {"source_path": str(path)}) for t in traces]


def _timeout() -> float:
    text = os.environ.get(TIMEOUT_ENV)
    if not text:
        return DEFAULT_TIMEOUT_S
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise ValueError(f"${TIMEOUT_ENV}={text} is not a positive number of seconds")
    return value


def _run_export(cmd: list[str], report: Path, timeout: float) -> None:
    """Run ``cmd``; a one-line ValueError naming ``report`` when it fails or runs past ``timeout``."""
    try:
        # its own session, so a timeout stops nsys and whatever it started
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                start_new_session=True)  # fmt: skip
    except OSError as exc:
        raise ValueError(f"{report}: cannot run {cmd[0]}: {exc.strerror or exc}") from None
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise ValueError(f"{report}: nsys export ran past {timeout:g} s (${TIMEOUT_ENV}) and was stopped") from None
    except BaseException:  # KeyboardInterrupt: do not leave nsys running
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise
    if proc.returncode != 0:
        lines = [ln.strip() for ln in output.decode("utf-8", "replace").splitlines() if ln.strip()]
        last = lines[-1][:300] if lines else "no output"
        raise ValueError(f"{report}: nsys export failed (exit status {proc.returncode}): {last}")
