"""What a report says, as a list of blocks, built once for every writer.

Works on any report-shaped object (``results.Report``); it reads fields and never measures. The page is
the title, then one ``Section`` per builder in ``BUILDERS``; a builder returns ``None`` when the report
has nothing for it. A section for another workload (generation steps, training, a sweep) is one more
builder reading its fields, with its figures from ``charts``.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from .._versions import version_text
from ..kinds import kind_of
from ..stats import bracket_words, margin_coverages
from ..words import clauses, counted
from . import charts
from .document import Block, Callout, Code, Figure, Heading, Section, Table, Text, code, drop_empty_columns
from .gates import defects_section, headroom_text, peak_section

__all__ = ["sections", "Options", "BUILDERS", "title", "about", "summary_table", "layer_table", "device_table",
           "transfer_table", "environment_table", "fold", "distribution_text", "ordered", "COMM_NOTE", "PERFETTO"]

COMM_NOTE = ("comm µs: the NCCL kernels' device time, which includes waiting for the other ranks to reach the "
             "collective; GPU µs is the rest.")
PERFETTO = "https://ui.perfetto.dev"

_SUMMARY = ("backend", "time/fwd ms", "vs pick", "host/fwd ms", "cold host ms", "host/attn µs", "kernels/fwd",
            "memcpy/fwd", "kernels/attn", "memcpy/attn", "peak MB", "max rel err")
_DEVICE = ("rank", "GPU", "kernels/fwd", "memcpy/fwd", "memset/fwd", "comm kernels/fwd", "GPU busy ms", "comm ms",
           "GPU span ms", "peak MB", "time/fwd ms")
_TRANSFER = ("boundary", "from → to", "copies/fwd", "MB/fwd", "GPU µs/fwd")
_INDEX = re.compile(r"\.(\d+)(?=\.|$)")
_SUMS = ("calls", "kernels", "memcpys", "memsets", "gpu_us", "host_us", "ops", "comm_kernels", "comm_us", "comm_ops")
_HEAVY = 3  # layers marked as the heaviest in each per-layer table
_SLOW_LISTED = 5  # slow attention calls listed per backend below the Generation table


@dataclass(frozen=True)
class Options:
    layers: bool = True  # the per-layer tables
    fold_layers: bool = True  # repeated layers folded into one row


def _n(x, digits=1) -> str:
    if x is None:
        return "-"
    if isinstance(x, float) and abs(x - round(x)) < 1e-9:
        return str(int(round(x)))
    return f"{x:.{digits}f}"


def fold(layers) -> list:
    """Repeated layers folded into one row each: ``model.layers.3.self_attn`` -> ``model.layers.*.self_attn``
    (×n; the first index only), per rank; layers on different GPUs stay apart (a device_map splits
    ``layers.*`` between them)."""
    out: dict[tuple, list] = {}
    for layer in layers:
        # the first index alone: the stack of repeated blocks; a later one may tell different sublayers apart
        # (T5's block.N.layer.0 is self-attention, layer.1 cross-attention, layer.2 the feed-forward)
        key = (layer.rank, layer.phase, _INDEX.sub(".*", layer.path, count=1), layer.kind, tuple(layer.devices))
        out.setdefault(key, []).append(layer)
    folded = []
    for (_, _, path, _, _), group in out.items():
        sums = {k: sum(getattr(x, k) for x in group) for k in _SUMS}
        folded.append(dataclasses.replace(group[0], path=path, folded=sum(x.folded for x in group), **sums))
    return folded


def ordered(report) -> list:
    """The backends in ranking order (unranked ones after)."""
    if not report.ranking:
        return list(report.backends)
    order = {n: i for i, n in enumerate(report.ranking)}
    return sorted(report.backends, key=lambda b: order.get(b.backend, len(order)))


def about(report) -> str:
    """The workload and the machine, on one line."""
    e = report.environment
    dev = e.get("gpu") or f"CPU ({e.get('cpu')})"
    parts = [report.workload.get("description", ""), report.workload.get("dtype", ""), dev,
             f"torch {e.get('torch')}", f"transformers {e.get('transformers')}"]
    if e.get("cudnn"):
        parts.append(f"cuDNN {version_text('cudnn', e.get('cudnn'))}")
    return " · ".join(p for p in parts if p)


def title(report) -> str:
    return f"{report.model} · {about(report)}" if report.model else about(report)


def distribution_text(report) -> str | None:
    d = report.distribution
    if not d:
        return None
    if d.get("mode") == "tensor_parallel":
        return (f"tensor parallel over {d.get('world_size')} ranks ({d.get('backend')}), "
                f"devices {', '.join(d.get('devices', []))}; times are the slowest rank's per forward")
    if d.get("mode") == "device_map":
        return f"device_map over {', '.join(d.get('devices', []))}: {d.get('layout', '')}"
    return str(d)


# -- tables -----------------------------------------------------------------------------------------

def _versus(report, b) -> str:
    """The margin against the pick: ``pick``, ``≈ 1.01 [0.97–1.06]`` (tied), ``1.09 [1.05–1.13]``."""
    m = getattr(b, "margin", None)
    if b.backend == report.pick:
        return "pick"
    if m is None:
        return "-"
    return ("≈ " if b.backend in report.shown_ties else "") + m.text().replace("x [", " [", 1)


def _summary_row(report, b) -> tuple[str, ...]:
    name = f"{b.backend} ({b.package})" if getattr(b, "package", None) else b.backend
    if not b.ok:
        return (name, b.status) + ("-",) * (len(_SUMMARY) - 2)
    num = b.numerics
    return (name, _n(b.time_ms, 3), _versus(report, b), _n(b.host_ms, 2), _n(b.cold_host_ms, 1),
            _n(b.attn_host_us, 1), _n(b.kernels), _n(b.memcpys), _n(b.attn_kernels_per_call),
            _n(b.attn_memcpys_per_call), _n(b.peak_mem_mb, 0),
            "-" if num is None else (f"{num.max_rel_err:.1e}" + ("" if num.ok else " over")))


def _summary_kind(report, b) -> str:
    if not b.ok:
        return "note"
    if (b.numerics is not None and not b.numerics.ok) or any(m.blocks for m in b.defects):
        return "error"  # (a known defect makes it wrong here: the Known defects section says which)
    return "strong" if b.backend in (report.shown_ties or (report.pick,)) else "plain"


def _headers(report) -> tuple[str, ...]:
    """The summary's headers, its time and count columns named after what one step of the workload is and
    what the profiler's counts are per (``kinds``)."""
    k = kind_of(report.workload)
    heads = (_SUMMARY[0], f"time/{k.short} ms", _SUMMARY[2], f"host/{k.short} ms") + _SUMMARY[4:]
    return heads[:4] + tuple(h.replace("/fwd", "/" + k.counted[0]) for h in heads[4:])


