"""FlashAttention's rotary embedding inside ``flash_attn_with_kvcache``: the new keys, and the
queries, rotated at their positions in the cache before the append and the attention.

    rotary_cos, rotary_sin: (seqlen_ro, rotary_dim / 2); rotary_dim a multiple of 16, at most
    the head dim; the first rotary_dim dims of each head are rotated, the rest kept.
    interleaved: dims (0, 1), (2, 3), ... rotate together; else (i, i + rotary_dim / 2)
    (GPT-NeoX). New key t of sequence b sits at position cache_seqlens[b] + t; queries at
    cache_seqlens[b] + i with causal or a window, else all at cache_seqlens[b] (FlashAttention's
    rule, its docstring and tests/test_flash_attn.py).

Computed in float32 with torch ops, rounded once to the inputs' dtype (the rotated q and k
are new tensors; the caller's are not changed), on whichever device the tensors are.
"""
from __future__ import annotations

import torch

ROTARY_DIM_MULTIPLE = 16  # FlashAttention's rule for rotary_dim


def check(fn: str, rotary_cos, rotary_sin, q, k, cache_seqlens) -> None:
    """The tables against q and the call: a ValueError or TypeError naming the argument."""
    for name, t in (("rotary_cos", rotary_cos), ("rotary_sin", rotary_sin)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"fattn.{fn}: {name} must be a tensor (seqlen_ro, rotary_dim / 2) "
                            f"given with the other, got {type(t).__name__}")
        if t.dim() != 2 or not t.is_floating_point():
            raise ValueError(f"fattn.{fn}: {name} must be a 2-D floating tensor (seqlen_ro, "
                             f"rotary_dim / 2), got {t.dtype} of shape {tuple(t.shape)}")
        if t.device != q.device:
            raise ValueError(f"fattn.{fn}: {name} is on {t.device} but q is on {q.device}")
    if rotary_cos.shape != rotary_sin.shape:
        raise ValueError(f"fattn.{fn}: rotary_cos and rotary_sin must have one shape, got "
                         f"{tuple(rotary_cos.shape)} and {tuple(rotary_sin.shape)}")
    rotary_dim = 2 * rotary_cos.size(1)
    if rotary_dim % ROTARY_DIM_MULTIPLE != 0 or not 0 < rotary_dim <= q.size(-1):
        raise ValueError(f"fattn.{fn}: rotary_dim (2 × rotary_cos.size(1)) must be a positive "
                         f"multiple of {ROTARY_DIM_MULTIPLE} at most the head dim {q.size(-1)}, "
                         f"got {rotary_dim}")
    if k is None:
        raise ValueError(f"fattn.{fn}: rotary_cos/rotary_sin rotate the new keys: k and v must "
                         "be given (as in FlashAttention)")
    if cache_seqlens is None:
        raise ValueError(f"fattn.{fn}: rotary_cos/rotary_sin need cache_seqlens (the new keys' "
                         "positions)")


def positions(cache_seqlens: torch.Tensor, count: int, consecutive: bool) -> torch.Tensor:
    """(B, count) int64 positions from each sequence's cache_seqlens: consecutive, or all at
    cache_seqlens."""
    start = cache_seqlens.to(torch.int64).view(-1, 1)
    step = torch.arange(count, device=start.device) if consecutive else \
        torch.zeros(count, dtype=torch.int64, device=start.device)
    return start + step.view(1, -1)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, at: torch.Tensor,
           interleaved: bool) -> torch.Tensor:
    """x (B, S, H, D) with its first rotary_dim dims rotated at positions at (B, S)."""
    half = cos.size(1)
    c = cos[at].float().unsqueeze(2)  # (B, S, 1, half)
    s = sin[at].float().unsqueeze(2)
    head = x[..., :2 * half].float()
    if interleaved:
        x1, x2 = head[..., 0::2], head[..., 1::2]
        rotated = torch.stack((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1).flatten(-2)
    else:
        x1, x2 = head[..., :half], head[..., half:]
        rotated = torch.cat((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1)
    return torch.cat((rotated.to(x.dtype), x[..., 2 * half:]), dim=-1)


def apply(fn: str, q, k, rotary_cos, rotary_sin, cache_seqlens, interleaved: bool,
          consecutive_queries: bool):
    """(q, k) rotated for flash_attn_with_kvcache; the table must reach every position
    (one read of cache_seqlens' largest entry to the host)."""
    check(fn, rotary_cos, rotary_sin, q, k, cache_seqlens)
    reach = max(k.size(1), q.size(1) if consecutive_queries else 1)
    last = int(cache_seqlens.max()) + reach if cache_seqlens.numel() else 0
    if last > rotary_cos.size(0):
        raise ValueError(f"fattn.{fn}: rotary_cos/rotary_sin have {rotary_cos.size(0)} positions, "
                         f"but the new tokens reach position {last - 1} (cache_seqlens up to "
                         f"{last - reach}, {reach} tokens)")
    k = rotate(k, rotary_cos, rotary_sin, positions(cache_seqlens, k.size(1), True), interleaved)
    q = rotate(q, rotary_cos, rotary_sin,
               positions(cache_seqlens, q.size(1), consecutive_queries), interleaved)
    return q, k
