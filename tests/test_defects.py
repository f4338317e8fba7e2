"""Known defects: a versioned table checked against a report's versions, GPU, measured calls and every deployed
length; a backend a row makes wrong where the workload runs is never recommended, and the answer's first lines say
why. Versions, GPUs and shapes are faked: the rules are driven one by one.
"""

import contextlib
import dataclasses
import io
import json
import subprocess
import sys

import pytest

from attnswitch import cli, defects
from attnswitch.decision import decide, decide_sweep
from attnswitch.defects import Defect, Stack, applies_to, check, in_range, version_of
from attnswitch.peak import AttnShape, call_flops
from attnswitch.profiling.rounds import Timing
from attnswitch.profiling.summarize import with_timing
from attnswitch.ranking import verdict
from attnswitch.render.console import to_text
from attnswitch.render.markdown import to_markdown
from attnswitch.results import BackendResult, Report, SweepPoint

#: the stacks the reports name: torch 2.13 with cuDNN 9.20 on an H200; the H200 measured here (cuDNN 9.19)
H200_920 = {"torch": "2.13.0+cu130", "cudnn": 92000, "compute_capability": "9.0", "gpu": "NVIDIA H200"}
H200_919 = {**H200_920, "torch": "2.11.0+cu130", "cudnn": 91900}
B200 = {"torch": "2.13.0+cu130", "cudnn": 92000, "compute_capability": "10.0", "gpu": "NVIDIA B200"}
TRAIN = {"mode": "train", "batch": 2, "seq": 1088, "dtype": "bfloat16"}
PREFILL = {"mode": "prefill", "batch": 2, "seq": 1088, "dtype": "bfloat16"}
GENERATE = {"mode": "generate", "batch": 1, "prompt_lens": [1000], "new_tokens": 100, "dtype": "bfloat16"}


def shape(q=1088, kv=None, *, kv_min=None, mask=True, heads=16, kv_heads=16, d=128, window=None, dtype="bfloat16",
          site="model.layers.0.self_attn"):
    kv = q if kv is None else kv
    return AttnShape(site, 1.0, 2, heads, kv_heads, q, kv, kv if kv_min is None else kv_min, d, d, dtype, q > 1,
                     window, mask, flops=call_flops(2, heads, q, kv, d, d, q > 1, window))


def ran(name, *shapes, rounds=(10.0,) * 6, **kw):
    t = Timing(samples=list(rounds), units=[[x] for x in rounds])
    return with_timing(BackendResult(name, "ok", timer="cuda-events", attn_calls=2.0, attn_shapes=tuple(shapes),
                                     **kw), t)


def row(ident):
    return next(d for d in defects.table() if d.id == ident)


def test_the_table_holds_the_reported_defects_with_their_versions_and_conditions():
    ids = [d.id for d in defects.table()]
    assert ids[:4] == ["pytorch#196678", "pytorch#193893", "NVIDIA/cudnn-frontend#1072", "NVIDIA-NeMo/Automodel#3232"]
    d = row("pytorch#196678")
    assert (d.backend, d.direction, d.torch, d.cudnn, d.gpus) == ("cudnn", "backward", ">=2.11,<2.14", ">=9.20,<9.21",
                                                                 ("sm90",))
    assert d.when == {"kv_len_mod": [128, 64], "mask": True} and "-88.7" in d.also
    assert "https://github.com/huggingface/trl/issues/7181" in d.refs
    assert row("pytorch#193893").gpus == ("sm100",) and row("pytorch#193893").when == {"kv_heads_below": 8}
    assert row("NVIDIA/cudnn-frontend#1072").cudnn == ">=9.25,<9.27"
    assert row("NVIDIA-NeMo/Automodel#3232").when["head_dim"] == [256]
    for d in defects.table():  # every row is public, and says what it breaks
        assert d.refs and all(r.startswith("https://github.com/") for r in d.refs) and d.effect


@pytest.mark.parametrize("value,expected", [("2.13.0+cu130", (2, 13, 0)), ("2.11", (2, 11)), (92000, (9, 20, 0)),
                                            (91900, (9, 19, 0)), (8907, (8, 9, 7)), ("9.20", (9, 20)), (None, None)])
