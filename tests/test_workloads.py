"""Workloads as deployed: generation end to end, a training step, a sweep of lengths, a backend per phase."""

import csv
import mmap
import re
import statistics
import time

import pytest
import torch
from conftest import batch_for, tiny, world

import attnswitch
from attnswitch import cli
from attnswitch.backends import naive_attention
from attnswitch.comparison import compare, compare_sweep
from attnswitch.profiling.trace import Trace
from attnswitch.workload import make_workload
from benchmarks.real_clock import slow_backward

NEW = 5  # new tokens per prompt: small, every step still a real decode step


def _naive(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None):
    from attnswitch.backends import Call
    return naive_attention(Call(q, k, v, attn_mask, dropout_p, is_causal, scale))[0]


@pytest.fixture
def registered():
    """User backends registered for one test, unregistered after."""
    names = []

    def add(name, fn):
        names.append(attnswitch.register_backend(name, fn))
        return name
    yield add
    for n in names:
        attnswitch.unregister_backend(n)


def planned(clock, seconds):
    """A kernel that builds a 'plan' per key length the first time it sees it (as cuDNN does), for
    ``seconds`` of ``clock``."""
    seen = set()

    def fn(q, k, v, **kw):
        if k.shape[2] not in seen:
            seen.add(k.shape[2])
            clock.sleep(seconds)
        return _naive(q, k, v, **kw)
    return fn


def slow(clock, seconds, when=lambda q: True):
    """A kernel ``seconds`` of ``clock`` slower than naive, in the calls ``when(q)`` picks."""
    def fn(q, k, v, **kw):
        if when(q):
            clock.sleep(seconds)
        return _naive(q, k, v, **kw)
    return fn


# known delays on a virtual clock (conftest.vclock) are minutes long: what the rest of a tiny model's step
# takes on the real clock, however loaded the machine (seconds, at worst), stays far inside this
SLACK_MS = 20_000.0


# -- generation end to end ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def gen_report():
    m = tiny("llama")
    # two prompt lengths: the second meets key lengths the first saw, and new ones
    w = make_workload(m, batch=2, seq=12, mode="generate", new_tokens=NEW, prompt_lens=(10, 12))
    return w, compare(m, w, backends=["naive", "flash", "math"], warmup=1, iters=2, rounds=1, time_budget_s=0)


def test_generate_reports_every_step_of_every_prompt(gen_report):
    w, r = gen_report
    assert r.workload["mode"] == "generate" and r.workload["prompt_lens"] == list(w.generation.prompt_lens)
    n_prompts = len(w.generation.prompt_lens)
    for b in r.ok:
        g = b.generate
        assert g.ttft_ms > 0 and 0 < g.step_ms_p50 <= g.step_ms_p90 <= g.step_ms_p99
        # every decode step of the first workload after its first generate (which warms up everything it runs:
        # its steps are neither) is either new or seen: NEW - 2 intervals per generate
        assert g.new_shape_steps + g.seen_shape_steps == (n_prompts - 1) * (NEW - 2)
        assert g.new_shape_steps >= 1  # the longer prompt meets lengths the first did not, at its end
        assert g.seen_shape_steps > 0  # and lengths the first saw
        assert len(g.step_times_ms) == NEW - 2 and len(g.cold_step_times_ms) == NEW - 2
        tokens = 2 * NEW * n_prompts
        assert g.tokens_per_s == pytest.approx(tokens / (b.time_ms / 1e3))
        # float32 backends generate exactly what float32 eager generates
        assert g.token_agreement == 1.0 and g.first_diff_step is None
    # ranked by the median of each one's per-round ratios to the pick (paired), not by its own median time (a
    # backend tied with the pick may have a median ratio below 1: the pick is the lowest summed time)
    ratios = [r[n].margin.ratio for n in r.ranking]
    assert r.ranking[0] == r.pick and ratios[0] == 1.0 and ratios[1:] == sorted(ratios[1:])
    assert r[r.pick].margin.pairs == len(r[r.ranking[1]].time_rounds_ms)  # a pair per round, not per 0 held


def test_a_generate_is_timed_per_prompt_and_a_forward_by_the_median(gen_report):
    # a generate is host-bound: a round is one prompt, every backend generating it in turn (paired units a
    # prompt apart, not a workload), each prompt's time its decode steps at their median; the ranked time is
    # the sum over prompts of each prompt's median, the whole workloads (every prompt once) a check
    w, r = gen_report
    n_prompts = len(w.generation.prompt_lens)
    for b in r.ok:
        rows = b.time_rounds_ms
        assert len(rows) == 6  # iters=2 passes over 2 prompts, and at least MIN_PAIRS rounds
        assert all(len(u) == n_prompts and sum(x > 0 for x in u) == 1 for u in rows)
        assert [next(i for i, x in enumerate(u) if x > 0) for u in rows] == [0, 1] * 3  # prompt by prompt
        per_prompt = [statistics.median(u[i] for u in rows if u[i] > 0) for i in range(n_prompts)]
        assert b.time_ms == pytest.approx(sum(per_prompt))
        assert len(b.time_samples_ms) == 3  # whole workloads, every prompt once each
        assert b.generate.workload_wall_ms == pytest.approx(statistics.median(b.time_samples_ms))
        assert b.generate.steps_timed == len(rows) * (NEW - 2)
    assert "each prompt's median over the rounds" in r.to_markdown()
    m = tiny("llama")
    p = compare(m, batch_for(m), backends=["naive", "math"], warmup=1, iters=3, rounds=2, time_budget_s=0)
    for b in p.ok:
        assert len(b.time_samples_ms) == 3 and b.time_ms == sorted(b.time_samples_ms)[1]


def test_generate_time_per_workload_against_an_independent_clock(cpu_clock):
    # end to end, on a real clock: the workload timed outside attnswitch, in turns with attnswitch's own
    # timing (the fastest of each, with a wide margin). Both on this thread's CPU clock, which other
    # processes do not move: a busy machine stretches every wall-clock reading, by a different amount from
    # one moment to the next. The account itself is checked exactly on a virtual clock below.
    m = tiny("llama")
    w = make_workload(m, batch=1, seq=10, mode="generate", new_tokens=NEW, prompt_lens=(8, 10))
    walls, timed = [], []
    for _ in range(2):
        with attnswitch.backend("naive", model=m):
            w.step()  # warm
            for _ in range(2):
                t0 = cpu_clock()
                w.step()
                walls.append((cpu_clock() - t0) * 1e3)
        r = compare(m, w, backends=["naive"], warmup=0, iters=2, rounds=1, check_numerics=False, profile_steps=0,
                    time_budget_s=0)
        timed.append(r["naive"].time_ms)
    assert min(walls) / 3 < min(timed) < 3 * min(walls), (timed, walls)


def test_a_generates_time_is_its_whole_workload(registered, vclock):
    # every attention call of every forward of every prompt costs 10 s more: the ranked time of the workload
    # is all of them (prompts x new tokens forwards x two layers), not a step's or a prompt's
    registered("second", slow(vclock, 10.0))
    m = tiny("llama")
    w = make_workload(m, batch=1, seq=10, mode="generate", new_tokens=NEW, prompt_lens=(8, 10))
    r = compare(m, w, backends=["second"], warmup=0, iters=2, rounds=1, check_numerics=False)
    calls = len(w.generation.prompt_lens) * NEW * 2
    assert r["second"].time_ms == pytest.approx(calls * 10_000, abs=SLACK_MS)
    assert r["second"].generate.tokens_per_s == pytest.approx(2 * NEW / (r["second"].time_ms / 1e3))


