"""How far each backend's attention calls are from what the GPU can do: useful work over the kernel time the
profiler measured, against the GPU's dense peak (a table of known GPUs) and against a practical ceiling
measured on the machine (a matmul and a copy, ``profiling/ceiling.py``).

- A **compute-bound** call (more than one query row): useful FLOPs over kernel time, as TFLOP/s. Useful FLOPs
  are the two matmuls, ``2 * pairs * (d_qk + d_v)`` per batch and query head (``4 * B * H * Sq * Sk * D`` for a
  dense call), counting only the (query, key) pairs that causal or sliding-window masking leaves; a
  backward does 2.5 times a forward's.
- A **memory-bound** call (one query row: a decode step): the bytes of K and V it reads (its key/value heads,
  the keys its window leaves) over kernel time, as TB/s.

Padding is not subtracted (a padded batch's useful work is counted as if every token were real), and a call
with an explicit mask counts the pairs its causal or window structure leaves, not the mask's own.

A leaf without torch: the shapes come from the profiled pass (``profiling/callshapes.py``), kernel times
from the attributed trace (``LayerStats`` rows of kind ``attention``), the ceiling from the report's settings.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

__all__ = ["AttnShape", "PeakFigure", "GpuSpec", "GPUS", "gpu_spec", "pairs", "call_flops", "kv_bytes",
           "figures", "primary", "headroom", "BACKWARD_FACTOR", "ITEMSIZE"]

#: a backward's FLOPs over its forward's (dQ, dK, dV and the recomputed scores: five matmuls to two)
BACKWARD_FACTOR = 2.5
ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2, "float8_e4m3fn": 1, "float8_e5m2": 1, "float64": 8}


@dataclass(frozen=True)
class AttnShape:
    """The attention calls of one call site as they ran in the profiled pass (one-row calls, a generate's
    decode steps, apart from the others). ``calls``: per profiled step; ``kv_len``: the longest key length the
    kernel was given, ``kv_len_min`` the shortest (they differ for decode steps); ``causal``: the call's causal
    structure (bottom-right aligned, as a cache's; ``top_left``: SDPA's own ``is_causal`` on a bare call with
    fewer queries than keys); ``window``: a sliding window of that many keys; ``mask``: an explicit mask tensor
    was passed; ``flops`` and ``kv_bytes``: per call, the mean over its calls."""

    site: str
    calls: float
    batch: int
    heads: int
    kv_heads: int
    q_len: int
    kv_len: int
    kv_len_min: int
    head_dim: int
    v_dim: int
    dtype: str
    causal: bool
    window: int | None = None
    mask: bool = False
    top_left: bool = False
    flops: float = 0.0
    kv_bytes: float = 0.0

    @property
    def one_row(self) -> bool:
        """A decode step's call: one query row, bound by reading K and V."""
        return self.q_len == 1


def _sum_min(a: int, b: int, w: int | None) -> int:
    """``sum(min(x, w) for x in range(a, b + 1))`` for ``1 <= a``, in closed form (``w`` None: no cap)."""
    if b < a:
        return 0
    if w is None or b <= w:
        return (a + b) * (b - a + 1) // 2
    if a >= w:
        return w * (b - a + 1)
    return (a + w) * (w - a + 1) // 2 + w * (b - w)


