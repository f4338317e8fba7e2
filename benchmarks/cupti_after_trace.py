"""A step's time before and after one profiled step, with Kineto's CUPTI teardown off (its default) and on.

    python benchmarks/cupti_after_trace.py        # a GPU: two processes, about a minute on an H200

A Qwen3-shaped model (6 layers, hidden 2048, 16 query and 8 key-value heads of 128, bf16), training steps at
B2 S2048 (forward with labels, backward, ``zero_grad(set_to_none=True)``) under SDPA's flash kernel, in blocks
of 5 steps back to back between two CUDA events: per step, its device time and the host's time to return
from it (medians of 6 blocks). Then one step traced by ``torch.profiler`` (CPU and CUDA, after a warm-up step,
as attnswitch's profiled pass does), and the blocks again, right after and 2 s later. Run in one process
started without ``TEARDOWN_CUPTI`` (Kineto leaves CUPTI attached after a trace) and one with
``TEARDOWN_CUPTI=1`` (it detaches it).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time

__all__ = ["main"]


def _measure(tag: str) -> None:
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    config = Qwen3Config(hidden_size=2048, intermediate_size=6144, num_hidden_layers=6, num_attention_heads=16,
                         num_key_value_heads=8, head_dim=128, vocab_size=32000, max_position_embeddings=4096)
    model = Qwen3ForCausalLM(config).to("cuda", torch.bfloat16).train()
    ids = torch.randint(0, 32000, (2, 2048), device="cuda")
    kw = dict(input_ids=ids, attention_mask=torch.ones_like(ids), labels=ids)

    def step():
        model(**kw).loss.backward()
        model.zero_grad(set_to_none=True)

    def blocks(when: str, n_blocks: int = 6, n: int = 5) -> None:
        device, host = [], []
        for _ in range(n_blocks):
            torch.cuda.synchronize()
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            h = []
            for _ in range(n):
                t = time.perf_counter()
                step()
                h.append(time.perf_counter() - t)
            b.record()
            b.synchronize()
            device.append(a.elapsed_time(b) / n)
            host.append(statistics.median(h) * 1e3)
        print(f"{tag} {when}: step {statistics.median(device):.2f} ms, host {statistics.median(host):.2f} ms",
              flush=True)

    def profiled() -> None:
        acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
        schedule = torch.profiler.schedule(wait=0, warmup=1, active=1, repeat=1)
        with torch.profiler.profile(activities=acts, schedule=schedule) as p:
            for _ in range(2):
                step()
                torch.cuda.synchronize()
                p.step()

    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        blocks("warm", 2)
        blocks("before")
        profiled()
        blocks("after profile")
        blocks("after profile 2")
        time.sleep(2)
        blocks("after 2s")


def main(argv=None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "--measure":
        _measure(args[1])
        return 0
    env = {k: v for k, v in os.environ.items() if k != "TEARDOWN_CUPTI"}
    rc = 0
    for tag, extra in (("attached", {}), ("teardown", {"TEARDOWN_CUPTI": "1"})):
        rc |= subprocess.run([sys.executable, __file__, "--measure", tag], env={**env, **extra}).returncode
    return rc


if __name__ == "__main__":
    sys.exit(main())
