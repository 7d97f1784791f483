// fattn CUDA tests — one case of the CUDA suite (a kernel, a problem, a layout), the plain
// same-precision pipeline it is measured against, and the runner that checks it.
//
// How a case is checked:
//  * Inputs are fresh N(0,1) values rounded to the dtype, seeded from the case name.
//    Storage around the view (row, head, batch gaps of the padded layouts) is NaN:
//    a kernel that reads outside its view turns outputs into NaN.
//  * out and lse carry the device poison (every byte 0xFF) before the run; every view
//    element must be written, and every byte outside the view must still be poison
//    afterwards.
//  * The reference is fattn::reference_row (float64) on float32 host copies of the
//    inputs (exact: every float16/bfloat16 is a float32).
//  * Tolerance on out (max abs error over the view):
//      Kernel::reference          one ulp of the dtype at max(1, max|ref|)
//      float32 kernels            2·baseline + 1e-5·max(1, max|ref|)
//      float16 / bfloat16 kernels 2·baseline + ulp·max(1, max|ref|), ulp = 2^-10 / 2^-7
//    where baseline is the max error of the plain same-precision pipeline (scores and
//    softmax in float32 from the dtype's inputs, P rounded to the dtype, P·V
//    accumulated in float32, output rounded to the dtype) against the same reference.
//    For Kernel::fused_tf32 (the TF32 mode) the pipeline's q, k and P are rounded to
//    tf32 (10 mantissa bits, as cvt.rna.tf32.f32; v is split, so kept), so its
//    tolerance is twice what that arithmetic itself costs.
//  * lse: |err| <= 5e-5·max(1, |ref|) + 2·(the pipeline's max lse error) (1e-6·max(1,
//    |ref|) for Kernel::reference); -inf and NaN exact.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "checks.hpp"
#include "cuda/backend.hpp"
#include "cuda/kernels.hpp"
#include "cuda_device.hpp"
#include "elements.hpp"
#include "fattn/fattn.hpp"
#include "poison.hpp"
#include "reference.hpp"
#include "seed.hpp"
#include "tensor.hpp"

namespace fattn_cuda_test {

using fattn::Causal;
using fattn::DType;
using fattn::Options;
using fattn::cuda::Kernel;
using fattn_test::Layout;
using fattn_test::LseLayout;
using fattn_test::Placement;
using fattn_test::Poison;

// The tolerances of the header comment.
constexpr double kBaselineMultiple = 2.0;        // out and lse: twice the pipeline's own error
constexpr double kFloat32OutRelTol = 1e-5;       // float32 kernels' out, relative to max(1, max|ref|)
constexpr double kLseRelTol = 5e-5;              // lse, relative to max(1, |ref|)
constexpr double kReferenceLseRelTol = 1e-6;     // Kernel::reference's lse
// Long cases compare every row_step-th row, and always the last rows (the last tile's edge).
constexpr int kLastRowsAlwaysChecked = 3;

inline const char* dtype_short_name(DType t) {
  return t == DType::float32 ? "f32" : t == DType::float16 ? "f16" : "bf16";
}

// ---- one case ---------------------------------------------------------------------------
struct Case {
  DType dtype = DType::float32;
  Kernel kernel = Kernel::automatic;
  int tile_rows = 0;  // fused tensor-core kernels: 0 (chosen per problem), 64 or 128
  int stages = 0;     // fused_tma: 0 (its table's ring depth), else forced
  int blocks = 0;     // the persistent TMA kernels: 0 one block per SM, else at most this many
  int B = 1, Hq = 2, Hkv = 1, Sq = 65, Sk = 65, D = 64;
  Causal causal = Causal::none;
  Layout layout = Layout::bhsd;
  bool with_lse = true;
  double scale = std::numeric_limits<double>::quiet_NaN();  // NaN: the default
  int row_step = 1;  // compare rows i % row_step == 0 and the last 3 (long cases)
  double extra_tol = 0.0;  // added to the out tolerance (huge-logit cases)
  // The variants (the kernels that take them: kernels.hpp's takes_variants).
  int window_left = -1, window_right = -1;
  double softcap = 0.0;
  bool alibi = false;  // (Hq) slopes, ALiBi's geometric series
  bool sinks = false;  // (Hq) random logits

