"""Every static format of every figure has the PNG's layout (issue 33): each SVG is drawn to pixels by chromium and each
PDF by pdftoppm, and compared with the PNG of the same export: the same size, the dark ink (axes, ticks, labels,
titles) in the same places, every text inside the picture and no two texts over each other. On the real DLRM trace
(8 ranks) and the bundled H200 stand-in sweep (the configuration grid)."""

from __future__ import annotations

import base64
import io
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from overlapviz.cli import main
from overlapviz.export.render import chromium, find_chromium

HANG_S = 600
ROOT = Path(__file__).resolve().parent.parent
pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(find_chromium() is None, reason="Debian chromium + chromium-driver not installed"),
    pytest.mark.skipif(shutil.which("pdftoppm") is None, reason="poppler-utils (pdftoppm) not installed"),
]


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    """``export --all`` of both datasets in png, svg and pdf: {(dataset, stem): {fmt: path}}."""
    from overlapviz.ingest import ingest

    root = tmp_path_factory.mktemp("layout")
    sets = {"dlrm": ROOT / "tests" / "data" / "kineto_real" / "param_dlrm_8rank", "standin": ROOT / "sample_traces" / "h200_standin_sweep"}
    files: dict = {}
    for name, src in sets.items():
        ds = ingest([src], root / name, progress=False)
        runs = [] if name == "dlrm" else ["--run", "cb-ar_baseline_tiled64x64x32-pad0k_p0_standin_072509d6", "--run",
                                            "cb-ar_optimized_tiled64x64x32-pad112k_p-1_standin_9b3b4e5c"]  # (and compare)
        for fmt in ("png", "svg", "pdf"):
            out = root / f"{name}-{fmt}"
            result = CliRunner().invoke(main, ["export", str(ds), "--all", "--format", fmt, "-o", str(out), *runs])
            assert result.exit_code == 0, result.output
            drawn = len(list(out.glob(f"*.{fmt}")))  # the count it says is of figures, not of files (index.html)
            assert f"{drawn} figures and index.html in {out}" in result.output, result.output
            for f in out.glob(f"*.{fmt}"):
                files.setdefault((name, f.stem), {})[fmt] = f
    return files


def _svg_pixels(driver, svg: Path) -> tuple[np.ndarray, list]:
    """The SVG drawn by chromium at 1 px per SVG px, and every text element's box (left, top, right, bottom, text)."""
    driver.get(svg.as_uri())
    w, h = driver.execute_script("const s = document.documentElement; return [s.width.baseVal.value, s.height.baseVal.value];")
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {"width": int(w), "height": int(h), "deviceScaleFactor": 1, "mobile": False})
    shot = driver.execute_cdp_cmd("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True,
                                                             "clip": {"x": 0, "y": 0, "width": w, "height": h, "scale": 1}})  # fmt: skip
    boxes = driver.execute_script("""return [...document.querySelectorAll('text')].filter(t => t.textContent.trim()).map(t => {
        const r = t.getBoundingClientRect(); return [r.left, r.top, r.right, r.bottom, t.textContent]; });""")
    return _rgb(base64.b64decode(shot["data"])), boxes


def _rgb(data: bytes) -> np.ndarray:
    from PIL import Image

    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"), dtype=np.float64)


def _pdf_pixels(pdf: Path, tmp: Path) -> np.ndarray:
    """The PDF drawn by poppler at 96 dpi: 1 px per CSS px of the figure (the PDF is printed at 0.75 pt per px)."""
    subprocess.run(["pdftoppm", "-r", "96", "-png", "-singlefile", str(pdf), str(tmp / pdf.stem)], check=True, timeout=120)
    return _rgb((tmp / f"{pdf.stem}.png").read_bytes())