def pairs(q_len: int, kv_len: int, causal: bool, window: int | None = None, top_left: bool = False) -> int:
    """(query, key) pairs a call attends: every one, or those causal masking leaves (query ``i`` sees the keys
    up to its own position, ``kv_len - q_len + i`` bottom-right aligned, ``i`` top-left), within a sliding
    window of ``window`` keys (transformers': a key ``window`` or more positions back is hidden)."""
    if q_len <= 0 or kv_len <= 0:
        return 0
    if causal:
        offset = 0 if top_left else kv_len - q_len
        lo, hi = offset + 1, offset + q_len  # keys seen by the first and the last query, before clipping
        seen = _sum_min(max(lo, 1), min(hi, kv_len), window)
        if hi > kv_len:  # queries past the last key (top-left, more queries than keys): the keys their window keeps
            rows = range(max(lo - 1, kv_len), hi)
            seen += len(rows) * kv_len if window is None else sum(
                min(kv_len, max(0, kv_len + window - 1 - p)) for p in rows[:window])
        return seen
    if window is None:
        return q_len * kv_len
    offset, total = kv_len - q_len, 0
    for i in range(q_len):  # a band both ways (bidirectional models with local attention): rare, and short
        p = offset + i
        total += max(0, min(kv_len - 1, p + window - 1) - max(0, p - window + 1) + 1)
    return total


def call_flops(batch: int, heads: int, q_len: int, kv_len: int, head_dim: int, v_dim: int, causal: bool,
               window: int | None = None, top_left: bool = False) -> float:
    """Useful FLOPs of one forward call: ``q @ kᵀ`` and ``p @ v`` over the pairs it attends."""
    return 2.0 * batch * heads * pairs(q_len, kv_len, causal, window, top_left) * (head_dim + v_dim)


def kv_bytes(batch: int, kv_heads: int, kv_len: int, head_dim: int, v_dim: int, dtype: str,
             window: int | None = None) -> float:
    """Bytes of K and V one query row reads: its key/value heads (not repeated), the keys its window leaves."""
    keys = min(kv_len, window) if window else kv_len
    return float(batch * kv_heads * keys * (head_dim + v_dim) * ITEMSIZE.get(dtype, 2))


@dataclass(frozen=True)
class GpuSpec:
    """A GPU's published dense peak (TFLOP/s, without sparsity) per dtype, and its memory bandwidth (TB/s)."""

    name: str
    pattern: str  # matched against torch.cuda.get_device_name (case-insensitive)
    tflops: Mapping[str, float]
    tbps: float


def _spec(name: str, pattern: str, half: float, fp32: float | None, tbps: float) -> GpuSpec:
    t = {"bfloat16": half, "float16": half}
    if fp32 is not None:
        t["float32"] = fp32  # the FMA units' (no TF32): what an fp32 attention's matmuls run on
    return GpuSpec(name, pattern, t, tbps)


#: known GPUs, the first whose pattern matches (most specific first); dense tensor-core peaks from the
#: vendors' datasheets (SXM parts unless named)
GPUS: tuple[GpuSpec, ...] = (
    _spec("H200 NVL", r"H200 NVL", 835.0, 60.0, 4.8),
    _spec("H200", r"H200", 989.4, 66.9, 4.8),
    _spec("H100 NVL", r"H100 NVL", 835.0, 60.0, 3.9),
    _spec("H100 PCIe", r"H100 PCIe", 756.0, 51.2, 2.0),
    _spec("H100", r"H100", 989.4, 66.9, 3.35),
    _spec("B200", r"B200", 2250.0, None, 8.0),
    _spec("A100 80GB PCIe", r"A100.*80GB.*PCIe|A100.*PCIe.*80GB", 312.0, 19.5, 1.935),
    _spec("A100 40GB PCIe", r"A100.*PCIE", 312.0, 19.5, 1.555),
    _spec("A100 80GB", r"A100.*80GB", 312.0, 19.5, 2.039),
    _spec("A100 40GB", r"A100", 312.0, 19.5, 1.555),
    _spec("L40S", r"L40S", 362.05, 91.6, 0.864),
    _spec("L4", r"\bL4\b", 121.0, 30.3, 0.3),
    _spec("A10", r"\bA10\b", 125.0, 31.2, 0.6),
    _spec("RTX 4090", r"RTX 4090", 165.2, 82.6, 1.008),
)