def summary_table(report) -> Table:
    """One row per backend, fastest first; columns with no data on this device are left out."""
    backends = ordered(report)
    kinds = tuple(_summary_kind(report, b) for b in backends)
    table = Table("", _headers(report), tuple(_summary_row(report, b) for b in backends), frozenset({"backend"}), kinds)
    return drop_empty_columns(table)


def _layer_columns(b) -> list[str]:
    cols = []
    if any(x.phase is not None for x in b.layers):
        cols.append("phase")
    if any(x.rank is not None for x in b.layers):
        cols.append("rank")
    if len({d for x in b.layers for d in x.devices}) > 1:
        cols.append("GPU")
    cols += ["calls", "kernels", "memcpy", "memset", "cpu ops", "GPU µs"]
    if any(x.comm_kernels for x in b.layers):
        cols += ["comm kernels", "comm µs"]
    if any(x.comm_ops for x in b.layers) and not any(x.comm_kernels for x in b.layers):
        cols.append("comm ops")  # a CPU process group (gloo): no kernels, the collective ops themselves
    return cols + ["host µs"]


def _leaves(rows) -> list[int]:
    """The rows that hold no other row's time: attention calls, and modules without children. The model's
    own row is named by its class, not by a prefix of its children's paths: it holds the top-level rows' time.
    Each phase's rows (a generate's prefill and decode, a training step's forward and backward) on their own."""
    paths = [(x.path, x.phase) for x in rows if x.kind == "module"]
    top = [x for x in rows if x.kind == "module" and "." not in x.path]

    def holds_others(x) -> bool:
        if any(p.startswith(x.path + ".") and phase == x.phase for p, phase in paths):
            return True
        others = [y.host_us for y in top if y is not x and y.phase == x.phase]
        return "." not in x.path and bool(others) and x.host_us >= sum(others)

    return [i for i, x in enumerate(rows) if x.kind == "attention" or (x.kind == "module" and not holds_others(x))]


