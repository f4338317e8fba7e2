"""Models spread over two GPUs: accelerate's device_map in one process, tensor parallelism under torchrun.

The per-layer attention kernel counts must equal the single-GPU ones, every device event must carry
its GPU, the per-GPU totals must add up to the raw profiler events, and the copies between the GPUs
must sit at the layer boundary where the device_map splits the model.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import saved_gqa_llama

import attnswitch
from attnswitch.models import load_model
from attnswitch.profiling.attribution import device_totals
from attnswitch.profiling.trace import Trace
from attnswitch.workload import make_workload

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")]

BACKENDS = ["naive", "naive-inplace", "math", "efficient", "flash", "cudnn"]
DEVICE_MAP = {"model.embed_tokens": 0, "model.rotary_emb": 0, "model.layers.0": 0, "model.layers.1": 0,
              "model.layers.2": 1, "model.layers.3": 1, "model.norm": 1, "lm_head": 1}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return saved_gqa_llama(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="module")
def single(folder):
    m, _ = load_model(folder, dtype="bf16", device="cuda:0")
    return m, attnswitch.profile(m, make_workload(m, batch=2, seq=128), backends=BACKENDS, warmup=1, iters=2)


@pytest.fixture(scope="module")
def spread(folder):
    m, _ = load_model(folder, dtype="bf16", device_map=DEVICE_MAP)
    return m, attnswitch.profile(m, make_workload(m, batch=2, seq=128), backends=BACKENDS, warmup=1, iters=2)


def _attention_kernels(report, backend):
    return {l.path: l.kernels / l.calls for l in report[backend].layers if l.kind == "attention"}


def test_device_map_model_is_switched_like_a_single_gpu_one(single, spread):
    (m1, _), (m2, _) = single, spread
    assert {p.device.index for p in m2.parameters()} == {0, 1}
    w1, w2 = make_workload(m1, batch=2, seq=64, padding=True), make_workload(m2, batch=2, seq=64, padding=True)
    with torch.no_grad():
        for name in ("cudnn", "flash", "naive"):
            if name == "flash":  # flash takes no mask: the padded batch is for the others
                w1, w2 = make_workload(m1, batch=2, seq=64), make_workload(m2, batch=2, seq=64)
            with attnswitch.backend(name):
                a = m1(**w1.kwargs).logits
                b = m2(**w2.kwargs).logits
            assert b.device.index == 0  # accelerate returns the outputs on the inputs' GPU
            torch.testing.assert_close(b.float().cpu(), a.float().cpu(), atol=2e-2, rtol=2e-2)


def test_device_map_attention_kernels_equal_single_gpu(single, spread):
    (_, r1), (_, r2) = single, spread
    assert r2.distribution["mode"] == "device_map" and r2.distribution["devices"] == ["cuda:0", "cuda:1"]
    for b in BACKENDS:
        assert r2[b].ok, (b, r2[b].reasons)
        assert _attention_kernels(r2, b) == _attention_kernels(r1, b), b
        assert r2[b].attn_kernels_per_call == r1[b].attn_kernels_per_call
        for l in r2[b].layers:  # every layer on the GPU the device_map gave it
            if l.kind == "attention" and l.path.startswith("model.layers."):
                assert l.devices == ((0,) if int(l.path.split(".")[2]) < 2 else (1,)), (l.path, l.devices)


def test_device_map_per_gpu_totals_are_the_raw_events(spread):
    _, r = spread
    for b in r.ok:
        trace = Trace.load(b.trace_path)
        steps = {s.step for s in trace.steps()}
        assert trace.devices == [0, 1]
        for d in b.devices:
            raw = [e for e in trace.device_events if e.step in steps and e.device == d.device]
            n = len(steps)
            assert d.kernels * n == sum(e.kind == "kernel" for e in raw)
            assert d.memcpys * n == sum(e.kind == "memcpy" for e in raw)
            assert d.gpu_busy_ms * n * 1e3 == pytest.approx(sum(e.dur for e in raw))
        assert sum(d.kernels for d in b.devices) == b.kernels


def test_device_map_copies_sit_at_the_layer_boundary(spread):
    _, r = spread
    for b in r.ok:
        into_gpu1 = {(t.after, t.into): t for t in b.transfers if (t.src, t.dst) == (0, 1)}
        # accelerate's hook on each layer of GPU 1 moves what it is given that is still on GPU 0: at the
        # boundary the hidden states, rotary cos/sin and positions; the next layer gets cos/sin again
        assert set(into_gpu1) == {("model.layers.1", "model.layers.2"), ("model.layers.2", "model.layers.3")}
        assert into_gpu1[("model.layers.1", "model.layers.2")].bytes >= 2 * 128 * 256 * 2  # bf16 hidden states
        back = [t for t in b.transfers if (t.src, t.dst) == (1, 0)]
        assert [(t.after, t.into) for t in back] == [("lm_head", "LlamaForCausalLM")]  # logits to the inputs' GPU
        trace = Trace.load(b.trace_path)
        steps = {s.step for s in trace.steps()}
        peers = [e for e in trace.device_events if e.step in steps and e.peer is not None]
        assert sum(t.copies for t in b.transfers) * len(steps) == len(peers)


def test_tensor_parallel_under_torchrun(tmp_path, folder, single):
    _, r1 = single
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "-m", "attnswitch", "compare",
           folder, "--tp", "--dtype", "bf16", "--batch", "2", "--seq", "128", "--backends", ",".join(BACKENDS),
           "--iters", "2", "--warmup", "1", "--out", str(out)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=os.environ.copy())
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    rep = attnswitch.Report.from_json(out / "report.json")
    assert rep.distribution["mode"] == "tensor_parallel" and rep.distribution["world_size"] == 2
    assert rep.command.startswith("torchrun --nproc-per-node 2 -m attnswitch compare")
    # only rank 0 wrote: the report once, rank 1's traces through it
    assert sorted(p.name for p in out.iterdir()) == ["command.txt", "report.csv", "report.html", "report.json",
                                                      "report.md", "traces"]
    for b in BACKENDS:
        r = rep[b]
        assert r.ok, (b, r.reasons)
        assert {l.rank for l in r.layers} == {0, 1}
        assert {(d.rank, d.device) for d in r.devices} == {(0, 0), (1, 1)}
        # every rank runs the single-GPU model's attention calls on half of the heads
        for rank in (0, 1):
            per = {l.path: l.kernels / l.calls for l in r.layers if l.kind == "attention" and l.rank == rank}
            assert per == _attention_kernels(r1, b), (b, rank)
        # the row-parallel projections all-reduce: one NCCL kernel per call, in the layer that issued it
        for l in r.layers:
            if l.path.endswith(("o_proj", "down_proj")):
                assert l.comm_kernels == l.calls, (b, l)
            if l.kind == "attention":
                assert l.comm_kernels == 0
        # per-rank totals are that rank's raw events
        traces = {0: Path(r.trace_path), **{int(Path(t).name.split("_rank")[1].split(".")[0]): Path(t)
                                              for t in r.rank_trace_paths}}
        assert sorted(traces) == [0, 1]
        for d in r.devices:
            trace = Trace.load(out / "traces" / traces[d.rank].name)
            assert trace.rank == d.rank and trace.devices == [d.device]
            tot = [t for t in device_totals(trace)]
            n = len(trace.steps())
            assert d.kernels * n == sum(t.kernels for t in tot)
            assert d.comm_kernels * n == sum(t.comm_kernels for t in tot) > 0
        assert r.kernels == sum(d.kernels for d in r.devices)
        assert r.numerics is not None and r.numerics.ok, (b, r.numerics)
    assert "eager attention computed in float32" in rep.settings["numerics_reference"]


def test_device_map_forward_time_against_the_wall_clock(spread):
    # the multi-GPU CUDA-event time of one forward (a start and an end event on each GPU) against an
    # independent clock: both GPUs synchronized before and after, host wall time in between
    import time

    from attnswitch.profiling.capture import Target, _timed_on_gpus

    m, rep = spread
    w = make_workload(m, batch=8, seq=512)  # enough work per forward for the GPUs to dominate
    t = Target.of(m, w.kwargs)
    assert t.devices == [torch.device("cuda", 0), torch.device("cuda", 1)]
    with torch.no_grad(), attnswitch.backend("cudnn", model=m):
        for _ in range(3):
            m(**w.kwargs)
        events, wall = [], []
        for _ in range(10):
            t.sync()
            events.append(_timed_on_gpus(t, [w.kwargs])[0])
            t.sync()
            t0 = time.perf_counter()
            m(**w.kwargs)
            t.sync()
            wall.append((time.perf_counter() - t0) * 1e3)
    ev, wl = sorted(events)[5], sorted(wall)[5]
    assert 0.85 * wl <= ev <= wl * 1.02 + 0.02, (ev, wl)
    # and the report's steady time is such an event time, not one GPU's share of it
    for b in rep.ok:
        assert b.time_ms >= max(d.gpu_busy_ms for d in b.devices), b.backend
