// fattn — the public 16-bit element conversions (fattn/tensor.hpp): the kernels' own
// scalar conversions (cpu/common/elements.hpp), so that values prepared with them round exactly
// as the kernels round.
#include <string>

#include "cpu/common/elements.hpp"
#include "fattn/attention.hpp"
#include "fattn/tensor.hpp"

namespace fattn {
namespace {

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

}  // namespace fattn
