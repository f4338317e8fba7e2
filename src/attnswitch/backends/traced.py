"""Every backend as an op that ``torch.compile`` puts in its graph, checked while tracing.

Two ops, both run the backend's own ``run`` (the eager code: PyTorch's eligibility checks on the inputs'
shapes, dtypes, strides and device, the layout changes that make inputs eligible, then the kernel):

- ``attnswitch::attention`` (the fused SDPA backends, ``flex``, registered kernels) is
  ``CompositeImplicitAutograd``, as PyTorch's own ``scaled_dot_product_attention``: Dynamo runs its body
  on fake tensors to learn the output, and AOTAutograd decomposes it into what the body runs, the
  backend's ATen op (``_scaled_dot_product_flash_attention`` …). The graph holds the forced kernel, its
  backward is that op's own derivative, and no flag is read or written.
- ``attnswitch::opaque`` (``naive``, ``naive-inplace``, ``math``) stays one node: inductor would
  otherwise see their matmul-softmax-matmul ops, and its attention pattern matcher
  (``fuse_attention``) replaces such patterns with SDPA's fused kernel, a kernel nobody asked for. At
  run time it runs the backend's eager kernels; its backward runs them again with autograd (one more
  forward of the attention in the backward), so attention dropout while training is refused.

An ineligible call raises ``BackendUnavailable`` while tracing (the bodies run on the trace's fake
tensors), never another kernel. A registered kernel made of torch ops (or of ``torch.library`` ops with
fake implementations) traces; one that cannot run on fake tensors (a raw Triton launch) is refused
with that reason. ``flex`` runs FlexAttention uncompiled inside the trace, so the compile around it
builds its kernels.
"""

from __future__ import annotations

import dataclasses
import functools

import torch

from .. import catalog
from ..errors import BackendUnavailable
from . import flex, naive
from .call import Call, describe
from .registry import REGISTRY, _Kernel, get

__all__ = ["attention", "OPAQUE", "tracing"]

_LIB = torch.library.Library("attnswitch", "FRAGMENT")  # noqa: TOR901 (a Python kernel, defined once per process)
_ARGS = ("Tensor q, Tensor k, Tensor v, Tensor? mask, float dropout, bool causal, float? scale, float? softcap, "
         "Tensor? sinks, str backend, str site")
_LIB.define(f"attention({_ARGS}) -> Tensor")
#: backends whose ops inductor could turn into another kernel: one opaque node each
OPAQUE = catalog.OPAQUE


def tracing(t: torch.Tensor) -> bool:
    """Whether ``t`` is a tensor of a trace (fake, functional, proxied) rather than one with data."""
    return type(t) is not torch.Tensor and not isinstance(t, torch.nn.Parameter)


@functools.cache
def _flex_uncompiled(kernel: _Kernel) -> _Kernel:
    # inside a trace: FlexAttention's own op, uncompiled and without the block-mask caches (the compile
    # around it builds the kernels; a cached block mask would hold fake tensors)
    return dataclasses.replace(kernel, fn=functools.partial(flex.flex_sdpa, compiled=False, cached=False))


def _runner(name: str):
    b = get(name)
    if b.run is None:
        raise ValueError(f"{name!r} is a transformers model's own attention and has no op of its own")
    run = b.run
    return _flex_uncompiled(run) if name == "flex" and isinstance(run, _Kernel) else run


def _run(q, k, v, mask, dropout, causal, scale, softcap, sinks, backend, site, weights):
    call = Call(q, k, v, mask, dropout, causal, scale, softcap, sinks, weights, site)
    run = _runner(backend)
    if not tracing(q):
        return run(call)
    with naive.fresh_masks():
        if REGISTRY[backend].builtin:
            return run(call)
        try:
            return run(call)
        except BackendUnavailable:
            raise
        except Exception as e:  # a kernel that cannot run on fake tensors (a raw Triton launch, say)
            first = (str(e).strip().splitlines() or [""])[0][:300]
            raise BackendUnavailable(backend, site, [
                f"torch.compile cannot trace it: on the trace's fake tensors it raised {type(e).__name__}: {first}; "
                "a kernel made of torch ops, or wrapped as a torch.library custom op with a fake implementation, "
                "traces"], describe(call)) from e


def _shape(q, v):
    return q.new_empty(q.shape[0], q.shape[1], q.shape[2], v.shape[-1])


def _traced(q, k, v, mask, dropout, causal, scale, softcap, sinks, backend, site, weights):
    """``_run`` inside a trace: a refusal becomes the ``refuse`` op, which raises ``BackendUnavailable``
    when the compiled code runs (Dynamo would wrap an error raised while tracing in its own)."""
    try:
        return _run(q, k, v, mask, dropout, causal, scale, softcap, sinks, backend, site, weights)
    except BackendUnavailable as e:
        if not tracing(q):
            raise
        out = torch.ops.attnswitch.refuse(_shape(q, v), e.backend, e.where or "", e.reasons, e.inputs)
        return out, (q.new_empty(q.shape[0], q.shape[1], q.shape[2], k.shape[2]) if weights else None)


# Unsafe in a CUDA graph: inductor keeps it out of every graph it records (a partition of its own). Raised inside
# a recording's warm-up it would leave CUDA graph trees a node without outputs, and the next compiled
# candidate's first replay fails on it (an AssertionError in ``dealloc_current_path_weakrefs``).
_LIB.define("refuse(Tensor like, str backend, str site, str[] reasons, str inputs) -> Tensor",
            tags=(torch.Tag.cudagraph_unsafe,) if hasattr(torch.Tag, "cudagraph_unsafe") else ())


