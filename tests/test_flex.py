"""FlexAttention as a backend, and kernels a user registers, on CPU.

The built-in ``flex`` runs compiled on CUDA only (compiling it for CPUs takes 35-47 s per kind of call);
here its mask and score_mod construction runs through ``flex_sdpa(compiled=False)``, PyTorch's unfused
reference of the same block masks and score_mods, registered as a user's backend, and its compile path
(one compiled entry per kind of call, dynamic shapes) runs with Dynamo and the ``aot_eager`` backend.
"""

import functools
import gc
import importlib.metadata

import pytest
import torch
from conftest import batch_for, eager_greedy, eager_reference, output_of, tiny, valid_positions
from torch._dynamo.backends.debugging import aot_eager

import attnswitch
from attnswitch.backends import flex, recording_notes, registry
from attnswitch.cli import main
from attnswitch.models import load_model
from attnswitch.workload import make_workload

pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")


def rel_err(out, ref, where):
    return ((out - ref)[where].abs().max() / ref[where].abs().max()).item()


def registry_state():
    return dict(registry.REGISTRY), dict(registry._ALIASES)


@pytest.fixture(scope="module")
def flex_ref():
    """flex's own construction, run by PyTorch's unfused FlexAttention (no compile)."""
    before = registry_state()
    name = attnswitch.register_backend("flex-ref", functools.partial(flex.flex_sdpa, compiled=False),
                                       check=flex.flex_check, gqa=flex.takes_gqa, softcap=True,
                                       about="flex, unfused")
    yield name
    attnswitch.unregister_backend(name)
    assert registry_state() == before


