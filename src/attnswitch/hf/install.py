"""Installing attnswitch's functions in transformers' registries while anything needs them.

The switch's record (``record``) says which attention keys its holders need (a model's: usually ``sdpa``; a
global switch's: every standard key, ``sdpa``, ``eager``, ``flex_attention``, ``flash_attention_*`` and
user-registered ones). While any key is needed, those keys' attention and mask entries hold attnswitch's
dispatchers, ``PreTrainedModel._call_impl`` holds the per-forward guard, transformers' attention lookup
(``get_interface``) attnswitch's, and torch's ``parallel_apply`` and module replication theirs (``parallel``).
When none is, every entry is put back as it was found. ``apply`` moves the registries towards what is
needed, one dict operation at a time, so it can be interrupted anywhere and run again; the record runs it
again until it completes.
"""

from __future__ import annotations

from . import registries

__all__ = ["apply", "sizes"]


def _desired(keys: frozenset[str]) -> set[tuple[str, str, str]]:
    if not keys:
        return set()
    out = {e for e in registries.FNS if isinstance(e, tuple)}  # the attributes
    att = (registries.ATTENTION._global_mapping, registries.ATTENTION._local_mapping)
    masks = (registries.MASKS._global_mapping, registries.MASKS._local_mapping)
    for key in keys:
        if key.startswith("paged"):
            continue
        # only where something is there to take over: a key with no entry ("eager") reaches attnswitch through
        # the lookup (get_interface), which gives the module's own function for it
        for registry, (glob, local) in (("attention", att), ("masks", masks)):
            if key in glob:
                out.add((registry, "global", key))
            if key in local:
                out.add((registry, "local", key))
    return out


def _entry_fn(entry):
    return registries.FNS[entry if entry[0] == "attr" else entry[0]]  # ("attr", owner, name), or by registry


_NONE: dict = {}
#: keys -> (the registries' sizes when it was made, entry -> attnswitch's function for it)
_PLANS: dict[frozenset[str], tuple[tuple[int, ...], dict]] = {}


def sizes() -> tuple[int, ...]:
    """The registries' sizes: a key registered or removed changes them."""
    return (len(registries.ATTENTION._global_mapping), len(registries.ATTENTION._local_mapping),
            len(registries.MASKS._global_mapping), len(registries.MASKS._local_mapping))


def _plan(keys: frozenset[str]) -> dict:
    """Entry -> function, for ``keys``: made again where a key was registered or removed since."""
    if not keys:
        return _NONE
    now = sizes()
    made = _PLANS.get(keys)
    if made is None or made[0] != now:
        made = _PLANS[keys] = (now, {e: _entry_fn(e) for e in _desired(keys)})
        if len(_PLANS) > 64:  # (keys come from models' configs: a few sets in a process)
            _PLANS.pop(next(iter(_PLANS)))
    return made[1]


def apply(keys: frozenset[str]) -> None:
    """Make the registries hold attnswitch's functions for ``keys`` (none: put back every entry)."""
    registries.hold_only(_plan(keys))
