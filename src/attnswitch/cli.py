"""The ``attnswitch`` command: one function per subcommand, in the table ``COMMANDS``.

Exit codes: 0 when every asked-for step ran (backends that cannot run are part of the answer);
1 when no backend could run at all, or the model failed while measuring (raised, with its traceback);
2 for bad input (unknown model, unreadable config, bad option), found before any measurement; 130 when
interrupted (Ctrl-C: one line, ``--out`` as it was); 141 when the reader of stdout went away (``| head``:
the report is still written to ``--out``). Heavy libraries (torch, transformers) are imported by the
subcommands that need them, after every option that can be checked without them is: not for ``--help``,
``presets`` or a misspelt name.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import os
import shlex
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from . import candidate, options, outfolder

__all__ = ["main", "run", "build_parser", "COMMANDS", "EXIT_OK", "EXIT_NOTHING_RAN", "EXIT_BAD_INPUT",
           "EXIT_INTERRUPTED", "EXIT_BROKEN_PIPE", "FLAGS"]

EXIT_OK, EXIT_NOTHING_RAN, EXIT_BAD_INPUT = 0, 1, 2
EXIT_INTERRUPTED, EXIT_BROKEN_PIPE = 130, 141  # as a shell reports a process ended by SIGINT, by SIGPIPE
#: the library's parameter -> the flag that sets it, for errors the library words with its parameters
FLAGS = {"batch": "--batch", "seq": "--seq", "dtype": "--dtype", "padding": "--padding", "mode": "--mode",
         "prompt_len": "--prompt-len", "prompt_lens": "--prompt-lens", "new_tokens": "--new-tokens",
         "cache": "--cache", "layers": "--num-layers", "device_map": "--device-map", "tp": "--tp",
         "backends": "--backends", "out": "--out", "iters": "--iters", "warmup": "--warmup"}


@dataclass(frozen=True)
class Session:
    """What a subcommand runs with: its arguments, the command line, and where to print."""

    args: argparse.Namespace
    argv: list[str]
    out: object  # rich Console on stdout: the answer
    err: object  # rich Console on stderr: progress and errors
    started: float = 0.0  # perf_counter() when the command began, before torch and transformers were imported


# -- options --------------------------------------------------------------------------------------

def _ints(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer or a comma-separated list of integers, not {text!r}") \
            from None
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"expected integers of at least 1, not {text!r}")
    return values


def _model_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", nargs="?", default=None,
                   help="a preset, a local folder, a config.json or a hub id (default: a preset sized for the device)")
    p.add_argument("--batch", type=_ints, default=None,
                   help="batch size, or a list for a sweep (default: 4 on a GPU, 2 on a CPU)")
    p.add_argument("--seq", type=_ints, default=None,
                   help="sequence length, or a list (512,2048,8192) for a sweep (default: 2048 on a GPU, 128 on a CPU)")
    p.add_argument("--dtype", default=None, help="fp32, fp16 or bf16 (default: bf16 on a GPU, fp32 on a CPU)")
    p.add_argument("--padding", action="store_true", help="a padded batch (left padding for decoders)")
    p.add_argument("--mode", choices=["prefill", "decode", "generate", "train"], default="prefill",
                   help="prefill: the whole sequence; decode: one new token against a KV cache of --seq; generate: "
                        "greedy generation end to end; train: forward + backward of the loss")
    p.add_argument("--prompt-len", type=_ints, default=None,
                   help="generate: prompts spread around this length (default: 512 on a GPU, 32 on a CPU), or a list "
                        "(256,1024,4096) for a sweep of prompt lengths")
    p.add_argument("--prompt-lens", type=_ints, default=None, help="generate: these prompt lengths instead")
    p.add_argument("--prompt-lens-from", default=None, metavar="FILE",
                   help="generate: the prompt lengths a deployment sees (one a line, or a JSON histogram "
                        "{\"512\": 120, ...}): a sweep at its representative lengths, weighted as the file says")
    p.add_argument("--requests", type=int, default=None, metavar="N",
                   help="with --prompt-lens-from: the run of requests to charge each backend's first-met shapes "
                        "over (default: 1000)")
    p.add_argument("--new-tokens", type=_ints, default=None,
                   help="generate: exactly this many new tokens per prompt (default: 128 on a GPU, 8 on a CPU), or a "
                        "list for a sweep")
    p.add_argument("--cache", choices=["dynamic", "static"], default="dynamic",
                   help="generate: the model's default KV cache, or transformers' static cache")
    p.add_argument("--device", default=None, help="cuda, cuda:N or cpu (default: cuda when available)")
    p.add_argument("--num-layers", type=int, default=None,
                   help="this many layers: a checkpoint's first N; a preset or config.json (random weights) may grow")
    p.add_argument("--trust-remote-code", action="store_true", help="allow a local model's own code to run")
    p.add_argument("--device-map", default=None, metavar="MAP",
                   help="spread the model over the GPUs with accelerate: auto, balanced, balanced_low_0 or sequential")
    p.add_argument("--tp", action="store_true",
                   help="tensor parallelism over the ranks of torchrun (tp_plan='auto'): "
                        "torchrun --nproc-per-node N -m attnswitch compare MODEL --tp")
    p.add_argument("--backends", default="all",
                   help="comma-separated backends or policies per phase (prefill=cudnn/decode=flash), or 'all'")


def _profile_options(iters: int) -> Callable[[argparse.ArgumentParser], None]:
    def add(p: argparse.ArgumentParser) -> None:
        _model_options(p)
        p.add_argument("--warmup", type=int, default=None,
                       help="steps after the cold one and before timing (default: 1; 0 for generate, whose cold "
                            "workload meets every length)")
        p.add_argument("--iters", type=int, default=None,
                       help=f"timed steps per backend in the first rounds (default: {iters}; for generate, "
                            "each prompt once)")
        p.add_argument("--rounds", type=int, default=None,
                       help=f"interleaved rounds every backend is timed in (default: {min(iters, 6)}; for generate "
                            "a round is one prompt: --iters times each, at least 6)")
        p.add_argument("--time-budget", type=float, default=None, metavar="S",
                       help="seconds of more rounds for the backends still tied with the fastest (default: as long "
                            "as the first rounds took, at most 30; 0: no more rounds)")
        p.add_argument("--out", default=None, help="write report.json/.csv/.md/.html and traces here")
        p.add_argument("--unfold", action="store_true", help="one row per layer instead of folding repeated layers")
        p.add_argument("--layers", action="store_true", help="print the per-layer tables too")
        p.add_argument("--compile", default="none", metavar="MODES",
                       help="run every backend under torch.compile: none, default, reduce-overhead or max-autotune; "
                            "several joined by commas (default,none) put compiled and uncompiled side by side")
        p.set_defaults(default_iters=iters)
    return add


def _compare_options(p: argparse.ArgumentParser) -> None:
    _profile_options(12)(p)
    p.add_argument("--no-numerics", action="store_true", help="skip the comparison with eager float32")


# -- shared steps ---------------------------------------------------------------------------------

def _check_options(args) -> None:
    """Bad input found in the options alone, before torch is imported: one line, before any work."""
    _check_combinations(args)
    _check_values(args)
    if getattr(args, "out", None):
        outfolder.check(args.out)


_GENERATE_ONLY = (("prompt_len", "--prompt-len"), ("prompt_lens", "--prompt-lens"), ("new_tokens", "--new-tokens"),
                  ("prompt_lens_from", "--prompt-lens-from"), ("requests", "--requests"))


def _check_combinations(args) -> None:
    """Options that exclude each other, or do not apply to the mode: refused rather than ignored."""
    if (args.device_map or args.tp) and args.device is not None:
        raise ValueError("--device picks one device; --device-map and --tp place the model themselves")
    if args.mode == "generate" and args.seq is not None:
        raise ValueError("--seq is the length of a prefill, decode or train step; a generate's prompts are "
                         "--prompt-len (lengths spread around it) or --prompt-lens")
    if args.mode != "generate":
        given = [flag for attr, flag in _GENERATE_ONLY if getattr(args, attr) is not None]
        given += ["--cache"] if args.cache != "dynamic" else []
        if given:
            raise ValueError(f"{', '.join(given)}: for --mode generate only (this is --mode {args.mode})")
    given = [f for a, f in (("prompt_len", "--prompt-len"), ("prompt_lens", "--prompt-lens"),
                            ("prompt_lens_from", "--prompt-lens-from")) if getattr(args, a) is not None]
    if len(given) > 1:
        raise ValueError(f"{' and '.join(given)}: each says which prompt lengths to measure; choose one")
    if args.requests is not None and args.prompt_lens_from is None:
        raise ValueError("--requests charges the first-met shapes of a length mix: give --prompt-lens-from FILE")
    if args.requests is not None and not 1 <= args.requests <= options.MAX_REQUESTS:
        raise ValueError(f"--requests must be from 1 to {options.MAX_REQUESTS}, got {args.requests}")
    if args.prompt_lens is not None and len(args.new_tokens or [1]) > 1:
        raise ValueError("--prompt-lens gives one generate workload; a list of --new-tokens is a sweep over "
                         "--prompt-len (or --prompt-lens-from)")
    if _sweep(args) and getattr(args, "command", "") != "compare":
        raise ValueError("a sweep (lists of --seq, --batch, --prompt-len or --new-tokens, or --prompt-lens-from) "
                         "is a `compare`")
    if len(args.seq or [1]) > 1 and args.mode not in ("prefill", "train"):
        raise ValueError("a sweep of --seq is of prefill or train steps; a generate's is of --prompt-len")
    if getattr(args, "iters", None) is not None and args.iters < 1:
        raise ValueError(f"--iters must be at least 1, got {args.iters}")
    if getattr(args, "rounds", None) is not None and args.rounds < 1:
        raise ValueError(f"--rounds must be at least 1, got {args.rounds}")
    if getattr(args, "time_budget", None) is not None and not args.time_budget >= 0:
        raise ValueError(f"--time-budget must be 0 or more seconds, got {args.time_budget}")
    if getattr(args, "warmup", None) is not None and args.warmup < 0:
        raise ValueError(f"--warmup must be 0 or more, got {args.warmup}")
    if getattr(args, "compile", None) is not None:
        from .compiling import parse_compile  # (torch-free)

        compiled = [m for m in parse_compile(args.compile) if m is not None]
        if compiled and (args.device_map or args.tp):
            raise ValueError("--compile runs one process's model on one device; not with --device-map or --tp")


def _sweep(args) -> bool:
    """Whether the options ask for a sweep: lists of lengths, batches or new tokens, or a length mix."""
    lists = (args.seq, args.batch, args.prompt_len, args.new_tokens)
    return any(len(x or [1]) > 1 for x in lists) or args.prompt_lens_from is not None


def _lengths(args):
    """The length mix of ``--prompt-lens-from`` (torch-free: read before anything is imported)."""
    from .lengths import read_lengths

    return read_lengths(args.prompt_lens_from) if args.prompt_lens_from else None


def _registered() -> list[str]:
    """Backends registered in this process (a program that registers its own kernel, then calls ``main``);
    none where the registry is not loaded yet (the built-ins' names are known without it)."""
    registry = sys.modules.get("attnswitch.backends.registry")
    return list(registry.REGISTRY) if registry is not None else []


def _check_values(args) -> None:
    """Every name and number the library checks, checked here as the library does (``options``), without
    torch: the model (where its name or path decides), backends, dtype, placement, shapes, generation."""
    candidate.check_backends(args.backends, _registered())
    if args.dtype is not None:
        options.dtype_name(args.dtype)
    options.check_placement(args.device_map, args.tp)
    options.check_layers(args.num_layers)
    seqs, batches = args.seq or [128], args.batch or [2]  # (the defaults on a CPU: a GPU's are larger)
    for b in batches:
        options.check_shape(b, seqs[0], args.mode, args.padding)
    generate = args.mode == "generate"
    lengths = _lengths(args) if generate else None  # a bad file: one line, now
    prompt_lens = list(lengths.representative()) if lengths else (args.prompt_len or [32])
    for new in (args.new_tokens or [8]):
        if generate:
            for prompt_len in prompt_lens:
                options.check_generation(new, args.prompt_lens, args.cache, prompt_len)
        if args.model is not None:
            source = options.model_source(args.model)
            for seq in (prompt_lens if generate else seqs):  # positions a preset's table has no row for
                options.check_model_workload(source, args.mode, seq, new, args.prompt_lens)


class Shapes(list):
    """A sweep's ``(batch, length)`` shapes, and what else its sweep takes (``kw``: a generate's new tokens,
    cache and length mix)."""

    def __init__(self, shapes=(), kw: dict | None = None):
        super().__init__(shapes)
        self.kw = dict(kw or {})


def _setup(args):
    """The model and its workload(s), from the command line: one workload, or a sweep's shapes."""
    import torch

    from .backends import parse_backends
    from .device import parse_device
    from .models import default_preset, load_model, parse_dtype
    from .workload import make_workload

    dev = parse_device(args.device)
    parse_backends(args.backends, dev)  # bad names are bad input, before the model is loaded
    gpu = dev.type == "cuda"
    dtype = parse_dtype(args.dtype or ("bf16" if gpu else "fp32"))
    if gpu and dtype == torch.bfloat16 and not torch.cuda.is_bf16_supported():
        raise ValueError(f"--dtype bf16: {torch.cuda.get_device_name(dev)} cannot run bfloat16")
    spec = args.model or default_preset(dev)
    model, desc = load_model(spec, dtype=dtype, device=dev, trust_remote_code=args.trust_remote_code,
                             layers=args.num_layers, device_map=args.device_map, tp=args.tp)
    batches = args.batch or [4 if gpu else 2]
    seqs = args.seq or [2048 if gpu else 128]
    if args.mode == "generate":
        lengths = _lengths(args)
        prompts = list(lengths.representative()) if lengths else (args.prompt_len or [512 if gpu else 32])
        news = args.new_tokens or [128 if gpu else 8]
        if lengths:  # every length of the mix within the model's positions, not only those measured: now
            from .comparison import check_mix
            check_mix(model, "generate", lengths, args.requests or 1000, max(news))
        if _sweep(args):
            shapes = Shapes(((b, n) for b in batches for n in prompts),
                            {"new_tokens": news, "cache": args.cache, "lengths": lengths,
                             "requests": args.requests or 1000})
            for b, n in shapes:  # each shape's inputs checked (and dropped) before the first is measured
                for new in news:
                    make_workload(model, batch=b, seq=n, mode="generate", new_tokens=new, cache=args.cache)
            return model, shapes, spec, desc
        work = make_workload(model, batch=batches[0], seq=prompts[0], mode="generate", new_tokens=news[0],
                             prompt_lens=args.prompt_lens, cache=args.cache)
    elif len(batches) > 1 or len(seqs) > 1:
        shapes = Shapes((b, s) for b in batches for s in seqs)
        for b, s in shapes:  # each shape's inputs checked (and dropped) before the first is measured
            make_workload(model, batch=b, seq=s, padding=args.padding, mode=args.mode)
        return model, shapes, spec, desc
    else:
        work = make_workload(model, batch=batches[0], seq=seqs[0], padding=args.padding, mode=args.mode)
    return model, work, spec, desc


def _command_line(s: Session) -> str:
    from . import dist

    command = "attnswitch " + " ".join(shlex.quote(a) for a in s.argv)
    w = dist.world()
    return f"torchrun --nproc-per-node {w[1]} -m {command}" if w is not None else command


def _write_outputs(report, d: Path) -> None:
    """Every file of the report into the folder ``d`` (its traces are there already: they were written
    into ``d / "traces"`` as they were recorded), and the pick as ``policy.json``."""
    from .deploy import write_policy

    report.to_json(d / "report.json")
    report.to_csv(d / "report.csv")
    report.to_markdown(d / "report.md")
    report.write_html(d / "report.html")
    write_policy(report, d / "policy.json")  # the pick, to apply in a serving process (attnswitch.load_policy)
    if report.command:
        (d / "command.txt").write_text(report.command + "\n")


def _moved(report, src: Path, dst: Path):
    """The report with the paths of its traces under ``src`` (the folder it was staged in) under ``dst``."""
    import dataclasses

    def move(p):
        return str(dst / Path(p).relative_to(src)) if p and Path(p).is_relative_to(src) else p

    def fix(b):
        return dataclasses.replace(b, trace_path=move(b.trace_path),
                                   rank_trace_paths=tuple(move(p) for p in b.rank_trace_paths))
    return dataclasses.replace(report, backends=tuple(map(fix, report.backends)), sweep=tuple(
        dataclasses.replace(p, backends=tuple(map(fix, p.backends))) for p in report.sweep))


def _printed(s: Session, report) -> bool:
    """The report printed on stdout; False where its reader went away (``| head``): the files are still
    written, and the command ends with ``EXIT_BROKEN_PIPE``."""
    try:
        report.render(s.out, layers=s.args.layers, fold=not s.args.unfold)
        sys.stdout.flush()
    except BrokenPipeError:
        return False
    return True


# -- subcommands ----------------------------------------------------------------------------------

def _env(s: Session) -> int:
    import torch

    from .backends import auto_choice
    from .device import default_device
    from .env import environment

    for k, v in environment().items():
        s.out.print(f"{k:>18}: {v}")
    dev = default_device()
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    q = torch.zeros(1, 16, 1024, 64, device=dev, dtype=dtype)
    s.out.print(f"{'sdpa auto picks':>18}: {auto_choice(q, q, q, is_causal=True)} (B1 H16 S1024 D64 "
                f"{str(dtype).replace('torch.', '')}, causal)")
    return EXIT_OK


def _defects_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--torch", default=None, metavar="VERSION", help="match against this torch version (default: "
                   "the installed one)")
    p.add_argument("--cudnn", default=None, metavar="VERSION", help="this cuDNN version, 9.20 or 92000 (default: "
                   "the one torch loads)")
    p.add_argument("--arch", default=None, metavar="SM", help="this GPU architecture, sm90 or 9.0 (default: this "
                   "machine's GPU)")


def _defects(s: Session) -> int:
    from . import defects

    a = s.args
    given = defects.Stack(defects.version_of(a.torch), defects.version_of(a.cudnn), defects.arch_of(a.arch))
    if any(x is not None for x in (a.torch, a.cudnn, a.arch)) and None in (given.torch, given.cudnn, given.arch):
        bad = [f for f, v, got in (("--torch", a.torch, given.torch), ("--cudnn", a.cudnn, given.cudnn),
                                   ("--arch", a.arch, given.arch)) if v is not None and got is None]
        if bad:
            raise ValueError(f"{', '.join(bad)}: a version is like 2.13.0 (cuDNN: 9.20 or 92000), an architecture "
                             "like sm90 or 9.0")
    if None in (given.torch, given.cudnn, given.arch):  # what was not given: this machine's (torch needed)
        from .env import environment

        here = defects.stack_of(environment())
        given = defects.Stack(given.torch or here.torch, given.cudnn or here.cudnn, given.arch or here.arch,
                              here.gpu if a.arch is None else None)
    for line in defects.listing_lines(given):
        s.out.print(line, markup=False, highlight=False, soft_wrap=True)
    return EXIT_OK


def _presets(s: Session) -> int:
    for p in options.PRESETS.values():
        s.out.print(f"{p.name:>14}  {p.about}")
    return EXIT_OK


def _loaded(s: Session):
    with s.err.status("loading model"):
        model, work, spec, desc = _setup(s.args)
    about = work.description if not isinstance(work, list) else f"a sweep of {len(work)} shapes"
    s.err.print(f"{desc}; {about}", highlight=False)
    return model, work, spec


@contextlib.contextmanager
def _progress(console):
    """A callback for each step of a measurement: a spinner on a terminal, else one line per step."""
    if console.is_terminal:
        with console.status("") as status:
            yield lambda step: status.update(f"running {step}")
    else:  # a log: each line with the seconds since the measurement began, so slow steps show
        t0 = time.perf_counter()
        yield lambda step: console.print(f"attnswitch: [{time.perf_counter() - t0:6.1f} s] {step}", highlight=False,
                                         markup=False)


def _check(s: Session) -> int:
    from .eligibility import check

    model, work, _ = _loaded(s)
    res = check(model, backends=None if s.args.backends == "all" else s.args.backends, **work.first())
    s.out.print(str(res), markup=False, highlight=False)
    return EXIT_OK if res.eligible else EXIT_NOTHING_RAN


def _steps(args, work) -> dict:
    generate = getattr(args, "mode", None) == "generate"  # a sweep's work is a list of shapes
    return {"warmup": args.warmup,
            "iters": args.iters if args.iters is not None else (None if generate else args.default_iters),
            "rounds": args.rounds, "time_budget_s": args.time_budget}


@contextlib.contextmanager
def _not_bad_input():
    """Around the measurement, once the input has been checked: what the model or a kernel raises there
    is a failure to show whole (exit 1), not an input error of one line (exit 2)."""
    from .errors import UnsupportedModel

    try:
        yield
    except UnsupportedModel:
        raise  # found only when a forward runs, and still the model's fault, not the tool's
    except (ValueError, TypeError, FileNotFoundError) as e:
        raise RuntimeError(f"{type(e).__name__} while measuring: {e}") from e


def _measured(s: Session, run: Callable, sweep: Callable | None = None) -> int:
    from . import dist

    out = s.args.out
    # the report is written into a folder beside --out, which takes its place once every file is written
    staging = outfolder.Staged(out) if out and dist.is_main() else contextlib.nullcontext()
    with staging as staged:
        trace_dir = staged / "traces" if staged is not None else (Path(out) / "traces" if out else None)
        report = _report(s, run, sweep, trace_dir)
        printed = _printed(s, report)
        if staged is not None:
            t0 = time.perf_counter()
            report.save_traces(trace_dir)  # any trace recorded elsewhere (where written here: nothing to do)
            _write_outputs(_moved(report, staged, Path(out)), staged)
    if staged is not None:
        s.err.print(f"wrote {out}/report.json, report.csv, report.md, report.html, policy.json, traces/ in "
                    f"{time.perf_counter() - t0:.1f} s", highlight=False, markup=False, soft_wrap=True)
    if not printed:
        return EXIT_BROKEN_PIPE
    answered = report.decision is None or report.decision.answered  # (a profile decides nothing)
    return EXIT_OK if report.ok and answered else EXIT_NOTHING_RAN


def _report(s: Session, run: Callable, sweep: Callable | None, trace_dir: Path | None):
    """The model loaded, measured, and the report with the command line and the command's own time."""
    import dataclasses

    t0 = time.perf_counter()
    importing = t0 - s.started if s.started else 0.0  # the subcommand's imports (torch, transformers)
    model, work, spec = _loaded(s)
    loading = time.perf_counter() - t0
    backends = None if s.args.backends == "all" else s.args.backends
    with _progress(s.err) as progress, _not_bad_input():
        kw = dict(backends=backends, trace_dir=trace_dir, progress=progress, model_name=spec, compile=s.args.compile,
                  **_steps(s.args, work))
        report = sweep(model, work, mode=s.args.mode, padding=s.args.padding, **work.kw, **kw) \
            if isinstance(work, Shapes) else run(model, work, **kw)
    spent = {"imports": round(importing, 3), "loading the model": round(loading, 3),
             **report.settings.get("time_s", {})}
    spent["total"] = round(spent.get("total", 0) + importing + loading, 3)
    return dataclasses.replace(report, command=_command_line(s), settings={**report.settings, "time_s": spent})


def _profile(s: Session) -> int:
    from .profiling import profile

    return _measured(s, profile)


def _compare(s: Session) -> int:
    from .comparison import compare, compare_sweep

    def run(model, work, **kw):
        return compare(model, work, check_numerics=not s.args.no_numerics, **kw)

    def sweep(model, shapes, **kw):
        return compare_sweep(model, shapes, check_numerics=not s.args.no_numerics, **kw)

    return _measured(s, run, sweep)


@dataclass(frozen=True)
class Command:
    help: str
    options: Callable[[argparse.ArgumentParser], None] | None
    run: Callable[[Session], int]
    model: bool = True  # its options are a model's and a measurement's, checked before torch is imported


COMMANDS: dict[str, Command] = {
    "env": Command("GPU, driver, CUDA, cuDNN, torch, transformers; SDPA's auto pick", None, _env),
    "check": Command("which backends can run the inputs, and why not", _model_options, _check),
    "profile": Command("the per-layer profile of each backend", _profile_options(6), _profile),
    "compare": Command("every backend ranked, numerics checked, with a recommendation", _compare_options, _compare),
    "presets": Command("list the built-in model presets", None, _presets),
    "defects": Command("the known defects of attention kernels, and which apply here", _defects_options, _defects,
                       model=False),
}


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("attnswitch")
    except PackageNotFoundError:  # pragma: no cover - run from a source tree
        return "unknown"


class _Parser(argparse.ArgumentParser):
    """argparse's parser with its errors in one line (the usage is a ``--help`` away), as every other bad
    input is answered."""

    def error(self, message: str):
        self.exit(EXIT_BAD_INPUT, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="attnswitch", description="Switch, profile and compare the attention "
                                     "implementation of transformers models.")
    parser.add_argument("--version", action="version", version=f"attnswitch {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, cmd in COMMANDS.items():
        p = sub.add_parser(name, help=cmd.help)
        if cmd.options:
            cmd.options(p)
    return parser


def piped_width(environ=None) -> int:
    """The width tables fit on an output that is not a terminal (a log, a pipe), where prose is never wrapped:
    ``COLUMNS`` where set, else as wide as ``str(report)``'s."""
    from .render.console import TABLE_WIDTH

    value = (os.environ if environ is None else environ).get("COLUMNS", "")
    return int(value) if value.isdigit() and int(value) > 0 else TABLE_WIDTH


def _error(err, e: BaseException) -> None:
    from rich.text import Text

    # the message as text, never markup: it quotes user input ("[/x]", "runs/[exp1]/model")
    err.print(Text.assemble(("error:", "bold red"), " ", str(e)), highlight=False, soft_wrap=True)


def _speaks() -> bool:
    """Whether this process prints: rank 0 under torchrun (its ``RANK``, before any process group is up)."""
    if "torch" in sys.modules:
        from . import dist

        return dist.is_main()
    return int(os.environ.get("RANK", "0")) == 0


def _interrupted(out: str | None, kept: bool) -> str:
    if not out:
        return "interrupted"
    return f"interrupted; kept the previous report in {out}" if kept else f"interrupted; nothing written to {out}"


def _console(**kw):
    """A rich Console that raises ``BrokenPipeError`` when its reader goes away (rich's own ends the
    process with exit 1, which says that nothing ran), and prints nothing more after."""
    from rich.console import Console

    class Answer(Console):
        def on_broken_pipe(self) -> None:
            self.quiet = True
            raise BrokenPipeError(errno.EPIPE, "the reader went away")

    return Answer(**kw)


def main(argv: list[str] | None = None) -> int:
    started = time.perf_counter()
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as e:  # --help, --version, or an error argparse found (one line, already printed)
        return e.code if isinstance(e.code, int) else EXIT_BAD_INPUT
    quiet = not _speaks()  # under torchrun only rank 0 speaks (and writes)
    piped = not sys.stdout.isatty()  # a log, a file: tables fit piped_width(), no line of prose is wrapped
    out = _console(width=piped_width() if piped else None, soft_wrap=piped, quiet=quiet)
    err = _console(stderr=True, soft_wrap=not sys.stderr.isatty(), quiet=quiet)
    folder = getattr(args, "out", None)
    kept = bool(folder) and outfolder.previous_report(folder)
    try:
        if COMMANDS[args.command].options is not None and COMMANDS[args.command].model:
            _check_options(args)  # before torch and transformers are imported
        return COMMANDS[args.command].run(Session(args, argv, out, err, started))
    except KeyboardInterrupt:
        err.print(_interrupted(folder, kept), highlight=False, markup=False, soft_wrap=True)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # printing the answer: its reader went away
        return EXIT_BROKEN_PIPE
    except options.OptionError as e:
        _error(err, e.worded(FLAGS))
        return EXIT_BAD_INPUT
    except (ValueError, FileNotFoundError, TypeError) as e:
        _error(err, e)
        return EXIT_BAD_INPUT
    except Exception as e:  # an UnsupportedModel is bad input; anything the model raised is not
        from .errors import UnsupportedModel

        if isinstance(e, UnsupportedModel):
            _error(err, e)
            return EXIT_BAD_INPUT
        raise
    finally:
        if getattr(args, "tp", False) and "torch" in sys.modules:
            from . import dist

            dist.destroy()


def run() -> None:
    """The ``attnswitch`` command itself (its console script and ``python -m attnswitch``): ``main`` in a
    process of its own, so two process-wide choices are made for it here, not in ``main``:

    - inductor compiles in this process (``TORCHINDUCTOR_COMPILE_THREADS=1`` unless set): ``flex`` compiles a
      few kernels, and a pool of one worker per core costs more to start and to shut down than it saves
      (an H200 ``compare``: flex's first forward 7.0 s against 8.0 s, exit 2.0 s against 3.0 s);
    - once everything is written and flushed (Python's streams and C's), the process ends without tearing
      the interpreter down (``os._exit``): unloading torch's CUDA state takes seconds and there is nothing
      left to save. It exits normally where something may still save at exit: under ``torchrun`` (the
      process group is taken down first), and under a profiler, tracer or coverage tool.
    """
    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
    code = main()
    try:
        sys.stdout.flush()
    except BrokenPipeError:  # the answer's reader went away before its last lines
        code = code or EXIT_BROKEN_PIPE
    if code == EXIT_BROKEN_PIPE:  # nothing more can reach the reader: what is left goes nowhere, silently
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    if "TORCHELASTIC_RUN_ID" in os.environ or "WORLD_SIZE" in os.environ or _observed():
        sys.exit(code)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError):  # a stream that can no longer be written has nothing to give
            stream.flush()
    with contextlib.suppress(Exception):  # what native code printed (NCCL, cuDNN, Triton) into C's buffers
        import ctypes

        ctypes.CDLL(None).fflush(None)
    os._exit(code)


def _observed() -> bool:
    """Whether a tool that writes its results at exit watches this process (cProfile, coverage, a tracer)."""
    if sys.gettrace() is not None or sys.getprofile() is not None or "coverage" in sys.modules:
        return True
    monitoring = getattr(sys, "monitoring", None)  # from Python 3.12 cProfile and coverage may use it instead
    return monitoring is not None and any(monitoring.get_tool(i) is not None for i in (
        monitoring.DEBUGGER_ID, monitoring.COVERAGE_ID, monitoring.PROFILER_ID))


if __name__ == "__main__":  # pragma: no cover
    run()
