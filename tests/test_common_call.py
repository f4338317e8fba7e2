"""The common call of a forward: straight to the backend's op, with the general path's output, for the
modules the forward's model alone owns, in the state the forward started in."""

import contextvars
import gc
import threading

import pytest
import torch
from conftest import batch_for, op_names, spy_on, tiny

import attnswitch
from attnswitch import instrument
from attnswitch.hf import owners


@pytest.fixture
def llama():
    return tiny("llama")  # 2 layers, 8 q / 2 kv heads, head dim 8


def _forward(model, batch, name, scoped=True, grad=False):
    model.zero_grad(set_to_none=True)
    with torch.set_grad_enabled(grad), attnswitch.backend(name, model=model if scoped else None):
        logits = model(**batch).logits
    if not grad:
        return logits, None
    logits.float().pow(2).mean().backward()
    return logits, [p.grad.clone() for p in model.parameters() if p.grad is not None]


@pytest.mark.parametrize("scoped", [True, False])
@pytest.mark.parametrize("grad", [False, True])
def test_a_forwards_common_calls_go_straight_to_the_op_with_the_general_paths_output(llama, monkeypatch, grad,
                                                                                       scoped):
    b = batch_for(llama, pad=False)  # no padding: no mask, the common call
    with monkeypatch.context() as mp:
        general = spy_on(mp, common=False)
        want, want_grads = _forward(llama, b, "flash", scoped, grad)
    assert general.general == ["flash", "flash"]
    paths = spy_on(monkeypatch)
    got, got_grads = _forward(llama, b, "flash", scoped, grad)
    assert paths.common == ["flash", "flash"] and paths.general == []  # both layers, no other path
    assert torch.equal(got, want)
    if grad:
        assert len(got_grads) == len(want_grads) and all(torch.equal(a, c) for a, c in zip(got_grads, want_grads))


def test_the_common_call_runs_the_forced_kernel(llama, monkeypatch):
    paths = spy_on(monkeypatch)
    b = batch_for(llama, pad=False)
    with torch.no_grad(), attnswitch.backend("flash", model=llama):
        ops = op_names(lambda: llama(**b))
    assert paths.common == ["flash", "flash"]
    assert "aten::_scaled_dot_product_flash_attention_for_cpu" in ops
    assert "aten::scaled_dot_product_attention" not in ops  # SDPA's dispatching op reads the flags: never


def test_masked_and_uncommon_calls_take_the_general_path(llama, monkeypatch):
    paths = spy_on(monkeypatch)
    with torch.no_grad(), attnswitch.backend("flash", model=llama):
        llama(**batch_for(llama, pad=True))  # padding: a mask
        with pytest.warns(UserWarning, match="cannot return attention weights"):
            llama(**batch_for(llama, pad=False), output_attentions=True)
    assert paths.common == [] and paths.general == ["flash"] * 4
    paths.general.clear()
    with torch.no_grad(), attnswitch.backend("math", model=llama):  # a backend without a common op
        llama(**batch_for(llama, pad=False))
    assert paths.common == [] and paths.general == ["math", "math"]


def test_a_context_entered_inside_a_forward_switches_the_calls_after_it(llama, monkeypatch):
    paths = spy_on(monkeypatch)
    inner = attnswitch.backend("math", model=llama)
    layer = llama.model.layers[1]

    def enter(*args):
        inner.__enter__()  # (a pre-hook's return value would replace the layer's inputs)

    hooks = [layer.register_forward_pre_hook(enter),
             layer.register_forward_hook(lambda *a: inner.__exit__(None, None, None))]
    try:
        with torch.no_grad(), attnswitch.backend("flash", model=llama):
            llama(**batch_for(llama, pad=False))
    finally:
        for h in hooks:
            h.remove()
    assert paths.common == ["flash"] and paths.general == ["math"]


def test_the_innermost_model_scoped_context_wins_for_a_model_inside_another(spy):
    lm = tiny("llama")
    b = batch_for(lm, pad=False)
    for outer, inner, want in [(lm, lm.model, "math"), (lm.model, lm, "flash")]:
        spy.calls.clear()
        with torch.no_grad(), attnswitch.backend("flash" if outer is lm else "math", model=outer), \
                attnswitch.backend("math" if inner is lm.model else "flash", model=inner):
            lm(**b)
        assert spy.names == [want, want], (type(outer).__name__, type(inner).__name__)


def test_the_modules_one_model_alone_owns_are_tracked_as_they_come_and_go():
    lm = tiny("llama")
    info = owners.register(lm)
    attn = lm.model.layers[0].self_attn
    assert id(attn) in info.sole and id(lm) in info.sole and id(attn) in info.owned
    inner = owners.register(lm.model)  # now two models own the decoder's modules
    assert id(attn) not in info.sole and id(attn) not in inner.sole and id(lm.lm_head) in info.sole
    assert id(attn) in info.owned and id(attn) in inner.owned
    solo = tiny("llama")
    solo_info = owners.register(solo)
    old = solo.model.layers[0].self_attn
    old_id = id(old)
    assert old_id in solo_info.sole
    solo.model.layers[0].self_attn = type(old)(solo.config, 0)  # replaced: the old module is freed
    del old
    gc.collect()
    assert old_id not in solo_info.sole and old_id not in solo_info.owned  # forgotten as it was freed
    new_id = id(solo.model.layers[0].self_attn)  # (which may be the old one's id again)
    assert new_id not in solo_info.sole and new_id not in solo_info.owned  # registered modules only


