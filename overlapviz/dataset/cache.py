"""Where the dataset of raw traces is kept: the cache folder and the content key, without importing ingest."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from overlapviz._version import __version__
from overlapviz.dataset.outdir import METADATA_FILE, SCHEMA_VERSION  # not schema: no pyarrow on a warm path


def content_key(sources: list[Path]) -> str:
    """A hash of every file under ``sources`` (relative path, bytes) and of the writer's versions."""
    digest = hashlib.sha256(f"overlapviz {__version__} schema {SCHEMA_VERSION}\n".encode())
    for source in sources:
        files = [source] if source.is_file() else sorted(p for p in source.rglob("*") if p.is_file())
        for path in files:
            digest.update(f"{source.name}/{path.relative_to(source) if path != source else ''}\n".encode())
            with open(path, "rb") as fh:
                for chunk in iter(lambda: fh.read(1 << 20), b""):
                    digest.update(chunk)
    return digest.hexdigest()[:16]


def cache_dir() -> Path:
    """``$OVERLAPVIZ_CACHE_DIR``, else ``$XDG_CACHE_HOME/overlapviz``, else ``~/.cache/overlapviz``."""
    if os.environ.get("OVERLAPVIZ_CACHE_DIR"):
        return Path(os.environ["OVERLAPVIZ_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "overlapviz"


def is_dataset(path: str | os.PathLike) -> bool:
    """Whether ``path`` is an overlapviz dataset directory (it has ``dataset.json``)."""
    return (Path(path) / METADATA_FILE).is_file()


def cached_path(sources: list[Path], *, cache: str | os.PathLike | None = None, prefix: str = "traces") -> Path:
    """``<cache>/<prefix>-<content hash>``: where the dataset of ``sources`` is, or goes (``samples.cached_dataset``)."""
    return Path(cache or cache_dir()) / f"{prefix}-{content_key([Path(s) for s in sources])}"
