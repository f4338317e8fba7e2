"""What a model is run on: one step of a workload and how to repeat it.

A step is one forward (``prefill``: the whole sequence; ``decode``: one new token against a KV cache), a
whole ``generate`` workload (greedy generation of exactly ``new_tokens`` tokens for each of several
prompt lengths), or a ``train`` step (forward and backward of the model's loss, no optimizer step).
A leaf module: it knows transformers' arguments, not how anything is measured.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import inspect
import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn as nn

from . import options
from .device import device_of
from .request import Request
from .words import counted

__all__ = ["Workload", "Generation", "make_workload", "position_limit", "cache_kwarg", "task_of", "loss_of",
           "prompt_lengths", "caches", "cached", "fresh", "kept", "check_runnable", "MODES", "CACHES"]

#: generation_config fields that ask for another decoding than greedy search (set: None where given)
_OTHER_DECODING = ("penalty_alpha", "prompt_lookup_num_tokens", "assistant_early_exit", "dola_layers")

MODES, CACHES = options.MODES, options.CACHES
prompt_lengths = options.prompt_lengths


@dataclass(frozen=True)
class Generation:
    """A generate workload: greedy, exactly ``new_tokens`` new tokens per prompt, one prompt length after
    another (a server sees many lengths: a key length is new for some steps, seen for others)."""

    prompt_lens: tuple[int, ...]
    new_tokens: int
    cache: str = "dynamic"


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


def cached(kwargs: dict[str, Any]) -> list[str]:
    """The arguments of ``kwargs`` that hold a KV cache (a transformers ``Cache``: a forward appends to it)."""
    from transformers.cache_utils import Cache

    return [k for k, v in kwargs.items() if isinstance(v, Cache)]


def fresh(kwargs: dict[str, Any]) -> dict[str, Any]:
    """``kwargs`` with a copy of each KV cache it holds: a step on them leaves the caller's as it was (and
    every step, and every backend, runs at the same key length)."""
    keys = cached(kwargs)
    return {**kwargs, **{k: _copied(kwargs[k]) for k in keys}} if keys else kwargs


def _parts(cache) -> list:
    """A cache and the caches it holds (an encoder-decoder's: its self-attention and cross-attention caches)."""
    inner = [getattr(cache, n, None) for n in ("self_attention_cache", "cross_attention_cache")]
    return [cache, *(p for c in inner if c is not None for p in _parts(c))]


def _copied(cache):
    """A copy of ``cache``, its tensors copied and any stream it holds shared (an offloading cache's prefetch
    stream, which cannot be copied)."""
    memo = {id(v): v for c in _parts(cache) for v in vars(c).values() if type(v).__name__.endswith("Stream")}
    return copy.deepcopy(cache, memo)


def _cache_to(cache, dtype: torch.dtype):
    cache = _copied(cache)
    for layer in (layer for c in _parts(cache) for layer in getattr(c, "layers", [])):
        for attr in ("keys", "values"):
            t = getattr(layer, attr, None)
            if isinstance(t, torch.Tensor):
                setattr(layer, attr, t.to(dtype))
    return cache


def loss_of(out) -> torch.Tensor:
    """The model's own loss where it computed one, else a stated stand-in: the mean square of its output."""
    loss = getattr(out, "loss", None)
    if loss is not None:
        return loss
    t = getattr(out, "logits", None)
    t = t if t is not None else getattr(out, "last_hidden_state", None)
    t = t if t is not None else (out if isinstance(out, torch.Tensor) else out[0])
    return t.float().square().mean()


@contextlib.contextmanager
def kept(model: nn.Module, training: bool) -> Iterator[None]:
    """The model in training mode (dropout as configured) or eval mode for the block, holding no gradients; every
    module's mode and every parameter's gradient put back as found after, on any exit (a step's backward would
    add into the gradient tensors the user holds, and a step that starts from them would not be the user's)."""
    modes = [(m, m.training) for m in model.modules()]
    grads = [(p, p.grad) for p in model.parameters()]
    try:
        model.train(training)
        for p, _ in grads:
            p.grad = None
        yield
    finally:
        # back through train() itself, whatever a module's own train() does besides its flag (an adapter that
        # eval() merges into its weight, train() unmerges): the model's, then, outermost first, each module's that
        # has a train() of its own (a mode of its own under another); then each module's flag as found
        model.train(modes[0][1])
        for m, was in modes[1:]:
            if type(m).train is not nn.Module.train:
                m.train(was)
        for m, was in modes:
            m.training = was
        for p, g in grads:
            p.grad = g


def _brings_weights(hook) -> bool:
    """Whether an accelerate hook (or one of a sequence of them) brings offloaded weights in before a forward."""
    return any(getattr(h, "offload", False) or getattr(h, "weights_map", None) is not None
               for h in ([hook, *getattr(hook, "hooks", ())] if hook is not None else ()))


def check_runnable(model: nn.Module, mode: str) -> None:
    """What no backend can run, refused before any step: weights never loaded (every parameter on the meta
    device, and no accelerate hook to bring them in: its offloading leaves some or all there), and a training step
    of a model with every parameter frozen."""
    params = list(model.parameters())
    offloaded = any(_brings_weights(getattr(m, "_hf_hook", None)) for m in model.modules())
    if params and all(p.device.type == "meta" for p in params) and not offloaded:
        raise options.OptionError("the model's weights are on the meta device (never loaded): load them first "
                                  "(from_pretrained, or to_empty(device=...) and load_state_dict)")
    if mode == "train" and not any(p.requires_grad for p in params):
        raise options.OptionError("{mode} train needs parameters to train: every parameter of the model is frozen "
                                  "(requires_grad=False)")


@dataclass(frozen=True)
class Workload:
    """What one step takes. ``calls(n)`` gives ``n`` argument sets: a decode step needs a fresh copy of
    its KV cache per call (a forward appends to it), made before the call is timed. ``step(kwargs)``
    runs one step, in its own grad mode; ``context()`` holds what a measurement of many steps needs
    (training mode for a train workload)."""

    model: nn.Module
    kwargs: dict[str, Any]
    mode: str = "prefill"
    description: str = ""
    tokens: torch.Tensor | None = field(default=None, repr=False)  # positions that are not padding [b, s]
    generation: Generation | None = None
    prompts: tuple[dict, ...] = field(default=(), repr=False)  # generate: the inputs of each prompt length
    loss: str = ""  # train: what the loss is

    def step(self, kwargs: dict[str, Any] | int | None = None):
        """One step: a forward (no grad), a whole generate workload (or, given an index, its one prompt),
        or forward + backward."""
        if self.mode == "generate":
            prompts = self.prompts if not isinstance(kwargs, int) else (self.prompts[kwargs],)
            with torch.no_grad():
                return [self.model.generate(**p, **self.generate_kwargs()) for p in prompts]
        kwargs = kwargs if kwargs is not None else self.first()
        if self.mode == "train":
            with torch.enable_grad():
                loss = loss_of(self.model(**kwargs))
                loss.backward()
            self.model.zero_grad(set_to_none=True)  # no optimizer: each step starts without gradients
            return loss.detach()
        with torch.no_grad():
            return self.model(**kwargs)

    def generate_kwargs(self) -> dict[str, Any]:
        """Greedy generation of exactly ``new_tokens`` tokens (end-of-sequence tokens do not stop it), with a
        KV cache where the model keeps one (``caches``: a transformers model whose config sets ``use_cache=False``
        would run every step over the whole sequence: no decode step), never compiled by transformers
        itself (it compiles a static cache's decode steps on a GPU unless told not to): a compiled candidate
        compiles them its own way (``profiling.compiled``), an uncompiled one is."""
        g = self.generation
        config = getattr(self.model, "generation_config", None)
        pad = getattr(config, "pad_token_id", None)
        pad = pad if pad is not None else getattr(config, "eos_token_id", None)
        # one sequence per prompt, greedy (a checkpoint's generation_config may ask for beams: 3-4x the rows)
        kw: dict[str, Any] = {"max_new_tokens": g.new_tokens, "min_new_tokens": g.new_tokens, "do_sample": False,
                              "num_beams": 1, "num_return_sequences": 1,
                              "pad_token_id": pad[0] if isinstance(pad, list) else (pad if pad is not None else 0),
                              "disable_compile": True}
        # nor another decoding the checkpoint asks for (contrastive search, prompt lookup), where it does
        kw.update({k: None for k in _OTHER_DECODING if getattr(config, k, None) is not None})
        if caches(self.model):
            kw["use_cache"] = True
        # the cache named, whatever the checkpoint's generation_config says (Gemma-3's: "hybrid"); dynamic: None,
        # transformers' default for the model (a model with a cache class of its own, a state-space hybrid's, gets it)
        kw["cache_implementation"] = "static" if g.cache == "static" else None
        if getattr(self.model.config, "is_encoder_decoder", False):
            kw["decoder_start_token_id"] = self._decoder_start(kw["pad_token_id"])
        return kw

    def _decoder_start(self, pad: int) -> int:
        """The token an encoder-decoder's decoder starts from: as its configs state it, else padding (T5's)."""
        for c in (getattr(self.model, "generation_config", None), self.model.config):
            start = getattr(c, "decoder_start_token_id", None)
            if start is not None:
                return start
        return pad

    def made_for(self, model: nn.Module) -> Workload:
        """This workload, where it was made for ``model``; a workload of another model is bad input (measured, it
        would run that model, never this one)."""
        if self.model is not model:
            raise options.OptionError("the workload was made for another model ({theirs}, not this {ours}): "
                                      "make_workload(model, ...) makes one for this model, and "
                                      "work.for_model(model) gives a copy of the model the same inputs",
                                      theirs=type(self.model).__name__, ours=type(model).__name__)
        return self

    def context(self):
        """What a measurement of many steps holds around them (``kept``): training mode for a train workload,
        eval mode (dropout off) for the others, which are inference; the user's gradients set aside."""
        return kept(self.model, training=self.mode == "train")

    def calls(self, n: int) -> Iterator[dict[str, Any]]:
        """``n`` argument sets, made one at a time (a copy of each KV cache, as a decode step's) as they are
        taken."""
        if not cached(self.kwargs):
            yield from itertools.repeat(self.kwargs, n)
            return
        for _ in range(n):
            yield fresh(self.kwargs)

    def first(self) -> dict[str, Any]:
        return next(self.calls(1))

    def __call__(self, kwargs: dict[str, Any] | None = None):
        """One forward of the model on the step's inputs (for a generate workload, its first prompt)."""
        if kwargs is None:
            kwargs = self.prompts[0] if self.mode == "generate" else self.first()
            if self.mode == "generate" and getattr(self.model.config, "is_encoder_decoder", False):
                ids = kwargs["input_ids"]  # the prefill of a generate: the prompt, and the decoder's start
                start = self.generate_kwargs()["decoder_start_token_id"]
                kwargs = {**kwargs, "decoder_input_ids": torch.full((ids.shape[0], 1), start, device=ids.device)}
        return self.model(**kwargs)

    def for_model(self, model: nn.Module) -> Workload:
        """The same inputs for another copy of the model (a float32 reference, say): a KV cache, and floating
        point inputs in the model's dtype (an audio model's features, embeddings), are cast to that model's
        dtype (ids and masks are left as they are)."""
        dtype = next(model.parameters()).dtype
        old = next(self.model.parameters()).dtype
        kwargs = {k: v.to(dtype) if isinstance(v, torch.Tensor) and v.dtype == old and v.is_floating_point() else v
                  for k, v in self.kwargs.items()}
        kwargs.update({k: _cache_to(kwargs[k], dtype) for k in cached(kwargs)})
        return dataclasses.replace(self, model=model, kwargs=kwargs)

    def short(self, new_tokens: int = 8) -> Workload:
        """The workload cut short for a profiled pass: a generate of the first prompt, at most
        ``new_tokens`` tokens (the other modes as they are)."""
        return self.prompt(0, new_tokens) if self.mode == "generate" else self

    def prompt(self, i: int, new_tokens: int | None = None) -> Workload:
        """A generate workload of its prompt ``i`` alone, at most ``new_tokens`` tokens (default: all)."""
        if self.mode != "generate":
            raise ValueError(f"prompt({i}) is a generate workload's; this one is {self.mode}")
        if not -len(self.prompts) <= i < len(self.prompts):
            raise IndexError(f"prompt {i} of a generate workload of {len(self.prompts)} prompts")
        i %= len(self.prompts)
        g = self.generation
        n = g.new_tokens if new_tokens is None else min(g.new_tokens, new_tokens)
        return dataclasses.replace(self, generation=Generation(g.prompt_lens[i:i + 1], n, g.cache),
                                   prompts=self.prompts[i:i + 1])

    def describe(self) -> dict[str, Any]:
        """The workload as a report records it."""
        d: dict[str, Any] = {"description": self.description, "mode": self.mode}
        ids = (self.prompts[0] if self.prompts else self.kwargs).get("input_ids")
        if isinstance(ids, torch.Tensor) and ids.dim() == 2:
            d["batch"] = ids.shape[0]
            cache = next((self.kwargs[k] for k in cached(self.kwargs)), None) if self.mode == "decode" else None
            if cache is not None:  # a decode step: its key length
                d["seq"] = int(cache.get_seq_length())
            elif self.generation is None:  # (a generate's lengths are its prompts')
                d["seq"] = ids.shape[1]
        if self.generation is not None:
            d.update(prompt_lens=list(self.generation.prompt_lens), new_tokens=self.generation.new_tokens,
                     cache=self.generation.cache if caches(self.model) else "none")  # ("none": the model's config)
        if self.loss:
            d["loss"] = self.loss
        if getattr(getattr(self.model, "config", None), "is_encoder_decoder", False):
            d["encoder_decoder"] = True  # (its decoder's first step has one query token: compiled with the rest)
        return d

    @classmethod
    def of(cls, model: nn.Module, batch: dict[str, Any]) -> Workload:
        """A workload from a dict of forward arguments: a prefill, or with a KV cache and one new token per row,
        a decode step. Every step runs on its own copy of a cache the dict holds (``calls``)."""
        mask = batch.get("attention_mask")
        tokens = mask.bool() if isinstance(mask, torch.Tensor) and mask.dim() == 2 else None
        described = [f"{k} {tuple(v.shape)}" for k, v in batch.items() if isinstance(v, torch.Tensor)]
        keys = cached(batch)
        if not keys:
            return cls(model, batch, description=", ".join(described), tokens=tokens)
        # the tokens a step adds against the cache: an encoder-decoder's decoder's (its encoder's are its input)
        names = ("input_ids", "inputs_embeds")
        if getattr(getattr(model, "config", None), "is_encoder_decoder", False):
            names, mask = ("decoder_input_ids", "decoder_inputs_embeds"), batch.get("decoder_attention_mask")
            tokens = mask.bool() if isinstance(mask, torch.Tensor) and mask.dim() == 2 else None
        ids = next((batch[k] for k in names if isinstance(batch.get(k), torch.Tensor) and batch[k].dim() >= 2), None)
        new = ids.shape[1] if ids is not None else None
        if tokens is not None and new is not None:  # (the mask covers the cache's positions too)
            tokens = tokens[:, -new:]
        length = batch[keys[0]].get_seq_length()
        described.append(f"a KV cache of {counted(length, 'token')} (a copy for every step)")
        return cls(model, batch, "decode" if new == 1 else "prefill", ", ".join(described), tokens=tokens)


def _padding(mask: torch.Tensor, seq: int, task: str) -> None:
    batch = mask.shape[0]
    for i in range(1, batch):  # row 0 full length, the others shorter (by one position at least)
        pad = min(seq - 1, max(1, (seq * i) // (2 * batch)))
        if task == "causal-lm":
            mask[i, :pad] = 0
        else:
            mask[i, seq - pad:] = 0


def _check_generation(model: nn.Module, prompt_lens, new_tokens: int) -> None:
    if not (hasattr(model, "can_generate") and model.can_generate()):
        raise options.OptionError("{model} cannot generate (no language-model head): use {mode} prefill or train",
                                  model=type(model).__name__)
    options.check_positions(position_limit(model), "generate", 0, new_tokens, prompt_lens)


def position_limit(model: nn.Module) -> int | None:
    """The positions a model can take at all: the size of its learned table of absolute positions (GPT-2's
    ``wpe``, BERT's ``position_embeddings``; OPT's has two more rows), the config's stated maximum. None
    where positions are computed (rotary, relative: they run past the maximum the model was trained to)."""
    config = model.config
    limit = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
    if not isinstance(limit, int):
        return None
    tokens = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    for m in model.modules():
        if isinstance(m, nn.Embedding) and m is not tokens and limit <= m.num_embeddings <= limit + 2:
            return limit
    return None


def _train_kwargs(model: nn.Module, kwargs: dict[str, Any], task: str) -> tuple[dict[str, Any], str]:
    if "labels" not in inspect.signature(model.forward).parameters:
        return kwargs, "stand-in: the mean square of the model's output (the model computes no loss)"
    if task == "seq2seq":
        return {**kwargs, "labels": kwargs["decoder_input_ids"]}, "the model's loss, labels = the decoder inputs"
    # no loss on padding, nor on a token predicted from a padding position (the first after left padding:
    # what a fully masked query row computes is each implementation's own convention)
    mask = kwargs["attention_mask"]
    prev = torch.cat([torch.ones_like(mask[:, :1]), mask[:, :-1]], dim=1)
    labels = kwargs["input_ids"].masked_fill((mask == 0) | (prev == 0), -100)
    return {**kwargs, "labels": labels}, "the model's loss, labels = the inputs (none on padding)"


def caches(model) -> bool:
    """Whether ``model`` generates with a KV cache: where its config asks for one, and, where it does not, where
    the model is one of transformers' own, all of which keep one (a config's ``use_cache=False`` is a default,
    not a limit there). A model of other code keeps its config's word: it may not take a cache at all."""
    if getattr(getattr(model, "config", None), "use_cache", True) is not False:
        return True
    return type(model).__module__.startswith("transformers.models.")


def _generate_workload(model, ids_of, batch, seq, new_tokens, prompt_lens, cache, device) -> Workload:
    lens = tuple(int(n) for n in prompt_lens) if prompt_lens is not None else prompt_lengths(seq, new_tokens)
    _check_generation(model, lens, new_tokens)
    prompts = []
    for n in lens:
        ids = ids_of(n).to(device)
        prompts.append({"input_ids": ids, "attention_mask": torch.ones_like(ids)})
    desc = (f"batch {batch}, prompts of {', '.join(map(str, lens))} tokens, {counted(new_tokens, 'new token')} each, "
            + (f"greedy, {cache} cache" if caches(model) else "greedy, no KV cache (the model's config)"))
    return Workload(model, prompts[0], "generate", desc, generation=Generation(lens, new_tokens, cache),
                    prompts=tuple(prompts))


def make_workload(model: nn.Module, *, batch: int = 1, seq: int = 128, padding: bool = False,
                  mode: str = "prefill", seed: int = 0, new_tokens: int | None = None,
                  prompt_lens: tuple[int, ...] | None = None, cache: str = "dynamic") -> Workload:
    """Random token inputs for ``model``: ``padding`` left-pads a decoder's batch (right-pads an
    encoder's); ``mode="decode"`` is one new token against a KV cache of ``seq`` tokens;
    ``mode="generate"`` generates ``new_tokens`` tokens (default 128) for prompts of ``prompt_lens`` tokens
    (default: lengths spread around ``seq``, ``options.prompt_lengths``); ``mode="train"`` is forward and backward
    of the loss on ``seq`` tokens. What a mode does not take (``new_tokens``, ``prompt_lens``, ``cache`` outside a
    generate) is refused, by the rules the command line's options meet (``request.Request.check``)."""
    generate = mode == "generate"
    Request(mode=mode, batch=(batch,), seq=() if generate else (seq,),
            prompt_len=(seq,) if generate and prompt_lens is None else (),  # (the length they spread around)
            padding=padding, prompt_lens=prompt_lens, new_tokens=() if new_tokens is None else (new_tokens,),
            cache=cache).check()
    new_tokens = 128 if new_tokens is None else new_tokens
    check_runnable(model, mode)
    batch, seq = int(batch), int(seq)
    config = model.config
    takes = getattr(model, "main_input_name", "input_ids")
    if takes != "input_ids":  # a vision or speech model (ViT's pixel_values, Whisper's input_features)
        inputs = f"{takes!r}: ..." + (", 'decoder_input_ids': ..." if getattr(config, "is_encoder_decoder", False)
                                      else "")
        raise options.OptionError(
            "{model} takes {takes}, not tokens, and attnswitch builds token inputs only: profile it from Python "
            "with inputs of your own, attnswitch.compare(model, {{{inputs}}})", model=type(model).__name__,
            takes=takes, inputs=inputs)
    task = task_of(config)
    if mode == "decode" and task != "causal-lm":
        raise options.OptionError("{mode} decode needs a causal language model; {model} is {task}",
                                  model=type(model).__name__, task=task)
    if mode != "generate":
        options.check_positions(position_limit(model), mode, seq)
    device = device_of(model)
    g = torch.Generator().manual_seed(seed)
    vocab = getattr(config, "vocab_size", 1000)
    if mode == "generate":
        return _generate_workload(model, lambda n: torch.randint(0, vocab, (batch, n), generator=g), batch, seq,
                                  new_tokens, prompt_lens, cache, device)
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
    if mode == "train":
        kwargs, loss = _train_kwargs(model, kwargs, task)
        return Workload(model, kwargs, "train", desc + f"; loss: {loss}", tokens=tokens, loss=loss)
    return Workload(model, kwargs, "prefill", desc, tokens=tokens)
