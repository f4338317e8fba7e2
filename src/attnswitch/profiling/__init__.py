"""Profiling end-to-end forwards per backend, attributed to model layers.

``capture`` runs and times; ``trace`` parses Kineto traces (the only place that does); ``attribution``,
``occupancy`` and ``summarize`` are functions over parsed traces; ``distributed`` merges the ranks of a
tensor-parallel job.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from .. import candidate, finite
from ..backends import kernel_families, not_offered, package_of, parse_backends
from ..backends import names as registered
from ..defects import check as check_defects
from ..dist import world
from ..env import environment
from ..errors import out_of_memory
from ..hf import require_interface
from ..hf.layerkinds import bind as check_kinds
from ..hf.layerkinds import kind_map
from ..modelshape import dtype_of, model_shape
from ..options import OptionError
from ..peak import figures
from ..request import Request, Steps
from ..results import Report
from ..switch import backend as use_backend
from . import perkind
from .capture import Target, frozen_heap, measured_alone, prepare_backend, release_memory, timed_rounds
from .ceiling import measure as measure_ceiling
from .clock import query_length
from .compiled import merged_modes, paid_back
from .distributed import agree_ok, distribution_of, merged_report_backends
from .host import probe
from .rounds import MIN_PAIRS, round_drift, shared_rounds
from .stepstats import policy_candidate
from .summarize import with_timing
from .trace import Trace

__all__ = ["profile", "Trace"]


def _workload_info(t: Target) -> dict:
    if t.workload is None:
        return {"description": "callable", "mode": "callable"}
    # the model's own attention as found: what keeping it means (transformers' sdpa, eager, ...)
    own = getattr(getattr(t.model, "config", None), "_attn_implementation", None)
    shape = model_shape(t.model)  # what policy.json's pick is applied against
    return {**t.workload.describe(), "dtype": dtype_of(t.model),
            **({"attn_implementation": own} if isinstance(own, str) else {}),
            **({"model_shape": shape} if shape else {})}


def _timed(t: Target, results: list, iters: int, rounds: int, budget_s, progress, spent: dict, host: dict) -> list:
    """Every backend that ran, timed in interleaved rounds (on every rank alike), with the machine's load
    probed before and after (``host``)."""
    ok = agree_ok([r.backend for r in results if r.ok])
    if not ok:
        return results
    progress("timing (interleaved rounds)")
    before = probe()
    t0 = time.perf_counter()
    done = timed_rounds(t, ok, iters=iters, rounds=rounds, budget_s=budget_s, progress=progress)
    spent["timing rounds"] = time.perf_counter() - t0
    after = probe()
    # every backend's time from the rounds all of them took (the more rounds, for those still tied with the
    # fastest, sharpen the paired ratios): a change of the machine's speed between rounds moves all alike
    shared = shared_rounds(done.timings)
    drift = round_drift(done.timings, shared)
    host.update(cpus=before["cpus"], load_before=before["load"], load_after=after["load"],
                probe_before_ms=before["probe_ms"], probe_after_ms=after["probe_ms"], rounds=done.rounds,
                stopped=done.stopped, shared_rounds=len(shared),
                **({"round_drift": round(drift, 3)} if drift is not None else {}))
    return [finite.failed(with_timing(r, done.timings[r.backend], shared), done.timings[r.backend].nonfinite)
            if r.backend in done.timings else r for r in results]


def _ceiling(t: Target, results: list, spent: dict) -> dict | None:
    """The GPU's practical ceiling (``ceiling.measure``) in the dtype most attention calls ran in, once the
    GPU is warm; None on a CPU, or where no attention call was recorded."""
    if t.device.type != "cuda":
        return None
    calls: dict[str, float] = {}
    for r in results:
        for s in r.attn_shapes:
            calls[s.dtype] = calls.get(s.dtype, 0) + s.calls
    if not calls:
        return None
    t0 = time.perf_counter()
    found = measure_ceiling(t.device, getattr(torch, max(calls, key=calls.get)))
    spent["the GPU's ceiling"] = time.perf_counter() - t0
    return found


def _judged(results: list, env: dict, workload: dict, ceiling: dict | None, deployed) -> list:
    """Each result with its attention calls against the GPU's peak (``peak.figures``) and the known defects
    that bear on it (``defects.check``: its own calls, or, compiled, those another candidate recorded of the
    same model, at every ``deployed`` length too)."""
    recorded = next((r.attn_shapes for r in results if r.attn_shapes), ())
    out = []
    for r in results:
        fig = figures(r.layers, r.attn_shapes, env.get("gpu"), ceiling) if r.ok else ()
        found = check_defects(r, env, workload, tuple(deployed or ()), shapes=r.attn_shapes or recorded)
        out.append(dataclasses.replace(r, attn_peak=fig, defects=found) if fig or found else r)
    return out


def _prepared(t: Target, names: list[str], progress, spent: dict, **kw) -> list:
    """Every backend's cold step, host times and profiled pass (``prepare_backend``), in turn."""
    # one step before any backend, so that the first backend is not charged for process-wide warm-up
    # (CUDA context, cuBLAS handles, allocator growth). It runs the naive backend, which uses no SDPA
    # kernel: each SDPA backend's own first call (cuDNN's plan building) stays cold; uncompiled, so that
    # no candidate's compile is paid here.
    try:
        with torch.no_grad(), use_backend("naive", model=t.model):
            if t.kind.generates:
                t.workload.short(2).step()
            else:
                t.fn(next(t.calls(1)))
    except (RuntimeError, MemoryError) as e:  # naive's scores (s x s) need not fit where a fused kernel's do
        if not (isinstance(e, MemoryError) or out_of_memory(e)):
            raise
        release_memory(t.device)  # the first backend pays the process-wide warm-up; each backend's own OOM is its row
    results = []

    def prepare(name):
        progress(name)
        t0 = time.perf_counter()
        result = prepare_backend(t, name, **kw)
        package = package_of(name)  # a third-party kernel: its distribution and version
        results.append(dataclasses.replace(result, package=package) if package else result)
        spent[str(candidate.parse(name).compiled(t.compile))] = time.perf_counter() - t0

    # the backends that run another candidate's kernel (auto, a policy per phase) last: a plan cache is the
    # kernel's, so whichever of them runs first pays its cold costs, and a forced backend's own are the ones
    # a deployment of it meets
    for name in sorted(names, key=lambda n: candidate.parse(n).borrows):
        prepare(name)
    pair = policy_candidate(results) if t.kind.generates else None
    if pair is not None and pair not in names:  # the best prefill and the best decode backend, together
        prepare(pair)
    results = _per_kind(t, results, names, prepare)
    results = [_warmed(r, results[:i]) for i, r in enumerate(results)]
    given = {n: i for i, n in enumerate(names)}  # reported in the order asked for
    return sorted(results, key=lambda r: given.get(r.backend, len(names)))


