"""The backend registry: name -> attention implementation, with eligibility and its reasons.

Every implementation takes SDPA-shaped inputs (``q [b, h_q, s_q, d]``, ``k, v [b, h_kv, s_kv, d]``)
and returns ``(out [b, h_q, s_q, d_v], weights or None)``. The SDPA backends call
``F.scaled_dot_product_attention`` with exactly one backend enabled, so the kernel that runs is the
one ``torch.nn.attention.sdpa_kernel`` would pick, preprocessing included; they never fall back.
"""

from __future__ import annotations

import re
import threading
import warnings
from contextvars import ContextVar

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, _backend_names

from .errors import BackendUnavailable
from .sites import site_name

__all__ = [
    "BACKENDS",
    "REFERENCE",
    "SDPA_BACKENDS",
    "GPU_ONLY",
    "resolve_name",
    "run_attention",
    "naive_attention",
    "recording_notes",
    "KERNEL_OPS",
    "kernel_family",
    "auto_choice",
    "default_backends",
    "parse_backends",
]

#: Public backend names, in the order reports list them.
BACKENDS: tuple[str, ...] = ("naive", "naive-inplace", "math", "efficient", "flash", "cudnn", "auto", "eager")

#: Not listed among the backends compared: the model's own eager attention computed in float32 inside a model
#: that stays in its dtype, the numerics reference for a model too large for a float32 copy.
REFERENCE = "eager-fp32"

#: The SDPA backend each forced name enables (and nothing else).
SDPA_BACKENDS: dict[str, SDPBackend] = {
    "math": SDPBackend.MATH,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "flash": SDPBackend.FLASH_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
}

#: Backends that PyTorch implements only for CUDA tensors.
GPU_ONLY = frozenset({"efficient", "cudnn"})

_ALIASES = {
    "naive_inplace": "naive-inplace",
    "naiveinplace": "naive-inplace",
    "mem_efficient": "efficient",
    "mem-efficient": "efficient",
    "memory_efficient": "efficient",
    "efficient_attention": "efficient",
    "flash_attention": "flash",
    "cudnn_attention": "cudnn",
    "sdpa": "auto",
}
_ALIASES.update({f"sdpbackend.{b.name.lower()}": n for n, b in SDPA_BACKENDS.items()})


#: ATen ops that name the attention kernel family, wherever they sit under an attention call
KERNEL_OPS = ("aten::_scaled_dot_product", "aten::_flash_attention", "aten::_efficient_attention",
              "aten::_cudnn_attention")
_FAMILIES = ("cudnn", "flash", "efficient", "math")


def kernel_family(names) -> str | None:
    """Which SDPA backend family a list of ATen op or kernel names ran (``cudnn``, ``flash``, ...)."""
    names = list(names)
    for fam in _FAMILIES:
        if any(fam in n for n in names):
            return fam
    return None


def auto_choice(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor | None = None,
                dropout_p: float = 0.0, is_causal: bool = False, scale: float | None = None,
                enable_gqa: bool = False) -> str:
    """The backend SDPA's own choice (``auto``) takes for these inputs under the current flags."""
    choice = torch._fused_sdp_choice(q, k, v, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)
    for name, b in SDPA_BACKENDS.items():
        if int(b) == int(choice):
            return name
    return SDPBackend(choice).name.lower()


def resolve_name(name: str | SDPBackend) -> str:
    """Return the canonical backend name for ``name`` or an alias of it.

    Accepts the public names, the aliases (``naive_inplace``, ``mem_efficient``, ``"SDPBackend.X"``)
    and ``SDPBackend`` members. Raises ``ValueError`` listing the valid names otherwise.
    """
    if isinstance(name, SDPBackend):
        for n, b in SDPA_BACKENDS.items():
            if b == name:
                return n
        raise ValueError(f"SDPBackend {name!r} has no attnswitch backend; valid names: {', '.join(BACKENDS)}")
    if not isinstance(name, str):
        raise TypeError(f"backend name must be a str or SDPBackend, not {type(name).__name__}")
    key = name.strip().lower()
    if key in BACKENDS or key == REFERENCE:
        return key
    if key in _ALIASES:
        return _ALIASES[key]
    raise ValueError(f"unknown attention backend {name!r}; valid names: {', '.join(BACKENDS)}")


