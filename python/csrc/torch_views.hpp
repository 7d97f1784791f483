// fattn — what the operator sources share (ops.cpp, kv_ops.cpp): torch tensors as
// fattn::TensorView (no copy), fattn's parallel loop on ATen's thread pool, the output
// layout rule, and fattn::Error turned into torch's error.
#pragma once

#include <torch/extension.h>

#include <ATen/Parallel.h>

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include "fattn/attention.hpp"

namespace fattn_torch {

// --- the thread-pool seam ---------------------------------------------------------------
// fattn asks for `workers` calls worker(arg, w), w = 0..workers-1 (each pulls work items
// from a shared counter). at::parallel_for hands out the range [0, workers) in at most
// at::get_num_threads() chunks on torch's own OpenMP team; a chunk of several indices
// just runs them one after the other. Nested inside another parallel region it runs
// inline, as every ATen operator does.
inline void run_on_aten_pool(void* /*context*/, int workers,
                             void (*worker)(void* arg, int worker_index), void* arg) {
  at::parallel_for(0, workers, 1, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t w = begin; w < end; ++w) worker(arg, static_cast<int>(w));
  });
}
inline const fattn::ParallelRunner kAtenRunner{&run_on_aten_pool, nullptr};

// --- tensors to views ---------------------------------------------------------------------
// fattn's dtype of a torch floating type; none for any other.
inline std::optional<fattn::DType> float_dtype_of(at::ScalarType type) {
  switch (type) {
    case at::kFloat: return fattn::DType::float32;
    case at::kHalf: return fattn::DType::float16;
    case at::kBFloat16: return fattn::DType::bfloat16;
    case at::kDouble: return fattn::DType::float64;
    default: return std::nullopt;
  }
}

// A type's name in fattn's words for the floating types (float32, ...), torch's for others.
inline std::string dtype_name(at::ScalarType type) {
  const std::optional<fattn::DType> dtype = float_dtype_of(type);
  return dtype ? fattn::to_string(*dtype) : std::string(c10::toString(type));
}

inline fattn::DType dtype_of(const at::Tensor& t, const char* name) {
  const std::optional<fattn::DType> dtype = float_dtype_of(t.scalar_type());
  TORCH_CHECK(dtype, "fattn: ", name,
              ".dtype must be float32, bfloat16 or float16 (float64 only through the CPU "
              "reference), got ",
              t.scalar_type());
  return *dtype;
}

inline fattn::Device device_of(const at::Tensor& t, const char* name) {
  if (t.device().is_cpu()) return fattn::Device::cpu;
  if (t.device().is_cuda()) return fattn::Device::cuda;
  TORCH_CHECK(false, "fattn: ", name, " is on ", t.device(), "; fattn runs on cpu and cuda");
}

// Pointer, sizes and strides (in elements, as torch counts them): the view reads the
// tensor's memory where it is. A (B, S, H, D) tensor transposed to (B, H, S, D) arrives
// with its BSHD strides.
inline fattn::TensorView view_of(const at::Tensor& t, const char* name,
                                 std::optional<fattn::DType> dtype = std::nullopt) {
  fattn::TensorView v;
  v.data = t.data_ptr();
  v.rank = static_cast<int>(t.dim());
  for (int d = 0; d < v.rank; ++d) {
    v.sizes[static_cast<std::size_t>(d)] = t.size(d);
    v.strides[static_cast<std::size_t>(d)] = t.stride(d);
  }
  v.dtype = dtype ? *dtype : dtype_of(t, name);
  v.device = device_of(t, name);
  return v;
}

// An int32 index tensor (sequence lengths, offsets, a block table): another dtype is
// named here, since fattn's views have no int64.
inline fattn::TensorView int32_view_of(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.scalar_type() == at::kInt, "fattn: ", name, " must be an int32 tensor, got ",
              t.scalar_type());
  TORCH_CHECK(t.dim() >= 1 && t.dim() <= 4, "fattn: ", name,
              " must have 1 to 4 dimensions, got ", t.dim());
  return view_of(t, name, fattn::DType::int32);
}

inline fattn::Impl impl_of(c10::string_view impl) {
  try {
    return fattn::parse_impl(std::string(impl));
  } catch (const fattn::Error& e) {
    TORCH_CHECK(false, e.what());
  }
}

// The instruction set every CPU call of this process asks for: automatic unless
// _C.set_cpu_isa chose one (the Python tests run the AVX2 kernels on an AVX-512 machine
// this way, as the C++ suites do through Options::isa).
inline std::atomic<fattn::Isa> cpu_isa{fattn::Isa::automatic};

// The CUDA decode kernel's ring depth for every later KV-cache call of this process (0:
// chosen per call, the default): _C.set_cuda_decode_stages, for the benchmark that measures
// the choice (python -m fattn.bench --gpu, decode section).
inline std::atomic<int> cuda_decode_stages{0};

// The options every CPU call shares: torch.get_num_threads() threads, on torch's pool
// (never more threads than torch uses), the process's cpu_isa.
inline fattn::Options base_options(const at::Tensor& q, fattn::Causal causal,
                                   std::optional<double> scale, c10::string_view impl) {
  fattn::Options options;
  options.scale = scale;
  options.causal = causal;
  options.impl = impl_of(impl);
  if (q.device().is_cpu()) {
    options.num_threads = at::get_num_threads();
    options.runner = &kAtenRunner;
    options.isa = cpu_isa.load(std::memory_order_relaxed);
  }
  return options;
}

// The output's layout follows q's: (B, S, H, D) memory when q's heads are closer in memory
// than its rows (a transposed BSHD tensor, FlashAttention's layout), else contiguous
// (B, H, S, D). The same rule, spelled out rather than left to empty_like, is in the fake
// kernels (python/fattn/_registry.py), so eager and traced strides always agree.
inline at::Tensor empty_output(const at::Tensor& q) {
  const bool bshd = q.size(1) > 1 && q.size(2) > 1 && q.stride(1) < q.stride(2);
  if (bshd)
    return at::empty({q.size(0), q.size(2), q.size(1), q.size(3)}, q.options()).transpose(1, 2);
  return at::empty(q.sizes(), q.options());
}

// The logsumexp's dtype: float32, float64 for float64 problems (the reference path).
inline at::ScalarType lse_dtype(const at::Tensor& q) {
  return q.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

// Runs f(), a call into the library, turning its fattn::Error into torch's RuntimeError
// with the same message.
template <class F>
decltype(auto) call_fattn(F&& f) {
  try {
    return std::forward<F>(f)();
  } catch (const fattn::Error& e) {
    TORCH_CHECK(false, e.what());
  }
}

}  // namespace fattn_torch
