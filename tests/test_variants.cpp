// fattn tests — the attention variants (attn_mask, sliding window, softcap, ALiBi, sinks)
// on every CPU kernel, forward and backward, against the float64 reference.
//
// The reference writes each variant plainly (src/cpu/reference.cpp); the Python tests check
// it in turn against torch's SDPA with the equivalent mask and against finite differences
// (tests/python/test_variants.py).
#include <cstring>
#include <functional>

#include "util/checks.hpp"
#include "util/cpu_variants.hpp"
#include "util/reference.hpp"
#include "util/tensor16.hpp"

namespace fattn_test {
namespace {

constexpr double kGradTol = 2e-5;  // as the backward tests

enum class MaskKind { none, padding, full_bool, additive };

const char* mask_name(MaskKind m) {
  switch (m) {
    case MaskKind::none: return "nomask";
    case MaskKind::padding: return "padding";
    case MaskKind::full_bool: return "bool";
    case MaskKind::additive: return "additive";
  }
  return "?";
}

struct Case {
  std::int64_t B, Hq, Hkv, Sq, Sk, D;
  Causal causal;
  std::int64_t left = -1, right = -1;
  double softcap = 0.0;
  bool alibi = false, sinks = false;
  MaskKind mask = MaskKind::none;
  Layout layout = Layout::bhsd;
  int threads = 0;
};

std::string case_name(const Case& c) {
  std::ostringstream s;
  s << "B" << c.B << "_H" << c.Hq << "x" << c.Hkv << "_Sq" << c.Sq << "_Sk" << c.Sk << "_D" << c.D
    << "_" << fattn::to_string(c.causal) << "_w" << (c.left + 1) << "_" << (c.right + 1) << "_cap"
    << c.softcap << (c.alibi ? "_alibi" : "") << (c.sinks ? "_sinks" : "") << "_"
    << mask_name(c.mask) << "_" << layout_name(c.layout) << "_t" << c.threads;
  std::string name = s.str();
  for (char& ch : name)
    if (ch == '.') ch = 'p';
  return name;
}
void PrintTo(const Case& c, std::ostream* os) { *os << case_name(c); }

// Each variant alone, and pairs of them, over odd sizes, Sq ≠ Sk both ways, GQA, both
// causal alignments, windows of 0 and beyond S, strided inputs and more than one key tile.
std::vector<Case> grid() {
  using C = Causal;
  std::vector<Case> g;
  // windows: left only, right only, both, 0, larger than the sequence, with causal
  g.push_back({2, 4, 2, 77, 130, 40, C::none, 20, -1});
  g.push_back({1, 2, 1, 130, 77, 64, C::none, -1, 9});
  g.push_back({1, 4, 4, 200, 200, 64, C::none, 30, 30, 0.0, false, false, MaskKind::none,
               Layout::strided});
  g.push_back({1, 2, 2, 90, 150, 32, C::bottom_right, 0, -1});
  g.push_back({1, 2, 2, 150, 90, 32, C::top_left, 40, 0});
  g.push_back({1, 3, 1, 65, 300, 48, C::bottom_right, 1000, -1});
  g.push_back({1, 2, 2, 300, 300, 128, C::bottom_right, 100, -1, 0.0, false, false,
               MaskKind::none, Layout::bhsd, 2});
  // softcap, with large logits (the inputs are scaled ×4 below)
  g.push_back({2, 4, 2, 63, 97, 64, C::none, -1, -1, 5.0});
  g.push_back({1, 2, 1, 100, 100, 256, C::top_left, -1, -1, 30.0});
  // ALiBi
  g.push_back({2, 4, 2, 70, 200, 32, C::none, -1, -1, 0.0, true});
  g.push_back({1, 4, 1, 200, 70, 16, C::bottom_right, -1, -1, 0.0, true});
  // sinks (rows of Sq > Sk bottom-right see no key: the sink alone)
  g.push_back({2, 4, 2, 90, 61, 64, C::bottom_right, -1, -1, 0.0, false, true});
  g.push_back({1, 2, 2, 33, 250, 80, C::none, -1, -1, 0.0, false, true, MaskKind::none,
               Layout::bshd});
  // masks: padding (B, 1, 1, Sk), full boolean (B, Hq, Sq, Sk), additive (1, Hq, Sq, Sk)
  g.push_back({2, 4, 2, 70, 230, 64, C::none, -1, -1, 0.0, false, false, MaskKind::padding});
  g.push_back({2, 2, 1, 130, 200, 32, C::none, -1, -1, 0.0, false, false, MaskKind::full_bool});
  g.push_back({1, 4, 2, 100, 260, 64, C::top_left, -1, -1, 0.0, false, false,
               MaskKind::full_bool, Layout::strided});
  g.push_back({2, 2, 2, 80, 120, 48, C::none, -1, -1, 0.0, false, false, MaskKind::additive});
  // short queries (the decode kernel's shapes): GQA groups, a window, sinks, a mask
  g.push_back({2, 8, 2, 1, 300, 64, C::bottom_right, 100, -1, 0.0, true, true});
  g.push_back({2, 8, 2, 3, 500, 128, C::bottom_right, 64, -1, 30.0, false, false,
               MaskKind::padding});
  g.push_back({1, 4, 1, 16, 400, 64, C::none, -1, -1, 10.0, true, true, MaskKind::full_bool});
  // pairs and more
  g.push_back({2, 4, 2, 100, 180, 64, C::bottom_right, 50, -1, 20.0, true, false});
  g.push_back({1, 4, 2, 150, 150, 64, C::none, 40, 40, 0.0, false, true, MaskKind::padding});
  g.push_back({2, 4, 4, 90, 140, 32, C::top_left, -1, -1, 10.0, false, true, MaskKind::additive});
  g.push_back({1, 2, 1, 120, 300, 64, C::none, 60, 10, 15.0, true, true, MaskKind::full_bool,
               Layout::bshd, 2});
  return g;
}

// The decode kernel's query-lane tiles (items of 48 to 64 rows: Sq × the GQA group, on
// AVX-512): each variant alone, rows of several heads and positions per tile, a mask per
// head, one read in place, one staged (strided), one split over the keys (Sk > 1024, 2
// threads), every key tile of more than one.
std::vector<Case> query_lane_grid() {
  using C = Causal;
  using M = MaskKind;
  std::vector<Case> g;
  g.push_back({1, 8, 2, 16, 333, 64, C::none, 40, -1});                         // window left
  g.push_back({2, 8, 1, 7, 300, 64, C::none, 20, 3});                           // 56 rows, both edges
  g.push_back({1, 4, 1, 16, 257, 64, C::bottom_right});                         // causal
  g.push_back({1, 4, 1, 16, 40, 64, C::top_left});                              // Sk > Sq top-left
  g.push_back({2, 4, 1, 12, 300, 128, C::none, -1, -1, 20.0});                  // 48 rows, softcap
  g.push_back({2, 8, 2, 16, 290, 64, C::none, -1, -1, 0.0, true});              // ALiBi
  g.push_back({2, 4, 1, 16, 200, 64, C::bottom_right, -1, -1, 0.0, false, true});  // sinks
  g.push_back({2, 4, 1, 16, 310, 64, C::none, -1, -1, 0.0, false, false, M::padding});
  g.push_back({1, 4, 1, 16, 300, 64, C::none, -1, -1, 0.0, false, false, M::full_bool});
  g.push_back({1, 8, 2, 16, 260, 32, C::none, -1, -1, 0.0, false, false, M::additive,
               Layout::strided});
  g.push_back({1, 4, 1, 16, 1500, 64, C::bottom_right, 700, -1, 10.0, true, true, M::full_bool,
               Layout::bshd, 2});
  return g;
}

// A mask of bytes (boolean) or floats (additive) and its view, broadcast by size-1 dims.
struct Mask {
  std::vector<std::uint8_t> bytes;
  std::vector<float> values;
  TensorView view;
};

Mask make_mask(const Case& c, Rng& rng) {
  Mask m;
  std::array<std::int64_t, 4> sizes{};
  switch (c.mask) {
    case MaskKind::none: return m;
    case MaskKind::padding: sizes = {c.B, 1, 1, c.Sk}; break;
    case MaskKind::full_bool: sizes = {c.B, c.Hq, c.Sq, c.Sk}; break;
    case MaskKind::additive: sizes = {1, c.Hq, c.Sq, c.Sk}; break;
  }
  const std::int64_t n = sizes[0] * sizes[1] * sizes[2] * sizes[3];
  m.view.rank = 4;
  m.view.sizes = sizes;
  m.view.strides = {sizes[1] * sizes[2] * sizes[3], sizes[2] * sizes[3], sizes[3], 1};
  if (c.mask == MaskKind::additive) {
    m.values.resize(static_cast<std::size_t>(n));
    for (std::int64_t e = 0; e < n; ++e) {  // some −inf, whole rows of it too
      const std::int64_t row = e / c.Sk;
      const double u = rng.uniform(0.0, 1.0);
      m.values[static_cast<std::size_t>(e)] =
          row % 17 == 3 || u < 0.1 ? -kInf : static_cast<float>(rng.normal() * 2.0);
    }
    m.view.data = m.values.data();
    m.view.dtype = fattn::DType::float32;
    return m;
  }
  m.bytes.resize(static_cast<std::size_t>(n));
  for (std::int64_t e = 0; e < n; ++e) {
    const std::int64_t j = e % c.Sk, row = e / c.Sk;
    bool keep;
    if (c.mask == MaskKind::padding)  // sequence b keeps its first Sk − 29·(b+1) keys
      keep = j < c.Sk - 29 * (row + 1);
    else  // random pairs, some rows hidden whole, keys [96, 192) hidden whole (a key tile)
      keep = row % 13 != 5 && !(j >= 96 && j < 192) && rng.uniform(0.0, 1.0) < 0.7;
    m.bytes[static_cast<std::size_t>(e)] = keep ? 1 : 0;
  }
  m.view.data = m.bytes.data();
  m.view.dtype = fattn::DType::boolean;
  return m;
}

// Everything one forward and backward call reads.
struct Problem {
  Case c;
  Tensor q, k, v, dout;
  Mask mask;
  std::vector<float> slopes, sinks;
  TensorView slopes_view, sinks_view;
  Options options;

