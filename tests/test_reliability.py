"""The switch never lies: isolation from other threads, no silent non-switch, selection by model, copies,
odd exits and interrupts, SDPA's semantics in naive, bounded caches, bad input."""

import contextlib
import copy
import gc
import os
import pickle
import random
import signal
import sys
import threading

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from conftest import VOCAB, batch_for, eager_reference, output_of, sdpa_flags, tiny, world
from torch.nn.attention import SDPBackend, sdpa_kernel
from transformers import (
    GptOssConfig,
    GptOssForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    PretrainedConfig,
    PreTrainedModel,
)
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

import attnswitch
from attnswitch.backends import naive

FLASH, MATH = int(SDPBackend.FLASH_ATTENTION), int(SDPBackend.MATH)


def rel(out, ref, where=None):
    if where is not None:
        out, ref = out[where], ref[where]
    return ((out - ref).abs().max() / ref.abs().max()).item()


# -- 1. forcing never changes what another thread runs --------------------------------------------

def _race(worker, other):
    """Run ``worker`` (forced backends) in a thread while ``other`` runs here until it is done (``other``
    takes the event set when it is done; both threads take turns at the interpreter whatever the load)."""
    done, errors = threading.Event(), []

    def run():
        try:
            worker()
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)
        finally:
            done.set()

    t = threading.Thread(target=run)
    t.start()
    seen = other(done)
    t.join()
    assert not errors, errors
    return seen


def test_a_thread_that_never_uses_attnswitch_runs_what_sdpa_picks():
    q = torch.randn(1, 4, 64, 32)

    def forced():
        for _ in range(300):
            attnswitch.attention(q, q, q, is_causal=True, backend="math")
            attnswitch.attention(q, q, q, is_causal=True, backend="naive")

    def plain(done):
        choices = []
        while not done.is_set():
            # what a plain F.scaled_dot_product_attention call dispatches to, and the call itself
            choices.append(int(torch._fused_sdp_choice(q, q, q, None, 0.0, True)))
            F.scaled_dot_product_attention(q, q, q, is_causal=True)
            choices.append(sdpa_flags())
        return choices

    seen = _race(forced, plain)
    assert len(seen) >= 20
    assert all(c == FLASH or c == (True, True, True, True) for c in seen), set(map(str, seen))


def test_racing_sdpa_kernel_leaves_the_flags_as_found_and_forced_backends_forced():
    before = sdpa_flags()
    q = torch.randn(1, 4, 64, 32)
    ref = F.scaled_dot_product_attention(q, q, q, is_causal=True)

    def forced():
        for _ in range(300):
            for name in ("flash", "math"):
                out = attnswitch.attention(q, q, q, is_causal=True, backend=name)  # never refused, never wrong
                torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)

    def kernel_contexts(done):
        n = 0
        while not done.is_set():
            with sdpa_kernel([SDPBackend.MATH]):
                F.scaled_dot_product_attention(q, q, q, is_causal=True)
            n += 1
        return n

    assert _race(forced, kernel_contexts) > 10
    assert sdpa_flags() == before
    assert int(torch._fused_sdp_choice(q, q, q, None, 0.0, True)) == FLASH


def test_forced_cpu_flash_runs_while_another_thread_turned_flash_off():
    q = torch.randn(1, 4, 32, 16)
    with sdpa_kernel([SDPBackend.MATH]):  # the process-wide flag off, as another thread's context would
        names = {e.name for e in _profiled(lambda: attnswitch.attention(q, q, q, is_causal=True, backend="flash"))}
    assert "aten::_scaled_dot_product_flash_attention_for_cpu" in names


def _profiled(fn):
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    return prof.events()


