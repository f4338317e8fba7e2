"""The serving estimate and a sweep's one choice say what their own figures support: the pick is the cheapest
of the figures printed, a candidate that failed somewhere is not deployed over one that ran everywhere, what
the estimate leaves out is named, and a compiled candidate's new-length cost is its own. Hand-made sweep
points: every figure here is exact."""

import dataclasses

import pytest

from attnswitch.comparison import sweep_choice
from attnswitch.decision import recommend
from attnswitch.lengths import Lengths
from attnswitch.ranking import Verdict
from attnswitch.recommend import _cold_peer
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
    refused = _row("cudnn", None, status="unavailable")  # refused at every length: never in the running
    pts = [_point(16, [_row("flash", 12.0), _row("math", 13.0), _row(pol, 8.0), refused]),
           _point(32, [_row("flash", 12.0), _row("math", 13.0), _row(pol, 8.0), refused]),
           _point(64, [_row("flash", 12.0), _row("math", 13.0), refused])]
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


@pytest.mark.parametrize("requests", [1, 10, 300, 1000])
def test_a_policy_pays_each_phases_plans_on_that_phases_shapes_met_first(requests):
    # cuDNN's plans cost 50 ms per new shape; flash's nothing. Deployed, `prefill=cudnn/decode=flash` pays
    # cuDNN's plans on prompt lengths met first only, `prefill=flash/decode=cudnn` on decode steps' only.
    rows = [_row("cudnn", 10.0, new=60.0), _row("flash", 11.0),
            _row("prefill=cudnn/decode=flash", 10.5), _row("prefill=flash/decode=cudnn", 10.5)]
    lengths = Lengths.of({16: 1, 32: 1})
    s = serving_estimate([_point(n, rows) for n in (16, 32)], lengths, requests, 4)
    prompts, steps = lengths.first_met_phases(requests, 4)
    assert s.first_met == pytest.approx(prompts + steps) and steps > prompts > 0
    assert s.per_request_ms["prefill=cudnn/decode=flash"] == pytest.approx(10.5 + 50.0 * prompts / requests)
    assert s.per_request_ms["prefill=flash/decode=cudnn"] == pytest.approx(10.5 + 50.0 * steps / requests)
    assert s.per_request_ms["cudnn"] == pytest.approx(10.0 + 50.0 * (prompts + steps) / requests)
    assert s.first_met_phase_ms == {"prefill=cudnn/decode=flash": (50.0, 0.0),
                                    "prefill=flash/decode=cudnn": (0.0, 50.0)}
    assert s.pick == min(s.per_request_ms, key=s.per_request_ms.get)
    if requests == 300:  # flash for a few requests, cudnn for many, the policy between
        assert s.pick == "prefill=cudnn/decode=flash"
        said = "`prefill=cudnn/decode=flash` pays 50.000 ms for each prompt length it meets first (2.0 in this run)."
        assert said in s.text()
        assert s.per_request_ms[s.pick] == pytest.approx(10.5 + (50.0 * 2.0 + 0.0 * 6.0) / 300)


def _all_picks_agree(s, pts, lengths, new_tokens):
    """The changes the estimate states are where its own pick changes, run length by run length."""
    def pick(n):
        return serving_estimate(pts, lengths, n, new_tokens).pick
    for n, a, b in s.changes:
        assert pick(n - 1) == a and pick(n) == b


def test_a_pick_that_wins_only_between_two_grid_points_is_stated():
    # the policy is cheapest from 286 to 461 requests only: between the grid's 200 and 500 before
    rows = [_row("cudnn", 10.0, new=60.0), _row("flash", 11.0), _row("prefill=cudnn/decode=flash", 10.65)]
    pts, lengths = [_point(n, rows) for n in (16, 32)], Lengths.of({16: 1, 32: 1})
    s = serving_estimate(pts, lengths, 300, 4)
    assert s.pick == "prefill=cudnn/decode=flash"
    assert [(a, b) for _, a, b in s.changes] == [("flash", s.pick), (s.pick, "cudnn")]
    _all_picks_agree(s, pts, lengths, 4)