def test_ttft_and_step_latency_against_known_delays(registered, vclock):
    # a kernel a known time slower per prefill call and per decode call (two layers each forward): against
    # naive in the same run, the first token comes 2 x 600 s later and each step 2 x 250 s later
    registered("sleepy", lambda q, k, v, **kw: slow(vclock, 600.0 if q.shape[2] > 1 else 250.0)(q, k, v, **kw))
    m = tiny("llama")
    w = make_workload(m, batch=1, seq=10, mode="generate", new_tokens=NEW, prompt_lens=(10,))
    r = compare(m, w, backends=["naive", "sleepy"], warmup=1, iters=5, rounds=1)  # medians of 5 steps
    a, b = r["naive"].generate, r["sleepy"].generate
    assert b.ttft_ms - a.ttft_ms == pytest.approx(1_200_000, abs=SLACK_MS)
    assert b.step_ms_p50 - a.step_ms_p50 == pytest.approx(500_000, abs=SLACK_MS)
    assert b.step_host_ms - a.step_host_ms == pytest.approx(500_000, abs=SLACK_MS)
    assert b.step_ms_p99 - a.step_ms_p99 == pytest.approx(500_000, abs=SLACK_MS)  # every step alike


def test_the_generation_section_is_headed_once(gen_report):
    from attnswitch import render

    _, r = gen_report
    text = render.to_text(r)
    assert [line.strip() for line in text.splitlines()].count("Generation") == 1, text
    md = r.to_markdown().splitlines()
    assert sum(line.lstrip("#").strip() == "Generation" for line in md if line.startswith("#")) == 1
    assert render.to_html(r).count(">Generation<") == 2  # its heading, and its entry in the page's contents


def test_the_profiled_generate_has_a_phase_on_every_layer_row(gen_report):
    _, r = gen_report
    b = r["naive"]
    layer_rows = [x for x in b.layers if x.kind != "outside"]
    assert {x.phase for x in layer_rows} == {"prefill", "decode"}
    attn = {(x.path, x.phase): x for x in b.layers if x.kind == "attention"}
    for layer in ("model.layers.0.self_attn", "model.layers.1.self_attn"):
        assert attn[(layer, "prefill")].calls == 1 and attn[(layer, "decode")].calls == 1  # per forward
    t = Trace.load(b.trace_path)
    phases = [e for e in t.ranges("attnswitch.phase:")]
    assert sum(e.name.endswith(":prefill") for e in phases) == 1 * len(t.steps())


def test_new_key_lengths_costs_are_seen_and_the_recommendation_says_when_it_flips(registered, vclock):
    m = tiny("llama")
    # a plan of 800 s per new key length, against 2 x 200 s per step for every step
    registered("planned", planned(vclock, 800.0))
    registered("steady", slow(vclock, 200.0))
    # (later prompts 2 tokens longer: each meets a new key length before its last step)
    w = make_workload(m, batch=1, mode="generate", new_tokens=NEW, prompt_lens=(8, 10, 12))
    r = compare(m, w, backends=["planned", "steady"], warmup=1, iters=2, rounds=1)
    g = r["planned"].generate
    assert g.new_shape_step_ms - g.seen_shape_step_ms == pytest.approx(800_000, abs=SLACK_MS)  # per new key length
    assert g.slow_attn_calls >= NEW - 2 and all(c.kv_len for c in g.slow_calls)
    assert {c.layer for c in g.slow_calls} <= {"model.layers.0.self_attn", "model.layers.1.self_attn"}
    assert r.ranking[0] == "planned"  # once every length has been seen it runs without a plan cost
    text = r.recommendation
    assert "fastest once every length has been seen" in text and "`steady`" in text and "many new lengths" in text
    # which phase decided it, from the phases' medians (the rule itself is tested on fixed numbers in
    # test_deciding_phase_is_the_one_the_best_gains_in_and_only_where_measured)
    assert "Decode decided it against `steady`" in text, text


def test_a_prefill_call_is_slow_against_prefill_calls_not_against_decode_steps(registered, vclock):
    m = tiny("llama")
    # every prefill call takes 100 s, every decode call 10 s (a real clock's hiccup is nothing beside them):
    # steady, never slow, though a prefill call is 10 decode calls; one call 900 s longer of each phase in the
    # first workload is slow
    first = {"prefill": True, "decode": True}

    def fn(q, k, v, **kw):
        phase = "prefill" if q.shape[2] > 1 else "decode"
        vclock.sleep(100.0 if phase == "prefill" else 10.0)
        if first[phase] and (phase == "prefill" or k.shape[2] > 9):
            first[phase] = False
            vclock.sleep(900.0)
        return _naive(q, k, v, **kw)
    registered("prefillheavy", fn)
    w = make_workload(m, batch=1, mode="generate", new_tokens=NEW, prompt_lens=(8, 12))
    g = compare(m, w, backends=["prefillheavy"], warmup=1, iters=2, rounds=1)["prefillheavy"].generate
    assert g.slow_attn_calls == 2, g.slow_calls
    prefill, decode = sorted(g.slow_calls, key=lambda c: c.step)
    assert prefill.step == 0 and prefill.steady_us == pytest.approx(100e6, rel=0.01)
    assert decode.step > 0 and decode.steady_us == pytest.approx(10e6, rel=0.01)


def test_a_static_caches_first_decode_step_at_each_cache_length_is_a_new_shape(registered, vclock):
    # a static cache's decode calls run at the cache's length, which its prefill met first: keyed on the key length
    # alone no decode step was ever new, and the cost per shape came from the first generate's warm-up instead
    # A generate's first decode step is slower than its later ones every time (300 s here), warm too: the new
    # steps are set against those same steps warm, not against later ones (which read 1100 s per shape)
    seen, after_prefill = set(), [False]

    def fn(q, k, v, **kw):
        if (q.shape[2], k.shape[2]) not in seen:  # a plan per (query, key) length, as cuDNN's graphs are
            seen.add((q.shape[2], k.shape[2]))
            vclock.sleep(800.0)
        if q.shape[2] > 1:
            after_prefill[0] = True
        elif after_prefill[0]:
            after_prefill[0] = False
            vclock.sleep(300.0)
        return _naive(q, k, v, **kw)
    registered("plannedqk", fn)
    m = tiny("llama")
    w = make_workload(m, batch=1, mode="generate", new_tokens=NEW, prompt_lens=(8, 10, 12), cache="static")
    g = compare(m, w, backends=["plannedqk"], warmup=1, iters=2, rounds=1)["plannedqk"].generate
    assert g.new_shape_steps == 2  # the later prompts' first decode steps, at their caches' lengths
    assert g.new_shape_step_ms - g.seen_shape_step_ms == pytest.approx(800_000, abs=SLACK_MS)


def test_a_policy_per_phase_is_measured_when_prefill_and_decode_winners_differ(registered, spy, vclock):
    m = tiny("llama")
    registered("fastprefill", slow(vclock, 200.0, when=lambda q: q.shape[2] == 1))  # slow decode steps
    registered("fastdecode", slow(vclock, 300.0, when=lambda q: q.shape[2] > 1))  # slow prefill
    w = make_workload(m, batch=1, seq=10, mode="generate", new_tokens=NEW, prompt_lens=(8, 10))
    r = compare(m, w, backends=["fastprefill", "fastdecode"], warmup=0, iters=1, rounds=1)
    pair = "prefill=fastprefill/decode=fastdecode"
    assert pair in [b.backend for b in r.backends] and r[pair].ok
    assert r.ranking[0] == pair
    calls = {(name, w_) for _, name, w_ in spy.calls}
    assert ("fastprefill", "model.layers.0.self_attn") in calls and ("fastdecode", "model.layers.0.self_attn") in calls