def test_a_second_measurement_while_one_runs_is_refused_in_a_line_not_a_crash():
    # two profilers at once crash Kineto (a segmentation fault, the whole process); one measurement per process
    started, go, got = threading.Event(), threading.Event(), {}
    q = torch.randn(1, 2, 8, 16)

    def step():
        started.set()
        assert go.wait(60)
        return attnswitch.attention(q, q, q)

    def first():
        got["report"] = attnswitch.profile(step, backends=["math"], iters=1, rounds=1, time_budget_s=0)
    name = threading.current_thread().name  # (two threads of one name are two threads)
    t = threading.Thread(target=first, name=name)
    t.start()
    try:
        assert started.wait(60)
        with pytest.raises(RuntimeError, match="another attnswitch measurement is running in this process "
                                               rf"\(thread '{name}'\): measurements run one at a time"):
            attnswitch.profile(lambda: attnswitch.attention(q, q, q), backends=["math"], iters=1, rounds=1)
    finally:
        go.set()
        t.join(120)
    assert got["report"]["math"].ok
    assert attnswitch.profile(lambda: attnswitch.attention(q, q, q), backends=["math"], iters=1, rounds=1,
                              time_budget_s=0)["math"].ok  # the first one's end lets the next in


def test_a_measurement_started_during_another_compares_numerics_pass_is_refused_too():
    # the lock was profile()'s alone: compare's numerics pass (and a sweep's gaps between shapes) ran unguarded
    at_numerics, go, got = threading.Event(), threading.Event(), {}
    m = tiny("llama")
    batch = batch_for(m, batch=1, seq=8)

    def progress(step):
        if step == "numerics":
            at_numerics.set()
            assert go.wait(60)

    def first():
        got["report"] = attnswitch.compare(m, batch, backends=["math"], iters=1, rounds=1, time_budget_s=0,
                                           progress=progress)
    t = threading.Thread(target=first)
    t.start()
    q = torch.randn(1, 2, 8, 16)
    try:
        assert at_numerics.wait(120)
        with pytest.raises(RuntimeError, match="another attnswitch measurement is running in this process"):
            attnswitch.profile(lambda: attnswitch.attention(q, q, q), backends=["math"], iters=1, rounds=1)
    finally:
        go.set()
        t.join(120)
    assert got["report"]["math"].ok


def test_a_measurement_a_model_hook_starts_inside_a_measured_step_is_refused_and_the_outer_one_finishes():
    # the lock let its own thread in again (for compare's call of profile), so a compare started by a model's
    # hook ran inside the outer one's profiled step: two traces at once, a segmentation fault
    m, inner = tiny("llama"), tiny("llama")
    batch = batch_for(m, batch=1, seq=8)
    tried = []

    def hook(module, args):
        if not tried:
            try:
                attnswitch.compare(inner, batch_for(inner, batch=1, seq=8), backends=["math"], iters=1, rounds=1)
                tried.append("ran")
            except RuntimeError as e:
                tried.append(str(e))
    handle = m.register_forward_pre_hook(hook)
    try:
        r = attnswitch.compare(m, batch, backends=["math"], iters=1, rounds=1, time_budget_s=0)
    finally:
        handle.remove()
    assert tried and tried[0].startswith("another attnswitch measurement is running in this process (this thread)")
    assert r["math"].ok


# -- 2. no silent non-switch ------------------------------------------------------------------------

def gpt_oss():
    torch.manual_seed(0)
    cfg = GptOssConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_local_experts=4,
                       num_experts_per_tok=2, sliding_window=4)
    m = GptOssForCausalLM(cfg).eval()
    with torch.no_grad():
        for mod in m.modules():
            if hasattr(mod, "sinks"):
                mod.sinks.normal_(0, 2)  # sinks that take a real share of the softmax
    return m


@pytest.mark.parametrize("name", ["naive", "naive-inplace", "flash", "eager"])
def test_attention_sinks_are_honoured(name):
    m = gpt_oss()
    b = batch_for(m, pad=True)
    ref = eager_reference(m, b)
    with torch.no_grad(), attnswitch.backend(name, model=m):
        out = output_of(m(**b))
    assert rel(out, ref, b["attention_mask"].bool()) < 1e-5


