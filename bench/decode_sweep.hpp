// fattn-bench --decode — short queries against a KV cache: the decode kernel beside the
// prefill (fused) kernel it replaces, against the DRAM read bandwidth (decode's roof: it
// reads the cache and writes almost nothing), the triad and the FMA peak of the same run.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "fattn/attention.hpp"
#include "result.hpp"

namespace fattn_bench {

struct DecodeConfig {
  std::vector<std::int64_t> batches{1, 8}, kv_heads{8, 32}, head_dims{64, 128}, q_lens{1, 4, 16};
  std::vector<std::int64_t> kv_lens{1024, 4096, 16384, 32768, 65536, 131072};
  std::int64_t q_heads = 32;
  std::vector<fattn::Impl> impls{fattn::Impl::decode, fattn::Impl::fused};
  // Points whose K and V together exceed this are skipped (memory), and the fused kernel,
  // which packs all of K first, runs only up to fused_max_keys keys (time).
  double max_kv_gib = 6.0;
  std::int64_t fused_max_keys = 16384;
  // > 0: the cache on shuffled pages of this many keys (a paged KV cache, a multiple of 16,
  // read through attention_kvcache's block table; the decode kernel alone); 0: contiguous.
  std::int64_t page = 0;
  // The decode kernel's schedule, each value a point of the sweep (Options::
  // decode_prefetch_tiles, decode_prefetch_level, kv_splits; -1 and 0: the kernel chooses).
  std::vector<int> prefetch_tiles{-1}, prefetch_levels{-1}, kv_splits{0};
  int threads = 0, reps = 5, warmup = 1;
  fattn::Isa isa = fattn::Isa::automatic;
  fattn::Isa read_isa = fattn::Isa::avx2;  // the loads of the read stream over the cache (the ceilings')
  fattn::DType dtype = fattn::DType::float32;  // of q, the cache and the output
  std::uint64_t seed = 0x5eed;
};

struct DecodeResult {
  fattn::Impl impl = fattn::Impl::decode;
  fattn::DType dtype = fattn::DType::float32;
  std::int64_t batch = 0, q_heads = 0, kv_heads = 0, head_dim = 0, q_len = 0, kv_len = 0;
  std::int64_t page = 0;  // keys per page of a paged cache (0: contiguous)
  // the options it ran with (plan: what they became)
  int prefetch_tiles_asked = -1, prefetch_level_asked = -1, kv_splits_asked = 0;
  double ms_median = 0, ms_min = 0, ms_max = 0;
  std::int64_t kv_bytes = 0;  // K and V read once per call, in their dtype
  double gbs = 0;             // kv_bytes / median time
  double pct_read_bandwidth = 0;  // against the read bandwidth (all threads) of the same run
  double pct_bandwidth = 0;       // against the DRAM triad of the same run
  // A read stream over this point's own K and V (the cache's memory), its runs alternated
  // with the decode's: GB/s (median) and the decode's share of it.
  double cache_read_gbs = 0, pct_cache_read = 0;
  std::int64_t flops = 0;     // 4·D per (query row, key) pair
  double gflops = 0, pct_fma_peak = 0;
  std::string roof = "fma";  // the peak of the instructions it runs (roof_for, ceilings.hpp)
  double pct_roof = 0;       // gflops / that peak × 100
  std::int64_t extra_bytes = 0;  // working memory (fattn::extra_bytes)
  double max_abs_err = 0;        // sampled rows against the float64 reference
  fattn::DecodePlan plan;        // what the decode kernel did (forward_plan / kvcache_plan)
};

std::vector<DecodeResult> run_decode_sweep(const DecodeConfig& config, const Ceilings& ceilings);

// One line per shape; decode and fused side by side, and their ratio.
void print_decode_table(std::FILE* out, const Machine& machine,
                        const std::vector<DecodeResult>& results);
void write_decode_json(const std::string& path, const Machine& machine,
                       const std::vector<DecodeResult>& results);

}  // namespace fattn_bench
