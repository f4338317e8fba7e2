"""What a timed step of the rounds runs: what a user's loop under ``attnswitch.backend(...)`` runs, and nothing
more. Counted, not timed: Python's call events of a step are the same on every machine."""

import collections
import os
import sys

import pytest
import torch
from conftest import tiny

import attnswitch
from attnswitch import instrument
from attnswitch.options import OptionError
from attnswitch.profiling import capture, cupti
from attnswitch.workload import make_workload


def _state(model) -> dict:
    """What would add work to a step: profiler, measurement, torch function modes, module hooks."""
    from torch.nn.modules import module as mod

    hooks = sum(len(m._forward_hooks) + len(m._forward_pre_hooks) + len(m._backward_hooks)
                for m in model.modules())
    return {"profiler": torch.autograd.profiler._is_profiler_enabled, "measuring": instrument.current() is not None,
            "function modes": torch._C._len_torch_function_stack(), "module hooks": hooks,
            "global hooks": len(mod._global_forward_hooks) + len(mod._global_forward_pre_hooks)}


class _Calls:
    """``sys.setprofile``'s call events (Python functions and builtins), counted per segment: a segment
    starts at each call of the code ``mark``."""

    def __init__(self, mark):
        self.mark, self.segments = mark, []

    def __call__(self, frame, event, arg):
        if event == "call" and frame.f_code is self.mark:
            self.segments.append(collections.Counter())
        if not self.segments:
            return
        if event == "call":
            self.segments[-1][f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_code.co_qualname}"] += 1
        elif event == "c_call":
            self.segments[-1][getattr(arg, "__qualname__", repr(arg))] += 1


@pytest.mark.parametrize("mode", ["train", "decode"])
def test_a_timed_step_runs_what_a_users_loop_step_runs_and_nothing_more(monkeypatch, mode):
    # the rounds' steps came 10 % slower than a user's loop on a host-bound H200 step: whatever a timed step
    # runs beyond the user's step lands on the fast backends. Nothing alive in it that a user's loop lacks
    # (profiler, ranges, hooks, observers), and, counted step against step, a handful of Python calls more
    # (the step's own grad mode and loss, the timer's two clock reads), none per module or attention call
    model = tiny("llama")
    work = make_workload(model, batch=2, seq=8, mode=mode)
    states, counted = [], []
    real = capture._timed_wall

    def timed(target, c):
        states.append(_state(model))
        return real(target, c)

    def one_round(target, name, n_calls, block, timing, pace):
        calls = _Calls(real.__code__)
        sys.setprofile(calls)
        try:
            real_round(target, name, n_calls, block, timing, pace)
        finally:
            sys.setprofile(None)
        counted.append(calls.segments[1])  # a whole step and what runs until the next one starts

    real_round = capture._one_round
    monkeypatch.setattr(capture, "_one_round", one_round)
    attnswitch.compare(model, work, backends=["math"], warmup=1, iters=6, rounds=2, time_budget_s=0,
                       check_numerics=False)
    monkeypatch.setattr(capture, "_timed_wall", timed)
    monkeypatch.setattr(capture, "_one_round", real_round)
    attnswitch.compare(model, work, backends=["math"], warmup=1, iters=4, rounds=2, time_budget_s=0,
                       check_numerics=False)
    assert states and all(s == _state_none() for s in states), states

    def mark():
        pass

    calls = _Calls(mark.__code__)
    args = list(work.calls(4))
    model.train(mode == "train")
    with attnswitch.backend("math", model=model), torch.set_grad_enabled(mode == "train"):
        sys.setprofile(calls)
        for c in args:
            mark()
            if mode == "train":
                model(**c).loss.backward()
                model.zero_grad(set_to_none=True)
            else:
                model(**c)
        mark()
        sys.setprofile(None)
    model.eval()
    timed_step, users = counted[0], calls.segments[1]
    more = timed_step - users
    assert sum(more.values()) <= 20, more  # (torch 2.13, transformers 5.24: train 14, decode 18)
    assert not any(k.startswith(("capture.py:_Pace", "instrument.py", "clock.py", "observe.py")) for k in more), more


def _state_none() -> dict:
    return {"profiler": False, "measuring": False, "function modes": 0, "module hooks": 0, "global hooks": 0}


