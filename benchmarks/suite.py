"""attnswitch's own numbers: the post's experiment, the ceiling, the switch's overhead, profiler fidelity,
FlexAttention against the fused SDPA kernels.

``python -m benchmarks [--out DIR] [--only NAME,...] [--quick]`` runs every part on the device it finds
(CUDA when available) and writes one JSON per part under ``--out`` (default ``$OUT`` or
``benchmarks/results/latest``). Each file records the GPU, driver, CUDA, cuDNN, torch and
transformers versions and the exact command. Ratios are measured side by side in one run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from pathlib import Path

import torch

import attnswitch
from attnswitch.env import environment
from attnswitch.stats import median as _median
from attnswitch.stats import noise_pct as _iqr_half_pct

BACKENDS6 = ["naive", "naive-inplace", "math", "efficient", "flash", "cudnn"]

# The A100 figures of the Hugging Face post "Profiling in PyTorch (Part 3): Attention is all you profile"
# (B8 H16 S1024 D64 bf16 causal); math was reported as about 3.7x naive's time.
POST_A100 = {
    "naive-inplace": {"gpu_us": 1955.0},
    "math": {"gpu_us": 1955.0 * 3.7, "approximate": True},
    "efficient": {"gpu_us": 277.9},
    "flash": {"gpu_us": 146.8},
    "cudnn": {"gpu_us": 186.3, "host_us": 214.0},
}


def _sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def time_gpu(fn, n=100, warmup=10, rotate=None):
    """Median CUDA-event time (ms) of ``fn`` per call, each call timed on its own, back to back."""
    for _ in range(warmup):
        fn()
    _sync()
    evs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]
    for a, b in evs:
        a.record()
        fn()
        b.record()
    _sync()
    return [a.elapsed_time(b) for a, b in evs]


def time_graph(fn, n=50, warmup=5):
    """Median CUDA-event time (ms) of one ``fn`` call replayed from a CUDA graph: the kernels' own
    time, without the host's launch cost (which dominates single fused calls). None if ``fn`` cannot
    be captured."""
    for _ in range(warmup):
        fn()
    _sync()
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    try:
        with torch.cuda.stream(s):
            fn()
            s.synchronize()
            with torch.cuda.graph(g, stream=s):
                fn()
    except RuntimeError:
        return None
    torch.cuda.current_stream().wait_stream(s)
    _sync()
    out = []
    for _ in range(n):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        _sync()
        out.append(a.elapsed_time(b))
    return out


def time_host(fn, n=100, warmup=10, sync_each=True):
    """Median host time (µs) for ``fn`` to return, the device idle before each call."""
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(n):
        if sync_each:
            _sync()
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e6)
    _sync()
    return out


# ---------------------------------------------------------------------------------------------
def ceilings(quick=False):
    """Measured bf16 matrix rate and device-to-device copy bandwidth (random data)."""
    n = 4096 if quick else 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    ms = _median(time_gpu(lambda: a @ b, n=10, warmup=3))
    x = torch.randn(2**30 // 2, device="cuda", dtype=torch.bfloat16)  # 1 GiB
    y = torch.empty_like(x)
    cms = _median(time_gpu(lambda: y.copy_(x), n=10, warmup=3))
    return {"bf16_matmul_tflops": 2 * n**3 / ms / 1e9, "matmul_n": n,
            "copy_tb_per_s": 2 * x.numel() * 2 / cms / 1e9}


def attention_call(batch, heads, seq, dim, *, causal=True, n=100, backends=BACKENDS6, matmul_tflops=None):
    """One bare attention call per backend: GPU time, host time, kernels, memcpys, memsets,
    occupancy, TFLOP/s."""
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(batch, heads, seq, dim, device="cuda", dtype=torch.bfloat16, generator=g)
               for _ in range(3))
    flops = 4 * batch * heads * seq * seq * dim * (0.5 if causal else 1.0)
    ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal)
    rows = {}
    rep = attnswitch.profile(lambda: attnswitch.attention(q, k, v, is_causal=causal), backends=backends,
                             warmup=3, iters=5)
    for b in rep.backends:
        row = {"status": b.status, "reasons": list(b.reasons)}
        if b.ok:
            fn = lambda name=b.backend: attnswitch.attention(q, k, v, is_causal=causal, backend=name)  # noqa: E731
            gpu = time_gpu(fn, n=n)
            graph = time_graph(fn)
            host = time_host(fn, n=n)
            out = fn().float()
            kernel_ms = _median(graph) if graph else _median(gpu)
            row.update(
                gpu_us=kernel_ms * 1e3, gpu_timer="cuda-graph replay" if graph else "cuda-events",
                gpu_noise_pct=_iqr_half_pct(graph or gpu), events_us=_median(gpu) * 1e3, host_us=_median(host),
                profiled_kernel_us=b.attn_gpu_us_per_call, kernels=b.attn_kernels_per_call,
                memcpys=b.attn_memcpys_per_call,
                memsets=(b.memsets or 0) / max(1, b.attn_calls or 1), ops=list(b.attn_ops),
                kernel_names=list(b.attn_kernel_names), launch_apis=list(b.attn_launch_apis),
                kernel_details=list(b.attn_kernel_details),
                tflops=flops / (kernel_ms * 1e-3) / 1e12,
                max_rel_err=((out - ref).abs().max() / ref.abs().max()).item(),
            )
            if matmul_tflops:
                row["pct_of_matmul_rate"] = 100 * row["tflops"] / matmul_tflops
        rows[b.backend] = row
    return {"shape": {"batch": batch, "heads": heads, "seq": seq, "head_dim": dim, "causal": causal,
                      "dtype": "bf16"}, "flops_per_call": flops, "backends": rows}


def switch_overhead(layers=16, seq=2048, batch=4, rounds=5, per_round=10, device="cuda"):
    """A Llama-style forward under attnswitch.backend(X) (model-scoped and global) vs transformers'
    sdpa under torch's sdpa_kernel(X), interleaved round by round. GPU time: CUDA events around
    ``per_round`` back-to-back forwards; host time: per forward, the device idle before each call.
    Plus the host cost per attention call in isolation (``dispatch_overhead``)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from attnswitch.models import load_model
    from attnswitch.workload import make_workload

    cuda = device == "cuda"
    dtype = "bf16" if cuda else "fp32"
    preset = "llama-3.2-1b" if cuda else "tiny-llama"
    if not cuda:
        layers, seq, batch, per_round = 4, 256, 1, 5
    model, desc = load_model(preset, dtype=dtype, device=device, layers=layers)
    kw = make_workload(model, batch=batch, seq=seq).kwargs
    out = {"model": desc, "layers": layers, "batch": batch, "seq": seq, "dtype": dtype, "rounds": rounds,
           "per_round": per_round, "backends": {}}
    names = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION} if cuda else \
        {"flash": SDPBackend.FLASH_ATTENTION, "math": SDPBackend.MATH}

    def fwd():
        with torch.no_grad():
            model(**kw)

    def measure(ctx):
        with ctx():
            fwd()
            _sync()
            if cuda:
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
            t0 = time.perf_counter()
            for _ in range(per_round):
                fwd()
            if cuda:
                b.record()
                _sync()
                gpu = a.elapsed_time(b) / per_round
            else:
                gpu = (time.perf_counter() - t0) * 1e3 / per_round
            hosts = []
            for _ in range(per_round):
                _sync()
                t0 = time.perf_counter()
                fwd()
                hosts.append((time.perf_counter() - t0) * 1e3)
            _sync()
        return gpu, hosts

    for name, sdp in names.items():
        variants = {
            "attnswitch_model": lambda n=name: attnswitch.backend(n, model=model),
            "attnswitch_global": lambda n=name: attnswitch.backend(n),
            "sdpa_kernel": lambda s=sdp: sdpa_kernel(s),
        }
        res = {k: ([], []) for k in variants}
        for _ in range(rounds):
            for k, ctx in variants.items():
                g, h = measure(ctx)
                res[k][0].append(g)
                res[k][1].extend(h)
        base_t, base_h = _median(res["sdpa_kernel"][0]), _median(res["sdpa_kernel"][1])
        row = {}
        for k, (t, h) in res.items():
            row[k] = {"time_ms": _median(t), "time_rounds_ms": t, "noise_pct": _iqr_half_pct(t),
                      "host_ms": _median(h), "gpu_ratio_vs_sdpa_kernel": _median(t) / base_t,
                      "host_us_added_per_attention_call": (_median(h) - base_h) * 1e3 / layers}
        out["backends"][name] = row
    out["dispatch_micro"] = dispatch_overhead(device)
    out["dispatch_in_forward"] = dispatch_in_forward(device)
    return out


