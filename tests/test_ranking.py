"""The ranking's statistics: intervals of paired ratios, adaptive rounds, ties, aliases and a busy host,
on fake clocks and constructed results (no test here reads the wall clock)."""

import contextlib
import itertools
import math
import random

import pytest
import torch

from attnswitch.decision import recommend
from attnswitch.profiling import capture
from attnswitch.profiling.capture import timed_rounds
from attnswitch.profiling.rounds import Timing
from attnswitch.profiling.summarize import with_timing
from attnswitch.ranking import busy_host, verdict
from attnswitch.recommend import ANSWER_WIDTH
from attnswitch.results import BackendResult, Numerics
from attnswitch.stats import LEVEL, Margin, median_interval, paired_margin

# -- the interval ------------------------------------------------------------------------------------


def _coverage(n: int, k: int) -> float:
    return 1 - 2 * sum(math.comb(n, i) for i in range(k)) / 2 ** n


@pytest.mark.parametrize("n", [1, 3, 5, 6, 7, 10, 20, 41])
def test_the_median_interval_is_the_narrowest_order_statistic_pair_with_95_percent(n):
    xs = list(range(n, 0, -1))  # unsorted on purpose
    low, high, coverage = median_interval(xs)
    k = int(low)  # x(k) == k here
    assert high == n + 1 - k and coverage == pytest.approx(_coverage(n, k))
    if n >= 6:
        assert coverage >= LEVEL and _coverage(n, k + 1) < LEVEL  # the next pair inwards covers less
    else:
        assert (low, high) == (1, n) and coverage < LEVEL  # too few: the whole range, and it says so


def test_the_interval_holds_the_true_median_at_its_stated_rate():
    # a heavy-tailed distribution (load only slows): over many draws the interval misses the true median
    # at most 5 % of the time
    rng = random.Random(7)
    true_median = 1.0 * math.exp(0)  # lognormal(0, 1) has median 1
    misses = 0
    for _ in range(2000):
        xs = [rng.lognormvariate(0, 1) for _ in range(12)]
        low, high, _ = median_interval(xs)
        misses += not (low <= true_median <= high)
    assert misses / 2000 <= 1 - LEVEL + 0.01


def test_paired_margin_pairs_by_round_and_position_and_skips_what_has_no_pair():
    a = [[2.0], [4.0], [2.2], [9.0]]
    b = [[1.0], [2.0], [1.1]]  # one round fewer: the fourth has no pair
    m = paired_margin(a, b, "b")
    assert m.pairs == 3 and m.ratio == 2.0 and m.against == "b"
    per_prompt = paired_margin([[10.0, 20.0]], [[5.0, 40.0]], "b")  # a generate: prompt by prompt
    assert per_prompt.pairs == 2 and sorted([per_prompt.low, per_prompt.high]) == [0.5, 2.0]
    assert paired_margin([], b, "b") is None


def test_a_margin_is_decided_only_where_its_interval_excludes_1_at_95_percent():
    assert Margin("b", 1.1, 1.05, 1.2, 0.97, 6).slower
    assert not Margin("b", 1.1, 0.99, 1.2, 0.97, 6).decided  # holds 1
    assert not Margin("b", 1.1, 1.05, 1.2, 0.94, 5).decided  # five rounds cannot reach 95 %
    assert Margin("b", 1.0, 0.99, 1.01, 0.97, 6).equal and not Margin("b", 1.0, 0.97, 1.01, 0.97, 6).equal
    assert Margin("b", 1.09, 1.05, 1.13, 0.97, 6).text() == "1.09x [1.05–1.13]"


@pytest.mark.parametrize("low, high, equal, said", [(1.006, 1.0204, False, "1.0132x [1.0060–1.0204]"),
                                                    (1.006, 1.0196, True, "1.0128x [1.0060–1.0196]"),
                                                    (0.9795, 1.01, False, "0.9948x [0.9795–1.0100]"),
                                                    (0.9805, 1.01, True, "0.995x [0.981–1.010]")])
