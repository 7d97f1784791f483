// fattn — the decode kernel's scores for a few query rows, straight from the key rows.
//
// With R ≤ 4 rows a key tile's transpose (cpu/decode_ops.hpp, transpose_keys: 64
// shuffles per 16×16 block) costs more than the products it feeds (R FMAs per 16
// elements). Here each key row is multiplied where it lies, dims along the lanes:
//   acc[r][k] += qs[r][d..d+15] · k[j + k][d..d+15]     R rows × 16/R keys, over d
//   st[r][j + k] = Σ lanes acc[r][k]                    16 sums at once (sum_lanes16)
// (decode, Sq = 1, GQA 4:1, D = 128: compute alone 37.7 → 48.9 GB/s per core, keys in L2;
// in DRAM 30.6-33.0 → 38.1-42.2 GB/s with its prefetch, docs/perf-log.md "Decode kernel").
// AVX-512 only; the other ISAs transpose.
#pragma once

#include "cpu/isa_target.hpp"

#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

#include "cpu/elements.hpp"
#include "cpu/simd.hpp"

#if defined(FATTN_AVX512)
#include <immintrin.h>
#endif

namespace fattn::cpu {

#if defined(FATTN_AVX512)

// Lane i of the result is the sum of the 16 lanes of a[i]: four rounds that each halve
// the vectors (pairs of floats, of float pairs, then 128-bit lanes twice), 45 operations
// for 16 horizontal sums.
[[gnu::always_inline]] inline __m512 sum_lanes16(const __m512 a[16]) {
  __m512 b[8], c[4], d[2];
  for (int i = 0; i < 8; ++i)
    b[i] = _mm512_add_ps(_mm512_unpacklo_ps(a[2 * i], a[2 * i + 1]),
                         _mm512_unpackhi_ps(a[2 * i], a[2 * i + 1]));
  for (int i = 0; i < 4; ++i) {
    const __m512d x = _mm512_castps_pd(b[2 * i]), y = _mm512_castps_pd(b[2 * i + 1]);
    c[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)),
                         _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
  }
  constexpr int kEven = _MM_SHUFFLE(2, 0, 2, 0), kOdd = _MM_SHUFFLE(3, 1, 3, 1);
  for (int i = 0; i < 2; ++i)
    d[i] = _mm512_add_ps(_mm512_shuffle_f32x4(c[2 * i], c[2 * i + 1], kEven),
                         _mm512_shuffle_f32x4(c[2 * i], c[2 * i + 1], kOdd));
  return _mm512_add_ps(_mm512_shuffle_f32x4(d[0], d[1], kEven),
                       _mm512_shuffle_f32x4(d[0], d[1], kOdd));
}

// Rows: the decode kernel's key rows (row(j): Dp contiguous elements, float32 or 16-bit,
// widened as they are loaded).
template <class Rows>
struct DirectScores {
  using S = Simd<64>;
  using Element = std::remove_cv_t<std::remove_pointer_t<decltype(std::declval<Rows>().row(0))>>;
  static constexpr int kLanes = 16;
  static constexpr int kSums = 16;  // dot products per sum_lanes16

  // st[r][j + k] for R rows and 16/R keys starting at j.
  template <int R>
  static void block(const float* qs, std::int64_t Dp, const Rows& k, std::int64_t j,
                    std::int64_t st_stride, float* st) {
    constexpr int KB = kSums / R;
    const Element* krow[KB];
    for (int kk = 0; kk < KB; ++kk) krow[kk] = k.row(j + kk);
    __m512 acc[kSums];
    for (auto& a : acc) a = _mm512_setzero_ps();
    for (std::int64_t d = 0; d < Dp; d += kLanes) {
      __m512 kv[KB];
#pragma GCC unroll 16
      for (int kk = 0; kk < KB; ++kk) kv[kk] = load_vec<S>(krow[kk] + d);
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        const __m512 qv = _mm512_loadu_ps(qs + r * Dp + d);
#pragma GCC unroll 16
        for (int kk = 0; kk < KB; ++kk) acc[r * KB + kk] = _mm512_fmadd_ps(qv, kv[kk], acc[r * KB + kk]);
      }
    }
    alignas(64) float sums[kSums];
    _mm512_store_ps(sums, sum_lanes16(acc));
    for (int r = 0; r < R; ++r) std::memcpy(st + r * st_stride + j, sums + r * KB, KB * sizeof(float));
  }

  // st[r][j] for keys [j0, nj) one at a time (the tile's last keys).
  static void keys(const float* qs, std::int64_t rows, std::int64_t Dp, const Rows& k,
                   std::int64_t j0, std::int64_t nj, std::int64_t st_stride, float* st) {
    for (std::int64_t j = j0; j < nj; ++j)
      for (std::int64_t r = 0; r < rows; ++r) {
        __m512 acc = _mm512_setzero_ps();
        for (std::int64_t d = 0; d < Dp; d += kLanes)
          acc = _mm512_fmadd_ps(_mm512_loadu_ps(qs + r * Dp + d), load_vec<S>(k.row(j) + d), acc);
        st[r * st_stride + j] = _mm512_reduce_add_ps(acc);
      }
  }

  // R rows against keys [0, nj), after each block of keys asking `next` for a few rows.
  template <int R, class Prefetch>
  static void rows_block(const float* qs, std::int64_t Dp, const Rows& k, std::int64_t nj,
                         std::int64_t st_stride, float* st, Prefetch& next) {
    constexpr int KB = kSums / R;
    std::int64_t j = 0;
    for (; j + KB <= nj; j += KB) {
      block<R>(qs, Dp, k, j, st_stride, st);
      next.issue(Prefetch::kRowsPerDirectBlock);
    }
    keys(qs, R, Dp, k, j, nj, st_stride, st);
  }

  // st[r][j] = qs[r]·k[j] for rows ≤ 4·n (in blocks of 4, then 2, then 1 rows).
  template <class Prefetch>
  static void scores(const float* qs, std::int64_t rows, std::int64_t Dp, const Rows& k,
                     std::int64_t nj, std::int64_t st_stride, float* st, Prefetch& next) {
    std::int64_t r = 0;
    for (; r + 4 <= rows; r += 4) rows_block<4>(qs + r * Dp, Dp, k, nj, st_stride, st + r * st_stride, next);
    if (r + 2 <= rows) {
      rows_block<2>(qs + r * Dp, Dp, k, nj, st_stride, st + r * st_stride, next);
      r += 2;
    }
    if (r < rows) rows_block<1>(qs + r * Dp, Dp, k, nj, st_stride, st + r * st_stride, next);
  }
};

#endif

}  // namespace fattn::cpu
