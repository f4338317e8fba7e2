"""Models spread over several GPUs: how they are spread, and one report from many ranks.

Under accelerate's ``device_map`` one process drives every GPU: its trace holds all of them and
nothing needs merging. Under tensor parallelism (``torchrun``, one process per GPU) every rank
profiles its own GPU in lockstep with the others (the forwards hold collectives); ``merge`` gathers
the ranks' results into one report on every rank, with a rank column, and the other ranks' traces
to rank 0, the only rank that writes files.
"""

from __future__ import annotations

import dataclasses
import gzip
from pathlib import Path

import torch.nn as nn

from ..device import device_of
from ..dist import gather, world
from ..results import BackendResult
from .rounds import shared_rounds
from .summarize import timing_of, with_timing

__all__ = ["distribution_of", "agree_ok", "merge_results", "gather_traces", "merged_report_backends", "retimed"]


def _layout(device_map: dict) -> str:
    """``{"model.embed_tokens": 0, "model.layers.0": 0, ..., "lm_head": 1}`` -> runs of modules per device."""
    runs: list[list] = []
    for name, dev in device_map.items():
        if runs and runs[-1][2] == dev:
            runs[-1][1] = name
        else:
            runs.append([name, name, dev])
    label = lambda d: f"cuda:{d}" if isinstance(d, int) else str(d)  # noqa: E731
    return "; ".join((f"{a}" if a == b else f"{a} … {b}") + f" on {label(d)}" for a, b, d in runs)


def distribution_of(model: nn.Module | None) -> dict | None:
    """How ``model`` is spread: tensor parallelism over the ranks of a process group, or a
    ``device_map`` over several devices; None for a model on one device in one process."""
    if model is None:
        return None
    w = world()
    if w is not None and (getattr(model, "_device_mesh", None) is not None or _has_dtensor(model)):
        import torch.distributed as dist

        devices = gather(str(device_of(model)))
        return {"mode": "tensor_parallel", "world_size": w[1], "backend": dist.get_backend(),
                "devices": devices, "tp_plan": _plan_summary(model)}
    dmap = getattr(model, "hf_device_map", None)
    if dmap and len(set(dmap.values())) > 1:
        devs = list(dict.fromkeys(dmap.values()))
        return {"mode": "device_map", "devices": [f"cuda:{d}" if isinstance(d, int) else str(d) for d in devs],
                "layout": _layout(dmap), "device_map": {k: str(v) for k, v in dmap.items()}}
    return None


def _has_dtensor(model: nn.Module) -> bool:
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # pragma: no cover
        return False
    return any(isinstance(p, DTensor) for p in model.parameters())


def _plan_summary(model: nn.Module) -> dict | None:
    plan = getattr(model, "tp_plan", None) or getattr(model.config, "base_model_tp_plan", None)
    return dict(plan) if isinstance(plan, dict) else None


def agree_ok(ok: list[str]) -> list[str]:
    """The backends that ran on every rank (timing needs every rank to run the same forwards)."""
    if world() is None:
        return ok
    every = gather(ok)
    return [b for b in ok if all(b in other for other in every)]


