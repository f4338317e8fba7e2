"""attnswitch's entries as ``torch.compile`` traces them: the selection read through a guard, the backend as an op.

The eager entries (``dispatch``) read ``ContextVar``s on every call, which Dynamo cannot trace. Each has a
traceable twin here, registered with ``torch.compiler.substitute_in_graph``: Dynamo inlines the twin
wherever it meets the entry, and eager calls never see it (they cost exactly what they cost before).

- **Which backend.** The rules are the eager entries' own (``selection.rule``), over the calling context's state
  (``record.STATE``) read through ``_NOW.state``, a property whose getter is ``ContextVar.get`` itself (a C
  function): Dynamo calls it while tracing and guards on the values the trace read from the state (the global
  backend, the model's own selection, a patch), the way it guards pybind properties. Whose call it is
  (``selection.call_models``) is known while tracing: the models of the innermost forward traced around it
  (a model's call in the same trace), else every model owning the module. The guard calls the getter
  again at every call of the compiled code, in the calling thread or task: another backend, or leaving the switch,
  fails the guard, and the code is compiled again for what is selected now; equal selections in new contexts pass
  it. Under CUDA graphs (``mode="reduce-overhead"``) the guards run before every replay, so a graph recorded for one
  backend is never replayed for another. (A value set for the duration of a forward, global or per thread, would
  need the eager per-forward guard around every compiled region, which ``torch.compile(model)`` made
  before a switch does not have, and a global one a lock across threads.)
- **What runs.** A forced backend is an op of ``backends.traced``: its body is the backend's own ``run``
  on the trace's fake tensors, so the graph holds the backend's own ATen op (or the hand-written
  attention's, as one opaque op) and an ineligible call is refused with ``BackendUnavailable`` when the
  compiled code runs. ``auto`` and ``eager`` trace transformers' own functions (SDPA's choice is then made
  when compiling, under the flags of that moment: reports name the kernel that ran).
- **No silent non-switch.** A compiled forward of a selected model that traced no attention call
  through attnswitch raises ``UnsupportedModel`` while tracing, as an eager one does when it returns.

Only the first entry of a compiled region is eager Python: the rest, the per-forward guard
included, is traced, so ``torch.compile(model)`` made before a switch is switched too.
"""

from __future__ import annotations

import ctypes
import functools
import threading
import types

import torch
import torch.nn as nn
from torch._guards import TracingContext
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from ..backends import MODEL_LEVEL, Call, naive, traced
from ..backends.call import check, describe
from ..backends.sdpa import auto_reasons, sdpa_auto
from ..errors import UnsupportedModel
from ..sites import module_path
from . import dispatch, owners, record, registries, selection
from .interface import attention_modules, expects_attention
from .selection import choose, resolve_selection

__all__ = ["installed", "traced_calls", "bare_attention", "twin"]


class _Now:
    """The calling context's selection state, as Dynamo reads and guards it; with nothing set in the
    context, this object itself (the empty state)."""

    global_sel = None
    per_owner = types.MappingProxyType({})
    state = property(record.STATE.get)


_NOW = _Now()
_COUNT = threading.local()  # attention calls traced so far in this thread (trace time only)
#: (the trace, the models) of the forwards being traced in this thread, innermost last (trace time only)
_RUNNING = threading.local()


def _alive(key: int):
    """The object whose ``id`` is ``key``, alive in the frame being traced. Dynamo before torch 2.13 hands an
    ``assume_constant_result`` function constants only: an object goes there as its ``id`` (Dynamo guards the
    object's identity where it reads it), and comes back here."""
    return ctypes.cast(key, ctypes.py_object).value


def _about(module) -> tuple[tuple[int, ...], str]:
    return _about_id(id(module))


@torch._dynamo.assume_constant_result
def _about_id(key: int) -> tuple[tuple[int, ...], str]:
    """At trace time: the models the module's call belongs to (``selection.call_models``) and its path; counts
    the traced attention call, and remembers the module's owners as models whose forwards may run compiled
    attention (``dispatch.TRACED``)."""
    module = _alive(key)
    _COUNT.n = getattr(_COUNT, "n", 0) + 1
    mine = owners.owners(module)
    dispatch.TRACED.update(mine)
    return selection.call_models(mine, _running()), module_path(module)


