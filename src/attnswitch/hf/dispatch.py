"""The functions attnswitch writes into transformers' registries and its attention lookup, and the
per-forward guard.

Every forward of a model, while any switch is active, reads its selection once, at its start (``Forward``),
and says whose calls run inside it (``selection``: the models its model is part of). Each attention call of a
module those models own takes the forward's selection from there, while the calling context's selection is
the one the forward started in; every other call asks the rules, with the forward's models. With none
selected (another thread, a model no switch names, outside any context) a call runs exactly what the model
would have run: the registry's original for its key, or its own eager function, which transformers' lookup
(``get_interface``) passes along. Inside a backward, a call no forward is running for is a recompute, and
runs its forward's backend (``recompute``). Every forward of a selected model counts the attention calls
that went through the selected backend: a forward that made none, while the model has attention layers,
raises ``UnsupportedModel``, and the model's first switched forward is watched for attention outside the
interface (``observe``): a switch must never silently change nothing.
"""

from __future__ import annotations

import functools
import sys
import warnings
from contextvars import ContextVar

import torch
import torch.nn as nn
from transformers import PreTrainedModel
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from .. import backends, catalog, instrument
from ..backends import MODEL_LEVEL, REFERENCE, Call
from ..backends.call import autocast_inputs
from ..backends.call import autocasting as _AUTOCASTING
from ..backends.naive import causal_mask
from ..backends.sdpa import COMMON_OPS, auto_reasons
from ..errors import BackendUnavailable, UnsupportedModel
from ..sites import module_path, site_name
from . import observe, owners, recompute, record, registries, selection
from .interface import attention_modules, expects_attention, model_eager_function

__all__ = ["attention_forward", "mask_forward", "get_interface", "guarded_call", "new_forward", "run_backend",
           "Forward", "FORWARD", "traced_call", "TRACED"]


class Forward:
    """A forward running while a switch is active: the state it started in (None once it has returned: a
    context copied during it may outlive it), the models its calls belong to (``selection.call_models``), the
    ids of the modules whose calls take its selection straight (a live set, ``selection.for_forward``), the
    selection (None: its model is not selected), the backend's common op (None: every call takes the general
    path), the attention calls that went through the selection so far, and the model where attnswitch knows
    it (None once returned) with what it knows of it."""

    __slots__ = ("state", "models", "modules", "sel", "op", "auto", "calls", "wrap", "model", "info", "watch")

    def __init__(self, state, sel, models: tuple, modules, op=None, model=None, info=None):
        self.state, self.sel, self.models, self.modules, self.op, self.calls = state, sel, models, modules, op, 0
        #: ``auto`` for the whole model: its calls go straight to transformers' sdpa function (``attention_forward``)
        self.auto = sel.__class__ is str and sel == "auto"
        #: whether the lookup hands out more than the entry: the module's own eager function (where a call may run
        #: ``eager`` or ``eager-fp32``), or the entry with the watch off (``observe``)
        self.wrap = sel is not None and ((sel in MODEL_LEVEL) if sel.__class__ is str
                                         else not MODEL_LEVEL.isdisjoint(selection.backends_of(sel)))
        self.model, self.info, self.watch = model, info, None


#: the forward of a selected model running in this context (None: none)
_FORWARD: ContextVar[Forward | None] = ContextVar("attnswitch_forward", default=None)
FORWARD = _FORWARD


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

def _model_level(name, module, query, key, value, mask, kwargs, own=None):
    """The model's own eager attention (``eager``) with the mask transformers made for it, or computed in
    float32 (``eager-fp32``); ``own``: the module's own eager function, where its lookup gave it."""
    return eager_with(own or model_eager_function(module), name, module, query, key, value, mask, kwargs)


