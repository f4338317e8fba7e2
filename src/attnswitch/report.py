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

__all__ = ["SCHEMA_VERSION", "LayerStats", "Numerics", "BackendResult", "Report"]

SCHEMA_VERSION = 1


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
    trace_path: str | None = None
    trace_seconds: float | None = None  # time taken to parse and attribute the trace
    profiled_run_seconds: float | None = None  # wall time of the profiled forwards themselves
    trace_events: int | None = None
    numerics: Numerics | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def _layer_table_rows(layers, fold: bool):
    from .profiling.attribution import Row, fold as fold_rows

    if not fold:
        return list(layers)
    rows = [Row(l.path, l.kind, l.calls, l.kernels, l.memcpys, l.memsets, l.gpu_us, l.host_us, l.ops, folded=1)
            for l in layers]
    return [LayerStats(r.path, r.kind, r.calls, r.kernels, r.memcpys, r.memsets, r.gpu_us, r.host_us, r.ops,
                       folded=r.folded) for r in fold_rows(rows)]


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
        if data.get("schema_version") != SCHEMA_VERSION:
            raise ValueError(f"report schema {data.get('schema_version')} is not {SCHEMA_VERSION}")
        backends = []
        for b in data["backends"]:
            b = dict(b)
            b["layers"] = tuple(LayerStats(**{k: (tuple(map(tuple, v)) if k in ("op_names", "kernel_names",
                                                                                 "launch_apis") else v)
                                              for k, v in l.items()}) for l in b["layers"])
            b["numerics"] = Numerics(**b["numerics"]) if b.get("numerics") else None
            for k in ("reasons", "notes", "time_samples_ms", "attn_ops", "attn_kernel_names", "attn_launch_apis",
                      "attn_kernel_details"):
                b[k] = tuple(b.get(k) or ())
            backends.append(BackendResult(**b))
        data["backends"] = tuple(backends)
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
            if b.trace_path and Path(b.trace_path).exists():
                dest = out / f"trace_{b.backend}.json"
                if Path(b.trace_path).resolve() != dest.resolve():
                    shutil.copyfile(b.trace_path, dest)
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

    def layer_table(self, backend: str, fold: bool = True) -> list[list[str]]:
        b = self[backend]
        rows = []
        for l in _layer_table_rows(b.layers, fold):
            name = l.path + (" [attention]" if l.kind == "attention" else "") + (f" ×{l.folded}" if l.folded > 1
                                                                                   else "")
            gpu = self.environment.get("device") == "cuda"  # a CPU run has no device events to count
            dev = (lambda x, d=0: _n(x, d)) if gpu else (lambda x, d=0: "-")
            rows.append([name, _n(l.calls), dev(l.kernels), dev(l.memcpys), dev(l.memsets), _n(l.ops),
                         dev(l.gpu_us, 1), _n(l.host_us, 1)])
        return rows

    _LAYER_HEADERS = ["layer", "calls", "kernels", "memcpy", "memset", "cpu ops", "GPU µs", "host µs"]

    def _title(self) -> str:
        e = self.environment
        dev = e.get("gpu") or f"CPU ({e.get('cpu')})"
        return (f"{self.model} · {self.workload.get('description', '')} · {self.workload.get('dtype', '')} · {dev} · "
                f"torch {e.get('torch')} · transformers {e.get('transformers')}"
                + (f" · cuDNN {e.get('cudnn')}" if e.get("cudnn") else ""))

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
        if layers:
            for b in self._ordered():
                if b.ok and b.layers:
                    lt = Table(title=f"{b.backend}: per layer (per forward)", title_justify="left")
                    for h in self._LAYER_HEADERS:
                        lt.add_column(h, justify="left" if h == "layer" else "right")
                    for r in self.layer_table(b.backend, fold):
                        lt.add_row(*map(escape, r))
                    console.print(lt)
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
        lines += ["| " + " | ".join(self._HEADERS) + " |", "|" + "---|" * len(self._HEADERS)]
        lines += ["| " + " | ".join(r) + " |" for r in self.summary_rows()]
        if self.recommendation:
            lines += ["", f"**Recommendation:** {self.recommendation}"]
        for b in self._ordered():
            if b.ok and b.layers:
                lines += ["", f"## {b.backend}: per layer (per forward)", "",
                          "| " + " | ".join(self._LAYER_HEADERS) + " |", "|" + "---|" * len(self._LAYER_HEADERS)]
                lines += ["| " + " | ".join(r) + " |" for r in self.layer_table(b.backend)]
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
