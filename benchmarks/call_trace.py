"""Which ops one model step runs per attention call under each backend, and which op issues each memcpy.

The per-layer profile counts memcpys and host time per attention call; this names their source. A Gemma-3
shape (sliding and full layers, 4 q heads to 1 k/v head, head dim 256) steps once, prefill of ``--seq`` tokens
or one decode token against a cache of them, under ``attnswitch.backend(name, model=m)`` and under the model's
own ``sdpa``, profiled: for each backend, the ops under the attention modules with their counts per call and
host µs, and each memcpy or memset with the chain of ops that issued it.

    python -m benchmarks.call_trace OUT [--mode=decode] [--seq=8192] [--backends=cudnn,efficient,flash,auto]

``--tiny``: a two-layer model on whatever device there is (the CPU smoke run). Writes ``call_trace.json``.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections import Counter
from pathlib import Path

import torch

import attnswitch
from attnswitch.env import environment
from benchmarks.user_loop import model_of

__all__ = ["main", "trace"]

USAGE = __doc__.split("\n\n")[2]


def _chain(evt) -> list[str]:
    out, p = [], evt.cpu_parent
    while p is not None:
        out.append(p.name)
        p = p.cpu_parent
    return out


def _step(model, mode: str, seq: int):
    """A zero-argument step: the prefill of ``seq`` tokens, or one decode token against their cache (a fresh
    copy of it made before each step, as the compare's timed steps have it)."""
    from attnswitch.workload import make_workload

    work = make_workload(model, batch=1, seq=seq, mode=mode)
    args = list(work.calls(4))
    return lambda: work.step(args.pop())


@contextlib.contextmanager
def _marked(model):
    """Each attention module's forward as a profiler range named ``attention``, so its ops are found."""
    from torch.autograd.profiler import record_function

    open_ = []
    hooks = []
    for m in model.modules():
        if type(m).__name__.endswith("Attention"):
            hooks.append(m.register_forward_pre_hook(lambda *_: open_.append(record_function("attention").__enter__())))
            hooks.append(m.register_forward_hook(lambda *_: open_.pop().__exit__(None, None, None)))
    try:
        yield
    finally:
        for h in hooks:
            h.remove()


def trace(model, name: str, mode: str, seq: int, device: str) -> dict:
    """The ops of one step under ``name`` (``auto``: the model's own sdpa, unswitched)."""
    from torch.profiler import ProfilerActivity, profile

    step = _step(model, mode, seq)
    calls = model.config.num_hidden_layers
    ctx = attnswitch.backend(name, model=model) if name != "auto" else contextlib.nullcontext()
    with ctx:
        for _ in range(3):
            step()
        if device == "cuda":
            torch.cuda.synchronize()
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
        with _marked(model), profile(activities=acts) as prof:
            step()
            if device == "cuda":
                torch.cuda.synchronize()
    events = prof.events()
    under = [e for e in events if e.device_type.name == "CPU" and "attention" in _chain(e)]
    ops = Counter(e.name for e in under if e.name.startswith("aten::"))
    top = Counter(e.name for e in under if e.cpu_parent is not None and e.cpu_parent.name == "attention")
    host = {}
    for e in under:
        if e.name.startswith("aten::"):
            host[e.name] = host.get(e.name, 0.0) + e.self_cpu_time_total
    copies = [e for e in events if e.device_type.name == "CPU" and ("Memcpy" in e.name or "Memset" in e.name)
              and "attention" in _chain(e)]  # (issued under an attention module: not the embedding's or cache's)
    return {
        "backend": name,
        "top_ops_per_call": {k: round(v / calls, 2) for k, v in top.most_common()},
        "ops_per_call": {k: round(v / calls, 2) for k, v in ops.most_common()},
        "self_host_us_per_call": {k: round(v / calls, 1) for k, v in sorted(host.items(), key=lambda x: -x[1])[:15]},
        "memcpy_per_call": round(len(copies) / calls, 2),
        "memcpy_sources": Counter(" <- ".join([c.name] + _chain(c)[:4]) for c in copies).most_common(10),
    }


def main(argv: list[str]) -> int:
    opts = dict(a[2:].split("=", 1) for a in argv if a.startswith("--") and "=" in a)
    flags = {a for a in argv if a.startswith("--") and "=" not in a}
    folders = [a for a in argv if not a.startswith("--")]
    unknown = (set(opts) - {"mode", "seq", "backends"}) | (flags - {"--tiny"})
    if len(folders) != 1 or unknown or opts.get("mode", "decode") not in ("prefill", "decode") or \
            not opts.get("seq", "1").isdigit() or int(opts.get("seq", "1")) < 1:
        print(USAGE, file=sys.stderr)
        return 2
    tiny = "--tiny" in flags
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    mode, seq = opts.get("mode", "decode"), int(opts.get("seq", 16 if tiny else 8192))
    names = opts.get("backends", "cudnn,efficient,flash,auto" if device == "cuda" else "flash,math,auto").split(",")
    model = model_of("gemma3", tiny, device, dtype)  # (the user-loop check's Gemma-3 shape)
    rows = []
    for name in names:
        try:
            rows.append(trace(model, name, mode, seq, device))
        except Exception as e:  # (a backend refused here is a row saying why)
            rows.append({"backend": name, "error": f"{type(e).__name__}: {str(e)[:300]}"})
        r = rows[-1]
        print(f"{name}: " + (r.get("error") or f"{r['memcpy_per_call']} memcpy/call; "
                             f"top-level ops/call {r['top_ops_per_call']}; "
                             f"memcpy from {r['memcpy_sources'][:3]}"), flush=True)
    out = Path(folders[0])
    out.mkdir(parents=True, exist_ok=True)
    env = environment()
    (out / "call_trace.json").write_text(json.dumps({"environment": env, "mode": mode, "seq": seq, "rows": rows},
                                                     indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
