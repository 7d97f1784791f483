// fattn — the decode kernel's scores for a few query rows straight from the key rows, on
// AVX2: cpu/decode/direct.hpp's scheme sized for 16 ymm registers.
//
// With up to 8 rows (blocks of R ≤ 4 rows, each a pass over the tile's key rows: the
// rule is DecodeOps::kDirectRows), transposing a key tile costs more than the products it
// feeds (R FMAs per 8 elements against 3 shuffles per element-vector). Here each key row is multiplied
// where it lies, dims along the lanes:
//   acc[r][k] += qs[r][d..d+7] · k[j + k][d..d+7]     R rows × 8/R keys, over d
//   st[r][j + k] = Σ lanes acc[r][k]                  8 sums at once (sum_lanes.hpp)
// 8 accumulators, 8/R key vectors and a query operand (taken from memory by the FMA) stay
// within the 16 registers; a 16-bit key row is widened as it is loaded (load_vec: F16C
// vcvtph2ps, or a zero-extend and shift for bfloat16), once for all R rows.
// Each score is the tree sum of 8 lane partials of D/8 dims (16 at D = 128), as accurate
// as the pairwise chains of the transposed path (cpu/common/blocks.hpp, kChainDims 16).
#pragma once

#include "cpu/common/isa_target.hpp"

#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

#include "cpu/common/elements.hpp"
#include "cpu/common/simd.hpp"
#include "cpu/decode/sum_lanes.hpp"

#if defined(FATTN_AVX)
#include <immintrin.h>

namespace fattn::cpu {
namespace {  // each unit's own copy, built with its own instructions

// Rows: the decode kernel's key rows (row(j): Dp contiguous elements of type E, Dp a
// multiple of 8; q8_0 blocks widened as they are loaded); q: the query rows, float32,
// pre-scaled by scale·log2(e).
template <class Rows>
struct DirectScoresAvx2 {
  using S = Simd<32>;
  using Element = std::remove_cv_t<std::remove_pointer_t<decltype(std::declval<const Rows&>().row(0))>>;
  static constexpr int kStep = S::lanes;  // dims per FMA
  static constexpr int kSums = 8;         // dot products per sum_lanes

  // st[r][j + k] for R rows and 8/R keys starting at j. Inlined into rows_block: GCC's
  // own budget stops inlining it once exp2 is written through horner() (objdump).
  template <int R>
  [[gnu::always_inline]] static void block(const float* q, std::int64_t Dp, const Rows& k, std::int64_t j,
                    std::int64_t st_stride, float* st) {
    constexpr int KB = kSums / R;
    decltype(k.row(0)) krow[KB];
    for (int kk = 0; kk < KB; ++kk) krow[kk] = k.row(j + kk);
    __m256 acc[kSums];
    // The first step starts the sums from its products (no zeroed array to add to).
    auto products = [&](std::int64_t d, const __m256 (&kv)[KB], auto first) {
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        const __m256 qv = _mm256_loadu_ps(q + r * Dp + d);
#pragma GCC unroll 8
        for (int kk = 0; kk < KB; ++kk) {
          __m256& a = acc[r * KB + kk];
          a = decltype(first)::value ? _mm256_mul_ps(qv, kv[kk]) : _mm256_fmadd_ps(qv, kv[kk], a);
        }
      }
    };
    if constexpr (std::is_same_v<Element, Q8_0>) {
      // A block (32 dims) of each key a step: its scale widened once, not for each 8 of its
      // values; the same floats and products as load_row_vec (in-cache q8_0 decode, Sk 1k,
      // 1 thread, dev-zen3: docs/perf-log.md 2026-12-07).
      constexpr int kPerBlock = static_cast<int>(kQ8_0BlockValues) / kStep;
      auto block_step = [&](std::int64_t d0, auto first) {
        Q8_0BlockLanes<S> blocks[KB];
#pragma GCC unroll 8
        for (int kk = 0; kk < KB; ++kk) blocks[kk] = {krow[kk], d0 / kQ8_0BlockValues};
        auto widen = [&](int u, __m256(&kv)[KB]) {
#pragma GCC unroll 8
          for (int kk = 0; kk < KB; ++kk) kv[kk] = blocks[kk].lanes(u * kStep);
        };
        __m256 kv[KB];
        widen(0, kv);
        products(d0, kv, first);
#pragma GCC unroll 4
        for (int u = 1; u < kPerBlock; ++u) {
          widen(u, kv);
          products(d0 + u * kStep, kv, std::false_type{});
        }
      };
      block_step(0, std::true_type{});
      for (std::int64_t d0 = kQ8_0BlockValues; d0 < Dp; d0 += kQ8_0BlockValues) block_step(d0, std::false_type{});
    } else {
      auto step = [&](std::int64_t d, auto first) {
        __m256 kv[KB];
#pragma GCC unroll 8
        for (int kk = 0; kk < KB; ++kk) kv[kk] = load_row_vec<S>(krow[kk], d);
        products(d, kv, first);
      };
      step(0, std::true_type{});
      // Unrolled: one step a loop iteration left the 8 accumulator chains (two FMA ports ×
      // four cycles: none to spare) waiting on its loads; unrolled by 4 the scores of a tile
      // run at 81-90 GFLOP/s where they ran at 54-60 (fattn-decode-tile --isa avx2, 4 and
      // 8 rows, dev-zen4, docs/perf-log.md 2026-12-08).
#pragma GCC unroll 4
      for (std::int64_t d = kStep; d < Dp; d += kStep) step(d, std::false_type{});
    }
    alignas(32) float sums[kSums];
    _mm256_store_ps(sums, sum_lanes<8>(acc));
    for (int r = 0; r < R; ++r) std::memcpy(st + r * st_stride + j, sums + r * KB, KB * sizeof(float));
  }

