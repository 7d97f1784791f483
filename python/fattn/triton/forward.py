"""fattn's one Triton forward kernel and the split-KV combine step.

One kernel serves every forward call on the GPU: dense (B, H, S, D) problems, packed
variable-length batches, and KV caches (per-sequence lengths, pages, split keys). What a
call needs is chosen by `tl.constexpr` switches, so each combination compiles to a kernel
that carries only its own work:

  CAUSAL      0 none, 1 top-left, 2 bottom-right          } the band of visible diagonals
  WINDOW      a sliding window (window_left/right >= 0)   } (visibility.band)
  MASK        0 none, 1 boolean, 2 additive attn_mask, with a per-tile cover (0 hidden:
              skipped, 1 unchanged: not read, 2 mixed: read)
  SOFTCAP, ALIBI, SINKS                                     the score modifiers
  DROPOUT     the probabilities P·V takes are dropped (dropout.py), not packed GQA
  LENGTHS     0 uniform, 1 per-sequence key counts (a KV cache), 2 cu_seqlens (varlen),
              3 cu_seqlens and seqused_k (varlen over a cache)
  PAGED       keys looked up in a block table
  PACK_GQA    the query heads of one kv head share a tile (rows = queries × group)
  SPLIT       each program takes one chunk of the keys; partials merged by _combine_kernel
  PRECISION   tl.dot's input precision for float32 ("ieee", "tf32x3", "tf32")
  UPCAST      16-bit products as float32 products of the 16-bit values (the interpreter:
              numpy has no bfloat16 matmul; the same numbers)

The tile loop, as in src/cpu/forward/fused.hpp (scores in log2 units, exp2):
  for each key tile the band (and the mask's cover) leaves:
    s ← scale·q·kᵀ → softcap → ·log2(e) → −ALiBi → +mask; hidden pairs −inf
    m' ← max(m, rowmax s); p ← 2^(s − m'); l ← 2^(m − m')·l + Σp; acc ← 2^(m − m')·acc + p·v
  out ← acc / l, lse ← ln 2·(m + log2 l)
A sink starts a row at m = sink, l = 1 (its term of the denominator). P is rounded to V's
dtype for P·V with 16-bit inputs (as FlashAttention and fattn's CUDA C++ kernel).
"""
from __future__ import annotations

import triton
import triton.language as tl

from . import dropout, scores, visibility

from .scores import LN2, LOG2E


