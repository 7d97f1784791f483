"""FlashAttention 2's dense and packed entry points under their own names and signatures
(``flash_attn.flash_attn_interface``), on fattn's operators: code written for
FlashAttention runs on fattn by changing its import.

    from fattn.flash_attn_interface import flash_attn_func, flash_attn_varlen_func

Semantics are FlashAttention's: q (B, Sq, Hq, D), k and v (B, Sk, Hkv, D) (varlen: packed
(total, H, D) with cu_seqlens), Hq a multiple of Hkv, causal aligned bottom-right,
window_size (left, right), softcap, alibi_slopes (Hq) or (B, Hq) float32, dropout_p in
[0, 1) (fattn's mask: fattn.dropout_mask). ``deterministic`` changes nothing: fattn's
backward always is. ``return_attn_probs=True`` returns (out, softmax_lse, S_dmask):
softmax_lse (B, Hq, Sq) (varlen: (Hq, total_q)) float32, without gradient; S_dmask with
dropout_p > 0 the probabilities negated where dropout dropped them, FlashAttention's
(B, Hq, Sq, Sk) each rounded up to a multiple of 128 (fattn._attn_probs), else None.
The packed forms take views of the packed tensor (no copy); their gradients flow back
into it. ``flash_attn_with_kvcache`` and ``flash_attn_varlen_func`` are fattn.kvcache's.
"""
from __future__ import annotations

import torch

from .functional import _flash
from .kvcache import flash_attn_varlen_func, flash_attn_with_kvcache


def _unpack(fn: str, name: str, packed, parts: int, layout: str):
    """The `parts` tensors of a packed argument, along its dimension -3."""
    if not isinstance(packed, torch.Tensor):
        raise TypeError(f"fattn.{fn}: {name} must be a torch.Tensor, got "
                        f"{type(packed).__name__}")
    if packed.dim() < 3 or packed.size(-3) != parts:
        raise ValueError(f"fattn.{fn}: {name} must be {layout}, got shape "
                         f"{tuple(packed.shape)}")
    return packed.unbind(-3)


def _dense(fn, q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
           return_attn_probs):
    return _flash(torch.ops.fattn.attention, q, k, v, causal=causal,
                  softmax_scale=softmax_scale, dropout_p=dropout_p, window_size=window_size,
                  softcap=softcap, alibi_slopes=alibi_slopes, fn=fn,
                  return_attn_probs=return_attn_probs)


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False,
                    window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False,
                    return_attn_probs=False):
    """FlashAttention's flash_attn_func: q (B, Sq, Hq, D), k, v (B, Sk, Hkv, D)."""
    return _dense("flash_attn_func", q, k, v, dropout_p, softmax_scale, causal, window_size,
                  softcap, alibi_slopes, return_attn_probs)


def flash_attn_qkvpacked_func(qkv, dropout_p=0.0, softmax_scale=None, causal=False,
                              window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                              deterministic=False, return_attn_probs=False):
    """FlashAttention's flash_attn_qkvpacked_func: qkv (B, S, 3, H, D)."""
    fn = "flash_attn_qkvpacked_func"
    q, k, v = _unpack(fn, "qkv", qkv, 3, "(B, S, 3, H, D)")
    return _dense(fn, q, k, v, dropout_p, softmax_scale, causal, window_size, softcap,
                  alibi_slopes, return_attn_probs)


def flash_attn_kvpacked_func(q, kv, dropout_p=0.0, softmax_scale=None, causal=False,
                             window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                             deterministic=False, return_attn_probs=False):
    """FlashAttention's flash_attn_kvpacked_func: q (B, Sq, Hq, D), kv (B, Sk, 2, Hkv, D)."""
    fn = "flash_attn_kvpacked_func"
    k, v = _unpack(fn, "kv", kv, 2, "(B, Sk, 2, Hkv, D)")
    return _dense(fn, q, k, v, dropout_p, softmax_scale, causal, window_size, softcap,
                  alibi_slopes, return_attn_probs)


def flash_attn_varlen_qkvpacked_func(qkv, cu_seqlens, max_seqlen, dropout_p=0.0,
                                     softmax_scale=None, causal=False, window_size=(-1, -1),
                                     softcap=0.0, alibi_slopes=None, deterministic=False,
                                     return_attn_probs=False):
    """FlashAttention's flash_attn_varlen_qkvpacked_func: qkv (total, 3, H, D)."""
    q, k, v = _unpack("flash_attn_varlen_qkvpacked_func", "qkv", qkv, 3, "(total, 3, H, D)")
    return flash_attn_varlen_func(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen,
                                  dropout_p, softmax_scale, causal, window_size, softcap,
                                  alibi_slopes, deterministic, return_attn_probs)


def flash_attn_varlen_kvpacked_func(q, kv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                    max_seqlen_k, dropout_p=0.0, softmax_scale=None,
                                    causal=False, window_size=(-1, -1), softcap=0.0,
                                    alibi_slopes=None, deterministic=False,
                                    return_attn_probs=False):
    """FlashAttention's flash_attn_varlen_kvpacked_func: q (total_q, Hq, D), kv (total_k, 2,
    Hkv, D)."""
    k, v = _unpack("flash_attn_varlen_kvpacked_func", "kv", kv, 2, "(total_k, 2, Hkv, D)")
    return flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                  max_seqlen_k, dropout_p, softmax_scale, causal, window_size,
                                  softcap, alibi_slopes, deterministic, return_attn_probs)


__all__ = ["flash_attn_func", "flash_attn_qkvpacked_func", "flash_attn_kvpacked_func",
           "flash_attn_varlen_func", "flash_attn_varlen_qkvpacked_func",
           "flash_attn_varlen_kvpacked_func", "flash_attn_with_kvcache"]
