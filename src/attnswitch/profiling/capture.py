"""Running forwards per backend: unprofiled timing, then one profiled pass with module ranges.

Per backend, on the same inputs and after the same warm-up (``prepare_backend``):
1. the cold forward (first at this shape for this backend): host time, and host time per attention call;
2. ``warmup`` forwards, then ``iters`` timed forwards (CUDA events on a GPU, wall clock on a CPU),
   host time per forward and per attention call, peak device memory;
3. ``iters`` profiled forwards: Kineto trace with a range per module, per attention call and per step,
   parsed and attributed to layers; each attention call's shape recorded (``callshapes``); CUPTI let go after it
   (``cupti.let_go``).

Then every backend's steady step, in interleaved rounds (``timed_rounds``) whose steps are a user's loop's:
the switch entered once around a turn (``auto``'s timed steps run the model as it is where that runs what
``auto`` runs: ``Target.as_is``), nothing of the measurement above alive (no range, hook or profiler), the steps
back to back between CUDA events (on a CPU, the wall clock read between them).

NaN or Inf (``finite``) is looked for in the cold step's output, the warm-up's attention calls and gradients,
the untimed step opening each turn of the timing rounds and the last timed step's output of each turn (kept past
its clock): never inside a timed step.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import functools
import gc
import gzip
import itertools
import json
import os
import shutil
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
from torch.autograd.profiler import record_function

from .. import candidate, dist, finite, instrument, stderr
from ..backends import recording_notes, resolve_name
from ..device import default_device, device_of, devices_of, sync
from ..errors import BackendUnavailable, UnsupportedModel, out_of_memory
from ..kinds import Kind, kind_of
from ..request import BUDGET_CAP_S
from ..results import BackendResult
from ..stats import median
from ..switch import backend as use_backend
from ..switch import runs_as_auto
from ..words import counted
from ..workload import Workload, check_runnable
from . import cupti
from .attribution import attribute
from .callshapes import ShapeRecorder
from .clock import ForwardClock, annotate_phases
from .compiled import attention_seen, compiled_forward, graphs_compiled, mismatch
from .occupancy import device_limits
from .rounds import MAX_ROUNDS, MIN_PAIRS, STEP_FIGURES, Rounds, Timing, fits, still_open
from .stepstats import mode_fields, prompt_units
from .summarize import backend_fields
from .trace import Trace

__all__ = ["one_at_a_time", "measured_alone", "within_measurement", "annotate_modules", "prepare_backend",
           "timed_rounds", "steps_per_round", "frozen_heap", "remove_temporary", "Target", "Profiled",
           "PROGRESS_EVERY_S", "release_memory"]


try:  # a C++ range: about a tenth of record_function's host cost, which matters once per module call
    from torch._C._profiler import _RecordFunctionFast as _Range
except ImportError:  # pragma: no cover - older torch
    _Range = record_function


@contextlib.contextmanager
def annotate_modules(model: nn.Module, inner: bool = True) -> Iterator[None]:
    """A profiler range ``attnswitch.module:<path>`` around every module's forward (``inner=False``: the
    model's alone, as for compiled forwards, where a hook inside would be traced into the graph)."""
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

    try:
        for path, m in (model.named_modules() if inner else [("", model)]):
            handles.append(m.register_forward_pre_hook(pre(path or root)))
            handles.append(m.register_forward_hook(post, always_call=True))
        yield
    finally:
        for h in handles:
            h.remove()