@pytest.mark.parametrize("policy, ops, new, want", [
    # auto's decode ran flash: the cuDNN op is its prefill's
    ("prefill=cudnn/decode=auto", ("aten::_scaled_dot_product_cudnn_attention", *FLASH_OP), 10.0, (50.0, 0.0)),
    # every prompt (16 and 32 tokens) is at most decode_max_query: all run the decode phase, none cuDNN
    ("prefill=cudnn/decode=flash/decode_max_query=64", (), 10.0, (50.0, 0.0)),
    # both phases one family: the 30 ms the policy paid on its decode steps it pays on its prompts too
    ("prefill=flash/decode=flash", (), 40.0, (30.0, 30.0)),
])
def test_a_policys_phases_are_each_charged_what_they_run(policy, ops, new, want):
    rows = [_row("cudnn", 10.0, new=60.0), _row("flash", 11.0), _row(policy, 10.5, new=new, ops=ops)]
    s = serving_estimate([_point(n, rows) for n in (16, 32)], Lengths.of({16: 1, 32: 1}), 10, 4)
    assert s.first_met_phase_ms.get(policy, (s.first_met_ms[policy],) * 2) == want
    if "decode_max_query" in policy:  # no prompt runs cuDNN: nothing paid on cuDNN's plans
        assert s.phase_shapes[policy][0] == 0.0 and s.per_request_ms[policy] == pytest.approx(10.5)


def test_a_compiled_candidates_prompts_pay_its_kernels_plans():
    # cudnn+compile's prompts run eager cuDNN (a generate compiles the decode steps only)
    rows = [_row("cudnn", 11.0, new=60.0), _row("cudnn+compile", 10.0, compile="default")]
    s = serving_estimate([_point(n, rows) for n in (16, 32)], Lengths.of({16: 1, 32: 1}), 10, 4)
    assert s.first_met_phase_ms["cudnn+compile"] == (50.0, 0.0)
    assert s.per_request_ms["cudnn+compile"] == pytest.approx(10.0 + 50.0 * s.phase_shapes["cudnn+compile"][0] / 10)


def test_a_policy_whose_prefill_was_not_measured_alone_says_so():
    rows = [_row("flash", 11.0), _row("prefill=cudnn/decode=flash", 10.0)]
    s = serving_estimate([_point(n, rows) for n in (16, 32)], Lengths.of({16: 1, 32: 1}), 10, 4)
    assert s.pick == "prefill=cudnn/decode=flash" and s.unpriced == {s.pick: "cudnn"}
    assert ("`prefill=cudnn/decode=flash`'s prompts run `cudnn`, which was not measured alone: what it pays on "
            "prompt lengths met first is not in this estimate.") in s.text()


@pytest.mark.parametrize("alone", ["failed", "unavailable", None])
def test_prompts_run_by_a_backend_not_measured_alone_are_said_unpriced(alone):
    # cuDNN alone failed, was refused, or was not a candidate: what its plans cost is not known
    rows = [_row("flash", 11.0), _row("prefill=cudnn/decode=flash", 10.0), _row("cudnn+compile", 10.5,
                                                                               compile="default")]
    if alone:
        rows.append(_row("cudnn", None, status=alone))
    s = serving_estimate([_point(n, rows) for n in (16, 32)], Lengths.of({16: 1, 32: 1}), 10, 4)
    assert s.unpriced == {"prefill=cudnn/decode=flash": "cudnn", "cudnn+compile": "cudnn"}


def test_a_prefill_phase_that_is_no_sdpa_kernel_pays_what_it_paid_alone():
    # a kernel that compiles per new shape (as flex does) costs 500 ms a shape alone; so on a policy's prompts
    rows = [_row("flash", 11.0), _row("flex", 10.0, new=510.0), _row("prefill=flex/decode=flash", 10.5)]
    s = serving_estimate([_point(n, rows) for n in (16, 32)], Lengths.of({16: 1, 32: 1}), 10, 4)
    assert s.first_met_phase_ms["prefill=flex/decode=flash"] == (500.0, 0.0) and not s.unpriced


