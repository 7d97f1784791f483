"""The float64 definition beside the Triton kernel: what fattn.triton computes, written
plainly with torch operations (no tiles, no online softmax), for its tests.

The scores are fattn._scores' (scale·q·kᵀ, softcap, ALiBi, attn_mask, then the band, in
Options' order as src/cpu/reference.cpp); a sink per head joins the softmax's denominator.
A row that sees no key (and has no sink) gives 0, logsumexp −inf.
"""
from __future__ import annotations

import torch

from .._scores import scores
from .._visibility import visible_pairs  # noqa: F401  (the tests read it here)


def attention(q, k, v, attn_mask=None, causal=None, window_size=(-1, -1), softcap=0.0,
              sinks=None, alibi_slopes=None, scale=None):
    """float64 (out, lse) for (B, Hq, Sq, D) q and (B, Hkv, Sk, D) k, v (any dtype)."""
    q, k, v = q.double(), k.double(), v.double()
    b, hq, sq, _ = q.shape
    v = v.repeat_interleave(hq // v.size(1), dim=1)
    s = scores(q, k, scale, causal, window_size, softcap, alibi_slopes, attn_mask)
    if sinks is not None:
        sink = sinks.double().view(1, hq, 1, 1).expand(b, hq, sq, 1)
        lse = torch.logsumexp(torch.cat([s, sink], dim=-1), dim=-1)
    else:
        lse = torch.logsumexp(s, dim=-1)
    p = torch.nan_to_num(torch.exp(s - lse.unsqueeze(-1)), nan=0.0)
    return torch.matmul(p, v), lse


def attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, causal=False, alibi_slopes=None,
                     **variants):
    """Packed (total, H, D) sequences, each through attention() bottom-right aligned;
    returns out (total_q, Hq, D) and lse (Hq, total_q)."""
    outs, lses = [], []
    cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    for n in range(len(cq) - 1):
        qs = q[cq[n]:cq[n + 1]].transpose(0, 1).unsqueeze(0)
        ks = k[ck[n]:ck[n + 1]].transpose(0, 1).unsqueeze(0)
        vs = v[ck[n]:ck[n + 1]].transpose(0, 1).unsqueeze(0)
        slopes = None
        if alibi_slopes is not None:
            slopes = alibi_slopes[n] if alibi_slopes.dim() == 2 else alibi_slopes
        o, lse = attention(qs, ks, vs, causal="bottom_right" if causal else None,
                           alibi_slopes=slopes, **variants)
        outs.append(o[0].transpose(0, 1))
        lses.append(lse[0])
    return torch.cat(outs, 0), torch.cat(lses, 1)


def cache_rows(cache, seq, length, block_table=None):
    """The first `length` positions of sequence `seq` of a (B, S, H, D) cache, or of a
    paged (pages, block_size, H, D) one through block_table: (length, H, D)."""
    if block_table is None:
        return cache[seq, :length]
    page = cache.size(1)
    positions = torch.arange(length)
    return cache[block_table[seq].long()[positions // page], positions % page]


def attention_with_kvcache(q, k_cache, v_cache, lengths, block_table=None, causal=False,
                           alibi_slopes=None, **variants):
    """q (B, Sq, Hq, D) against each sequence's first lengths[b] cache positions (after
    any append); returns out (B, Sq, Hq, D) and lse (B, Hq, Sq)."""
    outs, lses = [], []
    for n, length in enumerate(lengths):
        ks = cache_rows(k_cache, n, length, block_table).transpose(0, 1).unsqueeze(0)
        vs = cache_rows(v_cache, n, length, block_table).transpose(0, 1).unsqueeze(0)
        slopes = None
        if alibi_slopes is not None:
            slopes = alibi_slopes[n] if alibi_slopes.dim() == 2 else alibi_slopes
        o, lse = attention(q[n:n + 1].transpose(1, 2), ks, vs,
                           causal="bottom_right" if causal else None, alibi_slopes=slopes,
                           **variants)
        outs.append(o.transpose(1, 2))
        lses.append(lse)
    return torch.cat(outs, 0), torch.cat(lses, 0)
