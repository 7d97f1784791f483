// fattn-bench --dropout — what attention dropout costs: the fused forward and backward with
// dropout_p > 0 beside the same calls with dropout_p = 0, rotated within each repetition
// (the same inputs, the same run).
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "fattn/attention.hpp"

namespace fattn_bench {

struct DropoutConfig {
  double p = 0.1;
  std::int64_t batch = 2, q_heads = 8, kv_heads = 8;
  std::vector<std::int64_t> seq_lens{512, 2048};
  std::vector<std::int64_t> head_dims{64, 128};
  std::vector<fattn::DType> dtypes{fattn::DType::float32, fattn::DType::bfloat16};
  fattn::Causal causal = fattn::Causal::none;
  fattn::Isa isa = fattn::Isa::automatic;  // --isa: the kernels' instruction set
  int threads = 0, reps = 7, warmup = 1;
  std::uint64_t seed = 0x5eed;
};

struct DropoutResult {
  fattn::DType dtype = fattn::DType::float32;
  std::int64_t seq = 0, head_dim = 0;
  // Medians (ms) and the medians of the per-repetition ratios dropout / none.
  double forward_ms = 0, forward_dropout_ms = 0, forward_ratio = 0;
  double backward_ms = 0, backward_dropout_ms = 0, backward_ratio = 0;
  double kept = 0;  // the share of the forward's output rows' probabilities kept (a check)
  double others_cores = 0;
};

std::vector<DropoutResult> run_dropout_sweep(const DropoutConfig& config);
void print_dropout_table(std::FILE* out, const DropoutConfig& config,
                         const std::vector<DropoutResult>& results);
void write_dropout_json(const std::string& path, const DropoutConfig& config,
                        const std::vector<DropoutResult>& results);

}  // namespace fattn_bench
