"""The words of the answer: its reasons, one short line each, and a sweep's per-length lines. Pure functions
over results and their ``ranking.Verdict``; what the answer is, ``decision.py`` decides."""

from __future__ import annotations

from .backends import kernel_families, kernel_family
from .candidate import Candidate
from .kinds import kind_of
from .ranking import NUMERICS, Verdict, gate_cautions, ruled_out, verdict
from .results import BackendResult, candidates
from .stats import bracket_words, covers, paired_margin
from .words import counted

__all__ = ["reasons", "recommend_sweep", "sweep_lines", "name_of", "EAGER_NOTE", "ANSWER_WIDTH"]

#: eager's place in a ranking
EAGER_NOTE = "`eager` (the model's own transformers attention) is picked only where it is faster than every candidate."
#: ... and where the others' numerics were checked against it
_EAGER_REFERENCE = ("`eager` (the model's own transformers attention) is the reference the others are checked "
                    "against: picked only where it is faster than every candidate.")
#: the answer line's most characters
ANSWER_WIDTH = 120
_LISTED = 4  # beaten backends named in the reasons


def name_of(b: BackendResult, inside: bool = False) -> str:
    """A backend as the answer names it: ``auto`` with the kernel it ran (``inside``: within parentheses)."""
    if b.backend != "auto":
        return f"`{b.backend}`"
    fam = kernel_family(b.attn_ops)
    return "`auto`" if not fam else f"`auto`, ran {fam}" if inside else f"`auto` (ran {fam})"


def _margin_lines(by: dict[str, BackendResult], v: Verdict) -> list[str]:
    lines = []
    cycled = [n for n in v.cycled if n in v.margins]
    if cycled:
        lines.append(f"Not ordered with `{v.pick}` (faster in most rounds, slower than another tied one): "
                     + ", ".join(f"`{n}` {v.margins[n].text()}" for n in cycled) + " of its time.")
    tied = [n for n in v.ties[1:] if n in v.margins and n not in v.cycled]
    if tied:
        lines.append(f"Not told apart from `{v.pick}`: " + ", ".join(f"`{n}` {v.margins[n].text()}" for n in tied)
                     + " of its time.")
    behind = [n for n in v.beaten if n in v.behind]
    if behind:
        said = []
        for n in behind:
            m = paired_margin(by[n].time_rounds_ms, by[v.behind[n]].time_rounds_ms, v.behind[n])
            said.append(f"`{n}` {m.text()} of `{v.behind[n]}`'s time" if m is not None else f"`{n}`")
        lines.append(f"Slower than one tied for the fastest, though not told apart from `{v.pick}` itself: "
                     + ", ".join(said) + ".")
    beaten = [n for n in v.beaten if n in v.margins and n not in v.behind]
    if beaten:
        more = len(beaten) - _LISTED
        lines.append("Slower: " + ", ".join(f"`{n}` {v.margins[n].text()}" for n in beaten[:_LISTED])
                     + (f", and {more} more" if more > 0 else "") + ".")
    margins = [v.margins[n] for n in candidates(v.order) if n in v.margins and n != v.pick]
    if margins:
        lo, hi = min(m.pairs for m in margins), max(m.pairs for m in margins)
        pairs = (f"{lo}" if lo == hi else f"{lo}–{hi}") + (" paired round" if hi == 1 else " paired rounds")
        covered = [m.coverage for m in margins]
        last = ("slower only where the interval excludes 1." if covers(max(covered)) else
                "time more rounds for an answer.")
        lines.append(f"Margins: the median ratio of its time to the pick's and {bracket_words(covered)}, over {pairs}; "
                     + last)
    elif len(v.ties) > 1:
        lines.append("No paired rounds tell these backends apart: time them in more rounds for an answer.")
    return lines


def _eager_line(by: dict[str, BackendResult], v: Verdict) -> list[str]:
    """Where the model's own eager attention was decidedly faster than the pick, and is not the pick."""
    eager, pick = by.get("eager"), by.get(v.pick)
    if eager is None or pick is None or v.pick == "eager" or "eager" not in v.order:
        return []
    m = paired_margin(eager.time_rounds_ms, pick.time_rounds_ms, v.pick)
    if m is None or not (m.decided and m.high < 1.0):
        return []
    return [f"The model's own attention (`eager`) ran faster than `{v.pick}`: {m.text()} of its time, but not faster "
            "than every candidate."]


