"""The ``attnswitch`` command: one function per subcommand, in the table ``COMMANDS``.

Exit codes follow what went wrong, not when it was found: 0 when every asked-for step ran (backends that cannot run
are part of the answer); 1 when no backend could run at all, the model made no attention call through the switch,
memory ran out outside any backend's row (one line), or the model or a kernel failed (raised whole, with its
traceback); 2 for bad input (an ``options.OptionError``:
unknown model, unreadable config, weights that do not match it, a bad option, a backend this device cannot offer;
an unsupported model; no space left on device); 130 when interrupted (Ctrl-C: one line, ``--out`` as it was) and
143 when terminated (SIGTERM: the same); 141 when the reader of stdout went away (``| head``: the report is still
written to ``--out``). Heavy libraries (torch, transformers) are imported by the subcommands that need them, after
every option that can be checked without them is (``request.Request.check``): not for ``--help``, ``presets`` or a
misspelt name.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import functools
import os
import shlex
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from . import options, outfolder
from ._own_env import set_default
from .candidate import means_all
from .errors import Terminated, raised_signal, signals_so_far, sigterm_as_interrupt
from .request import BUDGET_CAP_S, DEFAULT, DEFAULTS, FIRST_ROUNDS, ITERS, PROFILE_ITERS, REQUESTS, Request, Steps
from .words import counted

__all__ = ["main", "run", "build_parser", "COMMANDS", "EXIT_OK", "EXIT_NOTHING_RAN", "EXIT_BAD_INPUT",
           "EXIT_INTERRUPTED", "EXIT_TERMINATED", "EXIT_BROKEN_PIPE", "FLAGS", "Terminated"]

EXIT_OK, EXIT_NOTHING_RAN, EXIT_BAD_INPUT = 0, 1, 2
# as a shell reports a process ended by SIGINT, by SIGTERM, by SIGPIPE (128 + the signal's number)
EXIT_INTERRUPTED, EXIT_TERMINATED, EXIT_BROKEN_PIPE = 130, 143, 141
#: the library's parameter -> the flag that sets it, for errors the library words with its parameters
FLAGS = {"batch": "--batch", "seq": "--seq", "dtype": "--dtype", "padding": "--padding", "mode": "--mode",
         "prompt_len": "--prompt-len", "prompt_lens": "--prompt-lens", "lengths": "--prompt-lens-from",
         "requests": "--requests", "new_tokens": "--new-tokens", "cache": "--cache", "device": "--device",
         "layers": "--num-layers", "device_map": "--device-map", "tp": "--tp", "backends": "--backends",
         "compile": "--compile", "torch": "--torch", "cudnn": "--cudnn", "arch": "--arch", "out": "--out",
         "iters": "--iters", "rounds": "--rounds", "warmup": "--warmup", "time_budget_s": "--time-budget",
         "compare_sweep": "`compare`"}
_CPU, _GPU = DEFAULTS["cpu"], DEFAULTS["cuda"]


@dataclass
class _Outcome:
    """What a line about an interrupt says: the ``--out`` folder, whether it held a report, the staging; and the
    signals recorded before the run began (``errors.signals_so_far``)."""

    folder: str | None = None
    kept: bool = False
    staged: outfolder.Staged | None = None
    signals: int = 0


@dataclass(frozen=True)
class Session:
    """What a subcommand runs with: its arguments, the command line, and where to print."""

    args: argparse.Namespace
    argv: list[str]
    out: object  # rich Console on stdout: the answer
    err: object  # rich Console on stderr: progress and errors
    started: float = 0.0  # perf_counter() when the command began, before torch and transformers were imported
    request: Request | None = None  # the options as the library's request, checked
    outcome: _Outcome = field(default_factory=_Outcome)


# -- options --------------------------------------------------------------------------------------

def _ints(text: str, once: bool = True) -> list[int]:
    """A comma-separated list of integers of at least 1; ``once``: each value once (a sweep's points)."""
    try:
        values = [int(x) for x in text.split(",")]  # ("16," and ",16" too: a list with a value left out)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer or a comma-separated list of integers, not {text!r}") \
            from None
    if any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"expected integers of at least 1, not {text!r}")
    if once and len(set(values)) < len(values):
        raise argparse.ArgumentTypeError(f"{text!r} names a value twice")
    return values


