"""``overlapviz collect``: run the overlap experiment (a preset, a config file or a sweep) and ingest it."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import click

from overlapviz.cli._dataset import check_output

from overlapviz.collectors.config import (
    PRESETS,
    CollectConfig,
    coerce,
    field_types,
    preset,
    run_id,
)

# collectors.scenarios.SCENARIOS' names, spelled here so that `collect --help` does not import the scenarios (a fifth of
# its time; a test checks they agree)
SCENARIOS = ("dependency", "sm_resources_smem", "sm_resources_regs", "fits", "stream_order", "host_late")


def _knob_options(fn):
    """One ``--<field>`` option per configuration field, help from the field's metadata."""
    types = field_types()
    for f in reversed(dataclasses.fields(CollectConfig)):
        t = types[f.name]
        click_type = {int: str, float: str, bool: str}.get(t, str)  # parsed by config.coerce (accepts "none")
        fn = click.option(
            f"--{f.name.replace('_', '-')}", f"knob_{f.name}", type=click_type, default=None,
            help=f"{f.metadata['help']} [default: the preset's]", show_envvar=False,
        )(fn)
    return fn


@click.command("collect")
@click.option("--preset", "preset_name", metavar="NAME", help=f"One configuration from a preset: {', '.join(PRESETS)}.")
@click.option("--sweep", "sweep_file", metavar="FILE|NAME",
              help="A TOML sweep file (see docs/collect.md), or a sweep shipped with overlapviz by name: "
                   "cpu_tour (CPU, 2 gloo processes), h200_paper_grid (one GPU, stand-in), h200_standin.")
@click.option("--config", "config_file", type=click.Path(dir_okay=False, readable=False, path_type=str), help="One configuration from a JSON file of fields.")
@click.option("--scenario", "scenario_names", metavar="NAME|all",
              help="Ground-truth scenarios (one GPU, stand-in comm) whose start-delay cause is known by construction: "
                   f"all, or a comma-separated list of: {', '.join(SCENARIOS)}. Each is recorded with and without CUDA sync events; "
                   "takes no configuration options.")
@click.option("-o", "--output", "out", required=True, type=click.Path(file_okay=False, readable=False, path_type=str),
              help="Sweep directory: runs go to DIR/runs/<run_id>/, the dataset to DIR/dataset.")
@click.option("--launcher", default=None, metavar="CMD",
              help="Command prefix that starts every rank, followed by '-m overlapviz.collectors.run ...' "
                   "(e.g. 'srun torchrun --nnodes 2 --nproc-per-node 8 ...'). Default: python, or torchrun --standalone for --nproc > 1.")
@click.option("--no-ingest", is_flag=True, help="Do not ingest the runs into DIR/dataset at the end.")
@click.option("--retry-failed", is_flag=True, help="Run again the configurations recorded as failed (by default a failed run is finished).")
@click.option("--no-check", is_flag=True,
              help="Do not check the sweep against this machine before running (skipped anyway with --launcher); "
                   "configurations that cannot run are then run and recorded as failed.")
@click.option("--isolate", is_flag=True,
              help="Run every single-process configuration in its own process (default: one after another in a batch "
                   "process, which starts CUDA and the profiler once).")
@click.option("--report", "print_report", is_flag=True,
              help="At the end print the sweep's table (workload, GEMM, controls, setup, time, TimeRatio, speedup, overlap); "
                   "with every run finished before, only prints it.")
