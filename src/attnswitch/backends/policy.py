"""A backend per phase: one backend for prefill calls, another for decode steps (serving engines do this;
transformers does not). Written ``{"prefill": "cudnn", "decode": "flash"}`` or ``prefill=cudnn/decode=flash``."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from .. import options
from ..compiling import split
from .registry import default_backends, kernel_family, not_offered, resolve_name
from .sdpa import FORCED

__all__ = ["Policy", "Selection", "resolve_selection", "choose", "parse_backends", "phase_backends",
           "kernel_families"]


@dataclass(frozen=True)
class Policy:
    """A backend per phase: calls with at most ``decode_max_query`` query tokens are decode steps (one
    new token each, by default), the rest prefill."""

    prefill: str
    decode: str
    decode_max_query: int = 1

    def __str__(self) -> str:
        limit = f"/decode_max_query={self.decode_max_query}" if self.decode_max_query != 1 else ""
        return f"prefill={self.prefill}/decode={self.decode}{limit}"


Selection = str | Policy


def resolve_selection(x) -> Selection:
    """A backend name (or alias), a ``Policy``, a dict ``{"prefill": ..., "decode": ...}`` or its text
    ``"prefill=cudnn/decode=flash"``, checked."""
    if isinstance(x, str) and "=" in x:
        x = options.parse_policy(x)
    if isinstance(x, Policy):
        x = {"prefill": x.prefill, "decode": x.decode, "decode_max_query": x.decode_max_query}
    if isinstance(x, Mapping):
        prefill, decode, limit = options.policy_fields(x)
        return Policy(resolve_name(prefill), resolve_name(decode), limit)
    return resolve_name(x)


def phase_backends(name: str) -> tuple[str, ...]:
    """The backends a candidate's name runs: a policy's (``prefill=A/decode=B``: A and B), else the name. Read
    off the text alone (a report read back may name kernels not registered in this process)."""
    if "=" not in name:
        return (name,)
    fields = dict(part.split("=", 1) for part in name.split("/") if "=" in part)
    return tuple(fields[k] for k in ("prefill", "decode") if k in fields)


def kernel_families(name: str, ops: Iterable[str] = ()) -> tuple[str, ...]:
    """The SDPA families whose kernels (and plan caches) a candidate runs: a forced backend's own, compiled or
    not; a policy's phases' (a phase that forces none, as ``auto``, read off ``ops``); otherwise what ``ops``
    (its op and kernel names) say, as for ``auto``. Empty where none is an SDPA family's (naive, a user's)."""
    phases = phase_backends(split(name)[0])
    forced = [p for p in phases if p in FORCED]
    found = kernel_family(ops) if len(forced) < len(phases) else None
    return tuple(dict.fromkeys([*forced, *([found] if found else [])]))


def choose(sel: Selection, q_len: int) -> str:
    """The backend a selection runs for a call with ``q_len`` query tokens."""
    if isinstance(sel, str):
        return sel
    return sel.decode if q_len <= sel.decode_max_query else sel.prefill


def parse_backends(spec, device) -> list[str]:
    """Canonical names, in order, without repeats, from ``spec``: None or ``"all"`` (every backend that
    can exist on ``device``), a comma-separated string, or an iterable of names; a policy per phase
    (``prefill=cudnn/decode=flash``) is a candidate of its own."""
    if spec is None or spec == "all":
        return default_backends(device)
    if isinstance(spec, str):
        spec = [b for b in spec.split(",") if b.strip()]
    result = [str(resolve_selection(b)) if not isinstance(b, str) or "=" in b else resolve_name(b) for b in spec]
    if not result:
        raise options.OptionError("no backends given: name at least one, or 'all'")
    result = list(dict.fromkeys(result))
    _some_offered(result, device)
    return result


def _some_offered(names: list[str], device) -> None:
    """Candidates every one of which needs a backend this device cannot offer (a CUDA-only one on a CPU, a
    kernel whose package is not installed) are refused before anything is loaded: nothing could run."""
    absent = not_offered(device)
    missing = {n: [p for p in phase_backends(n) if p in absent] for n in names}
    if not all(missing.values()):
        return
    why = "; ".join(dict.fromkeys(f"{p} ({absent[p]})" for ps in missing.values() for p in ps))
    raise options.OptionError("{backends} {given}: nothing this device ({device}) offers: {why}; it offers {offered}, "
                              "or 'all'", given=",".join(names), device=str(device), why=why,
                              offered=", ".join(default_backends(device)))
