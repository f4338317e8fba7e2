"""The adapters of third-party kernels (FlashAttention 2 and 3, hub kernels through ``kernels``).

None of these packages is installed here: the ``flash_attn``, ``flash_attn_interface`` and ``kernels``
modules in these tests are FAKES, put into ``sys.modules``. Their functions have the real packages'
call signatures (flash-attn 2.8's and FlashAttention 3's ``flash_attn_func``, ``kernels.get_kernel``)
and compute with plain PyTorch what the real kernels compute (``[b, s, h, d]`` layout, grouped-query
heads, causal masks aligned to the bottom-right corner, softcap), so that the adapters' argument
mapping is checked numerically against the models' own eager attention. The real kernels run only
on GPUs with the packages installed; these tests prove what attnswitch sends them and refuses.
"""

import dataclasses
import importlib.metadata
import sys
import types

import pytest
import torch
from conftest import batch_for, eager_reference, output_of, tiny, valid_positions

import attnswitch
from attnswitch.backends import adapters, registry


def reference(q, k, v, softmax_scale, causal, softcap):
    """What FlashAttention computes, in float32: q [b, s_q, h, d], k/v [b, s_k, h_k, d]."""
    h, hk, sq, sk = q.shape[2], k.shape[2], q.shape[1], k.shape[1]
    qf, kf, vf = (t.float().transpose(1, 2) for t in (q, k, v))
    kf, vf = (t.repeat_interleave(h // hk, 1) for t in (kf, vf))
    s = qf @ kf.transpose(-2, -1) * (q.shape[-1] ** -0.5 if softmax_scale is None else softmax_scale)
    if softcap > 0:
        s = torch.tanh(s / softcap) * softcap
    if causal:  # bottom-right aligned, as FlashAttention's
        s = s.masked_fill(torch.arange(sk)[None] > torch.arange(sq)[:, None] + (sk - sq), float("-inf"))
    return (torch.softmax(s, -1).nan_to_num(0.0) @ vf).transpose(1, 2).to(q.dtype)


def fake_module(name, flash_attn_func, version=None):
    mod = types.ModuleType(name)
    mod.flash_attn_func = flash_attn_func
    mod.calls = []
    if version:
        mod.__version__ = version
    return mod


def fake_fa2(with_softcap=True):
    """flash-attn 2.8's flash_attn_func (2.5 and older: no softcap)."""
    def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                        alibi_slopes=None, deterministic=False, return_attn_probs=False):
        if q.dtype not in (torch.float16, torch.bfloat16):
            raise RuntimeError("FlashAttention only support fp16 and bf16 data type")
        mod.calls.append(dict(q=tuple(q.shape), k=tuple(k.shape), dropout_p=dropout_p, softmax_scale=softmax_scale,
                              causal=causal, softcap=softcap))
        return reference(q, k, v, softmax_scale, causal, softcap)

    def old_flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                            alibi_slopes=None, deterministic=False, return_attn_probs=False):
        return flash_attn_func(q, k, v, dropout_p, softmax_scale, causal)

    mod = fake_module("flash_attn", flash_attn_func if with_softcap else old_flash_attn_func,
                      "2.8.3" if with_softcap else "2.5.9")
    return mod


def fake_fa3(old_build=False):
    """FlashAttention 3's flash_attn_func (hopper/flash_attn_interface.py); old builds returned (out, lse)."""
    def flash_attn_func(q, k, v, softmax_scale=None, causal=False, qv=None, q_descale=None, k_descale=None,
                        v_descale=None, window_size=(-1, -1), attention_chunk=0, softcap=0.0, num_splits=1,
                        pack_gqa=None, deterministic=False, sm_margin=0, return_attn_probs=False):
        mod.calls.append(dict(q=tuple(q.shape), k=tuple(k.shape), softmax_scale=softmax_scale, causal=causal,
                              softcap=softcap))
        out = reference(q, k, v, softmax_scale, causal, softcap)
        lse = torch.zeros(q.shape[0], q.shape[2], q.shape[1])
        return (out, lse) if return_attn_probs or old_build else out

    mod = fake_module("flash_attn_interface", flash_attn_func)
    return mod


@pytest.fixture
def installed(monkeypatch):
    """Put fake modules into sys.modules for the test."""
    def put(name, mod):
        monkeypatch.setitem(sys.modules, name, mod)
        return mod
    return put


@pytest.fixture
def on_cpu():
    """Let a CUDA-only registered kernel take CPU tensors (the fakes compute on any device); each put back as it
    was afterwards, unless the test unregistered it (never registered again behind its back)."""
    saved = {}

    def allow(name):
        b = registry.get(name)
        saved.setdefault(name, b)
        registry.REGISTRY[name] = dataclasses.replace(b, devices=None, run=dataclasses.replace(b.run, devices=None))
    yield allow
    for name, b in saved.items():
        if name in registry.REGISTRY:
            registry.REGISTRY[name] = b


