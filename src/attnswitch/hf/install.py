"""Installing attnswitch's entries in transformers' registries while anything needs them.

A switch or a patch holds a lease naming the attention keys it needs (a model's: usually ``sdpa``; a
global switch's: every standard key, ``sdpa``, ``eager``, ``flex_attention``, ``flash_attention_*`` and
user-registered ones); while any lease is held, those keys' attention and mask entries hold
attnswitch's dispatchers, ``PreTrainedModel.__call__`` holds the per-forward guard, transformers' attention
lookup (``get_interface``) attnswitch's, and torch's ``parallel_apply`` and module replication theirs
(``parallel``).
When the last lease goes, every entry is put back as it was found. ``apply`` moves the registries
towards what the leases ask, one dict operation at a time, so it can be interrupted anywhere and run
again; callers run it again until it completes (``settle``), and a SIGINT in the main thread is held
back until it has.
"""

from __future__ import annotations

from . import critical, registries
from .leases import DEAD as _DEAD
from .leases import LEASES
from .leases import LEASES as _LEASES

__all__ = ["LEASES", "acquire", "release", "release_later", "drop", "apply", "settle", "leases", "interrupts_deferred"]

def leases() -> dict[object, frozenset[str]]:
    return dict(_LEASES)


def _desired() -> set[tuple[str, str, str]]:
    if not _LEASES:
        return set()
    out = {e for e in registries.FNS if isinstance(e, tuple)}  # the attributes
    att = (registries.ATTENTION._global_mapping, registries.ATTENTION._local_mapping)
    masks = (registries.MASKS._global_mapping, registries.MASKS._local_mapping)
    for key in frozenset().union(*_LEASES.values()):
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


def apply() -> None:
    """Make the registries hold what the leases ask: restore entries no lease needs, override the rest."""
    while _DEAD:
        _LEASES.pop(_DEAD.pop(), None)
    want = _desired()
    for entry in registries.installed_entries():
        if entry not in want:
            registries.restore(entry, _entry_fn(entry))
    for entry in want:
        registries.override(entry, _entry_fn(entry))


def settle(step) -> None:
    """Run ``step`` then ``apply`` as one change that completes whatever interrupts it."""
    def change():
        step()
        apply()
    critical.settle(change)


def acquire(lease: object, keys: frozenset[str] = frozenset()) -> None:
    """Hold ``lease`` (any hashable, made by the caller first so that it can always release it)."""
    settle(lambda: _LEASES.__setitem__(lease, keys))


def drop(lease: object) -> None:
    """Forget ``lease`` (idempotent), for a ``settle`` step; its ``apply`` puts back what is not needed."""
    _LEASES.pop(lease, None)


def release(lease: object) -> None:
    """Drop ``lease`` (idempotent); the last one puts every entry back."""
    settle(lambda: drop(lease))


def release_later(lease: object) -> None:
    """Drop ``lease`` from a finalizer, which may run inside ``apply`` (garbage collection): now if the
    lock is free, else at the next ``apply``."""
    try:
        if critical.try_locked(lambda: (drop(lease), apply())):
            return
    except BaseException:  # a finalizer cannot raise; the next apply completes it
        pass
    _DEAD.append(lease)


interrupts_deferred = critical.interrupts_deferred
