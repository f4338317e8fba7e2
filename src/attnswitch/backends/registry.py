"""The backend registry: a plain dict of name -> ``Backend``; registering never activates anything.

Built-ins: ``naive``, ``naive-inplace``, the forced SDPA backends (``math``, ``efficient``, ``flash``,
``cudnn``), ``flex`` (FlexAttention), the adapters of third-party kernels (``fa2``, ``fa3``; offered
where their package is importable), ``auto`` (SDPA's own choice), ``eager`` (the model's own transformers
attention) and the numerics reference ``eager-fp32``. ``register_backend`` adds any kernel with SDPA's
signature; ``flex`` and the adapters are registered through the same path (as built-ins).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, packages_distributions, version

import torch
from torch.nn.attention import SDPBackend

from .. import catalog, options
from ..errors import Refused
from . import adapters, flex
from .call import Call, note, repeat_kv, unavailable, validate
from .naive import naive_attention
from .sdpa import runner, sdpa_auto

__all__ = ["Backend", "REFERENCE", "MODEL_LEVEL", "REGISTRY", "get", "names", "resolve_name", "register_backend",
           "unregister_backend", "define_backend", "default_backends", "kernel_family", "KERNEL_OPS",
           "offered", "not_offered", "package_of"]

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
    package: str | None = None  # the distribution providing the kernel; reports name it with its version
    module: str | None = None  # the import name that offers it: among "all" backends only where importable


REFERENCE = catalog.REFERENCE  # the model's eager attention in float32: the numerics reference, not compared
MODEL_LEVEL = catalog.MODEL_LEVEL  # the model's own attention code
_SDPA_ENUM = {r.name: getattr(SDPBackend, r.sdp_backend) for r in catalog.ROWS if r.sdp_backend}
#: each built-in's runner (None: the model's own attention, which needs its module); flex and the adapters are
#: registered below through register_backend's path
_RUNNERS: dict[str, Runner | None] = {
    "naive": functools.partial(naive_attention, inplace=False),
    "naive-inplace": functools.partial(naive_attention, inplace=True),
    **{name: runner(name) for name in catalog.FORCED},
    "auto": sdpa_auto, "eager": None, REFERENCE: None,
}
#: the built-ins with SDPA's signature, registered as a user's kernel is
_KERNELS = {"flex": adapters.Adapter("flex", flex.flex_sdpa, flex.flex_check, softcap=True, gqa=flex.takes_gqa),
            **{a.name: a for a in adapters.ADAPTERS}}


def _builtin(r: catalog.Row) -> Backend:
    return Backend(r.name, r.about, _RUNNERS[r.name], devices=r.devices, compared=r.compared)


#: name -> Backend, every one registered; read it anywhere, change it only through (un)register_backend
REGISTRY: dict[str, Backend] = {}
# every built-in alias (flex's and the adapters' too, which they declare again when registered); the names
# and aliases the command line checks before torch is imported are these (checked below)
_ALIASES: dict[str, str] = {}
_LOCK = threading.Lock()


def offered(b: Backend) -> bool:
    """Whether ``b`` is among the backends offered by default: its package (if it needs one) is importable."""
    return b.module is None or adapters.importable(b.module)


def names(compared: bool = False) -> list[str]:
    """Every registered backend name (with ``compared=True`` only those compared by default: not the
    numerics reference, nor adapters whose package is not installed)."""
    return [n for n, b in REGISTRY.items() if not compared or (b.compared and offered(b))]


def _valid_names() -> str:
    absent = [n for n, b in REGISTRY.items() if b.compared and not offered(b)]
    return ", ".join(names(True)) + (f" (and, with their packages installed, {', '.join(absent)})" if absent else "")


def resolve_name(name: str | SDPBackend) -> str:
    """The canonical backend name for ``name`` or an alias of it.

    Accepts the registered names, the aliases (``naive_inplace``, ``mem_efficient``, ``"SDPBackend.X"``)
    and ``SDPBackend`` members. Raises ``ValueError`` listing the valid names otherwise.
    """
    if isinstance(name, SDPBackend):
        for n, b in _SDPA_ENUM.items():
            if b == name:
                return n
        raise ValueError(f"SDPBackend {name!r} has no attnswitch backend; valid names: {_valid_names()}")
    if not isinstance(name, str):
        raise TypeError(f"backend name must be a str or SDPBackend, not {type(name).__name__}")
    key = name.strip().lower()
    if key in REGISTRY:
        return key
    if key in _ALIASES:
        return _ALIASES[key]
    raise options.unknown_backend(name, [*REGISTRY, *_ALIASES], _valid_names())


def get(name: str) -> Backend:
    """The registered backend of canonical name ``name``."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise ValueError(f"attention backend {name!r} is not registered (unregistered while in use?); valid "
                         f"names: {_valid_names()}") from None


