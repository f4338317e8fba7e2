"""A model split by accelerate's device_map between one GPU and the CPU (its layers on the CPU offloaded:
their weights moved to the GPU for each forward, as accelerate does for a model larger than the GPU).

Every layer's attention still runs on the GPU, so each forced backend must run its own kernel there, with
the same per-layer attention kernel counts and outputs as the model wholly on the GPU, and the report must
say how the model was placed.

Run on a GPU machine: ``pytest -m gpu tests/gpu``. Skipped without CUDA.
"""

import pytest
import torch
from conftest import saved_gqa_llama

import attnswitch
from attnswitch.models import load_model
from attnswitch.workload import make_workload

pytestmark = pytest.mark.gpu

BACKENDS = ["naive-inplace", "math", "efficient", "flash", "cudnn"]
DEVICE_MAP = {"model.embed_tokens": 0, "model.rotary_emb": 0, "model.layers.0": 0, "model.layers.1": 0,
              "model.layers.2": "cpu", "model.layers.3": "cpu", "model.norm": 0, "lm_head": 0}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return saved_gqa_llama(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="module")
def pair(folder):
    whole, _ = load_model(folder, dtype="bf16", device="cuda:0")
    split, _ = load_model(folder, dtype="bf16", device_map=DEVICE_MAP)
    return whole, split


def _attention_kernels(report, backend):
    return {l.path: l.kernels / l.calls for l in report[backend].layers if l.kind == "attention"}


def test_an_offloaded_model_is_switched_like_one_on_the_gpu(pair):
    whole, split = pair
    assert {str(v) for v in split.hf_device_map.values()} == {"0", "cpu"}
    for name in ("cudnn", "flash", "naive-inplace"):
        w1, w2 = make_workload(whole, batch=2, seq=64), make_workload(split, batch=2, seq=64)
        with torch.no_grad(), attnswitch.backend(name):
            a = whole(**w1.kwargs).logits
            b = split(**w2.kwargs).logits
        assert b.device.type == "cuda"
        torch.testing.assert_close(b.float().cpu(), a.float().cpu(), atol=2e-2, rtol=2e-2)


def test_an_offloaded_model_runs_each_forced_kernel_as_on_the_gpu(pair):
    whole, split = pair
    r1 = attnswitch.profile(whole, make_workload(whole, batch=2, seq=128), backends=BACKENDS, warmup=1, iters=2)
    r2 = attnswitch.profile(split, make_workload(split, batch=2, seq=128), backends=BACKENDS, warmup=1, iters=2)
    print({"distribution": r2.distribution})
    assert r2.distribution is not None and r2.distribution["mode"] == "device_map"
    for b in BACKENDS:
        assert r2[b].ok and r1[b].ok, (b, r2[b].reasons, r1[b].reasons)
        k1, k2 = _attention_kernels(r1, b), _attention_kernels(r2, b)
        print(b, "attention kernels per call, whole", k1, "offloaded", k2)
        assert k2 == k1, b
        assert r2[b].attn_kernels_per_call == r1[b].attn_kernels_per_call
        assert sorted(r2[b].attn_kernel_names) == sorted(r1[b].attn_kernel_names)