def test_attention_sinks_refused_with_a_reason_where_they_cannot_be_honoured():
    m = gpt_oss()
    b = batch_for(m, pad=False)
    res = attnswitch.check(m, **b, backends=["math", "auto", "naive"])
    assert not res["math"].ok and any("sinks" in r for r in res["math"].reasons)
    assert not res["auto"].ok and any("sinks" in r for r in res["auto"].reasons)
    assert res["naive"].ok
    m.train()  # a gradient cannot flow through the log-sum-exp the fused kernels apply sinks with
    with pytest.raises(attnswitch.BackendUnavailable, match="sinks"), attnswitch.backend("flash", model=m):
        m(**b)
    with attnswitch.backend("naive", model=m):
        output_of(m(**b)).sum().backward()


class MixerConfig(PretrainedConfig):
    model_type = "attnswitch-test-mixer"

    def __init__(self, hidden_size=32, num_attention_heads=4, num_hidden_layers=1, **kw):
        super().__init__(**kw)
        self.hidden_size, self.num_attention_heads, self.num_hidden_layers = hidden_size, num_attention_heads, \
            num_hidden_layers


class Mixer(nn.Module):
    """Attention that calls SDPA itself, in a class not named like attention."""

    def __init__(self, config):
        super().__init__()
        self.config, self.qkv = config, nn.Linear(config.hidden_size, 3 * config.hidden_size)

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.config.num_attention_heads, -1).permute(2, 0, 3, 1, 4)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, -1)


class MixerModel(PreTrainedModel):
    config_class = MixerConfig

    def __init__(self, config):
        super().__init__(config)
        self.embed, self.mixer = nn.Embedding(VOCAB, config.hidden_size), Mixer(config)
        self.post_init()

    def forward(self, input_ids):
        return self.mixer(self.embed(input_ids))


@pytest.mark.parametrize("mode", ["context", "global", "patch", "profile"])
def test_a_model_computing_attention_itself_is_refused_in_every_mode(mode):
    m = MixerModel(MixerConfig()).eval()
    ids = torch.randint(0, VOCAB, (1, 8))
    before = world(m)
    with pytest.raises(attnswitch.UnsupportedModel, match=r"mixer \(Mixer\)|without one attention call"):
        if mode == "context":
            with attnswitch.backend("math", model=m):
                m(ids)
        elif mode == "global":
            with attnswitch.backend("math"):
                m(ids)
        elif mode == "patch":
            attnswitch.patch(m, "math")
            try:
                m(ids)
            finally:
                attnswitch.unpatch(m)
        else:
            attnswitch.profile(m, {"input_ids": ids}, backends=["math"], iters=1, warmup=0)
    assert world(m) == before


def test_a_registry_entry_the_user_overrode_is_switched_and_restored(spy):
    m = tiny("llama")
    b = batch_for(m)
    mine = []

    def user_sdpa(module, q, k, v, mask, **kw):
        mine.append(1)
        from transformers.integrations.sdpa_attention import sdpa_attention_forward
        return sdpa_attention_forward(module, q, k, v, mask, **kw)

    ALL_ATTENTION_FUNCTIONS["sdpa"] = user_sdpa  # the instance's own mapping, which wins
    try:
        before = world(m)
        with torch.no_grad(), attnswitch.backend("naive"):
            m(**b)
        assert spy.names == ["naive", "naive"] and mine == []
        assert world(m) == before and ALL_ATTENTION_FUNCTIONS["sdpa"] is user_sdpa
        with torch.no_grad():
            m(**b)
        assert mine == [1, 1]
    finally:
        del ALL_ATTENTION_FUNCTIONS["sdpa"]


def test_gpt2_reordered_upcast_attention_is_refused_not_silently_kept():
    m = tiny("gpt2", reorder_and_upcast_attn=True)
    m.set_attn_implementation("eager")
    with pytest.raises(attnswitch.UnsupportedModel, match="GPT2Attention"):
        with torch.no_grad(), attnswitch.backend("math"):
            m(**batch_for(m))


# -- 3. a model-scoped switch selects by model, not by config ---------------------------------------