def _model_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", nargs="?", default=None,
                   help="a preset, a local folder, a config.json or a hub id (default: a preset sized for the device)")
    p.add_argument("--batch", type=_ints, default=None,
                   help=f"batch size, or a list for a sweep (default: {_GPU.batch} on a GPU, {_CPU.batch} on a CPU)")
    p.add_argument("--seq", type=_ints, default=None,
                   help=f"sequence length, or a list (512,2048,8192) for a sweep (default: {_GPU.seq} on a GPU, "
                        f"{_CPU.seq} on a CPU)")
    p.add_argument("--dtype", default=None,
                   help=f"fp32, fp16 or bf16 (default: {_GPU.dtype} on a GPU, {_CPU.dtype} on a CPU)")
    p.add_argument("--padding", action="store_true", help="a padded batch (left padding for decoders)")
    p.add_argument("--mode", choices=options.MODES, default="prefill",
                   help="prefill: the whole sequence; decode: one new token against a KV cache of --seq; generate: "
                        "greedy generation end to end; train: forward + backward of the loss")
    p.add_argument("--prompt-len", type=_ints, default=None,
                   help=f"generate: prompts spread around this length (default: {_GPU.prompt_len} on a GPU, "
                        f"{_CPU.prompt_len} on a CPU), or a list (256,1024,4096) for a sweep of prompt lengths")
    p.add_argument("--prompt-lens", type=functools.partial(_ints, once=False), default=None,  # (a workload's prompts)
                   help="generate: these prompt lengths instead")
    p.add_argument("--prompt-lens-from", default=None, metavar="FILE",
                   help="generate: the prompt lengths a deployment sees (one a line, or a JSON histogram "
                        "{\"512\": 120, ...}): a sweep at its representative lengths, weighted as the file says")
    p.add_argument("--requests", type=int, default=None, metavar="N",
                   help="with --prompt-lens-from: the run of requests to charge each backend's first-met shapes "
                        f"over (default: {REQUESTS}); a request is one generate of --batch prompts of one length")
    p.add_argument("--new-tokens", type=_ints, default=None,
                   help=f"generate: exactly this many new tokens per prompt (default: {_GPU.new_tokens} on a GPU, "
                        f"{_CPU.new_tokens} on a CPU), or a list for a sweep")
    p.add_argument("--cache", choices=options.CACHES, default="dynamic",
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
                   help="comma-separated backends, policies per phase (prefill=cudnn/decode=flash) or backends per "
                        "layer kind (sliding_attention=flex/full_attention=cudnn), or 'all'")


def _profile_options(iters: int) -> Callable[[argparse.ArgumentParser], None]:
    def add(p: argparse.ArgumentParser) -> None:
        _model_options(p)
        p.add_argument("--warmup", type=int, default=None,
                       help=f"steps after the cold one and before timing (default: {Steps().resolved(False).warmup}; "
                            f"{Steps().resolved(True).warmup} for generate, whose cold workload meets every length)")
        p.add_argument("--iters", type=int, default=None,
                       help=f"timed steps per backend in the first rounds (default: {iters}; for generate, "
                            "each prompt once)")
        p.add_argument("--rounds", type=int, default=None,
                       help=f"interleaved rounds every backend is timed in (default: {min(iters, FIRST_ROUNDS)}; for "
                            "generate a round is one prompt: --iters times each, at least 6)")
        p.add_argument("--time-budget", type=float, default=None, metavar="S",
                       help="seconds of more rounds, after the first ones, for the backends still tied with the "
                            f"fastest; a round that would end past it is not started (default: as long as the first "
                            f"rounds took, at most {BUDGET_CAP_S:g}; 0: no more rounds)")
        p.add_argument("--out", default=None, help="write report.json/.csv/.md/.html and traces here")
        p.add_argument("--unfold", action="store_true", help="one row per layer instead of folding repeated layers, "
                                                             "printed (as --layers does) and in the files")
        p.add_argument("--layers", action="store_true", help="print the per-layer tables too")
        p.add_argument("--compile", default="none", metavar="MODES",
                       help="run every backend under torch.compile: none, default, reduce-overhead or max-autotune; "
                            "several joined by commas (default,none) put compiled and uncompiled side by side")
    return add


def _compare_options(p: argparse.ArgumentParser) -> None:
    _profile_options(ITERS)(p)
    p.add_argument("--no-numerics", action="store_true", help="skip the comparison with eager float32")


# -- shared steps ---------------------------------------------------------------------------------

