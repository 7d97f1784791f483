// fattn — vectorised 2^x for the softmax.
//
// 2^x = 2^n · 2^f with n = round(x), f = x − n ∈ [−0.5, 0.5]; 2^f is a degree-6
// polynomial fitted for minimum relative error on that interval (float64 error
// 1.9e-9; evaluated by Horner in float32 the measured bound is 1.05e-7, about 1.8 ulp).
// 2^n is built in the exponent field.
//
// Error bound (asserted by tests/test_exp2.cpp on a dense sweep):
//   x ∈ [−126, 127]:  |exp2(x) − 2^x| ≤ 1.5e-7 · 2^x
//   x < −126.5, −inf: exactly 0 (results below the normal range flush to zero, so
//                     masked scores give a probability of exactly 0)
//   x > 127:          saturates at 2^127 (the kernels only pass x ≤ 0)
//   NaN:              NaN
#pragma once

#include "cpu/common/simd.hpp"

namespace fattn::cpu {

template <class S>
inline typename S::vec exp2(typename S::vec x) {
  using vec = typename S::vec;
  using ivec = typename S::ivec;
  // NaN passes the clamps untouched.
  x = S::at_most(S::at_least(x, -127.0f), 127.0f);
  // Round to nearest with the 1.5·2^23 trick (exact for |x| < 2^22), the exponent bias
  // folded in: the low bits of t hold n + 127, so shifting t's bits left by 23 leaves
  // exactly the exponent field of 2^n (the bits above it shift out). Two operations
  // fewer per vector than converting n back to an integer and adding the bias.
  const vec biased_magic = S::splat(12582912.0f + 127.0f);
  const vec t = x + biased_magic;
  const vec n = t - biased_magic;
  const vec f = x - n;
  const vec p = horner<S>(f, 1.5361311670858413e-04f, 1.3400082243606448e-03f,
                          9.6184313297271729e-03f, 5.5503282696008682e-02f,
                          2.4022647738456726e-01f, 6.9314718246459961e-01f, 1.0f);
  // n = −127 gives a zero exponent field: 2^n = 0, the flush to zero above.
  ivec bits;
  static_assert(sizeof bits == sizeof t);
  __builtin_memcpy(&bits, &t, sizeof bits);
  const ivec biased = bits << 23;
  vec two_n;
  __builtin_memcpy(&two_n, &biased, sizeof two_n);
  return p * two_n;
}

}  // namespace fattn::cpu
