// fattn-bench — the 16-bit dot-product peak: a register-resident VDPBF16PS loop.
//
// dot_loops.cpp is compiled with the flags of the library's avx512_bf16 unit where the
// library has one (FATTN_HAVE_AVX512_BF16); elsewhere its loop is null. The caller asks
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