def reasons(results: list[BackendResult], v: Verdict, workload: dict | None = None,
            numerics: bool = True) -> list[str]:
    """Why: first what rules a backend out whatever its time (a known defect, a NaN or Inf: ``gate_cautions``),
    then the ties and the backends beaten with their intervals, what the choice assumes (a generate's
    lengths, which phase decided it, what a new length costs), numerics, cautions, eager's place."""
    by = {b.backend: b for b in results}
    best = by[v.pick]
    gate = [c for c in gate_cautions(results) if c in v.cautions]
    lines = [*gate, *_margin_lines(by, v), *_eager_line(by, v)]
    others = [by[n] for n in candidates(v.order) if n != v.pick]
    if best.generate is not None:
        lines += _generate_lines(best, others, workload or {}, tied=bool(others) and others[0].backend in v.ties)
    if best.train is not None and best.train.forward_ms is not None:
        lines.append(f"Forward {best.train.forward_ms:.3f} ms, backward {best.train.backward_ms:.3f} ms.")
    flagged = [b.backend for b in results if b.ok and ruled_out(b) == NUMERICS]
    if flagged:
        lines.append(f"Not considered, numerics beyond tolerance: {', '.join(flagged)}.")
    if not numerics:
        lines.append("Numerics not checked: no backend's output was compared with eager attention in float32.")
    lines += _compile_lines(results, v, by, workload or {})
    lines += [c for c in v.cautions if c not in gate]
    if "eager" in by and by["eager"].ok and v.pick != "eager":
        lines.append(_EAGER_REFERENCE if numerics else EAGER_NOTE)
    return lines


def _pays(b: BackendResult, workload: dict) -> str:
    """When a compiled candidate's compile has paid for itself, in the workload's own steps (tokens too)."""
    n = b.compile_pays_after
    kind = kind_of(workload)
    if kind.name == "generate":
        tokens = (workload.get("new_tokens") or 0) * len(workload.get("prompt_lens") or [1])
        return f"{n:.1f} generate workloads ({n * tokens:.0f} new tokens per batch row, over its prompts)"
    return f"{n:.0f} {kind.timed}"


def _compile_lines(results: list[BackendResult], v: Verdict, by: dict, workload: dict) -> list[str]:
    """Compiled candidates: whether compiling changes the pick (not where the fastest compiled and uncompiled
    are tied: the preference picks then), when the compile pays for itself, and any compiled graph that ran
    another kernel than the one selected."""
    if all(b.compile is None for b in results):
        return []
    lines = []
    picks = candidates(v.order)
    # each side's own pick, by the same rules as the whole (a tie goes to the preferred), not the first by median
    c, u = (by.get(verdict([b for b in results if (b.compile is None) == plain]).pick) for plain in (False, True))
    if c is not None and u is not None:
        if c.backend in v.ties and u.backend in v.ties:
            lines.append(f"Compiling makes no measured difference to the pick: compiled `{c.backend}` and uncompiled "
                         f"`{u.backend}` are not told apart.")
        elif u.backend == v.pick:
            m = v.margins.get(c.backend)
            lines.append(f"Compiling does not change the pick: uncompiled `{u.backend}` is faster than every "
                         f"compiled candidate (the compiled pick, `{c.backend}`"
                         + (f", {m.text()} of its time)." if m else ")."))
        elif str(c.candidate.uncompiled) == u.backend:  # (the compiled one ahead: the pick is compiled)
            lines.append(f"Compiling does not change the backend: `{u.backend}` leads compiled and uncompiled, and "
                         f"compiled (`{c.backend}`) is the faster.")
        else:
            lines.append(f"Compiling changes the pick: uncompiled `{u.backend}` ({u.time_ms:.3f} ms), compiled "
                         f"`{c.backend}` ({c.time_ms:.3f} ms).")
    best = by[picks[0]] if picks else None
    if best is not None and best.compile is not None and best.compile_ms is not None:
        n = best.recompiles or 0
        text = f"`{best.backend}`'s compile took {best.compile_ms / 1e3:.1f} s"
        text += (f", which has paid for itself after {_pays(best, workload)}" if best.compile_pays_after is not None
                 else "")
        lines.append(text + (f"; it recompiled {counted(n, 'time')} while measured (new shapes)" if n
                             else "") + ".")
    odd = [f"`{b.backend}`: {b.attn_mismatch}" for b in results if b.attn_mismatch]
    if odd:
        lines.append("What the compiled graph ran is not what was selected: " + "; ".join(odd) + ".")
    return lines


