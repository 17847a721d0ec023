"""``overlapviz export``: files are valid, non-blank and offline; PNG/SVG/PDF go through the real headless chromium."""

from __future__ import annotations

import io
import re
import xml.etree.ElementTree as ET
import zlib

import pytest
from click.testing import CliRunner

from overlapviz.cli import main
from overlapviz.export.render import find_chromium
from overlapviz.testing import write_grid_dataset

needs_chromium = pytest.mark.skipif(find_chromium() is None, reason="Debian chromium + chromium-driver not installed")


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return write_grid_dataset(tmp_path_factory.mktemp("export") / "ds")


def run(*args):
    result = CliRunner().invoke(main, ["export", *map(str, args)])
    return result


def test_html_is_self_contained(dataset, tmp_path):
    import overlapviz.dashboards.app  # noqa: F401  (registers Panel extensions whose CSS lives on a CDN)

    out = tmp_path / "timeline.html"
    result = run(dataset, "--figure", "timeline", "--format", "html", "-o", out, "--run", "cb-ar-baseline-pad0-prio0")
    assert result.exit_code == 0, result.output
    html = out.read_text()
    assert "Bokeh" in html and "cb-ar-baseline-pad0-prio0" in html
    assert not re.findall(r"<script[^>]*\bsrc=", html)  # BokehJS inline, nothing fetched
    assert not re.findall(r"<link[^>]*\bhref=\"(?:https?:)?//", html)


def test_errors_are_one_line(dataset, tmp_path):
    result = run(dataset, "--figure", "timeline", "-o", tmp_path / "x.png", "--run", "nope")
    assert result.exit_code != 0
    assert "no run 'nope'" in result.output and "Traceback" not in result.output
    result = run(dataset, "--figure", "compare", "-o", tmp_path / "x.html", "--run", "cb-ar-baseline-pad0-prio0")
    assert result.exit_code != 0 and "needs 2 run(s)" in result.output
    result = run(tmp_path / "missing", "--figure", "timeline", "-o", tmp_path / "x.html")
    assert result.exit_code != 0 and ("not an overlapviz dataset" in result.output or "no such file" in result.output)
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1
    result = run(dataset, "--figure", "timeline", "-o", tmp_path / "x.txt")
    assert result.exit_code != 0 and "--format" in result.output


def _pdf_drawing_ops(data: bytes) -> int:
    ops = 0
    for stream in re.findall(rb"stream\r?\n(.*?)\r?\nendstream", data, re.S):
        try:
            text = zlib.decompress(stream)
        except zlib.error:
            continue
        ops += len(re.findall(rb"\s(?:re|l|c|f|S)\s", text))
    return ops


@pytest.mark.browser
@needs_chromium
def test_png_svg_pdf_are_valid_and_not_blank(dataset, tmp_path):
    from PIL import Image

    for fmt in ("png", "svg", "pdf"):
        out = tmp_path / f"timeline.{fmt}"
        result = run(dataset, "--figure", "timeline", "-o", out, "--run", "cb-ar-optimized-pad16384-prio-1",
                     "--start-ms", "0", "--end-ms", "0.8")  # fmt: skip
        assert result.exit_code == 0, result.output
    img = Image.open(tmp_path / "timeline.png").convert("RGB")
    assert img.width >= 1000 and img.height >= 200
    colors = img.getcolors(maxcolors=1 << 20)
    assert len(colors) > 20  # plot, not a blank page
    # kernel colours are in the picture: Okabe-Ito blue (compute) and Paul Tol's orange (comm)
    px = {c for _, c in colors}
    assert (0, 114, 178) in px and (238, 119, 51) in px

    svg = ET.parse(tmp_path / "timeline.svg").getroot()
    assert svg.tag.endswith("svg")
    tags = [el.tag.rsplit("}", 1)[-1] for el in svg.iter()]
    assert tags.count("path") > 40 and tags.count("text") > 5  # vector kernels and labels, not a bitmap
    assert "cb-ar-optimized-pad16384-prio-1" in (tmp_path / "timeline.svg").read_text()

    pdf = (tmp_path / "timeline.pdf").read_bytes()
    assert pdf.startswith(b"%PDF-") and b"%%EOF" in pdf[-32:]
    assert _pdf_drawing_ops(pdf) > 40  # vector drawing operators


