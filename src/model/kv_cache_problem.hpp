// fattn — a validated KV-cache call (attention_kvcache): the problem the kernels see and
// the append that precedes it.
#pragma once

#include <cstdint>
#include <vector>

#include "model/checks.hpp"
#include "model/problem.hpp"
#include "fattn/kv_cache.hpp"

namespace fattn::detail {

// A paged cache's geometry: keys per page, keys a sequence can hold (the table's columns
// × block_size), pages.
struct PageGeometry {
  std::int64_t block_size, capacity, num_blocks;
  Extent table;  // the block table's bytes (empty for a contiguous cache)
};
// block_table (batch, max_blocks) int32 on `device` (batch from batch_source) with
// contiguous rows, and the cache k (named k_name: num_blocks, Hkv, block_size, D) of pages
// of a multiple of 16 keys.
PageGeometry check_page_table(const TensorView& table, const char* k_name, const TensorView& k,
                              std::int64_t batch, const char* batch_source, Device device);
// Every block of the keys[b] keys sequence b uses names a page of the cache (host memory).
void check_pages_used(const TensorView& table, const char* k_name, const PageGeometry& g,
                      const std::vector<std::int64_t>& keys);
// The K and V views' pages (Strided::pages) for a checked table.
Pages pages_of_table(const TensorView& table, std::int64_t block_size);

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
