// fattn — the decode kernel's scores for a few query rows, straight from the key rows.
//
// With few rows (up to 8: DecodeOps::kDirectRows) a key tile's
// transpose (cpu/decode/ops.hpp, transpose_keys: 64 shuffles per 16×16 block) costs more
// than the products it feeds (R FMAs per 16 elements). Here each key row is multiplied
// where it lies, dims along the lanes:
//   acc[r][k] += qs[r][d..d+15] · k[j + k][d..d+15]     R rows × 16/R keys, over d
//   st[r][j + k] = Σ lanes acc[r][k]                    16 sums at once (sum_lanes.hpp)
// With AVX512-BF16 and a bfloat16 cache the products are vdpbf16ps on the query rows' own
// bits (DotBf16Products), 32 dims per instruction.
// (decode, Sq = 1, GQA 4:1, D = 128: compute alone 37.7 → 48.9 GB/s per core, keys in L2;
// in DRAM 30.6-33.0 → 38.1-42.2 GB/s with its prefetch, docs/perf-log.md "Decode kernel").
// AVX-512 here; AVX2 has its own (cpu/decode/direct_avx2.hpp, up to 8 rows in blocks of 4); portable transposes.
#pragma once

#include "cpu/common/isa_target.hpp"

#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

#include "cpu/common/elements.hpp"
#include "cpu/common/simd.hpp"
#include "cpu/decode/sum_lanes.hpp"

#if defined(FATTN_AVX512)
#include <immintrin.h>
#endif

namespace fattn::cpu {

#if defined(FATTN_AVX512)

// The products of the direct scores, one policy per kind of key row:
//   FmaProducts: float32 query rows (pre-scaled by scale·log2(e)) against key rows of
//     float32, 16-bit or q8_0 elements widened as they are loaded, 16 dims per FMA;
//   DotBf16Products (AVX512-BF16): the query rows' own bfloat16 bits (unscaled) against
//     bfloat16 key rows, 32 dims per vdpbf16ps: products of two bfloat16 are exact in
//     float32 and are added to float32 accumulators, so K is never widened and half the
//     instructions remain; scale·log2(e) goes on the sums after.
template <class Element>
struct FmaProducts {
  using Query = float;
  using Operand = __m512;
  static constexpr int kDims = 16;  // per instruction
  static Operand load(const float* at, bool) { return _mm512_loadu_ps(at); }
  // dims [d, d + 16) of a key row (q8_0: its block's lanes widened)
  static Operand load_key(const Element* row, std::int64_t d, bool) {
    return load_row_vec<Simd<64>>(row, d);
  }
  static __m512 add_products(__m512 acc, Operand q, Operand k) { return _mm512_fmadd_ps(q, k, acc); }
};

// FmaProducts for bfloat16 key rows without widening shuffles: 32 dims a step, loaded as
// 16 pairs of bits; a pair's even dim is the 32-bit lane shifted left by 16, its odd dim
// the lane with the low half cleared: both exact float32, by a shift and an AND (integer
// ops that run beside the FMAs) where the widening of FmaProducts (vpmovzxwd, then a
// shift) costs a shuffle per 16 dims: on Intel cores port 5, one of the two 512-bit FMA
// ports. The query rows come arranged to match (split_pairs): each 32 dims as their 16
// even dims then their 16 odd ones (the last 16 of a head dim that is an odd number of
// 16s as 8 and 8).
struct SplitBf16Products {
  using Query = float;
  struct Operand {
    __m512 even, odd;
  };
  static constexpr int kDims = 32;
  static Operand load(const float* q, bool half) {
    if (!half) return {_mm512_loadu_ps(q), _mm512_loadu_ps(q + 16)};
    // even: 8 dims and the 8 odd ones after them, which meet zero keys (the key's half
    // load below leaves lanes 8-15 zero); odd: 8 dims
    return {_mm512_loadu_ps(q), _mm512_maskz_loadu_ps(0x00ff, q + 8)};
  }
  static Operand load(const BFloat16* k, bool half) {
    const __m512i pairs =
        half ? _mm512_zextsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(k)))
             : _mm512_loadu_si512(k);
    return {_mm512_castsi512_ps(_mm512_slli_epi32(pairs, 16)),
            _mm512_castsi512_ps(_mm512_and_si512(pairs, _mm512_set1_epi32(-65536)))};
  }
  static Operand load_key(const BFloat16* row, std::int64_t d, bool half) { return load(row + d, half); }
  static __m512 add_products(__m512 acc, Operand q, Operand k) {
    return _mm512_fmadd_ps(q.odd, k.odd, _mm512_fmadd_ps(q.even, k.even, acc));
  }
  // out: the rows qs (Dp floats each, Dp a multiple of 16) arranged as load takes them.
  static void split_pairs(const float* qs, std::int64_t rows, std::int64_t Dp, float* out) {
    const __m512i even = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
    const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
    for (std::int64_t r = 0; r < rows; ++r) {
      const float* q = qs + r * Dp;
      float* o = out + r * Dp;
      std::int64_t d = 0;
      for (; d + 32 <= Dp; d += 32) {
        const __m512 a = _mm512_loadu_ps(q + d), b = _mm512_loadu_ps(q + d + 16);
        _mm512_storeu_ps(o + d, _mm512_permutex2var_ps(a, even, b));
        _mm512_storeu_ps(o + d + 16, _mm512_permutex2var_ps(a, odd, b));
      }
      if (d < Dp) {  // 16 left: 8 even, then 8 odd
        const __m512 a = _mm512_loadu_ps(q + d);
        const __m512i last = _mm512_set_epi32(15, 13, 11, 9, 7, 5, 3, 1, 14, 12, 10, 8, 6, 4, 2, 0);
        _mm512_storeu_ps(o + d, _mm512_permutexvar_ps(last, a));
      }
    }
  }
};