def default_backends(device) -> list[str]:
    """Every compared backend that can exist on the device (CUDA-only ones are left out on a CPU, adapters
    whose package is not installed everywhere)."""
    dev = torch.device(device).type
    return [n for n in names(True) if REGISTRY[n].devices is None or dev in REGISTRY[n].devices]


def not_offered(device) -> dict[str, str]:
    """The backends ``default_backends`` leaves out on the device, each with why in a few words: a device it
    does not run on, or a package that is not installed."""
    dev = torch.device(device).type
    out = {}
    for n, b in REGISTRY.items():
        if not b.compared:
            continue
        if b.devices is not None and dev not in b.devices:
            out[n] = ", ".join("CUDA" if d == "cuda" else d for d in sorted(b.devices)) + " only"
        elif not offered(b):
            out[n] = f"not installed: {b.run.install}" if isinstance(b.run, _Kernel) and b.run.install else \
                "its package is not installed"
    return out


def package_of(name: str) -> str | None:
    """The distribution providing backend ``name``'s kernel with its installed version (``"flash-attn
    2.8.3"``), for reports; None for backends of torch and attnswitch."""
    b = REGISTRY.get(name)
    if b is None or b.package is None:
        return None
    ver = None
    try:
        ver = version(b.package)
    except PackageNotFoundError:
        dists = packages_distributions().get(b.module or "", []) if b.module else []
        for d in dists:  # installed under another distribution name (a source build)
            try:
                return f"{d} {version(d)}"
            except PackageNotFoundError:
                continue
        mod = adapters.module(b.module) if b.module and adapters.importable(b.module) else None
        ver = getattr(mod, "__version__", None)
    return f"{b.package} {ver}" if ver else b.package


#: ATen ops that name the attention kernel family, wherever they sit under an attention call
KERNEL_OPS = catalog.KERNEL_OPS
kernel_family = catalog.kernel_family


# -- kernels with SDPA's signature: a user's, and flex and the adapters --------------------------------

