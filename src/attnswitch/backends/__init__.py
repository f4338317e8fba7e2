"""Attention backends: the registry (``registry``), one call's arguments and checks (``call``), the
hand-written attention (``naive``), PyTorch's SDPA backends forced without flags (``sdpa``),
FlexAttention (``flex``), third-party kernels (``adapters``, ``hub``)."""

from __future__ import annotations

from .call import Call, recording_notes, validate
from .flex import flex_check, flex_sdpa
from .hub import register_hub_kernel
from .naive import naive_attention
from .policy import Policy, choose, kernel_families, parse_backends, phase_backends, resolve_selection
from .registry import (
    KERNEL_OPS,
    MODEL_LEVEL,
    REFERENCE,
    Backend,
    default_backends,
    get,
    kernel_family,
    names,
    not_offered,
    package_of,
    register_backend,
    resolve_name,
    unregister_backend,
)
from .sdpa import FORCED, GPU_ONLY, auto_choice, eligibility

#: the built-in public backend names offered here (adapters only where their package is installed), in the
#: order reports list them
BACKENDS: tuple[str, ...] = tuple(names(compared=True))

__all__ = ["BACKENDS", "KERNEL_OPS", "MODEL_LEVEL", "REFERENCE", "FORCED", "GPU_ONLY", "Backend", "Call",
           "auto_choice", "default_backends", "eligibility", "flex_check", "flex_sdpa", "get", "kernel_family",
           "naive_attention", "names", "not_offered", "package_of", "parse_backends", "recording_notes",
           "register_backend", "register_hub_kernel", "resolve_name", "run", "unregister_backend", "validate",
           "Policy", "choose", "resolve_selection", "phase_backends",
           "kernel_families"]


def run(name: str, call: Call):
    """Run ``call`` with the canonical backend ``name``: ``(out [b, h_q, s_q, d_v], weights or None)``."""
    b = get(name)
    if b.run is None:
        raise ValueError(f"{name!r} is a transformers model's own attention and needs its module; bare calls can "
                         f"use {', '.join(n for n in names(True) if get(n).run is not None)}")
    return b.run(call)
