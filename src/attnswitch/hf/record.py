"""The switch's record, kept here alone: every holder of attnswitch's entries, what it selects, and what lets
go of it.

A holder is an ``Entry``: a ``backend()`` context, a patch, or a forward's graph that may be recomputed in
backward (``recompute``). It carries its selection, the model it names (its owner token; None: every model),
the attention keys its models name, and a weak reference to what holds it, whose callback lets go of it when
that is dropped without letting go (a context never exited, a patched model freed, a graph freed). While any
entry is held, transformers' registries hold attnswitch's functions (``install``); the last one to go puts
back what was there.

- **Contexts.** The calling context's ``State`` (a ``ContextVar``: each thread and asyncio task has its own) is the
  chain of the contexts entered in it, innermost first, with what they select together: the innermost global backend
  and one per model for the model-scoped contexts entered inside it (the innermost last). A context ends in order
  (innermost), out of order, or elsewhere (another thread or task): out of order with an exception propagating
  through it (a generator closed or failing inside another context, a task cancelled) it ends its own selection
  only; with none, the code is wrong, and every selection of this context ends (the caller raises). A state holding
  a context that ended elsewhere, or was dropped, is rebuilt without it when next read.
- **Patches**: owner token -> entry, seen by every thread (``PATCHED``: token -> selection, as the rules
  read it).

Every change is one ``_change``: idempotent steps and ``install.apply`` under one lock, run again until they
complete, with SIGINT held back in the main thread (``critical``).
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field

from ..backends.policy import Selection
from . import critical, install

__all__ = ["Entry", "State", "EMPTY", "STATE", "ENDINGS", "PATCHED", "current", "enter", "abandon",
           "leave", "patch", "unpatch", "patched", "hold", "held", "lacking", "widen", "running", "returned", "tidy",
           "DROPPED"]


class Entry:
    """One holder of attnswitch's entries. ``ended``: its selection is over (it was left, or dropped)."""

    __slots__ = ("sel", "token", "keys", "thread", "ended", "ref", "__weakref__")

    def __init__(self, sel: Selection | None, token: int | None, keys: frozenset[str], thread=None):
        self.sel, self.token, self.keys, self.thread = sel, token, keys, thread
        self.ended = False
        self.ref: weakref.ref | None = None  # to what holds it; its callback lets go of it

    def __repr__(self) -> str:
        return f"Entry({self.sel!r}, token={self.token}, keys={sorted(self.keys)})"


@dataclass(frozen=True, eq=False)
class State:
    """The calling context's selection: a global backend and per-model (owner token) ones, and the chain of the
    contexts that made it (``entry``, the innermost; ``parent``, the state it was entered in)."""

    global_sel: Selection | None = None
    #: owner token -> selection, the innermost context's last (a plain dict, never written once made: Dynamo
    #: guards a dict's items, and graph-breaks on a mapping proxy read after any dict was written in the trace)
    per_owner: Mapping[int, Selection] = field(default_factory=dict)
    parent: State | None = None
    entry: Entry | None = None
    #: ``ENDINGS[0]`` when every entry of the chain was last seen live (a cache: written after the state is made)
    checked: int = field(default=0, compare=False)


EMPTY = State()
STATE: ContextVar[State] = ContextVar("attnswitch_state", default=EMPTY)
#: how many entries have ended: a state last checked at another count is checked again before it is read
ENDINGS = [0]
#: owner token -> selection of a patched model, seen by every thread (written here only)
PATCHED: dict[int, Selection] = {}
_PATCHES: dict[int, Entry] = {}  # owner token -> the patch's entry
_HELD: dict[Entry, None] = {}  # the entries that hold attnswitch's functions installed, in order
_DROPPED: list[Entry] = []  # let go of by a callback while the lock was held (forgotten at the next change)
DROPPED = _DROPPED
#: a restore a forward's return put off (a compile held the lock): the next forward's start or change does it
PENDING = [False]
#: selected forwards running now -> the attention keys their models name: the registries keep attnswitch's
#: functions for these until they return, also where what selected them lets go meanwhile (a patch undone in
#: another thread), so that a forward runs one selection throughout
_RUNNING: dict[object, frozenset[str]] = {}
_ONLY_RUNNING = [False]  # the registries hold keys that only running forwards need
_INSTALLED: list[frozenset[str]] = [frozenset()]  # the keys the registries hold attnswitch's functions for


# -- the calling context's state --------------------------------------------------------------------

def _chain(st: State) -> list[Entry]:
    out = []
    while st is not None and st.entry is not None:
        out.append(st.entry)
        st = st.parent
    return out


