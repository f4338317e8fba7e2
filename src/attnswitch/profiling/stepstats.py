"""What a generate workload and a training step add to a backend's result, from the measured runs.

Pure functions over ``capture.Run`` records (host times, forwards from the ``ForwardClock``, attention
calls with their key lengths); nothing here runs a model.
"""

from __future__ import annotations

from ..candidate import Candidate, Policy
from ..kinds import kind_of
from ..results import GenerateStats, SlowCall, TrainStats
from ..stats import median, percentile

__all__ = ["mode_fields", "generate_stats", "train_stats", "split_generates", "prompt_units", "policy_candidate",
           "SLOW_FACTOR", "SLOW_MIN_US"]

#: an attention call is slow when its host time is this many times the steady call's of its prompt and phase,
#: and this much more
SLOW_FACTOR = 4.0
SLOW_MIN_US = 50.0
_SLOW_KEPT = 20


def mode_fields(workload, cold, steady: list, rss_grown_mb: float | None) -> dict:
    """``{"generate": GenerateStats}`` or ``{"train": TrainStats}`` for those workloads, else nothing."""
    if workload is None or not steady:
        return {}
    kind = kind_of(workload)
    if kind.generates:
        return {"generate": generate_stats(workload, cold, steady, rss_grown_mb)}
    if kind.grads:
        return {"train": train_stats(workload, steady)}
    return {}


def split_generates(forwards: list) -> list[list]:
    """The forwards of one run, one list per generate: each starts with its prefill (more than one
    query token; an encoder-decoder's first decoder step, ``Forward.first``), then one decode forward per new
    token."""
    out: list[list] = []
    for f in forwards:
        if f.q_len > 1 or f.first or not out:
            out.append([])
        out[-1].append(f)
    return out


def _began(gen: list) -> float:
    """When a generate began: its first forward's start, or its encoder's (an encoder-decoder's)."""
    return gen[0].began if gen[0].began is not None else gen[0].host_start


def _ttft_ms(gen: list) -> float:
    """Time to first token: from the generate's beginning (its encoder, for an encoder-decoder) to the start of
    the forward after the first (when the first token is there)."""
    return (gen[1].host_start - _began(gen)) * 1e3


def _intervals_ms(gen: list) -> list[float]:
    # wall time between decode steps: generate waits for each token before the next forward starts
    return [(b.host_start - a.host_start) * 1e3 for a, b in zip(gen[1:], gen[2:])]


def prompt_units(forwards: list, end_s: float,
                 start_s: float | None = None) -> tuple[list[float], dict[str, list[float]]]:
    """The forwards of one generate workload (clocked, ``end_s`` its host end; ``start_s`` its start, where
    the first prompt's time starts before its first forward: an encoder-decoder's encoder) as per-prompt
    units (ms): each prompt's time from its prefill to the next prompt's (the last: to ``end_s``), its decode steps
    taken at their median, so that a step the machine delayed moves a median, not the unit; and the
    figures of its decode steps: time to first token, steps (wall time between decode forwards), host
    and GPU time per decode forward."""
    gens = split_generates(forwards)
    units: list[float] = []
    figures: dict[str, list[float]] = {"ttft": [], "interval": [], "host": [], "gpu": []}
    for i, gen in enumerate(gens):
        stop = _began(gens[i + 1]) if i + 1 < len(gens) else end_s
        steps = _intervals_ms(gen)
        span = (stop - (start_s if i == 0 and start_s is not None else _began(gen))) * 1e3
        units.append(span - sum(steps) + len(steps) * median(steps) if steps else span)
        if len(gen) > 1:
            figures["ttft"].append(_ttft_ms(gen))
        figures["interval"] += steps
        figures["host"] += [(f.host_end - f.host_start) * 1e3 for f in gen[1:]]
        figures["gpu"] += [g for f in gen[1:] if (g := f.gpu_ms()) is not None]
    return units, figures


def _new_shape_steps(cold) -> tuple[list[float], list[float], list[tuple[int, int]]]:
    """First-workload decode intervals whose forward met a key length (in its phase) for the first time, and the
    rest. The first generate's are neither where later ones meet new lengths: every length is new there, and so is
    everything else (allocations, caches, the first calls of each op), which its new lengths would be charged
    with; later prompts, longer by a quarter of the new tokens each, meet new lengths at their ends. Where none
    does (prompts a token apart, one prompt), the first generate's steps after its first are the new ones. A
    compiled step records no attention call: it is new where Dynamo compiled while it ran (a first shape, a
    recompile; a graph of dynamic shapes meets later lengths without one), and seen otherwise, in every
    generate. Also where the new ones were: ``(generate, step)`` (none for the fallback)."""
    seen: set[tuple[bool, int]] = set()  # (a prefill's, key length)
    new, old, first, at = [], [], [], []
    for k, gen in enumerate(split_generates(cold.forwards)):
        for i, f in enumerate(gen):
            # a shape is a key length in its phase: a decode step (one query) at a prefill's key length is new,
            # as a kernel's plans see it, and as the length mix counts shapes (a static cache's decode steps meet
            # one, the cache's, which its prefill met before them)
            lens = {(f.q_len > 1, a[2]) for a in cold.attn[f.calls_before:f.calls_after]}
            fresh = bool(lens - seen) if lens else bool(f.graphs)
            seen |= lens
            if not 1 <= i < len(gen) - 1:
                continue
            step = (gen[i + 1].host_start - f.host_start) * 1e3
            if k == 0 and lens:
                first += [step] if i > 1 else []  # (the first decode step of all: the warm-up's most)
            else:
                (new if fresh else old).append(step)
                at += [(k, i)] if fresh else []
    return (new, old, at) if new else (first, old, [])


