"""The dashboard's DataStore and pages, built and driven in-process as a user would (no browser here)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import panel as pn
import pytest
from bokeh.models import Plot

from overlapviz import schema

H200 = {
    "device": 0, "name": "NVIDIA H200", "vendor": "nvidia", "arch": "sm_90", "compute_major": 9, "compute_minor": 0,
    "num_sms": 132, "max_threads_per_sm": 2048, "max_threads_per_block": 1024, "max_blocks_per_sm": 32,
    "regs_per_sm": 65536, "regs_per_block": 65536, "shared_mem_per_sm": 233472, "shared_mem_per_block": 49152,
    "shared_mem_per_block_optin": 232448, "warp_size": 32,
}  # fmt: skip


def write_grid_dataset(out, *, pads=(0, 16384), priorities=(0, -1), ranks=2, iters=6, per_iter=4, seed=0,
                       stand_in=True) -> str:  # fmt: skip
    """A small collected-style dataset written through the real DatasetWriter: a shaping x priority grid
    of cb-ar runs (sequential, baseline, optimized), two ranks, GEMM tiles on one stream and an
    all-reduce on another, steps, iteration times and an H200's limits."""
    rng = np.random.default_rng(seed)
    configs = [("sequential", 0, 0), ("baseline", 0, 0)] + [("optimized", p, q) for p in pads for q in priorities]
    with schema.DatasetWriter(out) as w:
        for i, (setup, pad, prio) in enumerate(configs):
            run_id = f"cb-ar-{setup}-pad{pad}-prio{prio}"
            slow = {"sequential": 1.0, "baseline": 0.85}.get(setup, 0.8 - pad / 400000 + prio * 0.01)
            w.add("runs", pd.DataFrame([{
                "run_id": run_id, "source": "collected", "workload": "cb-ar", "setup": setup, "compute_impl": "tiled",
                "gemm_m": 4096, "gemm_n": 4096, "gemm_k": 4096, "tile_m": 64, "tile_n": 64, "tile_k": 32,
                "smem_pad_bytes": pad, "comm_priority": prio, "comm_priority_effective": prio, "collective": "all_reduce",
                "message_bytes": 64 << 20, "world_size": ranks, "n_ranks": ranks, "backend": "stand-in" if stand_in else "nccl",
                "stand_in": stand_in, "iterations": iters, "warmup_iterations": iters // 3, "device_name": "NVIDIA H200",
                "status": "ok", "config_json": json.dumps({"setup": setup}),
            }]))  # fmt: skip
            for r in range(ranks):
                w.add("ranks", pd.DataFrame([{"run_id": run_id, "rank": r, "world_size": ranks, "source_format": "chrome"}]))
                w.add("devices", pd.DataFrame([{"run_id": run_id, "rank": r, **H200}]))
                rows, steps, t = [], [], 1_000
                for it in range(iters):
                    steps.append({"run_id": run_id, "rank": r, "step": it, "name": f"ovz_iter#{it}", "source": "iteration",
                                  "start_ns": t - 500, "end_ns": t + 2_000})  # fmt: skip
                    t0 = t
                    for k in range(per_iter):
                        d = int(rng.integers(40_000, 60_000))
                        rows.append(("gemm_tiled_64x64x32_kernel", "compute", 7, t, t + d, 4096, 128, 128, pad + 32768, it))
                        t += d + 2_000
                    cstart = t0 + (30_000 if setup != "sequential" else t - t0)
                    cdur = int(rng.integers(90_000, 110_000))
                    rows.append(("ncclDevKernel_AllReduce_Sum_f32_RING_LL", "comm", 13, cstart, cstart + cdur, 16, 512, 96, 0, it))
                    t = max(t, cstart + cdur) + 5_000 + 3_000 * r
                k = pd.DataFrame(rows, columns=["name", "kind", "stream", "start_ns", "end_ns", "grid_x", "block_x",
                                                "regs_per_thread", "shared_mem_bytes", "step"])  # fmt: skip
                k = k.assign(run_id=run_id, rank=r, device=0, grid_y=1, grid_z=1, block_y=1, block_z=1, category="kernel",
                             is_host=False, launch_ns=k["start_ns"] - 800, correlation=np.arange(len(k)),
                             source_format="chrome")  # fmt: skip
                w.add_kernels(schema.conform(k, schema.KERNELS), run_id, r)
                w.add("steps", pd.DataFrame(steps))
                times = slow * (1 + 0.01 * rng.standard_normal(iters))
                w.add("iterations", pd.DataFrame({"run_id": run_id, "rank": r, "iteration": np.arange(iters),
                                                  "time_ms": times, "measured": np.arange(iters) >= iters // 3}))  # fmt: skip
        w.commit()
    return str(out)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return write_grid_dataset(tmp_path_factory.mktemp("dash") / "ds")


def test_store_binds_runs_and_filters(dataset):
    from overlapviz.dashboards.store import DataStore

    store = DataStore(dataset)
    assert len(store.runs) == 6
    assert store.run_id == "cb-ar-sequential-pad0-prio0"
    assert store.param.ranks.objects == [0, 1]
    assert any("stand-in" in label for label in store.param.run_id.names)
    full = store.timeline()
    store.ranks = [1]
    only1 = store.timeline()
    assert set(only1.frame["rank"]) == {1} and len(only1.frame) * 2 == len(full.frame)
    assert "single-GPU stand-in" in store.configuration_text()


def test_store_reports_missing_analysis_instead_of_computing(dataset, monkeypatch):
    from overlapviz.dashboards import store as store_mod

    with pytest.raises(store_mod.Unavailable, match="overlapviz.no_such_module"):
        store_mod._analysis("no_such_module", "f")


def test_pages_build_and_follow_the_store(dataset):
    from overlapviz.dashboards.app import PAGES, build_app
    from overlapviz.dashboards.pages import TimelinePage

    app = build_app(dataset)
    app.__panel__()
    assert list(app.tabs._names) == list(PAGES)
    for page in app.pages:
        page.__panel__()  # every page composes without error
    timeline = next(p for p in app.pages if isinstance(p, TimelinePage))
    assert not timeline.shown and isinstance(timeline._plot(), pn.Spacer)  # hidden: no work on store changes
    app.tabs.active = PAGES.index("Timeline")
    assert timeline.shown and not app.pages[0].shown
    store = timeline.store
    pane = timeline._plot()
    root = pane.get_root()  # drawn, as in a session
    figure = next(iter(root.select({"type": Plot})))
    store.run_id = "cb-ar-optimized-pad16384-prio-1"
    # a run switch redraws the frame of the one live plot into the same figure instead of building another
    assert timeline._plot() is pane
    assert next(iter(root.select({"type": Plot}))) is figure
    assert figure.title.text.startswith("Timeline of cb-ar-optimized-pad16384-prio-1")
    assert "16384" in timeline._info().object


def test_metric_deltas_present_analyze_rows():
    from overlapviz.figures import metric_deltas

    m = pd.DataFrame({"run_id": ["a", "a", "b", "b"], "rank": [0, 1, 0, 1], "comm_us": [10.0, 20.0, 5.0, 5.0],
                      "overlap_fraction": [0.5, 0.5, 1.0, 1.0]})  # fmt: skip
    d = metric_deltas(m, "a", "b").set_index("metric (mean over ranks)")
    assert d.loc["comm_us", "A"] == 15.0 and d.loc["comm_us", "B − A"] == -10.0
    assert d.loc["overlap_fraction", "B − A"] == 0.5


def test_get_serves_the_page_once(dataset):
    from overlapviz.dashboards.app import get

    status, body = get(dataset, "/")
    assert status == 200, body[:500]
    assert "<title>overlapviz</title>" in body
    # offline: every script and stylesheet comes from this server
    import re

    refs = re.findall(r'(?:src|href)="([^"]+)"', body)
    assert any("bokeh.min.js" in r for r in refs)
    assert not [r for r in refs if "//" in r], refs
    assert pn.state.served is False


def test_serve_get_through_the_cli(dataset):
    from click.testing import CliRunner

    from overlapviz.cli import main

    result = CliRunner().invoke(main, ["serve", dataset, "--get", "/"])
    assert result.exit_code == 0, result.output
    assert "<title>overlapviz</title>" in result.output
    bad = CliRunner().invoke(main, ["serve", dataset + "-missing", "--get", "/"])
    assert bad.exit_code != 0 and "not an overlapviz dataset" in bad.output and "Traceback" not in bad.output


def test_sample_traces_are_ingested_once_per_content(tmp_path):
    import shutil

    from overlapviz import samples

    sources = samples.sample_sources()
    if not sources:
        pytest.skip("no sample traces bundled in this checkout")
    root = tmp_path / "samples"
    shutil.copytree(sources[0], root / sources[0].name)
    first = samples.sample_dataset(root=root, cache=tmp_path / "cache")
    assert (first / schema.METADATA_FILE).exists()
    stamp = (first / schema.METADATA_FILE).stat().st_mtime_ns
    assert samples.sample_dataset(root=root, cache=tmp_path / "cache") == first  # cached, not ingested again
    assert (first / schema.METADATA_FILE).stat().st_mtime_ns == stamp
    runs = schema.read_frame(first, "runs")
    assert len(runs) and runs["run_id"].is_unique
    (root / "extra.json").write_text("{}")  # outside the sweep directory: not a source, same key
    assert samples.content_key(samples.sample_sources(root)) == first.name.removeprefix("samples-")
    with pytest.raises(ValueError, match="no sample traces"):
        samples.sample_dataset(root=tmp_path / "empty", cache=tmp_path / "cache")
