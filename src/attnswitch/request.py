"""What a measurement is asked for, as one typed value, and the one check of it.

A ``Request`` holds what ``check``, ``profile`` and ``compare`` take: the model's source, the mode, the
shapes, the generation, the placement, the compile modes, the steps (``Steps``: warm-up, iterations, rounds,
time budget), numerics, and a deployment's length mix with its run of requests. ``Request.check`` is every
input rule there is, written once: the command line builds a request from its options and checks it before
torch is imported; ``profile``, ``compare`` and ``compare_sweep`` build one from their parameters and check it
before any work. Its errors are ``options.OptionError``s, worded with the library's parameter names
(``{new_tokens}``), which the command line words as its flags (``--new-tokens``). The defaults are here, once.

Torch-free, like ``options`` (whose per-value checks it calls).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from . import candidate, options
from .compiling import parse_compile
from .lengths import Lengths, read_lengths
from .options import OptionError

__all__ = ["Request", "Steps", "Defaults", "DEFAULTS", "DEFAULT", "KINDS", "ITERS", "PROFILE_ITERS", "FIRST_ROUNDS",
           "REQUESTS", "BUDGET_CAP_S"]

#: what is asked: a check (one forward per backend), a profile, a comparison
KINDS = ("check", "profile", "compare")
#: timed steps per backend in the first rounds, where none are given (``compare``'s and the library's)
ITERS = 12
#: the same for the command ``attnswitch profile``, which wants the per-layer counts more than a ranking
PROFILE_ITERS = 6
#: the most first rounds the steps are spread over, where none are given
FIRST_ROUNDS = 6
#: the run of requests a length mix's first-met shapes are charged over, where none is given
REQUESTS = 1000
#: the most seconds of more rounds, where no budget is given (then: as long as the first rounds took)
BUDGET_CAP_S = 30.0


class _Default:
    """A parameter left out: told apart from every value a caller may give (None included)."""

    def __repr__(self) -> str:
        return "DEFAULT"


#: a parameter left out, where None is a value of its own (``requests``)
DEFAULT = _Default()


@dataclass(frozen=True)
class Defaults:
    """What a request leaves out, on one kind of device: real sizes on a GPU, small ones on a CPU."""

    model: str
    batch: int
    seq: int
    prompt_len: int
    new_tokens: int
    dtype: str


#: the defaults per kind of device
DEFAULTS = {"cuda": Defaults("llama-3.2-1b", 4, 2048, 512, 128, "bf16"),
            "cpu": Defaults("tiny-llama", 2, 128, 32, 8, "fp32")}


@dataclass(frozen=True)
class Steps:
    """How long each backend is measured; None: the default for the workload's mode (``resolved``)."""

    warmup: int | None = None  # steps after the cold one, before timing (1; a generate's 0)
    iters: int | None = None  # timed steps per backend in the first rounds (ITERS; a generate's 1)
    rounds: int | None = None  # rounds those steps are spread over (at most FIRST_ROUNDS; a generate's: iters)
    time_budget_s: float | None = None  # seconds of more rounds (as long as the first ones, BUDGET_CAP_S at most)
    host_iters: int | None = None  # steps host time is taken from (iters, at most 5; a generate's 1)
    profile_steps: int = 1  # profiled steps (0: none)

    def check(self) -> None:
        for name, least in (("warmup", 0), ("iters", 1), ("rounds", 1), ("host_iters", 1), ("profile_steps", 0)):
            if getattr(self, name) is not None:
                options.check_count(name, getattr(self, name), least)
        options.check_seconds("time_budget_s", self.time_budget_s)

    def resolved(self, generate: bool, iters: int = ITERS) -> Steps:
        """Every count given, the defaults for the mode where none is (``iters``: the default number)."""
        n = self.iters if self.iters is not None else (1 if generate else iters)
        if not generate and self.rounds is not None and self.rounds > n:  # (a generate's round is one prompt)
            raise OptionError("{rounds} {r} is more than {iters} {n}: a round times one of each backend's timed steps; "
                              "give {iters} {r} or more", r=self.rounds, n=n)
        return Steps(warmup=self.warmup if self.warmup is not None else (0 if generate else 1), iters=n,
                     rounds=self.rounds if self.rounds is not None else (n if generate else min(n, FIRST_ROUNDS)),
                     time_budget_s=self.time_budget_s, host_iters=self.host_iters or (1 if generate else min(n, 5)),
                     profile_steps=self.profile_steps)


#: what only a generate takes, and what it is when left out
_GENERATE_ONLY = (("prompt_len", ()), ("prompt_lens", None), ("lengths", None), ("requests", DEFAULT),
                  ("new_tokens", ()))