def _check_options(args) -> Request:
    """Bad input found in the options alone, before torch is imported: one line, before any work. The
    rules are the library's (``Request.check``): the command line only words them with its flags."""
    request = _request(args).check(_registered())
    if request.mode is not None:
        _steps(request, request.generate)  # (--rounds against the command's own default of --iters)
    if getattr(args, "out", None) is not None:
        outfolder.check(args.out)
    return request


def _request(args) -> Request:
    """The options as the library's request."""
    steps = Steps(args.warmup, args.iters, args.rounds, args.time_budget) if hasattr(args, "iters") else Steps()
    return Request(
        kind=args.command, model=args.model, mode=args.mode, batch=tuple(args.batch or ()), seq=tuple(args.seq or ()),
        padding=args.padding, dtype=args.dtype, prompt_len=tuple(args.prompt_len or ()),
        prompt_lens=None if args.prompt_lens is None else tuple(args.prompt_lens),
        new_tokens=tuple(args.new_tokens or ()), cache=args.cache, lengths=args.prompt_lens_from,
        requests=DEFAULT if args.requests is None else args.requests, device=args.device, device_map=args.device_map,
        tp=args.tp, layers=args.num_layers, backends=args.backends, compile=getattr(args, "compile", None),
        steps=steps, numerics=not getattr(args, "no_numerics", False))


def _registered() -> list[str]:
    """Backends registered in this process (a program that registers its own kernel, then calls ``main``);
    none where the registry is not loaded yet (the built-ins' names are known without it)."""
    registry = sys.modules.get("attnswitch.backends.registry")
    return list(registry.REGISTRY) if registry is not None else []


class Shapes(list):
    """A sweep's ``(batch, length)`` shapes, and what else its sweep takes (``kw``: a generate's new tokens,
    cache and length mix)."""

    def __init__(self, shapes=(), kw: dict | None = None):
        super().__init__(shapes)
        self.kw = dict(kw or {})


def _setup(s: Session):
    """The model and its workload(s), from the request: one workload, or a sweep's shapes."""
    from .backends import parse_backends
    from .device import parse_device
    from .models import load_model
    from .workload import make_workload

    dev = parse_device(s.request.device)
    # refused before the model is loaded: what this device cannot offer (check answers why, for each)
    parse_backends(s.request.backends, dev, offered=s.request.kind != "check")
    r = s.request.resolved(dev.type)
    model, desc = load_model(r.model, dtype=r.dtype, device=dev, trust_remote_code=s.args.trust_remote_code,
                             layers=r.layers, device_map=r.device_map, tp=r.tp)
    if r.generate and r.lengths is not None:  # every length of the mix within the model's positions: now
        from .comparison import check_mix
        check_mix(model, "generate", r.lengths, r.requests, max(r.new_tokens))
    lengths = r.prompt_len if r.generate else r.seq
    if r.sweeps:
        kw = {"new_tokens": list(r.new_tokens), "cache": r.cache, "lengths": r.lengths,
              "requests": s.request.requests} if r.generate else {}
        shapes = Shapes(((b, n) for b in r.batch for n in lengths), kw)
        for b, n in shapes:  # each shape's inputs checked (and dropped) before the first is measured
            for new in (r.new_tokens if r.generate else (None,)):
                make_workload(model, batch=b, seq=n, mode=r.mode, padding=r.padding,
                              **({"new_tokens": new, "cache": r.cache} if r.generate else {}))
        return model, shapes, r.model, desc
    extra = {"new_tokens": r.new_tokens[0], "prompt_lens": r.prompt_lens, "cache": r.cache} if r.generate else {}
    work = make_workload(model, batch=r.batch[0], seq=lengths[0], padding=r.padding, mode=r.mode, **extra)
    return model, work, r.model, desc


def _command_line(s: Session) -> str:
    from . import dist

    command = "attnswitch " + " ".join(shlex.quote(a) for a in s.argv)
    w = dist.world()
    return f"torchrun --nproc-per-node {w[1]} -m {command}" if w is not None else command


