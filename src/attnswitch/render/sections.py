"""What a report says, as a list of blocks, built once for every writer.

Works on any report-shaped object (``results.Report``); it reads fields and never measures.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator

from .document import Block, Heading, Table, Text

__all__ = ["sections", "title", "summary_table", "layer_table", "device_table", "transfer_table", "fold",
           "distribution_text", "ordered", "COMM_NOTE"]

COMM_NOTE = ("comm µs: the NCCL kernels' device time, which includes waiting for the other ranks to reach the "
             "collective; GPU µs is the rest.")

_SUMMARY = ("backend", "time/fwd ms", "noise %", "host/fwd ms", "cold host ms", "host/attn µs", "kernels/fwd",
            "memcpy/fwd", "attn kernels/call", "attn memcpy/call", "peak MB", "max rel err / why not")
_DEVICE = ("rank", "GPU", "kernels/fwd", "memcpy/fwd", "memset/fwd", "comm kernels/fwd", "GPU busy ms", "comm ms",
           "GPU span ms", "peak MB", "time/fwd ms")
_TRANSFER = ("boundary", "from → to", "copies/fwd", "MB/fwd", "GPU µs/fwd")
_INDEX = re.compile(r"\.(\d+)(?=\.|$)")
_SUMS = ("calls", "kernels", "memcpys", "memsets", "gpu_us", "host_us", "ops", "comm_kernels", "comm_us", "comm_ops")


def _n(x, digits=1) -> str:
    if x is None:
        return "-"
    if isinstance(x, float) and abs(x - round(x)) < 1e-9:
        return str(int(round(x)))
    return f"{x:.{digits}f}"


def fold(layers) -> list:
    """Repeated layers folded into one row each: ``model.layers.3.self_attn`` -> ``model.layers.*.self_attn``
    (×n), per rank; layers on different GPUs stay apart (a device_map splits ``layers.*`` between them)."""
    out: dict[tuple, list] = {}
    for layer in layers:
        key = (layer.rank, _INDEX.sub(".*", layer.path), layer.kind, tuple(layer.devices))
        out.setdefault(key, []).append(layer)
    folded = []
    for (_, path, _, _), group in out.items():
        sums = {k: sum(getattr(x, k) for x in group) for k in _SUMS}
        folded.append(dataclasses.replace(group[0], path=path, folded=sum(x.folded for x in group), **sums))
    return folded


def ordered(report) -> list:
    """The backends in ranking order (unranked ones after)."""
    if not report.ranking:
        return list(report.backends)
    order = {n: i for i, n in enumerate(report.ranking)}
    return sorted(report.backends, key=lambda b: order.get(b.backend, len(order)))


def title(report) -> str:
    e = report.environment
    dev = e.get("gpu") or f"CPU ({e.get('cpu')})"
    return (f"{report.model} · {report.workload.get('description', '')} · {report.workload.get('dtype', '')} · {dev} · "
            f"torch {e.get('torch')} · transformers {e.get('transformers')}"
            + (f" · cuDNN {e.get('cudnn')}" if e.get("cudnn") else ""))


def distribution_text(report) -> str | None:
    d = report.distribution
    if not d:
        return None
    if d.get("mode") == "tensor_parallel":
        return (f"tensor parallel over {d.get('world_size')} ranks ({d.get('backend')}), "
                f"devices {', '.join(d.get('devices', []))}; times are the slowest rank's per forward")
    if d.get("mode") == "device_map":
        return f"device_map over {', '.join(d.get('devices', []))}: {d.get('layout', '')}"
    return str(d)


def _summary_row(b) -> tuple[str, ...]:
    name = f"{b.backend} ({b.package})" if getattr(b, "package", None) else b.backend
    if not b.ok:
        return (name, b.status.upper()) + ("-",) * 9 + ((b.reasons[0] if b.reasons else "")[:70],)
    num = b.numerics
    return (name, _n(b.time_ms, 3), _n(b.noise_pct, 1), _n(b.host_ms, 2), _n(b.cold_host_ms, 1),
            _n(b.attn_host_us, 1), _n(b.kernels), _n(b.memcpys), _n(b.attn_kernels_per_call),
            _n(b.attn_memcpys_per_call), _n(b.peak_mem_mb, 0),
            "" if num is None else (f"{num.max_rel_err:.1e}" + ("" if num.ok else " FLAGGED")))


def summary_table(report) -> Table:
    return Table(title(report), _SUMMARY, tuple(_summary_row(b) for b in ordered(report)),
                 frozenset({"backend", "max rel err / why not"}))


def _layer_columns(b) -> list[str]:
    cols = []
    if any(x.rank is not None for x in b.layers):
        cols.append("rank")
    if len({d for x in b.layers for d in x.devices}) > 1:
        cols.append("GPU")
    cols += ["calls", "kernels", "memcpy", "memset", "cpu ops", "GPU µs"]
    if any(x.comm_kernels for x in b.layers):
        cols += ["comm kernels", "comm µs"]
    if any(x.comm_ops for x in b.layers) and not any(x.comm_kernels for x in b.layers):
        cols.append("comm ops")  # a CPU process group (gloo): no kernels, the collective ops themselves
    return cols + ["host µs"]


def layer_table(report, backend, fold_layers: bool = True) -> Table:
    """Per layer (and per attention call site) of one backend, per forward."""
    b = report[backend] if isinstance(backend, str) else backend
    cols = _layer_columns(b)
    gpu = report.environment.get("device") == "cuda"  # a CPU run has no device events to count
    dev = (lambda x, d=0: _n(x, d)) if gpu else (lambda x, d=0: "-")
    rows = []
    for x in (fold(b.layers) if fold_layers else b.layers):
        name = x.path + (" [attention]" if x.kind == "attention" else "") + (f" ×{x.folded}" if x.folded > 1 else "")
        cell = {"rank": str(x.rank) if x.rank is not None else "-", "GPU": ",".join(map(str, x.devices)) or "-",
                "calls": _n(x.calls), "kernels": dev(x.kernels), "memcpy": dev(x.memcpys), "memset": dev(x.memsets),
                "cpu ops": _n(x.ops), "GPU µs": dev(x.gpu_us - x.comm_us, 1),  # compute: collectives apart
                "comm kernels": dev(x.comm_kernels), "comm µs": dev(x.comm_us, 1), "comm ops": _n(x.comm_ops),
                "host µs": _n(x.host_us, 1)}
        rows.append(tuple([name] + [cell[c] for c in cols]))
    return Table(f"{b.backend}: per layer (per forward)", tuple(["layer"] + cols), tuple(rows), frozenset({"layer"}))


def device_table(report, backend) -> Table:
    """Per GPU (and rank): totals per forward from that GPU's raw events."""
    b = report[backend] if isinstance(backend, str) else backend
    rows = tuple((str(d.rank) if d.rank is not None else "-", f"cuda:{d.device}", _n(d.kernels), _n(d.memcpys),
                  _n(d.memsets), _n(d.comm_kernels), _n(d.gpu_busy_ms, 3), _n(d.comm_ms, 3), _n(d.gpu_span_ms, 3),
                  _n(d.peak_mem_mb, 0), _n(d.time_ms, 3)) for d in b.devices)
    return Table(f"{b.backend}: per GPU (per forward)", _DEVICE, rows, frozenset({"GPU"}))