def test_a_model_run_under_a_global_switch_keeps_the_common_call_for_modules_it_shares(monkeypatch):
    lm = tiny("llama")
    b = batch_for(lm, pad=False)
    with torch.no_grad(), attnswitch.backend("flash"):
        lm.model(input_ids=b["input_ids"])  # the inner model registered on its own: it shares every module
        paths = spy_on(monkeypatch)
        lm(**b)
    assert paths.common == ["flash", "flash"] and paths.general == []  # no other model has a selection here
    paths.common.clear()
    with torch.no_grad(), attnswitch.backend("flash", model=lm), attnswitch.backend("math", model=lm.model):
        lm(**b)
    assert paths.common == [] and paths.general == ["math", "math"]  # here one has: the general path decides


def test_a_context_copied_during_a_forward_does_not_keep_its_selection(monkeypatch):
    m, other = tiny("llama"), tiny("qwen2")
    b = batch_for(m, pad=False)
    with torch.no_grad():
        want = {}
        for name in ("flash", "math"):
            with attnswitch.backend(name, model=m):
                want[name] = m(**b).logits
        attnswitch.patch(other, "math")  # keeps attnswitch's entries installed after m is unpatched
        try:
            attnswitch.patch(m, "flash")
            copied = []
            hook = m.model.layers[0].register_forward_pre_hook(
                lambda *a: copied.append(contextvars.copy_context()) if not copied else None)
            m(**b)
            hook.remove()
            attnswitch.patch(m, "math")  # the forward above has returned: a later one reads this
            paths = spy_on(monkeypatch)
            out = copied[0].run(lambda: m(**b).logits)
        finally:
            attnswitch.unpatch(m)
            attnswitch.unpatch(other)
    assert torch.equal(out, want["math"]) and paths.general == ["math", "math"]


def test_a_model_and_its_inner_model_registered_at_once_leave_no_module_in_both_sole_sets(monkeypatch):
    m = tiny("llama")
    attn = m.model.layers[0].self_attn
    barrier, real = threading.Barrier(2, timeout=2), owners._own

    def own(module, owners):  # both threads at the same module: the one registering second must see the first
        if module is attn:
            try:
                barrier.wait()
            except threading.BrokenBarrierError:
                pass  # (registrations take turns: the other thread waits for this one)
        return real(module, owners)

    monkeypatch.setattr(owners, "_own", own)
    threads = [threading.Thread(target=owners.register, args=(x,)) for x in (m, m.model)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    outer, inner = owners.info_of(m), owners.info_of(m.model)
    assert sorted(owners._owners(attn)) == sorted((outer.token, inner.token))
    assert id(attn) not in outer.sole and id(attn) not in inner.sole


def test_a_measured_forward_takes_the_common_call_and_records_every_call(llama, monkeypatch):
    paths = spy_on(monkeypatch)
    times = []
    with torch.no_grad(), attnswitch.backend("flash", model=llama), instrument.measuring(annotate=True,
                                                                                           host_times=times):
        with torch.profiler.profile() as prof:
            llama(**batch_for(llama, pad=False))
    assert paths.common == ["flash", "flash"] and paths.general == []
    assert [w for w, _, _ in times] == ["model.layers.0.self_attn", "model.layers.1.self_attn"]
    ranges = [e.name for e in prof.events() if e.name.startswith(instrument.ATTENTION_PREFIX)]
    assert len(ranges) == 2


def test_threads_each_take_their_own_common_call(llama, monkeypatch):
    paths = spy_on(monkeypatch)
    b = batch_for(llama, pad=False)
    errors = []
    barrier = threading.Barrier(2)

    def work(name):
        try:
            with torch.no_grad(), attnswitch.backend(name, model=llama):
                barrier.wait()
                for _ in range(5):
                    llama(**b)
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(n,)) for n in ("flash", "math")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    seen = {}
    for thread, name, _ in paths.calls:
        if name == "flash":
            seen.setdefault(thread, []).append(name)
    assert [len(v) for v in seen.values()] == [10]  # one thread's calls, 2 layers x 5 forwards
    assert paths.common == ["flash"] * 10 and paths.general == ["math"] * 10


@pytest.mark.parametrize("pad", [False, True])
def test_autos_calls_go_straight_to_transformers_sdpa_function_with_its_output(llama, monkeypatch, pad):
    # ``auto`` is what a user who changes nothing runs: its calls take none of the general path's reading of the
    # arguments (3 µs a call more than transformers' own on a CPU), a mask included, and are counted
    from attnswitch.hf import dispatch

    b = batch_for(llama, pad=pad)
    with torch.no_grad():
        want = llama(**b).logits
    general, straight = [], []
    real, real_sdpa = dispatch._dispatch, dispatch.sdpa_attention_forward
    monkeypatch.setattr(dispatch, "_dispatch", lambda *a, **k: general.append(a[0]) or real(*a, **k))
    monkeypatch.setattr(dispatch, "sdpa_attention_forward", lambda *a, **k: straight.append(1) or real_sdpa(*a, **k))
    with torch.no_grad(), attnswitch.backend("auto", model=llama):
        got = llama(**b).logits
    assert general == [] and len(straight) == 2
    assert torch.equal(got, want)
    monkeypatch.setattr(dispatch, "_dispatch", real)
    r = attnswitch.profile(llama, b, backends=["auto"], iters=1, rounds=1).backends[0]
    assert r.ok and r.attn_calls == 2  # every call counted, as the general path counts them
