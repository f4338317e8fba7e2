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


class _Merging(torch.nn.Linear):
    """An adapter whose eval() merges its update into the weight and train() unmerges it (loralib's Linear)."""

    def __init__(self, lin: torch.nn.Linear):
        super().__init__(lin.in_features, lin.out_features, bias=lin.bias is not None)
        self.weight = lin.weight
        self.bias = lin.bias
        self.A = torch.nn.Parameter(0.1 * torch.randn(2, lin.in_features))
        self.B = torch.nn.Parameter(0.1 * torch.randn(lin.out_features, 2))
        self.merged = False

    def train(self, mode: bool = True):
        super().train(mode)
        if mode == self.merged:  # eval merges, train unmerges
            with torch.no_grad():
                self.weight += (-1 if self.merged else 1) * (self.B @ self.A)
            self.merged = not mode
        return self

    def forward(self, x):
        out = F.linear(x, self.weight, self.bias)
        return out if self.merged else out + x @ self.A.T @ self.B.T


@pytest.mark.parametrize("mode", ["prefill", "train"])
@pytest.mark.parametrize("training", [True, False])
def test_a_module_whose_train_does_work_is_left_as_its_own_train_leaves_it(mode, training):
    # the modes came back by their flags alone: an adapter the measurement's eval() merged stayed merged while
    # flagged training, and the user's next step trained nothing
    m = tiny("llama")
    for layer in m.model.layers:
        layer.self_attn.q_proj = _Merging(layer.self_attn.q_proj)
    m.train(training)
    weights = [layer.self_attn.q_proj.weight.detach().clone() for layer in m.model.layers]
    attnswitch.compare(m, make_workload(m, batch=1, seq=8, mode=mode), backends=["math"], **QUICK)
    for layer, w in zip(m.model.layers, weights):
        q = layer.self_attn.q_proj
        assert q.training == training and q.merged == (not training)
        assert torch.allclose(q.weight, w, atol=1e-6)


def test_an_offloaded_model_whose_weights_accelerate_brings_in_is_measured_not_refused():
    # every parameter on the meta device, its weights in accelerate's hooks: a loaded model that runs
    from accelerate import cpu_offload

    m = tiny("llama")
    batch = batch_for(m)
    cpu_offload(m, execution_device=torch.device("cpu"))
    assert all(p.device.type == "meta" for p in m.parameters())
    assert attnswitch.check(m, **batch, backends=["math"])["math"].ok
    assert attnswitch.profile(m, make_workload(m, seq=8), backends=["math"], **QUICK)["math"].ok


def test_check_of_inputs_runs_as_compare_runs_them_with_dropout_off():
    # check(model, **inputs) ran a model left in training mode with dropout on, and said flash cannot run what
    # compare of the same inputs ran with flash
    m = tiny("llama", attention_dropout=0.5)
    m.train()
    batch = {"input_ids": batch_for(m)["input_ids"]}
    assert attnswitch.check(m, **batch, backends=["flash"])["flash"].ok
    assert attnswitch.compare(m, batch, backends=["flash", "math"], **QUICK)["flash"].ok
    assert m.training


def test_an_adapter_left_training_in_a_model_in_eval_mode_is_left_training_and_unmerged():
    # the model's train() alone, then the flags: the adapter stayed merged (eval's work) while flagged training
    m = tiny("llama")
    m.model.layers[0].self_attn.q_proj = q = _Merging(m.model.layers[0].self_attn.q_proj)
    m.eval()
    q.train()
    weight = q.weight.detach().clone()
    attnswitch.compare(m, make_workload(m, batch=1, seq=8), backends=["math"], **QUICK)
    assert q.training and not q.merged and torch.allclose(q.weight, weight, atol=1e-6) and not m.training


def test_an_offloaded_models_generate_is_compared_numerics_included():
    # the token agreement moved the reference's tokens to the first parameter's device: meta
    from accelerate import cpu_offload

    m = tiny("llama")
    cpu_offload(m, execution_device=torch.device("cpu"))
    work = make_workload(m, batch=1, seq=4, mode="generate", new_tokens=2, prompt_lens=(4,))
    r = attnswitch.compare(m, work, backends=["math"], **QUICK)
    assert r["math"].ok and r["math"].generate.token_agreement == 1.0


def test_weights_never_loaded_are_refused_whatever_hook_holds_no_weights():
    from accelerate import init_empty_weights
    from accelerate.hooks import ModelHook, add_hook_to_module

    with init_empty_weights():
        ghost = tiny("llama")
    add_hook_to_module(ghost, ModelHook())  # (a hook that brings no weights in)
    with pytest.raises(attnswitch.options.OptionError, match="on the meta device"):
        make_workload(ghost, seq=8)
