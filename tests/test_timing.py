"""Timing rounds: adaptive rounds in step across ranks; the statistic of merged ranks; the command's own
time account."""

import contextlib
import datetime
import itertools
import json
import multiprocessing
import re
import socket
from queue import Empty

import pytest
import torch
from conftest import batch_for, tiny

from attnswitch import cli
from attnswitch.comparison import compare
from attnswitch.options import OptionError
from attnswitch.profiling import capture
from attnswitch.profiling.capture import timed_rounds
from attnswitch.profiling.distributed import merge_results
from attnswitch.profiling.summarize import with_timing
from attnswitch.results import BackendResult, GenerateStats


class _FakeTarget:
    """A Target whose steps take fixed (per backend) times, or each backend's list of times in turn,
    optionally with a collective per step; ``clock`` is the (fake) time the steps took."""

    def __init__(self, times: dict, collective=None):
        self.device = torch.device("cpu")
        self.mode = "prefill"
        self.times, self.collective, self.cur, self.ran = times, collective, None, []
        self.now, self.turns = 0.0, {n: itertools.cycle(t if isinstance(t, list) else [t]) for n, t in times.items()}

    def clock(self) -> float:
        return self.now

    def context(self):
        return contextlib.nullcontext()

    def calls(self, n):
        return itertools.repeat(None, n)

    @contextlib.contextmanager
    def switched(self, name):
        self.cur = name
        try:
            yield
        finally:
            self.cur = None

    def as_is(self, name):  # (auto's timed steps unswitched: not here)
        return False

    def rewarm(self, prompt=0, sync=True):
        self.fn(None)

    def fn(self, c):
        self.ran.append(self.cur)
        if self.collective is not None:
            self.collective()

    def sync(self):
        pass


def _fake_wall(target, c):
    """A step's time: the backend's fixed time, or the next of its list of times."""
    target.fn(c)
    ms = next(target.turns[target.cur])
    target.now += ms / 1e3
    return ms


QUICK = ["compare", "tiny-llama", "--device", "cpu", "--num-layers", "1", "--seq", "8", "--iters", "1", "--warmup",
         "0", "--time-budget", "0", "--backends", "naive"]


# -- adaptive rounds, in step across ranks ------------------------------------------------------------

#: how long a rank waits for the other at a collective before gloo calls it a hang: long enough for a busy
#: machine to start both ranks (a hang of ranks out of step fails the test all the same, only later)
HANG_S = 120

def _rank_main(rank, port, times, queue):
    import torch.distributed as dist

    capture._timed_wall = _fake_wall  # each rank's own clock: a fixed time per backend
    try:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                                timeout=datetime.timedelta(seconds=HANG_S))
        t = _FakeTarget(times, collective=lambda: dist.all_reduce(torch.zeros(1)))  # TP: a collective per forward
        done = timed_rounds(t, ["a", "b"], iters=6, rounds=6, budget_s=0.5, clock=t.clock)
        dist.barrier()
        queue.put((rank, {k: len(v.samples) for k, v in done.timings.items()}))
        dist.destroy_process_group()
    except Exception as e:
        queue.put((rank, f"{type(e).__name__}: {e}"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_adaptive_rounds_under_tensor_parallelism_keep_ranks_in_lockstep():
    # tensor parallelism: a collective in every forward. Rank 0 measures `b` as fast as `a` (equal: no more
    # rounds), rank 1 cannot tell them apart (more rounds): were each rank to decide on its own samples,
    # they would run different forwards and their collectives would no longer pair up (a hang; here a gloo
    # timeout). They agree, go on together, and finish alike.
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_rank_main, args=(r, port, {"a": 10.0, "b": 10.0 if r == 0 else [9.0, 11.0]}, queue))
             for r in range(2)]
    for p in procs:
        p.start()
    got = {}
    # each rank puts its answer (or its error, a hang's gloo timeout among them) and ends: read until both
    # have answered or ended, however long a busy machine makes that
    while len(got) < 2 and (any(p.is_alive() for p in procs) or not queue.empty()):
        with contextlib.suppress(Empty):
            r, v = queue.get(timeout=1)
            got[r] = v
    for p in procs:
        p.join(timeout=HANG_S)  # (a rank that hangs on after answering is ended: the answers decide)
        if p.is_alive():
            p.kill()
    assert got.get(0) == got.get(1) and isinstance(got.get(0), dict), got
    assert got[0]["a"] > 6  # rank 1's doubt kept both ranks timing


