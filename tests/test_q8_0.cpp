// fattn tests — the q8_0 K/V format (fattn/tensor.hpp): a forward over a q8_0 cache gives
// the bits of the same forward over the cache widened to float32, on every CPU kernel and
// instruction set (the kernels widen each block exactly, d·q, where they read, copy or
// stage the rows), in
// (B, H, S, D) and (B, S, H, D) caches with gaps between rows; the float64 reference reads
// the format too; quantization is within half a step; the format's rules are errors that
// name the argument.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "fattn/fattn.hpp"
#include "util/checks.hpp"

namespace {

using fattn::Causal;
using fattn::DType;
using fattn::Impl;
using fattn::Options;
using fattn::TensorView;
using fattn_test::expect_error;

// A q8_0 cache (B, H, S, D): rows `gap` bytes apart beyond their blocks, heads inner
// (B, S, H, D: ggml's cache) or outer (B, H, S, D); and the same values widened to
// float32 in a contiguous (B, H, S, D) tensor.
struct Q8Cache {
  std::vector<std::uint8_t> bytes;
  std::vector<float> widened;
  TensorView view, wide_view;

  Q8Cache(std::int64_t B, std::int64_t H, std::int64_t S, std::int64_t D, bool heads_inner,
          std::int64_t gap, std::mt19937& rng) {
    const std::int64_t row = fattn::q8_0_row_bytes(D), pitch = row + gap;
    const std::int64_t head = heads_inner ? pitch : S * pitch, seq = heads_inner ? H * pitch : pitch;
    bytes.assign(static_cast<std::size_t>(B * H * S * pitch), 0xA5);  // gaps hold junk
    widened.resize(static_cast<std::size_t>(B * H * S * D));
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> values(static_cast<std::size_t>(D));
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t h = 0; h < H; ++h)
        for (std::int64_t s = 0; s < S; ++s) {
          const float spread = 0.25f + static_cast<float>(s % 7);  // rows of unlike scales
          for (float& x : values) x = normal(rng) * spread;
          std::uint8_t* at = bytes.data() + b * H * S * pitch + h * head + s * seq;
          fattn::quantize_q8_0(values.data(), D, at);
          fattn::dequantize_q8_0(at, D, widened.data() + ((b * H + h) * S + s) * D);
        }
    view = {bytes.data(), 4, {B, H, S, D}, {H * S * pitch, head, seq, 1}, DType::q8_0};
    wide_view = TensorView::bhsd(widened.data(), B, H, S, D);
  }
};

struct Shape {
  std::int64_t B, Hq, Hkv, Sq, Sk, D;
  Causal causal;
  std::int64_t window_left = -1;
  bool variants = false;  // softcap, ALiBi and sinks
};

struct Outputs {
  std::vector<float> out, lse;
};

Outputs run(const Shape& s, const TensorView& q, const TensorView& k, const TensorView& v,
            Options o) {
  Outputs r;
  r.out.assign(static_cast<std::size_t>(s.B * s.Hq * s.Sq * s.D), std::nanf(""));  // poison
  r.lse.assign(static_cast<std::size_t>(s.B * s.Hq * s.Sq), std::nanf(""));
  const TensorView out = TensorView::bhsd(r.out.data(), s.B, s.Hq, s.Sq, s.D);
  const TensorView lse = TensorView::lse(r.lse.data(), s.B, s.Hq, s.Sq);
  fattn::attention_forward(q, k, v, out, &lse, o);
  return r;
}

// max |got − ref| over ref's finite values; infinite where one is NaN and the other not.
double max_error(const std::vector<float>& got, const std::vector<float>& ref) {
  double e = 0.0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(got[i]) != std::isnan(ref[i])) return std::numeric_limits<double>::infinity();
    if (!std::isnan(ref[i]) && std::isfinite(ref[i]))
      e = std::max(e, std::fabs(static_cast<double>(got[i]) - ref[i]));
  }
  return e;
}

class Q8_0Test : public ::testing::TestWithParam<Shape> {};

