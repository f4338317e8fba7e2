"""``torch.compile``'s modes, and ``--compile`` (the modes to run every candidate under).

A leaf without torch, so that the command line answers bad input before importing it. ``none`` is the
uncompiled run; how a compiled candidate is named (``flash+compile``) is ``candidate``'s.
"""

from __future__ import annotations

from collections.abc import Iterable

from .options import OptionError, near

__all__ = ["MODES", "parse_compile"]

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
        if not m and isinstance(spec, str) and "," in spec:  # (an empty item of a list: the list is what was typed)
            raise OptionError("{compile} {given!r}: an empty mode between commas; use one of {modes}, or several "
                              "joined by commas (default,none)", given=spec, modes=", ".join(MODES))
        if m not in MODES:
            raise OptionError("{compile} {given!r}{hint}: use one of {modes}, or several joined by commas "
                              "(default,none)", given=item, hint=near(m, MODES), modes=", ".join(MODES))
        modes.append(None if m == "none" else m)
    if not modes:
        raise OptionError("{compile} {given!r}: name a mode: {modes}", given=spec, modes=", ".join(MODES))
    return tuple(dict.fromkeys(modes))