  explicit Problem(const Case& cs) : c(cs) {
    Rng rng;
    const float logits = c.softcap != 0.0 ? 4.0f : 1.0f;  // softcap: scores well past the cap
    q = make_input(c.layout, c.B, c.Hq, c.Sq, c.D, rng, logits);
    k = make_input(c.layout, c.B, c.Hkv, c.Sk, c.D, rng, logits);
    v = make_input(c.layout, c.B, c.Hkv, c.Sk, c.D, rng);
    dout = make_input(c.layout, c.B, c.Hq, c.Sq, c.D, rng);
    mask = make_mask(c, rng);
    options.causal = c.causal;
    options.num_threads = c.threads;
    options.window_left = c.left;
    options.window_right = c.right;
    options.softcap = c.softcap;
    if (c.mask != MaskKind::none) options.attn_mask = &mask.view;
    if (c.alibi) {  // (B, Hq) slopes, as FlashAttention's 2^(−8h/H) but per batch too
      slopes.resize(static_cast<std::size_t>(c.B * c.Hq));
      for (std::size_t e = 0; e < slopes.size(); ++e)
        slopes[e] = static_cast<float>(std::exp2(-8.0 * static_cast<double>(e % c.Hq + 1) / c.Hq) *
                                       (1.0 + 0.5 * static_cast<double>(e / c.Hq)));
      slopes_view.data = slopes.data();
      slopes_view.rank = 2;
      slopes_view.sizes = {c.B, c.Hq, 0, 0};
      slopes_view.strides = {c.Hq, 1, 0, 0};
      options.alibi_slopes = &slopes_view;
    }
    if (c.sinks) {
      sinks.resize(static_cast<std::size_t>(c.Hq));
      for (float& s : sinks) s = static_cast<float>(rng.normal() * 2.0);
      sinks_view.data = sinks.data();
      sinks_view.rank = 1;
      sinks_view.sizes = {c.Hq, 0, 0, 0};
      sinks_view.strides = {1, 0, 0, 0};
      options.sinks = &sinks_view;
    }
  }

