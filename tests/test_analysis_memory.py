"""What the analyses keep of every rank while they read the next (issue 36 item 2): the cross-rank steps hold a few
values per communication kernel, never its whole record, and answer as the whole records did."""

from __future__ import annotations

import random

import numpy as np
import pandas as pd
import pytest

from overlapviz.analysis import breakdown, clocks, explain, findings
from overlapviz.testing import kernel_row, write_rows_dataset


@pytest.fixture(scope="module")
def skewed(tmp_path_factory):
    """Six ranks running one schedule of collectives (seq-numbered, positional and unnamed; some instances two
    kernels on a rank) with per-rank skews, so that instances match and stragglers wait, beside computation."""
    rng = random.Random(5)
    colls = [("all_reduce", "g0"), ("all_gather", "g1"), (None, None), ("reduce_scatter", None)]
    sched, seqs = [], {}
    for i in range(150):
        coll, grp = rng.choice(colls)
        seqs[(coll, grp)] = seqs.get((coll, grp), 0) + 1
        sched.append((i, coll, grp, seqs[(coll, grp)], rng.random() < 0.2))
    rows = []
    for r in range(6):
        for i, coll, grp, seq, two in sched:
            start = i * 100_000 + rng.choice([0, 0, 5, 100, 2_000, 30_000])
            end = max(i * 100_000 + 50_000 + rng.choice([0, 3, 10]), start + 1_000)
            extra = {"collective": coll} if coll else {}
            if grp:
                extra.update(comm_group=grp, comm_seq=seq)
            for k in range(2 if two else 1):
                rows.append(kernel_row(f"ncclKernel_{coll or 'Send'}", "comm", 20 + k, start + 7 * k, end - 3 * k,
                                       launch=start - rng.randint(0, 20_000), rank=r, **extra))  # fmt: skip
            s = i * 100_000 + rng.randint(0, 90_000)
            rows.append(kernel_row(rng.choice(["gemm", "gelu"]), "compute", 7, s, s + rng.randint(1_000, 60_000),
                                   launch=s - rng.randint(0, 30_000), rank=r))  # fmt: skip
    return write_rows_dataset(tmp_path_factory.mktemp("memory") / "ds", rows, ranks=range(6), run_id="skewed")


def test_arrivals_read_rank_by_rank_are_the_arrivals(skewed):
    """``arrivals_of`` (each rank reduced to its instances as it is read) gives ``arrivals`` of every rank's comm rows:
    the same rows, order, values and dtypes."""
    comm = breakdown.comm_arrivals(skewed)
    want = breakdown.arrivals(comm, clocks.clock_domains(skewed))
    got = breakdown.arrivals_of(skewed)
    assert len(want) > 500 and want["straggler"].nunique() > 2 and (want["wait_ns"] > 0).any(), "instances to compare"
    pd.testing.assert_frame_equal(got, want)


def test_findings_keep_the_delay_columns_of_the_delayed_records(skewed, monkeypatch):
    """The findings' one pass keeps of each rank's records the columns the start-delay findings read, of the records
    with a wait, with no peer matching; and finds what the whole records find."""
    kept = []
    real = findings._found

    def spy(dataset_path, digests, explained, arrivals, device):
        kept.append(explained)
        return real(dataset_path, digests, explained, arrivals, device)

    monkeypatch.setattr(findings, "_found", spy)
    found, totals = findings.answer(skewed)
    (explained,) = kept
    assert set(explained.columns) <= set(findings.DELAY_READS), set(explained.columns) - set(findings.DELAY_READS)
    assert "instance" not in explained and len(explained)
    whole = explain.explain(skewed)
    waits = np.zeros(len(whole), bool)
    for part in ("sm_resources",) + tuple(findings._CAUSE_TEXT):
        lo, hi = explain.part_waits(whole, part)
        waits |= (lo >= 0) & (hi > lo)
    assert len(explained) == int(waits.sum())
    monkeypatch.setattr(findings, "_found", real)
    from_whole = findings.answer(skewed, explained=whole)
    assert found["kind"].tolist() == from_whole[0]["kind"].tolist() and "straggler" in set(found["kind"])
    pd.testing.assert_frame_equal(found, from_whole[0])
    pd.testing.assert_frame_equal(totals, from_whole[1])


def test_explain_without_peers_is_explain_less_the_peer_columns(skewed):
    """``peers_matched=False`` gives the same records less ``instance``, ``peer_wait_us``, ``clock_domain``."""
    whole = explain.explain(skewed)
    bare = explain.explain(skewed, peers_matched=False)
    pd.testing.assert_frame_equal(bare, whole.drop(columns=["instance", "peer_wait_us", "clock_domain"]))
