"""transformers integration: registry entries, config switching and restoring, legacy-model check.

Models on transformers' attention interface look up ``ALL_ATTENTION_FUNCTIONS`` by
``config._attn_implementation`` on every forward, and ``masking_utils`` builds their masks from
``ALL_MASK_ATTENTION_FUNCTIONS`` under the same name. attnswitch uses that key two ways:

* model-scoped (``backend(name, model=m)``, ``patch``): the name ``"attnswitch"`` is registered
  for attention *and* masks, and every config of the model is set to it until the last user exits;
* global (``backend(name)``): the ``sdpa`` and ``eager`` entries are overridden while any global
  context is active.

Either way the entry is a dispatcher that asks the caller's ``ContextVar`` state which backend is
selected for this config; with none selected (another thread, outside any context) it runs what
was there before, so the override is invisible to code that did not ask for it.
"""

from __future__ import annotations

import sys
import threading
import types
import warnings
import weakref
from collections.abc import Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn as nn
from transformers import PreTrainedModel
from transformers.configuration_utils import PretrainedConfig
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from . import instrument
from .backends import REFERENCE, run_attention
from .errors import BackendUnavailable, UnsupportedModel
from .sites import module_path
from .sites import remember_paths as _remember_paths

__all__ = ["NAME", "REFERENCE", "STATE", "State", "selected", "attention_forward", "mask_forward",
           "install_global", "uninstall_global", "switch_model", "unswitch_model", "set_patched", "configs_of",
           "snapshot", "legacy_attention_classes", "require_interface", "model_eager_function", "module_path"]

NAME = "attnswitch"
_GLOBAL_KEYS = ("sdpa", "eager")  # the registry keys models already name
_REGISTRIES = (ALL_ATTENTION_FUNCTIONS, ALL_MASK_ATTENTION_FUNCTIONS)
_MISSING = object()
_LOCK = threading.RLock()


# ---------------------------------------------------------------------------------------------
# selection state (read on every attention call, so kept to a ContextVar get and dict lookups)


@dataclass(frozen=True)
class State:
    """The calling context's selection: a global backend and per-config (model-scoped) ones."""

    global_name: str | None = None
    per_config: Mapping[int, str] = field(default_factory=lambda: types.MappingProxyType({}))


STATE: ContextVar[State] = ContextVar("attnswitch_state", default=State())  # noqa: B039 (immutable)
_PATCHED: dict[int, tuple[weakref.ref, str]] = {}  # id(config) -> (config, backend) for patch()


def selected(config) -> str | None:
    """The backend selected for ``config`` in the calling context, or None: the innermost context
    wins (a model-scoped one over a global one it is nested in, and vice versa), then ``patch``."""
    st = STATE.get()
    if st.per_config:
        name = st.per_config.get(id(config))
        if name is not None:
            return name
    if st.global_name is not None:
        return st.global_name
    p = _PATCHED.get(id(config))
    if p is not None and p[0]() is config:
        return p[1]
    return None


# ---------------------------------------------------------------------------------------------
# originals: what each registry key meant before attnswitch touched it


_ORIGINAL: dict[tuple[int, str], Any] = {}  # (registry index, key) -> function or _MISSING


def _original(reg: int, key: str):
    if (reg, key) in _ORIGINAL:
        fn = _ORIGINAL[(reg, key)]
        return None if fn is _MISSING else fn
    return _REGISTRIES[reg]._global_mapping.get(key)


def _override(reg: int, key: str, fn) -> None:
    mapping = _REGISTRIES[reg]._global_mapping
    _ORIGINAL[(reg, key)] = mapping.get(key, _MISSING)
    mapping[key] = fn


def _restore(reg: int, key: str) -> None:
    mapping = _REGISTRIES[reg]._global_mapping
    fn = _ORIGINAL.pop((reg, key))
    if fn is _MISSING:
        mapping.pop(key, None)
    else:
        mapping[key] = fn


_EAGER_FNS: dict[type, Any] = {}


def model_eager_function(module: nn.Module):
    """The model's own ``eager_attention_forward`` (defined in, or imported into, its modeling file)."""
    cls = type(module)
    fn = _EAGER_FNS.get(cls)
    if fn is None:
        fn = getattr(sys.modules.get(cls.__module__), "eager_attention_forward", None)
        if fn is None:
            raise BackendUnavailable("eager", module_path(module),
                                     [f"{cls.__module__} defines no eager_attention_forward"])
        _EAGER_FNS[cls] = fn
    return fn


def _original_attention(key: str | None, module):
    if key is None or key == "eager":
        return _original(0, "eager") or model_eager_function(module)
    fn = _original(0, key)
    if fn is None:
        raise KeyError(f"attention implementation {key!r} is not registered in transformers")
    return fn


def _key_before(config) -> str | None:
    key = config._attn_implementation_internal
    if key == NAME:
        s = _SWITCHED.get(id(config))
        if s is None:
            raise RuntimeError(
                f"config {type(config).__name__} names {NAME!r} but attnswitch did not switch it "
                "(a copy of a switched model?); set its attention implementation again")
        key = s.original
    return key


