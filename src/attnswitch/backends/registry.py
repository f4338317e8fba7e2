"""The backend registry: a plain dict of name -> ``Backend``; registering never activates anything.

Built-ins: ``naive``, ``naive-inplace``, the forced SDPA backends (``math``, ``efficient``, ``flash``,
``cudnn``), ``auto`` (SDPA's own choice), ``eager`` (the model's own transformers attention) and the
numerics reference ``eager-fp32``. ``register_backend`` adds any SDPA-compatible kernel.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
from torch.nn.attention import SDPBackend

from .call import Call, note, repeat_kv, unavailable, validate
from .naive import naive_attention
from .sdpa import GPU_ONLY, forced, sdpa_auto

__all__ = ["Backend", "BACKENDS", "REFERENCE", "MODEL_LEVEL", "get", "names", "resolve_name", "register_backend",
           "unregister_backend", "default_backends", "kernel_family", "KERNEL_OPS"]

Runner = Callable[[Call], "tuple[torch.Tensor, torch.Tensor | None]"]


@dataclass(frozen=True)
class Backend:
    """One attention implementation. ``run`` takes a ``Call`` and returns ``(out [b, h, s, d], weights or
    None)``; None for the model's own attention (``eager``, ``eager-fp32``), which needs its module."""

    name: str
    about: str
    run: Runner | None = None
    devices: frozenset[str] | None = None  # device types it runs on; None: any
    compared: bool = True  # among "all" backends
    builtin: bool = True
    package: str | None = None  # the distribution (and version) providing the kernel, for reports


#: the numerics reference: the model's own eager attention computed in float32 inside a model that stays in
#: its dtype (a model too large for a float32 copy); not compared
REFERENCE = "eager-fp32"
#: backends that are the model's own attention code
MODEL_LEVEL = frozenset({"eager", REFERENCE})