# -- a backend per phase in the switch --------------------------------------------------------------

def test_policy_runs_prefill_and_decode_with_their_backends_and_restores(spy):
    m = tiny("llama")
    b = batch_for(m, batch=1, pad=False, seq=6)
    before = world(m)
    with attnswitch.backend({"prefill": "math", "decode": "naive"}, model=m) as sel:
        assert str(sel) == "prefill=math/decode=naive"
        m.generate(**b, max_new_tokens=3, min_new_tokens=3, do_sample=False, pad_token_id=0)
    assert world(m) == before
    assert spy.names == ["math"] * 2 + ["naive"] * 4  # two layers: one prefill, two decode steps
    spy.calls.clear()
    with attnswitch.backend({"prefill": "math", "decode": "naive", "decode_max_query": 6}, model=m):
        m(**b)  # six query tokens: a decode step under this threshold
    assert spy.names == ["naive"] * 2
    attnswitch.patch(m, "prefill=flash/decode=naive")
    assert str(attnswitch.is_patched(m)) == "prefill=flash/decode=naive"
    attnswitch.unpatch(m)
    with pytest.raises(ValueError, match="unknown phase key"):
        attnswitch.backend({"prefil": "math", "decode": "naive"})
    with pytest.raises(ValueError, match="needs both"):
        attnswitch.backend({"prefill": "math"})


# -- a training step --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def train_report():
    m = tiny("llama")
    w = make_workload(m, batch=2, seq=12, mode="train", padding=True)
    return m, compare(m, w, backends=["naive", "math", "flash"], warmup=1, iters=2, rounds=1)


def test_train_step_times_forward_and_backward_and_checks_gradients(train_report):
    m, r = train_report
    assert not m.training  # the model's mode as found
    assert "labels = the inputs" in r.workload["loss"]
    for b in r.ok:
        t = b.train
        assert t.forward_ms > 0 and t.backward_ms > 0
        assert t.grad_ok and t.grad_max_rel_err < 1e-4 and (t.worst_grad or t.grad_max_rel_err == 0)
    assert set(r.ranking) == {"naive", "math", "flash"}


def _slow_backward(seconds, sleep):
    SlowBackward = slow_backward(seconds, sleep)
    return lambda q, k, v, **kw: SlowBackward.apply(_naive(q, k, v, **kw))


def test_forward_and_backward_times_against_known_delays(registered, vclock):
    # 500 s more in each layer's backward (two layers) and nothing more in the forward than naive's
    registered("slowbwd", _slow_backward(500.0, vclock.sleep))
    m = tiny("llama")
    w = make_workload(m, batch=1, seq=8, mode="train")
    r = compare(m, w, backends=["naive", "slowbwd"], warmup=1, iters=5, rounds=1)  # medians of 5 steps
    a, b = r["naive"].train, r["slowbwd"].train
    assert b.backward_ms - a.backward_ms == pytest.approx(1_000_000, abs=SLACK_MS)
    assert b.forward_ms - a.forward_ms == pytest.approx(0, abs=SLACK_MS)
    assert r["slowbwd"].time_ms == pytest.approx(b.forward_ms + b.backward_ms, abs=SLACK_MS)


def test_a_known_backward_delay_on_the_real_clock(registered):
    # end to end, with a real sleep: 50 ms more in each layer's backward. A sleep is never shorter than
    # asked, so the backward's time holds both, whatever the load. Where exactly the delay goes (all of it
    # in the backward, none in the forward) the virtual clock above shows; how close the real clock's
    # figures come to it, which depends on the load, `benchmarks/real_clock.py` shows on a quiet machine.
    registered("slowbwd", _slow_backward(0.05, time.sleep))
    m = tiny("llama")
    w = make_workload(m, batch=1, seq=8, mode="train")
    r = compare(m, w, backends=["naive", "slowbwd"], warmup=1, iters=5, rounds=1, check_numerics=False)
    a, b = r["naive"].train, r["slowbwd"].train
    assert b.backward_ms >= 100 and a.backward_ms > 0, (a, b)  # the sleeps are counted, in the backward


def test_the_backward_is_attributed_to_the_layers_whose_forward_made_it(train_report):
    _, r = train_report
    b = r["naive"]
    t = Trace.load(b.trace_path)
    steps = {s.step for s in t.steps()}
    backward = [e for e in t.events if e.cat == "cpu_op" and e.name.startswith("autograd::engine::evaluate_function")
                and not e.parent_is_op and e.step in steps]
    assert backward and all(e.phase == "backward" and e.module is not None for e in backward)
    rows = {(x.path, x.kind, x.phase): x for x in b.layers}
    for i in (0, 1):
        assert rows[(f"model.layers.{i}.self_attn", "attention", "backward")].ops > 0  # attention's own backward
        assert rows[(f"model.layers.{i}.mlp.down_proj", "module", "backward")].ops > 0
    assert not any(x.kind == "outside" and x.phase == "backward" for x in b.layers)
    outermost = [e for e in t.events if e.cat == "cpu_op" and not e.parent_is_op and e.step in steps]
    assert sum(x.ops for x in b.layers) * len(steps) == pytest.approx(len(outermost))


def test_a_backend_with_wrong_or_nan_gradients_is_flagged_loudly(registered):
    m = tiny("llama")

    class WrongGrad(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, g):
            return g * 3.0

    class NanGrad(WrongGrad):
        @staticmethod
        def backward(ctx, g):
            return g * float("nan")

    registered("wronggrad", lambda q, k, v, **kw: WrongGrad.apply(_naive(q, k, v, **kw)))
    registered("nangrad", lambda q, k, v, **kw: NanGrad.apply(_naive(q, k, v, **kw)))
    w = make_workload(m, batch=1, seq=8, mode="train")
    r = compare(m, w, backends=["naive", "wronggrad", "nangrad"], warmup=0, iters=1, rounds=1)
    assert r["naive"].train.grad_ok
    assert r["wronggrad"].ok and r["wronggrad"].train.grad_ok is False and "wronggrad" not in r.ranking
    assert r["nangrad"].status == "failed" and "NaN" in r["nangrad"].reasons[0]
    assert "numerics beyond tolerance: wronggrad" in r.recommendation


# -- a sweep of lengths -----------------------------------------------------------------------------

def test_a_sweep_reports_each_shape_and_recommends_per_length_range():
    m = tiny("llama")
    r = compare_sweep(m, [(1, 8), (1, 16), (1, 32)], backends=["naive", "flash"], warmup=0, iters=2, rounds=1)
    assert [p.seq for p in r.sweep] == [8, 16, 32]
    for p in r.sweep:
        assert {b.backend for b in p.backends} == {"naive", "flash"} and all(b.time_ms for b in p.backends)
        assert p.ranking and all(not b.layers for b in p.backends)
    assert r["naive"].layers  # the last shape's full results
    first, per_length = r.recommendation.splitlines()[:2]
    assert first.startswith(f"Use `{r.pick}` over seq 8–32: ") and r.pick == r.deploy.pick
    assert per_length.startswith("Best per length at batch 1: seq 8")
    back = attnswitch.Report.from_json(r.to_json())
    assert back.sweep == r.sweep


def _point(batch, seq, ties=None, **ms):
    from attnswitch.results import BackendResult, SweepPoint

    order = tuple(sorted(ms, key=ms.get))
    res = tuple(BackendResult(n, "ok", time_ms=t) for n, t in ms.items())
    return SweepPoint(batch, seq, res, order, tuple(ties) if ties else order[:1])


