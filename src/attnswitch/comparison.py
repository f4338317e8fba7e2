"""``compare``: every backend on the same workload, numerics checked, ranked, one recommended.

The ranking is by the steady time of one step of the workload that is deployed: a forward (prefill or
decode), a whole generate workload (several prompt lengths, every new token), or a training step. A
sweep compares at several shapes and recommends per range of lengths.
"""

from __future__ import annotations

import contextlib
import dataclasses
import numbers
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch.nn as nn

from . import finite, options
from .backends import names as backend_names
from .decision import decide, decide_sweep, recommend, sweep_choice
from .device import device_of
from .kinds import KINDS, kind_of
from .lengths import Lengths
from .numerics import REFERENCES, grad_numerics, numerics, token_agreement
from .profiling import profile
from .profiling.capture import measured_alone, within_measurement
from .profiling.compiled import compiled_forward
from .ranking import BUSY_PREFIX, busy_over, rank, ranked, verdict
from .request import DEFAULT, Request
from .results import BackendResult, Numerics, Report, SweepPoint
from .serving import serving_estimate
from .switch import switched
from .words import counted
from .workload import Workload, make_workload, position_limit

__all__ = ["compare", "compare_sweep", "sweep_choice", "check_mix", "rank", "verdict", "recommend"]


def _with_numerics(results: list[BackendResult], workload: Workload, reference: str) -> list[BackendResult]:
    """Every candidate's numerics; a compiled candidate's from its compiled forwards (``split`` gives its
    backend and mode), each mode's candidates checked together."""
    out = list(results)
    decode_only = kind_of(workload).generates
    for mode in dict.fromkeys(b.compile for b in results):
        at = [i for i, b in enumerate(results) if b.compile == mode]
        around = None if mode is None else (
            lambda name, mode=mode: compiled_forward(workload.model, name, mode, decode_only=decode_only))
        for i, b in zip(at, _checked([results[i] for i in at], workload, reference, around)):
            out[i] = b
    return out


def _watched(around, watches: dict):
    """``around`` (a compiled candidate's forward, or nothing) with every attention call of the candidate's own
    runs watched for NaN and Inf (``finite``), the watches kept per candidate in ``watches``."""
    def enter(name):
        stack = contextlib.ExitStack()
        if around is not None:
            stack.enter_context(around(name))
        watches.setdefault(name, []).append(stack.enter_context(finite.watching("the numerics pass")))
        return stack
    return enter


def _checked(results: list[BackendResult], workload: Workload, reference: str, around) -> list[BackendResult]:
    names = {b.backend: str(b.candidate.uncompiled) for b in results}
    ok = [names[b.backend] for b in results if b.ok]
    watches: dict = {}
    around = _watched(around, watches)
    nums = numerics(workload.model, workload, ok, reference, around=around)
    results = [dataclasses.replace(b, numerics=nums[names[b.backend]])
               if isinstance(nums.get(names[b.backend]), Numerics) else b for b in results]
    kind = kind_of(workload)
    if kind.generates:
        agree = token_agreement(workload, ok, reference, around=around)
        results = [dataclasses.replace(b, generate=dataclasses.replace(
            b.generate, token_agreement=agree[names[b.backend]][0], first_diff_step=agree[names[b.backend]][1]))
            if b.generate is not None and isinstance(agree.get(names[b.backend]), tuple) else b for b in results]
    grads = grad_numerics(workload, ok, reference, around=around) if kind.grads else {}
    found = {n: finite.first([m for w in ws for m in w.marks], "the numerics pass") for n, ws in watches.items()}
    results = [finite.failed(b, found.get(names[b.backend])) for b in results]  # where, before the gradients say
    if kind.grads:
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


