"""Findings of a fourth hostile review: policies and ``load_policy``, the library switch under stress, and
``check``/``profile`` on odd input.

Each test is named for the promise it shows broken, and fails until the product is fixed. The models are tiny,
with random weights, built from configs; nothing is timed against a clock.
"""

import json

import torch
from conftest import batch_for, tiny
from test_hostile_findings import _gemma3_vl

import attnswitch
from attnswitch import cli

TINY = ["tiny-llama", "--device", "cpu", "--num-layers", "1"]


# -- the switch: a model that changes after a switch is switched as it is now -----------------------------------

def test_a_patched_model_given_another_attn_implementation_is_switched_as_it_is_now(spy):
    # docs/promises.md, "A model that changes after a switch is switched as it is now", and patch()'s "until
    # unpatch(model)". A model loaded with attn_implementation="eager", patched, then moved to SDPA by the user:
    # its next forward raised UnsupportedModel "LlamaForCausalLM computes attention outside transformers' attention
    # interface, where no attnswitch backend reaches it, so the switch would leave it as it is:
    # model.layers.0.self_attn (LlamaAttention): scaled_dot_product_attention; ..." (run alone: "... without one
    # attention call through transformers' attention interface: it computed attention itself") -- it computes
    # nothing itself: the patch keeps the attention keys the configs named when it was made (sdpa ->
    # flex_attention, flex_attention -> sdpa, eager -> flex_attention fail the same; patching it again does not
    # help, and backend("math", model=m) entered before set_attn_implementation fails the same). With another
    # model patched on sdpa beside it, the same forward runs math twice.
    m = tiny("llama")
    batch = batch_for(m)
    m.set_attn_implementation("eager")
    attnswitch.patch(m, "math")
    try:
        m.set_attn_implementation("sdpa")
        with torch.no_grad():
            m(**batch)
        assert spy.names == ["math", "math"]
    finally:
        attnswitch.unpatch(m)


# -- check: which backends can run these inputs ------------------------------------------------------------------

def test_check_refuses_a_layer_kind_the_model_does_not_have_as_bad_input_like_compare_and_profile(capsys):
    # docs/promises.md, "Bad input is one line and exit 2, whenever it is found" and "One rule, one place".
    # `compare` and `profile` of tiny-llama with --backends sliding_attention=flash,math print "error:
    # sliding_attention names layer kinds LlamaForCausalLM does not have (sliding_attention); its kinds: all (1
    # attention module)" and exit 2. `check` printed the typo as a backend that cannot run the inputs:
    #   sliding_attention=flash UNAVAILABLE
    #       - OptionError: sliding_attention names layer kinds LlamaForCausalLM does not have ...
    #   math           ok
    # and exit 0 (the library's attnswitch.check records it the same way: it catches ValueError).
    code = cli.main(["check", *TINY, "--seq", "16", "--backends", "sliding_attention=flash,math"])
    printed = capsys.readouterr().out
    assert code == 2, printed
    assert "UNAVAILABLE" not in printed, printed


def test_check_of_a_training_step_says_a_backend_the_training_step_refuses_cannot_run_it(tmp_path, capsys):
    # `check` answers "which backends can run the inputs" and takes --mode train ("forward and backward of the
    # loss"). For a Llama config with attention_dropout=0.1 it ran one no-grad forward in eval mode and printed
    #   math           ok
    #   flash          ok
    # exit 0, while `compare` of the same workload (--mode train) says "flash unavailable at
    # model.layers.0.self_attn: Both fused kernels do not support non-zero dropout."
    from transformers import LlamaConfig

    config = tmp_path / "config.json"
    config.write_text(json.dumps({**LlamaConfig(vocab_size=211, hidden_size=64, intermediate_size=128,
                                                num_hidden_layers=1, num_attention_heads=8, num_key_value_heads=2,
                                                attention_dropout=0.1).to_dict(),
                                  "architectures": ["LlamaForCausalLM"]}))
    code = cli.main(["check", str(config), "--device", "cpu", "--seq", "16", "--mode", "train",
                     "--backends", "math,flash"])
    printed = capsys.readouterr().out
    lines = {line.split()[0]: line for line in printed.splitlines() if line.strip() and not line.startswith(" ")}
    assert code == 0 and "ok" in lines["math"], printed
    assert "UNAVAILABLE" in lines["flash"], printed


