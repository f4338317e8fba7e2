"""What kind of step a workload times, as a value: prefill, decode, generate, train.

Everything that differs between kinds and is not how a step runs (``workload.py`` runs them) lives in its
row here: the words a report uses for its step and its columns, whether a sweep of it can be asked and over
which length, what it needs of the model, where its pick is deployed and the line that runs it there. A
leaf without torch: the command line reads it before torch is imported. A new kind is a row here, its step
in ``workload.py``, and what it adds to a result (``profiling/stepstats.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Kind", "KINDS", "NAMES", "kind_of", "CALLABLE"]


@dataclass(frozen=True)
class Kind:
    """One kind of step. ``step``: what one timed step is; ``short``: its abbreviation in column headers
    (``time/fwd ms``); ``counted``: what the profiler's counts are per, abbreviated and said whole; ``timed``:
    what its timing rounds time, as a note says it; ``length``: what its length is called (a generate's is its
    prompts'); ``sweeps``: a sweep over lengths can be asked; ``lm``: it needs a language-model head (a causal
    one where ``causal``); ``generates``: it generates new tokens from prompts (its rounds are per prompt, its
    decode steps compiled alone, its tokens checked); ``grads``: it runs a backward (its gradients checked);
    ``where``: where its pick is deployed; ``call``: the line that runs a step there
    (``model`` and ``inputs`` in scope)."""

    name: str
    step: str
    short: str
    counted: tuple[str, str]
    timed: str
    length: str = "seq"
    sweeps: bool = True
    lm: bool = False
    causal: bool = False
    generates: bool = False
    grads: bool = False
    where: str = "the serving process"
    call: str = "model(**inputs)"

    @property
    def unit(self) -> str:
        """``per forward``: what a ranked time is per."""
        return f"per {self.step}"


_FWD = ("fwd", "per forward")

KINDS: dict[str, Kind] = {k.name: k for k in (
    Kind("prefill", "forward", "fwd", _FWD, "forwards"),
    Kind("decode", "forward", "fwd", _FWD, "decode forwards", sweeps=False, lm=True, causal=True),
    Kind("generate", "generate workload", "workload", ("gen", "per profiled short generate (the first prompt, one "
                                                              "prefill and up to 7 decode forwards)"),
         "the whole generate workload", length="prompt", lm=True, generates=True,
         call="model.generate(**inputs)"),
    Kind("train", "training step", "step", ("step", "per training step (forward and backward)"), "training steps",
         grads=True, where="the training script", call="model(**inputs).loss.backward()"),
)}
#: the kinds' names, in the order the command line offers them
NAMES: tuple[str, ...] = tuple(KINDS)
#: a plain callable profiled (``profile(lambda: ...)``): its step is one call
CALLABLE = Kind("callable", "call", "call", ("call", "per call"), "calls", sweeps=False)


def kind_of(workload) -> Kind:
    """The kind of a workload: a ``Workload``, a report's workload dict, its mode's name, or None (a callable)."""
    if workload is None:
        return CALLABLE
    name = workload if isinstance(workload, str) else (
        workload.get("mode") if isinstance(workload, dict) else getattr(workload, "mode", None))
    return KINDS.get(name, CALLABLE) if name is not None else KINDS["prefill"]