@measured_alone
def compare(model: nn.Module | Callable[[], Any], batch: Workload | dict[str, Any] | None = None, *,
            backends: Iterable[str] | str | None = None,
            warmup: int | None = None, iters: int | None = None, trace_dir=None,
            progress: Callable[[str], None] | None = None,
            model_name: str = "", check_numerics: bool = True, command: str | None = None,
            rounds: int | None = None, profile_steps: int = 1, host_iters: int | None = None,
            time_budget_s: float | None = None, compile: str | Iterable[str | None] | None = None,
            deployed: Iterable[int] = (), time_before: Mapping[str, float] | None = None) -> Report:
    """Profile every backend on the same workload (``profile``: its ``iters``, ``rounds`` and
    ``time_budget_s`` say how long each is timed), check numerics, rank by steady time per step with
    each backend's margin against the pick (``ranking.verdict``), and recommend one, or the tie.
    ``batch`` is a ``Workload`` (see ``workload.make_workload``: prefill, decode, generate or train) or
    a dict of forward arguments; none for a callable (as ``profile`` takes it: its numerics are not checked).
    ``compile``: ``torch.compile`` modes, as in ``profile`` (``"default,none"``: every backend compiled and
    uncompiled, side by side, and the recommendation says whether compiling changes the pick). ``deployed``:
    lengths a deployment meets besides the measured one, at which the known defects are checked too
    (``defects``: a backend they make wrong there is never recommended). ``command``: the command line the
    report reproduces; ``time_before``: seconds spent on it before this call (imports, loading the model), in
    the report's account of its own time."""
    if isinstance(model, nn.Module):
        _not_switched(model)
    if isinstance(batch, dict) and isinstance(model, nn.Module):
        batch = Workload.of(model, batch)
    with within_measurement():  # (this call holds the one-measurement lock: profile is let in under it, once)
        report = profile(model, batch, backends=backends, warmup=warmup, iters=iters, trace_dir=trace_dir,
                         progress=progress, model_name=model_name, rounds=rounds, profile_steps=profile_steps,
                         host_iters=host_iters, time_budget_s=time_budget_s, compile=compile, deployed=deployed,
                         time_before=time_before)
    results = list(report.backends)
    settings = dict(report.settings)
    if check_numerics and batch is not None:  # (a callable has no model to copy and run with eager attention)
        reference = "fp32-attention" if report.distribution else "fp32-copy"
        if progress:
            progress("numerics")
        t0 = time.perf_counter()
        results = _with_numerics(results, batch, reference)
        spent = dict(settings.get("time_s", {}))
        spent["numerics"] = round(time.perf_counter() - t0, 3)
        spent["total"] = round(spent.get("total", 0) + spent["numerics"], 3)
        settings.update(numerics_reference=REFERENCES[reference], time_s=spent)
    decision, v = decide(results, verdict(results, settings.get("host")), report.workload, report.environment)
    return dataclasses.replace(report, backends=tuple(ranked(results, v)), ranking=v.order, decision=decision,
                               command=command, settings=settings)


def _compact(b: BackendResult) -> BackendResult:
    return dataclasses.replace(b, layers=(), devices=(), transfers=(), attn_kernel_details=())


def _swept(model: nn.Module, shapes, mode: str, new_tokens, **asked) -> tuple[list[tuple[int, int, int | None]],
                                                                              Request]:
    """A sweep's request, checked (``request.Request.check``) and with the defaults of the model's device
    (``new_tokens``, ``requests``), and its shapes ``(batch, length, new tokens)``, each once, in the order
    given."""
    shapes = tuple((b, s) for b, s in shapes)
    news = (new_tokens,) if isinstance(new_tokens, numbers.Integral) else tuple(new_tokens or ())
    req = Request(sweep=True, mode=mode, shapes=shapes, new_tokens=news, **asked).check(backend_names())
    req = req.resolved(device_of(model).type)
    out = list(dict.fromkeys((int(b), int(s), n) for b, s in shapes
                             for n in (req.new_tokens if KINDS[mode].generates else (None,))))
    if not out:
        raise options.OptionError("a sweep needs at least one shape")
    return out, req


def _not_switched(model: nn.Module) -> None:
    """A model a switch holds (a patch, or a ``backend()`` block around the call, of it, of a model it is part
    of, or of a part of it) is bad input: every candidate is switched by the comparison itself, and an answer
    of keeping the model's own attention would say "nothing to change" of a model that runs another backend."""
    now = switched(model)
    if now is None:
        return
    sel, how, whose = now
    if how == "patch":
        raise options.OptionError("{whose} is patched with {sel} (attnswitch.patch): a comparison switches each "
                                  "candidate itself, and its answer is about the model as it runs unswitched; "
                                  "unpatch it first (attnswitch.unpatch)", whose=whose[0].upper() + whose[1:],
                                  sel=f"`{sel}`")
    raise options.OptionError("a comparison inside attnswitch.backend({sel}), which switches {whose}: each "
                              "candidate is switched by the comparison itself, and its answer is about the model "
                              "as it runs outside the block; call it outside", sel=repr(str(sel)), whose=whose)


