"""The recommendation: one or two sentences that name the choice, by how much it wins, what it assumes
and when it flips. Pure functions over results."""

from __future__ import annotations

from .backends import kernel_family
from .compiling import split
from .results import BackendResult, candidates

__all__ = ["recommend", "recommend_sweep", "EAGER_NOTE"]

#: why eager is ranked but never recommended
EAGER_NOTE = ("`eager` (the model's own transformers attention) is ranked as the reference the others are "
              "checked against, never recommended: it is the unfused baseline a backend replaces.")


def _pick_text(best: BackendResult) -> str:
    if best.backend != "auto":
        return f"`{best.backend}`"
    fam = kernel_family(best.attn_ops)
    return f"`auto` (SDPA's own choice, which ran {fam} here)" if fam else "`auto` (SDPA's own choice)"


def _unit(workload: dict | None) -> str:
    mode = (workload or {}).get("mode")
    return {"generate": "for the whole generate workload", "train": "per training step"}.get(mode, "per forward")


def _ties(best: BackendResult, others: list[BackendResult]) -> tuple[list, list]:
    """Of ``others`` (in ranking order), those within measured noise of ``best``: a leading run of them, so
    that no backend is a tie while a faster one is beaten (a noisier, slower one is not closer)."""
    ties = []
    for o in others:
        if (o.time_ms - best.time_ms) / best.time_ms * 100 > max(best.noise_pct or 0.0, o.noise_pct or 0.0, 1.0):
            break
        ties.append(o)
    return ties, others[len(ties):]


def recommend(results: list[BackendResult], ranking: list[str], workload: dict | None = None) -> str:
    """The choice for this workload, by how much it wins, near-ties within measured noise; for a
    generate workload also when the choice flips and which phase decided it."""
    by = {b.backend: b for b in results}
    picks = candidates(ranking)
    if not picks:
        if "eager" in ranking:
            return ("Only `eager` ran: the model's own attention is the reference the others are checked against, "
                    "never recommended; name the backends to choose among.")
        return "No backend ran these inputs with acceptable numerics; see the reasons in the report."
    best = by[picks[0]]
    text = f"Use {_pick_text(best)}: {best.time_ms:.3f} ms {_unit(workload)}"
    ties, beaten = _ties(best, [by[n] for n in picks[1:]])
    if beaten:
        nxt = beaten[0]
        text += (f", {nxt.time_ms / best.time_ms:.2f}x faster than the next" + (" beyond the noise" if ties else "")
                 + f", `{nxt.backend}` ({nxt.time_ms:.3f} ms)")
    text += "."
    if ties:
        text += " Within measured noise of it: " + ", ".join(
            f"`{o.backend}` ({o.time_ms:.3f} ms)" for o in ties) + "; any of these is as good here."
    if best.generate is not None:
        text += _generate_text(best, [by[n] for n in picks[1:]], workload or {})
    if best.train is not None and best.train.forward_ms is not None:
        text += f" Forward {best.train.forward_ms:.3f} ms, backward {best.train.backward_ms:.3f} ms."
    flagged = [b.backend for b in results if b.ok and ((b.numerics is not None and not b.numerics.ok)
                                                       or (b.train is not None and b.train.grad_ok is False))]
    if flagged:
        text += f" Not considered, numerics beyond tolerance: {', '.join(flagged)}."
    text += _compile_text(results, picks, by, workload or {})
    if "eager" in by and by["eager"].ok:
        text += " " + EAGER_NOTE
    return text


def _pays(b: BackendResult, workload: dict) -> str:
    """When a compiled candidate's compile has paid for itself, in the workload's own steps (tokens too)."""
    n = b.compile_pays_after
    if workload.get("mode") == "generate":
        tokens = (workload.get("new_tokens") or 0) * len(workload.get("prompt_lens") or [1])
        return f"{n:.1f} generate workloads ({n * tokens:.0f} new tokens per sequence)"
    return f"{n:.0f} {'training steps' if workload.get('mode') == 'train' else 'forwards'}"


def _compile_text(results: list[BackendResult], picks: list[str], by: dict, workload: dict) -> str:
    """Compiled candidates: whether compiling changes the pick, when the compile pays for itself, and
    any compiled graph that ran another kernel than the one selected."""
    if all(b.compile is None for b in results):
        return ""
    text = ""
    compiled = [by[n] for n in picks if by[n].compile is not None]
    plain = [by[n] for n in picks if by[n].compile is None]
    if compiled and plain:
        c, u = compiled[0], plain[0]
        if split(c.backend)[0] == u.backend:
            text += f" Compiling does not change the pick: `{u.backend}` leads compiled and uncompiled."
        else:
            text += (f" Compiling changes the pick: uncompiled `{u.backend}` ({u.time_ms:.3f} ms), compiled "
                     f"`{c.backend}` ({c.time_ms:.3f} ms).")
    best = by[picks[0]] if picks else None
    if best is not None and best.compile is not None and best.compile_ms is not None:
        text += f" `{best.backend}` compiles once, {best.compile_ms / 1e3:.1f} s"
        text += (f", which has paid for itself after {_pays(best, workload)}" if best.compile_pays_after is not None
                 else "")
        text += (f"; it recompiled {best.recompiles} times while measured" if best.recompiles else "") + "."
    odd = [f"`{b.backend}`: {b.attn_mismatch}" for b in results if b.attn_mismatch]
    if odd:
        text += " What the compiled graph ran is not what was selected: " + "; ".join(odd) + "."
    return text


