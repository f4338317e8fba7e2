"""The hand-written attention of the post: ``softmax(q @ kᵀ * scale, masked) @ v``, out of place or in place.

It computes what ``F.scaled_dot_product_attention`` computes, fully masked rows included (they give
0, as SDPA's safe softmax does), and honours what SDPA cannot: logit softcapping and attention sinks.
Causal attention with no mask is the post's kernel sequence: a GEMM, the scale, ``masked_fill`` (out
of place: one Memcpy DtoD more), softmax, a GEMM. A padding mask adds two small kernels over the mask
(which rows are fully masked, then zeroing them in the output).
"""

from __future__ import annotations

import threading
from collections import OrderedDict

import torch
import torch.nn.functional as F

from .call import Call, repeat_kv, validate

__all__ = ["naive_attention", "causal_mask", "fresh_masks", "CAUSAL_CACHE_BYTES"]

#: bytes of causal masks kept for reuse (one per shape and device); the oldest go first
CAUSAL_CACHE_BYTES = 64 * 2**20
_CAUSAL: OrderedDict[tuple, torch.Tensor] = OrderedDict()
_CAUSAL_BYTES = [0]
_CAUSAL_LOCK = threading.Lock()


class _Fresh(threading.local):
    on = False  # inside a trace (fake tensors): masks made anew, never cached nor taken from the cache


_FRESH = _Fresh()


class fresh_masks:
    """Inside the block (this thread), ``causal_mask`` makes each mask anew: a trace must neither keep its
    fake tensors nor take a real one from the cache."""

    def __enter__(self) -> None:
        self._was, _FRESH.on = _FRESH.on, True

    def __exit__(self, *exc) -> None:
        _FRESH.on = self._was


def causal_mask(q_len: int, kv_len: int, device: torch.device) -> torch.Tensor:
    """True above the diagonal (positions to hide), top-left aligned as SDPA's ``is_causal``. Cached per
    shape and device up to ``CAUSAL_CACHE_BYTES``, always as an ordinary tensor (one made under
    ``inference_mode`` could not be saved for a later backward)."""
    if _FRESH.on:
        return torch.ones(q_len, kv_len, dtype=torch.bool, device=device).triu_(1)
    key = (q_len, kv_len, device)
    mask = _CAUSAL.get(key)
    if mask is not None:
        return mask
    with torch.inference_mode(False), torch.no_grad():
        mask = torch.ones(q_len, kv_len, dtype=torch.bool, device=device).triu_(1)
    with _CAUSAL_LOCK:
        if key not in _CAUSAL and mask.numel() <= CAUSAL_CACHE_BYTES:
            _CAUSAL[key] = mask
            _CAUSAL_BYTES[0] += mask.numel()
            while _CAUSAL_BYTES[0] > CAUSAL_CACHE_BYTES:
                _, old = _CAUSAL.popitem(last=False)
                _CAUSAL_BYTES[0] -= old.numel()
    return mask


def _hide(call: Call, dtype: torch.dtype):
    """``(positions to hide or None, additive mask or None, fully masked query rows or None)``."""
    mask = call.mask
    if call.causal:
        if mask is not None:
            raise RuntimeError("pass either attn_mask or is_causal=True, not both (as SDPA's math backend)")
        return causal_mask(call.q.shape[-2], call.k.shape[-2], call.q.device), None, None
    if mask is None:
        return None, None, None
    if mask.dtype == torch.bool:
        hide = mask.logical_not()
        return hide, None, hide.all(-1, keepdim=True)
    neg = torch.isneginf(mask)
    dead = neg.all(-1, keepdim=True)
    if dtype == torch.float16:
        # a row hidden by a finite minimum (T5's masks) plus any score below -16 overflows half precision to a row
        # of -inf, whose softmax is NaN; SDPA adds in float32, where it reads softmax of the scores. Softmax is
        # blind to a shift of a row: each row shifted so its largest mask value is 0, where that value is within
        # half precision's range (below it, float32's own minimum drowns the scores in float32 too: left as is)
        top = mask.amax(-1, keepdim=True)
        mask = mask - top.masked_fill(top < torch.finfo(torch.float16).min, 0.0)
    # finite, in the scores' dtype, where a row would be -inf throughout (softmax's NaN, and NaN gradients: it is
    # zeroed after); -inf beside finite values stays -inf, as SDPA reads it
    additive = mask.to(dtype).clamp_min(torch.finfo(dtype).min)
    return None, additive.masked_fill_(neg & ~dead, float("-inf")), dead


def naive_attention(call: Call, *, inplace: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Run ``call``; returns ``(out [b, h_q, s_q, d_v], weights or None)`` (weights when asked for)."""
    validate(call)
    q, k, v = call.q, call.k, call.v
    n_rep = q.shape[1] // k.shape[1]
    k, v = repeat_kv(k, n_rep), repeat_kv(v, n_rep)
    scale = q.shape[-1] ** -0.5 if call.scale is None else call.scale
    scores = q @ k.transpose(-2, -1) * scale
    if call.softcap is not None:
        scores = torch.tanh(scores / call.softcap) * call.softcap
    hide, additive, dead = _hide(call, scores.dtype)
    if hide is not None:
        fill = torch.finfo(scores.dtype).min
        scores = scores.masked_fill_(hide, fill) if inplace else scores.masked_fill(hide, fill)
    elif additive is not None:
        scores = scores.add_(additive) if inplace else scores + additive
    if call.sinks is not None:  # a column that takes softmax mass and contributes no value
        sinks = call.sinks.reshape(1, -1, 1, 1).to(scores.dtype).expand(scores.shape[0], -1, scores.shape[2], 1)
        logits = torch.cat([scores, sinks], dim=-1)
        weights = torch.softmax(logits - logits.amax(-1, keepdim=True), dim=-1)[..., :-1]
    else:
        weights = torch.softmax(scores, dim=-1)
    if dead is not None:
        weights = weights.masked_fill(dead, 0.0) if call.need_weights else weights
    if call.dropout > 0.0:
        weights = F.dropout(weights, p=call.dropout, training=True)
    out = weights @ v
    if dead is not None:
        out = out.masked_fill(dead, 0.0)
    return out, (weights if call.need_weights else None)