def _per_kind(t: Target, results: list, names: list[str], prepare) -> list:
    """A model of several layer kinds: each result's attention time per kind; each backend refused at one kind
    tried on the others; then the candidate of each kind's fastest backend, where that is none asked for."""
    kind_of_path = kind_map(t.model) if t.model is not None else {}
    kinds = list(dict.fromkeys(kind_of_path.values()))
    if len(kinds) < 2:
        return results
    gpu = t.device.type == "cuda"
    for tried in perkind.probes(results, kind_of_path):
        if tried not in names:
            prepare(tried)
    results[:] = [perkind.with_kinds(r, kind_of_path, gpu) for r in results]
    best = perkind.composed(results, kinds)
    if best is not None and best not in {r.backend for r in results}:
        prepare(best)
        results[-1] = perkind.with_kinds(results[-1], kind_of_path, gpu)
    return results


def _checked_names(t: Target, backends) -> list[str]:
    """The candidates asked for, checked before any work: the model on transformers' attention interface, and
    a backend per layer kind naming the model's kinds (bad input where it does not)."""
    if t.model is not None:
        require_interface(t.model)
    names = parse_backends(backends, t.device)
    for name in names:
        c = candidate.parse(name)
        if c.kinds is not None:
            if t.model is None:
                raise OptionError("{backends} {given}: a backend per layer kind is for a model's layers, not a "
                                  "callable", given=name)
            check_kinds(t.model, c.kinds)
    return names


def _warmed(r, before: list):
    """``r``, with a note where a candidate measured before it ran its kernel: its cold step and new-length
    figures met that kernel's caches warm (a deployment of it alone pays what that one paid)."""
    if not r.ok or not r.candidate.borrows:
        return r
    ran = kernel_families(r.backend, r.attn_ops + r.attn_kernel_names)
    by = [b.backend for b in before if b.ok and b.candidate.backend in ran]
    if not by:
        return r
    names = ", ".join(f"`{n}`" for n in by)
    note = (f"its kernels' caches (plans, compiles) were warm: {names}, measured before it, runs them too. Alone, "
            f"it meets them cold, as {names}'s cold step and new-length figures show.")
    return dataclasses.replace(r, notes=(*r.notes, note))


