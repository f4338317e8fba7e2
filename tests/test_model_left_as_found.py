"""What a measurement leaves on the user's model: every module's mode and every parameter's gradient as found,
after a finished comparison and an interrupted one; inference workloads measured with dropout off, and the output
check made with dropout off whatever mode the model was left in.

The models are tiny, with random weights, built from configs; nothing is timed against a clock.
"""

import pytest
import torch
import torch.nn.functional as F
from conftest import batch_for, tiny

import attnswitch
from attnswitch.workload import make_workload

QUICK = dict(iters=1, rounds=1, time_budget_s=0)


def _accumulated(m) -> dict:
    """The user's gradients, in the middle of an accumulation: one tensor per parameter."""
    m(**batch_for(m)).logits.float().square().mean().backward()
    return {n: p.grad.clone() for n, p in m.named_parameters()}


def _changed(m, before: dict) -> list[str]:
    return [n for n, p in m.named_parameters() if p.grad is None or not torch.equal(p.grad, before[n])]


@pytest.mark.parametrize("call", ["profile", "compare", "compare_sweep"])
def test_a_training_comparison_leaves_the_users_gradients_and_modes_as_found(call):
    # each training step's backward adds into .grad and ends with zero_grad(set_to_none=True): before, every
    # gradient the user had accumulated was gone (None) after the comparison
    m = tiny("llama")
    before = _accumulated(m)
    m.model.layers[0].train()  # (a mix of modes, put back module by module)
    modes = {n: x.training for n, x in m.named_modules()}
    work = make_workload(m, batch=2, seq=8, mode="train")
    if call == "compare_sweep":
        attnswitch.compare_sweep(m, [(1, 8)], mode="train", backends=["math", "naive"], **QUICK)
    else:
        getattr(attnswitch, call)(m, work, backends=["math", "naive"], **QUICK)
    assert not _changed(m, before)
    assert {n: x.training for n, x in m.named_modules()} == modes


def test_an_interrupted_training_comparison_leaves_none_of_its_gradients_behind():
    # Ctrl-C in a backward: the comparison's partial gradients would be applied by the user's next optimizer step
    m = tiny("llama")
    before = _accumulated(m)
    calls = []

    def interrupt(g):
        calls.append(1)
        if len(calls) == 4:  # (in the second backward: the first is the user's own, above)
            raise KeyboardInterrupt
        return g

    hook = m.model.embed_tokens.weight.register_hook(interrupt)
    try:
        with pytest.raises(KeyboardInterrupt):
            attnswitch.compare(m, make_workload(m, batch=2, seq=8, mode="train"), backends=["math", "naive"], **QUICK)
    finally:
        hook.remove()
    assert len(calls) == 4 and not _changed(m, before)


def _scaled_wrong(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """Attention off by half: a kernel numerics must reject."""
    return 1.5 * F.scaled_dot_product_attention(q, k, v, attn_mask, dropout_p, is_causal, scale=scale,
                                                enable_gqa=enable_gqa)


@pytest.mark.parametrize("mode", ["prefill", "train"])
def test_a_wrong_kernel_fails_numerics_on_a_model_left_in_training_mode_with_dropout(mode):
    # with dropout on in the reference and the candidates, eager's own error (the tolerance's floor: twice it) grew
    # with the dropout noise: the kernel off by half passed (error 0.51 against a tolerance of 0.93) and was picked
    m = tiny("llama", attention_dropout=0.5)
    m.train()
    name = attnswitch.register_backend("off-by-half", _scaled_wrong, gqa=True)
    try:
        r = attnswitch.compare(m, make_workload(m, batch=2, seq=8, mode=mode), backends=[name, "math"], **QUICK)
    finally:
        attnswitch.unregister_backend(name)
    assert r["math"].numerics.ok and r["math"].numerics.max_rel_err < 1e-4
    assert not r[name].numerics.ok and r[name].numerics.tolerance < 1e-3 and r.pick != name
    assert m.training and all(x.training for x in m.modules())  # (its modes as found)


def test_inference_workloads_run_with_dropout_off_and_a_training_step_with_dropout_as_configured():
    # a model built from its config is in training mode: a prefill measured as found would time dropout's
    # kernels, which inference does not run
    m = tiny("llama", attention_dropout=0.5)
    m.train()
    seen = []

    def recording(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        seen.append(dropout_p)
        return F.scaled_dot_product_attention(q, k, v, attn_mask, dropout_p, is_causal, scale=scale,
                                              enable_gqa=enable_gqa)

    name = attnswitch.register_backend("recording", recording, gqa=True)
    try:
        for mode, want in (("prefill", {0.0}), ("decode", {0.0}), ("train", {0.5})):
            seen.clear()
            attnswitch.profile(m, make_workload(m, batch=1, seq=8, mode=mode), backends=[name], **QUICK)
            assert set(seen) == want, (mode, set(seen))
    finally:
        attnswitch.unregister_backend(name)
    assert m.training
