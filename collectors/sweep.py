"""Sweeps: a TOML product of knobs over a preset, run one configuration per subprocess, resumable.

A sweep file::

    name = "h200_standin_sweep"      # optional
    preset = "cb_ar_standin"         # the base configuration
    [base]                           # fields changed on the preset for every run
    iterations = 30
    [[grid]]                         # one product of knobs; lists are swept, scalars fixed
    setup = ["sequential", "baseline", "optimized"]
    smem_pad_bytes = [0, 65536, 114688]
    [[grid]]                         # more grids add more runs (their union, duplicates once)
    compute_impl = "vendor"
    setup = ["sequential", "baseline", "optimized"]

Configurations of several processes run each in its own process group (torchrun, or any
launcher prefix such as ``srun ... torchrun``); single-process ones (one GPU, the
stand-in) run one after another in a batch process (``python -P -m
overlapviz.collectors.run --batch``), so that CUDA, the profiler and the extension start
once, with a new batch process for each ``cuda_max_connections`` and after any crash.
Either way each configuration has its timeout, and a crash, hang, out-of-memory or NCCL
error fails that configuration only: it gets a manifest with status ``failed`` and its
error, and the sweep goes on. A configuration whose manifest says ``ok`` (or ``failed``,
unless ``retry_failed``) is finished and is not run again when the sweep is resumed;
anything else in its directory is removed and rerun.

Crash safety (the sweep itself killed, SIGKILL included): a configuration is recorded into
a hidden directory ``runs/.<run_id>.partial-<pid>`` (ingest and ``discover`` skip dot
names) and renamed to ``runs/<run_id>`` only once its manifest is written, so
``runs/<run_id>`` is always a finished run (ok with its traces, or failed with its error)
and never half of one. Every process the sweep starts gets ``PR_SET_PDEATHSIG`` (Linux):
killed, the sweep takes them with it (torchrun gets SIGTERM and stops its ranks), so no
rank goes on running, or writing, for nobody. The next sweep removes the hidden
directories and work files of sweep processes that are gone, and reruns what they left.

Every child runs in Python's safe-path mode (``collectors/launch.py``), so a clone's own
``overlapviz/`` directory never shadows the installed package.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import select
import shlex
import shutil
import signal
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

from overlapviz.collectors import manifest as mf
from overlapviz.collectors.config import CollectConfig, coerce, preset, run_id as make_run_id
from overlapviz.collectors.launch import child_env, python_command
from overlapviz.lifetime import signals_interrupt

RUNS_DIR = "runs"
PARTIAL = ".{run_id}.partial-{pid}"  # a configuration being recorded by sweep process <pid> (hidden)
# what a killed sweep process leaves: partial and replaced run directories, batch work files, temporaries
_LEFTOVER = re.compile(r"^\.(?:.+\.(?:partial|old|tmp)|batch)-(?P<pid>\d+)(?:\.json)?$")
SWEEP_COPY = "sweep.toml"  # the sweep file, copied beside runs/ for the record
DATASET_DIR = "dataset"
_TOP_KEYS = {"name", "preset", "base", "grid"}


@dataclass(frozen=True)
class Sweep:
    """The configurations of one sweep, in file order, without duplicates."""

    name: str
    configs: tuple[CollectConfig, ...]
    source: str | None = None  # the TOML text, copied into the sweep directory


@dataclass
class Outcome:
    run_id: str
    status: str  # ok | failed | skipped-ok | skipped-failed
    error: str | None = None
    seconds: float = 0.0
    run_dir: Path | None = None


def parse_sweep(text: str, *, where: str = "sweep", overrides: dict | None = None) -> Sweep:
    """Expand a sweep document into its configurations.

    Parameters
    ----------
    text
        The TOML document.
    where
        The file name, for error messages.
    overrides
        Fields set on the base for every run (the CLI's per-knob options); grids still win.

    Raises
    ------
    ValueError
        Naming ``where``, the grid and the field, for unknown keys, bad values and bad
        combinations; nothing is run when any configuration is invalid.
    """
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{where}: not valid TOML: {exc}") from None
    unknown = sorted(set(doc) - _TOP_KEYS)
    if unknown:
        raise ValueError(f"{where}: unknown key {unknown[0]!r} (known: {', '.join(sorted(_TOP_KEYS))})")
    base = preset(str(doc.get("preset", "cb_ar")))
    base_changes = doc.get("base", {})
    if not isinstance(base_changes, dict):
        raise ValueError(f"{where}: [base] must be a table")
    base = _apply(base, base_changes, where=f"{where} [base]")
    if overrides:
        base = _apply(base, overrides, where=f"{where} (options)")
    grids = doc.get("grid", [{}])
    if not isinstance(grids, list) or not all(isinstance(g, dict) for g in grids):
        raise ValueError(f"{where}: grid must be an array of tables ([[grid]])")
    configs: dict[str, CollectConfig] = {}
    for gi, grid in enumerate(grids or [{}], start=1):
        keys = list(grid)
        axes = [v if isinstance(v, list) else [v] for v in grid.values()]
        for key, axis in zip(keys, axes):
            if not axis:
                raise ValueError(f"{where} grid {gi}: {key} has no values")
        for combo in itertools.product(*axes):
            changes = dict(zip(keys, combo))
            label = ", ".join(f"{k}={v!r}" for k, v in changes.items())
            cfg = _apply(base, changes, where=f"{where} grid {gi} ({label})")
            configs.setdefault(make_run_id(cfg), cfg)
    return Sweep(str(doc.get("name", Path(where).stem)), tuple(configs.values()), text)


SHIPPED_SWEEP = "sweep_{name}.toml"  # beside this module, installed with it


def shipped_sweeps() -> dict[str, Path]:
    """The sweep files installed with the collectors, by name (``sweep_<name>.toml`` -> ``<name>``)."""
    here = Path(__file__).parent
    return {p.stem[len("sweep_"):]: p for p in sorted(here.glob(SHIPPED_SWEEP.format(name="*")))}


def resolve_sweep(path_or_name: str | os.PathLike) -> Path:
    """A sweep file: the path if it exists, else the shipped sweep of that name (``cpu_tour``, ``h200_paper_grid``).

    Raises
    ------
    ValueError
        If it is neither, listing the shipped sweeps.
    """
    path = Path(path_or_name)
    if path.exists():
        return path
    shipped = shipped_sweeps()
    name = str(path_or_name).removeprefix("sweep_").removesuffix(".toml").replace("-", "_")
    if path.parent == Path(".") and name in shipped:
        return shipped[name]
    raise ValueError(f"{path_or_name}: no such sweep file, and no shipped sweep of that name "
                     f"(shipped: {', '.join(shipped)})")


def load_sweep(path: str | os.PathLike, *, overrides: dict | None = None) -> Sweep:
    """Read and expand a sweep file or a shipped sweep by name (see ``parse_sweep`` and ``resolve_sweep``)."""
    path = resolve_sweep(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ValueError(f"{path}: cannot read the sweep file: {exc.strerror or exc}") from None
    return parse_sweep(text, where=str(path), overrides=overrides)


def _apply(config: CollectConfig, changes: dict, *, where: str) -> CollectConfig:
    values = {k: coerce(k, v, where=where) for k, v in changes.items()}
    try:
        return config.replace(**values)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None


# --- running ---------------------------------------------------------------------------


def launch_command(config: CollectConfig, run_dir: Path, *, launcher: str | None = None) -> list[str]:
    """The command that runs ``config`` into ``run_dir`` in its own process(es).

    ``launcher`` is a command prefix that, followed by ``-m overlapviz.collectors.run ...``,
    starts the collector on every rank (``torchrun --nproc-per-node 8``, ``srun ... torchrun
    ...``, ``torchrun --no-python ... rocprofv3 --kernel-trace -- python3``). Default:
    this Python for one process, torchrun (standalone) for several, both in safe-path
    mode (``-P``; the ranks torchrun starts get ``PYTHONSAFEPATH=1`` from ``child_env``).
    """
    if launcher:
        prefix = shlex.split(launcher)
    elif config.nproc > 1:
        prefix = python_command() + ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={config.nproc}"]
    else:
        prefix = python_command()
    return prefix + [
        "-m", "overlapviz.collectors.run",
        "--config-json", json.dumps(config.to_dict(), sort_keys=True),
        "--run-dir", str(run_dir),
        "--run-id", make_run_id(config),
    ]


def _fresh(run_dir: Path) -> None:
    if run_dir.exists():
        shutil.rmtree(run_dir)  # an interrupted (or retried) attempt: start clean
    run_dir.mkdir(parents=True)


def partial_dir(run_dir: Path) -> Path:
    """Where this sweep process records ``run_dir`` until it is finished (see ``publish``)."""
    run_dir = Path(run_dir)
    return run_dir.with_name(PARTIAL.format(run_id=run_dir.name, pid=os.getpid()))


def publish(work: Path, run_dir: Path) -> None:
    """Make the finished attempt ``work`` (its manifest written) the run directory ``run_dir``.

    A rename, so ``run_dir`` never holds part of a run; an older attempt there (a failed
    run retried) is moved aside first and removed after. Killed between the two renames,
    ``run_dir`` is absent (the run is rerun) and the older attempt is left hidden, for the
    next sweep to remove.
    """
    old = None
    if os.path.lexists(run_dir):
        old = run_dir.with_name(f".{run_dir.name}.old-{os.getpid()}")
        if os.path.lexists(old):
            shutil.rmtree(old)
        os.replace(run_dir, old)
    os.replace(work, run_dir)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def remove_leftovers(out: Path) -> list[Path]:
    """Remove what killed sweep processes left in ``out`` (hidden partial and replaced run
    directories under ``runs/``, batch work files): those whose process is gone. Returns them."""
    removed = []
    for d in (Path(out), Path(out) / RUNS_DIR):
        try:
            entries = list(d.iterdir())
        except OSError:
            continue
        for p in entries:
            m = _LEFTOVER.match(p.name)
            if m is None or _process_alive(int(m.group("pid"))):
                continue
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)
            removed.append(p)
    return removed


def _process_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's
        return True
    return True


def _popen(cmd: list[str], *, death_signal: int = signal.SIGTERM, **kwargs) -> subprocess.Popen:
    """``Popen`` in a new session (a timeout kills the whole group) that gets ``death_signal``
    when this process dies, SIGKILL included (``overlapviz.lifetime.die_with_parent``; Linux). SIGTERM: a
    launcher (torchrun, srun) then stops its own ranks."""
    import functools

    from overlapviz.lifetime import die_with_parent, load

    preexec = None
    if load():  # the C library loaded here: the child only calls it
        preexec = functools.partial(die_with_parent, death_signal, os.getpid())
    return subprocess.Popen(cmd, start_new_session=True, preexec_fn=preexec, **kwargs)


def run_one(config: CollectConfig, run_dir: Path, *, launcher: str | None = None, env: dict | None = None) -> Outcome:
    """Run one configuration in its own process group, with its timeout; record a failure.

    The launcher's output goes to ``run_dir/collect.log``. On a non-zero exit or a
    timeout the run's manifest is (re)written with status ``failed`` and the error (the
    failing rank's one-line error, else the log's first exception line), and any traces
    are removed: a failed run has a manifest and no traces.
    """
    rid = make_run_id(config)
    run_dir = Path(run_dir)
    work = partial_dir(run_dir)  # renamed to run_dir when finished
    _fresh(work)
    cmd = launch_command(config, work, launcher=launcher)
    child = child_env(env, max_connections=config.cuda_max_connections, sweep_pid=None if launcher else os.getpid())
    start = time.monotonic()
    error = None
    with open(work / mf.LOG, "wb") as log:
        proc = _popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=child)
        try:
            code = proc.wait(timeout=config.timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            code = None
            error = f"timeout: no result after {config.timeout_s:g} s"
        except BaseException:
            _kill_group(proc)  # Ctrl-C: leave no ranks behind; the run stays unfinished
            shutil.rmtree(work, ignore_errors=True)
            raise
    return _finish(config, work, run_dir, code == 0, time.monotonic() - start, error, code=code)


BATCH_FILE = ".batch-{pid}.json"  # the batch process's work list, in the sweep directory while it runs
BATCH_LOG = "batch.log"  # the batch processes' own output (each run's goes to its collect.log)


def run_batch(items: list[tuple[CollectConfig, Path]], out: Path, *, env: dict | None = None,
              on_done=None, worker: list[str] | None = None) -> list[Outcome]:
    """Run single-process configurations one after another in batch processes; each keeps its timeout.

    ``items`` are (config, run_dir) pairs sharing ``cuda_max_connections`` (read once per
    process). A batch process that crashes or overruns a run's timeout is killed; that run
    is recorded failed and the rest go on in a new process. ``on_done(outcome)`` is called
    as each run ends. ``worker`` replaces the batch process's command (``python -P -m
    overlapviz.collectors.run``; tests use it).
    """
    out = Path(out)
    outcomes: list[Outcome] = []
    todo = [(c, Path(rd)) for c, rd in items]
    while todo:
        for cfg, rd in todo:
            _fresh(partial_dir(rd))  # recorded there, renamed to rd when finished
        work = out / BATCH_FILE.format(pid=os.getpid())
        mf.write_json_atomic(work, [{"config": c.to_dict(), "run_dir": str(partial_dir(rd)), "run_id": make_run_id(c)}
                                    for c, rd in todo])
        read_fd, write_fd = os.pipe()
        cmd = (worker or python_command() + ["-m", "overlapviz.collectors.run"]) + [
            "--batch", str(work), "--status-fd", str(write_fd)]
        child = child_env(env, max_connections=todo[0][0].cuda_max_connections, sweep_pid=os.getpid())
        with open(out / BATCH_LOG, "ab") as log:
            proc = _popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=child, pass_fds=(write_fd,))
        os.close(write_fd)
        done: set[int] = set()
        current, started = 0, time.monotonic()  # the first run's clock starts with the process (imports, build)
        running = heard = False  # todo[current] has started; the process has said anything at all
        buf = b""
        try:
            with os.fdopen(read_fd, "rb", buffering=0) as status:
                while True:
                    cfg, rd = todo[current] if current < len(todo) else (None, None)
                    left = (cfg.timeout_s - (time.monotonic() - started)) if cfg is not None else 5.0
                    ready, _, _ = select.select([status], [], [], max(0.0, left))
                    if not ready:
                        if cfg is None:
                            break
                        _kill_group(proc)
                        outcome = _finish(cfg, partial_dir(rd), rd, False, time.monotonic() - started,
                                          f"timeout: no result after {cfg.timeout_s:g} s")
                        outcomes.append(outcome)
                        done.add(current)
                        if on_done:
                            on_done(outcome)
                        break
                    chunk = status.read(4096)
                    if not chunk:  # the batch process is gone
                        break
                    buf += chunk
                    while b"\n" in buf:
                        line, buf = buf.split(b"\n", 1)
                        parts = line.decode().split()
                        heard = True
                        if parts[:1] == ["start"]:
                            current, started, running = int(parts[1]), time.monotonic(), True
                        elif parts[:1] == ["end"]:
                            i = int(parts[1])
                            c, r = todo[i]
                            outcome = _finish(c, partial_dir(r), r, parts[2] == "ok", time.monotonic() - started, None)
                            outcomes.append(outcome)
                            done.add(i)
                            current, started, running = i + 1, time.monotonic(), False
                            if on_done:
                                on_done(outcome)
        except BaseException:
            _kill_group(proc)  # Ctrl-C: the unfinished runs stay unfinished (rerun on resume)
            for i, (_, rd) in enumerate(todo):
                if i not in done:
                    shutil.rmtree(partial_dir(rd), ignore_errors=True)
            raise
        finally:
            work.unlink(missing_ok=True)
        try:
            code = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            code = None
        # it died inside a run, or before its first run (then that run fails, so the sweep moves on);
        # after a finished run (code 3: the GPU was left unusable) the rest go to a new process
        if current < len(todo) and current not in done and (running or not heard):
            cfg, rd = todo[current]
            if running:
                error = (_first_error(partial_dir(rd), last_line=False)
                         or f"the batch process died (exit code {code}) during this run; see its collect.log")
            else:
                error = (_log_error(out / BATCH_LOG)
                         or f"the batch process exited (code {code}) before its first run; see {BATCH_LOG}")
            outcome = _finish(cfg, partial_dir(rd), rd, False, time.monotonic() - started, error)
            outcomes.append(outcome)
            done.add(current)
            if on_done:
                on_done(outcome)
        for i, (_, rd) in enumerate(todo):  # those left for the next process start afresh there
            if i not in done:
                shutil.rmtree(partial_dir(rd), ignore_errors=True)
        todo = [item for i, item in enumerate(todo) if i not in done and i > max(done, default=-1)]
    return outcomes


def _finish(config: CollectConfig, work: Path, run_dir: Path, ok: bool, seconds: float, error: str | None,
            *, code: int | None = None) -> Outcome:
    """The outcome of the attempt in ``work``: ok (its manifest says so), else recorded failed
    with ``error`` (default: the ranks' own); either way published as ``run_dir``."""
    rid = make_run_id(config)
    if ok and error is None and mf.run_status(work) == "ok":
        publish(work, run_dir)
        return Outcome(rid, "ok", None, seconds, run_dir)
    error = error or _first_error(work) or (f"exit code {code}" if code else "finished without an ok manifest")
    record_failure(config, work, error)
    publish(work, run_dir)
    return Outcome(rid, "failed", error, seconds, run_dir)


def _kill_group(proc: subprocess.Popen) -> None:
    for sig, wait_s in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


_EXCEPTION_LINE = re.compile(r"^(?:[\w.]+\.)?(\w*(?:Error|Exception|Interrupt|Exit))(?::|$)")
_LAUNCHER_ERRORS = ("ChildFailedError",)  # torchrun's summary: the ranks' own errors say more


def _log_error(log: Path) -> str | None:
    """The last exception line of a log (the batch process's own), None when there is none."""
    try:
        lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return None
    for ln in reversed(lines):
        m = _EXCEPTION_LINE.match(ln)
        if m and m.group(1) not in _LAUNCHER_ERRORS:
            return ln
    return None


def _first_error(run_dir: Path, *, last_line: bool = True) -> str | None:
    """The error a rank wrote (lowest rank first), else the log's first exception line, else its last line.

    A rank that could not even import the collector (a module not found) writes no error
    file; its exception line in the log is what says why, not torchrun's summary below it.
    """
    errors = sorted(run_dir.glob(mf.ERROR.format(rank="*")), key=lambda p: p.name)
    for p in errors:
        text = p.read_text(errors="replace").strip()
        if text:
            return text.splitlines()[0]
    try:
        lines = [ln.strip() for ln in (run_dir / mf.LOG).read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return None
    for ln in lines:
        m = _EXCEPTION_LINE.match(ln)
        if m and m.group(1) not in _LAUNCHER_ERRORS:
            return ln
        if "Error while finding module specification" in ln:  # python -m of a module that is not there
            return ln.split(": ", 1)[-1]
    for ln in reversed(lines):
        if "Error" in ln.split(":")[0] or ln.startswith(("RuntimeError", "ValueError", "torch.")):
            return ln
    return lines[-1] if lines and last_line else None


def record_failure(config: CollectConfig, run_dir: Path, error: str) -> dict:
    """Write a failed manifest for ``config`` (keeping what rank 0 recorded) and remove its traces."""
    previous = mf.read_manifest(run_dir) or {}
    known = {k: v for k, v in (previous.get("run") or {}).items() if v is not None and k not in ("status", "error")}
    known.setdefault("world_size", config.nproc)
    run = mf.run_record(config, status="failed", error=error, **known)
    data = mf.manifest(config, run, devices=previous.get("devices"), effective=previous.get("effective"))
    for trace in run_dir.glob(mf.TRACE.format(rank="*")):
        trace.unlink()
    mf.write_manifest(run_dir, data)
    return data


def run_sweep(sweep: Sweep, out: str | os.PathLike, *, launcher: str | None = None, progress: bool | None = None,
              env: dict | None = None, retry_failed: bool = False, batch: bool = True,
              check: bool = True) -> list[Outcome]:
    """Run every configuration of ``sweep`` not yet finished under ``out/runs/<run_id>/``.

    Parameters
    ----------
    retry_failed
        Run again the configurations whose manifest says ``failed`` (by default a failed
        run is finished, like an ok one).
    batch
        Run single-process configurations (no ``launcher``) in batch processes (see
        ``run_batch``); False: each in its own process.
    check
        Check the whole sweep against this machine first (``preflight.check_sweep``) and
        run nothing if any configuration cannot run here.

    Returns one outcome per configuration, finished ones from an earlier attempt included
    (status ``skipped-ok`` / ``skipped-failed``).

    Raises
    ------
    preflight.SweepNotRunnable
        When ``check`` finds problems; every problem is listed.
    """
    from tqdm import tqdm

    out = Path(out)
    outcomes: list[Outcome] = []
    todo = []
    for cfg in sweep.configs:
        rid = make_run_id(cfg)
        rd = out / RUNS_DIR / rid
        status = mf.run_status(rd)
        if status == "ok" or (status == "failed" and not retry_failed):
            outcomes.append(Outcome(rid, f"skipped-{status}", None, 0.0, rd))
        else:
            todo.append((cfg, rid, rd))
    if check and todo:
        from overlapviz.collectors import preflight

        preflight.require_runnable([c for c, _, _ in todo], env=env, launcher=launcher, total=len(sweep.configs))
    (out / RUNS_DIR).mkdir(parents=True, exist_ok=True)
    remove_leftovers(out)
    for _, _, rd in todo:  # not finished (written by an older version, or by hand): not a run, rerun
        if os.path.lexists(rd) and mf.run_status(rd) is None:
            shutil.rmtree(rd) if rd.is_dir() and not rd.is_symlink() else rd.unlink()
    if sweep.source is not None:
        _write_text_atomic(out / SWEEP_COPY, sweep.source)
    disable = (not sys.stderr.isatty()) if progress is None else not progress
    bar = tqdm(total=len(sweep.configs), initial=len(outcomes), desc=sweep.name, unit="run", disable=disable)

    def done(result: Outcome) -> None:
        outcomes.append(result)
        if result.status == "failed":
            bar.write(f"{result.run_id}: failed: {result.error}")
        bar.update(1)

    # SLURM's time limit, `timeout`: SIGTERM interrupts, so the running configuration's ranks are stopped, not only this
    # process (they run in sessions of their own, for a timeout to kill all of them)
    with signals_interrupt((signal.SIGTERM,)):
        try:
            batched = [(c, rid, rd) for c, rid, rd in todo if batch and launcher is None and c.single_process]
            alone = [item for item in todo if item not in batched]
            groups: dict = {}
            for c, _, rd in batched:  # one batch process per CUDA_DEVICE_MAX_CONNECTIONS, in sweep order
                groups.setdefault(c.cuda_max_connections, []).append((c, rd))
            for items in groups.values():
                bar.set_postfix_str(f"batch of {len(items)}")
                run_batch(items, out, env=env, on_done=done)
            for cfg, rid, rd in alone:
                bar.set_postfix_str(rid[:60])
                done(run_one(cfg, rd, launcher=launcher, env=env))
        finally:
            bar.close()
    order = {make_run_id(c): i for i, c in enumerate(sweep.configs)}
    return sorted(outcomes, key=lambda o: order[o.run_id])


def _write_text_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


def finished_run_dirs(out: str | os.PathLike) -> list[Path]:
    """Run directories under ``out/runs`` whose manifest says ok or failed (hidden ones, runs
    being recorded or left by a killed sweep, are not runs)."""
    root = Path(out) / RUNS_DIR
    if not root.is_dir():
        return []
    return sorted(d for d in root.iterdir() if not d.name.startswith(".") and d.is_dir() and mf.run_status(d) is not None)


def ingest_sweep(out: str | os.PathLike, *, progress: bool | None = None) -> Path:
    """Ingest every finished run of ``out`` into ``out/dataset`` (replacing an older one).

    Runs collected with ``profiler = "none"`` have no torch.profiler trace (an external
    profiler such as rocprofv3 recorded them) and are left to ``overlapviz ingest`` of that
    profiler's output.
    """
    from overlapviz.ingest import ingest

    runs = [d for d in finished_run_dirs(out)
            if ((mf.read_manifest(d) or {}).get("config") or {}).get("profiler", "torch") == "torch"]
    if not runs:
        raise ValueError(f"{out}: no finished runs with torch.profiler traces to ingest")
    return ingest([str(d) for d in runs], Path(out) / DATASET_DIR, overwrite=True, progress=progress)


def sweep_of_one(config: CollectConfig, name: str = "collect") -> Sweep:
    return Sweep(name, (config,), None)
