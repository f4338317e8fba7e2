"""% of peak: the attention calls' shapes as the profiled pass recorded them, useful FLOPs (or K/V bytes) over the
profiler's kernel time, against a table of GPUs and a measured ceiling; in every writer.

The arithmetic is driven with fake kernel times and a fake GPU (the H200 figures of DESIGN.md), and with the
kernel times of a real H200 trace; the shapes with live CPU runs.
"""

import dataclasses
import itertools
import json
from pathlib import Path

import pytest
import torch
from conftest import tiny

from attnswitch import peak
from attnswitch.comparison import compare
from attnswitch.peak import AttnShape, call_flops, figures, headroom, pairs
from attnswitch.profiling import profile
from attnswitch.profiling.attribution import attribute
from attnswitch.profiling.ceiling import measure
from attnswitch.profiling.summarize import backend_fields
from attnswitch.profiling.trace import Trace
from attnswitch.render.console import to_text
from attnswitch.render.gates import NO_KERNEL_TIME
from attnswitch.render.markdown import to_markdown
from attnswitch.results import BackendResult, LayerStats, Report
from attnswitch.workload import make_workload

DATA = Path(__file__).parent / "data"
B, H, S, D = 4, 32, 4096, 128
#: DESIGN.md: one causal call at B4 H32 S4096 D128 in bf16 on the H200 (torch 2.11, cuDNN 9.19), CUDA events
H200 = {"cudnn": (994.0, 553.0), "flash": (1815.0, 303.0), "efficient": (3378.0, 163.0)}  # µs, TFLOP/s
CEILING = {"dtype": "bfloat16", "matmul_tflops": 790.0, "matmul_n": 8192, "copy_tbps": 4.3, "copy_mib": 1024,
           "seconds": 0.6}


def _brute(q_len, kv_len, causal, window, top_left):
    off = 0 if top_left else kv_len - q_len
    n = 0
    for i, j in itertools.product(range(q_len), range(kv_len)):
        p = off + i
        if causal and (j > p or (window and p - j >= window)):
            continue
        if not causal and window and abs(p - j) >= window:
            continue
        n += 1
    return n


@pytest.mark.parametrize("q_len,kv_len", [(1, 1), (5, 5), (7, 7), (3, 9), (1, 17), (9, 3), (16, 16)])
@pytest.mark.parametrize("causal,window,top_left", [(False, None, False), (True, None, False), (True, 4, False),
                                                   (True, None, True), (True, 3, True), (False, 4, False)])
def test_useful_flops_count_only_the_pairs_causal_and_window_masking_leave(q_len, kv_len, causal, window, top_left):
    assert pairs(q_len, kv_len, causal, window, top_left) == _brute(q_len, kv_len, causal, window, top_left)
    # two matmuls over those pairs: 4·B·H·pairs·D for equal head dims
    assert call_flops(2, 3, q_len, kv_len, 8, 8, causal, window, top_left) == 4 * 2 * 3 * pairs(
        q_len, kv_len, causal, window, top_left) * 8


def _shape(site="model.layers.0.self_attn", q=S, kv=S, **kw):
    base = dict(calls=1.0, batch=B, heads=H, kv_heads=H, q_len=q, kv_len=kv, kv_len_min=kv, head_dim=D, v_dim=D,
                dtype="bfloat16", causal=q > 1)
    base.update(kw)
    s = AttnShape(site, **base)
    return dataclasses.replace(s, flops=call_flops(s.batch, s.heads, s.q_len, s.kv_len, D, D, s.causal, s.window),
                               kv_bytes=peak.kv_bytes(s.batch, s.kv_heads, s.kv_len, D, D, s.dtype, s.window))


def _row(us, site="model.layers.0.self_attn", phase=None, calls=1.0):
    return LayerStats(site, "attention", calls, 1.0, 0.0, 0.0, us, 50.0, 1.0, phase=phase)


@pytest.mark.parametrize("name", list(H200))
def test_the_h200_figures_come_out_of_fake_kernel_times_within_5_percent(name):
    us, tflops = H200[name]
    (f,) = figures([_row(us)], [_shape()], "NVIDIA H200", CEILING)
    assert f.phase == "forward" and f.bound == "compute" and f.unit == "TFLOP/s" and f.kernel_us == us
    assert f.achieved == pytest.approx(tflops, rel=0.05)
    assert f.spec == pytest.approx(989.4) and f.pct_spec == pytest.approx(100 * tflops / 989.4, rel=0.05)
    assert f.measured == 790.0 and f.pct_measured == pytest.approx(100 * tflops / 790, rel=0.05)


def _result(name, figs=(), **kw):
    return BackendResult(name, "ok", timer="cuda-events", time_ms=1.0, attn_peak=tuple(figs), **kw)


