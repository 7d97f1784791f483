// fattn tests — the online softmax of src/cpu/common/online_softmax.hpp, in both tile layouts and
// as scalars, against float64: rows fed key tile by key tile (random scores in log2 units,
// some −inf, rows that see no key for a while or never) end with the float64 max and
// sum of 2^(s − max), and each tile's probabilities and rescale are the float64 ones of
// the running state; the two layouts give the same max and probabilities bit for bit
// (the same exp2). Compiled at the portable width (Simd<16>) in the exp2 test binary.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "cpu/common/online_softmax.hpp"

namespace fattn_test {
namespace {

using S = fattn::cpu::Simd<16>;
using Softmax = fattn::cpu::OnlineSoftmax<S>;
constexpr int kVecs = 2;                 // vectors per tile row: NV = KV = 2
constexpr int kWidth = kVecs * S::lanes;  // rows per lanes tile, keys per row tile
constexpr int kTiles = 5;
// Bounds relative to the float64 value of 2^x: exp2's 1.5e-7, and float32's rounding of
// x = s − ref itself (half an ulp of x: ln 2 · 2^−24 · |x| ≈ 4.2e-8 · |x|).
// A hidden score (x = −inf) has weight exactly 0.
::testing::AssertionResult weight_near(float got, double want, double x) {
  if (std::isinf(x) && x < 0) {
    if (got == 0.0f) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << got << " for a hidden score, not 0";
  }
  const double bound = (2e-7 + 5e-8 * std::fabs(x)) * want;
  if (std::fabs(got - want) <= bound) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << got << " vs " << want << " (x = " << x << ")";
}
constexpr double kRelSum = 3e-6;  // the running sums, over tiles of kWidth terms
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// The row form's reductions across the lanes, written plainly (the decode kernel's are
// shuffle trees: DecodeOps).
struct Across {
  static float max_of(S::vec x) {
    float m = x[0];
    for (int i = 1; i < S::lanes; ++i) m = std::max(m, x[i]);
    return m;
  }
  static float sum_of(S::vec x) {
    float s = 0.0f;
    for (int i = 0; i < S::lanes; ++i) s += x[i];
    return s;
  }
};

// scores[t][j][i]: tile t, key j, row i. Row 1 sees no key until tile 2, row 2 none at
// all; other scores −inf one time in 6.
std::vector<float> make_scores(std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 6.0f);
  std::uniform_int_distribution<int> die(0, 5);
  std::vector<float> s(kTiles * kWidth * kWidth);
  for (int t = 0; t < kTiles; ++t)
    for (int j = 0; j < kWidth; ++j)
      for (int i = 0; i < kWidth; ++i) {
        const bool hidden = (i == 1 && t < 2) || i == 2 || die(rng) == 0;
        s[(t * kWidth + j) * kWidth + i] = hidden ? kNegInf : normal(rng) + 3.0f * t;
      }
  return s;
}

TEST(OnlineSoftmax, BothLayoutsMatchFloat64) {
  std::mt19937 rng(7);
  const std::vector<float> scores = make_scores(rng);
  alignas(64) float m[kWidth], l[kWidth], alpha[kWidth], st[kWidth * kWidth];
  float m_row[kWidth], l_row[kWidth];
  for (int i = 0; i < kWidth; ++i) m[i] = m_row[i] = kNegInf, l[i] = l_row[i] = 0.0f;
  std::vector<double> m64(kWidth, -INFINITY), l64(kWidth, 0.0);
  for (int t = 0; t < kTiles; ++t) {
    const float* tile = scores.data() + t * kWidth * kWidth;
    std::copy(tile, tile + kWidth * kWidth, st);
    Softmax::update_lanes<kVecs>(st, kWidth, m, l, alpha);
    for (int i = 0; i < kWidth; ++i) {
      alignas(64) float row[kWidth];  // row i's keys along the lanes
      for (int j = 0; j < kWidth; ++j) row[j] = tile[j * kWidth + i];
      float a_row;
      Softmax::update_row<kVecs, Across>(row, &m_row[i], &l_row[i], &a_row);
      double mx = m64[i];
      for (int j = 0; j < kWidth; ++j) mx = std::max(mx, static_cast<double>(tile[j * kWidth + i]));
      const double ref = std::isinf(mx) ? 0.0 : mx;
      const double a64 = std::exp2(m64[i] - ref);
      double sum = 0.0;
      for (int j = 0; j < kWidth; ++j) {
        const double p64 = std::exp2(static_cast<double>(tile[j * kWidth + i]) - ref);
        sum += p64;
        const double x = static_cast<double>(tile[j * kWidth + i]) - ref;
        EXPECT_TRUE(weight_near(st[j * kWidth + i], p64, x)) << "tile " << t << " key " << j << " row " << i;
        EXPECT_EQ(row[j], st[j * kWidth + i]) << "the layouts' probabilities";
      }
      EXPECT_TRUE(weight_near(alpha[i], a64, m64[i] - ref)) << "tile " << t << " row " << i;
      EXPECT_EQ(a_row, alpha[i]);
      l64[i] = l64[i] * a64 + sum;
      m64[i] = mx;
      EXPECT_EQ(m[i], static_cast<float>(mx));
      EXPECT_EQ(m_row[i], m[i]);
      EXPECT_NEAR(l[i], l64[i], kRelSum * l64[i]);
      EXPECT_NEAR(l_row[i], l64[i], kRelSum * l64[i]);
    }
  }
  EXPECT_EQ(m[2], kNegInf) << "a row that never saw a key";
  EXPECT_EQ(l[2], 0.0f);
  EXPECT_GT(l[1], 0.0f);
}

// The scalar form: a state joined by one more score (a sink), from a state that has seen
// no key, and from one that has.
TEST(OnlineSoftmax, ScalarJoin) {
  for (const float m0 : {kNegInf, 3.5f, -40.0f})
    for (const float s : {kNegInf, 1.25f, 60.0f}) {
      const float l0 = std::isinf(m0) ? 0.0f : 2.75f;
      float m = std::max(m0, s), l = l0;
      const float ref = Softmax::reference(m);
      const float a = Softmax::rescale(m0, ref, Softmax::weight(s, ref), &l);
      const double ref64 = std::isinf(m) ? 0.0 : m;
      const double a64 = std::exp2(m0 - ref64), l64 = l0 * a64 + std::exp2(s - ref64);
      EXPECT_NEAR(a, a64, 3e-7 * a64) << m0 << " " << s;  // std::exp2f: within an ulp
      EXPECT_NEAR(l, l64, 3e-7 * l64) << m0 << " " << s;
    }
}

}  // namespace
}  // namespace fattn_test