def _generate_lines(best: BackendResult, others: list[BackendResult], workload: dict, tied: bool = False) -> list[str]:
    """``tied``: the next one is not told apart from ``best`` (no phase decided anything between them)."""
    g = best.generate
    lens = workload.get("prompt_lens", [])
    span = f"{min(lens)}–{max(lens)}" if len(lens) > 1 else ", ".join(map(str, lens))
    lines = [f"Assumes the deployed lengths are those measured: prompts of {span} tokens, "
             f"{workload.get('new_tokens')} new each."]
    if others and others[0].generate is not None and not tied:
        phase = _deciding_phase(best, others[0], workload)
        if phase:
            lines.append(phase)
    if best.compile is not None:  # its new-length steps are those it compiled during: a cost per compile, said
        return lines               # with the compile's (``_compile_lines``), not one per key length
    peer = _cold_peer(best, others)
    cold = peer.generate if peer is not None and peer.generate is not None else g
    penalty = (cold.new_shape_step_ms or 0) - (cold.seen_shape_step_ms or 0)
    # differences of decode steps below the workload's noise (at least 10 %) are not told as costs or flips
    margin = (cold.seen_shape_step_ms or 0) * max(best.noise_pct or 0, 10.0) / 100
    if cold.new_shape_step_ms is not None and cold.seen_shape_step_ms is not None and penalty > margin:
        cheaper = [o for o in others if o.generate and o.generate.new_shape_step_ms is not None and o is not peer
                   and o.compile is None and o.generate.new_shape_step_ms < cold.new_shape_step_ms - margin]
        # fastest once every length has been seen: told apart from the next one, and no other's seen-length steps
        # faster beyond the noise (a pick tied with the next one, or alone, is not said to be)
        seen = g.seen_shape_step_ms
        fastest = not tied and bool(others) and seen is not None and all(
            o.generate is None or o.generate.seen_shape_step_ms is None
            or o.generate.seen_shape_step_ms >= seen - margin for o in others)
        text = (f"`{best.backend}` is fastest once every length has been seen; each new key length costs it "
                if fastest else f"Each new key length costs `{best.backend}` ")
        text += f"{penalty:.3f} ms more per step" + (f" (as `{peer.backend}`, which runs its kernel, paid: its "
                                                     "caches were warm)" if peer is not None else "")
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


def _phase_backend(c: Candidate, phase: str) -> str | None:
    """The backend ``c`` runs in ``phase`` (None: one per layer kind)."""
    if c.policy is not None:
        return c.policy.prefill if phase == "prefill" else c.policy.decode
    return c.backend


def _deciding_phase(best: BackendResult, o: BackendResult, workload: dict) -> str:
    """Which phase gains the best backend most over the next one (time saved over the workload, from each
    phase's median); phases without measurements on both sides are left out, as are phases both run with the
    same backend (their difference is noise), and no phase is said to decide where the best gains in none, nor
    where another phase gains half as much or more (both did)."""
    g = best.generate
    n_gen = len(workload.get("prompt_lens", [])) or 1
    steps = n_gen * max(0, (workload.get("new_tokens") or 1) - 1)

    # a generate compiles its one-token steps alone: a decoder's prefill runs eager, an encoder-decoder's first
    # decoder step (its "prefill") is compiled with the rest
    compiled_apart = best.candidate.compile != o.candidate.compile

    def apart(phase: str) -> bool:
        mine = _phase_backend(best.candidate, phase)
        return mine is None or (compiled_apart and (phase == "decode" or workload.get("encoder_decoder", False))) \
            or mine != _phase_backend(o.candidate, phase)
    gains = {}
    if g.ttft_ms is not None and o.generate.ttft_ms is not None and apart("prefill"):
        gains["prefill"] = (o.generate.ttft_ms - g.ttft_ms) * n_gen
    if steps and g.step_ms_p50 is not None and o.generate.step_ms_p50 is not None and apart("decode"):
        gains["decode"] = (o.generate.step_ms_p50 - g.step_ms_p50) * steps
    if not gains:
        return ""
    told = ", ".join(f"{k} {v:+.1f} ms" for k, v in gains.items())
    phase, gain = max(gains.items(), key=lambda kv: kv[1])
    if gain <= 0 or sum(gains.values()) <= 0:
        return f"Against `{o.backend}` the phases' medians do not show its lead ({told} over the workload)."
    if any(0 < v and gain < 2 * v for k, v in gains.items() if k != phase):  # (no phase gains twice the other)
        return f"Both phases gain against `{o.backend}` (each phase's median, over the workload: {told})."
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


def sweep_lines(points) -> list[str]:
    """Per batch size (and number of new tokens), the best backend per range of lengths (the backends
    tied at every length of it, as each length's own ranking says: the table's rule) and where the
    ranking crosses over."""
    groups = dict.fromkeys((p.batch, getattr(p, "new_tokens", None)) for p in points)
    return [_sweep_text(sorted((p for p in points if (p.batch, getattr(p, "new_tokens", None)) == g),
                               key=lambda p: p.seq), *g) for g in groups]


def recommend_sweep(points) -> str:
    """``sweep_lines``, a line each."""
    return "\n".join(sweep_lines(points))


def _sweep_text(points, batch: int, new_tokens: int | None = None) -> str:
    ranges = _ranges(points)
    word = "prompt" if new_tokens else "seq"
    parts = []
    for first, last, w in ranges:
        span = f"{word} {first.seq}" if first is last else f"{word} {first.seq}–{last.seq}"
        parts.append(f"{span}: " + (" ≈ ".join(f"`{n}`" for n in w) if w else "no candidate ran acceptably"))
    at = f"batch {batch}" + (f", {counted(new_tokens, 'new token')}" if new_tokens else "")
    text = f"Best per length at {at}: " + "; ".join(parts)
    crossings = [f"between {word} {a[1].seq} and {b[0].seq}, `{b[2][0]}` overtakes `{a[2][0]}`"
                 for a, b in zip(ranges, ranges[1:]) if a[2] and b[2]]
    return text + ("." if not crossings else ". Crossover " + "; ".join(crossings) + ".")