@triton.jit
def _forward_kernel(
        Q, K, V, O, LSE, MASK, COVER, SLOPES, SINKS, SEQ_Q, SEQ_K, TABLE,
        sqb, sqh, sqs, sqd, skb, skh, sks, skd, svb, svh, svs, svd,
        sob, soh, sos, sod, slb, slh, sls, sos_split, sls_split,
        smb, smh, sms, smk, scb, sch, scm, scn, sab, sah, stb,
        q_heads, kv_heads, q_len, kv_len, head_dim, block_size, num_splits,
        scale, softcap, window_left, window_right,
        CAUSAL: tl.constexpr, WINDOW: tl.constexpr, MASK_KIND: tl.constexpr,
        SOFTCAP: tl.constexpr, ALIBI: tl.constexpr, SINKS_ON: tl.constexpr,
        LENGTHS: tl.constexpr, PAGED: tl.constexpr, PACK_GQA: tl.constexpr,
        SPLIT: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """Every call without dropout or seqused_k: the arguments of the kernel the H200 run
    verified, whose machine code is kept (fattn/dispatch/verified.json). SEQ_K stands in
    for the seed's pointer: with DROPOUT False it is never read."""
    _forward_full_kernel(
        Q, K, V, O, LSE, MASK, COVER, SLOPES, SINKS, SEQ_Q, SEQ_K, SEQ_K, TABLE,
        sqb, sqh, sqs, sqd, skb, skh, sks, skd, svb, svh, svs, svd,
        sob, soh, sos, sod, slb, slh, sls, sos_split, sls_split,
        smb, smh, sms, smk, scb, sch, scm, scn, sab, sah, stb,
        q_heads, kv_heads, q_len, kv_len, head_dim, block_size, num_splits,
        scale, softcap, window_left, window_right, SEQ_K, 0, 0, 1.0,
        CAUSAL, WINDOW, MASK_KIND, SOFTCAP, ALIBI, SINKS_ON, False, LENGTHS, PAGED, PACK_GQA,
        SPLIT, PRECISION, UPCAST, BLOCK_M, BLOCK_N, BLOCK_D)


@triton.jit
def _forward_full_kernel(
        Q, K, V, O, LSE, MASK, COVER, SLOPES, SINKS, SEQ_Q, SEQ_K, SEQ_USED, TABLE,
        sqb, sqh, sqs, sqd, skb, skh, sks, skd, svb, svh, svs, svd,
        sob, soh, sos, sod, slb, slh, sls, sos_split, sls_split,
        smb, smh, sms, smk, scb, sch, scm, scn, sab, sah, stb,
        q_heads, kv_heads, q_len, kv_len, head_dim, block_size, num_splits,
        scale, softcap, window_left, window_right,
        SEED, dropout_offset, dropout_threshold, dropout_scale,
        CAUSAL: tl.constexpr, WINDOW: tl.constexpr, MASK_KIND: tl.constexpr,
        SOFTCAP: tl.constexpr, ALIBI: tl.constexpr, SINKS_ON: tl.constexpr,
        DROPOUT: tl.constexpr,
        LENGTHS: tl.constexpr, PAGED: tl.constexpr, PACK_GQA: tl.constexpr,
        SPLIT: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """The forward with every argument: calls with dropout (its stream: the seed at SEED in
    device memory, offset, threshold, scale) or seqused_k (SEQ_USED, LENGTHS 3) launch it,
    and _forward_kernel runs it as its body with dropout off. One program's tile."""
    seed = 0
    if DROPOUT:
        seed = tl.load(SEED)
    tile = tl.program_id(0)
    split = tl.program_id(2)
    group = q_heads // kv_heads
    # --- the tile's rows: (query head, query) pairs -------------------------------------
    r = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    if PACK_GQA:
        b = tl.program_id(1) // kv_heads
        hk = tl.program_id(1) % kv_heads
        head = hk * group + r % group
        i = r // group
    else:
        b = tl.program_id(1) // q_heads
        head = tl.program_id(1) % q_heads
        hk = head // group
        i = r
    b = b.to(tl.int64)
    # --- the sequence's queries and keys -----------------------------------------------
    q_start, lq, k_start, lk = visibility.sequence(SEQ_Q, SEQ_K, SEQ_USED, b, q_len, kv_len, LENGTHS)
    rows = lq * group if PACK_GQA else lq
    row_ok = r < rows
    lo, hi = visibility.band(lq, lk, window_left, window_right, CAUSAL, WINDOW)
    i_first = tile * BLOCK_M
    i_last = tl.minimum(tile * BLOCK_M + BLOCK_M, rows) - 1
    if PACK_GQA:
        i_first = i_first // group
        i_last = i_last // group
    begin, end = visibility.key_range(i_first, i_last, lo, hi, lk, BLOCK_N)
    if SPLIT:
        chunk = tl.cdiv(tl.cdiv(tl.maximum(end - begin, 0), num_splits), BLOCK_N) * BLOCK_N
        begin = begin + split * chunk
        end = tl.minimum(end, begin + chunk)

    dims = tl.arange(0, BLOCK_D)
    dim_ok = dims < head_dim
    q_rows = (q_start + i).to(tl.int64)
    q_ptr = Q + b * sqb + head * sqh + q_rows * sqs
    # Q·Kᵀ sums the head dim in chains of at most CHAIN dims (as src/cpu/common/blocks.hpp's
    # for_chains): at D = 256 one chain of products had 1.5x torch's float32 error at large
    # logits, two have 0.9x (test_large_logits_float32)
    CHAIN: tl.constexpr = 128
    TWO_CHAINS: tl.constexpr = BLOCK_D > CHAIN
    HEAD: tl.constexpr = CHAIN if TWO_CHAINS else BLOCK_D
    head_dims = tl.arange(0, HEAD)
    q = tl.load(q_ptr[:, None] + head_dims[None, :] * sqd,
                mask=row_ok[:, None] & (head_dims < head_dim)[None, :], other=0.0)
    if TWO_CHAINS:
        tail_dims = CHAIN + tl.arange(0, BLOCK_D - CHAIN)
        q_tail = tl.load(q_ptr[:, None] + tail_dims[None, :] * sqd,
                         mask=row_ok[:, None] & (tail_dims < head_dim)[None, :], other=0.0)
    k_base = K + b * skb + hk * skh + k_start * sks
    v_base = V + b * svb + hk * svh + k_start * svs
    slope2 = 0.0
    if ALIBI:
        slope2 = tl.load(SLOPES + b * sab + head * sah).to(tl.float32) * LOG2E
        if PACK_GQA:  # one slope per row (its query head)
            slope2 = slope2[:, None]
    # --- the online softmax's state; a sink starts every row with its term -------------
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_M], tl.float32)
    if SINKS_ON:
        if split == 0:
            m = tl.zeros([BLOCK_M], tl.float32) + tl.load(SINKS + head).to(tl.float32) * LOG2E
            l = tl.where(m > float("-inf"), 1.0, 0.0)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)

    for start in range(begin, end, BLOCK_N):
        cover = 2
        if MASK_KIND != 0:  # the attn_mask's summary of this tile
            cover = tl.load(COVER + b * scb + head * sch + tile * scm + (start // BLOCK_N) * scn)
        if cover != 0:
            keys = start + tl.arange(0, BLOCK_N)
            key_ok = keys < lk
            if PAGED:
                page = tl.load(TABLE + b * stb + keys // block_size, mask=key_ok, other=0)
                k_rows = page.to(tl.int64) * skb + (keys % block_size) * sks
                v_rows = page.to(tl.int64) * svb + (keys % block_size) * svs
                k_ptr = K + hk * skh + k_rows
                v_ptr = V + hk * svh + v_rows
            else:
                k_ptr = k_base + keys.to(tl.int64) * sks
                v_ptr = v_base + keys.to(tl.int64) * svs
            k = tl.load(k_ptr[:, None] + head_dims[None, :] * skd,
                        mask=key_ok[:, None] & (head_dims < head_dim)[None, :], other=0.0)
            s = scores.dot(q, tl.trans(k), PRECISION, UPCAST)
            if TWO_CHAINS:
                k_tail = tl.load(k_ptr[:, None] + tail_dims[None, :] * skd,
                                 mask=key_ok[:, None] & (tail_dims < head_dim)[None, :],
                                 other=0.0)
                s += scores.dot(q_tail, tl.trans(k_tail), PRECISION, UPCAST)
            mask_rows = MASK
            if MASK_KIND != 0:
                mask_rows = (MASK + b * smb + head * smh + i.to(tl.int64) * sms)[:, None]
            s, _ = scores.modify(s, i[:, None], keys[None, :], row_ok[:, None],
                                 key_ok[None, :], lq, lk, lo, hi, scale, softcap, slope2,
                                 mask_rows, smk, cover, CAUSAL, WINDOW, MASK_KIND, SOFTCAP,
                                 ALIBI)
            m_new = tl.maximum(m, tl.max(s, 1))
            m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)  # no visible score yet
            p = tl.exp2(s - m_ref[:, None])
            alpha = tl.exp2(m - m_ref)
            l = l * alpha + tl.sum(p, 1)
            if DROPOUT:  # P·V takes the dropped probabilities; l keeps the undropped sum
                p = p * dropout.factors(seed, dropout_offset, dropout_threshold, dropout_scale,
                                        b * q_heads + head, i[:, None], keys[None, :])
            v = tl.load(v_ptr[:, None] + dims[None, :] * svd,
                        mask=key_ok[:, None] & dim_ok[None, :], other=0.0)
            acc = acc * alpha[:, None] + scores.dot(p.to(v.dtype), v, PRECISION, UPCAST)
            m = m_new

    # --- epilogue: out = acc / l, lse in natural units; a row that saw nothing: 0, −inf --
    seen = l > 0.0
    out = tl.where(seen[:, None], acc / tl.where(seen, l, 1.0)[:, None], 0.0)
    lse = tl.where(seen, (m + tl.log2(tl.where(seen, l, 1.0))) * LN2, float("-inf"))
    o_ptr = O + split * sos_split + b * sob + head * soh + q_rows * sos
    tl.store(o_ptr[:, None] + dims[None, :] * sod, out.to(O.dtype.element_ty),
             mask=row_ok[:, None] & dim_ok[None, :])
    tl.store(LSE + split * sls_split + b * slb + head * slh + q_rows * sls, lse, mask=row_ok)


@triton.jit
def _combine_kernel(OP, LSEP, O, LSE, sps, spb, sph, sps_row, spd, slps, slpb, slph, slps_row,
                    sob, soh, sos, sod, slb, slh, sls, q_heads, q_len, head_dim, num_splits,
                    SPLITS: tl.constexpr, BLOCK_D: tl.constexpr):
    """Merges the splits' partial outputs of one row by their logsumexps:
    out = Σ_s e^(lse_s − lse)·out_s, lse = ln Σ_s e^(lse_s)."""
    row = tl.program_id(0)
    b = (row // (q_heads * q_len)).to(tl.int64)
    h = (row // q_len) % q_heads
    i = (row % q_len).to(tl.int64)
    s = tl.arange(0, SPLITS)
    dims = tl.arange(0, BLOCK_D)
    split_ok = s < num_splits
    lse_s = tl.load(LSEP + s * slps + b * slpb + h * slph + i * slps_row, mask=split_ok,
                    other=float("-inf"))
    m = tl.max(lse_s, 0)
    m_ref = tl.where(m == float("-inf"), 0.0, m)
    w = tl.exp(lse_s - m_ref)
    total = tl.sum(w, 0)
    parts = tl.load(OP + s[:, None] * sps + b * spb + h * sph + i * sps_row + dims[None, :] * spd,
                    mask=split_ok[:, None] & (dims[None, :] < head_dim), other=0.0)
    out = tl.sum(parts * w[:, None], 0) / tl.where(total > 0.0, total, 1.0)
    lse = tl.where(total > 0.0, m_ref + tl.log(tl.where(total > 0.0, total, 1.0)), float("-inf"))
    tl.store(O + b * sob + h * soh + i * sos + dims * sod, out.to(O.dtype.element_ty),
             mask=dims < head_dim)
    tl.store(LSE + b * slb + h * slh + i * sls, lse)
