"""The atomic sections every change of attnswitch's state runs in: one lock, a retry until the change
completes, and a SIGINT held back meanwhile.

A change is a ``step`` (forget or record a lease, set the selection) followed by ``install.apply``;
both are idempotent, so running them again after an interrupt completes the change. This module is the
mechanism the rest relies on: a signal cannot split a ``with lock`` (CPython raises it between bytecodes
a ``with`` exit does not span), and the SIGINT handler it swaps in raises nothing.

A change also holds ``torch.compile``'s own lock (``compiles_held``), the one Dynamo traces and builds its guards
under: a trace in another thread (of any model, switched or not: while a switch is held, every model's call passes
attnswitch's entries) then never reads the registries half-changed, which Dynamo reports as a guard that "failed on
the same frame it was created" or an internal error, and its guards are checked against the state it traced. It is
taken before SIGINT is held back, so that Ctrl-C still interrupts the wait for a compile elsewhere. What may not
wait (a finalizer, a forward's return) changes only where no compile holds it (``try_locked``, ``settle_if_free``),
else leaves the change to the next forward or change (``record.tidy``); never in a thread that is compiling (its
trace would see it).
"""

from __future__ import annotations

import _signal  # the C module under ``signal``: the same calls without the enum conversions (~10 µs each)
import threading
from collections.abc import Callable

from ..errors import raise_interrupt

try:
    from torch._dynamo.convert_frame import compile_lock as _COMPILE_LOCK  # (an RLock, since torch 2.0)
except ImportError:  # pragma: no cover - a torch without Dynamo
    _COMPILE_LOCK = threading.RLock()

__all__ = ["settle", "try_locked", "settle_if_free", "compiling", "compiles_held", "interrupts_deferred",
           "one_registration_at_a_time"]

#: ``with compiles_held:`` no compile runs elsewhere meanwhile (a change's outer section)
compiles_held = _COMPILE_LOCK

_LOCK = threading.Lock()
_REGISTERING = threading.Lock()


def settle(change: Callable[[], None]) -> None:
    """Run ``change`` under the lock until it completes; an exception raised meanwhile (KeyboardInterrupt,
    say) is raised after, with the change complete."""
    pending: BaseException | None = None
    for _ in range(100):
        try:
            with _LOCK:
                change()
            break
        except BaseException as e:
            pending = pending or e
    if pending is not None:
        raise pending


def one_registration_at_a_time(register: Callable[[], object]):
    """``register()`` under a lock of its own (a model's modules' owners are read, then written), here where
    an interrupt cannot split the lock's release."""
    with _REGISTERING:
        return register()


def _no_compile() -> bool:
    """Take Dynamo's lock where no compile holds it, in this thread or another (True: the caller releases it)."""
    return not _COMPILE_LOCK._is_owned() and _COMPILE_LOCK.acquire(blocking=False)


def try_locked(change: Callable[[], None]) -> bool:
    """Run ``change`` now if the locks are free (a finalizer may run while they are held, in this thread's trace or
    during another's compile, and must not block); False if not."""
    if not _no_compile():
        return False
    try:
        if not _LOCK.acquire(blocking=False):
            return False
        try:
            change()
        finally:
            _LOCK.release()
    finally:
        _COMPILE_LOCK.release()
    return True


def compiling() -> bool:
    """Whether a compile holds Dynamo's lock now (in this thread, or another): a finalizer changes nothing a
    trace may be reading then."""
    if not _no_compile():
        return True
    _COMPILE_LOCK.release()
    return False


def settle_if_free(change: Callable[[], None]) -> bool:
    """``change`` as a change (no compile elsewhere, SIGINT held back, run until complete), where no compile holds
    its lock now; False, with nothing done, where one does."""
    if not _no_compile():
        return False
    try:
        with interrupts_deferred():
            settle(change)
    finally:
        _COMPILE_LOCK.release()
    return True


class interrupts_deferred:
    """Hold a SIGINT back for the block (main thread, Python's own handler or the command's), then raise it. (A
    class, not a generator: it runs twice per switch entered and left.)"""

    __slots__ = ("_previous", "_caught")

    def __enter__(self) -> None:
        self._previous = None
        if _get_ident() != _main_thread().ident or _signal.getsignal(_signal.SIGINT) not in _RAISING:
            return
        caught = self._caught = []
        self._previous = _signal.signal(_signal.SIGINT, lambda signum, frame: caught.append(signum))

    def __exit__(self, *exc) -> None:
        if self._previous is None:
            return
        _signal.signal(_signal.SIGINT, self._previous)
        if self._caught:
            self._previous(_signal.SIGINT, None)  # (raises, as the signal would have; the command's records it)


_get_ident, _main_thread = threading.get_ident, threading.main_thread
#: the handlers whose SIGINT is held back: Python's own, and the command's (``errors.sigterm_as_interrupt``), which
#: raises as Python's does and records it
_RAISING = (_signal.default_int_handler, raise_interrupt)
