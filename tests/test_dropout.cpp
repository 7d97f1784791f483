// fattn tests — attention dropout (Options::dropout_p): the mask's definition (Philox4x32-10
// against the Random123 known answers), its statistics (keep rate within a binomial
// bound over 2^21 draws, no correlation between neighbouring keys, rows or heads), every
// CPU kernel's forward and backward against the float64 reference applying the same mask,
// odd sizes, Sq != Sk, GQA, causal both, varlen; the same bits on any thread count, twice
// from one seed, different from another seed; and the errors that name the argument.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "fattn/attention.hpp"
#include "fattn/kv_cache.hpp"
#include "model/dropout.hpp"
#include "util/checks.hpp"
#include "util/seed.hpp"

namespace fattn_test {
namespace {

using fattn::Causal;
using fattn::DType;
using fattn::Impl;
using fattn::Isa;
using fattn::Options;
using fattn::TensorView;
using fattn::detail::Dropout;

// Random123's known answers for philox4x32_10 (counter, key → output).
TEST(DropoutMask, IsPhilox4x32_10) {
  struct Answer {
    std::uint32_t counter[4], key[2], out[4];
  };
  const Answer answers[] = {
      {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
      {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, {0xffffffff, 0xffffffff},
       {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
      {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, {0xa4093822, 0x299f31d0},
       {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}}};
  for (const Answer& a : answers) {
    std::uint32_t c[4] = {a.counter[0], a.counter[1], a.counter[2], a.counter[3]};
    fattn::detail::philox4x32(std::uint64_t{a.key[1]} << 32 | a.key[0], c);
    for (int w = 0; w < 4; ++w) EXPECT_EQ(c[w], a.out[w]) << "word " << w;
  }
}

Dropout dropout_of(double p, std::uint64_t seed) {
  Dropout d;
  d.p = p;
  d.threshold = Dropout::threshold_of(p);
  d.scale = static_cast<float>(1.0 / (1.0 - p));
  d.seed = seed;
  return d;
}

// Over 2^21 (row, key) pairs of two heads: the keep rate within 5 standard deviations of
// 1 − p, and pairs of neighbours (next key, next row, next head) kept together at the
// rate of independent draws, (1 − p)².
TEST(DropoutMask, KeepsOneMinusPIndependently) {
  for (const double p : {0.1, 0.5, 0.9}) {
    const Dropout d = dropout_of(p, test_seed());
    const std::int64_t rows = 1024, keys = 1024, n = 2 * rows * keys;
    std::vector<std::uint8_t> kept(static_cast<std::size_t>(n));
    std::int64_t count = 0;
    for (std::int64_t h = 0; h < 2; ++h)
      for (std::int64_t i = 0; i < rows; ++i)
        for (std::int64_t j = 0; j < keys; ++j) {
          const bool k = fattn::detail::dropout_keeps(d, 0, h, 2, i, j);
          kept[static_cast<std::size_t>((h * rows + i) * keys + j)] = k;
          count += k;
        }
    const double q = 1.0 - p;
    EXPECT_NEAR(static_cast<double>(count) / n, q, 5.0 * std::sqrt(q * p / n)) << "p " << p;
    auto at = [&](std::int64_t h, std::int64_t i, std::int64_t j) {
      return kept[static_cast<std::size_t>((h * rows + i) * keys + j)];
    };
    struct Neighbour {
      const char* name;
      std::int64_t dh, di, dj;
    };
    for (const Neighbour& nb : {Neighbour{"key", 0, 0, 1}, Neighbour{"row", 0, 1, 0},
                                Neighbour{"head", 1, 0, 0}, Neighbour{"key + 4", 0, 0, 4}}) {
      std::int64_t both = 0, pairs = 0;
      for (std::int64_t h = 0; h + nb.dh < 2; ++h)
        for (std::int64_t i = 0; i + nb.di < rows; ++i)
          for (std::int64_t j = 0; j + nb.dj < keys; ++j, ++pairs)
            both += at(h, i, j) && at(h + nb.dh, i + nb.di, j + nb.dj);
      const double rate = static_cast<double>(both) / pairs, want = q * q;
      EXPECT_NEAR(rate, want, 5.0 * std::sqrt(want * (1 - want) / pairs))
          << "p " << p << ", pairs of neighbouring " << nb.name << "s";
    }
  }
}

struct Case {
  DType dtype = DType::float32;
  std::int64_t B = 2, Hq = 4, Hkv = 2, Sq = 37, Sk = 53, D = 64;
  Causal causal = Causal::none;
  Isa isa = Isa::automatic;
  int threads = 2;
  double p = 0.2;
};
void PrintTo(const Case& c, std::ostream* os) {
  *os << fattn::to_string(c.dtype) << "_B" << c.B << "_H" << c.Hq << "x" << c.Hkv << "_Sq" << c.Sq
      << "_Sk" << c.Sk << "_D" << c.D << "_" << fattn::to_string(c.causal) << "_"
      << fattn::to_string(c.isa) << "_t" << c.threads << "_p" << c.p;
}

// float32 tensors (B, H, S, D) drawn from the test seed, and 16-bit copies where the case
// asks (the reference reads the rounded values, as float32).
struct Tensors {
  std::vector<float> q, k, v, dout;
  Tensors(const Case& c, std::uint64_t seed) {
    Rng rng(seed);
    auto draw = [&](std::int64_t n) {
      std::vector<float> x(static_cast<std::size_t>(n));
      for (float& e : x) e = rng.normal();
      if (c.dtype != DType::float32)
        for (float& e : x) e = fattn::from_16bit(fattn::to_16bit(e, c.dtype), c.dtype);
      return x;
    };
    q = draw(c.B * c.Hq * c.Sq * c.D);
    k = draw(c.B * c.Hkv * c.Sk * c.D);
    v = draw(c.B * c.Hkv * c.Sk * c.D);
    dout = draw(c.B * c.Hq * c.Sq * c.D);
  }
};

// The tensors in the case's dtype (16-bit bits or float32), as views.
struct Typed {
  std::vector<std::uint8_t> bytes;
  DType dtype;
  Typed(const std::vector<float>& x, DType t) : bytes(x.size() * fattn::element_size(t)), dtype(t) {
    for (std::size_t e = 0; e < x.size(); ++e) {
      if (t == DType::float32) {
        std::memcpy(bytes.data() + 4 * e, &x[e], 4);
      } else {
        const std::uint16_t h = fattn::to_16bit(x[e], t);
        std::memcpy(bytes.data() + 2 * e, &h, 2);
      }
    }
  }
  float at(std::size_t e) const {
    if (dtype == DType::float32) {
      float f;
      std::memcpy(&f, bytes.data() + 4 * e, 4);
      return f;
    }
    std::uint16_t h;
    std::memcpy(&h, bytes.data() + 2 * e, 2);
    return fattn::from_16bit(h, dtype);
  }
  TensorView view(std::int64_t B, std::int64_t H, std::int64_t S, std::int64_t D) {
    return TensorView::bhsd(bytes.data(), B, H, S, D, dtype);
  }
};

Options options_of(const Case& c, Impl impl, std::uint64_t seed) {
  Options o;
  o.causal = c.causal;
  o.impl = impl;
  o.isa = impl == Impl::reference ? Isa::automatic : c.isa;
  o.num_threads = c.threads;
  o.dropout_p = c.p;
  o.dropout_seed = seed;
  o.dropout_offset = 7;
  return o;
}

// The fused kernel's forward and backward on the case, and the float64 reference's on the
// same (rounded) numbers with the same mask.
class DropoutKernels : public ::testing::TestWithParam<Case> {};

TEST_P(DropoutKernels, MatchTheReferenceWithTheSameMask) {
  const Case c = GetParam();
  if (!fattn::cpu_supports(c.isa)) GTEST_SKIP() << "isa not on this CPU";
  const std::uint64_t seed = test_seed();
  const Tensors x(c, seed);
  const std::int64_t nq = c.B * c.Hq * c.Sq * c.D, nk = c.B * c.Hkv * c.Sk * c.D;
  Typed q(x.q, c.dtype), k(x.k, c.dtype), v(x.v, c.dtype), dout(x.dout, c.dtype);
  Typed out(std::vector<float>(static_cast<std::size_t>(nq), std::nanf("")), c.dtype);
  std::vector<float> lse(static_cast<std::size_t>(c.B * c.Hq * c.Sq), std::nanf(""));
  const TensorView lse_view = TensorView::lse(lse.data(), c.B, c.Hq, c.Sq);
  const Options o = options_of(c, Impl::automatic, seed + 1);
  fattn::attention_forward(q.view(c.B, c.Hq, c.Sq, c.D), k.view(c.B, c.Hkv, c.Sk, c.D),
                           v.view(c.B, c.Hkv, c.Sk, c.D), out.view(c.B, c.Hq, c.Sq, c.D), &lse_view, o);
  Typed dq(std::vector<float>(static_cast<std::size_t>(nq), std::nanf("")), c.dtype);
  Typed dk(std::vector<float>(static_cast<std::size_t>(nk), std::nanf("")), c.dtype);
  Typed dv(dk);
  fattn::attention_backward(q.view(c.B, c.Hq, c.Sq, c.D), k.view(c.B, c.Hkv, c.Sk, c.D),
                            v.view(c.B, c.Hkv, c.Sk, c.D), out.view(c.B, c.Hq, c.Sq, c.D),
                            dout.view(c.B, c.Hq, c.Sq, c.D), lse_view, nullptr,
                            dq.view(c.B, c.Hq, c.Sq, c.D), dk.view(c.B, c.Hkv, c.Sk, c.D),
                            dv.view(c.B, c.Hkv, c.Sk, c.D), o);

  // The reference in float64 on the same numbers.
  auto wide = [](const std::vector<float>& f) { return std::vector<double>(f.begin(), f.end()); };
  std::vector<double> q64 = wide(x.q), k64 = wide(x.k), v64 = wide(x.v), do64 = wide(x.dout);
  std::vector<double> out64(static_cast<std::size_t>(nq)), lse64(lse.size());
  std::vector<double> dq64(static_cast<std::size_t>(nq)), dk64(static_cast<std::size_t>(nk)), dv64(dk64.size());
  auto view64 = [](std::vector<double>& t, std::int64_t B, std::int64_t H, std::int64_t S, std::int64_t D) {
    return TensorView::bhsd(t.data(), B, H, S, D, DType::float64);
  };
  const TensorView lse64_view = TensorView::lse(lse64.data(), DType::float64, c.B, c.Hq, c.Sq);
  const Options r = options_of(c, Impl::reference, seed + 1);
  fattn::attention_forward(view64(q64, c.B, c.Hq, c.Sq, c.D), view64(k64, c.B, c.Hkv, c.Sk, c.D),
                           view64(v64, c.B, c.Hkv, c.Sk, c.D), view64(out64, c.B, c.Hq, c.Sq, c.D),
                           &lse64_view, r);
  fattn::attention_backward(view64(q64, c.B, c.Hq, c.Sq, c.D), view64(k64, c.B, c.Hkv, c.Sk, c.D),
                            view64(v64, c.B, c.Hkv, c.Sk, c.D), view64(out64, c.B, c.Hq, c.Sq, c.D),
                            view64(do64, c.B, c.Hq, c.Sq, c.D), lse64_view, nullptr,
                            view64(dq64, c.B, c.Hq, c.Sq, c.D), view64(dk64, c.B, c.Hkv, c.Sk, c.D),
                            view64(dv64, c.B, c.Hkv, c.Sk, c.D), r);
  // float32: float32 arithmetic's error; 16-bit: the output's rounding.
  const double tol = c.dtype == DType::float32 ? 5e-5 : 2e-2;
  auto expect_near = [&](const char* name, const Typed& got, const std::vector<double>& want) {
    double scale = 1.0;
    for (const double w : want) scale = std::max(scale, std::fabs(w));
    int shown = 0;
    for (std::size_t e = 0; e < want.size(); ++e)
      if (!(std::fabs(got.at(e) - want[e]) <= tol * scale) && shown++ < 5)
        ADD_FAILURE() << name << "[" << e << "] = " << got.at(e) << ", the reference's " << want[e];
  };
  expect_near("out", out, out64);
  expect_near("dq", dq, dq64);
  expect_near("dk", dk, dk64);
  expect_near("dv", dv, dv64);
  for (std::size_t e = 0; e < lse.size(); ++e)
    if (std::isfinite(lse64[e])) EXPECT_NEAR(lse[e], lse64[e], 1e-4 * std::max(1.0, std::fabs(lse64[e])));
}

std::vector<Case> kernel_cases() {
  std::vector<Case> all;
  for (const Isa isa : {Isa::automatic, Isa::avx2, Isa::portable})
    for (const Causal causal : {Causal::none, Causal::top_left, Causal::bottom_right}) {
      Case c;
      c.isa = isa, c.causal = causal;
      all.push_back(c);
    }
  auto with = [&](auto&& change) {
    Case c;
    change(c);
    all.push_back(c);
  };
  with([](Case& c) { c.dtype = DType::bfloat16, c.D = 128, c.Sq = 130, c.Sk = 99; });
  with([](Case& c) { c.dtype = DType::float16, c.causal = Causal::bottom_right; });
  with([](Case& c) { c.D = 256, c.Sq = 20, c.Sk = 211, c.p = 0.5; });
  with([](Case& c) { c.D = 32, c.Hq = 8, c.Hkv = 1, c.Sq = 200, c.Sk = 200, c.threads = 3, c.p = 0.05; });
  with([](Case& c) { c.Sq = 1, c.Sk = 300, c.p = 0.9; });  // a decode shape: the fused kernel
  with([](Case& c) { c.D = 80, c.Sq = 97, c.Sk = 97, c.causal = Causal::top_left, c.threads = 1; });
  return all;
}
INSTANTIATE_TEST_SUITE_P(Cases, DropoutKernels, ::testing::ValuesIn(kernel_cases()));

// The output for (seed, offset): the fused forward, float32.
std::vector<float> forward_out(const Case& c, std::uint64_t seed, std::uint32_t offset, int threads) {
  const Tensors x(c, 5);
  std::vector<float> q = x.q, k = x.k, v = x.v, out(q.size());
  Options o = options_of(c, Impl::fused, seed);
  o.dropout_offset = offset;
  o.num_threads = threads;
  fattn::attention_forward(TensorView::bhsd(q.data(), c.B, c.Hq, c.Sq, c.D),
                           TensorView::bhsd(k.data(), c.B, c.Hkv, c.Sk, c.D),
                           TensorView::bhsd(v.data(), c.B, c.Hkv, c.Sk, c.D),
                           TensorView::bhsd(out.data(), c.B, c.Hq, c.Sq, c.D), nullptr, o);
  return out;
}

TEST(DropoutStream, SameSeedSameBitsOnAnyThreadCountOtherSeedOtherBits) {
  Case c;
  c.Sq = 150, c.Sk = 170;
  const std::vector<float> once = forward_out(c, 11, 0, 1);
  EXPECT_EQ(once, forward_out(c, 11, 0, 1));
  EXPECT_EQ(once, forward_out(c, 11, 0, 3));
  EXPECT_NE(once, forward_out(c, 12, 0, 1));
  EXPECT_NE(once, forward_out(c, 11, 1, 1));
  c.p = 0.0;
  EXPECT_NE(once, forward_out(c, 11, 0, 1));
}

// Varlen: each packed sequence's mask counts b as the sequence; the kernels equal the
// ragged reference (impl reference) on the same call.
TEST(DropoutVarlen, KernelsEqualTheRaggedReference) {
  const std::int64_t H = 4, D = 64;
  std::vector<std::int32_t> cu{0, 3, 80, 80, 200};
  const std::int64_t total = cu.back();
  Rng rng(test_seed());
  std::vector<float> q(static_cast<std::size_t>(total * H * D)), k(q.size()), v(q.size());
  for (auto* t : {&q, &k, &v})
    for (float& e : *t) e = rng.normal();
  std::vector<float> out(q.size()), ref(q.size());
  const TensorView cu_view = TensorView::int32_vector(cu.data(), 5);
  for (const Impl impl : {Impl::automatic, Impl::reference}) {
    Options o;
    o.impl = impl;
    o.causal = Causal::bottom_right;
    o.dropout_p = 0.3;
    o.dropout_seed = 99;
    o.num_threads = 2;
    fattn::attention_varlen(TensorView::bshd(q.data(), 1, total, H, D),
                            TensorView::bshd(k.data(), 1, total, H, D),
                            TensorView::bshd(v.data(), 1, total, H, D), cu_view, cu_view,
                            TensorView::bshd((impl == Impl::reference ? ref : out).data(), 1, total, H, D),
                            nullptr, o);
  }
  for (std::size_t e = 0; e < out.size(); ++e)
    ASSERT_NEAR(out[e], ref[e], 5e-5 * std::max(1.0f, std::fabs(ref[e]))) << "element " << e;
}

TEST(DropoutArguments, AreCheckedAndNamed) {
  std::vector<float> q(2 * 16 * 32, 0.5f), out(q.size(), 7.0f);
  const auto view = [](std::vector<float>& t) { return TensorView::bhsd(t.data(), 1, 2, 16, 32); };
  auto call = [&](double p, Impl impl, Isa isa = Isa::automatic) {
    Options o;
    o.dropout_p = p;
    o.impl = impl;
    o.isa = isa;
    fattn::attention_forward(view(q), view(q), view(q), view(out), nullptr, o);
  };
  expect_error([&] { call(-0.1, Impl::automatic); }, "dropout_p must be in [0, 1) (0: off), got -0.1");
  expect_error([&] { call(1.0, Impl::automatic); }, "dropout_p must be in [0, 1) (0: off), got 1");
  expect_error([&] { call(std::nan(""), Impl::automatic); }, "dropout_p must be in [0, 1)");
  expect_error([&] { call(0.1, Impl::naive); }, "dropout_p > 0 runs on impl auto, fused or reference, got impl naive");
  expect_error([&] { call(0.1, Impl::decode); }, "got impl decode");
  if (fattn::cpu_supports(Isa::amx)) expect_error([&] { call(0.1, Impl::fused, Isa::amx); }, "isa amx takes no dropout");
  for (const float x : out) EXPECT_EQ(x, 7.0f);
  std::vector<float> cache(2 * 16 * 32, 0.5f);
  Options o;
  o.dropout_p = 0.1;
  const fattn::KvCache kv{view(cache), view(cache)};
  expect_error([&] { fattn::attention_kvcache(view(q), kv, nullptr, nullptr, view(out), nullptr, o); },
               "attention_kvcache takes dropout_p = 0");
}

}  // namespace
}  // namespace fattn_test