def test_a_margins_words_show_on_which_side_of_a_ties_edges_its_bounds_lie(low, high, equal, said):
    # [1.01–1.02] was printed alike for a margin told apart and a tie (its interval within 2 % of 1 either way)
    m = Margin("b", (low + high) / 2, low, high, 0.97, 12)
    assert m.equal is equal and m.text() == said
    assert Margin("b", 1.013, 1.006, 1.02 + 2e-16, 0.97, 12).text() == "1.0130x [1.0060–1.0200]"  # 4 at most


# -- adaptive rounds, on a fake clock ----------------------------------------------------------------

class _Noisy:
    """A target whose steps take each backend's true time times heavy-tailed load noise, drawn per step
    (seeded); the budget's clock advances by the time of every step run (timed or not)."""

    def __init__(self, times: dict, seed: int = 0, load: float = 0.0):
        self.device = torch.device("cpu")
        self.mode = "prefill"
        self.times, self.rng, self.load = times, random.Random(seed), load
        self.cur, self.now, self.ran = None, 0.0, []

    def context(self):
        return contextlib.nullcontext()

    def calls(self, n):
        return itertools.repeat(None, n)

    @contextlib.contextmanager
    def switched(self, name):
        self.cur = name
        yield
        self.cur = None

    def as_is(self, name):  # (auto's timed steps unswitched: not here)
        return False

    def step_ms(self) -> float:
        t = self.times[self.cur]
        if self.load and self.rng.random() < self.load:  # another process took the core for a while
            t *= 1 + self.rng.expovariate(0.5)
        t *= self.rng.lognormvariate(0, 0.02)
        self.now += t / 1e3
        self.ran.append(self.cur)
        return t

    def rewarm(self, prompt=0, sync=True):
        self.step_ms()

    def fn(self, c):
        self.step_ms()

    def clock(self):
        return self.now


@pytest.fixture
def fake_wall(monkeypatch):
    monkeypatch.setattr(capture, "_timed_wall", lambda target, c: target.step_ms())


def test_backends_far_apart_are_decided_in_the_first_rounds_and_timed_no_further(fake_wall):
    t = _Noisy({"a": 10.0, "b": 14.0, "c": 30.0})
    done = timed_rounds(t, ["a", "b", "c"], iters=12, rounds=6, clock=t.clock)
    assert done.stopped == "decided" and done.rounds == 6
    assert all(len(tm.samples) == 12 for tm in done.timings.values())


def test_a_contender_tied_with_the_fastest_is_timed_until_the_budget_ends(fake_wall):
    t = _Noisy({"a": 10.0, "a2": 10.0, "c": 30.0}, load=0.3)
    done = timed_rounds(t, ["a", "a2", "c"], iters=12, rounds=6, budget_s=2.0, clock=t.clock)
    n = {k: len(v.samples) for k, v in done.timings.items()}
    assert n["c"] == 12  # decidedly slower after the first rounds: no more rounds
    assert n["a"] > 12 and n["a2"] == n["a"]  # the two tied went on together
    assert done.stopped in ("budget", "decided")
    if done.stopped == "budget":
        assert t.now >= 2.0  # the budget's clock (fake) ran out


def test_a_difference_the_first_rounds_leave_open_is_told_by_more_rounds(fake_wall):
    # 2 % apart in 2 % noise: six rounds cannot tell; rounds go on until the interval excludes 1
    t = _Noisy({"a": 10.0, "b": 10.2}, seed=0)
    done = timed_rounds(t, ["a", "b"], iters=12, rounds=6, budget_s=60.0, clock=t.clock)
    m = paired_margin(done.timings["b"].units, done.timings["a"].units, "a")
    assert done.rounds > 6 and done.stopped == "decided" and m.slower


def test_no_budget_means_the_rounds_asked_for(fake_wall):
    t = _Noisy({"a": 10.0, "b": 10.0})
    done = timed_rounds(t, ["a", "b"], iters=4, rounds=2, budget_s=0, clock=t.clock)
    assert done.rounds == 2 and done.stopped == "fixed" and len(done.timings["a"].samples) == 4


def _result(name, timing: Timing, **kw) -> BackendResult:
    return with_timing(BackendResult(name, "ok", timer="wall-clock", **kw), timing)