def test_the_sweep_recommendation_groups_ties_and_names_the_crossover():
    from attnswitch.recommend import recommend_sweep
    from attnswitch.results import SweepPoint

    # flash is the pick at 512 with cudnn tied, cudnn the pick beyond: one backend serves every length
    points = [_point(1, 512, ("flash", "cudnn"), flash=1.000, cudnn=1.004, math=3.0),
              _point(1, 2048, cudnn=3.9, flash=4.0, math=12.0), _point(1, 8192, cudnn=30.0, flash=34.0, math=200.0)]
    assert recommend_sweep(points) == "Best per length at batch 1: seq 512–8192: `cudnn`."
    # ties at a length are named together; where no backend of one range's is among the next's, the crossover
    tied = recommend_sweep([_point(1, 512, ("flash", "cudnn"), flash=1.0, cudnn=1.003, math=3.0),
                            _point(1, 1024, ("flash", "cudnn"), flash=2.0, cudnn=2.005),
                            _point(1, 4096, efficient=9.0, cudnn=10.0, flash=12.0)])
    assert tied == ("Best per length at batch 1: seq 512–1024: `flash` ≈ `cudnn`; seq 4096: `efficient`. "
                    "Crossover between seq 1024 and 4096, `efficient` overtakes `flash`.")
    # nothing usable at a length is said so, not skipped
    assert "no candidate ran acceptably" in recommend_sweep([SweepPoint(1, 64, (), ())])


def test_the_sweep_recommendation_is_per_batch_size():
    from attnswitch.recommend import recommend_sweep

    # flash wins every length at batch 1, cudnn every length at batch 8: no range or crossover across batches
    points = [_point(1, 512, flash=1.0, cudnn=2.0), _point(1, 2048, flash=3.0, cudnn=4.0),
              _point(8, 512, cudnn=5.0, flash=6.0), _point(8, 2048, cudnn=9.0, flash=12.0)]
    assert recommend_sweep(points) == ("Best per length at batch 1: seq 512–2048: `flash`.\n"
                                       "Best per length at batch 8: seq 512–2048: `cudnn`.")


def test_a_sweep_pads_when_asked_keeps_each_shapes_traces_and_measures_each_shape_once(tmp_path, registered):
    masks = []

    def seer(q, k, v, attn_mask=None, **kw):
        masks.append(None if attn_mask is None else bool((attn_mask == 0).any() if attn_mask.dtype == torch.bool
                                                         else torch.isinf(attn_mask).any()))
        return _naive(q, k, v, attn_mask=attn_mask, **kw)
    registered("seer", seer)
    m = tiny("llama")
    # shapes as a report stores them (lists) or as tuples
    r = compare_sweep(m, [[2, 8], (2, 16), (2, 8)], backends=["seer"], warmup=0, iters=1, rounds=1,
                      padding=True, trace_dir=tmp_path / "traces", check_numerics=False)
    assert [(p.batch, p.seq) for p in r.sweep] == [(2, 8), (2, 16)]
    rows = list(csv.DictReader(r.to_csv().splitlines()))  # every shape's rows, not the last shape's alone
    assert [(row["batch"], row["seq"], row["backend"], row["rank"]) for row in rows] == [
        ("2", "8", "seer", "1"), ("2", "16", "seer", "1")]
    assert masks and all(masks)  # every call saw a mask hiding positions: the padding reached the model
    assert r.workload["description"] == "sweep of 2 shapes, prefill, padded"
    files = r.trace_files()
    assert [rel for _, rel, _ in files] == ["batch2_seq8/trace_seer.json.gz", "batch2_seq16/trace_seer.json.gz"]
    assert all((tmp_path / "traces" / rel).exists() for _, rel, _ in files)  # neither overwrote the other
    assert len(r.save_traces(tmp_path / "copy")) == 2
    # a sweep recorded when every shape wrote the same file: that file is the last shape's alone
    import dataclasses
    shared = dataclasses.replace(r, sweep=tuple(dataclasses.replace(p, backends=tuple(
        dataclasses.replace(b, trace_path=files[-1][2]) for b in p.backends)) for p in r.sweep))
    assert [rel for _, rel, _ in shared.trace_files()] == ["batch2_seq16/trace_seer.json.gz"]


def test_deciding_phase_is_the_one_the_best_gains_in_and_only_where_measured():
    from types import SimpleNamespace as NS

    from attnswitch.candidate import parse
    from attnswitch.recommend import _deciding_phase

    def row(name, ttft, step):
        return NS(backend=name, candidate=parse(name), noise_pct=None, compile=None,
                  generate=NS(ttft_ms=ttft, step_ms_p50=step, new_shape_step_ms=None, seen_shape_step_ms=None))

    w = {"prompt_lens": [8, 9], "new_tokens": 5}
    best = row("cudnn", 10.0, 2.0)
    other = row("math", 11.0, 3.0)
    assert _deciding_phase(best, other, w) == ("Decode decided it against `math` (each phase's median, over the "
                                               "workload: prefill +2.0 ms, decode +8.0 ms).")
    loser = row("naive", 5.0, 1.0)  # faster in both phases' medians
    text = _deciding_phase(best, loser, w)
    assert "decided" not in text and "do not show its lead" in text
    one_token = {"prompt_lens": [8], "new_tokens": 1}  # no decode step: prefill alone is told
    assert _deciding_phase(best, other, one_token) == ("Prefill decided it against `math` (each phase's median, over "
                                                       "the workload: prefill +1.0 ms).")
    mixed = row("flash", 11.5, 1.9)  # +3.0 prefill, -0.8 decode: net gain
    assert "Prefill decided it" in _deciding_phase(best, mixed, w)
    both = row("math", 11.3, 2.2)  # +2.6 prefill, +1.6 decode: neither gains twice the other
    assert _deciding_phase(best, both, w) == ("Both phases gain against `math` (each phase's median, over the "
                                              "workload: prefill +2.6 ms, decode +1.6 ms).")
    assert "Prefill decided it" in _deciding_phase(best, row("math", 11.3, 2.1), w)  # +2.6 against +0.8
    net_loss = row("flash", 10.5, 1.8)  # +1.0 prefill, -1.6 decode
    assert "do not show its lead" in _deciding_phase(best, net_loss, w)
    assert _deciding_phase(row("cudnn", None, None), other, w) == ""
    # both run naive for prefill: that phase's difference is noise, and never what decided it
    policy = row("prefill=naive/decode=naive-inplace", 10.0, 2.0)
    assert _deciding_phase(policy, row("naive", 10.5, 3.0), w) == (
        "Decode decided it against `naive` (each phase's median, over the workload: decode +8.0 ms).")
    assert _deciding_phase(policy, row("naive", 10.5, 1.0), w) == (
        "Against `naive` the phases' medians do not show its lead (decode -8.0 ms over the workload).")
    # compiled against the same backend uncompiled: a generate compiles its decode steps alone, so their prefills
    # run the same eager backend, and that phase's difference is noise
    compiled = row("flash+compile", 10.3, 1.5)
    assert _deciding_phase(compiled, row("flash", 10.0, 2.0), w) == (
        "Decode decided it against `flash` (each phase's median, over the workload: decode +4.0 ms).")
    # an encoder-decoder's first decoder step (its prefill, one query token) is compiled too: told
    assert "prefill -0.6 ms, decode +4.0 ms" in _deciding_phase(compiled, row("flash", 10.0, 2.0),
                                                               {**w, "encoder_decoder": True})
    # a tie decided nothing: no phase is said to have decided it
    from attnswitch.recommend import _generate_lines
    assert not any("decided" in line for line in _generate_lines(best, [other], w, tied=True))
    assert any("Decode decided" in line for line in _generate_lines(best, [other], w, tied=False))


