"""The CUDA-only backends (efficient, cudnn) and the fused kernels, on real models, bf16.

Run on a GPU machine: ``pytest -m gpu tests/gpu``. Skipped without CUDA.
"""

import threading

import pytest
import torch
from conftest import (
    assert_first_token_agrees,
    batch_for,
    configs,
    eager_greedy,
    eager_reference,
    gpu_events,
    op_names,
    output_of,
    sdpa_flags,
    tiny,
    to_cuda,
    valid_positions,
)

import attnswitch

pytestmark = pytest.mark.gpu

CUDA_OPS = {
    "efficient": "aten::_scaled_dot_product_efficient_attention",
    "cudnn": "aten::_scaled_dot_product_cudnn_attention",
    "flash": "aten::_scaled_dot_product_flash_attention",
    "math": "aten::_scaled_dot_product_attention_math",
}


def cuda_model(kind, **over):
    return tiny(kind, **over).to("cuda", torch.bfloat16)


def kernel_names(fn):
    return [e.name for e in gpu_events(fn) if e.device_type == torch.autograd.DeviceType.CUDA]


@pytest.mark.parametrize("name", ["efficient", "cudnn", "flash", "math"])
def test_forced_cuda_kernel_really_runs(name):
    m = cuda_model("llama")
    b = to_cuda(batch_for(m, pad=False, seq=64))
    with torch.no_grad(), attnswitch.backend(name, model=m):
        ops = op_names(lambda: m(**b))
    assert CUDA_OPS[name] in ops
    for other, op in CUDA_OPS.items():
        if other != name:
            assert op not in ops


@pytest.mark.parametrize("name", ["efficient", "cudnn", "flash", "math"])
def test_forced_cuda_kernel_runs_under_autocast_as_sdpa_would(name):
    # a float32 Llama under autocast: q and k float32 (RoPE), v bfloat16; SDPA's entry casts them, the forced ops
    # are called below autocast, and refused every call before attnswitch cast them too
    m = tiny("llama").to("cuda")
    b = to_cuda(batch_for(m, pad=False, seq=64))
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        ref = output_of(m(**b)).float()
        with attnswitch.backend(name, model=m):
            out = output_of(m(**b)).float()
            ops = op_names(lambda: m(**b))
    assert CUDA_OPS[name] in ops
    torch.testing.assert_close(out, ref, rtol=5e-2, atol=5e-2)


@pytest.mark.parametrize("kind", ["llama", "mistral", "qwen2", "gpt2", "bert", "t5"])
@pytest.mark.parametrize("name", ["efficient", "cudnn"])
def test_bf16_matches_eager(kind, name):
    m = cuda_model(kind)
    b = to_cuda(batch_for(m, seq=64, pad=kind in ("bert", "t5")))
    ref = eager_reference(m, b).float()
    try:
        with torch.no_grad(), attnswitch.backend(name, model=m):
            out = output_of(m(**b)).float()
    except attnswitch.BackendUnavailable as e:  # a refusal must carry PyTorch's reasons
        assert e.backend == name and e.reasons and e.where
        pytest.skip(f"{name} refuses these inputs here: {e.reasons[0]}")
    where = valid_positions(m, b).cuda()
    err = ((out - ref)[where].abs().max() / ref[where].abs().max()).item()
    assert err < 3e-2


def test_efficient_gqa_repeats_kv_and_says_so():
    m = cuda_model("llama")  # 8 query heads, 2 kv heads
    b = to_cuda(batch_for(m, pad=False, seq=64))
    from attnswitch.backends import recording_notes
    with recording_notes() as notes, torch.no_grad(), attnswitch.backend("efficient", model=m):
        m(**b)
    assert any("repeated k/v heads" in n[2] for n in notes)


def test_flash_with_padding_mask_refuses_with_reasons():
    m = cuda_model("llama")
    b = to_cuda(batch_for(m, pad=True, seq=64))
    before = configs(m), sdpa_flags()
    with pytest.raises(attnswitch.BackendUnavailable) as e:
        with torch.no_grad(), attnswitch.backend("flash", model=m):
            m(**b)
    assert e.value.where == "model.layers.0.self_attn"
    assert any("mask" in r.lower() for r in e.value.reasons)
    assert (configs(m), sdpa_flags()) == before


def test_cudnn_and_efficient_refuse_on_cpu_tensors_even_with_cuda_present():
    q = torch.randn(1, 2, 8, 16)
    for name in ("cudnn", "efficient"):
        with pytest.raises(attnswitch.BackendUnavailable, match="only on CUDA"):
            attnswitch.attention(q, q, q, backend=name)