# ---------------------------------------------------------------------------------------------
# the dispatchers registered in transformers' registries


def attention_forward(module, query, key, value, attention_mask, **kwargs):
    """Entry for ``ALL_ATTENTION_FUNCTIONS``: runs the selected backend, else what was there."""
    m = instrument.current()
    if m is not None:
        return instrument.call(m, module_path(module), _dispatch, module, query, key, value, attention_mask, **kwargs)
    return _dispatch(module, query, key, value, attention_mask, **kwargs)


def _dispatch(module, query, key, value, attention_mask, **kwargs):
    config = getattr(module, "config", None)
    name = selected(config)
    if name is None:
        fn = _original_attention(_key_before(config) if config is not None else None, module)
        return fn(module, query, key, value, attention_mask, **kwargs)
    if name == "eager":
        return model_eager_function(module)(module, query, key, value, _additive(attention_mask, query.dtype),
                                            **kwargs)
    if name == REFERENCE:
        mask = _additive(attention_mask, torch.float32)
        out, weights = model_eager_function(module)(module, query.float(), key.float(), value.float(),
                                                    mask.float() if mask is not None else None, **kwargs)
        return out.to(query.dtype), weights
    if name == "auto":  # SDPA's own choice, through transformers' own sdpa function
        return _original_attention("sdpa", module)(module, query, key, value, attention_mask, **kwargs)
    return _run_selected(name, module, query, key, value, attention_mask, **kwargs)


def _run_selected(name, module, query, key, value, mask, dropout=0.0, scaling=None, is_causal=None,
                  position_bias=None, softcap=None, output_attentions=False, **_):
    # The same reading of transformers' arguments as its sdpa function: causal only without a mask
    # and for more than one query; k/v cropped for a prefill into an empty static cache. A sliding
    # window is already in the mask (or needs none: every key is inside the window).
    q_len = query.shape[2]
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    causal = bool(q_len > 1 and mask is None and causal)
    if causal and key.shape[2] > q_len:
        key, value = key[:, :, :q_len], value[:, :, :q_len]
        if position_bias is not None:
            position_bias = position_bias[..., :q_len]
    if position_bias is not None:
        mask = position_bias_mask(position_bias, mask, causal, query, key)
        causal = False
    elif mask is not None and mask.dtype != torch.bool and mask.dtype != query.dtype:
        mask = mask.to(query.dtype)
    need_weights = bool(output_attentions)
    if need_weights and name not in ("naive", "naive-inplace"):
        warnings.warn(f"the {name} backend cannot return attention weights; attentions will be None", stacklevel=3)
    out, weights = run_attention(name, query, key, value, mask, dropout, causal, scaling, softcap=softcap,
                                 need_weights=need_weights, where=module)
    return out.transpose(1, 2).contiguous(), weights


def mask_forward(*args, config=None, **kwargs):
    """Entry for ``ALL_MASK_ATTENTION_FUNCTIONS``: the mask the selected backend expects (a float
    additive one for ``eager``, SDPA's boolean-or-None one for the rest), else what was there."""
    name = selected(config) if config is not None else STATE.get().global_name
    if name is None:
        key = _key_before(config) if config is not None else "sdpa"
        fn = _original(1, key if key is not None else "eager")
    else:
        fn = _original(1, "eager" if name in ("eager", REFERENCE) else "sdpa")
    return fn(*args, config=config, **kwargs)


def _additive(mask: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    if mask is None or mask.dtype != torch.bool:
        return mask
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, torch.finfo(dtype).min)


def position_bias_mask(position_bias, mask, is_causal, query, key) -> torch.Tensor:
    """T5-style relative position bias folded into one additive mask (as transformers' sdpa does)."""
    low = torch.finfo(query.dtype).min
    bias = position_bias.to(query.dtype)
    if mask is None:
        if is_causal:
            q_len, kv_len = query.shape[2], key.shape[2]
            keep = torch.ones(q_len, kv_len, dtype=torch.bool, device=query.device).tril_()
            bias = torch.where(keep, bias, low)
        return bias.contiguous()
    if mask.dtype == torch.bool:
        return torch.where(mask, bias, low).contiguous()
    return (bias + mask.to(query.dtype)).contiguous()


# ---------------------------------------------------------------------------------------------
# installing the entries: refcounted, restored exactly when the last user leaves

_global_users = 0


def install_global() -> None:
    global _global_users
    with _LOCK:
        if _global_users == 0:
            for key in _GLOBAL_KEYS:
                _override(0, key, attention_forward)
                _override(1, key, mask_forward)
            _install_legacy_guard()
        _global_users += 1


def uninstall_global() -> None:
    global _global_users
    with _LOCK:
        _global_users -= 1
        if _global_users == 0:
            _remove_legacy_guard()
            for key in _GLOBAL_KEYS:
                _restore(0, key)
                _restore(1, key)


@dataclass
class _Switched:
    config: Any
    original: Any
    users: int


_SWITCHED: dict[int, _Switched] = {}


