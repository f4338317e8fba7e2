"""attnswitch's ``eager`` on a GPU launches what transformers' own eager launches: the same kernels, memcpys and
memsets, in the same numbers (its mask made by transformers' masking once per forward).

Run on a GPU machine: ``pytest -m gpu tests/gpu``. Skipped without CUDA.
"""

import collections

import pytest
import torch
from conftest import batch_for, gpu_events, tiny, to_cuda

import attnswitch

pytestmark = pytest.mark.gpu


def _device_events(fn):
    with torch.no_grad():
        events = gpu_events(fn)
    return collections.Counter(e.name for e in events if e.device_type == torch.autograd.DeviceType.CUDA)


@pytest.mark.parametrize("kind", ["llama", "bert"])
def test_eager_launches_the_kernels_transformers_eager_launches(kind):
    m = tiny(kind).to("cuda", torch.bfloat16)
    b = to_cuda(batch_for(m))  # padded

    def switched():
        with attnswitch.backend("eager", model=m):
            m(**b)

    def own():
        m.set_attn_implementation("eager")
        try:
            m(**b)
        finally:
            m.set_attn_implementation("sdpa")
    for fn in (switched, own):
        fn()  # warm
    got, want = _device_events(switched), _device_events(own)
    memcpy = sum(n for k, n in want.items() if "Memcpy" in k)
    print(f"{kind}: {sum(want.values())} device events per forward, {memcpy} memcpys; attnswitch's eager: "
          f"{sum(got.values())}")
    assert got == want, {k: (got[k], want[k]) for k in got.keys() | want.keys() if got[k] != want[k]}