def test_versions_as_torch_and_cudnn_give_them(value, expected):
    assert version_of(value) == expected


def test_ranges_hold_their_bounds():
    assert in_range((9, 20, 0), ">=9.20,<9.21") and in_range((9, 20, 48), ">=9.20,<9.21")
    assert not in_range((9, 19, 0), ">=9.20,<9.21") and not in_range((9, 21, 0), ">=9.20,<9.21")
    assert in_range((2, 13, 1), ">=2.11,<2.14") and not in_range((2, 14, 0), ">=2.11,<2.14")
    assert in_range(None, None) and not in_range(None, ">=9.20")
    with pytest.raises(ValueError, match="like '>=2.11,<2.14'"):
        in_range((1,), "2.11+")


@pytest.mark.parametrize("env,applies", [
    (H200_920, True),
    (H200_919, False),  # cuDNN 9.19: measured clean on the H200
    ({**H200_920, "cudnn": 92100}, False),
    ({**H200_920, "torch": "2.14.0"}, False),
    ({**H200_920, "torch": "2.10.0"}, False),
    ({**H200_920, "compute_capability": "8.0", "gpu": "NVIDIA A100-SXM4-80GB"}, False),
    (B200, False),
    ({"torch": "2.13.0", "cudnn": None, "compute_capability": None}, False),  # a CPU
])
def test_versions_and_the_gpu_decide_whether_196678_applies(env, applies):
    assert (applies_to(row("pytorch#196678"), defects.stack_of(env)) is None) == applies


def levels(result, env, workload, deployed=()):
    return [(m.id, m.level, m.lengths) for m in check(result, env, workload, deployed)]


def test_196678_makes_cudnn_wrong_in_a_training_step_at_a_length_64_mod_128_with_a_mask():
    assert levels(ran("cudnn", shape(1088)), H200_920, TRAIN) == [("pytorch#196678", "wrong", (1088,))]
    # another remainder: a caution for the lengths the comparison did not meet; none without a mask
    assert levels(ran("cudnn", shape(1024)), H200_920, TRAIN) == [("pytorch#196678", "nearby", ())]
    assert levels(ran("cudnn", shape(1088, mask=False)), H200_920, TRAIN) == []
    # cuDNN 9.19 (the H200 measured here): nothing; flash: nothing
    assert levels(ran("cudnn", shape(1088)), H200_919, TRAIN) == []
    assert levels(ran("flash", shape(1088)), H200_920, TRAIN) == []
    # a prefill runs no backward: a caution that does not decide, saying where it would
    assert levels(ran("cudnn", shape(1088)), H200_920, PREFILL) == [("pytorch#196678", "unrun", (1088,))]


def test_every_deployed_length_is_checked_not_only_those_measured():
    measured = ran("cudnn", shape(1024))
    assert levels(measured, H200_920, TRAIN, deployed=[1024, 2048]) == [("pytorch#196678", "nearby", ())]
    assert levels(measured, H200_920, TRAIN, deployed=[1024, 1088, 2112, 4096]) == \
        [("pytorch#196678", "wrong", (1088, 2112))]


def test_decode_steps_meet_every_key_length_from_the_prompt_to_its_last_token():
    decode = shape(1, 1100, kv_min=1001)  # a profiled generate's decode steps, prompt 1000, 100 new tokens
    assert levels(ran("cudnn", decode), H200_920, GENERATE) == [("pytorch#196678", "unrun", (1024 + 64,))]
    # a deployed prompt of 4000 with 100 new tokens meets 4001..4100: 4032 (31 x 128 + 64) is among them
    far = ran("cudnn", shape(1, 1010, kv_min=1001))
    assert levels(far, H200_920, GENERATE, deployed=[4000]) == [("pytorch#196678", "unrun", (4032,))]


@pytest.mark.parametrize("kv_heads,workload,found", [(4, GENERATE, [("pytorch#193893", "wrong", (1088,))]),
                                                    (2, {"mode": "decode"}, [("pytorch#193893", "wrong", (1088,))]),
                                                    (8, GENERATE, []),
                                                    (4, PREFILL, [("pytorch#193893", "unrun", (1088,))])])
