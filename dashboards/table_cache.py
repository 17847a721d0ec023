"""The table cache: what a dashboard server computed for a dataset (tables, figures, Perfetto traces), kept on disk
for the next server process, under the overlapviz cache, private to this account (``overlapviz.dataset.computed``,
which the CLI's answers share)."""

from __future__ import annotations

import functools
from pathlib import Path

from overlapviz.dataset.computed import KEEP_DATASETS, TABLE_CACHE_ENV, open_private, private, prune, write_private  # noqa: F401
from overlapviz.dataset.computed import code_stamp, disk_dir, disk_file, on_disk  # noqa: F401 (this module's API)


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