def _heaviest(rows, gpu: bool) -> set[int]:
    """The rows that cost most: device time (each row's own) on a GPU; on a CPU host time, which includes
    the children's, so among the leaves only."""
    if gpu:
        weight = {i: x.gpu_us for i, x in enumerate(rows)}
    else:
        weight = {i: rows[i].host_us for i in _leaves(rows)}
    top = sorted((i for i, w in weight.items() if w > 0), key=lambda i: -weight[i])
    return set(top[:_HEAVY])


def layer_table(report, backend, fold_layers: bool = True) -> Table:
    """Per layer (and per attention call site) of one backend, per forward."""
    b = report[backend] if isinstance(backend, str) else backend
    cols = _layer_columns(b)
    gpu = report.environment.get("device") == "cuda"  # a CPU run has no device events to count
    dev = (lambda x, d=0: _n(x, d)) if gpu else (lambda x, d=0: "-")
    layers = fold(b.layers) if fold_layers else list(b.layers)
    none_phase = "-" if report.workload.get("mode") == "generate" else "forward"  # a generate's own loop: no forward
    rows = []
    for x in layers:
        name = x.path + (" [attention]" if x.kind == "attention" else "") + (f" ×{x.folded}" if x.folded > 1 else "")
        cell = {"phase": x.phase or none_phase, "rank": str(x.rank) if x.rank is not None else "-",
                "GPU": ",".join(map(str, x.devices)) or "-",
                "calls": _n(x.calls), "kernels": dev(x.kernels), "memcpy": dev(x.memcpys), "memset": dev(x.memsets),
                "cpu ops": _n(x.ops), "GPU µs": dev(x.gpu_us - x.comm_us, 1),  # compute: collectives apart
                "comm kernels": dev(x.comm_kernels), "comm µs": dev(x.comm_us, 1), "comm ops": _n(x.comm_ops),
                "host µs": _n(x.host_us, 1)}
        rows.append(tuple([name] + [cell[c] for c in cols]))
    heavy = _heaviest(layers, gpu)
    kinds = tuple("strong" if i in heavy else "plain" for i in range(len(rows)))
    caption = (f"bold: the {counted(len(heavy), 'layer')} with the most "
               + ("GPU time" if gpu else "host time (leaf modules)") if heavy else "")
    backward, outside = any(x.phase == "backward" for x in layers), any(x.kind == "outside" for x in layers)
    if backward or outside:  # (no module ranges there: the ops' own time, which leaves their children's out)
        who = {(True, True): "a backward row or the row outside modules", (True, False): "a backward row",
               (False, True): "the row outside modules"}[(backward, outside)]
        host = f"host µs: a forward row includes its children's; {who}: its own ops' only"
        caption += ("; " if caption else "") + host
    per = {"generate": "prefill and decode rows per forward of their phase, the others per profiled generate",
           "train": "per training step: forward rows and backward rows"}.get(report.workload.get("mode"),
                                                                            "per forward")
    table = Table(f"{b.backend}: per layer ({per})", tuple(["layer"] + cols), tuple(rows), frozenset({"layer"}),
                  kinds, caption)
    return drop_empty_columns(table)


def device_table(report, backend) -> Table:
    """Per GPU (and rank): totals per forward from that GPU's raw events."""
    b = report[backend] if isinstance(backend, str) else backend
    rows = tuple((str(d.rank) if d.rank is not None else "-", f"cuda:{d.device}", _n(d.kernels), _n(d.memcpys),
                  _n(d.memsets), _n(d.comm_kernels), _n(d.gpu_busy_ms, 3), _n(d.comm_ms, 3), _n(d.gpu_span_ms, 3),
                  _n(d.peak_mem_mb, 0), _n(d.time_ms, 3)) for d in b.devices)
    return Table(f"{b.backend}: per GPU (per forward)", _DEVICE, rows, frozenset({"GPU"}))


def transfer_table(report, backend) -> Table:
    b = report[backend] if isinstance(backend, str) else backend
    rows = tuple((f"{t.after} → {t.into}", f"cuda:{t.src} → cuda:{t.dst}", _n(t.copies), _n(t.bytes / 2**20, 3),
                  _n(t.gpu_us, 1)) for t in b.transfers)
    return Table(f"{b.backend}: copies between GPUs, by layer boundary", _TRANSFER, rows,
                 frozenset({"boundary", "from → to"}))


def _setting_rows(key: str, value) -> list[tuple[str, str]]:
    """A setting as rows: a mapping (the command's own time, ``time_s``) one row per entry, in seconds."""
    if not isinstance(value, dict):
        return [(key.replace("_", " "), str(value))]
    if key == "time_s":
        return [(f"time: {k}", f"{v:.2f} s" if isinstance(v, (int, float)) else str(v)) for k, v in value.items()]
    return [(f"{key.replace('_', ' ')}: {k}", str(v)) for k, v in value.items()]


