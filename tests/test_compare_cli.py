"""compare, reports, models and the command line, on CPU."""

import gzip
import json
from csv import DictReader

import pytest
import torch
from conftest import tiny, use_cpu_clock

import attnswitch
from attnswitch.cli import main
from attnswitch.comparison import rank, recommend, verdict
from attnswitch.hf import dispatch
from attnswitch.models import PRESETS, load_model
from attnswitch.numerics import numerics
from attnswitch.results import SCHEMA_VERSION, BackendResult, Report
from attnswitch.workload import make_workload


@pytest.fixture(scope="module")
def tiny_compare():
    m, _ = load_model("tiny-llama", layers=2)
    w = make_workload(m, batch=2, seq=32, padding=True)
    # measured on this thread's CPU clock, and the compare timed from outside on it too: the account below
    # is checked against a clock that other processes on the machine do not move
    with pytest.MonkeyPatch.context() as mp:
        clock = use_cpu_clock(mp)
        t0 = clock()
        r = attnswitch.compare(m, w, backends=["naive", "naive-inplace", "math", "flash", "cudnn"], warmup=1,
                               iters=4, rounds=2, time_budget_s=0)
        TINY_CPU_S.append(clock() - t0)
    return r


TINY_CPU_S: list[float] = []


def test_where_the_time_went_against_an_outside_clock(tiny_compare):
    spent = tiny_compare.settings["time_s"]
    outside = TINY_CPU_S[0]
    assert spent["total"] <= outside + 0.01 and spent["total"] > 0.8 * outside  # little left outside the account
    parts = sum(v for k, v in spent.items() if k != "total")
    assert parts <= spent["total"] + 0.01 and parts > 0.8 * spent["total"]  # the parts are the total's
    assert {"naive", "math", "flash", "timing rounds", "numerics"} <= set(spent)


def test_compare_ranks_checks_numerics_and_recommends(tiny_compare):
    r = tiny_compare
    assert r["cudnn"].status == "unavailable" and "cudnn" not in r.ranking
    assert set(r.ranking) == {"naive", "naive-inplace", "math", "flash"}
    ratios = [r[n].margin.ratio for n in r.ranking]  # by the median paired ratio to the pick
    assert ratios[0] == 1.0 and ratios[1:] == sorted(ratios[1:]) and r.pick == r.ranking[0]
    for n in r.ranking:
        assert r[n].numerics.ok and r[n].numerics.max_rel_err < 1e-4
        assert r[n].numerics.top1_agreement == 1.0
        assert len(r[n].time_samples_ms) == 4 and len(r[n].time_rounds_ms) == 2
    # two rounds cannot tell backends apart at 95 %: whatever the times, the answer is a tie
    assert r.ties == r.ranking and r.recommendation.startswith(f"Tie: `{r.pick}`")
    assert r.workload["mode"] == "prefill"


def test_a_backend_with_wrong_numerics_is_flagged_and_never_recommended(monkeypatch):
    m, _ = load_model("tiny-llama", layers=2)
    w = make_workload(m, batch=2, seq=16)
    real = dispatch.run_backend

    def corrupted(name, call):  # naive as a kernel that silently corrupts few-KV-head models would
        out, wts = real(name, call)
        return (out + 0.5, wts) if name == "naive" else (out, wts)

    monkeypatch.setattr(dispatch, "run_backend", corrupted)
    nums = numerics(m, w, ["naive", "math"])
    assert not nums["naive"].ok and nums["math"].ok
    rounds = ((1.0,),) * 6
    results = [BackendResult("naive", "ok", time_ms=1.0, time_rounds_ms=rounds, numerics=nums["naive"]),
               BackendResult("math", "ok", time_ms=2.0, time_rounds_ms=rounds, numerics=nums["math"])]
    assert rank(results) == ["math"]
    text = recommend(results, verdict(results))
    assert text.startswith("Use `math`") and "numerics beyond tolerance: naive" in text


