// fattn — the validated problem that every backend receives.
#pragma once

#include <cstdint>

#include "fattn/attention.hpp"
#include "fattn/diagnostics.hpp"

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

// What changes the scores of a problem beyond Q·Kᵀ·scale (Options' variants), read by
// every kernel through cpu/score_mods.hpp and by the reference.
struct ScoreMods {
  double softcap = 0.0;                 // 0: off
  const float* alibi = nullptr;         // slope of (b, h): alibi[b * alibi_batch + h]
  std::int64_t alibi_batch = 0;         // 0 for (Hq) slopes
  const float* sinks = nullptr;         // [Hq] logits (natural units)
  // attn_mask: mask + b·batch + h·head + i·seq + j·key; a broadcast dim has stride 0.
  const void* mask = nullptr;
  DType mask_dtype = DType::boolean;    // boolean or the problem's dtype (additive)
  std::int64_t mask_batch = 0, mask_head = 0, mask_seq = 0, mask_key = 0;

  bool any() const { return softcap != 0.0 || alibi || sinks || mask; }
  double slope(std::int64_t b, std::int64_t h) const { return alibi[b * alibi_batch + h]; }
};

// Offsets of the band of visible diagonals: no limit on that side.
constexpr std::int64_t kUnboundedBand = std::int64_t{1} << 62;

struct Problem {
  std::int64_t batch = 0, q_heads = 0, kv_heads = 0, q_len = 0, kv_len = 0, head_dim = 0;
  double scale = 0.0;
  Causal causal = Causal::none;
  std::int64_t window_left = -1, window_right = -1;  // −1: unbounded
  // Key j is visible to query i iff band_lo <= j − i <= band_hi: the causal limit and the
  // sliding window meet in one band of diagonals (for a problem without a KV cache; with
  // one, band_lo_of(b) and band_hi_of(b) depend on the sequence's length).
  std::int64_t band_lo = -kUnboundedBand, band_hi = kUnboundedBand;
  ScoreMods mods;

  Strided<const float> q, k, v;
  Strided<float> out;
  Strided<float> lse;  // dim stride unused; null data when no logsumexp is asked for
  DType dtype = DType::float32;  // of q, k, v, out (float64 data sits behind these float pointers)

  // Backward only (make_backward_problem), where out and lse are inputs.
  Strided<const float> dout;
  Strided<const float> dlse;  // dim stride unused; null data when no gradient flows through lse
  Strided<float> dq, dk, dv;
  float* dsinks = nullptr;    // [Hq], when mods.sinks is set

  // KV cache (attention_kvcache only; the decode kernel and the reference read it).
  KvPaging paging;

  // Where the naive kernels report their stage times, when the caller asks (null: nowhere).
  NaiveStageSeconds* naive_stages = nullptr;

  std::int64_t group_size() const { return q_heads / kv_heads; }  // query heads per kv head
  std::int64_t kv_head_of(std::int64_t q_head) const { return q_head / group_size(); }

  // --- visibility: which keys query i of sequence b sees --------------------------------
  // Keys j < keys_of(b) with band_lo_of(b) <= j − i <= band_hi_of(b).
  bool has_kv_cache() const { return paging.seqlens || paging.block_table; }
  bool has_window() const { return window_left >= 0 || window_right >= 0; }
  std::int64_t keys_of(std::int64_t b) const {
    return paging.seqlens ? paging.seqlens[b] : kv_len;
  }
  // Where the causal limit and the window are aligned: 0 for top-left, Sk − Sq for
  // bottom-right (the last query at the sequence's own last key); the window alone is
  // bottom-right aligned, as FlashAttention's.
  std::int64_t alignment_of(std::int64_t b) const {
    return causal == Causal::top_left ? 0 : keys_of(b) - q_len;
  }
  std::int64_t band_hi_of(std::int64_t b) const {
    std::int64_t hi = causal == Causal::none ? kUnboundedBand : alignment_of(b);
    const std::int64_t right = alignment_of(b) + window_right;
    if (window_right >= 0 && right < hi) hi = right;
    return hi;
  }
  std::int64_t band_lo_of(std::int64_t b) const {
    return window_left >= 0 ? alignment_of(b) - window_left : -kUnboundedBand;
  }
  // The first key and one past the last key query i of sequence b sees (begin >= end: none).
  std::int64_t visible_begin(std::int64_t b, std::int64_t i) const {
    return clamp_key(i + band_lo_of(b), keys_of(b));
  }
  std::int64_t visible_end(std::int64_t b, std::int64_t i) const {
    return clamp_key(i + band_hi_of(b) + 1, keys_of(b));
  }
  // Row of key j of sequence b, kv head h, in K or V (paged or not).
  template <class T>
  T* kv_row(const Strided<T>& t, std::int64_t b, std::int64_t h, std::int64_t j) const {
    if (!paging.block_table) return t.row(b, h, j);
    const std::int64_t page = paging.block_table[b * paging.table_stride + j / paging.block_size];
    return t.data + page * t.batch + h * t.head + (j % paging.block_size) * t.seq;
  }

  // The keys [kv_begin(q_begin), kv_end(q_end)) that some query in [q_begin, q_end) sees.
  std::int64_t kv_begin(std::int64_t q_begin) const { return clamp_key(q_begin + band_lo, kv_len); }
  std::int64_t kv_end(std::int64_t q_end) const {
    return clamp_key(q_end - 1 + band_hi + 1, kv_len);
  }
  // Whether an edge of the band crosses the tile of queries [q_begin, q_end) and keys
  // [j_begin, j_end): some pair of it is hidden by the causal limit or the window.
  bool needs_mask(std::int64_t q_begin, std::int64_t q_end, std::int64_t j_begin,
                  std::int64_t j_end) const {
    return j_end - 1 - q_begin > band_hi || j_begin - (q_end - 1) < band_lo;
  }

 private:
  static std::int64_t clamp_key(std::int64_t j, std::int64_t keys) {
    return j < 0 ? 0 : j < keys ? j : keys;
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
                              const Options& options, const TensorView* dsinks = nullptr);

}  // namespace fattn::detail
