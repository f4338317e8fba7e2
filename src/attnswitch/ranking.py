"""The ranking: which backend is fastest, by how much, which cannot be told apart from it, and which of
those is picked. One rule, read by the decision (``decision.py``), the summary's bold row, a sweep's table
and its text. Pure functions over results.

Backends are compared round by round (``stats.paired_margin``): the median of the per-round ratios and its
95 % interval. One is faster than another only where that interval excludes 1 (and lies beyond
``stats.EQUIVALENT``). The candidates no other is faster than (or that are, but only through a cycle of such
wins, which load makes) are the top; the pick is the top candidate that changes least (``catalog.PREFERENCE``:
``auto``, then a fused kernel, a user's, an unfused one), then the fastest of those. Every candidate not told
apart from the pick is tied with it, and none faster than the pick in its paired rounds is ever called tied
(but through a cycle, which is said). An alias and the backend it ran (``auto`` that ran flash, and ``flash``)
are ranked as any two candidates are: the same kernel behind two host paths; where their rounds tell them
apart, a caution says so.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from . import catalog, defects
from .backends import kernel_family
from .candidate import Candidate
from .results import BackendResult, Margin, candidates
from .stats import paired_margin

__all__ = ["Verdict", "verdict", "against", "told_apart", "rank", "ranked", "ruled_out", "busy_host", "busy_over",
           "busy_signs", "busy_line", "BUSY_LOAD", "BUSY_SPREAD", "BUSY_DRIFT", "BUSY_PREFIX", "gate_cautions",
           "NUMERICS", "DEFECT", "MISMATCH", "UNTIMED"]

#: a fixed task's time varying by more than this (median over fastest, or after over before) on the host
BUSY_SPREAD = 1.25
BUSY_DRIFT = 1.25
#: a load average this far above the number of CPUs (this process counts once)
BUSY_LOAD = 0.5
#: how the caution of a busy machine begins
BUSY_PREFIX = "The machine was busy while measuring"


@dataclass(frozen=True)
class Verdict:
    """The ranking of one set of results: every backend that ran with acceptable numerics, the pick first, then the
    candidates tied with it, then the rest, each by its median ratio to the pick (``order``, eager included as the
    reference); the pick and the candidates tied with it (``ties``, the pick first); each ranked backend's margin
    against the pick; ``fastest``, the top candidate its paired rounds find fastest (the pick where nothing is
    preferred over it); ``cycled``: tied candidates faster than the pick in their paired rounds, held tied because
    their order cycled (each was faster than another); ``behind``: candidates not told apart from the pick but
    decidedly slower than a tied one (name -> that one): never tied; cautions."""

    order: tuple[str, ...]
    ties: tuple[str, ...]
    margins: Mapping[str, Margin]
    cautions: tuple[str, ...] = ()
    fastest: str | None = None
    cycled: tuple[str, ...] = ()
    behind: Mapping[str, str] = dataclasses.field(default_factory=dict)

    @property
    def pick(self) -> str | None:
        return self.ties[0] if self.ties else None

    @property
    def beaten(self) -> tuple[str, ...]:
        """The candidates told apart from the pick (slower), in order (a sweep's last shape, re-based on the sweep's
        pick, may hold one decidedly faster than it: never here)."""
        return tuple(n for n in candidates(self.order) if n not in self.ties and not _faster(self.margins.get(n)))


#: why a backend that ran is no candidate (``ruled_out``)
NUMERICS, DEFECT, MISMATCH, UNTIMED = ("numerics beyond tolerance", "a known defect makes it wrong here",
                                       "its compiled graph ran another kernel than the one it forces",
                                       "no time measured")


def ruled_out(b: BackendResult) -> str:
    """Why ``b``, which ran, is no candidate whatever its time (empty where it is one): numerics beyond tolerance
    (outputs, or gradients in a training step; a NaN or Inf fails the backend instead), a known defect that makes
    it wrong where the workload or its deployment runs (``defects``), a compiled graph that ran another kernel
    than the one it forces (``auto``'s is only flagged: what it runs is SDPA's choice of its compile), or no time."""
    if (b.numerics is not None and not b.numerics.ok) or (b.train is not None and b.train.grad_ok is False):
        return NUMERICS
    if any(m.blocks for m in b.defects):
        return DEFECT
    if b.attn_mismatch and b.candidate.backend in catalog.FORCED:
        return MISMATCH
    if b.time_ms is None:
        return UNTIMED
    return ""


def _good(b: BackendResult) -> bool:
    """Ran, and nothing rules it out (``ruled_out``)."""
    return b.ok and not ruled_out(b)


def gate_cautions(results: Iterable[BackendResult]) -> list[str]:
    """Why a backend that ran is out whatever its time, and what it may get wrong: the known defects that bear
    on each (those that make one wrong first), then each NaN or Inf found, with where. The answer's first lines."""
    results = list(results)
    lines = defects.cautions(results)
    lines += [f"Not considered: `{b.backend}` gave {b.nonfinite.text()}." for b in results if b.nonfinite is not None]
    return lines


