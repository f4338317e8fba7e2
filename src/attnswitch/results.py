"""The immutable results of a measurement, and their files: JSON (versioned schema), CSV, traces.

Measuring (``profiling``, ``compare``) builds these; nothing here measures, and the layout of tables
lives in ``render``. Units are in the field names (``_ms``, ``_us``, ``_mb``); counts are per forward
(or per attention call where named so).
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import math
import shutil
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import candidate, render
from .backends import resolve_name
from .candidate import Candidate
from .defects import DefectMatch
from .peak import AttnShape, PeakFigure, primary
from .stats import Margin

__all__ = ["SCHEMA_VERSION", "Margin", "LayerStats", "DeviceStats", "TransferStats", "Numerics", "GenerateStats",
           "SlowCall", "TrainStats", "NonFinite", "AttnShape", "PeakFigure", "DefectMatch", "BackendResult",
           "SweepPoint", "Deploy", "Decision", "Report", "candidates", "no_attention", "no_attention_text", "ANSWERS"]

#: 2 added devices, transfers, ranks and collectives (multi-GPU); 3 workloads: generate and train stats,
#: a phase on layer rows, sweeps; 4 rounds paired by backend, margins with intervals, ties, cautions,
#: generate sweeps, deploy and serving, compiled candidates (compile mode, compile time, graphs,
#: recompiles, the attention kernel seen in the graph); 5 the decision as one value (answer, pick, tie, rule,
#: deploy, cautions) in place of the recommendation's text, ties, cautions and deploy; 6 the attention calls'
#: shapes, % of peak, known defects and non-finite values per backend; older versions still load
SCHEMA_VERSION = 7
_READABLE = (1, 2, 3, 4, 5, 6, 7)
#: what a report answers: a backend to use, a tie (and which of it to deploy), keep the model's own attention,
#: none that ran acceptably, or a model whose forward made no attention call through the switch
ANSWERS = ("use", "tie", "keep", "none", "no-attention")


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
    phase: str | None = None  # "prefill"/"decode" (generate), "backward" (train); None: the forward


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
class SlowCall:
    """An attention call of the first generate whose host time was far above the backend's steady call."""

    prompt: int  # which prompt length (index)
    step: int  # 0: the prefill, then one per new token
    layer: str
    host_us: float
    kv_len: int
    steady_us: float | None = None  # the steady call's host time at its prompt and phase, which it exceeded


@dataclass(frozen=True)
class GenerateStats:
    """A generate workload under one backend. Steps are decode forwards; times in ms unless named."""

    ttft_ms: float | None = None  # prefill forward start to the first decode forward's start, median
    step_ms_p50: float | None = None  # wall time between decode steps, steady
    step_ms_p90: float | None = None
    step_ms_p99: float | None = None
    step_host_ms: float | None = None  # host time of a decode forward (until it returns), median
    step_gpu_ms: float | None = None  # GPU time of a decode forward (CUDA events), median
    steps_timed: int = 0  # decode steps the step figures above come from (the rounds the time is from)
    workload_wall_ms: float | None = None  # the whole workload's median wall time: a check on ``time_ms``
    tokens: int = 0  # new tokens the workload generates (every prompt, every sequence of the batch)
    tokens_per_s: float | None = None  # ``tokens`` over the workload's steady time (``time_ms``)
    cold_e2e_ms: float | None = None  # the first workload at these shapes (plans, compiles)
    new_shape_step_ms: float | None = None  # first workload: steps that met a key length for the first time
    seen_shape_step_ms: float | None = None  # first workload: steps whose key lengths were met before
    new_shape_steps: int = 0
    seen_shape_steps: int = 0
    slow_attn_calls: int = 0  # first workload: attention calls far above the steady call's host time
    slow_calls: tuple[SlowCall, ...] = ()  # the first of them: where they happened
    plan_cache_host_mb: float | None = None  # host memory the first workload grew the process by
    step_times_ms: tuple[float, ...] = ()  # one steady generate of the first prompt, step by step
    cold_step_times_ms: tuple[float, ...] = ()  # the same, in the first workload
    token_agreement: float | None = None  # generated tokens equal to float32 eager's, fraction
    first_diff_step: int | None = None  # the first step where any sequence differs (None: none)