@dataclass(frozen=True)
class Request:
    """One measurement asked for. Lists of shapes (``batch``, ``seq``, ``prompt_len``, ``new_tokens``) are
    empty where left out (the device's ``DEFAULTS``), several for a sweep (every batch with every length), or
    a sweep's ``shapes`` given pair by pair; ``lengths`` is a length mix (a ``Lengths``, or the file to read it
    from); ``mode`` None is a plain callable profiled (no workload)."""

    kind: str = "compare"
    model: str | None = None  # a preset, a folder, a config.json or a hub id; None: a model object, or the default
    mode: str | None = "prefill"
    batch: tuple[int, ...] = ()
    seq: tuple[int, ...] = ()
    padding: bool = False
    dtype: str | None = None
    prompt_len: tuple[int, ...] = ()
    prompt_lens: tuple[int, ...] | None = None
    new_tokens: tuple[int, ...] = ()
    cache: str = "dynamic"
    lengths: Lengths | str | Path | None = None
    requests: object = DEFAULT  # an int; DEFAULT: REQUESTS where a length mix is given
    shapes: tuple[tuple[int, int], ...] = ()  # a sweep's shapes pair by pair: (batch, seq or prompt length)
    sweep: bool = False  # asked for as a sweep (``compare_sweep``), whatever its lists hold
    device: str | None = None
    device_map: str | dict | None = None
    tp: bool = False
    layers: int | None = None
    backends: object = "all"  # "all", a comma-separated string or an iterable of names and policies
    compile: object = None  # torch.compile modes (``compiling.parse_compile``)
    steps: Steps = field(default_factory=Steps)
    numerics: bool = True
    deployed: object = ()  # lengths a deployment meets besides the measured ones (the known defects' check)
    step_queries: tuple[int, ...] = ()  # the query lengths one step of a given workload runs (encoder, decoder)

    @property
    def sweeps(self) -> bool:
        """Whether it is a sweep: asked as one, lists of shapes, or a length mix."""
        lists = (self.batch, self.seq, self.prompt_len, self.new_tokens)
        return self.sweep or bool(self.shapes) or any(len(x) > 1 for x in lists) or self.lengths is not None

    @property
    def generate(self) -> bool:
        return self.mode == "generate"

    def check(self, registered: Iterable[str] = ()) -> Request:
        """Every input rule, in one place: ``OptionError`` for the first one broken. Returns the request with
        its length mix read (a file's) and its compile modes parsed. ``registered``: the backends this
        process registered besides the built-ins."""
        options.check_choice("kind", self.kind, KINDS)
        if self.mode is not None:
            options.check_choice("mode", self.mode, options.MODES)
        # (an iterator is read once, here: what is checked is what runs)
        backends = list(self.backends) if isinstance(self.backends, Iterator) else self.backends
        _combinations(self)
        self.steps.check()
        if self.steps.iters is not None and self.steps.rounds is not None:  # (given both: decided by them alone)
            self.steps.resolved(self.generate)
        modes = parse_compile(self.compile)
        if any(m is not None for m in modes) and (self.device_map is not None or self.tp):
            raise OptionError("{compile} runs one process's model on one device; not with {device_map} or {tp}")
        _one_phase(self.mode, candidate.check_backends(backends, registered),
                   self.seq or tuple(s for _, s in self.shapes), self.step_queries)
        if self.dtype is not None:
            options.dtype_name(self.dtype)
        options.check_placement(self.device_map, self.tp)
        options.check_layers(self.layers)
        lengths = read_lengths(self.lengths) if isinstance(self.lengths, (str, Path)) else self.lengths
        if lengths is not None and not isinstance(lengths, Lengths):
            raise TypeError(f"lengths must be a Lengths (lengths.Lengths.of or read_lengths), not "
                            f"{type(lengths).__name__}")
        checked = dataclasses.replace(self, lengths=lengths, compile=modes, backends=backends,
                                      deployed=options.check_deployed(self.deployed))
        if self.mode is not None:  # (the smaller defaults where the device is not known yet: a CPU's)
            gpu = str(self.device or "").startswith("cuda")
            _shapes(dataclasses.replace(checked.resolved("cuda" if gpu else "cpu"), model=self.model))
        return checked

    def resolved(self, device_type: str) -> Request:
        """The request with the defaults of ``device_type`` (``cuda`` or ``cpu``) where it leaves them out."""
        d = DEFAULTS["cuda" if device_type == "cuda" else "cpu"]
        lengths = self.lengths if isinstance(self.lengths, Lengths) else None
        prompts = tuple(lengths.representative()) if lengths is not None else (self.prompt_len or (d.prompt_len,))
        return dataclasses.replace(
            self, model=self.model or d.model, batch=self.batch or (d.batch,), seq=self.seq or (d.seq,),
            dtype=self.dtype or d.dtype, prompt_len=prompts, new_tokens=self.new_tokens or (d.new_tokens,),
            requests=REQUESTS if self.requests is DEFAULT else self.requests)


