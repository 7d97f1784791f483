// fattn tests — 16-bit (bfloat16, float16) tensors for the CPU suites: the 16-bit twin of
// a test tensor (its values rounded to 16 bits),
// and the bound a 16-bit output is checked against (half an ulp of the dtype, plus the
// rounding of P where the kernel rounds it).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include <gtest/gtest.h>

#include "util/checks.hpp"
#include "util/reference.hpp"
#include "util/tensor.hpp"

namespace fattn_test {

using fattn::DType;

// The 16-bit pattern of x rounded to dtype (nearest even), and the value of a pattern:
// the conversions of util/elements.hpp, independent of the library's.
inline std::uint16_t bits16_of(DType dtype, float x) {
  std::uint16_t bits = 0;
  element_from_float(dtype, x, reinterpret_cast<std::uint8_t*>(&bits));
  return bits;
}
inline float value16_of(DType dtype, std::uint16_t bits) {
  return element_to_float(dtype, reinterpret_cast<const std::uint8_t*>(&bits));
}

// The 16-bit twin of a float tensor: the same strides and offset, storage of 16-bit
// patterns; padding a NaN (any read outside the view shows).
struct Tensor16 {
  std::vector<std::uint16_t> storage;
  TensorView view;
};

// Rounds t's values to dtype in place and returns the 16-bit twin holding them.
inline Tensor16 to_16bit(Tensor& t, DType dtype) {
  Tensor16 r;
  r.storage.assign(t.storage().size(), 0x7fc1);
  const float* base = t.storage().data();
  t.for_each([&](auto a, auto b, auto c, auto d) {
    float& x = t.at(a, b, c, d);
    x = round_to(dtype, x);
    r.storage[static_cast<std::size_t>(&x - base)] = bits16_of(dtype, x);
  });
  r.view = t.view();
  r.view.data = r.storage.data() + (static_cast<const float*>(t.view().data) - base);
  r.view.dtype = dtype;
  return r;
}

// A poisoned 16-bit output shaped like t.
inline Tensor16 output_like(const Tensor& t, DType dtype) {
  Tensor16 r{std::vector<std::uint16_t>(t.storage().size(), 0x7fc3), t.view()};
  r.view.data = r.storage.data() + (static_cast<const float*>(t.view().data) - t.storage().data());
  r.view.dtype = dtype;
  return r;
}

// Every element of got (16-bit, laid out like ref) within half an ulp of the dtype of
// the float32 reference plus kOutTol·max(1, max|ref|), plus extra[e] where given;
// outside the view untouched.
inline ::testing::AssertionResult near_16bit(const Tensor16& got, const Tensor& ref, DType dtype,
                                      double ulps = 0.5, const Tensor* extra = nullptr) {
  double max_ref = 1.0;
  ref.for_each([&](auto a, auto b, auto c, auto d) {
    max_ref = std::max(max_ref, std::abs(static_cast<double>(ref.at(a, b, c, d))));
  });
  const std::vector<char> inside = ref.coverage();
  const float* base = ref.storage().data();
  for (std::size_t e = 0; e < got.storage.size(); ++e) {
    const std::uint16_t bits = got.storage[e];
    if (!inside[e]) {
      if (bits != 0x7fc3) return ::testing::AssertionFailure() << "wrote outside the view at " << e;
      continue;
    }
    const double want = base[e], have = value16_of(dtype, bits);
    const double bound = ulps * ulp_of(dtype) * std::abs(want) + kOutTol * max_ref +
                         (extra ? extra->storage()[e] : 0.0);
    if (!(std::abs(have - want) <= bound))
      return ::testing::AssertionFailure()
             << "element " << e << ": got " << have << ", reference " << want << ", bound " << bound;
  }
  return ::testing::AssertionSuccess();
}

// Whether the kernel rounds P to bfloat16 for P·V: where its products run on bfloat16 dot
// products (the fused kernel, and the decode kernel on a cache it reads in place, on a CPU
// and build with AVX512-BF16), as fattn::forward_plan says.
inline bool rounds_p(const TensorView& q, const TensorView& k, const TensorView& v, const Options& options) {
  return fattn::forward_plan(q, k, v, options).products == fattn::Products::bf16_dot;
}

// |t| element by element, in t's layout.
inline Tensor abs_of(const Tensor& t) {
  Tensor r = t.clone();
  r.for_each([&](auto a, auto b, auto s, auto d) { r.at(a, b, s, d) = std::abs(t.at(a, b, s, d)); });
  return r;
}

// P rounded to bfloat16 (unit roundoff 2^-8) moves each term p_j·v_j by at most
// 2^-8·p_j·|v_j|, so the output by at most 2^-8·Σ_j p_j·|v_j| / l: 2^-8 times the
// reference's output for |v| (out_abs_v).
inline Tensor p_rounding_bound(const Tensor& out_abs_v) {
  Tensor r = out_abs_v.clone();
  r.for_each([&](auto a, auto b, auto s, auto d) {
    r.at(a, b, s, d) = static_cast<float>(std::ldexp(out_abs_v.at(a, b, s, d), -8));
  });
  return r;
}

}  // namespace fattn_test
