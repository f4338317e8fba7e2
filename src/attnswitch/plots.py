"""Plots for the HTML report (matplotlib, Agg): GPU time by layer kind, kernels and memcpys per
attention call, host time cold vs steady."""

from __future__ import annotations

import base64
import html
import io
from pathlib import Path

from .report import Report

__all__ = ["write_html"]


def _layer_kind(path: str, kind: str) -> str:
    if kind == "attention":
        return "attention call"
    if kind == "outside":
        return "outside modules"
    leaf = path.rsplit(".", 1)[-1]
    if "attn" in leaf or "attention" in leaf:
        return "attention module (rest)"
    if "mlp" in path or "ffn" in path or "feed_forward" in path:
        return "mlp"
    return "other"


def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    return base64.b64encode(buf.getvalue()).decode()


def figures(report: Report) -> list[tuple[str, str]]:
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    ok = [b for b in report.backends if b.ok]
    names = [b.backend for b in ok]
    out = []
    # 1. time per forward split by layer kind (profiled self time; CPU: host time of ops)
    gpu = any(b.profiled_gpu_busy_ms for b in ok)
    kinds = ["attention call", "attention module (rest)", "mlp", "other", "outside modules",
             "collectives (incl. waiting)"]
    fig, ax = plt.subplots(figsize=(7, 3.2))
    bottom = [0.0] * len(ok)
    for k in kinds:
        vals = []
        for b in ok:
            if gpu and k.startswith("collectives"):  # NCCL kernels, wherever issued (tensor parallelism)
                vals.append(sum(l.comm_us for l in b.layers) / 1e3)
            elif gpu:
                vals.append(sum(l.gpu_us - l.comm_us for l in b.layers if _layer_kind(l.path, l.kind) == k) / 1e3)
            else:
                vals.append(0.0)
        if not gpu and k == "attention call":
            vals = [(b.attn_host_us or 0) * (b.attn_calls or 0) / 1e3 for b in ok]
        if any(vals):
            ax.bar(names, vals, bottom=bottom, label=k)
            bottom = [a + v for a, v in zip(bottom, vals)]
    n_gpus = len({(d.rank, d.device) for b in ok for d in b.devices})
    ax.set_ylabel(("GPU ms / forward" + (f", summed over {n_gpus} GPUs" if n_gpus > 1 else "")) if gpu
                  else "host ms / forward (attention calls)")
    ax.set_title("Time per forward by layer kind" + ("" if gpu else " (CPU run: attention host time only)"))
    ax.legend(fontsize=7)
    out.append(("time by layer kind", _png(fig)))
    plt.close(fig)
    # 2. kernels and memcpys per attention call
    fig, ax = plt.subplots(figsize=(7, 3))
    x = range(len(ok))
    ax.bar([i - 0.2 for i in x], [b.attn_kernels_per_call or 0 for b in ok], width=0.4, label="kernels")
    ax.bar([i + 0.2 for i in x], [b.attn_memcpys_per_call or 0 for b in ok], width=0.4, label="memcpys")
    ax.set_xticks(list(x), names)
    ax.set_ylabel("per attention call")
    ax.set_title("Device work per attention call")
    ax.legend(fontsize=7)
    out.append(("kernels per attention call", _png(fig)))
    plt.close(fig)
    # 3. host time per attention call, cold vs steady
    fig, ax = plt.subplots(figsize=(7, 3))
    ax.bar([i - 0.2 for i in x], [b.attn_cold_host_us or 0 for b in ok], width=0.4, label="cold (first forward)")
    ax.bar([i + 0.2 for i in x], [b.attn_host_us or 0 for b in ok], width=0.4, label="steady (median)")
    ax.set_xticks(list(x), names)
    ax.set_ylabel("host µs per attention call")
    ax.set_yscale("log")
    ax.set_title("Host time per attention call")
    ax.legend(fontsize=7)
    out.append(("host time cold vs steady", _png(fig)))
    plt.close(fig)
    return out


def write_html(report: Report, path: str | Path) -> Path:
    md = html.escape(report.to_markdown())
    imgs = "\n".join(f'<h3>{html.escape(t)}</h3><img alt="{html.escape(t)}" src="data:image/png;base64,{b64}">'
                     for t, b64 in figures(report))
    page = (f"<!doctype html><html><head><meta charset='utf-8'><title>attnswitch report</title>"
            f"<style>body{{font-family:sans-serif;max-width:1100px;margin:2em auto}}pre{{font-size:12px}}</style>"
            f"</head><body><h1>attnswitch report</h1>{imgs}<h2>Tables</h2><pre>{md}</pre></body></html>")
    path = Path(path)
    path.write_text(page)
    return path
