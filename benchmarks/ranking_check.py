"""The ranking against independent loops on a GPU: does ``compare`` say what a user's own loop measures,
as fast as it should?

``python -m benchmarks.ranking_check OUT [--only=generate,prefill,train]`` writes ``ranking_check.json``:

- ``generate``: a Mistral-shaped 8-layer model, B4, prompts 368-400, 32 new tokens, six backends,
  compared twice (wall time of each ``compare``, its order, its ties and margins), then an independent
  ``model.generate()`` loop per backend (medians of 5 interleaved repeats);
- ``prefill``: the default preset's prefill compare (wall time and answer);
- ``train``: a Qwen3-shaped 6-layer model, B2 S2048: ``compare(mode="train")`` against an independent
  training loop on the same inputs (forward with labels, backward, ``zero_grad(set_to_none=True)``; CUDA
  events per step, medians of 6 rounds x 6 steps), run before and after the compare (the host drifts), with
  the forward and backward apart, and the step ``compare`` times (one untimed step after the switch, one
  timed) in the same rounds, per backend;
- ``train_device_bound``: the same at B4 S4096 (3 rounds), where the GPU, not the host, sets every backend's
  step;
- ``user_loop`` (only when named): ``benchmarks.user_loop``, the train checks' successor: every backend's
  ranked step against a user's back-to-back loop, prefill, decode and train at three shapes, each ratio held
  to 0.97-1.03 (under ``OUT/user_loop``).
"""

from __future__ import annotations

import gc
import json
import sys
import time
from pathlib import Path

import torch

import attnswitch
from attnswitch.comparison import compare
from attnswitch.env import environment
from attnswitch.models import load_model
from attnswitch.stats import median
from attnswitch.workload import make_workload

from .workloads import independent_generate

__all__ = ["generate_check", "prefill_check", "train_check", "independent_train", "user_loop_check", "main"]

GENERATE_BACKENDS = ["auto", "flash", "cudnn", "naive-inplace", "math", "efficient"]
TRAIN_BACKENDS = ["flash", "cudnn", "efficient", "math", "naive-inplace"]


def _answer(report, wall_s: float) -> dict:
    return {"wall_s": round(wall_s, 1), "order": list(report.ranking), "ties": list(report.ties),
            "recommendation": report.recommendation, "time_s": report.settings.get("time_s"),
            "host": report.settings.get("host"),
            "backends": {b.backend: {"time_ms": b.time_ms, "noise_pct": b.noise_pct,
                                     "margin": b.margin.text() if b.margin else None,
                                     "rounds": len(b.time_rounds_ms), "samples": list(b.time_samples_ms),
                                     "workload_wall_ms": b.generate.workload_wall_ms if b.generate else None}
                         for b in report.backends}}


def generate_check(out: Path) -> dict:
    model, desc = load_model("mistral-7b", dtype="bf16", device="cuda", layers=8)
    work = make_workload(model, batch=4, seq=384, mode="generate", new_tokens=32)
    runs = []
    for i in range(2):
        t0 = time.perf_counter()
        report = compare(model, work, backends=GENERATE_BACKENDS, model_name="mistral-7b (8 layers)")
        runs.append(_answer(report, time.perf_counter() - t0))
        report.to_json(out / f"generate_run{i + 1}.json")
        print(f"generate compare {i + 1}: {runs[-1]['wall_s']} s, order {runs[-1]['order']}, ties {runs[-1]['ties']}",
              flush=True)
        (out / "generate_runs.json").write_text(json.dumps(runs, indent=1, default=str))  # kept if the loop is cut
    independent = independent_generate(work, GENERATE_BACKENDS, repeats=5)
    order = sorted(independent, key=lambda n: independent[n]["median_ms"])
    del model
    torch.cuda.empty_cache()
    return {"model": desc, "prompt_lens": list(work.generation.prompt_lens), "runs": runs,
            "independent_median_ms": {n: independent[n]["median_ms"] for n in order}, "independent": independent,
            "same_order_twice": runs[0]["order"] == runs[1]["order"],
            "same_answer_twice": _answer_of(runs[0]) == _answer_of(runs[1])}


def _answer_of(run: dict) -> tuple:
    """What a compare tells: the backends tied for first (as a set), then the order of those told apart."""
    ties = set(run["ties"]) or {run["order"][0]}
    return frozenset(ties), tuple(n for n in run["order"] if n not in ties)


def prefill_check(out: Path) -> dict:
    model, desc = load_model("llama-3.2-1b", dtype="bf16", device="cuda")
    work = make_workload(model, batch=4, seq=2048)
    t0 = time.perf_counter()
    report = compare(model, work, model_name="llama-3.2-1b")
    answer = _answer(report, time.perf_counter() - t0)
    report.to_json(out / "prefill.json")
    del model
    torch.cuda.empty_cache()
    return {"model": desc, **answer}


