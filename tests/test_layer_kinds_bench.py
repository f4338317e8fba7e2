"""The per-kind benchmark (``benchmarks/layer_kinds.py``) on a CPU: its summary of a report (the per-kind candidate
against the fastest single backend, never a policy of two), and its run on a tiny model, the Whisper check in
bfloat16 as on a GPU too (no verdict on the numbers: those are the GPU's)."""

import json

import pytest
import torch
from reports_fixed import fixed, report_of

import attnswitch
from attnswitch.stats import paired_margin
from benchmarks import layer_kinds

PER_KIND = "sliding_attention=flex/full_attention=flash"


def test_the_summary_puts_the_per_kind_candidate_against_the_best_single_backend():
    per_kind = fixed(PER_KIND, [8.0, 8.1, 7.9, 8.0, 8.2, 8.0],
                     attn_by_kind=(("sliding_attention", 150.0), ("full_attention", 90.0)))
    flash = fixed("flash", [10.0, 10.1, 9.9, 10.0, 10.2, 10.0],
                  attn_by_kind=(("sliding_attention", 1190.0), ("full_attention", 88.0)))
    r = report_of([flash, fixed("math", [20.0] * 6), per_kind])
    s = layer_kinds.summary(r)
    assert s["per_kind"] == PER_KIND and s["best_single"] == "flash" and s["pick"] == PER_KIND
    m = paired_margin(per_kind.time_rounds_ms, flash.time_rounds_ms, "flash")
    assert s["per_kind_vs_best_single"]["ratio"] == pytest.approx(m.ratio, abs=1e-4)
    assert s["per_kind_vs_best_single"]["decided"] and s["per_kind_vs_best_single"]["high"] < 1
    assert s["attn_us_by_kind"]["flash"] == {"sliding_attention": 1190.0, "full_attention": 88.0}


def test_the_best_single_backend_a_per_kind_candidate_is_set_against_is_never_a_policy_of_two_backends():
    # A generate compare (the gemma3-generate check) adds the policy of the fastest prefill and the fastest decode
    # backend (profiling.stepstats.policy_candidate: "prefill=cudnn/decode=flash"), which can rank at the top.
    # summary()'s "best single" is the fastest single backend, never that policy, which runs two: here flash, and
    # the per-kind candidate is decidedly faster (0.80x) than it. A wrong answer would set the candidate against
    # the policy and call it 1.14x [1.14-1.17] *slower*: the check's answer inverted.
    per_kind = "sliding_attention=flex/full_attention=flash"
    results = [fixed("flash", [10.0, 10.1, 9.9, 10.0, 10.2, 10.0]),
               fixed("cudnn", [10.5, 10.6, 10.4, 10.5, 10.7, 10.5]),
               fixed(per_kind, [8.0, 8.1, 7.9, 8.0, 8.2, 8.0]),
               fixed("prefill=cudnn/decode=flash", [7.0, 7.05, 6.95, 7.0, 7.02, 6.98])]
    s = layer_kinds.summary(report_of(results, workload={"mode": "generate"}))
    assert s["per_kind"] == per_kind
    assert s["best_single"] == "flash", s["best_single"]
    assert s["per_kind_vs_best_single"]["ratio"] < 1, s["per_kind_vs_best_single"]["text"]


def test_the_smoke_run_writes_each_checks_report_and_the_summary(tmp_path):
    assert layer_kinds.run(tmp_path, smoke=True, only="gemma3-prefill") == 0
    done = json.loads((tmp_path / "layer_kinds.json").read_text())
    got = done["checks"]["gemma3-prefill"]
    assert got["status"] == "ok" and set(done["checks"]) == {"gemma3-prefill"}
    assert got["backends"] == layer_kinds.CPU_BACKENDS  # what this check compared (a check may leave some out)
    report = json.loads((tmp_path / "gemma3-prefill" / "report.json").read_text())
    assert report["decision"]["pick"] == got["pick"]
    # every backend that ran has its attention time for both kinds of the model
    assert all(set(v) == {"sliding_attention", "full_attention"} for v in got["attn_us_by_kind"].values())
    assert done["environment"]["torch"]


def test_the_whisper_kinds_check_runs_in_bfloat16_against_its_float32_numerics_reference():
    # Off --smoke (a GPU), run() builds the model in bfloat16 and _inputs casts input_features to it; compare then
    # checks numerics (layer_kinds leaves them on) against a float32 copy of the model, fed the same bf16
    # features. The smoke run builds everything in float32, so this runs that path here (CPU, tiny, bf16 as on
    # the GPU): math runs. A wrong answer would be the whole "whisper" check "failed", from
    #   RuntimeError: Input type (c10::BFloat16) and bias type (float) should be the same
    # raised in numerics.reference_output, the features not cast for the float32 reference.
    check = next(c for c in layer_kinds.CHECKS if c.model == "whisper")
    model = layer_kinds._model("whisper", True).to("cpu", torch.bfloat16).eval()
    inputs = layer_kinds._inputs(check, model, True, "cpu", torch.bfloat16)
    assert inputs["input_features"].dtype == torch.bfloat16
    report = attnswitch.compare(model, inputs, backends=["math"], model_name="whisper-shaped (whisper)",
                                warmup=0, iters=2, rounds=2)
    assert report.backends[0].ok


def test_the_call_trace_names_each_backends_attention_op_and_where_its_mask_is_converted(tmp_path):
    from benchmarks import call_trace

    assert call_trace.main([str(tmp_path), "--tiny", "--backends=flash,math,auto"]) == 0
    rows = {r["backend"]: r for r in json.loads((tmp_path / "call_trace.json").read_text())["rows"]}
    assert "aten::_scaled_dot_product_flash_attention_for_cpu" in rows["flash"]["top_ops_per_call"]
    assert "aten::_scaled_dot_product_attention_math" in rows["math"]["top_ops_per_call"]
    assert rows["auto"]["top_ops_per_call"]["aten::scaled_dot_product_attention"] == 1.0  # one per layer's call
    # the sliding layer's boolean mask becomes a float one for a forced backend (one layer of the two)
    assert rows["flash"]["top_ops_per_call"].get("aten::where") == 0.5
    assert "aten::where" not in rows["auto"]["top_ops_per_call"]


@pytest.mark.parametrize("argv", [["--tiny"], ["o", "--mode=train"], ["o", "--seq=x"], ["o", "--seq=0"],
                                  ["o", "--what=1"]])
def test_the_call_trace_refuses_what_it_cannot_run_with_usage(argv, capsys):
    from benchmarks import call_trace

    assert call_trace.main(argv) == 2 and "call_trace" in capsys.readouterr().err
