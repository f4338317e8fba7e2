"""What a run of requests costs each backend, for the prompt lengths a deployment sees: each backend's
steady time per request at every length (between the measured lengths, linear), plus what it pays for each
shape met for the first time (a plan or a compile: its new-length steps against its seen-length steps, as
the first workload measured them, at the length where that was most: a later length may meet shapes an
earlier one cached) times how many shapes a run of that many requests meets first
(``Lengths.first_met``). Pure over a generate sweep's points.

From the medians: the estimate says which backend a run is cheapest with and at how many requests that
changes; the margins of each length's own ranking say how sure the steady part is. Backends tied at every
measured length are held to one steady cost (their medians' differences are within their own noise), so
that only what they pay for shapes met first can set them apart. A plan cache is the kernel's, not the
candidate's: candidates that ran one kernel family share it, and whichever of them met a shape first paid
for all; each is charged the most any of them paid. A policy per phase pays its prefill phase's plans on
prompt lengths met first and its decode phase's on decode steps'.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from . import options
from .backends.registry import kernel_family
from .lengths import Lengths
from .options import MAX_REQUESTS
from .results import candidates
from .words import counted

__all__ = ["Serving", "serving_estimate", "REQUEST_GRID", "MAX_REQUESTS"]


@dataclass(frozen=True)
class Serving:
    """A run of ``requests`` requests of ``lengths``, ``new_tokens`` each: every candidate's expected time
    per request, its cost per shape met first, the shapes such a run meets first, the pick, and where the
    pick changes with the run's length (``(requests, from, to)``)."""

    requests: int
    new_tokens: int
    per_request_ms: dict[str, float]  # the pick's basis: tied candidates' steady part held to one
    steady_ms: dict[str, float]  # each candidate's own steady median per request
    first_met_ms: dict[str, float]  # per shape met first, in this run's mix of prompt and decode shapes
    first_met: float
    pick: str
    changes: tuple[tuple[int, str, str], ...] = ()
    outside: tuple[int, ...] = ()  # lengths of the distribution outside the measured ones
    tied: tuple[str, ...] = ()  # tied at every measured length: one steady cost
    same: tuple[str, ...] = ()  # as cheap as the pick for this run: tied, and paying no more for shapes met first
    left_out: tuple[str, ...] = ()  # candidates not measured at every length (failed, refused, or added at some)
    batch: int | None = None  # the batch size of the points it was made from (a sweep may have several)
    # where a candidate's phases pay differently (a policy per phase, a compiled decode): per shape met first
    # on prompts and on decode steps (``(prompt, step)``), and how many of each this run meets
    first_met_phase_ms: dict[str, tuple[float, float]] = field(default_factory=dict)
    phase_shapes: dict[str, tuple[float, float]] = field(default_factory=dict)
    # candidate -> the backend its prompts run, where what that one pays per shape met first was not measured
    unpriced: dict[str, str] = field(default_factory=dict)
    # what a candidate pays once per run (ms): a compiled one's compiles
    once_ms: dict[str, float] = field(default_factory=dict)

    def text(self) -> list[str]:
        # a request is one generate of the measured batch: at batch 2, two prompts of its length at once
        shape = "" if not self.batch else (
            f" (each one generate of a batch of {self.batch}, {counted(self.new_tokens, 'new token')})"
            if self.batch > 1 else f" (batch 1, {counted(self.new_tokens, 'new token')})")
        lines = [f"For {counted(self.requests, 'request')} of this length mix{shape}: `{self.pick}`, "
                 f"{self.per_request_ms[self.pick]:.3f} ms per request "
                 f"({counted(round(self.first_met), 'shape')} met first)."]
        if self.same:
            lines.append(f"{_names(self.same)} as cheap: tied at every measured length, and paying no more for "
                         "shapes met first.")
        elif self.pick in self.tied and len(self.tied) > 1:
            lines.append(f"Tied with {_names(n for n in self.tied if n != self.pick)} at every measured length: "
                         "what each pays for shapes met first (and any compile) decides.")
        if self.pick in self.tied and len(self.tied) > 1:
            own = [self.steady_ms[n] for n in self.tied]
            lines.append(f"Tied candidates are held to one steady cost, {min(own):.3f} ms per request (their own "
                         f"medians {min(own):.3f}-{max(own):.3f} ms, not told apart at any measured length).")
        lines += self._first_met_lines()
        for n, a, b in self.changes:
            lines.append(f"From about {counted(n, 'request')} `{b}` is cheaper than `{a}`.")
        if not self.changes:
            lines.append("The pick is the same for any number of requests.")
        if self.left_out:
            lines.append(f"Not in this estimate (not measured at every length): {_names(self.left_out)}.")
        if self.outside:
            lines.append(f"Lengths {', '.join(map(str, self.outside[:5]))}"
                         + (" and more" if len(self.outside) > 5 else "")
                         + " lie outside the measured ones: their times are the nearest measured length's.")
        return lines

    def _first_met_lines(self) -> list[str]:
        """What the pick pays for shapes met first: per phase where its phases pay differently (with how many
        shapes of each, so that the figures add up), and whether its prefill plans were priced at all."""
        lines = []
        if self.pick in self.first_met_phase_ms:
            (p, d), (on_p, on_d) = self.first_met_phase_ms[self.pick], self.phase_shapes[self.pick]
            parts = [f"{ms:.3f} ms for each {what} it meets first ({k:.1f} in this run)"
                     for ms, k, what in ((p, on_p, "prompt length"), (d, on_d, "decode shape")) if ms and k]
            if parts:  # (what it pays nothing on adds nothing)
                lines.append(f"`{self.pick}` pays {' and '.join(parts)}.")
        elif self.first_met_ms.get(self.pick, 0) > 0:
            lines.append(f"`{self.pick}` pays {self.first_met_ms[self.pick]:.3f} ms for each shape met first.")
        if self.once_ms.get(self.pick):
            lines.append(f"`{self.pick}` pays its compiles once per run: {self.once_ms[self.pick]:.3f} ms.")
        if self.pick in self.unpriced:
            lines.append(f"`{self.pick}`'s prompts run `{self.unpriced[self.pick]}`, which was not measured alone: "
                         "what it pays on prompt lengths met first is not in this estimate.")
        return lines