def test_193893_corrupts_generation_on_b200_with_fewer_than_8_kv_heads(kv_heads, workload, found):
    assert levels(ran("cudnn", shape(1088, mask=False, kv_heads=kv_heads)), B200, workload) == found
    assert levels(ran("cudnn", shape(1088, mask=False, kv_heads=kv_heads)), H200_920, workload) == []


def test_1072_is_one_query_row_against_128_keys_on_cudnn_925_and_926():
    env = {**H200_920, "cudnn": 92600}
    one_row = shape(1, 128, mask=False, d=64, heads=2, kv_heads=2)
    assert levels(ran("cudnn", one_row), env, TRAIN) == [("NVIDIA/cudnn-frontend#1072", "wrong", (128,))]
    assert levels(ran("cudnn", shape(1, 97, mask=False, d=64)), env, TRAIN) == \
        [("NVIDIA/cudnn-frontend#1072", "nearby", ())]
    assert levels(ran("cudnn", one_row), {**env, "cudnn": 92400}, TRAIN) == []


def test_3232_is_gemmas_sliding_window_layers_with_head_dim_256_in_bf16():
    env = {**H200_919, "torch": "2.11.0"}  # no versions named: any
    sliding = shape(2048, d=256, window=512)
    assert levels(ran("cudnn", sliding), env, TRAIN) == [("NVIDIA-NeMo/Automodel#3232", "wrong", (2048,))]
    assert levels(ran("cudnn", shape(2048, d=256)), env, TRAIN) == []  # a full layer
    assert levels(ran("cudnn", dataclasses.replace(sliding, dtype="float16")), env, TRAIN) == []


def test_auto_and_a_policy_are_checked_for_the_kernels_they_run():
    cudnn_ops = ("aten::_scaled_dot_product_cudnn_attention",)
    assert levels(ran("auto", shape(1088), attn_ops=cudnn_ops), H200_920, TRAIN)[0][:2] == ("pytorch#196678", "wrong")
    assert levels(ran("auto", shape(1088), attn_ops=("aten::_scaled_dot_product_flash_attention",)), H200_920,
                  TRAIN) == []
    # prefill=cudnn/decode=flash: the decode steps are flash's (#1072 is one query row), the prefill cudnn's
    env = {**H200_920, "cudnn": 92600}
    calls = (shape(1, 128, mask=False, d=64), shape(128, mask=True, d=64))
    assert levels(ran("prefill=cudnn/decode=flash", *calls), env, TRAIN) == []
    assert levels(ran("prefill=flash/decode=cudnn", *calls), env, TRAIN)[0][:2] == ("NVIDIA/cudnn-frontend#1072",
                                                                                  "wrong")


def test_a_compiled_candidate_is_checked_at_the_calls_another_candidate_recorded():
    other = ran("flash", shape(1088))
    compiled = ran("cudnn+compile")
    assert check(compiled, H200_920, TRAIN) == ()
    assert [m.id for m in check(compiled, H200_920, TRAIN, shapes=other.attn_shapes)] == ["pytorch#196678"]


def judged(results, env, workload, deployed=()):
    return [dataclasses.replace(b, defects=check(b, env, workload, deployed)) for b in results]


def report_of(results, workload, env):
    d, v = decide(results, verdict(results), workload, env)
    return Report(tuple(results), env, workload, {}, model="m", ranking=v.order, decision=d)


