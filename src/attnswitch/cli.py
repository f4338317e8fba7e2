"""The ``attnswitch`` command: one function per subcommand, in the table ``COMMANDS``.

Exit codes: 0 when every asked-for step ran (backends that cannot run are part of the answer);
1 when no backend could run at all, or the model failed while measuring (raised, with its traceback);
2 for bad input (unknown model, unreadable config, bad option), found before any measurement.
Heavy libraries (torch, transformers) are imported by the subcommands that need them, not for ``--help``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

__all__ = ["main", "run", "build_parser", "COMMANDS", "EXIT_OK", "EXIT_NOTHING_RAN", "EXIT_BAD_INPUT"]

EXIT_OK, EXIT_NOTHING_RAN, EXIT_BAD_INPUT = 0, 1, 2
_DEVICE_MAPS = ("auto", "balanced", "balanced_low_0", "sequential")  # accelerate's named maps


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
        raise argparse.ArgumentTypeError(f"expected positive integers, not {text!r}")
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
    p.add_argument("--prompt-len", type=int, default=None,
                   help="generate: prompts spread around this length (default: 512 on a GPU, 32 on a CPU)")
    p.add_argument("--prompt-lens", type=_ints, default=None, help="generate: these prompt lengths instead")
    p.add_argument("--new-tokens", type=int, default=None,
                   help="generate: exactly this many new tokens per prompt (default: 128 on a GPU, 8 on a CPU)")
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
                       help="steps after the cold one and before timing (default: 1)")
        p.add_argument("--iters", type=int, default=None,
                       help=f"timed steps per backend in the first rounds (default: {iters}; 2 whole workloads for "
                            "generate)")
        p.add_argument("--rounds", type=int, default=None,
                       help=f"interleaved rounds every backend is timed in (default: {min(iters, 6)}; 2 for generate)")
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
    """Bad input found in the options alone: one line, before any work."""
    if args.device_map is not None and args.device_map not in _DEVICE_MAPS:
        raise ValueError(f"--device-map {args.device_map}: use one of {', '.join(_DEVICE_MAPS)}")
    if (args.device_map or args.tp) and args.device is not None:
        raise ValueError("--device picks one device; --device-map and --tp place the model themselves")
    if args.device_map and args.tp:
        raise ValueError("--device-map and --tp exclude each other; choose one")
    if getattr(args, "num_layers", None) is not None and args.num_layers < 1:
        raise ValueError(f"--num-layers must be at least 1, got {args.num_layers}")
    if args.padding and args.mode == "generate":
        raise ValueError("--padding pads a prefill, decode or train batch; a generate's prompts are whole")
    if args.padding and args.batch and max(args.batch) < 2:
        raise ValueError("--padding needs a batch of 2 or more: the first row keeps every position, the others "
                         "are padded")
    if args.new_tokens is not None and args.new_tokens < 1:
        raise ValueError(f"--new-tokens must be at least 1, got {args.new_tokens}")
    if args.prompt_len is not None and args.prompt_len < 1:
        raise ValueError(f"--prompt-len must be positive, got {args.prompt_len}")
    sweep = len(args.seq or [1]) > 1 or len(args.batch or [1]) > 1
    if sweep and (args.mode not in ("prefill", "train") or getattr(args, "command", "") != "compare"):
        raise ValueError("a sweep (--seq or --batch lists) is a `compare` of prefill or train steps")
    if getattr(args, "iters", None) is not None and args.iters < 1:
        raise ValueError(f"--iters must be at least 1, got {args.iters}")
    if getattr(args, "rounds", None) is not None and args.rounds < 1:
        raise ValueError(f"--rounds must be at least 1, got {args.rounds}")
    if getattr(args, "time_budget", None) is not None and not args.time_budget >= 0:
        raise ValueError(f"--time-budget must be 0 or more seconds, got {args.time_budget}")
    if getattr(args, "warmup", None) is not None and args.warmup < 0:
        raise ValueError(f"--warmup must be 0 or more, got {args.warmup}")
    if getattr(args, "compile", None) is not None:
        from .compiling import parse_compile

        compiled = [m for m in parse_compile(args.compile) if m is not None]
        if compiled and (args.device_map or args.tp):
            raise ValueError("--compile runs one process's model on one device; not with --device-map or --tp")
    _check_out(getattr(args, "out", None))


def _check_out(out: str | None) -> None:
    """``--out`` must be a folder this process can write (made if missing)."""
    if not out:
        return
    d = Path(out)
    if d.exists() and not d.is_dir():
        raise ValueError(f"--out {out}: exists and is not a folder")
    made = [p for p in (d, *d.parents) if not p.exists()]  # deepest first: removed after the probe
    try:
        d.mkdir(parents=True, exist_ok=True)
        probe = d / ".attnswitch-write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        raise ValueError(f"--out {out}: cannot write there ({e.strerror or e})") from None
    finally:  # nothing left behind by a run that fails later: the outputs make the folder when written
        for p in made:
            with contextlib.suppress(OSError):
                p.rmdir()


def _setup(args):
    """The model and its workload(s), from the command line: one workload, or a sweep's shapes."""
    import torch

    from .backends import parse_backends
    from .device import parse_device
    from .models import default_preset, load_model, parse_dtype
    from .workload import make_workload

    _check_options(args)
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
    if len(batches) > 1 or len(seqs) > 1:
        shapes = [(b, s) for b in batches for s in seqs]
        for b, s in shapes:  # each shape's inputs checked (and dropped) before the first is measured
            make_workload(model, batch=b, seq=s, padding=args.padding, mode=args.mode)
        return model, shapes, spec, desc
    if args.mode == "generate":
        work = make_workload(model, batch=batches[0], seq=args.prompt_len or (512 if gpu else 32), mode="generate",
                             new_tokens=args.new_tokens or (128 if gpu else 8), prompt_lens=args.prompt_lens,
                             cache=args.cache)
    else:
        work = make_workload(model, batch=batches[0], seq=seqs[0], padding=args.padding, mode=args.mode)
    return model, work, spec, desc


