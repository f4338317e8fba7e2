"""Installing attnswitch's entries in transformers' registries while anything needs them.

A switch or a patch holds a lease naming the attention keys it needs (a model's: usually ``sdpa``; a
global switch's: every standard key, ``sdpa``, ``eager``, ``flex_attention``, ``flash_attention_*`` and
user-registered ones); while any lease is held, those keys' attention and mask entries hold
attnswitch's dispatchers, and ``PreTrainedModel.__call__`` holds the per-forward guard.
When the last lease goes, every entry is put back as it was found. ``apply`` moves the registries
towards what the leases ask, one dict operation at a time, so it can be interrupted anywhere and run
again; callers run it again until it completes (``settle``), and a SIGINT in the main thread is held
back until it has.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

from . import registries
from .dispatch import ENTRIES

__all__ = ["acquire", "release", "release_later", "drop", "apply", "settle", "leases", "interrupts_deferred"]

_LOCK = threading.Lock()
_LEASES: dict[object, frozenset[str]] = {}  # lease -> attention keys its models name
_DEAD: list[object] = []  # leases of models collected while the lock was held (released at the next apply)


def leases() -> dict[object, frozenset[str]]:
    return dict(_LEASES)


def _desired() -> set[tuple[str, str, str]]:
    if not _LEASES:
        return set()
    keys = {k for k in frozenset().union(*_LEASES.values()) if not k.startswith("paged")}
    out = {registries.CALL}
    for registry in ("attention", "masks"):
        for key in keys:
            for scope in ("global", "local"):
                present = key in registries._mapping(registry, scope)
                # the class-wide attention entry is written even where absent ("eager" has none); the
                # rest only where something is there to take over
                if present or (registry, scope) == ("attention", "global"):
                    out.add((registry, scope, key))
    return out


def _entry_fn(entry):
    return ENTRIES["call"] if entry == registries.CALL else ENTRIES[entry[0]]


def apply() -> None:
    """Make the registries hold what the leases ask: restore entries no lease needs, override the rest."""
    while _DEAD:
        _LEASES.pop(_DEAD.pop(), None)
    want = _desired()
    for entry in registries.installed_entries():
        if entry not in want:
            registries.restore(entry, _entry_fn(entry))
    for entry in sorted(want, key=str):
        registries.override(entry, _entry_fn(entry))


def settle(step) -> None:
    """Run ``step`` then ``apply`` under the lock until both complete; an exception raised meanwhile
    (KeyboardInterrupt, say) is raised after, with the registries consistent."""
    pending: BaseException | None = None
    for _ in range(100):
        try:
            with _LOCK:
                step()
                apply()
            break
        except BaseException as e:
            pending = pending or e
    if pending is not None:
        raise pending


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
    if _LOCK.acquire(blocking=False):
        try:
            _LEASES.pop(lease, None)
            apply()
        finally:
            _LOCK.release()
    else:
        _DEAD.append(lease)


@contextlib.contextmanager
def interrupts_deferred() -> Iterator[None]:
    """Hold a SIGINT back for the block (main thread, Python's own handler only), then raise it."""
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield
        return
    caught: list = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: caught.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if caught:
            raise KeyboardInterrupt
