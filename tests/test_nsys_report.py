"""Nsight Systems reports (.nsys-rep): exported with nsys into a temporary directory and read as an export; a one-line error without nsys; a process driving two GPUs becomes two ranks.

The CI machine has no nsys: the error path runs the real CLI in a subprocess with a PATH
without it; the export plumbing runs against a stand-in ``nsys`` script that copies a real
export (it checks the command line it is given); the real nsys test runs where nsys and a
CUDA GPU are (``skipif`` otherwise).
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pyarrow.compute as pc
import pytest

from overlapviz.ingest import ingest
from overlapviz.ingest.discover import discover
from overlapviz.ingest.nsys import read_nsys
from overlapviz.ingest.nsys_report import NsysReportReader, read_report
from overlapviz.ingest.registry import detect
from overlapviz.dataset.schema import read_kernels, read_table

DATA = Path(__file__).parent / "data" / "nsys"
MOCK = DATA / "mock.sqlite"
MFU = DATA / "mfu_2gpu_before_window40ms.sqlite"
# not SQLite, not JSON: what a report's own container looks like to the other readers
REPORT_BYTES = b"\x00\x01QDSTRM-not-documented\x00" + bytes(range(256)) * 4

# the CLI with nsys's usual install places searched nowhere (the GPU machines have some)
CLI = textwrap.dedent(
    """
    import sys
    import overlapviz.ingest.nsys_report as r
    r._INSTALL_GLOBS = ()
    from overlapviz.cli import main
    main(sys.argv[1:])
    """
)


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OVERLAPVIZ_NSYS")}
    return env | extra


def _report(tmp_path: Path, name: str = "rank0.nsys-rep") -> Path:
    d = tmp_path / "reports"
    d.mkdir(exist_ok=True)
    p = d / name
    p.write_bytes(REPORT_BYTES)
    return p


def _fake_nsys(tmp_path: Path, body: str) -> Path:
    """An ``nsys`` on a PATH of its own: checks it is asked for a SQLite export, then runs ``body``."""
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    exe = bindir / "nsys"
    exe.write_text(textwrap.dedent(f"""\
        #!{sys.executable}
        import shutil, sys, time
        args = sys.argv[1:]
        assert args[:3] == ["export", "--type", "sqlite"] and args[3] == "--output", args
        out, report = args[4], args[5]
        with open({str(tmp_path / "calls.txt")!r}, "a") as f:
            f.write(out + "\\t" + report + "\\n")
        """) + textwrap.dedent(body))
    exe.chmod(0o755)
    return exe


def test_report_is_recognised_by_name_not_content(tmp_path):
    rep = _report(tmp_path)
    assert detect(rep).name == "nsys_report"
    export = tmp_path / "renamed.nsys-rep"  # an export renamed: the SQLite reader takes it
    shutil.copyfile(MOCK, export)
    assert detect(export).name == "nsys_sqlite"
    empty = tmp_path / "empty.nsys-rep"
    empty.write_bytes(b"")
    assert not NsysReportReader().sniff(empty, b"")


def test_without_nsys_one_line_error_naming_the_report_and_the_command(tmp_path):
    rep = _report(tmp_path)
    out = tmp_path / "ds"
    path = os.path.dirname(sys.executable)  # python, and no nsys
    assert shutil.which("nsys", path=path) is None
    r = subprocess.run([sys.executable, "-c", CLI, "ingest", str(rep), "-o", str(out), "-q"], capture_output=True,
                       text=True, timeout=120, env=_env(PATH=path))  # fmt: skip
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert str(rep) in lines[0] and "no nsys" in lines[0] and "install Nsight Systems" in lines[0]
    assert f"nsys export --type sqlite --output {rep.with_suffix('.sqlite')} {rep}" in lines[0]
    assert not out.exists() and sorted(p.name for p in rep.parent.iterdir()) == ["rank0.nsys-rep"]


def test_overlapviz_nsys_not_executable_is_named(tmp_path, monkeypatch):
    monkeypatch.setenv("OVERLAPVIZ_NSYS", str(tmp_path / "nope"))
    with pytest.raises(ValueError, match="OVERLAPVIZ_NSYS=.*nope is not an executable file"):
        read_report(_report(tmp_path))


def test_export_runs_in_a_temporary_directory_and_reads_like_the_export(tmp_path, monkeypatch, capfd):
    rep = _report(tmp_path)
    _fake_nsys(tmp_path, f"shutil.copyfile({str(MFU)!r}, out)\n")
    monkeypatch.setenv("PATH", str(tmp_path / "bin") + os.pathsep + os.environ["PATH"])
    exports = tmp_path / "exports"
    exports.mkdir()
    monkeypatch.setenv("OVERLAPVIZ_NSYS_EXPORT_DIR", str(exports))
    traces = read_report(rep)
    want = read_nsys(MFU)
    assert [t.kernels.num_rows for t in traces] == [t.kernels.num_rows for t in want]
    for got, exp in zip(traces, want):
        assert got.kernels.equals(exp.kernels)
        assert got.info == exp.info | {"source_path": str(rep)}
    ((out, report),) = [ln.split("\t") for ln in (tmp_path / "calls.txt").read_text().splitlines()]
    assert report == str(rep) and Path(out).parent.parent == exports  # never beside the report
    assert list(exports.iterdir()) == []  # the export is gone once read
    assert sorted(p.name for p in rep.parent.iterdir()) == ["rank0.nsys-rep"]
    err = capfd.readouterr().err
    assert f"exporting {rep} to SQLite" in err and f"exported {rep} in" in err


def test_ingest_of_a_report_gives_the_exports_dataset(tmp_path, monkeypatch):
    rep = _report(tmp_path, "mfu.nsys-rep")
    _fake_nsys(tmp_path, f"shutil.copyfile({str(MFU)!r}, out)\n")
    monkeypatch.setenv("PATH", str(tmp_path / "bin") + os.pathsep + os.environ["PATH"])
    src = tmp_path / "export"
    src.mkdir()
    shutil.copyfile(MFU, src / "mfu.sqlite")
    a = ingest([rep], tmp_path / "a", run_id="r", progress=False)
    b = ingest([src / "mfu.sqlite"], tmp_path / "b", run_id="r", progress=False)
    ka, kb = read_kernels(a), read_kernels(b)
    assert ka.num_rows == kb.num_rows > 0
    assert ka.sort_by([("rank", "ascending"), ("start_ns", "ascending")]).equals(
        kb.sort_by([("rank", "ascending"), ("start_ns", "ascending")]))
    ranks = read_table(a, "ranks").to_pylist()
    assert {r["source_path"] for r in ranks} == {str(rep)}


@pytest.mark.parametrize("body, message", [
    ("print('Error: could not open report'); sys.exit(3)\n", "nsys export failed (exit status 3): Error: could not open report"),
    ("pass\n", "finished without writing the SQLite export"),
    ("time.sleep(30)\n", "ran past 1 s"),
    (f"open(out, 'w').write('junk')\n", "its SQLite export"),
])  # fmt: skip
def test_export_failures_are_one_line_errors_naming_the_report(tmp_path, monkeypatch, body, message):
    rep = _report(tmp_path)
    _fake_nsys(tmp_path, body)
    monkeypatch.setenv("OVERLAPVIZ_NSYS", str(tmp_path / "bin" / "nsys"))
    monkeypatch.setenv("OVERLAPVIZ_NSYS_TIMEOUT", "1")
    exports = tmp_path / "exports"
    exports.mkdir()
    monkeypatch.setenv("OVERLAPVIZ_NSYS_EXPORT_DIR", str(exports))
    with pytest.raises(ValueError) as exc:
        read_report(rep)
    msg = str(exc.value)
    assert message in msg and str(rep) in msg and len(msg.splitlines()) == 1, msg
    assert list(exports.iterdir()) == []


def test_bad_timeout_is_named(tmp_path, monkeypatch):
    _fake_nsys(tmp_path, "pass\n")
    monkeypatch.setenv("OVERLAPVIZ_NSYS", str(tmp_path / "bin" / "nsys"))
    monkeypatch.setenv("OVERLAPVIZ_NSYS_TIMEOUT", "soon")
    with pytest.raises(ValueError, match="OVERLAPVIZ_NSYS_TIMEOUT=soon is not a positive number"):
        read_report(_report(tmp_path))


def test_a_report_beside_its_export_is_read_once_from_the_export(tmp_path):
    d = tmp_path / "run"
    d.mkdir()
    shutil.copyfile(MOCK, d / "rank0.sqlite")
    (d / "rank0.nsys-rep").write_bytes(REPORT_BYTES)
    (d / "rank1.nsys-rep").write_bytes(REPORT_BYTES)  # no export beside it: a report to export
    (run,) = discover([d])
    assert sorted((p.name, r) for p, r in run.files) == [("rank0.sqlite", "nsys_sqlite"), ("rank1.nsys-rep", "nsys_report")]
    (run,) = discover([d / "rank0.sqlite", d / "rank0.nsys-rep"])
    assert [p.name for p, _ in run.files] == ["rank0.sqlite"]


def test_one_process_driving_two_gpus_becomes_two_ranks(tmp_path):
    """nccl-tests -g 2 / a single-process NCCL job: its NCCL kernels on two devices make two ranks."""
    path = tmp_path / "one_process.sqlite"
    shutil.copyfile(MFU, path)
    path.chmod(0o644)
    with sqlite3.connect(path) as db:
        (first,) = db.execute("SELECT MIN(globalPid) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()
        for t in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET"):
            if db.execute("SELECT 1 FROM sqlite_master WHERE name = ?", (t,)).fetchone():
                db.execute(f"UPDATE {t} SET globalPid = ?", (first,))
        devices = [d for (d,) in db.execute("SELECT DISTINCT deviceId FROM CUPTI_ACTIVITY_KIND_KERNEL ORDER BY 1")]
        per_device = dict(db.execute("SELECT deviceId, COUNT(*) FROM CUPTI_ACTIVITY_KIND_KERNEL GROUP BY 1"))
    assert len(devices) == 2
    assert len(read_nsys(path)) == 1  # one process in the export
    ds = ingest([path], tmp_path / "ds", run_id="r", progress=False)
    k = read_kernels(ds)
    assert sorted(set(k.column("rank").to_pylist())) == devices
    for dev in devices:
        mine = k.filter(pc.equal(k.column("rank"), dev))
        assert set(mine.column("device").to_pylist()) == {dev}
        assert pc.sum(pc.equal(mine.column("category"), "kernel")).as_py() == per_device[dev]


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


@pytest.mark.gpu
@pytest.mark.skipif(shutil.which("nsys") is None, reason="needs Nsight Systems (nsys on the PATH)")
def test_real_nsys_report(tmp_path):
    if not _cuda_available():
        pytest.skip("needs torch with a CUDA GPU to make a report")
    out = tmp_path / "tiny"
    code = "import torch; x = torch.randn(512, 512, device='cuda'); y = x @ x; torch.cuda.synchronize()"
    subprocess.run(["nsys", "profile", "-t", "cuda", "-o", str(out), sys.executable, "-c", code], check=True,
                   capture_output=True, timeout=300)  # fmt: skip
    (rep,) = [p for p in tmp_path.iterdir() if p.name.startswith("tiny.")]
    print("report head bytes:", rep.read_bytes()[:16])  # the container's magic, for the reader's sniff
    assert detect(rep).name == "nsys_report"
    ds = ingest([rep], tmp_path / "ds", run_id="tiny", progress=False)
    k = read_kernels(ds)
    assert pc.sum(pc.equal(k.column("category"), "kernel")).as_py() >= 1
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["ds", rep.name])  # no export left beside it