def test_models_sharing_one_config_are_switched_apart(spy):
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=8, num_key_value_heads=2)
    m1, m2 = LlamaForCausalLM(cfg).eval(), LlamaForCausalLM(cfg).eval()
    assert m1.config is m2.config
    b = batch_for(m1)
    with torch.no_grad(), attnswitch.backend("naive", model=m1):
        m2(**b)
        assert spy.calls == []
        m1(**b)
    assert spy.names == ["naive", "naive"]
    attnswitch.patch(m1, "math")
    try:
        assert attnswitch.is_patched(m2) is None
        with torch.no_grad():
            m2(**b)
        assert spy.names == ["naive", "naive"]
    finally:
        attnswitch.unpatch(m1)


def _sharing_a_layer():
    """Two models of one shape whose first decoder layer is one module."""
    a, other = tiny("llama"), tiny("llama")
    other.model.layers[0] = a.model.layers[0]
    return a, other


def test_a_model_no_switch_names_runs_its_own_attention_in_a_layer_it_shares(spy):
    a, other = _sharing_a_layer()
    b = batch_for(a)
    with torch.no_grad():
        want = output_of(other(**b))
        with attnswitch.backend("naive", model=a):
            got = output_of(other(**b))  # not named: not one of its calls switched, the shared layer's neither
            assert spy.calls == []
            a(**b)
        attnswitch.patch(a, "math")
        try:
            patched = output_of(other(**b))
        finally:
            attnswitch.unpatch(a)
    assert spy.names == ["naive", "naive"]
    assert torch.equal(got, want) and torch.equal(patched, want)


@pytest.mark.parametrize("order", ["other inside", "other outside", "under a global switch"])
def test_a_layer_two_models_share_runs_the_backend_of_the_model_whose_forward_runs(order, spy):
    a, other = _sharing_a_layer()
    b = batch_for(a)
    with contextlib.ExitStack() as stack:
        stack.enter_context(torch.no_grad())
        if order == "under a global switch":
            stack.enter_context(attnswitch.backend("math"))
            stack.enter_context(attnswitch.backend("naive", model=a))
        else:
            first, second = (a, other) if order == "other inside" else (other, a)
            for model in (first, second):
                stack.enter_context(attnswitch.backend("naive" if model is a else "math", model=model))
        other(**b)
        a(**b)
    assert spy.names == ["math", "math", "naive", "naive"]


# -- 4. copies --------------------------------------------------------------------------------------

@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
def test_a_copy_of_a_patched_model_is_an_unpatched_model(how, spy):
    m = tiny("llama")
    b = batch_for(m)
    before = world()
    attnswitch.patch(m, "naive")
    c = copy.deepcopy(m) if how == "deepcopy" else pickle.loads(pickle.dumps(m))
    assert attnswitch.is_patched(c) is None
    with torch.no_grad():
        torch.testing.assert_close(output_of(c(**b)), output_of(m(**b)))
    assert spy.names == ["naive", "naive"]  # the original's calls only
    with pytest.raises(ValueError, match="not patched"):
        attnswitch.unpatch(c)
    attnswitch.patch(c, "math")  # a copy is patched on its own, and unpatched on its own
    with torch.no_grad():
        c(**b)
    assert spy.names[-2:] == ["math", "math"]
    attnswitch.unpatch(m)
    assert attnswitch.is_patched(c) == "math"
    attnswitch.unpatch(c)
    assert world() == before


def test_a_dropped_patched_model_unpatches_itself():
    before = world()
    m = tiny("llama")
    attnswitch.patch(m, "naive")
    assert world() != before
    del m
    gc.collect()
    assert world() == before


# -- 5. odd exits and interrupts --------------------------------------------------------------------

def test_contexts_exited_out_of_order_raise_and_leave_nothing_selected(spy):
    m = tiny("llama")
    b = batch_for(m)
    before = world(m)
    outer, inner = attnswitch.backend("math"), attnswitch.backend("naive", model=m)
    outer.__enter__()
    inner.__enter__()
    with pytest.raises(RuntimeError, match="out of order"):
        outer.__exit__(None, None, None)
    assert attnswitch.active_backend() is None
    attnswitch.patch(m, "flash")
    with torch.no_grad():
        m(**b)  # the patch, not a stale selection
    attnswitch.unpatch(m)
    assert spy.names == ["flash", "flash"]
    inner.__exit__(None, None, None)  # the inner one leaves quietly: the error was raised once
    assert world(m) == before


