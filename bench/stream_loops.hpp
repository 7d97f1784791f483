// fattn-bench — the triad loop for cache and memory bandwidth, one per instruction set.
//
// stream_loops_isa.cpp is compiled once per ISA (like fma_loops_isa.cpp) and defines
// the table named by FATTN_BENCH_STREAM_LOOPS. The loop sits in its own unit, so the
// caller's repeated passes over the same arrays cannot be merged or hoisted.
#pragma once

#include <cstdint>

namespace fattn_bench {

struct StreamLoops {
  const char* isa;
  // a[i] = b[i] + s·c[i] for i < n; n a multiple of floats_per_step, arrays aligned to 64.
  void (*triad)(float* a, const float* b, const float* c, std::int64_t n, float s);
  int floats_per_step;
};

extern const StreamLoops avx512_stream_loops;  // x86-64 only
extern const StreamLoops avx2_stream_loops;    // x86-64 only
extern const StreamLoops portable_stream_loops;

}  // namespace fattn_bench