def merge_results(per_rank: list[BackendResult]) -> BackendResult:
    """One backend's results from every rank (index = rank) as one result.

    Counts and device time are summed over ranks (the whole job's GPUs), per-call attention figures
    and host times are rank 0's (every rank runs the same calls on its shard), peak memory is the
    fullest GPU's, and the time of a forward is the slowest rank's, forward by forward.
    """
    r0 = per_rank[0]
    bad = [(i, r) for i, r in enumerate(per_rank) if not r.ok]
    if bad:
        i, r = bad[0]
        return dataclasses.replace(r0, status=r.status, reasons=tuple(f"rank {i}: {x}" for x in r.reasons),
                                   where=r.where)
    total = lambda f: (sum(getattr(r, f) for r in per_rank)  # noqa: E731
                       if all(getattr(r, f) is not None for r in per_rank) else None)
    n = min(len(r.time_samples_ms) for r in per_rank)
    samples = [max(r.time_samples_ms[i] for r in per_rank) for i in range(n)]
    n_rounds = min(len(r.time_rounds_ms) for r in per_rank)
    units = [[max(xs) for xs in zip(*(r.time_rounds_ms[i] for r in per_rank))] for i in range(n_rounds)]
    devices = tuple(dataclasses.replace(d, time_ms=r.time_ms) for r in per_rank for d in r.devices)
    peaks = [r.peak_mem_mb for r in per_rank if r.peak_mem_mb is not None]
    spans = [r.profiled_gpu_span_ms for r in per_rank if r.profiled_gpu_span_ms is not None]
    notes = list(r0.notes)
    for i, r in enumerate(per_rank[1:], 1):
        if r.attn_kernels_per_call != r0.attn_kernels_per_call:
            notes.append(f"rank {i} ran {r.attn_kernels_per_call} attention kernels per call, rank 0 "
                         f"{r0.attn_kernels_per_call}")
    # each step (and each paired unit) is as slow as the slowest rank's, in the round rank 0 took it in (ranks run
    # the rounds in lockstep); a generate's step figures are rank 0's
    timing = timing_of(dataclasses.replace(r0, time_samples_ms=tuple(samples), time_rounds_ms=tuple(map(tuple, units)),
                                           time_sample_rounds=r0.time_sample_rounds[:n]))
    merged = with_timing(r0, timing) if samples else r0
    return dataclasses.replace(
        merged, notes=tuple(dict.fromkeys(notes)), kernels=total("kernels"), memcpys=total("memcpys"),
        memsets=total("memsets"), ops=total("ops"),
        profiled_gpu_busy_ms=total("profiled_gpu_busy_ms"), profiled_gpu_span_ms=max(spans) if spans else None,
        peak_mem_mb=max(peaks) if peaks else None, layers=tuple(l for r in per_rank for l in r.layers),
        devices=devices, transfers=tuple(t for r in per_rank for t in r.transfers),
        trace_events=total("trace_events"))


def gather_traces(results: list[BackendResult], trace_dir: str | Path | None) -> dict[str, tuple[str, ...]]:
    """Send every other rank's traces to rank 0, which writes them (compressed) into ``trace_dir``.
    Returns, on rank 0, backend -> the paths written; elsewhere an empty dict."""
    w = world()
    if w is None or trace_dir is None:
        return {}
    mine = {}
    if w[0] != 0:
        for r in results:
            if r.trace_path and Path(r.trace_path).exists():
                data = Path(r.trace_path).read_bytes()  # gzipped already, as capture writes traces
                gz = data if r.trace_path.endswith(".gz") else gzip.compress(data, 1)
                mine[r.backend] = (Path(r.trace_path).name + ("" if r.trace_path.endswith(".gz") else ".gz"), gz)
    every = gather(mine)  # all ranks take part; only rank 0 keeps anything
    if w[0] != 0:
        return {}
    out: dict[str, list[str]] = {}
    d = Path(trace_dir)
    d.mkdir(parents=True, exist_ok=True)
    for rank_files in every[1:]:
        for backend, (name, data) in rank_files.items():
            p = d / name
            p.write_bytes(data)
            out.setdefault(backend, []).append(str(p))
    return {k: tuple(v) for k, v in out.items()}


def merged_report_backends(results: list[BackendResult], trace_dir) -> list[BackendResult]:
    """Every rank's results merged (on every rank), the other ranks' trace paths on rank 0's copy."""
    every = gather(results)
    rank_traces = gather_traces(results, trace_dir)
    merged = [merge_results([rank_results[i] for rank_results in every]) for i in range(len(results))]
    return [dataclasses.replace(b, rank_trace_paths=rank_traces.get(b.backend, ())) for b in retimed(merged)]


def retimed(results: list[BackendResult]) -> list[BackendResult]:
    """Every timed result's time from the rounds all of them took (``rounds.shared_rounds``), as one process's
    are (merging ranks forward by forward takes each time anew)."""
    # every backend timed, as in one process (one failed after its rounds, for NaN say, took the first ones)
    timings = {b.backend: timing_of(b) for b in results if b.time_rounds_ms}
    if not timings:
        return results
    shared = shared_rounds(timings)
    return [with_timing(b, timings[b.backend], shared) if b.backend in timings and b.ok else b for b in results]