def test_cupti_is_let_go_after_each_trace_unless_the_caller_says_otherwise(monkeypatch):
    # Kineto keeps CUPTI attached after a trace unless TEARDOWN_CUPTI=1, and every CUDA call after it pays:
    # the timing rounds run after the profiled passes, a user's own loop after compare
    monkeypatch.delenv("TEARDOWN_CUPTI", raising=False)
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    assert cupti.let_go() and os.environ["TEARDOWN_CUPTI"] == "1"
    monkeypatch.setenv("TEARDOWN_CUPTI", "0")  # the caller's choice stands
    assert not cupti.let_go() and os.environ["TEARDOWN_CUPTI"] == "0"
    monkeypatch.delenv("TEARDOWN_CUPTI")
    monkeypatch.setattr(torch.version, "cuda", "12.4")  # CUPTI's re-attachment crashes there with CUDA graphs
    assert not cupti.let_go() and "TEARDOWN_CUPTI" not in os.environ
    monkeypatch.setattr(torch.version, "cuda", None)  # a CPU build
    assert not cupti.let_go() and "TEARDOWN_CUPTI" not in os.environ


class _FakeClock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t

    def sleep(self, s):
        self.t += s


def test_settle_makes_cuda_calls_until_kinetos_teardown_thread_is_gone(monkeypatch):
    # the detach lands at the exit of a CUDA call made once Kineto's teardown thread is ready; the thread ends
    # after it: settle calls until the threads are back to the count taken inside the trace
    monkeypatch.setenv("TEARDOWN_CUPTI", "1")
    monkeypatch.setattr(cupti, "_slow", [])
    clock, syncs, threads = _FakeClock(), [], iter([5, 5, 5, 4])
    assert cupti.settle(4, sync=lambda: syncs.append(clock.t), clock=clock, sleep=clock.sleep,
                        count=lambda: next(threads))
    assert len(syncs) == 4 and clock.t < cupti.SETTLE_S


def test_settle_waits_at_most_its_bound_and_then_less_where_a_thread_stays(monkeypatch):
    monkeypatch.setenv("TEARDOWN_CUPTI", "1")
    monkeypatch.setattr(cupti, "_slow", [])
    clock, syncs = _FakeClock(), []
    assert not cupti.settle(4, sync=lambda: syncs.append(1), clock=clock, sleep=clock.sleep, count=lambda: 6)
    assert cupti.SETTLE_S <= clock.t < cupti.SETTLE_S + 0.01
    start = clock.t  # another thread came and stayed: the next wait is short
    cupti.settle(4, sync=lambda: syncs.append(1), clock=clock, sleep=clock.sleep, count=lambda: 6)
    assert clock.t - start < 0.1


def test_settle_does_nothing_without_the_teardown(monkeypatch):
    monkeypatch.setenv("TEARDOWN_CUPTI", "0")
    calls = []
    assert cupti.settle(4, sync=lambda: calls.append(1), count=lambda: 9)
    assert not calls


def test_a_gpu_trace_without_gpu_activity_is_taken_again_then_refused(monkeypatch):
    from types import SimpleNamespace

    empty = SimpleNamespace(trace=SimpleNamespace(device_events=[]))
    full = SimpleNamespace(trace=SimpleNamespace(device_events=[object()]))
    target = SimpleNamespace(device=torch.device("cuda"))
    monkeypatch.setattr(cupti, "settle", lambda before: True)
    monkeypatch.setenv("TEARDOWN_CUPTI", "1")
    taken = iter([empty, full])
    monkeypatch.setattr(capture, "_traced", lambda *a: next(taken))
    assert capture._profiled(target, "flash", 2, None) is full  # the second trace holds the GPU's activity
    monkeypatch.setattr(capture, "_traced", lambda *a: empty)
    with pytest.raises(RuntimeError, match="no GPU activity in 2 traces of flash"):
        capture._profiled(target, "flash", 2, None)


