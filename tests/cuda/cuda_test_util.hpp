// fattn CUDA tests — helpers: device buffers, strided tensors with NaN padding, the
// float64 host reference, the plain same-precision pipeline, and one function that
// runs and checks a whole case.
//
// How a case is checked:
//  * Inputs are fresh N(0,1) values rounded to the dtype, seeded from the case name.
//    Storage around the view (row, head, batch gaps of the padded layouts) is NaN:
//    a kernel that reads outside its view turns outputs into NaN.
//  * out and lse are poisoned (all bytes 0xFF: a NaN in every dtype) before the run;
//    every view element must be written, and every byte outside the view must still
//    be poison afterwards.
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

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "cuda/backend.hpp"
#include "fattn/fattn.hpp"

namespace fattn_cuda_test {

using fattn::Causal;
using fattn::DType;
using fattn::Options;
using fattn::TensorView;
using fattn::cuda::Kernel;

#define CUDA_OK(expr)                                                                \
  do {                                                                               \
    const cudaError_t fattn_status_ = (expr);                                        \
    ASSERT_EQ(fattn_status_, cudaSuccess) << #expr << ": " << cudaGetErrorString(fattn_status_); \
  } while (0)

// Skips the current test unless a CUDA device of compute capability >= 8.0 is present.
#define FATTN_REQUIRE_GPU()                                             \
  do {                                                                  \
    const std::string fattn_why_ = ::fattn_cuda_test::why_no_gpu();     \
    if (!fattn_why_.empty()) GTEST_SKIP() << fattn_why_;                \
  } while (0)

inline std::string why_no_gpu() {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return std::string("no CUDA device: cudaGetDeviceCount says ") + cudaGetErrorString(e) +
           " (the CUDA tests need a GPU)";
  }
  if (count == 0) return "no CUDA device: cudaGetDeviceCount found 0 (the CUDA tests need a GPU)";
  int major = 0;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0);
  if (major < 8) return "the CUDA kernels need compute capability 8.0+, device 0 is older";
  return "";
}

// ---- element conversions (the CUDA headers' host functions: round to nearest even) ---
inline float to_float(DType t, const std::uint8_t* p) {
  switch (t) {
    case DType::float32: {
      float x;
      std::memcpy(&x, p, 4);
      return x;
    }
    case DType::float16: {
      __half h;
      std::memcpy(&h, p, 2);
      return __half2float(h);
    }
    case DType::bfloat16: {
      __nv_bfloat16 h;
      std::memcpy(&h, p, 2);
      return __bfloat162float(h);
    }
  }
  return 0.0f;
}
inline void from_float(DType t, float x, std::uint8_t* p) {
  switch (t) {
    case DType::float32: std::memcpy(p, &x, 4); return;
    case DType::float16: {
      const __half h = __float2half_rn(x);
      std::memcpy(p, &h, 2);
      return;
    }
    case DType::bfloat16: {
      const __nv_bfloat16 h = __float2bfloat16_rn(x);
      std::memcpy(p, &h, 2);
      return;
    }
  }
}
inline float round_to(DType t, float x) {
  std::uint8_t b[4];
  from_float(t, x, b);
  return to_float(t, b);
}
inline double ulp_of(DType t) {
  return t == DType::float32 ? std::ldexp(1.0, -23) : t == DType::float16 ? std::ldexp(1.0, -10)
                                                                           : std::ldexp(1.0, -7);
}
inline const char* short_name(DType t) {
  return t == DType::float32 ? "f32" : t == DType::float16 ? "f16" : "bf16";
}