@dataclass(frozen=True)
class _Kernel:
    """The runner of a kernel with SDPA's signature: the registry's checks, then the kernel."""

    name: str
    fn: Callable
    devices: frozenset[str] | None
    check: Callable | None
    gqa: bool | Callable  # takes grouped-query inputs as they are (or a predicate ``gqa(q, k)``, per call)
    softcap: bool  # takes ``softcap=``
    module: str | None = None
    install: str | None = None

    def _refusals(self, call: Call) -> list[str]:
        reasons = []
        if self.module is not None and not adapters.importable(self.module):
            reasons.append(f"{self.name} needs the {self.module} module, which is not installed here: {self.install}")
        dev = call.q.device.type
        if self.devices is not None and dev not in self.devices:
            reasons.append(f"{self.name} runs on {', '.join(sorted(self.devices))} tensors; these are on {dev}")
        if call.softcap is not None and not self.softcap:
            reasons.append(f"{self.name} takes SDPA's arguments, which have no logit softcapping (softcap); a kernel "
                           "that takes softcap= is registered with softcap=True")
        if call.sinks is not None:
            reasons.append(f"{self.name} takes SDPA's arguments, which have no attention sinks (s_aux)")
        return reasons

    def __call__(self, call: Call) -> tuple[torch.Tensor, None]:
        validate(call)  # inputs no backend takes get SDPA's own error, not a refusal
        q, k, v = call.q, call.k, call.v
        reasons = self._refusals(call)
        native = call.gqa and not reasons and bool(self.gqa(q, k) if callable(self.gqa) else self.gqa)
        if call.gqa and not native:
            n_rep = q.shape[1] // k.shape[1]
            k, v = repeat_kv(k, n_rep), repeat_kv(v, n_rep)
        extra = {"softcap": call.softcap} if self.softcap and call.softcap is not None else {}
        if self.check is not None and not reasons:
            said = self.check(q, k, v, call.mask, call.dropout, call.causal, call.scale, native, **extra) or ()
            if not isinstance(said, (str, list, tuple)):
                raise TypeError(f"backend {self.name!r}: its check returned {type(said).__name__} {said!r}; a check "
                                "returns the reasons it cannot run the inputs (a string or a list; empty: it can)")
            reasons = [said] if isinstance(said, str) else [str(r) for r in said]  # one reason, or a list of them
        if reasons:
            raise unavailable(self.name, call, reasons)
        if call.gqa and not native:
            note(self.name, call, f"repeated k/v heads x{q.shape[1] // call.k.shape[1]} ({self.name} takes no "
                                  "grouped-query inputs like these)")
        if native:
            extra["enable_gqa"] = True
        try:
            out = self.fn(q, k, v, attn_mask=call.mask, dropout_p=call.dropout, is_causal=call.causal,
                          scale=call.scale, **extra)
        except Refused as e:
            raise unavailable(self.name, call, e.reasons) from None
        want = (q.shape[0], q.shape[1], q.shape[2], v.shape[3])
        if not isinstance(out, torch.Tensor) or tuple(out.shape) != want:
            got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
            raise RuntimeError(f"backend {self.name!r} returned {got}; an attention function returns the output "
                               f"tensor [batch, heads, query length, value dim] = {list(want)}")
        if out.dtype != q.dtype or out.device != q.device:
            raise RuntimeError(f"backend {self.name!r} returned a {out.dtype} tensor on {out.device} for {q.dtype} "
                               f"inputs on {q.device}; an attention function returns its inputs' dtype and device")
        return out, None


def _key(name) -> str:
    key = name.strip().lower() if isinstance(name, str) else None
    # ',' '=' '/' separate backends and phases; '+' marks a compiled candidate (``flash+compile``); a report writes
    # a name in backticks (a code span)
    if not key or any(c in key for c in ",=/+`") or any(c.isspace() for c in key):
        raise ValueError(f"backend name must be a non-empty string without ',', '=', '/', '+', '`' or white space: "
                         f"{name!r}")
    if key == "all":  # (``backends="all"``: every backend)
        raise ValueError("'all' means every backend; choose another name")
    return key


def _devices(devices) -> frozenset[str] | None:
    if devices is None:
        return None
    if isinstance(devices, (str, torch.device)):
        devices = [devices]
    try:
        return frozenset(torch.device(d).type for d in devices)
    except (RuntimeError, TypeError) as e:
        raise ValueError(f"devices must name device types ('cuda', 'cpu', ...): {devices!r} ({e})") from None


def define_backend(name: str, fn: Callable, *, devices=None, check: Callable | None = None,
                   gqa: bool | Callable = False, softcap: bool = False, about: str = "", package: str | None = None,
                   module: str | None = None, install: str | None = None, aliases: Iterable[str] = (),
                   builtin: bool = False) -> str:
    """``register_backend`` with what attnswitch's own kernels declare besides: ``module`` (the import name
    that offers it: left out of "all" where it is not importable, refused with ``install`` as the
    reason), ``aliases``, and ``builtin=True`` (``flex``, the adapters: never unregistered or replaced)."""
    if not callable(fn):
        raise TypeError(f"fn must be callable, not {type(fn).__name__}")
    if check is not None and not callable(check):
        raise TypeError(f"check must be callable or None, not {type(check).__name__}")
    if not (isinstance(gqa, bool) or callable(gqa)) or not isinstance(softcap, bool):
        raise TypeError("gqa must be a bool or a predicate gqa(q, k); softcap a bool")
    key, devs = _key(name), _devices(devices)
    aliases = [_key(a) for a in aliases]
    kernel = _Kernel(key, fn, devs, check, gqa, softcap, module, install or (f"pip install {package}" if package
                                                                             else None))
    doc = (getattr(fn, "__doc__", None) or "").strip().split("\n")[0]
    backend = Backend(key, about or doc or repr(fn), kernel, devices=devs, builtin=builtin, package=package,
                      module=module)
    with _LOCK:
        for n in [key, *aliases]:
            if (n in _ALIASES and not (builtin and _ALIASES[n] == key)) or (n in REGISTRY and REGISTRY[n].builtin):
                raise ValueError(f"{n!r} names a built-in backend; choose another name")
            if n in REGISTRY:
                raise ValueError(f"a backend {n!r} is already registered; unregister_backend({n!r}) first")
        REGISTRY[key] = backend
        _ALIASES.update({a: key for a in aliases})
    return key


