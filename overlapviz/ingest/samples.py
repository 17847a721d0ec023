"""The bundled sample traces (``overlapviz.sample_traces``), ingested once into a cache keyed by their content."""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path

from overlapviz.dataset.cache import cache_dir, cached_path, content_key, is_dataset  # noqa: F401 (this module's API)

TRACE_SUFFIXES = (".json", ".json.gz", ".csv")


def sample_root() -> Path:
    """The installed ``sample_traces`` folder."""
    return Path(str(resources.files("overlapviz.sample_traces")))


def sample_sources(root: str | os.PathLike | None = None) -> list[Path]:
    """The sweep and run directories under ``root`` (the bundled samples by default), sorted.

    A source is each top-level directory that holds at least one trace or manifest file;
    ``overlapviz.ingest.ingest`` accepts sweeps, collected runs and per-rank directories.
    """
    root = sample_root() if root is None else Path(root)
    out = []
    for child in sorted(root.iterdir()) if root.is_dir() else []:
        if child.is_dir() and not child.name.startswith(("_", ".")):
            if any(p.is_file() and p.name.endswith(TRACE_SUFFIXES) for p in child.rglob("*")):
                out.append(child)
    return out


def sample_dataset(*, root: str | os.PathLike | None = None, cache: str | os.PathLike | None = None,
                   progress: bool | None = False) -> Path:  # fmt: skip
    """The dataset of the bundled sample traces, ingesting them on first use.

    Parameters
    ----------
    root
        Folder of sample traces (the bundled ``overlapviz.sample_traces`` by default).
    cache
        Where datasets are kept (``cache_dir()`` by default); the dataset is
        ``<cache>/samples-<content hash>``, so changed samples are ingested anew.

    Raises
    ------
    ValueError
        If there are no sample traces, or ingest rejects them.
    """
    sources = sample_sources(root)
    if not sources:
        where = sample_root() if root is None else root
        raise ValueError(f"{where}: no sample traces are bundled; give a dataset (overlapviz ingest TRACE... -o DATASET)")
    return cached_dataset(sources, cache=cache, prefix="samples", progress=progress)


def cached_dataset(sources: list[Path], *, cache: str | os.PathLike | None = None, prefix: str = "traces",
                   progress: bool | None = False, hold: bool = False) -> Path:  # fmt: skip
    """The dataset of raw trace ``sources``, ingested once into ``<cache>/<prefix>-<content hash>``.

    The key hashes every byte of the sources (and the writer's versions): changed traces are
    ingested anew, unchanged ones are read from the cache. Concurrent callers are safe (ingest
    builds beside the target and moves it into place). ``hold``: a dataset ingested now comes back
    as a ``schema.HeldDataset`` (``driver.ingest_held``), whose tables are read from memory.

    Raises
    ------
    ValueError
        What ingest raises: one line naming the file and the problem.
    """
    out = cached_path(sources, cache=cache, prefix=prefix)
    if is_dataset(out):
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    from overlapviz.ingest import driver

    try:
        if hold:
            return driver.ingest_held([str(s) for s in sources], out, progress=progress)
        return Path(driver.ingest([str(s) for s in sources], out, progress=progress))
    except ValueError:
        if is_dataset(out):  # another process ingested the same traces meanwhile
            return out
        raise
