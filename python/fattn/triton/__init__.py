"""fattn on the GPU in Triton: one forward kernel for every variant, a KV cache and packed
variable-length batches (the CUDA tensors' path of torch.ops.fattn; fattn.cuda_dispatch).

    import fattn.triton
    out, lse = fattn.triton.attention(q, k, v, causal=True, return_lse=True)
    out = fattn.triton.attention(q, k, v, attn_mask=mask, window_size=(1023, 0), softcap=30.0,
                                 sinks=sinks, alibi_slopes=slopes)
    out = fattn.triton.attention_with_kvcache(q, k_cache, v_cache, k=k_new, v=v_new,
                                              cache_seqlens=lens, block_table=table,
                                              causal=True)
    out = fattn.triton.attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, causal=True)

attention: q (B, Hq, Sq, D), k and v (B, Hkv, Sk, D), Hq a multiple of Hkv (GQA/MQA, no
copies), D in 16..256, float32 / float16 / bfloat16, any strides (BHSD or BSHD views).
causal: top-left (torch's), or bottom-right with causal_bottom_right=True (FlashAttention's);
window_size=(left, right) (−1: unbounded), aligned as the causal limit (bottom-right without
causal); attn_mask boolean (False hides) or additive in q's dtype, broadcast to (B, Hq, Sq,
Sk) — tiles the mask hides whole are skipped, from a per-tile cover computed once per mask;
softcap (c·tanh(s/c)), sinks ((Hq,) logits in the softmax's denominator), alibi_slopes ((Hq,)
or (B, Hq) float32). Returns out in q's dtype and, with return_lse, the (B, Hq, Sq) float32
natural-log logsumexp; a row that sees no key gives 0 and −inf (or its sink).

float32 runs at float32 accuracy: 3xTF32 products on a GPU, TF32 only when torch allows it
for float32 matmuls (torch.backends.cuda.matmul.allow_tf32), IEEE products under the
interpreter. 16-bit inputs: tensor-core products with float32 accumulation, P rounded to
V's dtype for P·V.

Runs on CUDA tensors with a GPU, and on CPU tensors under Triton's interpreter
(TRITON_INTERPRET=1, set before triton is imported; triton 3.6 needs numpy < 2.4): the
tests run there. The kernel is in forward.py, the band of visible keys in visibility.py,
scheduling (tile sizes, GQA packing, key splits) in problem.py, its float64 definition in
reference.py. kvcache_attention is attention_with_kvcache with the operator's arguments
((B, H, S, D) views, window_left/right): what torch.ops.fattn.attention_kvcache runs on
CUDA; attention_varlen_kvcache the same for torch.ops.fattn.attention_varlen_kvcache
(varlen queries against a paged cache). Imported on use: triton is optional.
"""
from .api import (attention, attention_backward, attention_varlen,  # noqa: F401
                  attention_varlen_backward, attention_varlen_kvcache, attention_with_kvcache,
                  kvcache_attention)
from .problem import ArgumentError  # noqa: F401

__all__ = ["attention", "attention_backward", "attention_varlen", "attention_varlen_backward",
           "attention_varlen_kvcache", "attention_with_kvcache", "kvcache_attention",
           "ArgumentError"]
