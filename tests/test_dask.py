"""overlapviz on a real Dask cluster (a scheduler and two worker processes on 127.0.0.1, started here).

The same datasets byte for byte as the local ingest, the same analyze and explain frames; a
worker killed mid-ingest is retried, a file that kills every worker fails the ingest with one
line naming it, a bad file with the local path's very line, and nothing is ever half-written.
The local path imports no Dask (checked in a fresh interpreter). Edge cases: a truncated
trace, a duplicate rank (an error raised by the client in file order), ranks across files for
peer matching, runs filtered by id, empty selections.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

distributed = pytest.importorskip("distributed")

import numpy as np
import pandas as pd
import pandas.testing as pdt
import pyarrow as pa
import pyarrow.parquet as pq

from overlapviz import distributed as ovd
from overlapviz.dataset import schema
from overlapviz.analysis import explain as explain_lib
from overlapviz.analysis import metrics
from overlapviz.analysis import residency as residency_lib
from overlapviz.distributed import cluster, partitions, timeline
from overlapviz.ingest import discover, ingest
from overlapviz.testing import generate_trace, write_trace

# a scheduler and two worker processes: `pytest -m slow` and CI run it
pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data"
SCENARIOS = ROOT / "sample_traces" / "scenarios" / "runs"  # real H200 traces, with syncs
SWEEP = ROOT / "sample_traces" / "h200_standin_sweep" / "runs"  # collected runs: manifests, timings
ALL_KINDS = ("comm", "compute", "memory", "other")


@pytest.fixture(scope="module")
def client():
    # allowed_failures=1: a task is retried once after its worker dies, and fails at the second death
    with ovd.client_for("local:2", memory_limit="1GiB", scheduler_kwargs={"allowed_failures": 1}) as c:
        yield c


@pytest.fixture(scope="module")
def job(tmp_path_factory) -> Path:
    """A generated 4-rank job: one run of four per-rank traces (positional peer matching)."""
    d = tmp_path_factory.mktemp("job") / "job4"
    d.mkdir()
    for rank in range(4):
        write_trace(generate_trace(3_000, rank=rank, world_size=4, seed=7), d / f"rank{rank}.json.gz")
    return d


def files_of(dataset: Path) -> dict[str, bytes]:
    return {str(p.relative_to(dataset)): p.read_bytes() for p in sorted(dataset.rglob("*")) if p.is_file()}


def assert_same_dataset(a: Path, b: Path) -> None:
    fa, fb = files_of(a), files_of(b)
    assert sorted(fa) == sorted(fb)
    for name in fa:
        assert fa[name] == fb[name], f"{name} differs"


def beside(out: Path) -> list[str]:
    return sorted(p.name for p in out.parent.iterdir())


# --- the local path stays Dask-free --------------------------------------------------------


def test_local_path_imports_no_dask(tmp_path):
    code = textwrap.dedent(
        """
        import sys
        from overlapviz.ingest import ingest
        from overlapviz.analysis.metrics import analyze_table
        from overlapviz.analysis.explain import explain
        import overlapviz.distributed  # the module itself imports Dask only when used
        import overlapviz.cli
        src, out = sys.argv[1:3]
        ingest([src], out, progress=False)
        print(analyze_table(out).num_rows, len(explain(out)))
        print(sorted(m for m in sys.modules if m.split(".")[0] in ("dask", "distributed")))
        """
    )
    result = subprocess.run([sys.executable, "-c", code, str(SCENARIOS), str(tmp_path / "ds")], capture_output=True,
                            text=True, timeout=120, check=False)  # fmt: skip
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert int(lines[0].split()[0]) > 0
    assert lines[-1] == "[]", result.stdout


def test_without_dask_one_line_naming_the_extra():
    code = "import sys; sys.modules['distributed'] = None\nfrom overlapviz.distributed import client_for\n" \
           "try:\n    client_for('local:1').__enter__()\nexcept ValueError as e:\n    print(e)\n"  # fmt: skip
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    assert "pip install 'overlapviz[dask]'" in result.stdout and len(result.stdout.strip().splitlines()) == 1


@pytest.mark.parametrize("address, needle", [
    ("", "no Dask scheduler given"),
    ("local:0", "at least one worker"),
    ("not an address", "neither a Dask scheduler address nor a scheduler file"),
    ("tcp://127.0.0.1:9", "cannot reach the Dask scheduler"),  # loopback, nothing listens on the discard port
])  # fmt: skip
def test_client_for_bad_addresses(address, needle, monkeypatch):
    monkeypatch.delenv(ovd.SCHEDULER_ENV, raising=False)
    with pytest.raises(ValueError, match=needle) as err, ovd.client_for(address, connect_timeout=2):
        pass
    assert len(str(err.value).splitlines()) == 1


# --- ingest ---------------------------------------------------------------------------------


def test_ingest_same_dataset_byte_for_byte(client, job, tmp_path, capsys):
    sources = [SCENARIOS, SWEEP, job, DATA / "gloo_cpu", DATA / "hta_trace_filter_2rank"]
    local = ingest(sources, tmp_path / "local", progress=False)
    n_files = sum(len(r.files) for r in discover(sources))
    remote = ovd.ingest_on(client, sources, tmp_path / "dask", progress=True)
    assert_same_dataset(local, remote)
    err = capsys.readouterr().err
    assert f"ingest:   0%|          | 0/{n_files} " in err  # tqdm's bar on stderr, moved by task completions
    assert max(int(n) for n in re.findall(rf"(\d+)/{n_files} ", err)) > 0
    assert beside(remote) == ["dask", "local"]  # no temporary or staging directory left


def test_relative_paths_where_workers_run_elsewhere(client, job, tmp_path, monkeypatch):
    monkeypatch.chdir(job.parent)  # this process only: the workers' working directory stays where they started
    out = ovd.ingest_on(client, [job.name], tmp_path / "ds", progress=False)
    sources = set(schema.read_table(out, "ranks").column("source_path").to_pylist())
    assert sources == {str(job / f"rank{r}.json.gz") for r in range(4)}  # made absolute, so the workers find them


def test_bad_file_same_one_line_error_nothing_written(client, job, tmp_path):
    bad = tmp_path / "in" / "badrun"
    bad.mkdir(parents=True)
    for rank in range(3):
        (bad / f"rank{rank}.json.gz").write_bytes((job / f"rank{rank}.json.gz").read_bytes())
    whole = (job / "rank3.json.gz").read_bytes()
    (bad / "rank3.json.gz").write_bytes(whole[: len(whole) // 2])  # truncated gzip
    (tmp_path / "out").mkdir()
    with pytest.raises(ValueError) as local_err:
        ingest([bad], tmp_path / "out" / "local", progress=False)
    with pytest.raises(ValueError) as dask_err:
        ovd.ingest_on(client, [bad], tmp_path / "out" / "dask", progress=False)
    assert str(dask_err.value) == str(local_err.value)
    assert "rank3.json.gz" in str(dask_err.value) and len(str(dask_err.value).splitlines()) == 1
    assert beside(tmp_path / "out" / "dask") == []


def test_duplicate_rank_same_error(client, job, tmp_path):
    dup = tmp_path / "dup"
    dup.mkdir()
    (dup / "a_rank0.json.gz").write_bytes((job / "rank0.json.gz").read_bytes())
    (dup / "b_rank0.json.gz").write_bytes((job / "rank1.json.gz").read_bytes())  # distributedInfo says rank 1
    (dup / "c_rank1.json.gz").write_bytes((job / "rank1.json.gz").read_bytes())
    # with a run id the grouping is the user's: a rank twice is an error, named as the local path names it
    with pytest.raises(ValueError) as local_err:
        ingest([dup], tmp_path / "local", run_id="one", progress=False)
    with pytest.raises(ValueError) as dask_err:
        ovd.ingest_on(client, [dup], tmp_path / "dask", run_id="one", progress=False)
    assert str(dask_err.value) == str(local_err.value) and "also comes from" in str(dask_err.value)
    assert not (tmp_path / "dask").exists()
    # grouped by their directory only, they are not one job's ranks: a run per file, as the local path makes them
    local = ingest([dup], tmp_path / "local", progress=False)
    assert len(schema.read_frame(local, "runs")) == 3
    assert_same_dataset(ovd.ingest_on(client, [dup], tmp_path / "dask", progress=False), local)


class _KillWhileWriting(distributed.WorkerPlugin):
    """In each worker: the first write of a kernels file (of a file named ``match``, every
    time with ``always``) writes half a Parquet file and then SIGKILLs its own worker process."""

    idempotent = True

    def __init__(self, flag: str, match: str = "", always: bool = False):
        self.flag, self.match, self.always = flag, match, always

    def setup(self, worker):
        import signal

        from overlapviz.dataset import schema as worker_schema

        real = worker_schema.write_kernels
        plugin = self

        def write_kernels(table, directory, run_id, rank):
            rel = worker_schema.kernels_file(run_id, rank)
            if plugin.match in rel:
                try:
                    fd = os.open(plugin.flag, os.O_CREAT | os.O_EXCL | os.O_WRONLY) if not plugin.always else None
                except FileExistsError:
                    return real(table, directory, run_id, rank)
                if fd is not None:
                    os.write(fd, str(os.getpid()).encode())
                    os.close(fd)
                else:
                    with open(plugin.flag, "a") as fh:
                        fh.write(f"{os.getpid()}\n")
                path = Path(directory) / rel
                path.parent.mkdir(exist_ok=True)
                path.write_bytes(b"PAR1" + b"\0" * 4096)  # a torn file, as a write cut short leaves
                os.kill(os.getpid(), signal.SIGKILL)  # this worker process, started by the test's cluster
            return real(table, directory, run_id, rank)

        worker_schema.write_kernels = write_kernels


@pytest.fixture
def killer(client):
    import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import the tests
    names = []

    def install(plugin, name):
        client.register_plugin(plugin, name=name)
        names.append(name)

    yield install
    for name in names:
        client.unregister_worker_plugin(name)
    # the plugin patched the workers' schema module: restart them clean for the next test
    client.restart(wait_for_workers=True)
    cloudpickle.unregister_pickle_by_value(sys.modules[__name__])


def test_worker_killed_mid_ingest_is_retried(client, job, tmp_path, killer):
    flag = tmp_path / "killed"
    killer(_KillWhileWriting(str(flag), match="rank2"), "kill-once")
    local = ingest([job], tmp_path / "local", progress=False)
    remote = ovd.ingest_on(client, [job], tmp_path / "dask", progress=False)
    assert flag.exists(), "no worker was killed"
    pid = int(flag.read_text())
    assert pid not in client.run(os.getpid).values()  # that worker is gone (its nanny started another)
    assert_same_dataset(local, remote)
    assert beside(remote) == ["dask", "killed", "local"]


def test_file_that_kills_every_worker_fails_naming_it(client, job, tmp_path, killer):
    flag = tmp_path / "killed"
    killer(_KillWhileWriting(str(flag), match="rank1", always=True), "kill-always")
    out = tmp_path / "out" / "dask"
    out.parent.mkdir()
    with pytest.raises(ValueError) as err:
        ovd.ingest_on(client, [job], out, progress=False)
    message = str(err.value)
    assert len(message.splitlines()) == 1 and "rank1.json.gz" in message and "died" in message, message
    assert len(flag.read_text().split()) == 2  # tried twice (allowed_failures=1)
    assert beside(out) == []  # nothing written, no temporary directory left


# --- analyze and explain ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def dataset(job, tmp_path_factory) -> Path:
    return ingest([SCENARIOS, SWEEP, job, DATA / "gloo_cpu"], tmp_path_factory.mktemp("ds") / "ds", progress=False)


@pytest.fixture(params=[partitions.BATCH_FILES, 1], ids=["batched", "file-per-task"])
def batch_files(request, monkeypatch):
    monkeypatch.setattr(partitions, "BATCH_FILES", request.param)


@pytest.mark.parametrize("per", ["rank", "step"])
def test_analyze_same_table(client, dataset, per, batch_files):
    local = metrics.analyze_table(dataset, per=per)
    remote = ovd.analyze_on(client, dataset, per=per)
    assert remote.num_rows == local.num_rows > 10
    assert remote.equals(local)
    runs = ["job4", "gloo_cpu"]
    assert ovd.analyze_on(client, dataset, per=per, run_ids=runs).equals(metrics.analyze_table(dataset, per=per, run_ids=runs))


def test_analyze_errors_as_local(client, dataset, tmp_path, monkeypatch):
    monkeypatch.setattr(partitions, "BATCH_FILES", 1)  # one task per kernels file: the errors meet on the client
    with pytest.raises(ValueError) as local_err:
        metrics.analyze_table(dataset, run_ids=["nope"])
    with pytest.raises(ValueError) as dask_err:
        ovd.analyze_on(client, dataset, run_ids=["nope"])
    assert str(dask_err.value) == str(local_err.value)
    # rows ending before they start, in two ranks: the message counts them over the whole dataset
    bad = tmp_path / "bad"
    meta = schema.read_metadata(dataset)
    with schema.DatasetWriter(bad) as w:
        for rel in [f for f in meta["kernel_files"] if "job4" in f or "gloo" in f]:
            t = pq.read_table(dataset / rel)
            if "job4" in rel:
                end = t.column("end_ns").to_pylist()
                end[5] = t.column("start_ns")[5].as_py() - 1
                t = t.set_column(t.schema.get_field_index("end_ns"), "end_ns", pa.array(end, pa.int64()))
            w.add_kernels(t, t.column("run_id")[0].as_py(), t.column("rank")[0].as_py())
        w.commit()
    with pytest.raises(ValueError) as local_err:
        metrics.analyze_table(bad)
    with pytest.raises(ValueError) as dask_err:
        ovd.analyze_on(client, bad)
    assert str(dask_err.value) == str(local_err.value) and "end_ns < start_ns" in str(local_err.value)


@pytest.fixture(scope="module")
def local_explained(dataset) -> dict:
    return {kinds: explain_lib.explain(dataset, kinds=kinds) for kinds in (("comm",), ALL_KINDS)}


@pytest.mark.parametrize("kinds", [("comm",), ALL_KINDS])
def test_explain_same_frame(client, dataset, kinds, local_explained):
    local = local_explained[kinds]
    remote = ovd.explain_on(client, dataset, kinds=kinds)
    assert len(local) > 100 and local["peer_wait_us"].notna().any()  # peers matched across ranks
    pdt.assert_frame_equal(remote, local)
    # --summary: per rank on the workers, one row each to the client
    pdt.assert_frame_equal(ovd.explain_on(client, dataset, kinds=kinds, summary=True), explain_lib.summarize(local))


@pytest.mark.parametrize("per", ["rank", "step"])
def test_breakdown_same_frame(client, dataset, per, monkeypatch):
    from overlapviz.analysis.breakdown import breakdown

    local = breakdown(dataset, per=per)
    assert len(local) > 1 and (local["peer_wait_ns"] > 0).any()  # peers matched across ranks
    pdt.assert_frame_equal(ovd.breakdown_on(client, dataset, per=per), local)
    monkeypatch.setattr(partitions, "BATCH_FILES", 1)  # one rank per task: waits still come from every rank
    pdt.assert_frame_equal(ovd.breakdown_on(client, dataset, per=per), local)
    runs = sorted(set(local["run_id"]))[:1]
    pdt.assert_frame_equal(ovd.breakdown_on(client, dataset, per=per, run_ids=runs), breakdown(dataset, per=per, run_ids=runs))


def test_explain_one_rank_per_task(client, dataset, local_explained, monkeypatch):
    monkeypatch.setattr(partitions, "BATCH_FILES", 1)  # the instance tables meet in a tree of several levels
    pdt.assert_frame_equal(ovd.explain_on(client, dataset, kinds=ALL_KINDS), local_explained[ALL_KINDS])


def test_explain_records_come_one_frame_per_task(client, dataset, local_explained, monkeypatch):
    """The client gets each task's ranks' records as one frame: per-rank frames grew it by ~85 KiB per rank."""
    from overlapviz.distributed import analysis as dist_analysis

    received = []

    def spy(*args, **kwargs):
        parts = dist_analysis_gather(*args, **kwargs)
        received.extend(len(part) for part in parts if kwargs.get("desc") == "explain")
        return parts

    dist_analysis_gather = dist_analysis.gather_in_order
    monkeypatch.setattr(dist_analysis, "gather_in_order", spy)
    ranks = len(local_explained[("comm",)].groupby(["run_id", "rank"]))
    remote = ovd.explain_on(client, dataset)
    pdt.assert_frame_equal(remote, local_explained[("comm",)])
    assert ranks > len(received) > 1 and set(received) == {1}, (ranks, received)


def test_explain_one_run(client, dataset):
    one = ovd.explain_on(client, dataset, run_ids=["job4"])
    pdt.assert_frame_equal(one, explain_lib.explain(dataset, run_ids=["job4"]))
    assert set(one["rank"]) == {0, 1, 2, 3} and one["instance"].notna().all()
    gloo = ovd.explain_on(client, dataset, run_ids=["gloo_cpu"])  # a real 2-rank job: its instances end together
    pdt.assert_frame_equal(gloo, explain_lib.explain(dataset, run_ids=["gloo_cpu"]))
    assert set(gloo["rank"]) == {0, 1} and gloo["peer_wait_us"].notna().any()


def test_explain_empty_selection(client, dataset):
    none = explain_lib.explain(dataset, run_ids=["nope"])
    pdt.assert_frame_equal(ovd.explain_on(client, dataset, run_ids=["nope"]), none)
    pdt.assert_frame_equal(ovd.explain_on(client, dataset, run_ids=["nope"], summary=True), explain_lib.summarize(none))


@pytest.fixture(scope="module")
def no_device(tmp_path_factory) -> Path:
    """A 4-rank job whose ranks 2 and 3 do not say which GPU they ran on (no deviceProperties)."""
    d = tmp_path_factory.mktemp("nodev") / "nodev"
    d.mkdir()
    for rank in range(4):
        trace = generate_trace(1_500, rank=rank, world_size=4, seed=11)
        if rank >= 2:
            trace.pop("deviceProperties")
        write_trace(trace, d / f"rank{rank}.json.gz")
    return ingest([d], d.parent / "ds", progress=False)


@pytest.mark.parametrize("device", ["NVIDIA H200", "sm_90"])
def test_explain_device_name_as_local(client, no_device, device):
    plain = explain_lib.explain(no_device)
    local = explain_lib.explain(no_device, device=device)
    guessed = local["rank"] >= 2
    # the test can fail: the name fills ranks 2 and 3 only (0 and 1 keep their A100)
    assert plain.loc[guessed, "residency_note"].str.contains("--device-name").all()
    assert (local.loc[guessed, "residency_note"].fillna("") != plain.loc[guessed, "residency_note"]).all()
    pdt.assert_frame_equal(local.loc[~guessed], plain.loc[~guessed])
    if device == "NVIDIA H200":
        assert (local.loc[guessed, "num_sms"] == 132).all() and (local.loc[~guessed, "num_sms"] == 108).all()
    pdt.assert_frame_equal(ovd.explain_on(client, no_device, device=device), local)
    pdt.assert_frame_equal(ovd.explain_on(client, no_device, device=device, summary=True), explain_lib.summarize(local))


def test_cli_explain_device_name_with_scheduler(client, no_device):
    from click.testing import CliRunner

    from overlapviz.cli import main

    runner = CliRunner()
    address = client.scheduler.address
    for args in (["--device-name", "NVIDIA H200"], ["--device-name", "sm_90", "--summary"], ["--device-name", "no such gpu"]):
        want = runner.invoke(main, ["explain", str(no_device), *args, "--format", "json"])
        got = runner.invoke(main, ["explain", str(no_device), *args, "--format", "json", "--scheduler", address])
        assert (got.exit_code, got.output) == (want.exit_code, want.output), args
    assert want.exit_code == 1 and "--device-name 'no such gpu'" in want.output


# --- residency -------------------------------------------------------------------------------


def test_residency_same_table(client, dataset, batch_files):
    local = residency_lib.kernel_residency(dataset)
    assert len(local) > 50 and local["blocks_per_sm"].notna().any()
    pdt.assert_frame_equal(ovd.residency_on(client, dataset), local)
    for runs in (["job4", "gloo_cpu"], ["gloo_cpu"], ["nope"]):  # gloo: host activities only, no row
        pdt.assert_frame_equal(ovd.residency_on(client, dataset, run_ids=runs), residency_lib.kernel_residency(dataset, run_ids=runs))


def test_residency_merge_over_ranks_is_exercised(dataset):
    """The test above can fail: job4's ranks give the same launch shapes different median grids (an even number of
    ranks: the median of medians is the mean of the two middle ones), so the merge over ranks is not trivial."""
    k = schema.read_frame(dataset, "kernels", columns=residency_lib.KERNEL_COLUMNS, run_ids=["job4"])
    shapes = residency_lib.rank_shapes(k, residency_lib.device_table(dataset), residency_lib.run_carveouts(dataset))
    spread = shapes.groupby(residency_lib.MERGE_KEYS, dropna=False)["grid_blocks_median"].agg(["nunique", "count"])
    assert ((spread["nunique"] > 2) & (spread["count"] % 2 == 0)).any()


def test_median_of_counts_is_pandas_groupby_median():
    from overlapviz.distributed.residency import median_of_counts

    rng = np.random.default_rng(5)
    for _ in range(20):
        n = int(rng.integers(1, 300))
        row = rng.integers(0, 12, n)
        value = rng.choice(np.concatenate([rng.normal(1e6, 1e5, 5), [0.1, 1 / 3, 2.5e15 + 1, 7.0]]), n)
        want = pd.DataFrame({"row": row, "value": pd.array(value, dtype="Float64")}).groupby("row")["value"].median()
        counts = pd.DataFrame({"row": row, "value": value, "count": 1}).groupby(["row", "value"])["count"].sum().reset_index()
        got = median_of_counts(counts["row"].to_numpy(), counts["value"].to_numpy(), counts["count"].to_numpy(), 12)
        assert np.isnan(got[np.setdiff1d(np.arange(12), row)]).all()
        assert got[want.index.to_numpy()].tolist() == want.to_numpy(np.float64).tolist()  # bit for bit


@pytest.mark.parametrize("device", [None, "NVIDIA H200", "sm_90"])
def test_residency_device_name_as_local(client, no_device, device):
    local = residency_lib.kernel_residency(no_device, device=device)
    if device is None:  # ranks 2 and 3 say nothing of their GPU: their shapes have no residency, and say why
        assert local["residency_note"].fillna("").str.contains("--device-name").any()
    else:
        assert set(local["device_name"]) == {"NVIDIA A100-SXM4-80GB", device}  # ranks 0-1 keep theirs: rows per device
    pdt.assert_frame_equal(ovd.residency_on(client, no_device, device=device), local)
    # all four ranks in one task (ranks with limits and without, or of two GPUs, in one stacked frame)
    with pytest.MonkeyPatch.context() as mp:  # the batches of every call on the cluster (partitions.plan_batches)
        mp.setattr(partitions, "file_batches", lambda root, files, client=None: [files])
        pdt.assert_frame_equal(ovd.residency_on(client, no_device, device=device), local)


def test_residency_errors_as_local(client, no_device, tmp_path):
    with pytest.raises(ValueError) as local_err:
        residency_lib.kernel_residency(no_device, device="no such gpu")
    with pytest.raises(ValueError) as dask_err:
        ovd.residency_on(client, no_device, device="no such gpu")
    assert str(dask_err.value) == str(local_err.value)
    # kernels files cut short: the same one line as the local read's, naming the file
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(no_device, broken)
    rels = schema.read_metadata(broken)["kernel_files"]
    for rel in (rels[1], rels[3]):
        data = (broken / rel).read_bytes()
        (broken / rel).write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError) as local_err:
        residency_lib.kernel_residency(broken)
    with pytest.raises(ValueError) as dask_err:
        ovd.residency_on(client, broken)
    assert str(dask_err.value) == str(local_err.value) and "Parquet" in str(local_err.value)
    assert str(broken / rels[1]) in str(local_err.value) and "\n" not in str(local_err.value)


def test_cli_residency_with_scheduler(client, no_device, dataset):
    """`residency --scheduler` (and OVERLAPVIZ_SCHEDULER) prints what `residency` prints, in every view and format."""
    from click.testing import CliRunner

    from overlapviz.cli import main

    runner = CliRunner()
    address = client.scheduler.address
    cases = [(no_device, []), (no_device, ["--device-name", "NVIDIA H200"]), (no_device, ["--device-name", "sm_90", "--kind", "comm"]),
             (no_device, ["--delays", "--device-name", "sm_90"]), (no_device, ["--device-name", "no such gpu"]),
             (dataset, ["--run", "job4", "--run", "scenario-dependency_sync-events-on"]), (dataset, ["--kind", "compute", "--wide"])]  # fmt: skip
    for ds, args in cases:
        for fmt in ("json", "table", "csv"):
            want = runner.invoke(main, ["residency", str(ds), *args, "--format", fmt], env={"OVERLAPVIZ_SCHEDULER": ""})
            got = runner.invoke(main, ["residency", str(ds), *args, "--format", fmt, "--scheduler", address])
            env = runner.invoke(main, ["residency", str(ds), *args, "--format", fmt], env={"OVERLAPVIZ_SCHEDULER": address})
            assert (got.exit_code, got.output) == (want.exit_code, want.output) == (env.exit_code, env.output), (args, fmt)
    assert want.exit_code == 0 and want.output.count("\n") > 10
    bad = runner.invoke(main, ["residency", str(no_device), "--device-name", "no such gpu", "--scheduler", address])
    assert bad.exit_code == 1 and "--device-name 'no such gpu'" in bad.output and bad.output.strip().count("\n") == 0


# --- the timeline --------------------------------------------------------------------------


def test_timeline_counts_and_window(client, dataset):
    kernels = schema.read_kernels(dataset, run_ids=["job4"])
    lanes, counts, (x0, x1) = ovd.timeline_counts_on(client, dataset, "job4", width=400)
    frame = kernels.to_pandas()
    assert lanes == sorted(set(zip(frame["rank"].astype(int), frame["stream"].astype(int))))
    assert (x0, x1) == (int(frame["start_ns"].min()), int(frame["end_ns"].max()))
    lane = [lanes.index((r, s)) for r, s in zip(frame["rank"].astype(int), frame["stream"].astype(int))]
    cat = [ovd.KINDS.index(k) for k in frame["kind"]]
    expected = timeline._coverage((frame["start_ns"] - x0).to_numpy(float), (frame["end_ns"] - x0).to_numpy(float), lane, cat,
                             len(ovd.KINDS), len(lanes), 400, 0.0, float(x1 - x0))  # fmt: skip
    assert (counts == expected).all() and counts.sum() > 0
    _, rows2, _ = ovd.timeline_counts_on(client, dataset, "job4", width=400, height=2)  # lanes summed into 2 rows
    half = [i * 2 // len(lanes) for i in range(len(lanes))]
    assert (rows2 == np.stack([counts[:, [i for i, h in enumerate(half) if h == r], :].sum(axis=1) for r in (0, 1)], axis=1)).all()
    t0, t1 = x0 + (x1 - x0) // 3, x0 + (x1 - x0) // 3 + 200_000
    window = ovd.timeline_window_on(client, dataset, "job4", (t0, t1), ranks=[1, 2])
    cut = frame[(frame["end_ns"] >= t0) & (frame["start_ns"] <= t1) & frame["rank"].isin([1, 2])]
    assert 0 < window.num_rows == len(cut)
    assert window.column("start_ns").to_pylist() == cut["start_ns"].tolist()


def test_progress_is_fed_by_task_completions(client, dataset):
    class Bar:
        def __init__(self):
            self.n = 0

        def update(self, n=1):
            self.n += n

    bar = Bar()
    futures = [client.submit(pow, 2, i, key=f"ovz-test-pow-{i}") for i in range(20)]
    out = list(cluster.in_order(client, futures, bar, str))
    del futures
    assert [v for _, v in out] == [2**i for i in range(20)] and bar.n == 20


def test_cli_scheduler_option_gives_the_local_answers(client, job, tmp_path):  # noqa: D103
    """--scheduler on ingest, analyze and explain (the module cluster's address; OVERLAPVIZ_SCHEDULER alike)."""
    from click.testing import CliRunner

    from overlapviz.cli import main

    address = client.scheduler.address
    runner = CliRunner()
    res = runner.invoke(main, ["ingest", str(job), "-o", str(tmp_path / "dask"), "-q", "--scheduler", address])
    assert res.exit_code == 0, res.output
    local = ingest([job], tmp_path / "local", progress=False)
    for cmd in (["analyze", "--per", "step"], ["explain"], ["explain", "--summary"]):
        want = runner.invoke(main, [cmd[0], str(local), *cmd[1:], "--format", "json"])
        got = runner.invoke(main, [cmd[0], str(tmp_path / "dask"), *cmd[1:], "--format", "json"], env={"OVERLAPVIZ_SCHEDULER": address})
        assert want.exit_code == 0 and got.exit_code == 0 and got.output == want.output, (cmd, got.output[:300])
    both = runner.invoke(main, ["ingest", str(job), "-o", str(tmp_path / "x"), "--workers", "2", "--scheduler", address])
    assert both.exit_code == 1 and "two engines" in both.output and not (tmp_path / "x").exists()


# --- the dashboard's timeline on the cluster (serve --scheduler) ----------------------------------


@pytest.fixture
def engine(client):
    """The dashboard store computing on the module's cluster, as `serve --scheduler` sets it."""
    from overlapviz.dashboards import dask_source, store

    source = dask_source.DaskSource(client)
    store.ENGINE["dask"] = source
    try:
        yield source
    finally:
        store.ENGINE["dask"] = None


def _layers(overlay) -> list:
    """What a timeline frame sends to the browser: each layer's data (the raster's pixels), and the axes."""
    return [el.dframe() for el in overlay] + [overlay.opts.get().kwargs.get(k) for k in ("yticks", "title", "height")]


def _timelines(dataset, run_id, ranks):
    from overlapviz.dashboards import store

    path, stamp = str(Path(dataset).resolve()), store.dataset_stamp(str(Path(dataset).resolve()))
    dask = store.ENGINE["dask"]
    store.ENGINE["dask"] = None
    try:
        local = store.load_timeline(path, stamp, run_id, ranks)
    finally:
        store.ENGINE["dask"] = dask
    return local, store.load_timeline(path, stamp, run_id, ranks)


@pytest.mark.parametrize("run_id, ranks", [("job4", None), ("job4", (1, 3)), ("scenario-sm_resources_regs_sync-events-on", None),
                                           ("scenario-dependency_sync-events-on", None)])  # fmt: skip
def test_dashboard_timeline_on_the_cluster_draws_what_the_local_one_does(engine, dataset, run_id, ranks):
    from overlapviz.figures import timeline as ftl
    from overlapviz.dashboards.dask_source import DaskTimeline

    local, remote = _timelines(dataset, run_id, ranks)
    assert isinstance(remote, DaskTimeline) and not len(remote.frame.columns)  # no kernel in the server
    assert len(remote.frame) == len(local.frame) > 0 and remote.lane_labels == local.lane_labels
    assert remote.x_extent == local.x_extent and remote.origin_ns == local.origin_ns
    lo, hi = local.x_extent
    n = len(local.frame)
    windows = [None, (lo, hi), (lo + (hi - lo) * 0.3, lo + (hi - lo) * 0.32), (lo + (hi - lo) * 0.61, lo + (hi - lo) * 0.7),
               (hi - (hi - lo) * 0.05, hi + 1.0), (lo - 5.0, lo - 1.0)]  # fmt: skip
    drawn = set()
    for window in windows:
        for budget in (n // 4, ftl.MAX_GLYPHS):  # rasterized, then glyphs
            want = ftl.timeline_view(local, window, max_glyphs=budget, steps=None)
            got = ftl.timeline_view(_timelines(dataset, run_id, ranks)[1], window, max_glyphs=budget, steps=None)
            mode = "raster" if local.n_visible(window) > budget else "glyphs"
            drawn.add(mode)
            for a, b in zip(_layers(want), _layers(got), strict=True):
                if isinstance(a, pd.DataFrame):
                    # an empty layer's columns may differ in dtype (nothing is drawn from them)
                    pdt.assert_frame_equal(b, a, check_index_type=False, check_dtype=len(a) > 0, obj=f"{window} {mode}")
                else:
                    assert a == b, (window, mode)
    assert drawn == {"raster", "glyphs"}
    if local.why is not None:  # the collectives' why and arrows came along
        assert len(local.arrow_frame(None)) or run_id == "job4"


def test_dashboard_raster_counts_equal_the_local_ones(engine, dataset):
    from overlapviz.figures import timeline as ftl

    local, remote = _timelines(dataset, "job4", None)
    lo, hi = local.x_extent
    for window, width in (((lo, hi), 1100), ((lo + 1.0, lo + 3.0), 333), ((hi, hi), 7)):
        mask = local.visible(window)
        x0, x1 = window[0], window[1] if window[1] > window[0] else window[0] + 1e-6
        want = ftl._coverage(local.start_ms[mask], local.end_ms[mask], local.lane[mask], local.kind_code[mask], 4,
                             local.n_lanes, width, x0, x1)  # fmt: skip
        got = remote.counts(window, width)
        assert got.dtype == np.int64 and (got == want).all() and (want.sum() > 0 or window[0] == hi)


def test_dashboard_tables_and_focus_on_the_cluster(engine, dataset, client, monkeypatch):
    from overlapviz.dashboards import store

    calls = []
    for name in ("analyze", "explain"):
        real = engine.analyses[name]
        monkeypatch.setitem(engine.analyses, name, lambda *a, _real=real, _name=name, **k: calls.append(_name) or _real(*a, **k))
    monkeypatch.setenv(store.TABLE_CACHE_ENV, "0")
    path = str(Path(dataset).resolve())
    stamp = f"{store.dataset_stamp(path)}-dask"  # a key of its own: computed here, not taken from the memo
    pdt.assert_frame_equal(store.load_analysis(path, stamp, "analyze", per="step"), metrics.analyze(dataset, per="step"))
    pdt.assert_frame_equal(store.load_analysis(path, stamp, "explain"), explain_lib.explain(dataset))
    assert calls == ["analyze", "explain"]
    local, remote = _timelines(dataset, "job4", None)
    row = int(np.flatnonzero(local.kind_code == 1)[7])  # a collective
    k = local.frame.iloc[row]
    assert remote.window_at(int(k["rank"]), int(k["start_ns"])) == local.window_of(row)
    assert remote.window_at(int(k["rank"]), int(k["start_ns"]) + 1) is None


class _KernelReads:
    """An observation probe: every read of a kernels file in this process (the server's; the cluster's workers are
    other processes), through ``schema.read_kernels``, a Parquet file opened or a dataset scanned. The readers
    still read: each probe calls the real one."""

    def __init__(self, monkeypatch):
        import pyarrow.dataset as pads

        self.calls: list = []
        real_read, real_file, real_dataset, real_table = schema.read_kernels, pq.ParquetFile, pads.dataset, pq.read_table
        probe = self

        class ParquetFile(real_file):
            def __init__(self, source, *args, **kwargs):
                probe.note("ParquetFile", source)
                super().__init__(source, *args, **kwargs)

        monkeypatch.setattr(schema, "read_kernels", lambda *a, **k: self.calls.append(("read_kernels", str(a[0]))) or real_read(*a, **k))
        monkeypatch.setattr(pq, "ParquetFile", ParquetFile)
        monkeypatch.setattr(pads, "dataset", lambda source, *a, **k: self.note("dataset", source) or real_dataset(source, *a, **k))
        monkeypatch.setattr(pq, "read_table", lambda source, *a, **k: self.note("read_table", source) or real_table(source, *a, **k))

    def note(self, how: str, source) -> None:
        paths = [str(p) for p in (source if isinstance(source, (list, tuple)) else [source])]
        if any(f"{os.sep}kernels{os.sep}" in p for p in paths):
            self.calls.append((how, paths[0]))


def _server_views(path: str, stamp: str, pair: tuple, record: dict) -> dict:
    """What the dashboard's pages ask the store for: the tables, a run's timeline drawn zoomed out and zoomed in with
    its glyphs' hover fields, a selection of ranks, and the SM budget of one collective."""
    from overlapviz.figures import timeline as ftl
    from overlapviz.dashboards import store

    out = {name: store.load_analysis(path, stamp, name) for name in ("explain", "kernel_residency", "config_table")}
    out["analyze"] = store.load_analysis(path, stamp, "analyze", per="rank")
    out["compare"] = store.load_analysis(path, stamp, "compare", *pair)
    out["run_residency"] = store.run_analysis(path, stamp, "kernel_residency", "job4")
    for run_id, ranks in (("job4", None), ("job4", (1, 3)), (record["run_id"], None)):
        data = store.load_timeline(path, stamp, run_id, ranks)
        lo, hi = data.x_extent
        out[run_id, ranks, "raster"] = _layers(ftl.timeline_view(data, None, max_glyphs=10, steps=None))
        window = (lo + (hi - lo) * 0.4, lo + (hi - lo) * 0.43)
        mask = data.visible(window)
        out[run_id, ranks, "hover"] = data.hover_frame(mask)
        out[run_id, ranks, "comm"] = data.comm_frame(mask)
    ds = store.DataStore(path, warm_up=False)
    ds.stamp = stamp
    out["budget"] = ds.budget(record)
    out["what_if"] = ds.what_if(record)
    return out


def test_server_reads_no_kernels_under_scheduler(engine, dataset, monkeypatch):
    """serve --scheduler: every table, the timeline (zoomed out and in, hover fields included) and the SM budget as
    the local path gives them, and the server process reads no kernels file for them (the probe sees the local path's
    reads, so it would see these)."""
    from collections import OrderedDict

    from overlapviz.analysis import speedup
    from overlapviz.dashboards import store

    monkeypatch.setenv(store.TABLE_CACHE_ENV, "0")
    path = str(Path(dataset).resolve())
    stamp = store.dataset_stamp(path)
    runs = schema.read_frame(dataset, "runs")
    pair = tuple(runs.loc[runs["run_id"].str.startswith("cb-"), "run_id"][:2])
    explained = explain_lib.explain(dataset, run_ids=["scenario-sm_resources_regs_sync-events-on"])
    record = explained.loc[explained["blocker"].notna()].iloc[0].to_dict()
    reads = _KernelReads(monkeypatch)
    store.ENGINE["dask"] = None
    try:
        local = _server_views(path, f"{stamp}-local-probe", pair, record)
    finally:
        store.ENGINE["dask"] = engine
    assert any(how == "read_kernels" for how, _ in reads.calls)  # the probe sees the local path's reads
    reads.calls.clear()
    monkeypatch.setattr(speedup, "_TABLES", OrderedDict())  # the configuration table computed anew, from the cluster
    calls = []
    for name in ("analyze", "explain", "kernel_residency"):
        real = getattr(engine, {"kernel_residency": "residency"}.get(name, name))
        monkeypatch.setitem(engine.analyses, name, lambda *a, _real=real, _name=name, **k: calls.append(_name) or _real(*a, **k))
    remote = _server_views(path, f"{stamp}-dask-probe", pair, record)
    assert reads.calls == []
    assert {"analyze", "explain", "kernel_residency"} <= set(calls)  # computed on the cluster, not found in a cache
    assert sorted(remote, key=str) == sorted(local, key=str)
    for key, want in local.items():
        got = remote[key]
        if key in ("budget", "what_if"):
            want, got = (want, {}) if not isinstance(want, tuple) else want, (got, {}) if not isinstance(got, tuple) else got
            pdt.assert_frame_equal(got[0].reset_index(drop=True), want[0].reset_index(drop=True), obj=str(key))
            assert got[1] == want[1], key
        elif isinstance(want, pd.DataFrame):
            pdt.assert_frame_equal(got, want, obj=str(key))
        else:
            for a, b in zip(want, got, strict=True):
                if isinstance(a, pd.DataFrame):
                    pdt.assert_frame_equal(b, a, check_index_type=False, check_dtype=len(a) > 0, obj=str(key))
                else:
                    assert a == b, key
    hover = local["job4", None, "hover"]
    assert len(hover) > 20 and hover["residency"].str.contains("blocks/SM").any()  # the join found the shapes
    assert (local["job4", None, "comm"]["cause"] != "—").any()


def test_serve_scheduler_error_in_one_line(dataset):
    from click.testing import CliRunner

    from overlapviz.cli import main

    res = CliRunner().invoke(main, ["serve", str(dataset), "--scheduler", "nonsense here", "--get", "/"])
    assert res.exit_code == 1 and res.output.strip().count("\n") == 0 and "neither a Dask scheduler" in res.output, res.output


def _logical_lines(text: str) -> list[str]:
    return [line.strip() for line in text.replace("\\\n", " ").splitlines() if line.strip() and not line.strip().startswith("#")]


def test_run_slurm_is_valid_bash_with_real_options(tmp_path):
    """collectors/run.slurm: bash -n (and shellcheck where installed); every overlapviz command line parses with the
    CLI's own parser, and every option given to `dask scheduler` / `dask worker` is one they list."""
    import shlex
    import shutil

    import click

    from overlapviz.cli import main

    script = ROOT / "collectors" / "run.slurm"
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True).returncode == 0
    if shutil.which("shellcheck"):
        out = subprocess.run(["shellcheck", "-S", "warning", str(script)], capture_output=True, text=True)
        assert out.returncode == 0, out.stdout
    lines = _logical_lines(script.read_text())
    out = tmp_path / "out"  # $OUT: its runs and its dataset exist (the CLI checks its arguments' paths)
    (out / "runs").mkdir(parents=True)
    write_trace(generate_trace(50, rank=0, world_size=1, seed=1), out / "runs" / "rank0.json.gz")
    ingest([out / "runs"], out / "dataset", progress=False)
    commands = []
    for line in lines:
        line = line.replace('"${NO_INGEST[@]}"', "--no-ingest").replace("$OUT", str(out))
        words = shlex.split(re.sub(r"\$\{?(\w+)[^}\s\"]*\}?", r"\1", line))
        if words and words[0] == "overlapviz":
            words = words[: words.index(">")] if ">" in words else words
            words = [w for w in words if w != "--no-ingest" or "collect" in words]
            commands.append([w for w in words[1:] if w != "$@"])  # the job's own arguments
    names = [c[0] for c in commands]
    assert names == ["collect", "ingest", "analyze", "explain"], names
    for args in commands:
        cmd = main.get_command(click.Context(main), args[0])
        if args[0] == "collect":  # its sweep file is read by the command: only the options are checked here
            args = [a if not a.endswith("SWEEP") else str(tmp_path) for a in args]
        try:
            cmd.make_context(args[0], args[1:])
        except (click.NoSuchOption, click.BadOptionUsage, click.UsageError) as exc:
            # a placeholder path may be refused (it exists nowhere); an option never
            assert isinstance(exc, click.BadParameter) and isinstance(exc.param, click.Argument), (args, exc)
    assert "OVERLAPVIZ_SCHEDULER" in script.read_text() and any(p.envvar == "OVERLAPVIZ_SCHEDULER" for p in
                                                               main.get_command(click.Context(main), "ingest").params)  # fmt: skip
    dask = Path(sys.executable).with_name("dask")
    for which in ("scheduler", "worker"):
        used = {o for line in lines if f"dask {which} " in line for o in re.findall(r"(?<=\s)--[\w-]+", line.split(f"dask {which} ", 1)[1])}
        listed = subprocess.run([str(dask), which, "--help"], capture_output=True, text=True).stdout
        assert used and all(re.search(rf"{o}\b", listed) for o in used), (which, used)
