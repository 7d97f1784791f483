"""An independent FlashAttention forward in Triton: a second fast implementation, written
apart from fattn's C++/CUDA kernels, to check them against (and to read beside them).

    import fattn.triton
    out, lse = fattn.triton.attention(q, k, v, causal=True, return_lse=True)

q (B, Hq, Sq, D), k and v (B, Hkv, Sk, D), Hq a multiple of Hkv, D in 16..256 (padded to a
power of two inside the kernel), float32 / float16 / bfloat16, any strides. causal: top-left
(torch's), or bottom-right with causal_bottom_right=True (FlashAttention's). Returns out in
q's dtype and, with return_lse, the (B, Hq, Sq) float32 natural-log logsumexp; a row that
sees no key gives 0 and -inf, as fattn.

Runs on CUDA tensors with a GPU, and on CPU tensors under Triton's interpreter
(TRITON_INTERPRET=1, set before triton is imported; needs numpy < 2.4 with triton 3.6).
Imported only on use: triton is optional.

The algorithm, step by step as in src/cpu/fused.hpp and src/cuda/fused_mma.cuh:
  q ← Q tile · scale·log2(e)                    (fused.hpp: load_q_transposed's factor)
  for each key tile up to the causal limit:     (the same tile skipping)
    s ← q·kᵀ, hidden pairs −inf                  (scores_tile, mask_tile)
    m_new ← max(m, rowmax s); p ← 2^(s − m_new)  (softmax_update, exp2 in log2 units)
    l ← 2^(m − m_new)·l + rowsum p; acc ← 2^(m − m_new)·acc + p·v   (pv_accumulate)
  out ← acc / l; lse ← ln 2·(m + log2 l)
Where they differ: Triton holds the tile as queries × keys in registers and lets tl.dot
pick the instruction (the CPU keeps keys × queries in L1 for vertical softmax steps); P is
rounded to V's dtype for P·V with 16-bit inputs, as FlashAttention and fattn's CUDA kernel
do (the CPU kernels keep P in float32); float32 products run at full float32 precision
("ieee"), where fattn's CUDA float32 mode is 3xTF32. Under the interpreter the 16-bit
products run as float32 products of the 16-bit values (the same numbers; numpy has no
bfloat16 matmul), on a GPU on tensor cores with float32 accumulation.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

_LOG2E = 1.4426950408889634


@triton.jit
def _forward_kernel(Q, K, V, O, LSE,
                    sqb, sqh, sqs, sqd, skb, skh, sks, skd, svb, svh, svs, svd,
                    sob, soh, sos, sod, slb, slh, sls,
                    q_heads, group, q_len, kv_len, head_dim, scale_log2, causal_offset,
                    CAUSAL: tl.constexpr, IEEE: tl.constexpr, BLOCK_M: tl.constexpr,
                    BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    tile = tl.program_id(0)
    b = tl.program_id(1) // q_heads
    h = tl.program_id(1) % q_heads
    hk = h // group
    rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, BLOCK_D)
    row_ok = rows < q_len
    dim_ok = dims < head_dim
    q = tl.load(Q + b * sqb + h * sqh + rows[:, None] * sqs + dims[None, :] * sqd,
                mask=row_ok[:, None] & dim_ok[None, :], other=0.0)
    q = (q.to(tl.float32) * scale_log2)

    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    end = kv_len
    if CAUSAL:  # keys past the last row's limit are never visited
        end = tl.minimum(kv_len, tile * BLOCK_M + BLOCK_M + causal_offset)
    for start in range(0, end, BLOCK_N):
        keys = start + tl.arange(0, BLOCK_N)
        key_ok = keys < kv_len
        k = tl.load(K + b * skb + hk * skh + keys[:, None] * sks + dims[None, :] * skd,
                    mask=key_ok[:, None] & dim_ok[None, :], other=0.0)
        v = tl.load(V + b * svb + hk * svh + keys[:, None] * svs + dims[None, :] * svd,
                    mask=key_ok[:, None] & dim_ok[None, :], other=0.0)
        if IEEE:  # float32 products (16-bit operands widened exactly, off tensor cores)
            s = tl.dot(q.to(k.dtype).to(tl.float32), tl.trans(k.to(tl.float32)),
                       input_precision="ieee")
        else:
            s = tl.dot(q.to(k.dtype), tl.trans(k)).to(tl.float32)
        visible = key_ok[None, :]
        if CAUSAL:
            visible = visible & (keys[None, :] <= rows[:, None] + causal_offset)
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1))
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row that saw no key yet
        p = tl.exp2(s - m_ref[:, None])
        alpha = tl.exp2(m - m_ref)
        l = l * alpha + tl.sum(p, 1)
        if IEEE:
            pv = tl.dot(p.to(v.dtype).to(tl.float32), v.to(tl.float32), input_precision="ieee")
        else:
            pv = tl.dot(p.to(v.dtype), v).to(tl.float32)
        acc = acc * alpha[:, None] + pv
        m = m_new

    seen = l > 0.0
    out = tl.where(seen[:, None], acc / tl.where(seen, l, 1.0)[:, None], 0.0)
    tl.store(O + b * sob + h * soh + rows[:, None] * sos + dims[None, :] * sod,
             out.to(O.dtype.element_ty), mask=row_ok[:, None] & dim_ok[None, :])
    lse = tl.where(seen, (m + tl.log2(tl.where(seen, l, 1.0))) * 0.6931471805599453,
                   float("-inf"))
    tl.store(LSE + b * slb + h * slh + rows * sls, lse, mask=row_ok)


def attention(q, k, v, causal=False, causal_bottom_right=False, scale=None, return_lse=False,
              block_m=64, block_n=64):
    """FlashAttention's forward in Triton (see the module's docstring)."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 4:
            raise ValueError(f"fattn.triton.attention: {name} must be (B, H, S, D), got shape "
                             f"{tuple(t.shape)}")
        if t.dtype not in (torch.float32, torch.float16, torch.bfloat16) or t.dtype != q.dtype:
            raise ValueError(f"fattn.triton.attention: q, k, v must share one dtype of float32, "
                             f"float16, bfloat16; got {q.dtype}, {k.dtype}, {v.dtype}")
    b, hq, sq, d = q.shape
    hkv, sk = k.size(1), k.size(2)
    if k.shape != v.shape or k.size(0) != b or k.size(3) != d or hq % hkv:
        raise ValueError(f"fattn.triton.attention: shapes q {tuple(q.shape)}, k {tuple(k.shape)}, "
                         f"v {tuple(v.shape)} do not fit (B, Hq, Sq, D), (B, Hkv, Sk, D), "
                         "Hq a multiple of Hkv")
    if not 16 <= d <= 256:
        raise ValueError(f"fattn.triton.attention: head dim must be in [16, 256], got {d}")
    if causal_bottom_right and not causal:
        raise ValueError("fattn.triton.attention: causal_bottom_right=True needs causal=True")
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = torch.empty((b, hq, sq), dtype=torch.float32, device=q.device)
    grid = (triton.cdiv(sq, block_m), b * hq)
    _forward_kernel[grid](
        q, k, v, out, lse, *q.stride(), *k.stride(), *v.stride(), *out.stride(), *lse.stride(),
        hq, hq // hkv, sq, sk, d, scale * _LOG2E, sk - sq if causal_bottom_right else 0,
        CAUSAL=bool(causal), IEEE=q.dtype == torch.float32 or not q.is_cuda,
        BLOCK_M=block_m, BLOCK_N=block_n,
        BLOCK_D=max(16, triton.next_power_of_2(d)))
    return (out, lse) if return_lse else out
