"""Each backend against the model's own transformers eager attention, on real architectures."""

import pytest
import torch
from conftest import batch_for, eager_greedy, eager_reference, output_of, tiny, valid_positions

import attnswitch

CPU_BACKENDS = ["naive", "naive-inplace", "math", "flash"]
MODELS = ["llama", "mistral", "qwen2", "gpt2", "bert", "t5"]


def rel_err(out, ref, where):
    return ((out - ref)[where].abs().max() / ref[where].abs().max()).item()


@pytest.fixture(scope="module")
def cases():
    out = {}
    for kind in MODELS:
        m = tiny(kind)
        # mistral: sequences longer than its 5-token window, so the window really masks
        b = batch_for(m, seq=12)
        out[kind] = (m, b, eager_reference(m, b))
    return out


@pytest.mark.parametrize("kind", MODELS)
@pytest.mark.parametrize("name", CPU_BACKENDS)
def test_fp32_matches_eager(cases, kind, name):
    m, b, ref = cases[kind]
    with torch.no_grad(), attnswitch.backend(name, model=m):
        out = output_of(m(**b))
    assert rel_err(out, ref, valid_positions(m, b)) < 1e-5


@pytest.mark.parametrize("name", CPU_BACKENDS)
def test_global_switch_matches_eager(cases, name):
    m, b, ref = cases["llama"]
    with torch.no_grad(), attnswitch.backend(name):
        out = output_of(m(**b))
    assert rel_err(out, ref, valid_positions(m, b)) < 1e-5


@pytest.mark.parametrize("name", CPU_BACKENDS)
def test_bf16_within_bf16_tolerance(name):
    m = tiny("llama").to(torch.bfloat16)
    b = batch_for(m)
    ref = eager_reference(m, b).float()
    with torch.no_grad(), attnswitch.backend(name, model=m):
        out = output_of(m(**b)).float()
    assert rel_err(out, ref, valid_positions(m, b)) < 2e-2


def test_sliding_window_is_honoured():
    # with a window of 5 and 12 tokens, full causal attention would give other outputs
    m = tiny("mistral")
    b = batch_for(m, pad=False)
    ref = eager_reference(m, b)
    full = tiny("mistral", sliding_window=None)
    full_out = eager_reference(full, b)
    assert (ref - full_out).abs().max() > 1e-3
    with torch.no_grad(), attnswitch.backend("naive", model=m):
        out = output_of(m(**b))
    assert rel_err(out, ref, valid_positions(m, b)) < 1e-5


def test_softcap_naive_matches_eager_and_sdpa_refuses():
    m = tiny("gemma2")
    m.set_attn_implementation("eager")  # Gemma 2's own choice for softcapping
    b = batch_for(m, pad=False)
    ref = eager_reference(m, b)
    with torch.no_grad(), attnswitch.backend("naive", model=m):
        out = output_of(m(**b))
    assert rel_err(out, ref, valid_positions(m, b)) < 1e-5
    with pytest.raises(attnswitch.BackendUnavailable, match="softcap") as e:
        with torch.no_grad(), attnswitch.backend("math", model=m):
            m(**b)
    assert e.value.where == "model.layers.0.self_attn"
    assert m.config._attn_implementation == "eager"


def test_eager_backend_is_the_models_own(cases):
    m, b, ref = cases["gpt2"]
    with torch.no_grad(), attnswitch.backend("eager", model=m):
        out = output_of(m(**b))
    assert torch.equal(out[valid_positions(m, b)], ref[valid_positions(m, b)])


@pytest.mark.parametrize("name", CPU_BACKENDS + ["eager", "auto"])
def test_generate_with_kv_cache_matches_eager(name):
    m = tiny("llama")
    b = batch_for(m, batch=2, seq=6)
    ref = eager_greedy(m, b, 6)
    with attnswitch.backend(name, model=m):
        out = m.generate(**b, max_new_tokens=6, do_sample=False, pad_token_id=0)
    assert torch.equal(out, ref)


def test_output_attentions_weights_from_naive_match_eager():
    m = tiny("llama")
    b = batch_for(m, pad=False)
    m.set_attn_implementation("eager")
    with torch.no_grad():
        ref = m(**b, output_attentions=True).attentions
    m.set_attn_implementation("sdpa")
    with torch.no_grad(), attnswitch.backend("naive-inplace", model=m):
        got = m(**b, output_attentions=True).attentions
    assert len(got) == len(ref)
    for g, r in zip(got, ref):
        torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-6)
    with torch.no_grad(), attnswitch.backend("math", model=m):  # SDPA's math op returns its weights too
        got = m(**b, output_attentions=True).attentions
    for g, r in zip(got, ref):
        torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-6)
    with torch.no_grad(), attnswitch.backend("flash", model=m), pytest.warns(UserWarning, match="weights"):
        out = m(**b, output_attentions=True)
    assert all(a is None for a in out.attentions)


def test_flash_on_cpu_refuses_dropout_with_pytorchs_reason():
    m = tiny("llama", attention_dropout=0.5).train()
    with pytest.raises(attnswitch.BackendUnavailable) as e, attnswitch.backend("flash", model=m):
        m(**batch_for(m, pad=False))
    assert any("dropout" in r for r in e.value.reasons)
    assert not any("Triggered internally" in r for r in e.value.reasons)


