"""Parsing a PyTorch profiler (Kineto) chrome trace: the one place that reads trace JSON.

``Trace.load`` turns the event list into ``Event`` objects and resolves, for every event, what
encloses it on its CPU thread (module range, attention range, step range, phase range), and for every
device event (kernel, memcpy, memset) the runtime or driver call that launched it, by correlation id.
Backward work belongs where its forward op ran: each autograd function the engine evaluates
(``autograd::engine::evaluate_function: XBackward0``) carries the sequence number of the forward op
that recorded it, and takes that op's module, attention call and step, with phase ``backward``;
gradient accumulation (no sequence number) belongs with the backward function evaluated just before it
on its thread (the engine runs it as soon as that function made the gradient). Analyses are functions
over a ``Trace`` (see ``attribution``).
"""

from __future__ import annotations

import gc
import gzip
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..instrument import ATTENTION_PREFIX, MODULE_PREFIX, OLD_STEP_PREFIX, PHASE_PREFIX, STEP_PREFIX

__all__ = ["Event", "Trace", "DEVICE_KINDS", "is_collective_kernel", "is_collective_op"]

# Kineto categories of device activity and what attnswitch calls them
DEVICE_KINDS = {"kernel": "kernel", "gpu_memcpy": "memcpy", "gpu_memset": "memset"}
_LAUNCH_CATS = ("cuda_runtime", "cuda_driver")
_RANGE_CATS = ("user_annotation", "cpu_op", "python_function")
_STEPS = (STEP_PREFIX, OLD_STEP_PREFIX)
_OWN = (ATTENTION_PREFIX, MODULE_PREFIX, PHASE_PREFIX, *_STEPS)
_BACKWARD = "autograd::engine::evaluate_function:"
_SEQ = "Sequence number"
_CPU_CATS = ("cpu_op", "user_annotation")  # not "gpu_user_annotation": the same range's GPU-side copy
_NO_ARGS: dict = {}
_EPS = 0.002  # µs: kineto writes timestamps rounded to ns; children may overhang their parent by that
# collective communication: NCCL's kernels on the GPU; on the CPU, the process group's op: every collective
# passes through exactly one ``c10d::`` op (``c10d::allreduce_``), whether issued by ``dist.all_reduce``
# or by DTensor's functional collectives (``_c10d_functional::all_reduce`` -> ``c10d::allreduce_``)
_COLLECTIVE_KERNELS = ("nccl",)
_COLLECTIVE_OPS = ("c10d::",)


def is_collective_kernel(name: str) -> bool:
    """A device kernel of a collective (``ncclDevKernel_AllReduce_Sum_bf16_RING_LL``, ...)."""
    return name.startswith(_COLLECTIVE_KERNELS)


def is_collective_op(name: str) -> bool:
    """The CPU op of one collective on its process group (``c10d::allreduce_``, ``c10d::allgather_``)."""
    return name.startswith(_COLLECTIVE_OPS)


class Event:
    """One complete ('X') trace event, with what encloses it resolved by ``Trace``."""

    __slots__ = ("name", "cat", "pid", "tid", "ts", "dur", "end", "args", "module", "attention", "step", "op",
                 "parent_is_op", "launch", "device", "phase")

    def __init__(self, name: str, cat: str, pid: Any, tid: Any, ts: float, dur: float, args: dict):
        self.name, self.cat, self.pid, self.tid, self.ts, self.dur, self.args = name, cat, pid, tid, ts, dur, args
        self.end = ts + dur  # µs
        # enclosing ranges on the same CPU thread (for device events: those of the launching call)
        self.module: str | None = None
        self.attention: str | None = None
        self.step: str | None = None
        self.phase: str | None = None  # "prefill" / "decode" (generate), "backward"; None: a forward
        self.op: str | None = None  # the outermost cpu op around it (its own name for an outermost op)
        self.parent_is_op = False
        self.launch: Event | None = None  # device events: the runtime/driver call with the same correlation
        # device events: the GPU index it ran on (a peer copy: the device that ran it, ``inDevice``)
        self.device: int | None = None
        if cat in DEVICE_KINDS:
            d = args.get("device", args.get("inDevice"))
            self.device = int(d) if d is not None else None

    @property
    def peer(self) -> tuple[int, int] | None:
        """``(from, to)`` device indices of a copy between two GPUs, else None."""
        a = self.args
        if self.cat != "gpu_memcpy" or "fromDevice" not in a:
            return None
        src, dst = int(a["fromDevice"]), int(a["toDevice"])
        return (src, dst) if src != dst else None

    @property
    def collective(self) -> bool:
        return self.cat == "kernel" and is_collective_kernel(self.name)

    @property
    def kind(self) -> str | None:
        return DEVICE_KINDS.get(self.cat)

    def __repr__(self) -> str:
        return f"Event({self.cat}:{self.name!r} ts={self.ts} dur={self.dur})"


