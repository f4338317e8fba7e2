"""What each plot shows, as chart data (``Bars``/``Lines``), not drawings: ``plots`` draws them.

The report charts take the backends' results in the order to show them, and return ``None`` where the run
has no such data (a CPU run has no device time), so no empty plot is ever drawn. The workload charts
(generation steps, training steps, sequence-length sweeps) take plain sequences, for sections of reports
that carry such data.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ..stats import bracket_label, margin_coverages
from .document import Bars, Lines, has_data

__all__ = ["LAYER_KINDS", "layer_kind", "ranking_chart", "time_by_kind_chart", "attention_time_chart",
           "host_cost_chart", "numerics_chart", "step_time_chart", "train_time_chart", "sweep_chart"]

LAYER_KINDS = ("attention call", "attention module (rest)", "mlp", "other", "outside modules",
               "collectives (incl. waiting)")


def layer_kind(path: str, kind: str) -> str:
    """Which part of a forward a layer row is: the attention call, the rest of its module, mlp, ..."""
    if kind == "attention":
        return "attention call"
    if kind == "outside":
        return "outside modules"
    leaf = path.rsplit(".", 1)[-1]
    if "attn" in leaf or "attention" in leaf:
        return "attention module (rest)"
    if "mlp" in path or "ffn" in path or "feed_forward" in path:
        return "mlp"
    return "other"


def _kept(bars: Bars) -> Bars | None:
    """The chart without its all-empty series, or ``None`` when nothing is left to draw."""
    series = tuple((k, v) for k, v in bars.series if any(x for x in v))
    out = Bars(bars.title, bars.categories, series, bars.y_label, bars.stacked, bars.log, bars.limit,
               bars.limit_label, bars.annotate, bars.errors)
    return out if has_data(out) else None


def ranking_chart(backends, pick: str | None, ties, unit: str = "per forward") -> Bars | None:
    """The ranked time, as the summary's ``vs pick`` column has it: each backend's median paired ratio to the
    pick with its 95 % interval, the pick and the backends tied with it apart from those told apart."""
    ranked = [b for b in backends if b.ok and b.margin is not None]
    if pick is None or len(ranked) < 2:
        return None
    names = tuple(b.backend for b in ranked)

    def group(b) -> str:
        if b.backend == pick or b.backend in ties:
            return "tied"
        if b.backend == "eager":
            return "eager"
        # not tied, yet its interval against the pick holds 1: slower than one tied with it (or, at a sweep's last
        # shape, against the sweep's pick: faster there)
        return "apart" if b.margin.low > 1 else "faster" if b.margin.high < 1 else "behind"

    groups = [group(b) for b in ranked]
    errors = tuple(None if b.backend == pick else (b.margin.low, b.margin.high) for b in ranked)
    labels = (("tied", "the pick and those tied with it"), ("apart", "told apart (slower)"),
              ("behind", "slower than one tied with the pick"), ("faster", "faster here"),
              ("eager", "eager (the reference)"))
    series = tuple((label, tuple(b.margin.ratio if g == key else None for g, b in zip(groups, ranked)))
                   for key, label in labels)
    return _kept(Bars(f"Time {unit} against the pick ({pick})", names, series,
                      f"× the pick's time ({bracket_label(margin_coverages(ranked, pick))})", stacked=True,
                      limit=(1.0,) * len(names), limit_label="the pick", errors=errors))


def _device_kinds(ok) -> tuple:
    series = []
    for k in LAYER_KINDS:
        if k.startswith("collectives"):  # NCCL kernels, wherever issued (tensor parallelism)
            vals = [sum(x.comm_us for x in b.layers) / 1e3 for b in ok]
        else:
            vals = [sum(x.gpu_us - x.comm_us for x in b.layers if layer_kind(x.path, x.kind) == k) / 1e3 for b in ok]
        series.append((k, tuple(vals)))
    return tuple(series)


def time_by_kind_chart(backends, step: str = "forward") -> Bars | None:
    """Device time per step (a ``forward``, a ``training step``: what the profiled pass ran once) split by
    layer kind; on a CPU, one step's host time: its attention calls against the rest of it."""
    ok = [b for b in backends if b.ok]
    names = tuple(b.backend for b in ok)
    if any(b.profiled_gpu_busy_ms for b in ok):
        n_gpus = len({(d.rank, d.device) for b in ok for d in b.devices})
        y = f"GPU ms per {step}" + (f" (sum of {n_gpus} GPUs)" if n_gpus > 1 else "")
        return _kept(Bars(f"Time per {step}, by layer kind", names, _device_kinds(ok), y, stacked=True))
    # one measured step's own parts (its attention calls, the rest of it): never a part above its whole; a
    # compiled candidate's calls are not timed one by one, so it has no split to draw
    ok = [b for b in ok if b.host_attn_ms is not None]
    if not ok:
        return None
    names = tuple(b.backend for b in ok)
    attn = [b.host_attn_ms for b in ok]
    rest = [max((b.host_ms or 0.0) - a, 0.0) for a, b in zip(attn, ok)]
    series = (("attention calls", tuple(attn)), (f"rest of the {step}", tuple(rest)))
    return _kept(Bars(f"Host time per {step}: attention calls and the rest", names, series, f"host ms per {step}",
                      stacked=True))


