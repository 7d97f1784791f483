// fattn tests — the naive and fused kernels, on every ISA this CPU has, against the
// float64 reference, over a grid that covers each axis (sequence lengths, head dims,
// causal modes, GQA/MQA, memory layouts, threads, scale, logsumexp on/off) without
// running the full cartesian product; and the reference itself against an
// independent oracle.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <thread>

#include "util/checks.hpp"
#include "util/cpu_variants.hpp"
#include "util/reference.hpp"

namespace fattn_test {
namespace {

struct Case {
  std::int64_t B, Hq, Hkv, Sq, Sk, D;
  Causal causal = Causal::none;
  Layout lq = Layout::bhsd, lk = Layout::bhsd, lv = Layout::bhsd, lo = Layout::bhsd;
  LseLayout lse = LseLayout::contiguous;
  std::optional<double> scale = std::nullopt;
  int threads = 0;
  const char* tag = "";
};

std::string case_name(const Case& c) {
  std::ostringstream s;
  s << "B" << c.B << "_H" << c.Hq << "x" << c.Hkv << "_Sq" << c.Sq << "_Sk" << c.Sk << "_D" << c.D
    << "_" << fattn::to_string(c.causal) << "_" << layout_name(c.lq) << "_" << layout_name(c.lk)
    << "_" << layout_name(c.lv) << "_" << layout_name(c.lo) << "_" << lse_layout_name(c.lse)
    << "_t" << c.threads;
  if (c.scale) s << "_scale" << (*c.scale < 0 ? "m" : "") << static_cast<int>(std::fabs(*c.scale) * 1000);
  if (*c.tag) s << "_" << c.tag;
  return s.str();
}

void PrintTo(const Case& c, std::ostream* os) { *os << case_name(c); }

Case sq(std::int64_t B, std::int64_t H, std::int64_t S, std::int64_t D, Causal causal) {
  return Case{B, H, H, S, S, D, causal};
}
Case rect(std::int64_t Sq, std::int64_t Sk, Causal causal, std::int64_t D = 64) {
  return Case{1, 2, 2, Sq, Sk, D, causal};
}
Case with_layouts(Case c, Layout q, Layout k, Layout v, Layout o, LseLayout lse) {
  c.lq = q, c.lk = k, c.lv = v, c.lo = o, c.lse = lse;
  return c;
}
Case with_threads(Case c, int threads) {
  c.threads = threads;
  return c;
}
Case with_scale(Case c, double scale) {
  c.scale = scale;
  return c;
}
Case without_lse(Case c) {
  c.lse = LseLayout::none;
  return c;
}

constexpr Causal kNone = Causal::none, kTL = Causal::top_left, kBR = Causal::bottom_right;
using L = Layout;

std::vector<Case> grid() {
  std::vector<Case> g;
  // Sequence lengths (square), each under no mask and a causal one (top-left and
  // bottom-right coincide for Sq = Sk; they alternate). Small S: B·H = 6 or 4
  // (above the thread count); large S: B = H = 1 (below it).
  const std::tuple<std::int64_t, std::int64_t, std::int64_t, std::int64_t> lengths[] = {
      {2, 3, 1, 64},   {2, 3, 2, 64},   {2, 3, 7, 64},    {2, 2, 63, 64},  {1, 3, 64, 64},
      {2, 2, 65, 64},  {1, 2, 113, 80}, {1, 2, 127, 96},  {2, 1, 128, 128}, {1, 2, 255, 72},
      {1, 1, 1000, 64}, {1, 1, 1023, 32}, {1, 1, 2048, 64}};
  bool top_left = true;
  for (auto [B, H, S, D] : lengths) {
    g.push_back(sq(B, H, S, D, kNone));
    g.push_back(sq(B, H, S, D, top_left ? kTL : kBR));
    top_left = !top_left;
  }

  // Sq != Sk, both ways, each causal mode. bottom_right with Sq > Sk has rows that
  // see no key (output 0, logsumexp -inf exactly).
  g.push_back(rect(1, 1000, kNone));
  g.push_back(rect(1000, 1, kNone));
  g.push_back(rect(300, 7, kNone));
  g.push_back(rect(65, 200, kTL));
  g.push_back(rect(200, 65, kTL));
  g.push_back(rect(7, 300, kTL));
  g.push_back(rect(65, 200, kBR));
  g.push_back(rect(200, 65, kBR));
  g.push_back(rect(129, 64, kBR));
  g.push_back(rect(33, 1, kBR));
  g.push_back(rect(1, 257, kBR));

  // Head dims, including odd ones, at Sq = 97, Sk = 130.
  const std::pair<std::int64_t, Causal> dims[] = {{16, kNone}, {17, kTL},  {20, kBR},  {32, kTL},
                                                  {33, kNone}, {72, kBR},  {80, kTL},  {96, kNone},
                                                  {128, kBR},  {200, kNone}, {255, kTL}, {256, kBR},
                                                  {256, kNone}};
  for (auto [D, causal] : dims) g.push_back(rect(97, 130, causal, D));

  // GQA 8:2 and MQA 8:1.
  g.push_back(Case{2, 8, 2, 70, 70, 64, kNone});
  g.push_back(Case{1, 8, 2, 50, 90, 64, kBR});
  g.push_back(Case{1, 8, 1, 100, 100, 64, kTL});
  g.push_back(Case{1, 8, 1, 130, 40, 32, kBR});
  g.push_back(with_layouts(Case{2, 8, 2, 45, 45, 48, kTL}, L::bshd, L::strided, L::slice, L::bshd,
                           LseLayout::strided));

  // Memory layouts: each of q, k, v, out in bhsd, bshd, strided and slice; strided lse.
  g.push_back(with_layouts(Case{2, 2, 2, 90, 90, 64, kNone}, L::bshd, L::bshd, L::bshd, L::bshd,
                           LseLayout::contiguous));
  g.push_back(with_layouts(Case{2, 2, 2, 90, 70, 64, kBR}, L::strided, L::strided, L::strided,
                           L::strided, LseLayout::strided));
  g.push_back(with_layouts(Case{2, 2, 2, 70, 90, 64, kTL}, L::slice, L::slice, L::slice, L::slice,
                           LseLayout::strided));
  g.push_back(with_layouts(Case{1, 3, 3, 77, 77, 40, kNone}, L::strided, L::bshd, L::slice,
                           L::bhsd, LseLayout::strided));
  g.push_back(with_layouts(Case{1, 3, 3, 77, 100, 33, kBR}, L::slice, L::strided, L::bshd,
                           L::strided, LseLayout::contiguous));
  g.push_back(with_layouts(Case{2, 2, 1, 50, 77, 64, kTL}, L::bshd, L::slice, L::strided,
                           L::slice, LseLayout::none));

  // Threads: B·H below and above 1, 3 and the default.
  g.push_back(with_threads(sq(1, 1, 300, 64, kNone), 3));
  g.push_back(with_threads(sq(3, 4, 100, 64, kBR), 3));
  g.push_back(with_threads(sq(2, 3, 100, 64, kTL), 1));
  g.push_back(with_threads(sq(1, 1, 200, 64, kBR), 1));
  g.push_back(sq(3, 4, 100, 64, kNone));  // default threads, B·H = 12

  // Custom scales (0 makes every visible key equally likely).
  g.push_back(with_scale(sq(1, 2, 100, 64, kNone), 0.3));
  g.push_back(with_scale(sq(1, 2, 100, 64, kTL), -0.2));
  g.push_back(with_scale(sq(1, 2, 100, 32, kBR), 0.0));
  g.push_back(with_scale(rect(60, 90, kNone, 128), 1.0));

  // No logsumexp.
  g.push_back(without_lse(sq(2, 2, 65, 64, kNone)));
  g.push_back(without_lse(rect(200, 65, kBR)));
  return g;
}

// ---- kernels against the reference ------------------------------------------------------

class ForwardTest : public ::testing::TestWithParam<std::tuple<Variant, Case>> {};

TEST_P(ForwardTest, MatchesReference) {
  const auto& [variant, c] = GetParam();
  FATTN_SKIP_IF_UNSUPPORTED(variant.isa);
  Rng rng;
  const Tensor q = make_input(c.lq, c.B, c.Hq, c.Sq, c.D, rng);
  const Tensor k = make_input(c.lk, c.B, c.Hkv, c.Sk, c.D, rng);
  const Tensor v = make_input(c.lv, c.B, c.Hkv, c.Sk, c.D, rng);
  const Tensor q0 = q.clone(), k0 = k.clone(), v0 = v.clone();

  Options options;
  options.causal = c.causal;
  options.scale = c.scale;
  options.num_threads = c.threads;
  const bool with_lse = c.lse != LseLayout::none;
  const Result ref = run_reference(q, k, v, options, with_lse);

  options.impl = variant.impl;
  options.isa = variant.isa;
  Tensor out = make_output(c.lo, c.B, c.Hq, c.Sq, c.D);
  Tensor lse = with_lse ? make_lse(c.lse, c.B, c.Hq, c.Sq) : Tensor();
  fattn::attention_forward(q.view(), k.view(), v.view(), out.view(),
                           with_lse ? lse.view_ptr() : nullptr, options);

  EXPECT_TRUE(outputs_near(out, ref.out));
  EXPECT_TRUE(outside_view_untouched(out));
  if (with_lse) {
    EXPECT_TRUE(lse_near(lse, ref.lse));
    EXPECT_TRUE(outside_view_untouched(lse));
  }
  EXPECT_TRUE(unchanged(q, q0));
  EXPECT_TRUE(unchanged(k, k0));
  EXPECT_TRUE(unchanged(v, v0));

  // bottom_right with Sq > Sk: the first Sq - Sk rows see no key.
  if (c.causal == Causal::bottom_right && c.Sq > c.Sk) {
    for (std::int64_t b = 0; b < c.B; ++b)
      for (std::int64_t h = 0; h < c.Hq; ++h)
        for (std::int64_t i = 0; i < c.Sq - c.Sk; ++i) {
          for (std::int64_t d = 0; d < c.D; ++d)
            ASSERT_EQ(out.at(b, h, i, d), 0.0f) << "row " << i << " sees no key: must be 0";
          if (with_lse) {
            ASSERT_EQ(lse.at(b, h, i), -kInf) << "row " << i;
          }
        }
  }
}

INSTANTIATE_TEST_SUITE_P(Grid, ForwardTest,
                         ::testing::Combine(::testing::ValuesIn(forward_variants()),
                                            ::testing::ValuesIn(grid())),
                         [](const auto& param_info) {
                           return variant_name(std::get<0>(param_info.param)) + "_" +
                                  case_name(std::get<1>(param_info.param));
                         });

// ---- the reference against an independent oracle ----------------------------------------

class ReferenceTest : public ::testing::TestWithParam<Case> {};

TEST_P(ReferenceTest, MatchesOracle) {
  const Case& c = GetParam();
  Rng rng;
  const Tensor q = make_input(c.lq, c.B, c.Hq, c.Sq, c.D, rng);
  const Tensor k = make_input(c.lk, c.B, c.Hkv, c.Sk, c.D, rng);
  const Tensor v = make_input(c.lv, c.B, c.Hkv, c.Sk, c.D, rng);
  Options options;
  options.causal = c.causal;
  options.scale = c.scale;
  const Result ref = run_reference(q, k, v, options);
  const Oracle want = oracle(q, k, v, c.scale.value_or(default_scale(c.D)), c.causal);

  // The reference computes in float64 and rounds once to float32: half an ulp.
  std::vector<double> row(static_cast<std::size_t>(c.D));
  for (std::int64_t b = 0; b < c.B; ++b)
    for (std::int64_t h = 0; h < c.Hq; ++h)
      for (std::int64_t i = 0; i < c.Sq; ++i) {
        const double want_lse = want.l(b, h, i);
        if (std::isinf(want_lse))
          ASSERT_EQ(ref.lse.at(b, h, i), -kInf);
        else
          ASSERT_NEAR(ref.lse.at(b, h, i), want_lse, 1e-7 * std::max(1.0, std::fabs(want_lse)));
        // reference_row: float64, same values without the rounding.
        const double lse_row = fattn::reference_row(q.view(), k.view(), v.view(), options, b, h, i,
                                                    row.data());
        if (std::isinf(want_lse))
          ASSERT_EQ(lse_row, -std::numeric_limits<double>::infinity());
        else
          ASSERT_NEAR(lse_row, want_lse, 1e-12 * std::max(1.0, std::fabs(want_lse)));
        for (std::int64_t d = 0; d < c.D; ++d) {
          const double w = want.o(b, h, i, d);
          ASSERT_NEAR(ref.out.at(b, h, i, d), w, 1e-7 * std::max(1.0, std::fabs(w)))
              << "at " << b << "," << h << "," << i << "," << d;
          ASSERT_NEAR(row[static_cast<std::size_t>(d)], w, 1e-12 * std::max(1.0, std::fabs(w)));
        }
      }
}

INSTANTIATE_TEST_SUITE_P(
    Small, ReferenceTest,
    ::testing::Values(sq(2, 2, 9, 16, kNone), sq(1, 2, 9, 20, kTL), sq(1, 2, 9, 16, kBR),
                      rect(12, 5, kBR, 16), rect(12, 5, kTL, 16), rect(5, 12, kTL, 16),
                      rect(5, 12, kBR, 16), Case{2, 6, 2, 8, 11, 24, kBR},
                      Case{1, 4, 1, 8, 8, 16, kTL}, Case{1, 8, 2, 6, 9, 16, kNone},
                      with_layouts(Case{2, 2, 2, 7, 9, 18, kNone}, L::strided, L::slice, L::bshd,
                                   L::bhsd, LseLayout::contiguous),
                      with_scale(sq(1, 1, 10, 16, kNone), -1.5)),
    [](const auto& param_info) { return case_name(param_info.param); });

// ---- properties that hold for every kernel -----------------------------------------------

class KernelTest : public ::testing::TestWithParam<Variant> {
 protected:
  void SetUp() override { FATTN_SKIP_IF_UNSUPPORTED(GetParam().isa); }
  Options options() const {
    Options o;
    o.impl = GetParam().impl;
    o.isa = GetParam().isa;
    return o;
  }
};

// Without an lse tensor the output is the same, bit for bit, as with one.
TEST_P(KernelTest, LseNullGivesSameOutput) {
  Rng rng;
  const Tensor q = make_input(L::bhsd, 2, 2, 70, 64, rng);
  const Tensor k = make_input(L::bhsd, 2, 2, 90, 64, rng);
  const Tensor v = make_input(L::bhsd, 2, 2, 90, 64, rng);
  for (Causal causal : {kNone, kBR}) {
    Options o = options();
    o.causal = causal;
    Tensor a = make_output(L::bhsd, 2, 2, 70, 64), b = make_output(L::bhsd, 2, 2, 70, 64);
    Tensor lse = make_lse(LseLayout::contiguous, 2, 2, 70);
    fattn::attention_forward(q.view(), k.view(), v.view(), a.view(), lse.view_ptr(), o);
    fattn::attention_forward(q.view(), k.view(), v.view(), b.view(), nullptr, o);
    EXPECT_TRUE(bitwise_equal(a, b)) << to_string(causal);
    EXPECT_TRUE(outputs_near(b, run_reference(q, k, v, o).out));
  }
}

// num_threads = 1 and 2 agree within tolerance (and both match the reference).
TEST_P(KernelTest, OneAndTwoThreadsAgree) {
  Rng rng;
  const Tensor q = make_input(L::bshd, 1, 3, 150, 64, rng);
  const Tensor k = make_input(L::bshd, 1, 3, 150, 64, rng);
  const Tensor v = make_input(L::bshd, 1, 3, 150, 64, rng);
  Options o = options();
  o.causal = kTL;
  Tensor a = make_output(L::bhsd, 1, 3, 150, 64), b = make_output(L::bhsd, 1, 3, 150, 64);
  Tensor la = make_lse(LseLayout::contiguous, 1, 3, 150), lb = make_lse(LseLayout::contiguous, 1, 3, 150);
  o.num_threads = 1;
  fattn::attention_forward(q.view(), k.view(), v.view(), a.view(), la.view_ptr(), o);
  o.num_threads = 2;
  fattn::attention_forward(q.view(), k.view(), v.view(), b.view(), lb.view_ptr(), o);
  EXPECT_TRUE(outputs_near(a, b));
  EXPECT_TRUE(lse_near(la, lb));
  const Result ref = run_reference(q, k, v, o);
  EXPECT_TRUE(outputs_near(a, ref.out));
  EXPECT_TRUE(outputs_near(b, ref.out));
}

// A host ParallelRunner that calls every worker exactly once, in the calling thread.
struct SerialRunner {
  std::atomic<int> calls{0};
  std::atomic<int> max_workers{0};
  bool reverse = false;
  static void run(void* context, int workers, void (*worker)(void*, int), void* arg) {
    auto* self = static_cast<SerialRunner*>(context);
    self->calls.fetch_add(1);
    self->max_workers = std::max(self->max_workers.load(), workers);
    for (int w = 0; w < workers; ++w) worker(arg, self->reverse ? workers - 1 - w : w);
  }
};

// A host ParallelRunner with its own std::threads; it checks the contract
// (each index once) itself.
struct ThreadRunner {
  std::atomic<int> calls{0};
  std::atomic<int> contract_violations{0};
  static void run(void* context, int workers, void (*worker)(void*, int), void* arg) {
    auto* self = static_cast<ThreadRunner*>(context);
    self->calls.fetch_add(1);
    std::vector<std::atomic<int>> seen(static_cast<std::size_t>(workers));
    std::vector<std::thread> threads;
    for (int w = 0; w < workers; ++w)
      threads.emplace_back([&, w] {
        seen[static_cast<std::size_t>(w)].fetch_add(1);
        worker(arg, w);
      });
    for (auto& t : threads) t.join();
    for (auto& s : seen)
      if (s.load() != 1) self->contract_violations.fetch_add(1);
  }
};

// A custom runner gives the same result as fattn's OpenMP team, bit for bit.
TEST_P(KernelTest, CustomRunnerGivesSameResult) {
  Rng rng;
  const std::int64_t B = 2, H = 3, S = 120, D = 64;
  const Tensor q = make_input(L::bhsd, B, H, S, D, rng);
  const Tensor k = make_input(L::bhsd, B, H, S, D, rng);
  const Tensor v = make_input(L::strided, B, H, S, D, rng);  // exercises the V pre-pass too
  Options o = options();
  o.causal = kBR;
  o.num_threads = 3;
  Tensor base = make_output(L::bhsd, B, H, S, D);
  Tensor base_lse = make_lse(LseLayout::contiguous, B, H, S);
  fattn::attention_forward(q.view(), k.view(), v.view(), base.view(), base_lse.view_ptr(), o);
  EXPECT_TRUE(outputs_near(base, run_reference(q, k, v, o).out));

  for (bool reverse : {false, true}) {
    SerialRunner serial;
    serial.reverse = reverse;
    const fattn::ParallelRunner runner{&SerialRunner::run, &serial};
    o.runner = &runner;
    Tensor out = make_output(L::bhsd, B, H, S, D);
    Tensor lse = make_lse(LseLayout::contiguous, B, H, S);
    fattn::attention_forward(q.view(), k.view(), v.view(), out.view(), lse.view_ptr(), o);
    EXPECT_GT(serial.calls.load(), 0) << "the runner was not used";
    EXPECT_EQ(serial.max_workers.load(), 3);
    EXPECT_TRUE(bitwise_equal(out, base)) << "serial runner, reverse " << reverse;
    EXPECT_TRUE(bitwise_equal(lse, base_lse));
  }
  {
    ThreadRunner threads;
    const fattn::ParallelRunner runner{&ThreadRunner::run, &threads};
    o.runner = &runner;
    Tensor out = make_output(L::bhsd, B, H, S, D);
    Tensor lse = make_lse(LseLayout::contiguous, B, H, S);
    fattn::attention_forward(q.view(), k.view(), v.view(), out.view(), lse.view_ptr(), o);
    EXPECT_GT(threads.calls.load(), 0) << "the runner was not used";
    EXPECT_EQ(threads.contract_violations.load(), 0);
    EXPECT_TRUE(bitwise_equal(out, base)) << "std::thread runner";
    EXPECT_TRUE(bitwise_equal(lse, base_lse));
  }
  {  // num_threads = 0 with a runner: the default worker count, through the runner.
    SerialRunner serial;
    const fattn::ParallelRunner runner{&SerialRunner::run, &serial};
    o.runner = &runner;
    o.num_threads = 0;
    Tensor out = make_output(L::bhsd, B, H, S, D);
    fattn::attention_forward(q.view(), k.view(), v.view(), out.view(), nullptr, o);
    if (fattn::default_num_threads() > 1) {
      EXPECT_GT(serial.calls.load(), 0);
    }
    EXPECT_TRUE(outputs_near(out, base));
  }
}

// Inputs may share memory (self-attention on one buffer, k and v the same view) and
// may be broadcast with zero strides; only outputs must be disjoint.
TEST_P(KernelTest, AliasedAndBroadcastInputs) {
  Rng rng;
  {
    const Tensor x = make_input(L::bshd, 2, 2, 80, 32, rng);
    Options o = options();
    o.causal = kTL;
    Tensor out = make_output(L::bhsd, 2, 2, 80, 32);
    Tensor lse = make_lse(LseLayout::contiguous, 2, 2, 80);
    fattn::attention_forward(x.view(), x.view(), x.view(), out.view(), lse.view_ptr(), o);
    const Result ref = run_reference(x, x, x, o);
    EXPECT_TRUE(outputs_near(out, ref.out));
    EXPECT_TRUE(lse_near(lse, ref.lse));
  }
  {  // k and v: one (1, 1, Sk, D) head broadcast over batch and heads with stride 0.
    const std::int64_t B = 3, H = 2, Sq = 40, Sk = 70, D = 48;
    const Tensor q = make_input(L::bhsd, B, H, Sq, D, rng);
    Tensor k = make_input(L::bhsd, 1, 1, Sk, D, rng);
    Tensor v = make_input(L::slice, 1, 1, Sk, D, rng);
    k.view().sizes = {B, H, Sk, D};
    k.view().strides[0] = k.view().strides[1] = 0;
    v.view().sizes = {B, H, Sk, D};
    v.view().strides[0] = v.view().strides[1] = 0;
    Options o = options();
    o.causal = kBR;
    Tensor out = make_output(L::bshd, B, H, Sq, D);
    Tensor lse = make_lse(LseLayout::strided, B, H, Sq);
    fattn::attention_forward(q.view(), k.view(), v.view(), out.view(), lse.view_ptr(), o);
    const Result ref = run_reference(q, k, v, o);
    EXPECT_TRUE(outputs_near(out, ref.out));
    EXPECT_TRUE(lse_near(lse, ref.lse));
  }
}

// An output with size-1 dimensions may have any stride there (even 0): no two
// elements share an address.
TEST_P(KernelTest, SizeOneDimensionsMayHaveAnyStride) {
  Rng rng;
  const Tensor q = make_input(L::bhsd, 1, 1, 1, 64, rng);
  const Tensor k = make_input(L::bhsd, 1, 1, 33, 64, rng);
  const Tensor v = make_input(L::bhsd, 1, 1, 33, 64, rng);
  Tensor out(4, {1, 1, 1, 64}, {0, 0, 0, 1}, 2, kPoison);
  Tensor lse(3, {1, 1, 1, 0}, {0, 0, 0, 0}, 1, kPoison);
  fattn::attention_forward(q.view(), k.view(), v.view(), out.view(), lse.view_ptr(), options());
  const Result ref = run_reference(q, k, v, options());
  EXPECT_TRUE(outputs_near(out, ref.out));
  EXPECT_TRUE(lse_near(lse, ref.lse));
  EXPECT_TRUE(outside_view_untouched(out));
}

INSTANTIATE_TEST_SUITE_P(Kernels, KernelTest, ::testing::ValuesIn(forward_variants()),
                         [](const auto& param_info) { return variant_name(param_info.param); });

// Impl::automatic with Isa::automatic is the fused kernel on automatic_cpu_isa(Sk), bit
// for bit: the best ISA for long key sequences, and avx512 for short ones where the best
// is amx.
TEST(Automatic, IsFusedOnTheIsaForTheProblem) {
  EXPECT_EQ(fattn::automatic_cpu_isa(1 << 20), fattn::best_cpu_isa());
  for (std::int64_t Sk : {100, 700}) {
    SCOPED_TRACE(::testing::Message() << "Sk " << Sk);
    Rng rng;
    const Tensor q = make_input(L::bhsd, 1, 2, 100, 64, rng);
    const Tensor k = make_input(L::bhsd, 1, 2, Sk, 64, rng);
    const Tensor v = make_input(L::bhsd, 1, 2, Sk, 64, rng);
    Options o;
    o.causal = kBR;
    Tensor a = make_output(L::bhsd, 1, 2, 100, 64), b = make_output(L::bhsd, 1, 2, 100, 64);
    fattn::attention_forward(q.view(), k.view(), v.view(), a.view(), nullptr, o);
    o.impl = Impl::fused;
    o.isa = fattn::automatic_cpu_isa(Sk);
    if (fattn::best_cpu_isa() == Isa::amx) EXPECT_EQ(o.isa, Sk < 512 ? Isa::avx512 : Isa::amx);
    fattn::attention_forward(q.view(), k.view(), v.view(), b.view(), nullptr, o);
    EXPECT_TRUE(bitwise_equal(a, b));
    EXPECT_TRUE(outputs_near(a, run_reference(q, k, v, o).out));
  }
}

}  // namespace
}  // namespace fattn_test
