"""The switch: which implementation ran, state restored, nesting, threads, patching, bad input."""

import contextlib
import threading

import pytest
import torch
from conftest import batch_for, configs, op_names, sdpa_flags, tiny, world

import attnswitch
from attnswitch import hf


@pytest.fixture
def llama():
    return tiny("llama")


# -- which implementation ran: the profiler's op names --------------------------------------------

# a forced backend runs its own ATen op, never SDPA's dispatching one (which reads the process-wide flags)
EXPECTED_OPS = {
    "naive": ({"aten::masked_fill"}, {"aten::scaled_dot_product_attention"}),
    "naive-inplace": ({"aten::masked_fill_"}, {"aten::masked_fill", "aten::scaled_dot_product_attention"}),
    "math": ({"aten::_scaled_dot_product_attention_math"}, {"aten::_scaled_dot_product_flash_attention_for_cpu",
                                                            "aten::scaled_dot_product_attention"}),
    "flash": ({"aten::_scaled_dot_product_flash_attention_for_cpu"}, {"aten::_scaled_dot_product_attention_math",
                                                                     "aten::scaled_dot_product_attention"}),
}


@pytest.mark.parametrize("scoped", [True, False])
@pytest.mark.parametrize("name", list(EXPECTED_OPS))
def test_forced_kernel_really_runs(llama, name, scoped):
    b = batch_for(llama, pad=False)
    must, must_not = EXPECTED_OPS[name]
    with torch.no_grad(), attnswitch.backend(name, model=llama if scoped else None):
        ops = op_names(lambda: llama(**b))
    assert must <= ops
    assert not (must_not & ops)


def test_bare_attention_uses_active_backend():
    q, k, v = (torch.randn(2, 4, 16, 8) for _ in range(3))
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    for name, (must, must_not) in EXPECTED_OPS.items():
        with attnswitch.backend(name):
            ops = op_names(lambda: attnswitch.attention(q, k, v, is_causal=True))
            out = attnswitch.attention(q, k, v, is_causal=True)
        assert must <= ops and not (must_not & ops), name
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)
    ops = op_names(lambda: attnswitch.attention(q, k, v, is_causal=True, backend="naive_inplace"))
    assert "aten::masked_fill_" in ops


def test_bare_attention_gqa_and_masks():
    q = torch.randn(2, 8, 10, 16)
    k, v = torch.randn(2, 2, 10, 16), torch.randn(2, 2, 10, 16)
    keep = torch.rand(2, 1, 10, 10) > 0.3
    keep[..., 0] = True
    additive = torch.zeros(2, 1, 10, 10).masked_fill(~keep, float("-inf"))
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=keep, enable_gqa=True)
    for name in ["naive", "naive-inplace", "math", "flash"]:
        for mask in (keep, additive):
            out = attnswitch.attention(q, k, v, attn_mask=mask, enable_gqa=True, backend=name)
            torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    with pytest.raises(RuntimeError, match="enable_gqa"):  # SDPA's own type: the one input error
        attnswitch.attention(q, k, v)
    with pytest.raises(RuntimeError, match="not both"):
        attnswitch.attention(q, q, q, attn_mask=keep, is_causal=True, backend="naive")


# -- nothing left changed -------------------------------------------------------------------------


@pytest.mark.parametrize("scoped", [True, False])
def test_state_restored_after_exception(llama, scoped):
    before = world(llama)
    assert before["leases"] == {} and before["call"] is hf.registries.MISSING
    with pytest.raises(KeyError):
        with attnswitch.backend("math", model=llama if scoped else None):
            assert world(llama) != before
            raise KeyError("boom")
    assert world(llama) == before


def test_state_restored_after_backend_refusal(llama):
    before = world(llama)
    with pytest.raises(attnswitch.BackendUnavailable) as e:
        with attnswitch.backend("cudnn", model=llama):
            llama(**batch_for(llama))
    assert e.value.backend == "cudnn" and e.value.where == "model.layers.0.self_attn"
    assert "CUDA" in str(e.value) and isinstance(e.value, RuntimeError)
    assert world(llama) == before


def test_sdpa_flags_untouched_between_calls(llama):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    b = batch_for(llama)
    with sdpa_kernel([SDPBackend.MATH]):
        inside = sdpa_flags()
        with attnswitch.backend("flash", model=llama):
            llama(**b)
            assert sdpa_flags() == inside
        assert sdpa_flags() == inside


