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
