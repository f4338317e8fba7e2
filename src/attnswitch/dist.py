"""The process group: rank and world size, rank 0, barriers and object exchange between ranks.

One process per GPU under ``torchrun`` (tensor parallelism); everything here is a no-op, or answers
for a single process, when no group of more than one process is initialized.
"""

from __future__ import annotations

import os

import torch

from .options import OptionError

__all__ = ["world", "rank", "is_main", "barrier", "gather", "broadcast", "init_process_group", "destroy"]


def _dist():
    import torch.distributed as dist

    return dist


def world() -> tuple[int, int] | None:
    """``(rank, world_size)`` inside an initialized process group of more than one process, else None."""
    dist = _dist()
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        return dist.get_rank(), dist.get_world_size()
    return None


def rank() -> int | None:
    """This process's rank in a group of several, else None."""
    w = world()
    return w[0] if w is not None else None


def is_main() -> bool:
    """Whether this process speaks and writes: rank 0 of a group, or the ``RANK`` torchrun gives a
    process whose group is not initialized yet, or any single process."""
    w = world()
    if w is not None:
        return w[0] == 0
    return int(os.environ.get("RANK", "0")) == 0


def barrier() -> None:
    """Wait for every rank (on the rank's own GPU under NCCL); nothing outside a process group."""
    if world() is None:
        return
    dist = _dist()
    if torch.cuda.is_available() and dist.get_backend() == "nccl":
        dist.barrier(device_ids=[torch.cuda.current_device()])
    else:
        dist.barrier()


def gather(obj) -> list:
    """Every rank's ``obj``, index = rank, on every rank (``[obj]`` in a single process)."""
    if world() is None:
        return [obj]
    dist = _dist()
    out: list = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def broadcast(obj):
    """Rank 0's ``obj`` on every rank (``obj`` itself in a single process)."""
    if world() is None:
        return obj
    box = [obj]
    _dist().broadcast_object_list(box, src=0)
    return box[0]


def init_process_group() -> tuple[int, int]:
    """The process group ``torchrun`` asks for (NCCL on GPUs, gloo on CPUs), each rank bound to its
    GPU; returns ``(rank, world_size)``. Already initialized: left as it is."""
    dist = _dist()
    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        raise OptionError("tensor parallelism ({tp}) needs one process per GPU: run under torchrun, e.g. "
                          "{example}", example="`torchrun --nproc-per-node 2 -m attnswitch compare MODEL --tp`")
    local = int(os.environ.get("LOCAL_RANK", os.environ["RANK"]))
    if torch.cuda.is_available():
        if local >= torch.cuda.device_count():
            raise ValueError(f"rank {local} has no GPU: {torch.cuda.device_count()} visible, "
                             f"{os.environ['WORLD_SIZE']} processes asked for")
        torch.cuda.set_device(local)
        dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    else:
        dist.init_process_group("gloo")
    return dist.get_rank(), dist.get_world_size()


def destroy() -> None:
    """Tear the process group down, if one is initialized."""
    dist = _dist()
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
