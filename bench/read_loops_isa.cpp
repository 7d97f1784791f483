// fattn-bench — the read-only stream loop for one instruction set (see read_loops.hpp).
//
// The build defines FATTN_BENCH_VECTOR_BYTES, FATTN_BENCH_READ_LOOPS and
// FATTN_BENCH_ISA_NAME, and compiles with that ISA's -m flags (no -ffast-math: the
// accumulators stay separate chains, never reassociated into one).
#include <cstring>

#include "read_loops.hpp"

namespace fattn_bench {
namespace {

typedef float vec __attribute__((vector_size(FATTN_BENCH_VECTOR_BYTES)));
constexpr int kLanes = FATTN_BENCH_VECTOR_BYTES / static_cast<int>(sizeof(float));
// Independent sums: a vector add's latency (3 cycles on Zen 4, 4 on Sapphire Rapids) ×
// 2 loads per cycle = 6-8 adds in flight, so with 8 chains the loop waits on loads, not
// on adds. 8 accumulators and a load fit the 16 registers of AVX2.
constexpr int kAccumulators = 8;
constexpr int kFloatsPerStep = kLanes * kAccumulators;

vec load(const float* p) {
  vec v;
  std::memcpy(&v, p, sizeof v);  // an aligned vector load once optimised
  return v;
}

float read(const float* p, std::int64_t n) {
  vec acc[kAccumulators] = {};
  for (std::int64_t i = 0; i < n; i += kFloatsPerStep) {
#pragma GCC unroll 8
    for (int a = 0; a < kAccumulators; ++a) acc[a] += load(p + i + a * kLanes);
  }
  vec total = vec{};
  for (int a = 0; a < kAccumulators; ++a) total += acc[a];
  float sum = 0.0f;
  for (int lane = 0; lane < kLanes; ++lane) sum += total[lane];
  return sum;
}

}  // namespace

const ReadLoops FATTN_BENCH_READ_LOOPS = {FATTN_BENCH_ISA_NAME, read, kFloatsPerStep};

}  // namespace fattn_bench
