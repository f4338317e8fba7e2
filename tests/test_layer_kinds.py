"""A backend per layer kind: sliding and full layers (Gemma 3, Qwen2, GPT-OSS), encoder, decoder and cross
attention (T5, Whisper), a composite model's sub-models. Each call runs its kind's backend, forced (the profiler's
ops say which kernel ran where); outputs match the model's own attention; restore, isolation and compile hold
as for one backend, and so do a model and its sub-model switched per kind in turn and a layer appended after a
switch; a selection per kind that cannot be honoured is refused with a reason; and ``compare`` measures the
candidate of each kind's fastest backend, a kind that made no call left out (CPU, random weights)."""

import threading

import pytest
import torch
from transformers import (
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    GptOssConfig,
    GptOssForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    T5Config,
    T5ForConditionalGeneration,
    WhisperConfig,
    WhisperForConditionalGeneration,
)

import attnswitch
from attnswitch import cli
from attnswitch.candidate import Candidate, Kinds, parse
from attnswitch.profiling import perkind
from attnswitch.results import BackendResult, LayerStats

OPS = {"flash": "aten::_scaled_dot_product_flash_attention_for_cpu",
       "math": "aten::_scaled_dot_product_attention_math"}


def _gemma3():
    torch.manual_seed(0)
    return Gemma3ForCausalLM(Gemma3TextConfig(vocab_size=101, hidden_size=64, intermediate_size=128,
                                              num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=1,
                                              head_dim=16, sliding_window=8)).eval()


def _qwen2():
    torch.manual_seed(0)
    return Qwen2ForCausalLM(Qwen2Config(vocab_size=101, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                                        num_attention_heads=4, num_key_value_heads=2, use_sliding_window=True,
                                        sliding_window=8, max_window_layers=2)).eval()


def _gpt_oss():
    torch.manual_seed(0)
    return GptOssForCausalLM(GptOssConfig(vocab_size=101, hidden_size=64, intermediate_size=64, num_hidden_layers=2,
                                          num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                          num_local_experts=2, num_experts_per_tok=1, sliding_window=8)).eval()


def _t5():
    torch.manual_seed(0)
    return T5ForConditionalGeneration(T5Config(vocab_size=101, d_model=64, d_kv=16, d_ff=128, num_layers=2,
                                               num_heads=4)).eval()


def _whisper():
    torch.manual_seed(0)
    return WhisperForConditionalGeneration(WhisperConfig(
        vocab_size=101, d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, num_mel_bins=16, max_source_positions=16, max_target_positions=32, pad_token_id=0,
        bos_token_id=1, eos_token_id=2, decoder_start_token_id=1)).eval()


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


def _inputs(name, m):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 101, (2, 24), generator=g)
    if name == "t5":
        return {"input_ids": ids, "decoder_input_ids": ids[:, :10]}
    if name == "whisper":
        return {"input_features": torch.randn(2, 16, 32, generator=g), "decoder_input_ids": ids[:, :10]}
    return {"input_ids": ids}


MODELS = {  # the model, its kinds, and a backend per kind that honours what each kind's calls carry
    "gemma3": (_gemma3, {"sliding_attention": 5, "full_attention": 1},
               {"sliding_attention": "naive", "full_attention": "flash"}),
    "qwen2": (_qwen2, {"full_attention": 2, "sliding_attention": 2},
              {"sliding_attention": "math", "full_attention": "flash"}),
    "gpt_oss": (_gpt_oss, {"sliding_attention": 1, "full_attention": 1},  # sinks: the hand-written backends alone
                {"sliding_attention": "naive", "full_attention": "naive-inplace"}),
    "t5": (_t5, {"encoder": 2, "decoder": 2, "cross": 2}, {"encoder": "math", "decoder": "naive", "cross": "flash"}),
    "whisper": (_whisper, {"encoder": 2, "decoder": 2, "cross": 2},
                {"encoder": "flash", "decoder": "math", "cross": "naive"}),
}


@pytest.fixture(scope="module", params=list(MODELS))
def case(request):
    make, counts, sel = MODELS[request.param]
    return request.param, make(), counts, sel


