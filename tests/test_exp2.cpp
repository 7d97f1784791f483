// fattn tests — the vectorised exp2 of src/cpu/common/exp2.hpp against its documented bound:
//   x in [-126, 127]:  |exp2(x) - 2^x| <= 1.5e-7 · 2^x
//   x < -126.5, -inf:  exactly 0
//   x > 127, +inf:     2^127 (saturates)
//   NaN:               NaN
// Tested at the portable width (Simd<16>) in this unit, built with -ffp-contract=fast
// like the kernels, on every float of [-1, 1] down to |x| = 2^-14 (and a stride
// through the rest), a dense step sweep of [-130, 130], every rounding boundary
// n ± 1/2, and 1e6 random points; plus the same bound through the AVX2 and AVX-512
// builds of the function (exp2_isa.cpp, with those units' flags) where the CPU has them.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "cpu/common/exp2.hpp"
#include "fattn/fattn.hpp"

namespace fattn_test {
// Defined in exp2_isa.cpp, one per instruction set (x86-64 only).
void exp2_avx2(const float* in, float* out, std::size_t n);
void exp2_avx512(const float* in, float* out, std::size_t n);
}  // namespace fattn_test

namespace {

using S = fattn::cpu::Simd<16>;
constexpr double kBound = 1.5e-7;
constexpr float kTwo127 = 0x1p127f;

void exp2_portable(const float* in, float* out, std::size_t n) {
  std::size_t i = 0;
  for (; i + S::lanes <= n; i += S::lanes) S::store(out + i, fattn::cpu::exp2<S>(S::load(in + i)));
  if (i < n) {
    float buf[S::lanes] = {};
    std::memcpy(buf, in + i, (n - i) * sizeof(float));
    S::store(buf, fattn::cpu::exp2<S>(S::load(buf)));
    std::memcpy(out + i, buf, (n - i) * sizeof(float));
  }
}

using Exp2Fn = void (*)(const float*, float*, std::size_t);

float exp2_one(Exp2Fn fn, float x) {
  float y;
  fn(&x, &y, 1);
  return y;
}

// Checks the documented bound on a batch of inputs (each in [-126, 127]) and keeps
// the worst relative error seen.
class BoundChecker {
 public:
  explicit BoundChecker(Exp2Fn fn) : fn_(fn) {}
  void add(float x) {
    in_.push_back(x);
    if (in_.size() == 1 << 16) flush();
  }
  void flush() {
    out_.resize(in_.size());
    fn_(in_.data(), out_.data(), in_.size());
    for (std::size_t e = 0; e < in_.size(); ++e) {
      const double want = std::exp2(static_cast<double>(in_[e]));
      const double rel = std::fabs(static_cast<double>(out_[e]) - want) / want;
      ++count_;
      if (!(rel <= worst_)) {  // NaN counts as worst
        worst_ = std::isnan(rel) ? std::numeric_limits<double>::infinity() : rel;
        worst_x_ = in_[e];
        worst_y_ = out_[e];
      }
    }
    in_.clear();
  }
  ::testing::AssertionResult within_bound() {
    flush();
    if (count_ == 0) return ::testing::AssertionFailure() << "no points checked";
    if (worst_ <= kBound) return ::testing::AssertionSuccess() << "worst " << worst_;
    return ::testing::AssertionFailure()
           << "relative error " << worst_ << " > " << kBound << " at x = " << worst_x_
           << " (got " << worst_y_ << ", want " << std::exp2(static_cast<double>(worst_x_)) << ")";
  }
  double worst() const { return worst_; }
  std::int64_t count() const { return count_; }

