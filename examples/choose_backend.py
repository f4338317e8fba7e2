"""Choose an attention backend before deployment: every backend on the same inputs, numerics checked
against eager float32, ranked, with a recommendation and a report folder.

    python examples/choose_backend.py --out report/              # default preset for this device
    python examples/choose_backend.py --model qwen2.5-0.5b --padding
"""

import argparse

import torch

import attnswitch
from attnswitch.models import default_preset, load_model
from attnswitch.workload import make_workload

p = argparse.ArgumentParser()
p.add_argument("--model", default=None)
p.add_argument("--seq", type=int, default=None)
p.add_argument("--layers", type=int, default=None)
p.add_argument("--padding", action="store_true")
p.add_argument("--out", default=None)
args = p.parse_args()

device = "cuda" if torch.cuda.is_available() else "cpu"
model, about = load_model(args.model or default_preset(device), device=device,
                          dtype="bf16" if device == "cuda" else "fp32", layers=args.layers)
batch = make_workload(model, batch=4 if device == "cuda" else 2, seq=args.seq or (2048 if device == "cuda" else 64),
                      padding=args.padding)
report = attnswitch.compare(model, batch, warmup=2, iters=6, model_name=args.model or about)
report.render(layers=False)
if args.out:
    from pathlib import Path

    Path(args.out).mkdir(parents=True, exist_ok=True)
    report.to_json(Path(args.out) / "report.json")
    report.write_html(Path(args.out) / "report.html")
    print("wrote", args.out)

# the choice, applied: deploy with the recommended backend for as long as the process runs
if report.ranking:
    attnswitch.patch(model, report.ranking[0])
    with torch.no_grad():
        model(**batch.first())
    print("patched with", attnswitch.is_patched(model))
    attnswitch.unpatch(model)
