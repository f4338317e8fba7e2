"""Findings of a hostile review of the decision, a backend per layer kind and the command line.

Each test is named for the promise it shows broken, and fails until the product is fixed. Results are built
with fixed per-round times (no clock), as in ``test_decision.py``; the models are tiny, with random weights.
"""

import json

import pytest
import torch
from test_layer_kinds import _inputs, _qwen2

import attnswitch
from attnswitch import cli
from attnswitch.decision import decide, decide_sweep
from attnswitch.profiling.rounds import Timing
from attnswitch.profiling.summarize import with_timing
from attnswitch.ranking import ranked, verdict
from attnswitch.results import BackendResult, Numerics, Report, SweepPoint, TrainStats

FLASH_OP = ("aten::_scaled_dot_product_flash_attention",)


def fixed(name, per_round, **kw):
    t = Timing(samples=list(per_round), units=[[x] for x in per_round])
    return with_timing(BackendResult(name, "ok", timer="cuda-events", attn_calls=kw.pop("attn_calls", 4.0), **kw), t)


def report_of(results, workload=None):
    workload = {"mode": "prefill", "batch": 2, "seq": 64, "dtype": "bf16", **(workload or {})}
    d, v = decide(results, verdict(results), workload, {"torch": "2.11"})
    return Report(tuple(ranked(results, v)), {"torch": "2.11"}, workload, {}, model="m", ranking=v.order, decision=d)


def sweep_report(shapes, workload=None):
    """A sweep's report as ``compare_sweep`` builds it: each shape decided as ``compare`` decides it."""
    workload = {"mode": "prefill", "batch": 2, "dtype": "bf16", **(workload or {})}
    points, verdicts, last = [], [], None
    for seq, rs in shapes:
        d, v = decide(rs, verdict(rs), {**workload, "seq": seq}, {"torch": "2.11"})
        last = tuple(ranked(rs, v))
        points.append(SweepPoint(workload["batch"], seq, last, v.order, d.ties))
        verdicts.append(verdict(last))
    wl = {**workload, "seq": shapes[-1][0], "description": "sweep"}
    d, v, points = decide_sweep(points, verdicts, list(last), wl, {"torch": "2.11"}, None, [], ())
    return Report(tuple(ranked(list(last), v)), {"torch": "2.11"}, wl, {}, model="m", ranking=v.order, decision=d,
                  sweep=points)


# -- the decision: wrong answers -------------------------------------------------------------------------------

def test_never_naive_over_a_tied_fused_kernel_even_when_the_fused_one_is_beaten_by_a_third():
    # naive-inplace is decidedly faster than flash (tight rounds); naive is noisy and tied with both. The top
    # (nothing beats them) is {naive, naive-inplace}; flash is out of the top but tied with the pick.
    inplace = [10.0, 10.01, 9.99, 10.0, 10.02, 9.98, 10.0, 10.01]
    flash = [10.3, 10.31, 10.29, 10.3, 10.32, 10.28, 10.3, 10.31]
    naive = [8.0, 12.5, 9.0, 11.5, 9.2, 10.9, 8.5, 9.4]
    r = report_of([fixed("naive-inplace", inplace), fixed("flash", flash), fixed("naive", naive)])
    # printed: "Tie: `naive` ≈ `naive-inplace` ≈ `flash` at 9.300 ms per forward, not told apart: any is as good
    # here." and Deploy `naive`
    # flash is decidedly slower than naive-inplace: not tied for the fastest, and said to be behind it
    assert not ("flash" in r.ties and r.pick in ("naive", "naive-inplace", "math")), r.recommendation
    assert "flash" not in r.ties and "`flash` 1.03x" in r.recommendation and "of `naive-inplace`'s time" in \
        r.recommendation


def test_an_uncompiled_candidate_is_picked_before_its_compiled_self_it_is_tied_with():
    # the same shape as above: flash+compile in the top, flash tied with it but beaten by a tight third
    third = [10.0, 10.01, 9.99, 10.0, 10.02, 9.98, 10.0, 10.01]
    flash = [10.3, 10.31, 10.29, 10.3, 10.32, 10.28, 10.3, 10.31]
    compiled = [8.0, 12.5, 9.0, 11.5, 9.2, 10.9, 8.5, 9.4]
    r = report_of([fixed("naive-inplace", third), fixed("flash", flash),
                   fixed("flash+compile", compiled, compile="default")])
    # printed: "Tie: `flash+compile` ≈ `naive-inplace` ≈ `flash` ...; pick `flash+compile`"
    assert not ({"flash", "flash+compile"} <= set(r.ties) and r.pick == "flash+compile"), r.recommendation
    assert "flash" not in r.ties  # decidedly slower than naive-inplace: behind, not tied


