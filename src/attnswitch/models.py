"""Built-in model presets (configs of real architectures, random weights), model loading, inputs.

A preset needs no download: the config is written here and the weights are random, which is all
attention timing needs. ``load_model`` also takes a local folder (``from_pretrained``, safetensors
only), a ``config.json`` (random weights) or a hub id where the hub is reachable.
"""

from __future__ import annotations

import contextlib
import copy
import logging
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
from safetensors import SafetensorError
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
    PretrainedConfig,
    Qwen2Config,
    T5Config,
)

from . import dist, options
from .options import OptionError
from .request import DEFAULTS
from .words import counted
from .workload import task_of

try:  # transformers' configs are strict dataclasses (5.x): a config its validators refuse raises this
    from huggingface_hub.errors import StrictDataclassError
except ImportError:  # pragma: no cover - older huggingface_hub
    class StrictDataclassError(Exception):
        pass

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


_CONFIGS: dict[str, Callable[[], Any]] = {
    "llama-3.2-1b": _llama_1b, "qwen2.5-0.5b": _qwen25_05b, "mistral-7b": _mistral_7b, "gpt2": GPT2Config,
    "bert-base": BertConfig, "t5-small": _t5_small, "tiny-llama": _tiny_llama, "tiny-mistral": _tiny_mistral}
#: the presets (their names, tasks and descriptions are ``options.PRESETS``', which needs no torch)
PRESETS: dict[str, Preset] = {n: Preset(n, _CONFIGS[n], p.task, p.about) for n, p in options.PRESETS.items()}


def default_preset(device: torch.device | str) -> str:
    """The preset ``compare`` uses without a model: real-sized on a GPU, tiny on a CPU."""
    return DEFAULTS["cuda" if torch.device(device).type == "cuda" else "cpu"].model


_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def parse_dtype(name: str | torch.dtype) -> torch.dtype:
    if isinstance(name, torch.dtype):
        return name
    return _DTYPES[options.dtype_name(name)]


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


DEVICE_MAPS = options.DEVICE_MAPS


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
    if device.type == "cuda" and dtype == torch.bfloat16 and torch.cuda.is_available() and \
            not torch.cuda.is_bf16_supported():
        raise OptionError("{dtype} bf16: {gpu} cannot run bfloat16", gpu=torch.cuda.get_device_name(device))
    options.check_placement(device_map, tp)
    options.check_layers(layers)
    source = options.model_source(spec)  # a bad name or path is refused here, before anything is loaded
    if device_map is not None or tp:
        return _load_distributed(spec, dtype, device, trust_remote_code, layers, seed, device_map, tp)
    if source.kind == "preset":
        preset = PRESETS[spec]
        config = preset.make_config()
        cut = _set_layers(config, layers, grow=True)
        return (_from_config(config, preset.task, dtype, device, seed),
                f"preset {spec} ({preset.about}){cut}, random weights")
    if source.kind == "config":
        try:
            config = _config(spec, trust_remote_code=trust_remote_code)
        except OSError as e:  # (transformers' word for a file that is not JSON, too)
            raise OptionError("{given}: cannot read this config ({why})", given=spec, why=_first_line(e)) from None
        cut = _set_layers(config, layers, grow=True)
        try:
            model = _from_config(config, task_of(config), dtype, device, seed)
        except (ValueError, StrictDataclassError) as e:  # (no model class of transformers' takes this config)
            raise OptionError("{given}: transformers builds no model of this config ({why})", given=spec,
                              why=_first_line(e)) from None
        return model, f"config {spec}{cut}, random weights"
    if source.kind == "folder":
        if not (Path(spec) / "config.json").is_file():  # (transformers would say it "should have a model_type key")
            raise OptionError("{given}: no config.json in this folder; a model folder is what save_pretrained "
                              "writes (config.json and the weights)", given=spec)
        try:
            model = _pretrained(spec, dtype, device, trust_remote_code, layers)
        except OSError as e:
            raise OptionError("{given}: cannot load ({why})", given=spec, why=_first_line(e)) from None
        return model, f"folder {spec}" + (f", first {counted(layers, 'layer')}" if layers is not None else "")
    cached_only = _hub_unresolvable()
    try:
        model = _pretrained(spec, dtype, device, trust_remote_code, layers, local_files_only=cached_only)
        return model, f"hub {spec}" + (" (from the local cache: the hub cannot be reached)" if cached_only else "")
    except OSError as e:
        raise OptionError("{given}: cannot load from the hub here ({why}); download it elsewhere and pass the "
                          "folder, or pass its config.json for random weights", given=spec, why=_first_line(e)) \
            from None


def _first_line(e: BaseException) -> str:
    return next((line.strip() for line in str(e).splitlines() if line.strip()), type(e).__name__)


