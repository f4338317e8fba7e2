"""Choose an attention backend for a model spread over several GPUs, on the engine that will serve it.

    python examples/larger_than_one_gpu.py --device-map auto           # one process; accelerate spreads the layers
    torchrun --nproc-per-node 2 examples/larger_than_one_gpu.py --tp   # tensor parallel, one process per GPU

Without GPUs, --tp runs over gloo on CPU processes and --device-map keeps the model on the CPU.
"""

import argparse

import torch

import attnswitch
from attnswitch.dist import is_main
from attnswitch.models import default_preset, load_model
from attnswitch.render.sections import device_table, distribution_text, transfer_table
from attnswitch.workload import make_workload

p = argparse.ArgumentParser()
p.add_argument("--model", default=None, help="a preset or a local checkpoint folder")
p.add_argument("--device-map", default=None)
p.add_argument("--tp", action="store_true")
p.add_argument("--seq", type=int, default=None)
p.add_argument("--layers", type=int, default=None)
args = p.parse_args()

gpu = torch.cuda.is_available()
spec = args.model or default_preset("cuda" if gpu else "cpu")
model, about = load_model(spec, dtype="bf16" if gpu else "fp32", layers=args.layers,
                          device_map=args.device_map, tp=args.tp)
batch = make_workload(model, batch=4 if gpu else 1, seq=args.seq or (2048 if gpu else 32))
# every rank runs the same forwards (they hold collectives); the merged report is on every rank
report = attnswitch.compare(model, batch, backends="naive,flash,cudnn,auto" if gpu else "naive,flash,auto",
                            warmup=1, iters=4, model_name=spec)
if is_main():
    print(about)
    print(distribution_text(report) or "one device: nothing to spread")
    report.render(layers=False)
    best = report.ranking[0] if report.ranking else None
    for b in report.ok:
        if b.backend != best:
            continue
        # where the time goes on each GPU, and what crosses between them
        for row in device_table(report, best).rows:
            print("GPU row:", " | ".join(row))
        for row in transfer_table(report, best).rows:
            print("copy:", " | ".join(row))
        comm = sorted({l.path for l in b.layers if l.comm_kernels or l.comm_ops})
        print("layers issuing collectives:", ", ".join(comm) or "none")
if args.tp:
    torch.distributed.destroy_process_group()
