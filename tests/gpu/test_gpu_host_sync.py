"""A switched forward waits for the GPU no more often than transformers' own: no host-device sync on the
switch's path (``torch.cuda.set_sync_debug_mode`` warns at each synchronizing CUDA call).

Run on a GPU machine: ``pytest -m gpu tests/gpu``. Skipped without CUDA.
"""

import contextlib
import inspect
import warnings

import pytest
import torch
from conftest import tiny
from transformers import DynamicCache

import attnswitch
from attnswitch.errors import BackendUnavailable

pytestmark = pytest.mark.gpu

SYNC = "called a synchronizing CUDA operation"


def _steps(m):
    """A prefill of 16 tokens and a one-token decode step against its cache, as a generate makes them."""
    ids = torch.randint(0, m.config.vocab_size, (2, 16), device="cuda")
    name = "cache" if "cache" in inspect.signature(type(m).forward).parameters else "past_key_values"

    def prefill():
        m(input_ids=ids, use_cache=False)

    cache = DynamicCache(config=m.config)
    with torch.no_grad():
        m(input_ids=ids, use_cache=True, **{name: cache})

    def decode():  # (the cache grows by a token each time: a generate's next step)
        m(input_ids=ids[:, :1], use_cache=True, **{name: cache})
    return prefill, decode


def _syncs(fn, ctx) -> int:
    """Synchronizing CUDA calls during ``fn()`` inside ``ctx`` (after one untimed run of it there)."""
    with torch.no_grad(), ctx:
        fn()
        torch.cuda.synchronize()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                fn()
            finally:
                torch.cuda.set_sync_debug_mode("default")
    return sum(SYNC in str(w.message) for w in caught)


@pytest.mark.parametrize("scope", ["model", "global"])
@pytest.mark.parametrize("name", ["naive", "naive-inplace", "math", "efficient", "flash", "cudnn", "auto", "eager"])
def test_a_switched_forward_synchronizes_no_more_than_transformers_own(name, scope):
    m = tiny("llama").to("cuda", torch.bfloat16).eval()
    # ``eager`` is transformers' eager, mask and all (its mask creation synchronizes once): held to that;
    # every other backend to transformers' own sdpa
    own = "eager" if name == "eager" else "sdpa"
    for step, fn in zip(("prefill", "decode"), _steps(m)):
        m.set_attn_implementation(own)
        try:
            base = _syncs(fn, contextlib.nullcontext())
        finally:
            m.set_attn_implementation("sdpa")
        switch = attnswitch.backend(name, model=m) if scope == "model" else attnswitch.backend(name)
        try:
            switched = _syncs(fn, switch)
        except BackendUnavailable as e:  # a kernel that does not take this shape here: nothing to compare
            pytest.skip(f"{name} refuses the {step} step here: {e}")
        assert switched <= base, f"{name} ({scope}) {step}: {switched} synchronizing calls, transformers' {own} {base}"
