"""``overlapviz advise``: the padding, tile or carve-out that lets communication blocks fit beside a computation kernel."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from overlapviz.cli._options import device_option, format_option, runs_option, wide_option

if TYPE_CHECKING:
    from overlapviz.analysis.advise import Footprint

# the compact table's columns (--wide: all; JSON and CSV carry every column)
TABLE_COLUMNS = ["lever", "setting", "compute_blocks_per_sm", "comm_blocks_fit_per_sm", "meets_target", "recommended"]


def _shape(spec: str | None, flag: str) -> Footprint | None:
    from overlapviz.analysis.advise import Footprint

    if spec is None:
        return None
    parts = spec.split(",")
    try:
        nums = [int(p) for p in parts]
    except ValueError:
        raise click.BadParameter(f"{spec!r} is not THREADS,REGS[,SMEM_BYTES[,GRID]]", param_hint=flag) from None
    if not 2 <= len(nums) <= 4:
        raise click.BadParameter(f"{spec!r} is not THREADS,REGS[,SMEM_BYTES[,GRID]]", param_hint=flag)
    try:
        return Footprint(nums[0], nums[1], nums[2] if len(nums) > 2 else 0, nums[3] if len(nums) > 3 else None)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint=flag) from None


def _carveout_of(dataset, run_id, compute) -> int | None:
    """The carve-out preference a collected run set on this computation kernel (None: the driver's default)."""
    from overlapviz.analysis.residency import run_carveouts

    if dataset is None or not compute.name:
        return None
    prefs = run_carveouts(dataset)
    rid = run_id if run_id is not None else (next(iter(prefs)) if len(prefs) == 1 else None)
    percent, _note, names = prefs.get(rid, (None, None, frozenset()))
    return percent if compute.name in names else None


@click.command()
@click.argument("dataset", required=False, type=click.Path(readable=False, path_type=str))  # advise says what is wrong, in one line
@click.option("--compute", "compute_re", metavar="REGEX", help="Computation kernel: name regex in DATASET (its most time-consuming shape).")
@click.option("--comm", "comm_re", metavar="REGEX", default="nccl|rccl", show_default=True, help="Communication kernel: name regex in DATASET.")
@runs_option("The run to take kernels and device from (needed when DATASET has several).")
@click.option("--compute-shape", metavar="T,R[,S[,G]]", help="Computation footprint: threads, registers, shared memory bytes, grid blocks.")
@click.option("--comm-shape", metavar="T,R[,S[,G]]", help="Communication footprint: threads, registers, shared memory bytes, grid blocks.")
@device_option("The GPU of --compute-shape / --comm-shape, without DATASET", "; a product name also gives its SM count")
@click.option("-k", "k", type=click.IntRange(min=1), default=1, show_default=True, help="Communication blocks wanted per SM.")
@format_option
@wide_option
def advise(dataset, compute_re, comm_re, runs, compute_shape, comm_shape, device_name, k, fmt, wide) -> None:
    """What lets K communication blocks fit beside a computation kernel on one SM.

    Footprints come from DATASET (kernels picked by --compute / --comm name regexes;
    other launch shapes of the computation kernel are tried as alternative tiles) or
    from --compute-shape / --comm-shape with --arch. Options: the smallest shared-memory
    padding per computation block, another tile, or a carve-out, each with its cost in
    computation residency (blocks per SM, occupancy, waves).
    """
    from overlapviz.analysis import advise as advise_lib
    from overlapviz.cli._table import render_output

    if len(runs) > 1:
        raise click.UsageError(f"--run given {len(runs)} times: advise takes the kernels of one run")
    run_id = runs[0] if runs else None
    try:
        compute = _shape(compute_shape, "--compute-shape")
        comm = _shape(comm_shape, "--comm-shape")
        alternatives = []
        limits = None
        if dataset is not None:
            if compute is None:
                if not compute_re:
                    raise click.UsageError("name the computation kernel: --compute REGEX or --compute-shape T,R,S")
                shapes, limits = advise_lib.footprints_from_dataset(dataset, compute_re, run_id=run_id)
                compute, alternatives = shapes[0], shapes[1:]
            if comm is None:
                comm_shapes, limits_c = advise_lib.footprints_from_dataset(dataset, comm_re, run_id=run_id)
                comm, limits = comm_shapes[0], limits or limits_c
        if limits is None:
            if not device_name:
                raise click.UsageError("without kernels from a DATASET, give the device: --arch or --device-name")
            from overlapviz.analysis.residency import device_override

            limits = device_override(device_name)
        if compute is None or comm is None:
            raise click.UsageError("both footprints are needed: DATASET with --compute/--comm, or --compute-shape and --comm-shape")
        frame = advise_lib.advise(
            limits, compute, comm, k=k, alternatives=alternatives, carveout=_carveout_of(dataset, run_id, compute)
        )
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    if fmt == "table":
        click.echo(f"computation:   {compute.name or 'given'} ({compute.describe()})\n"
                   f"communication: {comm.name or 'given'} ({comm.describe()}); k={k}")
    click.echo(render_output(frame, fmt, columns=TABLE_COLUMNS, wide=wide), nl=fmt != "csv")
    if fmt == "table" and not frame["meets_target"].any():
        alone = frame.loc[0]
        click.echo(
            f"no option lets {k} communication block(s) fit beside even one computation block "
            f"(limited by {alone['fit_limiter']}); the communication kernel's own footprint must shrink"
        )
