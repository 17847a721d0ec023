"""Ingest, analysis, explain and timeline windows on a Dask cluster, with results identical to the local path.

``client_for(address)`` connects (``tcp://host:8786``, a scheduler file) or starts a
``LocalCluster`` (``local``, ``local:N``) and yields a ``distributed.Client``; the ``*_on``
functions take it. What runs where:

* ``ingest_on``: the client discovers the runs (as ``overlapviz ingest``); each trace file
  is one task that reads it, classifies it and writes its ranks' kernels files into the
  dataset's temporary directory on the shared file system (``driver.ingest_file``), staged
  per attempt and renamed into place, so a retried task (its worker died) never leaves a
  torn file. The small per-rank parts come back to the client, which adds them in file
  order and commits the dataset atomically (``schema.DatasetWriter``), as the local path does.
* ``analyze_on``: one task per batch of kernels files computes ``metrics.overlap_table``
  (every group is one run x rank, so batches never split a group); the client concatenates
  and sorts. ``explain_on``: one task per batch explains its ranks
  (``explain.explain_rank``) and keeps the records; matching a collective across ranks
  needs every rank of its group, so each batch's instance table (latest start, rank count)
  is reduced over the batches as a tree, then each batch adds the peer wait
  (``peers.attach_peer_wait``'s arithmetic); the client receives the records or, with
  ``summary``, one row per rank. ``breakdown_on``: the client reads the communication rows
  (each instance's arrivals need every rank), each task labels its ranks' time
  (``breakdown.timeline_of``, ``group_rows``); the findings are computed on the client.
* ``residency_on``: one task per batch computes ``residency.rank_shapes`` of its ranks (residency
  depends only on a rank's own kernels and limits); the merge over a run's ranks is reduced over
  the batches as a tree on the workers; the client gets one row per merged launch shape.
* ``timeline_counts_on`` / ``timeline_window_on``: per-rank raster counts summed on the
  client (zoomed out), or the kernels of a time window read from each rank's file (zoomed in).

The seam: a task calls the public functions the local path calls (named above: ``driver.ingest_file``,
``add_parts`` and ``add_run``; ``explain.explain_rank``; ``breakdown.timeline_of``; ``metrics.overlap_table``;
``residency.rank_shapes``), never a private one (tests/test_layers.py checks it). The modules: ``cluster``
(addresses, the client, tasks in order: ``gather_in_order``), ``ingest``, ``partitions`` (kernels files in
batches: ``plan_batches``), ``analysis`` (analyze, explain, breakdown), ``residency``, ``timeline``.
Dask is an optional extra (``pip install 'overlapviz[dask]'``): importing this package
needs none of it (``client_for`` names the extra when it is missing), and the local path
never imports it. docs/dask.md is the user's page.
"""

from __future__ import annotations

from overlapviz.distributed.analysis import analyze_on, breakdown_on, explain_on
from overlapviz.distributed.cluster import EXTRA, SCHEDULER_ENV, SCHEDULER_HELP, client_for, require_dask
from overlapviz.distributed.ingest import ingest_on
from overlapviz.distributed.residency import residency_on
from overlapviz.distributed.timeline import KINDS, timeline_counts_on, timeline_window_on

__all__ = ["EXTRA", "KINDS", "SCHEDULER_ENV", "SCHEDULER_HELP", "analyze_on", "breakdown_on", "client_for", "explain_on",
           "ingest_on",
           "require_dask", "residency_on", "timeline_counts_on", "timeline_window_on"]  # fmt: skip