@dataclass(frozen=True)
class TrainStats:
    """A training step (forward + backward of the loss, no optimizer) under one backend."""

    loss: str = ""  # what the loss is
    forward_ms: float | None = None  # step start to the forward's end (the loss computed), median
    backward_ms: float | None = None  # the forward's end to the step's end, median
    grad_max_rel_err: float | None = None  # max over parameters of |g - g_ref| / |g_ref| (norms)
    grad_tolerance: float | None = None
    grad_ok: bool | None = None
    worst_grad: str | None = None  # the parameter with the largest error


@dataclass(frozen=True)
class NonFinite:
    """Where a candidate first gave NaN or Inf: ``value`` (``NaN``, ``Inf``), ``direction`` (``forward``: an
    attention call's output or the step's; ``backward``: the gradient an attention call's backward gave q, k or
    v, or a parameter's), ``where`` (the call site or the parameter; ``the step's output``), ``step`` (which
    untimed step, or the timed steps' last output, found it)."""

    value: str
    direction: str
    where: str
    step: str

    def text(self) -> str:
        return f"{self.value} in the {self.direction} of {self.where} ({self.step})"


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
    time_sample_rounds: tuple[int, ...] = ()  # the round each sample was taken in (a generate's: none)
    time_rounds_ms: tuple[tuple[float, ...], ...] = ()  # per round, the units paired across backends
    noise_pct: float | None = None  # half the interquartile range over the median
    margin: Margin | None = None  # against the pick: the median paired ratio and its interval
    host_ms: float | None = None  # host time per forward (until the call returns), the median run's
    host_attn_ms: float | None = None  # the attention calls' host time in that same run
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
    generate: GenerateStats | None = None
    train: TrainStats | None = None
    package: str | None = None  # the distribution (and version) of a third-party kernel, e.g. "flash-attn 2.8.3"
    # a compiled candidate (``backend`` is then its label, ``flash+compile``; see ``compiling``)
    compile: str | None = None  # torch.compile's mode; None: uncompiled
    compile_ms: float | None = None  # one-off: the cold step's host time over a steady step's (compiling)
    graphs: int | None = None  # graphs Dynamo compiled in the cold step (graph breaks and recompiles)
    recompiles: int | None = None  # compiled versions of the forward beyond the first, made while measured
    attn_seen: str | None = None  # the SDPA family of the attention kernels the compiled graph ran (None: none)
    attn_seen_names: tuple[str, ...] = ()  # those kernels' (or ops') names
    attn_mismatch: str | None = None  # why that is not the selected backend (None: it is)
    compile_pays_after: float | None = None  # steps after which compiling has paid for itself (vs uncompiled)
    attn_shapes: tuple[AttnShape, ...] = ()  # the attention calls as they ran, per call site (profiled pass)
    attn_peak: tuple[PeakFigure, ...] = ()  # the attention calls against the GPU's peak, per phase
    defects: tuple[DefectMatch, ...] = ()  # known defects (``defects.json``) that bear on it here
    attn_by_kind: tuple[tuple[str, float], ...] = ()  # attention µs per profiled step by layer kind (GPU: device)
    # forwards of each phase per profiled step (a generate's prefill and decode): what a row per forward of its
    # phase is multiplied by, to add up per step
    phase_forwards: tuple[tuple[str, float], ...] = ()
    nonfinite: NonFinite | None = None  # where it gave NaN or Inf (it is then ``failed``)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def candidate(self) -> Candidate:
        """What this row ran, as a value: its selection and compile mode (``backend`` is its name)."""
        return candidate.parse(self.backend)


