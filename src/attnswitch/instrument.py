"""Measurement hooks around each attention call, off unless a measurement in this context turns them on.

The state lives in a ``ContextVar``: a measurement records only the attention calls of its own thread
(or asyncio task), measurements nest (an inner one records into the outer one's lists too), and a
thread that measures nothing pays one ``ContextVar.get`` per attention call.

A measurement may also hold observers: functions each attention call is shown to once it has returned (its
inputs, whether it is causal, its window, its output), outside its profiler range and its host time. The
profiled pass records the calls' shapes (``profiling/callshapes.py``), untimed steps check them for NaN and
Inf (``finite.py``); the timed steps have none.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from torch.autograd.profiler import record_function

__all__ = ["ATTENTION_PREFIX", "MODULE_PREFIX", "STEP_PREFIX", "OLD_STEP_PREFIX", "PHASE_PREFIX", "BARE_CALL",
           "Measure", "MEASURE", "current", "call", "observe", "measuring"]

ATTENTION_PREFIX = "attnswitch.attention:"
MODULE_PREFIX = "attnswitch.module:"
STEP_PREFIX = "ProfilerStep#"  # one per profiled step, named as HolisticTraceAnalysis and Perfetto expect
OLD_STEP_PREFIX = "attnswitch.step:"  # the same, in traces recorded before
PHASE_PREFIX = "attnswitch.phase:"  # around each forward of a generate: prefill or decode
BARE_CALL = "(bare call)"


class Measure:
    """What the calling context records: profiler ranges around attention calls, and/or host times."""

    __slots__ = ("annotate", "host_times", "observers")

    def __init__(self, annotate: bool, host_times: tuple[list, ...], observers: tuple = ()):
        self.annotate = annotate
        self.host_times = host_times  # every list a call's (where, seconds) goes into
        self.observers = observers  # functions each call is shown to (``observe``)


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


def observe(m: Measure, where: str, q, k, v, mask, causal: bool, window, out, top_left: bool = False) -> None:
    """Show one returned attention call to ``m``'s observers: its inputs (``q [b, h, s_q, d]``, ``k``, ``v``, the
    mask passed or None), its causal structure (``top_left``: SDPA's own alignment, a bare call's), its sliding
    window (None: none) and its output tensor."""
    for fn in m.observers:
        fn(where, q, k, v, mask, causal, window, out, top_left)


@contextmanager
def measuring(*, annotate: bool = False, host_times: list | None = None, observers: tuple = ()) -> Iterator[None]:
    """Inside the block, this context's attention calls get a profiler range (``annotate``), append
    ``(where, seconds, key length)`` to ``host_times`` and/or are shown to ``observers`` (``observe``)."""
    outer = MEASURE.get()
    lists = (outer.host_times if outer else ()) + ((host_times,) if host_times is not None else ())
    seen = (outer.observers if outer else ()) + tuple(observers)
    token = MEASURE.set(Measure(annotate or bool(outer and outer.annotate), lists, seen))
    try:
        yield
    finally:
        MEASURE.reset(token)
