"""A workload run compiled: for a candidate's turns, the model's ``forward`` is ``torch.compile`` of it.

Each candidate (backend and mode) compiles a function with a code object of its own: Dynamo caches
compiled code, and counts recompiles against its limit, per code object, so one candidate's compiles
neither evict another's nor use up its budget. The compiled function replaces the model's ``forward``
on the instance while the candidate runs (and the instance is as found after it): the model's own call,
its hooks (attnswitch's clock of forwards) and ``generate()`` stay eager around compiled forwards. In a
generate workload only the decode steps run compiled, as transformers' own compile of a static cache
does; the prefill stays eager.

What ran inside the compiled graph is read off the profiled trace: the attention kernels or ops seen
anywhere in it (no module ranges exist inside compiled code), named by family.
"""

from __future__ import annotations

import dataclasses
import itertools
import types
import weakref
from collections.abc import Iterable

import torch
import torch.nn as nn

from .. import candidate, catalog
from ..candidate import Candidate
from .clock import graphs_compiled, query_length
from .trace import DEVICE_KINDS, Trace

__all__ = ["CompiledForward", "compiled_forward", "graphs_compiled", "attention_seen", "expected_family",
           "mismatch", "merged_modes", "paid_back", "attention_family"]

_IDS = itertools.count()
_CANDIDATES: weakref.WeakKeyDictionary[nn.Module, dict] = weakref.WeakKeyDictionary()


def _entry(forward, name: str):
    """A function calling ``forward`` with a code object of its own (named ``name``)."""
    def entry(*args, **kwargs):
        return forward(*args, **kwargs)
    code = entry.__code__.replace(co_name=name)
    if hasattr(code, "co_qualname"):
        code = code.replace(co_qualname=name)
    return types.FunctionType(code, entry.__globals__, name, entry.__defaults__, entry.__closure__)


class CompiledForward:
    """``torch.compile`` of ``model``'s forward for one candidate; entering puts it in place of the
    model's ``forward`` (an instance attribute), leaving puts back what was there. ``decode_only``: calls
    with more than one query token (a generate's prefill) run the forward uncompiled."""

    def __init__(self, model: nn.Module, backend: str, mode: str, decode_only: bool = False):
        own = model.__dict__.get("forward")  # accelerate's hooks put one there
        self.model, self._own = model, own
        self.forward = own if own is not None else type(model).forward.__get__(model)
        name = f"attnswitch_{backend}_{mode}_{next(_IDS)}".replace("-", "_").replace("/", "_").replace("=", "_")
        self._entry = _entry(self.forward, name)
        self.compiled = torch.compile(self._entry, mode=None if mode == "default" else mode)
        forward, compiled = self.forward, self.compiled

        def run(*args, **kwargs):
            if decode_only and query_length(args, kwargs) != 1:
                return forward(*args, **kwargs)
            return compiled(*args, **kwargs)
        self.fn = run
        self._depth = 0

    def entries(self) -> int | None:
        """Compiled versions of this candidate's forward Dynamo holds (one per set of guards: each beyond
        the first is a recompile); None where this torch does not say."""
        get = getattr(torch._dynamo.eval_frame, "_debug_get_cache_entry_list", None)
        return len(get(self._entry.__code__)) if get is not None else None

    def __enter__(self) -> CompiledForward:
        if self._depth == 0:
            self.model.forward = self.fn
        self._depth += 1
        return self

    def __exit__(self, *exc) -> None:
        self._depth -= 1
        if self._depth == 0:
            if self._own is not None:
                self.model.forward = self._own
            else:
                self.model.__dict__.pop("forward", None)


def compiled_forward(model: nn.Module, backend: str, mode: str, decode_only: bool = False) -> CompiledForward:
    """The candidate's ``CompiledForward``, made once per model, backend, mode and kind (kept while the
    model lives, so that its compiled code serves every turn of the candidate)."""
    per_model = _CANDIDATES.setdefault(model, {})
    key = (backend, mode, decode_only)
    if key not in per_model:
        per_model[key] = CompiledForward(model, backend, mode, decode_only)
    return per_model[key]


attention_family = catalog.attention_family