@pytest.mark.parametrize("kw, message", [
    (dict(seq=65), "seq 65 (65) is beyond the 64 positions of the model's position table"),
    (dict(seq=64, mode="decode"), "seq 64 plus the decoded token (65) is beyond"),
    (dict(seq=65, mode="train"), "beyond the 64 positions"),
    (dict(seq=8, mode="generate", prompt_lens=(60,), new_tokens=5), "a prompt of 60 tokens plus 5 new ones (65)"),
    (dict(batch=1, seq=8, padding=True), "padding needs a batch of 2 or more"),
    (dict(batch=2, seq=8, padding=True, mode="generate"), "a generate's prompts are whole"),
])
def test_workloads_the_model_cannot_take_are_refused_before_any_forward(kw, message):
    m = tiny("gpt2")  # a learned table of 64 absolute positions: the 65th has no row
    with pytest.raises(ValueError, match=re.escape(message)):
        make_workload(m, **kw)


def test_computed_positions_run_past_the_configs_maximum():
    import numpy as np
    m = tiny("llama", max_position_embeddings=16)  # rotary: no table to run out of
    w = make_workload(m, batch=np.int64(1), seq=np.int64(32))  # numpy's integers are whole numbers too
    with torch.no_grad():
        assert w().logits.shape[1] == 32


def test_encoder_decoder_generate_runs_from_the_decoders_start_token():
    from attnswitch.models import load_model

    m, _ = load_model("t5-small", layers=1)
    w = make_workload(m, batch=1, seq=6, mode="generate", new_tokens=2, prompt_lens=(6,))
    r = compare(m, w, backends=["naive"], warmup=0, iters=1, rounds=1)
    assert r["naive"].ok and r["naive"].generate.token_agreement == 1.0


def test_a_padded_workload_has_padding():
    # make_workload's padding "left-pads a decoder's batch", and --padding is refused for batch 1 because "the first
    # row keeps every position, the others are padded": at seq 3 a row is padded too, or a backend that refuses
    # padding would be said to run it. A wrong workload would be described "batch 2, seq 3, prefill, padded" over a
    # mask of all ones ([[1, 1, 1], [1, 1, 1]]).
    from attnswitch.workload import make_workload

    m = tiny("llama")
    work = make_workload(m, batch=2, seq=3, padding=True)
    assert "padded" in work.description
    assert not bool(work.kwargs["attention_mask"].all()), work.kwargs["attention_mask"].tolist()


def test_a_generate_sweeps_csv_rows_say_their_new_tokens():
    # two shapes told apart only by their new tokens used to read as two rows of "1,6,naive" with other times
    r = compare_sweep(tiny("llama"), [(1, 6)], mode="generate", new_tokens=[2, 3], backends=["naive"], warmup=0,
                      iters=1, rounds=1, time_budget_s=0, check_numerics=False)
    rows = list(csv.DictReader(r.to_csv().splitlines()))
    assert [(row["batch"], row["seq"], row["new_tokens"], row["backend"]) for row in rows] == [
        ("1", "6", "2", "naive"), ("1", "6", "3", "naive")]
    assert [float(row["time_ms"]) for row in rows] == [p.backends[0].time_ms for p in r.sweep]


@pytest.mark.parametrize("around", [1, 2])
def test_a_generate_workload_around_a_length_under_3_has_prompt_lengths_from_1_to_that_length_plus_2(around):
    # docs/cli.md: "--prompt-len N ... generate: five prompt lengths spread around N (fewer for N under 3: they
    # start at 1)"; docs/python-api.md: make_workload(mode="generate") "for prompts of `prompt_lens` tokens
    # (default: five lengths around `seq`)". Around 1 that is three prompts (1, 2, 3 tokens), around 2 four
    # (1, 2, 3, 4); around 3 there is room for five (1-5).
    m = tiny("llama")
    work = make_workload(m, mode="generate", batch=1, seq=around, new_tokens=2)
    # five where there is room, 1 to N + 2 below 3
    lens = work.generation.prompt_lens
    assert list(lens) == list(range(1, around + 3)), lens


@pytest.mark.parametrize("around, new_tokens, want", [(8, 128, (2, 5, 8, 11, 14)), (32, 100, (2, 17, 32, 47, 62)),
                                                     (32, 8, (28, 30, 32, 34, 36)), (3, 8, (1, 2, 3, 4, 5))])
def test_a_generate_workloads_five_prompt_lengths_stay_around_a_short_length(around, new_tokens, want):
    # a quarter of new_tokens apart where they fit; closer where the shortest would be under one token. Before,
    # they were clamped to 1 and merged: around 8 with 128 new tokens, (1, 8, 40, 72), far above what was asked
    m = tiny("llama")
    work = make_workload(m, mode="generate", batch=1, seq=around, new_tokens=new_tokens)
    assert work.generation.prompt_lens == want


# -- the command line -------------------------------------------------------------------------------

def test_cli_generate_train_and_sweep(tmp_path, capsys):
    base = ["tiny-llama", "--device", "cpu", "--num-layers", "1", "--iters", "1", "--warmup", "0"]
    assert cli.main(["compare", *base, "--mode", "generate", "--prompt-len", "8", "--new-tokens", "3",
                     "--backends", "naive,flash,prefill=flash/decode=naive", "--out", str(tmp_path / "g")]) == 0
    rep = attnswitch.Report.from_json(tmp_path / "g" / "report.json")
    assert rep["prefill=flash/decode=naive"].generate.ttft_ms > 0 and rep.workload["new_tokens"] == 3
    rows = {row["backend"]: row for row in csv.DictReader((tmp_path / "g" / "report.csv").read_text().splitlines())}
    assert float(rows["naive"]["ttft_ms"]) == pytest.approx(rep["naive"].generate.ttft_ms)
    assert float(rows["naive"]["tokens_per_s"]) == pytest.approx(rep["naive"].generate.tokens_per_s)
    assert cli.main(["compare", *base, "--mode", "train", "--seq", "8", "--backends", "naive,math"]) == 0
    assert cli.main(["compare", *base, "--seq", "8,16", "--backends", "naive,flash"]) == 0
    out = capsys.readouterr()
    assert "Best per length" in out.out
    assert re.search(r"attnswitch: \[ *[0-9.]+ s\] naive", out.err)  # one line per step, stderr not a terminal


@pytest.mark.parametrize("argv, message", [
    (["--mode", "generate", "--new-tokens", "0"], "at least 1"),
    (["gpt2", "--mode", "generate", "--prompt-len", "1000", "--new-tokens", "200"], "beyond the 1024 positions"),
    (["bert-base", "--mode", "generate"], "cannot generate"),
    (["--backends", "prefil=math/decode=naive"], "unknown phase key"),
    (["--mode", "decode", "--seq", "8,16"], "a sweep"),
    (["gpt2", "--seq", "2000"], "seq 2000 (2000) is beyond the 1024 positions of the model's position table"),
    (["gpt2", "--seq", "16,2000"], "seq 2000 (2000) is beyond"),  # every shape of a sweep, before the first runs
    (["gpt2", "--mode", "train", "--seq", "2000"], "beyond the 1024 positions"),
    (["--padding", "--batch", "1"], "--padding needs a batch of 2 or more"),
    (["--padding", "--mode", "generate"], "a generate's prompts are whole"),
    (["--num-layers", "0"], "--num-layers must be at least 1"),
    (["--backends", "[/x]"], "unknown attention backend '[/x]'"),  # user input is never read as markup
])
def test_cli_bad_workload_input_is_one_line_and_exit_2(argv, message, capsys, monkeypatch):
    import attnswitch.profiling as profiling
    monkeypatch.setattr(profiling, "profile", lambda *a, **k: pytest.fail("no work before the input is checked"))
    if argv[0] not in ("bert-base", "gpt2"):
        argv = ["tiny-llama", *argv]
    layers = [] if "--num-layers" in argv else ["--num-layers", "1"]
    assert cli.main(["compare", *argv, "--device", "cpu", *layers]) == 2
    err = capsys.readouterr().err
    assert message in " ".join(err.split()) and err.count("\n") <= 3


