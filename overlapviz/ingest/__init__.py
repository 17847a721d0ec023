"""Ingest raw traces (Chrome/Kineto JSON, rocprof) into the canonical Parquet dataset.

``ingest`` finds the runs in its sources, reads each trace file (one at a time per process,
this one and a bounded pool of workers), classifies, assigns steps and writes one Parquet
file per run x rank there, into the temporary directory of a ``schema.DatasetWriter``, which
moves the dataset into place only when everything succeeded.

The modules, in the order data flows: ``registry`` (the readers and which one reads a file),
``discover`` (sources -> runs), the readers (``chrome``, ``rocprof``; ``base`` is their
interface, ``files`` reads file heads), ``classify`` (kinds by the run's rules, steps,
collectives), ``pool`` (files read at once, in order) and ``driver`` (``ingest``). How
sources become runs is told in ``discover``.
"""

from __future__ import annotations

from overlapviz.ingest.classify import assign_steps
from overlapviz.ingest.discover import RunSource, discover
from overlapviz.ingest.driver import ingest
from overlapviz.ingest.registry import registered_readers, detect, readers

__all__ = ["ingest", "readers", "detect", "discover", "assign_steps", "RunSource"]

# The readers (their sniffing and the Kineto reader; rocprof's pandas parsers stay lazy) are
# what every ingest needs first: imported with the package, not by the first call.
registered_readers()