// FmaProducts for q8_0 key rows a whole block (32 dims) a step: the block's float16 scale
// widened once where FmaProducts widened it for each 16 of its values; each half's 16
// int8 widened and scaled by q8_0_lanes, the same floats as load_row_vec. A q8_0 row's dims are a whole number of blocks: never half.
struct Q8_0Products {
  using Query = float;
  struct Operand {
    __m512 lo, hi;
  };
  static constexpr int kDims = static_cast<int>(kQ8_0BlockValues);
  static Operand load(const float* q, bool) { return {_mm512_loadu_ps(q), _mm512_loadu_ps(q + 16)}; }
  static Operand load_key(const Q8_0* row, std::int64_t d, bool) {
    const Q8_0BlockLanes<Simd<64>> block(row, d / kQ8_0BlockValues);
    return {block.lanes(0), block.lanes(16)};
  }
  static __m512 add_products(__m512 acc, Operand q, Operand k) {
    return _mm512_fmadd_ps(q.hi, k.hi, _mm512_fmadd_ps(q.lo, k.lo, acc));
  }
};

#if defined(FATTN_AVX512_BF16)
struct DotBf16Products {
  using Query = std::uint16_t;  // bfloat16 bits
  using Operand = __m512bh;
  static constexpr int kDims = 32;
  static Operand load(const void* at, bool half) { return as_pairs(load_bf16x32(at, half)); }
  static Operand load_key(const BFloat16* row, std::int64_t d, bool half) { return load(row + d, half); }
  static __m512 add_products(__m512 acc, Operand q, Operand k) { return _mm512_dpbf16_ps(acc, q, k); }
};
#endif

// Rows: the decode kernel's key rows (row(j): Dp contiguous elements, zero-padded past D).
// q: the query rows (Dp elements each) in the form Products takes; each score is
// multiplied by `factor` (1 where the rows are pre-scaled).
template <class Rows, class Products>
struct DirectScores {
  using Query = typename Products::Query;
  static constexpr int kStep = Products::kDims;
  static constexpr int kSums = 16;  // dot products per sum_lanes
  // Keys in the outer loop of a step when an operand takes two registers
  // (SplitBf16Products): the 16 sums, the rows' operands and one key's fit the 32 vector
  // registers, where holding a block's 16/R keys first spilled the sums at R = 1 and 2.
  // One register an operand: the keys first, as they always ran.
  static constexpr bool kKeysOuter = sizeof(typename Products::Operand) > sizeof(__m512);

