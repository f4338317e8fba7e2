"""Statistics of repeated measurements, one definition for the whole project: the median and its noise,
and the ratio of two backends' times paired by round with a confidence interval.

Rounds are few (a handful to a few dozen) and a busy machine throws outliers, so the interval is the
distribution-free one for a median (the sign test's, from order statistics): exact for any distribution
of the per-round ratios, at any number of rounds, where a bootstrap under-covers at these sample sizes.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

__all__ = ["median", "noise_pct", "percentile", "LEVEL", "EQUIVALENT", "median_interval", "Margin", "paired_margin",
           "covers", "bracket_words", "bracket_label", "margin_coverages"]

#: the confidence asked of every interval the project prints
LEVEL = 0.95
#: two backends whose interval lies within this fraction of 1 are equal for any practical purpose
EQUIVALENT = 0.02


def median(xs: Iterable[float]) -> float | None:
    """The median, or None for no samples."""
    xs = list(xs)
    return statistics.median(xs) if xs else None


def noise_pct(xs: Iterable[float]) -> float | None:
    """Half the interquartile range in % of the median (half the range for 2-3 samples); None for
    fewer than 2 samples: the spread of the samples, not a confidence in their median."""
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


def _below(n: int, k: int) -> float:
    """P(X < k) for X ~ Binomial(n, 1/2)."""
    return sum(math.comb(n, i) for i in range(k)) / 2 ** n


def median_interval(xs: Sequence[float], level: float = LEVEL) -> tuple[float, float, float]:
    """``(low, high, coverage)``: the narrowest interval between order statistics ``x(k)`` and
    ``x(n+1-k)`` that holds the median with probability ``coverage >= level``, whatever the distribution
    of ``xs`` (independent draws). With too few values for ``level`` (fewer than 6 at 95 %), the whole
    range and its own, lower, coverage."""
    xs = sorted(xs)
    n = len(xs)
    if not n:
        raise ValueError("an interval needs at least one value")
    k = 1
    while k + 1 <= (n + 1) // 2 and 1 - 2 * _below(n, k + 1) >= level:
        k += 1
    return xs[k - 1], xs[n - k], 1 - 2 * _below(n, k)


def covers(coverage: float, level: float = LEVEL) -> bool:
    """Whether a bracket of that coverage is the ``level`` interval (it is the whole range of the ratios below)."""
    return coverage >= level - 1e-9


def _brackets(coverages: Iterable[float], level: float) -> tuple[str, float]:
    """``("interval" | "range" | "mixed", the lowest coverage)``: whether the brackets of margins of these
    coverages are all ``level`` intervals, all ranges of too few rounds, or some of each."""
    coverages = list(coverages) or [level]
    low, high = min(coverages), max(coverages)
    return ("interval" if covers(low, level) else "range" if not covers(high, level) else "mixed"), low


def bracket_words(coverages: Iterable[float], level: float = LEVEL) -> str:
    """What the brackets of margins of these ``coverages`` are: the ``level`` interval, or, with too few paired
    rounds for one (fewer than 6 at 95 %), the whole range of the ratios, which tells nothing apart (for the
    backends timed in too few rounds only, where the others have their interval). The recommendation's Margins
    line, the report's timing note and its chart's axis (``bracket_label``) all say it in these words."""
    kind, low = _brackets(coverages, level)
    short = (f"the range of its ratios (too few paired rounds to cover {level:.0%}: it covers {low:.0%}, "
             "and nothing is told apart)")
    return {"interval": f"its {level:.0%} interval", "range": short,
            "mixed": f"its {level:.0%} interval, or, for a backend timed in fewer paired rounds, {short}"}[kind]


def margin_coverages(backends, pick: str | None, eager: bool = True) -> list[float]:
    """The coverage of each margin against the pick (results' ``BackendResult``s): what the brackets shown are.
    ``eager=False``: the candidates' alone (``results.candidates``: eager is ranked as the reference, never
    picked, and the recommendation's Margins line describes the candidates' margins it lists)."""
    return [b.margin.coverage for b in backends if b.backend != pick and (eager or b.backend != "eager")
            and getattr(b, "margin", None) is not None]


def bracket_label(coverages: Iterable[float], level: float = LEVEL) -> str:
    """``bracket_words`` in a few words (a chart's axis)."""
    kind, _ = _brackets(coverages, level)
    return {"interval": f"{level:.0%} interval", "range": "range of the ratios",
            "mixed": f"{level:.0%} interval; with fewer rounds, the range of the ratios"}[kind]


@dataclass(frozen=True)
class Margin:
    """How a backend's time compares with another's (``against``, the best): the median of their paired
    per-round ratios (above 1: slower) and its interval, from ``pairs`` rounds."""

    against: str
    ratio: float
    low: float
    high: float
    coverage: float  # the probability that the interval holds the median ratio
    pairs: int

    @property
    def decided(self) -> bool:
        """The interval excludes 1 at the project's confidence: one of the two is faster."""
        return covers(self.coverage) and (self.low > 1.0 or self.high < 1.0)

    @property
    def equal(self) -> bool:
        """The interval lies within ``EQUIVALENT`` of 1 at the project's confidence: a tie, told apart from
        a difference too small to matter."""
        return (covers(self.coverage) and self.low >= 1 / (1 + EQUIVALENT)
                and self.high <= 1 + EQUIVALENT)

    @property
    def slower(self) -> bool:
        """Decidedly slower than ``against``."""
        return self.decided and self.low > 1.0

    def text(self) -> str:
        """``1.09x [1.05–1.13]``; a bound that excludes 1 gets the digits it needs to show it (``[1.003–1.20]``,
        never ``[1.00–1.20]`` for a decided margin), and so does a bound on either side of a tie's edges
        (``EQUIVALENT``: ``[1.0060–1.0204]`` is told apart, ``[1.0060–1.0196]`` a tie)."""
        d = _digits(self.low if self.low > 1 else self.high) if self.decided else 2
        d = max(d, _digits(self.low, 1 / (1 + EQUIVALENT), 4), _digits(self.high, 1 + EQUIVALENT, 4))
        return f"{self.ratio:.{d}f}x [{self.low:.{d}f}–{self.high:.{d}f}]"


def _digits(x: float, other: float = 1.0, most: int = 12) -> int:
    """The decimals (2 at least, ``most`` at most) that show ``x`` as other than ``other`` (1: a bound excluding
    1; a tie's edge, where 4 suffice: closer than that, the ≈ mark tells), where it is (every figure of the
    margin gets them)."""
    digits = 2
    while digits < most and x != other and f"{x:.{digits}f}" == f"{other:.{digits}f}":
        digits += 1
    return digits


def paired_margin(units: Sequence[Sequence[float]], ref: Sequence[Sequence[float]], against: str,
                  level: float = LEVEL) -> Margin | None:
    """The margin of one backend against ``ref``'s, from their units paired by round and by position in
    the round (a round's median, or a generate's per-prompt times): rounds one of them did not run, and
    positions past the shorter round, have no pair. None without a pair."""
    ratios = [a / b for xs, ys in zip(units, ref) for a, b in zip(xs, ys) if b > 0 and a > 0]
    if not ratios:
        return None
    low, high, coverage = median_interval(ratios, level)
    return Margin(against, statistics.median(ratios), low, high, coverage, len(ratios))
