"""One request, one check: every combination of options the command line refuses, the library refuses with the
same error, worded with its parameters where the command line words it with its flags."""

import pytest
from conftest import batch_for, tiny

import attnswitch
from attnswitch import cli, options
from attnswitch.comparison import compare_sweep
from attnswitch.lengths import Lengths
from attnswitch.request import DEFAULTS, REQUESTS, Request, Steps
from attnswitch.workload import make_workload


def _spread_model():
    m = tiny("llama")
    m.hf_device_map = {"model.embed_tokens": "cpu", "model.layers": "disk", "lm_head": "cpu"}  # spread (as placed)
    return m


MIX = Lengths.of({8: 3, 16: 1})


def _sweep(**kw):
    return lambda: compare_sweep(tiny("llama"), kw.pop("shapes", [(1, 8)]), backends=["naive"], **kw)


def _work(**kw):
    return lambda: make_workload(tiny("llama"), seq=8, **kw)


def _compare(**kw):
    m = tiny("llama")
    return lambda: attnswitch.compare(m, batch_for(m), backends=["naive"], **kw)


# (what the command line is given, the library called with the same combination)
REFUSED = [
    (["--device", "cpu", "--device-map", "auto"], lambda: Request(device="cpu", device_map="auto").check()),
    (["--device", "cpu", "--tp"], lambda: Request(device="cpu", tp=True).check()),
    (["--mode", "generate", "--seq", "64"], lambda: Request(mode="generate", seq=(64,)).check()),
    (["--new-tokens", "4"], _sweep(mode="prefill", new_tokens=4)),
    (["--mode", "train", "--cache", "static"], _sweep(mode="train", cache="static")),
    (["--prompt-lens-from", "lens.txt"], _sweep(mode="prefill", lengths=MIX)),
    (["--prompt-len", "8"], lambda: Request(prompt_len=(8,)).check()),
    (["--mode", "decode", "--prompt-lens", "8,9"], lambda: Request(mode="decode", prompt_lens=(8, 9)).check()),
    (["--mode", "generate", "--prompt-len", "8", "--prompt-lens", "8,9"],
     lambda: Request(mode="generate", prompt_len=(8,), prompt_lens=(8, 9)).check()),
    (["--mode", "generate", "--prompt-len", "8", "--prompt-lens-from", "lens.txt"],
     lambda: Request(mode="generate", prompt_len=(8,), lengths=MIX).check()),
    (["--mode", "generate", "--requests", "9"], _sweep(mode="generate", new_tokens=2, requests=9)),
    (["--mode", "generate", "--prompt-lens-from", "lens.txt", "--requests", "0"],
     _sweep(mode="generate", new_tokens=2, lengths=MIX, requests=0)),
    (["--mode", "generate", "--prompt-lens", "8", "--new-tokens", "2,3"],
     lambda: Request(mode="generate", prompt_lens=(8,), new_tokens=(2, 3)).check()),
    # make_workload: what a mode does not take, refused rather than ignored
    (["--new-tokens", "4"], _work(mode="prefill", new_tokens=4)),
    (["--mode", "train", "--cache", "static"], _work(mode="train", cache="static")),
    (["--mode", "decode", "--prompt-lens", "8,9"], _work(mode="decode", prompt_lens=(8, 9))),
    (["--mode", "decode", "--seq", "8,16"], _sweep(mode="decode", shapes=[(1, 8), (1, 16)])),
    (["--mode", "decode", "--batch", "2,4"], _sweep(mode="decode", shapes=[(2, 8), (4, 8)])),
    (["--iters", "0"], _compare(iters=0)),
    (["--rounds", "0"], _compare(rounds=0)),
    (["--warmup", "-1"], _compare(warmup=-1)),
    (["--time-budget", "-1"], _compare(time_budget_s=-1.0)),
    (["--time-budget", "inf"], _compare(time_budget_s=float("inf"))),  # (JSON has no Infinity)
    (["--time-budget", "nan"], _compare(time_budget_s=float("nan"))),
    (["--compile", "default", "--device-map", "auto"], lambda: attnswitch.profile(
        m := _spread_model(), batch_for(m), backends=["naive"], compile="default")),
    (["--compile", "default", "--tp"], lambda: Request(compile="default", tp=True).check()),
    (["--compile", "fast"], _compare(compile="fast")),
    # a backend per phase where one phase runs: its other backend would be recommended unmeasured
    (["--backends", "prefill=flash/decode=math"], lambda: attnswitch.compare(
        m := tiny("llama"), batch_for(m), backends=["prefill=flash/decode=math"])),
    # (prefill=flash/decode=flash is flash in every phase: measured whole, and taken)
    (["--mode", "decode", "--backends", "naive,sliding_attention.prefill=flash/sliding_attention.decode=math"],
     lambda: Request(mode="decode", backends="naive,sliding_attention.prefill=flash/sliding_attention.decode=math"
                     ).check()),
]


@pytest.mark.parametrize("argv, library", REFUSED, ids=[" ".join(a) for a, _ in REFUSED])
def test_every_combination_the_command_line_refuses_the_library_refuses_with_the_same_error(
        argv, library, tmp_path, capsys, monkeypatch):
    (tmp_path / "lens.txt").write_text("8\n8\n8\n16\n")
    monkeypatch.chdir(tmp_path)
    assert cli.main(["compare", "tiny-llama", *argv]) == 2
    said = capsys.readouterr().err.strip().splitlines()
    with pytest.raises(options.OptionError) as e:
        library()
    assert said == ["error: " + e.value.worded(cli.FLAGS)], (said, e.value.template)
    assert "--" not in str(e.value)  # the library's own words: its parameters, no flag


