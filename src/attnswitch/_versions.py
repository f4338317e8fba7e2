"""The supported range of torch and transformers, checked at import with a clear message."""

from __future__ import annotations

import re
from importlib.metadata import PackageNotFoundError, version

__all__ = ["MINIMUM", "require_supported_versions"]

MINIMUM = {"torch": (2, 11), "transformers": (5, 17)}


def _parse(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", v.split("+")[0])[:2])


def require_supported_versions(found: dict[str, str] | None = None) -> None:
    """Raise ``ImportError`` naming the package and the version needed when one is too old."""
    for pkg, low in MINIMUM.items():
        try:
            have = found[pkg] if found is not None else version(pkg)
        except (PackageNotFoundError, KeyError):
            raise ImportError(f"attnswitch needs {pkg}>={'.'.join(map(str, low))}, which is not installed") from None
        if _parse(have) < low:
            raise ImportError(f"attnswitch needs {pkg}>={'.'.join(map(str, low))}; found {pkg} {have}")
