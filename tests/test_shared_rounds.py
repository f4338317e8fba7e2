"""Every backend's time from the same rounds: the machine's speed changes between rounds (on an H200 a
host-bound decode step took 11 ms in some rounds and 23 ms in others), so a backend timed in more rounds than
another must not read faster or slower for the stretch of time it was timed in."""

import types

import pytest
from test_timing import _fake_wall, _FakeTarget

from attnswitch.profiling import capture
from attnswitch.profiling.capture import timed_rounds
from attnswitch.profiling.rounds import Timing, round_drift, shared_rounds, still_open
from attnswitch.profiling.summarize import with_timing
from attnswitch.ranking import busy_host
from attnswitch.render.sections import _timing_text
from attnswitch.results import BackendResult
from attnswitch.stats import paired_margin

#: the H200's decode rounds (Llama-3.2-1B, B4, cache 2048): the host slowed about 2x in rounds 3-8
H200_DECODE = {
    "auto": [11.8, 15.0, 22.3, 22.9, 22.7, 22.1, 23.1, 22.0, 11.8, 11.1, 11.2, 11.5, 11.5, 11.3, 11.3],
    "flash": [11.8, 13.2, 22.0, 23.3, 22.6, 22.8, 22.4, 22.7, 21.2, 11.1, 11.1, 11.2, 11.4, 11.3, 11.2],
    "cudnn": [12.1, 15.2, 22.5, 23.7, 23.1, 22.5, 23.1, None, None, None, None, None, 11.7, 11.9, None],
    "efficient": [17.6, 18.7, 30.8, 33.0, 33.7, 32.8] + [None] * 9,
}


def _timings(rounds: dict) -> dict[str, Timing]:
    out = {}
    for name, units in rounds.items():
        t = Timing()
        for u in units:
            t.units.append([] if u is None else [u])
            t.by_round.append([] if u is None else [u])
            t.samples.extend([] if u is None else [u])
        out[name] = t
    return out


def test_every_backends_time_comes_from_the_rounds_all_took_and_agrees_with_its_paired_ratio():
    timings = _timings(H200_DECODE)
    shared = shared_rounds(timings)
    assert shared == [0, 1, 2, 3, 4, 5]
    raw = {n: t.time_ms() for n, t in timings.items()}
    # the raw medians: cudnn 22.5 ms against auto's 15.0 (1.5x), efficient 2.6x, where their paired rounds say
    # 1.02x and 1.46x: the table read 18.8 ms and 32.0 ms against 11.8 ms on the H200
    assert raw["efficient"] / raw["auto"] > 1.9
    for name, t in timings.items():
        r = with_timing(BackendResult(name, "ok"), t, shared)
        ratio = paired_margin(r.time_rounds_ms, timings["auto"].units, "auto").ratio
        assert r.time_ms / timings["auto"].time_ms(shared) == pytest.approx(ratio, rel=0.05), name


def test_the_rounds_say_how_far_the_machines_speed_moved_and_the_answer_cautions_it():
    timings = _timings(H200_DECODE)
    drift = round_drift(timings, shared_rounds(timings))
    assert drift == pytest.approx(22.6 / 12.0, rel=0.1)
    said = busy_host({"cpus": 16, "round_drift": drift})
    assert said and f"moved {drift:.2f}x together" in said[0]
    steady = _timings({"a": [10.0, 10.1, 9.9, 10.0], "b": [12.0, 12.2, 11.9, 12.1]})
    assert round_drift(steady, shared_rounds(steady)) < 1.05
    assert busy_host({"cpus": 16, "round_drift": round_drift(steady, shared_rounds(steady))}) == ()


def test_the_fastest_the_more_rounds_are_paired_with_is_chosen_from_the_rounds_all_took():
    # b is decidedly faster than a in every round both took; a alone was timed on in rounds where the machine
    # was twice as fast, so its median of all rounds reads faster than b's. Paired with a as the fastest, b
    # (decidedly faster) would stay open; from the rounds both took, b is the fastest and a is decided.
    timings = _timings({"a": [20.0] * 6 + [10.0] * 8, "b": [19.0] * 6 + [None] * 8})
    assert timings["a"].time_ms() < timings["b"].time_ms()
    assert still_open(timings, ["a", "b"], out_of_time=False, capped=False) == ([], "decided")


def test_timed_rounds_of_a_machine_that_slows_between_rounds_give_times_in_the_paired_ratio(monkeypatch):
    # a and b tied (timed on while the machine is fast again), c 1.5x slower and decided in the first rounds
    monkeypatch.setattr(capture, "_timed_wall", _fake_wall)
    t = _FakeTarget({"a": [20.0] * 6 + [10.0, 10.3] * 40, "b": [19.0, 21.2] * 3 + [9.5, 10.6] * 40,
                     "c": [30.0] * 6 + [15.0] * 80})
    done = timed_rounds(t, ["a", "b", "c"], iters=6, rounds=6, budget_s=0.3, clock=t.clock)
    assert done.rounds > 6 and done.timings["c"].units[6] == []  # c sat out the more rounds
    shared = shared_rounds(done.timings)
    got = {n: with_timing(BackendResult(n, "ok"), tm, shared).time_ms for n, tm in done.timings.items()}
    assert got["c"] / got["a"] == pytest.approx(1.5, rel=0.02)
    assert done.timings["c"].time_ms() / done.timings["a"].time_ms() > 2.5  # what every sample's median said


def test_the_time_legend_says_the_times_come_from_the_rounds_all_took():
    report = types.SimpleNamespace(backends=[], workload={"mode": "decode"}, pick=None,
                                   settings={"rounds": 6, "host": {"rounds": 15, "stopped": "decided",
                                                                   "shared_rounds": 6}})
    text = _timing_text(report)
    assert "every backend's time from the 6 rounds all of them took" in text
    report.settings["host"]["shared_rounds"] = 15
    assert "all of them took" not in _timing_text(report)
