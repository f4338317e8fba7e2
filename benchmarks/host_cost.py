"""attnswitch's host cost per attention call inside real forwards, counted in CPU instructions.

Wall-clock figures of a few µs per call inside a forward drown in a shared host's noise (tens of µs
between runs of one code); instruction counts do not move with the load. ``valgrind --tool=callgrind``
counts the instructions of whole forwards of a host-bound model (a 16-layer Llama shape, fp32 on the CPU,
one thread), prefill and one-token decode steps against a KV cache, for every backend that runs on CPUs
under attnswitch's switch (model-scoped ``backend(name, model=m)`` and global ``backend(name)``) and for
the same kernel run by transformers' own path:

- ``math``, ``flash``: transformers' ``sdpa`` under ``sdpa_kernel([same backend])``;
- ``auto``: transformers' ``sdpa`` as it is;
- ``eager``: transformers' ``eager``;
- ``naive``, ``naive-inplace``: the same kernel (``backends.naive.naive_attention``) registered as a plain
  attention function of transformers' interface (transformers has no such kernel); transformers' ``eager``,
  the closest kernel it has, is shown beside it.

Only the forwards are counted: callgrind's client requests (issued through a few bytes of x86-64 machine code called
with ctypes, no compiled extension) start counting right before each forward and stop right after, so imports, model
building, entering and leaving the switch and the cache copies between decode steps are left out. Entering and
leaving are counted on their own: a context made, entered and left (``backend("flash")``, ``backend("flash",
model=m)``, a model's first switch before; ``sdpa_kernel([FLASH])`` beside them), 16 in a row per sample, also timed
natively. Added instructions per attention call = (switched − baseline) / attention calls.
They are turned into approximate µs by this machine's instructions per µs for these same forwards: the
same loop run natively (no valgrind), one thread, each forward timed by the thread's CPU clock (which a
busy neighbour slows less than the wall clock), divided into callgrind's count per forward.

Where the added instructions come from: a one-layer forward beside the full one splits them into a
once-per-forward part (the per-forward guard, the mask entry) and each call's own; the call alone is
counted too (the entry inside a forward's selection, as ``suite.dispatch_overhead`` calls it); callgrind's
per-function costs say which C functions (CPython's evaluation loop, torch's argument parsing, ATen ops)
they went to; and a Python-level count (``sys.setprofile``'s call events: deterministic, no valgrind)
which Python functions and builtins a switched forward runs per attention call beyond its baseline.

    python benchmarks/host_cost.py --out host_cost.json          # 20-35 minutes on a busy 2-core machine
    python benchmarks/host_cost.py --out h.json --no-callgrind   # without valgrind: Python-level counts only
    python benchmarks/host_cost.py --out h.json --device cuda    # the CUDA path, Python-level counts (bf16)

Needs valgrind (``apt-get install valgrind``) on an x86-64 Linux host for the instruction counts.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import copy
import ctypes
import gc
import inspect
import json
import mmap
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

BACKENDS = ["naive", "naive-inplace", "math", "flash", "auto", "eager"]
SCOPES = ("model-scoped", "global")
#: backend -> the same kernel run by transformers' own path (and a second reference shown beside it)
BASELINE_OF = {"naive": "floor naive", "naive-inplace": "floor naive-inplace", "math": "sdpa + sdpa_kernel(MATH)",
               "flash": "sdpa + sdpa_kernel(FLASH)", "auto": "sdpa", "eager": "eager",
               "efficient": "sdpa + sdpa_kernel(EFFICIENT)", "cudnn": "sdpa + sdpa_kernel(CUDNN)"}  # (the last: CUDA)
CUDA_BACKENDS = [*BACKENDS, "efficient", "cudnn"]
ALSO_AGAINST = {"naive": "eager", "naive-inplace": "eager"}
TARGET_US = 5.0
#: what the counted processes run with: valgrind's CPU has no AVX-512, so the native timing takes the
#: same kernels; one thread; hashes fixed (dict and set layouts, so counts repeat)
ENV = {"PYTHONHASHSEED": "0", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "ATEN_CPU_CAPABILITY": "avx2",
       "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "TRANSFORMERS_VERBOSITY": "error",
       "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


# -- callgrind's client requests ------------------------------------------------------------------------

class ClientRequests:
    """Valgrind's client requests from Python: the magic x86-64 sequence (four ``rol rdi`` that add up to
    a full turn, then ``xchg rbx, rbx``: a no-op natively) with ``rax`` pointing at the request and its
    arguments and ``rdx`` the answer, as valgrind.h's ``VALGRIND_DO_CLIENT_REQUEST_EXPR`` emits it."""

    _CODE = bytes.fromhex("4889f8" "31d2" "48c1c703" "48c1c70d" "48c1c73d" "48c1c733" "4887db" "4889d0" "c3")
    _TOOL = (ord("C") << 24) | (ord("T") << 16)  # VG_USERREQ_TOOL_BASE('C', 'T'): callgrind's
    ZERO, TOGGLE, DUMP_AT = _TOOL + 1, _TOOL + 2, _TOOL + 3

    def __init__(self):
        if platform.machine().lower() not in ("x86_64", "amd64"):
            raise RuntimeError(f"callgrind's client requests are written here for x86-64, not {platform.machine()}")
        self._page = mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
        self._page.write(self._CODE)
        addr = ctypes.addressof(ctypes.c_char.from_buffer(self._page))
        self._fn = ctypes.CFUNCTYPE(ctypes.c_uint64, ctypes.c_void_p)(addr)
        self._args = (ctypes.c_uint64 * 6)()

    def request(self, code: int, arg: int = 0) -> int:
        self._args[0], self._args[1] = code, arg
        return self._fn(self._args)

    def on_valgrind(self) -> bool:
        return self.request(0x1001) > 0  # RUNNING_ON_VALGRIND

    def dump(self, label: str) -> None:
        text = ctypes.create_string_buffer(label.encode())
        self.request(self.DUMP_AT, ctypes.addressof(text))