def test_configs_are_never_written_and_every_stack_is_switched(spy):
    m = tiny("t5")
    assert len(hf.configs_of(m)) == 3  # the model's, and the encoder's and decoder's copies
    before = world(m)
    with torch.no_grad(), attnswitch.backend("naive", model=m):
        assert configs(m) == before["configs"]
        m(**batch_for(m))
    assert world(m) == before
    sites = {w for _, _, w in spy.calls}
    assert any(w.startswith("encoder.") for w in sites) and any(w.startswith("decoder.") for w in sites)
    assert any("EncDecAttention" in w for w in sites)


def test_nesting_inner_wins_outer_returns(llama, spy):
    b = batch_for(llama)
    with attnswitch.backend("naive", model=llama):
        llama(**b)
        with attnswitch.backend("math"):
            llama(**b)
            with attnswitch.backend("flash", model=llama):
                llama(**b)
            llama(**b)
        llama(**b)
    names = spy.names
    per_forward = 2  # two layers
    assert names == ["naive"] * per_forward + ["math"] * per_forward + ["flash"] * per_forward + \
        ["math"] * per_forward + ["naive"] * per_forward


def test_outside_any_context_the_model_runs_its_own_attention(llama, spy):
    b = batch_for(llama)
    with attnswitch.backend("naive", model=llama):
        pass
    llama(**b)
    assert spy.calls == []


def test_threads_get_their_own_backend(llama, spy):
    b = batch_for(llama)
    barrier = threading.Barrier(3)
    errors = []

    def work(name, scoped):
        try:
            with attnswitch.backend(name, model=llama if scoped else None):
                barrier.wait()
                for _ in range(5):
                    with torch.no_grad():
                        llama(**b)
                barrier.wait()
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=a) for a in [("naive", True), ("math", False), ("flash", True)]]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    by_thread = {}
    for tid, name, _ in spy.calls:
        by_thread.setdefault(tid, set()).add(name)
    assert sorted(tuple(s) for s in by_thread.values()) == [("flash",), ("math",), ("naive",)]
    assert len(spy.calls) == 3 * 5 * 2
    assert configs(llama) == {id(c): "sdpa" for c in hf.configs_of(llama)}


def test_a_thread_outside_the_context_is_not_switched(llama, spy):
    b = batch_for(llama)
    inside, done = threading.Event(), threading.Event()

    def other():
        inside.wait()
        llama(**b)
        done.set()

    t = threading.Thread(target=other)
    t.start()
    with attnswitch.backend("naive", model=llama):
        inside.set()
        done.wait(30)
    t.join()
    assert spy.calls == []


# -- patch / unpatch ------------------------------------------------------------------------------


def test_patch_persists_until_unpatch(llama, spy):
    b = batch_for(llama)
    before = world(llama)
    attnswitch.patch(llama, "naive")
    attnswitch.patch(llama, "mem_efficient")  # twice: the original is never the patched state
    attnswitch.patch(llama, "math")
    assert attnswitch.is_patched(llama) == "math"
    llama(**b)
    with attnswitch.backend("naive-inplace"):  # a context wins over a patch
        llama(**b)
    attnswitch.unpatch(llama)
    llama(**b)
    assert spy.names == ["math", "math", "naive-inplace", "naive-inplace"]
    assert world(llama) == before  # nothing written on the model (its attributes are in the snapshot)
    with pytest.raises(ValueError, match="not patched"):
        attnswitch.unpatch(llama)


def test_patch_and_context_on_same_model_restore_in_any_order(llama, spy):
    before = world(llama)
    with attnswitch.backend("math", model=llama):
        attnswitch.patch(llama, "naive")
    assert attnswitch.is_patched(llama) == "naive"  # still patched
    with torch.no_grad():
        llama(**batch_for(llama))
    assert set(spy.names) == {"naive"}
    attnswitch.unpatch(llama)
    assert world(llama) == before


