"""The recommendation: the answer and its margin on the first line, then the reasons, one short line
each. Pure functions over results and their ``ranking.Verdict``."""

from __future__ import annotations

from .backends import kernel_families, kernel_family
from .candidate import Candidate
from .ranking import Verdict
from .results import BackendResult, candidates
from .stats import LEVEL

__all__ = ["recommend", "recommend_sweep", "EAGER_NOTE", "ANSWER_WIDTH"]

#: why eager is ranked but never recommended
EAGER_NOTE = "`eager` (the model's own transformers attention) is the reference: ranked, never recommended."
#: the answer line's most characters
ANSWER_WIDTH = 120
_LISTED = 4  # beaten backends named in the reasons


def _name(b: BackendResult) -> str:
    if b.backend != "auto":
        return f"`{b.backend}`"
    fam = kernel_family(b.attn_ops)
    return f"`auto` (ran {fam})" if fam else "`auto`"


def _unit(workload: dict | None) -> str:
    mode = (workload or {}).get("mode")
    return {"generate": "per generate workload", "train": "per training step"}.get(mode, "per forward")


def _answer(by: dict[str, BackendResult], v: Verdict, workload: dict | None) -> str:
    pick = by[v.pick]
    t = f"{pick.time_ms:.3f} ms {_unit(workload)}"
    if len(v.ties) > 1:
        names = [_name(by[n]) for n in v.ties]
        for shown in range(len(names), 0, -1):
            more = len(names) - shown
            text = (f"Tie: {' ≈ '.join(names[:shown])}" + (f" and {more} more" if more else "")
                    + f" at {t}, not told apart: any is as good here.")
            if len(text) <= ANSWER_WIDTH:
                return text
        return text
    beaten = v.beaten
    if not beaten:
        return f"Use {_name(pick)}: {t}, the only backend here that ran with acceptable numerics."
    m = v.margins.get(beaten[0])
    margin = f", {m.text()} faster than `{beaten[0]}`" if m is not None else ""
    return f"Use {_name(pick)}: {t}{margin}."


def _reasons(by: dict[str, BackendResult], v: Verdict) -> list[str]:
    lines = []
    tied = [n for n in v.ties[1:] if n in v.margins]
    if tied:
        lines.append(f"Not told apart from `{v.pick}`: " + ", ".join(f"`{n}` {v.margins[n].text()}" for n in tied)
                     + " of its time.")
    beaten = [n for n in v.beaten if n in v.margins]
    if beaten:
        more = len(beaten) - _LISTED
        lines.append("Slower: " + ", ".join(f"`{n}` {v.margins[n].text()}" for n in beaten[:_LISTED])
                     + (f", and {more} more" if more > 0 else "") + ".")
    margins = [v.margins[n] for n in candidates(v.order) if n in v.margins and n != v.pick]
    if margins:
        lo, hi = min(m.pairs for m in margins), max(m.pairs for m in margins)
        pairs = f"{lo}" if lo == hi else f"{lo}–{hi}"
        lines.append(f"Margins: the median ratio of its time to the pick's and its {LEVEL:.0%} interval, over {pairs} "
                     "paired rounds; slower only where the interval excludes 1.")
    elif len(v.ties) > 1:
        lines.append("No paired rounds tell these backends apart: time them in more rounds for an answer.")
    return lines