def test_the_profile_command_and_the_library_refuse_a_sweep_alike(capsys):
    assert cli.main(["profile", "tiny-llama", "--mode", "generate", "--prompt-len", "8,16"]) == 2
    with pytest.raises(options.OptionError) as e:
        Request(kind="profile", mode="generate", prompt_len=(8, 16)).check()
    assert capsys.readouterr().err.strip() == "error: " + e.value.worded(cli.FLAGS)
    assert "is a `compare`" in e.value.worded(cli.FLAGS) and "is a compare_sweep" in str(e.value)


def test_the_defaults_are_written_once_and_read_by_the_command_line_and_the_library():
    # the command line's help says the request's defaults; a sweep without new tokens takes the device's
    help = " ".join(cli.build_parser()._subparsers._group_actions[0].choices["compare"].format_help().split())
    cpu, gpu = DEFAULTS["cpu"], DEFAULTS["cuda"]
    for flag, name in (("--batch", "batch"), ("--seq", "seq"), ("--new-tokens", "new_tokens")):
        assert f"{getattr(gpu, name)} on a GPU, {getattr(cpu, name)} on a CPU" in help, flag
    assert f"(default: {REQUESTS})" in help
    r = Request(mode="generate", lengths=Lengths.of({8: 1})).check().resolved("cpu")
    assert r.new_tokens == (cpu.new_tokens,) and r.requests == REQUESTS and r.prompt_len == (8,)
    assert Steps().resolved(generate=False) == Steps(1, 12, 6, None, 5, 1)
    assert Steps().resolved(generate=True) == Steps(0, 1, 1, None, 1, 1)


def test_the_command_line_holds_no_rule_of_its_own():
    # every check the command line makes before torch is imported is the request's, and the outfolder's
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(cli))
    raised = [n for n in ast.walk(tree) if isinstance(n, ast.Raise) and n.exc is not None]
    words = [ast.unparse(n.exc) for n in raised]
    assert not [w for w in words if w.startswith(("ValueError", "options.OptionError", "OptionError"))], words


def test_a_policy_per_phase_refused_for_a_one_phase_step_names_the_backend_its_query_length_runs():
    # an 8-token prefill under decode_max_query=8 runs the decode phase (flash): the refusal advised naive
    def said(mode, seq, policy):
        with pytest.raises(options.OptionError) as e:
            Request(mode=mode, seq=seq, backends=[policy]).check()
        return str(e.value)

    wide = "prefill=naive/decode=flash/decode_max_query=8"
    assert "runs only its decode phase: name that backend (flash)" in said("prefill", (8,), wide)
    assert "runs only its prefill phase: name that backend (naive)" in said("prefill", (16,), wide)
    assert "runs only its decode phase: name that backend (flash)" in said("decode", (16,), wide)
    assert "runs only its prefill phase: name that backend (math)" in said("train", (4,), "prefill=math/decode=flash")
    text = said("prefill", (8, 16), wide)
    assert "runs one phase, the one its query length falls in (flash at 8; naive at 16)" in text, text


def test_the_library_names_the_phase_a_workloads_query_length_runs_as_the_command_line_does():
    # compare, profile and compare_sweep build their request without --seq: they fell back to the prefill phase
    m = tiny("llama")
    p = "prefill=math/decode=naive/decode_max_query=8"
    calls = (lambda: attnswitch.compare(m, make_workload(m, seq=8), backends=[p]),
             lambda: attnswitch.profile(m, make_workload(m, seq=8), backends=[p]),
             lambda: compare_sweep(m, [(1, 4), (1, 8)], backends=[p]))
    for call in calls:
        with pytest.raises(options.OptionError, match=r"runs only its decode phase: name that backend \(naive\)"):
            call()
    # a sweep over lengths of both phases: said of the whole sweep, in any order, before any workload is made
    for shapes in ([(1, 4), (1, 16)], [(1, 16), (1, 4)]):
        with pytest.raises(options.OptionError, match=r"the one its query length falls in \(naive at 4; math at 16\)"):
            compare_sweep(m, shapes, backends=[p])
    name = attnswitch.register_backend("mine", lambda q, k, v, **kw: q)  # (a sweep's check knows a user's names)
    try:
        with pytest.raises(options.OptionError, match=r"name that backend \(mine\)"):
            compare_sweep(m, [(1, 4), (1, 8)], backends=[f"prefill=math/decode={name}/decode_max_query=8"])
    finally:
        attnswitch.unregister_backend(name)


def test_an_encoder_decoder_step_whose_calls_fall_in_both_phases_is_measured_under_a_policy_per_phase():
    # its encoder's calls (16 queries) run the prefill backend, its decoder's (1) the decode backend: both measured,
    # where it was refused as a step of one phase and told to name one backend
    import torch

    t5 = tiny("t5")
    step = {"input_ids": torch.randint(0, 50, (1, 16)), "decoder_input_ids": torch.randint(0, 50, (1, 1))}
    r = attnswitch.profile(t5, step, backends=["prefill=math/decode=naive"], iters=1, rounds=1, time_budget_s=0)
    assert r["prefill=math/decode=naive"].ok
