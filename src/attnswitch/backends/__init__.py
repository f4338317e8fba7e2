"""Attention backends: the registry (``registry``), one call's arguments and checks (``call``), the
hand-written attention (``naive``) and PyTorch's SDPA backends forced without flags (``sdpa``)."""

from __future__ import annotations

from .call import Call, recording_notes, validate
from .naive import naive_attention
from .policy import Policy, choose, parse_backends, resolve_selection
from .registry import (
    BACKENDS,
    KERNEL_OPS,
    MODEL_LEVEL,
    REFERENCE,
    Backend,
    default_backends,
    get,
    kernel_family,
    names,
    register_backend,
    resolve_name,
    unregister_backend,
)
from .sdpa import FORCED, GPU_ONLY, auto_choice, eligibility

__all__ = ["BACKENDS", "KERNEL_OPS", "MODEL_LEVEL", "REFERENCE", "FORCED", "GPU_ONLY", "Backend", "Call",
           "auto_choice", "default_backends", "eligibility", "get", "kernel_family", "naive_attention", "names",
           "parse_backends", "recording_notes", "register_backend", "resolve_name", "run", "unregister_backend",
           "validate", "Policy", "choose", "resolve_selection"]


def run(name: str, call: Call):
    """Run ``call`` with the canonical backend ``name``: ``(out [b, h_q, s_q, d_v], weights or None)``."""
    b = get(name)
    if b.run is None:
        raise ValueError(f"{name!r} is a transformers model's own attention and needs its module; bare calls can "
                         f"use {', '.join(n for n in names(True) if get(n).run is not None)}")
    return b.run(call)