def no_attention_text(at: str = "", workload: typing.Mapping | None = None) -> str:
    """What a run of a model whose forward made no attention call through attnswitch says (``at``: where, as
    " at any shape" for a sweep); a callable's (``workload``'s mode), that its attention does not go through it."""
    if (workload or {}).get("mode") == "callable":
        return (f"The callable made no attention call through attnswitch{at}: a backend switches "
                "attnswitch.attention(...) and transformers' attention layers, not a direct call of "
                "F.scaled_dot_product_attention; there is nothing to choose.")
    return (f"The model's forward made no attention call through attnswitch{at} (no attention layers, as in a "
            "state-space model): there is nothing to choose.")


def no_attention(results) -> bool:
    """Backends ran, and none made an attention call (a state-space model): nothing to choose among. Compiled
    rows do not say (a compiled forward's calls are not counted one by one): where only they ran, it is not known."""
    ran = [b for b in results if b.ok and b.compile is None]
    return bool(ran) and all(b.attn_calls == 0 for b in ran)


def candidates(ranking) -> list[str]:
    """The ranking without ``eager``: the model's own attention is ranked as the reference the others are
    checked against, never picked."""
    return [n for n in ranking if n != "eager"]


@dataclass(frozen=True)
class SweepPoint:
    """One shape of a sweep: every backend's result there (per-layer rows left to the full report)."""

    batch: int
    seq: int  # a generate sweep's: the prompt length (its prompts are spread around it)
    backends: tuple[BackendResult, ...]
    ranking: tuple[str, ...] = ()
    ties: tuple[str, ...] = ()  # the pick and the candidates not told apart from it
    new_tokens: int | None = None  # a generate sweep's new tokens per prompt
    with_pick: tuple[str, ...] = ()  # the sweep's pick and those tied with it here (the margins are against it)

    @property
    def pick(self) -> str | None:
        """The fastest candidate at this shape."""
        return self.ties[0] if self.ties else next(iter(candidates(self.ranking)), None)

    @property
    def folder(self) -> str:
        """Where this shape's traces go, under the traces folder (each shape has its own)."""
        return f"batch{self.batch}_seq{self.seq}" + (f"_new{self.new_tokens}" if self.new_tokens else "")


_CSV_COLUMNS = ["backend", "rank", "status", "timer", "time_ms", "vs_pick", "vs_pick_low", "vs_pick_high", "noise_pct",
                "host_ms", "host_attn_ms", "cold_host_ms",
                "attn_host_us", "attn_cold_host_us", "peak_mem_mb", "kernels", "memcpys", "memsets",
                "attn_kernels_per_call", "attn_memcpys_per_call", "attn_gpu_us_per_call", "profiled_gpu_busy_ms",
                "profiled_gpu_span_ms", "max_rel_err", "top1_agreement", "ttft_ms", "step_ms_p50", "tokens_per_s",
                "token_agreement", "forward_ms", "backward_ms", "grad_max_rel_err", "attn_achieved", "attn_unit",
                "attn_pct_of_peak", "attn_pct_of_measured", "defects", "reasons"]
#: the columns taken from a generate's or a training step's own results
_CSV_GENERATE = ("ttft_ms", "step_ms_p50", "tokens_per_s", "token_agreement")
_CSV_TRAIN = ("forward_ms", "backward_ms", "grad_max_rel_err")


def _csv_row(b: BackendResult, ranking: tuple[str, ...]) -> list:
    d = {c: getattr(b, c, None) for c in _CSV_COLUMNS}
    d["rank"] = ranking.index(b.backend) + 1 if b.backend in ranking else None
    m = b.margin
    d["vs_pick"], d["vs_pick_low"], d["vs_pick_high"] = (m.ratio, m.low, m.high) if m else (None, None, None)
    d["max_rel_err"] = b.numerics.max_rel_err if b.numerics else None
    d["top1_agreement"] = b.numerics.top1_agreement if b.numerics else None
    for c in _CSV_GENERATE:
        d[c] = getattr(b.generate, c, None) if b.generate is not None else None
    for c in _CSV_TRAIN:
        d[c] = getattr(b.train, c, None) if b.train is not None else None
    f = primary(b.attn_peak)  # the phase with the most kernel time
    d["attn_achieved"], d["attn_unit"] = (f.achieved, f.unit) if f else (None, None)
    d["attn_pct_of_peak"], d["attn_pct_of_measured"] = (f.pct_spec, f.pct_measured) if f else (None, None)
    d["defects"] = " ".join(f"{m.id}:{m.level}" for m in b.defects)
    d["reasons"] = " | ".join(b.reasons)
    return [d[c] for c in _CSV_COLUMNS]


