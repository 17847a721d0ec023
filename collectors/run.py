"""One configuration on one rank (the module torchrun starts): check, time with events, trace, write the run directory.

    torchrun --nproc-per-node 8 -m overlapviz.collectors.run --preset cb_ar --out DIR [--setup optimized ...]
    python -P -m overlapviz.collectors.run --preset cb_ar_standin --out DIR       # one GPU, stand-in

(``-P``, or ``PYTHONSAFEPATH=1``, keeps a clone's own ``overlapviz/`` directory from
shadowing the installed package when started from the clone's root.) ``--batch FILE``
runs several single-process configurations one after another in this process; the
sweep runner uses it so that CUDA, the profiler and the extension start once.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import sys
import time
import traceback
from pathlib import Path

from overlapviz.analysis.statistics import DEFAULT_LEVEL, bootstrap_median
from overlapviz.collectors import manifest as mf
from overlapviz.collectors.config import CollectConfig, coerce, preset, run_id as make_run_id
from overlapviz.collectors.profiler import Profiler, iteration

def measure(workload, iterations: int) -> list[float]:
    """Per-iteration time in ms: CUDA events on the main stream on a GPU, the host clock on CPU."""
    import torch

    if workload.dist.is_cuda:
        main = torch.cuda.current_stream()
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iterations)]
        for start, end in events:
            start.record(main)
            workload.step()
            end.record(main)
        torch.cuda.synchronize()
        return [start.elapsed_time(end) for start, end in events]
    times = []
    for _ in range(iterations):
        t0 = time.perf_counter_ns()
        workload.step()
        times.append((time.perf_counter_ns() - t0) / 1e6)
    return times


def _barrier(d) -> None:
    import torch.distributed as dist

    if d.initialized:
        if d.is_cuda:
            dist.barrier(device_ids=[d.local_rank])
        else:
            dist.barrier()


def _gather(d, obj) -> list:
    import torch.distributed as dist

    if not d.initialized:
        return [obj]
    out = [None] * d.world_size
    dist.all_gather_object(out, obj)
    return out


def collect_run(config: CollectConfig, run_dir: Path, *, run_id: str | None = None) -> dict | None:
    """Run ``config`` on this rank and write its files into ``run_dir``; rank 0 also writes the manifest.

    Returns the manifest on rank 0, None elsewhere. Raises whatever the run raised, after
    writing this rank's one-line error (and, on rank 0, a failed manifest).
    """
    import torch.distributed as dist

    from overlapviz.collectors.workload import Workload, init_dist

    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    rid = run_id or make_run_id(config)
    start_time = mf.now_iso()
    rank = int(os.environ.get("RANK", "0"))
    known = {"start_time": start_time}
    d = workload = None
    try:
        d = init_dist(config)  # first: CUDA_DEVICE_MAX_CONNECTIONS must be set before CUDA starts
        known.update(mf.versions())
        known.update(world_size=d.world_size, backend=d.backend)
        workload = Workload(config, d)
        checks = workload.check() if config.check else {}
        times = measure(workload, config.iterations)
        warm = config.warmup_iterations
        mf.write_json_atomic(
            run_dir / mf.TIMINGS.format(rank=d.rank),
            {"rank": d.rank, "iterations": [
                {"iteration": i, "time_ms": t, "measured": i >= warm} for i, t in enumerate(times)
            ]},
        )
        _barrier(d)
        with Profiler(run_dir, d.rank, cuda=d.is_cuda, enabled=config.profiler == "torch"):
            for i in range(config.trace_iterations):
                with iteration(i):
                    workload.step()
                # each traced iteration starts on an idle device, so a comm kernel's ready time
                # is its launch: otherwise it also waits, through an event, for the previous
                # iteration's GEMM on another stream, which start-delay analysis cannot see
                workload.synchronize()
        # the one CI definition (overlapviz.analysis.statistics): the manifest's interval is the one
        # `overlapviz compare`, the report and the dashboard show for the same iterations
        med, lo, hi = bootstrap_median(times[warm:])
        mine = {"rank": d.rank, "median_ms": med, "ci_low_ms": lo, "ci_high_ms": hi, "n_measured": len(times) - warm,
                "confidence": DEFAULT_LEVEL}
        device = mf.device_row(d.device.index or 0, workload.ext) if d.is_cuda else None
        if device is not None:
            device["rank"] = d.rank
        gathered = _gather(d, (mine, device, checks))
        if d.rank != 0:
            _barrier(d)  # stay until rank 0 has written the manifest: no teardown under its feet
            return None
        eff = dict(workload.effective, checks=[g[2] for g in gathered], dist=d.notes)
        devices = [g[1] for g in gathered if g[1] is not None]
        run = mf.run_record(
            config, run_id=rid, status="ok",
            comm_priority=eff.get("comm_priority_requested"),
            comm_priority_effective=eff.get("comm_priority_effective"),
            device_name=devices[0]["name"] if devices else None,
            **known,
        )
        data = mf.manifest(config, run, devices=devices, effective=eff, measurement={"ranks": [g[0] for g in gathered]})
        mf.write_manifest(run_dir, data)
        _barrier(d)
        return data
    except BaseException as exc:  # also KeyboardInterrupt/SIGTERM: the run is recorded as failed
        message = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}".strip()
        (run_dir / mf.ERROR.format(rank=rank)).write_text(message + "\n")
        if rank == 0:
            with contextlib.suppress(Exception):
                known = {**mf.versions(), **known}
            run = mf.run_record(config, run_id=rid, status="failed", error=message, **known)
            mf.write_manifest(run_dir, mf.manifest(config, run, effective=workload.effective if workload else None))
        raise
    finally:
        if workload is not None:
            workload.close()
        if d is not None and d.initialized and dist.is_initialized():
            dist.destroy_process_group()


@contextlib.contextmanager
def _output_to(path: Path):
    """Send this process's stdout and stderr (file descriptors 1 and 2, C libraries included) to ``path``."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(path, "ab") as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)