@pytest.mark.browser
@needs_chromium
def test_every_figure_exports(dataset, tmp_path):
    from PIL import Image

    cases = [("heatmap", ["--value", "speedup"]), ("speedup", []), ("residency", ["--run", "cb-ar-baseline-pad0-prio0"]),
             ("ranks", ["--run", "cb-ar-baseline-pad0-prio0"]),
             ("compare", ["--run", "cb-ar-baseline-pad0-prio0", "--run", "cb-ar-optimized-pad16384-prio-1"])]  # fmt: skip
    for figure, extra in cases:
        out = tmp_path / f"{figure}.png"
        result = run(dataset, "--figure", figure, "-o", out, *extra)
        assert result.exit_code == 0, (figure, result.output)
        img = Image.open(io.BytesIO(out.read_bytes())).convert("RGB")
        assert len(img.getcolors(maxcolors=1 << 20)) > 20, figure


# --- the budget figure from the CLI (#14): --kernel RANK:START_NS, --what-if SETTING -----------------


@pytest.fixture(scope="module")
def standin(tmp_path_factory):
    from pathlib import Path

    from overlapviz.ingest import ingest

    root = Path(__file__).resolve().parent.parent / "sample_traces" / "h200_standin_sweep"
    return ingest([root], tmp_path_factory.mktemp("standin") / "ds", progress=False)


def test_budget_kernel_and_what_if(standin, tmp_path):
    import orjson

    from overlapviz.dataset import schema

    records = orjson.loads(CliRunner().invoke(main, ["explain", str(standin), "--format", "json"]).output)
    blocked = next(r for r in records if r["cause"] == "sm_resources")
    run_id, kernel = blocked["run_id"], f"{blocked['rank']}:{blocked['start_ns']}"
    base = run(standin, "--figure", "budget", "--run", run_id, "--kernel", kernel, "-o", tmp_path / "a.html")
    assert base.exit_code == 0, base.output
    pad = run(standin, "--figure", "budget", "--run", run_id, "--kernel", kernel, "--what-if", "+29312 B", "-o", tmp_path / "b.html")
    assert pad.exit_code == 0, pad.output
    assert "+29312 B" in (tmp_path / "b.html").read_text() and "+29312 B" not in (tmp_path / "a.html").read_text()
    # a computation kernel, no kernel there, a malformed id, an unknown setting: one line each, saying how to find one
    k = schema.read_kernels(standin, run_ids=[run_id]).to_pandas()
    gemm = k.loc[k["kind"] == "compute"].iloc[0]
    cases = [(f"{gemm['rank']}:{gemm['start_ns']}", [], "not a communication kernel"),
             (f"{blocked['rank']}:1", [], "no kernel starting at 1 ns"), ("zero", [], "not RANK:START_NS"),
             (kernel, ["--what-if", "nope"], "the options: 'as is'")]  # fmt: skip
    for bad, extra, message in cases:
        res = run(standin, "--figure", "budget", "--run", run_id, "--kernel", bad, *extra, "-o", tmp_path / "x.html")
        assert res.exit_code == 1 and message in res.output and res.output.count("\n") == 1, res.output
        if not extra:
            assert "overlapviz explain" in res.output
    assert not (tmp_path / "x.html").exists()
    wrong = run(standin, "--figure", "why", "--kernel", kernel, "-o", tmp_path / "x.html")
    assert wrong.exit_code == 2 and "--figure budget" in wrong.output


# --- no spurious warnings (#15 item 8): what a user's terminal shows ---------------------------------


@pytest.mark.browser
@needs_chromium
def test_exports_and_serve_get_print_nothing_on_stderr(standin, tmp_path):
    import subprocess
    import sys

    for fmt in ("png", "svg", "pdf", "html"):
        out = tmp_path / f"why.{fmt}"
        proc = subprocess.run([sys.executable, "-m", "overlapviz", "export", str(standin), "--figure", "why", "-o", str(out)],
                              capture_output=True, text=True, timeout=240)  # fmt: skip
        assert proc.returncode == 0 and out.stat().st_size > 0, proc.stderr
        assert proc.stderr == "", (fmt, proc.stderr)
    proc = subprocess.run([sys.executable, "-m", "overlapviz", "serve", str(standin), "--get", "/"], capture_output=True,
                          text=True, timeout=240)  # fmt: skip
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr


