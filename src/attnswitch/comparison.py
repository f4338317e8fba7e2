"""``compare``: every backend on the same workload, numerics checked, ranked, one recommended.

The ranking is by the steady time of one step of the workload that is deployed: a forward (prefill or
decode), a whole generate workload (several prompt lengths, every new token), or a training step. A
sweep compares at several shapes and recommends per range of lengths.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch.nn as nn

from .compiling import split
from .numerics import REFERENCES, grad_numerics, numerics, token_agreement
from .profiling import profile
from .profiling.compiled import compiled_forward, expected_family
from .recommend import recommend, recommend_sweep
from .results import BackendResult, Numerics, Report, SweepPoint
from .workload import Workload, make_workload

__all__ = ["compare", "compare_sweep", "rank", "recommend"]


def rank(results: Iterable[BackendResult]) -> list[str]:
    """Backends that ran with acceptable numerics (outputs, and gradients in a training step), fastest
    first by steady time per step; a compiled candidate whose graph ran another kernel than the one it
    forces is not ranked (``auto``'s is only flagged: what it runs is SDPA's choice of its compile)."""
    def good(b):
        return (b.ok and b.time_ms is not None and (b.numerics is None or b.numerics.ok)
                and (b.train is None or b.train.grad_ok is not False)
                and not (b.attn_mismatch and expected_family(split(b.backend)[0]) is not None))
    return [b.backend for b in sorted(filter(good, results), key=lambda b: b.time_ms)]


def _with_numerics(results: list[BackendResult], workload: Workload, reference: str) -> list[BackendResult]:
    """Every candidate's numerics; a compiled candidate's from its compiled forwards (``split`` gives its
    backend and mode), each mode's candidates checked together."""
    out = list(results)
    decode_only = workload.mode == "generate"
    for mode in dict.fromkeys(b.compile for b in results):
        at = [i for i, b in enumerate(results) if b.compile == mode]
        around = None if mode is None else (
            lambda name, mode=mode: compiled_forward(workload.model, name, mode, decode_only=decode_only))
        for i, b in zip(at, _checked([results[i] for i in at], workload, reference, around)):
            out[i] = b
    return out


def _checked(results: list[BackendResult], workload: Workload, reference: str, around) -> list[BackendResult]:
    names = {b.backend: split(b.backend)[0] for b in results}
    ok = [names[b.backend] for b in results if b.ok]
    nums = numerics(workload.model, workload, ok, reference, around=around)
    results = [dataclasses.replace(b, numerics=nums[names[b.backend]])
               if isinstance(nums.get(names[b.backend]), Numerics) else b for b in results]
    if workload.mode == "generate":
        agree = token_agreement(workload, ok, reference, around=around)
        results = [dataclasses.replace(b, generate=dataclasses.replace(
            b.generate, token_agreement=agree[names[b.backend]][0], first_diff_step=agree[names[b.backend]][1]))
            if b.generate is not None and isinstance(agree.get(names[b.backend]), tuple) else b for b in results]
    if workload.mode == "train":
        grads = grad_numerics(workload, ok, reference, around=around)
        results = [_with_grads(b, grads.get(names[b.backend])) if b.ok else b for b in results]
    return results


def _with_grads(b: BackendResult, g) -> BackendResult:
    if g is None or b.train is None:
        return b
    if isinstance(g, str):  # the backward could not run: PyTorch's reason
        return dataclasses.replace(b, status="failed", reasons=(f"backward: {g}",))
    b = dataclasses.replace(b, train=dataclasses.replace(b.train, grad_max_rel_err=g.max_rel_err,
                                                         grad_tolerance=g.tolerance, grad_ok=g.ok, worst_grad=g.worst))
    return dataclasses.replace(b, status="failed", reasons=(g.reason,)) if g.reason else b


