"""transformers' registries as attnswitch touches them: which entries, what they held, putting it back.

``ALL_ATTENTION_FUNCTIONS`` and ``ALL_MASK_ATTENTION_FUNCTIONS`` each have a class-wide mapping and the
shared instance's own (``registry["sdpa"] = fn`` writes the latter, which wins). An entry is overridden
by saving what it held first, then writing; restoring writes the saved value back only where the entry
still holds attnswitch's function, then forgets it. Each step is one dict operation, so an interrupt
between any two leaves a state the next ``apply`` completes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from transformers import PreTrainedModel
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

__all__ = ["ATTENTION", "MASKS", "MISSING", "standard_keys", "override", "restore", "installed_entries",
           "original", "original_call", "snapshot"]

ATTENTION = ALL_ATTENTION_FUNCTIONS
MASKS = ALL_MASK_ATTENTION_FUNCTIONS
_REGISTRIES = {"attention": ATTENTION, "masks": MASKS}
MISSING: Any = type("Missing", (), {"__repr__": lambda self: "<missing>"})()
CALL = ("call", "PreTrainedModel", "__call__")  # the entry of the per-forward guard

#: (registry, scope, key) -> what the entry held before attnswitch wrote it; present while overridden
_SAVED: dict[tuple[str, str, str], Any] = {}
_NOT_SAVED: Any = object()


def _mapping(registry: str, scope: str) -> dict:
    reg = _REGISTRIES[registry]
    return reg._global_mapping if scope == "global" else reg._local_mapping


def standard_keys() -> set[str]:
    """The attention implementations models name that take standard attention calls: every registered
    key but the paged ones (their caches are laid out for continuous batching), and ``eager``."""
    keys = set(ATTENTION._global_mapping) | set(ATTENTION._local_mapping) | {"eager"}
    return {k for k in keys if not k.startswith("paged")}


def _read(entry: tuple[str, str, str]):
    if entry == CALL:
        return PreTrainedModel.__dict__.get("__call__", MISSING)
    return _mapping(entry[0], entry[1]).get(entry[2], MISSING)


def _write(entry: tuple[str, str, str], value) -> None:
    if entry == CALL:
        if value is MISSING:
            if "__call__" in PreTrainedModel.__dict__:
                delattr(PreTrainedModel, "__call__")
        else:
            PreTrainedModel.__call__ = value
        return
    m = _mapping(entry[0], entry[1])
    if value is MISSING:
        m.pop(entry[2], None)
    else:
        m[entry[2]] = value


def override(entry: tuple[str, str, str], fn: Callable) -> None:
    """Write ``fn`` into the entry, the value it held saved first."""
    current = _read(entry)
    if current is fn:
        return
    _SAVED[entry] = current
    _write(entry, fn)


def restore(entry: tuple[str, str, str], fn: Callable) -> None:
    """Put back what the entry held, if it still holds ``fn`` (else leave what someone wrote since)."""
    if entry not in _SAVED:
        return
    if _read(entry) is fn:
        _write(entry, _SAVED[entry])
    _SAVED.pop(entry, None)


def installed_entries() -> list[tuple[str, str, str]]:
    return list(_SAVED)


def _held(entry: tuple[str, str, str]):
    # while overridden the saved value (saved before writing, forgotten after restoring: whenever the
    # entry holds attnswitch's function, its original is saved), else the entry itself
    value = _SAVED.get(entry, _NOT_SAVED)
    return _read(entry) if value is _NOT_SAVED else value


def original(registry: str, key: str):
    """What a model naming ``key`` gets from ``registry`` without attnswitch: the instance's own entry
    (which wins) or the class-wide one; None where there is none."""
    for scope in ("local", "global"):
        value = _held((registry, scope, key))
        if value is not MISSING:
            return value
    return None


def original_call():
    """``PreTrainedModel.__call__`` without the guard; None where PreTrainedModel defines none (then
    ``nn.Module.__call__`` applies)."""
    value = _held(CALL)
    return None if value is MISSING else value


def snapshot() -> dict:
    """Everything these registries hold, for tests that check nothing was left changed."""
    return {"attention": (dict(ATTENTION._global_mapping), dict(ATTENTION._local_mapping)),
            "masks": (dict(MASKS._global_mapping), dict(MASKS._local_mapping)),
            "call": PreTrainedModel.__dict__.get("__call__", MISSING)}
