"""Does ``compare`` report the step a user's own loop takes? Every backend's ranked step against a plain loop of
steps under ``attnswitch.backend(...)``, on the same model and inputs, in the same process.

    python -m benchmarks.user_loop OUT --only=device-bound       # a GPU: one shape x prefill, decode, train
    python -m benchmarks.user_loop OUT --only=host-bound,gemma3  # the two others (each call within 10 min)
    python -m benchmarks.user_loop OUT --smoke    # a CPU: tiny models, the same logic, no verdict on the numbers
    python -m benchmarks.user_loop OUT --only=host-bound/train,gemma3   # some of the checks

For each shape and workload: ``compare`` of every backend (its defaults, numerics left out: they run no
timed step, and their float32 copy of the model costs minutes here), and a user's loop of every backend
(``user_loop``) right before compare's timing rounds and right after them, since the host's speed drifts
within a minute. A row per backend the compare ranked: ``compare_ms`` (its reported step), ``loop_ms`` (the
mean of the loop's medians before and after) and their ``ratio``. The shapes (``SHAPES``): a Qwen3-shaped
model (6 layers, hidden 2048, 16 query and 8 key-value heads of 128) at sizes where the GPU sets the step
(``device-bound``) and where the host nearly or wholly does (``host-bound``: B2 S2048 training, a step the
compare once reported 8-13 % slower than a user's loop, and B1 prefill and decode), and a Gemma-3-shaped one
(head dim 256, one key-value head, five sliding-window layers to one full). Each check has a time bound
(``Shape.bound_s``) and the whole run one too (``TOTAL_S``): a check that would not end within it is not
started, and one that runs past its bound is stopped and recorded as failed.

Writes ``OUT/user_loop_check.json`` (the rows) and ``OUT/user_loop_run.json`` (environment, each check's status,
seconds, the compare's settings and every loop's medians); exits 1 where a check failed or, off ``--smoke``,
where any ratio leaves ``LOW``-``HIGH``.
"""

from __future__ import annotations

import contextlib
import gc
import json
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

import attnswitch
from attnswitch.comparison import compare
from attnswitch.device import device_of
from attnswitch.env import environment
from attnswitch.stats import median
from attnswitch.workload import make_workload

__all__ = ["Shape", "SHAPES", "SMOKE", "user_loop", "check", "run", "main", "folder_main", "bounded", "OverTime",
           "LOW", "HIGH", "TOTAL_S", "TIMING_LINE"]

#: the band every ratio must fall in
LOW, HIGH = 0.97, 1.03
#: the whole run's time bound (s): a check that would not end within it is not started
TOTAL_S = 520.0
#: steps per block of the user's loop (after one untimed step)
STEPS = 5
WORKLOADS = ("prefill", "decode", "train")
GPU_BACKENDS = ["flash", "cudnn", "efficient", "math", "naive-inplace", "auto"]
CPU_BACKENDS = ["math", "naive-inplace"]


@dataclass(frozen=True)
class Shape:
    """A model and, per workload, its ``(batch, seq)`` (decode: the cache's length); ``repeats``: blocks per
    backend in each of the loops before and after the compare; ``bound_s``: each of its checks' time bound."""

    name: str
    model: str
    sizes: dict[str, tuple[int, int]] = field(default_factory=dict)
    repeats: int = 3
    bound_s: float = 60.0


# bounds: a compare of six backends (up to 30 s of more rounds for those still tied) and two loops; a host-bound
# training check once ran past 50 s on an H200
SHAPES = (
    Shape("device-bound", "qwen3", {"prefill": (8, 4096), "decode": (32, 8192), "train": (4, 4096)}, 2, 150.0),
    Shape("host-bound", "qwen3", {"prefill": (1, 1024), "decode": (1, 1024), "train": (2, 2048)}, 5, 80.0),
    Shape("gemma3", "gemma3", {"prefill": (4, 2048), "decode": (8, 2048), "train": (2, 2048)}, 4, 80.0),
)
SMOKE = tuple(Shape(s.name, s.model, {"prefill": (2, 16), "decode": (1, 16), "train": (2, 16)}, 1, 60.0)
              for s in SHAPES)


