"""Record the small real GPU traces that the CPU test suite parses (tests/data/).

``python benchmarks/record_traces.py DIR``: a 2-layer Llama with GQA (bf16, batch 1, 64 tokens), one
profiled forward per backend, each trace gzipped as ``llama2l_<backend>.json.gz``.
"""

import gzip
import shutil
import sys
import tempfile
from pathlib import Path

import attnswitch
from attnswitch.models import load_model, make_workload


def main(out: str) -> None:
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    model, _ = load_model("tiny-llama", dtype="bf16", device="cuda", layers=2)
    work = make_workload(model, batch=1, seq=64)
    tmp = tempfile.mkdtemp()
    rep = attnswitch.profile(model, work, backends=["naive", "naive-inplace", "math", "efficient", "flash", "cudnn",
                                                    "auto"], warmup=1, iters=1, trace_dir=tmp)
    for b in rep.ok:
        with open(b.trace_path, "rb") as f, gzip.open(out_dir / f"llama2l_{b.backend}.json.gz", "wb") as g:
            shutil.copyfileobj(f, g)
    rep.to_json(out_dir / "llama2l_report.json")
    print("recorded", [b.backend for b in rep.ok])


if __name__ == "__main__":
    main(sys.argv[1])