def _names(names) -> str:
    return ", ".join(f"`{n}`" for n in names)


def _at(points: list[tuple[int, float]], n: int) -> float:
    """Linear between the measured ``(length, ms)`` points; the nearest one's outside them."""
    if n <= points[0][0]:
        return points[0][1]
    for (a, ta), (b, tb) in zip(points, points[1:]):
        if n <= b:
            return ta + (tb - ta) * (n - a) / (b - a)
    return points[-1][1]


def _per_prompt(b) -> float | None:
    """One request's steady time at a point: the backend's time over its prompts."""
    width = len(b.time_rounds_ms[0]) if b.time_rounds_ms else 0
    return b.time_ms / width if b.time_ms and width else None


def _first_met_cost(b) -> float:
    """What a backend's step paid more for a key length met first (ms), where that is beyond the step's own
    noise (at least 10 %, as the recommendation tells new-length costs); 0 where it is not; NaN where the
    figures are not finite (a broken measurement: the candidate is left out)."""
    g = b.generate
    if g is None or g.new_shape_step_ms is None or g.seen_shape_step_ms is None:
        return 0.0
    extra = g.new_shape_step_ms - g.seen_shape_step_ms
    if not math.isfinite(extra) or not math.isfinite(g.seen_shape_step_ms):
        return math.nan
    return extra if extra > g.seen_shape_step_ms * max(b.noise_pct or 0.0, 10.0) / 100 else 0.0