@pytest.mark.browser
@needs_chromium
def test_a_png_is_the_picture_bokeh_s_own_export_draws(dataset, tmp_path):
    """PNG exports are drawn in a page that keeps BokehJS loaded (``export._png``); the picture must be Bokeh's
    ``export_png``'s, pixel for pixel, for figures of every kind (a timeline, a heatmap with its colour bar, two
    panels), also for the figures drawn after the page has been reused and loaded again."""
    from bokeh.io.export import export_png
    from PIL import Image, ImageChops

    from overlapviz.export import render as export

    cases = [("timeline", {"runs": ["cb-ar-optimized-pad16384-prio-1"], "window_ms": (0.0, 0.8)}), ("heatmap", {"value": "speedup"}),
             ("compare", {"runs": ["cb-ar-baseline-pad0-prio0", "cb-ar-optimized-pad16384-prio-1"]})]  # fmt: skip
    with export.chromium() as driver, export._offline_layout_html():
        for round_ in range(2):
            # as a static export draws them (export._static_model: compare's deltas table is HTML only since issue 33)
            models = {figure: export._static_model(export.build_figure(dataset, figure, **options), export.Look())
                      for figure, options in cases}  # fmt: skip
            for figure, model in models.items():  # one after the other in the same page
                export._png(model, tmp_path / f"{figure}-ours.png", driver)
            for figure, model in models.items():
                export_png(model, filename=str(tmp_path / f"{figure}-bokeh.png"), webdriver=driver, timeout=30)
            for figure in models:
                a, b = (Image.open(tmp_path / f"{figure}-{who}.png").convert("RGB") for who in ("ours", "bokeh"))
                assert a.size == b.size, (figure, a.size, b.size)
                assert ImageChops.difference(a, b).getbbox() is None, figure  # the same pixels
                assert len(a.getcolors(maxcolors=1 << 20)) > 20, figure  # a figure, not a blank page


# --- issue 33: the registry, the options, --help without plotting imports -----------------------------------------


def test_export_help_lists_every_figure_and_imports_no_plotting_library():
    import subprocess
    import sys

    from overlapviz.figures.catalog import FIGURES

    code = ("import sys; from click.testing import CliRunner; from overlapviz.cli import main; "
            "r = CliRunner().invoke(main, ['export', '--help']); print(r.output); "
            "print('HEAVY', sorted(m for m in ('holoviews', 'bokeh', 'panel', 'pandas') if m in sys.modules))")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True).stdout
    assert out.rstrip().endswith("HEAVY []"), out[-300:]
    for name, fig in FIGURES.items():
        assert f"{name}: {fig.summary}"[:40] in " ".join(out.split()), name


def test_the_readme_figure_list_is_the_registry_s():
    from pathlib import Path

    from overlapviz.figures.catalog import figure_list_markdown

    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    assert figure_list_markdown() in readme  # regenerate: python -c "from overlapviz.figures.catalog import *; print(figure_list_markdown())"


@pytest.mark.parametrize(("text", "px", "physical"), [("800", 800, False), ("800px", 800, False), ("3.5in", 336, True),
                                                       ("8.89cm", 336, True), ("252pt", 336, True)])  # fmt: skip
def test_lengths(text, px, physical):
    from overlapviz.figures.catalog import parse_length

    assert parse_length(text) == (px, physical)


def test_bad_sizes_are_one_line(dataset, tmp_path):
    for args, message in ((["--width", "3.5 furlongs"], "not a length"), (["--width", "-3in"], "not a length"),
                          (["--dpi", "5"], "--dpi"), (["--size", "poster"], "--size")):  # fmt: skip
        result = run(dataset, "--figure", "ranks", "-o", tmp_path / "x.png", *args)
        assert result.exit_code == 2 and message in result.output, result.output
    assert not (tmp_path / "x.png").exists()
    result = run(dataset, "--all", "--figure", "ranks", "-o", tmp_path / "d")
    assert result.exit_code == 2 and "--all" in result.output
    result = run(dataset, "--all", "-o", tmp_path / "d", "--run", "nope")
    assert result.exit_code == 1 and "no run 'nope'" in result.output and result.output.count("\n") == 1


def test_file_stems_are_safe_and_predictable():
    from overlapviz.export.render import file_stem

    assert file_stem("heatmap") == "heatmap"
    assert file_stem("timeline", ["cb-ar_baseline_p0"]) == "timeline-cb-ar_baseline_p0"
    assert file_stem("compare", ["a/b c", "d"]) == "compare-a_b_c-vs-d"


