// fattn — 64-bit arithmetic that reports overflow instead of wrapping.
#pragma once

#include <cstdint>

namespace fattn::detail {

inline bool checked_mul(std::int64_t a, std::int64_t b, std::int64_t* result) {
  return !__builtin_mul_overflow(a, b, result);
}
inline bool checked_add(std::int64_t a, std::int64_t b, std::int64_t* result) {
  return !__builtin_add_overflow(a, b, result);
}

}  // namespace fattn::detail
