"""Theoretical occupancy of a kernel launch, recomputed from its resources and the device's limits.

The profiler's ``est. achieved occupancy %`` reads 0 for kernels with more than 48 KiB of dynamic
shared memory (its estimator ignores the opt-in carve-out), which on Hopper is every fused attention
kernel. This follows the CUDA occupancy calculator instead: blocks per SM are limited by warps,
registers, shared memory and the per-SM block limit; the smallest limit wins and is named.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["DeviceLimits", "Occupancy", "occupancy", "device_limits", "H100_LIMITS"]


@dataclass(frozen=True)
class DeviceLimits:
    name: str
    max_threads_per_sm: int
    max_blocks_per_sm: int
    regs_per_sm: int
    max_regs_per_thread: int
    smem_per_sm: int  # bytes usable by blocks (the largest carve-out)
    smem_per_block_optin: int
    reserved_smem_per_block: int = 1024  # the driver's per-block reservation (compute capability >= 8.0)
    warp_size: int = 32
    reg_alloc_unit: int = 256  # registers are allocated per warp in units of 256
    smem_alloc_unit: int = 128

    @property
    def max_warps_per_sm(self) -> int:
        return self.max_threads_per_sm // self.warp_size


#: Hopper (H100, H200; compute capability 9.0)
H100_LIMITS = DeviceLimits("sm_90", max_threads_per_sm=2048, max_blocks_per_sm=32, regs_per_sm=65536,
                           max_regs_per_thread=255, smem_per_sm=233472, smem_per_block_optin=232448)

# Not exposed by torch's device properties; from the CUDA programming guide's table.
_MAX_BLOCKS_PER_SM = {(7, 0): 32, (7, 5): 16, (8, 0): 32, (8, 6): 16, (8, 7): 16, (8, 9): 24, (9, 0): 32,
                      (10, 0): 32, (12, 0): 32}


def device_limits(device=None) -> DeviceLimits:
    """Limits of a CUDA device, from ``torch.cuda.get_device_properties``."""
    import torch

    p = torch.cuda.get_device_properties(device)
    cc = (p.major, p.minor)
    return DeviceLimits(
        name=f"{p.name} (sm_{p.major}{p.minor})",
        max_threads_per_sm=p.max_threads_per_multi_processor,
        max_blocks_per_sm=_MAX_BLOCKS_PER_SM.get(cc, 32 if p.major >= 8 else 16),
        regs_per_sm=p.regs_per_multiprocessor,
        max_regs_per_thread=255,
        smem_per_sm=p.shared_memory_per_multiprocessor,
        smem_per_block_optin=p.shared_memory_per_block_optin,
        reserved_smem_per_block=1024 if p.major >= 8 else 0,
        warp_size=p.warp_size,
    )


@dataclass(frozen=True)
class Occupancy:
    threads_per_block: int
    registers_per_thread: int
    shared_memory: int
    blocks_per_sm: int
    warps_per_sm: int
    occupancy: float  # active warps / max warps per SM, 0..1
    limiter: str  # "registers", "shared memory", "threads" (warps) or "blocks"
    limits: dict  # blocks per SM allowed by each resource


def _round_up(x: int, unit: int) -> int:
    return -(-x // unit) * unit


def occupancy(threads_per_block: int, registers_per_thread: int, shared_memory: int,
              limits: DeviceLimits = H100_LIMITS) -> Occupancy:
    """Theoretical occupancy of blocks of ``threads_per_block`` threads using ``registers_per_thread``
    registers and ``shared_memory`` bytes (static + dynamic) of shared memory each."""
    if threads_per_block <= 0 or threads_per_block > 1024:
        raise ValueError(f"threads per block must be 1..1024, got {threads_per_block}")
    if registers_per_thread < 0 or shared_memory < 0:
        raise ValueError("registers and shared memory must be non-negative")
    warps = math.ceil(threads_per_block / limits.warp_size)
    by = {
        "threads": limits.max_warps_per_sm // warps,
        "blocks": limits.max_blocks_per_sm,
    }
    if registers_per_thread > 0:
        regs_per_warp = _round_up(registers_per_thread * limits.warp_size, limits.reg_alloc_unit)
        by["registers"] = (limits.regs_per_sm // regs_per_warp) // warps
    else:
        by["registers"] = by["blocks"]
    smem = shared_memory + limits.reserved_smem_per_block
    if shared_memory > limits.smem_per_block_optin:
        by["shared memory"] = 0
    else:
        by["shared memory"] = limits.smem_per_sm // _round_up(smem, limits.smem_alloc_unit)
    # the binding limit; on ties name the scarcer resource first
    order = ["registers", "shared memory", "threads", "blocks"]
    limiter = min(order, key=lambda k: (by[k], order.index(k)))
    blocks = by[limiter]
    return Occupancy(threads_per_block, registers_per_thread, shared_memory, blocks, blocks * warps,
                     blocks * warps / limits.max_warps_per_sm, limiter, dict(by))