def _write_outputs(report, d: Path, fold: bool = True) -> list[str]:
    """Every file of the report into the folder ``d`` (its traces are there already: they were written
    into ``d / "traces"`` as they were recorded), and the pick as ``policy.json`` where there is one; the
    names of what is there now. ``fold``: repeated layers as one row in the per-layer tables."""
    from .deploy import write_policy

    report.to_json(d / "report.json")
    report.to_csv(d / "report.csv")
    report.to_markdown(d / "report.md", fold=fold)
    report.write_html(d / "report.html", fold=fold)
    write_policy(report, d / "policy.json")  # the pick, to apply in a serving process (attnswitch.load_policy)
    if report.command:
        (d / "command.txt").write_text(report.command + "\n")
    order = ["report.json", "report.csv", "report.md", "report.html", "policy.json", "command.txt"]
    written = [n for n in order if (d / n).is_file()]
    traces = d / "traces"
    return written + (["traces/"] if traces.is_dir() and any(traces.iterdir()) else [])


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
        report.render(s.out, layers=s.args.layers or s.args.unfold, fold=not s.args.unfold)
        sys.stdout.flush()
    except BrokenPipeError:
        return False
    return True


# -- subcommands ----------------------------------------------------------------------------------

def _env(s: Session) -> int:
    import torch

    from ._versions import version_text
    from .backends import auto_choice
    from .device import default_device
    from .env import environment

    for k, v in environment().items():
        s.out.print(f"{k:>18}: {version_text(k, v)}")
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
    given = defects.asked(a.torch, a.cudnn, a.arch)
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
        model, work, spec, desc = _setup(s)
    n = len(work) if isinstance(work, list) else 0
    about = work.description if not isinstance(work, list) else f"a sweep of {counted(n, 'shape')}"
    s.err.print(f"{desc}; {about}", highlight=False)
    return model, work, spec


@contextlib.contextmanager
def _progress(console, since: int = 0):
    """A callback for each step of a measurement: a spinner on a terminal, else one line per step. A signal the
    command's handlers recorded (after the first ``since``) where Python could not raise it (a weakref
    callback) is raised at the next step: the run stops there, not at its end."""
    def said(step):
        swallowed = raised_signal(since)
        if swallowed is not None:
            raise swallowed
        return step

    if console.is_terminal:
        with console.status("") as status:
            yield lambda step: status.update(f"running {said(step)}")
    else:  # a log: each line with the seconds since the measurement began, so slow steps show
        t0 = time.perf_counter()
        yield lambda step: console.print(f"attnswitch: [{time.perf_counter() - t0:6.1f} s] {said(step)}",
                                         highlight=False, markup=False, soft_wrap=True)


def _check(s: Session) -> int:
    from .eligibility import check

    model, work, _ = _loaded(s)
    res = check(model, backends=None if means_all(s.args.backends) else s.args.backends, work=work)
    s.out.print(str(res), markup=False, highlight=False)
    return EXIT_OK if res.eligible else EXIT_NOTHING_RAN


def _steps(request: Request, generate: bool) -> dict:
    """The steps of the library's ``profile``, with the command's own default number of iterations."""
    steps = request.steps.resolved(generate, PROFILE_ITERS if request.kind == "profile" else ITERS)
    return {"warmup": steps.warmup, "iters": steps.iters, "rounds": steps.rounds, "time_budget_s": steps.time_budget_s}


def _measured(s: Session, run: Callable, sweep: Callable | None = None) -> int:
    from . import dist

    out = s.args.out
    # the report is written into a folder beside --out, which takes its place once every file is written; a
    # run that ends in anything but a report leaves --out as it was
    staging = outfolder.Staged(out, s.outcome.signals) if out and dist.is_main() else None
    s.outcome.staged = staging
    with staging or contextlib.nullcontext() as staged:
        trace_dir = staged / "traces" if staged is not None else (Path(out) / "traces" if out else None)
        report = _report(s, run, sweep, trace_dir)
        printed = _printed(s, report)
        t0, written = time.perf_counter(), []
        # nothing ran, the model made no attention call through the switch, or nothing to choose: no answer
        answer = report.decision.answer if report.decision is not None else \
            "no-attention" if report.no_attention else None  # (a profile: it answers nothing else)
        measured = report.ok and answer not in ("no-attention", "none")
        if staging is not None and measured:
            report.save_traces(trace_dir)  # any trace recorded elsewhere (where written here: nothing to do)
            written = _write_outputs(_moved(report, staged, Path(out)), staged, fold=not s.args.unfold)
        elif staging is not None:
            staging.discard()  # nothing ran, or nothing to answer: the folder keeps what it held
    if staging is not None:
        why = "no backend ran" if not report.ok else "no attention call" if answer == "no-attention" else "no answer"
        folder = str(Path(out)).rstrip("/")
        said = (f"wrote {folder}/{', '.join(written)} in {time.perf_counter() - t0:.1f} s" if written else
                f"{why}: {_left(out, s.outcome.kept)}")
        s.err.print(said, highlight=False, markup=False, soft_wrap=True)
    if not printed:
        return EXIT_BROKEN_PIPE
    return EXIT_OK if measured else EXIT_NOTHING_RAN