def bf16(kind, **over):
    return tiny(kind, **over).to(torch.bfloat16)


def rel_err(out, ref, where):
    return ((out.float() - ref.float())[where].abs().max() / ref.float()[where].abs().max()).item()


def test_absent_packages_are_not_offered_and_asking_names_the_package(monkeypatch):
    for mod in ("flash_attn", "flash_attn_interface"):
        monkeypatch.setitem(sys.modules, mod, None)  # not importable, whatever is installed
    assert not {"fa2", "fa3"} & set(registry.default_backends("cuda")) and "fa2" not in registry.names(True)
    assert attnswitch.resolve_name("flash_attention_2") == "fa2" and attnswitch.resolve_name("FA3") == "fa3"
    q = torch.randn(1, 2, 4, 16, dtype=torch.bfloat16)
    with pytest.raises(attnswitch.BackendUnavailable) as e:
        attnswitch.attention(q, q, q, backend="flash_attention_2")
    assert e.value.backend == "fa2" and "pip install flash-attn" in e.value.reasons[0]
    m = tiny("llama")
    res = attnswitch.check(m, **batch_for(m), backends=["fa2", "fa3", "naive"])
    assert "flash_attn_interface module, which is not installed" in res["fa3"].reasons[0]
    assert not res["fa2"].ok and res["naive"].ok
    with pytest.raises(ValueError, match="with their packages installed, fa2, fa3"):
        attnswitch.resolve_name("fa4")


def test_an_importable_package_is_offered_and_named_with_its_version(installed):
    installed("flash_attn", fake_fa2())
    assert "fa2" in registry.default_backends("cuda") and "fa2" not in registry.default_backends("cpu")
    assert registry.package_of("fa2") == "flash-attn 2.8.3" and registry.package_of("naive") is None


def test_fa2_matches_eager_with_grouped_heads_and_its_layout(installed, on_cpu):
    fa = installed("flash_attn", fake_fa2())
    on_cpu("fa2")
    m = bf16("llama")  # 8 query heads over 2 key/value heads
    b = batch_for(m, pad=False)
    ref = eager_reference(m, b)
    with torch.no_grad(), attnswitch.backend("fa2", model=m):
        out = output_of(m(**b))
    assert rel_err(out, ref, valid_positions(m, b)) < 2e-2
    call = fa.calls[0]
    assert call["q"] == (3, 12, 8, 8) and call["k"] == (3, 12, 2, 8)  # [b, s, h, d], k/v heads not repeated
    assert call["causal"] is True and call["softmax_scale"] == m.model.layers[0].self_attn.scaling
    with torch.no_grad(), attnswitch.backend("fa2", model=m):  # a decode step: one query, no mask, not causal
        out = m.generate(**b, max_new_tokens=2, do_sample=False, pad_token_id=0)
    assert fa.calls[-1]["q"][1] == 1 and fa.calls[-1]["causal"] is False


def test_fa2_refuses_what_it_would_compute_differently(installed, on_cpu):
    installed("flash_attn", fake_fa2())
    on_cpu("fa2")
    for kind in ("llama", "mistral"):  # a padding mask; a sliding window in the mask
        m = bf16(kind)
        with pytest.raises(attnswitch.BackendUnavailable) as e, torch.no_grad(), attnswitch.backend("fa2", model=m):
            m(**batch_for(m, pad=kind == "llama", seq=12))
        assert "takes no attention mask" in e.value.reasons[0] and e.value.where == "model.layers.0.self_attn"
    q, k = torch.randn(1, 2, 4, 16, dtype=torch.bfloat16), torch.randn(1, 2, 8, 16, dtype=torch.bfloat16)
    with pytest.raises(attnswitch.BackendUnavailable, match="bottom-right corner and SDPA to the top-left"):
        attnswitch.attention(q, k, k, is_causal=True, backend="fa2")
    with pytest.raises(attnswitch.BackendUnavailable, match="float16 or bfloat16, not float32"):
        attnswitch.attention(q.float(), k.float(), k.float(), backend="fa2")
    with pytest.raises(ValueError, match="takes no attention mask"):  # called directly, it refuses too
        adapters.flash_attn_2(q, k, k, attn_mask=torch.ones(4, 8, dtype=torch.bool))
    out = attnswitch.attention(q, k, k, backend="fa2")  # not causal: the same for any alignment
    torch.testing.assert_close(out, torch.nn.functional.scaled_dot_product_attention(q, k, k), atol=1e-2, rtol=1e-2)


