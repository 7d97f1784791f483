// fattn-gpu-bench — times the CUDA kernels with CUDA events and writes JSON.
//
//   fattn_gpu_bench [--out results.json] [--driver STRING] [--suite b2h8|flash|all]
//                   [--budget-s SECONDS] [--profile] [--impls NAME,NAME,...]
//                   [--skip NAME,NAME,...]
//
// Suites (Sq = Sk = S, Hq = Hkv = H, contiguous (B, H, S, D) tensors):
//   b2h8   B=2, H=8, D=64, S in {128, 512, 1024, 4096}, causal and not
//   flash  FlashAttention's sweep at hidden 2048: D=64 × 32 heads and D=128 × 16
//          heads, S in {512, ..., 16384}, B = 16384 / S, causal and not; D=256 × 8 heads
//          at S = 4096 and 16384 (fused_tma against fused_mma there)
// Variants: naive and fused for float32 (fused = 3xTF32), float16 and bfloat16; the
// TF32 mode ("fused_tf32", what Options::allow_tf32 runs); for 16-bit types at D <= 128 the
// fused kernel forced to 64- and to 128-row query tiles ("fused_br64", "fused_br128"),
// whose ratio sets the automatic choice; on compute capability 9.0 the Hopper wgmma
// kernels ("fused_wgmma", "fused_wgmma_pipelined": its two schedules; "fused_tma": the
// pipelined one on TMA loads from a producer warpgroup; 16-bit, D <= 128);
// in the b2h8 suite the exact-FMA float32 kernel ("fused_fma"). naive is skipped in
// the flash suite above S = 4096 (its score buffer alone is 2·16384·H·S bytes there).
//
// Method: inputs are random (never zeros); each timed call uses the next of several
// input/output sets, enough to cover 3× the L2, so no call finds its data in L2;
// before each call a ~50 µs spin kernel keeps the GPU busy while the host enqueues
// the events and the call, so the interval measures device time only, not the
// host-side validation. 2 warm-up calls, then reps (5..200, about 0.15 s per config);
// median, min, max. max_abs_err compares 8 sampled rows of the first set with a
// float64 host computation of the same definition as cpu/reference.cpp.
// The memory pool keeps freed blocks (release threshold = max), so the naive path's
// stream-ordered score buffer is not re-mapped on every call.
//
// --impls: run only the variants with these names (e.g. fused,fused_wgmma), in the
// usual order; an unknown name is an error. --skip: leave these variants out (gpu-check.sh
// leaves out a kernel that hung in its smoke test).
// --profile: for ncu. Runs each naive and fused variant once at the b2h8 shape
// (B=2, H=8, D=64) with S = 1024 and 4096, not causal, and the float16 fused kernels
// (fused_mma, both fused_wgmma schedules, fused_tma) at B=4, H=16, S=4096, D=128; nothing else.
//
// TODO(pytorch binding): time torch.nn.functional.scaled_dot_product_attention side by
// side on the same shapes (that belongs with the PyTorch binding, not here).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "cuda/backend.hpp"
#include "cuda/tile_config.hpp"
#include "fattn/fattn.hpp"

namespace {

using fattn::DType;
using fattn::TensorView;
using fattn::cuda::Kernel;

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "fattn_gpu_bench: %s: %s\n", what, cudaGetErrorString(e));
    std::exit(2);
  }
}

// ---- device helpers ------------------------------------------------------------------
__device__ std::uint32_t hash32(std::uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return static_cast<std::uint32_t>(x);
}

// Uniform in [-sqrt(3), sqrt(3)): mean 0, variance 1.
template <class T>
__global__ void bench_fill_kernel(T* data, std::int64_t n, std::uint64_t seed) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const float u = hash32(seed * 0x9e3779b97f4a7c15ull + static_cast<std::uint64_t>(i)) *
                    (1.0f / 4294967296.0f);
    const float x = (2.0f * u - 1.0f) * 1.7320508f;
    if constexpr (sizeof(T) == 4)
      data[i] = x;
    else if constexpr (std::is_same_v<T, __half>)
      data[i] = __float2half_rn(x);
    else
      data[i] = __float2bfloat16_rn(x);
  }
}

