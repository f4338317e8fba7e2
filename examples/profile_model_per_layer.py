"""Profile a transformers model per layer under a few attention backends: which kernels, memcpys and
host time each layer's attention call costs.

    python examples/profile_model_per_layer.py                       # tiny Llama on a CPU, Llama-3.2-1B shape on a GPU
    python examples/profile_model_per_layer.py --model gpt2 --seq 256
"""

import argparse

import torch

import attnswitch
from attnswitch.models import default_preset, load_model
from attnswitch.workload import make_workload

p = argparse.ArgumentParser()
p.add_argument("--model", default=None, help="a preset, a local folder or a config.json")
p.add_argument("--seq", type=int, default=None)
p.add_argument("--layers", type=int, default=None)
args = p.parse_args()

device = "cuda" if torch.cuda.is_available() else "cpu"
model, about = load_model(args.model or default_preset(device), device=device,
                          dtype="bf16" if device == "cuda" else "fp32", layers=args.layers)
batch = make_workload(model, batch=2, seq=args.seq or (1024 if device == "cuda" else 64))
print(about, "·", batch.description)

backends = ["naive", "naive-inplace", "math", "flash"] + (["efficient", "cudnn"] if device == "cuda" else [])
report = attnswitch.profile(model, batch, backends=backends, warmup=2, iters=3)
report.render(layers=True, fold=True)  # repeated layers folded: model.layers.*.self_attn ×N
