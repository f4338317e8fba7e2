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

from dataclasses import dataclass, field

from .backends import kernel_families, phase_backends
from .compiling import split
from .lengths import Lengths
from .results import candidates

__all__ = ["Serving", "serving_estimate", "REQUEST_GRID"]

#: the run lengths (requests) the pick is evaluated at, before the change points are narrowed down
REQUEST_GRID = tuple(m * 10 ** e for e in range(8) for m in (1, 2, 5))


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
    # a policy per phase whose phases pay differently: (per prompt length, per decode key length) met first
    first_met_phase_ms: dict[str, tuple[float, float]] = field(default_factory=dict)

    def text(self) -> list[str]:
        shape = f" (batch {self.batch}, {self.new_tokens} new tokens)" if self.batch else ""
        many = "s" if self.requests != 1 else ""
        lines = [f"For {self.requests} request{many} of this length mix{shape}: `{self.pick}`, "
                 f"{self.per_request_ms[self.pick]:.3f} ms per request ({self.first_met:.0f} shapes met first)."]
        if self.same:
            lines.append(f"{_names(self.same)} as cheap: tied at every measured length, and paying no more for "
                         "shapes met first.")
        elif self.pick in self.tied and len(self.tied) > 1:
            lines.append(f"Tied with {_names(n for n in self.tied if n != self.pick)} at every measured length: "
                         "what each pays for shapes met first decides.")
        if self.pick in self.tied and len(self.tied) > 1:
            own = [self.steady_ms[n] for n in self.tied]
            lines.append(f"Tied candidates are held to one steady cost, {min(own):.3f} ms per request (their own "
                         f"medians {min(own):.3f}-{max(own):.3f} ms, not told apart at any measured length).")
        if self.pick in self.first_met_phase_ms:
            p, d = self.first_met_phase_ms[self.pick]
            lines.append(f"`{self.pick}` pays {p:.3f} ms for each prompt length met first and {d:.3f} ms for each "
                         "decode step's key length.")
        elif self.first_met_ms.get(self.pick, 0) > 0:
            lines.append(f"`{self.pick}` pays {self.first_met_ms[self.pick]:.3f} ms for each shape met first.")
        for n, a, b in self.changes:
            lines.append(f"From about {n} requests `{b}` is cheaper than `{a}`.")
        if not self.changes:
            lines.append("The pick is the same for any number of requests.")
        if self.left_out:
            lines.append(f"Not in this estimate (not measured at every length): {_names(self.left_out)}.")
        if self.outside:
            lines.append(f"Lengths {', '.join(map(str, self.outside[:5]))}"
                         + (" and more" if len(self.outside) > 5 else "")
                         + " lie outside the measured ones: their times are the nearest measured length's.")
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
    noise (at least 10 %, as the recommendation tells new-length costs); 0 where it is not."""
    g = b.generate
    if g is None or g.new_shape_step_ms is None or g.seen_shape_step_ms is None:
        return 0.0
    extra = g.new_shape_step_ms - g.seen_shape_step_ms
    return extra if extra > g.seen_shape_step_ms * max(b.noise_pct or 0.0, 10.0) / 100 else 0.0


def _first_met_costs(point) -> dict[str, tuple[float, float]]:
    """At one length, what each candidate pays for a shape met first: ``(a prompt length, a decode step's key
    length)``. It is measured on decode steps (``_first_met_cost``), and a backend is taken to pay the same for
    its prompts' shapes. Each is charged at least the most that any candidate of a kernel family it runs there
    paid (the plan cache they share was filled by the first of them): a policy per phase its prefill phase's
    families for prompts, its decode phase's for decode steps (its own measured cost is its decode steps').
    A compiled candidate is charged its own (its recompiles are its graph's, not a shared cache's)."""
    own = {b.backend: _first_met_cost(b) for b in point.backends}
    most: dict[str, float] = {}
    for b in point.backends:
        if split(b.backend)[1] is None and "=" not in b.backend:
            for f in kernel_families(b.backend, _ops(b)):
                most[f] = max(most.get(f, 0.0), own[b.backend])

    def charged(name: str, ops: tuple, base: float) -> float:
        # a phase that forces no family (``auto``) is read off all the candidate's ops, both phases'
        return max([base, *(most.get(f, 0.0) for f in kernel_families(name, ops))])

    out = {}
    for b in point.backends:
        name, c = b.backend, own[b.backend]
        if split(name)[1] is not None:
            out[name] = (c, c)
        elif "=" in name:
            prefill, decode = phase_backends(name)
            out[name] = (charged(prefill, _ops(b), 0.0), charged(decode, _ops(b), c))
        else:
            out[name] = (charged(name, _ops(b), c),) * 2
    return out


def _ops(b) -> tuple:
    return tuple(b.attn_ops) + tuple(b.attn_kernel_names)


def _costs(points, lengths: Lengths, new_tokens: int):
    names = [n for n in candidates(points[0].ranking) if all(n in p.ranking for p in points)]
    paid = [_first_met_costs(p) for p in points]
    steady, first = {}, {}
    for name in names:
        per = sorted((p.seq, _per_prompt(next(b for b in p.backends if b.backend == name))) for p in points)
        if any(t is None for _, t in per):
            continue
        steady[name] = sum(w * _at(per, n) for n, w in lengths.weights)
        # where a shape is new to the process: a later length may meet shapes an earlier one's runs cached
        costs = [c[name] for c in paid if name in c]
        first[name] = (max(c[0] for c in costs), max(c[1] for c in costs))
    return steady, first


def _tied(points, steady: dict) -> tuple[str, ...]:
    """The candidates tied for the pick at every measured length (each length's own ties)."""
    common = [n for n in candidates(points[0].ranking) if n in steady and all(n in p.ties for p in points)]
    return tuple(common) if len(common) > 1 else ()


def _first_share(first: dict, lengths: Lengths, new_tokens: int, requests: int) -> dict[str, float]:
    """Each candidate's cost of the shapes a run of ``requests`` meets first, per shape met (ms): its prompt
    lengths' and its decode steps' weighed by how many of each the run meets."""
    met_p, met_d = lengths.first_met_phases(requests, new_tokens)
    met = met_p + met_d
    return {n: (p * met_p + d * met_d) / met if met else d for n, (p, d) in first.items()}


def _cheapest(steady, first, lengths: Lengths, new_tokens: int, requests: int) -> str:
    met = lengths.first_met(requests, new_tokens)
    share = _first_share(first, lengths, new_tokens, requests)
    cost = {n: steady[n] + share[n] * met / requests for n in steady}
    return min(cost, key=cost.get)


def _held(steady: dict, tied: tuple[str, ...]) -> dict:
    """The steady costs the pick is made on: the tied candidates' at their common (lowest) median."""
    if not tied:
        return steady
    low = min(steady[n] for n in tied)
    return {n: (low if n in tied else ms) for n, ms in steady.items()}


def serving_estimate(points, lengths: Lengths, requests: int, new_tokens: int) -> Serving | None:
    """The estimate over a generate sweep's ``points`` (each a prompt length, ``new_tokens`` each); None
    where no backend ran at every length."""
    if requests < 1:
        raise ValueError(f"requests must be at least 1, got {requests}")
    points = sorted(points, key=lambda p: p.seq)
    if not points:
        return None
    steady, first = _costs(points, lengths, new_tokens)
    if not steady:
        return None
    tied = _tied(points, steady)
    held = _held(steady, tied)
    pick = _cheapest(held, first, lengths, new_tokens, requests)
    changes, prev_n, prev = [], 1, _cheapest(held, first, lengths, new_tokens, 1)
    for n in REQUEST_GRID[1:]:
        now = _cheapest(held, first, lengths, new_tokens, n)
        if now != prev:
            lo, hi = prev_n, n  # the smallest run length with the new pick, by bisection
            while hi - lo > 1:
                mid = (lo + hi) // 2
                lo, hi = (lo, mid) if _cheapest(held, first, lengths, new_tokens, mid) == now else (mid, hi)
            changes.append((hi, prev, now))
        prev_n, prev = n, now
    measured = (points[0].seq, points[-1].seq)
    outside = tuple(n for n in lengths.lengths if not measured[0] <= n <= measured[1])
    met = lengths.first_met(requests, new_tokens)
    share = _first_share(first, lengths, new_tokens, requests)
    same = tuple(n for n in tied if n != pick and share[n] <= share[pick])
    # what a request costs each: the steady cost the pick was made on (tied candidates held to one), and
    # its share of the shapes met first; ``steady_ms`` keeps each one's own median
    per_request = {n: held[n] + share[n] * met / requests for n in steady}
    # measured somewhere but not everywhere (a candidate refused at every length was never in the running)
    seen = dict.fromkeys(n for p in points for n in candidates(p.ranking))
    return Serving(requests, new_tokens, per_request, steady, {n: share[n] for n in steady}, met, pick,
                   tuple(changes), outside, tied, same if pick in tied else (),
                   tuple(n for n in seen if n not in steady), points[0].batch,
                   {n: first[n] for n in steady if first[n][0] != first[n][1]})
