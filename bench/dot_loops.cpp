// fattn-bench — the VDPBF16PS peak loop (see dot_loops.hpp).
#include "dot_loops.hpp"

#if defined(__AVX512BF16__)
#include <immintrin.h>
#endif

namespace fattn_bench {

#if defined(__AVX512BF16__)
namespace {

// Independent accumulators, as the FMA loop's: latency × instructions issued per cycle
// with room to spare; 16 chains + 2 operands fit the 32 registers.
constexpr int kChains = 16;
constexpr int kLanes = 16;
constexpr int kProductsPerLane = 2;
constexpr int kFlopsPerProduct = 2;

float dot_loop(std::int64_t iterations, float, float) {
  // Operands 2^-10 (bfloat16 0x3A80): each instruction adds 2·2^-20 a lane, far from
  // overflow for any run length here; the values do not change the speed.
  const __m512i bits = _mm512_set1_epi16(0x3A80);
  __m512bh a = reinterpret_cast<const __m512bh&>(bits), b = a;
  __m512 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm512_setzero_ps();
  for (std::int64_t i = 0; i < iterations; ++i) {
#pragma GCC unroll 16
    for (int c = 0; c < kChains; ++c) acc[c] = _mm512_dpbf16_ps(acc[c], a, b);
    __asm__ volatile("" : "+v"(a), "+v"(b));  // operands the compiler cannot hoist away
  }
  __m512 total = _mm512_setzero_ps();
  for (int c = 0; c < kChains; ++c) total = _mm512_add_ps(total, acc[c]);
  return _mm512_reduce_add_ps(total);
}

}  // namespace

const DotLoop bf16_dot_loop = {dot_loop,
                               std::int64_t{kChains} * kLanes * kProductsPerLane * kFlopsPerProduct};
#else
const DotLoop bf16_dot_loop = {nullptr, 0};
#endif

}  // namespace fattn_bench