def test_new_length_costs_within_the_noise_are_not_told_as_costs_or_flips():
    from attnswitch.decision import recommend
    from attnswitch.ranking import verdict
    from attnswitch.results import BackendResult, GenerateStats

    def result(name, ms, new, seen):
        g = GenerateStats(ttft_ms=20.0, step_ms_p50=seen, new_shape_step_ms=new, seen_shape_step_ms=seen, tokens=96)
        return BackendResult(name, "ok", time_ms=ms, noise_pct=12.0, generate=g, time_rounds_ms=((ms,),) * 6)

    work = {"mode": "generate", "prompt_lens": [500, 512, 524], "new_tokens": 24}
    # a 0.9 ms gap on 11 ms steps, under the 12 % noise: neither a cost per new length nor a flip
    close = [result("flash", 700.0, 11.9, 11.0), result("math", 870.0, 11.5, 13.1)]
    text = recommend(close, verdict(close), work)
    assert "each new key length costs" not in text and "many new lengths" not in text
    # a plan per new length (40 ms on 11 ms steps) is told, and the backend without one named
    planned = [result("cudnn", 700.0, 51.0, 11.0), result("math", 870.0, 13.3, 13.1)]
    text = recommend(planned, verdict(planned), work)
    assert "each new key length costs it 40.000 ms more per step" in text and "`math`" in text
    assert "wins for workloads with many new lengths" in text


def test_a_compiled_picks_compile_is_not_told_as_a_cost_per_new_key_length():
    # its new-length steps are those it compiled during (7394 ms "per new key length", math "wins for workloads with
    # many new lengths"), while a graph of dynamic shapes meets later lengths without compiling
    from attnswitch.decision import recommend
    from attnswitch.ranking import verdict
    from attnswitch.results import BackendResult, GenerateStats

    def result(name, ms, new, seen, **kw):
        g = GenerateStats(ttft_ms=20.0, step_ms_p50=seen, new_shape_step_ms=new, seen_shape_step_ms=seen, tokens=96)
        return BackendResult(name, "ok", time_ms=ms, noise_pct=5.0, generate=g, time_rounds_ms=((ms,),) * 6, **kw)

    work = {"mode": "generate", "prompt_lens": [8, 10, 12], "new_tokens": 6}
    rs = [result("flash+compile", 30.0, 7395.0, 0.8, compile="default", compile_ms=14800.0, recompiles=1),
          result("math", 45.0, 1.5, 1.4)]
    text = recommend(rs, verdict(rs), work)
    assert "new key length costs" not in text and "many new lengths" not in text, text


def test_plan_cache_growth_against_what_the_backend_kept(registered):
    # a backend that keeps 8 MiB of host memory per key length it meets, as a plan cache would: fresh pages,
    # written (so resident) and mapped on their own (so no memory the allocator already holds is reused):
    # the process's growth over the first workload is what it kept, give or take a few MiB
    kept = {}

    def hoarder(q, k, v, **kw):
        if k.shape[2] not in kept:
            kept[k.shape[2]] = mmap.mmap(-1, 8 << 20)
            kept[k.shape[2]].write(b"\x01" * (8 << 20))
        return _naive(q, k, v, **kw)

    registered("hoarder", hoarder)
    m = tiny("llama")
    w = make_workload(m, batch=1, seq=10, mode="generate", new_tokens=NEW)
    r = compare(m, w, backends=["hoarder"], warmup=1, iters=1, rounds=1, check_numerics=False, profile_steps=0)
    expected_mb = 8 * len(kept)
    assert expected_mb >= 40
    assert expected_mb - 4 <= r["hoarder"].generate.plan_cache_host_mb <= expected_mb + 16


def test_num_layers_where_layer_types_is_computed_and_where_there_are_two_stacks():
    from transformers import BartConfig, JambaConfig

    from attnswitch.models import _set_layers

    jamba = JambaConfig(num_hidden_layers=4, attn_layer_period=2, attn_layer_offset=1, expert_layer_period=2,
                        expert_layer_offset=1, use_mamba_kernels=False)
    assert _set_layers(jamba, 2) == ", first 2 of 4 layers" and len(jamba.layer_types) == 2  # a property: it follows
    bart = BartConfig(encoder_layers=4, decoder_layers=3)
    assert _set_layers(bart, 1) == ", first 1 of 3 layers" and (bart.encoder_layers, bart.decoder_layers) == (1, 1)


def test_a_candidate_running_another_ones_kernel_is_measured_after_it_and_says_its_caches_were_warm():
    # a plan cache is the kernel's: were auto measured first, it would pay flash's cold costs and flash would
    # look as if it had none. Forced backends first; auto after, with a note; reported in the order asked for.
    m = tiny("llama")
    w = make_workload(m, batch=2, seq=12, mode="generate", new_tokens=NEW, prompt_lens=(10, 12))
    steps = []
    r = compare(m, w, backends=["auto", "flash", "math"], progress=steps.append, time_budget_s=0,
                check_numerics=False)
    assert steps[:3] == ["flash", "math", "auto"]
    # (then the policy per phase where the best prefill and decode differ, measured last)
    assert [b.backend for b in r.backends if "=" not in b.backend] == ["auto", "flash", "math"]
    assert any("`flash`, measured before it, runs them too" in n for n in r["auto"].notes)
    assert not any("were warm" in n for n in r["flash"].notes + r["math"].notes)


def test_auto_is_told_its_kernels_new_length_cost_as_the_forced_backend_measured_before_it_paid():
    # auto met flash's caches warm (flash measured first): its own new-length steps cost nothing more; a
    # deployment of auto alone pays what flash paid, and the recommendation says that cost
    from attnswitch.recommend import _generate_lines
    from attnswitch.results import BackendResult, GenerateStats
    auto = BackendResult("auto", "ok", time_ms=100.0, noise_pct=1.0,
                         attn_ops=("aten::_scaled_dot_product_flash_attention_for_cpu",),
                         generate=GenerateStats(new_shape_step_ms=10.0, seen_shape_step_ms=10.0))
    flash = BackendResult("flash", "ok", time_ms=101.0, noise_pct=1.0,
                          generate=GenerateStats(new_shape_step_ms=50.0, seen_shape_step_ms=10.0))
    math_ = BackendResult("math", "ok", time_ms=150.0, noise_pct=1.0,
                          generate=GenerateStats(new_shape_step_ms=15.0, seen_shape_step_ms=15.0))
    text = " ".join(_generate_lines(auto, [flash, math_], {"prompt_lens": [10, 12], "new_tokens": 4}))
    assert "each new key length costs it 40.000 ms more per step (as `flash`" in text
    assert "`math` (15.000 ms per new-length step) wins for workloads with many new lengths" in text


def test_a_prompt_of_a_generate_workload_is_checked():
    m = tiny("llama")
    w = make_workload(m, batch=1, seq=10, mode="generate", new_tokens=NEW, prompt_lens=(8, 10))
    assert w.prompt(-1).generation.prompt_lens == (10,) and w.prompt(1, new_tokens=2).generation.new_tokens == 2
    with pytest.raises(IndexError, match="prompt 2 of a generate workload of 2 prompts"):
        w.prompt(2)
    with pytest.raises(ValueError, match="generate workload's; this one is prefill"):
        make_workload(m, batch=1, seq=10).prompt(0)