def _push(parent: State, entry: Entry) -> State:
    if entry.token is None:  # a global context wins over every model-scoped one it is nested in
        return State(entry.sel, {}, parent, entry, parent.checked)
    per = {t: s for t, s in parent.per_owner.items() if t != entry.token}
    per[entry.token] = entry.sel  # last: the innermost
    return State(parent.global_sel, per, parent, entry, parent.checked)


def _rebuilt(entries, count: int) -> State:
    """The state of ``entries`` (innermost first) entered in order, checked at ``count``."""
    st = State(checked=count)
    for e in reversed(entries):
        st = _push(st, e)
    return st


def current() -> State:
    """The calling context's state; one holding a context that has ended (elsewhere, or dropped without an exit)
    is replaced, here, by the state of the contexts still live in it."""
    st = STATE.get()
    count = ENDINGS[0]
    if st.checked == count or st.entry is None:
        return st
    chain = _chain(st)
    live = [e for e in chain if not e.ended]
    if len(live) == len(chain):
        object.__setattr__(st, "checked", count)  # (the count read before the chain: an ending since is seen next)
        return st
    st = _rebuilt(live, count)
    STATE.set(st)
    return st


def _held_keys() -> frozenset[str]:
    while _DROPPED:
        _forget(_DROPPED.pop())
    return frozenset().union(*(e.keys for e in _HELD)) if _HELD else frozenset()


def _apply() -> None:
    """The registries made to hold what the held entries and the running forwards need. A forward that starts or
    returns meanwhile (its own check read ``_INSTALLED`` or the flag before they were written) is seen by the check
    after."""
    for _ in range(100):  # (each round is a few dict operations; forwards come and go far slower)
        running = dict(_RUNNING)
        for fwd in [f for f in running if f.state is None]:  # returned, its ``returned`` cut short (an interrupt)
            _RUNNING.pop(fwd, None)
            running.pop(fwd)
        held = _held_keys()
        extra = frozenset().union(*running.values()) - held if running else frozenset()
        _ONLY_RUNNING[0] = bool(extra)
        install.apply(held | extra)
        _INSTALLED[0] = held | extra
        if _RUNNING.keys() == running.keys():
            return


def _nothing() -> None:
    pass


def running(fwd, keys: frozenset[str]) -> None:
    """A selected forward starts (its selection read): the registries hold its keys until it returns (its
    ``state`` set to None, then ``returned``), installed again where what selected it let go since it was read."""
    _RUNNING[fwd] = keys
    if not keys <= _INSTALLED[0]:
        _change(_nothing)


def tidy() -> None:
    """Let go of the entries dropped while a change could not run (a finalizer during a compile, or while the lock
    was held), and make a restore put off (``PENDING``), where no compile holds the lock now (a forward's start
    calls it where either is left)."""
    PENDING[0] = False
    if not critical.settle_if_free(_apply):
        PENDING[0] = True


def returned(fwd) -> None:
    """A selected forward returned: the registries are put back where only running forwards kept them, now if no
    compile elsewhere holds the lock, else by the next change (a forward does not wait for a compile)."""
    if _RUNNING.pop(fwd, None) is not None and _ONLY_RUNNING[0] and not critical.settle_if_free(_apply):
        PENDING[0] = True


def _change(step) -> None:
    """``step`` (idempotent) and the registries made to hold what the held entries ask, as one change that
    completes whatever interrupts it."""
    with critical.compiles_held, critical.interrupts_deferred():
        critical.settle(lambda: (step(), _apply()))


def _selecting(e: Entry, token: int) -> bool:
    """``e`` selects model ``token``'s forwards: its own entry, or a global switch's."""
    return e.token == token or (e.token is None and e.sel is not None)


def lacking(token: int, keys: frozenset[str]) -> bool:
    """An entry that selects model ``token`` was made for fewer attention keys than ``keys`` (read per forward)."""
    return any(_selecting(e, token) and not keys <= e.keys for e in list(_HELD))


def widen(token: int, keys: frozenset[str]) -> None:
    """Model ``token`` names attention keys now that the entries selecting it were not made for
    (``set_attn_implementation`` after the switch was made, or to a function registered since): each asks for
    those too, so the registries hold them for as long as any of them lives."""
    def step():
        for e in list(_HELD):
            if _selecting(e, token) and not keys <= e.keys:
                e.keys = e.keys | keys
    _change(step)


def _release(entry: Entry) -> None:
    """Let go of ``entry`` from a weak reference's callback, which may run inside a change (garbage collection):
    now if the lock is free, else at the next change."""
    entry.ended = True
    ENDINGS[0] += 1
    try:
        if critical.try_locked(lambda: (_forget(entry), _apply())):
            return
    except BaseException:  # a callback cannot raise; the next change completes it
        pass
    _DROPPED.append(entry)


