// fattn — horizontal sums of 8 (AVX2) or 16 (AVX-512) float vectors at once, for the decode
// kernel's direct scores (cpu/decode/direct_avx2.hpp, cpu/decode/direct.hpp).
#pragma once

#include "cpu/common/isa_target.hpp"

#include <cstdint>

#if defined(FATTN_AVX)
#include <immintrin.h>

#include "cpu/common/interleave.hpp"

namespace fattn::cpu {
namespace {  // each unit's own copy, built with its own instructions

// Lane i of the result is the sum of the kRows lanes of a[i] (kRows = 8: __m256, 16: __m512):
// rounds that each halve the vectors, adding them interleaved by float, then by float pair,
// then across the 128-bit lanes (the two halves with AVX2: 21 operations for 8 sums; the
// four lanes in two rounds with AVX-512: 45 operations for 16 sums).
template <int kRows, class Vec>
[[gnu::always_inline]] inline Vec sum_lanes(const Vec a[kRows]) {
  Vec b[kRows / 2], c[kRows / 4];
  for (int i = 0; i < kRows / 2; ++i) {
    const auto floats = interleave_floats(a[2 * i], a[2 * i + 1]);
    b[i] = floats.lo + floats.hi;
  }
  for (int i = 0; i < kRows / 4; ++i) {
    const auto pairs = interleave_pairs(b[2 * i], b[2 * i + 1]);
    c[i] = pairs.lo + pairs.hi;
  }
  if constexpr (kRows == 8) {
    // c[0] lane 4h + k: half h of rows 0..3, column k; c[1] the same for rows 4..7.
    constexpr int kLowHalves = 0x20, kHighHalves = 0x31;
    return _mm256_add_ps(_mm256_permute2f128_ps(c[0], c[1], kLowHalves),
                         _mm256_permute2f128_ps(c[0], c[1], kHighHalves));
  } else {
    constexpr int kEven = _MM_SHUFFLE(2, 0, 2, 0), kOdd = _MM_SHUFFLE(3, 1, 3, 1);
    Vec d[2];
    for (int i = 0; i < 2; ++i)
      d[i] = _mm512_add_ps(_mm512_shuffle_f32x4(c[2 * i], c[2 * i + 1], kEven),
                           _mm512_shuffle_f32x4(c[2 * i], c[2 * i + 1], kOdd));
    return _mm512_add_ps(_mm512_shuffle_f32x4(d[0], d[1], kEven),
                         _mm512_shuffle_f32x4(d[0], d[1], kOdd));
  }
}

// The blocks a direct-scores pass runs (direct.hpp, direct_avx2.hpp): `rows` rows in blocks
// of 4, then 2, then 1, each block over nj keys `sums`/R at a time (the last keys one by
// one outside the blocks).
inline std::int64_t direct_score_blocks(std::int64_t rows, std::int64_t nj, int sums) {
  std::int64_t n = 0, r = 0;
  for (; r + 4 <= rows; r += 4) n += nj / (sums / 4);
  if (r + 2 <= rows) n += nj / (sums / 2), r += 2;
  if (r < rows) n += nj / sums;
  return n;
}

}  // namespace
}  // namespace fattn::cpu
#endif