def test_a_cli_generate_sweep_takes_the_generate_defaults(tmp_path):
    # a sweep's work is a list of shapes: its mode is the command's, not the prefill defaults (12 iters a
    # backend, 60 rounds of 5 prompts: every round MAX_ROUNDS allows, none left to adapt)
    argv = ["compare", "tiny-llama", "--device", "cpu", "--num-layers", "1", "--mode", "generate", "--prompt-len",
            "8,12", "--new-tokens", "3", "--backends", "naive,flash", "--time-budget", "0", "--out", str(tmp_path)]
    assert cli.main(argv) == 0
    rep = attnswitch.Report.from_json(tmp_path / "report.json")
    assert rep.settings["iters"] == 1 and rep.settings["rounds"] == 6
    assert all(len(b.time_rounds_ms) == 6 for p in rep.sweep for b in p.backends if b.ok)


def test_a_model_configured_without_a_cache_generates_with_one_its_decode_steps_one_token_each(registered):
    # a config with use_cache=False ran every generated token over the whole sequence: no decode step, a per-phase
    # policy's decode backend never ran, and the ranked time left out half the work
    seen = []

    def recording(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None):
        seen.append(q.shape[-2])
        return _naive(q, k, v, attn_mask, dropout_p, is_causal, scale)

    registered("recording", recording)
    m = tiny("llama", use_cache=False)
    work = make_workload(m, batch=1, mode="generate", prompt_lens=(6,), new_tokens=3)
    with attnswitch.backend("recording", model=m):
        work.step()
    layers = m.config.num_hidden_layers
    assert seen == [6] * layers + [1] * (2 * layers)  # the prompt, then two decode steps of one token each


def test_a_model_of_other_code_configured_without_a_cache_keeps_its_configs_word():
    # a model that cannot take a cache (remote code) fed only the last token to each step once the cache was forced
    from transformers import LlamaForCausalLM

    from attnswitch.workload import caches

    class OwnCode(LlamaForCausalLM):
        pass

    OwnCode.__module__ = "transformers_modules.someone.model"
    m = tiny("llama", use_cache=False)
    own = OwnCode(m.config).eval()
    assert caches(m) and not caches(own) and caches(tiny("llama"))
    work = make_workload(own, batch=1, mode="generate", prompt_lens=(6,), new_tokens=2)
    assert "use_cache" not in work.generate_kwargs() and "no KV cache (the model's config)" in work.description
    assert work.describe()["cache"] == "none"  # (what a report and the Deploy section read, a sweep's too)
    assert make_workload(m, batch=1, mode="generate", prompt_lens=(6,), new_tokens=2).generate_kwargs()["use_cache"]


def test_a_batch_holding_a_kv_cache_is_a_step_on_a_copy_of_it_and_leaves_the_callers_as_it_was():
    from transformers import DynamicCache

    from attnswitch.workload import cache_kwarg

    model, key = tiny("llama"), cache_kwarg(tiny("llama"))  # (past_key_values before transformers 5.2x)
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        model(torch.randint(0, 100, (1, 8)), **{key: cache}, use_cache=True)
    step = {"input_ids": torch.randint(0, 100, (1, 1)), key: cache}
    r = compare(model, step, backends=["naive", "math", "flash"], warmup=1, iters=3, rounds=2, time_budget_s=0)
    assert cache.get_seq_length() == 8  # every step, and every backend's numerics, ran on a copy
    assert r.workload["mode"] == "decode" and r.workload["seq"] == 8 and "a KV cache of 8 tokens" in \
        r.workload["description"]
    assert {s.kv_len for b in r.backends for s in b.attn_shapes} == {9}  # every backend at the same key length
    assert all(b.numerics.ok for b in r.backends) and r.pick is not None
    assert attnswitch.check(model, **step, backends=["math", "flash"]).eligible == ["math", "flash"]
    assert cache.get_seq_length() == 8
    # more than one new token against the cache: a prefill, still on copies
    chunk = {"input_ids": torch.randint(0, 100, (1, 3)), "attention_mask": torch.ones(1, 11, dtype=torch.long),
             key: cache}
    r = attnswitch.profile(model, chunk, backends=["math"], iters=2, rounds=1, time_budget_s=0)
    assert r.workload["mode"] == "prefill" and cache.get_seq_length() == 8
    assert {s.kv_len for s in r["math"].attn_shapes} == {11}


def test_an_encoder_decoder_step_against_its_cache_is_a_decode_step_in_half_precision_too():
    from transformers import T5Config, T5ForConditionalGeneration

    from attnswitch.workload import cache_kwarg, fresh

    torch.manual_seed(0)
    t5 = T5ForConditionalGeneration(T5Config(vocab_size=128, d_model=64, d_kv=16, d_ff=128, num_layers=2,
                                             num_heads=4, decoder_start_token_id=0)).eval().to(torch.bfloat16)
    enc, key = torch.randint(0, 128, (2, 8)), cache_kwarg(t5)
    with torch.no_grad():
        cache = t5(input_ids=enc, decoder_input_ids=torch.zeros(2, 3, dtype=torch.long), use_cache=True)[key]
    step = {"input_ids": enc, "decoder_input_ids": torch.zeros(2, 1, dtype=torch.long), key: cache}
    r = compare(t5, step, backends=["naive", "math"], warmup=1, iters=2, rounds=1, time_budget_s=0)
    assert r.workload["mode"] == "decode" and r.workload["seq"] == 3 and cache.get_seq_length() == 3
    assert all(b.numerics.ok for b in r.backends)  # (its float32 reference got a float32 copy of both caches)
    assert {(s.q_len, s.kv_len) for s in r["math"].attn_shapes} == {(8, 8), (1, 4), (1, 8)}
    # a cache holding a stream (an offloading one's) is copied with the stream shared, not copied
    from transformers import DynamicCache

    offloading = DynamicCache(config=t5.config, offloading=True)
    copied = fresh({key: offloading})[key]
    assert copied is not offloading and copied.prefetch_stream is offloading.prefetch_stream


def test_the_first_generates_steps_are_neither_new_nor_seen():
    # every length is new in the first generate, and so is everything else it runs first: its warm-up was charged
    # as a cost per new key length (2.3 ms "per new length" from two cold steps, a length-mix pick flipping
    # between identical runs)
    from types import SimpleNamespace as NS

    from attnswitch.profiling.clock import Forward
    from attnswitch.profiling.stepstats import _new_shape_steps

    forwards, attn, t = [], [], 0.0
    for prompt in (8, 10):  # 4 decode steps each, 1 ms apart; the first generate's steps 5 ms (warming up)
        for i in range(5):
            kv = prompt + i
            forwards.append(Forward(prompt if i == 0 else 1, t, calls_before=len(attn), calls_after=len(attn) + 1))
            attn.append(("layer", 1e-5, kv))
            t += 0.005 if prompt == 8 else 0.001
    new, old, _ = _new_shape_steps(NS(forwards=forwards, attn=attn))
    # the second generate's steps at kv 11, 12 were seen, at 13 new (its last step has no interval)
    assert (new, old) == ([pytest.approx(1.0)], [pytest.approx(1.0)] * 2)


