// fattn — register-resident loops of the two instructions bfloat16 products can run on:
// the rates fattn chooses between (cpu/product_rates.cpp) and fattn-bench's ceilings.
//
// Each function carries its own target attribute, so a unit built for any ISA may hold
// it; call it only where the CPU has the instructions (cpu_supports(Isa::avx512),
// cpu_has_bf16_dot_products()).
#pragma once

#include <cstdint>

#if (defined(__x86_64__) || defined(__i386__)) && !defined(FATTN_PORTABLE_ONLY)
#include <immintrin.h>
#define FATTN_PEAK_LOOPS 1
#if defined(FATTN_HAVE_AVX512_BF16) || defined(__AVX512BF16__)
#define FATTN_PEAK_BF16_DOT 1
#endif
#endif

namespace fattn::cpu::peak {

// Independent accumulators, enough to cover the latency (4-6 cycles) × issue width (2) of
// either instruction; 16 chains and 2 operands fit the 32 vector registers.
inline constexpr int kChains = 16;
inline constexpr int kLanes = 16;
inline constexpr std::int64_t kFmaFlopsPerRound = std::int64_t{kChains} * kLanes * 2;
// vdpbf16ps: 2 multiply-adds per lane
inline constexpr std::int64_t kDotFlopsPerRound = std::int64_t{kChains} * kLanes * 2 * 2;

#if defined(FATTN_PEAK_LOOPS)
// `rounds` rounds of kChains AVX-512 FMAs; returns a checksum (so the loop stays).
__attribute__((target("avx512f"))) inline float fma512_rounds(std::int64_t rounds) {
  __m512 m = _mm512_set1_ps(0.999f), a = _mm512_set1_ps(1e-3f);
  __m512 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm512_set1_ps(static_cast<float>(c));
  for (std::int64_t r = 0; r < rounds; ++r) {
#pragma GCC unroll 16
    for (int c = 0; c < kChains; ++c) acc[c] = _mm512_fmadd_ps(acc[c], m, a);
    __asm__ volatile("" : "+v"(m), "+v"(a));  // operands the compiler cannot hoist away
  }
  __m512 total = _mm512_setzero_ps();
  for (int c = 0; c < kChains; ++c) total = _mm512_add_ps(total, acc[c]);
  return _mm512_reduce_add_ps(total);
}
#endif

#if defined(FATTN_PEAK_BF16_DOT)
// `rounds` rounds of kChains vdpbf16ps; returns a checksum.
__attribute__((target("avx512f,avx512bw,avx512bf16"))) inline float bf16_dot_rounds(
    std::int64_t rounds) {
  // Operands 2^-10 (bfloat16 0x3A80): each instruction adds 2·2^-20 a lane, far from
  // overflow for any run length; the values do not change the speed.
  const __m512i bits = _mm512_set1_epi16(0x3A80);
  __m512bh a = reinterpret_cast<const __m512bh&>(bits), b = a;
  __m512 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm512_setzero_ps();
  for (std::int64_t r = 0; r < rounds; ++r) {
#pragma GCC unroll 16
    for (int c = 0; c < kChains; ++c) acc[c] = _mm512_dpbf16_ps(acc[c], a, b);
    __asm__ volatile("" : "+v"(a), "+v"(b));
  }
  __m512 total = _mm512_setzero_ps();
  for (int c = 0; c < kChains; ++c) total = _mm512_add_ps(total, acc[c]);
  return _mm512_reduce_add_ps(total);
}
#endif

}  // namespace fattn::cpu::peak
