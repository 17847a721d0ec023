"""Ranks whose clocks do not compare: detected at ingest and aligned on collective completion
(issue 32, item 5; overlapviz.ingest.align, docs/ingest.md "Ranks on several hosts: clocks").

No multi-node trace set is at hand, so the layouts are made here from real traces, honestly
labelled: the FastVideo Nsight Systems export (two H100 ranks on one host, tests/data/nsys)
split into one export per rank, relabelled as two hosts, the second one's times moved to the
epoch (as a node's own export can count them); and PARAM's 8-rank DLRM Kineto traces with the
traces of ranks 4-7 moved 2.5 s ahead (a second host whose clock is off, no host named). Every
expected offset is computed from the raw files (SQL, JSON), never through overlapviz.
"""

from __future__ import annotations

import gzip
import json
import shutil
import sqlite3
from decimal import Decimal
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from overlapviz.dataset import schema
from overlapviz.analysis import clocks
from overlapviz.cli import main as cli
from overlapviz.ingest import ingest

DATA = Path(__file__).parent / "data"
NSYS = DATA / "nsys" / "mfu_2gpu_before_window40ms.sqlite"
DLRM = DATA / "kineto_real" / "param_dlrm_8rank"
EPOCH_NS = 1779782330176752435  # the export's own TARGET_INFO_SESSION_START_TIME.utcEpochNs
PIDS = (144, 145)  # rank 0, rank 1 (device 0 / device 1)

# tables whose rows carry a process and times (start/end), as nsys exports them
_TIMED = {"CUPTI_ACTIVITY_KIND_KERNEL": "globalPid", "CUPTI_ACTIVITY_KIND_MEMCPY": "globalPid",
          "CUPTI_ACTIVITY_KIND_MEMSET": "globalPid", "CUPTI_ACTIVITY_KIND_RUNTIME": "globalTid",
          "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION": "globalPid", "CUPTI_ACTIVITY_KIND_CUDA_EVENT": "globalPid",
          "NVTX_EVENTS": "globalTid"}  # fmt: skip


def _node_export(out: Path, pid: int, host: str, offset_ns: int) -> None:
    """``out``: the FastVideo export with only process ``pid``'s rows, ``Hostname`` = ``host`` and
    every start/end moved by ``offset_ns``."""
    shutil.copyfile(NSYS, out)
    with sqlite3.connect(out) as db:
        tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        for table, col in _TIMED.items():
            if table not in tables:
                continue
            db.execute(f"DELETE FROM {table} WHERE ({col} >> 24) & 16777215 != ?", (pid,))
            cols = {r[1] for r in db.execute(f"PRAGMA table_info({table})")}
            for c in ("start", "end"):
                if c in cols:
                    db.execute(f'UPDATE {table} SET "{c}" = "{c}" + ? WHERE "{c}" IS NOT NULL', (offset_ns,))
        db.execute("UPDATE TARGET_INFO_SYSTEM_ENV SET value = ? WHERE name = 'Hostname'", (host,))


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("two_nodes") / "fastvideo_2nodes"
    run.mkdir()
    _node_export(run / "node0.sqlite", PIDS[0], "node-a", 0)
    _node_export(run / "node1.sqlite", PIDS[1], "node-b", EPOCH_NS)
    return run


def _nccl(pid: int) -> list[tuple[int, int]]:
    """(start, end) of process ``pid``'s NCCL kernels in the original export, in start order."""
    with sqlite3.connect(f"file:{NSYS}?mode=ro", uri=True) as db:
        return db.execute("SELECT K.start, K.\"end\" FROM CUPTI_ACTIVITY_KIND_KERNEL K JOIN StringIds S ON S.id = K.shortName "
                          "WHERE S.value LIKE 'ncclDevKernel%' AND (K.globalPid >> 24) & 16777215 = ? ORDER BY K.start",
                          (pid,)).fetchall()  # fmt: skip


