"""Which keys a query sees, for every Triton kernel: the band of visible diagonals.

As in src/model/problem.hpp (Problem::band_lo_of / band_hi_of): key j is visible to query i
of a sequence with lq queries and lk keys iff j < lk and lo <= j − i <= hi, where the
causal limit and the sliding window meet in one band. Both are aligned at `align`: 0 for
top-left causal, lk − lq otherwise (bottom-right, FlashAttention's, also the window's
alone). The attn_mask, softcap, ALiBi and sinks change scores, not the band
(fattn/triton/forward.py).
"""
from __future__ import annotations

import triton
import triton.language as tl

# The band's open ends (no limit on that side); sequence lengths stay below it
# (fattn/triton/problem.py checks), so i ± UNBOUNDED never overflows int32.
UNBOUNDED = 1 << 30
_UNBOUNDED = tl.constexpr(UNBOUNDED)  # jit functions read globals only as constexprs


@triton.jit
def band(lq, lk, window_left, window_right, CAUSAL: tl.constexpr, WINDOW: tl.constexpr):
    """(lo, hi): the visible diagonals j − i. CAUSAL: 0 none, 1 top-left, 2 bottom-right;
    WINDOW: window_left/right (−1: unbounded on that side) apply."""
    if CAUSAL == 1:
        align = lk * 0
    else:
        align = lk - lq
    hi = align * 0 + _UNBOUNDED
    lo = align * 0 - _UNBOUNDED
    if CAUSAL != 0:
        hi = align
    if WINDOW:
        hi = tl.where(window_right >= 0, tl.minimum(hi, align + window_right), hi)
        lo = tl.where(window_left >= 0, align - window_left, lo)
    return lo, hi


@triton.jit
def key_range(i_first, i_last, lo, hi, lk, BLOCK_N: tl.constexpr):
    """[begin, end): the keys some query in [i_first, i_last] sees, begin rounded down to
    a whole key tile (the mask cover's tiles start there); empty when i_last < i_first."""
    begin = tl.minimum(tl.maximum(i_first + lo, 0), lk)
    end = tl.minimum(tl.maximum(i_last + hi + 1, 0), lk)
    begin = begin // BLOCK_N * BLOCK_N
    end = tl.where(i_last >= i_first, end, begin)
    return begin, end


@triton.jit
def sequence(SEQ_Q, SEQ_K, SEQ_USED, b, q_len, kv_len, LENGTHS: tl.constexpr):
    """(first query row, queries, first key row, keys) of sequence b. LENGTHS: 0 every
    sequence q_len × kv_len; 1 SEQ_K[b] keys (a KV cache); 2 cu_seqlens offsets (packed);
    3 as 2, but SEQ_USED[b] keys (FlashAttention's seqused_k: the first of its rows or
    pages)."""
    q_start = 0
    k_start = 0
    lq = q_len
    lk = kv_len
    if LENGTHS == 1:
        lk = tl.load(SEQ_K + b)
    if LENGTHS >= 2:
        q_start = tl.load(SEQ_Q + b)
        lq = tl.load(SEQ_Q + b + 1) - q_start
        k_start = tl.load(SEQ_K + b)
        lk = tl.load(SEQ_K + b + 1) - k_start
    if LENGTHS == 3:
        lk = tl.load(SEQ_USED + b)
    return q_start, lq, k_start, lk