def test_rounds_interleave_the_backends_each_after_a_rewarm_step(monkeypatch):
    # a b a b ..., never a's forwards first: drift falls on every backend alike
    monkeypatch.setattr(capture, "_timed_wall", _fake_wall)
    t = _FakeTarget({"a": 10.0, "b": 10.0})
    timed_rounds(t, ["a", "b"], iters=4, rounds=2, budget_s=0)
    assert t.ran == ["a"] * 3 + ["b"] * 3 + ["a"] * 3 + ["b"] * 3


def test_timed_rounds_with_no_backend_returns_nothing(monkeypatch):
    # timed_rounds is public: no backend, no samples (and no error)
    monkeypatch.setattr(capture, "_timed_wall", _fake_wall)
    done = timed_rounds(_FakeTarget({}), [], iters=4, rounds=4)
    assert done.timings == {} and done.rounds == 0


# -- the statistic of merged ranks -------------------------------------------------------------------

def test_merged_ranks_take_the_slowest_rank_step_by_step_and_unit_by_unit():
    # every step of a tensor-parallel job is as slow as its slowest rank: samples and paired units merged
    # element by element; a generate's time is still the sum of each prompt's median over the rounds
    from attnswitch.profiling.rounds import Timing

    per_rank = []
    for units in ([[100.0, 50.0], [150.0, 40.0], [90.0, 60.0]], [[101.0, 49.0], [149.0, 41.0], [91.0, 61.0]]):
        base = BackendResult("math", "ok", timer="wall-clock", generate=GenerateStats(tokens=100))
        per_rank.append(with_timing(base, Timing([sum(u) for u in units], units, per_prompt=True)))
    assert per_rank[0].time_ms == 100.0 + 50.0  # each prompt's median, summed
    merged = merge_results(per_rank)
    assert merged.time_rounds_ms == ((101.0, 50.0), (150.0, 41.0), (91.0, 61.0))
    assert merged.time_ms == 101.0 + 50.0
    assert merged.generate.tokens_per_s == 100 / (151.0 / 1e3)


# -- the command's own time account -----------------------------------------------------------------

def test_cli_sweep_total_counts_every_shape(tmp_path, monkeypatch, capsys, vclock):
    # a sweep's account holds every shape's time: each backend's preparation takes 100 s more (on the
    # clock every account reads), so two shapes spend 200 s more, and the total stays within the command's
    # time on that clock
    import attnswitch.profiling as profiling
    from attnswitch.cli import main

    real = profiling.prepare_backend

    def slow(*a, **kw):
        vclock.sleep(100.0)
        return real(*a, **kw)

    monkeypatch.setattr(profiling, "prepare_backend", slow)
    out = tmp_path / "out"
    t0 = vclock.perf_counter()
    rc = main(["compare", "tiny-llama", "--device", "cpu", "--num-layers", "1", "--seq", "16,24", "--iters", "1",
               "--warmup", "0", "--backends", "math", "--no-numerics", "--out", str(out)])
    wall = vclock.perf_counter() - t0
    assert rc == 0
    spent = json.loads((out / "report.json").read_text())["settings"]["time_s"]
    assert spent["total"] <= wall
    assert spent["math"] >= 200.0 and spent["total"] >= 200.0, spent


def test_a_sweeps_own_time_is_at_least_what_it_says_went_into_it(tmp_path, monkeypatch, capsys, vclock):
    # docs/cli.md, "What it prints": "the last lines say where the command's own time went" (docs/report.md:
    # "where the command's own time went (imports, loading, each backend, the timing rounds, numerics)").
    # A sweep's total, as a single compare's, includes the imports and the model's loading: never smaller than one
    # of its own parts. Here loading the model takes 100 s (on the clock every account reads). A wrong account,
    # each shape's total summed without the time before the first, would say "loading the model 100.0 s" and a
    # total of about 0.2 s.
    real = cli._loaded

    def slow(s):
        loaded = real(s)
        vclock.sleep(100.0)
        return loaded

    monkeypatch.setattr(cli, "_loaded", slow)
    out = tmp_path / "out"
    assert cli.main([*QUICK[:6], "--seq", "8,12", *QUICK[8:], "--no-numerics", "--out", str(out)]) == 0
    capsys.readouterr()
    spent = json.loads((out / "report.json").read_text())["settings"]["time_s"]
    assert spent["loading the model"] >= 100.0
    assert spent["total"] >= spent["imports"] + spent["loading the model"], spent
    # the account is part of the report it writes: it says that writing the files comes after it
    assert "own time until the report" in (out / "report.md").read_text()


