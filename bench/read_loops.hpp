// fattn-bench — the read-only stream loop for DRAM read bandwidth, one per instruction set.
//
// read_loops_isa.cpp is compiled once per ISA (like stream_loops_isa.cpp) and defines the
// table named by FATTN_BENCH_READ_LOOPS. The loop sits in its own unit, so the caller's
// repeated passes over the same buffer cannot be merged or hoisted.
#pragma once

#include <cstdint>

namespace fattn_bench {

struct ReadLoops {
  const char* isa;
  // Sum of p[0..n) in independent vector accumulators; n a multiple of floats_per_step,
  // p aligned to 64. The sum is returned so the loads cannot be dropped.
  float (*read)(const float* p, std::int64_t n);
  int floats_per_step;
};

extern const ReadLoops avx512_read_loops;  // x86-64 only
extern const ReadLoops avx2_read_loops;    // x86-64 only
extern const ReadLoops portable_read_loops;

}  // namespace fattn_bench