def plain_attention(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """A user's attention in plain PyTorch, with SDPA's semantics (fully masked rows give 0)."""
    if enable_gqa:
        k, v = (t.repeat_interleave(q.shape[1] // t.shape[1], 1) for t in (k, v))
    s = q @ k.transpose(-2, -1) * (q.shape[-1] ** -0.5 if scale is None else scale)
    if is_causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).triu(1), float("-inf"))
    if attn_mask is not None:
        s = s.masked_fill(~attn_mask, float("-inf")) if attn_mask.dtype == torch.bool else s + attn_mask
    return torch.softmax(s, -1).nan_to_num(0.0) @ v


class Recorder:
    """A user's kernel that records what it was given."""

    def __init__(self, fn=plain_attention):
        self.fn, self.calls = fn, []

    def __call__(self, q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, **kw):
        self.calls.append({"q": tuple(q.shape), "k": tuple(k.shape), **kw})
        return self.fn(q, k, v, attn_mask, dropout_p, is_causal, scale, kw.get("enable_gqa", False))


@pytest.fixture
def mine():
    before = registry_state()
    rec = Recorder()
    attnswitch.register_backend("mine", rec, gqa=True, package="torch")
    yield rec
    attnswitch.unregister_backend("mine")
    assert registry_state() == before


# -- flex: masks, score_mods, softcap against the models' own eager attention -------------------------

CASES = {  # architecture, padded batch
    "llama": ("llama", True),  # GQA (8 query heads over 2), left padding
    "llama-causal": ("llama", False),  # is_causal, no mask
    "mistral": ("mistral", True),  # sliding window 5 in the mask, 12 tokens
    "gemma2": ("gemma2", True),  # softcap 5.0, sliding and global layers
    "t5": ("t5", True),  # position bias as an additive mask; encoder, decoder, cross attention
    "bert": ("bert", True),  # bidirectional, right padding
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_flex_matches_eager(flex_ref, case):
    kind, pad = CASES[case]
    m = tiny(kind)
    if kind == "gemma2":
        m.set_attn_implementation("eager")  # Gemma 2's own choice for softcapping
    b = batch_for(m, pad=pad)
    ref = eager_reference(m, b)
    with torch.no_grad(), attnswitch.backend(flex_ref, model=m):
        out = output_of(m(**b))
    assert rel_err(out, ref, valid_positions(m, b)) < 1e-5


def test_softcap_reaches_flex_and_matters(flex_ref, monkeypatch):
    m = tiny("gemma2", attn_logit_softcapping=0.05)  # a cap small enough to change tiny models' logits
    m.set_attn_implementation("eager")
    b = batch_for(m, pad=True)
    caps = []
    real = flex._softcap_mod
    monkeypatch.setattr(flex, "_softcap_mod", lambda cap: caps.append(cap) or real(cap))
    with torch.no_grad(), attnswitch.backend(flex_ref, model=m):
        out = output_of(m(**b))
    ref = eager_reference(m, b)
    assert caps == [0.05, 0.05]  # both layers: a global one (is_causal) and a sliding one (bool mask)
    assert rel_err(out, ref, valid_positions(m, b)) < 1e-5
    uncapped = tiny("gemma2", attn_logit_softcapping=None)
    uncapped.set_attn_implementation("eager")
    # the cap moves the result 30x beyond the tolerance flex is held to
    assert rel_err(eager_reference(uncapped, b), ref, valid_positions(m, b)) > 1e-4


def test_fully_masked_rows_give_zero_as_sdpa(flex_ref):
    q, k, v = (torch.randn(2, 4, 8, 16) for _ in range(3))
    mask = torch.ones(2, 1, 8, 8, dtype=torch.bool)
    mask[1, :, :3] = False  # three query rows that attend to nothing
    out = attnswitch.attention(q, k, v, attn_mask=mask, backend=flex_ref)
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert torch.equal(out[1, :, :3], torch.zeros_like(out[1, :, :3]))
    torch.testing.assert_close(out, ref)
    causal = attnswitch.attention(q, k[:, :, :5], v[:, :, :5], is_causal=True, backend=flex_ref)  # top-left, as SDPA
    torch.testing.assert_close(causal, torch.nn.functional.scaled_dot_product_attention(q, k[:, :, :5], v[:, :, :5],
                                                                                        is_causal=True))


def test_one_block_mask_per_forward_freed_with_its_mask(flex_ref, monkeypatch):
    m = tiny("llama")  # 2 layers share transformers' mask tensor
    b = batch_for(m, pad=True)
    built = []
    real = flex.create_block_mask
    monkeypatch.setattr(flex, "create_block_mask", lambda *a, **kw: built.append(a[1:5]) or real(*a, **kw))
    flex.clear_caches()
    with torch.no_grad(), attnswitch.backend(flex_ref, model=m):
        m(**b)
        assert len(built) == 1 and built[0] == (3, 1, 12, 12)  # batch 3, heads broadcast, 12 x 12
        m(**b)  # a new forward, a new mask tensor
    assert len(built) == 2
    gc.collect()
    assert flex.cache_info()["masks"] == 0  # nothing held once transformers dropped its masks


def test_causal_block_masks_are_cached_and_bounded():
    flex.clear_caches()
    first = flex._causal_block_mask(16, 16, torch.device("cpu"))
    assert flex._causal_block_mask(16, 16, torch.device("cpu")) is first
    for n in range(1, flex.CAUSAL_CACHE + 10):
        flex._causal_block_mask(n, n, torch.device("cpu"))
    assert flex.cache_info()["causal"] == flex.CAUSAL_CACHE
    assert flex._causal_block_mask(16, 16, torch.device("cpu")) is not first  # the oldest went first


def _counting_flex(monkeypatch) -> tuple[list, str]:
    """flex compiled on Dynamo with aot_eager (no C++ or Triton build), registered as ``flex-compiled``: the
    graphs it compiles, appended as they are, and its name (the caller unregisters it)."""
    graphs = []

    def counting(gm, example_inputs):
        graphs.append(gm)
        return aot_eager(gm, example_inputs)

    monkeypatch.setattr(flex, "_COMPILED", {})
    monkeypatch.setattr(flex, "_compile", lambda fn: torch.compile(fn, fullgraph=True, backend=counting))
    return graphs, attnswitch.register_backend("flex-compiled", flex.flex_sdpa, gqa=flex.takes_gqa, softcap=True)


def test_compiled_once_per_kind_of_call(monkeypatch):
    """The compile path with Dynamo (aot_eager instead of inductor: no C++ or Triton build): one entry
    per kind of call, a second forward compiles nothing, a new length at most once more."""
    graphs, name = _counting_flex(monkeypatch)
    try:
        m = tiny("llama")
        ref = eager_reference(m, batch_for(m, pad=True))
        with torch.no_grad(), attnswitch.backend(name, model=m):
            out = output_of(m(**batch_for(m, pad=True)))
            first = len(graphs)
            assert first == 1  # both layers' calls: one kind (a boolean mask), one graph
            m(**batch_for(m, pad=True, seed=2))
            assert len(graphs) == first  # same kind, same shapes: nothing compiled
            m(**batch_for(m, pad=False))  # is_causal: another kind, its own entry
            m(**batch_for(m, pad=True, seq=20))  # a new length: dynamic from now on
            m(**batch_for(m, pad=True, seq=28))
        assert flex.cache_info()["compiled"] == 2
        assert 2 <= len(graphs) <= 4, len(graphs)  # + the causal kind, + at most one for the new lengths
        assert rel_err(out, ref, valid_positions(m, batch_for(m))) < 1e-5
    finally:
        attnswitch.unregister_backend(name)


def test_builtin_flex_is_cuda_only_with_reasons_and_cannot_be_replaced():
    m = tiny("llama")
    with pytest.raises(attnswitch.BackendUnavailable) as e, attnswitch.backend("flex", model=m):
        m(**batch_for(m))
    assert "cuda" in e.value.reasons[0] and e.value.where == "model.layers.0.self_attn"
    assert "flex" not in registry.default_backends("cpu") and "flex" in registry.default_backends("cuda")
    assert "CUDA only" in registry.get("flex").about and attnswitch.resolve_name("flex_attention") == "flex"
    before = registry_state()
    with pytest.raises(ValueError, match="built in"):
        attnswitch.unregister_backend("flex")
    for taken in ("flex", "flex_attention", "naive", "sdpa"):
        with pytest.raises(ValueError, match="built-in"):
            attnswitch.register_backend(taken, plain_attention)
    assert registry_state() == before


def test_flex_check_reasons():
    q = torch.zeros(1, 2, 4, 8, dtype=torch.float64)
    reasons = flex.flex_check(q, q, q, dropout_p=0.1)
    assert any("dropout" in r for r in reasons) and any("float64" in r for r in reasons)
    g = torch.zeros(1, 2, 4, 8, requires_grad=True)
    assert any("backward" in r for r in flex.flex_check(g, g, g))
    assert flex.takes_gqa(torch.zeros(1, 8, 1, 1), None) and not flex.takes_gqa(torch.zeros(1, 12, 1, 1), None)


# -- a user's kernel, everywhere a backend name is taken ---------------------------------------------

def test_registered_kernel_in_backend_and_patch(mine, spy):
    m = tiny("llama")
    b = batch_for(m)
    ref = eager_reference(m, b)
    with torch.no_grad(), attnswitch.backend("mine"):  # global
        out = output_of(m(**b))
    assert rel_err(out, ref, valid_positions(m, b)) < 1e-5
    assert len(mine.calls) == 2 and set(spy.names) == {"mine"}
    attnswitch.patch(m, "MINE")
    try:
        with torch.no_grad():
            out = output_of(m(**b))
    finally:
        attnswitch.unpatch(m)
    assert len(mine.calls) == 4 and rel_err(out, ref, valid_positions(m, b)) < 1e-5


def test_gqa_declared_gets_grouped_heads_else_repeated_with_a_note(mine):
    m = tiny("llama")  # 8 query heads, 2 key/value heads
    b = batch_for(m, pad=False)
    with recording_notes() as notes, torch.no_grad(), attnswitch.backend("mine", model=m):
        m(**b)
    assert mine.calls[0]["k"][1] == 2 and mine.calls[0]["enable_gqa"] is True and not notes
    rec = Recorder()
    attnswitch.register_backend("mine-mha", rec)  # declares no grouped-query support
    try:
        with recording_notes() as notes, torch.no_grad(), attnswitch.backend("mine-mha", model=m):
            out = output_of(m(**b))
    finally:
        attnswitch.unregister_backend("mine-mha")
    assert rec.calls[0]["k"][1] == 8 and "enable_gqa" not in rec.calls[0]
    assert any("repeated k/v heads x4" in n[2] and n[0] == "mine-mha" for n in notes)
    assert rel_err(out, eager_reference(m, b), valid_positions(m, b)) < 1e-5


def test_softcap_declared_or_refused():
    m = tiny("gemma2")
    m.set_attn_implementation("eager")
    b = batch_for(m, pad=False)
    plain = attnswitch.register_backend("no-softcap", plain_attention, gqa=True)

    def capped(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False, softcap=None):
        k, v = (t.repeat_interleave(q.shape[1] // t.shape[1], 1) for t in (k, v))
        s = torch.tanh(q @ k.transpose(-2, -1) * scale / softcap) * softcap
        s = s.masked_fill(~attn_mask, float("-inf")) if attn_mask is not None else s.masked_fill(
            torch.ones(s.shape[-2:], dtype=torch.bool).triu(1), float("-inf")) if is_causal else s
        return torch.softmax(s, -1) @ v

    attnswitch.register_backend("capped", capped, gqa=True, softcap=True)
    try:
        with pytest.raises(attnswitch.BackendUnavailable, match="softcap"), attnswitch.backend(plain, model=m):
            m(**b)
        with torch.no_grad(), attnswitch.backend("capped", model=m):
            out = output_of(m(**b))
    finally:
        attnswitch.unregister_backend("no-softcap")
        attnswitch.unregister_backend("capped")
    assert rel_err(out, eager_reference(m, b), valid_positions(m, b)) < 1e-5


def test_check_quotes_the_users_reasons():
    def refuse_masks(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa):
        return ["my kernel takes no padding mask"] if attn_mask is not None else []

    attnswitch.register_backend("nomask", plain_attention, check=refuse_masks, gqa=True)
    try:
        m = tiny("llama")
        res = attnswitch.check(m, **batch_for(m, pad=True), backends=["nomask", "naive"])
        ok = attnswitch.check(m, **batch_for(m, pad=False), backends=["nomask"])
    finally:
        attnswitch.unregister_backend("nomask")
    assert not res["nomask"].ok and res["nomask"].reasons == ("my kernel takes no padding mask",)
    assert res["nomask"].where == "model.layers.0.self_attn" and res["naive"].ok and ok["nomask"].ok


def test_phase_policy_with_a_registered_kernel(mine, spy):
    m = tiny("llama")
    b = batch_for(m, batch=2, seq=6)
    ref = eager_greedy(m, b, 4)
    with attnswitch.backend({"prefill": "mine", "decode": "naive"}, model=m):
        out = m.generate(**b, max_new_tokens=4, do_sample=False, pad_token_id=0)
    assert torch.equal(out, ref)
    assert spy.names[:2] == ["mine", "mine"] and set(spy.names[2:]) == {"naive"}
    assert all(c["q"][2] == 6 for c in mine.calls)  # only the prefill's calls


def test_a_compare_compiles_its_one_kind_of_call_once(monkeypatch):
    """The default GPU run's case, on Dynamo with aot_eager: one kind of call (causal, no padding) compiles
    one graph; after the first step, the warm-up, host-timed and profiled steps, the timing rounds and the
    numerics check compile nothing more."""
    graphs, name = _counting_flex(monkeypatch)
    try:
        m, _ = load_model("tiny-llama", layers=2)
        w = make_workload(m, batch=2, seq=16)
        r = attnswitch.compare(m, w, backends=[name, "naive"], warmup=1, iters=3, rounds=2, time_budget_s=0)
    finally:
        attnswitch.unregister_backend(name)
    assert r[name].ok and r[name].numerics.ok
    assert len(graphs) == 1 and flex.cache_info()["compiled"] == 1


def test_profile_and_compare_name_the_kernel_and_flag_a_wrong_one(mine):
    def unscaled(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        """forgets the scale: plausible output, wrong numbers"""
        return plain_attention(q, k, v, attn_mask, dropout_p, is_causal, 1.0, enable_gqa)

    attnswitch.register_backend("unscaled", unscaled, gqa=True)
    try:
        m, _ = load_model("tiny-llama", layers=2)
        w = make_workload(m, batch=2, seq=16, padding=True)
        prof = attnswitch.profile(m, w, backends=["mine", "naive"], warmup=0, iters=2, rounds=1)
        rep = attnswitch.compare(m, w, backends=["mine", "unscaled", "naive"], warmup=0, iters=2, rounds=1)
    finally:
        attnswitch.unregister_backend("unscaled")
    torch_dist = f"torch {importlib.metadata.version('torch')}"  # (the distribution's: 2.11.0 for 2.11.0+cu130)
    assert prof["mine"].ok and prof["mine"].attn_calls == 2 and prof["mine"].package == torch_dist
    assert any("matmul" in op or "bmm" in op for op in prof["mine"].attn_ops)
    assert f"mine ({torch_dist})" in str(prof)
    assert rep["mine"].numerics.ok and rep["mine"].numerics.max_rel_err < 1e-4
    assert rep["unscaled"].ok and not rep["unscaled"].numerics.ok
    assert "unscaled" not in rep.ranking and "Not considered, numerics beyond tolerance: unscaled" in rep.recommendation
    assert rep["unscaled"].numerics.max_rel_err > 10 * rep["unscaled"].numerics.tolerance


def test_cli_compares_a_registered_kernel(mine, capsys):
    rc = main(["compare", "tiny-llama", "--device", "cpu", "--num-layers", "1", "--seq", "16", "--iters", "1",
               "--warmup", "0", "--backends", "mine,naive"])
    out = capsys.readouterr().out
    assert rc == 0 and "mine (torch" in out and "Recommendation" in out
    assert mine.calls


def test_bad_registrations_are_clear_errors(mine):
    before = registry_state()
    with pytest.raises(TypeError, match="callable"):
        attnswitch.register_backend("x", "not a function")
    with pytest.raises(TypeError, match="check"):
        attnswitch.register_backend("x", plain_attention, check=42)
    with pytest.raises(ValueError, match="already registered"):
        attnswitch.register_backend(" Mine ", plain_attention)
    with pytest.raises(ValueError, match="non-empty"):
        attnswitch.register_backend("a,b", plain_attention)
    with pytest.raises(ValueError, match="device types"):
        attnswitch.register_backend("x", plain_attention, devices=["gpu0"])
    with pytest.raises(ValueError, match="no registered backend"):
        attnswitch.unregister_backend("x")
    assert registry_state() == before
    attnswitch.register_backend("shapeless", lambda q, k, v, **kw: q.sum())
    attnswitch.register_backend("gpu-only", plain_attention, devices="cuda")
    try:
        q = torch.randn(1, 2, 4, 8)
        with pytest.raises(RuntimeError, match=r"returned \(\); an attention function returns"):
            attnswitch.attention(q, q, q, backend="shapeless")
        with pytest.raises(attnswitch.BackendUnavailable, match="runs on cuda tensors; these are on cpu"):
            attnswitch.attention(q, q, q, backend="gpu-only")
        assert "gpu-only" not in registry.default_backends("cpu") and "gpu-only" in registry.default_backends("cuda")
    finally:
        attnswitch.unregister_backend("shapeless")
        attnswitch.unregister_backend("gpu-only")
    assert registry_state() == before


def test_a_backend_named_all_is_refused_as_all_means_every_backend():
    # backends="all" (and --backends all) means every backend; register_backend refuses built-in names and
    # aliases, and "all" keeps its one meaning. A wrong answer would take "all": then check(m, backends="all")
    # checks the 7 CPU backends while check(m, backends=["all"]) checks the user's kernel alone
    # ("all            ok"): one name, two meanings.
    import torch.nn.functional as F

    def mine(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None):
        return F.scaled_dot_product_attention(q, k, v, attn_mask, dropout_p, is_causal, scale=scale)

    try:
        name = attnswitch.register_backend("all", mine)
    except ValueError:
        return
    try:
        m = tiny("llama")
        batch = batch_for(m, batch=2, seq=8)
        every, listed = attnswitch.check(m, backends="all", **batch), attnswitch.check(m, backends=[name], **batch)
        assert [e.backend for e in every] == [e.backend for e in listed]
    finally:
        attnswitch.unregister_backend(name)