@pytest.mark.parametrize("name", ["naive", "naive-inplace", "math"])
def test_dropout_applies_in_training_mode_only(name):
    m = tiny("llama", attention_dropout=0.5)
    b = batch_for(m, pad=False)
    with torch.no_grad(), attnswitch.backend(name, model=m):
        m.eval()
        e1, e2 = output_of(m(**b)), output_of(m(**b))
        m.train()
        t1, t2 = output_of(m(**b)), output_of(m(**b))
    m.eval()
    assert torch.equal(e1, e2)
    assert not torch.allclose(t1, t2)
    assert not torch.allclose(t1, e1)


def test_cross_attention_t5_is_switched(cases, spy, monkeypatch):
    m, b, _ = cases["t5"]
    from attnswitch.hf import dispatch
    shapes = []
    inner = dispatch.run_backend

    def record(name, call):
        shapes.append((call.q.shape[2], call.k.shape[2]))
        return inner(name, call)

    monkeypatch.setattr(dispatch, "run_backend", record)
    with torch.no_grad(), attnswitch.backend("math", model=m):
        m(**b)
    wheres = {w for _, _, w in spy.calls}
    assert any("EncDecAttention" in w for w in wheres)  # cross attention: 9 queries over 12 keys
    assert any(sq == 9 and skv == 12 for sq, skv in shapes)
    assert any("encoder" in w for w in wheres) and any("decoder" in w for w in wheres)


def test_a_gradient_that_is_zero_up_to_rounding_is_measured_against_a_typical_one():
    """A key projection's bias has no gradient (softmax ignores a constant added to a row's scores): both
    gradients are rounding noise, whose ratio failed correct backends of BERT's training step. A small true
    gradient (a query weight's) keeps its own relative error."""
    from attnswitch.numerics import _grad_error
    torch.manual_seed(0)
    ref = {"dense.weight": torch.randn(64, 64), "key.bias": 1e-10 * torch.randn(64),
           "query.weight": 1e-3 * torch.randn(64, 64)}
    got = {n: r.clone() for n, r in ref.items()}
    got["key.bias"] = 1e-10 * torch.randn(64)  # other noise: 1.4x its norm apart
    err, worst, _ = _grad_error(got, ref)
    assert err < 1e-8, (err, worst)
    got["query.weight"] = ref["query.weight"] * 1.1  # 10 % off, on a gradient a thousandth of the typical one
    err, worst, _ = _grad_error(got, ref)
    assert worst == "query.weight" and err == pytest.approx(0.1, rel=1e-3)


@pytest.mark.parametrize("name", ["naive", "naive-inplace", "math", "flash"])
def test_under_autocast_every_forced_backend_runs_as_sdpa_would(name, monkeypatch):
    """Under torch.autocast Llama's q and k stay float32 (RoPE's float32 cos and sin) while v is bfloat16, and on
    CUDA all three may be float32: SDPA's own entry casts them, the forced ops (below autocast) refused every
    call as of mixed dtypes, and flash and cudnn refused float32."""
    from conftest import op_names

    from attnswitch.hf import dispatch

    dtypes = []
    real = dispatch.run_backend
    monkeypatch.setattr(dispatch, "run_backend", lambda n, call: (dtypes.append({call.q.dtype, call.k.dtype,
                                                                                 call.v.dtype}), real(n, call))[1])
    m = tiny("llama")
    b = batch_for(m, pad=True)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        ref = output_of(m(**b)).float()  # the model's own sdpa, as autocast runs it
        with attnswitch.backend(name, model=m):
            out = output_of(m(**b)).float()
            ops = op_names(lambda: m(**b))
    torch.testing.assert_close(out, ref, rtol=5e-2, atol=5e-2)
    assert dtypes and all(d == {torch.bfloat16} for d in dtypes)  # every call, the common one too
    assert {"naive": "aten::masked_fill", "naive-inplace": "aten::masked_fill_", "flash":
            "aten::_scaled_dot_product_flash_attention_for_cpu", "math": "aten::_scaled_dot_product_attention_math"
            }[name] in ops
    m.train()
    with torch.autocast("cpu", dtype=torch.bfloat16), attnswitch.backend(name, model=m):
        loss = m(**b, labels=b["input_ids"]).loss
    loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in m.parameters() if p.grad is not None)


def test_under_autocast_a_float64_model_and_a_bare_call_run_as_sdpa_would():
    # autocast never casts float64 (a float64 model ran float64 before, and must still); the bare call refused
    # float32 q and k beside a bfloat16 v, which SDPA takes under autocast
    m = tiny("llama").double()
    b = batch_for(m, pad=False)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        ref = output_of(m(**b))
        for name in ("naive", "math", "flash"):
            with attnswitch.backend(name, model=m):
                out = output_of(m(**b))
            assert out.dtype == torch.float64
            torch.testing.assert_close(out, ref)
        q, k = torch.randn(2, 4, 8, 16), torch.randn(2, 4, 8, 16)
        v = torch.randn(2, 4, 8, 16).bfloat16()
        want = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        for name in ("auto", "math", "flash", "naive"):
            got = attnswitch.attention(q, k, v, is_causal=True, backend=name)
            assert got.dtype == want.dtype == torch.bfloat16
            torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2)
