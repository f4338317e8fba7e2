"""A training step's times against a loop of the test's own, on a fake clock: a backend whose forward
and backward take known (fake) times, so that every figure is known exactly."""

import types

import pytest
import torch
from conftest import tiny

import attnswitch
from attnswitch import instrument
from attnswitch.profiling import capture, clock
from attnswitch.workload import make_workload

FWD_MS, BWD_MS = 7.0, 19.0  # per attention call


class _Clock:
    """A clock that moves only when the backend says: the rest of the step takes no (fake) time."""

    def __init__(self):
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now


@pytest.fixture
def fake(monkeypatch):
    c = _Clock()
    fake_time = types.SimpleNamespace(perf_counter=c.perf_counter)
    for module in (capture, clock, instrument):
        monkeypatch.setattr(module, "time", fake_time)

    class Timed(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            c.now += FWD_MS / 1e3
            return x.clone()

        @staticmethod
        def backward(ctx, g):
            c.now += BWD_MS / 1e3
            return g

    def kernel(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal,
                                                               scale=scale, enable_gqa=enable_gqa)
        return Timed.apply(out)

    attnswitch.register_backend("timed", kernel, gqa=True)
    yield c
    attnswitch.unregister_backend("timed")


def _own_loop(model, work, c: _Clock, steps: int = 4) -> list[float]:
    """A user's loop: forward with labels, backward, zero_grad; the (fake) clock around each step."""
    out = []
    model.train()
    with attnswitch.backend("timed", model=model):
        for _ in range(steps):
            t0 = c.now
            model(**work.kwargs).loss.backward()
            model.zero_grad(set_to_none=True)
            out.append((c.now - t0) * 1e3)
    model.eval()
    return out


def test_a_training_steps_time_forward_and_backward_are_what_a_users_loop_measures(fake):
    model = tiny("llama")  # two layers: two attention calls per forward, two in the backward
    work = make_workload(model, batch=2, seq=8, mode="train")
    r = attnswitch.compare(model, work, backends=["timed"], warmup=1, iters=4, rounds=2, time_budget_s=0,
                           check_numerics=False, profile_steps=0)
    b = r["timed"]
    layers = 2
    assert b.train.forward_ms == pytest.approx(layers * FWD_MS)
    assert b.train.backward_ms == pytest.approx(layers * BWD_MS)
    assert b.time_ms == pytest.approx(layers * (FWD_MS + BWD_MS))
    assert b.host_ms == pytest.approx(b.time_ms) and b.host_attn_ms == pytest.approx(layers * FWD_MS)
    loop = _own_loop(model, work, fake)
    assert loop == pytest.approx([b.time_ms] * len(loop))