def test_bare_call_one_fused_kernel_each():
    q, k, v = (torch.randn(2, 8, 256, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True)
    for name in ("efficient", "flash", "cudnn"):
        attnswitch.attention(q, k, v, is_causal=True, backend=name)  # warm (plans, modules)
        names = kernel_names(lambda name=name: attnswitch.attention(q, k, v, is_causal=True, backend=name))
        kernels = [n for n in names if not n.startswith(("Memset", "Memcpy"))]
        assert len(kernels) == 1, (name, names)  # (cuDNN also clears a buffer with one Memset)
        assert not any(n.startswith("Memcpy") for n in names)
        out = attnswitch.attention(q, k, v, is_causal=True, backend=name).float()
        assert ((out - ref).abs().max() / ref.abs().max()).item() < 2e-2


def test_naive_has_a_memcpy_that_inplace_does_not():
    q, k, v = (torch.randn(2, 8, 256, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    for name, memcpys in (("naive", 1), ("naive-inplace", 0)):
        attnswitch.attention(q, k, v, is_causal=True, backend=name)
        names = kernel_names(lambda name=name: attnswitch.attention(q, k, v, is_causal=True, backend=name))
        assert sum("Memcpy DtoD" in n for n in names) == memcpys, (name, names)


def test_threads_on_gpu_get_their_own_backend(spy):
    m = cuda_model("llama")
    b = to_cuda(batch_for(m, pad=False, seq=64))
    barrier = threading.Barrier(2)

    def work(name):
        with torch.no_grad(), attnswitch.backend(name, model=m):
            barrier.wait()
            for _ in range(10):
                m(**b)
    ts = [threading.Thread(target=work, args=(n,)) for n in ("cudnn", "efficient")]
    [t.start() for t in ts]
    [t.join() for t in ts]
    seen = {}
    for tid, name, _ in spy.calls:
        seen.setdefault(tid, set()).add(name)
    assert sorted(tuple(s) for s in seen.values()) == [("cudnn",), ("efficient",)]


def test_generate_matches_eager_greedy_bf16():
    m = cuda_model("llama")
    b = to_cuda(batch_for(m, batch=2, seq=8, pad=False))
    ref = eager_greedy(m, b, 4)
    for name in ("cudnn", "efficient", "flash"):
        with attnswitch.backend(name, model=m):
            out = m.generate(**b, max_new_tokens=4, do_sample=False, pad_token_id=0)
        assert_first_token_agrees(out, ref, b)


def test_forced_backends_call_their_own_op_not_sdpas_dispatcher():
    q, k, v = (torch.randn(2, 8, 128, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    for name, op in CUDA_OPS.items():
        ops = op_names(lambda name=name: attnswitch.attention(q, k, v, is_causal=True, backend=name))
        assert op in ops and "aten::scaled_dot_product_attention" not in ops, (name, sorted(ops))


def test_forcing_on_gpu_never_changes_what_another_thread_runs():
    q = torch.randn(1, 8, 256, 64, device="cuda", dtype=torch.bfloat16)
    expected = int(torch._fused_sdp_choice(q, q, q, None, 0.0, True))
    done, seen = threading.Event(), []

    def forced():
        for _ in range(300):
            for name in ("math", "efficient", "flash", "cudnn"):
                attnswitch.attention(q, q, q, is_causal=True, backend=name)
        done.set()

    t = threading.Thread(target=forced)
    t.start()
    while not done.is_set():
        seen.append(int(torch._fused_sdp_choice(q, q, q, None, 0.0, True)))
        torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
    t.join()
    assert len(seen) > 10 and set(seen) == {expected}
    assert sdpa_flags() == (True, True, True, True)


@pytest.mark.parametrize("name", ["flash", "efficient", "cudnn", "naive"])
def test_attention_sinks_on_gpu_match_eager(name):
    from transformers import GptOssConfig, GptOssForCausalLM

    torch.manual_seed(0)
    cfg = GptOssConfig(vocab_size=211, hidden_size=128, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=32, num_local_experts=4,
                       num_experts_per_tok=2, sliding_window=128)  # wider than the inputs: no mask
    m = GptOssForCausalLM(cfg).eval()
    with torch.no_grad():
        for mod in m.modules():
            if hasattr(mod, "sinks"):
                mod.sinks.normal_(0, 2)
    m = m.to("cuda", torch.bfloat16)
    b = to_cuda(batch_for(m, pad=False, seq=32))
    ref = eager_reference(m, b).float()
    try:
        with torch.no_grad(), attnswitch.backend(name, model=m):
            out = output_of(m(**b)).float()
    except attnswitch.BackendUnavailable as e:
        pytest.skip(f"{name} refuses these inputs here: {e.reasons[0]}")
    assert ((out - ref).abs().max() / ref.abs().max()).item() < 3e-2


@pytest.mark.parametrize("name", ["flash", "efficient", "cudnn", "math", "naive"])
def test_training_step_backward_through_forced_kernels(name):
    m = cuda_model("llama")
    b = to_cuda(batch_for(m, pad=False, seq=64))
    m.set_attn_implementation("eager")
    m.zero_grad()
    output_of(m(**b)).float().square().mean().backward()
    ref = {n: p.grad.float().clone() for n, p in m.named_parameters() if p.grad is not None}
    m.set_attn_implementation("sdpa")
    m.zero_grad()
    with attnswitch.backend(name, model=m):
        output_of(m(**b)).float().square().mean().backward()
    for n, p in m.named_parameters():
        if n in ref:
            g = p.grad.float()
            assert torch.isfinite(g).all(), n
            assert ((g - ref[n]).abs().max() / ref[n].abs().max().clamp_min(1e-6)).item() < 0.1, (name, n)


@pytest.mark.parametrize("name", ["efficient", "cudnn", "flash"])
@pytest.mark.parametrize("heads", [(8, 8), (8, 2)])
def test_the_common_call_takes_one_step_to_the_same_op_and_output_as_forced(monkeypatch, name, heads):
    from attnswitch.backends import Call, sdpa

    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(2, heads[0], 256, 64, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_()
    k, v = (torch.randn(2, heads[1], 256, 64, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_()
            for _ in range(2))
    call = Call(q, k, v, None, 0.0, True, None)
    seen, real = [], sdpa.forced
    monkeypatch.setattr(sdpa, "forced", lambda n, c: seen.append(n) or real(n, c))
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        out, _ = attnswitch.backends.get(name).run(call)
    ops = {e.name for e in prof.events()}
    if seen:  # PyTorch's check refused the grouped heads as given: forced repeated them (and said so)
        assert heads[1] != heads[0]
    assert CUDA_OPS[name] in ops and "aten::scaled_dot_product_attention" not in ops
    ref, _ = real(name, call)
    assert torch.equal(out, ref)
    got = torch.autograd.grad(out.float().sum(), (q, k, v))
    want = torch.autograd.grad(ref.float().sum(), (q, k, v))  # (backward kernels may sum in any order)
    assert all(torch.allclose(a.float(), b.float(), rtol=2e-2, atol=2e-2) for a, b in zip(got, want))


@pytest.mark.parametrize("name", ["efficient", "cudnn", "flash"])
@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_a_forwards_common_call_runs_the_forced_kernel_with_the_general_paths_output(monkeypatch, name, kind):
    """A forward's common calls (no padding) go straight to the backend's op: the forced kernel ran, SDPA's
    dispatching op did not, and logits and gradients equal those of the general path (``run_backend``)."""
    from attnswitch.hf import dispatch

    m = cuda_model(kind, head_dim=64)
    b = to_cuda(batch_for(m, pad=False, seq=64))
    common, general = [], []
    real_op, real_run = dispatch.COMMON_OPS[name], dispatch.run_backend

    def step():
        m.zero_grad(set_to_none=True)
        with attnswitch.backend(name, model=m):
            out = output_of(m(**b))
        out.float().square().mean().backward()
        return out, [p.grad.clone() for p in m.parameters() if p.grad is not None]

    monkeypatch.setattr(dispatch, "run_backend", lambda n, c: general.append(n) or real_run(n, c))
    monkeypatch.setitem(dispatch.COMMON_OPS, name, lambda *a: (out := real_op(*a)) is not None and
                        common.append(name) or out)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        got, got_grads = step()
    ops = {e.name for e in prof.events()}
    layers = m.config.num_hidden_layers
    if common:
        assert common == [name] * layers and general == []
    else:  # PyTorch's check refused the grouped heads as given (efficient): the general path repeated them
        assert name == "efficient" and m.config.num_key_value_heads != m.config.num_attention_heads
        assert general == [name] * layers
    assert CUDA_OPS[name] in ops and "aten::scaled_dot_product_attention" not in ops
    general.clear()
    monkeypatch.setattr(dispatch, "COMMON_OPS", {})  # the general path
    want, want_grads = step()
    assert general == [name] * layers
    assert torch.equal(got, want)
    assert all(torch.allclose(a.float(), c.float(), rtol=2e-2, atol=2e-2) for a, c in zip(got_grads, want_grads))