def test_without_the_teardown_an_empty_gpu_trace_is_not_taken_again_and_the_error_says_why(monkeypatch):
    from types import SimpleNamespace

    empty = SimpleNamespace(trace=SimpleNamespace(device_events=[]))
    target = SimpleNamespace(device=torch.device("cuda"))
    monkeypatch.setattr(cupti, "settle", lambda before: True)
    monkeypatch.setenv("TEARDOWN_CUPTI", "0")  # the caller's: CUPTI stays attached, a second trace would not help
    taken = []
    monkeypatch.setattr(capture, "_traced", lambda *a: taken.append(1) or empty)
    with pytest.raises(RuntimeError, match="no GPU activity in 1 trace of flash .another profiler"):
        capture._profiled(target, "flash", 2, None)
    assert taken == [1]


def _switched_in_timed_steps(monkeypatch, model, work, backends, **kw):
    """For each timed step of compare's rounds: (the backend whose turn it is, whether attnswitch held
    transformers' registries then, that is whether the step ran through its entries)."""
    from attnswitch.hf import registries

    seen, turn = [], []
    real_round, real_prompt, real_timed = capture._one_round, capture._prompt_turn, capture._timed_wall

    def one_round(target, name, *a):
        turn[:] = [name]
        return real_round(target, name, *a)

    def prompt_turn(target, name, *a):
        turn[:] = [name]
        return real_prompt(target, name, *a)

    def timed(target, c):
        seen.append((turn[0], bool(registries.installed_entries())))
        return real_timed(target, c)

    monkeypatch.setattr(capture, "_one_round", one_round)
    monkeypatch.setattr(capture, "_prompt_turn", prompt_turn)
    monkeypatch.setattr(capture, "_timed_wall", timed)
    # (profile: a comparison refuses a model a switch holds, as every setup below but one does)
    r = attnswitch.profile(model, work, backends=backends, warmup=1, iters=2, rounds=2, time_budget_s=0, **kw)
    return set(seen), r


@pytest.mark.parametrize("mode", ["prefill", "decode", "train", "generate"])
def test_auto_is_timed_as_the_model_runs_unswitched_and_every_other_backend_switched(monkeypatch, mode):
    # keeping the model's own attention runs transformers' sdpa function with no attnswitch in the process: its
    # timed steps pay none of the switch's host time, a forced backend's do (it is deployed with the switch)
    model = tiny("llama")
    assert model.config._attn_implementation == "sdpa"
    work = make_workload(model, batch=2, seq=8, mode=mode, **({"new_tokens": 2} if mode == "generate" else {}))
    seen, r = _switched_in_timed_steps(monkeypatch, model, work, ["auto", "flash"])
    assert seen == {("auto", False), ("flash", True)}
    auto = next(b for b in r.backends if b.backend == "auto")
    assert auto.ok and auto.attn_calls > 0  # its profiled pass runs switched: its calls counted


def _patched_submodel(model):
    attnswitch.patch(model.model, "math")
    return lambda: attnswitch.unpatch(model.model)


def _patched_other(model):
    other = tiny("llama")
    attnswitch.patch(other, "math")
    return lambda: attnswitch.unpatch(other)


def _own_sdpa(model):
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    def mine(*a, **k):
        return sdpa_attention_forward(*a, **k)

    AttentionInterface.register("sdpa", mine)
    return lambda: AttentionInterface.register("sdpa", sdpa_attention_forward)


def _global(model):
    ctx = attnswitch.backend("math")
    ctx.__enter__()
    return lambda: ctx.__exit__(None, None, None)


@pytest.mark.parametrize("setup", [_patched_submodel, _patched_other, _own_sdpa, _global],
                         ids=["a-submodel-patched", "another-model-patched", "an-own-sdpa-registered",
                              "a-global-switch"])
def test_auto_is_timed_switched_where_the_model_unswitched_would_not_run_what_auto_runs(monkeypatch, setup):
    # a switch on a part of the model, or a caller's global one, would decide its calls unswitched; any switch
    # held routes its forwards through attnswitch's entries; an ``sdpa`` entry of the caller's own is not the
    # function ``auto`` calls
    model = tiny("llama")
    work = make_workload(model, batch=2, seq=8, mode="prefill")
    undo = setup(model)
    try:
        assert _switched_in_timed_steps(monkeypatch, model, work, ["auto"])[0] == {("auto", True)}
        if setup in (_patched_submodel, _global):  # a comparison's answer would be about a switched model
            with pytest.raises(OptionError, match="unpatch it first|call it outside"):
                attnswitch.compare(model, work, backends=["auto"])
    finally:
        undo()


