"""Environment variables attnswitch sets for itself (the command line's ``TORCHINDUCTOR_COMPILE_THREADS``): not
what a user ran with, so a report's "Measured with" line leaves them out. Imports nothing heavy: the command line
sets them before torch is imported."""

from __future__ import annotations

import os

__all__ = ["OWN", "set_default"]

#: the names set here, in this process
OWN: set[str] = set()


def set_default(name: str, value: str) -> None:
    """``os.environ.setdefault(name, value)``, remembered as attnswitch's own where it was not set before."""
    if name not in os.environ:
        os.environ[name] = value
        OWN.add(name)