  // st[r][j + k] for R rows and 16/R keys starting at j. Inlined into the loop over the
  // blocks: GCC 12 made it a function of its own, called for every 16 dot products, whose
  // sums went through the stack on their way to sum_lanes; inlined, the scores of a tile
  // (GQA 4, D 128, keys in L2) take 38 cycles a key where they took 57, for 32 cycles of
  // FMAs (dev-zen4, docs/perf-log.md 2026-12-08).
  template <int R>
  [[gnu::always_inline]] static void block(const Query* q, std::int64_t Dp, const Rows& k,
                                           std::int64_t j, std::int64_t st_stride, float factor,
                                           float* st) {
    constexpr int KB = kSums / R;
    decltype(k.row(0)) krow[KB];
    for (int kk = 0; kk < KB; ++kk) krow[kk] = k.row(j + kk);
    __m512 acc[kSums];
    // The first step starts the sums from zero in registers (zeroing the array first
    // became a `rep stos` to the stack).
    auto step = [&](std::int64_t d, auto first) {
      const bool half = d + kStep > Dp;
      auto add = [&](__m512& a, const auto& qv, const auto& kv) {
        a = Products::add_products(decltype(first)::value ? _mm512_setzero_ps() : a, qv, kv);
      };
      if constexpr (kKeysOuter) {
        typename Products::Operand qv[R];
#pragma GCC unroll 4
        for (int r = 0; r < R; ++r) qv[r] = Products::load(q + r * Dp + d, half);
#pragma GCC unroll 16
        for (int kk = 0; kk < KB; ++kk) {
          const auto kv = Products::load_key(krow[kk], d, half);
#pragma GCC unroll 4
          for (int r = 0; r < R; ++r) add(acc[r * KB + kk], qv[r], kv);
        }
      } else {
        typename Products::Operand kv[KB];
#pragma GCC unroll 16
        for (int kk = 0; kk < KB; ++kk) kv[kk] = Products::load_key(krow[kk], d, half);
#pragma GCC unroll 4
        for (int r = 0; r < R; ++r) {
          const auto qv = Products::load(q + r * Dp + d, half);
#pragma GCC unroll 16
          for (int kk = 0; kk < KB; ++kk) add(acc[r * KB + kk], qv, kv[kk]);
        }
      }
    };
    step(0, std::true_type{});
    for (std::int64_t d = kStep; d < Dp; d += kStep) step(d, std::false_type{});
    alignas(64) float sums[kSums];
    _mm512_store_ps(sums, _mm512_mul_ps(sum_lanes<16>(acc), _mm512_set1_ps(factor)));
    for (int r = 0; r < R; ++r) std::memcpy(st + r * st_stride + j, sums + r * KB, KB * sizeof(float));
  }

  // st[r][j] for keys [j0, nj) one at a time (the tile's last keys).
  static void keys(const Query* q, std::int64_t rows, std::int64_t Dp, const Rows& k,
                   std::int64_t j0, std::int64_t nj, std::int64_t st_stride, float factor, float* st) {
    for (std::int64_t j = j0; j < nj; ++j)
      for (std::int64_t r = 0; r < rows; ++r) {
        __m512 acc = _mm512_setzero_ps();
        for (std::int64_t d = 0; d < Dp; d += kStep) {
          const bool half = d + kStep > Dp;
          acc = Products::add_products(acc, Products::load(q + r * Dp + d, half),
                                       Products::load_key(k.row(j), d, half));
        }
        st[r * st_stride + j] = _mm512_reduce_add_ps(acc) * factor;
      }
  }

  // R rows against keys [0, nj), after each block of keys asking `next` for a few rows.
  template <int R, class Prefetch>
  static void rows_block(const Query* q, std::int64_t Dp, const Rows& k, std::int64_t nj,
                         std::int64_t st_stride, float factor, float* st, Prefetch& next) {
    constexpr int KB = kSums / R;
    std::int64_t j = 0;
    for (; j + KB <= nj; j += KB) {
      block<R>(q, Dp, k, j, st_stride, factor, st);
      next.issue_after_direct_block();
    }
    keys(q, R, Dp, k, j, nj, st_stride, factor, st);
  }

  // st[r][j] = factor · q[r]·k[j] for rows ≤ 4·n (in blocks of 4, then 2, then 1 rows); the
  // rows of `next` spread over the blocks.
  template <class Prefetch>
  static void scores(const Query* q, std::int64_t rows, std::int64_t Dp, const Rows& k,
                     std::int64_t nj, std::int64_t st_stride, float factor, float* st,
                     Prefetch& next) {
    next.spread(direct_score_blocks(rows, nj, kSums));
    std::int64_t r = 0;
    for (; r + 4 <= rows; r += 4)
      rows_block<4>(q + r * Dp, Dp, k, nj, st_stride, factor, st + r * st_stride, next);
    if (r + 2 <= rows) {
      rows_block<2>(q + r * Dp, Dp, k, nj, st_stride, factor, st + r * st_stride, next);
      r += 2;
    }
    if (r < rows) rows_block<1>(q + r * Dp, Dp, k, nj, st_stride, factor, st + r * st_stride, next);
  }
};

#endif

}  // namespace fattn::cpu
