"""An attributed trace as the fields of a ``BackendResult``: per-forward totals, per-layer rows, per-GPU
totals, copies between GPUs, what the attention call ran. Pure functions over parsed data."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence

from ..backends import KERNEL_OPS
from ..instrument import PHASE_PREFIX
from ..results import BackendResult, DeviceStats, LayerStats, TransferStats
from ..stats import median, noise_pct, percentile
from .attribution import device_totals, kernel_summaries, step_totals, transfers
from .occupancy import DeviceLimits
from .rounds import Timing
from .trace import Trace

__all__ = ["backend_fields", "layer_stats", "with_timing", "timing_of"]


def with_timing(result: BackendResult, timing: Timing, rounds: Sequence[int] | None = None) -> BackendResult:
    """``result`` with its steady time per step from the timing rounds (``Timing.time_ms``: of ``rounds``
    alone where given, the rounds every backend took), every sample
    and their spread, the units its rounds are paired by; for a generate workload, the decode-step
    figures of every round (time to first token, step percentiles, host and GPU time per step, the
    whole workload's median as a check) and tokens per second."""
    t = timing.time_ms(rounds)
    g = result.generate
    if g is not None and timing.steps is not None:
        st = {k: _of_rounds(timing, k, rounds) for k in timing.steps}
        g = dataclasses.replace(
            g, ttft_ms=median(st["ttft"]) if st["ttft"] else g.ttft_ms,
            step_ms_p50=percentile(st["interval"], 50) if st["interval"] else g.step_ms_p50,
            step_ms_p90=percentile(st["interval"], 90) if st["interval"] else g.step_ms_p90,
            step_ms_p99=percentile(st["interval"], 99) if st["interval"] else g.step_ms_p99,
            step_host_ms=median(st["host"]) if st["host"] else g.step_host_ms,
            step_gpu_ms=median(st["gpu"]) if st["gpu"] else g.step_gpu_ms,
            workload_wall_ms=median(st["wall"]) if st["wall"] else g.workload_wall_ms, steps_timed=len(st["interval"]))
    if g is not None and t:
        g = dataclasses.replace(g, tokens_per_s=g.tokens / (t / 1e3))
    units = tuple(tuple(u) for u in timing.units)
    at = tuple(r for r, xs in enumerate(timing.by_round) for _ in xs) if not timing.per_prompt else ()
    return dataclasses.replace(result, time_ms=t, time_samples_ms=tuple(timing.samples),
                               time_sample_rounds=at if len(at) == len(timing.samples) else (),
                               noise_pct=noise_pct(timing.spread()),
                               time_rounds_ms=units, generate=g)


def _of_rounds(timing: Timing, k: str, rounds: Sequence[int] | None) -> list[float]:
    """A generate's ``k`` figures (``Timing.steps``) from ``rounds`` alone where each figure's rounds are known
    (a whole workload's: every one of its prompts' in them), so that they come from the rounds its time does."""
    values, at = timing.steps[k], timing.step_rounds.get(k)
    if rounds is None or at is None or len(at) != len(values):
        return values
    keep = set(rounds)
    return [x for x, rs in zip(values, at) if all(r in keep for r in rs)] or values


def timing_of(result: BackendResult) -> Timing:
    """The timing rounds a result's figures were taken from, as far as it keeps them: its samples (in their
    rounds, where it says which) and units (``with_timing`` of it gives it back its time)."""
    by_round: list[list[float]] = [[] for _ in result.time_rounds_ms]
    if len(result.time_sample_rounds) == len(result.time_samples_ms):
        for x, r in zip(result.time_samples_ms, result.time_sample_rounds):
            if r < len(by_round):
                by_round[r].append(x)
    return Timing(list(result.time_samples_ms), [list(u) for u in result.time_rounds_ms],
                  by_round=by_round if any(by_round) else [], per_prompt=result.generate is not None)


def _counted(c) -> tuple[tuple[str, float], ...]:
    return tuple(sorted(((k, float(v)) for k, v in c.items()), key=lambda kv: -kv[1]))


_PHASES = {None: 0, "prefill": 0, "decode": 1, "backward": 2}


def _path_order(layer: LayerStats):
    parts = tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in re.split(r"\.", layer.path))
    return (_PHASES.get(layer.phase, 3), layer.path == "(outside modules)", parts, layer.kind != "module")


