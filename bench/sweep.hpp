// fattn-bench — the sweep: every (sequence length, causal mode, implementation).
#pragma once

#include <cstdint>
#include <vector>

#include "fattn/attention.hpp"
#include "result.hpp"

namespace fattn_bench {

struct SweepConfig {
  std::int64_t batch = 2, q_heads = 8, kv_heads = 8, head_dim = 64;
  std::vector<std::int64_t> q_lens{128, 512, 1024, 2048, 4096};
  std::vector<std::int64_t> kv_lens;  // empty: Sk = Sq; one value: for every Sq; else paired
  std::vector<fattn::Causal> causal{fattn::Causal::none, fattn::Causal::top_left};
  std::vector<fattn::Impl> impls{fattn::Impl::naive, fattn::Impl::fused};
  fattn::Isa isa = fattn::Isa::automatic;  // resolved before the sweep (the best, if auto)
  bool isa_automatic = true;  // pass Isa::automatic: each problem runs automatic_cpu_isa(Sk)
  int threads = 0;                         // resolved before the sweep
  int reps = 5, warmup = 1;
  bool lse = false;  // also write the logsumexp
  fattn::DType dtype = fattn::DType::float32;  // of q, k, v and the output
  std::uint64_t seed = 0x5eed;
};

// Runs the sweep in order (sequence length, then causal mode, then impl) and
// reports each step on stderr. Results come in the same order.
std::vector<Result> run_sweep(const SweepConfig& config, const Ceilings& ceilings);

}  // namespace fattn_bench
