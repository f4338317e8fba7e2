"""The switch's own cost on a host-bound step, side by side: compare's turn against a user's block (``flash``,
``auto``), and a user's block under ``attnswitch.backend("auto", model=m)`` against the same model unswitched.

    python benchmarks/switch_cost_pairs.py [ROUNDS]     # OUT set: writes OUT/auto_pairs.json

The host-bound Qwen3 shape of ``benchmarks.user_loop`` (6 layers, hidden 2048, bf16, B1 S1024 prefill) on a GPU
(tiny, float32, on a CPU). ``ROUNDS`` rounds (default 20) of ``user_loop.paired`` (compare's turn, a block of 5
steps), then as many of a block under ``auto`` followed by a block of the unswitched model (in that order each
round; an untimed step before each block). Each figure: the median over rounds of the first over the second.
"""

import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.getcwd())
from attnswitch.workload import make_workload
from benchmarks import user_loop as ul


def main(rounds: int) -> dict:
    cuda = torch.cuda.is_available()
    model = ul.model_of("qwen3", not cuda, "cuda" if cuda else "cpu", torch.bfloat16 if cuda else torch.float32)
    work = make_workload(model, batch=1, seq=1024 if cuda else 16, mode="prefill")
    names = ["flash", "auto"]
    ul.user_loop(work, names, 1)

    def plain_block():
        args = list(work.calls(ul.STEPS + 1))
        with torch.no_grad():
            model(**args[0])
            return ul._block(lambda kw: model(**kw), args[1:], cuda)

    t0 = time.time()
    pairs = ul.paired(work, names, 5, seconds=1e9, least=rounds, most=rounds)
    plain = [(ul.user_loop(work, ["auto"], 1)["auto"][0], plain_block()) for _ in range(rounds)]
    out = {n: {"pairs": v, "median_ratio": statistics.median(x / y for x, y in v)} for n, v in pairs.items()}
    out["auto_switched_vs_plain"] = {"pairs": plain, "median_ratio": statistics.median(x / y for x, y in plain)}
    out["seconds"] = time.time() - t0
    return out


if __name__ == "__main__":
    out = main(int(sys.argv[1]) if len(sys.argv) > 1 else 20)
    print(json.dumps({k: (v["median_ratio"] if isinstance(v, dict) else v) for k, v in out.items()}))
    for k, v in out.items():
        if isinstance(v, dict):
            print(k, " ".join(f"{x:.2f}/{y:.2f}" for x, y in v["pairs"]))
    if os.environ.get("OUT"):
        json.dump(out, open(os.path.join(os.environ["OUT"], "auto_pairs.json"), "w"), indent=1)
