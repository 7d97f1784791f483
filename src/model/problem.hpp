// fattn — the validated problem that every backend receives.
#pragma once

#include <cstdint>
#include <type_traits>

#include "fattn/attention.hpp"
#include "fattn/diagnostics.hpp"
#include "model/dropout.hpp"

namespace fattn::detail {

// Pages of a paged KV cache: row s of sequence b lies on page
// table[b · table_stride + s / page_size], at row s % page_size of it.
struct Pages {
  const std::int32_t* table = nullptr;  // null: not paged
  std::int64_t table_stride = 0, page_size = 0;
};

// Element (b, h, s, d) of a strided 4-D float tensor. A paged view (K and V of a paged
// cache) finds the rows of sequence b on its pages, `batch` then stepping pages: every
// reader of a row (the kernels' pre-passes, the decode kernel, the reference) reads a
// paged cache through row() where it lies, and a reader that steps from one row to the
// next by `seq` must stay within a page (pages hold a multiple of 16 keys).
template <class T>
struct Strided {
  T* data = nullptr;
  std::int64_t batch = 0, head = 0, seq = 0, dim = 0;  // strides in elements
  Pages pages;

  T* row(std::int64_t b, std::int64_t h, std::int64_t s) const {
    if (pages.table) {
      const std::int64_t page = pages.table[b * pages.table_stride + s / pages.page_size];
      return data + page * batch + h * head + (s % pages.page_size) * seq;
    }
    return data + b * batch + h * head + s * seq;
  }
  bool paged() const { return pages.table != nullptr; }
};

// The same view with another element type (the float64 reference reads float64 data
// through the float pointers a Problem holds).
template <class T, class U>
Strided<T> retype(const Strided<U>& s) {
  return {reinterpret_cast<T*>(s.data), s.batch, s.head, s.seq, s.dim, s.pages};
}

// The same view with its rows starting at row `start` of the sequence axis and batch stride
// 0, so row(b, h, s) reads row start + s for any b: one sequence of a packed tensor. The
// offset is counted in the data's own elements (bytes_per_element: 16-bit and float64 data
// sit behind float pointers too).
template <class T>
Strided<T> rows_from(const Strided<T>& t, std::int64_t start, std::int64_t bytes_per_element) {
  using Byte = std::conditional_t<std::is_const_v<T>, const char, char>;
  T* data = t.data ? reinterpret_cast<T*>(reinterpret_cast<Byte*>(t.data) +
                                          start * t.seq * bytes_per_element)
                   : nullptr;
  return {data, 0, t.head, t.seq, t.dim};
}

// Sequence b of a paged view as a view of its own: its row of the page table, table
// stride 0, so row(b', h, s) reads sequence b's key s for any b' (as rows_from's views).
template <class T>
Strided<T> pages_of(const Strided<T>& t, std::int64_t b) {
  Strided<T> s = t;
  s.pages.table += b * t.pages.table_stride;
  s.pages.table_stride = 0;
  return s;
}

// A ragged batch (attention_varlen): sequences packed along the sequence axis of a batch-1
// tensor; sequence b's queries are rows [q_starts[b], q_starts[b + 1]) of q, out and lse,
// its keys rows [k_starts[b], k_starts[b + 1]) of k and v (FlashAttention's cu_seqlens),
// or the first k_used[b] of them (FlashAttention's seqused_k). With a paged K and V, the
// keys of sequence b are the first keys_of(b) of its pages (k_starts then count keys, not
// rows).
struct Ragged {
  const std::int64_t* q_starts = nullptr;  // [batch + 1]; null: not ragged
  const std::int64_t* k_starts = nullptr;  // [batch + 1]
  const std::int64_t* k_used = nullptr;    // [batch]; null: the k_starts differences
  // [batch], nonzero where another kernel of the same call computes sequence b (its rows
  // are not this kernel's to read or write); null: none.
  const std::uint8_t* elsewhere = nullptr;
};

// How many keys each sequence of a KV cache uses (attention_kvcache); a paged cache's
// pages are in the K and V views (Strided::pages).
struct KvPaging {
  const std::int32_t* seqlens = nullptr;      // [batch] keys in use; null: kv_len each
};

// What changes the scores of a problem beyond Q·Kᵀ·scale (Options' variants), read by
// every kernel through cpu/common/score_mods.hpp and by the reference.
struct ScoreMods {
  double softcap = 0.0;                 // 0: off
  const float* alibi = nullptr;         // slope of (b, h): alibi[b * alibi_batch + h]
  std::int64_t alibi_batch = 0;         // 0 for (Hq) slopes
  const float* sinks = nullptr;         // [Hq] logits (natural units)
  // attn_mask: mask + b·batch + h·head + i·seq + j·key; a broadcast dim has stride 0.
  const void* mask = nullptr;
  DType mask_dtype = DType::boolean;    // boolean, or a floating dtype (additive)
  std::int64_t mask_batch = 0, mask_head = 0, mask_seq = 0, mask_key = 0;
  const float* mask_scale = nullptr;    // [Hq] factors of an additive mask; null: 1

