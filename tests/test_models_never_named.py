"""A model no switch names runs exactly what it ran before, bit for bit, in every thread, whatever its eager
attention function is called and wherever it lives: while another model's switch holds the ``eager`` key,
and while a global switch is open in another thread."""

import sys
import threading
import types

import pytest
import torch
from conftest import batch_for, output_of, tiny
from transformers import TimesFmConfig, TimesFmModelForPrediction
from transformers.models.llama.modeling_llama import LlamaAttention

import attnswitch


class SubclassedAttention(LlamaAttention):
    """A user's subclass, in a module (this one) that defines no eager attention function."""


def _elsewhere_eager(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
    raise AssertionError("the eager function of the module a class was defined in ran, not the model's own")


#: a module that defines another function under transformers' name
_OTHER = types.ModuleType("attnswitch_test_other_eager")
_OTHER.eager_attention_forward = _elsewhere_eager
sys.modules[_OTHER.__name__] = _OTHER
ElsewhereAttention = type("ElsewhereAttention", (LlamaAttention,), {"__module__": _OTHER.__name__})


def _llama_with(cls):
    m = tiny("llama")
    m.set_attn_implementation("eager")
    for layer in m.model.layers:
        layer.self_attn.__class__ = cls
    return m


def _timesfm():
    torch.manual_seed(0)
    cfg = TimesFmConfig(patch_length=8, context_length=32, horizon_length=8, num_hidden_layers=2, hidden_size=16,
                        intermediate_size=16, head_dim=8, num_attention_heads=2, attn_implementation="eager")
    return TimesFmModelForPrediction(cfg).eval()


def _never_named(which):
    """A model whose eager function is not its module's ``eager_attention_forward``, and its forward."""
    if which == "timesfm":  # transformers' own: simple_eager_attention_forward
        m = _timesfm()
        g = torch.Generator().manual_seed(3)
        series = [torch.randn(32, generator=g), torch.randn(20, generator=g)]
        return m, lambda: m(past_values=series, freq=[0, 0]).mean_predictions
    m = _llama_with(SubclassedAttention if which == "subclass" else ElsewhereAttention)
    b = batch_for(m)
    return m, lambda: output_of(m(**b))


@pytest.mark.parametrize("scope", ["model-scoped", "global in another thread"])
@pytest.mark.parametrize("which", ["subclass", "elsewhere", "timesfm"])
def test_a_model_no_switch_names_runs_exactly_its_own_eager_attention(scope, which, spy):
    m, forward = _never_named(which)
    with torch.no_grad():
        before = forward()
    named = tiny("llama")
    named.set_attn_implementation("eager")  # its switch holds the eager key
    opened, done = threading.Event(), threading.Event()

    def hold_global():
        with attnswitch.backend("naive"):
            opened.set()
            done.wait(30)

    holder = threading.Thread(target=hold_global)
    try:
        if scope == "model-scoped":
            ctx = attnswitch.backend("naive", model=named)
        else:
            holder.start()
            assert opened.wait(30)
            ctx = torch.no_grad()  # nothing opened here: the global switch is the other thread's
        with ctx, torch.no_grad():
            during = forward()
            if scope == "model-scoped":
                named(**batch_for(named))  # the named model is switched meanwhile
    finally:
        done.set()
        if holder.ident is not None:
            holder.join(30)
    assert torch.equal(during, before), (during - before).abs().max()
    assert spy.names == (["naive", "naive"] if scope == "model-scoped" else [])
