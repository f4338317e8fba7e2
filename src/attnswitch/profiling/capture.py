"""Running forwards per backend: unprofiled timing, then one profiled pass with module ranges.

Per backend, on the same inputs and after the same warm-up:
1. the cold forward (first at this shape for this backend): host time, and host time per attention call;
2. ``warmup`` forwards, then ``iters`` timed forwards (CUDA events on a GPU, wall clock on a CPU),
   host time per forward and per attention call, peak device memory;
3. ``iters`` profiled forwards: Kineto trace with a range per module, per attention call and per step,
   parsed and attributed to layers.
"""

from __future__ import annotations

import contextlib
import inspect
import itertools
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import torch
import torch.nn as nn
from torch.autograd.profiler import record_function

from .. import instrument
from ..backends import recording_notes, resolve_name
from ..errors import BackendUnavailable, UnsupportedModel
from ..report import BackendResult, DeviceStats, LayerStats, TransferStats
from ..switch import backend as use_backend
from .attribution import attribute, device_totals, kernel_summaries, step_totals, transfers
from .distributed import world
from .occupancy import device_limits
from .trace import Trace

__all__ = ["annotate_modules", "prepare_backend", "timed_rounds", "with_timing", "Target"]


try:  # a C++ range: about a tenth of record_function's host cost, which matters once per module call
    from torch._C._profiler import _RecordFunctionFast as _Range
except ImportError:  # pragma: no cover - older torch
    _Range = record_function


@contextlib.contextmanager
def annotate_modules(model: nn.Module) -> Iterator[None]:
    """A profiler range ``attnswitch.module:<path>`` around every module's forward."""
    handles = []
    open_ranges: dict[int, list] = {}
    root = type(model).__name__

    def pre(path):
        name = instrument.MODULE_PREFIX + path

        def hook(module, args):
            rf = _Range(name)
            rf.__enter__()
            open_ranges.setdefault(id(module), []).append(rf)
        return hook

    def post(module, args, output):
        stack = open_ranges.get(id(module))
        if stack:
            stack.pop().__exit__(None, None, None)

    for path, m in model.named_modules():
        handles.append(m.register_forward_pre_hook(pre(path or root)))
        handles.append(m.register_forward_hook(post, always_call=True))
    try:
        yield
    finally:
        for h in handles:
            h.remove()


class Target:
    """What is run: a model with prepared argument sets (``Workload``) or a plain callable."""

    def __init__(self, fn: Callable[..., Any], calls: Callable[[int], list], model: nn.Module | None,
                 device: torch.device):
        self.fn, self.calls, self.model, self.device = fn, calls, model, device
        # every GPU the model's weights are on (several under accelerate's device_map); the inputs go to
        # ``device``, the first one
        self.devices = _devices_of(model) if model is not None else [device]
        if device not in self.devices:
            self.devices = [device] + self.devices

    def sync(self) -> None:
        for d in self.devices:
            _sync(d)

    @classmethod
    def of(cls, target, batch=None, device=None) -> "Target":
        from ..models import Workload

        if isinstance(target, Workload):
            return cls(lambda kw: target.model(**kw), target.calls, target.model, _device_of(target.model))
        if isinstance(target, nn.Module):
            if batch is None:
                raise ValueError("profiling a model needs its inputs: profile(model, batch) with batch a dict "
                                 "of forward arguments (or a Workload)")
            if isinstance(batch, Workload):
                return cls.of(batch)
            if not isinstance(batch, dict):
                raise TypeError(f"batch must be a dict of forward arguments, not {type(batch).__name__}")
            return cls(lambda kw: target(**kw), lambda n: itertools.repeat(batch, n), target, _device_of(target))
        if callable(target):
            dev = torch.device(device) if device is not None else torch.device(
                "cuda" if torch.cuda.is_available() else "cpu")
            return cls(lambda kw: target(), lambda n: itertools.repeat(None, n), None, dev)
        raise TypeError(f"cannot profile a {type(target).__name__}: pass a model with a batch, or a callable")

    def switched(self, name: str):
        # a model is switched alone; a plain callable runs under a global backend
        return use_backend(name, model=self.model)

    def annotated(self):
        return annotate_modules(self.model) if self.model is not None else contextlib.nullcontext()


