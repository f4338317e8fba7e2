"""A model whose forward makes no attention call (a state-space model, no attention layers): ``compare`` (one shape
or a sweep), ``profile`` and ``check`` say so, pick and deploy nothing, write nothing to ``--out`` and exit 1;
compiled candidates, whose calls are not counted one by one, do not make a model one without attention.

The model is tiny, with random weights, built from its config on the CPU.
"""

import json

from reports_fixed import fixed, report_of

from attnswitch import cli
from attnswitch.results import BackendResult


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
    # a wrong answer: "Use `flash` over seq 16–32: the fastest (or tied) at every length." + Deploy, exit 0, policy.json
    assert "Deploy" not in printed and "no attention call" in printed
    assert code == cli.EXIT_NOTHING_RAN
    assert not (out / "policy.json").exists()


def test_profile_of_a_model_with_no_attention_call_exits_1_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "profile"
    code = no_attention_run(tmp_path, "profile", "16", out)
    printed = capsys.readouterr().out
    # docs/cli.md, exit code 1: "the model's forward made no attention call through attnswitch (a model without
    # attention layers): the report is printed, `--out` left as it was". A wrong answer would be a summary timing
    # naive against flash with no word that no attention call was made, exit 0, and report.json, ... in --out
    assert "no attention call" in printed
    assert code == cli.EXIT_NOTHING_RAN
    assert not out.exists()


def test_check_of_a_model_with_no_attention_call_says_so_and_exits_1_not_every_backend_ok(tmp_path, capsys):
    # a forward that never called attention says nothing of a backend: a wrong answer reads "cudnn ok" on a CPU
    code = cli.main(["check", str(mamba_config(tmp_path)), "--device", "cpu", "--seq", "16"])
    printed = capsys.readouterr().out
    assert code == cli.EXIT_NOTHING_RAN and "no attention call" in printed and " ok" not in printed, printed
    assert cli.main(["check", "tiny-llama", "--num-layers", "1", "--seq", "16", "--backends", "naive"]) == cli.EXIT_OK
    assert "naive          ok" in capsys.readouterr().out


def test_only_compiled_candidates_are_not_a_model_without_attention():
    # `compare --compile default --backends flex,math` on a CPU: math+compile ran, and its compiled forward's calls
    # are not counted one by one (0), which says nothing of the model: it is the pick. A wrong answer would read
    # "the model's forward made no attention call", exit 1
    compiled = fixed("math+compile", [4.0] * 6, attn_calls=0.0, compile="default")
    r = report_of([compiled, BackendResult("flex+compile", "unavailable", ("flex runs on cuda tensors",))])
    assert not r.no_attention and r.pick == "math+compile"
    none = fixed("naive", [4.0] * 6, attn_calls=0.0)  # uncompiled rows say it
    assert report_of([none, fixed("math+compile", [4.0] * 6, attn_calls=0.0, compile="default")]).no_attention


def test_a_callable_whose_attention_bypasses_attnswitch_is_told_so_not_called_a_state_space_model():
    import torch
    import torch.nn.functional as F

    import attnswitch

    q = torch.randn(1, 2, 8, 16)
    r = attnswitch.compare(lambda: F.scaled_dot_product_attention(q, q, q, is_causal=True), backends=["naive", "math"],
                           iters=1, rounds=1, time_budget_s=0)
    first = r.recommendation.splitlines()[0]
    assert first.startswith("The callable made no attention call through attnswitch: a backend switches "
                            "attnswitch.attention(...)") and "state-space" not in r.recommendation, first
    ours = attnswitch.compare(lambda: attnswitch.attention(q, q, q, is_causal=True), backends=["naive", "math"],
                              iters=1, rounds=1, time_budget_s=0)
    assert ours.pick in ("naive", "math")


def test_a_transformer_with_its_layers_taken_out_runs_switched_as_it_runs_unswitched():
    # a pipeline stage of embeddings and a head: its config names heads and layers, it has none; it was refused
    # as a model that "computed attention itself"
    import torch
    import torch.nn as nn
    from conftest import tiny

    import attnswitch

    m = tiny("llama")
    m.model.layers = nn.ModuleList()
    ids = torch.randint(0, 50, (1, 8))
    with torch.no_grad():
        ref = m(ids).logits
        with attnswitch.backend("flash", model=m):
            assert torch.equal(m(ids).logits, ref)
        with attnswitch.backend("math"):
            assert torch.equal(m(ids).logits, ref)