def _dark_tiles(img: np.ndarray, tile: int = 12) -> np.ndarray:
    """Tiles holding dark grey ink (axes, ticks, labels, titles: luminance < 160, nearly no colour; poppler draws text
    lighter than chromium, so a darker threshold misses its thin strokes)."""
    lum = img @ np.array([0.2126, 0.7152, 0.0722])
    grey = (img.max(axis=2) - img.min(axis=2)) < 40
    mask = (lum < 160) & grey
    h, w = mask.shape
    mask = mask[: h // tile * tile, : w // tile * tile].reshape(h // tile, tile, w // tile, tile)
    return mask.sum(axis=(1, 3)) >= 3


def _agreement(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    """(share of ``a``'s ink tiles that ``b`` has ink at or next to, and the other way round)."""
    return (a & _grown(b)).sum() / max(a.sum(), 1), (b & _grown(a)).sum() / max(b.sum(), 1)


def _grown(m: np.ndarray) -> np.ndarray:
    """``m`` with every tile next to a set one set too (a 3x3 dilation)."""
    p = np.pad(m, 1)
    return np.logical_or.reduce([p[1 + dy : p.shape[0] - 1 + dy, 1 + dx : p.shape[1] - 1 + dx] for dy in (-1, 0, 1) for dx in (-1, 0, 1)])


def _overlaps(boxes: list) -> list:
    """Pairs of texts whose boxes overlap by more than a pixel each way (a line's box includes its ascent and descent)."""
    out = []
    for i, (l1, t1, r1, b1, s1) in enumerate(boxes):
        for l2, t2, r2, b2, s2 in boxes[i + 1 :]:
            if min(r1, r2) - max(l1, l2) > 1.5 and min(b1, b2) - max(t1, t2) > 2.5:
                out.append((s1, s2))
    return out


def layout_problems(label: str, files: dict, driver, tmp: Path) -> list[str]:
    """What differs between the PNG of one export and its SVG and PDF drawn to pixels, and texts of the SVG outside
    the picture or over each other (empty: the same layout)."""
    assert set(files) == {"png", "svg", "pdf"}, (label, files)
    problems = []
    png = _rgb(files["png"].read_bytes())
    svg, boxes = _svg_pixels(driver, files["svg"])
    pdf = _pdf_pixels(files["pdf"], tmp)
    h, w = png.shape[:2]
    for fmt, img in (("svg", svg), ("pdf", pdf)):
        if abs(img.shape[0] - h) > 2 or abs(img.shape[1] - w) > 2:
            problems.append(f"{label}.{fmt}: {img.shape[1]}x{img.shape[0]} px, the PNG {w}x{h}")
            continue
        hh, ww = min(h, img.shape[0]), min(w, img.shape[1])
        found, extra = _agreement(_dark_tiles(png[:hh, :ww]), _dark_tiles(img[:hh, :ww]))
        # every label of the PNG where the PNG has it; poppler and cairo draw thin edges darker (an image's cell
        # borders, 1 px outlines), so the vector picture may have some dark ink more
        if found < 0.9 or extra < 0.75:
            problems.append(f"{label}.{fmt}: {found:.0%} of the PNG's axes and labels found, {extra:.0%} of its own at the PNG's")
    outside = [b[4] for b in boxes if b[0] < -1 or b[1] < -1 or b[2] > w + 1 or b[3] > h + 1]
    if outside:
        problems.append(f"{label}.svg: text outside the picture: {outside[:3]}")
    if over := _overlaps(boxes):
        problems.append(f"{label}.svg: texts over each other: {over[:3]}")
    return problems


def test_every_figure_in_every_static_format_has_the_png_s_layout(exports, tmp_path):
    from overlapviz.figures.catalog import FIGURES

    drawn = {stem.split("-")[0] for _, stem in exports}
    # the DLRM run has every per-run figure but the breakdown (when its analysis exists); the stand-in sweep the grid
    assert {"timeline", "why", "collectives", "ranks", "residency", "budget", "heatmap", "speedup", "compare"} <= drawn, drawn
    assert drawn <= set(FIGURES)
    with chromium() as driver:
        problems = [p for (name, stem), files in sorted(exports.items()) for p in layout_problems(f"{name}/{stem}", files, driver, tmp_path)]
    assert not problems, "\n".join(problems)


def test_all_writes_an_index_linking_every_file(exports):
    for name in ("dlrm", "standin"):
        files = [f for (n, _), fs in exports.items() if n == name for f in fs.values()]
        for folder in {f.parent for f in files}:
            index = (folder / "index.html").read_text()
            for f in folder.iterdir():
                if f.name != "index.html":
                    assert f'href="{f.name}"' in index, (folder, f.name)


def test_paper_column_size(tmp_path):
    """``--size column``: 3.5 in wide (a 252 pt PDF page, a 1050 px PNG at 300 dpi that says so), 8 pt text, no title;
    at that size too no text leaves the picture or lies over another, in every format."""
    import re

    from PIL import Image

    from overlapviz.ingest import ingest

    ds = ingest([ROOT / "tests" / "data" / "kineto_real" / "param_dlrm_8rank"], tmp_path / "ds", progress=False)
    # (collectives: a half-width panel under full-width ones; budget: a label per resource, ran off the picture)
    for figure in ("why", "ranks", "collectives", "budget"):
        files = {}
        for fmt in ("png", "svg", "pdf"):
            files[fmt] = tmp_path / f"{figure}.{fmt}"
            extra = ["--dpi", "96"] if fmt == "png" else []  # (compared at one pixel per CSS pixel)
            result = CliRunner().invoke(main, ["export", str(ds), "--figure", figure, "--size", "column", "-o", str(files[fmt]), *extra])
            assert result.exit_code == 0, result.output
        with chromium() as driver:
            assert not layout_problems(figure, files, driver, tmp_path)
        box = re.search(rb"/MediaBox\s*\[\s*0 0 ([\d.]+) ([\d.]+)", files["pdf"].read_bytes())
        assert abs(float(box.group(1)) - 252) < 1, box.group(0)
        svg = files["svg"].read_text()
        assert {"7pt", "8pt"} >= set(re.findall(r'font-size="([^"]+)"', svg)), figure  # ticks 7 pt, labels 8 pt
        assert "Late-start time" not in svg and "Communication per rank" not in svg  # no titles on paper
    # SVG and PDF are vector: the resolution (300 dpi with --size column) changes nothing in them (the SVG's legend
    # markers were drawn 3.125 times too large: BokehJS's SVG took the PNG's device scale)
    again = tmp_path / "budget96.svg"
    result = CliRunner().invoke(main, ["export", str(ds), "--figure", "budget", "--size", "column", "--dpi", "96", "-o", str(again)])
    assert result.exit_code == 0, result.output
    ids = lambda svg: re.sub(r'(id="|url\(#)[A-Za-z]+', r"\1", svg)  # noqa: E731  (BokehJS names clip paths at random)
    assert ids(again.read_text()) == ids((tmp_path / "budget.svg").read_text())
    out = tmp_path / "why300.png"
    assert CliRunner().invoke(main, ["export", str(ds), "--figure", "why", "--size", "column", "-o", str(out)]).exit_code == 0
    img = Image.open(out)
    assert abs(img.width - 1050) <= 3 and round(img.info["dpi"][0]) == 300, (img.size, img.info)


def test_a_figure_taller_than_the_window(tmp_path):
    """The paper grid's heatmap is 2,316 px tall: the PNG has all of it (Chromium paints nothing below its viewport, even
    for a screenshot beyond it: the first CDP capture was cut at 1,000 px), as the SVG and the PDF."""
    from overlapviz.ingest import ingest

    ds = ingest([ROOT / "sample_traces" / "h200_paper_grid"], tmp_path / "ds", progress=False)
    files = {fmt: tmp_path / f"heatmap.{fmt}" for fmt in ("png", "svg", "pdf")}
    for out in files.values():
        result = CliRunner().invoke(main, ["export", str(ds), "--figure", "heatmap", "-o", str(out)])
        assert result.exit_code == 0, result.output
    png = _rgb(files["png"].read_bytes())
    assert png.shape[0] > 2000
    rows = np.nonzero((png < 200).any(axis=2).any(axis=1))[0]
    assert rows[-1] > png.shape[0] - 60, rows[-1]  # the axis title at the bottom is in the picture
    with chromium() as driver:
        assert not layout_problems("grid/heatmap", files, driver, tmp_path)


def test_a_paper_column_too_narrow_for_the_labels_is_refused(tmp_path):
    """Configuration labels leave a 3.5 in heatmap no plot at all: one line saying what to give, no file."""
    from overlapviz.ingest import ingest

    ds = ingest([ROOT / "sample_traces" / "h200_paper_grid"], tmp_path / "ds", progress=False)
    result = CliRunner().invoke(main, ["export", str(ds), "--figure", "heatmap", "--size", "column", "-o", str(tmp_path / "h.pdf")])
    assert result.exit_code == 1 and "--width" in result.output and "(3.50 in)" in result.output, result.output
    assert result.output.count("\n") == 1 and not (tmp_path / "h.pdf").exists()