def recommend(results: list[BackendResult], v: Verdict, workload: dict | None = None) -> str:
    """The choice for this workload and its margin (the first line, at most ``ANSWER_WIDTH`` characters),
    then why: the ties and the backends beaten with their intervals, what the choice assumes (a generate's
    lengths, which phase decided it, what a new length costs), numerics, cautions, eager's place."""
    by = {b.backend: b for b in results}
    if v.pick is None:
        if "eager" in v.order:
            return ("Only `eager` ran: the model's own attention is the reference, never recommended.\n"
                    "Name the backends to choose among.")
        return "No backend ran these inputs with acceptable numerics.\nSee the reasons in the report."
    best = by[v.pick]
    lines = [_answer(by, v, workload), *_reasons(by, v)]
    others = [by[n] for n in candidates(v.order) if n != v.pick]
    if best.generate is not None:
        lines += _generate_lines(best, others, workload or {})
    if best.train is not None and best.train.forward_ms is not None:
        lines.append(f"Forward {best.train.forward_ms:.3f} ms, backward {best.train.backward_ms:.3f} ms.")
    flagged = [b.backend for b in results if b.ok and ((b.numerics is not None and not b.numerics.ok)
                                                       or (b.train is not None and b.train.grad_ok is False))]
    if flagged:
        lines.append(f"Not considered, numerics beyond tolerance: {', '.join(flagged)}.")
    lines += _compile_lines(results, candidates(v.order), by, workload or {})
    lines += list(v.cautions)
    if "eager" in by and by["eager"].ok:
        lines.append(EAGER_NOTE)
    return "\n".join(lines)


def _pays(b: BackendResult, workload: dict) -> str:
    """When a compiled candidate's compile has paid for itself, in the workload's own steps (tokens too)."""
    n = b.compile_pays_after
    if workload.get("mode") == "generate":
        tokens = (workload.get("new_tokens") or 0) * len(workload.get("prompt_lens") or [1])
        return f"{n:.1f} generate workloads ({n * tokens:.0f} new tokens per sequence)"
    return f"{n:.0f} {'training steps' if workload.get('mode') == 'train' else 'forwards'}"


def _compile_lines(results: list[BackendResult], picks: list[str], by: dict, workload: dict) -> list[str]:
    """Compiled candidates: whether compiling changes the pick, when the compile pays for itself, and
    any compiled graph that ran another kernel than the one selected."""
    if all(b.compile is None for b in results):
        return []
    lines = []
    compiled = [by[n] for n in picks if by[n].compile is not None]
    plain = [by[n] for n in picks if by[n].compile is None]
    if compiled and plain:
        c, u = compiled[0], plain[0]
        if str(c.candidate.uncompiled) == u.backend:
            lines.append(f"Compiling does not change the pick: `{u.backend}` leads compiled and uncompiled.")
        else:
            lines.append(f"Compiling changes the pick: uncompiled `{u.backend}` ({u.time_ms:.3f} ms), compiled "
                         f"`{c.backend}` ({c.time_ms:.3f} ms).")
    best = by[picks[0]] if picks else None
    if best is not None and best.compile is not None and best.compile_ms is not None:
        text = f"`{best.backend}` compiles once, {best.compile_ms / 1e3:.1f} s"
        text += (f", which has paid for itself after {_pays(best, workload)}" if best.compile_pays_after is not None
                 else "")
        lines.append(text + (f"; it recompiled {best.recompiles} times while measured" if best.recompiles else "")
                     + ".")
    odd = [f"`{b.backend}`: {b.attn_mismatch}" for b in results if b.attn_mismatch]
    if odd:
        lines.append("What the compiled graph ran is not what was selected: " + "; ".join(odd) + ".")
    return lines