def eager_with(fn, name, module, query, key, value, mask, kwargs):
    """``_model_level`` with the model's own eager function ``fn``."""
    if mask is None or mask.dtype == torch.bool:
        # a mask made for another backend (a config shared with one), or left to is_causal: made additive
        mask = additive_mask(mask, query, key, _causal(module, query, mask, kwargs.get("is_causal")), query.dtype)
    if name == REFERENCE:
        out, weights = fn(module, query.float(), key.float(), value.float(),
                          None if mask is None else mask.float(), **kwargs)
        return out.to(query.dtype), weights
    return fn(module, query, key, value, mask, **kwargs)


def _auto(module, query, key, value, mask, kwargs):
    """SDPA's own choice, through transformers' own sdpa function; it has no softcap and ignores sinks."""
    sinks = kwargs.get("s_aux") if kwargs.get("s_aux") is not None else kwargs.get("sinks")
    reasons = auto_reasons(kwargs.get("softcap"), sinks)
    if reasons:
        raise BackendUnavailable("auto", module_path(module), reasons)
    return sdpa_attention_forward(module, query, key, value, mask, **kwargs)


def _unselected(module, query, key, value, mask, kwargs, own=None):
    """What the model would have run: the registry's original for its config's key, or (``eager``, which
    has no entry) the module's own function (``own``, where its lookup gave it)."""
    config = getattr(module, "config", None)
    key_name = getattr(config, "_attn_implementation", None) if config is not None else None
    fn = registries.original("attention", key_name) if key_name is not None else None
    if fn is None:
        fn = own or model_eager_function(module)
    if config is not None and key_name != "sdpa" and _masks_selection(config) is not None:
        # transformers built its masks for a selected backend (its forward's, or a model's sharing its config)
        if key_name in (None, "eager"):
            if mask is None or mask.dtype == torch.bool:
                mask = additive_mask(mask, query, key, _causal(module, query, mask, kwargs.get("is_causal")),
                                     query.dtype)
        elif not registries.builds_masks(key_name):
            mask = None  # what transformers gives an implementation it makes no masks for: none (it masks itself)
        else:
            raise RuntimeError(_other_masks(module, key_name))
    return fn(module, query, key, value, mask, **kwargs)


def _other_masks(module, key_name: str) -> str:
    """Why a layer left to its model's own attention cannot run it: the masks this forward made are SDPA's."""
    fwd = _FORWARD_GET()
    if fwd is not None and fwd.state is not None:  # its own model is selected: a layer kind left out
        return (f"{site_name(module)} is left to its model's own attention {key_name!r} by a selection per layer "
                "kind, and this forward's masks are made for SDPA, while that implementation takes masks of its "
                "own; select a backend for every layer kind, or load the model with attn_implementation='sdpa'")
    return (f"{site_name(module)} shares its config with a model switched here, and its attention implementation "
            f"{key_name!r} builds its own masks; give each model its own config (copy.deepcopy(config))")


def _masks_selection(config):
    """The selection transformers' masks were made for in the calling context: the running forward's (its own
    masks where its model is not selected), else that of the models sharing ``config``."""
    fwd = _FORWARD_GET()
    if fwd is not None and fwd.state is not None:
        return fwd.sel
    return selection.selected_for_config(config)


#: transformers' arguments that make a call other than the common one (where present and not None)
_RARE = frozenset({"position_bias", "softcap", "s_aux", "sinks", "output_attentions"})


def _rare(kw: dict) -> bool:
    get = kw.get
    return (get("position_bias") is not None or get("softcap") is not None or get("s_aux") is not None or
            get("sinks") is not None or bool(get("output_attentions")))


