"""The functions attnswitch writes into transformers' registries, and the per-forward guard.

Each entry asks the calling context which backend is selected for the calling module (``selection``);
with none selected (another thread, another model, outside any context) it runs exactly what the
registry held before, so an override is invisible to code that did not ask for it. Every forward of a
selected model counts the attention calls that went through the selected backend: a forward that made
none, while the model has attention layers, raises ``UnsupportedModel`` (it computed attention some
other way, and a switch must never silently change nothing).
"""

from __future__ import annotations

import functools
import warnings
from contextvars import ContextVar

import torch
import torch.nn as nn
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from .. import backends, instrument
from ..backends import REFERENCE, Call
from ..backends.naive import causal_mask
from ..backends.sdpa import auto_reasons
from ..errors import BackendUnavailable, UnsupportedModel
from ..sites import module_path, site_name
from . import registries, selection
from .interface import attention_modules, expects_attention, model_eager_function

__all__ = ["attention_forward", "mask_forward", "guarded_call", "run_backend", "ENTRIES"]

#: attention calls through a selected backend in the forward running in this context (None: no forward)
_CALLS: ContextVar[list | None] = ContextVar("attnswitch_calls", default=None)


def run_backend(name: str, call: Call):
    """Run one attention call with backend ``name`` (the one place every switched call passes)."""
    runner = _RUNNERS.get(name)
    return (runner if runner is not None else backends.get(name)).run(call)  # get(): aliases, the clear error


_RUNNERS = backends.registry.REGISTRY  # read per call (registering updates it in place)
#: ``Call(...)`` without the Python frame of a named tuple's ``__new__``: every field, in order
_new_call = functools.partial(tuple.__new__, Call)
assert Call._fields[-1] == "where" and len(Call._fields) == 11, "_dispatch builds a Call of these 11 fields"


# -- masks in the form each implementation takes ------------------------------------------------------

def _causal(module, query, mask, is_causal) -> bool:
    # transformers' own reading (its sdpa function): causal only for more than one query and no mask
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    return bool(query.shape[2] > 1 and mask is None and causal)


def additive_mask(mask, query, key, causal: bool, dtype: torch.dtype):
    """The mask as eager attention takes it: additive, in ``dtype``; a causal one made when transformers
    left it to ``is_causal`` (None), as its eager mask function would have."""
    low = torch.finfo(dtype).min
    if mask is None:
        if not causal:
            return None
        hide = causal_mask(query.shape[2], key.shape[2], query.device)
        return torch.zeros(hide.shape, dtype=dtype, device=query.device).masked_fill_(hide, low)[None, None]
    if mask.dtype == torch.bool:
        return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, low)
    return mask.to(dtype)


def position_bias_mask(position_bias, mask, is_causal, query, key) -> torch.Tensor:
    """T5-style relative position bias folded into one additive mask (as transformers' sdpa does)."""
    low = torch.finfo(query.dtype).min
    bias = position_bias.to(query.dtype)
    if mask is None:
        if is_causal:
            bias = torch.where(causal_mask(query.shape[2], key.shape[2], query.device), low, bias)
        return bias.contiguous()
    if mask.dtype == torch.bool:
        return torch.where(mask, bias, low).contiguous()
    return (bias + mask.to(query.dtype)).contiguous()


# -- the attention entry ----------------------------------------------------------------------------

def _model_level(name, module, query, key, value, mask, kwargs):
    """The model's own eager attention (``eager``), or computed in float32 (``eager-fp32``)."""
    causal = _causal(module, query, mask, kwargs.get("is_causal"))
    fn = model_eager_function(module)
    if name == REFERENCE:
        out, weights = fn(module, query.float(), key.float(), value.float(),
                          additive_mask(mask, query, key, causal, torch.float32), **kwargs)
        return out.to(query.dtype), weights
    return fn(module, query, key, value, additive_mask(mask, query, key, causal, query.dtype), **kwargs)


def _auto(module, query, key, value, mask, kwargs):
    """SDPA's own choice, through transformers' own sdpa function; it has no softcap and ignores sinks."""
    sinks = kwargs.get("s_aux") if kwargs.get("s_aux") is not None else kwargs.get("sinks")
    reasons = auto_reasons(kwargs.get("softcap"), sinks)
    if reasons:
        raise BackendUnavailable("auto", module_path(module), reasons)
    return sdpa_attention_forward(module, query, key, value, mask, **kwargs)


def _unselected(module, query, key, value, mask, kwargs):
    """What the model would have run: the registry's original for its config's key."""
    config = getattr(module, "config", None)
    key_name = getattr(config, "_attn_implementation", None) if config is not None else None
    fn = registries.original("attention", key_name) if key_name not in (None, "eager") else \
        registries.original("attention", "eager")
    if fn is None:
        fn = model_eager_function(module)
    if config is not None and key_name != "sdpa" and selection.selected_for_config(config) is not None:
        # its config is shared with a model selected here, so transformers built SDPA's masks for it
        if key_name in (None, "eager"):
            mask = additive_mask(mask, query, key, _causal(module, query, mask, kwargs.get("is_causal")), query.dtype)
        else:
            raise RuntimeError(f"{site_name(module)} shares its config with a model switched here, and its "
                               f"attention implementation {key_name!r} builds its own masks; give each model its "
                               "own config (copy.deepcopy(config))")
    return fn(module, query, key, value, mask, **kwargs)


