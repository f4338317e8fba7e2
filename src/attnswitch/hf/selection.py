"""Which backend each attention call runs: the rules, read by the eager entries (``dispatch``) and traced by
``torch.compile`` (``compiled``) alike, over the switch's record (``record``) and the models' modules
(``owners``).

- **Whose call.** A call belongs to the models whose forward is running in its context, among those owning
  the calling module: the running forward's model and every model it is part of (a submodel run alone, as
  ``generate`` runs an encoder, is its model's). Outside any forward, to every model owning the module. So a
  layer two models share runs, in each model's forward, that model's backend, and a model no switch names
  runs its own attention in it.
- **Which backend.** Of those models: the innermost model-scoped context of one of them, else the innermost
  global context, else a patch of one of them, the innermost model's where several are patched (``rule``). A
  forward reads it once, when it starts.
- **Per call**, the selection gives the call's backend (``choose``: a policy per phase, by query length; a
  backend per layer kind, by the calling module's kind, None for a kind it leaves out: the model's own).
"""

from __future__ import annotations

from ..backends.policy import Policy, Selection, resolve_selection
from ..backends.policy import choose as _choose_phase
from ..candidate import Kinds
from ..candidate import choose as _choose
from . import owners, record
from .record import PATCHED, STATE

__all__ = ["Policy", "Selection", "resolve_selection", "rule", "choose", "backends_of", "call_models", "selected",
           "for_forward", "selected_for_config", "STATE", "PATCHED"]


def rule(st, tokens: tuple[int, ...], patched) -> Selection | None:
    """The selection for models ``tokens`` (owner tokens) in state ``st``: the innermost model-scoped context
    of one of them, else the global one, else a patch of one of them (``patched``: token -> selection). Traced
    by Dynamo as it is (``hf.compiled``): each read becomes a guard."""
    per_owner = st.per_owner
    if per_owner:
        if len(tokens) == 1:
            sel = per_owner.get(tokens[0])
            if sel is not None:
                return sel
        elif tokens:  # a module of a model inside another: the innermost context (the last entered) first
            for t in reversed(tuple(per_owner)):
                if t in tokens:
                    return per_owner[t]
    sel = st.global_sel
    if sel is not None:
        return sel
    found = None
    for t in tokens:
        s = patched.get(t)
        if s is not None:
            if found is not None:  # a patched model inside another patched one: the inner one (fewer modules) wins
                return _innermost(tokens, patched)
            found = s
    return found


def _innermost(tokens: tuple[int, ...], patched) -> Selection:
    """Of the patched models among ``tokens`` (models owning one module), the selection of the one owning the
    fewest modules: a submodel, whose modules all its containers own too."""
    sizes = []
    for t in tokens:
        info = owners.by_token(t)
        if t in patched and info is not None:
            sizes.append((len(info.owned), t))
    return patched[min(sizes)[1]]


def call_models(module_owners: tuple[int, ...], running: tuple[int, ...] | None) -> tuple[int, ...]:
    """The models a call of a module owned by ``module_owners`` belongs to, with the models ``running`` whose
    forward is running in its context (None: no forward is)."""
    if running is None or module_owners == running:
        return module_owners
    return tuple(t for t in module_owners if t in running)


def choose(sel: Selection, q_len: int, module=None) -> str | None:
    """The backend selection ``sel`` runs for one call (``q_len`` query tokens, of ``module``): the one place a
    selection is resolved per call. None: the model's own attention (a layer kind a ``Kinds`` leaves out, or a
    call of no module of the model it was given for)."""
    if sel.__class__ is str:
        return sel
    if isinstance(sel, Kinds):
        return _choose(sel, q_len, sel.kind_of(module) if module is not None else None)
    return _choose_phase(sel, q_len)


def backends_of(sel: Selection) -> frozenset[str]:
    """Every backend selection ``sel`` may run (``choose``'s answers, but the model's own)."""
    return frozenset((sel,)) if sel.__class__ is str else frozenset(sel.backends)


_OWNERS = owners.OWNERS
_ENDINGS = record.ENDINGS
_STATE_GET = STATE.get


def selected(module, running: tuple[int, ...] | None = None) -> Selection | None:
    """The selection for an attention call of ``module`` in the calling context, ``running`` the models whose
    forward is running there (``for_forward``; None: none). Read per attention call off a forward's own path,
    so ``record.current`` and ``owners.owners`` are written out here."""
    st = _STATE_GET()
    if st.checked != _ENDINGS[0] and st.entry is not None:
        st = record.current()
    if not st.per_owner and (st.global_sel is not None or not PATCHED):
        return st.global_sel
    entry = _OWNERS.get(id(module))
    mine = entry[1] if entry is not None and entry[0]() is module else ()
    return rule(st, call_models(mine, running), PATCHED)


def for_forward(model) -> tuple:
    """For a forward of ``model`` starting in the calling context: ``(state, selection, models, modules,
    info)``: the models its calls belong to (``call_models``' ``running``), the ids of the modules whose calls
    take the selection straight (a live set), and ``model``'s info where it is a model attnswitch knows. A model
    first run under a global switch is registered here, one whose modules changed is read again."""
    st = record.current()
    tokens = owners.owners(model)
    sel = rule(st, tokens, PATCHED)
    info = owners.known(model)
    if sel is None:
        return st, None, tokens, frozenset(), info
    if (info is None and not any(t in st.per_owner for t in tokens) and st.global_sel is not None) or \
            (info is not None and info.dirty):
        info = owners.register(model)  # (read again where its modules changed; a replica's are its original's)
        tokens = owners.owners(model)
    deciding = _deciding(st, tokens, info)
    if deciding is None:
        return st, sel, tokens, frozenset(), info
    # one model (or one with a selection of its own): every module it owns runs ``sel``; else its own modules
    own = sum(1 for t in tokens if t in st.per_owner or t in PATCHED)
    return st, sel, tokens, (deciding.sole if len(tokens) > 1 and own > 1 else deciding.owned), info


def _deciding(st, tokens: tuple[int, ...], info):
    """The info of the model whose selection a forward of models ``tokens`` takes (the model's own for a global
    one)."""
    per_owner = st.per_owner
    for t in reversed(tuple(per_owner)):
        if t in tokens:
            return owners.by_token(t)
    if st.global_sel is None:
        for t in tokens:
            if t in PATCHED:
                return owners.by_token(t)
    return info


def selected_for_config(config) -> Selection | None:
    """The selection that applies to models built on ``config`` in the calling context (for masks made outside
    any forward, which transformers builds from the config alone)."""
    return rule(record.current(), owners.models_with_config(config), PATCHED)