def _dispatch(sel, fwd: Forward | None, module, query, key, value, mask, kw: dict, own=None):
    """One call with selection ``sel``, counted in ``fwd`` (the forward running in this context); ``own``: the
    module's own eager function, where its lookup gave it."""
    if fwd is None:
        sel = _recomputed(module, sel)
    elif sel is None and fwd.model is not None:
        sel = _adopted(fwd, module)
    if sel is None:
        return _unselected(module, query, key, value, mask, kw, own)
    if fwd is not None and fwd.state is not None:
        fwd.calls += 1
    name = sel if sel.__class__ is str else selection.choose(sel, query.shape[2], module)
    if name is None:  # a layer kind the selection leaves out: the model's own attention
        return _unselected(module, query, key, value, mask, kw, own)
    if name in _SPECIAL:
        if name == "auto":
            return _auto(module, query, key, value, mask, kw)
        return _model_level(name, module, query, key, value, mask, kw, own)
    # The same reading of transformers' arguments as its sdpa function: causal only without a mask and
    # for more than one query; k/v cropped for a prefill into an empty static cache. A sliding window is
    # already in the mask (or needs none: every key is inside the window). ``kw`` as transformers passed
    # it (each ``**`` costs host time, and this runs per attention call).
    get = kw.get
    if _AUTOCASTING():  # as SDPA's entry casts them (every call takes this path then: ``new_forward``)
        query, key, value, mask = autocast_inputs(query, key, value, mask)
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
    elif mask is not None and mask.dtype == torch.float32 and query.dtype != torch.float32:
        mask = mask.to(query.dtype)  # SDPA takes float masks; every other dtype goes on to its error
    weights = bool(get("output_attentions", False))
    if weights and name not in catalog.WEIGHTS:
        warnings.warn(f"the {name} backend cannot return attention weights; attentions will be None", stacklevel=3)
    sinks = get("s_aux")
    out, weights = run_backend(name, _new_call((query, key, value, mask, get("dropout", 0.0), causal, get("scaling"),
                                                get("softcap"), sinks if sinks is not None else get("sinks"),
                                                weights, module)))
    return out.transpose(1, 2).contiguous(), weights


def _adopted(fwd: Forward, module):
    """A module the switched forward's model does not own, calling the interface: one added in a way torch's
    registration hook does not see (``ModuleList.insert``, ``_modules`` written). Its model's modules are read
    again (once per forward), and the module takes its selection where it is one of them."""
    info = fwd.info
    if module in info.strangers:
        return None
    model, fwd.model = fwd.model, None
    owners.rescan(model, info)
    sel = selection.selected(module, fwd.models)
    if sel is None:  # not one of its modules (a module its forward calls, say): not read again for it
        info.strangers.add(module)
    return sel


def _recomputed(module, sel):
    """Inside a backward, a call no forward is running for is a recompute: its forward's backend."""
    return sel if not recompute.LIVE or _GRAPH_TASK() == -1 else recompute.chosen(module, sel)


_GRAPH_TASK = torch._C._current_graph_task_id  # -1 outside a backward
_SPECIAL = frozenset({"auto", *backends.MODEL_LEVEL})  # run through transformers' functions, with the module


def attention_forward(module, query, key, value, attention_mask, *, _own=None, **kwargs):
    """Entry for ``ALL_ATTENTION_FUNCTIONS``: the selected backend, else what the registry held.

    The common call of a forward's own module (no mask, position bias, softcap, sinks or weights wanted;
    k/v heads that divide q's; a head dim that is a multiple of 8) goes straight to the backend's op
    (``COMMON_OPS``), read as ``_dispatch`` reads transformers' arguments; ``auto``'s calls without position
    bias, softcap, sinks or weights go straight to transformers' sdpa function; everything else, and any call
    the op's check refuses, goes to ``_dispatch``. This runs per layer per step, and each line costs host
    time: tensor shapes are read once, and nothing is called that the call does not need. ``_own``: the
    module's own eager function, which the lookup (``get_interface``) binds where a call may run it."""
    fwd = _FORWARD_GET()
    if _MEASURE() is not None:
        return _measured(module, query, key, value, attention_mask, kwargs, _own)
    if fwd is None or id(module) not in fwd.modules or _STATE_GET() is not fwd.state:
        return _dispatch(_selected(module, fwd), fwd, module, query, key, value, attention_mask, kwargs, _own)
    op = fwd.op
    if op is None:
        if fwd.auto and (_RARE.isdisjoint(kwargs) or not _rare(kwargs)):
            # what ``_dispatch`` makes of ``auto``'s common call (transformers' sdpa function), without its reading
            # of the arguments: ``auto``'s time is compared with the others' and with a model run unswitched
            fwd.calls += 1
            return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    elif attention_mask is None and (_RARE.isdisjoint(kwargs) or not _rare(kwargs)):
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
    return _dispatch(fwd.sel, fwd, module, query, key, value, attention_mask, kwargs, _own)


