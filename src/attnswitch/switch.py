"""The switch: ``backend()`` context manager, ``patch()``/``unpatch()``, and the bare ``attention()``.

The selection lives in a ``ContextVar`` (``hf.STATE``): contexts nest (the inner one wins, the outer
one comes back), and each thread or asyncio task sees only its own selection.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.nn as nn

from . import hf, instrument
from .backends import REFERENCE, SDPBackend, resolve_name, run_attention

__all__ = ["backend", "patch", "unpatch", "attention", "active_backend", "is_patched"]

_PATCH_ATTR = "_attnswitch_patch"


@contextlib.contextmanager
def backend(name: str | SDPBackend, model: nn.Module | None = None) -> Iterator[str]:
    r"""Compute attention with backend ``name`` inside the block.

    Without ``model`` every transformers model on the attention interface that runs in this thread
    (or task) inside the block is switched; with ``model`` only that model. On exit, normal or by
    exception, every config, transformers' registries and PyTorch's SDPA flags are as found.

    A forced backend never falls back: if it cannot run a call, ``BackendUnavailable`` says why.

    Example::

        >>> with attnswitch.backend("cudnn"):
        ...     logits = model(input_ids).logits
        >>> with attnswitch.backend("naive-inplace", model=m):
        ...     m(**batch)

    Yields the canonical backend name.
    """
    with _switched(resolve_name(name), model) as n:
        yield n


@contextlib.contextmanager
def _switched(name: str, model: nn.Module | None) -> Iterator[str]:
    if model is None:
        hf.install_global()
        token = hf.STATE.set(hf.State(name, {}))
        try:
            yield name
        finally:
            hf.STATE.reset(token)
            hf.uninstall_global()
        return
    configs = hf.switch_model(model)
    try:
        st = hf.STATE.get()
        per_config = dict(st.per_config)
        per_config.update((id(c), name) for c in configs)
        token = hf.STATE.set(hf.State(st.global_name, per_config))
        try:
            yield name
        finally:
            hf.STATE.reset(token)
    finally:
        hf.unswitch_model(configs)


@dataclass
class _Patch:
    configs: list
    backend: str


def patch(model: nn.Module, name: str | SDPBackend) -> nn.Module:
    """Make ``model`` compute attention with ``name`` until ``unpatch(model)``, in every thread.

    Patching a patched model only changes its backend; what ``unpatch`` restores is always the state
    found before the first patch. A ``backend()`` context still wins over a patch inside its block.
    """
    name = resolve_name(name)
    state: _Patch | None = getattr(model, _PATCH_ATTR, None)
    if state is None:
        state = _Patch(hf.switch_model(model), name)
        object.__setattr__(model, _PATCH_ATTR, state)  # plain attribute: not a submodule, not saved
    state.backend = name
    hf.set_patched(state.configs, name)
    return model


def unpatch(model: nn.Module) -> nn.Module:
    """Undo ``patch``: every config comes back to the value it had before the first patch."""
    state: _Patch | None = getattr(model, _PATCH_ATTR, None)
    if state is None:
        raise ValueError(f"{type(model).__name__} is not patched by attnswitch")
    hf.set_patched(state.configs, None)
    hf.unswitch_model(state.configs)
    object.__delattr__(model, _PATCH_ATTR)
    return model


def is_patched(model: nn.Module) -> str | None:
    """The backend ``model`` is patched with, or None."""
    state = getattr(model, _PATCH_ATTR, None)
    return None if state is None else state.backend


def active_backend() -> str | None:
    """The backend selected by the innermost global ``backend()`` context of this thread, or None."""
    return hf.STATE.get().global_name


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
    *,
    backend: str | SDPBackend | None = None,
) -> torch.Tensor:
    """``F.scaled_dot_product_attention`` with the active backend (``backend=`` overrides it;
    ``auto``, SDPA's own choice, when none is active). Same arguments and result as SDPA."""
    name = resolve_name(backend) if backend is not None else (active_backend() or "auto")
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(f"expected 4-d q, k, v [batch, heads, seq, dim]; got {q.dim()}, {k.dim()}, {v.dim()} dims")
    if k.shape[1] != q.shape[1]:
        if not enable_gqa:
            raise ValueError(f"q has {q.shape[1]} heads and k {k.shape[1]}: pass enable_gqa=True for grouped "
                             "query attention")
        if q.shape[1] % k.shape[1]:
            raise ValueError(f"q heads ({q.shape[1]}) must be a multiple of k/v heads ({k.shape[1]})")
    if name in ("eager", REFERENCE):
        raise ValueError(f"{name!r} is a transformers model's own attention; bare calls can use "
                         "naive, naive-inplace, math, efficient, flash, cudnn or auto")
    m = instrument.current()
    if m is not None:
        out, _ = instrument.call(m, instrument.BARE_CALL, run_attention, name, q, k, v, attn_mask, dropout_p, is_causal,
                                 scale)
    else:
        out, _ = run_attention(name, q, k, v, attn_mask, dropout_p, is_causal, scale)
    return out
