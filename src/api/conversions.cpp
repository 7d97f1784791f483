// fattn — the public element conversions (fattn/tensor.hpp): the kernels' own scalar
// conversions (cpu/common/elements.hpp), so that values prepared with them round exactly
// as the kernels round, and the q8_0 format's quantization.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "cpu/common/elements.hpp"
#include "fattn/attention.hpp"
#include "fattn/tensor.hpp"

namespace fattn {
namespace {

void require_q8_0_length(std::int64_t n, const char* function) {
  if (n >= 0 && n % kQ8_0BlockValues == 0) return;
  throw Error(std::string("fattn: ") + function + " takes a multiple of " +
              std::to_string(kQ8_0BlockValues) + " values, got n = " + std::to_string(n));
}

void require_16bit(DType dtype, const char* function) {
  if (dtype == DType::float16 || dtype == DType::bfloat16) return;
  throw Error(std::string("fattn: ") + function + " takes dtype float16 or bfloat16, got " +
              to_string(dtype));
}

}  // namespace

std::uint16_t to_16bit(float value, DType dtype) {
  require_16bit(dtype, "to_16bit");
  return dtype == DType::bfloat16 ? cpu::from_float<cpu::BFloat16>(value).bits
                                  : cpu::from_float<cpu::Float16>(value).bits;
}

float from_16bit(std::uint16_t bits, DType dtype) {
  require_16bit(dtype, "from_16bit");
  return dtype == DType::bfloat16 ? cpu::to_float(cpu::BFloat16{bits})
                                  : cpu::to_float(cpu::Float16{bits});
}

void quantize_q8_0(const float* src, std::int64_t n, void* dst) {
  require_q8_0_length(n, "quantize_q8_0");
  auto* out = static_cast<std::uint8_t*>(dst);
  for (std::int64_t block = 0; block * kQ8_0BlockValues < n; ++block) {
    const float* x = src + block * kQ8_0BlockValues;
    float amax = 0.0f;
    for (std::int64_t i = 0; i < kQ8_0BlockValues; ++i) amax = std::max(amax, std::fabs(x[i]));
    const float d = amax / 127.0f;
    const float inverse = d != 0.0f ? 1.0f / d : 0.0f;
    const std::uint16_t scale = cpu::from_float<cpu::Float16>(d).bits;
    std::uint8_t* at = out + block * kQ8_0BlockBytes;
    std::memcpy(at, &scale, sizeof scale);
    for (std::int64_t i = 0; i < kQ8_0BlockValues; ++i) {
      const float r = std::round(x[i] * inverse);  // ties away from 0; |r| <= 127 when finite
      // A block with an infinity or NaN has no finite scale: its values become 0 (ggml's
      // cast of such a value is undefined).
      const auto q = static_cast<std::int8_t>(std::isfinite(r) ? r : 0.0f);
      std::memcpy(at + sizeof scale + i, &q, 1);
    }
  }
}

void dequantize_q8_0(const void* src, std::int64_t n, float* dst) {
  require_q8_0_length(n, "dequantize_q8_0");
  cpu::convert_row(static_cast<const cpu::Q8_0*>(src), 1, n, dst);
}

}  // namespace fattn
