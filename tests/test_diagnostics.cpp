// fattn — the diagnostics entry points (fattn/diagnostics.hpp).
#include <gtest/gtest.h>

#include <chrono>
#include <vector>

#include "fattn/fattn.hpp"

namespace {

TEST(NaiveStageSeconds, RecordedForNaiveCallsOnly) {
  constexpr std::int64_t kSeq = 256, kDim = 64;
  std::vector<float> q(kSeq * kDim, 0.5f), k(kSeq * kDim, 0.25f), v(kSeq * kDim, 1.0f),
      out(kSeq * kDim);
  const auto qv = fattn::TensorView::bhsd(q.data(), 1, 1, kSeq, kDim);
  const auto kv = fattn::TensorView::bhsd(k.data(), 1, 1, kSeq, kDim);
  const auto vv = fattn::TensorView::bhsd(v.data(), 1, 1, kSeq, kDim);
  const auto ov = fattn::TensorView::bhsd(out.data(), 1, 1, kSeq, kDim);
  fattn::Options options;
  options.impl = fattn::Impl::naive;

  const auto start = std::chrono::steady_clock::now();
  fattn::attention_forward(qv, kv, vv, ov, nullptr, options);
  const double call_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const fattn::NaiveStageSeconds naive = fattn::last_naive_stage_seconds();
  EXPECT_GT(naive.scores, 0.0);
  EXPECT_GT(naive.softmax, 0.0);
  EXPECT_GT(naive.output, 0.0);
  EXPECT_LE(naive.prepare + naive.scores + naive.softmax + naive.output, call_seconds);

  // A fused call leaves the naive record alone.
  options.impl = fattn::Impl::fused;
  fattn::attention_forward(qv, kv, vv, ov, nullptr, options);
  EXPECT_EQ(fattn::last_naive_stage_seconds().scores, naive.scores);
}

}  // namespace
