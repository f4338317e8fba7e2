"""Bad input answered at once: names, dtypes, modes, presets and option combinations checked without torch,
alike in the library and on the command line, with the nearest valid name."""

import json
import subprocess
import sys

import pytest
import torch
from conftest import batch_for, tiny

import attnswitch
from attnswitch import cli, options
from attnswitch.candidate import check_backends
from attnswitch.models import _AUTO, PRESETS, load_model, parse_dtype
from attnswitch.workload import make_workload, position_limit, task_of

# (arguments, what the one line of the error says); each answered before torch or transformers is imported
BAD = [
    (["compare", "tiny-lama"], "unknown model 'tiny-lama' (did you mean `tiny-llama`?)"),
    (["compare", "bert"], "(did you mean `bert-base`?)"),
    (["compare", "--backends", "naive,flsh"], "unknown attention backend 'flsh' (did you mean `flash`?)"),
    (["profile", "--backends", "prefill=cudnn/decod=flash"], "unknown phase key(s) 'decod' (did you mean `decode`?)"),
    (["check", "--backends", "prefill=cudnn/decode=flsh"], "(did you mean `flash`?)"),
    (["compare", "--dtype", "bf61"], "unknown --dtype 'bf61' (did you mean `bf16`?)"),
    (["compare", "--dtype", "fp8"], "unknown --dtype 'fp8'; use one of fp32, fp16, bf16"),
    (["compare", "bert-base", "--mode", "generate"], "cannot generate (no language-model head): use --mode prefill"),
    (["compare", "t5-small", "--mode", "decode"], "--mode decode needs a causal language model"),
    (["compare", "gpt2", "--seq", "2000"], "--seq 2000 (2000) is beyond the 1024 positions"),
    (["compare", "gpt2", "--mode", "generate", "--new-tokens", "2000"], "beyond the 1024 positions"),
    (["compare", "--device-map", "atuo"], "--device-map 'atuo' (did you mean `auto`?)"),
    (["compare", "--num-layers", "0"], "--num-layers must be at least 1"),
    (["compare", "--iters", "3", "--rounds", "5"], "--rounds 5 is more than --iters 3"),
    (["compare", "--rounds", "50"], "--rounds 50 is more than --iters 12"),  # the command's own default
    (["profile", "--rounds", "8"], "--rounds 8 is more than --iters 6"),
    (["compare", "--backends", "all,math"], "--backends: 'all' is every backend this device runs, and stands alone"),
    (["compare", "--mode", "generate", "--seq", "64"], "--seq is the length of a prefill, decode or train step"),
    (["compare", "--new-tokens", "4"], "--new-tokens: for --mode generate only"),
    (["compare", "--mode", "train", "--cache", "static"], "--cache: for --mode generate only"),
    (["compare", "--mode", "generate", "--prompt-len", "8", "--prompt-lens", "8,9"], "choose one"),
    (["compare", "--padding", "--batch", "1"], "--padding needs a batch of 2 or more"),
    (["compare", "--mode", "generate", "--prompt-lens-from", "missing.txt"], "missing.txt: cannot read it"),
    (["compare", "--mode", "generate", "--prompt-lens-from", "lens.txt"], "lens.txt:2: expected one prompt length"),
    (["compare", "--mode", "generate", "--requests", "9"], "--requests charges the first-met shapes of a length mix"),
    (["compare", "--prompt-lens-from", "lens.txt"], "--prompt-lens-from: for --mode generate only"),
    (["compare", "--mode", "generate", "--prompt-len", "8", "--prompt-lens-from", "lens.txt"], "choose one"),
    (["profile", "--mode", "generate", "--prompt-len", "8,16"], "is a `compare`"),
    (["compare", "--mode", "decode", "--seq", "8,16"], "a sweep of --seq is of prefill or train steps"),
    (["compare", "gpt2", "--mode", "generate", "--prompt-len", "64,1000", "--new-tokens", "100"],
     "a prompt of 1050 tokens (the longest of those spread around 1000) plus 100 new ones (1150) is beyond the 1024 "
     "positions"),
]