  bool any() const { return softcap != 0.0 || alibi || sinks || mask; }
  double slope(std::int64_t b, std::int64_t h) const { return alibi[b * alibi_batch + h]; }
  double mask_scale_of(std::int64_t h) const { return mask_scale ? mask_scale[h] : 1.0; }
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
  Dropout dropout;  // of the probabilities before P·V (model/dropout.hpp); off by default

  Strided<const float> q, k, v;
  Strided<float> out;
  Strided<float> lse;  // dim stride unused; null data when no logsumexp is asked for
  DType dtype = DType::float32;  // of q, k, v, out (float64 data sits behind these float pointers)
  // k and v in q8_0 (a CPU forward's cache, with float32 q and out; their views count
  // strides in bytes); false: k and v have dtype.
  bool kv_q8_0 = false;
  DType kv_dtype() const { return kv_q8_0 ? DType::q8_0 : dtype; }
  // A 16-bit forward's out in float32 (the CPU forward only: ggml's FLASH_ATTN_EXT writes
  // float32 from 16-bit caches); false: out has dtype.
  bool out_float32 = false;
  DType out_dtype() const { return out_float32 ? DType::float32 : dtype; }

  // Backward only (make_backward_problem), where out and lse are inputs.
  Strided<const float> dout;
  Strided<const float> dlse;  // dim stride unused; null data when no gradient flows through lse
  Strided<float> dq, dk, dv;
  float* dsinks = nullptr;    // [Hq], when mods.sinks is set

  // KV cache (attention_kvcache only; the decode kernel and the reference read it).
  KvPaging paging;
  // Packed sequences (attention_varlen only): batch sequences of their own lengths, q_len
  // and kv_len the longest; the kernels read sequence b through sequence(b).
  Ragged ragged;

  // Where the naive kernels report their stage times, when the caller asks (null: nowhere).
  NaiveStageSeconds* naive_stages = nullptr;

  std::int64_t group_size() const { return q_heads / kv_heads; }  // query heads per kv head
  std::int64_t kv_head_of(std::int64_t q_head) const { return q_head / group_size(); }

