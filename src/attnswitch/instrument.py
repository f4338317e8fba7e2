"""Measurement hooks around each attention call, off unless a measurement in this context turns them on.

The state lives in a ``ContextVar``: a measurement records only the attention calls of its own thread
(or asyncio task), measurements nest (an inner one records into the outer one's lists too), and a
thread that measures nothing pays one ``ContextVar.get`` per attention call.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from torch.autograd.profiler import record_function

__all__ = ["ATTENTION_PREFIX", "MODULE_PREFIX", "STEP_PREFIX", "OLD_STEP_PREFIX", "PHASE_PREFIX", "BARE_CALL",
           "Measure", "MEASURE", "current", "call", "measuring"]

ATTENTION_PREFIX = "attnswitch.attention:"
MODULE_PREFIX = "attnswitch.module:"
STEP_PREFIX = "ProfilerStep#"  # one per profiled step, named as HolisticTraceAnalysis and Perfetto expect
OLD_STEP_PREFIX = "attnswitch.step:"  # the same, in traces recorded before
PHASE_PREFIX = "attnswitch.phase:"  # around each forward of a generate: prefill or decode
BARE_CALL = "(bare call)"


class Measure:
    """What the calling context records: profiler ranges around attention calls, and/or host times."""

    __slots__ = ("annotate", "host_times")

    def __init__(self, annotate: bool, host_times: tuple[list, ...]):
        self.annotate = annotate
        self.host_times = host_times  # every list a call's (where, seconds) goes into


#: the calling context's measurement (``MEASURE.get()``: what ``current()`` returns, one frame fewer per call)
MEASURE: ContextVar[Measure | None] = ContextVar("attnswitch_measure", default=None)


def current() -> Measure | None:
    """The calling context's measurement, or None (the attention entry points test this)."""
    return MEASURE.get()


def call(m: Measure, where: str, kv_len: int, fn, *args, **kwargs):
    """Run ``fn`` as one attention call measured by ``m``; ``kv_len``: its key length."""
    t0 = time.perf_counter()
    if m.annotate:
        with record_function(ATTENTION_PREFIX + where):
            out = fn(*args, **kwargs)
    else:
        out = fn(*args, **kwargs)
    if m.host_times:
        dt = time.perf_counter() - t0
        for times in m.host_times:
            times.append((where, dt, kv_len))
    return out


@contextmanager
def measuring(*, annotate: bool = False, host_times: list | None = None) -> Iterator[None]:
    """Inside the block, this context's attention calls get a profiler range (``annotate``) and/or
    append ``(where, seconds, key length)`` to ``host_times``."""
    outer = MEASURE.get()
    lists = (outer.host_times if outer else ()) + ((host_times,) if host_times is not None else ())
    token = MEASURE.set(Measure(annotate or bool(outer and outer.annotate), lists))
    try:
        yield
    finally:
        MEASURE.reset(token)
