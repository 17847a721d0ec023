"""The answer cache (overlapviz.dataset.computed, cli/_dataset.kept_answer): a second ``explain``/``analyze`` prints
what the first printed, read from the cache; anything the answer depends on changed gives the answer computed anew."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from overlapviz.cli import main
from overlapviz.dataset import computed

DLRM = Path(__file__).parent / "data" / "kineto_real" / "param_dlrm_8rank"
# the two answers of issue 36 in every format; the other views in one each
CASES = [(view, fmt) for view in (["explain", "--instances"], ["explain"]) for fmt in ("table", "json", "csv")] + [
    (["explain", "--findings"], "table"), (["explain", "--breakdown"], "csv"), (["analyze"], "json")]  # fmt: skip


@pytest.fixture()
def traces(tmp_path) -> Path:
    """A copy of the DLRM traces (8 ranks) that a test may change."""
    return Path(shutil.copytree(DLRM, tmp_path / "dlrm"))


def run(cache: Path, *args, cached: bool = True) -> str:
    """``overlapviz ARGS`` in this process with the cache ``cache`` (``cached`` False: no answer read or kept)."""
    env = {"OVERLAPVIZ_CACHE_DIR": str(cache), computed.TABLE_CACHE_ENV: "1" if cached else "0"}
    result = CliRunner().invoke(main, [str(a) for a in args], env=env)
    assert result.exit_code == 0, result.output
    return result.stdout


def answers(cache: Path) -> list[Path]:
    return sorted(cache.glob("tables/*/*.answer"))


def fresh(tmp_path: Path, *args) -> str:
    """The answer computed with no answer cache, in a cache of its own."""
    where = tmp_path / f"fresh-{len(list(tmp_path.glob('fresh-*')))}"
    return run(where, *args, cached=False)


@pytest.mark.parametrize(("view", "fmt"), CASES, ids=[f"{' '.join(v)} {f}" for v, f in CASES])
def test_second_command_prints_the_first_s_answer_from_the_cache(tmp_path, traces, view, fmt):
    """Cold (traces ingested now), then warm: the same text, byte for byte, as a run without the answer cache; the warm
    one is the kept text (an answer file written by the cold one, whose text the warm one prints)."""
    args = [*view, traces, "--format", fmt]
    expected = fresh(tmp_path, *args)
    cache = tmp_path / "cache"
    assert run(cache, *args) == expected
    kept = answers(cache)
    assert len(kept) == 1, "the cold command keeps its answer"
    assert run(cache, *args) == expected
    # the warm command prints the file's text: a text kept under this key (a whole entry) is what it prints
    file = kept[0]
    head, _, _ = file.read_bytes().partition(b"\n\n")
    key = head.split(b"\n")[1].decode()
    assert computed.write_answer(file, key, "from the cache\n")
    assert run(cache, *args) == "from the cache\n"


def test_warm_answer_imports_neither_pandas_nor_pyarrow(tmp_path, traces):
    """The warm command reads no dataset: its process imports neither pyarrow nor pandas (~0.3 s and ~0.5 s of CPU
    on a shared 2-core machine), and prints the cold command's text."""
    env = {**os.environ, "OVERLAPVIZ_CACHE_DIR": str(tmp_path / "cache")}
    env.pop(computed.TABLE_CACHE_ENV, None)
    probe = ("import sys, runpy; sys.argv = ['overlapviz', *sys.argv[1:]]\n"
             "try:\n    runpy.run_module('overlapviz', run_name='__main__')\n"
             "finally:\n    print(sorted(m for m in ('pandas', 'pyarrow', 'numpy') if m in sys.modules), file=sys.stderr)\n")  # fmt: skip
    cmd = [sys.executable, "-c", probe, "explain", "--instances", str(traces), "--format", "json"]
    cold = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True)
    assert "'pyarrow'" in cold.stderr.splitlines()[-1]
    warm = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True)
    assert warm.stderr.splitlines()[-1] == "[]", warm.stderr
    assert "raw traces, read into" in warm.stderr  # the line on stderr, as when cold
    assert warm.stdout == cold.stdout and json.loads(warm.stdout)


def _drop_last_nccl_kernel(trace: Path) -> None:
    data = json.loads(gzip.decompress(trace.read_bytes()))
    events = data["traceEvents"]
    last = max(i for i, e in enumerate(events) if e.get("cat") == "kernel" and "nccl" in e.get("name", "").lower())
    del events[last]
    trace.write_bytes(gzip.compress(json.dumps(data).encode()))


