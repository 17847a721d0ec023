"""Which ranks' clocks can be compared (DESIGN.md, "Clocks"): the one place that decides whether a peer wait or an arrival skew across ranks is a number.

Ranks on one host share its clock. Ranks on different hosts are comparable only where
the dataset says so: the ranks table's ``clock_domain`` (ranks of one run with the same
domain share a clock, after the alignment ingest recorded in ``clock_offset_ns``; see
``overlapviz.ingest.align``), else their ``host``. A rank whose host is unknown is taken to
share the clock of the run's other ranks of unknown host (single-host traces rarely name
the host).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["clock_domains", "domain_notes", "domain_map", "domain_of"]


def domain_of(clock_domain, host) -> str:
    """A rank's clock domain: the ranks table's ``clock_domain`` where it has one, else ``host:HOST`` (``host:``
    where the host is unknown too)."""
    if isinstance(clock_domain, str):
        return clock_domain
    return f"host:{host if isinstance(host, str) else ''}"


def domain_map(dataset_path: str | os.PathLike) -> dict[tuple[str, int], str]:
    """``{(run_id, rank): clock domain}`` of every rank of the dataset (:func:`clock_domains`' ``clock_domain``),
    read without pandas."""
    from overlapviz.dataset import schema

    ranks = schema.read_table(dataset_path, "ranks")
    column = {c: ranks.column(c).to_pylist() if c in ranks.column_names else [None] * ranks.num_rows
              for c in ("run_id", "rank", "clock_domain", "host")}  # fmt: skip
    return {(r, int(k)): domain_of(d, h) for r, k, d, h in zip(column["run_id"], column["rank"], column["clock_domain"], column["host"])}


def clock_domains(dataset_path: str | os.PathLike, run_ids=None) -> pd.DataFrame:
    """One row per run x rank: ``run_id, rank, clock_domain`` (a string; equal strings within a
    run mean comparable clocks) and ``clock_note`` (why this rank's clock is kept apart, or None).
    """
    from overlapviz.dataset import schema

    ranks = schema.read_frame(dataset_path, "ranks")
    if run_ids is not None:
        ranks = ranks.loc[ranks["run_id"].isin(list(run_ids))]
    return domains_of(ranks)


def domains_of(ranks: pd.DataFrame) -> pd.DataFrame:
    """:func:`clock_domains` of a ranks table already read (not modified)."""
    import pandas as pd

    cols = ["run_id", "rank", "clock_domain", "clock_note"]
    if not len(ranks):
        return pd.DataFrame(columns=cols)
    if "clock_domain" in ranks and ranks["clock_domain"].notna().any():
        domain = ranks["clock_domain"].astype(object)
    else:
        domain = pd.Series(None, index=ranks.index, dtype=object)
    host = ranks["host"].astype(object) if "host" in ranks else pd.Series(None, index=ranks.index, dtype=object)
    domain = pd.Series([domain_of(d, h) for d, h in zip(domain.tolist(), host.tolist())], index=ranks.index, dtype=object)
    n_domains = domain.groupby(ranks["run_id"].to_numpy()).transform("nunique")
    note = pd.Series(None, index=ranks.index, dtype=object)
    split = (n_domains > 1).to_numpy(bool)
    note[split] = ("clocks of " + domain[split].str.replace("host:", "host ", regex=False)
                   + " not comparable with the run's other ranks (no shared clock or alignment recorded)")  # fmt: skip
    if "clock_note" in ranks:  # ingest's own words (overlapviz.ingest.align) where it recorded why
        said = ranks["clock_note"].astype(object)
        use = split & said.notna().to_numpy(bool)
        note[use] = said[use]
    return pd.DataFrame({"run_id": ranks["run_id"].to_numpy(object), "rank": ranks["rank"].astype("int64").to_numpy(),
                         "clock_domain": domain.to_numpy(object), "clock_note": note.to_numpy(object)})[cols]  # fmt: skip


def domain_notes(domains: pd.DataFrame) -> dict[str, str]:
    """Per run whose ranks span several clock domains, one sentence saying so (for notices)."""
    out = {}
    for run_id, d in domains.groupby("run_id", sort=True):
        n = d["clock_domain"].nunique()
        if n > 1:
            out[run_id] = (f"{run_id}: ranks on {n} clocks that are not comparable (different hosts, no alignment): "
                           "peer waits and arrival skews across them are not computed")  # fmt: skip
    return out