__global__ void bench_spin_kernel(long long cycles) {
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
}

void fill(DType dtype, void* data, std::int64_t n, std::uint64_t seed) {
  const int blocks = static_cast<int>(std::min<std::int64_t>((n + 255) / 256, 4096));
  switch (dtype) {
    case DType::float32: bench_fill_kernel<<<blocks, 256>>>(static_cast<float*>(data), n, seed); break;
    case DType::float16: bench_fill_kernel<<<blocks, 256>>>(static_cast<__half*>(data), n, seed); break;
    case DType::bfloat16:
      bench_fill_kernel<<<blocks, 256>>>(static_cast<__nv_bfloat16*>(data), n, seed);
      break;
  }
  check(cudaGetLastError(), "fill");
}

float host_float(DType dtype, const std::uint8_t* p) {
  if (dtype == DType::float32) {
    float x;
    std::memcpy(&x, p, 4);
    return x;
  }
  if (dtype == DType::float16) {
    __half h;
    std::memcpy(&h, p, 2);
    return __half2float(h);
  }
  __nv_bfloat16 h;
  std::memcpy(&h, p, 2);
  return __bfloat162float(h);
}

// ---- names -------------------------------------------------------------------------------
// The variants (the JSON's "impl", what --impls takes) and the suites (the JSON's "suite",
// what --suite takes), defined here only.
// A variant that runs one CUDA kernel as it is is named after it (fattn::cuda::to_string:
// naive, fused_tf32, fused_fma, fused_wgmma, fused_wgmma_pipelined, fused_tma,
// fused_tma_persistent, fused_tma_pingpong); the others are here.
namespace variant {
constexpr const char* fused = "fused";  // what Impl::fused dispatches to
constexpr Kernel kernels[] = {Kernel::naive, Kernel::fused_tf32, Kernel::fused_fma,
                              Kernel::fused_wgmma, Kernel::fused_wgmma_pipelined,
                              Kernel::fused_tma, Kernel::fused_tma_persistent,
                              Kernel::fused_tma_pingpong};
// The dispatched 16-bit kernel forced to one query-tile height (rows per block).
struct ForcedTile {
  const char* name;
  int rows;
};
constexpr ForcedTile forced_tiles[] = {{"fused_br64", 64}, {"fused_br128", 128}};
// fused_tma with its other K/V ring depth (tile_config.hpp, tma_alternative_stages): one stage
// more than tma_tiles' where it fits.
constexpr const char* tma_more_stages = "fused_tma_more_stages";
}  // namespace variant

std::vector<std::string> variant_names() {
  std::vector<std::string> names{variant::fused};
  for (Kernel k : variant::kernels) names.push_back(fattn::cuda::to_string(k));
  for (const variant::ForcedTile& f : variant::forced_tiles) names.push_back(f.name);
  names.push_back(variant::tma_more_stages);
  return names;
}

bool is_variant(const std::string& name) {
  const std::vector<std::string> names = variant_names();
  return std::find(names.begin(), names.end(), name) != names.end();
}

std::string variant_list() {
  std::string out;
  for (const std::string& name : variant_names()) out += (out.empty() ? "" : ", ") + name;
  return out;
}

namespace suite_name {
constexpr const char* b2h8 = "b2h8";        // B=2, H=8, D=64
constexpr const char* flash = "flash";      // FlashAttention's sweep at hidden 2048
constexpr const char* all = "all";          // both
constexpr const char* profile = "profile";  // --profile's configurations
}  // namespace suite_name

// ---- configurations ----------------------------------------------------------------------
struct Config {
  std::string impl;  // a variant's name (variant_names)
  Kernel kernel;
  DType dtype;
  int B, H, S, D;
  bool causal;
  std::string suite;
  int tile_rows = 0;  // tensor-core kernels: 0 = chosen per problem, else forced
  int stages = 0;     // fused_tma: 0 = its table's ring depth, else forced
};

const char* dtype_name(DType t) { return fattn::to_string(t); }

// The variant that runs `kernel` as it is.
Config kernel_config(Kernel kernel, DType t, int B, int H, int S, int D, bool causal,
                     const std::string& suite) {
  return {fattn::cuda::to_string(kernel), kernel, t, B, H, S, D, causal, suite};
}

