// fattn — the decode kernel's scores on AVX512-BF16, for a bfloat16 cache read in place.
//
// Up to DecodeOps::kDirectRows rows the scores multiply each key row where it lies
// (cpu/decode/direct.hpp, DotBf16Products). Above that the float32 path transposes the key
// tile, widening every element on the way, and spends one FMA per row, key and dim. Here
// the transpose moves the cache's own bits, one pair of dims per 32-bit element:
//   kp [Dp/2][Bk]   kp[i][j] = k[j][2i] | k[j][2i + 1] << 16
// and one vdpbf16ps adds two dims of 16 keys for a row, on the query row's own bits:
//   acc[r][·] += (q[r][2i], q[r][2i + 1]) · kp[i][·]
//   st[r][·]   = factor · acc[r][·]                       (factor = scale·log2(e))
// so a 16×16 block of the transpose covers 32 dims instead of 16, nothing is widened, and
// the products take half the instructions. Products of two bfloat16 are exact in float32
// (vdpbf16ps flushes denormal inputs and results to zero) and the sums are float32, as in
// the direct scores.
#pragma once

#include "cpu/common/isa_target.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "cpu/common/blocks.hpp"
#include "cpu/decode/direct.hpp"
#include "cpu/decode/ops.hpp"
#include "cpu/common/elements.hpp"
#include "cpu/common/transpose.hpp"

#if defined(FATTN_AVX512_BF16)
#include <immintrin.h>
#endif

namespace fattn::cpu {

#if defined(FATTN_AVX512_BF16)

template <class S>
struct DecodeScoresBf16 {
  using Ops = DecodeOps<S>;
  using Rows = typename Ops::template Rows<BFloat16>;
  using Prefetch = typename Ops::Prefetch;
  static constexpr int Bk = Ops::Bk;
  static constexpr int KV = Ops::KV;
  static constexpr int SR = Ops::SR;  // rows per block, as the float32 scores
  static constexpr int kKeyGroup = Ops::kKeyGroup;
  static constexpr int kPairDims = 32;  // dims of one 16×16 block of 32-bit pairs

  // kp[i][j] for the tile's nj keys and Dp/2 pairs (pairs of keys past nj are zero). Whole
  // key groups go through registers 32 dims at a time (the last 16 of a head dim that is
  // an odd number of 16s as 8 pairs); `next` is asked for a few rows after each block.
  static void transpose_pairs(const Rows& k, std::int64_t nj, std::int64_t Dp, std::uint32_t* kp,
                              Prefetch& next) {
    for (int g = 0; g < Ops::kGroups; ++g) {
      const std::int64_t n = std::clamp<std::int64_t>(nj - g * kKeyGroup, 0, kKeyGroup);
      std::uint32_t* dst = kp + g * kKeyGroup;
      if (n < kKeyGroup) {
        partial_group(k, g, n, Dp, dst);
        next.issue(Prefetch::kRowsPerBlock);
        continue;
      }
      for (std::int64_t d = 0; d < Dp; d += kPairDims) {
        const bool half = d + kPairDims > Dp;
        __m512 r[kKeyGroup];
        for (int j = 0; j < kKeyGroup; ++j)
          r[j] = _mm512_castsi512_ps(load_bf16x32(k.group[g] + j * k.stride + d, half));
        transpose16x16(r);  // moves bits: a NaN pattern stays as it is
        const int pairs = half ? kKeyGroup / 2 : kKeyGroup;
        for (int i = 0; i < pairs; ++i)
          _mm512_storeu_si512(dst + (d / 2 + i) * Bk, _mm512_castps_si512(r[i]));
        next.issue(Prefetch::kRowsPerBlock);
      }
    }
  }
  // A group's first n keys one element at a time (the tile's last, partial group).
  static void partial_group(const Rows& k, int g, std::int64_t n, std::int64_t Dp, std::uint32_t* dst) {
    for (std::int64_t i = 0; i < Dp / 2; ++i)
      for (std::int64_t j = 0; j < kKeyGroup; ++j) {
        std::uint32_t pair = 0;
        if (j < n) std::memcpy(&pair, k.group[g] + j * k.stride + 2 * i, sizeof pair);
        std::memcpy(dst + i * Bk + j, &pair, sizeof pair);  // kt's memory holds floats too
      }
  }

  // st[r][·] = factor · Σ_i qb[r][2i, 2i + 1] · kp[i][·] for R rows; `next` is asked for a
  // line per pair of dims. A function of its own: inlined into the worker's key loop it
  // shares the registers with it (Sq = 16, 8k keys: 545-548 → 511-526 GFLOP/s).
  template <int R>
  [[gnu::noinline]] static void block(const std::uint16_t* qb, std::int64_t Dp,
                                      const std::uint32_t* kp, float factor, float* st,
                                      Prefetch& next) {
    __m512 acc[R][KV];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
      for (int u = 0; u < KV; ++u) acc[r][u] = _mm512_setzero_ps();
    for (std::int64_t i = 0; i < Dp / 2; ++i) {
      next.issue_line();
      __m512bh kv[KV];
#pragma GCC unroll 8
      for (int u = 0; u < KV; ++u) kv[u] = as_pairs(_mm512_loadu_si512(kp + i * Bk + u * 16));
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        std::uint32_t pair;
        std::memcpy(&pair, qb + r * Dp + 2 * i, sizeof pair);
        const __m512bh q = as_pairs(_mm512_set1_epi32(static_cast<int>(pair)));
#pragma GCC unroll 8
        for (int u = 0; u < KV; ++u) acc[r][u] = _mm512_dpbf16_ps(acc[r][u], q, kv[u]);
      }
    }
    const __m512 f = _mm512_set1_ps(factor);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
      for (int u = 0; u < KV; ++u) _mm512_storeu_ps(st + r * Bk + u * 16, _mm512_mul_ps(acc[r][u], f));
  }

  // Scores of one key tile against `rows` query rows (their bits qb, Dp per row): straight
  // from the key rows for a few rows, else through the pair tile in kt's memory (Dp/2
  // pairs per key, within kt's D·Bk floats). k's dims are contiguous (read in place).
  static void tile_scores(const std::uint16_t* qb, float factor, std::int64_t rows, std::int64_t D,
                          const Rows& k, std::int64_t nj, float* kt, float* st, Prefetch& next) {
    const std::int64_t Dp = Ops::padded_dim(D);
    if (rows <= Ops::kDirectRows) {
      DirectScores<Rows, DotBf16Products>::scores(qb, rows, Dp, k, nj, Bk, factor, st, next);
    } else {
      auto* kp = reinterpret_cast<std::uint32_t*>(kt);
      transpose_pairs(k, nj, Dp, kp, next);
      for_blocks<SR>(rows, [&](std::int64_t r, auto R) {
        block<decltype(R)::value>(qb + r * Dp, Dp, kp, factor, st + r * Bk, next);
      });
    }
    next.issue_rest();
  }
};

#endif

}  // namespace fattn::cpu
