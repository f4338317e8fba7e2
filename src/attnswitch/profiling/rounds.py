"""Timing rounds as data: what each backend's rounds measured, and when rounds stop. Pure functions over
the samples; ``capture`` runs the rounds."""

from __future__ import annotations

from dataclasses import dataclass, field

from .. import dist
from ..stats import median, paired_margin

__all__ = ["Timing", "Rounds", "MAX_ROUNDS", "STEP_FIGURES", "still_open"]

#: a generate's figures of every decode step, gathered over the rounds (``workloads.prompt_units``)
STEP_FIGURES = ("ttft", "interval", "host", "gpu", "wall")


@dataclass
class Timing:
    """One backend's timing rounds: every sample (ms, in order), the units each round is paired by (the
    round's median; for a generate, each prompt's time with its decode steps taken at their median), and
    for a generate the figures of every decode step of every round."""

    samples: list[float] = field(default_factory=list)
    units: list[list[float]] = field(default_factory=list)
    per_prompt: bool = False  # a generate's: units per prompt
    steps: dict[str, list[float]] | None = None  # a generate's: ttft, interval, host, gpu (ms); wall per round

    def time_ms(self) -> float | None:
        """The time the backend is ranked by: the median sample; for a generate, the sum over prompts of
        each prompt's median unit (a decode step delayed by the machine moves a median, not the sum)."""
        if not self.per_prompt:
            return median(self.samples)
        width = min(map(len, self.units)) if self.units else 0
        return sum(median(u[i] for u in self.units) for i in range(width)) if width else None


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


#: the most rounds an adaptive timing runs, whatever its budget
MAX_ROUNDS = 60


def still_open(timings: dict[str, Timing], active: list[str], *, out_of_time: bool,
               capped: bool) -> tuple[list[str], str]:
    """The backends timed in the next round, and why the rounds stop where none is: the fastest so far,
    and every backend not decidedly slower than it nor within ``stats.EQUIVALENT`` of it (a tie as close
    as that is told as a tie; more rounds would only tell a smaller difference)."""
    best = min(active, key=lambda n: timings[n].time_ms() or float("inf"))
    ref = timings[best].units

    def open_(name: str) -> bool:
        m = paired_margin(timings[name].units, ref, best)
        return m is None or not (m.slower or m.equal)

    keep = {best} | {n for n in active if n != best and open_(n)}
    if dist.world() is not None:  # every rank runs the same forwards: what any rank keeps, all keep
        gathered = dist.gather((sorted(keep), out_of_time or capped))
        keep = set().union(*(set(g[0]) for g in gathered))
        out_of_time = any(g[1] for g in gathered)
    if len(keep) <= 1:
        return [], "decided"
    if out_of_time or capped:
        return [], "budget" if out_of_time else "max rounds"
    return [n for n in active if n in keep], "decided"
