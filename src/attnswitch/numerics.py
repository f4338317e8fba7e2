"""Numerics: each backend's model output against a float32 reference on the same weights and inputs.

The reference is eager attention in float32: in a float32 copy of the model (``fp32-copy``), or, for a
model spread over several GPUs (too large for a float32 copy), computed in float32 inside the model
(``fp32-attention``, the ``eager-fp32`` backend). The tolerance is the dtype's, or twice the error of
eager attention run in the model's own dtype, whichever is larger: a backend is judged against what
the dtype itself costs.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
import torch.nn as nn

from .backends import REFERENCE
from .device import device_of
from .errors import BackendUnavailable
from .results import Numerics
from .switch import backend as use_backend
from .words import clauses
from .workload import Workload, kept, loss_of

__all__ = ["DTYPE_TOLERANCE", "REFERENCES", "numerics", "output_tensor", "errors", "reference_output",
           "token_agreement", "grad_numerics", "GradCheck"]

#: relative error of model outputs (max |out - ref| / max |ref|) accepted per dtype
DTYPE_TOLERANCE = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 5e-2}

#: what backends are checked against
REFERENCES = {
    "fp32-copy": "eager attention in a float32 copy of the model",
    "fp32-attention": "eager attention computed in float32 inside the model (a model spread over several GPUs "
                      "gets no float32 copy)",
}


def output_tensor(out) -> torch.Tensor:
    """The tensor a model output is judged by: logits, else the last hidden state, else the first item."""
    for attr in ("logits", "last_hidden_state"):
        t = getattr(out, attr, None)
        if t is not None:
            return t
    if isinstance(out, torch.Tensor):
        return out
    return out[0]


def _forward(workload: Workload, name: str | None) -> torch.Tensor:
    """The output, dropout off (in eval mode, the model's modes as found after): with dropout, eager's own error
    would set a tolerance that passes anything."""
    with torch.no_grad(), kept(workload.model, training=False):
        if name is None:
            return output_tensor(workload()).float()
        with use_backend(name, model=workload.model):
            return output_tensor(workload()).float()


def errors(out: torch.Tensor, ref: torch.Tensor, where: torch.Tensor | None) -> tuple[float, float, float | None]:
    """``(max relative error, mean relative error, top-1 agreement)`` over the positions ``where``."""
    if where is not None and where.shape == out.shape[:2]:
        out, ref = out[where], ref[where]
    if not torch.isfinite(out).all():
        return float("inf"), float("inf"), 0.0
    diff = (out - ref).abs()
    max_rel = (diff.max() / ref.abs().max().clamp_min(1e-30)).item()
    mean_rel = (diff.mean() / ref.abs().mean().clamp_min(1e-30)).item()
    top1 = (out.argmax(-1) == ref.argmax(-1)).float().mean().item() if out.shape[-1] > 1 else None
    return max_rel, mean_rel, top1


def reference_output(workload: Workload, reference: str = "fp32-copy") -> torch.Tensor:
    """The reference output for ``workload`` (a key of ``REFERENCES``), in float32."""
    ref_work, ref_name = _reference(workload, reference)
    return _forward(ref_work, ref_name)


def _around(around: Callable[[str], contextlib.AbstractContextManager] | None, name: str):
    return around(name) if around is not None else contextlib.nullcontext()


def numerics(model: nn.Module, workload: Workload, names: Iterable[str], reference: str = "fp32-copy",
             around: Callable[[str], contextlib.AbstractContextManager] | None = None) -> dict[str, Numerics | str]:
    """Per backend: its output against eager attention in float32 (same weights and inputs); a
    string instead where the backend could not run. ``reference`` is a key of ``REFERENCES``; ``around(name)``:
    a context each backend's own run is made in (its compiled forward), the reference's is not."""
    if workload.model is not model:
        workload = workload.for_model(model)
    ref = reference_output(workload, reference)
    dtype = next(model.parameters()).dtype
    base, _, _ = errors(_forward(workload, "eager"), ref, workload.tokens)
    tol = max(DTYPE_TOLERANCE.get(dtype, 1e-2), 2 * base)
    out: dict[str, Numerics | str] = {}
    for name in names:
        try:
            with _around(around, name):
                got = _forward(workload, name)
            mx, mean, top1 = errors(got, ref, workload.tokens)
        except BackendUnavailable as e:
            out[name] = clauses(e.reasons)
            continue
        except (RuntimeError, ValueError) as e:
            out[name] = f"{type(e).__name__}: {e}"
            continue
        out[name] = Numerics(mx, mean, top1, tol, mx <= tol)
    return out


def _reference(workload: Workload, reference: str) -> tuple[Workload, str]:
    """The workload on the reference model, and the backend that model runs: a float32 copy with eager
    attention, or the model itself with eager attention computed in float32."""
    if reference not in REFERENCES:
        raise ValueError(f"unknown numerics reference {reference!r}; use one of {', '.join(REFERENCES)}")
    model = workload.model
    if reference == "fp32-attention" or next(model.parameters()).dtype == torch.float32:
        return workload, REFERENCE
    return workload.for_model(copy.deepcopy(model).float()), "eager"


def _generated(workload: Workload, name: str) -> torch.Tensor:
    prompt = workload.prompts[0]
    with torch.no_grad(), kept(workload.model, training=False), use_backend(name, model=workload.model):
        out = workload.model.generate(**prompt, **workload.generate_kwargs())
    if getattr(workload.model.config, "is_encoder_decoder", False):
        return out[:, 1:]  # the decoder's sequence: its start token, then the generated ones
    return out[:, prompt["input_ids"].shape[1]:]


def token_agreement(workload: Workload, names: Iterable[str], reference: str = "fp32-copy",
                    around: Callable[[str], contextlib.AbstractContextManager] | None = None) -> dict:
    """Per backend: ``(fraction of generated tokens equal to the reference's, first step where any
    sequence differs or None)`` for the first prompt of a generate workload; a string where it could not
    run."""
    ref_work, ref_name = _reference(workload, reference)
    ref = _generated(ref_work, ref_name).to(device_of(workload.model))
    out: dict = {}
    for name in names:
        try:
            with _around(around, name):
                got = _generated(workload, name)
        except (BackendUnavailable, RuntimeError, ValueError) as e:
            out[name] = f"{type(e).__name__}: {e}"
            continue
        same = got == ref
        differ = (~same).any(0).nonzero()
        out[name] = (same.float().mean().item(), int(differ[0]) if len(differ) else None)
    return out


@dataclass(frozen=True)
class GradCheck:
    max_rel_err: float
    tolerance: float
    ok: bool
    worst: str | None
    reason: str | None = None  # why the backend fails: a NaN or Inf gradient


def _grads(workload: Workload, name: str | None) -> dict[str, torch.Tensor]:
    """Gradients of the workload's loss (dropout off: the model in eval mode; its modes and the user's gradients
    as found after)."""
    model = workload.model
    with kept(model, training=False), torch.enable_grad(), \
            (use_backend(name, model=model) if name else contextlib.nullcontext()):
        loss_of(model(**workload.first())).backward()
        return {n: p.grad.detach().float().clone() for n, p in model.named_parameters() if p.grad is not None}


#: a reference gradient this far below a typical one of its size (the root mean square over every parameter's
#: elements, times the square root of its count) is zero up to rounding: a key projection's bias, which softmax
#: ignores (a constant added to every score of a row). Its own norm is rounding noise, so its error is measured
#: against the typical gradient instead. A true gradient is far above it: the smallest of tiny random-weight BERT and
#: Llama (query and key weights) were 4e-4 to 5e-2 of it; the key bias's, 7e-11
ZERO_GRADIENT = 1e-5


def _grad_error(got: dict, ref: dict) -> tuple[float, str | None, str | None]:
    worst, err = None, 0.0
    count = sum(r.numel() for r in ref.values())
    rms = (sum(float(r.double().norm()) ** 2 for r in ref.values()) / count) ** 0.5 if count else 0.0
    for n, r in ref.items():
        g = got.get(n)
        if g is None:
            continue
        g = g.to(r.device)
        if not torch.isfinite(g).all():
            return float("inf"), n, f"NaN or Inf gradient in {n}"
        norm, typical = float(r.norm()), rms * r.numel() ** 0.5
        scale = norm if norm > ZERO_GRADIENT * typical else typical
        if scale > 0:
            e = float((g - r).norm()) / scale
            if e > err:
                worst, err = n, e
    return err, worst, None


def grad_numerics(workload: Workload, names: Iterable[str], reference: str = "fp32-copy",
                  around: Callable[[str], contextlib.AbstractContextManager] | None = None) -> dict:
    """Per backend: its gradients (parameters, input embeddings among them) against the reference's,
    as the largest relative error ``|g - g_ref| / |g_ref|`` (norms per parameter) over the parameters;
    the tolerance is the dtype's or twice eager attention's own error in the model's dtype. A string where
    the backend could not run the backward."""
    ref_work, ref_name = _reference(workload, reference)
    ref = _grads(ref_work, ref_name)
    base, _, _ = _grad_error(_grads(workload, "eager"), ref)
    tol = max(DTYPE_TOLERANCE.get(next(workload.model.parameters()).dtype, 1e-2), 2 * base)
    out: dict = {}
    for name in names:
        try:
            with _around(around, name):
                got = _grads(workload, name)
            err, worst, reason = _grad_error(got, ref)
        except (BackendUnavailable, RuntimeError, ValueError) as e:
            out[name] = f"{type(e).__name__}: {str(e).splitlines()[0]}"
            continue
        out[name] = GradCheck(err, tol, reason is None and err <= tol, worst, reason)
    return out