TEST_P(Q8_0Test, SameBitsAsTheWidenedCache) {
  const Shape s = GetParam();
  std::mt19937 rng(static_cast<unsigned>(s.D * 131 + s.Sq * 17 + s.Sk));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> qf(static_cast<std::size_t>(s.B * s.Hq * s.Sq * s.D));
  for (float& x : qf) x = normal(rng) * 1.5f;  // some large logits
  const TensorView q = TensorView::bhsd(qf.data(), s.B, s.Hq, s.Sq, s.D);
  std::vector<float> slopes(static_cast<std::size_t>(s.Hq)), sinks(slopes.size());
  for (std::size_t h = 0; h < slopes.size(); ++h) {
    slopes[h] = 0.05f * static_cast<float>(h + 1);
    sinks[h] = normal(rng);
  }
  const TensorView slopes_view{slopes.data(), 1, {s.Hq, 0, 0, 0}, {1, 0, 0, 0}};
  const TensorView sinks_view{sinks.data(), 1, {s.Hq, 0, 0, 0}, {1, 0, 0, 0}};
  Options o;
  o.causal = s.causal;
  o.window_left = s.window_left;
  if (s.variants) {
    o.softcap = 20.0;
    o.alibi_slopes = &slopes_view;
    o.sinks = &sinks_view;
  }
  for (const bool heads_inner : {true, false}) {
    const Q8Cache k(s.B, s.Hkv, s.Sk, s.D, heads_inner, heads_inner ? 0 : 6, rng);
    const Q8Cache v(s.B, s.Hkv, s.Sk, s.D, heads_inner, heads_inner ? 0 : 6, rng);
    Options r = o;
    r.impl = Impl::reference;
    const Outputs exact = run(s, q, k.wide_view, v.wide_view, r);
    const Outputs exact_q8 = run(s, q, k.view, v.view, r);
    EXPECT_EQ(max_error(exact_q8.out, exact.out), 0.0) << "the reference reads q8_0 as its widened values";
    // float32 against float64, as the float32 suite bounds it (the bits are the float32
    // kernels' own): relative to the largest output and logsumexp.
    double out_scale = 1.0, lse_scale = 1.0;
    for (const float x : exact.out) out_scale = std::max(out_scale, std::fabs(static_cast<double>(x)));
    for (const float x : exact.lse) lse_scale = std::max(lse_scale, std::fabs(static_cast<double>(x)));
    for (Impl impl : {Impl::automatic, Impl::fused, Impl::naive, Impl::decode}) {
      for (fattn::Isa isa : {fattn::Isa::automatic, fattn::Isa::avx2, fattn::Isa::portable}) {
        if (!fattn::cpu_supports(isa)) continue;
        Options c = o;
        c.impl = impl;
        c.isa = isa;
        const Outputs got = run(s, q, k.view, v.view, c), wide = run(s, q, k.wide_view, v.wide_view, c);
        const std::string where = std::string(fattn::to_string(impl)) + " isa " +
                                  fattn::to_string(isa) + (heads_inner ? " BSHD" : " BHSD");
        EXPECT_EQ(std::memcmp(got.out.data(), wide.out.data(), got.out.size() * sizeof(float)), 0) << where;
        EXPECT_EQ(std::memcmp(got.lse.data(), wide.lse.data(), got.lse.size() * sizeof(float)), 0) << where;
        EXPECT_LE(max_error(got.out, exact.out), fattn_test::kOutTol * out_scale) << where;
        EXPECT_LE(max_error(got.lse, exact.lse), fattn_test::kLseTol * lse_scale) << where;
      }
    }
  }
}

