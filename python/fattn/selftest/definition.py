"""The definition of attention with the case's variants: in float64 (the reference), and as
torch computes it in the dtype (whose error sets the bound)."""
from __future__ import annotations

import dataclasses
import math

import torch

from .._visibility import visible_pairs
from .cases import Case
from .inputs import Inputs


def definition(q, k, v, case: Case, inp: Inputs, exact: bool, causal=None):
    """(out, lse) of (B, Hq, Sq, D) q against (B, Hkv, Sk, D) k, v with the case's variants.
    exact: in float64 (fattn.triton.reference's definition, on the device). Else torch's own
    computation in q's dtype, whose error sets the bound: scores and P·V in the dtype (in
    float32 as torch.backends.cuda.matmul.allow_tf32 says), softcap too, the rest in
    float32 (transformers' eager attention). causal: the case's unless given."""
    work = torch.float64 if exact else q.dtype
    soft = torch.float64 if exact else torch.float32
    b, hq, sq, d = q.shape
    sk = k.size(2)
    q = q.to(work)
    k, v = (t.to(work).repeat_interleave(hq // t.size(1), 1) for t in (k, v))
    s = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(d))
    if case.softcap:
        s = case.softcap * torch.tanh(s / case.softcap)
    s = s.to(soft)
    if inp.slopes is not None:
        rows = torch.arange(sq, device=q.device).view(-1, 1) + sk - sq
        distance = (rows - torch.arange(sk, device=q.device).view(1, -1)).abs().to(soft)
        s = s - inp.slopes.to(soft).view(1, hq, 1, 1) * distance
    if inp.mask is not None:
        s = s.masked_fill(~inp.mask, float("-inf"))
    s = s.masked_fill(~visible_pairs(sq, sk, causal or case.causal, case.window, q.device),
                      float("-inf"))
    if inp.sinks is not None:
        sink = inp.sinks.to(soft).view(1, hq, 1, 1).expand(b, hq, sq, 1)
        lse = torch.logsumexp(torch.cat([s, sink], -1), -1)
    else:
        lse = torch.logsumexp(s, -1)
    p = torch.exp(s - lse.unsqueeze(-1)).nan_to_num(0.0)
    if case.dropout:  # torch's placement: on the normalized probabilities (lse undropped)
        p = p * inp.keep.to(p.dtype) / (1.0 - case.dropout)
    return torch.matmul(p.to(work), v), lse


def packed_definition(q, k, v, case: Case, inp: Inputs, exact: bool):
    """definition() per packed sequence (bottom-right aligned; with seqused, over the keys
    each sequence uses; with dropout, sequence n's mask is batch n's): out (total_q, Hq, D),
    lse (Hq, total_q)."""
    outs, lses = [], []
    cq, ck, used = inp.packed.cu_q.tolist(), inp.packed.cu_k.tolist(), case.used_keys()
    for n in range(len(cq) - 1):
        end = ck[n] + used[n]
        rows = ((q, cq[n], cq[n + 1]), (k, ck[n], end), (v, ck[n], end))
        one = [t[lo:hi].transpose(0, 1).unsqueeze(0) for t, lo, hi in rows]
        keep = None if inp.keep is None else inp.keep[n:n + 1, :, :cq[n + 1] - cq[n], :used[n]]
        o, lse = definition(*one, case, dataclasses.replace(inp, keep=keep), exact,
                            causal=case.causal and "bottom_right")
        outs.append(o[0].transpose(0, 1))
        lses.append(lse[0])
    return torch.cat(outs, 0), torch.cat(lses, 1)


def cache_definition(case: Case, inp: Inputs, exact: bool):
    """definition() per cached sequence: its first k_lens[b] keys and the appended ones."""
    outs, lses = [], []
    c = inp.cache
    for n, length in enumerate(case.k_lens):
        kv = []
        for cache, new in ((c.keys, c.k_new), (c.values, c.v_new)):
            rows = cache[n, :length].transpose(0, 1)
            if new is not None:
                rows = torch.cat([rows, new[n]], 1)
            kv.append(rows.unsqueeze(0))
        o, lse = definition(inp.q[n:n + 1], *kv, case, inp, exact)
        outs.append(o)
        lses.append(lse)
    return torch.cat(outs, 0), torch.cat(lses, 0)
