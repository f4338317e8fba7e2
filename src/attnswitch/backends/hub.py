"""Attention kernels from the Hugging Face hub, through the ``kernels`` package, as backends."""

from __future__ import annotations

from ..errors import BackendUnavailable
from .adapters import hub_adapter, importable, module
from .registry import define_backend

__all__ = ["register_hub_kernel"]


def register_hub_kernel(repo_id: str, name: str | None = None, *, revision: str | None = None,
                        version: int | str | None = None) -> str:
    """Load ``repo_id`` (``"kernels-community/flash-attn2"``) with ``kernels.get_kernel`` and register its
    ``flash_attn_func`` as backend ``name`` (default: the repository's name). It takes what the
    FlashAttention adapters take (no masks; causal only for equal query and key lengths); reports name
    the repository and the ``kernels`` version. Loading reaches the hub (or its local cache) now.
    Raises ``BackendUnavailable`` naming the package to install where ``kernels`` is absent."""
    backend = name or repo_id.rsplit("/", 1)[-1]
    if not importable("kernels"):
        raise BackendUnavailable(backend, None, ["hub kernels load through the kernels package, which is not "
                                                 "installed here: pip install kernels (or attnswitch[kernels])"])
    kw = {k: v for k, v in (("revision", revision), ("version", version)) if v is not None}
    try:
        kernel = module("kernels").get_kernel(repo_id, **kw)
    except Exception as e:  # no hub, no build for this torch/CUDA, a bad repository: all are reasons
        raise BackendUnavailable(backend, None, [f"kernels.get_kernel({repo_id!r}) failed: {type(e).__name__}: "
                                                 f"{e}"]) from e
    fn, check = hub_adapter(kernel, repo_id)
    return define_backend(backend, fn, devices={"cuda"}, check=check, gqa=True, softcap=True,
                          about=f"flash_attn_func of the hub kernel {repo_id}" + (f"@{revision}" if revision else ""),
                          package="kernels", module="kernels", install="pip install kernels (or attnswitch[kernels])")