def _device_healthy() -> bool:
    """False when the GPU context is broken (a sticky CUDA error): the rest must run in a fresh process."""
    import torch

    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return True
    try:
        torch.cuda.synchronize()
        return True
    except Exception:
        return False


def run_batch(items: list[dict], *, status_fd: int | None = None) -> int:
    """Run single-process configurations one after another in this process.

    ``items``: ``{"config": {...}, "run_dir": str, "run_id": str}`` each. Every run writes
    its own directory (its output goes to its ``collect.log``) exactly as a run in its own
    process would. On ``status_fd`` the parent reads ``start <i>`` and ``end <i> ok|failed``
    lines, by which it enforces each run's timeout. Returns 0, or 3 when a failure left
    the GPU unusable (the parent then runs the rest in a new process).
    """
    status = os.fdopen(status_fd, "w", buffering=1) if status_fd is not None else None

    def say(line: str) -> None:
        if status is not None:
            status.write(line + "\n")
            status.flush()

    for i, item in enumerate(items):
        config = CollectConfig.from_dict(item["config"], where=f"batch item {i}")
        run_dir = Path(item["run_dir"])
        run_dir.mkdir(parents=True, exist_ok=True)
        say(f"start {i}")
        ok = True
        with _output_to(run_dir / mf.LOG):
            print(f"{item['run_id']}: in a batch process (pid {os.getpid()}, item {i + 1} of {len(items)})", flush=True)
            try:
                data = collect_run(config, run_dir, run_id=item["run_id"])
                ranks = data["measurement"]["ranks"]
                print(f"{item['run_id']}: ok, median {ranks[0]['median_ms']:.4f} ms -> {run_dir}", flush=True)
            except Exception:
                traceback.print_exc()
                ok = False
        say(f"end {i} {'ok' if ok else 'failed'}")
        if not ok and not _device_healthy():
            return 3
        gc.collect()
        try:
            import torch

            if torch.cuda.is_available() and torch.cuda.is_initialized():
                torch.cuda.empty_cache()
        except Exception:
            pass
    return 0