def test_the_headroom_line_names_each_backend_against_the_peak():
    backends = [_result(n, figures([_row(us)], [_shape()], "NVIDIA H200", CEILING)) for n, (us, _) in H200.items()]
    line = headroom(backends, "NVIDIA H200")
    assert line.startswith("Headroom: `cudnn` reaches 56 % of peak here in its forward attention calls (553 of ")
    assert "(553 of the H200's 989.4 dense bf16 TFLOP/s; 70 % of the matmul measured here)" in line
    assert line.endswith("`flash` 31 %, `efficient` 16 %.")


def test_a_gpu_not_in_the_table_is_against_the_measured_ceiling_alone():
    (f,) = figures([_row(994.0)], [_shape()], "NVIDIA Some Future GPU", CEILING)
    assert f.spec is None and f.pct_spec is None and f.pct_measured == pytest.approx(70, abs=1)
    assert "of the measured ceiling" in headroom([_result("cudnn", [f])])
    # the ceiling of another dtype is not this one's
    (g,) = figures([_row(994.0)], [_shape(dtype="float16")], "NVIDIA H200", CEILING)
    assert g.measured is None and g.spec == pytest.approx(989.4)


def test_a_backward_counts_two_and_a_half_forwards_and_decode_steps_the_bytes_of_k_and_v():
    shape = _shape()
    rows = [_row(994.0), _row(2 * 994.0, phase="backward", calls=0.0)]  # the backward has no ranges: no calls
    fwd, bwd = figures(rows, [shape], "NVIDIA H200", None)
    assert bwd.phase == "backward" and bwd.calls == 1.0
    assert bwd.achieved == pytest.approx(fwd.achieved * 2.5 / 2)
    # a generate: its prefill rows and its decode rows (one query row, memory-bound) apart
    decode = _shape(q=1, kv=4097, kv_heads=8, kv_len_min=4097)
    rows = [_row(994.0, phase="prefill"), _row(20.0, phase="decode", calls=7.0)]
    pre, dec = figures(rows, [shape, dataclasses.replace(decode, calls=7.0)], "NVIDIA H200", CEILING)
    assert pre.phase == "prefill" and pre.bound == "compute"
    assert dec.phase == "decode" and dec.bound == "memory" and dec.unit == "TB/s" and dec.spec == 4.8
    moved = B * 8 * 4097 * 2 * D * 2  # K and V, their 8 heads, bf16
    assert dec.achieved == pytest.approx(moved / (20.0 / 7 * 1e-6) / 1e12) and dec.measured == 4.3


def test_a_place_for_figures_per_layer_kind():
    rows = [_row(994.0), _row(497.0, site="model.layers.1.self_attn")]
    shapes = [_shape(), _shape(site="model.layers.1.self_attn", window=512)]
    kinds = {"model.layers.0.self_attn": "full_attention", "model.layers.1.self_attn": "sliding_attention"}
    figs = figures(rows, shapes, "NVIDIA H200", None, kind_of_site=kinds.get)
    assert {f.layer_kind for f in figs} == {"full_attention", "sliding_attention"}
    assert figures(rows, shapes, "NVIDIA H200", None)[0].layer_kind is None  # today: every layer together


def test_peak_figures_from_the_kernel_times_of_a_real_h200_trace():
    trace = Trace.load(DATA / "llama2l_cudnn.json.gz")  # 2-layer Llama, B1, 8/2 heads, D32, 64 tokens, bf16
    fields = backend_fields(trace, attribute(trace, {s.step for s in trace.steps()}), cuda=True)
    sites = ["model.layers.0.self_attn", "model.layers.1.self_attn"]
    shapes = [AttnShape(s, 1.0, 1, 8, 2, 64, 64, 64, 32, 32, "bfloat16", True,
                        flops=call_flops(1, 8, 64, 64, 32, 32, True)) for s in sites]
    (f,) = figures(fields["layers"], shapes, "NVIDIA H200", None)
    us = fields["attn_gpu_us_per_call"]
    assert f.calls == 2 and f.kernel_us == pytest.approx(us)
    assert f.achieved == pytest.approx(call_flops(1, 8, 64, 64, 32, 32, True) / (us * 1e-6) / 1e12)
    assert 0 < f.pct_spec < 1  # a tiny call is nowhere near the peak