def _measured(module, query, key, value, mask, kwargs, own):
    """The call as ``attention_forward`` makes it, measured (a profiler range, host time) by the calling
    context's measurement."""
    token = instrument.MEASURE.set(None)
    m, where = token.old_value, module_path(module)
    try:
        out = instrument.call(m, where, key.shape[2], lambda: attention_forward(module, query, key, value, mask,
                                                                                _own=own, **kwargs))
    finally:
        instrument.MEASURE.reset(token)
    if m.observers:  # (untimed passes only)
        causal = kwargs.get("is_causal")
        causal = getattr(module, "is_causal", True) if causal is None else causal  # as transformers meant it
        instrument.observe(m, where, query, key, value, mask, bool(causal), kwargs.get("sliding_window"), out[0])
    return out


def _selected(module, fwd: Forward | None):
    """The selection for a call of ``module`` in the calling context, ``fwd`` the forward running there."""
    if fwd is None:
        sel = selection.selected(module, None)
        return None if sel is not None and _by_patch(_STATE_GET(), owners.owners(module)) and \
            _inside_unguarded_forward() else sel
    if fwd.state is None:
        return selection.selected(module, None)
    if fwd.sel is None and _STATE_GET() is fwd.state:
        return None  # (the rules over the state it began in gave none; a patch made elsewhere since waits for the next)
    return selection.selected(module, fwd.models)


_MODULE_CALL = nn.Module._call_impl.__code__


def _by_patch(st, tokens) -> bool:
    """Whether the selection of models ``tokens`` in state ``st`` comes from a patch (no context of the calling
    thread or task selects one of them: a context entered inside a forward applies there, a patch made elsewhere
    does not)."""
    return st.global_sel is None and not any(t in st.per_owner for t in tokens)


def _inside_unguarded_forward() -> bool:
    """Whether the calling code runs inside a forward of a transformers model that started before any switch was
    held (its call took ``nn.Module._call_impl`` straight, not through the guard or its traced twin): it runs, to
    its end, what its model ran then, whatever a patch made in another thread meanwhile selects. The nearest model
    call above decides. (Walked only for a patch's selection where no forward is known: a module run alone, a
    compiled forward's eager parts, or this.)"""
    f = sys._getframe(1)
    while f is not None:
        if f.f_code is _MODULE_CALL:
            caller = f.f_back
            if caller is not None and caller.f_code in _GUARDS:
                return False
            if isinstance(f.f_locals.get("self"), PreTrainedModel):
                return True
        f = f.f_back
    return False


_FORWARD_GET = _FORWARD.get
_STATE_GET = record.STATE.get
_MEASURE = instrument.MEASURE.get


# -- the attention lookup ---------------------------------------------------------------------------

def get_interface(self, attn_implementation, default):
    """``AttentionInterface.get_interface`` while any switch is active: transformers' answer (read in one
    step where it is attnswitch's entry). The module's own eager function, which transformers passes as
    ``default`` and gives for ``eager``, goes with the call where it may run: a model named by no switch
    runs exactly that function, and the ``eager`` backend runs it."""
    if _COMPILING():  # (a method of an object: Dynamo traces it in place of its twin, as guarded_call)
        return traced_interface(self, attn_implementation, default)
    fn = self._local_mapping.get(attn_implementation)
    if fn is None:
        fn = self._global_mapping.get(attn_implementation)
    if fn is attention_forward:
        fwd = _FORWARD_GET()
        if fwd is not None and not fwd.wrap:
            return fn
    elif fn is None and (attn_implementation == "eager" or attn_implementation is None):
        if attn_implementation is None:
            registries.original_attr(registries.GET_INTERFACE)(self, None, default)  # transformers' warning
        fwd = _FORWARD_GET()
    else:
        return registries.original_attr(registries.GET_INTERFACE)(self, attn_implementation, default)
    entry = _own_entry(default)
    if fwd is None or fwd.watch is None:
        return entry
    return functools.partial(_unwatched, fwd.watch, entry)


