// fattn-bench — the FMA peak loops for one instruction set (see fma_loops.hpp).
//
// The build defines
//   FATTN_BENCH_VECTOR_BYTES  64 (AVX-512), 32 (AVX2+FMA) or 16 (portable)
//   FATTN_BENCH_FMA_LOOPS     the table's name, e.g. avx512_fma_loops
//   FATTN_BENCH_ISA_NAME      the ISA as a string
// and compiles with -ffp-contract=fast (a*b + c becomes one FMA where the ISA has it)
// and -fno-tree-vectorize (the scalar chains stay scalar; the vector chains are
// written with GCC vector extensions, which that flag does not touch).
#include "fma_loops.hpp"

namespace fattn_bench {
namespace {

typedef float vec __attribute__((vector_size(FATTN_BENCH_VECTOR_BYTES)));
constexpr int kLanes = FATTN_BENCH_VECTOR_BYTES / static_cast<int>(sizeof(float));

// Independent accumulators: FMA latency (4 cycles on Zen 4) × FMAs issued per cycle
// (2) = 8 chains keep the pipes full; more hide scheduling noise. AVX-512 has 32
// registers, so 16 chains; AVX2/SSE have 16 registers: 12 chains + 2 operands.
#if FATTN_BENCH_VECTOR_BYTES == 64
constexpr int kVectorChains = 16;
#else
constexpr int kVectorChains = 12;
#endif
constexpr int kScalarChains = 12;
constexpr std::int64_t kFlopsPerFma = 2;

float vector_loop(std::int64_t iterations, float multiplier, float addend) {
  const vec m = vec{} + multiplier, a = vec{} + addend;
  vec acc[kVectorChains];
  for (int c = 0; c < kVectorChains; ++c) acc[c] = vec{} + static_cast<float>(c);
  for (std::int64_t it = 0; it < iterations; ++it) {
#pragma GCC unroll 16
    for (int c = 0; c < kVectorChains; ++c) acc[c] = acc[c] * m + a;
  }
  vec total = vec{};
  for (int c = 0; c < kVectorChains; ++c) total += acc[c];
  float sum = 0.0f;
  for (int lane = 0; lane < kLanes; ++lane) sum += total[lane];
  return sum;
}

float scalar_loop(std::int64_t iterations, float multiplier, float addend) {
  float acc[kScalarChains];
  for (int c = 0; c < kScalarChains; ++c) acc[c] = static_cast<float>(c);
  for (std::int64_t it = 0; it < iterations; ++it) {
#pragma GCC unroll 16
    for (int c = 0; c < kScalarChains; ++c) acc[c] = acc[c] * multiplier + addend;
  }
  float sum = 0.0f;
  for (int c = 0; c < kScalarChains; ++c) sum += acc[c];
  return sum;
}

constexpr std::int64_t kVectorFlopsPerIteration = kVectorChains * kLanes * kFlopsPerFma;
constexpr std::int64_t kScalarFlopsPerIteration = kScalarChains * kFlopsPerFma;

}  // namespace

const FmaLoops FATTN_BENCH_FMA_LOOPS = {FATTN_BENCH_ISA_NAME, vector_loop, scalar_loop,
                                        kVectorFlopsPerIteration, kScalarFlopsPerIteration};

}  // namespace fattn_bench