def _model(kind: str, tiny: bool, device: str, dtype: torch.dtype) -> torch.nn.Module:
    """A random-weight model of ``kind`` (``qwen3``, ``gemma3``), full size or tiny (the smoke run's)."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig, Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    if kind == "qwen3":
        size = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=16) if tiny else \
            dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=6, num_attention_heads=16,
                 num_key_value_heads=8, head_dim=128)
        model = Qwen3ForCausalLM(Qwen3Config(vocab_size=32000 if not tiny else 211, max_position_embeddings=16384,
                                             **size))
    else:
        size = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=1, head_dim=32, sliding_window=8,
                    layer_types=["sliding_attention", "full_attention"]) if tiny else \
            dict(hidden_size=1152, intermediate_size=6912, num_hidden_layers=6, num_attention_heads=4,
                 num_key_value_heads=1, head_dim=256, sliding_window=512,
                 layer_types=["sliding_attention"] * 5 + ["full_attention"])
        model = Gemma3ForCausalLM(Gemma3TextConfig(vocab_size=32000 if not tiny else 211,
                                                   max_position_embeddings=16384, **size))
    return model.to(device, dtype).eval()


@contextlib.contextmanager
def _grad_mode(model: torch.nn.Module, mode: str):
    """What a user's loop holds around its steps: training mode and gradients for training, no gradients else."""
    if mode != "train":
        with torch.no_grad():
            yield
        return
    model.train()
    try:
        yield
    finally:
        model.eval()


def _step(model: torch.nn.Module, mode: str):
    if mode == "train":
        def train(kw):
            loss = model(**kw).loss
            loss.backward()
            model.zero_grad(set_to_none=True)
        return train
    return lambda kw: model(**kw)


def user_loop(work, names: list[str], repeats: int, steps: int = STEPS) -> dict[str, list[float]]:
    """A user's loop per backend, outside attnswitch's measurement: ``attnswitch.backend(name, model=...)``
    entered once around one untimed step and ``steps`` steps back to back, their inputs made first (a decode
    step's copy of its cache each: a forward appends to it); CUDA events before the first timed step and after
    the last, the device synchronized once, at the end (the wall clock on a CPU); ms per step. The backends in
    turn, ``repeats`` times; garbage collected before each turn and not inside it, as ``timeit`` does (this
    process holds compare's parsed traces: a collection in a step would time them). A backend that cannot run
    here is left out (its error recorded as its value)."""
    model = work.model
    cuda = device_of(model).type == "cuda"
    step = _step(model, work.mode)
    out: dict[str, list] = {n: [] for n in names}
    with _grad_mode(model, work.mode):
        for _ in range(repeats):
            for name in [n for n in names if isinstance(out[n], list)]:
                args = list(work.calls(steps + 1))
                gc.collect()
                gc.disable()
                try:
                    with attnswitch.backend(name, model=model):
                        step(args[0])
                        out[name].append(_block(step, args[1:], cuda))
                except Exception as e:  # (a backend that cannot run these inputs: compare says why)
                    out[name] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                finally:
                    gc.enable()
                    del args
    return out


def _block(step, args: list, cuda: bool) -> float:
    """``step`` on each of ``args`` back to back: ms per step."""
    if cuda:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for a in args:
            step(a)
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / len(args)
    t0 = time.perf_counter()
    for a in args:
        step(a)
    return (time.perf_counter() - t0) * 1e3 / len(args)


class OverTime(BaseException):
    """A check ran past its time bound (a ``BaseException``: no handler of a backend's errors takes it)."""


@contextlib.contextmanager
def bounded(seconds: float):
    """``OverTime`` raised in the block once it has run ``seconds`` (SIGALRM; attnswitch's switch completes any
    change of its state that the exception interrupts)."""
    def over(signum, frame):
        raise OverTime(f"over its time bound of {seconds:.0f} s")

    previous = signal.signal(signal.SIGALRM, over)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


#: how ``compare`` (``profile``) says its timing rounds start
TIMING_LINE = "timing ("


def check(model, shape: Shape, mode: str, names: list[str]) -> dict:
    """One shape and workload: ``compare``, with the user's loop run right before its timing rounds (from its
    progress line that says they start: every backend is prepared and warm at this shape by then, and the
    host's speed drifts by tens of percent within a minute on a shared machine) and right after it; its rows."""
    batch, seq = shape.sizes[mode]
    work = make_workload(model, batch=batch, seq=seq, mode=mode)
    before: dict = {}

    def heard(line: str) -> None:
        if line.startswith(TIMING_LINE) and not before:
            before.update(user_loop(work, names, shape.repeats))

    report = compare(model, work, backends=names, check_numerics=False, progress=heard,
                     model_name=f"{shape.model} ({shape.name})")
    if not before:
        raise RuntimeError(f"compare never said {TIMING_LINE!r}...: no loop ran before its timing rounds")
    after = user_loop(work, [n for n in names if isinstance(before[n], list)], shape.repeats)
    rows, loops = [], {}
    for b in report.backends:
        loop = [median(v) for v in (before.get(b.backend), after.get(b.backend)) if isinstance(v, list) and v]
        loops[b.backend] = {"before": before.get(b.backend), "after": after.get(b.backend)}
        if not b.ok or b.time_ms is None or len(loop) < 2:
            continue
        loop_ms = sum(loop) / 2
        rows.append({"backend": b.backend, "shape": shape.name, "workload": mode, "compare_ms": round(b.time_ms, 4),
                     "loop_ms": round(loop_ms, 4), "ratio": round(b.time_ms / loop_ms, 4),
                     "loop_before_ms": round(loop[0], 4), "loop_after_ms": round(loop[1], 4),
                     "batch": batch, "seq": seq})
    left_out = {b.backend: (b.status, b.reasons[:1]) for b in report.backends if not b.ok}
    return {"rows": rows, "loops": loops, "left_out": left_out, "workload": report.workload,
            "host": report.settings.get("host"), "time_s": report.settings.get("time_s")}


