"""The Kineto ingest path, the Arrow analysis and ``overlapviz analyze`` never import pandas.

pandas (with pyarrow's pandas glue) costs ~50 MB and ~0.4 s before any work; the light
path must not pay it. Each check runs in a fresh interpreter, since this one has pandas
loaded by other tests. pyarrow itself imports pandas on its first ``pa.array`` unless
``overlapviz.dataset.schema`` holds it off: these tests fail if that stops working too.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

DATA = Path(__file__).parent / "data"
KINETO_GZ = DATA / "hta_nccl_parser_config" / "nccl_data.json.gz"
GLOO = DATA / "gloo_cpu"
ROCPROF = DATA / "rocprof"


def run_python(code: str, *args) -> str:
    """Run ``code`` in a fresh interpreter; it prints what it found, and the last line is
    whether pandas got imported."""
    body = textwrap.dedent(code) + "\nimport sys\nprint('pandas' in sys.modules)\n"
    result = subprocess.run([sys.executable, "-c", body, *map(str, args)], capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_ingest_and_analyze_table_import_no_pandas(tmp_path):
    out = run_python(
        """
        import sys
        from overlapviz.ingest import ingest
        from overlapviz.analysis.metrics import analyze_table
        kineto, gloo, root = sys.argv[1:4]
        ingest([kineto], root + "/kineto", progress=False)
        ingest([gloo], root + "/gloo", progress=False)
        for name in ("kineto", "gloo"):
            for per in ("rank", "step"):
                t = analyze_table(root + "/" + name, per=per)
                print(name, per, t.num_rows, sum(t.column("n_kernels").to_pylist()))
        """,
        KINETO_GZ, GLOO, tmp_path,
    )  # fmt: skip
    lines = out.splitlines()
    assert lines[-1] == "False", out
    # the analyses really ran over kernels (not an empty dataset that needs nothing)
    counts = {tuple(line.split()[:2]): (int(line.split()[2]), int(line.split()[3])) for line in lines[:-1]}
    assert counts[("kineto", "rank")][1] > 0 and counts[("gloo", "rank")] [0] == 2, out
    assert counts[("gloo", "step")][0] > 2, out


def test_cli_ingest_and_analyze_json_import_no_pandas(tmp_path):
    out = run_python(
        """
        import sys, json
        from overlapviz.cli import main
        gloo, root = sys.argv[1:3]
        for args in (["ingest", gloo, "-o", root + "/ds", "-q"], ["analyze", root + "/ds", "--format", "json"],
                     ["analyze", root + "/ds", "--format", "csv", "--per", "step"]):
            try:
                main(args, standalone_mode=False)
            except SystemExit as exc:
                assert not exc.code, exc
        """,
        GLOO, tmp_path,
    )  # fmt: skip
    assert out.splitlines()[-1] == "False", out
    assert '"run_id":"gloo_cpu"' in out and "n_comm_kernels" in out


def test_sniffing_rocprof_files_imports_no_pandas():
    """Detection reads every file's head with every reader, rocprof's included: cheap and
    pandas-free; only reading a rocprof file imports its parsers."""
    out = run_python(
        """
        import sys
        from pathlib import Path
        from overlapviz.ingest import detect
        for p in sorted(Path(sys.argv[1]).rglob("*")):
            if p.is_file() and p.suffix != ".md":
                r = detect(p)
                print(p.name, r.name if r else None)
        """,
        ROCPROF,
    )
    lines = out.splitlines()
    assert lines[-1] == "False", out
    found = dict(line.split() for line in lines[:-1])
    assert found["kernel_trace.csv"] == "rocprof_v3_csv" and found["results.json"] == "rocprof_v1_json", out
    assert found["908_results.json.gz"] == "rocprof_v3_json", out


def test_pandas_imported_later_still_converts_exactly():
    """Once pandas is imported after overlapviz, pyarrow treats pandas objects as pandas
    objects again (nullable integers, categoricals, timestamps), as if nothing had deferred it."""
    out = run_python(
        """
        from overlapviz.dataset import schema
        import pyarrow as pa
        a = pa.array([1, 2])  # pyarrow's first probe for pandas comes before pandas is imported
        import pandas as pd
        print(pa.array(pd.Series([1, None], dtype="Int64")).to_pylist())
        print(pa.array(pd.Categorical(["a", "b", "a"])).type)
        df = pd.DataFrame({"t": pd.to_datetime(["2020-01-01", None]), "i": pd.array([3, None], dtype="Int64")})
        print(pa.Table.from_pandas(df, preserve_index=False).schema.types)
        """
    )
    lines = out.splitlines()
    assert lines[0] == "[1, None]"
    assert lines[1].startswith("dictionary<values=")
    assert "timestamp" in lines[2] and "int64" in lines[2]
    assert lines[-1] == "True"


@pytest.mark.parametrize("module", ["overlapviz.analysis.metrics", "overlapviz.dataset.schema", "overlapviz.domain.rules", "overlapviz.cli.analyze",
                                    "overlapviz.analysis.explain", "overlapviz.analysis.peers", "overlapviz.analysis.clocks",
                                    "overlapviz.cli.explain", "overlapviz.dataset.computed"])
def test_modules_import_without_pandas(module):
    assert run_python(f"import {module}").splitlines()[-1] == "False"


def test_top_level_help_imports_no_subcommand_or_plotting(tmp_path):
    # `overlapviz --help` lists the commands from their one-line descriptions: no module of theirs,
    # no HoloViews/Panel/pandas (2.4 s and 250 MB before); `python -m overlapviz` is the same command
    out = run_python(
        """
        import sys
        from click.testing import CliRunner
        from overlapviz.cli import COMMANDS, main
        res = CliRunner().invoke(main, ["--help"])
        assert res.exit_code == 0 and all(name in res.output for name in COMMANDS), res.output
        loaded = sorted(m for m in sys.modules if m.startswith("overlapviz.cli.") or m.split(".")[0] in ("holoviews", "panel", "bokeh"))
        print(loaded)
        """
    )  # fmt: skip
    assert out.splitlines()[0] == "[]" and out.splitlines()[-1] == "False", out
    result = subprocess.run([sys.executable, "-m", "overlapviz", "--version"], capture_output=True, text=True, timeout=60,
                            check=False, cwd=tmp_path)  # fmt: skip
    assert result.returncode == 0 and "overlapviz, version" in result.stdout, result.stderr


@pytest.mark.parametrize("command", ["analyze", "explain"])
def test_a_command_help_imports_no_array_library(command):
    # `overlapviz analyze --help` took 0.75 s, nearly all of it importing pyarrow and numpy for one constant
    out = run_python(
        f"""
        import sys
        from click.testing import CliRunner
        from overlapviz.cli import main
        res = CliRunner().invoke(main, ["{command}", "--help"])
        assert res.exit_code == 0, res.output
        print(sorted(m for m in ("numpy", "pyarrow", "pandas") if m in sys.modules))
        """
    )
    assert out.splitlines()[0] == "[]", out
    from overlapviz.analysis import metrics
    from overlapviz.cli import analyze

    assert analyze.PER == metrics.PER


def test_explain_instances_imports_no_pandas(tmp_path):
    """``overlapviz explain --instances`` on raw traces (ingested now) and on a dataset computes its table without
    pandas (~0.4 s of CPU before any work on a shared 2-core machine): issue 36's cold answer."""
    out = run_python(
        """
        import os, sys
        from overlapviz.cli import main
        dlrm, root = sys.argv[1:3]
        os.environ["OVERLAPVIZ_CACHE_DIR"] = root + "/cache"
        os.environ["OVERLAPVIZ_TABLE_CACHE"] = "0"
        for args in (["explain", "--instances", dlrm, "--format", "json"], ["ingest", dlrm, "-o", root + "/ds", "-q"],
                     ["explain", "--instances", root + "/ds", "--wide"]):
            try:
                main(args, standalone_mode=False)
            except SystemExit as exc:
                assert not exc.code, exc
        """,
        DATA / "kineto_real" / "param_dlrm_8rank", tmp_path,
    )  # fmt: skip
    assert out.splitlines()[-1] == "False", out
    assert '"straggler":7' in out and "arrival_skew_us" in out, out
