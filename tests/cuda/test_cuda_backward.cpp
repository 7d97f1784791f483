// fattn CUDA tests — the Hopper backward (src/cuda/backward_tma.cuh) against the float64
// backward on the host.
//
// How a case is checked:
//  * q, k, v and dout are fresh N(0,1) values rounded to the dtype (seeded from the case's
//    name); out and lse come from the float64 forward on the host (out rounded to the dtype,
//    lse to float32), as a training step hands them over.
//  * The reference: fattn's float64 backward (Impl::reference) on the rounded inputs, with the
//    exact out and lse.
//  * The tolerance per gradient: 2 × the error of the plain same-precision pipeline (float64
//    arithmetic, P and dS rounded to the dtype before their products, as FlashAttention and
//    cuDNN round them, the inputs the kernel gets, the gradients rounded once) + one ulp of
//    the dtype at max(1, max|ref|).
//  * dq, dk and dv start poisoned (every byte 0xFF, a NaN): every element must be written.
#include <cuda_runtime.h>
#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "cuda/backend.hpp"
#include "fattn/fattn.hpp"
#include "model/problem.hpp"
#include "util/cuda_device.hpp"
#include "util/seed.hpp"

namespace fattn_cuda_test {
namespace {

using fattn::Causal;
using fattn::DType;
using fattn::Options;

constexpr double kBaselineMultiple = 2.0;

struct BackwardCase {
  DType dtype = DType::bfloat16;
  int B = 1, Hq = 2, Hkv = 1, Sq = 65, Sk = 113, D = 64;
  Causal causal = Causal::none;
  int window_left = -1, window_right = -1;
  bool bshd = false;       // (B, S, H, D) memory: the heads' rows interleaved
  bool with_dlse = false;  // a gradient flows through lse too
  float q_scale = 1.0f;    // > 1: large logits
  double softcap = 0.0;
  bool alibi = false;      // slopes 2^(-8(h+1)/Hq)
  bool sinks = false;      // one N(0,1) logit per query head

