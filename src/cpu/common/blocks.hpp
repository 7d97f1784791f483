// fattn — loops over blocks whose size is a compile-time constant.
//
// A kernel's block keeps its accumulators in registers, so the rows (or dims, or
// vectors) a block takes must be known at compile time. for_blocks<N>(n, f) walks [0, n)
// in blocks of N and ends with one block of the n mod N left:
//   f(i, R)   R = std::integral_constant<int, rows of the block>, i its first row
// so each block size compiles to its own kernel, and the last block is exactly as large
// as what is left (no masked lanes, no second loop with a runtime count).
#pragma once

#include <cstdint>
#include <type_traits>

#include "model/checks.hpp"

namespace fattn::cpu {

// f(std::integral_constant<int, n>{}) for 1 ≤ n ≤ N (nothing for other n).
template <int N, class F>
inline void with_count(int n, F&& f) {
  if constexpr (N > 0) {
    if (n != N) return with_count<N - 1>(n, f);
    f(std::integral_constant<int, N>{});
  }
}

template <int N, class F>
inline void for_blocks(std::int64_t n, F&& f) {
  static_assert(N > 0, "a block takes at least one row");
  std::int64_t i = 0;
  for (; i + N <= n; i += N) f(i, std::integral_constant<int, N>{});
  if (i < n) with_count<N - 1>(static_cast<int>(n - i), [&](auto R) { f(i, R); });
}

}  // namespace fattn::cpu

namespace fattn::cpu {

// A float32 dot product over the head dim (a score, a dP) keeps its sums in registers and
// adds one term per dim: a chain of FMAs, whose rounding error grows with its length (each
// step rounds a partial sum that grows like √d). The score blocks (TileOps, DecodeOps) sum
// chains of at most kChainDims dims and add the chains' sums pairwise (sum_chains); a head
// of kChainDims dims takes two chains of half as many.
// RMS error of a score, q, k ~ 4·N(0,1), q pre-scaled by scale·log2(e), in units of
// u·RMS|s| (float32 emulated in float64; docs/perf-log.md, "pairwise chains"), D = 16 /
// 32 / 64 / 128 / 256: one chain 1.30 / 1.78 / 2.42 / 3.44 / 4.92 (chains of 128 added in
// turn, as until 2026-11-26: the same, 3.42 at 256); these chains 1.11 / 1.42 / 1.49 /
// 1.53 / 1.57; the AVX-512 decode kernel's direct scores (16 lane partials, a tree across
// the lanes) 1.13 / 1.19 / 1.22 / 1.41 / 1.59; torch's float32 matrix-vector product (its
// SDPA at Sq = 1) 1.29 / 1.40 / 1.51 / 1.71 / 2.28. Chains of 8 would give 1.11 / 1.23 /
// 1.30 / 1.37 / 1.42 for twice the chain ends: each stores and loads the block's sums,
// 5 % of the AVX-512 score block's time at chains of 16, 11 % at 8 (dev-zen5).
inline constexpr std::int64_t kChainDims = 16;
// Sums waiting at once, at most: the largest head dim has at most 2^kChainLevels chains,
// and all but the last wait, each at its own level.
inline constexpr int kChainLevels = [] {
  int n = 0;
  while ((kChainDims << n) < detail::kMaxHeadDim) ++n;
  return n;
}();

// No row of a register block sits out a rank-1 update (rank1_update's default).
struct NoRowSkips {
  constexpr bool operator()(int) const { return false; }
};

// acc[r][·] ← a(r)·b[·] + acc[r][·] for each row r of an R×C block that `skips` does not
// name: one broadcast of the row's scalar against the C vectors of b, then C FMAs. With
// First, acc[r][·] ← a(r)·b[·] (a chain's first dim: the block is not zeroed first). The
// inner step of every outer-product kernel: scores from a transposed tile, P·V from
// value rows.
template <class S, bool First = false, int R, int C, class RowScalar, class Skips = NoRowSkips>
[[gnu::always_inline]] inline void rank1_update(typename S::vec (&acc)[R][C], RowScalar a,
                                                const typename S::vec (&b)[C], Skips skips = {}) {
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
    if (skips(r)) continue;
    const typename S::vec ar = S::splat(a(r));
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) acc[r][c] = First ? ar * b[c] : S::fma(ar, b[c], acc[r][c]);
  }
}

template <class V, int R, int C>
[[gnu::always_inline]] inline void add_sums(V (&acc)[R][C], const V (&sums)[R][C]) {
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) acc[r][c] += sums[r][c];
}

// acc ← the sum over the chains [d0, d1) of [0, D) of chain(d0, d1), which sets acc to
// its chain's sums (starting from its first dim's products: zeroing the block first cost
// the AVX2 score block a quarter of its speed in a micro-benchmark). Summed pairwise, as
// a binary counter counts: after chain i, level[j] holds the sum of 2^j chains for each
// set bit j of i; a chain adds those of its equal-sized predecessors, then waits at the
// next level or, the last one, adds the rest. The block's sums stay in registers, the
// waiting ones in memory: per chain one store and on average one load.
template <class V, int R, int C, class Chain>
[[gnu::always_inline]] inline void sum_chains(std::int64_t D, V (&acc)[R][C], Chain&& chain) {
  V level[kChainLevels][R][C];
  const bool halves = D <= kChainDims;  // (constant divisors below)
  const std::int64_t dims = halves ? kChainDims / 2 : kChainDims;
  const std::int64_t chains = halves ? (D + kChainDims / 2 - 1) / (kChainDims / 2)
                                     : (D + kChainDims - 1) / kChainDims;
  for (std::int64_t i = 0;; ++i) {
    const std::int64_t d0 = i * dims;
    chain(d0, d0 + dims < D ? d0 + dims : D);
    int j = 0;
    for (; (i >> j) & 1; ++j) add_sums(acc, level[j]);
    if (i + 1 == chains) {
      for (int k = j + 1; (i >> k) != 0; ++k)
        if ((i >> k) & 1) add_sums(acc, level[k]);
      return;
    }
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
      for (int c = 0; c < C; ++c) level[j][r][c] = acc[r][c];
  }
}

// acc[r][c] = Σ_{d<D} a(d, r) · b(d, c): the scores of a row block against a tile whose
// dims are its rows, one rank-1 update per dim (b's C vectors loaded once, a(d, r)
// broadcast), the dims in chains summed pairwise (sum_chains). each_dim() runs before
// each dim's loads (the decode kernel's prefetch).
template <class S, int R, int C, class A, class B, class EachDim>
[[gnu::always_inline]] inline void dim_sums(std::int64_t D, typename S::vec (&acc)[R][C], A a, B b,
                                            EachDim each_dim) {
  sum_chains(D, acc, [&](std::int64_t d0, std::int64_t d1) {
    auto dim = [&](std::int64_t d, auto first) {
      each_dim();
      typename S::vec bv[C];
#pragma GCC unroll 8
      for (int c = 0; c < C; ++c) bv[c] = b(d, c);
      rank1_update<S, decltype(first)::value>(acc, [&](int r) { return a(d, r); }, bv);
    };
    dim(d0, std::true_type{});
    for (std::int64_t d = d0 + 1; d < d1; ++d) dim(d, std::false_type{});
  });
}

// out[r·stride + c·lanes] ← acc[r][c]: a register block's rows to memory.
template <class S, int R, int C>
[[gnu::always_inline]] inline void store_block(const typename S::vec (&acc)[R][C], float* out,
                                               std::int64_t stride) {
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) S::store(out + r * stride + c * S::lanes, acc[r][c]);
}

}  // namespace fattn::cpu
