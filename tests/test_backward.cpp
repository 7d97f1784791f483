// fattn tests — the backward pass: the float64 reference against finite differences and
// an independent oracle; the naive and fused kernels on every ISA against the reference
// over a grid (sequence lengths, Sq ≠ Sk, head dims, causal both ways, GQA/MQA, layouts,
// threads, with and without a logsumexp gradient); determinism; argument validation.
#include <gtest/gtest.h>

#include <functional>

#include "util/checks.hpp"
#include "util/cpu_variants.hpp"
#include "util/reference.hpp"

namespace fattn_test {
namespace {

// Gradients are sums over up to Sk (or Sq·group) terms of products of O(1) values:
// the bound is relative to max(1, max|ref|) of each gradient, as for the outputs.
constexpr double kGradTol = 2e-5;

struct Case {
  std::int64_t B, Hq, Hkv, Sq, Sk, D;
  Causal causal = Causal::none;
  Layout layout = Layout::bhsd;  // of every input and output
  bool with_dlse = false;
  int threads = 0;
};

std::string case_name(const Case& c) {
  std::ostringstream s;
  s << "B" << c.B << "_H" << c.Hq << "x" << c.Hkv << "_Sq" << c.Sq << "_Sk" << c.Sk << "_D" << c.D
    << "_" << fattn::to_string(c.causal) << "_" << layout_name(c.layout)
    << (c.with_dlse ? "_dlse" : "") << "_t" << c.threads;
  return s.str();
}
void PrintTo(const Case& c, std::ostream* os) { *os << case_name(c); }

constexpr Causal kNone = Causal::none, kTL = Causal::top_left, kBR = Causal::bottom_right;

std::vector<Case> grid() {
  std::vector<Case> g;
  // Square, odd and tile-straddling lengths, each with and without a causal mask.
  const std::tuple<std::int64_t, std::int64_t, std::int64_t, std::int64_t> lengths[] = {
      {2, 2, 1, 64}, {2, 3, 7, 64}, {1, 2, 63, 64}, {2, 2, 65, 64}, {1, 2, 113, 80},
      {1, 1, 200, 128}, {1, 1, 257, 32}};
  bool top_left = true;
  for (auto [B, H, S, D] : lengths) {
    g.push_back(Case{B, H, H, S, S, D, kNone});
    g.push_back(Case{B, H, H, S, S, D, top_left ? kTL : kBR});
    top_left = !top_left;
  }
  // Sq ≠ Sk both ways; bottom-right with Sq > Sk has rows that see no key.
  for (Causal causal : {kNone, kTL, kBR}) {
    g.push_back(Case{1, 2, 2, 65, 200, 64, causal});
    g.push_back(Case{1, 2, 2, 200, 65, 64, causal});
  }
  g.push_back(Case{1, 1, 1, 1, 300, 64, kBR});
  g.push_back(Case{1, 1, 1, 300, 1, 64, kNone});
  // Head dims, odd ones included.
  for (auto [D, causal] : std::initializer_list<std::pair<std::int64_t, Causal>>{
           {16, kNone}, {17, kTL}, {33, kBR}, {96, kNone}, {100, kTL}, {255, kBR}, {256, kNone}})
    g.push_back(Case{1, 2, 2, 70, 110, D, causal});
  // GQA 8:2 and MQA 8:1.
  g.push_back(Case{2, 8, 2, 70, 70, 64, kNone});
  g.push_back(Case{1, 8, 2, 50, 90, 64, kBR});
  g.push_back(Case{1, 8, 1, 100, 100, 64, kTL});
  // Layouts, each for every tensor (inputs, out, dout, dq, dk, dv).
  for (Layout layout : {Layout::bshd, Layout::strided, Layout::slice})
    g.push_back(Case{2, 4, 2, 77, 90, 40, kTL, layout});
  // A logsumexp gradient.
  g.push_back(Case{1, 2, 2, 90, 90, 64, kNone, Layout::bhsd, true});
  g.push_back(Case{1, 4, 2, 60, 130, 48, kBR, Layout::strided, true});
  // MQA with many query tiles at D = 16: the AMX backward holds the 320 query tiles of its
  // item in two batches (16 MiB of operands a worker, ~56 KiB a tile at D = 16).
  g.push_back(Case{1, 8, 1, 2560, 200, 16, kTL});
  // Threads: 1, 3 (MQA with B = 1: the fused kernel splits keys into chunks).
  g.push_back(Case{1, 1, 1, 400, 400, 64, kNone, Layout::bhsd, false, 3});
  g.push_back(Case{1, 4, 1, 300, 300, 64, kTL, Layout::bhsd, false, 3});
  g.push_back(Case{2, 2, 2, 100, 100, 64, kBR, Layout::bhsd, false, 1});
  return g;
}

// Everything one backward call reads and writes.
struct Problem {
  Case c;
  Tensor q, k, v, out, lse, dout, dlse;
  Options options;

