"""Confidence intervals: the one definition (percentile bootstrap of the median) used by the collector's manifest, the CLI and the dashboard."""

from __future__ import annotations

import numpy as np

DEFAULT_LEVEL = 0.95
DEFAULT_RESAMPLES = 2000
DEFAULT_SEED = 0

__all__ = ["DEFAULT_LEVEL", "DEFAULT_RESAMPLES", "DEFAULT_SEED", "bootstrap_difference", "bootstrap_median", "bootstrap_ratio", "check_level"]


def _boot_medians(x: np.ndarray, rng: np.random.Generator, n_resamples: int) -> np.ndarray:
    """The medians of ``n_resamples`` resamples of ``x``: each row sorted and its middle taken (the mean of the two
    middle values for an even length, as ``numpy.median`` forms it), equal to ``numpy.median(..., axis=1)`` bit for
    bit and 4-6x faster on the short samples of a run's iterations."""
    idx = rng.integers(0, len(x), size=(n_resamples, len(x)))
    if np.isnan(x).any():
        return np.median(x[idx], axis=1)
    v = np.sort(x[idx], axis=1)
    n = len(x)
    return v[:, n // 2] if n % 2 else (v[:, n // 2 - 1] + v[:, n // 2]) / 2


def bootstrap_median(x, *, level: float = DEFAULT_LEVEL, n_resamples: int = DEFAULT_RESAMPLES, seed: int = DEFAULT_SEED):
    """Median of ``x`` and its percentile-bootstrap confidence interval.

    Parameters
    ----------
    x
        Samples (NaN-free).
    level
        Two-sided confidence level, e.g. 0.95: the interval is the (1−level)/2 and
        (1+level)/2 quantiles of the medians of ``n_resamples`` resamples of ``x`` drawn
        with replacement by ``numpy.random.default_rng(seed)``.

    Returns
    -------
    (float, float, float)
        Median, CI low, CI high; all NaN for an empty ``x``; a single sample gives a
        zero-width interval.
    """
    x = np.asarray(x, np.float64)
    if len(x) == 0:
        return (np.nan, np.nan, np.nan)
    check_level(level)
    meds = _boot_medians(x, np.random.default_rng(seed), n_resamples)
    lo, hi = np.quantile(meds, [(1 - level) / 2, (1 + level) / 2])
    return (float(np.median(x)), float(lo), float(hi))


def bootstrap_ratio(num, den, *, level: float = DEFAULT_LEVEL, n_resamples: int = DEFAULT_RESAMPLES, seed: int = DEFAULT_SEED):
    """``median(num) / median(den)`` and its percentile-bootstrap confidence interval.

    The two samples are resampled independently (they are different runs), each
    replicate's ratio of medians is formed, and the interval is its (1−level)/2 and
    (1+level)/2 quantiles.

    Returns
    -------
    (float, float, float)
        Ratio, CI low, CI high; NaN when either sample is empty.
    """
    num, den = np.asarray(num, np.float64), np.asarray(den, np.float64)
    if len(num) == 0 or len(den) == 0:
        return (np.nan, np.nan, np.nan)
    check_level(level)
    rng = np.random.default_rng(seed)
    ratios = _boot_medians(num, rng, n_resamples) / _boot_medians(den, rng, n_resamples)
    lo, hi = np.quantile(ratios, [(1 - level) / 2, (1 + level) / 2])
    return (float(np.median(num) / np.median(den)), float(lo), float(hi))


def bootstrap_difference(a, b, *, level: float = DEFAULT_LEVEL, n_resamples: int = DEFAULT_RESAMPLES, seed: int = DEFAULT_SEED):
    """``median(b) − median(a)`` with its percentile-bootstrap confidence interval (independent resamples)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if len(a) == 0 or len(b) == 0:
        return (np.nan, np.nan, np.nan)
    check_level(level)
    rng = np.random.default_rng(seed)
    diffs = _boot_medians(b, rng, n_resamples) - _boot_medians(a, rng, n_resamples)
    lo, hi = np.quantile(diffs, [(1 - level) / 2, (1 + level) / 2])
    return (float(np.median(b) - np.median(a)), float(lo), float(hi))


def check_level(level: float) -> None:
    if not 0 < level < 1:
        raise ValueError(f"confidence level {level!r} must be between 0 and 1 (e.g. 0.95)")
