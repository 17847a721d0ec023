"""overlapviz: computation-communication overlap experiments, trace datasets, metrics and dashboards."""

from overlapviz._version import __version__


def open(path, **kwargs):  # noqa: A001 (as tarfile.open)
    """A dataset, or the dataset of raw traces, with its tables and figures: see :mod:`overlapviz.api`."""
    from overlapviz.api import open as _open

    return _open(path, **kwargs)