def _command_line(s: Session) -> str:
    from . import dist

    command = "attnswitch " + " ".join(shlex.quote(a) for a in s.argv)
    w = dist.world()
    return f"torchrun --nproc-per-node {w[1]} -m {command}" if w is not None else command


def _write_outputs(report, out: str | None, console) -> None:
    if not out:
        return
    t0 = time.perf_counter()
    d = Path(out)
    d.mkdir(parents=True, exist_ok=True)
    report.to_json(d / "report.json")
    report.to_csv(d / "report.csv")
    report.to_markdown(d / "report.md")
    report.write_html(d / "report.html")
    report.save_traces(d / "traces")
    if report.command:
        (d / "command.txt").write_text(report.command + "\n")
    console.print(f"wrote {d}/report.json, report.csv, report.md, report.html, traces/ in "
                  f"{time.perf_counter() - t0:.1f} s")


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


def _presets(s: Session) -> int:
    from .models import PRESETS

    for p in PRESETS.values():
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
    generate = not isinstance(work, list) and work.mode == "generate"
    return {"warmup": args.warmup if args.warmup is not None else 1,
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
    import dataclasses

    from . import dist

    t0 = time.perf_counter()
    importing = t0 - s.started if s.started else 0.0  # the subcommand's imports (torch, transformers)
    model, work, spec = _loaded(s)
    loading = time.perf_counter() - t0
    trace_dir = Path(s.args.out) / "traces" if s.args.out else None
    backends = None if s.args.backends == "all" else s.args.backends
    with _progress(s.err) as progress, _not_bad_input():
        kw = dict(backends=backends, trace_dir=trace_dir, progress=progress, model_name=spec, compile=s.args.compile,
                  **_steps(s.args, work))
        report = sweep(model, work, mode=s.args.mode, padding=s.args.padding, **kw) if isinstance(work, list) \
            else run(model, work, **kw)
    spent = {"imports": round(importing, 3), "loading the model": round(loading, 3),
             **report.settings.get("time_s", {})}
    spent["total"] = round(spent.get("total", 0) + importing + loading, 3)
    report = dataclasses.replace(report, command=_command_line(s), settings={**report.settings, "time_s": spent})
    report.render(s.out, layers=s.args.layers, fold=not s.args.unfold)
    if dist.is_main():
        _write_outputs(report, s.args.out, s.err)
    return EXIT_OK if report.ok else EXIT_NOTHING_RAN


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


COMMANDS: dict[str, Command] = {
    "env": Command("GPU, driver, CUDA, cuDNN, torch, transformers; SDPA's auto pick", None, _env),
    "check": Command("which backends can run the inputs, and why not", _model_options, _check),
    "profile": Command("the per-layer profile of each backend", _profile_options(6), _profile),
    "compare": Command("every backend ranked, numerics checked, with a recommendation", _compare_options, _compare),
    "presets": Command("list the built-in model presets", None, _presets),
}


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("attnswitch")
    except PackageNotFoundError:  # pragma: no cover - run from a source tree
        return "unknown"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="attnswitch", description="Switch, profile and compare the attention "
                                     "implementation of transformers models.")
    parser.add_argument("--version", action="version", version=f"attnswitch {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, cmd in COMMANDS.items():
        p = sub.add_parser(name, help=cmd.help)
        if cmd.options:
            cmd.options(p)
    return parser


def prose_width(environ=None) -> int:
    """Where prose wraps on an output that is not a terminal (a log, a pipe): ``COLUMNS`` where set, else
    100 (tables keep their 120)."""
    value = (os.environ if environ is None else environ).get("COLUMNS", "")
    return int(value) if value.isdigit() and int(value) > 0 else 100


def _error(err, e: BaseException) -> None:
    from rich.text import Text

    # the message as text, never markup: it quotes user input ("[/x]", "runs/[exp1]/model")
    err.print(Text.assemble(("error:", "bold red"), " ", str(e)), highlight=False, soft_wrap=True)


def main(argv: list[str] | None = None) -> int:
    started = time.perf_counter()
    from rich.console import Console

    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    from . import dist

    quiet = not dist.is_main()  # under torchrun only rank 0 speaks (and writes)
    out = Console(width=None if sys.stdout.isatty() else prose_width(), quiet=quiet)
    err = Console(stderr=True, quiet=quiet)
    try:
        return COMMANDS[args.command].run(Session(args, argv, out, err, started))
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
        if getattr(args, "tp", False):
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