def traced_interface(self, attn_implementation, default):
    """The lookup inside ``torch.compile``'s trace (``hf.compiled`` has its twin, the one traced)."""
    return registries.original_attr(registries.GET_INTERFACE)(self, attn_implementation, default)


def _unwatched(watch, entry, *args, **kwargs):
    with observe.paused(watch):
        return entry(*args, **kwargs)


_OWN_ENTRIES: dict = {}  # a module's own eager function -> attnswitch's entry bound to it


def _own_entry(own):
    """``attention_forward`` with the module's own eager function bound (a C partial: no frame of its own)."""
    entry = _OWN_ENTRIES.get(own)
    if entry is None:
        entry = _OWN_ENTRIES[own] = functools.partial(attention_forward, _own=own)
    return entry


# -- the mask entry ---------------------------------------------------------------------------------

def mask_forward(*args, config=None, **kwargs):
    """Entry for ``ALL_MASK_ATTENTION_FUNCTIONS``: when a backend is selected for the config's models, the
    mask transformers makes for eager where that backend is ``eager`` (or ``eager-fp32``), else SDPA's
    (boolean, or None where ``is_causal`` suffices: each backend takes that form); otherwise what the
    registry held for the config's key."""
    fwd = _FORWARD_GET()
    if fwd is not None and fwd.state is not None:
        sel = fwd.sel  # the masks of the model whose forward runs (its own where it is not selected)
    else:
        sel = selection.selected_for_config(config) if config is not None else None
    if sel is None:
        fn = registries.original("masks", getattr(config, "_attn_implementation", None) or "sdpa")
    else:
        name = selection.choose(sel, kwargs.get("q_length", 2))
        fn = (name in MODEL_LEVEL and registries.original("masks", "eager")) or registries.original("masks", "sdpa")
    return fn(*args, config=config, **kwargs)


# -- the per-forward guard --------------------------------------------------------------------------

def new_forward(model: nn.Module) -> Forward:
    """What a forward of ``model`` starting now in the calling context runs with."""
    state, sel, models, modules, info = selection.for_forward(model)
    if sel is None:
        return Forward(state, None, models, modules)
    common = sel.__class__ is str and not _AUTOCASTING()  # (autocast: the general path casts)
    return Forward(state, sel, models, modules, COMMON_OPS.get(sel) if common else None,
                   model if info is not None else None, info)


def traced_call(model: nn.Module, args, kwargs):
    """A forward inside ``torch.compile``'s trace (``hf.compiled`` has its twin, the one traced)."""
    return (registries.original_call() or nn.Module._call_impl)(model, *args, **kwargs)


_COMPILING = torch.compiler.is_compiling
#: owner tokens of models whose attention calls torch.compile traced through attnswitch (``hf.compiled``
#: adds them while tracing): their forwards may run compiled code, whose calls no eager counter sees
TRACED: set[int] = set()


def _traced(model: nn.Module) -> bool:
    info = owners.info_of(model)
    return info is not None and info.token in TRACED