def test_the_report_says_how_many_rounds_ran_and_why_they_stopped():
    from conftest import batch_for, tiny

    from attnswitch.comparison import compare

    m = tiny("llama")
    r = compare(m, batch_for(m), backends=["naive", "math"], warmup=0, iters=4, rounds=2, time_budget_s=0,
                check_numerics=False)
    assert r.settings["host"]["rounds"] == 2 and r.settings["host"]["stopped"] == "fixed"
    assert all(len(b.time_samples_ms) == 4 and len(b.time_rounds_ms) == 2 for b in r.ok)
    assert "in 2 interleaved rounds (the rounds asked for)" in " ".join(r.to_markdown().split())


def test_the_rounds_asked_for_are_run_or_refused_never_silently_fewer():
    # docs/python-api.md: "The steady time comes from `iters` unprofiled steps per backend in at least `rounds`
    # interleaved rounds"; docs/cli.md: "--rounds N ... interleaved rounds every backend is timed in", and "Options
    # that do not apply are refused, never ignored".
    # compare(..., iters=2, rounds=4, time_budget_s=0) runs the 4 rounds asked for, or refuses them. A wrong answer
    # would run min(rounds, iters) = 2, each backend with 2 paired rounds, and say "in 2 interleaved rounds (the
    # rounds asked for)".
    m = tiny("llama")
    try:
        r = compare(m, batch_for(m), backends=["naive", "math"], warmup=0, iters=2, rounds=4, time_budget_s=0,
                    check_numerics=False)
    except OptionError:
        return  # refused, not ignored: what docs/cli.md promises of an option it cannot honour
    assert [len(b.time_rounds_ms) for b in r.ok] == [4, 4], [len(b.time_rounds_ms) for b in r.ok]
    assert r.settings["host"]["rounds"] >= 4, r.settings["host"]


def test_profile_hides_what_was_alive_before_from_the_collector_and_gives_it_back(monkeypatch):
    import gc

    from conftest import batch_for, tiny

    import attnswitch
    import attnswitch.profiling as profiling

    seen = []
    real = profiling.prepare_backend

    def spy(*a, **k):
        seen.append(gc.get_freeze_count())
        return real(*a, **k)

    monkeypatch.setattr(profiling, "prepare_backend", spy)
    model = tiny("llama")
    gc.unfreeze()  # (this process's own: a library may freeze its objects at import; here nothing may be frozen)
    attnswitch.profile(model, batch_for(model), backends=["naive"], warmup=0, iters=1, profile_steps=0)
    assert seen and seen[0] > 0  # the model, torch and transformers were frozen while it measured
    assert gc.get_freeze_count() == 0  # and given back to the collector
    gc.freeze()  # a caller that froze its own objects keeps them frozen
    try:
        frozen = gc.get_freeze_count()
        attnswitch.profile(model, batch_for(model), backends=["naive"], warmup=0, iters=1, profile_steps=0)
        assert gc.get_freeze_count() > 0.9 * frozen  # still frozen (less what was freed meanwhile)
    finally:
        gc.unfreeze()


def test_a_backend_left_out_against_one_fastest_comes_back_when_another_becomes_the_fastest(monkeypatch):
    # x is decidedly slower than a after the first rounds and sits out; then a slows down and b, which x
    # was never told apart from, becomes the fastest: x is timed again, paired with b, rather than ranked on
    # a verdict against a backend that is no longer the fastest
    monkeypatch.setattr(capture, "_timed_wall", _fake_wall)
    t = _FakeTarget({"a": [10.0] * 6 + [13.0] * 60, "b": [10.4, 9.8] * 40, "x": [10.2] * 80})
    done = timed_rounds(t, ["a", "b", "x"], iters=6, rounds=6, budget_s=1e6, clock=t.clock)
    x = done.timings["x"].units
    assert x[6] == []  # left out after the first rounds
    assert any(x[7:]), "x never came back once b was the fastest"
    assert all(len(tm.units) == done.rounds for tm in done.timings.values())  # round r is every backend's


