// fattn — two float vectors interleaved within each 128-bit lane, by float or by float
// pair: the first stages of the register transposes (cpu/common/transpose.hpp) and of the
// decode kernel's horizontal sums (cpu/decode/sum_lanes.hpp).
#pragma once

#include "cpu/common/isa_target.hpp"

#if defined(FATTN_AVX)
#include <immintrin.h>

namespace fattn::cpu {
namespace {  // each unit's own copy, built with its own instructions

// Two vectors interleaved per 128-bit lane: lo takes the lane's first halves of a and b,
// alternately, hi its second halves; by float (interleave_floats) or by float pair
// (interleave_pairs). One struct per width: a vector type as a template argument loses its
// attributes (GCC's -Wignored-attributes). Members hi first, as they are evaluated: the
// order GCC gives the two shuffles as the arguments of one add (right to left), so the
// kernels keep the instruction order they were measured with.
struct Interleaved256 {
  __m256 hi, lo;
};
#if defined(FATTN_AVX512)
struct Interleaved512 {
  __m512 hi, lo;
};
#endif

[[gnu::always_inline]] inline Interleaved256 interleave_floats(__m256 a, __m256 b) {
  return {_mm256_unpackhi_ps(a, b), _mm256_unpacklo_ps(a, b)};
}
[[gnu::always_inline]] inline Interleaved256 interleave_pairs(__m256 a, __m256 b) {
  const __m256d x = _mm256_castps_pd(a), y = _mm256_castps_pd(b);
  return {_mm256_castpd_ps(_mm256_unpackhi_pd(x, y)), _mm256_castpd_ps(_mm256_unpacklo_pd(x, y))};
}
#if defined(FATTN_AVX512)
[[gnu::always_inline]] inline Interleaved512 interleave_floats(__m512 a, __m512 b) {
  return {_mm512_unpackhi_ps(a, b), _mm512_unpacklo_ps(a, b)};
}
[[gnu::always_inline]] inline Interleaved512 interleave_pairs(__m512 a, __m512 b) {
  const __m512d x = _mm512_castps_pd(a), y = _mm512_castps_pd(b);
  return {_mm512_castpd_ps(_mm512_unpackhi_pd(x, y)), _mm512_castpd_ps(_mm512_unpacklo_pd(x, y))};
}
#endif

}  // namespace
}  // namespace fattn::cpu
#endif
