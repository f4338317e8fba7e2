"""Immutable results and their rendering: console table (rich), JSON, CSV, markdown.

Measuring (``profiling``, ``compare``) builds these; nothing here measures. Units are in the field
names (``_ms``, ``_us``, ``_mb``); counts are per forward (or per attention call where named so).
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["SCHEMA_VERSION", "LayerStats", "DeviceStats", "TransferStats", "Numerics", "BackendResult", "Report"]

#: 2 added devices, transfers, ranks and collectives (multi-GPU); version 1 files still load
SCHEMA_VERSION = 2
_READABLE = (1, 2)


@dataclass(frozen=True)
class LayerStats:
    """One row of the per-layer table, per forward."""

    path: str
    kind: str  # "module", "attention" or "outside"
    calls: float
    kernels: float
    memcpys: float
    memsets: float
    gpu_us: float
    host_us: float
    ops: float
    folded: int = 1
    op_names: tuple[tuple[str, float], ...] = ()
    kernel_names: tuple[tuple[str, float], ...] = ()
    launch_apis: tuple[tuple[str, float], ...] = ()
    comm_kernels: float = 0.0  # collective (NCCL) kernels among ``kernels``
    comm_us: float = 0.0  # their device time, part of ``gpu_us``
    comm_ops: float = 0.0  # collectives issued (their ``c10d::`` CPU op)
    devices: tuple[int, ...] = ()  # GPU indices its device events ran on
    rank: int | None = None  # the process (tensor parallelism), None in a single process


@dataclass(frozen=True)
class DeviceStats:
    """One GPU's totals per forward, from its raw profiler events (per rank under tensor parallelism)."""

    device: int
    rank: int | None = None
    kernels: float = 0.0
    memcpys: float = 0.0
    memsets: float = 0.0
    comm_kernels: float = 0.0
    gpu_busy_ms: float = 0.0  # sum of its device event durations
    comm_ms: float = 0.0  # of which collective kernels
    gpu_span_ms: float = 0.0  # its first to last device event (median over forwards)
    peak_mem_mb: float | None = None
    time_ms: float | None = None  # this rank's own steady time per forward (tensor parallelism)


@dataclass(frozen=True)
class TransferStats:
    """Copies between GPUs at one layer boundary, per forward."""

    after: str  # the last module to finish before the copy
    into: str  # the module whose inputs were moved
    src: int
    dst: int
    copies: float
    bytes: float
    gpu_us: float


@dataclass(frozen=True)
class Numerics:
    """Output of a backend against the reference (eager attention in float32, same weights/inputs)."""

    max_rel_err: float
    mean_rel_err: float
    top1_agreement: float | None
    tolerance: float
    ok: bool


