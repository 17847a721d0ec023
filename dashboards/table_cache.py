"""The table cache: what a dashboard server computed for a dataset (tables, figures, Perfetto traces), kept on disk
for the next server process, under the overlapviz cache, private to this account."""

from __future__ import annotations

import functools
import hashlib
import os
import pickle
import stat
from pathlib import Path

TABLE_CACHE_ENV = "OVERLAPVIZ_TABLE_CACHE"  # "0": keep the computed tables in memory only


@functools.cache
def code_stamp() -> str:
    """Sizes and times of the modules that compute the tables: a changed analysis means new tables on disk."""
    import overlapviz

    root = Path(overlapviz.__file__).parent
    files = sorted([*root.glob("analysis/*.py"), root / "schema.py", root / "rules.py"])
    return ";".join(f"{f.name}:{f.stat().st_size}:{f.stat().st_mtime_ns}" for f in files if f.exists())


def disk_dir(path: str, stamp: str) -> Path | None:
    """Where a dataset's computed tables are kept between server processes: the overlapviz cache
    (``$OVERLAPVIZ_CACHE_DIR``, else ``$XDG_CACHE_HOME/overlapviz``, else ``~/.cache/overlapviz``) under
    ``tables/<hash of the dataset's path and stamp and of the analysis code>``; None when turned off."""
    if os.environ.get(TABLE_CACHE_ENV, "1") == "0":
        return None
    from overlapviz import __version__
    from overlapviz.ingest import samples

    key = hashlib.sha256(f"{path}\0{stamp}\0{__version__}\0{code_stamp()}".encode()).hexdigest()[:24]
    return samples.cache_dir() / "tables" / key


def private(p: Path) -> bool:
    """Only this account can have written ``p`` (tables are pickles: never read one another account could plant)."""
    try:
        st = p.stat()
    except OSError:
        return False
    return st.st_uid == os.getuid() and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


KEEP_DATASETS = 24  # the table cache keeps the tables of this many datasets (the most recently computed)


def prune(root: Path) -> None:
    """Drop the oldest datasets' tables beyond ``KEEP_DATASETS`` (a new one is about to be written)."""
    try:
        dirs = sorted((d for d in root.iterdir() if d.is_dir() and private(d)), key=lambda d: d.stat().st_mtime)
    except OSError:
        return
    for d in dirs[: max(0, len(dirs) - KEEP_DATASETS + 1)]:
        for f in d.iterdir():
            f.unlink(missing_ok=True)
        d.rmdir()


def disk_file(path: str, stamp: str, name: str) -> Path | None:
    where = disk_dir(path, stamp)
    return None if where is None else where / f"{hashlib.sha256(name.encode()).hexdigest()[:16]}.pickle"


def on_disk(path: str, stamp: str, name: str, compute):
    """``compute()`` once per dataset across server processes: read from the table cache, else computed and written."""
    file = disk_file(path, stamp, name)
    where = None if file is None else file.parent
    if file is not None and file.exists() and private(where) and private(file):
        try:
            with open(file, "rb") as fh:
                return pickle.load(fh)
        except Exception:  # noqa: BLE001  (a damaged cache file is computed again)
            pass
    value = compute()
    if file is not None:
        try:
            if not where.exists():
                prune(where.parent)
            where.mkdir(mode=0o700, parents=True, exist_ok=True)
            if private(where):
                tmp = file.with_suffix(f".{os.getpid()}.tmp")
                with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as fh:
                    pickle.dump(value, fh, protocol=pickle.HIGHEST_PROTOCOL)
                os.replace(tmp, file)
        except OSError:  # a read-only cache: the table stays in memory
            pass
    return value


@functools.cache
def figure_stamp() -> str:
    """What a drawn figure depends on besides the dataset's tables: the modules that draw it, Bokeh and HoloViews."""
    import bokeh
    import holoviews

    import overlapviz

    files = sorted([*Path(overlapviz.__file__).parent.glob("figures*.py"), *Path(__file__).parent.glob("*.py")])
    return f"bokeh {bokeh.__version__} holoviews {holoviews.__version__};" + ";".join(
        f"{f.name}:{f.stat().st_size}:{f.stat().st_mtime_ns}" for f in files if f.exists())


def storable(serialized):
    """A serialized figure whose binary buffers are bytes (a memoryview of the drawing's arrays does not pickle)."""
    from bokeh.core.serialization import Buffer, Serialized

    from overlapviz.dashboards.patches import with_buffers

    def kept(buffer):
        return Buffer(buffer.id, buffer.to_bytes())

    return Serialized(content=with_buffers(serialized.content, kept), buffers=[kept(b) for b in serialized.buffers])