def guarded_call(self: nn.Module, *args, **kwargs):
    """``PreTrainedModel._call_impl`` (what a model's call runs) while any switch is active: reads the model's
    selection for the forward and says whose calls run in it, counts the forward's attention calls, watches the
    model's first one for attention outside the interface, and leaves a record for its recompute in backward
    (traced: the compiled code's guards read the selection, ``hf.compiled``)."""
    if _COMPILING():
        return traced_call(self, args, kwargs)
    call = registries.original_call() or nn.Module._call_impl
    if _DROPPED or _PENDING[0]:  # a holder dropped, or a restore put off, while a compile held the lock: now
        record.tidy()
    outer = _FORWARD_GET()
    if outer is not None and outer.state is None:
        outer = None  # (one that has returned, in a context copied during it)
    if outer is not None and outer.models == owners.owners(self):
        return call(self, *args, **kwargs)  # a forward inside one of the same models: its calls are that one's
    fwd = new_forward(self)
    if outer is None and fwd.sel is not None and _by_patch(fwd.state, fwd.models) and _inside_unguarded_forward():
        return call(self, *args, **kwargs)  # a part of a forward begun unswitched: its calls run unswitched too
    info = fwd.info if fwd.sel is not None else None
    keys = None
    if info is not None:
        keys = info.keys()
        if record.lacking(info.token, keys):  # its attention implementation changed since the switch was made
            record.widen(info.token, keys)
    watch = None
    if outer is not None:
        fwd.watch = outer.watch  # (the outer forward's watch sees this one's calls)
        fwd.wrap = fwd.wrap or fwd.watch is not None
    elif info is not None and not info.observed:
        watch = fwd.watch = observe.Watch(self, info.owned, _INSIDE)  # (not compiling: see above)
        fwd.wrap = True
    token = _FORWARD.set(fwd)
    try:
        if fwd.sel is not None:  # the registries stay for it to its end (its selection may be let go elsewhere)
            record.running(fwd, keys if keys is not None else _keys_of(fwd.models))
        if watch is None:
            out = call(self, *args, **kwargs)
        else:
            with watch:
                out = call(self, *args, **kwargs)
    finally:
        fwd.state = fwd.model = None  # finished, also for a context copied during it (and for the record)
        _FORWARD.reset(token)
        if fwd.sel is not None:
            record.returned(fwd)  # (cut short by an interrupt, the next change drops it: its state is None)
    if outer is not None:
        outer.calls += fwd.calls
    if info is None:  # not selected, or a part of a selected model run alone
        if outer is None and recompute.LIVE and _GRAD_ON():
            return _unswitched_recordable(self, out)
        return out
    _check(self, fwd, watch)
    if outer is None and info.layers and _GRAD_ON() and info.checkpointing():
        recompute.note(info, type(self).__name__, fwd.sel, out)
    return out


def _keys_of(tokens) -> frozenset[str]:
    """The attention keys the models of ``tokens`` name (a part of a selected model run alone)."""
    infos = [owners.by_token(t) for t in tokens]
    return frozenset().union(*(i.keys() for i in infos if i is not None))


def _unswitched_recordable(model: nn.Module, out):
    """An unswitched forward of a model whose switched forwards' graphs may still be recomputed: its own graph
    records that it ran unswitched, so that its recompute is never taken for theirs."""
    info = owners.info_of(model)
    if info is not None and info.layers and recompute.live(info.token) and info.checkpointing():
        recompute.note(info, type(model).__name__, None, out)
    return out


def _check(model: nn.Module, fwd: Forward, watch) -> None:
    """Refuse a forward that computed attention where the switch does not reach: seen outside the interface
    (a watched forward), or no call through it at all."""
    if watch is not None:
        if watch.found:
            raise UnsupportedModel(observe.refusal(model, watch.found))
        fwd.info.observed = True
    if fwd.calls == 0 and expects_attention(model) and not _traced(model):
        raise UnsupportedModel(
            f"{type(model).__name__} ran a forward under an attnswitch backend without one attention call through "
            f"transformers' attention interface: it computed attention itself, so the switch changed nothing. "
            f"Its attention modules: {attention_modules(model)}")


_GRAD_ON = torch.is_grad_enabled
_DROPPED, _PENDING = record.DROPPED, record.PENDING
#: the calls that run a model's forward through the guard (eager, and as traced): a model call they make is guarded
_GUARDS = {guarded_call.__code__, traced_call.__code__}
#: attnswitch's entries: attention computed under them is the switch's own
_INSIDE = frozenset({attention_forward.__code__, backends.run.__code__})


registries.FNS.update({"attention": attention_forward, "masks": mask_forward, registries.CALL: guarded_call,
                       registries.GET_INTERFACE: get_interface})
