"""The finiteness gate: a candidate that gives NaN or Inf anywhere while it is measured is unacceptable, with
where it appeared.

Checked in the untimed steps only, so that no timed step does work a user's loop would not:

- every attention call's output, and the gradient its backward gives q, k and v (a hook on each), in the warm-up
  steps, in the untimed step that opens each backend's turn in every timing round, and in the numerics pass
  (``Watch``, an observer of ``instrument``: a device scalar per tensor, read once at the end, one sync);
- the output of the cold step (its host time taken) and of the last timed step of each turn (a logit, a hidden
  state, a training step's loss), kept past its clock and read after it (``output_marks``).

A compiled forward's attention calls are inside its graph: only its outputs are checked, and its gradients by
the numerics pass (a parameter's). The first value found is reported: a forward's first (later ones follow
from it), else the backward's first in the order it ran (the last layer's backward runs first).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
from collections.abc import Iterator

import torch

from . import instrument
from .results import BackendResult, NonFinite

__all__ = ["Watch", "watching", "NonFiniteError", "output_marks", "first", "failed", "OUTPUT"]

OUTPUT = "the step's output"


class NonFiniteError(RuntimeError):
    """A candidate gave NaN or Inf in an untimed step of its measurement (``found`` says where)."""

    def __init__(self, found: NonFinite):
        super().__init__(found.text())
        self.found = found


def _mark(t: torch.Tensor):
    """A device scalar whose value is NaN or Inf exactly where ``t`` holds one (its largest magnitude); None for
    what is not a floating tensor, or is empty."""
    if not isinstance(t, torch.Tensor) or not t.is_floating_point() or t.numel() == 0:
        return None
    return torch.linalg.vector_norm(t.detach(), float("inf"))


def _tensors(out) -> Iterator[torch.Tensor]:
    """The tensors of a step's output: a model output's (logits, hidden states, loss), a tuple's, a tensor."""
    if isinstance(out, torch.Tensor):
        yield out
    elif isinstance(out, dict):  # transformers' ModelOutput is an ordered dict of what it holds
        for v in out.values():
            yield from _tensors(v)
    elif isinstance(out, (list, tuple)):
        for v in out:
            yield from _tensors(v)


class Watch:
    """An observer (``instrument.observe``) that marks every attention call's output and, by a hook, the
    gradients its backward gives q, k and v; ``first()`` reads the marks once."""

    def __init__(self, step: str):
        self.step = step
        self.marks: list[tuple[str, str, torch.Tensor]] = []  # (direction, where, device scalar), in order

    def __call__(self, where, q, k, v, mask, causal, window, out, top_left=False) -> None:
        m = _mark(out)
        if m is not None:
            self.marks.append(("forward", where, m))
        if torch.is_grad_enabled():
            for t in {id(x): x for x in (q, k, v)}.values():  # k and v may be one tensor
                if isinstance(t, torch.Tensor) and t.requires_grad:
                    t.register_hook(functools.partial(self._grad, where))

    def _grad(self, where: str, g: torch.Tensor) -> None:
        m = _mark(g)
        if m is not None:
            self.marks.append(("backward", where, m))

    def output(self, out, where: str = OUTPUT) -> None:
        """Mark a step's output too."""
        self.marks.extend(("forward", where, m) for t in _tensors(out) if (m := _mark(t)) is not None)

    def first(self) -> NonFinite | None:
        """The first NaN or Inf marked (a forward's before a backward's), or None; reads every mark (a sync)."""
        return first(self.marks, self.step)


def first(marks: list[tuple[str, str, torch.Tensor]], step: str) -> NonFinite | None:
    """The first of ``marks`` (``(direction, where, scalar)``) that is NaN or Inf, a forward's first."""
    if not marks:
        return None
    by_device: dict = {}
    for i, (_, _, m) in enumerate(marks):
        by_device.setdefault(m.device, []).append(i)
    values = [0.0] * len(marks)
    for idx in by_device.values():  # one read per device
        for i, x in zip(idx, torch.stack([marks[i][2].float() for i in idx]).tolist()):
            values[i] = x
    bad = [i for i, x in enumerate(values) if not math.isfinite(x)]
    if not bad:
        return None
    i = min(bad, key=lambda i: (marks[i][0] != "forward", i))
    return NonFinite("NaN" if math.isnan(values[i]) else "Inf", marks[i][0], marks[i][1], step)


def output_marks(outputs) -> list[tuple[str, str, torch.Tensor]]:
    """Marks of kept step outputs (the last timed step of a turn)."""
    return [("forward", OUTPUT, m) for out in outputs for t in _tensors(out) if (m := _mark(t)) is not None]


@contextlib.contextmanager
def watching(step: str) -> Iterator[Watch]:
    """Inside the block, this context's attention calls are watched (``Watch``) for the step named ``step``."""
    w = Watch(step)
    with instrument.measuring(observers=(w,)):
        yield w


def failed(result: BackendResult, found: NonFinite | None) -> BackendResult:
    """``result`` failed for ``found`` (as it is where nothing was found, or it failed already)."""
    if found is None or not result.ok:
        return result
    return dataclasses.replace(result, status="failed", reasons=(f"{found.text()}: never recommended",),
                               nonfinite=found)
