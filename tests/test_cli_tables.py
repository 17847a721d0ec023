"""``--format table``: compact tables fit 120 columns on the bundled samples and tests/data traces, ids are never cut,
one number format across commands, ``--wide`` shows every column, JSON/CSV untouched."""

from __future__ import annotations

import re
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner

from overlapviz.dataset import schema
from overlapviz.cli import main
from overlapviz.cli._table import cell, header, short_name, unit
from overlapviz.ingest import ingest

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"
MAX_WIDTH = 120
# every trace set we ship: the bundled samples (one dataset of the three sweeps) and tests/data
SOURCES = {
    "samples": [ROOT / "sample_traces" / d for d in ("h200_paper_grid", "h200_standin_sweep", "scenarios")],
    "kineto_real": [DATA / "kineto_real"],
    "hta": [DATA / "hta_trace_filter_2rank", DATA / "hta_nccl_parser_config"],
    "h200": [DATA / "h200_carveout_check", DATA / "h200_transformer_stack", DATA / "occupancy_h200"],
    "rocprof": [DATA / "rocprof" / "v1", DATA / "rocprof" / "v3"],
    "torch_rocm": [DATA / "torch_rocm"],
    "hostile_gloo_nsys": [DATA / "hostile", DATA / "gloo_cpu", DATA / "nsys"],
}
VIEWS = [
    ["analyze"], ["analyze", "--per", "step"], ["explain"], ["explain", "--summary"], ["explain", "--instances"],
    ["explain", "--all-kernels"], ["explain", "--findings"], ["explain", "--breakdown"], ["explain", "--breakdown", "--per", "step"],
    ["residency"], ["residency", "--delays"], ["compare"],
]  # fmt: skip


# the trace sets a bare `pytest` checks (small); the others are marked corpus (`pytest -m corpus`, CI)
QUICK = {"h200"}


class _Datasets(dict):
    """Each trace set's dataset, ingested when a test first asks for it (a test of one set ingests that set alone)."""

    def __init__(self, root: Path):
        super().__init__()
        self.root = root

    def __missing__(self, name: str) -> Path:
        # an unexpected exception while a file is read keeps its traceback (a one-off "KeyError: 30" in CI had none)
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("OVERLAPVIZ_DEBUG", "1")
            self[name] = ingest([str(s) for s in SOURCES[name]], self.root / name, progress=False)
        return self[name]


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    return _Datasets(tmp_path_factory.mktemp("tables"))


def _run(*args) -> str:
    res = CliRunner().invoke(main, [str(a) for a in args])
    if res.exit_code != 0 and res.exc_info is not None and not isinstance(res.exception, SystemExit):
        import traceback  # a crash inside a command: show where, not only its (empty) output

        raise AssertionError(f"{args}: {''.join(traceback.format_exception(*res.exc_info))}")
    assert res.exit_code == 0, (args, res.output)
    return res.output


@pytest.mark.parametrize("name", [pytest.param(n, marks=() if n in QUICK else pytest.mark.corpus) for n in sorted(SOURCES)])
def test_every_default_table_fits_and_names_whole_runs(datasets, name):
    ds = datasets[name]
    runs = set(schema.read_frame(ds, "runs")["run_id"])
    printed = set()
    for view in VIEWS:
        out = _run(*view, ds)
        lines = out.rstrip("\n").split("\n")
        wide = [line for line in lines if len(line) > MAX_WIDTH]
        assert not wide, (view, name, wide[0])
        assert "e+" not in out and "e-0" not in out, (view, name)  # never an exponent
        for line in lines:
            if line.startswith("run "):
                printed.add(line[4:])
    assert printed and printed <= runs, printed - runs
    for rid in sorted(printed)[:5]:  # a pasted id works
        assert orjson.loads(_run("analyze", ds, "--run", rid, "--format", "json"))[0]["run_id"] == rid


@pytest.mark.corpus  # the bundled samples
def test_advise_and_compare_pair_fit(datasets):
    ds = datasets["samples"]
    a, b = [r for r in schema.read_frame(ds, "runs")["run_id"] if r.startswith("cb-a2a_baseline_tiled64x64x32")][:2]
    for args in (["compare", ds, "--run", a, "--run", b], ["advise", ds, "--run", a, "--compute", "gemm", "--comm", "comm"]):
        out = _run(*args)
        assert max(map(len, out.splitlines())) <= MAX_WIDTH, out
    pair = _run("compare", ds, "--run", a, "--run", b)
    assert pair.splitlines()[:2] == [f"A  {a}", f"B  {b}"]
    assert re.search(r"^time\s+median_us\s+\d+\.\d\s", pair, re.M)  # ms shown as µs, one decimal
    assert re.search(r"^metric\s+overlap_fraction\s+\d+\.\d%", pair, re.M)


