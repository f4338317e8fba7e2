"""What ``attnswitch compare`` pays before it measures: its imports, and, on a GPU, flex's first compile.

    python benchmarks/startup.py                 # imports: 3 fresh processes, the median; 20-40 s on a CPU
    python benchmarks/startup.py --runs 5        # more processes
    python benchmarks/startup.py --no-flex       # on a GPU, the imports alone
    python benchmarks/startup.py --json OUT.json

**Imports.** Each run is a fresh interpreter that imports what the command imports, in its order, one
group after another, each group timed by the wall clock and by the process's CPU time (which other
processes on a busy machine stretch far less): ``attnswitch.cli`` (argument parsing: no torch),
torch, transformers (and the model classes of the default preset), the rest of attnswitch's measuring
path (``attnswitch.comparison`` and what ``_setup`` imports), rich (the console), matplotlib (the plots of
``report.html``, imported where ``--out`` writes it). Then the modules that cost the most (``-X importtime``
self time, median over the runs) and, for each heavy package, the chain that first imported it.

**flex's first compile** (CUDA only). In a fresh process, as the command runs it
(``TORCHINDUCTOR_COMPILE_THREADS=1``): one FlexAttention call of the default GPU run's shape (Llama-3.2-1B:
batch 4, 2048 tokens, 32 query and 8 key/value heads of 64, bf16, causal, no grad), timed cold (imports of
the compile stack, Dynamo, inductor, Triton: the compile) and warm; Dynamo's own account of its phases;
once with empty inductor and Triton caches, once with the caches the first run left (a machine that ran
the command before).

Results print as text; ``--json`` also writes them.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

#: the import groups, in the order ``attnswitch compare`` meets them
GROUPS = [
    ("attnswitch.cli", "import attnswitch.cli"),
    ("torch", "import torch"),
    ("transformers", "import transformers\n"
                     "from transformers import LlamaConfig, LlamaForCausalLM, AutoModelForCausalLM\n"
                     "import transformers.models.llama.modeling_llama"),
    ("attnswitch (measuring)", "from attnswitch.backends import parse_backends\n"
                               "from attnswitch.device import parse_device\n"
                               "from attnswitch.models import load_model\n"
                               "from attnswitch.workload import make_workload\n"
                               "from attnswitch.comparison import compare\n"
                               "from attnswitch import dist, deploy"),
    ("rich", "import rich.console, rich.table, rich.text"),
    ("matplotlib (report.html)", "import matplotlib\nmatplotlib.use('Agg')\nimport matplotlib.figure\n"
                                 "from matplotlib.backends.backend_agg import FigureCanvasAgg"),
]

_GROUPED = """
import json, sys, time
out = []
t_all, c_all = time.perf_counter(), time.process_time()
for name, code in {groups!r}:
    t0, c0 = time.perf_counter(), time.process_time()
    exec(code, {{}})
    out.append((name, [time.perf_counter() - t0, time.process_time() - c0]))
out.append(("total", [time.perf_counter() - t_all, time.process_time() - c_all]))
print("RESULT " + json.dumps(out), file=sys.stderr)
"""

_FLEX = """
import json, os, sys, time
t0 = time.perf_counter()
import torch
import attnswitch
dev, (b, hq, hkv, s, d) = {device!r}, {shape!r}
out = {{"import torch, attnswitch": time.perf_counter() - t0}}
dtype = torch.bfloat16 if dev == "cuda" else torch.float32
q = torch.randn(b, hq, s, d, device=dev, dtype=dtype)
k, v = (torch.randn(b, hkv, s, d, device=dev, dtype=dtype) for _ in range(2))
sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
sync()
t0 = time.perf_counter()
import torch._dynamo, torch._inductor.compile_fx  # the compile stack, alone
if dev == "cuda":
    import triton.compiler
out["import the compile stack"] = time.perf_counter() - t0
# (a CPU, which attnswitch gives no flex, calls its kernel function itself: a smoke test of this script)
from attnswitch.backends.flex import flex_sdpa
with torch.no_grad():
    for what in ("first call (compile)", "second call"):
        t0 = time.perf_counter()
        if dev == "cuda":
            attnswitch.attention(q, k, v, is_causal=True, enable_gqa=hq != hkv, backend="flex")
        else:
            flex_sdpa(q, k, v, is_causal=True, enable_gqa=hq != hkv)
        sync()
        out[what] = time.perf_counter() - t0
