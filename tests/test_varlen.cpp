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

namespace fattn_test {
namespace {

using fattn::Causal;
using fattn::DType;
using fattn::Impl;
using fattn::Isa;
using fattn::Options;
using fattn::TensorView;

constexpr double kInf = std::numeric_limits<double>::infinity();

enum class Variant { plain, window, softcap, sinks, alibi, alibi_per_sequence };
const char* variant_name(Variant v) {
  switch (v) {
    case Variant::window: return "window";
    case Variant::softcap: return "softcap";
    case Variant::sinks: return "sinks";
    case Variant::alibi: return "alibi";
    case Variant::alibi_per_sequence: return "alibi_BxH";
    default: return "plain";
  }
}

using Lengths = std::vector<std::pair<std::int32_t, std::int32_t>>;  // (Sq, Sk) per sequence

// Odd lengths, sequences without queries, without keys or without both, Sq > Sk and Sq < Sk.
Lengths odd_lengths() {
  return {{1, 1},  {0, 5},  {7, 0},   {13, 13},  {17, 40}, {33, 9},
          {70, 70}, {5, 130}, {129, 131}, {0, 0}, {3, 64}, {65, 64}};
}
// Many short sequences of random lengths (0 to 90 queries, equal or random keys).
Lengths many_lengths(std::uint64_t seed) {
  Rng rng(seed);
  Lengths l;
  for (int b = 0; b < 41; ++b) {
    const auto sq = static_cast<std::int32_t>(rng.index(91));
    l.push_back({sq, b % 2 ? sq : static_cast<std::int32_t>(rng.index(121))});
  }
  return l;
}

// Sequences of ~2000 keys at Hkv = 8, D = 64 (8 MB of K and V packed as float32 each):
// more than one wave of the fused kernel (run_fused_in_waves: 16 MiB a wave up to 8 threads),
// and among them sequences of few queries, which impl auto runs on the decode kernel, and
// one without keys.
Lengths wave_lengths() {
  return {{70, 2100}, {3, 40}, {80, 1900}, {5, 0}, {66, 2300}, {1, 500}, {90, 2050}, {0, 300}};
}

// Two sequences of few queries against thousands of keys (the decode kernel's, under impl
// auto), each with over 1/4 of the work, among short ones.
Lengths long_decode_lengths() {
  return {{1, 6000}, {17, 17}, {2, 3000}, {30, 40}, {5, 0}, {64, 64}, {0, 7}};
}

struct Case {
  DType dtype = DType::float32;
  Causal causal = Causal::bottom_right;
  Variant variant = Variant::plain;
  std::int64_t Hq = 8, Hkv = 2, D = 64;
  int threads = 2;
  Impl impl = Impl::automatic;
  Isa isa = Isa::automatic;
  bool many = false;
  bool waves = false;  // wave_lengths (with Hkv = 8, D = 64)
  bool long_decode = false;  // long_decode_lengths
};
void PrintTo(const Case& c, std::ostream* os) {
  *os << fattn::to_string(c.dtype) << "_" << fattn::to_string(c.causal) << "_"
      << variant_name(c.variant) << "_H" << c.Hq << "x" << c.Hkv << "_D" << c.D << "_t"
      << c.threads << "_" << fattn::to_string(c.impl) << "_" << fattn::to_string(c.isa)
      << (c.waves ? "_waves" : c.many ? "_many" : c.long_decode ? "_long_decode" : "_odd");
}

// Packed (total, H, D) rows drawn in float32, rounded to the case's dtype: `values` holds
// the numbers the kernel reads (as doubles, for the reference), `bytes` the tensor itself.
struct Packed {
  std::int64_t rows, heads, D;
  DType dtype;
  std::vector<double> values;
  std::vector<std::uint8_t> bytes;
  Packed(std::int64_t r, std::int64_t h, std::int64_t d, DType t, Rng* rng)
      : rows(r), heads(h), D(d), dtype(t),
        values(static_cast<std::size_t>(r * h * d)),
        bytes(values.size() * static_cast<std::size_t>(fattn::element_size(t)) + 1) {
    for (std::size_t e = 0; e < values.size(); ++e) {
      const float x = rng ? rng->normal() : std::numeric_limits<float>::quiet_NaN();
      write(e, x);
      values[e] = read(e);
    }
  }
  void write(std::size_t e, double x) {
    if (dtype == DType::float64) std::memcpy(at(e), &x, sizeof x);
    else element_from_float(dtype, static_cast<float>(x), at(e));
  }
  double read(std::size_t e) {
    double x = 0.0;
    if (dtype == DType::float64) std::memcpy(&x, at(e), sizeof x);
    else x = element_to_float(dtype, at(e));
    return x;
  }
  std::uint8_t* at(std::size_t e) { return bytes.data() + e * fattn::element_size(dtype); }
  double read(std::int64_t row, std::int64_t h, std::int64_t d) {
    return read(static_cast<std::size_t>((row * heads + h) * D + d));
  }
  TensorView view() { return TensorView::bshd(bytes.data(), 1, rows, heads, D, dtype); }
  // Rows [begin, begin + n) as float64 (1, n, H, D).
  std::vector<double> slice(std::int64_t begin, std::int64_t n) const {
    return {values.begin() + begin * heads * D, values.begin() + (begin + n) * heads * D};
  }
};

TensorView vector_view(void* data, std::int64_t n, DType dtype) {
  return {data, 1, {n, 0, 0, 0}, {1, 0, 0, 0}, dtype};
}

// The variants of a case: float32 slopes and sinks for the kernels (float64 for the
// reference), one ALiBi row per sequence for alibi_per_sequence.
struct Variants {
  std::vector<float> slopes, sinks;
  std::vector<double> slopes64, sinks64;
  TensorView slopes_view, sinks_view;
  Variants(const Case& c, std::int64_t batch, Rng& rng) {
    const std::int64_t rows = c.variant == Variant::alibi_per_sequence ? batch : 1;
    if (c.variant == Variant::alibi || c.variant == Variant::alibi_per_sequence)
      for (std::int64_t e = 0; e < rows * c.Hq; ++e) slopes.push_back(static_cast<float>(rng.uniform(0.01, 0.5)));
    if (c.variant == Variant::sinks)
      for (std::int64_t h = 0; h < c.Hq; ++h) sinks.push_back(static_cast<float>(rng.uniform(-1.0, 2.0)));
    slopes64.assign(slopes.begin(), slopes.end());
    sinks64.assign(sinks.begin(), sinks.end());
    slopes_view = c.variant == Variant::alibi_per_sequence
                      ? TensorView{slopes.data(), 2, {batch, c.Hq, 0, 0}, {c.Hq, 1, 0, 0}}
                      : vector_view(slopes.data(), c.Hq, DType::float32);
    sinks_view = vector_view(sinks.data(), c.Hq, DType::float32);
  }
  Options options(const Case& c) const {
    Options o;
    o.causal = c.causal;
    o.impl = c.impl;
    o.isa = c.isa;
    o.num_threads = c.threads;
    if (c.variant == Variant::window) o.window_left = 19, o.window_right = 6;
    if (c.variant == Variant::softcap) o.softcap = 3.5;
    if (!slopes.empty()) o.alibi_slopes = &slopes_view;
    if (!sinks.empty()) o.sinks = &sinks_view;
    return o;
  }
  // The reference's options for sequence b: float64 slopes (that sequence's row) and sinks.
  Options reference_options(const Case& c, std::int64_t b, TensorView* s64, TensorView* k64) {
    Options o = options(c);
    o.impl = Impl::reference;
    o.isa = Isa::automatic;
    o.num_threads = 1;
    if (!slopes.empty()) {
      const std::int64_t row = c.variant == Variant::alibi_per_sequence ? b : 0;
      *s64 = vector_view(slopes64.data() + row * c.Hq, c.Hq, DType::float64);
      o.alibi_slopes = s64;
    }
    if (!sinks.empty()) {
      *k64 = vector_view(sinks64.data(), c.Hq, DType::float64);
      o.sinks = k64;
    }
    return o;
  }
};

struct Offsets {
  std::vector<std::int32_t> q{0}, k{0};
  explicit Offsets(const Lengths& l) {
    for (const auto& [sq, sk] : l) q.push_back(q.back() + sq), k.push_back(k.back() + sk);
  }
  std::int64_t batch() const { return static_cast<std::int64_t>(q.size()) - 1; }
  TensorView q_view() { return TensorView::int32_vector(q.data(), batch() + 1); }
  TensorView k_view() { return TensorView::int32_vector(k.data(), batch() + 1); }
};

// Outputs within float32's error of the reference (relative to max(1, |ref|)), or half a
// unit in the last place of a 16-bit output plus the bfloat16 dot products' rounding of p.
double out_tolerance(DType dtype) { return dtype == DType::float32 ? 2e-5 : 1e-2; }
double lse_tolerance(DType dtype) { return dtype == DType::float32 ? 1e-5 : 1e-4; }

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

std::vector<Case> forward_cases() {
  std::vector<Case> all;
  for (DType dtype : {DType::float32, DType::bfloat16})
    for (Causal causal : {Causal::none, Causal::top_left, Causal::bottom_right})
      for (Variant variant : {Variant::plain, Variant::window, Variant::softcap, Variant::sinks,
                              Variant::alibi, Variant::alibi_per_sequence}) {
        Case c;
        c.dtype = dtype, c.causal = causal, c.variant = variant;
        all.push_back(c);
      }
  auto with = [&](auto&& change) {
    Case c;
    change(c);
    all.push_back(c);
  };
  with([](Case& c) { c.many = true, c.Hq = 4, c.Hkv = 4, c.D = 128, c.threads = 3; });
  with([](Case& c) { c.many = true, c.dtype = DType::bfloat16, c.D = 128, c.threads = 3; });
  with([](Case& c) { c.many = true, c.dtype = DType::float16, c.variant = Variant::sinks; });
  // 8 threads: the four long sequences each need every thread, and run through the fused
  // kernel's items together, in two waves.
  auto waves = [](Case& c) { c.waves = true, c.Hq = 8, c.Hkv = 8, c.D = 64, c.threads = 8; };
  with(waves);
  with([&](Case& c) { waves(c), c.impl = Impl::fused, c.variant = Variant::sinks; });
  with([&](Case& c) {
    waves(c), c.dtype = DType::bfloat16, c.variant = Variant::alibi_per_sequence;
  });
  // Many threads: the sequences with 1/threads of the work each run through the fused
  // kernel's items together (at 2-3 threads most run side by side, one thread each).
  with([](Case& c) { c.many = true, c.threads = 32, c.Hq = c.Hkv = 8, c.impl = Impl::fused; });
  with([](Case& c) { c.threads = 16, c.variant = Variant::alibi_per_sequence, c.causal = Causal::top_left; });
  // 4 threads: the two long decode sequences each need every thread (run_decode, one after
  // the other), the rest side by side.
  with([](Case& c) { c.long_decode = true, c.threads = 4, c.variant = Variant::sinks; });
  with([](Case& c) { c.dtype = DType::bfloat16, c.D = 80, c.Hq = 6, c.Hkv = 3; });
  with([](Case& c) { c.D = 80, c.Hq = 6, c.Hkv = 1, c.threads = 1; });
  with([](Case& c) { c.isa = Isa::avx2, c.variant = Variant::window; });
  with([](Case& c) { c.isa = Isa::avx2, c.dtype = DType::bfloat16; });
  with([](Case& c) { c.isa = Isa::portable, c.variant = Variant::alibi_per_sequence; });
  with([](Case& c) { c.impl = Impl::fused, c.variant = Variant::sinks; });
  with([](Case& c) { c.impl = Impl::naive, c.variant = Variant::sinks; });
  with([](Case& c) { c.impl = Impl::decode, c.variant = Variant::sinks, c.Hkv = 8; });
  with([](Case& c) { c.impl = Impl::decode, c.dtype = DType::bfloat16, c.causal = Causal::top_left; });
  with([](Case& c) { c.impl = Impl::reference, c.variant = Variant::softcap; });
  return all;
}

INSTANTIATE_TEST_SUITE_P(Cases, VarlenForward, ::testing::ValuesIn(forward_cases()));

// The AMX kernels (isa amx; on a CPU without AMX, skipped, or built with emulated tiles):
// the fused forward and backward take the ragged batch whole, the forward every variant
// varlen takes.
std::vector<Case> amx_cases() {
  std::vector<Case> all;
  for (Variant variant : {Variant::plain, Variant::window, Variant::softcap, Variant::sinks,
                          Variant::alibi_per_sequence})
    for (Causal causal : {Causal::none, Causal::bottom_right}) {
      Case c;
      c.isa = Isa::amx, c.variant = variant, c.causal = causal;
      all.push_back(c);
    }
  Case many;
  many.isa = Isa::amx, many.many = true, many.impl = Impl::fused, many.threads = 16;
  all.push_back(many);
  Case waves;
  waves.isa = Isa::amx, waves.waves = true, waves.Hq = waves.Hkv = 8, waves.threads = 8;
  waves.causal = Causal::top_left;
  all.push_back(waves);
  return all;
}
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
}  // namespace fattn_test
