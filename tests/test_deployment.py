"""The answer for the lengths a deployment sees, in a form to ship: generate sweeps, a length mix read from a
file and charged per shape met first, the deploy snippet (run), and the policy file read back. Times come
from a fake clock (``conftest.fake_clock``): every figure here is exact."""

import dataclasses
import json
import random
import re
import warnings

import pytest
import torch
from conftest import tiny

import attnswitch
from attnswitch.comparison import compare_sweep, sweep_choice
from attnswitch.deploy import load_policy, write_policy
from attnswitch.lengths import Lengths, read_lengths
from attnswitch.models import load_model
from attnswitch.serving import serving_estimate

LAYERS = 2


def _sweep(model, lens, backends, new_tokens=4, **kw):
    return compare_sweep(model, [(1, n) for n in lens], mode="generate", new_tokens=new_tokens, backends=backends,
                         warmup=0, check_numerics=False, profile_steps=0, time_budget_s=0, **kw)


def test_a_generate_sweep_names_each_ranges_best_and_the_crossover(timed_kernel):
    # `short` is cheap per call but grows with the key length; `long` costs more per call and grows slower:
    # short wins at short prompts, long at long ones
    timed_kernel("short", lambda q, k: 2.0 + 0.2 * k.shape[2])
    timed_kernel("long", lambda q, k: 6.0 + 0.05 * k.shape[2])
    r = _sweep(tiny("llama"), [10, 60], ["short", "long"])
    assert [(p.seq, p.new_tokens, p.ties) for p in r.sweep] == [(10, 4, ("short",)), (60, 4, ("long",))]
    first, per_length = r.recommendation.splitlines()[:2]
    assert first.startswith(f"Use `{r.pick}` over prompt 10–60: the fastest (or tied) at 1 of 2 shapes")
    assert r.pick == r.deploy.pick and r.pick in ("short", "long")
    assert per_length == ("Best per length at batch 1, 4 new tokens: prompt 10: `short`; prompt "
                                                "60: `long`. Crossover between prompt 10 and 60, `long` overtakes "
                                                "`short`.")
    assert r.workload["prompt_lens"] == [10, 60] and r.workload["new_tokens"] == [4]
    assert [p.folder for p in r.sweep] == ["batch1_seq10_new4", "batch1_seq60_new4"]
    table = r.to_markdown()
    assert "| batch | new | prompt |" in table


def test_first_met_is_the_expected_count_of_shapes_a_run_meets_first():
    lengths = Lengths.of({10: 3, 12: 1})
    rng = random.Random(0)
    for requests in (1, 3, 20):
        runs = []
        for _ in range(4000):
            seen = set()
            for n in rng.choices([10, 12], weights=[3, 1], k=requests):
                seen.add(("prefill", n))
                seen.update(("decode", kv) for kv in range(n + 1, n + 4))
            runs.append(len(seen))
        assert lengths.first_met(requests, 4) == pytest.approx(sum(runs) / len(runs), rel=0.02)


def test_a_length_mix_charges_each_shape_met_first_and_the_pick_changes_at_the_stated_run_length(timed_kernel,
                                                                                                tmp_path):
    # `planner` is faster per call but pays 50 ms the first time it meets a shape, as a plan cache would;
    # `plain` pays nothing per shape
    seen = set()

    def planner(q, k):
        shape = (q.shape[2], k.shape[2])
        first = shape not in seen
        seen.add(shape)
        return 2.0 + (50.0 if first else 0.0)
    timed_kernel("planner", planner)
    timed_kernel("plain", lambda q, k: 3.0)
    hist = tmp_path / "lengths.json"
    hist.write_text(json.dumps({"10": 3, "12": 1}))
    lengths = read_lengths(hist)
    assert lengths.representative() == (10, 12)
    few = _sweep(tiny("llama"), lengths.representative(), ["planner", "plain"], lengths=lengths, requests=5)
    many = serving_estimate(few.sweep, lengths, 5000, 4)
    s = few.serving
    steady = {n: 4 * LAYERS * ms for n, ms in (("planner", 2.0), ("plain", 3.0))}  # 4 forwards a request
    assert s["steady_ms"] == pytest.approx(steady) and s["first_met_ms"] == pytest.approx({"planner": 50.0,
                                                                                        "plain": 0.0})
    # the first run length at which the planner's steady lead pays for the shapes it meets first
    flip = next(n for n in range(1, 10_000) if steady["planner"] + 50.0 * lengths.first_met(n, 4) / n < steady["plain"])
    assert [tuple(c) for c in s["changes"]] == [(flip, "plain", "planner")]
    assert s["pick"] == "plain" and many.pick == "planner" and many.changes == tuple(map(tuple, s["changes"]))
    assert f"From about {flip} requests `planner` is cheaper than `plain`." in few.recommendation
    assert few.deploy.pick == "plain" and sweep_choice(few.sweep, dataclasses.asdict(many)) == "planner"