def _margins(good: list[BackendResult], ref: BackendResult) -> dict[str, Margin]:
    out = {}
    for b in good:
        m = paired_margin(b.time_rounds_ms, ref.time_rounds_ms, ref.backend) if b is not ref else None
        if b is ref and ref.time_rounds_ms:
            n = sum(x > 0 for u in ref.time_rounds_ms for x in u)  # a generate's rounds hold 0 where not timed
            m = Margin(ref.backend, 1.0, 1.0, 1.0, 1.0, n)
        if m is not None:
            out[b.backend] = m
    return out


def _aliases(by: dict[str, BackendResult]) -> dict[str, str]:
    """``auto`` (compiled or not) -> the forced backend it ran here (compiled alike), where both ran."""
    out = {}
    for name, b in by.items():
        c = b.candidate
        if c.backend != "auto":
            continue
        fam = kernel_family(b.attn_ops + b.attn_kernel_names)
        target = str(Candidate(fam, c.compile)) if fam else None
        if target in by:
            out[name] = target
    return out


def _beats(good: list[BackendResult]) -> dict[str, set[str]]:
    """For each candidate, those it is decidedly faster than."""
    out: dict[str, set[str]] = {b.backend: set() for b in good}
    for a in good:
        for b in good:
            if a is not b and told_apart(paired_margin(b.time_rounds_ms, a.time_rounds_ms, a.backend)):
                out[a.backend].add(b.backend)
    return out


def _reach(beats: dict[str, set[str]]) -> dict[str, set[str]]:
    """Who each candidate beats directly or through others."""
    reach = {n: set(s) for n, s in beats.items()}
    for k in reach:
        for n in reach:
            if k in reach[n]:
                reach[n] |= reach[k]
    return reach


def _scores(good: list[BackendResult]) -> dict[str, float]:
    """Each candidate's median, over rounds (and a generate's prompts), of its time over the geometric mean of
    every candidate's there: one common reference, so the order it gives has no cycle."""
    n = max((len(b.time_rounds_ms) for b in good), default=0)
    ratios: dict[str, list[float]] = {b.backend: [] for b in good}
    for r in range(n):
        width = max((len(b.time_rounds_ms[r]) for b in good if r < len(b.time_rounds_ms)), default=0)
        for i in range(width):
            vals = {b.backend: b.time_rounds_ms[r][i] for b in good
                    if r < len(b.time_rounds_ms) and i < len(b.time_rounds_ms[r]) and b.time_rounds_ms[r][i] > 0}
            if len(vals) < 2:
                continue
            g = math.exp(sum(math.log(v) for v in vals.values()) / len(vals))
            for name, v in vals.items():
                ratios[name].append(v / g)
    return {b.backend: (statistics.median(ratios[b.backend]) if ratios[b.backend] else math.inf) for b in good}


def _top(cands: list[BackendResult], beats: dict[str, set[str]]) -> list[BackendResult]:
    """The candidates nothing beats, or only candidates they beat back through others (a cycle)."""
    reach = _reach({b.backend: beats[b.backend] for b in cands})
    return [c for c in cands if all(c.backend not in reach[d.backend] or d.backend in reach[c.backend]
                                    for d in cands if d is not c)] or cands


