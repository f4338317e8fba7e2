"""Profiling end-to-end forwards per backend, attributed to model layers.

``capture`` runs and times; ``trace`` parses Kineto traces (the only place that does);
``attribution`` and ``occupancy`` are analyses over parsed traces.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Iterable

import torch.nn as nn

from ..backends import BACKENDS, GPU_ONLY, resolve_name
from ..env import environment
from ..report import Report
from .capture import Target, prepare_backend, timed_rounds, with_timing
from .distributed import agree_ok, distribution_of, merged_report_backends, world
from .trace import Trace

__all__ = ["profile", "Trace", "default_backends"]


def default_backends(device) -> list[str]:
    """Every backend that can exist on the device (the GPU-only ones are left out on a CPU)."""
    import torch

    cpu = torch.device(device).type != "cuda"
    return [b for b in BACKENDS if not (cpu and b in GPU_ONLY)]


def profile(target: nn.Module | Callable[[], Any], batch: dict | Any = None, *,
            backends: Iterable[str] | str | None = None, warmup: int = 3, iters: int = 5,
            trace_dir: str | Path | None = None, progress: Callable[[str], None] | None = None,
            model_name: str = "", rounds: int = 5) -> Report:
    """Profile forwards of ``target`` under each backend; returns a ``Report``.

    ``target`` is a model (with ``batch``, a dict of forward arguments or a ``Workload``) or any
    callable (``profile(lambda: attnswitch.attention(q, k, v, is_causal=True))``), which runs under a
    global ``backend()``. Every backend sees the same inputs and the same warm-up; the steady time per
    forward comes from ``iters`` unprofiled forwards per backend in ``rounds`` interleaved rounds.
    Backends that cannot run are in the report with PyTorch's reasons.

    A model spread over GPUs by accelerate's ``device_map`` is profiled on all of them (per-GPU totals,
    copies between GPUs by layer boundary). Under ``torchrun`` with a tensor-parallel model, call it on
    every rank: each profiles its GPU and every rank gets the merged report (rank column, collectives
    per layer); with ``trace_dir`` only rank 0 writes, the other ranks' traces included.
    """
    if warmup < 0 or iters < 1:
        raise ValueError(f"need warmup >= 0 and iters >= 1, got warmup={warmup}, iters={iters}")
    t = Target.of(target, batch)
    if t.model is not None:
        from ..hf import require_interface

        require_interface(t.model)
    names = _names(backends, t.device)
    # one forward before any backend, so that the first backend is not charged for process-wide
    # warm-up (CUDA context, cuBLAS handles, allocator growth). It runs the naive backend, which uses
    # no SDPA kernel: each SDPA backend's own first call (cuDNN's plan building) stays cold.
    import torch

    with torch.no_grad(), t.switched("naive"):
        t.fn(next(t.calls(1)))
    results = []
    for name in names:
        if progress:
            progress(name)
        results.append(prepare_backend(t, name, warmup=warmup, iters=iters, trace_dir=trace_dir))
    ok = agree_ok([r.backend for r in results if r.ok])
    if ok:
        if progress:
            progress("timing (interleaved rounds)")
        samples = timed_rounds(t, ok, iters=iters, rounds=rounds)
        results = [with_timing(r, samples[r.backend]) if r.backend in samples else r for r in results]
    if world() is not None:  # tensor parallelism: every rank's results, merged, on every rank
        results = merged_report_backends(results, trace_dir)
    workload = {"description": getattr(batch, "description", "") if batch is not None else "callable"}
    if t.model is not None:
        workload["dtype"] = str(next(t.model.parameters()).dtype).replace("torch.", "")
    return Report(tuple(results), environment(t.device), workload, {"warmup": warmup, "iters": iters,
                                                                     "rounds": rounds},
                  model=model_name or (type(t.model).__name__ if t.model is not None else getattr(
                      target, "__name__", "callable")), distribution=distribution_of(t.model))


def _names(backends, device) -> list[str]:
    if backends is None or backends == "all":
        return default_backends(device)
    if isinstance(backends, str):
        backends = [b for b in backends.split(",") if b.strip()]
    names = [resolve_name(b) for b in backends]
    if not names:
        raise ValueError("no backends given")
    return list(dict.fromkeys(names))
