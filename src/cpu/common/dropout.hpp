// fattn — attention dropout on tiles of probabilities: the mask of model/dropout.hpp
// generated in vector lanes. The lanes are a tile's query rows (the counter's first word);
// one Philox4x32-10 evaluation gives eight consecutive keys of each row (16-bit draws).
#pragma once

#include <cstdint>

#include "cpu/common/simd.hpp"
#include "model/dropout.hpp"

namespace fattn::cpu {

template <class S>
struct DropoutOps {
  using vec = typename S::vec;
  // 32-bit lanes as int32 vectors: every operation on them below is a bit operation, an
  // intrinsic's unsigned product or a comparison of 16-bit values, so the sign never matters.
  using ivec = typename S::ivec;
  static constexpr int L = S::lanes;

  static ivec splat(std::uint32_t x) {
    ivec v;
    for (int i = 0; i < L; ++i) v[i] = static_cast<std::int32_t>(x);
    return v;
  }
  // (high, low) 32 bits of the unsigned a · m, lane by lane: two 32×32→64 products of the
  // even and the odd lanes, blended (GCC's vector extensions widened to 64-bit lanes and
  // back, and cost the dropout 2.4× its Philox arithmetic: docs/perf-log.md, "attention
  // dropout"); the portable build lane by lane.
  [[gnu::always_inline]] static void mulhilo(ivec a, std::uint32_t m, ivec& hi, ivec& lo) {
#if defined(FATTN_AVX512)
    if constexpr (L == 16) {
      const __m512i av = reinterpret_cast<__m512i>(a), mv = _mm512_set1_epi32(static_cast<int>(m));
      const __m512i even = _mm512_mul_epu32(av, mv);
      const __m512i odd = _mm512_mul_epu32(_mm512_srli_epi64(av, 32), mv);
      hi = reinterpret_cast<ivec>(
          _mm512_mask_blend_epi32(0xAAAA, _mm512_srli_epi64(even, 32), odd));
      lo = reinterpret_cast<ivec>(_mm512_mullo_epi32(av, mv));
      return;
    }
#endif
#if defined(__AVX2__) || defined(FATTN_TARGET_AVX)
    if constexpr (L == 8) {
      const __m256i av = reinterpret_cast<__m256i>(a), mv = _mm256_set1_epi32(static_cast<int>(m));
      const __m256i even = _mm256_mul_epu32(av, mv);
      const __m256i odd = _mm256_mul_epu32(_mm256_srli_epi64(av, 32), mv);
      hi = reinterpret_cast<ivec>(_mm256_blend_epi32(_mm256_srli_epi64(even, 32), odd, 0xAA));
      lo = reinterpret_cast<ivec>(_mm256_mullo_epi32(av, mv));
      return;
    }
#endif
    for (int i = 0; i < L; ++i) {
      const std::uint64_t product = std::uint64_t{static_cast<std::uint32_t>(a[i])} * m;
      hi[i] = static_cast<std::int32_t>(static_cast<std::uint32_t>(product >> 32));
      lo[i] = static_cast<std::int32_t>(static_cast<std::uint32_t>(product));
    }
  }
  // Philox4x32-10 of N counters at once, c[w][n] word w of counter n (lane by lane): the
  // N chains interleave, where one chain waits on each round's products.
  template <int N>
  [[gnu::always_inline]] static void philox(std::uint64_t seed, ivec (&c)[4][N]) {
    std::uint32_t k0 = static_cast<std::uint32_t>(seed);
    std::uint32_t k1 = static_cast<std::uint32_t>(seed >> 32);
#pragma GCC unroll 10
    for (int r = 0; r < detail::Philox::kRounds; ++r) {
#pragma GCC unroll 4
      for (int n = 0; n < N; ++n) {
        ivec hi_a, lo_a, hi_b, lo_b;
        mulhilo(c[0][n], detail::Philox::kMulA, hi_a, lo_a);
        mulhilo(c[2][n], detail::Philox::kMulB, hi_b, lo_b);
        c[0][n] = hi_b ^ c[1][n] ^ static_cast<std::int32_t>(k0);
        c[2][n] = hi_a ^ c[3][n] ^ static_cast<std::int32_t>(k1);
        c[1][n] = lo_b;
        c[3][n] = lo_a;
      }
      k0 += detail::Philox::kKeyA;
      k1 += detail::Philox::kKeyB;
    }
  }

  // Counters evaluated together: 4 with AVX-512's 32 registers (16 hold their words), 2
  // with 16 (AVX2, SSE).
  static constexpr int kChains = L == 16 ? 4 : 2;

  // f(j, r, factor) for keys j0 + j (0 <= j < nj) and the lane vector of query rows
  // [i0 + r, i0 + r + L) (r < rows_padded, a multiple of L) of the head whose stream is bh
  // (Dropout::head_stream): factor = 1/(1 − p) in the lanes whose P survives, 0 where it
  // is dropped.
  template <class F>
  [[gnu::always_inline]] static void each(const detail::Dropout& d, std::uint32_t bh,
                                          std::int64_t i0, std::int64_t rows_padded,
                                          std::int64_t j0, std::int64_t nj, F&& f) {
    constexpr int kKeys = detail::Dropout::kKeysPerCall;
    const ivec threshold = splat(d.threshold), low = splat(0xffffu);
    const ivec scale = reinterpret_cast<ivec>(S::splat(d.scale));
    ivec lane;
    for (int i = 0; i < L; ++i) lane[i] = i;
    for (std::int64_t r0 = 0; r0 < rows_padded; r0 += kChains * L) {
      for (std::int64_t g = j0 / kKeys; g * kKeys < j0 + nj; ++g) {
        ivec c[4][kChains];
        for (int n = 0; n < kChains; ++n) {
          c[0][n] = splat(static_cast<std::uint32_t>(i0 + r0 + n * L)) + lane;
          c[1][n] = splat(static_cast<std::uint32_t>(g));
          c[2][n] = splat(bh);
          c[3][n] = splat(d.offset);
        }
        philox(d.seed, c);
        for (int n = 0; n < kChains; ++n) {
          const std::int64_t r = r0 + n * L;
          if (r >= rows_padded) break;
#pragma GCC unroll 8
          for (int k = 0; k < kKeys; ++k) {
            const std::int64_t j = g * kKeys + k - j0;
            if (j < 0 || j >= nj) continue;
            const ivec draw = ((k & 1) ? c[k >> 1][n] >> 16 : c[k >> 1][n]) & low;
            f(j, r, reinterpret_cast<vec>(scale & (draw >= threshold)));
          }
        }
      }
    }
  }

  // t[j][r] ← t[j][r] · factor on a tile [nj][row_stride] with the rows along the lanes.
  static void apply(const detail::Dropout& d, std::uint32_t bh, std::int64_t i0,
                    std::int64_t rows_padded, std::int64_t j0, std::int64_t nj,
                    std::int64_t row_stride, float* t) {
    each(d, bh, i0, rows_padded, j0, nj, [&](std::int64_t j, std::int64_t r, vec factor) {
      float* e = t + j * row_stride + r;
      S::store(e, S::load(e) * factor);
    });
  }
};

}  // namespace fattn::cpu
