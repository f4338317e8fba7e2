"""The sections on how far each backend is from the GPU's peak, and on the known defects that bear on it: blocks
built from a report's fields (``attn_peak``, ``settings["ceiling"]``, ``defects``), for every writer."""

from __future__ import annotations

from ..peak import gpu_spec, headroom
from .document import Section, Table, Text, drop_empty_columns

__all__ = ["peak_table", "peak_section", "defects_section", "headroom_text", "PEAK_NOTE", "NO_KERNEL_TIME"]

PEAK_NOTE = ("Useful work over the kernel time the profiler measured per attention call. Compute-bound calls: "
             "TFLOP/s of the two matmuls, 4·B·H·Sq·Sk·D, counting only the (query, key) pairs causal or window "
             "masking leaves (a backward 2.5x its forward; padding counted as real tokens). Memory-bound calls (one "
             "query row: decode): TB/s of K and V read. % of peak: of the GPU's dense peak for the dtype, or its "
             "memory bandwidth (datasheet); % of measured: of a large matmul's, or copy's, rate measured here.")
NO_KERNEL_TIME = "% of peak: no kernel time on a CPU; it is measured on a GPU."
_LEVEL = {"wrong": "wrong here: never recommended", "unrun": "not a direction this workload runs",
          "nearby": "at lengths not met here"}


def _pct(x) -> str:
    return "-" if x is None else f"{x:.0f} %"


def _achieved(f) -> str:
    return f"{f.achieved:.1f}" if f.achieved < 100 else f"{f.achieved:.0f}"


def peak_table(report, backends) -> Table:
    """One row per backend and phase (a layer kind's rows under it, where figures are per kind)."""
    rows, kinds = [], []
    for b in backends:
        for f in b.attn_peak:
            name = b.backend if f.layer_kind is None else f"{b.backend} [{f.layer_kind}]"
            rows.append((name, f.phase, f.bound, f"{f.calls:g}", f"{f.kernel_us:.1f}", f"{_achieved(f)} {f.unit}",
                         _pct(f.pct_spec), _pct(f.pct_measured)))
            kinds.append("strong" if b.backend in (report.shown_ties or (report.pick,)) else "plain")
    table = Table("", ("backend", "phase", "bound", "calls/step", "kernel µs/call", "achieved", "% of peak",
                       "% of measured"), tuple(rows), frozenset({"backend", "phase", "bound"}), tuple(kinds),
                  names=2, priority=(0, 0, 3, 4, 2, 1, 0, 1))
    return drop_empty_columns(table)


def _ceiling_text(report) -> str:
    """What the percentages are of: the GPU's datasheet figures and the ceiling measured here."""
    spec = gpu_spec(report.environment.get("gpu"))
    parts = []
    if spec is not None:
        dense = ", ".join(f"{k} {v:g}" for k, v in spec.tflops.items())
        parts.append(f"peak: the {spec.name}'s dense TFLOP/s ({dense}) and {spec.tbps:g} TB/s")
    else:
        parts.append(f"peak: {report.environment.get('gpu') or 'this GPU'} is not in attnswitch's table of GPUs")
    c = report.settings.get("ceiling") or {}
    if c.get("matmul_tflops"):
        parts.append(f"measured here: a {c.get('matmul_n')}³ {c.get('dtype')} matmul at {c['matmul_tflops']:.0f} "
                     "TFLOP/s" + (f", a {c.get('copy_mib')} MiB copy at {c['copy_tbps']:.2f} TB/s" if c.get("copy_tbps")
                                  else "") + f" ({c.get('seconds', 0):.1f} s, before the timing rounds)")
    return "; ".join(parts) + "."


def headroom_text(report, ordered) -> Text | None:
    """The line under the ranking: how far the backends (``ordered``, as ranked) are from the peak."""
    line = headroom([b for b in ordered if b.ok], report.environment.get("gpu"))
    return Text(line, "note") if line else None


def peak_section(report, ordered) -> Section | None:
    """Every backend's attention calls (``ordered``, as ranked) against the GPU's peak; on a CPU, one line saying
    there is none."""
    shown = [b for b in ordered if b.ok and b.attn_peak]
    if not shown:
        recorded = any(b.attn_shapes for b in report.backends)
        cpu = report.environment.get("device") != "cuda"
        return Section("Peak", (Text(NO_KERNEL_TIME, "note"),), key="peak") if recorded and cpu else None
    return Section("Peak", (peak_table(report, shown), Text(_ceiling_text(report), "note"), Text(PEAK_NOTE, "note")),
                   key="peak")


def defects_section(report) -> Section | None:
    """The known defects (``attnswitch defects``) that bear on the report's backends, and how."""
    merged: dict[tuple, list] = {}  # (backend, id, level) -> [match, lengths]: a sweep's shapes together
    for b in [*report.backends, *(b for p in report.sweep for b in p.backends)]:
        for m in b.defects:
            merged.setdefault((b.backend, m.id, m.level), [m, set()])[1].update(m.lengths)
    if not merged:
        return None
    rows, kinds = [], []
    for (name, _, level), (m, found) in merged.items():
        lengths = sorted(found)
        shown = ", ".join(map(str, lengths[:6])) + (" …" if len(lengths) > 6 else "")
        rows.append((name, m.id, m.direction, m.effect, m.when, _LEVEL.get(level, level), shown or "-"))
        kinds.append("error" if m.blocks else "plain")
    table = drop_empty_columns(Table("", ("backend", "defect", "direction", "effect", "calls it hits", "here",
                                          "key lengths met"), tuple(rows),
                                     frozenset({"backend", "defect", "direction", "effect", "calls it hits", "here"}),
                                     tuple(kinds), names=2, sortable=False))
    note = ("From attnswitch's table of known defects (`attnswitch defects` lists it, with the versions and GPUs of "
            "each): matched against this report's versions and GPU, the calls it measured and, for a sweep or a "
            "length mix, every length the deployment meets. What depends on the data (a row's log-sum-exp) is not "
            "checked: a match says the backend may go wrong there.")
    return Section("Known defects", (table, Text(note, "note")), key="defects")