def environment_table(report) -> Table:
    """The machine, the libraries, the workload and the measurement settings (what "all" left out is the Not
    run section's)."""
    rows = [row for k, v in report.environment.items() if v not in (None, "", {})
            for row in _setting_rows(k, version_text(k, v) if k == "cudnn" else v)]
    rows += [row for k, v in report.workload.items() if v not in (None, "", {})
             for row in _setting_rows(f"workload {k}", v)]
    rows += [row for k, v in report.settings.items() if v not in (None, "", {}) and k != "not_offered"
             for row in _setting_rows(k, v)]
    if distribution_text(report):
        rows.append(("distribution", distribution_text(report)))
    return Table("", ("item", "value"), tuple(rows), frozenset({"item", "value"}), sortable=False)


# -- sections ---------------------------------------------------------------------------------------

#: the label of the answer's callout, by what it answers
_LABELS = {"use": "Recommendation", "tie": "Recommendation", "keep": "Recommendation", "none": "No answer",
           "no-attention": "No answer"}


def _recommendation(report, opts: Options) -> Section | None:
    d = report.decision
    if d is None and report.no_attention:  # a profile, which answers nothing, of a model without attention
        from ..results import no_attention_text  # (results imports this module to write itself)

        return Section("", (Callout("No attention call", no_attention_text(workload=report.workload)),),
                       key="recommendation")
    if d is None:
        return None
    callout = Callout(_LABELS.get(d.answer, "Recommendation"), d.headline, tuple(r for r in d.reasons if r.strip()))
    return Section("", (callout,), key="recommendation")


def _bracket(report) -> str:
    """What the brackets of ``vs pick`` are: a 95 % interval, or with too few paired rounds for one the whole
    range of the ratios (less coverage, and nothing told apart)."""
    return bracket_words(margin_coverages(report.backends, report.pick))


def _timing_text(report) -> str:
    """How the time column was measured, and how to read the margins against the pick."""
    timer = next((f" ({b.timer})" for b in report.backends if b.timer), "")  # none where nothing was timed
    st = report.settings
    host = st.get("host") or {}
    k = kind_of(report.workload)
    if k.name == "generate":
        how = (f"time/{k.short}: each prompt's median over the rounds (its decode steps at their median), "
               f"summed over prompts{timer}")
    else:
        how = f"time/{k.short}: the median of unprofiled {k.timed}{timer}"
    rounds = host.get("rounds")
    stopped = host.get("stopped")
    shared = host.get("shared_rounds")
    if rounds and stopped == "fixed":
        how += f", in {counted(rounds, 'interleaved round')} (the rounds asked for" + (
            ", at least 6 for a generate: the fewest with which a 95 % interval can exclude 1)"
            if k.name == "generate" else ")")
    elif rounds:
        how += f", in {counted(rounds, 'interleaved round')} " + (
            f"(the first {st.get('rounds')}, then more for the backends still tied with the fastest, until told apart "
            f"or out of time: {stopped})" if st.get("rounds") and rounds > st["rounds"] else f"(stopped: {stopped})")
    if shared and rounds and shared < rounds:
        how += (f"; every backend's time from the {counted(shared, 'round')} all of them took (the more rounds sharpen "
                "the vs-pick intervals only)")
    reference = any(b.backend == "eager" and b.ok for b in report.backends) and report.pick != "eager"
    margins = (f" vs pick: the median of the per-round ratios of its time to the pick's, with {_bracket(report)}; "
               "≈ and bold: tied for the fastest (the interval holds 1, and nothing tied is decidedly faster)" +
               (", never `eager`, the reference the others are checked against" if reference else "") + ";"
               if report.pick is not None else "")  # (a profile ranks nothing: no such column)
    return how + "." + margins + f" counts from the profiler, {k.counted[1]}; /attn: per attention call."