@click.option("--list", "list_only", is_flag=True, help="Print the run ids (and whether finished) and run nothing.")
@click.option("--progress/--no-progress", default=None, help="Progress bar (default: when stderr is a terminal).")
@_knob_options
def collect(preset_name, sweep_file, config_file, scenario_names, out, launcher, no_ingest, retry_failed, no_check,
            isolate, print_report, list_only, progress, **knobs) -> None:
    """Run the computation-communication overlap experiment and ingest the traces.

    Exactly one of --preset, --sweep, --config or --scenario. The whole sweep is first
    checked against this machine (GPU, ranks, backend, compiler, memory); any problem
    stops it before the first run, with every problem listed. Each configuration then runs
    with its timeout (torchrun for several processes); a sweep that was interrupted is
    resumed by running the same command again: finished runs (manifest ok or failed) are
    kept, failed ones are retried with --retry-failed.

    \b
    overlapviz collect --sweep cpu_tour -o runs/cpu --report        # CPU only: 2 gloo processes
    overlapviz collect --preset cb_ar_standin -o runs/one --setup optimized
    overlapviz collect --sweep h200_paper_grid -o runs/h200          # one GPU: the paper's grid, stand-in
    overlapviz collect --preset cb_ar --nproc 8 -o runs/nccl       # torchrun, NCCL
    overlapviz collect --scenario all -o runs/scenarios             # one GPU, known causes
    """
    from overlapviz.collectors import manifest as mf
    from overlapviz.collectors import sweep as sw

    chosen = [x for x in (preset_name, sweep_file, config_file, scenario_names) if x]
    if len(chosen) != 1:
        raise click.UsageError("give exactly one of --preset, --sweep, --config or --scenario")
    check_output(out)  # a sweep directory may hold its sweep file; it may not be or lie in a dataset
    overrides = {k[len("knob_"):]: v for k, v in knobs.items() if v is not None}
    if scenario_names:
        _collect_scenarios(scenario_names, out, launcher, no_ingest, list_only, progress, overrides)
        return
    try:
        if sweep_file:
            sweep = sw.load_sweep(sweep_file, overrides=overrides)
        else:
            if preset_name:
                base = preset(preset_name)
                name = preset_name
            else:
                try:
                    data = json.loads(Path(config_file).read_text())
                except (OSError, json.JSONDecodeError) as exc:
                    raise ValueError(f"{config_file}: cannot read the configuration: {exc}") from None
                base = CollectConfig.from_dict(data, where=config_file)
                name = Path(config_file).stem
            values = {k: coerce(k, v, where="options") for k, v in overrides.items()}
            try:
                config = base.replace(**values)
            except ValueError as exc:
                raise ValueError(f"options: {exc}") from None
            sweep = sw.sweep_of_one(config, name)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None

    if list_only:
        for cfg in sweep.configs:
            rid = run_id(cfg)
            status = mf.run_status(Path(out) / sw.RUNS_DIR / rid) or "todo"
            click.echo(f"{rid}\t{status}")
        return
    from overlapviz.collectors.preflight import SweepNotRunnable

    try:
        outcomes = sw.run_sweep(sweep, out, launcher=launcher, progress=progress, retry_failed=retry_failed,
                                batch=not isolate, check=not no_check)
    except SweepNotRunnable as exc:
        raise click.ClickException(str(exc)) from None
    ran = [o for o in outcomes if not o.status.startswith("skipped")]
    ok = sum(o.status in ("ok", "skipped-ok") for o in outcomes)
    failed = [o for o in outcomes if o.status in ("failed", "skipped-failed")]
    click.echo(f"{sweep.name}: {len(outcomes)} runs, {ok} ok, {len(failed)} failed, "
               f"{len(outcomes) - len(ran)} finished before -> {Path(out) / sw.RUNS_DIR}")
    for o in failed:
        click.echo(f"  failed {o.run_id}: {o.error or (mf.read_manifest(o.run_dir) or {}).get('run', {}).get('error')}")
    if any(o.status == "skipped-failed" for o in outcomes):
        click.echo("  (failed runs are kept as finished; --retry-failed runs them again)")
    dataset = Path(out) / sw.DATASET_DIR
    if not no_ingest and (ran or not dataset.exists()):
        try:
            path = sw.ingest_sweep(out, progress=progress)
        except ValueError as exc:
            raise click.ClickException(str(exc)) from None
        click.echo(f"dataset: {path}")
    if print_report:
        from overlapviz.collectors import report

        if not dataset.exists():
            raise click.ClickException(f"{dataset}: no dataset to report on (drop --no-ingest)")
        click.echo("")
        click.echo(report.render(dataset))
    if failed and not ok:
        raise click.ClickException("every configuration failed")


def _collect_scenarios(names, out, launcher, no_ingest, list_only, progress, overrides) -> None:
    """``--scenario``: record the ground-truth scenarios (collectors/scenarios.py), then ingest them."""
    from overlapviz.collectors import manifest as mf
    from overlapviz.collectors import scenarios as sc
    from overlapviz.collectors import sweep as sw

    if overrides:
        # each scenario is a construction (grid, pad, streams): a changed knob could undo its cause
        raise click.UsageError(f"--scenario takes no configuration options (got --{next(iter(overrides)).replace('_', '-')})")
    try:
        chosen = sc.select(names)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    if list_only:
        for s in chosen:
            for sync in (True, False):
                rid = sc.run_id(s.name, sync)
                click.echo(f"{rid}\t{mf.run_status(Path(out) / sc.RUNS_DIR / rid) or 'todo'}")
        return
    results = sc.collect(chosen, out, launcher=launcher)
    failed = [r for r in results if r[1] != "ok"]
    click.echo(f"scenarios: {len(results)} runs, {len(results) - len(failed)} ok, {len(failed)} failed "
               f"-> {Path(out) / sc.RUNS_DIR}")
    for rid, _, error in failed:
        click.echo(f"  failed {rid}: {error}")
    if not no_ingest and len(failed) < len(results):
        try:
            path = sw.ingest_sweep(out, progress=progress)
        except ValueError as exc:
            raise click.ClickException(str(exc)) from None
        click.echo(f"dataset: {path}")
    if failed and len(failed) == len(results):
        raise click.ClickException("every scenario failed")
