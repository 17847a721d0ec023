"""overlapviz.analysis.budget: wait segments by cause, the blocker's kernel, one SM's budget (and what-ifs), collectives across ranks."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from overlapviz.analysis import budget, explain, peers
from overlapviz.domain.devices import nvidia_arch
from overlapviz.analysis.occupancy import blocks_fit, capacity
from overlapviz.testing import write_grid_dataset


@pytest.fixture(scope="module")
def grid(tmp_path_factory):
    return write_grid_dataset(tmp_path_factory.mktemp("budget") / "ds")


def record(**kw) -> pd.DataFrame:
    base = {"run_id": "r", "rank": 0, "stream": 13, "launch_ns": 1_000, "stream_ready_ns": 1_100, "dependency_ready_ns": 1_150,
            "ready_ns": 1_150, "start_ns": 1_200, "ready_wait_ns": 50, "comm_blocks_fit_per_sm": 0}  # fmt: skip
    base.update(kw)
    frame = pd.DataFrame([base])
    for c in ("launch_ns", "stream_ready_ns", "dependency_ready_ns", "ready_ns", "ready_wait_ns", "comm_blocks_fit_per_sm"):
        frame[c] = frame[c].astype("Int64")
    return frame


def test_wait_segments_split_launch_to_start_by_cause():
    seg = budget.wait_segments(record())
    assert seg[["part", "start_ns", "end_ns"]].values.tolist() == [
        ["stream_order", 1_000, 1_100], ["dependency", 1_100, 1_150], ["sm_resources", 1_150, 1_200]]
    assert seg["us"].tolist() == [0.1, 0.05, 0.05]
    # room at ready: the last part is the launch path's latency; a dependency met before the stream was free is no part
    seg = budget.wait_segments(record(comm_blocks_fit_per_sm=2, dependency_ready_ns=1_050))
    assert seg["part"].tolist() == ["stream_order", "launch_latency"]
    # long with room: unknown; no known launch: only ready -> start
    seg = budget.wait_segments(record(comm_blocks_fit_per_sm=2, start_ns=1_150 + explain.LAUNCH_LATENCY_NS + 1,
                                      ready_wait_ns=explain.LAUNCH_LATENCY_NS + 1, launch_ns=pd.NA))  # fmt: skip
    assert seg["part"].tolist() == ["unknown"]


def test_the_segments_add_up_to_start_minus_launch(grid):
    e = explain.explain(grid)
    seg = budget.wait_segments(e)
    total = seg.groupby("record")["us"].sum()
    late = (e["start_ns"] - e["launch_ns"].astype("int64")) / 1000.0
    assert np.allclose(total.to_numpy(), late.loc[total.index].to_numpy())


def test_blocker_positions_find_the_resident_kernel(grid):
    from overlapviz.dataset import schema

    e = explain.explain(grid)
    blocked = e.loc[e["cause"] == "sm_resources"]
    assert len(blocked)
    k = schema.read_frame(grid, "kernels", run_ids=blocked["run_id"].unique().tolist())
    pos = budget.blocker_positions(blocked, k)
    assert pos.notna().all().all()
    for (_, r), (_, p) in zip(blocked.iterrows(), pos.iterrows()):
        hit = k.loc[(k["run_id"] == r["run_id"]) & (k["rank"] == r["rank"]) & (k["correlation"] == p["blocker_correlation"])].iloc[0]
        assert hit["name"] == r["blocker"] and hit["start_ns"] <= r["ready_ns"] < hit["end_ns"]
        assert p["blocker_stream"] == hit["stream"] and p["blocker_end_ns"] == hit["end_ns"]


def test_sm_budget_agrees_with_the_fit_rule():
    limits = dict(nvidia_arch(9, 0), num_sms=132)
    resident = [{"name": "gemm", "blocks": 4, "warps_per_block": 4, "regs_per_warp": 4096, "smem_alloc_bytes": 33792}]
    comm = {"warps_per_block": 16, "regs_per_warp": 3072, "smem_alloc_bytes": 1024, "smem_config_needed_bytes": 0}
    t = budget.sm_budget(limits, resident, comm, smem_config=135168).set_index("resource")
    fit, lim, _ = blocks_fit(capacity(limits), np.array([16.0]), np.array([4.0]), np.array([65536.0]), np.array([135168.0]),
                             np.array([135168.0]), np.array([16.0]), np.array([3072.0]), np.array([1024.0]), own_config=np.array([0.0]))  # fmt: skip
    assert t.attrs["fit"] == fit[0] == 0 and t.attrs["limiter"] == lim[0] == "registers"
    assert t.loc["registers", ["capacity", "used", "need"]].tolist() == [65536, 65536, 49152]
    assert t.loc["warps", "used"] == 16 and t.loc["block_slots", "used"] == 4
    assert t.loc["shared_memory", "capacity"] == 135168 and t.loc["shared_memory", "max_capacity"] == limits["shared_mem_per_sm"]
    assert t.loc["registers", "limiting"] and t.loc["registers", "overflow"] and not t.loc["warps", "overflow"]
    # an SM free of computation: the comm kernel's own occupancy
    free = budget.sm_budget(limits, [], comm).set_index("resource")
    assert free.attrs["fit"] == 1 and free["used"].eq(0).all()


def test_kernel_budget_and_what_ifs_of_a_blocked_collective(grid):
    e = explain.explain(grid)
    rec = budget.worst_record(e)
    assert rec["cause"] == "sm_resources"
    table, facts = budget.kernel_budget(grid, rec)
    assert facts["fit"] == rec["comm_blocks_fit_per_sm"] == 0 and facts["limiter"] == rec["blocking_resource"] == "registers"
    assert facts["resident"] == rec["blocker"] and facts["blocks_per_sm"] == 4
    opts = budget.what_if_options(grid, rec)
    assert {"current", "smem_pad", "carveout"} <= set(opts["lever"])
    best = opts.loc[opts["recommended"] & (opts["lever"] == "smem_pad")].iloc[0].to_dict()
    t2, f2 = budget.kernel_budget(grid, rec, what_if=best)
    assert f2["fit"] >= 1 and f2["blocks_per_sm"] == best["compute_blocks_per_sm"] and f2["what_if"] == best["setting"]


@pytest.fixture(scope="module")
def deepseek(tmp_path_factory):
    from pathlib import Path

    from overlapviz.ingest import ingest

    src = Path(__file__).parent / "data" / "kineto_real" / "deepseek_v3_train"
    return ingest([str(src)], tmp_path_factory.mktemp("deepseek") / "ds", progress=False)


@pytest.mark.slow  # every collective of the grid and of a real DeepSeek-V3 trace, cross-checked
@pytest.mark.parametrize("which", ["grid", "deepseek"])
def test_every_collective_s_sm_budget_shows_the_fit_explain_found(which, grid, deepseek):
    """The SM budget of each collective shows the SM explain's ``comm_blocks_fit_per_sm`` is of (the best SM's: a free
    one when free SMs take more, else the held SM with the most room): the same fit, and a free SM exactly when it
    says so. On DeepSeek-V3 (DeepEP) the resident kernels' C++ signatures hold ", ", and the budget once split explain's
    list of them there: it showed a free SM (1 block fits) for collectives explain found blocked (0 fit, 0 free SMs),
    and a held SM (0 fit) for one explain found 20 free SMs for (4 fit)."""
    path = {"grid": grid, "deepseek": deepseek}[which]
    e = explain.explain(path)
    known = e.loc[e["comm_blocks_fit_per_sm"].notna()]
    assert len(known) >= 6
    seen, checked = set(), set()
    for rec in known.to_dict("records"):
        table, facts = budget.kernel_budget(path, rec)
        assert facts["fit"] == rec["comm_blocks_fit_per_sm"], (rec["name"][:60], rec["start_ns"], facts)
        on_free = facts["resident"] is None
        if rec["free_sms"] == 0:
            assert not on_free, (rec["name"][:60], rec["start_ns"])
        if rec["cause"] == "sm_resources":
            assert facts["resident"] == rec["blocker"] and facts["limiter"] == rec["blocking_resource"]
        seen.add((on_free, rec["cause"] == "sm_resources"))
        # the what-ifs are of the kernel on the SM shown, each option's budget shows the fit it promises
        opts = budget.what_if_options(path, rec)
        assert len(opts) > 0 or facts["resident"] is None or facts["blocks_per_sm"] == 0
        if len(opts) and len(seen) > len(checked):
            checked.add(len(seen))
            for opt in opts.to_dict("records"):
                assert budget.kernel_budget(path, rec, what_if=opt)[1]["fit"] == opt["comm_blocks_fit_per_sm"], opt
    assert (False, True) in seen  # a blocked collective and its blocker
    assert which == "grid" or (True, False) in seen  # a collective shown on a free SM


def _instances_by_loop(e, sizes):
    """The instance table computed one instance at a time, in plain Python integers (the reference)."""
    rows = {}
    for i, r in enumerate(e.itertuples(index=False)):
        x = rows.setdefault((r.run_id, r.instance), {"ready": [], "start": [], "end": [], "ranks": set(), "bytes": []})
        if not pd.isna(r.ready_ns):
            x["ready"].append((int(r.ready_ns), int(r.rank)))
        x["start"].append(int(r.start_ns)), x["end"].append(int(r.end_ns)), x["ranks"].add(int(r.rank))
        x["bytes"].append(int(sizes.iloc[i]))
    out = []
    for (run_id, inst), x in rows.items():
        last = max(t for t, _ in x["ready"])
        out.append({"run_id": run_id, "instance": inst, "n_ranks": len(x["ranks"]), "first_ready_ns": min(t for t, _ in x["ready"]),
                    "last_ready_ns": last, "slowest_rank": next(k for t, k in x["ready"] if t == last),
                    "last_start_ns": max(x["start"]), "last_end_ns": max(x["end"]), "bytes": max(x["bytes"])})  # fmt: skip
    return pd.DataFrame(out)


def test_collective_instances_are_exact_per_instance(grid):
    from overlapviz.dataset import schema

    e = explain.explain(grid)
    sizes = budget.message_bytes(e, schema.read_frame(grid, "runs"))
    assert (sizes == 64 << 20).all()
    fast, slow = peers.collective_instances(e, sizes), _instances_by_loop(e, sizes)
    assert len(fast) == len(slow) and fast["instance"].tolist() == slow["instance"].tolist()
    for c in slow.columns:
        assert fast[c].astype(object).tolist() == slow[c].astype(object).tolist(), c
    # epoch-scale ns stay exact (float64 would round these to 256 ns)
    base = 1_700_000_000_123_456_789
    shifted = e.assign(ready_ns=e["ready_ns"] + base, start_ns=e["start_ns"] + base, end_ns=e["end_ns"] + base)
    moved = peers.collective_instances(shifted, sizes)
    assert (moved["first_ready_ns"] - base).tolist() == fast["first_ready_ns"].tolist()
    assert moved["arrival_skew_us"].tolist() == fast["arrival_skew_us"].tolist()
    cells = budget.instance_ranks(e, fast)
    assert len(cells) == len(e) and cells.groupby("instance")["arrival_us"].min().eq(0).all()
    assert (cells.loc[cells["slowest"], "arrival_us"] >= 0).all()
    assert cells.groupby("run_id")["ordinal"].max().eq(5).all()  # six instances per run


def test_blocker_table_sums_the_blocked_time(grid):
    e = explain.explain(grid)
    t = budget.blocker_table(e)
    blocked = e.loc[e["cause"] == "sm_resources"]
    assert t["n_blocked"].sum() == len(blocked)
    assert t["blocked_us"].sum() == pytest.approx(blocked["start_minus_launch_ns"].astype(float).sum() / 1000.0)


def test_start_delay_table_says_which_collectives_its_median_is_over():
    """The median over the collectives ready at their launch, else over all (the sweep report's column); which of the two
    ``n_ready_at_launch`` tells (Compare showed the fallback under the name of the first, and a delta between them)."""
    e = pd.DataFrame({"run_id": ["a", "a", "a", "b", "b"], "start_delay_us": [1.0, 5.0, 9.0, 2.0, 4.0],
                      "ready_from": ["launch", "stream", "launch", "stream", "dependency"]})  # fmt: skip
    t = budget.start_delay_table(e).set_index("run_id")
    assert t.loc["a", "median_start_delay_at_launch_us"] == 5.0 and t.loc["a", "n_at_launch"] == 2 and t.loc["a", "n_ready_at_launch"] == 2
    assert t.loc["a", "median_start_delay_us"] == 5.0 and t.loc["a", "n_comm_kernels"] == 3
    assert t.loc["b", "median_start_delay_at_launch_us"] == 3.0 and t.loc["b", "n_at_launch"] == 2 and t.loc["b", "n_ready_at_launch"] == 0