@pytest.mark.parametrize("inner_first", [False, True])
def test_a_patched_submodel_of_a_patched_model_runs_its_own_patch_in_either_order(llama, spy, inner_first):
    """Of two patched models owning a layer, the first registered won: a submodel's patch was ignored (or not)
    by the order of the patches, while ``is_patched`` named it. The inner one wins, as a nested context does."""
    b = batch_for(llama)
    before = world(llama)
    patches = [(llama, "math"), (llama.model, "naive")]
    for m, name in (reversed(patches) if inner_first else patches):
        attnswitch.patch(m, name)
    assert attnswitch.is_patched(llama.model) == "naive" and attnswitch.is_patched(llama) == "math"
    with torch.no_grad():
        llama(**b)
        llama.model(input_ids=b["input_ids"], attention_mask=b["attention_mask"])
    assert spy.names == ["naive"] * (2 * len(llama.model.layers))
    attnswitch.unpatch(llama.model)
    attnswitch.unpatch(llama)
    assert world(llama) == before


def _in_another_thread(fn):
    """``fn()`` run to its end in another thread (a redeploy beside a forward), its exception raised here."""
    errors = []

    def run():
        try:
            fn()
        except BaseException as e:
            errors.append(e)
    t = threading.Thread(target=run)
    t.start()
    t.join(60)
    assert not t.is_alive() and not errors, errors


def test_a_patch_undone_in_another_thread_mid_forward_keeps_that_forward_switched(llama, spy):
    """The last holder let go mid-forward put the registries back under it: its later layers ran the model's
    own attention, and the forward was refused as one that computed attention itself."""
    b = batch_for(llama)
    before = world(llama)
    layers = llama.model.layers
    unpatched = []

    def after_the_first_layer(*_):
        if not unpatched:
            unpatched.append(_in_another_thread(lambda: attnswitch.unpatch(llama)))
    layers[0].register_forward_hook(after_the_first_layer)
    attnswitch.patch(llama, "math")
    with torch.no_grad():
        llama(**b)  # (no UnsupportedModel)
    assert unpatched and attnswitch.is_patched(llama) is None
    assert spy.names == ["math"] * len(layers)  # every layer, the second ran after the unpatch
    assert world(llama) == before  # put back once the forward returned
    with torch.no_grad():
        llama(**b)
    assert spy.names == ["math"] * len(layers)  # the next forward: the model's own attention


@pytest.mark.parametrize("guard", ["none held", "held for another model", "nested model"])
def test_a_patch_made_in_another_thread_mid_forward_waits_for_the_next_forward(llama, spy, guard):
    """A forward that began with its model unselected runs unselected to its end, whether the per-forward guard
    was installed as it began or not, and whichever of its modules (a layer, a submodel) run after the patch."""
    b = batch_for(llama)
    other = tiny("llama")
    hooked = llama.model if guard == "nested model" else llama.model.layers[1]
    done = []

    def before(*_):
        if not done:
            done.append(_in_another_thread(lambda: attnswitch.patch(llama, "math")))
    hooked.register_forward_pre_hook(before)
    held = attnswitch.backend("naive", model=other) if guard == "held for another model" else contextlib.nullcontext()
    with torch.no_grad(), held:
        out = llama(**b)
        assert done and attnswitch.is_patched(llama) == "math"
        assert spy.names == []  # the forward begun unselected ran unselected throughout
        torch.testing.assert_close(llama(**b).logits, out.logits, rtol=1e-4, atol=1e-5)
        assert spy.names == ["math"] * len(llama.model.layers)  # the next one runs the patch
    attnswitch.unpatch(llama)


def test_a_context_entered_inside_a_models_own_forward_applies_there(spy):
    """Only a patch made elsewhere waits for the next forward: a context the forward itself enters (a wrapper
    switching the model it calls, a model switching itself) selects the calls after it, no switch held before."""
    from transformers import LlamaForCausalLM, PretrainedConfig, PreTrainedModel

    inner = tiny("llama")
    b = batch_for(inner, pad=False)

    class Wrapper(PreTrainedModel):
        config_class = PretrainedConfig

        def __init__(self, inner):
            super().__init__(PretrainedConfig())
            self.inner = inner

        def forward(self, **kw):
            with attnswitch.backend("math", model=self.inner):
                return self.inner(**kw)

    class SelfSwitching(LlamaForCausalLM):
        def forward(self, *a, **kw):
            with attnswitch.backend("naive", model=self):
                return super().forward(*a, **kw)

    layers = len(inner.model.layers)
    with torch.no_grad():
        Wrapper(inner)(**b)
        assert spy.names == ["math"] * layers
        SelfSwitching(inner.config)(**b)
        assert spy.names == ["math"] * layers + ["naive"] * layers