  std::string name() const {
    std::ostringstream s;
    s << dtype_short_name(dtype) << "_" << fattn::cuda::to_string(kernel);
    if (tile_rows) s << "_r" << tile_rows;
    if (stages) s << "_ring" << stages;
    if (blocks) s << "_blocks" << blocks;
    s << "_S" << Sq << "x" << Sk
      << "_D" << D << "_H" << Hq << "x" << Hkv << "_B" << B << "_" << fattn::to_string(causal)
      << "_" << fattn_test::layout_name(layout);
    if (!with_lse) s << "_nolse";
    if (!std::isnan(scale)) {
      const long long milli = std::llround(scale * 1000.0);
      s << "_scale" << (milli < 0 ? "m" : "") << std::llabs(milli) << "milli";
    }
    if (window_left != -1 || window_right != -1)
      s << "_window" << (window_left < 0 ? "n" : std::to_string(window_left)) << "x"
        << (window_right < 0 ? "n" : std::to_string(window_right));
    if (softcap != 0.0) s << "_softcap" << std::llround(softcap);
    if (alibi) s << "_alibi";
    if (sinks) s << "_sinks";
    return s.str();
  }
  bool has_variants() const {
    return window_left != -1 || window_right != -1 || softcap != 0.0 || alibi || sinks;
  }
  double effective_scale() const { return std::isnan(scale) ? fattn_test::default_scale(D) : scale; }
  std::int64_t rows() const { return static_cast<std::int64_t>(B) * Hq * Sq; }
};
// What gtest prints for a case: its name (its padding bytes otherwise).
inline void PrintTo(const Case& c, std::ostream* os) { *os << c.name(); }

// A case's per-head values (ALiBi slopes, sinks) on the host and the device.
struct CaseMods {
  std::vector<float> slopes, sinks;  // empty where the case has none
  DeviceBuffer device_slopes, device_sinks;
  TensorView host_slopes_view, host_sinks_view, device_slopes_view, device_sinks_view;
};

inline TensorView float_vector(void* data, std::int64_t n, fattn::Device device) {
  TensorView t;
  t.data = data;
  t.rank = 1;
  t.sizes = {n, 0, 0, 0};
  t.strides = {1, 0, 0, 0};
  t.dtype = DType::float32;
  t.device = device;
  return t;
}

// Slopes 2^(-8(h+1)/Hq) (ALiBi's), sinks N(0, 2) seeded from the case name.
inline CaseMods make_case_mods(const Case& c) {
  CaseMods m;
  std::mt19937_64 engine(fattn_test::seed_for(c.name() + "/sinks"));
  std::normal_distribution<float> normal(0.0f, 2.0f);
  for (int h = 0; h < c.Hq; ++h) {
    if (c.alibi) m.slopes.push_back(std::exp2(-8.0f * static_cast<float>(h + 1) / static_cast<float>(c.Hq)));
    if (c.sinks) m.sinks.push_back(normal(engine));
  }
  auto place = [&](std::vector<float>& host, DeviceBuffer& buffer, TensorView& host_view,
                   TensorView& device_view) {
    if (host.empty()) return;
    const std::size_t bytes = host.size() * sizeof(float);
    buffer = DeviceBuffer(bytes);
    EXPECT_TRUE(buffer.get() != nullptr) << "cudaMalloc failed";
    if (!buffer.get()) return;
    EXPECT_TRUE(cuda_succeeded(cudaMemcpy(buffer.get(), host.data(), bytes, cudaMemcpyHostToDevice),
                               "cudaMemcpy to the device"));
    host_view = float_vector(host.data(), static_cast<std::int64_t>(host.size()), fattn::Device::cpu);
    device_view = float_vector(buffer.get(), static_cast<std::int64_t>(host.size()), fattn::Device::cuda);
  };
  place(m.slopes, m.device_slopes, m.host_slopes_view, m.device_slopes_view);
  place(m.sinks, m.device_sinks, m.host_sinks_view, m.device_sinks_view);
  return m;
}

// The options a case runs with (the kernel is chosen apart from them); the per-head values'
// device views (on_device) or host views (the host reference).
inline Options options_for(const Case& c, const CaseMods* mods = nullptr, bool on_device = true) {
  Options options;
  options.causal = c.causal;
  if (!std::isnan(c.scale)) options.scale = c.scale;
  options.window_left = c.window_left;
  options.window_right = c.window_right;
  options.softcap = c.softcap;
  if (mods && c.alibi) options.alibi_slopes = on_device ? &mods->device_slopes_view : &mods->host_slopes_view;
  if (mods && c.sinks) options.sinks = on_device ? &mods->device_sinks_view : &mods->host_sinks_view;
  return options;
}

// (b, h, i) of row r of the (B, Hq, Sq) rows.
struct RowIndex {
  int b, h, i;
};
inline RowIndex row_index(const Case& c, std::int64_t r) {
  const int i = static_cast<int>(r % c.Sq), bh = static_cast<int>(r / c.Sq);
  return {bh / c.Hq, bh % c.Hq, i};
}
inline bool row_is_checked(const Case& c, int i) {
  return i % c.row_step == 0 || i >= c.Sq - kLastRowsAlwaysChecked;
}

// ---- the case's tensors -------------------------------------------------------------------

// Host storage exactly as large as the layout (no guard), device-poisoned: its device
// copy ends where the layout does.
inline Tensor device_sized(DType dtype, int rank, std::array<std::int64_t, 4> sizes,
                           const Placement& p) {
  Tensor t(dtype, rank, sizes, p, 0);
  t.poison(Poison::device);
  return t;
}

// The logsumexp of a case: gaps too when its tensors have gaps.
inline LseLayout lse_layout_for(Layout layout) {
  return layout == Layout::padded || layout == Layout::misaligned ? LseLayout::padded
                                                                  : LseLayout::contiguous;
}

// Fills the view with N(0,1) values rounded to the dtype, in storage order, and the
// padding with NaN. Each tensor draws from a distribution of its own, so its values
// depend on the engine's state alone.
inline void fill_random(Tensor& t, std::mt19937_64& engine) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const std::vector<char> in_view = t.coverage();
  for (std::int64_t e = 0; e < t.storage_elements(); ++e)
    t.set_element(e, in_view[static_cast<std::size_t>(e)] ? normal(engine) : fattn_test::kNaN);
}

