"""fattn's Triton backward: dQ, dK, dV of the forward in forward.py, FlashAttention 2's
split into two kernels that each own what they write (no atomics, so the gradients are
the same bits run to run):

  _dkdv_kernel  one program per key tile of one kv head: every query head of its group and
                every query tile whose band reaches the keys; dK and dV summed over the
                group in registers (GQA without copies)
  _dq_kernel    one program per query tile of one query head: every key tile of its band

Both recompute the probabilities from the forward's logsumexp, p = 2^(s − lse·log2 e), with
the forward's score tile (scores.modify: softcap, ALiBi, the mask's cover, the band), so
every variant the forward takes has its gradient:
  dV = Pᵀ·dO,  dP = dO·Vᵀ,  dS = P ∘ (dP − Δ)  with Δ = rowsum(dO ∘ O) − dlse,
  with dropout dV = (P ∘ F)ᵀ·dO and dP = (dO·Vᵀ) ∘ F, F the mask's factors (dropout.py),
  through the softcap dS ← dS·(1 − tanh²),  dQ = scale·dS·K,  dK = scale·dSᵀ·Q.
P and dS are rounded to the inputs' dtype for their products with 16-bit inputs, as in
FlashAttention. The sinks' gradient, −Σ_rows e^(sink − lse)·Δ, is a torch reduction
(api.py). Padded rows and keys contribute nothing; a row that saw no key (lse = −inf)
has P = 0.
"""
from __future__ import annotations

import triton
import triton.language as tl

from . import dropout, scores, visibility
from .scores import LOG2E


@triton.jit
def _query_rows(Q, DO, LSE, DELTA, b, head, q_rows, dims, row_ok, dim_ok, sqb, sqh, sqs, sqd,
                sdob, sdoh, sdos, sdod, slb, slh, sls):
    """q, dO, the logsumexp in log2 units (+inf for a row that saw no key: P = 0 there)
    and Δ of the query rows q_rows of (b, head)."""
    q = scores.load_rows(Q + b * sqb + head * sqh, q_rows, sqs, dims, sqd, row_ok, dim_ok)
    do = scores.load_rows(DO + b * sdob + head * sdoh, q_rows, sdos, dims, sdod, row_ok, dim_ok)
    lse = tl.load(LSE + b * slb + head * slh + q_rows * sls, mask=row_ok, other=float("inf"))
    delta = tl.load(DELTA + b * slb + head * slh + q_rows * sls, mask=row_ok, other=0.0)
    return q, do, tl.where(lse == float("-inf"), float("inf"), lse * LOG2E), delta


