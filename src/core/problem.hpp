// fattn — the validated problem that every backend receives.
#pragma once

#include <cstdint>

#include "fattn/attention.hpp"

namespace fattn::detail {

// Element (b, h, s, d) of a strided 4-D float tensor.
template <class T>
struct Strided {
  T* data = nullptr;
  std::int64_t batch = 0, head = 0, seq = 0, dim = 0;  // strides in elements

  T* row(std::int64_t b, std::int64_t h, std::int64_t s) const {
    return data + b * batch + h * head + s * seq;
  }
};

// The same view with another element type (the float64 reference reads float64 data
// through the float pointers a Problem holds).
template <class T, class U>
Strided<T> retype(const Strided<U>& s) {
  return {reinterpret_cast<T*>(s.data), s.batch, s.head, s.seq, s.dim};
}

// Where the keys of a KV cache are (attention_kvcache): how many each sequence uses,
// and, for a paged cache, which page holds each block of block_size keys.
struct KvPaging {
  const std::int32_t* seqlens = nullptr;      // [batch] keys in use; null: kv_len each
  const std::int32_t* block_table = nullptr;  // [b * table_stride + n]: page of keys n·bs…
  std::int64_t table_stride = 0;
  std::int64_t block_size = 0;  // keys per page; with a table, Strided::batch steps pages
};

struct Problem {
  std::int64_t batch = 0, q_heads = 0, kv_heads = 0, q_len = 0, kv_len = 0, head_dim = 0;
  double scale = 0.0;
  Causal causal = Causal::none;
  // Key j is visible to query i iff j <= i + causal_offset (causal problems only):
  // 0 for top-left alignment, kv_len − q_len for bottom-right.
  std::int64_t causal_offset = 0;

  Strided<const float> q, k, v;
  Strided<float> out;
  Strided<float> lse;  // dim stride unused; null data when no logsumexp is asked for
  DType dtype = DType::float32;  // of q, k, v, out (float64 data sits behind these float pointers)

  // Backward only (make_backward_problem), where out and lse are inputs.
  Strided<const float> dout;
  Strided<const float> dlse;  // dim stride unused; null data when no gradient flows through lse
  Strided<float> dq, dk, dv;

  // KV cache (attention_kvcache only; the decode kernel and the reference read it).
  KvPaging paging;

  std::int64_t group_size() const { return q_heads / kv_heads; }  // query heads per kv head
  std::int64_t kv_head_of(std::int64_t q_head) const { return q_head / group_size(); }

  // --- visibility: which keys query i of sequence b sees --------------------------------
  // Keys j < keys_of(b), and with causal masks j <= i + causal_offset_of(b): bottom-right
  // alignment puts the last query at the sequence's own last key.
  bool has_kv_cache() const { return paging.seqlens || paging.block_table; }
  std::int64_t keys_of(std::int64_t b) const {
    return paging.seqlens ? paging.seqlens[b] : kv_len;
  }
  std::int64_t causal_offset_of(std::int64_t b) const {
    return causal == Causal::bottom_right ? keys_of(b) - q_len : 0;
  }
  // One past the last key query i of sequence b sees.
  std::int64_t visible_end(std::int64_t b, std::int64_t i) const {
    const std::int64_t keys = keys_of(b);
    if (causal == Causal::none) return keys;
    const std::int64_t last = i + causal_offset_of(b);
    return last < 0 ? 0 : last + 1 < keys ? last + 1 : keys;
  }
  // Row of key j of sequence b, kv head h, in K or V (paged or not).
  template <class T>
  T* kv_row(const Strided<T>& t, std::int64_t b, std::int64_t h, std::int64_t j) const {
    if (!paging.block_table) return t.row(b, h, j);
    const std::int64_t page = paging.block_table[b * paging.table_stride + j / paging.block_size];
    return t.data + page * t.batch + h * t.head + (j % paging.block_size) * t.seq;
  }

  // One past the last key that queries [q_begin, q_end) may see.
  std::int64_t kv_end(std::int64_t q_end) const {
    if (causal == Causal::none) return kv_len;
    const std::int64_t last_visible = q_end - 1 + causal_offset;
    if (last_visible < 0) return 0;
    return last_visible + 1 < kv_len ? last_visible + 1 : kv_len;
  }
  // Whether some key in [kv_begin, kv_end) is hidden from some query in [q_begin, q_end).
  bool needs_mask(std::int64_t q_begin, std::int64_t kv_block_end) const {
    return causal != Causal::none && kv_block_end - 1 > q_begin + causal_offset;
  }
};

// Validates the arguments (throwing fattn::Error) and describes the problem.
// out may be null (reference_row checks one row without an output tensor).
Problem make_problem(const TensorView& q, const TensorView& k, const TensorView& v,
                     const TensorView* out, const TensorView* lse, const Options& options);

// The same for attention_backward: out, dout, lse (and dlse if not null) are inputs,
// dq, dk, dv outputs that overlap neither an input nor each other.
Problem make_backward_problem(const TensorView& q, const TensorView& k, const TensorView& v,
                              const TensorView& out, const TensorView& dout,
                              const TensorView& lse, const TensorView* dlse,
                              const TensorView& dq, const TensorView& dk, const TensorView& dv,
                              const Options& options);

}  // namespace fattn::detail
