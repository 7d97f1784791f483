// fattn-bench — register-resident FMA loops, one set per instruction set.
//
// fma_loops_isa.cpp is compiled once per ISA (like src/cpu/kernels_isa.cpp) with that
// ISA's -m flags, and defines the table named by FATTN_BENCH_FMA_LOOPS.
#pragma once

#include <cstdint>

namespace fattn_bench {

struct FmaLoops {
  const char* isa;
  // Runs `iterations` rounds of independent chains acc = acc·multiplier + addend and
  // returns a checksum of the accumulators (so the loop cannot be dropped).
  float (*vector_loop)(std::int64_t iterations, float multiplier, float addend);
  float (*scalar_loop)(std::int64_t iterations, float multiplier, float addend);
  std::int64_t vector_flops_per_iteration;  // chains × lanes × 2
  std::int64_t scalar_flops_per_iteration;  // chains × 2
};

// avx512 and avx2 exist only on x86-64 builds.
extern const FmaLoops avx512_fma_loops;
extern const FmaLoops avx2_fma_loops;
extern const FmaLoops portable_fma_loops;

}  // namespace fattn_bench
