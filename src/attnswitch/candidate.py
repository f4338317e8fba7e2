"""A candidate: what one row of a comparison runs, as a value. The one module that reads and writes its text.

A candidate is a selection (one backend; a ``Policy``: a backend per phase; or ``Kinds``: a backend, or a
policy, per layer kind) and a ``torch.compile`` mode (None: uncompiled). Its text, the name a report gives it,
is written by ``str`` and read by ``parse``:

- ``flash``: one backend;
- ``prefill=cudnn/decode=flash[/decode_max_query=N]``: a backend per phase (``Policy``);
- ``sliding_attention=flex/full_attention=flash``: a backend per layer kind (``Kinds``; a kind left out runs
  the model's own attention), ``full_attention.prefill=cudnn/full_attention.decode=flash`` a policy in a kind;
- ``flash+compile``, ``cudnn+compile:reduce-overhead``, ``prefill=cudnn/decode=flash+compile``: compiled.

A leaf without torch: the command line reads candidates before torch is imported. Names are taken as
written unless ``parse`` is given a function that makes them canonical (``options.backend_key``, the
registry's ``resolve_name``); a report read back keeps the names it was written with.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from . import catalog
from .compiling import MODES
from .options import OptionError, backend_key, near

__all__ = ["Candidate", "Policy", "Kinds", "Selection", "PHASE_KEYS", "parse", "policy_of", "kinds_of", "means_all",
           "selection_of", "check_backends", "choose"]

#: the keys of a policy per phase
PHASE_KEYS = ("prefill", "decode", "decode_max_query")
#: the most query tokens a decode step may be given (speculative decoding verifies a few; more is a prefill)
DECODE_MAX_QUERY = 65536
_COMPILE = "+compile"
#: added to a backend per layer kind's preference: after every single backend, compiled or not
_KINDS_AFTER = 1000


@dataclass(frozen=True)
class Policy:
    """A backend per phase: calls with at most ``decode_max_query`` query tokens are decode steps (one new
    token each, by default), the rest prefill."""

    prefill: str
    decode: str
    decode_max_query: int = 1

    def __str__(self) -> str:
        limit = f"/decode_max_query={self.decode_max_query}" if self.decode_max_query != 1 else ""
        return f"prefill={self.prefill}/decode={self.decode}{limit}"

    @property
    def backends(self) -> tuple[str, ...]:
        """The backends it runs, prefill's first, each once."""
        return tuple(dict.fromkeys((self.prefill, self.decode)))

    def choose(self, q_len: int) -> str:
        """The backend of a call with ``q_len`` query tokens."""
        return self.decode if q_len <= self.decode_max_query else self.prefill

    def as_dict(self) -> dict:
        out: dict = {"prefill": self.prefill, "decode": self.decode}
        if self.decode_max_query != 1:
            out["decode_max_query"] = self.decode_max_query
        return out


@dataclass(frozen=True)
class Kinds:
    """A backend (or a ``Policy``) per layer kind, in the order given: ``(("sliding_attention", "flex"),
    ("full_attention", "flash"))``. A call of a kind left out runs the model's own attention."""

    by_kind: tuple[tuple[str, str | Policy], ...]

    def __str__(self) -> str:
        parts = []
        for kind, sel in self.by_kind:
            if isinstance(sel, Policy):
                parts += [f"{kind}.{k}={v}" for k, v in sel.as_dict().items()]
            else:
                parts.append(f"{kind}={sel}")
        return "/".join(parts)

    @property
    def kinds(self) -> tuple[str, ...]:
        return tuple(k for k, _ in self.by_kind)

    @property
    def backends(self) -> tuple[str, ...]:
        """The backends it runs, each once, in the order of the kinds."""
        return tuple(dict.fromkeys(b for _, sel in self.by_kind
                                   for b in (sel.backends if isinstance(sel, Policy) else (sel,))))

    def kind_of(self, module) -> str | None:
        """The layer kind of a calling module: known only to a selection bound to its model (None here)."""
        return None

    def of(self, kind: str | None) -> str | Policy | None:
        """The selection of calls of ``kind`` (None: the model's own attention)."""
        return next((sel for k, sel in self.by_kind if k == kind), None)

    def as_dict(self) -> dict:
        return {k: (sel.as_dict() if isinstance(sel, Policy) else sel) for k, sel in self.by_kind}


Selection = str | Policy | Kinds


def choose(sel: Selection, q_len: int, kind: str | None = None) -> str | None:
    """The backend a selection runs for a call of ``kind`` with ``q_len`` query tokens (None: the model's own
    attention, for a kind a ``Kinds`` leaves out)."""
    if isinstance(sel, Kinds):
        sel = sel.of(kind)
    if isinstance(sel, Policy):
        return sel.decode if q_len <= sel.decode_max_query else sel.prefill
    return sel