def test_a_context_exited_in_another_thread_names_both_threads_and_ends_its_selection(spy):
    m = tiny("llama")
    b = batch_for(m)
    before = world(m)
    ctx = attnswitch.backend("naive", model=m)
    ctx.__enter__()
    raised, selected_there = [], []

    def exit_here():
        with attnswitch.backend("math", model=m):  # this thread's own selection stays as it is
            try:
                ctx.__exit__(None, None, None)
            except RuntimeError as e:
                raised.append(str(e))
            with torch.no_grad():
                m(**b)
            selected_there.append(spy.names[-1])

    t = threading.Thread(target=exit_here, name="the-other-thread")
    t.start()
    t.join()
    assert len(raised) == 1 and "'the-other-thread'" in raised[0] and f"'{threading.current_thread().name}'" \
        in raised[0] and "out of order" not in raised[0], raised
    assert selected_there == ["math"]
    with torch.no_grad():
        m(**b)  # here the context is over: the model runs what it ran before
    assert spy.names == ["math", "math"]
    ctx.__exit__(None, None, None)  # leaving it again here changes nothing and says nothing
    assert world(m) == before


@pytest.mark.parametrize("how", ["closed", "dropped", "raised in it"])
@pytest.mark.parametrize("scoped", [True, False])
def test_a_generator_left_inside_another_context_leaves_that_context_its_backend(how, scoped, spy):
    m = tiny("llama")
    b = batch_for(m)
    before = world(m)
    model = m if scoped else None

    def steps():
        with attnswitch.backend("math", model=model):
            yield
            raise ValueError("a step failed")

    g = steps()
    next(g)  # the generator's context is open across its yield
    with torch.no_grad(), attnswitch.backend("flash", model=model):
        if how == "closed":
            g.close()  # its context is left, out of order, while GeneratorExit propagates
        elif how == "dropped":
            del g
            gc.collect()
        else:
            with pytest.raises(ValueError, match="a step failed"):
                next(g)
        m(**b)  # the rest of the block runs its own backend
        assert attnswitch.active_backend() == (None if scoped else "flash")
    assert spy.names == ["flash", "flash"]
    assert world(m) == before


def _injected(fn, n):
    """Run ``fn`` raising KeyboardInterrupt at the ``n``-th line attnswitch's switch runs; True if it
    was raised there."""
    count = [0]
    fired = [False]
    watched = ("attnswitch/switch.py", "attnswitch/hf/install.py", "attnswitch/hf/registries.py",
               "attnswitch/hf/selection.py", "attnswitch/hf/record.py", "attnswitch/hf/owners.py")

    def tracer(frame, event, arg):
        if not frame.f_code.co_filename.replace(os.sep, "/").endswith(watched):
            return None
        if event == "line" and not fired[0]:
            count[0] += 1
            if count[0] == n:
                fired[0] = True
                raise KeyboardInterrupt(f"injected at line {n}")
        return tracer

    sys.settrace(tracer)
    try:
        fn()
    except KeyboardInterrupt:
        pass
    finally:
        sys.settrace(None)
    return fired[0]


@pytest.mark.parametrize("scoped", [True, False])
def test_an_interrupt_at_any_step_of_enter_or_exit_leaves_nothing_behind(scoped):
    m = tiny("llama")
    before = world(m)

    def switch():
        with attnswitch.backend("naive", model=m if scoped else None):
            pass

    n = 1
    while _injected(switch, n):
        assert world(m) == before, f"interrupted at line {n}"
        n += 1
    assert n > 20  # every line of enter and exit was interrupted once


