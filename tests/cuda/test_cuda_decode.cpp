// fattn CUDA tests — the decode kernel (fattn::attention_kvcache on CUDA views,
// src/cuda/decode.cuh) against the float64 reference on the host.
//
// Each case: fresh N(0,1) inputs rounded to the dtype, seeded from the case's name, in
// FlashAttention's layouts ((B, S, H, D) memory viewed as (B, H, S, D)); the caches
// contiguous or paged with the pages of each sequence scattered; per-sequence lengths
// (0 and the full cache among them); an append or not; GQA groups of 1 to 16; one or
// several queries (chunked prefill, whose causal band cuts through the key tiles); the
// variants; split counts and ring depths forced and chosen. out is poisoned (NaN) before.
// Checked:
//   out  max |gpu − ref| <= 2·(the CPU decode kernel's own error on the same 16-bit
//        inputs) + ulp(dtype)·max(1, max|ref|)   (ref: Impl::reference on float32 copies,
//        float64 arithmetic)
//   lse  |gpu − ref| <= 5e-5·max(1, |ref|) + 2·(the CPU decode kernel's lse error)
//   the caches after the append: bit for bit the CPU kernel's (which appends the same
//   elements), so nothing else of the cache changed.
// Without a GPU every case skips, except the refusals and argument errors, which launch
// nothing.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "cuda/decode.hpp"
#include "fattn/fattn.hpp"
#include "util/cuda_device.hpp"
#include "util/seed.hpp"

namespace {

using fattn::DType;
using fattn::TensorView;
using fattn_cuda_test::DeviceBuffer;

struct DecodeCase {
  DType dtype = DType::bfloat16;
  int batch = 2, q_heads = 8, kv_heads = 2, q_len = 1, head_dim = 128;
  int capacity = 300;
  int page = 0;  // 0: contiguous (B, capacity, Hkv, D); else pages of this many keys
  int new_len = 0;
  std::vector<int> lengths;  // keys per sequence before the append
  bool causal = false;
  int window_left = -1, window_right = -1;
  float softcap = 0.0f;
  bool alibi = false, sinks = false;
  float q_scale = 1.0f;  // > 1: large logits
  bool nan_in_v = false;  // a NaN value at each sequence's last key (seen by the last query only)
  bool nan_in_q = false;  // a NaN in the first query row of sequence 0, query head 0
  int splits = 0, stages = 0;

  std::string name() const {
    std::ostringstream s;
    s << (dtype == DType::float16 ? "f16" : "bf16") << "_B" << batch << "_Hq" << q_heads << "_Hkv"
      << kv_heads << "_Sq" << q_len << "_D" << head_dim << "_cap" << capacity << "_page" << page
      << "_new" << new_len << "_len";
    for (int l : lengths) s << "-" << l;
    if (causal) s << "_causal";
    if (window_left >= 0 || window_right >= 0) s << "_win" << window_left << "," << window_right;
    if (softcap != 0.0f) s << "_softcap" << softcap;
    if (alibi) s << "_alibi";
    if (sinks) s << "_sinks";
    if (q_scale != 1.0f) s << "_qx" << q_scale;
    if (nan_in_v) s << "_nanv";
    if (nan_in_q) s << "_nanq";
    s << "_splits" << splits << "_stages" << stages;
    return s.str();
  }
};

// Host data of one case: 16-bit bits and their float32 values, in FlashAttention's layouts.
struct HostCase {
  std::vector<std::uint16_t> q, k, v, kn, vn;
  std::vector<float> qf, kf, vf, knf, vnf;
  std::vector<std::int32_t> lengths, table;
  std::vector<float> alibi, sinks;
  int blocks = 0;  // pages (paged) or B (contiguous): the caches' first dimension
  int keys_per_block = 0;
};

void fill(std::vector<std::uint16_t>& bits, std::vector<float>& values, std::size_t n, DType dtype,
          std::mt19937& rng, float scale) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  bits.resize(n);
  values.resize(n);
  for (std::size_t i = 0; i < n; ++i) {
    bits[i] = fattn::to_16bit(normal(rng) * scale, dtype);
    values[i] = fattn::from_16bit(bits[i], dtype);
  }
}