def compare(model: nn.Module, batch: Workload | dict[str, Any], *, backends: Iterable[str] | str | None = None,
            warmup: int = 1, iters: int = 10, trace_dir=None, progress: Callable[[str], None] | None = None,
            model_name: str = "", check_numerics: bool = True, command: str | None = None,
            rounds: int = 5, profile_steps: int = 1, host_iters: int | None = None,
            compile: str | Iterable[str | None] | None = None) -> Report:
    """Profile every backend on the same workload, check numerics, rank by steady time per step, and
    recommend one. ``batch`` is a ``Workload`` (see ``workload.make_workload``: prefill, decode,
    generate or train) or a dict of forward arguments. ``compile``: ``torch.compile`` modes, as in
    ``profile`` (``"default,none"``: every backend compiled and uncompiled, side by side, and the
    recommendation says whether compiling changes the pick)."""
    if isinstance(batch, dict):
        batch = Workload.of(model, batch)
    report = profile(model, batch, backends=backends, warmup=warmup, iters=iters, trace_dir=trace_dir,
                     progress=progress, model_name=model_name, rounds=rounds, profile_steps=profile_steps,
                     host_iters=host_iters, compile=compile)
    results = list(report.backends)
    settings = dict(report.settings)
    if check_numerics:
        reference = "fp32-attention" if report.distribution else "fp32-copy"
        if progress:
            progress("numerics")
        t0 = time.perf_counter()
        results = _with_numerics(results, batch, reference)
        spent = dict(settings.get("time_s", {}))
        spent["numerics"] = round(time.perf_counter() - t0, 3)
        spent["total"] = round(spent.get("total", 0) + spent["numerics"], 3)
        settings.update(numerics_reference=REFERENCES[reference], time_s=spent)
    ranking = rank(results)
    return dataclasses.replace(report, backends=tuple(results), ranking=tuple(ranking),
                               recommendation=recommend(results, ranking, report.workload), command=command,
                               settings=settings)


def _compact(b: BackendResult) -> BackendResult:
    return dataclasses.replace(b, layers=(), devices=(), transfers=(), attn_kernel_details=())


def compare_sweep(model: nn.Module, shapes: Iterable[tuple[int, int]], *, mode: str = "prefill",
                  padding: bool = False, progress: Callable[[str], None] | None = None, **kw) -> Report:
    """``compare`` at every ``(batch, seq)`` shape of ``mode`` (prefill or train): one report whose
    ``sweep`` holds each shape's results, whose backends are the last shape's, and whose recommendation
    names the best backend per range of lengths (per batch size) and where they cross over. Traces go to
    one folder per shape under ``trace_dir``."""
    if mode not in ("prefill", "train"):
        raise ValueError(f"a sweep runs prefill or train steps, not {mode!r}")
    shapes = list(dict.fromkeys((int(b), int(s)) for b, s in shapes))  # each shape once, in the order given
    if not shapes:
        raise ValueError("a sweep needs at least one shape")
    # every shape's inputs made (and so checked) before any is measured
    works = [make_workload(model, batch=batch, seq=seq, mode=mode, padding=padding) for batch, seq in shapes]
    trace_dir = kw.pop("trace_dir", None)
    points, last, spent = [], None, {}
    for (batch, seq), work in zip(shapes, works):
        if progress:
            progress(f"batch {batch}, seq {seq}")
        point = SweepPoint(batch, seq, ())
        last = compare(model, work, progress=progress,
                       trace_dir=None if trace_dir is None else Path(trace_dir) / point.folder, **kw)
        points.append(dataclasses.replace(point, backends=tuple(_compact(b) for b in last.backends),
                                          ranking=last.ranking))
        for k, v in last.settings.get("time_s", {}).items():  # the time account of every shape, summed
            spent[k] = round(spent.get(k, 0) + v, 3)
    description = f"sweep of {len(points)} shapes, {mode}" + (", padded" if padding else "")
    workload = {**last.workload, "description": description, "shapes": [[b, s] for b, s in shapes]}
    return dataclasses.replace(last, sweep=tuple(points), workload=workload,
                               settings={**last.settings, "time_s": spent}, recommendation=recommend_sweep(points))