def _deploy(report, opts: Options) -> Section | None:
    """How to run the pick where the workload runs, what the measurement ran with, when to measure again."""
    d = report.deploy
    if d is None:
        return None
    if d.keep:
        blocks: list[Block] = [Text(f"Nothing to change in {d.where}: `{d.pick}` is the model's own attention as "
                                    "measured. To set it where another is set:"), Code(d.plain or "")]
    else:
        blocks = [Text(f"Run `{d.pick}` with attnswitch in {d.where} (with `model` in scope):"), Code(d.attnswitch)]
        if d.plain:
            blocks += [Text("Or with transformers and PyTorch alone:"), Code(d.plain)]
    if d.plain_loses:
        blocks.append(Text(("What that loses: " if d.plain else "No transformers/PyTorch-only equivalent: ")
                           + "; ".join(d.plain_loses) + ".", "note"))
    env = d.env or {}
    versions = ", ".join(f"{k} {version_text(k, v)}" for k, v in d.versions.items())
    blocks.append(Text("Measured with " + (", ".join(f"{k}={v}" for k, v in env.items()) if env else
                                           "no environment variable that changes what runs")
                       + (f"; {versions}" if versions else "") + ".", "note"))
    if d.remeasure:
        blocks.append(Text("Measure again " + "; ".join(d.remeasure) + ".", "note"))
    return Section("Deploy", tuple(blocks), key="deploy")


def _summary(report, opts: Options) -> Section:
    blocks: list[Block] = [summary_table(report)]
    rank = charts.ranking_chart(ordered(report), report.pick, report.shown_ties, kind_of(report.workload).unit)
    if rank is not None:  # the report's first plot: the ranking the answer reads
        blocks.append(Figure(rank, "The ranked time, as the vs pick column: the median of each backend's per-round "
                          f"ratios to the pick, with {_bracket(report)}; a backend whose interval holds 1 is tied with "
                          "the pick, unless one tied with it is decidedly faster (drawn apart)."))
    room = headroom_text(report, ordered(report))  # under the ranking: how far from the GPU's peak
    blocks += [room] if room is not None else []
    blocks.append(Text(_timing_text(report), "note"))
    if distribution_text(report):
        blocks.append(Text(f"distribution: {distribution_text(report)}"))
    if report.sweep and report.pick is not None:
        last = report.sweep[-1]
        shape = f"batch {last.batch}, {kind_of(report.workload).length} {last.seq}" + (
            f", {counted(last.new_tokens, 'new token')}" if last.new_tokens else "")
        blocks.insert(0, Text(f"The last shape of the sweep ({shape}), in full, against the sweep's pick "
                              f"`{report.pick}`; every shape's time is in the Sweep section.", "note"))
    return Section("Summary", tuple(blocks), key="summary")


def _peak(report, opts: Options) -> Section | None:
    return peak_section(report, ordered(report))


def _defects(report, opts: Options) -> Section | None:
    return defects_section(report)


def _per_kind(report, opts: Options) -> Section | None:
    """Each backend's attention time per layer kind (a model of several kinds), and what a candidate of a
    backend per kind runs."""
    ran = [b for b in ordered(report) if b.ok and len(b.attn_by_kind) > 1]
    if not ran:
        return None
    kinds = list(dict.fromkeys(k for b in ran for k, _ in b.attn_by_kind))
    gpu = report.environment.get("device") == "cuda"
    rows = tuple((b.backend, *(_ms(dict(b.attn_by_kind)[k] / 1e3) if k in dict(b.attn_by_kind) else "-"
                               for k in kinds)) for b in ran)
    per = kind_of(report.workload).counted[1]
    table = Table("Attention per layer kind", ("backend", *(f"{k} ms" for k in kinds)), rows, frozenset({"backend"}))
    note = (f"{'Device' if gpu else 'Host'} time of each kind's attention calls, {per} (the profiled pass). A "
            "candidate named kind=backend/kind=backend runs each kind with its backend and the kinds it leaves out "
            "with the model's own attention; the one of each kind's fastest backend is measured in the same rounds "
            "as every other.")
    return Section("Layer kinds", (table, Text(note, "note")), key="layer-kinds")


def _plots(report, opts: Options) -> Section | None:
    if not any(b.ok for b in report.backends):
        return None
    cpu = report.environment.get("device") != "cuda"
    ref = report.settings.get("numerics_reference")
    backends = ordered(report)
    kind = kind_of(report.workload)
    mode = kind.name
    step = kind.step if mode == "train" else "forward"
    # a generate's profiled pass mixes prefill and decode forwards, and its time is the whole workload's:
    # its own section plots it step by step instead
    by_kind = None if mode == "generate" else charts.time_by_kind_chart(backends, step)
    plots = [
        (by_kind, f"Host time, not the ranked time: a CPU run has no device time, so this is the host time of the "
         f"median measured {step}, its attention calls and the rest of it (measured apart from the ranking's rounds)."
         if cpu else f"Device time per {step}, from the profiled pass (not the ranked time: its kernels only).", None),
        (charts.attention_time_chart(backends), "The attention call's own kernels, from the profiled pass.",
         "No device time on this run (CPU): the host time per call below is the attention's time."),
        (charts.host_cost_chart(backends), "Host time until each attention call returns: the first call at this "
         "shape (plans, compiles) and the steady median; log scale.", None),
        (charts.numerics_chart(backends), f"Each backend's output against the reference ({ref or 'eager attention'})"
         "; a backend over the dashed tolerance is never recommended.",
         "No numerics in this report: `profile` does not check them, `compare` does."),
    ]
    blocks = [Figure(chart, caption) if chart is not None else Text(missing, "note")
              for chart, caption, missing in plots if chart is not None or missing]
    return Section("Plots", tuple(blocks), key="plots")