@dataclass(frozen=True)
class Deploy:
    """The pick in a form to ship: the attnswitch snippet (runs as it is, with ``model`` in scope), the
    transformers/PyTorch-only equivalent where one exists and what it loses, the environment variables and
    versions it was measured with, and when to measure again. ``keep``: the model's own attention, nothing to
    change in the code (``attnswitch`` is then transformers' own line, or empty)."""

    pick: str
    selection: str | dict  # a backend's name, or a policy per phase as a mapping
    compile: str | None  # the torch.compile mode it was measured under
    where: str  # "the serving process", "the training script"
    attnswitch: str
    plain: str | None = None
    plain_loses: tuple[str, ...] = ()
    env: dict = dataclasses.field(default_factory=dict)
    versions: dict = dataclasses.field(default_factory=dict)
    remeasure: tuple[str, ...] = ()
    ties: tuple[str, ...] = ()
    keep: bool = False


@dataclass(frozen=True)
class Decision:
    """What a report answers, decided once (``decision.decide``) and read by every writer: ``answer`` (one of
    ``ANSWERS``), ``pick`` (what to deploy; None: nothing), the candidates tied with the fastest (``ties``, the
    pick first), ``fastest`` (what the paired rounds found fastest), ``rule`` (why the pick and not the
    fastest, where they differ), the answer's first line and its reasons, the cautions, and ``deploy``."""

    answer: str
    pick: str | None = None
    ties: tuple[str, ...] = ()
    fastest: str | None = None
    rule: str = ""
    headline: str = ""
    reasons: tuple[str, ...] = ()
    cautions: tuple[str, ...] = ()
    deploy: Deploy | None = None

    @property
    def text(self) -> str:
        """The answer, then its reasons, a line each."""
        return "\n".join([self.headline, *self.reasons])

    @property
    def answered(self) -> bool:
        """Whether there is an answer to act on (a backend, or keeping the model's own attention)."""
        return self.answer in ("use", "tie", "keep")