def test_ties_are_named_with_their_intervals_and_the_next_beaten_gets_its_margin():
    def result(name, per_round):
        return BackendResult(name, "ok", time_ms=sorted(per_round)[len(per_round) // 2],
                             time_rounds_ms=tuple((x,) for x in per_round))
    results = [result("flash", [1.00, 1.02, 0.99, 1.01, 1.00, 1.03]),
               result("cudnn", [1.01, 1.00, 1.00, 1.02, 0.99, 1.04]),
               result("math", [3.0, 3.1, 2.9, 3.0, 3.05, 3.0])]
    text = recommend(results, verdict(results))
    first, *reasons = text.splitlines()
    assert first == "Tie: `flash` ≈ `cudnn` at 1.010 ms per forward, not told apart: any is as good here."
    assert reasons[0] == "Not told apart from `flash`: `cudnn` 1.01x [0.98–1.01] of its time."
    assert reasons[1] == "Slower: `math` 2.99x [2.91–3.05]."
    assert reasons[2].startswith("Margins: the median ratio of its time to the pick's and its 95% interval, over 6 "
                                 "paired rounds")
    assert "beyond the noise" not in text


def test_report_round_trips_through_json_csv_markdown(tiny_compare, tmp_path):
    r = tiny_compare
    r.to_json(tmp_path / "r.json")
    back = Report.from_json(tmp_path / "r.json")
    assert back.ranking == r.ranking and back["naive"].time_ms == r["naive"].time_ms
    assert back["naive"].numerics == r["naive"].numerics
    assert back["naive"].layers == r["naive"].layers
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["schema_version"] == SCHEMA_VERSION == 7 and data["environment"]["torch"] == torch.__version__
    csv = r.to_csv()
    assert csv.splitlines()[0].startswith("backend,rank,status") and len(csv.splitlines()) == 6
    ranked = {row["rank"]: row["backend"] for row in DictReader(csv.splitlines()) if row["rank"]}
    assert [ranked[str(i + 1)] for i in range(len(ranked))] == list(r.ranking)  # the ranking, as the report's
    md = r.to_markdown()
    assert "| backend |" in md and "Recommendation" in md and "cudnn" in md
    text = str(r)
    assert "model.layers.*.self_attn [attention] ×2" in text
    copied = r.save_traces(tmp_path / "traces")
    assert len(copied) == 4 and all(p.exists() for p in copied)


def test_report_json_is_strict_json_and_a_non_finite_figure_reads_back(tiny_compare):
    # a backend that gave NaN has an infinite error: JSON has no Infinity (a browser's JSON.parse refuses it)
    import dataclasses
    import math

    b = tiny_compare["naive"]
    broken = dataclasses.replace(b, numerics=dataclasses.replace(b.numerics, max_rel_err=math.inf,
                                                                 mean_rel_err=math.nan))
    r = dataclasses.replace(tiny_compare, backends=tuple(broken if x is b else x for x in tiny_compare.backends))
    text = r.to_json()

    def refuse(constant):
        raise ValueError(f"not strict JSON: {constant}")
    strict = json.loads(text, parse_constant=refuse)
    assert next(x for x in strict["backends"] if x["backend"] == "naive")["numerics"]["max_rel_err"] == "inf"
    back = Report.from_json(text)
    assert back["naive"].numerics.max_rel_err == math.inf and math.isnan(back["naive"].numerics.mean_rel_err)
    assert back.to_json() == text


@pytest.mark.parametrize("doc, said", [
    ({"schema": 1, "selection": "flash"}, "a policy file, not a report: attnswitch.load_policy reads it"),
    ({"backends": []}, "not a report of schema 1 to 7 ('schema_version' is null)"),
    ([1, 2], "not a report of schema 1 to 7 ('schema_version' is null)"),
    ({"schema_version": 7, "backends": "x"}, "a report whose fields do not read as one"),
])
def test_a_file_that_is_no_report_is_one_line_naming_it(doc, said, tmp_path):
    # a policy file gave "report schema None is not one of (1..7)"; a damaged report an AttributeError
    p = tmp_path / "r.json"
    p.write_text(json.dumps(doc))
    with pytest.raises(ValueError) as e:
        Report.from_json(p)
    assert str(e.value).startswith(f"{p}: ") and said in str(e.value) and "\n" not in str(e.value)


def test_decode_mode_compares_one_token_against_a_cache():
    m, _ = load_model("tiny-llama", layers=2)
    w = make_workload(m, batch=2, seq=16, mode="decode")
    r = attnswitch.compare(m, w, backends=["naive", "flash"], warmup=1, iters=2, rounds=1)
    assert r.workload["mode"] == "decode" and all(b.ok for b in r.backends)
    assert r["flash"].numerics.ok
    # each call got its own cache copy: the cache the workload holds still has 16 tokens
    key = "cache" if "cache" in w.kwargs else "past_key_values"
    assert w.kwargs[key].get_seq_length() == 16


def test_presets_build_real_architectures():
    assert {"llama-3.2-1b", "qwen2.5-0.5b", "mistral-7b", "gpt2", "bert-base"} <= set(PRESETS)
    cfg = PRESETS["llama-3.2-1b"].make_config()
    assert (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.hidden_size) == (32, 8, 2048)
    assert PRESETS["mistral-7b"].make_config().sliding_window == 4096


def test_load_model_from_a_local_folder_and_a_config(tmp_path):
    m = tiny("llama")
    m.save_pretrained(tmp_path / "model")  # safetensors
    loaded, desc = load_model(str(tmp_path / "model"))
    assert desc.startswith("folder")
    ids = torch.ones(1, 5, dtype=torch.long)
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=ids).logits, m(input_ids=ids).logits)
    rand, desc = load_model(str(tmp_path / "model" / "config.json"))
    assert "random weights" in desc and type(rand).__name__ == "LlamaForCausalLM"