def _generate_lines(best: BackendResult, others: list[BackendResult], workload: dict) -> list[str]:
    g = best.generate
    lens = workload.get("prompt_lens", [])
    span = f"{min(lens)}–{max(lens)}" if len(lens) > 1 else ", ".join(map(str, lens))
    lines = [f"Assumes the deployed lengths are those measured: prompts of {span} tokens, "
             f"{workload.get('new_tokens')} new each."]
    if others and others[0].generate is not None:
        phase = _deciding_phase(g, others[0], workload)
        if phase:
            lines.append(phase)
    peer = _cold_peer(best, others)
    cold = peer.generate if peer is not None and peer.generate is not None else g
    penalty = (cold.new_shape_step_ms or 0) - (cold.seen_shape_step_ms or 0)
    # differences of decode steps below the workload's noise (at least 10 %) are not told as costs or flips
    margin = (cold.seen_shape_step_ms or 0) * max(best.noise_pct or 0, 10.0) / 100
    if cold.new_shape_step_ms is not None and cold.seen_shape_step_ms is not None and penalty > margin:
        cheaper = [o for o in others if o.generate and o.generate.new_shape_step_ms is not None and o is not peer
                   and o.generate.new_shape_step_ms < cold.new_shape_step_ms - margin]
        text = (f"`{best.backend}` is fastest once every length has been seen; each new key length costs it "
                f"{penalty:.3f} ms more per step" + (f" (as `{peer.backend}`, which runs its kernel, paid: its "
                                                     "caches were warm)" if peer is not None else ""))
        text += (f", so `{cheaper[0].backend}` ({cheaper[0].generate.new_shape_step_ms:.3f} ms per new-length step) "
                 "wins for workloads with many new lengths." if cheaper else ".")
        lines.append(text)
    return lines


def _cold_peer(best: BackendResult, others: list[BackendResult]) -> BackendResult | None:
    """For ``auto``, the forced backend that ran its kernel and was measured before it (its cold figures are
    the kernel's in a fresh process; ``auto`` met those caches warm). Compiled candidates have none, and are
    none: a compiled graph's new-length cost is its recompiles, its own (as the serving estimate charges)."""
    if best.candidate != Candidate("auto"):
        return None
    fams = kernel_families(best.backend, best.attn_ops + best.attn_kernel_names)
    return next((o for o in others if o.ok and o.candidate.compile is None and o.candidate.backend in fams), None)


def _deciding_phase(g, o: BackendResult, workload: dict) -> str:
    """Which phase gains the best backend most over the next one (time saved over the workload, from each
    phase's median); phases without measurements on both sides are left out, and no phase is said to
    decide where the best gains in none."""
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
        return f"Against `{o.backend}` the phases' medians do not show its lead ({told} over the workload)."
    return f"{phase.capitalize()} decided it against `{o.backend}` (each phase's median, over the workload: {told})."


def _ranges(points) -> list[list]:
    """Consecutive lengths whose ties share a backend: ``[first, last, the backends tied at every one]``."""
    ranges: list[list] = []
    for p in points:
        w = tuple(p.ties) or ((p.pick,) if p.pick else ())
        common = tuple(n for n in ranges[-1][2] if n in w) if ranges else ()
        if ranges and common:
            ranges[-1][1], ranges[-1][2] = p, common
        else:
            ranges.append([p, p, w])
    return ranges


def recommend_sweep(points) -> str:
    """Per batch size (and number of new tokens), the best backend per range of lengths (the backends
    tied at every length of it, as each length's own ranking says: the table's rule) and where the
    ranking crosses over."""
    groups = dict.fromkeys((p.batch, getattr(p, "new_tokens", None)) for p in points)
    return "\n".join(_sweep_text(sorted((p for p in points if (p.batch, getattr(p, "new_tokens", None)) == g),
                                        key=lambda p: p.seq), *g) for g in groups)


def _sweep_text(points, batch: int, new_tokens: int | None = None) -> str:
    ranges = _ranges(points)
    word = "prompt" if new_tokens else "seq"
    parts = []
    for first, last, w in ranges:
        span = f"{word} {first.seq}" if first is last else f"{word} {first.seq}–{last.seq}"
        parts.append(f"{span}: " + (" ≈ ".join(f"`{n}`" for n in w) if w else "no backend with acceptable numerics"))
    at = f"batch {batch}" + (f", {new_tokens} new tokens" if new_tokens else "")
    text = f"Best per length at {at}: " + "; ".join(parts)
    crossings = [f"between {word} {a[1].seq} and {b[0].seq}, `{b[2][0]}` overtakes `{a[2][0]}`"
                 for a, b in zip(ranges, ranges[1:]) if a[2] and b[2]]
    return text + ("." if not crossings else ". Crossover " + "; ".join(crossings) + ".")