HostCase make_host(const DecodeCase& c) {
  std::mt19937 rng(static_cast<std::uint32_t>(fattn_test::seed_for(c.name())));
  HostCase h;
  const std::size_t d = static_cast<std::size_t>(c.head_dim);
  h.keys_per_block = c.page ? c.page : c.capacity;
  const int per_sequence = c.capacity / h.keys_per_block;
  h.blocks = c.page ? c.batch * per_sequence + 1 : c.batch;  // one page no sequence uses
  fill(h.q, h.qf, static_cast<std::size_t>(c.batch) * c.q_len * c.q_heads * d, c.dtype, rng, c.q_scale);
  const std::size_t cache = static_cast<std::size_t>(h.blocks) * h.keys_per_block * c.kv_heads * d;
  fill(h.k, h.kf, cache, c.dtype, rng, 1.0f);
  fill(h.v, h.vf, cache, c.dtype, rng, 1.0f);
  const std::size_t fresh = static_cast<std::size_t>(c.batch) * c.new_len * c.kv_heads * d;
  fill(h.kn, h.knf, fresh, c.dtype, rng, 1.0f);
  fill(h.vn, h.vnf, fresh, c.dtype, rng, 1.0f);
  h.lengths.assign(c.lengths.begin(), c.lengths.end());
  if (c.page) {
    std::vector<std::int32_t> pages(static_cast<std::size_t>(h.blocks));
    std::iota(pages.begin(), pages.end(), 0);
    std::shuffle(pages.begin(), pages.end(), rng);
    h.table.assign(pages.begin(), pages.begin() + c.batch * per_sequence);
  }
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  for (int i = 0; i < c.q_heads; ++i) {
    h.alibi.push_back(std::exp2(-8.0f * (i + 1) / c.q_heads));
    h.sinks.push_back(2.0f * unit(rng) - 0.5f);
  }
  if (c.nan_in_q) {  // q is (B, Sq, Hq, D): element 5 of (b 0, query 0, head 0)
    h.q[5] = fattn::to_16bit(std::numeric_limits<float>::quiet_NaN(), c.dtype);
    h.qf[5] = std::numeric_limits<float>::quiet_NaN();
  }
  if (c.nan_in_v) {  // the last key of each sequence after the append, in the cache if old
    for (int b = 0; b < c.batch; ++b) {
      const int last = h.lengths[static_cast<std::size_t>(b)] + c.new_len - 1;
      if (last < 0) continue;
      std::vector<std::uint16_t>& bits = last >= h.lengths[static_cast<std::size_t>(b)] ? h.vn : h.v;
      std::vector<float>& values = last >= h.lengths[static_cast<std::size_t>(b)] ? h.vnf : h.vf;
      std::size_t row;
      if (last >= h.lengths[static_cast<std::size_t>(b)]) {
        row = (static_cast<std::size_t>(b) * c.new_len + (last - h.lengths[static_cast<std::size_t>(b)])) * c.kv_heads;
      } else {
        const int block = c.page ? h.table[static_cast<std::size_t>(b * per_sequence + last / c.page)] : b;
        row = (static_cast<std::size_t>(block) * h.keys_per_block + (c.page ? last % c.page : last)) * c.kv_heads;
      }
      bits[row * d + 3] = fattn::to_16bit(std::numeric_limits<float>::quiet_NaN(), c.dtype);
      values[row * d + 3] = std::numeric_limits<float>::quiet_NaN();
    }
  }
  return h;
}

// The views of one run over memory at the given pointers (host or device).
struct Views {
  TensorView q, k, v, kn, vn, out, lse, lengths, table, alibi, sinks;
  fattn::KvCache cache;
  fattn::Options options;
};