def test_bad_input_is_answered_without_importing_torch_with_the_near_miss(tmp_path):
    folder = tmp_path / "weightless"
    folder.mkdir()
    (tmp_path / "lens.txt").write_text("512\nmany\n")
    (folder / "config.json").write_text("{}")
    cases = [*BAD, (["check", str(folder)], f"pass {folder / 'config.json'}")]
    code = ("import json, sys\nfrom attnswitch.cli import main\n"
            f"codes = [main(a) for a in {[a for a, _ in cases]!r}]\n"
            "codes.append(main(['presets']))\n"
            "print(json.dumps([codes, 'torch' in sys.modules, 'transformers' in sys.modules]))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    codes, torch_loaded, transformers_loaded = json.loads(r.stdout.strip().splitlines()[-1])
    assert codes == [2] * len(cases) + [0], r.stderr[-3000:]
    assert not torch_loaded and not transformers_loaded
    errors = r.stderr.strip().splitlines()
    assert len(errors) == len(cases), errors  # one line each
    for (argv, said), line in zip(cases, errors):
        assert line.startswith("error: ") and said in line, (argv, line)
    assert "tiny-llama  a 4-layer Llama" in r.stdout  # presets: its list, without torch


def test_the_library_checks_what_the_command_line_does_and_names_no_flag():
    m = tiny("llama")
    bert = tiny("bert")
    t5 = tiny("t5")
    calls = [
        (lambda: make_workload(m, mode="generate", new_tokens=0), "new_tokens must be a whole number, at least 1",
         "--new-tokens must be a whole number, at least 1"),
        # a whole number's worth in another type: said to be one, not to be under 1 ("iters must be at least 1, got
        # 2.0")
        (lambda: attnswitch.compare(m, batch_for(m), iters=2.0), "iters must be a whole number, at least 1, got 2.0",
         "--iters must be a whole number"),
        (lambda: attnswitch.compare(m, batch_for(m), warmup=True), "warmup must be a whole number, 0 or more, got "
         "True", "--warmup must be a whole number"),
        (lambda: make_workload(bert, mode="generate"), "cannot generate (no language-model head): use mode prefill",
         "use --mode prefill"),
        (lambda: make_workload(t5, mode="decode"), "mode decode needs a causal language model", "--mode decode"),
        (lambda: make_workload(m, batch=1, padding=True), "padding needs a batch of 2 or more", "--padding needs"),
        (lambda: make_workload(m, mode="generate", cache="statik"), "cache must be one of dynamic, static, not "
         "'statik' (did you mean `static`?)", "--cache must be one of"),
        (lambda: make_workload(m, mode="prefil"), "(did you mean `prefill`?)", "--mode must be one of"),
        (lambda: load_model("tiny-llama", layers=0), "layers must be at least 1", "--num-layers must be at least 1"),
        (lambda: load_model("tiny-llama", device_map="atuo"), "device_map 'atuo' (did you mean `auto`?)",
         "--device-map 'atuo'"),
        (lambda: load_model("tiny-lama"), "(did you mean `tiny-llama`?)", "(did you mean `tiny-llama`?)"),
        (lambda: parse_dtype("bf61"), "unknown dtype 'bf61' (did you mean `bf16`?)", "unknown --dtype"),
        (lambda: attnswitch.backend("flsh"), "unknown attention backend 'flsh' (did you mean `flash`?)", "flash"),
        (lambda: attnswitch.profile(m, {}, backends=["prefill=math/decode=naiv"]), "(did you mean `naive`?)",
         "(did you mean `naive`?)"),
    ]
    for call, library, command_line in calls:
        with pytest.raises(options.OptionError) as e:
            call()
        assert library in str(e.value) and "--" not in str(e.value), str(e.value)  # the library's own words
        assert command_line in e.value.worded(cli.FLAGS), e.value.worded(cli.FLAGS)


def test_an_option_error_keeps_its_wording_through_pickle_and_reads_user_input_as_text():
    import pickle

    e = options.OptionError("{new_tokens} must be at least 1, got {got!r}", got="{layers}")
    back = pickle.loads(pickle.dumps(e))  # (as a process pool or a process group sends it)
    assert str(back) == "new_tokens must be at least 1, got '{layers}'"
    assert back.worded(cli.FLAGS) == "--new-tokens must be at least 1, got '{layers}'"
    assert check_backends(["naive", {"prefill": "cudnn", "decode": "flash_attention"}, "SDPA"]) == [
        "naive", "prefill=cudnn/decode=flash", "auto"]


def test_a_folder_with_only_a_config_is_refused_and_its_config_path_loads(tmp_path):
    m = tiny("llama")
    m.config.save_pretrained(tmp_path / "model")  # the config alone, no weights
    with pytest.raises(ValueError, match="no weights") as e:
        load_model(str(tmp_path / "model"))
    hint = str(tmp_path / "model" / "config.json")
    assert f"pass {hint}" in str(e.value)
    model, desc = load_model(hint)  # the way the message gives: random weights
    assert "random weights" in desc and type(model).__name__ == "LlamaForCausalLM"
    (tmp_path / "model" / "pytorch_model.bin").write_bytes(b"")
    with pytest.raises(ValueError, match=r"only pickle weights \(\*\.bin\), which are not loaded"):
        load_model(str(tmp_path / "model"))


def test_the_static_tables_are_the_registrys_and_the_presets_own():
    from attnswitch.backends import registry

    builtins = tuple(n for n, b in registry.REGISTRY.items() if b.builtin)
    assert builtins == options.BACKENDS and {a: n for a, n in registry._ALIASES.items()} == options.ALIASES
    assert list(options.PRESETS) == list(PRESETS)
    for name, p in options.PRESETS.items():
        config = PRESETS[name].make_config()
        assert p.task == task_of(config) == PRESETS[name].task and p.about == PRESETS[name].about
        with torch.device("meta"):  # the architecture without its weights: what its table of positions is
            model = _AUTO[p.task].from_config(config)
        assert p.positions == position_limit(model), name


def test_a_misspelt_compile_mode_is_answered_with_the_nearest_valid_name(capsys):
    # docs/cli.md, "Bad input and exit codes": "Bad input is one line and exit code 2, before any work: a misspelt
    # model, backend, dtype, device map or `--compile` mode (answered with the nearest valid name)". Like a
    # misspelt model, backend, dtype or device map, `--compile defalt` gets "(did you mean `default`?)". A wrong
    # answer would read "error: --compile 'defalt': use one of none, default, reduce-overhead, max-autotune, or
    # several joined by commas (default,none)": exit 2, one line, but no nearest name.
    assert cli.main(["compare", "--compile", "defalt"]) == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith("error: --compile 'defalt'")
    assert "did you mean `default`?" in line, line


@pytest.mark.parametrize("spec", ["all", " ALL", "all,", ["all"], None])
def test_all_alone_in_any_spelling_is_every_backend_this_device_runs(spec):
    from attnswitch.backends import default_backends
    from attnswitch.backends.policy import parse_backends

    assert check_backends(spec) == ["all"] and parse_backends(spec, "cpu") == default_backends("cpu")


def test_a_config_with_per_layer_attributes_loads_past_the_head_count_check(tmp_path):
    # reading num_key_value_heads of a heterogeneous config raises (a per-layer attribute): the check of key/value
    # heads dividing query heads turned a config that ran into a traceback
    from transformers import CONFIG_MAPPING

    from attnswitch.models import _config

    if "embedding_gemma2" not in CONFIG_MAPPING:
        pytest.skip("this transformers has no embedding_gemma2")
    CONFIG_MAPPING["embedding_gemma2"]().save_pretrained(tmp_path)
    assert type(_config(str(tmp_path / "config.json"))).__name__ == "EmbeddingGemma2Config"