def test_sdpas_own_choice_shown_tied_with_the_pick_is_the_pick():
    # auto is tied with flash (noisy flash), but a tight naive beats auto: auto is out of the top, yet the answer
    # shows it tied and picks flash "a fused kernel, preferred to `naive`" without a word on auto
    flash = [10.9, 8.6, 11.3, 9.1, 10.5, 8.8, 11.4, 9.3, 10.1, 8.7, 11.0, 9.6]
    naive = [10.0, 10.01, 9.99, 10.0, 10.02, 9.98, 10.0, 10.01, 10.0, 9.99, 10.02, 10.0]
    auto = [10.4, 10.41, 10.39, 10.4, 10.42, 10.38, 10.4, 10.41, 10.4, 10.39, 10.42, 10.4]
    r = report_of([fixed("flash", flash), fixed("naive", naive), fixed("auto", auto, attn_ops=FLASH_OP)])
    first = r.recommendation.splitlines()[0]
    if "auto" in r.ties:  # shown tied with the pick: the one that changes least is kept
        assert r.pick == "auto" and r.decision.answer == "keep", first


def test_a_sweep_where_eager_is_decidedly_fastest_at_every_shape_keeps_the_models_own_attention():
    def shape(seq):
        return seq, [fixed("eager", [8.0, 8.1, 7.9, 8.0, 8.2, 8.0]),
                     fixed("flash", [10.0, 10.1, 9.9, 10.0, 10.2, 10.0]), fixed("math", [20.0] * 6)]

    r = sweep_report([shape(64), shape(128)], {"attn_implementation": "eager"})
    first = r.recommendation.splitlines()[0]
    # printed: "Use `flash` over seq 64–128: the fastest (or tied) at 0 of 2 shapes, and of those the least time
    # over all." while its own lines say "Best per length at batch 2: seq 64–128: `eager`."
    assert "at 0 of" not in first
    assert r.pick == "eager" and r.decision.answer == "keep", first
    # and the summary never shows a backend faster than the pick without a word: eager 0.80 [0.80–0.80]
    for b in r.backends:
        if b.margin is not None and b.backend != r.pick:
            assert not (b.margin.decided and b.margin.high < 1), (b.backend, b.margin.text())


def mamba_config(folder):
    """A tiny state-space model's config.json in ``folder`` (no attention layers): its path."""
    from transformers import MambaConfig

    config = folder / "config.json"
    config.write_text(json.dumps({**MambaConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, state_size=4,
                                                expand=2).to_dict(), "architectures": ["MambaForCausalLM"]}))
    return config


def no_attention_run(folder, command: str, seq: str, out) -> int:
    """``attnswitch COMMAND`` of a tiny state-space model (no attention layers) on the CPU, written to
    ``out``: its exit code."""
    return cli.main([command, str(mamba_config(folder)), "--device", "cpu", "--backends", "naive,flash", "--seq", seq,
                     "--iters", "2", "--rounds", "1", "--warmup", "0", "--out", str(out)])


def test_a_sweep_of_a_model_with_no_attention_call_gets_no_pick_no_deploy_no_policy_and_exit_1(tmp_path, capsys):
    out = tmp_path / "report"
    code = no_attention_run(tmp_path, "compare", "16,32", out)
    printed = capsys.readouterr().out
    # printed: "Use `flash` over seq 16–32: the fastest (or tied) at every length." + Deploy, exit 0, policy.json
    assert "Deploy" not in printed and "no attention call" in printed
    assert code == cli.EXIT_NOTHING_RAN
    assert not (out / "policy.json").exists()


def test_eager_decidedly_faster_than_every_forced_candidate_keeps_the_models_own_eager_attention():
    # the model runs eager; eager is decidedly faster than flash and math, and tied with auto (whose median is
    # even slower): the answer tells the user to switch to auto, a change with no evidence of a gain
    eager = [8.0, 8.1, 7.9, 8.0, 8.2, 8.0]
    auto = [8.0, 9.0, 7.2, 8.6, 7.5, 8.4]
    rs = [fixed("eager", eager), fixed("auto", auto, attn_ops=FLASH_OP), fixed("flash", [10.0] * 6),
          fixed("math", [20.0] * 6)]
    r = report_of(rs, {"attn_implementation": "eager"})
    assert r.decision.answer == "keep" and r.deploy.keep, r.recommendation.splitlines()[0]


