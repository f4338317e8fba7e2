"""Installed third-party attention kernels behind SDPA's signature: FlashAttention 2 (``flash_attn``),
FlashAttention 3 (``flash_attn_interface``) and kernels from the Hugging Face hub (the ``kernels`` package).

Their ``flash_attn_func`` takes ``[b, s, h, d]`` tensors, grouped-query inputs as they are, a scale,
``causal`` and ``softcap``; it takes no attention mask (padding needs the varlen interface with
sequence offsets; a sliding window its ``window_size``), so a call with a mask is refused with that
reason rather than computed without it. Its causal mask is aligned to the bottom-right corner, SDPA's
to the top-left: the two agree only when query and key lengths are equal, so causal calls with unequal
lengths are refused too. A decode step (one query, no mask, not causal) runs as it is.

transformers' own ``flash_attention_2`` / ``flash_attention_3`` entries call these same kernels, but
read which one from the model's config and take transformers' 2-D padding masks, which only setting
the model's attention implementation gives; attnswitch switches without writing configs, so it calls
the kernels itself (``flash_attention_2`` and ``flash_attention_3`` are aliases of ``fa2`` and ``fa3``).
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import inspect
import sys
from collections.abc import Callable
from dataclasses import dataclass

import torch

__all__ = ["Adapter", "ADAPTERS", "flash_attn_2", "flash_attn_3", "check_flash_attn_2", "check_flash_attn_3",
           "hub_adapter", "importable", "module"]

_HALF = (torch.float16, torch.bfloat16)


@dataclass(frozen=True)
class Adapter:
    """The runner of a kernel with SDPA's signature: its function, its check and what it takes (where it comes
    from, its names and its package are its row in ``catalog``)."""

    name: str
    fn: Callable
    check: Callable
    softcap: bool = True
    gqa: bool | Callable = True  # grouped-query inputs as they are (or a predicate ``gqa(q, k)``, per call)


def importable(name: str) -> bool:
    """Whether ``import name`` can find the module (without importing it)."""
    if name in sys.modules:
        return sys.modules[name] is not None
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def module(name: str):
    """The module ``name``, imported on first use (never at attnswitch's import: CUDA extensions are slow to load)."""
    return sys.modules.get(name) or importlib.import_module(name)


@functools.cache
def _parameters(fn) -> frozenset[str]:
    try:
        return frozenset(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return frozenset()


def _semantic_reasons(label: str, q, k, attn_mask, is_causal) -> list[str]:
    """What a ``flash_attn_func`` would compute differently from SDPA: it takes no mask, and aligns
    causal masks to the other corner."""
    reasons = []
    if attn_mask is not None:
        reasons.append(f"{label}'s flash_attn_func takes no attention mask (padding needs its varlen interface, a "
                       f"sliding window its window_size); these inputs carry a {str(attn_mask.dtype).split('.')[-1]} "
                       f"mask of shape {tuple(attn_mask.shape)}")
    if is_causal and q.shape[2] != k.shape[2]:
        reasons.append(f"{label} aligns its causal mask to the bottom-right corner and SDPA to the top-left: they "
                       f"agree only for equal query and key lengths, here {q.shape[2]} and {k.shape[2]}")
    return reasons


def _layout_reasons(label: str, q, k, v, attn_mask, is_causal) -> list[str]:
    """``_semantic_reasons`` and what the kernels refuse: dtypes, head dims, GPUs before Ampere."""
    reasons = _semantic_reasons(label, q, k, attn_mask, is_causal)
    if q.dtype not in _HALF:
        reasons.append(f"{label} takes float16 or bfloat16, not {str(q.dtype).split('.')[-1]}")
    if not (q.shape[-1] == k.shape[-1] == v.shape[-1]) or q.shape[-1] > 256:
        reasons.append(f"{label} takes equal head dims of at most 256 for q, k and v; got {q.shape[-1]}, "
                       f"{k.shape[-1]}, {v.shape[-1]}")
    if q.device.type == "cuda" and torch.cuda.get_device_capability(q.device) < (8, 0):
        reasons.append(f"{label} needs an Ampere or newer GPU (compute capability 8.0+)")
    return reasons


def _kernel_reasons(label: str, mod_name: str, attr: str, softcap) -> tuple[Callable | None, list[str]]:
    try:
        fn = getattr(module(mod_name), attr)
    except Exception as e:  # a broken CUDA extension raises anything at import
        return None, [f"import {mod_name} failed: {type(e).__name__}: {e}"]
    if softcap is not None and "softcap" not in _parameters(fn):
        return fn, [f"this {label} ({mod_name}) has no softcap parameter (FlashAttention 2.6 and newer have it)"]
    return fn, []


def _bshd(t: torch.Tensor) -> torch.Tensor:
    return t.transpose(1, 2)  # [b, h, s, d] -> [b, s, h, d], a view: the kernels take strided batch/seq/head dims


def _refuse(reasons: list[str]) -> None:
    if reasons:
        raise ValueError("; ".join(reasons))


def check_flash_attn_2(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False,
                       softcap=None, *, mod_name: str = "flash_attn", label: str = "FlashAttention 2") -> list[str]:
    """Why ``flash_attn_2`` cannot run these inputs (empty: it can)."""
    _, reasons = _kernel_reasons(label, mod_name, "flash_attn_func", softcap)
    return reasons + _layout_reasons(label, q, k, v, attn_mask, is_causal)


def flash_attn_2(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False,
                 softcap=None, *, mod_name: str = "flash_attn") -> torch.Tensor:
    """SDPA's signature over ``flash_attn.flash_attn_func`` (``[b, s, h, d]``, grouped-query heads as they
    are). Raises ``ValueError`` for inputs it would compute differently from SDPA (see the module)."""
    _refuse(_semantic_reasons("FlashAttention 2", q, k, attn_mask, is_causal))
    kw = {} if softcap is None else {"softcap": float(softcap)}
    out = module(mod_name).flash_attn_func(_bshd(q), _bshd(k), _bshd(v), dropout_p=dropout_p, softmax_scale=scale,
                                           causal=is_causal, **kw)
    return out.transpose(1, 2)


def check_flash_attn_3(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False,
                       softcap=None, *, mod_name: str = "flash_attn_interface",
                       label: str = "FlashAttention 3") -> list[str]:
    """Why ``flash_attn_3`` cannot run these inputs (empty: it can)."""
    _, reasons = _kernel_reasons(label, mod_name, "flash_attn_func", softcap)
    if dropout_p:
        reasons.append(f"{label} has no dropout (dropout_p={dropout_p}); use eval mode or another backend")
    return reasons + _layout_reasons(label, q, k, v, attn_mask, is_causal)


def flash_attn_3(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False,
                 softcap=None, *, mod_name: str = "flash_attn_interface") -> torch.Tensor:
    """SDPA's signature over ``flash_attn_interface.flash_attn_func`` (FlashAttention 3: no dropout)."""
    _refuse(_semantic_reasons("FlashAttention 3", q, k, attn_mask, is_causal)
            + ([f"FlashAttention 3 has no dropout (dropout_p={dropout_p})"] if dropout_p else []))
    kw = {} if softcap is None else {"softcap": float(softcap)}
    out = module(mod_name).flash_attn_func(_bshd(q), _bshd(k), _bshd(v), softmax_scale=scale, causal=is_causal,
                                           **kw)
    if isinstance(out, tuple):  # builds before return_attn_probs returned (out, softmax_lse) always
        out = out[0]
    return out.transpose(1, 2)


def hub_adapter(kernel, repo_id: str) -> tuple[Callable, Callable]:
    """``(fn, check)`` for a hub kernel module's ``flash_attn_func``: FlashAttention 2's arguments if it
    takes ``dropout_p``, else FlashAttention 3's."""
    flash = getattr(kernel, "flash_attn_func", None)
    if flash is None:
        raise ValueError(f"the hub kernel {repo_id} has no flash_attn_func (it has: "
                         f"{', '.join(n for n in dir(kernel) if not n.startswith('_'))})")
    fa2 = "dropout_p" in _parameters(flash)
    label = f"{repo_id} (FlashAttention {'2' if fa2 else '3'} arguments)"

    def fn(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False, softcap=None):
        _refuse(_semantic_reasons(label, q, k, attn_mask, is_causal))
        kw = {} if softcap is None else {"softcap": float(softcap)}
        if fa2:
            kw["dropout_p"] = dropout_p
        elif dropout_p:
            raise ValueError(f"{label} has no dropout")
        out = flash(_bshd(q), _bshd(k), _bshd(v), softmax_scale=scale, causal=is_causal, **kw)
        return (out[0] if isinstance(out, tuple) else out).transpose(1, 2)

    def check(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False,
              softcap=None) -> list[str]:
        reasons = _layout_reasons(label, q, k, v, attn_mask, is_causal)
        if dropout_p and not fa2:
            reasons.append(f"{label} has no dropout (dropout_p={dropout_p})")
        if softcap is not None and "softcap" not in _parameters(flash):
            reasons.append(f"{label} has no softcap parameter")
        return reasons

    fn.__doc__ = f"flash_attn_func of the hub kernel {repo_id}"
    return fn, check


#: the kernels offered when their package is importable
ADAPTERS = (Adapter("fa2", flash_attn_2, check_flash_attn_2), Adapter("fa3", flash_attn_3, check_flash_attn_3))
