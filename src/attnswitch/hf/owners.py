"""Which models own which modules: what attnswitch remembers of a model, read off the model and nowhere else.

Every module of a model attnswitch has switched (or seen run under a global switch) is remembered, weakly, as
owned by that model's owner token: a module two models hold (a submodel, a shared layer) has both. A model is
known by itself, never by its config: two models sharing one config are two owners, and a copy of a model
(``copy.deepcopy``, pickling) is a model attnswitch has never seen. Nothing is written on the model or its
configs. A module added to an owned one (torch's registration hook) marks its models to be read again.
"""

from __future__ import annotations

import itertools
import weakref
from dataclasses import dataclass, field

import torch.nn as nn
from torch.nn.modules.module import register_module_module_registration_hook

from ..sites import remember_paths
from . import critical
from .interface import configs_of, require_interface

__all__ = ["ModelInfo", "register", "rescan", "own_replica", "info_of", "known", "by_token", "owners",
           "models_with_config", "OWNERS"]


@dataclass(eq=False)
class ModelInfo:
    """What attnswitch remembers of a model: its owner token, its configs, the modules it owns (no reference to
    the model)."""

    token: int
    config_ids: frozenset[int]
    configs: tuple  # the configs themselves (owned by the model; they hold no reference back)
    #: ids of the live modules it owns, and of those it alone owns (both shed a module's id as it is freed;
    #: a module another model comes to own too leaves ``sole``, and stays out of it)
    owned: set[int] = field(default_factory=set, repr=False)
    sole: set[int] = field(default_factory=set, repr=False)
    #: a module was added to one it owns since its modules were last read (torch's registration hook)
    dirty: bool = False
    #: a switched forward of it was watched for attention outside the interface, and had none (``observe``)
    observed: bool = False
    #: its layers that transformers can checkpoint (weakly: ``gradient_checkpointing`` read per forward)
    layers: tuple = ()
    #: modules its forwards call that are not its own (weakly; forgotten when its modules are read again)
    strangers: weakref.WeakSet = field(default_factory=weakref.WeakSet, repr=False)

    def keys(self) -> frozenset[str]:
        """The attention implementations its configs name now."""
        return frozenset(k for c in self.configs if (k := c._attn_implementation_internal) is not None)

    def checkpointing(self) -> bool:
        """Whether a forward now may be recomputed in backward (a layer checkpoints, in training mode)."""
        for ref in self.layers:
            layer = ref()
            if layer is not None and layer.gradient_checkpointing and layer.training:
                return True
        return False


_TOKENS = itertools.count(1)
_MODELS: weakref.WeakKeyDictionary[nn.Module, ModelInfo] = weakref.WeakKeyDictionary()
_BY_TOKEN: weakref.WeakValueDictionary[int, ModelInfo] = weakref.WeakValueDictionary()
#: id(module) -> (a weak reference to it, its owner tokens); a plain dict, read once per attention call (a
#: WeakKeyDictionary's get makes a weak reference per read). The entry goes when the module does.
_OWNERS: dict[int, tuple[weakref.ref, tuple[int, ...]]] = {}
OWNERS = _OWNERS  # (read per call by the rules, as ``owners`` does)


def owners(module) -> tuple[int, ...]:
    """The owner tokens of ``module``'s models (none: no model attnswitch knows has it)."""
    entry = _OWNERS.get(id(module))
    return entry[1] if entry is not None and entry[0]() is module else ()


_owners = owners


#: modules freed while a compile held its lock, forgotten at the next registration: (id, its weak reference, owners)
_FREED: list[tuple[int, weakref.ref, tuple[int, ...]]] = []


def _forget(key: int, ref: weakref.ref) -> None:
    # a weak reference's callback runs as the module is freed, before its id can be reused; during a compile (in
    # this thread: garbage collection inside Dynamo's trace, which iterates these dicts; or elsewhere) it changes
    # nothing, and the next registration forgets the module (a stale entry's reference is dead: never matched)
    entry = _OWNERS.get(key)
    if entry is None or entry[0] is not ref:
        return
    if critical.compiling():
        _FREED.append((key, ref, entry[1]))
        return
    _drop(key, ref, entry[1])


def _drop(key: int, ref: weakref.ref, tokens: tuple[int, ...]) -> None:
    entry = _OWNERS.get(key)
    if entry is not None and entry[0] is ref:
        del _OWNERS[key]
        entry = None
    for t in tokens:
        info = _BY_TOKEN.get(t)
        if info is not None and (entry is None or t not in entry[1]):  # (not where the id is its module's again)
            info.owned.discard(key)
            info.sole.discard(key)


def _drop_freed() -> None:
    while _FREED:
        _drop(*_FREED.pop())


