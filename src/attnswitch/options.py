"""What attnswitch takes, checked without torch or transformers: backend names and policies, presets and
model sources, dtypes, modes, caches, placements and the numbers of a workload.

The library (``backends``, ``models``, ``workload``) and the command line check their input here, so that a
misspelt name is answered at once, with the nearest valid one. An ``OptionError`` names the library's
parameters (``new_tokens``); the command line words the same error with its flags (``--new-tokens``).
A leaf module: it imports nothing of attnswitch but the catalog of backends, nor torch.
"""

from __future__ import annotations

import difflib
import functools
import operator
import os
import reprlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from . import catalog, kinds

__all__ = ["OptionError", "near", "BACKENDS", "ALIASES", "COMPARED", "backend_key", "unknown_backend", "DTYPES",
           "dtype_name", "MODES", "CACHES", "DEVICE_MAPS", "check_choice", "check_placement", "check_layers",
           "check_shape", "check_generation", "prompt_lengths", "positions_needed", "check_positions", "Preset",
           "PRESETS", "Source", "model_source", "check_model_workload", "looks_like_hub_id", "MAX_LENGTH",
           "MAX_REQUESTS", "check_count", "check_seconds", "check_requests"]

#: the longest prompt (or sequence) taken at all: no model has more positions, and a longer one is a typo
#: (a model's own table of positions is checked where the model is known)
MAX_LENGTH = 1 << 24
#: the most requests a serving estimate is made for
MAX_REQUESTS = 10**12


class OptionError(ValueError):
    """Bad input, worded with the names of the parameters it is about: ``{new_tokens}`` in ``template`` is
    ``new_tokens`` in the library's message and whatever ``worded(names)`` maps it to (``--new-tokens``);
    ``values`` fill the other fields (user input goes there, never into the template)."""

    def __init__(self, template: str, **values):
        self.template, self.values = template, values
        super().__init__(self.worded())

    def worded(self, names: Mapping[str, str] | None = None) -> str:
        return self.template.format_map(_Words(self.values, names or {}))

    def __reduce__(self):  # (through a process group or a pool: rebuilt from its template, not its text)
        return functools.partial(OptionError, self.template, **self.values), ()


class _Words(dict):
    def __init__(self, values: dict, names: Mapping[str, str]):
        super().__init__(values)
        self.names = names

    def __missing__(self, key: str) -> str:  # a parameter's name
        return self.names.get(key, key)


def near(word: str, choices: Iterable[str]) -> str:
    """`` (did you mean `x`?)`` for the choice closest to ``word``, or nothing when none is close."""
    if not isinstance(word, str):
        return ""
    match = difflib.get_close_matches(word.strip().lower(), list(choices), n=1, cutoff=0.6)
    return f" (did you mean `{match[0]}`?)" if match else ""


# -- backends ------------------------------------------------------------------------------------------

#: every built-in backend, in the order the registry holds them; those compared by default; alias -> backend
BACKENDS, COMPARED, ALIASES = catalog.NAMES, catalog.COMPARED, catalog.ALIASES
_PACKAGED = [r.name for r in catalog.ROWS if r.compared and r.package]
_VALID = (", ".join(b for b in COMPARED if b not in _PACKAGED)
          + f" (and {', '.join(_PACKAGED)} where their packages are installed)")


def unknown_backend(name, choices: Iterable[str], valid: str = _VALID) -> OptionError:
    """The error for a backend name that is none of ``choices`` (names and aliases)."""
    return OptionError("unknown attention backend {given!r}{hint}; valid names: {valid}", given=name,
                       hint=near(name, choices), valid=valid)


def backend_key(name, registered: Iterable[str] = ()) -> str:
    """The canonical name of a built-in backend, an alias of one, or one of ``registered`` (a user's)."""
    if not isinstance(name, str):
        raise TypeError(f"backend name must be a str or SDPBackend, not {type(name).__name__}")
    key = name.strip().lower()
    registered = set(registered)
    if key in BACKENDS or key in registered:
        return key
    if key in ALIASES:
        return ALIASES[key]
    raise unknown_backend(name, [*BACKENDS, *ALIASES, *registered])


# -- dtypes, modes, caches, placement, numbers --------------------------------------------------------

#: names of dtypes -> the canonical one
DTYPES = {"fp32": "fp32", "float32": "fp32", "fp16": "fp16", "float16": "fp16", "half": "fp16", "bf16": "bf16",
          "bfloat16": "bf16"}
