"""The serving estimate and a sweep's one choice say what their own figures support: the pick is the cheapest
of the figures printed, a candidate that failed somewhere is not deployed over one that ran everywhere, what
the estimate leaves out is named, and a compiled candidate's new-length cost is its own. Hand-made sweep
points: every figure here is exact."""

import dataclasses

import pytest

from attnswitch.comparison import sweep_choice
from attnswitch.lengths import Lengths
from attnswitch.ranking import Verdict
from attnswitch.recommend import _cold_peer, recommend
from attnswitch.results import BackendResult, GenerateStats, SweepPoint
from attnswitch.serving import serving_estimate
from attnswitch.stats import Margin

FLASH_OP = ("aten::_scaled_dot_product_flash_attention_for_cpu",)


def _row(name, ms, new=10.0, seen=10.0, ops=(), status="ok", compile=None):
    """One prompt per request: ``ms`` is the steady time per request."""
    return BackendResult(name, status, time_ms=ms, time_rounds_ms=((ms,),) if ms else (), noise_pct=1.0,
                         attn_ops=ops, compile=compile,
                         generate=GenerateStats(new_shape_step_ms=new, seen_shape_step_ms=seen))


def _point(seq, rows, ties=None, new_tokens=4, batch=4):
    ranking = tuple(b.backend for b in sorted((b for b in rows if b.time_ms), key=lambda b: b.time_ms))
    return SweepPoint(batch, seq, tuple(rows), ranking, ranking[:1] if ties is None else ties, new_tokens=new_tokens)


@pytest.mark.parametrize("requests", [1, 10, 1000, 100_000])
def test_the_pick_is_the_cheapest_per_request_figure_the_estimate_prints(requests):
    # A and B tied at both lengths, their medians 10 and 12 ms; A pays 1 ms more per shape met first
    pts = [_point(n, [_row("A", 10.0, new=3.0, seen=2.0), _row("B", 12.0, new=2.0, seen=2.0)], ties=("A", "B"))
           for n in (16, 32)]
    s = serving_estimate(pts, Lengths.of({16: 1, 32: 1}), requests, 4)
    assert s.pick == min(s.per_request_ms, key=s.per_request_ms.get)
    assert s.steady_ms == {"A": 10.0, "B": 12.0}  # each one's own median kept beside the held figure
    text = " ".join(s.text())
    assert f"{s.per_request_ms[s.pick]:.3f} ms per request" in text
    assert "held to one steady cost, 10.000 ms" in text and "10.000-12.000" in text


def test_a_sweep_does_not_deploy_a_candidate_that_failed_at_a_measured_length():
    # flash ties with math where it ran, on fewer lengths (its summed time is smaller), and failed at 64
    pts = [_point(16, [_row("flash", 10.1), _row("math", 10.0)], ties=("math", "flash"), new_tokens=None),
           _point(32, [_row("flash", 20.1), _row("math", 20.0)], ties=("math", "flash"), new_tokens=None),
           _point(64, [_row("flash", None, status="failed"), _row("math", 40.0), _row("efficient", 30.0)],
                  new_tokens=None)]
    assert sweep_choice(pts) == "math"


def test_the_estimate_names_the_candidates_it_leaves_out():
    # the policy was measured at two lengths of three (added only where the phases' best differ)
    pol = "prefill=math/decode=flash"
    pts = [_point(16, [_row("flash", 12.0), _row("math", 13.0), _row(pol, 8.0)]),
           _point(32, [_row("flash", 12.0), _row("math", 13.0), _row(pol, 8.0)]),
           _point(64, [_row("flash", 12.0), _row("math", 13.0)])]
    s = serving_estimate(pts, Lengths.of({16: 100, 32: 100, 64: 1}), 1000, 4)
    assert s.pick == "flash" and s.left_out == (pol,)
    assert f"Not in this estimate (not measured at every length): `{pol}`." in s.text()