def test_auto_is_timed_switched_on_a_model_that_runs_eager_and_compiled_as_measured():
    from attnswitch.profiling.capture import Target

    model = tiny("llama")
    work = make_workload(model, batch=2, seq=8, mode="prefill")
    target = Target.of(work)
    assert target.as_is("auto") and not target.as_is("flash") and not target.as_is("auto+compile")
    target.compile = "default"  # the target compiles every step
    assert not target.as_is("auto")
    model.set_attn_implementation("eager")  # auto (SDPA) is not what this model runs unswitched
    assert not Target.of(work).as_is("auto")


def test_auto_giving_nan_in_a_timing_round_is_caught_where_its_timed_steps_run_unswitched(monkeypatch):
    # its untimed steps stay switched: their attention calls (and a training step's gradients) are watched
    from attnswitch.hf import dispatch

    model = tiny("llama")
    work = make_workload(model, batch=2, seq=8, mode="generate", new_tokens=2)
    rounds = []
    real_prompt, real_sdpa = capture._prompt_turn, dispatch.sdpa_attention_forward

    def prompt_turn(target, name, *a):
        rounds.append(name)
        return real_prompt(target, name, *a)

    def sdpa(*a, **k):
        out, w = real_sdpa(*a, **k)
        return (out * float("nan"), w) if rounds else (out, w)  # only once the timing rounds began

    monkeypatch.setattr(capture, "_prompt_turn", prompt_turn)
    monkeypatch.setattr(dispatch, "sdpa_attention_forward", sdpa)
    r = attnswitch.compare(model, work, backends=["auto", "math"], warmup=1, iters=2, rounds=2, time_budget_s=0,
                           check_numerics=False)
    auto = next(b for b in r.backends if b.backend == "auto")
    assert auto.nonfinite is not None and "self_attn" in auto.nonfinite.text()


@pytest.mark.parametrize("mode", ["prefill", "generate"])
def test_autos_unswitched_timed_steps_follow_an_untimed_step_of_the_model_as_it_is(monkeypatch, mode):
    # the first step of a path not run since the last switch is slower: the switched untimed step (watched for
    # NaN) does not warm the unswitched path its timed steps take, an untimed step of that path does
    from attnswitch.hf import registries

    model = tiny("llama")
    work = make_workload(model, batch=2, seq=8, mode=mode, **({"new_tokens": 2} if mode == "generate" else {}))
    events = []
    real_rewarm, real_timed = capture.Target.rewarm, capture._timed_wall

    def rewarm(self, *a, **k):
        events.append(("untimed", bool(registries.installed_entries())))
        return real_rewarm(self, *a, **k)

    def timed(target, c):
        events.append(("timed", bool(registries.installed_entries())))
        return real_timed(target, c)

    monkeypatch.setattr(capture.Target, "rewarm", rewarm)
    monkeypatch.setattr(capture, "_timed_wall", timed)
    attnswitch.compare(model, work, backends=["auto"], warmup=1, iters=2, rounds=2, time_budget_s=0,
                       check_numerics=False)
    rounds = events[-3 * 2:] if mode == "generate" else events[-4 * 2:]
    per_turn = [("untimed", True), ("untimed", False)] + [("timed", False)] * (len(rounds) // 2 - 2)
    assert rounds == per_turn * 2, events


def test_a_module_config_that_is_no_transformers_config_never_makes_auto_run_as_is():
    from types import SimpleNamespace

    from attnswitch.switch import runs_as_auto

    model = tiny("llama")
    assert runs_as_auto(model)
    model.extra = torch.nn.Linear(2, 2)
    model.extra.config = SimpleNamespace(_attn_implementation=["sdpa"])  # unhashable, not a name: no crash
    assert not runs_as_auto(model)
    model.extra.config = SimpleNamespace(_attn_implementation="eager")
    assert not runs_as_auto(model)

    class Raising:
        @property
        def _attn_implementation(self):
            raise RuntimeError("no")

    model.extra.config = Raising()
    assert not runs_as_auto(model)