def layer_stats(rows: dict, n: int | dict, rank: int | None) -> tuple[LayerStats, ...]:
    """Rows summed over the profiled steps as per-step layer stats, in model order: ``n`` steps, or per
    phase the number of forwards of that phase (a generate's prefill rows per prefill, its decode rows per
    decode step). Names (ops, kernels, launch APIs) are kept for the attention rows."""
    out = []
    for r in rows.values():
        k = (n.get(r.phase) or n.get(None, 1)) if isinstance(n, dict) else n
        names = dict(op_names=_counted(r.op_names), kernel_names=_counted(r.kernel_names),
                     launch_apis=_counted(r.launch_apis)) if r.kind == "attention" else {}
        out.append(LayerStats(r.path, r.kind, r.calls / k, r.kernels / k, r.memcpys / k, r.memsets / k, r.gpu_us / k,
                              r.host_us / k, r.ops / k, **names, comm_kernels=r.comm_kernels / k,
                              comm_us=r.comm_us / k, comm_ops=r.comm_ops / k, devices=tuple(sorted(r.devices)),
                              rank=rank, phase=r.phase))
    return tuple(sorted(out, key=_path_order))


def _per_phase(trace: Trace, n: int) -> dict:
    """How many forwards of each phase the profiled steps ran (None and backward: one per step)."""
    counts: dict = {None: n, "backward": n}
    steps = {s.step for s in trace.steps()}
    for r in trace.ranges(PHASE_PREFIX):
        if r.step in steps:
            phase = r.name[len(PHASE_PREFIX):]
            counts[phase] = counts.get(phase, 0) + 1
    return counts


def _device_stats(trace: Trace, n: int, rank: int | None, peaks: dict) -> tuple[DeviceStats, ...]:
    per_dev: dict[int, list] = {}
    for t in device_totals(trace):
        per_dev.setdefault(t.device, []).append(t)
    return tuple(DeviceStats(
        d, rank, sum(t.kernels for t in ts) / n, sum(t.memcpys for t in ts) / n, sum(t.memsets for t in ts) / n,
        sum(t.comm_kernels for t in ts) / n, sum(t.gpu_busy_us for t in ts) / n / 1e3,
        sum(t.comm_us for t in ts) / n / 1e3, median(t.gpu_span_us for t in ts) / 1e3, peaks.get(d))
        for d, ts in sorted(per_dev.items()))


def _attention_fields(trace: Trace, rows: dict, cuda: bool, limits: DeviceLimits | None) -> dict:
    # the attention call itself: forward rows (its backward has rows of its own)
    attn = [r for r in rows.values() if r.kind == "attention" and r.phase != "backward"]
    calls = sum(r.calls for r in attn)
    per_call = (lambda f: sum(getattr(r, f) for r in attn) / calls) if calls and cuda else (lambda f: None)
    events = [e for e in trace.device_events if e.attention is not None and e.phase != "backward"]
    op_names: dict[str, None] = {}
    for r in attn:
        op_names.update(dict.fromkeys(r.op_names))
    inner_ops = sorted({e.name for e in trace.events if e.cat == "cpu_op" and e.attention is not None
                        and e.name.startswith(KERNEL_OPS)})
    return dict(
        attn_kernels_per_call=per_call("kernels"), attn_memcpys_per_call=per_call("memcpys"),
        attn_gpu_us_per_call=per_call("gpu_us"), attn_ops=tuple(dict.fromkeys(list(op_names) + inner_ops)),
        attn_kernel_names=tuple(dict.fromkeys(e.name for e in events)),
        attn_launch_apis=tuple(dict.fromkeys(e.launch.name for e in events if e.launch is not None)),
        attn_kernel_details=tuple(k.__dict__ for k in kernel_summaries(events, limits)))


def backend_fields(trace: Trace, rows: dict, *, cuda: bool, limits: DeviceLimits | None = None,
                   peaks: dict | None = None, rank: int | None = None) -> dict:
    """The trace-derived fields of a ``BackendResult``, per forward (the trace's steps). ``limits``: the
    GPU's, for occupancy (None for a recorded trace read off its GPU); ``peaks``: peak MB per GPU."""
    totals = step_totals(trace)
    n = max(1, len(totals))
    steps = {s.step for s in trace.steps()}
    moved = tuple(TransferStats(t.after, t.into, t.src, t.dst, t.copies / n, t.bytes / n, t.gpu_us / n)
                  for t in transfers(trace, steps=steps))
    per_fwd = (lambda f: sum(getattr(t, f) for t in totals) / n) if cuda else (lambda f: None)
    phases = _per_phase(trace, n)
    return dict(
        phase_forwards=tuple((p, c / n) for p, c in phases.items() if p not in (None, "backward")),
        profiled_gpu_busy_ms=per_fwd("gpu_busy_us") / 1e3 if cuda else None,
        profiled_gpu_span_ms=median(t.gpu_span_us for t in totals) / 1e3 if cuda and totals else None,
        kernels=per_fwd("kernels"), memcpys=per_fwd("memcpys"), memsets=per_fwd("memsets"),
        ops=sum(t.ops for t in totals) / n, **_attention_fields(trace, rows, cuda, limits),
        layers=layer_stats(rows, phases, rank), devices=_device_stats(trace, n, rank, peaks or {}),
        transfers=moved,
    )
