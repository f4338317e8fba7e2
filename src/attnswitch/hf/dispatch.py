"""The functions attnswitch writes into transformers' registries, and the per-forward guard.

A forward of a selected model reads its selection once, at its start (``Forward``); each attention
call of a module that model alone owns takes it from there, while the calling context's selection is
the one the forward started in. Every other call asks the calling context which backend is selected
for the calling module (``selection``); with none selected (another thread, another model, outside
any context) it runs exactly what the registry held before, so an override is invisible to code that
did not ask for it. Every forward of a selected model counts the attention calls that went through the
selected backend: a forward that made none, while the model has attention layers, raises
``UnsupportedModel`` (it computed attention some other way, and a switch must never silently change
nothing).
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
from ..backends.sdpa import COMMON_OPS, auto_reasons
from ..errors import BackendUnavailable, UnsupportedModel
from ..sites import module_path, site_name
from . import registries, selection
from .interface import attention_modules, expects_attention, model_eager_function

__all__ = ["attention_forward", "mask_forward", "guarded_call", "new_forward", "run_backend", "Forward",
           "ENTRIES", "traced_call", "TRACED"]


class Forward:
    """A forward of a selected model: the state it started in (None once it has returned: a context
    copied during it may outlive it), the ids of the modules whose calls take the model's selection (a
    live set, ``selection.for_forward``), the selection, the backend's common op (None: every call takes
    the general path), and the attention calls that went through the selection so far."""

    __slots__ = ("state", "modules", "sel", "op", "calls")

    def __init__(self, state, modules: set, sel, op):
        self.state, self.modules, self.sel, self.op, self.calls = state, modules, sel, op, 0


#: the forward of a selected model running in this context (None: none)
_FORWARD: ContextVar[Forward | None] = ContextVar("attnswitch_forward", default=None)


def run_backend(name: str, call: Call):
    """Run one attention call with backend ``name`` (every switched call but the common one passes here)."""
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


#: transformers' arguments that make a call other than the common one (where present and not None)
_RARE = frozenset({"position_bias", "softcap", "s_aux", "sinks", "output_attentions"})


def _rare(kw: dict) -> bool:
    get = kw.get
    return (get("position_bias") is not None or get("softcap") is not None or get("s_aux") is not None or
            get("sinks") is not None or bool(get("output_attentions")))


def _dispatch(sel, fwd: Forward | None, module, query, key, value, mask, kw: dict):
    """One call with selection ``sel``, counted in ``fwd`` (the forward running in this context)."""
    if sel is None:
        return _unselected(module, query, key, value, mask, kw)
    if fwd is not None and fwd.state is not None:
        fwd.calls += 1
    name = sel if sel.__class__ is str else selection.choose(sel, query.shape[2])
    if name in _SPECIAL:
        return _special(name, module, query, key, value, mask, kw)
    # The same reading of transformers' arguments as its sdpa function: causal only without a mask and
    # for more than one query; k/v cropped for a prefill into an empty static cache. A sliding window is
    # already in the mask (or needs none: every key is inside the window). ``kw`` as transformers passed
    # it (each ``**`` costs host time, and this runs per attention call).
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
    """Entry for ``ALL_ATTENTION_FUNCTIONS``: the selected backend, else what the registry held.

    The common call of a forward's own module (no mask, position bias, softcap, sinks or weights wanted;
    k/v heads that divide q's; a head dim that is a multiple of 8) goes straight to the backend's op
    (``COMMON_OPS``), read as ``_dispatch`` reads transformers' arguments; everything else, and any call
    the op's check refuses, goes to ``_dispatch``. This runs per layer per step, and each line costs host
    time: tensor shapes are read once, and nothing is called that the call does not need."""
    fwd = _FORWARD_GET()
    if _MEASURE() is not None:
        return _measured(module, query, key, value, attention_mask, kwargs)
    if fwd is None or id(module) not in fwd.modules or _STATE_GET() is not fwd.state:
        return _dispatch(selection.selected(module), fwd, module, query, key, value, attention_mask, kwargs)
    op = fwd.op
    if op is not None and attention_mask is None and (_RARE.isdisjoint(kwargs) or not _rare(kwargs)):
        qs, ks = query.shape, key.shape
        if not (qs[1] % ks[1] or qs[-1] % 8):
            get = kwargs.get
            q_len = qs[2]
            causal = get("is_causal")
            if causal is None:
                causal = getattr(module, "is_causal", True)
            causal = q_len > 1 and bool(causal)
            if causal and ks[2] > q_len:
                key, value = key[:, :, :q_len], value[:, :, :q_len]
            out = op(query, key, value, get("dropout", 0.0), causal, get("scaling"), ks[1] != qs[1])
            if out is not None:
                fwd.calls += 1
                return out.transpose(1, 2).contiguous(), None
    return _dispatch(fwd.sel, fwd, module, query, key, value, attention_mask, kwargs)


def _measured(module, query, key, value, mask, kwargs):
    """The call as ``attention_forward`` makes it, measured (a profiler range, host time) by the calling
    context's measurement."""
    token = instrument.MEASURE.set(None)
    try:
        return instrument.call(token.old_value, module_path(module), key.shape[2],
                               lambda: attention_forward(module, query, key, value, mask, **kwargs))
    finally:
        instrument.MEASURE.reset(token)


_FORWARD_GET = _FORWARD.get
_STATE_GET = selection.STATE.get
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

def new_forward(model: nn.Module) -> Forward | None:
    """What a forward of ``model`` starting now in the calling context runs with; None: not selected."""
    found = selection.for_forward(model)
    if found is None:
        return None
    state, sel, modules = found
    return Forward(state, modules, sel, COMMON_OPS.get(sel) if sel.__class__ is str else None)


def traced_call(model: nn.Module, args, kwargs):
    """A forward inside ``torch.compile``'s trace (``hf.compiled`` has its twin, the one traced)."""
    return (registries.original_call() or nn.Module.__call__)(model, *args, **kwargs)


_COMPILING = torch.compiler.is_compiling
#: owner tokens of models whose attention calls torch.compile traced through attnswitch (``hf.compiled``
#: adds them while tracing): their forwards may run compiled code, whose calls no eager counter sees
TRACED: set[int] = set()


def _traced(model: nn.Module) -> bool:
    info = selection.info_of(model)
    return info is not None and info.token in TRACED


def guarded_call(self: nn.Module, *args, **kwargs):
    """``PreTrainedModel.__call__`` while any switch is active: reads the model's selection for the
    forward and counts the forward's attention calls (traced: the compiled code's guards read it)."""
    if _COMPILING():
        return traced_call(self, args, kwargs)
    call = registries.original_call() or nn.Module.__call__
    outer = _FORWARD.get()
    fwd = None if outer is not None and outer.state is not None else new_forward(self)
    if fwd is None:
        return call(self, *args, **kwargs)  # a forward inside a counted one, or not switched
    token = _FORWARD.set(fwd)
    try:
        out = call(self, *args, **kwargs)
    finally:
        fwd.state = None  # finished, also for a context copied during it
        _FORWARD.reset(token)
    if fwd.calls == 0 and expects_attention(self) and not _traced(self):
        raise UnsupportedModel(
            f"{type(self).__name__} ran a forward under an attnswitch backend without one attention call through "
            f"transformers' attention interface: it computed attention itself, so the switch changed nothing. "
            f"Its attention modules: {attention_modules(self)}")
    return out


#: the functions attnswitch writes, by registry
ENTRIES = {"attention": attention_forward, "masks": mask_forward, "call": guarded_call}
