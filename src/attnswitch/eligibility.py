"""``check``: which backends can run a model's inputs here, and, where not, PyTorch's reasons."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import torch
import torch.nn as nn

from .backends import names as backend_names
from .backends import parse_backends, recording_notes, resolve_name
from .device import device_of
from .errors import BackendUnavailable
from .instrument import measuring
from .options import OptionError
from .results import no_attention_text
from .switch import backend as use_backend
from .workload import check_runnable, fresh, kept

__all__ = ["Eligibility", "CheckResult", "check"]


@dataclass(frozen=True)
class Eligibility:
    backend: str
    ok: bool
    reasons: tuple[str, ...] = ()
    where: str | None = None
    notes: tuple[str, ...] = ()  # layout changes made so that the backend could run
    calls: int | None = None  # attention calls the step made through the switch (None: not counted)


@dataclass(frozen=True)
class CheckResult:
    results: Mapping[str, Eligibility] = field(default_factory=dict)

    def __getitem__(self, name: str) -> Eligibility:
        try:
            return self.results[resolve_name(name)]
        except ValueError:  # a backend registered when the check ran, not now
            return self.results[name]

    def __iter__(self):
        return iter(self.results.values())

    @property
    def no_attention(self) -> bool:
        """Backends ran, and none made an attention call (a state-space model): none of them is used at all."""
        ran = [e for e in self if e.ok]
        return bool(ran) and all(e.calls == 0 for e in ran)

    @property
    def eligible(self) -> list[str]:
        return [] if self.no_attention else [n for n, e in self.results.items() if e.ok]

    def __str__(self) -> str:
        if self.no_attention:
            return no_attention_text()
        lines = []
        for e in self:
            head = f"{e.backend:<14} {'ok' if e.ok else 'UNAVAILABLE'}"
            if e.where and not e.ok:
                head += f" at {e.where}"
            lines.append(head)
            lines += [f"    - {r}" for r in e.reasons]
            lines += [f"    note: {n}" for n in e.notes]
        return "\n".join(lines)


def check(model: nn.Module, *args, backends: Iterable[str] | str | None = None, work=None,
          **batch) -> CheckResult:
    """Run one forward of ``model(*args, **batch)`` under each backend (no grad, in eval mode) and record whether
    the backend could run it; nothing is kept but the verdicts. Given ``work`` (a ``Workload``) instead, one
    step of it as its mode runs: a training step's forward and backward in training mode, a generate's first
    prompt with its decode steps. Every registered backend by default, those that cannot exist on this device
    included (with the reason). Inputs the model itself refuses (a misspelt argument, say) raise, as the model
    does; so does a selection the model cannot take (a layer kind it does not have: ``OptionError``)."""
    if work is not None:
        work.made_for(model)
    if work is not None and (args or batch):
        raise OptionError("give the inputs or {work}, not both")
    check_runnable(model, work.mode if work is not None else "prefill")
    names = backend_names(compared=True) if backends is None else parse_backends(backends, device_of(model), False)

    def step():
        if work is None:  # (as compare runs the same inputs: in eval mode, dropout off)
            with torch.no_grad(), kept(model, training=False):
                model(*args, **fresh(batch))  # (a KV cache copied: the caller's is left as it was)
            return
        with work.context():  # (the user's gradients as found, whatever the step left)
            work.step(0 if work.mode == "generate" else None)

    step()  # the model's own attention first: an error here is the inputs', not a backend's
    results: dict[str, Eligibility] = {}
    for name in names:
        with recording_notes() as notes:
            try:
                calls: list = []
                with use_backend(name, model=model), measuring(host_times=calls):
                    step()
                results[name] = Eligibility(name, True, notes=tuple(dict.fromkeys(n[2] for n in notes)),
                                            calls=len(calls))
            except OptionError:
                raise  # bad input, not a backend that cannot run
            except BackendUnavailable as e:
                results[name] = Eligibility(name, False, tuple(e.reasons), e.where)
            except (RuntimeError, ValueError, NotImplementedError) as e:
                results[name] = Eligibility(name, False, (f"{type(e).__name__}: {e}",))
    return CheckResult(results)