def default_backends(device) -> list[str]:
    """Every backend that can exist on the device (the GPU-only ones are left out on a CPU)."""
    cpu = torch.device(device).type != "cuda"
    return [b for b in BACKENDS if not (cpu and b in GPU_ONLY)]


def parse_backends(spec, device) -> list[str]:
    """Canonical names, in order, without repeats, from ``spec``: None or ``"all"`` (every backend that
    can exist on ``device``), a comma-separated string, or an iterable of names."""
    if spec is None or spec == "all":
        return default_backends(device)
    if isinstance(spec, str):
        spec = [b for b in spec.split(",") if b.strip()]
    names = [resolve_name(b) for b in spec]
    if not names:
        raise ValueError("no backends given: name at least one, or 'all'")
    return list(dict.fromkeys(names))


# ---------------------------------------------------------------------------------------------
# notes: layout changes made so that a forced backend can run (reported, since they cost kernels)

_NOTES: ContextVar[list | None] = ContextVar("attnswitch_notes", default=None)


class recording_notes:
    """Collect the notes (e.g. ``repeated k/v heads``) that attention calls make inside the block."""

    def __enter__(self) -> list[tuple[str, str, str]]:
        self.notes: list[tuple[str, str, str]] = []
        self._token = _NOTES.set(self.notes)
        return self.notes

    def __exit__(self, *exc) -> None:
        _NOTES.reset(self._token)


def _note(backend: str, where: str | None, text: str) -> None:
    notes = _NOTES.get()
    if notes is not None:
        notes.append((backend, where or "(bare call)", text))


# ---------------------------------------------------------------------------------------------
# naive: the hand-written attention of the post, out of place or in place


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """``[b, h_kv, s, d] -> [b, h_kv * n_rep, s, d]``, each key/value head repeated for its query group."""
    if n_rep == 1:
        return x
    b, h, s, d = x.shape
    return x[:, :, None].expand(b, h, n_rep, s, d).reshape(b, h * n_rep, s, d)


_CAUSAL_CACHE: dict[tuple, torch.Tensor] = {}
_CAUSAL_LOCK = threading.Lock()


def _causal_mask(q_len: int, kv_len: int, device: torch.device) -> torch.Tensor:
    """True above the diagonal (positions to hide), built once per shape and device, as SDPA's
    ``is_causal`` aligns it (top left)."""
    key = (q_len, kv_len, device)
    mask = _CAUSAL_CACHE.get(key)
    if mask is None:
        mask = torch.ones(q_len, kv_len, dtype=torch.bool, device=device).triu_(1)
        with _CAUSAL_LOCK:
            if len(_CAUSAL_CACHE) > 64:  # bound the cache for decode loops over many lengths
                _CAUSAL_CACHE.clear()
            _CAUSAL_CACHE[key] = mask
    return mask