def test_an_interrupt_at_any_step_of_patch_or_unpatch_leaves_a_whole_state():
    m = tiny("llama")
    before = world(m)
    n = 1
    while True:
        fired = _injected(lambda: attnswitch.patch(m, "naive"), n)
        if attnswitch.is_patched(m):
            fired = _injected(lambda: attnswitch.unpatch(m), n) or fired
            if attnswitch.is_patched(m):
                attnswitch.unpatch(m)
        assert world(m) == before, f"interrupted at line {n}"
        if not fired:
            break
        n += 1
    assert n > 10


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(), reason="needs the main thread")
def test_sigint_delivered_during_enter_and_exit_leaves_nothing_behind():
    # Ctrl-C's own handler, whatever the test runner's launcher left (a background job ignores SIGINT)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        _enter_and_exit_under_sigint()
    finally:
        signal.signal(signal.SIGINT, previous)


def _enter_and_exit_under_sigint():
    m = tiny("llama")
    before = world(m)
    rng = random.Random(0)
    interrupted = 0
    for _ in range(400):  # every one of them, however long a busy machine makes them take
        timer = threading.Timer(rng.uniform(0, 2e-4), os.kill, (os.getpid(), signal.SIGINT))
        try:
            timer.start()
            for _ in range(20):
                with attnswitch.backend("naive", model=m if rng.random() < 0.5 else None):
                    pass
            timer.join()
        except KeyboardInterrupt:
            interrupted += 1
        finally:
            timer.cancel()
            timer.join()
        assert world(m) == before
    assert interrupted > 10


# -- 6. naive computes what SDPA computes -----------------------------------------------------------

@pytest.mark.parametrize("name", ["naive", "naive-inplace"])
def test_naive_matches_sdpa_on_fully_masked_rows(name):
    q, k, v = (torch.randn(2, 4, 6, 8) for _ in range(3))
    keep = torch.rand(2, 1, 6, 6) > 0.4
    keep[:, :, 2] = False  # a query that may see nothing
    additive = torch.zeros(keep.shape).masked_fill(~keep, float("-inf"))
    for mask in (keep, additive):
        ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        out = attnswitch.attention(q, k, v, attn_mask=mask, backend=name)
        assert torch.isfinite(out).all()
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
        assert out[:, :, 2].abs().max() == 0


@pytest.mark.parametrize("mask_dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("name", ["naive", "naive-inplace"])
def test_naive_in_half_precision_reads_a_row_hidden_by_a_finite_minimum_as_sdpa_does(name, mask_dtype):
    # T5's masks hide with float16's finite minimum: any score below -16 added to it overflows half precision to
    # -inf, a whole row of them to softmax's NaN; SDPA adds in float32 and reads softmax of the scores there
    torch.manual_seed(0)
    q, k = (torch.randn(2, 4, 6, 16, dtype=torch.float16) * 3 for _ in range(2))
    v = torch.randn(2, 4, 6, 16, dtype=torch.float16)
    low = torch.finfo(torch.float16).min
    mask = torch.zeros(2, 1, 6, 6)
    mask[1] = low  # a sample all padding
    mask[0, 0, 2, 3:] = low  # a row partly hidden
    mask[0, 0, 4] = float("-inf")  # a row hidden by -inf: 0, as SDPA gives
    mask = mask.to(mask_dtype)
    assert (q[1] @ k[1].transpose(-1, -2) < -16).any()  # (the case: scores that overflow)
    ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask.float())
    out = attnswitch.attention(q, k, v, attn_mask=mask, backend=name)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.float(), ref, rtol=0, atol=5e-3)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("name", ["naive", "naive-inplace"])
