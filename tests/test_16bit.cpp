// fattn tests — bfloat16 and float16 on the CPU: the element conversions, and every CPU
// kernel (forward, decode, backward, KV cache) against the reference on 16-bit inputs.
//
// The inputs are drawn in float32 and rounded to the 16-bit dtype, so the float32 tensor
// holding the rounded values and the 16-bit tensor hold the same numbers: the reference
// runs on the float32 one (float64 arithmetic), the kernel under test on the 16-bit one.
// A kernel computes in float32 and rounds its outputs once, so each output element is
// within half a unit in the last place of the 16-bit dtype of the exact value, plus
// float32's own error (kOutTol): that is the bound checked, element by element.
// (The accuracy rule against torch's own 16-bit SDPA is in tests/python/test_16bit.py.)
#include <cstdlib>
#include <cstring>
#include <limits>
#include <optional>

#include "util/checks.hpp"
#include "util/cpu_variants.hpp"
#include "util/reference.hpp"
#include "util/tensor16.hpp"

#include "cpu/common/elements.hpp"

namespace fattn_test {
namespace {

using fattn::Bf16Products;
using fattn::Products;
using fattn::cpu::BFloat16;
using fattn::cpu::Float16;
using fattn::cpu::from_float;
using fattn::cpu::to_float;

// The library's conversions (cpu/common/elements.hpp), which the kernels use: under test here.
int mantissa_bits(DType dtype) { return dtype == DType::bfloat16 ? 7 : 10; }

float round_to(DType dtype, float x) {
  return dtype == DType::bfloat16 ? to_float(from_float<BFloat16>(x)) : to_float(from_float<Float16>(x));
}
std::uint16_t bits_of(DType dtype, float x) {
  return dtype == DType::bfloat16 ? from_float<BFloat16>(x).bits : from_float<Float16>(x).bits;
}
float value_of(DType dtype, std::uint16_t bits) {
  return dtype == DType::bfloat16 ? to_float(BFloat16{bits}) : to_float(Float16{bits});
}

// ---- conversions -------------------------------------------------------------------------

class Conversion : public ::testing::TestWithParam<DType> {};

// Every 16-bit pattern goes to float and back unchanged (NaNs stay NaN, made quiet).
TEST_P(Conversion, EveryPatternRoundTrips) {
  const DType dtype = GetParam();
  for (std::uint32_t b = 0; b < 0x10000; ++b) {
    const auto bits = static_cast<std::uint16_t>(b);
    const float x = value_of(dtype, bits);
    if (std::isnan(x)) {
      ASSERT_TRUE(std::isnan(value_of(dtype, bits_of(dtype, x)))) << std::hex << b;
      continue;
    }
    ASSERT_EQ(bits_of(dtype, x), bits) << std::hex << "pattern 0x" << b << " = " << x;
  }
}

// float → 16 bits is the nearest value, ties to even, for floats between every pair of
// neighbouring 16-bit values (the midpoint, just either side of it, and random points).
TEST_P(Conversion, RoundsToNearestEven) {
  const DType dtype = GetParam();
  Rng rng;
  for (std::uint32_t b = 0; b < 0x7fff; ++b) {  // positive finite patterns and their successor
    const float lo = value_of(dtype, static_cast<std::uint16_t>(b));
    const float hi = value_of(dtype, static_cast<std::uint16_t>(b + 1));
    if (!std::isfinite(lo) || !std::isfinite(hi)) continue;
    const float mid = static_cast<float>((static_cast<double>(lo) + hi) / 2);  // exact
    const float even = (b % 2 == 0) ? lo : hi;
    for (float sign : {1.0f, -1.0f}) {
      ASSERT_EQ(round_to(dtype, sign * mid), sign * even) << "tie between " << lo << " and " << hi;
      ASSERT_EQ(round_to(dtype, sign * std::nextafter(mid, lo)), sign * lo) << lo;
      ASSERT_EQ(round_to(dtype, sign * std::nextafter(mid, hi)), sign * hi) << hi;
      const float inside = static_cast<float>(rng.uniform(lo, hi));
      const double below = inside - lo, above = hi - inside;  // exact in double
      const float nearest = below < above ? lo : above < below ? hi : even;
      ASSERT_EQ(round_to(dtype, sign * inside), sign * nearest) << inside;
    }
  }
  const float max = value_of(dtype, 0x7bff), inf = std::numeric_limits<float>::infinity();
  if (dtype == DType::float16) {  // 65504 is the largest; from 65520 on, inf
    EXPECT_EQ(round_to(dtype, 65519.99f), max);
    EXPECT_EQ(round_to(dtype, 65520.0f), inf);
    EXPECT_EQ(round_to(dtype, -1e30f), -inf);
    EXPECT_EQ(round_to(dtype, 1e-30f), 0.0f);
    EXPECT_EQ(round_to(dtype, 0x1p-25f), 0.0f);              // half the least subnormal: even
    EXPECT_EQ(round_to(dtype, 0x1.8p-25f), 0x1p-24f);        // above half: up
  } else {
    EXPECT_EQ(round_to(dtype, 3.4e38f), inf);  // above the largest bfloat16, 3.3895e38
  }
  EXPECT_TRUE(std::isnan(round_to(dtype, std::numeric_limits<float>::quiet_NaN())));
  EXPECT_TRUE(std::signbit(round_to(dtype, -0.0f)));
}

// The public conversions (fattn/tensor.hpp) are the kernels' own, for every pattern and
// for floats between them; other dtypes are refused by name.
TEST_P(Conversion, PublicConversionsAreTheKernels) {
  const DType dtype = GetParam();
  Rng rng;
  for (std::uint32_t b = 0; b < 0x10000; ++b) {
    const auto bits = static_cast<std::uint16_t>(b);
    const float x = value_of(dtype, bits);
    const float widened = fattn::from_16bit(bits, dtype);
    ASSERT_EQ(std::memcmp(&widened, &x, sizeof x), 0) << std::hex << b;  // NaNs too, bit for bit
    if (std::isnan(x)) continue;
    ASSERT_EQ(fattn::to_16bit(x, dtype), bits) << std::hex << b;
    const auto between = static_cast<float>(x * (1.0 + rng.uniform(-1e-3, 1e-3)));
    ASSERT_EQ(fattn::to_16bit(between, dtype), bits_of(dtype, between)) << between;
  }
  EXPECT_THROW(
      {
        try {
          fattn::to_16bit(1.0f, DType::float32);
        } catch (const fattn::Error& e) {
          EXPECT_NE(std::string(e.what()).find("to_16bit takes dtype float16 or bfloat16, got float32"),
                    std::string::npos) << e.what();
          throw;
        }
      },
      fattn::Error);
  EXPECT_THROW(fattn::from_16bit(0, DType::int32), fattn::Error);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, Conversion, ::testing::Values(DType::bfloat16, DType::float16),
                         [](const auto& info) { return fattn::to_string(info.param); });

// ---- 16-bit tensors ------------------------------------------------------------------------

// ---- kernels ---------------------------------------------------------------------------------

struct Case16 {
  std::int64_t B, Hq, Hkv, Sq, Sk, D;
  Causal causal;
  Layout layout;
};
// What gtest prints for a case (its padding bytes otherwise, which change between builds).
void PrintTo(const Case16& c, std::ostream* os) {
  *os << "B" << c.B << "_H" << c.Hq << "x" << c.Hkv << "_S" << c.Sq << "x" << c.Sk << "_D" << c.D
      << "_" << fattn::to_string(c.causal) << "_" << layout_name(c.layout);
}

std::vector<std::tuple<DType, Variant, Case16>> kernel_cases() {
  const Case16 cases[] = {{2, 4, 2, 65, 113, 64, Causal::none, Layout::bhsd},
                          {1, 4, 2, 113, 65, 96, Causal::top_left, Layout::bshd},
                          {1, 8, 2, 3, 200, 128, Causal::bottom_right, Layout::strided},
                          {1, 2, 1, 40, 70, 256, Causal::bottom_right, Layout::slice},
                          {1, 2, 2, 17, 17, 16, Causal::none, Layout::strided},
                          // ≤ 4 rows per kv head: decode's scores straight from the 16-bit
                          // key rows (4 rows, then 2 + 1), several key tiles and a tail; with
                          // AVX512-BF16 on vdpbf16ps, D = 48 ending in half a vector
                          {1, 4, 2, 2, 300, 64, Causal::bottom_right, Layout::bshd},
                          {2, 6, 2, 1, 250, 48, Causal::none, Layout::bhsd},
                          // 8 and 6 rows: direct on AVX2 (4 + 4, 4 + 2), transposed on
                          // AVX-512 (its 16-bit limit is 4 rows)
                          {1, 8, 1, 1, 333, 128, Causal::bottom_right, Layout::bshd},
                          {2, 12, 2, 1, 150, 64, Causal::none, Layout::bhsd},
                          // 15 rows per kv head (blocks of 4 and a last of 3) through
                          // decode's transposed key tile (with AVX512-BF16 of bfloat16
                          // pairs), D = 80 ending in half a 32-dim block, a last tile of 3
                          // key groups and 6 keys
                          {1, 3, 1, 5, 150, 80, Causal::bottom_right, Layout::bshd},
                          // 48-64 rows per kv head: decode's query-lane tiles (with
                          // AVX512-BF16 on bfloat16 pairs), a causal last tile, a tail of
                          // 12 keys, lanes past the rows, D = 16 (8 pairs)
                          {1, 8, 2, 16, 300, 128, Causal::bottom_right, Layout::bshd},
                          {2, 10, 1, 5, 200, 64, Causal::none, Layout::bhsd},
                          {1, 4, 1, 12, 150, 16, Causal::bottom_right, Layout::bhsd}};
  std::vector<std::tuple<DType, Variant, Case16>> all;
  for (DType dtype : {DType::bfloat16, DType::float16})
    for (Impl impl : {Impl::fused, Impl::naive, Impl::decode})
      for (Isa isa : {Isa::avx512, Isa::avx2, Isa::portable})
        for (const Case16& c : cases) all.emplace_back(dtype, Variant{impl, isa}, c);
  return all;
}

// q, k, v of a case drawn in float32, rounded to dtype, and their 16-bit twins.
struct Inputs16 {
  Tensor q, k, v;
  Tensor16 q16, k16, v16;
  Inputs16(const Case16& c, DType dtype, Rng& rng)
      : q(make_input(c.layout, c.B, c.Hq, c.Sq, c.D, rng)),
        k(make_input(c.layout, c.B, c.Hkv, c.Sk, c.D, rng)),
        v(make_input(c.layout, c.B, c.Hkv, c.Sk, c.D, rng)),
        q16(to_16bit(q, dtype)), k16(to_16bit(k, dtype)), v16(to_16bit(v, dtype)) {}
};

class Kernel16 : public ::testing::TestWithParam<std::tuple<DType, Variant, Case16>> {};

// An output-shaped tensor (B, Hq, Sq, D) copied into the case's layout, to compare with
// the kernel's output element by element.
Tensor in_case_layout(const Case16& c, const Tensor& t) {
  Tensor r = make_output(c.layout, c.B, c.Hq, c.Sq, c.D);
  r.for_each([&](auto a, auto b, auto s, auto d) { r.at(a, b, s, d) = t.at(a, b, s, d); });
  return r;
}

// A case's forward through the kernel under test (into a poisoned output, with the
// logsumexp) beside the float64 reference on the same values.
struct Forward16 {
  Result ref;
  Tensor ref_out;  // ref.out in the case's layout
  Tensor16 out;
  Tensor lse;
};
Forward16 run_forward16(const Inputs16& in, const Case16& c, DType dtype, const Variant& variant,
                        Bf16Products bf16_products = Bf16Products::automatic) {
  Options options;
  options.causal = c.causal;
  Result ref = run_reference(in.q, in.k, in.v, options);
  Tensor ref_out = in_case_layout(c, ref.out);
  options.impl = variant.impl;
  options.isa = variant.isa;
  options.bf16_products = bf16_products;
  Tensor16 out = output_like(make_output(c.layout, c.B, c.Hq, c.Sq, c.D), dtype);
  Tensor lse = make_lse(LseLayout::contiguous, c.B, c.Hq, c.Sq);
  fattn::attention_forward(in.q16.view, in.k16.view, in.v16.view, out.view, lse.view_ptr(), options);
  return {std::move(ref), std::move(ref_out), std::move(out), std::move(lse)};
}

// The forward of a case within half an ulp of the dtype (plus the bound of P's rounding
// where its products round P); returns what its products ran on.
Products expect_forward_within_half_an_ulp(DType dtype, const Variant& variant, const Case16& c,
                                           Bf16Products bf16_products = Bf16Products::automatic) {
  Rng rng;
  const Inputs16 in(c, dtype, rng);
  const auto [ref, ref_out, out, lse] = run_forward16(in, c, dtype, variant, bf16_products);
  std::optional<Tensor> p_rounding;
  Options options;
  options.causal = c.causal;
  options.impl = variant.impl;
  options.isa = variant.isa;
  options.bf16_products = bf16_products;
  if (rounds_p(in.q16.view, in.k16.view, in.v16.view, options)) {
    Options reference;
    reference.causal = c.causal;
    const Result ref_abs = run_reference(in.q, in.k, abs_of(in.v), reference);
    p_rounding = p_rounding_bound(in_case_layout(c, ref_abs.out));
  }
  EXPECT_TRUE(near_16bit(out, ref_out, dtype, 0.5, p_rounding ? &*p_rounding : nullptr));
  EXPECT_TRUE(lse_near(lse, ref.lse));
  return fattn::forward_plan(in.q16.view, in.k16.view, in.v16.view, options).products;
}

TEST_P(Kernel16, ForwardWithinHalfAnUlp) {
  const auto& [dtype, variant, c] = GetParam();
  FATTN_SKIP_IF_UNSUPPORTED(variant.isa);
  expect_forward_within_half_an_ulp(dtype, variant, c);
}

std::string case_name(const ::testing::TestParamInfo<std::tuple<DType, Variant, Case16>>& info) {
  const DType dtype = std::get<0>(info.param);
  const Case16& c = std::get<2>(info.param);
  return std::string(fattn::to_string(dtype)) + "_" + variant_name(std::get<1>(info.param)) + "_" +
         std::to_string(c.Sq) + "x" + std::to_string(c.Sk) + "_D" + std::to_string(c.D) + "_" +
         layout_name(c.layout);
}

INSTANTIATE_TEST_SUITE_P(Grid, Kernel16, ::testing::ValuesIn(kernel_cases()), case_name);

// The backward in 16 bits: dq, dk, dv against the float64 reference backward. The kernel
// reads out rounded to 16 bits (as a 16-bit forward leaves it) where the reference
// recomputes it exactly, so Δ = dout·out differs by up to ~half an ulp of |dout||out|
// per term: the bound is 2 ulps of the dtype at max|reference gradient|.
class Backward16 : public ::testing::TestWithParam<std::tuple<DType, Variant, Case16>> {};

TEST_P(Backward16, WithinTwoUlpsOfTheLargestGradient) {
  const auto& [dtype, variant, c] = GetParam();
  FATTN_SKIP_IF_UNSUPPORTED(variant.isa);
  Rng rng;
  const Inputs16 in(c, dtype, rng);
  Tensor dout = make_input(c.layout, c.B, c.Hq, c.Sq, c.D, rng);
  const Tensor16 dout16 = to_16bit(dout, dtype);
  Options options;
  options.causal = c.causal;
  Result fwd = run_reference(in.q, in.k, in.v, options);
  const Tensor16 out16 = to_16bit(fwd.out, dtype);
  Tensor dq = make_output(Layout::bhsd, c.B, c.Hq, c.Sq, c.D);
  Tensor dk = make_output(Layout::bhsd, c.B, c.Hkv, c.Sk, c.D);
  Tensor dv = make_output(Layout::bhsd, c.B, c.Hkv, c.Sk, c.D);
  Options ref_options = options;
  ref_options.impl = Impl::reference;
  fattn::attention_backward(in.q.view(), in.k.view(), in.v.view(), fwd.out.view(), dout.view(),
                            fwd.lse.view(), nullptr, dq.view(), dk.view(), dv.view(), ref_options);

  options.impl = variant.impl;
  options.isa = variant.isa;
  Tensor16 dq16 = output_like(dq, dtype), dk16 = output_like(dk, dtype), dv16 = output_like(dv, dtype);
  fattn::attention_backward(in.q16.view, in.k16.view, in.v16.view, out16.view, dout16.view, fwd.lse.view(),
                            nullptr, dq16.view, dk16.view, dv16.view, options);
  for (auto [got, ref, name] : {std::tuple{&dq16, &dq, "dq"}, {&dk16, &dk, "dk"}, {&dv16, &dv, "dv"}}) {
    double max_ref = 0.0;
    ref->for_each([&](auto a, auto b, auto s, auto d) {
      max_ref = std::max(max_ref, std::abs(static_cast<double>(ref->at(a, b, s, d))));
    });
    // near_16bit's bound with ulps relative to the largest gradient: scale max_ref in.
    const double ulps = 2.0;
    ref->for_each([&](auto a, auto b, auto s, auto d) {
      const auto e = static_cast<std::size_t>(ref->offset_of(a, b, s, d));
      const double have = value_of(dtype, got->storage[e]), want = ref->at(a, b, s, d);
      ASSERT_LE(std::abs(have - want), ulps * std::ldexp(max_ref, -mantissa_bits(dtype)) + 1e-6)
          << name << " at (" << a << ", " << b << ", " << s << ", " << d << ")";
    });
  }
}

std::vector<std::tuple<DType, Variant, Case16>> backward_cases() {
  const Case16 cases[] = {{2, 4, 2, 65, 113, 64, Causal::none, Layout::bhsd},
                          {1, 4, 1, 70, 33, 96, Causal::bottom_right, Layout::strided},
                          {1, 2, 2, 33, 50, 256, Causal::top_left, Layout::bshd}};
  std::vector<std::tuple<DType, Variant, Case16>> all;
  for (DType dtype : {DType::bfloat16, DType::float16})
    for (Impl impl : {Impl::fused, Impl::naive})
      for (Isa isa : {Isa::avx512, Isa::avx2, Isa::portable})
        for (const Case16& c : cases) all.emplace_back(dtype, Variant{impl, isa}, c);
  return all;
}

INSTANTIATE_TEST_SUITE_P(Grid, Backward16, ::testing::ValuesIn(backward_cases()), case_name);

// An infinite value on a key that causal attention hides from the first rows: those rows
// stay exact on every kernel, including the bfloat16 dot-product one (which would add the
// hidden pair as 0 · inf = NaN, and so runs its float32 loop for such inputs).
TEST_P(Kernel16, InfiniteHiddenValueReachesOnlyTheRowsThatSeeIt) {
  const auto& [dtype, variant, c] = GetParam();
  FATTN_SKIP_IF_UNSUPPORTED(variant.isa);
  if (c.causal != Causal::bottom_right || c.Sq < 2) GTEST_SKIP() << "needs rows that miss the last key";
  Rng rng;
  Inputs16 in(c, dtype, rng);
  const std::int64_t last = c.Sk - 1;
  for (std::int64_t h = 0; h < c.Hkv; ++h) {
    in.v.at(0, h, last, 0) = std::numeric_limits<float>::infinity();
    const auto at = static_cast<std::size_t>(in.v.offset_of(0, h, last, 0));
    in.v16.storage[at] = bits_of(dtype, std::numeric_limits<float>::infinity());
  }
  const auto [ref, ref_out, out, lse] = run_forward16(in, c, dtype, variant);
  // Row Sq−1 sees the last key; rows before it do not (bottom-right, Sq ≤ Sk).
  for (std::int64_t h = 0; h < c.Hq; ++h)
    for (std::int64_t i = 0; i + 1 < c.Sq; ++i) {
      const auto at = static_cast<std::size_t>(ref_out.offset_of(0, h, i, 0));
      const double want = ref_out.storage()[at], have = value_of(dtype, out.storage[at]);
      ASSERT_TRUE(std::isfinite(have)) << "head " << h << " row " << i;
      ASSERT_NEAR(have, want, 0.02 * std::max(1.0, std::abs(want))) << "head " << h << " row " << i;
    }
}

// A 16-bit KV cache: the append copies the new keys' bits; decode reads the cache.
TEST(KvCache16, AppendsBitsAndDecodes) {
  for (DType dtype : {DType::bfloat16, DType::float16}) {
    Rng rng;
    const std::int64_t B = 2, Hq = 8, Hkv = 2, cap = 160, D = 128;
    Tensor kc = make_input(Layout::bshd, B, Hkv, cap, D, rng), vc = make_input(Layout::bshd, B, Hkv, cap, D, rng);
    Tensor kn = make_input(Layout::bshd, B, Hkv, 1, D, rng), vn = make_input(Layout::bshd, B, Hkv, 1, D, rng);
    Tensor q = make_input(Layout::bshd, B, Hq, 1, D, rng);
    Tensor16 kc16 = to_16bit(kc, dtype), vc16 = to_16bit(vc, dtype);
    const Tensor16 kn16 = to_16bit(kn, dtype), vn16 = to_16bit(vn, dtype), q16 = to_16bit(q, dtype);
    std::vector<std::int32_t> lengths{77, 150};
    const TensorView seqlens = TensorView::int32_vector(lengths.data(), B);
    Tensor16 out = output_like(make_output(Layout::bhsd, B, Hq, 1, D), dtype);
    fattn::attention_kvcache(q16.view, {kc16.view, vc16.view, &seqlens, nullptr}, &kn16.view,
                             &vn16.view, out.view, nullptr, Options{});
    // The same call in float32 on the rounded values, through the reference.
    std::vector<std::int32_t> lengths32{77, 150};
    const TensorView seqlens32 = TensorView::int32_vector(lengths32.data(), B);
    Tensor ref = make_output(Layout::bhsd, B, Hq, 1, D);
    Options reference;
    reference.impl = Impl::reference;
    // Where the kernel rounds P, the bound on that: the same call on |v|, in a cache of its
    // own (kc before the append below, |vc|), appended alike.
    std::optional<Tensor> p_rounding;
    if (rounds_p(q16.view, kc16.view, vc16.view, Options{})) {
      Tensor kc_abs = kc.clone(), vc_abs = abs_of(vc), out_abs = make_output(Layout::bhsd, B, Hq, 1, D);
      std::vector<std::int32_t> lengths_abs{77, 150};
      const TensorView seqlens_abs = TensorView::int32_vector(lengths_abs.data(), B);
      fattn::attention_kvcache(q.view(), {kc_abs.view(), vc_abs.view(), &seqlens_abs, nullptr},
                               kn.view_ptr(), abs_of(vn).view_ptr(), out_abs.view(), nullptr, reference);
      p_rounding = p_rounding_bound(out_abs);
    }
    fattn::attention_kvcache(q.view(), {kc.view(), vc.view(), &seqlens32, nullptr}, kn.view_ptr(),
                             vn.view_ptr(), ref.view(), nullptr, reference);
    EXPECT_TRUE(near_16bit(out, ref, dtype, 0.5, p_rounding ? &*p_rounding : nullptr))
        << fattn::to_string(dtype);
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t h = 0; h < Hkv; ++h)
        for (std::int64_t d = 0; d < D; ++d) {
          const auto at = static_cast<std::size_t>(kc.offset_of(b, h, lengths[b], d));
          ASSERT_EQ(kc16.storage[at], bits_of(dtype, kn.at(b, h, 0, d)));
          ASSERT_EQ(vc16.storage[at], bits_of(dtype, vn.at(b, h, 0, d)));
        }
  }
}

// isa amx computes from float32 panels only: a 16-bit call names the ISAs that take it.
TEST(Errors16, IsaAmxIsRefusedNamingTheIsasThatRun) {
  Rng rng;
  Tensor q = make_input(Layout::bhsd, 1, 2, 8, 32, rng);
  const Tensor16 q16 = to_16bit(q, DType::bfloat16);
  Tensor16 out = output_like(make_output(Layout::bhsd, 1, 2, 8, 32), DType::bfloat16);
  Options options;
  options.isa = Isa::amx;
  try {
    fattn::attention_forward(q16.view, q16.view, q16.view, out.view, nullptr, options);
    FAIL() << "no error";
  } catch (const fattn::Error& e) {
    const std::string what = e.what();
    if (fattn::cpu_supports(Isa::amx))
      EXPECT_NE(what.find("isa amx takes float32; bfloat16 inputs run on avx512, avx2 or portable"),
                std::string::npos) << what;
    else
      EXPECT_NE(what.find("is not supported by this CPU"), std::string::npos) << what;
  }
  // A 16-bit output for float32 inputs is an error naming out and both dtypes.
  try {
    fattn::attention_forward(q.view(), q.view(), q.view(), out.view, nullptr, Options{});
    FAIL() << "no error";
  } catch (const fattn::Error& e) {
    EXPECT_NE(std::string(e.what()).find("out must have dtype float32, got bfloat16"), std::string::npos)
        << e.what();
  }
}

// ---- what a forward runs on ---------------------------------------------------------------

// The plan of a (1, Hq, Sq, D) × (1, Hkv, Sk, D) forward in dtype, laid out as `layout`.
fattn::ForwardPlan plan_of(DType dtype, Layout layout, std::int64_t Hq, std::int64_t Hkv, std::int64_t Sq,
                           std::int64_t Sk, std::int64_t D, const Options& options) {
  Rng rng;
  Tensor q = make_input(layout, 1, Hq, Sq, D, rng), k = make_input(layout, 1, Hkv, Sk, D, rng),
         v = make_input(layout, 1, Hkv, Sk, D, rng);
  if (dtype == DType::float32) return fattn::forward_plan(q.view(), k.view(), v.view(), options);
  const Tensor16 q16 = to_16bit(q, dtype), k16 = to_16bit(k, dtype), v16 = to_16bit(v, dtype);
  return fattn::forward_plan(q16.view, k16.view, v16.view, options);
}

Options with(Impl impl, Isa isa = Isa::automatic) {
  Options o;
  o.impl = impl;
  o.isa = isa;
  return o;
}

TEST(ForwardPlan, NamesTheKernelAndWhatItsProductsRunOn) {
  const bool dots = fattn::cpu_has_bf16_dot_products() &&
                    fattn::bf16_products_choice().products == Bf16Products::bf16_dot;
  const auto bf16_dot_if_here = dots ? Products::bf16_dot : Products::fma;
  // Long queries: fused, on the ISA automatic picks for their keys.
  fattn::ForwardPlan p = plan_of(DType::float32, Layout::bhsd, 4, 2, 200, 300, 64, {});
  EXPECT_EQ(p.impl, Impl::fused);
  EXPECT_EQ(p.isa, fattn::automatic_cpu_isa(300));
  EXPECT_EQ(p.products, p.isa == Isa::amx ? Products::amx : Products::fma);
  // A few query rows per kv head: decode, float32 FMAs.
  p = plan_of(DType::float32, Layout::bshd, 8, 2, 1, 300, 64, {});
  EXPECT_EQ(p.impl, Impl::decode);
  EXPECT_EQ(p.products, Products::fma);
  // bfloat16: the fused kernel and the decode kernel on a cache read in place run on
  // vdpbf16ps where this CPU has it; naive, float16 and a staged cache on FMAs.
  EXPECT_EQ(plan_of(DType::bfloat16, Layout::bhsd, 4, 2, 200, 300, 64, {}).products, bf16_dot_if_here);
  EXPECT_EQ(plan_of(DType::bfloat16, Layout::bshd, 8, 2, 3, 300, 80, {}).products, bf16_dot_if_here);
  EXPECT_EQ(plan_of(DType::bfloat16, Layout::strided, 8, 2, 3, 300, 64, {}).products, Products::fma);
  EXPECT_EQ(plan_of(DType::bfloat16, Layout::bshd, 8, 2, 3, 300, 72, {}).products, Products::fma);
  EXPECT_EQ(plan_of(DType::bfloat16, Layout::bhsd, 4, 2, 200, 300, 64, with(Impl::naive)).products, Products::fma);
  EXPECT_EQ(plan_of(DType::float16, Layout::bhsd, 4, 2, 200, 300, 64, with(Impl::fused)).products, Products::fma);
  if (fattn::cpu_supports(Isa::avx2))
    EXPECT_EQ(plan_of(DType::bfloat16, Layout::bhsd, 4, 2, 200, 300, 64, with(Impl::fused, Isa::avx2)).products,
              Products::fma);
  p = plan_of(DType::bfloat16, Layout::bhsd, 4, 2, 20, 30, 64, with(Impl::reference));
  EXPECT_EQ(p.impl, Impl::reference);
  EXPECT_EQ(p.isa, Isa::portable);
  EXPECT_EQ(p.products, Products::float64);
  EXPECT_STREQ(fattn::to_string(Products::bf16_dot), "bf16_dot");
}

TEST(ForwardPlan, ChecksItsArgumentsAsTheForwardDoes) {
  Rng rng;
  const Tensor q = make_input(Layout::bhsd, 1, 4, 8, 64, rng), k = make_input(Layout::bhsd, 1, 2, 8, 32, rng);
  expect_error([&] { fattn::forward_plan(q.view(), k.view(), k.view()); },
               "k.size(3) (head dim) must equal q.size(3) = 64, got 32");
  if (!fattn::cpu_supports(Isa::amx))
    expect_error([&] { fattn::forward_plan(q.view(), q.view(), q.view(), with(Impl::fused, Isa::amx)); },
                 "isa amx is not supported by this CPU");
}

// ---- the bfloat16 products: forced either way, and chosen by rate ----------------------------

// bfloat16 on avx512 forced onto each path runs it (forward_plan says so) within the same
// bound: the fused forward and the decode kernel (a cache read in place, 1 and 16 query rows
// per kv head). float32 FMAs everywhere; vdpbf16ps where this CPU has it.
TEST(Bf16Products, EachPathForcedRunsItWithinHalfAnUlp) {
  FATTN_SKIP_IF_UNSUPPORTED(Isa::avx512);
  const Case16 cases[] = {{2, 4, 2, 65, 113, 64, Causal::none, Layout::bhsd},
                          {1, 4, 2, 113, 65, 96, Causal::top_left, Layout::bshd},
                          {1, 8, 2, 1, 300, 128, Causal::bottom_right, Layout::bshd},
                          {1, 8, 2, 16, 300, 128, Causal::bottom_right, Layout::bshd},
                          // decode's direct scores on bfloat16 pairs split into even and odd
                          // dims (FMA) or on vdpbf16ps: 3 rows (2 + 1), D = 48 ending in half
                          // a 32-dim step; 4 rows, D = 80 (two steps and a half), a tail
                          {2, 6, 2, 1, 250, 48, Causal::none, Layout::bhsd},
                          {1, 8, 2, 1, 301, 80, Causal::bottom_right, Layout::bshd}};
  for (Bf16Products forced : {Bf16Products::fma, Bf16Products::bf16_dot}) {
    if (forced == Bf16Products::bf16_dot && !fattn::cpu_has_bf16_dot_products()) continue;
    const Products expected = forced == Bf16Products::bf16_dot ? Products::bf16_dot : Products::fma;
    for (const Case16& c : cases)
      for (Impl impl : {Impl::fused, Impl::decode}) {
        if (impl == Impl::decode && c.Sq * c.Hq / c.Hkv > 64) continue;  // decode's rows
        SCOPED_TRACE(std::string(fattn::to_string(forced)) + " " + fattn::to_string(impl));
        EXPECT_EQ(expect_forward_within_half_an_ulp(DType::bfloat16, {impl, Isa::avx512}, c, forced),
                  expected);
      }
  }
}

TEST(Bf16Products, PlanNamesWhyAndForcingWhatCannotRunIsAnError) {
  FATTN_SKIP_IF_UNSUPPORTED(Isa::avx512);
  Options fma;
  fma.bf16_products = Bf16Products::fma;
  const fattn::ForwardPlan forced = plan_of(DType::bfloat16, Layout::bhsd, 4, 2, 200, 300, 64, fma);
  EXPECT_EQ(forced.products, Products::fma);
  EXPECT_EQ(forced.products_reason, "bf16_products fma asked for");
  const fattn::ForwardPlan chosen = plan_of(DType::bfloat16, Layout::bhsd, 4, 2, 200, 300, 64, {});
  EXPECT_EQ(chosen.products_reason, fattn::bf16_products_choice().reason);
  EXPECT_TRUE(plan_of(DType::float16, Layout::bhsd, 4, 2, 200, 300, 64, {}).products_reason.empty());
  if (fattn::cpu_has_bf16_dot_products()) {  // a kernel without a vdpbf16ps path says so
    Options naive_dot = with(Impl::naive);
    naive_dot.bf16_products = Bf16Products::bf16_dot;
    const fattn::ForwardPlan naive = plan_of(DType::bfloat16, Layout::bhsd, 4, 2, 200, 300, 64, naive_dot);
    EXPECT_EQ(naive.products, Products::fma);
    EXPECT_NE(naive.products_reason.find("widened to float32 FMAs for this problem"), std::string::npos)
        << naive.products_reason;
  }
  Options dot;
  dot.bf16_products = Bf16Products::bf16_dot;
  dot.isa = Isa::portable;
  Rng rng;
  Tensor q32 = make_input(Layout::bhsd, 1, 2, 8, 64, rng);
  const Tensor16 q = to_16bit(q32, DType::bfloat16);
  expect_error([&] { fattn::forward_plan(q.view, q.view, q.view, dot); },
               "bf16_products bf16_dot needs vdpbf16ps on isa avx512; this call runs on isa portable");
  dot.isa = Isa::avx512;
  if (!fattn::cpu_has_bf16_dot_products())
    expect_error([&] { fattn::forward_plan(q.view, q.view, q.view, dot); }, "has no AVX512-BF16");
  EXPECT_EQ(fattn::parse_bf16_products("bf16_dot"), Bf16Products::bf16_dot);
  expect_error([] { fattn::parse_bf16_products("dot"); }, "must be one of auto, bf16_dot, fma; got 'dot'");
}

// automatic: the faster path by the rates timed on this core, the numbers in the reason.
TEST(Bf16Products, AutomaticIsTheFasterOnThisCore) {
  if (std::getenv(fattn::kCpuBf16Variable) != nullptr) GTEST_SKIP() << "FATTN_CPU_BF16 is set";
  const fattn::Bf16ProductsChoice& choice = fattn::bf16_products_choice();
  if (!fattn::cpu_has_bf16_dot_products()) {
    EXPECT_EQ(choice.products, Bf16Products::fma);
    EXPECT_NE(choice.reason.find("bfloat16 widened to float32 FMAs"), std::string::npos) << choice.reason;
    return;
  }
  EXPECT_GT(choice.fma_gflops, 0.0);
  EXPECT_GT(choice.bf16_dot_gflops, 0.0);
  EXPECT_EQ(choice.products, choice.bf16_dot_gflops >= choice.fma_gflops ? Bf16Products::bf16_dot
                                                                          : Bf16Products::fma);
  EXPECT_NE(choice.reason.find("timed on one core: vdpbf16ps"), std::string::npos) << choice.reason;
  const fattn::ProductRates again = fattn::measure_product_rates();
  EXPECT_GT(again.fma_gflops, 0.0);
}

// FATTN_CPU_BF16 forces the choice for the process (read once: each case in a fresh one).
TEST(Bf16ProductsDeathTest, TheEnvironmentForcesTheChoice) {
  FATTN_SKIP_IF_UNSUPPORTED(Isa::avx512);
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // re-executed: a process that never chose
  EXPECT_EXIT(
      {
        setenv(fattn::kCpuBf16Variable, "fma", 1);
        const auto& choice = fattn::bf16_products_choice();
        std::exit(choice.products == Bf16Products::fma && choice.reason == "FATTN_CPU_BF16=fma" &&
                          choice.fma_gflops == 0.0
                      ? 0
                      : 1);
      },
      ::testing::ExitedWithCode(0), "");
  EXPECT_EXIT(
      {
        setenv(fattn::kCpuBf16Variable, "fast", 1);
        try {
          fattn::bf16_products_choice();
        } catch (const fattn::Error& e) {
          std::exit(std::string(e.what()).find("must be bf16_dot or fma") != std::string::npos ? 0 : 2);
        }
        std::exit(1);
      },
      ::testing::ExitedWithCode(0), "");
}

}  // namespace
}  // namespace fattn_test