def floor_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """The least a flag-free forced attention function does, as an entry of transformers' attention
    interface: PyTorch's check, the backend's op (cuDNN on CUDA, flash on CPUs), transformers' layout; no
    selection, no counting, no other argument read. The floor of attnswitch's design, in Python."""
    causal = query.shape[2] > 1 and attention_mask is None
    if query.is_cuda:
        if not torch._C._can_use_cudnn_attention(torch.backends.cuda.SDPAParams(
                query, key, value, attention_mask, dropout, causal, False), False):
            raise RuntimeError("the floor runs only what cuDNN takes")
        out = torch._scaled_dot_product_cudnn_attention(query, key, value, attention_mask, False, dropout, causal,
                                                        False, scale=scaling)[0]
    else:
        out = torch._scaled_dot_product_flash_attention_for_cpu(query, key, value, dropout, causal,
                                                                attn_mask=attention_mask, scale=scaling)[0]
    return out.transpose(1, 2).contiguous(), None


FLOOR_KEY = "attnswitch-benchmark-floor"


def _register_floor() -> None:
    """``floor_attention`` in transformers' attention interface, with SDPA's masks (once per process)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    AttentionInterface.register(FLOOR_KEY, floor_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(FLOOR_KEY, sdpa_mask)


@contextlib.contextmanager
def _as_floor(model):
    """``model`` running ``floor_attention`` (registered by ``_register_floor``) as its attention."""
    old, model.config._attn_implementation_internal = model.config._attn_implementation_internal, FLOOR_KEY
    try:
        yield
    finally:
        model.config._attn_implementation_internal = old


def dispatch_in_forward(device="cuda", layers=16, n=600):
    """Host µs added per attention call inside real forwards: a Llama small enough that its forward is
    host-bound (hidden 64, 8 tokens), under attnswitch's switch against transformers' sdpa under
    ``sdpa_kernel``, the same kernel either way, interleaved in blocks of forwards (``_in_blocks``; the
    device idle before each). Unlike the isolated calls of
    ``dispatch_overhead``, the rest of the forward runs between two attention calls, as in a model."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from transformers import LlamaConfig, LlamaModel

    cuda = device == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32
    cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=layers, num_attention_heads=4,
                      num_key_value_heads=4, vocab_size=128)
    model = LlamaModel(cfg).to(device, dtype).eval()
    ids = torch.randint(0, 128, (1, 8), device=device)
    name, sdp = ("cudnn", SDPBackend.CUDNN_ATTENTION) if cuda else ("flash", SDPBackend.FLASH_ATTENTION)
    variants = {"transformers sdpa under sdpa_kernel": lambda: sdpa_kernel(sdp),
                "the floor (floor_attention as the model's attention function)": lambda: _as_floor(model),
                "attnswitch, model-scoped": lambda: attnswitch.backend(name, model=model),
                "attnswitch, global": lambda: attnswitch.backend(name)}

    _register_floor()

    def fwd():
        with torch.no_grad():
            model(input_ids=ids)
    samples = _in_blocks(variants, fwd, n, block=5)
    med = {k: _median(v) for k, v in samples.items()}
    base = med["transformers sdpa under sdpa_kernel"]
    return {"backend": name, "device": device, "layers": layers, "forwards_per_variant": n,
            "interleaved": "in blocks of 5 forwards", "median_host_us_per_forward": med,
            "added_us_per_attention_call_model_scoped": (med["attnswitch, model-scoped"] - base) / layers,
            "added_us_per_attention_call_global": (med["attnswitch, global"] - base) / layers,
            "floor_added_us_per_attention_call": (med["the floor (floor_attention as the model's attention function)"]
                                                  - base) / layers,
            "target_added_us": 3.0}