def _wanted(only: str | None, shapes) -> list[tuple[Shape, str]]:
    todo = [(s, m) for s in shapes for m in WORKLOADS]
    if not only:
        return todo
    keys = only.split(",")
    return [(s, m) for s, m in todo if s.name in keys or f"{s.name}/{m}" in keys or m in keys]


def run(out: Path, smoke: bool = False, only: str | None = None, total_s: float = TOTAL_S) -> int:
    """Every check wanted, in turn, within the run's time bound; the files written after each; the exit code."""
    out.mkdir(parents=True, exist_ok=True)
    cuda = torch.cuda.is_available() and not smoke
    device, dtype = ("cuda", torch.bfloat16) if cuda else ("cpu", torch.float32)
    names = GPU_BACKENDS if cuda else CPU_BACKENDS
    t_start, rows, checks, models = time.perf_counter(), [], [], {}
    meta = {"environment": environment(), "smoke": smoke, "band": [LOW, HIGH], "steps_per_block": STEPS,
            "checks": checks}
    for shape, mode in _wanted(only, SMOKE if smoke else SHAPES):
        key, left = f"{shape.name}/{mode}", total_s - (time.perf_counter() - t_start)
        if left < shape.bound_s:
            checks.append({"check": key, "status": "not run", "why": f"{left:.0f} s of the run's bound left"})
            continue
        t0 = time.perf_counter()
        try:
            with bounded(shape.bound_s):
                if shape.model not in models:
                    models.clear()  # one model held at a time
                    models[shape.model] = _model(shape.model, smoke, device, dtype)
                done = check(models[shape.model], shape, mode, names)
            rows += done.pop("rows")
            checks.append({"check": key, "status": "ok", **done})
        except (OverTime, Exception) as e:
            checks.append({"check": key, "status": "failed", "error": f"{type(e).__name__}: {e}"})
        finally:
            if cuda:
                torch.cuda.synchronize()
                torch.cuda.empty_cache()
        checks[-1]["seconds"] = round(time.perf_counter() - t0, 1)
        print(f"{key}: {checks[-1]['status']} in {checks[-1]['seconds']} s " +
              " ".join(f"{r['backend']} {r['ratio']:.3f}" for r in rows if f"{r['shape']}/{r['workload']}" == key),
              flush=True)
        _write(out, rows, meta)
    outside = [r for r in rows if not LOW <= r["ratio"] <= HIGH]
    failed = [c["check"] for c in checks if c["status"] != "ok"]
    meta.update(seconds=round(time.perf_counter() - t_start, 1), outside_band=outside, failed_checks=failed,
                status="failed" if failed or (outside and not smoke) else "ok")
    _write(out, rows, meta)
    print(f"user loop check: {meta['status']}, {len(rows)} rows, {len(outside)} outside {LOW}-{HIGH}, "
          f"{len(failed)} checks not ok, {meta['seconds']} s", flush=True)
    return 0 if meta["status"] == "ok" else 1


def _write(out: Path, rows: list, meta: dict) -> None:
    (out / "user_loop_check.json").write_text(json.dumps(rows, indent=1))
    (out / "user_loop_run.json").write_text(json.dumps(meta, indent=1, default=str))


def folder_main(argv, doc: str, run_in) -> int:
    """A check's command line: ``OUT [--smoke] [--only=a,b]`` to ``run_in(Path(OUT), smoke=, only=)``; its
    ``doc`` and exit 2 without a folder."""
    args = list(sys.argv[1:] if argv is None else argv)
    only = next((a.split("=", 1)[1] for a in args if a.startswith("--only=")), None)
    folder = next((a for a in args if not a.startswith("--")), None)
    if folder is None:
        print(doc, file=sys.stderr)
        return 2
    return run_in(Path(folder), smoke="--smoke" in args, only=only)


def main(argv=None) -> int:
    return folder_main(argv, __doc__, run)


if __name__ == "__main__":
    sys.exit(main())