// Decode (one and a few rows, GQA; the decode kernel's direct, transposed and query-lane
// tiles), prefill chunks, every multiple-of-32 head dim class,
// causal both alignments, a window, the variants; Sq ≠ Sk, odd lengths.
INSTANTIATE_TEST_SUITE_P(
    Shapes, Q8_0Test,
    ::testing::Values(Shape{1, 32, 8, 1, 700, 128, Causal::bottom_right},
                      Shape{1, 32, 2, 4, 900, 128, Causal::bottom_right},  // 64 rows a kv head
                      Shape{1, 16, 2, 1, 777, 128, Causal::bottom_right},  // 8 rows: direct, 4 + 4
                      Shape{2, 14, 2, 1, 500, 64, Causal::none},           // 7 rows: 4 + 2 + 1
                      Shape{1, 6, 2, 1, 333, 64, Causal::bottom_right},    // 3 rows: direct on AVX2, 2 + 1
                      Shape{2, 3, 1, 1, 250, 32, Causal::none},            // ... one block a row
                      Shape{2, 8, 2, 3, 1031, 64, Causal::none},
                      Shape{2, 8, 2, 37, 300, 64, Causal::bottom_right},
                      Shape{1, 4, 4, 70, 70, 256, Causal::top_left},
                      Shape{1, 6, 3, 5, 517, 96, Causal::none},
                      Shape{1, 4, 1, 9, 1000, 32, Causal::bottom_right, 64},
                      Shape{1, 4, 2, 13, 129, 160, Causal::none, -1, true},
                      Shape{1, 8, 8, 64, 333, 128, Causal::bottom_right, -1, true}),
    [](const ::testing::TestParamInfo<Shape>& info) {
      const Shape& s = info.param;
      return "D" + std::to_string(s.D) + "_H" + std::to_string(s.Hq) + "x" + std::to_string(s.Hkv) +
             "_q" + std::to_string(s.Sq) + "_k" + std::to_string(s.Sk) + "_" +
             fattn::to_string(s.causal) + (s.window_left >= 0 ? "_window" : "") +
             (s.variants ? "_variants" : "");
    });

// Each value within 0.6 of a step (max|x| / 127) of its block: half a step from rounding q,
// the rest from the scale's float16 rounding (2^-11 of up to 127 steps).
TEST(Q8_0Format, QuantizesWithinHalfAStep) {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const std::int64_t n = 32 * 40;
  std::vector<float> x(static_cast<std::size_t>(n)), back(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = normal(rng) * std::ldexp(1.0f, static_cast<int>(i / 32) % 20 - 10);
  std::fill(x.begin() + 96, x.begin() + 128, 0.0f);
  std::vector<std::uint8_t> blocks(static_cast<std::size_t>(fattn::q8_0_row_bytes(n)));
  EXPECT_EQ(blocks.size(), static_cast<std::size_t>(n / 32 * 34));
  fattn::quantize_q8_0(x.data(), n, blocks.data());
  fattn::dequantize_q8_0(blocks.data(), n, back.data());
  for (std::int64_t b = 0; b < n / 32; ++b) {
    float amax = 0.0f;
    for (std::int64_t i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[static_cast<std::size_t>(b * 32 + i)]));
    for (std::int64_t i = 0; i < 32; ++i) {
      const auto e = static_cast<std::size_t>(b * 32 + i);
      EXPECT_LE(std::fabs(back[e] - x[e]), 0.6f * amax / 127.0f) << "block " << b << " value " << i;
    }
  }
  expect_error([&] { fattn::quantize_q8_0(x.data(), 33, blocks.data()); },
               "quantize_q8_0 takes a multiple of 32 values, got n = 33");
}

