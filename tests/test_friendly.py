"""The tool's own manners: cheap to start, quiet, clear about bad input, traces other tools read."""

import gzip
import json
import os
import shutil
import subprocess
import sys

import pytest
import torch
from conftest import batch_for, tiny

import attnswitch
from attnswitch import cli
from attnswitch.options import OptionError
from attnswitch.workload import make_workload


def test_help_and_the_package_import_no_torch_until_needed():
    code = ("import sys, attnswitch, attnswitch.cli\n"
            "try:\n    attnswitch.cli.main(['--help'])\nexcept SystemExit:\n    pass\n"
            "print('torch' in sys.modules, 'transformers' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.stdout.strip().splitlines()[-1] == "False False", r.stderr[-2000:]
    assert attnswitch.Report is attnswitch.results.Report  # names load on first use


@pytest.fixture
def registered_kernel():
    name = attnswitch.register_backend("onereason", lambda q, k, v, **kw: q, check=lambda *a, **k: "no masks here")
    yield name
    attnswitch.unregister_backend(name)


@pytest.mark.parametrize("make", ["file", "unwritable"])
def test_out_that_cannot_be_written_is_one_line_and_exit_2_before_any_work(make, tmp_path, capsys, monkeypatch):
    import attnswitch.models as models
    monkeypatch.setattr(models, "load_model", lambda *a, **k: pytest.fail("no work before --out is checked"))
    if make == "file":
        out = tmp_path / "report"
        out.write_text("not a folder")
    else:
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o500)
        out = ro / "report"
        if shutil.os.access(ro, shutil.os.W_OK):  # root writes anywhere: a path under a file instead
            f = tmp_path / "afile"
            f.write_text("")
            out = f / "report"
    assert cli.main(["compare", "tiny-llama", "--device", "cpu", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "--out" in err and len(err.strip().splitlines()) == 1


def test_bad_input_leaves_no_out_folder_behind(tmp_path, capsys):
    out = tmp_path / "new" / "report"
    assert cli.main(["compare", "tiny-llama", "--device", "cpu", "--backends", "nope", "--out", str(out)]) == 2
    assert not (tmp_path / "new").exists()  # the writability probe's folders are gone again


def test_eager_alone_is_said_to_be_no_candidate_not_a_failure():
    from attnswitch.decision import recommend
    from attnswitch.ranking import verdict
    from attnswitch.results import BackendResult

    alone = [BackendResult("eager", "ok", time_ms=1.0)]
    text = recommend(alone, verdict(alone))
    assert text.startswith("Only `eager` ran") and "acceptable numerics" not in text


def test_api_arguments_of_the_wrong_kind_get_clear_errors(registered_kernel):
    m = tiny("llama")
    for bad in ("tiny", m.config):  # (model=None is the global switch)
        with pytest.raises(TypeError, match="model must be a torch.nn.Module"):
            attnswitch.backend("naive", model=bad)
    for bad in ("tiny", None, m.config):
        with pytest.raises(TypeError, match="model must be a torch.nn.Module"):
            attnswitch.unpatch(bad)
    with pytest.raises(TypeError, match="model must be a torch.nn.Module"):
        attnswitch.patch("tiny", "naive")
    with pytest.raises(ValueError, match="decode_max_query must be an int from 1 to 65536"):
        attnswitch.backend({"prefill": "naive", "decode": "math", "decode_max_query": True})
    with pytest.raises(ValueError, match="positive whole numbers"):
        make_workload(m, batch=1.5)
    with pytest.raises(ValueError, match="prompt_lens is empty"):
        make_workload(m, mode="generate", prompt_lens=[])
    # a check that returns one reason as a string is quoted as that one reason
    with pytest.raises(attnswitch.BackendUnavailable) as e:
        attnswitch.attention(*(torch.randn(1, 2, 4, 8) for _ in range(3)), backend=registered_kernel)
    assert e.value.reasons == ["no masks here"]


@pytest.mark.parametrize("deployed, message", [
    ([-5], "a length is a whole number of tokens from 1 to .*, not -5"), ([3.7], "not 3.7"), (["x"], "not 'x'"),
    ([10**12], "not 1000000000000"), (5, "deployed is a list of lengths .tokens., not 5"), ("12", "not '12'")])
def test_deployed_lengths_are_checked_before_any_work(deployed, message, monkeypatch):
    m = tiny("llama")
    monkeypatch.setattr(m, "forward", lambda *a, **k: pytest.fail("the model ran"))
    with pytest.raises(OptionError, match=message):
        attnswitch.compare(m, {"input_ids": torch.ones(1, 4, dtype=torch.long)}, deployed=deployed)
    with pytest.raises(OptionError, match=message):  # (a sweep adds its own lengths to those named)
        attnswitch.compare_sweep(m, [(1, 4)], deployed=deployed)


def test_backends_compile_and_deployed_given_as_iterators_are_read_once_and_whole(monkeypatch):
    import attnswitch.profiling as profiling

    m = tiny("llama")
    batch = {"input_ids": torch.randint(0, 100, (1, 8))}
    checked, real = [], profiling.check_defects
    monkeypatch.setattr(profiling, "check_defects", lambda r, env, work, deployed, **kw: (
        checked.append((r.backend, deployed)), real(r, env, work, deployed, **kw))[1])
    r = attnswitch.compare(m, batch, backends=iter(["math", "naive"]), compile=iter([None]), deployed=iter([16]),
                           warmup=1, iters=2, rounds=1, time_budget_s=0)
    assert list(r) == [b.backend for b in r.backends] and set(r) == {"math", "naive"}
    assert sorted(checked) == [("math", (16,)), ("naive", (16,))]  # every backend checked at the length named
    r = attnswitch.profile(m, batch, backends=(b for b in ["flash"]), iters=2, rounds=1, time_budget_s=0)
    assert list(r) == ["flash"]
    r = attnswitch.compare_sweep(m, [(1, 4), (1, 8)], backends=iter(["math", "naive"]), warmup=1, iters=2,
                                 rounds=1, time_budget_s=0)
    assert [sorted(b.backend for b in p.backends) for p in r.sweep] == [["math", "naive"]] * 2


def test_a_report_is_a_mapping_of_backend_names_to_results_aliases_and_policies_included():
    m = tiny("llama")
    w = make_workload(m, batch=1, seq=8, mode="generate", new_tokens=2)
    policy = {"prefill": "flash", "decode": "naive"}
    r = attnswitch.compare(m, w, backends=["naive", policy], warmup=1, iters=2, rounds=1, time_budget_s=0,
                           check_numerics=False)
    assert len(r) == 2 and set(r) == {"naive", "prefill=flash/decode=naive"}
    assert r[policy] is r[{"decode": "naive", "prefill": "flash"}] is r["prefill=flash/decode=naive"]
    assert policy in r and "naive" in r and "math" not in r and 0 not in r and [1] not in r
    with pytest.raises(KeyError, match="backend 'math' is not in this report"):
        r["math"]


def test_a_comparison_of_a_model_a_switch_holds_is_refused_and_leaves_the_switch_as_it_was(monkeypatch):
    # its answer ("keep the model's own attention: nothing to change") would be about a model running another
    # backend
    m, other = tiny("llama"), tiny("llama")
    batch = {"input_ids": torch.randint(0, 100, (1, 8))}
    monkeypatch.setattr(attnswitch.comparison, "profile", lambda *a, **k: pytest.fail("measured"))
    attnswitch.patch(m, "naive")
    try:
        with pytest.raises(OptionError, match=r"^The model is patched with `naive` .attnswitch.patch.: .* unpatch "
                                              r"it first \(attnswitch.unpatch\)$"):
            attnswitch.compare(m, batch)
        with pytest.raises(OptionError, match=r"^A model the model is part of is patched with `naive`"):
            attnswitch.compare(m.model, batch)  # (its forwards run the patch)
        with pytest.raises(OptionError, match="patched with `naive`"):
            attnswitch.compare_sweep(m, [(1, 4)])
        assert attnswitch.is_patched(m) == "naive"
    finally:
        attnswitch.unpatch(m)
    for ctx in (attnswitch.backend("naive-inplace"), attnswitch.backend({"prefill": "math", "decode": "naive"},
                                                                          model=m),
                attnswitch.backend("math", model=m.model)):  # (a part of the model)
        with ctx as sel:
            with pytest.raises(OptionError, match=r"a comparison inside attnswitch.backend\('.*'\), which "
                                                  r"switches (every model|the model|a part of the model): .* call "
                                                  r"it outside"):
                attnswitch.compare(m, batch)
            assert attnswitch.active_backend() in (sel, None)
    attnswitch.patch(other, "naive")  # another model's switch leaves this one's comparison alone
    try:
        with pytest.raises(pytest.fail.Exception, match="measured"):
            attnswitch.compare(m, batch)
    finally:
        attnswitch.unpatch(other)


def test_a_workload_made_for_another_model_is_refused_not_measured_on_that_model():
    # it used to measure the workload's model (its heads, its patch) and report it as this one's
    a, b = tiny("llama"), tiny("llama", num_attention_heads=2, num_key_value_heads=2)
    work = make_workload(a, batch=1, seq=8)
    attnswitch.patch(a, "naive")  # (which the refusal of a patched model, checked on b, would not see)
    try:
        for call in (lambda: attnswitch.compare(b, work), lambda: attnswitch.profile(b, work, backends=["math"])):
            with pytest.raises(OptionError, match=r"^the workload was made for another model \(LlamaForCausalLM, "
                                                  r"not this LlamaForCausalLM\): make_workload\(model, ...\)"):
                call()
    finally:
        attnswitch.unpatch(a)
    assert attnswitch.profile(b, work.for_model(b), backends=["math"], iters=1, rounds=1,
                             time_budget_s=0)["math"].ok


def test_a_model_never_loaded_or_frozen_for_training_is_refused_before_any_step():
    # torch's own errors came instead: "Tensor.item() cannot be called on meta tensors", "element 0 of tensors does
    # not require grad"
    with torch.device("meta"):
        ghost = tiny("llama")
    batch = {"input_ids": torch.randint(0, 100, (1, 8))}
    for call in (lambda: attnswitch.compare(ghost, batch), lambda: attnswitch.check(ghost, **batch),
                 lambda: make_workload(ghost, seq=8)):
        with pytest.raises(OptionError, match=r"^the model's weights are on the meta device \(never loaded\)"):
            call()
    frozen = tiny("llama").requires_grad_(False)
    work = make_workload(frozen, seq=8)  # (inference needs no gradient)
    assert attnswitch.check(frozen, work=work, backends=["math"])["math"].ok
    train = make_workload(tiny("llama"), seq=8, mode="train")
    for call in (lambda: make_workload(frozen, seq=8, mode="train"),
                 lambda: attnswitch.compare(frozen, train.for_model(frozen)),
                 lambda: attnswitch.check(frozen, work=train.for_model(frozen))):
        with pytest.raises(OptionError, match=r"^mode train needs parameters to train: every parameter of the "
                                              r"model is frozen \(requires_grad=False\)$"):
            call()


def test_a_failure_while_measuring_is_shown_whole_not_as_bad_input(monkeypatch):
    # the exit code follows what went wrong: a ValueError the model raises is its failure, raised whole (exit 1,
    # with its traceback), whenever it comes; only an OptionError is bad input
    import attnswitch.comparison as comparison

    def broken(*a, **k):
        raise ValueError("something inside the model")
    monkeypatch.setattr(comparison, "numerics", broken)
    with pytest.raises(ValueError, match="^something inside the model$") as e:
        cli.main(["compare", "tiny-llama", "--device", "cpu", "--num-layers", "1", "--seq", "8", "--iters", "1",
                  "--warmup", "0", "--backends", "naive"])
    assert not isinstance(e.value, attnswitch.options.OptionError)


def test_profiling_prints_no_profiler_noise(capfd):
    m = tiny("llama")
    attnswitch.profile(m, batch_for(m), backends=["naive"], warmup=0, iters=1)
    err = capfd.readouterr().err
    assert "USDT" not in err and "profiler_start" not in err


def test_check_lists_every_backend_with_the_reason_for_those_that_cannot_exist_here(capsys):
    assert cli.main(["check", "tiny-llama", "--device", "cpu", "--num-layers", "1", "--seq", "16"]) == 0
    out = capsys.readouterr().out
    for name in ("efficient", "cudnn"):
        line = next(x for x in out.splitlines() if x.startswith(name))
        assert "UNAVAILABLE" in line
    assert "runs only on CUDA tensors" in out


def test_the_recommendation_says_when_eager_is_recommended():
    m = tiny("llama")
    r = attnswitch.compare(m, batch_for(m, pad=False), backends=["eager", "naive"], warmup=0, iters=2, rounds=1)
    # one round tells nothing apart: eager is not faster than every candidate, and is never the pick then
    assert "eager" in r.ranking and not r.recommendation.startswith("Use `eager`") and r.pick == "naive"
    assert "picked only where it is faster than every candidate" in r.recommendation


def test_traces_are_gzipped_with_steps_and_rank_that_holistic_trace_analysis_reads(tmp_path):
    hta = pytest.importorskip("hta.trace_analysis", reason="HolisticTraceAnalysis is not installed")
    m = tiny("llama")
    r = attnswitch.profile(m, batch_for(m), backends=["flash"], warmup=0, iters=2, profile_steps=2,
                           trace_dir=tmp_path / "t")
    path = r["flash"].trace_path
    assert path.endswith(".json.gz")
    data = json.loads(gzip.open(path).read())
    assert data["distributedInfo"]["rank"] == 0
    assert sum(e.get("name", "").startswith("ProfilerStep#") for e in data["traceEvents"]) == 2
    analysis = hta.TraceAnalysis(trace_dir=str(tmp_path / "t"))
    assert analysis.t.get_ranks() == [0]
    analysis.get_gpu_kernel_breakdown(visualize=False)  # runs (a CPU trace has no kernels to break down)


def test_the_readmes_first_command_writes_only_where_git_ignores(tmp_path):
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    if shutil.which("git") is None or not (root / ".git").exists():
        pytest.skip("not a git checkout")
    first = next(line for line in (root / "README.md").read_text().splitlines() if "attnswitch compare" in line)
    out = re.search(r"--out (\S+)", first).group(1)
    written = [f"{out}report.json", f"{out}traces/trace_naive.json.gz", f"{out}command.txt"]
    ignored = subprocess.run(["git", "check-ignore", "--no-index", *written], cwd=root, capture_output=True, text=True)
    assert ignored.stdout.split() == written, f"{out} is not ignored by git: the first command leaves files behind"


def test_the_command_compiles_in_process_and_exits_fast_once_everything_is_flushed(monkeypatch, capsys):
    monkeypatch.delenv("TORCHINDUCTOR_COMPILE_THREADS", raising=False)
    for var in ("TORCHELASTIC_RUN_ID", "WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    ended = []

    def main():
        print("the report")  # still buffered when main returns
        return 1

    def exit_now(code):
        ended.append((code, capsys.readouterr().out))
        raise SystemExit(code)

    monkeypatch.setattr(cli, "main", main)
    monkeypatch.setattr(cli.os, "_exit", exit_now)
    with pytest.raises(SystemExit):
        cli.run()
    assert ended == [(1, "the report\n")]  # main's exit code, after its output was flushed
    assert cli.os.environ["TORCHINDUCTOR_COMPILE_THREADS"] == "1"
    monkeypatch.setenv("TORCHINDUCTOR_COMPILE_THREADS", "8")  # a user's own choice stands
    monkeypatch.setenv("WORLD_SIZE", "2")  # under torchrun: a normal exit, process group and all
    with pytest.raises(SystemExit) as e:
        cli.run()
    assert e.value.code == 1 and len(ended) == 1 and cli.os.environ["TORCHINDUCTOR_COMPILE_THREADS"] == "8"
    monkeypatch.delenv("WORLD_SIZE")
    monkeypatch.setattr(cli.sys, "getprofile", lambda: object())  # a profiler writes its results at exit
    with pytest.raises(SystemExit) as e:
        cli.run()
    assert e.value.code == 1 and len(ended) == 1


def test_a_profiler_around_the_command_still_gets_to_write_its_results(tmp_path):
    out = tmp_path / "out.prof"
    r = subprocess.run([sys.executable, "-m", "cProfile", "-o", str(out), "-m", "attnswitch", "presets"],
                       capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert r.returncode == 0 and out.stat().st_size > 0, r.stderr[-2000:]


def test_python_dash_m_attnswitch_exits_with_mains_code_and_output(tmp_path):
    r = subprocess.run([sys.executable, "-m", "attnswitch", "check", "no/such/model"], capture_output=True, text=True,
                       timeout=300, cwd=tmp_path)
    assert r.returncode == 2 and "error:" in r.stderr, r.stderr[-2000:]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads C's stdio through the C library")
def test_what_native_code_printed_is_not_lost_at_the_fast_exit():
    code = ("import ctypes\nfrom attnswitch import cli\nlibc = ctypes.CDLL(None)\n"
            "def main():\n    libc.printf(b'from C\\n')\n    print('from python')\n    return 3\n"
            "cli.main = main\ncli.run()\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 3 and sorted(r.stdout.splitlines()) == ["from C", "from python"], (r.stdout, r.stderr)


def test_a_reader_that_goes_away_ends_the_command_with_141_and_no_traceback(tmp_path):
    # stdout's reader is gone before anything is printed (`attnswitch compare | head -1`, once head has its
    # line): the command ends as a shell expects of such a process (141: SIGPIPE's), without a traceback,
    # and the report is written to --out all the same. `presets` prints into a buffer, flushed at the end;
    # `-u` writes each line at once, so the report's first line already finds no reader.
    out = tmp_path / "rep"
    runs = [([], ["presets"]),
            (["-u"], ["compare", "tiny-llama", "--device", "cpu", "--num-layers", "1", "--seq", "8", "--iters", "1",
                      "--warmup", "0", "--backends", "naive", "--no-numerics", "--out", str(out)])]
    for flags, argv in runs:
        p = subprocess.Popen([sys.executable, *flags, "-m", "attnswitch", *argv], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, cwd=tmp_path)
        p.stdout.close()
        err = p.stderr.read().decode()
        assert p.wait(timeout=600) == 141, (argv, err[-3000:])
        assert "Traceback" not in err and "BrokenPipe" not in err and "Exception ignored" not in err, err[-3000:]
    assert (out / "report.json").stat().st_size > 0 and (out / "traces" / "trace_naive.json.gz").exists()


def test_a_config_transformers_refuses_and_weights_that_do_not_match_it_or_are_cut_short_are_one_line_and_exit_2(
        tmp_path):
    # as the command meets them: a config whose validators fail (hidden size 64 with 5 heads), and a checkpoint
    # whose weights are of other shapes than its config says; transformers' own report of keys is not printed
    from transformers import LlamaConfig, LlamaForCausalLM

    (tmp_path / "five.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 64, "num_attention_heads": 5,
                                                    "num_hidden_layers": 1, "intermediate_size": 128,
                                                    "vocab_size": 100}))
    cfg = LlamaConfig(vocab_size=100, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2)
    LlamaForCausalLM(cfg).save_pretrained(tmp_path / "grown")
    config = json.loads((tmp_path / "grown" / "config.json").read_text())
    (tmp_path / "grown" / "config.json").write_text(json.dumps({**config, "intermediate_size": 256}))
    LlamaForCausalLM(cfg).save_pretrained(tmp_path / "cut")  # a weights file cut short (a copy that stopped)
    weights = tmp_path / "cut" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:weights.stat().st_size // 2])
    (tmp_path / "threekv.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 64,
                                                       "num_attention_heads": 4, "num_key_value_heads": 3,
                                                       "num_hidden_layers": 1, "intermediate_size": 128,
                                                       "vocab_size": 100}))
    (tmp_path / "bare").mkdir()  # the weights copied without their config
    shutil.copy(tmp_path / "grown" / "model.safetensors", tmp_path / "bare")
    cases = [("bare", "bare: no config.json in this folder; a model folder is what save_pretrained writes (config.json "
                      "and the weights)"),
("five.json", "five.json: transformers refuses this config: The hidden size (64) is not a multiple of "
                           "the number of attention heads (5)."),
             ("threekv.json", "threekv.json: num_key_value_heads (3) must divide num_attention_heads (4): every "
                              "attention call of this config fails"),  # (transformers loads it; a traceback was all)
             ("grown", "grown: its weights do not match its config: model.layers.0.mlp.down_proj.weight is [64, 128] "
                       "in the checkpoint, [64, 256] by the config (and 2 more)"),
             ("cut", "cut: its weights cannot be read (Error while deserializing header: incomplete metadata, file "
                     "not fully covered)")]
    for model, said in cases:
        r = subprocess.run([sys.executable, "-m", "attnswitch", "compare", model, "--device", "cpu", "--seq", "8",
                            "--iters", "1", "--backends", "naive"], capture_output=True, text=True, timeout=300,
                           cwd=tmp_path, env={**os.environ, "HF_HUB_DISABLE_PROGRESS_BARS": "1"})
        lines = [x for x in r.stderr.strip().splitlines() if not x.startswith(("Loading weights", "preset"))]
        assert r.returncode == 2 and lines == [f"error: {said}"], r.stderr[-3000:]


def test_the_command_starts_answering_interrupts_before_it_imports_anything_heavy():
    # the console script's first import (the package and its __main__) takes milliseconds: the versions of
    # torch and transformers are read off their own version lines, as importlib.metadata (tens of milliseconds)
    # states them
    from importlib.metadata import version

    from attnswitch import _versions

    for pkg in _versions.MINIMUM:
        assert _versions._version_line(pkg) == version(pkg)
    code = "import sys, attnswitch.__main__\nprint(sorted(m for m in ('importlib.metadata', 'torch', 're', 'rich') " \
           "if m in sys.modules))"
    r = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True, timeout=120)
    assert r.stdout.strip() == "[]", (r.stdout, r.stderr[-2000:])


