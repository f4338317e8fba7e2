"""Gradient checkpointing on CUDA: autograd recomputes each checkpointed layer on its device thread, which
sees none of the caller's contexts. The recompute must run the forced backend: its op in the backward's
profile and no other attention op, its calls counted on that thread, gradients those of the same forced run
without checkpointing; inside the block and after it.

Run on a GPU machine: ``pytest -m gpu tests/gpu``. Skipped without CUDA.
"""

import copy
import gc
import threading
import warnings

import pytest
import torch
from conftest import batch_for, gpu_events, tiny, to_cuda, world

import attnswitch

pytestmark = pytest.mark.gpu

#: attention ops of each family, forward or backward
_FAMILIES = {"flash": "_scaled_dot_product_flash_attention", "cudnn": "_scaled_dot_product_cudnn_attention",
             "efficient": "_scaled_dot_product_efficient_attention", "math": "_scaled_dot_product_attention_math"}


def _model(reentrant: bool | None):
    m = tiny("llama").to("cuda", torch.bfloat16).train()
    if reentrant is not None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
    return m


def _backward_ops(loss):
    return [e.name for e in gpu_events(loss.backward)]


def _grads(m):
    return {n: p.grad.float() for n, p in m.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("when", ["inside the block", "after the block"])
@pytest.mark.parametrize("reentrant", [False, True])
@pytest.mark.parametrize("name", ["naive", "flash"])
def test_the_recompute_on_the_device_thread_runs_the_forced_backend(name, reentrant, when, spy):
    m = _model(reentrant)
    b = to_cuda(batch_for(m, pad=False, seq=64))
    ref = copy.deepcopy(m)
    ref.gradient_checkpointing_disable()
    with attnswitch.backend(name, model=ref):
        ref(**b, labels=b["input_ids"]).loss.backward()
    spy.calls.clear()
    before = world(m)
    with attnswitch.backend(name, model=m):
        out = m(**b, labels=b["input_ids"])
        ops = _backward_ops(out.loss) if when == "inside the block" else None
    if ops is None:
        ops = _backward_ops(out.loss)
    main = threading.get_ident()
    # the forward's two calls, then the recompute's two, on autograd's device thread
    assert spy.names == [name] * 4 and all(t != main for t, _, _ in spy.calls[2:]), spy.calls
    attention_ops = {n for n in ops if any(f in n for f in _FAMILIES.values())}
    if name == "naive":
        assert attention_ops == set(), attention_ops  # SDPA's own choice (cuDNN here) would show
    else:
        assert attention_ops and all(_FAMILIES[name] in n for n in attention_ops), attention_ops
    got, want = _grads(m), _grads(ref)
    worst = max(((got[n] - want[n]).abs().max() / want[n].abs().max().clamp_min(1e-6)).item() for n in want)
    print(f"{name} reentrant={reentrant} {when}: attention ops in backward {sorted(attention_ops)}; "
          f"recompute threads {sorted({t for t, _, _ in spy.calls[2:]})} (main {main}); worst relative gradient "
          f"difference against the uncheckpointed run {worst:.2e}")
    assert got.keys() == want.keys() and worst < 2e-2
    del out
    gc.collect()
    assert world(m) == before