Views views_of(const DecodeCase& c, const HostCase& h, DType dtype, fattn::Device device, void* q,
               void* k, void* v, void* kn, void* vn, void* out, float* lse, std::int32_t* lengths,
               std::int32_t* table, float* alibi, float* sinks) {
  Views w;
  w.q = TensorView::bshd(q, c.batch, c.q_len, c.q_heads, c.head_dim, dtype, device);
  w.k = TensorView::bshd(k, h.blocks, h.keys_per_block, c.kv_heads, c.head_dim, dtype, device);
  w.v = TensorView::bshd(v, h.blocks, h.keys_per_block, c.kv_heads, c.head_dim, dtype, device);
  w.kn = TensorView::bshd(kn, c.batch, c.new_len, c.kv_heads, c.head_dim, dtype, device);
  w.vn = TensorView::bshd(vn, c.batch, c.new_len, c.kv_heads, c.head_dim, dtype, device);
  w.out = TensorView::bshd(out, c.batch, c.q_len, c.q_heads, c.head_dim, dtype, device);
  w.lse = TensorView::lse(lse, c.batch, c.q_heads, c.q_len, device);
  w.lengths = TensorView::int32_vector(lengths, c.batch, device);
  w.table = TensorView::int32_matrix(table, c.batch, c.page ? c.capacity / c.page : 1, device);
  w.alibi = TensorView{alibi, 1, {c.q_heads, 0, 0, 0}, {1, 0, 0, 0}, DType::float32, device};
  w.sinks = TensorView{sinks, 1, {c.q_heads, 0, 0, 0}, {1, 0, 0, 0}, DType::float32, device};
  w.cache = {w.k, w.v, &w.lengths, c.page ? &w.table : nullptr};
  w.options.causal = c.causal ? fattn::Causal::bottom_right : fattn::Causal::none;
  w.options.window_left = c.window_left;
  w.options.window_right = c.window_right;
  w.options.softcap = c.softcap;
  w.options.alibi_slopes = c.alibi ? &w.alibi : nullptr;
  w.options.sinks = c.sinks ? &w.sinks : nullptr;
  w.options.kv_splits = c.splits;
  w.options.decode_stages = c.stages;
  return w;
}

struct Result {
  std::vector<float> out, lse;
  std::vector<std::uint16_t> k, v;  // the caches after the call (16-bit runs)
};

// The CPU library on the host copies: impl reference on float32 values (float64 arithmetic),
// or impl decode on the 16-bit bits (the same-precision pipeline).
Result run_cpu(const DecodeCase& c, HostCase h, bool reference) {
  const std::size_t out_n = static_cast<std::size_t>(c.batch) * c.q_len * c.q_heads * c.head_dim;
  Result r;
  r.lse.assign(static_cast<std::size_t>(c.batch) * c.q_heads * c.q_len, 0.0f);
  std::vector<std::uint16_t> out16(out_n);
  r.out.assign(out_n, 0.0f);
  const DType dtype = reference ? DType::float32 : c.dtype;
  auto ptr = [&](std::vector<float>& f, std::vector<std::uint16_t>& b) -> void* {
    return reference ? static_cast<void*>(f.data()) : static_cast<void*>(b.data());
  };
  Views w = views_of(c, h, dtype, fattn::Device::cpu, ptr(h.qf, h.q), ptr(h.kf, h.k), ptr(h.vf, h.v),
                     ptr(h.knf, h.kn), ptr(h.vnf, h.vn),
                     reference ? static_cast<void*>(r.out.data()) : static_cast<void*>(out16.data()),
                     r.lse.data(), h.lengths.data(), h.table.empty() ? nullptr : h.table.data(),
                     h.alibi.data(), h.sinks.data());
  w.options.impl = reference ? fattn::Impl::reference : fattn::Impl::decode;
  w.options.kv_splits = 0;
  w.options.decode_stages = 0;
  fattn::attention_kvcache(w.q, w.cache, c.new_len ? &w.kn : nullptr, c.new_len ? &w.vn : nullptr,
                           w.out, &w.lse, w.options);
  if (!reference) {
    for (std::size_t i = 0; i < out_n; ++i) r.out[i] = fattn::from_16bit(out16[i], c.dtype);
    r.k = h.k;
    r.v = h.v;
  }
  return r;
}

template <class T>
DeviceBuffer upload(const std::vector<T>& host) {
  DeviceBuffer d(std::max<std::size_t>(1, host.size() * sizeof(T)));
  if (!host.empty()) cudaMemcpy(d.get(), host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice);
  return d;
}

