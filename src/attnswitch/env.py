"""The environment a number was measured in: device, driver, CUDA, cuDNN and library versions."""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping
from importlib.metadata import PackageNotFoundError, version

import torch

from ._own_env import BY_TORCH, OWN
from .device import default_device

__all__ = ["environment", "package_version", "relevant_env"]

#: environment variables that change what attention (and the rest of a step) runs, or how fast
_RELEVANT = re.compile(r"^(TORCH|PYTORCH|TORCHINDUCTOR|TORCHDYNAMO|CUDA|CUDNN|CUBLAS|NCCL|TRITON|NVIDIA_TF32|OMP_NUM_|"
                       r"MKL_NUM_|HF_HUB_OFFLINE|TRANSFORMERS_OFFLINE)")
_SECRET = re.compile(r"TOKEN|SECRET|PASSWORD|KEY|CREDENTIAL", re.IGNORECASE)
#: of those, the ones that say how the image was built, not what runs (a toolkit's path and version, the
#: architectures extensions are compiled for): they made the Deploy section's "Measured with" line unreadable
_BUILD = re.compile(r"^(CUDA_HOME|CUDA_PATH|CUDA_ROOT|CUDA_TOOLKIT_ROOT_DIR|CUDA_BIN_PATH|CUDA_NVCC_EXECUTABLE|"
                    r"CUDAHOSTCXX|CUDACXX|CUDA_ARCH_LIST|CUDNN_\w+_DIR|TORCH_CUDA_ARCH_LIST|TORCH_NVCC_FLAGS|"
                    r"\w+_VERSION|\w+_BUILD_NUMBER)$")
#: a launcher's own settings (torchrun's), new in every run
_LAUNCHER = re.compile(r"^TORCHELASTIC_")


def _inductor_default_cache() -> str | None:
    """The cache folder inductor sets for itself where none was given (a default, not a user's choice); None
    where inductor's module that sets it is not loaded (then it set nothing, and importing it costs a second)."""
    module = sys.modules.get("torch._inductor.runtime.cache_dir_utils")
    try:
        return module.default_cache_dir() if module is not None else None
    except Exception:  # (another torch: no such helper)
        return None


def relevant_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment variables that matter to what runs (never a secret), as they are now (``environ``: this
    process's), less what is not a user's choice: the variables attnswitch set for itself and those torch set as
    it compiled (``_own_env``), the cache folder inductor sets where none was given, a launcher's own, and how the
    image was built."""
    if environ is None:
        environ = {k: v for k, v in os.environ.items() if k not in OWN and k not in BY_TORCH}
        if "TORCHINDUCTOR_CACHE_DIR" in environ and environ["TORCHINDUCTOR_CACHE_DIR"] == _inductor_default_cache():
            environ.pop("TORCHINDUCTOR_CACHE_DIR")
    return {k: v for k, v in sorted(environ.items()) if _RELEVANT.match(k) and not _SECRET.search(k)
            and not _BUILD.match(k) and not _LAUNCHER.match(k)}


def package_version(name: str) -> str | None:
    """The installed version of a distribution, or None."""
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def _own_version() -> str:
    """attnswitch's own version where it runs from a source tree without installed metadata (``PYTHONPATH=src``)."""
    from . import __version__

    return f"{__version__} (source)"


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
    dev = torch.device(device) if device is not None else default_device()
    env = {
        "device": dev.type,
        "gpu": None,
        "compute_capability": None,
        "driver": None,
        "cuda": torch.version.cuda,
        "cudnn": None,
        "torch": torch.__version__,
        "transformers": package_version("transformers"),
        "accelerate": package_version("accelerate"),
        "attnswitch": package_version("attnswitch") or _own_version(),
        "python": platform.python_version(),
        "cpu": platform.processor() or platform.machine(),
        "env_vars": relevant_env(),
    }
    if torch.cuda.is_available() and dev.type == "cuda":
        p = torch.cuda.get_device_properties(dev)
        env.update(gpu=p.name, compute_capability=f"{p.major}.{p.minor}", driver=_driver(),
                   cudnn=torch.backends.cudnn.version(), gpu_memory_gib=round(p.total_memory / 2**30, 1),
                   sm_count=p.multi_processor_count, gpus_visible=torch.cuda.device_count())
    return env