  // st[r][j] for keys [j0, nj) one at a time (a tile's last keys).
  static void keys(const float* q, std::int64_t rows, std::int64_t Dp, const Rows& k,
                   std::int64_t j0, std::int64_t nj, std::int64_t st_stride, float* st) {
    for (std::int64_t j = j0; j < nj; ++j)
      for (std::int64_t r = 0; r < rows; ++r) {
        __m256 acc[kSums];
        for (int i = 0; i < kSums; ++i) acc[i] = _mm256_setzero_ps();
        for (std::int64_t d = 0; d < Dp; d += kStep)
          acc[0] = _mm256_fmadd_ps(_mm256_loadu_ps(q + r * Dp + d), load_row_vec<S>(k.row(j), d), acc[0]);
        st[r * st_stride + j] = _mm256_cvtss_f32(sum_lanes<8>(acc));
      }
  }

  // R rows against keys [0, nj), after each block of keys asking `next` for a few rows.
  template <int R, class Prefetch>
  static void rows_block(const float* q, std::int64_t Dp, const Rows& k, std::int64_t nj,
                         std::int64_t st_stride, float* st, Prefetch& next) {
    constexpr int KB = kSums / R;
    std::int64_t j = 0;
    for (; j + KB <= nj; j += KB) {
      block<R>(q, Dp, k, j, st_stride, st);
      next.issue_after_direct_block();
    }
    keys(q, R, Dp, k, j, nj, st_stride, st);
  }

  // st[r][j] = q[r]·k[j] for any number of rows (in blocks of 4, then 2, then 1 rows); the
  // rows of `next` spread over the blocks.
  template <class Prefetch>
  static void scores(const float* q, std::int64_t rows, std::int64_t Dp, const Rows& k,
                     std::int64_t nj, std::int64_t st_stride, float* st, Prefetch& next) {
    next.spread(direct_score_blocks(rows, nj, kSums));
    std::int64_t r = 0;
    for (; r + 4 <= rows; r += 4) rows_block<4>(q + r * Dp, Dp, k, nj, st_stride, st + r * st_stride, next);
    if (r + 2 <= rows) {
      rows_block<2>(q + r * Dp, Dp, k, nj, st_stride, st + r * st_stride, next);
      r += 2;
    }
    if (r < rows) rows_block<1>(q + r * Dp, Dp, k, nj, st_stride, st + r * st_stride, next);
  }
};

}  // namespace
}  // namespace fattn::cpu
#endif
