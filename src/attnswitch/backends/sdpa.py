"""PyTorch's SDPA backends, forced without touching PyTorch's process-wide SDPA flags.

Each forced backend calls its own ATen op (``torch._scaled_dot_product_{flash,efficient,cudnn}_attention``,
``..._flash_attention_for_cpu``, ``..._attention_math``) after the input preparation
``F.scaled_dot_product_attention`` does for it (mask conversion, padding, log-sum-exp when a gradient
is needed) and after PyTorch's own eligibility checks (``torch.backends.cuda.can_use_*`` on CUDA; on
CPUs SDPA's choice, with the reasons from a mirror of its checks). A thread that runs plain SDPA, or
``torch.nn.attention.sdpa_kernel``, at the same time sees nothing change.

On CUDA, PyTorch's checks stop at a backend turned off in this process (``enable_flash_sdp(False)``,
or an ``sdpa_kernel`` context open in any thread); the forced backend is then refused with that reason.
"""

from __future__ import annotations

import functools
import re
import warnings

import torch
import torch.nn.functional as F

from .. import catalog, stderr
from .call import Call, note, repeat_kv, unavailable, validate

__all__ = ["forced", "runner", "COMMON_OPS", "common_call", "sdpa_auto", "auto_reasons", "auto_choice",
           "eligibility", "GPU_ONLY", "FORCED"]

#: the backends attnswitch forces, and the built-ins that run on CUDA tensors only (``catalog``'s rows)
FORCED, GPU_ONLY = catalog.FORCED, catalog.GPU_ONLY
# PyTorch's checks as its C++ functions where this torch has them (the public ones are a Python frame
# around them, and they run once per attention call)
_CAN_USE = {"flash": getattr(torch._C, "_can_use_flash_attention", torch.backends.cuda.can_use_flash_attention),
            "efficient": getattr(torch._C, "_can_use_mem_efficient_attention",
                                 torch.backends.cuda.can_use_efficient_attention),
            "cudnn": getattr(torch._C, "_can_use_cudnn_attention", torch.backends.cuda.can_use_cudnn_attention)}
_ENABLED = {"flash": torch.backends.cuda.flash_sdp_enabled, "efficient": torch.backends.cuda.mem_efficient_sdp_enabled,
            "cudnn": torch.backends.cuda.cudnn_sdp_enabled}
_SDPAParams = torch.backends.cuda.SDPAParams
_FLASH_ON = torch._C._get_flash_sdp_enabled  # torch.backends.cuda.flash_sdp_enabled without its Python frame
_TRIGGERED = re.compile(r"\s*\(Triggered internally at [^)]*\)\s*$")
_C10_WARNING = re.compile(r"Warning: (.*?)(?: \(function \w+\))?$")
_CPU_FLASH_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)
_SDPA_MASK_DTYPES = (torch.bool, torch.float32)  # and the query's dtype: what SDPA takes as attn_mask


def _grad(call: Call) -> bool:
    return torch.is_grad_enabled() and (call.q.requires_grad or call.k.requires_grad or call.v.requires_grad)


def _float_mask(mask: torch.Tensor | None, dtype: torch.dtype, fill: float = float("-inf")):
    """SDPA's conversion: a boolean mask (True = attend) as an additive one in the query's dtype. One ``where``
    kernel: both of its values are tensors on the mask's device (a Python number is made a CPU tensor that
    ``where`` copies to the GPU: a host-to-device memcpy at every call of a sliding layer)."""
    if mask is None or mask.dtype != torch.bool:
        return mask
    if type(mask) is not torch.Tensor:  # a fake or functional tensor (inside a trace): made there, never kept
        return torch.where(mask, torch.zeros((), dtype=dtype, device=mask.device),
                           torch.full((), fill, dtype=dtype, device=mask.device))
    return torch.where(mask, _scalar(0.0, dtype, mask.device), _scalar(fill, dtype, mask.device))


_SCALARS: dict = {}  # (value, dtype, device) -> a 0-dim tensor of it there


