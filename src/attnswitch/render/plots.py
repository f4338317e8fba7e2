"""Plots of a report (matplotlib's object API: the caller's pyplot state and backend are untouched)."""

from __future__ import annotations

import base64
import io

__all__ = ["figures", "layer_kind"]

_KINDS = ("attention call", "attention module (rest)", "mlp", "other", "outside modules", "collectives (incl. waiting)")


def layer_kind(path: str, kind: str) -> str:
    """Which part of a forward a layer row is: the attention call, the rest of its module, mlp, ..."""
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


def _figure(width=7.0, height=3.2):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height))
    return fig, fig.add_subplot()


def _time_by_kind(ok) -> str:
    gpu = any(b.profiled_gpu_busy_ms for b in ok)
    fig, ax = _figure()
    names = [b.backend for b in ok]
    bottom = [0.0] * len(ok)
    for k in _KINDS:
        if gpu and k.startswith("collectives"):  # NCCL kernels, wherever issued (tensor parallelism)
            vals = [sum(x.comm_us for x in b.layers) / 1e3 for b in ok]
        elif gpu:
            vals = [sum(x.gpu_us - x.comm_us for x in b.layers if layer_kind(x.path, x.kind) == k) / 1e3 for b in ok]
        elif k == "attention call":
            vals = [(b.attn_host_us or 0) * (b.attn_calls or 0) / 1e3 for b in ok]
        else:
            vals = [0.0] * len(ok)
        if any(vals):
            ax.bar(names, vals, bottom=bottom, label=k)
            bottom = [a + v for a, v in zip(bottom, vals)]
    n_gpus = len({(d.rank, d.device) for b in ok for d in b.devices})
    ax.set_ylabel(("GPU ms / forward" + (f", summed over {n_gpus} GPUs" if n_gpus > 1 else "")) if gpu
                  else "host ms / forward (attention calls)")
    ax.set_title("Time per forward by layer kind" + ("" if gpu else " (CPU run: attention host time only)"))
    ax.legend(fontsize=7)
    ax.tick_params(axis="x", labelrotation=30)
    return _png(fig)


def _pairs(ok, first, second, labels, ylabel, title, log=False) -> str:
    fig, ax = _figure(7, 3)
    x = range(len(ok))
    ax.bar([i - 0.2 for i in x], [first(b) or 0 for b in ok], width=0.4, label=labels[0])
    ax.bar([i + 0.2 for i in x], [second(b) or 0 for b in ok], width=0.4, label=labels[1])
    ax.set_xticks(list(x), [b.backend for b in ok], rotation=30)
    ax.set_ylabel(ylabel)
    if log:
        ax.set_yscale("log")
    ax.set_title(title)
    ax.legend(fontsize=7)
    return _png(fig)


def figures(report) -> list[tuple[str, str]]:
    """``(title, base64 PNG)`` per plot."""
    ok = [b for b in report.backends if b.ok]
    return [
        ("time by layer kind", _time_by_kind(ok)),
        ("kernels per attention call", _pairs(ok, lambda b: b.attn_kernels_per_call, lambda b: b.attn_memcpys_per_call,
                                              ("kernels", "memcpys"), "per attention call",
                                              "Device work per attention call")),
        ("host time cold vs steady", _pairs(ok, lambda b: b.attn_cold_host_us, lambda b: b.attn_host_us,
                                            ("cold (first forward)", "steady (median)"), "host µs per attention call",
                                            "Host time per attention call", log=True)),
    ]
