"""``check`` of a workload (``attnswitch check`` and ``attnswitch.check``): it runs what ``compare`` of the same
workload runs (a training step's backward, a generate's decode steps, the workload's own model), refuses the bad
input ``compare`` refuses, and leaves the model's gradients as it found them.

The models are tiny, with random weights, built from configs; nothing is timed against a clock.
"""

import json

import pytest
import torch
import torch.nn.functional as F
from conftest import batch_for, tiny

import attnswitch
from attnswitch import cli
from attnswitch.workload import make_workload

TINY = ["tiny-llama", "--device", "cpu", "--num-layers", "1"]


class _NoBackward(torch.autograd.Function):
    """SDPA forward, and a backward that cannot run: a kernel written for inference only."""

    @staticmethod
    def forward(ctx, q, k, v, mask, causal, scale):
        return F.scaled_dot_product_attention(q, k, v, mask, 0.0, causal, scale=scale)

    @staticmethod
    def backward(ctx, grad):
        raise NotImplementedError("forward-only kernel: no backward")


def _forward_only(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None):
    return _NoBackward.apply(q, k, v, attn_mask, is_causal, scale)


# -- bad input ---------------------------------------------------------------------------------------------------------

def test_check_refuses_a_layer_kind_the_model_does_not_have_as_bad_input_like_compare_and_profile(capsys):
    # docs/promises.md, "Bad input is one line and exit 2, whenever it is found" and "One rule, one place".
    # `compare` and `profile` of tiny-llama with --backends sliding_attention=flash,math print "error:
    # sliding_attention names layer kinds LlamaForCausalLM does not have (sliding_attention); its kinds: all (1
    # attention module)" and exit 2, and `check` refuses it alike. A wrong answer would list the typo as a backend
    # that cannot run the inputs and exit 0:
    #   sliding_attention=flash UNAVAILABLE
    #       - OptionError: sliding_attention names layer kinds LlamaForCausalLM does not have ...
    #   math           ok
    code = cli.main(["check", *TINY, "--seq", "16", "--backends", "sliding_attention=flash,math"])
    printed = capsys.readouterr().out
    assert code == 2, printed
    assert "UNAVAILABLE" not in printed, printed


def test_check_of_a_backend_this_device_cannot_offer_answers_why_as_check_of_all_does(capsys):
    # compare refuses a list of which the device offers nothing (nothing could run); check is asked what can run,
    # and answered for cudnn without --backends, while naming it was "error: ... nothing this device offers", exit 2
    code = cli.main(["check", *TINY, "--seq", "16", "--backends", "cudnn"])
    printed = capsys.readouterr().out
    assert code == 1, printed
    assert "cudnn" in printed and "UNAVAILABLE" in printed and "runs only on CUDA tensors" in printed, printed


# -- what a workload runs ----------------------------------------------------------------------------------------------

def test_check_of_a_training_step_says_a_backend_the_training_step_refuses_cannot_run_it(tmp_path, capsys):
    # `check` answers "which backends can run the inputs" and takes --mode train ("forward and backward of the
    # loss"): for a Llama config with attention_dropout=0.1 it runs the training step, where flash is unavailable,
    # as `compare` of the same workload says ("flash unavailable at model.layers.0.self_attn: Both fused kernels do
    # not support non-zero dropout."). A wrong answer, from one no-grad forward in eval mode, would read
    #   math           ok
    #   flash          ok
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
    # `check --mode generate` runs the decode steps too, as `compare` of the same workload does: on a CPU the
    # policy prefill=math/decode=cudnn is unavailable ("the cudnn backend runs only on CUDA tensors; these are on
    # cpu"). A wrong answer, from one forward of the first prompt (a prefill, the decode phase never tried), would
    # read
    #   prefill=math/decode=cudnn ok
    #   math           ok
    code = cli.main(["check", *TINY, "--mode", "generate", "--prompt-len", "8", "--new-tokens", "2",
                     "--backends", "prefill=math/decode=cudnn,math"])
    printed = capsys.readouterr().out
    policy = next(line for line in printed.splitlines() if line.startswith("prefill=math/decode=cudnn"))
    assert code == 0, printed
    assert "UNAVAILABLE" in policy, printed


def test_check_of_a_workload_says_what_the_backend_does_with_the_model_that_runs_it():
    # check(model, work=...) switches ``model`` and runs ``work.step``, which calls ``work.model``. Given a workload
    # made for another model (a reloaded copy, the same weights loaded again in a notebook), check either refuses
    # it or checks the model that runs it, as compare(model, work) and profile(model, work) do (Target.of): on a
    # CPU, where cudnn runs only on CUDA tensors, cudnn is not ok. A wrong answer would run the workload's model
    # unswitched for every backend and read
    #   math           ok
    #   cudnn          ok
    if torch.cuda.is_available():
        pytest.skip("needs cudnn to be unavailable: a CPU-only machine")
    m, other = tiny("llama"), tiny("llama")
    work = make_workload(other, batch=2, seq=8)
    try:
        result = attnswitch.check(m, work=work, backends=["math", "cudnn"])
    except ValueError:  # (OptionError too) a workload of another model refused: fine
        return
    assert not result["cudnn"].ok, str(result)


# -- what it leaves on the model ---------------------------------------------------------------------------------------

def test_check_of_a_training_step_leaves_the_models_gradients_as_found():
    # check's docstring: "nothing is kept but the verdicts"; docs/python-api.md: check(model, work=<train workload>)
    # runs "a training step's forward and backward in training mode", and the training mode is put back as found.
    # So are the gradients. A model in the middle of gradient accumulation (21 parameters with a .grad), checked
    # with backends=["math", <a kernel whose backward raises>], keeps every gradient it had. A wrong answer would
    # show either of:
    #   - the user's accumulated gradients gone (every .grad None), cleared by the zero_grad(set_to_none=True)
    #     that ends Workload.step;
    #   - the forward-only kernel's backward raising half way (recorded, rightly, as "UNAVAILABLE -
    #     NotImplementedError: forward-only kernel: no backward") and leaving on the model the gradients it had
    #     already accumulated: partial gradients of a step that failed, which the user's next optimizer.step()
    #     would apply.
    m = tiny("llama")
    batch = batch_for(m)
    m(**batch).logits.float().square().mean().backward()  # the user's accumulated gradients
    before = {n: p.grad.clone() for n, p in m.named_parameters()}
    work = make_workload(m, batch=2, seq=8, mode="train")
    name = attnswitch.register_backend("fwd-only", _forward_only)
    try:
        result = attnswitch.check(m, work=work, backends=["math", name])
    finally:
        attnswitch.unregister_backend(name)
    assert result["math"].ok and not result[name].ok
    after = {n: p.grad for n, p in m.named_parameters()}
    changed = [n for n in before if after[n] is None or not torch.equal(after[n], before[n])]
    assert not changed, f"{len(changed)} of {len(before)} gradients changed by check: {changed[:4]}"
