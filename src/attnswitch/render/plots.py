"""Drawing charts with matplotlib's object API: the caller's pyplot state and backend are untouched.

``bar_plot`` and ``line_plot`` take plain sequences; ``draw`` draws a chart block (``document.Bars`` or
``Lines``); ``svg`` and ``png_base64`` serialise a figure for a self-contained page.
"""

from __future__ import annotations

import base64
import functools
import io
import math
import re
import textwrap
from collections.abc import Mapping, Sequence

from .document import Bars, Chart, Lines

__all__ = ["bar_plot", "line_plot", "draw", "svg", "png_base64"]

_HEIGHT = 3.4  # inches; the width follows the number of bars


def _figure(width: float, height: float = _HEIGHT):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), layout="constrained")
    return fig, fig.add_subplot()


def _title(ax, title: str, legend: float) -> None:
    """``title`` over ``ax``, wrapped to the plot's width: the figure's less the legend's (``legend`` inches) and
    the y axis's labels (a long title over a narrow plot was clipped at both ends of the figure)."""
    width = ax.figure.get_figwidth() - legend - 0.9
    ax.set_title(textwrap.fill(title, max(24, int(width * 12)), break_long_words=False, break_on_hyphens=False),
                 fontsize=11)  # (a backend's name is never split)


def _num(v) -> float:
    return float("nan") if v is None or not math.isfinite(v) else float(v)


def _legend(ax, n: int) -> None:
    if n > 1:  # outside, on the right, so that it never hides a bar or a line
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)


def _value(v: float) -> str:
    """A bar's value, short: 4630, 94.3, 0.029, 6e-07."""
    if v == 0:
        return "0"
    if abs(v) >= 100:
        return f"{v:.0f}"
    return f"{v:.3g}" if abs(v) >= 1 else f"{v:.2g}"


def _labels(ax, categories: Sequence[str]) -> None:
    crowded = len(categories) > 4 or max((len(c) for c in categories), default=0) > 8
    ax.set_xticks(range(len(categories)), list(categories), rotation=30 if crowded else 0,
                  ha="right" if crowded else "center", rotation_mode="anchor", fontsize=9)


def _limit(ax, limit: Sequence[float | None], label: str) -> None:
    vals = [_num(v) for v in limit]
    known = [v for v in vals if not math.isnan(v)]
    if not known:
        return
    if all(v == known[0] for v in known):
        ax.axhline(known[0], color="0.3", linestyle="--", linewidth=1, label=label)
        return
    for i, v in enumerate(vals):
        ax.hlines(v, i - 0.45, i + 0.45, color="0.3", linestyle="--", linewidth=1, label=label if i == 0 else None)


def _errors(ax, xs, vals, errors) -> None:
    for x, v, e in zip(xs, vals, errors):
        if e is not None and not math.isnan(v):
            ax.errorbar([x], [v], yerr=[[v - e[0]], [e[1] - v]], fmt="none", ecolor="0.15", capsize=3, linewidth=1)


def bar_plot(title: str, categories: Sequence[str], series: Mapping[str, Sequence[float | None]], y_label: str, *,
             stacked: bool = False, log: bool = False, limit: Sequence[float | None] = (), limit_label: str = "",
             annotate: bool = False, errors: Sequence[tuple[float, float] | None] = ()):
    """Bars per category, grouped side by side (or ``stacked``); ``None`` values draw no bar; ``errors``: per
    category an interval drawn over whichever bar it has."""
    n, k = len(categories), max(len(series), 1)
    legend = 2.2 if k + (1 if limit else 0) > 1 else 0.0  # inches for a legend on the right
    fig, ax = _figure(min(12.0, max(5.5, 1.5 + legend + n * (0.55 if stacked else 0.3 + 0.25 * k))))
    if log:
        _log_axes(ax, (), False, True)
    width = 0.7 if stacked else 0.8 / k
    bottom = [0.0] * n
    for j, (label, values) in enumerate(series.items()):
        vals = [_num(v) for v in values]
        xs = [i if stacked else i - 0.4 + width * (j + 0.5) for i in range(n)]
        drawn = [v if not log or v > 0 else float("nan") for v in vals]  # a log axis has no zero
        bars = ax.bar(xs, drawn, width=width, bottom=bottom if stacked else None, label=label)
        if stacked:
            bottom = [b + (0.0 if math.isnan(v) else v) for b, v in zip(bottom, vals)]
        elif errors:
            _errors(ax, xs, vals, errors)
        if annotate:
            ax.bar_label(bars, labels=["" if math.isnan(v) else _value(v) for v in drawn], fontsize=7, padding=2)
            for x, v, d in zip(xs, vals, drawn):
                if math.isnan(d) and not math.isnan(v):  # an exact zero on a log axis: said at the bottom
                    ax.annotate(_value(v), (x, 0), xycoords=("data", "axes fraction"), ha="center",
                                va="bottom", fontsize=7, xytext=(0, 2), textcoords="offset points")
    if stacked and errors:  # over each stack's top
        _errors(ax, range(n), bottom, errors)
    if limit:
        _limit(ax, limit, limit_label)
    _labels(ax, categories)
    ax.set_ylabel(y_label)
    _title(ax, title, legend)
    ax.margins(y=0.12)
    _legend(ax, len(series) + (1 if limit else 0))
    return fig