template <class T>
std::vector<T> download(const DeviceBuffer& d, std::size_t n) {
  std::vector<T> host(n);
  cudaMemcpy(host.data(), d.get(), n * sizeof(T), cudaMemcpyDeviceToHost);
  return host;
}

Result run_gpu(const DecodeCase& c, const HostCase& h) {
  const std::size_t out_n = static_cast<std::size_t>(c.batch) * c.q_len * c.q_heads * c.head_dim;
  const std::size_t lse_n = static_cast<std::size_t>(c.batch) * c.q_heads * c.q_len;
  DeviceBuffer q = upload(h.q), k = upload(h.k), v = upload(h.v), kn = upload(h.kn),
               vn = upload(h.vn), lengths = upload(h.lengths), table = upload(h.table),
               alibi = upload(h.alibi), sinks = upload(h.sinks);
  DeviceBuffer out(out_n * 2), lse(lse_n * 4);
  cudaMemset(out.get(), 0xFF, out_n * 2);  // NaN in both 16-bit dtypes
  cudaMemset(lse.get(), 0xFF, lse_n * 4);
  Views w = views_of(c, h, c.dtype, fattn::Device::cuda, q.get(), k.get(), v.get(), kn.get(),
                     vn.get(), out.get(), reinterpret_cast<float*>(lse.get()),
                     reinterpret_cast<std::int32_t*>(lengths.get()),
                     reinterpret_cast<std::int32_t*>(table.get()),
                     reinterpret_cast<float*>(alibi.get()), reinterpret_cast<float*>(sinks.get()));
  fattn::attention_kvcache(w.q, w.cache, c.new_len ? &w.kn : nullptr,
                           c.new_len ? &w.vn : nullptr, w.out, &w.lse, w.options);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess) << c.name();
  Result r;
  const std::vector<std::uint16_t> out16 = download<std::uint16_t>(out, out_n);
  for (std::uint16_t bits : out16) r.out.push_back(fattn::from_16bit(bits, c.dtype));
  r.lse = download<float>(lse, lse_n);
  r.k = download<std::uint16_t>(k, h.k.size());
  r.v = download<std::uint16_t>(v, h.v.size());
  return r;
}

// max |a − ref|, NaN where one is NaN and the other is not (both NaN: agree).
double max_error(const std::vector<float>& a, const std::vector<float>& ref) {
  double worst = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(ref[i]) || std::isnan(a[i])) {
      if (std::isnan(ref[i]) != std::isnan(a[i])) return std::numeric_limits<double>::quiet_NaN();
      continue;
    }
    if (std::isinf(ref[i]) || std::isinf(a[i])) {
      if (ref[i] != a[i]) return std::numeric_limits<double>::infinity();
      continue;
    }
    worst = std::max(worst, std::abs(static_cast<double>(a[i]) - ref[i]));
  }
  return worst;
}

// max |a − ref| over the elements where both are finite: the CPU pipeline's error, which
// sets the tolerance (the NaN pattern is checked on the GPU's output alone).
double max_finite_error(const std::vector<float>& a, const std::vector<float>& ref) {
  double worst = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (std::isfinite(a[i]) && std::isfinite(ref[i]))
      worst = std::max(worst, std::abs(static_cast<double>(a[i]) - ref[i]));
  return worst;
}

double max_abs(const std::vector<float>& x) {
  double m = 0.0;
  for (float e : x)
    if (std::isfinite(e)) m = std::max(m, static_cast<double>(std::abs(e)));
  return m;
}

