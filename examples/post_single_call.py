"""The single-call experiment of "Profiling in PyTorch (Part 3): Attention is all you profile", with
attnswitch: one causal attention call (batch 8, 16 heads, 1024 tokens, head dim 64, bf16) under every
backend, profiled: kernels, memcpys, memsets, host and GPU time per call.

    python examples/post_single_call.py            # the post's shape on a GPU
    python examples/post_single_call.py --small    # a small float32 shape that runs on a CPU
"""

import argparse

import torch

import attnswitch

p = argparse.ArgumentParser()
p.add_argument("--small", action="store_true", help="batch 2, 4 heads, 128 tokens, float32 (CPU-sized)")
args = p.parse_args()

cuda = torch.cuda.is_available()
device = "cuda" if cuda else "cpu"
if args.small or not cuda:
    shape, dtype = (2, 4, 128, 64), torch.float32
else:
    shape, dtype = (8, 16, 1024, 64), torch.bfloat16
q, k, v = (torch.randn(*shape, device=device, dtype=dtype) for _ in range(3))

report = attnswitch.profile(lambda: attnswitch.attention(q, k, v, is_causal=True),
                            backends=["naive", "naive-inplace", "math", "efficient", "flash", "cudnn"],
                            warmup=3, iters=10)
report.render(layers=False)
for b in report.ok:
    print(f"{b.backend:>14}: ops {', '.join(op for op in b.attn_ops if op.startswith('aten::_') or 'masked' in op)}")
