"""Several profiling cycles of several ranks (issue 32): one run per cycle of all ranks.

On real traces (tests/data/gloo_cycles, README there): torch 2.13's
``tensorboard_trace_handler`` with ``schedule(wait=1, warmup=1, active=2, repeat=3)``
on a 2-rank job writing into ``rank_<N>/`` folders and a 3-rank job writing into one folder.
What belongs together is read from the files themselves here (their ``distributedInfo.rank``
and ``ProfilerStep#N`` ranges), not from the grouping code.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from overlapviz.cli import main
from overlapviz.ingest.cycles import CycleFile, group_cycles
from overlapviz.dataset.schema import read_frame
from overlapviz.testing import ingest_cli

DATA = Path(__file__).parent / "data" / "gloo_cycles"
LAYOUTS = {"per_rank": 2, "flat": 3}


def _facts(path: Path) -> tuple[int, frozenset[int]]:
    doc = json.loads(gzip.decompress(path.read_bytes()))
    steps = frozenset(int(e["name"].split("#")[1]) for e in doc["traceEvents"] if e.get("name", "").startswith("ProfilerStep#"))
    return doc["distributedInfo"]["rank"], steps


def _expected(layout: str) -> dict[frozenset[int], dict[int, str]]:
    """steps of a cycle -> {rank: file name}, from the files."""
    out: dict[frozenset[int], dict[int, str]] = {}
    for f in sorted((DATA / layout).rglob("*.pt.trace.json.gz")):
        rank, steps = _facts(f)
        out.setdefault(steps, {})[rank] = f.name
    return out


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_cycles_become_runs_of_all_ranks(tmp_path, layout):
    world = LAYOUTS[layout]
    expected = _expected(layout)
    assert len(expected) == 3 and all(sorted(v) == list(range(world)) for v in expected.values())
    result = CliRunner().invoke(main, ["ingest", str(DATA / layout), "-o", str(tmp_path / "ds")])
    assert result.exit_code == 0, result.output
    assert result.output.strip().endswith(f"; {layout}: {3 * world} files of {world} ranks grouped into 3 cycles "
                                          "by profiler step"), result.output  # fmt: skip
    ranks = read_frame(tmp_path / "ds", "ranks")
    want_runs = [f"{layout}_cycle{k}" for k in (1, 2, 3)]
    assert sorted(set(ranks["run_id"])) == want_runs
    by_steps = sorted(expected.items(), key=lambda kv: min(kv[0]))
    for run_id, (steps, files) in zip(want_runs, by_steps):
        mine = ranks[ranks["run_id"] == run_id].sort_values("rank")
        assert mine["rank"].tolist() == list(range(world))
        assert [Path(p).name for p in mine["source_path"]] == [files[r] for r in range(world)]
        kernel_steps = set(read_frame(tmp_path / "ds", "steps").query("run_id == @run_id")["step"])
        assert kernel_steps == set(steps)
    # the cross-rank view is back: each cycle's all-reduces are instances of every rank
    result = CliRunner().invoke(main, ["explain", str(tmp_path / "ds"), "--instances", "--format", "json"])
    assert result.exit_code == 0, result.output
    instances = json.loads(result.output)
    assert instances and {i["n_ranks"] for i in instances} == {world}


def test_run_id_and_loose_files(tmp_path):
    files = sorted((DATA / "flat").glob("*.pt.trace.json.gz"))
    out, result = ingest_cli(tmp_path, *files, name="loose")
    assert sorted(set(read_frame(out, "ranks")["run_id"])) == ["flat_cycle1", "flat_cycle2", "flat_cycle3"]
    result = CliRunner().invoke(main, ["ingest", str(DATA / "per_rank"), "--run-id", "job", "-o", str(tmp_path / "id"),
                                       "--quiet"])  # fmt: skip
    assert result.exit_code == 0, result.output
    ranks = read_frame(tmp_path / "id", "ranks")
    assert sorted(set(ranks["run_id"])) == ["job_cycle1", "job_cycle2", "job_cycle3"]
    assert ranks.groupby("run_id")["rank"].apply(sorted).tolist() == [[0, 1]] * 3


def test_rank_folders_of_one_cycle_are_one_run(tmp_path):
    """``rank_<N>/`` folders holding one trace each: one run of all ranks (was a run per folder)."""
    import shutil

    for r in (0, 1):
        (tmp_path / "job" / f"rank_{r}").mkdir(parents=True)
        shutil.copy(DATA.parent / "gloo_cpu" / f"rank{r}.json.gz", tmp_path / "job" / f"rank_{r}" / "trace.json.gz")
    out, _ = ingest_cli(tmp_path, tmp_path / "job")
    ranks = read_frame(out, "ranks")
    assert ranks["run_id"].tolist() == ["job", "job"] and sorted(ranks["rank"]) == [0, 1]


def _file(worker: str, stamp: int, step: int | None, rank: int | None = None) -> CycleFile:
    return CycleFile(Path(f"{worker}.{stamp}.pt.trace.json.gz"), "chrome", worker, stamp, rank, step)


def test_without_steps_cycles_go_by_order():
    """No profiler steps: the k-th file of each worker (by the handler's timestamp) is cycle k,
    whatever the workers' clocks put between them."""
    files = [_file("a_1", 1_700_000_000_300, None, 0), _file("a_1", 1_700_000_000_100, None, 0),
             _file("b_2", 1_700_000_000_350, None, 1), _file("b_2", 1_700_000_000_120, None, 1)]  # fmt: skip
    g = group_cycles("job", files)
    assert [rid for rid, _ in g.runs] == ["job_cycle1", "job_cycle2"]
    assert [[p.name.split(".")[1] for p, _ in fs] for _, fs in g.runs] == [["1700000000100", "1700000000120"],
                                                                          ["1700000000300", "1700000000350"]]
    assert g.summary == "4 files of 2 ranks grouped into 2 cycles by cycle order (no profiler steps to match)"
    assert group_cycles("job", [_file("a_1", 1, 5), _file("b_2", 1, 5)]) is None  # one cycle: not regrouped


def test_cycles_under_other_names(tmp_path):
    """Per-cycle files under names of the user's own (``rank<N>_step<first>.json.gz``): the
    ranks repeat in one folder, so the files are grouped by the profiler steps they hold."""
    import shutil

    job = tmp_path / "job"
    job.mkdir()
    for f in (DATA / "flat").glob("*.pt.trace.json.gz"):
        rank, steps = _facts(f)
        shutil.copy(f, job / f"rank{rank}_step{min(steps)}.json.gz")
    result = CliRunner().invoke(main, ["ingest", str(job), "-o", str(tmp_path / "ds")])
    assert result.exit_code == 0, result.output
    assert result.output.strip().endswith("; job: 9 files of 3 ranks grouped into 3 cycles by profiler step")
    ranks = read_frame(tmp_path / "ds", "ranks")
    for k, first in zip((1, 2, 3), (2, 6, 10)):
        mine = ranks[ranks["run_id"] == f"job_cycle{k}"].sort_values("rank")
        assert [Path(p).name for p in mine["source_path"]] == [f"rank{r}_step{first}.json.gz" for r in range(3)]
