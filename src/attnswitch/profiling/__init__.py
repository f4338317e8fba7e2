"""Profiling end-to-end forwards per backend, attributed to model layers.

``capture`` runs and times; ``trace`` parses Kineto traces (the only place that does); ``attribution``,
``occupancy`` and ``summarize`` are functions over parsed traces; ``distributed`` merges the ranks of a
tensor-parallel job.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from ..backends import not_offered, package_of, parse_backends
from ..dist import world
from ..env import environment
from ..hf import require_interface
from ..results import Report
from .capture import SETTLED, Target, frozen_heap, prepare_backend, timed_rounds
from .distributed import agree_ok, distribution_of, merged_report_backends
from .summarize import with_timing
from .trace import Trace
from .workloads import policy_candidate

__all__ = ["profile", "Trace"]


def _workload_info(t: Target) -> dict:
    if t.workload is None:
        return {"description": "callable", "mode": "callable"}
    return {**t.workload.describe(), "dtype": str(next(t.model.parameters()).dtype).replace("torch.", "")}


def _timed(t: Target, results: list, iters: int, rounds: int, progress, spent: dict) -> list:
    """Every backend that ran, timed in interleaved rounds (on every rank alike)."""
    ok = agree_ok([r.backend for r in results if r.ok])
    if not ok:
        return results
    progress("timing (interleaved rounds)")
    t0 = time.perf_counter()
    samples = timed_rounds(t, ok, iters=iters, rounds=rounds, settle=_settle(t, iters, rounds) is not None)
    spent["timing rounds"] = time.perf_counter() - t0
    best = t.mode == "generate"  # a whole generate is host-bound: other load on the machine only slows it
    return [with_timing(r, samples[r.backend], best=best) if r.backend in samples else r for r in results]


def _prepared(t: Target, names: list[str], progress, spent: dict, **kw) -> list:
    """Every backend's cold step, host times and profiled pass (``prepare_backend``), in turn."""
    # one step before any backend, so that the first backend is not charged for process-wide warm-up
    # (CUDA context, cuBLAS handles, allocator growth). It runs the naive backend, which uses no SDPA
    # kernel: each SDPA backend's own first call (cuDNN's plan building) stays cold.
    with torch.no_grad(), t.switched("naive"):
        t.fn(next(t.calls(1)))
    results = []

    def prepare(name):
        progress(name)
        t0 = time.perf_counter()
        result = prepare_backend(t, name, **kw)
        package = package_of(name)  # a third-party kernel: its distribution and version
        results.append(dataclasses.replace(result, package=package) if package else result)
        spent[name] = time.perf_counter() - t0

    for name in names:
        prepare(name)
    pair = policy_candidate(results) if t.mode == "generate" else None
    if pair is not None and pair not in names:  # the best prefill and the best decode backend, together
        prepare(pair)
    return results


def _settle(t: Target, iters: int, rounds: int) -> float | None:
    """How far behind after two rounds a backend is timed no further (``SETTLED``); None where nothing is
    settled: a host-bound generate (its noise is the machine's), or no rounds after the second."""
    return SETTLED if t.mode != "generate" and min(rounds, iters) > 2 else None


def profile(target: nn.Module | Callable[[], Any], batch: dict | Any = None, *,
            backends: Iterable[str] | str | None = None, warmup: int = 1, iters: int = 5,
            trace_dir: str | Path | None = None, progress: Callable[[str], None] | None = None,
            model_name: str = "", rounds: int = 5, profile_steps: int = 1, host_iters: int | None = None) -> Report:
    """Profile forwards of ``target`` under each backend; returns a ``Report``.

    ``target`` is a model (with ``batch``, a dict of forward arguments or a ``Workload``) or any
    callable (``profile(lambda: attnswitch.attention(q, k, v, is_causal=True))``), which runs under a
    global ``backend()``. Every backend sees the same inputs and the same warm-up (its first, cold step, which
    the report keeps, then ``warmup`` more); the steady time per
    forward comes from ``iters`` unprofiled forwards per backend in ``rounds`` interleaved rounds; host time
    per step and per attention call, and peak memory, from ``host_iters`` more (default: ``iters``, at most
    5, for a generate workload ``iters``: its step latencies come from them); the per-layer counts from
    ``profile_steps`` profiled ones (the counts are the same in every step). Backends that cannot run are in
    the report with PyTorch's reasons. The report's ``settings["time_s"]`` says where attnswitch's own time went.

    A model spread over GPUs by accelerate's ``device_map`` is profiled on all of them (per-GPU totals,
    copies between GPUs by layer boundary). Under ``torchrun`` with a tensor-parallel model, call it on
    every rank: each profiles its GPU and every rank gets the merged report (rank column, collectives
    per layer); with ``trace_dir`` only rank 0 writes, the other ranks' traces included.
    """
    if warmup < 0 or iters < 1 or profile_steps < 0 or (host_iters is not None and host_iters < 1):
        raise ValueError(f"need warmup >= 0, iters >= 1, host_iters >= 1 and profile_steps >= 0, got warmup={warmup}, "
                         f"iters={iters}, host_iters={host_iters}, profile_steps={profile_steps}")
    t_start = time.perf_counter()
    spent: dict = {}
    t = Target.of(target, batch)
    if t.model is not None:
        require_interface(t.model)
    names = parse_backends(backends, t.device)
    host_iters = host_iters or (iters if t.mode == "generate" else min(iters, 5))
    progress = progress or (lambda step: None)
    t0 = time.perf_counter()
    with frozen_heap():
        spent["collecting garbage"] = time.perf_counter() - t0  # once, before everything alive is frozen
        results = _prepared(t, names, progress, spent, warmup=warmup, iters=host_iters, trace_dir=trace_dir,
                            profile_steps=profile_steps)
        results = _timed(t, results, iters, rounds, progress, spent)
    if world() is not None:  # tensor parallelism: every rank's results, merged, on every rank
        results = merged_report_backends(results, trace_dir)
    spent["total"] = time.perf_counter() - t_start
    settings = dict(warmup=warmup, iters=iters, rounds=rounds, host_iters=host_iters, profile_steps=profile_steps,
                    settle=_settle(t, iters, rounds), time_s={k: round(v, 3) for k, v in spent.items()})
    if backends is None or backends == "all":  # what "all" leaves out here, and why: a report says so
        settings["not_offered"] = not_offered(t.device)
    return Report(tuple(results), environment(t.device), _workload_info(t), settings,
                  model=_name(model_name, t, target), distribution=distribution_of(t.model))


def _name(model_name: str, t: Target, target) -> str:
    return model_name or (type(t.model).__name__ if t.model is not None else getattr(target, "__name__", "callable"))