@dataclass(frozen=True)
class BackendResult:
    backend: str
    status: str  # "ok", "unavailable" or "failed"
    reasons: tuple[str, ...] = ()
    where: str | None = None
    notes: tuple[str, ...] = ()
    timer: str = ""  # "cuda-events" or "wall-clock"
    time_ms: float | None = None  # median steady time per forward, unprofiled
    time_samples_ms: tuple[float, ...] = ()
    noise_pct: float | None = None  # half the interquartile range over the median
    host_ms: float | None = None  # median host time per forward (until the call returns)
    cold_host_ms: float | None = None  # the first forward of this backend at this shape
    attn_calls: float | None = None  # attention calls per forward
    attn_host_us: float | None = None  # median host time per attention call, steady
    attn_cold_host_us: float | None = None  # host time of the first attention call at this shape (cold)
    peak_mem_mb: float | None = None
    profiled_gpu_busy_ms: float | None = None  # sum of device event durations per forward (profiler)
    profiled_gpu_span_ms: float | None = None  # first to last device event per forward (profiler)
    kernels: float | None = None  # per forward, from the profiler
    memcpys: float | None = None
    memsets: float | None = None
    ops: float | None = None  # outermost CPU ops per forward
    attn_kernels_per_call: float | None = None
    attn_memcpys_per_call: float | None = None
    attn_gpu_us_per_call: float | None = None
    attn_ops: tuple[str, ...] = ()  # the ATen ops the attention call ran
    attn_kernel_names: tuple[str, ...] = ()
    attn_launch_apis: tuple[str, ...] = ()
    attn_kernel_details: tuple[dict, ...] = ()  # per kernel: registers, shared memory, occupancy ...
    layers: tuple[LayerStats, ...] = ()
    devices: tuple[DeviceStats, ...] = ()  # per GPU (and rank); empty on a CPU
    transfers: tuple[TransferStats, ...] = ()  # copies between GPUs, by layer boundary
    trace_path: str | None = None
    rank_trace_paths: tuple[str, ...] = ()  # the other ranks' traces, written by rank 0
    trace_seconds: float | None = None  # time taken to parse and attribute the trace
    profiled_run_seconds: float | None = None  # wall time of the profiled forwards themselves
    trace_events: int | None = None
    numerics: Numerics | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def _layer_table_rows(layers, fold: bool):
    from collections import Counter

    from .profiling.attribution import Row, fold as fold_rows

    if not fold:
        return list(layers)
    out = []
    for rank in dict.fromkeys(l.rank for l in layers):  # fold within each rank, in rank order
        rows = [Row(l.path, l.kind, l.calls, l.kernels, l.memcpys, l.memsets, l.gpu_us, l.host_us, l.ops,
                    comm_kernels=l.comm_kernels, comm_us=l.comm_us, comm_ops=l.comm_ops,
                    devices=Counter(dict.fromkeys(l.devices, 1)), folded=1) for l in layers if l.rank == rank]
        out += [LayerStats(r.path, r.kind, r.calls, r.kernels, r.memcpys, r.memsets, r.gpu_us, r.host_us, r.ops,
                           folded=r.folded, comm_kernels=r.comm_kernels, comm_us=r.comm_us, comm_ops=r.comm_ops,
                           devices=tuple(sorted(r.devices)), rank=rank) for r in fold_rows(rows)]
    return out


_COMM_NOTE = ("  comm µs: the NCCL kernels' device time, which includes waiting for the other ranks to reach the "
              "collective; GPU µs is the rest.")


def _n(x, digits=1) -> str:
    if x is None:
        return "-"
    if isinstance(x, float) and abs(x - round(x)) < 1e-9:
        return str(int(round(x)))
    return f"{x:.{digits}f}"