def test_load_model_bad_input(tmp_path):
    with pytest.raises(ValueError, match="not a preset"):
        load_model("no-such-model")
    with pytest.raises(ValueError, match="no such file"):
        load_model("./missing/dir")
    bad = tmp_path / "config.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="cannot read this config"):
        load_model(str(bad))
    (tmp_path / "pickled").mkdir()
    (tmp_path / "pickled" / "config.json").write_text("{}")
    with pytest.raises(ValueError, match="safetensors"):
        load_model(str(tmp_path / "pickled"))
    with pytest.raises(ValueError, match="dtype"):
        load_model("tiny-llama", dtype="fp8")


def test_cli_compare_writes_every_output(tmp_path, capsys):
    out = tmp_path / "rep"
    rc = main(["compare", "tiny-llama", "--device", "cpu", "--num-layers", "2", "--seq", "32", "--iters", "2",
               "--warmup", "1", "--backends", "naive,flash,cudnn", "--out", str(out)])
    assert rc == 0
    for f in ("report.json", "report.csv", "report.md", "report.html", "command.txt"):
        assert (out / f).stat().st_size > 0
    traces = sorted((out / "traces").glob("trace_*.json.gz"))
    assert [t.name for t in traces] == ["trace_flash.json.gz", "trace_naive.json.gz"]
    for t in traces:  # one ProfilerStep per profiled forward, and the rank, as HolisticTraceAnalysis reads them
        data = json.loads(gzip.decompress(t.read_bytes()))
        assert data["distributedInfo"]["rank"] == 0
        steps = json.loads((out / "report.json").read_text())["settings"]["profile_steps"]
        assert sum(e.get("name", "").startswith("ProfilerStep#") for e in data["traceEvents"]) == steps >= 1
    assert "Recommendation" in capsys.readouterr().out
    assert (out / "command.txt").read_text().startswith("attnswitch compare tiny-llama")
    html = (out / "report.html").read_text()
    # the ranked time against the pick, host time per forward, host cost per attention call, numerics; no device
    # time per call on a CPU
    assert html.count('<figure class="plot"') == html.count("<svg") == 4


def test_unfold_unfolds_the_printed_tables_and_the_files(tmp_path, capsys):
    out = tmp_path / "rep"
    rc = main(["compare", "tiny-llama", "--device", "cpu", "--num-layers", "2", "--seq", "8", "--iters", "2",
               "--rounds", "1", "--backends", "math", "--unfold", "--out", str(out)])
    printed = capsys.readouterr().out
    assert rc == 0 and "math: per layer" in printed  # (printed, as --layers does)
    for text in (printed, (out / "report.md").read_text(), (out / "report.html").read_text()):
        assert "model.layers.1.self_attn" in text and "×2" not in text
    folded = Report.from_json(out / "report.json").to_markdown()
    assert "model.layers.*.self_attn [attention] ×2" in folded and "model.layers.1.self_attn" not in folded


