"""The ``attnswitch`` command: env, check, profile, compare.

Exit codes: 0 when every asked-for step ran (backends that cannot run are part of the answer);
1 when no backend could run at all; 2 for bad input (unknown model, unreadable config, bad option).
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

import torch

from . import __version__

EXIT_OK, EXIT_NOTHING_RAN, EXIT_BAD_INPUT = 0, 1, 2


def _common(p: argparse.ArgumentParser, backends: bool = True) -> None:
    p.add_argument("model", nargs="?", default=None,
                   help="a preset, a local folder, a config.json or a hub id (default: a preset sized for the device)")
    p.add_argument("--batch", type=int, default=None, help="batch size (default: 4 on a GPU, 2 on a CPU)")
    p.add_argument("--seq", type=int, default=None, help="sequence length (default: 2048 on a GPU, 128 on a CPU)")
    p.add_argument("--dtype", default=None, help="fp32, fp16 or bf16 (default: bf16 on a GPU, fp32 on a CPU)")
    p.add_argument("--padding", action="store_true", help="a padded batch (left padding for decoders)")
    p.add_argument("--mode", choices=["prefill", "decode"], default="prefill",
                   help="prefill: the whole sequence; decode: one new token against a KV cache of --seq")
    p.add_argument("--device", default=None, help="cuda, cuda:N or cpu (default: cuda when available)")
    p.add_argument("--layers", type=int, default=None, help="truncate the model to this many layers")
    p.add_argument("--trust-remote-code", action="store_true", help="allow a local model's own code to run")
    p.add_argument("--device-map", default=None, metavar="MAP",
                   help="spread the model over the GPUs with accelerate: auto, balanced, balanced_low_0 or sequential")
    p.add_argument("--tp", action="store_true",
                   help="tensor parallelism over the ranks of torchrun (tp_plan='auto'): "
                        "torchrun --nproc-per-node N -m attnswitch compare MODEL --tp")
    if backends:
        p.add_argument("--backends", default="all", help="comma-separated backends, or 'all'")


def _profile_opts(p: argparse.ArgumentParser, iters: int) -> None:
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--iters", type=int, default=iters)
    p.add_argument("--out", default=None, help="write report.json/.csv/.md/.html and traces here")
    p.add_argument("--unfold", action="store_true", help="one row per layer instead of folding repeated layers")
    p.add_argument("--no-layers", action="store_true", help="print only the per-backend table")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="attnswitch", description="Switch, profile and compare the attention "
                                     "implementation of transformers models.")
    parser.add_argument("--version", action="version", version=f"attnswitch {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("env", help="GPU, driver, CUDA, cuDNN, torch, transformers; SDPA's auto pick")
    p = sub.add_parser("check", help="which backends can run the inputs, and why not")
    _common(p)
    p = sub.add_parser("profile", help="the per-layer profile of each backend")
    _common(p)
    _profile_opts(p, iters=5)
    p = sub.add_parser("compare", help="every backend ranked, numerics checked, with a recommendation")
    _common(p)
    _profile_opts(p, iters=10)
    p.add_argument("--no-numerics", action="store_true", help="skip the comparison with eager float32")
    sub.add_parser("presets", help="list the built-in model presets")
    return parser


def _device(arg: str | None) -> torch.device:
    if arg is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(arg)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {arg}: no CUDA device is available here")
    return dev


def _setup(args):
    from .models import DEVICE_MAPS, default_preset, load_model, make_workload, parse_dtype

    if args.device_map is not None and args.device_map not in DEVICE_MAPS:
        raise ValueError(f"--device-map {args.device_map}: use one of {', '.join(DEVICE_MAPS)}")
    if (args.device_map or args.tp) and args.device is not None:
        raise ValueError("--device picks one device; --device-map and --tp place the model themselves")
    if args.device_map and args.tp:
        raise ValueError("--device-map and --tp exclude each other; choose one")
    dev = _device(args.device)
    gpu = dev.type == "cuda"
    dtype = parse_dtype(args.dtype or ("bf16" if gpu else "fp32"))
    if gpu and dtype == torch.bfloat16 and not torch.cuda.is_bf16_supported():
        raise ValueError(f"--dtype bf16: {torch.cuda.get_device_name(dev)} cannot run bfloat16")
    spec = args.model or default_preset(dev)
    model, desc = load_model(spec, dtype=dtype, device=dev, trust_remote_code=args.trust_remote_code,
                             layers=args.layers, device_map=args.device_map, tp=args.tp)
    batch = args.batch if args.batch is not None else (4 if gpu else 2)
    seq = args.seq if args.seq is not None else (2048 if gpu else 128)
    work = make_workload(model, batch=batch, seq=seq, padding=args.padding, mode=args.mode)
    return model, work, spec, desc


def _progress_console():
    from rich.console import Console

    return Console(stderr=True)


def _write_outputs(report, out: str | None, console) -> None:
    if not out:
        return
    from .plots import write_html

    d = Path(out)
    d.mkdir(parents=True, exist_ok=True)
    report.to_json(d / "report.json")
    report.to_csv(d / "report.csv")
    report.to_markdown(d / "report.md")
    write_html(report, d / "report.html")
    report.save_traces(d / "traces")
    if report.command:
        (d / "command.txt").write_text(report.command + "\n")
    console.print(f"wrote {d}/report.json, report.csv, report.md, report.html, traces/")


def _is_main_rank(args) -> bool:
    import os

    return not getattr(args, "tp", False) or int(os.environ.get("RANK", "0")) == 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    err = _progress_console()
    err.quiet = not _is_main_rank(args)  # under torchrun only rank 0 speaks (and writes)
    try:
        return _run(args, argv, err)
    except (ValueError, FileNotFoundError, TypeError) as e:
        err.print(f"[bold red]error:[/bold red] {e}", markup=True, highlight=False)
        return EXIT_BAD_INPUT
    except Exception as e:  # an UnsupportedModel, or anything the model raised
        from .errors import UnsupportedModel

        if isinstance(e, UnsupportedModel):
            err.print(f"[bold red]error:[/bold red] {e}", highlight=False)
            return EXIT_BAD_INPUT
        raise
    finally:
        if getattr(args, "tp", False):
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()


def _run(args, argv, err) -> int:
    from rich.console import Console

    out = Console(width=None if sys.stdout.isatty() else 200, quiet=not _is_main_rank(args))
    if args.command == "env":
        from .env import auto_choice, environment

        env = environment()
        for k, v in env.items():
            out.print(f"{k:>18}: {v}")
        dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
        out.print(f"{'sdpa auto picks':>18}: {auto_choice(dev, dtype)} (B1 H16 S1024 D64 "
                  f"{str(dtype).replace('torch.', '')}, causal)")
        return EXIT_OK
    if args.command == "presets":
        from .models import PRESETS

        for p in PRESETS.values():
            out.print(f"{p.name:>14}  {p.about}")
        return EXIT_OK
    with err.status("loading model"):
        model, work, spec, desc = _setup(args)
    err.print(f"{desc}; {work.description}", highlight=False)
    if args.command == "check":
        from .check import check
        from .profiling import default_backends

        names = default_backends(work.model.device if hasattr(work.model, "device") else "cpu") \
            if args.backends == "all" else args.backends.split(",")
        res = check(model, backends=names, **work.first())
        out.print(str(res), markup=False, highlight=False)
        return EXIT_OK if res.eligible else EXIT_NOTHING_RAN
    command = "attnswitch " + " ".join(shlex.quote(a) for a in argv)
    if args.tp:
        import torch.distributed as dist

        command = f"torchrun --nproc-per-node {dist.get_world_size()} -m {command}"
    backends = None if args.backends == "all" else args.backends
    trace_dir = Path(args.out) / "traces" if args.out else None
    with err.status("") as status:
        def progress(name):
            status.update(f"running {name}")

        if args.command == "profile":
            from .profiling import profile

            report = profile(model, work, backends=backends, warmup=args.warmup, iters=args.iters,
                             trace_dir=trace_dir, progress=progress, model_name=spec)
            import dataclasses

            report = dataclasses.replace(report, command=command)
        else:
            from .compare import compare

            report = compare(model, work, backends=backends, warmup=args.warmup, iters=args.iters,
                             trace_dir=trace_dir, progress=progress, model_name=spec,
                             check_numerics=not args.no_numerics, command=command)
    report.render(out, layers=not args.no_layers, fold=not args.unfold)
    if _is_main_rank(args):
        _write_outputs(report, args.out, err)
    return EXIT_OK if report.ok else EXIT_NOTHING_RAN


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
