"""One attention call: its arguments as one value, the checks every backend shares, notes it leaves.

``Call`` carries SDPA-shaped inputs (``q [b, h_q, s_q, d]``, ``k, v [b, h_kv, s_kv, d]``) and what
transformers passes besides (softcap, attention sinks, whether weights are wanted, the call site).
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import NamedTuple

import torch

from ..errors import BackendUnavailable
from ..sites import site_name

__all__ = ["Call", "check", "validate", "unavailable", "describe", "recording_notes", "note", "noting", "note_kernel",
           "repeat_kv", "autocast_inputs", "autocasting"]


class Call(NamedTuple):
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    mask: torch.Tensor | None = None  # bool (True = attend) or additive float, broadcastable to [b, h, s_q, s_kv]
    dropout: float = 0.0
    causal: bool = False  # top-left aligned, as SDPA's is_causal
    scale: float | None = None
    softcap: float | None = None  # logits -> tanh(logits / softcap) * softcap (Gemma 2)
    sinks: torch.Tensor | None = None  # per query head, a logit that takes softmax mass and no value (GPT-OSS)
    need_weights: bool = False
    where: object = None  # the calling module, a name, or None for a bare call

    @property
    def gqa(self) -> bool:
        return self.k.shape[1] != self.q.shape[1]


def describe(call: Call) -> str:
    q, k, v, mask = call.q, call.k, call.v, call.mask
    m = "None" if mask is None else f"{mask.dtype} {tuple(mask.shape)}"
    return (f"q {tuple(q.shape)} k {tuple(k.shape)} v {tuple(v.shape)} {q.dtype} on {q.device}, attn_mask={m}, "
            f"is_causal={call.causal}, dropout_p={call.dropout}")


def unavailable(name: str, call: Call, reasons: list[str]) -> BackendUnavailable:
    return BackendUnavailable(name, site_name(call.where), reasons, describe(call))


def check(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None,
          enable_gqa: bool = True) -> None:
    """The one check of an attention call's inputs: raise what ``F.scaled_dot_product_attention`` raises for
    inputs no backend takes (a ``RuntimeError``, as SDPA's own checks do): q, k, v that are not 4-d
    ``[batch, heads, seq, dim]``; differing or non-float dtypes, devices, q/k head dims; fewer k/v heads than q
    heads without ``enable_gqa`` (transformers' calls: always grouped-query), or k/v heads that do not divide
    q's; a mask of another dtype or one that does not broadcast to the scores."""
    qs, ks, vs = q.shape, k.shape, v.shape  # (each ``.shape`` makes a new object: read once, as this runs per call)
    if len(qs) != 4 or len(ks) != 4 or len(vs) != 4:
        raise RuntimeError(f"expected 4-d q, k, v [batch, heads, seq, dim]; got {len(qs)}, {len(ks)}, {len(vs)} dims")
    dtype = q.dtype
    if k.dtype is not dtype or v.dtype is not dtype:
        raise RuntimeError(f"Expected query, key, and value to have the same dtype, but got query.dtype: {dtype} "
                           f"key.dtype: {k.dtype} and value.dtype: {v.dtype} instead.")
    if not dtype.is_floating_point:
        raise RuntimeError(f"expected floating point query, key and value, got {dtype}")
    device = q.device
    if k.device != device or v.device != device:
        raise RuntimeError(f"Expected query, key, and value to have the same device, got {device}, {k.device}, "
                           f"{v.device}")
    if qs[3] != ks[3] or ks[2] != vs[2] or ks[1] != vs[1]:
        raise RuntimeError(f"q/k head dims and k/v lengths and heads must agree: q {tuple(qs)}, k {tuple(ks)}, "
                           f"v {tuple(vs)}")
    if ks[1] != qs[1] and not enable_gqa:
        raise RuntimeError(f"q has {qs[1]} heads and k/v {ks[1]}: fewer k/v heads than q heads are taken "
                           "with enable_gqa=True only (grouped-query attention), as in scaled_dot_product_attention")
    if qs[1] % ks[1]:
        raise RuntimeError(f"Number of heads in key and value ({ks[1]}) must divide the number of heads in "
                           f"query ({qs[1]})")
    if mask is not None:
        if mask.dtype not in (torch.bool, torch.float32, dtype):
            raise RuntimeError(f"Expected attn_mask dtype to be bool or float or to match query dtype, but got "
                               f"attn_mask.dtype: {mask.dtype} and  query.dtype: {dtype} instead.")
        scores = (max(qs[0], ks[0]), qs[1], qs[2], ks[2])
        try:
            ok = torch.broadcast_shapes(tuple(mask.shape), scores) == scores
        except RuntimeError:
            ok = False
        if not ok:
            raise RuntimeError(f"attn_mask of shape {tuple(mask.shape)} does not broadcast to the attention scores "
                               f"{list(scores)}")


def validate(call: Call) -> None:
    """``check`` of a call as transformers makes it (k/v heads fewer than q's: grouped-query attention)."""
    check(call.q, call.k, call.v, call.mask)


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """``[b, h_kv, s, d] -> [b, h_kv * n_rep, s, d]``, each key/value head repeated for its query group."""
    if n_rep == 1:
        return x
    b, h, s, d = x.shape
    return x[:, :, None].expand(b, h, n_rep, s, d).reshape(b, h * n_rep, s, d)


# -- notes: layout changes made so that a backend can run (reported, since they cost kernels) ------

_NOTES: ContextVar[list | None] = ContextVar("attnswitch_notes", default=None)


class recording_notes:
    """Collect the notes (e.g. ``repeated k/v heads``) that attention calls make inside the block, as
    ``(backend, where, text)``."""

    def __enter__(self) -> list[tuple[str, str, str]]:
        self.notes: list[tuple[str, str, str]] = []
        self._token = _NOTES.set(self.notes)
        return self.notes

    def __exit__(self, *exc) -> None:
        _NOTES.reset(self._token)


def note(backend: str, call: Call, text: str) -> None:
    notes = _NOTES.get()
    if notes is not None:
        notes.append((backend, site_name(call.where), text))


def noting() -> bool:
    """Whether notes are being recorded in this context (a kernel may then work out what it notes)."""
    return _NOTES.get() is not None


def note_kernel(backend: str, text: str) -> None:
    """A note a kernel makes about itself (no call site at hand)."""
    notes = _NOTES.get()
    if notes is not None:
        notes.append((backend, "", text))


_AUTOCAST_ON = torch.is_autocast_enabled
_AUTOCAST_CASTS = (torch.float32, torch.float16, torch.bfloat16)  # what autocast casts (never float64)


def autocasting() -> bool:
    """Whether ``torch.autocast`` is on for CUDA or CPU in the calling thread."""
    return _AUTOCAST_ON("cuda") or _AUTOCAST_ON("cpu")


def autocast_inputs(q, k, v, mask=None):
    """q, k, v and a float mask as SDPA's own entry takes them under ``torch.autocast``: cast to autocast's dtype
    (a float32 model's q, k and v, or Llama's float32 q and k, from RoPE's float32 cos and sin, beside a cast v),
    float64 left as it is. The forced ops are called below autocast, which casts only at the public function, so
    the cast is made here; outside autocast, nothing changes."""
    device = q.device.type
    if not _AUTOCAST_ON(device):
        return q, k, v, mask
    dtype = torch.get_autocast_dtype(device)
    q, k, v = (t.to(dtype) if t.dtype in _AUTOCAST_CASTS else t for t in (q, k, v))
    if mask is not None and mask.dtype in _AUTOCAST_CASTS:
        mask = mask.to(dtype)
    return q, k, v, mask
