// fattn-bench — the 16-bit dot-product peak: a register-resident VDPBF16PS loop.
//
// dot_loops.cpp runs the library's loop (cpu/common/peak_loops.hpp, the one its bfloat16
// products are chosen by), where the library has an avx512_bf16 unit
// (FATTN_HAVE_AVX512_BF16); elsewhere its loop is null. The caller asks
// fattn::cpu_has_bf16_dot_products() before running it.
#pragma once

#include <cstdint>

namespace fattn_bench {

struct DotLoop {
  // Runs `iterations` rounds of independent VDPBF16PS chains (operands in registers) and
  // returns a checksum. Null without AVX512-BF16 in the build.
  float (*loop)(std::int64_t iterations, float unused_multiplier, float unused_addend);
  std::int64_t bf16_flops_per_iteration;  // chains × 16 lanes × 2 products × 2
};

extern const DotLoop bf16_dot_loop;

}  // namespace fattn_bench