def test_the_deploy_snippet_runs_and_the_recommended_op_runs(cpu_report):
    d = cpu_report.deploy
    assert d.pick == cpu_report.pick and "attnswitch.patch(model" in d.attnswitch
    model = tiny("llama")
    batch = {"input_ids": torch.randint(0, 100, (2, 8))}
    try:
        exec(d.attnswitch, {"model": model})  # the report's own text, as a user copies it
        assert attnswitch.is_patched(model) == cpu_report.pick
        with torch.profiler.profile() as prof, torch.no_grad():
            model(**batch)
    finally:
        attnswitch.unpatch(model)
    ops = {e.name for e in prof.events()}
    expected = {"flash": "aten::_scaled_dot_product_flash_attention_for_cpu",
                "math": "aten::_scaled_dot_product_attention_math", "naive": "aten::masked_fill"}[cpu_report.pick]
    assert expected in ops
    if d.plain:
        assert "sdpa_kernel" in d.plain and d.plain_loses


def test_a_generate_measured_with_a_static_cache_is_deployed_with_one():
    from attnswitch.deploy import deploy_info

    work = {"mode": "generate", "cache": "static", "prompt_lens": [8, 9], "batch": 1, "dtype": "bfloat16"}
    # (transformers compiles a static cache's decode steps itself unless told not to: the measurement tells it)
    call = 'model.generate(**inputs, cache_implementation="static", disable_compile=True)'
    d = deploy_info("flash", {}, work)
    assert d.plain.splitlines()[-1] == "    " + call and d.attnswitch.splitlines()[-1] == "# then, as measured: " + call
    compiled = deploy_info("flash+compile", {}, work).attnswitch.splitlines()
    assert compiled[-1] == "# then, as measured: " + call and "model.forward = forward" in compiled[-2]
    assert "with another KV cache than a static one" in d.remeasure
    keep = deploy_info("auto", {}, work, keep=True)
    assert keep.plain.splitlines() == ["model.set_attn_implementation('sdpa')", call]
    dynamic = deploy_info("flash", {}, {**work, "cache": "dynamic"})
    assert "cache_implementation" not in dynamic.plain + dynamic.attnswitch
    assert "with another KV cache than a dynamic one" in dynamic.remeasure
    uncached = deploy_info("flash", {}, {**work, "cache": "none"})  # (a model whose config keeps none)
    assert not any("KV cache" in line for line in uncached.remeasure)


def test_a_policy_round_trips_and_warns_once_where_it_was_measured_elsewhere(cpu_report, tmp_path):
    path = write_policy(cpu_report, tmp_path / "policy.json")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # measured here: no warning
        policy = load_policy(path)
        model, _ = load_model("tiny-llama", layers=2)  # the model measured
        policy.apply(model)
    assert policy.selection == cpu_report.pick and policy.environment["torch"] == torch.__version__
    try:
        assert attnswitch.is_patched(model) == cpu_report.pick
    finally:
        attnswitch.unpatch(model)
    doc = json.loads(path.read_text())
    doc["environment"].update(torch="1.0.0", gpu="a GPU measured elsewhere")
    other = tmp_path / "other.json"
    other.write_text(json.dumps(doc))
    with pytest.warns(UserWarning, match=r"measured with gpu a GPU measured elsewhere \(here none\), torch 1\.0\.0"):
        load_policy(other)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_policy(other)  # once per file



