"""The documentation covers what users rely on: every subcommand, dataset column and JSON key."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from overlapviz.dataset import schema
from overlapviz.cli import COMMANDS, main

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
DOCS = ROOT / "docs"


@pytest.mark.parametrize("command", COMMANDS)
def test_every_subcommand_is_in_the_readme_and_has_help(command):
    assert re.search(rf"overlapviz {command}\b", README), f"README.md does not show `overlapviz {command}`"
    result = CliRunner().invoke(main, [command, "--help"])
    assert result.exit_code == 0, result.output
    assert "Usage:" in result.output


def _table_section(text: str, table: str) -> str:
    start = text.index(f"### `{table}`")
    end = text.find("\n### ", start + 1)
    return text[start : end if end > 0 else None]


@pytest.mark.parametrize("table", ["kernels", *schema.TABLES])
def test_every_dataset_column_is_documented(table):
    section = _table_section((DOCS / "dataset.md").read_text(), table)
    fields = schema.KERNELS if table == "kernels" else schema.TABLES[table]
    for field in fields:
        row = re.search(rf"^\| `{field.name}` \| [^|]+ \| *([^|]*?) *\|$", section, re.MULTILINE)
        assert row, f"docs/dataset.md: column {table}.{field.name} is not documented"
        assert row.group(1).strip(), f"docs/dataset.md: column {table}.{field.name} has no meaning"


def test_every_analyze_json_key_is_documented(tmp_path):
    from overlapviz.ingest import ingest
    from overlapviz.testing import kernel_event, kineto_trace, runtime_event, step_event, write_trace

    write_trace(
        kineto_trace(
            step_event(1, 0, 10_000),
            runtime_event(1, 100),
            runtime_event(2, 200),
            kernel_event("gemm", 1_000, 5_000, correlation=1),
            kernel_event("ncclDevKernel_AllReduce", 2_000, 3_000, correlation=2, stream=9),
            rank=0,
        ),
        tmp_path / "run" / "rank0.json.gz",
    )
    ds = ingest([tmp_path / "run"], tmp_path / "ds", progress=False)
    analysis = (DOCS / "analysis.md").read_text()
    for per in ("rank", "step"):
        result = CliRunner().invoke(main, ["analyze", str(ds), "--per", per, "--format", "json"])
        assert result.exit_code == 0, result.output
        records = json.loads(result.output)
        assert len(records) == 1, records
        keys = set(records[0])
        assert ("step" in keys) == (per == "step")
        for key in keys:
            assert f"`{key}`" in analysis, f"docs/analysis.md does not document the analyze key {key!r}"


def test_every_compare_and_residency_column_is_documented(tmp_path):
    import pandas as pd

    from overlapviz.analysis.advise import Footprint, advise
    from overlapviz.domain.devices import nvidia_arch
    from overlapviz.analysis.residency import kernel_residency
    from overlapviz.analysis.speedup import compare, config_table
    from overlapviz.testing import kernel_row, write_rows_dataset

    doc = (DOCS / "residency.md").read_text()
    ds = write_rows_dataset(tmp_path / "ds", [kernel_row("gemm", "compute", 7, 0, 100, launch=0)])
    with schema.DatasetWriter(tmp_path / "it") as w:
        w.add("runs", pd.DataFrame([{"run_id": "a", "setup": "sequential"}, {"run_id": "b", "setup": "baseline"}]))
        w.add("iterations", pd.DataFrame([{"run_id": r, "rank": 0, "iteration": 0, "time_ms": 1.0, "measured": True} for r in "ab"]))
        w.commit()
    frames = [kernel_residency(ds), config_table(tmp_path / "it"), compare(tmp_path / "it", "a", "b"),
              advise(nvidia_arch(9, 0) | {"num_sms": 132}, Footprint(256, 64, 0, grid=999), Footprint(512, 32, 0, grid=8))]
    words = set(re.findall(r"[a-z_]+", doc))
    missing = sorted({c for f in frames for c in f.columns if c not in words})
    assert not missing, missing


def test_notebook_runs_cell_by_cell(tmp_path, monkeypatch):
    """docs/notebook.ipynb: every code cell in order in one namespace, as a kernel would run them;
    each cell's last expression is what Jupyter would display. No nbclient/ipykernel: the cells
    are plain Python, and running them here checks the same thing without a kernel process."""
    import ast
    import json

    import holoviews as hv
    import pandas as pd

    monkeypatch.setenv("OVERLAPVIZ_CACHE_DIR", str(tmp_path / "cache"))
    nb = json.loads((DOCS / "notebook.ipynb").read_text())
    assert nb["nbformat"] == 4
    namespace: dict = {"__name__": "__main__"}
    shown = []
    for cell in nb["cells"]:
        if cell["cell_type"] != "code":
            continue
        assert not cell.get("outputs"), "the notebook is kept without outputs"
        tree = ast.parse("".join(cell["source"]))
        last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
        exec(compile(tree, "notebook", "exec"), namespace)  # noqa: S102
        shown.append(eval(compile(ast.Expression(last.value), "notebook", "eval"), namespace) if last else None)  # noqa: S307
    ds, overlap, why, shapes, pair, fig = shown
    assert repr(ds).startswith("<overlapviz.Dataset") and len(namespace["ds"].runs) > 1
    assert isinstance(overlap, pd.DataFrame) and len(overlap) and overlap["overlap_fraction"].between(0, 1).all()
    assert len(why) and (why["sm_resources_us"] >= 0).all()
    assert len(shapes) and shapes["occupancy"].dropna().between(0, 1).all()
    assert "median_ms" in set(pair["item"])
    assert isinstance(fig, hv.core.Dimensioned) and hv.render(fig, backend="bokeh") is not None


def _script(path: Path):
    """A generator script of the repository (not part of the package), loaded as a module."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"_docs_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_cli_reference_is_every_command_s_help():
    gen = _script(DOCS / "gen_cli.py")
    current = (DOCS / "cli.md").read_text()
    section = current[current.index(gen.BEGIN) : current.index(gen.END)]
    for command in COMMANDS:
        assert f"### `overlapviz {command}`" in section and f"Usage: overlapviz {command} " in section, command
    # in a fresh interpreter: click keeps each command's help option once made, so a command another test of this
    # process ran without the group's context would print "--help" where the CLI prints "-h, --help"
    check = subprocess.run([sys.executable, str(DOCS / "gen_cli.py"), "--check"], capture_output=True, text=True, timeout=300)
    assert check.returncode == 0, (
        "docs/cli.md: the reference section differs from the commands' --help; "
        f"regenerate it with `.venv/bin/python docs/gen_cli.py` ({check.stderr.strip()})"
    )


