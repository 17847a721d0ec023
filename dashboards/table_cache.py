"""The table cache: what a dashboard server computed for a dataset (tables, figures, Perfetto traces), kept on disk
for the next server process, under the overlapviz cache, private to this account (``overlapviz.dataset.computed``,
which the CLI's answers share)."""

from __future__ import annotations

import functools
import hashlib
import pickle
from pathlib import Path

from overlapviz.dataset.computed import KEEP_DATASETS, TABLE_CACHE_ENV, open_private, private, prune, write_private  # noqa: F401
from overlapviz.dataset.computed import code_stamp, disk_dir  # noqa: F401 (this module's API)


def disk_file(path: str, stamp: str, name: str) -> Path | None:
    where = disk_dir(path, stamp)
    return None if where is None else where / f"{hashlib.sha256(name.encode()).hexdigest()[:16]}.pickle"


def on_disk(path: str, stamp: str, name: str, compute):
    """``compute()`` once per dataset across server processes: read from the table cache, else computed and written."""
    file = disk_file(path, stamp, name)
    fh = None if file is None or not file.exists() else open_private(file)
    if fh is not None:
        try:
            with fh:
                return pickle.load(fh)
        except Exception:  # noqa: BLE001  (a damaged cache file is computed again)
            pass
    value = compute()
    if file is not None:  # a read-only cache: the table stays in memory
        write_private(file, lambda out: pickle.dump(value, out, protocol=pickle.HIGHEST_PROTOCOL))
    return value


@functools.cache
def figure_stamp() -> str:
    """What a drawn figure depends on besides the dataset's tables: the modules that draw it, Bokeh and HoloViews."""
    import bokeh
    import holoviews

    import overlapviz

    files = sorted([*(Path(overlapviz.__file__).parent / "figures").glob("*.py"), *Path(__file__).parent.glob("*.py")])
    return f"bokeh {bokeh.__version__} holoviews {holoviews.__version__};" + ";".join(
        f"{f.name}:{f.stat().st_size}:{f.stat().st_mtime_ns}" for f in files if f.exists())


def storable(serialized):
    """A serialized figure whose binary buffers are bytes (a memoryview of the drawing's arrays does not pickle)."""
    from bokeh.core.serialization import Buffer, Serialized

    from overlapviz.dashboards.patches import with_buffers

    def kept(buffer):
        return Buffer(buffer.id, buffer.to_bytes())

    return Serialized(content=with_buffers(serialized.content, kept), buffers=[kept(b) for b in serialized.buffers])