def _counts(t: Target, steps: Steps) -> Steps:
    """The steps with the defaults for the workload's mode where not given (``request.Steps.resolved``). A
    generate's cold workload meets every length it times (its warm-up), and its rounds are its prompts: every
    backend takes every prompt ``iters`` times, in at least ``rounds`` and ``MIN_PAIRS`` rounds, before the
    rounds adapt (``rounds`` is returned as that least number)."""
    generate = t.kind.generates
    s = steps.resolved(generate)
    return dataclasses.replace(s, rounds=max(s.rounds, s.iters * t.prompts, MIN_PAIRS)) if generate else s


def _request(t: Target, placed: dict | None, backends, compile, steps: Steps, deployed) -> Request:
    """What ``profile`` is asked, checked as every request is (``request.Request.check``)."""
    mode = t.workload.mode if t.workload is not None else None
    device_map = placed["device_map"] if placed and placed["mode"] == "device_map" else None
    tp = bool(placed) and placed["mode"] == "tensor_parallel"
    request = Request(kind="profile", mode=mode, backends=backends, compile=compile, steps=steps,
                      device_map=device_map, tp=tp, deployed=deployed, step_queries=_queries(t)).check(registered())
    if t.model is None and any(m is not None for m in request.compile):  # (what would it compile?)
        raise OptionError("{compile} compiles a model's forward; a callable is profiled as it is (compile it "
                          "yourself, inside it)")
    return request


def _queries(t: Target) -> tuple[int, ...]:
    """The query lengths a prefill's or a training step's calls run at (the phase a backend per phase runs them in):
    its decoder's, and an encoder-decoder's encoder's too."""
    if t.workload is None or t.workload.mode not in ("prefill", "train"):
        return ()
    kw = t.workload.kwargs
    decoder = query_length((), kw)
    encoder = next((x.shape[1] for k in ("input_ids", "inputs_embeds") if isinstance(x := kw.get(k), torch.Tensor)
                    and x.dim() >= 2), None)
    return tuple(q for q in {decoder, encoder} if q)


def _prepared_modes(t: Target, modes, names: list[str], progress, spent: dict, **kw) -> dict:
    """Each compile mode's candidates prepared in turn (their compiles paid there): ``{mode: results}``;
    all of them are then timed together, in the same rounds."""
    runs = {}
    for mode in modes:
        t.compile = mode
        try:
            step = progress if mode is None else (lambda s, m=mode: progress(f"{s} [compile {m}]"))
            runs[mode] = _prepared(t, names, step, spent, **kw)
        finally:
            t.compile = None
    return runs