def _in_blocks(contexts: dict, fns, n: int, block: int) -> dict[str, list[float]]:
    """``n`` host-time samples (µs, the device idle before each) of each variant, the variants taking turns
    block by block: a slow spell of the host (other load, seconds long on a shared machine) falls on all
    alike. Each block runs inside its variant's context (entered and left outside the timing) after one
    untimed call: entering and leaving a context runs enough code to evict the call's own from the CPU's
    caches, and timing the call right after would add that refill to every sample (several µs per call,
    for attnswitch's switch more than for ``sdpa_kernel``), where a model's calls run in steady state."""
    samples = {k: [] for k in contexts}
    for _ in range(max(1, n // block)):
        for k, ctx in contexts.items():
            fn = fns[k] if isinstance(fns, dict) else fns
            with ctx():
                samples[k].extend(time_host(fn, n=block, warmup=1, sync_each=True))
    return samples


@contextlib.contextmanager
def _in_forward(switch, model):
    """Inside ``switch``, the attention calls as those of a forward of ``model`` (what ``guarded_call``
    sets up around it)."""
    from attnswitch.hf import dispatch

    with switch:
        token = dispatch._FORWARD.set(dispatch.new_forward(model))
        try:
            yield
        finally:
            dispatch._FORWARD.reset(token)


def dispatch_overhead(device="cuda", n=2000):
    """Host µs per attention call, the device idle before each call, on inputs small enough that the
    call's host work dominates: each layer of attnswitch's path against transformers' sdpa function
    and bare F.scaled_dot_product_attention under torch's sdpa_kernel, interleaved in blocks of calls
    (``_in_blocks``)."""

    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from transformers import LlamaConfig, LlamaModel
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from attnswitch import backends
    from attnswitch.hf import dispatch

    cuda = device == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32  # cuDNN takes half precision only
    cfg = LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=1, num_attention_heads=4,
                      num_key_value_heads=4, vocab_size=128)
    model = LlamaModel(cfg).to(device, dtype)
    mod = model.layers[0].self_attn
    q = torch.randn(1, 4, 16, 64, device=device, dtype=dtype)
    name, sdp = ("cudnn", SDPBackend.CUDNN_ATTENTION) if cuda else ("flash", SDPBackend.FLASH_ATTENTION)
    none = contextlib.nullcontext

    def entry():
        return dispatch.attention_forward(mod, q, q, q, None, dropout=0.0, scaling=0.125)

    variants = {
        "F.sdpa under sdpa_kernel": (lambda: sdpa_kernel(sdp),
                                     lambda: F.scaled_dot_product_attention(q, q, q, is_causal=True, scale=0.125)),
        "transformers sdpa under sdpa_kernel": (lambda: sdpa_kernel(sdp), lambda: sdpa_attention_forward(
            mod, q, q, q, None, dropout=0.0, scaling=0.125)),
        # the forced op's two calls into PyTorch, alone: its check, then the backend's ATen op
        "PyTorch's check alone": (none, (lambda: torch._C._can_use_cudnn_attention(
            torch.backends.cuda.SDPAParams(q, q, q, None, 0.0, True, False), False)) if cuda else
            (lambda: torch._fused_sdp_choice(q, q, q, None, 0.0, True, scale=0.125, enable_gqa=False))),
        "the backend's ATen op alone": (none, (lambda: torch._scaled_dot_product_cudnn_attention(
            q, q, q, None, False, 0.0, True, False, scale=0.125)) if cuda else
            (lambda: torch._scaled_dot_product_flash_attention_for_cpu(q, q, q, 0.0, True, scale=0.125))),
        "transpose + contiguous alone": (none, lambda: q.transpose(1, 2).contiguous()),  # both entries end so
        "the floor: check, op and copy in one function": (none, lambda: floor_attention(mod, q, q, q, None,
                                                                                           dropout=0.0, scaling=0.125)),
        "attnswitch forced op (backends.run)": (none, lambda: backends.run(
            name, backends.Call(q, q, q, None, 0.0, True, 0.125))),
        "attnswitch.attention (bare)": (none, lambda: attnswitch.attention(q, q, q, is_causal=True, scale=0.125,
                                                                          backend=name)),
        # as inside a forward of the model: the forward's selection read at its start (guarded_call)
        "attnswitch entry, model-scoped": (lambda: _in_forward(attnswitch.backend(name, model=model), model), entry),
        "attnswitch entry, global": (lambda: _in_forward(attnswitch.backend(name), model), entry),
        # a call outside a forward of its model: the selection asked for per call, the general path
        "attnswitch entry outside a forward (general path)": (lambda: attnswitch.backend(name, model=model), entry),
    }
    samples = _in_blocks({k: ctx for k, (ctx, _) in variants.items()}, {k: fn for k, (_, fn) in variants.items()}, n,
                         block=20)
    res = {k: _median(v) for k, v in samples.items()}
    base = res["transformers sdpa under sdpa_kernel"]
    return {"backend": name, "device": device, "calls_per_variant": n, "interleaved": "in blocks of 20 calls",
            "median_host_us": res,
            "added_us_model_scoped": res["attnswitch entry, model-scoped"] - base,
            "added_us_global": res["attnswitch entry, global"] - base,
            "target_added_us": 3.0}


def switch_enter_exit(n=2000, rounds=5):
    """Host µs to enter and leave ``attnswitch.backend(x, model=m)`` (and the global form) against
    ``torch.nn.attention.sdpa_kernel``, side by side in rounds, for an 8- and a 32-layer model: the
    switch's cost must not grow with the model once it has been used."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from transformers import LlamaConfig, LlamaForCausalLM

    models = {n_layers: LlamaForCausalLM(LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128,
                                                     num_hidden_layers=n_layers, num_attention_heads=4,
                                                     num_key_value_heads=2)).eval() for n_layers in (8, 32)}

    def cost(make):
        def once():
            with make():
                pass
        for _ in range(50):
            once()
        t0 = time.perf_counter()
        for _ in range(n // rounds):
            once()
        return (time.perf_counter() - t0) / (n // rounds) * 1e6

    variants = {"sdpa_kernel": lambda: sdpa_kernel(SDPBackend.FLASH_ATTENTION),
                "attnswitch global": lambda: attnswitch.backend("flash")}
    for n_layers, m in models.items():
        variants[f"attnswitch model, {n_layers} layers"] = lambda m=m: attnswitch.backend("flash", model=m)
    samples = {k: [] for k in variants}
    for _ in range(rounds):
        for k, make in variants.items():
            samples[k].append(cost(make))
    res = {k: _median(v) for k, v in samples.items()}
    base = res["sdpa_kernel"]
    return {"median_us": res, "ratio_vs_sdpa_kernel": {k: v / base for k, v in res.items()}, "target_ratio": 3.0,
            "noise_pct": {k: _iqr_half_pct(v) for k, v in samples.items()}}


def cli_help(n=3):
    """Wall time of ``attnswitch --help`` against ``python -c "import torch"`` (each a fresh process)."""
    import subprocess

    def wall(cmd):
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            subprocess.run(cmd, check=True, capture_output=True)
            times.append(time.perf_counter() - t0)
        return _median(times)

    help_s = wall([sys.executable, "-m", "attnswitch", "--help"])
    torch_s = wall([sys.executable, "-c", "import torch"])
    return {"help_s": help_s, "import_torch_s": torch_s, "ratio": help_s / torch_s, "target_ratio": 0.5}


def profiler_fidelity(seq=2048, iters=10):
    """Profiled GPU time per forward vs unprofiled CUDA-event time; trace processing vs run time,
    on the default preset and a 32-layer version of it."""
    from attnswitch.models import load_model
    from attnswitch.workload import make_workload

    out = {}
    for n_layers, batch in ((16, 8), (16, 2), (32, 2)):
        model, desc = load_model("llama-3.2-1b", dtype="bf16", device="cuda", layers=n_layers)
        w = make_workload(model, batch=batch, seq=seq)
        t0 = time.perf_counter()
        rep = attnswitch.profile(model, w, backends=["flash", "cudnn", "naive-inplace"], warmup=3, iters=iters)
        wall = time.perf_counter() - t0
        rows = {}
        for b in rep.ok:
            from attnswitch.profiling.trace import Trace

            t = Trace.load(b.trace_path)
            rows[b.backend] = {
                "cuda_event_ms": b.time_ms, "profiled_span_ms": b.profiled_gpu_span_ms,
                "profiled_busy_ms": b.profiled_gpu_busy_ms,
                "span_vs_events_pct": 100 * (b.profiled_gpu_span_ms - b.time_ms) / b.time_ms,
                "busy_vs_events_pct": 100 * (b.profiled_gpu_busy_ms - b.time_ms) / b.time_ms,
                "host_ms": b.host_ms,
                "trace_events": len(t.events), "device_events": len(t.device_events),
                "trace_processing_s": b.trace_seconds,
                "profiled_run_s": b.profiled_run_seconds,
                "kernels_per_forward": b.kernels, "attn_kernels_per_call": b.attn_kernels_per_call,
            }
        out[f"{n_layers}_layers_batch{batch}"] = {"model": desc, "batch": batch, "seq": seq, "iters": iters,
                                     "wall_s": wall, "backends": rows}
        del model
        torch.cuda.empty_cache()
    return out


def posts_findings_per_layer(layers=4, seq=1024, batch=2):
    """Inside a Llama-style forward, per attention call: naive's extra Memcpy DtoD, math's many
    kernels, one kernel for each fused backend."""
    from attnswitch.models import load_model
    from attnswitch.workload import make_workload

    model, desc = load_model("llama-3.2-1b", dtype="bf16", device="cuda", layers=layers)
    w = make_workload(model, batch=batch, seq=seq)
    rep = attnswitch.profile(model, w, backends=BACKENDS6 + ["auto", "eager"], warmup=3, iters=5)
    rows = {}
    for b in rep.backends:
        if not b.ok:
            rows[b.backend] = {"status": b.status, "reasons": list(b.reasons)}
            continue
        attn_rows = [dict(path=l.path, kernels=l.kernels, memcpys=l.memcpys, memsets=l.memsets, gpu_us=l.gpu_us,
                          kernel_names=[k for k, _ in l.kernel_names], launch_apis=[k for k, _ in l.launch_apis])
                     for l in b.layers if l.kind == "attention"]
        rows[b.backend] = {"status": "ok", "attn_kernels_per_call": b.attn_kernels_per_call,
                           "attn_memcpys_per_call": b.attn_memcpys_per_call, "attn_gpu_us_per_call":
                           b.attn_gpu_us_per_call, "attn_ops": list(b.attn_ops), "notes": list(b.notes),
                           "launch_apis": list(b.attn_launch_apis), "time_ms": b.time_ms,
                           "kernels_per_forward": b.kernels, "memcpys_per_forward": b.memcpys,
                           "memsets_per_forward": b.memsets, "attention_rows": attn_rows}
    return {"model": desc, "batch": batch, "seq": seq, "backends": rows}


def _flex_shape(b, h, s, d, rounds, per_round):
    """One shape of ``flex_vs_fused``: flex's first call (compile), then the three kernels side by side."""
    from attnswitch.backends import flex

    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
    ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True)
    flops = 4 * b * h * s * s * d * 0.5
    fns = {n: (lambda n=n: attnswitch.attention(q, k, v, is_causal=True, backend=n))
           for n in ("flex", "cudnn", "flash")}
    _sync()
    t0 = time.perf_counter()
    fns["flex"]()
    _sync()
    row = {"flex_first_call_s": time.perf_counter() - t0, "flex_compiled_entries": flex.cache_info()["compiled"]}
    ok = {}
    for n, fn in fns.items():
        try:
            out = fn().float()
        except attnswitch.BackendUnavailable as e:
            row[n] = {"status": "unavailable", "reasons": e.reasons}
            continue
        ok[n] = fn
        row[n] = {"status": "ok", "max_rel_err": ((out - ref).abs().max() / ref.abs().max()).item()}
    samples = {n: [] for n in ok}
    for _ in range(rounds):  # interleaved: drift falls on every backend alike
        for n, fn in ok.items():
            samples[n] += time_graph(fn, n=per_round, warmup=2) or time_gpu(fn, n=per_round, warmup=2)
    for n, ms in samples.items():
        row[n].update(gpu_us=_median(ms) * 1e3, noise_pct=_iqr_half_pct(ms), tflops=flops / (_median(ms) * 1e-3) / 1e12)
    if "flex" in ok and "cudnn" in ok:
        row["flex_vs_cudnn_time_ratio"] = row["flex"]["gpu_us"] / row["cudnn"]["gpu_us"]
    return row