std::vector<Config> variants(int B, int H, int S, int D, bool causal, const std::string& suite,
                             bool with_naive) {
  std::vector<Config> out;
  for (DType t : {DType::float16, DType::bfloat16, DType::float32}) {
    if (with_naive) out.push_back(kernel_config(Kernel::naive, t, B, H, S, D, causal, suite));
    out.push_back({variant::fused, fattn::cuda::kernel_for(fattn::Impl::fused, t), t, B, H, S, D,
                   causal, suite});
    if (t == DType::float32) {
      // TF32 mode (Options::allow_tf32): its max_err on these shapes decides whether
      // it may count for the fp32 comparison (the goal: max_err < 1e-3)
      out.push_back(kernel_config(Kernel::fused_tf32, t, B, H, S, D, causal, suite));
      if (suite == suite_name::b2h8)
        out.push_back(kernel_config(Kernel::fused_fma, t, B, H, S, D, causal, suite));
    }
    if (t != DType::float32 && fattn::cuda::runs_on_current_device(Kernel::fused_wgmma)) {
      // the Hopper kernels beside fused_mma (docs/cuda.md), each at the head dims it is
      // built for: a head dim becomes theirs by default on compute capability 9.0 once
      // these numbers say it should
      for (Kernel k : {Kernel::fused_wgmma, Kernel::fused_wgmma_pipelined, Kernel::fused_tma,
                       Kernel::fused_tma_persistent, Kernel::fused_tma_pingpong}) {
        const std::vector<int> dims = fattn::cuda::hopper_head_dims(k);
        if (!dims.empty() && D <= dims.back())
          out.push_back(kernel_config(k, t, B, H, S, D, causal, suite));
      }
      const std::vector<int> tma = fattn::cuda::tma_head_dims();
      const auto dim = std::lower_bound(tma.begin(), tma.end(), D);
      if (dim != tma.end() && fattn::cuda::tma_alternative_stages(*dim) != 0) {
        Config c = kernel_config(Kernel::fused_tma, t, B, H, S, D, causal, suite);
        c.impl = variant::tma_more_stages;
        c.stages = fattn::cuda::tma_alternative_stages(*dim);
        out.push_back(c);
      }
    }
    if (D <= fattn::cuda::max_tall_head_dim()) {
      // both query-tile heights of the default fused kernel, side by side: they set
      // plan.cpp's choice (tall_tiles_pay)
      const Kernel k = fattn::cuda::kernel_for(fattn::Impl::fused, t);
      for (const variant::ForcedTile& f : variant::forced_tiles)
        out.push_back({f.name, k, t, B, H, S, D, causal, suite, f.rows});
    }
  }
  return out;
}

std::vector<Config> make_configs(const std::string& suite, bool profile) {
  std::vector<Config> configs;
  if (profile) {
    for (int S : {1024, 4096})
      for (Config c : variants(2, 8, S, 64, false, suite_name::profile, true))
        configs.push_back(c);
    for (DType t : {DType::float32})
      for (int S : {1024, 4096})
        configs.push_back(
            kernel_config(Kernel::fused_fma, t, 2, 8, S, 64, false, suite_name::profile));
    // the 300 TFLOP/s goal's shape (D = 128, S = 4096, B·H = 64): the 16-bit kernels
    for (Config c : variants(4, 16, 4096, 128, false, suite_name::profile, false))
      if (c.dtype == DType::float16 && c.tile_rows == 0) configs.push_back(c);
    return configs;
  }
  if (suite == suite_name::b2h8 || suite == suite_name::all)
    for (int S : {128, 512, 1024, 4096})
      for (bool causal : {false, true})
        for (Config c : variants(2, 8, S, 64, causal, suite_name::b2h8, true))
          configs.push_back(c);
  if (suite == suite_name::flash || suite == suite_name::all)
    for (int D : {64, 128, 256})
      for (int S : {512, 1024, 2048, 4096, 8192, 16384}) {
        if (D == 256 && S != 4096 && S != 16384) continue;  // fused_tma's D = 256 against fused_mma
        for (bool causal : {false, true})
          for (Config c : variants(16384 / S, 2048 / D, S, D, causal, suite_name::flash, S <= 4096))
            configs.push_back(c);
      }
  return configs;
}