def test_a_changed_trace_file_gives_the_answer_computed_anew(tmp_path, traces):
    args = ["explain", "--instances", traces, "--format", "json"]
    cache = tmp_path / "cache"
    before = run(cache, *args)
    _drop_last_nccl_kernel(sorted(traces.glob("worker7_*"))[0])
    expected = fresh(tmp_path, *args)
    assert expected != before
    assert run(cache, *args) == expected
    assert run(cache, *args) == expected
    assert len(answers(cache)) == 2, "the answer of each trace set"


def test_a_dataset_written_again_gives_the_answer_computed_anew(tmp_path, traces):
    """A dataset directory's answer is kept too, and a dataset written again in its place (``ingest -o DS
    --overwrite``) is another: the same path, another answer."""
    ds = tmp_path / "ds"
    cache = tmp_path / "cache"
    run(cache, "ingest", traces, "-o", ds, "-q")
    before = run(cache, "explain", "--instances", ds, "--format", "csv")
    assert run(cache, "explain", "--instances", ds, "--format", "csv") == before and len(answers(cache)) == 1
    _drop_last_nccl_kernel(sorted(traces.glob("worker7_*"))[0])
    run(cache, "ingest", traces, "-o", ds, "-q", "--overwrite")
    expected = fresh(tmp_path, "explain", "--instances", ds, "--format", "csv")
    assert expected != before
    assert run(cache, "explain", "--instances", ds, "--format", "csv") == expected
    assert len(answers(cache)) == 2


@pytest.mark.parametrize("change", [["--format", "csv"], ["--wide"], ["--device-name", "H100"], ["--run", "param_dlrm_8rank"],
                                    ["--summary"], ["--all-kernels"]], ids=" ".join)  # fmt: skip
def test_a_changed_option_gives_the_answer_computed_anew(tmp_path, traces, change):
    cache = tmp_path / "cache"
    base = ["explain", traces, "--format", "json"]
    run(cache, *base)
    args = [*base, *change]
    expected = fresh(tmp_path, *args)
    assert run(cache, *args) == expected
    assert run(cache, *args) == expected
    assert len(answers(cache)) == 2, "an answer per option set"


def test_device_name_changes_the_answer(tmp_path):
    """On traces that name no GPU, ``--device-name`` changes the answer (H100's fit, not unknown): kept apart."""
    traces = Path(__file__).parent / "data" / "hta_trace_filter_2rank"
    cache = tmp_path / "cache"
    plain = run(cache, "explain", traces, "--format", "csv")
    named = run(cache, "explain", traces, "--format", "csv", "--device-name", "H100")
    assert plain != named
    assert named == fresh(tmp_path, "explain", traces, "--format", "csv", "--device-name", "H100")
    assert run(cache, "explain", traces, "--format", "csv") == plain and len(answers(cache)) == 2


