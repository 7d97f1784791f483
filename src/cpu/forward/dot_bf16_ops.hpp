// fattn — the tile operations of the fused kernel on bfloat16 dot products (AVX512-BF16).
//
// vdpbf16ps multiplies 16 lane pairs of bfloat16 and adds both products to a float32 lane:
// twice the products of vfmadd231ps per instruction, and exact (8-bit significands). The
// operands are therefore laid out in pairs along the sum's index:
//   qp  [D/2][Br]       query pairs (q[i][2d], q[i][2d+1]), the inputs' own bits, unscaled
//   kp  [D/2][key_rows] per panel: key pairs (k[j][2d], k[j][2d+1]), one 32-bit broadcast
//   st  [Bc][Br]        float32 scores ← scale·log2(e) · Σ (the softmax is TileOps')
//   pp  [Bc/2][Br]      probability pairs (p[2j][i], p[2j+1][i]), rounded to bfloat16
//   vp  [Sk/2][D]       value pairs (v[2j][d], v[2j+1][d]), per kv head
//   ot  [D][Br]         float32 output accumulator, as TileOps'
// so scores and P·V have TileOps' register blocks (key_rows × query_vecs and
// dim_rows × query_vecs accumulators) over half as many steps. P is rounded to bfloat16
// for P·V, as FlashAttention does on GPUs; the running sum l stays float32.
#pragma once

#include "cpu/common/isa_target.hpp"

#if defined(FATTN_AVX512_BF16)
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "model/problem.hpp"
#include "cpu/common/blocks.hpp"
#include "cpu/common/elements.hpp"
#include "cpu/common/tile_ops.hpp"
#include "cpu/common/transpose.hpp"

namespace fattn::cpu {

// st[r·stride + 16c + ·] = factor · Σ_{d<D2} a(d, r) · b(d, c) for an R × C block on
// vdpbf16ps: a(d, r) a pair of bfloat16 (one 32-bit word) broadcast to every lane, b(d, c)
// 16 pairs; each_dim() runs once per pair of dims. The scores block of the fused kernel
// (keys × query lanes) and of the decode kernel (query rows × keys).
template <int R, int C, class A, class B, class EachDim>
[[gnu::always_inline]] inline void pair_scores(std::int64_t D2, A a, B b, EachDim each_dim,
                                               float factor, float* st, std::int64_t stride) {
  __m512 acc[R][C] = {};
  for (std::int64_t d = 0; d < D2; ++d) {
    each_dim();
    __m512bh bv[C];
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) bv[c] = b(d, c);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const __m512bh ar = as_pairs(_mm512_set1_epi32(static_cast<int>(a(d, r))));
#pragma GCC unroll 8
      for (int c = 0; c < C; ++c) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], ar, bv[c]);
    }
  }
  const __m512 f = _mm512_set1_ps(factor);
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) _mm512_storeu_ps(st + r * stride + c * 16, _mm512_mul_ps(acc[r][c], f));
}

template <class S>
struct DotBf16Ops {
  using Ops = TileOps<S>;
  static constexpr int L = S::lanes;
  static_assert(L == 16, "vdpbf16ps works on 512-bit vectors here");
  static constexpr int NV = Ops::NV, Br = Ops::Br, Bc = Ops::Bc, MK = Ops::MK, MD = Ops::MD;
  static_assert(Bc % 2 == 0, "a key tile is a whole number of key pairs");
  using Pair = std::uint32_t;  // two bfloat16, the lower index in the low half

  // A bfloat16 whose exponent bits are all ones is infinite or NaN.
  static constexpr std::uint16_t kExponent = 0x7f80;

  static std::int64_t pairs_of(std::int64_t n) { return (n + 1) / 2; }
  static Pair pair(std::uint16_t lo, std::uint16_t hi) {
    return static_cast<Pair>(lo) | static_cast<Pair>(hi) << 16;
  }

  // Pair d of a row: where the dims are contiguous it is the row's 32-bit word d (the
  // even element in the low half, little-endian); a last odd dim pairs with 0.
  static Pair pair_at(const detail::Strided<const BFloat16>& t, const BFloat16* row, std::int64_t d,
                      std::int64_t D) {
    if (t.dim == 1 && 2 * d + 1 < D) {
      Pair word;
      std::memcpy(&word, row + 2 * d, sizeof word);
      return word;
    }
    return pair(row[2 * d * t.dim].bits, 2 * d + 1 < D ? row[(2 * d + 1) * t.dim].bits : 0);
  }