def verdict(results: Iterable[BackendResult], host: Mapping | None = None) -> Verdict:
    """Rank ``results`` (``host``: ``settings["host"]``, the load probes taken around the timing)."""
    results = list(results)
    good = sorted(filter(_good, results), key=lambda b: b.time_ms)
    by = {b.backend: b for b in good}
    cands = [b for b in good if b.backend in candidates([b.backend])]
    cautions = [*gate_cautions(results), *busy_host(host, results)]
    if not cands:
        return Verdict(tuple(b.backend for b in good), (), {}, tuple(cautions))
    alias = _aliases(by)
    beats = _beats(cands)
    score = _scores(cands)
    top = _top(cands, beats)
    fastest = min(top, key=lambda b: (score[b.backend], b.time_ms))
    pick = min(top, key=lambda b: (b.candidate.preference(), score[b.backend], b.time_ms))
    margins = _margins(good, pick)
    ratio = {b.backend: (margins[b.backend].ratio if b.backend in margins else b.time_ms / pick.time_ms)
             for b in good}
    cycled = [b.backend for b in top if pick.backend in beats[b.backend]]
    # tied for the fastest: the top, and those not told apart from the pick that no tied one is decidedly faster
    # than; one not told apart from the pick but decidedly slower than a tied one is behind it (``behind``)
    ties, behind = [b.backend for b in top], {}
    for b in cands:
        if b.backend in ties or told_apart(margins.get(b.backend)):
            continue
        ahead = next((t.backend for t in top if b.backend in beats[t.backend]), None)
        if ahead is None:
            ties.append(b.backend)
        else:
            behind[b.backend] = ahead
    for a, target in alias.items():
        m = paired_margin(by[a].time_rounds_ms, by[target].time_rounds_ms, target)
        if m is not None and m.decided and not m.equal:
            cautions.append(f"`{a}` ran {target}'s kernels, yet measured {m.text()} of `{target}`'s time: the two "
                            "reach the kernel by different host paths (transformers' sdpa call, attnswitch's own "
                            "op; `auto` timed with no switch where the model runs it unswitched), or the machine's "
                            "load changed between them.")
    if cycled:
        names = ", ".join(f"`{n}`" for n in [pick.backend, *cycled])
        cautions.append(f"The paired rounds do not order {names}: each was faster than another in most rounds (their "
                        "order cycled, which load does); they are held tied.")
    # the pick, those tied with it, then the rest, each group by its ratio to the pick: a rank never puts one
    # that is not tied above one that is
    order = tuple(sorted(by, key=lambda n: (n != pick.backend, n not in ties, ratio[n], by[n].time_ms)))
    ties = [n for n in candidates(order) if n in ties]  # in ranking order, the pick first
    cautions += _unsteady(by[ties[0]])
    return Verdict(order, tuple(ties), margins, tuple(cautions), fastest.backend, tuple(cycled), behind)


def _unsteady(b: BackendResult) -> list[str]:
    """A generate ranked per step whose whole workloads took much longer: long stretches of slow steps
    (another process, a collection) that a step's median does not see."""
    g = b.generate
    if g is None or not g.workload_wall_ms or not b.time_ms or g.workload_wall_ms <= BUSY_DRIFT * b.time_ms:
        return []
    return [f"`{b.backend}`'s whole workloads took {g.workload_wall_ms / b.time_ms:.2f}x its per-step time: its steps "
            "were slowed for long stretches; rerun on an idle machine."]


def told_apart(m: Margin | None) -> bool:
    """Decidedly slower than the backend ``m`` is against, by more than a difference too small to matter."""
    return m is not None and m.slower and not m.equal


def against(v: Verdict, results: Iterable[BackendResult], name: str) -> Verdict:
    """``v`` re-based on ``name`` (a ranked backend: ``eager`` faster than every candidate, a sweep's one
    pick): margins against it, it first in the order, tied with it what its margins do not tell apart."""
    if name == v.pick or name not in v.order:
        return v
    good = [b for b in results if b.backend in v.order]
    ref = next(b for b in good if b.backend == name)
    margins = _margins(good, ref)
    ratio = {b.backend: (margins[b.backend].ratio if b.backend in margins else b.time_ms / ref.time_ms)
             for b in good}
    tied = {n for n in ratio if n == name or (n != "eager" and not told_apart(margins.get(n))
                                              and not _faster(margins.get(n)))}
    order = tuple(sorted(ratio, key=lambda n: (n != name, n not in tied, ratio[n])))
    ties = tuple(n for n in order if n in tied)
    return dataclasses.replace(v, order=order, ties=ties, margins=margins, cycled=(), behind={})