def test_the_kinds_come_from_the_config_with_their_attention_modules(case):
    name, m, counts, _ = case
    kinds = attnswitch.layer_kinds(m)
    assert {k: len(v) for k, v in kinds.items()} == counts
    if name in ("gemma3", "qwen2", "gpt_oss"):
        types = m.config.layer_types
        for kind, paths in kinds.items():
            assert all(types[int(p.split(".")[2])] == kind for p in paths)


def test_each_call_runs_its_kinds_backend_forced_and_outputs_match_the_models_own(case, spy):
    name, m, counts, sel = case
    batch = _inputs(name, m)
    with torch.no_grad():
        ref = m(**batch).logits
        with torch.profiler.profile() as prof, attnswitch.backend(sel, model=m):
            out = m(**batch).logits
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)  # float32: the model's own attention's
    by_site = {}
    for _, backend, site in spy.calls:
        by_site.setdefault(site, set()).add(backend)
    kinds = attnswitch.layer_kinds(m)
    for kind, paths in kinds.items():
        for p in paths:
            assert by_site.get(p) == {sel[kind]}, (p, by_site.get(p))
    ops = [e.name for e in prof.events()]
    for backend, op in OPS.items():  # the forced kernel ran once per call of its kind, and nowhere else
        assert ops.count(op) == sum(counts[k] for k, b in sel.items() if b == backend), backend
    spy.calls.clear()
    with torch.no_grad():
        m(**batch)  # restored: no call is switched after the block
    assert not spy.calls


def test_a_kind_left_out_runs_the_models_own_attention(spy):
    m = _gemma3()
    batch = _inputs("gemma3", m)
    with torch.no_grad():
        ref = m(**batch).logits
        with attnswitch.backend({"full_attention": "math"}, model=m):
            out = m(**batch).logits
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)
    assert [(n, s) for _, n, s in spy.calls] == [("math", "model.layers.5.self_attn")]


def test_a_kind_left_out_runs_a_registered_attention_of_the_models_own_that_makes_no_masks(spy):
    # transformers gives an implementation registered without a mask function no mask (it masks itself); a kind
    # left to it gets none under the switch too. It was refused as "shares its config with a model switched here"
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import AttentionMaskInterface

    key = "test-own-no-masks"
    AttentionInterface.register(key, lambda *a, **kw: sdpa_attention_forward(*a, **kw))
    m = _gemma3()
    batch = _inputs("gemma3", m)
    try:
        m.set_attn_implementation(key)
        with torch.no_grad():
            ref = m(**batch).logits
            for sel, name in (({"sliding_attention": "naive"}, "naive"), ({"full_attention": "math"}, "math")):
                spy.calls.clear()
                with attnswitch.backend(sel, model=m):
                    out = m(**batch).logits
                torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)
                assert {n for _, n, _ in spy.calls} == {name}
            # one that takes masks of its own (flash_attention_2's, flex's) cannot run on SDPA's: said as it is
            AttentionMaskInterface.register(key, lambda *a, **kw: None)
            with attnswitch.backend({"full_attention": "math"}, model=m), \
                    pytest.raises(RuntimeError, match="model.layers.0.self_attn is left to its model's own attention "
                                                      "'test-own-no-masks' by a selection per layer kind"):
                m(**batch)
    finally:
        AttentionInterface._global_mapping.pop(key, None)
        AttentionMaskInterface._global_mapping.pop(key, None)


def test_unknown_kinds_and_a_selection_per_kind_without_its_model_are_refused():
    m = _gemma3()
    with pytest.raises(ValueError, match="has no layer kind 'sliding'.*its layer kinds: sliding_attention \\(5 "
                                         "attention modules\\), full_attention \\(1 attention module\\)"):
        attnswitch.backend({"sliding": "flex"}, model=m)
    with pytest.raises(ValueError, match="pass model="):
        attnswitch.backend({"sliding_attention": "naive"})
    with pytest.raises(ValueError, match="has no layer kind 'encoder'"):
        attnswitch.patch(m, "encoder=math")
    assert attnswitch.is_patched(m) is None


