"""Attribution of a parsed trace to model layers: functions over a ``Trace``.

Every device event goes to the innermost module range around the call that launched it (found by
correlation id, then by nesting on the launching thread), or to the attention call's own row when
it was launched inside one. Events launched outside any module go to ``(outside modules)``. Nothing
is dropped: the rows add up to the trace's own totals.
"""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import dataclass, field

from ..instrument import ATTENTION_PREFIX, MODULE_PREFIX
from .occupancy import DeviceLimits, occupancy
from .trace import DEVICE_KINDS, Event, Trace, is_collective_op

__all__ = ["OUTSIDE", "Row", "StepTotals", "DeviceTotals", "TransferRow", "attribute", "step_totals",
           "device_totals", "transfers", "kernel_summaries"]

OUTSIDE = "(outside modules)"
ATTENTION_SUFFIX = " [attention]"


@dataclass
class Row:
    """One layer (module path) or one attention call site; sums over the steps it was built from."""

    path: str
    kind: str  # "module", "attention" or "outside"
    phase: str | None = None  # "prefill"/"decode" in a generate, "backward" for autograd's work; None: forward
    calls: int = 0  # ranges (module or attention calls)
    kernels: int = 0
    memcpys: int = 0
    memsets: int = 0
    gpu_us: float = 0.0  # device time of the events attributed here (self, not children)
    host_us: float = 0.0  # CPU time inside its ranges (inclusive); backward and outside modules: its top-level ops
    ops: int = 0  # outermost CPU ops attributed here (self)
    op_names: Counter = field(default_factory=Counter)
    kernel_names: Counter = field(default_factory=Counter)
    launch_apis: Counter = field(default_factory=Counter)
    comm_kernels: int = 0  # collective kernels (NCCL) among ``kernels``
    comm_us: float = 0.0  # their device time, part of ``gpu_us``
    comm_ops: int = 0  # collectives issued (their ``c10d::`` CPU op, at any depth)
    devices: Counter = field(default_factory=Counter)  # GPU index -> device events that ran there
    folded: int = 1  # layers folded into this row

    _SUMS = ("calls", "kernels", "memcpys", "memsets", "gpu_us", "host_us", "ops", "comm_kernels", "comm_us",
             "comm_ops")
    _COUNTERS = ("op_names", "kernel_names", "launch_apis", "devices")

    def scaled(self, factor: float) -> Row:
        r = Row(self.path, self.kind, self.phase, folded=self.folded)
        for k in self._SUMS:
            setattr(r, k, getattr(self, k) * factor)
        for k in self._COUNTERS:
            setattr(r, k, Counter({n: c * factor for n, c in getattr(self, k).items()}))
        return r

    def add(self, other: Row) -> None:
        for k in self._SUMS:
            setattr(self, k, getattr(self, k) + getattr(other, k))
        for k in self._COUNTERS:
            getattr(self, k).update(getattr(other, k))


Key = tuple[str, str, "str | None"]


def _row_key(e: Event) -> Key:
    if e.attention is not None:
        return e.attention, "attention", e.phase
    if e.module is not None:
        return e.module, "module", e.phase
    return OUTSIDE, "outside", e.phase


def attribute(trace: Trace, steps: set[str] | None = None) -> dict[Key, Row]:
    """Rows keyed by ``(path, kind, phase)``, summed over the given steps (all events when ``steps`` is
    None)."""
    rows: dict[Key, Row] = {}

    def row(key):
        r = rows.get(key)
        if r is None:
            r = rows[key] = Row(*key)
        return r

    def wanted(e: Event) -> bool:
        return steps is None or e.step in steps

    for e in trace.events:
        if not wanted(e):
            continue
        kind = e.kind
        if kind is not None:
            r = row(_row_key(e))
            r.gpu_us += e.dur
            if e.device is not None:
                r.devices[e.device] += 1
            if kind == "kernel":
                r.kernels += 1
                r.kernel_names[e.name] += 1
                if e.collective:
                    r.comm_kernels += 1
                    r.comm_us += e.dur
            elif kind == "memcpy":
                r.memcpys += 1
                r.kernel_names[e.name] += 1
            else:
                r.memsets += 1
                r.kernel_names[e.name] += 1
            if e.launch is not None:
                r.launch_apis[e.launch.name] += 1
        elif e.cat == "user_annotation":
            if e.name.startswith(MODULE_PREFIX):
                r = row((e.module, "module", e.phase))
                r.calls += 1
                r.host_us += e.dur
            elif e.name.startswith(ATTENTION_PREFIX):
                r = row((e.attention, "attention", e.phase))
                r.calls += 1
                r.host_us += e.dur
        elif e.cat == "cpu_op":
            if not e.parent_is_op:
                r = row(_row_key(e))
                r.ops += 1
                r.op_names[e.name] += 1
                # no ranges in the backward, nor outside every module: there, the ops' own time (it read 0 outside
                # modules, where a generate spends a third of its host time between forwards)
                if e.phase == "backward" or r.kind == "outside":
                    r.host_us += e.dur
            if is_collective_op(e.name):  # at any depth (DTensor issues them inside its own ops)
                row(_row_key(e)).comm_ops += 1
    return rows


@dataclass(frozen=True)
class StepTotals:
    step: str
    host_us: float  # the step range on the CPU
    kernels: int
    memcpys: int
    memsets: int
    gpu_busy_us: float  # sum of device event durations
    gpu_span_us: float  # first device event start to last end
    ops: int