@dataclass(frozen=True)
class Report:
    """What ``profile`` and ``compare`` return: print it, or save it (``to_json``, ``to_csv``,
    ``to_markdown``, ``write_html``, ``save_traces``)."""

    backends: tuple[BackendResult, ...]
    environment: dict
    workload: dict
    settings: dict
    model: str = ""
    ranking: tuple[str, ...] = ()
    decision: Decision | None = None  # what it answers (None: a profile, which ranks nothing)
    command: str | None = None
    distribution: dict | None = None  # how the model was spread: device_map or tensor parallelism
    sweep: tuple[SweepPoint, ...] = ()  # one point per shape of a sweep (the backends: the last shape's)
    serving: dict | None = None  # a generate sweep over a length mix: the cost of a run of requests
    schema_version: int = SCHEMA_VERSION

    @property
    def no_attention(self) -> bool:
        """Backends ran, and not one attention call went through attnswitch (``no_attention``)."""
        return no_attention(self.backends)

    # a read-only mapping of backend name to its result, in the report's order: ``report["flash"]``,
    # ``"flash" in report``, ``list(report)`` (the names), ``len(report)``
    def __getitem__(self, name) -> BackendResult:
        try:  # its names made canonical; a backend registered when the report was made and not now, as it is
            if isinstance(name, (str, Candidate)):
                key = str(candidate.parse(name, resolve_name))
            elif isinstance(name, typing.Mapping):  # a policy's or a per-kind selection's mapping
                key = str(candidate.selection_of(name, resolve_name))
            else:
                key = resolve_name(name)
        except (ValueError, TypeError):
            key = name
        for b in self.backends:
            if b.backend == key:
                return b
        raise KeyError(f"backend {name!r} is not in this report ({', '.join(b.backend for b in self.backends)})")

    def __contains__(self, name) -> bool:
        try:
            self[name]
        except KeyError:
            return False
        return True

    def __iter__(self):
        return (b.backend for b in self.backends)

    def __len__(self) -> int:
        return len(self.backends)

    @property
    def ok(self) -> list[BackendResult]:
        return [b for b in self.backends if b.ok]

    def _decided(self, name: str, default=None):
        """The decision's field ``name`` (``default`` for a report without a decision: a profile's)."""
        return getattr(self.decision, name) if self.decision is not None else default

    #: what the report deploys (``decision.pick``; None: nothing, or a profile, which decides nothing)
    pick = property(lambda self: self._decided("pick"))
    #: the pick and the candidates its intervals do not tell apart from the fastest
    ties = property(lambda self: self._decided("ties", ()))
    #: those the summary marks tied with the pick (``ties``; a sweep's summary shows its last shape: those tied
    #: with the sweep's pick at that shape, where it ran there and the report is of a schema that says so)
    shown_ties = property(lambda self: (self.sweep[-1].with_pick if self.sweep else ()) or self.ties)
    #: the answer's text: its first line, then its reasons
    recommendation = property(lambda self: self._decided("text"))
    #: what makes the timings less trustworthy (a busy machine, ...)
    cautions = property(lambda self: self._decided("cautions", ()))
    #: how to run the pick (None: nothing to deploy)
    deploy = property(lambda self: self._decided("deploy"))

    # -- files -----------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self, path: str | Path | None = None, indent: int = 1) -> str:
        """Strict JSON (any reader's): a non-finite figure (the error of a backend that gave NaN) is written as
        the string ``float`` reads (``"inf"``, ``"nan"``), and read back as the float."""
        text = json.dumps(_json_safe(self.to_dict()), indent=indent, default=str, allow_nan=False)
        if path is not None:
            Path(path).write_text(text)
        return text

    @classmethod
    def from_json(cls, text_or_path: str | Path) -> Report:
        """A report from its JSON text or file; older schema versions load with the new fields empty. A file
        that is no report (a policy file, a report damaged by hand) raises ``ValueError``, in one line."""
        p = Path(text_or_path) if not str(text_or_path).lstrip().startswith("{") else None
        where = f"{p}: " if p else ""
        data = json.loads(p.read_text() if p else str(text_or_path))
        if isinstance(data, dict) and "schema_version" not in data and "selection" in data:
            raise ValueError(f"{where}a policy file, not a report: attnswitch.load_policy reads it")
        if not isinstance(data, dict) or data.get("schema_version") not in _READABLE:
            version = data.get("schema_version") if isinstance(data, dict) else None
            raise ValueError(f"{where}not a report of schema {_READABLE[0]} to {_READABLE[-1]} "
                             f"('schema_version' is {json.dumps(version)})")
        if data["schema_version"] < 5:
            data["decision"] = _old_decision(data)
        data["schema_version"] = SCHEMA_VERSION
        try:
            return _build(cls, data)
        except (AttributeError, KeyError, TypeError, ValueError) as e:  # (a field of the wrong shape)
            raise ValueError(f"{where}a report whose fields do not read as one ({type(e).__name__}: {e})") from None

    def to_csv(self, path: str | Path | None = None) -> str:
        """One row per backend (per shape, with ``batch`` and ``seq`` first, for a sweep, and a generate sweep's
        ``new_tokens``); ``time_ms`` is per step of the workload's mode (a forward, a training step, the whole
        generate workload)."""
        buf = io.StringIO()
        w = csv.writer(buf)
        new = any(p.new_tokens is not None for p in self.sweep)
        groups = [((p.batch, p.seq) + ((p.new_tokens,) if new else ()), p.backends, p.ranking) for p in self.sweep] \
            if self.sweep else [((), self.backends, self.ranking)]
        w.writerow((["batch", "seq"] + (["new_tokens"] if new else []) if self.sweep else []) + _CSV_COLUMNS)
        for shape, backends, ranking in groups:
            for b in backends:
                w.writerow(list(shape) + ["" if v is None else v for v in _csv_row(b, ranking)])
        text = buf.getvalue()
        if path is not None:
            Path(path).write_text(text)
        return text

    def trace_files(self) -> list[tuple[str, str, str]]:
        """``(backend, path relative to the traces folder, recorded path)`` of every trace: a sweep's in
        one folder per shape (``SweepPoint.folder``), so that no shape's trace overwrites another's."""
        groups = [(p.folder + "/", p.backends) for p in self.sweep] if self.sweep else [("", self.backends)]
        files = [(b.backend, prefix + Path(src).name, src) for prefix, backends in groups for b in backends
                 for src in ([b.trace_path] if b.trace_path else []) + list(b.rank_trace_paths)]
        # a sweep recorded before each shape had its folder names one file for every shape: the last shape's
        last = {src: i for i, (_, _, src) in enumerate(files)}
        return [f for i, f in enumerate(files) if last[f[2]] == i]

    def save_traces(self, directory: str | Path) -> list[Path]:
        """Copy each backend's Perfetto-loadable trace into ``directory`` (``trace_files``' layout)."""
        out = Path(directory)
        copied = []
        for _, rel, src in self.trace_files():
            if not Path(src).exists():
                continue
            dest = out / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            if Path(src).resolve() != dest.resolve():
                shutil.copyfile(src, dest)
            copied.append(dest)
        return copied

    # -- text: the layout is ``render``'s ---------------------------------------------------------
    def render(self, console=None, layers: bool = True, fold: bool = True) -> None:
        """Print the report on a rich console (stdout by default)."""
        render.to_console(self, console, layers=layers, fold=fold)

    def to_markdown(self, path: str | Path | None = None, *, fold: bool = True) -> str:
        """``fold``: repeated layers as one row in the per-layer tables (False: one row per layer)."""
        return render.to_markdown(self, path, fold=fold)

    def write_html(self, path: str | Path, *, fold: bool = True) -> Path:
        return render.write_html(self, path, fold=fold)

    def __str__(self) -> str:
        return render.to_text(self)


