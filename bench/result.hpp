// fattn-bench — what one run of the sweep records, and the machine it ran on.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ceilings.hpp"
#include "model.hpp"

namespace fattn_bench {

// One stage of the naive implementation, timed on its own (fattn/diagnostics.hpp).
struct StageResult {
  NaiveStage stage = NaiveStage::qk_gemm;
  double ms_median = 0;
  std::int64_t flops = 0;  // model.hpp naive_stage_flops
  Traffic traffic;         // model.hpp naive_stage_traffic
  double gflops = 0;       // flops / median time
};

struct Result {
  fattn::Impl impl = fattn::Impl::fused;
  fattn::DType dtype = fattn::DType::float32;  // of q, k, v and the output
  Shape shape;
  double ms_median = 0, ms_min = 0, ms_max = 0;
  std::int64_t flops = 0;                // model.hpp
  double gflops = 0;                     // flops / median time
  double pct_fma_peak = 0;               // gflops / Ceilings::fma_peak_gflops × 100
  // The peak of the instructions the kernel runs (roof_for, ceilings.hpp): "fma" or
  // "bf16_dot"; gflops / it × 100.
  std::string roof = "fma";
  double pct_roof = 0;
  double max_abs_err = 0;                // vs the float64 reference; NaN if any value was NaN
  bool err_all_rows = true;              // false: sampled rows (accuracy.hpp)
  std::int64_t extra_bytes = 0;          // fattn::extra_bytes
  std::int64_t page_faults_per_run = 0;  // minor faults per call (fresh workspace pages)
  double sys_ms_per_run = 0;      // kernel CPU time per call, all threads (mostly those faults)
  std::int64_t model_bytes = 0;   // DRAM bytes of this impl's AI model
  double ai_model = 0;            // flops / model_bytes
  double fused_ai_kv_reread = 0;  // fused only: the pessimistic K/V model
  double others_cores = 0;        // CPU other processes used meanwhile (contention.hpp)
  int query_tile_rows = 0;        // Br used by fused_ai_kv_reread
  fattn::Isa isa = fattn::Isa::automatic;  // the kernels' ISA for this problem
  std::vector<StageResult> stages;  // naive only: its three stages
  double prepare_ms_median = 0;     // naive only: the K re-layout before stage 1
};

struct Machine {
  std::string device = "cpu";
  std::string cpu;   // /proc/cpuinfo model name
  std::string date;  // ISO 8601, UTC
  std::string fattn_version;
  Ceilings ceilings;  // isa (of the FMA peak loops), threads, FMA peaks, bandwidth
  std::string kernel_isa;  // the kernels' ISA (the best one when --isa auto)
  std::string kernel_isa_note;  // e.g. which problems Isa::automatic runs on another ISA
  int reps = 0, warmup = 0;
  // CPU used by other processes (contention.hpp), in cores' worth, while the ceilings
  // and then the sweep were measured; and hypervisor steal over the whole run.
  double others_cores_ceilings = 0, others_cores_sweep = 0, steal_cores = 0;
  bool hardware_counters = false;        // hw_counters.hpp
  std::string hardware_counters_detail;  // what the probe found
};

}  // namespace fattn_bench