def test_a_sweeps_pick_that_failed_at_the_last_shape_is_first_of_its_ties_and_not_said_to_cover_it():
    def failed(name):
        return BackendResult(name, "failed", reasons=("boom",))

    r = sweep_report([(64, [fixed("flash", [1.0] * 6), failed("math")]),
                      (128, [failed("flash"), fixed("math", [2.0] * 6)])])
    first = r.recommendation.splitlines()[0]
    # printed: "Use `flash` over seq 64–128: ..." with decision.ties == ('math',), and a summary whose `math` is
    # "≈ 1.00 [1.00–1.00]" against itself while `flash`, the pick, failed there
    assert r.ties and r.ties[0] == r.pick, (r.pick, r.ties)
    assert "64–128" not in first, first


# -- the decision: the words ---------------------------------------------------------------------------------

def test_the_first_line_states_the_rule_applied_even_where_the_tie_is_long():
    rs = [fixed("efficient", [10.0, 10.1, 9.9, 10.0, 10.2, 10.0]),
          fixed("naive-inplace", [10.1, 10.0, 10.0, 9.9, 10.1, 10.2]),
          fixed("math", [10.1, 10.0, 10.0, 9.9, 10.1, 10.2]), fixed("naive", [10.1, 10.0, 10.0, 9.9, 10.1, 10.2])]
    r = report_of(rs, {"mode": "train"})
    assert r.decision.rule  # "a fused kernel, preferred to `naive-inplace`, `math`, `naive`"
    # printed: "Tie: `efficient` ≈ `naive-inplace` ≈ `math` ≈ `naive` at 10.000 ms per training step; pick
    # `efficient`." -- the rule is in no line of the text
    assert "a fused kernel" in r.recommendation


def test_the_rule_of_a_compiled_auto_pick_does_not_say_it_changes_nothing():
    rs = [fixed("flash", [10.0, 10.1, 9.9, 10.0, 10.2, 10.0]),
          fixed("auto+compile", [10.1, 10.0, 10.0, 9.9, 10.1, 10.2], attn_ops=FLASH_OP, compile="default"),
          fixed("math", [20.0] * 6)]
    r = report_of(rs)
    assert r.pick == "auto+compile" and "torch.compile" in r.deploy.attnswitch
    # decision.rule: "SDPA's own choice changes nothing, preferred to `flash`", while what it deploys compiles
    assert "changes nothing" not in r.decision.rule
    # and "Compiling changes the pick: uncompiled `flash` (10.000 ms), compiled `auto+compile` (10.050 ms)":
    # tied, and slower in the median; the preference changed the pick, not compiling
    assert "Compiling changes the pick" not in r.recommendation


def test_backends_that_ran_and_failed_numerics_are_not_said_not_to_have_run_and_exit_1():
    good, bad = Numerics(0.0, 0.0, 1.0, 1e-2, True), Numerics(0.5, 0.1, 0.5, 1e-2, False)
    r = report_of([fixed("eager", [10.0] * 6, numerics=good), fixed("flash", [8.0] * 6, numerics=bad),
                   fixed("math", [9.0] * 6, numerics=bad)])
    # printed: "Only `eager` ran: the model's own attention is the reference the others are checked against." /
    # "Name the backends to choose among."
    assert not r.recommendation.startswith("Only `eager` ran")
    assert "beyond tolerance" in r.recommendation


def test_only_eager_ran_exits_1_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "report"
    code = cli.main(["compare", "tiny-llama", "--device", "cpu", "--num-layers", "1", "--backends", "eager", "--seq",
                     "16", "--iters", "2", "--rounds", "1", "--warmup", "0", "--out", str(out)])
    assert "Only `eager` ran" in capsys.readouterr().out
    assert code == cli.EXIT_NOTHING_RAN  # docs/report.md: no answer, exit 1 (it exits 0 and writes --out)
    assert not out.exists()


def test_no_numerics_claim_under_no_numerics_the_eager_line():
    r = report_of([fixed("eager", [10.0] * 6), fixed("flash", [8.0] * 6), fixed("math", [9.0] * 6)])
    assert "Numerics not checked" in r.recommendation
    # and yet: "`eager` ... is the reference the others are checked against"
    assert "checked against" not in r.recommendation


def test_the_htmls_first_plot_is_the_ranked_time_in_a_training_report():
    from attnswitch.render.document import Figure, walk
    from attnswitch.render.sections import sections

    rs = [fixed("flash", [10.0] * 6, train=TrainStats(forward_ms=3.0, backward_ms=7.0)),
          fixed("math", [20.0, 20.1, 19.9, 20.0, 20.2, 20.0], train=TrainStats(forward_ms=6.0, backward_ms=14.0))]
    r = report_of(rs, {"mode": "train"})
    first = next(b for b in walk(sections(r)) if isinstance(b, Figure)).chart
    # the first is "Training: time per step" (forward and backward medians), the ranked time comes second
    assert "against the pick" in first.title, first.title


