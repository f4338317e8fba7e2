"""Numerics: each backend's model output against a float32 reference on the same weights and inputs.

The reference is eager attention in float32: in a float32 copy of the model (``fp32-copy``), or, for a
model spread over several GPUs (too large for a float32 copy), computed in float32 inside the model
(``fp32-attention``, the ``eager-fp32`` backend). The tolerance is the dtype's, or twice the error of
eager attention run in the model's own dtype, whichever is larger: a backend is judged against what
the dtype itself costs.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable

import torch
import torch.nn as nn

from .backends import REFERENCE
from .errors import BackendUnavailable
from .results import Numerics
from .switch import backend as use_backend
from .workload import Workload

__all__ = ["DTYPE_TOLERANCE", "REFERENCES", "numerics", "output_tensor", "errors"]

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
    with torch.no_grad():
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
    if reference not in REFERENCES:
        raise ValueError(f"unknown numerics reference {reference!r}; use one of {', '.join(REFERENCES)}")
    model: nn.Module = workload.model
    if reference == "fp32-attention" or next(model.parameters()).dtype == torch.float32:
        return _forward(workload, REFERENCE)  # a float32 model is its own float32 copy
    ref_model = copy.deepcopy(model).float()
    try:
        return _forward(workload.for_model(ref_model), "eager")
    finally:
        del ref_model


def numerics(model: nn.Module, workload: Workload, names: Iterable[str],
             reference: str = "fp32-copy") -> dict[str, Numerics | str]:
    """Per backend: its output against eager attention in float32 (same weights and inputs); a
    string instead where the backend could not run. ``reference`` is a key of ``REFERENCES``."""
    if workload.model is not model:
        workload = workload.for_model(model)
    ref = reference_output(workload, reference)
    dtype = next(model.parameters()).dtype
    base, _, _ = errors(_forward(workload, "eager"), ref, workload.tokens)
    tol = max(DTYPE_TOLERANCE.get(dtype, 1e-2), 2 * base)
    out: dict[str, Numerics | str] = {}
    for name in names:
        try:
            mx, mean, top1 = errors(_forward(workload, name), ref, workload.tokens)
        except BackendUnavailable as e:
            out[name] = "; ".join(e.reasons)
            continue
        except (RuntimeError, ValueError) as e:
            out[name] = f"{type(e).__name__}: {e}"
            continue
        out[name] = Numerics(mx, mean, top1, tol, mx <= tol)
    return out
