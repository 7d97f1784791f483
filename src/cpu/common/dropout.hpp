// fattn — attention dropout on tiles of probabilities: the mask of model/dropout.hpp
// generated in vector lanes. The lanes are a tile's query rows (the counter's first word);
// one Philox4x32-10 evaluation gives eight consecutive keys of each row (16-bit draws).
#pragma once

#include <cstdint>
#include <type_traits>

#include "cpu/common/blocks.hpp"
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
  // The high and low 32 bits of a · m.
  static void mulhilo(std::uint32_t a, std::uint32_t m, std::uint32_t& hi, std::uint32_t& lo) {
    const std::uint64_t product = std::uint64_t{a} * m;
    hi = static_cast<std::uint32_t>(product >> 32);
    lo = static_cast<std::uint32_t>(product);
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
      std::uint32_t hi_i, lo_i;
      mulhilo(static_cast<std::uint32_t>(a[i]), m, hi_i, lo_i);
      hi[i] = static_cast<std::int32_t>(hi_i);
      lo[i] = static_cast<std::int32_t>(lo_i);
    }
  }
  // The round keys: round r uses (seed low + r·kKeyA, seed high + r·kKeyB), mod 2^32.
  struct RoundKeys {
    std::uint32_t k0[detail::Philox::kRounds], k1[detail::Philox::kRounds];
    explicit RoundKeys(std::uint64_t seed) {
      std::uint32_t a = static_cast<std::uint32_t>(seed), b = static_cast<std::uint32_t>(seed >> 32);
      for (int r = 0; r < detail::Philox::kRounds; ++r, a += detail::Philox::kKeyA, b += detail::Philox::kKeyB)
        k0[r] = a, k1[r] = b;
    }
  };

  // Rounds [First, kRounds) of Philox4x32-10 on N counters at once, c[w][n] word w of
  // counter n (lane by lane): the N chains interleave, where one chain waits on each
  // round's products.
  template <int First, int N>
  [[gnu::always_inline]] static void rounds(const RoundKeys& keys, ivec (&c)[4][N]) {
#pragma GCC unroll 10
    for (int r = First; r < detail::Philox::kRounds; ++r) {
#pragma GCC unroll 4
      for (int n = 0; n < N; ++n) {
        ivec hi_a, lo_a, hi_b, lo_b;
        mulhilo(c[0][n], detail::Philox::kMulA, hi_a, lo_a);
        mulhilo(c[2][n], detail::Philox::kMulB, hi_b, lo_b);
        c[0][n] = hi_b ^ c[1][n] ^ static_cast<std::int32_t>(keys.k0[r]);
        c[2][n] = hi_a ^ c[3][n] ^ static_cast<std::int32_t>(keys.k1[r]);
        c[1][n] = lo_b;
        c[3][n] = lo_a;
      }
    }
  }

  // Counters evaluated together: 4 with AVX-512's 32 registers (16 hold their words), 2
  // with 16 (AVX2, SSE).
  static constexpr int kChains = L == 16 ? 4 : 2;

  // A tile's counters (i, g, bh, offset) differ only in the row i (the lanes) and the key
  // group g = j / 8, so Philox's first rounds need not be evaluated per counter: a word
  // that depends on one of them alone is computed once for it. Round 1 multiplies i (a
  // row's) and bh (the head's); round 2 multiplies a word of g alone and one of i alone;
  // round 3, one of i alone and one of both. What a row vector keeps (RowRounds, once per
  // tile) and what a key group adds (scalars, after_three_rounds) leave 15 of the 20
  // vector products of a counter's 10 rounds, with the same bits as detail::philox4x32
  // (tests/test_dropout.cpp).
  struct RowRounds {
    ivec c3_1;      // word 3 after round 1 (i's)
    ivec c1_2_key;  // word 1 after round 2 (i's), with round 3's key k0
    ivec hi_a3;     // round 3's product of word 0 after round 2 (i's): high and low words
    ivec lo_a3;
  };
  struct HeadRounds {
    std::uint32_t c0_base;  // word 0 after round 1, but g: high(kMulB · bh) ^ k0 of round 1
    std::uint32_t c1_1;     // word 1 after round 1: low(kMulB · bh)
  };
  static HeadRounds head_rounds(std::uint32_t bh, const RoundKeys& keys) {
    std::uint32_t hi, lo;
    mulhilo(bh, detail::Philox::kMulB, hi, lo);  // round 1: bh · kMulB
    return {hi ^ keys.k0[0], lo};
  }
  static RowRounds row_rounds(const detail::Dropout& d, const HeadRounds& head, ivec rows,
                              const RoundKeys& keys) {
    RowRounds rr;
    ivec hi, lo;
    mulhilo(rows, detail::Philox::kMulA, hi, lo);  // round 1: i · kMulA
    const ivec c2_1 = hi ^ splat(d.offset ^ keys.k1[0]);
    rr.c3_1 = lo;
    mulhilo(c2_1, detail::Philox::kMulB, hi, lo);  // round 2: word 2 (i's) · kMulB
    const ivec c0_2 = hi ^ splat(head.c1_1 ^ keys.k0[1]);
    rr.c1_2_key = lo ^ splat(keys.k0[2]);
    mulhilo(c0_2, detail::Philox::kMulA, rr.hi_a3, rr.lo_a3);  // round 3: word 0 (i's) · kMulA
    return rr;
  }
  // The counters (i, g, bh, offset) of the row vectors `rr` after round 3.
  template <int N>
  [[gnu::always_inline]] static void after_three_rounds(const HeadRounds& head, const RowRounds (&rr)[N],
                                                        std::uint32_t g, const RoundKeys& keys,
                                                        ivec (&c)[4][N]) {
    std::uint32_t hi_a2, lo_a2;
    mulhilo(head.c0_base ^ g, detail::Philox::kMulA, hi_a2, lo_a2);  // round 2: word 0 (g's)
    const ivec c2_2_g = splat(hi_a2 ^ keys.k1[1]), c2_3_g = splat(lo_a2 ^ keys.k1[2]);
#pragma GCC unroll 4
    for (int n = 0; n < N; ++n) {
      ivec hi_b, lo_b;
      mulhilo(rr[n].c3_1 ^ c2_2_g, detail::Philox::kMulB, hi_b, lo_b);  // round 3: word 2
      c[0][n] = hi_b ^ rr[n].c1_2_key;
      c[1][n] = lo_b;
      c[2][n] = rr[n].hi_a3 ^ c2_3_g;
      c[3][n] = rr[n].lo_a3;
    }
  }

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
    const RoundKeys keys(d.seed);
    const HeadRounds head = head_rounds(bh, keys);
    ivec lane;
    for (int i = 0; i < L; ++i) lane[i] = i;
    // N row vectors from row r0 on, their counters evaluated together.
    auto row_vectors = [&](std::int64_t r0, auto chains) {
      constexpr int N = decltype(chains)::value;
      RowRounds rr[N];
      for (int n = 0; n < N; ++n)
        rr[n] = row_rounds(d, head, splat(static_cast<std::uint32_t>(i0 + r0 + n * L)) + lane, keys);
      for (std::int64_t g = j0 / kKeys; g * kKeys < j0 + nj; ++g) {
        ivec c[4][N];
        after_three_rounds(head, rr, static_cast<std::uint32_t>(g), keys, c);
        rounds<3>(keys, c);
        for (int n = 0; n < N; ++n) {
#pragma GCC unroll 8
          for (int k = 0; k < kKeys; ++k) {
            const std::int64_t j = g * kKeys + k - j0;
            if (j < 0 || j >= nj) continue;
            const ivec draw = ((k & 1) ? c[k >> 1][n] >> 16 : c[k >> 1][n]) & low;
            f(j, r0 + n * L, reinterpret_cast<vec>(scale & (draw >= threshold)));
          }
        }
      }
    };
    // kChains vectors at a time, and the rest together (AVX2's 24-row tiles: 2 + 1, where
    // a second pair would evaluate a vector of rows past the tile).
    std::int64_t r0 = 0;
    for (; r0 + kChains * L <= rows_padded; r0 += kChains * L)
      row_vectors(r0, std::integral_constant<int, kChains>{});
    if (r0 < rows_padded)
      with_count<kChains - 1>(static_cast<int>((rows_padded - r0) / L),
                              [&](auto chains) { row_vectors(r0, chains); });
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
