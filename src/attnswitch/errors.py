"""Exceptions raised by attnswitch."""

from __future__ import annotations

import contextlib
import functools
import signal
import sys
import threading
from collections.abc import Iterator

__all__ = ["BackendUnavailable", "UnsupportedModel", "Refused", "Terminated", "sigterm_as_interrupt",
           "raised_signal", "signals_so_far", "raise_interrupt", "out_of_memory"]


class BackendUnavailable(RuntimeError):
    """A forced backend cannot run the given inputs here.

    attnswitch never falls back to another kernel: the error names the backend, the call site
    (module path) and PyTorch's own reasons.
    """

    def __init__(self, backend: str, where: str | None, reasons: list[str], inputs: str = ""):
        self.backend = backend
        self.where = where
        self.reasons = list(reasons)
        self.inputs = inputs
        lines = [f"backend {backend!r} cannot run the attention call at {where or '(bare call)'}"]
        if inputs:
            lines.append(f"  inputs: {inputs}")
        lines += [f"  - {r}" for r in self.reasons] or ["  - (PyTorch gave no reason)"]
        super().__init__("\n".join(lines))

    def __reduce__(self):
        return (type(self), (self.backend, self.where, self.reasons, self.inputs))


class UnsupportedModel(TypeError):
    """The model does not compute attention through transformers' attention interface."""


class Refused(RuntimeError):
    """Raised by a registered kernel that finds, only while running, that it cannot take the inputs (a
    compiler that builds no kernel for them, say); attnswitch reports it as ``BackendUnavailable`` with
    these reasons and the call site."""

    def __init__(self, *reasons: str):
        self.reasons = [str(r) for r in reasons]
        super().__init__("; ".join(self.reasons))


def out_of_memory(e: BaseException) -> bool:
    """Whether ``e`` is an allocation that failed: CUDA's caching allocator's ``torch.OutOfMemoryError``, or an error
    with no type of its own: the CPU allocator's (``DefaultCPUAllocator: can't allocate memory``), the CUDA
    runtime's (``CUDA error: out of memory``: a context, a cuBLAS handle), cuDNN's or cuBLAS's workspace's."""
    if type(e).__name__ == "OutOfMemoryError":
        return True
    text = str(e) if isinstance(e, RuntimeError) else ""
    return any(w in text for w in _OOM_WORDS)


_OOM_WORDS = ("can't allocate memory", "CUDA out of memory", "CUDA error: out of memory", "CUDNN_STATUS_ALLOC_FAILED",
              "CUBLAS_STATUS_ALLOC_FAILED")


class Terminated(KeyboardInterrupt):
    """SIGTERM (``timeout``, ``docker stop``), raised where Ctrl-C raises ``KeyboardInterrupt`` (inside
    ``sigterm_as_interrupt``), so that it unwinds the same way: every switch restored, nothing staged left
    beside a report's folder."""


#: the signals the command's handlers raised on (``sigterm_as_interrupt``), first first: one that a library on the
#: way swallowed (an import turning it into an ImportError, a bare ``except:``) still ends the command as one
_RAISED: list[type[KeyboardInterrupt]] = []


def _terminated(signum, frame):
    _RAISED.append(Terminated)
    raise Terminated


def raise_interrupt(signum, frame):
    """The command's SIGINT handler: ``KeyboardInterrupt``, as Python's own, recorded (``raised_signal``)."""
    _RAISED.append(KeyboardInterrupt)
    raise KeyboardInterrupt


def signals_so_far() -> int:
    """How many signals were recorded so far (``raised_signal(since=...)``: those of a later run only)."""
    return len(_RAISED)


def raised_signal(since: int = 0) -> type[KeyboardInterrupt] | None:
    """The first interrupt (``KeyboardInterrupt``) or termination (``Terminated``) raised in this process inside
    ``sigterm_as_interrupt`` (after the first ``since`` recorded), or None."""
    return _RAISED[since] if len(_RAISED) > since else None


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Inside the block SIGTERM raises ``Terminated`` in the main thread, unless this process was told to
    ignore it or something else handles it already; SIGINT raises ``KeyboardInterrupt`` as Python's own handler
    does; both are recorded (``raised_signal``). As it was after. For a program of its own (the ``attnswitch``
    command): a process-wide choice."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {}
    if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
        previous[signal.SIGTERM] = signal.signal(signal.SIGTERM, _terminated)
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        previous[signal.SIGINT] = signal.signal(signal.SIGINT, raise_interrupt)
    if previous:
        _RAISED.clear()  # (the block's own: none of an earlier one's)
    hook = sys.unraisablehook
    if previous:
        sys.unraisablehook = functools.partial(_unraisable, hook)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if previous:
            sys.unraisablehook = hook
            _RAISED.clear()


def _unraisable(hook, unraisable) -> None:
    """An interrupt raised by these handlers where Python cannot raise it (inside a weakref callback, a
    finalizer: Python would print it as "Exception ignored", with a traceback) is not printed: it is recorded,
    and the command ends as one all the same (``raised_signal``). Anything else goes to ``hook``."""
    if isinstance(unraisable.exc_value, KeyboardInterrupt) and _RAISED:
        return
    hook(unraisable)