@measured_alone
def compare_sweep(model: nn.Module, shapes: Iterable[tuple[int, int]], *, mode: str = "prefill",
                  padding: bool = False, new_tokens: int | Iterable[int] | None = None, cache: str = "dynamic",
                  lengths: Lengths | None = None, requests: int = DEFAULT,
                  progress: Callable[[str], None] | None = None, **kw) -> Report:
    """``compare`` at every ``(batch, seq)`` shape of ``mode`` (prefill, train, or generate with ``seq`` the
    prompt length and each of ``new_tokens``): one report whose ``sweep`` holds each shape's results, whose
    backends are the last shape's, and whose recommendation names the best backend per range of lengths
    (per batch size, and per number of new tokens) and where they cross over, by each shape's own ranking.
    A generate sweep over the prompt lengths of a deployment (``lengths``, see ``lengths.read_lengths``)
    also says which backend a run of ``requests`` requests (``request.REQUESTS`` unless given) is cheapest with
    and when that changes (``serving.serving_estimate``; ``report.serving``). A generate sweep without
    ``new_tokens`` takes the device's default (``request.DEFAULTS``). Traces go to one folder per shape under
    ``trace_dir``."""
    _not_switched(model)
    kw.update({k: list(v) for k, v in kw.items() if isinstance(v, Iterator)})  # (every shape reads them)
    shapes3, req = _swept(model, shapes, mode, new_tokens, padding=padding, cache=cache, lengths=lengths,
                          requests=requests, backends=kw.get("backends"))
    named = set(options.check_deployed(kw.pop("deployed", ())))  # lengths deployed besides the sweep's own
    requests = req.requests
    if lengths is not None:
        check_mix(model, mode, lengths, requests, max(n or 0 for *_, n in shapes3))
    # every shape's inputs made (and so checked) before any is measured
    works = [make_workload(model, batch=b, seq=s, mode=mode, padding=padding,
                           **({"new_tokens": n, "cache": cache} if KINDS[mode].generates else {}))
             for b, s, n in shapes3]
    trace_dir, before = kw.pop("trace_dir", None), kw.pop("time_before", None) or {}
    # every length the deployment meets: each shape's, and every length of the mix (not only those measured)
    deployed = sorted({s for _, s, _ in shapes3} | set(lengths.lengths if lengths is not None else ()) | named)
    points, last, spent, said, verdicts, hosts = [], None, {k: round(v, 3) for k, v in before.items()}, [], [], []
    for (batch, seq, new), work in zip(shapes3, works):
        if progress:
            progress(f"batch {batch}, {'prompt' if new else 'seq'} {seq}"
                     + (f", {counted(new, 'new token')}" if new else ""))
        point = SweepPoint(batch, seq, (), new_tokens=new)
        with within_measurement():  # (the lock is this sweep's)
            last = compare(model, work, progress=progress, deployed=deployed,
                           trace_dir=None if trace_dir is None else Path(trace_dir) / point.folder, **kw)
        points.append(dataclasses.replace(point, backends=tuple(_compact(b) for b in last.backends),
                                          ranking=last.ranking, ties=last.ties))
        verdicts.append(verdict(last.backends, last.settings.get("host")))
        said += last.cautions
        hosts.append((last.settings.get("host"), last.backends))
        for k, v in last.settings.get("time_s", {}).items():  # the time account of every shape, summed
            spent[k] = round(spent.get(k, 0) + v, 3)
    if "total" in spent:  # each shape's total is its own: the time spent before the sweep counts once more
        spent["total"] = round(spent["total"] + sum(before.values()), 3)
    description = f"sweep of {counted(len(points), 'shape')}, {mode}" + (", padded" if padding else "")
    workload = {**last.workload, "description": description, "shapes": [[b, s] for b, s, _ in shapes3]}
    if KINDS[mode].generates:
        workload.update(new_tokens=sorted({n for _, _, n in shapes3}), prompt_lens=sorted({s for _, s, _ in shapes3}))
    serving, lines = _serving(points, lengths, requests, cache)
    if lengths is not None:
        workload["lengths_from"] = lengths.source or "given"
    # every shape's, once; a busy machine said once, with every kind of sign any shape showed
    cautions = tuple(dict.fromkeys(c for c in said if not c.startswith(BUSY_PREFIX))) + busy_over(hosts)
    decision, v, points = decide_sweep(points, verdicts, list(last.backends), workload, last.environment, serving,
                                       lines, cautions)
    return dataclasses.replace(last, backends=tuple(ranked(list(last.backends), v)), ranking=v.order,
                               decision=decision, sweep=points, workload=workload, serving=serving,
                               settings={**last.settings, "time_s": spent})


def check_mix(model: nn.Module, mode: str, lengths: Lengths | None, requests, new_tokens: int) -> None:
    """A sweep's length mix and run of requests, checked before anything is measured: the request's rules
    (``request.Request.check``: a mix for a generate sweep only, a run of requests for a mix only), and every
    length of the mix (not only those measured) within the model's positions."""
    Request(sweep=True, mode=mode, lengths=lengths, requests=requests).check()
    if lengths is None:
        return
    try:
        options.check_positions(position_limit(model), "generate", 0, new_tokens, lengths.lengths)
    except options.OptionError as e:
        raise options.OptionError(e.template + " (the longest prompt length of {where})", **e.values,
                                  where=lengths.source or "the lengths given") from None


def _serving(points: list[SweepPoint], lengths: Lengths | None, requests: int,
             cache: str = "dynamic") -> tuple[dict | None, list[str]]:
    """The cost of a run of requests over ``lengths``, for the first batch size and number of new tokens."""
    if lengths is None or not points or points[0].new_tokens is None:
        return None, []
    first = [p for p in points if (p.batch, p.new_tokens) == (points[0].batch, points[0].new_tokens)]
    est = serving_estimate(first, lengths, requests, points[0].new_tokens, cache)
    if est is None:
        return None, ["No backend ran at every measured length: no estimate for the length mix."]
    return dataclasses.asdict(est), est.text()
