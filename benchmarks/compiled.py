"""The deployed path: every backend compiled against the same backend uncompiled, on a GPU.

``python benchmarks/compiled.py OUT [--models llama-3.2-1b,qwen2.5-0.5b] [--workloads prefill,train,generate]
[--backends cudnn,flash,efficient,auto] [--layers 2] [--iters 3]`` writes, per model and workload, the whole
``compare`` report (``compiled_<model>_<workload>.json``) and ``compiled_<models>.json``: per backend its time
uncompiled and compiled, the compile seconds (a one-off cost), when the compile pays for itself,
recompiles, the attention kernel the compiled graph ran (and any mismatch), and whether compiling changes
the pick. Workloads: prefill B4 S2048 and a training step B2 S2048 under ``torch.compile``'s default mode,
a static-cache generate (B4, a 512-token prompt, 128 new tokens) under ``reduce-overhead`` (CUDA graphs),
its decode steps compiled as transformers' own compile of a static cache does.

The models are the presets' shapes cut to ``--layers`` layers (the attention calls are those of the whole
model; compile time grows with the layers). Inductor compiles in this process
(``TORCHINDUCTOR_COMPILE_THREADS=1``, as the command line does). Numerics are checked for prefill and
generate (compiled forwards included); a training step's compiled gradients are checked by the GPU tests
instead (here they would compile each candidate again, in eval mode). The default set is meant to take about
six minutes of one H200, three per model (``--models`` one at a time).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")

import torch

from attnswitch.candidate import Candidate
from attnswitch.comparison import compare
from attnswitch.env import environment
from attnswitch.models import load_model
from attnswitch.results import candidates
from attnswitch.workload import make_workload

__all__ = ["WORKLOADS", "case", "summary", "main"]

#: workload -> (make_workload arguments, compile mode)
WORKLOADS = {
    "prefill": (dict(batch=4, seq=2048, mode="prefill"), "default"),
    "train": (dict(batch=2, seq=2048, mode="train"), "default"),
    "generate": (dict(batch=4, mode="generate", prompt_lens=(512,), new_tokens=128, cache="static"), "reduce-overhead"),
}


def summary(report, backends, mode: str) -> dict:
    """Compiled against uncompiled, per backend, and the pick of each."""
    by = {b.backend: b for b in report.backends}
    rows = {}
    for name in backends:
        u, c = by.get(name), by.get(str(Candidate(name, mode)))
        rows[name] = {
            "uncompiled_ms": u.time_ms if u and u.ok else None, "uncompiled_status": u.status if u else None,
            "compiled_ms": c.time_ms if c and c.ok else None, "compiled_status": c.status if c else None,
            "reasons": list((c.reasons if c else ()) or (u.reasons if u else ())),
            "compile_s": round(c.compile_ms / 1e3, 2) if c and c.compile_ms is not None else None,
            "pays_after_steps": c.compile_pays_after if c else None,
            "graphs": c.graphs if c else None, "recompiles": c.recompiles if c else None,
            "attn_seen": c.attn_seen if c else None, "attn_mismatch": c.attn_mismatch if c else None,
            "speedup": (u.time_ms / c.time_ms) if u and c and u.ok and c.ok and c.time_ms else None,
        }
    picks = candidates(report.ranking)
    plain = next((n for n in picks if by[n].compile is None), None)
    comp = next((n for n in picks if by[n].compile is not None), None)
    return {"backends": rows, "pick_uncompiled": plain, "pick_compiled": comp,
            "pick_changes": None if None in (plain, comp) else comp != str(Candidate(plain, mode)),
            "recommendation": report.recommendation, "ranking": list(report.ranking),
            "time_s": report.settings.get("time_s")}


def case(out: Path, preset: str, workload: str, backends: list[str], layers: int, iters: int) -> dict:
    model, desc = load_model(preset, dtype=torch.bfloat16, device="cuda", layers=layers)
    spec, mode = WORKLOADS[workload]
    work = make_workload(model, **spec)
    t0 = time.perf_counter()
    report = compare(model, work, backends=backends, compile=f"none,{mode}", warmup=1, iters=iters, rounds=iters,
                     model_name=f"{preset} ({layers} layers)", check_numerics=workload != "train",
                     progress=lambda s: print(f"  {s}", flush=True))
    report.to_json(out / f"compiled_{preset}_{workload}.json")
    row = {"model": desc, "workload": work.description, "compile_mode": mode,
           "wall_s": round(time.perf_counter() - t0, 1), **summary(report, backends, mode)}
    del model, work, report
    torch._dynamo.reset()
    torch.cuda.empty_cache()
    return row


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("out")
    p.add_argument("--models", default="llama-3.2-1b,qwen2.5-0.5b")
    p.add_argument("--workloads", default="prefill,train,generate")
    p.add_argument("--backends", default="cudnn,flash,efficient,auto")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--iters", type=int, default=3)
    a = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    backends = [b for b in a.backends.split(",") if b]
    results = {"environment": environment(torch.device("cuda")), "layers": a.layers, "cases": []}
    models = [m for m in a.models.split(",") if m]
    for preset in models:
        for workload in a.workloads.split(","):
            print(f"{preset} {workload}", flush=True)
            t0 = time.perf_counter()
            try:
                results["cases"].append({"preset": preset, "name": workload,
                                         **case(out, preset, workload, backends, a.layers, a.iters)})
            except Exception as e:  # one case failing is a result too; the others still run
                import traceback

                results["cases"].append({"preset": preset, "name": workload, "error": f"{type(e).__name__}: {e}",
                                         "traceback": traceback.format_exc()})
                traceback.print_exc()
            print(f"  {time.perf_counter() - t0:.1f} s", flush=True)
            (out / f"compiled_{'+'.join(models)}.json").write_text(json.dumps(results, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
