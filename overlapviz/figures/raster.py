"""Intervals counted per pixel column: the timeline's raster rule, shared by the local figure and the Dask workers
(numpy only, so a worker counting its ranks' kernels imports no plotting library)."""

from __future__ import annotations

import numpy as np

__all__ = ["coverage"]


def coverage(s, e, lane, cat, n_cat, n_lanes, width, x0, x1) -> np.ndarray:
    """Counts of intervals ``[s, e]`` covering each (category, lane, pixel column) of ``width`` columns over
    ``[x0, x1]``: a difference array per row, int64 ``(n_cat, n_lanes, width)``."""
    scale = width / (x1 - x0)
    c0 = np.clip(np.floor((np.asarray(s) - x0) * scale), 0, width - 1).astype(np.int64)
    c1 = np.clip(np.floor((np.asarray(e) - x0) * scale), 0, width - 1).astype(np.int64)
    row = np.asarray(cat, np.int64) * n_lanes + np.asarray(lane, np.int64)
    size = n_cat * n_lanes * (width + 1)
    diff = np.bincount(row * (width + 1) + c0, minlength=size) - np.bincount(row * (width + 1) + c1 + 1, minlength=size)
    return np.cumsum(diff.reshape(n_cat, n_lanes, width + 1), axis=2)[:, :, :width]
