"""Profiler attribution on a real GPU forward: counts add up, the post's findings per layer."""

import pytest
import torch

import attnswitch
from attnswitch.models import load_model, make_workload
from attnswitch.profiling.attribution import attribute, step_totals
from attnswitch.profiling.trace import Trace

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def report():
    m, _ = load_model("tiny-llama", dtype="bf16", device="cuda")
    w = make_workload(m, batch=2, seq=256)
    return attnswitch.profile(m, w, backends=["naive", "naive-inplace", "math", "efficient", "flash", "cudnn"],
                              warmup=2, iters=3)


def test_rows_add_up_to_raw_profiler_totals(report):
    for b in report.ok:
        trace = Trace.load(b.trace_path)
        steps = {s.step for s in trace.steps()}
        rows = attribute(trace, steps)
        raw = [e for e in trace.device_events if e.step in steps]
        assert sum(r.kernels + r.memcpys + r.memsets for r in rows.values()) == len(raw)
        totals = step_totals(trace)
        assert sum(t.kernels for t in totals) == sum(r.kernels for r in rows.values())
        assert all(e.launch is not None for e in raw)


def test_the_posts_findings_per_layer(report):
    assert report["naive"].attn_memcpys_per_call == 1
    assert report["naive-inplace"].attn_memcpys_per_call == 0
    assert report["math"].attn_kernels_per_call >= 8
    for name in ("efficient", "flash", "cudnn"):
        assert report[name].attn_kernels_per_call == 1, name
    assert "cuLaunchKernelEx" in report["cudnn"].attn_launch_apis


def test_recomputed_occupancy_is_positive_for_fused_kernels(report):
    for name in ("flash", "cudnn", "efficient"):
        details = report[name].attn_kernel_details
        assert details and all(d["occupancy_pct"] and d["occupancy_pct"] > 0 for d in details), details
