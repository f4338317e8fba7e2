"""The decision: what a report answers, made once from the ranking and read by every writer.

``decide`` takes the results and their ``ranking.Verdict`` (who is fastest, who is tied, which of the tie
changes least) and says what to do: use one backend, deploy one of a tie, keep the model's own attention
(SDPA's own choice in a tie or ahead, or transformers' eager where it is faster than every candidate), or
nothing (no backend ran acceptably; the model made no attention call through the switch). It words the
answer (``recommend``) and builds what to ship for the workload's kind (``deploy.deploy_info``).
``decide_sweep`` does the same over a sweep's shapes. Pure functions over results.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace

from . import candidate, catalog
from .deploy import deploy_info
from .kinds import kind_of
from .ranking import Verdict, against, gate_cautions, ranked, ruled_out, told_apart
from .recommend import ANSWER_WIDTH, name_of, reasons, sweep_lines
from .results import BackendResult, Decision, candidates, no_attention, no_attention_text
from .stats import paired_margin

__all__ = ["decide", "decide_sweep", "recommend", "own_attention", "sweep_choice", "sweep_pick"]

#: transformers' own attention implementations that attnswitch's backends stand for (keeping it: nothing to do)
_OWN = {"sdpa": "auto", "eager": "eager"}


def own_attention(workload: Mapping | None) -> str | None:
    """The backend that is the model's own attention as measured: ``auto`` for transformers' ``sdpa`` (its
    default, also where a report does not say), ``eager`` for ``eager``; None for another implementation."""
    impl = (workload or {}).get("attn_implementation") or "sdpa"
    return _OWN.get(impl)


def _eager_ahead(results: list[BackendResult], v: Verdict, own: str | None = None):
    """The margin of the fastest candidate against ``eager`` where eager is decidedly faster than every forced
    candidate and, where the model runs eager (``own``), not slower than SDPA's own choice (``auto``), else
    faster than every candidate; None otherwise."""
    by = {b.backend: b for b in results}
    if "eager" not in v.order:
        return None
    eager = by["eager"]
    margins = {n: paired_margin(by[n].time_rounds_ms, eager.time_rounds_ms, "eager") for n in candidates(v.order)}
    auto = margins.pop("auto", None) if own == "eager" and "auto" in margins else None
    if not all(told_apart(m) for m in margins.values()):
        return None
    if auto is not None and auto.decided and auto.high < 1.0:  # SDPA's own choice faster than the model's eager
        return None
    ahead = [m for m in (*margins.values(), auto) if m is not None]
    return min(ahead, key=lambda m: m.ratio) if ahead else None


def _rule_parts(v: Verdict, pick: str, own: str | None) -> tuple[str, list[str]]:
    """Why ``pick`` among the tie (what it is), and the tied ones it is preferred to; ``("", [])`` where all
    are alike. ``own``: the model's own attention (``own_attention``): SDPA's own choice changes nothing only
    where the model runs it."""
    c = candidate.parse(pick)
    less = [n for n in v.ties if candidate.parse(n).preference() > c.preference()]
    if not less:
        return "", []
    row = catalog.row(c.backend or "")
    if row is not None and row.kind == "choice":
        what = "SDPA's own choice" + (", compiled as measured" if c.compile else " changes nothing" if own == "auto"
                                      else ", no kernel forced")
    elif all(candidate.parse(n).uncompiled == c for n in less):
        what = "uncompiled, nothing to compile"
    elif row is not None and row.kind == "fused":
        what = "a fused kernel" + (", compiled as measured" if c.compile else "")
    else:
        what = "the backend that changes least"
    return what, less


def _rule(what: str, less: list[str]) -> str:
    if not less:
        return ""
    return f"{what}, preferred to {', '.join(f'`{n}`' for n in less[:3])}" + (" and more" if len(less) > 3 else "")


def _fit(*variants: str) -> str:
    """The first variant within ``ANSWER_WIDTH`` characters (the last, whatever its length)."""
    return next((t for t in variants if len(t) <= ANSWER_WIDTH), variants[-1])


def _tie_variants(by, ties: Iterable[str], tail: str, head: str = "Tie: ") -> list[str]:
    """The line with every tied name, then with fewer (``and N more``)."""
    names = [name_of(by[n]) for n in ties]
    return [head + " ≈ ".join(names[:shown]) + (f" and {len(names) - shown} more" if shown < len(names) else "") +
            tail for shown in range(len(names), 0, -1)]


def _tie_names(by, ties: Iterable[str], tail: str, head: str = "Tie: ") -> str:
    return _fit(*_tie_variants(by, ties, tail, head))


def _headline(by: dict[str, BackendResult], v: Verdict, answer: str, pick: str, rule: tuple[str, str], t: str,
              numerics: bool) -> str:
    """``rule``: why the pick among a tie, whole and as what the pick is (``_rule``, ``_rule_parts``)."""
    rule, what = rule
    b = by[pick]
    beaten = v.beaten
    m = v.margins.get(beaten[0]) if beaten else None
    margin = f", {m.text()} faster than `{beaten[0]}`" if m is not None else ""
    if answer == "keep":
        own = f"Keep the model's own attention ({name_of(b, inside=True)})"
        if len(v.ties) > 1:
            others = [n for n in v.ties if n != pick]
            return _fit(_tie_names(by, others, f" at {t}; nothing to change.", head=f"{own}: tied with "),
                        _tie_names(by, others, f" at {t}.", head=f"{own}: tied with "),
                        f"{own}: tied for the fastest at {t}; nothing to change.")
        return f"{own}: {t}{margin}; nothing to change."
    if len(v.ties) > 1:
        if not rule:
            return _tie_names(by, v.ties, f" at {t}, not told apart: any is as good here.")
        # (the rule stays in the line: whole, or what the pick is, before names go)
        return _fit(*_tie_variants(by, v.ties, f" at {t}; pick `{pick}`: {rule}."),
                    *_tie_variants(by, v.ties, f" at {t}; pick `{pick}`: {what}."),
                    f"Tie at {t}; pick `{pick}`: {what}.")
    if not beaten:
        eager = by.get("eager") if "eager" in v.order else None
        m = paired_margin(eager.time_rounds_ms, b.time_rounds_ms, pick) if eager is not None else None
        beside = f"; the model's own `eager` {m.text()} of its time" if m is not None else ""
        if any(x.defects and any(d.blocks for d in x.defects) for x in by.values() if x.ok):
            return f"Use {name_of(b)}: {t}, the only candidate here that ran and no known defect rules out{beside}."
        return (f"Use {name_of(b)}: {t}, the only candidate here that ran"
                + (" with acceptable numerics" if numerics else " (numerics not checked)") + f"{beside}.")
    return f"Use {name_of(b)}: {t}{margin}."


def decide(results: Iterable[BackendResult], v: Verdict, workload: Mapping | None = None,
           environment: Mapping | None = None) -> tuple[Decision, Verdict]:
    """The answer for ``results`` ranked by ``v``, and the verdict its margins are read against (``v``, or
    ``v`` re-based on ``eager`` where the model's eager attention is faster than every candidate)."""
    results = list(results)
    by = {b.backend: b for b in results}
    workload = workload or {}
    numerics = any(b.numerics is not None for b in results)
    if no_attention(results):
        return Decision("no-attention", headline=no_attention_text(workload=workload), cautions=v.cautions), v
    if v.pick is None:
        return _none(results, "eager" in v.order, v.cautions), v
    own = own_attention(workload)
    ahead = _eager_ahead(results, v, own)
    if ahead is not None:  # transformers' own eager, faster than every candidate
        v = against(v, results, "eager")
    pick = v.pick
    answer = "keep" if pick == own else "tie" if len(v.ties) > 1 else "use"
    what, less = _rule_parts(v, pick, own) if len(v.ties) > 1 else ("", [])
    rule = _rule(what, less)
    unit = kind_of(workload).unit
    t = f"{by[pick].time_ms:.3f} ms {unit}"
    headline = _headline(by, v, answer, pick, (rule, what), t, numerics)
    deploy = deploy_info(pick, environment or {}, workload, ties=v.ties, keep=answer == "keep")
    return Decision(answer, pick, v.ties, v.fastest if ahead is None else "eager", rule, headline,
                    tuple(reasons(results, v, workload, numerics)), v.cautions, deploy), v


def _none(results: list[BackendResult], eager_ran: bool, cautions: tuple[str, ...]) -> Decision:
    """No candidate to pick: none ran, every one that ran is ruled out (each reason named), or only the model's
    own eager attention (``eager_ran``) was asked for."""
    first = tuple(c for c in gate_cautions(results) if c in cautions)
    ran = [b for b in results if b.ok and b.backend not in catalog.MODEL_LEVEL]
    if eager_ran and not ran:
        named = [f"`{b.backend}`" for b in results if not b.ok and b.backend not in catalog.MODEL_LEVEL]
        why = (f"{', '.join(named)} did not run here: why, for each, under Not run." if named else
               "Name the backends to choose among.")
        return Decision("none", headline="Only `eager` ran: the model's own attention has nothing to be chosen "
                        "against.", reasons=(*first, why), cautions=cautions)
    out: dict[str, list[str]] = {}
    for b in ran:
        why = ruled_out(b)
        if why:
            out.setdefault(why, []).append(f"`{b.backend}`")
    if not out:
        return Decision("none", headline="No backend ran these inputs.",
                        reasons=(*first, "Why, for each: under Not run."), cautions=cautions)
    said = "; ".join(f"{why} ({', '.join(names)})" for why, names in out.items())
    # those ruled out ran: their figures are the Summary's (Known defects, Compiled); Not run has the others
    where = "Their figures: in the Summary" + ("; why the others did not run: under Not run." if
                                               any(not b.ok for b in results) else ".")
    return Decision("none", headline=_fit(f"Every backend that ran is ruled out: {said}.",
                                          "Every backend that ran is ruled out (below)."),
                    reasons=(*first, f"Ruled out: {said}.", where), cautions=cautions)


def recommend(results: list[BackendResult], v: Verdict, workload: dict | None = None) -> str:
    """The answer's text for ``results`` ranked by ``v``: its first line, then why (``decide``)."""
    return decide(results, v, workload)[0].text


def sweep_choice(points, serving: Mapping | None = None) -> str | None:
    """The one backend to deploy over a sweep (``sweep_pick``)."""
    return sweep_pick(points, serving)[0]


def sweep_pick(points, serving: Mapping | None = None) -> tuple[str | None, str]:
    """The one backend to deploy over a sweep, and why: the model's own eager attention where it is faster than
    every candidate at every shape; the cheapest for the length mix where one was given; else of the candidates
    tied for the pick at the most shapes, the one that changes least, then the least time over all of them."""
    # a candidate that failed or was refused at a measured shape is deployed only where none ran at all; the
    # model's own eager attention is one where a shape's decision picked it (faster than every candidate there)
    eager = ["eager"] if any(p.pick == "eager" for p in points) else []
    everywhere = [n for n in (*candidates(points[0].ranking), *eager)
                  if all(n in p.ranking for p in points)] if points else []
    if eager and all(p.pick == "eager" for p in points):
        return "eager", "faster than every candidate at every shape"
    if serving and (serving["pick"] in everywhere or not everywhere):
        return serving["pick"], "the cheapest for the length mix"
    cost = {n: ms for n, ms in (serving or {}).get("per_request_ms", {}).items() if n in everywhere}
    if cost:  # the mix's pick failed at another batch size: the cheapest of those that ran at every shape
        return min(cost, key=cost.get), "the cheapest for the length mix of those that ran at every shape"
    counts: dict[str, int] = {}
    for p in points:
        for n in p.ties or ((p.pick,) if p.pick else ()):
            counts[n] = counts.get(n, 0) + 1
    if everywhere and not set(counts) & set(everywhere):  # none tied for a pick ran everywhere
        counts = {n: 0 for n in everywhere}
    if not counts:
        return None, ""
    # totals over the shapes where every one of them ran (fewer shapes would sum to less)
    common = [p for p in points if all(n in p.ranking for n in counts)] or points
    total = {n: sum(b.time_ms for p in common for b in p.backends if b.backend == n and b.time_ms) for n in counts}

    def key(n):
        return n not in everywhere, -counts[n], candidate.parse(n).preference(), total[n]
    pick = min(counts, key=key)
    at = "at every length" if counts[pick] == len(points) else f"at {counts[pick]} of {len(points)} shapes"
    same = [n for n in counts if n != pick and key(n)[:2] == key(pick)[:2]]  # as often tied for the fastest
    rule = ("" if not same else ", and of those the one that changes least"
            if all(key(n)[2] > key(pick)[2] for n in same) else ", and of those that change least the least time "
            "over all")
    return pick, f"the fastest (or tied) {at}{rule}"


def decide_sweep(points, verdicts: list[Verdict], results: list[BackendResult], workload: Mapping,
                 environment: Mapping, serving: Mapping | None, serving_lines: list[str],
                 cautions: tuple[str, ...]) -> tuple[Decision, Verdict, tuple]:
    """One answer over a sweep's shapes (``sweep_choice``; each shape's verdict in ``verdicts``), the last
    shape's verdict re-based on it (the summary shows the last shape against what is deployed), and the points
    with every shape's margins against it (none where it did not run)."""
    # what rules a backend out, over every shape together (each shape's lines say it of its own lengths)
    gate = gate_cautions(b for p in points for b in p.backends)
    said = {c for p in points for c in gate_cautions(p.backends)}
    cautions = (*gate, *(c for c in cautions if c not in said))
    last = verdicts[-1]
    if points and no_attention([b for p in points for b in p.backends]):
        return Decision("no-attention", headline=no_attention_text(" at any shape"), cautions=cautions), last, \
            tuple(points)
    pick, why = sweep_pick(points, serving)
    lines = [*gate, *sweep_lines(points)]
    if pick is None:
        everything = [b for p in points for b in p.backends]
        none = _none(everything, "eager" in {n for p in points for n in p.ranking}, cautions)
        return replace(none, headline=none.headline.rstrip(".") + " at any measured shape.",
                       reasons=(*lines, *none.reasons[len(gate):])), last, tuple(points)
    points = tuple(_against_pick(p, v, pick) for p, v in zip(points, verdicts))
    # the summary: the last shape against the pick, or against nothing where the pick did not run there
    last = against(last, results, pick) if pick in last.order else replace(last, margins={}, ties=())
    answer = "keep" if pick == own_attention(workload) else "use"
    head = _sweep_headline(points, pick, why, answer, kind_of(workload))
    # tied with the pick at every shape it ran at (the last shape's ties alone named one another shape told apart)
    everywhere = [set(against(v, p.backends, pick).ties) for p, v in zip(points, verdicts) if pick in p.ranking]
    ties = tuple(dict.fromkeys((pick, *(n for n in last.ties if n in last.order and all(n in t for t in everywhere)))))
    deploy = deploy_info(pick, environment, workload, sweep=points, ties=ties, keep=answer == "keep")
    return (Decision(answer, pick, ties, last.fastest, "", head, tuple([*lines, *serving_lines]), cautions, deploy),
            last, points)


def _sweep_headline(points, pick: str, why: str, answer: str, kind) -> str:
    """The sweep's first line: the pick over the lengths it ran at, why (``sweep_pick``), and the shapes it did
    not run at."""
    ran = sorted({p.seq for p in points if pick in p.ranking})
    missed = [p for p in points if pick not in p.ranking]
    span = f"{kind.length} {ran[0]}" + (f"–{ran[-1]}" if len(ran) > 1 else "")
    if missed:
        one_batch = len({(p.batch, p.new_tokens) for p in points}) == 1
        where = [f"{kind.length} {p.seq}" if one_batch else f"batch {p.batch}, {kind.length} {p.seq}" for p in missed]
        why += f"; it did not run at {'; '.join(where)}"
    return (f"Keep the model's own attention (`{pick}`) over {span}: {why}; nothing to change." if answer == "keep"
            else f"Use `{pick}` over {span}: {why}.")


def _against_pick(p, v: Verdict, pick: str):
    """A sweep's shape with each backend's margin against the sweep's pick (none where the pick did not run)."""
    if pick not in p.ranking:
        return replace(p, backends=tuple(replace(b, margin=None) for b in p.backends))
    a = against(v, p.backends, pick)
    return replace(p, backends=tuple(ranked(list(p.backends), a)), ranking=a.order, with_pick=a.ties)