def independent_train(model, kwargs, names, rounds=3, steps=6) -> dict:
    """A user's training loop per backend, outside attnswitch's measurement, on ``kwargs`` (the compare's
    inputs: ids, attention mask, labels): forward with labels, backward,
    ``zero_grad(set_to_none=True)``; CUDA events around each step and around its forward; the backends
    in turn in each round; garbage collected before each backend's turn, not inside it.

    Each round also times, per backend, the step ``compare`` times: one untimed step right after the
    switch, then one timed (``after_switch``). Both kinds share the rounds, so a host that changes speed
    changes both alike: a gap between them is the method's, not the moment's."""
    model.train()
    out: dict = {n: {"step": [], "forward": [], "backward": [], "after_switch": []} for n in names}

    def step():
        a, b, c = (torch.cuda.Event(enable_timing=True) for _ in range(3))
        a.record()
        loss = model(**kwargs).loss
        b.record()
        loss.backward()
        model.zero_grad(set_to_none=True)
        c.record()
        c.synchronize()
        return a.elapsed_time(c), a.elapsed_time(b), b.elapsed_time(c)

    for name in names:  # warm
        with attnswitch.backend(name, model=model):
            for _ in range(2):
                step()
    torch.cuda.synchronize()
    for _ in range(rounds):
        for turn in ("loop", "after_switch"):
            for name in names:
                gc.collect()
                gc.disable()
                try:
                    with attnswitch.backend(name, model=model):
                        if turn == "after_switch":
                            step()
                            out[name]["after_switch"].append(step()[0])
                            continue
                        for _ in range(steps):
                            s, f, b = step()
                            out[name]["step"].append(s)
                            out[name]["forward"].append(f)
                            out[name]["backward"].append(b)
                finally:
                    gc.enable()
    model.eval()
    return {n: {k: median(v) for k, v in d.items()} for n, d in out.items()}


def _probe_ms() -> float:
    """A fixed host task (ms): how fast the host is right now."""
    t = time.perf_counter()
    sum(i * i for i in range(200_000))
    return (time.perf_counter() - t) * 1e3


def train_check(out: Path, batch: int = 2, seq: int = 2048, name: str = "train", rounds: int = 6) -> dict:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen3Config(hidden_size=1024, intermediate_size=3072, num_hidden_layers=6, num_attention_heads=16,
                      num_key_value_heads=8, head_dim=128, vocab_size=32000, max_position_embeddings=4096)
    model = Qwen3ForCausalLM(cfg).to("cuda", torch.bfloat16).eval()
    work = make_workload(model, batch=batch, seq=seq, mode="train")
    names = list(TRAIN_BACKENDS)
    probe = [_probe_ms()]
    before = independent_train(model, work.kwargs, names, rounds)  # the loop before and after: the host drifts
    probe.append(_probe_ms())
    t0 = time.perf_counter()
    report = compare(model, work, backends=names, model_name="qwen3 (6 layers)")
    answer = _answer(report, time.perf_counter() - t0)
    report.to_json(out / f"{name}.json")
    probe.append(_probe_ms())
    after = independent_train(model, work.kwargs, names, rounds)
    probe.append(_probe_ms())
    rows = {}
    for n in names:
        b = report[n]
        if not b.ok:
            continue
        loop = {k: (before[n][k] + after[n][k]) / 2 for k in before[n]}
        rows[n] = {"compare_step_ms": b.time_ms, "loop_step_ms": loop["step"],
                   "loop_step_ms_before_after": [before[n]["step"], after[n]["step"]],
                   "loop_after_switch_ms": loop["after_switch"],
                   "compare_over_loop": b.time_ms / loop["step"],
                   "after_switch_over_loop": loop["after_switch"] / loop["step"],
                   "compare_forward_ms": b.train.forward_ms, "loop_forward_ms": loop["forward"],
                   "compare_backward_ms": b.train.backward_ms, "loop_backward_ms": loop["backward"]}
        print(f"{name} {n}: compare {b.time_ms:.2f} ms, own loop {loop['step']:.2f} ms "
              f"(before {before[n]['step']:.2f}, after {after[n]['step']:.2f}; {rows[n]['compare_over_loop']:.3f}), "
              f"one step after a switch {loop['after_switch']:.2f} ms", flush=True)
    del model
    torch.cuda.empty_cache()
    return {"workload_kwargs": sorted(work.kwargs), **answer, "against_loop": rows, "host_probe_ms": probe,
            "within_5pct": all(abs(r["compare_over_loop"] - 1) <= 0.05 for r in rows.values())}


def train_device_bound_check(out: Path) -> dict:
    """The train check where the GPU, not the host, sets every backend's step time (B4 S4096): a host whose
    speed drifts moves host-bound steps by tens of percent within a minute, device-bound ones not."""
    return train_check(out, batch=4, seq=4096, name="train_device_bound", rounds=3)


def user_loop_check(out: Path) -> dict:
    """``benchmarks.user_loop`` under ``out/user_loop``: its run's record, its verdict as this check's."""
    from . import user_loop

    rc = user_loop.run(out / "user_loop")
    run = json.loads((out / "user_loop" / "user_loop_run.json").read_text())
    if rc:
        raise RuntimeError(f"user loop check: {len(run['outside_band'])} ratios outside {user_loop.LOW}-"
                           f"{user_loop.HIGH}, checks not ok: {run['failed_checks']}")
    return run


CHECKS = {"generate": generate_check, "prefill": prefill_check, "train": train_check,
          "train_device_bound": train_device_bound_check, "user_loop": user_loop_check}
#: what runs when no ``--only`` is given (``user_loop`` takes its own 7 minutes)
DEFAULT = ["generate", "prefill", "train", "train_device_bound"]


def main(argv=None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    only = next((a.split("=", 1)[1].split(",") for a in args if a.startswith("--only=")), DEFAULT)
    out = Path(next(a for a in args if not a.startswith("--")))
    out.mkdir(parents=True, exist_ok=True)
    results = {"environment": environment(), "command": "python -m benchmarks.ranking_check " + " ".join(args)}
    for name in only:
        t0 = time.perf_counter()
        try:
            results[name] = {"status": "ok", **CHECKS[name](out)}
        except Exception as e:  # a check that breaks is recorded, the others still run
            import traceback
            results[name] = {"status": "failed", "error": f"{type(e).__name__}: {e}",
                             "traceback": traceback.format_exc()}
        results[name]["seconds"] = round(time.perf_counter() - t0, 1)
        print(f"{name}: {results[name]['status']} in {results[name]['seconds']} s", flush=True)
        (out / "ranking_check.json").write_text(json.dumps(results, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