def test_a_holder_dropped_inside_a_compile_lets_go_at_the_next_forward():
    """A finalizer in the compiling thread must not change the registries under its trace (Dynamo raised
    KeyError on its guards); it leaves the change to the next forward, which puts everything back."""
    import gc

    m = tiny("llama")
    b = batch_for(m, pad=False)
    before = world()
    holder = [tiny("llama")]
    attnswitch.patch(holder[0], "math")
    installed = []

    def backend(gm, example_inputs):
        if holder:
            holder.clear()
            gc.collect()  # the patched model freed here, inside the compile
            installed.append(bool(hf.registries.installed_entries()))
        return gm.forward

    try:
        with torch.no_grad():
            out = torch.compile(m, backend=backend)(**b).logits
            torch.testing.assert_close(out, m(**b).logits)
    finally:
        torch._dynamo.reset()
    assert installed == [True]  # (left as it was under the trace)
    assert world() == before  # the eager forward after it let go


def test_a_patched_model_freed_during_a_compile_elsewhere_lets_go_after_it():
    """A finalizer must not change the registries under another thread's trace either: it leaves the change to
    the next forward once the compile is over."""
    import gc

    from attnswitch.hf import critical

    m = tiny("llama")
    before = world()
    freed = [tiny("llama")]
    attnswitch.patch(freed[0], "math")
    held, release = threading.Event(), threading.Event()

    def compiling():
        with critical.compiles_held:
            held.set()
            release.wait(60)
    t = threading.Thread(target=compiling)
    t.start()
    try:
        assert held.wait(60)
        freed.clear()
        gc.collect()
        assert hf.registries.installed_entries()  # (left as it was while the compile held the lock)
    finally:
        release.set()
        t.join(60)
    with torch.no_grad():
        m(**batch_for(m))
    assert world() == before


def test_modules_freed_during_a_compile_are_forgotten_after_it():
    """Dynamo's trace iterates the owners' dict it reads; a module freed mid-trace (garbage collection in the
    compiling thread) changed its size under it: "dictionary changed size during iteration"."""
    import gc

    from attnswitch.hf import critical, owners

    m = tiny("llama")
    with attnswitch.backend("math", model=m):
        pass
    size = len(owners._OWNERS)
    with critical.compiles_held:  # as during a compile
        del m
        gc.collect()
        assert len(owners._OWNERS) == size
    other = tiny("llama")
    with attnswitch.backend("math", model=other):  # the next registration forgets them
        pass
    alive = [entry for entry in owners._OWNERS.values() if entry[0]() is not None]
    assert len(owners._OWNERS) == len(alive)


def test_a_forward_whose_return_was_cut_short_is_dropped_by_the_next_change(llama):
    """An interrupt between a forward's end and its ``returned`` left it running for good, and the switch
    installed for the rest of the process."""
    from attnswitch.hf import dispatch, record

    before = world(llama)
    real = record.returned
    try:
        record.returned = lambda fwd: None  # (as if interrupted right before it)
        dispatch.record.returned = record.returned
        with torch.no_grad(), attnswitch.backend("math", model=llama):
            llama(**batch_for(llama))
    finally:
        record.returned = dispatch.record.returned = real
    assert world(llama) == before


def test_a_forward_returns_without_waiting_for_a_compile_elsewhere(llama, spy):
    """A patch undone mid-forward leaves the restore to the forward's return; with Dynamo's compile lock held in
    another thread (a compile in progress), the forward returns at once and the restore comes with the next
    change instead of waiting for the compile."""
    from attnswitch.hf import critical

    held, release, done = threading.Event(), threading.Event(), threading.Event()

    def compiling():
        with critical.compiles_held:
            held.set()
            release.wait(60)
    t = threading.Thread(target=compiling)
    b = batch_for(llama)
    before = world(llama)
    attnswitch.patch(llama, "math")

    def unpatch_then_compile(*_):
        if not held.is_set():
            _in_another_thread(lambda: attnswitch.unpatch(llama))
            t.start()
            assert held.wait(60)
    hook = llama.model.layers[0].register_forward_hook(unpatch_then_compile)
    try:
        with torch.no_grad():
            llama(**b)
        done.set()
        assert spy.names == ["math"] * len(llama.model.layers) and not release.is_set()  # returned, lock still held
    finally:
        release.set()
        t.join(60)
        hook.remove()
    with torch.no_grad():
        llama(**b)  # the next forward puts back what the return left
    assert world(llama) == before and spy.names == ["math"] * len(llama.model.layers)


