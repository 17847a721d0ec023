"""Crash safety of ``overlapviz ingest`` (docs/robustness.md): a run killed at any instant
(``kill -9``) loses nothing, and the next run succeeds and removes what the killed one left.

After every kill: the inputs are byte for byte as they were; ``-o`` is absent (a first
ingest), the old dataset byte for byte, or a complete new dataset, never missing once a
dataset was there and never half-written. Then an ingest of the same ``-o`` succeeds and
leaves nothing but the dataset beside it. The kills land at seeded random instants over a
whole run, half of them in its last third (where the dataset is committed).
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _hostile import CLI, EVENT_SYNC, check_dataset, snapshot

from overlapviz.dataset import outdir
from overlapviz.ingest.pool import POOL_MIN_BYTES

# ingest processes killed at seeded instants, then run again: `pytest -m slow` and CI run it
pytestmark = pytest.mark.slow
DATA = Path(__file__).parent / "data"
NCCL = DATA / "hta_nccl_parser_config" / "nccl_data.json.gz"  # a real 1-rank NCCL trace, 750 KB gzipped
KILLS = int(os.environ.get("OVERLAPVIZ_CRASH_KILLS", "6"))


def make_sweep(root: Path, runs: int = 6) -> Path:
    """A sweep of ``runs`` run directories, each one real trace: enough work to kill mid-way
    (more than the worker pool's threshold in all, so readers fork too)."""
    for i in range(runs):
        d = root / "sweep" / f"run{i}"
        d.mkdir(parents=True)
        shutil.copy(NCCL, d / "trace.json.gz")
    return root / "sweep"


def start(sources: Path, out: Path, *extra: str) -> subprocess.Popen:
    args = [*CLI, "ingest", str(sources), "-o", str(out), "--quiet", *extra]
    if out.exists():
        args.append("--overwrite")
    # a session of its own: a kill of the group also reaches the forked readers (as a
    # scheduler's kill of a job does), and none outlives the test
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)


def run_to_end(sources: Path, out: Path, *extra: str) -> float:
    t0 = time.monotonic()
    p = start(sources, out, *extra)
    _, stderr = p.communicate(timeout=120)
    assert p.returncode == 0, stderr.decode(errors="replace")
    check_dataset(out)
    return time.monotonic() - t0


def beside(out: Path) -> list[str]:
    return sorted(p.name for p in out.parent.iterdir())