def test_requests_beyond_the_bound_and_timings_that_are_not_finite_are_refused_or_left_out():
    rows = [_row("flash", 11.0), _row("math", float("nan"))]
    pts = [_point(n, rows) for n in (16, 32)]
    s = serving_estimate(pts, Lengths.of({16: 1}), 10, 4)
    assert s.pick == "flash" and s.left_out == ("math",)
    for bad in (10**309, 0, 5.5, True):
        with pytest.raises(ValueError, match="requests must be a whole number from 1 to 1000000000000, got"):
            serving_estimate(pts, Lengths.of({16: 1}), bad, 4)
    inf_cost = dataclasses.replace(_row("cudnn", 9.0, new=float("inf")))  # a broken first-met figure
    s = serving_estimate([_point(n, [_row("flash", 11.0), inf_cost]) for n in (16, 32)], Lengths.of({16: 1}), 10, 1)
    assert s.pick == "flash" and s.left_out == ("cudnn",)


def test_a_mix_of_thousands_of_lengths_is_estimated_at_once():
    rows = [_row("cudnn", 10.0, new=60.0), _row("flash", 11.0), _row("prefill=cudnn/decode=flash", 10.6)]
    lengths = Lengths.of({n: 1 + n % 7 for n in range(16, 4016)})
    pts = [_point(n, rows) for n in (16, 4015)]
    s = serving_estimate(pts, lengths, 1000, 256)
    prompts, steps = lengths.first_met_phases(1000, 256)
    assert s.first_met == pytest.approx(prompts + steps)
    assert s.per_request_ms["cudnn"] == pytest.approx(10.0 + 50.0 * (prompts + steps) / 1000)


def test_singular_and_plural_are_said_right():
    s = serving_estimate([_point(n, [_row("flash", 11.0)]) for n in (16, 32)], Lengths.of({16: 1}), 1, 1)
    assert s.text()[0].startswith("For 1 request of this length mix (each one generate of a batch of 4, 1 new token): "
                                  "`flash`")
    assert "(1 shape met first)" in s.text()[0]


def test_one_request_is_said_in_the_singular():
    s = serving_estimate([_point(n, [_row("flash", 11.0)]) for n in (16, 32)], Lengths.of({16: 1}), 1, 4)
    assert s.text()[0].startswith("For 1 request of this length mix")


@pytest.mark.parametrize("ratio, low, high, want", [
    (1.33, 1.003, 2.09, "1.330x [1.003–2.090]"), (1.33, 1.05, 1.13, "1.33x [1.05–1.13]"),
    (1.0, 0.99, 1.02, "1.00x [0.99–1.02]"), (0.7, 0.5, 0.9996, "0.7000x [0.5000–0.9996]"),
    (1.004, 1.003, 1.0049, "1.004x [1.003–1.005]"), (0.996, 0.9951, 0.997, "0.996x [0.995–0.997]")])
def test_a_decided_margin_never_prints_a_bound_of_one(ratio, low, high, want):
    # both bounds (and the ratio) to the digits that show the decided one apart from 1, so they stay in order
    assert Margin("best", ratio, low, high, 0.96, 20).text() == want


