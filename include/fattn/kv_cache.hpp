// fattn — attention against a KV cache: per-sequence lengths, a paged cache, and the
// append of new keys and values before attending (FlashAttention's flash_attn_with_kvcache),
// and variable-length prefill (flash_attn_varlen_func).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "fattn/attention.hpp"

namespace fattn {

// The cache, viewed logically as (pages, Hkv, keys per page, D):
//   contiguous: k, v (B, Hkv, S_cache, D) — one page per sequence, any strides
//               (TensorView::bshd(ptr, B, S_cache, Hkv, D) for FlashAttention's layout);
//   paged:      k, v (num_blocks, Hkv, block_size, D) — TensorView::bshd(ptr, num_blocks,
//               block_size, Hkv, D) for vLLM's and FlashAttention's (num_blocks,
//               block_size, Hkv, D) memory — with block_table (B, max_blocks_per_seq) int32:
//               keys [n·block_size, (n+1)·block_size) of sequence b are on page
//               block_table[b][n]. block_size a multiple of 16.
// seqlens (B) int32: keys in use per sequence before the append (0 allowed); null: every
// key of the cache (S_cache, or max_blocks_per_seq·block_size).
struct KvCache {
  TensorView k, v;
  const TensorView* seqlens = nullptr;
  const TensorView* block_table = nullptr;
};

// out = attention of q against each sequence's cached keys, after appending k_new and
// v_new (B, Hkv, S_new, D) at positions [seqlens[b], seqlens[b] + S_new) of the cache in
// place (both null: no append; appending needs seqlens). Sequence b then has
// L_b = seqlens[b] + S_new keys; causal bottom_right aligns query Sq−1 with key L_b − 1
// (chunked prefill: the new queries are the last tokens), top_left query i with key i.
//   q, out: (B, Hq, Sq, D), Hq a multiple of Hkv; lse: (B, Hq, Sq) float32 or null.
//   q, the caches, k_new, v_new and out share one dtype: float32, bfloat16 or float16; or
//   the caches are q8_0 (CPU; fattn's int8 format, DType::q8_0) with float32 q, k_new, v_new
//   and out, the append quantizing each new row (quantize_q8_0) into its slot.
// Impl::automatic and Impl::decode run the decode kernel (cpu/decode/decode.hpp), Impl::reference
// the float64 reference; options.kv_splits sets its key splits. Every argument is
// checked before anything is written: a call that throws leaves the cache as it was.
// CUDA views (Device::cuda) run the CUDA decode kernel (cuda/decode.hpp; what it takes:
// cuda_kvcache_refusal), enqueued on options.cuda_stream without synchronising: seqlens
// and block_table stay on the device and are checked there; a wrong entry stops the
// stream with a device-side assertion naming the argument (cudaErrorAssert at the next
// synchronisation), before the append writes anything.
void attention_kvcache(const TensorView& q, const KvCache& cache, const TensorView* k_new,
                       const TensorView* v_new, const TensorView& out, const TensorView* lse,
                       const Options& options = {});

// Why the CUDA decode kernel does not take this call, or empty where it does (the views'
// dtypes, head dim, alignment and options only; nothing on the device is read): float16
// or bfloat16, a head dim that is a multiple of 8 up to 256, 16-byte aligned rows, impl
// auto or decode, causal bottom-right. Without the CUDA backend: says so. For callers that
// have another GPU implementation to fall back on (the torch operator: fattn's Triton
// kernels).
std::string cuda_kvcache_refusal(const TensorView& q, const KvCache& cache,
                                 const TensorView* k_new, const TensorView* v_new,
                                 const Options& options = {});

// The head dims the CUDA decode kernel is compiled for, ascending (empty without the CUDA
// backend); any multiple of 8 up to the largest runs on the next one.
std::vector<int> cuda_decode_head_dims();

// What attention_kvcache runs for these arguments on this CPU (checked as it checks them,
// nothing written): the decode kernel's instruction set, products and plan (ForwardPlan::
// decode: the scores' form, the cache read in place or staged, heads an item, key chunks,
// and why), or the reference. CPU tensors only.
ForwardPlan kvcache_plan(const TensorView& q, const KvCache& cache, const TensorView* k_new,
                         const Options& options = {});

// Bytes of working memory attention_kvcache allocates for these arguments.
std::int64_t kvcache_extra_bytes(const TensorView& q, const KvCache& cache,
                                 const TensorView* k_new, const Options& options = {});

// Variable-length attention over sequences packed along one axis, without computing on
// padding (FlashAttention's flash_attn_varlen_func): sequence b's queries are rows
// [cu_seqlens_q[b], cu_seqlens_q[b+1]) of q, its keys rows [cu_seqlens_k[b],
// cu_seqlens_k[b+1]) of k and v.
//   q, out: (total_q, Hq, D) viewed as (1, Hq, total_q, D) — TensorView::bshd(ptr, 1,
//   total_q, Hq, D); k, v likewise (1, Hkv, total_k, D); lse (1, Hq, total_q) or null.
//   cu_seqlens_q, cu_seqlens_k: (B + 1) int32, starting at 0, non-decreasing, ending at
//   total_q and total_k.
// Causal alignment is per sequence. The call is checked once and runs as one ragged
// problem: Impl::fused runs the fused kernel over the work items of all sequences together,
// in waves of sequences whose K/V fit the L3 (a sequence without keys gives rows 0 and lse
// −inf, or the sink); Impl::automatic does too, except for the sequences of few queries
// that a call of their own would run on the decode kernel, which run on it, side by side
// (docs/decode.md, "Varlen"); Impl::naive, Impl::decode and isa amx run the sequences one after another,
// Impl::reference (and float64) the float64 reference. CPU tensors only. The variants
// (Options) apply per sequence, aligned to its own lengths: window, softcap, sinks (Hq),
// alibi_slopes (Hq) or (B, Hq); not attn_mask.
void attention_varlen(const TensorView& q, const TensorView& k, const TensorView& v,
                      const TensorView& cu_seqlens_q, const TensorView& cu_seqlens_k,
                      const TensorView& out, const TensorView* lse, const Options& options = {});

// attention_varlen whose keys are in a KV cache (FlashAttention's flash_attn_varlen_func
// with block_table and seqused_k: chunked prefill and mixed prefill/decode batches over a
// serving engine's pages). q, out, lse, cu_seqlens_q and the options as above; sequence b
// has L_b keys, cache.seqlens[b] where seqlens (B) int32 is given (FlashAttention's
// seqused_k), else cu_seqlens_k[b+1] − cu_seqlens_k[b]:
//   paged:  cache.k, cache.v (num_blocks, Hkv, block_size, D) — TensorView::bshd(ptr,
//           num_blocks, block_size, Hkv, D) — with cache.block_table (B, max_blocks) int32:
//           key j of sequence b is row j % block_size of page block_table[b][j / block_size]
//           (the KV cache's rules: block_size a multiple of 16, every page a sequence uses
//           in [0, num_blocks)); cu_seqlens_k may be null when seqlens is given;
//   packed: cache.k, cache.v (1, Hkv, total_k, D) as above, cu_seqlens_k required; with
//           seqlens, sequence b's keys are the first seqlens[b] of its rows.
// The pages are read where they lie: the fused kernel's pre-pass packs each sequence's K
// (and V) from them as it does from packed rows, the decode kernel reads them in place.
// Causal alignment, windows and ALiBi count from each sequence's own L_b keys. Forward
// only (as FlashAttention's paged varlen).
void attention_varlen(const TensorView& q, const KvCache& cache, const TensorView& cu_seqlens_q,
                      const TensorView* cu_seqlens_k, const TensorView& out,
                      const TensorView* lse, const Options& options = {});

// Gradients of attention_varlen given its out and lse, checked once: the backward kernel on
// each sequence, a sequence with at least 1/threads of the work on every thread, the others
// side by side in one parallel section (one thread each); the reference over all at once;
// with sinks, dsinks (Hq) float32 sums every sequence's rows, in order.
void attention_varlen_backward(const TensorView& q, const TensorView& k, const TensorView& v,
                               const TensorView& out, const TensorView& dout,
                               const TensorView& lse, const TensorView& cu_seqlens_q,
                               const TensorView& cu_seqlens_k, const TensorView& dq,
                               const TensorView& dk, const TensorView& dv,
                               const Options& options = {}, const TensorView* dsinks = nullptr);

}  // namespace fattn
