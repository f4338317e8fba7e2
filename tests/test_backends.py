"""Backends below the switch: PyTorch's eligibility as attnswitch reads it, and the registry."""

import copy
import itertools
import os

import pytest
import torch
import torch.nn.functional as F

import attnswitch
from attnswitch.backends import Call, sdpa


def _inputs(heads_q=4, heads_kv=4, s_q=16, s_kv=16, d=16, dtype=torch.float32, contiguous=True):
    q = torch.randn(2, heads_q, s_q, d, dtype=dtype)
    k = torch.randn(2, heads_kv, s_kv, d, dtype=dtype)
    v = torch.randn(2, heads_kv, s_kv, d, dtype=dtype)
    if not contiguous:
        q = torch.randn(2, heads_q, d, s_q, dtype=dtype).transpose(-1, -2)
    return q, k, v


CASES = list(itertools.product(
    [(4, 4), (4, 2)],  # heads q, kv
    [None, "bool4", "float2", "bad_shape"],  # mask
    [0.0, 0.3],  # dropout
    [False, True],  # causal
    [torch.float32, torch.bfloat16],
    [True, False],  # last dim contiguous
))


@pytest.mark.parametrize("heads, mask, dropout, causal, dtype, contiguous", CASES)
def test_cpu_flash_mirror_agrees_with_sdpas_own_choice(heads, mask, dropout, causal, dtype, contiguous):
    # attnswitch decides CPU flash eligibility without reading the flags: its mirror of PyTorch's checks
    # must say what SDPA's own choice says under the default flags
    q, k, v = _inputs(*heads, dtype=dtype, contiguous=contiguous)
    m = {None: None, "bool4": torch.rand(2, 1, 16, 16) > 0.3, "float2": torch.zeros(16, 16, dtype=dtype),
         "bad_shape": torch.zeros(2, 3, 16, 16, dtype=dtype)}[mask]
    gqa = heads[0] != heads[1]
    call = Call(q, k, v, m, dropout, causal and m is None)
    try:
        choice = int(torch._fused_sdp_choice(q, k, v, m, dropout, call.causal, enable_gqa=gqa))
    except RuntimeError:
        pytest.skip("SDPA refuses these inputs altogether")
    assert (choice == 1) == (not sdpa._cpu_flash_reasons(call, gqa)), sdpa._cpu_flash_reasons(call, gqa)


def test_pytorch_reasons_printed_by_c10_are_read_back(monkeypatch, capfd):
    # can_use_*(params, debug=True) prints its reasons through c10 on the process's stderr
    def can_use(params, debug):
        if debug:
            os.write(2, b"[W1201 11:25:03.5 sdp_utils_cpp.h:262] Warning: Flash Attention does not support "
                        b"non-null attn_mask. (function check_for_attn_mask)\nsomething else entirely\n")
        return False

    monkeypatch.setitem(sdpa._CAN_USE, "flash", can_use)
    monkeypatch.setitem(sdpa._ENABLED, "flash", lambda: True)
    q, k, v = _inputs()
    reasons = sdpa._cuda_reasons("flash", Call(q, k, v, torch.rand(16, 16) > 0.5), False)
    assert reasons == ["Flash Attention does not support non-null attn_mask."]
    assert "something else entirely" in capfd.readouterr().err  # the rest of stderr is not swallowed


def test_without_printed_reasons_the_refusal_is_probed_with_pytorchs_own_check(monkeypatch):
    monkeypatch.setitem(sdpa._CAN_USE, "flash", lambda params, debug: params.attn_mask is None)
    monkeypatch.setitem(sdpa._ENABLED, "flash", lambda: True)
    q, k, v = _inputs()
    reasons = sdpa._cuda_reasons("flash", Call(q, k, v, torch.rand(16, 16) > 0.5), False)
    assert len(reasons) == 1 and "takes no attention mask" in reasons[0]


def test_a_backend_turned_off_in_the_process_is_refused_with_that_reason(monkeypatch):
    monkeypatch.setitem(sdpa._CAN_USE, "cudnn", lambda params, debug: False)
    monkeypatch.setitem(sdpa._ENABLED, "cudnn", lambda: False)
    q, k, v = _inputs()
    (reason,) = sdpa._cuda_reasons("cudnn", Call(q, k, v), False)
    assert "turned off in this process" in reason and "cudnn_sdp_enabled" in reason


def test_auto_choice_names_the_backend_sdpa_takes():
    q, k, v = _inputs()
    assert attnswitch.backends.auto_choice(q, k, v, is_causal=True) == "flash"
    assert attnswitch.backends.auto_choice(q, k, v, dropout_p=0.5) == "math"


def test_fused_outputs_with_sinks_equal_the_softmax_with_a_sink_column():
    q, k, v = _inputs()
    sinks = torch.randn(4)
    ref, _ = attnswitch.backends.run("naive", Call(q, k, v, causal=True, sinks=sinks))
    with torch.no_grad():
        out, _ = attnswitch.backends.run("flash", Call(q, k, v, causal=True, sinks=sinks))
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    plain = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert (plain - ref).abs().max() > 1e-2  # the sinks matter