def _own(module: nn.Module, owners: tuple[int, ...]) -> None:
    """Record ``owners`` (those still alive: a registration that was interrupted leaves a dead token) as
    the module's, and whether one model alone owns it."""
    if _FREED:
        _drop_freed()
    key = id(module)
    infos = [info for t in owners if (info := _BY_TOKEN.get(t)) is not None]
    _OWNERS[key] = (weakref.ref(module, lambda ref, key=key: _forget(key, ref)), tuple(i.token for i in infos))
    for info in infos:
        info.owned.add(key)
        if len(infos) == 1:
            info.sole.add(key)
        else:
            info.sole.discard(key)


def _module(model) -> nn.Module:
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module (a transformers model), not {type(model).__name__}")
    return model


def info_of(model: nn.Module) -> ModelInfo | None:
    return _MODELS.get(_module(model))


def known(model: nn.Module) -> ModelInfo | None:
    """``info_of`` for a module known to be one (per forward)."""
    return _MODELS.get(model)


def by_token(token: int) -> ModelInfo | None:
    return _BY_TOKEN.get(token)


def register(model: nn.Module) -> ModelInfo:
    """Remember ``model`` (its modules' owner and paths, its configs) once it is known to use the
    attention interface (``UnsupportedModel`` otherwise); read again where its modules changed since.
    Interrupted, it leaves nothing a later call does not complete: the model is recorded last."""
    info = _MODELS.get(_module(model))
    if info is not None:
        if info.dirty and not vars(model).get("_is_replica", False):
            rescan(model, info)
        return info
    require_interface(model)
    return critical.one_registration_at_a_time(lambda: _register(model))


def _register(model: nn.Module) -> ModelInfo:
    info = _MODELS.get(model)
    if info is not None:
        return info
    info = ModelInfo(next(_TOKENS), frozenset(), ())
    _BY_TOKEN[info.token] = info  # (weakly: dropped with info if interrupted before the end)
    _read_modules(model, info)
    return _MODELS.setdefault(model, info)


def _read_modules(model: nn.Module, info: ModelInfo) -> None:
    """Own every module ``model`` has now as ``info``'s, let go of those it no longer has (not of a replica,
    which is its original's), and read its configs, paths and checkpointing layers again. Interrupted, it
    leaves the model to be read again."""
    info.dirty = False  # (first: a module added meanwhile marks it again)
    try:
        _read(model, info)
    except BaseException:
        info.dirty = True
        raise


def _read(model: nn.Module, info: ModelInfo) -> None:
    info.strangers.clear()
    present = set()
    layers = []
    for m in model.modules():
        present.add(id(m))
        owners = _owners(m)
        if info.token not in owners:
            _own(m, owners + (info.token,))
        if getattr(type(m), "gradient_checkpointing", None) is not None or "gradient_checkpointing" in vars(m):
            layers.append(weakref.ref(m))
    for key in [k for k in list(info.owned) if k not in present]:  # (a copy first: modules are freed meanwhile)
        entry = _OWNERS.get(key)
        module = entry[0]() if entry is not None else None
        if module is not None and not vars(module).get("_is_replica", False):
            _own(module, tuple(t for t in entry[1] if t != info.token))
            info.owned.discard(key)
            info.sole.discard(key)
    configs = tuple(configs_of(model))
    info.configs, info.config_ids, info.layers = configs, frozenset(id(c) for c in configs), tuple(layers)
    remember_paths(model)


def rescan(model: nn.Module, info: ModelInfo | None = None) -> None:
    """Read ``model``'s modules again (a module added, replaced or removed since), and watch its next switched
    forward again (``observe``)."""
    info = info or _MODELS.get(model)
    if info is not None and not vars(model).get("_is_replica", False):
        critical.one_registration_at_a_time(lambda: _read_modules(model, info))
        info.observed = False


def _registered(parent, name, submodule):
    """torch's global module registration hook (``setattr``, ``add_module``, ``ModuleList.append``): a module
    added to one a model owns makes that model's modules read again at its next switch or forward."""
    entry = _OWNERS.get(id(parent))
    if entry is not None and entry[0]() is parent and not vars(parent).get("_is_replica", False):
        for t in entry[1]:
            info = _BY_TOKEN.get(t)
            if info is not None:
                info.dirty = True


# torch's registration hook, installed once with this module (a graph torch.compile made before it was installed
# guards on there being none, and compiles once more after): it only marks switched models whose modules change
_HOOK = register_module_module_registration_hook(_registered)


def own_replica(original: nn.Module, replica: nn.Module) -> None:
    """``replica`` (``Module._replicate_for_data_parallel``: DataParallel's copy of ``original`` for another
    device) is owned as ``original`` is, and is its model where ``original`` is one, for as long as it lives."""
    owners = _owners(original)
    if owners:
        _own(replica, owners)
        info = _MODELS.get(original)
        if info is not None:
            _MODELS[replica] = info


def models_with_config(config) -> tuple[int, ...]:
    """The owner tokens of the models built on ``config`` (one of their configs is it)."""
    cid = id(config)
    return tuple(t for t, info in list(_BY_TOKEN.items()) if cid in info.config_ids)
