"""`compare`/`profile` with compile=: compiled candidates beside uncompiled ones, what they cost once, what
their graphs ran (CPU; real H200 traces for the kernel names)."""

import csv
import dataclasses
import io
from pathlib import Path

import pytest
import torch

import attnswitch
from attnswitch.candidate import Candidate, Policy, parse
from attnswitch.cli import main
from attnswitch.compiling import parse_compile
from attnswitch.decision import recommend
from attnswitch.models import load_model
from attnswitch.profiling.compiled import attention_seen, merged_modes, mismatch, paid_back
from attnswitch.profiling.trace import Trace
from attnswitch.ranking import verdict
from attnswitch.results import BackendResult, Report
from attnswitch.workload import make_workload

DATA = Path(__file__).parent / "data"


def test_compile_modes_parse_and_name_candidates_both_ways():
    assert parse_compile(None) == (None,) and parse_compile("none") == (None,)
    assert parse_compile("default,none") == ("default", None)
    assert parse_compile(["reduce-overhead", "max-autotune", "reduce-overhead"]) == ("reduce-overhead", "max-autotune")
    for mode in (None, "default", "reduce-overhead", "max-autotune"):
        for backend in ("flash", "naive-inplace", Policy("cudnn", "flash")):
            c = Candidate(backend, mode)
            assert parse(str(c)) == c and parse(str(c)).uncompiled == Candidate(backend)
    assert str(Candidate("flash", "default")) == "flash+compile" and str(Candidate("cudnn", "reduce-overhead")) == \
        "cudnn+compile:reduce-overhead"
    assert str(Candidate(Policy("cudnn", "flash"), "default")) == "prefill=cudnn/decode=flash+compile"
    for bad in ("flash+compile:bogus", "flash+compile:none", "flash+compiled", "+compile"):
        with pytest.raises(ValueError, match="a compiled candidate is written|an empty backend name"):
            parse(bad)
    with pytest.raises(ValueError, match="use one of none, default, reduce-overhead, max-autotune"):
        parse_compile("default,fast")


