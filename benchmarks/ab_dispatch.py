"""attnswitch's host cost per attention call, for the checkout on ``PYTHONPATH``: run it once per version of
the code in one machine start, and compare the JSON lines it prints (added µs over transformers' sdpa).

    PYTHONPATH=OLD/src python benchmarks/ab_dispatch.py > old.json
    PYTHONPATH=src python benchmarks/ab_dispatch.py > new.json

Isolated calls (``q/k/v [1, 4, 16, 64]``) and real forwards of a host-bound 16-layer Llama, each variant
in blocks (``suite._in_blocks``). Versions without ``hf.dispatch.new_forward`` read their selection per
call; with it, the isolated calls run as those of a forward of their model.
"""

import contextlib
import json
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import suite
from torch.nn.attention import SDPBackend, sdpa_kernel
from transformers import LlamaConfig, LlamaModel
from transformers.integrations.sdpa_attention import sdpa_attention_forward

import attnswitch
from attnswitch.hf import dispatch


def _in_forward(switch, model):
    @contextlib.contextmanager
    def ctx():
        with switch:
            if not hasattr(dispatch, "new_forward"):
                yield
                return
            token = dispatch._FORWARD.set(dispatch.new_forward(model))
            try:
                yield
            finally:
                dispatch._FORWARD.reset(token)
    return ctx()


def main() -> dict:
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    name, sdp = ("cudnn", SDPBackend.CUDNN_ATTENTION) if dev == "cuda" else ("flash", SDPBackend.FLASH_ATTENTION)
    dtype = torch.bfloat16 if dev == "cuda" else torch.float32
    model = LlamaModel(LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=1, num_attention_heads=4,
                                   num_key_value_heads=4, vocab_size=128)).to(dev, dtype)
    mod = model.layers[0].self_attn
    q = torch.randn(1, 4, 16, 64, device=dev, dtype=dtype)

    def entry():
        return dispatch.attention_forward(mod, q, q, q, None, dropout=0.0, scaling=0.125)

    contexts = {"transformers sdpa": lambda: sdpa_kernel(sdp), "floor": contextlib.nullcontext,
                "entry scoped": lambda: _in_forward(attnswitch.backend(name, model=model), model),
                "entry global": lambda: _in_forward(attnswitch.backend(name), model)}
    fns = {"transformers sdpa": lambda: sdpa_attention_forward(mod, q, q, q, None, dropout=0.0, scaling=0.125),
           "floor": lambda: suite.floor_attention(mod, q, q, q, None, dropout=0.0, scaling=0.125),
           "entry scoped": entry, "entry global": entry}
    micro = {k: statistics.median(v) for k, v in suite._in_blocks(contexts, fns, 4000, block=20).items()}

    deep = LlamaModel(LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=16, num_attention_heads=4,
                                  num_key_value_heads=4, vocab_size=128)).to(dev, dtype).eval()
    ids = torch.randint(0, 128, (1, 8), device=dev)

    def forward():
        with torch.no_grad():
            deep(input_ids=ids)

    contexts = {"transformers sdpa": lambda: sdpa_kernel(sdp),
                "attnswitch scoped": lambda: attnswitch.backend(name, model=deep),
                "attnswitch global": lambda: attnswitch.backend(name)}
    per_fwd = {k: statistics.median(v) for k, v in suite._in_blocks(contexts, forward, 400, block=5).items()}
    return {"code": attnswitch.__file__, "device": dev, "backend": name,
            "micro_us": {k: round(v, 2) for k, v in micro.items()},
            "micro_added_us": {k: round(v - micro["transformers sdpa"], 2) for k, v in micro.items()},
            "forward_us": {k: round(v, 1) for k, v in per_fwd.items()},
            "forward_added_us_per_call": {k: round((v - per_fwd["transformers sdpa"]) / 16, 2)
                                          for k, v in per_fwd.items()}}


if __name__ == "__main__":
    print(json.dumps(main()))
