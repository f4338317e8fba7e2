"""Timing rounds as data: what each backend's rounds measured, and when rounds stop. Pure functions over
the samples; ``capture`` runs the rounds."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from .. import dist
from ..stats import median, paired_margin

__all__ = ["Timing", "Rounds", "MAX_ROUNDS", "MIN_PAIRS", "STEP_FIGURES", "still_open", "prompt_values", "fits",
           "shared_rounds", "round_drift"]

#: a generate's figures of every decode step, gathered over the rounds (``workloads.prompt_units``)
STEP_FIGURES = ("ttft", "interval", "host", "gpu", "wall")


@dataclass
class Timing:
    """One backend's timing rounds: every sample (ms, in order), the units each round is paired by, one
    list per round of the whole timing (empty for a round the backend sat out, so that every backend's
    round ``r`` is the same round), and for a generate the figures of every decode step.

    A round's unit is its median step; a generate's round times one prompt, every backend in turn, and
    its units are per prompt (the prompt's time with its decode steps taken at their median) at the
    prompt's position, 0 at the others. A generate's samples are its whole workloads (every prompt once).
    ``by_round``: the samples of each round (empty where it sat out; a generate's are its units)."""

    samples: list[float] = field(default_factory=list)
    units: list[list[float]] = field(default_factory=list)
    by_round: list[list[float]] = field(default_factory=list)
    # a generate's: the rounds each of its ``steps`` figures came from (a whole workload's: all its prompts')
    step_rounds: dict[str, list[tuple[int, ...]]] = field(default_factory=dict)
    per_prompt: bool = False  # a generate's: units per prompt
    steps: dict[str, list[float]] | None = None  # a generate's: ttft, interval, host, gpu (ms); wall per workload
    pending: dict[int, float] = field(default_factory=dict)  # a generate's prompts timed since its last workload
    pending_rounds: list[int] = field(default_factory=list)  # the rounds they were timed in
    nonfinite: object = None  # results.NonFinite: a NaN or Inf its untimed steps or kept outputs showed

    def time_ms(self, rounds: Sequence[int] | None = None) -> float | None:
        """The backend's time: the median sample; for a generate, the sum over prompts of each prompt's median
        unit (a decode step delayed by the machine moves a median, not the sum). ``rounds``: of those rounds
        alone (``shared_rounds``: every backend's time from the same stretch of the machine's time, so that
        a change of its speed between rounds moves them all alike)."""
        if not self.per_prompt:
            if rounds is None or not self.by_round:
                return median(self.samples)
            got = [x for r in rounds if r < len(self.by_round) for x in self.by_round[r]]
            return median(got) if got else median(self.samples)
        units = self.units if rounds is None else [self.units[r] for r in rounds if r < len(self.units)]
        per = prompt_values(units)
        return sum(median(v) for v in per) if per and all(per) else None

    def spread(self) -> list[float]:
        """What the noise is the spread of: the samples; for a generate, every unit over its prompt's median
        (prompts of different lengths measured on one scale), of the prompts measured more than once."""
        if not self.per_prompt:
            return list(self.samples)
        return [x / m for v in prompt_values(self.units) if len(v) > 1 and (m := median(v)) for x in v]


def _took(unit: list[float]) -> bool:
    return any(x > 0 for x in unit)


def shared_rounds(timings: Mapping[str, Timing], names: Iterable[str] | None = None) -> list[int]:
    """The rounds every one of ``names`` (default: all) took (a generate's: in which each timed a prompt)."""
    ts = [timings[n] for n in (timings if names is None else names)]
    n = min((len(t.units) for t in ts), default=0)
    return [r for r in range(n) if all(_took(t.units[r]) for t in ts)]


def round_drift(timings: Mapping[str, Timing], rounds: Sequence[int]) -> float | None:
    """How far the machine's speed moved between ``rounds``, from the backends' times themselves: per round,
    the median over backends of each unit over the median of its backend's units at its position (a
    generate's prompt: prompts of different lengths are not a change of speed; a prompt timed in one of the
    rounds alone says nothing of the machine and is left out); the upper quintile of those over the lower one
    (1.0: no round slower than another; quintiles rather than the extremes, so that a steady machine's noise
    over many rounds does not read as a change). None where it cannot be told: fewer than two backends (one
    backend's rounds cannot tell the machine from itself), or fewer than three rounds to compare."""
    # each backend's units in those rounds, and the median at each position measured more than once
    units = [[t.units[r] if r < len(t.units) else [] for r in rounds] for t in timings.values()]
    units = [u for u in units if any(map(_took, u))]
    if len(units) < 2:
        return None
    mids = [{i: median(v) for i, v in enumerate(prompt_values(u)) if len(v) > 1} for u in units]
    per = []
    for k in range(len(rounds)):
        ratios = [x / mid[i] for u, mid in zip(units, mids) for i, x in enumerate(u[k]) if x > 0 and i in mid]
        if ratios:
            per.append(median(ratios))
    if len(per) < 3:
        return None
    low, high = _quantile(per, 0.2), _quantile(per, 0.8)
    return high / low if low > 0 else None


def _quantile(xs: Sequence[float], q: float) -> float:
    """The ``q`` quantile of ``xs``, interpolated between order statistics."""
    s = sorted(xs)
    k = (len(s) - 1) * q
    i = int(k)
    return s[i] + (s[min(i + 1, len(s) - 1)] - s[i]) * (k - i)


def prompt_values(units: list[list[float]]) -> list[list[float]]:
    """A generate's units per prompt position: the values measured (above 0) over the rounds."""
    width = max(map(len, units), default=0)
    return [[u[i] for u in units if len(u) > i and u[i] > 0] for i in range(width)]


@dataclass(frozen=True)
class Rounds:
    """What ``timed_rounds`` measured: each backend's ``Timing``, how many rounds ran and why they
    stopped (``decided``: every backend told apart from the fastest, or tied with it within
    ``stats.EQUIVALENT``; ``budget`` or ``max rounds``: some still overlapping the fastest when time or
    rounds ran out; ``fixed``: the rounds asked for, no more)."""

    timings: dict[str, Timing]
    rounds: int
    stopped: str
    seconds: float


#: the most rounds an adaptive timing runs, whatever its budget (a generate's: prompts)
MAX_ROUNDS = 60
#: the fewest paired units with which a 95 % interval can exclude 1 (the sign test's: 1 - 2/2**6 >= 0.95)
MIN_PAIRS = 6


def still_open(timings: dict[str, Timing], active: list[str], *, out_of_time: bool,
               capped: bool) -> tuple[list[str], str]:
    """The backends timed in the next round, and why the rounds stop where none is: the fastest so far,
    and every backend not decidedly slower than it nor within ``stats.EQUIVALENT`` of it (a tie as close
    as that is told as a tie; more rounds would only tell a smaller difference). A backend left out
    against an earlier fastest comes back when its rounds paired with the fastest now do not say it is
    slower (the fastest changed under it)."""
    shared = shared_rounds(timings, active)  # the fastest from the same rounds for all: speed drifts
    best = min(active, key=lambda n: timings[n].time_ms(shared) or float("inf"))
    ref = timings[best].units

    def open_(name: str) -> bool:
        m = paired_margin(timings[name].units, ref, best)
        return m is None or not (m.slower or m.equal)

    keep = {best} | {n for n in timings if n != best and open_(n)}
    if dist.world() is not None:  # every rank runs the same forwards: what any rank keeps, all keep
        gathered = dist.gather((sorted(keep), out_of_time or capped))
        keep = set().union(*(set(g[0]) for g in gathered))
        out_of_time = any(g[1] for g in gathered)
    if len(keep) <= 1:
        return [], "decided"
    if out_of_time or capped:
        return [], "budget" if out_of_time else "max rounds"
    return [n for n in timings if n in keep], "decided"


def fits(seconds: float, left: float) -> bool:
    """Whether a round expected to take ``seconds`` ends within the ``left`` seconds of the budget (under
    ``torchrun``: on every rank, so that all of them start it or none)."""
    ok = seconds <= left
    if dist.world() is not None:
        ok = all(dist.gather(ok))
    return ok