@measured_alone
def profile(target: nn.Module | Callable[[], Any], batch: dict | Any = None, *,
            backends: Iterable[str] | str | None = None, warmup: int | None = None, iters: int | None = None,
            trace_dir: str | Path | None = None, progress: Callable[[str], None] | None = None,
            model_name: str = "", rounds: int | None = None, profile_steps: int = 1, host_iters: int | None = None,
            time_budget_s: float | None = None, compile: str | Iterable[str | None] | None = None,
            deployed: Iterable[int] = (), time_before: Mapping[str, float] | None = None,
            command: str | None = None) -> Report:
    """Profile forwards of ``target`` under each backend; returns a ``Report``.

    ``target`` is a model (with ``batch``, a dict of forward arguments or a ``Workload``) or any
    callable (``profile(lambda: attnswitch.attention(q, k, v, is_causal=True))``), which runs under a
    global ``backend()``. Every backend sees the same inputs and the same warm-up (its first, cold step,
    which the report keeps, then ``warmup`` more: default 1; a generate's 0, its cold workload meets every
    length). The steady time per step comes from ``iters``
    unprofiled steps per backend in at least ``rounds`` interleaved rounds (default 12 in 6; a generate
    workload: a round is one prompt, every backend in turn, each prompt ``iters`` times, default once, and
    at least 6 rounds), then more rounds for the backends
    still tied with the fastest, for at most ``time_budget_s`` seconds (default: as long as the first rounds,
    30 s at most; 0: none). Host time per step and per attention call, and peak memory, come from ``host_iters``
    more steps (default: ``iters``, at most 5; a generate: 1); the per-layer counts from ``profile_steps``
    profiled ones (the counts are the same in every step). Backends that cannot run are in the report with
    PyTorch's reasons. The report's ``settings["time_s"]`` says where attnswitch's own time went, and
    ``settings["host"]`` how busy the machine was around the timing. Bad input raises ``options.OptionError``
    before any work (``request.Request.check``).

    A model spread over GPUs by accelerate's ``device_map`` is profiled on all of them (per-GPU totals,
    copies between GPUs by layer boundary). Under ``torchrun`` with a tensor-parallel model, call it on
    every rank: each profiles its GPU and every rank gets the merged report (rank column, collectives
    per layer); with ``trace_dir`` only rank 0 writes, the other ranks' traces included.

    ``compile``: ``torch.compile`` modes to run every backend under (``"default"``, ``"reduce-overhead"``,
    ``"max-autotune"``, ``"none"`` or None: uncompiled), one or several (``"default,none"``): each compiled
    candidate is named after its backend (``flash+compile``) and reports its compile time (a one-off cost),
    the graphs it compiled and recompiled, and the attention kernel its graph ran (``attn_seen``, with
    ``attn_mismatch`` where that is not the backend selected). Each backend's attention calls are set against the
    GPU's peak (``attn_peak``; ``settings["ceiling"]``) and the known defects (``defects``; also at every
    ``deployed`` length); NaN or Inf fails it (``nonfinite``, ``finite``). ``time_before``: seconds spent
    before this call (a command's imports, loading the model), counted in ``settings["time_s"]``; ``command``:
    the command line the report reproduces."""
    t_start, spent, host = time.perf_counter() - sum((time_before or {}).values()), dict(time_before or {}), {}
    t = Target.of(target, batch)
    placed, steps = distribution_of(t.model), Steps(warmup, iters, rounds, time_budget_s, host_iters, profile_steps)
    request = _request(t, placed, backends, compile, steps, deployed)
    modes, backends, deployed = request.compile, request.backends, request.deployed
    warmup, iters, rounds, time_budget_s, host_iters, profile_steps = dataclasses.astuple(_counts(t, steps))
    names, progress, t0 = _checked_names(t, backends), progress or (lambda step: None), time.perf_counter()
    with t.context(), frozen_heap():  # (the model's modes and the user's gradients as found after, on any exit)
        spent["collecting garbage"] = time.perf_counter() - t0  # once, before everything alive is frozen
        runs = _prepared_modes(t, modes, names, progress, spent, warmup=warmup, iters=host_iters, trace_dir=trace_dir,
                               profile_steps=profile_steps)
        merged = merged_modes(runs)
        ceiling = _ceiling(t, merged, spent)
        results = paid_back(_timed(t, merged, iters, rounds, time_budget_s, progress, spent, host))
    if world() is not None:  # tensor parallelism: every rank's results, merged, on every rank
        results = paid_back(merged_report_backends(results, trace_dir))  # (times anew: what compiling pays anew)
    spent["total"] = time.perf_counter() - t_start
    settings = dict(warmup=warmup, iters=iters, rounds=rounds, host_iters=host_iters, profile_steps=profile_steps,
                    time_budget_s=time_budget_s, host=host, time_s={k: round(v, 3) for k, v in spent.items()})
    return _report(t, results, settings, modes, backends, ceiling, deployed,
                   dict(model=_name(model_name, t, target), distribution=placed, command=command))


def _report(t: Target, results: list, settings: dict, modes, backends, ceiling: dict | None, deployed,
            about: dict) -> Report:
    """The report: each result judged (``_judged``); the compile modes, what "all" left out and the ceiling among
    the settings."""
    if modes != (None,):
        settings["compile"] = [m or "none" for m in modes]
    if candidate.means_all(backends):  # what "all" leaves out here, and why: a report says so
        settings["not_offered"] = not_offered(t.device)
    if ceiling is not None:
        settings["ceiling"] = ceiling
    env, work = environment(t.device), _workload_info(t)
    return Report(tuple(_judged(results, env, work, ceiling, deployed)), env, work, settings, **about)


def _name(model_name: str, t: Target, target) -> str:
    return model_name or (type(t.model).__name__ if t.model is not None else getattr(target, "__name__", "callable"))