def step_totals(trace: Trace) -> list[StepTotals]:
    """Totals per step, straight from the event list (the reference the rows must add up to)."""
    dev: dict[str | None, list[Event]] = {}
    ops: Counter = Counter()
    for e in trace.events:
        if e.cat in DEVICE_KINDS:
            dev.setdefault(e.step, []).append(e)
        elif e.cat == "cpu_op" and not e.parent_is_op:
            ops[e.step] += 1
    out = []
    for s in trace.steps():
        evs = dev.get(s.step, [])
        kinds = Counter(e.kind for e in evs)
        span = (max(e.end for e in evs) - min(e.ts for e in evs)) if evs else 0.0
        out.append(StepTotals(s.step, s.dur, kinds["kernel"], kinds["memcpy"], kinds["memset"],
                              sum(e.dur for e in evs), span, ops[s.step]))
    return out


@dataclass(frozen=True)
class DeviceTotals:
    """One GPU's events in one step, straight from the event list."""

    step: str
    device: int
    kernels: int
    memcpys: int
    memsets: int
    comm_kernels: int
    gpu_busy_us: float
    comm_us: float
    gpu_span_us: float


def device_totals(trace: Trace) -> list[DeviceTotals]:
    """Totals per step and GPU (the reference the per-device columns must add up to)."""
    groups: dict[tuple[str | None, int | None], list[Event]] = {}
    for e in trace.events:
        if e.cat in DEVICE_KINDS:
            groups.setdefault((e.step, e.device), []).append(e)
    out = []
    for s in trace.steps():
        for dev in sorted({d for (st, d) in groups if st == s.step and d is not None}):
            evs = groups[(s.step, dev)]
            kinds = Counter(e.kind for e in evs)
            comm = [e for e in evs if e.collective]
            out.append(DeviceTotals(s.step, dev, kinds["kernel"], kinds["memcpy"], kinds["memset"], len(comm),
                                    sum(e.dur for e in evs), sum(e.dur for e in comm),
                                    max(e.end for e in evs) - min(e.ts for e in evs)))
    return out


@dataclass
class TransferRow:
    """Copies between two GPUs at one layer boundary: launched inside ``into`` (the module whose inputs
    moved, where accelerate's hook runs), after ``after`` (the last module to finish before it)."""

    after: str
    into: str
    src: int
    dst: int
    copies: int = 0
    bytes: int = 0
    gpu_us: float = 0.0


def transfers(trace: Trace, steps: set[str] | None = None) -> list[TransferRow]:
    """Every copy between two GPUs, grouped by the layer boundary and direction where it happened."""
    import bisect

    ends: dict[tuple, tuple[list[float], list[Event]]] = {}
    by_thread: dict[tuple, list[Event]] = {}
    for e in trace.events:
        if e.cat == "user_annotation" and e.name.startswith(MODULE_PREFIX):
            by_thread.setdefault((e.pid, e.tid), []).append(e)
    for key, evs in by_thread.items():
        evs.sort(key=lambda e: e.end)
        ends[key] = ([e.end for e in evs], evs)
    rows: dict[tuple, TransferRow] = {}
    for e in trace.events:
        peer = e.peer
        if peer is None or (steps is not None and e.step not in steps):
            continue
        into = e.module or OUTSIDE
        after = "(start)"
        if e.launch is not None:
            t, evs = ends.get((e.launch.pid, e.launch.tid), ([], []))
            i = bisect.bisect_right(t, e.launch.ts) - 1
            if i >= 0:
                after = evs[i].name[len(MODULE_PREFIX):]
        key = (after, into, *peer)
        r = rows.get(key)
        if r is None:
            r = rows[key] = TransferRow(after, into, *peer)
        r.copies += 1
        r.bytes += int(e.args.get("bytes", 0))
        r.gpu_us += e.dur
    return list(rows.values())


@dataclass(frozen=True)
class KernelSummary:
    name: str
    count: int
    median_us: float
    launch_api: str | None
    grid: tuple | None
    block: tuple | None
    registers_per_thread: int | None
    shared_memory: int | None
    profiler_occupancy_pct: float | None  # the profiler's estimate, as it reported it
    occupancy_pct: float | None  # recomputed theoretical occupancy
    occupancy_limiter: str | None


def kernel_summaries(events: list[Event], limits: DeviceLimits | None) -> list[KernelSummary]:
    """One summary per distinct kernel name among ``events``, with recomputed occupancy."""
    by_name: dict[str, list[Event]] = {}
    for e in events:
        if e.kind == "kernel":
            by_name.setdefault(e.name, []).append(e)
    out = []
    for name, evs in by_name.items():
        a = evs[0].args
        block = tuple(a["block"]) if "block" in a else None
        regs, smem = a.get("registers per thread"), a.get("shared memory")
        occ = None
        if limits is not None and block and regs is not None and smem is not None:
            threads = 1
            for b in block:
                threads *= int(b)
            try:
                occ = occupancy(threads, int(regs), int(smem), limits)
            except ValueError:
                occ = None
        out.append(KernelSummary(
            name, len(evs), statistics.median(e.dur for e in evs), evs[0].launch.name if evs[0].launch else None,
            tuple(a["grid"]) if "grid" in a else None, block, regs, smem, a.get("est. achieved occupancy %"),
            round(occ.occupancy * 100, 1) if occ else None, occ.limiter if occ else None))
    return sorted(out, key=lambda k: -k.count * k.median_us)
