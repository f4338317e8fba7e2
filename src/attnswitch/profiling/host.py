"""How busy the machine is: its load average, and a fixed task timed a few times. Taken before and after
the timing rounds, it tells a ranking made on a busy machine (``ranking.busy_host`` reads it)."""

from __future__ import annotations

import os
import time

__all__ = ["probe", "PROBE_REPS"]

PROBE_REPS = 9


def _task() -> int:
    # pure Python on one core, about a millisecond: what the interpreter's host-bound work looks like
    total = 0
    for i in range(20_000):
        total += i * i % 7
    return total


def probe(reps: int = PROBE_REPS) -> dict:
    """``{"load": 1-minute load average or None, "cpus": usable CPUs, "probe_ms": the task's times}``."""
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):  # pragma: no cover - not on every platform
        load = None
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not on every platform
        cpus = os.cpu_count() or 1
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        _task()
        times.append(round((time.perf_counter() - t0) * 1e3, 4))
    return {"load": load, "cpus": cpus, "probe_ms": times}