def _faster(m: Margin | None) -> bool:
    """Decidedly faster than the backend ``m`` is against, by more than a difference too small to matter."""
    return m is not None and m.decided and m.high < 1.0 and not m.equal


def rank(results: Iterable[BackendResult]) -> list[str]:
    """Backends that ran with acceptable numerics (outputs, and gradients in a training step), fastest
    first (``verdict(...).order``)."""
    return list(verdict(results).order)


def ranked(results: list[BackendResult], v: Verdict) -> list[BackendResult]:
    """``results`` with each ranked backend's margin against the pick."""
    return [dataclasses.replace(b, margin=v.margins.get(b.backend)) for b in results]


def busy_host(host: Mapping | None, results: Iterable[BackendResult] = ()) -> tuple[str, ...]:
    """A caution where the machine was busy while measuring (``busy_signs``); empty where nothing says so."""
    return busy_over([(host, results)])


def busy_over(measured: Iterable[tuple[Mapping | None, Iterable[BackendResult]]]) -> tuple[str, ...]:
    """One caution for several measurements (a sweep's shapes: each one's host probes and results): each kind of
    sign once, as the first measurement that showed it said it; empty where none says the machine was busy."""
    signs: dict[str, str] = {}
    for host, results in measured:
        for kind, sign in busy_signs(host, results).items():
            signs.setdefault(kind, sign)
    return (busy_line(signs),) if signs else ()


def busy_signs(host: Mapping | None, results: Iterable[BackendResult] = ()) -> dict[str, str]:
    """What says the machine was busy, by kind of sign: the load probes around the timing rounds (load
    average, a fixed task timed before and after), the rounds themselves (every backend's step slower in some
    rounds than in others: ``rounds.round_drift``) and, on a CPU, host times of the same steps measured apart."""
    if not host:
        return {}
    said = {}
    cpus = host.get("cpus") or 1
    loads = [x for x in (host.get("load_before"), host.get("load_after")) if x is not None]
    if loads and max(loads) > cpus + BUSY_LOAD:
        said["load"] = f"load average {max(loads):.1f} on {cpus} CPUs"
    probes = [p for p in (host.get("probe_before_ms"), host.get("probe_after_ms")) if p]
    spread = max((max(p) / min(p) for p in probes if min(p) > 0), default=1.0)
    if spread > BUSY_SPREAD:
        said["spread"] = f"a fixed task's time varied {spread:.1f}x"
    if len(probes) == 2:
        drift = statistics.median(probes[1]) / statistics.median(probes[0])
        if max(drift, 1 / drift) > BUSY_DRIFT:
            said["drift"] = f"its time changed {max(drift, 1 / drift):.2f}x from before the timing to after it"
    moved = host.get("round_drift")
    if moved is not None and moved > BUSY_DRIFT:
        said["rounds"] = (f"every backend's step was {moved:.2f}x slower in its slower rounds than in its faster "
                          "ones: compare them by their vs-pick ratios, paired per round, rather than by their times")
    apart = [(b.host_ms / b.time_ms, b.backend) for b in results
             if b.ok and b.timer == "wall-clock" and b.host_ms and b.time_ms]
    worst = max(apart, key=lambda x: max(x[0], 1 / x[0]), default=None)
    if worst is not None and max(worst[0], 1 / worst[0]) > BUSY_DRIFT:
        said["apart"] = f"`{worst[1]}`'s host time per step, measured apart, was {worst[0]:.2f}x its time in the rounds"
    return said


def busy_line(signs: Mapping[str, str]) -> str:
    """The caution of ``busy_signs`` (of one measurement, or merged over a sweep's shapes: each kind once)."""
    return (f"{BUSY_PREFIX} ({'; '.join(signs.values())}): intervals are wider and host times less certain; rerun "
            "on an idle machine for a sharper answer.")