@dataclass(frozen=True)
class _Charge:
    """What a candidate pays per shape met first: on a prompt of more than ``short`` tokens (``prompt``), and
    on a decode step's new key length or a prompt of at most ``short`` tokens (``step``: a policy's decode
    phase runs those); ``prompts_by``: the backend its prompts run where what that one pays was not measured
    (it ran alone nowhere), else None; ``once``: what it pays once per run (a compiled candidate's compiles)."""

    prompt: float
    step: float
    short: int = 0
    prompts_by: str | None = None
    once: float = 0.0


def _keys(name: str, ops: tuple, other: str | None = None) -> tuple[str, ...]:
    """What a backend's cost per shape met first is shared through: a forced SDPA backend's kernel family
    (its plan cache); ``auto``'s read off the ops (in a policy, less the family its other phase forces, where
    anything is left); any other backend its own (flex's compiles, a user kernel's own caches)."""
    if name != "auto":  # a forced backend's name is its family's
        return (name,)
    present = tuple(dict.fromkeys(f for o in ops if (f := kernel_family([o])) is not None))
    return tuple(f for f in present if f != other) or present


def _first_met_costs(point) -> dict[str, _Charge]:
    """At one length, what each candidate pays per shape met first. Measured on decode steps
    (``_first_met_cost``); a backend is taken to pay the same on its prompts. Each is charged at least the most
    that any candidate sharing its cache paid alone (``_keys``: the plan cache a kernel family shares was
    filled by the first of them): a policy per phase its prefill phase's on prompts, its decode phase's on
    decode steps. A compiled candidate (a generate compiles its decode steps only) is charged its backend's on
    prompts, which run uncompiled, and its compiles once per run (``_compiles``, summed over the lengths): a
    graph of dynamic shapes meets later key lengths without compiling. What a backend that ran alone nowhere
    pays on prompts is not known: ``prompts_by``."""
    own = {b.backend: _first_met_cost(b) for b in point.backends}
    most: dict[str, float] = {}
    for b in point.backends:  # candidates measured alone, uncompiled, with a finite figure
        name = b.backend
        if b.status == "ok" and b.candidate.compile is None and b.candidate.backend is not None \
                and math.isfinite(own[name]):
            for k in _keys(name, _ops(b)):
                most[k] = max(most.get(k, 0.0), own[name])

    def charged(keys, base: float) -> float:
        return max([base, *(most.get(k, 0.0) for k in keys)])

    out = {}
    for b in point.backends:
        name, c = b.backend, own[b.backend]
        cand = b.candidate
        if cand.policy is not None:
            prefill, decode, short = cand.policy.prefill, cand.policy.decode, cand.policy.decode_max_query
            kp, kd = _keys(prefill, _ops(b), decode), _keys(decode, _ops(b), prefill)
            shared = bool(set(kp) & set(kd))  # one cache: the policy's own steps paid for its prompts too
            unknown = prefill if not shared and not set(kp) & set(most) else None
            out[name] = _Charge(charged(kp, c if shared else 0.0), charged(kd, c), short, unknown)
        elif cand.compile is not None:
            base = str(cand.uncompiled)
            kp = _keys(base, _ops(b))
            out[name] = _Charge(charged(kp, 0.0), 0.0, 0, None if set(kp) & set(most) else base, _compiles(b))
        else:
            cost = charged(_keys(name, _ops(b)), c)
            out[name] = _Charge(cost, cost)
    return out


def _compiles(b) -> float:
    """What a compiled candidate's compiles cost at a point (ms): its ``compile_ms``, the Compiled table's (its
    first workload's host time over a steady one's: every compile it made there, wherever in a generate it
    fell); about 0 where it made none (the process compiled it at an earlier point); NaN where not finite."""
    ms = b.compile_ms
    return 0.0 if ms is None else (max(0.0, ms) if math.isfinite(ms) else math.nan)


def _ops(b) -> tuple:
    return tuple(b.attn_ops) + tuple(b.attn_kernel_names)


