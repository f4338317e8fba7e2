"""Which transformers models compute attention through the attention interface, and what they hold.

About a fifth of transformers' model files (Bloom, GPT-Neo, MPT, ...) compute attention in their own
classes: switching them would change nothing. They are refused by name before a switch, and any model
whose forward under a switch makes no call through the interface is refused after it (``dispatch``).
"""

from __future__ import annotations

import sys
from typing import Any

import torch.nn as nn
from transformers import PreTrainedModel
from transformers.configuration_utils import PretrainedConfig

from ..errors import BackendUnavailable, UnsupportedModel
from ..sites import module_path

__all__ = ["configs_of", "legacy_attention_classes", "require_interface", "expects_attention",
           "attention_modules", "model_eager_function", "uses_interface"]

_USES_INTERFACE: dict[type, bool] = {}
_EAGER_FNS: dict[type, Any] = {}
_HEADS = ("num_attention_heads", "n_head", "num_heads", "encoder_attention_heads", "decoder_attention_heads")
_LAYERS = ("num_hidden_layers", "n_layer", "num_layers", "encoder_layers", "decoder_layers", "num_decoder_layers")


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


def uses_interface(cls: type) -> bool:
    """transformers' own reading of a model class's source: does it call the attention interface?"""
    ok = _USES_INTERFACE.get(cls)
    if ok is None:
        ok = bool(cls._can_set_attn_implementation())
        _USES_INTERFACE[cls] = ok
    return ok


def legacy_attention_classes(model: nn.Module) -> list[str]:
    """Names of the attention classes of sub-models that bypass the attention interface."""
    bad = {type(m) for m in model.modules() if isinstance(m, PreTrainedModel) and not uses_interface(type(m))}
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


def expects_attention(model: nn.Module) -> bool:
    """Whether the model has attention layers: some config names heads and layers, and some module is named like
    one (a pipeline stage of embeddings and a head, whose layers were taken out, has none)."""
    for c in configs_of(model):
        heads = next((getattr(c, a) for a in _HEADS if isinstance(getattr(c, a, None), int)), 0)
        layers = next((getattr(c, a) for a in _LAYERS if isinstance(getattr(c, a, None), int)), 1)
        if heads > 0 and layers > 0:
            return bool(_named_attention(model))
    return False


def _named_attention(model: nn.Module) -> list[tuple[str, str]]:
    """``(path, class)`` of the modules named like attention layers."""
    return [(path, type(m).__name__) for path, m in model.named_modules()
            if "attention" in type(m).__name__.lower() or path.rsplit(".", 1)[-1] in ("attn", "self_attn")]


def attention_modules(model: nn.Module, limit: int = 4) -> str:
    """The model's attention modules as text (path and class), for errors."""
    found = _named_attention(model)
    text = ", ".join(f"{p or '(root)'} ({c})" for p, c in found[:limit])
    return text + (f" and {len(found) - limit} more" if len(found) > limit else "") if found else \
        f"no module of {type(model).__name__} is named like an attention layer"


def model_eager_function(module: nn.Module):
    """The ``eager_attention_forward`` of the module's modeling file: only where transformers' lookup did not hand
    attnswitch the module's own function (a module that indexes the registry itself)."""
    cls = type(module)
    fn = _EAGER_FNS.get(cls)
    if fn is None:
        fn = getattr(sys.modules.get(cls.__module__), "eager_attention_forward", None)
        if fn is None:
            raise BackendUnavailable("eager", module_path(module),
                                     [f"{cls.__module__} defines no eager_attention_forward"])
        _EAGER_FNS[cls] = fn
    return fn
