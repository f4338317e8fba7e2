"""Parsing and attribution on real H200 traces (tests/data) and on live CPU profiles."""

from collections import Counter
from pathlib import Path

import pytest
import torch
from conftest import batch_for, tiny

import attnswitch
from attnswitch.profiling.attribution import OUTSIDE, attribute, kernel_summaries, step_totals
from attnswitch.profiling.occupancy import H100_LIMITS
from attnswitch.profiling.trace import Trace
from attnswitch.render.sections import fold
from attnswitch.results import LayerStats

DATA = Path(__file__).parent / "data"
BACKENDS = ["naive", "naive-inplace", "math", "efficient", "flash", "cudnn", "auto"]
LAYERS = ["model.layers.0.self_attn", "model.layers.1.self_attn"]


@pytest.fixture(scope="module")
def traces():
    return {b: Trace.load(DATA / f"llama2l_{b}.json.gz") for b in BACKENDS}


def attention_rows(trace):
    rows = attribute(trace, {s.step for s in trace.steps()})
    return rows, {p: rows[(p, "attention", None)] for p in LAYERS}


@pytest.mark.parametrize("name", BACKENDS)
def test_rows_add_up_to_the_raw_event_list(traces, name):
    trace = traces[name]
    steps = {s.step for s in trace.steps()}
    rows = attribute(trace, steps)
    raw = [e for e in trace.device_events if e.step in steps]
    kinds = Counter(e.cat for e in raw)
    assert sum(r.kernels for r in rows.values()) == kinds["kernel"]
    assert sum(r.memcpys for r in rows.values()) == kinds["gpu_memcpy"]
    assert sum(r.memsets for r in rows.values()) == kinds["gpu_memset"]
    assert sum(r.gpu_us for r in rows.values()) == pytest.approx(sum(e.dur for e in raw))
    (t,) = step_totals(trace)
    assert (t.kernels, t.memcpys, t.memsets) == (kinds["kernel"], kinds["gpu_memcpy"], kinds["gpu_memset"])
    # every device event was matched to its launch by correlation id, none dropped
    assert all(e.launch is not None for e in raw)
    assert all(e.launch.args["correlation"] == e.args["correlation"] for e in raw)


def test_the_posts_findings_per_layer(traces):
    _, naive = attention_rows(traces["naive"])
    _, inplace = attention_rows(traces["naive-inplace"])
    _, math = attention_rows(traces["math"])
    for p in LAYERS:
        assert naive[p].memcpys == 1 and inplace[p].memcpys == 0  # out-of-place masked_fill copies
        assert naive[p].kernels == inplace[p].kernels
        assert math[p].kernels >= 20  # fp32 GEMMs, the causal mask rebuilt, a safe softmax
        assert any("ffma" in k for k in math[p].kernel_names)  # fp32 GEMMs on CUDA cores
        assert any("triu_tril" in k for k in math[p].kernel_names)
        assert any("isneginf" in k for k in math[p].kernel_names)
    for name, family in (("flash", "flash_fwd"), ("cudnn", "cudnn_generated"), ("auto", "cudnn_generated")):
        _, rows = attention_rows(traces[name])
        for p in LAYERS:
            assert rows[p].kernels == 1 and rows[p].memcpys == 0
            assert any(family in k for k in rows[p].kernel_names)
    _, eff = attention_rows(traces["efficient"])
    for p in LAYERS:  # the GQA inputs cost two copy kernels (k and v repeated) before the fused one
        assert eff[p].kernels == 3
        assert sum("fmha_cutlass" in k for k in eff[p].kernel_names) == 1


def test_launch_apis_by_correlation(traces):
    _, cudnn = attention_rows(traces["cudnn"])
    _, flash = attention_rows(traces["flash"])
    assert set(cudnn[LAYERS[0]].launch_apis) >= {"cuLaunchKernelEx"}
    assert set(flash[LAYERS[0]].launch_apis) == {"cudaLaunchKernel"}
    rows, _ = attention_rows(traces["naive"])
    nvjet = [e for e in traces["naive"].device_events if e.name.startswith("nvjet")]
    assert nvjet and all(e.launch.name == "cuLaunchKernelEx" for e in nvjet)  # cuBLAS's own GEMMs
    math_gemms = [e for e in traces["math"].device_events if "ffma" in e.name]
    assert math_gemms and all(e.launch.name == "cudaLaunchKernelExC" for e in math_gemms)