void check_case(const DecodeCase& c) {
  const HostCase h = make_host(c);
  const Result ref = run_cpu(c, h, true);
  const Result cpu = run_cpu(c, h, false);
  const Result gpu = run_gpu(c, h);
  const double ulp = c.dtype == DType::float16 ? std::ldexp(1.0, -10) : std::ldexp(1.0, -7);
  const double cpu_err = max_finite_error(cpu.out, ref.out);
  const double out_tol = 2.0 * cpu_err + ulp * std::max(1.0, max_abs(ref.out));
  const double out_err = max_error(gpu.out, ref.out);
  EXPECT_LE(out_err, out_tol) << c.name() << " (the CPU kernel's error " << cpu_err << ")";
  const double lse_tol =
      5e-5 * std::max(1.0, max_abs(ref.lse)) + 2.0 * max_finite_error(cpu.lse, ref.lse);
  EXPECT_LE(max_error(gpu.lse, ref.lse), lse_tol) << c.name();
  EXPECT_TRUE(gpu.k == cpu.k) << c.name() << ": k_cache after the append";
  EXPECT_TRUE(gpu.v == cpu.v) << c.name() << ": v_cache after the append";
}

std::vector<DecodeCase> grid() {
  std::vector<DecodeCase> cases;
  for (DType dtype : {DType::bfloat16, DType::float16})
    for (int d : {64, 96, 128, 256}) {
      DecodeCase a;  // decode: GQA 4, contiguous, lengths 0 .. full, chosen splits
      a.dtype = dtype;
      a.head_dim = d;
      a.batch = 3;
      a.lengths = {0, 137, 300};
      cases.push_back(a);
      DecodeCase b = a;  // paged with an append, forced splits and ring depths
      b.batch = 2;
      b.q_heads = 6;
      b.kv_heads = 2;
      b.capacity = 512;
      b.page = 16;
      b.new_len = 1;
      b.lengths = {100, 511};
      for (int splits : {1, 3, 7}) {
        b.splits = splits;
        // 4 stages fit 227 KB at D = 64 only (decode_tiles.hpp)
        b.stages = splits == 3 ? 2 : splits == 7 ? (d == 64 ? 4 : 3) : 0;
        cases.push_back(b);
      }
      DecodeCase chunk = b;  // chunked prefill: 5 queries, causal, its band through the tiles
      chunk.q_heads = chunk.kv_heads = 4;
      chunk.q_len = 5;
      chunk.capacity = 256;
      chunk.page = 32;
      chunk.new_len = 5;
      chunk.lengths = {0, 200};
      chunk.causal = true;
      chunk.splits = 0;
      chunk.stages = 0;
      cases.push_back(chunk);
      DecodeCase wide = a;  // 16 query heads per kv head, 2 queries: two row tiles
      wide.q_heads = 32;
      wide.kv_heads = 2;
      wide.q_len = 2;
      wide.batch = 1;
      wide.capacity = 1000;
      wide.new_len = 2;
      wide.lengths = {777};
      wide.causal = true;
      cases.push_back(wide);
    }
  // The variants (D = 128, both dtypes), alone and together, one split and several.
  for (DType dtype : {DType::bfloat16, DType::float16})
    for (int splits : {1, 4}) {
      DecodeCase base;
      base.dtype = dtype;
      base.batch = 2;
      base.q_heads = 8;
      base.kv_heads = 2;
      base.q_len = 3;
      base.capacity = 640;
      base.page = 64;
      base.new_len = 3;
      base.lengths = {50, 600};
      base.splits = splits;
      auto add = [&](auto change) {
        DecodeCase c = base;
        change(c);
        cases.push_back(c);
      };
      add([](DecodeCase& c) { c.causal = true; c.window_left = 17; c.window_right = 0; });
      add([](DecodeCase& c) { c.window_left = 5; c.window_right = 3; });
      add([](DecodeCase& c) { c.window_left = 0; c.window_right = 0; });
      add([](DecodeCase& c) { c.softcap = 20.0f; c.q_scale = 8.0f; });
      add([](DecodeCase& c) { c.alibi = true; c.causal = true; });
      add([](DecodeCase& c) { c.sinks = true; });
      add([](DecodeCase& c) { c.sinks = true; c.lengths = {0, 0}; c.new_len = 0; });
      add([](DecodeCase& c) {
        c.causal = true; c.window_left = 40; c.softcap = 30.0f; c.alibi = true; c.sinks = true;
      });
      add([](DecodeCase& c) { c.q_scale = 16.0f; });                  // large logits
      add([](DecodeCase& c) { c.causal = true; c.nan_in_v = true; });  // NaN seen by one query
      add([](DecodeCase& c) { c.nan_in_q = true; });                   // a NaN row: out and lse
      add([](DecodeCase& c) { c.nan_in_q = true; c.sinks = true; });
    }
  return cases;
}