def test_ctrl_c_interrupts_a_switch_waiting_for_a_compile_elsewhere(llama):
    """SIGINT was held back for the whole wait for another thread's compile (seconds): it now interrupts the
    wait, and nothing was changed."""
    import os
    import signal

    from attnswitch.hf import critical

    held, release = threading.Event(), threading.Event()

    def compiling():
        with critical.compiles_held:
            held.set()
            release.wait(60)
    # Python's own handler, as in a user's process (a pytest-xdist worker ignores SIGINT)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    t = threading.Thread(target=compiling)
    t.start()
    assert held.wait(60)
    before = world(llama)
    timers = []
    try:
        for enter in (lambda: attnswitch.patch(llama, "math"), attnswitch.backend("math", model=llama).__enter__):
            timers.append(threading.Timer(0.2, lambda: os.kill(os.getpid(), signal.SIGINT)))
            with pytest.raises(KeyboardInterrupt):  # (started inside: however late, the signal lands in it)
                timers[-1].start()
                enter()
                release.wait(60)  # (not reached where the wait is interrupted)
            assert not release.is_set()  # interrupted while the compile still held its lock
    finally:
        for timer in timers:
            timer.cancel()
        release.set()
        t.join(60)
        signal.signal(signal.SIGINT, previous)
    assert world(llama) == before


# -- bad input ------------------------------------------------------------------------------------


def test_unknown_name_lists_valid_names():
    with pytest.raises(ValueError) as e:
        with attnswitch.backend("flashy"):
            pass
    for n in attnswitch.BACKENDS:
        assert n in str(e.value)


def test_aliases():
    from torch.nn.attention import SDPBackend
    assert attnswitch.resolve_name("naive_inplace") == "naive-inplace"
    assert attnswitch.resolve_name("mem_efficient") == "efficient"
    assert attnswitch.resolve_name("SDPBackend.FLASH_ATTENTION") == "flash"
    assert attnswitch.resolve_name(SDPBackend.CUDNN_ATTENTION) == "cudnn"
    assert attnswitch.resolve_name(" MATH ") == "math"


def test_legacy_model_is_refused_by_name():
    m = tiny("bloom")
    before = world(m)
    with pytest.raises(attnswitch.UnsupportedModel, match="BloomAttention"):
        with attnswitch.backend("math", model=m):
            pass
    with pytest.raises(attnswitch.UnsupportedModel, match="BloomAttention"):
        attnswitch.patch(m, "math")
    with pytest.raises(attnswitch.UnsupportedModel, match="BloomAttention"):
        with attnswitch.backend("math"):
            m(input_ids=torch.ones(1, 4, dtype=torch.long))
    assert world(m) == before


def test_version_check_names_what_is_needed():
    from attnswitch._versions import require_supported_versions
    require_supported_versions({"torch": "2.13.0+cpu", "transformers": "5.24.0"})
    with pytest.raises(ImportError, match=r"torch>=2\.11; found torch 2\.10\.1"):
        require_supported_versions({"torch": "2.10.1", "transformers": "5.24.0"})
    with pytest.raises(ImportError, match=r"transformers>=5\.17"):
        require_supported_versions({"torch": "2.13.0", "transformers": "4.57.1"})


def test_check_reports_eligibility_with_reasons(llama):
    res = attnswitch.check(llama, **batch_for(llama))
    assert set(res.eligible) == {"naive", "naive-inplace", "math", "flash", "auto", "eager"}
    assert set(res.results) == set(attnswitch.BACKENDS)  # the CUDA-only ones listed too, with the reason
    assert not res["cudnn"].ok and any("CUDA" in r for r in res["cudnn"].reasons)
    assert res["efficient"].where == "model.layers.0.self_attn"
    assert "UNAVAILABLE" in str(res)