def test_a_kind_whose_calls_its_backend_cannot_take_is_refused_naming_the_layer():
    m = _gpt_oss()  # sinks: SDPA's math has none
    with torch.no_grad(), attnswitch.backend({"sliding_attention": "naive", "full_attention": "math"}, model=m):
        with pytest.raises(attnswitch.BackendUnavailable, match="(?s)model.layers.1.self_attn.*sinks"):
            m(**_inputs("gpt_oss", m))


def test_patch_text_and_threads_a_selection_per_kind_stays_with_its_model_and_thread(spy):
    m = _gemma3()
    batch = _inputs("gemma3", m)
    attnswitch.patch(m, "sliding_attention=naive/full_attention=flash")
    try:
        assert str(attnswitch.is_patched(m)) == "sliding_attention=naive/full_attention=flash"
        seen = []

        def other():  # a thread of its own, inside its own block: its block wins there, the patch elsewhere
            with attnswitch.backend("math", model=m), torch.no_grad():
                m(**batch)
            seen.extend(n for t, n, _ in spy.calls if t == threading.get_ident())
        t = threading.Thread(target=other)
        t.start()
        t.join()
        with torch.no_grad():
            m(**batch)
        here = [n for tid, n, _ in spy.calls if tid == threading.get_ident()]
        assert set(seen) == {"math"} and here == ["naive"] * 5 + ["flash"]
    finally:
        attnswitch.unpatch(m)


def test_a_selection_per_kind_compiled_runs_each_kinds_backend():
    m = _gemma3()
    batch = _inputs("gemma3", m)
    with torch.no_grad():
        ref = m(**batch).logits
        with attnswitch.backend({"sliding_attention": "math", "full_attention": "flash"}, model=m):
            compiled = torch.compile(m, backend="aot_eager", fullgraph=True)
            compiled(**batch)  # (the compile's own trace runs the ops on fake tensors: not profiled)
            with torch.profiler.profile() as prof:
                out = compiled(**batch).logits
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)
    ops = [e.name for e in prof.events()]
    assert ops.count(OPS["math"]) == 5 and ops.count(OPS["flash"]) == 1


# -- a model and its sub-model switched per kind in turn; a layer appended after a switch -----------------

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
    # the second switch runs its kinds' backends: a wrong answer would switch no call of the second forward, and
    # say nothing, the modules keeping the kind names of the first model bound
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
    # the appended layer runs its kind's backend and layer_kinds(m) lists it, as a plain backend("naive", model=m)
    # switches it ("Layers appended ... are switched"). A wrong answer would run the model's own attention there,
    # silently, with layer_kinds(m) listing layers 0-3 only
    assert [s for _, n, s in spy.calls if n == "naive"][-1] == "model.layers.4.self_attn"
    assert "model.layers.4.self_attn" in attnswitch.layer_kinds(m)["full_attention"]


# -- choosing per kind: pure functions over results, then a compare ----------------------------------

PATHS = {f"model.layers.{i}.self_attn": ("sliding_attention" if i < 5 else "full_attention") for i in range(6)}


def _result(name, us_by_layer, status="ok", where=None):
    layers = tuple(LayerStats(p, "attention", 1, 1, 0, 0, 0.0, us, 1) for p, us in us_by_layer.items())
    return BackendResult(name, status, where=where, layers=layers)


def test_the_fastest_backend_per_kind_is_composed_from_the_per_layer_times():
    flex = _result("flex", {p: (10.0 if k == "sliding_attention" else 90.0) for p, k in PATHS.items()})
    cudnn = _result("cudnn", {p: (50.0 if k == "sliding_attention" else 30.0) for p, k in PATHS.items()})
    refused = _result("flash", {}, status="unavailable", where="model.layers.0.self_attn")
    results = [perkind.with_kinds(r, PATHS, gpu=False) for r in (flex, cudnn, refused)]
    assert dict(results[0].attn_by_kind) == {"sliding_attention": 50.0, "full_attention": 90.0}
    assert perkind.probes(results, PATHS) == ["full_attention=flash"]  # flash on the kinds it was not refused at
    probe = perkind.with_kinds(_result("full_attention=flash", {p: (99.0 if k == "sliding_attention" else 20.0)
                                                                for p, k in PATHS.items()}), PATHS, gpu=False)
    times = perkind.kind_times([*results, probe])
    assert times["full_attention"] == {"flex": 90.0, "cudnn": 30.0, "flash": 20.0}
    assert "flash" not in times["sliding_attention"]  # (its sliding layers ran the model's own attention)
    best = perkind.composed([*results, probe], ["sliding_attention", "full_attention"])
    assert parse(best) == Candidate(Kinds((("sliding_attention", "flex"), ("full_attention", "flash"))))
    assert perkind.composed(results[1:2], ["sliding_attention", "full_attention"]) is None  # one backend: none


