// fattn — a validated variable-length call (attention_varlen and its backward): one ragged
// Problem over every packed sequence, checked once.
#pragma once

#include <cstdint>
#include <vector>

#include "model/problem.hpp"
#include "fattn/kv_cache.hpp"

namespace fattn::detail {

struct VarlenProblem {
  // The forward's arguments (out and lse may be null: sizing only). Validates every
  // argument (throwing fattn::Error) before anything is written.
  VarlenProblem(const TensorView& q, const TensorView& k, const TensorView& v,
                const TensorView& cu_seqlens_q, const TensorView& cu_seqlens_k,
                const TensorView* out, const TensorView* lse, const Options& options);
  // The forward's over a KV cache: cache.k and cache.v either packed rows as above
  // (cu_seqlens_k required) or pages (num_blocks, Hkv, block_size, D) with
  // cache.block_table (B, max_blocks); cache.seqlens (B) int32, FlashAttention's
  // seqused_k: the keys each sequence uses (the first of its rows or of its pages), else
  // the cu_seqlens_k differences.
  VarlenProblem(const TensorView& q, const KvCache& cache, const TensorView& cu_seqlens_q,
                const TensorView* cu_seqlens_k, const TensorView* out, const TensorView* lse,
                const Options& options);
  // The backward's: out, dout and lse inputs, dq, dk, dv (and dsinks) outputs.
  VarlenProblem(const TensorView& q, const TensorView& k, const TensorView& v,
                const TensorView& out, const TensorView& dout, const TensorView& lse,
                const TensorView& cu_seqlens_q, const TensorView& cu_seqlens_k,
                const TensorView& dq, const TensorView& dk, const TensorView& dv,
                const Options& options, const TensorView* dsinks);
  VarlenProblem(const VarlenProblem&) = delete;
  VarlenProblem& operator=(const VarlenProblem&) = delete;

  Problem p;  // p.ragged points at q_starts and k_starts
  std::vector<std::int64_t> q_starts, k_starts;  // B + 1 offsets each
  std::vector<std::int64_t> k_used;              // B, with seqused_k; else empty
};

}  // namespace fattn::detail