def test_a_kernel_that_refuses_while_running_is_reported_as_unavailable_with_its_reason():
    from conftest import batch_for, tiny

    from attnswitch.errors import Refused

    def picky(q, k, v, **kw):
        raise Refused("no kernel for these shapes")

    attnswitch.register_backend("picky", picky)
    try:
        m = tiny("llama")
        with pytest.raises(attnswitch.BackendUnavailable, match="no kernel for these shapes") as e, \
                torch.no_grad(), attnswitch.backend("picky", model=m):
            m(**batch_for(m))
        assert e.value.backend == "picky" and e.value.where == "model.layers.0.self_attn"
    finally:
        attnswitch.unregister_backend("picky")


@pytest.mark.parametrize("fn, check, said", [
    (lambda q, k, v, **kw: F.scaled_dot_product_attention(q, k, v, **kw).double(), None,
     "backend 'odd' returned a torch.float64 tensor on cpu for torch.float32 inputs on cpu"),
    (lambda q, k, v, **kw: F.scaled_dot_product_attention(q, k, v, **kw)[..., :4], None,
     "backend 'odd' returned (3, 8, 12, 4); an attention function returns the output tensor"),
    (lambda q, k, v, **kw: F.scaled_dot_product_attention(q, k, v, **kw), lambda *a: 5,
     "backend 'odd': its check returned int 5; a check returns the reasons"),
])
def test_a_registered_kernel_that_breaks_its_contract_is_named_with_what_it_broke(fn, check, said):
    # a float64 output surfaced as o_proj's "expected m1 and m2 to have the same dtype", an int from the check
    # as "'int' object is not iterable"
    from conftest import batch_for, tiny

    attnswitch.register_backend("odd", fn, check=check, gqa=True)
    try:
        m = tiny("llama")
        with pytest.raises((RuntimeError, TypeError)) as e, torch.no_grad(), attnswitch.backend("odd", model=m):
            m(**batch_for(m))
        assert said in str(e.value), str(e.value)
    finally:
        attnswitch.unregister_backend("odd")


def _calls_to_forced(monkeypatch):
    seen = []
    real = sdpa.forced

    def spy(name, call):
        seen.append(name)
        return real(name, call)

    monkeypatch.setattr(sdpa, "forced", spy)
    return seen


