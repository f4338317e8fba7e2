"""transformers' registries, and the few functions of transformers and torch attnswitch takes over, as it
touches them: which entries, what they held, putting it back.

``ALL_ATTENTION_FUNCTIONS`` and ``ALL_MASK_ATTENTION_FUNCTIONS`` each have a class-wide mapping and the
shared instance's own (``registry["sdpa"] = fn`` writes the latter, which wins). Besides: the per-forward
guard (``PreTrainedModel._call_impl``, what ``nn.Module.__call__`` runs: a plain method, whose writing costs what
a dict write costs, where writing ``__call__`` makes CPython update the call slot of every model class loaded, 34
µs per switch entered and left with 20 architectures imported), the attention lookup every module makes
(``AttentionInterface.get_interface``), and what makes torch's threads and replicas part of a forward
(the ``threading`` that ``torch.nn.parallel.parallel_apply`` starts its threads with,
``Module._replicate_for_data_parallel``). An entry is overridden
by saving what it held first, then writing; restoring writes the saved value back only where the entry
still holds attnswitch's function, then forgets it. Each step is one dict operation (or one attribute
write), so an interrupt between any two leaves a state the next ``apply`` completes.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import torch
import torch.nn as nn
import torch.nn.parallel.parallel_apply  # (loads the module whose threads are taken over)
from transformers import PreTrainedModel
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS, AttentionInterface

__all__ = ["ATTENTION", "MASKS", "MISSING", "FNS", "CALL", "GET_INTERFACE", "REPLICATE", "PARALLEL_APPLY",
           "standard_keys", "override", "restore", "installed_entries", "hold_only", "original", "builds_masks",
           "original_call", "original_attr", "snapshot"]

ATTENTION = ALL_ATTENTION_FUNCTIONS
MASKS = ALL_MASK_ATTENTION_FUNCTIONS
_REGISTRIES = {"attention": ATTENTION, "masks": MASKS}
MISSING: Any = type("Missing", (), {"__repr__": lambda self: "<missing>"})()
#: attributes attnswitch takes over while any switch is active, as ("attr", owner, name)
_ATTR_OWNERS = {"PreTrainedModel": PreTrainedModel, "AttentionInterface": AttentionInterface, "Module": nn.Module,
                "torch.nn.parallel.parallel_apply": sys.modules["torch.nn.parallel.parallel_apply"]}
CALL = ("attr", "PreTrainedModel", "_call_impl")  # the per-forward guard
GET_INTERFACE = ("attr", "AttentionInterface", "get_interface")  # every module's attention lookup
REPLICATE = ("attr", "Module", "_replicate_for_data_parallel")  # a replica is its original's
PARALLEL_APPLY = ("attr", "torch.nn.parallel.parallel_apply", "threading")  # the threads it starts

#: the function attnswitch writes: by registry ("attention", "masks") and by attribute entry; filled by the
#: modules that define them (``dispatch``, ``parallel``) as they are imported
FNS: dict = {}
#: (registry, scope, key) or ("attr", owner, name) -> what the entry held before attnswitch wrote it;
#: present while overridden
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


_COMPILING = torch.compiler.is_compiling
#: entry -> (the dict it is in, or what has it as an attribute; its key; whether an attribute; attnswitch's function)
_PLACES: dict[tuple[str, str, str], tuple[Any, str, bool, Any]] = {}


def _place(entry: tuple[str, str, str]) -> tuple[Any, str, bool, Any]:
    place = _PLACES.get(entry)
    if place is None:
        fn = FNS.get(entry if entry[0] == "attr" else entry[0])
        if entry[0] == "attr":
            place = (_ATTR_OWNERS[entry[1]], entry[2], True, fn)
        else:
            place = (_mapping(entry[0], entry[1]), entry[2], False, fn)
        # (known once the module that defines it is imported; not while Dynamo traces: a dict written in a trace
        # makes it break the graph at the next mappingproxy read, the selection's, and torch 2.11-2.13 then
        # resumes Llama's forward wrongly under a torch function mode)
        if fn is not None and not _COMPILING():
            _PLACES[entry] = place
    return place


def _read(entry: tuple[str, str, str]):
    where, key, attr, _ = _place(entry)
    return (vars(where) if attr else where).get(key, MISSING)


def _write(entry: tuple[str, str, str], value) -> None:
    where, key, attr, _ = _place(entry)
    if attr:
        if value is not MISSING:
            setattr(where, key, value)
        elif key in vars(where):
            delattr(where, key)
    elif value is MISSING:
        where.pop(key, None)
    else:
        where[key] = value


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


def hold_only(wanted: dict[tuple[str, str, str], Callable]) -> None:
    """Make the entries of ``wanted`` hold attnswitch's functions (``override``), and put back every other entry
    attnswitch holds (``restore``): ``override`` and ``restore`` written out, one dict operation (or attribute
    write) per step, since this runs as every switch is entered and left."""
    saved, missing = _SAVED, MISSING
    if len(saved) > len(wanted) or (saved and not wanted.keys() >= saved.keys()):
        for entry in [e for e in saved if e not in wanted]:
            where, key, attr, fn = _place(entry)
            if attr:
                if where.__dict__.get(key, missing) is fn:
                    value = saved[entry]
                    if value is missing:
                        delattr(where, key)
                    else:
                        setattr(where, key, value)
            elif where.get(key, missing) is fn:
                value = saved[entry]
                if value is missing:
                    where.pop(key, None)
                else:
                    where[key] = value
            saved.pop(entry, None)
    for entry in wanted:
        where, key, attr, fn = _place(entry)
        current = (where.__dict__ if attr else where).get(key, missing)
        if current is not fn:
            saved[entry] = current
            if attr:
                setattr(where, key, fn)
            else:
                where[key] = fn


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


def builds_masks(key: str) -> bool:
    """Whether transformers makes masks for attention implementation ``key``: one without a mask function in the
    class-wide mapping gets none (``masking_utils._preprocess_mask_arguments``), and masks itself."""
    return _held(("masks", "global", key)) is not MISSING


def original_attr(entry: tuple[str, str, str]):
    """What attribute ``entry`` holds without attnswitch (``MISSING`` where nothing)."""
    return _held(entry)


def original_call():
    """``PreTrainedModel._call_impl`` without the guard; None where PreTrainedModel defines none (then
    ``nn.Module._call_impl`` applies)."""
    value = _held(CALL)
    return None if value is MISSING else value


def snapshot() -> dict:
    """Everything these registries and attributes hold, for tests that check nothing was left changed."""
    return {"attention": (dict(ATTENTION._global_mapping), dict(ATTENTION._local_mapping)),
            "masks": (dict(MASKS._global_mapping), dict(MASKS._local_mapping)),
            "call": _read(CALL), "attrs": {e: _read(e) for e in (GET_INTERFACE, REPLICATE, PARALLEL_APPLY)}}