class Target:
    """What is run, one step at a time: a ``Workload`` (a forward, a generate workload or a training
    step, with prepared argument sets) or a plain callable (under no_grad)."""

    def __init__(self, fn: Callable[..., Any], calls: Callable[[int], Iterator], model: nn.Module | None,
                 device: torch.device, workload: Workload | None = None, compile: str | None = None):
        self.fn, self.calls, self.model, self.device, self.workload = fn, calls, model, device, workload
        #: where a timed step puts its output once its clock has stopped (None: nowhere): the last step of each
        #: turn keeps it, checked for NaN and Inf after the turn, untimed
        self.compile = compile if model is not None else None  # a torch.compile mode: every step runs compiled
        # every GPU the model's weights are on (several under accelerate's device_map); the inputs go to
        # ``device``, the first one
        self.kept: list | None = None  # the outputs of the steps timed on the wall clock, where kept
        self.devices = devices_of(model) if model is not None else [device]
        if device not in self.devices:
            self.devices = [device] + self.devices

    def sync(self) -> None:
        sync(self.devices)

    @classmethod
    def of(cls, target, batch=None, device=None) -> Target:
        if isinstance(target, Workload):
            check_runnable(target.model, target.mode)
            return cls(target.step, target.calls, target.model, device_of(target.model), target)
        if isinstance(target, nn.Module):
            if batch is None:
                raise ValueError("profiling a model needs its inputs: profile(model, batch) with batch a dict "
                                 "of forward arguments (or a Workload)")
            if isinstance(batch, Workload):
                return cls.of(batch.made_for(target))
            if not isinstance(batch, dict):
                raise TypeError(f"batch must be a dict of forward arguments, not {type(batch).__name__}")
            return cls.of(Workload.of(target, batch))
        if callable(target):
            if batch is not None:  # (it would be ignored: the callable is called as it is)
                raise TypeError("a callable is profiled as it is, without a batch: profile(fn), or pass a model "
                                "with its batch")
            dev = torch.device(device) if device is not None else default_device()

            def fn(_):
                with torch.no_grad():
                    return target()
            return cls(fn, lambda n: itertools.repeat(None, n), None, dev)
        raise TypeError(f"cannot profile a {type(target).__name__}: pass a model with a batch, or a callable")

    @property
    def mode(self) -> str:
        return self.workload.mode if self.workload is not None else "callable"

    @property
    def kind(self) -> Kind:
        """What kind of step it times (``kinds``): a callable's is one call."""
        return kind_of(self.workload)

    def switched(self, name: str):
        """The candidate ``name`` for a block: its backend, compiled where it is a compiled candidate's name
        (``flash+compile``) or the target compiles every step (``compile``). A model is switched alone; a
        plain callable runs under a global backend."""
        c = candidate.parse(name)
        mode = c.compile if c.compile is not None else self.compile
        if mode is None:
            return use_backend(c.selection, model=self.model)
        stack = contextlib.ExitStack()
        stack.enter_context(use_backend(c.selection, model=self.model))
        stack.enter_context(compiled_forward(self.model, str(c.uncompiled), mode, decode_only=self.kind.generates))
        return stack

    def as_is(self, name: str) -> bool:
        """Whether the candidate ``name``'s timed steps run the model as it is: ``auto`` uncompiled, where that
        runs what ``auto`` runs (``switch.runs_as_auto``). Keeping the model's own attention needs no switch, so
        its timed steps carry none of the switch's host time; its untimed steps stay switched (their attention
        calls watched for NaN and Inf), and so do its profiled pass and numerics, which count and check them."""
        c = candidate.parse(name)
        return c.selection == "auto" and c.compile is None and self.compile is None and self.model is not None \
            and runs_as_auto(self.model)

    def context(self):
        """What many steps run inside: training mode for a training workload."""
        return self.workload.context() if self.workload is not None else contextlib.nullcontext()

    def compiled_entries(self, name: str) -> int | None:
        """Compiled versions the candidate's forward has now (None: uncompiled)."""
        if self.compile is None:
            return None
        return compiled_forward(self.model, name, self.compile, decode_only=self.kind.generates).entries()

    def annotated(self):
        if self.model is None:
            return contextlib.nullcontext()
        return annotate_modules(self.model, inner=self.compile is None)

    @property
    def prompts(self) -> int:
        """A generate's prompts (one step each in its timing rounds); 1 for the other workloads."""
        return len(self.workload.prompts) if self.kind.generates else 1

    def rewarm(self, prompt: int = 0, sync: bool = True):
        """One step after a switch, untimed: for a generate, prompt ``prompt`` with two new tokens (its
        prefill and a decode step, both phases' first calls after the switch; every shape and cache was
        warmed by the prepared pass, and a whole workload would add seconds per round). ``sync=False``: the
        device left busy, so that timed steps go on from it as a loop's steps go on from the one before.
        Returns its output."""
        if self.kind.generates:
            out = self.workload.prompt(prompt, new_tokens=2).step()
        else:
            out = self.fn(next(self.calls(1)))
        if sync:
            self.sync()
        return out

    def profiled_steps(self, n: int) -> tuple[Callable, list]:
        """The step function and the arguments of the profiled pass: a warm-up step's, then those of the
        ``n`` steps kept (a generate workload cut short, at most two kept)."""
        if self.kind.generates:
            short = self.workload.short()
            return short.step, [None] * (1 + max(1, min(n, 2)))
        return self.fn, list(self.calls(n + 1))


@dataclass(frozen=True)
class Profiled:
    """One profiled pass: its trace (written to ``path``), attributed rows, and what it cost; the attention calls'
    shapes its kept steps ran."""

    path: Path
    trace: Trace
    rows: dict
    parse_seconds: float  # reading and attributing the trace
    run_seconds: float  # the profiled forwards, the profiler's own collection included
    shapes: tuple = ()  # peak.AttnShape per call site