@pytest.mark.parametrize("heads", [(4, 4), (4, 2)])
@pytest.mark.parametrize("grad", [False, True])
def test_the_common_call_runs_pytorchs_check_and_op_in_one_step_and_equals_forced(monkeypatch, heads, grad):
    """The runner of a forced backend takes the common call (no mask, softcap or sinks) straight to the
    backend's op after PyTorch's check; its output is ``forced``'s exactly, its gradients too."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, heads[0], 16, 64, generator=g).requires_grad_(grad)
    k, v = (torch.randn(2, heads[1], 16, 64, generator=g).requires_grad_(grad) for _ in range(2))
    call = Call(q, k, v, None, 0.0, True, None)
    run = attnswitch.backends.get("flash").run
    seen = _calls_to_forced(monkeypatch)
    with torch.profiler.profile() as prof:
        out, weights = run(call)
    assert seen == [] and weights is None  # the common call never reached forced
    assert "aten::_scaled_dot_product_flash_attention_for_cpu" in {e.name for e in prof.events()}
    ref, _ = sdpa.forced("flash", call)
    assert seen == ["flash"] and torch.equal(out, ref)
    if grad:
        got = torch.autograd.grad(out.sum(), (q, k, v))
        want = torch.autograd.grad(ref.sum(), (q, k, v))
        assert all(torch.equal(a, b) for a, b in zip(got, want))


def test_every_other_call_goes_to_forced_with_its_checks(monkeypatch):
    q = torch.randn(1, 2, 8, 16)
    mask = torch.ones(8, 8, dtype=torch.bool).tril()
    seen = _calls_to_forced(monkeypatch)
    for name in ("flash", "cudnn", "efficient"):
        run = attnswitch.backends.get(name).run
        if name == "flash":
            out, _ = run(Call(q, q, q, mask))  # a mask: forced, which converts it as SDPA does
            assert torch.allclose(out, F.scaled_dot_product_attention(q, q, q, attn_mask=mask), atol=1e-6)
            with pytest.raises(attnswitch.BackendUnavailable, match="softcap"):
                run(Call(q, q, q, softcap=30.0))
        else:  # CPU tensors: PyTorch's reasons, from forced
            with pytest.raises(attnswitch.BackendUnavailable, match="only on CUDA tensors"):
                run(Call(q, q, q))
    assert seen == ["flash", "flash", "cudnn", "efficient"]


@pytest.mark.parametrize("kv_heads", [3])
@pytest.mark.parametrize("name", ["flash", "math"])
def test_kv_heads_that_do_not_divide_q_heads_get_sdpas_error_not_a_run(name, kv_heads):
    q, kv = torch.randn(2, 4, 5, 8), torch.randn(2, kv_heads, 5, 8)
    with pytest.raises(RuntimeError, match="must divide"):
        attnswitch.backends.get(name).run(Call(q, kv, kv))
    with pytest.raises(RuntimeError):  # (SDPA's own words differ across versions)
        F.scaled_dot_product_attention(q, kv, kv, enable_gqa=True)


def _sdpa_error(*args, **kw):
    with pytest.raises(RuntimeError) as e:
        F.scaled_dot_product_attention(*args, **kw)
    return str(e.value)


@pytest.mark.parametrize("name", ["math", "flash", "naive", "naive-inplace"])
def test_every_backend_gives_sdpas_error_for_dtypes_sdpa_rejects(name):
    q, k, v = _inputs(dtype=torch.bfloat16)
    said = _sdpa_error(q, k.float(), v.float())
    with pytest.raises(RuntimeError, match="Expected query, key, and value to have the same dtype") as e:
        attnswitch.attention(q, k.float(), v.float(), backend=name)
    assert str(e.value).split(",")[0] in said
    keep = torch.rand(2, 1, 16, 16) > 0.3
    for mask in (keep.to(torch.uint8), keep.long(), torch.zeros(2, 1, 16, 16, dtype=torch.float64)):
        said = _sdpa_error(q, k, v, attn_mask=mask)
        with pytest.raises(RuntimeError, match="Expected attn_mask dtype to be bool or float or to match query "
                                               "dtype"):
            attnswitch.attention(q, k, v, attn_mask=mask, backend=name)
        assert "attn_mask dtype" in said


@pytest.mark.parametrize("name", ["math", "naive", "flash", "eager"])
def test_a_model_given_a_mask_sdpa_rejects_gets_the_error_sdpa_gives_it(name):
    from conftest import batch_for, tiny
    m = tiny("llama")
    b = batch_for(m)
    seq = b["input_ids"].shape[1]
    keep = torch.ones(seq, seq, dtype=torch.bool).tril()[None, None].expand(3, 1, seq, seq)
    b["attention_mask"] = keep.to(torch.uint8)  # a 4-d mask: transformers passes it on as it is
    with torch.no_grad():
        with pytest.raises(RuntimeError, match="attn_mask dtype"):
            m(**b)  # transformers' own sdpa: SDPA's error
        ctx = attnswitch.backend(name, model=m)
        if name == "eager":  # transformers' eager adds any mask: the model's own eager does the same
            m.set_attn_implementation("eager")
            want = m(**b).logits
            m.set_attn_implementation("sdpa")
            with ctx:
                assert torch.equal(m(**b).logits, want)
            return
        with ctx, pytest.raises(RuntimeError, match="attn_mask dtype"):
            m(**b)


def test_a_bf16_model_decoding_over_a_float32_cache_gets_sdpas_error_under_math():
    from conftest import tiny
    m = tiny("llama")
    ids = torch.randint(0, 100, (1, 6))
    with torch.no_grad():
        cache = m(ids[:, :5], use_cache=True).past_key_values  # float32 keys and values
        m.to(torch.bfloat16)
        with pytest.raises(RuntimeError, match="same dtype|expected .* dtype|scalar type"):
            m(ids[:, 5:], past_key_values=copy.deepcopy(cache))  # unswitched: SDPA's error
        with attnswitch.backend("math", model=m), pytest.raises(RuntimeError, match="same dtype"):
            m(ids[:, 5:], past_key_values=copy.deepcopy(cache))


def test_a_boolean_mask_is_made_additive_by_one_where_with_no_copy():
    """Both of ``where``'s values are tensors on the mask's device: a Python number was made a CPU tensor that
    ``where`` copied to the GPU (an H100 trace of Gemma 3's sliding layers: a memcpy at every cudnn and
    efficient call). Nothing made inside a trace is kept."""
    from torch.profiler import ProfilerActivity, profile

    from attnswitch.backends.sdpa import _SCALARS, _float_mask

    mask = torch.rand(2, 1, 8, 8) > 0.5
    ref = torch.zeros(mask.shape, dtype=torch.bfloat16).masked_fill(~mask, -65504.0)
    torch.testing.assert_close(_float_mask(mask, torch.bfloat16, -65504.0), ref)
    with profile(activities=[ProfilerActivity.CPU]) as p:
        out = _float_mask(mask, torch.bfloat16, -65504.0)
    torch.testing.assert_close(out, ref)
    ops = [e.name for e in p.events() if e.name.startswith("aten::")]
    assert "aten::where" in ops and not {"aten::to", "aten::_to_copy", "aten::copy_", "aten::scalar_tensor"} & set(ops)
    kept = dict(_SCALARS)
    torch.compile(lambda m: _float_mask(m, torch.float16), backend="eager", fullgraph=True)(mask)
    assert all(not isinstance(t, torch._subclasses.FakeTensor) for t in _SCALARS.values()) and \
        _SCALARS.keys() - kept.keys() <= {(0.0, torch.float16, mask.device), (float("-inf"), torch.float16,
                                                                               mask.device)}
