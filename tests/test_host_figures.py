"""Host figures that add up: one measured step's attention calls and the rest are parts of that step's
host time, and both agree with a clock of the test's own around the same step and the same calls: on the
wall clock as far as a busy machine leaves any two readings in order (attnswitch's span holds the
test's), and exactly on a clock that only the test moves."""

import statistics
import time
from collections.abc import Callable

import pytest
from conftest import batch_for, tiny

import attnswitch
from attnswitch.profiling.clock import Forward
from attnswitch.profiling.stepstats import prompt_units
from attnswitch.render import charts


def _own(read: Callable[[], float], calls: list, cost: Callable[[], None] = lambda: None) -> None:
    """The backend ``own``: SDPA, its calls timed on the test's clock ``read`` into ``calls`` (seconds);
    ``cost()`` inside each, before the kernel."""
    def own(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        import torch.nn.functional as F

        t0 = read()
        cost()
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                                             scale=scale, enable_gqa=enable_gqa)
        calls.append(read() - t0)
        return out

    attnswitch.register_backend("own", own, gqa=True)


@pytest.fixture
def clocked():
    """A backend whose calls a clock of the test's own times, and the model's steps timed the same way."""
    calls: list[float] = []
    _own(time.perf_counter, calls)
    yield calls
    attnswitch.unregister_backend("own")


def _timed_steps(model, read: Callable[[], float], cost: Callable[[int], None] = lambda k: None) -> list[float]:
    """The model's forwards timed on the test's clock ``read``, inside attnswitch's clock around the same
    step; ``cost(k)`` in the k-th forward (from 0)."""
    steps: list[float] = []
    real = model.forward

    def timed_forward(*a, **kw):
        t0 = read()
        try:
            cost(len(steps))
            return real(*a, **kw)
        finally:
            steps.append(read() - t0)

    model.forward = timed_forward
    return steps


def _profiled(model):
    return attnswitch.profile(model, batch_for(model, pad=False), backends=["own"], warmup=0, iters=1, host_iters=5,
                              profile_steps=0, time_budget_s=0)["own"]


def test_a_steps_attention_calls_and_the_rest_are_parts_of_it_and_agree_with_an_outside_clock(clocked):
    model = tiny("llama")
    steps = _timed_steps(model, time.perf_counter)
    b = _profiled(model)
    assert 0 < b.host_attn_ms <= b.host_ms
    # the host steps are the 2nd..6th forwards (after the process's and the cold one); the reported step is
    # one of them, whole: attnswitch's clock sits outside the test's, around the same forward, so each of
    # its five readings holds the test's, and so does their median (that it is exactly one of them, and
    # the median one, a clock that only the test moves shows below: here a busy machine may stretch
    # the time between the two clocks' readings by any amount)
    host_steps = sorted(steps[2:7])
    assert host_steps[2] * 1e3 <= b.host_ms
    assert len(clocked) == 2 * (len(steps) - 1)  # two layers; the process's first forward ran naive
    # its attention calls: at least the backend's own time in them (they wrap it), within the step
    assert b.host_attn_ms >= min(sum(clocked[i:i + 2]) for i in range(0, len(clocked), 2)) * 1e3


def test_a_steps_host_figures_are_exactly_the_outside_clocks_on_a_clock_only_the_test_moves(fake_clock):
    # each forward and each attention call takes a known time of its own, and nothing else moves the clock:
    # attnswitch's figures must be the test's own readings around the same step and the same calls, exactly,
    # however busy the machine is
    calls: list[float] = []
    _own(fake_clock.perf_counter, calls, lambda: fake_clock.advance(0.5 + len(calls)))
    try:
        model = tiny("llama")
        # the host steps (forwards 2..6) take 30, 10, 50, 20, 40 ms besides their calls; the process's first
        # forward and the cold one far more, so that a median taken with either of them would differ
        rest = [900.0, 700.0, 30.0, 10.0, 50.0, 20.0, 40.0]
        steps = _timed_steps(model, fake_clock.perf_counter, lambda k: fake_clock.advance(rest[k] if k < 7 else 5.0))
        b = _profiled(model)
    finally:
        attnswitch.unregister_backend("own")
    assert len(calls) == 2 * (len(steps) - 1)  # two layers; the process's first forward ran naive
    mid = sorted(steps[2:7])[2]
    k = steps.index(mid)  # the median host step, forward k: its calls are the (k-1)-th pair
    assert b.host_ms == pytest.approx(mid * 1e3)
    assert b.host_attn_ms == pytest.approx(sum(calls[2 * (k - 1):2 * k]) * 1e3)
    assert b.cold_host_ms == pytest.approx(steps[1] * 1e3)
    assert b.attn_host_us == pytest.approx(statistics.median(calls[2:12]) * 1e6)  # the host steps' calls


def test_the_cpu_plot_never_shows_a_part_above_its_whole(clocked):
    model = tiny("llama")
    r = attnswitch.profile(model, batch_for(model, pad=False), backends=["own", "naive"], warmup=0, iters=2,
                           host_iters=3, profile_steps=0, time_budget_s=0)
    chart = charts.time_by_kind_chart(list(r.backends))
    (_, attn), (_, rest) = chart.series
    for b, a, x in zip(r.backends, attn, rest):
        assert a + x == pytest.approx(b.host_ms) and a <= b.host_ms


def _gen(t0: float, steps: list[float], q_len: int = 8) -> list[Forward]:
    """Forwards of one generate starting at ``t0``: a prefill, then decode forwards ``steps`` seconds apart."""
    fs = [Forward(q_len, t0, t0 + 0.001)]
    t = t0 + 0.020  # 20 ms to the first token
    for dt in steps:
        fs.append(Forward(1, t, t + 0.0005))
        t += dt
    return fs


def test_a_generates_prompt_units_take_its_decode_steps_at_their_median():
    # two prompts; the first's third step was delayed 50 ms by the machine
    first = _gen(0.0, [0.010, 0.010, 0.060, 0.010, 0.010])
    second = _gen(1.0, [0.012] * 5)
    units, figures = prompt_units(first + second, end_s=1.1)
    # first: prefill start to the second prompt's start (1000 ms), its 4 decode intervals (90 ms) taken at their
    # median (10 ms): 1000 - 90 + 40
    assert units[0] == pytest.approx(950.0)
    assert units[1] == pytest.approx(100.0)  # no interval delayed: as measured, to the workload's end
    assert figures["ttft"] == pytest.approx([20.0, 20.0])
    assert sorted(figures["interval"])[-1] == pytest.approx(60.0) and len(figures["interval"]) == 8
    assert figures["host"] == pytest.approx([0.5] * 10) and figures["gpu"] == []


def test_an_encoder_decoders_prompt_unit_counts_its_encoder():
    # t5's generate runs its encoder before the first clocked (decoder) forward: a prompt timed alone starts
    # at its generate's start, not at its first forward
    fwd = _gen(1.0, [0.010] * 4)
    (late,), _ = prompt_units(fwd, end_s=1.2)
    (whole,), _ = prompt_units(fwd, end_s=1.2, start_s=0.9)
    assert whole - late == pytest.approx(100.0)