def transfer_table(report, backend) -> Table:
    b = report[backend] if isinstance(backend, str) else backend
    rows = tuple((f"{t.after} → {t.into}", f"cuda:{t.src} → cuda:{t.dst}", _n(t.copies), _n(t.bytes / 2**20, 3),
                  _n(t.gpu_us, 1)) for t in b.transfers)
    return Table(f"{b.backend}: copies between GPUs, by layer boundary", _TRANSFER, rows,
                 frozenset({"boundary", "from → to"}))


def _backend_blocks(report, b, fold_layers: bool) -> Iterator[Block]:
    table = layer_table(report, b, fold_layers)
    yield table
    if "comm µs" in table.headers:
        yield Text(COMM_NOTE, "note")
    if len(b.devices) > 1:
        yield device_table(report, b)
    if b.transfers:
        yield transfer_table(report, b)
    if b.attn_ops or b.attn_kernel_names:
        yield Text(f"attention ran: ops {', '.join(b.attn_ops) or '-'}; kernels "
                   f"{', '.join(k[:60] for k in b.attn_kernel_names) or '-'}"
                   + (f"; launched by {', '.join(b.attn_launch_apis)}" if b.attn_launch_apis else ""), "note")
    for n in b.notes:
        yield Text(f"note: {n}", "note")


def sections(report, layers: bool = True, fold_layers: bool = True) -> list[Block]:
    """Everything the report says, in reading order."""
    out: list[Block] = [Heading("attnswitch report", 1), summary_table(report)]
    timer = next((b.timer for b in report.backends if b.timer), "")
    out.append(Text(f"time/fwd: median of {report.settings.get('iters')} unprofiled forwards ({timer}); counts "
                    "from the profiler, per forward.", "note"))
    if distribution_text(report):
        out.append(Text(f"distribution: {distribution_text(report)}"))
    if report.recommendation:
        out.append(Text(f"Recommendation: {report.recommendation}", "strong"))
    if layers:
        for b in ordered(report):
            if b.ok and b.layers:
                out += list(_backend_blocks(report, b, fold_layers))
    bad = [b for b in report.backends if not b.ok]
    if bad:
        out.append(Heading("Not run", 2))
        for b in bad:
            out.append(Text(f"{b.backend} {b.status}" + (f" at {b.where}" if b.where else "") + ": "
                            + "; ".join(b.reasons), "error"))
    if report.command:
        out.append(Text(f"reproduce: {report.command}", "note"))
    return out
