"""The environment a number was measured in: device, driver, CUDA, cuDNN and library versions."""

from __future__ import annotations

import platform
import shutil
import subprocess
from importlib.metadata import PackageNotFoundError, version

import torch

__all__ = ["environment", "auto_choice"]


def _pkg(name: str) -> str | None:
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def _driver() -> str | None:
    if not shutil.which("nvidia-smi"):
        return None
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10)
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None
    except (OSError, subprocess.TimeoutExpired):
        return None


def environment(device: torch.device | str | None = None) -> dict:
    """Versions and device facts for reports (every result file carries them)."""
    cuda = torch.cuda.is_available()
    dev = torch.device(device) if device is not None else torch.device("cuda" if cuda else "cpu")
    env = {
        "device": dev.type,
        "gpu": None,
        "compute_capability": None,
        "driver": None,
        "cuda": torch.version.cuda,
        "cudnn": None,
        "torch": torch.__version__,
        "transformers": _pkg("transformers"),
        "accelerate": _pkg("accelerate"),
        "attnswitch": _pkg("attnswitch"),
        "python": platform.python_version(),
        "cpu": platform.processor() or platform.machine(),
    }
    if cuda and dev.type == "cuda":
        p = torch.cuda.get_device_properties(dev)
        env.update(gpu=p.name, compute_capability=f"{p.major}.{p.minor}", driver=_driver(),
                   cudnn=torch.backends.cudnn.version(), gpu_memory_gib=round(p.total_memory / 2**30, 1),
                   sm_count=p.multi_processor_count, gpus_visible=torch.cuda.device_count())
    return env


def auto_choice(device: torch.device | str | None = None, dtype=torch.bfloat16, batch=1, heads=16, seq=1024,
                head_dim=64, is_causal=True) -> str:
    """Which kernel SDPA's own choice ("auto") runs for such inputs here, read off the profiler."""
    from .switch import attention

    dev = torch.device(device) if device is not None else torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if dev.type == "cpu" and dtype == torch.float16:
        dtype = torch.float32
    q = torch.randn(batch, heads, seq, head_dim, device=dev, dtype=dtype)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        attention(q, q, q, is_causal=is_causal, backend="auto")
    names = [e.name for e in prof.events() if e.name.startswith("aten::_scaled_dot_product") or
             e.name.startswith("aten::_efficient_attention") or e.name.startswith("aten::_flash_attention")]
    for op, label in [("cudnn", "cudnn"), ("flash", "flash"), ("efficient", "efficient"), ("math", "math")]:
        if any(op in n for n in names):
            return label
    return "unknown"