def test_a_policy_applied_to_a_model_of_another_shape_or_dtype_warns_naming_what_differs(cpu_report, tmp_path):
    path = write_policy(cpu_report, tmp_path / "policy.json")
    policy = load_policy(path)
    assert policy.workload["model_shape"] == {"model_type": "llama", "layers": 2, "heads": 8, "kv_heads": 2,
                                              "head_dim": 32}
    same, _ = load_model("tiny-llama")  # all 4 layers: the first layers' pick is measured for the whole
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        policy.apply(same)
        attnswitch.unpatch(same)
    other = tiny("qwen2")
    with pytest.warns(UserWarning, match=r"policy.json was measured on another model \(model type llama \(here "
                                         r"qwen2\), heads 8 \(here 4\), kv heads 2 \(here 4\), head dim 32 \(here "
                                         r"16\)\): the pick may not hold for this one"):
        policy.apply(other)
    attnswitch.unpatch(other)
    same.to(torch.bfloat16)
    with pytest.warns(UserWarning, match=r"another model \(dtype float32 \(here bfloat16\)\)"):
        with policy.backend(model=same):
            pass
    # a policy from before shapes were kept: nothing to compare, nothing said
    doc = json.loads(path.read_text())
    del doc["workload"]["model_shape"], doc["workload"]["dtype"]
    (tmp_path / "old.json").write_text(json.dumps(doc))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_policy(tmp_path / "old.json").apply(other)
        attnswitch.unpatch(other)


def test_a_models_shape_is_read_from_its_text_config_and_names_its_layer_kinds():
    from transformers import Gemma3Config

    from attnswitch.modelshape import differences, model_shape

    t5 = tiny("t5")
    assert model_shape(t5) == {"model_type": "t5", "layers": 2, "heads": 4, "kv_heads": 4,
                               "head_dim": t5.config.d_kv}
    assert model_shape(torch.nn.Linear(2, 2)) is None and differences({"heads": 4}, torch.nn.Linear(2, 2)) == []
    assert differences(None, t5) == [] and differences(model_shape(t5), t5) == []

    class Holder(torch.nn.Module):  # a composite model: its text config's attention
        config = Gemma3Config(text_config={"num_hidden_layers": 3, "layer_types": ["sliding_attention"] * 2 +
                                           ["full_attention"], "sliding_window": 8, "head_dim": 16,
                                           "num_attention_heads": 2, "num_key_value_heads": 1})

    shape = model_shape(Holder())
    assert shape["model_type"] == "gemma3" and shape["sliding_window"] == 8 and shape["head_dim"] == 16
    assert shape["layer_kinds"] == "full_attention, sliding_attention"
    assert differences({**shape, "sliding_window": None}, Holder()) == ["sliding window none (here 8)"]
    # the first layers of the same model (--num-layers): the same kinds, other counts, no difference
    first = {**shape, "layers": 2}
    assert differences(first, Holder()) == []
    assert differences({**shape, "layer_kinds": "full_attention"}, Holder()) == [
        "layer kinds full_attention (here full_attention, sliding_attention)"]
    assert differences({k: v for k, v in shape.items() if k != "layer_kinds"}, Holder()) == []  # (not said there)


def test_a_policy_measured_with_a_setting_that_changes_what_runs_warns_where_it_is_unset_or_other(cpu_report,
                                                                                                   tmp_path,
                                                                                                   monkeypatch):
    # written by write_policy from a report whose Deploy section says "Measured with NVIDIA_TF32_OVERRIDE=0": read
    # where it is unset, and where it has another value; the same setting here: no warning
    deploy = dataclasses.replace(cpu_report.deploy, env={"NVIDIA_TF32_OVERRIDE": "0"})
    report = dataclasses.replace(cpu_report, decision=dataclasses.replace(cpu_report.decision, deploy=deploy))
    for name in list(attnswitch.env.relevant_env()):  # (the suite's own OMP_NUM_THREADS: set here, not measured with)
        monkeypatch.delenv(name)
    for value, said in ((None, r"NVIDIA_TF32_OVERRIDE=0 \(here unset\)"),
                        ("1", r"NVIDIA_TF32_OVERRIDE=0 \(here NVIDIA_TF32_OVERRIDE=1\)"), ("0", None)):
        if value is None:
            monkeypatch.delenv("NVIDIA_TF32_OVERRIDE", raising=False)
        else:
            monkeypatch.setenv("NVIDIA_TF32_OVERRIDE", value)
        path = write_policy(report, tmp_path / f"policy-{value}.json")
        if said is None:
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                load_policy(path)
        else:
            with pytest.warns(UserWarning, match=said):
                load_policy(path)


