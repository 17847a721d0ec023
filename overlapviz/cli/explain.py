"""``overlapviz explain``: the findings first (where communication time went, what would win it back), then why each collective started late (DESIGN.md's contracts)."""

from __future__ import annotations

import textwrap

import click

from overlapviz.cli._options import (dataset_argument, device_option, format_option, per_option, runs_option, scheduler_option,
                                     wide_option)

# the compact table's columns (--wide: all; JSON and CSV carry every column). kernel is
# RANK:START_NS, what `export --figure budget --kernel` takes
TABLE_COLUMNS = {
    "kernels": ["run_id", "kernel", "name", "launch_to_start_us", "cause", "peer_wait_us"],
    "summary": ["run_id", "rank", "stream_order_us", "dependency_us", "launch_call_us", "sm_resources_us",
                "launch_latency_us", "unknown_us", "peer_wait_us"],
    "instances": ["run_id", "instance", "n_ranks", "arrival_skew_us", "straggler", "max_peer_wait_us", "time_us", "busbw_gbps"],
    "breakdown": ["run_id", "rank", "step", "comm_us", "overlapped_us", "exposed_us", "peer_wait_us", "dependent_us",
                  "host_idle_us", "exposed_other_us"],
}  # fmt: skip
# headers above a table that could be misread without them
HEADERS = {
    "kernels": "launch_to_start_us = start − launch (the cause names what most of it was); peer_wait_us = how long this "
               "rank's kernel waited for the instance's last rank to start",
    "summary": "rank time (µs) the collectives spent waiting, by cause: the union over kernels, never more than the trace "
               "lasted (per-kernel sums: --wide, *_kernel_us)",
}  # fmt: skip


@click.command()
@dataset_argument
@runs_option()
@click.option("--findings", "findings_only", is_flag=True, help="The findings alone: one record per finding (kind, time_ns, "
              "ranks, evidence, action, text), largest first.")
@click.option("--breakdown", is_flag=True, help="Per run x rank (x step with --per step): exposed communication split into "
              "peer wait, dependent, host idle and other (int64 ns; *_us in the table).")
@per_option("With --breakdown: one row per rank or per profiler step / iteration.")
@click.option("--summary", is_flag=True, help="Per run x rank: the time collectives waited to start, by cause, and for peers.")
@click.option("--instances", is_flag=True, help="Per collective instance across ranks: arrival skew, straggler, bandwidth.")
@click.option("--all-kernels", is_flag=True, help="Explain every GPU activity (same rules), not only communication kernels.")
@device_option()
@format_option
@wide_option
@scheduler_option()
def explain(dataset: str, runs: tuple[str, ...], findings_only: bool, breakdown: bool, per: str, summary: bool, instances: bool,
            all_kernels: bool, device_name: str | None, fmt: str, wide: bool, scheduler: str | None) -> None:  # fmt: skip
    """Where each rank's communication time went, what would win it back, and why each collective started when it did.

    The table format begins with the findings of each run (plain sentences, largest time
    first), then one record per communication kernel: ready_ns = the latest of its launch
    call, the end of the previous activity on its stream and the end of the producers of
    the events its stream waited on; cause: stream_order | dependency | launch_call |
    sm_resources (no block fits beside the resident computation, by occupancy and grid;
    blocking_resource, blocker) | launch_latency | unknown | none; peer_wait_us: how long
    the kernel waited for its instance's last rank. Times are exact int64 ns; *_us
    columns are µs. docs/explain.md defines every column.
    """
    views = [v for v, on in (("--findings", findings_only), ("--breakdown", breakdown), ("--summary", summary),
                             ("--instances", instances)) if on]  # fmt: skip
    if len(views) > 1:
        raise click.UsageError(f"{' and '.join(views)} are different views: pick one")
    if per != "rank" and not breakdown:
        raise click.UsageError("--per step goes with --breakdown")
    from overlapviz.cli._dataset import kept_answer

    # a warm answer is printed as the process that computed it printed it: no pyarrow, pandas or dataset read
    text, keep = kept_answer(click.get_current_context(), dataset, use=not scheduler)
    if text is None:
        text = _answer(dataset, list(runs) or None, findings_only, breakdown, per, summary, instances, all_kernels, device_name,
                       fmt, wide, scheduler)  # fmt: skip
        keep(text)
    click.echo(text, nl=False)