// ---- one configuration --------------------------------------------------------------------
struct Result {
  Config c;
  std::vector<float> ms;
  double max_abs_err = 0.0;
  std::int64_t extra_bytes = 0;
  int sets = 0;
  std::string skipped;
};

struct Set {
  void *q = nullptr, *k = nullptr, *v = nullptr, *out = nullptr;
  float* lse = nullptr;
};

double flops(const Config& c) {
  const double S = c.S;
  const double pairs = c.causal ? S * (S + 1) / 2 : S * S;  // Sq = Sk: both alignments agree
  return 4.0 * c.D * pairs * c.B * c.H;
}

// Float64 reference of one row (cpu/reference.cpp's definition), from host copies of
// the row of q and the (b, h) head of k and v.
double reference_row(const std::vector<float>& q, const std::vector<float>& k,
                     const std::vector<float>& v, int S, int D, int visible, double scale,
                     std::vector<double>& out) {
  std::vector<double> s(static_cast<std::size_t>(visible));
  double m = -INFINITY;
  for (int j = 0; j < visible; ++j) {
    double dot = 0.0;
    for (int d = 0; d < D; ++d) dot += static_cast<double>(q[d]) * k[static_cast<std::size_t>(j) * D + d];
    s[static_cast<std::size_t>(j)] = dot * scale;
    m = std::max(m, s[static_cast<std::size_t>(j)]);
  }
  out.assign(static_cast<std::size_t>(D), 0.0);
  double sum = 0.0;
  for (int j = 0; j < visible; ++j) {
    const double e = std::exp(s[static_cast<std::size_t>(j)] - m);
    sum += e;
    for (int d = 0; d < D; ++d) out[static_cast<std::size_t>(d)] += e * v[static_cast<std::size_t>(j) * D + d];
  }
  for (double& x : out) x /= sum;
  (void)S;
  return m + std::log(sum);
}

