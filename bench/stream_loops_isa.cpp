// fattn-bench — the triad loop for one instruction set (see stream_loops.hpp).
//
// The build defines FATTN_BENCH_VECTOR_BYTES, FATTN_BENCH_STREAM_LOOPS and
// FATTN_BENCH_ISA_NAME, and compiles with that ISA's -m flags. Two vectors per step:
// enough independent loads in flight to reach L1's two loads per cycle.
#include <cstring>

#include "stream_loops.hpp"

namespace fattn_bench {
namespace {

typedef float vec __attribute__((vector_size(FATTN_BENCH_VECTOR_BYTES)));
constexpr int kLanes = FATTN_BENCH_VECTOR_BYTES / static_cast<int>(sizeof(float));
constexpr int kVectorsPerStep = 2;
constexpr int kFloatsPerStep = kLanes * kVectorsPerStep;

vec load(const float* p) {
  vec v;
  std::memcpy(&v, p, sizeof v);  // an aligned vector load once optimised
  return v;
}

void triad(float* a, const float* b, const float* c, std::int64_t n, float s) {
  const vec scalar = vec{} + s;
  for (std::int64_t i = 0; i < n; i += kFloatsPerStep) {
    const vec first = load(b + i) + scalar * load(c + i);
    const vec second = load(b + i + kLanes) + scalar * load(c + i + kLanes);
    std::memcpy(a + i, &first, sizeof first);
    std::memcpy(a + i + kLanes, &second, sizeof second);
  }
}

}  // namespace

const StreamLoops FATTN_BENCH_STREAM_LOOPS = {FATTN_BENCH_ISA_NAME, triad, kFloatsPerStep};

}  // namespace fattn_bench