def naive_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    *,
    inplace: bool = False,
    softcap: float | None = None,
    need_weights: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Hand-written attention: ``softmax(q @ kᵀ * scale, masked) @ v``.

    ``inplace=False`` masks with ``masked_fill`` (a copy of the scores, one Memcpy DtoD on CUDA),
    ``inplace=True`` with ``masked_fill_``. Masked scores get the dtype's lowest finite value, as
    transformers' eager attention does, so rows with every key masked (left padding) stay finite.
    """
    if is_causal and attn_mask is not None:
        raise ValueError("pass either attn_mask or is_causal=True, not both (as scaled_dot_product_attention)")
    n_rep = q.shape[1] // k.shape[1]
    k, v = repeat_kv(k, n_rep), repeat_kv(v, n_rep)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    scores = q @ k.transpose(-2, -1) * scale
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    fill = torch.finfo(scores.dtype).min
    if is_causal:
        hide = _causal_mask(q.shape[-2], k.shape[-2], q.device)
    elif attn_mask is not None and attn_mask.dtype == torch.bool:
        hide = attn_mask.logical_not()
    else:
        hide = None
    if hide is not None:
        scores = scores.masked_fill_(hide, fill) if inplace else scores.masked_fill(hide, fill)
    elif attn_mask is not None:  # additive float mask
        scores = scores.add_(attn_mask) if inplace else scores + attn_mask
    weights = torch.softmax(scores, dim=-1)
    if dropout_p > 0.0:
        weights = F.dropout(weights, p=dropout_p, training=True)
    return weights @ v, (weights if need_weights else None)


# ---------------------------------------------------------------------------------------------
# forced SDPA backends: the flags are process-global, so they are set, used and restored around
# each call under one lock; a thread outside attnswitch never sees them changed between calls.

_FLAG_NAMES = tuple(_backend_names)  # ("cudnn", "flash", "mem_efficient", "math", "overrideable")
_GET = tuple(getattr(torch._C, f"_get_{n}_sdp_enabled") for n in _FLAG_NAMES)
_SET = tuple(getattr(torch._C, f"_set_sdp_use_{n}") for n in _FLAG_NAMES)
_ONLY: dict[str, tuple[bool, ...]] = {
    name: tuple(getattr(SDPBackend, _backend_names[n]) == b for n in _FLAG_NAMES) for name, b in SDPA_BACKENDS.items()
}
_FLAG_LOCK = threading.Lock()


def sdpa_flags() -> dict[str, bool]:
    """PyTorch's current SDPA backend flags (process-global)."""
    return {n: g() for n, g in zip(_FLAG_NAMES, _GET)}


def _sdpa_call(only: tuple[bool, ...] | None, q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa):
    if only is None:  # "auto": SDPA's own choice under the flags as the user left them
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale, enable_gqa=enable_gqa
        )
    with _FLAG_LOCK:
        saved = [g() for g in _GET]
        try:
            for s, on in zip(_SET, only):
                s(on)
            return F.scaled_dot_product_attention(
                q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale,
                enable_gqa=enable_gqa,
            )
        finally:
            for s, on in zip(_SET, saved):
                s(on)


# Per (backend, device type, GQA, mask given): whether the backend ran such inputs as given
# (_DIRECT) or after repeating k/v heads (_REPEAT). The first call of a kind runs with warnings
# recorded, so that a refusal can quote PyTorch's reasons; later calls take the plain path, and a
# refusal there (a new head dim, say) is diagnosed the same way.
_DIRECT, _REPEAT = "direct", "repeat_kv"
_TRIGGERED = re.compile(r"\s*\(Triggered internally at [^)]*\)\s*$")
_PLANS: dict[tuple, str] = {}

def _where(where) -> str | None:
    return where if where is None or isinstance(where, str) else site_name(where)


def describe_inputs(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False) -> str:
    mask = "None" if attn_mask is None else f"{attn_mask.dtype} {tuple(attn_mask.shape)}"
    return (f"q {tuple(q.shape)} k {tuple(k.shape)} v {tuple(v.shape)} {q.dtype} on {q.device}, "
            f"attn_mask={mask}, is_causal={is_causal}, dropout_p={dropout_p}")


def _own_reasons(name: str, q: torch.Tensor, softcap) -> list[str]:
    """Reasons PyTorch does not phrase itself (it only says no backend is viable)."""
    reasons = []
    if name in GPU_ONLY and q.device.type != "cuda":
        reasons.append(f"the {name} backend runs only on CUDA tensors; these are on {q.device.type}")
    if softcap is not None:
        reasons.append("scaled_dot_product_attention has no logit softcapping (softcap); use naive or eager")
    return reasons