  Result forward(Impl impl, Isa isa) const {
    Options o = options;
    o.impl = impl;
    o.isa = isa;
    Result r{make_output(c.layout, c.B, c.Hq, c.Sq, c.D), make_lse(LseLayout::strided, c.B, c.Hq, c.Sq)};
    fattn::attention_forward(q.view(), k.view(), v.view(), r.out.view(), r.lse.view_ptr(), o);
    return r;
  }

  struct Grads {
    Tensor dq, dk, dv;
    std::vector<float> dsinks;
  };
  Grads backward(const Result& fwd, Impl impl, Isa isa) const {
    Grads g{make_output(c.layout, c.B, c.Hq, c.Sq, c.D), make_output(c.layout, c.B, c.Hkv, c.Sk, c.D),
            make_output(c.layout, c.B, c.Hkv, c.Sk, c.D), {}};
    Options o = options;
    o.impl = impl;
    o.isa = isa;
    TensorView dsinks = sinks_view;
    g.dsinks.assign(sinks.size(), kPoison);
    dsinks.data = g.dsinks.data();
    fattn::attention_backward(q.view(), k.view(), v.view(), fwd.out.view(), dout.view(),
                              fwd.lse.view(), nullptr, g.dq.view(), g.dk.view(), g.dv.view(), o,
                              c.sinks ? &dsinks : nullptr);
    return g;
  }
};

class VariantTest : public ::testing::TestWithParam<std::tuple<Variant, Case>> {};

TEST_P(VariantTest, ForwardAndBackwardMatchReference) {
  const auto& [variant, c] = GetParam();
  FATTN_SKIP_IF_UNSUPPORTED(variant.isa);
  const Problem p(c);
  const Result ref = p.forward(Impl::reference, Isa::automatic);
  const Result got = p.forward(variant.impl, variant.isa);
  EXPECT_TRUE(outputs_near(got.out, ref.out));
  EXPECT_TRUE(lse_near(got.lse, ref.lse));
  EXPECT_TRUE(outside_view_untouched(got.out));
  if (variant.impl == Impl::decode) return;  // no backward
  // The backward of the reference's forward, both from the same out and lse.
  const auto gref = p.backward(ref, Impl::reference, Isa::automatic);
  const auto ggot = p.backward(ref, variant.impl, variant.isa);
  EXPECT_TRUE(outputs_near(ggot.dq, gref.dq, kGradTol)) << "dq";
  EXPECT_TRUE(outputs_near(ggot.dk, gref.dk, kGradTol)) << "dk";
  EXPECT_TRUE(outputs_near(ggot.dv, gref.dv, kGradTol)) << "dv";
  double max_ref = 1.0;
  for (float x : gref.dsinks) max_ref = std::max(max_ref, std::fabs(static_cast<double>(x)));
  for (std::size_t h = 0; h < gref.dsinks.size(); ++h)
    EXPECT_NEAR(ggot.dsinks[h], gref.dsinks[h], kGradTol * max_ref) << "dsinks[" << h << "]";
}

std::string variant_case_name(const std::tuple<Variant, Case>& param) {
  return variant_name(std::get<0>(param)) + "_" + case_name(std::get<1>(param));
}

INSTANTIATE_TEST_SUITE_P(Grid, VariantTest,
                         ::testing::Combine(::testing::ValuesIn(forward_variants()),
                                            ::testing::ValuesIn(grid())),
                         [](const auto& info) { return variant_case_name(info.param); });

std::vector<Variant> decode_variants() {
  std::vector<Variant> vs;
  for (const Variant& v : forward_variants())
    if (v.impl == Impl::decode) vs.push_back(v);
  return vs;
}

INSTANTIATE_TEST_SUITE_P(QueryLanes, VariantTest,
                         ::testing::Combine(::testing::ValuesIn(decode_variants()),
                                            ::testing::ValuesIn(query_lane_grid())),
                         [](const auto& info) { return variant_case_name(info.param); });

// ---- 16-bit inputs ----------------------------------------------------------------------

// Each case in bfloat16 and float16 (additive masks excepted: they take q's dtype; the
// Python tests run those) on the kernels that read 16-bit inputs, against the reference
// on the same rounded values: half an ulp of the dtype, plus P's rounding where the
// kernel rounds it (util/tensor16.hpp).
class Variant16Test : public ::testing::TestWithParam<std::tuple<DType, Variant, Case>> {};

TEST_P(Variant16Test, ForwardWithinHalfAnUlp) {
  const auto& [dtype, variant, c] = GetParam();
  FATTN_SKIP_IF_UNSUPPORTED(variant.isa);
  Problem p(c);
  const Tensor16 q16 = to_16bit(p.q, dtype), k16 = to_16bit(p.k, dtype), v16 = to_16bit(p.v, dtype);
  const Result ref = p.forward(Impl::reference, Isa::automatic);
  Options o = p.options;
  o.impl = variant.impl;
  o.isa = variant.isa;
  Tensor16 out = output_like(make_output(c.layout, c.B, c.Hq, c.Sq, c.D), dtype);
  Tensor lse = make_lse(LseLayout::strided, c.B, c.Hq, c.Sq);
  fattn::attention_forward(q16.view, k16.view, v16.view, out.view, lse.view_ptr(), o);
  std::optional<Tensor> p_rounding;
  if (rounds_p(q16.view, k16.view, v16.view, o)) {  // the reference's output for |v|
    Options reference = p.options;
    reference.impl = Impl::reference;
    const Tensor abs_v = abs_of(p.v);
    Tensor out_abs = make_output(c.layout, c.B, c.Hq, c.Sq, c.D);
    fattn::attention_forward(p.q.view(), p.k.view(), abs_v.view(), out_abs.view(), nullptr, reference);
    p_rounding = p_rounding_bound(out_abs);
  }
  EXPECT_TRUE(near_16bit(out, ref.out, dtype, 0.5, p_rounding ? &*p_rounding : nullptr));
  EXPECT_TRUE(lse_near(lse, ref.lse));
}

std::vector<std::tuple<DType, Variant, Case>> cases16() {
  std::vector<std::tuple<DType, Variant, Case>> all;
  for (DType dtype : {DType::bfloat16, DType::float16})
    for (Impl impl : {Impl::fused, Impl::decode, Impl::naive})
      for (Isa isa : {Isa::avx512, Isa::avx2})
        for (const Case& c : grid())
          if (c.mask != MaskKind::additive) all.emplace_back(dtype, Variant{impl, isa}, c);
  return all;
}

// The query-lane tiles on 16-bit caches: bfloat16 read in place on vdpbf16ps
// (DecodeQueryLanesBf16), float16 on the keys-along-lanes tiles.
std::vector<std::tuple<DType, Variant, Case>> query_lane_cases16() {
  std::vector<std::tuple<DType, Variant, Case>> all;
  for (DType dtype : {DType::bfloat16, DType::float16})
    for (const Case& c : query_lane_grid())
      if (c.mask != MaskKind::additive) all.emplace_back(dtype, Variant{Impl::decode, Isa::avx512}, c);
  return all;
}

std::string name16(const std::tuple<DType, Variant, Case>& param) {
  return std::string(fattn::to_string(std::get<0>(param))) + "_" + variant_name(std::get<1>(param)) +
         "_" + case_name(std::get<2>(param));
}

INSTANTIATE_TEST_SUITE_P(Grid, Variant16Test, ::testing::ValuesIn(cases16()),
                         [](const auto& info) { return name16(info.param); });
INSTANTIATE_TEST_SUITE_P(QueryLanes, Variant16Test, ::testing::ValuesIn(query_lane_cases16()),
                         [](const auto& info) { return name16(info.param); });

// Contiguous random q, k, v (B, H, S, D) and one forward call into contiguous outputs.
struct Small {
  std::int64_t B, H, Sq, Sk, D;
  Tensor q, k, v;
  Small(std::int64_t b, std::int64_t h, std::int64_t sq, std::int64_t sk, std::int64_t d)
      : B(b), H(h), Sq(sq), Sk(sk), D(d) {
    Rng rng;
    q = make_input(Layout::bhsd, B, H, Sq, D, rng);
    k = make_input(Layout::bhsd, B, H, Sk, D, rng);
    v = make_input(Layout::bhsd, B, H, Sk, D, rng);
  }
  Result run(Options o, Impl impl) const {
    o.impl = impl;
    Result r{make_output(Layout::bhsd, B, H, Sq, D), make_lse(LseLayout::contiguous, B, H, Sq)};
    fattn::attention_forward(q.view(), k.view(), v.view(), r.out.view(), r.lse.view_ptr(), o);
    return r;
  }
};

// The reference against rows written out here for the simplest instances of each variant,
// so that a mistake shared by the reference and the kernels cannot pass unseen: a window
// equals the boolean mask of the same band, softcap → ∞ is no softcap, a sink of −inf is no
// sink, ALiBi equals the additive mask of its bias.
TEST(VariantSemantics, EquivalentFormsAgree) {
  const std::int64_t B = 2, H = 2, Sq = 37, Sk = 53, D = 32;
  const Small p(B, H, Sq, Sk, D);
  auto run = [&](const Options& o, Impl impl) { return p.run(o, impl); };
  for (Impl impl : {Impl::reference, Impl::fused, Impl::naive}) {
    // window (left 5, right 3, bottom-right aligned) == boolean band mask
    Options window;
    window.window_left = 5;
    window.window_right = 3;
    std::vector<std::uint8_t> band(static_cast<std::size_t>(Sq * Sk));
    for (std::int64_t i = 0; i < Sq; ++i)
      for (std::int64_t j = 0; j < Sk; ++j) {
        const std::int64_t diag = j - (i + Sk - Sq);
        band[static_cast<std::size_t>(i * Sk + j)] = diag >= -5 && diag <= 3;
      }
    TensorView band_view{band.data(), 4, {1, 1, Sq, Sk}, {0, 0, Sk, 1}, fattn::DType::boolean};
    Options masked;
    masked.attn_mask = &band_view;
    const Result a = run(window, impl), b = run(masked, impl);
    EXPECT_TRUE(outputs_near(a.out, b.out)) << fattn::to_string(impl);
    EXPECT_TRUE(lse_near(a.lse, b.lse)) << fattn::to_string(impl);

    // ALiBi == additive mask −slope·|i + Sk − Sq − j|
    std::vector<float> slopes = {0.25f, 0.0625f}, bias(static_cast<std::size_t>(H * Sq * Sk));
    for (std::int64_t h = 0; h < H; ++h)
      for (std::int64_t i = 0; i < Sq; ++i)
        for (std::int64_t j = 0; j < Sk; ++j)
          bias[static_cast<std::size_t>((h * Sq + i) * Sk + j)] =
              -slopes[static_cast<std::size_t>(h)] * static_cast<float>(std::abs(i + Sk - Sq - j));
    TensorView slopes_view{slopes.data(), 1, {H, 0, 0, 0}, {1, 0, 0, 0}};
    TensorView bias_view{bias.data(), 4, {1, H, Sq, Sk}, {0, Sq * Sk, Sk, 1}};
    Options alibi, additive;
    alibi.alibi_slopes = &slopes_view;
    additive.attn_mask = &bias_view;
    const Result c = run(alibi, impl), d = run(additive, impl);
    EXPECT_TRUE(outputs_near(c.out, d.out)) << fattn::to_string(impl);
    EXPECT_TRUE(lse_near(c.lse, d.lse)) << fattn::to_string(impl);

    // softcap 1e6 == none; sinks of −inf == none
    Options capped, sunk, plain;
    capped.softcap = 1e6;
    std::vector<float> no_sinks(static_cast<std::size_t>(H), -kInf);
    TensorView sinks_view{no_sinks.data(), 1, {H, 0, 0, 0}, {1, 0, 0, 0}};
    sunk.sinks = &sinks_view;
    const Result e = run(plain, impl), f = run(capped, impl), g = run(sunk, impl);
    EXPECT_TRUE(outputs_near(f.out, e.out)) << fattn::to_string(impl);
    EXPECT_TRUE(outputs_near(g.out, e.out)) << fattn::to_string(impl);
    EXPECT_TRUE(lse_near(g.lse, e.lse)) << fattn::to_string(impl);
  }
}

// A row whose mask hides every key: out 0, lse −inf; with a sink: out 0, lse = the sink.
TEST(VariantSemantics, FullyMaskedRows) {
  const std::int64_t B = 1, H = 2, Sq = 70, Sk = 200, D = 32;
  const Small p(B, H, Sq, Sk, D);
  std::vector<std::uint8_t> keep(static_cast<std::size_t>(Sq * Sk), 1);
  for (std::int64_t j = 0; j < Sk; ++j) keep[static_cast<std::size_t>(5 * Sk + j)] = 0;  // row 5
  TensorView mask{keep.data(), 4, {1, 1, Sq, Sk}, {0, 0, Sk, 1}, fattn::DType::boolean};
  std::vector<float> sink_values = {0.5f, -1.5f};
  TensorView sinks{sink_values.data(), 1, {H, 0, 0, 0}, {1, 0, 0, 0}};
  for (Impl impl : {Impl::reference, Impl::fused, Impl::naive})
    for (bool with_sinks : {false, true}) {
      Options o;
      o.impl = impl;
      o.attn_mask = &mask;
      if (with_sinks) o.sinks = &sinks;
      const Result r = p.run(o, impl);
      for (std::int64_t h = 0; h < H; ++h) {
        for (std::int64_t d = 0; d < D; ++d) EXPECT_EQ(r.out.at(0, h, 5, d), 0.0f);
        EXPECT_EQ(r.lse.at(0, h, 5), with_sinks ? sink_values[static_cast<std::size_t>(h)] : -kInf)
            << fattn::to_string(impl);
      }
    }
}

// ---- ggml's FLASH_ATTN_EXT forms -------------------------------------------------------
// A float16 additive mask whatever q's dtype, scaled per head (attn_mask_scale: ggml's
// ALiBi), and a 16-bit problem's float32 out: what the llama.cpp backend passes through.

// A float16 mask (values exact in float16, some −inf, one row hidden whole) scaled per head
// by powers of two gives the bits of the float32 mask the test scales itself.
TEST(GgmlForms, Float16MaskScaledPerHead) {
  const std::int64_t B = 1, H = 4, Sq = 45, Sk = 300, D = 64;
  const Small p(B, H, Sq, Sk, D);
  Rng rng;
  std::vector<std::uint16_t> mask16(static_cast<std::size_t>(Sq * Sk));
  std::vector<float> mask_values(mask16.size());
  for (std::size_t e = 0; e < mask16.size(); ++e) {
    const std::int64_t row = static_cast<std::int64_t>(e) / Sk;
    const float x = row == 7 || rng.uniform(0.0, 1.0) < 0.2 ? -kInf : static_cast<float>(rng.normal());
    mask16[e] = bits16_of(fattn::DType::float16, x);
    mask_values[e] = value16_of(fattn::DType::float16, mask16[e]);
  }
  const std::vector<float> scales = {1.0f, 0.5f, 0.25f, 2.0f};
  std::vector<float> scaled(static_cast<std::size_t>(H * Sq * Sk));
  for (std::int64_t h = 0; h < H; ++h)
    for (std::int64_t e = 0; e < Sq * Sk; ++e)
      scaled[static_cast<std::size_t>(h * Sq * Sk + e)] =
          mask_values[static_cast<std::size_t>(e)] * scales[static_cast<std::size_t>(h)];
  TensorView half{mask16.data(), 4, {1, 1, Sq, Sk}, {0, 0, Sk, 1}, fattn::DType::float16};
  TensorView scale_view{const_cast<float*>(scales.data()), 1, {H, 0, 0, 0}, {1, 0, 0, 0}};
  TensorView full{scaled.data(), 4, {1, H, Sq, Sk}, {0, Sq * Sk, Sk, 1}};
  Options with_scale, prescaled;
  with_scale.attn_mask = &half;
  with_scale.attn_mask_scale = &scale_view;
  prescaled.attn_mask = &full;
  const Result ref = p.run(prescaled, Impl::reference);
  for (Impl impl : {Impl::reference, Impl::fused, Impl::naive, Impl::decode}) {
    const Result got = p.run(with_scale, impl), same = p.run(prescaled, impl);
    EXPECT_TRUE(outputs_near(got.out, ref.out)) << fattn::to_string(impl);
    EXPECT_TRUE(lse_near(got.lse, ref.lse)) << fattn::to_string(impl);
    EXPECT_EQ(std::memcmp(got.out.storage().data(), same.out.storage().data(),
                          got.out.storage().size() * sizeof(float)), 0)
        << fattn::to_string(impl) << ": the scaled float16 mask and the float32 mask differ";
    for (std::int64_t h = 0; h < H; ++h)
      for (std::int64_t d = 0; d < D; ++d) EXPECT_EQ(got.out.at(0, h, 7, d), 0.0f);
  }
}

// A 16-bit forward with a float32 out writes the float32 values its 16-bit out rounds:
// the 16-bit out is the float32 out rounded, bit for bit, on every kernel.
TEST(GgmlForms, Float32OutOf16BitInputs) {
  const std::int64_t B = 1, H = 8, Hkv = 2, Sq = 3, Sk = 517, D = 128;
  for (DType dtype : {DType::bfloat16, DType::float16})
    for (Impl impl : {Impl::reference, Impl::fused, Impl::naive, Impl::decode}) {
      Rng rng;
      Tensor q = make_input(Layout::bshd, B, H, Sq, D, rng), k = make_input(Layout::bshd, B, Hkv, Sk, D, rng),
             v = make_input(Layout::bshd, B, Hkv, Sk, D, rng);
      const Tensor16 q16 = to_16bit(q, dtype), k16 = to_16bit(k, dtype), v16 = to_16bit(v, dtype);
      Tensor out32 = make_output(Layout::bshd, B, H, Sq, D), ref = make_output(Layout::bshd, B, H, Sq, D);
      Tensor16 out16 = output_like(out32, dtype);
      Options o;
      o.impl = impl;
      o.causal = fattn::Causal::bottom_right;
      fattn::attention_forward(q16.view, k16.view, v16.view, out32.view(), nullptr, o);
      fattn::attention_forward(q16.view, k16.view, v16.view, out16.view, nullptr, o);
      Options r = o;
      r.impl = Impl::reference;
      fattn::attention_forward(q.view(), k.view(), v.view(), ref.view(), nullptr, r);
      std::optional<Tensor> p_rounding;  // where the kernel rounds P to bfloat16 (Variant16Test)
      if (rounds_p(q16.view, k16.view, v16.view, o)) {
        const Tensor abs_v = abs_of(v);
        Tensor out_abs = make_output(Layout::bshd, B, H, Sq, D);
        fattn::attention_forward(q.view(), k.view(), abs_v.view(), out_abs.view(), nullptr, r);
        p_rounding = p_rounding_bound(out_abs);
      }
      EXPECT_TRUE(near_16bit(out16, ref, dtype, 0.5, p_rounding ? &*p_rounding : nullptr))
          << fattn::to_string(dtype) << " " << fattn::to_string(impl);
      EXPECT_TRUE(outside_view_untouched(out32));
      std::int64_t differ = 0;
      out32.for_each([&](auto b, auto h, auto i, auto d) {
        const float* base = out32.storage().data();
        const auto at = static_cast<std::size_t>(&out32.at(b, h, i, d) - base);
        differ += out16.storage[at] != bits16_of(dtype, out32.at(b, h, i, d));
      });
      EXPECT_EQ(differ, 0) << fattn::to_string(dtype) << " " << fattn::to_string(impl);
    }
}

TEST(GgmlForms, Validation) {
  const std::int64_t B = 1, H = 2, Sq = 3, Sk = 5, D = 16;
  Rng rng;
  Tensor q = make_input(Layout::bhsd, B, H, Sq, D, rng), k = make_input(Layout::bhsd, B, H, Sk, D, rng),
         v = make_input(Layout::bhsd, B, H, Sk, D, rng);
  Tensor out = make_output(Layout::bhsd, B, H, Sq, D);
  std::vector<float> scales = {1.0f, 0.0f}, mask(static_cast<std::size_t>(Sq * Sk), 0.0f);
  TensorView additive{mask.data(), 4, {1, 1, Sq, Sk}, {0, 0, Sk, 1}};
  TensorView scale_view{scales.data(), 1, {H, 0, 0, 0}, {1, 0, 0, 0}};
  auto forward = [&](const Options& o) {
    return [&, o] { fattn::attention_forward(q.view(), k.view(), v.view(), out.view(), nullptr, o); };
  };
  Options o;
  o.attn_mask_scale = &scale_view;
  expect_error(forward(o), "attn_mask_scale scales an additive attn_mask; got no attn_mask");
  o.attn_mask = &additive;
  expect_error(forward(o), "attn_mask_scale[1] must be finite and > 0, got 0");
  scales[1] = 1.0f;
  scale_view.sizes = {H + 1, 0, 0, 0};
  expect_error(forward(o), "attn_mask_scale.size(0) (query heads) must equal q.size(1) = 2, got 3");
  // A float32 out takes 16-bit inputs only; a float16 out of float32 inputs is an error.
  const Tensor16 out16 = output_like(out, DType::float16);
  expect_error([&] { fattn::attention_forward(q.view(), k.view(), v.view(), out16.view, nullptr, {}); },
               "out must have dtype float32, got float16");
  const Tensor16 q16 = to_16bit(q, DType::bfloat16), k16 = to_16bit(k, DType::bfloat16),
                 v16 = to_16bit(v, DType::bfloat16);
  expect_error([&] { fattn::attention_forward(q16.view, k16.view, v16.view, out16.view, nullptr, {}); },
               "out must have dtype bfloat16 (or float32 on the CPU), got float16");
}

// ---- validation -----------------------------------------------------------------------


TEST(VariantValidation, NamesTheArgument) {
  const std::int64_t B = 2, H = 4, Sq = 5, Sk = 7, D = 16;
  Rng rng;
  const Tensor q = make_input(Layout::bhsd, B, H, Sq, D, rng);
  const Tensor k = make_input(Layout::bhsd, B, H, Sk, D, rng);
  const Tensor v = make_input(Layout::bhsd, B, H, Sk, D, rng);
  Tensor out = make_output(Layout::bhsd, B, H, Sq, D);
  const std::vector<float> before = out.storage();
  auto forward = [&](const Options& o) {
    return [&, o] { fattn::attention_forward(q.view(), k.view(), v.view(), out.view(), nullptr, o); };
  };
  Options o;
  o.window_left = -2;
  expect_error(forward(o), "window_left must be >= -1 (-1: unbounded), got -2");
  o = {};
  o.window_right = -5;
  expect_error(forward(o), "window_right must be >= -1");
  o = {};
  o.softcap = -1.0;
  expect_error(forward(o), "softcap must be finite and > 0 (0: off), got -1");
  o.softcap = std::numeric_limits<double>::quiet_NaN();
  expect_error(forward(o), "softcap must be finite");

  std::vector<float> values(static_cast<std::size_t>(B * H * Sq * Sk), 0.0f);
  TensorView mask{values.data(), 4, {B, H, Sq, Sk + 1}, {H * Sq * (Sk + 1), Sq * (Sk + 1), Sk + 1, 1}};
  o = {};
  o.attn_mask = &mask;
  expect_error(forward(o), "attn_mask.size(3) (key sequence) must be 1 (broadcast) or k.size(2) = 7, got 8");
  mask.sizes = {B, 3, Sq, Sk};
  expect_error(forward(o), "attn_mask.size(1) (query heads) must be 1 (broadcast) or q.size(1) = 4, got 3");
  mask.sizes = {B, H, Sq, Sk};
  mask.dtype = fattn::DType::float16;
  mask.dtype = fattn::DType::int32;
  expect_error(forward(o), "attn_mask must have dtype bool, float32, float16 or bfloat16, got int32");
  mask.dtype = fattn::DType::float32;
  mask.rank = 2;
  expect_error(forward(o), "attn_mask must have rank 4, got 2");

  std::vector<float> per_head(16, 0.1f);
  TensorView slopes{per_head.data(), 1, {H + 1, 0, 0, 0}, {1, 0, 0, 0}};
  o = {};
  o.alibi_slopes = &slopes;
  expect_error(forward(o), "alibi_slopes.size(0) (query heads) must equal q.size(1) = 4, got 5");
  slopes = {per_head.data(), 2, {B + 1, H, 0, 0}, {H, 1, 0, 0}};
  expect_error(forward(o), "alibi_slopes.size(0) (batch) must equal q.size(0) = 2, got 3");
  slopes = {per_head.data(), 3, {1, B, H, 0}, {0, H, 1, 0}};
  expect_error(forward(o), "alibi_slopes must have rank 1 (query heads) or 2 (batch, query heads), got rank 3");
  slopes = {per_head.data(), 1, {H, 0, 0, 0}, {1, 0, 0, 0}, fattn::DType::float16};
  expect_error(forward(o), "alibi_slopes must have dtype float32, got float16");

  TensorView sinks{per_head.data(), 1, {H - 1, 0, 0, 0}, {1, 0, 0, 0}};
  o = {};
  o.sinks = &sinks;
  expect_error(forward(o), "sinks.size(0) (query heads) must equal q.size(1) = 4, got 3");
  sinks.sizes = {H, 0, 0, 0};
  sinks.strides = {2, 0, 0, 0};
  expect_error(forward(o), "sinks must be contiguous (stride 1), got stride 2");

  EXPECT_EQ(std::memcmp(out.storage().data(), before.data(), before.size() * sizeof(float)), 0)
      << "an error left a half-written output";

  // The backward: dsinks with sinks, and only then.
  Tensor lse = make_lse(LseLayout::contiguous, B, H, Sq);
  Tensor dq = make_output(Layout::bhsd, B, H, Sq, D), dk = make_output(Layout::bhsd, B, H, Sk, D),
         dv = make_output(Layout::bhsd, B, H, Sk, D);
  sinks.strides = {1, 0, 0, 0};
  Options with_sinks;
  with_sinks.sinks = &sinks;
  fattn::attention_forward(q.view(), k.view(), v.view(), out.view(), lse.view_ptr(), with_sinks);
  auto backward = [&](const Options& opt, const TensorView* dsinks) {
    return [&, opt, dsinks] {
      fattn::attention_backward(q.view(), k.view(), v.view(), out.view(), q.view(), lse.view(),
                                nullptr, dq.view(), dk.view(), dv.view(), opt, dsinks);
    };
  };
  expect_error(backward(with_sinks, nullptr), "dsinks (the sinks' gradient) must be given with sinks");
  std::vector<float> grad(static_cast<std::size_t>(H), 0.0f);
  TensorView dsinks{grad.data(), 1, {H, 0, 0, 0}, {1, 0, 0, 0}};
  expect_error(backward(Options{}, &dsinks), "dsinks is given, but options.sinks is not set");
  TensorView short_dsinks{grad.data(), 1, {H - 1, 0, 0, 0}, {1, 0, 0, 0}};
  expect_error(backward(with_sinks, &short_dsinks), "dsinks.size(0) (as sinks) must equal sinks.size(0) = 4, got 3");
  TensorView overlapping{per_head.data(), 1, {H, 0, 0, 0}, {1, 0, 0, 0}};
  expect_error(backward(with_sinks, &overlapping), "dsinks must not overlap sinks");
}

}  // namespace
}  // namespace fattn_test