  std::string name() const {
    std::ostringstream s;
    s << (dtype == DType::float16 ? "f16" : "bf16") << "_B" << B << "_H" << Hq << "x" << Hkv << "_Sq"
      << Sq << "_Sk" << Sk << "_D" << D << "_" << fattn::to_string(causal);
    if (window_left >= 0 || window_right >= 0)
      s << "_win" << (window_left < 0 ? "inf" : std::to_string(window_left)) << "_"
        << (window_right < 0 ? "inf" : std::to_string(window_right));
    if (bshd) s << "_bshd";
    if (with_dlse) s << "_dlse";
    if (q_scale != 1.0f) s << "_qx" << q_scale;
    if (softcap != 0.0) s << "_softcap" << softcap;
    if (alibi) s << "_alibi";
    if (sinks) s << "_sinks";
    return s.str();
  }
  Options options() const {
    Options o;
    o.causal = causal;
    o.window_left = window_left;
    o.window_right = window_right;
    o.softcap = softcap;
    return o;
  }
};
void PrintTo(const BackwardCase& c, std::ostream* os) { *os << c.name(); }

// Logical (B, H, S, D) values in double, and their place in the case's memory order.
struct Dense {
  int B, H, S, D;
  std::vector<double> x;
  double& at(int b, int h, int s, int d) { return x[((static_cast<std::size_t>(b) * H + h) * S + s) * D + d]; }
  double at(int b, int h, int s, int d) const {
    return x[((static_cast<std::size_t>(b) * H + h) * S + s) * D + d];
  }
  fattn::TensorView view() { return fattn::TensorView::bhsd(x.data(), B, H, S, D, DType::float64); }
};
Dense dense(int B, int H, int S, int D) {
  return {B, H, S, D, std::vector<double>(static_cast<std::size_t>(B) * H * S * D)};
}

double rounded(DType dtype, double x) {
  return fattn::from_16bit(fattn::to_16bit(static_cast<float>(x), dtype), dtype);
}

Dense random_dense(int B, int H, int S, int D, DType dtype, std::mt19937_64& engine, double scale = 1.0) {
  std::normal_distribution<double> normal(0.0, 1.0);
  Dense t = dense(B, H, S, D);
  for (double& v : t.x) v = rounded(dtype, scale * normal(engine));
  return t;
}

// Element offset of (b, h, s, d) in the case's memory order.
std::size_t offset(const BackwardCase& c, int H, int S, int b, int h, int s, int d) {
  if (c.bshd) return ((static_cast<std::size_t>(b) * S + s) * H + h) * c.D + d;
  return ((static_cast<std::size_t>(b) * H + h) * S + s) * c.D + d;
}

// A 16-bit tensor of the case's layout on the device (poisoned where `values` is null).
struct Device16 {
  DeviceBuffer buffer;
  fattn::TensorView view;
  int H = 0, S = 0;
};
Device16 upload16(const BackwardCase& c, const Dense* values, int H, int S) {
  const std::size_t n = static_cast<std::size_t>(c.B) * H * S * c.D;
  std::vector<std::uint16_t> host(n, 0xFFFF);
  if (values)
    for (int b = 0; b < c.B; ++b)
      for (int h = 0; h < H; ++h)
        for (int s = 0; s < S; ++s)
          for (int d = 0; d < c.D; ++d)
            host[offset(c, H, S, b, h, s, d)] = fattn::to_16bit(static_cast<float>(values->at(b, h, s, d)), c.dtype);
  Device16 t{DeviceBuffer(n * 2), {}, H, S};
  EXPECT_TRUE(cuda_succeeded(cudaMemcpy(t.buffer.get(), host.data(), n * 2, cudaMemcpyHostToDevice), "upload"));
  t.view = c.bshd ? fattn::TensorView::bshd(t.buffer.get(), c.B, S, H, c.D, c.dtype, fattn::Device::cuda)
                  : fattn::TensorView::bhsd(t.buffer.get(), c.B, H, S, c.D, c.dtype, fattn::Device::cuda);
  return t;
}
Dense download16(const BackwardCase& c, const Device16& t) {
  const std::size_t n = static_cast<std::size_t>(c.B) * t.H * t.S * c.D;
  std::vector<std::uint16_t> host(n);
  EXPECT_TRUE(cuda_succeeded(cudaMemcpy(host.data(), t.buffer.get(), n * 2, cudaMemcpyDeviceToHost), "download"));
  Dense r = dense(c.B, t.H, t.S, c.D);
  for (int b = 0; b < c.B; ++b)
    for (int h = 0; h < t.H; ++h)
      for (int s = 0; s < t.S; ++s)
        for (int d = 0; d < c.D; ++d) r.at(b, h, s, d) = fattn::from_16bit(host[offset(c, t.H, t.S, b, h, s, d)], c.dtype);
  return r;
}

struct CaseData {
  Dense q, k, v, dout, out;  // out exact (float64)
  std::vector<double> lse, dlse;  // (B, Hq, Sq)
  Dense dq, dk, dv;               // the float64 reference
  std::vector<double> slopes, sinks, dsinks;  // (Hq) each where the case has them (float32 values)
  // The variants' views over slopes and sinks (float64, for the host's float64 problems).
  fattn::TensorView slopes_view, sinks_view;
  Options options_of(const BackwardCase& c) {
    Options o = c.options();
    if (c.alibi) {
      slopes_view = fattn::TensorView{slopes.data(), 1, {c.Hq, 0, 0, 0}, {1, 0, 0, 0}, DType::float64};
      o.alibi_slopes = &slopes_view;
    }
    if (c.sinks) {
      sinks_view = fattn::TensorView{sinks.data(), 1, {c.Hq, 0, 0, 0}, {1, 0, 0, 0}, DType::float64};
      o.sinks = &sinks_view;
    }
    return o;
  }
};

CaseData make_case(const BackwardCase& c) {
  std::mt19937_64 engine(fattn_test::seed_for(c.name()));
  CaseData d{random_dense(c.B, c.Hq, c.Sq, c.D, c.dtype, engine, c.q_scale),
             random_dense(c.B, c.Hkv, c.Sk, c.D, c.dtype, engine),
             random_dense(c.B, c.Hkv, c.Sk, c.D, c.dtype, engine),
             random_dense(c.B, c.Hq, c.Sq, c.D, c.dtype, engine),
             dense(c.B, c.Hq, c.Sq, c.D),
             std::vector<double>(static_cast<std::size_t>(c.B) * c.Hq * c.Sq),
             std::vector<double>(c.with_dlse ? static_cast<std::size_t>(c.B) * c.Hq * c.Sq : 0),
             dense(c.B, c.Hq, c.Sq, c.D),
             dense(c.B, c.Hkv, c.Sk, c.D),
             dense(c.B, c.Hkv, c.Sk, c.D)};
  std::normal_distribution<double> normal(0.0, 1.0);
  for (double& x : d.dlse) x = static_cast<float>(normal(engine));
  if (c.alibi)
    for (int h = 0; h < c.Hq; ++h) d.slopes.push_back(std::exp2(-8.0 * (h + 1) / c.Hq));
  if (c.sinks)
    for (int h = 0; h < c.Hq; ++h) d.sinks.push_back(static_cast<float>(normal(engine)));
  d.dsinks.assign(d.sinks.size(), 0.0);
  Options o = d.options_of(c);
  o.impl = fattn::Impl::reference;
  const fattn::TensorView lse = fattn::TensorView::lse(d.lse.data(), DType::float64, c.B, c.Hq, c.Sq);
  fattn::attention_forward(d.q.view(), d.k.view(), d.v.view(), d.out.view(), &lse, o);
  // The forward's lse as the kernel gets it (float32): the reference's input too, so the two
  // differentiate the same function.
  for (double& x : d.lse) x = static_cast<float>(x);
  return d;
}

// The float64 reference gradients of a case's data.
void reference_gradients(const BackwardCase& c, CaseData& d) {
  Options o = d.options_of(c);
  o.impl = fattn::Impl::reference;
  fattn::TensorView dsinks{d.dsinks.data(), 1, {c.Hq, 0, 0, 0}, {1, 0, 0, 0}, DType::float64};
  const fattn::TensorView lse = fattn::TensorView::lse(d.lse.data(), DType::float64, c.B, c.Hq, c.Sq);
  const fattn::TensorView dlse = fattn::TensorView::lse(d.dlse.data(), DType::float64, c.B, c.Hq, c.Sq);
  fattn::attention_backward(d.q.view(), d.k.view(), d.v.view(), d.out.view(), d.dout.view(), lse,
                            c.with_dlse ? &dlse : nullptr, d.dq.view(), d.dk.view(), d.dv.view(), o,
                            c.sinks ? &dsinks : nullptr);
}

// The plain same-precision pipeline (header comment): out rounded, P and dS rounded to the
// dtype, float64 otherwise; the gradients rounded once.
struct Gradients {
  Dense dq, dk, dv;
  std::vector<double> dsinks;
};
Gradients pipeline(const BackwardCase& c, const CaseData& d) {
  // The band and the scale of the problem, from the model the kernels' band comes from.
  Dense q = d.q, k = d.k;
  const fattn::detail::Problem pr = fattn::detail::make_problem(q.view(), k.view(), k.view(), nullptr, nullptr, c.options());
  Gradients g{dense(c.B, c.Hq, c.Sq, c.D), dense(c.B, c.Hkv, c.Sk, c.D), dense(c.B, c.Hkv, c.Sk, c.D),
              std::vector<double>(d.sinks.size(), 0.0)};
  const int group = c.Hq / c.Hkv;
  std::vector<double> p(c.Sk), ds(c.Sk);
  for (int b = 0; b < c.B; ++b)
    for (int h = 0; h < c.Hq; ++h) {
      const int kh = h / group;
      for (int i = 0; i < c.Sq; ++i) {
        const std::size_t row = (static_cast<std::size_t>(b) * c.Hq + h) * c.Sq + i;
        double delta = 0.0;
        for (int e = 0; e < c.D; ++e) delta += rounded(c.dtype, d.out.at(b, h, i, e)) * d.dout.at(b, h, i, e);
        if (c.with_dlse) delta -= static_cast<float>(d.dlse[row]);
        if (c.sinks && std::isfinite(d.lse[row])) g.dsinks[h] -= std::exp(d.sinks[h] - d.lse[row]) * delta;
        for (int j = 0; j < c.Sk; ++j) {
          const std::int64_t diag = j - i;
          if (diag < pr.band_lo || diag > pr.band_hi) {
            p[j] = ds[j] = 0.0;
            continue;
          }
          double s = 0.0, dp = 0.0;
          for (int e = 0; e < c.D; ++e) {
            s += d.q.at(b, h, i, e) * d.k.at(b, kh, j, e);
            dp += d.dout.at(b, h, i, e) * d.v.at(b, kh, j, e);
          }
          double x = s * pr.scale, dfactor = 1.0;
          if (c.softcap != 0.0) {
            const double t = std::tanh(x / c.softcap);
            x = c.softcap * t;
            dfactor = 1.0 - t * t;
          }
          if (c.alibi) x -= d.slopes[h] * std::abs(i + c.Sk - c.Sq - j);
          const double prob = std::exp(x - d.lse[row]);
          p[j] = rounded(c.dtype, prob);
          ds[j] = rounded(c.dtype, prob * (dp - delta) * dfactor);
        }
        for (int j = 0; j < c.Sk; ++j)
          for (int e = 0; e < c.D; ++e) {
            g.dq.at(b, h, i, e) += ds[j] * d.k.at(b, kh, j, e) * pr.scale;
            g.dk.at(b, kh, j, e) += ds[j] * d.q.at(b, h, i, e) * pr.scale;
            g.dv.at(b, kh, j, e) += p[j] * d.dout.at(b, h, i, e);
          }
      }
    }
  for (Dense* t : {&g.dq, &g.dk, &g.dv})
    for (double& x : t->x) x = rounded(c.dtype, x);
  return g;
}

double max_abs(const Dense& t) {
  double m = 0.0;
  for (double x : t.x) m = std::max(m, std::abs(x));
  return m;
}
// The largest |got − ref|; infinite where got is not finite.
double max_error(const Dense& got, const Dense& ref) {
  double m = 0.0;
  for (std::size_t i = 0; i < got.x.size(); ++i)
    m = std::max(m, std::isfinite(got.x[i]) ? std::abs(got.x[i] - ref.x[i]) : INFINITY);
  return m;
}
double ulp(DType dtype) { return dtype == DType::float16 ? std::ldexp(1.0, -10) : std::ldexp(1.0, -7); }

void expect_within(const BackwardCase& c, const char* name, const Dense& got, const Dense& ref,
                   const Dense& baseline) {
  const double base = max_error(baseline, ref);
  const double tolerance = kBaselineMultiple * base + ulp(c.dtype) * std::max(1.0, max_abs(ref));
  const double err = max_error(got, ref);
  EXPECT_LE(err, tolerance) << name << " of " << c.name() << ": max error " << err
                            << " against the float64 reference; the same-precision pipeline's is "
                            << base;
}

// The case on the GPU: dq, dk, dv in the case's layout.
Gradients run_on_gpu(const BackwardCase& c, const CaseData& d) {
  Dense out16 = d.out;
  for (double& x : out16.x) x = rounded(c.dtype, x);
  Device16 q = upload16(c, &d.q, c.Hq, c.Sq), k = upload16(c, &d.k, c.Hkv, c.Sk),
           v = upload16(c, &d.v, c.Hkv, c.Sk), dout = upload16(c, &d.dout, c.Hq, c.Sq),
           out = upload16(c, &out16, c.Hq, c.Sq);
  Device16 dq = upload16(c, nullptr, c.Hq, c.Sq), dk = upload16(c, nullptr, c.Hkv, c.Sk),
           dv = upload16(c, nullptr, c.Hkv, c.Sk);
  auto upload_rows = [&](const std::vector<double>& rows, DeviceBuffer& buffer) {
    std::vector<float> f(rows.begin(), rows.end());
    buffer = DeviceBuffer(std::max<std::size_t>(f.size(), 1) * 4);
    EXPECT_TRUE(cuda_succeeded(cudaMemcpy(buffer.get(), f.data(), f.size() * 4, cudaMemcpyHostToDevice), "rows"));
    return fattn::TensorView::lse(reinterpret_cast<float*>(buffer.get()), c.B, c.Hq, c.Sq, fattn::Device::cuda);
  };
  DeviceBuffer lse_buffer, dlse_buffer;
  const fattn::TensorView lse = upload_rows(d.lse, lse_buffer);
  const fattn::TensorView dlse = c.with_dlse ? upload_rows(d.dlse, dlse_buffer) : fattn::TensorView{};
  // Slopes, sinks and dsinks: float32 (Hq) on the device.
  auto head_vector = [&](const std::vector<double>& values, DeviceBuffer& buffer) {
    std::vector<float> f(values.begin(), values.end());
    buffer = DeviceBuffer(std::max<std::size_t>(f.size(), 1) * 4);
    EXPECT_TRUE(cuda_succeeded(cudaMemcpy(buffer.get(), f.data(), f.size() * 4, cudaMemcpyHostToDevice), "heads"));
    return fattn::TensorView{buffer.get(), 1, {c.Hq, 0, 0, 0}, {1, 0, 0, 0}, DType::float32, fattn::Device::cuda};
  };
  DeviceBuffer slopes_buffer, sinks_buffer, dsinks_buffer;
  Options o = c.options();
  const fattn::TensorView slopes = head_vector(d.slopes, slopes_buffer), sinks = head_vector(d.sinks, sinks_buffer);
  const fattn::TensorView dsinks = head_vector(std::vector<double>(d.sinks.size(), NAN), dsinks_buffer);
  if (c.alibi) o.alibi_slopes = &slopes;
  if (c.sinks) o.sinks = &sinks;
  fattn::attention_backward(q.view, k.view, v.view, out.view, dout.view, lse, c.with_dlse ? &dlse : nullptr,
                            dq.view, dk.view, dv.view, o, c.sinks ? &dsinks : nullptr);
  EXPECT_TRUE(cuda_succeeded(cudaDeviceSynchronize(), "the backward"));
  Gradients g{download16(c, dq), download16(c, dk), download16(c, dv), {}};
  std::vector<float> ds(d.sinks.size());
  EXPECT_TRUE(cuda_succeeded(cudaMemcpy(ds.data(), dsinks_buffer.get(), ds.size() * 4, cudaMemcpyDeviceToHost), "dsinks"));
  g.dsinks.assign(ds.begin(), ds.end());
  return g;
}

class CudaBackward : public ::testing::TestWithParam<BackwardCase> {
 protected:
  void SetUp() override {
    FATTN_REQUIRE_GPU();
    const BackwardCase& c = GetParam();
    fattn::TensorView q = fattn::TensorView::bhsd(nullptr, c.B, c.Hq, c.Sq, c.D, c.dtype, fattn::Device::cuda);
    fattn::TensorView k = fattn::TensorView::bhsd(nullptr, c.B, c.Hkv, c.Sk, c.D, c.dtype, fattn::Device::cuda);
    if (const std::string why = fattn::cuda_backward_refusal(q, k, c.options()); !why.empty())
      GTEST_SKIP() << why;
  }
};

TEST_P(CudaBackward, MatchesFloat64Reference) {
  const BackwardCase& c = GetParam();
  CaseData d = make_case(c);
  reference_gradients(c, d);
  const Gradients baseline = pipeline(c, d);
  const Gradients got = run_on_gpu(c, d);
  expect_within(c, "dq", got.dq, d.dq, baseline.dq);
  expect_within(c, "dk", got.dk, d.dk, baseline.dk);
  expect_within(c, "dv", got.dv, d.dv, baseline.dv);
  for (std::size_t h = 0; h < d.dsinks.size(); ++h) {
    // float32 sums of B·Sq terms: the pipeline's error twice, and float32's at their size
    const double base = std::abs(baseline.dsinks[h] - d.dsinks[h]);
    const double bound = kBaselineMultiple * base + 1e-5 * c.B * c.Sq * std::max(1.0, std::abs(d.dsinks[h]));
    EXPECT_LE(std::abs(got.dsinks[h] - d.dsinks[h]), bound)
        << "dsinks[" << h << "] of " << c.name() << ": " << got.dsinks[h] << " against " << d.dsinks[h];
  }
}

// No atomics: two runs give the same bits (production-sized cases: many blocks, each ring
// wrapping many times).
class CudaBackwardDeterminism : public CudaBackward {};
TEST_P(CudaBackwardDeterminism, SameBitsTwice) {
  const BackwardCase& c = GetParam();
  const CaseData d = make_case(c);
  const Gradients a = run_on_gpu(c, d), b = run_on_gpu(c, d);
  EXPECT_EQ(a.dq.x, b.dq.x);
  EXPECT_EQ(a.dk.x, b.dk.x);
  EXPECT_EQ(a.dv.x, b.dv.x);
}

constexpr Causal kCausals[] = {Causal::none, Causal::top_left, Causal::bottom_right};
constexpr DType kDtypes[] = {DType::float16, DType::bfloat16};

// The compiled head dims over odd lengths, tile edges (64-row query tiles and 128-key blocks
// in the key blocks, 128-row blocks and 64-key tiles in the query blocks) and Sq != Sk.
std::vector<BackwardCase> grid_cases() {
  std::vector<BackwardCase> cases;
  for (DType dtype : kDtypes)
    for (int D : {64, 128})
      for (Causal causal : kCausals)
        for (auto [sq, sk] : {std::pair{1, 1}, {65, 113}, {113, 65}, {128, 128}, {200, 300}, {257, 129}, {1, 300}}) {
          BackwardCase c;
          c.dtype = dtype;
          c.D = D;
          c.causal = causal;
          c.Sq = sq;
          c.Sk = sk;
          cases.push_back(c);
        }
  return cases;
}

// Head dims below 128 run zero-filled on the next compiled one.
std::vector<BackwardCase> head_dim_cases() {
  std::vector<BackwardCase> cases;
  for (int D : {16, 32, 40, 80, 96, 112})
    for (Causal causal : {Causal::none, Causal::bottom_right}) {
      BackwardCase c;
      c.D = D;
      c.causal = causal;
      cases.push_back(c);
    }
  return cases;
}

// Windows (either side alone and both, with causal), GQA, layouts, dlse, large logits, and
// the production shapes: many key blocks and query tiles, rings wrapping many times.
std::vector<BackwardCase> variant_cases() {
  std::vector<BackwardCase> cases;
  for (DType dtype : kDtypes) {
    for (auto [wl, wr] : {std::pair{32, 0}, {16, 16}, {-1, 8}, {100, -1}, {0, 0}}) {
      BackwardCase c;
      c.dtype = dtype;
      c.D = 128;
      c.Sq = c.Sk = 300;
      c.window_left = wl;
      c.window_right = wr;
      cases.push_back(c);
    }
    for (auto [hq, hkv] : {std::pair{8, 2}, {4, 1}, {3, 3}})
      for (Causal causal : {Causal::none, Causal::top_left}) {
        BackwardCase c;
        c.dtype = dtype;
        c.D = 128;
        c.Hq = hq;
        c.Hkv = hkv;
        c.Sq = 200;
        c.Sk = 333;
        c.causal = causal;
        cases.push_back(c);
      }
    for (int mods = 1; mods < 8; ++mods) {  // softcap, ALiBi, sinks, alone and together
      BackwardCase c;
      c.dtype = dtype;
      c.D = 128;
      c.Hq = 4;
      c.Hkv = 2;
      c.Sq = 200;
      c.Sk = 257;
      c.causal = mods % 2 ? Causal::bottom_right : Causal::none;
      c.softcap = mods & 1 ? 5.0 : 0.0;
      c.alibi = (mods & 2) != 0;
      c.sinks = (mods & 4) != 0;
      c.q_scale = c.softcap != 0.0 ? 4.0f : 1.0f;  // softcap where it bends the scores
      cases.push_back(c);
    }
    BackwardCase strided;
    strided.dtype = dtype;
    strided.B = 2;
    strided.Hq = 4;
    strided.Hkv = 2;
    strided.bshd = true;
    strided.with_dlse = true;
    cases.push_back(strided);
    BackwardCase large = strided;
    large.bshd = false;
    large.with_dlse = false;
    large.q_scale = 8.0f;
    large.causal = Causal::bottom_right;
    cases.push_back(large);
    for (Causal causal : {Causal::none, Causal::top_left}) {
      BackwardCase c;
      c.dtype = dtype;
      c.D = 128;
      c.Sq = c.Sk = 1024;
      c.causal = causal;
      cases.push_back(c);
    }
  }
  return cases;
}

std::string case_name(const ::testing::TestParamInfo<BackwardCase>& info) { return info.param.name(); }

INSTANTIATE_TEST_SUITE_P(Grid, CudaBackward, ::testing::ValuesIn(grid_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(HeadDims, CudaBackward, ::testing::ValuesIn(head_dim_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(Variants, CudaBackward, ::testing::ValuesIn(variant_cases()), case_name);

std::vector<BackwardCase> determinism_cases() {
  std::vector<BackwardCase> cases;
  for (DType dtype : kDtypes)
    for (Causal causal : {Causal::none, Causal::top_left}) {
      BackwardCase c;
      c.dtype = dtype;
      c.Hq = 4;
      c.Hkv = 2;
      c.Sq = c.Sk = 1024;
      c.D = 128;
      c.causal = causal;
      cases.push_back(c);
    }
  return cases;
}
INSTANTIATE_TEST_SUITE_P(Large, CudaBackwardDeterminism, ::testing::ValuesIn(determinism_cases()), case_name);

// ---- without a GPU ----------------------------------------------------------------------------

// The harness itself: the CPU's 16-bit backward (float32 arithmetic) is within the tolerance
// the GPU is held to, and a gradient off by a few ulps of its largest value is not.
TEST(CudaBackwardHarness, HoldsTheCpuBackwardAndCatchesAWrongOne) {
  BackwardCase gqa;  // GQA 4:1, causal, Sq != Sk, the 128 head dim
  gqa.Hq = 4;
  gqa.Sq = 200;
  gqa.Sk = 333;
  gqa.D = 128;
  gqa.causal = Causal::top_left;
  BackwardCase window = gqa;  // float16, a window, bottom-right tiles
  window.dtype = DType::float16;
  window.Hq = 2;
  window.Sq = 257;
  window.Sk = 129;
  window.causal = Causal::bottom_right;
  window.window_left = 32;
  BackwardCase mods = gqa;  // softcap, ALiBi and sinks together
  mods.softcap = 5.0;
  mods.alibi = mods.sinks = true;
  mods.q_scale = 4.0f;
  for (const BackwardCase& c : {gqa, window, mods}) {
    CaseData d = make_case(c);
    reference_gradients(c, d);
    const Gradients baseline = pipeline(c, d);
    std::vector<std::uint16_t> q16, k16, v16, o16, do16, dq16, dk16, dv16;
    auto to16 = [&](const Dense& t, std::vector<std::uint16_t>& bits) {
      bits.resize(t.x.size());
      for (std::size_t i = 0; i < t.x.size(); ++i) bits[i] = fattn::to_16bit(static_cast<float>(t.x[i]), c.dtype);
      return fattn::TensorView::bhsd(bits.data(), t.B, t.H, t.S, t.D, c.dtype);
    };
    Dense dq = dense(c.B, c.Hq, c.Sq, c.D), dk = dense(c.B, c.Hkv, c.Sk, c.D), dv = dk;
    std::vector<float> lse(d.lse.begin(), d.lse.end());
    const fattn::TensorView dqv = to16(dq, dq16), dkv = to16(dk, dk16), dvv = to16(dv, dv16);
    std::vector<float> slopes(d.slopes.begin(), d.slopes.end()), sinks(d.sinks.begin(), d.sinks.end()),
        dsinks(d.sinks.size());
    auto heads = [&](std::vector<float>& v) {
      return fattn::TensorView{v.data(), 1, {c.Hq, 0, 0, 0}, {1, 0, 0, 0}, DType::float32};
    };
    const fattn::TensorView slopes_view = heads(slopes), sinks_view = heads(sinks), dsinks_view = heads(dsinks);
    Options o = c.options();
    if (c.alibi) o.alibi_slopes = &slopes_view;
    if (c.sinks) o.sinks = &sinks_view;
    fattn::attention_backward(to16(d.q, q16), to16(d.k, k16), to16(d.v, v16), to16(d.out, o16),
                              to16(d.dout, do16), fattn::TensorView::lse(lse.data(), c.B, c.Hq, c.Sq),
                              nullptr, dqv, dkv, dvv, o, c.sinks ? &dsinks_view : nullptr);
    for (std::size_t i = 0; i < dq.x.size(); ++i) dq.x[i] = fattn::from_16bit(dq16[i], c.dtype);
    for (std::size_t i = 0; i < dk.x.size(); ++i) dk.x[i] = fattn::from_16bit(dk16[i], c.dtype);
    for (std::size_t i = 0; i < dv.x.size(); ++i) dv.x[i] = fattn::from_16bit(dv16[i], c.dtype);
    expect_within(c, "dq (CPU)", dq, d.dq, baseline.dq);
    expect_within(c, "dk (CPU)", dk, d.dk, baseline.dk);
    expect_within(c, "dv (CPU)", dv, d.dv, baseline.dv);
    Dense wrong = dk;
    wrong.x[wrong.x.size() / 2] += 4 * ulp(c.dtype) * std::max(1.0, max_abs(d.dk)) + 4 * max_error(baseline.dk, d.dk);
    ::testing::TestPartResultArray failures;
    {
      ::testing::ScopedFakeTestPartResultReporter reporter(
          ::testing::ScopedFakeTestPartResultReporter::INTERCEPT_ONLY_CURRENT_THREAD, &failures);
      expect_within(c, "dk (perturbed)", wrong, d.dk, baseline.dk);
    }
    EXPECT_EQ(failures.size(), 1) << "a perturbed dk passed the tolerance of " << c.name();
  }
}

// What the Hopper backward refuses, said before any device is asked.
TEST(CudaBackwardRefusal, NamesWhatItDoesNotTake) {
  if (fattn::cuda_backward_head_dims().empty()) GTEST_SKIP() << "this build has no Hopper backward";
  auto view = [](DType dtype, int D) {
    return fattn::TensorView::bhsd(nullptr, 1, 2, 64, D, dtype, fattn::Device::cuda);
  };
  EXPECT_NE(fattn::cuda_backward_refusal(view(DType::float32, 64), view(DType::float32, 64)).find("float16 or bfloat16"),
            std::string::npos);
  EXPECT_NE(fattn::cuda_backward_refusal(view(DType::bfloat16, 256), view(DType::bfloat16, 256)).find("up to 128"),
            std::string::npos);
  Options masked;
  const fattn::TensorView mask = fattn::TensorView::bhsd(nullptr, 1, 1, 64, 64, DType::boolean, fattn::Device::cuda);
  masked.attn_mask = &mask;
  EXPECT_NE(fattn::cuda_backward_refusal(view(DType::float16, 64), view(DType::float16, 64), masked).find("attn_mask"),
            std::string::npos);
}

}  // namespace
}  // namespace fattn_cuda_test