def register_backend(name: str, fn: Callable, *, devices: Iterable[str] | str | None = None,
                     check: Callable | None = None, gqa: bool | Callable = False, softcap: bool = False,
                     about: str = "", package: str | None = None) -> str:
    """Make ``fn`` an attention backend named ``name``, everywhere a backend name is taken (``backend()``,
    ``patch()``, ``profile()``, ``compare()``, ``check()``, the CLI's ``--backends``). Returns the
    canonical name (stripped, lower case).

    ``fn(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None)`` has
    ``F.scaled_dot_product_attention``'s signature and semantics and returns the output tensor
    ``[batch, heads, query length, value dim]``. Capabilities it declares:

    - ``gqa=True``: it takes grouped-query inputs (fewer key/value heads) with ``enable_gqa=True``;
      otherwise the key/value heads are repeated for it, and reports say so. A predicate
      ``gqa(q, k) -> bool`` decides per call.
    - ``softcap=True``: it takes ``softcap=`` (logits -> ``tanh(logits / softcap) * softcap``, before
      the mask; Gemma 2) when a call has one; otherwise such calls are refused with that reason.
    - ``devices``: the device types it runs on (``{"cuda"}``); others are refused, and ``"all"``
      leaves it out there.
    - ``check(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa[, softcap=])`` returns the
      reasons it cannot run these inputs (a list, or one string; empty: it can); ``BackendUnavailable``, ``check()`` and
      reports quote them. Attention sinks are always refused (SDPA's arguments have none).

    ``about`` describes it in listings (default: the first line of ``fn``'s docstring); ``package``
    names the distribution it comes from, reported with its version. Registering never selects it.
    Built-in names and aliases cannot be taken; ``unregister_backend`` removes it again.

    Example::

        >>> def mine(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None):
        ...     return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask, dropout_p, is_causal,
        ...                                                             scale=scale)
        >>> attnswitch.register_backend("mine", mine)
        >>> report = attnswitch.compare(model, batch, backends=["mine", "cudnn"])
    """
    return define_backend(name, fn, devices=devices, check=check, gqa=gqa, softcap=softcap, about=about,
                          package=package)


def unregister_backend(name: str) -> None:
    """Remove a backend ``register_backend`` added; the registry is as it was before."""
    key = name.strip().lower() if isinstance(name, str) else name
    with _LOCK:
        b = REGISTRY.get(key)
        if b is None:
            raise ValueError(f"no registered backend {name!r}")
        if b.builtin:
            raise ValueError(f"{key!r} is built in and cannot be unregistered")
        del REGISTRY[key]
        for alias in [a for a, n in _ALIASES.items() if n == key]:
            del _ALIASES[alias]


# -- the built-ins, in the catalog's order: flex and the adapters through the path a user's kernel takes -------

def _register_builtins() -> None:
    missing = [r.name for r in catalog.ROWS if r.name not in _RUNNERS and r.name not in _KERNELS]
    unknown = (set(_RUNNERS) | set(_KERNELS)) - set(catalog.NAMES)
    if missing or unknown:  # a row without its runner, or a runner without its row: not one silent gap
        raise ImportError(f"built-in backends without a runner: {missing}; runners without a catalog row: {unknown}")
    for r in catalog.ROWS:
        k = _KERNELS.get(r.name)
        if k is None:
            REGISTRY[r.name] = _builtin(r)
            _ALIASES.update({a: r.name for a in r.aliases})
        else:
            define_backend(r.name, k.fn, devices=r.devices, check=k.check, gqa=k.gqa, softcap=k.softcap, about=r.about,
                           package=r.package, module=r.module, install=r.install, aliases=r.aliases, builtin=True)


_register_builtins()
