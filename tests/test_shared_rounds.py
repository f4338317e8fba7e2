"""Every backend's time from the same rounds: the machine's speed changes between rounds (on an H200 a
host-bound decode step took 11 ms in some rounds and 23 ms in others), so a backend timed in more rounds than
another must not read faster or slower for the stretch of time it was timed in."""

import dataclasses
import random
import types

import pytest
from test_timing import _fake_wall, _FakeTarget

from attnswitch.profiling import capture
from attnswitch.profiling.capture import timed_rounds
from attnswitch.profiling.distributed import merge_results, retimed
from attnswitch.profiling.rounds import Timing, round_drift, shared_rounds, still_open
from attnswitch.profiling.summarize import timing_of, with_timing
from attnswitch.ranking import _unsteady, busy_host, busy_over
from attnswitch.render.sections import _timing_text
from attnswitch.results import BackendResult, GenerateStats
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
    assert drift > 1.4  # two of the six rounds at about half the others' time
    said = busy_host({"cpus": 16, "round_drift": drift})
    assert said and f"{drift:.2f}x slower in its slower rounds than in its faster ones" in said[0]
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


def test_a_steady_machine_reads_steady_whatever_the_prompts_lengths_the_backends_and_the_rounds():
    # a generate's rounds time one prompt each: prompts of 10 and 30 ms are not a change of speed
    gen = {n: Timing(per_prompt=True) for n in ("a", "b")}
    for r in range(12):
        for n, t in gen.items():
            row = [0.0, 0.0]
            row[r % 2] = (10.0 if r % 2 == 0 else 30.0) * (1.2 if n == "b" else 1.0)
            t.units.append(row)
    assert round_drift(gen, shared_rounds(gen)) == pytest.approx(1.0)
    # one backend's rounds cannot tell the machine from the backend
    one = _timings({"a": [10.0, 14.0, 10.0, 15.0, 10.0, 16.0]})
    assert round_drift(one, shared_rounds(one)) is None
    # 60 rounds of two tied backends with 8 % noise of their own, seeded: no caution
    rng = random.Random(0)
    many = _timings({n: [10.0 * rng.gauss(1.0, 0.08) for _ in range(60)] for n in ("a", "b")})
    assert busy_host({"cpus": 16, "round_drift": round_drift(many, shared_rounds(many))}) == ()


def _results(rounds: dict) -> list[BackendResult]:
    """Each backend's result as one process reports it, from its rounds (one sample a round)."""
    timings = _timings(rounds)
    shared = shared_rounds(timings)
    return [with_timing(BackendResult(n, "ok"), t, shared) for n, t in timings.items()]


def test_ranks_merged_keep_every_backends_time_from_the_rounds_all_took():
    one = _results(H200_DECODE)
    merged = retimed([merge_results([r, r]) for r in one])  # two ranks that measured the same
    assert [b.time_ms for b in merged] == pytest.approx([b.time_ms for b in one])
    assert [b.time_sample_rounds for b in merged] == [b.time_sample_rounds for b in one]
    # and a result read back from JSON gives its time back from what it keeps
    for b in one:
        assert with_timing(b, timing_of(b), [0, 1, 2, 3, 4, 5]).time_ms == pytest.approx(b.time_ms)