def test_readme_benchmark_table_is_generated_from_the_results():
    gen = _script(ROOT / "benchmarks" / "readme_table.py")
    results = sorted((ROOT / "benchmarks" / "results").glob("*.json"))
    assert results, "benchmarks/results/ holds no result file"
    block = gen.block()
    for path in results:
        doc = json.loads(path.read_text())
        assert doc["format"] == gen.FORMAT and doc["rows"], path
        assert f"`{doc['command']}`" in block, path  # the command that produced it is shown with it
    assert gen.rendered(README) == README, (
        "README.md: the benchmark table differs from benchmarks/results/*.json; "
        "regenerate it with `.venv/bin/python benchmarks/readme_table.py`"
    )


def test_a_bad_result_file_is_refused(tmp_path):
    gen = _script(ROOT / "benchmarks" / "readme_table.py")
    good = gen.row("ingest", 1.5, baseline=3.0, baseline_label="HTA 0.5.0", target="< 2 s")
    doc = {"format": gen.FORMAT, "benchmark": "b", "title": "T", "command": "c", "date": "d", "commit": "x",
           "machine": "m", "load": [1.0, 2.0], "note": "", "rows": [good]}  # fmt: skip
    (tmp_path / "b.json").write_text(json.dumps(doc))
    assert "| ingest | 1.50 s | 3.00 s (HTA 0.5.0) | 2.00x | < 2 s |" in gen.block(tmp_path)
    (tmp_path / "b.json").write_text(json.dumps(doc | {"rows": [{"task": "ingest", "value": 1.5}]}))
    with pytest.raises(SystemExit, match="b.json: row 'ingest' has keys"):
        gen.block(tmp_path)


def test_docs_are_a_reference_not_a_diary():
    """Dated measurements and pass-by-pass logs belong in benchmarks/HISTORY.md, not in docs/."""
    ordinal = "first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth"
    diary = re.compile(rf"^(#+ .*\b20\d\d-\d\d-\d\d\b.*|(#+ )?({ordinal}) pass\b.*)$", re.IGNORECASE | re.MULTILINE)
    for page in [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]:
        hit = diary.search(page.read_text())
        assert not hit, f"{page.relative_to(ROOT)}: {hit.group(0)!r}: move it to benchmarks/HISTORY.md"


def test_every_package_folder_is_in_the_layout_page():
    layout = (DOCS / "layout.md").read_text()
    for sub in sorted((ROOT / "overlapviz").iterdir()):
        if (sub / "__init__.py").exists():
            assert f"`overlapviz/{sub.name}/`" in layout, f"docs/layout.md does not describe overlapviz/{sub.name}/"


def test_every_explain_json_key_is_documented(tmp_path):
    from overlapviz.ingest import ingest
    from overlapviz.testing import kernel_event, kineto_trace, runtime_event, step_event, write_trace

    for rank in (0, 1):  # two ranks, so the collective is an instance across ranks
        write_trace(
            kineto_trace(
                step_event(1, 0, 10_000),
                runtime_event(1, 100),
                runtime_event(2, 200 + 500 * rank),
                kernel_event("gemm", 1_000, 5_000, correlation=1),
                kernel_event("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 2_000 + 500 * rank, 3_000, correlation=2, stream=9),
                rank=rank, world_size=2,
            ),
            tmp_path / "run" / f"rank{rank}.json.gz",
        )  # fmt: skip
    ds = ingest([tmp_path / "run"], tmp_path / "ds", progress=False)
    doc = (DOCS / "explain.md").read_text()
    for args in ([], ["--findings"], ["--breakdown"], ["--breakdown", "--per", "step"], ["--summary"], ["--instances"]):
        result = CliRunner().invoke(main, ["explain", str(ds), *args, "--format", "json"])
        assert result.exit_code == 0, result.output
        records = json.loads(result.output)
        assert records, args
        missing = sorted({k for r in records for k in r if f"`{k}`" not in doc})
        assert not missing, f"docs/explain.md does not document the explain {' '.join(args)} keys {missing}"
