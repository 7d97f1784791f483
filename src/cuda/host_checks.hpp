// fattn — host-side helpers of the CUDA backend: its errors, 64-bit size arithmetic,
// and the 32-bit limit of the kernels' index arithmetic.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <initializer_list>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "model/checked.hpp"
#include "fattn/attention.hpp"

namespace fattn::cuda {

inline constexpr std::int64_t kMaxInt = std::numeric_limits<int>::max();

[[noreturn]] inline void fail(const std::string& message) { throw Error("fattn: " + message); }

inline std::string error_text(cudaError_t e) {
  return std::string(cudaGetErrorName(e)) + " (" + cudaGetErrorString(e) + ")";
}

inline std::string join(const std::vector<int>& values) {
  std::string text;
  for (int v : values) text += (text.empty() ? "" : ", ") + std::to_string(v);
  return text;
}

// A generated head-dim list (head_dims.hpp's X-macros as a std::integer_sequence) as values.
template <int... Dims>
std::vector<int> dims_of(std::integer_sequence<int, Dims...>) {
  return {Dims...};
}

// The smallest of the ascending compiled head dims `dims` that holds head_dim (0: none does).
inline int compiled_dim_for(const std::vector<int>& dims, std::int64_t head_dim) {
  for (int d : dims)
    if (head_dim <= d) return d;
  return 0;
}

inline std::int64_t round_up(std::int64_t x, std::int64_t to) { return (x + to - 1) / to * to; }

inline std::int64_t checked_product(std::initializer_list<std::int64_t> factors,
                                    const char* what) {
  std::int64_t n = 1;
  for (std::int64_t f : factors)
    if (!detail::checked_mul(n, f, &n)) fail(std::string(what) + " would overflow 64 bits");
  return n;
}

// The kernels index with 32-bit ints: sizes and grids above 2^31 - 1 are an Error.
inline void expect_int(const char* what, std::int64_t value) {
  if (value > kMaxInt)
    fail(std::string(what) + " = " + std::to_string(value) +
         " is too large for the CUDA kernels (at most 2^31 - 1)");
}

}  // namespace fattn::cuda