def test_attention_row_is_separate_from_its_module(traces):
    rows, att = attention_rows(traces["flash"])
    module = rows[(LAYERS[0], "module", None)]
    assert module.kernels > 0  # rotary embedding, cat, elementwise ops around the call
    assert not any("flash_fwd" in k for k in module.kernel_names)
    assert (OUTSIDE, "outside", None) not in rows or rows[(OUTSIDE, "outside", None)].kernels == 0


def test_profiler_occupancy_reads_zero_but_recomputed_does_not(traces):
    fused = [e for e in traces["cudnn"].device_events if e.name.startswith("cudnn_generated")]
    assert fused and all(e.args.get("est. achieved occupancy %") == 0 for e in fused)
    (k,) = kernel_summaries(fused, H100_LIMITS)
    assert k.occupancy_pct > 0 and k.occupancy_limiter in ("registers", "shared memory")
    assert k.shared_memory > 48 * 1024


def test_fold_repeated_layers():
    def row(path, kind, calls, kernels):
        return LayerStats(path, kind, calls, kernels, 0, 0, 0.0, 0.0, 0)

    rows = [row("model.layers.0.self_attn", "attention", 1, 1), row("model.layers.1.self_attn", "attention", 1, 1),
            row("model.layers.1.mlp", "module", 1, 3), row("lm_head", "module", 0, 1)]
    f = {(r.path, r.kind): r for r in fold(rows)}
    assert f[("model.layers.*.self_attn", "attention")].folded == 2
    assert f[("model.layers.*.self_attn", "attention")].kernels == 2
    assert f[("lm_head", "module")].folded == 1


def test_events_outside_any_module_are_kept():
    data = {"traceEvents": [
        {"ph": "X", "cat": "user_annotation", "name": "attnswitch.step:0", "pid": 1, "tid": 1, "ts": 0, "dur": 100},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 10, "dur": 5,
         "args": {"correlation": 7}},
        {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 20, "dur": 3,
         "args": {"correlation": 7}},
    ]}
    t = Trace.from_json(data)
    rows = attribute(t, {"0"})
    assert rows[(OUTSIDE, "outside", None)].kernels == 1


def test_the_host_time_outside_every_module_is_its_ops_own_time_not_0():
    # outside every module there is no range to time: it read 0 µs beside its ops (a generate's sampling between
    # forwards); the time of its top-level ops is what ran there (a nested op's is in its parent's)
    data = {"traceEvents": [
        {"ph": "X", "cat": "user_annotation", "name": "attnswitch.step:0", "pid": 1, "tid": 1, "ts": 0, "dur": 100},
        {"ph": "X", "cat": "cpu_op", "name": "aten::argmax", "pid": 1, "tid": 1, "ts": 10, "dur": 7},
        {"ph": "X", "cat": "cpu_op", "name": "aten::cat", "pid": 1, "tid": 1, "ts": 30, "dur": 5},
        {"ph": "X", "cat": "cpu_op", "name": "aten::empty", "pid": 1, "tid": 1, "ts": 31, "dur": 2},
    ]}
    row = attribute(Trace.from_json(data), {"0"})[(OUTSIDE, "outside", None)]
    assert row.ops == 2 and row.host_us == 12


# -- live CPU profiles ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def cpu_report():
    m = tiny("llama")
    return attnswitch.profile(m, batch_for(m, pad=False), backends=["naive", "naive-inplace", "math", "flash"],
                              warmup=1, iters=2, time_budget_s=0)