def gpu_spec(name: str | None) -> GpuSpec | None:
    """The spec of a GPU named as CUDA names it (``NVIDIA H200``), or None where it is not in ``GPUS``."""
    if not name:
        return None
    return next((g for g in GPUS if re.search(g.pattern, name, re.IGNORECASE)), None)


@dataclass(frozen=True)
class PeakFigure:
    """One backend's attention calls of one phase against the GPU's peak. ``phase``: ``forward`` (a prefill or
    training forward), ``prefill`` and ``decode`` (a generate's), ``backward``; ``bound``: ``compute``
    (``achieved`` in TFLOP/s) or ``memory`` (TB/s); ``calls``: attention calls per step; ``kernel_us``: kernel
    time per call (the profiler's); ``spec``: the GPU's dense peak for the dtype (TFLOP/s) or its memory
    bandwidth (TB/s), None where the GPU is not in the table; ``measured``: the practical ceiling measured on
    the machine (a matmul's TFLOP/s, a copy's TB/s); ``pct_spec``, ``pct_measured``: ``achieved`` as a % of
    each. ``layer_kind``: the layer kind the figure is of (None: every layer)."""

    phase: str
    bound: str
    calls: float
    kernel_us: float
    achieved: float
    unit: str
    dtype: str
    spec: float | None = None
    measured: float | None = None
    pct_spec: float | None = None
    pct_measured: float | None = None
    layer_kind: str | None = None


def _pct(x: float, of: float | None) -> float | None:
    return 100.0 * x / of if of else None


def _phase_name(row_phase: str | None, one_row: bool) -> str:
    if row_phase == "backward":
        return "backward"
    if one_row:
        return "decode"
    return "prefill" if row_phase == "prefill" else "forward"


def _shapes_for(shapes: list[AttnShape], row_phase: str | None) -> list[AttnShape]:
    """The recorded shapes a trace row's kernels ran: a decode row's one-row calls, a prefill's (and a
    backward's) the others, a plain forward's all of them."""
    if row_phase == "decode":
        return [s for s in shapes if s.one_row]
    if row_phase in ("prefill", "backward"):
        return [s for s in shapes if not s.one_row] or shapes
    return shapes


def _site_work(shapes: list[AttnShape], backward: bool) -> tuple[float, float, float, bool]:
    """``(calls, flops per call, bytes per call, one-row)`` of a site's recorded shapes, weighted by calls."""
    calls = sum(s.calls for s in shapes)
    if not calls:
        return 0.0, 0.0, 0.0, False
    flops = sum(s.calls * s.flops for s in shapes) / calls * (BACKWARD_FACTOR if backward else 1.0)
    moved = sum(s.calls * s.kv_bytes for s in shapes) / calls
    return calls, flops, moved, all(s.one_row for s in shapes)


def _ceiling_for(ceiling: Mapping | None, dtype: str, bound: str) -> float | None:
    if not ceiling:
        return None
    if bound == "memory":
        return ceiling.get("copy_tbps")
    return ceiling.get("matmul_tflops") if ceiling.get("dtype") == dtype else None


