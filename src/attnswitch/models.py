"""Built-in model presets (configs of real architectures, random weights), model loading, inputs.

A preset needs no download: the config is written here and the weights are random, which is all
attention timing needs. ``load_model`` also takes a local folder (``from_pretrained``, safetensors
only), a ``config.json`` (random weights) or a hub id where the hub is reachable.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import socket
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForCausalLM,
    AutoModelForMaskedLM,
    AutoModelForSeq2SeqLM,
    BertConfig,
    GPT2Config,
    LlamaConfig,
    MistralConfig,
    Qwen2Config,
    T5Config,
)

from . import dist
from .workload import task_of

__all__ = ["PRESETS", "Preset", "DEVICE_MAPS", "default_preset", "load_model", "parse_dtype"]


@dataclass(frozen=True)
class Preset:
    name: str
    make_config: Callable[[], Any]
    task: str  # "causal-lm", "masked-lm" or "seq2seq"
    about: str


def _llama_1b():
    return LlamaConfig(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                       num_attention_heads=32, num_key_value_heads=8, head_dim=64, max_position_embeddings=131072,
                       rms_norm_eps=1e-5, rope_theta=500000.0, tie_word_embeddings=True)


def _qwen25_05b():
    return Qwen2Config(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                       num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
                       rope_theta=1000000.0, tie_word_embeddings=True)


def _mistral_7b():
    return MistralConfig(vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                         num_attention_heads=32, num_key_value_heads=8, sliding_window=4096,
                         max_position_embeddings=32768, rope_theta=10000.0)


def _tiny_mistral():
    # Mistral's shape scaled down, with a window shorter than the sequences it is tested on
    return MistralConfig(vocab_size=1024, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                         num_attention_heads=8, num_key_value_heads=2, sliding_window=16,
                         max_position_embeddings=4096)


def _t5_small():
    # T5Config's defaults are t5-small's shape; its token ids as t5-small's config states them (generate
    # needs the decoder's start token)
    return T5Config(pad_token_id=0, eos_token_id=1, decoder_start_token_id=0)


def _tiny_llama():
    return LlamaConfig(vocab_size=1024, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                       num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=4096)


PRESETS: dict[str, Preset] = {p.name: p for p in [
    Preset("llama-3.2-1b", _llama_1b, "causal-lm", "Llama-3.2-1B shape: 16 layers, 32 q / 8 kv heads, d 64"),
    Preset("qwen2.5-0.5b", _qwen25_05b, "causal-lm", "Qwen2.5-0.5B shape: 24 layers, 14 q / 2 kv heads, d 64"),
    Preset("mistral-7b", _mistral_7b, "causal-lm", "Mistral-7B shape: 32 layers, 32 q / 8 kv heads, window 4096"),
    Preset("gpt2", GPT2Config, "causal-lm", "GPT-2 (124M): 12 layers, 12 heads, d 64"),
    Preset("bert-base", BertConfig, "masked-lm", "BERT-base: 12 layers, 12 heads, bidirectional encoder"),
    Preset("t5-small", _t5_small, "seq2seq", "T5-small: encoder-decoder with relative position bias"),
    Preset("tiny-llama", _tiny_llama, "causal-lm", "a 4-layer Llama with GQA, for CPUs and tests"),
    Preset("tiny-mistral", _tiny_mistral, "causal-lm", "a 2-layer Mistral with a 16-token sliding window"),
]}


def default_preset(device: torch.device | str) -> str:
    """The preset ``compare`` uses without a model: real-sized on a GPU, tiny on a CPU."""
    return "llama-3.2-1b" if torch.device(device).type == "cuda" else "tiny-llama"


_DTYPES = {"fp32": torch.float32, "float32": torch.float32, "fp16": torch.float16, "float16": torch.float16,
           "half": torch.float16, "bf16": torch.bfloat16, "bfloat16": torch.bfloat16}


def parse_dtype(name: str | torch.dtype) -> torch.dtype:
    if isinstance(name, torch.dtype):
        return name
    try:
        return _DTYPES[name.lower()]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; use one of fp32, fp16, bf16") from None


_AUTO = {"causal-lm": AutoModelForCausalLM, "masked-lm": AutoModelForMaskedLM, "seq2seq": AutoModelForSeq2SeqLM}


def _from_config(config, task: str, dtype: torch.dtype, device: torch.device, seed: int) -> nn.Module:
    config = copy.deepcopy(config)  # from_config mutates the config it is given
    # random weights from ``seed``, without touching the caller's random state
    devices = [device.index or 0] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices), torch.device(device):
        torch.manual_seed(seed)
        try:
            model = _AUTO[task].from_config(config, dtype=dtype)
        except ValueError:
            model = AutoModel.from_config(config, dtype=dtype)
    return model.eval()


DEVICE_MAPS = ("auto", "balanced", "balanced_low_0", "sequential")


def load_model(spec: str, *, dtype: torch.dtype | str = torch.float32, device: torch.device | str = "cpu",
               trust_remote_code: bool = False, layers: int | None = None, seed: int = 0,
               device_map: str | dict | None = None, tp: bool = False) -> tuple[nn.Module, str]:
    """Build or load a model from ``spec``; returns ``(model in eval mode, description)``.

    ``spec`` is a preset name, a local folder (``from_pretrained``, safetensors only), a path to a
    ``config.json`` (random weights) or a hub id. ``layers`` sets the layer count: a checkpoint's
    first ``layers``; a preset's or config's random-weight model may have more.

    A model larger than one GPU is loaded the way transformers loads it: ``device_map`` (``"auto"``,
    ``"balanced"``, ``"sequential"`` or a dict) spreads its layers over the GPUs with accelerate's
    hooks; ``tp=True`` (under ``torchrun``) shards it over the ranks with ``tp_plan="auto"``. Random
    weights (presets, configs) are saved to a temporary folder first and loaded from there by
    ``from_pretrained``, so the distributed model is exactly what a checkpoint gives.
    """
    dtype, device = parse_dtype(dtype), torch.device(device)
    if device_map is not None and tp:
        raise ValueError("device_map and tensor parallelism exclude each other; choose one")
    if isinstance(device_map, str) and device_map not in DEVICE_MAPS:
        raise ValueError(f"device_map {device_map!r}: use one of {', '.join(DEVICE_MAPS)} or a dict")
    if device_map is not None or tp:
        return _load_distributed(spec, dtype, device, trust_remote_code, layers, seed, device_map, tp)
    if spec in PRESETS:
        preset = PRESETS[spec]
        config = preset.make_config()
        cut = _set_layers(config, layers, grow=True)
        return (_from_config(config, preset.task, dtype, device, seed),
                f"preset {spec} ({preset.about}){cut}, random weights")
    path = Path(spec)
    if path.is_file():
        if path.suffix != ".json":
            raise ValueError(f"{spec}: expected a config.json, a model folder, a preset or a hub id")
        try:
            config = AutoConfig.from_pretrained(str(path), trust_remote_code=trust_remote_code)
        except (OSError, ValueError, json.JSONDecodeError, KeyError) as e:
            raise ValueError(f"{spec}: cannot read this config ({type(e).__name__}: {e})") from None
        cut = _set_layers(config, layers, grow=True)
        return _from_config(config, task_of(config), dtype, device, seed), f"config {spec}{cut}, random weights"
    if path.is_dir():
        if not any(path.glob("*.safetensors")):
            raise ValueError(f"{spec}: no *.safetensors weights in this folder (pickle weights are not loaded)")
        return (_pretrained(str(path), dtype, device, trust_remote_code, layers),
                f"folder {spec}" + (f", first {layers} layers" if layers is not None else ""))
    if (os.sep in spec and not _looks_like_hub_id(spec)) or spec.startswith((".", "/", "~")):
        raise ValueError(f"{spec}: no such file or folder, and not a preset ({', '.join(PRESETS)})")
    if not _looks_like_hub_id(spec):
        raise ValueError(f"unknown model {spec!r}: not a preset ({', '.join(PRESETS)}), a folder, a config.json "
                         "or a hub id (owner/name)")
    cached_only = _hub_unresolvable()
    try:
        model = _pretrained(spec, dtype, device, trust_remote_code, layers, local_files_only=cached_only)
        return model, f"hub {spec}" + (" (from the local cache: the hub cannot be reached)" if cached_only else "")
    except OSError as e:
        raise ValueError(f"{spec}: cannot load from the hub here ({str(e).splitlines()[0]}); download it "
                         "elsewhere and pass the folder, or pass its config.json for random weights") from None


def _hub_unresolvable() -> bool:
    """The hub's host name does not resolve here, and no proxy would resolve it instead: a hub id is then
    loaded from the local cache alone, at once, rather than after half a minute of retried requests."""
    if any(os.environ.get(k) for k in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return False
    from urllib.parse import urlparse

    from huggingface_hub import constants
    host = urlparse(constants.ENDPOINT).hostname
    try:
        socket.getaddrinfo(host, 443)
    except OSError:
        return True
    return False


def _looks_like_hub_id(spec: str) -> bool:
    parts = spec.split("/")
    return len(parts) == 2 and all(parts) and not spec.startswith((".", "/"))


_LAYER_COUNTS = ("num_hidden_layers", "n_layer", "num_layers", "num_decoder_layers", "encoder_layers",
                 "decoder_layers")


def _set_layers(config, layers: int | None, grow: bool = False) -> str:
    """Keep the first ``layers`` layers of the config's (of each stack of an encoder-decoder), or with
    ``grow`` (random weights) as many more as asked; what was done, for the model's description."""
    if layers is None:
        return ""
    counts = [getattr(config, a) for a in _LAYER_COUNTS if isinstance(getattr(config, a, None), int)]
    if isinstance(layers, bool) or not isinstance(layers, int) or layers < 1:
        raise ValueError(f"--num-layers must be a whole number of at least 1, got {layers!r}")
    if not counts:
        raise ValueError(f"--num-layers: {type(config).__name__} states no layer count to truncate")
    have = min(counts)
    if layers > have and not grow:
        raise ValueError(f"--num-layers {layers}: the checkpoint has {have} layers; --num-layers keeps the first N "
                         "(more would be layers of random weights)")
    for attr in _LAYER_COUNTS:
        if isinstance(getattr(config, attr, None), int):
            setattr(config, attr, layers)
    types = getattr(config, "layer_types", None)
    if isinstance(types, list) and types and not isinstance(getattr(type(config), "layer_types", None), property):
        # one entry per layer (sliding or full attention), repeated as a pattern; where the config computes it
        # (a property: Jamba, Mamba), it follows the count by itself
        config.layer_types = [types[i % len(types)] for i in range(layers)]
    if layers == have:
        return ""
    return f", first {layers} of {have} layers" if layers < have else f", {layers} layers (of {have})"


