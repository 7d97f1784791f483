// fattn tests — attention_varlen and its backward as one ragged problem: every packed
// sequence against the float64 reference of that sequence alone (attention_forward and
// attention_backward, impl reference, on float64 copies of its own rows), for odd
// lengths, sequences without queries or keys, Sq ≠ Sk, many sequences, GQA, every
// variant varlen takes, float32 and 16-bit inputs, and every kernel varlen can run.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "fattn/attention.hpp"
#include "fattn/kv_cache.hpp"
#include "util/checks.hpp"
#include "util/elements.hpp"
#include "util/seed.hpp"
#include "util/varlen.hpp"

namespace fattn_test {
namespace varlen {
namespace {

class VarlenForward : public ::testing::TestWithParam<Case> {};

TEST_P(VarlenForward, EverySequenceMatchesItsOwnFloat64Reference) {
  const Case c = GetParam();
  if (!fattn::cpu_supports(c.isa)) GTEST_SKIP() << "isa " << fattn::to_string(c.isa) << " not on this CPU";
  Rng rng(test_seed());
  const Lengths lengths =
      c.waves ? wave_lengths() : c.many ? many_lengths(test_seed())
      : c.long_decode ? long_decode_lengths() : odd_lengths();
  Offsets cu(lengths);
  const std::int64_t B = cu.batch(), total_q = cu.q.back(), total_k = cu.k.back();
  Packed q(total_q, c.Hq, c.D, c.dtype, &rng), k(total_k, c.Hkv, c.D, c.dtype, &rng),
      v(total_k, c.Hkv, c.D, c.dtype, &rng), out(total_q, c.Hq, c.D, c.dtype, nullptr);
  std::vector<float> lse(static_cast<std::size_t>(c.Hq * total_q), std::nanf(""));
  const TensorView lse_view = TensorView::lse(lse.data(), 1, c.Hq, total_q);
  Variants variants(c, B, rng);
  fattn::attention_varlen(q.view(), k.view(), v.view(), cu.q_view(), cu.k_view(), out.view(),
                          &lse_view, variants.options(c));

  double worst = 0.0;
  for (std::int64_t b = 0; b < B; ++b) {
    const std::int64_t q0 = cu.q[b], sq = cu.q[b + 1] - q0, k0 = cu.k[b], sk = cu.k[b + 1] - k0;
    if (sq == 0) continue;
    std::vector<double> ref(static_cast<std::size_t>(sq * c.Hq * c.D), 0.0);
    std::vector<double> ref_lse(static_cast<std::size_t>(c.Hq * sq), -kInf);
    if (sk > 0) {
      std::vector<double> qb = q.slice(q0, sq), kb = k.slice(k0, sk), vb = v.slice(k0, sk);
      TensorView s64, k64;
      const TensorView lv = TensorView::lse(ref_lse.data(), DType::float64, 1, c.Hq, sq);
      fattn::attention_forward(TensorView::bshd(qb.data(), 1, sq, c.Hq, c.D, DType::float64),
                               TensorView::bshd(kb.data(), 1, sk, c.Hkv, c.D, DType::float64),
                               TensorView::bshd(vb.data(), 1, sk, c.Hkv, c.D, DType::float64),
                               TensorView::bshd(ref.data(), 1, sq, c.Hq, c.D, DType::float64), &lv,
                               variants.reference_options(c, b, &s64, &k64));
    } else if (!variants.sinks.empty()) {  // no key: out 0, lse the sink
      for (std::int64_t h = 0; h < c.Hq; ++h)
        for (std::int64_t i = 0; i < sq; ++i) ref_lse[h * sq + i] = variants.sinks64[h];
    }
    for (std::int64_t h = 0; h < c.Hq; ++h)
      for (std::int64_t i = 0; i < sq; ++i) {
        const double want = ref_lse[h * sq + i], got = lse[h * total_q + q0 + i];
        if (std::isinf(want)) EXPECT_EQ(got, want) << "b " << b << " h " << h << " i " << i;
        else EXPECT_NEAR(got, want, lse_tolerance(c.dtype) * std::max(1.0, std::fabs(want)))
            << "lse of b " << b << " (Sq " << sq << ", Sk " << sk << ") h " << h << " i " << i;
        for (std::int64_t d = 0; d < c.D; ++d) {
          const double r = ref[(i * c.Hq + h) * c.D + d], o = out.read(q0 + i, h, d);
          const double err = std::fabs(o - r) / std::max(1.0, std::fabs(r));
          worst = std::max(worst, std::isnan(o) ? kInf : err);
          if (!(err <= out_tolerance(c.dtype)))
            ADD_FAILURE() << "out of b " << b << " (Sq " << sq << ", Sk " << sk << ") h " << h
                          << " i " << i << " d " << d << ": " << o << " vs " << r;
        }
      }
  }
  RecordProperty("worst_relative_error", std::to_string(worst));
}

INSTANTIATE_TEST_SUITE_P(Cases, VarlenForward, ::testing::ValuesIn(forward_cases()));

INSTANTIATE_TEST_SUITE_P(Amx, VarlenForward, ::testing::ValuesIn(amx_cases()));

// The ragged problem's own float64 path (impl auto on float64 inputs runs the reference over
// every sequence at once) gives the same numbers as the per-sequence float64 reference.
TEST(VarlenFloat64, RaggedReferenceEqualsPerSequenceReference) {
  Case c;
  c.dtype = DType::float64, c.variant = Variant::alibi_per_sequence;
  Rng rng(test_seed());
  Offsets cu(many_lengths(test_seed()));
  const std::int64_t B = cu.batch(), total_q = cu.q.back(), total_k = cu.k.back();
  Packed q(total_q, c.Hq, c.D, c.dtype, &rng), k(total_k, c.Hkv, c.D, c.dtype, &rng),
      v(total_k, c.Hkv, c.D, c.dtype, &rng), out(total_q, c.Hq, c.D, c.dtype, nullptr);
  Variants variants(c, B, rng);
  TensorView s64_all = TensorView{variants.slopes64.data(), 2, {B, c.Hq, 0, 0}, {c.Hq, 1, 0, 0}, DType::float64};
  Options o = variants.options(c);
  o.alibi_slopes = &s64_all;
  fattn::attention_varlen(q.view(), k.view(), v.view(), cu.q_view(), cu.k_view(), out.view(), nullptr, o);
  for (std::int64_t b = 0; b < B; ++b) {
    const std::int64_t q0 = cu.q[b], sq = cu.q[b + 1] - q0, k0 = cu.k[b], sk = cu.k[b + 1] - k0;
    if (sq == 0 || sk == 0) continue;
    std::vector<double> qb = q.slice(q0, sq), kb = k.slice(k0, sk), vb = v.slice(k0, sk);
    std::vector<double> ref(qb.size());
    TensorView s64, k64;
    fattn::attention_forward(TensorView::bshd(qb.data(), 1, sq, c.Hq, c.D, DType::float64),
                             TensorView::bshd(kb.data(), 1, sk, c.Hkv, c.D, DType::float64),
                             TensorView::bshd(vb.data(), 1, sk, c.Hkv, c.D, DType::float64),
                             TensorView::bshd(ref.data(), 1, sq, c.Hq, c.D, DType::float64), nullptr,
                             variants.reference_options(c, b, &s64, &k64));
    for (std::size_t e = 0; e < ref.size(); ++e)
      ASSERT_EQ(out.read(static_cast<std::size_t>(q0 * c.Hq * c.D) + e), ref[e])
          << "b " << b << " element " << e;
  }
}

// ---- backward ------------------------------------------------------------------------------

class VarlenBackward : public ::testing::TestWithParam<Case> {};

// dq, dk, dv (and dsinks, summed over every sequence) of the packed call against each
// sequence's own float64 reference backward (from its float64 forward's out and lse).
TEST_P(VarlenBackward, EverySequenceMatchesItsOwnFloat64Gradients) {
  const Case c = GetParam();
  if (!fattn::cpu_supports(c.isa)) GTEST_SKIP() << "isa " << fattn::to_string(c.isa) << " not on this CPU";
  Rng rng(test_seed());
  Offsets cu(c.waves ? wave_lengths() : c.many ? many_lengths(test_seed()) : odd_lengths());
  const std::int64_t B = cu.batch(), total_q = cu.q.back(), total_k = cu.k.back();
  Packed q(total_q, c.Hq, c.D, c.dtype, &rng), k(total_k, c.Hkv, c.D, c.dtype, &rng),
      v(total_k, c.Hkv, c.D, c.dtype, &rng), dout(total_q, c.Hq, c.D, c.dtype, &rng),
      out(total_q, c.Hq, c.D, c.dtype, nullptr), dq(total_q, c.Hq, c.D, c.dtype, nullptr),
      dk(total_k, c.Hkv, c.D, c.dtype, nullptr), dv(total_k, c.Hkv, c.D, c.dtype, nullptr);
  std::vector<float> lse(static_cast<std::size_t>(c.Hq * total_q)), dsinks(c.Hq, std::nanf(""));
  const TensorView lse_view = TensorView::lse(lse.data(), 1, c.Hq, total_q);
  Variants variants(c, B, rng);
  const Options o = variants.options(c);
  TensorView dsinks_view = vector_view(dsinks.data(), c.Hq, DType::float32);
  const TensorView* ds = variants.sinks.empty() ? nullptr : &dsinks_view;
  fattn::attention_varlen(q.view(), k.view(), v.view(), cu.q_view(), cu.k_view(), out.view(), &lse_view, o);
  fattn::attention_varlen_backward(q.view(), k.view(), v.view(), out.view(), dout.view(), lse_view,
                                   cu.q_view(), cu.k_view(), dq.view(), dk.view(), dv.view(), o, ds);

  // The same bits on a second call (the schedule depends only on the problem and threads).
  Packed dq2(total_q, c.Hq, c.D, c.dtype, nullptr), dk2(total_k, c.Hkv, c.D, c.dtype, nullptr),
      dv2(total_k, c.Hkv, c.D, c.dtype, nullptr);
  fattn::attention_varlen_backward(q.view(), k.view(), v.view(), out.view(), dout.view(), lse_view,
                                   cu.q_view(), cu.k_view(), dq2.view(), dk2.view(), dv2.view(), o, ds);
  EXPECT_EQ(dq.bytes, dq2.bytes);
  EXPECT_EQ(dk.bytes, dk2.bytes);
  EXPECT_EQ(dv.bytes, dv2.bytes);

  std::vector<double> dsinks_ref(c.Hq, 0.0);
  const double tol = c.dtype == DType::float32 ? 2e-4 : 3e-2;
  for (std::int64_t b = 0; b < B; ++b) {
    const std::int64_t q0 = cu.q[b], sq = cu.q[b + 1] - q0, k0 = cu.k[b], sk = cu.k[b + 1] - k0;
    std::vector<double> gq(static_cast<std::size_t>(sq * c.Hq * c.D), 0.0);
    std::vector<double> gk(static_cast<std::size_t>(sk * c.Hkv * c.D), 0.0), gv = gk;
    if (sq > 0 && sk > 0) {
      std::vector<double> qb = q.slice(q0, sq), kb = k.slice(k0, sk), vb = v.slice(k0, sk);
      std::vector<double> gb = dout.slice(q0, sq), ob(qb.size()), lb(static_cast<std::size_t>(c.Hq * sq));
      std::vector<double> sink_part(c.Hq, 0.0);
      TensorView s64, k64;
      const Options ro = variants.reference_options(c, b, &s64, &k64);
      auto t = [&](std::vector<double>& x, std::int64_t rows, std::int64_t heads) {
        return TensorView::bshd(x.data(), 1, rows, heads, c.D, DType::float64);
      };
      const TensorView lv = TensorView::lse(lb.data(), DType::float64, 1, c.Hq, sq);
      fattn::attention_forward(t(qb, sq, c.Hq), t(kb, sk, c.Hkv), t(vb, sk, c.Hkv), t(ob, sq, c.Hq), &lv, ro);
      TensorView part = vector_view(sink_part.data(), c.Hq, DType::float64);
      fattn::attention_backward(t(qb, sq, c.Hq), t(kb, sk, c.Hkv), t(vb, sk, c.Hkv), t(ob, sq, c.Hq),
                                t(gb, sq, c.Hq), lv, nullptr, t(gq, sq, c.Hq), t(gk, sk, c.Hkv),
                                t(gv, sk, c.Hkv), ro, variants.sinks.empty() ? nullptr : &part);
      for (std::int64_t h = 0; h < c.Hq; ++h) dsinks_ref[h] += sink_part[h];
    }
    auto check = [&](const char* name, Packed& got, const std::vector<double>& want,
                     std::int64_t row0, std::int64_t heads) {
      double scale = 1.0;
      for (const double w : want) scale = std::max(scale, std::fabs(w));
      for (std::size_t e = 0; e < want.size(); ++e) {
        const auto i = static_cast<std::int64_t>(e) / (heads * c.D);
        const double g = got.read(row0 + i, static_cast<std::int64_t>(e) / c.D % heads,
                                  static_cast<std::int64_t>(e) % c.D);
        if (!(std::fabs(g - want[e]) <= tol * scale))
          ADD_FAILURE() << name << " of b " << b << " (Sq " << sq << ", Sk " << sk << ") element "
                        << e << ": " << g << " vs " << want[e];
      }
    };
    check("dq", dq, gq, q0, c.Hq);
    check("dk", dk, gk, k0, c.Hkv);
    check("dv", dv, gv, k0, c.Hkv);
  }
  for (std::int64_t h = 0; h < static_cast<std::int64_t>(variants.sinks.size()); ++h)
    EXPECT_NEAR(dsinks[h], dsinks_ref[h], tol * std::max(1.0, std::fabs(dsinks_ref[h]))) << h;
}

std::vector<Case> backward_cases() {
  std::vector<Case> all;
  for (Variant variant : {Variant::plain, Variant::window, Variant::sinks, Variant::alibi_per_sequence,
                          Variant::softcap})
    for (Causal causal : {Causal::none, Causal::top_left, Causal::bottom_right}) {
      Case c;
      c.variant = variant, c.causal = causal;
      all.push_back(c);
    }
  Case bf16;
  bf16.dtype = DType::bfloat16, bf16.variant = Variant::sinks;
  all.push_back(bf16);
  Case many;
  many.many = true, many.threads = 3, many.Hq = many.Hkv = 4;
  all.push_back(many);
  Case naive;
  naive.impl = Impl::naive, naive.causal = Causal::top_left;
  all.push_back(naive);
  auto with = [&](auto&& change) {
    Case c;
    change(c);
    all.push_back(c);
  };
  // 16 threads: the sequences with 1/16 of the work each run on every worker, all at once,
  // with fewer kv heads among them than the items the call aims at, so the longest split
  // their keys into chunks and their query heads into subgroups (partials).
  with([](Case& c) { c.threads = 16; });
  with([](Case& c) { c.threads = 16, c.causal = Causal::none, c.variant = Variant::softcap; });
  with([](Case& c) { c.threads = 16, c.Hq = c.Hkv = 1, c.variant = Variant::window; });
  with([](Case& c) { c.threads = 16, c.dtype = DType::bfloat16, c.variant = Variant::sinks; });
  // 32 threads on 41 sequences: a dozen of them each with 1/32 of the work, most of them
  // one item per kv head.
  with([](Case& c) { c.many = true, c.threads = 32, c.Hq = c.Hkv = 8, c.causal = Causal::top_left; });
  // 8 threads on the wave lengths: four sequences of ~2000 keys (~9 MB of working memory
  // each at D = 64) through the ragged backward in two waves.
  with([](Case& c) { c.waves = true, c.Hq = c.Hkv = 8, c.threads = 8, c.variant = Variant::window; });
  with([](Case& c) { c.isa = Isa::avx2, c.variant = Variant::window, c.D = 80; });
  with([](Case& c) { c.isa = Isa::portable, c.variant = Variant::alibi_per_sequence; });
  return all;
}

INSTANTIATE_TEST_SUITE_P(Cases, VarlenBackward, ::testing::ValuesIn(backward_cases()));
// Three cases: the AMX backward on emulated tiles takes seconds a case. At 16 threads three
// sequences need every thread and split their keys into chunks (dQ partials).
std::vector<Case> amx_backward_cases() {
  std::vector<Case> all(3);
  all[0].isa = all[1].isa = all[2].isa = Isa::amx;
  all[1].causal = Causal::none, all[1].variant = Variant::softcap;
  all[2].threads = 16, all[2].variant = Variant::sinks;
  return all;
}
INSTANTIATE_TEST_SUITE_P(Amx, VarlenBackward, ::testing::ValuesIn(amx_backward_cases()));

// ---- arguments ------------------------------------------------------------------------------

TEST(VarlenArguments, AreCheckedOnceAndNamed) {
  std::vector<float> q(10 * 4 * 16, 0.5f), k(12 * 2 * 16, 0.25f), v = k, out(q.size(), 7.0f);
  const auto qv = TensorView::bshd(q.data(), 1, 10, 4, 16), ov = TensorView::bshd(out.data(), 1, 10, 4, 16);
  const auto kv = TensorView::bshd(k.data(), 1, 12, 2, 16), vv = TensorView::bshd(v.data(), 1, 12, 2, 16);
  std::vector<std::int32_t> cq{0, 4, 10}, ck{0, 5, 12}, short_k{0, 12}, last_q{0, 4, 9};
  auto run = [&](std::vector<std::int32_t>& a, std::vector<std::int32_t>& b, const Options& o = {}) {
    fattn::attention_varlen(qv, kv, vv, TensorView::int32_vector(a.data(), static_cast<std::int64_t>(a.size())),
                            TensorView::int32_vector(b.data(), static_cast<std::int64_t>(b.size())), ov, nullptr, o);
  };
  expect_error([&] { run(cq, short_k); },
               "cu_seqlens_k.size(0) must equal cu_seqlens_q.size(0) = 3, got 2");
  expect_error([&] { run(last_q, ck); },
               "cu_seqlens_q[2] (the last offset) must equal q's total rows = 10, got 9");
  std::vector<float> slopes(3 * 4, 0.1f);
  const TensorView three_rows{slopes.data(), 2, {3, 4, 0, 0}, {4, 1, 0, 0}};
  Options o;
  o.alibi_slopes = &three_rows;
  expect_error([&] { run(cq, ck, o); }, "alibi_slopes");
  expect_error([&] { run(cq, ck, o); }, "= 2, got 3");
  for (const float x : out) EXPECT_EQ(x, 7.0f);  // nothing written by a call that threw
}

}  // namespace
}  // namespace varlen
}  // namespace fattn_test
