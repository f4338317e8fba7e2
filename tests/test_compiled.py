"""Forced backends under torch.compile: the forced op is in the compiled graph, a switch is never stale,
threads stay apart, refusals are the eager ones (CPU; aot_eager, and inductor where it matters)."""

import threading

import pytest
import torch
import torch._dynamo.testing
from conftest import batch_for, op_names, output_of, tiny

import attnswitch
from attnswitch.errors import BackendUnavailable

#: ops that name each backend's kernel in a CPU profile (present), and ops that must not be there
OPS = {
    "naive-inplace": ({"attnswitch::opaque", "aten::masked_fill_"}, {"_scaled_dot_product"}),
    "math": ({"attnswitch::opaque", "aten::_scaled_dot_product_attention_math"}, {"flash_attention"}),
    "flash": ({"aten::_scaled_dot_product_flash_attention_for_cpu"}, {"attnswitch::opaque", "attention_math"}),
}
SDPA_OPS = {"aten::_scaled_dot_product_flash_attention_for_cpu"}  # transformers' sdpa on a CPU: SDPA picks flash


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def counter(backend="aot_eager"):
    return torch._dynamo.testing.CompileCounterWithBackend(backend)


def assert_ran(ops, name):
    present, absent = OPS[name]
    assert present <= ops, (name, sorted(o for o in ops if "attn" in o or "dot_product" in o or "masked" in o))
    assert not [o for o in ops for bad in absent if bad in o], (name, sorted(ops))


def forward(m, batch):
    with torch.no_grad():
        return output_of(m(**batch))


@pytest.mark.parametrize("kind", ["llama", "qwen2", "gemma2", "bert"])
@pytest.mark.parametrize("name", ["naive-inplace", "math", "flash"])
def test_fullgraph_compile_runs_the_forced_op_and_matches_uncompiled(kind, name):
    m = tiny(kind)
    batch = batch_for(m, pad=True)
    compiled = torch.compile(m, backend="aot_eager", fullgraph=True)
    with attnswitch.backend(name, model=m):
        try:
            ref = forward(m, batch)
        except BackendUnavailable as e:  # gemma2's softcap: SDPA has none; compiled, the same refusal
            assert kind == "gemma2" and name != "naive-inplace"
            with pytest.raises(BackendUnavailable) as compiled_refusal:
                forward(compiled, batch)
            assert str(compiled_refusal.value) == str(e)
            return
        out = forward(compiled, batch)
        ops = op_names(lambda: forward(compiled, batch))
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    assert_ran(ops, name)


@pytest.mark.slow  # (several compiles: in the slow run, python -m pytest -q -m slow)
def test_a_switch_after_compiling_recompiles_in_both_directions_and_never_replays_the_old_backend():
    import attnswitch.hf  # (its module registration hook, which compiled graphs guard on, installed)

    m = tiny("llama")
    batch = batch_for(m, pad=False)
    cnt = counter()
    compiled = torch.compile(m, backend=cnt, fullgraph=True)  # compiled before any switch
    unswitched = forward(m, batch)
    assert SDPA_OPS <= op_names(lambda: forward(compiled, batch)) and cnt.frame_count == 1
    refs = {}
    for name in ("naive-inplace", "flash", "math"):
        with attnswitch.backend(name, model=m):
            refs[name] = forward(m, batch)
            torch.testing.assert_close(forward(compiled, batch), refs[name], rtol=1e-5, atol=1e-5)
            assert_ran(op_names(lambda: forward(compiled, batch)), name)
    compiles = cnt.frame_count
    assert compiles == 4  # one per selection: nothing, naive-inplace, flash, math
    ops = op_names(lambda: forward(compiled, batch))  # left: transformers' own sdpa again, from the cache
    assert SDPA_OPS <= ops and "attnswitch::opaque" not in ops
    torch.testing.assert_close(forward(compiled, batch), unswitched)
    for name in ("math", "naive-inplace"):  # entering an equal selection again takes its compiled code
        with attnswitch.backend(name, model=m):
            assert_ran(op_names(lambda: forward(compiled, batch)), name)
    assert cnt.frame_count == compiles
    with attnswitch.backend("naive-inplace"), attnswitch.backend("flash", model=m):  # the inner, scoped one wins
        assert_ran(op_names(lambda: forward(compiled, batch)), "flash")
    with attnswitch.backend("math"):  # a global switch
        assert_ran(op_names(lambda: forward(compiled, batch)), "math")


