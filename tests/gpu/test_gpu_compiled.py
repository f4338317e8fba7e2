"""Forced CUDA backends under torch.compile (inductor), CUDA graphs included: the forced kernel runs in
the compiled graph, a switch never replays the old backend's graph, transformers' own compiled
static-cache generate runs the forced kernel, and compare's compiled candidates count their recompiles.

Run on a GPU machine: ``pytest -m gpu tests/gpu``. Skipped without CUDA.
"""

import inspect
import threading

import pytest
import torch
from conftest import batch_for, gpu_events, output_of, tiny, to_cuda
from transformers import CompileConfig, masking_utils

import attnswitch
from attnswitch.backends import kernel_family
from attnswitch.profiling.compiled import attention_family
from attnswitch.workload import cache_kwarg, make_workload

pytestmark = pytest.mark.gpu

#: whether transformers leaves SDPA's causal mask to ``is_causal`` under torch.compile where no padding mask was
#: given (later 5.x); before, it builds a boolean causal mask whenever it traces, which flash refuses: forced flash
#: compiled then gets flash's own refusal, as uncompiled with a mask
FLASH_COMPILES = "is_torchdynamo_exporting" in inspect.getsource(masking_utils._ignore_causal_mask_sdpa)
#: backends to switch between under compile: flash where it takes what transformers gives it there
SWITCHES = ("flash", "cudnn", "efficient", "flash") if FLASH_COMPILES else ("cudnn", "efficient", "cudnn")


def refused_for_the_mask(fn):
    with pytest.raises(attnswitch.BackendUnavailable) as e:
        fn()
    assert "attn_mask" in str(e.value), e.value


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def cuda_model(kind="llama", **over):
    return tiny(kind, **over).to("cuda", torch.bfloat16)


def families(fn) -> set[str]:
    """The SDPA families of the attention kernels ``fn`` ran on the GPU (CUDA graph replays included)."""
    return {f for e in gpu_events(fn) if e.device_type == torch.autograd.DeviceType.CUDA
            if (f := attention_family(e.name)) is not None}


def forward(m, batch):
    with torch.no_grad():
        return output_of(m(**batch)).float()


def assert_close(out, ref, tol=5e-2):
    """Within bf16's tolerance (as numerics judges it): max |out - ref| over max |ref|."""
    err = ((out - ref).abs().max() / ref.abs().max().clamp_min(1e-12)).item()
    assert err <= tol, err


def uncompiled_auto_family(m, batch) -> str:
    with torch.no_grad(), attnswitch.backend("auto", model=m):
        return kernel_family(e.name for e in gpu_events(lambda: m(**batch)))


@pytest.mark.parametrize("name", ["efficient", "flash", "cudnn", "auto"])
def test_fullgraph_inductor_compile_runs_the_forced_kernel_and_matches_uncompiled(name):
    m = cuda_model()
    b = to_cuda(batch_for(m, pad=False, seq=64))
    compiled = torch.compile(m, fullgraph=True)
    want = uncompiled_auto_family(m, b) if name == "auto" else name
    with attnswitch.backend(name, model=m):
        ref = forward(m, b)
        if name == "flash" and not FLASH_COMPILES:
            return refused_for_the_mask(lambda: forward(compiled, b))
        assert_close(forward(compiled, b), ref)
        assert families(lambda: forward(compiled, b)) == {want}


def test_reduce_overhead_decode_step_never_replays_the_old_backends_graph():
    m = cuda_model()
    work = make_workload(m, batch=3, seq=32, mode="decode")
    kwargs = work.kwargs
    key = cache_kwarg(m)
    compiled = torch.compile(m, mode="reduce-overhead")  # CUDA graphs: guards run before every replay
    for name in SWITCHES:  # back to the first: its recorded graph, replayed
        with attnswitch.backend(name, model=m):
            ref = forward(m, {**kwargs, key: work.first()[key]})
            for _ in range(3):  # recorded, then replayed
                out = forward(compiled, {**kwargs, key: work.first()[key]})
            assert_close(out, ref)
            assert families(lambda: forward(compiled, {**kwargs, key: work.first()[key]})) == {name}


def test_transformers_compiled_static_cache_generate_runs_the_forced_kernel_and_switches():
    # transformers' documented fast path: a static cache, its own compile of the decode steps under CUDA
    # graphs; compiled under flash, then switched to cudnn: recompiled, never flash's graph replayed
    m = cuda_model()
    ids = to_cuda(batch_for(m, pad=False, seq=24, batch=2))
    kw = dict(max_new_tokens=8, min_new_tokens=8, do_sample=False, pad_token_id=0, cache_implementation="static",
              compile_config=CompileConfig(mode="reduce-overhead", fullgraph=True))
    n = ids["input_ids"].shape[1] + 1
    for name in SWITCHES[1:]:
        with torch.no_grad(), attnswitch.backend(name, model=m):
            eager = m.generate(**ids, **{**kw, "disable_compile": True})
            compiled = m.generate(**ids, **kw)
            assert hasattr(m, "_compiled_call")  # transformers compiled the decode steps
            seen = families(lambda: m.generate(**ids, **kw))
        assert torch.equal(compiled[:, :n], eager[:, :n])  # the prompt and the first token; bf16 may differ later
        assert seen == {name}