@pytest.mark.parametrize("group", [True, False], ids=["kill-process-group", "kill-main-process"])
def test_kill_9_at_random_instants_loses_nothing(tmp_path, group):
    sweep = make_sweep(tmp_path)
    inputs = snapshot(sweep)
    out = tmp_path / "out" / "ds"
    out.parent.mkdir()
    # --workers 1 where only the main process is killed: no forked reader is left orphaned
    extra = () if group else ("--workers", "1")
    full = run_to_end(sweep, out, *extra)
    shutil.rmtree(out)
    rng = random.Random(20261203 + group)
    instants = [rng.uniform(0.05, full) for _ in range(KILLS // 2)]
    instants += [rng.uniform(0.66 * full, 1.1 * full) for _ in range(KILLS - KILLS // 2)]
    stale_seen = 0
    # and one kill certain to land while the dataset is being built: once its directory is there
    for at in [None, *instants]:
        old = snapshot(out) if out.exists() else None
        p = start(sweep, out, *extra)
        if at is None:
            _wait_for_temporary(out, p)
        else:
            time.sleep(at)
        try:
            if group:
                os.killpg(p.pid, signal.SIGKILL)
            else:
                p.kill()
        except ProcessLookupError:
            pass  # it finished first
        p.communicate(timeout=60)
        if group:
            _wait_gone(p.pid)
        where = f"killed at {at if at is not None else 'its temporary directory'} s of {full:.2f} s"
        assert snapshot(sweep) == inputs, f"{where}: the inputs changed"
        if old is not None:
            assert out.exists(), f"{where}: a killed --overwrite lost the dataset"
        if out.exists() and snapshot(out) != old:
            check_dataset(out)  # not the old one: then the complete new one
        stale_seen += any(n != "ds" for n in beside(out))
        run_to_end(sweep, out, *extra)
        assert beside(out) == ["ds"], f"{where}: left beside the dataset after the next run: {beside(out)}"
    assert snapshot(sweep) == inputs
    assert stale_seen, "no kill left a temporary directory"


def _wait_for_temporary(out: Path, p: subprocess.Popen, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and p.poll() is None:
        if any(".ovz-tmp." in n for n in beside(out)):
            time.sleep(0.05)
            return
        time.sleep(0.005)


def _wait_gone(pgid: int, timeout: float = 10) -> None:
    """Wait until no process of group ``pgid`` is left (the forked readers die with it)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.02)


def test_sigterm_unwinds_and_leaves_nothing(tmp_path):
    """A scheduler's SIGTERM (to the whole job) ends the ingest with one line and no temporary directory."""
    sweep = make_sweep(tmp_path)
    out = tmp_path / "out" / "ds"
    out.parent.mkdir()
    p = start(sweep, out)
    _wait_for_temporary(out, p)
    os.killpg(p.pid, signal.SIGTERM)
    stdout, stderr = p.communicate(timeout=60)
    text = (stdout + stderr).decode(errors="replace")
    assert "Traceback" not in text, text
    if p.returncode != 0:  # it may have finished first
        assert text.strip().splitlines() == ["Error: interrupted"], text
        assert beside(out) == [], beside(out)
    else:
        check_dataset(out)


# a pool whose worker is forked and then, before the thread that manages the pool starts, the
# parent is interrupted: the instant a SIGTERM to the whole job can land in (the worker, forked
# after it, is never told). The exit then waited for that worker for ever (a CI run hung so).
_FORK_THEN_INTERRUPT = """
import multiprocessing, os, signal, sys
from overlapviz.ingest import pool

def size(path):
    return os.path.getsize(path)

fork = multiprocessing.get_context("fork")

class Interrupted(type(fork).Process):
    def start(self):
        super().start()
        os.kill(os.getpid(), signal.SIGINT)  # this process only: the worker has already forked

class Context(type(fork)):
    Process = Interrupted

real = pool.ProcessPoolExecutor
pool.ProcessPoolExecutor = lambda *a, mp_context, **k: real(*a, mp_context=Context(), **k)
try:
    for _ in pool.ordered_map(size, [(i, (sys.argv[1],)) for i in range(4)], 3):
        pass
except KeyboardInterrupt:
    print("interrupted", multiprocessing.active_children(), flush=True)
    sys.exit(3)
print("not interrupted")
"""


@pytest.mark.skipif("fork" not in __import__("multiprocessing").get_all_start_methods(), reason="no fork here")
def test_an_interrupt_while_the_pool_forks_leaves_no_worker_behind(tmp_path):
    big = tmp_path / "big.bin"
    with open(big, "wb") as fh:  # sparse: its size alone makes the pool pay
        fh.truncate(POOL_MIN_BYTES)
    p = subprocess.Popen([sys.executable, "-c", _FORK_THEN_INTERRUPT, str(big)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, start_new_session=True)
    try:
        stdout, stderr = p.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
        pytest.fail("the interrupted process never ended: its exit waited for a worker no shutdown reached")
    assert p.returncode == 3, (stdout + stderr).decode(errors="replace")
    assert stdout.decode().strip() == "interrupted []", stdout  # every worker was ended and reaped
    _wait_gone(p.pid)


_DEFERRED = """
import os, signal, time
from overlapviz import lifetime

def child(then):
    pid = os.fork()
    if pid == 0:
        time.sleep(then)
        os._exit(7)
    time.sleep(0.3)  # past the child's start (a signal before it is lost in CPython's fork, block or not)
    return pid

signal.signal(signal.SIGHUP, signal.SIG_IGN)
with lifetime.signals_deferred():
    ignoring, dying = child(0.6), child(5)
    os.kill(ignoring, signal.SIGHUP)  # ignored there, as in a child forked outside the block
    os.kill(dying, signal.SIGTERM)  # the default action there: it dies by it
    os.kill(os.getpid(), signal.SIGHUP)  # noted here, then ignored
    try:
        os.kill(os.getpid(), signal.SIGINT)  # noted here, raised when the block ends
        time.sleep(0.05)
        print("inside", flush=True)
    finally:
        status = {pid: os.waitpid(pid, 0)[1] for pid in (ignoring, dying)}
        print(os.WEXITSTATUS(status[ignoring]), os.WTERMSIG(status[dying]), flush=True)
"""


def test_signals_deferred_holds_signals_here_and_not_in_a_forked_child():
    p = subprocess.run([sys.executable, "-c", _DEFERRED], capture_output=True, text=True, timeout=60)
    assert p.stdout.split() == ["inside", "7", str(int(signal.SIGTERM))], p.stdout + p.stderr
    assert "KeyboardInterrupt" in p.stderr and p.returncode == -signal.SIGINT, p.stderr  # SIGINT, once the block ended


_INTERRUPT = """
import os, signal, threading, time
from overlapviz import lifetime

def wait():
    time.sleep(5)  # a handler runs within it
    print("not interrupted", flush=True)

before = signal.getsignal(signal.SIGTERM)
try:
    with lifetime.signals_interrupt():
        pid = os.fork()
        if pid == 0:
            time.sleep(5)
            os._exit(7)
        time.sleep(0.3)  # past the child's start
        os.kill(pid, signal.SIGTERM)  # the default action there: it dies by it
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            wait()
        except KeyboardInterrupt as exc:
            print("first", exc, flush=True)
        os.kill(os.getpid(), signal.SIGHUP)  # not once: every signal interrupts
        wait()
except KeyboardInterrupt as exc:
    print("again", exc, flush=True)
print(os.WTERMSIG(os.waitpid(pid, 0)[1]), signal.getsignal(signal.SIGTERM) is before, flush=True)
calls = []
with lifetime.signals_call(lambda: calls.append("called")):
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.2)
    print(*calls, flush=True)
def thread():  # no signal reaches a thread but the main one: nothing is set
    with lifetime.signals_interrupt(), lifetime.signals_call(print):
        print(signal.getsignal(signal.SIGTERM) is before, flush=True)
threading.Thread(target=thread).start()
time.sleep(0.2)
with lifetime.signals_interrupt(once=True):
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        wait()
    except KeyboardInterrupt:
        print("once", flush=True)
    os.kill(os.getpid(), signal.SIGTERM)  # a second signal: its default action, at once
    wait()
"""


def test_signals_interrupt_unwinds_here_and_ends_a_forked_child():
    p = subprocess.run([sys.executable, "-c", _INTERRUPT], capture_output=True, text=True, timeout=60)
    assert p.stdout.splitlines() == [f"first signal {int(signal.SIGTERM)}", f"again signal {int(signal.SIGHUP)}",
                                     f"{int(signal.SIGTERM)} True", "called", "True", "once"], p.stdout + p.stderr  # fmt: skip
    assert p.returncode == -signal.SIGTERM, p.stderr


def test_a_dataset_moved_aside_by_a_killed_replacement_goes_back(tmp_path):
    """Where the file system has no atomic exchange, a replacement is two renames; a run killed
    between them left the old dataset aside and ``-o`` missing: the next run puts it back."""
    out = tmp_path / "out" / "ds"
    out.parent.mkdir()
    p = tmp_path / "in" / "rank0.json.gz"
    p.parent.mkdir()
    shutil.copy(EVENT_SYNC, p)
    run_to_end(p, out)
    old = snapshot(out)
    dead = _dead_pid()
    aside = out.parent / f"{outdir.temporary_prefix(out, 'old')}{outdir._host()}.{dead}.0.k1ll3d"
    os.rename(out, aside)
    tmp = out.parent / f"{outdir.temporary_prefix(out, 'tmp')}{outdir._host()}.{dead}.0.k1ll3d"
    shutil.copytree(aside, tmp)  # the new dataset, complete, not yet moved into place
    assert outdir.clean_stale_temporaries(out)
    assert snapshot(out) == old and beside(out) == ["ds"]
    # and where the new one is in place, the old one aside is removed
    shutil.copytree(out, aside)
    assert outdir.clean_stale_temporaries(out) == [aside]
    assert snapshot(out) == old and beside(out) == ["ds"]


def test_stale_temporaries_of_live_processes_and_others_are_kept(tmp_path):
    out = tmp_path / "ds"
    host = outdir._host()
    keep = [
        out.parent / f"{outdir.temporary_prefix(out, 'tmp')}{host}.{os.getppid()}.0.alive1",  # a live process
        out.parent / f"{outdir.temporary_prefix(out, 'tmp')}not-{host}.{_dead_pid()}.0.other1",  # another host
        out.parent / f"{outdir.temporary_prefix(out, 'tmp')}{host}.{_dead_pid()}.0.nomark",  # not in our shape
        out.parent / f".ds.ovz-tmp.00000000.{host}.{_dead_pid()}.0.wrong1",  # not this output's hash
    ]
    for k in keep[:2] + keep[3:]:
        (k / ".overlapviz-incomplete").parent.mkdir(parents=True)
        (k / ".overlapviz-incomplete").write_text("{}")
    (keep[2] / "mine.txt").parent.mkdir(parents=True)
    (keep[2] / "mine.txt").write_text("user data")
    pid_reused = out.parent / f"{outdir.temporary_prefix(out, 'tmp')}{host}.{os.getpid()}.1.reused"
    (pid_reused / ".overlapviz-incomplete").parent.mkdir(parents=True)
    (pid_reused / ".overlapviz-incomplete").write_text("{}")
    removed = outdir.clean_stale_temporaries(out)
    assert all(k.exists() for k in keep)
    # this process's pid with another start time: an earlier process that had the pid, gone
    assert removed == ([pid_reused] if outdir._start_time(os.getpid()) not in (0, 1) else [])


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_kill_9_of_a_cold_analyze_leaves_no_half_written_cache(tmp_path):
    """``analyze TRACE`` with a cold cache writes the cache dataset behind the analysis (a thread of the command,
    cli/_dataset): killed at any instant, the cache holds no dataset or a complete one, never a half-written one;
    the next command answers the same and leaves only the dataset."""
    src = tmp_path / "trace"
    src.mkdir()
    shutil.copy(NCCL, src / "rank0.json.gz")
    cache = tmp_path / "cache"
    env = dict(os.environ, OVERLAPVIZ_CACHE_DIR=str(cache))
    cmd = [*CLI, "analyze", str(src), "--format", "json"]

    def run() -> str:
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
        assert done.returncode == 0, done.stderr
        (dataset,) = cache.glob("traces-*")  # the dataset alone: what a killed run left is gone
        check_dataset(dataset)
        _answers_whole(cache)
        return done.stdout

    t0 = time.monotonic()
    expected = run()
    full = time.monotonic() - t0
    rng = random.Random(20261207)
    stale_seen = 0
    # and kills certain to land while the cache dataset is built: once its directory is there, and once the kernels
    # file is being written behind the analysis
    for at in ["directory", "kernels file", *(rng.uniform(0.3 * full, 1.1 * full) for _ in range(KILLS))]:
        shutil.rmtree(cache)
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, start_new_session=True)
        if isinstance(at, str):
            deadline = time.monotonic() + 30
            pattern, marker = ("*", ".ovz-tmp.") if at == "directory" else ("*/kernels/*/*.parquet", "")
            while time.monotonic() < deadline and p.poll() is None and not _found(cache, pattern, marker):
                time.sleep(0.001)
        else:
            time.sleep(at)
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass  # it finished first
        p.communicate(timeout=60)
        left = sorted(cache.iterdir()) if cache.exists() else []
        for d in left:
            if not d.name.startswith(".") and d.name != "tables":
                check_dataset(d)  # in place: complete
        _answers_whole(cache)  # the answer (kept once the dataset is in place): none, or a whole one
        stale_seen += any(d.name.startswith(".") for d in left)
        assert run() == expected, f"killed at {at if isinstance(at, str) else f'{at:.2f} s'} of {full:.2f} s"
    assert stale_seen, "no kill landed while the cache was being written"


def _answers_whole(cache: Path) -> None:
    """Every answer kept in ``cache`` (tables/*/*.answer, overlapviz.dataset.computed) is whole: its text's SHA-256
    is the one its header names."""
    import hashlib

    for f in cache.glob("tables/*/*.answer"):
        head, _, body = f.read_bytes().partition(b"\n\n")
        assert hashlib.sha256(body).hexdigest().encode() == head.split(b"\n")[2], f


def _found(cache: Path, pattern: str, marker: str) -> bool:
    try:
        return any(marker in str(f) for f in cache.glob(pattern))
    except OSError:  # a directory renamed or removed while listed
        return False


def _profile_of(pid: int) -> Path | None:
    """The --user-data-dir of the chromium that process ``pid`` started (its child), if it runs."""
    for proc in Path("/proc").iterdir():
        try:
            if not proc.name.isdigit() or int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1]) != pid:
                continue
            args = (proc / "cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError, IndexError):
            continue
        for a in args:
            if a.startswith(b"--user-data-dir="):
                return Path(a.split(b"=", 1)[1].decode())
    return None


def test_sigterm_ends_an_export_with_its_browser_and_profile(tmp_path):
    """A job's SIGTERM to ``overlapviz export`` ends its chromium and removes its profile, as Ctrl-C does (was: the
    profile, ~140 files, stayed in /dev/shm for good)."""
    from overlapviz.export.browser import find_browser

    if find_browser() is None:
        pytest.skip("Debian chromium not installed")
    out = tmp_path / "why.png"
    sample = Path(__file__).parent.parent / "sample_traces" / "h200_standin_sweep"
    env = dict(os.environ, OVERLAPVIZ_CACHE_DIR=str(tmp_path / "cache"))
    p = subprocess.Popen([*CLI, "export", str(sample), "--figure", "why", "-o", str(out)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, env=env, start_new_session=True)  # fmt: skip
    deadline = time.monotonic() + 60
    while (profile := _profile_of(p.pid)) is None and p.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert profile is not None and profile.is_dir(), "no browser seen"
    os.killpg(p.pid, signal.SIGTERM)
    stdout, stderr = p.communicate(timeout=60)
    _wait_gone(p.pid)
    text = (stdout + stderr).decode(errors="replace")
    assert "Traceback" not in text, text
    assert not profile.exists(), sorted(profile.iterdir())[:5]
    if p.returncode != 0:  # (it may have finished first)
        assert text.strip().splitlines()[-1] == "Error: interrupted", text
        assert not out.exists()