def _report(s: Session, run: Callable, sweep: Callable | None, trace_dir: Path | None):
    """The model loaded, measured, and the report with the command line and the command's own time. What
    the model or a kernel raises here is raised as it is (a failure to show whole); bad input found only now
    (positions of a loaded model, say) is an ``OptionError`` all the same."""

    t0 = time.perf_counter()
    importing = t0 - s.started if s.started else 0.0  # the subcommand's imports (torch, transformers)
    model, work, spec = _loaded(s)
    loading = time.perf_counter() - t0
    backends = None if means_all(s.args.backends) else s.args.backends
    with _progress(s.err, s.outcome.signals) as progress:
        kw = dict(backends=backends, trace_dir=trace_dir, progress=progress, model_name=spec, compile=s.args.compile,
                  command=_command_line(s), time_before={"imports": importing, "loading the model": loading},
                  **_steps(s.request, s.request.generate))
        return sweep(model, work, mode=s.args.mode, padding=s.args.padding, **work.kw, **kw) \
            if isinstance(work, Shapes) else run(model, work, **kw)


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
    "profile": Command("the per-layer profile of each backend", _profile_options(PROFILE_ITERS), _profile),
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


def _left(out: str, kept: bool) -> str:
    """What a run that ended without a report left in ``out``."""
    return f"kept the previous report in {out}" if kept else f"nothing written to {out}"


def _interrupted(e: KeyboardInterrupt, outcome: _Outcome) -> str:
    said = "terminated" if isinstance(e, Terminated) else "interrupted"
    if not outcome.folder:
        return said
    if outcome.staged is not None and outcome.staged.replaced:  # the signal came as the report took its place
        return f"{said}; wrote the report to {outcome.folder}"
    return f"{said}; {_left(outcome.folder, outcome.kept)}"


def _no_space(e: OSError, outcome: _Outcome) -> str:
    path, staged = Path(str(e.filename or "")), outcome.staged
    if staged is not None and staged.path is not None and path.is_relative_to(staged.path):
        path = Path(outcome.folder) / path.relative_to(staged.path)  # (where it was to be, not where it was staged)
    where = f" (writing {path})" if e.filename else ""
    left = f"; {_left(outcome.folder, outcome.kept)}" if outcome.folder else ""
    return f"no space left on device{where}{left}"


def _no_memory(e: BaseException, outcome: _Outcome, mode: str | None) -> str:
    first = str(e).splitlines()[0] if str(e) else type(e).__name__
    left = f"; {_left(outcome.folder, outcome.kept)}" if outcome.folder else ""
    smaller = "--batch, --prompt-len, --new-tokens" if mode == "generate" else "--batch, --seq"
    return f"out of memory: {first}; a smaller {smaller} or model may fit{left}"


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
    """Run the command ``argv`` (default: ``sys.argv[1:]``); returns its exit code. An interrupt anywhere in
    it is one line and ``EXIT_INTERRUPTED`` (``Terminated``: ``EXIT_TERMINATED``)."""
    started = time.perf_counter()
    outcome, said = _Outcome(), {}
    for name in ("stdout", "stderr"):
        if getattr(sys, name) is None:  # closed by the caller (``>&-``): what is written there goes nowhere
            setattr(sys, name, open(os.devnull, "w"))
    outcome.signals = signals_so_far()  # (an earlier run's, in this process, are not this one's)
    try:
        code = _main(list(sys.argv[1:] if argv is None else argv), started, outcome, said)
        swallowed = raised_signal(outcome.signals)
        if swallowed is not None:  # a signal a library on the way ignored: the command still ends as one
            raise swallowed
        return code
    except KeyboardInterrupt as e:
        _say(said.get("err"), _interrupted(e, outcome))
        return EXIT_TERMINATED if isinstance(e, Terminated) else EXIT_INTERRUPTED