from torch._dynamo.utils import compile_times, counters
names, values = compile_times(repr="csv", aggregate=True)
out["dynamo's phases (s)"] = {{n: round(float(v), 3) for n, v in zip(names, values)}}
out["graphs compiled"] = counters["stats"]["unique_graphs"]
print("RESULT " + json.dumps(out), file=sys.stderr)
"""

#: flex inside the default GPU run: the Llama-3.2-1B preset, its workload, flex and cudnn compared (numerics
#: included: they run flex again), with what flex's cold step took and how many graphs Dynamo compiled
_FLEX_IN_COMPARE = """
import json, sys, time
import torch
import attnswitch
from attnswitch.models import load_model
from attnswitch.workload import make_workload
from torch._dynamo.utils import compile_times, counters
dev, preset, (b, s) = {device!r}, {preset!r}, {work!r}
m, _ = load_model(preset, dtype=torch.bfloat16 if dev == "cuda" else torch.float32, device=dev)
w = make_workload(m, batch=b, seq=s)
backends = ["flex", "cudnn"] if dev == "cuda" else ["flex"]
t0 = time.perf_counter()
r = attnswitch.compare(m, w, backends=backends)
out = {{"compare (s)": time.perf_counter() - t0, "flex's cold step (ms)": r["flex"].cold_host_ms,
        "flex's steady step, host (ms)": r["flex"].host_ms, "graphs compiled": counters["stats"]["unique_graphs"],
        "compare's own account (s)": r.settings["time_s"]}}