def _config(where: str, **kw):
    """``AutoConfig.from_pretrained``; a config transformers cannot read or refuses (its validators: hidden
    size not a multiple of the heads, say) is bad input, in one line. (A folder or hub id that cannot be
    reached raises ``OSError``, for the caller to word.)"""
    try:
        config = AutoConfig.from_pretrained(where, **kw)
    except StrictDataclassError as e:  # its own words are the cause's; the rest is the validator's name
        why = _first_line(e.__cause__) if e.__cause__ is not None else _first_line(e)
        raise OptionError("{given}: transformers refuses this config: {why}", given=where, why=why) from None
    except (ValueError, KeyError) as e:  # (a JSONDecodeError is a ValueError)
        raise OptionError("{given}: cannot read this config ({kind}: {why})", given=where, kind=type(e).__name__,
                          why=_first_line(e)) from None
    for c in (config, *(v for v in vars(config).values() if isinstance(v, PretrainedConfig))):
        # (transformers loads it; every attention call then fails alike, in a traceback from deep in a kernel)
        try:
            heads, kv = getattr(c, "num_attention_heads", None), getattr(c, "num_key_value_heads", None)
        except Exception:  # (a per-layer attribute read as one raises: its layers are the model's to run)
            continue
        if type(heads) is int and type(kv) is int and kv > 0 and heads % kv:
            raise OptionError("{given}: num_key_value_heads ({kv}) must divide num_attention_heads ({heads}): every "
                              "attention call of this config fails", given=where, kv=kv, heads=heads)
    return config


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


_LAYER_COUNTS = ("num_hidden_layers", "n_layer", "num_layers", "num_decoder_layers", "encoder_layers",
                 "decoder_layers")


def _set_layers(config, layers: int | None, grow: bool = False) -> str:
    """Keep the first ``layers`` layers of the config's (of each stack of an encoder-decoder), or with
    ``grow`` (random weights) as many more as asked; what was done, for the model's description."""
    if layers is None:
        return ""
    counts = [getattr(config, a) for a in _LAYER_COUNTS if isinstance(getattr(config, a, None), int)]
    options.check_layers(layers)
    layers = int(layers)  # (numpy's integers too)
    if not counts:
        raise options.OptionError("{layers}: {config} states no layer count to truncate",
                                  config=type(config).__name__)
    have = min(counts)
    if layers > have and not grow:
        raise options.OptionError("{layers} {n}: the checkpoint has {have} layers; {layers} keeps the first N (more "
                                  "would be layers of random weights)", n=layers, have=have)
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
    config = _config(where, trust_remote_code=trust_remote_code, local_files_only=local_files_only)
    _set_layers(config, layers)
    task = task_of(config)
    # weights of other shapes than the config's are reported (not raised with a table of keys), and refused below
    kwargs = dict(config=config, dtype=dtype, use_safetensors=True, trust_remote_code=trust_remote_code,
                  local_files_only=local_files_only, ignore_mismatched_sizes=True, output_loading_info=True, **load)
    with _load_report_held() as held:
        try:
            try:
                model, info = _AUTO[task].from_pretrained(where, **kwargs)
            except ValueError:
                model, info = AutoModel.from_pretrained(where, **kwargs)
        except SafetensorError as e:  # a damaged or cut-short weights file
            raise OptionError("{given}: its weights cannot be read ({why})", given=where, why=e) from None
        mismatched = sorted(info.get("mismatched_keys") or (), key=str)
        if mismatched:
            key, ckpt, want = mismatched[0]
            more = f" (and {len(mismatched) - 1} more)" if len(mismatched) > 1 else ""
            raise OptionError("{given}: its weights do not match its config: {key} is {ckpt} in the checkpoint, "
                              "{want} by the config{more}", given=where, key=key, ckpt=list(ckpt), want=list(want),
                              more=more)
        held.release()
    if not load:
        model = model.to(device)
    return model.eval()


class _Held(list):
    """Log records held back; ``release()`` hands them on as they would have gone."""

    def release(self) -> None:
        records, self[:] = list(self), []
        for r in records:
            logging.getLogger(r.name).handle(r)


@contextlib.contextmanager
def _load_report_held():
    """transformers' load report (a table of keys, logged as warnings while a checkpoint loads) held back:
    handed on where the load goes on (``release``) or fails of its own, dropped where attnswitch says in one
    line what went wrong (weights that do not match the config)."""
    log = logging.getLogger("transformers.modeling_utils")
    held = _Held()

    def hold(record) -> bool:
        held.append(record)
        return False

    log.addFilter(hold)
    try:
        yield held
    except OptionError:
        raise
    except BaseException:
        log.removeFilter(hold)
        held.release()
        raise
    finally:
        log.removeFilter(hold)


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
    folder, tmp, loading = spec, None, False
    random_weights = spec in PRESETS or Path(spec).is_file()
    try:  # (the temporary weights go on any exit: an interrupt while saving them left gigabytes behind)
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
        loading = True
        model = _pretrained(folder, dtype, device, trust_remote_code, layers, **load)
    except OSError as e:
        if not loading:
            raise
        raise OptionError("{given}: cannot load ({why})", given=spec, why=_first_line(e)) from None
    finally:
        if tp and loading:
            dist.barrier()  # every rank has loaded: the temporary weights can go
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    how = (f"tensor parallel over {world_size} ranks" if tp else
           f"device_map {device_map if isinstance(device_map, str) else 'given'} over "
           f"{', '.join(dict.fromkeys(str(v) for v in getattr(model, 'hf_device_map', {}).values())) or device}")
    kind = "preset" if spec in PRESETS else "config" if Path(spec).is_file() else "folder" if Path(spec).is_dir() \
        else "hub"
    return model.eval(), f"{kind} {spec}" + (", random weights" if random_weights else "") + f", {how}"