def test_naive_reads_rows_of_float32s_minimum_and_of_inf_beside_a_minimum_as_sdpa_does(name, dtype):
    # a float32 mask's own minimum drowns the scores in SDPA's float32 sum (even weights), where a shift of the row
    # gave softmax of the scores; -inf beside a finite minimum is no weight in SDPA, where clamping it to the
    # minimum gave it as much as the minimum's
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 2, 4, 8, dtype=dtype) for _ in range(3))
    low = torch.finfo(dtype).min
    mask = torch.zeros(2, 1, 4, 4)
    mask[0, 0, 1] = torch.finfo(torch.float32).min
    mask = mask.to(dtype) if dtype != torch.float16 else mask  # (float16: a float32 mask, as SDPA takes it)
    mask[1, 0, 2] = torch.tensor([float("-inf"), low, low, float("-inf")]).to(mask.dtype)
    mask[1, 0, 3] = float("-inf")  # dead: 0, as SDPA gives
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    out = attnswitch.attention(q, k, v, attn_mask=mask, backend=name)
    rtol, atol = {torch.float16: (1e-3, 2e-3), torch.bfloat16: (1.6e-2, 1e-2), torch.float32: (1e-5, 1e-5)}[dtype]
    torch.testing.assert_close(out.float(), ref.float(), rtol=rtol, atol=atol)


@pytest.mark.parametrize("name", ["naive", "naive-inplace", "math", "flash"])
def test_a_float32_mask_with_bf16_inputs_runs_as_sdpa_takes_it(name):
    q, k, v = (torch.randn(1, 2, 8, 16, dtype=torch.bfloat16) for _ in range(3))
    mask = torch.zeros(8, 8).masked_fill(torch.ones(8, 8, dtype=torch.bool).triu(1), float("-inf"))
    ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask)
    out = attnswitch.attention(q, k, v, attn_mask=mask, backend=name)
    assert out.dtype == torch.bfloat16 and rel(out.float(), ref) < 2e-2


@pytest.mark.parametrize("name", ["naive", "naive-inplace", "math", "flash"])
def test_a_mask_that_does_not_broadcast_is_an_error_as_in_sdpa(name):
    q = torch.randn(1, 2, 4, 8)
    mask = torch.ones(2, 1, 4, 4, dtype=torch.bool)  # batch 2 for a batch of 1
    with pytest.raises(RuntimeError) as e:
        attnswitch.attention(q, q, q, attn_mask=mask, backend=name)
    assert not isinstance(e.value, attnswitch.BackendUnavailable)


# -- 7. caches and lifetime -------------------------------------------------------------------------

def test_a_causal_mask_made_under_inference_mode_serves_a_later_backward():
    q = torch.randn(1, 2, 7, 8)
    with torch.inference_mode():
        attnswitch.attention(q, q, q, is_causal=True, backend="naive")
    qg = q.clone().requires_grad_()
    attnswitch.attention(qg, qg, qg, is_causal=True, backend="naive").sum().backward()
    assert qg.grad is not None and torch.isfinite(qg.grad).all()


def test_the_causal_mask_cache_is_bounded_by_bytes(monkeypatch):
    monkeypatch.setattr(naive, "CAUSAL_CACHE_BYTES", 64 * 1024)
    q = torch.randn(1, 1, 1, 8)
    for n in range(100, 400, 10):
        k = torch.randn(1, 1, n, 8)
        naive.causal_mask(n, n, q.device)
        attnswitch.attention(k, k, k, is_causal=True, backend="naive")
    assert 0 < sum(t.numel() for t in naive._CAUSAL.values()) <= 64 * 1024


# -- 8. bad input is bad input ----------------------------------------------------------------------

@pytest.mark.parametrize("name", ["naive", "math", "flash", "auto"])
def test_bare_call_input_errors_are_sdpas_errors_not_refusals(name):
    bad = [
        (torch.ones(1, 2, 4, 8, dtype=torch.long),) * 3,  # integer tensors
        (torch.randn(1, 2, 4, 8), torch.randn(1, 2, 4, 16), torch.randn(1, 2, 4, 16)),  # head dims differ
    ]
    for q, k, v in bad:
        with pytest.raises(Exception) as ours:
            attnswitch.attention(q, k, v, backend=name)
        with pytest.raises(Exception) as sdpas:
            F.scaled_dot_product_attention(q, k, v)
        assert not isinstance(ours.value, attnswitch.BackendUnavailable), ours.value
        assert type(ours.value) is type(sdpas.value)


