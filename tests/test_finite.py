"""The finiteness gate: NaN or Inf in any output or gradient of a candidate while it is compared makes it
unacceptable, with the reason and where it appeared; checked in the untimed steps and on the last timed step's
output of each turn, never inside a timed step.

The candidates are registered backends (SDPA's math underneath) that go wrong on purpose: in the backward only
at seq % 128 == 64, in the timed steps only, in the numerics pass only.
"""

import pytest
import torch
import torch.nn.functional as F
from conftest import tiny

import attnswitch
from attnswitch import comparison, finite, instrument
from attnswitch.comparison import compare
from attnswitch.profiling import capture
from attnswitch.render.console import to_text
from attnswitch.workload import make_workload

#: where each backend goes wrong: set by the tests around the steps they mean
WHEN = {"timed": False, "numerics": False}


class _NanBackward(torch.autograd.Function):
    """SDPA, whose backward gives q a NaN gradient where the sequence length is 64 mod 128."""

    @staticmethod
    def forward(ctx, q, k, v, causal, scale):
        ctx.save_for_backward(q, k, v)
        ctx.causal, ctx.scale = causal, scale
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale, enable_gqa=True)

    @staticmethod
    def backward(ctx, g):
        q, k, v = ctx.saved_tensors
        with torch.enable_grad():
            x = [t.detach().requires_grad_() for t in (q, k, v)]
            out = F.scaled_dot_product_attention(*x, is_causal=ctx.causal, scale=ctx.scale, enable_gqa=True)
            gq, gk, gv = torch.autograd.grad(out, x, g)
        if q.shape[2] % 128 == 64:
            gq = torch.full_like(gq, float("nan"))
        return gq, gk, gv, None, None


def nan_backward(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    return _NanBackward.apply(q, k, v, is_causal, scale)


def _sdpa(q, k, v, attn_mask, is_causal, scale):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal, scale=scale,
                                          enable_gqa=True)


