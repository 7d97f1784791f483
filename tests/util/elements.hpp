// fattn tests — the element types of host tensors: float32, float16 and bfloat16, read
// as float and written from float with round to nearest even (the rounding of the CUDA
// headers' __float2half_rn and __float2bfloat16_rn, and of the library's own stores).
// Plain integer code, independent of the library, so that CPU and CUDA tests share it.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

#include "fattn/fattn.hpp"

namespace fattn_test {

namespace element_bits {

constexpr std::uint32_t kSignMask = 0x80000000u;
constexpr std::uint32_t kMagnitudeMask = 0x7fffffffu;
constexpr std::uint32_t kFloatInfinity = 0x7f800000u;
constexpr int kFloatMantissaBits = 23;
constexpr int kFloatExponentBias = 127;

// bfloat16: the top 16 bits of a float32 (7 mantissa bits).
constexpr int kBFloat16MantissaBits = 7;
constexpr int kBFloat16DroppedBits = kFloatMantissaBits - kBFloat16MantissaBits;
constexpr std::uint32_t kBFloat16QuietBit = 0x40u;

// float16: 5 exponent bits (bias 15), 10 mantissa bits.
constexpr int kHalfMantissaBits = 10;
constexpr int kHalfDroppedBits = kFloatMantissaBits - kHalfMantissaBits;
constexpr int kHalfExponentBias = 15;
constexpr std::uint32_t kHalfSignMask = 0x8000u;
constexpr std::uint32_t kHalfExponentMax = 0x1fu;
constexpr std::uint32_t kHalfMantissaMask = 0x3ffu;
constexpr std::uint32_t kHalfInfinity = 0x7c00u;
constexpr std::uint32_t kHalfQuietNaN = 0x7e00u;
// The least float that rounds to float16 infinity: 65520, halfway above the largest (65504).
constexpr std::uint32_t kHalfOverflowFloat = 0x477ff000u;
// The least normal float16, 2^-14, as a float; below it float16 counts units of 2^-24.
constexpr std::uint32_t kHalfLeastNormalFloat = 0x38800000u;
constexpr float kHalfSubnormalUnit = 0x1p-24f;

inline std::uint16_t bfloat16_from_float(float x) {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(x);
  if ((u & kMagnitudeMask) > kFloatInfinity)  // NaN: keep the sign and top payload, quiet
    return static_cast<std::uint16_t>((u >> kBFloat16DroppedBits) | kBFloat16QuietBit);
  const std::uint32_t half_unit = (1u << (kBFloat16DroppedBits - 1)) - 1;  // ties go to even
  const std::uint32_t odd = (u >> kBFloat16DroppedBits) & 1u;
  return static_cast<std::uint16_t>((u + half_unit + odd) >> kBFloat16DroppedBits);
}

inline float bfloat16_to_float(std::uint16_t bits) {
  return std::bit_cast<float>(static_cast<std::uint32_t>(bits) << kBFloat16DroppedBits);
}

inline std::uint16_t float16_from_float(float x) {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(x);
  const auto sign = static_cast<std::uint16_t>((u & kSignMask) >> 16);
  const std::uint32_t magnitude = u & kMagnitudeMask;
  if (magnitude > kFloatInfinity)  // NaN: quiet, the top payload bits kept
    return static_cast<std::uint16_t>(sign | kHalfQuietNaN |
                                      ((magnitude >> kHalfDroppedBits) & kHalfMantissaMask));
  if (magnitude >= kHalfOverflowFloat) return static_cast<std::uint16_t>(sign | kHalfInfinity);
  if (magnitude < kHalfLeastNormalFloat) {  // subnormal (or zero): exact multiple, then rounded
    const float units = std::nearbyint(std::bit_cast<float>(magnitude) / kHalfSubnormalUnit);
    return static_cast<std::uint16_t>(sign | static_cast<std::uint32_t>(units));
  }
  constexpr std::uint32_t rebias = static_cast<std::uint32_t>(kFloatExponentBias - kHalfExponentBias)
                                   << kFloatMantissaBits;
  const std::uint32_t r = magnitude - rebias;
  const std::uint32_t half_unit = (1u << (kHalfDroppedBits - 1)) - 1;  // ties go to even
  const std::uint32_t odd = (r >> kHalfDroppedBits) & 1u;
  return static_cast<std::uint16_t>(sign | ((r + half_unit + odd) >> kHalfDroppedBits));
}

inline float float16_to_float(std::uint16_t bits) {
  const std::uint32_t sign = static_cast<std::uint32_t>(bits & kHalfSignMask) << 16;
  const std::uint32_t exponent = (bits >> kHalfMantissaBits) & kHalfExponentMax;
  const std::uint32_t mantissa = bits & kHalfMantissaMask;
  if (exponent == 0) {  // zero or subnormal: exact in float
    const float magnitude = static_cast<float>(mantissa) * kHalfSubnormalUnit;
    return sign ? -magnitude : magnitude;
  }
  if (exponent == kHalfExponentMax)  // infinity or NaN (payload kept)
    return std::bit_cast<float>(sign | kFloatInfinity | (mantissa << kHalfDroppedBits));
  const std::uint32_t rebiased = exponent + kFloatExponentBias - kHalfExponentBias;
  return std::bit_cast<float>(sign | (rebiased << kFloatMantissaBits) | (mantissa << kHalfDroppedBits));
}

}  // namespace element_bits

// The element dtypes a host tensor holds.
inline bool is_host_element_type(fattn::DType dtype) {
  return dtype == fattn::DType::float32 || dtype == fattn::DType::float16 ||
         dtype == fattn::DType::bfloat16;
}

inline void require_host_element_type(fattn::DType dtype) {
  if (!is_host_element_type(dtype))
    throw std::invalid_argument(std::string("test tensors hold float32, float16 or bfloat16, not ") +
                                fattn::to_string(dtype));
}

// The element of `dtype` at `bytes`, as a float (exact).
inline float element_to_float(fattn::DType dtype, const std::uint8_t* bytes) {
  std::uint16_t bits16 = 0;
  if (dtype != fattn::DType::float32) std::memcpy(&bits16, bytes, sizeof bits16);
  switch (dtype) {
    case fattn::DType::float16: return element_bits::float16_to_float(bits16);
    case fattn::DType::bfloat16: return element_bits::bfloat16_to_float(bits16);
    default: {
      float x;
      std::memcpy(&x, bytes, sizeof x);
      return x;
    }
  }
}

// Writes x as an element of `dtype` at `bytes`, rounded to nearest even.
inline void element_from_float(fattn::DType dtype, float x, std::uint8_t* bytes) {
  switch (dtype) {
    case fattn::DType::float16: {
      const std::uint16_t bits = element_bits::float16_from_float(x);
      std::memcpy(bytes, &bits, sizeof bits);
      return;
    }
    case fattn::DType::bfloat16: {
      const std::uint16_t bits = element_bits::bfloat16_from_float(x);
      std::memcpy(bytes, &bits, sizeof bits);
      return;
    }
    default: std::memcpy(bytes, &x, sizeof x); return;
  }
}

// x rounded to the nearest value of `dtype` (ties to even).
inline float round_to(fattn::DType dtype, float x) {
  std::uint8_t bytes[sizeof(float)];
  element_from_float(dtype, x, bytes);
  return element_to_float(dtype, bytes);
}

// The unit in the last place of 1 in `dtype`: 2^-23, 2^-10 or 2^-7.
inline double ulp_of(fattn::DType dtype) {
  const int mantissa_bits = dtype == fattn::DType::float32   ? element_bits::kFloatMantissaBits
                            : dtype == fattn::DType::float16 ? element_bits::kHalfMantissaBits
                                                             : element_bits::kBFloat16MantissaBits;
  return std::ldexp(1.0, -mantissa_bits);
}

}  // namespace fattn_test