@pytest.mark.parametrize("damage", ["flipped", "cut", "empty", "foreign", "other dataset", "shared"])
def test_a_damaged_or_foreign_answer_is_computed_again(tmp_path, traces, damage):
    """An answer file that is not whole (a byte changed, cut short, empty), holds another key's answer (other
    options, or the same options on another dataset), or that others could have written is never printed: the
    answer is computed, printed and kept anew."""
    cache = tmp_path / "cache"
    args = ["explain", traces, "--format", "json"]
    expected = run(cache, *args)
    other = run(cache, *args, "--instances")
    [file] = [f for f in answers(cache) if f.read_bytes().endswith(b"\n\n" + expected.encode())]
    [other_file] = [f for f in answers(cache) if f != file]
    assert other_file.read_bytes().endswith(other.encode())
    data = file.read_bytes()
    if damage == "flipped":
        file.write_bytes(data[:-10] + bytes([data[-10] ^ 1]) + data[-9:])
    elif damage == "cut":
        file.write_bytes(data[: len(data) // 2])
    elif damage == "empty":
        file.write_bytes(b"")
    elif damage == "foreign":
        shutil.copyfile(other_file, file)
    elif damage == "other dataset":
        run(cache, "explain", DLRM.parent.parent / "hta_trace_filter_2rank", "--format", "json")
        [elsewhere] = [f for f in answers(cache) if f not in (file, other_file)]
        shutil.copyfile(elsewhere, file)
    else:
        file.chmod(0o666)
    assert run(cache, *args) == expected
    assert file.read_bytes() == data and oct(file.stat().st_mode & 0o777) == oct(0o600), "kept anew, whole and private"


def test_a_long_answer_is_printed_not_kept(tmp_path, traces, monkeypatch):
    """An answer longer than ``ANSWER_MAX_CHARS`` (every kernel of a big dataset, say) is printed and not kept."""
    cache = tmp_path / "cache"
    short = run(cache, "explain", "--instances", traces, "--format", "csv")
    monkeypatch.setattr(computed, "ANSWER_MAX_CHARS", len(short) + 1)
    long = run(cache, "explain", traces, "--format", "csv")
    assert len(long) > len(short) + 1 and len(answers(cache)) == 1
    assert run(cache, "explain", traces, "--format", "csv") == long and len(answers(cache)) == 1


def test_nothing_is_kept_when_the_table_cache_is_off(tmp_path, traces):
    cache = tmp_path / "cache"
    run(cache, "analyze", traces, cached=False)
    run(cache, "analyze", traces, cached=False)
    assert not (cache / "tables").exists()


@pytest.mark.parametrize("interrupt", [KeyboardInterrupt, SystemExit, OSError])
def test_an_interrupted_or_failed_cache_write_leaves_no_temporary_file(tmp_path, interrupt):
    """``computed.write_private`` (answers and the dashboard's tables): a write stopped half way (Ctrl-C; the SIGTERM
    handler's exception; a full disk) leaves neither the file nor its temporary beside it; an interruption goes on
    up, a failed write is False."""
    from overlapviz.dataset import computed

    file = tmp_path / "tables" / "x" / "a.answer"

    def write(fh):
        fh.write(b"half")
        raise interrupt(28, "No space left on device") if interrupt is OSError else interrupt()

    if interrupt is OSError:
        assert computed.write_private(file, write) is False
    else:
        with pytest.raises(interrupt):
            computed.write_private(file, write)
    assert list(file.parent.iterdir()) == []
    assert computed.write_private(file, lambda fh: fh.write(b"whole")) and file.read_bytes() == b"whole"
    assert [p.name for p in file.parent.iterdir()] == ["a.answer"]


INSTANCE_DATA = [DLRM, DLRM.parent.parent / "torch_rocm", DLRM.parent.parent / "hta_trace_filter_2rank", DLRM.parent.parent / "gloo_cpu",
                 DLRM.parent.parent / "nsys" / "mfu_2gpu_before_window40ms.sqlite", DLRM.parent / "tracelens_b200_eager"]  # fmt: skip


@pytest.fixture(scope="module")
def instance_datasets(tmp_path_factory) -> list[Path]:
    from overlapviz.ingest import ingest
    from overlapviz.testing import generate_trace, write_trace

    root = tmp_path_factory.mktemp("instances")
    for r in range(3):  # several ranks, collectives by position and by sequence number
        write_trace(generate_trace(2000, rank=r, world_size=3, seed=r), root / "synth" / f"rank{r}.json")
    return [ingest([src], root / f"ds{i}", progress=False) for i, src in enumerate([*INSTANCE_DATA, root / "synth"])]


@pytest.mark.parametrize(("fmt", "wide"), [("table", False), ("table", True), ("json", False), ("csv", False)])
def test_instances_without_pandas_are_the_frame_s(tmp_path, instance_datasets, fmt, wide):
    """``explain --instances`` (``explain.instance_columns``: no pandas, no SM room) prints what
    ``peers.collective_instances`` of ``explain``'s records prints, on real traces of every kind (ROCm's ranks with
    no ready time included) and a synthetic three-rank run."""
    from overlapviz.analysis import explain as explain_lib
    from overlapviz.analysis import peers
    from overlapviz.cli import explain as cli_explain
    from overlapviz.cli._table import render_output

    columns = cli_explain.TABLE_COLUMNS["instances"]
    for ds in instance_datasets:
        frame = peers.collective_instances(explain_lib.explain(ds, columns=explain_lib.INSTANCE_READS))
        expected = render_output(frame, fmt, columns=columns, wide=wide)
        got = render_output(cli_explain._instance_records(explain_lib.instance_columns(ds)), fmt, columns=columns, wide=wide)
        assert got == expected, ds
        printed = run(tmp_path / "cache", "explain", "--instances", ds, "--format", fmt, *(["--wide"] if wide else []), cached=False)
        assert printed == expected + ("" if fmt == "csv" else "\n"), ds
    assert sum(len(peers.collective_instances(explain_lib.explain(ds))) for ds in instance_datasets) > 100, "instances to compare"