def test_a_sweeps_csv_vs_pick_is_against_the_sweeps_one_pick():
    import csv
    import io

    p1 = (64, [fixed("flash", [1.0] * 6), fixed("naive", [3.0] * 6)])
    p2 = (128, [fixed("flash", [2.0] * 6), fixed("naive", [1.9, 1.91, 1.89, 1.9, 1.92, 1.88])])
    p3 = (256, [fixed("flash", [4.0] * 6), fixed("naive", [8.0] * 6)])
    r = sweep_report([p1, p3, p2])  # the last shape measured (seq 128): naive decidedly fastest there
    assert r.pick == "flash"
    summary = {b.backend: b.margin for b in r.backends}
    assert summary["flash"].ratio == 1.0  # the summary: the last shape against the sweep's pick
    rows = [row for row in csv.DictReader(io.StringIO(r.to_csv())) if row["seq"] == "128"]
    vs = {row["backend"]: float(row["vs_pick"]) for row in rows}
    # the csv's last shape is against that shape's own pick (naive 1.0, flash 1.05): it names another pick
    assert vs["flash"] == pytest.approx(1.0), vs


# -- a backend per layer kind: silent wrong backends ----------------------------------------------------------

def _gemma3_vl():
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration, Gemma3TextConfig, SiglipVisionConfig

    torch.manual_seed(0)
    text = Gemma3TextConfig(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                            num_attention_heads=4, num_key_value_heads=1, head_dim=16, sliding_window=8,
                            layer_types=["sliding_attention", "full_attention"])
    vision = SiglipVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                                image_size=32, patch_size=8)
    return Gemma3ForConditionalGeneration(Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=4,
                                                       image_token_index=299, boi_token_index=297,
                                                       eoi_token_index=298)).eval()


def _switched_twice(spy, first: tuple[dict, str], then: tuple[dict, str]) -> tuple[list, list]:
    """A Gemma-3 vision-language model's forward under one per-kind switch, then under another; each switch
    names the model (``"model"``) or its language model (``"lm"``): the backends each forward ran."""
    m = _gemma3_vl()
    which = {"model": m, "lm": m.model.language_model}
    ids = torch.randint(3, 290, (1, 12))
    ran = []
    for sel, name in (first, then):
        spy.calls.clear()
        with torch.no_grad(), attnswitch.backend(sel, model=which[name]):
            which[name](input_ids=ids)
        ran.append(list(spy.names))
    return ran


def test_a_per_kind_switch_of_a_model_runs_its_kinds_backends_after_its_sub_model_was_switched_per_kind(spy):
    ran = _switched_twice(spy, ({"sliding_attention": "math"}, "lm"),
                          ({"text:sliding_attention": "naive", "text:full_attention": "naive"}, "model"))
    # no call was switched, and nothing said so: the modules keep the kind names of the first model bound
    assert ran == [["math"], ["naive", "naive"]]


def test_a_per_kind_switch_of_a_sub_model_runs_its_kinds_backends_after_its_model_was_switched_per_kind(spy):
    ran = _switched_twice(spy, ({"text:full_attention": "math"}, "model"),
                          ({"sliding_attention": "naive", "full_attention": "naive"}, "lm"))
    assert ran == [["math"], ["naive", "naive"]]


def test_a_layer_appended_after_a_per_kind_switch_is_switched_with_its_kind(spy):
    from transformers.models.qwen2.modeling_qwen2 import Qwen2DecoderLayer

    m = _qwen2()
    batch = _inputs("qwen2", m)
    sel = {"sliding_attention": "naive", "full_attention": "naive"}
    with torch.no_grad(), attnswitch.backend(sel, model=m):
        m(**batch, use_cache=False)
    assert len(spy.calls) == 4
    spy.calls.clear()
    m.config.num_hidden_layers = 5
    m.config.layer_types.append("full_attention")
    m.model.layers.append(Qwen2DecoderLayer(m.config, layer_idx=4))
    with torch.no_grad(), attnswitch.backend(sel, model=m):
        m(**batch, use_cache=False)
    # the appended layer silently ran the model's own attention (with a plain backend("naive", model=m) it is
    # switched: "Layers appended ... are switched"); layer_kinds(m) still lists layers 0-3 only
    assert [s for _, n, s in spy.calls if n == "naive"][-1] == "model.layers.4.self_attn"
    assert "model.layers.4.self_attn" in attnswitch.layer_kinds(m)["full_attention"]


