// fattn tests — the vectorised exp2 built with one instruction set's flags, so that
// test_exp2.cpp can check the code the AVX2 / AVX-512 kernels actually run.
// Compiled once per ISA with FATTN_TEST_VECTOR_BYTES and FATTN_TEST_EXP2_NAME set
// (tests/CMakeLists.txt). Nothing here may use the standard library's inline
// templates: a wide-instruction copy could be picked for the rest of the program.
#include <cstddef>

#include "cpu/common/exp2.hpp"

namespace fattn_test {

void FATTN_TEST_EXP2_NAME(const float* in, float* out, std::size_t n) {
  using S = fattn::cpu::Simd<FATTN_TEST_VECTOR_BYTES>;
  std::size_t i = 0;
  for (; i + S::lanes <= n; i += S::lanes) S::store(out + i, fattn::cpu::exp2<S>(S::load(in + i)));
  if (i < n) {
    float buf[S::lanes] = {};
    __builtin_memcpy(buf, in + i, (n - i) * sizeof(float));
    S::store(buf, fattn::cpu::exp2<S>(S::load(buf)));
    __builtin_memcpy(out + i, buf, (n - i) * sizeof(float));
  }
}

}  // namespace fattn_test
