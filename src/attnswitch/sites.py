"""Names of the places attention is called from: a module's path in its model, for errors and reports.

Paths are remembered per module object (weakly) when a model is first switched or profiled; a module
never seen gets its class name (and layer index).
"""

from __future__ import annotations

import weakref

import torch.nn as nn

from .instrument import BARE_CALL

__all__ = ["remember_paths", "module_path", "site_name", "BARE_CALL"]

_PATHS: weakref.WeakKeyDictionary[nn.Module, str] = weakref.WeakKeyDictionary()


def remember_paths(model: nn.Module) -> None:
    """Record ``model.named_modules()`` paths for every submodule."""
    for path, m in model.named_modules():
        if path:
            _PATHS[m] = path


def module_path(module) -> str:
    try:
        path = _PATHS.get(module)
    except TypeError:
        path = None
    if path is not None:
        return path
    layer = getattr(module, "layer_idx", None)
    return type(module).__name__ + (f"(layer_idx={layer})" if layer is not None else "")


def site_name(where) -> str:
    """``where`` as text: a string as it is, None as a bare call, a module as its path."""
    if where is None:
        return BARE_CALL
    return where if isinstance(where, str) else module_path(where)