@pytest.mark.parametrize("name", ["naive", "math", "flash", "auto"])
def test_shape_errors_of_a_bare_call_are_one_error_eager_and_compiled(name):
    q = torch.randn(1, 4, 4, 8)
    bad = [(q, torch.randn(1, 2, 4, 8), torch.randn(1, 2, 4, 8), {}),  # fewer k/v heads without enable_gqa
           (q, torch.randn(1, 3, 4, 8), torch.randn(1, 3, 4, 8), {"enable_gqa": True}),  # heads that do not divide
           (q[0], q[0], q[0], {})]  # 3-d
    compiled = torch.compile(lambda q, k, v, kw: attnswitch.attention(q, k, v, backend=name, **kw),
                             backend="eager")
    for q_, k, v, kw in bad:
        for fn in (lambda *a: attnswitch.attention(*a[:3], backend=name, **a[3]), compiled):
            with pytest.raises(Exception) as e:
                fn(q_, k, v, kw)
            assert type(e.value) is RuntimeError, (kw, e.value)
            assert "q" in str(e.value) and "k" in str(e.value)


@pytest.mark.parametrize("shapes", ["3-d q, k, v", "one k/v head for four q heads"])
def test_a_bare_call_refuses_calls_sdpa_takes_outside_the_ones_transformers_makes_saying_what_it_takes(shapes):
    # docs/python-api.md, "One attention call": `attention` takes `F.scaled_dot_product_attention`'s arguments for
    # the calls transformers makes (4-d q, k, v; fewer k/v heads with `enable_gqa=True`; others are refused with the
    # reason); docs/how-it-works.md names the others, which SDPA itself would take. Two such (torch 2.13, CPU):
    # q, k, v of shape [heads, seq, dim] (F.sdpa returns [4, 5, 16]), and k, v with one head against q's four,
    # without enable_gqa (broadcast). Under auto, SDPA's own choice, each is refused as one RuntimeError naming
    # what a bare call takes: "expected 4-d q, k, v [batch, heads, seq, dim]; got 3, 3, 3 dims" and "q has 4 heads
    # and k/v 1: fewer k/v heads than q heads are taken with enable_gqa=True only (grouped-query attention), as in
    # scaled_dot_product_attention".
    torch.manual_seed(0)
    if shapes == "3-d q, k, v":
        q = k = v = torch.randn(4, 5, 16)
    else:
        q, k = torch.randn(2, 4, 5, 16), torch.randn(2, 1, 5, 16)
        v = k
    F.scaled_dot_product_attention(q, k, v, is_causal=True)  # SDPA takes it
    with pytest.raises(RuntimeError, match="4-d q, k, v|enable_gqa=True"):
        attnswitch.attention(q, k, v, is_causal=True)


def test_a_mask_flash_cannot_take_is_a_refusal_that_says_so():
    q = torch.randn(1, 2, 3, 8)
    with pytest.raises(attnswitch.BackendUnavailable, match=r"attn_mask .*\(3,\)") as e:
        attnswitch.attention(q, q, q, attn_mask=torch.ones(3, dtype=torch.bool), backend="flash")
    assert e.value.backend == "flash"
    ref = F.scaled_dot_product_attention(q, q, q, attn_mask=torch.ones(1, 3, dtype=torch.bool))
    torch.testing.assert_close(attnswitch.attention(q, q, q, attn_mask=torch.ones(3, dtype=torch.bool), backend="math"),
                               ref)


def test_check_takes_its_arguments_as_profile_does():
    m = tiny("llama")
    b = batch_for(m)
    with pytest.raises(ValueError, match="no backends"):
        attnswitch.check(m, **b, backends=[])
    with pytest.raises(ValueError, match="no backends"):
        attnswitch.profile(m, b, backends=[])
    with pytest.raises((TypeError, ValueError)):
        attnswitch.check(m, input_idz=b["input_ids"])


def test_auto_on_a_softcap_model_is_a_refusal_with_the_reason():
    m = tiny("gemma2")
    b = batch_for(m, pad=False)
    with pytest.raises(attnswitch.BackendUnavailable, match="softcap") as e:
        with torch.no_grad(), attnswitch.backend("auto", model=m):
            m(**b)
    assert e.value.backend == "auto"
