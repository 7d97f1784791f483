// fattn — a 16×16 float transpose in AVX-512 registers, for moving query rows into the
// kernels' transposed tiles (qt[d][i], ot[d][i]) and back, 16 rows at a time instead of
// one element at a time; and an 8×8 one in AVX2 registers, for the decode kernel's key
// tiles on AVX2 (cpu/decode/ops.hpp, transpose_keys).
#pragma once

#include "cpu/common/isa_target.hpp"

#if defined(FATTN_AVX)
#include <cstdint>

#include <immintrin.h>

#include "cpu/common/interleave.hpp"

namespace fattn::cpu {
namespace {  // each unit's own copy, built with its own instructions

// The first two stages of an N×N transpose (N = 8 or 16 rows of N floats): pairs of rows
// interleaved by float, then by float pair. After them b[4g + c], 128-bit lane L, holds
// column 4L + c of rows 4g .. 4g+3; the last stage gathers the lanes across row groups.
template <int N, class V>
inline void interleave_row_quads(const V* r, V* b) {
  V a[N];
  for (int k = 0; k < N / 2; ++k) {
    const auto floats = interleave_floats(r[2 * k], r[2 * k + 1]);
    a[2 * k] = floats.lo;
    a[2 * k + 1] = floats.hi;
  }
  for (int g = 0; g < N / 4; ++g)
    for (int h = 0; h < 2; ++h) {  // rows 4g + h and 4g + h + 2
      const auto pairs = interleave_pairs(a[4 * g + h], a[4 * g + h + 2]);
      b[4 * g + 2 * h] = pairs.lo;
      b[4 * g + 2 * h + 1] = pairs.hi;
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
