// fattn — a 16×16 float transpose in AVX-512 registers, for moving query rows into the
// kernels' transposed tiles (qt[d][i], ot[d][i]) and back, 16 rows at a time instead of
// one element at a time; and an 8×8 one in AVX2 registers, for the decode kernel's key
// tiles on AVX2 (cpu/decode/ops.hpp, transpose_keys).
#pragma once

#include "cpu/common/isa_target.hpp"

#if defined(FATTN_AVX)
#include <cstdint>

#include <immintrin.h>

namespace fattn::cpu {
namespace {  // each unit's own copy, built with its own instructions

// The shuffles of the first two stages, one name for both widths (within each 128-bit lane:
// floats, then float pairs, of two rows interleaved).
inline __m256 unpack_lo(__m256 x, __m256 y) { return _mm256_unpacklo_ps(x, y); }
inline __m256 unpack_hi(__m256 x, __m256 y) { return _mm256_unpackhi_ps(x, y); }
inline __m256 unpack_lo_pairs(__m256 x, __m256 y) {
  return _mm256_castpd_ps(_mm256_unpacklo_pd(_mm256_castps_pd(x), _mm256_castps_pd(y)));
}
inline __m256 unpack_hi_pairs(__m256 x, __m256 y) {
  return _mm256_castpd_ps(_mm256_unpackhi_pd(_mm256_castps_pd(x), _mm256_castps_pd(y)));
}
#if defined(FATTN_AVX512)
inline __m512 unpack_lo(__m512 x, __m512 y) { return _mm512_unpacklo_ps(x, y); }
inline __m512 unpack_hi(__m512 x, __m512 y) { return _mm512_unpackhi_ps(x, y); }
inline __m512 unpack_lo_pairs(__m512 x, __m512 y) {
  return _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(x), _mm512_castps_pd(y)));
}
inline __m512 unpack_hi_pairs(__m512 x, __m512 y) {
  return _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(x), _mm512_castps_pd(y)));
}
#endif

// The first two stages of an N×N transpose (N = 8 or 16 rows of N floats): pairs of rows
// interleaved by float, then by float pair. After them b[4g + c], 128-bit lane L, holds
// column 4L + c of rows 4g .. 4g+3; the last stage gathers the lanes across row groups.
template <int N, class V>
inline void interleave_row_quads(const V* r, V* b) {
  V a[N];
  for (int k = 0; k < N / 2; ++k) {
    a[2 * k] = unpack_lo(r[2 * k], r[2 * k + 1]);
    a[2 * k + 1] = unpack_hi(r[2 * k], r[2 * k + 1]);
  }
  for (int g = 0; g < N / 4; ++g) {
    b[4 * g + 0] = unpack_lo_pairs(a[4 * g], a[4 * g + 2]);
    b[4 * g + 1] = unpack_hi_pairs(a[4 * g], a[4 * g + 2]);
    b[4 * g + 2] = unpack_lo_pairs(a[4 * g + 1], a[4 * g + 3]);
    b[4 * g + 3] = unpack_hi_pairs(a[4 * g + 1], a[4 * g + 3]);
  }
}

// r[k][j] ← r[j][k] for 8 vectors of 8 floats: the two stages above, then the 128-bit
// halves exchanged; 24 shuffles, the fewest AVX2 has for 8×8.
inline void transpose8x8(__m256 r[8]) {
  __m256 b[8];
  interleave_row_quads<8>(r, b);
  constexpr int kLowHalves = 0x20, kHighHalves = 0x31;
  for (int c = 0; c < 4; ++c) {
    r[c] = _mm256_permute2f128_ps(b[c], b[4 + c], kLowHalves);
    r[4 + c] = _mm256_permute2f128_ps(b[c], b[4 + c], kHighHalves);
  }
}

#if defined(FATTN_AVX512)
// r[k][j] ← r[j][k]. Four stages of 16 shuffles: the two above (every 128-bit lane then
// holds 4 rows of one column quad), then the lanes gathered across the four row groups
// with two rounds of shuffle_f32x4.
inline void transpose16x16(__m512 r[16]) {
  __m512 b[16];
  interleave_row_quads<16>(r, b);
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
#endif

}  // namespace
}  // namespace fattn::cpu
#endif