def test_where_no_later_prompt_meets_a_new_length_the_first_generates_steps_after_its_first_are_new():
    # prompts a token apart meet their new lengths at their last step only (no interval): nothing new after the
    # first generate, where every step is new; its first step, the warm-up's most, is left out
    from types import SimpleNamespace as NS

    from attnswitch.profiling.clock import Forward
    from attnswitch.profiling.stepstats import _new_shape_steps

    forwards, attn, t = [], [], 0.0
    for prompt in (8, 9):
        for i in range(5):
            forwards.append(Forward(prompt if i == 0 else 1, t, calls_before=len(attn), calls_after=len(attn) + 1))
            attn.append(("layer", 1e-5, prompt + i))
            t += 0.009 if (prompt, i) == (8, 1) else 0.002 if prompt == 8 else 0.001
    new, old, _ = _new_shape_steps(NS(forwards=forwards, attn=attn))
    assert new == [pytest.approx(2.0)] * 2 and old == [pytest.approx(1.0)] * 3


def test_a_compiled_generates_steps_are_new_where_dynamo_compiled_during_them():
    # a compiled graph records no attention call: its compile steps were all counted "seen" (no new-length
    # cost); nor is every new key length a compile (a graph of dynamic shapes meets later ones without one)
    from types import SimpleNamespace as NS

    from attnswitch.profiling.clock import Forward
    from attnswitch.profiling.stepstats import _new_shape_steps

    def generate(prompt, steps, t0, compiles):  # a prefill and ``steps`` decode steps; a compile takes 1 s
        starts = [t0]
        for i in range(steps):
            starts.append(starts[-1] + 0.001 + compiles.get(i, 0))
        return [Forward(prompt if i == 0 else 1, start, graphs=compiles.get(i, 0)) for i, start in enumerate(starts)]

    # the first decode step compiles (a static shape), the second recompiles (dynamic), the rest compile nothing
    forwards = generate(4, 5, 0.0, {1: 1.0, 2: 1.0}) + generate(6, 5, 100.0, {})
    new, old, _ = _new_shape_steps(NS(forwards=forwards, attn=[]))
    assert len(new) == 2 and min(new) > 900 and len(old) == 6 and max(old) < 900
    # not counted (an uncompiled step with no recorded call): seen, as before
    uncounted = [Forward(4 if i == 0 else 1, 0.001 * i) for i in range(5)]
    assert _new_shape_steps(NS(forwards=uncounted, attn=[]))[:2] == ([], [pytest.approx(1.0)] * 3)


def test_an_encoder_decoders_generates_are_told_apart_by_their_encoder_outputs():
    # every decoder forward of an encoder-decoder's generate has one query token: its prompts' forwards ran as
    # one generate (steps spanning the next prompt's encoder, one time to first token for all of them)
    from transformers import T5Config, T5ForConditionalGeneration

    from attnswitch.profiling.stepstats import split_generates

    torch.manual_seed(0)
    t5 = T5ForConditionalGeneration(T5Config(vocab_size=128, d_model=32, d_ff=64, num_layers=2, num_heads=2, d_kv=16,
                                             decoder_start_token_id=0, pad_token_id=0)).eval()
    w = make_workload(t5, batch=1, mode="generate", prompt_lens=(6, 8, 10), new_tokens=5)
    r = compare(t5, w, backends=["math"], warmup=0, iters=1, rounds=2, time_budget_s=0, check_numerics=False)
    g = r["math"].generate
    # per prompt after the first, its steps between decode steps: seen (a decoder's key lengths are its own
    # positions, the same in every prompt); so the new ones are the first generate's after its first step
    assert g.seen_shape_steps == (3 - 1) * (5 - 2) and g.new_shape_steps == 5 - 3
    assert r.workload["encoder_decoder"] and "encoder_decoder" not in make_workload(tiny("llama")).describe()
    from attnswitch.profiling.clock import ForwardClock
    clock = ForwardClock(t5, cuda=False)
    with clock, torch.no_grad():
        for p in w.prompts:
            t5.generate(**p, **w.generate_kwargs())
    assert [len(gen) for gen in split_generates(clock.forwards)] == [5, 5, 5]


def test_an_encoder_decoders_time_to_first_token_starts_at_its_encoder(vclock):
    # generate runs the encoder itself, outside the model's forward: the time to first token started at the first
    # decoder step and left the encoder out (3.4 ms reported, 15.2 ms from generate() to the first token)
    from transformers import T5Config, T5ForConditionalGeneration

    from attnswitch.profiling.clock import ForwardClock
    from attnswitch.profiling.stepstats import prompt_units, split_generates

    torch.manual_seed(0)
    t5 = T5ForConditionalGeneration(T5Config(vocab_size=128, d_model=32, d_ff=64, num_layers=2, num_heads=2, d_kv=16,
                                             decoder_start_token_id=0, pad_token_id=0)).eval()
    w = make_workload(t5, batch=1, mode="generate", prompt_lens=(6, 8), new_tokens=4)
    slow = 500.0  # the encoder takes 500 s on the virtual clock: plain in the figures, whatever the machine's load
    hook = t5.get_encoder().register_forward_hook(lambda *a: vclock.sleep(slow))
    clock = ForwardClock(t5, cuda=False, generates=True)
    try:
        with clock, torch.no_grad():
            t0 = vclock.perf_counter()
            for p in w.prompts:
                t5.generate(**p, **w.generate_kwargs())
            end = vclock.perf_counter()
    finally:
        hook.remove()
    gens = split_generates(clock.forwards)
    assert [len(g) for g in gens] == [4, 4] and all(g[0].began is not None for g in gens)
    encoder = t5.get_encoder()
    assert not encoder._forward_pre_hooks  # (removed on exit)
    with ForwardClock(t5, cuda=False):  # not a generate: the encoder runs inside the forward (a compiled one's
        assert not encoder._forward_pre_hooks  # graph too), where a hook of the clock's would break the graph
    t5.get_encoder = lambda: (_ for _ in ()).throw(ValueError("no encoder here"))
    with ForwardClock(t5, cuda=False, generates=True):  # (other code's get_encoder raising: no hook left behind)
        pass
    assert not t5._forward_pre_hooks and not t5._forward_hooks
    assert t0 <= gens[0][0].began < gens[0][0].host_start - slow  # (the encoder ran between them)
    units, figures = prompt_units(clock.forwards, end)
    assert all(slow * 1e3 <= t < slow * 1e3 + SLACK_MS for t in figures["ttft"])  # each prompt's encoder in its own
    assert all(slow * 1e3 <= u < slow * 1e3 + SLACK_MS for u in units)


def test_a_generate_runs_greedy_with_the_cache_named_whatever_the_checkpoints_generation_config_says():
    # a checkpoint's generation_config with beams (Marian, BART-CNN) or a cache of its own (Gemma-3's "hybrid") was
    # measured as it said, and described as "greedy, dynamic cache": 3x the rows, another cache
    m = tiny("llama")
    m.generation_config.num_beams = 3
    m.generation_config.cache_implementation = "static"
    seen = []

    def note(module, args, kwargs):
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        seen.append((kwargs["hidden_states"].shape[0], type(cache).__name__))
    hook = m.model.layers[0].self_attn.register_forward_pre_hook(note, with_kwargs=True)
    try:
        for cache, kind in (("dynamic", "DynamicCache"), ("static", "StaticCache")):
            seen.clear()
            make_workload(m, batch=1, mode="generate", new_tokens=3, prompt_lens=(8,), cache=cache).step()
            assert seen == [(1, kind)] * 3, (cache, seen)
    finally:
        hook.remove()
    assert m.generation_config.num_beams == 3 and m.generation_config.cache_implementation == "static"  # as found
    # nor another decoding it asks for: contrastive search raised, prompt lookup refused a batch of 2
    m.generation_config.penalty_alpha, m.generation_config.prompt_lookup_num_tokens = 0.6, 3
    out = make_workload(m, batch=2, mode="generate", new_tokens=3, prompt_lens=(8,)).step()
    assert [tuple(o.shape) for o in out] == [(2, 11)] and m.generation_config.penalty_alpha == 0.6