// ---- device memory -------------------------------------------------------------------
class DeviceBuffer {
 public:
  explicit DeviceBuffer(std::size_t bytes) : bytes_(bytes) {
    if (cudaMalloc(&ptr_, bytes) != cudaSuccess) {
      cudaGetLastError();
      ptr_ = nullptr;
    }
  }
  ~DeviceBuffer() {
    if (ptr_) cudaFree(ptr_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  std::uint8_t* get() const { return static_cast<std::uint8_t*>(ptr_); }
  std::size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  std::size_t bytes_;
};

// ---- strided tensors with padding ----------------------------------------------------
enum class Layout {
  bhsd,        // contiguous (B, H, S, D)
  bshd,        // contiguous (B, S, H, D)
  padded,      // (B, H, S, D) with NaN gaps after every row, head and batch; 16-byte aligned
  misaligned,  // gaps of odd sizes and a view starting 1 element into the buffer
};
inline const char* to_string(Layout l) {
  switch (l) {
    case Layout::bhsd: return "bhsd";
    case Layout::bshd: return "bshd";
    case Layout::padded: return "padded";
    case Layout::misaligned: return "misaligned";
  }
  return "?";
}

// A rank-4 (or rank-3 for lse) tensor: host storage mirroring one device buffer.
struct Tensor {
  DType dtype = DType::float32;
  int rank = 4;
  std::array<std::int64_t, 4> sizes{}, strides{};
  std::int64_t offset = 0;             // elements from the buffer start to element 0
  std::vector<std::uint8_t> storage;   // element_size bytes per element
  std::vector<char> in_view;           // per storage element

  int esize() const { return fattn::element_size(dtype); }
  std::int64_t index(std::int64_t b, std::int64_t h, std::int64_t s, std::int64_t d = 0) const {
    return offset + b * strides[0] + h * strides[1] + s * strides[2] + d * strides[3];
  }
  float get(std::int64_t b, std::int64_t h, std::int64_t s, std::int64_t d = 0) const {
    return to_float(dtype, storage.data() + index(b, h, s, d) * esize());
  }
  void set(std::int64_t b, std::int64_t h, std::int64_t s, std::int64_t d, float x) {
    from_float(dtype, x, storage.data() + index(b, h, s, d) * esize());
  }
  TensorView view(std::uint8_t* device_base) const {
    TensorView t;
    t.data = device_base + offset * esize();
    t.rank = rank;
    t.sizes = sizes;
    t.strides = strides;
    t.dtype = dtype;
    t.device = fattn::Device::cuda;
    return t;
  }
};

inline Tensor make_tensor(DType dtype, Layout layout, std::int64_t B, std::int64_t H,
                          std::int64_t S, std::int64_t D) {
  Tensor t;
  t.dtype = dtype;
  t.sizes = {B, H, S, D};
  std::int64_t total = 0;
  switch (layout) {
    case Layout::bhsd:
      t.strides = {H * S * D, S * D, D, 1};
      total = B * H * S * D;
      break;
    case Layout::bshd:
      t.strides = {S * H * D, D, H * D, 1};
      total = B * H * S * D;
      break;
    case Layout::padded: {
      const std::int64_t row = D + 8, head = S * row + 8, batch = H * head + 8;
      t.strides = {batch, head, row, 1};
      t.offset = 8;
      total = t.offset + B * batch + 8;
      break;
    }
    case Layout::misaligned: {
      const std::int64_t row = D + 3, head = S * row + 1, batch = H * head + 5;
      t.strides = {batch, head, row, 1};
      t.offset = 1;
      total = t.offset + B * batch + 3;
      break;
    }
  }
  t.storage.assign(static_cast<std::size_t>(total * t.esize()), 0xFF);
  t.in_view.assign(static_cast<std::size_t>(total), 0);
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < H; ++h)
      for (std::int64_t s = 0; s < S; ++s)
        for (std::int64_t d = 0; d < D; ++d) t.in_view[static_cast<std::size_t>(t.index(b, h, s, d))] = 1;
  return t;
}

// (B, H, S) float32 logsumexp; padded layouts leave gaps.
inline Tensor make_lse(Layout layout, std::int64_t B, std::int64_t H, std::int64_t S) {
  Tensor t;
  t.rank = 3;
  t.sizes = {B, H, S, 0};
  const bool gaps = layout == Layout::padded || layout == Layout::misaligned;
  const std::int64_t head = gaps ? S + 3 : S, batch = gaps ? H * head + 1 : H * S;
  t.strides = {batch, head, 1, 0};
  t.offset = gaps ? 2 : 0;
  const std::int64_t total = t.offset + B * batch + (gaps ? 2 : 0);
  t.storage.assign(static_cast<std::size_t>(total * 4), 0xFF);
  t.in_view.assign(static_cast<std::size_t>(total), 0);
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < H; ++h)
      for (std::int64_t s = 0; s < S; ++s) t.in_view[static_cast<std::size_t>(t.index(b, h, s))] = 1;
  return t;
}