 private:
  Exp2Fn fn_;
  std::vector<float> in_, out_;
  std::int64_t count_ = 0;
  double worst_ = 0.0;
  float worst_x_ = 0, worst_y_ = 0;
};

// Every rounding boundary n ± 1/2 (where the reduced argument flips sign), a few
// ulps either side, and the integers and range ends themselves.
void add_boundaries(BoundChecker& c) {
  for (int n = -126; n <= 127; ++n)
    for (float centre : {n - 0.5f, static_cast<float>(n), n + 0.5f}) {
      float x = centre;
      for (int s = 0; s < 8; ++s) x = std::nextafter(x, -1e9f);
      for (int s = 0; s < 17; ++s, x = std::nextafter(x, 1e9f))
        if (x >= -126.0f && x <= 127.0f) c.add(x);
    }
}

void add_random(BoundChecker& c, std::uint64_t seed, int n) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> uniform(-126.0, 127.0);
  for (int e = 0; e < n; ++e) c.add(static_cast<float>(uniform(rng)));
  // Random bit patterns: every exponent equally likely, within the range.
  std::uniform_int_distribution<std::uint32_t> bits;
  for (int e = 0; e < n / 4;) {
    const float x = std::bit_cast<float>(bits(rng));
    if (x >= -126.0f && x <= 127.0f) c.add(x), ++e;
  }
}

TEST(Exp2, EveryFloatNearZero) {
  // Every float in [-1, 1] with |x| >= 2^-14 (about 235 million), and every 61st
  // float pattern below that, down to 0.
  BoundChecker c(exp2_portable);
  const std::uint32_t lo = std::bit_cast<std::uint32_t>(0x1p-14f), one = std::bit_cast<std::uint32_t>(1.0f);
  for (std::uint32_t b = lo; b <= one; ++b) {
    const float x = std::bit_cast<float>(b);
    c.add(x);
    c.add(-x);
  }
  for (std::uint32_t b = 0; b < lo; b += 61) {
    const float x = std::bit_cast<float>(b);
    c.add(x);
    c.add(-x);
  }
  EXPECT_TRUE(c.within_bound());
  EXPECT_GT(c.count(), 200'000'000);
  ::testing::Test::RecordProperty("worst_relative_error", std::to_string(c.worst()));
}

TEST(Exp2, DenseSweepOfTheRange) {
  // [-126, 127] in steps of 2^-12 (about a million points).
  BoundChecker c(exp2_portable);
  for (double x = -126.0; x <= 127.0; x += 0x1p-12) c.add(static_cast<float>(x));
  add_boundaries(c);
  EXPECT_TRUE(c.within_bound());
}