@functools.cache
def _plain_log_class():
    from matplotlib.ticker import LogFormatterSciNotation

    class PlainLog(LogFormatterSciNotation):
        """A log axis's labels as plain numbers (``40``, ``0.5``, not ``4 × 10^1``) from 0.001 to 10⁵, on the
        ticks matplotlib labels; powers of ten beyond."""

        def __call__(self, x, pos=None):
            label = super().__call__(x, pos)
            return f"{x:g}" if label and 1e-3 <= abs(x) < 1e5 else label
    return PlainLog


def _plain_log(**kw):
    """A log axis's formatter of plain numbers (matplotlib imported only where a plot is drawn)."""
    return _plain_log_class()(**kw)


def _log_axes(ax, xs: Sequence[float], log_x: bool, log_y: bool) -> None:
    """Log axes labelled in plain numbers (not ``4 × 10^0``); a log x axis of a few lengths is ticked at the
    lengths measured (48 is one, where powers of 2 alone would leave it unlabelled)."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter, NullLocator

    plain = FuncFormatter(lambda v, _: f"{v:g}")
    if log_x:
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(plain)
        ax.xaxis.set_minor_formatter(NullFormatter())
        measured = sorted({float(x) for x in xs if x > 0})
        if 0 < len(measured) <= 12:
            ax.xaxis.set_major_locator(FixedLocator(measured))
            ax.xaxis.set_minor_locator(NullLocator())
    if log_y:
        ax.set_yscale("log")
        # matplotlib's own choice of which ticks to label (a range within a decade: its minor ticks too)
        ax.yaxis.set_major_formatter(_plain_log())
        ax.yaxis.set_minor_formatter(_plain_log(labelOnlyBase=False, minor_thresholds=(2, 0.4)))


def line_plot(title: str, x_label: str, y_label: str, series: Mapping[str, Sequence[tuple[float, float]]], *,
              log_x: bool = False, log_y: bool = False):
    """One line with markers per series through its ``(x, y)`` points."""
    legend = 2.2 if len(series) > 1 else 0.0
    fig, ax = _figure(7.5 + legend)
    for label, points in series.items():
        pts = sorted((x, y) for x, y in points if x is not None and y is not None)
        ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o", markersize=3, linewidth=1.5, label=label)
    xs = [x for points in series.values() for x, y in points if x is not None and y is not None]
    _log_axes(ax, xs, log_x, log_y)
    if not log_x and xs and all(float(x).is_integer() for x in xs):
        from matplotlib.ticker import MaxNLocator

        ax.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))  # (steps: no tick between two)
    ax.set_xlabel(x_label)
    ax.set_ylabel(y_label)
    _title(ax, title, legend)
    ax.grid(alpha=0.3)
    _legend(ax, len(series))
    return fig


def draw(chart: Chart):
    """The matplotlib figure of a chart block."""
    if isinstance(chart, Bars):
        return bar_plot(chart.title, chart.categories, dict(chart.series), chart.y_label, stacked=chart.stacked,
                        log=chart.log, limit=chart.limit, limit_label=chart.limit_label, annotate=chart.annotate,
                        errors=chart.errors)
    if isinstance(chart, Lines):
        return line_plot(chart.title, chart.x_label, chart.y_label, dict(chart.series), log_x=chart.log_x,
                         log_y=chart.log_y)
    raise TypeError(f"not a chart: {type(chart).__name__}")


def svg(fig, salt: str = "attnswitch") -> str:
    """The figure as an ``<svg>`` element to inline in HTML: text stays text, and ``salt`` (one per
    figure on a page) keeps its ids apart from the other figures' (matplotlib numbers every figure's
    ``figure_1``, ``axes_1``, ... alike): each id, and each reference to one, is prefixed with it."""
    import matplotlib

    buf = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": salt}):
        fig.savefig(buf, format="svg")
    text = buf.getvalue()
    text = re.sub(r"<metadata>.*?</metadata>", "", text[text.index("<svg"):], flags=re.S)
    prefix = re.sub(r"[^A-Za-z0-9_-]", "-", salt)
    ids = set(re.findall(r'\bid="([^"]+)"', text))
    return re.sub(r'(\bid="|url\(#|href="#)([^")]+)',
                  lambda m: m.group(1) + (f"{prefix}-{m.group(2)}" if m.group(2) in ids else m.group(2)), text)


def png_base64(fig, dpi: int = 110) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    return base64.b64encode(buf.getvalue()).decode()