def release_memory(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
        torch.cuda.empty_cache()


@dataclass
class Run:
    """One measured step: host time, its attention calls ``(where, seconds, key length)``, its forwards
    (a model's), and CUDA events around it."""

    host_s: float
    attn: list
    forwards: list = field(default_factory=list)
    start: Any = None
    end: Any = None


def _event(cuda: bool):
    if not cuda:
        return None
    e = torch.cuda.Event(enable_timing=True)
    e.record()
    return e


_MEASURING = threading.Lock()
_measuring_in: list[tuple[int, str] | None] = [None]  # the thread that holds it: its ident and name
_LET_IN = threading.local()  # ``once``: the library's own next measurement in this thread enters a held lock


@contextlib.contextmanager
def within_measurement():
    """The library's own call of one measurement inside another's body (``compare`` runs ``profile``, a sweep
    ``compare``): it is let into the lock this thread holds, once; a measurement its steps start (a model's hook)
    is not."""
    _LET_IN.once = True
    try:
        yield
    finally:
        _LET_IN.once = False


@contextlib.contextmanager
def one_at_a_time():
    """One measurement per process, refused at once while another runs (in this thread too: a model's hook that
    starts one inside a measured step): the profiler is one per process (two traces at once crash Kineto, the
    process with them), and two measurements would time each other."""
    held = _measuring_in[0]
    if held is not None and held[0] == threading.get_ident() and getattr(_LET_IN, "once", False):
        _LET_IN.once = False
        yield
        return
    if not _MEASURING.acquire(blocking=False):
        held = _measuring_in[0]
        where = "this thread" if held is not None and held[0] == threading.get_ident() else \
            f"thread {held[1] if held else '?'!r}"
        raise RuntimeError(f"another attnswitch measurement is running in this process ({where}): measurements "
                           "run one at a time per process; wait for it to return, or measure in another process")
    _measuring_in[0] = (threading.get_ident(), threading.current_thread().name)
    try:
        yield
    finally:
        _measuring_in[0] = None
        _MEASURING.release()


def measured_alone(fn):
    """``fn`` run inside ``one_at_a_time``, from its first step to its answer."""
    @functools.wraps(fn)
    def alone(*args, **kwargs):
        with one_at_a_time():
            return fn(*args, **kwargs)
    return alone


@contextlib.contextmanager
def frozen_heap():
    """Inside the block, a full collection scans only what was made inside it: everything alive at its
    start (torch, transformers, the model: millions of objects, a third of a second per collection on an
    H200's host) is moved out of the collector's sight (``gc.freeze``) and back at the end (with anything
    frozen inside the block: ``gc`` unfreezes all or nothing). Left alone where the caller froze objects
    itself."""
    if gc.get_freeze_count():
        yield
        return
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


@contextlib.contextmanager
def _no_gc():
    """No garbage collection inside a timed step (as ``timeit`` does): a collection of a large heap (a parsed
    trace, a model) lands at random in host-bound steps, a generate's above all."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _run(target: Target, c, attn: list | None = None, kept: list | None = None) -> Run:
    """One step, the device idle before it; host time until it returns, its forwards and its calls (``kept``:
    where its output goes, to be checked after)."""
    cuda = target.device.type == "cuda"
    attn = [] if attn is None else attn
    target.sync()
    clock = ForwardClock(target.model, cuda, attn, graphs=target.compile is not None,
                         generates=target.kind.generates) if target.model is not None else contextlib.nullcontext()
    with instrument.measuring(host_times=attn), clock, _no_gc():
        start = _event(cuda)
        t0 = time.perf_counter()
        if kept is None:
            target.fn(c)
        else:
            kept.append(target.fn(c))
        host = time.perf_counter() - t0
        end = _event(cuda)
    target.sync()
    return Run(host, attn, getattr(clock, "forwards", []), start, end)


def _rss_mb() -> float | None:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError, IndexError):
        return None


def _measure(target: Target, name: str, warmup: int, iters: int, trace_dir, profile_steps: int) -> dict:
    cuda = target.device.type == "cuda"
    calls = target.calls(1 + warmup + iters)
    gc.collect()
    with recording_notes() as notes, target.context(), target.switched(name):
        rss, graphs, entries = _rss_mb(), graphs_compiled(), target.compiled_entries(name)
        kept: list = []
        cold = _run(target, next(calls), kept=kept)
        rss_grown = (_rss_mb() - rss) if rss is not None else None
        graphs = (graphs, graphs_compiled())
        _cold_gate(target, kept, calls)  # its output, read now (untimed)
        kept.clear()
        with finite.watching("the warm-up step") as watch:  # every attention call and its gradients checked
            for _ in range(warmup):
                watch.output(target.fn(next(calls)))
        target.sync()
        _gate(watch.first())
        if cuda:
            for d in target.devices:
                torch.cuda.reset_peak_memory_stats(d)
        steady = [_run(target, next(calls)) for _ in range(iters)]
        peaks = {d.index: torch.cuda.max_memory_allocated(d) / 2**20 for d in target.devices} if cuda else {}
        prof = _profiled(target, str(candidate.parse(name).compiled(target.compile)), profile_steps, trace_dir) \
            if profile_steps else None
        entries = (entries, target.compiled_entries(name))
    attn = [a for r in steady for a in r.attn]
    # the host figures of one step, the median one, so that its attention calls and the rest add up to it
    mid = sorted(steady, key=lambda r: r.host_s)[(len(steady) - 1) // 2]
    result = dict(
        backend=name, status="ok", notes=tuple(dict.fromkeys(n[2] for n in notes)),
        timer="cuda-events" if cuda else "wall-clock", host_ms=mid.host_s * 1e3,
        host_attn_ms=sum(a[1] for a in mid.attn) * 1e3,
        cold_host_ms=cold.host_s * 1e3, attn_calls=len(attn) / max(1, iters),
        attn_host_us=median(a[1] * 1e6 for a in attn),
        attn_cold_host_us=cold.attn[0][1] * 1e6 if cold.attn else None,  # the first call at this shape
        peak_mem_mb=max(peaks.values()) if peaks else None,  # the fullest GPU
        **mode_fields(target.workload, cold, steady, rss_grown),
    )
    if target.compile is not None:  # its calls are inside compiled graphs: none is counted or timed one by one
        result.update(host_attn_ms=None, attn_calls=None)
        result.update(_compiled_fields(name, target.compile, result, graphs, entries, prof))
    if prof is not None:
        limits = device_limits(target.device) if cuda else None
        result.update(backend_fields(prof.trace, prof.rows, cuda=cuda, limits=limits, peaks=peaks, rank=dist.rank()),
                      trace_path=str(prof.path), trace_seconds=prof.parse_seconds,
                      profiled_run_seconds=prof.run_seconds, trace_events=len(prof.trace.events),
                      attn_shapes=prof.shapes)
    return result


def _cold_gate(target: Target, kept: list, calls) -> None:
    """Stop a candidate whose cold step gave NaN or Inf, at the call site where it appeared: its attention calls
    were not watched (that step is timed), so the step is run once more with them watched."""
    found = finite.first(finite.output_marks(kept), "the cold step")
    if found is not None:
        with finite.watching("the cold step, run again with its calls watched") as watch:
            watch.output(target.fn(next(calls)))
        target.sync()
        found = watch.first() or found
    _gate(found)


def _gate(found) -> None:
    """Stop measuring a candidate that gave NaN or Inf (``found``: where; None: nothing found)."""
    if found is not None:
        raise finite.NonFiniteError(found)


def _compiled_fields(name: str, mode: str, result: dict, graphs: tuple[int, int], entries: tuple, prof) -> dict:
    """What a compiled candidate adds: its compile as a one-off cost (the cold step's host time over a steady
    step's), the graphs compiled in the cold step, the recompiles (compiled versions of its forward beyond
    the first, made while it was measured), the attention kernel the graph ran."""
    seen, names = attention_seen(prof.trace) if prof is not None else (None, ())
    cold, steady = result["cold_host_ms"], result["host_ms"]
    before, after = entries
    recompiles = None if None in entries else max(0, after - max(before, 1))
    return dict(compile=mode, compile_ms=max(0.0, cold - steady) if steady is not None else None,
                graphs=graphs[1] - graphs[0], recompiles=recompiles, attn_seen=seen, attn_seen_names=names,
                attn_mismatch=mismatch(name, seen) if prof is not None else None)


def prepare_backend(target: Target, name: str, *, warmup: int = 1, iters: int = 5,
                    trace_dir: str | Path | None = None, profile_steps: int = 1) -> BackendResult:
    """Everything but the GPU timing of one backend: the cold step, warm-up, host time per step and
    per attention call (the device idle before each step, so no wait for earlier work is counted), peak
    memory, and one profiled pass of ``profile_steps`` steps (0: none; the counts per step are the same
    in every step, so a few suffice). A backend that cannot run gives status ``unavailable`` (PyTorch's
    reasons) or ``failed`` (out of memory, ...); never raises."""
    name = str(candidate.parse(name, resolve_name))
    try:
        return BackendResult(**_measure(target, name, warmup, iters, trace_dir, profile_steps))
    except BackendUnavailable as e:
        return BackendResult(name, "unavailable", tuple(e.reasons), e.where)
    except finite.NonFiniteError as e:
        return finite.failed(BackendResult(name, "ok"), e.found)
    except UnsupportedModel:
        raise
    except (RuntimeError, ValueError, NotImplementedError, MemoryError) as e:  # (torch.OutOfMemoryError too)
        release_memory(target.device)
        first = str(e).splitlines()[0] if str(e) else ""
        if isinstance(e, MemoryError) or out_of_memory(e):
            return BackendResult(name, "failed", (f"out of memory: {first}",))
        return BackendResult(name, "failed", (f"{type(e).__name__}: {first}",))


#: the longest the timing rounds go without a word of progress, in seconds
PROGRESS_EVERY_S = 10.0


#: before a step of a candidate not timed yet, a line where none was said for this long (its step may be long)
_UNKNOWN_STEP_GAP_S = 1.0


class _Pace:
    """Where the timing rounds are, said through ``progress`` at least every ``PROGRESS_EVERY_S`` seconds
    (on ``clock``): the round, the candidates still timed, and the time left where it is known (the first
    rounds' from the turns taken so far; the more rounds' from the budget). Lines are planned, not polled:
    before a turn, from the length of the candidate's last steps, it says a line where the turn's first step
    would end too late for one, and names the steps of its block after which one is due (none where steps
    take milliseconds), so that a timed step reads no clock for it. Before a candidate's first step (of
    unknown length), a line where a second has passed since the last one."""

    def __init__(self, progress: Callable[[str], None] | None, clock: Callable[[], float], first: int, n: int,
                 budget_s: float | None):
        self.progress, self.clock, self.first, self.budget_s = progress, clock, first, budget_s
        self.t0 = self.said = clock()
        self.turns, self.first_turns, self.round_started, self.rounds_s = 0, first * n, self.t0, []
        self.round, self.active, self.deadline, self.name = 0, [], None, ""
        self.step_s: dict[str, float] = {}  # each candidate's last steps (the first untimed one, then timed ones)
        self.turn_s: dict[str, float] = {}  # each candidate's last turn: what the next round will take

    @contextlib.contextmanager
    def step(self) -> Iterator[None]:
        """One step of the candidate whose turn it is, clocked: how long its steps take."""
        if self.progress is not None:
            gap, last = self.clock() - self.said, self.step_s.get(self.name)
            if gap + (last or 0.0) > PROGRESS_EVERY_S or (last is None and gap >= _UNKNOWN_STEP_GAP_S):
                self.say()
        t = self.clock()
        yield
        self.step_s[self.name] = self.clock() - t

    def timed(self, timed: Callable) -> Callable:
        """``timed`` (one step, its ms) as one of the candidate's clocked steps."""
        def step(target, c):
            with self.step():
                return timed(target, c)
        return step

    def knows(self, name: str) -> bool:
        return name in self.step_s

    def ahead(self, name: str, n: int) -> frozenset[int]:
        """Before a turn of the candidate ``name`` whose steps are known: one untimed step, then ``n`` timed.
        A line now where the untimed step would end too late for one; the timed steps after which one is
        due (``_wall_block``, ``_timed_on_gpus``)."""
        s = self.step_s[name]
        if self.progress is None:
            return frozenset()
        gap = self.clock() - self.said
        if gap + s > PROGRESS_EVERY_S:
            self.say()
            gap = 0.0
        return self.lines(gap + s, s, n)

    @staticmethod
    def lines(gap: float, s: float, n: int) -> frozenset[int]:
        """The steps of a block of ``n`` steps of ``s`` seconds each after which a line is due (0: before the
        first), ``gap`` seconds after the last one was said."""
        due = []
        for i in range(n):
            if gap + s > PROGRESS_EVERY_S:
                due.append(i)
                gap = 0.0
            gap += s
        return frozenset(due)

    def block(self, name: str, n: int) -> frozenset[int]:
        """Before a block of ``n`` timed steps right after a clocked step: the steps after which a line is due."""
        if self.progress is None:
            return frozenset()
        return self.lines(self.clock() - self.said, self.step_s[name], n)

    def turn(self, name: str, started: float) -> None:
        self.turns += 1
        self.turn_s[name] = self.clock() - started

    def next_round(self) -> float:
        """The seconds the next round is expected to take: its candidates' last turns."""
        return sum(self.turn_s.get(n, 0.0) for n in self.active)

    def say(self) -> None:
        now = self.clock()
        self.said = now
        names = ", ".join(self.active)
        if self.deadline is not None:
            self.progress(f"timing: round {self.round + 1}, more rounds for those still tied with the fastest "
                          f"({names}); at most {max(0.0, self.deadline - now):.0f} s left")
            return
        line = f"timing: round {self.round + 1} of {self.first} ({names})"
        if self.turns:
            left = self.first_left(now)
            more = self.budget_s if self.budget_s is not None else min(now - self.t0 + left, BUDGET_CAP_S)
            line += f"; about {left:.0f} s left" + (f", then at most {more:.0f} s more for those still tied"
                                                    if more else "")
        self.progress(line)

    def first_left(self, now: float) -> float:
        """The first rounds' time left: the rounds to come at the mean of those done (before one is: the
        turns to come at the mean of those taken)."""
        if not self.rounds_s:
            return max(0.0, (now - self.t0) / self.turns * self.first_turns - (now - self.t0))
        mean = sum(self.rounds_s) / len(self.rounds_s)
        return (self.first - self.round - 1) * mean + max(0.0, mean - (now - self.round_started))

    def round_done(self) -> None:
        now = self.clock()
        self.rounds_s.append(now - self.round_started)
        self.round_started = now


