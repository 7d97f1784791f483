"""The logits fattn's kernels take the softmax of, written plainly with torch operations,
in Options' order as src/cpu/reference.cpp applies them: scale·q·kᵀ, softcap
(c·tanh(s/c)), ALiBi (−slope·|i + Sk − Sq − j|), attn_mask (boolean: False hides;
additive: added), then the band (causal limit and window, fattn._visibility) sets the keys
a row does not see to −inf. Read by the float64 reference beside the Triton kernel and by
the attention probabilities FlashAttention's API returns (fattn._attn_probs)."""
from __future__ import annotations

import math

import torch

from ._visibility import visible_pairs


def scores(q, k, scale=None, causal=None, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
           attn_mask=None):
    """(B, Hq, Sq, Sk) logits of (B, Hq, Sq, D) q and (B, Hkv, Sk, D) k (Hq a multiple of
    Hkv), in q's dtype (the caller converts q and k first). causal: None, "top_left",
    "bottom_right"; alibi_slopes (Hq) or (B, Hq); scale: default 1/sqrt(D)."""
    b, hq, sq, d = q.shape
    sk = k.size(2)
    k = k.repeat_interleave(hq // k.size(1), dim=1)
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    s = torch.matmul(q, k.transpose(-2, -1)) * scale
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    if alibi_slopes is not None:
        slopes = alibi_slopes.to(s.dtype).expand(b, hq).reshape(b, hq, 1, 1)
        distance = (torch.arange(sq, device=s.device).view(-1, 1) + sk - sq
                    - torch.arange(sk, device=s.device).view(1, -1)).abs()
        s = s - slopes * distance.to(s.dtype)
    if attn_mask is not None:
        s = s.masked_fill(~attn_mask, float("-inf")) if attn_mask.dtype == torch.bool \
            else s + attn_mask.to(s.dtype)
    return s.masked_fill(~visible_pairs(sq, sk, causal, window_size, s.device), float("-inf"))