def _parser() -> argparse.ArgumentParser:
    import dataclasses

    p = argparse.ArgumentParser(prog="python -P -m overlapviz.collectors.run", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--preset", help="a preset name (cb_ar, cb_ar_standin, gloo_smoke, ...)")
    src.add_argument("--config", help="a JSON file with configuration fields")
    src.add_argument("--config-json", help="the configuration as a JSON object")
    src.add_argument("--batch", metavar="FILE", help="a JSON list of {config, run_dir, run_id}: run them one after another here")
    p.add_argument("--status-fd", type=int, default=None, help="with --batch: file descriptor for start/end lines")
    out = p.add_mutually_exclusive_group(required=False)
    out.add_argument("--out", help="a sweep directory: the run goes to OUT/runs/<run_id>/")
    out.add_argument("--run-dir", help="the run directory itself")
    p.add_argument("--run-id", help="the run id (default: derived from the configuration)")
    for f in dataclasses.fields(CollectConfig):
        p.add_argument(f"--{f.name.replace('_', '-')}", dest=f"set_{f.name}", default=None, help=f.metadata["help"])
    return p


def config_from_args(args: argparse.Namespace) -> CollectConfig:
    if args.preset:
        base = preset(args.preset)
    else:
        where = args.config or "--config-json"
        try:
            data = json.loads(Path(args.config).read_text() if args.config else args.config_json)
        except (OSError, json.JSONDecodeError) as exc:
            raise ValueError(f"{where}: cannot read the configuration: {exc}") from None
        base = CollectConfig.from_dict(data, where=where)
    changes = {k[4:]: coerce(k[4:], v, where="option") for k, v in vars(args).items() if k.startswith("set_") and v is not None}
    try:
        return base.replace(**changes)
    except ValueError as exc:
        raise ValueError(f"options: {exc}") from None


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.batch:
        try:
            items = json.loads(Path(args.batch).read_text())
        except (OSError, json.JSONDecodeError) as exc:
            print(f"error: {args.batch}: cannot read the batch: {exc}", file=sys.stderr)
            return 2
        return run_batch(items, status_fd=args.status_fd)
    if not (args.out or args.run_dir):
        parser.error("one of the arguments --out --run-dir is required")
    try:
        config = config_from_args(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if "LOCAL_WORLD_SIZE" in os.environ and config.backend != "stand-in":
        # under torchrun the launcher decides the processes per node (torchrun would take a
        # --nproc option for its own --nproc-per-node, so run.sh cannot pass one)
        config = config.replace(nproc=int(os.environ["LOCAL_WORLD_SIZE"]))
    rid = args.run_id or make_run_id(config)
    run_dir = Path(args.run_dir) if args.run_dir else Path(args.out) / "runs" / rid
    try:
        data = collect_run(config, run_dir, run_id=rid)
    except Exception:
        traceback.print_exc()
        return 1
    if data is not None:
        ranks = data["measurement"]["ranks"]
        print(f"{rid}: ok, rank 0 median {ranks[0]['median_ms']:.4f} ms -> {run_dir}", flush=True)
    return 0


if __name__ == "__main__":
    from overlapviz.collectors.launch import stay_with_parent

    stay_with_parent()  # no rank outlives its launcher (torchrun killed while starting it, the sweep killed)
    code = main()
    # the run's files are written and its process group destroyed: leave without the C++ teardown, where gloo's
    # threads can abort a rank that succeeded ("terminate called without an active exception", SIGABRT), which
    # torchrun then reports as a failed run (seen in a CI run of the kill test). An exception still exits as usual.
    import logging

    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
