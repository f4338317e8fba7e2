"""Attention a switched model computes outside transformers' attention interface, seen by watching it.

The first switched forward of each model (and the first after its modules change) runs under a
``TorchFunctionMode`` of this thread that sees every torch function it calls: ``scaled_dot_product_attention``
and multi-head attention called directly, and a softmax over scores made by multiplying two activations
(``softmax(q @ kᵀ)``, written out; a router's ``softmax(linear(x))`` is not attention). Where the call comes
from a module of the model and not from attnswitch's own entry, the module is named, and the forward is
refused. Later forwards are not watched: the verdict is kept per model until its modules change.
"""

from __future__ import annotations

import contextlib
import sys
import weakref

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from ..sites import module_path

__all__ = ["Watch", "refusal", "paused"]

_F = torch.Tensor
_COMPILING = torch.compiler.is_compiling
_DIRECT = {F.scaled_dot_product_attention: "scaled_dot_product_attention",
           F.multi_head_attention_forward: "multi_head_attention_forward (nn.MultiheadAttention)"}
if hasattr(torch, "_native_multi_head_attention"):
    _DIRECT[torch._native_multi_head_attention] = "_native_multi_head_attention (nn.MultiheadAttention)"
_SOFTMAX = {torch.softmax, F.softmax, _F.softmax, torch._softmax, torch.special.softmax}
_PRODUCTS = {torch.matmul: (0, 1), _F.matmul: (0, 1), _F.__matmul__: (0, 1), _F.__rmatmul__: (0, 1),
             torch.bmm: (0, 1), _F.bmm: (0, 1), torch.baddbmm: (1, 2), _F.baddbmm: (1, 2)}


def _activation(t) -> bool:
    """A tensor computed in the forward (not a weight) with a batch of matrices (at least 3 dims)."""
    return isinstance(t, torch.Tensor) and t.dim() >= 3 and not isinstance(t, nn.Parameter) and \
        not isinstance(t._base, nn.Parameter)


class Watch(TorchFunctionMode):
    """Records where a model's modules compute attention outside attnswitch's entry, as ``(path, class,
    what)``; ``owned`` is the set of the model's module ids, ``inside`` the code objects of attnswitch's
    entries (calls under them are the switch's own)."""

    def __init__(self, model: nn.Module, owned: set, inside: frozenset):
        super().__init__()
        self.model, self.owned, self.inside = model, owned, inside
        self.found: list[tuple[str, str, str]] = []
        self._scores: dict[int, weakref.ref] = {}  # tensors that are q @ kᵀ, scaled, masked, capped

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if _COMPILING():  # a layer compiled inside the watched forward: its code is not watched
            return out
        what = _DIRECT.get(func)
        if what is None and func in _SOFTMAX and args and self._is_scores(args[0]):
            what, self._scores = "softmax over q @ kᵀ", {}
        if what is not None:
            self._seen(what)
        elif func in _PRODUCTS or func is torch.einsum:
            self._product(func, args, out)
        elif self._scores and isinstance(out, torch.Tensor):
            for a in args:
                if self._is_scores(a) and a.shape == out.shape:  # scaled, masked, softcapped, cast
                    self._mark(out)
                    break
        return out

    def _is_scores(self, t) -> bool:
        ref = self._scores.get(id(t))
        return ref is not None and ref() is t

    def _mark(self, t: torch.Tensor) -> None:
        self._scores[id(t)] = weakref.ref(t)

    def _product(self, func, args, out) -> None:
        if func is torch.einsum:
            operands = args[1:] if len(args) > 2 else (list(args[1]) if len(args) == 2 else [])
            which = (0, 1) if len(operands) == 2 else ()
        else:
            operands, which = args, _PRODUCTS[func]
        if which and len(operands) > max(which) and all(_activation(operands[i]) for i in which) and \
                isinstance(out, torch.Tensor):
            self._mark(out)

    def _seen(self, what: str) -> None:
        """Name the innermost module of the model on the Python stack, unless an attnswitch entry is nearer."""
        frame = sys._getframe(2)
        while frame is not None:
            code = frame.f_code
            if code in self.inside:
                return
            if "self" in code.co_varnames:
                module = frame.f_locals.get("self")
                if isinstance(module, nn.Module) and id(module) in self.owned:
                    self.found.append((module_path(module) if module is not self.model else "(the model itself)",
                                       type(module).__name__, what))
                    return
            frame = frame.f_back


@contextlib.contextmanager
def paused(watch: Watch):
    """``watch`` off for the block (attnswitch's own entry): a kernel compiled there is compiled as in any later,
    unwatched forward, whose guards see no mode."""
    n = torch._C._len_torch_function_stack()
    if n == 0 or torch._C._get_function_stack_at(n - 1) is not watch:
        yield
        return
    torch._C._pop_torch_function_stack()
    try:
        yield
    finally:
        torch._C._push_on_torch_function_stack(watch)


def refusal(model: nn.Module, found: list[tuple[str, str, str]]) -> str:
    """The words of ``UnsupportedModel`` for attention seen outside the interface."""
    seen = list(dict.fromkeys(found))
    text = "; ".join(f"{path} ({cls}): {what}" for path, cls, what in seen[:4])
    more = f" and {len(seen) - 4} more" if len(seen) > 4 else ""
    return (f"{type(model).__name__} computes attention outside transformers' attention interface, where no "
            f"attnswitch backend reaches it, so the switch would leave it as it is: {text}{more}")