def test_a_policy_measured_without_a_setting_warns_where_it_is_set(cpu_report, tmp_path, monkeypatch):
    # measured with no variable that changes what runs ("env": {}), deployed under NVIDIA_TF32_OVERRIDE=0
    deploy = dataclasses.replace(cpu_report.deploy, env={})
    report = dataclasses.replace(cpu_report, decision=dataclasses.replace(cpu_report.decision, deploy=deploy))
    for name in list(attnswitch.env.relevant_env()):
        monkeypatch.delenv(name)
    path = write_policy(report, tmp_path / "policy.json")
    monkeypatch.setenv("NVIDIA_TF32_OVERRIDE", "0")
    with pytest.warns(UserWarning, match=r"NVIDIA_TF32_OVERRIDE unset \(here NVIDIA_TF32_OVERRIDE=0\)"):
        load_policy(path)


@pytest.mark.parametrize("text, message", [
    ("512\nmany\n", ":2: expected one prompt length (a positive integer) a line, got 'many'"),
    ("512\n0\n", ":2: expected one prompt length"),
    ("{\"512\": 3,", "not valid JSON"),
    ("{\"512\": -1}", "counts of 0 or more"),
    ("[[512]]", "a JSON histogram is"),
    ("# nothing\n\n", "no prompt lengths"),
])
def test_a_bad_lengths_file_is_one_clear_line(text, message, tmp_path):
    p = tmp_path / "lens.txt"
    p.write_text(text)
    with pytest.raises(ValueError, match="lens.txt") as e:
        read_lengths(p)
    assert message in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("text, message", [
    ("not json", "not a policy file (not JSON)"),
    ("{\"schema\": 9, \"selection\": \"flash\"}", "not a policy file of schema 1"),
    ("{\"schema\": 1, \"selection\": \"flashy\"}", "unknown attention backend 'flashy'"),
])
def test_a_bad_policy_file_is_a_clear_exception(text, message, tmp_path):
    p = tmp_path / "policy.json"
    p.write_text(text)
    with pytest.raises(ValueError, match=re.escape(message)):
        load_policy(p)
    with pytest.raises(ValueError, match="cannot read it"):
        load_policy(tmp_path / "missing.json")


