"""attnswitch: switch, profile and compare the attention implementation of transformers models.

>>> import attnswitch
>>> with attnswitch.backend("cudnn"):
...     model(input_ids)
"""

from __future__ import annotations

from ._versions import require_supported_versions

require_supported_versions()

from .backends import BACKENDS, register_backend, resolve_name, unregister_backend  # noqa: E402
from .check import CheckResult, Eligibility, check  # noqa: E402
from .compare import compare  # noqa: E402
from .errors import BackendUnavailable, UnsupportedModel  # noqa: E402
from .hf import Policy  # noqa: E402
from .profiling import profile  # noqa: E402
from .results import BackendResult, Report  # noqa: E402
from .switch import active_backend, attention, backend, is_patched, patch, unpatch  # noqa: E402

__version__ = "0.1.0"

__all__ = [
    "BACKENDS",
    "BackendResult",
    "BackendUnavailable",
    "CheckResult",
    "Policy",
    "Eligibility",
    "Report",
    "UnsupportedModel",
    "active_backend",
    "attention",
    "backend",
    "check",
    "compare",
    "is_patched",
    "patch",
    "profile",
    "register_backend",
    "resolve_name",
    "unpatch",
    "unregister_backend",
]
