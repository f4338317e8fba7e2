"""Proof on several GPUs: one model compared on one GPU, spread by accelerate's device_map, and sharded
by tensor parallelism under torchrun (one rank per GPU), with the checks the reports must pass.

``python benchmarks/multi_gpu.py OUT [--preset llama-3.2-1b] [--iters 5] [--gpus N]`` writes ``OUT/{single,
device_map,tp}/report.*`` and ``OUT/multi_gpu_check.json``: per backend and attention layer, the
attention kernels per call in each mode (they must be equal); per GPU and rank, the report's totals
against that GPU's raw profiler events; and the steady time per forward of each mode side by side.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from attnswitch.env import environment
from attnswitch.profiling.attribution import device_totals
from attnswitch.profiling.trace import Trace
from attnswitch.results import Report


def _run(cmd: list[str], log: Path, timeout: int) -> float:
    t0 = time.perf_counter()
    with open(log, "w") as f:
        p = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, timeout=timeout)
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({p.returncode}); see {log}")
    return time.perf_counter() - t0


def _attn(report: Report, backend: str, rank=None) -> dict[str, float]:
    return {l.path: l.kernels / l.calls for l in report[backend].layers
            if l.kind == "attention" and (rank is None or l.rank == rank)}


def _raw_totals(trace_file: Path, device: int) -> dict:
    trace = Trace.load(trace_file)
    tot = [t for t in device_totals(trace) if t.device == device]
    n = len(trace.steps())
    return {"kernels": sum(t.kernels for t in tot) / n, "memcpys": sum(t.memcpys for t in tot) / n,
            "comm_kernels": sum(t.comm_kernels for t in tot) / n,
            "gpu_busy_ms": sum(t.gpu_busy_us for t in tot) / n / 1e3}


def check(out: Path, gpus: int) -> dict:
    single, dm, tp = (Report.from_json(out / m / "report.json") for m in ("single", "device_map", "tp"))
    result: dict = {"environment": environment(), "distribution": {"device_map": dm.distribution,
                                                                   "tp": tp.distribution}, "backends": {}}
    ok = True
    for b in single.ok:
        name = b.backend
        if name == "eager":
            continue
        row: dict = {}
        ref = _attn(single, name)
        row["attn_kernels_per_call_single"] = sorted(set(ref.values()))
        row["device_map_equal"] = dm[name].ok and _attn(dm, name) == ref
        row["tp_equal_per_rank"] = tp[name].ok and all(_attn(tp, name, r) == ref for r in range(gpus))
        row["device_map_devices"] = sorted({d for l in dm[name].layers for d in l.devices})
        row["time_ms"] = {"single": b.time_ms, "device_map": dm[name].time_ms, "tp": tp[name].time_ms}
        row["tp_rank_time_ms"] = {d.rank: d.time_ms for d in tp[name].devices}
        row["transfers"] = [t.__dict__ for t in dm[name].transfers]
        row["comm_per_layer"] = {l.path: l.comm_kernels / l.calls for l in tp[name].layers
                                 if l.rank == 0 and l.comm_kernels and l.calls}
        checks = []
        for mode, rep in (("device_map", dm), ("tp", tp)):
            r = rep[name]
            if not r.ok:
                continue
            traces = {Path(p).name: Path(p) for p in [r.trace_path, *r.rank_trace_paths] if p}
            for d in r.devices:
                if mode == "tp":
                    f = next(p for n, p in traces.items() if f"_rank{d.rank}." in n)
                else:
                    f = next(iter(traces.values()))
                raw = _raw_totals(out / mode / "traces" / f.name, d.device)
                rep_vals = {"kernels": d.kernels, "memcpys": d.memcpys, "comm_kernels": d.comm_kernels,
                            "gpu_busy_ms": d.gpu_busy_ms}
                same = all(abs(rep_vals[k] - raw[k]) <= 1e-6 * max(1.0, abs(raw[k])) for k in raw)
                checks.append({"mode": mode, "rank": d.rank, "device": d.device, "report": rep_vals, "raw": raw,
                               "equal": same})
        row["totals_vs_raw_events"] = checks
        row["all_equal"] = (row["device_map_equal"] and row["tp_equal_per_rank"]
                            and all(c["equal"] for c in checks))
        ok &= row["all_equal"]
        result["backends"][name] = row
    result["all_checks_pass"] = ok
    return result


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--preset", default="llama-3.2-1b")
    ap.add_argument("--iters", default="5")
    ap.add_argument("--timeout", type=int, default=200)
    ap.add_argument("--gpus", type=int, default=None, help="GPUs to spread over (default: all visible)")
    a = ap.parse_args()
    import torch

    gpus = a.gpus or torch.cuda.device_count() or 2
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    common = ["compare", a.preset, "--iters", a.iters]
    me = [sys.executable, "-m", "attnswitch"]
    walls = {
        "single": _run(me + common + ["--out", str(out / "single")], out / "single.log", a.timeout),
        "device_map": _run(me + common + ["--device-map", "auto", "--out", str(out / "device_map")],
                           out / "device_map.log", a.timeout),
        "tp": _run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(gpus), "-m", "attnswitch"]
                   + common + ["--tp", "--out", str(out / "tp")], out / "tp.log", a.timeout),
    }
    result = check(out, gpus)
    result["gpus"], result["wall_seconds"] = gpus, walls
    (out / "multi_gpu_check.json").write_text(json.dumps(result, indent=1, default=str))
    for name, row in result["backends"].items():
        t = row["time_ms"]
        print(f"{name:>14}: attn kernels/call {row['attn_kernels_per_call_single']} equal: device_map "
              f"{row['device_map_equal']}, tp {row['tp_equal_per_rank']}; totals=raw "
              f"{all(c['equal'] for c in row['totals_vs_raw_events'])}; time ms single {t['single']:.2f} "
              f"device_map {t['device_map']:.2f} tp {t['tp']:.2f}")
    print("all checks pass:", result["all_checks_pass"])


if __name__ == "__main__":
    main()
