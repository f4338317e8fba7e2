"""attnswitch: switch, profile and compare the attention implementation of transformers models.

>>> import attnswitch
>>> with attnswitch.backend("cudnn"):
...     model(input_ids)

Names are imported on first use, so that ``import attnswitch`` (and the command line's ``--help``)
stays cheap until torch and transformers are needed.
"""

from __future__ import annotations

import importlib

from . import _own_env  # noqa: F401  (what the environment holds at import, before torch compiles anything)
from ._versions import require_supported_versions

require_supported_versions()

__version__ = "0.1.0"

#: public name -> the module that defines it
_EXPORTS = {
    "BACKENDS": "backends", "register_backend": "backends", "unregister_backend": "backends",
    "resolve_name": "backends", "Policy": "backends", "Candidate": "candidate",
    "CheckResult": "eligibility", "Eligibility": "eligibility", "check": "eligibility",
    "compare": "comparison", "compare_sweep": "comparison",
    "BackendUnavailable": "errors", "UnsupportedModel": "errors", "load_policy": "deploy",
    "read_lengths": "lengths",
    "profile": "profiling",
    "BackendResult": "results", "Report": "results",
    "active_backend": "switch", "attention": "switch", "backend": "switch", "is_patched": "switch",
    "patch": "switch", "unpatch": "switch", "layer_kinds": "switch",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        try:  # a submodule: attnswitch.workload, attnswitch.models, ...
            return importlib.import_module(f".{name}", __name__)
        except ModuleNotFoundError:
            raise AttributeError(f"module 'attnswitch' has no attribute {name!r}") from None
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
