// fattn tests — element-by-element comparisons, each a gtest AssertionResult that says
// where and by how much a tensor is off.
//
// Outputs are compared with the float64 reference as max_abs_err <= 1e-5 · max(1, max|ref|);
// logsumexp values with |err| <= 1e-5 · max(1, |ref|) per element; -inf and NaN must
// match exactly, and an element still holding the poison was never written.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "fattn/fattn.hpp"
#include "poison.hpp"
#include "tensor.hpp"

namespace fattn_test {

constexpr double kOutTol = 1e-5;  // relative to max(1, max|ref|), for outputs
constexpr double kLseTol = 1e-5;  // relative to max(1, |ref|), for each logsumexp

// Mismatching elements a failure message lists before it only counts them.
constexpr std::int64_t kListedMismatches = 5;

inline std::string index_string(const Tensor& t, std::int64_t a, std::int64_t b, std::int64_t c,
                                std::int64_t d) {
  std::ostringstream s;
  s << "(" << a << ", " << b << ", " << c;
  if (t.rank() == 4) s << ", " << d;
  s << ")";
  return s.str();
}

// Whether got matches ref, where |got − ref| <= bound is what finite values need: never
// the poison, NaN where ref is NaN, equal where ref is ±inf. max_err grows by the error
// of a finite got.
inline bool element_matches(float got, float ref, double bound, double& max_err) {
  if (is_host_poison(got)) return false;  // never written
  if (std::isnan(ref)) return std::isnan(got);
  if (std::isinf(ref)) return got == ref;
  if (!std::isfinite(got)) return false;
  const double err = std::fabs(static_cast<double>(got) - ref);
  max_err = std::max(max_err, err);
  return err <= bound;
}

// The listed part of a mismatch report: "\n  <what> at (i, j, k, l): got g, expected r".
inline void list_mismatch(std::ostringstream& out, const char* what, const Tensor& t, float got,
                          float ref, std::int64_t a, std::int64_t b, std::int64_t c, std::int64_t d) {
  out << "\n  " << what << index_string(t, a, b, c, d) << ": got " << got
      << (is_host_poison(got) ? " (poison: never written)" : "") << ", expected " << ref;
}

// Every element of `got` (any layout) against `ref` (any layout, same logical shape):
// |got − ref| <= rel_tol · max(1, max|ref|) over the finite elements of ref.
inline ::testing::AssertionResult outputs_near(const Tensor& got, const Tensor& ref,
                                               double rel_tol = kOutTol) {
  if (got.rank() != ref.rank() || got.numel() != ref.numel())
    return ::testing::AssertionFailure() << "shape mismatch";
  double max_ref = 0.0;
  ref.for_each([&](auto a, auto b, auto c, auto d) {
    const double r = ref.get(a, b, c, d);
    if (std::isfinite(r)) max_ref = std::max(max_ref, std::fabs(r));
  });
  const double bound = rel_tol * std::max(1.0, max_ref);
  double max_err = 0.0;
  std::int64_t bad = 0;
  std::ostringstream first;
  ref.for_each([&](auto a, auto b, auto c, auto d) {
    const float g = got.get(a, b, c, d), r = ref.get(a, b, c, d);
    if (element_matches(g, r, bound, max_err)) return;
    if (bad++ < kListedMismatches) list_mismatch(first, "at ", got, g, r, a, b, c, d);
  });
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << bad << " of " << got.numel() << " elements differ (bound " << bound
         << ", max finite abs error " << max_err << "; max|ref| " << max_ref << ")" << first.str();
}

// Logsumexp: -inf and NaN must match exactly; finite values to
// max(abs_tol, rel_tol·max(1, |ref|)).
inline ::testing::AssertionResult lse_near(const Tensor& got, const Tensor& ref,
                                           double rel_tol = kLseTol, double abs_tol = 0.0) {
  if (got.numel() != ref.numel()) return ::testing::AssertionFailure() << "shape mismatch";
  std::int64_t bad = 0;
  double max_err = 0.0;
  std::ostringstream first;
  ref.for_each([&](auto a, auto b, auto c, auto d) {
    const float g = got.get(a, b, c, d), r = ref.get(a, b, c, d);
    const double bound = std::max(abs_tol, rel_tol * std::max(1.0, std::fabs(static_cast<double>(r))));
    if (element_matches(g, r, bound, max_err)) return;
    if (bad++ < kListedMismatches) list_mismatch(first, "lse at ", got, g, r, a, b, c, d);
  });
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad << " of " << got.numel()
                                       << " logsumexp values differ (max finite abs error "
                                       << max_err << ")" << first.str();
}

// Bit-for-bit equality of two outputs (any layouts, same logical shape).
inline ::testing::AssertionResult bitwise_equal(const Tensor& a, const Tensor& b) {
  std::int64_t bad = 0;
  std::ostringstream first;
  a.for_each([&](auto i, auto j, auto k, auto l) {
    const float x = a.get(i, j, k, l), y = b.get(i, j, k, l);
    if (to_bits(x) == to_bits(y)) return;
    if (bad++ < kListedMismatches)
      first << "\n  at " << index_string(a, i, j, k, l) << ": " << x << " vs " << y;
  });
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad << " elements differ" << first.str();
}

// Storage outside the view must still hold the poison: nothing was written there.
inline ::testing::AssertionResult outside_view_untouched(const Tensor& t, Poison kind = Poison::host) {
  const std::vector<char> in = t.coverage();
  std::int64_t bad = 0, first = 0;
  for (std::int64_t e = 0; e < t.storage_elements(); ++e)
    if (!in[static_cast<std::size_t>(e)] && !t.holds_poison(e, kind)) {
      if (bad == 0) first = e;
      ++bad;
    }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad << " storage elements outside the view were written"
                                       << " (first at storage offset " << first << ": "
                                       << t.element(first) << ")";
}

// Every storage element still holds the poison (a failed call touched nothing).
inline ::testing::AssertionResult all_poison(const Tensor& t, Poison kind = Poison::host) {
  for (std::int64_t e = 0; e < t.storage_elements(); ++e)
    if (!t.holds_poison(e, kind))
      return ::testing::AssertionFailure() << "storage element " << e << " was written";
  return ::testing::AssertionSuccess();
}

// Inputs must not be modified: storage (view and padding) byte-identical to a snapshot.
inline ::testing::AssertionResult unchanged(const Tensor& now, const Tensor& before) {
  if (!now.same_bytes(before)) return ::testing::AssertionFailure() << "an input tensor was modified";
  return ::testing::AssertionSuccess();
}

// call() throws fattn::Error with `part` in its message.
inline void expect_error(const std::function<void()>& call, const std::string& part) {
  try {
    call();
    ADD_FAILURE() << "no error; expected one mentioning '" << part << "'";
  } catch (const fattn::Error& e) {
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

}  // namespace fattn_test
