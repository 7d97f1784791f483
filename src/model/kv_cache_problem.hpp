// fattn — a validated KV-cache call (attention_kvcache): the problem the kernels see and
// the append that precedes it.
#pragma once

#include <cstdint>
#include <vector>

#include "model/problem.hpp"
#include "fattn/kv_cache.hpp"

namespace fattn::detail {

struct KvCacheProblem {
  // Validates every argument (throwing fattn::Error) before anything is written.
  KvCacheProblem(const TensorView& q, const KvCache& cache, const TensorView* k_new,
                 const TensorView* v_new, const TensorView* out, const TensorView* lse,
                 const Options& options);
  KvCacheProblem(const KvCacheProblem&) = delete;
  KvCacheProblem& operator=(const KvCacheProblem&) = delete;

  // Writes k_new and v_new into the cache at each sequence's old length.
  void append() const;

  Problem p;                          // keys per sequence: after the append
  std::vector<std::int32_t> lengths;  // p.paging.seqlens points here (empty: no seqlens)
  std::vector<std::int32_t> old_lengths;
  Strided<float> k_cache, v_cache;    // where the append writes (p.k, p.v read the same)
  Strided<const float> k_new, v_new;  // null data: no append
  std::int64_t new_len = 0;
};

}  // namespace fattn::detail