Result run_config(const Config& c, int l2_bytes, bool profile, cudaStream_t stream) {
  Result r;
  r.c = c;
  const int es = fattn::element_size(c.dtype);
  const std::int64_t n = static_cast<std::int64_t>(c.B) * c.H * c.S * c.D;
  const std::int64_t set_bytes = 4 * n * es + static_cast<std::int64_t>(c.B) * c.H * c.S * 4;
  const TensorView q0 = TensorView::bhsd(reinterpret_cast<void*>(std::uintptr_t{256}), c.B, c.H, c.S, c.D, c.dtype, fattn::Device::cuda);
  fattn::Options options;
  options.causal = c.causal ? fattn::Causal::bottom_right : fattn::Causal::none;
  options.cuda_stream = stream;
  r.extra_bytes = fattn::cuda::extra_bytes_with(q0, q0, q0, options, c.kernel);

  int sets = profile ? 1 : static_cast<int>(std::min<std::int64_t>(64, 3LL * l2_bytes / set_bytes + 1));
  std::size_t free_bytes = 0, total_bytes = 0;
  check(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo");
  const double budget = 0.8 * static_cast<double>(free_bytes) - static_cast<double>(r.extra_bytes);
  while (sets > 1 && sets * static_cast<double>(set_bytes) > budget) --sets;
  if (sets * static_cast<double>(set_bytes) > budget) {
    r.skipped = "does not fit in device memory";
    return r;
  }
  r.sets = sets;
  std::vector<Set> data(static_cast<std::size_t>(sets));
  for (int s = 0; s < sets; ++s) {
    Set& d = data[static_cast<std::size_t>(s)];
    check(cudaMalloc(&d.q, static_cast<std::size_t>(n * es)), "cudaMalloc q");
    check(cudaMalloc(&d.k, static_cast<std::size_t>(n * es)), "cudaMalloc k");
    check(cudaMalloc(&d.v, static_cast<std::size_t>(n * es)), "cudaMalloc v");
    check(cudaMalloc(&d.out, static_cast<std::size_t>(n * es)), "cudaMalloc out");
    check(cudaMalloc(&d.lse, static_cast<std::size_t>(c.B) * c.H * c.S * 4), "cudaMalloc lse");
    fill(c.dtype, d.q, n, 3 * s + 1);
    fill(c.dtype, d.k, n, 3 * s + 2);
    fill(c.dtype, d.v, n, 3 * s + 3);
  }
  check(cudaDeviceSynchronize(), "fill");

  auto call = [&](int s) {
    const Set& d = data[static_cast<std::size_t>(s)];
    const TensorView q = TensorView::bhsd(d.q, c.B, c.H, c.S, c.D, c.dtype, fattn::Device::cuda);
    const TensorView k = TensorView::bhsd(d.k, c.B, c.H, c.S, c.D, c.dtype, fattn::Device::cuda);
    const TensorView v = TensorView::bhsd(d.v, c.B, c.H, c.S, c.D, c.dtype, fattn::Device::cuda);
    const TensorView o = TensorView::bhsd(d.out, c.B, c.H, c.S, c.D, c.dtype, fattn::Device::cuda);
    const TensorView lse = TensorView::lse(d.lse, c.B, c.H, c.S, fattn::Device::cuda);
    fattn::cuda::forward_with(q, k, v, o, &lse, options, c.kernel, c.tile_rows, c.stages);
  };

  try {
    if (profile) {
      call(0);
      check(cudaStreamSynchronize(stream), "profile run");
    } else {
      cudaEvent_t start, stop;
      check(cudaEventCreate(&start), "event");
      check(cudaEventCreate(&stop), "event");
      auto timed = [&](int s) {
        bench_spin_kernel<<<1, 1, 0, stream>>>(100000);  // ~50 µs at 2 GHz
        check(cudaEventRecord(start, stream), "record");
        call(s);
        check(cudaEventRecord(stop, stream), "record");
        check(cudaEventSynchronize(stop), "sync");
        float ms = 0.0f;
        check(cudaEventElapsedTime(&ms, start, stop), "elapsed");
        return ms;
      };
      timed(0);
      const float first = timed(1 % sets);
      const int reps = std::clamp(static_cast<int>(150.0f / std::max(first, 1e-3f)), 5, 200);
      for (int i = 0; i < reps; ++i) r.ms.push_back(timed((i + 2) % sets));
      cudaEventDestroy(start);
      cudaEventDestroy(stop);

      // Accuracy of set 0 on sampled rows.
      call(0);
      check(cudaStreamSynchronize(stream), "accuracy run");
      const double scale = 1.0 / std::sqrt(static_cast<double>(c.D));
      const std::size_t head = static_cast<std::size_t>(c.S) * c.D;
      std::vector<std::uint8_t> raw(head * es);
      auto fetch = [&](const void* base, std::size_t offset, std::size_t count, std::vector<float>& dst) {
        raw.resize(count * es);
        check(cudaMemcpy(raw.data(), static_cast<const std::uint8_t*>(base) + offset * es,
                         count * es, cudaMemcpyDeviceToHost), "copy back");
        dst.resize(count);
        for (std::size_t e = 0; e < count; ++e) dst[e] = host_float(c.dtype, raw.data() + e * es);
      };
      std::vector<float> qrow, krows, vrows, orow;
      std::vector<double> want;
      for (auto [b, h] : {std::pair{0, 0}, {c.B - 1, c.H - 1}}) {
        const std::size_t head_offset = (static_cast<std::size_t>(b) * c.H + h) * head;
        fetch(data[0].k, head_offset, head, krows);
        fetch(data[0].v, head_offset, head, vrows);
        for (int i : {0, 1, c.S / 3, c.S - 1}) {
          fetch(data[0].q, head_offset + static_cast<std::size_t>(i) * c.D, c.D, qrow);
          fetch(data[0].out, head_offset + static_cast<std::size_t>(i) * c.D, c.D, orow);
          reference_row(qrow, krows, vrows, c.S, c.D, c.causal ? i + 1 : c.S, scale, want);
          for (int d = 0; d < c.D; ++d)
            r.max_abs_err = std::max(r.max_abs_err, std::fabs(orow[static_cast<std::size_t>(d)] - want[static_cast<std::size_t>(d)]));
        }
      }
    }
  } catch (const fattn::Error& e) {
    r.skipped = std::string("fattn::Error: ") + e.what();
  }
  cudaDeviceSynchronize();
  cudaMemPool_t pool;  // give the naive path's pooled score buffer back between configs
  if (cudaDeviceGetDefaultMemPool(&pool, 0) == cudaSuccess) cudaMemPoolTrimTo(pool, 0);
  for (Set& d : data) {
    cudaFree(d.q);
    cudaFree(d.k);
    cudaFree(d.v);
    cudaFree(d.out);
    cudaFree(d.lse);
  }
  return r;
}

// ---- output ----------------------------------------------------------------------------------
std::string json_escape(const std::string& s) {
  std::string o;
  for (char ch : s) {
    if (ch == '"' || ch == '\\') o += '\\';
    if (static_cast<unsigned char>(ch) >= 0x20) o += ch;
  }
  return o;
}

double percentile(std::vector<float> v, double p) {
  std::sort(v.begin(), v.end());
  if (v.empty()) return NAN;
  const double x = p * (v.size() - 1);
  const std::size_t lo = static_cast<std::size_t>(x);
  const std::size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (x - lo);
}

}  // namespace

