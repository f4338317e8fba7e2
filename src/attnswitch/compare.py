"""``compare``: every backend profiled on the same inputs, numerics checked, ranked, one recommended."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import Any

import torch.nn as nn

from .backends import kernel_family
from .numerics import REFERENCES, numerics
from .profiling import profile
from .results import BackendResult, Numerics, Report
from .workload import Workload

__all__ = ["compare", "rank", "recommend"]


def rank(results: Iterable[BackendResult]) -> list[str]:
    """Backends that ran with acceptable numerics, fastest first by steady time per forward."""
    good = [b for b in results if b.ok and b.time_ms is not None and (b.numerics is None or b.numerics.ok)]
    return [b.backend for b in sorted(good, key=lambda b: b.time_ms)]


def _pick_text(best: BackendResult) -> str:
    if best.backend != "auto":
        return f"`{best.backend}`"
    fam = kernel_family(best.attn_ops)
    return f"`auto` (SDPA's own choice, which ran {fam} here)" if fam else "`auto` (SDPA's own choice)"


def recommend(results: list[BackendResult], ranking: list[str]) -> str:
    """One or two sentences: the choice, by how much it wins, near-ties within measured noise."""
    by = {b.backend: b for b in results}
    if not ranking:
        return "No backend ran these inputs with acceptable numerics; see the reasons in the report."
    best = by[ranking[0]]
    text = f"Use {_pick_text(best)}: {best.time_ms:.3f} ms per forward"
    others = [by[n] for n in ranking[1:] if n != "eager"]
    ties = [o for o in others if (o.time_ms - best.time_ms) / best.time_ms * 100
            <= max(best.noise_pct or 0.0, o.noise_pct or 0.0, 1.0)]
    beaten = [o for o in others if o not in ties]
    if beaten:
        nxt = beaten[0]
        text += (f", {nxt.time_ms / best.time_ms:.2f}x faster than the next" + (" beyond the noise" if ties else "")
                 + f", `{nxt.backend}` ({nxt.time_ms:.3f} ms)")
    text += "."
    if ties:
        text += " Within measured noise of it: " + ", ".join(
            f"`{o.backend}` ({o.time_ms:.3f} ms)" for o in ties) + "; any of these is as good here."
    flagged = [b.backend for b in results if b.ok and b.numerics is not None and not b.numerics.ok]
    if flagged:
        text += f" Not considered, numerics beyond tolerance: {', '.join(flagged)}."
    return text


def compare(model: nn.Module, batch: Workload | dict[str, Any], *, backends: Iterable[str] | str | None = None,
            warmup: int = 3, iters: int = 10, trace_dir=None, progress: Callable[[str], None] | None = None,
            model_name: str = "", check_numerics: bool = True, command: str | None = None,
            rounds: int = 5) -> Report:
    """Profile every backend on the same inputs, check numerics, rank by steady time per forward,
    and recommend one. ``batch`` is a ``Workload`` (see ``workload.make_workload``) or a dict of
    forward arguments."""
    if isinstance(batch, dict):
        batch = Workload.of(model, batch)
    report = profile(model, batch, backends=backends, warmup=warmup, iters=iters, trace_dir=trace_dir,
                     progress=progress, model_name=model_name, rounds=rounds)
    results = list(report.backends)
    settings = dict(report.settings)
    if check_numerics:
        reference = "fp32-attention" if report.distribution else "fp32-copy"
        if progress:
            progress("numerics")
        nums = numerics(model, batch, [b.backend for b in results if b.ok], reference)
        results = [dataclasses.replace(b, numerics=nums[b.backend]) if isinstance(nums.get(b.backend), Numerics)
                   else b for b in results]
        settings["numerics_reference"] = REFERENCES[reference]
    ranking = rank(results)
    return dataclasses.replace(report, backends=tuple(results), ranking=tuple(ranking),
                               recommendation=recommend(results, ranking), command=command,
                               workload={**report.workload, "mode": batch.mode}, settings=settings)
