"""What changes between prefill, generation and training: the workloads compared on a GPU.

``python -m benchmarks.workloads OUT [--quick]`` writes one report per workload under ``OUT`` (JSON and
markdown) and ``workloads.json`` with the headline numbers: generate and train on the Llama-3.2-1B preset
and on a second architecture, a sweep of prefill lengths, and the generate ranking checked against an
independent timing loop of ``model.generate()`` under each backend.
"""

from __future__ import annotations

import gc
import json
import sys
import time
from pathlib import Path

import torch

import attnswitch
from attnswitch.comparison import compare, compare_sweep
from attnswitch.env import environment
from attnswitch.models import load_model
from attnswitch.stats import median, noise_pct
from attnswitch.workload import make_workload

from .user_loop import users_switch

__all__ = ["generate_case", "train_case", "sweep_case", "independent_generate", "main"]


def _save(out: Path, name: str, report) -> dict:
    report.to_json(out / f"{name}.json")
    report.to_markdown(out / f"{name}.md")
    return {"recommendation": report.recommendation, "ranking": list(report.ranking),
            "time_s": report.settings.get("time_s")}


def independent_generate(work, names, repeats=5) -> dict:
    """Each backend's generate workload timed outside attnswitch's measurement: ``model.generate()`` on
    every prompt as a user runs it (``user_loop.users_switch``: ``attnswitch.backend``, none for ``auto`` on a
    model that runs it unswitched, as the report times it), wall clock with the device synchronized, after a warm-up.
    Prompt by prompt, every backend generating it in turn (the first backend rotating), so that a slow
    spell of the machine falls on all alike; a backend's workload is the sum over prompts of each prompt's
    median, its whole workloads (every prompt once per repeat) a check. Garbage is collected before each
    sample and not inside it, as ``timeit`` does (and as the report's own timing does): the process holds a
    large heap, and a collection inside a host-bound generate would be timed as the backend's."""
    def generate(p):
        work.model.generate(**p, **work.generate_kwargs())

    per: dict[str, list[list[float]]] = {n: [[] for _ in work.prompts] for n in names}
    for name in names:
        with users_switch(name, work.model):
            for p in work.prompts:  # warm: every length once
                generate(p)
    turn = 0
    for _ in range(repeats):
        for i, p in enumerate(work.prompts):
            order = names[turn % len(names):] + names[:turn % len(names)]
            turn += 1
            for name in order:
                with users_switch(name, work.model):
                    gc.collect()
                    gc.disable()
                    try:
                        torch.cuda.synchronize()
                        t0 = time.perf_counter()
                        generate(p)
                        torch.cuda.synchronize()
                        per[name][i].append((time.perf_counter() - t0) * 1e3)
                    finally:
                        gc.enable()
    out = {}
    for n, prompts in per.items():
        whole = [sum(xs) for xs in zip(*prompts)]
        out[n] = {"median_ms": sum(median(xs) for xs in prompts), "whole_median_ms": median(whole),
                  "ms": min(whole), "noise_pct": noise_pct(whole), "samples": whole}
    return out


def _agreement(report, independent: dict) -> dict:
    """Does the independent timing order the backends as the report ranks them (ties within noise)?"""
    ranked = [n for n in report.ranking if n in independent]
    disagreements = []
    for i, a in enumerate(ranked):
        for b in ranked[i + 1:]:
            ta, tb = independent[a]["median_ms"], independent[b]["median_ms"]
            noise = max(independent[a]["noise_pct"] or 0, independent[b]["noise_pct"] or 0,
                        report[a].noise_pct or 0, report[b].noise_pct or 0, 2.0)
            if ta > tb * (1 + noise / 100):
                disagreements.append(f"{a} ranked before {b}, but {ta:.1f} ms > {tb:.1f} ms independently")
    ratios = {n: report[n].time_ms / independent[n]["median_ms"] for n in ranked}
    return {"agrees": not disagreements, "disagreements": disagreements, "report_over_independent": ratios}


#: every backend but flex, whose compiles add about a minute per case (flex's generate on the 1B preset is in
#: results/h200/workloads/generate_llama_flex.json; the second architecture's generate and both training
#: cases take every backend)
NO_FLEX = "naive,naive-inplace,math,efficient,flash,cudnn,auto,eager"