# -- the model, its steps and the variants ------------------------------------------------------------

def _model(args):
    import torch
    from transformers import LlamaConfig, LlamaModel

    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=args.hidden, intermediate_size=2 * args.hidden, num_hidden_layers=args.layers,
                      num_attention_heads=args.heads, num_key_value_heads=args.kv_heads, vocab_size=128,
                      attn_implementation="sdpa")
    return LlamaModel(cfg).to(args.device, _dtype(args)).eval()


def _dtype(args):
    import torch

    return torch.float32 if args.device == "cpu" else torch.bfloat16


def _steps(model, args):
    """workload -> (prepare, forward): ``prepare()`` runs outside the count, ``forward(prepared)`` is counted."""
    import torch
    from transformers import DynamicCache

    ids = torch.randint(0, 128, (1, args.q_len), device=args.device)
    # the cache's keyword: ``cache`` in newer transformers, ``past_key_values`` before
    name = "cache" if "cache" in inspect.signature(type(model).forward).parameters else "past_key_values"
    with torch.no_grad():
        base = DynamicCache(config=model.config)
        model(input_ids=ids, use_cache=True, **{name: base})
    token = torch.randint(0, 128, (1, 1), device=args.device)

    def prefill(_):
        with torch.no_grad():
            model(input_ids=ids, use_cache=False)

    def decode(cache):
        with torch.no_grad():
            model(input_ids=token, use_cache=True, **{name: cache})

    return {"prefill": (lambda: None, prefill), "decode": (lambda: copy.deepcopy(base), decode)}


def _floor_functions():
    """The naive kernels as plain entries of transformers' attention interface, with SDPA's masks."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    from attnswitch.backends import Call
    from attnswitch.backends.naive import naive_attention

    def make(inplace):
        def floor(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
            causal = query.shape[2] > 1 and attention_mask is None and getattr(module, "is_causal", True)
            out, _ = naive_attention(Call(query, key, value, attention_mask, dropout, causal, scaling, where=module),
                                     inplace=inplace)
            return out.transpose(1, 2).contiguous(), None
        return floor

    keys = {}
    for name, inplace in (("naive", False), ("naive-inplace", True)):
        key = f"host-cost-floor-{name}"
        AttentionInterface.register(key, make(inplace))
        ALL_MASK_ATTENTION_FUNCTIONS.register(key, sdpa_mask)
        keys[f"floor {name}"] = key
    return keys


@contextlib.contextmanager
def _implementation(model, key, sdp=None):
    """``model`` running transformers' attention ``key`` (under ``sdpa_kernel([sdp])`` if given)."""
    from torch.nn.attention import sdpa_kernel

    old, model.config._attn_implementation_internal = model.config._attn_implementation_internal, key
    try:
        with sdpa_kernel([sdp]) if sdp is not None else contextlib.nullcontext():
            yield
    finally:
        model.config._attn_implementation_internal = old


def variants(model, backends: list[str]) -> dict[str, callable]:
    """label -> a context factory: each backend under both scopes, and the baselines they are held against."""
    from torch.nn.attention import SDPBackend

    import attnswitch

    floors = _floor_functions()
    base = {"sdpa": lambda: _implementation(model, "sdpa"), "eager": lambda: _implementation(model, "eager"),
            "sdpa + sdpa_kernel(MATH)": lambda: _implementation(model, "sdpa", SDPBackend.MATH),
            "sdpa + sdpa_kernel(FLASH)": lambda: _implementation(model, "sdpa", SDPBackend.FLASH_ATTENTION),
            "sdpa + sdpa_kernel(EFFICIENT)": lambda: _implementation(model, "sdpa", SDPBackend.EFFICIENT_ATTENTION),
            "sdpa + sdpa_kernel(CUDNN)": lambda: _implementation(model, "sdpa", SDPBackend.CUDNN_ATTENTION),
            **{label: (lambda k=key: _implementation(model, k)) for label, key in floors.items()}}
    for b in backends:
        base[f"{b} | model-scoped"] = lambda b=b: attnswitch.backend(b, model=model)
        base[f"{b} | global"] = lambda b=b: attnswitch.backend(b)
    return {label: base[label] for label in variants_wanted(backends)}


# -- the worker: one process runs every variant, counted, timed or traced --------------------------------

def _run_variant(ctx, prepare, forward, n: int, warmup: int, around):
    """``warmup`` forwards, then ``n`` forwards each inside ``around`` (counting or timing it)."""
    with ctx():
        for _ in range(warmup):
            forward(prepare())
        gc.collect()
        gc.disable()
        try:
            for _ in range(n):
                state = prepare()
                with around():
                    forward(state)
        finally:
            gc.enable()


def _python_profile(counts: collections.Counter):
    """``sys.setprofile`` counting each Python function's calls and each builtin's, by name."""
    def prof(frame, event, arg):
        if event == "call":
            code = frame.f_code
            counts[f"{code.co_qualname} ({os.path.basename(code.co_filename)}:{code.co_firstlineno})"] += 1
        elif event == "c_call":
            counts[f"{getattr(arg, '__qualname__', getattr(arg, '__name__', repr(arg)))} (builtin)"] += 1

    @contextlib.contextmanager
    def around():
        sys.setprofile(prof)
        try:
            yield
        finally:
            sys.setprofile(None)
    return around


