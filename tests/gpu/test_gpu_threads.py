"""Threads torch starts to run a forward are part of it: ``parallel_apply`` (how DataParallel runs its replicas,
one thread each) runs the selected backend there, for a model-scoped and a global switch, and on
DataParallel's replicas of the named model (``torch.nn.parallel.replicate``, made inside the block as
DataParallel makes them in its forward). A thread a user starts is not switched.

One GPU suffices: the replicas and threads are those DataParallel makes over several GPUs, here all on one.
Run on a GPU machine: ``pytest -m gpu tests/gpu``. Skipped without CUDA.
"""

import threading

import pytest
import torch
from conftest import batch_for, tiny, to_cuda
from torch.nn.parallel import parallel_apply, replicate  # (imported by name: threads started all the same)

import attnswitch

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("what", ["replicas", "the model"])
@pytest.mark.parametrize("scope", ["model", "global"])
def test_parallel_apply_threads_run_the_selected_backend(scope, what, spy):
    m = tiny("llama").cuda().eval()
    b = to_cuda(batch_for(m))
    with torch.no_grad(), attnswitch.backend("naive", model=m):
        want = m(**b).logits
    spy.calls.clear()
    with torch.no_grad(), attnswitch.backend("naive", model=m if scope == "model" else None):
        modules = [replicate(m, [0])[0] for _ in range(2)] if what == "replicas" else [m, m]
        outs = parallel_apply(modules, [(), ()], [b, b], devices=[0, 0])
    main = threading.get_ident()
    threads = {t for t, _, _ in spy.calls}
    print(f"{scope} switch, {what}: {spy.names} on threads {sorted(threads)} (main {main})")
    assert spy.names == ["naive"] * 4 and len(threads) == 2 and main not in threads
    for out in outs:
        torch.testing.assert_close(out.logits, want)


def test_a_thread_a_user_starts_is_not_switched(spy):
    m = tiny("llama").cuda().eval()
    b = to_cuda(batch_for(m))
    with torch.no_grad(), attnswitch.backend("naive", model=m):
        t = threading.Thread(target=lambda: m(**b))
        t.start()
        t.join()
    assert spy.calls == []
