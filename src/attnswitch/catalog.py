"""What attnswitch knows about each built-in backend: one row each, read everywhere a fact is needed.

A leaf without torch, so that the command line checks names before torch is imported. The registry
(``backends/registry.py``) joins each row to its runner and fails at import where a row has none, or a
runner no row; nothing else keeps a list of built-in names. A new built-in is a row here and its runner.

Kinds of backend, which decide what a report may recommend in a tie (``PREFERENCE``):

- ``choice``: SDPA's own choice (``auto``): what a transformers model runs when nothing is changed;
- ``fused``: one fused kernel forced (``efficient``, ``flash``, ``cudnn``, ``flex``, ``fa2``, ``fa3``);
- ``unfused``: a hand-written or reference implementation (``naive``, ``naive-inplace``, ``math``):
  exact and slow, never deployed where a fused kernel is as fast;
- ``model``: the model's own attention code (``eager``, and ``eager-fp32``, the numerics reference).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Row", "ROWS", "BY_NAME", "NAMES", "ALIASES", "COMPARED", "FAMILIES", "FORCED", "GPU_ONLY", "OPAQUE",
           "WEIGHTS", "MODEL_LEVEL", "REFERENCE", "KINDS", "PREFERENCE", "KERNEL_OPS", "row", "family_of",
           "kernel_family", "attention_family", "preference", "transformers_name"]

KINDS = ("choice", "fused", "unfused", "model")
#: the SDPA kernel families, in the order a list of op or kernel names is searched for them (a name may hold
#: several words: cuDNN's kernels are named after flash attention)
FAMILIES = ("cudnn", "flash", "efficient", "math")


@dataclass(frozen=True)
class Row:
    """One built-in backend.

    ``family``: the SDPA kernel family it forces (None: it forces none); ``sdp_backend``: that family's
    ``torch.nn.attention.SDPBackend`` member; ``transformers``: the ``attn_implementation`` of transformers
    that runs the same kernels (None: none does); ``opaque``: one node of a compiled graph (inductor would
    otherwise replace its ops by a kernel of its own); ``weights``: it can return the attention weights;
    ``package``/``module``/``install``: the distribution, import name and install command of a third-party
    kernel (offered only where ``module`` is importable); ``compared``: among "all" backends; ``sdpa``: whether
    it runs an SDPA kernel (True: its family's; False: none; None: it cannot be told from kernel names, as SDPA's
    own choice or a FlashAttention package's); ``named``: its family's kernels carry the family's name (not
    ``math``'s GEMMs and elementwise kernels on a GPU)."""

    name: str
    kind: str
    about: str
    aliases: tuple[str, ...] = ()
    devices: frozenset[str] | None = None  # device types it runs on; None: any
    family: str | None = None
    sdp_backend: str | None = None
    transformers: str | None = None
    opaque: bool = False
    weights: bool = False
    package: str | None = None
    module: str | None = None
    install: str | None = None
    compared: bool = True
    sdpa: bool | None = None
    named: bool = True


_CUDA = frozenset({"cuda"})
_FA = ("{pkg}'s flash_attn_func ([b, s, h, d], grouped-query heads native, softcap); refuses attention masks "
       "(padding needs varlen) and causal calls with unequal query and key lengths (bottom-right alignment)")

#: every built-in backend, in the order reports list them
ROWS: tuple[Row, ...] = (
    Row("naive", "unfused", "q @ kᵀ * scale, masked_fill (out of place: one extra Memcpy DtoD), softmax, @ v",
        opaque=True, weights=True, sdpa=False),
    Row("naive-inplace", "unfused", "the same with masked_fill_ (no Memcpy)",
        aliases=("naive_inplace", "naiveinplace"), opaque=True, weights=True, sdpa=False),
    Row("math", "unfused", "SDPA's math backend (its own ATen op)", aliases=("sdpbackend.math",), family="math",
        sdp_backend="MATH", opaque=True, weights=True, sdpa=True, named=False),
    Row("efficient", "fused", "SDPA's memory-efficient (CUTLASS) kernel",
        aliases=("mem_efficient", "mem-efficient", "memory_efficient", "efficient_attention",
                 "sdpbackend.efficient_attention"),
        devices=_CUDA, family="efficient", sdp_backend="EFFICIENT_ATTENTION", sdpa=True),
    Row("flash", "fused", "SDPA's FlashAttention-2 kernel (on CPUs, its flash kernel for CPUs)",
        aliases=("flash_attention", "sdpbackend.flash_attention"), family="flash", sdp_backend="FLASH_ATTENTION",
        sdpa=True),
    Row("cudnn", "fused", "SDPA's cuDNN kernel", aliases=("cudnn_attention", "sdpbackend.cudnn_attention"),
        devices=_CUDA, family="cudnn", sdp_backend="CUDNN_ATTENTION", sdpa=True),
    Row("flex", "fused", "torch.nn.attention.flex_attention, compiled once per process per kind of call (Triton "
        "kernels; the first call of a kind compiles); masks as block masks, additive masks and softcap as "
        "score_mods. CUDA only: compiling it for CPUs took 35-47 s for the first kind and 10-17 s for each further "
        "one (torch 2.13, an idle 2-core machine)",
        aliases=("flex_attention", "flexattention"), devices=_CUDA, transformers="flex_attention", sdpa=False),
    Row("fa2", "fused", _FA.format(pkg="FlashAttention 2 (flash-attn)"), aliases=("flash_attention_2", "flash_attn_2"),
        devices=_CUDA, transformers="flash_attention_2", package="flash-attn", module="flash_attn",
        install="pip install flash-attn --no-build-isolation (or attnswitch[flash])"),
    Row("fa3", "fused", _FA.format(pkg="FlashAttention 3 (flash_attn_interface)") + "; no dropout",
        aliases=("flash_attention_3", "flash_attn_3"), devices=_CUDA, transformers="flash_attention_3",
        package="flash-attn-3", module="flash_attn_interface",
        install="build FlashAttention 3 from the hopper/ directory of github.com/Dao-AILab/flash-attention"),
    Row("auto", "choice", "SDPA's own choice (transformers' sdpa function in a model)", aliases=("sdpa",),
        transformers="sdpa"),
    Row("eager", "model", "the model's own transformers eager attention", transformers="eager", weights=True,
        sdpa=False),
    Row("eager-fp32", "model", "the model's eager attention computed in float32 (numerics reference)", weights=True,
        compared=False),
)

BY_NAME: dict[str, Row] = {r.name: r for r in ROWS}
NAMES: tuple[str, ...] = tuple(BY_NAME)
#: alias -> built-in backend
ALIASES: dict[str, str] = {a: r.name for r in ROWS for a in r.aliases}
#: the built-ins compared by default (third-party kernels: where their package is installed)
COMPARED: tuple[str, ...] = tuple(r.name for r in ROWS if r.compared)
#: the backends forcing an SDPA kernel family, that family's name
FORCED: tuple[str, ...] = tuple(r.name for r in ROWS if r.family is not None)
#: built-ins that run on CUDA tensors only
GPU_ONLY = frozenset(r.name for r in ROWS if r.devices == _CUDA)
#: one opaque node each in a compiled graph
OPAQUE = frozenset(r.name for r in ROWS if r.opaque)
#: those that can return the attention weights
WEIGHTS = frozenset(r.name for r in ROWS if r.weights)
#: the model's own attention code (needs its module: no bare call)
MODEL_LEVEL = frozenset(r.name for r in ROWS if r.kind == "model")
#: the numerics reference: the model's eager attention in float32, inside a model that stays in its dtype
REFERENCE = "eager-fp32"
#: ATen ops that name the attention kernel family, wherever they sit under an attention call
KERNEL_OPS = ("aten::_scaled_dot_product", *(f"aten::_{f}_attention" for f in FAMILIES if f != "math"))
#: words of op and kernel names that say an attention kernel ran
_ATTENTION_WORDS = ("attention", "sdpa", "fmha", "flash")
#: words in op and kernel names that name a family's kernels besides the family's own name (CUTLASS's)
_KERNEL_WORDS = {"efficient": ("fmha_cutlass", "_efficient_attention")}

#: where a tie is broken: the kind that changes least first (``auto``: nothing to deploy), then a fused
#: kernel, then a kernel of the user's, then an unfused one; the model's own code is never a pick
PREFERENCE = {"choice": 0, "fused": 1, "user": 2, "unfused": 3, "model": 4}

assert set(FORCED) == set(FAMILIES), "a forced family without its row"
assert not set(ALIASES) & set(NAMES), "an alias is a backend's name"


def row(name: str) -> Row | None:
    """The built-in row of a canonical name (None: a backend of the user's, or unknown)."""
    return BY_NAME.get(name)


def family_of(name: str) -> str | None:
    """The SDPA family a built-in backend forces (None: none, or not a built-in)."""
    r = BY_NAME.get(name)
    return r.family if r is not None else None


def preference(name: str) -> int:
    """Where ``name`` stands in a tie (``PREFERENCE``); a backend of the user's stands after the fused kernels."""
    r = BY_NAME.get(name)
    return PREFERENCE[r.kind if r is not None else "user"]


def transformers_name(name: str) -> str | None:
    """transformers' own ``attn_implementation`` running the same kernels as ``name`` (None: none)."""
    r = BY_NAME.get(name)
    return r.transformers if r is not None else None


def kernel_family(names) -> str | None:
    """The SDPA family a list of ATen op or kernel names ran (``cudnn``, ``flash``, ...; None: none of them)."""
    names = list(names)
    for fam in FAMILIES:
        words = (fam, *_KERNEL_WORDS.get(fam, ()))
        if any(w in n for n in names for w in words):
            return fam
    return None


def attention_family(name: str) -> str | None:
    """The SDPA family one op's or kernel's name is of (None: not an attention kernel's, or no family's)."""
    if any(w in name for w in _ATTENTION_WORDS):
        return kernel_family([name])
    return None
