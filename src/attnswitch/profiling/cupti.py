"""CUPTI around a trace: let go after it, and gone before the next one starts.

Kineto leaves CUPTI attached after a trace unless ``TEARDOWN_CUPTI=1``, and every CUDA call made after it pays
for it for the rest of the process (``let_go``). With the teardown on, Kineto detaches CUPTI from a thread of its
own, at the exit of the first CUDA call made once that thread is ready; a trace started before then loses its GPU
activity when the detach lands inside it (pytorch/kineto#1554, fixed in later Kineto by waiting for it).
``settle`` makes CUDA calls until that thread is gone, so that the next trace, ours or the caller's, starts
after it.
"""

from __future__ import annotations

import os
import time

import torch

__all__ = ["let_go", "tasks", "settle", "SETTLE_S"]

#: the first CUDA release on which CUPTI comes back after a teardown with CUDA graphs in the process (before it,
#: torch's profiler turns the teardown off where graphs are used)
_TEARDOWN_SAFE_CUDA = (12, 6)
#: the longest ``settle`` waits for the teardown's thread (once it has taken that long, later calls wait less)
SETTLE_S = 1.0
_SHORT_S = 0.03
_slow: list[bool] = []


def let_go() -> bool:
    """Have Kineto detach CUPTI from the process at the end of each trace (``TEARDOWN_CUPTI=1``, which it
    reads then, and again as its next trace starts, to attach CUPTI anew). By default Kineto leaves CUPTI
    attached, and every CUDA call made after a trace pays for it for the rest of the process: on an H200
    (torch 2.11, CUDA 13) a training step's host time went from 34.7 to 42 ms after one profiled step, so the
    timing rounds, which come after the profiled passes, and a user's own loop after ``compare``, ran slower
    wherever the host sets the pace; with the teardown, no step slowed. Left alone where the caller set the
    variable, and before CUDA 12.6. It stays set (unset again, Kineto would start its next trace without the
    callbacks it puts back only where the variable asks for a teardown). True where it is set."""
    if "TEARDOWN_CUPTI" not in os.environ:
        version = tuple(int(x) for x in (torch.version.cuda or "0.0").split(".")[:2])
        if version >= _TEARDOWN_SAFE_CUDA:
            os.environ["TEARDOWN_CUPTI"] = "1"
    return os.environ.get("TEARDOWN_CUPTI") == "1"


def tasks() -> int | None:
    """The process's threads, native ones included (None where the system does not list them)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return None


def settle(before: int | None, sync=torch.cuda.synchronize, clock=time.monotonic, sleep=time.sleep,
           count=tasks) -> bool:
    """After a trace with the teardown on: CUDA calls (``sync``) until the threads are back to ``before``, the
    count taken inside the trace (Kineto's teardown thread is started as it ends), for ``SETTLE_S`` at most
    (a few short waits where the count is unknown, or where a wait once ran out). True where it saw the thread
    go."""
    if os.environ.get("TEARDOWN_CUPTI") != "1":
        return True
    limit = _SHORT_S if before is None or _slow else SETTLE_S
    end = clock() + limit
    while True:
        sync()  # the detach lands at the exit of a CUDA call
        now = count() if before is not None else None
        if now is not None and now <= before:
            return True
        if clock() >= end:
            if before is not None and now is not None:
                _slow.append(True)  # another thread came and stayed: do not wait this long again
            return False
        sleep(0.002)
