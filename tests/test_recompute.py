"""Backward recomputation (gradient checkpointing) runs the forward's backend, whatever thread or context
runs the backward, and after the block of the forward ended; where two live forwards of one model ran
different backends and nothing chooses, a clear error.

On a GPU, autograd recomputes on its device thread, which sees none of the caller's contexts (its test is in
``gpu/test_gpu_recompute.py``); here the backward is run where the same holds: in a fresh
``contextvars.Context``, in another thread, and after the block.
"""

import contextvars
import copy
import gc
import threading
import warnings

import pytest
import torch
from conftest import batch_for, tiny, world

import attnswitch


def _checkpointed(reentrant: bool):
    m = tiny("llama").train()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (transformers 5.24 names it activation_checkpointing_enable)
        m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
    return m


def _grads(m):
    return {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}


def _reference(m, b, name):
    """The gradients of the same step under ``name`` without checkpointing."""
    ref = copy.deepcopy(m)
    ref.gradient_checkpointing_disable()
    with attnswitch.backend(name, model=ref):
        ref(**b, labels=b["input_ids"]).loss.backward()
    return _grads(ref)


def _same(got, want):
    assert got.keys() == want.keys() and got
    for n in want:
        torch.testing.assert_close(got[n], want[n], rtol=1e-5, atol=1e-6, msg=n)


@pytest.mark.parametrize("reentrant", [False, True])
@pytest.mark.parametrize("where", ["fresh context", "another thread", "after the block"])
def test_the_recompute_runs_the_forwards_backend(where, reentrant, spy):
    m = _checkpointed(reentrant)
    b = batch_for(m)
    want = _reference(m, b, "naive")
    spy.calls.clear()
    before = world(m)
    with attnswitch.backend("naive", model=m):
        out = m(**b, labels=b["input_ids"])
        assert spy.names == ["naive", "naive"]
        if where == "fresh context":
            contextvars.Context().run(out.loss.backward)
        elif where == "another thread":
            t = threading.Thread(target=out.loss.backward)
            t.start()
            t.join()
    if where == "after the block":
        assert world(m) != before  # the graph may still be recomputed: attnswitch's entries stay
        out.loss.backward()
    assert spy.names == ["naive"] * 4  # two layers, then their recompute
    _same(_grads(m), want)
    del out
    gc.collect()
    assert world(m) == before  # the graph gone, every entry is back


def test_two_threads_recompute_each_its_own_forwards_backend():
    m = _checkpointed(False)  # one model, switched to a different backend in each thread
    b = batch_for(m)
    params = [p for p in m.parameters()]
    want = {name: _reference(m, b, name) for name in ("naive", "math")}
    both = threading.Barrier(2)
    got, errors = {}, []

    def step(name):
        try:
            with attnswitch.backend(name, model=m):
                loss = m(**b, labels=b["input_ids"]).loss
            both.wait(30)  # both graphs alive, both blocks over
            grads = contextvars.Context().run(torch.autograd.grad, loss, params, allow_unused=True)
            got[name] = {n: g for (n, _), g in zip(m.named_parameters(), grads) if g is not None}
        except BaseException as e:
            errors.append(e)
            both.abort()

    threads = [threading.Thread(target=step, args=(n,)) for n in ("naive", "math")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for name in ("naive", "math"):
        _same(got[name], want[name])


def test_two_live_forwards_with_different_backends_and_no_context_choosing_raise_clearly(spy):
    m = _checkpointed(False)
    b = batch_for(m)
    with attnswitch.backend("naive", model=m):
        first = m(**b, labels=b["input_ids"])
    with attnswitch.backend("math", model=m):
        second = m(**b, labels=b["input_ids"])
    with pytest.raises(RuntimeError, match=r"recomputed in a backward .*ran forwards under '(naive', 'math|math', "
                                           r"'naive)' whose graphs are all alive"):
        first.loss.backward()
    spy.calls.clear()
    with attnswitch.backend("math", model=m):  # a context that chooses one of them
        second.loss.backward()
    assert spy.names == ["math", "math"]


def test_an_unswitched_forwards_recompute_is_never_taken_for_a_switched_ones(spy):
    # a switched forward's graph is alive (its loss kept, say) when the model runs unswitched: the unswitched
    # graph's recompute must not run the switched forward's backend; with nothing to tell them apart, an error
    m = _checkpointed(False)
    b = batch_for(m)
    with attnswitch.backend("naive", model=m):
        first = m(**b, labels=b["input_ids"])
    spy.calls.clear()
    second = m(**b, labels=b["input_ids"])
    assert spy.calls == []
    with pytest.raises(RuntimeError, match=r"ran forwards under 'naive', no switch whose graphs are all alive"):
        second.loss.backward()
    assert spy.calls == []  # nothing recomputed through the switched forward's backend
    del first
    gc.collect()  # the switched graph gone: the unswitched one recomputes as it ran, unswitched
    second = m(**b, labels=b["input_ids"])
    second.loss.backward()
    assert spy.calls == []