// The harness itself, without a GPU: every case's reference and CPU pipeline run, agree
// within the dtype's rounding, and the NaN case's NaN reaches only the rows that see it.
TEST(CudaDecode, TheGridsReferenceRunsOnTheHost) {
  for (const DecodeCase& c : grid()) {
    SCOPED_TRACE(c.name());
    const HostCase h = make_host(c);
    const Result ref = run_cpu(c, h, true);
    const Result cpu = run_cpu(c, h, false);
    const double ulp = c.dtype == DType::float16 ? std::ldexp(1.0, -10) : std::ldexp(1.0, -7);
    EXPECT_LE(max_error(cpu.out, ref.out), 8.0 * ulp * std::max(1.0, max_abs(ref.out)));
    const std::size_t nan_rows = static_cast<std::size_t>(
        std::count_if(ref.out.begin(), ref.out.end(), [](float x) { return std::isnan(x); }));
    if (c.nan_in_q) {  // that row, every column
      EXPECT_EQ(nan_rows, static_cast<std::size_t>(c.head_dim));
    } else if (c.nan_in_v) {  // kv head 0's query heads, the last query of each sequence: one column
      EXPECT_EQ(nan_rows, static_cast<std::size_t>(c.batch) * (c.q_heads / c.kv_heads));
    } else {
      EXPECT_EQ(nan_rows, 0u);
    }
  }
}

TEST(CudaDecode, MatchesTheFloat64ReferenceAndAppendsLikeTheCpu) {
  FATTN_REQUIRE_GPU();
  for (const DecodeCase& c : grid()) {
    SCOPED_TRACE(c.name());
    check_case(c);
  }
}

// A few small cases for compute-sanitizer (memcheck, racecheck, synccheck; scripts/
// gpu-check.sh): every kernel (check, split, combine), each ring depth, the slow P·V path.
std::vector<DecodeCase> sanitize_cases() {
  DecodeCase paged;  // D = 64, GQA 4, pages of 16, an append, 3 splits, 2 stages
  paged.head_dim = 64;
  paged.capacity = 128;
  paged.page = 16;
  paged.new_len = 1;
  paged.lengths = {40, 127};
  paged.splits = 3;
  paged.stages = 2;
  DecodeCase chunk;  // D = 128, 5 causal queries, a NaN some rows see, one split, 3 stages
  chunk.dtype = DType::float16;
  chunk.q_heads = chunk.kv_heads = 2;
  chunk.q_len = 5;
  chunk.capacity = 96;
  chunk.new_len = 5;
  chunk.lengths = {0, 70};
  chunk.causal = true;
  chunk.nan_in_v = true;
  chunk.splits = 1;
  chunk.stages = 3;
  DecodeCase variants;  // D = 256, the variants, chosen splits
  variants.head_dim = 256;
  variants.capacity = 200;
  variants.lengths = {199, 3};
  variants.window_left = 50;
  variants.softcap = 20.0f;
  variants.alibi = variants.sinks = true;
  return {paged, chunk, variants};
}

TEST(CudaDecodeSanitize, SmallCases) {
  FATTN_REQUIRE_GPU();
  for (const DecodeCase& c : sanitize_cases()) {
    SCOPED_TRACE(c.name());
    check_case(c);
  }
}