def test_duplicate_kinds_are_refused_not_last_one_wins():
    from attnswitch.candidate import check_backends

    for text in ("all=naive/all=flash", "all.prefill=math/all.decode=naive/all=flash"):
        with pytest.raises(ValueError):
            check_backends(text)  # -> ['all=flash']: the first selection of the kind silently dropped


# -- the command line -----------------------------------------------------------------------------------------

def test_a_kind_given_both_a_backend_and_a_policy_is_one_line_and_exit_2(capsys):
    code = cli.main(["compare", "tiny-llama", "--device", "cpu", "--num-layers", "1", "--backends",
                     "all=flash/all.prefill=math/all.decode=naive", "--seq", "8"])
    err = capsys.readouterr().err
    # a traceback: TypeError: 'str' object does not support item assignment (candidate._policy_text)
    assert code == cli.EXIT_BAD_INPUT and "Traceback" not in err


def test_a_selection_per_kind_with_a_backend_and_a_policy_for_one_kind_is_an_option_error():
    from attnswitch.candidate import check_backends
    from attnswitch.options import OptionError

    with pytest.raises(OptionError):
        check_backends("all=flash/all.prefill=math/all.decode=naive")  # TypeError


def test_an_unknown_layer_kind_on_the_command_line_is_bad_input_exit_2(capsys):
    code = cli.main(["compare", "tiny-llama", "--device", "cpu", "--num-layers", "1", "--backends", "foo=flash,naive",
                     "--seq", "8", "--iters", "2", "--rounds", "1", "--warmup", "0"])
    out = capsys.readouterr()
    # it measured naive, listed `foo=flash failed: OptionError: foo names layer kinds LlamaForCausalLM does not
    # have (foo); its kinds: all` under Not run, recommended naive and exited 0
    assert code == cli.EXIT_BAD_INPUT and "Recommendation" not in out.out


def test_a_bare_call_with_a_selection_per_kind_is_refused_with_a_reason():
    q = k = v = torch.randn(1, 2, 8, 16)
    with pytest.raises(ValueError) as e:
        attnswitch.attention(q, k, v, backend="sliding_attention=naive")
    # "attention backend None is not registered (unregistered while in use?)"
    assert "None" not in str(e.value) and "kind" in str(e.value)


def test_defects_refuses_a_cudnn_version_that_is_none():
    assert cli.main(["defects", "--cudnn", "-1"]) == cli.EXIT_BAD_INPUT  # read as "cuDNN 1", exit 0


def test_defects_reads_nvccs_spelling_of_hopper_as_hopper(capsys):
    cli.main(["defects", "--torch", "2.13.0", "--cudnn", "9.20", "--arch", "sm90"])
    hopper = capsys.readouterr().out
    code = cli.main(["defects", "--torch", "2.13.0", "--cudnn", "9.20", "--arch", "sm_90a"])
    out = capsys.readouterr().out
    # "0 apply to torch 2.13.0, cuDNN 9.20, sm90a" / "[not here: GPU sm90a, not sm90]": H100/H200 are sm_90a
    assert code == 0 and out.splitlines()[0] == hopper.splitlines()[0]  # sm_90a is read as sm90: the same GPUs


def test_check_of_a_model_with_no_attention_call_says_so_and_exits_1_not_every_backend_ok(tmp_path, capsys):
    # printed: "cudnn ok", "efficient ok" on a CPU: every backend "ran" a forward that never called attention
    code = cli.main(["check", str(mamba_config(tmp_path)), "--device", "cpu", "--seq", "16"])
    printed = capsys.readouterr().out
    assert code == cli.EXIT_NOTHING_RAN and "no attention call" in printed and " ok" not in printed, printed
    assert cli.main(["check", "tiny-llama", "--num-layers", "1", "--seq", "16", "--backends", "naive"]) == cli.EXIT_OK
    assert "naive          ok" in capsys.readouterr().out


def test_only_compiled_candidates_are_not_a_model_without_attention():
    # `compare --compile default --backends flex,math` on a CPU: math+compile ran, its compiled forward's calls are
    # not counted one by one (0), and the answer was "the model's forward made no attention call", exit 1
    compiled = fixed("math+compile", [4.0] * 6, attn_calls=0.0, compile="default")
    r = report_of([compiled, BackendResult("flex+compile", "unavailable", ("flex runs on cuda tensors",))])
    assert not r.no_attention and r.pick == "math+compile"
    none = fixed("naive", [4.0] * 6, attn_calls=0.0)  # uncompiled rows say it
    assert report_of([none, fixed("math+compile", [4.0] * 6, attn_calls=0.0, compile="default")]).no_attention