def _forwards() -> list:
    """This thread's forwards being traced in the trace under way (those of a trace that failed are dropped)."""
    trace = TracingContext.try_get()
    return [f for f in getattr(_RUNNING, "stack", ()) if f[0] is trace]


def _running() -> tuple[int, ...] | None:
    stack = _forwards()
    return stack[-1][1] if stack else None


def _forward_began(model) -> int:
    return _forward_began_id(id(model))


@torch._dynamo.assume_constant_result
def _forward_began_id(key: int) -> int:
    """At trace time: a forward of the model ``key`` begins in the trace; its calls are its models'."""
    stack = _forwards()
    stack.append((TracingContext.try_get(), owners.owners(_alive(key))))
    _RUNNING.stack = stack
    return len(stack)


@torch._dynamo.assume_constant_result
def _forward_ended(depth: int) -> bool:
    """At trace time: the forward ``_forward_began`` answered ``depth`` for has returned."""
    _RUNNING.stack = _forwards()[:depth - 1]
    return True


def _site(module) -> str:
    return _site_id(id(module))


@torch._dynamo.assume_constant_result
def _site_id(key: int) -> str:
    return module_path(_alive(key))


def traced_calls() -> int:
    """Attention calls traced through attnswitch in this thread so far."""
    return getattr(_COUNT, "n", 0)


def _selected(models: tuple[int, ...]):
    """``selection.selected`` as traced code reads it, for a call of models ``models`` (``_about``)."""
    return selection.rule(_NOW.state, models, record.PATCHED)


def _config_tokens(config) -> tuple[int, ...]:
    return _config_tokens_id(id(config))


@torch._dynamo.assume_constant_result
def _config_tokens_id(cid: int) -> tuple[int, ...]:
    return owners.models_with_config(_alive(cid))


def _selected_for_config(config) -> bool:
    return selection.rule(_NOW.state, _config_tokens(config), record.PATCHED) is not None


# -- the twins --------------------------------------------------------------------------------------

def attention_forward(module, query, key, value, attention_mask, *, _own=None, **kwargs):
    models, _ = _about(module)
    return dispatch._dispatch(_selected(models), None, module, query, key, value, attention_mask, kwargs, _own)


def run_backend(name, call):
    if call.where is not None and not isinstance(call.where, str):
        call = call._replace(where=_site(call.where))
    return traced.attention(name, call)


def _unselected(module, query, key, value, mask, kwargs, own=None):
    return _unselected_with(own, module, query, key, value, mask, kwargs)


def _unselected_with(own, module, query, key, value, mask, kwargs):
    config = getattr(module, "config", None)
    key_name = getattr(config, "_attn_implementation", None) if config is not None else None
    fn = registries.original("attention", key_name) if key_name is not None else None
    if fn is None:
        fn = own or dispatch.model_eager_function(module)
    if config is not None and key_name != "sdpa" and _selected_for_config(config):
        if key_name not in (None, "eager"):  # as the eager entry says it
            raise RuntimeError(f"{_site(module)} shares its config with a model switched here, and its attention "
                               f"implementation {key_name!r} builds its own masks; give each model its own config "
                               "(copy.deepcopy(config))")
        if mask is None or mask.dtype == torch.bool:
            causal = dispatch._causal(module, query, mask, kwargs.get("is_causal"))
            mask = dispatch.additive_mask(mask, query, key, causal, query.dtype)
    return fn(module, query, key, value, mask, **kwargs)


def _recomputed(module, sel):
    # a compiled graph's backward holds the backward of the op its forward traced; nothing is looked up again
    return sel


def _model_level(name, module, query, key, value, mask, kwargs, own=None):
    return dispatch.eager_with(own or dispatch.model_eager_function(module), name, module, query, key, value, mask,
                               kwargs)


def get_interface(self, attn_implementation, default):
    """transformers' lookup as traced: the registry's entry, and for ``eager`` (no entry) the module's own
    function through attnswitch's entry."""
    fn = self._local_mapping.get(attn_implementation)
    if fn is None:
        fn = self._global_mapping.get(attn_implementation)
    if fn is not None:
        return fn
    if attn_implementation == "eager" or attn_implementation is None:
        return functools.partial(_own_attention, default)
    return registries.original_attr(registries.GET_INTERFACE)(self, attn_implementation, default)


