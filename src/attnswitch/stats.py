"""Statistics of repeated measurements: the median and its noise, one definition for the whole project."""

from __future__ import annotations

import statistics
from collections.abc import Iterable

__all__ = ["median", "noise_pct", "percentile"]


def median(xs: Iterable[float]) -> float | None:
    """The median, or None for no samples."""
    xs = list(xs)
    return statistics.median(xs) if xs else None


def noise_pct(xs: Iterable[float]) -> float | None:
    """Half the interquartile range in % of the median (half the range for 2-3 samples); None for
    fewer than 2 samples. Two medians closer than their noise are a tie."""
    xs = list(xs)
    if len(xs) < 2:
        return None
    if len(xs) < 4:
        lo, hi = min(xs), max(xs)
    else:
        lo, _, hi = statistics.quantiles(xs, n=4)
    mid = statistics.median(xs)
    return 100.0 * (hi - lo) / 2 / mid if mid else None


def percentile(xs: Iterable[float], p: float) -> float | None:
    """The ``p``-th percentile (0-100), linear between the closest ranks; None for no samples."""
    xs = sorted(xs)
    if not xs:
        return None
    if not 0 <= p <= 100:
        raise ValueError(f"percentile must be within 0..100, got {p}")
    pos = (len(xs) - 1) * p / 100
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)
