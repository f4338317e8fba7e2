"""What C++ code prints on the process's stderr (file descriptor 2), read back for a moment.

PyTorch's c10 warnings (the SDPA eligibility checks' reasons) and Kineto's ``USDT ... profiler_start``
lines go straight to descriptor 2, around Python's ``sys.stderr``. ``captured`` points descriptor 2 at a
temporary file for the block and gives back its lines; ``filtered`` writes back everything but the
lines a caller consumed or drops, so nothing else printed meanwhile is lost.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections.abc import Callable, Iterator

__all__ = ["captured", "filtered"]


@contextlib.contextmanager
def captured() -> Iterator[list[str]]:
    """The lines written to descriptor 2 inside the block (filled in when the block ends)."""
    lines: list[str] = []
    sys.stderr.flush()
    with tempfile.TemporaryFile() as tmp:
        saved = os.dup(2)
        try:
            os.dup2(tmp.fileno(), 2)
            yield lines
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            lines += tmp.read().decode(errors="replace").splitlines()


@contextlib.contextmanager
def filtered(keep_out: Callable[[str], bool]) -> Iterator[list[str]]:
    """Like ``captured``, and every line ``keep_out`` does not claim is written back to stderr."""
    with captured() as lines:
        yield lines
    for line in lines:
        if line.strip() and not keep_out(line):
            sys.stderr.write(line + "\n")
