"""The occupancy calculator against cases worked by hand (Hopper limits: 64 warps, 32 blocks,
65536 registers and 228 KiB of shared memory per SM, 1 KiB reserved per block)."""

import pytest

from attnswitch.profiling.occupancy import H100_LIMITS, occupancy


def test_register_limited():
    # 128 threads = 4 warps; 128 regs -> 4096 per warp -> 16 warps -> 4 blocks -> 16/64
    o = occupancy(128, 128, 0)
    assert (o.blocks_per_sm, o.limiter, o.occupancy) == (4, "registers", 0.25)


def test_register_allocation_rounds_to_256_per_warp():
    # 33 regs * 32 = 1056 -> 1280 per warp -> 51 warps -> 12 blocks of 4 warps -> 48/64
    o = occupancy(128, 33, 0)
    assert (o.blocks_per_sm, o.limiter) == (12, "registers")
    assert o.occupancy == pytest.approx(0.75)


def test_shared_memory_limited():
    # 100000 + 1024 reserved -> 101120 after 128-byte rounding -> 233472 // 101120 = 2 blocks
    o = occupancy(256, 64, 100_000)
    assert (o.blocks_per_sm, o.limiter, o.occupancy) == (2, "shared memory", 0.25)


def test_block_limited():
    # 1 warp per block: 64 by warps, but at most 32 blocks per SM
    o = occupancy(32, 16, 0)
    assert (o.blocks_per_sm, o.limiter, o.occupancy) == (32, "blocks", 0.5)


def test_thread_limited():
    # 1024 threads = 32 warps -> 2 blocks by warps; 16 regs would allow 4
    o = occupancy(1024, 16, 0)
    assert (o.blocks_per_sm, o.limiter, o.occupancy) == (2, "threads", 1.0)


def test_cudnn_sdpa_kernel_as_seen_on_h200():
    # cuDNN's fused SDPA kernel on the H200: 384 threads, 168 registers, 134144 B shared memory.
    # 168*32 = 5376 per warp -> 12 warps -> 1 block of 12 warps: 12/64 = 18.75 %; the profiler said 0.
    o = occupancy(384, 168, 134_144, H100_LIMITS)
    assert o.blocks_per_sm == 1 and o.occupancy == pytest.approx(0.1875)
    assert o.limits["shared memory"] == 1


def test_more_shared_memory_than_a_block_may_have():
    o = occupancy(128, 32, 300_000)
    assert o.blocks_per_sm == 0 and o.limiter == "shared memory"


@pytest.mark.parametrize("threads,regs,smem", [(0, 32, 0), (2048, 32, 0), (128, -1, 0)])
def test_bad_input(threads, regs, smem):
    with pytest.raises(ValueError):
        occupancy(threads, regs, smem)