def test_the_browser_starts_for_static_formats_only():
    """``export`` starts chromium before reading its arguments (reading DATASET imports pandas), from the words given."""
    from overlapviz.cli.export import _draws_static

    for args in (["ds", "--figure", "why", "-o", "a.PNG"], ["ds", "--all", "-o", "dir"], ["ds", "--figure", "why", "--format=pdf", "-o", "x"],
                 ["ds", "--figure", "why", "--output", "x.svg"], ["ds", "--all", "--format", "svg", "-o", "dir"]):  # fmt: skip
        assert _draws_static(args), args
    for args in (["ds", "--figure", "why", "-o", "a.html"], ["ds", "--all", "--format", "html", "-o", "dir"],
                 ["ds", "--format", "perfetto", "-o", "t.png"], ["ds", "--figure", "why", "-o", "a.png", "--help"], ["-h"]):  # fmt: skip
        assert not _draws_static(args), args


def test_the_png_records_its_dpi_and_keeps_its_pixels():
    from PIL import Image, ImageChops

    from overlapviz.export.render import _png_with_dpi

    picture = Image.new("RGB", (7, 5), "#ffffff")
    picture.putpixel((3, 2), (10, 200, 30))
    buf = io.BytesIO()
    picture.save(buf, format="PNG", dpi=(72, 72))  # a pHYs chunk already there is replaced
    out = Image.open(io.BytesIO(_png_with_dpi(buf.getvalue(), 300)))
    out.load()
    assert round(out.info["dpi"][0]) == 300 and round(out.info["dpi"][1]) == 300
    assert ImageChops.difference(out.convert("RGB"), picture).getbbox() is None
    with pytest.raises(ValueError, match="not a PNG"):
        _png_with_dpi(b"<svg/>", 96)


def _chromiums_below(pid: int) -> dict:
    """{pid: profile folder} of the chromium browser processes that descend from ``pid`` (driven over the pipe)."""
    import os

    parent, cmdline = {}, {}
    for p in filter(str.isdigit, os.listdir("/proc")):
        try:
            parent[int(p)] = int(open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()[1])
            cmdline[int(p)] = open(f"/proc/{p}/cmdline").read().split("\0")
        except (OSError, IndexError, ValueError):
            continue
    found = {}
    for p, args in cmdline.items():
        if "--remote-debugging-pipe" not in args:
            continue
        q = p
        while q > 1 and q != pid:
            q = parent.get(q, 1)
        if q == pid:
            found[p] = next(a.split("=", 1)[1] for a in args if a.startswith("--user-data-dir="))
    return found


def _alive(pid: int) -> bool:
    import os

    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.browser
@needs_chromium
def test_the_browser_ends_with_the_command(dataset, tmp_path):
    """The export's chromium and its profile are gone when the command ends, and the browser dies with a command that
    is killed (SIGKILL) while it runs: nothing is left running."""
    import os
    import shutil
    import signal
    import subprocess
    import sys
    import time

    args = [sys.executable, "-m", "overlapviz", "export", str(dataset), "--figure", "heatmap", "-o"]
    proc = subprocess.Popen([*args, str(tmp_path / "a.png")], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen: dict = {}
    while proc.poll() is None:
        seen.update(_chromiums_below(proc.pid))
        time.sleep(0.05)
    assert proc.returncode == 0, proc.stderr
    assert seen, "no chromium seen below the command"
    time.sleep(0.5)
    assert not [p for p in seen if _alive(p)] and not [d for d in seen.values() if os.path.exists(d)], seen

    proc = subprocess.Popen([*args, str(tmp_path / "b.png")], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    seen, end = {}, time.monotonic() + 60
    while not seen and proc.poll() is None and time.monotonic() < end:
        seen = _chromiums_below(proc.pid)
        time.sleep(0.02)
    assert seen, "no chromium seen below the command"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    end = time.monotonic() + 10
    while [p for p in seen if _alive(p)] and time.monotonic() < end:
        time.sleep(0.05)
    left = [p for p in seen if _alive(p)]
    for p in left:
        os.kill(p, signal.SIGKILL)
    for d in seen.values():  # (a killed command cannot remove the profile)
        shutil.rmtree(d, ignore_errors=True)
    assert not left, left