names, values = compile_times(repr="csv", aggregate=True)
out["dynamo's phases (s)"] = {{n: round(float(v), 3) for n, v in zip(names, values)}}
print("RESULT " + json.dumps(out), file=sys.stderr)
"""


def _python(code: str, env: dict | None = None, importtime: bool = False) -> tuple[dict | list, str]:
    args = [sys.executable] + (["-X", "importtime"] if importtime else []) + ["-c", code]
    p = subprocess.run(args, capture_output=True, text=True, env={**os.environ, **(env or {})}, timeout=600)
    found = [line for line in p.stderr.splitlines() if line.startswith("RESULT ")]
    if p.returncode or not found:
        raise RuntimeError(f"the measuring process failed (exit {p.returncode}):\n{p.stderr[-3000:]}")
    return json.loads(found[-1][len("RESULT "):]), p.stderr


def _importtime(stderr: str) -> list[tuple[int, int, int, str]]:
    """``(self µs, cumulative µs, depth, module)`` per line of ``-X importtime``'s output, in its order."""
    rows = []
    for line in stderr.splitlines():
        m = re.match(r"import time:\s+(\d+) \|\s+(\d+) \|( *)(\S+)", line)
        if m:
            rows.append((int(m[1]), int(m[2]), len(m[3]) // 2, m[4]))
    return rows


def _chain(rows, i: int) -> str:
    """Who imported ``rows[i]``: the enclosing imports, innermost first (importtime prints children first)."""
    names, depth = [rows[i][3]], rows[i][2]
    for j in range(i + 1, len(rows)):
        if rows[j][2] < depth:
            names.append(rows[j][3])
            depth = rows[j][2]
    return " <- ".join(names[:7])


HEAVY = ("torch", "transformers", "sympy", "accelerate", "jinja2", "matplotlib", "rich", "numpy", "torch._dynamo",
         "torch._inductor", "triton", "torch.distributed.tensor", "huggingface_hub", "PIL", "safetensors")


def imports(runs: int) -> dict:
    env = {"PYTHONDONTWRITEBYTECODE": ""}  # (compiled bytecode written once, read after: as an installed package)
    _python("import sys, attnswitch.comparison, attnswitch.models, attnswitch.cli; print('RESULT []', file=sys.stderr)",
            env)
    groups, selves, chains = [], {}, {}
    for _ in range(runs):
        result, stderr = _python(_GROUPED.format(groups=GROUPS), env, importtime=True)
        groups.append(dict(result))
        rows = _importtime(stderr)
        for i, (own, _, _, name) in enumerate(rows):
            selves.setdefault(name, []).append(own / 1e6)
            chains.setdefault(name, _chain(rows, i))
    median = {name: [statistics.median(g[name][i] for g in groups) for i in (0, 1)] for name in groups[0]}
    top = sorted(((statistics.median(v), k) for k, v in selves.items()), reverse=True)[:20]
    chains = {k: v for k, v in chains.items() if k in HEAVY or k in {name for _, name in top}}
    by_package: dict[str, float] = {}
    for name, v in selves.items():
        by_package[name.split(".")[0]] = by_package.get(name.split(".")[0], 0.0) + statistics.median(v)
    return {"runs": runs, "groups_s": median, "slowest_modules_self_s": [(k, round(v, 4)) for v, k in top],
            "by_package_s": dict(sorted(by_package.items(), key=lambda kv: -kv[1])[:15]),
            "first_imported_by": chains}


#: the default GPU run's shapes: (batch, query heads, key/value heads, tokens, head dim) of one attention call
#: of the Llama-3.2-1B preset at batch 4 and 2048 tokens; a CPU's smoke test (``--flex-on-cpu``) takes small ones
SHAPES = {"cuda": (4, 32, 8, 2048, 64), "cpu": (1, 4, 2, 64, 16)}
WORK = {"cuda": ("llama-3.2-1b", (4, 2048))}


def flex_compile(device: str) -> dict:
    """flex's first call alone, with empty caches then with the first run's; then flex in a compare."""
    out = {}
    with tempfile.TemporaryDirectory() as d:
        env = {"TORCHINDUCTOR_COMPILE_THREADS": "1", "TORCHINDUCTOR_CACHE_DIR": str(Path(d) / "inductor"),
               "TRITON_CACHE_DIR": str(Path(d) / "triton")}
        code = _FLEX.format(device=device, shape=SHAPES[device])
        out["one call, empty caches"], _ = _python(code, env)
        out["one call, the caches of the run before"], _ = _python(code, env)
        if device == "cuda":  # (attnswitch offers flex on CUDA only)
            preset, work = WORK[device]
            fresh = {"TORCHINDUCTOR_CACHE_DIR": str(Path(d) / "inductor2"),
                     "TRITON_CACHE_DIR": str(Path(d) / "triton2")}
            out["in a compare, empty caches"], _ = _python(
                _FLEX_IN_COMPARE.format(device=device, preset=preset, work=work), {**env, **fresh})
    return out


def _print(results: dict) -> None:
    imp = results["imports"]
    print(f"imports of `attnswitch compare`, median of {imp['runs']} fresh processes (s):")
    print(f"  {'':28s} {'wall':>7s} {'CPU':>7s}")
    for name, (wall, cpu) in imp["groups_s"].items():
        print(f"  {name:28s} {wall:7.3f} {cpu:7.3f}")
    print("by package (self time, s):  " + ", ".join(f"{k} {v:.2f}" for k, v in imp["by_package_s"].items()))
    print("slowest modules (self time, s):")
    for name, s in imp["slowest_modules_self_s"]:
        print(f"  {s:7.3f}  {name}")
    print("first imported by:")
    for name, chain in imp["first_imported_by"].items():
        print(f"  {name}: {chain}")
    for case, figures in results.get("flex", {}).items():
        print(f"flex's first compile, {case} (s):")
        for k, v in figures.items():
            print(f"  {k:32s} {v if isinstance(v, dict) else round(v, 3)}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--no-flex", action="store_true")
    p.add_argument("--flex-on-cpu", action="store_true", help="flex's compile of a small call on the CPU (minutes)")
    p.add_argument("--json")
    args = p.parse_args(argv)
    results = {"python": sys.version.split()[0], "load_average_before": os.getloadavg()[0],
               "imports": imports(args.runs)}
    import torch

    if (torch.cuda.is_available() or args.flex_on_cpu) and not args.no_flex:
        results["flex"] = flex_compile("cuda" if torch.cuda.is_available() else "cpu")
    results["load_average_after"] = os.getloadavg()[0]
    _print(results)
    print(f"load average {results['load_average_before']:.1f} before, {results['load_average_after']:.1f} after "
          f"({os.cpu_count()} CPUs)")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
