"""FlashAttention's functions on fattn's Triton kernels — the CUDA tensors' path — for CPU
tensors under Triton's interpreter (scripts/fa-tests.sh --path triton): an autograd
function around fattn.triton's forward and backward (dense and varlen), the dropout stream
drawn as fattn's wrappers draw it (fattn.functional.dropout_stream), S_dmask from
fattn._attn_probs (the mask function the Triton kernels evaluate too)."""
import torch

import fattn.triton as kernels
from fattn import _attn_probs
from fattn.functional import dropout_stream


class _Dense(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, options):
        out, lse = kernels.attention(q, k, v, return_lse=True, **options)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.options = options
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, _):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv, _ = kernels.attention_backward(dout, q, k, v, out, lse, **ctx.options)
        return dq, dk, dv, None


class _Varlen(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, cu_q, cu_k, max_q, max_k, options):
        out, lse = kernels.attention_varlen(q, k, v, cu_q, cu_k, max_q, max_k, return_lse=True,
                                            **options)
        ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k)
        ctx.options = options
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, _):
        q, k, v, out, lse, cu_q, cu_k = ctx.saved_tensors
        dq, dk, dv, _ = kernels.attention_varlen_backward(dout, q, k, v, out, lse, cu_q, cu_k,
                                                          **ctx.options)
        return dq, dk, dv, None, None, None, None, None


def _options(fn, q, dropout_p, softmax_scale, window_size, softcap, alibi_slopes):
    stream = dropout_stream(fn, dropout_p, q.device)
    window = (int(window_size[0]), int(window_size[1]))
    return stream, window, dict(window_size=window, softcap=softcap, alibi_slopes=alibi_slopes,
                                scale=softmax_scale, dropout_p=stream[0],
                                dropout_seed=stream[1], dropout_offset=stream[2])


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False,
                    window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False,
                    return_attn_probs=False):
    stream, window, options = _options("flash_attn_func", q, dropout_p, softmax_scale,
                                       window_size, softcap, alibi_slopes)
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    out, lse = _Dense.apply(q, k, v, dict(options, causal=causal, causal_bottom_right=causal))
    out = out.transpose(1, 2)
    if not return_attn_probs:
        return out
    probs = (_attn_probs.dense(q, k, stream, softmax_scale, causal, window, softcap,
                               alibi_slopes) if stream[0] > 0 else None)
    return out, lse, probs


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                           dropout_p=0.0, softmax_scale=None, causal=False,
                           window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                           deterministic=False, return_attn_probs=False, block_table=None):
    assert block_table is None, "the paged varlen on Triton is not run by this path"
    stream, window, options = _options("flash_attn_varlen_func", q, dropout_p, softmax_scale,
                                       window_size, softcap, alibi_slopes)
    out, lse = _Varlen.apply(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                             dict(options, causal=causal))
    if not return_attn_probs:
        return out
    probs = (_attn_probs.varlen(q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                stream, softmax_scale, causal, window, softcap, alibi_slopes)
             if stream[0] > 0 else None)
    return out, lse, probs


def flash_attn_qkvpacked_func(qkv, *args, **kwargs):
    return flash_attn_func(*qkv.unbind(2), *args, **kwargs)


def flash_attn_kvpacked_func(q, kv, *args, **kwargs):
    return flash_attn_func(q, *kv.unbind(2), *args, **kwargs)


def flash_attn_varlen_qkvpacked_func(qkv, cu_seqlens, max_seqlen, *args, **kwargs):
    return flash_attn_varlen_func(*qkv.unbind(1), cu_seqlens, cu_seqlens, max_seqlen,
                                  max_seqlen, *args, **kwargs)


def flash_attn_varlen_kvpacked_func(q, kv, cu_seqlens_q, cu_seqlens_k, *args, **kwargs):
    return flash_attn_varlen_func(q, *kv.unbind(1), cu_seqlens_q, cu_seqlens_k, *args, **kwargs)


def flash_attn_with_kvcache(*args, **kwargs):
    raise NotImplementedError("the KV-cache functions are not run on this path")


__all__ = ["flash_attn_func", "flash_attn_qkvpacked_func", "flash_attn_kvpacked_func",
           "flash_attn_varlen_func", "flash_attn_varlen_qkvpacked_func",
           "flash_attn_varlen_kvpacked_func", "flash_attn_with_kvcache"]
