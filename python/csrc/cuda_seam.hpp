// fattn — the operators' CUDA seam (ops.cpp, kv_ops.cpp): fattn's CUDA working memory
// comes from torch's caching allocator and its launches go on torch's current stream
// (when the extension is built with fattn's CUDA backend, FATTN_WITH_CUDA).
#pragma once

#include "fattn/attention.hpp"

#ifndef FATTN_WITH_CUDA
namespace fattn_torch {
// Without the CUDA backend a call's options are the caller's.
struct OnDevice {
  fattn::Options options;
  template <class Tensor>
  OnDevice(const Tensor& /*q*/, const fattn::Options& base) : options(base) {}
};
}  // namespace fattn_torch
#else
#include <ATen/Context.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <cstdint>
#include <optional>

namespace fattn_torch {

// fattn's CUDA working memory (the naive path's Sq×Sk buffer, repacked inputs, the decode
// kernel's partial rows) comes from torch's caching allocator on the call's stream:
// torch.cuda.max_memory_allocated counts it, the blocks are reused across calls (and
// within a CUDA graph's capture, from the graph's pool), and when memory runs short torch
// frees its cached blocks and retries, or raises torch.OutOfMemoryError, as its own
// operators do.
inline void* torch_allocate(void* /*context*/, std::int64_t bytes, void* stream) {
  return c10::cuda::CUDACachingAllocator::raw_alloc_with_stream(static_cast<std::size_t>(bytes),
                                                                static_cast<cudaStream_t>(stream));
}
inline void torch_deallocate(void* /*context*/, void* ptr, void* /*stream*/) {
  c10::cuda::CUDACachingAllocator::raw_delete(ptr);
}
inline const fattn::DeviceAllocator kTorchAllocator{&torch_allocate, &torch_deallocate, nullptr};

// A call on q's device: for a CUDA q, its device made current (for the call's lifetime),
// torch's current stream and allocator in the options, and for float32 the TF32 mode
// exactly when torch would use TF32 for a float32 matmul
// (torch.backends.cuda.matmul.allow_tf32 / set_float32_matmul_precision("high")).
struct OnDevice {
  std::optional<c10::cuda::CUDAGuard> guard;
  fattn::Options options;

  OnDevice(const at::Tensor& q, const fattn::Options& base) : options(base) {
    if (!q.is_cuda()) return;
    guard.emplace(q.device());
    options.cuda_stream = c10::cuda::getCurrentCUDAStream(q.device().index()).stream();
    options.device_allocator = &kTorchAllocator;
    options.allow_tf32 = at::globalContext().allowTF32CuBLAS();
  }
};

}  // namespace fattn_torch
#endif