def _forget(entry: Entry) -> None:
    """``entry`` no longer held, and no longer a patch where it was one."""
    _HELD.pop(entry, None)
    if entry.token is not None and _PATCHES.get(entry.token) is entry:
        PATCHED.pop(entry.token, None)
        _PATCHES.pop(entry.token, None)


def _end(entry: Entry) -> None:
    entry.ended = True
    _HELD.pop(entry, None)
    entry.ref = None
    ENDINGS[0] += 1


# -- contexts ---------------------------------------------------------------------------------------

def enter(entry: Entry, holder: object) -> State:
    """Hold ``entry`` (a context's, made by ``holder``) and select it in the calling context, innermost. Dropped
    without ``leave``, ``holder`` lets go of it."""
    parent = current()
    state = _push(parent, entry)

    def step():
        if entry.ref is None:
            entry.ref = weakref.ref(holder, lambda _, entry=entry: _release(entry))
        _HELD[entry] = None
        STATE.set(state)
    _change(step)
    return state


def abandon(entry: Entry) -> None:
    """Undo an ``enter`` that did not complete (an interrupt): nothing of ``entry`` stays. Where it never began
    (interrupted waiting for a compile elsewhere) there is nothing to undo, and no wait."""
    if entry.ref is None and entry not in _HELD and STATE.get().entry is not entry:
        entry.ended = True
        return

    def step():
        st = STATE.get()
        if st.entry is entry:
            STATE.set(st.parent or EMPTY)
        _end(entry)
    _change(step)


def leave(entry: Entry, failing: bool) -> str:
    """End ``entry``'s selection in the calling context and let go of it; how it was left:

    - ``"in order"``: it was the innermost;
    - ``"out of order"``: a context entered after it is still open. With an exception propagating through it
      (``failing``) that context keeps its selection; with none, every selection of this context ends;
    - ``"ended"``: an out-of-order exit in its context ended it before (nothing more changes here);
    - ``"elsewhere"``: this context does not hold it (another thread or task): it ends where it was entered.
    """
    st = current()
    if entry.ended:
        how = "ended"
    elif st.entry is entry:
        how = "in order"
    else:
        how = "out of order" if entry in _chain(st) else "elsewhere"

    def step():
        if how == "in order":
            STATE.set(st.parent or EMPTY)
        elif how == "out of order" and failing:
            STATE.set(_rebuilt([e for e in _chain(st) if e is not entry], ENDINGS[0]))
        elif how == "out of order":
            for e in _chain(st):
                e.ended = True  # (their contexts are left quietly: the error is raised once)
            STATE.set(EMPTY)
        _end(entry)
    _change(step)
    return how


# -- patches ----------------------------------------------------------------------------------------

def patch(token: int, sel: Selection, keys: frozenset[str], model: object) -> None:
    """Select ``sel`` for model ``token`` in every thread until ``unpatch``; the model, freed, unpatches itself."""
    def step():
        entry = _PATCHES.get(token)
        if entry is None:
            entry = Entry(sel, token, keys)
            entry.ref = weakref.ref(model, lambda _, token=token: _dropped_patch(token))
            _HELD[entry] = None
            _PATCHES[token] = entry
        entry.sel = sel
        PATCHED[token] = sel
    _change(step)


def _dropped_patch(token: int) -> None:
    """A patched model freed: its patch ends, as its entry is let go of (``_release``: now, or at the next forward
    or change where a compile holds the lock; its selection is never removed under a trace, which reads it)."""
    entry = _PATCHES.get(token)
    if entry is not None:
        _release(entry)


def unpatch(token: int) -> bool:
    """Undo ``patch`` for model ``token``; False where it is not patched."""
    if token not in _PATCHES:
        return False

    def step():  # the record that finds the entry goes last
        entry = _PATCHES.get(token)
        if entry is not None:
            PATCHED.pop(token, None)
            _end(entry)
            _PATCHES.pop(token, None)
    _change(step)
    return True


def patched(token: int) -> Selection | None:
    return PATCHED.get(token)


# -- graphs ------------------------------------------------------------------------------------------

def hold(holder: object, keys: frozenset[str]) -> Entry:
    """Hold attnswitch's functions installed for ``keys`` while ``holder`` lives (a recomputable graph's record)."""
    entry = Entry(None, None, keys)
    entry.ref = weakref.ref(holder, lambda _, entry=entry: _release(entry))  # first: it always lets go
    _change(lambda: _HELD.__setitem__(entry, None))
    return entry


def held() -> dict[Entry, frozenset[str]]:
    """The entries held now and the keys each needs (for tests that check nothing was left behind)."""
    return {e: e.keys for e in _HELD if e not in _DROPPED}