def switch_model(model: nn.Module) -> list:
    """Point every config of ``model`` at attnswitch's entry (refcounted); returns the configs."""
    require_interface(model)
    configs = configs_of(model)
    _remember_paths(model)
    with _LOCK:
        if not _SWITCHED:
            _override(0, NAME, attention_forward)
            _override(1, NAME, mask_forward)
        for c in configs:
            s = _SWITCHED.get(id(c))
            if s is None:
                _SWITCHED[id(c)] = _Switched(c, c._attn_implementation_internal, 1)
                c._attn_implementation_internal = NAME
            else:
                s.users += 1
    return configs


def unswitch_model(configs: list) -> None:
    """Undo one ``switch_model``: the last user restores each config's value exactly as found."""
    with _LOCK:
        for c in configs:
            s = _SWITCHED[id(c)]
            s.users -= 1
            if s.users == 0:
                c._attn_implementation_internal = s.original
                del _SWITCHED[id(c)]
        if not _SWITCHED:
            _restore(0, NAME)
            _restore(1, NAME)


def set_patched(configs: list, name: str | None) -> None:
    with _LOCK:
        for c in configs:
            if name is None:
                _PATCHED.pop(id(c), None)
            else:
                _PATCHED[id(c)] = (weakref.ref(c), name)


def configs_of(model: nn.Module) -> list:
    """Every distinct config reachable from the model: each module's ``config`` (T5's stacks hold
    copies) and, recursively, their sub-configs (text/vision configs of multimodal models)."""
    found: dict[int, Any] = {}
    stack = [m.config for m in model.modules() if isinstance(getattr(m, "config", None), PretrainedConfig)]
    while stack:
        c = stack.pop()
        if id(c) in found:
            continue
        found[id(c)] = c
        for key in getattr(c, "sub_configs", {}) or {}:
            sub = getattr(c, key, None)
            if isinstance(sub, PretrainedConfig):
                stack.append(sub)
    return list(found.values())


def snapshot(model: nn.Module) -> dict[int, Any]:
    """``id(config) -> _attn_implementation_internal`` for every config of the model."""
    return {id(c): c._attn_implementation_internal for c in configs_of(model)}


# ---------------------------------------------------------------------------------------------
# models that do not use the interface (Falcon, Bloom, GPT-Neo, ...): switching them would do
# nothing, or build wrong masks, so they are refused by name


_USES_INTERFACE: dict[type, bool] = {}


def _uses_interface(cls: type) -> bool:
    ok = _USES_INTERFACE.get(cls)
    if ok is None:
        ok = bool(cls._can_set_attn_implementation())
        _USES_INTERFACE[cls] = ok
    return ok


def legacy_attention_classes(model: nn.Module) -> list[str]:
    """Names of the attention classes of sub-models that bypass the attention interface."""
    bad = {type(m) for m in model.modules() if isinstance(m, PreTrainedModel) and not _uses_interface(type(m))}
    if not bad:
        return []
    modules = {c.__module__ for c in bad}
    names = {type(m).__name__ for m in model.modules()
             if type(m).__module__ in modules and "attention" in type(m).__name__.lower()}
    for mod in modules:  # classes defined in the modeling file, also those this config never builds
        for attr, obj in vars(sys.modules[mod]).items():
            if isinstance(obj, type) and issubclass(obj, nn.Module) and "attention" in attr.lower() \
                    and obj.__module__ == mod:
                names.add(attr)
    return sorted(names) or sorted(c.__name__ for c in bad)


def require_interface(model: nn.Module) -> None:
    """Raise ``UnsupportedModel`` unless every sub-model uses transformers' attention interface."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"expected a torch.nn.Module, got {type(model).__name__}")
    if not any(isinstance(m, PreTrainedModel) for m in model.modules()):
        raise UnsupportedModel(f"{type(model).__name__} contains no transformers PreTrainedModel")
    classes = legacy_attention_classes(model)
    if classes:
        raise UnsupportedModel(
            f"{type(model).__name__} computes attention in its own classes ({', '.join(classes)}), not "
            "through transformers' attention interface, so its attention cannot be switched")


_SAVED_CALL = PreTrainedModel.__dict__.get("__call__", _MISSING)
_CALL = nn.Module.__call__ if _SAVED_CALL is _MISSING else _SAVED_CALL


def _guarded_call(self, *args, **kwargs):
    if STATE.get().global_name is not None and not _uses_interface(type(self)):
        require_interface(self)
    return _CALL(self, *args, **kwargs)


def _install_legacy_guard() -> None:
    # A global context cannot know which models will run in it; a transformers model that bypasses
    # the interface is refused when it is called, instead of running its own attention unnoticed.
    # Only PreTrainedModel calls pass through here (a forward hook on every module would cost
    # microseconds per module call).
    PreTrainedModel.__call__ = _guarded_call


def _remove_legacy_guard() -> None:
    if PreTrainedModel.__dict__.get("__call__") is _guarded_call:
        if _SAVED_CALL is _MISSING:
            del PreTrainedModel.__call__
        else:
            PreTrainedModel.__call__ = _SAVED_CALL
