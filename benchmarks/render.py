"""Markdown tables from a results folder: ``python -m benchmarks.render benchmarks/results/h200``."""

import json
import sys
from pathlib import Path

from .suite import POST_A100


def _load(d: Path, name: str):
    p = d / f"{name}.json"
    return json.loads(p.read_text()) if p.exists() else None


def _f(x, digits=1):
    return "-" if x is None else f"{x:,.{digits}f}"


def attention_table(doc, with_post: bool) -> str:
    r = doc["result"]
    s = r["shape"]
    lines = [f"B{s['batch']} H{s['heads']} S{s['seq']} D{s['head_dim']} {s['dtype']} causal, "
             f"{r['flops_per_call'] / 1e9:.1f} GFLOP per call", "",
             "| backend | GPU µs/call | TFLOP/s | % of matmul rate | host µs/call | kernels | memcpys | memsets | "
             "occupancy (recomputed / profiler) | launched by |" + (" post's A100 µs |" if with_post else ""),
             "|---|---|---|---|---|---|---|---|---|---|" + ("---|" if with_post else "")]
    for name, b in r["backends"].items():
        if b["status"] != "ok":
            lines.append(f"| {name} | {b['status']} | | | | | | | | |" + (" |" if with_post else ""))
            continue
        occ = "; ".join(f"{k['occupancy_pct']}% ({k['occupancy_limiter']}) / {k['profiler_occupancy_pct']}%"
                        for k in b["kernel_details"][:2] if k.get("occupancy_pct") is not None)
        post = POST_A100.get(name, {})
        post_txt = ("~" if post.get("approximate") else "") + _f(post.get("gpu_us")) if post else "-"
        if post.get("host_us"):
            post_txt += f" (host {post['host_us']:.0f})"
        lines.append(f"| {name} | {_f(b['gpu_us'])} | {_f(b['tflops'])} | {_f(b.get('pct_of_matmul_rate'))} | "
                     f"{_f(b['host_us'])} | {b['kernels']:.0f} | {b['memcpys']:.0f} | {b['memsets']:.0f} | {occ} | "
                     f"{', '.join(b['launch_apis'])} |" + (f" {post_txt} |" if with_post else ""))
    return "\n".join(lines)


def main(folder: str) -> None:
    d = Path(folder)
    env = (_load(d, "post_experiment") or {}).get("environment", {})
    print(f"GPU {env.get('gpu')}, driver {env.get('driver')}, CUDA {env.get('cuda')}, cuDNN {env.get('cudnn')}, "
          f"torch {env.get('torch')}, transformers {env.get('transformers')}\n")
    c = _load(d, "ceilings")
    if c:
        print(f"Measured ceilings: bf16 matmul {c['result']['bf16_matmul_tflops']:.0f} TFLOP/s "
              f"(n={c['result']['matmul_n']}), device copy {c['result']['copy_tb_per_s']:.2f} TB/s\n")
    for name, post in (("post_experiment", True), ("ceiling_shape", False)):
        doc = _load(d, name)
        if doc:
            print(f"### {name}\n\n{attention_table(doc, post)}\n")
    so = _load(d, "switch_overhead")
    if so:
        r = so["result"]
        print(f"### switch_overhead\n\n{r['model']}, {r['layers']} layers, batch {r['batch']}, seq {r['seq']}, "
              f"{r['dtype']}; {r['rounds']} interleaved rounds of {r['per_round']} forwards\n")
        print("| backend | variant | GPU ms/fwd | ratio vs sdpa_kernel | noise % | host ms/fwd |")
        print("|---|---|---|---|---|---|")
        for b, row in r["backends"].items():
            for k, v in row.items():
                print(f"| {b} | {k} | {v['time_ms']:.3f} | {v['gpu_ratio_vs_sdpa_kernel']:.4f} | "
                      f"{_f(v['noise_pct'], 2)} | {v['host_ms']:.2f} |")
        m = r["dispatch_micro"]
        print(f"\nHost µs per attention call ({m['backend']}, device idle before each call):\n")
        print("| path | µs |\n|---|---|")
        for k, v in m["median_host_us"].items():
            print(f"| {k} | {v:.1f} |")
        print()
    pf = _load(d, "profiler_fidelity")
    if pf:
        print("### profiler_fidelity\n")
        print("| model | backend | CUDA events ms/fwd | profiled busy ms | busy vs events | profiled span ms | "
              "span vs events | trace events | processing s | profiled run s |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        for k, v in pf["result"].items():
            for n, b in v["backends"].items():
                print(f"| {k} | {n} | {b['cuda_event_ms']:.2f} | {b['profiled_busy_ms']:.2f} | "
                      f"{b['busy_vs_events_pct']:+.1f}% | {b['profiled_span_ms']:.2f} | "
                      f"{b['span_vs_events_pct']:+.1f}% | "
                      f"{b['trace_events']:,} | {b['trace_processing_s']:.2f} | {b['profiled_run_s']:.2f} |")
        print()
    pl = _load(d, "posts_findings_per_layer")
    if pl:
        r = pl["result"]
        print(f"### posts_findings_per_layer\n\n{r['model']}, batch {r['batch']}, seq {r['seq']}\n")
        print("| backend | kernels / attention call | memcpys / call | memsets / call | GPU µs / call | launched by | "
              "notes |\n|---|---|---|---|---|---|---|")
        for n, b in r["backends"].items():
            if b["status"] != "ok":
                print(f"| {n} | {b['status']} | | | | | |")
                continue
            ms = b["attention_rows"][0]["memsets"] if b["attention_rows"] else 0
            print(f"| {n} | {b['attn_kernels_per_call']:.0f} | {b['attn_memcpys_per_call']:.0f} | {ms:.0f} | "
                  f"{b['attn_gpu_us_per_call']:.1f} | {', '.join(b['launch_apis'])} | {'; '.join(b['notes'])} |")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "benchmarks/results/h200")
