"""Generate sweeps over prompt lengths on a GPU: where the order between backends moves with the length.

``python -m benchmarks.generate_sweep OUT [--only=llama,qwen] [--lens=256,1024,4096] [--new=64]`` writes
``generate_sweep.json`` (and each model's report as JSON and markdown): per prompt length, every backend's
time, the ties, the crossovers the sweep found, and the serving estimate over a length mix that weights
the measured lengths (a short-prompt-heavy mix, as chat traffic is) for 10 and 10,000 requests.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from pathlib import Path

import torch

from attnswitch import comparison
from attnswitch.comparison import compare_sweep
from attnswitch.env import environment
from attnswitch.lengths import Lengths
from attnswitch.models import load_model
from attnswitch.serving import serving_estimate

__all__ = ["sweep_case", "main"]

BACKENDS = "auto,flash,cudnn,efficient"
PRESETS = {"llama": "llama-3.2-1b", "qwen": "qwen2.5-0.5b"}


@contextlib.contextmanager
def _each_point_kept(out: Path, key: str, t0: float):
    """Each length's whole report written as soon as it is measured: a call cut by its time limit keeps the
    lengths it finished (the sweep's own report exists only at the end)."""
    inner, n = comparison.compare, [0]

    def kept(*a, **k):
        report = inner(*a, **k)
        n[0] += 1
        report.to_json(out / f"generate_sweep_{key}_length{n[0]}.json")
        print(f"{time.perf_counter() - t0:7.1f} s  length {n[0]} measured: {list(report.ranking)}", flush=True)
        return report
    comparison.compare = kept
    try:
        yield
    finally:
        comparison.compare = inner


def sweep_case(out: Path, key: str, lens: list[int], new: int) -> dict:
    model, desc = load_model(PRESETS[key], dtype="bf16", device="cuda")
    mix = Lengths.of({n: w for n, w in zip(lens, (8, 3, 1, 1, 1)[:len(lens)])}, "short-heavy mix")
    t0 = time.perf_counter()
    with _each_point_kept(out, key, t0):
        report = compare_sweep(model, [(4, n) for n in lens], mode="generate", new_tokens=new, backends=BACKENDS,
                               lengths=mix, requests=10, check_numerics=False, time_budget_s=0,
                               # one short profiled pass: the kernel `auto` ran, whose plan cache it shares
                               profile_steps=1, progress=lambda m: print(f"{time.perf_counter() - t0:7.1f} s  {m}",
                                                                         flush=True),
                               model_name=PRESETS[key])
    wall = time.perf_counter() - t0
    report.to_json(out / f"generate_sweep_{key}.json")
    report.to_markdown(out / f"generate_sweep_{key}.md")
    many = serving_estimate(report.sweep, mix, 10_000, new)
    points = [{"prompt_len": p.seq, "ties": list(p.ties), "ranking": list(p.ranking),
               "ms": {b.backend: b.time_ms for b in p.backends},
               "margins": {b.backend: b.margin.text() for b in p.backends if b.margin},
               "new_shape_step_ms": {b.backend: b.generate.new_shape_step_ms for b in p.backends if b.generate},
               "seen_shape_step_ms": {b.backend: b.generate.seen_shape_step_ms for b in p.backends if b.generate}}
              for p in report.sweep]
    del model
    torch.cuda.empty_cache()
    return {"model": desc, "wall_s": round(wall, 1), "recommendation": report.recommendation, "points": points,
            "serving_10": report.serving, "serving_10000": many.__dict__ if many else None}


def main(argv=None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)

    def opt(name, default):
        return next((a.split("=", 1)[1] for a in args if a.startswith(f"--{name}=")), default)
    only = opt("only", ",".join(PRESETS)).split(",")
    lens = [int(x) for x in opt("lens", "256,1024,4096").split(",")]
    new = int(opt("new", "64"))
    out = Path(next(a for a in args if not a.startswith("--")))
    out.mkdir(parents=True, exist_ok=True)
    results = {"environment": environment(), "command": "python -m benchmarks.generate_sweep " + " ".join(args)}
    for key in only:
        t0 = time.perf_counter()
        try:
            results[key] = {"status": "ok", **sweep_case(out, key, lens, new)}
        except Exception as e:  # a case that breaks is recorded, the others still run
            import traceback
            results[key] = {"status": "failed", "error": f"{type(e).__name__}: {e}",
                            "traceback": traceback.format_exc()}
        results[key]["seconds"] = round(time.perf_counter() - t0, 1)
        print(f"{key}: {results[key]['status']} in {results[key]['seconds']} s", flush=True)
        (out / "generate_sweep.json").write_text(json.dumps(results, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