def _main(argv: list[str], started: float, outcome: _Outcome, said: dict) -> int:
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as e:  # --help, --version, or an error argparse found (one line, already printed)
        return e.code if isinstance(e.code, int) else EXIT_BAD_INPUT
    outcome.folder = getattr(args, "out", None)
    outcome.kept = bool(outcome.folder) and outfolder.previous_report(outcome.folder)
    quiet = not _speaks()  # under torchrun only rank 0 speaks (and writes)
    piped = not sys.stdout.isatty()  # a log, a file: tables fit piped_width(), no line of prose is wrapped
    out = _console(width=piped_width() if piped else None, soft_wrap=piped, quiet=quiet)
    err = said["err"] = _console(stderr=True, soft_wrap=not sys.stderr.isatty(), quiet=quiet)
    try:
        cmd = COMMANDS[args.command]
        request = _check_options(args) if cmd.options is not None and cmd.model else None
        return cmd.run(Session(args, argv, out, err, started, request, outcome))
    except BrokenPipeError:  # printing the answer: its reader went away
        return EXIT_BROKEN_PIPE
    except options.OptionError as e:  # bad input, whenever it was found
        _error(err, e.worded(FLAGS))
        return EXIT_BAD_INPUT
    except OSError as e:
        if e.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        _error(err, _no_space(e, outcome))
        return EXIT_BAD_INPUT
    except Exception as e:  # an UnsupportedModel is bad input; anything else the model or a kernel raised is not
        from .errors import UnsupportedModel, out_of_memory

        swallowed = raised_signal(outcome.signals)
        if swallowed is not None:  # a signal a library turned into an error (an import's ImportError)
            raise swallowed() from e
        if isinstance(e, UnsupportedModel):
            _error(err, e)
            return EXIT_BAD_INPUT
        if isinstance(e, MemoryError) or out_of_memory(e):  # the model itself, outside any backend's row
            _error(err, _no_memory(e, outcome, getattr(args, "mode", None)))
            return EXIT_NOTHING_RAN
        raise
    finally:
        if getattr(args, "tp", False) and "torch" in sys.modules:
            from . import dist

            dist.destroy()


def _say(err, line: str) -> None:
    """One line on stderr: through the command's console where it has one yet."""
    if err is not None:
        err.print(line, highlight=False, markup=False, soft_wrap=True)
    elif _speaks():
        with contextlib.suppress(OSError):
            sys.stderr.write(line + "\n")


def run() -> None:
    """The ``attnswitch`` command itself (which ``__main__.main`` runs, for the console script and ``python
    -m attnswitch``): ``main`` in a process of its own, so process-wide choices are made for it here, not in
    ``main``:

    - SIGTERM (``timeout``, ``docker stop``) is handled as Ctrl-C is: one line, exit 143, ``--out`` as it
      was (unless the process was told to ignore it); an interrupt at any moment, from the first line on, is
      one line and exit 130;
    - inductor compiles in this process (``TORCHINDUCTOR_COMPILE_THREADS=1`` unless set): ``flex`` compiles a
      few kernels, and a pool of one worker per core costs more to start and to shut down than it saves
      (an H200 ``compare``: flex's first forward 7.0 s against 8.0 s, exit 2.0 s against 3.0 s);
    - once everything is written and flushed (Python's streams and C's), the process ends without tearing
      the interpreter down (``os._exit``): unloading torch's CUDA state takes seconds and there is nothing
      left to save. It exits normally where something may still save at exit: under ``torchrun`` (the
      process group is taken down first), and under a profiler, tracer or coverage tool.
    """
    with sigterm_as_interrupt():
        try:
            set_default("TORCHINDUCTOR_COMPILE_THREADS", "1")  # (attnswitch's own: not in Measured-with)
            code = main()
            try:
                sys.stdout.flush()
            except BrokenPipeError:  # the answer's reader went away before its last lines
                code = code or EXIT_BROKEN_PIPE
        except KeyboardInterrupt as e:  # before main began, or once it had ended
            _say(None, _interrupted(e, _Outcome()))
            code = EXIT_TERMINATED if isinstance(e, Terminated) else EXIT_INTERRUPTED
        try:
            _end(code)
        except KeyboardInterrupt:  # while ending: everything was said and written; only the ending is left
            os._exit(code)


def _end(code: int) -> None:
    """End the process with ``code``, quickly where nothing is left to save (``run``)."""
    if code == EXIT_BROKEN_PIPE:  # nothing more can reach the reader: what is left goes nowhere, silently
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    if "TORCHELASTIC_RUN_ID" in os.environ or "WORLD_SIZE" in os.environ or _observed():
        sys.exit(code)
    capture = sys.modules.get("attnswitch.profiling.capture")
    if capture is not None:  # the traces of a run without --out (os._exit runs no exit handler)
        capture.remove_temporary()
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
