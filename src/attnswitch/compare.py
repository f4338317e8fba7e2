"""``compare``: run every backend on the same inputs, check numerics against a reference, rank,
recommend.

Numerics are part of the choice: each backend's model output is compared with the model's own eager
attention in float32 on the same weights and inputs. A backend beyond tolerance is flagged and never
recommended. The tolerance is the dtype's, or twice the error of eager attention run in the model's
own dtype, whichever is larger: a backend is judged against what the dtype itself costs.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any, Callable, Iterable

import torch
import torch.nn as nn

from .errors import BackendUnavailable
from .models import Workload, _cache_kwarg
from .profiling import profile
from .report import BackendResult, Numerics, Report
from .switch import backend as use_backend

__all__ = ["compare", "numerics", "rank", "recommend", "DTYPE_TOLERANCE"]

#: relative error of model outputs (max |out - ref| / max |ref|) accepted per dtype
DTYPE_TOLERANCE = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 5e-2}


def _output(out) -> torch.Tensor:
    for attr in ("logits", "last_hidden_state"):
        t = getattr(out, attr, None)
        if t is not None:
            return t
    if isinstance(out, torch.Tensor):
        return out
    return out[0]


def _forward(model, workload: Workload, name: str | None) -> torch.Tensor:
    from . import hf
    from .switch import _switched

    kwargs = workload.first()
    with torch.no_grad():
        if name is None:
            return _output(model(**kwargs)).float()
        with (_switched(name, model) if name == hf.REFERENCE else use_backend(name, model=model)):
            return _output(model(**kwargs)).float()


#: what backends are checked against
REFERENCES = {
    "fp32-copy": "eager attention in a float32 copy of the model",
    "fp32-attention": "eager attention computed in float32 inside the model (a model spread over several GPUs "
                      "gets no float32 copy)",
}


def _errors(out: torch.Tensor, ref: torch.Tensor, where: torch.Tensor | None) -> tuple[float, float, float | None]:
    if where is not None and where.shape == out.shape[:2]:
        out, ref = out[where], ref[where]
    diff = (out - ref).abs()
    if not torch.isfinite(out).all():
        return float("inf"), float("inf"), 0.0
    max_rel = (diff.max() / ref.abs().max().clamp_min(1e-30)).item()
    mean_rel = (diff.mean() / ref.abs().mean().clamp_min(1e-30)).item()
    top1 = (out.argmax(-1) == ref.argmax(-1)).float().mean().item() if out.shape[-1] > 1 else None
    return max_rel, mean_rel, top1


def numerics(model: nn.Module, workload: Workload, names: Iterable[str],
             reference: str = "fp32-copy") -> dict[str, Numerics | str]:
    """Per backend: its output against eager attention in float32 (same weights and inputs); a
    string instead where the backend could not run. ``reference`` is a key of ``REFERENCES``."""
    from . import hf

    if reference not in REFERENCES:
        raise ValueError(f"unknown numerics reference {reference!r}; use one of {', '.join(REFERENCES)}")
    dtype = next(model.parameters()).dtype
    if reference == "fp32-attention" or dtype == torch.float32:  # a float32 model is its own float32 copy
        ref = _forward(model, workload, hf.REFERENCE)
    else:
        ref_model = copy.deepcopy(model).float()
        ref_work = dataclasses.replace(workload, model=ref_model)
        if workload.mode == "decode":
            key = _cache_kwarg(model)
            ref_work = dataclasses.replace(ref_work, kwargs={**workload.kwargs, key: _cache_to(
                workload.kwargs[key], torch.float32)})
        ref = _forward(ref_model, ref_work, "eager")
        del ref_model
    where = workload.tokens
    base, _, _ = _errors(_forward(model, workload, "eager"), ref, where)
    tol = max(DTYPE_TOLERANCE.get(dtype, 1e-2), 2 * base)
    out: dict[str, Numerics | str] = {}
    for name in names:
        try:
            mx, mean, top1 = _errors(_forward(model, workload, name), ref, where)
        except BackendUnavailable as e:
            out[name] = "; ".join(e.reasons)
            continue
        except (RuntimeError, ValueError) as e:
            out[name] = f"{type(e).__name__}: {e}"
            continue
        out[name] = Numerics(mx, mean, top1, tol, mx <= tol)
    return out


def _cache_to(cache, dtype):
    cache = copy.deepcopy(cache)
    for layer in getattr(cache, "layers", []):
        for attr in ("keys", "values"):
            t = getattr(layer, attr, None)
            if isinstance(t, torch.Tensor):
                setattr(layer, attr, t.to(dtype))
    return cache


def rank(results: Iterable[BackendResult]) -> list[str]:
    """Backends that ran with acceptable numerics, fastest first by steady time per forward."""
    good = [b for b in results if b.ok and b.time_ms is not None and (b.numerics is None or b.numerics.ok)]
    return [b.backend for b in sorted(good, key=lambda b: b.time_ms)]


def _kernel_family(b: BackendResult) -> str | None:
    for op in b.attn_ops:
        for fam in ("cudnn", "flash", "efficient", "math"):
            if fam in op:
                return fam
    return None


def recommend(results: list[BackendResult], ranking: list[str]) -> str:
    """One or two sentences: the choice, by how much it wins, near-ties within measured noise."""
    by = {b.backend: b for b in results}
    if not ranking:
        return "No backend ran these inputs with acceptable numerics; see the reasons in the report."
    best = by[ranking[0]]
    pick = best.backend
    if pick == "auto":
        fam = _kernel_family(best)
        pick_text = f"`auto` (SDPA's own choice, which ran {fam} here)" if fam else "`auto` (SDPA's own choice)"
    else:
        pick_text = f"`{pick}`"
    text = f"Use {pick_text}: {best.time_ms:.3f} ms per forward"
    others = [by[n] for n in ranking[1:] if n != "eager"]
    ties = []
    for o in others:
        noise = max(best.noise_pct or 0.0, o.noise_pct or 0.0, 1.0)
        if (o.time_ms - best.time_ms) / best.time_ms * 100 <= noise:
            ties.append(o)
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
    and recommend one. ``batch`` is a ``Workload`` (see ``models.make_workload``) or a dict of
    forward arguments."""
    if isinstance(batch, dict):
        batch = Workload(model, batch, description=", ".join(
            f"{k} {tuple(v.shape)}" for k, v in batch.items() if isinstance(v, torch.Tensor)),
            tokens=batch.get("attention_mask").bool() if isinstance(batch.get("attention_mask"), torch.Tensor)
            else None)
    report = profile(model, batch, backends=backends, warmup=warmup, iters=iters, trace_dir=trace_dir,
                     progress=progress, model_name=model_name, rounds=rounds)
    results = list(report.backends)
    reference = "fp32-attention" if report.distribution else "fp32-copy"
    if check_numerics:
        if progress:
            progress("numerics")
        nums = numerics(model, batch, [b.backend for b in results if b.ok], reference)
        results = [dataclasses.replace(b, numerics=nums[b.backend]) if isinstance(nums.get(b.backend), Numerics)
                   else b for b in results]
    ranking = rank(results)
    settings = {**report.settings, "numerics_reference": REFERENCES[reference]} if check_numerics else \
        report.settings
    return dataclasses.replace(report, backends=tuple(results), ranking=tuple(ranking),
                               recommendation=recommend(results, ranking), command=command,
                               workload={**report.workload, "mode": batch.mode}, settings=settings)