_SDPA_ENUM = {"math": SDPBackend.MATH, "efficient": SDPBackend.EFFICIENT_ATTENTION,
              "flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}
_BUILTIN = [
    Backend("naive", "q @ kᵀ * scale, masked_fill (out of place: one extra Memcpy DtoD), softmax, @ v",
            functools.partial(naive_attention, inplace=False)),
    Backend("naive-inplace", "the same with masked_fill_ (no Memcpy)",
            functools.partial(naive_attention, inplace=True)),
    Backend("math", "SDPA's math backend (its own ATen op)", functools.partial(forced, "math")),
    Backend("efficient", "SDPA's memory-efficient (CUTLASS) kernel", functools.partial(forced, "efficient"),
            devices=frozenset({"cuda"})),
    Backend("flash", "SDPA's FlashAttention-2 kernel (on CPUs, its flash kernel for CPUs)",
            functools.partial(forced, "flash")),
    Backend("cudnn", "SDPA's cuDNN kernel", functools.partial(forced, "cudnn"), devices=frozenset({"cuda"})),
    Backend("auto", "SDPA's own choice (transformers' sdpa function in a model)", sdpa_auto),
    Backend("eager", "the model's own transformers eager attention"),
    Backend(REFERENCE, "the model's eager attention computed in float32 (numerics reference)", compared=False),
]
assert GPU_ONLY == {b.name for b in _BUILTIN if b.devices == frozenset({"cuda"})}

#: the built-in public backend names, in the order reports list them
BACKENDS: tuple[str, ...] = tuple(b.name for b in _BUILTIN if b.compared)

_REGISTRY: dict[str, Backend] = {b.name: b for b in _BUILTIN}
_ALIASES = {
    "naive_inplace": "naive-inplace", "naiveinplace": "naive-inplace", "mem_efficient": "efficient",
    "mem-efficient": "efficient", "memory_efficient": "efficient", "efficient_attention": "efficient",
    "flash_attention": "flash", "cudnn_attention": "cudnn", "sdpa": "auto",
    **{f"sdpbackend.{b.name.lower()}": n for n, b in _SDPA_ENUM.items()},
}
_LOCK = threading.Lock()


def names(compared: bool = False) -> list[str]:
    """Every registered backend name (only those compared by default with ``compared=True``)."""
    return [n for n, b in _REGISTRY.items() if b.compared or not compared]


def resolve_name(name: str | SDPBackend) -> str:
    """The canonical backend name for ``name`` or an alias of it.

    Accepts the registered names, the aliases (``naive_inplace``, ``mem_efficient``, ``"SDPBackend.X"``)
    and ``SDPBackend`` members. Raises ``ValueError`` listing the valid names otherwise.
    """
    if isinstance(name, SDPBackend):
        for n, b in _SDPA_ENUM.items():
            if b == name:
                return n
        raise ValueError(f"SDPBackend {name!r} has no attnswitch backend; valid names: {', '.join(names(True))}")
    if not isinstance(name, str):
        raise TypeError(f"backend name must be a str or SDPBackend, not {type(name).__name__}")
    key = name.strip().lower()
    if key in _REGISTRY:
        return key
    if key in _ALIASES:
        return _ALIASES[key]
    raise ValueError(f"unknown attention backend {name!r}; valid names: {', '.join(names(True))}")


def get(name: str) -> Backend:
    """The registered backend of canonical name ``name``."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ValueError(f"attention backend {name!r} is not registered (unregistered while in use?); valid "
                         f"names: {', '.join(names(True))}") from None


def default_backends(device) -> list[str]:
    """Every compared backend that can exist on the device (CUDA-only ones are left out on a CPU)."""
    dev = torch.device(device).type
    return [n for n, b in _REGISTRY.items() if b.compared and (b.devices is None or dev in b.devices)]


#: ATen ops that name the attention kernel family, wherever they sit under an attention call
KERNEL_OPS = ("aten::_scaled_dot_product", "aten::_flash_attention", "aten::_efficient_attention",
              "aten::_cudnn_attention")
_FAMILIES = ("cudnn", "flash", "efficient", "math")


def kernel_family(op_names: Iterable[str]) -> str | None:
    """Which SDPA backend family a list of ATen op or kernel names ran (``cudnn``, ``flash``, ...)."""
    op_names = list(op_names)
    for fam in _FAMILIES:
        if any(fam in n for n in op_names):
            return fam
    return None


# -- kernels a user brings -------------------------------------------------------------------------

def _user_runner(name: str, fn: Callable, devices, check, gqa: bool) -> Runner:
    def run(call: Call):
        q, k, v = call.q, call.k, call.v
        reasons = []
        if devices is not None and q.device.type not in devices:
            reasons.append(f"{name} runs on {', '.join(sorted(devices))} tensors; these are on {q.device.type}")
        if call.softcap is not None:
            reasons.append(f"{name} takes SDPA's arguments, which have no logit softcapping (softcap)")
        if call.sinks is not None:
            reasons.append(f"{name} takes SDPA's arguments, which have no attention sinks (s_aux)")
        repeated = call.gqa and not gqa
        if repeated:
            n_rep = q.shape[1] // k.shape[1]
            k, v = repeat_kv(k, n_rep), repeat_kv(v, n_rep)
        if check is not None and not reasons:
            reasons += [str(r) for r in (check(q, k, v, call.mask, call.dropout, call.causal, call.scale,
                                               call.gqa and gqa) or ())]
        if reasons:
            validate(call)
            raise unavailable(name, call, reasons)
        if repeated:
            note(name, call, f"repeated k/v heads x{q.shape[1] // call.k.shape[1]} ({name} declares no grouped-query "
                             "support)")
        kwargs = {"enable_gqa": True} if call.gqa and gqa else {}
        out = fn(q, k, v, attn_mask=call.mask, dropout_p=call.dropout, is_causal=call.causal, scale=call.scale,
                 **kwargs)
        return out, None
    return run


def register_backend(name: str, fn: Callable, *, devices: Iterable[str] | None = None,
                     check: Callable | None = None, gqa: bool = False, about: str = "",
                     package: str | None = None) -> str:
    """Make ``fn`` an attention backend named ``name`` (everywhere a backend name is taken).

    ``fn(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None[, enable_gqa=False])`` has
    ``F.scaled_dot_product_attention``'s signature and returns the output tensor. With ``gqa=True`` it
    gets grouped-query inputs (fewer k/v heads) with ``enable_gqa=True``; otherwise k/v heads are
    repeated for it, and reports say so. ``devices``: the device types it runs on. ``check(q, k, v,
    attn_mask, dropout_p, is_causal, scale, enable_gqa)`` returns the reasons it cannot run the
    inputs (empty: it can); ``check()`` and reports quote them. Returns the canonical name.
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable, not {type(fn).__name__}")
    key = name.strip().lower() if isinstance(name, str) else None
    if not key or "," in key or "=" in key or "/" in key:
        raise ValueError(f"backend name must be a non-empty string without ',', '=' or '/': {name!r}")
    devs = frozenset(torch.device(d).type for d in devices) if devices is not None else None
    with _LOCK:
        if key in _ALIASES or (key in _REGISTRY and _REGISTRY[key].builtin):
            raise ValueError(f"{name!r} names a built-in backend; choose another name")
        if key in _REGISTRY:
            raise ValueError(f"a backend {key!r} is already registered; unregister_backend({key!r}) first")
        _REGISTRY[key] = Backend(key, about or getattr(fn, "__doc__", None) or f"{fn!r}",
                                 _user_runner(key, fn, devs, check, gqa), devices=devs, builtin=False, package=package)
    return key


def unregister_backend(name: str) -> None:
    """Remove a backend ``register_backend`` added; the registry is as it was before."""
    key = name.strip().lower() if isinstance(name, str) else name
    with _LOCK:
        b = _REGISTRY.get(key)
        if b is None:
            raise ValueError(f"no registered backend {name!r}")
        if b.builtin:
            raise ValueError(f"{key!r} is built in and cannot be unregistered")
        del _REGISTRY[key]
