"""Backward recomputation of a switched forward (gradient checkpointing) runs the forward's backend, on
whatever thread autograd runs it.

A checkpointed layer's forward runs again in backward: on the CUDA autograd engine's device thread (on CPUs, the
thread that called backward), which sees none of the caller's contexts, and possibly after the block the forward ran
in has ended. A forward of a switched model run under grad, whose layers checkpoint, leaves a record held by its
graph (its outputs' ``grad_fn`` metadata): the model, the selection, the thread; the switch's record
(``record.hold``) keeps attnswitch's entries installed while the graph may still be recomputed. An attention call
inside a backward with no forward running in its context takes its model's record: the one of the thread that called
backward (autograd carries ATen's thread-local state, where each thread leaves its id, to the device thread), else
the one live record of any thread. Live records of one model with different selections, none of which the calling
context selects, are an error that says so: attnswitch cannot tell which forward is recomputed.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Mapping

import torch

from ..sites import site_name
from . import owners, record

__all__ = ["note", "chosen", "live", "LIVE"]

_KEY = "attnswitch.backward_thread"
_STASH = getattr(torch._C, "_stash_obj_in_tls", None)
_IN_TLS = getattr(torch._C, "_is_key_in_tls", None)
_FROM_TLS = getattr(torch._C, "_get_obj_in_tls", None)
_STASHED = threading.local()
_LOCK = threading.Lock()


class _Record:
    """What a recomputed forward ran with; alive while a graph of it is (the graph holds it)."""

    __slots__ = ("token", "model", "sel", "thread", "__weakref__")

    def __init__(self, token: int, model: str, sel, thread: int):
        self.token, self.model, self.sel, self.thread = token, model, sel, thread


#: owner token -> records of its forwards whose graphs may still be recomputed (weakly); a record's selection
#: None: a forward that ran unswitched while others' graphs were alive
_LIVE: dict[int, list[weakref.ref]] = {}
LIVE = _LIVE


def _grad_fns(out) -> list:
    """The autograd nodes of a forward's output tensors (a ModelOutput's fields, a tuple's items, one level in)."""
    values = out.values() if isinstance(out, Mapping) else out if isinstance(out, (tuple, list)) else (out,)
    nodes = []
    for v in values:
        for t in v if isinstance(v, (tuple, list)) else (v,):
            if isinstance(t, torch.Tensor) and t.grad_fn is not None:
                nodes.append(t.grad_fn)
    return nodes


def _here() -> int:
    """This thread's id, left in ATen's thread-local state (once per thread) for autograd to carry."""
    thread = threading.get_ident()
    if _STASH is not None and getattr(_STASHED, "thread", None) != thread:
        _STASH(_KEY, thread)
        _STASHED.thread = thread
    return thread


def _backward_thread() -> int:
    """The thread that called the running backward, where autograd carried its id here; else this one."""
    if _IN_TLS is not None and _IN_TLS(_KEY):
        return _FROM_TLS(_KEY)
    return threading.get_ident()


def live(token: int) -> list[_Record]:
    with _LOCK:
        refs = _LIVE.get(token)
        if not refs:
            return []
        recs = [r for ref in refs if (r := ref()) is not None]
        if not recs:  # (a model with no live record leaves the map: empty, it costs calls nothing)
            del _LIVE[token]
        elif len(recs) != len(refs):
            _LIVE[token] = [weakref.ref(r) for r in recs]
        return recs


def note(info, model: str, sel, out) -> None:
    """After a forward under grad whose layers checkpoint: its graph holds a record of what it ran with (one
    record serves every graph of this model, selection and thread while any is alive)."""
    nodes = _grad_fns(out)
    if not nodes:
        return
    thread = _here()
    rec = next((r for r in live(info.token) if r.thread == thread and r.sel == sel), None)
    if rec is None:
        rec = _Record(info.token, model, sel, thread)
        record.hold(rec, info.keys())  # attnswitch's entries stay while the record (its graphs) lives
        with _LOCK:
            _LIVE.setdefault(info.token, []).append(weakref.ref(rec))
    for node in nodes:
        node.metadata["attnswitch"] = rec


def chosen(module, sel):
    """The selection for an attention call of ``module`` inside a backward, with no forward running in its
    context (a recompute): its model's forward's, else ``sel`` (the calling context's)."""
    if not _LIVE:
        return sel
    for token in owners.owners(module):
        recs = live(token)
        if not recs:
            continue
        thread = _backward_thread()
        sels = list(dict.fromkeys(r.sel for r in ([r for r in recs if r.thread == thread] or recs)))
        if len(sels) == 1:
            return sels[0]
        if sel is not None and sel in sels:
            return sel
        ran = ", ".join("no switch" if s is None else repr(str(s)) for s in sels)
        raise RuntimeError(
            f"{site_name(module)} is recomputed in a backward (gradient checkpointing) where no attnswitch context "
            f"chooses, and {recs[0].model} ran forwards under {ran} whose graphs "
            "are all alive: attnswitch cannot tell which forward this backward recomputes. Run each backward before "
            "the next forward of the model, or inside the block of its forward")
    return sel