def test_cli_exit_codes(tmp_path, capsys):
    assert main(["compare", "no-such-model"]) == 2
    assert "not a preset" in capsys.readouterr().err
    quick = ["profile", "tiny-llama", "--device", "cpu", "--num-layers", "1", "--seq", "16", "--iters", "1",
             "--warmup", "0"]
    # nothing this device offers: refused before any work, as bad input
    assert main([*quick, "--backends", "cudnn,efficient"]) == 2
    capsys.readouterr()
    never = attnswitch.register_backend("never", lambda q, k, v, **kw: q, check=lambda *a, **k: "not these inputs")
    try:
        assert main([*quick, "--backends", never]) == 1  # nothing could run these inputs
    finally:
        attnswitch.unregister_backend(never)
    assert main(["check", "tiny-llama", "--num-layers", "1", "--seq", "16", "--backends", "fastest"]) == 2
    assert main(["compare", "tiny-llama", "--device", "cuda:0"]) == (0 if torch.cuda.is_available() else 2)
    for device in ("meta", "mps", "cuda:99", "cpu:1"):  # no data to time, no SDPA backend to force, no such GPU
        assert main(["compare", "tiny-llama", "--device", device, "--seq", "16"]) == 2
    assert "error: --device cpu:1: the CPU is one device, cpu (or cpu:0)" in capsys.readouterr().err


def test_cli_check_and_env(capsys):
    assert main(["check", "tiny-llama", "--device", "cpu", "--num-layers", "1", "--seq", "16", "--padding"]) == 0
    out = capsys.readouterr().out
    assert "naive          ok" in out and "flash          ok" in out
    assert main(["env"]) == 0
    out = capsys.readouterr().out
    assert "transformers" in out and "sdpa auto picks" in out
    assert main(["presets"]) == 0


def _out_of_memory_in(monkeypatch, backend: str, error: Exception) -> None:
    """``backend``'s attention calls raise ``error``, by either path (its common call's op, the forced one)."""
    real = dispatch.run_backend

    def run(name, call):
        if name == backend:
            raise error
        return real(name, call)

    def common(*args):
        raise error

    monkeypatch.setattr(dispatch, "run_backend", run)
    if backend in dispatch.COMMON_OPS:
        monkeypatch.setattr(dispatch, "COMMON_OPS", {**dispatch.COMMON_OPS, backend: common})