def _backend_blocks(report, b, fold_layers: bool) -> Iterator[Block]:
    table = layer_table(report, b, fold_layers)
    yield table
    if "comm µs" in table.headers:
        yield Text(COMM_NOTE, "note")
    if len(b.devices) > 1:
        yield device_table(report, b)
    if b.transfers:
        yield transfer_table(report, b)
    if b.attn_ops or b.attn_kernel_names:
        yield Text(f"attention ran: ops {', '.join(b.attn_ops) or '-'}; kernels "
                   f"{', '.join(k[:60] for k in b.attn_kernel_names) or '-'}"
                   + (f"; launched by {', '.join(b.attn_launch_apis)}" if b.attn_launch_apis else ""), "note")


def _layers(report, opts: Options) -> Section | None:
    shown = [b for b in ordered(report) if b.ok and b.layers] if opts.layers else []
    if not shown:
        return None
    return Section("Per layer", tuple(
        Section(b.backend, tuple(_backend_blocks(report, b, opts.fold_layers)), key=f"layers-{b.backend}",
                collapsible=True, open=i == 0) for i, b in enumerate(shown)), key="layers")


def _not_offered(report) -> Text | None:
    """One line: the backends "all" left out on this device, grouped by why."""
    left = report.settings.get("not_offered") or {}
    if not left:
        return None
    why: dict[str, list[str]] = {}
    for name, reason in left.items():
        why.setdefault(reason, []).append(name)
    return Text("Not offered here: " + "; ".join(f"{', '.join(names)} ({reason})" for reason, names in why.items()),
                "note")


def _not_run(report, opts: Options) -> Section | None:
    bad = [b for b in report.backends if not b.ok]
    blocks = [Text(f"{b.backend} {b.status}" + (f" at {b.where}" if b.where else "") + ": " + clauses(b.reasons),
                   "error") for b in bad]
    left = _not_offered(report)
    if left is not None:
        blocks.append(left)
    return Section("Not run", tuple(blocks), key="not-run") if blocks else None


def _notes(report, opts: Options) -> Section | None:
    notes = tuple(Text(f"{b.backend}: {n}") for b in ordered(report) for n in b.notes)
    return Section("Notes", notes, key="notes") if notes else None


def _environment(report, opts: Options) -> Section:
    return Section("Environment", (environment_table(report),), key="environment")


def _traces(report, opts: Options) -> Section | None:
    files = report.trace_files()  # a sweep's by shape, in the order measured
    if not report.sweep:
        order = {b.backend: i for i, b in enumerate(ordered(report))}
        files = sorted(files, key=lambda f: order.get(f[0], len(order)))
    rows = tuple((name, f"traces/{rel}") for name, rel, _ in files)
    if not rows:
        return None
    return Section("Traces", (
        Table("", ("backend", "trace"), rows, frozenset({"backend", "trace"}), sortable=False,
              links=frozenset({"trace"})),
        Text(f"Open one in Perfetto: {PERFETTO}, then \"Open trace file\" (.json and .json.gz load as they are). "
             "The paths are relative to the report's folder, where `--out` (or `report.save_traces`) puts them.",
             "note")), key="traces")


def _reproduce(report, opts: Options) -> Section | None:
    return Section("", (Text(f"reproduce: {code(report.command)}", "note"),), key="reproduce") if report.command \
        else None


def _ms(x) -> str:
    return _n(x, 3)


