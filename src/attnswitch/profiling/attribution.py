"""Attribution of a parsed trace to model layers: functions over a ``Trace``.

Every device event goes to the innermost module range around the call that launched it (found by
correlation id, then by nesting on the launching thread), or to the attention call's own row when
it was launched inside one. Events launched outside any module go to ``(outside modules)``. Nothing
is dropped: the rows add up to the trace's own totals.
"""

from __future__ import annotations

import re
import statistics
from collections import Counter
from dataclasses import dataclass, field

from .occupancy import DeviceLimits, occupancy
from .trace import DEVICE_KINDS, Event, Trace

__all__ = ["OUTSIDE", "Row", "StepTotals", "attribute", "step_totals", "fold", "kernel_summaries"]

OUTSIDE = "(outside modules)"
ATTENTION_SUFFIX = " [attention]"


@dataclass
class Row:
    """One layer (module path) or one attention call site; sums over the steps it was built from."""

    path: str
    kind: str  # "module", "attention" or "outside"
    calls: int = 0  # ranges (module or attention calls)
    kernels: int = 0
    memcpys: int = 0
    memsets: int = 0
    gpu_us: float = 0.0  # device time of the events attributed here (self, not children)
    host_us: float = 0.0  # CPU time inside its ranges (inclusive)
    ops: int = 0  # outermost CPU ops attributed here (self)
    op_names: Counter = field(default_factory=Counter)
    kernel_names: Counter = field(default_factory=Counter)
    launch_apis: Counter = field(default_factory=Counter)
    folded: int = 1  # layers folded into this row

    def scaled(self, factor: float) -> "Row":
        r = Row(self.path, self.kind, folded=self.folded)
        for k in ("calls", "kernels", "memcpys", "memsets", "gpu_us", "host_us", "ops"):
            setattr(r, k, getattr(self, k) * factor)
        for k in ("op_names", "kernel_names", "launch_apis"):
            setattr(r, k, Counter({n: c * factor for n, c in getattr(self, k).items()}))
        return r

    def add(self, other: "Row") -> None:
        for k in ("calls", "kernels", "memcpys", "memsets", "gpu_us", "host_us", "ops"):
            setattr(self, k, getattr(self, k) + getattr(other, k))
        for k in ("op_names", "kernel_names", "launch_apis"):
            getattr(self, k).update(getattr(other, k))


def _row_key(e: Event) -> tuple[str, str]:
    if e.attention is not None:
        return e.attention, "attention"
    if e.module is not None:
        return e.module, "module"
    return OUTSIDE, "outside"


def attribute(trace: Trace, steps: set[str] | None = None) -> dict[tuple[str, str], Row]:
    """Rows keyed by ``(path, kind)``, summed over the given steps (all events when ``steps`` is None)."""
    rows: dict[tuple[str, str], Row] = {}

    def row(key):
        r = rows.get(key)
        if r is None:
            r = rows[key] = Row(key[0], key[1])
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
            if kind == "kernel":
                r.kernels += 1
                r.kernel_names[e.name] += 1
            elif kind == "memcpy":
                r.memcpys += 1
                r.kernel_names[e.name] += 1
            else:
                r.memsets += 1
                r.kernel_names[e.name] += 1
            if e.launch is not None:
                r.launch_apis[e.launch.name] += 1
        elif e.cat == "user_annotation":
            if e.name.startswith("attnswitch.module:"):
                r = row((e.module, "module"))
                r.calls += 1
                r.host_us += e.dur
            elif e.name.startswith("attnswitch.attention:"):
                r = row((e.attention, "attention"))
                r.calls += 1
                r.host_us += e.dur
        elif e.cat == "cpu_op" and not e.parent_is_op:
            r = row(_row_key(e))
            r.ops += 1
            r.op_names[e.name] += 1
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


_INDEX = re.compile(r"\.(\d+)(?=\.|$)")


def fold(rows: list[Row]) -> list[Row]:
    """Fold repeated layers: ``model.layers.3.self_attn`` -> ``model.layers.*.self_attn`` (×n)."""
    folded: dict[tuple[str, str], Row] = {}
    for r in rows:
        key = (_INDEX.sub(".*", r.path), r.kind)
        f = folded.get(key)
        if f is None:
            f = folded[key] = Row(key[0], r.kind, folded=0)
        f.add(r)
        f.folded += 1
    return list(folded.values())


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