def test_a_compiled_candidates_new_length_cost_is_never_borrowed_nor_lent():
    auto = _row("auto", 10.0, new=10.2, ops=FLASH_OP)
    twin = _row("flash+compile", 10.5, new=400.0, compile="default")  # recompiles per new length
    flash = _row("flash", 11.0, new=10.3)
    assert _cold_peer(auto, [twin, flash]) is flash
    lines = recommend([auto, twin, flash], Verdict(order=("auto", "flash+compile", "flash"), ties=("auto",),
                                                   margins={}),
                      {"mode": "generate", "prompt_lens": [16], "new_tokens": 4})
    assert not any("new key length costs" in line for line in lines)  # flash paid 0.3 ms: within the noise
    compiled_auto = dataclasses.replace(_row("auto+compile", 10.0, new=60.0, ops=FLASH_OP), compile="default")
    assert _cold_peer(compiled_auto, [flash]) is None  # its recompiles are its own


@pytest.mark.parametrize("low, high, want", [(1.003, 2.09, "1.33x [1.003–2.09]"), (1.05, 1.13, "1.33x [1.05–1.13]"),
                                             (0.99, 1.02, "1.33x [0.99–1.02]"), (0.5, 0.9996, "1.33x [0.50–0.9996]")])
def test_a_decided_margin_never_prints_a_bound_of_one(low, high, want):
    assert Margin("best", 1.33, low, high, 0.96, 20).text() == want


@pytest.mark.parametrize("cache, mode", [("dynamic", "default"), ("static", "reduce-overhead")])
def test_a_compiled_picks_deploy_snippet_runs_switched_and_compiled_as_measured(cpu_report, tmp_path, cache, mode):
    from conftest import tiny

    import attnswitch
    from attnswitch.compiling import label
    from attnswitch.deploy import deploy_info, load_policy, write_policy

    report = dataclasses.replace(cpu_report, workload={**cpu_report.workload, "mode": "generate", "cache": cache})
    pick = label("flash", mode)
    report = dataclasses.replace(report, deploy=deploy_info(report, pick=pick))
    d = report.deploy
    assert d["selection"] == "flash" and d["compile"] == mode
    model = tiny("llama")
    try:
        exec(d["attnswitch"], {"model": model})  # the report's own text, as a user copies it
        assert attnswitch.is_patched(model) == "flash"
        if cache == "static":  # transformers compiles the static cache's decode steps with this config
            assert model.generation_config.compile_config.mode == mode
        else:
            assert "forward" in vars(model) and hasattr(model.forward, "_torchdynamo_orig_callable")
    finally:
        attnswitch.unpatch(model)
    policy = load_policy(write_policy(report, tmp_path / "policy.json"))
    assert (policy.selection, policy.compile) == ("flash", mode)


@pytest.mark.parametrize("mode", ["fast", 3, "none"])
def test_a_policy_files_compile_mode_is_checked(tmp_path, mode):
    import json

    from attnswitch.deploy import load_policy

    p = tmp_path / "policy.json"
    p.write_text(json.dumps({"schema": 1, "selection": "flash", "compile": mode}))
    with pytest.raises(ValueError, match=r"policy.json: 'compile' must be one of default, reduce-overhead"):
        load_policy(p)


def test_the_estimate_says_which_batch_it_is_for_and_deploy_names_every_batch_measured(cpu_report):
    from attnswitch.deploy import deploy_info

    pts = [_point(n, [_row("flash", 10.0 * b), _row("math", 13.0 * b)], batch=b) for b in (1, 3) for n in (16, 32)]
    s = serving_estimate(pts[:2], Lengths.of({16: 1, 32: 1}), 10, 4)
    assert s.text()[0].startswith("For 10 requests of this length mix (batch 1, 4 new tokens): `flash`")
    report = dataclasses.replace(cpu_report, sweep=tuple(pts))
    assert "for batch sizes other than 1, 3" in deploy_info(report, pick="flash")["remeasure"]
