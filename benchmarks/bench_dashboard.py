"""Dashboard benchmark: time to first render of each page, and of widget updates, in headless chromium.

Not a test: prints a table. Datasets: the bundled sample traces and a generated one-million-kernel
trace (overlapviz.testing.generate_trace, ingested by overlapviz.ingest.ingest, cached in --work).

    .venv/bin/python benchmarks/bench_dashboard.py [--kernels 1000000] [--work /tmp/ovz-bench] [--samples-only]
"""

from __future__ import annotations

import argparse
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

PAGES = ("Overview", "Timeline", "Compare", "Residency", "Ranks")
TITLES_JS = "return [...Bokeh.documents[0].all_models].filter(m => m.type === 'Title').map(m => m.text)"
CANVAS_JS = """
function all(root, out) { root.querySelectorAll('canvas').forEach(c => out.push(c));
  root.querySelectorAll('*').forEach(e => { if (e.shadowRoot) all(e.shadowRoot, out); }); return out; }
return all(document, []).filter(c => { const r = c.getBoundingClientRect(); if (r.width < 100 || r.height < 100) return false;
  const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data; const s = new Set();
  for (let i = 0; i < d.length; i += 4 * 53) s.add((d[i] << 16) | (d[i + 1] << 8) | d[i + 2]); return s.size >= 8; }).length;
"""
SET_JS = """const [type, prop, value, title] = arguments;
const m = [...Bokeh.documents[0].all_models].find(m => m.type === type && (title === null || m.title === title));
m[prop] = value;"""


def big_dataset(work: Path, n: int) -> Path:
    from overlapviz.ingest import ingest
    from overlapviz.testing import generate_trace, write_trace

    out = work / f"generated-{n}"
    if (out / "dataset.json").exists():
        return out
    t0 = time.perf_counter()
    trace = write_trace(generate_trace(n, rank=0, world_size=1, seed=0), work / f"generated-{n}.json.gz")
    t1 = time.perf_counter()
    ingest([str(trace)], out, overwrite=True)
    print(f"generated {n:,} kernels in {t1 - t0:.1f} s, ingested in {time.perf_counter() - t1:.1f} s", file=sys.stderr)
    return out


def wait(predicate, timeout=300.0):
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < timeout:
        try:
            if predicate():
                return time.perf_counter() - t0
        except Exception:  # scripts still loading
            pass
        time.sleep(0.05)
    raise TimeoutError


def bench_server_side(dataset: Path) -> dict:
    """Figure building in the server process (no browser): load + first frame, zoomed frame, run switch."""
    from overlapviz import figures
    from overlapviz.dashboards.store import DataStore

    out = {}
    store = DataStore(dataset)
    t0 = time.perf_counter()
    data = store.timeline()
    out["load kernels (cold)"] = time.perf_counter() - t0
    for label in ("first frame (cold)", "first frame (warm)"):
        t0 = time.perf_counter()
        figures.timeline_view(data, None)
        out[label] = time.perf_counter() - t0
    lo, hi = data.x_extent
    t0 = time.perf_counter()
    frame = figures.timeline_view(data, (lo, lo + (hi - lo) / 2000))
    out[f"zoomed frame ({len(frame.get(2)):,} glyphs)"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    store.timeline()
    out["load kernels (warm, cached)"] = time.perf_counter() - t0
    return out


def idle_drawn(driver) -> bool:
    return driver.execute_script("return Bokeh.documents[0].is_idle") and driver.execute_script(CANVAS_JS) > 0


def bench_browser(dataset: Path) -> dict:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    from overlapviz.export import chromium_options, find_chromium

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-c", "from overlapviz.cli import main; main()", "serve", str(dataset),
                             "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    browser, driver_path = find_chromium()
    driver = webdriver.Chrome(service=Service(driver_path), options=chromium_options(browser, width=1400, height=1100))
    out = {}
    try:
        wait(lambda: socket.create_connection(("127.0.0.1", port), timeout=1).close() or True)
        for attempt in ("cold", "warm"):
            t0 = time.perf_counter()
            driver.get(f"http://127.0.0.1:{port}/")
            # imported traces have no configuration grid: the Overview is then a notice, not a plot
            wait(lambda: driver.execute_script("return Bokeh.documents[0].is_idle") and (
                driver.execute_script(CANVAS_JS) > 0 or driver.execute_script(
                    "return [...Bokeh.documents[0].all_models].some(m => String(m.text || '').includes('no grid to show'))")))
            out[f"Overview first render ({attempt})"] = time.perf_counter() - t0
        for i, page in enumerate(PAGES[1:], start=1):
            t0 = time.perf_counter()
            driver.execute_script(SET_JS, "panel.models.tabs.Tabs", "active", i, None)
            marker = {"Timeline": "Timeline of", "Compare": "A: ", "Residency": "Residency", "Ranks": "Communication"}[page]
            wait(lambda: any(marker in t for t in driver.execute_script(TITLES_JS)) and driver.execute_script(CANVAS_JS) > 0)
            out[f"{page} first render"] = time.perf_counter() - t0
        # widget update: the Timeline's configuration choice
        driver.execute_script(SET_JS, "panel.models.tabs.Tabs", "active", 1, None)
        # the tab switch itself must be over (its title is already in the document), or its work counts as the switch's
        wait(lambda: any("Timeline of" in t for t in driver.execute_script(TITLES_JS)) and idle_drawn(driver))
        sel = driver.execute_script("return [...Bokeh.documents[0].all_models].find(m => m.type === "
                                    "'panel.models.widgets.CustomSelect' && m.title === 'Configuration').options")
        labels = [o if isinstance(o, str) else o[0] for o in sel]
        # switches to runs not shown before (their kernels are read then): the first and the median of up to 5
        switches = []
        for label in labels[1:6]:
            t0 = time.perf_counter()
            driver.execute_script(SET_JS, "panel.models.widgets.CustomSelect", "value", label, "Configuration")
            run = label.split(" — ")[0]
            wait(lambda: any(f"Timeline of {run}" in t for t in driver.execute_script(TITLES_JS)))
            switches.append(time.perf_counter() - t0)
            wait(lambda: idle_drawn(driver))
        if switches:
            out["Timeline run switch (widget update), first"] = switches[0]
            out[f"Timeline run switch (widget update), median of {len(switches)}"] = statistics.median(switches)
        # widget update: the glyph budget, which redraws the same run
        t0 = time.perf_counter()
        driver.execute_script(SET_JS, "Spinner", "value", 30000, "Glyphs up to (kernels in view)")
        time.sleep(0.05)
        wait(lambda: driver.execute_script("return Bokeh.documents[0].is_idle") and driver.execute_script(CANVAS_JS) > 0)
        out["Timeline glyph budget change (widget update)"] = time.perf_counter() - t0
    finally:
        driver.quit()
        proc.terminate()
        proc.wait(timeout=30)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernels", type=int, default=1_000_000)
    parser.add_argument("--work", type=Path, default=Path("/tmp/ovz-bench"))
    parser.add_argument("--samples-only", action="store_true", help="skip the generated dataset")
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    from overlapviz import samples

    datasets = {"sample traces": samples.sample_dataset(cache=args.work / "cache")}
    if not args.samples_only:
        datasets[f"generated {args.kernels:,} kernels"] = big_dataset(args.work, args.kernels)
    for name, path in datasets.items():
        print(f"\n## {name} ({path})")
        for label, secs in bench_server_side(path).items():
            print(f"| {label} | {secs:.2f} s |", flush=True)
        for label, secs in bench_browser(path).items():
            print(f"| {label} | {secs:.2f} s |", flush=True)


if __name__ == "__main__":
    main()