def generate_case(out: Path, name: str, preset: str, layers=None, batch=4, prompt_len=512, new_tokens=32,
                  n_prompts=3, iters=5, backends=None) -> dict:
    model, desc = load_model(preset, dtype="bf16", device="cuda", layers=layers)
    gap = max(1, new_tokens // 2)
    lens = tuple(prompt_len + (i - n_prompts // 2) * gap for i in range(n_prompts))
    work = make_workload(model, batch=batch, seq=prompt_len, mode="generate", new_tokens=new_tokens, prompt_lens=lens)
    report = compare(model, work, backends=backends, warmup=1, iters=iters, rounds=iters, model_name=preset)
    summary = _save(out, name, report)
    ok = [b.backend for b in report.ok]
    independent = independent_generate(work, [n for n in report.ranking if "=" not in n], repeats=iters)
    summary.update(model=desc, independent=independent, check=_agreement(report, independent),
                   backends={b.backend: {"status": b.status, "time_ms": b.time_ms, "noise_pct": b.noise_pct,
                                         **({k: v for k, v in vars(b.generate).items() if k != "slow_calls"}
                                            if b.generate else {"reasons": list(b.reasons)})}
                             for b in report.backends}, ran=ok)
    del model
    torch.cuda.empty_cache()
    return summary


def train_case(out: Path, name: str, preset: str, layers=None, batch=2, seq=2048, iters=5) -> dict:
    model, desc = load_model(preset, dtype="bf16", device="cuda", layers=layers)
    work = make_workload(model, batch=batch, seq=seq, mode="train")
    report = compare(model, work, warmup=2, iters=iters, rounds=iters, model_name=preset)  # every backend
    summary = _save(out, name, report)
    summary.update(model=desc, backends={b.backend: {"status": b.status, "time_ms": b.time_ms, "noise_pct": b.noise_pct,
                                                     "peak_mem_mb": b.peak_mem_mb, "reasons": list(b.reasons),
                                                     **(vars(b.train) if b.train else {})} for b in report.backends})
    del model
    torch.cuda.empty_cache()
    return summary


def sweep_case(out: Path, name: str, preset: str, seqs=(512, 1024, 2048, 4096, 8192, 16384), batch=1,
               iters=3) -> dict:
    model, desc = load_model(preset, dtype="bf16", device="cuda")
    report = compare_sweep(model, [(batch, s) for s in seqs], backends=NO_FLEX, warmup=1, iters=iters, rounds=iters,
                           profile_steps=1, model_name=preset)
    summary = _save(out, name, report)
    summary.update(model=desc, points=[{"seq": p.seq, "ranking": list(p.ranking),
                                        "ms": {b.backend: b.time_ms for b in p.backends}} for p in report.sweep])
    del model
    torch.cuda.empty_cache()
    return summary


def trace_for_tests(out: Path) -> dict:
    """A recorded training step of a 2-layer Llama (for the CPU tests' backward attribution)."""
    import gzip
    import shutil
    import tempfile

    model, _ = load_model("tiny-llama", dtype="bf16", device="cuda", layers=2)
    work = make_workload(model, batch=1, seq=64, mode="train")
    tmp = tempfile.mkdtemp()
    rep = attnswitch.profile(model, work, backends=["naive", "flash", "cudnn"], warmup=1, iters=1, trace_dir=tmp)
    for b in rep.ok:
        shutil.copyfile(b.trace_path, out / f"train2l_{b.backend}.json.gz")
    rep.to_json(out / "train2l_report.json")
    return {"recorded": [b.backend for b in rep.ok], "gz": bool(gzip)}


CASES = {
    "generate_llama": lambda out, q: generate_case(out, "generate_llama", "llama-3.2-1b", new_tokens=16 if q else 24,
                                                   backends=NO_FLEX),
    "generate_qwen": lambda out, q: generate_case(out, "generate_qwen", "qwen2.5-0.5b", layers=8,
                                                  new_tokens=16 if q else 24),
    "train_llama": lambda out, q: train_case(out, "train_llama", "llama-3.2-1b"),
    "train_qwen": lambda out, q: train_case(out, "train_qwen", "qwen2.5-0.5b", layers=8),
    "sweep_prefill": lambda out, q: sweep_case(out, "sweep_prefill", "llama-3.2-1b",
                                               seqs=(512, 2048, 8192, 16384)),
    "train_trace": lambda out, q: trace_for_tests(out),
}


def main(argv=None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    quick = "--quick" in args
    only = next((a.split("=", 1)[1].split(",") for a in args if a.startswith("--only=")), list(CASES))
    out = Path(next(a for a in args if not a.startswith("--")))
    out.mkdir(parents=True, exist_ok=True)
    results = {"environment": environment(), "command": "python -m benchmarks.workloads " + " ".join(args)}
    for name in only:
        t0 = time.perf_counter()
        try:
            results[name] = {"status": "ok", **CASES[name](out, quick)}
        except Exception as e:  # a case that breaks is recorded, the others still run
            import traceback
            results[name] = {"status": "failed", "error": f"{type(e).__name__}: {e}",
                             "traceback": traceback.format_exc()}
        results[name]["seconds"] = time.perf_counter() - t0
        print(f"{name}: {results[name]['status']} in {results[name]['seconds']:.1f} s", flush=True)
        (out / "workloads.json").write_text(json.dumps(results, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
