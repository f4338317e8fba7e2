"""Where things run: the default device, the devices a model's weights are on, waiting for them."""

from __future__ import annotations

import itertools
from collections.abc import Iterable

import torch
import torch.nn as nn

from .options import OptionError

__all__ = ["default_device", "device_of", "devices_of", "sync", "parse_device"]


def default_device() -> torch.device:
    """CUDA when a GPU is visible, else the CPU."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def parse_device(arg: str | torch.device | None) -> torch.device:
    """``arg`` as a device (the default one for None); a CUDA device where none exists is bad input."""
    if arg is None:
        return default_device()
    try:
        dev = torch.device(arg)
    except (RuntimeError, TypeError) as e:
        raise OptionError("{device} {given!r}: {why}", given=arg, why=str(e).splitlines()[0]) from None
    if dev.type not in ("cpu", "cuda"):  # (meta has no data to time; mps, xpu: no SDPA backends to force)
        raise OptionError("{device} {given}: attnswitch runs on cpu or cuda", given=arg)
    if dev.type == "cpu" and dev.index not in (None, 0):  # (torch takes it; there is one CPU device)
        raise OptionError("{device} {given}: the CPU is one device, cpu (or cpu:0)", given=arg)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise OptionError("{device} {given}: no CUDA device is available here", given=arg)
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise OptionError("{device} {given}: this machine has {n} CUDA device(s), cuda:0 to cuda:{last}", given=arg,
                          n=torch.cuda.device_count(), last=torch.cuda.device_count() - 1)
    return dev


def device_of(model: nn.Module) -> torch.device:
    """Where the model's inputs go: the device of its first parameter not on the meta device, else where
    accelerate's hooks run an offloaded model (its ``execution_device``); the CPU for none."""
    first = None
    for p in model.parameters():
        if p.device.type != "meta":
            return p.device
        first = first or p.device
    for m in model.modules():
        hook = getattr(m, "_hf_hook", None)
        for h in [hook, *getattr(hook, "hooks", ())]:
            dev = getattr(h, "execution_device", None)
            if dev is not None:  # (an index: of this process's accelerator, as accelerate means it)
                return torch.device(dev) if not isinstance(dev, int) else torch.device(_accelerator(), dev)
    return first or torch.device("cpu")


def _accelerator() -> str:
    acc = getattr(torch, "accelerator", None)
    current = acc.current_accelerator() if acc is not None else None
    return current.type if current is not None else "cuda"


def devices_of(model: nn.Module) -> list[torch.device]:
    """Every device the model's weights and buffers are on (several under a ``device_map``)."""
    seen: dict[torch.device, None] = {}
    for t in itertools.chain(model.parameters(), model.buffers()):
        if t.device.type != "meta":
            seen.setdefault(t.device)
    return list(seen) or [torch.device("cpu")]


def sync(devices: Iterable[torch.device]) -> None:
    """Wait until every CUDA device among ``devices`` is idle."""
    for d in devices:
        if d.type == "cuda":
            torch.cuda.synchronize(d)