#: what one step of a workload is
MODES = kinds.NAMES
#: KV caches a generate workload can use: the model's default (grows per token) or transformers' static one
CACHES = ("dynamic", "static")
#: accelerate's named device maps
DEVICE_MAPS = ("auto", "balanced", "balanced_low_0", "sequential")


def dtype_name(name: str) -> str:
    """``fp32``, ``fp16`` or ``bf16`` for any of their names."""
    key = name.strip().lower() if isinstance(name, str) else name
    if key not in DTYPES:
        raise OptionError("unknown {dtype} {given!r}{hint}; use one of fp32, fp16, bf16", given=name,
                          hint=near(name, DTYPES))
    return DTYPES[key]


def check_choice(param: str, value, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise OptionError("{" + param + "} must be one of {choices}, not {given!r}{hint}", choices=", ".join(choices),
                          given=value, hint=near(value, choices))
    return value


def check_placement(device_map, tp: bool) -> None:
    """A ``device_map`` (a name of accelerate's, or a dict) or tensor parallelism, not both."""
    if device_map is not None and tp:
        raise OptionError("{device_map} and tensor parallelism ({tp}) exclude each other; choose one")
    if isinstance(device_map, str) and device_map not in DEVICE_MAPS:
        raise OptionError("{device_map} {given!r}{hint}: use one of {maps} (from Python, also a dict)",
                          given=device_map, hint=near(device_map, DEVICE_MAPS), maps=", ".join(DEVICE_MAPS))


def _whole(n) -> bool:
    """An integer (numpy's too), not a bool."""
    if isinstance(n, bool):
        return False
    try:
        operator.index(n)
    except TypeError:
        return False
    return True


def check_layers(layers) -> None:
    if layers is not None and not (_whole(layers) and layers >= 1):
        raise OptionError("{layers} must be at least 1 (a whole number), got {got!r}", got=layers)


def check_count(param: str, n, least: int) -> None:
    """A count of steps or rounds: a whole number of at least ``least`` (0 or 1)."""
    if not (_whole(n) and n >= least):
        raise OptionError("{" + param + "} must be a whole number, " + ("at least 1" if least else "0 or more")
                          + ", got {got!r}", got=n)


def check_seconds(param: str, s) -> None:
    """Seconds, 0 or more (None: left out)."""
    if s is not None and (isinstance(s, bool) or not isinstance(s, (int, float)) or not 0 <= s < float("inf")):
        raise OptionError("{" + param + "} must be 0 or more seconds (a finite number), got {got!r}", got=s)


def check_requests(requests) -> None:
    """The run of requests a length mix is charged over: a whole number from 1 to ``MAX_REQUESTS``."""
    if not (_whole(requests) and 1 <= requests <= MAX_REQUESTS):
        raise OptionError("{requests} must be a whole number from 1 to {most}, got {got}", most=MAX_REQUESTS,
                          got=reprlib.repr(requests))


def check_deployed(deployed) -> tuple[int, ...]:
    """The lengths a deployment meets besides the measured one (where known defects are checked): an iterable
    of whole numbers from 1 to ``MAX_LENGTH``, as a tuple."""
    if isinstance(deployed, (str, bytes)) or not isinstance(deployed, Iterable):
        raise OptionError("{deployed} is a list of lengths (tokens), not {got}", got=reprlib.repr(deployed))
    lengths = tuple(deployed)
    bad = [n for n in lengths if not (_whole(n) and 1 <= n <= MAX_LENGTH)]
    if bad:
        raise OptionError("{deployed}: a length is a whole number of tokens from 1 to {most}, not {got}",
                          most=MAX_LENGTH, got=reprlib.repr(bad[0]))
    return tuple(int(n) for n in lengths)


def _generates(mode: str) -> bool:
    k = kinds.KINDS.get(mode)
    return k is not None and k.generates


def check_shape(batch, seq, mode: str = "prefill", padding: bool = False) -> None:
    """A workload's batch and length, its mode, and padding where it applies."""
    if not all(_whole(n) and n >= 1 for n in (batch, seq)):
        raise OptionError("{batch} and {seq} must be positive whole numbers, got {b!r} and {s!r}", b=batch, s=seq)
    most = MAX_LENGTH  # no model has more positions: a longer one is a typo, not a workload
    if seq > most:  # a generate's seq is its prompt length
        raise OptionError("{" + ("prompt_len" if _generates(mode) else "seq") + "} {s} is beyond any model's "
                          "positions (at most {most} tokens)", s=seq, most=most)
    if batch > most:
        raise OptionError("{batch} {b} is beyond any batch that fits in memory (at most {most})", b=batch, most=most)
    check_choice("mode", mode, MODES)
    if padding and _generates(mode):
        raise OptionError("{padding} pads a prefill, decode or train batch; a generate's prompts are whole")
    if padding and batch < 2:
        raise OptionError("{padding} needs a batch of 2 or more (the first row keeps every position, the others "
                          "are padded)")
    if padding and seq < 2:
        raise OptionError("{padding} needs a length of 2 or more (a padded row keeps one position at least)")


def check_generation(new_tokens, prompt_lens=None, cache: str = "dynamic", prompt_len=None) -> None:
    if not (_whole(new_tokens) and new_tokens >= 1):
        raise OptionError("{new_tokens} must be a whole number, at least 1, got {got!r}", got=new_tokens)
    if prompt_len is not None and not (_whole(prompt_len) and prompt_len >= 1):
        raise OptionError("{prompt_len} must be a positive whole number, got {got!r}", got=prompt_len)
    if prompt_lens is not None:
        lens = list(prompt_lens)
        if not lens:
            raise OptionError("{prompt_lens} is empty: give the prompt lengths, or none for lengths around the "
                              "prompt length")
        if not all(_whole(n) and n >= 1 for n in lens):
            raise OptionError("{prompt_lens} must be positive whole numbers, got {got}", got=tuple(lens))
    most = MAX_LENGTH  # no model has more positions: a longer one is a typo, not a workload
    for name, n in (("prompt_lens", max(prompt_lens or [0])), ("prompt_len", prompt_len or 0),
                    ("new_tokens", new_tokens)):
        if n > most:
            raise OptionError("{" + name + "} " + str(n) + " is beyond any model's positions (at most {most} tokens)",
                              most=most)
    check_choice("cache", cache, CACHES)


def prompt_lengths(prompt_len: int, new_tokens: int, n: int = 5) -> tuple[int, ...]:
    """``n`` prompt lengths spread around ``prompt_len``, a quarter of ``new_tokens`` apart and at least 2, so
    that each generate sees key lengths the previous ones saw, and some new ones before its last step (the new
    lengths of a prompt 1 token longer are at its last step, whose time runs to the generate's end); closer where
    the shortest would be under one token (``prompt_len`` 8 with 128 new tokens: 2 to 14, 3 apart), fewer only for
    a ``prompt_len`` under 3."""
    below = n // 2
    gap = max(1, min(max(2, new_tokens // 4), (prompt_len - 1) // below if below else new_tokens))
    lens = [prompt_len + (i - n // 2) * gap for i in range(n)]
    return tuple(sorted({max(1, x) for x in lens}))


def positions_needed(mode: str, seq: int, new_tokens: int | None = None,
                     prompt_lens: Iterable[int] | None = None) -> tuple[int, str, dict]:
    """The positions a workload takes, and how to say so: ``(tokens, template, values)``. For a generate
    ``seq`` is the prompt length the lengths spread around (unless ``prompt_lens`` are given)."""
    if _generates(mode):
        if prompt_lens:
            longest = max(prompt_lens)
            return longest + new_tokens, "a prompt of {p} tokens plus {n} new ones", {"p": longest, "n": new_tokens}
        longest = max(prompt_lengths(seq, new_tokens))  # (the longest of the prompts a length is measured by)
        return longest + new_tokens, "a prompt of {p} tokens (the longest of those spread around {around}) plus {n} " \
            "new ones", {"p": longest, "around": seq, "n": new_tokens}
    if mode == "decode":
        return seq + 1, "{seq} {s} plus the decoded token", {"s": seq}
    return seq, "{seq} {s}", {"s": seq}


def check_positions(limit: int | None, mode: str, seq: int, new_tokens: int | None = None,
                    prompt_lens: Iterable[int] | None = None) -> None:
    """The workload's positions within a table of ``limit`` absolute positions (None: no such table)."""
    tokens, what, values = positions_needed(mode, seq, new_tokens, prompt_lens)
    if limit is not None and tokens > limit:
        raise OptionError(what + " ({tokens}) is beyond the {limit} positions of the model's position table",
                          tokens=tokens, limit=limit, **values)


# -- presets and where a model comes from ------------------------------------------------------------

@dataclass(frozen=True)
class Preset:
    """A built-in model: a real architecture's config (``models.py`` makes it), random weights."""

    name: str
    task: str  # "causal-lm", "masked-lm" or "seq2seq"
    about: str
    positions: int | None = None  # rows of its table of absolute positions; None where positions are computed


PRESETS: dict[str, Preset] = {p.name: p for p in [
    Preset("llama-3.2-1b", "causal-lm", "Llama-3.2-1B shape: 16 layers, 32 q / 8 kv heads, d 64"),
    Preset("qwen2.5-0.5b", "causal-lm", "Qwen2.5-0.5B shape: 24 layers, 14 q / 2 kv heads, d 64"),
    Preset("mistral-7b", "causal-lm", "Mistral-7B shape: 32 layers, 32 q / 8 kv heads, window 4096"),
    Preset("gpt2", "causal-lm", "GPT-2 (124M): 12 layers, 12 heads, d 64", positions=1024),
    Preset("bert-base", "masked-lm", "BERT-base: 12 layers, 12 heads, bidirectional encoder", positions=512),
    Preset("t5-small", "seq2seq", "T5-small: encoder-decoder with relative position bias"),
    Preset("tiny-llama", "causal-lm", "a 4-layer Llama with GQA, for CPUs and tests"),
    Preset("tiny-mistral", "causal-lm", "a 2-layer Mistral with a 16-token sliding window"),
]}


@dataclass(frozen=True)
class Source:
    """Where a model comes from: ``kind`` is ``preset``, ``config`` (a config.json: random weights),
    ``folder`` (``from_pretrained``) or ``hub`` (an id, loaded where the hub is reachable)."""

    kind: str
    spec: str
    preset: Preset | None = None


def looks_like_hub_id(spec: str) -> bool:
    parts = spec.split("/")
    return len(parts) == 2 and all(parts) and not spec.startswith((".", "/"))


def _folder_without_weights(spec: str, path: Path) -> OptionError:
    pickled = any(path.glob("*.bin")) or any(path.glob("*.pt"))
    why = "only pickle weights (*.bin), which are not loaded" if pickled else "no weights"
    config = path / "config.json"
    hint = (f"; its config.json alone gives this model with random weights: pass {config}" if config.is_file()
            else "")
    return OptionError("{given}: no *.safetensors in this folder ({why}){hint}", given=spec, why=why, hint=hint)


def model_source(spec: str) -> Source:
    """What ``spec`` names, decided from the name and the file system alone; bad ones raise ``OptionError``."""
    if not isinstance(spec, str) or not spec.strip():
        raise OptionError("a model is a preset, a folder, a config.json or a hub id, not {given!r}", given=spec)
    if spec in PRESETS:
        return Source("preset", spec, PRESETS[spec])
    path = Path(spec)
    if path.is_file():
        if path.suffix != ".json":
            raise OptionError("{given}: expected a config.json, a model folder, a preset or a hub id", given=spec)
        return Source("config", spec)
    if path.is_dir():
        if not any(path.glob("*.safetensors")):
            raise _folder_without_weights(spec, path)
        return Source("folder", spec)
    presets = ", ".join(PRESETS)
    if (os.sep in spec and not looks_like_hub_id(spec)) or spec.startswith((".", "/", "~")):
        raise OptionError("{given}: no such file or folder, and not a preset ({presets})", given=spec,
                          presets=presets)
    if not looks_like_hub_id(spec):
        raise OptionError("unknown model {given!r}{hint}: not a preset ({presets}), a folder, a config.json or a "
                          "hub id (owner/name)", given=spec, hint=near(spec, PRESETS), presets=presets)
    return Source("hub", spec)


def check_model_workload(source: Source, mode: str, seq: int | None = None, new_tokens: int | None = None,
                         prompt_lens: Iterable[int] | None = None) -> None:
    """What a preset's static facts refuse: a step its head cannot run, positions beyond its table
    (``seq`` None: lengths not known yet). Other sources are checked once loaded."""
    p = source.preset
    if p is None:
        return
    kind = kinds.KINDS[check_choice("mode", mode, MODES)]
    if kind.lm and p.task == "masked-lm":
        verb = "cannot generate" if kind.generates else "cannot decode"
        raise OptionError("preset {given} ({about}) {verb} (no language-model head): use {mode} prefill or train",
                          given=p.name, about=p.about, verb=verb)
    if kind.causal and p.task != "causal-lm":
        raise OptionError("{mode} decode needs a causal language model; preset {given} is {task}", given=p.name,
                          task=p.task)
    if seq is not None:
        check_positions(p.positions, mode, seq, new_tokens, prompt_lens)
