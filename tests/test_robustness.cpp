// fattn tests — numerically hostile inputs: huge logits, fully masked rows, NaN in
// q / k / v, a single key, and a long sequence checked on sampled rows.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <iterator>

#include "util/checks.hpp"
#include "util/cpu_variants.hpp"
#include "util/reference.hpp"

namespace fattn_test {
namespace {

using L = Layout;
constexpr Causal kNone = Causal::none, kTL = Causal::top_left, kBR = Causal::bottom_right;

// fp32 unit roundoff, 2^-24.
constexpr double kU = 5.9604644775390625e-8;

// Largest |scale · q_i · k_j| over all (b, h, i, j), in float64 (visible or not).
double max_abs_logit(const Tensor& q, const Tensor& k, double scale) {
  double mx = 0;
  const std::int64_t group = q.size(1) / k.size(1);
  for (std::int64_t b = 0; b < q.size(0); ++b)
    for (std::int64_t h = 0; h < q.size(1); ++h)
      for (std::int64_t i = 0; i < q.size(2); ++i)
        for (std::int64_t j = 0; j < k.size(2); ++j) {
          double dot = 0;
          for (std::int64_t d = 0; d < q.size(3); ++d)
            dot += static_cast<double>(q.at(b, h, i, d)) * k.at(b, h / group, j, d);
          mx = std::max(mx, std::fabs(dot * scale));
        }
  return mx;
}

bool all_finite(const Tensor& t) {
  bool ok = true;
  t.for_each([&](auto a, auto b, auto c, auto d) { ok = ok && std::isfinite(t.at(a, b, c, d)); });
  return ok;
}

class RobustnessTest : public ::testing::TestWithParam<Variant> {
 protected:
  void SetUp() override { FATTN_SKIP_IF_UNSUPPORTED(GetParam().isa); }
  Options options(Causal causal = kNone) const {
    Options o;
    o.impl = GetParam().impl;
    o.isa = GetParam().isa;
    o.causal = causal;
    return o;
  }
  struct Run {
    Tensor out, lse;
  };
  Run run(const Tensor& q, const Tensor& k, const Tensor& v, const Options& o) const {
    Run r{make_output(L::bhsd, q.size(0), q.size(1), q.size(2), q.size(3)),
          make_lse(LseLayout::contiguous, q.size(0), q.size(1), q.size(2))};
    fattn::attention_forward(q.view(), k.view(), v.view(), r.out.view(), r.lse.view_ptr(), o);
    return r;
  }
};

// Error bound for huge logits. The reference computes every logit exactly (float64
// products of float32 inputs); a float32 kernel cannot: it rounds q·scale·log2(e)
// (two roundings per element), accumulates the D-term dot product in float32 and
// subtracts the running max, so each logit carries an absolute error of about
// k·u·max|logit| (u = 2^-24 ≈ 6e-8), with k growing like sqrt(D) for random data
// (like D in the worst case). A logit error δ scales its probability by e^δ ≈ 1 + δ,
// which moves the output by at most 2·δ·max|v| (|v| <~ 4.5 for N(0,1) data) and the
// logsumexp by about δ; the float32 logsumexp itself is rounded to half an ulp of
// 1e4, i.e. ~0.8·u·1e4.
// So we expect |err| <= C · 6e-8 · max|logit|, the same C for the output and the
// logsumexp. Measured on all six kernels: C ≈ 8 (HugeLogitsOffset, outputs and
// logsumexp alike) and C ≈ 1.3 (HugeLogitsSpread, where softmax is nearly one-hot).
// C = 64 leaves a margin of 8 over the worst measured case and matches the a-priori
// estimate k·2·max|v| with k ≈ sqrt(64) = 8 and 2·max|v| ≈ 8 ... 9; at max|logit| = 1e4
// it is 0.038 absolute — far below an O(1) failure (a wrong or missing max, an
// overflow, a lost row), while logits computed with less than float32 precision
// (e.g. a float16 dot product, u = 2^-11) would exceed it by far.
constexpr double kLogitC = 64.0;

// Logits spread over [-1e4, 1e4]: each row is dominated by its largest logit,
// and a naive exp(logit) would overflow to inf.
TEST_P(RobustnessTest, HugeLogitsSpread) {
  Rng rng;
  const std::int64_t B = 1, H = 2, S = 200, D = 64;
  Tensor q = make_input(L::bhsd, B, H, S, D, rng, 40.0f);
  const Tensor k = make_input(L::bhsd, B, H, S, D, rng, 40.0f);
  const Tensor v = make_input(L::bhsd, B, H, S, D, rng);
  const double scale = default_scale(D);
  const double stretch = 1e4 / max_abs_logit(q, k, scale);  // max|logit| = 1e4 exactly-ish
  q.for_each([&](auto b, auto h, auto s, auto d) { q.at(b, h, s, d) *= static_cast<float>(stretch); });
  const double max_logit = max_abs_logit(q, k, scale);
  ASSERT_GT(max_logit, 0.99e4);
  ASSERT_LT(max_logit, 1.01e4);

  for (Causal causal : {kNone, kBR}) {
    SCOPED_TRACE(to_string(causal));
    const Result ref = run_reference(q, k, v, options(causal));
    ASSERT_TRUE(all_finite(ref.out));
    const Run got = run(q, k, v, options(causal));
    EXPECT_TRUE(all_finite(got.out)) << "Inf/NaN where the reference has none";
    EXPECT_TRUE(all_finite(got.lse));
    EXPECT_TRUE(outputs_near(got.out, ref.out, kLogitC * kU * max_logit));
    EXPECT_TRUE(lse_near(got.lse, ref.lse, 0.0, kLogitC * kU * max_logit));
  }
}

// Every logit of a row within a few units of +1e4 (or of -1e4, alternating rows):
// the softmax must subtract the row max, and the O(1) differences between keys
// must survive float32 logits of magnitude 1e4 (ulp ≈ 1e-3). The probabilities
// are spread over many keys, so here the logit rounding really shows in the output.
TEST_P(RobustnessTest, HugeLogitsOffset) {
  Rng rng;
  const std::int64_t B = 1, H = 2, S = 150, D = 64;
  Tensor q = make_input(L::bhsd, B, H, S, D, rng, 3.0f);
  Tensor k = make_input(L::bhsd, B, H, S, D, rng);
  const Tensor v = make_input(L::bhsd, B, H, S, D, rng);
  // Dimension 0 carries the offset: scale · (±800) · 100 = ±1e4 for scale = 1/8.
  q.for_each([&](auto b, auto h, auto s, auto d) {
    if (d == 0) q.at(b, h, s, d) = s % 2 ? -800.0f : 800.0f;
  });
  k.for_each([&](auto b, auto h, auto s, auto d) {
    if (d == 0) k.at(b, h, s, d) = 100.0f;
  });
  const double max_logit = max_abs_logit(q, k, default_scale(D));
  ASSERT_GT(max_logit, 0.99e4);
  ASSERT_LT(max_logit, 1.01e4);

  for (Causal causal : {kNone, kTL}) {
    SCOPED_TRACE(to_string(causal));
    const Result ref = run_reference(q, k, v, options(causal));
    ASSERT_TRUE(all_finite(ref.out));
    const Run got = run(q, k, v, options(causal));
    EXPECT_TRUE(all_finite(got.out)) << "Inf/NaN where the reference has none";
    EXPECT_TRUE(all_finite(got.lse));
    EXPECT_TRUE(outputs_near(got.out, ref.out, kLogitC * kU * max_logit));
    EXPECT_TRUE(lse_near(got.lse, ref.lse, 0.0, kLogitC * kU * max_logit));
  }
}

// Large logits (q, k ~ 4·N(0,1), scale 0.3: scores of 15-200 in magnitude, each row's
// softmax nearly one-hot). A row's logsumexp is then its largest score, so the RMS of the
// logsumexp's error over the rows, in units of u·RMS|lse|, measures how a kernel sums a
// score's products over the head dim (plus the logsumexp's own roundings). The shapes take
// each score path of the decode kernel: one row per kv head (on AVX-512 its direct scores,
// 16 lane partials and a tree), 24 rows (keys along the lanes, the transposed key tile) and
// 64 rows (query rows along the lanes: TileOps::scores_block, as in the fused and naive
// kernels). dev-zen5, every kernel and ISA, 8 seeds (FATTN_TEST_SEED): 0.84-1.35 with the
// chains summed pairwise (cpu/common/blocks.hpp, sum_chains), the direct scores alike; one chain
// per score, or chains of 128 dims added in turn, up to 2.2 / 2.8 / 2.6 at D = 48 / 100 /
// 256 (every kernel but the direct scores over 1.6 at those), 1.0-1.6 at D = 16.
constexpr double kScoreSumBound = 1.6;

TEST_P(RobustnessTest, LargeLogitsScoreSums) {
  if (GetParam().isa == Isa::amx)  // not measured: dev-zen5 has no AMX
    GTEST_SKIP() << "the amx kernels sum six bfloat16 partial products in the tile unit";
  struct Shape {
    std::int64_t sq, hq, hkv;
  };
  Rng rng;
  for (const Shape shape : {Shape{1, 128, 128}, Shape{3, 64, 8}, Shape{16, 16, 4}})
    for (const std::int64_t D : {16, 48, 100, 256}) {
      SCOPED_TRACE(::testing::Message() << "Sq " << shape.sq << ", Hq " << shape.hq << ", Hkv "
                                        << shape.hkv << ", D " << D);
      const std::int64_t Sk = 256;
      const Tensor q = make_input(L::bhsd, 1, shape.hq, shape.sq, D, rng, 4.0f);
      const Tensor k = make_input(L::bhsd, 1, shape.hkv, Sk, D, rng, 4.0f);
      const Tensor v = make_input(L::bhsd, 1, shape.hkv, Sk, D, rng);
      Options o = options();
      o.scale = 0.3;
      const Result ref = run_reference(q, k, v, o);
      const Run got = run(q, k, v, o);
      double err2 = 0, lse2 = 0, rows = 0;
      ref.lse.for_each([&](auto b, auto h, auto i, auto) {
        const double want = ref.lse.at(b, h, i), e = got.lse.at(b, h, i) - want;
        err2 += e * e;
        lse2 += want * want;
        rows += 1;
      });
      EXPECT_LE(std::sqrt(err2 / rows) / (kU * std::sqrt(lse2 / rows)), kScoreSumBound);
    }
}

// bottom_right with Sq > Sk: the first Sq - Sk rows see no key — output exactly 0
// and logsumexp exactly -inf, even when their queries hold NaN or huge values.
TEST_P(RobustnessTest, FullyMaskedRows) {
  Rng rng;
  for (auto [Sq, Sk] : {std::pair<std::int64_t, std::int64_t>{40, 8}, {20, 1}, {70, 33}}) {
    SCOPED_TRACE(::testing::Message() << "Sq " << Sq << " Sk " << Sk);
    Tensor q = make_input(L::bhsd, 1, 2, Sq, 32, rng);
    const Tensor k = make_input(L::bhsd, 1, 2, Sk, 32, rng);
    const Tensor v = make_input(L::bhsd, 1, 2, Sk, 32, rng);
    q.at(0, 0, 0, 3) = kNaN;  // masked rows: their scores never count
    q.at(0, 1, 1, 5) = 1e30f;
    const Result ref = run_reference(q, k, v, options(kBR));
    const Run got = run(q, k, v, options(kBR));
    for (std::int64_t h = 0; h < 2; ++h)
      for (std::int64_t i = 0; i < Sq - Sk; ++i) {
        ASSERT_EQ(got.lse.at(0, h, i), -kInf) << "row " << i;
        ASSERT_EQ(ref.lse.at(0, h, i), -kInf) << "row " << i;
        for (std::int64_t d = 0; d < 32; ++d) ASSERT_EQ(got.out.at(0, h, i, d), 0.0f) << "row " << i;
      }
    EXPECT_TRUE(outputs_near(got.out, ref.out));
    EXPECT_TRUE(lse_near(got.lse, ref.lse));
  }
}

// A NaN in one query row: that row is all NaN (output and logsumexp) in the reference
// and the kernels; every other row is finite and correct.
TEST_P(RobustnessTest, NaNInOneQueryRow) {
  Rng rng;
  const std::int64_t S = 100, D = 64, bad_row = 37;
  Tensor q = make_input(L::bhsd, 1, 2, S, D, rng);
  const Tensor k = make_input(L::bhsd, 1, 2, S, D, rng);
  const Tensor v = make_input(L::bhsd, 1, 2, S, D, rng);
  q.at(0, 1, bad_row, 10) = kNaN;
  for (Causal causal : {kNone, kTL}) {
    SCOPED_TRACE(to_string(causal));
    const Result ref = run_reference(q, k, v, options(causal));
    const Run got = run(q, k, v, options(causal));
    for (std::int64_t h = 0; h < 2; ++h)
      for (std::int64_t i = 0; i < S; ++i) {
        const bool nan_row = h == 1 && i == bad_row;
        EXPECT_EQ(std::isnan(ref.lse.at(0, h, i)), nan_row) << "reference lse row " << i;
        EXPECT_EQ(std::isnan(got.lse.at(0, h, i)), nan_row) << "lse row " << i;
        for (std::int64_t d = 0; d < D; ++d) {
          EXPECT_EQ(std::isnan(ref.out.at(0, h, i, d)), nan_row) << "reference " << h << "," << i << "," << d;
          ASSERT_EQ(std::isnan(got.out.at(0, h, i, d)), nan_row) << h << "," << i << "," << d;
        }
      }
    EXPECT_TRUE(outputs_near(got.out, ref.out));  // NaN where ref is NaN, close elsewhere
    EXPECT_TRUE(lse_near(got.lse, ref.lse));
  }
}

// A NaN in one key: every row that sees it is NaN; with a causal mask, rows that
// do not see it (including rows in the same query tile) are finite and correct.
TEST_P(RobustnessTest, NaNInOneKeyRow) {
  Rng rng;
  const std::int64_t S = 100, D = 64, bad_key = 37;
  const Tensor q = make_input(L::bhsd, 1, 2, S, D, rng);
  Tensor k = make_input(L::bhsd, 1, 2, S, D, rng);
  const Tensor v = make_input(L::bhsd, 1, 2, S, D, rng);
  k.at(0, 0, bad_key, 20) = kNaN;
  for (Causal causal : {kNone, kTL}) {
    SCOPED_TRACE(to_string(causal));
    const Result ref = run_reference(q, k, v, options(causal));
    const Run got = run(q, k, v, options(causal));
    for (std::int64_t i = 0; i < S; ++i) {
      const bool sees = causal == kNone || i >= bad_key;
      EXPECT_EQ(std::isnan(ref.out.at(0, 0, i, 0)), sees) << "reference row " << i;
      EXPECT_EQ(std::isnan(got.out.at(0, 0, i, 0)), sees) << "row " << i;
      EXPECT_EQ(std::isnan(got.lse.at(0, 0, i)), sees) << "lse row " << i;
      EXPECT_FALSE(std::isnan(got.out.at(0, 1, i, 0))) << "head 1 has no NaN key; row " << i;
    }
    EXPECT_TRUE(outputs_near(got.out, ref.out));
    EXPECT_TRUE(lse_near(got.lse, ref.lse));
  }
}

// A NaN in the value of one key: rows that see the key are NaN; rows that cannot
// see it (causal) must not be affected — a masked key contributes nothing, as in
// the reference, which only sums over visible keys.
TEST_P(RobustnessTest, NaNInOneValueRowOfAMaskedKey) {
  Rng rng;
  const std::int64_t S = 100, D = 64, bad_key = 37;
  const Tensor q = make_input(L::bhsd, 1, 1, S, D, rng);
  const Tensor k = make_input(L::bhsd, 1, 1, S, D, rng);
  Tensor v = make_input(L::bhsd, 1, 1, S, D, rng);
  v.at(0, 0, bad_key, 20) = kNaN;
  const Result ref = run_reference(q, k, v, options(kTL));
  const Run got = run(q, k, v, options(kTL));
  std::string ref_wrong, got_wrong;  // rows whose NaN-ness is wrong
  for (std::int64_t i = 0; i < S; ++i) {
    if (std::isnan(ref.out.at(0, 0, i, 20)) != (i >= bad_key)) ref_wrong += " " + std::to_string(i);
    if (std::isnan(got.out.at(0, 0, i, 20)) != (i >= bad_key)) got_wrong += " " + std::to_string(i);
  }
  EXPECT_EQ(ref_wrong, "") << "reference rows with the wrong NaN-ness (key " << bad_key << ")";
  EXPECT_EQ(got_wrong, "") << "rows with the wrong NaN-ness (only rows >= " << bad_key << " see the NaN)";
  EXPECT_TRUE(outputs_near(got.out, ref.out));
  EXPECT_TRUE(lse_near(got.lse, ref.lse));
}

// The same through rows that see no key at all (bottom_right, Sq > Sk): their
// output is documented as 0 whatever the keys and values hold.
TEST_P(RobustnessTest, NaNValueDoesNotReachRowsThatSeeNoKey) {
  Rng rng;
  const std::int64_t Sq = 20, Sk = 4, D = 32;
  const Tensor q = make_input(L::bhsd, 1, 1, Sq, D, rng);
  const Tensor k = make_input(L::bhsd, 1, 1, Sk, D, rng);
  Tensor v = make_input(L::bhsd, 1, 1, Sk, D, rng);
  v.at(0, 0, 0, 7) = kNaN;  // key 0: seen by rows 16..19 only
  const Result ref = run_reference(q, k, v, options(kBR));
  const Run got = run(q, k, v, options(kBR));
  std::string wrong;
  for (std::int64_t i = 0; i < Sq - Sk; ++i)
    if (got.out.at(0, 0, i, 7) != 0.0f) wrong += " " + std::to_string(i);
  EXPECT_EQ(wrong, "") << "rows 0.." << Sq - Sk - 1 << " see no key: output must be 0";
  EXPECT_TRUE(outputs_near(got.out, ref.out));
  EXPECT_TRUE(lse_near(got.lse, ref.lse));
}

// One key: the softmax is exactly 1, the output is that key's value and the
// logsumexp its logit. Also Sq = Sk = 1 under each causal mode.
TEST_P(RobustnessTest, SingleKey) {
  Rng rng;
  for (Causal causal : {kNone, kTL, kBR}) {
    SCOPED_TRACE(to_string(causal));
    const std::int64_t Sq = causal == kNone ? 9 : 1, D = 48;
    const Tensor q = make_input(L::bhsd, 2, 2, Sq, D, rng);
    const Tensor k = make_input(L::bhsd, 2, 2, 1, D, rng);
    const Tensor v = make_input(L::bhsd, 2, 2, 1, D, rng);
    const Run got = run(q, k, v, options(causal));
    const Result ref = run_reference(q, k, v, options(causal));
    EXPECT_TRUE(outputs_near(got.out, ref.out));
    EXPECT_TRUE(lse_near(got.lse, ref.lse));
    for (std::int64_t b = 0; b < 2; ++b)
      for (std::int64_t h = 0; h < 2; ++h)
        for (std::int64_t i = 0; i < Sq; ++i) {
          double logit = 0;
          for (std::int64_t d = 0; d < D; ++d)
            logit += static_cast<double>(q.at(b, h, i, d)) * k.at(b, h, 0, d);
          logit *= default_scale(D);
          EXPECT_NEAR(got.lse.at(b, h, i), logit, 1e-5 * std::max(1.0, std::fabs(logit)));
          for (std::int64_t d = 0; d < D; ++d)
            ASSERT_NEAR(got.out.at(b, h, i, d), v.at(b, h, 0, d), 1e-6) << b << h << i << d;
        }
  }
}

// Denormal and tiny inputs, and values on the bfloat16 rounding boundaries: the AMX
// kernels split every float32 into three bfloat16 parts, exactly only for normal
// numbers; a denormal's parts keep bits below 16 that must not leak into the
// neighbouring key's half of a VNNI pair (found: one row off by 1e30 when the naive
// path's normalised probabilities went denormal).
TEST_P(RobustnessTest, DenormalAndBoundaryInputs) {
  Rng rng;
  const std::int64_t B = 1, H = 2, S = 77, D = 64;
  Tensor q = make_input(L::bhsd, B, H, S, D, rng);
  Tensor k = make_input(L::bhsd, B, H, S, D, rng);
  Tensor v = make_input(L::bhsd, B, H, S, D, rng);
  const float specials[] = {1e-39f, -3e-42f, 1.4e-45f, 1.17549435e-38f, 1.00390625f /* 1 + 2^-8 */,
                            -1.0039063f, 3.0e-30f, 0.0f, -0.0f};
  std::int64_t n = 0;
  for (Tensor* t : {&q, &k, &v})
    t->for_each([&](auto b, auto h, auto s, auto d) {
      if ((s * 7 + d * 3 + h) % 5 == 0) t->at(b, h, s, d) = specials[n++ % std::size(specials)];
    });
  for (Causal causal : {kNone, kTL}) {
    SCOPED_TRACE(to_string(causal));
    const Result ref = run_reference(q, k, v, options(causal));
    const Run got = run(q, k, v, options(causal));
    EXPECT_TRUE(outputs_near(got.out, ref.out));
    EXPECT_TRUE(lse_near(got.lse, ref.lse));
  }
}

INSTANTIATE_TEST_SUITE_P(Kernels, RobustnessTest, ::testing::ValuesIn(forward_variants()),
                         [](const auto& param_info) { return variant_name(param_info.param); });

// S = 16384, B = H = 1, D = 64, fused kernel on the best ISA: 64 sampled rows
// (both ends, query-tile edges, random) against fattn::reference_row.
class LongSequenceTest : public ::testing::TestWithParam<Causal> {};

TEST_P(LongSequenceTest, SampledRowsMatchReference) {
  const std::int64_t S = 16384, D = 64;
  Rng rng;
  const Tensor q = make_input(L::bhsd, 1, 1, S, D, rng);
  const Tensor k = make_input(L::bhsd, 1, 1, S, D, rng);
  const Tensor v = make_input(L::bshd, 1, 1, S, D, rng);
  Options o;
  o.impl = Impl::fused;
  o.causal = GetParam();
  Tensor out = make_output(L::bhsd, 1, 1, S, D);
  Tensor lse = make_lse(LseLayout::contiguous, 1, 1, S);
  fattn::attention_forward(q.view(), k.view(), v.view(), out.view(), lse.view_ptr(), o);

  std::vector<std::int64_t> rows = {0, 1, 2, 7, 8, 15, 16, 31, 32, 33, 191, 192, 193,
                                    S / 2, S - 193, S - 33, S - 32, S - 2, S - 1};
  while (rows.size() < 64) rows.push_back(rng.index(S));
  std::vector<double> want(static_cast<std::size_t>(D));
  for (std::int64_t i : rows) {
    SCOPED_TRACE(::testing::Message() << "row " << i);
    const double want_lse = fattn::reference_row(q.view(), k.view(), v.view(), o, 0, 0, i, want.data());
    double max_ref = 1.0;
    for (double w : want) max_ref = std::max(max_ref, std::fabs(w));
    EXPECT_NEAR(lse.at(0, 0, i), want_lse, kLseTol * std::max(1.0, std::fabs(want_lse)));
    for (std::int64_t d = 0; d < D; ++d)
      ASSERT_NEAR(out.at(0, 0, i, d), want[static_cast<std::size_t>(d)], kOutTol * max_ref) << "dim " << d;
  }
  // Nothing left unwritten anywhere.
  std::int64_t poisoned = 0;
  out.for_each([&](auto a, auto b, auto c, auto d) { poisoned += to_bits(out.at(a, b, c, d)) == kPoisonBits; });
  EXPECT_EQ(poisoned, 0);
  EXPECT_TRUE(all_finite(out));
}

INSTANTIATE_TEST_SUITE_P(Fused, LongSequenceTest, ::testing::Values(kNone, kBR),
                         [](const auto& param_info) { return std::string(fattn::to_string(param_info.param)); });


// The AMX kernels run on finite inputs (their float32 results differ in the last bits
// from the FMA kernels', within the same bound of the reference) and hand inputs with a
// NaN or Inf to the AVX-512 kernels (then the same bits). With 2 heads the fused kernel
// splits every head's K and V first; with 8 (≥ 4 per worker) each worker splits its
// head's own, and an Inf found there makes the whole call run again on avx512.
TEST(Amx, RunsOnFiniteInputsAndFallsBackOnNonFinite) {
  FATTN_SKIP_IF_UNSUPPORTED(Isa::amx);
  for (std::int64_t H : {1, 4}) {
    SCOPED_TRACE(::testing::Message() << "heads " << 2 * H);
    Rng rng;
    const std::int64_t B = 2, S = 130, D = 64;
    const Tensor q = make_input(L::bhsd, B, H, S, D, rng);
    const Tensor k = make_input(L::bhsd, B, H, S, D, rng);
    Tensor v = make_input(L::bhsd, B, H, S, D, rng);
    auto run_isa = [&](Isa isa, Impl impl) {
      Tensor out = make_output(L::bhsd, B, H, S, D);
      Options o;
      o.isa = isa;
      o.impl = impl;
      o.num_threads = 2;
      fattn::attention_forward(q.view(), k.view(), v.view(), out.view(), nullptr, o);
      return out;
    };
    auto bitwise_equal = [](const Tensor& a, const Tensor& b) {
      bool same = true;
      a.for_each([&](auto i, auto j, auto s, auto d) {
        const float x = a.at(i, j, s, d), y = b.at(i, j, s, d);
        same = same && std::memcmp(&x, &y, sizeof(float)) == 0;
      });
      return same;
    };
    for (Impl impl : {Impl::fused, Impl::naive}) {
      SCOPED_TRACE(to_string(impl));
      v.at(1, H - 1, 40, 7) = 0.5f;
      const Tensor amx = run_isa(Isa::amx, impl), fma = run_isa(Isa::avx512, impl);
      EXPECT_FALSE(bitwise_equal(amx, fma)) << "the amx kernel did not run";
      EXPECT_TRUE(outputs_near(amx, run_reference(q, k, v, Options{}).out));
      v.at(1, H - 1, 40, 7) = kInf;  // the last head: found after others were computed
      EXPECT_TRUE(bitwise_equal(run_isa(Isa::amx, impl), run_isa(Isa::avx512, impl)));
    }
  }
}

}  // namespace
}  // namespace fattn_test