def _dispatch(module, query, key, value, mask, kw: dict):
    sel = selection.selected(module)
    if sel is None:
        return _unselected(module, query, key, value, mask, kw)
    calls = _CALLS.get()
    if calls is not None:
        calls[0] += 1
    name = sel if sel.__class__ is str else selection.choose(sel, query.shape[2])
    if name in _SPECIAL:
        return _special(name, module, query, key, value, mask, kw)
    # The same reading of transformers' arguments as its sdpa function: causal only without a mask and
    # for more than one query; k/v cropped for a prefill into an empty static cache. A sliding window is
    # already in the mask (or needs none: every key is inside the window). ``kw`` as transformers passed
    # it. This runs once per attention call, and each Python call on the way costs host time: hence one
    # function, and ``kw`` read as passed (each ``**`` costs too).
    get = kw.get
    q_len = query.shape[2]
    causal = _causal(module, query, mask, get("is_causal"))
    position_bias = get("position_bias")
    if causal and key.shape[2] > q_len:
        key, value = key[:, :, :q_len], value[:, :, :q_len]
        if position_bias is not None:
            position_bias = position_bias[..., :q_len]
    if position_bias is not None:
        mask = position_bias_mask(position_bias, mask, causal, query, key)
        causal = False
    elif mask is not None and mask.dtype != torch.bool and mask.dtype != query.dtype:
        mask = mask.to(query.dtype)
    weights = bool(get("output_attentions", False))
    if weights and name not in ("naive", "naive-inplace", "math"):
        warnings.warn(f"the {name} backend cannot return attention weights; attentions will be None", stacklevel=3)
    sinks = get("s_aux")
    out, weights = run_backend(name, _new_call((query, key, value, mask, get("dropout", 0.0), causal, get("scaling"),
                                                get("softcap"), sinks if sinks is not None else get("sinks"),
                                                weights, module)))
    return out.transpose(1, 2).contiguous(), weights


_SPECIAL = frozenset({"auto", *backends.MODEL_LEVEL})  # run through transformers' functions, with the module


def _special(name, module, query, key, value, mask, kwargs):
    if name == "auto":
        return _auto(module, query, key, value, mask, kwargs)
    return _model_level(name, module, query, key, value, mask, kwargs)


def attention_forward(module, query, key, value, attention_mask, **kwargs):
    """Entry for ``ALL_ATTENTION_FUNCTIONS``: the selected backend, else what the registry held."""
    m = _MEASURE()
    if m is not None:
        return instrument.call(m, module_path(module), key.shape[2], _dispatch, module, query, key, value,
                               attention_mask, kwargs)
    return _dispatch(module, query, key, value, attention_mask, kwargs)


_MEASURE = instrument.MEASURE.get


# -- the mask entry ---------------------------------------------------------------------------------

def mask_forward(*args, config=None, **kwargs):
    """Entry for ``ALL_MASK_ATTENTION_FUNCTIONS``: SDPA's mask (boolean, or None where ``is_causal``
    suffices) when a backend is selected for the config's models (each backend takes that form, eager's
    made additive at the call), else what the registry held for the config's key."""
    if config is not None and selection.selected_for_config(config) is not None:
        fn = registries.original("masks", "sdpa")
    else:
        key = getattr(config, "_attn_implementation", None) or "sdpa"
        fn = registries.original("masks", key)
    return fn(*args, config=config, **kwargs)


# -- the per-forward guard --------------------------------------------------------------------------

def _forward_selected(model) -> bool:
    st = selection.current()
    if st.global_sel is not None:
        return True
    info = selection.info_of(model)
    if info is None:
        return False
    return info.token in st.per_owner or info.token in selection.PATCHED


def guarded_call(self: nn.Module, *args, **kwargs):
    """``PreTrainedModel.__call__`` while any switch is active: counts the forward's attention calls."""
    call = registries.original_call() or nn.Module.__call__
    if _CALLS.get() is not None or not _forward_selected(self):
        return call(self, *args, **kwargs)  # a forward inside a counted one, or not switched
    selection.register(self)  # module paths for errors and reports, under a global switch too
    calls = [0]
    token = _CALLS.set(calls)
    try:
        out = call(self, *args, **kwargs)
    finally:
        _CALLS.reset(token)
    if calls[0] == 0 and expects_attention(self):
        raise UnsupportedModel(
            f"{type(self).__name__} ran a forward under an attnswitch backend without one attention call through "
            f"transformers' attention interface: it computed attention itself, so the switch changed nothing. "
            f"Its attention modules: {attention_modules(self)}")
    return out


#: the functions attnswitch writes, by registry
ENTRIES = {"attention": attention_forward, "masks": mask_forward, "call": guarded_call}
