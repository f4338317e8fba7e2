"""Environment variables that are not what a user ran with, so a report's "Measured with" line (and a policy's
check against it) leaves them out: those attnswitch sets for itself (the command line's
``TORCHINDUCTOR_COMPILE_THREADS``), and those torch sets in the process as it compiles (``BY_TORCH``) where they
were not set when attnswitch was imported. Imports nothing heavy: the command line sets its own before torch is
imported."""

from __future__ import annotations

import os

__all__ = ["OWN", "BY_TORCH", "SET_BY_TORCH", "set_default"]

#: the names set here, in this process
OWN: set[str] = set()

#: what inductor sets in its own process as it compiles (torch 2.11-2.13: triton_heuristics, compile_tasks,
#: async_compile, fx_passes.numeric_utils) and that were not set when attnswitch was imported
SET_BY_TORCH = ("TRITON_CACHE_DIR", "TRITON_PTXAS_PATH", "TRITON_LIBDEVICE_PATH", "TORCH_WARM_POOL",
                "CUBLAS_WORKSPACE_CONFIG")
BY_TORCH: frozenset[str] = frozenset(k for k in SET_BY_TORCH if k not in os.environ)


def set_default(name: str, value: str) -> None:
    """``os.environ.setdefault(name, value)``, remembered as attnswitch's own where it was not set before."""
    if name not in os.environ:
        os.environ[name] = value
        OWN.add(name)
