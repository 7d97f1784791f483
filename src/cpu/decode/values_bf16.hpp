// fattn — the decode kernel's P·V on AVX512-BF16, for a bfloat16 cache read in place.
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

#include "cpu/decode/ops.hpp"

#if defined(FATTN_AVX512_BF16)
#include <immintrin.h>
#endif

namespace fattn::cpu {

#if defined(FATTN_AVX512_BF16)

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
