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
// adds one term per dim. Over more than kChainDims dims it sums chains of at most that
// many terms, each from zero, and adds each chain's sums to those of the chains before
// it: one chain's rounding error grows with its length. Large logits (q, k ~ 4·N(0,1),
// scale 0.3, Sk = 512, 128 heads, dev-zen5), RMS error of the output against float64 over
// torch's float32 error, fused kernel: D = 256 in one chain 1.8-1.9×; D ≤ 192 in one
// chain 0.8-1.1× (docs/perf-log.md, "the score sums in chains").
inline constexpr std::int64_t kChainDims = 128;

// f(d0, d1, first) for the chains [d0, d1) of [0, D), first for the one at 0.
template <class F>
inline void for_chains(std::int64_t D, F&& f) {
  for (std::int64_t d0 = 0; d0 < D; d0 += kChainDims)
    f(d0, d0 + kChainDims < D ? d0 + kChainDims : D, d0 == 0);
}

}  // namespace fattn::cpu
