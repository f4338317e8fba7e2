"""What a model is run on: the inputs of one step (prefill or decode forward) and how to repeat them.

A leaf module: it knows transformers' forward arguments, not how anything is measured.
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn as nn

from .device import device_of

__all__ = ["Workload", "make_workload", "cache_kwarg", "task_of", "MODES"]

#: what one step of a workload is
MODES = ("prefill", "decode")


def task_of(config) -> str:
    """``causal-lm``, ``masked-lm`` or ``seq2seq``: which head a config's model is built with."""
    if getattr(config, "is_encoder_decoder", False):
        return "seq2seq"
    archs = getattr(config, "architectures", None) or []
    if any("MaskedLM" in a for a in archs) or config.model_type in ("bert", "roberta", "distilbert", "xlm-roberta"):
        return "masked-lm"
    return "causal-lm"


def cache_kwarg(model: nn.Module) -> str:
    """The forward argument that takes the KV cache (``cache`` from transformers 5.2x, before that
    ``past_key_values``; the old name still works there, with a warning)."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def _cache_to(cache, dtype: torch.dtype):
    cache = copy.deepcopy(cache)
    for layer in getattr(cache, "layers", []):
        for attr in ("keys", "values"):
            t = getattr(layer, attr, None)
            if isinstance(t, torch.Tensor):
                setattr(layer, attr, t.to(dtype))
    return cache


@dataclass(frozen=True)
class Workload:
    """What one step takes. ``calls(n)`` gives ``n`` argument sets: a decode step needs a fresh copy of
    its KV cache per call (a forward appends to it), made before the call is timed."""

    model: nn.Module
    kwargs: dict[str, Any]
    mode: str = "prefill"
    description: str = ""
    tokens: torch.Tensor | None = field(default=None, repr=False)  # positions that are not padding [b, s]

    def calls(self, n: int) -> Iterator[dict[str, Any]]:
        """``n`` argument sets, made one at a time (a decode cache copy each) as they are taken."""
        if self.mode != "decode":
            yield from itertools.repeat(self.kwargs, n)
            return
        key = cache_kwarg(self.model)
        for _ in range(n):
            yield {**self.kwargs, key: copy.deepcopy(self.kwargs[key])}

    def first(self) -> dict[str, Any]:
        return next(self.calls(1))

    def __call__(self, kwargs: dict[str, Any] | None = None):
        return self.model(**(kwargs if kwargs is not None else self.first()))

    def for_model(self, model: nn.Module) -> Workload:
        """The same inputs for another copy of the model (a float32 reference, say): a KV cache is
        cast to that model's dtype."""
        kwargs = self.kwargs
        if self.mode == "decode":
            key = cache_kwarg(self.model)
            dtype = next(model.parameters()).dtype
            kwargs = {**kwargs, key: _cache_to(kwargs[key], dtype)}
        return dataclasses.replace(self, model=model, kwargs=kwargs)

    @classmethod
    def of(cls, model: nn.Module, batch: dict[str, Any]) -> Workload:
        """A prefill workload from a dict of forward arguments."""
        mask = batch.get("attention_mask")
        return cls(model, batch, description=", ".join(
            f"{k} {tuple(v.shape)}" for k, v in batch.items() if isinstance(v, torch.Tensor)),
            tokens=mask.bool() if isinstance(mask, torch.Tensor) and mask.dim() == 2 else None)


def _padding(mask: torch.Tensor, seq: int, task: str) -> None:
    batch = mask.shape[0]
    for i in range(1, batch):  # row 0 full length, the others shorter
        pad = min(seq - 1, (seq * i) // (2 * batch))
        if task == "causal-lm":
            mask[i, :pad] = 0
        else:
            mask[i, seq - pad:] = 0


def make_workload(model: nn.Module, *, batch: int = 1, seq: int = 128, padding: bool = False,
                  mode: str = "prefill", seed: int = 0) -> Workload:
    """Random token inputs for ``model``: ``padding`` left-pads a decoder's batch (right-pads an
    encoder's); ``mode="decode"`` is one new token against a KV cache of ``seq`` tokens."""
    if batch < 1 or seq < 1:
        raise ValueError(f"batch and seq must be positive, got batch={batch}, seq={seq}")
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, not {mode!r}")
    config = model.config
    task = task_of(config)
    if mode == "decode" and task != "causal-lm":
        raise ValueError("decode mode needs a causal language model")
    device = device_of(model)
    g = torch.Generator().manual_seed(seed)
    vocab = getattr(config, "vocab_size", 1000)
    ids = torch.randint(0, vocab, (batch, seq), generator=g)
    mask = torch.ones(batch, seq, dtype=torch.long)
    if padding:
        _padding(mask, seq, task)
    ids, mask = ids.to(device), mask.to(device)
    kwargs: dict[str, Any] = {"input_ids": ids, "attention_mask": mask}
    if task == "seq2seq":
        kwargs["decoder_input_ids"] = torch.randint(0, vocab, (batch, seq), generator=g).to(device)
    desc = f"batch {batch}, seq {seq}, {mode}" + (", padded" if padding else "")
    if mode == "decode":
        with torch.no_grad():
            out = model(input_ids=ids, attention_mask=mask, use_cache=True)
        nxt = torch.randint(0, vocab, (batch, 1), generator=g).to(device)
        mask = torch.cat([mask, torch.ones(batch, 1, dtype=mask.dtype, device=device)], dim=1)
        kwargs = {"input_ids": nxt, "attention_mask": mask, cache_kwarg(model): out.past_key_values,
                  "use_cache": True}
        return Workload(model, kwargs, "decode", desc, tokens=torch.ones(batch, 1, dtype=torch.bool, device=device))
    tokens = mask.bool() if task != "seq2seq" else torch.ones_like(mask, dtype=torch.bool)
    return Workload(model, kwargs, "prefill", desc, tokens=tokens)