def test_bad_compile_values_are_one_line_and_exit_2(capsys):
    for bad in ("fast", "default,", "reduce_overhead", ""):
        assert main(["compare", "tiny-llama", "--device", "cpu", "--compile", bad]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("error: --compile") and len(err.splitlines()) == 1, err
        assert bad != "default," or err == (  # (what was typed, not '')
            "error: --compile 'default,': an empty mode between commas; use one of none, default, reduce-overhead, "
            "max-autotune, or several joined by commas (default,none)")
        assert bad != "" or "between commas" not in err  # (no commas there)


@pytest.mark.parametrize("backend, family", [("cudnn", "cudnn"), ("efficient", "efficient"), ("flash", "flash"),
                                             ("math", "math"), ("auto", "cudnn")])
def test_the_attention_kernel_a_trace_ran_is_read_off_its_kernel_names(backend, family):
    # real H200 traces: cuDNN's kernel, CUTLASS's fmha (efficient), FlashAttention's, math's own op; auto ran cuDNN
    seen, names = attention_seen(Trace.load(DATA / f"llama2l_{backend}.json.gz"))
    assert seen == family, names
    assert mismatch(backend, seen) is None
    assert mismatch("efficient", "cudnn") and mismatch("naive", "flash") and mismatch("flash", None)
    policy = "prefill=cudnn/decode=flash"
    assert mismatch(policy, "flash") is None and mismatch(policy, "efficient")


def _result(name, time_ms, mode=None, **kw):
    return BackendResult(name, "ok", time_ms=time_ms, noise_pct=0.5, compile=mode, time_rounds_ms=((time_ms,),) * 6,
                         **kw)


def test_auto_compiled_that_kept_its_compiles_kernel_is_flagged_against_auto_uncompiled():
    # the case of a graph compiled under sdpa_kernel([EFFICIENT_ATTENTION]) that runs efficient afterwards
    runs = {None: [_result("auto", 10.0, attn_ops=("aten::_scaled_dot_product_cudnn_attention",))],
            "default": [_result("auto", 9.0, "default", compile_ms=2000.0, attn_seen="efficient")]}
    merged = merged_modes(runs)  # named apart, then timed together; what the compile pays for is read after
    auto_c = next(b for b in merged if b.compile == "default")
    assert auto_c.backend == "auto+compile" and "ran efficient's kernel, uncompiled cudnn's" in auto_c.attn_mismatch
    auto_c = next(b for b in paid_back(merged) if b.compile == "default")
    assert auto_c.compile_pays_after == pytest.approx(2000.0)  # 2 s of compile over 1 ms saved per step


def test_the_recommendation_says_whether_compiling_changes_the_pick_and_when_it_pays():
    results = [_result("cudnn", 10.0), _result("flash", 10.6),
               _result("flash+compile", 8.0, "default", compile_ms=5000.0, compile_pays_after=5000.0 / 2.6,
                       recompiles=0),
               _result("cudnn+compile", 9.0, "default", compile_ms=4000.0, compile_pays_after=4000.0)]
    v = verdict(results)
    assert v.order == ("flash+compile", "cudnn+compile", "cudnn", "flash")
    text = recommend(results, v, {"mode": "prefill"})
    assert "Compiling changes the pick: uncompiled `cudnn` (10.000 ms), compiled `flash+compile` (8.000 ms)" in text
    assert "`flash+compile`'s compile took 5.0 s, which has paid for itself after 1923 forwards." in text
    same = recommend(results[:1] + results[3:], verdict(results[:1] + results[3:]), {"mode": "prefill"})
    assert "Compiling does not change the backend: `cudnn` leads compiled and uncompiled, and compiled " \
        "(`cudnn+compile`) is the faster." in same  # (the pick is compiled: compiling is not for nothing)
    again = [dataclasses.replace(results[3], recompiles=1)]
    once = recommend(results[:1] + again, verdict(results[:1] + again), {"mode": "prefill"})
    assert "it recompiled 1 time while measured (new shapes)." in once


def test_whether_compiling_changes_the_pick_compares_each_sides_own_pick_ties_going_to_the_preferred():
    # uncompiled naive and flash not told apart (naive a hair ahead by median): the uncompiled pick is flash, the
    # fused kernel, as a comparison of them alone picks; the line used to take the first uncompiled by median and
    # say "Compiling changes the pick: uncompiled `naive`"
    def noisy(name, time_ms, mode=None, **kw):
        rounds = tuple((time_ms * f,) for f in (0.9, 1.1, 0.95, 1.05, 0.92, 1.08))
        return dataclasses.replace(_result(name, time_ms, mode, **kw), time_rounds_ms=rounds, noise_pct=10.0)
    plain = [noisy("naive", 2.4997), noisy("flash", 2.4999)]
    results = [*plain, _result("flash+compile", 1.0, "default", compile_ms=5000.0, compile_pays_after=3333.0)]
    assert verdict(plain).pick == "flash" and verdict(plain).order[0] == "flash"
    assert verdict(results).order.index("naive") < verdict(results).order.index("flash")  # (naive ahead by median)
    text = recommend(results, verdict(results), {"mode": "prefill"})
    assert "Compiling does not change the backend: `flash` leads compiled and uncompiled" in text, text
    assert "Compiling changes the pick" not in text


@pytest.fixture(scope="module")
def compiled_report():
    torch._dynamo.reset()
    m, _ = load_model("tiny-llama", layers=2)
    w = make_workload(m, batch=2, seq=32, padding=True)
    _dynamo_clock().clear()
    with torch._inductor.config.patch(compile_threads=1):
        r = attnswitch.compare(m, w, backends=["flash"], compile="default,none", warmup=1, iters=2, rounds=1)
    yield r, [t * 1e3 for t in _dynamo_clock().get("_compile.compile_inner", ())]
    torch._dynamo.reset()


def _dynamo_clock() -> dict:
    """Dynamo's own account of its compiles (seconds per compile, by phase): a clock apart from ours."""
    from torch._dynamo.utils import compilation_time_metrics
    return compilation_time_metrics


@pytest.mark.slow
def test_compare_puts_compiled_and_uncompiled_candidates_side_by_side(compiled_report, tmp_path):
    r, dynamo_ms = compiled_report
    assert [b.backend for b in r.backends] == ["flash", "flash+compile"]
    assert set(r.ranking) == {b.backend for b in r.backends} and r.settings["compile"] == ["default", "none"]
    for name in ("flash",):
        c, u = r[f"{name}+compile"], r[name]
        assert c.ok and c.compile == "default" and u.compile is None
        assert c.graphs >= 1 and c.recompiles == 0  # one shape: compiled once, never again
        assert c.compile_ms > 0 and c.attn_seen == name and c.attn_mismatch is None
        assert c.numerics.ok and u.numerics.ok  # the compiled forward's own output, checked against fp32 eager
    # the one-off compile cost (the cold step over a steady one) against Dynamo's own clock of that compile,
    # which runs inside the cold step: the compile is most of the cold step, the rest a fraction of it
    assert len(dynamo_ms) == 1, dynamo_ms  # one shape: one compile, in the cold step
    assert dynamo_ms[0] - r["flash+compile"].host_ms <= r["flash+compile"].compile_ms <= 1.5 * dynamo_ms[0]
    assert "Compiling" in r.recommendation
    back = Report.from_json(r.to_json())
    assert back["flash+compile"].attn_seen == "flash" and back["flash+compile"].graphs == r["flash+compile"].graphs
    # the payback in the ranked time's unit: forwards here, whole workloads for a generate
    from attnswitch.render.sections import _compiled
    table = _compiled(r, None).blocks[0]
    assert table.title == "Compiled" and any(h.startswith("pays after") for h in table.headers) <= (
        "pays after forwards" in table.headers)  # (a column left out where no payback was figured)
    generate = dataclasses.replace(r, workload={**r.workload, "mode": "generate"})
    assert "Pays after: generate workloads" in _compiled(generate, None).blocks[1].text
    assert "Compiled" in r.to_markdown() and "attention kernel seen" in r.to_markdown()
    assert {p.name for p in r.save_traces(tmp_path)} >= {"trace_flash.json.gz", "trace_flash+compile.json.gz"}
    # a compiled forward's calls are not counted or timed one by one: empty, never a measured-looking 0
    assert r["flash+compile"].host_attn_ms is None and r["flash+compile"].attn_calls is None
    assert r["flash"].host_attn_ms > 0 and r["flash"].attn_calls > 0
    rows = {row["backend"]: row for row in csv.DictReader(io.StringIO(r.to_csv()))}
    assert rows["flash+compile"]["host_attn_ms"] == "" and float(rows["flash"]["host_attn_ms"]) > 0
    from attnswitch.render.charts import time_by_kind_chart
    chart = time_by_kind_chart(r.backends)
    assert chart is None or "flash+compile" not in chart.categories
