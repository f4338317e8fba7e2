"""The practical ceiling of the GPU a report ran on: a large matmul's TFLOP/s in the attention's dtype and a
large copy's TB/s (read and written), measured once per report with CUDA events, in about half a second.
What attention kernels reach is set against it (``peak.py``) as well as against the GPU's published peak.
Nothing on a CPU.
"""

from __future__ import annotations

import time

import torch

__all__ = ["measure", "MATMUL_N", "COPY_BYTES", "BUDGET_S"]

#: the square matmul's size (8192: about 790 TFLOP/s in bf16 on an H200, spec 989)
MATMUL_N = 8192
#: the copy's size (its source; as much again is written)
COPY_BYTES = 1 << 30
#: seconds each of the two measurements takes, at most about
BUDGET_S = 0.25


def _timed(fn, budget_s: float) -> float:
    """The best of three batches of ``fn`` calls, in ms per call, the batch sized to ``budget_s / 3``."""
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    once = max(time.perf_counter() - t0, 1e-6)
    n = max(1, min(200, int(budget_s / 3 / once)))
    best = float("inf")
    for _ in range(3):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(n):
            fn()
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) / n)
    return best


def _sizes(device: torch.device, itemsize: int) -> tuple[int, int]:
    """The matmul's side and the copy's bytes that fit a quarter of the GPU's free memory each."""
    free, _ = torch.cuda.mem_get_info(device)
    n = MATMUL_N
    while n > 1024 and 3 * n * n * itemsize > free // 4:
        n //= 2
    copy = COPY_BYTES
    while copy > (64 << 20) and 2 * copy > free // 4:
        copy //= 2
    return n, copy


def _matmul_tflops(device: torch.device, dtype: torch.dtype, n: int) -> float:
    a = torch.randn(n, n, device=device, dtype=dtype)
    b, c = torch.randn_like(a), torch.empty_like(a)
    ms = _timed(lambda: torch.mm(a, b, out=c), BUDGET_S)
    return 2 * n ** 3 / (ms * 1e-3) / 1e12


def _copy_tbps(device: torch.device, size: int) -> float:
    src = torch.empty(size, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    ms = _timed(lambda: dst.copy_(src), BUDGET_S)
    return 2 * size / (ms * 1e-3) / 1e12  # read and written


def measure(device: torch.device, dtype: torch.dtype) -> dict | None:
    """``{"dtype", "matmul_tflops", "matmul_n", "copy_tbps", "copy_mib", "seconds"}`` on ``device`` (None on a
    CPU; a figure None where its tensors did not fit)."""
    if device.type != "cuda":
        return None
    t0 = time.perf_counter()
    out: dict = {"dtype": str(dtype).replace("torch.", ""), "matmul_tflops": None, "copy_tbps": None}
    with torch.cuda.device(device):
        n, size = _sizes(device, torch.empty((), dtype=dtype).element_size())
        try:
            out.update(matmul_tflops=_matmul_tflops(device, dtype, n), matmul_n=n)
            out.update(copy_tbps=_copy_tbps(device, size), copy_mib=size >> 20)
        except torch.OutOfMemoryError:
            pass
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
    out["seconds"] = round(time.perf_counter() - t0, 3)
    return out