def test_the_profiled_pass_records_each_call_sites_shape_as_it_ran():
    model = tiny("llama")  # 8 query heads, 2 key/value heads, head dim 8
    work = make_workload(model, batch=2, seq=24, mode="prefill", padding=True)
    r = profile(model, work, backends="flash", iters=1, rounds=1, time_budget_s=0)
    shapes = r["flash"].attn_shapes
    assert [s.site for s in shapes] == ["model.layers.0.self_attn", "model.layers.1.self_attn"]
    s = shapes[0]
    assert (s.calls, s.batch, s.heads, s.kv_heads, s.q_len, s.kv_len, s.head_dim, s.dtype) == \
        (1.0, 2, 8, 2, 24, 24, 8, "float32")
    assert s.causal and s.mask and s.window is None and s.flops == call_flops(2, 8, 24, 24, 8, 8, True)
    # a sliding window as transformers passes it; a generate's decode steps apart, over their key lengths
    mistral = tiny("mistral")
    r = profile(mistral, make_workload(mistral, batch=1, seq=8, mode="generate", new_tokens=4, prompt_lens=[8]),
                backends="flash", iters=1, rounds=1, time_budget_s=0)
    prefill, decode = (s for s in r["flash"].attn_shapes if s.site == "model.layers.0.self_attn")
    assert prefill.window == 5 and prefill.q_len == 8 and not prefill.one_row
    # (its cache keeps the window's keys alone: the kernel was given 5)
    assert decode.one_row and decode.window == 5 and (decode.kv_len, decode.calls) == (5, 3.0)
    r = profile(model, make_workload(model, batch=1, seq=8, mode="generate", new_tokens=4, prompt_lens=[8]),
                backends="flash", iters=1, rounds=1, time_budget_s=0)
    decode = next(s for s in r["flash"].attn_shapes if s.one_row)
    assert (decode.kv_len_min, decode.kv_len, decode.calls) == (9, 11, 3.0)


def test_a_cpu_report_has_no_percent_and_says_so_once(tmp_path):
    model = tiny("llama")
    r = compare(model, make_workload(model, batch=1, seq=16), backends="naive,flash", iters=1, rounds=1,
                time_budget_s=0)
    assert all(b.attn_shapes and not b.attn_peak for b in r.backends)
    assert "ceiling" not in r.settings and measure(torch.device("cpu"), torch.float32) is None
    for text in (to_text(r), to_markdown(r)):
        assert text.count(NO_KERNEL_TIME) == 1 and "Headroom" not in text


def _gpu_report():
    rows = [_result(n, figures([_row(us)], [_shape()], "NVIDIA H200", CEILING), attn_shapes=(_shape(),))
            for n, (us, _) in H200.items()]
    return Report(tuple(rows), {"device": "cuda", "gpu": "NVIDIA H200", "torch": "2.11.0"},
                  {"mode": "prefill", "batch": B, "seq": S, "dtype": "bfloat16"}, {"ceiling": CEILING}, model="m",
                  ranking=tuple(H200))


def test_every_writer_shows_each_backends_percent_of_peak_and_the_headroom_line(tmp_path):
    report = _gpu_report()
    text, md = to_text(report), to_markdown(report)
    page = report.write_html(tmp_path / "r.html").read_text()
    for out in (text, md, page.replace("<code>", "`").replace("</code>", "`")):
        assert "Headroom: `cudnn` reaches 56 % of peak here" in out and "% of peak" in out
        assert "553 TFLOP/s" in out.replace("</td><td class=\"num\">", " ") or "553 TFLOP/s" in out
        assert "a 8192³ bfloat16 matmul at 790 TFLOP/s" in out
    data = json.loads(report.to_json())
    f = data["backends"][0]["attn_peak"][0]
    assert f["unit"] == "TFLOP/s" and f["pct_spec"] == pytest.approx(55.9, abs=0.5)
    assert data["settings"]["ceiling"]["matmul_tflops"] == 790.0
    back = Report.from_json(report.to_json())
    assert back.backends[0].attn_peak == report.backends[0].attn_peak and to_text(back) == to_text(report)
    csv = report.to_csv().splitlines()
    assert "attn_pct_of_peak" in csv[0] and "TFLOP/s" in csv[1]


def test_a_report_of_the_schema_before_loads_without_figures():
    data = json.loads(_gpu_report().to_json())
    data["schema_version"] = 5
    for b in data["backends"]:
        for k in ("attn_shapes", "attn_peak", "defects", "nonfinite"):
            b.pop(k)
    old = Report.from_json(json.dumps(data))
    assert old.backends[0].attn_peak == () and "Headroom" not in to_text(old)


def test_the_gpu_table_names_the_gpus_cuda_names():
    for name, spec in [("NVIDIA H200", "H200"), ("NVIDIA H100 80GB HBM3", "H100"), ("NVIDIA H100 PCIe", "H100 PCIe"),
                       ("NVIDIA A100-SXM4-80GB", "A100 80GB"), ("NVIDIA B200", "B200"), ("NVIDIA L40S", "L40S"),
                       ("NVIDIA L4", "L4"), ("NVIDIA H200 NVL", "H200 NVL")]:
        assert peak.gpu_spec(name).name == spec, name
    assert peak.gpu_spec(None) is None and peak.gpu_spec("Intel Arc") is None
