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

Each configuration runs in its own process group (``python -m overlapviz.collectors.run``
or torchrun for several processes, or any launcher prefix such as ``srun ... torchrun``)
with a timeout, so a crash, hang, out-of-memory or NCCL error fails that configuration
only: it gets a manifest with status ``failed`` and its error, and the sweep goes on. A
configuration whose manifest says ``ok`` or ``failed`` is finished and is not run again
when the sweep is resumed; anything else in its directory is removed and rerun.
"""

from __future__ import annotations

import itertools
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from overlapviz.collectors import manifest as mf
from overlapviz.collectors.config import CollectConfig, coerce, preset, run_id as make_run_id

RUNS_DIR = "runs"
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


def load_sweep(path: str | os.PathLike, *, overrides: dict | None = None) -> Sweep:
    """Read and expand a sweep file (see ``parse_sweep``)."""
    path = Path(path)
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
    """The command that runs ``config`` into ``run_dir``.

    ``launcher`` is a command prefix that, followed by ``-m overlapviz.collectors.run ...``,
    starts the collector on every rank (``torchrun --nproc-per-node 8``, ``srun ... torchrun
    ...``, ``torchrun --no-python ... rocprofv3 --kernel-trace -- python3``). Default:
    this Python for one process, torchrun (standalone) for several.
    """
    if launcher:
        prefix = shlex.split(launcher)
    elif config.nproc > 1:
        prefix = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={config.nproc}"]
    else:
        prefix = [sys.executable]
    return prefix + [
        "-m", "overlapviz.collectors.run",
        "--config-json", json.dumps(config.to_dict(), sort_keys=True),
        "--run-dir", str(run_dir),
        "--run-id", make_run_id(config),
    ]


def run_one(config: CollectConfig, run_dir: Path, *, launcher: str | None = None, env: dict | None = None) -> Outcome:
    """Run one configuration in its own process group, with its timeout; record a failure.

    The launcher's output goes to ``run_dir/collect.log``. On a non-zero exit or a
    timeout the run's manifest is (re)written with status ``failed`` and the error (the
    failing rank's one-line error, else the log's last line), and any traces are removed:
    a failed run has a manifest and no traces.
    """
    rid = make_run_id(config)
    run_dir = Path(run_dir)
    if run_dir.exists():
        shutil.rmtree(run_dir)  # an interrupted attempt: start clean
    run_dir.mkdir(parents=True)
    cmd = launch_command(config, run_dir, launcher=launcher)
    child_env = dict(os.environ if env is None else env)
    child_env.setdefault("PYTHONUNBUFFERED", "1")
    start = time.monotonic()
    error = None
    with open(run_dir / mf.LOG, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=child_env, start_new_session=True)
        try:
            code = proc.wait(timeout=config.timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            code = None
            error = f"timeout: no result after {config.timeout_s:g} s"
        except BaseException:
            _kill_group(proc)  # Ctrl-C: leave no ranks behind; the run stays unfinished
            raise
    seconds = time.monotonic() - start
    if code == 0 and mf.run_status(run_dir) == "ok":
        return Outcome(rid, "ok", None, seconds, run_dir)
    if error is None:
        error = _first_error(run_dir) or (f"exit code {code}" if code else "finished without an ok manifest")
    record_failure(config, run_dir, error)
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


def _first_error(run_dir: Path) -> str | None:
    """The error a rank wrote (lowest rank first), else the last non-empty line of the log."""
    errors = sorted(run_dir.glob(mf.ERROR.format(rank="*")), key=lambda p: p.name)
    for p in errors:
        text = p.read_text(errors="replace").strip()
        if text:
            return text.splitlines()[0]
    try:
        lines = [ln.strip() for ln in (run_dir / mf.LOG).read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return None
    for ln in reversed(lines):  # prefer a Python exception line over torchrun's summary
        if "Error" in ln.split(":")[0] or ln.startswith(("RuntimeError", "ValueError", "torch.")):
            return ln
    return lines[-1] if lines else None


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
              env: dict | None = None) -> list[Outcome]:
    """Run every configuration of ``sweep`` not yet finished under ``out/runs/<run_id>/``.

    Returns one outcome per configuration, finished ones from an earlier attempt included
    (status ``skipped-ok`` / ``skipped-failed``).
    """
    from tqdm import tqdm

    out = Path(out)
    (out / RUNS_DIR).mkdir(parents=True, exist_ok=True)
    if sweep.source is not None:
        (out / SWEEP_COPY).write_text(sweep.source)
    outcomes: list[Outcome] = []
    todo = []
    for cfg in sweep.configs:
        rid = make_run_id(cfg)
        rd = out / RUNS_DIR / rid
        status = mf.run_status(rd)
        if status is not None:
            outcomes.append(Outcome(rid, f"skipped-{status}", None, 0.0, rd))
        else:
            todo.append((cfg, rid, rd))
    disable = (not sys.stderr.isatty()) if progress is None else not progress
    bar = tqdm(total=len(sweep.configs), initial=len(outcomes), desc=sweep.name, unit="run", disable=disable)
    try:
        for cfg, rid, rd in todo:
            bar.set_postfix_str(rid[:60])
            result = run_one(cfg, rd, launcher=launcher, env=env)
            outcomes.append(result)
            if result.status == "failed":
                bar.write(f"{rid}: failed: {result.error}")
            bar.update(1)
    finally:
        bar.close()
    order = {make_run_id(c): i for i, c in enumerate(sweep.configs)}
    return sorted(outcomes, key=lambda o: order[o.run_id])


def finished_run_dirs(out: str | os.PathLike) -> list[Path]:
    """Run directories under ``out/runs`` whose manifest says ok or failed."""
    root = Path(out) / RUNS_DIR
    if not root.is_dir():
        return []
    return sorted(d for d in root.iterdir() if d.is_dir() and mf.run_status(d) is not None)


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
