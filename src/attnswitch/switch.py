"""The switch: ``backend()`` context manager, ``patch()``/``unpatch()``, and the bare ``attention()``.

The public entry points only: what they select is kept by the switch's record (``hf.record``: the
calling context's selection in a ``ContextVar``, the patches, what holds transformers' registries), and read
by the rules (``hf.selection``). Contexts nest (the inner one wins, the outer one comes back), and each thread
or asyncio task sees only its own selection. Neither a model, nor its configs, nor PyTorch's SDPA flags are
written; transformers' registries hold attnswitch's dispatchers while any switch is active and are put back
exactly when the last one ends.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping

import torch
import torch.nn as nn
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from . import backends, instrument
from .backends import Call
from .backends.call import autocast_inputs, check
from .candidate import Kinds
from .hf import compiled, install, layerkinds, owners, record, registries
from .hf.selection import PATCHED, Policy, Selection, choose, resolve_selection
from .options import OptionError

__all__ = ["backend", "patch", "unpatch", "attention", "active_backend", "is_patched", "layer_kinds"]

layer_kinds = layerkinds.layer_kinds


class backend:
    r"""Compute attention with backend ``name`` inside the block.

    ``name`` is a backend name (or alias), a policy per phase: ``{"prefill": "cudnn", "decode":
    "flash"}`` (decode: calls with one query token; ``"decode_max_query"`` sets another limit), or, with
    ``model``, a backend (or a policy) per layer kind: ``{"sliding_attention": "flex", "full_attention":
    "flash"}`` (``layer_kinds(model)`` names the kinds; a kind left out runs the model's own attention).
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
            self._info = owners.register(model)  # refuses models off the attention interface, once
        self.selection = _bind(self.selection, model)
        self._entry: record.Entry | None = None
        self._thread: threading.Thread | None = None
        self._how: str | None = None  # how it was left: "in order", "out of order", "ended", "elsewhere"

    def __enter__(self) -> Selection:
        if self._entry is not None:
            raise RuntimeError("this backend() context is already entered; make a new one")
        info = self._info
        keys = info.keys() if info is not None else _global_keys()
        entry = record.Entry(self.selection, None if info is None else info.token, keys, threading.current_thread())
        self._how, self._entry, self._thread = None, entry, entry.thread
        try:
            record.enter(entry, self)
            return self.selection
        except BaseException:  # an interrupt too: nothing of this context may stay behind
            self._entry = None
            record.abandon(entry)
            raise

    def _leave(self, failing: bool) -> None:
        # idempotent: run again after an interrupt, it does what is left
        entry = self._entry
        if entry is None:
            return
        how = record.leave(entry, failing)
        if self._how is None:
            self._how = how
        self._entry = None

    def __exit__(self, *exc) -> None:
        if self._entry is None:  # left already
            return
        failing = exc[0] is not None
        try:
            self._leave(failing)
        except BaseException:  # an interrupt while leaving: leave whole, then raise it
            self._leave(failing)
            raise
        if failing or self._how in ("in order", "ended"):
            return
        if self._how == "elsewhere":
            here, there = threading.current_thread(), self._thread
            where = (f"in thread {here.name!r} (id {here.ident}), while it was entered in thread {there.name!r} "
                     f"(id {there.ident})" if here is not there else
                     "in another context (an asyncio task or contextvars.Context) than the one that entered it")
            raise RuntimeError(f"an attnswitch.backend context was exited {where}; exit a context where it was "
                               "entered. It is over: the context that entered it no longer selects it")
        raise RuntimeError("attnswitch.backend contexts exited out of order (an outer one before an inner "
                           "one); nothing is selected now in this context")


_KEYS: list = [None, frozenset()]  # (the registries' sizes, their standard keys then)


def _global_keys() -> frozenset[str]:
    """The keys a global switch takes over: every standard key registered now (read again where one was
    registered or removed)."""
    sizes = install.sizes()
    if _KEYS[0] != sizes:
        _KEYS[:] = [sizes, frozenset(registries.standard_keys())]
    return _KEYS[1]


def patch(model: nn.Module, name: str | Policy | Mapping) -> nn.Module:
    """Make ``model`` compute attention with ``name`` until ``unpatch(model)``, in every thread.

    Patching a patched model only changes its backend. A ``backend()`` context still wins over a patch
    inside its block. The model itself is not written: a copy of it is an unpatched model, and a
    patched model that is dropped unpatches itself.
    """
    sel = resolve_selection(name)
    info = owners.register(model)
    sel = _bind(sel, model)
    record.patch(info.token, sel, info.keys(), model)
    return model


def _bind(sel: Selection, model: nn.Module | None) -> Selection:
    """A selection per layer kind bound to its one model, whose kinds it names (``hf.layerkinds``)."""
    if not isinstance(sel, Kinds):
        return sel
    if model is None:
        raise OptionError("a backend per layer kind ({given}) is for one model's layers: pass model=", given=str(sel))
    return layerkinds.bind(model, sel)


def unpatch(model: nn.Module) -> nn.Module:
    """Undo ``patch``: the model computes attention as before the first patch."""
    info = owners.info_of(model)
    if info is None or not record.unpatch(info.token):
        raise ValueError(f"{type(model).__name__} is not patched by attnswitch")
    return model


def is_patched(model: nn.Module) -> Selection | None:
    """The backend ``model`` is patched with, or None."""
    info = owners.info_of(model)
    return None if info is None else record.patched(info.token)


def runs_as_auto(model: nn.Module) -> bool:
    """Whether ``model`` run with no switch runs what ``backend("auto", model=model)`` runs: every config of the
    model names ``sdpa``, the ``sdpa`` entry is transformers' own function (``auto`` calls that one), and no
    switch holds transformers' registries (a context in any thread, a patch): they would route its forwards
    through attnswitch's entries."""
    if registries.installed_entries() or registries.original("attention", "sdpa") is not sdpa_attention_forward:
        return False
    try:
        names = {getattr(getattr(m, "config", None), "_attn_implementation", None) for m in model.modules()}
    except Exception:  # (a module's own ``config`` that is no transformers config: not a model auto runs as is)
        return False
    return {n for n in names if isinstance(n, str)} == {"sdpa"}


def switched(model: nn.Module) -> tuple[Selection, str, str] | None:
    """What switches ``model``'s forwards, or a part of them, in the calling thread now, as ``(selection, how,
    whose)``: ``how`` is ``"context"`` (a ``backend()`` block) or ``"patch"``; ``whose`` the model it names:
    ``"every model"``, ``"the model"``, ``"a model the model is part of"`` (a submodel of a patched model runs
    the patch) or ``"a part of the model"``. None: nothing does."""
    st = record.current()
    if st.global_sel is not None:
        return st.global_sel, "context", "every model"
    info = owners.info_of(model)
    own = info.token if info is not None else None
    parts = [i.token for m in model.modules() if m is not model and (i := owners.info_of(m)) is not None]
    whose = [(own, "the model"), *((t, "a model the model is part of") for t in owners.owners(model) if t != own),
             *((t, "a part of the model") for t in parts)]
    for held, how in ((st.per_owner, "context"), (PATCHED, "patch")):
        found = next(((held[t], who) for t, who in whose if t is not None and t in held), None)
        if found is not None:
            return found[0], how, found[1]
    return None


def active_backend() -> Selection | None:
    """The backend selected by the innermost global ``backend()`` context of this thread, or None."""
    return record.current().global_sel


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
    if isinstance(sel, Kinds):
        raise OptionError("a backend per layer kind ({given}) is for a model's layers: a bare attention call has no "
                          "layer kind; name one backend, or a backend per phase", given=str(sel))
    q, k, v, attn_mask = autocast_inputs(q, k, v, attn_mask)  # (under torch.autocast, as SDPA casts them)
    check(q, k, v, attn_mask, enable_gqa)
    name = choose(sel, q.shape[2])
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