def _generate(report, opts: Options) -> Section | None:
    ran = [b for b in ordered(report) if b.ok and b.generate is not None]
    if not ran:
        return None
    rows = tuple((b.backend, _ms(b.time_ms), _ms(b.generate.workload_wall_ms), _ms(b.generate.ttft_ms),
                  _ms(b.generate.step_ms_p50),
                  _ms(b.generate.step_ms_p90), _ms(b.generate.step_ms_p99), _n(b.generate.tokens_per_s, 1),
                  _ms(b.generate.cold_e2e_ms), _ms(b.generate.new_shape_step_ms), _ms(b.generate.seen_shape_step_ms),
                  _n(b.generate.slow_attn_calls, 0), _n(b.generate.plan_cache_host_mb, 1),
                  "-" if b.generate.token_agreement is None else f"{b.generate.token_agreement:.3f}") for b in ran)
    table = drop_empty_columns(Table("", (  # (titled by its section)
        "backend", "workload ms", "wall ms", "ttft ms", "step p50 ms", "step p90 ms", "step p99 ms", "tokens/s",
        "first workload ms", "new-length step ms", "seen-length step ms", "slow attn calls", "host MB grown",
        "tokens agree"), rows, frozenset({"backend"})))
    blocks: list[Block] = [table, Text(
        "workload ms: the ranked time (each prompt's median, its decode steps at their median); wall ms: the whole "
        "workloads' median, a check. Steps: wall time between decode forwards, over every round. ttft: the prefill "
        "forward's start (an encoder-decoder's encoder's) to the first decode forward's. "
        "New-length steps met a key length (in their phase: a decode step at a prefill's is new) for the first "
        "time in the first workload, after its first generate, "
        "which warms everything up (plans are paid there; a compiled candidate's: the steps during which it "
        "compiled); slow attention calls: host time over 4x the "
        "steady call's at the same prompt and phase (prefill, decode), in the first workload. Tokens agree: "
        "greedy tokens equal to float32 eager's.", "note")]
    series = {b.backend: b.generate.step_times_ms for b in ran if b.generate.step_times_ms}
    series.update({f"{b.backend} (first)": b.generate.cold_step_times_ms for b in ran[:3]
                   if b.generate.cold_step_times_ms})
    if series:
        blocks.append(Figure(charts.step_time_chart(series, "Generation: time per decode step, steady and first"),
                             "One generate of the first prompt length, step by step."))
    slow = [_slow_listed(b) for b in ran if b.generate.slow_calls]
    if slow:
        blocks.append(Text("Slow attention calls (first workload): " + "; ".join(slow), "note"))
    return Section("Generation", tuple(blocks), key="generate")


def _slow_listed(b) -> str:
    """A backend's first slow calls, each against the steady call it exceeded, and how many more there were."""
    g = b.generate
    calls = [f"prompt {c.prompt}, step {c.step}, {c.layer}, key length {c.kv_len}: {c.host_us:.0f} µs"
             + (f" (steady {c.steady_us:.0f})" if c.steady_us else "") for c in g.slow_calls[:_SLOW_LISTED]]
    more = g.slow_attn_calls - len(calls)
    return f"{b.backend}: " + ", ".join(calls) + (f", and {more} more" if more > 0 else "")


def _compiled(report, opts: Options) -> Section | None:
    ran = [b for b in ordered(report) if b.compile is not None]
    if not ran:
        return None
    rows = tuple((b.backend, b.compile, b.status if not b.ok else _ms(b.time_ms),
                  "-" if b.compile_ms is None else f"{b.compile_ms / 1e3:.1f}", _n(b.graphs, 0), _n(b.recompiles, 0),
                  b.attn_seen or "-", "-" if b.compile_pays_after is None else f"{b.compile_pays_after:.1f}",
                  b.attn_mismatch or "-") for b in ran)
    steps = kind_of(report.workload).step + "s"  # (what the ranked time is per: a generate's whole workload)
    table = drop_empty_columns(Table("Compiled", (
        "candidate", "mode", "time ms", "compile s", "graphs", "recompiles", "attention kernel seen",
        f"pays after {steps}", "mismatch"), rows, frozenset({"candidate", "mode", "attention kernel seen",
                                                             "mismatch"}),
        tuple("error" if b.attn_mismatch else "plain" for b in ran)))
    return Section("Compiled", (table, Text(
        "Compile s: the cold step's host time over a steady step's, paid once per shape. Graphs: those Dynamo "
        "compiled in the cold step (graph breaks and recompiles make more than one); recompiles: compiled versions of "
        "the forward beyond the first (new shapes: a growing cache recompiles), made while measured. Attention "
        "kernel seen: the SDPA family of the attention kernels the compiled graph ran, read off the trace ('-': "
        f"none, as for naive attention or inductor's own kernels). Pays after: {steps} (the ranked time's unit) after "
        "which the compile has paid for itself against the same backend uncompiled. Compiled forwards have no module "
        "ranges inside: their kernels count for the model as a whole.", "note")), key="compiled")