def _generate_rounds(monkeypatch, backends: dict, prompts: int, **kw):
    """``timed_rounds`` of a generate with ``prompts`` prompts whose turns only record (name, prompt) and
    take each backend's time times the prompt's number."""
    turns = []

    def turn(target, name, p, n, timed, timing):
        turns.append((name, p))
        row = [0.0] * n
        row[p] = backends[name] * (1 + p)
        timing.units.append(row)
        target.now += row[p] / 1e3

    monkeypatch.setattr(capture, "_prompt_turn", turn)
    t = _FakeTarget(dict.fromkeys(backends, 1.0))
    t.mode, t.prompts = "generate", prompts
    return timed_rounds(t, list(backends), clock=t.clock, **kw), turns


@pytest.mark.parametrize("n_backends,prompts", [(2, 2), (3, 3), (2, 4), (6, 5), (3, 2)])
def test_every_prompt_is_led_by_every_backend_in_turn(monkeypatch, n_backends, prompts):
    # going first may cost (caches, clocks): were a prompt always led by one backend, its time would carry that
    # cost into the ranked sum over prompts
    names = "abcdefgh"[:n_backends]
    done, turns = _generate_rounds(monkeypatch, dict.fromkeys(names, 10.0), prompts, iters=n_backends,
                                   budget_s=0)
    per_round = [turns[i:i + n_backends] for i in range(0, len(turns), n_backends)]
    leaders = {p: [r[0][0] for r in per_round if r[0][1] == p] for p in range(prompts)}
    assert all(set(ls) == set(names) for ls in leaders.values()), leaders


def test_a_generates_round_is_one_prompt_every_backend_in_an_order_that_rotates(monkeypatch):
    # paired units a prompt apart, not a whole workload apart; no backend always first after the same other
    turns = []

    def turn(target, name, p, prompts, timed, timing):
        turns.append((name, p))
        row = [0.0] * prompts
        row[p] = {"a": 10.0, "b": 10.0, "c": 30.0}[name] * (1 + p)
        timing.units.append(row)
        target.now += row[p] / 1e3

    monkeypatch.setattr(capture, "_prompt_turn", turn)
    t = _FakeTarget({"a": 1.0, "b": 1.0, "c": 1.0})
    t.mode, t.prompts = "generate", 2
    done = timed_rounds(t, ["a", "b", "c"], iters=1, rounds=1, budget_s=0, clock=t.clock)
    assert done.rounds == 6  # one pass over 2 prompts is too few pairs for any interval: MIN_PAIRS rounds
    rounds = [turns[i:i + 3] for i in range(0, 18, 3)]
    assert [{p for _, p in r} for r in rounds] == [{0}, {1}] * 3  # a round is one prompt
    assert [r[0][0] for r in rounds] == ["a", "b", "b", "c", "c", "a"]  # each prompt led by each in turn
    assert done.timings["c"].time_ms() == 30.0 + 60.0  # each prompt's median, summed


def test_a_generates_rounds_asked_for_are_run_and_reported(monkeypatch):
    done, _ = _generate_rounds(monkeypatch, {"a": 10.0, "b": 30.0}, 2, iters=1, rounds=20, budget_s=0)
    assert done.rounds == 20


def test_a_generates_noise_is_the_spread_of_prompts_measured_more_than_once():
    # a prompt measured once has no spread: counted, it would make a noisy backend look steady
    from attnswitch.profiling.rounds import Timing
    once = Timing(per_prompt=True, units=[[10.0, 0, 0], [0, 20.0, 0], [0, 0, 30.0]])
    assert once.spread() == []
    twice = Timing(per_prompt=True, units=[[10.0, 0], [0, 20.0], [14.0, 0], [0, 20.0]])
    assert sorted(twice.spread()) == pytest.approx([10 / 12, 1.0, 1.0, 14 / 12])


# -- what the rounds say while they run, and how long they run ------------------------------------------

class _SteppedTarget(_FakeTarget):
    """A ``_FakeTarget`` whose untimed step after a switch takes as long as a timed one, as a real one does."""

    def rewarm(self, prompt=0, sync=True):
        self.fn(None)
        self.now += next(self.turns[self.cur]) / 1e3


def _paced(monkeypatch, times: dict, **kw):
    monkeypatch.setattr(capture, "_timed_wall", _fake_wall)
    t = _SteppedTarget(times)
    said = []
    done = timed_rounds(t, list(times), clock=t.clock, progress=lambda line: said.append((t.now, line)), **kw)
    return t, done, said


@pytest.mark.parametrize("times", [{"a": 3000.0, "b": [3300.0, 2800.0], "c": 9000.0},  # steps of seconds
                                   {"a": 12.0, "b": [13.0, 11.0], "c": 40.0}])  # steps of milliseconds