def _measured(times: dict, seed: int, load: float) -> list[BackendResult]:
    t = _Noisy(times, seed=seed, load=load)
    done = timed_rounds(t, list(times), iters=12, rounds=6, clock=t.clock)
    ops = {"auto": ("aten::_scaled_dot_product_flash_attention_for_cpu",)}
    return [_result(n, done.timings[n], attn_ops=ops.get(n, ())) for n in times]


@pytest.mark.parametrize("seed", range(5))
def test_on_a_busy_host_the_answer_is_the_same_pick_or_an_honest_tie_and_no_margin_is_false(seed, monkeypatch):
    # the CPU machine's default compare, as a busy host gives it: auto runs flash's kernel, math is close
    # behind, the naive ones far; a third of the steps are slowed by other processes, heavily
    monkeypatch.setattr(capture, "_timed_wall", lambda target, c: target.step_ms())
    truth = {"flash": 4.0, "auto": 4.0, "math": 4.4, "naive": 9.0, "naive-inplace": 8.8}
    results = _measured(truth, seed, load=0.35)
    v = verdict(results)
    assert v.pick in ("flash", "auto") and {"flash", "auto"} <= set(v.ties)  # equal in truth: never told apart
    for name in v.beaten:  # a backend said to be slower is slower
        assert truth[name] > truth[v.pick]
    text = recommend(results, v)
    first = text.splitlines()[0]
    assert len(first) <= ANSWER_WIDTH and "beyond the noise" not in text
    if len(v.ties) > 1:  # SDPA's own choice tied for the fastest: nothing to change
        assert first.startswith("Tie: ") or (v.pick == "auto" and first.startswith("Keep the model's own attention"))
    else:
        assert "faster than" in first


# -- the verdict ------------------------------------------------------------------------------------

def _fixed(name: str, per_round: list[float], **kw) -> BackendResult:
    tm = Timing(samples=list(per_round), units=[[x] for x in per_round])
    return _result(name, tm, **kw)


def test_a_winner_is_named_only_where_every_interval_excludes_1():
    fast = _fixed("cudnn", [10.0, 10.1, 9.9, 10.0, 10.2, 10.0])
    close = _fixed("flash", [10.9, 11.0, 10.8, 11.1, 11.0, 10.9])
    far = _fixed("math", [30.0] * 6)
    v = verdict([far, close, fast])
    assert v.order == ("cudnn", "flash", "math") and v.ties == ("cudnn",) and v.beaten == ("flash", "math")
    text = recommend([fast, close, far], v)
    first = text.splitlines()[0]
    assert first.startswith("Use `cudnn`: 10.000 ms per forward, 1.09x [") and "faster than `flash`" in first
    assert "`math` 3.00x" in text
    noisy = _fixed("flash", [10.9, 9.0, 12.0, 9.5, 11.0, 10.5])  # overlaps cudnn in some rounds
    v = verdict([fast, noisy, far])
    assert v.ties == ("cudnn", "flash")
    first = recommend([fast, noisy, far], v).splitlines()[0]
    assert first.startswith("Tie: `cudnn` ≈ `flash`") and "faster" not in first


def test_an_alias_and_the_backend_it_ran_are_ranked_as_measured_and_their_gap_is_a_caution():
    flash = _fixed("flash", [10.0] * 6)
    auto = _fixed("auto", [14.0, 14.2, 13.9, 14.1, 14.0, 14.3], attn_ops=("aten::_scaled_dot_product_flash_attention",))
    math_ = _fixed("math", [20.0] * 6)
    v = verdict([flash, auto, math_])
    # one kernel behind two host paths, told apart: the faster is picked, never a tie that reads as a paradox
    assert v.pick == "flash" and v.beaten == ("auto", "math") and v.fastest == "flash"
    assert any("`auto` ran flash's kernels" in c and "host paths" in c for c in v.cautions)
    text = recommend([flash, auto, math_], v)
    assert "`auto` ran flash's kernels" in text and text.startswith("Use `flash`")


