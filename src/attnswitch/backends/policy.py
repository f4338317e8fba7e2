"""A backend per phase: one backend for prefill calls, another for decode steps (serving engines do this;
transformers does not). Written ``{"prefill": "cudnn", "decode": "flash"}`` or ``prefill=cudnn/decode=flash``;
the value and its text are ``candidate``'s, the names checked against the registry here."""

from __future__ import annotations

from collections.abc import Iterable

from .. import candidate, catalog, options
from ..candidate import Candidate, Policy
from .registry import default_backends, not_offered, resolve_name

__all__ = ["Policy", "Selection", "resolve_selection", "choose", "parse_backends", "phase_backends",
           "kernel_families"]

Selection = str | Policy


def resolve_selection(x) -> Selection:
    """A backend name (or alias, or ``SDPBackend``), a ``Policy``, a dict ``{"prefill": ..., "decode": ...}``
    or its text ``"prefill=cudnn/decode=flash"``, checked against the registry."""
    return candidate.selection_of(x, resolve_name)


def phase_backends(name: str | Candidate) -> tuple[str, ...]:
    """The backends a candidate runs: a policy's phases', else its one backend. Read off the name alone (a
    report read back may name kernels not registered in this process)."""
    return candidate.parse(name).backends


def kernel_families(name: str | Candidate, ops: Iterable[str] = ()) -> tuple[str, ...]:
    """The SDPA families whose kernels (and plan caches) a candidate runs: a forced backend's own, compiled or
    not; a policy's phases' (a phase that forces none, as ``auto``, read off ``ops``); otherwise what ``ops``
    (its op and kernel names) say, as for ``auto``. Empty where none is an SDPA family's (naive, a user's)."""
    c = candidate.parse(name)
    forced = c.forced_families
    found = catalog.kernel_family(ops) if len(forced) < len(c.backends) else None
    return tuple(dict.fromkeys([*forced, *([found] if found else [])]))


def choose(sel: Selection, q_len: int) -> str:
    """The backend a selection runs for a call with ``q_len`` query tokens."""
    if isinstance(sel, str):
        return sel
    return sel.decode if q_len <= sel.decode_max_query else sel.prefill


def parse_backends(spec, device, offered: bool = True) -> list[str]:
    """Canonical names, in order, without repeats, from ``spec``: None or ``"all"`` (every backend that
    can exist on ``device``), a comma-separated string, or an iterable of names, ``Candidate``s (their
    selection), policies and their mappings; a policy per phase (``prefill=cudnn/decode=flash``) is a
    candidate of its own. ``offered``: names of which the device offers none are refused (not so for
    ``check``, which answers for each one why it cannot run)."""
    if candidate.means_all(spec):
        return default_backends(device)
    if isinstance(spec, str):
        spec = [b for b in spec.split(",") if b.strip()]
    result = [str(resolve_selection(b.selection if isinstance(b, Candidate) else b)) for b in spec]
    if not result:
        raise options.OptionError("no backends given: name at least one, or 'all'")
    result = list(dict.fromkeys(result))
    if offered:
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