def test_check_of_a_generate_workload_checks_its_decode_steps(capsys):
    # `check --mode generate --backends prefill=math/decode=cudnn,math` on a CPU printed
    #   prefill=math/decode=cudnn ok
    #   math           ok
    # exit 0: it ran one forward of the first prompt, a prefill, so the decode phase was never tried. `compare` of
    # the same workload: "prefill=math/decode=cudnn unavailable at model.layers.0.self_attn: the cudnn backend runs
    # only on CUDA tensors; these are on cpu".
    code = cli.main(["check", *TINY, "--mode", "generate", "--prompt-len", "8", "--new-tokens", "2",
                     "--backends", "prefill=math/decode=cudnn,math"])
    printed = capsys.readouterr().out
    policy = next(line for line in printed.splitlines() if line.startswith("prefill=math/decode=cudnn"))
    assert code == 0, printed
    assert "UNAVAILABLE" in policy, printed


def test_a_padded_workload_has_padding():
    # make_workload's padding "left-pads a decoder's batch", and --padding is refused for batch 1 because "the first
    # row keeps every position, the others are padded". At --seq 3 or less no row is padded: `check tiny-llama
    # --seq 3 --padding` printed "batch 2, seq 3, prefill, padded" and answered for a mask of all ones
    # ([[1, 1, 1], [1, 1, 1]]; batch 3 seq 2 the same), so a backend that refuses padding is said to run it.
    from attnswitch.workload import make_workload

    m = tiny("llama")
    work = make_workload(m, batch=2, seq=3, padding=True)
    assert "padded" in work.description
    assert not bool(work.kwargs["attention_mask"].all()), work.kwargs["attention_mask"].tolist()


# -- compare: a backend per layer kind -----------------------------------------------------------------------------

def test_a_model_with_a_kind_that_made_no_call_still_gets_the_candidate_of_each_kinds_fastest_backend():
    # docs/workloads.md: `compare` on a model of several kinds "adds the candidate of each kind's fastest
    # backend". A Gemma 3 vision-language model compared on text (a text-only serving workload) makes no call of
    # its `vision` kind, so no result has a time for it, and perkind.composed (given every kind of the model)
    # returns None: the candidate is never measured, whatever the text kinds' times. Here naive is fastest at the
    # sliding layers and flash at the full ones, the times the profiled pass of a text-only input gives.
    from attnswitch.profiling import perkind
    from attnswitch.results import BackendResult

    kinds = list(attnswitch.layer_kinds(_gemma3_vl()))
    assert kinds == ["vision", "text:sliding_attention", "text:full_attention"]
    results = [BackendResult("naive", "ok", attn_by_kind=(("text:sliding_attention", 1000.0),
                                                          ("text:full_attention", 5000.0))),
               BackendResult("flash", "ok", attn_by_kind=(("text:sliding_attention", 5000.0),
                                                          ("text:full_attention", 1000.0)))]
    best = perkind.composed(results, kinds)
    # -> None (with the two text kinds alone: "text:sliding_attention=naive/text:full_attention=flash")
    assert best is not None
    assert "text:sliding_attention=naive" in best and "text:full_attention=flash" in best, best


# -- your own kernel -----------------------------------------------------------------------------------------------

def test_a_backend_named_all_is_refused_as_all_means_every_backend():
    # backends="all" (and --backends all) means every backend; register_backend refuses built-in names and
    # aliases, but took "all". After it, check(m, backends="all") checked the 7 CPU backends while
    # check(m, backends=["all"]) checked the user's kernel alone ("all            ok"): one name, two meanings.
    import torch.nn.functional as F

    def mine(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None):
        return F.scaled_dot_product_attention(q, k, v, attn_mask, dropout_p, is_causal, scale=scale)

    try:
        name = attnswitch.register_backend("all", mine)
    except ValueError:
        return
    try:
        m = tiny("llama")
        batch = batch_for(m, batch=2, seq=8)
        every, listed = attnswitch.check(m, backends="all", **batch), attnswitch.check(m, backends=[name], **batch)
        assert [e.backend for e in every] == [e.backend for e in listed]
    finally:
        attnswitch.unregister_backend(name)