def _same_steps(steady: list, at: list[tuple[int, int]]) -> list[float]:
    """The steady runs' decode intervals at the places ``at`` (``(generate, step)``): those steps once warm."""
    out = []
    for r in steady:
        gens = split_generates(r.forwards)
        out += [(gens[k][i + 1].host_start - gens[k][i].host_start) * 1e3 for k, i in at
                if k < len(gens) and i + 1 < len(gens[k])]
    return out


def _steady_call_us(steady: list) -> dict[tuple[int, bool], float]:
    """The steady attention call's host time (µs) per prompt and phase (``(prompt, decodes)``): a prefill's
    calls hold its whole prompt, a decode step's one token, so each is compared with its own."""
    calls: dict[tuple[int, bool], list[float]] = {}
    for r in steady:
        for p, gen in enumerate(split_generates(r.forwards)):
            for step, f in enumerate(gen):
                calls.setdefault((p, step > 0), []).extend(a[1] * 1e6 for a in r.attn[f.calls_before:f.calls_after])
    return {k: median(v) for k, v in calls.items() if v}


def _slow_calls(cold, steady_us: dict[tuple[int, bool], float]) -> list[SlowCall]:
    slow = []
    for p, gen in enumerate(split_generates(cold.forwards)):
        for step, f in enumerate(gen):
            base = steady_us.get((p, step > 0))
            if not base:
                continue
            threshold = max(SLOW_FACTOR * base, base + SLOW_MIN_US)
            slow += [SlowCall(p, step, where, dt * 1e6, kv, base)
                     for where, dt, kv in cold.attn[f.calls_before:f.calls_after] if dt * 1e6 > threshold]
    return slow


def generate_stats(workload, cold, steady: list, rss_grown_mb: float | None) -> GenerateStats:
    """Per-step latencies, time to first token, and what new key lengths cost, from measured generates."""
    gens = [g for r in steady for g in split_generates(r.forwards)]
    decode = [f for g in gens for f in g[1:]]
    intervals = [x for g in gens for x in _intervals_ms(g)]
    ttft = [_ttft_ms(g) for g in gens if len(g) > 1]
    new, old, at = _new_shape_steps(cold)
    if workload.generation.cache == "static" and at:
        # a static cache's decode steps meet one shape, the cache's, at each generate's first decode step, which
        # is slower than later ones warm too: set against those same steps once warm, not later ones
        old = _same_steps(steady, at) or old
    slow = _slow_calls(cold, _steady_call_us(steady))
    gpu = [f.gpu_ms() for f in decode if f.start is not None]
    g = workload.generation
    tokens = g.new_tokens * len(g.prompt_lens) * workload.prompts[0]["input_ids"].shape[0]
    first_steady = split_generates(steady[0].forwards)[0] if steady[0].forwards else []
    first_cold = split_generates(cold.forwards)[0] if cold.forwards else []
    return GenerateStats(
        ttft_ms=median(ttft), step_ms_p50=percentile(intervals, 50), step_ms_p90=percentile(intervals, 90),
        step_ms_p99=percentile(intervals, 99), step_host_ms=median((f.host_end - f.host_start) * 1e3 for f in decode),
        step_gpu_ms=median(gpu), tokens=tokens, cold_e2e_ms=cold.host_s * 1e3,
        new_shape_step_ms=median(new), seen_shape_step_ms=median(old), new_shape_steps=len(new),
        seen_shape_steps=len(old), slow_attn_calls=len(slow), slow_calls=tuple(slow[:_SLOW_KEPT]),
        plan_cache_host_mb=rss_grown_mb,
        step_times_ms=tuple(_intervals_ms(first_steady)), cold_step_times_ms=tuple(_intervals_ms(first_cold)))


def train_stats(workload, steady: list) -> TrainStats:
    """Forward and backward time of a training step: the step's start to the forward's end (the loss
    computed), then to the step's end; CUDA events on a GPU, the host clock on a CPU (the device is idle
    at each step's start and the backward returns when its work is done)."""
    fwd, bwd = [], []
    for r in steady:
        if not r.forwards:
            continue
        f = r.forwards[0]
        if r.start is not None and f.end is not None:
            fwd.append(r.start.elapsed_time(f.end))
            bwd.append(f.end.elapsed_time(r.end))
        else:
            fwd.append((f.host_end - f.host_start) * 1e3)
            bwd.append((r.host_s - (f.host_end - f.host_start)) * 1e3)
    return TrainStats(loss=workload.loss, forward_ms=median(fwd), backward_ms=median(bwd))


def policy_candidate(results: list) -> str | None:
    """When the backend fastest to the first token and the one with the fastest decode steps differ, the
    policy that runs each in its phase (``prefill=A/decode=B``), as a candidate of its own."""
    ran = [b for b in results if b.ok and b.generate is not None and b.candidate.policy is None]
    timed = [b for b in ran if b.generate.ttft_ms is not None and b.generate.step_ms_p50 is not None]
    if len(timed) < 2:
        return None
    prefill = min(timed, key=lambda b: b.generate.ttft_ms).backend
    decode = min(timed, key=lambda b: b.generate.step_ms_p50).backend
    return None if prefill == decode else str(Candidate(Policy(prefill, decode)))