  explicit Problem(const Case& cs) : c(cs) {
    Rng rng;
    q = make_input(c.layout, c.B, c.Hq, c.Sq, c.D, rng);
    k = make_input(c.layout, c.B, c.Hkv, c.Sk, c.D, rng);
    v = make_input(c.layout, c.B, c.Hkv, c.Sk, c.D, rng);
    dout = make_input(c.layout, c.B, c.Hq, c.Sq, c.D, rng);
    options.causal = c.causal;
    options.num_threads = c.threads;
    // out and lse as a float32 forward gives them (the reference's, rounded).
    Result fwd = run_reference(q, k, v, options);
    out = std::move(fwd.out);
    lse = std::move(fwd.lse);
    if (c.with_dlse) {
      dlse = make_lse(LseLayout::contiguous, c.B, c.Hq, c.Sq);
      dlse.for_each([&](auto b, auto h, auto i, auto) { dlse.at(b, h, i) = rng.normal(); });
    }
  }

  struct Grads {
    Tensor dq, dk, dv;
  };
  Grads run(Impl impl, Isa isa = Isa::automatic, Layout layout_of_grads = Layout::bhsd) const {
    Grads g{make_output(layout_of_grads, c.B, c.Hq, c.Sq, c.D),
            make_output(layout_of_grads, c.B, c.Hkv, c.Sk, c.D),
            make_output(layout_of_grads, c.B, c.Hkv, c.Sk, c.D)};
    Options o = options;
    o.impl = impl;
    o.isa = isa;
    fattn::attention_backward(q.view(), k.view(), v.view(), out.view(), dout.view(), lse.view(),
                              c.with_dlse ? dlse.view_ptr() : nullptr, g.dq.view(), g.dk.view(),
                              g.dv.view(), o);
    return g;
  }
};

class BackwardNaN : public ::testing::TestWithParam<Variant> {};
class BackwardTest : public ::testing::TestWithParam<std::tuple<Variant, Case>> {};

TEST_P(BackwardTest, MatchesReference) {
  const auto& [variant, c] = GetParam();
  FATTN_SKIP_IF_UNSUPPORTED(variant.isa);
  const Problem p(c);
  const Tensor q0 = p.q.clone(), k0 = p.k.clone(), v0 = p.v.clone(), dout0 = p.dout.clone();
  const auto ref = p.run(Impl::reference);
  const auto got = p.run(variant.impl, variant.isa, c.layout);
  for (const auto& [name, g, r] : {std::tuple{"dq", &got.dq, &ref.dq},
                                   std::tuple{"dk", &got.dk, &ref.dk},
                                   std::tuple{"dv", &got.dv, &ref.dv}}) {
    EXPECT_TRUE(outputs_near(*g, *r, kGradTol)) << name;
    EXPECT_TRUE(outside_view_untouched(*g)) << name;
  }
  EXPECT_TRUE(unchanged(p.q, q0));
  EXPECT_TRUE(unchanged(p.k, k0));
  EXPECT_TRUE(unchanged(p.v, v0));
  EXPECT_TRUE(unchanged(p.dout, dout0));
  if (c.causal == kBR && c.Sq > c.Sk)  // rows that see no key get no gradient
    for (std::int64_t h = 0; h < c.Hq; ++h)
      for (std::int64_t d = 0; d < c.D; ++d) ASSERT_EQ(got.dq.at(0, h, 0, d), 0.0f);
}

INSTANTIATE_TEST_SUITE_P(Grid, BackwardTest,
                         ::testing::Combine(::testing::ValuesIn(kernel_variants()),
                                            ::testing::ValuesIn(grid())),
                         [](const auto& info) {
                           return variant_name(std::get<0>(info.param)) + "_" +
                                  case_name(std::get<1>(info.param));
                         });

// The same bits on every run with a given thread count, including the chunked dQ
// reduction (MQA, B = 1: fewer kv heads than workers).
TEST(BackwardDeterminism, FusedRepeatsBitForBit) {
  for (const Case& c : {Case{1, 4, 1, 500, 500, 64, kTL, Layout::bhsd, false, 2},
                        Case{1, 4, 1, 300, 700, 64, kNone, Layout::bhsd, true, 3},
                        Case{2, 4, 2, 256, 256, 128, kNone, Layout::bshd, false, 0}}) {
    const Problem p(c);
    for (Isa isa : {Isa::avx512, Isa::amx, Isa::portable}) {
      if (!fattn::cpu_supports(isa)) continue;
      const auto first = p.run(Impl::fused, isa);
      for (int run = 0; run < 3; ++run) {
        const auto again = p.run(Impl::fused, isa);
        const std::string where = case_name(c) + " " + to_string(isa) + " run " + std::to_string(run);
        EXPECT_TRUE(bitwise_equal(again.dq, first.dq)) << where;
        EXPECT_TRUE(bitwise_equal(again.dk, first.dk)) << where;
        EXPECT_TRUE(bitwise_equal(again.dv, first.dv)) << where;
      }
    }
  }
}

// Isa::automatic runs the backward on the best ISA at every length (the forward switches
// at automatic_cpu_isa): the same bits as asking for it.
TEST(BackwardAutomatic, RunsTheBestIsa) {
  const Problem p(Case{1, 2, 2, 100, 100, 64, kTL});
  const auto automatic = p.run(Impl::fused, Isa::automatic);
  const auto best = p.run(Impl::fused, fattn::best_cpu_isa());
  EXPECT_TRUE(bitwise_equal(automatic.dq, best.dq));
  EXPECT_TRUE(bitwise_equal(automatic.dk, best.dk));
  EXPECT_TRUE(bitwise_equal(automatic.dv, best.dv));
}

// The AMX backward, fused and naive, runs on finite inputs (its gradients differ in the
// last bits from the FMA kernels'; the grid bounds both against the reference) and hands
// the call to the AVX-512 backward, which then gives the same bits, when an input does not
// split into bfloat16 parts (an Inf in dO) or a probability does not (a NaN logsumexp).
TEST(AmxBackward, RunsOnFiniteInputsAndFallsBackOnNonFinite) {
  FATTN_SKIP_IF_UNSUPPORTED(Isa::amx);
  for (Impl impl : {Impl::fused, Impl::naive}) {
    SCOPED_TRACE(to_string(impl));
    Problem p(Case{2, 4, 2, 150, 170, 64, kBR});
    auto same_bits = [&] {
      const auto amx = p.run(impl, Isa::amx), fma = p.run(impl, Isa::avx512);
      return bitwise_equal(amx.dq, fma.dq) && bitwise_equal(amx.dk, fma.dk) &&
             bitwise_equal(amx.dv, fma.dv);
    };
    const auto amx = p.run(impl, Isa::amx), fma = p.run(impl, Isa::avx512);
    EXPECT_FALSE(bitwise_equal(amx.dq, fma.dq)) << "the amx kernel did not run";
    EXPECT_FALSE(bitwise_equal(amx.dk, fma.dk)) << "the amx kernel did not run";
    EXPECT_FALSE(bitwise_equal(amx.dv, fma.dv)) << "the amx kernel did not run";
    const float dout = p.dout.at(1, 3, 20, 5);
    p.dout.at(1, 3, 20, 5) = kInf;
    EXPECT_TRUE(same_bits()) << "Inf in dout";
    p.dout.at(1, 3, 20, 5) = dout;
    p.lse.at(1, 2, 140) = kNaN;
    EXPECT_TRUE(same_bits()) << "NaN in lse";
  }
}

// A NaN in a value row reaches only the queries that see that key: under a causal
// mask the rows before it keep finite gradients, as in the reference.
TEST_P(BackwardNaN, ReachesOnlyTheRowsThatSeeIt) {
  const Variant variant = GetParam();
  FATTN_SKIP_IF_UNSUPPORTED(variant.isa);
  Problem p(Case{1, 2, 2, 150, 150, 64, kTL});
  const std::int64_t poisoned_key = 100;
  for (std::int64_t h = 0; h < 2; ++h) p.v.at(0, h, poisoned_key, 3) = kNaN;
  const Result fwd = run_reference(p.q, p.k, p.v, p.options);
  p.out = fwd.out.clone();
  p.lse = fwd.lse.clone();
  const auto ref = p.run(Impl::reference);
  const auto got = p.run(variant.impl, variant.isa);
  EXPECT_TRUE(outputs_near(got.dq, ref.dq, kGradTol));
  EXPECT_TRUE(outputs_near(got.dv, ref.dv, kGradTol));
  for (std::int64_t d = 0; d < 64; ++d) ASSERT_TRUE(std::isfinite(got.dq.at(0, 1, 99, d))) << d;
  ASSERT_TRUE(std::isnan(got.dq.at(0, 1, 100, 3)));
}

INSTANTIATE_TEST_SUITE_P(Kernels, BackwardNaN, ::testing::ValuesIn(kernel_variants()),
                         [](const auto& info) { return variant_name(info.param); });

// ---- the reference itself ---------------------------------------------------------------

// A float64 (B, H, S, D) tensor, contiguous.
struct Doubles {
  std::vector<double> data;
  TensorView view;
  Doubles(std::int64_t B, std::int64_t H, std::int64_t S, std::int64_t D, Rng* rng)
      : data(static_cast<std::size_t>(B * H * S * D)) {
    for (double& x : data) x = rng ? rng->normal() : 0.0;
    view = TensorView::bhsd(data.data(), B, H, S, D, fattn::DType::float64);
  }
  Doubles(std::int64_t B, std::int64_t H, std::int64_t S, Rng* rng)
      : data(static_cast<std::size_t>(B * H * S)) {
    for (double& x : data) x = rng ? rng->normal() : 0.0;
    view = TensorView::lse(data.data(), fattn::DType::float64, B, H, S);
  }
};

// The float64 reference backward against central finite differences of
// L = Σ dout·out + Σ dlse·lse computed by the float64 reference forward: checks the
// gradient formulas themselves (GQA, a causal mask with empty rows, a custom scale).
TEST(ReferenceBackward, MatchesFiniteDifferences) {
  const std::int64_t B = 1, Hq = 4, Hkv = 2, Sq = 9, Sk = 6, D = 16;
  Rng rng;
  Doubles q(B, Hq, Sq, D, &rng), k(B, Hkv, Sk, D, &rng), v(B, Hkv, Sk, D, &rng);
  Doubles dout(B, Hq, Sq, D, &rng), dlse(B, Hq, Sq, &rng);
  Doubles out(B, Hq, Sq, D, nullptr), lse(B, Hq, Sq, nullptr);
  Options options;
  options.causal = Causal::bottom_right;  // Sq > Sk: the first 3 rows see no key
  options.scale = 0.37;
  auto loss = [&] {
    fattn::attention_forward(q.view, k.view, v.view, out.view, &lse.view, options);
    double l = 0.0;
    for (std::size_t e = 0; e < out.data.size(); ++e) l += dout.data[e] * out.data[e];
    for (std::size_t e = 0; e < lse.data.size(); ++e)
      if (std::isfinite(lse.data[e])) l += dlse.data[e] * lse.data[e];
    return l;
  };
  loss();
  Doubles dq(B, Hq, Sq, D, nullptr), dk(B, Hkv, Sk, D, nullptr), dv(B, Hkv, Sk, D, nullptr);
  fattn::attention_backward(q.view, k.view, v.view, out.view, dout.view, lse.view, &dlse.view,
                            dq.view, dk.view, dv.view, options);
  const double h = 1e-6;
  for (auto [x, grad, name] : {std::tuple{&q, &dq, "dq"}, std::tuple{&k, &dk, "dk"},
                               std::tuple{&v, &dv, "dv"}})
    for (std::size_t e = 0; e < x->data.size(); ++e) {
      const double saved = x->data[e];
      x->data[e] = saved + h;
      const double up = loss();
      x->data[e] = saved - h;
      const double down = loss();
      x->data[e] = saved;
      const double numeric = (up - down) / (2 * h);
      ASSERT_NEAR(grad->data[e], numeric, 1e-6 * std::max(1.0, std::fabs(numeric)))
          << name << " element " << e;
    }
}

// ---- validation -------------------------------------------------------------------------


TEST(BackwardValidation, NamesTheArgument) {
  const Problem p(Case{1, 4, 2, 20, 30, 32});
  auto g = p.run(Impl::fused);
  const TensorView q = p.q.view(), k = p.k.view(), v = p.v.view(), o = p.out.view();
  const TensorView dout = p.dout.view(), lse = p.lse.view();
  auto call = [&](TensorView dq, TensorView dk, TensorView dv, Options opt = {},
                  const TensorView* dlse = nullptr, TensorView dout_view = {}) {
    fattn::attention_backward(q, k, v, o, dout_view.data ? dout_view : dout, lse, dlse, dq, dk,
                              dv, opt);
  };
  expect_error([&] { call(g.dk.view(), g.dk.view(), g.dv.view()); },
               "dq.size(1) (as q) must equal q.size(1) = 4, got 2");
  expect_error([&] { call(g.dq.view(), g.dq.view(), g.dv.view()); }, "dk.size(1)");
  TensorView short_dout = dout;
  short_dout.sizes[2] = 19;
  expect_error([&] { call(g.dq.view(), g.dk.view(), g.dv.view(), {}, nullptr, short_dout); },
               "dout.size(2) (as q) must equal q.size(2) = 20, got 19");
  expect_error([&] { call(g.dq.view(), g.dk.view(), p.k.view()); }, "dv must not overlap k");
  TensorView dv_over_dk = g.dk.view();
  expect_error([&] { call(g.dq.view(), g.dk.view(), dv_over_dk); }, "dv must not overlap dk");
  TensorView bad_dlse = p.lse.view();
  bad_dlse.sizes[2] = 3;
  expect_error([&] { call(g.dq.view(), g.dk.view(), g.dv.view(), {}, &bad_dlse); },
               "dlse.size(2) (as lse) must equal lse.size(2) = 20, got 3");
  TensorView null_dq = g.dq.view();
  null_dq.data = nullptr;
  expect_error([&] { call(null_dq, g.dk.view(), g.dv.view()); }, "dq has a null data pointer");
  Rng rng;
  Doubles dq(1, 4, 20, 32, &rng), dk(1, 2, 30, 32, &rng), dv(1, 2, 30, 32, &rng);
  expect_error([&] { call(dq.view, dk.view, dv.view); }, "dq must have dtype float32, got float64");
  // float64 runs the reference only.
  Doubles q64(1, 4, 20, 32, &rng), k64(1, 2, 30, 32, &rng), v64(1, 2, 30, 32, &rng);
  Doubles o64(1, 4, 20, 32, &rng), do64(1, 4, 20, 32, &rng), lse64(1, 4, 20, &rng);
  Options naive;
  naive.impl = Impl::naive;
  expect_error(
      [&] {
        fattn::attention_backward(q64.view, k64.view, v64.view, o64.view, do64.view, lse64.view,
                                  nullptr, dq.view, dk.view, dv.view, naive);
      },
      "impl naive takes float32");
  TensorView cuda_q = q;
  cuda_q.device = fattn::Device::cuda;
  // A cuda q among cpu tensors: without the CUDA backend the build says so; with it, the
  // validation names the device the others are on.
  expect_error([&] { fattn::attention_backward(cuda_q, k, v, o, dout, lse, nullptr, g.dq.view(),
                                               g.dk.view(), g.dv.view()); },
               "cuda");
}

TEST(BackwardMemory, FusedIsLinearNaiveIsQuadratic) {
  std::vector<float> q(1), k(1);
  // Broadcast views (stride 0) give a large problem without its memory.
  const std::int64_t B = 2, H = 8, D = 64;
  auto bytes = [&](std::int64_t S, Impl impl) {
    const TensorView qv{q.data(), 4, {B, H, S, D}, {0, 0, 0, 0}};
    const TensorView kv{k.data(), 4, {B, H, S, D}, {0, 0, 0, 0}};
    Options o;
    o.impl = impl;
    o.num_threads = 2;
    return fattn::backward_extra_bytes(qv, kv, kv, o);
  };
  const std::int64_t operand = B * H * 4096 * D * 4;  // bytes of one of q, k, v at S = 4096
  // Fused: K, V panels and K rows (3 operands; these broadcast views have K's dims
  // strided, so K rows are copied), Q and dO transposed (2) and as rows (2, copied for the
  // same reason), dQ partials (1 chunk), per-query lse2 and Δ, per-worker tiles.
  EXPECT_LT(bytes(4096, Impl::fused), 9 * operand);
  EXPECT_LT(bytes(4096, Impl::fused), 2.1 * bytes(2048, Impl::fused)) << "must grow as O(S)";
  EXPECT_GE(bytes(4096, Impl::naive), 2 * B * H * 4096 * 4096 * 4) << "naive stores P and dS";
}

}  // namespace
}  // namespace fattn_test