  // qp[d][i] = (q[i0+i][2d], q[i0+i][2d+1]); rows past the sequence and a last odd dim 0.
  // With contiguous dims, 16 rows × 16 pairs at a time through the 16×16 transpose (of
  // 32-bit lanes: the pairs move whole).
  static void load_q_pairs(const detail::Problem& p, std::int64_t b, std::int64_t h,
                           std::int64_t i0, std::int64_t rows, Pair* qp) {
    const auto q = detail::retype<const BFloat16>(p.q);
    const std::int64_t D = p.head_dim, D2 = pairs_of(D);
    std::int64_t rows_done = 0, pairs_done = 0;  // the block-transposed corner
    if (q.dim == 1 && D % 2 == 0) {
      rows_done = rows / L * L;
      pairs_done = D2 / L * L;
      for (std::int64_t i = 0; i < rows_done; i += L)
        for (std::int64_t d = 0; d < pairs_done; d += L) {
          __m512 block[L];
          for (int r = 0; r < L; ++r)
            block[r] = _mm512_loadu_ps(reinterpret_cast<const float*>(q.row(b, h, i0 + i + r) + 2 * d));
          transpose16x16(block);
          for (int r = 0; r < L; ++r) _mm512_store_ps(reinterpret_cast<float*>(qp + (d + r) * Br + i), block[r]);
        }
    }
    for (std::int64_t d = 0; d < D2; ++d)
      for (std::int64_t i = d < pairs_done ? rows_done : 0; i < Br; ++i)
        qp[d * Br + i] = i < rows ? pair_at(q, q.row(b, h, i0 + i), d, D) : 0;
  }

  // Keys [0, n) of head (b, h) in panels of MK keys: kp[g][d][r] = (k[j][2d], k[j][2d+1]),
  // j = g·MK + r; the last panel's missing keys are 0.
  static void pack_k_pairs(const detail::Problem& p, std::int64_t b, std::int64_t h,
                           std::int64_t n, Pair* kp) {
    const auto k = detail::retype<const BFloat16>(p.k);
    const std::int64_t D = p.head_dim, D2 = pairs_of(D);
    const bool words = k.dim == 1 && D % 2 == 0;  // each row's pairs are its 32-bit words
    for (std::int64_t g = 0; g * MK < n; ++g, kp += D2 * MK)
      for (int r = 0; r < MK; ++r) {
        const std::int64_t j = g * MK + r;
        const BFloat16* row = j < n ? k.row(b, h, j) : nullptr;
        if (row && words) {
          for (std::int64_t d = 0; d < D2; ++d) std::memcpy(kp + d * MK + r, row + 2 * d, sizeof(Pair));
          continue;
        }
        for (std::int64_t d = 0; d < D2; ++d) kp[d * MK + r] = row ? pair_at(k, row, d, D) : 0;
      }
  }