def _scalar(value: float, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``value`` as a 0-dim tensor on ``device``, made once (not kept where made inside a trace or a CUDA graph's
    capture, where it is only written at the graph's replay)."""
    key = (value, dtype, device)
    t = _SCALARS.get(key)
    if t is None:
        t = torch.full((), value, dtype=dtype, device=device)
        if not torch.compiler.is_compiling() and not (device.type == "cuda" and
                                                      torch.cuda.is_current_stream_capturing()):
            _SCALARS[key] = t
    return t


# -- eligibility ------------------------------------------------------------------------------------

def _params(call: Call, gqa: bool, **change):
    c = call._replace(**change) if change else call
    return _SDPAParams(c.q, c.k, c.v, c.mask, c.dropout, c.causal, gqa)


def _printed_reasons(name: str, call: Call, gqa: bool) -> list[str]:
    """PyTorch's own reasons: ``can_use_*(params, debug=True)`` warns them through c10, which prints them
    on the process's stderr (not as Python warnings); read from there, anything else written back."""
    with stderr.filtered(lambda line: _C10_WARNING.search(line) is not None) as printed, \
            warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _CAN_USE[name](_params(call, gqa), True)
    reasons = [_TRIGGERED.sub("", str(w.message)).strip() for w in caught]
    reasons += [m.group(1).strip() for line in printed if (m := _C10_WARNING.search(line))]
    return list(dict.fromkeys(reasons))


def _probed_reasons(name: str, call: Call, gqa: bool) -> list[str]:
    """Where PyTorch printed nothing: which single change of the inputs its check would accept."""
    can = _CAN_USE[name]
    probes = [("takes no attention mask", dict(mask=None)), ("takes no dropout", dict(dropout=0.0)),
              ("takes no inputs that require grad",
               dict(q=call.q.detach(), k=call.k.detach(), v=call.v.detach())),
              ("takes float16 or bfloat16 inputs only",
               dict(q=call.q.half(), k=call.k.half(), v=call.v.half()) if call.q.dtype == torch.float32 else None)]
    found = [f"PyTorch's can_use_{name}_attention accepts these inputs only if changed: it {text}"
             for text, change in probes if change is not None and can(_params(call, gqa, **change), False)]
    return found or [f"PyTorch's can_use_{name}_attention refused these inputs without printing a reason"]


def _cuda_reasons(name: str, call: Call, gqa: bool) -> list[str]:
    """Why PyTorch's check refused a CUDA call (it did)."""
    if not _ENABLED[name]():
        return [f"PyTorch's {name} SDPA backend is turned off in this process (torch.backends.cuda."
                f"{name.replace('efficient', 'mem_efficient')}_sdp_enabled() is False: an enable_*_sdp(False) call, "
                "or an sdpa_kernel context open in some thread), and PyTorch does not check it while it is off"]
    return _printed_reasons(name, call, gqa) or _probed_reasons(name, call, gqa)


_CPU_GQA: list[bool] = []


def _cpu_flash_takes_gqa() -> bool:
    """Whether this torch's CPU flash kernel takes fewer k/v heads than q heads: asked of SDPA's own
    choice once while the flash flag is on (it is by default); until then, yes (torch 2.5 and later)."""
    if not _CPU_GQA:
        if not torch.backends.cuda.flash_sdp_enabled():
            return True
        q, kv = torch.zeros(1, 2, 1, 8), torch.zeros(1, 1, 1, 8)
        try:
            _CPU_GQA.append(torch._fused_sdp_choice(q, kv, kv, enable_gqa=True) == 1)
        except RuntimeError:
            _CPU_GQA.append(False)
    return _CPU_GQA[0]


def _cpu_mask_reasons(call: Call) -> list[str]:
    m, q, k = call.mask, call.q, call.k
    if m is None:
        return []
    if m.requires_grad:
        return ["the CPU flash kernel takes no attn_mask that requires grad"]
    ok = m.dim() >= 2 and m.shape[-2] in (q.shape[2], 1) and m.shape[-1] in (k.shape[2], 1) and (
        m.dim() == 2 or (m.dim() == 4 and m.shape[0] in (1, q.shape[0]) and m.shape[1] in (1, q.shape[1])))
    return [] if ok else ["the CPU flash kernel takes attn_mask shapes 2d - ({Q_seq_len, 1} x {KV_seq_len, 1}) or "
                          "4d - ({Batch, 1} x {Num_heads, 1} x {Q_seq_len, 1} x {KV_seq_len, 1}); got "
                          f"{tuple(m.shape)}"]


def _cpu_flash_reasons(call: Call, gqa: bool) -> list[str]:
    """A mirror of PyTorch's CPU flash checks (``use_flash_attention_cpp``), for their reasons."""
    q, k, v = call.q, call.k, call.v
    reasons = []
    if call.dropout > 0:
        reasons.append("the CPU flash kernel takes no dropout (a dropout_p above 0)")
    if not (q.shape[0] == k.shape[0] == v.shape[0]):
        reasons.append(f"the CPU flash kernel needs equal batch sizes; got {q.shape[0]}, {k.shape[0]}, {v.shape[0]}")
    if k.shape[1] != v.shape[1] or (q.shape[1] != k.shape[1] and not (gqa and _cpu_flash_takes_gqa())):
        reasons.append("the CPU flash kernel needs equal head counts for q, k and v"
                       + (" (this torch has no grouped-query support on CPU)" if gqa else "")
                       + f"; got {q.shape[1]}, {k.shape[1]}, {v.shape[1]}")
    reasons += _cpu_mask_reasons(call)
    if not (q.shape[-1] == k.shape[-1] == v.shape[-1]):
        reasons.append("the CPU flash kernel needs one head size for q, k and v")
    if q.shape[2] == 0 or k.shape[2] == 0:
        reasons.append("the CPU flash kernel needs non-empty sequences")
    if any(t.stride(-1) != 1 for t in (q, k, v)):
        reasons.append("the CPU flash kernel needs the last dimension of q, k and v contiguous (stride 1)")
    if q.dtype not in _CPU_FLASH_DTYPES:
        reasons.append(f"the CPU flash kernel takes float32, float64, bfloat16 or float16, not {q.dtype}")
    return reasons


def _fused_choice(call: Call, gqa: bool) -> int:
    """SDPA's own choice for ``call`` (1: flash; -1: inputs it rejects)."""
    try:
        return torch._fused_sdp_choice(call.q, call.k, call.v, call.mask, call.dropout, call.causal,
                                       scale=call.scale, enable_gqa=gqa)
    except (RuntimeError, IndexError):  # (its CPU check indexes a mask's second-last dim: IndexError for 1-d)
        return -1


def _accepts(name: str, call: Call, gqa: bool) -> bool:
    """PyTorch's own check says yes: ``can_use_*`` on CUDA; on CPUs SDPA's own choice, while the flash
    flag is on (it is by default). The math backend takes anything."""
    if name == "math":
        return True
    q = call.q
    if q.is_cuda:  # (is_cuda / is_cpu: a fifth of the host time of ``.device.type``, and this runs per call)
        return name in _CAN_USE and _CAN_USE[name](
            _SDPAParams(q, call.k, call.v, call.mask, call.dropout, call.causal, gqa), False)
    return q.is_cpu and name == "flash" and _FLASH_ON() and _fused_choice(call, gqa) == 1


def eligibility(name: str, call: Call, gqa: bool | None = None) -> list[str]:
    """Why forced backend ``name`` cannot run ``call`` as given (empty: it can). Where PyTorch's own check
    says no, its reasons; on CPUs a mirror of its flash checks decides instead, so that a flash flag
    another thread turned off changes nothing here."""
    gqa = call.gqa if gqa is None else gqa
    if _accepts(name, call, gqa):
        return []
    dev = call.q.device.type
    if name in GPU_ONLY and dev != "cuda":
        return [f"the {name} backend runs only on CUDA tensors; these are on {dev}"]
    if dev == "cuda":
        return _cuda_reasons(name, call, gqa)
    if name == "flash" and dev == "cpu":
        return _cpu_flash_reasons(call, gqa)
    return [f"the {name} backend does not run on {dev} tensors"]


def _extra_reasons(name: str, call: Call) -> list[str]:
    """What SDPA has no parameter for: softcapping always, attention sinks where no log-sum-exp helps."""
    reasons = []
    if call.softcap is not None:
        reasons.append("scaled_dot_product_attention has no logit softcapping (softcap); use naive, eager or flex")
    if call.sinks is not None:
        if name == "math":
            reasons.append("SDPA's math backend has no attention sinks (s_aux) and returns no log-sum-exp to apply "
                           "them with; use naive or eager")
        elif _grad(call):
            reasons.append("attention sinks (s_aux) are applied through the kernel's log-sum-exp, which carries no "
                           "gradient; for training use naive or eager")
    return reasons


# -- running ----------------------------------------------------------------------------------------

def _pad8(t: torch.Tensor) -> torch.Tensor:
    pad = -t.shape[-1] % 8
    return F.pad(t, (0, pad)) if pad else t


def _efficient_mask(mask: torch.Tensor, call: Call) -> torch.Tensor:
    """SDPA's preparation for the efficient kernel: strides aligned to 8, expanded to the scores' shape."""
    if not (all(s % 8 == 0 for s in mask.stride()[:-1]) and mask.stride(-1) == 1):
        last = mask.shape[-1]
        mask = F.pad(mask, (0, 8 - last % 8))[..., :last]
    return mask.expand(call.q.shape[0], call.q.shape[1], call.q.shape[2], call.k.shape[2])


def _run(name: str, call: Call, gqa: bool, lse: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(out, log-sum-exp or attention weights or None)`` from the backend's own op."""
    q, k, v, mask = call.q, call.k, call.v, call.mask
    if mask is not None and mask.dtype == torch.bool:
        mask = _float_mask(mask, q.dtype, -65504.0 if name == "cudnn" else float("-inf"))
    if name == "math":
        return torch._scaled_dot_product_attention_math(q, k, v, mask, call.dropout,
                                                         call.causal, None, scale=call.scale, enable_gqa=gqa)
    if name == "flash" and q.is_cpu:
        return torch._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, call.dropout, call.causal, attn_mask=mask, scale=call.scale)
    if name == "flash":
        d = q.shape[-1]
        scale = d ** -0.5 if call.scale is None else call.scale  # of the head dim before padding
        out, logsumexp, *_ = torch._scaled_dot_product_flash_attention(_pad8(q), _pad8(k), _pad8(v), call.dropout,
                                                                        call.causal, False, scale=scale)
        return (out[..., :d] if out.shape[-1] != d else out), logsumexp
    with_lse = lse or (torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad))  # _grad
    if name == "efficient":
        mask = _efficient_mask(mask, call) if mask is not None else None
        out, logsumexp, *_ = torch._scaled_dot_product_efficient_attention(q, k, v, mask, with_lse, call.dropout,
                                                                            call.causal, scale=call.scale)
        return out, logsumexp
    out, logsumexp, *_ = torch._scaled_dot_product_cudnn_attention(
        q, k, v, mask, with_lse, call.dropout, call.causal, False,
        scale=call.scale)
    return out, logsumexp


def _with_sinks(out: torch.Tensor, lse: torch.Tensor, call: Call) -> torch.Tensor:
    """Attention with a sink logit per head, from attention without: ``out · σ(lse − sink)``, since the
    sink takes ``e^sink / (Z + e^sink)`` of the softmax mass (``Z = e^lse``)."""
    b, h, s = out.shape[0], out.shape[1], out.shape[2]
    lse = lse.reshape(b, h, -1)[..., :s].float()
    keep = torch.sigmoid(lse - call.sinks.reshape(1, h, 1).float())
    return out * keep.unsqueeze(-1).to(out.dtype)


def _relaid(call: Call) -> tuple[Call, str] | None:
    """The same attention with a pure layout change that may make it eligible, and what was changed:
    k/v heads repeated (a backend without grouped-query support), last dims made contiguous."""
    changes = []
    k, v = call.k, call.v
    if call.gqa:
        n_rep = call.q.shape[1] // k.shape[1]
        k, v = repeat_kv(k, n_rep), repeat_kv(v, n_rep)
        changes.append(f"repeated k/v heads x{n_rep}")
    q = call.q
    if any(t.stride(-1) != 1 for t in (q, k, v)):
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        changes.append("made q/k/v contiguous in the last dimension")
    return (call._replace(q=q, k=k, v=v), ", ".join(changes)) if changes else None


def forced(name: str, call: Call) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Run ``call`` with SDPA backend ``name`` and nothing else; ``(out, weights or None)``. Raises
    ``BackendUnavailable`` (PyTorch's reasons) when the backend cannot take the inputs, and SDPA's own
    error for inputs no backend takes."""
    if call.softcap is not None or call.sinks is not None:
        extra = _extra_reasons(name, call)
        if extra:
            raise unavailable(name, call, extra)
    q, mask = call.q, call.mask
    if name == "math" or q.dtype != call.k.dtype or q.dtype != call.v.dtype or \
            (mask is not None and mask.dtype not in _SDPA_MASK_DTYPES and mask.dtype != q.dtype):
        # SDPA's own errors first: PyTorch's checks pass q/k/v of different dtypes to math, which computes
        # them (and on CPUs to flash), and masks SDPA rejects (uint8, int64, float64) to any backend
        validate(call)
    gqa = call.k.shape[1] != q.shape[1]  # call.gqa (once per attention call: no property frame)
    if gqa and q.shape[1] % call.k.shape[1]:
        validate(call)  # SDPA's own error: PyTorch's CPU check lets k/v heads that do not divide q's through
    reasons = [] if _accepts(name, call, gqa) else eligibility(name, call, gqa)  # the reasons only where refused
    run_call = call
    if reasons:
        alt = _relaid(call)
        alt_reasons = eligibility(name, alt[0], False) if alt is not None else None
        if alt_reasons is not None and not alt_reasons:
            run_call, gqa = alt[0], False
            note(name, call, f"{alt[1]} (the {name} backend refuses the inputs as given)")
        else:
            validate(call)  # inputs no backend takes get SDPA's own error, not a refusal
            more = [f"with {alt[1]}: {r}" for r in alt_reasons] if alt_reasons else []
            raise unavailable(name, call, reasons + [r for r in more if r[r.index(': ') + 2:] not in reasons])
    out, second = _run(name, run_call, gqa, lse=call.sinks is not None)
    if name == "math":
        return out, (second if call.need_weights else None)
    if call.sinks is not None:
        out = _with_sinks(out, second, call)
    return out, None


# -- the common call first ----------------------------------------------------------------------------
# Every attention call of a switched model pays its host time per layer per step (decode is host-bound).
# For the call most models make (no mask, no softcap or sinks, the head dim a multiple of 8) the backend's
# common op below does what ``forced`` does, PyTorch's check and then the backend's op, in one Python
# frame; it returns None where the check refuses, and the caller goes to ``forced`` (which says why, or
# lays the inputs out so that the backend takes them).

_GRAD_ON = torch.is_grad_enabled
_CAN_CUDNN, _CAN_FLASH, _CAN_EFFICIENT = _CAN_USE["cudnn"], _CAN_USE["flash"], _CAN_USE["efficient"]
_CUDNN_OP = torch._scaled_dot_product_cudnn_attention
_EFFICIENT_OP = torch._scaled_dot_product_efficient_attention
_FLASH_OP = torch._scaled_dot_product_flash_attention
_CPU_FLASH_OP = torch._scaled_dot_product_flash_attention_for_cpu
_FUSED_CHOICE = torch._fused_sdp_choice


def _cudnn_common(q, k, v, dropout, causal, scale, gqa):
    if q.is_cuda and _CAN_CUDNN(_SDPAParams(q, k, v, None, dropout, causal, gqa), False):
        lse = _GRAD_ON() and (q.requires_grad or k.requires_grad or v.requires_grad)  # _grad(call)
        return _CUDNN_OP(q, k, v, None, lse, dropout, causal, False, scale=scale)[0]
    return None


def _efficient_common(q, k, v, dropout, causal, scale, gqa):
    if q.is_cuda and _CAN_EFFICIENT(_SDPAParams(q, k, v, None, dropout, causal, gqa), False):
        lse = _GRAD_ON() and (q.requires_grad or k.requires_grad or v.requires_grad)
        return _EFFICIENT_OP(q, k, v, None, lse, dropout, causal, scale=scale)[0]
    return None


def _flash_common(q, k, v, dropout, causal, scale, gqa):
    if q.is_cuda:
        if _CAN_FLASH(_SDPAParams(q, k, v, None, dropout, causal, gqa), False):
            return _FLASH_OP(q, k, v, dropout, causal, False, scale=scale)[0]
    elif q.is_cpu and _FLASH_ON():  # SDPA's own choice decides on CPUs, as in forced (_accepts)
        try:
            ok = _FUSED_CHOICE(q, k, v, None, dropout, causal, scale=scale, enable_gqa=gqa) == 1
        except RuntimeError:
            return None
        if ok:
            try:  # (SDPA's CPU choice lets q/k/v of different dtypes through; forced gives SDPA's error)
                return _CPU_FLASH_OP(q, k, v, dropout, causal, attn_mask=None, scale=scale)[0]
            except RuntimeError:
                return None
    return None


#: backend -> its op for the common call, ``op(q, k, v, dropout, causal, scale, gqa)`` -> the output
#: ``[b, h, s, d]``, or None where PyTorch's check refuses (then ``forced``). The common call: no mask,
#: softcap or sinks; k/v heads that divide q's (``gqa``: fewer); a head dim that is a multiple of 8.
COMMON_OPS = {"cudnn": _cudnn_common, "efficient": _efficient_common, "flash": _flash_common}


def common_call(q, k, mask, softcap, sinks) -> bool | None:
    """Whether a call is the common one: ``gqa`` (False or True) where it is, else None."""
    if mask is not None or softcap is not None or sinks is not None:
        return None
    qs, ks = q.shape, k.shape
    if qs[1] % ks[1] or qs[-1] % 8:
        return None
    return ks[1] != qs[1]


def _common_first(name: str):
    op = COMMON_OPS[name]

    def run(call: Call):
        q, k, v, mask, dropout, causal, scale, softcap, sinks, _, _ = call
        gqa = common_call(q, k, mask, softcap, sinks)
        if gqa is not None:
            out = op(q, k, v, dropout, causal, scale, gqa)
            if out is not None:
                return out, None
        return forced(name, call)
    run.__name__ = run.__qualname__ = f"run_{name}"
    return run


def runner(name: str):
    """``Backend.run`` of forced backend ``name``: ``forced(name, call)``, the common call first."""
    return _common_first(name) if name in COMMON_OPS else functools.partial(forced, name)


def auto_reasons(softcap, sinks) -> list[str]:
    """Why SDPA's own choice (``auto``, bare or through transformers' sdpa function) cannot run a call."""
    reasons = []
    if softcap is not None:
        reasons.append("SDPA (and transformers' sdpa attention) has no logit softcapping (softcap); use naive, "
                       "eager or flex")
    if sinks is not None:
        reasons.append("SDPA has no attention sinks (s_aux), and transformers' sdpa attention ignores them; use naive "
                       "or eager")
    return reasons


def sdpa_auto(call: Call) -> tuple[torch.Tensor, None]:
    """SDPA's own choice (``F.scaled_dot_product_attention`` under the flags as they are)."""
    if call.softcap is not None or call.sinks is not None:
        raise unavailable("auto", call, auto_reasons(call.softcap, call.sinks))
    return F.scaled_dot_product_attention(call.q, call.k, call.v, attn_mask=call.mask, dropout_p=call.dropout,
                                          is_causal=call.causal, scale=call.scale, enable_gqa=call.gqa), None


def auto_choice(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor | None = None,
                dropout_p: float = 0.0, is_causal: bool = False, scale: float | None = None,
                enable_gqa: bool = False) -> str:
    """The backend SDPA's own choice (``auto``) takes for these inputs under the current flags."""
    choice = int(torch._fused_sdp_choice(q, k, v, attn_mask, dropout_p, is_causal, scale=scale,
                                         enable_gqa=enable_gqa))
    names = {int(getattr(torch.nn.attention.SDPBackend, r.sdp_backend)): r.name for r in catalog.ROWS if r.sdp_backend}
    return names.get(choice, str(torch.nn.attention.SDPBackend(choice)).split(".")[-1].lower())