struct CaseTensors {
  Tensor q, k, v, out, lse;
};

// Random inputs seeded from the case name; out and lse poisoned.
inline CaseTensors make_case_tensors(const Case& c) {
  auto tensor = [&](std::int64_t H, std::int64_t S) {
    return device_sized(c.dtype, 4, {c.B, H, S, c.D},
                        fattn_test::placement(c.layout, c.B, H, S, c.D));
  };
  CaseTensors t{tensor(c.Hq, c.Sq), tensor(c.Hkv, c.Sk), tensor(c.Hkv, c.Sk), tensor(c.Hq, c.Sq),
                device_sized(DType::float32, 3, {c.B, c.Hq, c.Sq, 0},
                             fattn_test::lse_placement(lse_layout_for(c.layout), c.B, c.Hq, c.Sq))};
  std::mt19937_64 engine(fattn_test::seed_for(c.name()));
  fill_random(t.q, engine);
  fill_random(t.k, engine);
  fill_random(t.v, engine);
  return t;
}

// A case's host tensors and their device copies.
struct DeviceCase {
  CaseTensors host;
  DeviceTensor q, k, v, out, lse;

  bool ok() const { return q.ok() && k.ok() && v.ok() && out.ok() && lse.ok(); }
  // out and lse back into the host tensors.
  void download() {
    fattn_cuda_test::download(out, host.out);
    fattn_cuda_test::download(lse, host.lse);
  }
};

inline DeviceCase to_device(CaseTensors host) {
  DeviceCase d;
  d.host = std::move(host);
  d.q = upload(d.host.q);
  d.k = upload(d.host.k);
  d.v = upload(d.host.v);
  d.out = upload(d.host.out);
  d.lse = upload(d.host.lse);
  EXPECT_TRUE(d.ok()) << "cudaMalloc failed";
  return d;
}

// ---- the plain same-precision pipeline ----------------------------------------------------