def _given(r: Request) -> list[str]:
    """The generate-only parameters ``r`` gives."""
    out = [name for name, left_out in _GENERATE_ONLY
           if (getattr(r, name) is not left_out if left_out in (None, DEFAULT) else len(getattr(r, name)) > 0)]
    return out + (["cache"] if r.cache != "dynamic" else [])


def _one_phase(mode: str | None, names: list[str], seqs: tuple[int, ...] = (), step: tuple[int, ...] = ()) -> None:
    """A backend per phase only where both phases run (a generate): a prefill, training or decode step runs one,
    and the policy's other backend would be recommended unmeasured. Which one: its query length's (``seqs``, a
    decode step's 1) against the policy's ``decode_max_query``; a step whose own calls fall in both (``step``: an
    encoder-decoder's encoder and decoder) runs both, and is measured whole."""
    if mode in (None, "generate"):
        return
    for name in (n for n in names if n != "all"):
        c = candidate.parse(name)
        sels = (c.policy,) if c.policy is not None else tuple(s for _, s in c.kinds.by_kind) if c.kinds else ()
        policy = next((s for s in sels if isinstance(s, candidate.Policy) and s.prefill != s.decode), None)
        if policy is None:
            continue
        if len({q <= policy.decode_max_query for q in step}) > 1:
            continue
        queries = (1,) if mode == "decode" else step or seqs
        at = {q: "decode" if q <= policy.decode_max_query else "prefill" for q in queries}
        phases = set(at.values()) or {"decode" if mode == "decode" else "prefill"}
        if len(phases) == 1:
            phase = phases.pop()
            raise OptionError("{given!r} is a backend per phase, and a {which} step runs only its {phase} phase: "
                              "name that backend ({backend}), or measure both phases with {mode} generate",
                              given=name, which=mode, phase=phase, backend=getattr(policy, phase))
        runs = "; ".join(f"{getattr(policy, p)} at {', '.join(str(q) for q in sorted(at) if at[q] == p)}"
                         for p in ("decode", "prefill"))
        raise OptionError("{given!r} is a backend per phase, and a {which} step runs one phase, the one its query "
                          "length falls in ({runs}): measure each backend at its lengths, or both phases with {mode} "
                          "generate", given=name, which=mode, runs=runs)


def _combinations(r: Request) -> None:
    """Parameters that exclude each other, or do not apply to the mode: refused rather than ignored."""
    if (r.device_map is not None or r.tp) and r.device is not None:
        raise OptionError("{device} picks one device; {device_map} and {tp} place the model themselves")
    if r.generate and r.seq:
        raise OptionError("{seq} is the length of a prefill, decode or train step; a generate's prompts are "
                          "{prompt_len} (lengths spread around it), {prompt_lens} or {lengths}")
    given = _given(r)
    if not r.generate and r.mode is not None and given:
        mix = "; {lengths} is a generate sweep's mix of prompt lengths; a {this} sweep has none" \
            if "lengths" in given else ""
        raise OptionError(", ".join("{" + g + "}" for g in given) + ": for {mode} generate only (this is {mode} "
                          "{this})" + mix, this=r.mode)
    prompts = [n for n in ("prompt_len", "prompt_lens", "lengths") if n in given]
    if len(prompts) > 1:
        raise OptionError(" and ".join("{" + n + "}" for n in prompts) + ": each says which prompt lengths to "
                          "measure; choose one")
    if r.requests is not DEFAULT:
        if r.lengths is None:
            raise OptionError("{requests} charges the first-met shapes of a length mix: give {lengths}")
        options.check_requests(r.requests)
    if r.prompt_lens is not None and len(r.new_tokens) > 1:
        raise OptionError("{prompt_lens} gives one generate workload; a list of {new_tokens} is a sweep over "
                          "{prompt_len} (or {lengths})")
    if r.sweeps and r.kind != "compare":
        raise OptionError("a sweep (lists of {seq}, {batch}, {prompt_len} or {new_tokens}, or {lengths}) is a "
                          "{compare_sweep}")
    if r.sweeps and r.mode not in ("prefill", "train", "generate"):
        raise OptionError("a sweep of {seq} is of prefill or train steps, and one of {prompt_len} of generate "
                          "workloads; {mode} {this} has none", this=r.mode)


def _shapes(r: Request) -> None:
    """The shapes, the generation and what a preset's own facts refuse, of a request with its defaults."""
    pairs = r.shapes or tuple((b, s) for b in r.batch for s in (r.prompt_len if r.generate else r.seq))
    lengths = tuple(dict.fromkeys(s for _, s in pairs))
    for b, s in pairs:
        options.check_shape(b, s, r.mode, r.padding)
    source = options.model_source(r.model) if r.model is not None else None
    for new in r.new_tokens if r.generate else (None,):
        if r.generate:
            for prompt_len in lengths:
                options.check_generation(new, r.prompt_lens, r.cache, prompt_len)
        if source is not None:  # positions a preset's table has no row for
            for s in lengths:
                options.check_model_workload(source, r.mode, s, new, r.prompt_lens)