def test_the_rounds_say_where_they_are_at_least_every_10_s_with_the_time_left(monkeypatch, times):
    # a default run's rounds took a minute and more without a word: now a line at least every 10 s (on the
    # rounds' clock), naming the round, the candidates still timed and the time left
    t, done, said = _paced(monkeypatch, times, iters=12, rounds=6)
    at = [0.0] + [a for a, _ in said] + [t.now]
    assert max(b - a for a, b in zip(at, at[1:])) <= capture.PROGRESS_EVERY_S, said
    assert len(said) <= t.now / capture.PROGRESS_EVERY_S + len(times) + 1  # (and not much more often)
    first_end = next((a for a, line in said if "more rounds" in line), t.now)
    for a, line in said:
        assert re.match(r"timing: round \d+", line), line
        names = re.search(r"\(([a-z, ]+)\)", line).group(1).split(", ")
        assert set(names) <= set(times), line
        left = re.search(r"(about|at most) (\d+) s left", line)
        if left and left.group(1) == "at most":  # the more rounds: within their budget, said as an upper bound
            assert t.now - a <= int(left.group(2)) + 0.5, (line, t.now - a)
        elif left and first_end - a > 20:  # the first rounds: an estimate from the turns taken so far
            assert 0.5 <= int(left.group(2)) / (first_end - a) <= 2, (line, first_end - a)
    if t.now > 100:  # the slow case: the first rounds take minutes, and their lines say how long is left
        assert sum("about" in line for _, line in said) >= 5 and done.rounds >= 6


def test_more_rounds_end_within_their_time_budget(monkeypatch):
    # two backends that rounds cannot tell apart, 1 s a step: 4 s of first rounds, then 5 s of budget. The last
    # round that fits ends at 8 s; one more would end at 10 s, past the budget: it is not started
    monkeypatch.setattr(capture, "_timed_wall", _fake_wall)
    t = _FakeTarget({"a": [900.0, 1100.0], "b": [1100.0, 900.0]})
    done = timed_rounds(t, ["a", "b"], iters=2, rounds=2, budget_s=5.0, clock=t.clock)
    assert done.stopped == "budget" and done.rounds > 2
    assert done.seconds - 4.0 <= 5.0, done.seconds  # the more rounds' time, within the budget


# -- a turn is a user's loop: inputs made first, one untimed step, timed steps back to back ------------------

class _LoggedTarget(_FakeTarget):
    """A ``_FakeTarget`` that logs what a turn does, in order: inputs made, the switch entered and left, steps
    (untimed ones after a switch, ``rewarm``), and waits for the device."""

    def __init__(self, times: dict):
        super().__init__(times)
        self.log = []

    def calls(self, n):
        for _ in range(n):
            self.log.append("input")
            yield None

    @contextlib.contextmanager
    def switched(self, name):
        self.log.append(f"enter {name}")
        with super().switched(name):
            yield
        self.log.append("leave")

    def rewarm(self, prompt=0, sync=True):
        self.log.append("untimed")
        self.fn(None)
        if sync:
            self.sync()

    def fn(self, c):
        self.log.append("step")
        super().fn(c)

    def sync(self):
        self.log.append("sync")


def test_a_turn_enters_the_switch_once_and_times_its_steps_back_to_back_after_one_untimed_step(monkeypatch):
    # a user's loop: inputs ready, `with attnswitch.backend(...)` around the steps, one step, then the steps
    # timed, nothing waiting for the device between them. Only a candidate's first untimed step is clocked
    # alone (the device waited for), to learn how long its steps take
    monkeypatch.setattr(capture, "_timed_wall", _fake_wall)
    t = _LoggedTarget({"a": 10.0, "b": 12.0})
    timed_rounds(t, ["a", "b"], iters=9, rounds=3, budget_s=0, clock=t.clock)
    turns, turn = [], []
    for e in t.log:
        turn.append(e)
        if e == "leave":
            turns.append(turn)
            turn = []
    assert len(turns) == 6 and not turn
    for i, turn in enumerate(turns):
        first = i < 2  # each candidate's first turn
        assert turn == ["input"] * 3 + [f"enter {'ab'[i % 2]}", "untimed", "step"] + (["sync"] if first else []) + \
            ["step"] * 3 + ["leave"], turn