def _generate_text(best: BackendResult, others: list[BackendResult], workload: dict) -> str:
    g = best.generate
    text = (" Assumes the deployed lengths are those measured (prompts of "
            f"{', '.join(map(str, workload.get('prompt_lens', [])))} tokens, {workload.get('new_tokens')} new each)")
    if others:
        text += _deciding_phase(g, others[0], workload)
    text += "."
    penalty = (g.new_shape_step_ms or 0) - (g.seen_shape_step_ms or 0)
    # differences of decode steps below the workload's noise (at least 10 %) are not told as costs or flips
    margin = (g.seen_shape_step_ms or 0) * max(best.noise_pct or 0, 10.0) / 100
    if g.new_shape_step_ms is not None and g.seen_shape_step_ms is not None and penalty > margin:
        cheaper = [o for o in others if o.generate and o.generate.new_shape_step_ms is not None
                   and o.generate.new_shape_step_ms < g.new_shape_step_ms - margin]
        text += (f" `{best.backend}` is fastest once every length has been seen; until then each new key length costs "
                 f"{penalty:.3f} ms more per step")
        text += (f", so `{cheaper[0].backend}` ({cheaper[0].generate.new_shape_step_ms:.3f} ms per new-length step) "
                 "wins for workloads with many new lengths." if cheaper else ".")
    return text


def _deciding_phase(g, o: BackendResult, workload: dict) -> str:
    """Which phase gains the best backend most over the next one (time saved over the workload, from each
    phase's median); phases without measurements on both sides are left out, and no phase is said to
    decide where the best gains in none (the ranking is by each workload's fastest run, not by these)."""
    n_gen = len(workload.get("prompt_lens", [])) or 1
    steps = n_gen * max(0, (workload.get("new_tokens") or 1) - 1)
    gains = {}
    if g.ttft_ms is not None and o.generate.ttft_ms is not None:
        gains["prefill"] = (o.generate.ttft_ms - g.ttft_ms) * n_gen
    if steps and g.step_ms_p50 is not None and o.generate.step_ms_p50 is not None:
        gains["decode"] = (o.generate.step_ms_p50 - g.step_ms_p50) * steps
    if not gains:
        return ""
    told = ", ".join(f"{k} {v:+.1f} ms" for k, v in gains.items())
    phase, gain = max(gains.items(), key=lambda kv: kv[1])
    if gain <= 0 or sum(gains.values()) <= 0:
        return (f"; against `{o.backend}` the phases' medians do not show its lead ({told} over the workload): "
                "it is ranked by the whole workload's fastest run")
    return (f"; {phase} decided it against `{o.backend}` (from each phase's median, over the workload: {told}; "
            "the ranking itself is by the whole workload's fastest run)")


def _winners(point) -> tuple[str, ...]:
    """The fastest backend at one shape and those within measured noise of it."""
    by = {b.backend: b for b in point.backends}
    ranked = [by[n] for n in candidates(point.ranking) if n in by]
    if not ranked:
        return ()
    best = ranked[0]
    ties, _ = _ties(best, ranked[1:])
    return (best.backend, *(t.backend for t in ties))


def recommend_sweep(points) -> str:
    """The best backend per range of lengths (with those within noise of it), per batch size, and where
    the ranking crosses over: where no backend of one range's best is among the next range's."""
    batches = dict.fromkeys(p.batch for p in points)
    texts = [_sweep_text(sorted((p for p in points if p.batch == b), key=lambda p: p.seq), b) for b in batches]
    return " ".join(texts)


def _sweep_text(points, batch: int) -> str:
    ranges: list[list] = []
    for p in points:
        w = _winners(p)
        if ranges and set(ranges[-1][2]) & set(w):
            ranges[-1][1] = p
            ranges[-1][2] = tuple(n for n in ranges[-1][2] if n in w) or w
        else:
            ranges.append([p, p, w])
    parts = []
    for first, last, w in ranges:
        span = f"seq {first.seq}" if first is last else f"seq {first.seq}–{last.seq}"
        parts.append(f"{span}: " + (" ≈ ".join(f"`{n}`" for n in w) if w else "no backend with acceptable numerics"))
    text = f"Best per length at batch {batch}: " + "; ".join(parts)
    crossings = [f"between seq {a[1].seq} and {b[0].seq}, `{b[2][0]}` overtakes `{a[2][0]}`"
                 for a, b in zip(ranges, ranges[1:]) if a[2] and b[2]]
    return text + ("." if not crossings else ". Crossover " + "; ".join(crossings) + ".")