@pytest.mark.parametrize("workload, mode", [("prefill", "default"), ("generate", "reduce-overhead")])
def test_a_compiled_picks_deploy_snippet_switches_then_compiles_what_was_measured(cpu_report, tmp_path, monkeypatch,
                                                                                   workload, mode):
    # a generate's candidate is measured with its decode steps compiled and its prefill eager; the snippet
    # compiles the same (torch.compile stood in for: inductor would take minutes on a CPU)
    import torch
    from conftest import tiny

    import attnswitch
    from attnswitch.candidate import Candidate
    from attnswitch.deploy import deploy_info, load_policy, write_policy

    compiled_calls, modes = [], []

    def fake_compile(fn, mode=None, **kw):
        modes.append(mode)

        def run(*a, **k):
            compiled_calls.append(k["input_ids"].shape[1])
            return fn(*a, **k)
        return run
    monkeypatch.setattr(torch, "compile", fake_compile)
    report = dataclasses.replace(cpu_report, workload={**cpu_report.workload, "mode": workload})
    pick = str(Candidate("flash", mode))
    report = dataclasses.replace(report, decision=dataclasses.replace(
        report.decision, pick=pick, deploy=deploy_info(pick, report.environment, report.workload)))
    d = report.deploy
    assert d.selection == "flash" and d.compile == mode
    model = tiny("llama")
    try:
        exec(d.attnswitch, {"model": model})  # the report's own text, as a user copies it
        assert attnswitch.is_patched(model) == "flash" and modes == [None if mode == "default" else mode]
        with torch.no_grad():
            model(input_ids=torch.randint(0, 100, (2, 8)))
            model(input_ids=torch.randint(0, 100, (2, 1)))
    finally:
        attnswitch.unpatch(model)
    assert compiled_calls == ([1] if workload == "generate" else [8, 1])
    policy = load_policy(write_policy(report, tmp_path / "policy.json"))
    assert (policy.selection, policy.compile) == ("flash", mode)


_COMPILED_SNIPPET = """
import torch, attnswitch
from torch._dynamo.utils import counters
from conftest import tiny
from attnswitch.deploy import deploy_info
from attnswitch.hf import owners

real = torch.compile
torch.compile = lambda fn, mode=None, **kw: real(fn, backend="eager")  # Dynamo itself; inductor takes minutes
model = tiny("llama")
ids = torch.randint(0, 100, (2, 8))
with torch.no_grad():
    want = model(input_ids=ids).logits
d = deploy_info("flash+compile", {"torch": torch.__version__}, {"mode": "prefill", "batch": 2, "seq": 8})
exec(d.attnswitch, {"model": model})  # the report's own text, as a user copies it
with torch.no_grad():
    torch.testing.assert_close(model(input_ids=ids).logits, want, atol=1e-5, rtol=1e-5)
assert owners.info_of(model).observed  # the compiled forward was watched
assert not counters["graph_break"], dict(counters["graph_break"])  # one graph, as measured
attnswitch.unpatch(model)
inner = tiny("llama")  # a module inside the model compiled, its first forward switched
attnswitch.patch(inner, "naive")
inner.model.forward = torch.compile(inner.model.forward)
with torch.no_grad():
    inner(input_ids=ids)
assert not counters["graph_break"], dict(counters["graph_break"])
print("ran")
"""


def test_a_compiled_picks_deploy_snippet_runs_as_written_under_dynamo():
    # the switch, then the model's forward compiled, then its first forward, the process's first switched one (in
    # a process of its own): a dict of attnswitch's written inside the trace (a registry place, cached on first
    # use) made Dynamo break the graph at the selection's next mappingproxy read, and resume Llama's forward
    # wrongly under the switch's watch (a torch function mode): arange(..., device=torch.Size)
    import subprocess
    import sys
    from pathlib import Path

    tests = Path(__file__).parent
    r = subprocess.run([sys.executable, "-c", _COMPILED_SNIPPET], capture_output=True, text=True, timeout=300,
                       env={**__import__("os").environ, "PYTHONPATH": str(tests)})
    assert r.returncode == 0 and r.stdout.strip() == "ran", r.stderr[-3000:]


@pytest.mark.filterwarnings("ignore:.*has no record of the versions")  # (a file written by hand, here)
def test_a_policy_file_that_names_a_compiled_pick_in_its_selection_reads_as_backend_and_mode(tmp_path):
    import json

    from attnswitch.deploy import load_policy

    p = tmp_path / "policy.json"  # as written before policy files had a compile field
    for sel, want in (("flash+compile", ("flash", "default")), ("cudnn+compile:reduce-overhead",
                                                                  ("cudnn", "reduce-overhead"))):
        p.write_text(json.dumps({"schema": 1, "selection": sel}))
        assert (load_policy(p).selection, load_policy(p).compile) == want
    p.write_text(json.dumps({"schema": 1, "selection": "math", "compile": "none"}))
    assert load_policy(p).compile is None