def _answer(dataset, run_ids, findings_only, breakdown, per, summary, instances, all_kernels, device_name, fmt, wide,
            scheduler) -> str:  # fmt: skip
    """What ``explain`` prints (its whole standard output)."""
    kinds = ("comm", "compute", "memory", "other") if all_kernels else ("comm",)
    try:
        if instances and not (all_kernels or scheduler or device_name):  # the instances alone: no pandas (issue 36)
            from overlapviz.analysis import explain as explain_lib

            frame, view = _instance_records(explain_lib.instance_columns(dataset, run_ids=run_ids)), "instances"
        elif breakdown:
            frame = _breakdown(dataset, run_ids, per, scheduler)
            view = "breakdown"
        else:
            from overlapviz.analysis.findings import answer

            one_pass = findings_only and not (scheduler or all_kernels)  # the findings explain the ranks as they read them
            records = None if one_pass else _explain(dataset, run_ids, kinds, device_name, scheduler, instances)
            if one_pass:
                found, totals = answer(dataset, run_ids=run_ids, device=device_name)
            elif findings_only or (fmt == "table" and not (summary or instances)):
                comm_records = records.loc[records["kind"] == "comm"] if all_kernels else records
                found, totals = answer(dataset, run_ids=run_ids, device=device_name, explained=comm_records)
            if findings_only:
                frame, view = _findings_frame(found, fmt), "findings"
            elif summary:
                from overlapviz.analysis import explain as explain_lib

                frame, view = explain_lib.summarize(records), "summary"
            elif instances:
                from overlapviz.analysis import peers

                frame, view = peers.collective_instances(records), "instances"
            else:
                frame, view = records, "kernels"
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    out = []
    if view == "kernels" and fmt == "table" and not wide:
        frame = with_kernel_id(frame)
    if view == "breakdown" and fmt == "table":
        frame = _in_us(frame)
    if fmt == "table" and view == "kernels":
        out.append(findings_text(found, totals) + "\n\n")
    if fmt == "table" and view == "findings":  # sentences, every finding: a table would cut them
        return findings_text(found, totals, per_run=None) + "\n"
    if fmt == "table" and view in HEADERS:
        out.append("\n".join(textwrap.wrap(HEADERS[view], 118)) + "\n")
    columns = TABLE_COLUMNS.get(view)
    if view == "breakdown" and per == "rank":  # noqa: SIM102
        columns = [c for c in columns if c != "step"]
    from overlapviz.cli._table import render_output

    out.append(render_output(frame, fmt, columns=columns, wide=wide) + ("" if fmt == "csv" else "\n"))
    return out[0] if len(out) == 1 else "".join(out)


def _explain(dataset, run_ids, kinds, device_name, scheduler, instances=False):
    if scheduler:
        from overlapviz.distributed import client_for, explain_on

        with client_for(scheduler) as client:
            return explain_on(client, dataset, run_ids=run_ids, kinds=kinds, device=device_name)
    from overlapviz.analysis import explain as explain_lib

    # --instances: the few columns its table reads, kept per kernel as each rank is explained
    columns = explain_lib.INSTANCE_READS if instances else None
    return explain_lib.explain(dataset, run_ids=run_ids, kinds=kinds, device=device_name, columns=columns)


def _breakdown(dataset, run_ids, per, scheduler):
    if scheduler:
        from overlapviz.distributed import breakdown_on, client_for

        with client_for(scheduler) as client:
            return breakdown_on(client, dataset, run_ids=run_ids, per=per)
    from overlapviz.analysis.breakdown import breakdown

    return breakdown(dataset, run_ids=run_ids, per=per)


def _instance_records(columns: dict):
    """``explain_lib.instance_columns`` as records to print, valued as ``peers.collective_instances``' frame is."""
    from overlapviz.cli._table import Columns

    data = {}
    for name, v in columns.items():
        if not isinstance(v, tuple):
            data[name] = v.tolist()
        else:
            data[name] = [None if null else x for x, null in zip(v[0].tolist(), v[1].tolist())]
    return Columns(data, text=("run_id", "instance", "collective", "clock_note"))


def _in_us(frame):
    """The breakdown's ns columns as µs for the table (JSON and CSV keep the exact ns)."""
    from overlapviz.analysis.breakdown import COLUMNS

    return frame.assign(**{c[:-3] + "_us": frame[c] / 1000.0 for c in COLUMNS})


def _findings_frame(found, fmt: str):
    if fmt == "csv":
        import orjson

        return found.assign(evidence=[orjson.dumps(e).decode() for e in found["evidence"]],
                            ranks=[" ".join(map(str, r)) for r in found["ranks"]])  # fmt: skip
    return found


def findings_text(found, totals=None, *, per_run: int | None = 6) -> str:
    """The findings as the table format prints them: per run its breakdown in a sentence, then a
    numbered sentence per finding with its action."""
    from overlapviz.analysis.findings import headline

    heads = {} if totals is None else {r["run_id"]: headline(r) for r in totals.to_dict("records")}
    if not len(found) and not heads:
        return "No findings: no communication time to account for."
    lines = []
    for run_id in dict.fromkeys(list(heads) + list(found["run_id"])):  # the dataset's run order
        f = found.loc[found["run_id"] == run_id]
        lines.append(f"run {run_id}")  # the id on its own line, whole, as the tables print it
        if run_id in heads:
            lines.extend(textwrap.wrap(heads[run_id][0].upper() + heads[run_id][1:] + ".", 118, initial_indent="  ",
                                       subsequent_indent="  ", break_long_words=False, break_on_hyphens=False))  # fmt: skip
        if not len(f):
            lines.append("  No findings.")
            continue
        lines.append("  Where it went and what would win it back, largest first:")
        for i, row in enumerate((f if per_run is None else f.head(per_run)).itertuples(), 1):
            lines.extend(textwrap.wrap(f"{i}. [{row.kind}] {row.text}", 118, initial_indent="  ", subsequent_indent="     ",
                                       break_long_words=False, break_on_hyphens=False))  # fmt: skip
            lines.extend(textwrap.wrap(f"-> {row.action}", 118, initial_indent="     ", subsequent_indent="        ",
                                       break_long_words=False, break_on_hyphens=False))  # fmt: skip
        if per_run is not None and len(f) > per_run:
            lines.append(f"     ({len(f) - per_run} more: overlapviz explain --findings)")
    return "\n".join(lines)


def with_kernel_id(frame):
    """``frame`` with ``kernel`` = ``RANK:START_NS`` (exact int64 ns), the id ``export --kernel`` takes."""
    if not {"rank", "start_ns"} <= set(frame.columns):
        return frame
    ids = [f"{r}:{s}" for r, s in zip(frame["rank"].tolist(), frame["start_ns"].tolist())]
    return frame.assign(kernel=ids)