def flex_vs_fused(shapes=((4, 32, 4096, 128), (8, 16, 1024, 64)), rounds=5, per_round=10):
    """FlexAttention (compiled, causal block mask) against cuDNN and FlashAttention-2 through SDPA, bare
    causal bf16 calls, side by side: TFLOP/s of the kernels (CUDA-graph replay, else CUDA events), in
    interleaved rounds; and flex's compile cost, the wall time of its first call at each shape (a new
    compiled entry per head count and dim; the inductor cache on disk as this machine has it)."""
    out = {"inductor_cache_dir": os.environ.get("TORCHINDUCTOR_CACHE_DIR", "default")}
    for b, h, s, d in shapes:
        out[f"B{b} H{h} S{s} D{d} bf16 causal"] = _flex_shape(b, h, s, d, rounds, per_round)
        torch.cuda.empty_cache()
    return out


_CEILINGS: dict = {}


def _with_ceilings(quick=False):
    _CEILINGS.update(ceilings(quick))
    return dict(_CEILINGS)


def _matmul_rate():
    if not _CEILINGS:
        _CEILINGS.update(ceilings())
    return _CEILINGS["bf16_matmul_tflops"]


PARTS = {
    "ceilings": _with_ceilings,
    "post_experiment": lambda quick=False: attention_call(8, 16, 1024, 64, matmul_tflops=_matmul_rate()),
    "ceiling_shape": lambda quick=False: attention_call(4, 32, 4096, 128, n=30, matmul_tflops=_matmul_rate()),
    "switch_overhead": lambda quick=False: switch_overhead(),
    "dispatch": lambda quick=False: {"dispatch_micro": dispatch_overhead(),
                                     "dispatch_in_forward": dispatch_in_forward()},
    "profiler_fidelity": lambda quick=False: profiler_fidelity(),
    "posts_findings_per_layer": lambda quick=False: posts_findings_per_layer(),
    "flex_vs_fused": lambda quick=False: flex_vs_fused(rounds=2 if quick else 5),
}
CPU_PARTS = {"switch_overhead_cpu": lambda quick=False: switch_overhead(device="cpu"),
             "switch_enter_exit": lambda quick=False: switch_enter_exit(),
             "cli_help": lambda quick=False: cli_help()}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks")
    p.add_argument("--out", default=os.environ.get("OUT") or "benchmarks/results/latest")
    p.add_argument("--only", default=None, help="comma-separated parts: " + ", ".join([*PARTS, *CPU_PARTS]))
    p.add_argument("--quick", action="store_true")
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    parts = dict(CPU_PARTS)
    if torch.cuda.is_available():
        parts.update(PARTS)
    if args.only:
        parts = {k: v for k, v in {**PARTS, **CPU_PARTS}.items() if k in args.only.split(",")}
    env = environment()
    command = "python -m benchmarks " + " ".join(sys.argv[1:] if argv is None else argv)
    for name, fn in parts.items():
        t0 = time.perf_counter()
        try:
            result = fn(quick=args.quick)
            status = "ok"
        except Exception as e:  # a part that breaks is recorded, the others still run
            import traceback

            result, status = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}, "failed"
        doc = {"part": name, "status": status, "seconds": time.perf_counter() - t0, "environment": env,
               "command": command, "result": result}
        (out / f"{name}.json").write_text(json.dumps(doc, indent=1, default=str))
        print(f"{name}: {status} in {doc['seconds']:.1f} s", flush=True)
    return 0