// x rounded to tf32 as cvt.rna.tf32.f32 does: to nearest, ties away from zero, on the
// 13 low mantissa bits (finite inputs; the tests draw N(0,1) values).
inline float round_tf32(float x) {
  constexpr std::uint32_t kHalfDroppedUnit = 0x1000u, kDroppedBits = 0x1fffu;
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  u = (u + kHalfDroppedUnit) & ~kDroppedBits;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

// The keys [begin, end) row i sees: the case's band, as model/problem.hpp's (the causal
// limit and the window aligned top-left or bottom-right, the window alone bottom-right).
inline std::pair<int, int> visible_range(const Case& c, int i) {
  const std::int64_t align = c.causal == Causal::top_left ? 0 : c.Sk - c.Sq;
  std::int64_t hi = c.causal == Causal::none ? c.Sk : align;
  if (c.window_right >= 0) hi = std::min<std::int64_t>(hi, align + c.window_right);
  const std::int64_t lo = c.window_left >= 0 ? align - c.window_left : -static_cast<std::int64_t>(c.Sq);
  auto clamp = [&](std::int64_t j) { return static_cast<int>(std::clamp<std::int64_t>(j, 0, c.Sk)); };
  const int begin = clamp(i + lo), end = clamp(i + hi + 1);
  return {begin, std::max(begin, end)};
}

// The plain same-precision pipeline for one row (see the header comment), on contiguous
// float32 copies of the inputs, the variants in float32 as the kernels apply them. Writes
// the row to out and returns its logsumexp (-inf for a row that sees no key and no sink).
inline double baseline_row(const Case& c, const CaseMods& mods, const Tensor& q, const Tensor& k,
                           const Tensor& v, int b, int h, int i, std::vector<double>& out) {
  const int hk = h / (c.Hq / c.Hkv);
  const auto [begin, end] = visible_range(c, i);
  const float sink = c.sinks ? mods.sinks[static_cast<std::size_t>(h)]
                             : -std::numeric_limits<float>::infinity();
  out.assign(static_cast<std::size_t>(c.D), 0.0);
  if (begin == end && !c.sinks) return -std::numeric_limits<double>::infinity();
  const float* qr = q.storage().data() + q.offset_of(b, h, i);
  const float* kb = k.storage().data() + k.offset_of(b, hk, 0);
  const float* vb = v.storage().data() + v.offset_of(b, hk, 0);
  const bool tf32 = c.kernel == Kernel::fused_tf32;
  auto operand = [tf32](float x) { return tf32 ? round_tf32(x) : x; };
  const auto scale = static_cast<float>(c.effective_scale());
  const auto cap = static_cast<float>(c.softcap);
  std::vector<float> s(static_cast<std::size_t>(end - begin));
  float m = sink;
  for (int j = begin; j < end; ++j) {
    float dot = 0.0f;
    for (int d = 0; d < c.D; ++d) dot += operand(qr[d]) * operand(kb[j * c.D + d]);
    float x = dot * scale;
    if (c.softcap != 0.0) x = cap * std::tanh(x / cap);
    if (c.alibi)
      x -= mods.slopes[static_cast<std::size_t>(h)] * static_cast<float>(std::abs(i + c.Sk - c.Sq - j));
    s[static_cast<std::size_t>(j - begin)] = x;
    m = std::max(m, x);
  }
  float l = std::exp(sink - m);
  for (float& x : s) l += (x = std::exp(x - m));
  std::vector<float> o(static_cast<std::size_t>(c.D), 0.0f);
  for (int j = begin; j < end; ++j) {
    const float pj = operand(fattn_test::round_to(c.dtype, s[static_cast<std::size_t>(j - begin)] / l));
    for (int d = 0; d < c.D; ++d) o[static_cast<std::size_t>(d)] += pj * vb[j * c.D + d];
  }
  for (int d = 0; d < c.D; ++d)
    out[static_cast<std::size_t>(d)] = fattn_test::round_to(c.dtype, o[static_cast<std::size_t>(d)]);
  return static_cast<double>(m) + std::log(static_cast<double>(l));
}

// ---- reference rows ---------------------------------------------------------------------------

// The float64 reference and the pipeline, on the checked rows (B·Hq·Sq rows, D values each).
struct ReferenceRows {
  std::vector<double> out, baseline_out, lse, baseline_lse;
  std::vector<char> checked;
  double baseline_lse_err = 0.0;  // max over the checked rows with a finite reference lse
};

inline double baseline_lse_error(const ReferenceRows& ref) {
  double err = 0.0;
  for (std::size_t r = 0; r < ref.lse.size(); ++r)
    if (ref.checked[r] && std::isfinite(ref.lse[r]))
      err = std::max(err, std::fabs(ref.baseline_lse[r] - ref.lse[r]));
  return err;
}

inline ReferenceRows reference_rows(const Case& c, const CaseMods& mods, const CaseTensors& t) {
  const Tensor hq = fattn_test::float32_bhsd_copy(t.q), hk = fattn_test::float32_bhsd_copy(t.k),
               hv = fattn_test::float32_bhsd_copy(t.v);
  const std::int64_t rows = c.rows();
  ReferenceRows ref;
  ref.out.resize(static_cast<std::size_t>(rows * c.D));
  ref.baseline_out.resize(ref.out.size());
  ref.lse.resize(static_cast<std::size_t>(rows));
  ref.baseline_lse.resize(ref.lse.size());
  ref.checked.resize(ref.lse.size());
  Options ref_options = options_for(c, &mods, false);
  ref_options.scale = c.effective_scale();
#pragma omp parallel for schedule(dynamic, 16)
  for (std::int64_t r = 0; r < rows; ++r) {
    const auto [b, h, i] = row_index(c, r);
    if (!row_is_checked(c, i)) continue;
    const auto row = static_cast<std::size_t>(r);
    ref.checked[row] = 1;
    ref.lse[row] = fattn::reference_row(hq.view(), hk.view(), hv.view(), ref_options, b, h, i,
                                        ref.out.data() + r * c.D);
    std::vector<double> baseline;
    ref.baseline_lse[row] = baseline_row(c, mods, hq, hk, hv, b, h, i, baseline);
    std::copy(baseline.begin(), baseline.end(), ref.baseline_out.begin() + r * c.D);
  }
  // The lse tolerance grows by twice the pipeline's own lse error, as the output's does
  // (it matters for the TF32 mode, whose scores carry ~2^-11 relative error).
  ref.baseline_lse_err = baseline_lse_error(ref);
  return ref;
}

// ---- checks -------------------------------------------------------------------------------------

// Storage outside the views still holds the device poison (all of lse's when no lse was
// asked for).
inline bool check_poison(const Case& c, const CaseTensors& t) {
  const ::testing::AssertionResult out_kept = fattn_test::outside_view_untouched(t.out, Poison::device);
  EXPECT_TRUE(out_kept) << "out";
  const ::testing::AssertionResult lse_kept = c.with_lse
                                                  ? fattn_test::outside_view_untouched(t.lse, Poison::device)
                                                  : fattn_test::all_poison(t.lse, Poison::device);
  EXPECT_TRUE(lse_kept) << (c.with_lse ? "lse" : "lse, although no lse was asked for");
  return out_kept && lse_kept;
}

struct Outcome {
  double max_err = 0.0, tolerance = 0.0, baseline_err = 0.0, max_ref = 0.0;
  std::string worst;  // where max_err is
};

inline std::string out_element_name(int b, int h, int i, int d) {
  std::ostringstream s;
  s << "out(" << b << "," << h << "," << i << "," << d << ")";
  return s.str();
}

// One output element against the reference; false when the comparison cannot go on
// (an unwritten or non-finite element: every later number would only repeat it).
inline bool compare_out_element(const Case& c, const ReferenceRows& ref, std::int64_t r, int d,
                                float got, Outcome& outcome) {
  const auto [b, h, i] = row_index(c, r);
  if (!ref.checked[static_cast<std::size_t>(r)]) {  // not compared, but it must be written
    if (std::isnan(got)) ADD_FAILURE() << out_element_name(b, h, i, d) << " is NaN (unwritten?)";
    return !std::isnan(got);
  }
  const auto e = static_cast<std::size_t>(r * c.D + d);
  const double want = ref.out[e];
  if (std::isnan(want)) {
    EXPECT_TRUE(std::isnan(got)) << out_element_name(b, h, i, d) << " should be NaN, got " << got;
    return true;
  }
  if (std::isinf(want)) {
    EXPECT_EQ(got, want) << out_element_name(b, h, i, d);
    return true;
  }
  if (!std::isfinite(got)) {
    ADD_FAILURE() << out_element_name(b, h, i, d) << " = " << got << ", want " << want;
    return false;
  }
  const double err = std::fabs(got - want);
  outcome.max_ref = std::max(outcome.max_ref, std::fabs(want));
  outcome.baseline_err = std::max(outcome.baseline_err, std::fabs(ref.baseline_out[e] - want));
  if (err > outcome.max_err) {
    outcome.max_err = err;
    std::ostringstream w;
    w << out_element_name(b, h, i, d) << " = " << got << ", want " << want;
    outcome.worst = w.str();
  }
  return true;
}

inline double out_tolerance(const Case& c, double baseline_err, double max_ref) {
  const double scale_ref = std::max(1.0, max_ref);
  double tol = 0.0;
  if (c.kernel == Kernel::reference)
    tol = fattn_test::ulp_of(c.dtype) * scale_ref;
  else if (c.dtype == DType::float32)
    tol = kBaselineMultiple * baseline_err + kFloat32OutRelTol * scale_ref;
  else
    tol = kBaselineMultiple * baseline_err + fattn_test::ulp_of(c.dtype) * scale_ref;
  return tol + c.extra_tol;
}

// Every output element against the reference, the max error against the case's
// tolerance; nothing when an element stopped the comparison.
inline std::optional<Outcome> check_out(const Case& c, const Tensor& out, const ReferenceRows& ref) {
  Outcome outcome;
  for (std::int64_t r = 0; r < c.rows(); ++r) {
    const auto [b, h, i] = row_index(c, r);
    for (int d = 0; d < c.D; ++d)
      if (!compare_out_element(c, ref, r, d, out.get(b, h, i, d), outcome)) return std::nullopt;
  }
  outcome.tolerance = out_tolerance(c, outcome.baseline_err, outcome.max_ref);
  EXPECT_LE(outcome.max_err, outcome.tolerance)
      << "worst: " << outcome.worst << "; baseline error " << outcome.baseline_err << ", max|ref| "
      << outcome.max_ref;
  return outcome;
}

// Every checked row's logsumexp against the reference (when the case asks for one).
inline void check_lse(const Case& c, const Tensor& lse, const ReferenceRows& ref) {
  if (!c.with_lse) return;
  for (std::int64_t r = 0; r < c.rows(); ++r) {
    if (!ref.checked[static_cast<std::size_t>(r)]) continue;
    const auto [b, h, i] = row_index(c, r);
    const float got = lse.get(b, h, i);
    const double want = ref.lse[static_cast<std::size_t>(r)];
    const double scale_ref = std::max(1.0, std::fabs(want));
    const double tol = c.kernel == Kernel::reference
                           ? kReferenceLseRelTol * scale_ref
                           : kLseRelTol * scale_ref + kBaselineMultiple * ref.baseline_lse_err;
    if (std::isnan(want))
      EXPECT_TRUE(std::isnan(got)) << "lse(" << b << "," << h << "," << i << ") should be NaN, got " << got;
    else if (std::isinf(want))
      EXPECT_EQ(got, want) << "lse(" << b << "," << h << "," << i << ")";
    else
      EXPECT_LE(std::fabs(got - want), tol)
          << "lse(" << b << "," << h << "," << i << ") = " << got << ", want " << want;
  }
}

// ---- running a case ---------------------------------------------------------------------------

// Runs the case's kernel on its device tensors; false (with the failure recorded) when
// it threw or the kernel failed.
inline bool run_on_device(const Case& c, const CaseMods& mods, const DeviceCase& d) {
  try {
    fattn::cuda::forward_with(d.q.view, d.k.view, d.v.view, d.out.view, c.with_lse ? &d.lse.view : nullptr,
                              options_for(c, &mods, true), c.kernel, c.tile_rows, c.stages, c.blocks);
  } catch (const fattn::Error& e) {
    ADD_FAILURE() << "forward_with threw: " << e.what();
    return false;
  }
  const cudaError_t sync = cudaDeviceSynchronize();
  EXPECT_EQ(sync, cudaSuccess) << "kernel failed: " << cudaGetErrorString(sync);
  return sync == cudaSuccess;
}

// Runs one case on the GPU (through fattn::cuda::forward_with) and checks it.
// `prepare` may edit the host inputs (e.g. plant a NaN) before they are uploaded.
template <class Prepare>
Outcome run_case(const Case& c, Prepare&& prepare) {
  CaseTensors inputs = make_case_tensors(c);
  prepare(inputs.q, inputs.k, inputs.v);
  DeviceCase device = to_device(std::move(inputs));
  const CaseMods mods = make_case_mods(c);
  if (!device.ok() || !run_on_device(c, mods, device)) return {};
  device.download();
  if (!check_poison(c, device.host)) return {};
  const ReferenceRows ref = reference_rows(c, mods, device.host);
  const std::optional<Outcome> outcome = check_out(c, device.host.out, ref);
  if (!outcome) return {};
  check_lse(c, device.host.lse, ref);
  return *outcome;
}

inline Outcome run_case(const Case& c) {
  return run_case(c, [](Tensor&, Tensor&, Tensor&) {});
}

// ---- which kernels ------------------------------------------------------------------------

// Whether this build has a fused kernel for the case's head dim (reference and naive
// take any head dim).
inline bool compiled_for(const Case& c) {
  if (c.kernel == Kernel::reference || c.kernel == Kernel::naive) return true;
  if (fattn::cuda::is_wgmma(c.kernel)) {
    const std::vector<int> dims = fattn::cuda::hopper_head_dims(c.kernel);
    return !dims.empty() && c.D <= dims.back();
  }
  const std::vector<int> dims = fattn::cuda::supported_head_dims();
  return !dims.empty() && c.D <= dims.back() &&
         (c.tile_rows != 128 || c.D <= fattn::cuda::max_tall_head_dim());
}

// The (dtype, kernel, tile_rows) triples every grid runs: each tensor-core kernel at
// both tile heights (the test sizes alone would always choose 64 rows).
struct KernelCase {
  DType dtype;
  Kernel kernel;
  int tile_rows;
};
inline std::vector<KernelCase> all_kernels() {
  return {{DType::float32, Kernel::reference, 0},    {DType::float32, Kernel::naive, 0},
          {DType::float32, Kernel::fused_tf32x3, 64}, {DType::float32, Kernel::fused_tf32x3, 128},
          {DType::float32, Kernel::fused_tf32, 64},  {DType::float32, Kernel::fused_tf32, 128},
          {DType::float32, Kernel::fused_fma, 0},    {DType::float16, Kernel::reference, 0},
          {DType::float16, Kernel::naive, 0},        {DType::float16, Kernel::fused_mma, 64},
          {DType::float16, Kernel::fused_mma, 128},  {DType::bfloat16, Kernel::reference, 0},
          {DType::bfloat16, Kernel::naive, 0},       {DType::bfloat16, Kernel::fused_mma, 64},
          {DType::bfloat16, Kernel::fused_mma, 128}, {DType::float16, Kernel::fused_wgmma, 0},
          {DType::bfloat16, Kernel::fused_wgmma, 0}, {DType::float16, Kernel::fused_wgmma_pipelined, 0},
          {DType::bfloat16, Kernel::fused_wgmma_pipelined, 0}, {DType::float16, Kernel::fused_tma, 0},
          {DType::bfloat16, Kernel::fused_tma, 0}, {DType::float16, Kernel::fused_tma_persistent, 0},
          {DType::bfloat16, Kernel::fused_tma_persistent, 0}, {DType::float16, Kernel::fused_tma_pingpong, 0},
          {DType::bfloat16, Kernel::fused_tma_pingpong, 0}};
}

// Whether the environment variable FATTN_CUDA_SKIP_KERNELS (kernel names, comma-separated)
// names `kernel`: scripts/gpu-check.sh sets it for a kernel that hung in its smoke test, so
// that the other kernels' checks still run.
inline bool skipped_by_environment(Kernel kernel) {
  const char* list = std::getenv("FATTN_CUDA_SKIP_KERNELS");
  if (!list) return false;
  std::stringstream names(list);
  for (std::string name; std::getline(names, name, ',');)
    if (name == fattn::cuda::to_string(kernel)) return true;
  return false;
}

// Why the current device cannot run c's kernel ("" when it can): the wgmma and TMA kernels
// are sm_90a code and run on compute capability 9.0 only.
inline std::string why_not_here(const Case& c) {
  if (skipped_by_environment(c.kernel))
    return std::string("the ") + fattn::cuda::to_string(c.kernel) +
           " kernel is left out by FATTN_CUDA_SKIP_KERNELS";
  if (fattn::cuda::runs_on_current_device(c.kernel)) return "";
  return std::string("the ") + fattn::cuda::to_string(c.kernel) +
         " kernel does not run on this device (the wgmma and TMA kernels: compute capability "
         "9.0 and a build with them)";
}

// all_kernels() less the ones the current device cannot run, for tests that loop over
// kernels (call it inside a test: it asks the CUDA runtime).
inline std::vector<KernelCase> kernels_here() {
  std::vector<KernelCase> here;
  for (const KernelCase& k : all_kernels())
    if (fattn::cuda::runs_on_current_device(k.kernel) && !skipped_by_environment(k.kernel))
      here.push_back(k);
  return here;
}

}  // namespace fattn_cuda_test