  // out[d] = (even[d], odd[d]) for d < n, n a multiple of L, dims contiguous (odd null: a
  // last odd key, partner 0). Returns whether every value is finite. vpermt2w interleaves
  // 16 dims of both rows at a time.
  static bool interleave_rows(const BFloat16* even, const BFloat16* odd, std::int64_t n, Pair* out) {
    alignas(64) static constexpr std::uint16_t kInterleave[32] = {
        0, 32, 1, 33, 2, 34, 3, 35, 4, 36, 5, 37, 6, 38, 7, 39,
        8, 40, 9, 41, 10, 42, 11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
    const __m512i interleave = _mm512_load_si512(kInterleave), exponent = _mm512_set1_epi16(kExponent);
    __mmask32 not_finite = 0;
    for (std::int64_t d = 0; d < n; d += L) {
      const __m512i lo = _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(even + d)));
      const __m512i hi = odd ? _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(odd + d)))
                             : _mm512_setzero_si512();
      const __m512i pairs = _mm512_permutex2var_epi16(lo, interleave, hi);
      not_finite |= _mm512_cmpeq_epi16_mask(_mm512_and_si512(pairs, exponent), exponent);
      _mm512_storeu_si512(out + d, pairs);
    }
    return not_finite == 0;
  }

  // vp[j][d] = (v[2j][d], v[2j+1][d]) for keys [0, n) of head (b, h); a last odd key's
  // partner is 0. Returns whether every value is finite: a hidden pair's product p = 0
  // times an infinite value would be NaN, where the float32 kernels skip hidden pairs.
  static bool pack_v_pairs(const detail::Problem& p, std::int64_t b, std::int64_t h,
                           std::int64_t n, Pair* vp) {
    const auto v = detail::retype<const BFloat16>(p.v);
    const std::int64_t D = p.head_dim;
    const std::int64_t dims_done = v.dim == 1 ? D / L * L : 0;
    bool finite = true;
    for (std::int64_t j = 0; j < pairs_of(n); ++j) {
      const BFloat16* even = v.row(b, h, 2 * j);
      const BFloat16* odd = 2 * j + 1 < n ? v.row(b, h, 2 * j + 1) : nullptr;
      finite &= interleave_rows(even, odd, dims_done, vp + j * D);
      for (std::int64_t d = dims_done; d < D; ++d) {
        const std::uint16_t x = even[d * v.dim].bits, y = odd ? odd[d * v.dim].bits : 0;
        finite &= (x & kExponent) != kExponent && (y & kExponent) != kExponent;
        vp[j * D + d] = pair(x, y);
      }
    }
    return finite;
  }

  // Where the MK key pairs of a scores_block lie, its key policy: a packed panel
  // kp[d][MK] (pack_k_pairs) ...
  struct KeyPanel {
    const Pair* kp;
    Pair at(std::int64_t d, int r) const { return kp[d * MK + r]; }
  };
  // ... or MK rows of bfloat16 where they lie, dims contiguous and even in number: pair d
  // is the row's 32-bit word d (the decode kernel's cache).
  struct KeyRows {
    const BFloat16* row[MK];
    Pair at(std::int64_t d, int r) const {
      Pair word;
      std::memcpy(&word, row[r] + 2 * d, sizeof word);
      return word;
    }
  };

  // st[r][·] = factor · Σ_d k(d, r) · qp[d][·] for MK keys (a KeyPanel or KeyRows); each_dim()
  // runs once per pair of dims (the decode kernel asks for a line of its next tile there).
  template <class Keys, class EachDim = typename Ops::Nothing>
  static void scores_block(const Keys& k, const Pair* qp, std::int64_t D2, float factor, float* st,
                           EachDim each_dim = {}) {
    pair_scores<MK, NV>(
        D2, [&](std::int64_t d, int r) { return k.at(d, r); },
        [&](std::int64_t d, int v) { return as_pairs(_mm512_load_si512(qp + d * Br + v * L)); },
        each_dim, factor, st, Br);
  }

  // Scores of keys [j0, j0 + nj) against the query tile: nj rows of st (whole panels).
  static void scores_tile(const Pair* kpanels, std::int64_t j0, std::int64_t nj, const Pair* qp,
                          std::int64_t D, float factor, float* st) {
    const std::int64_t D2 = pairs_of(D);
    for (std::int64_t g = j0 / MK; g * MK < j0 + nj; ++g)
      scores_block(KeyPanel{kpanels + g * D2 * MK}, qp, D2, factor, st + (g * MK - j0) * Br);
  }

  // pp[j][·] = (p[2j][·], p[2j+1][·]) rounded to bfloat16 (nearest even) for nj keys;
  // a last odd key's partner is 0. vcvtne2ps2bf16 puts the 16 even keys' values in the
  // low half and the odd keys' in the high half; vpermw interleaves them.
  static void round_p_pairs(const float* st, std::int64_t nj, Pair* pp) {
    alignas(64) static constexpr std::uint16_t kInterleave[32] = {
        0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23,
        8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
    const __m512i interleave = _mm512_load_si512(kInterleave);
    for (std::int64_t j = 0; j < pairs_of(nj); ++j)
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) {
        const __m512 even = _mm512_load_ps(st + 2 * j * Br + v * L);
        const __m512 odd = 2 * j + 1 < nj ? _mm512_load_ps(st + (2 * j + 1) * Br + v * L)
                                          : _mm512_setzero_ps();
        const __m512bh halves = _mm512_cvtne2ps_pbh(odd, even);
        _mm512_store_si512(pp + j * Br + v * L,
                           _mm512_permutexvar_epi16(interleave, reinterpret_cast<const __m512i&>(halves)));
      }
  }

  // ot[d0+r][·] = alpha·ot[d0+r][·] + Σ_j vp[j][d0+r] · pp[j][·] for R dims, over the
  // key pairs [0, n2).
  template <int R>
  static void pv_block(const Pair* vp, std::int64_t D, std::int64_t n2, const Pair* pp,
                       const float* alpha, float* ot) {
    __m512 acc[R][NV] = {};
    for (std::int64_t j = 0; j < n2; ++j) {
      __m512bh pv[NV];
#pragma GCC unroll 8
      for (int u = 0; u < NV; ++u) pv[u] = as_pairs(_mm512_load_si512(pp + j * Br + u * L));
      const Pair* vrow = vp + j * D;
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) {
        const __m512bh vb = as_pairs(_mm512_set1_epi32(static_cast<int>(vrow[r])));
#pragma GCC unroll 8
        for (int u = 0; u < NV; ++u) acc[r][u] = _mm512_dpbf16_ps(acc[r][u], vb, pv[u]);
      }
    }
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
      for (int u = 0; u < NV; ++u) {
        float* o = ot + r * Br + u * L;
        _mm512_store_ps(o, _mm512_fmadd_ps(_mm512_load_ps(o), _mm512_load_ps(alpha + u * L), acc[r][u]));
      }
  }

  // ot ← alpha·ot + Vᵀ·P over nj keys; vp points at the tile's first key pair.
  static void pv_accumulate(const Pair* vp, std::int64_t nj, const Pair* pp, const float* alpha,
                            std::int64_t D, float* ot) {
    const std::int64_t n2 = pairs_of(nj);
    for_blocks<MD>(D, [&](std::int64_t d, auto R) {
      pv_block<decltype(R)::value>(vp + d, D, n2, pp, alpha, ot + d * Br);
    });
  }
};

}  // namespace fattn::cpu
#endif