TEST(Q8_0Format, Validation) {
  const std::int64_t B = 1, H = 2, Sq = 3, Sk = 5, D = 64;
  std::mt19937 rng(5);
  std::vector<float> qf(static_cast<std::size_t>(B * H * Sq * D), 0.5f), of(qf.size());
  const TensorView q = TensorView::bhsd(qf.data(), B, H, Sq, D), out = TensorView::bhsd(of.data(), B, H, Sq, D);
  const Q8Cache k(B, H, Sk, D, true, 0, rng), v(B, H, Sk, D, true, 0, rng);
  auto forward = [&](const TensorView& qv, const TensorView& kv, const TensorView& vv, const TensorView& ov) {
    return [&, qv, kv, vv, ov] { fattn::attention_forward(qv, kv, vv, ov, nullptr, {}); };
  };
  EXPECT_NO_THROW(forward(q, k.view, v.view, out)());
  TensorView odd = k.view;
  odd.sizes[3] = 48;
  TensorView q48 = q, out48 = out;
  q48.sizes[3] = out48.sizes[3] = 48;
  expect_error(forward(q48, odd, odd, out48), "k.size(3) (head dim) must be a multiple of 32 for dtype q8_0, got 48");
  TensorView strided = k.view;
  strided.strides[3] = 2;
  expect_error(forward(q, strided, v.view, out), "k.stride(3) must be 1 for dtype q8_0 (a row's blocks back to back), got 2");
  expect_error(forward(q, k.view, v.wide_view, out), "v must have dtype q8_0, got float32");
  std::vector<std::uint16_t> q16(qf.size());
  TensorView half = q;
  half.data = q16.data();
  half.dtype = DType::float16;
  expect_error(forward(half, k.view, v.view, out), "q must have dtype float32 with k and v of dtype q8_0, got float16");
  TensorView out16 = out;
  out16.data = q16.data();
  out16.dtype = DType::float16;
  expect_error(forward(q, k.view, v.view, out16), "out must have dtype float32, got float16");
  // Strides count bytes: the contiguous helpers step whole rows; a view stepped in values
  // (its rows inside each other) is an error, not a silent misread.
  const TensorView helper = TensorView::bhsd(k.view.data, B, H, Sk, D, DType::q8_0);
  EXPECT_EQ(helper.strides, (std::array<std::int64_t, 4>{H * Sk * 68, Sk * 68, 68, 1}));
  TensorView in_values = k.view;
  in_values.strides = {H * Sk * D, Sk * D, D, 1};
  expect_error(forward(q, in_values, in_values, out),
               "k.stride(2) must be 0 or at least the 68 bytes of a q8_0 row (q8_0 strides count bytes), got 64");
  // The backward and the ragged batch take no q8_0 cache.
  std::vector<float> lse(static_cast<std::size_t>(B * H * Sq)), dq(qf.size()), dk(static_cast<std::size_t>(B * H * Sk * D)), dv(dk.size());
  const TensorView lse_view = TensorView::lse(lse.data(), B, H, Sq);
  expect_error([&] {
    fattn::attention_backward(q, k.view, v.view, out, q, lse_view, nullptr, TensorView::bhsd(dq.data(), B, H, Sq, D),
                              TensorView::bhsd(dk.data(), B, H, Sk, D), TensorView::bhsd(dv.data(), B, H, Sk, D), {});
  }, "the backward takes k and v of q's dtype float32, got q8_0 / q8_0 (q8_0 is a forward-only cache format)");
}

// reference_row widens only the row's kv head: the row of the whole reference.
TEST(Q8_0Format, ReferenceRow) {
  const std::int64_t B = 2, Hq = 4, Hkv = 2, Sq = 3, Sk = 77, D = 64;
  std::mt19937 rng(9);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> qf(static_cast<std::size_t>(B * Hq * Sq * D)), out(qf.size());
  for (float& x : qf) x = normal(rng);
  const Q8Cache k(B, Hkv, Sk, D, true, 0, rng), v(B, Hkv, Sk, D, true, 0, rng);
  const TensorView q = TensorView::bhsd(qf.data(), B, Hq, Sq, D);
  Options o;
  o.impl = Impl::reference;
  fattn::attention_forward(q, k.view, v.view, TensorView::bhsd(out.data(), B, Hq, Sq, D), nullptr, o);
  std::vector<double> row(static_cast<std::size_t>(D));
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < Hq; ++h) {
      fattn::reference_row(q, k.view, v.view, o, b, h, Sq - 1, row.data());
      for (std::int64_t d = 0; d < D; ++d)
        EXPECT_EQ(static_cast<float>(row[static_cast<std::size_t>(d)]),
                  out[static_cast<std::size_t>(((b * Hq + h) * Sq + Sq - 1) * D + d)]);
    }
}

}  // namespace