def _one_layer(args):
    """The same model with one layer: beside the full one, it tells what a forward pays once (the guard, the
    mask) from what each call pays (a model without layers would not do: the guard's check of a forward
    that made no attention call walks the model's modules)."""
    return _model(argparse.Namespace(**{**vars(args), "layers": 1}))


def _isolated(model, args, backends: list[str]) -> dict[str, dict[str, tuple]]:
    """workload -> label -> (context, one attention call): the calls of a forward made alone, as
    ``benchmarks/suite.py``'s ``dispatch_overhead`` makes them (the switched entry inside a forward's
    selection), on the shapes of the workload's calls."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
    from transformers.models.llama.modeling_llama import eager_attention_forward

    import attnswitch
    from attnswitch.hf import dispatch

    mod, d = model.layers[0].self_attn, args.hidden // args.heads
    floors = {label: ALL_ATTENTION_FUNCTIONS[key] for label, key in _floor_functions().items()}
    none = contextlib.nullcontext
    out = {}
    for workload, (sq, sk) in {"prefill": (args.q_len, args.q_len), "decode": (1, args.q_len + 1)}.items():
        at = {"device": args.device, "dtype": _dtype(args)}
        q, k = torch.randn(1, args.heads, sq, d, **at), torch.randn(1, args.kv_heads, sk, d, **at)
        hide = torch.ones(sq, sk, dtype=torch.bool, device=args.device).triu_(sk - sq + 1)
        eager_mask = torch.zeros(1, 1, sq, sk, **at).masked_fill_(hide, torch.finfo(at["dtype"]).min)
        kw = {"dropout": 0.0, "scaling": d ** -0.5}
        calls = {"sdpa": (none, lambda q=q, k=k, kw=kw: sdpa_attention_forward(mod, q, k, k, None, **kw)),
                 "eager": (none, lambda q=q, k=k, m=eager_mask, kw=kw: eager_attention_forward(mod, q, k, k, m, **kw))}
        for flag, sdp in (("MATH", SDPBackend.MATH), ("FLASH", SDPBackend.FLASH_ATTENTION),
                          ("EFFICIENT", SDPBackend.EFFICIENT_ATTENTION), ("CUDNN", SDPBackend.CUDNN_ATTENTION)):
            calls[f"sdpa + sdpa_kernel({flag})"] = (lambda sdp=sdp: sdpa_kernel([sdp]), calls["sdpa"][1])
        for label, fn in floors.items():
            calls[label] = (none, lambda fn=fn, q=q, k=k, kw=kw: fn(mod, q, k, k, None, **kw))
        def entry(q=q, k=k, kw=kw):
            return dispatch.attention_forward(mod, q, k, k, None, **kw)
        for b in backends:
            calls[f"{b} | model-scoped"] = (lambda b=b: _in_forward(attnswitch.backend(b, model=model), model), entry)
            calls[f"{b} | global"] = (lambda b=b: _in_forward(attnswitch.backend(b), model), entry)
        wanted = set(variants_wanted(backends))
        out[workload] = {label: c for label, c in calls.items() if label in wanted}
    return out


@contextlib.contextmanager
def _in_forward(switch, model):
    """Inside ``switch``, calls made as those of a forward of ``model`` (what the per-forward guard sets up)."""
    from attnswitch.hf import dispatch

    with switch:
        token = dispatch._FORWARD.set(dispatch.new_forward(model))
        try:
            yield
        finally:
            dispatch._FORWARD.reset(token)


def variants_wanted(backends: list[str]) -> list[str]:
    base = [BASELINE_OF[b] for b in backends] + [ALSO_AGAINST[b] for b in backends if b in ALSO_AGAINST]
    return list(dict.fromkeys(base)) + [f"{b} | {s}" for b in backends for s in SCOPES]


def _parts(args) -> dict[str, tuple]:
    """part -> (workload -> (prepare, run one sample), label -> context, attention calls per sample, workloads)."""
    model = _model(args)
    parts = {"forward": (_steps(model, args), variants(model, args.backends), args.layers, args.workloads)}
    if args.mode == "count":
        one = _one_layer(args)
        parts["one-layer"] = (_steps(one, args), variants(one, args.backends), 1, args.workloads)
        iso = _isolated(model, args, args.backends)
        steps = {w: (lambda: None, lambda _, w=w: None) for w in iso}
        parts["isolated"] = (steps, iso, ISOLATED_CALLS, args.workloads)
    if args.mode in ("count", "time") and args.enter_exit:
        ee = _enter_exit(model)
        parts["enter-exit"] = ({"enter-exit": (lambda: None, lambda _: None)}, ee, ENTER_EXIT, ["enter-exit"])
    return parts


ISOLATED_CALLS = 16  # attention calls per isolated sample: a forward's worth
ENTER_EXIT = 16  # contexts made, entered and left per sample
ENTER_EXIT_VARIANTS = ("sdpa_kernel([FLASH])", "flash | global", "flash | model-scoped")


def _enter_exit(model) -> dict[str, dict[str, tuple]]:
    """"enter-exit" -> label -> (no context, one context made, entered and left): ``backend()`` global and
    model-scoped (the model switched once before, as a user's loop has it), and ``sdpa_kernel`` beside them."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import attnswitch

    def once(make):
        def run():
            with make():
                pass
        return run

    with attnswitch.backend("flash", model=model):  # (registered: the model's first switch is not counted)
        pass
    makers = {"sdpa_kernel([FLASH])": lambda: sdpa_kernel([SDPBackend.FLASH_ATTENTION]),
              "flash | global": lambda: attnswitch.backend("flash"),
              "flash | model-scoped": lambda: attnswitch.backend("flash", model=model)}
    return {"enter-exit": {label: (contextlib.nullcontext, once(make)) for label, make in makers.items()}}


def _sample_fns(part, steps, table, workload, label):
    prepare, forward = steps[workload]
    if part not in ("isolated", "enter-exit"):
        return table[label], prepare, forward
    ctx, call = table[workload][label]
    n = ISOLATED_CALLS if part == "isolated" else ENTER_EXIT

    def calls(_):
        for _ in range(n):
            call()
    return ctx, prepare, calls


def worker(args) -> None:
    import torch

    torch.set_num_threads(1)
    parts = _parts(args)
    if args.mode == "count" and args.device != "cpu":
        raise SystemExit("instructions are counted on the CPU (valgrind runs no CUDA driver); --device cpu")
    cg = ClientRequests() if args.mode == "count" else None
    if cg is not None and not cg.on_valgrind():
        raise SystemExit("--mode count runs under valgrind --tool=callgrind (the driver starts it)")
    gc.collect()
    gc.freeze()  # the imports' and the model's objects: no collection walks them again
    rows = []
    for rep in range(args.reps):
        for part, (steps, table, calls, workloads) in parts.items():
            for workload in workloads:
                labels = table[workload] if part in ("isolated", "enter-exit") else table
                for label in labels:
                    tag = f"{part} | {workload} | {label} | {rep}"
                    row = {"part": part, "workload": workload, "variant": label, "rep": rep,
                           "calls": args.forwards * calls}
                    ctx, prepare, forward = _sample_fns(part, steps, table, workload, label)
                    try:
                        _sample(args, cg, tag, row, ctx, prepare, forward)
                    except Exception as e:  # a kernel that refuses these inputs here: said, the rest measured
                        row["error"] = f"{type(e).__name__}: {e}"
                        print(f"{tag}: {row['error']}", file=sys.stderr)
                    rows.append(row)
    import attnswitch

    with open(args.results, "w") as f:
        json.dump({"rows": rows, "load": os.getloadavg(), "code": attnswitch.__file__}, f)


def _sync(args):
    import torch

    return torch.cuda.synchronize if args.device == "cuda" else (lambda: None)


def _sample(args, cg, tag, row, ctx, prepare, forward) -> None:
    """``args.forwards`` samples of one variant: counted (a callgrind dump each), timed or traced."""
    if args.mode == "count":
        done = []

        @contextlib.contextmanager
        def around():
            cg.request(cg.TOGGLE)
            try:
                yield
            finally:
                cg.request(cg.TOGGLE)
                cg.dump(f"{tag} | {len(done)}")  # one dump per sample (a dump zeroes the counts)
                done.append(1)
        cg.request(cg.ZERO)
        _run_variant(ctx, prepare, forward, args.forwards, args.warmup, around)
    elif args.mode == "time":
        cpu, wall = [], []

        sync = _sync(args)

        @contextlib.contextmanager
        def around():
            sync()  # the device idle before each forward: the host time to return is the host's own
            c0, w0 = time.thread_time_ns(), time.perf_counter_ns()
            yield
            cpu.append((time.thread_time_ns() - c0) / 1e3)
            wall.append((time.perf_counter_ns() - w0) / 1e3)
        _run_variant(ctx, prepare, forward, args.forwards, args.warmup, around)
        row.update(cpu_us=cpu, wall_us=wall)
    else:
        counts = collections.Counter()
        _run_variant(ctx, prepare, forward, args.forwards, args.warmup, _python_profile(counts))
        row["python_calls"] = dict(counts)


# -- reading callgrind's dumps ----------------------------------------------------------------------------

_NAMED = re.compile(r"\((\d+)\)(?: (.*))?")


def read_dump(path: str) -> dict:
    """A callgrind dump (``Ir`` only) as its label, total, and per function: self cost, the inclusive
    cost of the calls made into it and how many were made."""
    names: dict[str, str] = {}
    self_cost, incl, calls = collections.Counter(), collections.Counter(), collections.Counter()
    label, total, fn, callee, pending = None, 0, None, None, None

    def name_of(rest: str) -> str:
        m = _NAMED.match(rest)
        if not m:
            return rest
        if m.group(2) is not None:
            names[m.group(1)] = m.group(2)
        return names.get(m.group(1), rest)

    with open(path) as f:
        for line in f:
            c = line[0]
            if c.isdigit() or c in "+-*":
                cost = int(line.split()[-1])
                if pending is not None:
                    incl[callee] += cost
                    calls[callee] += pending
                    pending = None
                else:
                    self_cost[fn] += cost
            elif line.startswith("fn="):
                fn = name_of(line[3:].rstrip("\n"))
            elif line.startswith("cfn="):
                callee = name_of(line[4:].rstrip("\n"))
            elif line.startswith("calls="):
                pending = int(line[6:].split()[0])
            elif line.startswith("desc: Trigger: Client Request: "):
                label = line[len("desc: Trigger: Client Request: "):].strip()
            elif line.startswith("totals:") or line.startswith("summary:"):
                total = int(line.split()[1])
    return {"label": label, "total": total, "self": self_cost, "incl": incl, "calls": calls}


def _callgrind(args, out_dir: str) -> dict[str, dict]:
    """Run the worker under callgrind; the dumps by their tag."""
    results = os.path.join(out_dir, "count.json")
    cmd = ["valgrind", "--tool=callgrind", "--collect-atstart=no", f"--callgrind-out-file={out_dir}/cg.out.%p",
           sys.executable, os.path.abspath(__file__), *_worker_args(args, "count", results)]
    print("counting:", " ".join(cmd), file=sys.stderr, flush=True)
    t0 = time.time()
    done = subprocess.run(cmd, env={**os.environ, **ENV}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                          text=True)
    if done.returncode:
        tail = "\n".join([line for line in done.stderr.splitlines() if not line.startswith("==")][-20:])
        raise SystemExit(f"the counted worker failed (exit {done.returncode}):\n{tail}")
    print(f"  {time.time() - t0:.0f} s under valgrind", file=sys.stderr, flush=True)
    dumps = {}
    for name in os.listdir(out_dir):
        if name.startswith("cg.out."):
            d = read_dump(os.path.join(out_dir, name))
            if d["label"] is not None:
                dumps[d["label"]] = d
    return dumps


def _worker_args(args, mode: str, results: str) -> list[str]:
    return ["--worker", "--mode", mode, "--results", results, "--forwards", str(args.forwards if mode != "time"
                                                                                   else args.timed_forwards // 4),
            "--warmup", str(args.warmup), "--reps", str({"count": args.reps, "time": 4, "trace": 1}[mode]),
            "--layers", str(args.layers), "--hidden", str(args.hidden), "--heads", str(args.heads),
            "--kv-heads", str(args.kv_heads), "--q-len", str(args.q_len), "--device", args.device,
            "--backends", ",".join(args.backends), "--workloads", ",".join(args.workloads), "--src", args.src,
            *(["--no-enter-exit"] if not args.enter_exit else [])]


def _native(args, out_dir: str, mode: str) -> dict:
    results = os.path.join(out_dir, f"{mode}.json")
    load_before = os.getloadavg()
    subprocess.run([sys.executable, os.path.abspath(__file__), *_worker_args(args, mode, results)], check=True,
                   env={**os.environ, **ENV})
    with open(results) as f:
        data = json.load(f)
    data["load_before"] = load_before
    return data


# -- the comparison ---------------------------------------------------------------------------------------

_INTERPRETER = re.compile(r"^(_?Py|_PyEval|method_vectorcall|cfunction_|slot_tp|vectorcall|call_|object_vacall|"
                          r"_PyObject|_PyFunction|builtin_|wrapperdescr|partial_|context_run|ctypes|ffi_|_ctypes)")


def _contributors(sw: list[dict], base: list[dict], calls: int, k: int = 8) -> dict:
    """Per attention call, the C functions whose cost grew most (medians over the samples: the first dump
    after a variant's warm-up can carry call records of the uncounted forwards): by self cost, and by the
    inclusive cost of the calls into them, for entry points outside CPython's evaluation loop (whose
    inclusive cost would count everything below it) and below the sample's outer frames."""
    def per_call(dumps, key, fns):
        return {fn: statistics.median(d[key].get(fn, 0) for d in dumps) / calls for fn in fns}

    whole = statistics.median(d["total"] for d in sw)
    out = {}
    for key in ("self", "incl", "calls"):
        fns = set().union(*(d[key] for d in sw), *(d[key] for d in base))
        a, b = per_call(sw, key, fns), per_call(base, key, fns)
        out[key] = {fn: a[fn] - b[fn] for fn in fns}
    by_self = sorted(out["self"].items(), key=lambda kv: -abs(kv[1]))[:k]
    outer = {fn for d in sw for fn, v in d["incl"].items() if v > whole / 2}
    entries = [(fn, v) for fn, v in out["incl"].items() if fn not in outer and fn.strip()
               and not _INTERPRETER.match(fn.split("(")[0].strip()) and not fn.startswith("0x") and "'" not in fn]
    by_incl = sorted(entries, key=lambda kv: -abs(kv[1]))[:k]
    return {"self_instr_per_call": [(fn, round(v)) for fn, v in by_self],
            "inclusive_instr_per_call": [(fn, round(v), round(out["calls"].get(fn, 0), 2)) for fn, v in by_incl]}


def _half_iqr(xs: list) -> float:
    q = statistics.quantiles(xs, n=4) if len(xs) > 1 else [xs[0]] * 3
    return (q[2] - q[0]) / 2


def _python_added(trace: dict, variant: str, baseline: str, workload: str, k: int = 10) -> list:
    rows = {r["variant"]: r for r in trace["rows"] if r["workload"] == workload and r["part"] == "forward"
            and "error" not in r}
    if variant not in rows or baseline not in rows:
        return []
    a, b = rows[variant]["python_calls"], rows[baseline]["python_calls"]
    calls = rows[variant]["calls"]
    diff = {fn: (a.get(fn, 0) - b.get(fn, 0)) / calls for fn in set(a) | set(b)}
    return [(fn, round(v, 2)) for fn, v in sorted(diff.items(), key=lambda kv: -abs(kv[1]))[:k] if v]


def compare(args, dumps: dict, timing: dict | None, trace: dict | None) -> dict:
    """The figures: per workload, backend and scope, instructions added per attention call over the baseline
    inside forwards; and where they come from: the call alone, the forward's once-per-forward part shared
    over its calls, and what is left (the forward paying beyond both)."""
    by = collections.defaultdict(list)
    for tag, d in dumps.items():
        part, workload, rest = tag.split(" | ", 2)
        by[(part, workload, rest.rsplit(" | ", 2)[0])].append(d)
    totals = {key: [d["total"] for d in ds] for key, ds in by.items()}
    ipus = _instructions_per_us({(w, v): t for (p, w, v), t in totals.items() if p == "forward"}, timing)

    def added(part, workload, variant, base, per):
        sw, bs = totals[(part, workload, variant)], totals[(part, workload, base)]
        # the spread: how far one sample's count strays from the median, per call (either side)
        return (statistics.median(sw) - statistics.median(bs)) / per, max(_half_iqr(sw), _half_iqr(bs)) / per

    out = {"instructions_per_sample": {" | ".join(k): sorted(v) for k, v in totals.items()},
           "instructions_per_us": ipus, "rows": []}
    for workload in args.workloads:
        for b in args.backends:
            for scope in SCOPES:
                variant = f"{b} | {scope}"
                for base in filter(None, (BASELINE_OF[b], ALSO_AGAINST.get(b))):
                    if not all((p, workload, v) in totals for p in ("forward", "one-layer", "isolated")
                               for v in (variant, base)):
                        continue  # a variant that failed (its error is on stderr)
                    add, spread = added("forward", workload, variant, base, args.layers)
                    row = {"workload": workload, "backend": b, "scope": scope, "baseline": base,
                           "primary": base == BASELINE_OF[b],
                           "baseline_instr_per_call": statistics.median(totals[("forward", workload, base)])
                           / args.layers, "added_instr_per_call": add, "sample_spread_instr_per_call": spread,
                           "added_us_approx": add / ipus["used"] if ipus else None}
                    if row["primary"]:
                        # added per forward = once + layers x each: from the one-layer and the full forward
                        one = added("one-layer", workload, variant, base, 1)[0]
                        each = (add * args.layers - one) / (args.layers - 1)
                        alone = added("isolated", workload, variant, base, ISOLATED_CALLS)[0]
                        row.update(isolated_instr_per_call=alone, per_call_instr=each,
                                   per_forward_instr_per_call=(one - each) / args.layers,
                                   beyond_instr_per_call=each - alone,
                                   contributors=_contributors(by[("forward", workload, variant)],
                                                              by[("forward", workload, base)], args.layers))
                        if trace is not None:
                            row["python_calls_added_per_call"] = _python_added(trace, variant, base, workload)
                    out["rows"].append(row)
    out["enter_exit"] = enter_exit(totals, ipus, timing)
    step_figures(out, args.layers)
    return out


def step_figures(res: dict, layers: int) -> None:
    """Per attention call in a step as a user writes it, a context entered and left around each forward of
    ``layers`` calls, against ``sdpa_kernel`` entered and left around transformers' forward: the rows' added
    instructions and their share of the context (entering costs the same whatever the backend's name)."""
    ee, ipus = res.get("enter_exit") or {}, res.get("instructions_per_us")
    base = ee.get("sdpa_kernel([FLASH])")
    for row in res["rows"]:
        mine = ee.get(f"flash | {row['scope']}")
        if base and mine:
            row["step_added_instr_per_call"] = row["added_instr_per_call"] + (mine["instr"] - base["instr"]) / layers
            row["step_added_us_approx"] = row["step_added_instr_per_call"] / ipus["used"] if ipus else None


def enter_exit(totals: dict, ipus: dict | None, timing: dict | None) -> dict:
    """Per context made, entered and left: instructions (callgrind), ≈µs at the forwards' rate, and the thread's
    CPU µs natively (the fastest tenth of its samples, and the median), for ``backend()`` global and
    model-scoped and for ``sdpa_kernel`` beside them."""
    native = collections.defaultdict(list)
    for r in (timing or {}).get("rows", ()):
        if r["part"] == "enter-exit" and "error" not in r:
            native[r["variant"]] += [us / ENTER_EXIT for us in r["cpu_us"]]
    out = {}
    for label in ENTER_EXIT_VARIANTS:
        counts = totals.get(("enter-exit", "enter-exit", label))
        if not counts:
            continue
        instr = statistics.median(counts) / ENTER_EXIT
        row = {"instr": instr, "spread_instr": _half_iqr(counts) / ENTER_EXIT,
               "us_approx": instr / ipus["used"] if ipus else None}
        if native[label]:
            xs = sorted(native[label])
            row.update(cpu_us_p10=xs[int(0.1 * (len(xs) - 1))], cpu_us_median=statistics.median(xs))
        out[label] = row
    base = out.get("sdpa_kernel([FLASH])")
    for row in out.values():
        row["instr_ratio_vs_sdpa_kernel"] = row["instr"] / base["instr"] if base else None
    return out


def _instructions_per_us(per_fwd: dict, timing: dict | None) -> dict | None:
    """Callgrind's instructions per forward (median) over the native CPU time per forward, per variant;
    the median over variants is the conversion used. The CPU time taken is the fastest tenth's (10th
    percentile): on a busy machine the closest to an idle one; the median's conversion is given beside."""
    if timing is None:
        return None
    cpu = collections.defaultdict(list)
    wall = collections.defaultdict(list)
    for r in (r for r in timing["rows"] if "error" not in r and r["part"] == "forward"):
        cpu[(r["workload"], r["variant"])] += r["cpu_us"]
        wall[(r["workload"], r["variant"])] += r["wall_us"]

    def pct(xs, p):
        xs = sorted(xs)
        return xs[int(p * (len(xs) - 1))]

    fast = {k: statistics.median(per_fwd[k]) / pct(v, 0.1) for k, v in cpu.items() if k in per_fwd}
    mid = {k: statistics.median(per_fwd[k]) / statistics.median(v) for k, v in cpu.items() if k in per_fwd}
    name = " | ".join
    return {"used": statistics.median(fast.values()), "min": min(fast.values()), "max": max(fast.values()),
            "from_median_cpu_time": statistics.median(mid.values()),
            "per_variant": {name(k): v for k, v in fast.items()},
            "cpu_us_per_forward_p10": {name(k): pct(v, 0.1) for k, v in cpu.items()},
            "cpu_us_per_forward_median": {name(k): statistics.median(v) for k, v in cpu.items()},
            "wall_us_per_forward_median": {name(k): statistics.median(v) for k, v in wall.items()},
            "load_before": timing["load_before"], "load_after": timing["load"]}


def python_level(args, trace: dict) -> dict:
    """Without valgrind: the Python functions and builtins a switched forward runs per attention call beyond
    its baseline (``sys.setprofile``'s call events: deterministic, the same on any host)."""
    rows = []
    for workload in args.workloads:
        got = {r["variant"]: r for r in trace["rows"] if r["workload"] == workload and r["part"] == "forward"
               and "error" not in r}
        for b in args.backends:
            for scope in SCOPES:
                variant, base = f"{b} | {scope}", BASELINE_OF[b]
                if variant not in got or base not in got:
                    continue
                a, z = got[variant], got[base]
                added = (sum(a["python_calls"].values()) - sum(z["python_calls"].values())) / a["calls"]
                rows.append({"workload": workload, "backend": b, "scope": scope, "baseline": base,
                             "python_events_added_per_call": added,
                             "python_calls_added_per_call": _python_added(trace, variant, base, workload)})
    return {"python_level": rows, "trace": trace}


def render_python_level(res: dict, args) -> str:
    lines = [f"Python-level events (function and builtin calls) added per attention call inside forwards, "
             f"{args.layers}-layer Llama shape on {args.device}; no instruction counts (valgrind not run)"]
    for r in res["python_level"]:
        top = "; ".join(f"{fn} {n:+g}" for fn, n in r["python_calls_added_per_call"][:5])
        lines.append(f"{r['workload']:<8} {r['backend']:<14} {r['scope']:<13} vs {r['baseline']:<30} "
                     f"{r['python_events_added_per_call']:+6.2f}  ({top})")
    return "\n".join(lines)


# -- printing ---------------------------------------------------------------------------------------------

def render(res: dict, args) -> str:
    ip = res["instructions_per_us"]
    lines = [f"Instructions added per attention call inside forwards (callgrind), {args.layers}-layer Llama shape, "
             f"hidden {args.hidden}, {args.heads} q / {args.kv_heads} kv heads, fp32, CPU, 1 thread; "
             f"{args.forwards} forwards x {args.reps} repeats per variant"]
    if ip:
        lines.append(f"µs ≈ instructions / {ip['used']:.0f} per µs: approximate (this machine, these forwards run "
                     f"natively, the fastest tenth by the thread's CPU clock; {ip['min']:.0f}-{ip['max']:.0f} across "
                     f"variants; {ip['from_median_cpu_time']:.0f} from the median CPU time; load "
                     f"{ip['load_before'][0]:.1f} before, {ip['load_after'][0]:.1f} after, on {os.cpu_count()} CPUs)")
    head = f"{'workload':<8} {'backend':<14} {'against':<25} {'base/call':>10} " \
           f"{'+instr scoped':>13} {'+instr global':>13} {'≈µs scoped':>10} {'≈µs global':>10}"
    lines += ["", head, "-" * len(head)]
    rows = {(r["workload"], r["backend"], r["baseline"], r["scope"]): r for r in res["rows"]}
    for (w, b, base, scope), r in rows.items():
        if scope != "model-scoped":
            continue
        g = rows[(w, b, base, "global")]
        us = (lambda x: f"{x['added_us_approx']:>10.2f}") if ip else (lambda x: f"{'-':>10}")
        mark = "" if r["primary"] else "  (reference)"
        lines.append(f"{w:<8} {b:<14} {base:<25} {r['baseline_instr_per_call']:>10,.0f} "
                     f"{r['added_instr_per_call']:>13,.0f} {g['added_instr_per_call']:>13,.0f} {us(r)} {us(g)}{mark}")
    lines += ["", "Where the added instructions per call come from (against the first baseline): the forward's "
              "once-per-forward part over its calls and each call's own part (from a one-layer and the full "
              f"forward), the call alone (the entry inside a forward's selection, {ISOLATED_CALLS} calls in a row), "
              "and what a call in a forward pays beyond it alone; spread: a sample's distance from the median",
              f"{'workload':<8} {'backend':<14} {'scope':<13} {'in forward':>10} {'once/fwd':>9} {'each':>8} "
              f"{'alone':>8} {'beyond':>8} {'spread':>7}"]
    for r in res["rows"]:
        if r["primary"]:
            lines.append(f"{r['workload']:<8} {r['backend']:<14} {r['scope']:<13} {r['added_instr_per_call']:>10,.0f} "
                         f"{r['per_forward_instr_per_call']:>9,.0f} {r['per_call_instr']:>8,.0f} "
                         f"{r['isolated_instr_per_call']:>8,.0f} {r['beyond_instr_per_call']:>8,.0f} "
                         f"{r['sample_spread_instr_per_call']:>7,.0f}")
    if res.get("enter_exit"):
        lines += ["", f"A context made, entered and left ({ENTER_EXIT} in a row per sample): instructions, ≈µs at the "
                  "forwards' rate, the thread's CPU µs natively (fastest tenth / median), against sdpa_kernel",
                  f"{'':<22} {'instr':>9} {'x sdpa_kernel':>13} {'≈µs':>7} {'cpu µs p10':>10} {'median':>7}"]
        for label, r in res["enter_exit"].items():
            approx = f"{r['us_approx']:>7.2f}" if r.get("us_approx") is not None else f"{'-':>7}"
            native = (f"{r['cpu_us_p10']:>10.2f} {r['cpu_us_median']:>7.2f}" if "cpu_us_p10" in r
                      else f"{'-':>10} {'-':>7}")
            lines.append(f"{label:<22} {r['instr']:>9,.0f} {r['instr_ratio_vs_sdpa_kernel']:>13.2f} {approx} {native}")
    step = [r for r in res["rows"] if r["primary"] and "step_added_instr_per_call" in r]
    if step:
        lines += ["", f"Per attention call in a step: a context entered and left around each forward ({args.layers} "
                  "calls), against sdpa_kernel entered and left around transformers' forward",
                  f"{'workload':<8} {'backend':<14} {'scope':<13} {'+instr':>8} {'≈µs':>6}"]
        for r in step:
            us = f"{r['step_added_us_approx']:>6.2f}" if r.get("step_added_us_approx") is not None else f"{'-':>6}"
            lines.append(f"{r['workload']:<8} {r['backend']:<14} {r['scope']:<13} "
                         f"{r['step_added_instr_per_call']:>8,.0f} {us}")
    over = [r for r in res["rows"] if r["primary"] and ip and r["added_us_approx"] > TARGET_US]
    lines.append("")
    lines.append(f"over {TARGET_US:g} µs added per call: " + (", ".join(
        f"{r['workload']} {r['backend']} {r['scope']} ({r['added_us_approx']:.1f})" for r in over) or "none"))
    return "\n".join(lines)


def render_contributors(res: dict, k: int = 6) -> str:
    lines = []
    for r in res["rows"]:
        if not r["primary"]:
            continue
        c = r["contributors"]
        lines.append(f"\n{r['workload']} {r['backend']} {r['scope']}: +{r['added_instr_per_call']:,.0f} instr/call "
                     f"over {r['baseline']}")
        lines.append("  self cost added per call: " + "; ".join(f"{fn.split('(')[0][:60]} {v:+,}"
                                                               for fn, v in c["self_instr_per_call"][:k]))
        lines.append("  calls into (inclusive instr, calls) per call: " + "; ".join(
            f"{fn.split('(')[0][:60]} {v:+,} ({n:+g})" for fn, v, n in c["inclusive_instr_per_call"][:k]))
        if r.get("python_calls_added_per_call"):
            lines.append("  Python functions run per call, over the baseline: " + "; ".join(
                f"{fn} {n:+g}" for fn, n in r["python_calls_added_per_call"][:k]))
    return "\n".join(lines)


# -- the command ------------------------------------------------------------------------------------------

def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", help="write the figures as JSON here")
    p.add_argument("--backends", default=None, type=lambda s: s.split(","),
                   help=f"default: {', '.join(BACKENDS)} (on CUDA also efficient, cudnn)")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                   help="cuda: Python-level counts only (--no-callgrind), bf16")
    p.add_argument("--workloads", default="prefill,decode", type=lambda s: s.split(","))
    p.add_argument("--layers", type=int, default=16)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--q-len", type=int, default=16, help="prefill tokens, and the decode step's cache length")
    p.add_argument("--forwards", type=int, default=4, help="counted forwards per variant and repeat")
    p.add_argument("--reps", type=int, default=2, help="repeats of every variant under callgrind, interleaved")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--timed-forwards", type=int, default=200, help="natively timed forwards per variant")
    p.add_argument("--no-callgrind", action="store_true", help="skip the instruction counts (no valgrind here)")
    p.add_argument("--no-enter-exit", dest="enter_exit", action="store_false",
                   help="skip counting entering and leaving the switch")
    p.add_argument("--keep", help="keep callgrind's dumps in this directory")
    p.add_argument("--src", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"),
                   help="the attnswitch source tree to measure (default: this checkout's)")
    p.add_argument("--render", metavar="JSON", help="print the figures of a result written with --out; nothing else")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--mode", choices=("count", "time", "trace"), help=argparse.SUPPRESS)
    p.add_argument("--results", help=argparse.SUPPRESS)
    return p


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    if args.render:
        with open(args.render) as f:
            res = json.load(f)
        saved = argparse.Namespace(**res["config"])
        if "rows" in res:
            step_figures(res, saved.layers)
            print(render(res, saved))
            print(render_contributors(res))
        else:
            print(render_python_level(res, saved))
        return 0
    args.backends = args.backends or (CUDA_BACKENDS if args.device == "cuda" else BACKENDS)
    if args.worker:
        sys.path.insert(0, os.path.abspath(args.src))
        worker(args)
        return 0
    unknown = set(args.backends) - set(BASELINE_OF)
    if unknown:
        raise SystemExit(f"backends measured here: {', '.join(CUDA_BACKENDS)}; not {', '.join(sorted(unknown))}")
    out_dir = args.keep or tempfile.mkdtemp(prefix="host_cost.")
    os.makedirs(out_dir, exist_ok=True)
    try:
        trace = _native(args, out_dir, "trace")
        x86 = platform.machine().lower() in ("x86_64", "amd64")
        if args.no_callgrind or args.device != "cpu" or shutil.which("valgrind") is None or not x86:
            print("valgrind not run (--no-callgrind, a CUDA device, not installed, or not x86-64): Python-level "
                  "counts only", file=sys.stderr)
            res = python_level(args, trace)
            print(render_python_level(res, args))
        else:
            dumps = _callgrind(args, out_dir)
            timing = _native(args, out_dir, "time")
            res = compare(args, dumps, timing, trace)
            print(render(res, args))
            print(render_contributors(res))
        res["config"] = {k: v for k, v in vars(args).items() if k not in ("worker", "mode", "results")}
        res["env"] = ENV
        import attnswitch.env as env  # versions the figures were counted with

        res["versions"] = env.environment() if hasattr(env, "environment") else {}
        if args.out:
            with open(args.out, "w") as f:
                json.dump(res, f, indent=1, default=str)
    finally:
        if not args.keep:
            shutil.rmtree(out_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