@pytest.mark.parametrize("mode", ["fast", 3])
def test_a_policy_files_compile_mode_is_checked(tmp_path, mode):
    import json

    from attnswitch.deploy import load_policy

    p = tmp_path / "policy.json"
    p.write_text(json.dumps({"schema": 1, "selection": "flash", "compile": mode}))
    with pytest.raises(ValueError, match=r"policy.json: 'compile' must be one of none, default, reduce-overhead"):
        load_policy(p)


def test_the_estimate_says_which_batch_it_is_for_and_deploy_names_every_batch_measured(cpu_report):
    from attnswitch.deploy import deploy_info

    pts = [_point(n, [_row("flash", 10.0 * b), _row("math", 13.0 * b)], batch=b) for b in (1, 3) for n in (16, 32)]
    s = serving_estimate(pts[:2], Lengths.of({16: 1, 32: 1}), 10, 4)
    assert s.text()[0].startswith("For 10 requests of this length mix (batch 1, 4 new tokens): `flash`")
    report = dataclasses.replace(cpu_report, sweep=tuple(pts))
    assert "for batch sizes other than 1, 3" in deploy_info("flash", report.environment, report.workload,
                                                            sweep=report.sweep).remeasure


def test_a_sweeps_one_choice_ran_at_every_shape_whoever_was_tied_or_cheapest():
    # at 16 A is first and D failed, at 32 D is first and A failed: E, second at both, ran everywhere
    pts = [_point(16, [_row("A", 10.0), _row("E", 11.0), _row("D", None, status="failed")], new_tokens=None),
           _point(32, [_row("D", 10.0), _row("E", 11.0), _row("A", None, status="failed")], new_tokens=None)]
    assert sweep_choice(pts) == "E"
    # with a mix: its estimate (batch 1) picks A, which failed at batch 8; B ran at every shape
    mixed = [_point(n, [_row("A", 10.0), _row("B", 11.0)], batch=1) for n in (16, 32)] + [
        _point(16, [_row("A", 50.0), _row("B", 55.0)], batch=8),
        _point(32, [_row("B", 60.0), _row("A", None, status="failed")], batch=8)]
    from attnswitch.comparison import _serving
    serving, _ = _serving(mixed, Lengths.of({16: 1, 32: 1}), 1000)
    assert serving["pick"] == "A" and sweep_choice(mixed, serving) == "B"


def test_a_backend_name_cannot_look_like_a_compiled_candidate_nor_end_a_code_span():
    import attnswitch
    for name in ("my+compile", "my`kernel"):  # (a report writes a backend's name in backticks)
        with pytest.raises(ValueError, match=r"without ',', '=', '/', '\+', '`' or white space"):
            attnswitch.register_backend(name, lambda q, k, v, **kw: q)


@pytest.mark.parametrize("args, said", [(["--prompt-lens", "99999999"], "--prompt-lens 99999999 is beyond"),
                                        (["--new-tokens", "99999999"], "--new-tokens 99999999 is beyond")])
def test_generate_lengths_past_any_models_positions_are_one_line_and_exit_2(capsys, args, said):
    from attnswitch import cli
    assert cli.main(["compare", "tiny-llama", "--mode", "generate", "--num-layers", "1", *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and said in err[0], err


def test_a_static_caches_decode_steps_meet_one_key_length_per_prompt_length():
    # a static cache's decode calls all run at the cache's length: the mix counted each step's key length as a
    # shape met first (16 for 4 lengths and 4 new tokens, where 1 new-length step per generate was measured)
    lengths = Lengths.of({8: 3, 16: 2, 24: 1, 40: 1})
    pts = [_point(n, [_row("flash", 11.0, new=12.0, seen=10.0)]) for n in (8, 40)]
    dynamic = serving_estimate(pts, lengths, 10_000, 4)
    static = serving_estimate(pts, lengths, 10_000, 4, cache="static")
    assert dynamic.first_met == pytest.approx(16.0) and static.first_met == pytest.approx(8.0)
    assert lengths.first_met(10_000, 4, static=True) == pytest.approx(8.0)
    assert "(8 shapes met first)" in static.text()[0]