def test_out_of_memory_on_one_backend_is_recorded_and_the_others_run(monkeypatch):
    m, _ = load_model("tiny-llama", layers=1)
    w = make_workload(m, batch=1, seq=16)
    _out_of_memory_in(monkeypatch, "flash", torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 80.00 GiB"))
    r = attnswitch.compare(m, w, backends=["flash", "math", "naive"], warmup=0, iters=2, rounds=1)
    assert r["flash"].status == "failed" and "out of memory" in r["flash"].reasons[0]
    assert r["math"].ok and r["naive"].ok and "flash" not in r.ranking


_CPU_OOM = "[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: you tried"


def test_s_by_s_scores_that_do_not_fit_fail_naive_alone_not_the_warm_up_nor_a_fused_backend(monkeypatch):
    # the step before every backend runs naive: where its scores do not fit (a long sequence), a fused kernel may
    # still, and naive itself is a failed row, as any backend that runs out of memory (the CPU's allocator says
    # so in a RuntimeError)
    m, _ = load_model("tiny-llama", layers=1)
    w = make_workload(m, batch=1, seq=16)
    _out_of_memory_in(monkeypatch, "naive", RuntimeError(_CPU_OOM))
    r = attnswitch.compare(m, w, backends=["flash", "naive"], warmup=0, iters=2, rounds=1)
    assert r["naive"].status == "failed" and r["naive"].reasons[0].startswith("out of memory: ")
    assert r["flash"].ok and r.pick == "flash"


def test_out_of_memory_outside_attention_is_one_line_exit_1_and_the_old_report_stays(monkeypatch, tmp_path, capsys):
    import torch.nn.functional as F

    from attnswitch.cli import main

    out = tmp_path / "rep"
    assert main(["compare", "tiny-llama", "--num-layers", "1", "--seq", "16", "--backends", "flash", "--rounds", "1",
                 "--iters", "1", "--no-numerics", "--out", str(out)]) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    capsys.readouterr()

    def embedding(*a, **k):
        raise RuntimeError(_CPU_OOM)
    monkeypatch.setattr(F, "embedding", embedding)  # the model's own first layer: before any attention
    code = main(["compare", "tiny-llama", "--num-layers", "1", "--seq", "16", "--backends", "flash", "--rounds", "1",
                 "--iters", "1", "--no-numerics", "--out", str(out)])
    said = capsys.readouterr()
    assert code == 1 and "Traceback" not in said.err and "flash failed: out of memory: " in said.out, said
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before
    monkeypatch.setattr("attnswitch.models.load_model", lambda *a, **k: (_ for _ in ()).throw(RuntimeError(_CPU_OOM)))
    code = main(["compare", "tiny-llama", "--out", str(out)])  # outside any backend: one line
    err = capsys.readouterr().err.strip()
    assert code == 1 and err.startswith("error: out of memory: ") and "\n" not in err, err
    assert f"kept the previous report in {out}" in err and "--seq" in err
    assert main(["compare", "tiny-llama", "--mode", "generate", "--prompt-len", "8", "--new-tokens", "2"]) == 1
    err = capsys.readouterr().err  # (a generate takes no --seq: its lengths are its prompts' and new tokens')
    assert "a smaller --batch, --prompt-len, --new-tokens or model may fit" in err and "--seq" not in err, err
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before


def test_hub_id_without_a_reachable_hub_is_a_clear_error_at_once(monkeypatch):
    import socket
    import threading
    import time

    from attnswitch import models

    lookups, pauses = [], []

    def no_dns(host, *a, **k):
        lookups.append(host)
        raise socket.gaierror(-2, "Name or service not known")
    for k in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setattr(socket, "getaddrinfo", no_dns)
    assert models._hub_unresolvable()
    lookups.clear()
    here, sleep = threading.current_thread(), time.sleep

    def pause(seconds):  # a retry's pause in this test's thread, counted (and not waited for)
        if threading.current_thread() is here:
            pauses.append(seconds)
        else:
            sleep(seconds)
    monkeypatch.setattr(time, "sleep", pause)
    with pytest.raises(ValueError, match="someone/some-model: cannot load from the hub here"):
        models.load_model("someone/some-model")
    # the local cache asked alone, not half a minute of retried requests: asked, the hub client retries its
    # request 5 times, pausing before each (10 look-ups of the hub's name and 23 s on the 2-core CPU machine).
    # Here: attnswitch's own look-up, and at most one of the hub client's (it fetches a list of its own once
    # per process), never a retry
    assert pauses == [] and len(lookups) <= 2, (pauses, lookups)
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example:3128")
    assert not models._hub_unresolvable()  # a proxy resolves names itself: the hub is asked as usual


@pytest.mark.parametrize("args, said", [
    (["--out", ""], "--out is empty"), (["--out", " "], "--out is empty"),
    (["--seq", "16,"], "not '16,'"), (["--seq", ",16"], "not ',16'"), (["--seq", "16,16"], "names a value twice"),
    (["--batch", "1,,2"], "not '1,,2'")])
def test_a_list_with_a_value_left_out_or_twice_and_an_empty_out_are_one_line_exit_2(args, said, capsys):
    # accepted before: "--seq 16," as 16, "16,16" as a sweep of one shape twice, --out "" wrote nothing, silently
    from attnswitch.cli import main

    assert main(["compare", "tiny-llama", "--seq", "16", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert said in err and len(err.splitlines()) == 1, err


def test_a_workloads_prompt_lengths_may_repeat_a_length_a_sweeps_points_may_not():
    from attnswitch.cli import build_parser

    args = build_parser().parse_args(["compare", "--mode", "generate", "--prompt-lens", "16,16,32"])
    assert args.prompt_lens == [16, 16, 32]  # three prompts, two of one length
    with pytest.raises(SystemExit):
        build_parser().parse_args(["compare", "--mode", "generate", "--prompt-len", "16,16"])


def test_what_reads_as_out_of_memory():
    from attnswitch.errors import out_of_memory

    assert out_of_memory(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    for text in (_CPU_OOM, "CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported",
                 "cuDNN error: CUDNN_STATUS_ALLOC_FAILED", "CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling "
                 "`cublasCreate(handle)`"):
        assert out_of_memory(RuntimeError(text)), text
    for e in (RuntimeError("shape mismatch"), ValueError("can't allocate memory"), MemoryError()):
        assert not out_of_memory(e), e  # (MemoryError: taken where it is caught, apart from this)