@pytest.mark.slow  # (several compiles: in the slow run, python -m pytest -q -m slow)
def test_a_model_compiled_inside_a_switch_runs_its_own_attention_after_it():
    m = tiny("qwen2")
    batch = batch_for(m, pad=True)
    unswitched = forward(m, batch)
    with attnswitch.backend("naive-inplace", model=m):
        compiled = torch.compile(m, backend="aot_eager", fullgraph=True)
        assert_ran(op_names(lambda: forward(compiled, batch)), "naive-inplace")
    ops = op_names(lambda: forward(compiled, batch))
    assert SDPA_OPS <= ops and "attnswitch::opaque" not in ops
    torch.testing.assert_close(forward(compiled, batch), unswitched)


@pytest.mark.slow  # (several compiles: in the slow run, python -m pytest -q -m slow)
def test_another_model_in_the_context_is_not_switched_by_a_compiled_guard():
    m, other = tiny("llama"), tiny("llama")
    batch = batch_for(m, pad=False)
    c_m, c_other = (torch.compile(x, backend="aot_eager", fullgraph=True) for x in (m, other))
    with attnswitch.backend("naive-inplace", model=m):
        assert_ran(op_names(lambda: forward(c_m, batch)), "naive-inplace")
        ops = op_names(lambda: forward(c_other, batch))
    assert SDPA_OPS <= ops and "attnswitch::opaque" not in ops


def test_a_layer_two_models_share_runs_compiled_the_backend_of_the_model_whose_forward_runs():
    m, other = tiny("llama"), tiny("llama")
    other.model.layers[0] = m.model.layers[0]
    batch = batch_for(m, pad=False)
    compiled = torch.compile(other, backend="aot_eager", fullgraph=True)
    with attnswitch.backend("naive-inplace", model=m):
        ops = op_names(lambda: forward(compiled, batch))  # not named: its own sdpa, the shared layer's too
    assert SDPA_OPS <= ops and "attnswitch::opaque" not in ops
    with attnswitch.backend("flash", model=other), attnswitch.backend("naive-inplace", model=m):
        assert_ran(op_names(lambda: forward(compiled, batch)), "flash")


@pytest.mark.slow  # (several compiles: in the slow run, python -m pytest -q -m slow)
def test_a_patch_and_a_policy_per_phase_are_read_by_the_compiled_code():
    m = tiny("llama")
    batch = batch_for(m, pad=False)
    compiled = torch.compile(m, backend="aot_eager", fullgraph=True)
    attnswitch.patch(m, "math")
    try:
        assert_ran(op_names(lambda: forward(compiled, batch)), "math")
        with attnswitch.backend({"prefill": "flash", "decode": "math"}, model=m):  # a context wins over a patch
            assert_ran(op_names(lambda: forward(compiled, batch)), "flash")
    finally:
        attnswitch.unpatch(m)
    ops = op_names(lambda: forward(compiled, batch))
    assert SDPA_OPS <= ops and "attnswitch::opaque" not in ops