def test_softcap_reaches_fa2_or_is_refused_by_an_old_one(installed, on_cpu):
    fa = installed("flash_attn", fake_fa2())
    on_cpu("fa2")
    m = bf16("gemma2", sliding_window=64)  # a window longer than the sequence: no mask, is_causal
    m.set_attn_implementation("eager")
    b = batch_for(m, pad=False)
    ref = eager_reference(m, b)
    with torch.no_grad(), attnswitch.backend("fa2", model=m):
        out = output_of(m(**b))
    assert {c["softcap"] for c in fa.calls} == {5.0} and rel_err(out, ref, valid_positions(m, b)) < 2e-2
    installed("flash_attn", fake_fa2(with_softcap=False))
    with pytest.raises(attnswitch.BackendUnavailable, match="no softcap parameter"), torch.no_grad(), \
            attnswitch.backend("fa2", model=m):
        m(**b)


def test_fa3_matches_eager_refuses_dropout_and_takes_old_builds(installed, on_cpu):
    fa = installed("flash_attn_interface", fake_fa3())
    on_cpu("fa3")
    m = bf16("qwen2")
    b = batch_for(m, pad=False)
    ref = eager_reference(m, b)
    with torch.no_grad(), attnswitch.backend("fa3", model=m):
        out = output_of(m(**b))
    assert rel_err(out, ref, valid_positions(m, b)) < 2e-2 and fa.calls[0]["q"] == (3, 12, 4, 16)
    installed("flash_attn_interface", fake_fa3(old_build=True))  # (out, softmax_lse) always
    with torch.no_grad(), attnswitch.backend("fa3", model=m):
        assert torch.equal(output_of(m(**b)), out)
    train = bf16("llama", attention_dropout=0.5).train()
    with pytest.raises(attnswitch.BackendUnavailable, match="FlashAttention 3 has no dropout"), \
            attnswitch.backend("fa3", model=train):
        train(**batch_for(train, pad=False))


def test_reports_name_the_package_and_its_version(installed, on_cpu):
    installed("flash_attn", fake_fa2())
    on_cpu("fa2")
    m = bf16("llama")
    rep = attnswitch.profile(m, batch_for(m, pad=False), backends=["fa2", "naive"], warmup=0, iters=1, rounds=1)
    assert rep["fa2"].ok and rep["fa2"].package == "flash-attn 2.8.3" and rep["naive"].package is None
    assert "fa2 (flash-attn 2.8.3)" in str(rep)
    padded = attnswitch.profile(m, batch_for(m, pad=True), backends=["fa2"], warmup=0, iters=1, rounds=1)
    assert padded["fa2"].status == "unavailable" and "takes no attention mask" in padded["fa2"].reasons[0]


def test_hub_kernel_through_kernels(installed, on_cpu, monkeypatch):
    loaded = []

    def get_kernel(repo_id, revision=None, version=None, user_agent=None):
        loaded.append((repo_id, revision))
        if repo_id == "nobody/nothing":
            raise FileNotFoundError("404 Client Error: Repository Not Found")
        return fake_fa2() if repo_id.endswith("2") else fake_fa3()

    kernels = types.ModuleType("kernels")
    kernels.get_kernel, kernels.__version__ = get_kernel, "0.11.0"
    before = dict(registry.REGISTRY)
    monkeypatch.setitem(sys.modules, "kernels", None)
    with pytest.raises(attnswitch.BackendUnavailable, match="pip install kernels"):
        attnswitch.backends.register_hub_kernel("kernels-community/flash-attn2")
    installed("kernels", kernels)
    with pytest.raises(attnswitch.BackendUnavailable, match="Repository Not Found"):
        attnswitch.backends.register_hub_kernel("nobody/nothing")
    name = attnswitch.backends.register_hub_kernel("kernels-community/flash-attn2", revision="v2")
    fa3 = attnswitch.backends.register_hub_kernel("kernels-community/vllm-flash-attn3", "hub-fa3")
    try:
        assert (name, loaded[-2]) == ("flash-attn2", ("kernels-community/flash-attn2", "v2"))
        on_cpu(name)
        on_cpu(fa3)
        m = bf16("llama")
        b = batch_for(m, pad=False)
        ref = eager_reference(m, b)
        for n in (name, fa3):
            with torch.no_grad(), attnswitch.backend(n, model=m):
                assert rel_err(output_of(m(**b)), ref, valid_positions(m, b)) < 2e-2
        # the installed distribution's version where there is one (transformers 5.25 requires kernels), else the
        # module's own
        try:
            want = f"kernels {importlib.metadata.version('kernels')}"
        except importlib.metadata.PackageNotFoundError:
            want = "kernels 0.11.0"
        assert registry.package_of(name) == want and "vllm-flash-attn3" in registry.get(fa3).about
    finally:
        attnswitch.unregister_backend(name)
        attnswitch.unregister_backend(fa3)
    assert registry.REGISTRY == before