def test_a_generates_kind_times_count_each_phases_rows_as_often_as_that_phase_ran():
    # a generate's rows are per forward of their phase: sliding layers fast in the one prefill, full layers fast in
    # the 7 decode steps. The rows used to be added as they are (prefill + decode per forward), which weighs the
    # prefill like 7 decode steps and read 0.521 ms for a generate whose attention took 1.9 ms
    rows = [LayerStats("model.layers.0.self_attn", "attention", 1, 1, 0, 0, 0.0, 300.0, 1, phase="prefill"),
            LayerStats("model.layers.0.self_attn", "attention", 1, 1, 0, 0, 0.0, 20.0, 1, phase="decode"),
            LayerStats("model.layers.5.self_attn", "attention", 1, 1, 0, 0, 0.0, 100.0, 1, phase="prefill"),
            LayerStats("model.layers.5.self_attn", "attention", 1, 1, 0, 0, 0.0, 40.0, 1, phase="decode")]
    r = BackendResult("flash", "ok", layers=tuple(rows), phase_forwards=(("prefill", 1.0), ("decode", 7.0)))
    assert dict(perkind.with_kinds(r, PATHS, gpu=False).attn_by_kind) == {"sliding_attention": 300.0 + 7 * 20.0,
                                                                         "full_attention": 100.0 + 7 * 40.0}


def test_a_model_with_a_kind_that_made_no_call_still_gets_the_candidate_of_each_kinds_fastest_backend():
    # docs/workloads.md: `compare` on a model of several kinds "adds the candidate of each kind's fastest
    # backend". A Gemma 3 vision-language model compared on text (a text-only serving workload) makes no call of
    # its `vision` kind, so no result has a time for it: the candidate is composed of the kinds that made calls.
    # Here naive is fastest at the sliding layers and flash at the full ones, the times the profiled pass of a
    # text-only input gives.
    from attnswitch.profiling import perkind
    from attnswitch.results import BackendResult

    kinds = list(attnswitch.layer_kinds(_gemma3_vl()))
    assert kinds == ["vision", "text:sliding_attention", "text:full_attention"]
    results = [BackendResult("naive", "ok", attn_by_kind=(("text:sliding_attention", 1000.0),
                                                          ("text:full_attention", 5000.0))),
               BackendResult("flash", "ok", attn_by_kind=(("text:sliding_attention", 5000.0),
                                                          ("text:full_attention", 1000.0)))]
    best = perkind.composed(results, kinds)
    # a wrong answer: None, the candidate never measured whatever the text kinds' times
    assert best is not None
    assert "text:sliding_attention=naive" in best and "text:full_attention=flash" in best, best


def test_compare_measures_the_per_kind_candidate_in_the_same_rounds(monkeypatch):
    m = _gemma3()
    chosen = "sliding_attention=naive/full_attention=flash"
    monkeypatch.setattr(perkind, "composed", lambda results, kinds: chosen)
    r = attnswitch.compare(m, _inputs("gemma3", m), backends=["naive", "flash"], warmup=0, iters=2, rounds=2)
    b = r[chosen]
    assert b.ok and b.numerics.ok and len(b.time_rounds_ms) == len(r["flash"].time_rounds_ms)
    assert {k for k, _ in b.attn_by_kind} == {"sliding_attention", "full_attention"}
    assert chosen in r.ranking
    text = str(r)
    assert "Attention per layer kind" in text and chosen in text