@dataclass(frozen=True)
class Candidate:
    """One row of a comparison: ``selection`` (a backend's name, a ``Policy`` or ``Kinds``) compiled with
    ``compile`` (a ``torch.compile`` mode; None: uncompiled)."""

    selection: str | Policy | Kinds
    compile: str | None = None

    def __str__(self) -> str:
        base = str(self.selection)
        if self.compile is None:
            return base
        return f"{base}{_COMPILE}" if self.compile == "default" else f"{base}{_COMPILE}:{self.compile}"

    @property
    def name(self) -> str:
        return str(self)

    @property
    def uncompiled(self) -> Candidate:
        return Candidate(self.selection) if self.compile is not None else self

    def compiled(self, mode: str | None) -> Candidate:
        """The same selection under ``mode`` (None: uncompiled)."""
        return Candidate(self.selection, mode)

    @property
    def policy(self) -> Policy | None:
        return self.selection if isinstance(self.selection, Policy) else None

    @property
    def kinds(self) -> Kinds | None:
        return self.selection if isinstance(self.selection, Kinds) else None

    @property
    def backend(self) -> str | None:
        """The one backend it runs (None: a policy per phase, or a backend per layer kind)."""
        return self.selection if isinstance(self.selection, str) else None

    @property
    def backends(self) -> tuple[str, ...]:
        """Every backend it runs: one, a policy's phases', or each kind's."""
        return self.selection.backends if not isinstance(self.selection, str) else (self.selection,)

    @property
    def forced_families(self) -> tuple[str, ...]:
        """The SDPA kernel families its backends force (``catalog.FORCED``), each once."""
        return tuple(dict.fromkeys(f for b in self.backends if (f := catalog.family_of(b)) is not None))

    @property
    def borrows(self) -> bool:
        """Whether it runs kernels that other candidates force: SDPA's own choice, a policy per phase, or a
        backend per layer kind."""
        return not isinstance(self.selection, str) or self.selection == "auto"

    def preference(self) -> int:
        """Where it stands in a tie (``catalog.PREFERENCE``): a policy by its least preferred phase, a compiled
        candidate after its uncompiled self (compiling is one more thing to deploy), a backend per layer kind after
        every single backend (several backends to deploy where one is as fast)."""
        single = max(catalog.preference(b) for b in self.backends) * 2 + (self.compile is not None)
        return single + (_KINDS_AFTER if self.kinds is not None else 0)


def _policy_text(text: str, key: Callable[[str], str]) -> Policy | Kinds:
    """A policy per phase, or a backend (or policy) per layer kind, from its text."""
    fields: dict = {}
    for part in text.split("/"):
        k, eq, value = part.partition("=")
        if not eq or not k.strip() or not value.strip():
            raise OptionError("a backend per phase or per layer kind is written key=backend/key=backend (e.g. "
                              "prefill=cudnn/decode=flash, sliding_attention=flex/full_attention=flash), not "
                              "{given!r}", given=text)
        k, value = k.strip(), value.strip()
        if k in fields:
            raise OptionError("{given!r} gives {key!r} twice", given=text, key=k)
        last = k.rpartition(".")[2]
        fields[k] = int(value) if last == "decode_max_query" and value.isdigit() else value
    if set(fields) & set(PHASE_KEYS):  # a policy per phase (and a misspelt phase its error names)
        return policy_of(fields, key)
    nested: dict = {}
    for k, value in fields.items():
        kind, dot, phase = k.rpartition(".")
        kind, phased = (kind, True) if dot and phase in PHASE_KEYS else (k, False)
        if kind in nested and phased != isinstance(nested[kind], dict):
            raise OptionError("{given!r} gives layer kind {kind!r} both a backend and a backend per phase; give "
                              "one: {kind}=backend, or {kind}.prefill=.../{kind}.decode=...", given=text, kind=kind)
        if phased:
            nested.setdefault(kind, {})[phase] = value
        else:
            nested[kind] = value
    return kinds_of(nested, key)


def kinds_of(fields: Mapping, key: Callable[[str], str] = str) -> Kinds:
    """``Kinds`` from its mapping (kind -> a backend, or a policy's mapping), names made canonical by ``key``."""
    out = []
    for kind, sel in fields.items():
        if not isinstance(kind, str) or not kind.strip() or any(c in kind for c in ",=/+"):
            raise OptionError("a layer kind is a name without ',', '=', '/' or '+' (sliding_attention, encoder, "
                              "...), not {given!r}", given=kind)
        if kind in PHASE_KEYS:
            raise OptionError("{given!r} is a phase: a backend per phase goes inside each layer kind "
                              "({{kind: {{\"prefill\": ..., \"decode\": ...}}}}, kind.prefill=.../kind.decode=...)",
                              given=kind)
        out.append((kind.strip(), policy_of(sel, key) if isinstance(sel, Mapping) else
                    Policy(key(sel.prefill), key(sel.decode), sel.decode_max_query) if isinstance(sel, Policy) else
                    key(sel)))
    if not out:
        raise OptionError("a backend per layer kind names at least one kind")
    return Kinds(tuple(out))