@pytest.mark.parametrize("name", ["efficient", "flash", "cudnn"])
def test_compiled_training_step_runs_the_forced_backward_and_matches_uncompiled_gradients(name):
    m = cuda_model().train()
    b = to_cuda(batch_for(m, pad=False, seq=64))
    compiled = torch.compile(m, fullgraph=True)
    grads = []
    if name == "flash" and not FLASH_COMPILES:
        with attnswitch.backend(name, model=m):
            return refused_for_the_mask(lambda: output_of(compiled(**b)).float().square().mean().backward())
    with attnswitch.backend(name, model=m):
        for model in (m, compiled):
            m.zero_grad(set_to_none=True)
            output_of(model(**b)).float().square().mean().backward()
            grads.append({n: p.grad.float().clone() for n, p in m.named_parameters() if p.grad is not None})
        seen = families(lambda: output_of(compiled(**b)).float().square().mean().backward())
    for n, g in grads[0].items():
        assert ((grads[1][n] - g).norm() / g.norm().clamp_min(1e-12)).item() < 0.1, n
    assert seen == {name}


def test_flash_with_a_padding_mask_compiled_refuses_as_uncompiled():
    m = cuda_model()
    b = to_cuda(batch_for(m, pad=True, seq=32))
    compiled = torch.compile(m, fullgraph=True)
    with attnswitch.backend("flash", model=m):
        with pytest.raises(attnswitch.BackendUnavailable) as eager:
            forward(m, b)
        with pytest.raises(attnswitch.BackendUnavailable) as comp:
            forward(compiled, b)
    assert str(comp.value) == str(eager.value) and "attn_mask" in str(comp.value)


def test_compiling_in_one_thread_on_gpu_changes_nothing_another_thread_runs():
    m = cuda_model()
    b = to_cuda(batch_for(m, pad=False, seq=64))
    compiled = torch.compile(m)
    auto = uncompiled_auto_family(m, b)
    other = "efficient" if auto != "efficient" else "flash"
    inside, done, seen, errors = threading.Event(), threading.Event(), {}, []

    def switched():
        try:
            with attnswitch.backend(other, model=m):
                seen["switched"] = families(lambda: forward(compiled, b))
                inside.set()
                done.wait(120)
        except BaseException as e:
            errors.append(e)
            inside.set()

    t = threading.Thread(target=switched)
    t.start()
    try:
        assert inside.wait(300)
        seen["compiled here"] = families(lambda: forward(compiled, b))
        seen["eager here"] = families(lambda: forward(m, b))
    finally:
        done.set()
        t.join(300)
    assert not errors, errors
    assert seen == {"switched": {other}, "compiled here": {auto}, "eager here": {auto}}


def test_compare_counts_a_dynamic_caches_recompiles_and_none_for_a_static_one():
    m = cuda_model()
    reports = {}
    for cache in ("dynamic", "static"):
        torch._dynamo.reset()
        w = make_workload(m, batch=2, seq=16, mode="generate", new_tokens=6, prompt_lens=(16,), cache=cache)
        reports[cache] = attnswitch.compare(m, w, backends=[SWITCHES[0]], compile="default", warmup=0, iters=1,
                                            rounds=1)
    dyn, static = reports["dynamic"][f"{SWITCHES[0]}+compile"], reports["static"][f"{SWITCHES[0]}+compile"]
    assert dyn.ok and static.ok, (dyn.reasons, static.reasons)
    assert dyn.recompiles > 0  # each decode step's key length is new: the cache's shapes change under the graph
    assert static.recompiles == 0 and static.attn_seen == SWITCHES[0] and static.attn_mismatch is None


def test_a_refusal_inside_a_cuda_graph_warm_up_leaves_the_next_backends_graphs_working():
    # a forced backend refused inside a compiled graph under CUDA graphs raises in the graph's warm-up; the
    # refusal is kept out of every recorded graph, so CUDA graph trees hold no half-run node for the next
    # backend's first replay to fail on (it did: an AssertionError in dealloc_current_path_weakrefs)
    m = cuda_model()
    padded, plain = to_cuda(batch_for(m, pad=True, seq=32)), to_cuda(batch_for(m, pad=False, seq=32))
    compiled = torch.compile(m, mode="reduce-overhead")
    with attnswitch.backend("flash", model=m):
        refused_for_the_mask(lambda: forward(compiled, padded))
    for other in ("efficient", "cudnn"):
        with attnswitch.backend(other, model=m):
            ref = forward(m, plain)
            outs = [forward(compiled, plain) for _ in range(4)]  # warm-up, recording, replays
            ran = families(lambda: forward(compiled, plain))
        for out in outs:
            assert_close(out, ref)
        assert ran == {other}