def _pretrained(where: str, dtype, device, trust_remote_code: bool, layers: int | None,
                local_files_only: bool = False, **load) -> nn.Module:
    """``from_pretrained``; ``load``: how to place it (device_map, tensor parallelism), else on ``device``."""
    config = AutoConfig.from_pretrained(where, trust_remote_code=trust_remote_code, local_files_only=local_files_only)
    _set_layers(config, layers)
    task = task_of(config)
    kwargs = dict(config=config, dtype=dtype, use_safetensors=True, trust_remote_code=trust_remote_code,
                  local_files_only=local_files_only, **load)
    try:
        model = _AUTO[task].from_pretrained(where, **kwargs)
    except ValueError:
        model = AutoModel.from_pretrained(where, **kwargs)
    if not load:
        model = model.to(device)
    return model.eval()


def _tp_kwargs() -> dict:
    try:  # transformers 5.x: the plan goes in a DistributedConfig (a bare tp_plan= is deprecated)
        from transformers import DistributedConfig
    except ImportError:  # pragma: no cover - releases before DistributedConfig
        return {"tp_plan": "auto"}
    return {"distributed_config": DistributedConfig(tp_plan="auto")}


def _load_distributed(spec, dtype, device, trust_remote_code, layers, seed, device_map, tp):
    if tp:
        rank, world_size = dist.init_process_group()
        load = _tp_kwargs()
    else:
        rank, world_size = 0, 1
        load = {"device_map": device_map}
    folder, tmp = spec, None
    random_weights = spec in PRESETS or Path(spec).is_file()
    if random_weights:
        # random weights: made once (rank 0), saved, then loaded by every rank like a checkpoint
        if rank == 0:
            model, _ = load_model(spec, dtype=dtype, device="cpu", trust_remote_code=trust_remote_code,
                                  layers=layers, seed=seed)
            tmp = tempfile.mkdtemp(prefix="attnswitch-weights-")
            model.save_pretrained(tmp)
            del model
        folder = dist.broadcast(tmp) if tp else tmp
        layers = None  # already truncated in the saved config
    elif not Path(spec).is_dir() and not _looks_like_hub_id(spec):
        load_model(spec)  # the single-device loader's clear error for a bad spec
    try:
        model = _pretrained(folder, dtype, device, trust_remote_code, layers, **load)
    except OSError as e:
        raise ValueError(f"{spec}: cannot load ({str(e).splitlines()[0]})") from None
    finally:
        if tp:
            dist.barrier()  # every rank has loaded: the temporary weights can go
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    how = (f"tensor parallel over {world_size} ranks" if tp else
           f"device_map {device_map if isinstance(device_map, str) else 'given'} over "
           f"{', '.join(dict.fromkeys(str(v) for v in getattr(model, 'hf_device_map', {}).values())) or device}")
    kind = "preset" if spec in PRESETS else "config" if Path(spec).is_file() else "folder" if Path(spec).is_dir() \
        else "hub"
    return model.eval(), f"{kind} {spec}" + (", random weights" if random_weights else "") + f", {how}"
