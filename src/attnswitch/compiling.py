"""``torch.compile`` as part of a candidate: its modes, how a compiled candidate is named, ``--compile``.

A leaf without torch, so that the command line answers bad input before importing it. ``none`` is the
uncompiled run; a compiled candidate is named after its backend (``flash+compile``,
``cudnn+compile:reduce-overhead``), so that compiled and uncompiled runs of one backend stand side by side
in one ranking.
"""

from __future__ import annotations

from collections.abc import Iterable

from .options import OptionError

__all__ = ["MODES", "parse_compile", "label", "split"]

#: ``--compile`` values: ``none`` (uncompiled) and torch.compile's modes
MODES = ("none", "default", "reduce-overhead", "max-autotune")


def parse_compile(spec: str | Iterable[str | None] | None) -> tuple[str | None, ...]:
    """The compile modes asked for, in order, each once; None stands for ``none`` (uncompiled). ``spec``:
    None, one mode, a comma-separated list (``default,none``) or an iterable of them."""
    if spec is None:
        return (None,)
    items = spec.split(",") if isinstance(spec, str) else list(spec)
    modes = []
    for item in items:
        m = "none" if item is None else str(item).strip().lower()
        if m not in MODES:
            raise OptionError("{compile} {given!r}: use one of {modes}, or several joined by commas (default,none)",
                              given=item, modes=", ".join(MODES))
        modes.append(None if m == "none" else m)
    if not modes:
        raise OptionError("{compile} {given!r}: name a mode: {modes}", given=spec, modes=", ".join(MODES))
    return tuple(dict.fromkeys(modes))


def label(backend: str, mode: str | None) -> str:
    """The candidate's name in a report: the backend, compiled or not."""
    if mode is None:
        return backend
    return f"{backend}+compile" if mode == "default" else f"{backend}+compile:{mode}"


def split(name: str) -> tuple[str, str | None]:
    """``(backend, mode)`` of a candidate's name (``label``'s inverse)."""
    backend, sep, rest = name.rpartition("+compile")
    if not sep or (rest and not rest.startswith(":")):
        return name, None
    return backend, rest[1:] or "default"