@pytest.mark.parametrize("fields, message", [
    ({"environment": "torch 2.0"}, "'environment' must be an object (or absent), not \"torch 2.0\""),
    ({"environment": [1, 2]}, "'environment' must be an object (or absent), not [1, 2]"),
    ({"environment": {"device": ["cuda"], "torch": "1.0"}},
     "'environment'.'device' must be a version or a name (or null), not [\"cuda\"]"),
    ({"environment": {"torch": {"version": "2.0"}}}, "'environment'.'torch' must be a version or a name"),
    ({"workload": 5}, "'workload' must be an object (or absent), not 5"),
    ({"env": ["x"]}, "'env' must be an object (or absent), not [\"x\"]"),
    ({"env": {"OMP_NUM_THREADS": {"a": 1}}}, "'env'.'OMP_NUM_THREADS' must be a string (or null), not {\"a\": 1}"),
    # the measured model's shape, which apply() compares: a damaged one used to skip the check or print odd words
    ({"workload": {"model_shape": "garbage"}}, "'workload'.'model_shape' must be an object, not \"garbage\""),
    ({"workload": {"model_shape": {"heads": "four"}}}, "'workload'.'model_shape' 'heads' must be a whole number"),
    ({"workload": {"model_shape": {"heads": True}}}, "'workload'.'model_shape' 'heads' must be a whole number"),
    ({"workload": {"model_shape": {"model_type": 3}}}, "'workload'.'model_shape' 'model_type' must be a name"),
    ({"workload": {"dtype": 5}}, "'workload'.'dtype' must be a dtype's name (or absent), not 5"),
    ({"ties": 3}, "'ties' must be a list of backend names (or absent), not 3"),
    ({"model": [1]}, "'model' must be a name (or absent), not [1]"),
    ({"selection": 7}, "'selection' must be a backend name or {\"prefill\": ..., \"decode\": ...}, not 7"),
    ({"selection": None}, "'selection' must be a backend name or {\"prefill\": ..., \"decode\": ...}, not null"),
    ({"selection": ["math"]}, "'selection' must be a backend name or {\"prefill\": ..., \"decode\": ...}, not "
                              "[\"math\"]"),
    ({"selection": ""}, "'selection': unknown attention backend ''"),
    ({"selection": {"prefill": 7, "decode": "flash"}}, "'selection': backend name must be a str"),
    ({"selection": {"prefill": "math", "decode": "flash", "decode_max_query": "x"}},
     "'selection': decode_max_query must be an int from 1 to 65536 (a decode step's query tokens), got 'x'"),
    ({"selection": {"prefill": "math"}}, "'selection': a backend policy needs both 'prefill' and 'decode'"),
    ({"schema": True}, "not a policy file of schema 1 ('schema' is true)"),
    ({"schema": 1.0}, "not a policy file of schema 1 ('schema' is 1.0)"),
    ({"schema": "1"}, "not a policy file of schema 1 ('schema' is \"1\")"),
])
def test_a_malformed_policy_field_is_one_line_naming_the_file_and_the_field(fields, message, tmp_path):
    p = tmp_path / "policy.json"
    p.write_text(json.dumps({"schema": 1, "selection": "math", **fields}))
    with pytest.raises(ValueError) as e:
        load_policy(p)
    said = str(e.value)
    assert type(e.value) in (ValueError,) and said.startswith(f"{p}: ") and message in said and "\n" not in said, said


def test_a_policy_file_may_leave_out_its_environment_and_workload_and_is_then_said_unchecked(tmp_path):
    p = tmp_path / "policy.json"
    p.write_text(json.dumps({"schema": 1, "selection": {"prefill": "math", "decode": "flash"}, "environment": None,
                             "workload": None}))
    with pytest.warns(UserWarning, match="has no record of the versions and the device it was measured with: the "
                                         "pick may not hold here"):
        policy = load_policy(p)
    assert policy.selection == {"prefill": "math", "decode": "flash"} and policy.environment == {} == policy.workload
    # an environment of nulls records nothing either; the settings that change what runs are checked all the same
    p = tmp_path / "nulls.json"  # (a file warns once)
    p.write_text(json.dumps({"schema": 1, "selection": "math", "environment": {"torch": None, "device": None},
                             "env": {"ATTNSWITCH_TEST_UNSET_VAR": "1"}}))
    with pytest.warns(UserWarning, match="was measured with ATTNSWITCH_TEST_UNSET_VAR=1 .here unset.* and has no "
                                         "record of the versions"):
        load_policy(p)


def _point(seq, rows, ties, compile_ms: float | None = None):
    """A generate sweep's length: ``rows`` of (backend, steady ms per request, new-shape step ms, seen-shape
    step ms, ops), one prompt per request; ``compile_ms``: a compiled candidate's compiles at this length."""
    from attnswitch.results import BackendResult, GenerateStats, SweepPoint
    backends = tuple(BackendResult(n, "ok", time_ms=ms, time_rounds_ms=((ms,),), noise_pct=1.0, attn_ops=ops,
                                   compile="default" if "+compile" in n else None,
                                   compile_ms=compile_ms if "+compile" in n else None,
                                   generate=GenerateStats(new_shape_step_ms=new, seen_shape_step_ms=seen))
                     for n, ms, new, seen, ops in rows)
    ranking = tuple(n for n, *_ in sorted(rows, key=lambda r: r[1]))
    return SweepPoint(4, seq, backends, ranking, ties, new_tokens=4)


CUDNN_OP = ("aten::_scaled_dot_product_cudnn_attention",)


