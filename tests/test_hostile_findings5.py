"""Findings of a fifth hostile review: ``check`` of a workload (what it leaves on the model, whose model it runs), and
a switched model whose attention implementation changed after the switch (``record.widen``).

Each test is named for the promise it shows broken, and fails until the product is fixed. The models are tiny,
with random weights, built from configs; nothing is timed against a clock.
"""

import threading

import pytest
import torch
import torch.nn.functional as F
from conftest import batch_for, tiny

import attnswitch
from attnswitch.errors import UnsupportedModel
from attnswitch.workload import make_workload


class _NoBackward(torch.autograd.Function):
    """SDPA forward, and a backward that cannot run: a kernel written for inference only."""

    @staticmethod
    def forward(ctx, q, k, v, mask, causal, scale):
        return F.scaled_dot_product_attention(q, k, v, mask, 0.0, causal, scale=scale)

    @staticmethod
    def backward(ctx, grad):
        raise NotImplementedError("forward-only kernel: no backward")


def _forward_only(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None):
    return _NoBackward.apply(q, k, v, attn_mask, is_causal, scale)


# -- check of a workload ----------------------------------------------------------------------------------------------

def test_check_of_a_training_step_leaves_the_models_gradients_as_found():
    # check's docstring: "nothing is kept but the verdicts"; docs/python-api.md: check(model, work=<train workload>)
    # runs "a training step's forward and backward in training mode", and the training mode is put back as found.
    # The gradients are not. A model in the middle of gradient accumulation (21 parameters with a .grad), checked
    # with backends=["math", <a kernel whose backward raises>]:
    #   - the model's own step and math's step each end in Workload.step's zero_grad(set_to_none=True): the user's
    #     accumulated gradients are gone (every .grad None);
    #   - the forward-only kernel's backward raises half way (recorded, rightly, as "UNAVAILABLE -
    #     NotImplementedError: forward-only kernel: no backward"), and the gradients the backward had already
    #     accumulated stay on the model: 7 of the 21 parameters hold partial gradients of a step that failed,
    #     which the user's next optimizer.step() applies.
    m = tiny("llama")
    batch = batch_for(m)
    m(**batch).logits.float().square().mean().backward()  # the user's accumulated gradients
    before = {n: p.grad.clone() for n, p in m.named_parameters()}
    work = make_workload(m, batch=2, seq=8, mode="train")
    name = attnswitch.register_backend("fwd-only-h5", _forward_only)
    try:
        result = attnswitch.check(m, work=work, backends=["math", name])
    finally:
        attnswitch.unregister_backend(name)
    assert result["math"].ok and not result[name].ok
    after = {n: p.grad for n, p in m.named_parameters()}
    changed = [n for n in before if after[n] is None or not torch.equal(after[n], before[n])]
    assert not changed, f"{len(changed)} of {len(before)} gradients changed by check: {changed[:4]}"


def test_check_of_a_workload_says_what_the_backend_does_with_the_model_that_runs_it():
    # check(model, work=...) switches ``model`` but runs ``work.step``, which calls ``work.model``. Given a workload
    # made for another model (a reloaded copy, the same weights loaded again in a notebook), every backend ran the
    # workload's model unswitched, and check said
    #   math           ok
    #   cudnn          ok
    # on a CPU, where cudnn runs only on CUDA tensors. compare(model, work) and profile(model, work) run the
    # workload's own model (Target.of), so compare and check disagree on the same arguments. Either refuse a
    # workload of another model, or check the model that runs it.
    if torch.cuda.is_available():
        pytest.skip("needs cudnn to be unavailable: a CPU-only machine")
    m, other = tiny("llama"), tiny("llama")
    work = make_workload(other, batch=2, seq=8)
    try:
        result = attnswitch.check(m, work=work, backends=["math", "cudnn"])
    except ValueError:  # (OptionError too) a workload of another model refused: fine
        return
    assert not result["cudnn"].ok, str(result)


# -- a switched model whose attention implementation changes after the switch ----------------------------------------

def test_a_patched_model_moved_to_sdpa_stays_switched_when_another_models_switch_ends_during_its_forward(spy):
    # docs/promises.md "A model that changes after a switch is switched as it is now" and "Forced means forced".
    # guarded_call widens the model's entries only where the registries lack its keys (keys <= record.INSTALLED),
    # not where its own entries lack them. Model a is loaded eager, patched with math, then moved to sdpa; model b
    # (sdpa) runs in another thread inside backend("naive", model=b), which holds the sdpa entries: a's forward
    # finds sdpa installed and widens nothing. When b's block ends in the middle of a's forward, the last holder of
    # sdpa lets go and the registries are put back: a's layer 1 ran transformers' own sdpa, silently.
    # spy.names == ['math'] (layer 0 only). (On a's first, watched, forward the same thing raised UnsupportedModel
    # "LlamaForCausalLM computes attention outside transformers' attention interface ...:
    # model.layers.1.self_attn (LlamaAttention): scaled_dot_product_attention" -- it computes nothing itself.)
    a, b = tiny("llama"), tiny("llama")
    batch = batch_for(a)
    a.set_attn_implementation("eager")
    attnswitch.patch(a, "math")
    a.set_attn_implementation("sdpa")
    entered, leave, left = threading.Event(), threading.Event(), threading.Event()

    def server():
        with attnswitch.backend("naive", model=b):
            entered.set()
            leave.wait(10)
        left.set()

    t = threading.Thread(target=server)
    t.start()
    hook = None
    try:
        assert entered.wait(10)
        with torch.no_grad():
            a(**batch)  # watched once, while b's block holds sdpa
        assert spy.names == ["math", "math"]
        spy.calls.clear()

        def end_bs_block(module, args, out):
            leave.set()
            left.wait(10)

        hook = a.model.layers[0].register_forward_hook(end_bs_block)
        with torch.no_grad():
            a(**batch)
    finally:
        if hook is not None:
            hook.remove()
        leave.set()
        t.join(10)
        attnswitch.unpatch(a)
    assert spy.names == ["math", "math"]


def test_a_global_switch_switches_a_model_moved_to_an_attention_function_registered_inside_the_block(spy):
    # backend()'s docstring: without model=, "every transformers model on the attention interface that runs in this
    # thread inside the block is switched", and docs/promises.md "A model that changes after a switch is switched
    # as it is now". A global switch takes over the keys registered when it was entered (switch._global_keys);
    # record.widen widens only the entries of the model's own token, so a global entry never learns a key. A model
    # moved inside the block to an attention function registered there (what transformers does when
    # set_attn_implementation loads a hub kernel: it registers the key then) ran a forward that raised
    #   UnsupportedModel: LlamaForCausalLM ran a forward under an attnswitch backend without one attention call
    #   through transformers' attention interface: it computed attention itself, so the switch changed nothing.
    # -- it made every call through the interface; the same key registered before the block is switched.
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    def mine(*args, **kwargs):
        return sdpa_attention_forward(*args, **kwargs)

    m = tiny("llama")
    batch = batch_for(m)
    key = "hostile5-mine"
    try:
        with attnswitch.backend("math"):
            with torch.no_grad():
                m(**batch)
            AttentionInterface.register(key, mine)
            AttentionMaskInterface.register(key, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])
            m.set_attn_implementation(key)
            spy.calls.clear()
            try:
                with torch.no_grad():
                    m(**batch)
            except UnsupportedModel as e:
                pytest.fail(f"refused: {e}")
    finally:
        m.set_attn_implementation("sdpa")
        AttentionInterface._global_mapping.pop(key, None)
        AttentionMaskInterface._global_mapping.pop(key, None)
    assert spy.names == ["math", "math"]