def test_cpu_profile_attributes_ops_to_layers(cpu_report):
    for b in cpu_report.backends:
        assert b.ok, b.reasons
        trace = Trace.load(b.trace_path)
        steps = {s.step for s in trace.steps()}
        rows = attribute(trace, steps)
        outermost = [e for e in trace.events if e.cat == "cpu_op" and not e.parent_is_op and e.step in steps]
        assert sum(r.ops for r in rows.values()) == len(outermost)
        assert b.ops == len(outermost) / len(steps)
        assert b.attn_calls == 2  # two layers
        assert {l.path for l in b.layers if l.kind == "attention"} == set(LAYERS)
    ops = {b.backend: set(b.attn_ops) for b in cpu_report.backends}
    assert "aten::masked_fill" in ops["naive"] and "aten::masked_fill" not in ops["naive-inplace"]
    assert "aten::masked_fill_" in ops["naive-inplace"]
    assert "aten::_scaled_dot_product_attention_math" in ops["math"]
    assert "aten::_scaled_dot_product_flash_attention_for_cpu" in ops["flash"]


def test_cpu_profile_host_times_are_consistent(cpu_report):
    import statistics
    for b in cpu_report.backends:
        assert b.time_ms > 0 and len(b.time_samples_ms) == 2
        assert b.time_ms == statistics.median(b.time_samples_ms)
        lo, hi = min(b.time_samples_ms), max(b.time_samples_ms)
        assert b.noise_pct == pytest.approx(100 * (hi - lo) / 2 / b.time_ms)
        assert b.cold_host_ms * 1e3 >= b.attn_cold_host_us  # the first attention call is inside the cold forward
        assert 0 < b.attn_host_us < b.host_ms * 1e3  # one attention call is less than a forward
        layer_hosts = [l.host_us for l in b.layers if l.kind == "attention"]
        assert all(h > 0 for h in layer_hosts)


def test_profile_a_bare_callable_as_in_the_post():
    q, k, v = (torch.randn(2, 4, 64, 16) for _ in range(3))
    rep = attnswitch.profile(lambda: attnswitch.attention(q, k, v, is_causal=True),
                             backends=["naive", "naive-inplace", "math", "flash", "cudnn"], warmup=1, iters=2)
    assert [b.status for b in rep.backends] == ["ok", "ok", "ok", "ok", "unavailable"]
    assert rep["naive"].layers[0].path in ("(bare call)",)
    assert "aten::masked_fill_" in rep["naive-inplace"].attn_ops
    assert any("CUDA" in r for r in rep["cudnn"].reasons)


def test_compare_a_bare_callable_ranks_it_and_says_its_numerics_were_not_checked():
    # compare takes what profile takes: a callable ran every timing round, then failed in the numerics pass
    q, k, v = (torch.randn(2, 4, 64, 16) for _ in range(3))
    rep = attnswitch.compare(lambda: attnswitch.attention(q, k, v, is_causal=True),  # (no batch, as profile)
                             backends=["naive", "flash"], warmup=1, iters=2, rounds=2, time_budget_s=0)
    assert rep.decision.pick in ("naive", "flash") and all(b.numerics is None for b in rep.backends)
    assert "Numerics not checked" in rep.to_markdown()
    fn = lambda: attnswitch.attention(q, k, v, is_causal=True)  # noqa: E731
    with pytest.raises(TypeError, match="a callable is profiled as it is, without a batch"):
        attnswitch.compare(fn, {"input_ids": torch.ones(1, 4, dtype=torch.long)}, backends=["naive"])
    with pytest.raises(ValueError, match="compiles a model's forward; a callable is profiled as it is"):
        attnswitch.compare(fn, backends=["naive"], compile="default,none")


def test_profile_bad_input():
    m = tiny("llama")
    with pytest.raises(ValueError, match="inputs"):
        attnswitch.profile(m)
    with pytest.raises(ValueError, match="inputs"):
        attnswitch.compare(m)
    with pytest.raises(ValueError, match="unknown attention backend"):
        attnswitch.profile(m, batch_for(m), backends=["fastest"])
    with pytest.raises(ValueError, match="iters"):
        attnswitch.profile(m, batch_for(m), iters=0)
    with pytest.raises(attnswitch.UnsupportedModel):
        f = tiny("bloom")
        attnswitch.profile(f, {"input_ids": torch.ones(1, 4, dtype=torch.long)})