@pytest.mark.slow  # (several compiles: in the slow run, python -m pytest -q -m slow)
def test_compiling_in_one_thread_changes_nothing_another_thread_runs():
    m = tiny("llama")
    batch = batch_for(m, pad=False)
    compiled = torch.compile(m, backend="aot_eager", fullgraph=True)
    unswitched = forward(m, batch)
    with attnswitch.backend("math", model=m):
        math_ref = forward(m, batch)
    inside, done, seen, errors = threading.Event(), threading.Event(), {}, []

    def switched():  # compiles and runs under naive-inplace, and stays inside its context meanwhile
        try:
            with attnswitch.backend("naive-inplace", model=m):
                seen["a"] = op_names(lambda: forward(compiled, batch))
                inside.set()
                done.wait(60)
                seen["a after"] = op_names(lambda: forward(compiled, batch))
        except BaseException as e:
            errors.append(e)
            inside.set()

    t = threading.Thread(target=switched)
    t.start()
    try:
        assert inside.wait(120)
        # this thread, while the other holds its context: the same compiled code runs what is selected here
        torch.testing.assert_close(forward(compiled, batch), unswitched)
        seen["b"] = op_names(lambda: forward(compiled, batch))
        seen["b eager"] = op_names(lambda: forward(m, batch))
        with attnswitch.backend("math", model=m):
            torch.testing.assert_close(forward(compiled, batch), math_ref, rtol=1e-5, atol=1e-5)
            seen["b math"] = op_names(lambda: forward(compiled, batch))
    finally:
        done.set()
        t.join(120)
    assert not errors, errors
    assert_ran(seen["a"], "naive-inplace")
    assert_ran(seen["a after"], "naive-inplace")
    for key in ("b", "b eager"):
        assert SDPA_OPS <= seen[key] and not any("attnswitch" in o or "masked_fill_" in o for o in seen[key]), key
    assert_ran(seen["b math"], "math")



def test_a_switch_entered_in_another_thread_waits_for_a_compile_in_progress():
    """A trace reads the registries a switch writes (while one is held anywhere, every model's call passes
    attnswitch's entries): a switch entered or left elsewhere mid-trace made Dynamo fail its own guard check
    ("Guard failed on the same frame it was created"). Entering waits for the compile to finish instead."""
    m, other = tiny("llama"), tiny("llama")
    batch = batch_for(m, pad=False)
    entered, during = threading.Event(), []

    def enter_elsewhere():
        with attnswitch.backend("math", model=other):
            entered.set()

    def backend(gm, example_inputs):  # runs inside the compile, under Dynamo's lock
        t = threading.Thread(target=enter_elsewhere)
        t.start()
        during.append(entered.wait(3))  # (the switch entered meanwhile: the race; waiting longer only passes more)
        return gm.forward

    compiled = torch.compile(m, backend=backend)
    torch.testing.assert_close(forward(compiled, batch), forward(m, batch))
    assert during and not any(during), "a switch was entered in another thread while this one compiled"
    assert entered.wait(60)
    assert attnswitch.active_backend() is None
@pytest.mark.slow
def test_gradients_through_compiled_forced_backends_match_uncompiled():
    m = tiny("llama").train()
    for p in m.parameters():
        p.requires_grad_(True)
    batch = batch_for(m, pad=True)
    compiled = torch.compile(m, backend="aot_eager", fullgraph=True)
    recomputed = "attnswitch::opaque_backward"
    for name, backward_op in (("flash", "aten::_scaled_dot_product_flash_attention_for_cpu_backward"),
                              ("naive-inplace", recomputed), ("math", recomputed)):
        grads = []
        for model in (m, compiled):
            m.zero_grad()
            with attnswitch.backend(name, model=m):
                output_of(model(**batch)).float().pow(2).mean().backward()
            grads.append({n: p.grad.clone() for n, p in m.named_parameters()})
        for n in grads[0]:
            torch.testing.assert_close(grads[1][n], grads[0][n], rtol=1e-4, atol=1e-5, msg=f"{name} {n}")
        with attnswitch.backend(name, model=m):
            ops = op_names(lambda: output_of(compiled(**batch)).sum().backward())
        assert backward_op in ops, (name, sorted(o for o in ops if "attention" in o or "attnswitch" in o))