def policy_of(fields: Mapping, key: Callable[[str], str] = str) -> Policy:
    """A ``Policy`` from its mapping (``{"prefill": ..., "decode": ..., "decode_max_query": N}``), its keys
    and its bound checked, its names made canonical by ``key``."""
    unknown = set(fields) - set(PHASE_KEYS)
    if unknown:
        raise OptionError("unknown phase key(s) {keys}{hint}; a policy takes 'prefill', 'decode' and optionally "
                          "'decode_max_query'", keys=", ".join(map(repr, sorted(unknown, key=str))),
                          hint=near(str(min(unknown, key=str)), PHASE_KEYS))
    if "prefill" not in fields or "decode" not in fields:
        raise OptionError("a backend policy needs both 'prefill' and 'decode'")
    limit = fields.get("decode_max_query", 1)
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= DECODE_MAX_QUERY:
        raise OptionError("decode_max_query must be an int from 1 to {most} (a decode step's query tokens), got "
                          "{got!r}", got=limit, most=DECODE_MAX_QUERY)
    return Policy(key(fields["prefill"]), key(fields["decode"]), limit)


def _compile_mode(text: str, rest: str) -> str:
    mode = rest[1:] if rest.startswith(":") else None if rest else "default"
    if mode is None or mode not in MODES or mode == "none":
        raise OptionError("{given!r}: a compiled candidate is written NAME+compile or NAME+compile:MODE with MODE "
                          "one of {modes}", given=text, modes=", ".join(m for m in MODES if m != "none"))
    return mode


@functools.lru_cache(maxsize=1024)
def _parse(text: str) -> Candidate:
    base, sep, rest = text.rpartition(_COMPILE)
    mode = _compile_mode(text, rest) if sep else None
    base = base if sep else text
    if sep and not base.strip():  # (a plain empty name is the name checker's to refuse)
        raise OptionError("an empty backend name in {given!r}", given=text)
    return Candidate(_policy_text(base, str) if "=" in base else base, mode)


def _canonical(sel: Selection, key: Callable[[str], str]) -> Selection:
    if isinstance(sel, Kinds):
        return kinds_of(sel.as_dict(), key)
    if isinstance(sel, Policy):
        return Policy(key(sel.prefill), key(sel.decode), sel.decode_max_query)
    return key(sel)


def parse(text: str | Candidate, key: Callable[[str], str] | None = None) -> Candidate:
    """The candidate a name stands for (``OptionError`` where it is none); ``key`` makes its backend names
    canonical (an alias to its backend; an unknown name raises there)."""
    if isinstance(text, Candidate):
        return text
    if not isinstance(text, str):
        raise TypeError(f"a candidate is named by a str, not {type(text).__name__}")
    c = _parse(text.strip())
    return c if key is None else Candidate(_canonical(c.selection, key), c.compile)


def selection_of(value, key: Callable[[str], str] = str) -> Selection:
    """A selection from what a caller or a file gives: a name (or alias, through ``key``), a policy's or a
    per-kind selection's text, a ``Policy``, ``Kinds``, or their mapping (``{"prefill": ..., "decode": ...}``,
    ``{"sliding_attention": "flex", "full_attention": {"prefill": ..., "decode": ...}}``). A compiled candidate's
    name is not a selection."""
    if isinstance(value, (Policy, Kinds)):
        return _canonical(value, key)
    if isinstance(value, Mapping):
        nested = any(isinstance(v, Mapping) for v in value.values())
        if set(value) & set(PHASE_KEYS) and not nested:  # a policy per phase (a misspelt phase: its error)
            return policy_of(value, key)
        if set(value) & set(PHASE_KEYS):
            raise OptionError("a backend per phase takes backends, and a backend per layer kind takes kinds: "
                              "put a policy inside each kind ({{kind: {{\"prefill\": ..., \"decode\": ...}}}}), not "
                              "kinds inside a phase")
        return kinds_of(value, key)
    if isinstance(value, str) and "=" in value:
        return _policy_text(value.strip(), key)
    return key(value)


def means_all(spec) -> bool:
    """Whether ``spec`` asks for every backend: None, or ``all`` alone (``"all"``, ``" ALL"``, ``"all,"``,
    ``["all"]``)."""
    if spec is None:
        return True
    items = [b for b in spec.split(",") if b.strip()] if isinstance(spec, str) else \
        list(spec) if isinstance(spec, (list, tuple)) else None
    return items is not None and len(items) == 1 and isinstance(items[0], str) and items[0].strip().lower() == "all"


def check_backends(spec, registered: Iterable[str] = ()) -> list[str]:
    """Each name or policy of ``spec`` (``"all"``, a comma-separated string or an iterable of names, policies
    and their mappings) checked without torch: the canonical names, in order, without repeats (policies in
    their text, their names canonical). ``registered``: backends of the user's registered in this process."""
    if means_all(spec):
        return ["all"]
    registered = tuple(registered)

    def key(name):
        return backend_key(name, registered)

    items = [b for b in spec.split(",") if b.strip()] if isinstance(spec, str) else list(spec)
    if any(isinstance(item, str) and item.strip().lower() == "all" for item in items):
        raise OptionError("{backends}: 'all' is every backend this device runs, and stands alone; give 'all' or "
                          "the names you want")
    out = [str(selection_of(item, key)) for item in items]
    if not out:
        raise OptionError("no backends given: name at least one, or 'all'")
    return list(dict.fromkeys(out))
