"""Record the small real GPU traces that the CPU test suite parses (tests/data/).

``python benchmarks/record_traces.py DIR``: a 2-layer Llama with GQA (bf16, batch 1, 64 tokens), one
profiled forward per backend, each trace gzipped as ``llama2l_<backend>.json.gz``.

``python benchmarks/record_traces.py DIR --multi-gpu`` (two GPUs): the 4-layer tiny Llama spread
over both GPUs, once by a ``device_map`` (layers 0-1 on GPU 0, the rest on GPU 1:
``dm_<backend>.json.gz``) and once by tensor parallelism under torchrun (``tp_<backend>_rank<r>.json.gz``),
with their reports.
"""

import gzip
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import attnswitch
from attnswitch.models import load_model
from attnswitch.workload import make_workload

MULTI_BACKENDS = ["naive", "flash", "cudnn"]
# layers 0-1 on GPU 0, layers 2-3 and the head on GPU 1: one boundary inside the layer stack
DEVICE_MAP = {"model.embed_tokens": 0, "model.rotary_emb": 0, "model.layers.0": 0, "model.layers.1": 0,
              "model.layers.2": 1, "model.layers.3": 1, "model.norm": 1, "lm_head": 1}


def _gz(src, dest) -> None:
    src = Path(src)
    if src.suffix == ".gz":
        shutil.copyfile(src, dest)
        return
    with open(src, "rb") as f, gzip.open(dest, "wb") as g:
        shutil.copyfileobj(f, g)


def single(out_dir: Path) -> None:
    model, _ = load_model("tiny-llama", dtype="bf16", device="cuda", layers=2)
    work = make_workload(model, batch=1, seq=64)
    tmp = tempfile.mkdtemp()
    rep = attnswitch.profile(model, work, backends=["naive", "naive-inplace", "math", "efficient", "flash", "cudnn",
                                                    "auto"], warmup=1, iters=1, trace_dir=tmp)
    for b in rep.ok:
        _gz(b.trace_path, out_dir / f"llama2l_{b.backend}.json.gz")
    rep.to_json(out_dir / "llama2l_report.json")
    print("recorded", [b.backend for b in rep.ok])


def device_map(out_dir: Path) -> None:
    model, desc = load_model("tiny-llama", dtype="bf16", device_map=DEVICE_MAP)
    work = make_workload(model, batch=2, seq=64)
    tmp = tempfile.mkdtemp()
    rep = attnswitch.profile(model, work, backends=MULTI_BACKENDS, warmup=1, iters=2, trace_dir=tmp)
    for b in rep.ok:
        _gz(b.trace_path, out_dir / f"dm_{b.backend}.json.gz")
    rep.to_json(out_dir / "dm_report.json")
    print("recorded device_map", desc, [b.backend for b in rep.ok])


def tensor_parallel(out_dir: Path) -> None:
    """Run under torchrun: every rank profiles; rank 0 receives the others' traces and writes."""
    model, desc = load_model("tiny-llama", dtype="bf16", tp=True)
    work = make_workload(model, batch=2, seq=64)
    tmp = Path(tempfile.mkdtemp())
    rep = attnswitch.profile(model, work, backends=MULTI_BACKENDS, warmup=1, iters=2, trace_dir=tmp)
    if int(os.environ["RANK"]) == 0:
        for b in rep.ok:
            for src in [b.trace_path, *b.rank_trace_paths]:
                rank = src.split("_rank")[-1].split(".")[0]
                _gz(src, out_dir / f"tp_{b.backend}_rank{rank}.json.gz")
        rep.to_json(out_dir / "tp_report.json")
        print("recorded tensor parallel", desc, [b.backend for b in rep.ok])
    import torch.distributed as dist

    dist.destroy_process_group()


def main(argv: list[str]) -> None:
    out_dir = Path(argv[0])
    out_dir.mkdir(parents=True, exist_ok=True)
    if "--tp" in argv:
        return tensor_parallel(out_dir)
    if "--multi-gpu" in argv:
        device_map(out_dir)
        subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", __file__, str(out_dir),
                        "--tp"], check=True)
        return
    single(out_dir)


if __name__ == "__main__":
    main(sys.argv[1:])
