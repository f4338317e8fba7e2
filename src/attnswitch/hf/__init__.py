"""transformers integration: which backend each attention call runs, without touching models or configs.

Models on transformers' attention interface look up ``ALL_ATTENTION_FUNCTIONS`` by
``config._attn_implementation`` on every forward, and ``masking_utils`` builds their masks from
``ALL_MASK_ATTENTION_FUNCTIONS`` under the same name. While a switch is active attnswitch holds those
entries (``install``) with dispatchers (``dispatch``) that ask the rules (``selection``) which backend the
switch's record (``record``) selects for the calling model (``owners``: which models own a module), and run
what was there before for everything else. ``interface`` tells which models use the interface at all;
``registries`` keeps what each entry held.
"""

from __future__ import annotations

from . import (
    compiled,
    dispatch,
    install,
    interface,
    observe,
    owners,
    parallel,
    recompute,
    record,
    registries,
    selection,
)
from .dispatch import attention_forward, mask_forward, run_backend
from .interface import configs_of, legacy_attention_classes, model_eager_function, require_interface
from .record import STATE, State
from .selection import Policy, resolve_selection

__all__ = ["compiled", "dispatch", "install", "interface", "observe", "owners", "parallel", "recompute", "record",
           "registries", "selection", "attention_forward", "mask_forward", "run_backend", "configs_of",
           "legacy_attention_classes", "model_eager_function", "require_interface", "STATE", "Policy", "State",
           "resolve_selection", "world"]


def world() -> dict:
    """Everything a switch may touch, for tests that check nothing was left changed: transformers'
    registries and ``PreTrainedModel.__call__``, what holds them, the patches, and this context's selection."""
    st = record.current()
    return {**registries.snapshot(), "leases": record.held(), "patched": dict(record.PATCHED),
            "selection": (st.global_sel, dict(st.per_owner))}