def attention_time_chart(backends) -> Bars | None:
    """Device time of one attention call (its kernels), per backend."""
    ok = [b for b in backends if b.ok]
    vals = tuple(b.attn_gpu_us_per_call for b in ok)
    return _kept(Bars("Attention: device time per call", tuple(b.backend for b in ok), (("GPU", vals),),
                      "GPU µs per attention call", annotate=True))


def host_cost_chart(backends) -> Bars | None:
    """Host time per attention call, the first at this shape (plans, compiles) against the steady median."""
    ok = [b for b in backends if b.ok]
    series = (("cold (first call at this shape)", tuple(b.attn_cold_host_us for b in ok)),
              ("steady (median)", tuple(b.attn_host_us for b in ok)))
    return _kept(Bars("Attention: host time per call, cold and steady", tuple(b.backend for b in ok), series,
                      "host µs per attention call (log)", log=True))


def numerics_chart(backends) -> Bars | None:
    """Max relative error of each backend's output against the reference, with the tolerance."""
    checked = [b for b in backends if b.ok and b.numerics is not None]
    if not checked:
        return None
    errors = tuple(b.numerics.max_rel_err for b in checked)
    limits = tuple(b.numerics.tolerance for b in checked)
    positive = [v for v in errors + limits if v and v > 0]
    log = bool(positive) and max(positive) / min(positive) > 50  # errors far below the tolerance stay visible
    return Bars("Numerics: max relative error against the reference", tuple(b.backend for b in checked),
                (("max relative error", errors),), "max relative error" + (" (log)" if log else ""), log=log,
                limit=limits, limit_label="tolerance", annotate=True)


# -- charts of other workloads, from plain sequences ----------------------------------------------

def step_time_chart(series: Mapping[str, Sequence[float]], title: str = "Generation: time per step") -> Lines:
    """Time of each generation step (ms) against its index, one line per backend: the first steps
    carry per-shape costs, later ones grow with the cache."""
    return Lines(title, "step", "ms per step",
                 tuple((name, tuple((float(i), float(t)) for i, t in enumerate(times, 1)))
                       for name, times in series.items()))


def train_time_chart(backends: Sequence[str], forward_ms: Sequence[float | None],
                     backward_ms: Sequence[float | None], title: str = "Training: time per step") -> Bars:
    """Forward and backward time of one training step per backend, stacked."""
    return Bars(title, tuple(backends), (("forward", tuple(forward_ms)), ("backward", tuple(backward_ms))),
                "ms per training step", stacked=True)


def sweep_chart(series: Mapping[str, Sequence[tuple[float, float]]], x_label: str = "sequence length",
                title: str = "Time per forward against sequence length", unit: str = "forward") -> Lines:
    """``(x, ms)`` points per backend over a sweep (sequence length, batch), ``unit`` what each is the time of:
    log-log, so a quadratic cost is a straight line of slope 2."""
    return Lines(title, x_label, f"ms per {unit}",
                 tuple((name, tuple(sorted((float(x), float(y)) for x, y in pts))) for name, pts in series.items()),
                 log_x=True, log_y=True)