def _train(report, opts: Options) -> Section | None:
    ran = [b for b in ordered(report) if b.ok and b.train is not None]
    if not ran:
        return None
    rows = tuple((b.backend, _ms(b.time_ms), _ms(b.train.forward_ms), _ms(b.train.backward_ms), _n(b.peak_mem_mb, 0),
                  "-" if b.train.grad_max_rel_err is None else
                  f"{b.train.grad_max_rel_err:.1e}" + ("" if b.train.grad_ok else " over"), b.train.worst_grad or "-")
                 for b in ran)
    table = drop_empty_columns(Table("Training step", ("backend", "step ms", "forward ms", "backward ms", "peak MB",
                                                       "grad max rel err", "worst parameter"), rows,
                                     frozenset({"backend", "worst parameter"})))
    chart = charts.train_time_chart([b.backend for b in ran], [b.train.forward_ms for b in ran],
                                    [b.train.backward_ms for b in ran])
    return Section("Training", (table, Text(f"Loss: {ran[0].train.loss}. Step: the ranked time (interleaved "
                                            "rounds); forward and backward: medians of the separately timed steps, so "
                                            "their sum need not equal it. Gradients against float32 eager "
                                            "(dropout off); NaN or Inf fails the backend.", "note"),
                                Figure(chart, "Forward and backward time per training step.")), key="train")


def _sweep(report, opts: Options) -> Section | None:
    if not report.sweep:
        return None
    names = list(dict.fromkeys(b.backend for p in report.sweep for b in p.backends))
    generate = any(getattr(p, "new_tokens", None) for p in report.sweep)
    rows = tuple((str(p.batch), *((str(p.new_tokens),) if generate else ()), str(p.seq),
                  *(_ms(next((b.time_ms for b in p.backends if b.backend == n and b.ok), None)) for n in names),
                  " ≈ ".join(p.ties) or p.pick or "-")
                 for p in report.sweep)
    heads = ("batch", "new", "prompt") if generate else ("batch", "seq")
    table = Table(f"Sweep: time {kind_of(report.workload).unit} (ms)",  # (a forward, a training step, ...)
                  (*heads, *names, "best"), rows, frozenset({"best"}))
    def group(p):
        return p.batch, getattr(p, "new_tokens", None)
    groups = list(dict.fromkeys(map(group, report.sweep)))

    def label(n, g):
        return n if len(groups) == 1 else f"{n}, batch {g[0]}" + (f", {g[1]} new" if g[1] else "")
    series = {label(n, g): [(p.seq, b.time_ms) for p in report.sweep if group(p) == g for b in p.backends
                            if b.backend == n and b.ok and b.time_ms] for g in groups for n in names}
    x = "prompt length" if generate else "sequence length"
    unit = kind_of(report.workload).step  # (a forward, a training step, a generate workload)
    chart = charts.sweep_chart({k: v for k, v in series.items() if v}, x_label=x,
                               title=f"Time per {unit} against {x}", unit=unit)
    return Section("Sweep", (drop_empty_columns(table, keep=len(heads)),
                             Figure(chart, f"Time per {unit} against {x} (log-log); best: the pick and the backends "
                                           "not told apart from it at that length.")), key="sweep")


def _own_time(report, opts: Options) -> Section | None:
    spent = report.settings.get("time_s") or {}
    if not spent:
        return None
    parts = ", ".join(f"{k} {v:.1f} s" for k, v in spent.items() if k != "total")
    # (the account is part of the report it writes: what writing the files took comes after it)
    return Section("", (Text(f"attnswitch's own time until the report: {spent.get('total', 0):.1f} s ({parts}; "
                             "writing the report's files comes after)", "note"),), key="own-time")


#: the sections of a report, in reading order
BUILDERS: tuple[Callable[..., Section | None], ...] = (_recommendation, _deploy, _summary, _per_kind, _defects,
                                                       _peak, _compiled, _generate, _train, _sweep, _plots, _layers,
                                                       _not_run, _notes, _environment, _traces, _own_time,
                                                       _reproduce)


def sections(report, layers: bool = True, fold_layers: bool = True) -> list[Block]:
    """Everything the report says, in reading order: the title, then its sections."""
    opts = Options(layers, fold_layers)
    out: list[Block] = [Heading(f"attnswitch report: {report.model}" if report.model else "attnswitch report", 1),
                        Text(about(report), "note")]
    out += [s for s in (build(report, opts) for build in BUILDERS) if s is not None]
    return out
