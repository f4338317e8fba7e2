"""Measurement hooks around each attention call, off unless the profiler turns them on.

The attention entry points test one module attribute; when ``active`` is set, each call is wrapped in
a profiler range named ``attnswitch.attention:<module path>`` and/or its host time is recorded.
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from typing import Iterator

from torch.autograd.profiler import record_function

ATTENTION_PREFIX = "attnswitch.attention:"
MODULE_PREFIX = "attnswitch.module:"
STEP_PREFIX = "attnswitch.step:"
BARE_CALL = "(bare call)"

active = False
_annotate = False
_host_times: list[tuple[str, float]] | None = None
_LOCK = threading.Lock()  # one measurement at a time: the switches above are process-wide


def call(where: str, fn, *args, **kwargs):
    if _host_times is not None:
        t0 = time.perf_counter()
        if _annotate:
            with record_function(ATTENTION_PREFIX + where):
                out = fn(*args, **kwargs)
        else:
            out = fn(*args, **kwargs)
        _host_times.append((where, time.perf_counter() - t0))
        return out
    with record_function(ATTENTION_PREFIX + where):
        return fn(*args, **kwargs)


@contextmanager
def measuring(*, annotate: bool = False, host_times: list | None = None) -> Iterator[None]:
    """Turn the hooks on for the block: profiler ranges and/or host times of attention calls."""
    global active, _annotate, _host_times
    with _LOCK:
        active, _annotate, _host_times = annotate or host_times is not None, annotate, host_times
        try:
            yield
        finally:
            active, _annotate, _host_times = False, False, None