@dataclass(frozen=True)
class Report:
    """What ``profile`` and ``compare`` return. Print it, or save it with ``save``/``to_json``."""

    backends: tuple[BackendResult, ...]
    environment: dict
    workload: dict
    settings: dict
    model: str = ""
    ranking: tuple[str, ...] = ()
    recommendation: str | None = None
    command: str | None = None
    distribution: dict | None = None  # how the model was spread: device_map or tensor parallelism
    schema_version: int = SCHEMA_VERSION

    def __getitem__(self, name: str) -> BackendResult:
        from .backends import resolve_name

        key = resolve_name(name)
        for b in self.backends:
            if b.backend == key:
                return b
        raise KeyError(f"backend {name!r} is not in this report ({', '.join(b.backend for b in self.backends)})")

    @property
    def ok(self) -> list[BackendResult]:
        return [b for b in self.backends if b.ok]

    # -- data ------------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self, path: str | Path | None = None, indent: int = 1) -> str:
        text = json.dumps(self.to_dict(), indent=indent, default=str)
        if path is not None:
            Path(path).write_text(text)
        return text

    @classmethod
    def from_json(cls, text_or_path: str | Path) -> "Report":
        p = Path(text_or_path) if not str(text_or_path).lstrip().startswith("{") else None
        data = json.loads(p.read_text() if p else str(text_or_path))
        if data.get("schema_version") not in _READABLE:
            raise ValueError(f"report schema {data.get('schema_version')} is not one of {_READABLE}")
        backends = []
        for b in data["backends"]:
            b = dict(b)
            b["layers"] = tuple(LayerStats(**{k: (tuple(map(tuple, v)) if k in ("op_names", "kernel_names",
                                                                                 "launch_apis") else
                                                  tuple(v) if k == "devices" else v)
                                              for k, v in l.items()}) for l in b["layers"])
            b["numerics"] = Numerics(**b["numerics"]) if b.get("numerics") else None
            b["devices"] = tuple(DeviceStats(**d) for d in b.get("devices") or ())
            b["transfers"] = tuple(TransferStats(**t) for t in b.get("transfers") or ())
            for k in ("reasons", "notes", "time_samples_ms", "attn_ops", "attn_kernel_names", "attn_launch_apis",
                      "attn_kernel_details", "rank_trace_paths"):
                b[k] = tuple(b.get(k) or ())
            backends.append(BackendResult(**b))
        data["backends"] = tuple(backends)
        data["schema_version"] = SCHEMA_VERSION
        data["ranking"] = tuple(data.get("ranking") or ())
        return cls(**data)

    def to_csv(self, path: str | Path | None = None) -> str:
        cols = ["backend", "status", "timer", "time_ms", "noise_pct", "host_ms", "cold_host_ms", "attn_host_us",
                "attn_cold_host_us", "peak_mem_mb", "kernels", "memcpys", "memsets", "attn_kernels_per_call",
                "attn_memcpys_per_call", "attn_gpu_us_per_call", "profiled_gpu_busy_ms", "profiled_gpu_span_ms",
                "max_rel_err", "top1_agreement", "reasons"]
        buf = io.StringIO()
        w = csv.writer(buf)
        w.writerow(cols)
        for b in self.backends:
            d = dataclasses.asdict(b)
            d["max_rel_err"] = b.numerics.max_rel_err if b.numerics else None
            d["top1_agreement"] = b.numerics.top1_agreement if b.numerics else None
            d["reasons"] = " | ".join(b.reasons)
            w.writerow(["" if d[c] is None else d[c] for c in cols])
        text = buf.getvalue()
        if path is not None:
            Path(path).write_text(text)
        return text

    def save_traces(self, directory: str | Path) -> list[Path]:
        """Copy each backend's Perfetto-loadable trace into ``directory``."""
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        copied = []
        for b in self.backends:
            for src in ([b.trace_path] if b.trace_path else []) + list(b.rank_trace_paths):
                if not Path(src).exists():
                    continue
                dest = out / Path(src).name
                if Path(src).resolve() != dest.resolve():
                    shutil.copyfile(src, dest)
                copied.append(dest)
        return copied

    # -- text ------------------------------------------------------------------------------------
    def summary_rows(self) -> list[list[str]]:
        rows = []
        for b in self._ordered():
            if not b.ok:
                rows.append([b.backend, b.status.upper(), "-", "-", "-", "-", "-", "-", "-", "-", "-",
                             (b.reasons[0] if b.reasons else "")[:70]])
                continue
            num = b.numerics
            rows.append([
                b.backend, _n(b.time_ms, 3), _n(b.noise_pct, 1), _n(b.host_ms, 2), _n(b.cold_host_ms, 1),
                _n(b.attn_host_us, 1), _n(b.kernels), _n(b.memcpys), _n(b.attn_kernels_per_call),
                _n(b.attn_memcpys_per_call), _n(b.peak_mem_mb, 0),
                "" if num is None else (f"{num.max_rel_err:.1e}" + ("" if num.ok else " FLAGGED")),
            ])
        return rows

    _HEADERS = ["backend", "time/fwd ms", "noise %", "host/fwd ms", "cold host ms", "host/attn µs", "kernels/fwd",
                "memcpy/fwd", "attn kernels/call", "attn memcpy/call", "peak MB", "max rel err / why not"]

    def _ordered(self) -> list[BackendResult]:
        if not self.ranking:
            return list(self.backends)
        order = {n: i for i, n in enumerate(self.ranking)}
        return sorted(self.backends, key=lambda b: order.get(b.backend, len(order)))

    def _layer_columns(self, b: BackendResult) -> list[str]:
        cols = []
        if any(l.rank is not None for l in b.layers):
            cols.append("rank")
        if len({d for l in b.layers for d in l.devices}) > 1:
            cols.append("GPU")
        cols += ["calls", "kernels", "memcpy", "memset", "cpu ops", "GPU µs"]
        if any(l.comm_kernels for l in b.layers):
            cols += ["comm kernels", "comm µs"]
        if any(l.comm_ops for l in b.layers) and not any(l.comm_kernels for l in b.layers):
            cols.append("comm ops")  # a CPU process group (gloo): no kernels, the collective ops themselves
        return cols + ["host µs"]

    def layer_headers(self, backend: str) -> list[str]:
        return ["layer"] + self._layer_columns(self[backend])

    def layer_table(self, backend: str, fold: bool = True) -> list[list[str]]:
        b = self[backend]
        cols = self._layer_columns(b)
        gpu = self.environment.get("device") == "cuda"  # a CPU run has no device events to count
        dev = (lambda x, d=0: _n(x, d)) if gpu else (lambda x, d=0: "-")
        rows = []
        for l in _layer_table_rows(b.layers, fold):
            name = l.path + (" [attention]" if l.kind == "attention" else "") + (f" ×{l.folded}" if l.folded > 1
                                                                                   else "")
            # "GPU µs" is compute: collectives have their own column where there are any
            compute_us = l.gpu_us - l.comm_us
            cell = {"rank": str(l.rank) if l.rank is not None else "-",
                    "GPU": ",".join(map(str, l.devices)) or "-", "calls": _n(l.calls), "kernels": dev(l.kernels),
                    "memcpy": dev(l.memcpys), "memset": dev(l.memsets), "cpu ops": _n(l.ops),
                    "GPU µs": dev(compute_us, 1), "comm kernels": dev(l.comm_kernels), "comm µs": dev(l.comm_us, 1),
                    "comm ops": _n(l.comm_ops), "host µs": _n(l.host_us, 1)}
            rows.append([name] + [cell[c] for c in cols])
        return rows

    _DEVICE_HEADERS = ["rank", "GPU", "kernels/fwd", "memcpy/fwd", "memset/fwd", "comm kernels/fwd", "GPU busy ms",
                       "comm ms", "GPU span ms", "peak MB", "time/fwd ms"]

    def device_table(self, backend: str) -> list[list[str]]:
        """Per GPU (and rank): totals per forward from that GPU's raw events."""
        return [[str(d.rank) if d.rank is not None else "-", f"cuda:{d.device}", _n(d.kernels), _n(d.memcpys),
                 _n(d.memsets), _n(d.comm_kernels), _n(d.gpu_busy_ms, 3), _n(d.comm_ms, 3), _n(d.gpu_span_ms, 3),
                 _n(d.peak_mem_mb, 0), _n(d.time_ms, 3)] for d in self[backend].devices]

    _TRANSFER_HEADERS = ["boundary", "from → to", "copies/fwd", "MB/fwd", "GPU µs/fwd"]

    def transfer_table(self, backend: str) -> list[list[str]]:
        return [[f"{t.after} → {t.into}", f"cuda:{t.src} → cuda:{t.dst}", _n(t.copies), _n(t.bytes / 2**20, 3),
                 _n(t.gpu_us, 1)] for t in self[backend].transfers]

    def distribution_text(self) -> str | None:
        d = self.distribution
        if not d:
            return None
        if d.get("mode") == "tensor_parallel":
            return (f"tensor parallel over {d.get('world_size')} ranks ({d.get('backend')}), "
                    f"devices {', '.join(d.get('devices', []))}; times are the slowest rank's per forward")
        if d.get("mode") == "device_map":
            return f"device_map over {', '.join(d.get('devices', []))}: {d.get('layout', '')}"
        return str(d)

    def _title(self) -> str:
        e = self.environment
        dev = e.get("gpu") or f"CPU ({e.get('cpu')})"
        return (f"{self.model} · {self.workload.get('description', '')} · {self.workload.get('dtype', '')} · {dev} · "
                f"torch {e.get('torch')} · transformers {e.get('transformers')}"
                + (f" · cuDNN {e.get('cudnn')}" if e.get("cudnn") else ""))

    def _multi_gpu_tables(self, b: BackendResult):
        if len(b.devices) > 1:
            yield f"{b.backend}: per GPU (per forward)", self._DEVICE_HEADERS, self.device_table(b.backend)
        if b.transfers:
            yield (f"{b.backend}: copies between GPUs, by layer boundary", self._TRANSFER_HEADERS,
                   self.transfer_table(b.backend))

    def render(self, console=None, layers: bool = True, fold: bool = True) -> None:
        from rich.console import Console
        from rich.markup import escape
        from rich.table import Table

        console = console or Console()
        t = Table(title=self._title(), title_style="bold")
        for h in self._HEADERS:
            t.add_column(h, justify="left" if h in ("backend", "max rel err / why not") else "right",
                         no_wrap=h == "backend")
        for r in self.summary_rows():
            t.add_row(*map(escape, r))
        console.print(t)
        timer = next((b.timer for b in self.backends if b.timer), "")
        console.print(f"time/fwd: median of {self.settings.get('iters')} unprofiled forwards ({timer}); counts from "
                      "the profiler, per forward.")
        if self.distribution_text():
            console.print(f"distribution: {self.distribution_text()}", markup=False)
        if layers:
            for b in self._ordered():
                if b.ok and b.layers:
                    lt = Table(title=f"{b.backend}: per layer (per forward)", title_justify="left")
                    for h in self.layer_headers(b.backend):
                        lt.add_column(h, justify="left" if h == "layer" else "right")
                    for r in self.layer_table(b.backend, fold):
                        lt.add_row(*map(escape, r))
                    console.print(lt)
                    if "comm µs" in self.layer_headers(b.backend):
                        console.print(_COMM_NOTE, markup=False)
                    for title, headers, rows in self._multi_gpu_tables(b):
                        mt = Table(title=title, title_justify="left")
                        for h in headers:
                            mt.add_column(h, justify="left" if h in ("boundary", "from → to") else "right")
                        for r in rows:
                            mt.add_row(*map(escape, r))
                        console.print(mt)
                    if b.attn_ops or b.attn_kernel_names:
                        text = (f"  attention ran: ops {', '.join(b.attn_ops) or '-'}; kernels "
                                f"{', '.join(k[:60] for k in b.attn_kernel_names) or '-'}"
                                + (f"; launched by {', '.join(b.attn_launch_apis)}" if b.attn_launch_apis else ""))
                        console.print(text, markup=False)
                    for n in b.notes:
                        console.print(f"  note: {n}", markup=False)
        for b in self.backends:
            if not b.ok:
                console.print(f"[bold]{b.backend}[/bold] {b.status}" + (f" at {b.where}" if b.where else "") + ":")
                for r in b.reasons:
                    console.print(f"  - {r}", markup=False)
        if self.recommendation:
            console.print(f"[bold]Recommendation:[/bold] {self.recommendation}")

    def __str__(self) -> str:
        from rich.console import Console

        console = Console(file=io.StringIO(), width=160, color_system=None, force_terminal=False)
        self.render(console)
        return console.file.getvalue()

    def to_markdown(self, path: str | Path | None = None) -> str:
        lines = ["# attnswitch report", "", f"{self._title()}", ""]
        if self.distribution_text():
            lines += [f"Distribution: {self.distribution_text()}", ""]
        lines += ["| " + " | ".join(self._HEADERS) + " |", "|" + "---|" * len(self._HEADERS)]
        lines += ["| " + " | ".join(r) + " |" for r in self.summary_rows()]
        if self.recommendation:
            lines += ["", f"**Recommendation:** {self.recommendation}"]
        for b in self._ordered():
            if b.ok and b.layers:
                heads = self.layer_headers(b.backend)
                lines += ["", f"## {b.backend}: per layer (per forward)", "",
                          "| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
                lines += ["| " + " | ".join(r) + " |" for r in self.layer_table(b.backend)]
                if "comm µs" in heads:
                    lines += ["", _COMM_NOTE.strip()]
                for title, headers, rows in self._multi_gpu_tables(b):
                    lines += ["", f"### {title}", "", "| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
                    lines += ["| " + " | ".join(r) + " |" for r in rows]
                if b.attn_ops or b.attn_kernel_names:
                    lines += ["", f"Attention ops: {', '.join(b.attn_ops) or '-'}; kernels: "
                                  f"{', '.join('`' + k + '`' for k in b.attn_kernel_names) or '-'}"]
        bad = [b for b in self.backends if not b.ok]
        if bad:
            lines += ["", "## Not run", ""]
            for b in bad:
                lines.append(f"- **{b.backend}** ({b.status}{' at ' + b.where if b.where else ''}): "
                             + "; ".join(b.reasons))
        if self.command:
            lines += ["", "Reproduce:", "", f"    {self.command}"]
        text = "\n".join(lines) + "\n"
        if path is not None:
            Path(path).write_text(text)
        return text