@pytest.mark.parametrize("config, takes", [
    ({"model_type": "vit", "hidden_size": 64, "num_hidden_layers": 1, "num_attention_heads": 4,
      "intermediate_size": 128, "image_size": 32, "patch_size": 8}, "pixel_values"),
    ({"model_type": "whisper", "d_model": 64, "encoder_layers": 1, "decoder_layers": 1, "encoder_attention_heads": 4,
      "decoder_attention_heads": 4, "encoder_ffn_dim": 128, "decoder_ffn_dim": 128, "vocab_size": 200,
      "num_mel_bins": 16, "max_source_positions": 32, "max_target_positions": 64, "pad_token_id": 1,
      "bos_token_id": 2, "eos_token_id": 3, "decoder_start_token_id": 2}, "input_features")])
def test_a_vision_or_speech_model_is_one_line_and_exit_2_naming_its_inputs(tmp_path, capsys, config, takes):
    # the command builds token inputs: ViT's forward raised on its missing pixel_values, Whisper's on its features
    from attnswitch import cli
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    code = cli.main(["compare", str(path), "--device", "cpu", "--seq", "8", "--iters", "1", "--backends", "naive"])
    err = capsys.readouterr().err
    assert code == cli.EXIT_BAD_INPUT and "Traceback" not in err, err
    also = ", 'decoder_input_ids': ..." if takes == "input_features" else ""  # (an encoder-decoder's decoder)
    assert f"takes {takes}, not tokens" in err and f"attnswitch.compare(model, {{'{takes}': ...{also}}})" in err, err


@pytest.mark.parametrize("closed, argv, code", [("stdout", ["presets"], 0), ("stderr", ["compare", "--seq", "abc"], 2)])
def test_a_command_with_its_output_closed_ends_with_its_own_exit_code(closed, argv, code):
    # `attnswitch presets >&-` (as cron may run it) was a traceback: Python gives a closed stream as None
    shut = {"stdout": ">&-", "stderr": "2>&-"}[closed]
    r = subprocess.run(f"{sys.executable} -m attnswitch {' '.join(argv)} {shut}", shell=True, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == code, (r.stdout, r.stderr)
    assert "Traceback" not in r.stdout + r.stderr
