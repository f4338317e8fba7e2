"""attnswitch's ``eager`` is the model's own transformers eager attention: the same ops, in the same numbers,
as ``model.set_attn_implementation("eager")`` (its masks made by transformers' masking for eager), the same
output bit for bit; ``eager-fp32`` is that computed in float32."""

import collections
import copy

import pytest
import torch
from conftest import batch_for, output_of, tiny
from transformers.masking_utils import AttentionMaskInterface, eager_mask
from transformers.modeling_utils import AttentionInterface
from transformers.models.llama.modeling_llama import eager_attention_forward

import attnswitch


def _ops(fn):
    """Every op the forward ran on the CPU, with how often."""
    with torch.no_grad(), torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        out = fn()
    return collections.Counter(e.name for e in prof.events()), out


def _transformers_eager(m, b):
    m.set_attn_implementation("eager")
    try:
        return _ops(lambda: output_of(m(**b)))
    finally:
        m.set_attn_implementation("sdpa")


@pytest.mark.parametrize("kind", ["llama", "bert"])
@pytest.mark.parametrize("scope", ["model", "global"])
def test_eager_runs_the_ops_transformers_eager_runs(kind, scope):
    m = tiny(kind)
    b = batch_for(m)  # padded: transformers' eager mask has padding to hide
    assert m.config._attn_implementation == "sdpa"
    _transformers_eager(m, b)  # (first calls warm caches on both sides)
    want, ref = _transformers_eager(m, b)

    def switched():
        with attnswitch.backend("eager", model=m if scope == "model" else None):
            return output_of(m(**b))
    switched()
    got, out = _ops(switched)
    assert got == want, {k: (got[k], want[k]) for k in got.keys() | want.keys() if got[k] != want[k]}
    assert torch.equal(out, ref)


def _eager_in_fp32(module, query, key, value, attention_mask, **kwargs):
    out, weights = eager_attention_forward(module, query.float(), key.float(), value.float(),
                                           None if attention_mask is None else attention_mask.float(), **kwargs)
    return out.to(query.dtype), weights


def test_eager_fp32_is_the_models_eager_attention_in_float32():
    m = tiny("llama")
    b = batch_for(m)
    _, ref = _transformers_eager(m, b)
    with torch.no_grad(), attnswitch.backend("eager-fp32", model=m):
        assert torch.equal(output_of(m(**b)), ref)  # a float32 model: nothing to change
    half = copy.deepcopy(m).to(torch.bfloat16)
    with torch.no_grad(), attnswitch.backend("eager-fp32", model=half):
        got = output_of(half(**b))
    # the same by transformers' own means: its eager function in float32, with its eager mask
    AttentionInterface.register("test-eager-in-fp32", _eager_in_fp32)
    AttentionMaskInterface.register("test-eager-in-fp32", eager_mask)
    try:
        half.set_attn_implementation("test-eager-in-fp32")
        with torch.no_grad():
            want = output_of(half(**b))
    finally:
        del AttentionInterface._global_mapping["test-eager-in-fp32"], \
            AttentionMaskInterface._global_mapping["test-eager-in-fp32"]
    assert torch.equal(got, want)


def test_eager_runs_a_models_own_eager_function_whatever_it_is_called():
    from test_models_never_named import _never_named
    for which in ("timesfm", "subclass"):  # simple_eager_attention_forward; a class defined here
        m, forward = _never_named(which)
        with torch.no_grad():
            want = forward()
            with attnswitch.backend("eager", model=m):
                got = forward()
        assert torch.equal(got, want), which