// Fills the view with N(0,1) values rounded to the dtype; the padding becomes a NaN.
inline void fill_random(Tensor& t, std::mt19937_64& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const std::int64_t n = static_cast<std::int64_t>(t.in_view.size());
  for (std::int64_t e = 0; e < n; ++e) {
    const float x = t.in_view[static_cast<std::size_t>(e)] ? normal(rng)
                                                           : std::numeric_limits<float>::quiet_NaN();
    from_float(t.dtype, x, t.storage.data() + e * t.esize());
  }
}

// ---- one case ---------------------------------------------------------------------------
struct Case {
  DType dtype = DType::float32;
  Kernel kernel = Kernel::automatic;
  int tile_rows = 0;  // fused tensor-core kernels: 0 (chosen per problem), 64 or 128
  int B = 1, Hq = 2, Hkv = 1, Sq = 65, Sk = 65, D = 64;
  Causal causal = Causal::none;
  Layout layout = Layout::bhsd;
  bool with_lse = true;
  double scale = std::numeric_limits<double>::quiet_NaN();  // NaN: the default
  int row_step = 1;  // compare rows i % row_step == 0 and the last 3 (long cases)
  double extra_tol = 0.0;  // added to the out tolerance (huge-logit cases)

  std::string name() const {
    std::ostringstream s;
    s << short_name(dtype) << "_" << fattn::cuda::to_string(kernel);
    if (tile_rows) s << "_r" << tile_rows;
    s << "_S" << Sq << "x" << Sk
      << "_D" << D << "_H" << Hq << "x" << Hkv << "_B" << B << "_" << fattn::to_string(causal)
      << "_" << to_string(layout);
    if (!with_lse) s << "_nolse";
    if (!std::isnan(scale)) {
      const long long milli = std::llround(scale * 1000.0);
      s << "_scale" << (milli < 0 ? "m" : "") << std::llabs(milli) << "milli";
    }
    return s.str();
  }
};

inline std::uint64_t seed_of(const std::string& name) {
  std::uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (char c : name) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  if (const char* env = std::getenv("FATTN_TEST_SEED")) h ^= std::strtoull(env, nullptr, 10);
  return h;
}

// A contiguous float32 CPU copy of a view (exact), for fattn::reference_row.
struct HostCopy {
  std::vector<float> data;
  TensorView view;
};
inline HostCopy host_copy(const Tensor& t) {
  HostCopy c;
  const auto [B, H, S, D] = t.sizes;
  c.data.resize(static_cast<std::size_t>(B * H * S * D));
  std::size_t e = 0;
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < H; ++h)
      for (std::int64_t s = 0; s < S; ++s)
        for (std::int64_t d = 0; d < D; ++d) c.data[e++] = t.get(b, h, s, d);
  c.view = TensorView::bhsd(c.data.data(), B, H, S, D);
  return c;
}

// x rounded to tf32 as cvt.rna.tf32.f32 does: to nearest, ties away from zero, on the
// 13 low mantissa bits (finite inputs; the tests draw N(0,1) values).
inline float round_tf32(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, 4);
  u = (u + 0x1000u) & ~0x1fffu;
  std::memcpy(&x, &u, 4);
  return x;
}