def test_a_backend_a_defect_makes_wrong_is_never_recommended_and_the_first_line_after_the_answer_says_why():
    fast, slow = [9.0, 9.1, 8.9, 9.0, 9.2, 9.0], [10.0, 10.1, 9.9, 10.0, 10.2, 10.0]
    results = judged([ran("cudnn", shape(1088), rounds=fast), ran("flash", shape(1088), rounds=slow)], H200_920,
                     TRAIN)
    r = report_of(results, TRAIN, H200_920)
    assert r.pick == "flash" and "cudnn" not in r.ranking
    first = r.decision.reasons[0]
    assert first.startswith("`cudnn` is not recommended: pytorch#196678 (backward: grad_q is NaN")
    assert "torch 2.13.0, cuDNN 9.20.0, NVIDIA H200 (sm90)" in first and "key lengths 1088" in first
    assert first in r.cautions
    for text in (to_text(r), to_markdown(r)):  # every writer: in the answer, and in its own section
        assert first in text and "Known defects" in text and "wrong here: never recommended" in text
    # the same results on cuDNN 9.19: cudnn is the pick
    clean = judged([ran("cudnn", shape(1088), rounds=fast), ran("flash", shape(1088), rounds=slow)], H200_919,
                   TRAIN)
    assert report_of(clean, TRAIN, H200_919).pick == "cudnn"


def test_when_every_backend_is_wrong_the_answer_is_none_and_says_why():
    results = judged([ran("cudnn", shape(1088))], H200_920, TRAIN)
    r = report_of(results, TRAIN, H200_920)
    assert r.decision.answer == "none" and r.decision.reasons[0].startswith("`cudnn` is not recommended")


def test_a_sweep_says_it_once_over_every_shape_first():
    work = {**GENERATE, "prompt_lens": [1000, 2000]}
    points, verdicts = [], []
    for n in (1000, 2000):
        res = judged([ran("cudnn", shape(n, mask=False), shape(1, n + 50, kv_min=n + 1)),
                      ran("flash", shape(n, mask=False), shape(1, n + 50, kv_min=n + 1))], H200_920, work,
                     deployed=[1000, 1980, 2000])
        v = verdict(res)
        points.append(SweepPoint(1, n, tuple(res), v.order, v.ties, new_tokens=100))
        verdicts.append(v)
    d, _, _ = decide_sweep(points, verdicts, list(points[-1].backends), work, H200_920, None, [],
                           verdicts[-1].cautions)
    first = d.reasons[0]
    assert first.startswith("Caution on `cudnn`: pytorch#196678") and "met here at key lengths 1088, 1984" in first
    assert sum("pytorch#196678" in x for x in d.reasons) == 1 and d.cautions[0] == first