def _costs(points, lengths: Lengths):
    names = [n for n in candidates(points[0].ranking) if all(n in p.ranking for p in points)]
    paid = [_first_met_costs(p) for p in points]
    steady, first = {}, {}
    for name in names:
        per = sorted((p.seq, _per_prompt(next(b for b in p.backends if b.backend == name))) for p in points)
        charges = [c[name] for c in paid if name in c]
        if any(t is None or not math.isfinite(t) for _, t in per) or \
                not all(math.isfinite(c.prompt) and math.isfinite(c.step) and math.isfinite(c.once) for c in charges):
            continue
        steady[name] = sum(w * _at(per, n) for n, w in lengths.weights)
        # where a shape is new to the process: a later length may meet shapes an earlier one's runs cached
        first[name] = _Charge(max(c.prompt for c in charges), max(c.step for c in charges), charges[0].short,
                              next((c.prompts_by for c in charges if c.prompts_by), None),
                              sum(c.once for c in charges))  # (each length's compiles were new to the process)
    return steady, first


class _Runs:
    """The shapes runs of requests meet first, for many run lengths at once: each prompt length's expected
    count and the decode steps' total (``Lengths.first_met_phases``, split by prompt length)."""

    def __init__(self, lengths: Lengths, new_tokens: int, static: bool = False):
        self.lens = torch.tensor(lengths.lengths, dtype=torch.float64)  # ascending
        self.weights = torch.tensor([w for _, w in lengths.weights], dtype=torch.float64)
        segments = lengths.step_segments(new_tokens, static)
        self.counts = torch.tensor([k for k, _ in segments], dtype=torch.float64)
        self.chances = torch.tensor([p for _, p in segments], dtype=torch.float64)

    def met(self, runs) -> tuple[torch.Tensor, torch.Tensor]:
        """``(prompts [runs, lengths + 1], steps [runs])`` for each run length in ``runs``: the prompt lengths
        met first, cumulated (column i: the i shortest lengths; column 0: none), and the decode steps'."""
        r = torch.as_tensor(runs, dtype=torch.float64)[:, None]
        prompts = -torch.expm1(r * torch.log1p(-self.weights))  # 1 - (1 - w)^r, exact for tiny w
        cum = torch.nn.functional.pad(prompts.cumsum(-1), (1, 0))
        steps = (self.counts * -torch.expm1(r * torch.log1p(-self.chances))).sum(-1)
        return cum, steps

    def split(self, charge: _Charge, cum: torch.Tensor, steps: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The shapes a candidate pays ``prompt`` on and those it pays ``step`` on, per run length."""
        shorter = int(torch.searchsorted(self.lens, float(charge.short), right=True))  # prompts of <= short
        return cum[:, -1] - cum[:, shorter], steps + cum[:, shorter]

    def costs(self, steady: dict, first: dict, runs) -> tuple[list[str], torch.Tensor]:
        """Each candidate's expected time per request (ms) for each run length: ``[candidates, runs]``."""
        parts = []
        for r in torch.as_tensor(runs, dtype=torch.float64).split(256):  # a mix of many lengths: bounded memory
            cum, steps = self.met(r)
            rows = []
            for n in steady:
                on_prompt, on_step = self.split(first[n], cum, steps)
                rows.append(steady[n] + (first[n].prompt * on_prompt + first[n].step * on_step + first[n].once) / r)
            parts.append(torch.stack(rows))
        return list(steady), torch.cat(parts, dim=1)


def _request_grid(top: int) -> list[int]:
    """Every run length to 100, then every 2 % or so up to ``top``."""
    grid, n = list(range(1, 101)), 100.0
    while n < top:
        n *= 1.02
        grid.append(min(int(n), top))
    return sorted(set(grid))


#: the run lengths (requests) the pick is evaluated at, before each change point is narrowed down
REQUEST_GRID = tuple(_request_grid(MAX_REQUESTS))


def _changes(runs: _Runs, steady: dict, first: dict, requests: int) -> list[tuple[int, str, str]]:
    """Where the cheapest candidate changes with the run's length, ``(requests, from, to)``: picks on the grid
    and at ``requests`` (so that the changes stated agree with the pick made there), each change then narrowed
    down to the smallest run length with the new pick. A pick that holds over less than about 2 % of the run
    length, away from ``requests``, can fall between two grid points."""
    grid = sorted({*REQUEST_GRID, requests})
    names, costs = runs.costs(steady, first, grid)
    picks = [names[i] for i in costs.argmin(0).tolist()]

    def pick(n: int) -> str:
        return names[int(runs.costs(steady, first, [n])[1][:, 0].argmin())]

    out, prev = [], picks[0]
    for (lo, _), (hi, now) in zip(zip(grid, picks), zip(grid[1:], picks[1:])):
        while now != prev:  # the smallest run length in (lo, hi] whose pick is not ``prev``
            a, b = lo, hi
            while b - a > 1:
                mid = (a + b) // 2
                a, b = (a, mid) if pick(mid) != prev else (mid, b)
            new = pick(b)
            out.append((b, prev, new))
            prev, lo = new, b
    return out


def _tied(points, steady: dict) -> tuple[str, ...]:
    """The candidates tied for the pick at every measured length (each length's own ties)."""
    common = [n for n in candidates(points[0].ranking) if n in steady and all(n in p.ties for p in points)]
    return tuple(common) if len(common) > 1 else ()


def _held(steady: dict, tied: tuple[str, ...]) -> dict:
    """The steady costs the pick is made on: the tied candidates' at their common (lowest) median."""
    if not tied:
        return steady
    low = min(steady[n] for n in tied)
    return {n: (low if n in tied else ms) for n, ms in steady.items()}


def serving_estimate(points, lengths: Lengths, requests: int, new_tokens: int,
                     cache: str = "dynamic") -> Serving | None:
    """The estimate over a generate sweep's ``points`` (each a prompt length, ``new_tokens`` each, with the KV
    ``cache`` measured); None where no backend ran at every length."""
    options.check_requests(requests)
    requests = int(requests)
    points = sorted(points, key=lambda p: p.seq)
    if not points:
        return None
    steady, first = _costs(points, lengths)
    if not steady:
        return None
    tied = _tied(points, steady)
    held = _held(steady, tied)
    runs = _Runs(lengths, new_tokens, static=cache == "static")
    # what a request costs each: the steady cost the pick is made on (tied candidates held to one), and its
    # share of the shapes met first; ``steady_ms`` keeps each one's own median
    names, costs = runs.costs(held, first, [requests])
    per_request = dict(zip(names, costs[:, 0].tolist()))
    pick = names[int(costs[:, 0].argmin())]
    cum, steps = runs.met([requests])
    met = float(cum[0, -1] + steps[0])
    shapes = {n: tuple(float(x) for x in runs.split(first[n], cum, steps)) for n in names}
    per_shape = {n: first[n].prompt * shapes[n][0] + first[n].step * shapes[n][1] for n in names}
    total = {n: per_shape[n] + first[n].once for n in names}
    same = tuple(n for n in tied if n != pick and total[n] <= total[pick])
    phased = [n for n in names if first[n].prompt != first[n].step]
    measured = (points[0].seq, points[-1].seq)
    outside = tuple(n for n in lengths.lengths if not measured[0] <= n <= measured[1])
    # measured somewhere but not everywhere (a candidate refused at every length was never in the running)
    seen = dict.fromkeys(n for p in points for n in candidates(p.ranking))
    return Serving(requests, new_tokens, per_request, steady,
                   {n: per_shape[n] / met if met else first[n].step for n in names}, met, pick,
                   tuple(_changes(runs, held, first, requests)), outside, tied, same if pick in tied else (),
                   tuple(n for n in seen if n not in steady), points[0].batch,
                   {n: (first[n].prompt, first[n].step) for n in phased}, {n: shapes[n] for n in phased},
                   {n: first[n].prompts_by for n in names if first[n].prompts_by},
                   {n: first[n].once for n in names if first[n].once})
