"""The score tile every Triton kernel computes, forward and backward alike: products and
what the variants change, in one place (as src/cpu/common/score_mods.hpp for the CPU kernels).

Scores are kept in log2 units (exp2 in the softmax), in Options' order as the float64
definition (reference.py): scale·q·kᵀ → softcap (c·tanh(s/c)) → ·log2(e) → −ALiBi
(slope·|i + Sk − Sq − j|) → attn_mask (boolean False: hidden; additive: added) → the band
(visibility.py) and the sequence's end hide pairs (−inf).
"""
from __future__ import annotations

import triton
import triton.language as tl

# globals a jit function reads must be constexprs
LOG2E = tl.constexpr(1.4426950408889634)
LN2 = tl.constexpr(0.6931471805599453)


@triton.jit
def tanh(x):
    # 1 − 2/(e^{2x} + 1): exact limits ±1 (e^{2x} → inf or 0), absolute error ~1e-7 near 0
    return 1.0 - 2.0 / (tl.exp(2.0 * x) + 1.0)


@triton.jit
def dot(a, b, PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """a·b with float32 accumulation: 16-bit operands on tensor cores, float32 ones at
    PRECISION ("tf32x3", "tf32", "ieee"); UPCAST (the interpreter) multiplies 16-bit
    values as float32 (numpy has no bfloat16 matmul; the same products)."""
    if UPCAST:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    elif a.dtype == tl.float32:
        return tl.dot(a, b, input_precision=PRECISION)
    else:
        return tl.dot(a, b).to(tl.float32)


@triton.jit
def load_rows(base, rows, row_stride, dims, dim_stride, row_ok, dim_ok):
    """The tile [rows, dims] of a strided tensor (int64 row offsets), 0 outside."""
    return tl.load(base + rows[:, None] * row_stride + dims[None, :] * dim_stride,
                   mask=row_ok[:, None] & dim_ok[None, :], other=0.0)


@triton.jit
def modify(qk, i, j, row_ok, key_ok, lq, lk, lo, hi, scale, softcap, slope2, mask_rows, smk,
           cover, CAUSAL: tl.constexpr, WINDOW: tl.constexpr, MASK_KIND: tl.constexpr,
           SOFTCAP: tl.constexpr, ALIBI: tl.constexpr):
    """(s, t): the tile's scores in log2 units from the raw products qk of queries i and keys
    j, hidden pairs −inf; t = tanh(scale·qk/softcap) with SOFTCAP (the backward's chain rule:
    ds/dqk = scale·(1 − t²)), else 0. The tile is either orientation: i, row_ok and
    mask_rows (the attn_mask's row pointers, read where cover == 2: mixed) broadcast along
    one axis, j and key_ok along the other — [queries, keys] as i[:, None], j[None, :] (the
    forward, dQ), or [keys, queries] as j[:, None], i[None, :] (dK/dV: its products never
    transpose a register tile). slope2: the ALiBi slope in log2 units, a scalar or
    broadcast as i (one per row of a packed GQA tile)."""
    t = 0.0
    if SOFTCAP:
        t = tanh(qk * (scale / softcap))
        s = softcap * t * LOG2E
    else:
        s = qk * (scale * LOG2E)
    if ALIBI:
        s = s - slope2 * tl.abs(i + (lk - lq) - j).to(tl.float32)
    if MASK_KIND != 0:
        if cover == 2:
            value = tl.load(mask_rows + j.to(tl.int64) * smk, mask=row_ok & key_ok, other=0)
            if MASK_KIND == 1:
                s = tl.where(value != 0, s, float("-inf"))
            else:
                s = s + value.to(tl.float32) * LOG2E
    visible = key_ok
    if CAUSAL != 0 or WINDOW:
        diagonal = j - i
        visible = visible & (diagonal >= lo) & (diagonal <= hi)
    return tl.where(visible, s, float("-inf")), t