# -- loading: dicts back into the frozen dataclasses, by their field types -------------------------

def _json_safe(value):
    """``value`` with each non-finite float as its string (JSON has no Infinity or NaN)."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def _convert(tp, value):
    if value is None:
        return None
    if tp is float and isinstance(value, str):  # a non-finite figure, as ``to_json`` writes it
        return float(value)
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        return _convert(inner[0], value) if len(inner) == 1 else value
    if dataclasses.is_dataclass(tp):
        return _build(tp, value)
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_convert(args[0], v) for v in value)
        return tuple(_convert(a, v) for a, v in zip(args, value))
    return value


def _build(cls, data: dict):
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: _convert(hints[k], v) for k, v in data.items() if k in names})


def _old_decision(data: dict) -> dict | None:
    """A report of schema 4 or older: its recommendation's text, ties, cautions and deploy as a decision."""
    text = data.get("recommendation")
    if not text:
        return None
    head, *reasons = text.splitlines()
    ties = tuple(data.get("ties") or ())
    pick = ties[0] if ties else next(iter(candidates(data.get("ranking") or ())), None)
    answer = "tie" if len(ties) > 1 else "use" if pick else "none"
    deploy = data.get("deploy")
    if deploy:
        deploy = {**{k: v for k, v in deploy.items() if k in {f.name for f in dataclasses.fields(Deploy)}},
                  "where": "the serving process"}
    return {"answer": answer, "pick": pick, "ties": ties, "fastest": pick, "headline": head,
            "reasons": [r for r in reasons if r.strip()], "cautions": data.get("cautions") or (), "deploy": deploy}
