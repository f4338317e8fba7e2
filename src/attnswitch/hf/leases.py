"""Who needs attnswitch's registry entries now: one lease per active switch or patch.

A lease is a token object made by its holder; the holder's selection state names it, so a selection
whose lease is gone (its context was dropped without an exit, by an interrupt at the very entry of
``__exit__``) is recognised as stale and never applied.
"""

from __future__ import annotations

__all__ = ["LEASES", "DEAD", "held"]

LEASES: dict[object, frozenset[str]] = {}  # lease -> attention keys its models name
DEAD: list[object] = []  # leases dropped while the lock was held (forgotten at the next apply)


def held(lease: object) -> bool:
    return lease in LEASES and lease not in DEAD