def steps_per_round(iters: int, rounds: int) -> list[int]:
    """Timed steps per backend in each of the first rounds (not a generate's): ``iters`` spread over
    ``min(rounds, iters)`` rounds, the first ones a step longer where they do not divide evenly."""
    first = max(1, min(rounds, iters))
    return [iters // first + (1 if r < iters % first else 0) for r in range(first)]


def timed_rounds(target: Target, names: list[str], *, iters: int, rounds: int = 6, budget_s: float | None = None,
                 clock: Callable[[], float] = time.perf_counter,
                 progress: Callable[[str], None] | None = None) -> Rounds:
    """Steady time per step (ms) for each backend, unprofiled, in interleaved rounds so that drift (clocks,
    temperature, other load) falls on every backend alike. A backend's turn in a round is what a user's loop
    under ``attnswitch.backend(...)`` is: the switch entered once, one untimed step, then its timed steps back
    to back, their inputs made before (``_one_round``; ``auto``'s timed steps on a model that runs it unswitched
    run the model as it is: ``Target.as_is``). On a GPU they are timed with CUDA events recorded
    between the steps, the device synchronized once, after the last; on a CPU with the wall clock. Garbage
    is collected before each backend's turn in a round and never inside it (as ``timeit`` does).

    Every backend runs ``rounds`` rounds (``iters`` steps in all). A generate workload's round is one
    prompt, every backend generating it in turn (in an order that rotates from round to round), so that
    paired units are a few hundred milliseconds apart rather than whole workloads: every backend takes
    every prompt ``iters`` times, in at least ``rounds`` and ``MIN_PAIRS`` rounds, each prompt led by each
    backend in turn pass after pass. Then, unless ``budget_s`` is 0, rounds go on for the backends whose
    interval against the fastest still holds 1 (``stats.paired_margin``) until each is told apart, or is
    within ``stats.EQUIVALENT`` of it, or the next round would end past ``budget_s`` more seconds (default:
    as long as the first rounds took, ``BUDGET_CAP_S`` at most; ``MAX_ROUNDS`` rounds at most); a backend
    decidedly slower than the fastest is timed no further. ``clock`` reads the budget's time. ``progress``
    hears where the rounds are at least every ``PROGRESS_EVERY_S`` seconds. Under ``torchrun`` every rank
    takes the same decisions (the union of what each keeps), so that their forwards pair up."""
    generate = kind_of(target.mode).generates
    if generate:
        prompts = max(1, target.prompts)
        first = max(iters * prompts, rounds, MIN_PAIRS)
        per_round = [1] * first
    else:
        per_round = steps_per_round(iters, rounds)
        prompts, first = 1, len(per_round)
    timings = {n: Timing(per_prompt=generate, steps={k: [] for k in STEP_FIGURES} if generate else None)
               for n in names}
    pace = _Pace(progress, clock, first, len(names), budget_s)
    block = _timed_on_gpus if target.device.type == "cuda" else _wall_block
    active, stopped, r = list(names), "fixed", 0
    with target.context():
        while active:
            pace.round, pace.active = r, active
            _round(target, active, r, prompts, per_round[r] if r < first else max(1, per_round[-1]), block, timings,
                   pace)
            for name in timings.keys() - set(active):
                timings[name].units.append([])  # sat this round out: round r is every backend's round r
                timings[name].by_round.append([])
            pace.round_done()
            r += 1
            if r < first:
                continue
            if budget_s == 0:
                break
            if pace.deadline is None:  # the first rounds are done: the budget starts
                pace.deadline = clock() + (budget_s if budget_s is not None else min(clock() - pace.t0, BUDGET_CAP_S))
            active, stopped = still_open(timings, active, out_of_time=clock() >= pace.deadline,
                                         capped=r >= MAX_ROUNDS)
            active = [n for n in active if timings[n].nonfinite is None]  # (it fails: timed no further)
            pace.active = active
            if active and not fits(pace.next_round(), pace.deadline - clock()):  # it would end past the budget
                active, stopped = [], "budget"
    return Rounds(timings, r, stopped, clock() - pace.t0)


def _round(target: Target, active: list[str], r: int, prompts: int, n_calls: int, block: Callable,
           timings: dict[str, Timing], pace: _Pace) -> None:
    """Round ``r``: every active candidate's turn; a generate's is prompt ``r``, led by each in turn pass
    after pass."""
    if target.mode == "generate":
        k = (r % prompts + r // prompts) % len(active)
        turn = active[k:] + active[:k]
    else:
        turn = active
    for name in turn:
        started, pace.name = pace.clock(), name
        if target.mode == "generate":
            _prompt_turn(target, name, r % prompts, prompts, pace.timed(lambda t, p: block(t, [p])[0]),
                         timings[name])
        else:
            _one_round(target, name, n_calls, block, timings[name], pace)
        pace.turn(name, started)


def _one_round(target: Target, name: str, n_calls: int, block: Callable, timing: Timing, pace: _Pace) -> None:
    """One backend's turn in a round, as a user's loop runs: the switch entered once around the turn, one
    untimed step (after the other backends ran; its attention calls watched for NaN and Inf), then ``n_calls``
    timed steps back to back (``block``), their argument sets made before the first (a decode step's copy of its
    cache each), the last one's output checked after the turn. The timed steps go on from the untimed one
    without waiting for the device, as a loop's steps go on from the one before, except a candidate's first: it
    is clocked alone (the device synchronized), which says how long its steps take."""
    calls = list(target.calls(n_calls))
    gc.collect(0)  # what the previous turn left (no collection ran in it, so all of it is young)
    kept: list = []
    as_is = target.as_is(name)
    with contextlib.ExitStack() as switch, _no_gc():
        switch.enter_context(target.switched(name))
        with finite.watching("an untimed step of the timing rounds") as watch:
            if pace.knows(name):
                lines = pace.ahead(name, n_calls)
                watch.output(target.rewarm(sync=False))
            else:
                with pace.step():
                    watch.output(target.rewarm())
                lines = pace.block(name, n_calls)
        if as_is:  # the timed steps: the model as it is, after an untimed step of it (its first step is slower)
            switch.close()
            watch.output(target.rewarm(sync=False))
        if 0 in lines:
            pace.say()
        samples = block(target, calls, lines, pace.say, kept)
    timing.samples.extend(samples)
    timing.by_round.append(list(samples))
    timing.units.append([median(samples)])
    pace.step_s[name] = median(samples) / 1e3
    timing.nonfinite = timing.nonfinite or watch.first() or finite.first(finite.output_marks(kept),
                                                                         "the last timed step of a round")


def _prompt_turn(target: Target, name: str, p: int, prompts: int, timed: Callable, timing: Timing) -> None:
    """One backend's turn in a generate's round: the switch, a short untimed generate of prompt ``p``
    (``Target.rewarm``), then prompt ``p``'s generate, timed as a step and clocked forward by forward: its
    unit and decode-step figures (computed at once, so that no CUDA event outlives the step). Each time the
    backend has taken every prompt, their times add up to a whole-workload sample."""
    gc.collect(0)
    as_is = target.as_is(name)
    with contextlib.ExitStack() as switch, _no_gc():
        switch.enter_context(target.switched(name))
        with finite.watching("an untimed step of the timing rounds") as watch:
            target.rewarm(p)
        if as_is:  # the timed generate: the model as it is (``Target.as_is``), after an untimed one of it
            switch.close()
            target.rewarm(p)
        clock = ForwardClock(target.model, target.device.type == "cuda", generates=target.kind.generates)
        with clock:
            start = time.perf_counter()
            ms = timed(target, p)
            end = time.perf_counter()
        target.sync()
    # from the generate's start: an encoder-decoder's encoder runs before its first clocked forward
    units, figures = prompt_units(clock.forwards, end, start)
    row = [0.0] * prompts
    row[p] = units[0] if units else ms
    timing.units.append(row)
    r = len(timing.units) - 1
    for k, v in figures.items():
        timing.steps[k].extend(v)
        timing.step_rounds.setdefault(k, []).extend([(r,)] * len(v))
    timing.pending[p] = ms
    timing.pending_rounds.append(r)
    timing.nonfinite = timing.nonfinite or watch.first()
    if len(timing.pending) == prompts:
        whole = sum(timing.pending.values())
        timing.samples.append(whole)
        timing.steps["wall"].append(whole)
        timing.step_rounds.setdefault("wall", []).append(tuple(timing.pending_rounds))
        timing.pending.clear()
        timing.pending_rounds.clear()


def _timed_wall(target: Target, c) -> float:
    """One step on the wall clock (ms); its output appended to ``target.kept`` where that is a list."""
    t0 = time.perf_counter()
    if target.kept is None:
        target.fn(c)
    else:
        target.kept.append(target.fn(c))
    return (time.perf_counter() - t0) * 1e3


def _wall_block(target: Target, calls: list, lines: frozenset[int] = frozenset(),
                say: Callable[[], None] | None = None, kept: list | None = None) -> list[float]:
    """Steps back to back on the wall clock (a CPU's): each one's ms; a line said after each step in
    ``lines`` (``_Pace``), outside the steps' time; the last step's output appended to ``kept`` (the finiteness
    gate reads it after the clock)."""
    out = []
    try:
        for i, c in enumerate(calls, 1):
            target.kept = kept if i == len(calls) else None
            out.append(_timed_wall(target, c))
            if i in lines:
                say()
    finally:
        target.kept = None
    return out


def _timed_on_gpus(target: Target, calls: list, lines: frozenset[int] = frozenset(),
                   say: Callable[[], None] | None = None, kept: list | None = None) -> list[float]:
    """Steps back to back timed with CUDA events (ms each): every GPU of the model gets an event before the
    first step and one after each; nothing runs between the steps but those records (and a line said after
    each step in ``lines``), and nothing waits for the device until the last step's end, as in a user's loop.
    Each step lasts from the end of the one before, the first from the events before it, recorded behind
    whatever the device still had queued. Several GPUs are made idle first, so that their starts coincide, and
    each step ends when its last GPU's end event fires (events of two devices cannot be subtracted, so each
    GPU is measured from its own start). The last step's output is appended to ``kept``."""
    streams = [torch.cuda.current_stream(d) for d in target.devices if d.type == "cuda"]
    last = None
    marks = [[torch.cuda.Event(enable_timing=True) for _ in streams] for _ in range(len(calls) + 1)]
    if len(streams) > 1:
        target.sync()
    fn = target.fn
    for e, s in zip(marks[0], streams):
        e.record(s)
    for i, c in enumerate(calls, 1):
        last = fn(c)
        for e, s in zip(marks[i], streams):
            e.record(s)
        if i in lines:
            say()
    if kept is not None and calls:
        kept.append(last)  # the last step's output, read after the clock (the finiteness gate)
    for e in marks[-1]:
        e.synchronize()
    ends = [max(a.elapsed_time(b) for a, b in zip(marks[0], m)) for m in marks[1:]]
    return [b - a for a, b in zip([0.0, *ends], ends)]


def _profiled(target: Target, name: str, n: int, trace_dir) -> Profiled:
    """``n`` steps traced and attributed. A trace on a GPU that holds no GPU activity at all (CUPTI detached
    inside it by a teardown still pending from an earlier trace: ``cupti``) is taken again, once; an error
    where the second is empty too, never a report of zero kernels."""
    # once more only where the teardown is on, and in one process (another rank would wait in its collectives)
    again = cupti.let_go() and dist.rank() is None
    tries = 2 if again else 1
    for _ in range(tries):
        p = _traced(target, name, n, trace_dir)
        if target.device.type != "cuda" or p.trace.device_events:
            return p
        cupti.settle(None)
    why = ("CUPTI detached while tracing?); set TEARDOWN_CUPTI=0 to keep it attached" if cupti.let_go() else
           "another profiler, such as Nsight Systems, holding CUPTI?)")
    raise RuntimeError(f"the profiler recorded no GPU activity in {counted(tries, 'trace')} of "
                       f"{name} ({why}")


def _traced(target: Target, name: str, n: int, trace_dir) -> Profiled:
    acts = [torch.profiler.ProfilerActivity.CPU]
    gpu = target.device.type == "cuda"
    if gpu:
        acts.append(torch.profiler.ProfilerActivity.CUDA)
        cupti.let_go()
    fn, calls = target.profiled_steps(n)
    warm, calls = calls[0], calls[1:]
    phases = annotate_phases(target.model) if kind_of(target.mode).generates else contextlib.nullcontext()
    recorder = ShapeRecorder()  # the attention calls' shapes in the kept steps (outside their ranges)
    t_run = time.perf_counter()
    # One step traced and thrown away first (the profiler's warm-up, as PyTorch advises: its start-up
    # skews the first step it traces), then the steps kept, each a ``ProfilerStep#N`` range of the
    # profiler's own. The trace is read from Kineto's export: the profiler's Python event list is never
    # built (it costs about as much as the profiled steps themselves).
    schedule = torch.profiler.schedule(wait=0, warmup=1, active=len(calls), repeat=1)
    with target.annotated(), phases, instrument.measuring(annotate=True), stderr.filtered(_usdt), _quiet(), \
            torch.profiler.profile(activities=acts, schedule=schedule) as prof:
        fn(warm)
        target.sync()
        with instrument.measuring(observers=(recorder,)):
            for c in calls:
                prof.step()
                fn(c)
        target.sync()
        threads = cupti.tasks()
        prof.step()  # the last kept step ends: the trace is complete
    if gpu:
        cupti.settle(threads)  # CUPTI detached now, not inside the next trace
    run_seconds = time.perf_counter() - t_run
    t0 = time.perf_counter()
    path, data = _export(prof, name, trace_dir)
    trace = Trace.from_json(data, source=str(path))
    rows = attribute(trace, steps={s.step for s in trace.steps()})
    return Profiled(path, trace, rows, time.perf_counter() - t0, run_seconds, recorder.shapes(len(calls)))


@contextlib.contextmanager
def _quiet():
    """Without the profiler's warning that it keeps no events across cycles: none is read from it."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*Profiler clears events")
        yield


def _usdt(line: str) -> bool:
    return line.startswith("USDT") and "profiler_st" in line  # Kineto's start/stop lines, for every profile


def _export(prof, name: str, trace_dir) -> tuple[Path, dict]:
    """Write the trace as gzipped JSON (Perfetto and HolisticTraceAnalysis read it) with the process's rank
    (``distributedInfo``, which Kineto writes only inside a process group); returns its path and data."""
    rank = dist.rank()
    # only rank 0 writes into trace_dir: the other ranks' traces reach it through the process group
    out_dir = Path(trace_dir) if trace_dir is not None and not rank else _temporary()
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / (f"trace_{_file_name(name)}" + ("" if rank is None else f"_rank{rank}") + ".json.gz")
    # Kineto writes its file's path into the trace unescaped, and renames the file with each "\" made "/": a
    # folder whose path holds either, or a control character, gets the raw trace through a temporary folder
    unsafe = any(c in '"\\' or ord(c) < 32 for c in str(out_dir.resolve()))
    via = tempfile.TemporaryDirectory(prefix="attnswitch-trace-") if unsafe else contextlib.nullcontext(out_dir)
    with via as raw_dir:
        raw_path = Path(raw_dir) / path.with_suffix("").name
        # Kineto raises nothing where it cannot write the trace: it says so on stderr, which the error below says
        with stderr.filtered(lambda line: "Failed to write" in line and not _whole_json(raw_path)):
            prof.export_chrome_trace(str(raw_path))
        try:
            raw = raw_path.read_bytes()
            data = json.loads(raw)
        except (OSError, ValueError) as e:
            raise _unwritten(raw_path, e) from None
        raw_path.unlink()
    if "distributedInfo" not in data:
        info = {"backend": "none", "rank": rank or 0, "world_size": 1}
        data["distributedInfo"] = info
        raw = b"{" + json.dumps({"distributedInfo": info}).encode()[1:-1] + b"," + raw.lstrip()[1:]
    path.write_bytes(gzip.compress(raw, compresslevel=1))
    return path, data


#: the folders of traces written where no folder was given: removed as the process ends (``report.save_traces``
#: copies them out before that)
_TEMPORARY: list[Path] = []


def _temporary() -> Path:
    if not _TEMPORARY:
        atexit.register(remove_temporary)
    _TEMPORARY.append(Path(tempfile.mkdtemp(prefix="attnswitch-")))
    return _TEMPORARY[-1]


def remove_temporary() -> None:
    """Remove the trace folders this process wrote where no folder was given (at exit; the command line, which
    ends without the interpreter's exit, calls it itself)."""
    while _TEMPORARY:
        shutil.rmtree(_TEMPORARY.pop(), ignore_errors=True)


#: free space below which a trace the profiler could not write is taken as a full disk
_FULL_BYTES = 1 << 30


def _whole_json(path: Path) -> bool:
    try:
        json.loads(path.read_bytes())
    except (OSError, ValueError):
        return False
    return True


def _unwritten(path: Path, e: BaseException) -> OSError:
    """Why the profiler's trace at ``path`` is absent or cut short: no space left on the device it is written
    to (the disk nearly full), or the error reading it gave."""
    with contextlib.suppress(OSError):
        path.unlink()
    try:
        full = shutil.disk_usage(path.parent).free < _FULL_BYTES
    except OSError:
        full = False
    if full:
        return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
    return e if isinstance(e, OSError) else OSError(errno.EIO, f"the profiler's trace is not whole ({e})", str(path))


def _file_name(name: str) -> str:
    return name.replace("/", "+").replace("=", "-")  # a policy's name in a file name
