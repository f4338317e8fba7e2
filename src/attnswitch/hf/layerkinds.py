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
``ALL_ATTENTION_FUNCTIONS``). A selection per kind (``candidate.Kinds``) is bound to its model (``bind``) and
resolved per call by the module that makes it (``BoundKinds.kind_of``).
"""

from __future__ import annotations

import inspect
import weakref
from dataclasses import dataclass, field

import torch.nn as nn

from ..candidate import Kinds
from ..words import counted

__all__ = ["layer_kinds", "kind_map", "bind", "BoundKinds", "ALL", "CROSS_NAMES"]

#: the one kind of a model with no distinct ones
ALL = "all"
#: module names of cross-attention in transformers' encoder-decoder models
CROSS_NAMES = frozenset({"encoder_attn", "EncDecAttention", "crossattention", "cross_attn", "cross_attention"})
_CALLS: dict[type, bool] = {}


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
    """Every attention module's path -> its layer kind, read from the model as it is now."""
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


@dataclass(frozen=True, eq=False)
class BoundKinds(Kinds):
    """A selection per kind bound to one model: the kind of each of its attention modules, read again from the
    model where a module it does not know calls (one added after the switch was made)."""

    model: object = None  # a weak reference to the model
    of_module: dict = field(default_factory=dict, repr=False)  # id(module) -> (weak ref, kind or None)

    def __eq__(self, other) -> bool:  # as the selection it is: its kinds and their backends
        return isinstance(other, Kinds) and self.by_kind == other.by_kind

    __hash__ = Kinds.__hash__

    def kind_of(self, module) -> str | None:
        found = self.of_module.get(id(module))
        if found is not None and found[0]() is module:
            return found[1]
        model = self.model() if self.model is not None else None
        kinds = _module_kinds(model) if model is not None else {}
        self.of_module.update(kinds)
        if id(module) not in kinds:  # not an attention module of the model: remembered as none
            self.of_module[id(module)] = (weakref.ref(module), None)
        return self.of_module[id(module)][1]


def _module_kinds(model: nn.Module) -> dict[int, tuple]:
    by_path = kind_map(model)
    return {id(m): (weakref.ref(m), by_path[path]) for path, m in model.named_modules() if path in by_path}


def bind(model: nn.Module, sel: Kinds) -> BoundKinds:
    """``sel`` bound to ``model``'s attention modules (``BoundKinds``), after checking that every kind it names is
    one of the model's: ``OptionError`` naming the model's kinds otherwise."""
    from ..options import OptionError, near

    found = layer_kinds(model)
    unknown = [k for k in sel.kinds if k not in found]
    if unknown:
        known = ", ".join(f"{k} ({counted(len(v), 'attention module')})" for k, v in found.items())
        raise OptionError("{model} has no layer kind {unknown}{hint}; its layer kinds: {known}",
                          model=type(model).__name__, unknown=" or ".join(map(repr, unknown)),
                          hint=near(unknown[0], found), known=known)
    return BoundKinds(sel.by_kind, weakref.ref(model), _module_kinds(model))