def test_backends_tied_at_every_length_are_never_said_cheaper_on_their_medians():
    # flash and cudnn tied at both lengths (their medians 1 % apart, inside the noise): no run length makes
    # one "cheaper" than the other; efficient, told apart, stays behind
    pts = [_point(n, [("flash", 100.0 * k, 10.0, 10.0, ()), ("cudnn", 99.0 * k, 10.0, 10.0, ()),
                      ("efficient", 130.0 * k, 10.0, 10.0, ())], ("cudnn", "flash"))
           for n, k in ((256, 1), (1024, 2))]
    for requests in (1, 10, 10_000):
        s = serving_estimate(pts, Lengths.of({256: 3, 1024: 1}), requests, 4)
        assert s.changes == () and s.tied == ("cudnn", "flash") and s.same == ("flash",)
        assert s.pick in ("cudnn", "flash") and "as cheap" in " ".join(s.text())


def test_a_plan_cache_is_charged_to_every_candidate_of_its_kernel_family():
    # auto (which ran cuDNN's kernel) was measured first and paid 50 ms per new shape for the plans; cudnn,
    # measured after it on the same shapes, found them cached. Deployed alone, cudnn pays as auto did.
    pts = [_point(n, [("auto", 100.0, 60.0, 10.0, CUDNN_OP), ("cudnn", 100.0, 10.5, 10.0, CUDNN_OP),
                      ("flash", 100.0, 10.0, 10.0, ())], ("auto", "cudnn", "flash"))
           for n in (256, 1024)]
    s = serving_estimate(pts, Lengths.of({256: 1, 1024: 1}), 10, 4)
    assert s.first_met_ms["cudnn"] == s.first_met_ms["auto"] == 50.0 and s.first_met_ms["flash"] == 0.0
    assert s.pick == "flash" and s.changes == ()  # tied steady: the shapes met first decide, at any run length


def test_a_compiled_twins_compiles_are_charged_once_per_run_and_not_to_the_uncompiled_backend():
    # flash+compile's first length compiled (a static graph, then one of dynamic shapes: 1780 ms, its Compiled
    # table's), its second length 20 ms more (a recompile new to the process): a run pays the compiles once, not
    # per new shape; eager flash shares no such cache with it
    rows = [("flash+compile", 90.0, 900.0, 10.0, ()), ("flash", 100.0, 10.0, 10.0, ()), ("math", 101.0, 10.0, 10.0, ())]
    pts = [_point(256, rows, ("flash+compile",), compile_ms=1760.0),
           _point(1024, [("flash+compile", 90.0, None, 10.0, ()), *rows[1:]], ("flash+compile",), compile_ms=20.0)]
    s = serving_estimate(pts, Lengths.of({256: 1, 1024: 1}), 10, 4)
    # its prompts run eager flash (a generate compiles its decode steps only), which paid nothing
    assert s.first_met_ms["flash"] == 0.0 == s.first_met_ms["flash+compile"]
    assert s.once_ms == {"flash+compile": 1780.0}
    assert s.per_request_ms["flash+compile"] == pytest.approx(90.0 + 1780.0 / 10)
    assert "`flash` pays" not in " ".join(s.text()) and s.pick == "flash"
    more = serving_estimate(pts, Lengths.of({256: 1, 1024: 1}), 1000, 4)  # over more requests it pays off
    assert more.pick == "flash+compile" and "pays its compiles once per run: 1780.000 ms." in " ".join(more.text())


def test_a_policy_per_phase_is_charged_its_phases_plan_caches():
    # measured after cudnn and flash, the policy met their caches warm; deployed, it pays cudnn's plans on the
    # prompt lengths it meets first (its decode steps run flash)
    pts = [_point(n, [("cudnn", 100.0, 60.0, 10.0, ()), ("flash", 100.0, 10.0, 10.0, ()),
                      ("prefill=cudnn/decode=flash", 100.0, 10.0, 10.0, ())],
                  ("cudnn", "flash", "prefill=cudnn/decode=flash")) for n in (256, 1024)]
    s = serving_estimate(pts, Lengths.of({256: 1, 1024: 1}), 10, 4)
    assert s.first_met_phase_ms["prefill=cudnn/decode=flash"] == (50.0, 0.0) and s.pick == "flash"