// The plain same-precision pipeline for one row (see the header comment).
// Returns the pipeline's logsumexp of the row (-inf for a row that sees no key).
inline double baseline_row(const Case& c, const HostCopy& q, const HostCopy& k, const HostCopy& v,
                           double scale, int b, int h, int i, std::vector<double>& out) {
  const int hk = h / (c.Hq / c.Hkv);
  const std::int64_t offset = c.causal == Causal::bottom_right ? c.Sk - c.Sq : 0;
  int visible = c.Sk;
  if (c.causal != Causal::none)
    visible = static_cast<int>(std::clamp<std::int64_t>(i + offset + 1, 0, c.Sk));
  out.assign(static_cast<std::size_t>(c.D), 0.0);
  if (visible == 0) return -std::numeric_limits<double>::infinity();
  const float* qr = q.data.data() + ((static_cast<std::int64_t>(b) * c.Hq + h) * c.Sq + i) * c.D;
  const float* kb = k.data.data() + (static_cast<std::int64_t>(b) * c.Hkv + hk) * c.Sk * c.D;
  const float* vb = v.data.data() + (static_cast<std::int64_t>(b) * c.Hkv + hk) * c.Sk * c.D;
  const bool tf32 = c.kernel == Kernel::fused_tf32;
  auto operand = [tf32](float x) { return tf32 ? round_tf32(x) : x; };
  std::vector<float> s(static_cast<std::size_t>(visible));
  float m = -std::numeric_limits<float>::infinity();
  for (int j = 0; j < visible; ++j) {
    float dot = 0.0f;
    for (int d = 0; d < c.D; ++d) dot += operand(qr[d]) * operand(kb[j * c.D + d]);
    s[static_cast<std::size_t>(j)] = dot * static_cast<float>(scale);
    m = std::max(m, s[static_cast<std::size_t>(j)]);
  }
  float l = 0.0f;
  for (float& x : s) l += (x = std::exp(x - m));
  std::vector<float> o(static_cast<std::size_t>(c.D), 0.0f);
  for (int j = 0; j < visible; ++j) {
    const float pj = operand(round_to(c.dtype, s[static_cast<std::size_t>(j)] / l));
    for (int d = 0; d < c.D; ++d) o[static_cast<std::size_t>(d)] += pj * vb[j * c.D + d];
  }
  for (int d = 0; d < c.D; ++d)
    out[static_cast<std::size_t>(d)] = round_to(c.dtype, o[static_cast<std::size_t>(d)]);
  return static_cast<double>(m) + std::log(static_cast<double>(l));
}

struct Outcome {
  double max_err = 0.0, tolerance = 0.0, baseline_err = 0.0, max_ref = 0.0;
};