@dataclass
class Trace:
    events: list[Event]
    device_properties: list[dict] = field(default_factory=list)
    source: str = ""
    distributed: dict = field(default_factory=dict)  # Kineto's distributedInfo: backend, rank, world_size

    @property
    def rank(self) -> int | None:
        r = self.distributed.get("rank")
        return int(r) if r is not None else None

    @classmethod
    def load(cls, path: str | Path) -> Trace:
        path = Path(path)
        opener = gzip.open if path.suffix == ".gz" else open
        # tens of thousands of small objects: the cyclic GC would otherwise rescan everything alive
        # (a model, the profiler's own records) many times over while they are made
        enabled = gc.isenabled()
        gc.disable()
        try:
            with opener(path, "rt") as f:
                data = json.load(f)
            return cls.from_json(data, source=str(path))
        finally:
            if enabled:
                gc.enable()

    @classmethod
    def from_json(cls, data: dict | list, source: str = "") -> Trace:
        raw = data["traceEvents"] if isinstance(data, dict) else data
        props = data.get("deviceProperties", []) if isinstance(data, dict) else []
        dist = (data.get("distributedInfo") or {}) if isinstance(data, dict) else {}
        # attnswitch's own ranges are user annotations, whichever category the profiler filed them
        # under (the fast C++ range used for modules comes out as "cpu_op")
        events = []
        add = events.append
        for e in raw:
            if e.get("ph") != "X":
                continue
            name, cat = e["name"], e.get("cat", "")
            if cat in _CPU_CATS and name.startswith(_OWN):
                cat = "user_annotation"
            add(Event(name, cat, e.get("pid"), e.get("tid"), float(e["ts"]), float(e.get("dur", 0.0)),
                      e.get("args") or _NO_ARGS))
        trace = cls(events, props, source, dist)
        trace._resolve()
        return trace

    # ----------------------------------------------------------------------------------------
    @property
    def device_events(self) -> list[Event]:
        return [e for e in self.events if e.cat in DEVICE_KINDS]

    @property
    def launches(self) -> list[Event]:
        return [e for e in self.events if e.cat in _LAUNCH_CATS]

    @property
    def devices(self) -> list[int]:
        """GPU indices that ran device events in this trace."""
        return sorted({e.device for e in self.events if e.cat in DEVICE_KINDS and e.device is not None})

    def ranges(self, prefix: str) -> list[Event]:
        return [e for e in self.events if e.cat == "user_annotation" and e.name.startswith(prefix)]

    def steps(self) -> list[Event]:
        return [e for e in self.events if e.cat == "user_annotation" and e.name.startswith(_STEPS)]

    # ----------------------------------------------------------------------------------------
    def _resolve(self) -> None:
        # 1. CPU side: a sweep per thread over events sorted by start (longest first on ties) keeps the
        #    stack of enclosing events; each event inherits its innermost ranges. Threads that ran
        #    backward functions are swept again once every forward op's place is known.
        by_thread: dict[tuple, list[Event]] = {}
        for e in self.events:
            if e.cat in _RANGE_CATS or e.cat in _LAUNCH_CATS:
                by_thread.setdefault((e.pid, e.tid), []).append(e)
        for evs in by_thread.values():
            evs.sort(key=lambda e: (e.ts, -e.dur))
            _sweep(evs, None)
        forward = _forward_places(self.events)
        if forward:
            for evs in by_thread.values():
                if any(e.name.startswith(_BACKWARD) for e in evs):
                    _sweep(evs, forward)
        # 2. device side: correlation id -> the launching call (runtime or driver API)
        launch_by_corr = {e.args.get("correlation"): e for e in self.events if e.cat in _LAUNCH_CATS}
        for e in self.events:
            if e.cat in DEVICE_KINDS:
                launch = launch_by_corr.get(e.args.get("correlation"))
                e.launch = launch
                if launch is not None:
                    e.module, e.attention, e.step, e.op = launch.module, launch.attention, launch.step, launch.op
                    e.phase = launch.phase


def _forward_places(events: list[Event]) -> dict[tuple, tuple]:
    """``(pid, sequence number)`` -> ``(module, attention, step, phase)`` of the forward op that recorded
    that autograd node: the last op carrying the number (ops record the counter as they start; the one
    that makes the node is the last before the counter moves)."""
    places: dict[tuple, tuple] = {}
    for e in sorted((e for e in events if e.cat == "cpu_op" and _SEQ in e.args and not e.name.startswith(_BACKWARD)
                     and e.phase != "backward"), key=lambda e: e.ts):
        places[(e.pid, e.args[_SEQ])] = (e.module, e.attention, e.step, e.phase)
    return places


def _enter(e: Event, parent: Event | None) -> None:
    if parent is not None:
        e.module, e.attention, e.step, e.op = parent.module, parent.attention, parent.step, parent.op
        e.phase = parent.phase
        e.parent_is_op = parent.cat == "cpu_op" or parent.parent_is_op
    if e.cat == "user_annotation":
        if e.name.startswith(MODULE_PREFIX):
            e.module, e.attention = e.name[len(MODULE_PREFIX):], None
        elif e.name.startswith(ATTENTION_PREFIX):
            e.attention = e.name[len(ATTENTION_PREFIX):]
        elif e.name.startswith(_STEPS):
            e.step = e.name.split(":", 1)[1] if e.name.startswith(OLD_STEP_PREFIX) else e.name[len(STEP_PREFIX):]
        elif e.name.startswith(PHASE_PREFIX):
            e.phase = e.name[len(PHASE_PREFIX):]
    elif e.cat == "cpu_op":
        if e.op is None:
            e.op = e.name
        if e.name.startswith(_BACKWARD):
            e.phase = "backward"  # its place is set once the forward ops' places are known


def _sweep(evs: list[Event], forward: dict | None) -> None:
    stack: list[Event] = []
    last_backward: tuple | None = None
    for e in evs:
        while stack and stack[-1].end + _EPS < e.end:
            stack.pop()
        _enter(e, stack[-1] if stack else None)
        if forward is not None and e.name.startswith(_BACKWARD) and not e.parent_is_op:
            place = forward.get((e.pid, e.args.get(_SEQ))) if _SEQ in e.args else last_backward
            if place is not None:
                e.module, e.attention, e.step = place[0], place[1], place[2]
                e.phase = "backward"
                last_backward = place
        stack.append(e)
