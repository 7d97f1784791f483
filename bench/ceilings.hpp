// fattn-bench — this machine's ceilings, measured at start-up in the same run.
//
//   FMA peak    fp32 GFLOP/s of register-resident, independent FMA chains
//               (fma_loops_isa.cpp), on every thread at once, vector and scalar.
//   Bandwidth   STREAM triad a[i] = b[i] + s·c[i] over three arrays of doubles far
//               larger than L3, on every thread (OpenMP, static schedule, first touch
//               by the same threads). Counted bytes: 24 per element — read b, read c,
//               write a (STREAM's convention). The write-allocate read of a that the
//               cache also performs is NOT counted; bandwidth_with_write_allocate_gbs
//               (× 4/3) counts it.
//   Read        DRAM read bandwidth: a read-only stream over a buffer far larger than
//               the last level cache, with the kernels' vectors, on one thread and on
//               all (read_bandwidth.hpp): the roof of the decode kernels, which read
//               their KV cache and write almost nothing. Counted bytes: 4 per float.
//   Roofline    the vector FMA peak of every ISA this CPU supports, and the triad
//               bandwidth at L1, L2 and L3 (cache_bandwidth.hpp) besides DRAM.
//   AMX peak    bfloat16 GFLOP/s of register-resident TDPBF16PS (amx_loops.cpp), where
//               the CPU has AMX: the amx kernels' roof (a sixth of it, see below).
//   16-bit dot  bfloat16 GFLOP/s of register-resident VDPBF16PS (dot_loops.cpp), where
//               fattn::cpu_has_bf16_dot_products(): the roof of the kernels that run
//               bfloat16 inputs on it (the fused forward).
// Each figure is the best of several repetitions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cache_bandwidth.hpp"

#include "fattn/attention.hpp"

namespace fattn_bench {

struct Ceilings {
  std::string isa;  // the ISA the vector peak was measured with
  int threads = 1;
  double fma_peak_gflops = 0;                    // vector FMA, all threads
  double scalar_fma_peak_gflops = 0;             // scalar FMA (or mul + add), all threads
  double bandwidth_gbs = 0;                      // triad, 24 bytes per element
  double bandwidth_with_write_allocate_gbs = 0;  // triad, 32 bytes per element
  double triad_array_mib = 0;                    // size of each of the three arrays
  double read_bandwidth_gbs = 0;                 // read-only stream, all threads
  double read_bandwidth_one_thread_gbs = 0;      // read-only stream, one thread
  double read_bandwidth_buffer_mib = 0;          // the buffer both read
  std::string read_bandwidth_isa;                // the vectors it was read with
  // The roofline's ceilings: FMA peak per ISA (vector; "scalar" last), bandwidth per
  // level from L1 to DRAM (DRAM: the triad above).
  struct IsaPeak {
    std::string isa;
    double gflops = 0;
  };
  std::vector<IsaPeak> fma_peaks;
  std::vector<LevelBandwidth> bandwidth_levels;
  // The AMX tile unit, all threads (0 where the CPU or the build has none): TDPBF16PS
  // with its operands in tile registers, bfloat16 GFLOP/s. The amx kernels' float32 roof
  // is a sixth of it: each float32 product is six bfloat16 partial products
  // (src/cpu/amx/ops.hpp), the vector work beside them not counted.
  double amx_bf16_peak_gflops = 0;
  // VDPBF16PS, all threads (0 where the CPU or the build has none): bfloat16 GFLOP/s.
  double bf16_dot_peak_gflops = 0;
  double amx_fp32_roof_gflops() const { return amx_bf16_peak_gflops / kAmxPartialProducts; }
  static constexpr int kAmxPartialProducts = 6;
};

// The peak of the instructions a run's kernel multiplies with (fattn::forward_plan's
// products), named as they are: "bf16_dot" (VDPBF16PS), "amx" (the amx kernels' float32
// roof, where the tile peak was measured), else "fma" (float32 FMA; for the float64
// reference an upper bound).
struct Roof {
  std::string name;
  double gflops = 0;
};
Roof roof_for(const fattn::ForwardPlan& plan, const Ceilings& ceilings);
// A table cell's mark for a roof other than the FMA peak: " dot" (bf16_dot), " amx".
const char* roof_mark(const std::string& roof);

// isa must be concrete (not automatic) and supported by this CPU. roofline: also the
// peak of every other ISA and the bandwidth of each cache level (a few seconds more).
Ceilings measure_ceilings(fattn::Isa isa, int threads, bool roofline = true);

// "model name" from /proc/cpuinfo, or "unknown".
std::string cpu_model_name();

}  // namespace fattn_bench