// A decode step issues its launches and returns: nothing on the device is read by the host,
// so the same call replays from a CUDA graph with new lengths written between replays.
TEST(CudaDecode, ReplaysFromACudaGraphWithNewLengths) {
  FATTN_REQUIRE_GPU();
  DecodeCase c;
  c.batch = 2;
  c.capacity = 4096;
  c.page = 16;
  c.lengths = {1000, 4000};
  const HostCase h = make_host(c);
  DeviceBuffer q = upload(h.q), k = upload(h.k), v = upload(h.v), lengths = upload(h.lengths),
               table = upload(h.table), alibi = upload(h.alibi), sinks = upload(h.sinks);
  const std::size_t out_n = static_cast<std::size_t>(c.batch) * c.q_heads * c.head_dim;
  DeviceBuffer out(out_n * 2), lse(static_cast<std::size_t>(c.batch) * c.q_heads * 4);
  Views w = views_of(c, h, c.dtype, fattn::Device::cuda, q.get(), k.get(), v.get(), nullptr, nullptr,
                     out.get(), reinterpret_cast<float*>(lse.get()),
                     reinterpret_cast<std::int32_t*>(lengths.get()),
                     reinterpret_cast<std::int32_t*>(table.get()), nullptr, nullptr);
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreate(&stream));
  w.options.cuda_stream = stream;
  cudaGraph_t graph;
  CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  fattn::attention_kvcache(w.q, w.cache, nullptr, nullptr, w.out, &w.lse, w.options);
  CUDA_OK(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec;
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  for (const std::vector<std::int32_t>& next : {std::vector<std::int32_t>{17, 4096},
                                                std::vector<std::int32_t>{3000, 1}}) {
    CUDA_OK(cudaMemcpyAsync(lengths.get(), next.data(), next.size() * 4, cudaMemcpyHostToDevice, stream));
    CUDA_OK(cudaGraphLaunch(exec, stream));
    CUDA_OK(cudaStreamSynchronize(stream));
    DecodeCase now = c;
    now.lengths.assign(next.begin(), next.end());
    HostCase hn = h;
    hn.lengths = next;
    const Result ref = run_cpu(now, hn, true);
    std::vector<float> got;
    for (std::uint16_t bits : download<std::uint16_t>(out, out_n)) got.push_back(fattn::from_16bit(bits, c.dtype));
    EXPECT_LE(max_error(got, ref.out), 4.0 * std::ldexp(1.0, -7) * std::max(1.0, max_abs(ref.out)))
        << "lengths " << next[0] << ", " << next[1];
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

// The case's call with an append on the device, synchronised: exits 3 on cudaErrorAssert
// (the device-side check stopped the stream), 0 otherwise.
[[noreturn]] void append_and_exit(const DecodeCase& c, const HostCase& h) {
  DeviceBuffer q = upload(h.q), k = upload(h.k), v = upload(h.v), kn = upload(h.kn),
               vn = upload(h.vn), lengths = upload(h.lengths), table = upload(h.table);
  DeviceBuffer out(static_cast<std::size_t>(c.batch) * c.q_heads * c.head_dim * 2),
      lse(static_cast<std::size_t>(c.batch) * c.q_heads * 4);
  Views w = views_of(c, h, c.dtype, fattn::Device::cuda, q.get(), k.get(), v.get(), kn.get(),
                     vn.get(), out.get(), reinterpret_cast<float*>(lse.get()),
                     reinterpret_cast<std::int32_t*>(lengths.get()),
                     reinterpret_cast<std::int32_t*>(table.get()), nullptr, nullptr);
  fattn::attention_kvcache(w.q, w.cache, &w.kn, &w.vn, w.out, &w.lse, w.options);
  const cudaError_t e = cudaDeviceSynchronize();
  std::fprintf(stderr, "synchronize: %s\n", cudaGetErrorName(e));
  std::exit(e == cudaErrorAssert ? 3 : 0);
}

// A cache_seqlens entry past the cache stops the stream with a device-side assertion that
// names the argument (in a child process: the assertion ends its CUDA context).
TEST(CudaDecode, AWrongLengthStopsTheStreamNamingCacheSeqlens) {
  FATTN_REQUIRE_GPU();
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  DecodeCase c;
  c.batch = 2;
  c.capacity = 64;
  c.new_len = 1;
  c.lengths = {10, 64};  // 64 + 1 new key does not fit
  EXPECT_EXIT(append_and_exit(c, make_host(c)), ::testing::ExitedWithCode(3), "cache_seqlens");
}

// Two sequences whose appends meet in one page slot (block_table names the same page at
// the same position): the device-side check stops the stream before either writes.
TEST(CudaDecode, TwoAppendsIntoOneSlotStopTheStreamNamingBlockTable) {
  FATTN_REQUIRE_GPU();
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  DecodeCase c;
  c.batch = 2;
  c.capacity = 32;
  c.page = 16;
  c.new_len = 1;
  c.lengths = {5, 5};
  HostCase h = make_host(c);
  h.table[2] = h.table[0];  // sequence 1's first page is sequence 0's
  EXPECT_EXIT(append_and_exit(c, h), ::testing::ExitedWithCode(3), "block_table");
}

// What the decode kernel does not take is refused by name, before anything runs (no GPU
// needed); the torch operator sends those calls to the Triton kernels.
TEST(CudaDecode, RefusalsNameWhatTheKernelDoesNotTake) {
  DecodeCase c;
  c.lengths = {1, 2};
  HostCase h = make_host(c);
  Views w = views_of(c, h, c.dtype, fattn::Device::cuda, reinterpret_cast<void*>(256),
                     reinterpret_cast<void*>(512), reinterpret_cast<void*>(1024), nullptr, nullptr,
                     reinterpret_cast<void*>(2048), nullptr, nullptr, nullptr, nullptr, nullptr);
  EXPECT_EQ(fattn::cuda_kvcache_refusal(w.q, w.cache, nullptr, nullptr, w.options), "");
  TensorView q32 = w.q;
  q32.dtype = DType::float32;
  EXPECT_NE(fattn::cuda_kvcache_refusal(q32, w.cache, nullptr, nullptr, w.options).find("float16 or bfloat16"),
            std::string::npos);
  TensorView odd = w.q;
  odd.sizes[3] = 100;
  EXPECT_NE(fattn::cuda_kvcache_refusal(odd, w.cache, nullptr, nullptr, w.options).find("head dim 100"),
            std::string::npos);
  TensorView misaligned = w.q;
  misaligned.data = reinterpret_cast<void*>(258);
  EXPECT_NE(fattn::cuda_kvcache_refusal(misaligned, w.cache, nullptr, nullptr, w.options).find("q must start on 16 bytes"),
            std::string::npos);
  fattn::Options top_left = w.options;
  top_left.causal = fattn::Causal::top_left;
  EXPECT_NE(fattn::cuda_kvcache_refusal(w.q, w.cache, nullptr, nullptr, top_left).find("bottom-right"),
            std::string::npos);
  TensorView strided_rows = w.q;
  strided_rows.strides[3] = 2;
  EXPECT_NE(fattn::cuda_kvcache_refusal(strided_rows, w.cache, nullptr, nullptr, w.options).find("stride(3) 1"),
            std::string::npos);
  fattn::Options reference = w.options;
  reference.impl = fattn::Impl::reference;
  EXPECT_NE(fattn::cuda_kvcache_refusal(w.q, w.cache, nullptr, nullptr, reference).find("impl reference"),
            std::string::npos);
}

// The CPU's argument errors, with the same messages, before the device is asked anything.
TEST(CudaDecode, ArgumentErrorsAreTheCpusWithoutReadingTheDevice) {
  DecodeCase c;
  c.lengths = {1, 2};
  c.new_len = 1;
  HostCase h = make_host(c);
  auto fake = [](std::uintptr_t a) { return reinterpret_cast<void*>(a); };
  for (fattn::Device device : {fattn::Device::cpu, fattn::Device::cuda}) {
    Views w = views_of(c, h, c.dtype, device, fake(1 << 12), fake(2 << 12), fake(3 << 12),
                       fake(4 << 12), fake(5 << 12), fake(6 << 12),
                       reinterpret_cast<float*>(fake(7 << 12)),
                       reinterpret_cast<std::int32_t*>(fake(8 << 12)), nullptr, nullptr, nullptr);
    TensorView kn = w.kn;
    kn.sizes[1] = 3;  // kv heads 3, the cache has 2
    try {
      fattn::attention_kvcache(w.q, w.cache, &kn, &w.vn, w.out, &w.lse, w.options);
      ADD_FAILURE() << "no error on " << fattn::to_string(device);
    } catch (const fattn::Error& e) {
      EXPECT_NE(std::string(e.what()).find("k_new.size(1)"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
