"""A clock on a model's forwards: when each forward of a step started and ended, on the host and (CUDA
events) on the GPU, its query length, and which attention calls it made. A generate workload is many
forwards per step (a prefill, then one per new token); a training step is one forward, then the backward.
"""

from __future__ import annotations

import time
import weakref
from dataclasses import dataclass

import torch
import torch.nn as nn

from .. import instrument

__all__ = ["Forward", "ForwardClock", "annotate_phases", "query_length"]

try:  # a C++ range, as for the module ranges
    from torch._C._profiler import _RecordFunctionFast as _Range
except ImportError:  # pragma: no cover - older torch
    from torch.autograd.profiler import record_function as _Range


def query_length(args, kwargs) -> int:
    """The query length of a forward from its arguments (the decoder's for an encoder-decoder)."""
    for key in ("decoder_input_ids", "input_ids", "decoder_inputs_embeds", "inputs_embeds"):
        t = kwargs.get(key)
        if isinstance(t, torch.Tensor) and t.dim() >= 2:
            return t.shape[1]
    t = args[0] if args and isinstance(args[0], torch.Tensor) else None
    return t.shape[1] if t is not None and t.dim() >= 2 else 1


@dataclass
class Forward:
    q_len: int
    host_start: float  # perf_counter seconds
    host_end: float = 0.0
    calls_before: int = 0  # attention calls recorded before it began, and when it ended
    calls_after: int = 0
    graphs: int | None = None  # graphs Dynamo compiled while it ran (None: not counted)
    # it starts a generate though it has one query token: an encoder-decoder's first decoder step (new encoder
    # outputs); a decoder's first forward is told by its query length
    first: bool = False
    # where its generate began, for an encoder-decoder's first decoder step: its encoder's start (generate runs the
    # encoder itself, outside the model's forward); None: at its own start
    began: float | None = None
    start: object = None  # CUDA events
    end: object = None

    def gpu_ms(self) -> float | None:
        return self.start.elapsed_time(self.end) if self.start is not None else None


class _ForwardHooks:
    """Hooks around every forward of ``self.model`` while the block runs (removed on exit, even after an
    exception); subclasses define ``_pre`` and ``_post``."""

    model: nn.Module
    _handles: list

    def __enter__(self):
        self._handles = [self.model.register_forward_pre_hook(self._pre, with_kwargs=True, prepend=True),
                         self.model.register_forward_hook(self._post, with_kwargs=True, always_call=True)]
        return self

    def __exit__(self, *exc) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []


def _weak(obj):
    """A weak reference to ``obj``, or a strong one's stand-in where it takes none (a tuple)."""
    try:
        return weakref.ref(obj)
    except TypeError:
        return lambda: obj


def _encoder(model: nn.Module) -> nn.Module | None:
    """An encoder-decoder's encoder (which ``generate`` runs before the decoder's first step); None for others."""
    if not getattr(getattr(model, "config", None), "is_encoder_decoder", False):
        return None
    try:
        encoder = model.get_encoder()
    except Exception:  # (other code's get_encoder: without one, the generate begins at its first forward)
        return None
    return encoder if isinstance(encoder, nn.Module) and encoder is not model else None


def graphs_compiled() -> int:
    """Graphs Dynamo has compiled in this process so far (recompiles included)."""
    return int(torch._dynamo.utils.counters["stats"]["unique_graphs"])


class ForwardClock(_ForwardHooks):
    """Record every forward of ``model`` inside the block (its hooks are removed on exit). ``calls``:
    the list a measurement appends attention calls to, so that each forward knows its calls; ``graphs``:
    count the graphs Dynamo compiles during each (a compiled candidate's: which steps paid a compile)."""

    def __init__(self, model: nn.Module, cuda: bool, calls: list | None = None, graphs: bool = False,
                 generates: bool = False):
        self.model, self.cuda, self.calls, self.graphs = model, cuda, calls, graphs
        # an encoder-decoder's generate runs its encoder outside the model's forward: hooked to clock when the
        # generate began (only there: elsewhere the encoder runs inside the forward, a compiled one's graph too)
        self._encoder = _encoder(model) if generates else None
        self.forwards: list[Forward] = []
        self._handles: list = []
        self._encoded = None  # the encoder outputs the last forward was given (weakly: a generate's own)
        self._encoder_start: float | None = None  # the last encoder forward's start

    def __enter__(self):
        super().__enter__()
        if self._encoder is not None:
            self._handles.append(self._encoder.register_forward_pre_hook(self._encoding, prepend=True))
        return self

    def _encoding(self, module, args):
        self._encoder_start = time.perf_counter()

    def _event(self):
        if not self.cuda:
            return None
        e = torch.cuda.Event(enable_timing=True)
        e.record()
        return e

    def _pre(self, module, args, kwargs):
        n = len(self.calls) if self.calls is not None else 0
        encoded = kwargs.get("encoder_outputs")
        first = encoded is not None and (self._encoded is None or self._encoded() is not encoded)
        if first:
            self._encoded = _weak(encoded)
        began, self._encoder_start = (self._encoder_start if first else None), None
        self.forwards.append(Forward(query_length(args, kwargs), time.perf_counter(), calls_before=n,
                                     start=self._event(), graphs=graphs_compiled() if self.graphs else None,
                                     first=first, began=began))

    def _post(self, module, args, kwargs, output):
        f = self.forwards[-1]
        f.end = self._event()
        f.host_end = time.perf_counter()
        f.calls_after = len(self.calls) if self.calls is not None else 0
        if f.graphs is not None:  # (at its start: the count so far)
            f.graphs = graphs_compiled() - f.graphs


class annotate_phases(_ForwardHooks):
    """A profiler range ``attnswitch.phase:prefill`` or ``...:decode`` around each forward of ``model``
    (decode: one query token). Enter it after the module ranges, so that it encloses them."""

    def __init__(self, model: nn.Module):
        self.model = model
        self._open: list = []
        self._handles: list = []

    def _pre(self, module, args, kwargs):
        phase = "decode" if query_length(args, kwargs) == 1 else "prefill"
        rf = _Range(instrument.PHASE_PREFIX + phase)
        rf.__enter__()
        self._open.append(rf)

    def _post(self, module, args, kwargs, output):
        if self._open:
            self._open.pop().__exit__(None, None, None)