// Runs one case on the GPU (through fattn::cuda::forward_with) and checks it.
// `prepare` may edit the host inputs (e.g. plant a NaN) before they are uploaded.
template <class Prepare>
Outcome run_case(const Case& c, Prepare&& prepare) {
  Outcome result;
  std::mt19937_64 rng(seed_of(c.name()));
  Tensor q = make_tensor(c.dtype, c.layout, c.B, c.Hq, c.Sq, c.D);
  Tensor k = make_tensor(c.dtype, c.layout, c.B, c.Hkv, c.Sk, c.D);
  Tensor v = make_tensor(c.dtype, c.layout, c.B, c.Hkv, c.Sk, c.D);
  Tensor out = make_tensor(c.dtype, c.layout, c.B, c.Hq, c.Sq, c.D);
  Tensor lse = make_lse(c.layout, c.B, c.Hq, c.Sq);
  fill_random(q, rng);
  fill_random(k, rng);
  fill_random(v, rng);
  prepare(q, k, v);

  DeviceBuffer dq(q.storage.size()), dk(k.storage.size()), dv(v.storage.size());
  DeviceBuffer dout(out.storage.size()), dlse(lse.storage.size());
  EXPECT_TRUE(dq.get() && dk.get() && dv.get() && dout.get() && dlse.get()) << "cudaMalloc failed";
  if (!(dq.get() && dk.get() && dv.get() && dout.get() && dlse.get())) return result;
  EXPECT_EQ(cudaMemcpy(dq.get(), q.storage.data(), q.storage.size(), cudaMemcpyHostToDevice), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(dk.get(), k.storage.data(), k.storage.size(), cudaMemcpyHostToDevice), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(dv.get(), v.storage.data(), v.storage.size(), cudaMemcpyHostToDevice), cudaSuccess);
  EXPECT_EQ(cudaMemset(dout.get(), 0xFF, dout.bytes()), cudaSuccess);  // poison
  EXPECT_EQ(cudaMemset(dlse.get(), 0xFF, dlse.bytes()), cudaSuccess);

  Options options;
  options.causal = c.causal;
  if (!std::isnan(c.scale)) options.scale = c.scale;
  const TensorView qv = q.view(dq.get()), kv = k.view(dk.get()), vv = v.view(dv.get());
  const TensorView ov = out.view(dout.get()), lv = lse.view(dlse.get());
  try {
    fattn::cuda::forward_with(qv, kv, vv, ov, c.with_lse ? &lv : nullptr, options, c.kernel,
                              c.tile_rows);
  } catch (const fattn::Error& e) {
    ADD_FAILURE() << "forward_with threw: " << e.what();
    return result;
  }
  const cudaError_t sync = cudaDeviceSynchronize();
  EXPECT_EQ(sync, cudaSuccess) << "kernel failed: " << cudaGetErrorString(sync);
  if (sync != cudaSuccess) return result;
  EXPECT_EQ(cudaMemcpy(out.storage.data(), dout.get(), out.storage.size(), cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(lse.storage.data(), dlse.get(), lse.storage.size(), cudaMemcpyDeviceToHost), cudaSuccess);

  // Nothing outside the views may change.
  for (std::size_t e = 0; e < out.in_view.size(); ++e)
    if (!out.in_view[e]) {
      for (int byte = 0; byte < out.esize(); ++byte)
        if (out.storage[e * out.esize() + byte] != 0xFF) {
          ADD_FAILURE() << "out storage element " << e << " outside the view was written";
          return result;
        }
    }
  for (std::size_t e = 0; e < lse.in_view.size(); ++e)
    if (!(lse.in_view[e] && c.with_lse))
      for (int byte = 0; byte < 4; ++byte)
        if (lse.storage[e * 4 + byte] != 0xFF) {
          ADD_FAILURE() << "lse storage element " << e << (c.with_lse ? " outside the view" : "")
                        << " was written" << (c.with_lse ? "" : " although no lse was asked for");
          return result;
        }

  // Reference and baseline, row by row.
  const HostCopy hq = host_copy(q), hk = host_copy(k), hv = host_copy(v);
  const double scale = std::isnan(c.scale) ? 1.0 / std::sqrt(static_cast<double>(c.D)) : c.scale;
  const std::int64_t rows = static_cast<std::int64_t>(c.B) * c.Hq * c.Sq;
  std::vector<double> ref(static_cast<std::size_t>(rows * c.D)), base(ref.size()),
      ref_lse(static_cast<std::size_t>(rows)), base_lse(static_cast<std::size_t>(rows));
  std::vector<char> checked(static_cast<std::size_t>(rows));
  Options ref_options;
  ref_options.causal = c.causal;
  ref_options.scale = scale;
#pragma omp parallel for schedule(dynamic, 16)
  for (std::int64_t r = 0; r < rows; ++r) {
    const int i = static_cast<int>(r % c.Sq), bh = static_cast<int>(r / c.Sq);
    const int b = bh / c.Hq, h = bh % c.Hq;
    if (i % c.row_step != 0 && i < c.Sq - 3) continue;
    checked[static_cast<std::size_t>(r)] = 1;
    ref_lse[static_cast<std::size_t>(r)] =
        fattn::reference_row(hq.view, hk.view, hv.view, ref_options, b, h, i,
                             ref.data() + r * c.D);
    std::vector<double> row;
    base_lse[static_cast<std::size_t>(r)] = baseline_row(c, hq, hk, hv, scale, b, h, i, row);
    std::copy(row.begin(), row.end(), base.begin() + r * c.D);
  }
  // The lse tolerance grows by twice the pipeline's own lse error, as the output's does
  // (it matters for the TF32 mode, whose scores carry ~2^-11 relative error).
  double base_lse_err = 0.0;
  for (std::int64_t r = 0; r < rows; ++r) {
    const double want = ref_lse[static_cast<std::size_t>(r)];
    if (checked[static_cast<std::size_t>(r)] && std::isfinite(want))
      base_lse_err = std::max(base_lse_err, std::fabs(base_lse[static_cast<std::size_t>(r)] - want));
  }

  double max_err = 0.0, max_ref = 0.0, base_err = 0.0;
  std::string worst;
  for (std::int64_t r = 0; r < rows; ++r) {
    const int i = static_cast<int>(r % c.Sq), bh = static_cast<int>(r / c.Sq);
    const int b = bh / c.Hq, h = bh % c.Hq;
    for (int d = 0; d < c.D; ++d) {
      const float got = out.get(b, h, i, d);
      if (!checked[static_cast<std::size_t>(r)]) {
        if (std::isnan(got)) {
          ADD_FAILURE() << "out(" << b << "," << h << "," << i << "," << d << ") is NaN (unwritten?)";
          return result;
        }
        continue;
      }
      const double want = ref[static_cast<std::size_t>(r * c.D + d)];
      if (std::isnan(want)) {
        EXPECT_TRUE(std::isnan(got)) << "out(" << b << "," << h << "," << i << "," << d
                                     << ") should be NaN, got " << got;
        continue;
      }
      if (std::isinf(want)) {
        EXPECT_EQ(got, want) << "out(" << b << "," << h << "," << i << "," << d << ")";
        continue;
      }
      if (!std::isfinite(got)) {
        ADD_FAILURE() << "out(" << b << "," << h << "," << i << "," << d << ") = " << got
                      << ", want " << want;
        return result;
      }
      const double err = std::fabs(got - want);
      max_ref = std::max(max_ref, std::fabs(want));
      base_err = std::max(base_err, std::fabs(base[static_cast<std::size_t>(r * c.D + d)] - want));
      if (err > max_err) {
        max_err = err;
        std::ostringstream w;
        w << "out(" << b << "," << h << "," << i << "," << d << ") = " << got << ", want " << want;
        worst = w.str();
      }
    }
    if (c.with_lse && checked[static_cast<std::size_t>(r)]) {
      const float got = lse.get(b, h, i);
      const double want = ref_lse[static_cast<std::size_t>(r)];
      const double tol = c.kernel == Kernel::reference
                             ? 1e-6 * std::max(1.0, std::fabs(want))
                             : 5e-5 * std::max(1.0, std::fabs(want)) + 2.0 * base_lse_err;
      if (std::isnan(want))
        EXPECT_TRUE(std::isnan(got)) << "lse(" << b << "," << h << "," << i << ") should be NaN, got " << got;
      else if (std::isinf(want))
        EXPECT_EQ(got, want) << "lse(" << b << "," << h << "," << i << ")";
      else
        EXPECT_LE(std::fabs(got - want), tol)
            << "lse(" << b << "," << h << "," << i << ") = " << got << ", want " << want;
    }
  }
  const double scale_ref = std::max(1.0, max_ref);
  double tol = 0.0;
  if (c.kernel == Kernel::reference)
    tol = ulp_of(c.dtype) * scale_ref;
  else if (c.dtype == DType::float32)
    tol = 2.0 * base_err + 1e-5 * scale_ref;
  else
    tol = 2.0 * base_err + ulp_of(c.dtype) * scale_ref;
  tol += c.extra_tol;
  EXPECT_LE(max_err, tol) << "worst: " << worst << "; baseline error " << base_err
                          << ", max|ref| " << max_ref;
  result.max_err = max_err;
  result.tolerance = tol;
  result.baseline_err = base_err;
  result.max_ref = max_ref;
  return result;
}

inline Outcome run_case(const Case& c) {
  return run_case(c, [](Tensor&, Tensor&, Tensor&) {});
}

// Whether this build has a fused kernel for the case's head dim (reference and naive
// take any head dim).
inline bool compiled_for(const Case& c) {
  if (c.kernel == Kernel::reference || c.kernel == Kernel::naive) return true;
  if (c.kernel == Kernel::fused_wgmma || c.kernel == Kernel::fused_wgmma_pipelined) {
    const std::vector<int> dims = fattn::cuda::wgmma_head_dims();
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
          {DType::bfloat16, Kernel::fused_wgmma_pipelined, 0}};
}

// Why the current device cannot run c's kernel ("" when it can): the wgmma kernels are
// sm_90a code and run on compute capability 9.0 only.
inline std::string why_not_here(const Case& c) {
  if (fattn::cuda::runs_on_current_device(c.kernel)) return "";
  return std::string("the ") + fattn::cuda::to_string(c.kernel) +
         " kernel does not run on this device (the wgmma kernels: compute capability 9.0 and "
         "a build with them)";
}

// all_kernels() less the ones the current device cannot run, for tests that loop over
// kernels (call it inside a test: it asks the CUDA runtime).
inline std::vector<KernelCase> kernels_here() {
  std::vector<KernelCase> here;
  for (const KernelCase& k : all_kernels())
    if (fattn::cuda::runs_on_current_device(k.kernel)) here.push_back(k);
  return here;
}

}  // namespace fattn_cuda_test
