"""The supported range of torch and transformers, checked at import with a clear message.

Each version is read off the package's own version line where it has one, without importing the package
(a few hundred microseconds); ``importlib.metadata`` (tens of milliseconds at every start of the command,
before it can answer anything, Ctrl-C included) only where that line is not found.
"""

from __future__ import annotations

import os
from importlib.machinery import PathFinder

__all__ = ["MINIMUM", "require_supported_versions"]

MINIMUM = {"torch": (2, 11), "transformers": (5, 17)}
#: the file of each package whose line ``__version__ = "..."`` says its version, and how far into it
_VERSION_FILES = {"torch": ("version.py", 4000), "transformers": ("__init__.py", 4000)}


def _parse(v: str) -> tuple[int, ...]:
    digits = "".join(c if c.isdigit() else " " for c in v.split("+")[0])
    return tuple(int(x) for x in digits.split()[:2])


def _version_line(pkg: str) -> str | None:
    """``pkg``'s ``__version__`` as its own files state it, or None where they do not (or it is absent)."""
    try:
        spec = PathFinder.find_spec(pkg)  # (where it would be imported from; nothing of it is imported)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    name, most = _VERSION_FILES[pkg]
    try:
        with open(os.path.join(next(iter(spec.submodule_search_locations)), name), encoding="utf-8") as f:
            head = f.read(most)
    except (OSError, StopIteration, UnicodeDecodeError):
        return None
    for line in head.splitlines():
        key, eq, value = line.partition("=")
        if eq and key.strip() == "__version__" and value.strip()[:1] in ("'", '"'):
            return value.strip()[1:-1]
    return None


def _installed(pkg: str) -> str | None:
    """``pkg``'s version, None where it is not installed."""
    found = _version_line(pkg)
    if found is not None:
        return found
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(pkg)
    except PackageNotFoundError:
        return None


def require_supported_versions(found: dict[str, str] | None = None) -> None:
    """Raise ``ImportError`` naming the package and the version needed when one is too old."""
    for pkg, low in MINIMUM.items():
        have = found.get(pkg) if found is not None else _installed(pkg)
        if have is None:
            raise ImportError(f"attnswitch needs {pkg}>={'.'.join(map(str, low))}, which is not installed")
        if _parse(have) < low:
            raise ImportError(f"attnswitch needs {pkg}>={'.'.join(map(str, low))}; found {pkg} {have}")
