// fattn — a 16×16 float transpose in AVX-512 registers, for moving query rows into the
// kernels' transposed tiles (qt[d][i], ot[d][i]) and back, 16 rows at a time instead of
// one element at a time; and an 8×8 one in AVX2 registers, for the decode kernel's key
// tiles on AVX2 (cpu/decode/ops.hpp, transpose_keys).
#pragma once

#include "cpu/common/isa_target.hpp"

#if defined(FATTN_AVX)
#include <immintrin.h>

namespace fattn::cpu {
namespace {  // each unit's own copy, built with its own instructions

// r[k][j] ← r[j][k] for 8 vectors of 8 floats: rows interleaved by float, then by float
// pair, then the 128-bit halves exchanged; 24 shuffles, the fewest AVX2 has for 8×8.
inline void transpose8x8(__m256 r[8]) {
  __m256 a[8], b[8];
  for (int k = 0; k < 4; ++k) {
    a[2 * k] = _mm256_unpacklo_ps(r[2 * k], r[2 * k + 1]);
    a[2 * k + 1] = _mm256_unpackhi_ps(r[2 * k], r[2 * k + 1]);
  }
  // b[4g + c], 128-bit half h: column 4h + c of rows 4g .. 4g+3.
  for (int g = 0; g < 2; ++g) {
    const __m256d lo0 = _mm256_castps_pd(a[4 * g]), hi0 = _mm256_castps_pd(a[4 * g + 1]);
    const __m256d lo1 = _mm256_castps_pd(a[4 * g + 2]), hi1 = _mm256_castps_pd(a[4 * g + 3]);
    b[4 * g + 0] = _mm256_castpd_ps(_mm256_unpacklo_pd(lo0, lo1));
    b[4 * g + 1] = _mm256_castpd_ps(_mm256_unpackhi_pd(lo0, lo1));
    b[4 * g + 2] = _mm256_castpd_ps(_mm256_unpacklo_pd(hi0, hi1));
    b[4 * g + 3] = _mm256_castpd_ps(_mm256_unpackhi_pd(hi0, hi1));
  }
  constexpr int kLowHalves = 0x20, kHighHalves = 0x31;
  for (int c = 0; c < 4; ++c) {
    r[c] = _mm256_permute2f128_ps(b[c], b[4 + c], kLowHalves);
    r[4 + c] = _mm256_permute2f128_ps(b[c], b[4 + c], kHighHalves);
  }
}

}  // namespace
}  // namespace fattn::cpu
#endif

#if defined(FATTN_AVX512)
#include <cstdint>

#include <immintrin.h>

namespace fattn::cpu {

// r[k][j] ← r[j][k]. Four stages of 16 shuffles: pairs of rows interleaved by float,
// then by float pair (every 128-bit lane then holds 4 rows of one column quad), then the
// lanes gathered across the four row groups with two rounds of shuffle_f32x4.
inline void transpose16x16(__m512 r[16]) {
  __m512 a[16], b[16];
  for (int k = 0; k < 8; ++k) {
    a[2 * k] = _mm512_unpacklo_ps(r[2 * k], r[2 * k + 1]);
    a[2 * k + 1] = _mm512_unpackhi_ps(r[2 * k], r[2 * k + 1]);
  }
  // b[4g + c], 128-bit lane L: column 4L + c of rows 4g .. 4g+3.
  for (int g = 0; g < 4; ++g) {
    const __m512d lo0 = _mm512_castps_pd(a[4 * g]), hi0 = _mm512_castps_pd(a[4 * g + 1]);
    const __m512d lo1 = _mm512_castps_pd(a[4 * g + 2]), hi1 = _mm512_castps_pd(a[4 * g + 3]);
    b[4 * g + 0] = _mm512_castpd_ps(_mm512_unpacklo_pd(lo0, lo1));
    b[4 * g + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(lo0, lo1));
    b[4 * g + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(hi0, hi1));
    b[4 * g + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(hi0, hi1));
  }
  constexpr int kEven = _MM_SHUFFLE(2, 0, 2, 0), kOdd = _MM_SHUFFLE(3, 1, 3, 1);
  for (int c = 0; c < 4; ++c) {
    const __m512 s01_even = _mm512_shuffle_f32x4(b[c], b[4 + c], kEven);   // lanes 0, 2
    const __m512 s01_odd = _mm512_shuffle_f32x4(b[c], b[4 + c], kOdd);     // lanes 1, 3
    const __m512 s23_even = _mm512_shuffle_f32x4(b[8 + c], b[12 + c], kEven);
    const __m512 s23_odd = _mm512_shuffle_f32x4(b[8 + c], b[12 + c], kOdd);
    r[c] = _mm512_shuffle_f32x4(s01_even, s23_even, kEven);       // column c      (lane 0)
    r[8 + c] = _mm512_shuffle_f32x4(s01_even, s23_even, kOdd);    // column 8 + c  (lane 2)
    r[4 + c] = _mm512_shuffle_f32x4(s01_odd, s23_odd, kEven);     // column 4 + c  (lane 1)
    r[12 + c] = _mm512_shuffle_f32x4(s01_odd, s23_odd, kOdd);     // column 12 + c (lane 3)
  }
}

// One 16×16 block: dst row k (dst_stride floats apart) = column k of the 16 src rows
// (src_stride floats apart), times column_scale[k]. Unaligned loads and stores: the
// blocks sit at any row of the caller's tensors.
inline void transpose_block16(const float* src, std::int64_t src_stride, float* dst,
                              std::int64_t dst_stride, __m512 column_scale) {
  __m512 r[16];
  for (int k = 0; k < 16; ++k) r[k] = _mm512_loadu_ps(src + k * src_stride) * column_scale;
  transpose16x16(r);
  for (int k = 0; k < 16; ++k) _mm512_storeu_ps(dst + k * dst_stride, r[k]);
}

}  // namespace fattn::cpu
#endif