def _refuse(like, backend, site, reasons, inputs):
    raise BackendUnavailable(backend, site or None, list(reasons), inputs)


def _refuse_fake(like, backend, site, reasons, inputs):
    return torch.empty_like(like)


_LIB.impl("refuse", _refuse, "CompositeExplicitAutograd")
torch.library.register_fake("attnswitch::refuse", _refuse_fake, lib=_LIB)


def _attention(q, k, v, mask, dropout, causal, scale, softcap, sinks, backend, site):
    return _traced(q, k, v, mask, dropout, causal, scale, softcap, sinks, backend, site, False)[0]


_LIB.impl("attention", _attention, "CompositeImplicitAutograd")


# -- the opaque op: naive, naive-inplace, math ---------------------------------------------------------

def _opaque(q, k, v, mask, dropout, causal, scale, softcap, sinks, backend, site):
    return _run(q, k, v, mask, dropout, causal, scale, softcap, sinks, backend, site, False)[0]


def _opaque_weights(q, k, v, mask, dropout, causal, scale, softcap, sinks, backend, site):
    out, weights = _run(q, k, v, mask, dropout, causal, scale, softcap, sinks, backend, site, True)
    return out, weights


_OPAQUE = torch.library.custom_op("attnswitch::opaque", _opaque, mutates_args=(), schema=f"({_ARGS}) -> Tensor")
_OPAQUE_WEIGHTS = torch.library.custom_op("attnswitch::opaque_weights", _opaque_weights, mutates_args=(),
                                          schema=f"({_ARGS}) -> (Tensor, Tensor)")
# fake: the backend itself on the fake tensors (it checks the call as eager does, and gives the shapes);
# a refusal is raised when the op runs, by the backend itself
_OPAQUE.register_fake(lambda *a: _traced(*a, False)[0])
_OPAQUE_WEIGHTS.register_fake(lambda *a: _traced(*a, True))

_GRAD_INPUTS = (0, 1, 2, 3, 8)  # q, k, v, mask, sinks


class _autograd_inside:
    """Autograd inside an op's kernel (the dispatcher excludes its keys there): the keys let through for
    the block, then excluded again as found."""

    _KEYS = [getattr(torch._C.DispatchKey, k) for k in ("AutogradFunctionality", "ADInplaceOrView",
                                                         "AutogradOther", "AutogradNestedTensor")]

    def __enter__(self) -> None:
        self._found = [torch._C._dispatch_tls_is_dispatch_key_excluded(k) for k in self._KEYS]
        for k in self._KEYS:
            torch._C._dispatch_tls_set_dispatch_key_excluded(k, False)

    def __exit__(self, *exc) -> None:
        for k, was in zip(self._KEYS, self._found):
            torch._C._dispatch_tls_set_dispatch_key_excluded(k, was)


def _recomputed_grads(grad, q, k, v, mask, dropout, causal, scale, softcap, sinks, backend, site, wants):
    """The backward of ``opaque``: the backend's forward again, with autograd, differentiated."""
    args = [q, k, v, mask, dropout, causal, scale, softcap, sinks]
    inputs = []
    with _autograd_inside(), torch.enable_grad():
        for i, want in zip(_GRAD_INPUTS, wants):
            if want:
                args[i] = args[i].detach().requires_grad_()
                inputs.append(args[i])
        out = _run(*args, backend, site, False)[0]
        return list(torch.autograd.grad(out, inputs, grad))


_BACKWARD = torch.library.custom_op("attnswitch::opaque_backward", _recomputed_grads, mutates_args=(),
                                    schema=f"(Tensor grad, {_ARGS}, bool[] wants) -> Tensor[]")


@_BACKWARD.register_fake
def _(grad, q, k, v, mask, dropout, causal, scale, softcap, sinks, backend, site, wants):
    tensors = (q, k, v, mask, sinks)
    return [torch.empty_like(t) for t, want in zip(tensors, wants) if want]


def _setup(ctx, inputs, output):
    ctx.args = inputs
    ctx.save_for_backward(*(inputs[i] for i in _GRAD_INPUTS if inputs[i] is not None))


def _backward(ctx, grad):
    args = list(ctx.args)
    wants = [bool(ctx.needs_input_grad[i]) and args[i] is not None for i in _GRAD_INPUTS]
    grads = iter(_BACKWARD(grad, *args, wants))
    return tuple(next(grads) if i in _GRAD_INPUTS and wants[_GRAD_INPUTS.index(i)] else None
                 for i in range(len(args)))


_OPAQUE.register_autograd(_backward, setup_context=_setup)


def attention(name: str, call: Call):
    """``run_backend(name, call)`` as traced code calls it: ``(out, weights or None)`` from the op."""
    site = call.where if isinstance(call.where, str) else "(bare call)"
    args = (call.q, call.k, call.v, call.mask, float(call.dropout), bool(call.causal), call.scale, call.softcap,
            call.sinks, name, site)
    if name not in OPAQUE:
        return torch.ops.attnswitch.attention(*args), None
    grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad
                                           for t in (call.q, call.k, call.v, call.mask, call.sinks))
    if grad and (call.dropout or call.need_weights):  # refused when the compiled code runs (``_traced``)
        what = f"dropout_p={call.dropout}" if call.dropout else "attention weights (output_attentions=True)"
        out = torch.ops.attnswitch.refuse(_shape(call.q, call.v), name, site, [
            f"under torch.compile {name} runs as one op whose backward runs its forward again, which it cannot with "
            f"{what} while training (the forward run again would differ); compile in eval mode, or run {name} "
            "uncompiled"], describe(call))
        return out, None
    if call.need_weights:
        return _OPAQUE_WEIGHTS(*args)
    return _OPAQUE(*args), None