def test_attention_dropout_while_training_naive_compiled_is_refused_with_the_reason():
    m = tiny("llama", attention_dropout=0.1).train()
    batch = batch_for(m, pad=False)
    compiled = torch.compile(m, backend="aot_eager", fullgraph=True)
    with attnswitch.backend("naive", model=m), pytest.raises(BackendUnavailable) as e:
        compiled(**batch)
    assert "dropout_p=0.1" in str(e.value) and "model.layers.0.self_attn" in str(e.value)


def test_a_model_that_computes_attention_itself_is_refused_when_compiled():
    m = tiny("gpt2", reorder_and_upcast_attn=True)
    m.set_attn_implementation("eager")
    batch = batch_for(m, pad=False)
    compiled = torch.compile(m, backend="aot_eager")  # (its outer model's call is compiled: the inner's is traced)
    with attnswitch.backend("math", model=m):
        with pytest.raises(attnswitch.UnsupportedModel):
            forward(m, batch)
        with pytest.raises(Exception) as e:
            forward(compiled, batch)
    assert "computes attention itself" in str(e.value)


@pytest.mark.slow
def test_inductor_keeps_the_forced_kernels_and_never_fuses_math_into_sdpa():
    # inductor's attention pattern matcher turns math's decomposed ops into SDPA's flash kernel on a padded
    # BERT: the math backend stays one opaque op, and flash stays flash
    m = tiny("bert")
    batch = batch_for(m, pad=True)
    compiled = torch.compile(m, backend="inductor", fullgraph=True)
    for name in ("math", "flash"):
        with attnswitch.backend(name, model=m):
            ref = forward(m, batch)
            torch.testing.assert_close(forward(compiled, batch), ref, rtol=1e-4, atol=1e-5)
            assert_ran(op_names(lambda: forward(compiled, batch)), name)


def test_layers_compiled_one_by_one_inside_an_eager_forward_follow_the_switch():
    m = tiny("llama")
    batch = batch_for(m, pad=True)
    unswitched = forward(m, batch)
    cnt = counter()
    for layer in m.model.layers:
        layer.compile(backend=cnt, fullgraph=True)
    for name in ("naive-inplace", "flash"):
        with attnswitch.backend(name, model=m):
            assert_ran(op_names(lambda: forward(m, batch)), name)
    assert cnt.frame_count == 4  # one compile per layer (its graph names its attention call) and selection
    torch.testing.assert_close(forward(m, batch), unswitched)
    assert "attnswitch::opaque" not in op_names(lambda: forward(m, batch))


def test_the_bare_attention_call_compiles_with_the_active_backend():
    q = torch.randn(2, 4, 16, 8)
    fn = torch.compile(lambda q: attnswitch.attention(q, q, q, is_causal=True), backend="aot_eager", fullgraph=True)
    for name in ("math", "flash", "naive-inplace"):
        with attnswitch.backend(name):
            ref = attnswitch.attention(q, q, q, is_causal=True)
            torch.testing.assert_close(fn(q), ref)
            assert_ran(op_names(lambda: fn(q)), name)
    ops = op_names(lambda: fn(q))  # no backend: SDPA's own choice (flash on a CPU)
    assert SDPA_OPS <= ops and "attnswitch::opaque" not in ops


def test_auto_refuses_softcap_compiled_as_uncompiled():
    m = tiny("gemma2")
    batch = batch_for(m, pad=False)
    compiled = torch.compile(m, backend="aot_eager", fullgraph=True)
    with attnswitch.backend("auto", model=m):
        with pytest.raises(BackendUnavailable) as eager:
            forward(m, batch)
        with pytest.raises(BackendUnavailable) as comp:
            forward(compiled, batch)
    assert comp.value.reasons == eager.value.reasons and comp.value.where == eager.value.where


def test_the_refusal_op_is_kept_out_of_cuda_graphs():
    # raised inside a CUDA graph's warm-up it would leave inductor's graph trees a half-run node
    from attnswitch.backends import traced  # noqa: F401 (defines the ops)
    assert torch.Tag.cudagraph_unsafe in torch.ops.attnswitch.refuse.default.tags