def test_a_generates_step_figures_come_from_the_rounds_its_time_does(monkeypatch):
    # two prompts of 10 ms; a and b timed on 20 more rounds while the machine runs at half speed, c sitting them
    # out: a's whole workloads are read from the rounds all took, as its time is, and no caution says its steps
    # were slowed for long stretches
    timings = {n: Timing(per_prompt=True, steps={k: [] for k in ("ttft", "interval", "host", "gpu", "wall")})
               for n in ("a", "b", "c")}
    for r in range(26):
        for n, t in timings.items():
            if r >= 6 and n == "c":
                t.units.append([])
                continue
            ms = 10.0 if r < 6 else 20.0
            row = [0.0, 0.0]
            row[r % 2] = ms
            t.units.append(row)
            t.steps["interval"].append(ms / 4)
            t.step_rounds.setdefault("interval", []).append((r,))
            if r % 2:
                t.steps["wall"].append(2 * ms)
                t.step_rounds.setdefault("wall", []).append((r - 1, r))
    shared = shared_rounds(timings)
    g = GenerateStats(tokens=4)
    a = with_timing(BackendResult("a", "ok", generate=g), timings["a"], shared)
    assert a.time_ms == pytest.approx(20.0) and a.generate.workload_wall_ms == pytest.approx(20.0)
    assert a.generate.step_ms_p50 == pytest.approx(2.5)
    assert not _unsteady(a)


def test_a_sweeps_busy_caution_keeps_every_sign_any_shape_showed():
    first = {"cpus": 2, "probe_before_ms": [1.0, 1.5], "probe_after_ms": [1.0, 1.1]}
    second = {"cpus": 2, "round_drift": 2.0, "probe_before_ms": [1.0, 1.6], "probe_after_ms": [1.0, 1.1]}
    (line,) = busy_over([(first, ()), (second, ())])
    assert "a fixed task's time varied 1.5x" in line and "2.00x slower in its slower rounds" in line
    assert "1.6x" not in line  # a sign is said once, as the first shape showed it
    assert busy_over([]) == ()


def _generate(rounds: int, prompts: int, slow_from: int) -> dict[str, Timing]:
    out = {n: Timing(per_prompt=True) for n in ("a", "b")}
    for r in range(rounds):
        for n, t in out.items():
            row = [0.0] * prompts
            row[r % prompts] = (10.0 + r % prompts) * (2.0 if r >= slow_from else 1.0) * (1.1 if n == "b" else 1.0)
            t.units.append(row)
    return out


def test_a_generates_drift_is_told_from_prompts_timed_more_than_once_and_not_guessed_otherwise():
    # the default generate: 5 prompts in 6 rounds, one of them timed twice: the machine's speed cannot be told
    # from the prompts' own lengths, so nothing is said (rather than 1.0, "steady")
    one_pass = _generate(6, 5, 3)
    assert round_drift(one_pass, shared_rounds(one_pass)) is None
    # every prompt timed four times, half the rounds 2x slow: told
    repeated = _generate(16, 2, 8)
    assert round_drift(repeated, shared_rounds(repeated)) == pytest.approx(2.0, rel=0.05)
    # rounds past a backend's own are not an error
    assert round_drift(repeated, list(range(20))) == pytest.approx(2.0, rel=0.05)


def test_ranks_merged_time_a_backend_as_one_process_does_when_another_failed_after_its_rounds():
    rounds = {"a": [10.0] * 6 + [20.0] * 10, "b": [11.0] * 6 + [22.0] * 10, "bad": [12.0] * 6 + [None] * 10}
    one = _results(rounds)
    one = [dataclasses.replace(b, status="failed") if b.backend == "bad" else b for b in one]  # NaN, say
    merged = retimed([merge_results([r, r]) for r in one])
    assert [b.time_ms for b in merged if b.ok] == pytest.approx([b.time_ms for b in one if b.ok]) == [10.0, 11.0]


def test_a_sweeps_busy_signs_of_two_backends_merge_into_one():
    host = {"cpus": 2, "probe_before_ms": [1.0, 1.0], "probe_after_ms": [1.0, 1.0]}
    naive = [BackendResult("naive", "ok", timer="wall-clock", time_ms=10.0, host_ms=20.0)]
    math_ = [BackendResult("math", "ok", timer="wall-clock", time_ms=10.0, host_ms=30.0)]
    (line,) = busy_over([(host, naive), (host, math_)])
    assert "`naive`" in line and "`math`" not in line
    # the signs are merged as data, never read back from a caution's words: a steady shape adds nothing
    assert busy_over([(host, ()), (None, ())]) == ()
