"""The switch: ``backend()`` context manager, ``patch()``/``unpatch()``, and the bare ``attention()``.

The selection lives in a ``ContextVar`` (``hf.selection``): contexts nest (the inner one wins, the outer
one comes back), and each thread or asyncio task sees only its own selection. Neither a model, nor its
configs, nor PyTorch's SDPA flags are written; transformers' registries hold attnswitch's dispatchers
while any switch is active and are put back exactly when the last one ends.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Mapping

import torch
import torch.nn as nn

from . import backends, instrument
from .backends import Call
from .hf import compiled, install, registries, selection
from .hf.selection import PATCHED, STATE, Policy, Selection, State, resolve_selection

__all__ = ["backend", "patch", "unpatch", "attention", "active_backend", "is_patched"]

_PATCHES: dict[int, tuple[object, weakref.finalize]] = {}  # owner token -> (lease, finalizer)


class backend:
    r"""Compute attention with backend ``name`` inside the block.

    ``name`` is a backend name (or alias), or a policy per phase: ``{"prefill": "cudnn", "decode":
    "flash"}`` (decode: calls with one query token; ``"decode_max_query"`` sets another limit).
    Without ``model`` every transformers model on the attention interface that runs in this thread (or
    task) inside the block is switched; with ``model`` only that model, never another sharing its
    config. On exit, normal or by exception, transformers' registries are as found; models, configs and
    PyTorch's SDPA flags are never written.

    A forced backend never falls back: if it cannot run a call, ``BackendUnavailable`` says why; a
    forward that made no attention call through the switch raises ``UnsupportedModel``. Contexts must
    be exited innermost first: one exited out of order raises ``RuntimeError`` and leaves nothing selected.

    Example::

        >>> with attnswitch.backend("cudnn"):
        ...     logits = model(input_ids).logits
        >>> with attnswitch.backend("naive-inplace", model=m):
        ...     m(**batch)

    The block gets the canonical backend name (or the ``Policy``).
    """

    def __init__(self, name: str | Policy | Mapping, model: nn.Module | None = None):
        self.selection: Selection = resolve_selection(name)
        self.model = model
        self._info = None
        if model is not None:
            self._info = selection.register(model)  # refuses models off the attention interface, once
        self._state: State | None = None
        self._parent_state: State | None = None
        self._how: str | None = None  # how it was left: "in order", "out of order", "elsewhere"
        self._thread: threading.Thread | None = None
        self._finalizer: weakref.finalize | None = None

    def __enter__(self) -> Selection:
        if self._state is not None:
            raise RuntimeError("this backend() context is already entered; make a new one")
        keys = self._info.keys() if self._info is not None else frozenset(registries.standard_keys())
        parent = self._parent_state = selection.current()
        self._how, self._thread = None, threading.current_thread()
        lease = self._lease = object()
        if self._info is None:
            state = State(self.selection, parent=parent, lease=lease)
        else:
            token = self._info.token  # last: the innermost model-scoped context wins for modules two models own
            per_owner = {t: sel for t, sel in parent.per_owner.items() if t != token} | {token: self.selection}
            state = State(parent.global_sel, per_owner, parent, lease)
        try:
            with install.interrupts_deferred():
                # a context dropped without an exit (an interrupt at the entry of __exit__) still lets go
                self._finalizer = weakref.finalize(self, install.release_later, lease)
                install.acquire(lease, keys)
                STATE.set(state)
                self._state = state
            return self.selection
        except BaseException:  # an interrupt too: nothing of this context may stay behind
            self._state = None
            with install.interrupts_deferred():
                install.settle(lambda: (STATE.set(parent), install.drop(lease)))
                if self._finalizer is not None:
                    self._finalizer.detach()
            raise

    def _leave(self) -> None:
        # idempotent: run again after an interrupt, it does what is left
        state = self._state
        if state is None:
            return
        if self._how is None:
            self._how = _how_left(state)
        if self._how != "in order":
            selection.close(state)
        with install.interrupts_deferred():
            if self._how == "elsewhere":  # this context's selection is not the one to change
                install.settle(lambda: install.drop(state.lease))
            else:
                install.settle(lambda: (STATE.set(state.parent if self._how == "in order" else State()),
                                        install.drop(state.lease)))
            self._finalizer.detach()
        self._state = None

    def __exit__(self, *exc) -> None:
        if self._state is None:  # left already (by another thread, say)
            return
        try:
            self._leave()
        except BaseException:  # an interrupt while leaving: leave whole, then raise it
            self._leave()
            raise
        if exc[0] is not None or self._how == "in order":
            return
        if self._how == "elsewhere":
            here, there = threading.current_thread(), self._thread
            where = (f"in thread {here.name!r} (id {here.ident}), while it was entered in thread {there.name!r} "
                     f"(id {there.ident})" if here is not there else
                     "in another context (an asyncio task or contextvars.Context) than the one that entered it")
            raise RuntimeError(f"an attnswitch.backend context was exited {where}; exit a context where it was "
                               "entered. It is over: the context that entered it no longer selects it")
        if not selection.closed(self._parent_state):
            raise RuntimeError("attnswitch.backend contexts exited out of order (an outer one before an inner "
                               "one); nothing is selected now in this context")


def _how_left(state: State) -> str:
    """Whether ``state`` is this context's selection ("in order"), one an open inner context is nested in or
    one whose outer context was exited before it ("out of order"), or not in this context at all (another
    thread or task: "elsewhere")."""
    now = STATE.get()
    if now is state:
        return "in order"
    if selection.closed(state.parent):
        return "out of order"
    while now is not None:
        if now is state:
            return "out of order"
        now = now.parent
    return "elsewhere"


def _drop_patch(token: int) -> None:
    PATCHED.pop(token, None)
    entry = _PATCHES.pop(token, None)
    if entry is not None:
        install.release_later(entry[0])


def patch(model: nn.Module, name: str | Policy | Mapping) -> nn.Module:
    """Make ``model`` compute attention with ``name`` until ``unpatch(model)``, in every thread.

    Patching a patched model only changes its backend. A ``backend()`` context still wins over a patch
    inside its block. The model itself is not written: a copy of it is an unpatched model, and a
    patched model that is dropped unpatches itself.
    """
    sel = resolve_selection(name)
    info = selection.register(model)
    lease = object()

    def step():  # idempotent: run again after an interrupt, it does what is left
        if info.token not in _PATCHES:
            install.LEASES[lease] = info.keys()
            _PATCHES[info.token] = (lease, weakref.finalize(model, _drop_patch, info.token))
        PATCHED[info.token] = sel

    with install.interrupts_deferred():
        install.settle(step)
    return model


def unpatch(model: nn.Module) -> nn.Module:
    """Undo ``patch``: the model computes attention as before the first patch."""
    info = selection.info_of(model)
    if info is None or info.token not in _PATCHES:
        raise ValueError(f"{type(model).__name__} is not patched by attnswitch")

    def step():  # idempotent; the record that finds the lease goes last
        entry = _PATCHES.get(info.token)
        if entry is not None:
            PATCHED.pop(info.token, None)
            install.drop(entry[0])
            entry[1].detach()
            _PATCHES.pop(info.token, None)

    with install.interrupts_deferred():
        install.settle(step)
    return model


def is_patched(model: nn.Module) -> Selection | None:
    """The backend ``model`` is patched with, or None."""
    info = selection.info_of(model)
    return None if info is None else PATCHED.get(info.token)


def active_backend() -> Selection | None:
    """The backend selected by the innermost global ``backend()`` context of this thread, or None."""
    return selection.current().global_sel


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
    *,
    backend: str | Policy | None = None,
) -> torch.Tensor:
    """``F.scaled_dot_product_attention`` with the active backend (``backend=`` overrides it;
    ``auto``, SDPA's own choice, when none is active). Same arguments and result as SDPA."""
    sel = resolve_selection(backend) if backend is not None else (active_backend() or "auto")
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(f"expected 4-d q, k, v [batch, heads, seq, dim]; got {q.dim()}, {k.dim()}, {v.dim()} dims")
    if k.shape[1] != q.shape[1]:
        if not enable_gqa:
            raise ValueError(f"q has {q.shape[1]} heads and k {k.shape[1]}: pass enable_gqa=True for grouped "
                             "query attention")
        if q.shape[1] % k.shape[1]:
            raise ValueError(f"q heads ({q.shape[1]}) must be a multiple of k/v heads ({k.shape[1]})")
    name = selection.choose(sel, q.shape[2])
    call = Call(q, k, v, attn_mask, dropout_p, is_causal, scale)
    m = instrument.current()
    if m is not None:
        out, _ = instrument.call(m, instrument.BARE_CALL, k.shape[2], backends.run, name, call)
        if m.observers:
            instrument.observe(m, instrument.BARE_CALL, q, k, v, attn_mask, is_causal, None, out, top_left=True)
    else:
        out, _ = backends.run(name, call)
    return out


compiled.twin(attention, compiled.bare_attention)  # under torch.compile: the selection read through a guard