  // --- visibility: which keys query i of sequence b sees --------------------------------
  // Keys j < keys_of(b) with band_lo_of(b) <= j − i <= band_hi_of(b).
  bool has_window() const { return window_left >= 0 || window_right >= 0; }
  bool is_ragged() const { return ragged.q_starts != nullptr; }
  bool runs_elsewhere(std::int64_t b) const { return ragged.elsewhere && ragged.elsewhere[b]; }
  std::int64_t queries_of(std::int64_t b) const {
    return ragged.q_starts ? ragged.q_starts[b + 1] - ragged.q_starts[b] : q_len;
  }
  std::int64_t keys_of(std::int64_t b) const {
    if (ragged.k_used) return ragged.k_used[b];
    if (ragged.k_starts) return ragged.k_starts[b + 1] - ragged.k_starts[b];
    return paging.seqlens ? paging.seqlens[b] : kv_len;
  }
  // Where the causal limit and the window are aligned: 0 for top-left, Sk − Sq for
  // bottom-right (the last query at the sequence's own last key); the window alone is
  // bottom-right aligned, as FlashAttention's.
  std::int64_t alignment_of(std::int64_t b) const {
    return causal == Causal::top_left ? 0 : keys_of(b) - queries_of(b);
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
  // Sequence b of a ragged problem as a problem of its own: batch 1, its lengths and band,
  // views whose rows start at its first row (batch stride 0, so index b and index 0 both
  // address it), its ALiBi slopes. A problem that is not ragged is its own sequence.
  Problem sequence(std::int64_t b) const {
    if (!is_ragged()) return *this;
    Problem s = *this;
    const std::int64_t q0 = ragged.q_starts[b], k0 = ragged.k_starts[b];
    s.ragged = {};
    s.batch = 1;
    s.dropout.sequence = b;
    s.q_len = queries_of(b);
    s.kv_len = keys_of(b);
    s.band_lo = band_lo_of(b);
    s.band_hi = band_hi_of(b);
    const std::int64_t e = element_size(dtype);  // q, k, v, out and their gradients
    const std::int64_t el = dtype == DType::float64 ? 8 : 4;  // lse, dlse: float32 or float64
    s.q = rows_from(q, q0, e);
    s.out = rows_from(out, q0, e);
    s.lse = rows_from(lse, q0, el);
    s.dout = rows_from(dout, q0, e);
    s.dlse = rows_from(dlse, q0, el);
    s.dq = rows_from(dq, q0, e);
    s.k = keys_of_sequence(k, b);
    s.v = keys_of_sequence(v, b);
    s.dk = rows_from(dk, k0, e);
    s.dv = rows_from(dv, k0, e);
    if (mods.alibi) {  // per-head values: float64 for float64 problems, as the lse
      s.mods.alibi = reinterpret_cast<const float*>(reinterpret_cast<const char*>(mods.alibi) +
                                                    b * mods.alibi_batch * el);
      s.mods.alibi_batch = 0;
    }
    return s;
  }

  // K or V (`t`, in kv_dtype) of sequence b of a ragged problem, as a view of its own
  // whose sequence 0 is b's keys: its pages, or its rows of the packed tensor.
  template <class T>
  Strided<T> keys_of_sequence(const Strided<T>& t, std::int64_t b) const {
    if (t.paged()) return pages_of(t, b);
    return rows_from(t, ragged.k_starts[b], element_size(kv_dtype()));
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

// The problem that the work of sequence b reads: the problem itself, or for a ragged one
// sequence b's own (Problem::sequence), copied only then.
class SequenceOf {
 public:
  SequenceOf(const Problem& p, std::int64_t b)
      : p_(p.is_ragged() ? &(view_ = p.sequence(b)) : &p) {}
  SequenceOf(const SequenceOf&) = delete;
  SequenceOf& operator=(const SequenceOf&) = delete;
  const Problem& get() const { return *p_; }

 private:
  Problem view_;
  const Problem* p_;
};

// Validates the arguments (throwing fattn::Error) and describes the problem.
// out may be null (reference_row checks one row without an output tensor).
Problem make_problem(const TensorView& q, const TensorView& k, const TensorView& v,
                     const TensorView* out, const TensorView* lse, const Options& options);

// The same for k and v of a paged cache (num_blocks, Hkv, block_size, D): their first
// dim counts the cache's pages, not q's batch (attention_varlen with a block table).
Problem make_paged_problem(const TensorView& q, const TensorView& k, const TensorView& v,
                           const TensorView* out, const TensorView* lse, const Options& options);

// For the entries that take k and v of q's dtype only (the backward, varlen): a q8_0 k or
// v is an error naming `entry`, with `note` saying what takes it.
void expect_no_q8_0_cache(const char* entry, const char* note, const TensorView& q,
                          const TensorView& k, const TensorView& v);

// The same for attention_backward: out, dout, lse (and dlse if not null) are inputs,
// dq, dk, dv outputs that overlap neither an input nor each other.
Problem make_backward_problem(const TensorView& q, const TensorView& k, const TensorView& v,
                              const TensorView& out, const TensorView& dout,
                              const TensorView& lse, const TensorView* dlse,
                              const TensorView& dq, const TensorView& dk, const TensorView& dv,
                              const Options& options, const TensorView* dsinks = nullptr);

}  // namespace fattn::detail