class _Device:
    """A fake GPU: a clock its steps advance, and CUDA events that read it (ms)."""

    def __init__(self):
        self.now, self.waits = 0.0, 0


class _Event:
    def __init__(self, enable_timing=False):
        self.at, self.device = None, None

    def record(self, stream=None):
        self.device = stream
        self.at = stream.now

    def synchronize(self):
        self.device.waits += 1

    def elapsed_time(self, end):
        assert end.device is self.device, "events of two devices subtracted"
        return end.at - self.at


def _gpu_target(monkeypatch, steps: list[list[float]]):
    """A target on len(steps) fake GPUs whose i-th step takes ``steps[g][i]`` ms on GPU g (each GPU's steps
    back to back, as a device's queue runs them)."""
    devices = [_Device() for _ in steps]
    monkeypatch.setattr(torch.cuda, "Event", _Event)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda d: devices[d.index])
    t = _FakeTarget({"a": 1.0})
    t.devices = [torch.device("cuda", i) for i in range(len(steps))]
    t.synced, n = 0, iter(range(len(steps[0])))

    def fn(c):
        i = next(n)
        for g, d in enumerate(devices):
            d.now += steps[g][i]

    def sync():
        t.synced += 1
        start = max(d.now for d in devices)  # every GPU idle: the next work starts together
        for d in devices:
            d.now = start

    t.fn, t.sync = fn, sync
    return t, devices


def test_steps_on_a_gpu_are_timed_by_events_between_them_with_one_wait_at_the_end(monkeypatch):
    t, (gpu,) = _gpu_target(monkeypatch, [[10.0, 12.0, 11.0]])
    gpu.now = 5.0  # still busy with the untimed step before: the first timed step starts when it ends
    assert capture._timed_on_gpus(t, [None] * 3) == [10.0, 12.0, 11.0]
    assert gpu.waits == 1 and t.synced == 0  # one wait, for the last step's end; none before or between


def test_a_step_on_several_gpus_ends_when_its_last_gpu_ends(monkeypatch):
    # a model spread over two GPUs: each GPU measured from its own start (idle and together at the block's
    # start), each step ending with the later of the two
    t, gpus = _gpu_target(monkeypatch, [[3.0, 3.0, 3.0], [5.0, 1.0, 1.0]])
    gpus[0].now, gpus[1].now = 4.0, 7.0
    assert capture._timed_on_gpus(t, [None] * 3) == [5.0, 1.0, 3.0]  # ends at 5, 6, 9 after the start
    assert t.synced == 1  # made idle first, so that their starts coincide


def test_a_line_due_inside_a_block_of_long_steps_is_said_between_them(monkeypatch):
    # steps of 4 s, 3 of them timed in a turn: a line is due inside the block, said between two steps
    # (where no step is timed) and planned before it, with no clock read for it inside the block
    monkeypatch.setattr(capture, "_timed_wall", _fake_wall)
    t = _SteppedTarget({"a": 4000.0, "b": 4000.0})
    said = []
    timed_rounds(t, ["a", "b"], iters=6, rounds=2, budget_s=0, clock=t.clock,
                 progress=lambda line: said.append((t.now, line)))
    at = [0.0] + [a for a, _ in said] + [t.now]
    assert max(b - a for a, b in zip(at, at[1:])) <= capture.PROGRESS_EVERY_S, said
    assert capture._Pace.lines(0.0, 4.0, 3) == {2} and capture._Pace.lines(9.995, 0.01, 100) == {0}
    assert capture._Pace.lines(0.0, 0.01, 100) == frozenset()  # steps of milliseconds: none


def test_a_generate_timed_in_more_rounds_than_asked_says_why():
    # a generate is timed in at least 6 rounds: "--rounds 3" ran 6, and the report said "the rounds asked for"
    from conftest import tiny

    from attnswitch.comparison import compare
    from attnswitch.workload import make_workload

    m = tiny("llama")
    w = make_workload(m, mode="generate", seq=6, new_tokens=2, prompt_lens=[6])
    r = compare(m, w, backends=["naive", "math"], warmup=0, iters=6, rounds=3, time_budget_s=0,
                check_numerics=False)
    text = " ".join(r.to_markdown().split())
    ran = r.settings["host"]["rounds"]
    assert ran > 3 and r.settings["host"]["stopped"] == "fixed", r.settings["host"]
    assert f"in {ran} interleaved rounds (the rounds asked for, at least 6 for a generate: the fewest" in text
