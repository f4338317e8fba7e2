"""Bring your own attention kernel: register it, and attnswitch switches it into real models, profiles it
and compares it with the built-in backends (numerics checked against eager float32).

On a GPU with Triton the kernel is a small FlashAttention-style Triton kernel written here (causal or
not, no mask, grouped-query heads); on a CPU it is attention in plain PyTorch. Either way it only has to
take ``F.scaled_dot_product_attention``'s arguments and return the output tensor.

    python examples/bring_your_own_kernel.py                          # default preset for this device
    python examples/bring_your_own_kernel.py --layers 2 --seq 32      # small
    python examples/bring_your_own_kernel.py --out results/           # and write the report
"""

import argparse

import torch

import attnswitch
from attnswitch.models import default_preset, load_model
from attnswitch.workload import make_workload


def torch_attention(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """attention in plain PyTorch: one GEMM, a masked softmax, one GEMM"""
    if enable_gqa:
        k, v = (t.repeat_interleave(q.shape[1] // t.shape[1], dim=1) for t in (k, v))
    s = q @ k.transpose(-2, -1) * (q.shape[-1] ** -0.5 if scale is None else scale)
    if is_causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).triu(1), float("-inf"))
    if attn_mask is not None:
        s = s.masked_fill(~attn_mask, float("-inf")) if attn_mask.dtype == torch.bool else s + attn_mask
    return torch.softmax(s, dim=-1).nan_to_num(0.0) @ v  # rows with nothing to attend to give 0, as SDPA's


try:  # Triton resolves names in a kernel from the module's globals: import at the top
    import triton
    import triton.language as tl
except ImportError:
    triton = None

if triton is not None:
    @triton.jit
    def _attention_kernel(Q, K, V, O, scale, sqb, sqh, sqs, skb, skh, sks, svb, svh, svs, sob, soh, sos, H, GROUP,
                          S_Q, S_K, CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                          D: tl.constexpr):
        """One block of query rows of one (batch, head): an online softmax over blocks of keys."""
        start_m, bh = tl.program_id(0), tl.program_id(1)
        b, h = bh // H, bh % H
        hk = h // GROUP  # the key/value head of this query head
        rows = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
        dims = tl.arange(0, D)
        q = tl.load(Q + b * sqb + h * sqh + rows[:, None] * sqs + dims[None, :], mask=rows[:, None] < S_Q, other=0.0)
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, D], tl.float32)
        if CAUSAL:  # key blocks past the diagonal hold nothing to attend to (those past S_K are masked below)
            end = (start_m + 1) * BLOCK_M
        else:
            end = S_K
        for start_n in range(0, end, BLOCK_N):
            cols = start_n + tl.arange(0, BLOCK_N)
            k = tl.load(K + b * skb + hk * skh + cols[None, :] * sks + dims[:, None], mask=cols[None, :] < S_K,
                        other=0.0)
            s = tl.dot(q, k) * (scale * 1.4426950408889634)  # log2(e): exp2 below
            keep = cols[None, :] < S_K
            if CAUSAL:  # top-left aligned, as SDPA's is_causal
                keep = keep & (rows[:, None] >= cols[None, :])
            s = tl.where(keep, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            alpha = tl.exp2(m_i - m_new)
            p = tl.exp2(s - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            v = tl.load(V + b * svb + hk * svh + cols[:, None] * svs + dims[None, :], mask=cols[:, None] < S_K,
                        other=0.0)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
            m_i = m_new
        acc = acc / l_i[:, None]
        tl.store(O + b * sob + h * soh + rows[:, None] * sos + dims[None, :], acc.to(O.dtype.element_ty),
                 mask=rows[:, None] < S_Q)


def triton_check(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa):
    """Why the Triton kernel cannot run these inputs (empty: it can)."""
    reasons = []
    if attn_mask is not None:
        reasons.append("this Triton kernel takes no attention mask")
    if dropout_p:
        reasons.append("this Triton kernel has no dropout")
    if q.dtype not in (torch.float16, torch.bfloat16):
        reasons.append(f"this Triton kernel takes float16 or bfloat16, not {q.dtype}")
    d = q.shape[-1]
    if d != v.shape[-1] or d not in (16, 32, 64, 128):
        reasons.append(f"this Triton kernel takes equal head dims of 16, 32, 64 or 128; got {d} and {v.shape[-1]}")
    return reasons


def triton_attention(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """a FlashAttention-style Triton kernel written in this example"""
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    b, h, s_q, d = q.shape
    out = torch.empty(b, h, s_q, d, device=q.device, dtype=q.dtype)
    block_m, block_n = 64, 64
    grid = (triton.cdiv(s_q, block_m), b * h)
    _attention_kernel[grid](q, k, v, out, d ** -0.5 if scale is None else scale, *q.stride()[:3], *k.stride()[:3],
                            *v.stride()[:3], *out.stride()[:3], h, h // k.shape[1], s_q, k.shape[2],
                            CAUSAL=is_causal, BLOCK_M=block_m, BLOCK_N=block_n, D=d)
    return out


p = argparse.ArgumentParser()
p.add_argument("--model", default=None)
p.add_argument("--seq", type=int, default=None)
p.add_argument("--layers", type=int, default=None)
p.add_argument("--out", default=None, help="write the report (JSON and markdown) into this folder")
args = p.parse_args()

cuda = torch.cuda.is_available()
fn, check = (triton_attention, triton_check) if cuda and triton is not None else (torch_attention, None)
name = attnswitch.register_backend("mine", fn, check=check, gqa=True, devices=["cuda"] if check else None)

# a bare call first: the kernel against SDPA
device = "cuda" if cuda else "cpu"
dtype = torch.bfloat16 if cuda else torch.float32
q = torch.randn(2, 8, 256, 64, device=device, dtype=dtype)
kv = torch.randn(2, 2, 256, 64, device=device, dtype=dtype)
out = attnswitch.attention(q, kv, kv, is_causal=True, enable_gqa=True, backend=name)
ref = torch.nn.functional.scaled_dot_product_attention(q, kv, kv, is_causal=True, enable_gqa=True)
print(f"{fn.__doc__}: max |out - SDPA| = {(out - ref).abs().max().item():.2e}")

# then a whole model, next to the built-ins (no padding: this kernel takes no mask)
model, about = load_model(args.model or default_preset(device), device=device, dtype="bf16" if cuda else "fp32",
                          layers=args.layers)
batch = make_workload(model, batch=4 if cuda else 2, seq=args.seq or (2048 if cuda else 64))
others = ["flex", "flash", "cudnn", "naive-inplace"] if cuda else ["naive", "math", "flash"]
report = attnswitch.compare(model, batch, backends=[name, *others], warmup=2, iters=6, model_name=args.model or about)
report.render(layers=False)
if args.out:
    from pathlib import Path

    Path(args.out).mkdir(parents=True, exist_ok=True)
    report.to_json(Path(args.out) / "bring_your_own_kernel.json")
    report.to_markdown(Path(args.out) / "bring_your_own_kernel.md")
mine = report[name]
if mine.ok:
    print(f"{name} ran: {', '.join(mine.attn_kernel_names) or ', '.join(mine.attn_ops)}")
attnswitch.unregister_backend(name)