def test_the_pick_is_the_one_its_paired_rounds_find_fastest():
    # the median of all samples favours `b` (a burst slowed `a`'s first rounds less), the rounds say `a`
    a = _result("a", Timing(samples=[5.0, 5.0, 5.0, 11.0, 11.0, 11.0], units=[[5.0], [5.0], [5.0], [11.0], [11.0],
                                                                           [11.0]]))
    b = _result("b", Timing(samples=[6.0, 6.0, 6.0, 12.0, 12.0, 12.0], units=[[6.0], [6.0], [6.0], [12.0], [12.0],
                                                                           [12.0]]))
    b = BackendResult(**{**b.__dict__, "time_ms": 4.0})  # as if its median said faster
    v = verdict([a, b])
    assert v.pick == "a" and v.beaten == ("b",)


def test_eager_and_backends_with_bad_numerics_are_never_picked():
    bad = Numerics(1.0, 0.5, 0.1, 1e-4, False)
    eager = _fixed("eager", [1.0] * 6)
    wrong = _fixed("naive", [2.0] * 6, numerics=bad)
    good = _fixed("math", [3.0] * 6)
    v = verdict([eager, wrong, good])
    assert v.pick == "math" and "naive" not in v.order and v.order == ("math", "eager")


def test_a_single_round_tells_no_backend_apart():
    a, b = _fixed("a", [1.0]), _fixed("b", [3.0])
    v = verdict([a, b])
    assert v.ties == ("a", "b")
    assert recommend([a, b], v).splitlines()[0].startswith("Tie: `a` ≈ `b`")


def test_a_busy_host_is_said_from_its_probes():
    idle = {"cpus": 2, "load_before": 0.9, "load_after": 1.1, "probe_before_ms": [1.0] * 9,
            "probe_after_ms": [1.01] * 9}
    assert busy_host(idle) == ()
    busy = dict(idle, load_after=3.4, probe_after_ms=[1.0, 2.0, 1.1, 1.9, 1.2, 2.5, 1.0, 1.3, 1.4])
    said = busy_host(busy)
    assert len(said) == 1 and "load average 3.4 on 2 CPUs" in said[0] and "2.5x" in said[0]
    assert "rerun on an idle machine" in said[0]


# -- a sweep: its table and its text by one rule ---------------------------------------------------

def test_a_sweeps_text_names_per_range_only_what_its_table_shows_tied_at_every_length():
    import dataclasses

    from attnswitch.recommend import recommend_sweep
    from attnswitch.render.sections import sections
    from attnswitch.results import Decision, Report, SweepPoint

    def point(seq, per_round):
        rs = [_fixed(n, xs) for n, xs in per_round.items()]
        v = verdict(rs)
        return SweepPoint(2, seq, tuple(rs), v.order, v.ties)

    p64 = point(64, {"auto": [1.0, 1.2, 0.9, 1.1, 1.0, 1.3], "naive": [1.1, 1.0, 1.2, 0.9, 1.2, 1.0],
                     "flash": [2.0] * 6})
    p128 = point(128, {"flash": [2.0] * 6, "auto": [2.1, 1.9, 2.2, 2.0, 1.8, 2.1], "naive": [5.0] * 6})
    assert p64.ties == ("auto", "naive") and p128.ties == ("auto", "flash")  # in a tie, what changes least first
    text = recommend_sweep([p64, p128])
    assert text == "Best per length at batch 2: seq 64–128: `auto`."  # tied at both; naive is 2.5x behind at 128
    report = Report(p128.backends, {}, {"mode": "prefill"}, {}, sweep=(p64, p128), ranking=p128.ranking,
                    decision=Decision("tie", p128.pick, p128.ties))
    table = next(b for s in sections(report) if getattr(s, "key", "") == "sweep" for b in s.blocks
                 if hasattr(b, "rows"))
    assert [row[-1] for row in table.rows] == ["auto ≈ naive", "auto ≈ flash"]
    apart = dataclasses.replace(p128, ties=("flash",))
    assert recommend_sweep([p64, apart]) == ("Best per length at batch 2: seq 64: `auto` ≈ `naive`; seq 128: `flash`. "
                                             "Crossover between seq 64 and 128, `flash` overtakes `auto`.")
