// fattn — the decode kernel on AVX512-BF16, for a bfloat16 cache read in place: its
// scores (DecodeScoresBf16) and its P·V (DecodeValuesBf16), one vdpbf16ps to two dims
// or two keys where the float32 path widens every element first.
//
// Scores.
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
//
// P·V.
//
// The float32 P·V (DecodeOps::pv_block) widens every value it loads (two instructions per
// 16 elements) and spends one FMA per key, row and 16 dims. Here two keys go into one
// vdpbf16ps: the probabilities are rounded to bfloat16 in pairs (p_j, p_j+1), as the
// prefill's DotBf16Mainloop and FlashAttention on GPUs do, and the value rows j and j+1
// are interleaved in registers (vpunpck{l,h}wd) instead of widened:
//   lo[c], hi[c] ← v[j][d..d+31] ⋈ v[j+1][d..d+31]        (the pairs, 16 dims each)
//   acc[r][·]   += (p[r][j], p[r][j+1]) · (lo, hi)        (R rows, one broadcast each)
// so a value element costs half an instruction per row instead of one plus its widening.
// The interleave leaves the dims of the accumulators in the unpack order (within each
// 128-bit lane, dims 0-3 in lo and 4-7 in hi); one permute per 16 dims puts them back when
// the block adds to os. An odd last key is added in float32 after that.
// The sums (l) keep the unrounded probabilities. Tiles where some row does not see every
// key, and AVX-512 builds without BF16, take DecodeOps::pv_accumulate.
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
#include "cpu/forward/dot_bf16_ops.hpp"

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
    pair_scores<R, KV>(
        Dp / 2,
        [&](std::int64_t i, int r) {
          std::uint32_t pair;
          std::memcpy(&pair, qb + r * Dp + 2 * i, sizeof pair);
          return pair;
        },
        [&](std::int64_t i, int u) { return as_pairs(_mm512_loadu_si512(kp + i * Bk + u * 16)); },
        [&] { next.issue_line(); }, factor, st, Bk);
  }

  // Whether tile_scores takes the key rows where they lie for `rows` rows (forward_plan
  // reports it): up to DecodeOps::kDirectRows, as the float32 scores.
  static constexpr bool direct_scores(std::int64_t rows) { return rows <= Ops::kDirectRows; }

  // Scores of one key tile against `rows` query rows (their bits qb, Dp per row): straight
  // from the key rows for a few rows, else through the pair tile in kt's memory (Dp/2
  // pairs per key, within kt's D·Bk floats). k's dims are contiguous (read in place).
  static void tile_scores(const std::uint16_t* qb, float factor, std::int64_t rows, std::int64_t D,
                          const Rows& k, std::int64_t nj, float* kt, float* st, Prefetch& next) {
    const std::int64_t Dp = Ops::padded_dim(D);
    if (direct_scores(rows)) {
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

template <class S>
struct DecodeValuesBf16 {
  using Ops = DecodeOps<S>;
  using Rows = typename Ops::template Rows<BFloat16>;
  static constexpr int Bk = Ops::Bk;
  static constexpr int MR = Ops::MR;           // rows per block, as the float32 P·V
  static constexpr int kPairDims = 32;         // dims of one interleaved pair of loads
  static constexpr int kChunks = Ops::DV / 2;  // 32-dim chunks per block: 2·kChunks
                                               // accumulators per row, as float32's DV
  static constexpr int kPairsPerRow = Bk / 2;

  // pairs[r][j/2] = bfloat16(p[r][j]) | bfloat16(p[r][j+1]) << 16 for keys [0, n), n even
  // (vcvtneps2bf16: round to nearest even). p rows hold Bk floats, so whole vectors load.
  static void pack_pairs(const float* p, int rows, std::int64_t n, std::uint32_t* pairs) {
    for (int r = 0; r < rows; ++r)
      for (std::int64_t j = 0; j < n; j += 16) {
        const __m256bh b = _mm512_cvtneps_pbh(_mm512_loadu_ps(p + r * Bk + j));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(pairs + r * kPairsPerRow + j / 2),
                            reinterpret_cast<const __m256i&>(b));
      }
  }

  // Accumulator lanes → dims: lo holds dims 8L + 0..3 of each 128-bit lane L, hi 8L + 4..7.
  static __m512 dims_0_15(__m512 lo, __m512 hi) {
    const __m512i order = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
    return _mm512_permutex2var_ps(lo, order, hi);
  }
  static __m512 dims_16_31(__m512 lo, __m512 hi) {
    const __m512i order = _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
    return _mm512_permutex2var_ps(lo, order, hi);
  }

  // os[r][d0 + ·] = alpha·os + Σ_j p[r][j]·v[j][d0 + ·] for R rows, 32·C dims, every
  // key of [0, nj) (p in pairs for the even part, p itself for an odd last key).
  template <int R, int C>
  static void block(const std::uint32_t* pairs, const float* p, std::int64_t nj, const Rows& v,
                    std::int64_t d0, const float* alpha, std::int64_t Dp, float* os) {
    __m512 acc[R][2 * C] = {};
    const std::int64_t even = nj / 2 * 2;
    for (std::int64_t j0 = 0; j0 < even; j0 += Ops::kKeyGroup) {  // pairs never cross a group
      const BFloat16* vrow = v.group[j0 / Ops::kKeyGroup] + d0;
      const std::int64_t j1 = std::min<std::int64_t>(even, j0 + Ops::kKeyGroup);
      for (std::int64_t j = j0; j < j1; j += 2, vrow += 2 * v.stride) {
        __m512bh lo[C], hi[C];
#pragma GCC unroll 4
        for (int c = 0; c < C; ++c) {
          const __m512i a = _mm512_loadu_si512(vrow + c * kPairDims);
          const __m512i b = _mm512_loadu_si512(vrow + v.stride + c * kPairDims);
          const __m512i l = _mm512_unpacklo_epi16(a, b), h = _mm512_unpackhi_epi16(a, b);
          lo[c] = as_pairs(l);
          hi[c] = as_pairs(h);
        }
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
          const __m512bh pb = as_pairs(_mm512_set1_epi32(static_cast<int>(pairs[r * kPairsPerRow + j / 2])));
#pragma GCC unroll 4
          for (int c = 0; c < C; ++c) {
            acc[r][2 * c] = _mm512_dpbf16_ps(acc[r][2 * c], lo[c], pb);
            acc[r][2 * c + 1] = _mm512_dpbf16_ps(acc[r][2 * c + 1], hi[c], pb);
          }
        }
      }
    }
    const BFloat16* last = even < nj ? v.row(even) + d0 : nullptr;  // an odd last key
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
      for (int c = 0; c < C; ++c) {
        float* o = os + r * Dp + d0 + c * kPairDims;
        __m512 first = dims_0_15(acc[r][2 * c], acc[r][2 * c + 1]);
        __m512 second = dims_16_31(acc[r][2 * c], acc[r][2 * c + 1]);
        if (last) {
          const __m512 pj = _mm512_set1_ps(p[r * Bk + even]);
          first = _mm512_fmadd_ps(pj, load_vec<S>(last + c * kPairDims), first);
          second = _mm512_fmadd_ps(pj, load_vec<S>(last + c * kPairDims + 16), second);
        }
        const __m512 a = _mm512_set1_ps(alpha[r]);
        _mm512_storeu_ps(o, _mm512_fmadd_ps(_mm512_loadu_ps(o), a, first));
        _mm512_storeu_ps(o + 16, _mm512_fmadd_ps(_mm512_loadu_ps(o + 16), a, second));
      }
  }

  // R rows over every dim: blocks of 32·kChunks dims, then of 32; the last 16 of a head
  // dim that is an odd number of 16s go through the float32 block.
  template <int R>
  static void rows_block(const std::uint32_t* pairs, const float* p, const std::int32_t* visible,
                         std::int64_t nj, const Rows& v, const float* alpha, std::int64_t Dp,
                         float* os) {
    constexpr std::int64_t kBlockDims = kChunks * kPairDims;
    std::int64_t d = 0;
    for (; d + kBlockDims <= Dp; d += kBlockDims) block<R, kChunks>(pairs, p, nj, v, d, alpha, Dp, os);
    for (; d + kPairDims <= Dp; d += kPairDims) block<R, 1>(pairs, p, nj, v, d, alpha, Dp, os);
    for (; d < Dp; d += S::lanes)
      Ops::template pv_block<R, 1, false>(p, visible, nj, v, d, alpha, Dp, os);
  }
  // os ← alpha·os + P·V as DecodeOps::pv_accumulate, on vdpbf16ps for the row blocks
  // whose rows see every key of the tile (the others in float32, hidden keys skipped).
  static void accumulate(const float* p, std::int64_t rows, const std::int32_t* visible,
                         std::int64_t nj, const Rows& v, const float* alpha, std::int64_t D,
                         float* os) {
    const std::int64_t Dp = Ops::padded_dim(D);
    alignas(64) std::uint32_t pairs[MR * kPairsPerRow];
    Ops::pv_row_blocks(rows, visible, nj, [&](std::int64_t r, auto R, bool masked) {
      constexpr int n = decltype(R)::value;
      if (masked)
        return Ops::template pv_rows<n, true>(p + r * Bk, visible + r, nj, v, alpha + r, Dp, os + r * Dp);
      pack_pairs(p + r * Bk, n, nj / 2 * 2, pairs);
      rows_block<n>(pairs, p + r * Bk, visible + r, nj, v, alpha + r, Dp, os + r * Dp);
    });
  }
};

#endif

}  // namespace fattn::cpu