def test_the_kernel_families_a_candidate_runs():
    from attnswitch.backends import kernel_families
    assert kernel_families("cudnn") == ("cudnn",) and kernel_families("flash+compile") == ("flash",)
    assert kernel_families("auto", CUDNN_OP) == ("cudnn",) and kernel_families("auto") == ()
    assert kernel_families("prefill=cudnn/decode=flash") == ("cudnn", "flash")
    assert kernel_families("prefill=auto/decode=naive", CUDNN_OP) == ("cudnn",)
    assert kernel_families("naive") == () and kernel_families("my-kernel", ("my_op",)) == ()


def test_the_measured_with_line_names_what_changes_a_run_not_how_the_image_was_built():
    from attnswitch.env import relevant_env

    started = {"CUDA_VISIBLE_DEVICES": "0", "CUDA_LAUNCH_BLOCKING": "1", "TORCHINDUCTOR_CACHE_DIR": "/c",
               "NVIDIA_TF32_OVERRIDE": "0", "OMP_NUM_THREADS": "4", "PYTORCH_CUDA_ALLOC_CONF": "expandable",
               "CUDA_HOME": "/usr/local/cuda", "CUDAHOSTCXX": "/opt/gcc/bin/g++", "CUDA_VERSION": "13.0.2",
               "NCCL_VERSION": "2.28.3-1", "TORCH_CUDA_ARCH_LIST": "9.0a", "HF_TOKEN": "hf_x", "CUDA_API_KEY": "k",
               "PYTORCH_BUILD_NUMBER": "1", "TORCH_NVCC_FLAGS": "-Xfatbin", "CUDNN_LIB_DIR": "/l",
               "CUDA_TOOLKIT_ROOT_DIR": "/t",
               "HOME": "/root"}
    assert relevant_env(started) == {k: started[k] for k in (
        "CUDA_LAUNCH_BLOCKING", "CUDA_VISIBLE_DEVICES", "NVIDIA_TF32_OVERRIDE", "OMP_NUM_THREADS",
        "PYTORCH_CUDA_ALLOC_CONF", "TORCHINDUCTOR_CACHE_DIR")}


def test_measured_with_names_the_users_settings_not_attnswitchs_own_nor_inductors_default(monkeypatch):
    # the command sets TORCHINDUCTOR_COMPILE_THREADS=1 for itself and inductor its default cache folder, torchrun
    # its own TORCHELASTIC_* variables: none is the user's (a Deploy line naming them told the user to set them);
    # what the user sets, before or after importing attnswitch, is reported as it is when measured
    import torch._inductor.runtime.cache_dir_utils  # noqa: F401  (loaded, as inductor is where it set the folder)

    from attnswitch import _own_env
    from attnswitch.env import _inductor_default_cache, relevant_env

    for k in [k for k in __import__("os").environ if k.startswith(("TORCHINDUCTOR", "TORCHELASTIC"))]:
        monkeypatch.delenv(k)
    monkeypatch.setattr(_own_env, "OWN", set())
    monkeypatch.setattr("attnswitch.env.OWN", _own_env.OWN)
    _own_env.set_default("TORCHINDUCTOR_COMPILE_THREADS", "1")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "abc")
    assert _inductor_default_cache() is not None
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", _inductor_default_cache())
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")  # the user's, set after the import
    got = relevant_env()
    assert got.get("PYTORCH_CUDA_ALLOC_CONF") == "expandable_segments:True"
    assert not any(k.startswith(("TORCHINDUCTOR", "TORCHELASTIC")) for k in got), got
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/my/cache")  # a folder the user chose is theirs
    monkeypatch.setenv("TORCHINDUCTOR_COMPILE_THREADS", "1")
    _own_env.OWN.clear()  # set by the user this time
    assert {"TORCHINDUCTOR_CACHE_DIR", "TORCHINDUCTOR_COMPILE_THREADS"} <= set(relevant_env())
    monkeypatch.delenv("TORCHINDUCTOR_COMPILE_THREADS")
    _own_env.set_default("TORCHINDUCTOR_COMPILE_THREADS", "1")
    assert "TORCHINDUCTOR_COMPILE_THREADS" not in relevant_env()