def _own_attention(own, module, query, key, value, attention_mask, **kwargs):
    """``attention_forward`` for a module whose own eager function transformers gave as ``own``: a module no
    switch selects runs exactly that; ``eager`` runs it with the mask transformers made."""
    owners, _ = _about(module)
    sel = _selected(owners)
    if sel is None:
        return _unselected_with(own, module, query, key, value, attention_mask, kwargs)
    name = choose(sel, query.shape[2], module)
    if name is None:  # a layer kind the selection leaves out: the model's own attention
        return _unselected_with(own, module, query, key, value, attention_mask, kwargs)
    if name in MODEL_LEVEL:
        return dispatch.eager_with(own, name, module, query, key, value, attention_mask, kwargs)
    return dispatch._dispatch(sel, None, module, query, key, value, attention_mask, kwargs)


def _auto(module, query, key, value, mask, kwargs):
    sinks = kwargs.get("s_aux") if kwargs.get("s_aux") is not None else kwargs.get("sinks")
    reasons = auto_reasons(kwargs.get("softcap"), sinks)
    if reasons:  # refused when the compiled code runs, as uncompiled
        call = Call(query, key, value, mask, kwargs.get("dropout", 0.0), bool(kwargs.get("is_causal") or False))
        out = torch.ops.attnswitch.refuse(query.transpose(1, 2), "auto", _site(module), reasons, describe(call))
        return out, None
    return sdpa_attention_forward(module, query, key, value, mask, **kwargs)


def bare_attention(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False, *,
                   backend=None):
    """``switch.attention`` traced: the calling context's global backend, through the guard."""
    sel = resolve_selection(backend) if backend is not None else (_NOW.state.global_sel or "auto")
    check(q, k, v, attn_mask, enable_gqa)
    name = choose(sel, q.shape[2])
    call = Call(q, k, v, attn_mask, dropout_p, is_causal, scale)
    return sdpa_auto(call)[0] if name == "auto" else traced.attention(name, call)[0]


def mask_forward(*args, config=None, **kwargs):
    if config is not None and _selected_for_config(config):
        fn = registries.original("masks", "sdpa")
    else:
        fn = registries.original("masks", getattr(config, "_attn_implementation", None) or "sdpa")
    return fn(*args, config=config, **kwargs)


def causal_mask(q_len, kv_len, device):
    return torch.ones(q_len, kv_len, dtype=torch.bool, device=device).triu_(1)


def _check_counted(model, before: int) -> bool:
    return _check_counted_id(id(model), before)


@torch._dynamo.assume_constant_result
def _check_counted_id(key: int, before: int) -> bool:
    """At trace time, after a forward: one that traced no attention call through attnswitch while its
    model is selected (or the model it is part of) raises, as ``guarded_call`` does after an eager one."""
    model = _alive(key)
    if traced_calls() == before and selection.selected(model) is not None and expects_attention(model):
        raise UnsupportedModel(
            f"{type(model).__name__} was compiled under an attnswitch backend and its forward made no attention "
            f"call through transformers' attention interface: it computes attention itself, so the switch changes "
            f"nothing. Its attention modules: {attention_modules(model)}")
    return True


@torch._dynamo.assume_constant_result
def _counted() -> int:
    return traced_calls()


def traced_call(model, args, kwargs):
    before = _counted()
    depth = _forward_began(model)
    out = (registries.original_call() or nn.Module._call_impl)(model, *args, **kwargs)
    _forward_ended(depth)
    _check_counted(model, before)
    return out


_TWINS = [(dispatch.attention_forward, attention_forward), (dispatch.run_backend, run_backend),
          (dispatch._unselected, _unselected), (dispatch._auto, _auto), (dispatch.mask_forward, mask_forward),
          (naive.causal_mask, causal_mask), (dispatch.traced_call, traced_call),
          (dispatch.traced_interface, get_interface), (dispatch._recomputed, _recomputed),
          (dispatch._model_level, _model_level)]


def twin(original, traceable) -> None:
    """Have torch.compile trace ``traceable`` wherever it meets ``original`` (eager calls never see it)."""
    torch.compiler.substitute_in_graph(original, skip_signature_check=True)(traceable)


def _install() -> bool:
    for original, traceable in _TWINS:
        twin(original, traceable)
    dispatch._GUARDS.add(traced_call.__code__)  # (a compiled forward's eager parts run below it)
    return True


installed = _install()
