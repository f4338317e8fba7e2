"""Versions: the supported range of torch and transformers, checked at import with a clear message, and how a
version is read (``version_of``) and printed (``version_text``: cuDNN's integer as its release).

Each version is read off the package's own version line where it has one, without importing the package
(a few hundred microseconds); ``importlib.metadata`` (tens of milliseconds at every start of the command,
before it can answer anything, Ctrl-C included) only where that line is not found.
"""

from __future__ import annotations

import os
from importlib.machinery import PathFinder

__all__ = ["MINIMUM", "require_supported_versions", "version_of", "version_text"]

MINIMUM = {"torch": (2, 11), "transformers": (5, 17)}
#: the file of each package whose line ``__version__ = "..."`` says its version, and how far into it
_VERSION_FILES = {"torch": ("version.py", 4000), "transformers": ("__init__.py", 4000)}


def _leading(v: str) -> tuple[int, ...]:
    """The first two numbers of a version, whatever follows them (nightlies' ``2.12.0.dev20260101`` too)."""
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
        if _leading(have) < low:
            raise ImportError(f"attnswitch needs {pkg}>={'.'.join(map(str, low))}; found {pkg} {have}")


def version_of(value) -> tuple[int, ...] | None:
    """A version as a tuple: ``"2.13.0+cu130"`` -> (2, 13, 0); cuDNN's integer (``torch.backends.cudnn.version()``:
    92000 -> (9, 20, 0), 8907 -> (8, 9, 7)); None where there is none."""
    import re  # (here: the command answers Ctrl-C before importing anything it can do without)

    if value is None or value == "":
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        if value <= 0:
            return None
        return (value // 10000, value // 100 % 100, value % 100) if value >= 10000 else \
            (value // 1000, value // 100 % 10, value % 100)
    text = str(value).split("+")[0].strip()
    if text.isdigit() and len(text) >= 4:  # cuDNN's integer, as text (92000)
        return version_of(int(text))
    if not re.fullmatch(r"v?\d+(\.\d+)*([a-z]+\d*)?", text):  # 2.13.0, 9.20, 92000, 2.13.0a0; not -1 or "x"
        return None
    nums = re.findall(r"\d+", text)
    return tuple(int(n) for n in nums[:3]) or None


def version_text(key: str, value) -> str:
    """A version as a report prints it: cuDNN's integer as its release (91900 -> ``9.19.0``), others as given."""
    if key == "cudnn" and isinstance(value, int) and not isinstance(value, bool):
        v = version_of(value)
        return ".".join(map(str, v)) if v else str(value)
    return str(value)
