"""A model's layer kinds: which of its attention modules compute which kind of attention, read from its config.

- ``config.layer_types`` where the model has it (Gemma 2 and 3, GPT-OSS, Qwen2 with sliding layers, Olmo 3):
  each attention module's kind is its layer's (``sliding_attention``, ``full_attention``);
- an encoder-decoder model (T5, BART, Whisper): ``encoder`` (self-attention over the input), ``decoder``
  (causal self-attention over a growing cache) and ``cross`` (the decoder's queries against the encoder's
  output);
- a composite model (a vision tower beside a text model): each sub-model's name (``vision``, ``text``,
  ``audio``), its own kinds after a colon where it has several (``text:sliding_attention``);
- one kind, ``all``, otherwise.

The attention modules are those whose forward calls transformers' attention interface (its source names
``ALL_ATTENTION_FUNCTIONS``). A selection per kind (``candidate.Kinds``) is resolved per call by the module
that makes it (``kind_of_module``).
"""

from __future__ import annotations

import inspect
import weakref

import torch.nn as nn

__all__ = ["layer_kinds", "kind_map", "bind", "module_kind", "ALL", "CROSS_NAMES"]

#: the one kind of a model with no distinct ones
ALL = "all"
#: module names of cross-attention in transformers' encoder-decoder models
CROSS_NAMES = frozenset({"encoder_attn", "EncDecAttention", "crossattention", "cross_attn", "cross_attention"})
_CALLS: dict[type, bool] = {}
_MAPS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
#: id(attention module) -> its kind, for the models a selection per kind was given for (``bind``); an id is
#: let go when its module dies (a plain dict by id: read per call, and traced by torch.compile as it is)
_KIND_OF: dict[int, str] = {}


def _calls_interface(cls: type) -> bool:
    """Whether a module class's forward calls transformers' attention interface (read once per class)."""
    ok = _CALLS.get(cls)
    if ok is None:
        try:
            ok = "ALL_ATTENTION_FUNCTIONS" in inspect.getsource(cls.forward)
        except (OSError, TypeError):
            ok = False
        _CALLS[cls] = ok
    return ok


def _sub_model(top, config) -> str | None:
    """The name of the sub-config ``config`` is of the top config (``vision_config`` -> ``vision``)."""
    for key in getattr(top, "sub_configs", {}) or {}:
        if getattr(top, key, None) is config:
            return key.removesuffix("_config")
    return None


def _own_kind(path: str, module: nn.Module, encoder_decoder: bool) -> str:
    """The kind of one attention module, its sub-model aside."""
    parts = path.split(".")
    if encoder_decoder:
        if parts[-1] in CROSS_NAMES or getattr(module, "is_cross_attention", False):
            return "cross"
        return "encoder" if "encoder" in parts else "decoder"
    config = getattr(module, "config", None)
    types, idx = getattr(config, "layer_types", None), getattr(module, "layer_idx", None)
    if isinstance(types, (list, tuple)) and isinstance(idx, int) and 0 <= idx < len(types):
        return str(types[idx])
    return ALL


def kind_map(model: nn.Module) -> dict[str, str]:
    """Every attention module's path -> its layer kind (kept per model while it lives)."""
    cached = _MAPS.get(model)
    if cached is not None:
        return cached
    top = getattr(model, "config", None)
    encoder_decoder = bool(getattr(top, "is_encoder_decoder", False))
    found = {path: m for path, m in model.named_modules() if _calls_interface(type(m))}
    own = {path: _own_kind(path, m, encoder_decoder) for path, m in found.items()}
    subs = {path: _sub_model(top, getattr(m, "config", None)) for path, m in found.items()}
    composite = len({s for s in subs.values() if s is not None}) > 1
    out = {}
    for path in found:
        sub = subs[path] if composite else None
        if sub is None:
            out[path] = own[path]
            continue
        several = len({own[p] for p in found if subs[p] == sub}) > 1
        out[path] = f"{sub}:{own[path]}" if several else sub
    _MAPS[model] = out
    return out


def layer_kinds(model: nn.Module) -> dict[str, tuple[str, ...]]:
    """Each layer kind of ``model``, in the order its attention modules come, with their module paths:
    ``{"sliding_attention": ("model.layers.0.self_attn", ...), "full_attention": (...)}``; ``{"all": (...)}``
    for a model of one kind."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"layer_kinds takes a torch.nn.Module, not {type(model).__name__}")
    out: dict[str, list[str]] = {}
    for path, kind in kind_map(model).items():
        out.setdefault(kind, []).append(path)
    return {k: tuple(v) for k, v in out.items()}


def bind(model: nn.Module, kinds) -> None:
    """Make ``model``'s attention modules known by kind to ``module_kind``, after checking that every kind of
    ``kinds`` (a selection's) is one of the model's: ``OptionError`` naming the model's kinds otherwise."""
    from ..options import OptionError, near

    found = layer_kinds(model)
    unknown = [k for k in kinds if k not in found]
    if unknown:
        known = ", ".join(f"{k} ({len(v)} attention module{'s' if len(v) != 1 else ''})" for k, v in found.items())
        raise OptionError("{given} names layer kinds {model} does not have ({unknown}{hint}); its kinds: {known}",
                          given="; ".join(kinds), model=type(model).__name__, unknown=", ".join(unknown),
                          hint=near(unknown[0], found), known=known)
    by_path = kind_map(model)
    for path, module in model.named_modules():
        kind = by_path.get(path)
        if kind is not None and id(module) not in _KIND_OF:
            _KIND_OF[id(module)] = kind
            weakref.finalize(module, _KIND_OF.pop, id(module), None)


def module_kind(module) -> str | None:
    """The layer kind of an attention module of a model ``bind`` was given (None: not one of those)."""
    return _KIND_OF.get(id(module))
