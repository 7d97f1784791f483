// fattn-bench --varlen — packed variable-length prefill (attention_varlen): the ragged call
// beside the per-sequence loop (attention_forward once per sequence, what attention_varlen
// did before it ran one ragged problem), the same tokens padded into one dense batch, and
// the same keys on the pages of a paged KV cache (attention_varlen with a block table).
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "fattn/attention.hpp"

namespace fattn_bench {

struct VarlenConfig {
  // Mixes of lengths (Sq = Sk per sequence): "uniform" 64 sequences of 16–512 tokens,
  // "longtail" 60 of 16–64 and 4 of 256–1024 (lengths drawn uniformly from `seed`).
  std::vector<std::string> mixes{"uniform", "longtail"};
  std::vector<std::int64_t> head_dims{128, 64};
  std::vector<fattn::DType> dtypes{fattn::DType::float32, fattn::DType::bfloat16};
  std::int64_t q_heads = 8, kv_heads = 8;
  fattn::Causal causal = fattn::Causal::bottom_right;
  bool padded = true;  // also time the padded dense batch (the slowest of the three)
  // Also time the same keys on shuffled pages of this many keys (attention_varlen over a
  // paged KV cache, FlashAttention's block_table; vLLM's pages hold 16); 0: not timed.
  std::int64_t page = 16;
  bool backward = true;  // also time attention_varlen_backward against the per-sequence loop
  int threads = 0, reps = 7, warmup = 1;
  std::uint64_t seed = 0x5eed;
};

struct VarlenResult {
  std::string mix;
  fattn::DType dtype = fattn::DType::float32;
  std::int64_t sequences = 0, tokens = 0, max_len = 0, q_heads = 0, kv_heads = 0, head_dim = 0;
  double useful_flops = 0;  // 4·D per visible (query, key) pair of the real sequences, all heads
  // Median ms of each, timed in turn within each repetition (ragged, loop, padded rotated).
  double ragged_ms = 0, loop_ms = 0, padded_ms = 0;  // padded_ms 0: not timed
  double paged_ms = 0;  // the keys on pages (VarlenConfig::page); 0: not timed
  // Medians of the per-repetition ratios (robust to a repetition slowed for all three).
  double loop_over_ragged = 0, padded_over_ragged = 0, paged_over_ragged = 0;
  double max_abs_diff = 0;  // ragged vs the per-sequence loop, every output element
  double paged_max_abs_diff = 0;  // paged vs ragged (the same arithmetic: 0)
  // The backward (when timed): attention_varlen_backward against attention_backward once per
  // sequence, alternated; the largest difference over dq, dk, dv.
  double backward_ragged_ms = 0, backward_loop_ms = 0, backward_loop_over_ragged = 0,
         backward_max_abs_diff = 0, backward_others_cores = 0;
  double others_cores = 0;  // other processes' CPU use while this point ran (contention.hpp)
};

// The lengths of a mix (throws on an unknown name).
std::vector<std::int64_t> varlen_lengths(const std::string& mix, std::uint64_t seed);

std::vector<VarlenResult> run_varlen_sweep(const VarlenConfig& config);

void print_varlen_table(std::FILE* out, const VarlenConfig& config,
                        const std::vector<VarlenResult>& results);
void write_varlen_json(const std::string& path, const VarlenConfig& config,
                       const std::vector<VarlenResult>& results);

}  // namespace fattn_bench
