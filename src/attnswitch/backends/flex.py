"""FlexAttention (``torch.nn.attention.flex_attention``) behind SDPA's signature, compiled by ``torch.compile``.

What transformers passes becomes what FlexAttention takes: ``is_causal`` (top-left aligned, as SDPA) a
causal block mask; a boolean mask (padding, sliding windows, True = attend) a block mask whose
``mask_mod`` reads the mask tensor; an additive float mask (T5's position bias arrives as one) a
``score_mod`` adding it; logit softcapping (Gemma 2) a ``score_mod`` too. Fully masked query rows give
0, as SDPA's do.

Compiling: one compiled entry per kind of call (mask kind, score kind, dtype, device, head counts and
dims, scale), made once per process. Each entry is a function with a code object of its own, so that
Dynamo counts recompilations (its ``recompile_limit``, 8 by default) per kind, not for all the models
of a process together; and each is compiled with ``fullgraph=True``, so a kind that still exhausts it
raises instead of running PyTorch's unfused fallback. Sequence lengths and batch sizes become dynamic
after their first change (Dynamo's automatic dynamic shapes), so ``generate()`` does not compile every
step. On a GPU the kernels are Triton's (inductor's FlexAttention templates); the first call of a kind
compiles them, which a profile shows in its cold columns.

What a kind costs to compile: one graph, one forward kernel (no grad: no backward; not max-autotune: one
configuration, nothing benchmarked). The default GPU run meets one kind (causal, bf16), compiled once: its
later steps, its profiled step and its numerics check reuse it (``benchmarks/startup.py`` counts the graphs
and splits the compile into Dynamo's phases). The compile stays in flex's own cold step, on the thread that
measures it. Started earlier on another thread it would run while other backends are timed and profiled:
it holds the interpreter most of the time (tracing, lowering and code generation are Python), which would
stretch their host times (the steps being timed are nearly host-bound), its ops would land in their
traces, and flex's cold columns would no longer show what a process's first call of it pays. Inductor's and
Triton's caches on disk make a later process's compile of the same kind shorter (on a CPU, a small call's
40 s became 3 s).
"""

from __future__ import annotations

import itertools
import threading
import types
import weakref
from collections import OrderedDict
from collections.abc import Callable

import torch

from ..errors import Refused
from .call import note_kernel, noting

try:
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
except ImportError:  # pragma: no cover - a torch without FlexAttention
    create_block_mask = flex_attention = None

__all__ = ["flex_sdpa", "flex_check", "takes_gqa", "CAUSAL_CACHE", "MASK_CACHE", "cache_info",
           "clear_caches"]

#: causal block masks kept (one per query length, key length and device); the oldest go first
CAUSAL_CACHE = 32
#: block masks of boolean masks kept, each while its mask tensor lives (every layer of a forward gets
#: the same mask tensor from transformers, so the block mask is built once per forward)
MASK_CACHE = 8

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_NO_FLEX = "this torch has no torch.nn.attention.flex_attention (PyTorch 2.5 or newer has it)"
_LOCK = threading.Lock()
_CAUSAL: OrderedDict[tuple, object] = OrderedDict()
_MASKS: OrderedDict[tuple, tuple] = OrderedDict()  # key -> (weakref to the mask, its finalizer, BlockMask)
_COMPILED: dict[tuple, Callable] = {}
_ENTRY_IDS = itertools.count()


# -- what FlexAttention can take ---------------------------------------------------------------------

def _triton_reason() -> str | None:
    try:
        from torch.utils._triton import has_triton
    except ImportError:  # pragma: no cover - very old torch
        return None
    return None if has_triton() else "FlexAttention compiles Triton kernels on CUDA, and Triton is not installed"


def flex_check(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False,
               softcap=None) -> list[str]:
    """Why ``flex_sdpa`` cannot run these inputs here (empty: it can). Same arguments as ``flex_sdpa``."""
    if flex_attention is None:
        return [_NO_FLEX]
    reasons = []
    if dropout_p:
        reasons.append(f"flex_attention has no dropout (dropout_p={dropout_p}); use eval mode or another backend")
    if q.dtype not in _DTYPES:
        reasons.append(f"FlexAttention takes float16, bfloat16 or float32, not {q.dtype}")
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    if q.device.type == "cuda":
        triton = _triton_reason()
        if triton:
            reasons.append(triton)
        if min(q.shape[-1], v.shape[-1]) < 16:
            reasons.append(f"FlexAttention's Triton kernels need head dims of at least 16 (q/k {q.shape[-1]}, "
                           f"v {v.shape[-1]})")
    elif q.device.type == "cpu":
        if grad:
            reasons.append("FlexAttention has no backward pass on CPUs (inputs require grad)")
        avx2 = getattr(torch.cpu, "_is_avx2_supported", lambda: True)
        if not avx2():
            reasons.append("compiled FlexAttention on CPUs needs AVX2, which this CPU lacks")
    return reasons