def figures(layers: Iterable, shapes: Iterable[AttnShape], gpu: str | None, ceiling: Mapping | None,
            kind_of_site: Callable[[str], str | None] | None = None) -> tuple[PeakFigure, ...]:
    """Each phase's figure (and each layer kind's, where ``kind_of_site`` names them) from the attention rows
    of ``layers`` (per step: their calls and kernel time) and the shapes recorded per call site. Rows without
    kernel time (a CPU's) or without a recorded shape give none. ``ceiling``: the report's measured one."""
    by_site: dict[str, list[AttnShape]] = {}
    for s in shapes:
        by_site.setdefault(s.site, []).append(s)
    forward_calls = {(x.path, x.phase): x.calls for x in layers if x.kind == "attention" and x.phase != "backward"}
    groups: dict[tuple, list[float]] = {}  # (phase, bound, dtype, kind) -> [calls, kernel us, flops, bytes]
    for x in layers:
        site = by_site.get(x.path)
        if x.kind != "attention" or not site or x.gpu_us <= 0:
            continue
        backward = x.phase == "backward"
        calls, flops, moved, one_row = _site_work(_shapes_for(site, x.phase), backward)
        n = x.calls if not backward else sum(c for (p, _), c in forward_calls.items() if p == x.path)
        if not calls or not n:
            continue
        bound = "memory" if one_row and not backward else "compute"
        key = (_phase_name(x.phase, one_row), bound, site[0].dtype, kind_of_site(x.path) if kind_of_site else None)
        g = groups.setdefault(key, [0.0, 0.0, 0.0, 0.0])
        g[0] += n
        g[1] += x.gpu_us
        g[2] += n * flops
        g[3] += n * moved
    spec = gpu_spec(gpu)
    out = []
    for (phase, bound, dtype, kind), (n, us, flops, moved) in groups.items():
        seconds = us * 1e-6
        achieved = (flops if bound == "compute" else moved) / seconds / 1e12
        peak = (spec.tflops.get(dtype) if bound == "compute" else spec.tbps) if spec is not None else None
        measured = _ceiling_for(ceiling, dtype, bound)
        out.append(PeakFigure(phase, bound, n, us / n, achieved, "TFLOP/s" if bound == "compute" else "TB/s", dtype,
                              peak, measured, _pct(achieved, peak), _pct(achieved, measured), kind))
    order = {"forward": 0, "prefill": 1, "decode": 2, "backward": 3}
    return tuple(sorted(out, key=lambda f: (order.get(f.phase, 4), f.layer_kind or "")))


def primary(figs: Iterable[PeakFigure]) -> PeakFigure | None:
    """The figure of the phase that takes the most kernel time per step (the one a headroom line names)."""
    figs = [f for f in figs if f.layer_kind is None]
    return max(figs, key=lambda f: f.calls * f.kernel_us, default=None)


def _pct_text(f: PeakFigure) -> str | None:
    pct = f.pct_spec if f.pct_spec is not None else f.pct_measured
    return None if pct is None else f"{pct:.0f} %"


def headroom(backends: Iterable, gpu: str | None = None) -> str | None:
    """One line naming how far the backends' attention calls are from the GPU's peak, in the order given
    (``cudnn`` reaches 56 % of peak here; ``flash`` 31 %), from each one's ``attn_peak``; None where none has
    a figure."""
    said = []
    for b in backends:
        f = primary(getattr(b, "attn_peak", ()) or ())
        pct = _pct_text(f) if f is not None else None
        if pct is not None:
            said.append((b.backend, f, pct))
    if not said:
        return None
    name, f, pct = said[0]
    of = "peak" if f.pct_spec is not None else "the measured ceiling"
    amount = f"{f.achieved:.0f}" if f.achieved >= 100 else f"{f.achieved:.2g}"
    if f.spec is not None:
        spec = gpu_spec(gpu)
        whose = f"the {spec.name}'s " if spec is not None else ""
        what = (f"{amount} of {whose}{f.spec:g} dense {_short(f.dtype)} TFLOP/s" if f.bound == "compute" else
                f"{amount} of {whose}{f.spec:g} TB/s")
    else:
        what = f"{amount} {f.unit}"
    if f.pct_measured is not None and f.pct_spec is not None:
        what += f"; {f.pct_measured:.0f} % of the {'matmul' if f.bound == 'compute' else 'copy'} measured here"
    head = f"Headroom: `{name}` reaches {pct} of {of} here in its {f.phase} attention calls ({what})"
    rest = [f"`{n}` {p}" + (f" ({g.phase})" if g.phase != f.phase else "") for n, g, p in said[1:]]
    return head + ("; " + ", ".join(rest) if rest else "") + "."


def _short(dtype: str) -> str:
    return {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}.get(dtype, dtype)