def inf_when_timed(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    out = _sdpa(q, k, v, attn_mask, is_causal, scale)
    return out + float("inf") if WHEN["timed"] else out


def nan_in_numerics(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    out = _sdpa(q, k, v, attn_mask, is_causal, scale)
    return out * float("nan") if WHEN["numerics"] else out


_CALLS = {"n": 0}


def nan_in_the_second_layer(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    _CALLS["n"] += 1  # the tiny Llama has two layers: every second call is layer 1's
    out = _sdpa(q, k, v, attn_mask, is_causal, scale)
    return out * float("nan") if _CALLS["n"] % 2 == 0 else out


@pytest.fixture(autouse=True)
def backends():
    kernels = {"nanback": nan_backward, "inftimed": inf_when_timed, "nannumerics": nan_in_numerics,
               "nanlayer1": nan_in_the_second_layer}
    for name, fn in kernels.items():
        attnswitch.register_backend(name, fn, gqa=True)
    yield
    for name in kernels:
        attnswitch.unregister_backend(name)
    WHEN.update(timed=False, numerics=False)


def _compare(backends, seq, mode="train", **kw):
    model = tiny("llama")
    kw = {"iters": 2, "rounds": 2, "time_budget_s": 0, **kw}
    return compare(model, make_workload(model, batch=1, seq=seq, mode=mode), backends=backends, **kw)


@pytest.mark.parametrize("seq", [64, 192])
def test_a_nan_in_the_backward_at_seq_64_mod_128_fails_the_candidate_with_the_layer_and_direction(seq):
    r = _compare("nanback,flash", seq, check_numerics=False)
    b = r["nanback"]
    assert b.status == "failed" and b.nonfinite.value == "NaN" and b.nonfinite.direction == "backward"
    # the last layer's backward runs first: that is where the NaN appeared
    assert b.nonfinite.where == "model.layers.1.self_attn" and b.nonfinite.step == "the warm-up step"
    assert b.reasons == ("NaN in the backward of model.layers.1.self_attn (the warm-up step): never recommended",)
    assert r.pick == "flash" and "nanback" not in r.ranking
    line = "Not considered: `nanback` gave NaN in the backward of model.layers.1.self_attn (the warm-up step)."
    assert r.decision.reasons[0] == line and line in r.cautions and line in to_text(r)


def test_a_nan_from_the_first_call_fails_the_candidate_with_its_call_site_not_only_the_output():
    # the cold step's calls are not watched (it is timed): its output was all the report named, where the promise
    # is the call site, as a NaN found later names it
    _CALLS["n"] = 0
    r = _compare("nanlayer1,flash", 16, mode="prefill", check_numerics=False)
    b = r["nanlayer1"]
    assert b.status == "failed" and b.nonfinite.direction == "forward"
    assert b.nonfinite.where == "model.layers.1.self_attn", b.nonfinite
    assert b.nonfinite.step == "the cold step, run again with its calls watched"
    assert r.pick == "flash"


def test_when_every_backend_that_ran_is_ruled_out_the_answer_says_where_their_figures_are():
    from reports_fixed import fixed, report_of

    from attnswitch.results import BackendResult, Numerics

    over = Numerics(0.5, 0.1, 1.0, 1e-3, False)
    r = report_of([fixed("flash", [1.0] * 6, numerics=over)])
    assert r.decision.answer == "none" and r.decision.reasons[-1] == "Their figures: in the Summary."
    r = report_of([fixed("flash", [1.0] * 6, numerics=over), BackendResult("cudnn", "unavailable", ("CUDA only",))])
    assert r.decision.reasons[-1] == "Their figures: in the Summary; why the others did not run: under Not run."


def test_at_other_lengths_the_same_backend_is_acceptable():
    r = _compare("nanback,flash", 128, check_numerics=False)
    assert r["nanback"].ok and r["nanback"].nonfinite is None and "nanback" in r.ranking


def test_without_a_warm_up_the_timing_rounds_untimed_step_finds_it():
    r = _compare("nanback,flash", 64, check_numerics=False, warmup=0)
    assert r["nanback"].nonfinite.step == "an untimed step of the timing rounds"
    assert r["nanback"].nonfinite.where == "model.layers.1.self_attn" and r.pick == "flash"


def test_a_nan_in_the_numerics_pass_only_is_found_there_with_the_layer(monkeypatch):
    checked = comparison._with_numerics

    def wrong_there(*a, **kw):  # the backend goes wrong in the numerics pass alone
        WHEN["numerics"] = True
        try:
            return checked(*a, **kw)
        finally:
            WHEN["numerics"] = False

    monkeypatch.setattr(comparison, "_with_numerics", wrong_there)
    r = _compare("nannumerics,flash", 32, mode="prefill")
    b = r["nannumerics"]
    assert b.status == "failed" and b.nonfinite.step == "the numerics pass"
    assert (b.nonfinite.value, b.nonfinite.direction, b.nonfinite.where) == ("NaN", "forward",
                                                                            "model.layers.0.self_attn")
    assert r.pick == "flash"


@pytest.fixture
def timed_flag(monkeypatch):
    """Marks the timed steps (``WHEN["timed"]``) and counts the checking work done inside them."""
    inside = {"marks": 0, "observed": 0}
    wall, mark, observe = capture._timed_wall, finite._mark, instrument.observe

    def timed_wall(target, c):
        WHEN["timed"] = True
        try:
            return wall(target, c)
        finally:
            WHEN["timed"] = False

    def counted_mark(t):
        inside["marks"] += WHEN["timed"]
        return mark(t)

    def counted_observe(*a, **kw):
        inside["observed"] += WHEN["timed"]
        return observe(*a, **kw)

    monkeypatch.setattr(capture, "_timed_wall", timed_wall)
    monkeypatch.setattr(finite, "_mark", counted_mark)
    monkeypatch.setattr(instrument, "observe", counted_observe)
    return inside


def test_an_inf_in_the_timed_steps_only_is_found_in_the_last_output_of_the_turn(timed_flag):
    r = _compare("inftimed,flash", 32, mode="prefill", check_numerics=False)
    b = r["inftimed"]
    # (the attention's Inf is a NaN by the logits: the step's output is what the timed steps keep)
    assert b.status == "failed" and b.nonfinite.value == "NaN" and b.nonfinite.direction == "forward"
    assert b.nonfinite.where == finite.OUTPUT and b.nonfinite.step == "the last timed step of a round"
    assert r.pick == "flash"


def test_no_checking_work_runs_inside_a_timed_step(timed_flag):
    r = _compare("nanback,flash", 128, check_numerics=False)  # a training step: forward, backward, per-call hooks
    assert r["nanback"].ok and r["flash"].ok
    assert timed_flag == {"marks": 0, "observed": 0}


def test_a_watch_reports_the_first_forward_nan_and_where(monkeypatch):
    model = tiny("llama")
    work = make_workload(model, batch=1, seq=16)
    _CALLS["n"] = 0
    with attnswitch.backend("nanlayer1", model=model), finite.watching("a test step") as w:
        w.output(work.step())
    found = w.first()
    assert found.text() == "NaN in the forward of model.layers.1.self_attn (a test step)"
    with attnswitch.backend("flash", model=model), finite.watching("a test step") as w:
        w.output(work.step())
    assert w.first() is None and len(w.marks) == 3  # two attention calls and the logits
    marks = [("forward", "a", torch.tensor(1.0)), ("backward", "b", torch.tensor(float("nan"))),
             ("forward", "c", torch.tensor(float("inf")))]
    assert finite.first(marks, "s").text() == "Inf in the forward of c (s)"  # a forward's before a backward's
    assert finite.output_marks([torch.zeros(2, dtype=torch.long), None, (torch.ones(3),)])[0][1] == finite.OUTPUT


def test_compare_checks_grads_in_the_numerics_pass_through_the_same_watch(monkeypatch):
    seen = []
    watching = finite.watching

    def spy(step):
        seen.append(step)
        return watching(step)

    monkeypatch.setattr(comparison.finite, "watching", spy)
    _compare("flash", 128, iters=1, rounds=1)
    assert seen.count("the numerics pass") >= 2  # its outputs, then its gradients