def _device_of(model: nn.Module) -> torch.device:
    for p in model.parameters():
        return p.device
    return torch.device("cpu")


def _devices_of(model: nn.Module) -> list[torch.device]:
    seen: dict[torch.device, None] = {}
    for t in itertools.chain(model.parameters(), model.buffers()):
        if t.device.type != "meta":
            seen.setdefault(t.device)
    return list(seen) or [torch.device("cpu")]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _median(xs: Iterable[float]) -> float | None:
    xs = list(xs)
    return statistics.median(xs) if xs else None


def _noise_pct(xs: list[float]) -> float | None:
    """Half the interquartile range (half the range for fewer than 4 samples), in % of the median."""
    if len(xs) < 2:
        return None
    if len(xs) < 4:
        lo, hi = min(xs), max(xs)
    else:
        lo, _, hi = statistics.quantiles(xs, n=4)
    return 100.0 * (hi - lo) / 2 / statistics.median(xs)


def _counted(c) -> tuple[tuple[str, float], ...]:
    return tuple(sorted(((k, float(v)) for k, v in c.items()), key=lambda kv: -kv[1]))


def prepare_backend(target: Target, name: str, *, warmup: int = 3, iters: int = 5,
                    trace_dir: str | Path | None = None, profile_trace: bool = True) -> BackendResult:
    """Everything but the GPU timing of one backend: the cold forward, warm-up, host time per
    forward and per attention call (the device idle before each call, so no wait for earlier work is
    counted), peak memory, and one profiled pass of ``iters`` forwards. A backend that cannot run
    gives status ``unavailable`` (PyTorch's reasons) or ``failed`` (out of memory, ...); never raises."""
    name = resolve_name(name)
    dev = target.device
    cuda = dev.type == "cuda"
    calls = target.calls(1 + warmup + iters + (iters if profile_trace else 0))
    try:
        with recording_notes() as notes, torch.no_grad(), target.switched(name):
            cold_attn: list = []
            c = next(calls)
            target.sync()
            with instrument.measuring(host_times=cold_attn):
                t0 = time.perf_counter()
                target.fn(c)
                cold_host = time.perf_counter() - t0
            target.sync()
            for _ in range(warmup):
                target.fn(next(calls))
            target.sync()
            if cuda:
                for d in target.devices:
                    torch.cuda.reset_peak_memory_stats(d)
            attn_times: list = []
            host = []
            with instrument.measuring(host_times=attn_times):
                for _ in range(iters):
                    c = next(calls)
                    target.sync()
                    t0 = time.perf_counter()
                    target.fn(c)
                    host.append(time.perf_counter() - t0)
            target.sync()
            peaks = {d.index: torch.cuda.max_memory_allocated(d) / 2**20 for d in target.devices} if cuda else {}
            trace_path = rows = trace_seconds = trace = None
            if profile_trace:
                trace_path, trace_seconds, trace, rows = _profiled(target, name, [next(calls) for _ in range(iters)],
                                                                   trace_dir)
    except BackendUnavailable as e:
        return BackendResult(name, "unavailable", tuple(e.reasons), e.where)
    except UnsupportedModel:
        raise
    except torch.OutOfMemoryError as e:
        _release(dev)
        return BackendResult(name, "failed", (f"out of memory: {str(e).splitlines()[0]}",))
    except (RuntimeError, ValueError, NotImplementedError) as e:
        _release(dev)
        return BackendResult(name, "failed", (f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}",))
    result = dict(
        backend=name, status="ok", notes=tuple(dict.fromkeys(n[2] for n in notes)),
        timer="cuda-events" if cuda else "wall-clock",
        host_ms=_median(h * 1e3 for h in host), cold_host_ms=cold_host * 1e3,
        attn_calls=len(attn_times) / max(1, iters),
        attn_host_us=_median(t * 1e6 for _, t in attn_times),
        attn_cold_host_us=cold_attn[0][1] * 1e6 if cold_attn else None,  # the first call at this shape
        peak_mem_mb=max(peaks.values()) if peaks else None,  # the fullest GPU
    )
    if trace is not None:
        result.update(_from_trace(trace, rows, cuda, dev, peaks), trace_path=str(trace_path), trace_seconds=trace_seconds[0],
                      profiled_run_seconds=trace_seconds[1], trace_events=len(trace.events))
    return BackendResult(**result)


def timed_rounds(target: Target, names: list[str], *, iters: int, rounds: int = 5) -> dict[str, list[float]]:
    """Steady time per forward (ms) for each backend, unprofiled, in ``rounds`` interleaved rounds so
    that drift (clocks, temperature, other load) falls on every backend alike. On a GPU each forward
    is timed with CUDA events, back to back; on a CPU with the wall clock."""
    cuda = target.device.type == "cuda"
    rounds = max(1, min(rounds, iters))
    per_round = [iters // rounds + (1 if r < iters % rounds else 0) for r in range(rounds)]
    samples: dict[str, list[float]] = {n: [] for n in names}
    with torch.no_grad():
        for n_calls in per_round:
            for name in names:
                calls = target.calls(n_calls + 1)
                with target.switched(name):
                    target.fn(next(calls))  # re-warm after the other backends ran
                    target.sync()
                    for _ in range(n_calls):
                        c = next(calls)
                        if cuda:
                            samples[name].append(_timed_on_gpus(target, c))
                        else:
                            t0 = time.perf_counter()
                            target.fn(c)
                            samples[name].append((time.perf_counter() - t0) * 1e3)
    return samples


def _timed_on_gpus(target: Target, c) -> float:
    """One forward timed with CUDA events (ms). Every GPU of the model gets a start and an end event;
    all are idle at the start, so their starts coincide and the forward lasts until the last GPU's end.
    (Events of two devices cannot be subtracted, so each GPU is measured from its own start.)"""
    streams = [torch.cuda.current_stream(d) for d in target.devices if d.type == "cuda"]
    starts = [torch.cuda.Event(enable_timing=True) for _ in streams]
    ends = [torch.cuda.Event(enable_timing=True) for _ in streams]
    for e, s in zip(starts, streams):
        e.record(s)
    target.fn(c)
    for e, s in zip(ends, streams):  # nothing but the records between the forward and its end events
        e.record(s)
    for e in ends:
        e.synchronize()
    return max(a.elapsed_time(b) for a, b in zip(starts, ends))


def with_timing(result: BackendResult, samples: list[float]) -> BackendResult:
    import dataclasses

    return dataclasses.replace(result, time_ms=_median(samples), time_samples_ms=tuple(samples),
                               noise_pct=_noise_pct(samples))


# ATen ops that name the attention kernel family, wherever they sit under the attention call
_KERNEL_OPS = ("aten::_scaled_dot_product", "aten::_flash_attention", "aten::_efficient_attention",
               "aten::_cudnn_attention")


def _release(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
        torch.cuda.empty_cache()


def _profiled(target: Target, name: str, calls: list, trace_dir) -> tuple[Path, tuple[float, float], Trace, dict]:
    acts = [torch.profiler.ProfilerActivity.CPU]
    if target.device.type == "cuda":
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    t_run = time.perf_counter()
    kw = {"acc_events": True} if "acc_events" in inspect.signature(torch.profiler.profile).parameters else {}
    with target.annotated(), instrument.measuring(annotate=True), torch.profiler.profile(activities=acts, **kw) as prof:
        for i, c in enumerate(calls):
            with record_function(f"{instrument.STEP_PREFIX}{i}"):
                target.fn(c)
        target.sync()
    run_seconds = time.perf_counter() - t_run  # the profiled forwards, the profiler's own collection included
    rank = _rank()
    # only rank 0 writes into trace_dir: the other ranks' traces reach it through the process group
    mine = trace_dir is not None and not rank
    out_dir = Path(trace_dir) if mine else Path(tempfile.mkdtemp(prefix="attnswitch-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / (f"trace_{name}.json" if rank is None else f"trace_{name}_rank{rank}.json")
    prof.export_chrome_trace(str(path))
    t0 = time.perf_counter()
    trace = Trace.load(path)
    rows = attribute(trace, steps={s.step for s in trace.steps()})
    return path, (time.perf_counter() - t0, run_seconds), trace, rows


def _rank() -> int | None:
    w = world()
    return w[0] if w is not None else None


def _from_trace(trace: Trace, rows: dict, cuda: bool, dev: torch.device, peaks: dict | None = None) -> dict:
    totals = step_totals(trace)
    n = max(1, len(totals))
    rank = _rank()
    # names (ops, kernels, launch APIs) are kept for the attention rows; module rows keep their counts
    layers = tuple(sorted((LayerStats(
        r.path, r.kind, r.calls / n, r.kernels / n, r.memcpys / n, r.memsets / n, r.gpu_us / n, r.host_us / n,
        r.ops / n, **(dict(op_names=_counted(r.op_names), kernel_names=_counted(r.kernel_names),
                           launch_apis=_counted(r.launch_apis)) if r.kind == "attention" else {}),
        comm_kernels=r.comm_kernels / n, comm_us=r.comm_us / n, comm_ops=r.comm_ops / n,
        devices=tuple(sorted(r.devices)), rank=rank)
        for r in rows.values()), key=lambda l: _path_order(l.path, l.kind)))
    per_dev: dict[int, list] = {}
    for t in device_totals(trace):
        per_dev.setdefault(t.device, []).append(t)
    devices = tuple(DeviceStats(
        d, rank, sum(t.kernels for t in ts) / n, sum(t.memcpys for t in ts) / n, sum(t.memsets for t in ts) / n,
        sum(t.comm_kernels for t in ts) / n, sum(t.gpu_busy_us for t in ts) / n / 1e3,
        sum(t.comm_us for t in ts) / n / 1e3, _median(t.gpu_span_us for t in ts) / 1e3,
        (peaks or {}).get(d)) for d, ts in sorted(per_dev.items()))
    moved = tuple(TransferStats(t.after, t.into, t.src, t.dst, t.copies / n, t.bytes / n, t.gpu_us / n)
                  for t in transfers(trace, steps={s.step for s in trace.steps()}))
    attn = [r for r in rows.values() if r.kind == "attention"]
    attn_calls = sum(r.calls for r in attn)
    per_call = (lambda f: sum(getattr(r, f) for r in attn) / attn_calls) if attn_calls else (lambda f: None)
    attn_events = [e for e in trace.device_events if e.attention is not None]
    limits = device_limits(dev) if cuda and dev is not None else None  # None: a recorded trace, off its GPU
    op_names: dict[str, None] = {}
    for r in attn:
        op_names.update(dict.fromkeys(r.op_names))
    inner_ops = sorted({e.name for e in trace.events if e.cat == "cpu_op" and e.attention is not None
                        and e.name.startswith(_KERNEL_OPS)})
    return dict(
        profiled_gpu_busy_ms=sum(t.gpu_busy_us for t in totals) / n / 1e3 if cuda else None,
        profiled_gpu_span_ms=_median(t.gpu_span_us for t in totals) / 1e3 if cuda and totals else None,
        kernels=sum(t.kernels for t in totals) / n if cuda else None,
        memcpys=sum(t.memcpys for t in totals) / n if cuda else None,
        memsets=sum(t.memsets for t in totals) / n if cuda else None, ops=sum(t.ops for t in totals) / n,
        attn_kernels_per_call=per_call("kernels") if cuda else None,
        attn_memcpys_per_call=per_call("memcpys") if cuda else None,
        attn_gpu_us_per_call=per_call("gpu_us") if cuda else None,
        attn_ops=tuple(dict.fromkeys(list(op_names) + inner_ops)),
        attn_kernel_names=tuple(dict.fromkeys(e.name for e in attn_events)),
        attn_launch_apis=tuple(dict.fromkeys(e.launch.name for e in attn_events if e.launch is not None)),
        attn_kernel_details=tuple(k.__dict__ for k in kernel_summaries(attn_events, limits)),
        layers=layers, devices=devices, transfers=moved,
    )


def _path_order(path: str, kind: str):
    import re

    parts = tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in re.split(r"\.", path))
    return (path == "(outside modules)", parts, kind != "module")