def _sdpa_forced(name, q, k, v, attn_mask, dropout_p, is_causal, scale, softcap, where):
    if softcap is not None:
        raise BackendUnavailable(name, _where(where), _own_reasons(name, q, softcap),
                                 describe_inputs(q, k, v, attn_mask, dropout_p, is_causal))
    only = _ONLY.get(name)
    gqa = k.shape[1] != q.shape[1]
    key = (name, q.is_cuda, gqa, attn_mask is None)
    plan = _PLANS.get(key)
    if plan is None:
        return _sdpa_first_call(name, only, key, q, k, v, attn_mask, dropout_p, is_causal, scale, gqa, where)
    try:
        if plan == _REPEAT:
            return _sdpa_call_repeated(name, only, q, k, v, attn_mask, dropout_p, is_causal, scale, where)
        return _sdpa_call(only, q, k, v, attn_mask, dropout_p, is_causal, scale, gqa)
    except torch.OutOfMemoryError:
        raise
    except RuntimeError:
        return _sdpa_first_call(name, only, key, q, k, v, attn_mask, dropout_p, is_causal, scale, gqa, where)


def _sdpa_call_repeated(name, only, q, k, v, attn_mask, dropout_p, is_causal, scale, where):
    """A pure layout change for a backend that refuses GQA inputs: the same attention with each k/v
    head repeated for its query group (two copy kernels), noted for the report."""
    n_rep = q.shape[1] // k.shape[1]
    out = _sdpa_call(only, q, repeat_kv(k, n_rep), repeat_kv(v, n_rep), attn_mask, dropout_p, is_causal, scale,
                     False)
    if _NOTES.get() is not None:
        _note(name, _where(where), f"repeated k/v heads x{n_rep} (the {name} backend refuses GQA inputs)")
    return out


def _sdpa_first_call(name, only, key, q, k, v, attn_mask, dropout_p, is_causal, scale, gqa, where):
    where = _where(where)
    early = _own_reasons(name, q, None)
    if early:
        raise BackendUnavailable(name, where, early, describe_inputs(q, k, v, attn_mask, dropout_p, is_causal))
    errors: list[str] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            out = _sdpa_call(only, q, k, v, attn_mask, dropout_p, is_causal, scale, gqa)
            _PLANS[key] = _DIRECT
            return out
        except torch.OutOfMemoryError:
            raise
        except RuntimeError as e:
            errors.append(str(e).strip().splitlines()[0])
        if gqa:
            try:
                out = _sdpa_call_repeated(name, only, q, k, v, attn_mask, dropout_p, is_causal, scale, where)
                _PLANS[key] = _REPEAT
                return out
            except torch.OutOfMemoryError:
                raise
            except RuntimeError as e:
                errors.append("with k/v heads repeated: " + str(e).strip().splitlines()[0])
    reasons = list(dict.fromkeys(_TRIGGERED.sub("", str(w.message)).strip() for w in caught)) + errors
    raise BackendUnavailable(name, where, reasons, describe_inputs(q, k, v, attn_mask, dropout_p, is_causal))


def run_attention(
    name: str,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    *,
    softcap: float | None = None,
    need_weights: bool = False,
    where: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Run attention with the canonical backend ``name`` (see ``resolve_name``).

    Returns ``(out [b, h_q, s_q, d_v], weights or None)``; only the naive backends return weights,
    and only when ``need_weights``. Raises ``BackendUnavailable`` when a forced backend refuses.
    """
    if name == "naive" or name == "naive-inplace":
        return naive_attention(q, k, v, attn_mask, dropout_p, is_causal, scale, inplace=name == "naive-inplace",
                               softcap=softcap, need_weights=need_weights)
    if name in ("eager", REFERENCE):
        raise ValueError(f"{name!r} is a transformers model's own attention and needs its module; "
                         "for a hand-written bare attention use 'naive'")
    return _sdpa_forced(name, q, k, v, attn_mask, dropout_p, is_causal, scale, softcap, where), None