def attention_seen(trace: Trace) -> tuple[str | None, tuple[str, ...]]:
    """The SDPA family of the attention kernels a trace ran anywhere (device kernels first: under CUDA
    graphs no CPU op is recorded), and their names; ``(None, ())`` where none ran (naive attention,
    inductor's own kernels)."""
    names: dict[str, str] = {}
    for e in trace.events:
        if e.cat in DEVICE_KINDS or e.cat == "cpu_op":
            fam = attention_family(e.name)
            if fam is not None:
                names.setdefault(e.name, fam)
    kernels = [n for n in names if not n.startswith(("aten::", "attnswitch::"))]
    fams = [names[n] for n in (kernels or list(names))]
    return (max(set(fams), key=fams.count) if fams else None), tuple(names)[:8]


def expected_family(backend: str) -> str | None:
    """The family a forced backend's kernel is (None: one that runs no SDPA kernel, or SDPA's own choice)."""
    return catalog.family_of(backend)


def _allowed_one(backend: str) -> set | None:
    r = catalog.row(backend)
    if r is None or r.sdpa is None:  # SDPA's choice, a FlashAttention package's or a user's kernel: any
        return None
    if r.family is None:
        return {None}
    return {r.family} if r.named else {r.family, None}  # math's GEMMs name no family on a GPU


def _allowed(backend: str | Candidate) -> set | None:
    """The families a compiled graph of ``backend`` may run (None: any: SDPA's choice, or a kernel of the
    user's, which may well be SDPA); a policy per phase takes its phases'."""
    parts = [_allowed_one(b) for b in candidate.parse(backend).backends]
    return None if any(p is None for p in parts) else set().union(*parts)


def mismatch(backend: str, seen: str | None, auto_seen: Iterable[str | None] = ()) -> str | None:
    """Why what ran inside the compiled graph is not the selected backend (None: it is)."""
    if backend == "auto":
        others = {f for f in auto_seen if f is not None}
        if seen is not None and others and seen not in others:
            return (f"auto compiled ran {seen}'s kernel, uncompiled {', '.join(sorted(others))}'s: the compiled graph "
                    "keeps SDPA's choice of its compile")
        return None
    allowed = _allowed(backend)
    if allowed is None or seen in allowed:
        return None
    if seen is None:
        return f"{backend} was selected, the compiled graph ran no SDPA kernel"
    return f"{backend} was selected, the compiled graph ran SDPA's {seen} kernel"


def _pays_after(c, base) -> float | None:
    """Steps of the workload after which ``c``'s compile has paid for itself against ``base``."""
    if base is None or not (c.ok and base.ok) or c.compile_ms is None or None in (c.time_ms, base.time_ms):
        return None
    gain = base.time_ms - c.time_ms
    return c.compile_ms / gain if gain > 0 else None


def merged_modes(runs: dict) -> list:
    """One list of candidates from each compile mode's prepared results (``{mode: [BackendResult]}``):
    compiled ones named after their backend (``flash+compile``: ``candidate``), so that every candidate is timed in the
    same interleaved rounds, and ``auto`` compiled checked against the kernel uncompiled ``auto`` ran."""
    uncompiled = {r.backend: r for r in runs.get(None, [])}
    auto_seen = [catalog.kernel_family(uncompiled["auto"].attn_ops)] if "auto" in uncompiled else []
    out = list(runs.get(None, []))
    for mode, results in runs.items():
        if mode is None:
            continue
        for r in results:
            extra = {}
            if r.backend == "auto" and r.ok:
                extra["attn_mismatch"] = mismatch("auto", r.attn_seen, auto_seen)
            out.append(dataclasses.replace(r, backend=str(candidate.parse(r.backend).compiled(mode)), compile=mode,
                                           **extra))
    return out


def paid_back(results: list) -> list:
    """Each timed compiled candidate with the steps after which its compile pays for itself against the
    same backend uncompiled."""
    uncompiled = {r.backend: r for r in results if r.compile is None}
    return [dataclasses.replace(r, compile_pays_after=_pays_after(r, uncompiled.get(str(r.candidate.uncompiled))))
            if r.compile is not None else r for r in results]
