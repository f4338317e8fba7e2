"""A backend per layer kind, chosen by measurement: what each kind's attention calls took under each candidate,
and the candidate that runs each kind with its fastest backend.

Pure functions over prepared results (their per-layer rows, from the profiled pass) and the model's layer kinds
(``hf.layerkinds``): the attention rows of a kind's modules, summed per profiled step, device time on a GPU
and host time on a CPU. A backend refused for the whole model at a module of one kind (forced ``flash`` at a
sliding layer's dense mask) is tried on the other kinds alone (``probes``), so that every backend that can run a
kind is measured on it. ``composed`` builds the candidate of the fastest per kind, which is then measured in the
same rounds as every other: its time is never summed from parts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping

from .. import catalog
from ..candidate import Candidate, Kinds
from ..results import BackendResult

__all__ = ["with_kinds", "probes", "composed", "kind_times"]


def with_kinds(r: BackendResult, kind_of_path: Mapping[str, str], gpu: bool) -> BackendResult:
    """``r`` with its attention time per layer kind (``attn_by_kind``: µs per profiled step, by kind). A generate's
    rows are per forward of their phase: each counts as many times as its phase ran forwards in a step."""
    per: dict[str, float] = {}
    times = dict(r.phase_forwards)
    for row in r.layers:
        kind = kind_of_path.get(row.path) if row.kind == "attention" else None
        if kind is not None:
            per[kind] = per.get(kind, 0.0) + (row.gpu_us if gpu else row.host_us) * times.get(row.phase, 1.0)
    return dataclasses.replace(r, attn_by_kind=tuple(per.items())) if per else r


def kind_times(results: Iterable[BackendResult]) -> dict[str, dict[str, float]]:
    """Kind -> backend -> µs per step, from every result that ran acceptably: a single backend's for every kind;
    a per-kind candidate's for the kinds it gives a backend (the others ran the model's own attention)."""
    out: dict[str, dict[str, float]] = {}
    for r in results:
        if not r.ok or r.nonfinite is not None or r.compile is not None:
            continue
        c = r.candidate
        for kind, us in r.attn_by_kind:
            backend = c.backend if c.backend is not None else (c.kinds.of(kind) if c.kinds is not None else None)
            if isinstance(backend, str) and backend not in catalog.MODEL_LEVEL:
                out.setdefault(kind, {}).setdefault(backend, us)
    return out


def probes(results: Iterable[BackendResult], kind_of_path: Mapping[str, str]) -> list[str]:
    """For each single backend refused at a module of one kind, the candidate of it on the other kinds."""
    kinds = list(dict.fromkeys(kind_of_path.values()))
    out = []
    for r in results:
        c = r.candidate
        at = kind_of_path.get(r.where or "")
        if r.ok or at is None or c.backend is None or c.compile is not None or c.backend in catalog.MODEL_LEVEL:
            continue
        others = [k for k in kinds if k != at]
        if others:
            out.append(str(Candidate(Kinds(tuple((k, c.backend) for k in others)))))
    return list(dict.fromkeys(out))


def composed(results: Iterable[BackendResult], kinds: list[str]) -> str | None:
    """The candidate running each of ``kinds`` that made calls with the backend its calls took least time under
    (a kind with no call, a vision tower on text inputs, is left to the model's own attention); None where fewer
    than two kinds were measured, or one backend is fastest at every kind (that candidate exists already)."""
    times = kind_times(results)
    measured = [k for k in kinds if times.get(k)]
    if len(measured) < 2:
        return None
    best = [(k, min(times[k], key=times[k].get)) for k in measured]
    if len({b for _, b in best}) == 1:
        return None
    return str(Candidate(Kinds(tuple(best))))