@triton.jit
def _dkdv_kernel(
        Q, K, V, DO, LSE, DELTA, DK, DV, MASK, COVER, SLOPES, SEQ_Q, SEQ_K,
        sqb, sqh, sqs, sqd, skb, skh, sks, skd, svb, svh, svs, svd,
        sdob, sdoh, sdos, sdod, slb, slh, sls, sdkb, sdkh, sdks, sdkd, sdvb, sdvh, sdvs, sdvd,
        smb, smh, sms, smk, scb, sch, scm, scn, sab, sah,
        q_heads, kv_heads, q_len, kv_len, head_dim, scale, softcap, window_left, window_right,
        SEED, dropout_offset, dropout_threshold, dropout_scale,
        CAUSAL: tl.constexpr, WINDOW: tl.constexpr, MASK_KIND: tl.constexpr,
        SOFTCAP: tl.constexpr, ALIBI: tl.constexpr, DROPOUT: tl.constexpr,
        LENGTHS: tl.constexpr,
        PRECISION: tl.constexpr, UPCAST: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    # The tile is [keys, queries]: Sᵀ = K·Qᵀ, so Pᵀ and dSᵀ come out of their products
    # already as the left operands of dV += Pᵀ·dO and dK += dSᵀ·Q. Transposing a product's
    # register tile instead (dV += trans(P)·dO) is what Triton 3.6 compiles wrongly on
    # Hopper (docs/triton.md, "The backward"); only loaded tiles are transposed here.
    key_tile = tl.program_id(0)
    b = (tl.program_id(1) // kv_heads).to(tl.int64)
    hk = tl.program_id(1) % kv_heads
    group = q_heads // kv_heads
    q_start, lq, k_start, lk = visibility.sequence(SEQ_Q, SEQ_K, SEQ_K, b, q_len, kv_len, LENGTHS)
    lo, hi = visibility.band(lq, lk, window_left, window_right, CAUSAL, WINDOW)
    keys = key_tile * BLOCK_N + tl.arange(0, BLOCK_N)
    key_ok = keys < lk
    dims = tl.arange(0, BLOCK_D)
    dim_ok = dims < head_dim
    k_rows = (k_start + keys).to(tl.int64)
    k = scores.load_rows(K + b * skb + hk * skh, k_rows, sks, dims, skd, key_ok, dim_ok)
    v = scores.load_rows(V + b * svb + hk * svh, k_rows, svs, dims, svd, key_ok, dim_ok)
    dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    # the queries whose band reaches these keys: lo <= j − i <= hi for some key j here
    key_last = tl.minimum(key_tile * BLOCK_N + BLOCK_N, lk) - 1
    first = tl.minimum(tl.maximum(key_tile * BLOCK_N - hi, 0), lq)
    last = tl.minimum(tl.maximum(key_last - lo + 1, 0), lq)
    last = tl.where(key_last >= key_tile * BLOCK_N, last, first)
    first = first // BLOCK_M * BLOCK_M
    for g in range(0, group):
        head = hk * group + g
        slope2 = 0.0
        if ALIBI:
            slope2 = tl.load(SLOPES + b * sab + head * sah).to(tl.float32) * LOG2E
        for start in range(first, last, BLOCK_M):
            cover = 2
            if MASK_KIND != 0:
                cover = tl.load(COVER + b * scb + head * sch + (start // BLOCK_M) * scm
                                + key_tile * scn)
            if cover != 0:
                i = start + tl.arange(0, BLOCK_M)
                row_ok = i < lq
                q_rows = (q_start + i).to(tl.int64)
                q, do, lse2, delta = _query_rows(Q, DO, LSE, DELTA, b, head, q_rows, dims,
                                                 row_ok, dim_ok, sqb, sqh, sqs, sqd, sdob,
                                                 sdoh, sdos, sdod, slb, slh, sls)
                mask_rows = MASK
                if MASK_KIND != 0:
                    mask_rows = (MASK + b * smb + head * smh + i.to(tl.int64) * sms)[None, :]
                kq = scores.dot(k, tl.trans(q), PRECISION, UPCAST)
                s, t = scores.modify(kq, i[None, :], keys[:, None], row_ok[None, :],
                                     key_ok[:, None], lq, lk, lo, hi, scale, softcap, slope2,
                                     mask_rows, smk, cover, CAUSAL, WINDOW, MASK_KIND,
                                     SOFTCAP, ALIBI)
                p = tl.exp2(s - lse2[None, :])
                if DROPOUT:  # dV of the dropped P; dP through the mask and 1/(1 − p)
                    f = dropout.factors(tl.load(SEED), dropout_offset, dropout_threshold, dropout_scale,
                                        b * q_heads + head, i[None, :], keys[:, None])
                    dv += scores.dot((p * f).to(v.dtype), do, PRECISION, UPCAST)
                    dp = scores.dot(v, tl.trans(do), PRECISION, UPCAST) * f
                else:
                    dv += scores.dot(p.to(v.dtype), do, PRECISION, UPCAST)
                    dp = scores.dot(v, tl.trans(do), PRECISION, UPCAST)
                ds = p * (dp - delta[None, :])
                if SOFTCAP:
                    ds = ds * (1.0 - t * t)
                dk += scores.dot(ds.to(q.dtype), q, PRECISION, UPCAST)
    dk = dk * scale
    kv_mask = key_ok[:, None] & dim_ok[None, :]
    tl.store(DK + b * sdkb + hk * sdkh + k_rows[:, None] * sdks + dims[None, :] * sdkd,
             dk.to(DK.dtype.element_ty), mask=kv_mask)
    tl.store(DV + b * sdvb + hk * sdvh + k_rows[:, None] * sdvs + dims[None, :] * sdvd,
             dv.to(DV.dtype.element_ty), mask=kv_mask)


@triton.jit
def _dq_kernel(
        Q, K, V, DO, LSE, DELTA, DQ, MASK, COVER, SLOPES, SEQ_Q, SEQ_K,
        sqb, sqh, sqs, sqd, skb, skh, sks, skd, svb, svh, svs, svd,
        sdob, sdoh, sdos, sdod, slb, slh, sls, sdqb, sdqh, sdqs, sdqd,
        smb, smh, sms, smk, scb, sch, scm, scn, sab, sah,
        q_heads, kv_heads, q_len, kv_len, head_dim, scale, softcap, window_left, window_right,
        SEED, dropout_offset, dropout_threshold, dropout_scale,
        CAUSAL: tl.constexpr, WINDOW: tl.constexpr, MASK_KIND: tl.constexpr,
        SOFTCAP: tl.constexpr, ALIBI: tl.constexpr, DROPOUT: tl.constexpr,
        LENGTHS: tl.constexpr,
        PRECISION: tl.constexpr, UPCAST: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    tile = tl.program_id(0)
    b = (tl.program_id(1) // q_heads).to(tl.int64)
    head = tl.program_id(1) % q_heads
    hk = head // (q_heads // kv_heads)
    q_start, lq, k_start, lk = visibility.sequence(SEQ_Q, SEQ_K, SEQ_K, b, q_len, kv_len, LENGTHS)
    lo, hi = visibility.band(lq, lk, window_left, window_right, CAUSAL, WINDOW)
    i = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = i < lq
    dims = tl.arange(0, BLOCK_D)
    dim_ok = dims < head_dim
    q_rows = (q_start + i).to(tl.int64)
    q, do, lse2, delta = _query_rows(Q, DO, LSE, DELTA, b, head, q_rows, dims, row_ok, dim_ok,
                                     sqb, sqh, sqs, sqd, sdob, sdoh, sdos, sdod, slb, slh, sls)
    slope2 = 0.0
    if ALIBI:
        slope2 = tl.load(SLOPES + b * sab + head * sah).to(tl.float32) * LOG2E
    mask_rows = MASK
    if MASK_KIND != 0:
        mask_rows = (MASK + b * smb + head * smh + i.to(tl.int64) * sms)[:, None]
    i_last = tl.minimum(tile * BLOCK_M + BLOCK_M, lq) - 1
    begin, end = visibility.key_range(tile * BLOCK_M, i_last, lo, hi, lk, BLOCK_N)
    dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for start in range(begin, end, BLOCK_N):
        cover = 2
        if MASK_KIND != 0:
            cover = tl.load(COVER + b * scb + head * sch + tile * scm + (start // BLOCK_N) * scn)
        if cover != 0:
            keys = start + tl.arange(0, BLOCK_N)
            key_ok = keys < lk
            k_rows = (k_start + keys).to(tl.int64)
            k = scores.load_rows(K + b * skb + hk * skh, k_rows, sks, dims, skd, key_ok, dim_ok)
            v = scores.load_rows(V + b * svb + hk * svh, k_rows, svs, dims, svd, key_ok, dim_ok)
            qk = scores.dot(q, tl.trans(k), PRECISION, UPCAST)
            s, t = scores.modify(qk, i[:, None], keys[None, :], row_ok[:, None],
                                 key_ok[None, :], lq, lk, lo, hi, scale, softcap, slope2,
                                 mask_rows, smk, cover, CAUSAL, WINDOW, MASK_KIND, SOFTCAP,
                                 ALIBI)
            p = tl.exp2(s - lse2[:, None])
            dp = scores.dot(do, tl.trans(v), PRECISION, UPCAST)
            if DROPOUT:
                dp = dp * dropout.factors(tl.load(SEED), dropout_offset, dropout_threshold,
                                          dropout_scale, b * q_heads + head, i[:, None],
                                          keys[None, :])
            ds = p * (dp - delta[:, None])
            if SOFTCAP:
                ds = ds * (1.0 - t * t)
            dq += scores.dot(ds.to(k.dtype), k, PRECISION, UPCAST)
    dq = dq * scale
    tl.store(DQ + b * sdqb + head * sdqh + q_rows[:, None] * sdqs + dims[None, :] * sdqd,
             dq.to(DQ.dtype.element_ty), mask=row_ok[:, None] & dim_ok[None, :])


@triton.jit
def _delta_kernel(O, DO, DLSE, DELTA, sob, soh, sos, sod, sdob, sdoh, sdos, sdod,
                  slb, slh, sls, sdb, sdh, sds, heads, rows, head_dim,
                  HAS_DLSE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr):
    """Δ = rowsum(dO ∘ O) − dlse for BLOCK_M rows of one (batch, head), float32, read once
    from the 16-bit (or float32) tensors: no float32 copies of dO and O in memory."""
    b = (tl.program_id(1) // heads).to(tl.int64)
    h = tl.program_id(1) % heads
    i = (tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    dims = tl.arange(0, BLOCK_D)
    row_ok = i < rows
    dim_ok = dims < head_dim
    o = scores.load_rows(O + b * sob + h * soh, i, sos, dims, sod, row_ok, dim_ok)
    do = scores.load_rows(DO + b * sdob + h * sdoh, i, sdos, dims, sdod, row_ok, dim_ok)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
    if HAS_DLSE:
        delta -= tl.load(DLSE + b * slb + h * slh + i * sls, mask=row_ok, other=0.0)
    tl.store(DELTA + b * sdb + h * sdh + i * sds, delta, mask=row_ok)