@pytest.mark.filterwarnings("ignore:.*has no record of the versions")  # (a file written by hand, here)
def test_a_per_kind_pick_deploys_as_its_snippet_and_its_policy_file(tmp_path, spy):
    import json

    from attnswitch.deploy import deploy_info, load_policy

    m = _gemma3()
    batch = _inputs("gemma3", m)
    pick = "sliding_attention=naive/full_attention=flash"
    d = deploy_info(pick, {}, {"mode": "prefill"})
    assert d.plain is None and "per layer kind" in d.plain_loses[0]
    try:
        exec(d.attnswitch, {"model": m})  # the report's own text, as a user copies it
        with torch.no_grad():
            m(**batch)
    finally:
        attnswitch.unpatch(m)
    assert [n for _, n, _ in spy.calls] == ["naive"] * 5 + ["flash"]
    path = tmp_path / "policy.json"
    path.write_text(json.dumps({"schema": 1, "selection": d.selection, "compile": None}))
    policy = load_policy(path)
    policy.apply(m)
    try:
        assert str(attnswitch.is_patched(m)) == pick
    finally:
        attnswitch.unpatch(m)


def test_a_kind_the_model_lacks_is_bad_input_before_any_work(capsys):
    from attnswitch import cli

    code = cli.main(["compare", "tiny-llama", "--device", "cpu", "--backends", "naive,sliding_attention=math",
                     "--seq", "16", "--num-layers", "1", "--iters", "1", "--warmup", "0"])
    err = capsys.readouterr().err
    assert code == cli.EXIT_BAD_INPUT and "its layer kinds: all (1 attention module)" in err and "Traceback" not in err


# -- a selection per kind that cannot be honoured: refused with a reason -----------------------------

def test_duplicate_kinds_are_refused_not_last_one_wins():
    from attnswitch.candidate import check_backends

    for text in ("all=naive/all=flash", "all.prefill=math/all.decode=naive/all=flash"):
        with pytest.raises(ValueError):
            check_backends(text)  # a wrong answer: ['all=flash'], the first selection of the kind silently dropped


def test_a_kind_given_both_a_backend_and_a_policy_is_one_line_and_exit_2(capsys):
    code = cli.main(["compare", "tiny-llama", "--device", "cpu", "--num-layers", "1", "--backends",
                     "all=flash/all.prefill=math/all.decode=naive", "--seq", "8"])
    err = capsys.readouterr().err
    # one line, no traceback (a wrong answer: TypeError: 'str' object does not support item assignment)
    assert code == cli.EXIT_BAD_INPUT and "Traceback" not in err


def test_a_selection_per_kind_with_a_backend_and_a_policy_for_one_kind_is_an_option_error():
    from attnswitch.candidate import check_backends
    from attnswitch.options import OptionError

    with pytest.raises(OptionError):
        check_backends("all=flash/all.prefill=math/all.decode=naive")  # not a TypeError


def test_an_unknown_layer_kind_on_the_command_line_is_bad_input_exit_2(capsys):
    code = cli.main(["compare", "tiny-llama", "--device", "cpu", "--num-layers", "1", "--backends", "foo=flash,naive",
                     "--seq", "8", "--iters", "2", "--rounds", "1", "--warmup", "0"])
    out = capsys.readouterr()
    # refused before any work; a wrong answer would measure naive, list `foo=flash failed: OptionError: foo names
    # layer kinds LlamaForCausalLM does not have (foo); its kinds: all` under Not run, recommend naive and exit 0
    assert code == cli.EXIT_BAD_INPUT and "Recommendation" not in out.out


def test_a_bare_call_with_a_selection_per_kind_is_refused_with_a_reason():
    q = k = v = torch.randn(1, 2, 8, 16)
    with pytest.raises(ValueError) as e:
        attnswitch.attention(q, k, v, backend="sliding_attention=naive")
    # the reason names the selection per kind; a wrong one: "attention backend None is not registered (unregistered
    # while in use?)"
    assert "None" not in str(e.value) and "kind" in str(e.value)