def test_attnswitch_defects_lists_the_table_and_which_rows_apply_without_importing_torch():
    code = ("import sys; from attnswitch import cli; rc = cli.main(['defects', '--torch', '2.13.0', '--cudnn', "
            "'9.20', '--arch', 'sm90']); print('torch' in sys.modules); sys.exit(rc)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert text.startswith("Known defects: 4 in attnswitch's table; 2 apply to torch 2.13.0, cuDNN 9.20, sm90.")
    assert "pytorch#196678  [applies here]" in text and "pytorch#193893  [not here: GPU sm90, not sm100]" in text
    assert "https://github.com/huggingface/trl/issues/7181" in text and text.strip().endswith("False")


def test_attnswitch_defects_here_reads_this_machine_and_bad_versions_are_bad_input():
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        assert cli.main(["defects"]) == cli.EXIT_OK
        assert cli.main(["defects", "--cudnn", "nine"]) == cli.EXIT_BAD_INPUT
    assert "Known defects: 4" in out.getvalue() and "--cudnn: a version is like" in err.getvalue()


def test_defects_refuses_a_cudnn_version_that_is_none():
    assert cli.main(["defects", "--cudnn", "-1"]) == cli.EXIT_BAD_INPUT  # a wrong answer: read as "cuDNN 1", exit 0


def test_defects_refuses_a_cudnn_version_that_is_neither_form_it_names(capsys):
    # --help: "this cuDNN version, 9.20 or 92000". torch's integer 920 is read (0, 9, 20) and 0 is no version
    # (version_of(0) is None), so as text both are refused too. A wrong answer would read "Known defects: 4 in
    # attnswitch's table; 1 apply to torch 2.13.0, cuDNN 920, sm100." (every range ">=9.19" holds 920) and for
    # `--cudnn 0` "... cuDNN 0, sm100.", both exit 0
    for given in ("920", "0"):
        code = cli.main(["defects", "--torch", "2.13.0", "--cudnn", given, "--arch", "sm100"])
        printed = capsys.readouterr().out
        assert code == cli.EXIT_BAD_INPUT, (given, printed.splitlines()[:1])


def test_defects_reads_nvccs_spelling_of_hopper_as_hopper(capsys):
    cli.main(["defects", "--torch", "2.13.0", "--cudnn", "9.20", "--arch", "sm90"])
    hopper = capsys.readouterr().out
    code = cli.main(["defects", "--torch", "2.13.0", "--cudnn", "9.20", "--arch", "sm_90a"])
    out = capsys.readouterr().out
    # H100/H200 are sm_90a; a wrong answer: "0 apply to torch 2.13.0, cuDNN 9.20, sm90a" / "[not here: GPU sm90a,
    # not sm90]"
    assert code == 0 and out.splitlines()[0] == hopper.splitlines()[0]  # sm_90a is read as sm90: the same GPUs


def test_a_table_row_with_an_unknown_condition_is_refused():
    bad = {"defects": [{"id": "x#1", "backend": "cudnn", "direction": "backward", "effect": "e",
                        "when": {"seq_mod": [128, 64]}}]}
    with pytest.raises(ValueError, match="unknown key"):
        defects.load(json.dumps(bad))
    assert isinstance(defects.load(json.dumps({"defects": []})), tuple)
    here = Stack((2, 13, 0), (9, 20, 0), "sm90", "NVIDIA H200")
    assert here.text() == "torch 2.13.0, cuDNN 9.20.0, NVIDIA H200 (sm90)"
    assert isinstance(row("pytorch#196678"), Defect)


@pytest.mark.parametrize("direction", ["backward", "generate"])
def test_a_length_mix_that_crosses_64_mod_128_under_a_matching_version_gets_the_caution_first(tmp_path, monkeypatch,
                                                                                            capsys, direction):
    import attnswitch.profiling as profiling

    # pytorch#196678 as the table has it, for flash (cuDNN does not run on a CPU) and without its mask (a CPU's
    # decode steps carry none); the versions and the GPU of the reports. As a generate's defect, it rules flash out
    d = dataclasses.replace(row("pytorch#196678"), backend="flash", when={"kv_len_mod": [128, 64]},
                            direction=direction)
    monkeypatch.setattr(defects, "table", lambda: (d,))
    here = profiling.environment
    monkeypatch.setattr(profiling, "environment", lambda device=None: {**here(device), **H200_920})
    # measured at its representative lengths (40 to 46: none of their key lengths is 64 mod 128); 58 is deployed
    # too, and its decode steps meet key lengths 59 to 66
    mix = tmp_path / "lengths.json"
    mix.write_text(json.dumps({"40": 3, "41": 2, "42": 2, "43": 2, "44": 2, "45": 2, "46": 2, "58": 1}))
    out = tmp_path / "out"
    backends = "flash" if direction == "backward" else "flash,math"
    rc = cli.main(["compare", "tiny-llama", "--mode", "generate", "--prompt-lens-from", str(mix), "--new-tokens", "8",
                   "--backends", backends, "--iters", "1", "--time-budget", "0", "--no-numerics", "--out", str(out)])
    assert rc == cli.EXIT_OK
    report = json.loads((out / "report.json").read_text())
    assert [p["seq"] for p in report["sweep"]] == [40, 41, 43, 45, 46]
    first = report["decision"]["reasons"][0]
    assert f"pytorch#196678 ({direction}: grad_q is NaN" in first and "met here at key lengths 64" in first
    assert "torch 2.13.0, cuDNN 9.20.0, NVIDIA H200 (sm90)" in first
    if direction == "backward":
        assert first.startswith("Caution on `flash`:") and "this workload runs no backward" in first
        assert report["decision"]["pick"] == "flash"
    else:
        assert first.startswith("`flash` is not recommended:") and report["decision"]["pick"] == "math"
        assert all("flash" not in p["ranking"] for p in report["sweep"])
    printed = capsys.readouterr().out.splitlines()
    head = next(i for i, line in enumerate(printed) if line.startswith("Recommendation:"))
    assert printed[head + 1].strip() == first
