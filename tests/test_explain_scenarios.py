"""`overlapviz explain` names the cause each ground-truth scenario was built to have (sample_traces/scenarios, an H200).

Each run's manifest says what the construction guarantees (``scenario.expected_cause``, the
causes it accepts, the blocking resource where one applies); see sample_traces/scenarios/README.md.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from overlapviz.analysis.explain import explain
from overlapviz.ingest import ingest

RUNS = Path(__file__).resolve().parent.parent / "sample_traces" / "scenarios" / "runs"
SCENARIOS = {d.name: json.loads((d / "manifest.json").read_text())["scenario"] for d in sorted(RUNS.iterdir()) if d.is_dir()}


@pytest.fixture(scope="module")
def explained(tmp_path_factory):
    return explain(ingest([RUNS], tmp_path_factory.mktemp("scen") / "ds", progress=False))


def test_every_scenario_is_recorded_with_and_without_sync_events():
    names = {s["name"] for s in SCENARIOS.values()}
    assert {"dependency", "sm_resources_smem", "sm_resources_regs", "fits", "stream_order", "host_late"} <= names
    assert sorted(s["cuda_sync_events"] for s in SCENARIOS.values()).count(True) == len(SCENARIOS) // 2


@pytest.mark.parametrize("run_id", sorted(SCENARIOS))
def test_explain_names_each_scenarios_cause_for_every_comm_kernel(explained, run_id):
    s = SCENARIOS[run_id]
    d = explained[explained["run_id"] == run_id]
    assert len(d) >= 3
    assert set(d["cause"]) <= set(s["accepted_causes"]), (run_id, d["cause"].value_counts().to_dict())
    if s["expected_cause"] == "sm_resources":
        assert (d["blocking_resource"] == s["expected_blocking_resource"]).all()
        assert d["blocker"].str.startswith("ovz_gemm").all() and (d["free_sms"] == 0).all()
    if s["expected_cause"] == "dependency":
        assert (d["dependency_source"] == "inferred").all()  # CUDA 13 leaves the record fields at -1
        assert d["producer"].str.startswith("ovz_gemm").all()
    if s["name"] == "fits":
        assert (d["free_sms"] > 0).all()