TEST(Exp2, RandomPoints) {
  BoundChecker c(exp2_portable);
  add_random(c, 0x5eed'e2e2, 1'000'000);
  EXPECT_TRUE(c.within_bound());
}

TEST(Exp2, ExactlyZeroBelowMinus126AndAHalf) {
  std::vector<float> xs = {-std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::max(),
                           -1e30f, -1e6f, -1000.0f, -200.0f, -150.0f, -128.0f, -127.5f, -127.0f};
  // Every float in [-130, -126.5).
  for (float x = std::nextafter(-126.5f, -1e9f); x >= -130.0f; x = std::nextafter(x, -1e9f)) xs.push_back(x);
  std::vector<float> ys(xs.size(), -1.0f);
  exp2_portable(xs.data(), ys.data(), xs.size());
  std::int64_t bad = 0;
  for (std::size_t e = 0; e < xs.size(); ++e)
    if (ys[e] != 0.0f) {
      if (bad++ < 5) ADD_FAILURE() << "exp2(" << xs[e] << ") = " << ys[e] << ", want 0";
    }
  EXPECT_EQ(bad, 0);
  EXPECT_GT(xs.size(), 320'000u);  // 1.5·2^17 + 2·2^16 floats
}

TEST(Exp2, SaturatesAbove127) {
  for (float x : {std::nextafter(127.0f, 1e9f), 127.5f, 128.0f, 1000.0f, 1e30f,
                  std::numeric_limits<float>::max(), std::numeric_limits<float>::infinity()})
    EXPECT_EQ(exp2_one(exp2_portable, x), kTwo127) << "x = " << x;
}

TEST(Exp2, NaNGivesNaN) {
  for (std::uint32_t bits : {0x7fc00000u, 0xffc00000u, 0x7fc0beefu, 0x7f800001u, 0xff812345u})
    EXPECT_TRUE(std::isnan(exp2_one(exp2_portable, std::bit_cast<float>(bits))))
        << std::hex << "bits 0x" << bits;
}

// Lanes are independent: special values in some lanes do not disturb the others.
TEST(Exp2, LanesAreIndependent) {
  const float specials[] = {std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::infinity(), -300.0f, 0.25f, -3.75f};
  for (float special : specials)
    for (int lane = 0; lane < S::lanes; ++lane) {
      float in[S::lanes], out[S::lanes];
      for (int e = 0; e < S::lanes; ++e) in[e] = e == lane ? special : -1.3f + 0.7f * e;
      exp2_portable(in, out, S::lanes);
      for (int e = 0; e < S::lanes; ++e) {
        const float alone = exp2_one(exp2_portable, in[e]);
        if (std::isnan(alone))
          EXPECT_TRUE(std::isnan(out[e]));
        else
          EXPECT_EQ(out[e], alone) << "lane " << e << " next to " << special;
      }
    }
}

// The same bound and special values through the AVX2 and AVX-512 builds (FMA
// contracted into single roundings there), where this CPU has them.
struct IsaCase {
  fattn::Isa isa;
  Exp2Fn fn;
};

void PrintTo(const IsaCase& c, std::ostream* os) { *os << fattn::to_string(c.isa); }

class Exp2IsaTest : public ::testing::TestWithParam<IsaCase> {};

TEST_P(Exp2IsaTest, MeetsTheBound) {
  if (!fattn::cpu_supports(GetParam().isa))
    GTEST_SKIP() << "this CPU does not support isa " << fattn::to_string(GetParam().isa);
  const Exp2Fn fn = GetParam().fn;
  BoundChecker c(fn);
  for (double x = -126.0; x <= 127.0; x += 0x1p-10) c.add(static_cast<float>(x));
  for (std::uint32_t b = std::bit_cast<std::uint32_t>(0.25f); b <= std::bit_cast<std::uint32_t>(0.5f); ++b) {
    c.add(std::bit_cast<float>(b));
    c.add(-std::bit_cast<float>(b));
  }
  add_boundaries(c);
  add_random(c, 0xa5a5'1234, 1'000'000);
  EXPECT_TRUE(c.within_bound());
  EXPECT_EQ(exp2_one(fn, -126.75f), 0.0f);
  EXPECT_EQ(exp2_one(fn, -std::numeric_limits<float>::infinity()), 0.0f);
  EXPECT_EQ(exp2_one(fn, -1e30f), 0.0f);
  EXPECT_EQ(exp2_one(fn, std::numeric_limits<float>::infinity()), kTwo127);
  EXPECT_TRUE(std::isnan(exp2_one(fn, std::numeric_limits<float>::quiet_NaN())));
  // A tail shorter than a vector goes through the same code.
  std::vector<float> in(37), out(37);
  for (std::size_t e = 0; e < in.size(); ++e) in[e] = -20.0f + static_cast<float>(e);
  fn(in.data(), out.data(), in.size());
  for (std::size_t e = 0; e < in.size(); ++e)
    EXPECT_NEAR(out[e], std::exp2(static_cast<double>(in[e])), kBound * std::exp2(static_cast<double>(in[e])));
}

INSTANTIATE_TEST_SUITE_P(Isa, Exp2IsaTest,
                         ::testing::Values(
#if defined(__x86_64__)
                             IsaCase{fattn::Isa::avx2, fattn_test::exp2_avx2},
                             IsaCase{fattn::Isa::avx512, fattn_test::exp2_avx512},
#endif
                             IsaCase{fattn::Isa::portable, exp2_portable}),
                         [](const auto& param_info) { return std::string(fattn::to_string(param_info.param.isa)); });

}  // namespace