def _lower_median(values) -> int:
    v = sorted(values)
    return v[(len(v) - 1) // 2]


def test_two_hosts_are_aligned_on_collective_completion(two_nodes, tmp_path):
    """5 SendRecv instances, matched by position: rank 1's offset is −EPOCH_NS plus the lower median
    of (rank 0's end − rank 1's end) in the original export, 22,345 ns (send/recv ends differ by rank)."""
    a, b = _nccl(PIDS[0]), _nccl(PIDS[1])
    assert len(a) == len(b) == 5
    m = _lower_median([ea - eb for (_, ea), (_, eb) in zip(a, b)])
    assert m == 22_345
    result = CliRunner().invoke(cli, ["ingest", str(two_nodes), "-o", str(tmp_path / "ds")])
    assert result.exit_code == 0, result.output
    assert f"rank 1 {-EPOCH_NS + m:+,} ns" in result.output and "ranks on 2 hosts (node-a, node-b)" in result.output
    ranks = schema.read_frame(tmp_path / "ds", "ranks").set_index("rank")
    assert ranks["clock_domain"].tolist() == ["aligned:rank0", "aligned:rank0"]
    assert ranks["clock_offset_ns"].tolist() == [0, -EPOCH_NS + m]
    assert "from 5 matched instances" in ranks.loc[1, "clock_note"]
    # every time of rank 1 is its original time + m: kernels, launches, syncs
    k = schema.read_frame(tmp_path / "ds", "kernels")
    comm = k[(k["rank"] == 1) & (k["kind"] == "comm")].sort_values("start_ns")
    assert comm["start_ns"].tolist() == [s + m for s, _ in b] and comm["end_ns"].tolist() == [e + m for _, e in b]
    with sqlite3.connect(f"file:{NSYS}?mode=ro", uri=True) as db:
        calls = dict(db.execute("SELECT correlationId, start FROM CUPTI_ACTIVITY_KIND_RUNTIME "
                                "WHERE (globalTid >> 24) & 16777215 = ?", (PIDS[1],)).fetchall())  # fmt: skip
    launched = k[(k["rank"] == 1) & k["launch_ns"].notna()]
    assert len(launched) > 300 and all(int(r.launch_ns) == calls[int(r.correlation)] + m for r in launched.itertuples())
    assert schema.read_frame(tmp_path / "ds", "syncs").query("rank == 1")["start_ns"].min() < 10**12  # not epoch ns
    # explain --instances: the skews of one clock, never 1.78e15 µs
    out = CliRunner().invoke(cli, ["explain", str(tmp_path / "ds"), "--instances", "--format", "json"])
    assert out.exit_code == 0, out.output
    skews = [r["arrival_skew_us"] for r in json.loads(out.output)]
    assert len(skews) == 5 and max(skews) < 1000
    assert clocks.domain_notes(clocks.clock_domains(tmp_path / "ds")) == {}


def test_two_hosts_not_aligned_keep_distinct_clocks(two_nodes, tmp_path):
    """--align-clocks none: nothing moves, and the two hosts are two clock domains with the reason."""
    result = CliRunner().invoke(cli, ["ingest", str(two_nodes), "-o", str(tmp_path / "ds"), "--align-clocks", "none"])
    assert result.exit_code == 0, result.output
    assert "not aligned (--align-clocks none)" in result.output
    ranks = schema.read_frame(tmp_path / "ds", "ranks").set_index("rank")
    assert ranks["clock_domain"].tolist() == ["host:node-a", "host:node-b"] and ranks["clock_offset_ns"].isna().all()
    k = schema.read_frame(tmp_path / "ds", "kernels")
    assert k.loc[k["rank"] == 1, "start_ns"].min() > EPOCH_NS
    domains = clocks.clock_domains(tmp_path / "ds")
    assert domains["clock_domain"].nunique() == 2 and domains["clock_note"].str.contains("--align-clocks none").all()
    assert "peer waits and arrival skews across them are not computed" in clocks.domain_notes(domains)["fastvideo_2nodes"]


def test_two_hosts_without_a_matched_collective_stay_apart(two_nodes, tmp_path):
    """Where no collective instance matches (here the NCCL kernels are ruled 'other'), no offset is
    made up: the two hosts stay two clock domains and the note says why."""
    result = CliRunner().invoke(cli, ["ingest", str(two_nodes), "-o", str(tmp_path / "ds"), "--rule", "other=^ncclDevKernel"])
    assert result.exit_code == 0, result.output
    ranks = schema.read_frame(tmp_path / "ds", "ranks").set_index("rank")
    assert ranks.loc[0, "clock_domain"] == "aligned:rank0" and ranks.loc[1, "clock_domain"] == "host:node-b"
    assert ranks.loc[1, "clock_offset_ns"] is None or str(ranks.loc[1, "clock_offset_ns"]) == "<NA>"
    assert "no collective instance matched" in ranks.loc[1, "clock_note"]
    assert clocks.clock_domains(tmp_path / "ds")["clock_domain"].nunique() == 2


def test_one_host_is_left_as_it_is(tmp_path):
    """The same export as one file (one host, one clock): nothing aligned, nothing said."""
    result = CliRunner().invoke(cli, ["ingest", str(NSYS), "-o", str(tmp_path / "ds")])
    assert result.exit_code == 0, result.output
    assert "clock" not in result.output
    ranks = schema.read_frame(tmp_path / "ds", "ranks")
    assert ranks["clock_domain"].tolist() == ["host:modal", "host:modal"] and ranks["clock_offset_ns"].isna().all()
    assert ranks["clock_note"].isna().all()
    # --align-clocks collectives: the two ranks of one named host still share its clock
    ds = ingest([NSYS], tmp_path / "forced", progress=False, align_clocks="collectives")
    assert schema.read_frame(ds, "ranks")["clock_offset_ns"].tolist() == [0, 0]
    k = schema.read_frame(ds, "kernels")
    assert k["start_ns"].tolist() == schema.read_frame(tmp_path / "ds", "kernels")["start_ns"].tolist()


def _dlrm_ends(src: Path, shift_us: int = 0) -> dict[int, list[int]]:
    """Per rank, the end ns of its NCCL kernels in start order, from the raw JSON."""
    out = {}
    for f in sorted(src.glob("*.json*")):
        doc = json.loads(gzip.decompress(f.read_bytes()) if f.suffix == ".gz" else f.read_bytes(), parse_float=Decimal)
        rank = doc["distributedInfo"]["rank"]
        nccl = sorted((Decimal(e["ts"]), Decimal(e["ts"]) + Decimal(e["dur"])) for e in doc["traceEvents"]
                      if e.get("cat") == "kernel" and e["name"].startswith("ncclKernel"))  # fmt: skip
        out[rank] = [int(end * 1000) for _, end in nccl]
    return out


def test_a_rank_group_on_a_clock_that_is_off_is_found_by_its_collectives(tmp_path):
    """DLRM, 8 V100 ranks, no host named: the traces of ranks 4-7 moved 2.5 s ahead. Their all-reduce
    and all-to-all instances end 2.5 s from rank 0's though they last under 10 ms: detected, and
    each is aligned by the lower median of the end differences to ranks 0-3 (which share rank 0's clock)."""
    src = tmp_path / "dlrm_two_clocks"
    src.mkdir()
    for f in sorted(DLRM.glob("*.json.gz")):
        doc = json.loads(gzip.decompress(f.read_bytes()), parse_float=Decimal)
        if doc["distributedInfo"]["rank"] >= 4:
            for e in doc["traceEvents"]:
                if "ts" in e:
                    e["ts"] = e["ts"] + 2_500_000
        (src / f.name.removesuffix(".gz")).write_text(json.dumps(doc, default=str))
    ends = _dlrm_ends(DLRM)
    want = {}
    for r in range(4, 8):  # the reference ranks' (0-3, one clock) lower-median end minus this rank's, per instance
        diffs = [_lower_median([ends[q][i] for q in range(4)]) - (ends[r][i] + 2_500_000_000) for i in range(len(ends[r]))]
        want[r] = _lower_median(diffs)
    assert all(abs(v + 2_500_000_000) <= 1000 for v in want.values())
    result = CliRunner().invoke(cli, ["ingest", str(src), "-o", str(tmp_path / "ds")])
    assert result.exit_code == 0, result.output
    assert "ranks 4, 5, 6, 7 end further from the others' than they lasted" in result.output
    ranks = schema.read_frame(tmp_path / "ds", "ranks").set_index("rank")
    assert ranks["clock_offset_ns"].tolist() == [0, 0, 0, 0] + [want[r] for r in range(4, 8)]
    assert (ranks["clock_domain"] == "aligned:rank0").all()
    # the instances' skews are those of the traces as recorded, to the µs the alignment is good to
    base = ingest([DLRM], tmp_path / "base", progress=False)
    assert schema.read_frame(base, "ranks")["clock_note"].isna().all()  # one clock: left as it is
    skew = {}
    for name, ds in (("base", base), ("aligned", tmp_path / "ds")):
        out = CliRunner().invoke(cli, ["explain", str(ds), "--instances", "--format", "json"])
        assert out.exit_code == 0, out.output
        skew[name] = {r["instance"]: r["arrival_skew_us"] for r in json.loads(out.output)}
    assert skew["aligned"].keys() == skew["base"].keys() and len(skew["base"]) == 8
    assert np.allclose([skew["aligned"][i] for i in skew["base"]], list(skew["base"].values()), atol=1.0)


def test_collectives_aligns_each_rank_of_unknown_host(tmp_path):
    """--align-clocks collectives on the DLRM traces as recorded (one host, none named): each rank
    gets the lower median of (rank 0's end − its end) over the 8 instances, a few µs at most."""
    ends = _dlrm_ends(DLRM)
    want = [_lower_median([e0 - e for e0, e in zip(ends[0], ends[r])]) for r in range(8)]
    assert want[0] == 0 and max(map(abs, want)) <= 2000
    ds = ingest([DLRM], tmp_path / "ds", progress=False, align_clocks="collectives")
    ranks = schema.read_frame(ds, "ranks").set_index("rank")
    assert ranks["clock_offset_ns"].tolist() == want
    assert ranks["clock_note"].str.contains("aligned as asked").all()
