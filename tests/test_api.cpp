// fattn tests — the smaller parts of the public API: extra_bytes (fused working memory
// is linear in S, naive's quadratic), names and their parsing, the TensorView
// factories, and what the machine reports about itself.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "util/checks.hpp"
#include "util/cpu_variants.hpp"
#include "util/reference.hpp"

namespace fattn_test {
namespace {

using L = Layout;

// extra_bytes for a (1, 1, S, 64) self-attention problem on real buffers.
std::int64_t extra_for(std::int64_t S, Options options) {
  Rng rng(42);
  const Tensor x = make_input(L::bhsd, 1, 1, S, 64, rng);
  return fattn::extra_bytes(x.view(), x.view(), x.view(), options);
}

TEST(ExtraBytes, FusedGrowsLinearlyNaiveQuadratically) {
  for (int threads : {1, 0}) {
    for (Isa isa : {Isa::automatic, Isa::amx, Isa::avx512, Isa::avx2, Isa::portable}) {
      if (!fattn::cpu_supports(isa)) continue;
      SCOPED_TRACE(::testing::Message() << "isa " << to_string(isa) << ", threads " << threads);
      Options o;
      o.isa = isa;
      o.num_threads = threads;
      o.impl = Impl::fused;
      const std::int64_t fused_1k = extra_for(1024, o), fused_4k = extra_for(4096, o);
      o.impl = Impl::naive;
      const std::int64_t naive_1k = extra_for(1024, o), naive_4k = extra_for(4096, o);
      ASSERT_GT(fused_1k, 0);
      ASSERT_GT(naive_1k, 0);
      const double fused_ratio = static_cast<double>(fused_4k) / static_cast<double>(fused_1k);
      const double naive_ratio = static_cast<double>(naive_4k) / static_cast<double>(naive_1k);
      // Fused: K panels are O(S), per-thread tiles O(1) — 4x S gives at most ~4x.
      EXPECT_LT(fused_ratio, 5.0) << fused_1k << " -> " << fused_4k;
      EXPECT_GE(fused_ratio, 1.0);
      // Naive: the Sq×Sk score buffer, ~16x for 4x S.
      EXPECT_GT(naive_ratio, 12.0) << naive_1k << " -> " << naive_4k;
      EXPECT_LT(naive_ratio, 20.0);
      EXPECT_GE(naive_4k, std::int64_t{4096} * 4096 * 4);  // at least the Sq×Sk floats
      EXPECT_LT(fused_4k, std::int64_t{4096} * 4096 * 4 / 16);
    }
  }
}

TEST(ExtraBytes, AutomaticIsFusedAndReferenceIsSmall) {
  Options o;
  const std::int64_t automatic = extra_for(1000, o);
  o.impl = Impl::fused;
  EXPECT_EQ(automatic, extra_for(1000, o));
  o.impl = Impl::reference;
  const std::int64_t ref = extra_for(1000, o);
  EXPECT_GE(ref, 0);
  EXPECT_LT(ref, std::int64_t{1000} * 1000 * 4);  // the reference keeps one row of scores per thread
}

TEST(ExtraBytes, FusedPerThreadTilesGrowWithThreads) {
  Options o;
  o.impl = Impl::fused;
  o.num_threads = 1;
  const std::int64_t one = extra_for(512, o);
  o.num_threads = 8;
  const std::int64_t eight = extra_for(512, o);
  EXPECT_GT(eight, one);
}

// ---- names ---------------------------------------------------------------------------------

TEST(Names, ToStringAndParseRoundTrip) {
  const std::pair<Impl, const char*> impls[] = {
      {Impl::automatic, "auto"}, {Impl::reference, "reference"}, {Impl::naive, "naive"}, {Impl::fused, "fused"}};
  for (auto [impl, name] : impls) {
    EXPECT_STREQ(fattn::to_string(impl), name);
    EXPECT_EQ(fattn::parse_impl(name), impl) << name;
    EXPECT_EQ(fattn::parse_impl(fattn::to_string(impl)), impl);
  }
  const std::pair<Isa, const char*> isas[] = {
      {Isa::automatic, "auto"}, {Isa::amx, "amx"},          {Isa::avx512, "avx512"},
      {Isa::avx2, "avx2"},      {Isa::portable, "portable"}};
  for (auto [isa, name] : isas) {
    EXPECT_STREQ(fattn::to_string(isa), name);
    EXPECT_EQ(fattn::parse_isa(name), isa) << name;
    EXPECT_EQ(fattn::parse_isa(fattn::to_string(isa)), isa);
  }
}

TEST(Names, EnumNames) {
  EXPECT_STREQ(fattn::to_string(Causal::none), "none");
  EXPECT_STREQ(fattn::to_string(Causal::top_left), "top_left");
  EXPECT_STREQ(fattn::to_string(Causal::bottom_right), "bottom_right");
  EXPECT_STREQ(fattn::to_string(fattn::DType::float32), "float32");
  EXPECT_STREQ(fattn::to_string(fattn::DType::float16), "float16");
  EXPECT_STREQ(fattn::to_string(fattn::DType::bfloat16), "bfloat16");
  EXPECT_STREQ(fattn::to_string(fattn::Device::cpu), "cpu");
  EXPECT_STREQ(fattn::to_string(fattn::Device::cuda), "cuda");
  EXPECT_EQ(fattn::element_size(fattn::DType::float32), 4);
  EXPECT_EQ(fattn::element_size(fattn::DType::float16), 2);
  EXPECT_EQ(fattn::element_size(fattn::DType::bfloat16), 2);
}

// ---- tensor views --------------------------------------------------------------------------

TEST(TensorViewFactories, Strides) {
  float buffer[4];
  const TensorView a = TensorView::bhsd(buffer, 2, 3, 5, 7);
  EXPECT_EQ(a.data, buffer);
  EXPECT_EQ(a.rank, 4);
  EXPECT_EQ(a.sizes, (std::array<std::int64_t, 4>{2, 3, 5, 7}));
  EXPECT_EQ(a.strides, (std::array<std::int64_t, 4>{3 * 5 * 7, 5 * 7, 7, 1}));
  EXPECT_EQ(a.dtype, fattn::DType::float32);
  EXPECT_EQ(a.device, fattn::Device::cpu);
  EXPECT_EQ(a.size(2), 5);
  EXPECT_EQ(a.stride(1), 35);

  // bshd: arguments in memory order (B, S, H, D), sizes logical (B, H, S, D).
  const TensorView b = TensorView::bshd(buffer, 2, 5, 3, 7, fattn::DType::float16, fattn::Device::cuda);
  EXPECT_EQ(b.rank, 4);
  EXPECT_EQ(b.sizes, (std::array<std::int64_t, 4>{2, 3, 5, 7}));
  EXPECT_EQ(b.strides, (std::array<std::int64_t, 4>{5 * 3 * 7, 7, 3 * 7, 1}));
  EXPECT_EQ(b.dtype, fattn::DType::float16);
  EXPECT_EQ(b.device, fattn::Device::cuda);

  const TensorView l = TensorView::lse(buffer, 2, 3, 5);
  EXPECT_EQ(l.rank, 3);
  EXPECT_EQ(l.size(0), 2);
  EXPECT_EQ(l.size(1), 3);
  EXPECT_EQ(l.size(2), 5);
  EXPECT_EQ(l.stride(0), 15);
  EXPECT_EQ(l.stride(1), 5);
  EXPECT_EQ(l.stride(2), 1);
  EXPECT_EQ(l.dtype, fattn::DType::float32);
}

// The factories work end to end: BSHD memory through TensorView::bshd gives the same
// attention as the same data copied to BHSD through TensorView::bhsd.
TEST(TensorViewFactories, BshdAndBhsdAgree) {
  const std::int64_t B = 2, H = 3, S = 40, D = 32;
  Rng rng;
  std::vector<float> q(B * S * H * D), k(q.size()), v(q.size());  // BSHD memory
  for (auto* t : {&q, &k, &v})
    for (float& x : *t) x = rng.normal();
  auto to_bhsd = [&](const std::vector<float>& x) {
    std::vector<float> y(x.size());
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t s = 0; s < S; ++s)
        for (std::int64_t h = 0; h < H; ++h)
          for (std::int64_t d = 0; d < D; ++d)
            y[static_cast<std::size_t>(((b * H + h) * S + s) * D + d)] =
                x[static_cast<std::size_t>(((b * S + s) * H + h) * D + d)];
    return y;
  };
  std::vector<float> q2 = to_bhsd(q), k2 = to_bhsd(k), v2 = to_bhsd(v);
  std::vector<float> out1(q.size(), kPoison), out2(q.size(), kPoison), lse1(B * H * S), lse2(B * H * S);
  Options o;
  o.causal = Causal::top_left;
  const TensorView l1 = TensorView::lse(lse1.data(), B, H, S), l2 = TensorView::lse(lse2.data(), B, H, S);
  fattn::attention_forward(TensorView::bshd(q.data(), B, S, H, D), TensorView::bshd(k.data(), B, S, H, D),
                           TensorView::bshd(v.data(), B, S, H, D), TensorView::bshd(out1.data(), B, S, H, D),
                           &l1, o);
  fattn::attention_forward(TensorView::bhsd(q2.data(), B, H, S, D), TensorView::bhsd(k2.data(), B, H, S, D),
                           TensorView::bhsd(v2.data(), B, H, S, D), TensorView::bhsd(out2.data(), B, H, S, D),
                           &l2, o);
  const std::vector<float> out1_bhsd = to_bhsd(out1);
  for (std::size_t e = 0; e < out2.size(); ++e) ASSERT_NEAR(out1_bhsd[e], out2[e], 1e-5) << e;
  for (std::size_t e = 0; e < lse1.size(); ++e) ASSERT_NEAR(lse1[e], lse2[e], 1e-5) << e;
  for (float x : out2) ASSERT_TRUE(std::isfinite(x));
}

// ---- the machine -------------------------------------------------------------------------------

TEST(Machine, ReportsItself) {
  EXPECT_TRUE(fattn::cpu_supports(Isa::portable));
  EXPECT_TRUE(fattn::cpu_supports(Isa::automatic));
  const Isa best = fattn::best_cpu_isa();
  EXPECT_NE(best, Isa::automatic);
  EXPECT_TRUE(fattn::cpu_supports(best));
  // best is the fastest supported: amx, then the widest FMA kernels
  if (fattn::cpu_supports(Isa::amx))
    EXPECT_EQ(best, Isa::amx);
  else if (fattn::cpu_supports(Isa::avx512))
    EXPECT_EQ(best, Isa::avx512);
  else if (fattn::cpu_supports(Isa::avx2))
    EXPECT_EQ(best, Isa::avx2);
  else
    EXPECT_EQ(best, Isa::portable);
  EXPECT_GE(fattn::default_num_threads(), 1);
  EXPECT_STREQ(fattn::version(), FATTN_TEST_EXPECTED_VERSION);
}

}  // namespace
// Working memory is cached between calls: a larger problem after a smaller one, a
// smaller one after it (reusing the larger block, with stale data in it), and a call
// after release_cached_memory() all give the reference result.
TEST(WorkspaceCache, ReuseGrowAndReleaseStayCorrect) {
  Rng rng;
  for (Impl impl : {Impl::naive, Impl::fused}) {
    for (std::int64_t S : {65, 300, 65}) {
      const Tensor q = make_input(L::bhsd, 1, 2, S, 64, rng);
      const Tensor k = make_input(L::bhsd, 1, 2, S, 64, rng);
      const Tensor v = make_input(L::bhsd, 1, 2, S, 64, rng);
      Options options;
      options.causal = Causal::top_left;
      const Result ref = run_reference(q, k, v, options, /*with_lse=*/false);
      options.impl = impl;
      Tensor out = make_output(L::bhsd, 1, 2, S, 64);
      fattn::attention_forward(q.view(), k.view(), v.view(), out.view(), nullptr, options);
      EXPECT_TRUE(outputs_near(out, ref.out)) << fattn::to_string(impl) << " S=" << S;
      if (S == 300) fattn::release_cached_memory();
    }
  }
}

}  // namespace fattn_test
