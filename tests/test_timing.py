"""Timing rounds: settling far-behind backends, in step across ranks; the statistic of merged ranks; the
command's own time account."""

import contextlib
import datetime
import itertools
import json
import multiprocessing
import socket
import time

import torch

from attnswitch.profiling import capture
from attnswitch.profiling.capture import timed_rounds
from attnswitch.profiling.distributed import merge_results
from attnswitch.profiling.summarize import with_timing
from attnswitch.results import BackendResult, GenerateStats


class _FakeTarget:
    """A Target whose steps take fixed (per backend) times, optionally with a collective per step."""

    def __init__(self, times: dict, collective=None):
        self.device = torch.device("cpu")
        self.mode = "prefill"
        self.times, self.collective, self.cur, self.ran = times, collective, None, []

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

    def rewarm(self):
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
    t = target.times[target.cur]
    return t.pop(0) if isinstance(t, list) else t


# -- settling far-behind backends ---------------------------------------------------------------------

def _rank_main(rank, port, times, queue):
    import torch.distributed as dist

    capture._timed_wall = _fake_wall  # each rank's own clock: a fixed time per backend
    try:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                                timeout=datetime.timedelta(seconds=5))
        t = _FakeTarget(times, collective=lambda: dist.all_reduce(torch.zeros(1)))  # TP: a collective per forward
        samples = timed_rounds(t, ["a", "b"], iters=5, rounds=5)
        dist.barrier()
        queue.put((rank, {k: len(v) for k, v in samples.items()}))
        dist.destroy_process_group()
    except Exception as e:
        queue.put((rank, f"{type(e).__name__}: {e}"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_settle_under_tensor_parallelism_keeps_ranks_in_lockstep():
    # tensor parallelism: a collective in every forward. Rank 0 measures `b` 1.24x behind `a`, rank 1
    # 1.26x: were each rank to settle on its own samples, they would run different forwards and their
    # collectives would no longer pair up (a hang; here a gloo timeout). They agree, and finish alike.
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_rank_main, args=(r, port, {"a": 10.0, "b": 12.4 if r == 0 else 12.6}, queue))
             for r in range(2)]
    for p in procs:
        p.start()
    got = {}
    deadline = time.time() + 30
    while len(got) < 2 and time.time() < deadline:
        try:
            r, v = queue.get(timeout=1)
            got[r] = v
        except Exception:
            pass
    for p in procs:
        p.join(timeout=5)
        if p.is_alive():
            p.kill()
    assert got.get(0) == got.get(1) and isinstance(got.get(0), dict), got


def test_a_backend_behind_by_more_than_the_settle_factor_after_two_rounds_is_timed_no_further(monkeypatch):
    monkeypatch.setattr(capture, "_timed_wall", _fake_wall)
    # 10 forwards in 5 rounds of 2: `b` 1.26x `a` stops after two rounds; at 1.24x it runs every round
    samples = timed_rounds(_FakeTarget({"a": 10.0, "b": 12.6}), ["a", "b"], iters=10, rounds=5)
    assert {k: len(v) for k, v in samples.items()} == {"a": 10, "b": 4}
    samples = timed_rounds(_FakeTarget({"a": 10.0, "b": 12.4}), ["a", "b"], iters=10, rounds=5)
    assert {k: len(v) for k, v in samples.items()} == {"a": 10, "b": 10}
    # against the slowest of the fastest backend's samples: one of `a`'s as slow as `b` (a moment of other
    # load) and `b` is not settled; without settling, every backend runs every round
    target = _FakeTarget({"a": [10.0, 10.0, 10.0, 13.0] + [10.0] * 6, "b": 13.0})
    assert len(timed_rounds(target, ["a", "b"], iters=10, rounds=5)["b"]) == 10
    samples = timed_rounds(_FakeTarget({"a": 10.0, "b": 50.0}), ["a", "b"], iters=10, rounds=5, settle=False)
    assert len(samples["b"]) == 10
    # rounds interleave the backends, each after a re-warm step: a b a b ..., never a's ten forwards first
    t = _FakeTarget({"a": 10.0, "b": 10.0})
    timed_rounds(t, ["a", "b"], iters=4, rounds=2)
    assert t.ran == ["a"] * 3 + ["b"] * 3 + ["a"] * 3 + ["b"] * 3


def test_timed_rounds_with_no_backend_returns_nothing(monkeypatch):
    # timed_rounds is public: no backend, no samples (and no error)
    monkeypatch.setattr(capture, "_timed_wall", _fake_wall)
    assert timed_rounds(_FakeTarget({}), [], iters=4, rounds=4) == {}


# -- the statistic of merged ranks -------------------------------------------------------------------

def test_merged_ranks_of_a_generate_keep_the_fastest_sample():
    # a generate is timed by its fastest sample on one rank, and by the fastest of the slowest rank's
    # samples, step by step, when its ranks are merged (the report's note says so for both)
    per_rank = []
    for samples in ([100.0, 150.0, 200.0, 120.0, 300.0], [101.0, 151.0, 201.0, 121.0, 301.0]):
        base = BackendResult("math", "ok", timer="wall-clock", generate=GenerateStats(tokens=100))
        per_rank.append(with_timing(base, samples, best=True))
    assert per_rank[0].time_ms == 100.0  # one rank: the fastest
    merged = merge_results(per_rank)
    slowest_rank_per_step = [101.0, 151.0, 201.0, 121.0, 301.0]
    assert merged.time_ms == min(slowest_rank_per_step), merged.time_ms
    assert merged.generate.tokens_per_s == 100 / (101.0 / 1e3)


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


def test_with_two_rounds_or_fewer_nothing_is_settled_and_the_report_does_not_say_so():
    from conftest import batch_for, tiny

    from attnswitch.comparison import compare

    m = tiny("llama")
    r = compare(m, batch_for(m), backends=["naive", "math"], warmup=0, iters=4, rounds=2, check_numerics=False)
    assert r.settings["settle"] is None
    assert all(len(b.time_samples_ms) == 4 for b in r.ok)
    assert "timed no further" not in r.to_markdown()


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
