"""What of a model decides which attention backend is fastest, as a value a report and ``policy.json`` keep:
its architecture and its attention's shape (heads, key/value heads, head size, sliding windows), read from its
config. ``load_policy(...).apply(model)`` compares the model it is applied to with the one measured
(``differences``), so a pick measured on one model is not shipped silently on another.

The layer count is kept but not compared, nor how many layers are of each kind: ``--num-layers`` measures the
first layers of a model on purpose, and the pick of a model's first layers is the pick of the whole. A leaf: it
reads configs only.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["model_shape", "differences", "dtype_of", "malformed"]

#: the fields compared where a policy is applied (the layer count, and how many layers are of each kind, are not)
_COMPARED = ("model_type", "heads", "kv_heads", "head_dim", "sliding_window", "layer_kinds")
#: compared only where both configs say them (a config without ``layer_types`` does not say its layers' kinds)
_WHERE_BOTH = ("layer_kinds",)


def _int(cfg, *names) -> int | None:
    for name in names:
        value = getattr(cfg, name, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def model_shape(model) -> dict | None:
    """``{"model_type", "layers", "heads", "kv_heads", "head_dim", "sliding_window", "layer_kinds"}`` of
    ``model``'s config (its text config, for a model of several), the fields it has; None for a model without a
    transformers config."""
    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "model_type"):
        return None
    try:
        text = config.get_text_config()
    except (AttributeError, TypeError, ValueError):  # (an odd config of other code)
        text = config
    heads = _int(text, "num_attention_heads")
    hidden = _int(text, "hidden_size")
    shape = {"model_type": str(config.model_type) or None,
             "layers": _int(text, "num_hidden_layers"),
             "heads": heads,
             "kv_heads": _int(text, "num_key_value_heads") or heads,
             "head_dim": _int(text, "head_dim", "d_kv") or (hidden // heads if hidden and heads else None),
             "sliding_window": _int(text, "sliding_window")}
    kinds = getattr(text, "layer_types", None)
    if isinstance(kinds, (list, tuple)) and kinds:  # which kinds (their counts follow the layer count)
        shape["layer_kinds"] = ", ".join(sorted(set(map(str, kinds))))
    return {k: v for k, v in shape.items() if v is not None}


def dtype_of(model) -> str | None:
    """The dtype a report records for ``model``: its first parameter's (``float32``); None without one."""
    first = next(iter(model.parameters()), None) if hasattr(model, "parameters") else None
    return None if first is None else str(first.dtype).replace("torch.", "")


def differences(measured: Mapping | None, model) -> list[str]:
    """What of ``model``'s shape differs from the one ``measured`` (``model_shape`` of the measured model), as
    ``heads 32 (here 16)``; nothing where either is unknown (a policy from before shapes were kept)."""
    here = model_shape(model)
    if not isinstance(measured, Mapping) or here is None:
        return []
    return [f"{k.replace('_', ' ')} {_said(measured.get(k))} (here {_said(here.get(k))})" for k in _COMPARED
            if str(measured.get(k)) != str(here.get(k))
            and (k not in _WHERE_BOTH or (measured.get(k) is not None and here.get(k) is not None))]


#: each field's type as ``model_shape`` writes it
_TYPES = {"model_type": str, "layer_kinds": str, "layers": int, "heads": int, "kv_heads": int, "head_dim": int,
          "sliding_window": int}


def malformed(shape) -> str | None:
    """What is wrong with ``shape`` as a record of ``model_shape`` (read back from a file): not an object, or a
    field of another type (a count that is not a whole number); None where it is one (unknown fields are left)."""
    if not isinstance(shape, Mapping):
        return "must be an object"
    for key, want in _TYPES.items():
        value = shape.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, want)):
            return f"'{key}' must be {'a name' if want is str else 'a whole number'} (or absent)"
    return None


def _said(value) -> str:
    return "none" if value is None else str(value)
