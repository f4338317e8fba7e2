"""% of peak on a GPU, through attnswitch's profiler path and through an independent loop, side by side.

``python -m benchmarks.peak_check OUT`` runs one causal attention call, B4 H32 S4096 D128 in bf16, with
``cudnn``, ``flash`` and ``efficient``:

- through attnswitch: ``attnswitch.profile`` of a bare ``attnswitch.attention`` call; the call's shape as the
  profiled pass recorded it, its kernel time from the profiler's trace, the figure the report carries
  (``attn_peak``), and the ceiling the report measured (``settings["ceiling"]``);
- independently: ``F.scaled_dot_product_attention`` under ``sdpa_kernel`` in a loop timed with CUDA events
  (the best of 5 batches of 20 calls), its FLOPs counted by hand (``4·B·H·S²·D / 2``, causal).

It prints both TFLOP/s, their ratio and the ratio to the figures measured on an H200 (torch 2.11, cuDNN 9.19:
cuDNN 553, flash 303, efficient 163 TFLOP/s), and writes ``peak_check.json`` into ``OUT``. No hub, no
downloads. ``within_5pct`` holds where every backend's two figures are within 5 % of each other.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import attnswitch
from attnswitch.env import environment
from attnswitch.peak import gpu_spec, primary

__all__ = ["SHAPE", "BACKENDS", "H200_TFLOPS", "independent_ms", "through_attnswitch", "main"]

SHAPE = (4, 32, 4096, 128)  # B, H, S, D
BACKENDS = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION}
#: one causal call at SHAPE in bf16, CUDA events, on an H200 (torch 2.11, cuDNN 9.19), 2026-12-03
H200_TFLOPS = {"cudnn": 553.0, "flash": 303.0, "efficient": 163.0}


def _inputs():
    torch.manual_seed(0)
    b, h, s, d = SHAPE
    return tuple(torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))


def hand_flops() -> float:
    """The causal call's FLOPs as FlashAttention's benchmarks count them: ``4·B·H·S²·D / 2``."""
    b, h, s, d = SHAPE
    return 4 * b * h * s * s * d / 2


def independent_ms(q, k, v, family: SDPBackend, batches: int = 5, n: int = 20) -> float:
    """The best of ``batches`` batches of ``n`` calls, in ms per call (CUDA events)."""
    with sdpa_kernel([family]), torch.no_grad():
        for _ in range(3):
            F.scaled_dot_product_attention(q, k, v, is_causal=True)
        torch.cuda.synchronize()
        best = float("inf")
        for _ in range(batches):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(n):
                F.scaled_dot_product_attention(q, k, v, is_causal=True)
            end.record()
            end.synchronize()
            best = min(best, start.elapsed_time(end) / n)
    return best


def through_attnswitch(q, k, v, names) -> tuple[dict, dict]:
    """Per backend, what attnswitch's report says of the call (its figure, the recorded shape, the kernels); the
    report's ceiling."""
    report = attnswitch.profile(lambda: attnswitch.attention(q, k, v, is_causal=True), backends=list(names))
    out = {}
    for b in report.backends:
        f = primary(b.attn_peak) if b.ok else None
        out[b.backend] = {
            "status": b.status, "reasons": list(b.reasons),
            "tflops": f.achieved if f else None, "kernel_us": f.kernel_us if f else None,
            "pct_of_peak": f.pct_spec if f else None, "pct_of_measured": f.pct_measured if f else None,
            "attn_gpu_us_per_call": b.attn_gpu_us_per_call, "kernels": list(b.attn_kernel_names),
            "shapes": [s.__dict__ for s in b.attn_shapes], "time_ms": b.time_ms}
    return out, report.settings.get("ceiling") or {}


def _line(name: str, r: dict) -> str:
    a, i = r["attnswitch_tflops"], r["independent_tflops"]
    if a is None:
        return f"{name:>10}: attnswitch gave no figure ({r['status']}: {'; '.join(r['reasons'])[:120]})"
    return (f"{name:>10}: attnswitch {a:6.1f} TFLOP/s ({r['kernel_us']:.1f} µs, {r['pct_of_peak'] or 0:.0f} % of "
            f"peak), independent {i:6.1f} TFLOP/s ({r['independent_ms'] * 1e3:.1f} µs); ratio {a / i:.3f}; "
            f"vs the H200 figure {a / H200_TFLOPS[name]:.3f}")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    out = Path(argv[0] if argv else "peak_check")
    out.mkdir(parents=True, exist_ok=True)
    if not torch.cuda.is_available():
        print("peak_check needs a CUDA GPU")
        return 1
    q, k, v = _inputs()
    mine, ceiling = through_attnswitch(q, k, v, BACKENDS)
    rows = {}
    for name, family in BACKENDS.items():
        r = mine.get(name, {"tflops": None, "status": "missing", "reasons": []})
        try:
            ms = independent_ms(q, k, v, family)
        except RuntimeError as e:  # a backend this GPU or build lacks
            ms, r = None, {**r, "independent_error": str(e).splitlines()[0]}
        ind = hand_flops() / (ms * 1e-3) / 1e12 if ms else None
        rows[name] = {**r, "attnswitch_tflops": r.get("tflops"), "independent_ms": ms, "independent_tflops": ind,
                      "ratio": r["tflops"] / ind if r.get("tflops") and ind else None,
                      "h200_tflops": H200_TFLOPS[name],
                      "vs_h200": r["tflops"] / H200_TFLOPS[name] if r.get("tflops") else None}
        print(_line(name, rows[name]) if ind else f"{name:>10}: independent loop failed", flush=True)
    ratios = [r["ratio"] for r in rows.values()]  # a backend without a figure fails the check, never drops out
    env = environment()
    spec = gpu_spec(env.get("gpu"))
    result = {"shape": {"batch": SHAPE[0], "heads": SHAPE[1], "seq": SHAPE[2], "head_dim": SHAPE[3]},
              "dtype": "bfloat16", "causal": True, "environment": env, "ceiling": ceiling,
              "spec": {"name": spec.name, "tflops": dict(spec.tflops), "tbps": spec.tbps} if spec else None,
              "backends": rows,
              "within_5pct": bool(ratios) and all(x is not None and abs(x - 1) <= 0.05 for x in ratios)}
    print(f"ceiling measured: {ceiling}")
    print(f"within 5 %: {result['within_5pct']}")
    (out / "peak_check.json").write_text(json.dumps(result, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