int main(int argc, char** argv) {
  std::string out_path = "gpu_bench.json", driver = "unknown", suite = suite_name::all;
  double budget_s = 240.0;
  bool profile = false;
  std::vector<std::string> impls;  // empty: every variant
  std::vector<std::string> skip;   // variants left out
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "fattn_gpu_bench: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--out") out_path = next();
    else if (a == "--driver") driver = next();
    else if (a == "--suite") suite = next();
    else if (a == "--budget-s") budget_s = std::atof(next().c_str());
    else if (a == "--profile") profile = true;
    else if (a == "--impls" || a == "--skip") {
      std::stringstream list(next());
      for (std::string name; std::getline(list, name, ',');)
        if (!name.empty()) (a == "--impls" ? impls : skip).push_back(name);
    } else {
      std::fprintf(stderr,
                   "usage: fattn_gpu_bench [--out FILE] [--driver STR] "
                   "[--suite b2h8|flash|all] [--budget-s S] [--profile] [--impls A,B,...] "
                   "[--skip A,B,...]\n");
      return 2;
    }
  }
  if (suite != suite_name::b2h8 && suite != suite_name::flash && suite != suite_name::all) {
    std::fprintf(stderr, "fattn_gpu_bench: --suite: unknown suite '%s' (%s, %s, %s)\n",
                 suite.c_str(), suite_name::b2h8, suite_name::flash, suite_name::all);
    return 2;
  }
  for (const std::vector<std::string>* names : {&impls, &skip})
    for (const std::string& name : *names)
      if (!is_variant(name)) {
        std::fprintf(stderr, "fattn_gpu_bench: %s: unknown variant '%s' (%s)\n",
                     names == &impls ? "--impls" : "--skip", name.c_str(), variant_list().c_str());
        return 2;
      }

  int device = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
  int runtime = 0, driver_api = 0;
  cudaRuntimeGetVersion(&runtime);
  cudaDriverGetVersion(&driver_api);
  cudaMemPool_t pool;
  check(cudaDeviceGetDefaultMemPool(&pool, device), "default mem pool");
  std::uint64_t keep = UINT64_MAX;
  check(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep), "pool threshold");
  cudaStream_t stream;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");

  const auto t0 = std::chrono::steady_clock::now();
  std::vector<Result> results;
  std::vector<std::string> skipped;
  std::vector<Config> configs;
  for (const Config& c : make_configs(suite, profile))
    if ((impls.empty() || std::find(impls.begin(), impls.end(), c.impl) != impls.end()) &&
        std::find(skip.begin(), skip.end(), c.impl) == skip.end())
      configs.push_back(c);
  if (!profile)
    std::printf("%-10s %-9s %3s %3s %6s %4s %-6s %10s %10s %12s\n", "impl", "dtype", "B", "H", "S",
                "D", "causal", "ms_median", "TFLOP/s", "max_abs_err");
  for (const Config& c : configs) {
    const double elapsed =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!profile && elapsed > budget_s) {
      std::ostringstream s;
      s << c.impl << " " << dtype_name(c.dtype) << " B" << c.B << " H" << c.H << " S" << c.S
        << " D" << c.D << (c.causal ? " causal" : "") << ": time budget";
      skipped.push_back(s.str());
      continue;
    }
    Result r = run_config(c, prop.l2CacheSize, profile, stream);
    if (!r.skipped.empty()) {
      std::ostringstream s;
      s << c.impl << " " << dtype_name(c.dtype) << " B" << c.B << " H" << c.H << " S" << c.S
        << " D" << c.D << (c.causal ? " causal" : "") << ": " << r.skipped;
      skipped.push_back(s.str());
      std::printf("skipped: %s\n", s.str().c_str());
      continue;
    }
    if (!profile) {
      const double med = percentile(r.ms, 0.5);
      std::printf("%-10s %-9s %3d %3d %6d %4d %-6s %10.4f %10.2f %12.3e\n", c.impl.c_str(),
                  dtype_name(c.dtype), c.B, c.H, c.S, c.D, c.causal ? "yes" : "no", med,
                  flops(c) / (med * 1e-3) / 1e12, r.max_abs_err);
      std::fflush(stdout);
    }
    results.push_back(std::move(r));
  }
  if (profile) return 0;

  std::time_t now = std::time(nullptr);
  char date[32];
  std::strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  std::ofstream out(out_path);
  out << "{\n  \"machine\": {\"device\": \"" << json_escape(prop.name) << "\", \"driver\": \""
      << json_escape(driver) << "\", \"cuda\": \"" << runtime / 1000 << "." << (runtime % 1000) / 10
      << "\", \"cuda_driver_api\": \"" << driver_api / 1000 << "." << (driver_api % 1000) / 10
      << "\", \"date\": \"" << date << "\", \"compute_capability\": \"" << prop.major << "."
      << prop.minor << "\", \"sm_count\": " << prop.multiProcessorCount
      << ", \"l2_bytes\": " << prop.l2CacheSize << ", \"memory_bytes\": " << prop.totalGlobalMem
      << ", \"fattn\": \"" << fattn::version() << "\", \"head_dims\": \""
      << fattn::cuda::supported_head_dims_text()
      << "\", \"method\": \"CUDA events per call after a spin kernel; inputs rotated over sets "
         "covering 3x L2; 2 warm-ups; median/min/max over reps\"},\n  \"results\": [\n";
  for (std::size_t i = 0; i < results.size(); ++i) {
    const Result& r = results[i];
    const Config& c = r.c;
    const double med = percentile(r.ms, 0.5);
    out << "    {\"impl\": \"" << c.impl << "\", \"kernel\": \"" << fattn::cuda::to_string(c.kernel)
        << "\", \"dtype\": \"" << dtype_name(c.dtype) << "\", \"suite\": \"" << c.suite
        << "\", \"B\": " << c.B << ", \"Hq\": " << c.H << ", \"Hkv\": " << c.H << ", \"Sq\": " << c.S
        << ", \"Sk\": " << c.S << ", \"D\": " << c.D << ", \"causal\": " << (c.causal ? "true" : "false")
        << ", \"ms_median\": " << med << ", \"ms_min\": " << percentile(r.ms, 0.0)
        << ", \"ms_max\": " << percentile(r.ms, 1.0) << ", \"gflops\": " << flops(c) / (med * 1e6)
        << ", \"max_abs_err\": " << r.max_abs_err << ", \"extra_bytes\": " << r.extra_bytes
        << ", \"reps\": " << r.ms.size() << ", \"sets\": " << r.sets << "}"
        << (i + 1 < results.size() ? "," : "") << "\n";
  }
  out << "  ],\n  \"skipped\": [";
  for (std::size_t i = 0; i < skipped.size(); ++i)
    out << (i ? ", " : "") << "\"" << json_escape(skipped[i]) << "\"";
  out << "]\n}\n";
  std::printf("wrote %s (%zu results, %zu skipped)\n", out_path.c_str(), results.size(),
              skipped.size());
  return 0;
}
