"""Ground-truth scenarios on CPU: their definitions, constructions, run ids, CLI and the recorded manifests.

The recordings are in sample_traces/scenarios/ (one H200). What ``overlapviz explain``
must find in their traces is tested with explain; here only what the collector promises:
every scenario names a DESIGN.md cause, its configuration is valid and builds the intended
situation by the device's limits, and every recorded manifest says so.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from overlapviz.cli import main
from overlapviz.collectors import manifest as mf
from overlapviz.collectors import scenarios as sc

RECORDED = Path(__file__).resolve().parent.parent / "sample_traces" / "scenarios"
H200 = sc.DeviceLimits()


@pytest.mark.parametrize("name", list(sc.SCENARIOS))
def test_every_scenario_names_a_design_cause_and_builds_a_valid_stand_in_config(name):
    s = sc.SCENARIOS[name]
    assert s.expected_cause in sc.CAUSES and set(s.accepted_causes) <= set(sc.CAUSES)
    config = s.config(H200)
    assert config.backend == "stand-in" and config.compute_impl == "tiled" and config.smem_carveout_percent == 100
    assert config.iterations // 3 == sc.WARMUP_ITERATIONS and config.trace_iterations == sc.TRACED_ITERATIONS
    assert (config.setup == "sequential") == (s.layout == "same_stream")
    assert config.comm_priority is None  # both streams at priority 0: no scenario leans on priority
    sc.construction(s, config, H200)  # raises when the situation would not be what the scenario says


def test_sm_resources_scenarios_block_exactly_the_named_resource_for_whole_waves():
    for name, resource, per_sm in (("sm_resources_smem", "shared_memory", 1), ("sm_resources_regs", "registers", 2)):
        s = sc.SCENARIOS[name]
        facts = sc.construction(s, s.config(H200), H200)
        assert s.expected_blocking_resource == resource
        assert facts["gemm_blocks_per_sm"] == per_sm
        assert facts["gemm_waves"] == int(facts["gemm_waves"]) >= 4  # whole waves over all 132 SMs
        assert facts["sms_free_of_gemm_first_wave"] == 0
        assert [r for r, ok in facts["comm_fits_beside_full_sm"].items() if not ok] == [resource]
    regs = sc.construction(sc.SCENARIOS["sm_resources_regs"], sc.SCENARIOS["sm_resources_regs"].config(H200), H200)
    # 2 x (48 regs x 256 threads) + 96 x 512 > 65,536; one GEMM block fewer and the comm fits
    assert 2 * regs["gemm_block_regs"] + regs["comm_block_regs"] > H200.regs_per_sm >= regs["gemm_block_regs"] + regs["comm_block_regs"]


@pytest.mark.parametrize("name", ["dependency", "fits", "stream_order", "host_late"])
def test_other_scenarios_leave_most_sms_free_of_the_gemm(name):
    s = sc.SCENARIOS[name]
    facts = sc.construction(s, s.config(H200), H200)
    assert facts["gemm_waves"] <= 1 / 3 and facts["sms_free_of_gemm_first_wave"] >= 2 * H200.num_sms // 3


def test_constructions_follow_the_device_and_refuse_one_where_they_cannot_hold():
    a100 = sc.DeviceLimits(num_sms=108, smem_per_sm=167936, smem_per_block_optin=166912)
    for s in sc.SCENARIOS.values():
        sc.construction(s, s.config(a100), a100)  # an A100's limits: each still holds
    assert sc.SCENARIOS["sm_resources_smem"].config(a100).gemm_n == 108 * 64
    big_regs = sc.DeviceLimits(regs_per_sm=131072)
    s = sc.SCENARIOS["sm_resources_regs"]
    with pytest.raises(ValueError, match="scenario sm_resources_regs: the comm is kept out by nothing"):
        sc.construction(s, s.config(big_regs), big_regs)
    with pytest.raises(ValueError, match="gets 1 blocks per SM, not 2"):
        sc.construction(s, s.config(H200).replace(smem_pad_bytes=150000), H200)


def test_scenario_definitions_are_checked():
    base = dict(name="x", accepted_causes=("none",), layout="two_streams", grid="third", gemm_blocks_per_sm=1,
                gemm_k=64, description="")
    with pytest.raises(ValueError, match="expected_cause must be one of"):
        sc.Scenario(expected_cause="late", expected_blocking_resource=None, **base)
    with pytest.raises(ValueError, match="exactly when the cause is sm_resources"):
        sc.Scenario(expected_cause="none", expected_blocking_resource="registers", **base)
    with pytest.raises(ValueError, match="accepted_causes"):
        sc.Scenario(expected_cause="dependency", expected_blocking_resource=None, **base)


def test_run_ids_name_the_scenario_and_the_sync_events_and_are_distinct():
    ids = [sc.run_id(n, s) for n in sc.SCENARIOS for s in (True, False)]
    assert len(set(ids)) == 12
    assert sc.run_id("fits", True) == "scenario-fits_sync-events-on"
    assert [s.name for s in sc.select("all")] == list(sc.SCENARIOS)
    assert [s.name for s in sc.select("fits, sm-resources-smem,fits")] == ["fits", "sm_resources_smem"]
    with pytest.raises(ValueError, match="'nope' does not exist; scenarios: all, dependency"):
        sc.select("nope")


def test_launch_command_runs_the_scenarios_module():
    cmd = sc.launch_command(["fits", "dependency"], "/o", launcher="env X=1 python3")
    assert cmd == ["env", "X=1", "python3", "-m", "overlapviz.collectors.scenarios", "--scenario", "fits,dependency",
                   "--out", "/o"]


def test_cli_scenario_lists_refuses_knobs_and_other_sources(tmp_path):
    runner = CliRunner()
    r = runner.invoke(main, ["collect", "--scenario", "all", "--list", "-o", str(tmp_path)])
    assert r.exit_code == 0, r.output
    assert r.output.splitlines()[0] == "scenario-dependency_sync-events-on\ttodo" and len(r.output.splitlines()) == 12
    r = runner.invoke(main, ["collect", "--scenario", "fits", "--setup", "optimized", "-o", str(tmp_path)])
    assert r.exit_code != 0 and "--scenario takes no configuration options (got --setup)" in r.output
    r = runner.invoke(main, ["collect", "--scenario", "fits", "--preset", "cb_ar", "-o", str(tmp_path)])
    assert r.exit_code != 0 and "exactly one of --preset, --sweep, --config or --scenario" in r.output
    r = runner.invoke(main, ["collect", "--scenario", "nope", "-o", str(tmp_path)])
    assert r.exit_code != 0 and "'nope' does not exist" in r.output and "Traceback" not in r.output


def test_module_lists_and_rejects_unknown_scenarios(tmp_path, capsys):
    assert sc.main(["--scenario", "fits", "--out", str(tmp_path), "--list", "--sync-events", "on"]) == 0
    assert capsys.readouterr().out == "scenario-fits_sync-events-on\ttodo\n"
    assert sc.main(["--scenario", "late", "--out", str(tmp_path)]) == 2


# --- the recorded scenarios ---------------------------------------------------------------


def _recorded() -> list[Path]:
    return sorted((RECORDED / sc.RUNS_DIR).glob("*/manifest.json"))


def test_every_scenario_was_recorded_with_and_without_sync_events():
    found = {}
    for path in _recorded():
        data = json.loads(path.read_text())
        s = sc.validate_manifest(data, where=str(path))
        assert data["run"]["status"] == "ok", data["run"]["error"]
        assert (path.parent / mf.TRACE.format(rank=0)).is_file()
        found[(s["name"], s["cuda_sync_events"])] = path.parent.name
    assert set(found) == {(n, s) for n in sc.SCENARIOS for s in (True, False)}


@pytest.mark.parametrize("path", _recorded(), ids=lambda p: p.parent.name)
def test_recorded_manifest_is_the_construction_on_its_device(path):
    data = json.loads(path.read_text())
    s = sc.SCENARIOS[data["scenario"]["name"]]
    device = data["devices"][0]
    limits = sc.DeviceLimits.from_device_row(device)
    assert data["config"] == s.config(limits).to_dict()
    kernels = data["effective"]["kernels"]
    assert kernels["gemm"]["blocks_per_sm"] == s.gemm_blocks_per_sm  # CUDA's own occupancy answer agreed
    facts = sc.construction(s, s.config(limits), limits, gemm_regs=kernels["gemm"]["regs_per_thread"],
                            comm_regs=kernels["comm"]["regs_per_thread"])
    assert data["scenario"]["construction"] == json.loads(json.dumps(facts))
    assert data["effective"]["smem_carveout_applied"] is True
    assert data["run"]["device_name"] == device["name"] and data["run"]["stand_in"] is True
    profiler = data["profiler"]
    assert profiler["record_shapes"] is False and profiler["activities"] == ["CPU", "CUDA"]
    assert (profiler["experimental_config"] is not None) == profiler["cuda_sync_events"]


def test_validate_manifest_names_what_is_wrong():
    paths = _recorded()
    if not paths:
        pytest.skip("no recorded scenarios")
    good = json.loads(paths[0].read_text())
    cases = [
        (lambda d: d.pop("scenario"), "no scenario object"),
        (lambda d: d["scenario"].update(expected_cause="unknown"), "scenario.expected_cause is 'unknown'"),
        (lambda d: d["scenario"].update(cuda_sync_events=not d["scenario"]["cuda_sync_events"]), "cuda_sync_events"),
        (lambda d: d["run"].update(run_id="x"), "run.run_id 'x'"),
        (lambda d: d["scenario"].update(name="late"), "'late' is not a scenario"),
        (lambda d: d["config"].update(smem_pad=1), "unknown key 'smem_pad'"),
    ]
    for change, message in cases:
        bad = copy.deepcopy(good)
        change(bad)
        with pytest.raises(ValueError, match=message):
            sc.validate_manifest(bad, where="m.json")