def _table_part(out: str) -> list[str]:
    """The table of ``explain``'s table output: the lines from its header on (the findings and the
    note on the columns come first, the table's header starts with its first column)."""
    lines = out.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith(("kernel ", "run_id ")))
    return lines[first:]


@pytest.mark.corpus  # the bundled samples
def test_wide_shows_every_column_and_the_run_id_in_a_column(datasets):
    ds = datasets["samples"]
    records = orjson.loads(_run("explain", ds, "--format", "json"))
    wide = _table_part(_run("explain", ds, "--wide"))
    assert wide[0].split() == [header(c) for c in records[0]]
    assert not any(line.startswith("run ") for line in wide)
    assert any(line.startswith(records[0]["run_id"] + " ") for line in wide[1:])
    compact = _table_part(_run("explain", ds))
    assert compact[0].split() == ["kernel", "name", "launch_to_start_us", "cause", "peer_wait_us"]
    kernel = f"{records[0]['rank']}:{records[0]['start_ns']}"
    assert any(line.startswith(kernel + " ") for line in compact)  # the exact --kernel id


@pytest.mark.corpus  # the bundled samples
def test_json_and_csv_are_unchanged_by_wide(datasets):
    ds = datasets["samples"]
    for cmd in (["analyze"], ["explain", "--summary"], ["residency"], ["compare"]):
        for fmt in ("json", "csv"):
            assert _run(*cmd, ds, "--format", fmt) == _run(*cmd, ds, "--format", fmt, "--wide")
    records = orjson.loads(_run("residency", ds, "--format", "json"))
    assert isinstance(records[0]["occupancy"], float) and records[0]["occupancy"] <= 1  # a fraction in JSON, % in tables


def test_one_number_format():
    assert [cell(unit("comm_us"), v) for v in (1234567.25, 0.04, None)] == ["1234567.2", "0.0", "-"]
    assert cell(unit("median_ms"), 1.3236) == "1323.6" and header("median_ms") == "median_us"
    assert cell(unit("ci_low_ms"), 0.5) == "500.0" and header("ci_low_ms") == "ci_low_us"
    assert cell(unit("occupancy"), 0.625) == cell(unit("overlap_fraction"), 0.625) == cell(unit("compute_occupancy"), 0.625) == "62.5%"
    assert cell(unit("time_ratio_ci_low"), 1.0) == "1.000" and cell(unit("speedup"), 2) == "2.000"
    assert cell(unit("shared_mem_bytes"), 114688.0) == "114688" and cell(unit("start_ns"), 1740461679471440000) == "1740461679471440000"
    assert cell(unit("bytes"), 1.147e5) == "114700" and cell(unit("something"), 1.147e-5) == "0.000"
    assert cell(unit("meets_target"), True) == "yes"


def test_short_names():
    fill = ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, at::detail::Array<char*, 1> >"
            "(int, at::native::FillFunctor<float>, at::detail::Array<char*, 1>)")
    assert short_name(fill, None) == "at::native::vectorized_elementwise_kernel"
    assert short_name(fill) == "at::native::vectorized_elementwise_kern…"  # 40 characters
    assert short_name("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)") == "ncclDevKernel_AllReduce_Sum_f32_RING_LL"
    long = "Cijk_Ailk_Bljk_HHS_BH_MT128x128x32_MI32x32x8x1_SN_1LDSB0_APM1_ABV0_ACED0_AF0EM1"
    assert short_name(long) == long[:39] + "…" and short_name(long, None) == long
    assert short_name("pos:3:void f<int>(int)#12") == "pos:3:f#12"


def test_compact_names_keep_what_tells_two_kernels_apart():
    """QA (Nsight Systems cloverleaf): about 25 residency rows read "clover::par_ranged2d_kernel"; names that would read
    the same keep their template arguments, and those still alike once cut are numbered ("(2)")."""
    from overlapviz.cli._table import render

    names = ["void clover::par_ranged2d_kernel<PdV_kernel(bool)::{lambda(int, int)#1}>(int, int)",
             "void clover::par_ranged2d_kernel<PdV_kernel(bool)::{lambda(int, int)#2}>(int, int)",
             "void clover::par_ranged2d_kernel<accelerate_kernel()::{lambda(int, int)#1}>(int, int)",
             "void clover::par_ranged2d_kernel<PdV_kernel(bool)::{lambda(int, int)#1}>(int, int)",
             "void gemm_kernel<float>(float*)", "void other(int)"]  # fmt: skip
    out = render(["name", "n"], {"name": names, "n": list(range(len(names)))}, wide=False)
    rows = [line.rsplit(None, 1)[0].strip() for line in out.splitlines()[1:]]
    assert len(set(rows[:3])) == 3 and rows[3] == rows[0]  # three kernels apart; the same kernel twice reads the same
    assert rows[0].startswith("clover::par_ranged2d_kernel<") and rows[4] == "gemm_kernel" and rows[5] == "other"