def takes_gqa(q: torch.Tensor, k: torch.Tensor) -> bool:
    """Whether FlexAttention gets these grouped-query inputs as they are (``enable_gqa=True``): when the
    query heads are a power of two, as transformers' own flex integration requires; otherwise the
    key/value heads are repeated for it (and reports say so)."""
    h = q.shape[1]
    return h & (h - 1) == 0


# -- block masks and score_mods --------------------------------------------------------------------

def _causal_mod(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx  # top-left aligned, as SDPA's is_causal


def _tensor_mask_mod(mask: torch.Tensor):
    def mask_mod(b, h, q_idx, kv_idx):
        return mask[b, h, q_idx, kv_idx]
    return mask_mod


def _bias_mod(bias: torch.Tensor):
    def score_mod(score, b, h, q_idx, kv_idx):
        return score + bias[b, h, q_idx, kv_idx]
    return score_mod


def _softcap_mod(cap: float):
    def score_mod(score, b, h, q_idx, kv_idx):
        return torch.tanh(score / cap) * cap
    return score_mod


def _softcap_bias_mod(cap: float, bias: torch.Tensor):
    # Gemma 2's eager order: cap the scaled logits, then add the mask
    def score_mod(score, b, h, q_idx, kv_idx):
        return torch.tanh(score / cap) * cap + bias[b, h, q_idx, kv_idx]
    return score_mod


def _full(mask: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """The mask as a [b, h, s_q, s_kv] view (broadcast dims with stride 0): every index a kernel may ask
    for is valid. Detached, so that the view does not keep the caller's tensor object alive."""
    m = mask.detach()
    m = m.reshape((1,) * (4 - m.dim()) + tuple(m.shape))
    return m.expand(q.shape[0], q.shape[1], q.shape[2], k.shape[2])


def _build(mask_mod, b: int, h: int, q_len: int, kv_len: int, device: torch.device):
    # outside inference mode: a block mask made under it could not serve a later forward with grad
    with torch.inference_mode(False), torch.no_grad():
        return create_block_mask(mask_mod, b, h, q_len, kv_len, device=device)


def _causal_block_mask(q_len: int, kv_len: int, device: torch.device):
    key = (q_len, kv_len, device)
    bm = _CAUSAL.get(key)
    if bm is None:
        bm = _build(_causal_mod, 1, 1, q_len, kv_len, device)
        with _LOCK:
            _CAUSAL[key] = bm
            while len(_CAUSAL) > CAUSAL_CACHE:
                _CAUSAL.popitem(last=False)
    return bm


def _version(t: torch.Tensor):
    try:
        return t._version
    except RuntimeError:  # inference tensors have no version counter (and cannot change outside inference mode)
        return None


def _mask_block_mask(mask: torch.Tensor, q: torch.Tensor, k: torch.Tensor):
    """The block mask of a boolean mask, reused while the same (unmodified) tensor comes back."""
    key = (id(mask), _version(mask), tuple(q.shape[:3]), k.shape[2], q.device)
    entry = _MASKS.get(key)
    if entry is not None and entry[0]() is mask:
        return entry[2]
    full = _full(mask, q, k)
    m4 = mask.reshape((1,) * (4 - mask.dim()) + tuple(mask.shape))
    bm = _build(_tensor_mask_mod(full), m4.shape[0], m4.shape[1], q.shape[2], k.shape[2], q.device)
    with _LOCK:
        # the entry goes when the caller drops the mask, so a cached view never holds on to its memory
        fin = weakref.finalize(mask, _MASKS.pop, key, None)
        fin.atexit = False
        _MASKS[key] = (weakref.ref(mask), fin, bm)
        while len(_MASKS) > MASK_CACHE:
            _, (_, old, _) = _MASKS.popitem(last=False)
            old.detach()
    return bm


def _mods(q, k, attn_mask, is_causal, softcap, cached: bool = True):
    """``(kind, block_mask, score_mod)``: how FlexAttention takes this mask and softcap (``cached=False``:
    block masks made anew, as inside a trace)."""
    if is_causal and attn_mask is not None:
        raise RuntimeError("_scaled_dot_product_attention: Explicit attn_mask should not be set when is_causal=True")
    block_kind, block_mask, bias = None, None, None
    if is_causal:
        block_mask = _causal_block_mask(q.shape[2], k.shape[2], q.device) if cached else \
            _build(_causal_mod, 1, 1, q.shape[2], k.shape[2], q.device)
        block_kind = "causal"
    elif attn_mask is not None and attn_mask.dtype == torch.bool:
        m4 = attn_mask.reshape((1,) * (4 - attn_mask.dim()) + tuple(attn_mask.shape))
        block_mask = _mask_block_mask(attn_mask, q, k) if cached else \
            _build(_tensor_mask_mod(_full(attn_mask, q, k)), m4.shape[0], m4.shape[1], q.shape[2], k.shape[2], q.device)
        block_kind = "mask"
    elif attn_mask is not None:
        bias = _full(attn_mask, q, k)
    if softcap is not None and bias is not None:
        return (block_kind, "softcap+bias"), block_mask, _softcap_bias_mod(float(softcap), bias)
    if softcap is not None:
        return (block_kind, "softcap"), block_mask, _softcap_mod(float(softcap))
    if bias is not None:
        return (block_kind, "bias"), block_mask, _bias_mod(bias)
    return (block_kind, None), block_mask, None


# -- compiled entries ------------------------------------------------------------------------------

def _entry(q, k, v, score_mod, block_mask, scale, enable_gqa):
    return flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale, enable_gqa=enable_gqa)


def _new_entry() -> Callable:
    """``_entry`` with a code object of its own: Dynamo caches compiled code, and limits recompiling, per
    code object, so each kind of call gets its own budget."""
    name = f"flex_attention_{next(_ENTRY_IDS)}"
    code = _entry.__code__.replace(co_name=name)
    if hasattr(code, "co_qualname"):
        code = code.replace(co_qualname=name)
    return types.FunctionType(code, _entry.__globals__, name)


def _compile(fn: Callable) -> Callable:
    # fullgraph: a kind that exceeds Dynamo's recompile limit raises instead of running unfused
    return torch.compile(fn, fullgraph=True)


def _compiled(key: tuple) -> Callable:
    fn = _COMPILED.get(key)
    if fn is None:
        with _LOCK:
            fn = _COMPILED.get(key)
            if fn is None:
                fn = _COMPILED[key] = _compile(_new_entry())
    return fn


def flex_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor | None = None,
              dropout_p: float = 0.0, is_causal: bool = False, scale: float | None = None, enable_gqa: bool = False,
              softcap: float | None = None, *, compiled: bool = True, cached: bool = True) -> torch.Tensor:
    """``F.scaled_dot_product_attention`` computed by FlexAttention, plus ``softcap`` (logits ->
    ``tanh(logits / softcap) * softcap`` before the mask). ``compiled=False`` runs FlexAttention's op
    uncompiled: eagerly PyTorch's unfused reference of the same block mask and score_mod (for checking,
    slow), inside a ``torch.compile`` trace the op the compile builds kernels for; ``cached=False`` makes
    block masks anew (a trace's are fake)."""
    if flex_attention is None:
        raise RuntimeError(_NO_FLEX)
    if dropout_p:
        raise ValueError(f"flex_attention has no dropout (dropout_p={dropout_p})")
    kind, block_mask, score_mod = _mods(q, k, attn_mask, is_causal, softcap, cached)
    if block_mask is not None and cached and noting():  # (untimed steps only: it reads the block mask)
        _note_blocks(kind[0], block_mask, q.shape[2], k.shape[2])
    if not compiled:
        return flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale, enable_gqa=enable_gqa)
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    key = (kind, q.dtype, q.device, q.shape[1], k.shape[1], q.shape[-1], v.shape[-1], scale, enable_gqa,
           None if softcap is None else float(softcap), grad)
    try:
        return _compiled(key)(q, k, v, score_mod, block_mask, scale, enable_gqa)
    except Exception as e:
        if not type(e).__module__.startswith(("torch._inductor", "torch._dynamo")):
            raise
        first = (str(e).strip().splitlines() or [""])[0][:300]
        raise Refused(f"torch.compile built no FlexAttention kernel for these inputs ({type(e).__name__}: {first})") \
            from e


def _note_blocks(kind: str, block_mask, q_len: int, kv_len: int) -> None:
    """How much of the score square a block mask has FlexAttention compute: the blocks outside a causal mask, a
    sliding window or padding are skipped."""
    computed = 100.0 - float(block_mask.sparsity())
    what = "a causal mask" if kind == "causal" else "the mask transformers made (a sliding window, padding)"
    note_kernel("flex", f"its block mask of {what} at {q_len}x{kv_len} computes {computed:.0f} % of the score "
                        "blocks and skips the rest")


def cache_info() -> dict[str, int]:
    """How many compiled entries, causal block masks and mask block masks are held now."""
    return {"compiled": len(_COMPILED), "causal": len(_CAUSAL), "masks": len(_MASKS)}


def clear_caches() -> None:
    """Forget the block masks (the compiled entries stay: compiling is what the cache saves)."""
    with _LOCK:
        _CAUSAL.clear()
        while _MASKS:
            _, (_, fin, _) = _MASKS.popitem()
            fin.detach()