def test_cudnns_version_is_printed_as_its_release_wherever_a_report_names_it():
    # torch reports cuDNN as one integer (91900); a reader compares it with release notes that say 9.19.0
    from attnswitch._versions import version_text
    from attnswitch.deploy import deploy_info
    from attnswitch.render.sections import Options, _deploy, about

    env = {"gpu": "NVIDIA H200", "torch": "2.11.0+cu130", "cudnn": 91900, "transformers": "5.17.0"}
    assert version_text("cudnn", 91900) == "9.19.0" and version_text("cudnn", 8907) == "8.9.7"
    assert version_text("torch", "2.11.0+cu130") == "2.11.0+cu130" and version_text("cudnn", None) == "None"
    d = deploy_info("flash", env, {"mode": "prefill", "batch": 1, "seq": 128, "dtype": "bfloat16"})
    assert any("another cudnn than 9.19.0" in line for line in d.remeasure) and "91900" not in " ".join(d.remeasure)
    report = type("R", (), {"environment": env, "deploy": d,
                            "workload": {"description": "batch 1, seq 128", "dtype": "bf16"}})()
    text = " ".join(getattr(b, "text", "") or "" for b in _deploy(report, Options()).blocks)
    assert "cudnn 9.19.0" in text and "91900" not in text
    assert "cuDNN 9.19.0" in about(report)
    from attnswitch.render.sections import environment_table
    rows = dict(environment_table(type("R", (), {"environment": env, "workload": {}, "settings": {},
                                                 "distribution": None})()).rows)
    assert rows["cudnn"] == "9.19.0"


def test_what_inductor_sets_in_its_process_as_it_compiles_is_not_measured_with(monkeypatch):
    # inductor sets TRITON_CACHE_DIR, TRITON_PTXAS_PATH, TORCH_WARM_POOL, ... in the measuring process once it
    # compiles (flex, --compile): a Deploy line naming them, or a policy warning that they are unset where it is
    # deployed, would be about torch's doing, not the user's. One the user set before importing attnswitch stays
    from attnswitch import _own_env
    from attnswitch.env import relevant_env

    monkeypatch.setattr("attnswitch.env.BY_TORCH", frozenset({"TRITON_CACHE_DIR"}))
    monkeypatch.setenv("TRITON_CACHE_DIR", "/tmp/torchinductor_root/triton/0/abc")
    assert "TRITON_CACHE_DIR" not in relevant_env()
    monkeypatch.setattr("attnswitch.env.BY_TORCH", frozenset())  # set before attnswitch was imported: the user's
    assert relevant_env()["TRITON_CACHE_DIR"] == "/tmp/torchinductor_root/triton/0/abc"
    assert _own_env.BY_TORCH <= {"TRITON_CACHE_DIR", "TRITON_PTXAS_PATH", "TRITON_LIBDEVICE_PATH", "TORCH_WARM_POOL",
                                 "CUBLAS_WORKSPACE_CONFIG"}


def test_a_compiled_generates_deploy_code_compiles_the_decoders_one_token_steps_as_measured():
    # an encoder-decoder's generate passes decoder_input_ids (and no input_ids) to its forward: the measurement
    # compiles each one-token decoder step (clock.query_length), so must the code a user pastes
    from types import SimpleNamespace as NS

    from attnswitch.deploy import _DECODE_ONLY
    from attnswitch.profiling.clock import query_length

    ran = []
    model = NS(forward=lambda *a, **k: ran.append("eager"))
    fake_torch = NS(compile=lambda fn, **kw: (lambda *a, **k: ran.append("compiled")))
    exec(_DECODE_ONLY.format(arg=""), {"model": model, "torch": fake_torch})
    ids = torch.ones(2, 1, dtype=torch.long)
    steps = [{"decoder_input_ids": ids, "encoder_outputs": object()},  # T5's, in generate
             {"input_ids": ids}, {"input_ids": torch.ones(2, 7, dtype=torch.long)},  # a decoder's step, its prefill
             {"input_ids": torch.ones(2, 7, dtype=torch.long), "decoder_input_ids": ids}]
    for kw in steps:
        model.forward(**kw)
    assert ran == ["compiled" if query_length((), kw) == 1 else "eager" for kw in steps] == \
        ["compiled", "compiled", "eager", "compiled"]