def test_attention_host_time_against_an_independent_clock(cpu_clock):
    # the per-call host time attnswitch records must fit inside the same call timed from outside. Both on
    # this thread's CPU clock: the spans nest as on the wall clock, but another process running between two
    # readings adds nothing to either (on the wall clock a moment of other load outside the recorded span
    # can make any call look mostly outside it)
    from attnswitch import hf, instrument

    m = tiny("llama")
    mod = m.model.layers[0].self_attn
    q = torch.randn(2, 8, 16, 8)
    kv = torch.randn(2, 2, 16, 8)
    for name in ("naive", "math", "flash"):
        recorded, outside = [], []
        with attnswitch.backend(name, model=m), instrument.measuring(host_times=recorded):
            for _ in range(20):
                t0 = cpu_clock()
                hf.attention_forward(mod, q, kv, kv, None, dropout=0.0, scaling=0.125)
                outside.append(cpu_clock() - t0)
        assert len(recorded) == 20 and all(w == "model.layers.0.self_attn" for w, _, _ in recorded)
        assert all(kv_len == 16 for _, _, kv_len in recorded)
        ratios = sorted(inner / outer for (_, inner, _), outer in zip(recorded, outside))
        assert all(0 < x <= 1 for x in ratios)
        # the call itself is most of it: the median call
        assert ratios[len(ratios) // 2] >= 0.5, ratios


# -- a training step recorded on an H200: the backward where its forward ran -------------------------

@pytest.mark.parametrize("name", ["naive", "flash", "cudnn"])
def test_recorded_backward_device_events_belong_to_the_layers_whose_forward_made_them(name):
    t = Trace.load(DATA / f"train2l_{name}.json.gz")
    steps = {s.step for s in t.steps()}
    assert t.device_events and all(e.step in steps for e in t.device_events)  # the autograd thread's too
    rows = attribute(t, steps)
    raw = [e for e in t.device_events if e.step in steps]
    # every device event counted once: the rows add up to the raw event list
    assert sum(r.kernels + r.memcpys + r.memsets for r in rows.values()) == len(raw)
    assert sum(r.gpu_us for r in rows.values()) == pytest.approx(sum(e.dur for e in raw))
    backward = [e for e in raw if e.phase == "backward"]
    assert len(backward) > len(raw) / 3  # a backward costs about as many kernels as the forward, or more
    assert not any(k[1] == "outside" and k[2] == "backward" for k in rows)  # an optimizer-free step has none
    for i in (0, 1):
        attn = rows[(f"model.layers.{i}.self_attn", "attention", "backward")]
        assert attn.kernels > 0
        if name != "naive":  # the fused kernel's own backward lands in the attention call's backward row
            family = {"flash": "flash_bwd", "cudnn": "cudnn"}[name]
            assert any(family in k for k in attn.kernel_names), list(attn.kernel_names)
            forward = rows[(f"model.layers.{i}.self_attn", "attention", None)]
            assert not any("bwd" in k for k in forward.kernel_names)
        for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
            assert rows[(f"model.layers.{i}.self_attn.{proj}", "module", "backward")].kernels > 0


def test_holistic_trace_analysis_breaks_down_a_recorded_training_step(tmp_path):
    hta = pytest.importorskip("hta.trace_analysis", reason="HolisticTraceAnalysis is not installed")
    import shutil
    shutil.copy(DATA / "train2l_flash.json.gz", tmp_path)
    analysis = hta.TraceAnalysis(trace_dir=str(tmp_path))
    assert analysis.t.get_ranks() == [0]
    by_type, by_kernel = analysis.get_gpu_kernel_breakdown(visualize=False)
    assert by_type["sum"].sum() > 0 and len(by_kernel) > 0
    ours = Trace.load(DATA / "train2l_flash.json.gz")
    assert {n for n in by_kernel["name"] if n != "others"} <= {e.name for e in ours.device_events}
